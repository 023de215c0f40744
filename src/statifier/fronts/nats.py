"""A NATS JetStream stream as a :class:`~statifier.fronts.source.Source`: one durable
pull consumer per partition subject, partitions shared by lease.

The stream (the operator's; this module creates only consumers) holds the subjects
``<prefix>.<partition>``, one per partition: a publisher puts each event on the
subject of its key's partition. For every partition the source keeps a durable pull
consumer named ``<group>-<partition>``, filtered to that subject, with ``AckAll``: an
acknowledgement of a message acknowledges every earlier one of its consumer, which is
exactly the runtime's gapless-prefix commit, one ``+ACK`` per partition and commit.

Which member of the group reads which partition is decided by
:class:`~statifier.fronts.leases.PartitionLeases`, claimed every ``ttl / 3``. When a
member gains a partition it *resets* that consumer to its ack floor (the server's
``CONSUMER.RESET`` API, NATS server 2.14 or later): whatever an earlier holder had
fetched and not acknowledged, a process that crashed included, is delivered again at
once and in stream order, rather than after its ack wait. The message after the ack
floor is the first the new holder hands over, so positions (stream sequences) rise
strictly within a partition. A surplus partition is revoked through the runtime (its
gapless prefix of done messages acknowledged) and then released; a partition another
member took after this one's lease expired is *fenced*: its in-flight work is done or
abandoned, but no acknowledgement of it is sent, since its new holder reset the
consumer. A member
whose claims keep failing (its database is away) lets its partitions go the same way
before their leases could run out, and takes them up again after a claim succeeds.

A message is handed over as :class:`~statifier.router.InboundEvent`:

- ``message_id``: the ``Nats-Msg-Id`` header when the publisher set one (JetStream's
  own publish dedupe key, so a publisher's retry is one event), else
  ``<stream>/<stream sequence>`` (stable across redeliveries of one stored message).
- ``data``: the payload, a JSON object of at most ``max_payload`` bytes, parsed
  strictly (UTF-8, RFC 8259, nesting bounded by
  :data:`~statifier.expr.jsontext.MAX_JSON_DEPTH`); or what the host's ``decode``
  makes of the payload's bytes, held to the same values
  (:mod:`statifier.fronts.normalize`). Anything else is a
  :class:`~statifier.fronts.source.Malformed` message, dead-lettered by the runtime.

A host whose publishers put the id, the scope or the source elsewhere (an envelope)
passes ``normalize``, a function of the :class:`NatsRecord` and the decoded data
answering :class:`~statifier.fronts.normalize.Normalized`.

A redelivery the server sends while the source still holds the first copy (its ack
wait ran out under a slow delivery) is dropped: the held copy will be acknowledged.
Keep ``ack_wait`` well above a delivery's time all the same, so the server does not
redeliver in vain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from statifier.extras import MissingExtra
from statifier.fronts.leases import LeaseChange, PartitionLeases
from statifier.fronts.normalize import Decode, Normalize, decoded, normalized_event
from statifier.fronts.source import Malformed, Message, Rebalance
from statifier.repeats import Repeats
from statifier.router import ConfigError, InboundEvent
from statifier.telemetry import report

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
except ModuleNotFoundError as missing:  # nats-py: the nats extra
    raise MissingExtra.of(missing) from missing

__all__ = ["MESSAGE_ID_HEADER", "AcknowledgementFailed", "JetStreamSource", "NatsRecord"]

MESSAGE_ID_HEADER: Final = "Nats-Msg-Id"
"""The header a message's id is read from, when present."""
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]+")
"""What a partition, group or stream name may be: one subject token that is also a
valid consumer name."""
_ACK: Final = b"+ACK"
_log = logging.getLogger(__name__)
_TROUBLE: Final = "statifier.fronts.trouble"


class AcknowledgementFailed(Exception):  # noqa: N818 - names the failure
    """The server did not confirm an acknowledgement: the partition's messages from
    its last confirmed one on may come again."""

    def __init__(self, partition: str, position: int) -> None:
        super().__init__(f"the acknowledgement of partition {partition!r} up to {position} failed")
        self.partition = partition
        self.position = position


@dataclass(frozen=True, slots=True)
class NatsRecord:
    """A message as read, handed to the host's ``normalize``.

    Attributes:
        stream: the JetStream stream.
        subject: the subject it was published on (``<subject_prefix>.<partition>``).
        position: its stream sequence.
        headers: its headers (empty when it has none).
        payload: its bytes, at most ``max_payload``.
    """

    stream: str
    subject: str
    position: int
    headers: Mapping[str, str]
    payload: bytes


@dataclass(eq=False)
class _Held:
    """A partition this source reads: its consumer's subscription and what it handed
    over and has not acknowledged yet."""

    partition: str
    subscription: JetStreamContext.PullSubscription
    seen: int = 0
    """The highest stream sequence taken from the server in this holding."""
    acknowledged: int = 0
    replies: dict[int, str] = field(default_factory=dict)
    """Reply subject of each unacknowledged position, in rising order."""
    puller: asyncio.Task[None] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    fenced: bool = False


class JetStreamSource:
    """A JetStream stream's partitions, read through per-partition durable pull
    consumers (see the module docstring).

    Args:
        servers: the NATS server URL(s) to connect to.
        leases: this member's leases on the group's partitions; its ``group`` names the
            consumers, its ``partitions`` the subjects.
        stream: the JetStream stream's name.
        subject_prefix: partition ``p`` is the subject ``<subject_prefix>.<p>``.
        scope: the scope of every event; with ``normalize``, of those it answers no
            scope for (then it may be left out).
        source: the source name of every event (bindings are chosen by it).
        decode: a function reading a payload's bytes as a mapping (an Avro reader,
            say); what it answers is held to JSON values, and a payload it cannot read
            (it raises) is malformed. By default the one JSON rule.
        normalize: a function of the :class:`NatsRecord` and the decoded data
            answering :class:`~statifier.fronts.normalize.Normalized`: the data, and
            the scope, message id and source it reads from the message (``None`` for
            the source's own).
        ack_wait: seconds the server waits for an acknowledgement before redelivering.
        max_payload: the largest payload, in bytes, decoded; a larger one is malformed.
            A payload ``decode`` reads is held to it again as JSON text.
        pull_batch: messages asked of one partition's consumer at a time.
        buffer: messages fetched from the server and not handed over yet, at most
            (each partition's puller may bring one ``pull_batch`` beyond it).
        pull_wait: seconds one pull request waits on the server.
        ack_timeout: seconds an acknowledgement waits for the server's confirmation.
        claim_interval: seconds between lease claims; ``ttl / 3`` by default.
        connect_options: further keyword arguments of :func:`nats.connect` (credentials,
            TLS); never logged. Unless they name an ``error_cb``, the client's errors
            (each failed reconnection, say) are logged once per kind and interval,
            with a count.

    Raises:
        ConfigError: a stream, group, partition or prefix that is not a plain name, a
            bound that is not positive, or no scope and no ``normalize``.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        leases: PartitionLeases,
        *,
        stream: str,
        subject_prefix: str,
        scope: str | None = None,
        source: str,
        decode: Decode | None = None,
        normalize: Normalize[NatsRecord] | None = None,
        ack_wait: float = 60.0,
        max_payload: int = 1_048_576,
        pull_batch: int = 64,
        buffer: int = 256,
        pull_wait: float = 1.0,
        ack_timeout: float = 5.0,
        claim_interval: float | None = None,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        for what, value in [("stream", stream), ("group", leases.group)] + [
            ("partition", p) for p in leases.partitions
        ]:
            if not _TOKEN.fullmatch(value):
                raise ConfigError(f"a JetStream {what} is letters, digits, _ and -, not {value!r}")
        if not subject_prefix or any(not _TOKEN.fullmatch(t) for t in subject_prefix.split(".")):
            raise ConfigError(f"a subject prefix is dot-separated plain tokens: {subject_prefix!r}")
        if scope is None and normalize is None:
            raise ConfigError("a JetStream source needs a scope, or a normalize that reads one")
        interval = leases.ttl.total_seconds() / 3 if claim_interval is None else claim_interval
        bounds = {
            "ack_wait": ack_wait,
            "max_payload": max_payload,
            "pull_batch": pull_batch,
            "buffer": buffer,
            "pull_wait": pull_wait,
            "ack_timeout": ack_timeout,
            "claim_interval": interval,
        }
        for name, bound in bounds.items():
            if not bound > 0:
                raise ConfigError(f"{name} must be positive, not {bound!r}")
        self._servers = [servers] if isinstance(servers, str) else list(servers)
        self._leases = leases
        self._stream = stream
        self._prefix = subject_prefix
        self._scope = scope
        self._source = source
        self._decode = decode
        self._normalize = normalize
        self._ack_wait = ack_wait
        self._max_payload = max_payload
        self._pull_batch = pull_batch
        self._capacity = buffer
        self._pull_wait = pull_wait
        self._ack_timeout = ack_timeout
        self._claim_interval = interval
        self._connect_options = dict(connect_options or {})
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._rebalance: Rebalance | None = None
        self._held: dict[str, _Held] = {}
        self._buffer: deque[Message] = deque()
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None
        self._claims: asyncio.Task[None] | None = None
        self._valid_until = 0.0
        """Monotonic time the leases of the last successful claim run out."""
        self._waiting: tuple[str, ...] = ()
        """The partitions the last claim found waiting for a reader."""
        self._unclaimed: str | None = None
        """Why the last claim failed (the error's class), ``None`` once one succeeds."""
        self._unacknowledged: str | None = None
        """Why the last acknowledgement failed (the error's class), ``None`` once one
        succeeds."""
        self._repeats = Repeats()

    @property
    def name(self) -> str:
        """``nats:<stream>``: no server address, which may carry credentials."""
        return f"nats:{self._stream}"

    @property
    def held(self) -> frozenset[str]:
        """The partitions this source reads now."""
        return frozenset(self._held)

    def trouble(self) -> str | None:
        """Why this member does not read its share now, for readiness; ``None`` when
        it does.

        - ``"server unreachable"``: the client is not connected (it reconnects).
        - ``"claims failing: <error class>"``: the last lease claim failed.
        - ``"acknowledgements failing: <error class>"``: the last acknowledgement
          failed (the server delivers the messages again after its ack wait, and may
          stop delivering at its limit of unacknowledged messages).
        - ``"no partition while N wait"``: the member holds no partition while the last
          claim found partitions waiting for a reader (see
          :func:`~statifier.fronts.leases.waiting`).
        """
        client = self._client
        if client is not None and not client.is_connected:
            return "server unreachable"
        if self._unclaimed is not None:
            return f"claims failing: {self._unclaimed}"
        if self._unacknowledged is not None:
            return f"acknowledgements failing: {self._unacknowledged}"
        if client is not None and not self._held and self._waiting:
            return f"no partition while {len(self._waiting)} wait"
        return None

    def consumer_name(self, partition: str) -> str:
        """The durable consumer of ``partition``: ``<group>-<partition>``."""
        return f"{self._leases.group}-{partition}"

    def subject(self, partition: str) -> str:
        """The subject of ``partition``: ``<subject_prefix>.<partition>``."""
        return f"{self._prefix}.{partition}"

    async def start(self, rebalance: Rebalance) -> None:
        """Connect, claim this member's share of the partitions, and keep claiming every
        ``claim_interval`` seconds in the background.

        Raises:
            Exception: the connection, the first claim or a consumer's set-up failed.
        """
        self._rebalance = rebalance
        options = {"error_cb": self._on_error, **self._connect_options}
        self._client = await nats.connect(servers=self._servers, **options)
        self._js = self._client.jetstream()
        asked = time.monotonic()
        change = await self._leases.claim()
        self._valid_until = asked + self._leases.ttl.total_seconds()
        self._waiting = change.waiting
        await self._move(change)
        self._claims = asyncio.create_task(self._keep_claiming(), name=f"{self.name} leases")

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        """Up to ``max_messages`` messages of the partitions held, waiting at most
        ``wait`` seconds for the first.

        Raises:
            Exception: the background work (a pull, a claim, a rebalance) failed; the
                source reads no more.
        """
        async with self._changed:
            if not self._buffer and self._failure is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._changed.wait_for(
                            lambda: bool(self._buffer) or self._failure is not None
                        )
            if self._failure is not None:
                raise self._failure
            taken = [self._buffer.popleft() for _ in range(min(max_messages, len(self._buffer)))]
            self._changed.notify_all()
        return taken

    async def commit(self, positions: Mapping[str, int]) -> None:
        """Acknowledge (``AckAll``) each partition's messages up to its position.

        A partition this source no longer holds, or holds only under a lease that has
        run out or was taken over, is skipped: its next holder reads it from its last
        acknowledgement on.

        Raises:
            ValueError: a position of a held partition that was never handed over.
            AcknowledgementFailed: the server did not confirm within ``ack_timeout``.
        """
        client = self._connected()
        for partition, position in positions.items():
            held = self._held.get(partition)
            if held is None or held.fenced or time.monotonic() >= self._valid_until:
                _log.warning("%s: not acknowledging %s: its lease is gone", self.name, partition)
                continue
            if position <= held.acknowledged:
                continue
            reply = held.replies.get(position)
            if reply is None:
                raise ValueError(f"position {position} of {partition!r} was never handed over")
            try:
                await client.request(reply, _ACK, timeout=self._ack_timeout)
            except (nats.errors.Error, TimeoutError) as error:
                self._unacknowledged = type(error).__name__
                raise AcknowledgementFailed(partition, position) from error
            self._unacknowledged = None
            held.acknowledged = position
            for seq in [seq for seq in held.replies if seq <= position]:
                del held.replies[seq]

    async def close(self) -> None:
        """Stop claiming and reading, leave the group (its partitions free for the
        other members' next claims) and disconnect. What was acknowledged stays so."""
        if self._claims is not None:
            self._claims.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._claims
        for partition in list(self._held):
            await self._drop(partition)
        try:
            await self._leases.leave()
        finally:
            if self._client is not None:
                await self._client.close()

    # Leases.

    async def _keep_claiming(self) -> None:
        try:
            while True:
                await asyncio.sleep(self._claim_interval)
                await self._claim()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - handed to the reader, which raises it
            await self._fail(error)

    async def _claim(self) -> None:
        """One claim, and the partition moves it calls for.

        A claim is given ``claim_interval / 2`` seconds. One that fails leaves the
        partitions held; but once the next attempt could end after their leases run
        out (another member may take them then), they are revoked, fenced, first.
        """
        asked = time.monotonic()
        try:
            async with asyncio.timeout(self._claim_interval / 2):
                change = await self._leases.claim()
        except Exception as error:  # noqa: BLE001 - the database may come back
            if self._unclaimed is None:
                trouble = f"claims failing: {type(error).__name__}"
                report(_TROUBLE, {}, {"source": self.name, "trouble": trouble})
            self._unclaimed = type(error).__name__
            self._repeats.log(
                _log,
                logging.WARNING,
                ("claim", self._unclaimed),
                "%s: claiming partitions failed: %s",
                self.name,
                self._unclaimed,
                extra={"source": self.name, "error": self._unclaimed},
            )
            next_ends = time.monotonic() + self._claim_interval * 1.5
            if self._held and next_ends >= self._valid_until:
                await self._revoke(tuple(self._held), fenced=True)
            return
        self._valid_until = asked + self._leases.ttl.total_seconds()
        if self._unclaimed is not None:
            held = self._repeats.forget(("claim", self._unclaimed))
            _log.warning(
                "%s: claiming partitions works again (after %d more failures)",
                self.name,
                held,
                extra={"source": self.name, "repeated": held},
            )
            self._unclaimed = None
            report(_TROUBLE, {}, {"source": self.name, "trouble": None})
        self._waiting = change.waiting
        await self._move(change)

    async def _on_error(self, error: Exception) -> None:
        """The client's errors (a failed reconnection, a slow consumer), one line per
        kind of error and interval; the class only, as a message may name a server
        (whose URL may carry credentials)."""
        self._repeats.log(
            _log,
            logging.WARNING,
            ("client", type(error).__name__),
            "%s: the client reported %s",
            self.name,
            type(error).__name__,
            extra={"source": self.name, "error": type(error).__name__},
        )

    async def _move(self, change: LeaseChange) -> None:
        lost = [p for p in change.lost if p in self._held]
        if lost:
            await self._revoke(lost, fenced=True)
        surplus = [p for p in change.surplus if p in self._held]
        if surplus:
            await self._revoke(surplus, fenced=False)
        if change.surplus:
            await self._leases.release(change.surplus)
        kept = set(change.held) - set(change.surplus)
        gained = sorted(kept - set(self._held))
        if gained:
            for partition in gained:
                await self._hold(partition)
            assert self._rebalance is not None
            await self._rebalance.assigned(gained)

    async def _revoke(self, partitions: Collection[str], *, fenced: bool) -> None:
        """Stop reading ``partitions``, forget their messages not handed over, let the
        runtime finish the rest (and commit, unless ``fenced``), then let go."""
        for partition in partitions:
            held = self._held[partition]
            held.fenced = fenced
            await self._stop_puller(held)
        async with self._changed:
            self._buffer = deque(m for m in self._buffer if m.partition not in partitions)
            self._changed.notify_all()
        assert self._rebalance is not None
        await self._rebalance.revoked(partitions)
        for partition in partitions:
            await self._drop(partition)

    # Partitions.

    async def _hold(self, partition: str) -> None:
        """Take up ``partition``: its consumer made sure of and reset to its ack floor, a
        subscription bound to it, and its puller started."""
        js = self._jetstream()
        name = self.consumer_name(partition)
        config = ConsumerConfig(
            name=name,
            durable_name=name,
            filter_subject=self.subject(partition),
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.ALL,
            ack_wait=self._ack_wait,
            max_deliver=-1,
        )
        await js.add_consumer(self._stream, config)
        await js.reset_consumer(self._stream, name)
        subscription = await js.pull_subscribe_bind(name, stream=self._stream)
        held = _Held(partition, subscription)
        self._held[partition] = held
        held.puller = asyncio.create_task(self._pull(held), name=f"{self.name} {partition}")

    async def _drop(self, partition: str) -> None:
        held = self._held.pop(partition)
        await self._stop_puller(held)
        with contextlib.suppress(nats.errors.Error):
            await held.subscription.unsubscribe()

    @staticmethod
    async def _stop_puller(held: _Held) -> None:
        """Stop ``held``'s puller. The cancel is repeated until the task ends: the
        client's fetch can lose a cancel that meets an arriving message."""
        held.stopping.set()
        puller, held.puller = held.puller, None
        while puller is not None and not puller.done():
            puller.cancel()
            await asyncio.wait({puller}, timeout=0.1)
        if puller is not None and not puller.cancelled():
            puller.exception()  # retrieved; a failure was handed to _fail already

    async def _pull(self, held: _Held) -> None:
        try:
            while not held.stopping.is_set():
                async with self._changed:
                    await self._changed.wait_for(lambda: len(self._buffer) < self._capacity)
                try:
                    batch = await held.subscription.fetch(self._pull_batch, self._pull_wait)
                except TimeoutError:  # nothing came (nats-py raises both kinds)
                    continue
                if held.stopping.is_set():
                    return  # not handed over: the partition's next holder reads them
                async with self._changed:
                    for msg in batch:
                        self._take(held, msg)
                    self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - handed to the reader, which raises it
            if not held.stopping.is_set():
                await self._fail(error)

    def _take(self, held: _Held, msg: Msg) -> None:
        position = msg.metadata.sequence.stream
        if position <= held.seen:
            return  # a redelivery of a message still held: that copy is acknowledged
        held.seen = position
        assert msg.reply
        held.replies[position] = msg.reply
        message = Message(held.partition, position, self._event(msg, position), raw=msg.data)
        self._buffer.append(message)

    def _event(self, msg: Msg, position: int) -> InboundEvent | Malformed:
        value = decoded(msg.data, self._decode, max_bytes=self._max_payload, what="payload")
        if isinstance(value, Malformed):
            return value
        headers = msg.headers or {}
        record = NatsRecord(self._stream, msg.subject, position, headers, msg.data)
        return normalized_event(
            record,
            value,
            self._normalize,
            scope=self._scope,
            source=self._source,
            message_id=headers.get(MESSAGE_ID_HEADER) or f"{self._stream}/{position}",
            max_bytes=self._max_payload,
        )

    async def _fail(self, error: BaseException) -> None:
        _log.error("%s failed: %s", self.name, type(error).__name__)
        async with self._changed:
            self._failure = error
            self._changed.notify_all()

    def _connected(self) -> Client:
        if self._client is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._client

    def _jetstream(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._js
