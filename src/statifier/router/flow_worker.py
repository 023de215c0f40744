"""The worker that delivers what debounce, batch and throttle bindings hold, when it
comes due (:mod:`statifier.router.flow`).

One group, one transaction: the address's lock is taken (the router's lock, the one
every delivery to the address takes first), the group's row is read again under it
and, if still due, :func:`~statifier.router.flow.flush` delivers its events and moves
the row on; the deliveries and the row commit together or not at all. A crash before
the commit leaves the group as it was, and it is flushed again by whichever worker
takes it next; after the commit its events are gone. Every process of a deployment may
run a worker: each held event is delivered once.

A flush that raises (a chart is missing, the execution is parked, the binding is gone)
is rolled back whole; the group records the error, in a transaction of its own, and is
taken again ``retry`` later, doubled each failure in a row up to ``max_retry``; the
error is logged and reported. The group's later events wait behind it: its key's order
holds.

Telemetry: ``statifier.router.flow`` for every flush, with how many events it
delivered, how late it came and its error.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from statifier.persistence import LockTimeout
from statifier.router.binding import Binding
from statifier.router.config import Entry
from statifier.router.flow import flush
from statifier.router.routing import Router
from statifier.router.scheduler import nap
from statifier.router.transaction import around, lock_key
from statifier.sql.flow import FlowGroupRow
from statifier.telemetry import enabled, report

__all__ = ["FlowWorker", "FlushReport"]

_log = logging.getLogger(__name__)

_FLOW: Final = "statifier.router.flow"
_PAGE: Final = 100

Clock = Callable[[], datetime]


@dataclass(frozen=True, slots=True)
class FlushReport:
    """One group taken by :meth:`FlowWorker.flush_due`.

    Attributes:
        binding_id, scope, key: the group's address under its binding.
        delivered: how many held events were delivered.
        error: why the flush failed (it is taken again later), or ``None``.
    """

    binding_id: str
    scope: str
    key: str
    delivered: int
    error: str | None = None


class FlowWorker:
    """Delivers what ``router``'s debounce, batch and throttle bindings hold, as it
    comes due.

    Args:
        router: the router whose bindings and database hold the events.
        retry: how long after a failed flush it is tried again (doubled each failure
            in a row, up to ``max_retry``).
        poll: the longest :meth:`run` sleeps between passes (events held by another
            process are seen within it).
        clock: the current time (aware); the router's storage clock by default.

    >>> import asyncio, tempfile
    >>> from pathlib import Path
    >>> from datetime import UTC, datetime, timedelta
    >>> from statifier.chart import compile_chart
    >>> from statifier.persistence.sql import SqlAdapter
    >>> from statifier.router import Binding, InboundEvent, RouterConfig, StaticResolver
    >>> from statifier.sql import migrations
    >>> chart = compile_chart('''<scxml xmlns="http://www.w3.org/2005/07/scxml"
    ...   datamodel="ecmascript"><state id="editing">
    ...   <transition event="saved"/></state></scxml>''')
    >>> saves = Binding(id="saves", source="editor", match="true", key="event.doc",
    ...                 document="drafts", event="saved", data=["doc"],
    ...                 mode="debounce", window=timedelta(seconds=30))
    >>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'flow.db'}"
    >>> migrations.upgrade(url)
    >>> start = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    >>> async def main() -> list[object]:
    ...     async with SqlAdapter(url) as adapter:
    ...         router = Router(RouterConfig(adapter, bindings=[saves],
    ...                                      resolver=StaticResolver({"drafts": chart})))
    ...         said = []
    ...         for second in range(3):
    ...             event = InboundEvent(scope="demo", source="editor",
    ...                                  message_id=f"m{second}", data={"doc": "d1"})
    ...             routed = await router.route(event, now=start + timedelta(seconds=second))
    ...             said.append(routed.outcomes[0].outcome)
    ...         flushed = await FlowWorker(router).flush_due(now=start + timedelta(seconds=40))
    ...         return [said, [(report.key, report.delivered) for report in flushed]]
    >>> asyncio.run(main())
    [['buffered', 'buffered', 'buffered'], [('d1', 3)]]
    """

    def __init__(
        self,
        router: Router,
        *,
        retry: timedelta = timedelta(seconds=5),
        max_retry: timedelta = timedelta(minutes=10),
        poll: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if retry <= timedelta(0) or max_retry < retry:
            raise ValueError("retry is positive and max_retry at least retry")
        if poll <= 0:
            raise ValueError("poll is a positive number of seconds")
        self.router: Final = router
        self.retry: Final = retry
        self.max_retry: Final = max_retry
        self.poll: Final = poll
        self.clock: Final[Clock] = clock or router.storage.clock
        self._woken = asyncio.Event()

    async def groups(
        self, *, after: tuple[str, str, str] = ("", "", ""), limit: int = _PAGE
    ) -> list[FlowGroupRow]:
        """At most ``limit`` groups holding events, after the address ``after``
        (binding, scope, key), in that order."""
        async with self.router.transaction() as unit:
            return await unit.flow.page(unit.tx.driver, after, limit)

    async def totals(self) -> tuple[int, int]:
        """How many addresses hold events, and how many events they hold."""
        async with self.router.transaction() as unit:
            return await unit.flow.totals(unit.tx.driver)

    async def next_due(self) -> datetime | None:
        """When the first group is due, or ``None``."""
        async with self.router.transaction() as unit:
            return await unit.flow.next_due(unit.tx.driver)

    async def flush_due(self, *, now: datetime | None = None) -> list[FlushReport]:
        """One pass: flush every group due at ``now`` (the clock's time by default),
        one transaction a group, the earliest due first. A group whose flush failed is
        not taken again in the pass.

        Raises:
            Exception: the database failed outside a flush (reading the due groups, a
                commit).
        """
        reports: list[FlushReport] = []
        failed: set[tuple[str, str, str]] = set()
        while True:
            moment = self.clock() if now is None else self._now(now)
            async with self.router.transaction() as unit:
                due = await unit.flow.due(unit.tx.driver, moment, _PAGE)
            due = [where for where in due if where not in failed]
            if not due:
                return reports
            # Workers of several processes read the same earliest groups: each takes
            # them in its own order, so they seldom wait on one another's lock.
            random.shuffle(due)
            for where in due:
                made = await self._take(where, moment)
                if made is None:
                    continue
                if made.error is not None:
                    failed.add(where)
                reports.append(made)

    def wake(self) -> None:
        """Make :meth:`run` look at the groups now."""
        self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Flush due groups until ``stop`` is set: a pass, then sleep until the next
        due time, at most ``poll`` seconds, or until :meth:`wake` is called.

        Raises:
            Exception: a pass failed (the database went away); the caller decides
                whether to start it again.
        """
        while not stop.is_set():
            self._woken.clear()
            await self.flush_due()
            wait = self.poll
            upcoming = await self.next_due()
            if upcoming is not None:
                wait = min(wait, max(0.0, (upcoming - self.clock()).total_seconds()))
            if wait > 0 and not self._woken.is_set():
                await nap(stop, self._woken, wait)

    async def _take(self, where: tuple[str, str, str], now: datetime) -> FlushReport | None:
        """Flush the group ``where`` if it is still due, under its address's lock, in
        one transaction; a flush that raised is rolled back and recorded in another."""
        binding_id, scope, key = where
        started = time.perf_counter()
        router = self.router
        group: FlowGroupRow | None = None

        async def work() -> FlushReport | None:
            nonlocal group
            async with router.transaction(entered=Entry.FLOW) as unit:
                await unit.begin(scope, Entry.FLOW)
                driver = unit.tx.driver
                # The document is read first to name the lock; it never changes.
                unlocked = await unit.flow.locked(driver, binding_id, scope, key)
                if unlocked is None:
                    return None
                address = lock_key("address", scope, unlocked.document, key)
                await unit.lock([address], unit.config.lock_wait)
                group = await unit.flow.locked(driver, binding_id, scope, key)
                if group is None or group.due_at > now:
                    return None  # flushed by another worker, or grown since
                binding = await _binding(router, scope, binding_id)
                delivered = await flush(unit, binding, group, now)
            return FlushReport(binding_id, scope, key, delivered)

        try:
            made = await around(router.config, scope, Entry.FLOW, work)
        except LockTimeout:
            if group is not None:
                raise
            return None  # a delivery to the address holds it: taken in a later pass
        except Exception as failure:
            if group is None:  # before the flush: the database's trouble, the caller's
                raise
            error = f"{type(failure).__name__}: {failure}"
            await self._failed(group, error, now)
            made = FlushReport(binding_id, scope, key, 0, error)
        if made is not None and enabled(_FLOW):
            lag = 0.0 if group is None else (now - group.due_at).total_seconds()
            report(
                _FLOW,
                {
                    "duration": time.perf_counter() - started,
                    "delivered": made.delivered,
                    "lag": lag,
                },
                {"binding_id": binding_id, "scope": scope, "key": key, "error": made.error},
            )
        return made

    async def _failed(self, group: FlowGroupRow, error: str, now: datetime) -> None:
        """Record on ``group`` that its flush failed with ``error``, unless another
        worker moved it on meanwhile; it is taken again after the backoff."""
        wait = min(self.retry * 2 ** min(group.failures, 30), self.max_retry)
        where = (group.binding_id, group.scope, group.key)
        async with self.router.transaction() as unit:
            driver = unit.tx.driver
            address = lock_key("address", group.scope, group.document, group.key)
            await unit.lock([address], unit.config.lock_wait)
            current = await unit.flow.locked(driver, *where)
            if current is None or current.updated_at != group.updated_at:
                return
            await unit.flow.failed(driver, current, error=error, due_at=now + wait, now=now)
        _log.error(
            "binding %r, scope %r, key %r: delivering its %d held event%s failed "
            "(%d in a row), tried again in %.0f s: %s",
            group.binding_id,
            group.scope,
            group.key,
            group.held,
            "" if group.held == 1 else "s",
            group.failures + 1,
            wait.total_seconds(),
            error,
        )

    def _now(self, now: datetime) -> datetime:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, not {now!r}")
        return now.astimezone(UTC)


async def _binding(router: Router, scope: str, binding_id: str) -> Binding | None:
    """The enabled binding ``binding_id`` of ``scope``, or ``None``."""
    for binding in await router.config.bindings_for(scope):
        if binding.id == binding_id and binding.enabled:
            return binding
    return None
