"""A Kafka commit is bounded in time: a commit the coordinator does not answer raises
:class:`~statifier.fronts.kafka.CommitFailed` after ``commit_timeout`` instead of
holding the consumer, the commits queued behind it wait their turn within the same
bound (and are not sent once given up), the polls go on meanwhile, readiness and
telemetry say that commits keep failing, and a late answer is logged, never taken for a
later commit's (where it set an offset back, the newer offset is committed again). A
close waits for all its commits together within one ``commit_timeout``.

Against the real broker: the broker is killed (``SIGKILL``, its member session still
alive) while a consumer commits; the commit fails within its bound, the consumer logs
it and the source's trouble and telemetry report the outage; the broker is started
again on the same storage, and every event is stepped exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from tests.fronts.kafka_broker import (
    FAST_GROUP,
    KafkaBroker,
    committed,
    create_topic,
    kafka_broker,  # noqa: F401 - the fixture
    produce,
    start_kafka_broker,
    stop_kafka_broker,
    unique,
)
from tests.fronts.object_store import ObjectStore, object_store, s3_environment
from tests.fronts.test_consumer import router_of
from tests.router.conftest import RouterDb
from tests.router.racing_router import SCOPE, SOURCE

from statifier import telemetry
from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.kafka import CommitFailed, KafkaSource
from statifier.router import ConfigError, Failed, InboundEvent, Planned, Routed, Router, ledger

BOUND = 2.0
"""The commit timeout of these tests, in seconds."""
SLACK = 1.0
"""What a failing commit may take beyond its bound (the loop's and the thread's turns)."""


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    yield from object_store()


class _Stuck:
    """A consumer whose first ``blocking`` commits block until ``release`` is set (as
    librdkafka's can, for ever, when the coordinator is killed); everything else is the
    real consumer's."""

    def __init__(self, consumer: Consumer, blocking: int = 1) -> None:
        self.consumer = consumer
        self.blocking = blocking
        self.release = threading.Event()
        self.commits: list[list[TopicPartition]] = []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        assert not asynchronous
        self.commits.append(offsets)
        if len(self.commits) <= self.blocking:
            self.release.wait(30)
        return self.consumer.commit(offsets=offsets, asynchronous=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


@pytest.mark.asyncio
async def test_an_unanswered_commit_fails_in_time_and_its_late_answer_is_only_logged(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.fronts.kafka")
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 1)
    name = f"{topic}/0"
    source = _bounded_source(kafka_broker, topic, group)
    heard: list[Any] = []
    telemetry.attach("commits", "statifier.fronts.trouble", lambda n, m, meta: heard.append(meta))
    await source.start(_Nothing())
    stuck = _Stuck(source._consumer)  # type: ignore[arg-type]
    source._consumer = stuck  # type: ignore[assignment]
    try:
        async with asyncio.timeout(30):
            while name not in source.owned or not source._links.reported:
                await source.fetch(10, 0.2)
        assert source.trouble() is None
        # The first commit is not answered; the second waits behind it, within its
        # own bound, and once given up it is never sent.
        began = time.monotonic()
        failed = await asyncio.gather(
            source.commit({name: 4}), source.commit({name: 6}), return_exceptions=True
        )
        assert BOUND <= time.monotonic() - began < BOUND + SLACK
        assert [type(error) for error in failed] == [CommitFailed, CommitFailed]
        assert f"did not answer the commit within {BOUND:g} s" in str(failed[0])
        assert [[tp.offset for tp in offsets] for offsets in stuck.commits] == [[5]]
        # The consumer's thread is free: a fetch polls and returns at once.
        polled = time.monotonic()
        assert await source.fetch(10, 0.1) == []
        assert time.monotonic() - polled < 1.0
        assert (source.trouble() or "").startswith("commits failing for"), source.trouble()
        # The next commit runs on a new thread, not behind the unanswered one.
        await source.commit({name: 7})
        assert committed(kafka_broker, group, topic, 1) == {0: 8}
        assert source.trouble() is None
        # The unanswered commit's late answer is logged, never taken for another's. It
        # committed its older offset after the newer one, which is committed again.
        stuck.release.set()
        async with asyncio.timeout(5):
            while "committing" not in caplog.text or len(stuck.commits) < 3:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            while source._restoring:  # noqa: ASYNC110 - the commit made again
                await asyncio.sleep(0.02)
        assert "answered late" in caplog.text
        assert f"committing ['{name}'] again: a late answer set them back" in caplog.text
        assert [[tp.offset for tp in offsets] for offsets in stuck.commits] == [[5], [8], [8]]
        assert committed(kafka_broker, group, topic, 1) == {0: 8}
    finally:
        telemetry.detach("commits")
        stuck.release.set()
        await source.close()
    assert heard == [
        {"source": source.name, "trouble": "commits failing"},
        {"source": source.name, "trouble": None},
    ]


class _Revoking:
    """A runtime whose revocation commits ``position``, as the consumer's commits its
    done prefix, and keeps what that commit raised."""

    def __init__(self, source: KafkaSource, name: str, position: int) -> None:
        self.source, self.name, self.position = source, name, position
        self.failures: list[CommitFailed] = []

    async def assigned(self, partitions: Any) -> None:
        pass

    async def revoked(self, partitions: Any) -> None:
        try:
            await self.source.commit({self.name: self.position})
        except CommitFailed as failed:
            self.failures.append(failed)
            raise


@pytest.mark.asyncio
async def test_a_close_waits_for_all_its_commits_together_within_the_commit_timeout(
    kafka_broker: KafkaBroker,  # noqa: F811 - the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A commit given up on before the close and never answered takes the close's whole
    time for its commits: the revocation's commit inside the close is then not sent
    (it would hold the consumer's thread, as the unanswered one holds the commit
    thread), and the close ends within one ``commit_timeout`` and the group leave,
    not one for each commit and the client's close bound on top."""
    caplog.set_level(logging.INFO, "statifier.fronts.kafka")
    topic, group = unique("orders"), unique("g")
    create_topic(kafka_broker, topic, 1)
    name = f"{topic}/0"
    source = _bounded_source(kafka_broker, topic, group, rebalance_timeout=4 * BOUND)
    runtime = _Revoking(source, name, 9)
    await source.start(runtime)
    stuck = _Stuck(source._consumer, blocking=2)  # type: ignore[arg-type]
    source._consumer = stuck  # type: ignore[assignment]
    try:
        async with asyncio.timeout(30):
            while name not in source.owned:
                await source.fetch(10, 0.2)
        with pytest.raises(CommitFailed, match="did not answer"):
            await source.commit({name: 4})
        began = time.monotonic()
        await source.close()
        took = time.monotonic() - began
    finally:
        stuck.release.set()
    assert took < BOUND + SLACK + 2.0, took  # the commits' time, then the group leave
    assert "a commit is still unanswered" in caplog.text
    assert [str(failed) for failed in runtime.failures] == [
        f"{source.name}: not sent: the close's {BOUND:g} s for its commits are spent"
    ]
    assert [[tp.offset for tp in offsets] for offsets in stuck.commits] == [[5]]
    assert "did not close within" not in caplog.text


def _bounded_source(broker: Any, topic: str, group: str, **options: Any) -> KafkaSource:
    """A source of ``topic`` whose commits wait at most ``BOUND``."""
    return KafkaSource(
        broker.bootstrap,
        group=group,
        topics=[topic],
        source="orders",
        scope="acme",
        commit_timeout=BOUND,
        settings=FAST_GROUP,
        **options,
    )


def test_the_commit_timeout_is_positive() -> None:
    with pytest.raises(ConfigError, match="commit_timeout"):
        KafkaSource("127.0.0.1:1", group="g", topics=["t"], source="s", scope="a", commit_timeout=0)


class _Nothing:
    async def assigned(self, partitions: Any) -> None:
        pass

    async def revoked(self, partitions: Any) -> None:
        pass


class _Gate:
    """A router's ``route_many`` that waits while the gate is shut."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.open = asyncio.Event()
        self.open.set()
        self.route_many = router.route_many

    async def __call__(self, events: Sequence[InboundEvent | Planned]) -> list[Routed | Failed]:
        await self.open.wait()
        return list(await self.route_many(events))


def _hits(first: int, count: int) -> list[tuple[bytes | None, bytes]]:
    records: list[tuple[bytes | None, bytes]] = []
    for n in range(first, first + count):
        data = {"kind": "hit", "key": f"k{n % 5}", "message_id": f"m{n}"}
        records.append((f"k{n % 5}".encode(), json.dumps(data).encode()))
    return records


async def _stepped(router: Router) -> Counter[str]:
    rows = await ledger(router)
    return Counter(
        str(row.message_id) for row in rows if row.outcome in ("created_and_delivered", "delivered")
    )


@pytest.mark.asyncio
async def test_a_broker_killed_mid_commit_fails_the_commit_in_time_and_loses_no_event(
    store: ObjectStore,
    router_db: RouterDb,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    environment = s3_environment(store)
    broker = start_kafka_broker(tmp_path, storage="s3://tansu/", environment=environment)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    topic, group = unique("hits"), unique("g")
    caplog.set_level(logging.WARNING, "statifier")
    router = router_of(router_db)
    gate = _Gate(router)
    router.route_many = gate  # type: ignore[method-assign,assignment]
    # A session long enough that the member still owns its partitions, and commits,
    # after the kill.
    settings = {**FAST_GROUP, "session.timeout.ms": 6000, "reconnect.backoff.max.ms": 500}
    source = KafkaSource(
        broker.bootstrap,
        group=group,
        topics=[topic],
        source=SOURCE,
        scope=SCOPE,
        message_id=lambda record: json.loads(record.value)["message_id"],
        commit_timeout=BOUND,
        settings=settings,
    )
    consumer = StreamConsumer(router, source, lanes=2, commit_interval=0.05)
    heard: list[Any] = []
    telemetry.attach("killed", "statifier.fronts.trouble", lambda n, m, meta: heard.append(meta))
    running: asyncio.Task[None] | None = None
    try:
        create_topic(broker, topic, 2)
        await asyncio.to_thread(produce, broker, topic, _hits(0, 20))
        running = asyncio.create_task(consumer.run())
        async with asyncio.timeout(60):
            while consumer.counts.committed < 20:  # noqa: ASYNC110 - the consumer's state
                await asyncio.sleep(0.05)
        gate.open.clear()
        await asyncio.to_thread(produce, broker, topic, _hits(20, 20))
        async with asyncio.timeout(30):
            while len(source._buffers) + consumer._acks.pending() < 20:  # noqa: ASYNC110
                await asyncio.sleep(0.05)

        # Killed while the member's session is alive; the events settle and the
        # consumer commits them at once.
        offsets = await asyncio.to_thread(committed, broker, group, topic, 2)
        done = {f"{topic}/{number}": offset - 1 for number, offset in offsets.items()}
        broker.process.kill()
        broker.process.wait()
        killed = time.monotonic()
        assert set(done) <= source.owned
        gate.open.set()
        with pytest.raises(CommitFailed):
            await source.commit(done)  # committed already: harmless
        assert time.monotonic() - killed < BOUND + SLACK
        # The consumer's commits fail too: it logs them (once per interval), and the
        # source's readiness and telemetry say so.
        async with asyncio.timeout(BOUND + 5):
            while "commits failing" not in [meta["trouble"] for meta in heard]:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        async with asyncio.timeout(BOUND + 5):
            while not any(  # noqa: ASYNC110 - the log
                "a commit failed" in r.getMessage() and "CommitFailed" in r.getMessage()
                for r in caplog.records
            ):
                await asyncio.sleep(0.02)
        assert source.trouble() is not None
        async with asyncio.timeout(10):
            while consumer.counts.routed < 40:  # noqa: ASYNC110 - the consumer's state
                await asyncio.sleep(0.05)
        assert consumer.counts.committed == 20

        broker = start_kafka_broker(
            tmp_path, port=port, storage="s3://tansu/", environment=environment
        )
        await asyncio.to_thread(produce, broker, topic, _hits(40, 20))
        async with asyncio.timeout(90):
            while len(await _stepped(router)) < 60 or source.trouble() is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        await consumer.stop()
        await asyncio.wait_for(running, 30)
        assert sum(committed(broker, group, topic, 2).values()) == 60
    finally:
        telemetry.detach("killed")
        gate.open.set()
        if running is not None and not running.done():
            await consumer.stop()
            await running
        stop_kafka_broker(broker, grace=0)
    stepped = await _stepped(router)
    assert stepped == Counter({f"m{n}": 1 for n in range(60)})
    troubles = [meta["trouble"] for meta in heard]
    assert "commits failing" in troubles
    assert troubles[-1] is None, troubles
