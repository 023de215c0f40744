"""The worker that delivers what debounce, batch and throttle bindings hold, when it
comes due (:mod:`statifier.router.flow`), and makes the creates caps on active
executions hold, when slots free (:mod:`statifier.router.caps`).

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

A flush or a make whose transaction loses a conflict (SQLSTATE 40001 or 40P01) is run
again from its start first
(:meth:`Router.in_transaction <statifier.router.Router.in_transaction>`); only the
last attempt's failure is recorded as above.

Held creates are made after the due groups, on every pass: for each cap holding any,
its addresses in their fair order, one a transaction under the address's lock and then
the cap's, until one finds the cap full. A make that raises is rolled back, logged and
reported; this worker tries the address again after its backoff.

Telemetry: ``statifier.router.flow`` for every flush and every make, with how many events it
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

from statifier.buckets import ALL_BUCKETS, bucket_range
from statifier.core.positions import load_event
from statifier.persistence import LockTimeout, OnError
from statifier.router.binding import Binding, Create, Plan
from statifier.router.caps import bucket_of, cap_lock, free_slots
from statifier.router.config import Entry
from statifier.router.delivery import Delivery, deliver
from statifier.router.flow import flush, not_before
from statifier.router.outbox import storable_text
from statifier.router.routing import Router
from statifier.router.scheduler import nap
from statifier.router.transaction import Unit, around, lock_key
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
    comes due, and makes the creates its caps hold, as slots free.

    Args:
        router: the router whose bindings and database hold the events.
        retry: how long after a failed flush it is tried again (doubled each failure
            in a row, up to ``max_retry``).
        poll: the longest :meth:`run` sleeps between passes (events held by another
            process are seen within it).
        clock: the current time (aware); the router's storage clock by default.
        buckets: the range of buckets ``(start, end)``, ``end`` excluded, whose
            addresses' groups it flushes (by the groups' ``(bucket, due_at)`` index,
            decision 0121); by default every bucket. The creates caps hold are made
            whatever their bucket.

    Raises:
        ValueError: a bound out of range, or ``buckets`` not a non-empty range within
            ``0..BUCKETS``.

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
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> None:
        self.buckets: Final = bucket_range(buckets)
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
        # The held creates whose make failed: how many times in a row, and when this
        # worker tries again.
        self._backoff: dict[tuple[str, str, str], tuple[int, datetime]] = {}

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
        """When the first group of its buckets is due, or ``None``."""
        async with self.router.transaction() as unit:
            return await unit.flow.next_due(unit.tx.driver, self.buckets)

    async def flush_due(self, *, now: datetime | None = None) -> list[FlushReport]:
        """One pass: flush every group due at ``now`` (the clock's time by default),
        one transaction a group, the earliest due first (a group whose flush failed is
        not taken again in the pass); then make the creates caps hold, while they have
        room. Answers a report for each group taken and each address made.

        Raises:
            Exception: the database failed outside a flush (reading the due groups, a
                commit).
        """
        reports: list[FlushReport] = []
        taken: set[tuple[str, str, str, str]] = set()
        moment = self._at(now)
        while True:
            async with self.router.transaction() as unit:
                due = await unit.flow.due(unit.tx.driver, moment, _PAGE + len(taken), self.buckets)
            due = [where for where in due if where not in taken]
            if not due:
                break
            # Workers of several processes read the same earliest groups: each takes
            # them in its own order, so they seldom wait on one another's lock.
            random.shuffle(due)
            for where in due[:_PAGE]:
                taken.add(where)
                # Each flush at its own time: its ledger rows never come before the
                # arrivals of the events it delivers.
                made = await self._take(where, self._at(now))
                if made is not None:
                    reports.append(made)
            moment = self._at(now)
        reports.extend(await self._make_creates(now))
        return reports

    async def held_creates(self) -> tuple[int, int]:
        """How many addresses wait on a cap, and how many events they hold."""
        async with self.router.transaction() as unit:
            return await unit.caps.totals(unit.tx.driver)

    async def _make_creates(self, now: datetime | None) -> list[FlushReport]:
        """Make the creates caps hold while they have room: each cap's addresses in
        their fair order (:meth:`CapTable.fair <statifier.sql.caps.CapTable.fair>`),
        one a transaction, until one finds the cap full. An address whose make failed
        waits ``retry`` (doubling) before it is tried again by this worker."""
        caps = self.router.config.caps
        async with self.router.transaction() as unit:
            held = await unit.caps.buckets(unit.tx.driver)
        buckets: dict[tuple[str, str | None], None] = {}
        for document, scope in held:
            cap = caps.get(document)
            buckets[(document, scope if cap is None else bucket_of(cap, scope))] = None
        reports: list[FlushReport] = []
        for document, bucket in buckets:
            async with self.router.transaction() as unit:
                # The slots of ended executions given back first: the fair order
                # counts the executions each scope has now.
                await unit.caps.purge(unit.tx.driver, document, bucket)
                addresses = await unit.caps.fair(unit.tx.driver, document, bucket, _PAGE)
            for scope, key in addresses:
                where = (document, scope, key)
                moment = self._at(now)
                if self._backoff.get(where, (0, moment))[1] > moment:
                    continue
                made = await self._make(where, moment)
                if made is None:
                    continue
                reports.append(made)
                if made.error is None and made.delivered == 0:
                    break  # the cap is full: the rest wait for a slot
        return reports

    async def _make(self, where: tuple[str, str, str], now: datetime) -> FlushReport | None:
        """Make what a cap holds for one address, in one transaction, under the
        address's lock and then the cap's; a make that raised is rolled back, logged
        and reported."""
        document, scope, key = where
        router = self.router
        started = time.perf_counter()

        async def attempt(unit: Unit) -> tuple[str | None, int]:
            await unit.begin(scope, Entry.FLOW)
            wait = unit.config.lock_wait
            await unit.lock([lock_key("address", scope, document, key)], wait)
            cap = unit.config.caps.get(document)
            if cap is not None:
                await unit.lock([cap_lock(document, bucket_of(cap, scope))], wait)
            return await _make_held(unit, document, scope, key, now)

        async def work() -> FlushReport:
            binding_id, made = await router.in_transaction(attempt, entered=Entry.FLOW)
            return FlushReport(binding_id or "", scope, key, made)

        try:
            report_ = await around(router.config, scope, Entry.FLOW, work)
        except LockTimeout:
            return None  # a delivery holds the address or the cap: a later pass
        except Exception as failure:  # noqa: BLE001 - one address's failure is its own
            error = f"{type(failure).__name__}: {failure}"
            failures = self._backoff.get(where, (0, now))[0] + 1
            wait = min(self.retry * 2 ** min(failures - 1, 30), self.max_retry)
            self._backoff[where] = (failures, now + wait)
            _log.error(
                "document %r, scope %r, key %r: making its held create failed "
                "(%d in a row), tried again in %.0f s: %s",
                document,
                scope,
                key,
                failures,
                wait.total_seconds(),
                error,
            )
            report_ = FlushReport("", scope, key, 0, error)
        else:
            self._backoff.pop(where, None)
        return _reported(report_, started, 0.0)

    def wake(self) -> None:
        """Make :meth:`run` look at the groups now."""
        self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Flush due groups and make held creates until ``stop`` is set: a pass, then
        sleep until the next due time, at most ``poll`` seconds, or until :meth:`wake`
        is called.

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

    async def _take(self, where: tuple[str, str, str, str], now: datetime) -> FlushReport | None:
        """Flush the group ``where`` (binding, scope, key and document) if it is still
        due, under its address's lock, in one transaction; a flush that raised is rolled
        back and recorded in another."""
        binding_id, scope, key, document = where
        started = time.perf_counter()
        router = self.router
        group: FlowGroupRow | None = None

        async def attempt(unit: Unit) -> int | None:
            nonlocal group
            # What the attempt that failed last read: one run again reads it anew.
            group = None
            await unit.begin(scope, Entry.FLOW)
            driver = unit.tx.driver
            # The address's lock before the group's row, as an arrival takes them:
            # the other order could deadlock with it.
            address = lock_key("address", scope, document, key)
            await unit.lock([address], unit.config.lock_wait)
            group = await unit.flow.locked(driver, binding_id, scope, key)
            if group is None or group.due_at > now:
                return None  # flushed by another worker, or grown since
            binding = await _binding(router, scope, binding_id)
            return await flush(unit, binding, group, now)

        async def work() -> FlushReport | None:
            delivered = await router.in_transaction(attempt, entered=Entry.FLOW)
            return None if delivered is None else FlushReport(binding_id, scope, key, delivered)

        try:
            made = await around(router.config, scope, Entry.FLOW, work)
        except LockTimeout:
            if group is not None:
                raise
            return None  # a delivery to the address holds it: taken in a later pass
        except Exception as failure:
            if group is None:  # before the flush: the database's trouble, the caller's
                raise
            # Stored as the group's last_error: what a text column refuses, replaced.
            error = storable_text(f"{type(failure).__name__}: {failure}")
            await self._failed(group, error, now)
            made = FlushReport(binding_id, scope, key, 0, error)
        if made is not None:
            lag = 0.0 if group is None else (now - group.due_at).total_seconds()
            _reported(made, started, lag)
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
                # Not recorded: the group moved on (an arrival, another worker's flush),
                # and is taken again as it stands now. The failure is still said.
                _log.error(
                    "binding %r, scope %r, key %r: delivering its %d held event%s failed "
                    "(not recorded: the group changed meanwhile): %s",
                    group.binding_id,
                    group.scope,
                    group.key,
                    group.held,
                    "" if group.held == 1 else "s",
                    error,
                )
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

    def _at(self, now: datetime | None) -> datetime:
        """``now`` as given, else the clock's time."""
        return self.clock() if now is None else self._now(now)

    def _now(self, now: datetime) -> datetime:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, not {now!r}")
        return now.astimezone(UTC)


def _reported(made: FlushReport, started: float, lag: float) -> FlushReport:
    """``made``, reported in the telemetry: how long it took since ``started`` and how
    late it came (``lag`` seconds after its due time)."""
    if enabled(_FLOW):
        took = time.perf_counter() - started
        report(
            _FLOW,
            {"duration": took, "delivered": made.delivered, "lag": lag},
            {
                "binding_id": made.binding_id,
                "scope": made.scope,
                "key": made.key,
                "error": made.error,
            },
        )
    return made


async def _make_held(
    unit: Unit, document: str, scope: str, key: str, now: datetime
) -> tuple[str | None, int]:
    """Make what the cap holds for the address ``(scope, document, key)``, in order,
    while the cap has room: each event delivered as it would have been (its dedupe
    claim already made), the first creating the execution. The caller holds the
    address's lock, then the cap's (none when the document is no longer capped: then
    everything is made). Answers the binding of the first held event and how many
    were made.

    Raises:
        Exception: as :func:`~statifier.router.delivery.deliver`: ``unit`` must be
            rolled back.
    """
    table, driver = unit.caps, unit.tx.driver
    held = await table.held(driver, document, scope, key)
    cap = unit.config.caps.get(document)
    free = len(held)
    if cap is not None:
        free = await free_slots(unit, cap, document, bucket_of(cap, scope))
    made = 0
    for row in held:
        create = Create(row.create_mode)
        creates = create is Create.ALWAYS_NEW or (
            await unit.sql.find_address(scope, document, key) is None
        )
        if creates and free <= 0:
            break
        await table.drop(driver, row)
        on_error = None if row.on_error is None else OnError(row.on_error)
        plan = Plan(row.binding_id, document=document, create=create, on_error=on_error)
        event = load_event(unit.storage.codec.decode(row.event_blob))
        delivery = Delivery(plan, scope, key, event, row.message_id, row.source)
        await deliver(unit, delivery, not_before(now, [row]), claimed=True, admitted=True)
        free -= 1 if creates else 0
        made += 1
    return (held[0].binding_id if held else None), made


async def _binding(router: Router, scope: str, binding_id: str) -> Binding | None:
    """The enabled binding ``binding_id`` of ``scope``, or ``None``."""
    for binding in await router.config.bindings_for(scope):
        if binding.id == binding_id and binding.enabled:
            return binding
    return None
