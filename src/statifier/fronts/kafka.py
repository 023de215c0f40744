"""Kafka topics as a :class:`~statifier.fronts.source.Source`, read in a consumer group
through confluent-kafka (librdkafka), and a dead-letter topic.

:class:`KafkaSource` subscribes to its topics in the consumer group ``group``; the
brokers share the topics' partitions among the group's members and move them as
members come and go. Each topic-partition is a source partition named
``<topic>/<partition>``, and a record's offset is its position. Nothing is committed
behind the runtime's back (``enable.auto.commit`` and ``enable.auto.offset.store`` are
off): :meth:`KafkaSource.commit` commits exactly the positions the runtime names, as
Kafka offsets ``position + 1`` (the next record to read), so a member that takes a
partition over starts right after the last record whose delivery committed, and returns
once the group coordinator confirmed.

A commit waits at most ``commit_timeout`` seconds for the coordinator's answer, then
raises :class:`CommitFailed` (the runtime commits again later). librdkafka's
synchronous commit can wait without end when the coordinator disappears without
closing its connections (a killed broker whose member session is still considered
alive), even once the broker is back; so commits run on a thread of their own, one at
a time, and an unanswered one holds neither the consumer's polls nor the event loop.
Once a sent commit's waiter gives up, the next commits run on a new thread; those
already queued behind it wait within their own bounds, and are not sent once given up.
Each commit gets its own answer, so a late one is never taken for a later commit's: it
is only logged. It may set an offset back to an older done position (whose later
records then come again, and the router dedupes them), never past a record not yet
done.

Partition moves reach the runtime's :class:`~statifier.fronts.source.Rebalance`. The
assignment strategy is ``cooperative-sticky`` by default: a rebalance revokes only the
partitions that move. A revocation runs ``Rebalance.revoked`` to its end (in-flight
messages done, the gapless prefix of done messages committed) before librdkafka gives
the partitions up; partitions *lost* (the member was dropped from the group, its
session ran out) are revoked too, but their commits are not sent, since another member
may already read them. A commit for a partition the source no longer owns is skipped for the same
reason: its next owner starts from the last commit that was made while it was owned.

A record becomes an :class:`~statifier.router.InboundEvent`:

- ``message_id``: ``<topic>/<partition>/<offset>``, stable across redeliveries, unless
  the host passes its own ``message_id`` function of the :class:`KafkaRecord` (a
  producer's event id in a header, say).
- ``scope``: the configured ``scope``, or what ``scope_of`` returns for the record
  (:func:`header_scope` reads it from a header).
- ``data``: the value, a JSON object of at most ``max_payload`` bytes, parsed strictly
  (UTF-8, RFC 8259, nesting bounded by :data:`~statifier.expr.jsontext.MAX_JSON_DEPTH`);
  or what the host's ``decode`` makes of the value's bytes (Avro, say), held to the
  same values (:mod:`statifier.fronts.normalize`).

A host whose producers put the id, the scope or the source elsewhere (an envelope in
the value) passes ``normalize``, a function of the :class:`KafkaRecord` and the decoded
data answering :class:`~statifier.fronts.normalize.Normalized`; ``scope_of`` and
``message_id`` are its shorthands, so it takes the place of both.

A record without a value, over the bound, undecodable, not an object, or whose id or
scope cannot be had (the host's function raised or returned an unusable value) is a
:class:`~statifier.fronts.source.Malformed` message: the runtime dead-letters it.

confluent-kafka's consumer blocks, so every call on it but the commits runs on one
thread the source owns, in order; the commits run on the commit thread (librdkafka
takes calls from several threads). A rebalance callback, which librdkafka runs inside a
poll, waits there for the runtime, whose ``Rebalance.revoked`` commits through the
commit thread: its commits reach the broker before the partitions are given up. The
event loop never blocks.

librdkafka queues each partition's fetched records together, a whole backlog at a
time, so one busy partition could fill the runtime's in-flight budget while the others
wait. The source therefore reads ahead into a buffer per partition, pauses a partition
whose buffer holds ``partition_buffer`` messages (librdkafka then drops its queued
records and fetches them again on resume, from the first not handed over), and hands
messages over taking turns between the partitions. librdkafka keeps a partition's pause
across a revocation, so a paused partition is resumed before it is given up: assigned
back to this member later, it is read again.

librdkafka's statistics, every second, tell whether a broker of the cluster is
reachable and whether the member is a steady member of its group:
:meth:`KafkaSource.trouble` reads them (for ``/readyz``), and the source reports
``statifier.fronts.trouble`` when its brokers stop and start answering. The client's
errors and its own log lines go to this module's logger once per kind and interval
(:class:`~statifier.repeats.Repeats`): a cluster that does not answer writes a few
lines, not one per connection attempt.

>>> source = KafkaSource("127.0.0.1:9092", group="billing", topics=["orders"],
...                      source="orders", scope="acme")
>>> source.name
'kafka:billing'
>>> source.settings["partition.assignment.strategy"], source.settings["enable.auto.commit"]
('cooperative-sticky', False)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from statifier.expr import Value
from statifier.extras import MissingExtra
from statifier.fronts.dead_letters import DeadLetterEntry, cut
from statifier.fronts.normalize import Decode, Normalize, Normalized, decoded, normalized_event
from statifier.fronts.source import Malformed, Message, Rebalance
from statifier.repeats import Repeats
from statifier.router import ConfigError, InboundEvent
from statifier.telemetry import report

try:
    import confluent_kafka
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
except ModuleNotFoundError as missing:  # confluent-kafka: the kafka extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "DEFAULT_COMMIT_TIMEOUT",
    "DEFAULT_MAX_PAYLOAD",
    "RESERVED_SETTINGS",
    "CommitFailed",
    "DeadLetterNotKept",
    "KafkaDeadLetters",
    "KafkaRecord",
    "KafkaSource",
    "KafkaSourceFailed",
    "header_scope",
    "partition_name",
    "record_id",
]

DEFAULT_MAX_PAYLOAD: Final = 1_048_576
"""The largest record value decoded by default: 1 MiB."""
RESERVED_SETTINGS: Final = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "partition.assignment.strategy",
        "error_cb",
        "on_commit",
        "logger",
        "stats_cb",
        "statistics.interval.ms",
    }
)
"""librdkafka settings the source sets itself; ``settings`` may not name them."""
_TOPIC: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")
DEFAULT_COMMIT_TIMEOUT: Final = 10.0
"""The most seconds :meth:`KafkaSource.commit` waits for the coordinator by default."""
_CHUNK: Final = 64
"""Records taken from librdkafka's queue at a time, between checks of the bound."""
_STATS_EVERY_MS: Final = 1000
"""How often librdkafka reports its brokers' and group's states (for readiness)."""
_LEAVE_POLL: Final = 0.1
"""Seconds each poll of a close waits while the partitions are given up."""
OUT_OF_GROUP_AFTER: Final = 30.0
"""Seconds a member may hold no partition while it is not a steady member of its group
(no coordinator, or a join or rebalance under way) before :meth:`KafkaSource.trouble`
says so."""
_log = logging.getLogger(__name__)

T = TypeVar("T")


class KafkaSourceFailed(Exception):  # noqa: N818 - names the failure
    """The client reported an error it cannot recover from (librdkafka's *fatal*
    errors); the source reads no more. The message is the client's."""


class CommitFailed(Exception):  # noqa: N818 - names the failure
    """A commit did not reach the group coordinator: the partitions' records after
    their last commit may come again (the router dedupes them)."""


class DeadLetterNotKept(Exception):  # noqa: N818 - names the failure
    """The dead-letter topic did not confirm a letter within the timeout."""


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """A record as read, handed to the host's ``normalize``, ``message_id`` and
    ``scope_of`` functions.

    Attributes:
        topic, partition, offset: where it sits.
        key: the record's key (``None`` when it has none).
        value: the record's value, at most ``max_payload`` bytes.
        headers: the record's headers in order (a name may repeat).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, ``None`` when absent."""
        found = None
        for header, value in self.headers:
            if header == name:
                found = value
        return found


MessageIdOf = Callable[[KafkaRecord], str]
"""How the host names a record: the same id on every redelivery of it."""
ScopeOf = Callable[[KafkaRecord], str]
"""How the host scopes a record; raises (any exception) when it cannot."""


def partition_name(topic: str, partition: int) -> str:
    """The source partition of a topic-partition: ``<topic>/<partition>``.

    >>> partition_name("orders", 3)
    'orders/3'
    """
    return f"{topic}/{partition}"


def record_id(record: KafkaRecord) -> str:
    """The default message id: ``<topic>/<partition>/<offset>``."""
    return f"{record.topic}/{record.partition}/{record.offset}"


def header_scope(header: str) -> ScopeOf:
    """A ``scope_of`` reading the scope from ``header`` (UTF-8); a record without it
    is malformed.

    >>> scope_of = header_scope("tenant")
    >>> scope_of(KafkaRecord("t", 0, 7, None, b"{}", (("tenant", b"acme"),)))
    'acme'
    """

    def scope_of(record: KafkaRecord) -> str:
        value = record.header(header)
        if value is None:
            raise LookupError(f"no {header!r} header")
        return value.decode("utf-8")

    return scope_of


def _shorthand(
    scope_of: ScopeOf | None, message_id: MessageIdOf | None
) -> Normalize[KafkaRecord] | None:
    """``scope_of`` and ``message_id`` as the one ``normalize`` they are shorthands
    for (``None`` when neither is given); the data is handed back untouched."""
    if scope_of is None and message_id is None:
        return None

    def normalize(record: KafkaRecord, data: dict[str, Value]) -> Normalized:
        return Normalized(
            data,
            scope=None if scope_of is None else scope_of(record),
            message_id=None if message_id is None else message_id(record),
        )

    return normalize


def _topic_partition(name: str) -> tuple[str, int]:
    topic, _, number = name.rpartition("/")
    if not topic or not number.isdigit():
        raise ValueError(f"{name!r} is not a Kafka source partition (<topic>/<partition>)")
    return topic, int(number)


# The thread that calls the consumer.


@dataclass(eq=False)
class _Job:
    """One call to make on the consumer's thread, and the future that gets its answer."""

    call: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    urgent: bool

    def run(self) -> None:
        try:
            result = self.call()
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting task
            self._answer(None, error)
        else:
            self._answer(result, None)

    def _answer(self, result: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if error is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(error)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            self.loop.call_soon_threadsafe(settle)


class _ConsumerThread:
    """A thread that makes calls on a consumer, one at a time, in order.

    Jobs run in the order given. An *urgent* job (a commit made while the consumer
    closes) may also run inside a running job, at the points where that job calls
    :meth:`serve_urgent`: while a rebalance callback waits for the runtime. confluent-kafka
    allows such calls because they come from the thread already in the consumer.
    """

    def __init__(self, name: str) -> None:
        self._ready = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call(self, call: Callable[[], T], *, urgent: bool = False) -> asyncio.Future[T]:
        """Queue ``call`` for the thread; the future gets its answer on this loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._ready:
            if self._stopping:
                raise RuntimeError("the Kafka consumer is closed")
            self._jobs.append(_Job(call, loop, future, urgent))
            self._ready.notify_all()
        return future

    def stop(self) -> None:
        """Run what is queued, then end the thread (returns at once)."""
        with self._ready:
            self._stopping = True
            self._ready.notify_all()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def serve_urgent(self) -> None:
        """Run the urgent jobs queued now (called on the thread)."""
        while True:
            with self._ready:
                job = next((job for job in self._jobs if job.urgent), None)
                if job is None:
                    return
                self._jobs.remove(job)
            job.run()

    def serve_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Serve urgent jobs until ``done()`` (call :meth:`wake` when it may have
        become true) or ``timeout`` seconds passed; returns whether it is done."""
        deadline = time.monotonic() + timeout
        while True:
            self.serve_urgent()
            with self._ready:
                if done():
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if not any(job.urgent for job in self._jobs):
                    self._ready.wait(left)

    def _run(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._jobs) or self._stopping)
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            job.run()


# The source.


_REACHABLE_BROKERS: Final = frozenset({"configured", "learned"})
"""The brokers of librdkafka's statistics that are the cluster's (not its internal
and logical ones)."""


@dataclass(frozen=True, slots=True)
class _Links:
    """What librdkafka's statistics said last: whether a connection to a broker of the
    cluster is up, since when the member has not been a steady member of its group
    (``None``: it is one), the group's join state, and how many reports came."""

    reported: bool = False
    brokers_up: bool = True
    outside_since: float | None = None
    join_state: str | None = None
    reports: int = 0

    def seen(self, stats: Mapping[str, Any], now: float) -> _Links:
        """The links after one report of statistics, at monotonic ``now``."""
        brokers = stats.get("brokers")
        up = isinstance(brokers, dict) and any(
            isinstance(broker, dict)
            and broker.get("source") in _REACHABLE_BROKERS
            and broker.get("state") == "UP"
            for broker in brokers.values()
        )
        group = stats.get("cgrp")
        steady = (
            isinstance(group, dict)
            and group.get("state") == "up"
            and group.get("join_state") == "steady"
        )
        if steady:
            outside = None
        elif self.outside_since is not None:
            outside = self.outside_since
        else:
            outside = now
        joining = group.get("join_state") if isinstance(group, dict) else None
        return _Links(
            reported=True,
            brokers_up=up,
            outside_since=outside,
            join_state=joining if isinstance(joining, str) else None,
            reports=self.reports + 1,
        )


@dataclass
class _Buffers:
    """Messages polled and not handed over yet, by partition, each in its order.

    A fetch takes them in turns between the partitions, so one partition's backlog
    does not hold the others' back (librdkafka queues a partition's fetched records
    together, a whole backlog at a time). A fetch that was cancelled leaves its
    messages here for the next one.
    """

    partitions: dict[str, deque[Message]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.partitions.values())

    def add(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self.partitions.setdefault(message.partition, deque()).append(message)

    def sizes(self) -> dict[str, int]:
        return {name: len(queue) for name, queue in self.partitions.items()}

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages, one of each partition in turn."""
        taken: list[Message] = []
        while len(taken) < count:
            before = len(taken)
            for queue in self.partitions.values():
                if queue and len(taken) < count:
                    taken.append(queue.popleft())
            if len(taken) == before:
                break
        return taken

    def drop(self, partitions: Collection[str]) -> None:
        for name in partitions:
            self.partitions.pop(name, None)


class KafkaSource:
    """Kafka topics read in a consumer group (see the module docstring).

    Args:
        brokers: the bootstrap servers, ``host:port[,host:port...]``.
        group: the consumer group's id; its members share the topics' partitions.
        topics: the topics to read.
        source: the source name of every event (bindings are chosen by it).
        scope: the scope of every event; or
        scope_of: a function answering a record's scope (exactly one of the two,
            unless ``normalize`` is given: then ``scope`` is the scope of the records
            it answers none for).
        message_id: a function answering a record's message id; by default
            :func:`record_id`.
        decode: a function reading a value's bytes as a mapping (an Avro reader, say);
            what it answers is held to JSON values, and a value it cannot read (it
            raises) is malformed. By default the one JSON rule.
        normalize: a function of the :class:`KafkaRecord` and the decoded data
            answering :class:`~statifier.fronts.normalize.Normalized`: the data, and
            the scope, message id and source it reads from the record (``None`` for
            the source's own). It takes the place of ``scope_of`` and ``message_id``.
        max_payload: the largest value, in bytes, decoded; a larger one is malformed.
            A value ``decode`` reads is held to it again as JSON text.
        assignment: librdkafka's ``partition.assignment.strategy``:
            ``cooperative-sticky`` (incremental rebalances) or an eager one
            (``range``, ``roundrobin``).
        rebalance_timeout: the most seconds a rebalance callback waits for the
            runtime's ``assigned``/``revoked``; after that the partitions move anyway
            (their uncommitted records come again to their next owner). Keep it below
            ``max.poll.interval.ms``.
        commit_timeout: the most seconds :meth:`commit` waits for the coordinator's
            answer (:data:`DEFAULT_COMMIT_TIMEOUT`) before it raises
            :class:`CommitFailed`; also how long commits must have kept failing before
            :meth:`trouble` says so. Keep it below ``rebalance_timeout``, so a
            revocation's commit is answered or given up before its partitions move.
            :meth:`close` waits this long at most for all its commits together.
        partition_buffer: messages of one partition polled and not handed over at
            most before the partition is paused (resumed once they are taken); the
            source holds at most about this many per owned partition, each at most
            ``max_payload`` bytes.
        settings: further librdkafka consumer settings (``session.timeout.ms``, TLS,
            SASL credentials...); never logged. The source's defaults, which these
            override: ``auto.offset.reset=earliest``, ``fetch.wait.max.ms=100``.

    Raises:
        ConfigError: no topic, a topic that is not a Kafka topic name, an empty group,
            not exactly one of ``scope`` and ``scope_of`` (without ``normalize``),
            ``normalize`` beside ``scope_of`` or ``message_id``, a bound or timeout
            that is not positive, or a setting in :data:`RESERVED_SETTINGS`.
    """

    def __init__(
        self,
        brokers: str,
        *,
        group: str,
        topics: Sequence[str],
        source: str,
        scope: str | None = None,
        scope_of: ScopeOf | None = None,
        message_id: MessageIdOf | None = None,
        decode: Decode | None = None,
        normalize: Normalize[KafkaRecord] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        assignment: str = "cooperative-sticky",
        rebalance_timeout: float = 60.0,
        commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
        partition_buffer: int = 1000,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        if not topics or any(not _TOPIC.fullmatch(topic) for topic in topics):
            raise ConfigError(f"Kafka topics are 1-249 of [A-Za-z0-9._-], not {list(topics)!r}")
        if not group:
            raise ConfigError("a Kafka source needs a consumer group")
        if normalize is not None and (scope_of is not None or message_id is not None):
            raise ConfigError(
                "normalize answers a record's scope and message id itself:"
                " pass it or scope_of and message_id, not both"
            )
        if normalize is None and (scope is None) == (scope_of is None):
            raise ConfigError("a Kafka source needs exactly one of scope and scope_of")
        if not max_payload > 0 or not rebalance_timeout > 0 or not partition_buffer > 0:
            raise ConfigError("max_payload, rebalance_timeout and partition_buffer are positive")
        if not commit_timeout > 0:
            raise ConfigError(f"commit_timeout must be positive, not {commit_timeout!r}")
        reserved = sorted(RESERVED_SETTINGS.intersection(settings or {}))
        if reserved:
            raise ConfigError(f"the Kafka source sets {reserved} itself")
        self._group = group
        self._topics = list(topics)
        self._source = source
        self._scope = scope
        self._decode = decode
        self._normalize = normalize or _shorthand(scope_of, message_id)
        self._own_normalize = normalize is None
        """Whether ``_normalize`` is the shorthand of ``scope_of`` and ``message_id``
        (its data needs no second check, and its failure keeps its reason)."""
        self._max_payload = max_payload
        self._rebalance_timeout = rebalance_timeout
        self._commit_timeout = commit_timeout
        self._bound = partition_buffer
        self._settings: dict[str, Any] = {
            "auto.offset.reset": "earliest",
            # A resumed partition's records wait for the fetch in flight: keep it short.
            "fetch.wait.max.ms": 100,
            **(settings or {}),
            "bootstrap.servers": brokers,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": assignment,
        }
        self._consumer: Consumer | None = None
        self._thread: _ConsumerThread | None = None
        self._commits: _ConsumerThread | None = None
        self._unanswered: set[asyncio.Future[Any]] = set()
        """The answers of the commits sent, given up on and not answered yet."""
        self._confirmed: dict[str, int] = {}
        """Per partition, the highest offset the coordinator confirmed committing."""
        self._restoring: set[asyncio.Task[None]] = set()
        """Commits that put back offsets a late answer set back (:meth:`_answered_late`)."""
        self._failing_since: float | None = None
        """When the first of the commits failing since the last that succeeded began
        (monotonic); ``None`` while commits succeed."""
        self._failing_reported = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rebalance: Rebalance | None = None
        self._owned: set[str] = set()
        self._buffers = _Buffers()
        self._paused: set[str] = set()
        """Partitions paused because their buffer is full (touched on the thread only)."""
        self._failure: KafkaError | None = None
        self._closed = False
        self._close_by: float | None = None
        """While closing, when the close's time for its commits runs out (monotonic)."""
        self._moving = 0
        """Partition moves in progress: their callbacks hold the consumer's thread,
        and librdkafka answers the commits they make only there."""
        self._repeats = Repeats()
        self._links = _Links()
        """What librdkafka's statistics last said (written on the thread, read on the
        loop: a frozen value, replaced whole)."""

    @property
    def name(self) -> str:
        """``kafka:<group>``, for logs and telemetry (the settings, which may hold
        credentials, are never logged)."""
        return f"kafka:{self._group}"

    @property
    def settings(self) -> Mapping[str, Any]:
        """The consumer's librdkafka settings (may hold credentials: never log them)."""
        return dict(self._settings)

    @property
    def owned(self) -> frozenset[str]:
        """The partitions this member owns now."""
        return frozenset(self._owned)

    def trouble(self) -> str | None:
        """Why this member cannot read now, for readiness; ``None`` when it can (or
        before librdkafka's first statistics, a second after the start).

        - ``"failed: ..."``: the client reported a fatal error.
        - ``"no broker answers"``: no connection to a broker of the cluster is up (the
          brokers are down or unreachable); until one is again.
        - ``"commits failing for N s"``: every commit for at least ``commit_timeout``
          seconds failed (refused, or not answered in time); until one succeeds. The
          done records are not acknowledged meanwhile: they come again after a
          rebalance or a restart (the router dedupes them).
        - ``"no partition and not in the group for N s"``: the member holds no
          partition and has not been a steady member of its group (it has no group
          coordinator, or its join or a rebalance has not completed) for at least
          :data:`OUT_OF_GROUP_AFTER` seconds. The coordinator gives every partition to
          some steady member, so a member that holds none while it is steady leaves
          nothing unread; one that cannot join may be the reason partitions wait.

        Never names a broker's address or a setting.
        """
        if self._failure is not None:
            return f"failed: {self._failure.name()}"
        links = self._links
        if links.reported and not links.brokers_up:
            return "no broker answers"
        failing = self._failing_since
        if failing is not None and time.monotonic() - failing >= self._commit_timeout:
            return f"commits failing for {time.monotonic() - failing:.0f} s"
        if not links.reported:
            return None
        outside = links.outside_since
        if outside is not None and not self._owned:
            waited = time.monotonic() - outside
            if waited >= OUT_OF_GROUP_AFTER:
                return f"no partition and not in the group for {waited:.0f} s"
        return None

    async def start(self, rebalance: Rebalance) -> None:
        """Create the consumer and subscribe; partitions come with the first polls.

        Raises:
            RuntimeError: started twice.
            KafkaException: librdkafka refused the settings.
        """
        if self._consumer is not None:
            raise RuntimeError(f"{self.name} is started already")
        self._loop = asyncio.get_running_loop()
        self._rebalance = rebalance
        thread = _ConsumerThread(f"statifier {self.name}")
        thread.start()
        self._thread = thread
        self._commits = self._commit_thread()
        self._consumer = await thread.call(self._subscribe)

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        """Up to ``max_messages`` messages of the partitions owned, waiting at most
        ``wait`` seconds for the first.

        Raises:
            KafkaSourceFailed: the client reported a fatal error.
            RuntimeError: not started, or closed.
        """
        thread = self._started()
        if self._failure is not None:
            raise KafkaSourceFailed(self._failure.str())
        # Polled every time (at once when messages are at hand), so that the partitions
        # whose buffers filled are paused and the others' records come through.
        wait = wait if not self._buffers else 0.0
        buffered = self._buffers.sizes()
        polled = thread.call(lambda: self._poll(wait, buffered))
        polled.add_done_callback(self._keep)
        # Shielded: a cancelled fetch leaves what was polled in the buffers.
        await asyncio.shield(polled)
        return self._buffers.take(max_messages)

    async def commit(self, positions: Mapping[str, int]) -> None:
        """Commit, for each owned partition, offset ``position + 1``; a partition not
        owned (revoked, lost) is skipped. Returns once the coordinator confirmed, within
        ``commit_timeout`` seconds (counted from the call: a commit queued behind an
        unanswered one waits for its turn within the same bound).

        Raises:
            CommitFailed: the coordinator refused or did not answer (a rebalance in
                progress, a member fenced out of the group, the brokers unreachable),
                or no answer came within ``commit_timeout``.
            ValueError: a partition name that is not ``<topic>/<partition>``, or a
                negative position.
        """
        self._started()
        offsets = []
        for name, position in positions.items():
            topic, partition = _topic_partition(name)
            if position < 0:
                raise ValueError(f"a Kafka position is an offset >= 0, not {position}")
            if name in self._owned:
                offsets.append(TopicPartition(topic, partition, position + 1))
            else:
                _log.info("%s: not committing %s: it is no longer owned", self.name, name)
        if not offsets:
            return
        began = time.monotonic()
        try:
            answered = await self._commit_in_time(offsets)
        except CommitFailed:
            self._commit_ended(began, failed=True)
            raise
        refused = [f"{tp.topic}/{tp.partition}: {tp.error}" for tp in answered or [] if tp.error]
        if refused:
            self._commit_ended(began, failed=True)
            raise CommitFailed(f"{self.name}: the commit was refused for {refused}")
        for tp in offsets:
            name = partition_name(tp.topic, tp.partition)
            self._confirmed[name] = max(self._confirmed.get(name, 0), tp.offset)
        self._commit_ended(began, failed=False)

    async def _commit_in_time(self, offsets: list[TopicPartition]) -> Any:
        """Hand ``offsets`` to the commit thread (to the consumer's, during a partition
        move or the close) and wait at most ``commit_timeout`` for the coordinator's
        answer (librdkafka's per-partition results)."""
        consumer, commits = self._started_consumer(), self._started_commits()
        bound = self._commit_bound()
        if bound <= 0:
            raise CommitFailed(
                f"{self.name}: not sent: the close's {self._commit_timeout:g} s for its "
                "commits are spent"
            )
        withdrawn, sent = threading.Event(), threading.Event()
        # A commit a partition move makes (a revocation's, in a poll or inside the
        # close) is answered reliably only on the consumer's thread, which the move's
        # callback holds: there it is urgent. Sent from another thread, librdkafka
        # sometimes never answers it.
        urgent = self._closed or self._moving > 0

        def commit_now() -> Any:
            if withdrawn.is_set():  # its waiter gave up before its turn: not sent
                return None
            sent.set()
            return consumer.commit(offsets=offsets, asynchronous=False)

        if urgent:
            answer = self._started().call(commit_now, urgent=True)
        else:
            answer = commits.call(commit_now)
        timed_out = False
        try:
            async with asyncio.timeout(bound):
                return await asyncio.shield(answer)
        except TimeoutError:
            timed_out = True
            raise CommitFailed(
                f"{self.name}: the coordinator did not answer the commit within {bound:g} s"
            ) from None
        except KafkaException as error:
            raise CommitFailed(f"{self.name}: the commit failed: {error.args[0]}") from error
        finally:
            if not answer.done():
                withdrawn.set()
                answer.add_done_callback(self._answered_late)
                # A waiter cancelled (a consumer stopping its committer) says nothing
                # of the coordinator: the next commits queue behind this one, so they
                # reach it after, never before, its older offsets.
                if timed_out and sent.is_set() and not urgent:
                    self._retire(commits, answer)

    def _commit_bound(self) -> float:
        """The seconds a commit made now may wait for its answer: ``commit_timeout``,
        or, while closing, what is left of the close's (never below 0)."""
        if self._close_by is None:
            return self._commit_timeout
        return min(self._commit_timeout, max(0.0, self._close_by - time.monotonic()))

    def _commit_thread(self) -> _ConsumerThread:
        commits = _ConsumerThread(f"statifier {self.name} commits")
        commits.start()
        return commits

    def _retire(self, commits: _ConsumerThread, answer: asyncio.Future[Any]) -> None:
        """Leave ``commits`` to its unanswered call and run the next commits on a new
        thread: librdkafka may never answer that call (it can lose a commit's answer
        when the coordinator is killed), and the commits queued behind it would all
        wait in vain. The call, if answered, may then have committed older offsets
        after newer ones: :meth:`_answered_late` commits the newer ones again."""
        self._unanswered.add(answer)
        answer.add_done_callback(self._unanswered.discard)
        commits.stop()  # ends once its call returns; what is queued behind is withdrawn
        if self._commits is commits:
            self._commits = self._commit_thread()

    def _answered_late(self, answer: asyncio.Future[Any]) -> None:
        """Log the answer of a commit whose waiter gave up. Where it committed an offset
        below one the coordinator confirmed since (its request may have reached the
        coordinator after the newer one's), commit the newer offset again, for the
        partitions still owned: else the records between would come again."""
        if answer.cancelled():
            return
        error = answer.exception()
        if error is None and answer.result() is None:
            return  # withdrawn before its turn: never sent
        said = "" if error is None else f": {error}"
        _log.info(
            "%s: a commit given up on was answered late%s",
            self.name,
            said,
            extra={"source": self.name},
        )
        if error is not None:
            return
        behind = {}
        for tp in answer.result():
            name = partition_name(tp.topic, tp.partition)
            newer = self._confirmed.get(name, 0)
            if tp.error is None and tp.offset < newer and name in self._owned:
                behind[name] = newer - 1
        if behind:
            restoring = asyncio.ensure_future(self._restore(behind))
            self._restoring.add(restoring)
            restoring.add_done_callback(self._restoring.discard)

    async def _restore(self, positions: Mapping[str, int]) -> None:
        """Commit ``positions`` again after a late answer set them back."""
        _log.info(
            "%s: committing %s again: a late answer set them back",
            self.name,
            sorted(positions),
            extra={"source": self.name},
        )
        try:
            await self.commit(positions)
        except (CommitFailed, RuntimeError) as error:
            _log.warning(
                "%s: committing %s again failed (their records may come again): %s",
                self.name,
                sorted(positions),
                error,
                extra={"source": self.name},
            )

    def _commit_ended(self, began: float, *, failed: bool) -> None:
        """Keep whether commits keep failing, for :meth:`trouble`, and report
        ``statifier.fronts.trouble`` when that begins and ends."""
        if not failed:
            self._failing_since = None
            if self._failing_reported:
                self._failing_reported = False
                report("statifier.fronts.trouble", {}, {"source": self.name, "trouble": None})
            return
        if self._failing_since is None:
            self._failing_since = began
        if (
            not self._failing_reported
            and time.monotonic() - self._failing_since >= self._commit_timeout
        ):
            self._failing_reported = True
            metadata = {"source": self.name, "trouble": "commits failing"}
            report("statifier.fronts.trouble", {}, metadata)

    async def close(self) -> None:
        """Leave the group (revoking what is owned through the runtime first, so its
        gapless prefix of done messages is committed) and release the client. What was
        committed stays; closing twice does nothing.

        The close waits for its commits ``commit_timeout`` seconds at most, all of
        them together, counted from the call: a commit sent and not answered yet (then
        the client is closed all the same: librdkafka may never answer it), the
        commits that put back offsets a late answer set back (cut short then, with a
        warning: their records may come again), and the revocation's commits inside
        the close, which run on the consumer's thread (librdkafka answers them only
        there; once that time is spent they are not sent, and the partitions'
        records after their last commit come again to their next owner). The
        client's close itself is waited for at most ``rebalance_timeout +
        commit_timeout``, then left to that thread."""
        if self._closed or self._thread is None:
            return
        self._closed = True
        self._close_by = time.monotonic() + self._commit_timeout
        thread, commits = self._thread, self._commits
        consumer = self._consumer
        try:
            if consumer is not None:
                await self._commits_answered()
                closed = thread.call(lambda: self._leave_and_close(consumer))
                bound = self._rebalance_timeout + self._commit_timeout
                await asyncio.wait([closed], timeout=bound)
                if not closed.done():
                    _log.error(
                        "%s: the client did not close within %g s; going on",
                        self.name,
                        bound,
                        extra={"source": self.name},
                    )
                else:
                    closed.result()
        finally:
            thread.stop()
            if commits is not None:
                commits.stop()
            await asyncio.to_thread(thread.join, 10.0)

    async def _commits_answered(self) -> None:
        """Wait, within the close's time, for the commits sent and not answered, then
        for the commits putting back offsets a late answer set back (cancelled once
        that time is spent)."""
        commits = self._started_commits()
        answers = [*self._unanswered, commits.call(lambda: None)]
        await asyncio.wait(answers, timeout=self._commit_bound())
        if not all(answer.done() for answer in answers):
            _log.warning(
                "%s: a commit is still unanswered %g s into the close; closing the client anyway",
                self.name,
                self._commit_timeout,
                extra={"source": self.name},
            )
        if not self._restoring:
            return
        _, late = await asyncio.wait(set(self._restoring), timeout=self._commit_bound())
        for restoring in late:
            restoring.cancel()
        if late:
            _log.warning(
                "%s: committing again what a late answer set back was cut short by the "
                "close (those records may come again)",
                self.name,
                extra={"source": self.name},
            )

    # On the consumer's thread.

    def _leave_and_close(self, consumer: Consumer) -> None:
        """Give the partitions up and leave the group, then close the client.

        librdkafka can block for ever in a partition move handled inside its own close
        (the client's assignment call in the rebalance callback is never answered:
        confluentinc/librdkafka#4884), and it blocks there holding Python's GIL, so
        the whole process stops and no timeout of this module can fire. A move is
        left for the close to make when partitions are assigned, and also when the
        group's join is under way or its assignment waits for a poll to be served
        (``assignment()`` is empty then). So the moves run before the close, in
        polls: unsubscribe, then poll (which serves an assignment waiting, then the
        revocation, through the runtime) until nothing is assigned and a report of
        the client's statistics made since the unsubscribe says no join is under way
        (``init``), or ``rebalance_timeout`` passed; then close, with nothing left to
        move. A record a poll returns meanwhile is dropped: it was never handed over,
        so it comes again to the partition's next owner."""
        try:
            consumer.unsubscribe()
            deadline = time.monotonic() + self._rebalance_timeout
            since = self._links.reports
            while not (left := self._left(consumer, since)) and time.monotonic() < deadline:
                consumer.poll(_LEAVE_POLL)
            if not left:
                _log.warning(
                    "%s: %d partitions still assigned (the group's join state: %s) %g s "
                    "after leaving the group; closing the client all the same",
                    self.name,
                    len(consumer.assignment()),
                    self._links.join_state,
                    self._rebalance_timeout,
                    extra={"source": self.name},
                )
        finally:  # a client that failed to leave is closed all the same
            consumer.close()

    def _left(self, consumer: Consumer, since: int) -> bool:
        """Whether the member has left its group: nothing assigned, and a report of
        statistics after the ``since``-th says no join is under way."""
        links = self._links
        return links.reports > since and links.join_state == "init" and not consumer.assignment()

    def _subscribe(self) -> Consumer:
        settings = {
            **self._settings,
            "error_cb": self._on_error,
            "logger": _ClientLog(self.name, self._repeats),
            "stats_cb": self._on_stats,
            "statistics.interval.ms": _STATS_EVERY_MS,
        }
        consumer = Consumer(settings)
        consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return consumer

    def _poll(self, wait: float, buffered: Mapping[str, int]) -> list[Message]:
        """The first record within ``wait`` seconds, then whatever else is at hand.

        A partition holding ``partition_buffer`` messages (those ``buffered`` already
        and those read now) is paused, which drops its queued records from librdkafka's
        queue, so the other partitions' records come next; a partition whose buffer
        was taken below the bound is resumed.
        """
        consumer = self._started_consumer()
        held = Counter(buffered)
        self._pause_only(consumer, {name for name, count in held.items() if count >= self._bound})
        first = consumer.poll(max(0.0, wait))
        records: list[confluent_kafka.Message] = [] if first is None else [first]
        while records:
            batch = consumer.consume(_CHUNK, 0)
            if not batch:
                break
            records.extend(batch)
            held.update(partition_name(r.topic() or "", r.partition() or 0) for r in batch)
            full = {name for name, count in held.items() if count >= self._bound}
            if not full <= self._paused:
                self._pause_only(consumer, full | self._paused)
        return [message for record in records if (message := self._message(record))]

    def _pause_only(self, consumer: Consumer, paused: set[str]) -> None:
        """Pause ``paused``, resume the other partitions paused so far."""
        pause, resume = paused - self._paused, self._paused - paused
        try:
            if pause:
                consumer.pause([TopicPartition(*_topic_partition(name)) for name in pause])
            if resume:
                consumer.resume([TopicPartition(*_topic_partition(name)) for name in resume])
        except KafkaException as error:  # a partition revoked meanwhile: next poll again
            _log.info("%s: pausing %s failed: %s", self.name, sorted(pause), error.args[0])
            return
        self._paused = set(paused)

    def _message(self, record: confluent_kafka.Message) -> Message | None:
        error = record.error()
        if error is not None:
            if error.fatal():
                self._failure = error
            elif error.code() != KafkaError._PARTITION_EOF:
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    ("record", error.code()),
                    "%s: %s",
                    self.name,
                    error.str(),
                    extra={"source": self.name, "error": error.name()},
                )
            return None
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        assert topic is not None
        assert partition is not None
        assert offset is not None
        value = record.value()
        raw = value if isinstance(value, bytes) else b""
        name = partition_name(topic, partition)
        return Message(name, offset, self._event(record, topic, partition, offset), raw=raw)

    def _event(
        self, record: confluent_kafka.Message, topic: str, partition: int, offset: int
    ) -> InboundEvent | Malformed:
        value = record.value()
        if not isinstance(value, bytes):
            return Malformed("the record has no value")
        data = decoded(value, self._decode, max_bytes=self._max_payload, what="value")
        if isinstance(data, Malformed):
            return data
        read = KafkaRecord(topic, partition, offset, record.key(), value, _headers(record))
        return normalized_event(
            read,
            data,
            self._normalize,
            scope=self._scope,
            source=self._source,
            message_id=record_id(read),
            max_bytes=self._max_payload,
            failure="no id or scope for the record:" if self._own_normalize else "normalize raised",
            recheck=not self._own_normalize,
        )

    def _on_error(self, error: KafkaError) -> None:
        fields = {"source": self.name, "error": error.name()}
        if error.fatal():
            self._failure = error
            _log.error("%s: fatal: %s", self.name, error.str(), extra=fields)
        else:
            # An unreachable cluster reports every failed connection attempt: one
            # line per kind of error and interval, with the count of the others.
            key = ("client", error.code())
            self._repeats.log(
                _log, logging.WARNING, key, "%s: %s", self.name, error.str(), extra=fields
            )

    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (every second, inside a poll): keep whether a broker
        connection is up and whether the member is a steady member of its group, and
        say when the brokers become unreachable and reachable again."""
        try:
            stats = json.loads(text)
        except ValueError:
            return
        before = self._links
        links = before.seen(stats, time.monotonic())
        self._links = links
        if before.brokers_up and not links.brokers_up:
            _log.warning(
                "%s: no broker answers; reading waits until one does",
                self.name,
                extra={"source": self.name},
            )
            self._report_trouble("no broker answers")
        elif not before.brokers_up and links.brokers_up and before.reported:
            self._report_trouble(None)
            held = self._repeats.forget(("client", KafkaError._ALL_BROKERS_DOWN))
            held += self._repeats.forget(("client", KafkaError._TRANSPORT))
            _log.warning(
                "%s: a broker answers again (%d connection errors held back meanwhile)",
                self.name,
                held,
                extra={"source": self.name, "repeated": held},
            )

    def _report_trouble(self, trouble: str | None) -> None:
        """Report ``statifier.fronts.trouble`` on the loop (this runs on the thread)."""
        loop = self._loop
        if loop is None:
            return
        metadata = {"source": self.name, "trouble": trouble}
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(report, "statifier.fronts.trouble", {}, metadata)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        names = [partition_name(tp.topic, tp.partition) for tp in partitions]
        _log.info("%s: assigned %s", self.name, names)
        if names:
            self._bridge(self._assigned(names), names, "assigned")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        names = [partition_name(tp.topic, tp.partition) for tp in partitions]
        _log.info("%s: revoking %s", self.name, names)
        self._unpause(consumer, names)
        if names:
            self._bridge(self._revoked(names, lost=False), names, "revoked")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        names = [partition_name(tp.topic, tp.partition) for tp in partitions]
        _log.warning("%s: lost %s", self.name, names)
        self._unpause(consumer, names)
        if names:
            self._bridge(self._revoked(names, lost=True), names, "lost")

    def _unpause(self, consumer: Consumer, names: Collection[str]) -> None:
        """Resume the paused ones of ``names`` before they are given up. librdkafka
        keeps a partition's pause across its revocation: a partition assigned back to
        this member later would stay paused, its records never fetched, while the
        source (whose buffer of it is dropped) no longer knows to resume it."""
        paused = sorted(self._paused.intersection(names))
        self._paused.difference_update(names)
        if not paused:
            return
        try:
            consumer.resume([TopicPartition(*_topic_partition(name)) for name in paused])
        except KafkaException as error:
            _log.warning(
                "%s: resuming %s before giving them up failed: %s",
                self.name,
                paused,
                error.args[0],
                extra={"source": self.name},
            )

    def _bridge(self, move: Coroutine[Any, Any, None], names: list[str], what: str) -> None:
        """Run ``move`` on the loop and wait for it here, serving the commits it makes
        while the consumer closes (the others run on the commit thread)."""
        loop, thread = self._loop, self._started()
        assert loop is not None
        if loop.is_closed():
            move.close()
            return
        done = asyncio.run_coroutine_threadsafe(self._moved(move), loop)
        done.add_done_callback(lambda _: thread.wake())
        if not thread.serve_until(done.done, self._rebalance_timeout):
            _log.error(
                "%s: %s %s took over %ss; going on", self.name, what, names, self._rebalance_timeout
            )
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._owned.difference_update, names)
            return
        with contextlib.suppress(concurrent.futures.CancelledError):
            error = done.exception()
            if error is not None:
                _log.error(
                    "%s: %s %s failed: %s: %s",
                    self.name,
                    what,
                    names,
                    type(error).__name__,
                    error,
                    extra={"source": self.name},
                )

    # On the loop.

    async def _moved(self, move: Coroutine[Any, Any, None]) -> None:
        """``move``, its commits sent to the consumer's thread while it runs."""
        self._moving += 1
        try:
            await move
        finally:
            self._moving -= 1

    async def _assigned(self, names: list[str]) -> None:
        self._owned.update(names)
        assert self._rebalance is not None
        await self._rebalance.assigned(names)

    async def _revoked(self, names: list[str], *, lost: bool) -> None:
        if lost:
            self._owned.difference_update(names)
        self._buffers.drop(names)
        try:
            assert self._rebalance is not None
            await self._rebalance.revoked(names)
        finally:
            self._owned.difference_update(names)
            for name in names:
                self._confirmed.pop(name, None)

    def _keep(self, polled: asyncio.Future[list[Message]]) -> None:
        if polled.cancelled() or polled.exception() is not None:
            return
        # A message of a partition revoked while the poll ran is not handed over.
        self._buffers.add([m for m in polled.result() if m.partition in self._owned])

    def _started(self) -> _ConsumerThread:
        if self._thread is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._thread

    def _started_commits(self) -> _ConsumerThread:
        if self._commits is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._commits

    def _started_consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._consumer


class _ClientLog:
    """Where librdkafka's own log lines go (its ``logger`` setting): this module's
    logger, warnings and errors at most one line per facility and level per interval,
    with the count of the others (a broker that does not answer makes librdkafka log
    every failed connection attempt, dozens a second); lines below warning, which only
    librdkafka's ``debug`` setting asks for, all of them."""

    def __init__(self, source: str, repeats: Repeats) -> None:
        self._source = source
        self._repeats = repeats

    def log(self, level: int, message: str, *args: object) -> None:
        # confluent-kafka calls log(level, "%s [%s] %s", facility, client, text).
        fields = {"source": self._source}
        if level < logging.WARNING:  # asked for (librdkafka's ``debug``): all of it
            _log.log(level, message, *args, extra=fields)
            return
        facility = args[0] if args else message
        self._repeats.log(_log, level, ("log", level, facility), message, *args, extra=fields)


def _headers(record: confluent_kafka.Message) -> tuple[tuple[str, bytes | None], ...]:
    read = record.headers() or ()
    pairs = read.items() if isinstance(read, dict) else read
    return tuple(
        (name, value.encode() if isinstance(value, str) else value) for name, value in pairs
    )


# The dead-letter topic.


class KafkaDeadLetters:
    """A :class:`~statifier.fronts.dead_letters.DeadLetters` sink writing each letter
    as one record of ``topic``: the value is the message's raw bytes, the key its
    message id (none when it had none), and headers carry the rest:
    ``statifier.source``, ``statifier.partition``, ``statifier.position``,
    ``statifier.reason`` (cut to :data:`~statifier.fronts.dead_letters.REASON_LIMIT`)
    and ``statifier.at`` (ISO 8601), all UTF-8.

    :meth:`put` returns once the brokers acknowledged the record (``acks=all``, an
    idempotent producer), so a letter the consumer counted done is kept. The topic
    must exist (or the brokers create topics on first use).

    Args:
        brokers: the bootstrap servers.
        topic: the dead-letter topic.
        timeout: the most seconds one :meth:`put` waits for the acknowledgement.
        settings: further librdkafka producer settings; never logged.

    Raises:
        ConfigError: a topic that is not a Kafka topic name, or a timeout that is not
            positive.
    """

    def __init__(
        self,
        brokers: str,
        topic: str,
        *,
        timeout: float = 10.0,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        if not _TOPIC.fullmatch(topic):
            raise ConfigError(f"a Kafka topic is 1-249 of [A-Za-z0-9._-], not {topic!r}")
        if not timeout > 0:
            raise ConfigError(f"timeout must be positive, not {timeout!r}")
        self.topic = topic
        self._name = f"kafka dead letters:{topic}"
        self._timeout = timeout
        # Brokers that do not answer make librdkafka report, and log, every failed
        # connection attempt: one line per kind and interval, as the source's.
        self._repeats = Repeats()
        self._producer = Producer(
            {
                "acks": "all",
                "enable.idempotence": True,
                **(settings or {}),
                "bootstrap.servers": brokers,
                "error_cb": self._on_error,
                "logger": _ClientLog(self._name, self._repeats),
            }
        )
        # Serializes the produce-and-flush of concurrent puts, so each flush waits for
        # its own letter's report.
        self._one_at_a_time = threading.Lock()

    def _on_error(self, error: KafkaError) -> None:
        fields = {"source": self._name, "error": error.name()}
        if error.fatal():
            _log.error("%s: fatal: %s", self._name, error.str(), extra=fields)
            return
        key = ("client", error.code())
        self._repeats.log(
            _log, logging.WARNING, key, "%s: %s", self._name, error.str(), extra=fields
        )

    async def put(self, letter: DeadLetterEntry) -> None:
        """Write ``letter`` to the topic and wait for the brokers' acknowledgement.

        Raises:
            DeadLetterNotKept: the brokers refused it or did not answer in time.
        """
        await asyncio.to_thread(self._send, letter)

    async def close(self) -> None:
        """Wait (at most ``timeout``) for letters still in flight."""
        await asyncio.to_thread(self._producer.flush, self._timeout)

    def _send(self, letter: DeadLetterEntry) -> None:
        headers: list[tuple[str, str | bytes | None]] = [
            ("statifier.source", letter.source.encode()),
            ("statifier.partition", letter.partition.encode()),
            ("statifier.position", str(letter.position).encode()),
            ("statifier.reason", cut(letter.reason).encode()),
            ("statifier.at", letter.at.isoformat().encode()),
        ]
        key = None if letter.message_id is None else letter.message_id.encode()
        reports: list[KafkaError | None] = []
        with self._one_at_a_time:
            try:
                self._producer.produce(
                    self.topic,
                    value=letter.raw,
                    key=key,
                    headers=headers,
                    on_delivery=lambda error, _record: reports.append(error),
                )
            except (KafkaException, BufferError) as error:
                raise DeadLetterNotKept(f"{self.topic}: {error}") from error
            self._producer.flush(self._timeout)
        if not reports:
            raise DeadLetterNotKept(f"{self.topic}: no acknowledgement in {self._timeout}s")
        if reports[0] is not None:
            raise DeadLetterNotKept(f"{self.topic}: {reports[0].str()}")
