"""Crash test of the JetStream front: two consumer processes share four partitions by
lease and route 20,000 keyed hits into counters on PostgreSQL while a publisher fills
the stream; one is SIGKILLed mid-stream, its partitions are taken over by the other
once its leases run out, and it is started again and takes its share back.

Afterwards every hit is stepped into its key's execution exactly once, in the key's
stream order (a redelivery is answered ``duplicate``); a poison hit was dead-lettered
after its attempts and a malformed payload at once; and all along, no partition's ack
floor passed a message whose delivery had not committed (a watcher compares the floors
with the ledger several times a second, the moments after the kill included).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from tests.child_processes import signal_child
from tests.fronts.nats_server import NatsServer, nats_server  # noqa: F401 - the fixture
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, SCOPE
from tests.router.test_races import COUNTER, count_of, counter_router, logged_messages

from statifier.fronts.dead_letters import TableDeadLetters
from statifier.fronts.nats import MESSAGE_ID_HEADER
from statifier.router import address, ledger
from statifier.sql.names import TableNames

WORKER = Path(__file__).with_name("nats_worker.py")
PARTITIONS = ("p0", "p1", "p2", "p3")
GROUP = "counters"
KEYS = 200
HITS = 20_000
KILL_AFTER = 6_000
"""Hits stepped before the first worker is killed."""
TTL = 3.0
DEADLINE = 150.0
POISON_AT, MALFORMED_AT = 4_000, 9_000


@dataclass(frozen=True)
class Published:
    """One message as the stream stored it."""

    partition: str
    seq: int
    message_id: str | None
    key: str | None


@dataclass
class Watch:
    """What the ack-floor watcher saw."""

    checks: int = 0
    violations: list[str] = field(default_factory=list)
    stepped: int = 0
    task: asyncio.Task[None] | None = None


def partition_of(key: str) -> str:
    return PARTITIONS[zlib.crc32(key.encode()) % len(PARTITIONS)]


def _payloads() -> list[tuple[str, bytes, str | None, str | None]]:
    """``(partition, payload, message id, key)`` of the stream, in publishing order:
    the hits, a poison hit and a malformed payload among them."""
    stream: list[tuple[str, bytes, str | None, str | None]] = []
    for n in range(HITS):
        if n == POISON_AT:
            poison = {"kind": "poison", "key": "k000", "message_id": "poison"}
            stream.append((partition_of("k000"), json.dumps(poison).encode(), "poison", None))
        if n == MALFORMED_AT:
            stream.append(("p1", b'{"kind": "hit", "key": ', None, None))
        key = f"k{n % KEYS:03d}"
        message_id = f"hit-{n:05d}"
        hit = {"kind": "hit", "key": key, "message_id": message_id}
        stream.append((partition_of(key), json.dumps(hit).encode(), message_id, key))
    return stream


async def _publish(js: JetStreamContext, prefix: str) -> list[Published]:
    """Publish the stream in chunks of concurrent publishes; the acks' sequences say
    the order the stream holds."""
    published: list[Published] = []
    stream = _payloads()
    for start in range(0, len(stream), 200):
        chunk = stream[start : start + 200]
        acks = await asyncio.gather(
            *(
                js.publish(
                    f"{prefix}.{partition}",
                    payload,
                    headers={MESSAGE_ID_HEADER: message_id} if message_id else None,
                )
                for partition, payload, message_id, _ in chunk
            )
        )
        published.extend(
            Published(partition, ack.seq, message_id, key)
            for (partition, _, message_id, key), ack in zip(chunk, acks, strict=True)
        )
    return published


@dataclass
class Worker:
    process: asyncio.subprocess.Process
    output: IO[bytes]
    log: Path


async def _start(
    db: RouterDb, server: NatsServer, chart: Path, stream: str, prefix: str, owner: str, logs: Path
) -> Worker:
    options = db.store.tables.options
    job = {
        "nats": server.url,
        "database": db.store.url,
        "prefix": options.prefix,
        "schema": options.schema,
        "chart": str(chart),
        "stream": stream,
        "subjects": prefix,
        "partitions": list(PARTITIONS),
        "owner": owner,
        "ttl": TTL,
    }
    log = logs / f"{owner}-{uuid.uuid4().hex[:6]}.log"
    output = log.open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), json.dumps(job), stdout=output, stderr=output
    )
    return Worker(process, output, log)


async def _ack_floors(js: JetStreamContext, stream: str) -> dict[str, int]:
    floors: dict[str, int] = {}
    for partition in PARTITIONS:
        try:
            info = await js.consumer_info(stream, f"{GROUP}-{partition}")
        except nats.js.errors.NotFoundError:
            floors[partition] = 0  # not made yet
            continue
        assert info.ack_floor is not None
        floors[partition] = int(info.ack_floor.stream_seq or 0)
    return floors


async def _stepped(db: RouterDb) -> int:
    """How many distinct messages the ledger holds."""
    names = TableNames.of(db.store.tables)
    async with db.adapter.transaction() as tx:
        cursor = await tx.driver.execute(
            f"SELECT count(DISTINCT message_id) FROM {names.routing_ledger}"
        )
        row = await cursor.fetchone()
    return int(row[0])


async def _holders(db: RouterDb) -> dict[str, str | None]:
    """Each partition's lease holder in the workers' group (``None``: free)."""
    names = TableNames.of(db.store.tables)
    async with db.adapter.transaction() as tx:
        cursor = await tx.driver.execute(
            f"SELECT partition, owner FROM {names.partition_leases} "
            "WHERE consumer_group = %(group)s",
            {"group": GROUP},
        )
        return {row[0]: row[1] for row in await cursor.fetchall()}


async def _pending(db: RouterDb, messages: list[Published]) -> list[Published]:
    """Those of ``messages`` neither in the ledger nor dead-lettered."""
    names = TableNames.of(db.store.tables)
    ids = [m.message_id for m in messages if m.message_id is not None]
    async with db.adapter.transaction() as tx:
        cursor = await tx.driver.execute(
            f"SELECT message_id FROM {names.routing_ledger} WHERE message_id = ANY(%(ids)s)",
            {"ids": ids},
        )
        ledgered = {row[0] for row in await cursor.fetchall()}
        cursor = await tx.driver.execute(
            f"SELECT partition, position FROM {names.consumer_dead_letters}"
        )
        dead = {(row[0], int(row[1])) for row in await cursor.fetchall()}
    return [
        m for m in messages if m.message_id not in ledgered and (m.partition, m.seq) not in dead
    ]


async def _watch(
    js: JetStreamContext, stream: str, db: RouterDb, published: list[Published], watch: Watch
) -> None:
    """Check, again and again, that every message at or below a partition's ack floor
    is in the ledger or dead-lettered. The floors are read first: what the ledger holds
    a moment later only grows, so a message found done once stays so, and each look
    checks only what the floors passed since the last."""
    ordered = sorted(published, key=lambda m: m.seq)
    checked = dict.fromkeys(PARTITIONS, 0)
    while True:
        floors = await _ack_floors(js, stream)
        passed = [m for m in ordered if checked[m.partition] < m.seq <= floors[m.partition]]
        watch.violations.extend(
            f"{m.partition}/{m.seq} ({m.message_id}) acknowledged (floor "
            f"{floors[m.partition]}) before its delivery committed"
            for m in (await _pending(db, passed))[:20]
        )
        checked = {p: max(checked[p], floors[p]) for p in PARTITIONS}
        watch.stepped = await _stepped(db)
        watch.checks += 1
        await asyncio.sleep(0.2)


async def _until(condition: Callable[[], bool | Awaitable[bool]], watch: Watch) -> None:
    """Wait for ``condition``; fail at once when the watcher found a violation."""
    while True:
        assert watch.violations == []
        if watch.task is not None and watch.task.done():
            await watch.task  # it raised: say why
            pytest.fail("the watcher stopped")
        answer = condition()
        if answer if isinstance(answer, bool) else await answer:
            return
        await asyncio.sleep(0.05)  # the workers and the watcher signal nothing


@pytest.mark.asyncio
async def test_a_consumer_killed_mid_stream_loses_no_hit_and_steps_none_twice(
    pg_db: RouterDb,
    nats_server: NatsServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    token = uuid.uuid4().hex[:8]
    stream, prefix = f"hits_{token}", f"hits.{token}"
    client = await nats.connect(nats_server.url)
    js = client.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.*"]))
    workers: list[Worker] = []
    watch = Watch()
    try:
        publishing = asyncio.create_task(_publish(js, prefix))
        workers.append(await _start(pg_db, nats_server, chart, stream, prefix, "a", tmp_path))
        await asyncio.sleep(1.0)
        workers.append(await _start(pg_db, nats_server, chart, stream, prefix, "b", tmp_path))
        published = await publishing
        hits = [m for m in published if m.key is not None]
        watcher = asyncio.create_task(_watch(js, stream, pg_db, published, watch))
        watch.task = watcher

        last = {p: max(m.seq for m in published if m.partition == p) for p in PARTITIONS}

        async def all_acknowledged() -> bool:
            return await _ack_floors(js, stream) == last

        async with asyncio.timeout(DEADLINE):
            await _until(lambda: watch.stepped >= KILL_AFTER, watch)
            signal_child(workers[0].process, signal.SIGKILL)
            await workers[0].process.wait()
            stepped_at_kill = watch.stepped
            checks_at_kill = watch.checks

            async def taken_over() -> bool:  # b holds the dead member's partitions
                return await _holders(pg_db) == dict.fromkeys(PARTITIONS, "b")

            await _until(taken_over, watch)
            workers.append(await _start(pg_db, nats_server, chart, stream, prefix, "a", tmp_path))
            await _until(all_acknowledged, watch)

            async def shared_again() -> bool:  # the restarted member took its share back
                return "a" in (await _holders(pg_db)).values()

            # Checked by its leases, not by what it routed: the survivor may well have
            # routed every message left before the rebalance gave the restarted one any.
            await _until(shared_again, watch)
            checks = watch.checks
            await _until(lambda: watch.checks > checks, watch)  # a last look at the end
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        assert watch.checks > checks_at_kill + 5  # the floors were watched after the kill
        assert watch.violations == []
        assert stepped_at_kill < len(hits), "the kill came after the last hit"

        for worker in workers[1:]:
            signal_child(worker.process, signal.SIGTERM)
        for worker in workers[1:]:
            assert await asyncio.wait_for(worker.process.wait(), 30) == 0, worker.log.read_text()
        counts = [json.loads(w.log.read_text().splitlines()[-1]) for w in workers[1:]]
        assert counts[0]["routed"] > 0  # the survivor routed what the killed one left
    finally:
        if watch.task is not None:
            watch.task.cancel()
            await asyncio.gather(watch.task, return_exceptions=True)
        for worker in workers:
            if worker.process.returncode is None:
                signal_child(worker.process)
                await worker.process.wait()
            worker.output.close()
        await js.delete_stream(stream)
        await client.close()

    router = counter_router(pg_db)
    rows = await ledger(router)
    assert {r.outcome for r in rows} <= {"created_and_delivered", "delivered", "duplicate"}
    stepped = Counter(
        r.message_id for r in rows if r.outcome in ("created_and_delivered", "delivered")
    )
    assert stepped == Counter(m.message_id for m in hits)  # each hit exactly once
    duplicates = sum(1 for r in rows if r.outcome == "duplicate")

    for key in sorted({m.key for m in hits if m.key is not None}):
        found = await address(router, SCOPE, DOCUMENT, key)
        assert found is not None, key
        expected = [m.message_id for m in sorted(hits, key=lambda m: m.seq) if m.key == key]
        assert await logged_messages(router, found.execution_id) == expected
        assert await count_of(router, found.execution_id) == len(expected)
    created = [r.execution_id for r in rows if r.outcome == "created_and_delivered"]
    assert len(created) == len(set(created)) == KEYS

    letters = await TableDeadLetters(pg_db.adapter).entries()
    poison = next(m for m in published if m.message_id == "poison")
    malformed = next(m for m in published if m.message_id is None)
    kinds = {(letter.partition, letter.position) for letter in letters}
    assert kinds == {(poison.partition, poison.seq), (malformed.partition, malformed.seq)}
    for letter in letters:
        if letter.message_id == "poison":
            assert "nowhere" in letter.reason
        else:
            assert letter.message_id is None
            assert letter.reason.startswith("malformed: the payload is not JSON")
    print(
        f"stepped at the kill: {stepped_at_kill}, duplicates: {duplicates}, "
        f"watched: {watch.checks}, dead letters: {len(letters)}, counts after: {counts}"
    )
