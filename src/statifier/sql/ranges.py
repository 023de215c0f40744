"""Statements that read one range of buckets: a worker's claim reads the rows of its
range, ``(start, end)`` with ``end`` excluded, or of every bucket (decision 0121).

A table that is claimed by range makes each such statement twice, with
:func:`by_range`: once for every bucket, without a bucket condition, and once for a
part, with :data:`IN_RANGE`. One statement with the condition always there would do,
but the driver prepares it, and the prepared statement's generic plan takes the whole
range for a narrow one: it reads the bucket index for every row and sorts, where the
due-time index serves the whole range (``bench/timers.py`` lost a quarter of its rate).

>>> reads = by_range(lambda within: f"SELECT 1{where(within)}")
>>> reads.of((0, 1024))
('SELECT 1', {})
>>> reads.of((0, 512))
('SELECT 1 WHERE bucket >= :start AND bucket < :end', {'start': 0, 'end': 512})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from statifier.buckets import ALL_BUCKETS

__all__ = ["IN_RANGE", "ByRange", "also", "by_range", "where"]


def _in_range(column: str) -> str:
    return f"{column} >= :start AND {column} < :end"


IN_RANGE: Final = _in_range("bucket")
"""The condition of a part of the buckets, on a table's ``bucket`` column."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ByRange(Generic[T]):
    """What reads every bucket (``whole``) and what reads a part (``part``: statements
    with :data:`IN_RANGE`, bound with ``start`` and ``end``)."""

    whole: T
    part: T

    def of(self, buckets: tuple[int, int]) -> tuple[T, dict[str, int]]:
        """What reads ``buckets``, and the parameters it takes for them."""
        if buckets == ALL_BUCKETS:
            return self.whole, {}
        start, end = buckets
        return self.part, {"start": start, "end": end}


def by_range(make: Callable[[str], T], *, on: str | None = None) -> ByRange[T]:
    """``make("")`` for every bucket and ``make(IN_RANGE)`` for a part: ``make`` adds
    the condition it is given (when not empty) to what its statements select. ``on``:
    the alias of the table whose ``bucket`` the condition reads, where a statement
    reads other tables that have a ``bucket`` too.

    >>> by_range(lambda within: within, on="a").part
    'a.bucket >= :start AND a.bucket < :end'
    """
    return ByRange(make(""), make(IN_RANGE if on is None else _in_range(f"{on}.bucket")))


def also(within: str) -> str:
    """``within`` as a further condition (``" AND ..."``), or nothing when empty."""
    return f" AND {within}" if within else ""


def where(within: str) -> str:
    """``within`` as a ``WHERE`` clause, or nothing when empty."""
    return f" WHERE {within}" if within else ""
