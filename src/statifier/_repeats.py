"""Bounding a repeated log line: one line per kind and interval, with a count.

A refusal a client repeats a thousand times a second, or an accept failing in a tight
loop, must reach an operator, but as a few lines, not as a flood that buries
everything else. :class:`Repeats` writes the first occurrence of a kind at once, then
counts the ones that follow; when the interval ends it writes one line saying how many
there were, and opens a new interval if there were any. A kind that stays quiet for
a whole interval starts over: its next occurrence is written at once.

It runs on the event loop that calls it (its timers are the loop's).

>>> import asyncio
>>> async def main():
...     repeats = Repeats(interval=0.05)
...     for _ in range(3):
...         repeats.note("413", lambda: print("refused: 413"), lambda n: print(f"{n} more"))
...     await asyncio.sleep(0.2)
>>> asyncio.run(main())
refused: 413
2 more
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Final

__all__ = ["INTERVAL", "Repeats"]

INTERVAL: Final = 10.0
"""Seconds between two lines of one kind, by default."""


@dataclass
class _Window:
    count: int
    later: Callable[[int], None]


class Repeats:
    """Which occurrences of each kind are written (see the module docstring).

    Args:
        interval: the fewest seconds between two lines of one kind (:data:`INTERVAL`
            when not given).
    """

    interval: float = INTERVAL

    def __init__(self, interval: float | None = None) -> None:
        if interval is not None:
            self.interval = interval
        self._open: dict[Hashable, _Window] = {}

    def note(self, kind: Hashable, first: Callable[[], None], later: Callable[[int], None]) -> None:
        """Count one occurrence of ``kind``: ``first()`` writes it when no interval of
        its kind is open; otherwise it is counted, and ``later(count)`` writes the
        count when the interval ends."""
        window = self._open.get(kind)
        if window is not None:
            window.count += 1
            window.later = later
            return
        first()
        self._open[kind] = _Window(0, later)
        asyncio.get_running_loop().call_later(self.interval, self._close, kind)

    def flush(self) -> None:
        """Write the count of every open interval now (the interval's timer then finds
        nothing more to write): for a process that stops before its intervals end."""
        for window in self._open.values():
            if window.count:
                window.later(window.count)
                window.count = 0

    def _close(self, kind: Hashable) -> None:
        window = self._open.pop(kind)
        if window.count:
            window.later(window.count)
            self._open[kind] = _Window(0, window.later)
            asyncio.get_running_loop().call_later(self.interval, self._close, kind)
