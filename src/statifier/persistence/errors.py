"""The typed refusals of durable executions, each a :class:`PersistenceError`; and
:class:`DatabaseDown`, the database not answering at all."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "AdapterClosed",
    "ChartNotFound",
    "ChartRetired",
    "ChartRetirementUnsupported",
    "DatabaseDown",
    "ExecutionExists",
    "ExecutionNotFound",
    "InvalidMigrationPlan",
    "LockTimeout",
    "MetadataUnsupported",
    "PersistenceError",
    "PinSourceFailed",
    "Pinned",
    "ReentrantCall",
    "RefusalsUnsettled",
    "SerializationUnsupported",
    "StoredChartDamaged",
    "UndeclaredPlanData",
    "UnknownPlanStates",
    "Unstorable",
    "database_down",
    "worth_a_traceback",
]


class DatabaseDown(Exception):  # noqa: N818 - names the state
    """The database did not answer (stopped, restarting, unreachable, or every
    connection stays busy): nothing ran, and the same work may succeed once it
    answers. Its message says what was waited for; a traceback adds nothing to it. On
    PostgreSQL, :class:`statifier.persistence.sql.postgres.DatabaseUnavailable`."""


def database_down(error: BaseException) -> bool:
    """Whether ``error`` is a :class:`DatabaseDown`, or was caused by one (a chart
    resolver that reads a database, say, raising its own error from it)."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        if isinstance(found, DatabaseDown):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False


def worth_a_traceback(error: BaseException) -> BaseException | None:
    """``error``, to log with its traceback; ``None`` for a :class:`DatabaseDown`,
    whose one line says it all (an outage would otherwise fill the log with the same
    traceback from every worker)."""
    return None if isinstance(error, DatabaseDown) else error


class PersistenceError(Exception):
    """Something durable executions refuse to do; nothing was changed."""


class ExecutionExists(PersistenceError):  # noqa: N818 - names the refusal
    """An execution with this id already exists."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"execution {execution_id!r} already exists")
        self.execution_id = execution_id


class ExecutionNotFound(PersistenceError):  # noqa: N818
    """No execution has this id."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"no execution {execution_id!r}")
        self.execution_id = execution_id


class ChartNotFound(PersistenceError):  # noqa: N818
    """No chart is stored under this content hash."""

    def __init__(self, content_hash: str) -> None:
        super().__init__(f"no chart {content_hash}")
        self.content_hash = content_hash


class ChartRetired(PersistenceError):  # noqa: N818
    """The chart was retired: its hash is kept, its source is gone for good."""

    def __init__(self, content_hash: str, retired_by: str | None) -> None:
        super().__init__(f"chart {content_hash} was retired by {retired_by!r}")
        self.content_hash = content_hash
        self.retired_by = retired_by


class StoredChartDamaged(PersistenceError):  # noqa: N818
    """The stored source does not compile to the chart its hash names."""


class MetadataUnsupported(PersistenceError):  # noqa: N818
    """The adapter cannot store or list by execution metadata."""


class ChartRetirementUnsupported(PersistenceError):  # noqa: N818
    """The adapter cannot retire charts."""


class SerializationUnsupported(PersistenceError):  # noqa: N818
    """The adapter offers no per-execution lock and no strategy was given."""


class LockTimeout(PersistenceError):  # noqa: N818
    """Another call held the execution's lock for longer than the lock-wait timeout."""

    def __init__(self, execution_id: str, waited: float) -> None:
        super().__init__(f"execution {execution_id!r} stayed locked for {waited:.3f}s")
        self.execution_id = execution_id
        self.waited = waited


class ReentrantCall(PersistenceError):  # noqa: N818 - names the refusal
    """A call made from inside a step (by its route, executor or sink) would wait for
    something that step holds until the call returns: it would wait for ever, so it is
    refused at once. A route hands off durably and returns; it never calls back into
    the execution it serves."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is held by the step this call was made from: a route, executor or "
            "sink must not call back into the execution it serves (it would wait for "
            "itself)"
        )
        self.what = what


class AdapterClosed(PersistenceError):  # noqa: N818 - names the refusal
    """The adapter was closed: it begins no transaction and runs no call any more (on
    PostgreSQL, the pool's own ``PoolClosed`` says the same)."""

    def __init__(self) -> None:
        super().__init__("the adapter is closed: it runs no more calls")


class Pinned(PersistenceError):  # noqa: N818
    """The chart is still in use; ``counts`` says by what (every count known)."""

    def __init__(self, content_hash: str, counts: Mapping[str, int]) -> None:
        held = ", ".join(f"{name}={count}" for name, count in sorted(counts.items()))
        super().__init__(f"chart {content_hash} is still in use: {held}")
        self.content_hash = content_hash
        self.counts = dict(counts)


class PinSourceFailed(PersistenceError):  # noqa: N818
    """A pin source could not answer, so no complete count exists."""

    def __init__(self, source: str, reason: BaseException) -> None:
        super().__init__(f"pin source {source} failed: {reason!r}")
        self.source = source
        self.reason = reason


class Unstorable(PersistenceError):  # noqa: N818
    """A step's result cannot be stored (its datamodel or event is too large, or holds
    a value positions cannot keep). The step was abandoned and nothing of it stored:
    what its executor did within the step's transaction (the router's outbox and
    timer rows) rolls back with it; what an executor did outside it (a log line, a
    call of its own) stays done."""


class RefusalsUnsettled(PersistenceError):  # noqa: N818
    """The chart met refused effects with more refused effects, round after round:
    the call was abandoned before anything was stored."""

    def __init__(self, execution_id: str, rounds: int) -> None:
        super().__init__(
            f"execution {execution_id!r} kept emitting refused sends or invocations "
            f"for {rounds} rounds in one call"
        )
        self.execution_id = execution_id
        self.rounds = rounds


class InvalidMigrationPlan(PersistenceError, ValueError):  # noqa: N818 - names the refusal
    """The plan cannot be built as given; nothing was migrated."""


class UnknownPlanStates(InvalidMigrationPlan):
    """The state map names ids a chart lacks: ``side`` is ``"old"`` (keys missing from
    the old chart) or ``"new"`` (targets missing from the new chart)."""

    def __init__(self, side: str, ids: list[str]) -> None:
        super().__init__(f"the {side} chart has no states with the ids {ids}")
        self.side = side
        self.ids = ids


class UndeclaredPlanData(InvalidMigrationPlan):
    """The plan gives values for variables the new chart does not declare."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(f"the new chart declares no data named {names}")
        self.names = names
