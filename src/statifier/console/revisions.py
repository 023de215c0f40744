"""Trying a revision of a chart: shadow replays run in the background for the
console's "try a revision" page.

:class:`Revisions` runs :func:`statifier.shadow.shadow_replay_stores` for an operator,
over the console's database or each of its stores, and keeps what it found for a
while. A replay is pure work on read-only connections
(:func:`statifier.shadow.open_read_only`: the database itself refuses a write), so it
runs in a thread of its own with its own event loop: a long log replayed does not hold
the console's pages up. The console's side of a job is an asyncio task, which the
console owns and :meth:`Revisions.close` stops.

Bounds: at most ``max_running`` jobs run at once (one more is refused,
:class:`TooManyJobs`); one job replays at most :data:`MAX_EXECUTIONS` executions; a
finished job is kept ``ttl`` seconds, and at most ``max_kept`` jobs are kept in all
(the oldest finished ones go first).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from statifier.chart import Machine
from statifier.expr import Function
from statifier.persistence import PLAIN, BlobCodec
from statifier.shadow import (
    Selection,
    ShadowResult,
    ShadowSummary,
    shadow_replay_stores,
)
from statifier.sql import TableOptions

__all__ = [
    "MAX_EXECUTIONS",
    "Job",
    "JobState",
    "Revisions",
    "TooManyJobs",
]

MAX_EXECUTIONS: Final = 5_000
"""The most executions one job replays (the oldest selected first)."""

_STOPPED: Final = "the console stopped before the replay finished"

_log = logging.getLogger("statifier.console")


class TooManyJobs(Exception):  # noqa: N818 - names the refusal
    """As many jobs as allowed are running: try again once one has finished."""


class _Stopped(Exception):  # noqa: N818 - names why the replay ended
    """Raised from the progress callback to end a replay the console stops."""


class JobState(enum.Enum):
    """Where a job is: ``running``, ``done`` (its summary is there), ``failed`` (its
    error is), or ``stopped`` (the console stopped before it finished)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class Job:
    """One shadow replay the console runs; its fields change while it runs (read them
    from the console's event loop).

    Attributes:
        id: a random id, the job page's address.
        operator: who started it.
        revision: the chart tried.
        selection: which executions.
        started: when it started (UTC).
        state: where it is (:class:`JobState`).
        done, total: executions replayed so far and in all (``total`` is ``None``
            until the first execution is replayed).
        summary: what it found, once ``DONE``.
        error: why it failed or stopped, once ``FAILED`` or ``STOPPED``.
        finished_at: when it ended, on the jobs' monotonic clock (its expiry counts
            from there), ``None`` while it runs.
    """

    id: str
    operator: str
    revision: Machine = field(repr=False)
    selection: Selection
    started: datetime
    state: JobState = JobState.RUNNING
    done: int = 0
    total: int | None = None
    summary: ShadowSummary | None = field(default=None, repr=False)
    error: str | None = None
    finished_at: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def advance(self, done: int, total: int, result: ShadowResult) -> None:
        """The replay's progress callback (called in the replay's thread): counts, and
        ends the replay once the job is stopped."""
        if self._stop.is_set():
            raise _Stopped
        self.done, self.total = done, total

    def stop(self) -> None:
        """Have the replay end after the execution it is replaying."""
        self._stop.set()

    def result(self, execution_id: str) -> ShadowResult | None:
        """The result of ``execution_id`` in the summary, if there is one."""
        if self.summary is None:
            return None
        return next((r for r in self.summary.results if r.execution_id == execution_id), None)


@dataclass(frozen=True, slots=True)
class _Source:
    """Where and how the replays read: the database URLs (opened read-only; several:
    the stores executions are spread over), their tables' options, the blob codec and
    the host's functions the stored charts compile with."""

    urls: tuple[str, ...] = field(repr=False)  # may hold passwords: kept out of any repr
    tables: tuple[TableOptions, ...]
    codec: BlobCodec = PLAIN
    functions: Mapping[str, Function] = field(default_factory=dict)


class Revisions:
    """The console's shadow replay jobs.

    Args:
        url: the database the console shows (read through a read-only connection of
            each job's own), or the URLs of the stores it shows (decision 0119: a job
            selects over all of them, :func:`~statifier.shadow.shadow_replay_stores`).
        tables: its tables' options, or each store's, in the order of ``url``.
        codec, functions: the storage's blob codec and the host's expression functions.
        max_running: the most jobs running at once.
        max_kept: the most jobs kept, running or finished.
        ttl: seconds a finished job is kept.
        clock: monotonic seconds (for the tests).

    Raises:
        ValueError: a bound that is not positive.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        tables: TableOptions | Sequence[TableOptions],
        *,
        codec: BlobCodec = PLAIN,
        functions: Mapping[str, Function] | None = None,
        max_running: int = 2,
        max_kept: int = 16,
        ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_running < 1 or max_kept < max_running or not ttl > 0:
            raise ValueError("max_running and ttl are positive, max_kept at least max_running")
        urls = (url,) if isinstance(url, str) else tuple(url)
        options = (tables,) if isinstance(tables, TableOptions) else tuple(tables)
        if not urls or len(options) != len(urls):
            raise ValueError(f"{len(urls)} database URLs with {len(options)} tables' options")
        self._source = _Source(urls, options, codec, dict(functions or {}))
        self.max_running = max_running
        self.max_kept = max_kept
        self.ttl = ttl
        self._clock = clock
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def running(self) -> int:
        """How many jobs are running."""
        return len(self._tasks)

    def start(self, operator: str, revision: Machine, selection: Selection) -> Job:
        """Start replaying ``selection`` on ``revision`` (at most
        :data:`MAX_EXECUTIONS` executions: a larger or absent ``limit`` is lowered to
        it) and answer the job at once.

        Raises:
            TooManyJobs: ``max_running`` jobs are running.
        """
        self._expire()
        if len(self._tasks) >= self.max_running:
            raise TooManyJobs(
                f"{len(self._tasks)} replays are running, the most at once: "
                "try again once one has finished"
            )
        limit = selection.limit
        if limit is None or limit > MAX_EXECUTIONS:
            selection = replace(selection, limit=MAX_EXECUTIONS)
        job = Job(secrets.token_urlsafe(12), operator, revision, selection, datetime.now(UTC))
        self._jobs[job.id] = job
        self._tasks[job.id] = asyncio.create_task(self._run(job), name=f"console-revision-{job.id}")
        self._expire()
        _log.info(
            "console: %s started a shadow replay of revision %s (%s)",
            operator,
            revision.identity.content_hash[:16],
            revision.identity.name,
        )
        return job

    def get(self, job_id: str) -> Job | None:
        """The job ``job_id``, or ``None`` (unknown, or expired)."""
        self._expire()
        return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        """The jobs kept, the newest first."""
        self._expire()
        return list(reversed(self._jobs.values()))

    async def wait(self, job: Job) -> None:
        """Return once ``job`` has ended (at once if it has)."""
        task = self._tasks.get(job.id)
        if task is not None:
            await asyncio.wait({task})

    def close(self) -> None:
        """Stop every running job (the console is stopping): each ends after the
        execution it is replaying."""
        for job_id in self._tasks:
            self._jobs[job_id].stop()
        for task in list(self._tasks.values()):
            task.cancel()

    async def _run(self, job: Job) -> None:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[ShadowSummary] = loop.create_future()
        source = self._source

        def settle(summary: ShadowSummary | None, error: BaseException | None) -> None:
            if finished.done():
                return
            if error is not None:
                finished.set_exception(error)
            else:
                assert summary is not None
                finished.set_result(summary)

        def work() -> None:
            summary, error = None, None
            try:
                summary = asyncio.run(_replayed(source, job))
            except BaseException as raised:  # noqa: BLE001 - handed to the job's task
                error = raised
            try:
                loop.call_soon_threadsafe(settle, summary, error)
            except RuntimeError:  # the console's loop closed (it stopped): nobody waits
                if error is not None and not isinstance(error, _Stopped):
                    _log.error(
                        "console: the shadow replay %s failed after the console stopped: %s: %s",
                        job.id,
                        type(error).__name__,
                        error,
                    )

        # A daemon thread: a replay still running never holds the process's exit up.
        thread = threading.Thread(target=work, name=f"console-revision-{job.id}", daemon=True)
        try:
            thread.start()
            job.summary = await finished
            job.done = job.total = len(job.summary.results)
            job.state = JobState.DONE
        except asyncio.CancelledError:  # the console is stopping
            job.stop()
            job.state = JobState.STOPPED
            job.error = _STOPPED
            raise
        except _Stopped:
            job.state = JobState.STOPPED
            job.error = _STOPPED
        except Exception as error:  # noqa: BLE001 - the job page says what failed
            _log.exception("console: the shadow replay %s failed", job.id)
            job.state = JobState.FAILED
            job.error = f"{type(error).__name__}: {' '.join(str(error).split())}"[:1000]
        finally:
            job.finished_at = self._clock()
            self._tasks.pop(job.id, None)

    def _expire(self) -> None:
        """Forget finished jobs older than ``ttl``, then the oldest finished ones
        beyond ``max_kept``."""
        now = self._clock()
        for job_id, job in list(self._jobs.items()):
            if job.finished_at is not None and now - job.finished_at >= self.ttl:
                del self._jobs[job_id]
        finished = [job_id for job_id, job in self._jobs.items() if job.finished_at is not None]
        for job_id in finished[: max(0, len(self._jobs) - self.max_kept)]:
            del self._jobs[job_id]


async def _replayed(source: _Source, job: Job) -> ShadowSummary:
    """``job``'s replay over ``source``'s database or stores (one store is one
    database: the same selection and results as :func:`~statifier.shadow.shadow_replay`
    makes of its URL)."""
    return await shadow_replay_stores(
        source.urls,
        job.revision,
        job.selection,
        codec=source.codec,
        functions=source.functions,
        tables=source.tables,
        progress=job.advance,
    )
