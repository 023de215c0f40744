"""Bounding a repeated log line: the first of its kind is written, then at most one per
interval, carrying how many of its kind were held back since the last one.

A refusal a client repeats a thousand times a second must reach an operator, but as a
few lines, not as a flood that buries everything else (each refusal is still reported
one by one as telemetry).

>>> now = [0.0]
>>> repeats = Repeats(interval=10.0, clock=lambda: now[0])
>>> repeats.admit("413"), repeats.admit("413"), repeats.admit("413")
(0, None, None)
>>> now[0] = 10.5
>>> repeats.admit("413"), repeats.admit("400")
(2, 0)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["INTERVAL", "Repeats"]

INTERVAL: Final = 10.0
"""Seconds between two lines of one kind, by default."""
_MAX_KINDS: Final = 1024
"""Kinds remembered at most; beyond, those quiet for a whole interval are forgotten."""


class Repeats:
    """Which lines of each kind may be written (see the module docstring).

    Args:
        interval: the fewest seconds between two lines of one kind.
        clock: a monotonic clock, in seconds.
    """

    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._kinds: dict[Hashable, tuple[float, int]] = {}
        """kind -> when its last line was written, and how many were held back since."""

    def admit(self, kind: Hashable) -> int | None:
        """``None`` to hold this one back (it is counted), else the number held back
        since the last line of ``kind``, to be said in the line written now."""
        now = self.clock()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self.interval:
            self._kinds[kind] = (last[0], last[1] + 1)
            return None
        if last is None and len(self._kinds) >= _MAX_KINDS:
            self._forget(now)
        self._kinds[kind] = (now, 0)
        return 0 if last is None else last[1]

    def _forget(self, now: float) -> None:
        quiet = [k for k, (at, _) in self._kinds.items() if now - at >= self.interval]
        for kind in quiet:
            del self._kinds[kind]
