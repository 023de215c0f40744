"""Repeated errors logged once per interval, with a count of the ones not logged.

Two ways, one rule (one line a kind and interval, and the count of the rest):
:class:`Repeats` appends the count to the kind's next line and serves any thread (a
client library's callbacks); :class:`IntervalTally` writes the count when the interval
ends, on the event loop, for a burst whose size must be told even when nothing follows.

A part that fails the same way again and again (a broker that does not answer, a
database that is down, a worker restarted after each failure) would otherwise write a
line per attempt. :class:`Repeats` keys each kind of line (an error code, a part's
name): the first line of a key is logged at once; the same key again within
``interval`` seconds is only counted; the first one after the interval is logged with
the count of those skipped, and starts the next interval. So one cause writes at
most one line per interval, and the operator still learns how often it happened.

A leaf: it imports nothing of the project, and any layer may use it.

>>> import logging, sys
>>> log = logging.getLogger("demo.repeats")
>>> log.addHandler(logging.StreamHandler(sys.stdout)); log.propagate = False
>>> now = [0.0]
>>> repeats = Repeats(interval=60.0, clock=lambda: now[0])
>>> for second in (0.0, 1.0, 2.0, 61.0):
...     now[0] = second
...     _ = repeats.log(log, logging.WARNING, "refused", "the broker refused: %s", "timeout")
the broker refused: timeout
the broker refused: timeout (2 more like it in the last 61 s)
>>> repeats.forget("refused")
0
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_INTERVAL", "TALLY_INTERVAL", "IntervalTally", "Repeats"]

DEFAULT_INTERVAL: Final = 30.0
"""Seconds between two lines of one key, by default."""
TALLY_INTERVAL: Final = 10.0
"""Seconds between two lines of one kind of an :class:`IntervalTally`, by default."""
_KEYS: Final = 1024
"""Keys remembered at most; the oldest is forgotten first (its count with it)."""


@dataclass(slots=True)
class _Seen:
    logged_at: float
    skipped: int = 0


class Repeats:
    """Which occurrences of repeated lines to log (see the module docstring).

    Safe to share between threads (a client library's callback thread and the event
    loop's).

    Args:
        interval: seconds between two lines of one key.
        clock: monotonic seconds (``time.monotonic``), for tests.

    Raises:
        ValueError: ``interval`` is not positive.
    """

    def __init__(
        self, interval: float = DEFAULT_INTERVAL, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval is a positive number of seconds, not {interval!r}")
        self.interval = interval
        self.clock = clock
        self._seen: dict[Hashable, _Seen] = {}
        self._lock = threading.Lock()

    def note(self, key: Hashable) -> int | None:
        """Count one occurrence of ``key``: ``None`` when it is to be skipped, else
        the number skipped since the key's last line (log it now)."""
        noted = self._note(key)
        return None if noted is None else noted[0]

    def forget(self, key: Hashable) -> int:
        """Forget ``key`` (its cause has cleared: its next occurrence is logged at
        once); returns how many of it were skipped since its last line."""
        with self._lock:
            seen = self._seen.pop(key, None)
        return 0 if seen is None else seen.skipped

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: Hashable,
        message: str,
        *args: object,
        extra: Mapping[str, object] | None = None,
        exc_info: BaseException | bool | None = None,
    ) -> bool:
        """Log ``message % args`` on ``logger`` at ``level`` if :meth:`note` says so,
        with ``" (N more like it in the last S s)"`` after it when some were skipped
        (S: the seconds since the key's last line); the record's ``repeated`` field is
        that N. Returns whether it logged."""
        noted = self._note(key)
        if noted is None:
            return False
        skipped, span = noted
        if skipped:
            message = f"{message} (%d more like it in the last %.0f s)"
            args = (*args, skipped, span)
        fields = {**(extra or {}), "repeated": skipped}
        logger.log(level, message, *args, extra=fields, exc_info=exc_info)
        return True

    def _note(self, key: Hashable) -> tuple[int, float] | None:
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen.logged_at < self.interval:
                seen.skipped += 1
                return None
            self._seen.pop(key, None)
            self._seen[key] = _Seen(now)
            while len(self._seen) > _KEYS:
                del self._seen[next(iter(self._seen))]
        if seen is None:
            return 0, 0.0
        return seen.skipped, now - seen.logged_at


@dataclass
class _Window:
    count: int
    later: Callable[[int], None]


class IntervalTally:
    """Bounded lines whose count is told when the interval ends: the first occurrence
    of a kind is written at once, the ones that follow are counted, and when the
    interval ends one line says how many came (a new interval opens if any did). A
    kind quiet for a whole interval starts over.

    For a burst whose size must be told even when nothing follows it (a client's
    refusals, a listener's shed connections); it runs on the event loop that calls it
    (its timers are the loop's), where :class:`Repeats` serves any thread.

    >>> import asyncio
    >>> async def main():
    ...     tally = IntervalTally(interval=0.05)
    ...     for _ in range(3):
    ...         tally.note("413", lambda: print("refused: 413"), lambda n: print(f"{n} more"))
    ...     await asyncio.sleep(0.2)
    >>> asyncio.run(main())
    refused: 413
    2 more

    Args:
        interval: the fewest seconds between two lines of one kind
            (:data:`TALLY_INTERVAL` when not given).
    """

    interval: float = TALLY_INTERVAL

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
