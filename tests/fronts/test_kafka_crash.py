"""Crash test of the Kafka front: two consumer processes in one consumer group share a
four-partition topic on a real broker (Tansu) and route 20,000 keyed hits into
counters on PostgreSQL; one is SIGKILLed mid-stream, the group gives its partitions to
the other once its session runs out, and it is started again and rejoins.

Afterwards every hit is stepped into its key's execution exactly once, in the key's
partition order (a redelivery is answered ``duplicate``); a poison hit went to the
dead-letter topic after its attempts and a malformed record at once; and all along, no
partition's committed offset passed a record whose delivery had not committed (a
watcher compares the group's offsets with the ledger and the dead-letter topic several
times a second, the moments after the kill included).

Then two consumer processes stopped by SIGTERM (one after the other, and together)
right after their last hit leave every partition committed to its end, each within
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
from confluent_kafka import Consumer, TopicPartition
from tests.child_processes import signal_child
from tests.fronts.kafka_broker import (
    KafkaBroker,
    committed,
    create_topic,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    unique,
)
from tests.persistence.conftest import SqlStore, postgresql_store  # noqa: F401 - fixture
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, SCOPE
from tests.router.test_races import COUNTER, count_of, counter_router, logged_messages

from statifier.router import address, ledger
from statifier.sql.names import TableNames

WORKER = Path(__file__).with_name("kafka_worker.py")
PARTITIONS = 4
KEYS = 200
HITS = 20_000
KILL_AFTER = 6_000
"""Hits stepped before the first worker is killed."""
DEADLINE = 150.0
POISON_AT, MALFORMED_AT = 4_000, 9_000


@dataclass(frozen=True)
class Published:
    """One record as the topic stored it; ``message_id`` and ``key`` are the hit's
    (``None`` for the malformed record, ``key`` ``None`` for the poison one)."""

    partition: int
    offset: int
    message_id: str | None
    key: str | None


@dataclass
class Watch:
    """What the offset watcher saw."""

    checks: int = 0
    violations: list[str] = field(default_factory=list)
    stepped: int = 0


def _records() -> list[tuple[bytes | None, bytes, str | None, str | None]]:
    """``(record key, value, hit message id, hit key)`` in producing order: the hits,
    a poison hit and a malformed value among them."""
    records: list[tuple[bytes | None, bytes, str | None, str | None]] = []
    for n in range(HITS):
        if n == POISON_AT:
            poison = {"kind": "poison", "key": "k000", "message_id": "poison"}
            records.append((b"k000", json.dumps(poison).encode(), "poison", None))
        if n == MALFORMED_AT:
            records.append((b"k001", b'{"kind": "hit", "key": ', None, None))
        key = f"k{n % KEYS:03d}"
        message_id = f"hit-{n:05d}"
        hit = {"kind": "hit", "key": key, "message_id": message_id}
        records.append((key.encode(), json.dumps(hit).encode(), message_id, key))
    return records


def _produce(broker: KafkaBroker, topic: str) -> list[Published]:
    records = _records()
    placed = produce(broker, topic, [(key, value) for key, value, _, _ in records])
    return [
        Published(partition, offset, message_id, key)
        for (partition, offset), (_, _, message_id, key) in zip(placed, records, strict=True)
    ]


def inbound_id(topic: str, record: Published) -> str:
    return f"{topic}/{record.partition}/{record.offset}"


@dataclass
class Worker:
    process: asyncio.subprocess.Process
    output: IO[bytes]
    log: Path


@dataclass(frozen=True)
class Run:
    """What the workers of one run share."""

    db: RouterDb
    broker: KafkaBroker
    chart: Path
    topic: str
    group: str
    dead_letters: str
    logs: Path

    async def start(self, name: str) -> Worker:
        options = self.db.store.tables.options
        job = {
            "brokers": self.broker.bootstrap,
            "database": self.db.store.url,
            "prefix": options.prefix,
            "schema": options.schema,
            "chart": str(self.chart),
            "topic": self.topic,
            "group": self.group,
            "dead_letters": self.dead_letters,
        }
        log = self.logs / f"{name}-{uuid.uuid4().hex[:6]}.log"
        output = log.open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), json.dumps(job), stdout=output, stderr=output
        )
        return Worker(process, output, log)


def _bytes(value: str | bytes | None) -> bytes:
    return value.encode() if isinstance(value, str) else value or b""


class DeadLetterTail:
    """Reads the dead-letter topic as it grows: the ``(partition, position)`` of every
    letter, and the letters themselves. Each :meth:`read` reads up to the topic's end
    as of its call: a letter acknowledged before then is in what it returns."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        self._reader = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": unique("r"),
                "logger": logging.getLogger("tests.kafka"),
            }
        )
        self._partition = TopicPartition(topic, 0, 0)
        self._reader.assign([self._partition])
        self._read_to = 0
        self.letters: list[dict[str, bytes]] = []

    def read(self) -> set[tuple[str, int]]:
        # A letter is acknowledged before its record's offset is committed, so the end
        # read here, after the offsets, covers every letter below them. Fetching only
        # what arrives within a moment could miss one still on its way to this reader.
        _, end = self._reader.get_watermark_offsets(self._partition, timeout=10)
        deadline = time.monotonic() + 30
        while self._read_to < end:
            assert time.monotonic() < deadline, f"dead letters not read to {end}"
            for record in self._reader.consume(500, 0.1):
                offset = record.offset()
                if record.error() is None and offset is not None:
                    self._read_to = offset + 1
                    headers = record.headers() or []
                    pairs = headers.items() if isinstance(headers, dict) else headers
                    letter = {name: _bytes(value) for name, value in pairs}
                    letter["key"] = record.key() or b""
                    self.letters.append(letter)
        return {
            (letter["statifier.partition"].decode(), int(letter["statifier.position"]))
            for letter in self.letters
        }

    def close(self) -> None:
        self._reader.close()


async def _offsets(run: Run) -> dict[int, int]:
    return await asyncio.to_thread(committed, run.broker, run.group, run.topic, PARTITIONS)


async def _ledgered(db: RouterDb) -> set[str]:
    names = TableNames.of(db.store.tables)
    async with db.adapter.transaction() as tx:
        cursor = await tx.driver.execute(f"SELECT message_id FROM {names.routing_ledger}")
        return {row[0] for row in await cursor.fetchall()}


async def _watch(run: Run, published: list[Published], tail: DeadLetterTail, watch: Watch) -> None:
    """Check, again and again, that every record below a partition's committed offset
    is in the ledger or dead-lettered. The offsets are read first: what the ledger and
    the dead-letter topic hold a moment later only grows."""
    while True:
        offsets = await asyncio.to_thread(committed, run.broker, run.group, run.topic, PARTITIONS)
        ledgered = await _ledgered(run.db)
        dead = await asyncio.to_thread(tail.read)
        watch.stepped = len(ledgered)
        for record in published:
            if record.offset >= offsets.get(record.partition, 0):
                continue
            name = inbound_id(run.topic, record)
            if name in ledgered or (f"{run.topic}/{record.partition}", record.offset) in dead:
                continue
            watch.violations.append(
                f"{name} ({record.message_id}) committed (offset "
                f"{offsets[record.partition]}) before its delivery committed"
            )
        watch.checks += 1
        if watch.checks % 10 == 0:
            print("watch", watch.checks, watch.stepped, offsets, flush=True)
        await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_consumer_killed_mid_stream_loses_no_hit_and_steps_none_twice(
    pg_db: RouterDb,
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    run = Run(
        pg_db, kafka_broker, chart, unique("hits"), unique("counters"), unique("dead"), tmp_path
    )
    create_topic(kafka_broker, run.topic, PARTITIONS)
    create_topic(kafka_broker, run.dead_letters, 1)
    tail = DeadLetterTail(kafka_broker, run.dead_letters)
    workers: list[Worker] = []
    watch = Watch()
    began = time.monotonic()
    try:
        producing = asyncio.create_task(asyncio.to_thread(_produce, kafka_broker, run.topic))
        workers.append(await run.start("a"))
        workers.append(await run.start("b"))
        published = await producing
        produced_in = time.monotonic() - began
        hits = [r for r in published if r.key is not None]
        watcher = asyncio.create_task(_watch(run, published, tail, watch))

        async with asyncio.timeout(DEADLINE):
            while watch.stepped < KILL_AFTER:  # noqa: ASYNC110 - the workers step them
                await asyncio.sleep(0.05)
            signal_child(workers[0].process, signal.SIGKILL)
            await workers[0].process.wait()
            stepped_at_kill, checks_at_kill = watch.stepped, watch.checks
            killed_at = time.monotonic() - began
            # The survivor takes the dead member's partitions once its session ran out:
            # every partition's offset moves on (or had reached the end).
            ends = {
                p: max(r.offset for r in published if r.partition == p) + 1
                for p in range(PARTITIONS)
            }
            at_kill = await _offsets(run)
            offsets = at_kill
            while any(offsets.get(p, 0) <= at_kill.get(p, 0) < ends[p] for p in ends):
                await asyncio.sleep(0.2)
                offsets = await _offsets(run)
            taken_over_at = time.monotonic() - began
            workers.append(await run.start("a"))
            while offsets != ends:
                await asyncio.sleep(0.2)
                offsets = await _offsets(run)
        done_at = time.monotonic() - began
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        assert watch.checks > checks_at_kill + 5  # the offsets were watched after the kill
        assert watch.violations == []
        assert stepped_at_kill < len(hits), "the kill came after the last hit"

        for worker in workers[1:]:
            signal_child(worker.process, signal.SIGTERM)
        for worker in workers[1:]:
            assert await asyncio.wait_for(worker.process.wait(), 30) == 0, worker.log.read_text()
        counts = [json.loads(w.log.read_text().splitlines()[-1]) for w in workers[1:]]
        dead = await asyncio.to_thread(tail.read)
    finally:
        await _put_down(workers)
        tail.close()

    router = counter_router(pg_db)
    rows = await ledger(router)
    assert {r.outcome for r in rows} <= {"created_and_delivered", "delivered", "duplicate"}
    stepped = Counter(
        r.message_id for r in rows if r.outcome in ("created_and_delivered", "delivered")
    )
    assert stepped == Counter(inbound_id(run.topic, r) for r in hits)  # each hit exactly once
    duplicates = sum(1 for r in rows if r.outcome == "duplicate")

    for key in sorted({r.key for r in hits if r.key is not None}):
        found = await address(router, SCOPE, DOCUMENT, key)
        assert found is not None, key
        mine = sorted((r for r in hits if r.key == key), key=lambda r: (r.partition, r.offset))
        assert len({r.partition for r in mine}) == 1  # a key's records share a partition
        expected = [r.message_id for r in mine]
        assert await logged_messages(router, found.execution_id) == expected
        assert await count_of(router, found.execution_id) == len(expected)
    created = [r.execution_id for r in rows if r.outcome == "created_and_delivered"]
    assert len(created) == len(set(created)) == KEYS

    poison = next(r for r in published if r.message_id == "poison")
    malformed = next(r for r in published if r.message_id is None)
    where = {(f"{run.topic}/{r.partition}", r.offset) for r in (poison, malformed)}
    assert dead == where  # a redelivered one may be lettered again: in the same place
    for letter in tail.letters:
        position = int(letter["statifier.position"])
        if position == poison.offset and letter["statifier.partition"].endswith(
            f"/{poison.partition}".encode()
        ):
            assert b"nowhere" in letter["statifier.reason"]
            assert letter["key"] == inbound_id(run.topic, poison).encode()
        else:
            assert letter["statifier.reason"].startswith(b"malformed: the value is not JSON")
    print(
        f"produced in {produced_in:.1f}s, killed at {killed_at:.1f}s after {stepped_at_kill} "
        f"steps, taken over by {taken_over_at:.1f}s, all committed at {done_at:.1f}s; "
        f"duplicates: {duplicates}, watched: "
        f"{watch.checks}, dead letters: {len(tail.letters)}, counts after: {counts}"
    )


STOP_ROUNDS = 3
"""Rounds of each way of stopping: one of three stops used to leave a partition
committed short of its end (a commit cancelled with the consumer's committer landed
after the stop's last one)."""
STOP_WITHIN = 60.0
"""Seconds a consumer process gets to drain, commit and leave the group. A stop may
wait twice for the source's ``commit_timeout`` (10 s): for its last commit (queued
behind the one its committer had on its way), then for the close's commits together
(that commit's answer if it timed out, and the revocation's). Tansu holds a
commit sent while the group rebalances (seen: 6 s), and a stop right after the other
consumer's meets that rebalance: 30 s was once too short in a full suite run. A
stop that does not end in time has its threads' and tasks' stacks in the failure
(a whole process frozen inside librdkafka's close, librdkafka#4884, is why the source
now gives its partitions up before closing the client)."""


@pytest.mark.asyncio
@pytest.mark.parametrize("together", [False, True], ids=["one after the other", "together"])
async def test_two_consumers_stopping_leave_every_partition_committed_to_its_end(
    pg_db: RouterDb,
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    tmp_path: Path,
    together: bool,
) -> None:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    short: list[str] = []
    for _ in range(STOP_ROUNDS):
        run = Run(
            pg_db, kafka_broker, chart, unique("hits"), unique("counters"), unique("dead"), tmp_path
        )
        create_topic(kafka_broker, run.topic, PARTITIONS)
        create_topic(kafka_broker, run.dead_letters, 1)
        published = await asyncio.to_thread(_produce, kafka_broker, run.topic)
        hits = sum(1 for r in published if r.key is not None)
        ends = {
            p: max(r.offset for r in published if r.partition == p) + 1 for p in range(PARTITIONS)
        }
        workers = [await run.start("a"), await run.start("b")]
        try:
            async with asyncio.timeout(DEADLINE):
                # Stopped at once: a commit of the last hits is most likely on its way.
                while await _stepped_of(pg_db, run.topic) < hits:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            for worker in workers:
                signal_child(worker.process, signal.SIGTERM)
                if not together:
                    await _stopped(worker)
            for worker in workers:
                await _stopped(worker)
        finally:
            await _put_down(workers)
        offsets = await _offsets(run)
        if offsets != ends:
            logs = "\n".join(w.log.read_text(errors="replace")[-3000:] for w in workers)
            short.append(f"committed {offsets}, the ends are {ends}:\n{logs}")
    assert short == []


async def _put_down(workers: list[Worker]) -> None:
    """Kill the workers still running and close their logs."""
    for worker in workers:
        if worker.process.returncode is None:
            signal_child(worker.process)
            await worker.process.wait()
        worker.output.close()


async def _stopped(worker: Worker) -> None:
    """Wait for ``worker`` (sent SIGTERM) to exit 0 within :data:`STOP_WITHIN`."""
    try:
        code = await asyncio.wait_for(worker.process.wait(), STOP_WITHIN)
    except TimeoutError:
        await _stacks_of(worker)
        raise AssertionError(f"not stopped: {worker.log.read_text(errors='replace')}") from None
    assert code == 0, worker.log.read_text(errors="replace")


async def _stacks_of(worker: Worker) -> None:
    """Have the stuck ``worker`` write its asyncio tasks' and threads' stacks to its log."""
    for dump in (signal.SIGUSR2, signal.SIGUSR1):
        with contextlib.suppress(ProcessLookupError):  # it exited after all
            signal_child(worker.process, dump)
            await asyncio.sleep(1.0)


async def _stepped_of(db: RouterDb, topic: str) -> int:
    """How many of ``topic``'s records the ledger says were stepped."""
    names = TableNames.of(db.store.tables)
    async with db.adapter.transaction() as tx:
        cursor = await tx.driver.execute(
            f"SELECT count(DISTINCT message_id) FROM {names.routing_ledger} "
            "WHERE message_id LIKE %s AND outcome IN ('created_and_delivered', 'delivered')",
            (f"{topic}/%",),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])
