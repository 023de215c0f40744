"""The Kafka source and dead-letter topic against a real Kafka-protocol broker (Tansu,
started by the suite): records come as events named by topic/partition/offset, a
commit stores exactly position + 1, a restarted member resumes after the last commit,
partitions' backlogs are handed over in turns, every unreadable record is malformed
with its reason, two members share a topic's partitions and a revocation's commits
reach the broker before the partition moves, a member dropped from the group commits
nothing of its lost partitions, a revocation that outlasts its timeout lets the
partitions go, a commit that does not reach the broker raises, a dead letter is a
record with its reason in headers, and a dead-letter topic whose brokers do not answer
logs a few lines."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from tests.child_processes import signal_child
from tests.fronts.kafka_broker import (
    FAST_GROUP,
    KafkaBroker,
    committed,
    create_topic,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    read_records,
    start_kafka_broker,
    stop_kafka_broker,
    unique,
)
from tests.fronts.test_consumer import router_of
from tests.router.conftest import RouterDb
from tests.router.racing_router import SCOPE, SOURCE

from statifier import telemetry
from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.dead_letters import DeadLetterEntry
from statifier.fronts.kafka import (
    CommitFailed,
    DeadLetterNotKept,
    KafkaDeadLetters,
    KafkaRecord,
    KafkaSource,
    header_scope,
)
from statifier.fronts.source import Malformed, Message
from statifier.router import ConfigError, InboundEvent, Router, ledger

SHORT_WAITS = {"socket.timeout.ms": 3000, "reconnect.backoff.max.ms": 500}
"""A request to a broker that is gone fails within seconds."""


class Moves:
    """A runtime stand-in: records each partition move and, on a revocation, commits
    the positions it was told to (as the runtime commits its prefix of done messages)."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, list[str]]] = []
        self.source: KafkaSource | None = None
        self.done: dict[str, int] = {}
        self.revoke_delay = 0.0
        self.revocations_ended = 0

    async def assigned(self, partitions: Collection[str]) -> None:
        self.moves.append(("assigned", sorted(partitions)))

    async def revoked(self, partitions: Collection[str]) -> None:
        self.moves.append(("revoked", sorted(partitions)))
        try:
            await asyncio.sleep(self.revoke_delay)
            assert self.source is not None
            await self.source.commit({p: self.done[p] for p in partitions if p in self.done})
        finally:
            self.revocations_ended += 1


def source_of(broker: KafkaBroker, topic: str, group: str, **options: Any) -> KafkaSource:
    options.setdefault("scope", "acme")
    options.setdefault("settings", FAST_GROUP)
    return KafkaSource(broker.bootstrap, group=group, topics=[topic], source="orders", **options)


async def started(source: KafkaSource) -> Moves:
    moves = Moves()
    moves.source = source
    await source.start(moves)
    return moves


async def take(source: KafkaSource, count: int) -> list[Message]:
    """Fetch until ``count`` messages came (fails after 30 seconds)."""
    taken: list[Message] = []
    async with asyncio.timeout(30):
        while len(taken) < count:
            taken.extend(await source.fetch(100, 0.2))
    return taken


def events(messages: Sequence[Message]) -> list[InboundEvent]:
    found = [m.event for m in messages]
    assert all(isinstance(e, InboundEvent) for e in found), found
    return [e for e in found if isinstance(e, InboundEvent)]


def order(n: int) -> bytes:
    return json.dumps({"order_id": f"o{n}", "n": n}).encode()


@pytest.mark.asyncio
async def test_records_come_as_events_named_by_topic_partition_and_offset(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic = unique("orders")
    create_topic(kafka_broker, topic, 2)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(3)], partition=0)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(3, 5)], partition=1)
    source = source_of(kafka_broker, topic, unique("g"))
    moves = await started(source)
    try:
        messages = await take(source, 5)
        assert moves.moves == [("assigned", [f"{topic}/0", f"{topic}/1"])]
        assert source.owned == {f"{topic}/0", f"{topic}/1"}
        by_partition = {
            p: [(m.position, m.raw) for m in messages if m.partition == p]
            for p in (f"{topic}/0", f"{topic}/1")
        }
        assert by_partition == {
            f"{topic}/0": [(0, order(0)), (1, order(1)), (2, order(2))],
            f"{topic}/1": [(0, order(3)), (1, order(4))],
        }
        assert sorted(events(messages), key=lambda e: e.data["n"])[3] == InboundEvent(
            scope="acme",
            source="orders",
            message_id=f"{topic}/1/0",
            data={"order_id": "o3", "n": 3},
        )
        assert await source.fetch(100, 0.3) == []
    finally:
        await source.close()


@pytest.mark.asyncio
async def test_a_commit_stores_position_plus_one_and_a_restart_resumes_after_it(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 2)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(10)], partition=0)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(10, 14)], partition=1)
    first = source_of(kafka_broker, topic, group)
    await started(first)
    try:
        assert len(await take(first, 14)) == 14
        await first.commit({f"{topic}/0": 6})
        assert committed(kafka_broker, group, topic, 2) == {0: 7}
        await first.commit({})  # nothing to acknowledge: nothing is sent
        with pytest.raises(ValueError, match="offset >= 0"):
            await first.commit({f"{topic}/1": -1})
        with pytest.raises(ValueError, match="not a Kafka source partition"):
            await first.commit({"orders": 1})
    finally:
        await first.close()

    # The next member of the group starts after the commit, and from the beginning of
    # the partition nobody committed.
    again = source_of(kafka_broker, topic, group)
    await started(again)
    try:
        resumed = await take(again, 7)
        assert [(m.partition, m.position) for m in resumed if m.partition.endswith("/0")] == [
            (f"{topic}/0", position) for position in range(7, 10)
        ]
        assert [m.position for m in resumed if m.partition.endswith("/1")] == [0, 1, 2, 3]
        assert await again.fetch(100, 0.3) == []
    finally:
        await again.close()


@pytest.mark.asyncio
async def test_partitions_take_turns_so_no_backlog_holds_the_others_back(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic = unique("orders")
    create_topic(kafka_broker, topic, 2)
    for partition in (0, 1):
        produce(kafka_broker, topic, [(None, order(n)) for n in range(1500)], partition=partition)
    source = source_of(kafka_broker, topic, unique("g"), partition_buffer=50)
    await started(source)
    try:
        messages = await take(source, 3000)
    finally:
        await source.close()
    # librdkafka queues one partition's backlog before the other's; the source pauses
    # a partition whose buffer is full, so the other's records come through at once.
    first = Counter(m.partition for m in messages[:300])
    assert min(first.values()) >= 100, first
    for name in (f"{topic}/0", f"{topic}/1"):  # pausing and resuming skips nothing
        assert [m.position for m in messages if m.partition == name] == list(range(1500))


@pytest.mark.asyncio
async def test_a_member_dropped_from_the_group_revokes_its_lost_partitions_uncommitted(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 1)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(4)], partition=0)
    # A member that does not poll for max.poll.interval.ms is dropped from the group.
    # (librdkafka refuses one below session.timeout.ms.)
    source = source_of(
        kafka_broker, topic, group, settings={**FAST_GROUP, "max.poll.interval.ms": 3000}
    )
    caplog.set_level(logging.INFO, "statifier.fronts.kafka")
    moves = await started(source)
    try:
        await take(source, 4)
        moves.done = {f"{topic}/0": 3}  # what a runtime would commit on revocation
        await asyncio.sleep(4.5)  # not polling is what drops it: no condition to wait for
        async with asyncio.timeout(30):
            while source.owned:
                await source.fetch(10, 0.2)
        assert ("revoked", [f"{topic}/0"]) in moves.moves
        assert f"lost ['{topic}/0']" in caplog.text
        assert committed(kafka_broker, group, topic, 1) == {}  # lost: nothing was sent
    finally:
        await source.close()


@pytest.mark.asyncio
async def test_every_unreadable_record_is_malformed_with_its_reason(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic = unique("orders")
    create_topic(kafka_broker, topic, 1)
    deep = b"[" * 129 + b"]" * 129
    records: list[tuple[bytes | None, bytes | None]] = [
        (None, b"{oops"),
        (None, b"\xff\xfe{}"),
        (None, b"[1, 2]"),
        (None, b'{"pad": "' + b"x" * 600 + b'"}'),
        (b"gone", None),
        (None, deep),
        (None, b'{"order_id": "o1"}'),
    ]
    produce(kafka_broker, topic, records, partition=0)
    source = source_of(kafka_broker, topic, unique("g"), max_payload=512)
    await started(source)
    try:
        messages = await take(source, len(records))
    finally:
        await source.close()
    reasons = [m.event.reason if isinstance(m.event, Malformed) else None for m in messages]
    assert reasons[:6] == [
        "the value is not JSON: unexpected byte 0x6F at position 1",
        "the value is not UTF-8 (byte 0)",
        "the value is JSON but not an object: list",
        "a value of 611 bytes, over the 512",
        "the record has no value",
        "the value is not JSON: nesting deeper than 128 at position 128",
    ]
    assert reasons[6] is None
    assert [m.raw for m in messages[:4]] == [r[1] for r in records[:4]]


@pytest.mark.asyncio
async def test_ids_and_scopes_come_from_the_hosts_functions_or_the_record_is_malformed(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic = unique("orders")
    create_topic(kafka_broker, topic, 1)
    produce(kafka_broker, topic, [(b"k1", order(1))], partition=0, headers={"tenant": b"acme"})
    produce(kafka_broker, topic, [(b"k2", order(2))], partition=0)  # no tenant header
    produce(kafka_broker, topic, [(b"k3", order(3))], partition=0, headers={"tenant": b""})
    deep = b"x" * 300
    produce(kafka_broker, topic, [(deep, order(4))], partition=0, headers={"tenant": b"acme"})

    def by_key(record: KafkaRecord) -> str:
        assert record.key is not None
        return f"order:{record.key.decode()}:{record.offset}"

    source = source_of(
        kafka_broker,
        topic,
        unique("g"),
        scope=None,
        scope_of=header_scope("tenant"),
        message_id=by_key,
    )
    await started(source)
    try:
        messages = await take(source, 4)
    finally:
        await source.close()
    assert messages[0].event == InboundEvent(
        scope="acme", source="orders", message_id="order:k1:0", data={"order_id": "o1", "n": 1}
    )
    assert messages[1].event == Malformed(
        "no id or scope for the record: LookupError: no 'tenant' header"
    )
    assert messages[2].event == Malformed("an inbound event needs a scope: got ''")
    assert messages[3].event == InboundEvent(
        scope="acme",
        source="orders",
        message_id=f"order:{deep.decode()}:3",
        data={"order_id": "o4", "n": 4},
    )


@pytest.mark.asyncio
async def test_two_members_share_the_partitions_and_a_revocation_commits_before_the_move(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 4)
    for partition in range(4):
        produce(kafka_broker, topic, [(None, order(n)) for n in range(5)], partition=partition)
    names = {f"{topic}/{p}" for p in range(4)}
    first = source_of(kafka_broker, topic, group)
    first_moves = await started(first)
    second = source_of(kafka_broker, topic, group)
    second_moves = Moves()
    second_moves.source = second
    seen: dict[str, list[Message]] = {"first": [], "second": []}
    try:
        seen["first"] = await take(first, 20)
        assert first.owned == names
        # The runtime is done with positions 0..2 of every partition; the rest is in flight.
        first_moves.done = dict.fromkeys(names, 2)
        first_moves.revoke_delay = 0.5  # the revocation waits on in-flight work

        async def poll(source: KafkaSource, into: list[Message]) -> None:
            while True:
                into.extend(await source.fetch(100, 0.1))

        await second.start(second_moves)
        pollers = [
            asyncio.create_task(poll(first, seen["first"])),
            asyncio.create_task(poll(second, seen["second"])),
        ]
        try:
            async with asyncio.timeout(60):
                moving = True
                while moving:
                    await asyncio.sleep(0.1)
                    moving = not second.owned or len(first.owned) + len(second.owned) != 4
        finally:
            for poller in pollers:
                poller.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)
        moved = second.owned
        assert first.owned == names - moved
        assert len(moved) == 2  # cooperative-sticky: a fair share moves, the rest stays
        assert ("revoked", sorted(moved)) in first_moves.moves
        assert second_moves.moves == [("assigned", sorted(moved))]
        # The second member starts right after what the first committed on revocation.
        handed = [(m.partition, m.position) for m in seen["second"]]
        assert {(p, min(pos for q, pos in handed if q == p)) for p, _ in handed} == {
            (p, 3) for p in moved
        }
        assert len(handed) == 4
        moved_numbers = {int(p.rsplit("/", 1)[1]) for p in moved}
        assert committed(kafka_broker, group, topic, 4) == dict.fromkeys(moved_numbers, 3)
        # A commit of a partition this member gave up is not sent.
        await first.commit(dict.fromkeys(moved, 4))
        assert committed(kafka_broker, group, topic, 4) == dict.fromkeys(moved_numbers, 3)
    finally:
        await first.close()
        await second.close()


@pytest.mark.asyncio
async def test_closing_revokes_through_the_runtime_so_its_done_prefix_commits(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 2)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(4)], partition=0)
    source = source_of(kafka_broker, topic, group)
    moves = await started(source)
    await take(source, 4)
    moves.done = {f"{topic}/0": 1}
    await source.close()
    assert moves.moves[-1] == ("revoked", [f"{topic}/0", f"{topic}/1"])
    assert committed(kafka_broker, group, topic, 2) == {0: 2}
    await source.close()  # closing twice does nothing
    with pytest.raises(RuntimeError, match="closed"):
        await source.fetch(1, 0.1)


@pytest.mark.asyncio
async def test_closes_while_the_groups_join_is_under_way_all_return(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    # A close made while the join's answer is on its way used to have librdkafka
    # serve the assignment inside its close, where the assignment call is never
    # answered (librdkafka#4884), holding the interpreter's lock: the process froze.
    # Thirty-six closes spread over the join froze it in most runs; in a process of its
    # own, so that a freeze fails this test instead of stopping the suite.
    topic = unique("joins")
    create_topic(kafka_broker, topic, 2)
    closer = Path(__file__).with_name("kafka_closer.py")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(closer),
        kafka_broker.bootstrap,
        topic,
        "36",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            signal_child(process)
            await process.wait()
    assert process.returncode == 0, output.decode(errors="replace")[-4000:]


@pytest.mark.asyncio
async def test_a_revocation_that_raises_is_logged_with_its_message(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 1)
    produce(kafka_broker, topic, [(None, order(0))], partition=0)
    source = source_of(kafka_broker, topic, group)
    moves = await started(source)
    await take(source, 1)
    moves.done = {f"{topic}/0": -1}  # the commit of the revocation refuses it
    with caplog.at_level(logging.ERROR, "statifier.fronts.kafka"):
        await source.close()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        f"revoked ['{topic}/0'] failed: ValueError: a Kafka position is an offset >= 0" in line
        for line in said
    ), said
    assert committed(kafka_broker, group, topic, 1) == {}


@pytest.mark.asyncio
async def test_a_revocation_outlasting_the_rebalance_timeout_lets_the_partitions_go(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 1)
    produce(kafka_broker, topic, [(None, order(n)) for n in range(2)], partition=0)
    source = source_of(kafka_broker, topic, group, rebalance_timeout=0.5)
    moves = await started(source)
    await take(source, 2)
    moves.done = {f"{topic}/0": 1}
    moves.revoke_delay = 2.0  # the runtime's in-flight work does not finish in time
    started_at = time.monotonic()
    await source.close()
    assert time.monotonic() - started_at < 1.9
    assert f"revoked ['{topic}/0'] took over 0.5s" in caplog.text
    assert source.owned == frozenset()
    async with asyncio.timeout(10):
        while not moves.revocations_ended:  # noqa: ASYNC110 - polls the runtime's state
            await asyncio.sleep(0.05)
    assert committed(kafka_broker, group, topic, 1) == {}  # the late commit was not sent


@pytest.mark.asyncio
async def test_a_commit_that_does_not_reach_the_broker_raises(tmp_path: Path) -> None:
    broker = start_kafka_broker(tmp_path)  # its own: this test stops it
    try:
        topic = unique("orders")
        create_topic(broker, topic, 1)
        produce(broker, topic, [(None, order(1))], partition=0)
        source = source_of(broker, topic, unique("g"), settings={**FAST_GROUP, **SHORT_WAITS})
        await started(source)
        await take(source, 1)
    finally:
        stop_kafka_broker(broker)
    try:
        started_at = time.monotonic()
        with pytest.raises(CommitFailed, match="the commit failed"):
            await source.commit({f"{topic}/0": 0})
        assert time.monotonic() - started_at < 30
    finally:
        await source.close()


def test_the_source_refuses_what_it_cannot_run() -> None:
    def make(**options: Any) -> KafkaSource:
        settings = {"group": "g", "topics": ["orders"], "source": "orders", "scope": "acme"}
        return KafkaSource("127.0.0.1:1", **{**settings, **options})

    with pytest.raises(ConfigError, match="topics"):
        make(topics=[])
    with pytest.raises(ConfigError, match="topics"):
        make(topics=["a/b"])
    with pytest.raises(ConfigError, match="group"):
        make(group="")
    with pytest.raises(ConfigError, match="exactly one of scope and scope_of"):
        make(scope_of=header_scope("tenant"))
    with pytest.raises(ConfigError, match="exactly one of scope and scope_of"):
        make(scope=None)
    with pytest.raises(ConfigError, match="positive"):
        make(max_payload=0)
    with pytest.raises(ConfigError, match=r"\['enable.auto.commit'\]"):
        make(settings={"enable.auto.commit": True})
    assert make(settings={"auto.offset.reset": "latest"}).settings["auto.offset.reset"] == "latest"


@pytest.mark.asyncio
async def test_a_dead_letter_is_a_record_with_its_reason_in_headers(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic = unique("dead")
    create_topic(kafka_broker, topic, 1)
    sink = KafkaDeadLetters(kafka_broker.bootstrap, topic)
    at = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)
    await sink.put(
        DeadLetterEntry("kafka:g", "orders/3", 41, "orders/3/41", "malformed: x", b"{x", at)
    )
    await sink.put(DeadLetterEntry("kafka:g", "orders/3", 42, None, "r" * 2000, b"", at))
    await sink.close()
    records = read_records(kafka_broker, topic, 2)
    first, second = records
    assert (first.key(), first.value()) == (b"orders/3/41", b"{x")
    assert dict(first.headers() or []) == {
        "statifier.source": b"kafka:g",
        "statifier.partition": b"orders/3",
        "statifier.position": b"41",
        "statifier.reason": b"malformed: x",
        "statifier.at": b"2026-09-19T08:00:00+00:00",
    }
    assert second.key() is None
    reason = dict(second.headers() or [])["statifier.reason"]
    assert isinstance(reason, bytes)
    assert len(reason.decode()) == 1000
    assert reason.decode().endswith("…")
    with pytest.raises(ConfigError):
        KafkaDeadLetters(kafka_broker.bootstrap, "no/slashes")


@pytest.mark.asyncio
async def test_a_dead_letter_topic_whose_brokers_do_not_answer_logs_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    caplog.set_level(logging.DEBUG, "statifier.fronts.kafka")
    # Refused connections every 10-50 ms: dozens within the put's 3 s.
    fast = {"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50}
    sink = KafkaDeadLetters(nowhere, unique("dead"), timeout=3.0, settings=fast)
    at = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)
    letter = DeadLetterEntry("kafka:g", "orders/0", 7, "orders/0/7", "malformed: x", b"{", at)
    try:
        with pytest.raises(DeadLetterNotKept, match="no acknowledgement"):
            await sink.put(letter)
    finally:
        await sink.close()
    lines = [r for r in caplog.records if r.name == "statifier.fronts.kafka"]
    # Each kind of line once within the interval (30 s, longer than the put and the
    # close): the client's errors and librdkafka's own lines, not one per connection
    # attempt (the lines of one kind differ only in their numbers).
    kinds = Counter((r.levelname, re.sub(r"\d+", "N", r.getMessage())) for r in lines)
    assert kinds, "nothing said of the brokers that do not answer"
    assert max(kinds.values()) == 1, kinds.most_common(3)


def _join_and_leave(broker: KafkaBroker, topic: str, group: str, stop: threading.Event) -> None:
    """A second member of ``group``: joins, polls (so the group can move partitions to
    it) without committing anything, and leaves once ``stop`` is set."""
    member = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **FAST_GROUP,
            "logger": logging.getLogger("tests.kafka"),
        }
    )
    member.subscribe([topic])
    try:
        while not stop.is_set():
            member.poll(0.1)
    finally:
        member.close()


@pytest.mark.asyncio
async def test_a_paused_partition_revoked_and_assigned_back_is_read_again(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
) -> None:
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 2)
    count = 500  # more than the first turns can drain before both partitions show
    for partition in (0, 1):
        produce(kafka_broker, topic, [(None, order(n)) for n in range(count)], partition=partition)
    names = {f"{topic}/0", f"{topic}/1"}
    source = source_of(kafka_broker, topic, group, partition_buffer=5)
    moves = await started(source)
    seen: list[tuple[str, int]] = []

    async def pull_until(done: Callable[[], bool], max_messages: int = 1) -> None:
        async with asyncio.timeout(60):
            while not done():
                fetched = await source.fetch(max_messages, 0.2)
                seen.extend((m.partition, m.position) for m in fetched)
                if not max_messages:
                    await asyncio.sleep(0.05)  # polled (the rebalance runs in a poll)

    stop = threading.Event()
    second: asyncio.Future[None] | None = None
    try:
        # One message at a time: both partitions' buffers fill past 5 and are paused.
        await pull_until(lambda: {p for p, _ in seen} == names)
        # A second member joins: one paused partition is revoked and moves to it ...
        second = asyncio.ensure_future(
            asyncio.to_thread(_join_and_leave, kafka_broker, topic, group, stop)
        )
        # Polled, nothing taken: the buffers stay full and the partitions paused.
        await pull_until(lambda: len(source.owned) == 1, max_messages=0)
        [moved] = names - source.owned
        assert ("revoked", [moved]) in moves.moves
        before = {n for p, n in seen if p == moved}
        assert len(before) < count  # it was paused with records left unread
        mark = len(seen)
        # ... and back when it leaves. Nothing was committed, so every record of it
        # comes again: librdkafka kept its pause, which the revocation lifted.
        stop.set()
        await second

        def all_read() -> bool:
            again = {n for p, n in seen[mark:] if p == moved}
            return source.owned == names and again == set(range(count))

        await pull_until(all_read, max_messages=100)
        assert moves.moves.count(("assigned", [moved])) == 1
        [kept] = names - {moved}
        assert {n for p, n in seen if p == kept} == set(range(count))
    finally:
        stop.set()
        if second is not None:
            await second
        await source.close()


@pytest.mark.asyncio
async def test_a_source_whose_brokers_do_not_answer_says_so_and_logs_a_few_lines(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{probe.getsockname()[1]}"
    caplog.set_level(logging.DEBUG, "statifier.fronts.kafka")
    source = KafkaSource(
        nowhere,
        group=unique("g"),
        topics=["orders"],
        source="orders",
        scope="acme",
        settings={"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50},
    )
    heard: list[Any] = []
    telemetry.attach("trouble", "statifier.fronts.trouble", lambda n, m, meta: heard.append(meta))
    await started(source)
    try:
        async with asyncio.timeout(30):
            while source.trouble() is None:
                await source.fetch(10, 0.2)
        assert source.trouble() == "no broker answers"
        for _ in range(25):  # 5 s of polls, about a hundred refused connections
            await source.fetch(10, 0.2)
    finally:
        telemetry.detach("trouble")
        await source.close()
    assert heard == [{"source": source.name, "trouble": "no broker answers"}]
    lines = [r for r in caplog.records if r.name == "statifier.fronts.kafka"]
    assert len(lines) <= 12, [r.getMessage() for r in lines]
    assert not any(nowhere in str(getattr(r, "source", "")) for r in lines)
    # A source on a broker that answers has no trouble.
    topic = unique("orders")
    create_topic(kafka_broker, topic, 1)
    healthy = source_of(kafka_broker, topic, unique("g"))
    await started(healthy)
    try:
        async with asyncio.timeout(30):
            while not healthy._links.reported:
                await healthy.fetch(10, 0.2)
        assert healthy.trouble() is None
    finally:
        await healthy.close()


@pytest.mark.asyncio
async def test_a_consumer_whose_paused_partition_moves_away_and_back_steps_each_record_once(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    router_db: RouterDb,
) -> None:
    topic, group = unique("hits"), unique("g")
    create_topic(kafka_broker, topic, 2)
    count = 150
    for partition in (0, 1):
        records = []
        for n in range(count):
            message_id = f"{partition}-{n}"
            data = {"kind": "hit", "key": f"k{partition}-{n % 5}", "message_id": message_id}
            records.append((None, json.dumps(data).encode()))
        produce(kafka_broker, topic, records, partition=partition)
    source = KafkaSource(
        kafka_broker.bootstrap,
        group=group,
        topics=[topic],
        source=SOURCE,
        scope=SCOPE,
        message_id=lambda record: json.loads(record.value)["message_id"],
        partition_buffer=5,
        settings=FAST_GROUP,
    )
    router = router_of(router_db)
    consumer = StreamConsumer(
        router, source, lanes=2, batch_size=2, max_in_flight=8, commit_interval=0.05
    )
    running = asyncio.create_task(consumer.run())
    stop = threading.Event()
    second: asyncio.Future[None] | None = None
    try:
        async with asyncio.timeout(60):
            while consumer.counts.routed < 40:  # noqa: ASYNC110 - polls the consumer's state
                await asyncio.sleep(0.02)
        second = asyncio.ensure_future(
            asyncio.to_thread(_join_and_leave, kafka_broker, topic, group, stop)
        )
        async with asyncio.timeout(60):
            while len(source.owned) != 1:  # noqa: ASYNC110 - polls the source's state
                await asyncio.sleep(0.02)
        stop.set()
        await second
        async with asyncio.timeout(90):
            while len(source.owned) != 2 or len(await _stepped(router)) < 2 * count:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert source.trouble() is None
    finally:
        stop.set()
        if second is not None:
            await second
        await consumer.stop()
        await running
    stepped = await _stepped(router)
    assert stepped == Counter({f"{p}-{n}": 1 for p in (0, 1) for n in range(count)})


async def _stepped(router: Router) -> Counter[str]:
    rows = await ledger(router)
    return Counter(
        str(row.message_id) for row in rows if row.outcome in ("created_and_delivered", "delivered")
    )
