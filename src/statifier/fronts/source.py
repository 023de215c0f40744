"""What a stream consumer reads: the contract every source of events keeps.

A source (a Kafka consumer, a NATS JetStream consumer, the inbound-events table) hands
the consumer runtime (:mod:`statifier.fronts.consumer`) batches of :class:`Message`
values. Each message sits at a ``position`` of a ``partition``: the source's unit of
order and of acknowledgement (a Kafka topic-partition, a JetStream partition subject, a
partition of the table). Positions increase strictly within a partition in the order
the source hands them over.

The runtime acknowledges with :meth:`Source.commit`, naming for each partition the last
position whose every message, and every message before it, is done (its
delivery transaction committed, or it was dead-lettered): a gapless prefix. A source
never hands a committed position over again; everything after it may come again after
a crash, a restart or a rebalance, and the router's dedupe finds it ``duplicate``.

A source whose partitions move between processes (a consumer group) tells the runtime
through the :class:`Rebalance` it was started with: ``assigned`` when it gains
partitions, ``revoked`` before it gives some up. ``revoked`` returns once the runtime
is done with or has abandoned the in-flight messages of those partitions and committed
what is done, so the next owner starts exactly after them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from statifier.expr import Value, jsontext
from statifier.router import InboundEvent

__all__ = ["Malformed", "Message", "Rebalance", "Source", "json_object", "stored_object"]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A message the source could read but not turn into an event: undecodable bytes,
    no message id, data that is not a JSON object. It is dead-lettered with ``reason``
    and never routed."""

    reason: str


@dataclass(frozen=True, slots=True)
class Message:
    """One message read from a source.

    Attributes:
        partition: the source's unit of order and acknowledgement.
        position: strictly increasing within ``partition``.
        event: the event to route, or why there is none.
        raw: the bytes as read (kept for a dead letter; never logged).
    """

    partition: str
    position: int
    event: InboundEvent | Malformed
    raw: bytes = b""


def json_object(
    payload: bytes, *, max_bytes: int | None, what: str
) -> dict[str, Value] | Malformed:
    """A message's bytes as the event's data, by the one JSON rule every front reads
    by (:func:`statifier.expr.jsontext.loads`): a JSON object of at most ``max_bytes``
    bytes (unbounded when ``None``), UTF-8, nested at most
    :data:`~statifier.expr.jsontext.MAX_JSON_DEPTH` deep, with no number that is not
    finite and no lone surrogate; else why not, naming the bytes ``what``
    (``"value"``, ``"payload"``, ``"body"``) and the rule broken.

    >>> json_object(b'{"key": "k1"}', max_bytes=64, what="payload")
    {'key': 'k1'}
    >>> json_object(b"[1]", max_bytes=64, what="value")
    Malformed(reason='the value is JSON but not an object: list')
    >>> json_object(b'{"n": 1e999999}', max_bytes=64, what="body")
    Malformed(reason='the body is not JSON: a non-finite number (out of range) at position 6')
    """
    try:
        data = jsontext.loads(payload, max_bytes=max_bytes)
    except jsontext.JSONTextError as error:
        if error.rule == "size" and max_bytes is not None and len(payload) > max_bytes:
            return Malformed(f"a {what} of {len(payload)} bytes, over the {max_bytes}")
        if error.rule == "utf-8":
            return Malformed(f"the {what} is not UTF-8 (byte {error.position})")
        return Malformed(f"the {what} is not JSON: {error}")
    if not isinstance(data, dict):
        return Malformed(f"the {what} is JSON but not an object: {type(data).__name__}")
    return data


def stored_object(
    document: object, *, what: str, max_bytes: int | None = None
) -> dict[str, Value] | Malformed:
    """A document a database (or a host's decoder) handed over, by the same rule as
    :func:`json_object`: JSON text (``str`` or ``bytes``), or values parsed already,
    which are written again as JSON and read by the rule (a lone surrogate is written
    as its UTF-8 form and a non-finite number as ``NaN`` or ``Infinity``, which the
    rule refuses; a value JSON has no form for, bytes or a datetime, is refused with
    the writer's reason). At most ``max_bytes`` bytes of JSON text (unbounded when
    ``None``).

    >>> stored_object({"n": float("inf")}, what="data")
    Malformed(reason='the data is not JSON: a non-finite number (Infinity) at position 6')
    >>> stored_object({"at": b"x"}, what="data").reason
    'the data is not JSON: TypeError: Object of type bytes is not JSON serializable'
    """
    if isinstance(document, str):
        text = document.encode("utf-8", "surrogatepass")
    elif isinstance(document, bytes):
        text = document
    else:
        try:
            text = json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, RecursionError) as error:
            return Malformed(f"the {what} is not JSON: {type(error).__name__}: {error}")
    return json_object(text, max_bytes=max_bytes, what=what)


class Rebalance(Protocol):
    """How a source tells the runtime that its partitions moved."""

    async def assigned(self, partitions: Collection[str]) -> None:
        """The source now reads ``partitions``."""

    async def revoked(self, partitions: Collection[str]) -> None:
        """The source is about to give ``partitions`` up: returns once their in-flight
        messages are done or abandoned and what is done is committed."""


class Source(Protocol):
    """A stream of messages that can be acknowledged by gapless prefix."""

    @property
    def name(self) -> str:
        """A name for logs and telemetry (never carries a secret)."""

    async def start(self, rebalance: Rebalance) -> None:
        """Connect and begin reading; ``rebalance`` hears every partition move."""

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        """Up to ``max_messages`` messages, waiting at most ``wait`` seconds for the
        first; an empty answer means nothing arrived in time."""

    async def commit(self, positions: Mapping[str, int]) -> None:
        """Acknowledge, for each partition, every message up to and including the
        position given. Raises when the acknowledgement did not reach the source."""

    async def close(self) -> None:
        """Stop reading and release the source's resources (not its partitions'
        positions: what was committed stays committed)."""
