"""The stream consumer: reads a :class:`~statifier.fronts.source.Source`, routes its
events on per-key lanes, and acknowledges only what committed.

:class:`StreamConsumer` runs three kinds of task:

- The intake fetches messages (pausing while ``max_in_flight`` are pending), notes
  each in the gapless-prefix tracker (:mod:`statifier.fronts.acks`), dead-letters the
  malformed ones, and queues every event on its lane: ``crc32(partition key) % lanes``
  (:mod:`statifier.fronts.lanes`), so one key's events queue on one lane in the order
  the source handed them over.
- Each lane routes its queue through :meth:`~statifier.router.Router.route_many`, up to
  ``batch_size`` events per call, one call at a time. An event is *done* when the
  call that returned :class:`~statifier.router.Routed` for it is over (its delivery
  transaction committed) or when it was dead-lettered.
- The committer calls :meth:`Source.commit` every ``commit_interval`` seconds with, per
  partition, the highest position whose every fetched message up to it is done.

An event whose routing fails (a :class:`~statifier.router.Failed` answer, or the
``route_many`` call raising) is never acknowledged as done. Under :class:`Retry` (the
default) its lane routes it again, alone, after a backoff, and holds everything queued
behind it meanwhile, so its key's order holds. Under :class:`DeadLetterAfter` it is
put to a dead-letter sink after that many failed attempts, counted and reported
(``statifier.fronts.dead_letter``), and the lane moves on. A malformed message (the
source could read no event from it) is dead-lettered at once with its reason; nothing
a message holds crashes the consumer.

>>> import asyncio, tempfile
>>> from pathlib import Path
>>> from statifier.chart import compile_chart
>>> from statifier.fronts.table_source import TableSource, append_events
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.router import Binding, InboundEvent, Router, RouterConfig, StaticResolver
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'consumer.db'}"
>>> migrations.upgrade(url)
>>> chart = compile_chart('''<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
...   <state id="s"><transition event="hit"/></state></scxml>''')
>>> hits = Binding(id="hits", source="hits", match="true", key="event.key",
...                document="counter", event="hit")
>>> async def main():
...     async with SqlAdapter(url) as adapter:
...         router = Router(RouterConfig(adapter, bindings=[hits],
...                                      resolver=StaticResolver({"counter": chart})))
...         events = [InboundEvent(scope="demo", source="hits", message_id=f"m{n}",
...                                data={"key": f"k{n % 2}"}) for n in range(4)]
...         await append_events(adapter, events, partition="0")
...         source = TableSource(adapter, group="demo", partitions=["0"])
...         consumer = StreamConsumer(router, source, commit_interval=0.01)
...         running = asyncio.create_task(consumer.run())
...         while consumer.counts.committed < 4:
...             await asyncio.sleep(0.01)
...         await consumer.stop()
...         await running
...         return consumer.counts
>>> asyncio.run(main())
ConsumerCounts(routed=4, failed_attempts=0, dead_lettered=0, malformed=0, committed=4)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from statifier.error_text import error_text
from statifier.fronts.acks import Acks
from statifier.fronts.dead_letters import DeadLetterEntry, DeadLetters, TableDeadLetters, cut
from statifier.fronts.lanes import lane_of
from statifier.fronts.source import Malformed, Message, Source
from statifier.repeats import Repeats
from statifier.router import (
    Backoff,
    BlockedByEarlierFailure,
    ConfigError,
    Failed,
    InboundEvent,
    Planned,
    Routed,
    Router,
    ShardedRouter,
)
from statifier.telemetry import enabled, report

__all__ = ["ConsumerCounts", "DeadLetterAfter", "FailurePolicy", "Retry", "StreamConsumer"]

_DEAD_LETTER: Final = "statifier.fronts.dead_letter"
_COMMIT: Final = "statifier.fronts.commit"
_RETRY: Final = "statifier.fronts.retry"
_log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[object]]

DEFAULT_BACKOFF: Final = Backoff(
    base=timedelta(milliseconds=100), factor=2.0, cap=timedelta(seconds=30)
)
"""A lane's wait before routing a failed event again: 0.1 s, doubling, at most 30 s."""


def _wall_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Retry:
    """Route a failed event again, for ever, waiting ``backoff`` between attempts;
    its lane holds everything queued behind it meanwhile."""

    backoff: Backoff = DEFAULT_BACKOFF


@dataclass(frozen=True, slots=True)
class DeadLetterAfter:
    """Route a failed event again up to ``attempts`` attempts in all, waiting
    ``backoff`` between them, then put it to ``dead_letters`` and move on.

    Raises:
        ConfigError: ``attempts`` is not a positive integer.
    """

    attempts: int
    dead_letters: DeadLetters
    backoff: Backoff = DEFAULT_BACKOFF

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ConfigError(f"attempts is a positive integer, not {self.attempts!r}")


FailurePolicy = Retry | DeadLetterAfter
"""What a lane does with an event whose routing failed."""


@dataclass(frozen=True, slots=True)
class ConsumerCounts:
    """What a consumer has done since it was made.

    Attributes:
        routed: events routed as :class:`~statifier.router.Routed` (their deliveries
            committed).
        failed_attempts: routing attempts that failed (an event retried three times
            counts three).
        dead_lettered: events dead-lettered after failing (malformed ones aside).
        malformed: messages dead-lettered because no event could be read from them.
        committed: messages acknowledged to the source by its commits.
    """

    routed: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    malformed: int = 0
    committed: int = 0


@dataclass(eq=False)
class _Pending:
    """An event queued on a lane, and its failed attempts so far."""

    message: Message
    event: InboundEvent
    attempts: int = 0
    error: str = ""
    planned: Planned | None = None
    """The event's bindings, read once to choose its lane, and routed by."""


@dataclass(eq=False)
class _Lane:
    """One lane's queue, and the events it is routing now."""

    index: int
    queue: deque[_Pending] = field(default_factory=deque)
    busy: list[_Pending] = field(default_factory=list)
    alone: bool = False
    """Route the next event alone: the last attempt failed."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class StreamConsumer:
    """Routes a source's events by key and acknowledges the gapless prefix of what
    committed (see the module docstring).

    Args:
        router: the router; over a :class:`~statifier.router.ShardedRouter`, each
            store has lanes of its own (an event's lane is among those of its
            partition key's store), so a store that is away holds up its own keys'
            events alone, and the others' keep flowing.
        source: the stream; the consumer starts, commits and closes it.
        lanes: lanes routing concurrently (one key's events always on one lane); per
            store over a :class:`~statifier.router.ShardedRouter`.
        batch_size: the most events one ``route_many`` call of a lane takes.
        max_in_flight: fetched messages not yet done at most; the intake pauses above.
        failure: what a lane does with an event whose routing fails.
        malformed: where malformed messages go; the ``consumer_dead_letters`` table of
            the configuration's database by default (the first store's, over several).
        commit_interval: seconds between commits of the gapless prefix of done
            messages.
        poll: the longest one fetch waits for a first message (so a stop is heard).
        clock: the time dead letters are stamped with.
        sleep: how a lane waits out a backoff (tests give one that returns at once).
        stall_after: seconds with fetched events waiting and none done after which
            :meth:`trouble` says the consumer is stalled.

    Raises:
        ConfigError: a bound out of range, or no malformed sink when the
            configuration's storage is not SQL.
    """

    def __init__(
        self,
        router: Router | ShardedRouter,
        source: Source,
        *,
        lanes: int = 8,
        batch_size: int = 32,
        max_in_flight: int = 1024,
        failure: FailurePolicy | None = None,
        malformed: DeadLetters | None = None,
        commit_interval: float = 0.2,
        poll: float = 0.25,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        stall_after: float = 60.0,
    ) -> None:
        for name, value in (
            ("lanes", lanes),
            ("batch_size", batch_size),
            ("max_in_flight", max_in_flight),
        ):
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} is a positive integer, not {value!r}")
        if not commit_interval > 0 or not poll > 0:
            raise ConfigError(f"commit_interval and poll are positive: {commit_interval}, {poll}")
        if not stall_after > 0:
            raise ConfigError(f"stall_after is positive seconds, not {stall_after!r}")
        self.router = router
        self.source = source
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.failure: FailurePolicy = failure or Retry()
        home = router.routers[0] if isinstance(router, ShardedRouter) else router
        self.malformed = malformed or TableDeadLetters(home.adapter, home.storage.codec)
        self.commit_interval = commit_interval
        self.poll = poll
        self.clock = clock or _wall_clock
        self.sleep: Sleep = sleep or asyncio.sleep
        self.stall_after = stall_after
        self._done_at = time.monotonic()
        self._per_store = lanes
        stores = len(router.routers) if isinstance(router, ShardedRouter) else 1
        self._lanes = [_Lane(index) for index in range(lanes * stores)]
        self._acks = Acks()
        self._counts = ConsumerCounts()
        self._room = asyncio.Event()
        self._calls_ended = asyncio.Condition()
        self._commit_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._finished = asyncio.Event()
        self._drain_timeout = 10.0
        self._running = False
        self._repeats = Repeats()
        self._broken: BaseException | None = None
        """What a lane or the committer raised, if one did: the consumer stops with it."""

    @property
    def counts(self) -> ConsumerCounts:
        """What the consumer has done so far."""
        return self._counts

    def trouble(self) -> str | None:
        """``None`` while events flow, else ``"no event done for N s while M wait"``:
        fetched events wait and none was done (routed, dead-lettered or found
        malformed) for ``stall_after`` seconds. An event whose routing fails for good
        under :class:`Retry` (a parked execution, say) holds its lane so, and at
        ``max_in_flight`` the whole intake; an idle stream is not stalled."""
        waiting = self._acks.pending()
        idle = time.monotonic() - self._done_at
        if waiting and idle >= self.stall_after:
            return f"no event done for {idle:.0f} s while {waiting} wait"
        return None

    # Running.

    async def run(self) -> None:
        """Start the source and consume until :meth:`stop`; then let the lanes finish
        the calls they began (within the stop's ``drain_timeout``), commit what
        is done and close the source.

        Raises:
            RuntimeError: the consumer is running already, or ran before.
            Exception: the source failed to start or to fetch, or a lane or the
                committer failed (after the same shutdown: what is done is committed
                if the source still takes it).
        """
        if self._running or self._finished.is_set():
            raise RuntimeError("a stream consumer runs once")
        self._running = True
        self._done_at = time.monotonic()
        workers: list[asyncio.Task[None]] = []
        try:
            await self.source.start(_Rebalancing(self))
            workers = [asyncio.create_task(self._lane(lane)) for lane in self._lanes]
            workers.append(asyncio.create_task(self._committer()))
            for worker in workers:
                worker.add_done_callback(self._worker_ended)
            await self._intake()
            if self._broken is not None:
                raise self._broken
        finally:
            try:
                await self._shut_down(workers)
            finally:
                self._finished.set()

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        """A lane or the committer ended: if it raised, the consumer stops and
        :meth:`run` raises what it raised (nothing of it would move again)."""
        if task.cancelled() or (error := task.exception()) is None:
            return
        if self._broken is None:
            self._broken = error
            _log.error(
                "a worker of the stream consumer of %s failed; the consumer stops: %s: %s",
                self.source.name,
                type(error).__name__,
                error,
                exc_info=error,
            )
        self._stopping.set()
        self._room.set()
        for lane in self._lanes:
            lane.wake.set()

    async def stop(self, *, drain_timeout: float = 10.0) -> None:
        """Stop fetching; let the lanes finish the ``route_many`` calls they began, for
        at most ``drain_timeout`` seconds (then they are cancelled: what they had not
        committed is rolled back and comes again); commit what is done; close the
        source. Returns once :meth:`run` has done all that (at once if it never ran).
        Events queued but not begun are not routed: the source hands them over again.
        """
        self._drain_timeout = drain_timeout
        self._stopping.set()
        self._room.set()
        for lane in self._lanes:
            lane.wake.set()
        if self._running:
            await self._finished.wait()

    async def _shut_down(self, workers: list[asyncio.Task[None]]) -> None:
        self._stopping.set()
        for lane in self._lanes:
            lane.wake.set()
        lanes, committer = workers[:-1], workers[-1:]
        for task in committer:
            task.cancel()
        if lanes:
            _, late = await asyncio.wait(lanes, timeout=self._drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*lanes, *committer, return_exceptions=True)
        try:
            if workers:
                await self._commit()
        except Exception:  # noqa: BLE001 - what did not commit comes again
            _log.exception("the last commit to %s failed", self.source.name)
        finally:
            await self.source.close()

    async def _intake(self) -> None:
        while not self._stopping.is_set():
            room = self.max_in_flight - self._acks.pending()
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            messages = await self.source.fetch(
                min(room, self.batch_size * len(self._lanes)), self.poll
            )
            for message in messages:
                await self._take(message)

    async def _take(self, message: Message) -> None:
        if not self._acks.fetched(message.partition, message.position):
            return  # a repeat of a message in flight or done
        event = message.event
        if isinstance(event, Malformed):
            await self._dead_letter(message, None, f"malformed: {event.reason}", self.malformed)
            self._count(malformed=1)
            return
        pending = _Pending(message, event)
        key = await self._key(pending)
        if key is None:
            return
        lane = self._lanes[self._lane_of(pending, key)]
        lane.queue.append(pending)
        lane.wake.set()

    def _lane_of(self, pending: _Pending, key: str) -> int:
        """The lane of ``pending``, whose partition key is ``key``: among the lanes of
        the key's store, over several stores."""
        lane = lane_of(key, self._per_store)
        if isinstance(self.router, ShardedRouter) and pending.planned is not None:
            return self.router.store_of_key(pending.planned) * self._per_store + lane
        return lane

    async def _key(self, pending: _Pending) -> str | None:
        """The event's partition key. While its scope's bindings cannot be read the
        intake waits, retrying with backoff (a guessed lane could break its key's
        order); under :class:`DeadLetterAfter` the event is dead-lettered once out of
        attempts (returns ``None``), and when the consumer stops it is left unrouted
        (the stop drops what was not begun)."""
        event = pending.event
        policy = self.failure
        while True:
            try:
                pending.planned = await self.router.plan(event)
                return pending.planned.key
            except Exception as error:  # noqa: BLE001 - the bindings resolver's failure
                pending.attempts += 1
                pending.error = error_text(error)
                self._failed(pending)
            if isinstance(policy, DeadLetterAfter) and pending.attempts >= policy.attempts:
                await self._dead_letter(
                    pending.message, event.message_id, pending.error, policy.dead_letters
                )
                self._count(dead_lettered=1)
                return None
            if self._stopping.is_set():
                return event.message_id
            await self._pause(policy.backoff.delay(pending.attempts).total_seconds())

    async def _lane(self, lane: _Lane) -> None:
        while not self._stopping.is_set():
            if not lane.queue:
                lane.wake.clear()
                await lane.wake.wait()
                continue
            size = 1 if lane.alone else self.batch_size
            lane.busy = [lane.queue.popleft() for _ in range(min(size, len(lane.queue)))]
            try:
                failed = await self._route(lane.busy)
                # Back on the queue before the lane is idle, so a revoke drops them.
                lane.queue.extendleft(reversed(failed))
                lane.alone = bool(failed)
                head = failed[0] if failed else None
                policy = self.failure
                if (
                    head is not None
                    and isinstance(policy, DeadLetterAfter)
                    and head.attempts >= policy.attempts
                ):
                    lane.queue.popleft()
                    lane.busy = [head]
                    sink = policy.dead_letters
                    await self._dead_letter(head.message, head.event.message_id, head.error, sink)
                    self._count(dead_lettered=1)
                    lane.alone = False
                    head = None
            finally:
                lane.busy = []
                async with self._calls_ended:
                    self._calls_ended.notify_all()
            if head is not None:
                await self._backoff(head)

    async def _backoff(self, head: _Pending) -> None:
        """Wait out ``head``'s backoff, or until the consumer stops."""
        await self._pause(self.failure.backoff.delay(max(head.attempts, 1)).total_seconds())

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the consumer stops (a stop is never held up by a
        backoff)."""
        wait = asyncio.ensure_future(self.sleep(seconds))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([wait, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            wait.cancel()
            stopping.cancel()

    async def _route(self, batch: list[_Pending]) -> list[_Pending]:
        """Route ``batch``; mark what was routed done; answer the events to try again, in
        order (each with its failed attempt counted, unless it was only blocked)."""
        try:
            answers: Sequence[Routed | Failed] = await self.router.route_many(
                [pending.planned or pending.event for pending in batch]
            )
        except Exception as error:  # noqa: BLE001 - nothing of the batch committed
            said = error_text(error)
            if len(batch) == 1:
                # Alone, the failure is this event's own; in a batch it may be any's.
                batch[0].attempts += 1
            batch[0].error = said
            self._failed(batch[0])
            return batch
        again: list[_Pending] = []
        routed = 0
        for pending, answer in zip(batch, answers, strict=True):
            if isinstance(answer, Routed):
                self._mark_done(pending.message)
                routed += 1
                continue
            if not isinstance(answer.error, BlockedByEarlierFailure):
                pending.attempts += 1
                pending.error = error_text(answer.error)
                self._failed(pending)
            again.append(pending)
        self._count(routed=routed)
        return again

    def _mark_done(self, message: Message) -> None:
        self._acks.done(message.partition, message.position)
        self._done_at = time.monotonic()
        if self._acks.pending() < self.max_in_flight:
            self._room.set()

    def _failed(self, pending: _Pending) -> None:
        self._count(failed_attempts=1)
        # While the database is down every lane fails the same way at each backoff:
        # one line per partition and kind of error per interval, with the count.
        error_class = pending.error.split(":", 1)[0]
        self._repeats.log(
            _log,
            logging.WARNING,
            ("retry", pending.message.partition, error_class),
            "%s: routing %r (partition %s, position %d) failed (attempt %d), it is tried again: %s",
            self.source.name,
            pending.event.message_id,
            pending.message.partition,
            pending.message.position,
            pending.attempts,
            pending.error,
            extra={
                "source": self.source.name,
                "partition": pending.message.partition,
                "position": pending.message.position,
                "message_id": pending.event.message_id,
                "attempts": pending.attempts,
                "error": pending.error,
            },
        )
        if enabled(_RETRY):
            report(
                _RETRY,
                {"attempts": pending.attempts},
                {
                    "source": self.source.name,
                    "partition": pending.message.partition,
                    "position": pending.message.position,
                    "message_id": pending.event.message_id,
                    "error": pending.error,
                },
            )

    async def _dead_letter(
        self, message: Message, message_id: str | None, reason: str, sink: DeadLetters
    ) -> None:
        """Put ``message`` to ``sink`` (again and again while the sink fails, unless
        the consumer stops: then it stays pending), and mark it done."""
        letter = DeadLetterEntry(
            self.source.name,
            message.partition,
            message.position,
            message_id,
            cut(reason),
            message.raw,
            self.clock(),
        )
        failures = 0
        fields: dict[str, object] = {
            "source": letter.source,
            "partition": letter.partition,
            "position": letter.position,
            "message_id": message_id,
        }
        while True:
            try:
                await sink.put(letter)
                break
            except Exception as error:  # noqa: BLE001 - a sink's failure leaves the message pending
                failures += 1
                self._repeats.log(
                    _log,
                    logging.ERROR,
                    ("dead letter", type(error).__name__),
                    "%s: a dead letter for %r was not kept (attempt %d), it is tried again: %s",
                    self.source.name,
                    message_id,
                    failures,
                    error_text(error),
                    extra={**fields, "attempts": failures, "error": error_text(error)},
                )
                if self._stopping.is_set():
                    return
                await self._pause(self.failure.backoff.delay(failures).total_seconds())
        self._mark_done(message)
        _log.warning(
            "%s: dead-lettered %r (partition %s, position %d): %s",
            self.source.name,
            message_id,
            message.partition,
            message.position,
            letter.reason,
            extra={**fields, "reason": letter.reason},
        )
        report(
            _DEAD_LETTER,
            {"count": 1},
            {
                "source": letter.source,
                "partition": letter.partition,
                "position": letter.position,
                "message_id": message_id,
                "reason": letter.reason,
            },
        )

    # Committing.

    async def _committer(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval)
            try:
                await self._commit()
            except Exception as error:  # noqa: BLE001 - what did not commit is committed later
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    ("commit", type(error).__name__),
                    "%s: a commit failed, it is made again later: %s",
                    self.source.name,
                    error_text(error),
                    extra={"source": self.source.name, "error": error_text(error)},
                )

    async def _commit(self, partitions: Collection[str] | None = None) -> None:
        async with self._commit_lock:
            positions = self._acks.committable(partitions)
            if not positions:
                return
            started = time.perf_counter()
            await self.source.commit(positions)
            count = self._acks.committed(positions)
        self._count(committed=count)
        if enabled(_COMMIT):
            report(
                _COMMIT,
                {"duration": time.perf_counter() - started, "messages": count},
                {"source": self.source.name, "positions": dict(positions)},
            )

    # Rebalancing.

    async def revoked(self, partitions: Collection[str]) -> None:
        """Drop the queued events of ``partitions``, wait for the lanes' calls routing
        any of them, commit what is done, and forget the partitions."""
        given_up = set(partitions)
        self._drop(given_up)
        async with self._calls_ended:
            await self._calls_ended.wait_for(
                lambda: (
                    not any(
                        p.message.partition in given_up for lane in self._lanes for p in lane.busy
                    )
                )
            )
        self._drop(given_up)  # what the calls just ended put back
        try:
            await self._commit(given_up)
        finally:
            self._acks.forget(given_up)
            self._room.set()

    def _drop(self, partitions: Collection[str]) -> None:
        for lane in self._lanes:
            kept = [p for p in lane.queue if p.message.partition not in partitions]
            lane.queue.clear()
            lane.queue.extend(kept)

    def _count(self, **more: int) -> None:
        counts = self._counts
        self._counts = ConsumerCounts(
            routed=counts.routed + more.get("routed", 0),
            failed_attempts=counts.failed_attempts + more.get("failed_attempts", 0),
            dead_lettered=counts.dead_lettered + more.get("dead_lettered", 0),
            malformed=counts.malformed + more.get("malformed", 0),
            committed=counts.committed + more.get("committed", 0),
        )


class _Rebalancing:
    """The :class:`~statifier.fronts.source.Rebalance` a consumer starts its source
    with."""

    def __init__(self, consumer: StreamConsumer) -> None:
        self._consumer = consumer

    async def assigned(self, partitions: Collection[str]) -> None:
        _log.info("%s assigned %s", self._consumer.source.name, sorted(partitions))

    async def revoked(self, partitions: Collection[str]) -> None:
        await self._consumer.revoked(partitions)
