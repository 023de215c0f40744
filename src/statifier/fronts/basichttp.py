"""The BasicHTTP front (W3C SCXML C.2): events posted to the location of a durable
execution.

A configuration with ``basichttp`` gives each execution created under a new address
row a location, ``<base_url>/<token>`` (:mod:`statifier.router.locations`).
:func:`basichttp_app` is the ASGI app to mount at the base URL's path; it answers
``POST /<token>``:

- 405 with ``Allow: POST`` for any other method;
- 413 for a body over ``max_body``, 408 for one not all there in time;
- 400 for a post the decoder refuses (see
  :func:`statifier.session.basichttp.decode_post`: the event is named by
  ``_scxmleventname``, a form's other fields are its data, any other body is its data
  as text, never parsed as JSON; a body that is not UTF-8, a lone surrogate's
  encoding included, is refused) or a malformed ``scxml-send-key``;
- 404 for a token that reaches no execution: unknown, rotated away, or its execution
  has ended;
- 204 once the event is delivered (taken by a transition or not), and for a
  duplicate: a post carrying ``scxml-send-key`` is delivered once per execution and
  key within the configuration's horizon (72 hours by default); one without it is
  delivered every time;
- 500 for a delivery that did not settle (it was rolled back), 503 for one that ran
  out of time.

The deliveries are the router's own (:meth:`~statifier.router.Router.deliver_post`: the
ledger files them under the reserved binding id ``basichttp``; ``around_delivery`` wraps
each with the entry ``basichttp``, once the token's scope is known), with ``create =
never``: a post never starts an execution.

The token is a bearer capability and appears in the request path: keep the server's
access log from recording paths under the base URL. Nothing here logs a token or a
body; a 500 is logged with the error's type name only (once per type and interval:
:class:`~statifier.repeats.Repeats`), a refusal (404 included) at
warning level with its rule, once per rule and interval.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, TypeVar

from statifier.extras import MissingExtra
from statifier.fronts.http_body import (
    DEFAULT_MAX_BODY,
    DEFAULT_TIMEOUT,
    AnyMethod,
    Refused,
    check_bounds,
    method_not_allowed,
    read_body,
)
from statifier.repeats import Repeats
from statifier.router import ConfigError, Dropped, DropReason, Outcome, Router, ShardedRouter
from statifier.session.basichttp import decode_post

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
except ModuleNotFoundError as missing:  # Starlette: the http extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "MAX_SEND_KEY_LENGTH",
    "SEND_KEY_HEADER",
    "basichttp_app",
    "send_key_refusal",
]

SEND_KEY_HEADER: Final = "scxml-send-key"
"""The header a sender names a post by, so that its retry is a duplicate."""
MAX_SEND_KEY_LENGTH: Final = 256

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
_NOWHERE: Final = Refused(404, "location", "no execution takes events at this location")


def send_key_refusal(send_key: str) -> str | None:
    """Why ``send_key`` is refused, or ``None``: a send key is 1 to 256 visible ASCII
    characters.

    >>> send_key_refusal("manifest-7"), send_key_refusal("two words")
    (None, 'a send key is 1 to 256 visible ASCII characters')
    """
    if 0 < len(send_key) <= MAX_SEND_KEY_LENGTH and all("!" <= c <= "~" for c in send_key):
        return None
    return f"a send key is 1 to {MAX_SEND_KEY_LENGTH} visible ASCII characters"


def basichttp_app(
    router: Router | ShardedRouter,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    timeout: float = DEFAULT_TIMEOUT,
) -> Starlette:
    """The BasicHTTP front as an ASGI app answering ``POST /{token}`` (see the module
    docstring for the statuses).

    Args:
        router: a router whose configuration has ``basichttp``.
        max_body: the largest body read, in bytes.
        timeout: the seconds one request may take, the body's reading included.

    Raises:
        ConfigError: the configuration has no ``basichttp``.
        ValueError: a ``max_body`` or ``timeout`` that is not positive.
    """
    if router.config.basichttp is None:
        raise ConfigError("the BasicHTTP front needs a configuration with basichttp")
    check_bounds(max_body, timeout)
    failures = Repeats()  # a database that is down fails every post alike

    async def answer(request: Request) -> Response | Refused:
        if request.method != "POST":
            return method_not_allowed()
        deadline = asyncio.get_running_loop().time() + timeout
        body = await read_body(request, max_body=max_body, deadline=deadline)
        if isinstance(body, Refused):
            return body
        query: bytes = request.scope.get("query_string", b"")
        event = decode_post(request.headers.get("content-type"), body, query)
        if isinstance(event, str):
            return Refused(400, "event", event)
        send_key = request.headers.get(SEND_KEY_HEADER)
        if send_key is not None and (refused := send_key_refusal(send_key)) is not None:
            return Refused(400, "send_key", refused)
        token = str(request.path_params["token"])
        try:
            async with asyncio.timeout_at(deadline):
                outcome = await router.deliver_post(token, event, send_key=send_key)
        except TimeoutError:
            return Refused(503, "deadline", "the event was not delivered in time; post it again")
        except Exception as error:  # noqa: BLE001 - the post's answer, never the server's
            said = type(error).__name__
            failures.log(_log, logging.ERROR, said, "basichttp: a delivery failed with %s", said)
            return Response(status_code=500)
        answered = _status(outcome)
        return _NOWHERE if answered == 404 else Response(status_code=answered)

    answered = AnyMethod(answer, front="basichttp", source="basichttp")
    return Starlette(routes=[Route("/{token}", answered)])


def _status(outcome: Outcome | None) -> int:
    """204 for a delivered event (used or not) or a duplicate; 404 for no execution."""
    if outcome is None:
        return 404
    if isinstance(outcome, Dropped):
        return 204 if outcome.reason is DropReason.UNMATCHED_EVENT else 404
    return 204
