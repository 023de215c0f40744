"""A projection's lifecycle: which state it is in, and the tasks that make it true.

States and moves (every other command in a state raises :class:`InvalidState`, which
carries the state; pausing a paused projection is an error, not a no-op)::

    initializing --pipeline subscribed--> running (or the state a lost pipeline was in)
    running  --pause-->  paused  --resume-->  running
    running  --stop-->   draining --> stopped
    paused   --stop-->   stopped
    halted   --stop-->   stopped
    initializing --stop--> stopped
    any but halted/stopped --failure no replay fixes--> halted
    running/paused --pipeline crashed--> initializing --> running/paused
    running/paused/initializing --crashed once too often--> halted

A pipeline that crashes (its source or target raised, its source factory raised, its
reader was fenced out) is started again after a delay that grows while crashes come
without progress, unless it was already started again ``max_restarts`` times within
the last ``restart_window`` seconds: then the projection halts, with the last crash
as its reason (``scriba.projection.crashed`` reports every crash,
``scriba.projection.restarted`` every restart).

A coordinator owns three kinds of asyncio task, all named after the projection: the
supervisor (runs pipelines, starts a new one after a crash), the pipeline's own tasks
(a reader, one per partition), and the lag ticker. :meth:`Coordinator.task_names` lists
those still running; after :meth:`Coordinator.stop` there are none.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from datetime import UTC, datetime
from typing import Final

from scriba.errors import InvalidState, StartFailed
from scriba.pipeline import Circuit, Pipeline
from scriba.projection import Projection, Settings, made_source
from scriba.target import FailureKind, Target
from statifier import telemetry

__all__ = ["Coordinator", "Status"]

_log = logging.getLogger(__name__)
_RESTART_DELAYS: Final = (0.01, 0.1, 0.5, 1.0, 5.0)
"""Seconds before starting a pipeline again, by crashes in a row without progress."""


class Status(enum.Enum):
    """Where a projection is in its lifecycle."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    PAUSED = "paused"
    DRAINING = "draining"
    STOPPED = "stopped"
    HALTED = "halted"


class Coordinator:
    """Runs one projection and answers lifecycle commands.

    Not thread-safe; use it from one event loop. The position cache belongs to each
    pipeline (loaded from the target when its subscription first delivers), so a
    pipeline that replaces a crashed one, or one that took over from another process,
    deduplicates against what is actually committed.
    """

    def __init__(self, projection: type[Projection], settings: Settings, target: Target) -> None:
        self.projection = projection
        self.settings = settings
        self.target = target
        self.status = Status.INITIALIZING
        self.halt_reason: str | None = None
        self.restarts = 0
        """Pipelines started again after a crash, over this coordinator's life."""
        self._key = settings.key
        self._prefix = f"scriba:{self._key.name}:v{self._key.version}"
        self._circuit = Circuit()
        self._handler: Projection | None = None
        self._pipeline: Pipeline | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._run: asyncio.Task[None] | None = None
        self._lag_ticker: asyncio.Task[None] | None = None
        self._stop_requested = asyncio.Event()
        self._announced = False  # scriba.projection.started, once per start
        # The state a pipeline that crashed was lost from, to return to.
        self._ready = Status.RUNNING

    # -- commands --------------------------------------------------------------------

    async def start(self) -> None:
        """Open the target, start a pipeline and wait until it is subscribed.

        Raises:
            StartFailed: the target did not open or the source did not subscribe; the
                coordinator is then stopped and runs nothing.
        """
        if self.status is not Status.INITIALIZING or self._supervisor is not None:
            raise InvalidState(
                self.status, f"cannot start a projection that is {self.status.value}"
            )
        try:
            await self.target.open(self._key)
            self._handler = self.projection()
            pipeline, run = self._launch(paused=False)
            if not await self._until_ready(pipeline, run):
                await run  # raises what ended it
                raise StartFailed(f"the pipeline of {self._key.name!r} ended as it started")
        except Exception as exc:
            self.status = Status.STOPPED
            if isinstance(exc, StartFailed):
                raise
            raise StartFailed(f"projection {self._key.name!r} could not start: {exc}") from exc
        # The pipeline may have halted already, before this task ran again.
        if self.status is Status.INITIALIZING:
            self.status = Status.RUNNING
        self._announce_start()
        self._supervisor = asyncio.create_task(
            self._supervise(run), name=f"{self._prefix}:supervisor"
        )
        if self.settings.lag_interval > 0:
            self._lag_ticker = asyncio.create_task(self._tick_lag(), name=f"{self._prefix}:lag")

    def pause(self) -> None:
        """Stop reading the source; what was read is still handled and committed.

        Raises:
            InvalidState: the projection is not running.
        """
        self._require(Status.RUNNING, "pause")
        assert self._pipeline is not None
        self._pipeline.pause()
        self.status = Status.PAUSED
        self._emit("scriba.projection.paused")

    def resume(self) -> None:
        """Read the source again.

        Raises:
            InvalidState: the projection is not paused.
        """
        self._require(Status.PAUSED, "resume")
        assert self._pipeline is not None
        self._pipeline.resume()
        self.status = Status.RUNNING
        self._emit("scriba.projection.started", resumed=True, parallelism=self.settings.parallelism)

    async def stop(self) -> None:
        """Stop reading, let every partition commit what it has handled, end every task.

        From running it passes through draining; from paused, halted or initializing it
        goes straight to stopped.

        Raises:
            InvalidState: the projection is already stopped or draining.
        """
        if self.status in (Status.STOPPED, Status.DRAINING):
            raise InvalidState(self.status, f"cannot stop a projection that is {self.status.value}")
        from_state = self.status
        if self.status is Status.RUNNING:
            self.status = Status.DRAINING
        self._stop_requested.set()
        if self._pipeline is not None:
            self._pipeline.stop()
        if self._supervisor is not None:
            done, _ = await asyncio.wait((self._supervisor,), timeout=self.settings.drain_timeout)
            if not done:
                _log.warning(
                    "projection %s did not drain in %ss; cancelling what it was on",
                    self._prefix,
                    self.settings.drain_timeout,
                )
                self._supervisor.cancel()
                await asyncio.gather(self._supervisor, return_exceptions=True)
        if self._lag_ticker is not None:
            self._lag_ticker.cancel()
            await asyncio.gather(self._lag_ticker, return_exceptions=True)
        self.status = Status.STOPPED
        self._emit("scriba.projection.stopped", from_state=from_state.value)

    # -- what runs -------------------------------------------------------------------

    def task_names(self) -> tuple[str, ...]:
        """The names of this projection's asyncio tasks that are running now."""
        names = [
            task.get_name()
            for task in (self._supervisor, self._run, self._lag_ticker)
            if task is not None and not task.done()
        ]
        if self._pipeline is not None:
            names.extend(self._pipeline.task_names())
        return tuple(names)

    def progress(self) -> tuple[int | None, datetime | None, bool]:
        """``(prefix, occurred_at, caught_up)`` of the current (or last) pipeline: how
        far every event is accounted for, when that event occurred, and whether the
        pipeline has read everything its source had."""
        pipeline = self._pipeline
        if pipeline is None:
            return None, None, False
        ledger = pipeline.ledger
        return ledger.prefix, ledger.prefix_occurred_at, pipeline.caught_up

    def idle_reads(self) -> tuple[object, int]:
        """The current pipeline (an opaque token) and how many of its reads found
        nothing new with nothing in flight."""
        pipeline = self._pipeline
        return pipeline, pipeline.idle_reads if pipeline is not None else 0

    @property
    def standing_by(self) -> bool:
        """Whether the current pipeline's source waits for another process to release
        the projection (so this process reads nothing, and its lag is unknown)."""
        return self._pipeline is not None and self._pipeline.standing_by

    def lag_seconds(self) -> float | None:
        """Seconds since the watermark's event occurred (0 while caught up), or
        ``None`` before anything is accounted for and while standing by."""
        if self.standing_by:
            return None
        _, occurred_at, caught_up = self.progress()
        if caught_up:
            return 0.0
        if occurred_at is None:
            return None
        return max(0.0, (datetime.now(UTC) - occurred_at).total_seconds())

    async def lag_events(self) -> int | None:
        """How many positions the source holds beyond what is accounted for (0 while
        caught up), or ``None`` when unknown: unless running or paused, while standing
        by, or when the source cannot read its head."""
        pipeline = self._pipeline
        live = self.status in (Status.RUNNING, Status.PAUSED)
        if pipeline is None or not live or pipeline.standing_by:
            return None  # a source that is closed, or not reading, is not asked
        prefix, _, caught_up = self.progress()
        if caught_up:
            return 0
        head = await pipeline.head()
        if head is None or prefix is None:
            return None
        return max(0, head - prefix)

    # -- inside ----------------------------------------------------------------------

    def _launch(self, *, paused: bool) -> tuple[Pipeline, asyncio.Task[None]]:
        source = made_source(self.settings.source)
        assert self._handler is not None
        pipeline = Pipeline(
            self._handler,
            self.settings,
            source,
            self.target,
            circuit=self._circuit,
            on_halt=self._halted,
            paused=paused,
            task_prefix=self._prefix,
        )
        self._pipeline = pipeline
        run = asyncio.create_task(pipeline.run(), name=f"{self._prefix}:reader")
        self._run = run
        return pipeline, run

    async def _until_ready(self, pipeline: Pipeline, run: asyncio.Task[None]) -> bool:
        """Wait until ``pipeline`` subscribed (True) or its run ended first (False)."""
        ready = asyncio.create_task(pipeline.ready.wait())
        try:
            await asyncio.wait((ready, run), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        return pipeline.ready.is_set()

    async def _supervise(self, run: asyncio.Task[None]) -> None:
        """Await the pipeline; after a crash, start another into the state it left,
        or halt when it crashed once too often."""
        crashes = 0  # in a row without progress: what the delay grows by
        restarted_at: deque[float] = deque()  # monotonic times of the recent restarts
        pipeline: Pipeline | None = self._pipeline
        while True:
            try:
                await run
            except Exception as exc:  # noqa: BLE001 - a pipeline crash is handled here
                error: Exception = exc
            else:
                return
            if self._stop_requested.is_set() or self.status in (Status.HALTED, Status.STOPPED):
                # Not restarted, but not unsaid: what it had not stored is read again at
                # the next start.
                _log.warning(
                    "projection %s: the pipeline ended with an error while %s",
                    self._prefix,
                    "halted" if self.status is Status.HALTED else "stopping",
                    exc_info=error,
                )
                return
            _log.error("projection %s: pipeline crashed", self._prefix, exc_info=error)
            reason = f"{type(error).__name__}: {error}"
            self._emit(
                "scriba.projection.crashed",
                kind=type(error).__name__,
                reason=reason,
                restarts=self.restarts,
            )
            lost_from = self.status if self.status is not Status.INITIALIZING else self._ready
            self._ready = lost_from
            now = time.monotonic()
            window = self.settings.restart_window
            while restarted_at and now - restarted_at[0] > window:
                restarted_at.popleft()
            if len(restarted_at) >= self.settings.max_restarts:
                crashed = len(restarted_at) + 1
                self._halt(
                    "restarts",
                    f"the pipeline crashed {crashed} time{'s' if crashed > 1 else ''} within "
                    f"{window:g}s, {crashed - 1} restart(s) allowed; the last crash: {reason}",
                )
                return
            self.status = Status.INITIALIZING
            crashes = 0 if pipeline is not None and pipeline.progressed else crashes + 1
            delay = _RESTART_DELAYS[min(crashes, len(_RESTART_DELAYS) - 1)]
            try:
                async with asyncio.timeout(delay):
                    await self._stop_requested.wait()
                return
            except TimeoutError:
                pass
            self.restarts += 1
            restarted_at.append(time.monotonic())
            telemetry.report(
                "scriba.projection.restarted",
                {"delay": delay},
                {
                    "name": self._key.name,
                    "version": self._key.version,
                    "restarts": self.restarts,
                    "state": lost_from.value,
                },
            )
            try:
                pipeline, run = self._launch(paused=lost_from is Status.PAUSED)
            except Exception as exc:  # noqa: BLE001 - a source factory that raises crashed
                pipeline, run = None, asyncio.create_task(_raise(exc))
                continue
            if await self._until_ready(pipeline, run) and self.status is Status.INITIALIZING:
                self.status = lost_from

    async def _tick_lag(self) -> None:
        # A timer of its own: event flow cannot postpone it.
        interval = self.settings.lag_interval
        while True:
            await asyncio.sleep(interval)
            lag = self.lag_seconds()
            prefix, _, _ = self.progress()
            if lag is not None and prefix is not None:
                telemetry.report(
                    "scriba.projection.lag",
                    {"lag_ms": lag * 1000, "watermark": prefix},
                    {"name": self._key.name, "version": self._key.version},
                )

    def _halted(self, kind: FailureKind, reason: str) -> None:
        self._halt(kind.value, reason)

    def _halt(self, kind: str, reason: str) -> None:
        if self.status in (Status.HALTED, Status.STOPPED):
            return
        self.halt_reason = reason
        _log.error("projection %s v%s halted: %s", self._key.name, self._key.version, reason)
        if self.status is not Status.DRAINING:
            self.status = Status.HALTED
        self._announce_start()  # so that observers always see started before halted
        self._emit("scriba.projection.halted", kind=kind, reason=reason)

    def _announce_start(self) -> None:
        if not self._announced:
            self._announced = True
            self._emit(
                "scriba.projection.started", resumed=False, parallelism=self.settings.parallelism
            )

    def _require(self, status: Status, command: str) -> None:
        if self.status is not status:
            raise InvalidState(
                self.status, f"cannot {command} a projection that is {self.status.value}"
            )

    def _emit(self, name: str, **metadata: object) -> None:
        telemetry.report(
            name, {}, {"name": self._key.name, "version": self._key.version, **metadata}
        )


async def _raise(error: Exception) -> None:
    """A run that failed before it began (its source could not be made)."""
    raise error
