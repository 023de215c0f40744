"""Run a projection's handler in a test, and commit what it returns, without a pipeline.

:func:`project` calls ``handle`` once per event, in the order given, then commits every
operation through the target in one batch, with each stream's cursor moved to its last
event that did not fail. It makes none of the pipeline's decisions: no retry, no
deduplication, no dead letters. A failure is reported, not handled, so a test sees
exactly what its handler did.

>>> import asyncio
>>> import sqlalchemy as sa
>>> from scriba import Error, Event, Insert, MemoryTarget, Projection
>>> from datetime import UTC, datetime
>>> totals = sa.Table("totals", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
>>> class Totals(Projection):
...     name = "totals"
...     def handle(self, event, meta):
...         if event.data is None:
...             return Error("no data")
...         return Insert(totals, {"id": event.stream_id})
>>> now = datetime.now(UTC)
>>> events = [Event("e1", "a", "Opened", {}, 1, now), Event("e2", "b", "Opened", None, 2, now)]
>>> target = MemoryTarget()
>>> report = asyncio.run(project(Totals, events, target=target))
>>> [type(handled.result).__name__ for handled in report.handled]
['Insert', 'Error']
>>> target.rows(totals), target.cursors(Totals.key())
([{'id': 'a'}], {'a': 1})
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scriba.event import Event, Meta
from scriba.operations import Error, Operation, Result, not_a_result
from scriba.projection import Projection, made_target
from scriba.target import ApplyFailed, Target
from statifier.callbacks import awaited

__all__ = ["Handled", "Report", "project"]


@dataclass(frozen=True, slots=True)
class Handled:
    """One handler call: what it returned, or what it raised."""

    event: Event
    result: Result | None
    exception: BaseException | None = None

    @property
    def failed(self) -> bool:
        """It raised, returned ``Error``, or returned something that is not a result."""
        return (
            self.exception is not None
            or not isinstance(self.result, Result)
            or (isinstance(self.result, Error))
        )


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`project` did.

    Attributes:
        handled: every call, in the order of the events.
        committed: whether the batch committed (``False`` if nothing needed a commit,
            or ``commit=False`` was passed, or it failed).
        failure: the target's refusal, if the commit failed.
    """

    handled: Sequence[Handled]
    committed: bool
    failure: ApplyFailed | None = None

    @property
    def operations(self) -> list[Operation]:
        """The operations the handler returned, in order."""
        return [h.result for h in self.handled if isinstance(h.result, Operation)]


async def project(
    projection: type[Projection],
    events: Iterable[Event],
    *,
    target: Target | None = None,
    commit: bool = True,
    partition: int = 0,
) -> Report:
    """Call ``projection``'s handler on ``events`` and commit what it returned.

    Args:
        projection: the projection class; it is instantiated once.
        events: in the order to handle them (the caller's order; nothing is sorted).
        target: where to commit; the projection's own target when omitted (a factory is
            called, and what it makes is closed afterwards).
        commit: ``False`` only calls the handler.
        partition: the partition number handlers see in ``meta``.

    Returns:
        A :class:`Report`. A failed commit is reported in it, not raised.
    """
    key = projection.key()
    handler = projection()
    handled: list[Handled] = []
    for event in events:
        try:
            result: object = await awaited(handler.handle(event, Meta(key, partition, 1)))
        except Exception as exc:  # noqa: BLE001 - reported to the test, not handled
            handled.append(Handled(event, None, exc))
            continue
        if isinstance(result, Result):
            handled.append(Handled(event, result))
        else:
            handled.append(Handled(event, None, TypeError(not_a_result(result))))
    applied = [(h.event, h.result) for h in handled if isinstance(h.result, Operation)]
    advances: dict[str, int] = {}
    for h in handled:
        if not h.failed:
            stream = h.event.stream_id
            advances[stream] = max(advances.get(stream, h.event.position), h.event.position)
    if not commit or not (applied or advances):
        return Report(handled, committed=False)
    if target is not None:
        chosen, owned = target, False
    elif projection.target is None:
        raise ValueError(f"{projection.__qualname__} has no target: pass target=")
    else:
        chosen, owned = made_target(projection.target)
    try:
        await chosen.open(key)
        await chosen.apply_batch(key, applied, advances, [])
    except ApplyFailed as failure:
        return Report(handled, committed=False, failure=failure)
    finally:
        if owned:
            await chosen.close()
    return Report(handled, committed=True)
