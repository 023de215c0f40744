"""Schedules: events routed at the times a cron expression or a fixed interval names.

A :class:`Schedule` says when it fires (``cron`` in a time zone, or ``every`` a fixed
duration from ``start``), what each fire is (an inbound event from ``source`` in
``scope`` carrying ``data``) and what happens to fires missed while nothing ran (its
catch-up policy). Each fire has an identity, its time: the event's message id is
``NAME/<fire time in UTC ISO 8601>``, so a fire made twice (by two processes, or by a
backfill over fires already made) is one delivery, by the router's dedupe.

Everything here is pure: :meth:`Schedule.after` computes fire times and
:func:`next_step` decides, for a schedule whose next fire is due, what one worker
transaction does (make it, or let missed ones pass). The rows and the worker are
:mod:`statifier.router.scheduler`.

Catch-up. A fire made at most ``grace`` after its time is on time, whatever the policy.
One later than that was missed (nothing ran, or the schedule's fires failed):

- ``skip`` (the default): missed fires are not made;
- ``one``: of the missed fires no older than ``catch_up_window``, the latest is made,
  the others not;
- ``all``: every missed fire no older than ``catch_up_window`` is made, in order.

Fires let pass are counted (:attr:`Step.skipped`) and logged by the worker. A cron
schedule's missed fires are counted in one pass over its fire times, up to
:data:`MAX_COUNTED`: past it a step stops counting and says so (:attr:`Step.at_least`),
its count a lower bound, so that a long downtime costs one step a bounded time.

>>> from datetime import UTC, datetime
>>> nightly = Schedule.from_mapping("nightly", {"cron": "0 2 * * *",
...     "timezone": "Europe/Paris", "source": "clock", "scope": "shop"})
>>> fire = nightly.after(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
>>> fire.isoformat()  # 02:00 is skipped that night in Paris: at the change's end
'2026-03-29T01:00:00+00:00'
>>> nightly.event(fire).message_id
'nightly/2026-03-29T01:00:00Z'
>>> late = next_step(nightly, fire, datetime(2026, 3, 30, 9, 0, tzinfo=UTC))
>>> late.fire is None, late.skipped, late.next_fire_at.isoformat()
(True, 2, '2026-03-31T00:00:00+00:00')
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from statifier.cron import Cron, CronError, zone
from statifier.expr import Value
from statifier.router.errors import ConfigError
from statifier.router.outcomes import InboundEvent
from statifier.router.scenario_case import CaseError, parse_duration

__all__ = [
    "MAX_COUNTED",
    "MAX_SCHEDULE_DATA",
    "RESERVED_DATA",
    "CatchUp",
    "Schedule",
    "ScheduleError",
    "ScheduleNotFound",
    "Step",
    "fire_id",
    "next_step",
]

MAX_SCHEDULE_DATA: Final = 64 * 1024
"""The most characters a schedule's ``data`` takes as JSON."""

MAX_COUNTED: Final = 100_000
"""The most missed fires of a cron schedule one :func:`next_step` counts (about half a
second's work): past it the step says the count is a lower bound (:attr:`Step.at_least`).
The fires an ``every`` schedule missed are computed, never counted one by one."""

_FIRST_SPAN: Final = timedelta(hours=1)
"""How far back from its end the latest of more than :data:`MAX_COUNTED` missed fires is
first looked for (then twice as far, and so on)."""

MAX_NAME_LENGTH: Final = 200
"""The longest schedule name."""

RESERVED_DATA: Final = ("schedule", "fire_time")
"""The keys every fire's data carries (the schedule's name, the fire's time in UTC ISO
8601): a schedule's own ``data`` may not hold them."""

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""Where an ``every`` schedule counts its fires from unless given ``start``: every
process computes the same times."""

_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]+")
_FIELDS: Final = frozenset(
    {
        "cron",
        "every",
        "start",
        "timezone",
        "source",
        "scope",
        "data",
        "catch_up",
        "catch_up_window",
        "grace",
        "paused",
    }
)


class ScheduleError(ConfigError):
    """A schedule that cannot work (a bad name, time, policy or data), or a call about
    a schedule that is not there."""


class ScheduleNotFound(ScheduleError):  # noqa: N818 - names what is missing
    """A call named a schedule that is not there."""

    def __init__(self, name: str) -> None:
        super().__init__(f"there is no schedule {name!r}")
        self.name = name


class CatchUp(StrEnum):
    """What becomes of the fires a schedule missed (see the module docstring)."""

    SKIP = "skip"
    ONE = "one"
    ALL = "all"


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """When a schedule fires and what each fire routes.

    Attributes:
        name: names it; letters, digits and ``_.:-`` (the message id puts a ``/``
            after it), at most :data:`MAX_NAME_LENGTH` characters.
        source, scope: the inbound event's source and scope.
        cron: the five-field expression it fires at, read in ``timezone``; or
        every: the fixed interval it fires at (at least a second), counted from
            ``start`` (:data:`EPOCH` by default), whatever the time zone.
        timezone: the IANA time zone a cron expression is read in.
        data: what each fire's event carries, with :data:`RESERVED_DATA` added.
        catch_up, catch_up_window, grace: what becomes of missed fires (see the module
            docstring); ``catch_up_window`` is at least ``grace``.
        paused: whether a schedule written by :meth:`from_mapping` starts paused.

    Raises:
        ScheduleError: anything above that does not hold.
    """

    name: str
    source: str
    scope: str
    cron: Cron | None = None
    every: timedelta | None = None
    start: datetime = EPOCH
    timezone: str = "UTC"
    data: Mapping[str, Value] = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.SKIP
    catch_up_window: timedelta = timedelta(hours=24)
    grace: timedelta = timedelta(minutes=1)
    paused: bool = False

    def __post_init__(self) -> None:
        name: object = self.name
        if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
            raise ScheduleError(
                f"a schedule's name is letters, digits and '_.:-', at most "
                f"{MAX_NAME_LENGTH} characters, not {name!r}"
            )
        where = f"schedule {name!r}"
        for attribute in ("source", "scope"):
            value: object = getattr(self, attribute)
            if not isinstance(value, str) or not value:
                raise ScheduleError(f"{where}: {attribute} must be a non-empty text")
        if (self.cron is None) == (self.every is None):
            raise ScheduleError(f"{where}: give cron or every, one of them")
        if self.every is not None and self.every < timedelta(seconds=1):
            raise ScheduleError(f"{where}: every must be at least a second")
        if self.start.tzinfo is None or self.start.utcoffset() is None:
            raise ScheduleError(f"{where}: start must carry a time zone offset")
        timezone: object = self.timezone
        if not isinstance(timezone, str):
            raise ScheduleError(f"{where}: timezone must be an IANA time zone name")
        try:
            zone(timezone)
        except CronError as error:
            raise ScheduleError(f"{where}: timezone: {error}") from error
        if not isinstance(self.catch_up, CatchUp):
            raise ScheduleError(f"{where}: catch_up is skip, one or all")
        if self.grace < timedelta(0) or self.catch_up_window < self.grace:
            raise ScheduleError(f"{where}: grace is not negative and catch_up_window not below it")
        if not isinstance(self.data, Mapping):
            raise ScheduleError(f"{where}: data must be a table")
        reserved = sorted(set(self.data) & set(RESERVED_DATA))
        if reserved:
            raise ScheduleError(f"{where}: data may not hold {reserved[0]!r}: every fire sets it")
        try:
            text = json.dumps(self.data, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ScheduleError(f"{where}: data is not JSON: {error}") from error
        if len(text) > MAX_SCHEDULE_DATA:
            raise ScheduleError(f"{where}: data is over {MAX_SCHEDULE_DATA} characters as JSON")

    @classmethod
    def from_mapping(cls, name: str, entry: Mapping[str, Any]) -> Schedule:
        """A schedule from its table in a serve file, a scenario or :meth:`as_json`:
        ``cron`` or ``every`` (an ISO 8601 duration, ``PT15M``), ``start`` (ISO 8601
        with an offset), ``timezone``, ``source``, ``scope``, ``data``, ``catch_up``,
        ``catch_up_window`` and ``grace`` (durations), ``paused``.

        Raises:
            ScheduleError: an unknown field, a missing or ill-typed one, or what the
                constructor refuses.
        """
        where = f"schedule {name!r}"
        if not isinstance(entry, Mapping):
            raise ScheduleError(f"{where}: must be a table")
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise ScheduleError(f"{where}: unknown field {unknown[0]!r}")
        values: dict[str, Any] = {}
        for text_field in ("source", "scope", "timezone"):
            if text_field in entry:
                values[text_field] = entry[text_field]
        if "cron" in entry:
            try:
                values["cron"] = Cron.parse(entry["cron"])
            except CronError as error:
                raise ScheduleError(f"{where}: cron: {error}") from error
        for duration in ("every", "catch_up_window", "grace"):
            if duration in entry:
                try:
                    values[duration] = parse_duration(entry[duration])
                except CaseError as error:
                    raise ScheduleError(f"{where}: {duration}: {error}") from error
        if "start" in entry:
            values["start"] = _instant(where, entry["start"])
        if "catch_up" in entry:
            try:
                values["catch_up"] = CatchUp(entry["catch_up"])
            except ValueError:
                raise ScheduleError(
                    f"{where}: catch_up is skip, one or all, not {entry['catch_up']!r}"
                ) from None
        if "data" in entry:
            values["data"] = entry["data"]
        if "paused" in entry:
            if not isinstance(entry["paused"], bool):
                raise ScheduleError(f"{where}: paused is true or false")
            values["paused"] = entry["paused"]
        for required in ("source", "scope"):
            if required not in values:
                raise ScheduleError(f"{where}: {required} is required")
        return cls(name=name, **values)

    def as_json(self) -> dict[str, Any]:
        """The definition as :meth:`from_mapping` reads it (JSON types only), without
        the name and ``paused``: what the ``schedules`` table stores."""
        definition: dict[str, Any] = {"source": self.source, "scope": self.scope}
        if self.cron is not None:
            definition["cron"] = self.cron.text
            definition["timezone"] = self.timezone
        else:
            assert self.every is not None
            definition["every"] = _duration_text(self.every)
            definition["start"] = _utc_text(self.start)
        definition["data"] = dict(self.data)
        definition["catch_up"] = self.catch_up.value
        definition["catch_up_window"] = _duration_text(self.catch_up_window)
        definition["grace"] = _duration_text(self.grace)
        return definition

    def timing(self) -> tuple[str, ...]:
        """What decides the fire times: a schedule whose timing changed has its next
        fire computed again; one whose data or policy changed keeps it."""
        if self.cron is not None:
            return ("cron", self.cron.text, self.timezone)
        return ("every", _duration_text(self.every or timedelta(0)), _utc_text(self.start))

    def after(self, instant: datetime) -> datetime:
        """The first fire time after ``instant`` (aware), in UTC.

        Raises:
            ValueError: ``instant`` is naive.
            CronError: a cron expression that does not fire within 29 years.
        """
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise ValueError("a schedule's fires are asked after an aware datetime")
        if self.cron is not None:
            return self.cron.next_after(instant, self.timezone)
        every = self.every
        assert every is not None
        if instant < self.start:
            return self.start.astimezone(UTC)
        return (self.start + every * ((instant - self.start) // every + 1)).astimezone(UTC)

    def fires(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """The fire times in ``[start, end)``, in order (aware UTC datetimes): a
        backfill's, a catch-up's. A cron's are one pass of :meth:`Cron.fires
        <statifier.cron.Cron.fires>` (for 29 years from ``start``), not one
        :meth:`after` each.

        Raises:
            ValueError: ``start`` is naive.
        """
        if self.cron is not None:
            for fire in self.cron.fires(start - timedelta(microseconds=1), self.timezone):
                if fire >= end:
                    return
                yield fire
            return
        fire = self.after(start - timedelta(microseconds=1))
        while fire < end:
            yield fire
            fire = self.after(fire)

    def event(self, fire_time: datetime) -> InboundEvent:
        """The inbound event of the fire at ``fire_time``: the schedule's source and
        scope, the message id :func:`fire_id`, its data with :data:`RESERVED_DATA`."""
        data: dict[str, Value] = dict(self.data)
        data["schedule"] = self.name
        data["fire_time"] = _utc_text(fire_time)
        return InboundEvent(
            scope=self.scope,
            source=self.source,
            message_id=fire_id(self.name, fire_time),
            data=data,
        )


def fire_id(name: str, fire_time: datetime) -> str:
    """The message id of schedule ``name``'s fire at ``fire_time``:
    ``NAME/<UTC ISO 8601>``, the same in every process."""
    return f"{name}/{_utc_text(fire_time)}"


@dataclass(frozen=True, slots=True)
class Step:
    """What one worker transaction does with a schedule whose next fire is due.

    Attributes:
        fire: the fire time to make now, or ``None`` (missed fires let pass).
        skipped: how many fires are let pass, unmade.
        next_fire_at: the schedule's next fire time after this step.
        at_least: whether more fires than ``skipped`` are let pass: a cron schedule
            missed more than :data:`MAX_COUNTED`, and the count stopped there.
    """

    fire: datetime | None
    skipped: int
    next_fire_at: datetime
    at_least: bool = False


def next_step(schedule: Schedule, pending: datetime, now: datetime) -> Step:
    """What to do with ``schedule`` at ``now``, its next fire being at ``pending`` (not
    after ``now``): make ``pending`` when it is on time or the policy catches it up;
    otherwise let the missed fires pass (counted) up to the one the policy makes, or
    the first on time.

    A worker makes at most one fire a transaction, and asks again while the schedule
    is due: fires are made one by one, in order. The fires let pass are counted in one
    pass over the schedule's fire times, :data:`MAX_COUNTED` at most.
    """
    missed_from = now - schedule.grace  # a fire before this was missed
    reach = now - schedule.catch_up_window  # a missed fire before this is never made
    catching_up = schedule.catch_up is CatchUp.ALL and pending >= reach
    if pending >= missed_from or catching_up:
        return Step(pending, 0, schedule.after(pending))
    if schedule.catch_up is CatchUp.ALL:
        first = schedule.after(reach - timedelta(microseconds=1))
        count, _, more = _missed(schedule, pending, first)
        return Step(None, count, first, more)
    if schedule.catch_up is CatchUp.ONE:
        count, latest, more = _missed(schedule, pending, missed_from)
        if latest >= reach:
            return Step(latest, count - 1, schedule.after(latest), more)
        return Step(None, count, schedule.after(latest), more)
    first_on_time = schedule.after(missed_from - timedelta(microseconds=1))
    count, _, more = _missed(schedule, pending, first_on_time)
    return Step(None, count, first_on_time, more)


def _missed(schedule: Schedule, first: datetime, end: datetime) -> tuple[int, datetime, bool]:
    """How many fire times lie in ``[first, end)`` (``first`` being one), the latest of
    them, and whether the count stopped at :data:`MAX_COUNTED` (more lie there: the
    latest is looked for back from ``end``)."""
    every = schedule.every
    if every is not None:
        count = math.ceil((end - first) / every)
        return count, first + every * (count - 1), False
    cron = schedule.cron
    assert cron is not None
    count, latest = 1, first
    for fire in cron.fires(first, schedule.timezone):  # one pass, not one `after` each
        if fire >= end:
            break
        if count == MAX_COUNTED:
            return count, _latest(schedule, fire, end), True
        count, latest = count + 1, fire
    return count, latest, False


def _latest(schedule: Schedule, known: datetime, end: datetime) -> datetime:
    """The latest fire time in ``[known, end)``, ``known`` being one: looked for in the
    last hour before ``end``, then the last two, four, ... (never before ``known``)."""
    span = _FIRST_SPAN
    while True:
        since = max(known, end - span)
        latest = None
        for fire in schedule.fires(since, end):
            latest = fire
        if latest is not None:
            return latest
        span *= 2


def _instant(where: str, given: object) -> datetime:
    """``given`` as an aware time in UTC: ISO 8601 text, or a time with an offset (a
    TOML offset date-time)."""
    if isinstance(given, datetime):
        parsed: datetime | None = given
    else:
        text = given if isinstance(given, str) else None
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
        except ValueError:
            parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise ScheduleError(f"{where}: start {given!r} is not an ISO 8601 time with an offset")
    return parsed.astimezone(UTC)


def _utc_text(instant: datetime) -> str:
    """``2026-12-03T17:00:00Z``, microseconds only when there are some."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _duration_text(duration: timedelta) -> str:
    """``duration`` as ``PnDTnS`` (what :func:`parse_duration` reads back)."""
    seconds = duration - timedelta(days=duration.days)
    text = f"{seconds.total_seconds():g}"
    return f"P{duration.days}DT{text}S"
