"""The JetStream source on a real NATS server the suite starts, its leases on SQLite and
PostgreSQL: messages by partition in stream order, AckAll commits of the prefix, a
restart reading on after what was acknowledged, a crashed holder's messages coming
again at once, malformed payloads, and partitions moving between two members."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from tests.fronts.nats_server import NatsServer, nats_server  # noqa: F401 - the fixture
from tests.router.conftest import RouterDb

from statifier.fronts.leases import LeaseChange, PartitionLeases
from statifier.fronts.nats import MESSAGE_ID_HEADER, AcknowledgementFailed, JetStreamSource
from statifier.fronts.source import Malformed, Message
from statifier.router import ConfigError, InboundEvent

PARTITIONS = ("p0", "p1", "p2", "p3")
DEADLINE = 20.0


@dataclass
class Moves:
    """A stand-in for the runtime's rebalance listener: records every move and, on a
    revoke, commits what the test says is done."""

    source: JetStreamSource | None = None
    assigned: list[list[str]] = field(default_factory=list)
    revoked: list[list[str]] = field(default_factory=list)
    done: dict[str, int] = field(default_factory=dict)

    async def on_assigned(self, partitions: Collection[str]) -> None:
        self.assigned.append(sorted(partitions))

    async def on_revoked(self, partitions: Collection[str]) -> None:
        self.revoked.append(sorted(partitions))
        assert self.source is not None
        await self.source.commit({p: self.done[p] for p in partitions if p in self.done})


class _Listener:
    def __init__(self, moves: Moves) -> None:
        self.moves = moves

    async def assigned(self, partitions: Collection[str]) -> None:
        await self.moves.on_assigned(partitions)

    async def revoked(self, partitions: Collection[str]) -> None:
        await self.moves.on_revoked(partitions)


@dataclass
class Stream:
    """A stream of its own for one test, and a client publishing to it."""

    server: NatsServer
    js: JetStreamContext
    name: str
    prefix: str

    async def publish(self, partition: str, payload: bytes, message_id: str | None = None) -> int:
        headers = {MESSAGE_ID_HEADER: message_id} if message_id else None
        ack = await self.js.publish(f"{self.prefix}.{partition}", payload, headers=headers)
        return ack.seq

    async def ack_floor(self, group: str, partition: str) -> int:
        info = await self.js.consumer_info(self.name, f"{group}-{partition}")
        assert info.ack_floor is not None
        return int(info.ack_floor.stream_seq or 0)


@pytest_asyncio.fixture
async def stream(nats_server: NatsServer) -> AsyncIterator[Stream]:  # noqa: F811
    """A fresh stream ``<name>`` over the subjects ``<prefix>.*``."""
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    token = uuid.uuid4().hex[:8]
    name, prefix = f"events_{token}", f"events.{token}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.*"]))
    try:
        yield Stream(nats_server, js, name, prefix)
    finally:
        await js.delete_stream(name)
        await client.close()


class FlakyLeases(PartitionLeases):
    """Leases whose claims fail while ``failing`` is set, as when the database is
    away."""

    failing = False

    async def claim(self) -> LeaseChange:
        if self.failing:
            raise OSError("the database went away")
        return await super().claim()


def leases_of(router_db: RouterDb, owner: str) -> FlakyLeases:
    """Leases of ``owner`` in the group ``billing``, with a 2 s ttl."""
    return FlakyLeases(
        router_db.adapter, group="billing", partitions=PARTITIONS, owner=owner, ttl=2.0
    )


def source_of(
    stream: Stream,
    router_db: RouterDb,
    owner: str,
    *,
    leases: PartitionLeases | None = None,
    **options: object,
) -> JetStreamSource:
    """A source of the test's stream, on ``leases`` or those of :func:`leases_of`."""
    if leases is None:
        leases = leases_of(router_db, owner)
    options.setdefault("pull_wait", 0.3)
    return JetStreamSource(
        stream.server.url,
        leases,
        stream=stream.name,
        subject_prefix=stream.prefix,
        scope="acme",
        source="orders",
        **options,  # type: ignore[arg-type]
    )


async def started(source: JetStreamSource) -> Moves:
    moves = Moves(source)
    await source.start(_Listener(moves))
    return moves


async def fetch_exactly(source: JetStreamSource, count: int) -> list[Message]:
    """``count`` messages, fetched a few at a time, and then no more for a while."""
    taken: list[Message] = []
    async with asyncio.timeout(DEADLINE):
        while len(taken) < count:
            taken.extend(await source.fetch(3, 0.2))
    assert await source.fetch(10, 0.5) == []
    return taken


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (the caller bounds the wait)."""
    while not condition():  # noqa: ASYNC110 - polls state the source does not signal
        await asyncio.sleep(0.05)


async def abandon(source: JetStreamSource) -> None:
    """What a crash leaves: the connection gone, no lease released, nothing closed
    (the leases run out after their ttl)."""
    tasks = [source._claims, *(held.puller for held in source._held.values())]
    for task in tasks:
        assert task is not None
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # type: ignore[arg-type]
    assert source._client is not None
    await source._client.close()


def order(payload: dict[str, object]) -> bytes:
    return json.dumps(payload).encode()


def by_partition(messages: Sequence[Message]) -> dict[str, list[int]]:
    positions: dict[str, list[int]] = {}
    for message in messages:
        positions.setdefault(message.partition, []).append(message.position)
    return positions


def events_of(messages: Sequence[Message]) -> list[InboundEvent]:
    events = [message.event for message in messages]
    assert all(isinstance(event, InboundEvent) for event in events), events
    return [event for event in events if isinstance(event, InboundEvent)]


@pytest.mark.asyncio
async def test_messages_come_by_partition_in_stream_order(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    published: dict[str, list[int]] = {}
    for n in range(12):
        partition = PARTITIONS[n % 3]
        message_id = f"order-{n}" if n % 2 else None
        seq = await stream.publish(partition, order({"n": n}), message_id)
        published.setdefault(partition, []).append(seq)
    source = source_of(stream, router_db, "a")
    moves = await started(source)
    try:
        assert moves.assigned == [list(PARTITIONS)]
        messages = await fetch_exactly(source, 12)
    finally:
        await source.close()
    assert by_partition(messages) == published
    for message in messages:
        event = message.event
        assert isinstance(event, InboundEvent)
        n = event.data["n"]
        assert isinstance(n, int)
        expected_id = f"order-{n}" if n % 2 else f"{stream.name}/{message.position}"
        assert (event.scope, event.source, event.message_id) == ("acme", "orders", expected_id)
        assert message.raw == order({"n": n})
    assert source.name == f"nats:{stream.name}"


@pytest.mark.asyncio
async def test_a_commit_acknowledges_the_prefix_and_a_restart_reads_on_after_it(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    for n in range(10):
        await stream.publish(PARTITIONS[n % 2], order({"n": n}))
    first = source_of(stream, router_db, "a")
    await started(first)
    try:
        messages = await fetch_exactly(first, 10)
        p0, p1 = by_partition(messages)["p0"], by_partition(messages)["p1"]
        await first.commit({"p0": p0[2]})
        await first.commit({"p0": p0[1]})  # behind the acknowledgement: nothing to do
        with pytest.raises(ValueError, match="never handed over"):
            await first.commit({"p1": p1[-1] + 1})
        assert await stream.ack_floor("billing", "p0") == p0[2]
        assert await stream.ack_floor("billing", "p1") == 0
    finally:
        await first.close()

    second = source_of(stream, router_db, "a")
    await started(second)
    try:
        again = await fetch_exactly(second, len(p0) - 3 + len(p1))
        assert by_partition(again) == {"p0": p0[3:], "p1": p1}
        await second.commit({"p0": p0[-1], "p1": p1[-1]})
    finally:
        await second.close()
    assert await stream.ack_floor("billing", "p0") == p0[-1]
    assert await stream.ack_floor("billing", "p1") == p1[-1]


@pytest.mark.asyncio
async def test_a_failing_acknowledgement_turns_trouble_red_until_one_succeeds(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    for n in range(2):
        await stream.publish("p0", order({"n": n}))
    source = source_of(stream, router_db, "a")
    await started(source)
    try:
        first, second = await fetch_exactly(source, 2)
        client = source._client
        assert client is not None
        request = client.request

        async def unanswered(subject: str, payload: bytes = b"", **options: Any) -> Any:
            raise TimeoutError

        client.request = unanswered  # type: ignore[method-assign,assignment]
        with pytest.raises(AcknowledgementFailed):
            await source.commit({"p0": first.position})
        assert source.trouble() == "acknowledgements failing: TimeoutError"
        client.request = request  # type: ignore[method-assign]
        await source.commit({"p0": second.position})
        assert source.trouble() is None
        assert await stream.ack_floor("billing", "p0") == second.position
    finally:
        await source.close()


@pytest.mark.asyncio
async def test_a_crashed_holders_unacknowledged_messages_come_again_at_once(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    seqs = [await stream.publish("p2", order({"n": n})) for n in range(6)]
    crashed = source_of(stream, router_db, "a", ack_wait=120.0)
    await started(crashed)
    messages = await fetch_exactly(crashed, 6)
    await crashed.commit({"p2": seqs[1]})
    await abandon(crashed)

    later = source_of(stream, router_db, "b", ack_wait=120.0)
    await started(later)  # the leases of "a" may still be live: claims take them later
    try:
        again = await fetch_exactly(later, 4)  # long before the ack wait of 120 s
    finally:
        await later.close()
    assert [m.position for m in again] == seqs[2:]
    assert [m.raw for m in again] == [m.raw for m in messages[2:]]


@pytest.mark.asyncio
async def test_a_redelivery_of_a_message_still_held_is_not_handed_over_twice(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    seqs = [await stream.publish("p1", order({"n": n})) for n in range(3)]
    source = source_of(stream, router_db, "a", ack_wait=0.5)
    await started(source)
    try:
        await fetch_exactly(source, 3)
        assert await source.fetch(10, 1.5) == []  # the server redelivered meanwhile
        await source.commit({"p1": seqs[-1]})
        assert await stream.ack_floor("billing", "p1") == seqs[-1]
    finally:
        await source.close()


@pytest.mark.asyncio
async def test_payloads_that_are_no_event_are_malformed(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    payloads = [
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"n": 1', "not JSON"),
        (b"[1, 2]", "not an object: list"),
        (b"[" * 130 + b"]" * 130, "deeper"),
        (order({"pad": "x" * 400}), "bytes, over the 300"),
        (order({"n": 2}), None),
    ]
    for payload, _ in payloads:
        await stream.publish("p3", payload)
    await stream.publish("p3", order({"n": 3}), "x" * 1_100)
    source = source_of(stream, router_db, "a", max_payload=300)
    await started(source)
    try:
        messages = await fetch_exactly(source, len(payloads) + 1)
    finally:
        await source.close()
    for message, (payload, reason) in zip(messages, payloads, strict=False):
        assert message.raw == payload
        if reason is None:
            assert isinstance(message.event, InboundEvent)
        else:
            assert isinstance(message.event, Malformed), message.event
            assert reason in message.event.reason
    long_id = messages[-1].event
    assert isinstance(long_id, Malformed)
    assert "message_id is longer" in long_id.reason


@pytest.mark.asyncio
async def test_partitions_move_between_two_members_after_the_first_commits(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    published = {
        p: [await stream.publish(p, order({"p": p, "n": n})) for n in range(3)] for p in PARTITIONS
    }
    a = source_of(stream, router_db, "a", claim_interval=0.3)
    moves_a = await started(a)
    b = source_of(stream, router_db, "b", claim_interval=0.3)
    try:
        first = await fetch_exactly(a, 12)
        # "a" is done with the first two of each partition; b's arrival takes two away.
        moves_a.done = {p: published[p][1] for p in PARTITIONS}
        moves_b = await started(b)
        async with asyncio.timeout(DEADLINE):
            await until(lambda: len(b.held) == 2)
        assert moves_a.assigned == [list(PARTITIONS)]
        assert moves_a.revoked == [["p2", "p3"]]
        assert moves_b.assigned[-1] == ["p2", "p3"]
        assert a.held == {"p0", "p1"}
        assert b.held == {"p2", "p3"}
        moved = await fetch_exactly(b, 2)
        assert by_partition(moved) == {"p2": published["p2"][2:], "p3": published["p3"][2:]}
        assert await a.fetch(10, 0.3) == []
        assert by_partition(first) == published
        for p in ("p2", "p3"):
            assert await stream.ack_floor("billing", p) == published[p][1]
    finally:
        await b.close()
        await a.close()


@pytest.mark.asyncio
async def test_a_member_whose_claims_fail_stops_reading_before_its_leases_run_out(
    stream: Stream,
    router_db: RouterDb,
) -> None:
    seqs = [await stream.publish("p0", order({"n": n})) for n in range(3)]
    leases = leases_of(router_db, "a")
    source = source_of(stream, router_db, "a", leases=leases, claim_interval=0.3)
    moves = await started(source)
    try:
        await fetch_exactly(source, 3)
        moves.done = {"p0": seqs[0]}
        leases.failing = True
        async with asyncio.timeout(2.0):  # within the ttl
            await until(lambda: not source.held)
        assert moves.revoked == [list(PARTITIONS)]
        assert await stream.ack_floor("billing", "p0") == 0  # fenced: no acknowledgement
        leases.failing = False
        again = await fetch_exactly(source, 3)  # taken up again, from the ack floor
        assert [m.position for m in again] == seqs
        assert moves.assigned == [list(PARTITIONS), list(PARTITIONS)]
    finally:
        await source.close()


@pytest.mark.asyncio
async def test_names_that_are_no_subject_token_are_refused(
    router_db: RouterDb,
) -> None:
    def build(partitions: Sequence[str], stream: str, prefix: str) -> JetStreamSource:
        leases = PartitionLeases(router_db.adapter, group="g", partitions=partitions, owner="a")
        return JetStreamSource(
            "nats://127.0.0.1:1",
            leases,
            stream=stream,
            subject_prefix=prefix,
            scope="s",
            source="o",
        )

    with pytest.raises(ConfigError, match="partition"):
        build(["a.b"], "events", "events")
    with pytest.raises(ConfigError, match="stream"):
        build(["0"], "ev ents", "events")
    with pytest.raises(ConfigError, match="prefix"):
        build(["0"], "events", "events.*")
    with pytest.raises(ConfigError, match="pull_batch"):
        JetStreamSource(
            "nats://127.0.0.1:1",
            PartitionLeases(router_db.adapter, group="g", partitions=["0"], owner="a"),
            stream="events",
            subject_prefix="events",
            scope="s",
            source="o",
            pull_batch=0,
        )
