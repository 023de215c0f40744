"""Durable executions: statecharts stepped and stored, one guarded operation at a time.

:class:`Storage` puts an adapter (:class:`MemoryAdapter`, or the SQL one in
``statifier.persistence.sql``) behind the identity guard; :class:`Executions` creates,
steps, fails and cancels executions over it, handing every effect to an executor.
See ``docs/persistence.md``.
"""

from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.driver import (
    Answer,
    Answered,
    Dispatch,
    Driver,
    InvocationFailed,
    MaxTurnsExceeded,
)
from statifier.persistence.errors import (
    ChartNotFound,
    ChartRetired,
    ChartRetirementUnsupported,
    ExecutionExists,
    ExecutionNotFound,
    LockTimeout,
    MetadataUnsupported,
    PersistenceError,
    Pinned,
    PinSourceFailed,
    SerializationUnsupported,
    StoredChartDamaged,
    Unstorable,
)
from statifier.persistence.executions import (
    EXECUTION_STATUS_KEY,
    PARENT_KEY,
    Discarded,
    Executions,
    LoggedInput,
    PinSource,
    Stepped,
    decode_outcome,
)
from statifier.persistence.executor import EffectContext, Executor, ignore_effects
from statifier.persistence.memory import MemoryAdapter
from statifier.persistence.records import (
    ChartRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
)
from statifier.persistence.retention import prune
from statifier.persistence.serialization import AdapterLock, Serialization, Unserialized
from statifier.persistence.storage import Clock, Storage, utc_now

__all__ = [
    "EXECUTION_STATUS_KEY",
    "PARENT_KEY",
    "Adapter",
    "AdapterLock",
    "Answer",
    "Answered",
    "Capabilities",
    "ChartNotFound",
    "ChartRecord",
    "ChartRetired",
    "ChartRetirementUnsupported",
    "Clock",
    "Discarded",
    "Dispatch",
    "Driver",
    "EffectContext",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionRecord",
    "Executions",
    "Executor",
    "InputRecord",
    "InvocationFailed",
    "LockTimeout",
    "LoggedInput",
    "MaxTurnsExceeded",
    "MemoryAdapter",
    "MetadataUnsupported",
    "PersistenceError",
    "PinSource",
    "PinSourceFailed",
    "Pinned",
    "PositionRecord",
    "Serialization",
    "SerializationUnsupported",
    "Status",
    "Stepped",
    "Storage",
    "StoredChartDamaged",
    "Unserialized",
    "Unstorable",
    "decode_outcome",
    "ignore_effects",
    "prune",
    "utc_now",
]
