"""The schedules page's reads, and the console's two actions on a schedule: pause and
resume.

:func:`schedules_page` reads the ``schedules`` table (:mod:`statifier.router.scheduler`
writes it) a page at a time, by name, as the console reads every list: on its own
engine, outside any router transaction. Each row becomes a :class:`ScheduleView` whose
:attr:`~ScheduleView.state` tells the operator at a glance how the schedule stands
(:class:`Standing`): ``running``, ``paused``, ``failing`` (its last step failed),
``late`` (running, and due more than :data:`LATE_AFTER` ago: no worker took it) or
``unreadable`` (its stored definition cannot be read, which the scheduler's own list
would leave out; here it is shown, with why).

:func:`pause` and :func:`resume` are actions as :mod:`statifier.console.actions` makes
them: each is :meth:`Scheduler.pause <statifier.router.Scheduler.pause>` or
``resume``, whose ``record`` hook writes the audit row before the commit, so the
change and its audit row commit together or not at all. A pause stops the fires until
a resume; a resume makes the schedule's next fire its first after now (the fires its
pause covered are not made) and clears its failures. Nothing to do (no such schedule,
paused already, running already) is :class:`~statifier.console.actions.Refused`, with
nothing written.

>>> from datetime import UTC, datetime, timedelta
>>> now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
>>> state_of(paused=False, failures=0, due_at=now - timedelta(seconds=30), now=now).value
'running'
>>> state_of(paused=False, failures=0, due_at=now - timedelta(minutes=5), now=now).value
'late'
>>> state_of(paused=False, failures=2, due_at=now - timedelta(minutes=5), now=now).value
'failing'
>>> state_of(paused=True, failures=2, due_at=now - timedelta(minutes=5), now=now).value
'paused'
>>> every_text(timedelta(hours=1, minutes=30)), every_text(timedelta(seconds=90.5))
('1h 30m', '1m 30.5s')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Final

from statifier.console.actions import Done, Record, Refused
from statifier.console.queries import MAX_PAGE, Page
from statifier.extras import MissingExtra
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    SCHEDULE_LATE_AFTER,
    Router,
    Schedule,
    ScheduleError,
    ScheduleNotFound,
    Scheduler,
)
from statifier.router.schedules import EPOCH
from statifier.sql.engines import run_on
from statifier.sql.schedules import ScheduleRow
from statifier.sql.tables import Tables

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "LATE_AFTER",
    "MAX_SCOPE",
    "ScheduleView",
    "Standing",
    "every_text",
    "pause",
    "resume",
    "schedules_page",
    "state_of",
]

LATE_AFTER: Final = SCHEDULE_LATE_AFTER
"""How long past its due time a running schedule may wait before the page calls it
late, as ``statifier schedules list`` does: a minute means no worker is taking it."""

MAX_SCOPE: Final = 500
"""The longest scope the page's filter takes."""


class Standing(StrEnum):
    """How a schedule stands, as the page's state column says it (most telling first:
    a paused schedule is ``paused`` whatever else holds, a failing one ``failing``
    however late it is)."""

    RUNNING = "running"
    PAUSED = "paused"
    FAILING = "failing"
    LATE = "late"
    UNREADABLE = "unreadable"


def state_of(*, paused: bool, failures: int, due_at: datetime, now: datetime) -> Standing:
    """The state of a readable schedule at ``now``: ``paused``; else ``failing`` when
    its last step failed (``failures`` > 0); else ``late`` when it was due more than
    :data:`LATE_AFTER` before ``now``; else ``running``."""
    if paused:
        return Standing.PAUSED
    if failures > 0:
        return Standing.FAILING
    if due_at < now - LATE_AFTER:
        return Standing.LATE
    return Standing.RUNNING


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as the page shows it: its row, and what the page makes of it.

    Attributes:
        row: the row as stored (:class:`~statifier.sql.schedules.ScheduleRow`).
        schedule: its definition, ``None`` when it cannot be read.
        unreadable: why the definition cannot be read, else ``None``.
        state: how it stands at the time the page was read (:func:`state_of`).
    """

    row: ScheduleRow
    schedule: Schedule | None
    unreadable: str | None
    state: Standing

    @property
    def cron(self) -> str | None:
        """The cron expression it fires at, or ``None`` (an ``every`` schedule)."""
        cron = None if self.schedule is None else self.schedule.cron
        return None if cron is None else cron.text

    @property
    def timezone(self) -> str | None:
        """The time zone its cron expression is read in, or ``None``."""
        return None if self.cron is None or self.schedule is None else self.schedule.timezone

    @property
    def every(self) -> str | None:
        """Its interval as :func:`every_text` writes it, or ``None`` (a cron one)."""
        every = None if self.schedule is None else self.schedule.every
        return None if every is None else every_text(every)

    @property
    def start(self) -> datetime | None:
        """Where an ``every`` schedule counts its fires from, ``None`` for a cron one or
        one counting from the epoch (the default, which says nothing to show)."""
        if self.schedule is None or self.schedule.every is None or self.schedule.start == EPOCH:
            return None
        return self.schedule.start

    @property
    def retrying(self) -> bool:
        """Whether a step failed and is tried again at its row's ``due_at`` (a
        schedule catching up a backlog is taken again at once, later than its next
        fire's time too, and tried nothing again)."""
        return self.row.failures > 0 and self.row.due_at != self.row.next_fire_at


def every_text(every: timedelta) -> str:
    """An interval in days, hours, minutes and seconds, the zero parts left out:
    ``1d 2h``, ``15m``, ``1m 30.5s``."""
    whole = int(every.total_seconds())
    fraction = every.total_seconds() - whole
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    parts += [f"{hours}h"] if hours else []
    parts += [f"{minutes}m"] if minutes else []
    if seconds or fraction:
        parts.append(f"{seconds + fraction:g}s")
    return " ".join(parts) or "0s"


async def schedules_page(
    engine: sa.Engine | AsyncEngine,
    tables: Tables,
    *,
    now: datetime,
    after: str | None = None,
    scope: str | None = None,
    size: int = 50,
) -> Page[ScheduleView]:
    """The schedules named after ``after`` (from the first without it), by name, in
    ``scope`` alone when given; at most ``size``. The next page's cursor is the last
    name listed (``None`` on the last page). States are as at ``now``.

    Raises:
        ValueError: ``size`` outside ``1..MAX_PAGE``, or ``scope`` empty or longer than
            :data:`MAX_SCOPE` characters.
        sqlalchemy.exc.DBAPIError: the database failed.
    """
    given: object = size
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PAGE:
        raise ValueError(f"a page holds 1 to {MAX_PAGE} rows, not {size!r}")
    if scope is not None and not 0 < len(scope) <= MAX_SCOPE:
        raise ValueError(f"scope: 1 to {MAX_SCOPE} characters")
    table = tables.schedules
    names = [column.name for column in fields(ScheduleRow)]
    statement = sa.select(*(table.c[name] for name in names)).order_by(table.c.name)
    statement = statement.limit(size + 1)
    if after:
        statement = statement.where(table.c.name > after)
    if scope is not None:
        statement = statement.where(table.c.scope == scope)

    def read(connection: sa.Connection) -> list[ScheduleRow]:
        result = connection.execute(statement)
        return [ScheduleRow(**dict(zip(names, row, strict=True))) for row in result]

    rows = await run_on(engine, read)
    views = tuple(_view(row, now) for row in rows[:size])
    return Page(views, views[-1].row.name if len(rows) > size else None)


def _view(row: ScheduleRow, now: datetime) -> ScheduleView:
    schedule: Schedule | None = None
    unreadable: str | None = None
    definition: object = row.definition
    try:
        if not isinstance(definition, Mapping):
            raise ScheduleError(f"schedule {row.name!r}: its definition is not a table")
        schedule = Schedule.from_mapping(row.name, {**definition, "paused": row.paused})
    except ScheduleError as error:
        unreadable = str(error)
    state = (
        Standing.UNREADABLE
        if schedule is None
        else state_of(paused=row.paused, failures=row.failures, due_at=row.due_at, now=now)
    )
    return ScheduleView(row, schedule, unreadable, state)


async def pause(router: Router, name: str, *, record: Record) -> Done:
    """Pause the schedule ``name`` (:meth:`Scheduler.pause
    <statifier.router.Scheduler.pause>`): no fire is made until it is resumed;
    ``record`` in the same router transaction.

    Raises:
        Refused: no schedule ``name``, or it is paused already (nothing written).
    """
    done = Done(f"paused schedule {name!r}")

    async def recorded(tx: SqlTransaction, paused: bool) -> None:
        if not paused:  # raised in the transaction: it is rolled back, nothing written
            raise Refused(f"schedule {name!r} is paused already")
        await record(tx, done)

    try:
        await Scheduler(router).pause(name, record=recorded)
    except ScheduleNotFound as error:
        raise Refused(f"no schedule {name!r}") from error
    return done


async def resume(router: Router, name: str, *, record: Record) -> Done:
    """Resume the schedule ``name`` (:meth:`Scheduler.resume
    <statifier.router.Scheduler.resume>`): its next fire is its first after now (the
    fires its pause covered are not made) and its failures are cleared; ``record`` in
    the same router transaction.

    Raises:
        Refused: no schedule ``name``, or it is running already (nothing written).
        ScheduleError: its stored definition cannot be read, or it never fires again
            (nothing written).
    """
    scheduler = Scheduler(router)
    done: list[Done] = []

    async def recorded(tx: SqlTransaction, resumed: bool) -> None:
        if not resumed:  # raised in the transaction: it is rolled back, nothing written
            raise Refused(f"schedule {name!r} is running already")
        row = await scheduler.table.get(tx.driver, name)  # as the resume just left it
        assert row is not None  # locked by the resume
        at = _utc_text(row.next_fire_at)
        done.append(Done(f"resumed schedule {name!r}: its next fire is at {at}"))
        await record(tx, done[0])

    try:
        await scheduler.resume(name, record=recorded)
    except ScheduleNotFound as error:
        raise Refused(f"no schedule {name!r}") from error
    return done[0]


def _utc_text(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
