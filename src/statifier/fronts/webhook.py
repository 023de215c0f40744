"""The webhook and form-post fronts: a POST in, one :meth:`~statifier.router.Router.route`
call (or, with group commit, a place in a batch routed in one transaction), a status
out.

:func:`handle` and :func:`status` are the whole contract, for a host that writes its
own endpoint; :func:`webhook_app` and :func:`form_app` are Starlette applications
built on them, to mount in the host's app (``app.mount("/hooks/parcels", ...)``). Each
answers ``POST /`` and nothing else:

1. any other method: 405 with ``Allow: POST``;
2. the body, read under ``max_body`` (413) and the request's deadline (408);
3. the host's verifier, if one is given: a refusal answers 401 and nothing is routed;
4. the body decoded: for a webhook a JSON object by the one rule every front reads
   JSON by (:func:`~statifier.fronts.source.json_object`: UTF-8, nested at most 128
   deep, no number that is not finite, no lone surrogate), for a form post an
   urlencoded form, strict UTF-8 in its bytes and its percent-escapes: 400 naming
   the rule broken, 415 for a form post of another content type;
5. the scope, from the host (a string, or a function of the request: never the
   posted body), and :func:`handle`: 200 for every recorded outcome, 500 for an
   error, 503 when the handling outlived the deadline (its transaction is rolled
   back; a retry is deduped if it had committed).

With ``group_commit`` (a window in seconds), the events of concurrent posts are routed
together by a :class:`~statifier.fronts.gather.Gatherer`, one transaction a batch: each
post is answered once its batch committed, 200 or 500 by its own event's answer (500
for every post of a batch whose transaction failed). A post that outlives its deadline
is answered 503 and leaves the batch to the others; its event is routed with them if
the batch was taken already. The app's lifespan closes the gatherer on shutdown,
routing what waits; a host that mounts the app in its own enters it there (Starlette
runs no mounted app's lifespan): ``async with front.router.lifespan_context(front):``.

The message id is the provider's event id when the host names the header it comes in
and the post carries a non-empty one, else the lowercase hex SHA-256 of the raw body:
a provider's retry of the same body is the same message. A body-hash id is
scope-free: the same body under two scopes through one binding is one message; give
each scope its own binding, or use a provider event id.

No front logs a body; a 500 is logged with the error's type name only, once per
kind, type and interval (:class:`~statifier.repeats.Repeats`), and every refusal at
warning level with its rule, once per rule and interval
(:class:`~statifier.fronts.http_body.AnyMethod`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from typing import Final
from urllib.parse import parse_qsl

from statifier.callbacks import awaited
from statifier.expr import Value
from statifier.extras import MissingExtra
from statifier.fronts.gather import Gatherer, check_window
from statifier.fronts.http_body import (
    DEFAULT_MAX_BODY,
    DEFAULT_TIMEOUT,
    AnyMethod,
    Refused,
    check_bounds,
    method_not_allowed,
    read_body,
)
from statifier.fronts.source import Malformed, json_object
from statifier.fronts.verifiers import Verifier
from statifier.repeats import Repeats
from statifier.router import Failed, InboundEvent, InvalidEvent, Routed, Router, ShardedRouter
from statifier.router.outcomes import MAX_ID_LENGTH

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
except ModuleNotFoundError as missing:  # Starlette: the http extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "MAX_FORM_FIELDS",
    "ScopeOf",
    "body_message_id",
    "form_app",
    "handle",
    "status",
    "webhook_app",
]

MAX_FORM_FIELDS: Final = 1000
"""The most fields a form post may carry."""
_FORM: Final = "application/x-www-form-urlencoded"
_log = logging.getLogger(__name__)

ScopeOf = str | Callable[[Request], "str | Awaitable[str]"]
"""The scope of every post (a string), or a function of the request answering it."""

Decode = Callable[[Request, bytes], "Mapping[str, Value] | Refused"]
RouteOne = Callable[[InboundEvent], Awaitable["Routed | Failed"]]
Lifespan = Callable[[Starlette], "AbstractAsyncContextManager[None]"]


def body_message_id(raw_body: bytes) -> str:
    """The message id of a post without a provider id: the body's SHA-256, lowercase
    hex (an empty body hashes to one constant id).

    >>> body_message_id(b"")
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
    """
    return hashlib.sha256(raw_body).hexdigest()


async def handle(
    router: Router | ShardedRouter,
    *,
    scope: str,
    source: str,
    raw_body: bytes,
    data: Mapping[str, Value],
    provider_id: str | None = None,
    now: datetime | None = None,
) -> Routed | Failed:
    """Route one post: its message id is ``provider_id`` when non-empty, else
    :func:`body_message_id` of ``raw_body``; ``data`` is the decoded body.

    Returns :class:`~statifier.router.Routed` (one outcome per enabled binding of
    ``source``), or :class:`~statifier.router.Failed` when the routing raised (nothing
    of the failing delivery stands; the post must not be acknowledged).

    Raises:
        InvalidEvent: an empty or over-long scope, source or provider id (nothing was
            routed).
    """
    event = _event(scope, source, raw_body, data, provider_id)
    return await _alone(router, event, now)


def _event(
    scope: str, source: str, raw_body: bytes, data: Mapping[str, Value], provider_id: str | None
) -> InboundEvent:
    message_id = provider_id if provider_id else body_message_id(raw_body)
    return InboundEvent(scope=scope, source=source, message_id=message_id, data=data)


async def _alone(
    router: Router | ShardedRouter, event: InboundEvent, now: datetime | None
) -> Routed | Failed:
    """``event`` routed by one :meth:`~statifier.router.Router.route` call."""
    try:
        return await router.route(event, now=now)
    except Exception as error:  # noqa: BLE001 - the post's answer, never the server's
        return Failed(event, error)


def status(answer: Routed | Failed) -> int:
    """200 for every recorded outcome (duplicates, drops, refusals and no-match
    included: the provider stops retrying), 500 for a failure (it retries)."""
    return 200 if isinstance(answer, Routed) else 500


def webhook_app(
    router: Router | ShardedRouter,
    *,
    source: str,
    scope: ScopeOf,
    provider_id_header: str | None = None,
    verifier: Verifier | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    timeout: float = DEFAULT_TIMEOUT,
    group_commit: float | None = None,
) -> Starlette:
    """A provider's webhook as an ASGI app: ``POST /`` with a JSON object body,
    routed from ``source`` (see the module docstring for the statuses).

    Args:
        router: the router.
        source: the source name the bindings read.
        scope: the scope of every post, or a function of the request answering it.
        provider_id_header: the header carrying the provider's event id, if any.
        verifier: run on every POST once its body is read, before the body is
            decoded or anything routed.
        max_body: the largest body read, in bytes.
        timeout: the seconds one request may take, the body's reading included.
        group_commit: the seconds the events of concurrent posts are gathered to be
            routed in one transaction (over 0, at most
            :data:`~statifier.fronts.gather.MAX_WINDOW` and shorter than ``timeout``);
            ``None``: each post is routed alone, one ``route()`` call.

    Raises:
        ValueError: an empty source, a ``max_body`` or ``timeout`` that is not
            positive, a ``group_commit`` window out of range.
    """
    header = provider_id_header

    def decode(request: Request, body: bytes) -> Mapping[str, Value] | Refused:
        given = request.headers.get(header) if header is not None else None
        if given is not None and len(given) > MAX_ID_LENGTH:
            reason = f"the provider event id is over {MAX_ID_LENGTH} characters"
            return Refused(400, "provider_id", reason)
        data = json_object(body, max_bytes=max_body, what="body")
        return Refused(400, "json", data.reason) if isinstance(data, Malformed) else data

    def provider_id(request: Request) -> str | None:
        return request.headers.get(header) if header is not None else None

    return _app(
        router,
        "webhook",
        source,
        scope,
        verifier,
        max_body,
        timeout,
        group_commit,
        decode,
        provider_id,
    )


def form_app(
    router: Router | ShardedRouter,
    *,
    source: str,
    scope: ScopeOf,
    verifier: Verifier | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    timeout: float = DEFAULT_TIMEOUT,
    group_commit: float | None = None,
) -> Starlette:
    """A host's own web form as an ASGI app: ``POST /`` with an urlencoded body; the
    fields are the data (a field posted more than once is a list of its values, in
    order). There is no provider id: the message id is the body's hash, so a
    double-clicked submit is one message. Takes what :func:`webhook_app` takes, but
    the provider id header.

    A form post's status is read by a browser: 200 says the post was recorded, not
    that an execution received it; a host that tells more mounts its own endpoint on
    :func:`handle`.
    """
    return _app(
        router,
        "form",
        source,
        scope,
        verifier,
        max_body,
        timeout,
        group_commit,
        _form_fields,
        _no_id,
    )


def _no_id(_request: Request) -> None:
    return None


def _app(
    router: Router | ShardedRouter,
    front: str,
    source: str,
    scope: ScopeOf,
    verifier: Verifier | None,
    max_body: int,
    timeout: float,
    group_commit: float | None,
    decode: Decode,
    provider_id: Callable[[Request], str | None],
) -> Starlette:
    named: object = source
    if not isinstance(named, str) or not named:
        raise ValueError(f"a front needs a source name, not {source!r}")
    check_bounds(max_body, timeout)
    failures = Repeats()  # a host's broken function fails every post alike
    route, lifespan = _routing(router, group_commit, timeout, failures)

    async def answer(request: Request) -> Response | Refused:
        if request.method != "POST":
            return method_not_allowed()
        deadline = asyncio.get_running_loop().time() + timeout
        body = await read_body(request, max_body=max_body, deadline=deadline)
        if isinstance(body, Refused):
            return body
        try:
            async with asyncio.timeout_at(deadline):
                return await handled(request, body)
        except TimeoutError:
            return Refused(503, "deadline", "the post was not handled in time; post it again")

    async def handled(request: Request, body: bytes) -> Response | Refused:
        if verifier is not None:
            try:
                accepted = await awaited(verifier(request, body))
            except Exception as error:  # noqa: BLE001 - a broken verifier routes nothing
                said = type(error).__name__
                failures.log(
                    _log,
                    logging.ERROR,
                    ("verifier", said),
                    "%s: the verifier raised %s",
                    source,
                    said,
                )
                return Response(status_code=500)
            if accepted is not True:
                return Refused(401, "verifier", "the post is not authentic")
        data = decode(request, body)
        if isinstance(data, Refused):
            return data
        try:
            chosen = scope if isinstance(scope, str) else await awaited(scope(request))
        except Exception as error:  # noqa: BLE001 - the host's scope function failed
            said = type(error).__name__
            failures.log(
                _log,
                logging.ERROR,
                ("scope", said),
                "%s: the scope function raised %s",
                source,
                said,
            )
            return Response(status_code=500)
        try:
            event = _event(chosen, source, body, data, provider_id(request))
        except InvalidEvent:  # the provider id is bounded already: the host's scope
            failures.log(_log, logging.ERROR, "invalid scope", "%s: the scope is not valid", source)
            return Response(status_code=500)
        return Response(status_code=status(await route(event)))

    return Starlette(
        routes=[Route("/", AnyMethod(answer, front=front, source=source))], lifespan=lifespan
    )


def _routing(
    router: Router | ShardedRouter, group_commit: float | None, timeout: float, failures: Repeats
) -> tuple[RouteOne, Lifespan | None]:
    """How an app routes a post's event, and its lifespan: each event alone (no
    lifespan), or through a gatherer the lifespan closes on shutdown. A failure is
    logged once per kind and interval (``failures`` alone, the gatherer's own else).

    Raises:
        ValueError: a ``group_commit`` window out of range, or not shorter than
            ``timeout`` (every post would run out of time waiting).
    """
    if group_commit is None:

        async def alone(event: InboundEvent) -> Routed | Failed:
            routed = await _alone(router, event, None)
            if isinstance(routed, Failed):
                said = type(routed.error).__name__
                failures.log(
                    _log,
                    logging.ERROR,
                    ("routing", said),
                    "%s: routing failed with %s",
                    event.source,
                    said,
                )
            return routed

        return alone, None
    window = check_window(group_commit)
    if window >= timeout:
        raise ValueError(
            f"a group commit window ({window:g} s) must be shorter than timeout ({timeout:g} s)"
        )
    # The gatherer of this start of the app; the failures it answers, it logs.
    current = [Gatherer(router, window=window)]

    async def gathered(event: InboundEvent) -> Routed | Failed:
        return await current[0].route(event)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # A next start of the app gathers afresh; this one's waiting posts are routed.
            closing, current[0] = current[0], Gatherer(router, window=window)
            await closing.close()

    return gathered, lifespan


def _form_fields(request: Request, body: bytes) -> Mapping[str, Value] | Refused:
    """The body as form fields, or a 415 or 400. A form carries no JSON: its one
    rule is strict UTF-8, of the body and of every percent-escape, so no field holds
    a lone surrogate."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != _FORM:
        return Refused(415, "content_type", f"a form post is {_FORM}")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            max_num_fields=MAX_FORM_FIELDS,
            errors="strict",
        )
    except UnicodeDecodeError as error:
        return Refused(400, "form", f"the form is not UTF-8 ({error.reason})")
    except ValueError:
        return Refused(400, "form", f"the form has over {MAX_FORM_FIELDS} fields")
    fields: dict[str, Value] = {}
    for name, value in pairs:
        earlier = fields.get(name)
        if earlier is None:
            fields[name] = value
        elif isinstance(earlier, list):
            earlier.append(value)
        else:
            fields[name] = [earlier, value]
    return fields
