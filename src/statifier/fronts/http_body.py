"""Reading an HTTP request's body under a size bound and a deadline, the refusals
every HTTP front answers, and how they reach an operator.

Every HTTP front reads the body it was posted through :func:`read_body`: a declared
length over the bound is refused before a byte is read, and the stream is read no
further than the bound, so an untrusted client can make a front hold at most
``max_body`` bytes for at most the time left before the deadline.

A front answers what it refuses as a :class:`Refused`: the status, the short name of
the rule the request broke, and a one-line reason. :class:`AnyMethod` turns it into
the answer, reports it as telemetry and logs it at warning level: the first of a
rule at once, then one line with the count of each ten seconds in which the rule
refused more; never with the body, a header or the path (a BasicHTTP path is a
credential).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from statifier import telemetry
from statifier.extras import MissingExtra
from statifier.repeats import IntervalTally

try:
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.types import Receive, Scope, Send
except ModuleNotFoundError as missing:  # Starlette: the http extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_TIMEOUT",
    "AnyMethod",
    "Refused",
    "check_bounds",
    "method_not_allowed",
    "read_body",
    "text",
]

DEFAULT_MAX_BODY: Final = 1_048_576
"""The largest body a front reads by default: 1 MiB."""
DEFAULT_TIMEOUT: Final = 10.0
"""The seconds a front gives one request by default, the body's reading included."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Refused:
    """A request a front refuses.

    Attributes:
        status: the HTTP status answered (4xx, or 503 for one not handled in time).
        rule: the short name of the rule broken (``"size"``, ``"json"``,
            ``"verifier"``...): in the log line and the telemetry, and what repeated
            lines are bounded by.
        reason: the one-line answer, never a piece of the request.
        allow: the methods named in ``Allow`` (a 405).
    """

    status: int
    rule: str
    reason: str
    allow: str | None = None


async def read_body(request: Request, *, max_body: int, deadline: float) -> bytes | Refused:
    """The request's body, at most ``max_body`` bytes, read whole before ``deadline``
    (a time of the running loop's clock, :meth:`asyncio.AbstractEventLoop.time`).

    Never raises for anything the client did: a refusal is the answer.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            return Refused(400, "length", "the content-length is not a number")
        if int(declared) > max_body:
            return Refused(413, "size", f"the body is over {max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body:
                    return Refused(413, "size", f"the body is over {max_body} bytes")
                chunks.append(chunk)
    except TimeoutError:
        return Refused(408, "slow_body", "the body did not arrive in time")
    except ClientDisconnect:
        return Refused(400, "gone", "the client went away before the body was read")
    return b"".join(chunks)


class AnyMethod:
    """An endpoint as a plain ASGI app: a Starlette route then takes every method, and
    the endpoint answers the 405 itself, naming the one method it takes.

    Every answer is reported as the telemetry event ``statifier.fronts.request``:
    measurement ``duration`` (seconds, until the answer is chosen), metadata ``front``
    (``"webhook"``, ``"form"`` or ``"basichttp"``), ``source``, ``status``, and for a
    :class:`Refused` answer its ``refusal`` (the rule) and ``reason`` (``None``
    otherwise). Nothing of the request (path, query, headers, body) is reported: a
    BasicHTTP path is a credential. A refusal is also logged at warning level under
    ``statifier.fronts.http_body``: the first of its status and rule at once, then one
    line at the end of each ten seconds in which more came, with their count."""

    def __init__(
        self,
        answer: Callable[[Request], Awaitable[Response | Refused]],
        *,
        front: str,
        source: str,
    ) -> None:
        self._answer = answer
        self._front = front
        self._source = source
        self._repeats = IntervalTally()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500
        refused: Refused | None = None
        try:
            answered = await self._answer(Request(scope, receive))
            if isinstance(answered, Refused):
                refused = answered
                response = _refusal(answered)
                self._warn(answered)
            else:
                response = answered
            status = response.status_code
        finally:
            telemetry.report(
                "statifier.fronts.request",
                {"duration": time.perf_counter() - started},
                {
                    "front": self._front,
                    "source": self._source,
                    "status": status,
                    "refusal": None if refused is None else refused.rule,
                    "reason": None if refused is None else refused.reason,
                },
            )
        await response(scope, receive, send)

    def _warn(self, refused: Refused) -> None:
        fields = {
            "front": self._front,
            "source": self._source,
            "status": refused.status,
            "refusal": refused.rule,
        }

        def first() -> None:
            _log.warning(
                "%s %s refused a request: %d %s",
                self._front,
                self._source,
                refused.status,
                refused.reason,
                extra={**fields, "count": 1},
            )

        def later(count: int) -> None:
            _log.warning(
                "%s %s refused requests by the rule %s (%d): %d more in the last %g s",
                self._front,
                self._source,
                refused.rule,
                refused.status,
                count,
                self._repeats.interval,
                extra={**fields, "count": count},
            )

        self._repeats.note((refused.status, refused.rule), first, later)


def _refusal(refused: Refused) -> Response:
    response = text(refused.status, refused.reason)
    if refused.allow is not None:
        response.headers["Allow"] = refused.allow
    return response


def check_bounds(max_body: object, timeout: object) -> None:
    """Refuse a body bound or a timeout that is not positive.

    Raises:
        ValueError: either is not positive (or not a number).
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body <= 0:
        raise ValueError(f"max_body is a positive number of bytes, not {max_body!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout is positive seconds, not {timeout!r}")


def method_not_allowed() -> Refused:
    """405, naming POST as the one method taken."""
    return Refused(405, "method", "a front takes POST only", allow="POST")


def text(status_code: int, reason: str) -> Response:
    """An answer with a one-line reason (never a piece of the posted body)."""
    return PlainTextResponse(reason, status_code=status_code)
