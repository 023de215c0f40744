"""The schedules of a router's database, and the worker that fires them.

A :class:`Scheduler` writes schedules (:meth:`~Scheduler.put`: a new one, or a new
definition for one that is there), pauses, resumes, removes, reads
(:meth:`~Scheduler.states`) and backfills them,
and fires the due ones (:meth:`~Scheduler.fire_due`, :meth:`~Scheduler.run`).

One fire, one transaction: the schedule's row is claimed (locked; on PostgreSQL rows
another worker holds are skipped), :func:`~statifier.router.schedules.next_step`
decides what to do, the fire's event is routed through the bindings of its source in
the same transaction (:meth:`Router.route_in <statifier.router.Router.route_in>`), and
the row is moved on to the next fire. The route and the row commit together or not at
all: a crash before the commit leaves the row as it was, and the fire is made again by
whichever process claims it next; after the commit the row has moved on. Every process
of a deployment may run a worker: each fire is made once. The fire's message id,
``NAME/<fire time>``, is the second guard: a fire made again by :meth:`backfill` is a
duplicate for the router's dedupe.

A fire whose route raises (its bindings cannot be read, a chart is missing, a lock
is not granted) is rolled back whole; the row records the error, in a transaction of
its own, and is taken again ``retry`` later, doubled each failure in a row up to
``max_retry``; the error is logged and reported. Its next fire waits: once the fire is
made, the later ones follow as the catch-up policy says. Until then the worker names
the schedule among those failing (:meth:`Scheduler.failing`: a service's readiness).

Telemetry: ``statifier.router.schedule`` for every step of a schedule, made,
skipped (missed fires let pass) or failed, with its lag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from statifier.persistence import database_down
from statifier.persistence.sql import SqlTransaction
from statifier.router.config import Entry
from statifier.router.outcomes import Routed
from statifier.router.routing import Router
from statifier.router.schedules import Schedule, ScheduleError, ScheduleNotFound, next_step
from statifier.router.shards import ShardedRouter
from statifier.router.transaction import Unit, around
from statifier.sql.schedules import ScheduleRow, ScheduleTable
from statifier.telemetry import enabled, report

__all__ = [
    "LATE_AFTER",
    "MAX_BACKFILL",
    "FireReport",
    "SchedulePage",
    "ScheduleState",
    "Scheduler",
]

_log = logging.getLogger(__name__)

LATE_AFTER: Final = timedelta(minutes=1)
"""How long past its due time a running schedule waits before it is called late (the
console's page, ``statifier schedules list``): a worker polls every second or so, so a
minute means none is taking it."""
_SCHEDULE: Final = "statifier.router.schedule"
MAX_BACKFILL: Final = 10_000
"""The most fires one :meth:`Scheduler.backfill` makes."""
_PAGE: Final = 500
_RECHECK: Final = timedelta(seconds=30)
"""The longest :meth:`Scheduler.run` goes without reading the row of a schedule it saw
fail, to see whether another process paused, removed or made it meanwhile."""
_RECHECKS: Final = 100
"""The most such rows one pass of :meth:`Scheduler.run` reads."""

Clock = Callable[[], datetime]
Record = Callable[[SqlTransaction, bool], Awaitable[object]]
"""What :meth:`Scheduler.pause` and :meth:`Scheduler.resume` call last in their
transaction: given it, and whether the call changed the schedule."""


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A schedule as its row stands.

    Attributes:
        schedule: its definition (``paused`` as the row says).
        paused: whether it is paused.
        next_fire_at: the time of its next fire.
        due_at: when a worker next takes it: later than ``next_fire_at`` after a
            failure, or while it catches up a backlog (the time of its last step, so
            that the schedules due before it go first).
        last_fire_at: the time of the last fire made, or ``None``.
        last_made_at: when that fire was made, or ``None``.
        fired, skipped: how many fires were made, and let pass unmade.
        failures: how many steps in a row failed; ``last_error`` the last one's error.
        updated_at: when the row last changed.
    """

    schedule: Schedule
    paused: bool
    next_fire_at: datetime
    due_at: datetime
    last_fire_at: datetime | None
    last_made_at: datetime | None
    fired: int
    skipped: int
    failures: int
    last_error: str | None
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class SchedulePage:
    """One page of the stored schedules, by name (:meth:`Scheduler.page`).

    Attributes:
        states: the schedules of the page that can be read.
        unreadable: the names of those whose stored definition cannot be read (each
            logged as it is read).
        last: the last name the page read, readable or not: the ``after`` of the next
            page; ``None`` when it read none (the end).
    """

    states: list[ScheduleState]
    unreadable: list[str]
    last: str | None


@dataclass(frozen=True, slots=True)
class FireReport:
    """One step of one schedule by :meth:`Scheduler.fire_due`.

    Attributes:
        name: the schedule.
        fire_time: the fire made, or ``None`` when missed fires were only let pass.
        skipped: how many fires were let pass.
        routed: the fire's routing, or ``None``.
        error: why the step failed (it is taken again later), or ``None``.
        at_least: whether more fires than ``skipped`` were let pass (a cron schedule
            that missed more than :data:`~statifier.router.schedules.MAX_COUNTED`).
    """

    name: str
    fire_time: datetime | None
    skipped: int
    routed: Routed | None
    error: str | None = None
    at_least: bool = False


class Scheduler:
    """The schedules of ``router``'s database, and their worker.

    Args:
        router: the router whose bindings route each fire; a
            :class:`~statifier.router.ShardedRouter`'s schedules are in its first
            store, and each fire is routed there as
            :meth:`ShardedRouter.route_in <statifier.router.ShardedRouter.route_in>`
            says (its other stores' parts in their own transactions first).
        retry: how long after a failed fire it is tried again (doubled each failure in
            a row, up to ``max_retry``).
        poll: the longest :meth:`run` sleeps between passes (a schedule put by another
            process is seen within it).
        clock: the current time (aware); the router's storage clock by default.

    Every call runs in transactions of its own on the router's database.

    >>> import asyncio, tempfile
    >>> from pathlib import Path
    >>> from datetime import UTC, datetime, timedelta
    >>> from statifier.chart import compile_chart
    >>> from statifier.persistence.sql import SqlAdapter
    >>> from statifier.router import Binding, RouterConfig, StaticResolver
    >>> from statifier.sql import migrations
    >>> chart = compile_chart('''<scxml xmlns="http://www.w3.org/2005/07/scxml">
    ...   <state id="counting"><transition event="tick"/></state></scxml>''')
    >>> ticks = Binding(id="ticks", source="clock", match="true", key="event.schedule",
    ...                 document="counter", event="tick")
    >>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'schedules.db'}"
    >>> migrations.upgrade(url)
    >>> start = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
    >>> async def main() -> list[str]:
    ...     async with SqlAdapter(url) as adapter:
    ...         router = Router(RouterConfig(adapter, bindings=[ticks],
    ...                                      resolver=StaticResolver({"counter": chart})))
    ...         scheduler = Scheduler(router)
    ...         await scheduler.put(Schedule.from_mapping("quarterly", {
    ...             "every": "PT15M", "catch_up": "all", "source": "clock", "scope": "demo"}),
    ...             now=start)
    ...         made = await scheduler.fire_due(now=start + timedelta(minutes=31))
    ...         return [report.routed.event.message_id for report in made if report.routed]
    >>> asyncio.run(main())
    ['quarterly/2026-12-03T09:15:00Z', 'quarterly/2026-12-03T09:30:00Z']
    """

    def __init__(
        self,
        router: Router | ShardedRouter,
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
        self.sharded: Final = router if isinstance(router, ShardedRouter) else None
        self.router: Final = router.routers[0] if isinstance(router, ShardedRouter) else router
        self.retry: Final = retry
        self.max_retry: Final = max_retry
        self.poll: Final = poll
        self.clock: Final[Clock] = clock or self.router.storage.clock
        adapter = self.router.adapter
        self.table: Final = ScheduleTable(adapter.tables, adapter.dialect)
        self._woken = asyncio.Event()
        # The schedules whose last step here failed, and when to read each one's row.
        self._failing: dict[str, datetime] = {}

    # Writing schedules.

    async def put(self, schedule: Schedule, *, now: datetime | None = None) -> ScheduleState:
        """Write ``schedule``: inserted (paused if ``schedule.paused``) with its first
        fire after ``now``; or, when one of its name is there, its definition replaced
        and its paused state kept, its next fire computed again from ``now`` only if
        its times changed (``cron``, ``every``, ``start``, ``timezone``).

        Raises:
            ScheduleError: the schedule's first fire cannot be computed.
        """
        moment = self._now(now)
        definition = schedule.as_json()
        first = _first_fire(schedule, moment)
        async with self.router.transaction() as unit:
            driver = unit.tx.driver
            inserted = await self.table.insert(
                driver,
                name=schedule.name,
                scope=schedule.scope,
                definition=definition,
                paused=schedule.paused,
                next_fire_at=first,
                now=moment,
            )
            row = await self.table.locked(driver, schedule.name)
            assert row is not None  # inserted, or there and locked
            if not inserted and row.definition != definition:
                before = _read(row)
                retimed = before is None or before.schedule.timing() != schedule.timing()
                next_fire_at = first if retimed else row.next_fire_at
                due_at = first if retimed else row.due_at
                await self.table.redefine(
                    driver,
                    name=schedule.name,
                    scope=schedule.scope,
                    definition=definition,
                    next_fire_at=next_fire_at,
                    due_at=due_at,
                    now=moment,
                )
                row = await self.table.locked(driver, schedule.name)
                assert row is not None
        self.wake()
        state = _read(row)
        assert state is not None
        return state

    async def remove(self, name: str) -> bool:
        """Delete the schedule ``name``; answer whether it was there. A fire being made
        when it is removed commits first."""
        async with self.router.transaction() as unit:
            removed = await self.table.remove(unit.tx.driver, name)
        self._failing.pop(name, None)
        return removed

    async def pause(
        self,
        name: str,
        *,
        now: datetime | None = None,
        record: Record | None = None,
    ) -> bool:
        """Pause ``name``: no fire is made until it resumes. Answer whether it ran.
        ``record`` (an audit row, say) runs last in the same transaction, given it and
        that answer.

        Raises:
            ScheduleNotFound: there is no schedule ``name``.
        """
        moment = self._now(now)
        async with self.router.transaction() as unit:
            driver = unit.tx.driver
            if await self.table.locked(driver, name) is None:
                raise ScheduleNotFound(name)
            paused = await self.table.pause(driver, name, moment)
            if record is not None:
                await record(unit.tx, paused)
        self._failing.pop(name, None)
        return paused

    async def resume(
        self,
        name: str,
        *,
        now: datetime | None = None,
        record: Record | None = None,
    ) -> bool:
        """Resume ``name``: its next fire is its first after ``now`` (the fires its
        pause covered are not made), its failures forgotten. Answer whether it was
        paused. ``record`` runs last in the same transaction, given it and that answer.

        Raises:
            ScheduleNotFound: there is no schedule ``name``.
            ScheduleError: its stored definition cannot be read.
        """
        moment = self._now(now)
        async with self.router.transaction() as unit:
            driver = unit.tx.driver
            row = await self.table.locked(driver, name)
            if row is None:
                raise ScheduleNotFound(name)
            schedule = _readable(row).schedule
            resumed = await self.table.resume(driver, name, _first_fire(schedule, moment), moment)
            if record is not None:
                await record(unit.tx, resumed)
        self._failing.pop(name, None)  # its failures forgotten
        self.wake()
        return resumed

    # Reading schedules.

    async def get(self, name: str) -> ScheduleState | None:
        """The schedule ``name`` as its row stands, or ``None``.

        Raises:
            ScheduleError: its stored definition cannot be read.
        """
        async with self.router.transaction() as unit:
            row = await self.table.get(unit.tx.driver, name)
        if row is None:
            return None
        return _readable(row)

    async def states(self, *, after: str = "", limit: int = _PAGE) -> list[ScheduleState]:
        """At most ``limit`` schedules named after ``after``, by name; one whose
        stored definition cannot be read is left out, and logged (:meth:`page` says
        which, and where the next page starts).
        """
        return (await self.page(after=after, limit=limit)).states

    async def page(self, *, after: str = "", limit: int = _PAGE) -> SchedulePage:
        """The next ``limit`` stored schedules named after ``after``, by name: those
        that can be read, and the names of those that cannot (each logged as an
        error)."""
        async with self.router.transaction() as unit:
            rows = await self.table.page(unit.tx.driver, after, limit)
        states: list[ScheduleState] = []
        unreadable: list[str] = []
        for row in rows:
            state = _read(row)
            if state is None:
                _log.error("schedule %r: its stored definition cannot be read", row.name)
                unreadable.append(row.name)
                continue
            states.append(state)
        return SchedulePage(states, unreadable, rows[-1].name if rows else None)

    async def next_due(self) -> datetime | None:
        """When the first running schedule is due, or ``None``."""
        async with self.router.transaction() as unit:
            return await self.table.next_due(unit.tx.driver)

    # Firing.

    def failing(self) -> tuple[str, ...]:
        """The schedules whose last step this scheduler took failed (their fire is
        taken again after the backoff), by name: each is named from its failure until
        its step is made (a fire made, or missed fires let pass), or it is paused,
        resumed or removed. What another scheduler did (it made the fire, paused or
        removed the schedule) :meth:`run` sees within 30 s, or at the retry if sooner."""
        return tuple(sorted(self._failing))

    async def backfill(self, name: str, start: datetime, end: datetime) -> list[Routed]:
        """Make the fires of ``name`` in ``[start, end)`` now, in order, each routed in
        a transaction of its own with its usual message id: a fire already made (and
        still in its bindings' dedupe horizon) is a duplicate, not a second delivery.
        The schedule's row is left as it is; a paused schedule is backfilled too.

        Raises:
            ScheduleError: no schedule ``name`` (:class:`ScheduleNotFound`), ``end`` not
                after ``start``, or more
                than :data:`MAX_BACKFILL` fires in the range.
            Exception: as :meth:`Router.route`; the fires before it were made.
        """
        if end <= start:
            raise ScheduleError("a backfill's end comes after its start")
        state = await self.get(name)
        if state is None:
            raise ScheduleNotFound(name)
        schedule = state.schedule
        fires = []
        for fire in schedule.fires(start, end):
            fires.append(fire)
            if len(fires) > MAX_BACKFILL:
                raise ScheduleError(f"a backfill makes at most {MAX_BACKFILL} fires")
        routing = self.router if self.sharded is None else self.sharded
        return [await routing.route(schedule.event(fire)) for fire in fires]

    async def fire_due(self, *, now: datetime | None = None) -> list[FireReport]:
        """One pass: step every running schedule due at ``now`` (the clock's time by
        default) until none is, one fire a transaction, the earliest due first. A
        schedule whose step failed is not taken again in the pass.

        Raises:
            Exception: the database failed outside a fire (a claim or a commit).
        """
        reports: list[FireReport] = []
        while True:
            moment = self.clock() if now is None else self._now(now)
            report_ = await self._step(moment)
            if report_ is None:
                return reports
            reports.append(report_)

    def wake(self) -> None:
        """Make :meth:`run` look at the table now (a schedule was put or resumed)."""
        self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Fire due schedules until ``stop`` is set: a pass, then sleep until the next
        due time, at most ``poll`` seconds, or until :meth:`wake` is called.

        Raises:
            Exception: a pass failed (the database went away); the caller decides
                whether to start it again.
        """
        while not stop.is_set():
            self._woken.clear()
            await self.fire_due()
            await self._recheck()
            wait = self.poll
            upcoming = await self.next_due()
            if upcoming is not None:
                wait = min(wait, max(0.0, (upcoming - self.clock()).total_seconds()))
            if wait > 0 and not self._woken.is_set():
                await nap(stop, self._woken, wait)

    async def _recheck(self) -> None:
        """Forget the failing schedules whose row, read when their retry is due (or
        :data:`_RECHECK` after the last read), no longer says they fail: removed,
        paused, or moved on by another process."""
        now = self.clock()
        earliest = sorted((at, name) for name, at in self._failing.items() if at <= now)
        due = [name for _, name in earliest[:_RECHECKS]]
        if not due:
            return
        async with self.router.transaction() as unit:
            rows = [(name, await self.table.get(unit.tx.driver, name)) for name in due]
        for name, row in rows:
            if row is None or row.paused or row.failures == 0:
                self._failing.pop(name, None)
            elif name in self._failing:
                self._failing[name] = min(row.due_at, now + _RECHECK)

    async def _step(self, now: datetime) -> FireReport | None:
        """Claim the schedule due first and step it, in one transaction; a step that
        raised after the claim is rolled back whole and recorded in another."""
        started = time.perf_counter()
        row: ScheduleRow | None = None
        try:
            async with self.router.transaction(entered=Entry.SCHEDULE) as unit:
                row = await self.table.claim(unit.tx.driver, now)
                if row is None:
                    return None
                step = await self._made(unit, row, now)
        except Exception as failure:
            if row is None:  # the claim itself: the database's trouble, the caller's
                raise
            error = f"{type(failure).__name__}: {failure}"
            await self._failed(row, error, now, down=database_down(failure))
            return _reported(FireReport(row.name, None, 0, None, error), row, now, started)
        made, schedule, next_fire_at = step
        self._failing.pop(row.name, None)
        if made.skipped:
            _log.warning(
                "schedule %r let %s%d missed fire%s pass (catch_up %s), from %s; next fire %s",
                row.name,
                "at least " if made.at_least else "",
                made.skipped,
                "" if made.skipped == 1 else "s",
                schedule.catch_up.value,
                row.next_fire_at.isoformat(),
                next_fire_at.isoformat(),
            )
        return _reported(made, row, now, started)

    async def _made(
        self, unit: Unit, row: ScheduleRow, now: datetime
    ) -> tuple[FireReport, Schedule, datetime]:
        """Decide the claimed ``row``'s step, route its fire in ``unit`` and move the
        row on; answer the report, the schedule and its next fire.

        Raises:
            ScheduleError: the stored definition cannot be read.
            Exception: from the routing: ``unit`` must be rolled back.
        """
        schedule = _readable(row).schedule
        step = next_step(schedule, row.next_fire_at, now)
        routed = None
        if step.fire is not None:
            event = schedule.event(step.fire)

            async def work() -> Routed:
                routing = self.router if self.sharded is None else self.sharded
                return await routing.route_in(unit, event, Entry.SCHEDULE, now=now)

            routed = await around(unit.config, schedule.scope, Entry.SCHEDULE, work)
        # A schedule whose next fire is due already (a backlog being caught up) is
        # queued behind the others due now: its backlog is made between their fires,
        # never ahead of all of them (which would make theirs late past their grace,
        # and let them pass as missed while a worker was running).
        catching_up = step.next_fire_at < now
        await self.table.made(
            unit.tx.driver,
            row.name,
            fire_at=step.fire,
            skipped=step.skipped,
            next_fire_at=step.next_fire_at,
            now=now,
            due_at=max(step.next_fire_at, now) if catching_up else None,
        )
        made = FireReport(row.name, step.fire, step.skipped, routed, at_least=step.at_least)
        return made, schedule, step.next_fire_at

    async def _failed(
        self, row: ScheduleRow, error: str, now: datetime, *, down: bool = False
    ) -> None:
        """Record on ``row`` that its step failed with ``error``, unless another worker
        moved the row on meanwhile; it is taken again after the backoff, or after
        ``retry`` alone when a database did not answer (``down``: the store its fire
        goes to stopped, say), so that the fire, and readiness, follow within
        ``retry`` of its return rather than up to ``max_retry`` later."""
        doubled = min(self.retry * 2 ** min(row.failures, 30), self.max_retry)
        wait = self.retry if down else doubled
        self._failing[row.name] = now  # until recorded, :meth:`_recheck` reads the row
        async with self.router.transaction() as unit:
            driver = unit.tx.driver
            current = await self.table.locked(driver, row.name)
            if current is None or current.updated_at != row.updated_at:
                # Removed, or changed by another worker or an operator since the claim:
                # not recorded on the row as it stands now, but said all the same.
                _log.error(
                    "schedule %r: the fire at %s failed (not recorded: the schedule "
                    "changed meanwhile): %s",
                    row.name,
                    row.next_fire_at.isoformat(),
                    error,
                )
                return
            await self.table.failed(driver, row.name, error=error, due_at=now + wait, now=now)
        self._failing[row.name] = now + min(wait, _RECHECK)
        _log.error(
            "schedule %r: the fire at %s failed (%d in a row), tried again in %.0f s: %s",
            row.name,
            row.next_fire_at.isoformat(),
            row.failures + 1,
            wait.total_seconds(),
            error,
        )

    def _now(self, now: datetime | None) -> datetime:
        if now is None:
            return self.clock()
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, not {now!r}")
        return now.astimezone(UTC)


def _first_fire(schedule: Schedule, now: datetime) -> datetime:
    try:
        return schedule.after(now)
    except ValueError as error:  # a CronError: never fires
        raise ScheduleError(f"schedule {schedule.name!r}: {error}") from error


def _read(row: ScheduleRow) -> ScheduleState | None:
    """The row as a state, or ``None`` when its definition cannot be read."""
    try:
        return _readable(row)
    except ScheduleError:
        return None


def _readable(row: ScheduleRow) -> ScheduleState:
    schedule = Schedule.from_mapping(row.name, {**row.definition, "paused": row.paused})
    return ScheduleState(
        schedule,
        row.paused,
        row.next_fire_at,
        row.due_at,
        row.last_fire_at,
        row.last_made_at,
        row.fired,
        row.skipped,
        row.failures,
        row.last_error,
        row.updated_at,
    )


def _reported(made: FireReport, row: ScheduleRow, now: datetime, started: float) -> FireReport:
    if enabled(_SCHEDULE):
        outcome = "failed" if made.error else "made" if made.fire_time else "skipped"
        fire_time = made.fire_time or row.next_fire_at
        report(
            _SCHEDULE,
            {
                "duration": time.perf_counter() - started,
                "lag": (now - fire_time).total_seconds(),
                "skipped": made.skipped,
            },
            {
                "schedule": made.name,
                "scope": row.scope,
                "fire_time": fire_time.isoformat(),
                "outcome": outcome,
                "error": made.error,
            },
        )
    return made


async def nap(stop: asyncio.Event, woken: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if woken or stopped."""
    waits: Iterable[asyncio.Future[object]] = (
        asyncio.ensure_future(asyncio.sleep(seconds)),
        asyncio.ensure_future(woken.wait()),
        asyncio.ensure_future(stop.wait()),
    )
    pending = set(waits)
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in pending:
            future.cancel()
