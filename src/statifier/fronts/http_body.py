"""Reading an HTTP request's body under a size bound and a deadline, and the few
answers every HTTP front shares.

Every HTTP front reads the body it was posted through :func:`read_body`: a declared
length over the bound is refused before a byte is read, and the stream is read no
further than the bound, so an untrusted client can make a front hold at most
``max_body`` bytes for at most the time left before the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from statifier import telemetry
from statifier.extras import MissingExtra

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
    "BodyRefused",
    "check_bounds",
    "method_not_allowed",
    "read_body",
    "text",
]

DEFAULT_MAX_BODY: Final = 1_048_576
"""The largest body a front reads by default: 1 MiB."""
DEFAULT_TIMEOUT: Final = 10.0
"""The seconds a front gives one request by default, the body's reading included."""


@dataclass(frozen=True, slots=True)
class BodyRefused:
    """A body that was not read whole, and the status that says why: 413 (over the
    bound), 408 (not all there before the deadline), 400 (the client went away or
    declared a length that is not a number)."""

    status: int
    reason: str


async def read_body(request: Request, *, max_body: int, deadline: float) -> bytes | BodyRefused:
    """The request's body, at most ``max_body`` bytes, read whole before ``deadline``
    (a time of the running loop's clock, :meth:`asyncio.AbstractEventLoop.time`).

    Never raises for anything the client did: a refusal is the answer.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            return BodyRefused(400, "the content-length is not a number")
        if int(declared) > max_body:
            return BodyRefused(413, f"the body is over {max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body:
                    return BodyRefused(413, f"the body is over {max_body} bytes")
                chunks.append(chunk)
    except TimeoutError:
        return BodyRefused(408, "the body did not arrive in time")
    except ClientDisconnect:
        return BodyRefused(400, "the client went away before the body was read")
    return b"".join(chunks)


class AnyMethod:
    """An endpoint as a plain ASGI app: a Starlette route then takes every method, and
    the endpoint answers the 405 itself, naming the one method it takes.

    Every answer is reported as the telemetry event ``statifier.fronts.request``:
    measurement ``duration`` (seconds, until the answer is chosen), metadata ``front``
    (``"webhook"``, ``"form"`` or ``"basichttp"``), ``source`` and ``status``. Nothing of
    the request (path, query, headers, body) is reported: a BasicHTTP path is a
    credential."""

    def __init__(
        self, answer: Callable[[Request], Awaitable[Response]], *, front: str, source: str
    ) -> None:
        self._answer = answer
        self._front = front
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500
        try:
            response = await self._answer(Request(scope, receive))
            status = response.status_code
        finally:
            telemetry.report(
                "statifier.fronts.request",
                {"duration": time.perf_counter() - started},
                {"front": self._front, "source": self._source, "status": status},
            )
        await response(scope, receive, send)


def check_bounds(max_body: object, timeout: object) -> None:
    """Refuse a body bound or a timeout that is not positive.

    Raises:
        ValueError: either is not positive (or not a number).
    """
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body <= 0:
        raise ValueError(f"max_body is a positive number of bytes, not {max_body!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"timeout is positive seconds, not {timeout!r}")


def method_not_allowed() -> Response:
    """405, naming POST as the one method taken."""
    return Response(status_code=405, headers={"Allow": "POST"})


def text(status_code: int, reason: str) -> Response:
    """An answer with a one-line reason (never a piece of the posted body)."""
    return PlainTextResponse(reason, status_code=status_code)
