"""The stream consumer over an in-memory source, on both databases: every event routed
once in its key's order, commits by gapless prefix only, a failing event holding its
lane (or dead-lettered under a policy), malformed messages dead-lettered, revokes that
drain and commit, and a bounded stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import pytest
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT, SOURCE
from tests.router.test_races import counter_chart, logged_messages

from statifier import telemetry
from statifier.fronts.consumer import ConsumerCounts, DeadLetterAfter, Retry, StreamConsumer
from statifier.fronts.dead_letters import TableDeadLetters
from statifier.fronts.source import Malformed, Message, Rebalance
from statifier.persistence import Storage
from statifier.router import (
    Backoff,
    Binding,
    ConfigError,
    InboundEvent,
    Resolved,
    Router,
    RouterConfig,
    address,
    ledger,
)
from statifier.router.config import Entry

SCOPE = "consumer"
BROKEN = "broken"
"""The scope whose new executions the flaky resolver refuses while it is broken."""


class MemorySource:
    """A source over a list of messages, for the runtime's tests: hands them over in
    order, records every commit, and revokes partitions when asked (inside a fetch, as
    a consumer group's client does)."""

    name = "memory"

    def __init__(self, messages: Sequence[Message], *, fail_fetch: bool = False) -> None:
        self.messages = list(messages)
        self.handed = 0
        self.commits: list[dict[str, int]] = []
        self.committed: dict[str, int] = {}
        self.closed = False
        self.fail_fetch = fail_fetch
        self.rebalance: Rebalance | None = None
        self.revoking: list[tuple[list[str], asyncio.Event]] = []
        self.revoked: set[str] = set()

    async def start(self, rebalance: Rebalance) -> None:
        self.rebalance = rebalance
        await rebalance.assigned(sorted({m.partition for m in self.messages}))

    def revoke(self, partitions: list[str]) -> asyncio.Event:
        """Ask the next fetch to revoke ``partitions``; the event is set once done."""
        done = asyncio.Event()
        self.revoking.append((partitions, done))
        return done

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        if self.fail_fetch:
            raise ConnectionError("the broker went away")
        assert self.rebalance is not None
        while self.revoking:
            partitions, done = self.revoking.pop(0)
            await self.rebalance.revoked(partitions)
            self.revoked.update(partitions)
            done.set()
        batch: list[Message] = []
        while self.handed < len(self.messages) and len(batch) < max_messages:
            message = self.messages[self.handed]
            self.handed += 1
            if message.partition not in self.revoked:
                batch.append(message)
        if not batch:
            await asyncio.sleep(min(wait, 0.01))
        return batch

    async def commit(self, positions: Mapping[str, int]) -> None:
        for partition, position in positions.items():
            assert position > self.committed.get(partition, 0), "a commit moved back"
        self.commits.append(dict(positions))
        self.committed.update(positions)

    async def close(self) -> None:
        self.closed = True


class Flaky:
    """The counter chart for every new execution, except in a scope listed in
    ``broken``, where resolving fails."""

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)

    def __call__(self, scope: str, document: str) -> Resolved:
        if scope in self.broken:
            raise RuntimeError(f"the chart store of {scope} is down")
        machine = counter_chart()
        return Resolved(machine.identity.content_hash, machine)


class Gate:
    """An ``around_delivery`` that holds every delivery (not the partitioner's reads)
    until the gate opens."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.waiting = 0
        self.partitioned = 0

    async def __call__(self, scope: str, entry: Entry, work: Callable[[], Awaitable[Any]]) -> Any:
        if entry is Entry.PARTITION:
            self.partitioned += 1
            return await work()
        self.waiting += 1
        await self.open.wait()
        return await work()


def hit(message_id: str, key: str, scope: str = SCOPE) -> InboundEvent:
    data = {"kind": "hit", "key": key, "message_id": message_id}
    return InboundEvent(scope=scope, source=SOURCE, message_id=message_id, data=data)


def stream(partitions: int, keys: int, per_key: int) -> list[Message]:
    """Each key's hits in order, the keys interleaved, key ``k`` in partition
    ``k % partitions``."""
    positions = [0] * partitions
    messages = []
    for turn in range(per_key):
        for key in range(keys):
            partition = key % partitions
            positions[partition] += 1
            event = hit(f"k{key}/{turn}", f"k{key}")
            messages.append(Message(f"p{partition}", positions[partition], event))
    return messages


def router_of(router_db: RouterDb, resolver: Flaky | None = None, **more: Any) -> Router:
    config = router_db.config([HITS], resolver=resolver or Flaky(), lock_wait=LOCK_WAIT, **more)
    return Router(config)


async def until(check: Callable[[], bool]) -> None:
    """Wait (20 s at most) until ``check()`` holds."""
    async with asyncio.timeout(20.0):
        while not check():  # noqa: ASYNC110 - polls state the consumer does not signal
            await asyncio.sleep(0.005)


async def quick(seconds: float) -> None:
    """A backoff that waits a moment, whatever it was asked."""
    await asyncio.sleep(0.001)


def consumer_of(router: Router, source: MemorySource, **options: Any) -> StreamConsumer:
    options.setdefault("commit_interval", 0.01)
    options.setdefault("poll", 0.01)
    options.setdefault("sleep", quick)
    return StreamConsumer(router, source, **options)


def poison_stream(router_db: RouterDb, *more: Message) -> tuple[Flaky, Router, MemorySource]:
    """A resolver broken for ``BROKEN``, its router, and a source of p0: a/0, poison, a/1, more."""
    resolver = Flaky(BROKEN)
    router = router_of(router_db, resolver)
    messages = [
        Message("p0", 1, hit("a/0", "a")),
        Message("p0", 2, hit("poison/0", "poison", scope=BROKEN)),
        Message("p0", 3, hit("a/1", "a")),
        *more,
    ]
    return resolver, router, MemorySource(messages)


@pytest.mark.asyncio
async def test_every_event_is_routed_once_in_its_keys_order_and_committed(
    router_db: RouterDb,
) -> None:
    router = router_of(router_db)
    messages = stream(partitions=3, keys=6, per_key=8)
    source = MemorySource(messages)
    consumer = consumer_of(router, source, lanes=3, batch_size=4)
    running = asyncio.create_task(consumer.run())
    await until(lambda: consumer.counts.committed == len(messages))
    await consumer.stop()
    await running
    assert consumer.counts == ConsumerCounts(routed=48, committed=48)
    assert source.closed
    assert source.committed == {"p0": 16, "p1": 16, "p2": 16}
    rows = await ledger(router)
    sent = [m.event.message_id for m in messages if isinstance(m.event, InboundEvent)]
    assert sorted(str(r.message_id) for r in rows) == sorted(sent)
    for key in range(6):
        found = await address(router, SCOPE, DOCUMENT, f"k{key}")
        assert found is not None
        assert await logged_messages(router, found.execution_id) == [
            f"k{key}/{turn}" for turn in range(8)
        ]


@pytest.mark.asyncio
async def test_a_failing_event_holds_its_lane_and_the_commit_below_it(
    router_db: RouterDb,
) -> None:
    resolver, router, source = poison_stream(router_db, Message("p1", 1, hit("b/0", "b")))
    # One lane, one event a call: everything after the poison waits behind it.
    consumer = consumer_of(router, source, lanes=1, batch_size=1)
    running = asyncio.create_task(consumer.run())
    await until(lambda: source.committed == {"p0": 1})
    # Five attempts and ten commit intervals later, the committer has still not passed
    # the poison (waited for by count, not by time: a loaded machine retries slower).
    await until(lambda: consumer.counts.failed_attempts >= 5)
    await asyncio.sleep(0.1)
    assert consumer.counts.routed == 1
    assert source.committed == {"p0": 1}
    assert {r.message_id for r in await ledger(router)} == {"a/0"}
    resolver.broken.clear()  # the chart store is back
    await until(lambda: consumer.counts.committed == 4)
    await consumer.stop()
    await running
    assert source.committed == {"p0": 3, "p1": 1}
    found = await address(router, SCOPE, DOCUMENT, "a")
    assert found is not None
    assert await logged_messages(router, found.execution_id) == ["a/0", "a/1"]
    assert consumer.counts.dead_lettered == 0


@pytest.mark.asyncio
async def test_an_event_that_keeps_failing_turns_trouble_red_until_events_flow_again(
    router_db: RouterDb,
) -> None:
    resolver, router, source = poison_stream(router_db)
    consumer = consumer_of(router, source, lanes=1, batch_size=1, stall_after=0.3)
    assert consumer.trouble() is None
    running = asyncio.create_task(consumer.run())
    await until(lambda: consumer.counts.routed == 1)
    await until(lambda: consumer.trouble() is not None)
    assert (consumer.trouble() or "").endswith("while 2 wait")
    assert consumer.counts.routed == 1  # red while the poison holds the lane
    resolver.broken.clear()
    await until(lambda: consumer.counts.committed == 3)
    assert consumer.trouble() is None  # nothing waits: an idle stream is not stalled
    await consumer.stop()
    await running
    with pytest.raises(ConfigError, match="stall_after"):
        consumer_of(router, MemorySource([]), stall_after=0)


@pytest.mark.asyncio
async def test_a_failure_in_a_batch_holds_only_its_keys_events_behind_it(
    router_db: RouterDb,
) -> None:
    resolver = Flaky(BROKEN)
    router = router_of(router_db, resolver)
    messages = [
        Message("p0", 1, hit("poison/0", "poison", scope=BROKEN)),
        Message("p0", 2, hit("a/0", "a")),
        Message("p0", 3, hit("poison/1", "poison", scope=BROKEN)),
        Message("p0", 4, hit("a/1", "a")),
    ]
    source = MemorySource(messages)
    consumer = consumer_of(router, source, lanes=1, batch_size=8)
    running = asyncio.create_task(consumer.run())
    await until(lambda: consumer.counts.routed == 2 and consumer.counts.failed_attempts >= 3)
    await asyncio.sleep(0.05)
    assert source.committed == {}  # position 1 is never done: nothing may be committed
    resolver.broken.clear()
    await until(lambda: consumer.counts.committed == 4)
    await consumer.stop()
    await running
    found = await address(router, BROKEN, DOCUMENT, "poison")
    assert found is not None
    assert await logged_messages(router, found.execution_id) == ["poison/0", "poison/1"]


@pytest.mark.asyncio
async def test_out_of_attempts_an_event_is_dead_lettered_and_the_lane_moves_on(
    router_db: RouterDb,
) -> None:
    router = router_of(router_db, Flaky(BROKEN))
    dead = TableDeadLetters(router_db.adapter)
    messages = [
        Message("p0", 1, hit("poison/0", "poison", scope=BROKEN), b"raw poison"),
        Message("p0", 2, hit("a/0", "a")),
    ]
    source = MemorySource(messages)
    seen: list[Mapping[str, Any]] = []
    telemetry.attach("test", "statifier.fronts.dead_letter", lambda n, m, meta: seen.append(meta))
    try:
        consumer = consumer_of(
            router, source, lanes=1, failure=DeadLetterAfter(3, dead, backoff=Backoff())
        )
        running = asyncio.create_task(consumer.run())
        await until(lambda: consumer.counts.committed == 2)
        await consumer.stop()
        await running
    finally:
        telemetry.detach("test")
    assert consumer.counts == ConsumerCounts(
        routed=1, failed_attempts=3, dead_lettered=1, committed=2
    )
    [letter] = await dead.entries()
    assert (letter.source, letter.partition, letter.position) == ("memory", "p0", 1)
    assert letter.message_id == "poison/0"
    assert letter.raw == b"raw poison"
    assert "the chart store of broken is down" in letter.reason
    assert [m["message_id"] for m in seen] == ["poison/0"]
    assert {r.message_id for r in await ledger(router)} == {"a/0"}


@pytest.mark.asyncio
async def test_unreadable_bindings_hold_the_intake_then_dead_letter_under_the_policy(
    router_db: RouterDb,
) -> None:
    broken = {BROKEN}

    def bindings(scope: str) -> list[Binding]:
        if scope in broken:
            raise RuntimeError("the bindings store is down")
        return [HITS]

    config = RouterConfig(
        Storage(router_db.adapter, clock=router_db.clock),
        bindings_resolver=bindings,
        resolver=Flaky(),
        lock_wait=LOCK_WAIT,
    )
    router = Router(config)
    messages = [
        Message("p0", 1, hit("poison/0", "poison", scope=BROKEN)),
        Message("p0", 2, hit("a/0", "a")),
    ]
    held = MemorySource(messages)
    waiting = consumer_of(router, held)
    running = asyncio.create_task(waiting.run())
    await until(lambda: waiting.counts.failed_attempts >= 3)
    assert waiting.counts.routed == 0  # nothing passes an event whose lane is unknown
    broken.clear()
    await until(lambda: waiting.counts.committed == 2)
    await waiting.stop()
    await running

    broken.add(BROKEN)
    dead = TableDeadLetters(router_db.adapter)
    source = MemorySource([Message("p0", 3, hit("poison/1", "poison", scope=BROKEN))])
    giving_up = consumer_of(router, source, failure=DeadLetterAfter(2, dead))
    running = asyncio.create_task(giving_up.run())
    await until(lambda: giving_up.counts.committed == 1)
    await giving_up.stop()
    await running
    assert giving_up.counts == ConsumerCounts(failed_attempts=2, dead_lettered=1, committed=1)
    [letter] = await dead.entries()
    assert "the bindings store is down" in letter.reason


@pytest.mark.asyncio
async def test_a_malformed_message_is_dead_lettered_with_its_reason(
    router_db: RouterDb,
) -> None:
    router = router_of(router_db)
    messages = [
        Message("p0", 1, Malformed("not JSON"), b"{oops"),
        Message("p0", 2, hit("a/0", "a")),
    ]
    source = MemorySource(messages)
    consumer = consumer_of(router, source)
    running = asyncio.create_task(consumer.run())
    await until(lambda: consumer.counts.committed == 2)
    await consumer.stop()
    await running
    assert consumer.counts == ConsumerCounts(routed=1, malformed=1, committed=2)
    [letter] = await TableDeadLetters(router_db.adapter).entries("memory")
    assert (letter.message_id, letter.reason, letter.raw) == (None, "malformed: not JSON", b"{oops")


@pytest.mark.asyncio
async def test_a_revoke_drains_the_partitions_work_and_commits_before_returning(
    router_db: RouterDb,
) -> None:
    gate = Gate()
    router = router_of(router_db, around_delivery=gate)
    messages = [Message("p0", n, hit(f"a/{n}", "a")) for n in range(1, 6)]
    messages.append(Message("p1", 1, hit("b/0", "b")))
    source = MemorySource(messages)
    consumer = consumer_of(router, source, lanes=1, batch_size=2)
    running = asyncio.create_task(consumer.run())
    await until(lambda: gate.waiting > 0)  # the lane is routing a/1 and a/2
    done = source.revoke(["p0"])
    await asyncio.sleep(0.05)
    assert not done.is_set()  # waits for the call in flight
    gate.open.set()
    await asyncio.wait_for(done.wait(), 10)
    assert source.committed.get("p0") == 2
    await until(lambda: source.committed.get("p1") == 1)
    await consumer.stop()
    await running
    # a/3 .. a/5 were queued, not begun: dropped for the next owner.
    assert sorted(str(r.message_id) for r in await ledger(router)) == ["a/1", "a/2", "b/0"]
    assert consumer.counts.routed == 3


@pytest.mark.asyncio
async def test_a_stop_is_bounded_and_what_is_not_done_is_not_committed(
    router_db: RouterDb,
) -> None:
    gate = Gate()
    router = router_of(router_db, around_delivery=gate)
    source = MemorySource([Message("p0", 1, hit("a/0", "a"))])
    consumer = consumer_of(router, source)
    running = asyncio.create_task(consumer.run())
    await until(lambda: gate.waiting > 0)
    started = time.monotonic()
    await consumer.stop(drain_timeout=0.2)
    assert time.monotonic() - started < 5
    await running
    assert source.closed
    assert source.commits == []
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_a_stop_lets_the_calls_in_flight_finish_and_commits_them(
    router_db: RouterDb,
) -> None:
    gate = Gate()
    router = router_of(router_db, around_delivery=gate)
    source = MemorySource([Message("p0", 1, hit("a/0", "a"))])
    consumer = consumer_of(router, source, commit_interval=60.0)
    running = asyncio.create_task(consumer.run())
    await until(lambda: gate.waiting > 0)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.05)
    gate.open.set()
    await stopping
    await running
    assert source.commits == [{"p0": 1}]
    assert consumer.counts.committed == 1
    assert gate.partitioned == 1  # the partition key was read under around_delivery


@pytest.mark.asyncio
async def test_the_intake_pauses_at_max_in_flight(router_db: RouterDb) -> None:
    gate = Gate()
    router = router_of(router_db, around_delivery=gate)
    source = MemorySource(stream(partitions=1, keys=4, per_key=5))
    consumer = consumer_of(router, source, lanes=2, batch_size=1, max_in_flight=3)
    running = asyncio.create_task(consumer.run())
    await until(lambda: gate.waiting >= 1)
    await asyncio.sleep(0.05)
    assert source.handed == 3
    gate.open.set()
    await until(lambda: consumer.counts.committed == 20)
    await consumer.stop()
    await running


@pytest.mark.asyncio
async def test_a_failing_source_stops_the_consumer_and_is_closed(router_db: RouterDb) -> None:
    source = MemorySource([], fail_fetch=True)
    consumer = consumer_of(router_of(router_db), source)
    with pytest.raises(ConnectionError, match="went away"):
        await consumer.run()
    assert source.closed
    with pytest.raises(RuntimeError, match="runs once"):
        await consumer.run()


@pytest.mark.asyncio
async def test_a_failing_lane_stops_the_consumer_and_says_why(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    router = router_of(router_db)

    async def short(events: Any, **options: Any) -> list[Any]:
        return []  # one answer too few for every event: the lane cannot pair them

    router.route_many = short  # type: ignore[method-assign]
    source = MemorySource(stream(partitions=1, keys=2, per_key=2))
    consumer = consumer_of(router, source, lanes=1)
    with pytest.raises(ValueError, match="shorter"):
        await asyncio.wait_for(consumer.run(), 20)
    assert source.closed
    assert consumer.counts.committed == 0
    said = [r for r in caplog.records if "a worker of the stream consumer" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"]


@pytest.mark.asyncio
async def test_bounds_out_of_range_are_refused(router_db: RouterDb) -> None:
    router = router_of(router_db)
    source = MemorySource([])
    for options in ({"lanes": 0}, {"batch_size": 0}, {"max_in_flight": -1}, {"poll": 0.0}):
        with pytest.raises(ConfigError):
            StreamConsumer(router, source, **options)
    with pytest.raises(ConfigError, match="attempts"):
        DeadLetterAfter(0, TableDeadLetters(router_db.adapter))
    assert isinstance(StreamConsumer(router, source).failure, Retry)


@pytest.mark.asyncio
async def test_retries_and_dead_letters_are_structured_warnings_with_telemetry(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    router = router_of(router_db, Flaky(BROKEN))
    dead = TableDeadLetters(router_db.adapter)
    source = MemorySource([Message("p0", 1, hit("poison/0", "poison", scope=BROKEN), b"raw")])
    heard: list[tuple[str, Mapping[str, Any]]] = []
    for name in ("statifier.fronts.retry", "statifier.fronts.dead_letter"):
        telemetry.attach(f"test {name}", name, lambda n, m, meta: heard.append((n, meta)))
    caplog.set_level(logging.WARNING, "statifier.fronts.consumer")
    try:
        consumer = consumer_of(
            router, source, lanes=1, failure=DeadLetterAfter(4, dead, backoff=Backoff())
        )
        running = asyncio.create_task(consumer.run())
        await until(lambda: consumer.counts.committed == 1)
        await consumer.stop()
        await running
    finally:
        for name in ("statifier.fronts.retry", "statifier.fronts.dead_letter"):
            telemetry.detach(f"test {name}")
    records = [r for r in caplog.records if r.name == "statifier.fronts.consumer"]
    # Four failed attempts of one kind within the interval: one line for them all ...
    [retry, letter] = records
    assert retry.levelno == logging.WARNING
    assert "tried again" in retry.getMessage()
    fields = {k: vars(retry)[k] for k in ("source", "partition", "position", "message_id")}
    assert fields == {
        "source": "memory",
        "partition": "p0",
        "position": 1,
        "message_id": "poison/0",
    }
    assert (vars(retry)["attempts"], vars(retry)["repeated"]) == (1, 0)
    assert "the chart store of broken is down" in vars(retry)["error"]
    # ... and one for the dead letter, with its reason.
    assert letter.levelno == logging.WARNING
    assert letter.getMessage().startswith("memory: dead-lettered 'poison/0'")
    assert [vars(letter)[k] for k in ("message_id", "partition", "position")] == [
        "poison/0",
        "p0",
        1,
    ]
    assert "the chart store of broken is down" in vars(letter)["reason"]
    # Telemetry has every attempt, and the dead letter.
    assert [n for n, _ in heard] == ["statifier.fronts.retry"] * 4 + [
        "statifier.fronts.dead_letter"
    ]
