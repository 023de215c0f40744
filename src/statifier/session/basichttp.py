"""The W3C BasicHTTP Event I/O Processor: sending with httpx, receiving over ASGI.

Sending: register a :class:`BasicHTTP` for a session under its type names
(``BasicHTTP().send_types()``). A send to a URL POSTs the event there: a map of data
as ``application/x-www-form-urlencoded`` fields beside ``_scxmleventname`` (values
that are not strings JSON-encoded), string data (``<content>``) as the body, with
``_scxmleventname`` in the query string. A 2xx answer means delivered; any other
answer, a connection error or a timeout raises ``error.communication`` in the
sender. A send with no target goes to the sender's own queue, as every send does.

Receiving: :func:`basichttp_app` is an ASGI application that takes ``POST /<session
id>`` and queues the event on that session: named by ``_scxmleventname`` (from the
form, else the query string; ``HTTP.POST`` without one), with the other form fields
(or the body, when it is not a form) as data, and this processor as ``origintype``.
Serve it on the event loop the sessions run on. Given ``base_url``, the sender names
each session's location (``<base_url>/<session id>``) and the session lists it in
``_ioprocessors``.

httpx is imported only when a send is performed, so this module imports without the
``http`` extra.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from statifier.core import Event
from statifier.expr import UNDEFINED, Value
from statifier.expr.tagged import TaggedValueError, encode
from statifier.session.handlers import Delivery, SendType
from statifier.session.live import SessionNotRunning, SessionQueueFull

if TYPE_CHECKING:
    import httpx

    from statifier.session.live import System

__all__ = ["BASICHTTP", "DEFAULT_BODY_LIMIT", "BasicHTTP", "basichttp_app", "decode_post"]

BASICHTTP: Final = "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor"
DEFAULT_BODY_LIMIT: Final = 64 * 1024
_NAME_FIELD: Final = "_scxmleventname"
_FORM: Final = "application/x-www-form-urlencoded"
_URL: Final = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()]+")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BasicHTTP:
    """The sending half, a :class:`~statifier.session.handlers.SendType`.

    >>> sender = BasicHTTP(base_url="http://127.0.0.1:8000/events/")
    >>> sender.location("s1")
    'http://127.0.0.1:8000/events/s1'
    >>> sender.plan("ftp://elsewhere", Event("hi"))
    "BasicHTTP cannot deliver to 'ftp://elsewhere'"
    >>> delivery = sender.plan("http://peer/s2", Event("hi", data={"n": 1, "who": "me"}))
    >>> delivery.body, dict(delivery.headers)
    (b'_scxmleventname=hi&n=1&who=me', {'content-type': 'application/x-www-form-urlencoded'})
    """

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        timeout: float = 10.0,
        base_url: str | None = None,
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.base_url = None if base_url is None else base_url.rstrip("/")

    def send_types(self) -> dict[str, SendType]:
        """This processor under its type URI and its short name."""
        return {BASICHTTP: self, "basichttp": self}

    def location(self, session_id: str) -> str | None:
        """Where ``session_id`` receives, when this processor was given a base URL."""
        return None if self.base_url is None else f"{self.base_url}/{session_id}"

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        """A POST of ``event`` to the URL ``target``. Pure."""
        parts = urlsplit(target or "")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return f"BasicHTTP cannot deliver to {target!r}"
        assert target is not None
        data = event.data
        if isinstance(data, str):
            separator = "&" if parts.query else "?"
            url = f"{target}{separator}{urlencode({_NAME_FIELD: event.name})}"
            return Delivery(url, event, data.encode("utf-8"), {"content-type": "text/plain"})
        fields: list[tuple[str, str]] = [(_NAME_FIELD, event.name)]
        if isinstance(data, dict):
            try:
                fields.extend((str(key), _field(value)) for key, value in data.items())
            except TaggedValueError as error:
                return f"BasicHTTP cannot carry this data: {error}"
        elif data is not UNDEFINED and data is not None:
            return f"BasicHTTP cannot carry {type(data).__name__} data"
        return Delivery(target, event, urlencode(fields).encode("ascii"), {"content-type": _FORM})

    async def perform(self, delivery: Delivery) -> str | None:
        """POST the delivery; ``None`` on a 2xx answer, else what went wrong."""
        import httpx  # the http extra is needed only here

        try:
            if self.client is not None:
                response = await self.client.post(
                    delivery.target,
                    content=delivery.body,
                    headers=dict(delivery.headers),
                    timeout=self.timeout,
                )
            else:
                async with httpx.AsyncClient(timeout=self.timeout) as client:
                    response = await client.post(
                        delivery.target, content=delivery.body, headers=dict(delivery.headers)
                    )
        except httpx.HTTPError as error:
            return f"BasicHTTP POST to {_shown(delivery.target)} failed: {_named(error)}"
        if not response.is_success:
            return f"BasicHTTP POST to {_shown(delivery.target)} answered {response.status_code}"
        return None


def _shown(url: str) -> str:
    """``url`` as a message may show it: ``scheme://host[:port]/path``. The userinfo,
    query and fragment are left out, as they may carry credentials or tokens, and the
    message reaches the chart, telemetry and logs.

    >>> _shown("http://svc:S3CRET@127.0.0.1:9/hook?token=abc#x")
    'http://127.0.0.1:9/hook'
    >>> _shown("https://[::1]/in")
    'https://[::1]/in'
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is no number: show no part of the authority
        return "a URL that does not parse"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    authority = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{authority}{parts.path}"


def _named(error: Exception) -> str:
    """An httpx error by its class and message; httpx messages may quote the request's
    URL in full, so each URL in them is cut down as :func:`_shown` does."""
    text = _URL.sub(lambda found: _shown(found.group()), str(error))
    return f"{type(error).__name__}({text!r})"


def _field(value: Value) -> str:
    """A form field's value: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(encode(value), separators=(",", ":"), ensure_ascii=False)


def basichttp_app(
    system: System, *, body_limit: int = DEFAULT_BODY_LIMIT
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """An ASGI application taking ``POST /<session id>`` into that session's queue.

    Answers 204 when the event is queued, 404 for a session that is unknown or has
    finished, 405 for any method but POST, 413 for a body over ``body_limit`` bytes,
    400 for a body that is not UTF-8 or an empty event name, and 503 (``Retry-After:
    1``) when the session's queue is full (:attr:`System.max_queued`).
    """

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await _answer(send, 405, "only POST is accepted", [(b"allow", b"POST")])
            return
        session_id = scope["path"].removeprefix("/")
        session = system.sessions.get(session_id)
        if session is None or not session.running:
            await _answer(send, 404, "no such session")
            return
        body = await _body(scope, receive, body_limit)
        if body is None:
            await _answer(send, 413, f"the body is over {body_limit} bytes")
            return
        event = _event(scope, body)
        if isinstance(event, str):
            await _answer(send, 400, event)
            return
        try:
            session.send(event)
        except SessionNotRunning:  # it ended while the body came in
            await _answer(send, 404, "no such session")
            return
        except SessionQueueFull as full:  # the sender may try again later
            await _answer(send, 503, str(full), [(b"retry-after", b"1")])
            return
        await _answer(send, 204, "")

    return app


async def _body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The request body, or ``None`` once it is over ``limit`` bytes (read no further)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away; nothing more will come
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _event(scope: Scope, body: bytes) -> Event | str:
    """The event a request carries, or why it carries none."""
    content_type = None
    for header, value in scope.get("headers", ()):
        if header == b"content-type":
            content_type = value.decode("latin-1")
    return decode_post(content_type, body, scope.get("query_string", b""))


def decode_post(content_type: str | None, body: bytes, query: bytes) -> Event | str:
    """The event a BasicHTTP POST carries, or why it carries none. Pure.

    The name is ``_scxmleventname`` from a form body, else from the query string, else
    ``HTTP.POST``; a form's other fields are the data, another non-empty body is the
    data as text. Refused (a one-line reason): a body or query that is not UTF-8, an
    empty name or one with whitespace.

    >>> decode_post("application/x-www-form-urlencoded", b"_scxmleventname=go&n=1", b"")
    Event(name='go', ...)
    >>> decode_post("text/plain", b"\\xff", b"")
    'the request is not UTF-8'
    """
    try:
        text = body.decode("utf-8")
        query_text = query.decode("utf-8")
    except UnicodeDecodeError:
        return "the request is not UTF-8"
    name = dict(parse_qsl(query_text)).get(_NAME_FIELD)
    data: Value = UNDEFINED
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == _FORM:
        fields = dict(parse_qsl(text, keep_blank_values=True))
        name = fields.pop(_NAME_FIELD, name)
        if fields:
            data = dict(fields)
    elif text:
        data = text
    name = "HTTP.POST" if name is None else name
    if not name.strip() or any(c.isspace() for c in name):
        return f"invalid event name {name!r}"
    return Event(name, data=data, origintype=BASICHTTP)


async def _answer(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = text.encode("utf-8")
    head = [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    if status != 204:
        head.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": b"" if status == 204 else body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
