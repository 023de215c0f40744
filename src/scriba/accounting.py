"""The gapless prefix of what a source delivered: how far a projection is accounted for.

Events are delivered in increasing position and finish in any order (partitions
commit independently). The prefix is the greatest position P such that every
delivered event at or below P is done: committed, skipped or dead-lettered. Only P
may be acknowledged to the source or stored as the watermark; an event still in a
handler holds it back however many later events have committed.

>>> ledger = Ledger(after=0)
>>> [ledger.delivered(position, None) for position in (1, 2, 5, 2)]
[True, True, True, False]
>>> ledger.done([2, 5]); ledger.prefix
0
>>> ledger.done([1]); ledger.prefix, ledger.in_flight
(5, 0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime

__all__ = ["Ledger"]


class Ledger:
    """Delivered positions and which of them are done, for one subscription."""

    __slots__ = ("_done", "_pending", "prefix", "prefix_occurred_at")

    def __init__(self, after: int) -> None:
        self._pending: deque[tuple[int, datetime | None]] = deque()
        self._done: set[int] = set()
        self.prefix = after
        """Every delivered event at or below this position is done."""
        self.prefix_occurred_at: datetime | None = None
        """When the event at :attr:`prefix` occurred (``None`` before the first)."""

    @property
    def in_flight(self) -> int:
        """Delivered events not yet done, or done above an unfinished one."""
        return len(self._pending)

    def delivered(self, position: int, occurred_at: datetime | None) -> bool:
        """Record an event handed to the pipeline; returns whether it is new.

        An event at or below a position already recorded (or the starting point) is a
        redelivery: it is not recorded, and must not be handled again.
        """
        last = self._pending[-1][0] if self._pending else self.prefix
        if position <= last:
            return False
        self._pending.append((position, occurred_at))
        return True

    def done(self, positions: Iterable[int]) -> None:
        """Mark delivered events done, and move the prefix over every finished one."""
        self._done.update(positions)
        pending, finished = self._pending, self._done
        while pending and pending[0][0] in finished:
            position, occurred_at = pending.popleft()
            finished.discard(position)
            self.prefix = position
            self.prefix_occurred_at = occurred_at
