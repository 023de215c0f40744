"""How far a reader of a sequence-numbered table may go when positions are missing.

A position taken from a database sequence (PostgreSQL ``bigserial`` or identity) is
handed out when a row is inserted, not when its transaction commits. So a reader can
see 7 before 6: the transaction holding 6 is still open, or it rolled back and 6 will
never exist. Delivering 7 there and moving on would lose 6 for good if it commits
later, because every cursor and the watermark rest on ``position`` order.

:class:`GapTracker` keeps the reader honest. It delivers the run of positions that
continues from the last one delivered, and stops at a gap until the gap is *closed*:
every transaction that could still fill it has ended. The reader supplies who those
are. On PostgreSQL they are the transactions holding a write lock on the table when
the gap was seen (a transaction takes that lock before it draws a position from the
column's default, and keeps it until it ends); once they have all ended, whatever is
still missing below the highest position seen then never will appear. On SQLite a gap
is closed at once: writes are serialized and a new row never gets a rowid below one
that is already visible.

>>> tracker = GapTracker(after=0, gaps_can_fill=True)
>>> tracker.accept([1, 2, 4, 5])  # 3 is missing: deliver 1 and 2 only
2
>>> tracker.blocked
True
>>> tracker.fence(horizon=5, writers=frozenset({"4/17"}))
>>> tracker.fenced_writers
frozenset({'4/17'})
>>> tracker.close_gaps()  # transaction 4/17 has ended: 3 will never exist
>>> tracker.accept([4, 5])
2
>>> tracker.cursor
5
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_READS_PER_CALL", "PG_RUNNING_SQL", "PG_WRITERS_SQL", "GapTracker"]

# A read that closes a gap reads again; a bound keeps one read() short even when
# every re-read meets a new gap.
MAX_READS_PER_CALL = 3


@dataclass(frozen=True, slots=True)
class _Fence:
    """Missing positions at or below ``horizon`` wait until ``writers`` have ended."""

    horizon: int
    writers: frozenset[str]


class GapTracker:
    """The last position delivered, and the gap (if any) the reader waits at.

    Invariants: ``cursor`` only grows; a position is accepted only if every position
    between it and ``cursor`` is known never to appear (it was passed by a closed
    fence) or ``gaps_can_fill`` is false.
    """

    def __init__(self, after: int, *, gaps_can_fill: bool) -> None:
        if after < 0:
            raise ValueError(f"a position is 0 or more, not {after}")
        self._cursor = after
        self._gaps_can_fill = gaps_can_fill
        # Missing positions at or below this are known never to appear.
        self._passable = after
        self._fence: _Fence | None = None
        self._blocked = False

    @property
    def cursor(self) -> int:
        """The last position accepted (or the ``after`` it started from)."""
        return self._cursor

    @property
    def blocked(self) -> bool:
        """Whether the last :meth:`accept` stopped at a gap that may still fill."""
        return self._blocked

    @property
    def fenced_writers(self) -> frozenset[str] | None:
        """The writers the current gap waits on, or ``None`` when there is no fence."""
        return None if self._fence is None else self._fence.writers

    def accept(self, positions: Sequence[int]) -> int:
        """How many of ``positions`` (ascending, all above ``cursor``, as read after
        it) may be delivered now; ``cursor`` moves to the last of them.

        Raises:
            ValueError: ``positions`` are not ascending or not above ``cursor``.
        """
        accepted = 0
        self._blocked = False
        for position in positions:
            if position <= self._cursor:
                raise ValueError(
                    f"positions must ascend above {self._cursor}, got {position} (read twice?)"
                )
            next_expected = self._cursor + 1
            if self._gaps_can_fill and position != next_expected and position > self._passable + 1:
                self._blocked = True
                break
            self._cursor = position
            accepted += 1
        if self._cursor > self._passable:
            self._passable = self._cursor
        return accepted

    def fence(self, horizon: int, writers: frozenset[str]) -> None:
        """Record that, just after a read that saw positions up to ``horizon``,
        ``writers`` were the transactions that could still fill a gap below it.

        An existing fence is kept: it was recorded first, so it is closed first.
        """
        if self._fence is None:
            self._fence = _Fence(horizon, writers)

    def close_gaps(self) -> None:
        """The fenced writers have all ended: positions still missing at or below the
        fence's horizon never will appear. The caller reads again before accepting
        more, so that what those writers committed is seen."""
        if self._fence is not None:
            self._passable = max(self._passable, self._fence.horizon)
            self._fence = None


# On PostgreSQL, the transactions that could still fill a gap: those holding a lock
# that writing rows takes (INSERT takes ROW EXCLUSIVE before drawing a position from
# the column's default; eventsourcing's recorder also takes EXCLUSIVE). Prepared
# transactions have no pid, hence IS DISTINCT FROM.
PG_WRITERS_SQL = """
SELECT DISTINCT virtualtransaction FROM pg_locks
WHERE locktype = 'relation'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND relation = %s::regclass
  AND mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
               'AccessExclusiveLock')
  AND pid IS DISTINCT FROM pg_backend_pid()
"""

# Which of the given virtual transactions are still running (every running
# transaction holds a lock on its own virtual transaction id).
PG_RUNNING_SQL = """
SELECT DISTINCT virtualtransaction FROM pg_locks WHERE virtualtransaction = ANY(%s)
"""
