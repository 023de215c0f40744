"""Clocks for sessions: the real one, and a virtual one that tests can drive.

A session never reads time itself; it asks its clock to call it back after a delay.
:class:`RealClock` uses the event loop's timers. :class:`VirtualClock` keeps timers in
a heap and fires them only when told to advance, so delays cost no wall time and fire
in a deterministic order (due time, then the order they were armed).
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "RealClock", "TimerHandle", "VirtualClock"]


class TimerHandle(Protocol):
    """What a clock returns for an armed timer."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Time as a session sees it, in milliseconds."""

    def now_ms(self) -> int: ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle: ...


class RealClock:
    """Wall-clock timers on the running asyncio loop."""

    def now_ms(self) -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        return asyncio.get_running_loop().call_later(delay_ms / 1000, callback)


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "due", "order")

    def __init__(self, due: int, order: int, callback: Callable[[], None]) -> None:
        self.due = due
        self.order = order
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _VirtualTimer) -> bool:
        return (self.due, self.order) < (other.due, other.order)


class VirtualClock:
    """Timers that fire only when :meth:`advance` is called.

    >>> clock = VirtualClock()
    >>> fired = []
    >>> _ = clock.call_later(50, lambda: fired.append("b"))
    >>> _ = clock.call_later(10, lambda: fired.append("a"))
    >>> clock.advance(), clock.advance(), fired, clock.now_ms()
    (True, True, ['a', 'b'], 50)
    """

    def __init__(self) -> None:
        self._now = 0
        self._order = 0
        self._timers: list[_VirtualTimer] = []

    def now_ms(self) -> int:
        return self._now

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> TimerHandle:
        self._order += 1
        timer = _VirtualTimer(self._now + max(delay_ms, 0), self._order, callback)
        heapq.heappush(self._timers, timer)
        return timer

    def pending(self) -> int:
        """How many armed timers have not fired or been cancelled."""
        return sum(1 for timer in self._timers if not timer.cancelled)

    def next_due(self) -> int | None:
        """When the next live timer is due, if any."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].due if self._timers else None

    def advance(self, until_ms: int | None = None) -> bool:
        """Fire the next live timer (if due no later than ``until_ms``), moving the clock
        to its due time. Returns whether one fired."""
        due = self.next_due()
        if due is None or (until_ms is not None and due > until_ms):
            return False
        timer = heapq.heappop(self._timers)
        self._now = max(self._now, timer.due)
        timer.callback()
        return True
