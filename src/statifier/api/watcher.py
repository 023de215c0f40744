"""One watcher for every caller waiting on an execution.

A caller waits for an execution to reach a state (or to end), bounded by a timeout.
However many wait, one task reads the database for all of them: one query reads the
status, last change and newest input of every execution waited on, and only an
execution that changed since the last look is read whole, once for all its waiters.
It reads every ``poll`` seconds, and sooner when a call waits on an execution not read
yet or the API's own send has just changed one (:meth:`Watcher.nudge`), but never
twice within a tenth of ``poll``: the reads are bounded by time, not by the waiters.
The task runs while someone waits and stops when no one does. Each read is reported
as the telemetry event ``statifier.api.watch`` (how many executions it read, how many
calls waited, how many changed).

Nothing is lost to a failed read: it is logged (warning), counted under the telemetry
event ``statifier.api.watch_failed``, and the next tick reads again; a waiter whose
timeout passes meanwhile is answered with what was last seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from statifier import telemetry
from statifier.api.views import Snapshot, reached
from statifier.repeats import Repeats

__all__ = ["Mark", "Watcher"]

_log = logging.getLogger("statifier.api")

Mark = tuple[str, datetime | None, int | None]
"""What says an execution changed: its stored status, ``updated_at`` and newest
input-log entry."""

ReadMarks = Callable[[Sequence[str]], Awaitable[Mapping[str, Mark]]]
"""One read of the marks of many executions (those that exist)."""
Load = Callable[[str], Awaitable[Snapshot | None]]
"""One execution read whole (``None``: there is none)."""


@dataclass(eq=False, slots=True)
class _Waiter:
    state: str | None
    done: asyncio.Future[Snapshot | None]
    last: Snapshot | None = None


@dataclass(slots=True)
class _Watched:
    waiters: list[_Waiter] = field(default_factory=list)
    mark: Mark | None = None
    snapshot: Snapshot | None = None


class Watcher:
    """Answers :meth:`wait` calls from one reading task.

    Args:
        read_marks: reads the marks of the executions waited on, in one query.
        load: reads one changed execution whole.
        poll: the seconds between two reads.
    """

    def __init__(self, read_marks: ReadMarks, load: Load, *, poll: float) -> None:
        if not poll > 0:
            raise ValueError(f"poll is positive seconds, not {poll!r}")
        self._read_marks = read_marks
        self._load = load
        self._poll = poll
        self._watched: dict[str, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._failures = Repeats()  # a database that is down fails every read alike

    @property
    def waiting(self) -> int:
        """How many calls are waiting now."""
        return sum(len(w.waiters) for w in self._watched.values())

    async def wait(self, execution_id: str, state: str | None, *, within: float) -> Snapshot | None:
        """Wait until ``execution_id`` has ``state`` active (``None``: has ended), or
        has ended without reaching it, or ``within`` seconds pass.

        Returns:
            the snapshot that reached it (or ended), or once ``within`` passed the
            last one seen (``None`` when the execution was never seen: there is none,
            or no read succeeded).
            Which of the two it is, :func:`~statifier.api.views.reached` tells.

        Raises:
            RuntimeError: the watcher is closed.
        """
        if self._closed:
            raise RuntimeError("the watcher is closed")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(state, loop.create_future())
        watched = self._watched.setdefault(execution_id, _Watched())
        watched.waiters.append(waiter)
        if watched.snapshot is not None:
            self._check(watched.snapshot, waiter)
        else:
            self._wake.set()  # a new execution to read: soon, for every new waiter at once
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="statifier.api.watcher")
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.done), within)
        except TimeoutError:
            return waiter.last
        finally:
            watched.waiters.remove(waiter)
            if not watched.waiters and self._watched.get(execution_id) is watched:
                del self._watched[execution_id]

    async def close(self) -> None:
        """Stop the reading task; every waiter is answered with what it last saw."""
        self._closed = True
        for watched in self._watched.values():
            for waiter in watched.waiters:
                if not waiter.done.done():
                    waiter.done.set_result(waiter.last)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def nudge(self) -> None:
        """Read soon, not at the end of the interval: a call has just changed an
        execution (the API's own sends nudge it after their commit)."""
        if self._watched:
            self._wake.set()

    async def _run(self) -> None:
        gap = self._poll / 10
        while self._watched and not self._closed:
            self._wake.clear()
            try:
                await self._tick()
            except Exception as error:  # noqa: BLE001 - the next tick reads again
                said = type(error).__name__
                self._failures.log(
                    _log,
                    logging.WARNING,
                    said,
                    "api: reading the executions waited on failed: %s: %s",
                    said,
                    error,
                )
                telemetry.report(
                    "statifier.api.watch_failed", {"count": 1}, {"error": type(error).__name__}
                )
            # A tenth of the interval at least between two reads, however many calls
            # come and nudge: the reads stay bounded by time, never by the waiters.
            await asyncio.sleep(gap)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll - gap)

    async def _tick(self) -> None:
        started = time.perf_counter()
        ids = list(self._watched)
        waiters = self.waiting
        marks = await self._read_marks(ids)
        changed = 0
        for execution_id in ids:
            watched = self._watched.get(execution_id)
            mark = marks.get(execution_id)
            if watched is None or mark is None or mark == watched.mark:
                continue
            snapshot = await self._load(execution_id)
            if snapshot is None:
                continue
            changed += 1
            watched.mark, watched.snapshot = mark, snapshot
            for waiter in list(watched.waiters):
                self._check(snapshot, waiter)
        telemetry.report(
            "statifier.api.watch",
            {
                "duration": time.perf_counter() - started,
                "executions": len(ids),
                "waiters": waiters,
                "changed": changed,
            },
            {},
        )

    @staticmethod
    def _check(snapshot: Snapshot, waiter: _Waiter) -> None:
        waiter.last = snapshot
        # An execution that ended reaches no other state: its waiters are answered.
        over = reached(snapshot, waiter.state) or snapshot.record.status.terminal
        if over and not waiter.done.done():
            waiter.done.set_result(snapshot)
