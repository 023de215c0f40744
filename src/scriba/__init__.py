"""scriba: projections that keep read models in step with event streams.

scriba is shipped in the ``statifier`` distribution but stands on its own: it
never imports statechart internals (``statifier.chart``, ``statifier.core``,
``statifier.session``). It needs the ``scriba`` extra (SQLAlchemy; the
``eventsourcing`` library for its notification-log source). It reports through
``statifier.telemetry``, durations in seconds under ``duration``
(``docs/telemetry.md``). The guide is ``docs/scriba.md``.
"""

from statifier.extras import MissingExtra

try:
    from scriba.coordinator import Status
    from scriba.errors import (
        ConfigError,
        IdentityOverride,
        InvalidState,
        ProjectionBusy,
        ProjectionNameWarning,
        ScribaError,
        StartFailed,
        UnknownProjection,
    )
    from scriba.event import Event, Meta, ProjectionKey
    from scriba.memory import MemorySource, MemoryTarget
    from scriba.operations import (
        Delete,
        Error,
        Execute,
        Insert,
        Multi,
        Operation,
        Result,
        Skip,
        Update,
    )
    from scriba.projection import Projection, RetryPolicy
    from scriba.runtime import Info, Listing, Scriba
except ModuleNotFoundError as missing:  # SQLAlchemy: the scriba extra
    raise MissingExtra.of(missing, extra="scriba", what="scriba") from missing

__all__ = [
    "ConfigError",
    "Delete",
    "Error",
    "Event",
    "Execute",
    "IdentityOverride",
    "Info",
    "Insert",
    "InvalidState",
    "Listing",
    "MemorySource",
    "MemoryTarget",
    "Meta",
    "Multi",
    "Operation",
    "Projection",
    "ProjectionBusy",
    "ProjectionKey",
    "ProjectionNameWarning",
    "Result",
    "RetryPolicy",
    "Scriba",
    "ScribaError",
    "Skip",
    "StartFailed",
    "Status",
    "UnknownProjection",
    "Update",
]
