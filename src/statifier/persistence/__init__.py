"""Durable executions: statecharts stepped and stored, one guarded operation at a time.

Filled in below as the layer grows.
"""

from statifier.persistence.adapter import Adapter, Capabilities
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
)
from statifier.persistence.memory import MemoryAdapter
from statifier.persistence.records import (
    ChartRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
)

__all__ = [
    "Adapter",
    "Capabilities",
    "ChartNotFound",
    "ChartRecord",
    "ChartRetired",
    "ChartRetirementUnsupported",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionRecord",
    "InputRecord",
    "LockTimeout",
    "MemoryAdapter",
    "MetadataUnsupported",
    "PersistenceError",
    "PinSourceFailed",
    "Pinned",
    "PositionRecord",
    "SerializationUnsupported",
    "Status",
    "StoredChartDamaged",
]
