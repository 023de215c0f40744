"""A clock a test moves itself: time skips ahead, and the durable timers due on the
way fire as it passes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from statifier.durable import Durable

__all__ = ["START", "ManualClock", "TimerStuck"]

START: Final = datetime(2026, 1, 1, tzinfo=UTC)
"""Where a :class:`ManualClock` starts unless told: the start of ``statifier
scenario``'s clock."""


class TimerStuck(RuntimeError):  # noqa: N818 - names what happened
    """A due timer did not fire (its fire raised: the worker logged why and put it off),
    or timers kept firing past the bound, as a chart that sends to itself without end
    does."""


@dataclass(slots=True)
class ManualClock:
    """ "Now" for a :class:`~statifier.durable.Durable` opened with ``clock=``: it
    stands still until :meth:`advance` moves it.

    Call it for the time (an aware UTC datetime); :meth:`advance` moves it forward
    and fires every timer due on the way, the way ``statifier scenario`` does on its
    ``advance`` step: one due instant at a time, in due order, the clock at each
    instant before its timers fire, so that a timer a fired step arms is timed from
    that fire (and fires within the same advance when it is due by its end).

    Not frozen: moving is what it is for. Not shared between tests: the
    ``statifier_clock`` fixture gives each test its own.

    >>> clock = ManualClock()
    >>> clock()
    datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc)

    Raises:
        ValueError: ``now`` is naive.
    """

    now: datetime = START

    def __post_init__(self) -> None:
        if self.now.tzinfo is None:
            raise ValueError(f"a clock's time is timezone-aware, not {self.now!r}")
        self.now = self.now.astimezone(UTC)

    def __call__(self) -> datetime:
        return self.now

    async def advance(self, durable: Durable, by: timedelta | str) -> int:
        """Move the clock forward by ``by`` (a :class:`~datetime.timedelta`, or an ISO
        8601 duration of days, hours, minutes and seconds, ``"PT15M"``), firing every
        timer of ``durable``'s database due on the way; returns how many fired (taken
        off the queue: fired, or discarded because their execution had ended).

        ``durable`` must be open, on a SQL database, and opened with this clock
        (``Durable(..., clock=clock)``), so that the times it writes and the due times
        of the timers it schedules are this clock's.

        Raises:
            ValueError: ``by`` is negative or not a duration.
            TimerStuck: a due timer's fire raised, or more than
                :data:`statifier.router.scenario.MAX_FIRES` timers fired.
            RuntimeError: ``durable`` is not open, or not on a SQL database.
        """
        from statifier.router.scenario import MAX_FIRES, parse_duration

        step = parse_duration(by) if isinstance(by, str) else by
        if step < timedelta(0):
            raise ValueError(f"a clock moves forward by a duration, not {by!r}")
        until = self.now + step
        fired = 0
        while (due := await durable.next_due()) is not None and due <= until:
            # Never back: a timer due before now (scheduled before the clock moved) is
            # due at the clock.
            self.now = max(self.now, due)
            taken = await durable.fire_due(self.now)
            if taken == 0:
                raise TimerStuck(
                    f"the timer due at {due.isoformat()} did not fire: its fire raised "
                    "(the logger statifier.router says why)"
                )
            fired += taken
            if fired > MAX_FIRES:
                raise TimerStuck(f"more than {MAX_FIRES} timers fired in one advance")
        self.now = until
        return fired
