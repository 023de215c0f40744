"""The in-process copy of a projection's stream cursors that deduplication reads.

The target holds the authoritative cursors; this cache only ever moves forward, and
only after a commit, so a cached cursor is never ahead of the stored one. A preload
stops at a cap; when it did, a stream missing from the cache is read from the target
on first use, otherwise a missing stream has no cursor.

>>> cache = PositionCache({"a": 5}, complete=True)
>>> cache.advance("a", 3); cache.get("a"), cache.knows("b"), cache.get("b")
(5, True, None)
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PRELOAD_LIMIT", "PositionCache"]

PRELOAD_LIMIT = 10_000
"""Cursors loaded when a pipeline starts; streams beyond it are read lazily."""


class PositionCache:
    """Stream cursors of one projection, as far as this process has seen them commit.

    ``complete`` says the preload held every cursor, so a stream not in the cache has
    none. Otherwise :meth:`knows` is false for such a stream and the caller reads the
    target, then :meth:`advance` records what it read.
    """

    __slots__ = ("_complete", "_positions")

    def __init__(self, positions: Mapping[str, int], *, complete: bool) -> None:
        self._positions = dict(positions)
        self._complete = complete

    def knows(self, stream_id: str) -> bool:
        """Whether :meth:`get` knows ``stream_id``'s position without asking the target."""
        return self._complete or stream_id in self._positions

    def get(self, stream_id: str) -> int | None:
        """The cached cursor of ``stream_id``, or ``None``."""
        position = self._positions.get(stream_id)
        return None if position is None or position < 0 else position

    def advance(self, stream_id: str, position: int | None) -> None:
        """Raise the cursor of ``stream_id`` to ``position``; never lowers it.

        ``None`` records that the stream has no cursor yet (after a lazy read).
        """
        current = self._positions.get(stream_id)
        if position is None:
            # Remembered as "no cursor" (-1, below every position) so the target is
            # asked once per stream.
            self._positions.setdefault(stream_id, -1)
            return
        if current is None or position > current:
            self._positions[stream_id] = position
