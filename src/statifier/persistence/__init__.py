"""Durable executions: statecharts stepped and stored, one guarded operation at a time.

:class:`Storage` puts an adapter (:class:`MemoryAdapter`, or the SQL one in
``statifier.persistence.sql``) behind the identity guard; :class:`Executions` creates,
steps, fails and cancels executions over it, handing every effect to an executor, and
returns :class:`Stepped` or :class:`Discarded`, and moves them onto a new revision of
their chart along a :class:`MigrationPlan`; :class:`Driver` drives charts that
invoke services (durable children and fan-out); :func:`prune` clears what finished.
A :class:`BlobCodec` given to the storage encodes every blob it stores (the Fernet one,
extra ``crypto``, is in ``statifier.persistence.fernet``).
See ``docs/persistence.md``, whose "What the calls return" section lists every field
of the returned values and the format of effect keys.
"""

from statifier.persistence.codec import PLAIN, BlobCodec, UndecodableBlob
from statifier.persistence.driver import Driver
from statifier.persistence.errors import (
    AdapterClosed,
    ChartNotFound,
    ChartRetired,
    DatabaseDown,
    ExecutionExists,
    ExecutionNotFound,
    InvalidMigrationPlan,
    LockTimeout,
    PersistenceError,
    ReentrantCall,
    StoredChartDamaged,
    Unstorable,
    database_down,
    worth_a_traceback,
)
from statifier.persistence.executions import (
    Discarded,
    Executions,
    LoggedInput,
    Stepped,
    decode_outcome,
)
from statifier.persistence.executor import EffectContext, Executor, Refused
from statifier.persistence.memory import MemoryAdapter
from statifier.persistence.migration import Migrated, MigrationPlan, MigrationSummary, Parked
from statifier.persistence.records import ExecutionRecord, Status
from statifier.persistence.retention import prune
from statifier.persistence.step_errors import ErrorPolicy, OnError, StepError
from statifier.persistence.storage import Storage

__all__ = [
    "PLAIN",
    "AdapterClosed",
    "BlobCodec",
    "ChartNotFound",
    "ChartRetired",
    "DatabaseDown",
    "Discarded",
    "Driver",
    "EffectContext",
    "ErrorPolicy",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionRecord",
    "Executions",
    "Executor",
    "InvalidMigrationPlan",
    "LockTimeout",
    "LoggedInput",
    "MemoryAdapter",
    "Migrated",
    "MigrationPlan",
    "MigrationSummary",
    "OnError",
    "Parked",
    "PersistenceError",
    "ReentrantCall",
    "Refused",
    "Status",
    "StepError",
    "Stepped",
    "Storage",
    "StoredChartDamaged",
    "UndecodableBlob",
    "Unstorable",
    "database_down",
    "decode_outcome",
    "prune",
    "worth_a_traceback",
]
