"""The sinks ``statifier serve`` drains its outbox queues to: an HTTP POST, or a Python
callable named by its import path.

:class:`HttpPostSink` POSTs each message as one JSON object::

    {"queue": "joined", "key": "ex_1/%/4/1/0/7/0", "event": {"name": "pair.joined",
     "data": {...}}, "sendid": null, "target": null, "execution_id": "ex_1",
     "scope": null, "attempts": 0}

with the row's key in the ``Idempotency-Key`` header: a retry (after a timeout, or
after a worker was lost between the POST and the mark) carries the same key, so a
receiver that dedupes on it sees one effect. The event's data is written in the tagged
encoding of :mod:`statifier.expr.tagged` (plain JSON for plain values). Within
``timeout`` seconds the receiver must answer; a 2xx answer marks the row sent, 408,
425, 429 and 5xx answers, connection errors and timeouts are retried with the drain's
backoff, and any other answer dead-letters the row at once (no retry changes it). The
URL and the ``Authorization`` value never appear in an error: they may carry
credentials.

A callable sink is ``call = "package.module:function"``: the function takes an
:class:`~statifier.router.OutboxMessage` and returns (or its coroutine returns) when
the message is handled; see :data:`~statifier.router.Sink`.

The ``basichttp`` queue is always drained by :func:`~statifier.router.basichttp_sink`:
the BasicHTTP sends of durable executions.

httpx (the ``http`` extra) is imported when an HTTP sink is built.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from statifier.expr.tagged import encode
from statifier.extras import MissingExtra
from statifier.router import DeadLetter, OutboxMessage, Router, Sink, basichttp_sink
from statifier.router.sending import BASICHTTP_QUEUE
from statifier.service.settings import (
    CallSink,
    HttpSink,
    ServiceConfigError,
    ServiceSettings,
    SinkSettings,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "IDEMPOTENCY_HEADER",
    "HttpPostSink",
    "SinkFailed",
    "Sinks",
    "body_of",
    "build_sinks",
    "load_callable",
]

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
_RETRIED: Final = frozenset({408, 425, 429})


class SinkFailed(Exception):  # noqa: N818 - names the failure
    """A POST that did not land; the drain tries it again with backoff."""


def body_of(message: OutboxMessage) -> bytes:
    """The JSON body an :class:`HttpPostSink` POSTs for ``message``."""
    document = {
        "queue": message.queue,
        "key": message.key,
        "event": {"name": message.event.name, "data": encode(message.event.data)},
        "sendid": message.sendid,
        "target": message.target,
        "execution_id": message.execution_id,
        "scope": message.scope,
        "attempts": message.attempts,
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class HttpPostSink:
    """Drains one queue by POSTing each message to one URL (see the module docstring).

    Args:
        settings: the queue, URL, timeout and optional ``Authorization`` value.
        client: an ``httpx.AsyncClient`` (the caller's to close); by default one of the
            sink's own, closed by :meth:`aclose`.

    Raises:
        MissingExtra: httpx is not installed (the ``http`` extra).
    """

    def __init__(self, settings: HttpSink, client: httpx.AsyncClient | None = None) -> None:
        try:
            import httpx
        except ModuleNotFoundError as missing:
            raise MissingExtra.of(missing) from missing
        self.queue = settings.queue
        self._url = settings.url
        self._headers = {"Content-Type": "application/json"}
        if settings.authorization is not None:
            self._headers["Authorization"] = settings.authorization
        self._owned = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout), follow_redirects=False
        )
        self._errors = httpx.HTTPError

    async def __call__(self, message: OutboxMessage) -> None:
        """POST ``message``; returns on a 2xx answer.

        Raises:
            SinkFailed: no answer in time, a connection error, or a 408/425/429/5xx
                answer (retried).
            DeadLetter: any other answer (not retried).
        """
        headers = {**self._headers, IDEMPOTENCY_HEADER: message.key}
        try:
            # The answer's body is never read: a receiver cannot make the sink buffer it.
            request = self._client.build_request(
                "POST", self._url, content=body_of(message), headers=headers
            )
            answer = await self._client.send(request, stream=True)
            await answer.aclose()
        except self._errors as error:
            raise SinkFailed(
                f"POST for queue {self.queue!r} failed: {type(error).__name__}"
            ) from None
        status = answer.status_code
        if 200 <= status < 300:
            return
        said = f"POST for queue {self.queue!r} answered {status}"
        if status in _RETRIED or status >= 500:
            raise SinkFailed(said)
        raise DeadLetter(said)

    async def aclose(self) -> None:
        """Close the sink's own client (a given one stays open)."""
        if self._owned:
            await self._client.aclose()


def load_callable(settings: CallSink, file: str) -> Sink:
    """The function ``settings.call`` names.

    Raises:
        ServiceConfigError: its module cannot be imported, or it names nothing callable
            (named at ``[sinks.QUEUE] call``).
    """
    module_name, _, attribute = settings.call.partition(":")
    table = f"sinks.{settings.queue}"
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ServiceConfigError(
            file, table, "call", f"cannot import {module_name}: {type(error).__name__}: {error}"
        ) from None
    found = getattr(module, attribute, None)
    if not callable(found):
        raise ServiceConfigError(file, table, "call", f"{settings.call} is not a callable")
    sink: Sink = found
    return sink


@dataclass(frozen=True, slots=True)
class Sinks:
    """The sinks of every queue, and the HTTP sinks to close when the service stops."""

    by_queue: Mapping[str, Sink]
    closing: Sequence[HttpPostSink]

    async def aclose(self) -> None:
        """Close every HTTP sink's client."""
        for sink in self.closing:
            await sink.aclose()


def build_sinks(settings: ServiceSettings, router: Router) -> Sinks:
    """Every queue's sink: the configured ones, and the BasicHTTP sink of the
    ``basichttp`` queue (failures reported back through ``router``).

    Raises:
        ServiceConfigError: a callable that cannot be loaded.
        MissingExtra: an HTTP sink without httpx.
    """
    by_queue: dict[str, Sink] = {
        BASICHTTP_QUEUE: basichttp_sink(router, timeout=settings.outbox.basichttp_timeout)
    }
    closing: list[HttpPostSink] = []
    for entry in settings.sinks:
        by_queue[entry.queue] = _built(entry, settings.file, closing)
    return Sinks(by_queue, tuple(closing))


def _built(entry: SinkSettings, file: str, closing: list[HttpPostSink]) -> Sink:
    if isinstance(entry, CallSink):
        return load_callable(entry, file)
    sink = HttpPostSink(entry)
    closing.append(sink)
    return sink
