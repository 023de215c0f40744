"""One run of a projection: read the source, handle events per partition, commit batches.

A :class:`Pipeline` is what a coordinator starts, and starts again after a crash. It
is one asyncio task that reads (holding demand while paused) and two per partition:
a handler and a batcher. Events of a stream always land in the same partition, whose
handler task takes them one at a time, in source order; its batcher commits the
outcomes, in the same order, in batches through the target, each batch with its
cursor advances and dead letters in the same call. A batch that times out commits
even while the handler is busy with the next event or sleeping before a retry.

Per event: deduplicate against the stream's cursor, call the handler under the retry
policy (a retry sleeps in its own partition only), then batch the outcome: a write,
a skip, or a dead letter. Per batch, answer a failed commit by its kind (transient:
replay after a backoff; integrity: isolate event by event; structural: halt). Per
subscription, keep the gapless prefix of what is done, acknowledge it to the source,
and store it as the watermark (about once a second while busy, at once when idle).

Fencing: when the source first delivers (so it holds the projection's lock), the
pipeline claims the projection from the target, which returns a new generation; it
then has the source confirm the lock is still held, and only then loads the cursors it
deduplicates by. Every commit and watermark carries that generation, and the target
refuses it (``FENCED``) once another reader has claimed since: the pipeline then ends
as a crash, and its replacement stands by or claims again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scriba.accounting import Ledger
from scriba.event import Event, Meta
from scriba.operations import (
    Delete,
    Error,
    Execute,
    Insert,
    Multi,
    Operation,
    Skip,
    Update,
    not_a_result,
)
from scriba.partition import partition_of
from scriba.positions import PRELOAD_LIMIT, PositionCache
from scriba.projection import Projection, Settings
from scriba.source import Source
from scriba.target import ApplyFailed, DeadLetter, FailureKind, Target
from statifier import telemetry
from statifier.callbacks import awaited
from statifier.repeats import Repeats

__all__ = ["WATERMARK_INTERVAL", "Circuit", "Pipeline"]

WATERMARK_INTERVAL: Final = 1.0
"""Seconds between watermark writes while events are in flight."""

_log = logging.getLogger(__name__)
_emit = telemetry.report
_RESULT_NAMES: Final[Mapping[type, str]] = {
    Insert: "insert",
    Update: "update",
    Delete: "delete",
    Execute: "execute",
    Multi: "multi",
    Skip: "skip",
    Error: "error",
}


@dataclass(slots=True)
class Circuit:
    """Failure state of one projection that outlives its pipelines.

    ``lone_integrity_failures`` counts batches in a row whose one write failed on
    integrity grounds with nothing committing since; at ``halt_after`` the projection
    halts instead of dead-lettering once more.
    """

    lone_integrity_failures: int = 0
    halt_after: int = 3


@dataclass(slots=True)
class _Outcome:
    """What became of one event in a partition.

    A write (``operation``), a dead letter, a skip by the handler (neither), or a
    duplicate (``dedup``: already committed, so nothing to write and no cursor to move).
    """

    event: Event
    operation: Operation | None = None
    dead_letter: DeadLetter | None = None
    dedup: bool = False


class _Partition:
    """One partition: events waiting for its handler task, and outcomes waiting for
    its batcher task (so a batch times out and commits even while the handler is busy
    with the next event, or sleeping before a retry)."""

    __slots__ = ("events", "events_added", "handling", "index", "outcomes", "outcomes_added")

    def __init__(self, index: int) -> None:
        self.index = index
        self.events: deque[Event] = deque()
        self.events_added = asyncio.Event()
        self.outcomes: deque[_Outcome] = deque()
        self.outcomes_added = asyncio.Event()
        self.handling = True


class Pipeline:
    """One subscription's worth of work for one projection.

    ``run()`` subscribes, reads and handles until :meth:`stop` (or a halt), then lets
    every partition commit what it has handled, acknowledges, flushes the watermark
    and closes the source. An exception out of ``run()`` is a crash: the coordinator
    starts a new pipeline. :attr:`ready` is set once the source is subscribed.
    """

    def __init__(
        self,
        projection: Projection,
        settings: Settings,
        source: Source,
        target: Target,
        *,
        circuit: Circuit,
        on_halt: Callable[[FailureKind, str], None],
        paused: bool = False,
        task_prefix: str = "scriba",
    ) -> None:
        self._projection = projection
        self._settings = settings
        self._key = settings.key
        self._source = source
        self._target = target
        self._circuit = circuit
        self._on_halt = on_halt
        self._task_prefix = task_prefix
        self._identity = {"name": settings.key.name, "version": settings.key.version}
        self._stopping = asyncio.Event()
        self._resumed = asyncio.Event()
        if not paused:
            self._resumed.set()
        # Wakes the reader: a batch finished, a resume, a stop.
        self._signal = asyncio.Event()
        self._partitions = [_Partition(index) for index in range(settings.parallelism)]
        self._tasks: list[asyncio.Task[None]] = []
        self._cache: PositionCache | None = None
        self._fence: int | None = None
        self._failure: BaseException | None = None
        self._last_failure: ApplyFailed | None = None
        self._repeats = Repeats()  # a database that is down fails every commit alike
        self._acknowledged = 0
        self._saved = 0
        self._saved_at = 0.0
        self.ready = asyncio.Event()
        """Set once the source is subscribed and the partitions run."""
        self.ledger = Ledger(after=0)
        """What was delivered and what of it is done (replaced at subscribe)."""
        self.caught_up = False
        """The last read found nothing new and nothing is in flight."""
        self.idle_reads = 0
        """Reads that found nothing new with nothing in flight, in this run."""
        self.progressed = False
        """Some event was accounted for in this run."""
        self.halted = False

    # -- control, from the coordinator ---------------------------------------------

    def pause(self) -> None:
        """Stop reading; what was read still gets handled and committed."""
        # Unread events may arrive meanwhile: a paused pipeline is not caught up.
        self.caught_up = False
        self._resumed.clear()

    def resume(self) -> None:
        """Read again."""
        self.caught_up = False
        self._resumed.set()
        self._signal.set()

    def stop(self) -> None:
        """Stop reading, finish the event each partition is on, commit, then end."""
        self._stopping.set()
        self._signal.set()
        for partition in self._partitions:
            partition.events_added.set()

    @property
    def standing_by(self) -> bool:
        """Whether the source waits for another process to release the projection."""
        return self._source.standing_by

    async def head(self) -> int | None:
        """The source's highest position now, or ``None`` when it cannot tell."""
        return await self._source.head()

    def task_names(self) -> list[str]:
        """Names of this pipeline's partition tasks that are still running."""
        return [task.get_name() for task in self._tasks if not task.done()]

    # -- the run ---------------------------------------------------------------------

    async def run(self) -> None:
        """Subscribe, read and handle until stopped or halted; raise on a crash."""
        try:
            after = self._settings.start_from
            stored = await self._target.watermark(self._key)
            if after is None:
                after = stored.position if stored is not None else 0
            self.ledger = Ledger(after=after)
            if stored is not None and stored.position == after:
                self.ledger.prefix_occurred_at = stored.occurred_at
            self._acknowledged = self._saved = after
            await self._source.subscribe(self._key, after)
            for partition in self._partitions:
                prefix = f"{self._task_prefix}:partition-{partition.index}"
                for work, name in (
                    (self._handle_events(partition), prefix),
                    (self._batch(partition), f"{prefix}-batcher"),
                ):
                    task = asyncio.create_task(work, name=name)
                    task.add_done_callback(self._partition_ended)
                    self._tasks.append(task)
            self.ready.set()
            try:
                await self._read()
            finally:
                self.stop()
                await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._failure is not None:
                raise self._failure
            await self._account()
        finally:
            self.caught_up = False
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._source.close()

    def _partition_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()
            self.stop()

    async def _read(self) -> None:
        settings = self._settings
        capacity = 2 * settings.batch_size * settings.parallelism
        count = settings.parallelism
        partitions = self._partitions
        ledger = self.ledger
        while not self._stopping.is_set():
            self._signal.clear()
            await self._account()
            if not self._resumed.is_set() or ledger.in_flight >= capacity:
                # Wake at least once a watermark interval: a handler held for long must
                # not keep what finished around it from being stored.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(WATERMARK_INTERVAL):
                        await self._signal.wait()
                continue
            events = await self._source.read(capacity - ledger.in_flight)
            if not events:
                await self._account()
                # A standby has read nothing of what its source holds, a source
                # blocked at a gap holds events back, and a pause that came during this
                # read leaves unread events behind: not caught up.
                self.caught_up = (
                    ledger.in_flight == 0
                    and not self._source.standing_by
                    and not self._source.blocked
                    and self._resumed.is_set()
                )
                if self.caught_up:
                    self.idle_reads += 1
                continue
            self.caught_up = False
            if self._cache is None:
                await self._claim()
                self._cache = await self._load_cache()
            for event in events:
                partition = partitions[partition_of(event.stream_id, count)]
                if not ledger.delivered(event.position, event.occurred_at):
                    # Already accounted for, or already on its way in this run.
                    self._skipped(event, partition.index, "dedup")
                    continue
                partition.events.append(event)
                partition.events_added.set()
            # A source and target that never suspend must not starve other tasks.
            await asyncio.sleep(0)

    async def _claim(self) -> None:
        """Take the projection for this pipeline: a new generation from the target, then
        a check that the source's lock outlived the claim (so no other reader can
        have claimed in between: a deposed one confirms nothing and crashes here)."""
        self._fence = await self._target.claim(self._key)
        await self._source.confirm_held()

    async def _load_cache(self) -> PositionCache:
        positions = await self._target.load_positions(self._key, PRELOAD_LIMIT)
        complete = len(positions) < PRELOAD_LIMIT
        _emit(
            "scriba.projection.cache_initialized",
            {"rows": len(positions)},
            {**self._identity, "source": "target" if positions else "empty", "complete": complete},
        )
        return PositionCache(positions, complete=complete)

    async def _account(self) -> None:
        """Acknowledge the done prefix; store it as the watermark when due."""
        ledger = self.ledger
        prefix = ledger.prefix
        if prefix > self._acknowledged:
            await self._source.acknowledge(prefix)
            self._acknowledged = prefix
        if prefix > self._saved:
            now = time.monotonic()
            if ledger.in_flight == 0 or now - self._saved_at >= WATERMARK_INTERVAL:
                await self._target.save_watermark(
                    self._key, prefix, ledger.prefix_occurred_at, fence=self._fence
                )
                self._saved, self._saved_at = prefix, now

    # -- a partition -----------------------------------------------------------------

    async def _handle_events(self, partition: _Partition) -> None:
        """Handle the partition's events one at a time, in order, until stopping."""
        events = partition.events
        try:
            while not self._stopping.is_set():
                if not events:
                    partition.events_added.clear()
                    await partition.events_added.wait()
                    continue
                outcome = await self._handle(events.popleft(), partition.index)
                if outcome is None:  # stopping in the middle of a retry
                    break
                partition.outcomes.append(outcome)
                partition.outcomes_added.set()
        finally:
            partition.handling = False
            partition.outcomes_added.set()

    async def _batch(self, partition: _Partition) -> None:
        """Commit the partition's outcomes in batches of ``batch_size``, or what has
        come within ``batch_timeout`` of a batch's first outcome; after the handler
        task ends, commit what is left (unless halted)."""
        outcomes, added = partition.outcomes, partition.outcomes_added
        batch_size, batch_timeout = self._settings.batch_size, self._settings.batch_timeout
        batch: list[_Outcome] = []
        deadline = 0.0
        while not self.halted:
            if outcomes:
                if not batch:
                    deadline = time.monotonic() + batch_timeout
                batch.append(outcomes.popleft())
                if len(batch) >= batch_size:
                    await self._commit(partition.index, batch)
                    batch = []
                    await asyncio.sleep(0)
                continue
            if not partition.handling:
                break
            added.clear()
            if not batch:
                await added.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining > 0:
                try:
                    async with asyncio.timeout(remaining):
                        await added.wait()
                    continue
                except TimeoutError:
                    pass
            await self._commit(partition.index, batch)
            batch = []
        if batch and not self.halted:
            await self._commit(partition.index, batch)

    async def _handle(self, event: Event, partition: int) -> _Outcome | None:
        cache = self._cache
        assert cache is not None  # loaded before the first event is queued
        stream_id = event.stream_id
        if cache.knows(stream_id):
            cursor = cache.get(stream_id)
        else:
            cursor = await self._target.stream_position(self._key, stream_id)
            cache.advance(stream_id, cursor)
        if cursor is not None and event.position <= cursor:
            self._skipped(event, partition, "dedup")
            return _Outcome(event, dedup=True)
        retry = self._settings.retry
        attempt = 1
        while True:
            failure = await self._call(event, partition, attempt)
            if not isinstance(failure, DeadLetter):
                return failure
            if attempt >= retry.max_attempts:
                return _Outcome(event, dead_letter=failure)
            if not await self._sleep(retry.delay_before(attempt + 1)):
                return None
            attempt += 1

    def _details(self, event: Event, partition: int, attempt: int) -> dict[str, Any]:
        """The metadata of a handler call's telemetry (built only when observed)."""
        return {
            **self._identity,
            "event_id": event.id,
            "position": event.position,
            "stream_id": event.stream_id,
            "event_type": event.type,
            "partition": partition,
            "attempt": attempt,
        }

    async def _call(self, event: Event, partition: int, attempt: int) -> _Outcome | DeadLetter:
        """One handler call: an outcome to batch, or the failure to retry on."""
        if telemetry.enabled("scriba.projection.event.start"):
            _emit(
                "scriba.projection.event.start",
                {"monotonic_time": time.monotonic()},
                self._details(event, partition, attempt),
            )
        started = time.perf_counter()
        try:
            meta = Meta(self._key, partition, attempt)
            result: object = await awaited(self._projection.handle(event, meta))
        except Exception as exc:  # noqa: BLE001 - a raising handler is a failed event
            text = traceback.format_exc()
            _emit(
                "scriba.projection.event.exception",
                {"duration": time.perf_counter() - started},
                {
                    **self._details(event, partition, attempt),
                    "kind": type(exc).__name__,
                    "reason": str(exc),
                    "stacktrace": text,
                },
            )
            return DeadLetter(event, "exception", f"{type(exc).__name__}: {exc}", text)
        if telemetry.enabled("scriba.projection.event.stop"):
            _emit(
                "scriba.projection.event.stop",
                {"duration": time.perf_counter() - started},
                {
                    **self._details(event, partition, attempt),
                    "result": _RESULT_NAMES.get(type(result), "invalid"),
                },
            )
        if isinstance(result, Operation):
            if self._target.accepts(result):
                return _Outcome(event, operation=result)
            message = f"the target does not accept {type(result).__name__} operations"
            return _Outcome(event, dead_letter=DeadLetter(event, "rejected", message))
        if isinstance(result, Skip):
            self._skipped(event, partition, "handler")
            return _Outcome(event)
        if isinstance(result, Error):
            return DeadLetter(event, "error", str(result.reason))
        # Not retried: the same code returns the same wrong thing.
        return _Outcome(event, dead_letter=DeadLetter(event, "rejected", not_a_result(result)))

    def _skipped(self, event: Event, partition: int, reason: str) -> None:
        if not telemetry.enabled("scriba.projection.event.skipped"):
            return
        _emit(
            "scriba.projection.event.skipped",
            {},
            {
                **self._identity,
                "position": event.position,
                "stream_id": event.stream_id,
                "event_type": event.type,
                "partition": partition,
                "reason": reason,
            },
        )

    async def _sleep(self, seconds: float) -> bool:
        """Sleep, unless stopping first; returns whether to carry on."""
        if self._stopping.is_set():
            return False
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            return True
        return False

    # -- committing ------------------------------------------------------------------

    async def _commit(self, partition: int, batch: list[_Outcome]) -> None:
        """Commit ``batch`` or answer its failure; mark what ended up done."""
        if all(outcome.dedup for outcome in batch):
            self._done(batch)
            return
        started = time.perf_counter()
        answer = await self._apply(partition, batch)
        if answer == "committed":
            self._committed(partition, batch, started)
        elif answer == "integrity":
            await self._isolate(partition, batch)

    async def _apply(self, partition: int, outcomes: Sequence[_Outcome]) -> str:
        """Apply ``outcomes`` in one call, replaying transient failures.

        Returns ``"committed"``, ``"integrity"`` (the target refused a write on
        integrity grounds), or ``"abandoned"`` (halted, or stopping during a backoff).

        Raises:
            ApplyFailed: of kind ``FENCED``: another reader claimed the projection.
        """
        applied = [(o.event, o.operation) for o in outcomes if o.operation is not None]
        dead_letters = [o.dead_letter for o in outcomes if o.dead_letter is not None]
        advances: dict[str, int] = {}
        for outcome in outcomes:
            if not outcome.dedup:
                event = outcome.event
                if advances.get(event.stream_id, -1) < event.position:
                    advances[event.stream_id] = event.position
        attempt = 0
        while True:
            try:
                await self._target.apply_batch(
                    self._key, applied, advances, dead_letters, fence=self._fence
                )
            except ApplyFailed as failure:
                self._batch_failed(partition, outcomes, failure)
                if failure.kind is FailureKind.FENCED:
                    raise  # deposed: this pipeline ends, as a crash
                if failure.kind is FailureKind.INTEGRITY:
                    return "integrity"
                if failure.kind is not FailureKind.TRANSIENT:
                    self._halt(failure.kind, str(failure))
                    return "abandoned"
                backoff = self._settings.commit_backoff
                attempt += 1
                if not await self._sleep(backoff[min(attempt, len(backoff)) - 1]):
                    _log.warning(
                        "projection %s v%s, partition %d: stopped with a batch of %d events "
                        "not committed (%s); they are read again at the next start",
                        self._key.name,
                        self._key.version,
                        partition,
                        len(outcomes),
                        failure,
                    )
                    return "abandoned"
            else:
                return "committed"

    async def _isolate(self, partition: int, batch: list[_Outcome]) -> None:
        """Retry a batch refused on integrity grounds event by event.

        Writes that fail alone are dead-lettered (kind ``"integrity"``) in the same
        commit as the next write that succeeds, so a crash never leaves one of them
        neither written nor dead-lettered. If every attempted write fails, the blast
        radius decides: more than one means the handler no longer matches the schema
        (halt, nothing committed); exactly one is ambiguous (dead-letter it, and halt
        on the third such batch in a row with nothing committing in between).
        """
        carried: list[_Outcome] = []
        attempted = succeeded = 0
        for outcome in batch:
            if outcome.operation is None:
                carried.append(outcome)
                continue
            attempted += 1
            started = time.perf_counter()
            answer = await self._apply(partition, [*carried, outcome])
            if answer == "abandoned":
                return
            if answer == "committed":
                succeeded += 1
                self._committed(partition, [*carried, outcome], started)
                carried = []
                continue
            message = str(self._last_failure or "refused on integrity grounds")
            carried.append(
                _Outcome(outcome.event, dead_letter=DeadLetter(outcome.event, "integrity", message))
            )
        if not carried:
            return
        if succeeded == 0 and attempted > 1:
            self._halt(
                FailureKind.INTEGRITY,
                f"all {attempted} writes of a batch failed on integrity grounds: the "
                "handler no longer matches the read model",
            )
            return
        if succeeded == 0 and attempted == 1:
            self._circuit.lone_integrity_failures += 1
            if self._circuit.lone_integrity_failures >= self._circuit.halt_after:
                self._halt(
                    FailureKind.INTEGRITY,
                    f"{self._circuit.lone_integrity_failures} batches in a row had their "
                    "one write fail on integrity grounds with nothing committing",
                )
                return
        started = time.perf_counter()
        answer = await self._apply(partition, carried)
        if answer == "committed":
            self._committed(partition, carried, started)
        elif answer == "integrity":
            self._halt(FailureKind.INTEGRITY, "dead letters were refused on integrity grounds")

    def _batch_failed(
        self, partition: int, outcomes: Sequence[_Outcome], failure: ApplyFailed
    ) -> None:
        self._last_failure = failure
        self._repeats.log(
            _log,
            logging.WARNING,
            ("commit", partition, failure.kind),
            "projection %s v%s, partition %d: a batch of %d events could not be committed (%s): %s",
            self._key.name,
            self._key.version,
            partition,
            len(outcomes),
            failure.kind.value,
            failure,
        )
        _emit(
            "scriba.source.batch.failed",
            {"batch_size": len(outcomes)},
            {
                **self._identity,
                "partition": partition,
                "kind": failure.kind.value,
                "message": str(failure),
                "first_position": outcomes[0].event.position,
                "last_position": outcomes[-1].event.position,
            },
        )

    def _committed(self, partition: int, outcomes: Sequence[_Outcome], started: float) -> None:
        cache = self._cache
        assert cache is not None
        applied = dead = skipped = 0
        for outcome in outcomes:
            event = outcome.event
            if outcome.operation is not None:
                applied += 1
            elif outcome.dead_letter is not None:
                dead += 1
                # The kind and the place, not the message: it may quote the event's data.
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    ("dead letter", outcome.dead_letter.error_kind),
                    "projection %s v%s: event %s at position %d was dead-lettered (%s)",
                    self._key.name,
                    self._key.version,
                    event.type,
                    event.position,
                    outcome.dead_letter.error_kind,
                )
                _emit(
                    "scriba.projection.dead_letter",
                    {},
                    {
                        **self._identity,
                        "position": event.position,
                        "stream_id": event.stream_id,
                        "event_type": event.type,
                        "error_kind": outcome.dead_letter.error_kind,
                    },
                )
            else:
                skipped += 1
            if not outcome.dedup:
                cache.advance(event.stream_id, event.position)
        if applied:
            self._circuit.lone_integrity_failures = 0
        _emit(
            "scriba.projection.batch.stop",
            {
                "duration": time.perf_counter() - started,
                "batch_size": len(outcomes),
                "applied": applied,
                "dead_letters": dead,
                "skipped": skipped,
            },
            {
                **self._identity,
                "partition": partition,
                "first_position": outcomes[0].event.position,
                "last_position": outcomes[-1].event.position,
            },
        )
        self._done(outcomes)

    def _done(self, outcomes: Sequence[_Outcome]) -> None:
        self.ledger.done(outcome.event.position for outcome in outcomes)
        self.progressed = True
        self._signal.set()

    def _halt(self, kind: FailureKind, reason: str) -> None:
        if self.halted:
            return
        self.halted = True
        self._on_halt(kind, reason)  # which logs it
        self.stop()
