"""The service's HTTP listener: uvicorn's HTTP/1.1 protocol (h11) behind a guard, so
that no client can hold the service down.

The guard sits where uvicorn lets a host in: it accepts connections itself, one at a
time, and hands each to :meth:`asyncio.loop.connect_accepted_socket` with uvicorn's
own protocol inside a thin one of its own (asyncio's protocol calls, forwarded); an
ASGI app around the service's tells it when each request begins and ends. It keeps:

- **a deadline for the request head** (``head_timeout``, 10 s): from the accept, or
  the end of the previous response, to a complete request head. Past it the
  connection is answered 408 (when part of a head came) and closed: a client that
  trickles header bytes holds a connection that long and no longer.
- **a deadline for an idle connection** (``idle_timeout``, 5 s): a connection on
  which no byte came within that long of the accept, or of the end of the previous
  response, is closed.
- **a cap on open connections** (``max_connections``; by default
  :func:`default_max_connections`, three quarters of the process's descriptor limit,
  leaving at least 128 descriptors for the database, the brokers and the logs). A
  connection accepted at the cap closes the one that has waited longest for a
  request head (idle or trickling): an honest client reopens an idle connection at
  no cost, and the newcomer is about to send a request. When every connection is
  inside a request, the newcomer is answered 503 and closed at once. The accept waits
  for nothing, so ``/healthz`` and posts get through while idle connections are held.

Because it accepts one connection at a time, and makes room before it accepts
another, the listener never holds more than ``max_connections`` (and the one just
accepted), and accept never runs into the descriptor limit under the default cap.
When it fails anyway (descriptors taken by something else), it waits half a second
and tries again; the failures are logged and reported like the rest.

What the guard does is logged under ``statifier.service.listener`` (warning; an accept
that failed, error) and reported as the telemetry event ``statifier.service.listener``
(``action``: ``shed``, ``refused``, ``head_timeout`` or ``accept_failed``): the first
of each action at once, then one line and one event per ten seconds in which more
came, with their ``count``. A connection closed idle is routine and goes unreported.
A request head still incomplete past 16 KiB is refused by uvicorn itself (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import resource
import socket
from collections.abc import Callable, Iterator
from typing import Any, Final

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from statifier import telemetry
from statifier.repeats import IntervalTally
from statifier.service.settings import HttpSettings

__all__ = [
    "HEADROOM",
    "LINES",
    "Guard",
    "GuardedApp",
    "GuardedConnection",
    "GuardedServer",
    "default_max_connections",
    "http_server",
]

_log = logging.getLogger(__name__)

HEADROOM: Final = 128
"""The fewest descriptors the default cap leaves for everything but HTTP connections."""
_UNLIMITED: Final = 65_536
"""The descriptor limit the default cap is counted from when the process has none."""
_ACCEPT_RETRY: Final = 0.5
"""Seconds the listener waits after an accept that failed for want of resources."""
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_PEER_GONE: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR})
_CONNECTION: Final = "statifier.listener.connection"
"""The key of the per-connection state that carries its guard to the app."""
_REQUEST_TIMEOUT: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 33\r\n\r\nthe request head came too slowly\n"
)
_UNAVAILABLE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: 37\r\n\r\n"
    b"too many connections; try again soon\n"
)


def default_max_connections(limit: int | None = None) -> int:
    """The default cap on open connections: ``limit`` (the process's soft
    ``RLIMIT_NOFILE`` when not given) less a quarter of it, or less :data:`HEADROOM`
    when that is more; at least 1.

    >>> default_max_connections(1024), default_max_connections(65536), default_max_connections(256)
    (768, 49152, 128)
    """
    if limit is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = _UNLIMITED if soft == resource.RLIM_INFINITY else soft
    return max(1, limit - max(HEADROOM, limit // 4))


class Guard:
    """The connections of one listener: its cap and deadlines, which connection has
    waited longest for a request head, and the lines and telemetry of what it closes
    or refuses.

    Args:
        max_connections: the cap on open connections.
        head_timeout: seconds from the accept or the end of a response to a complete
            request head.
        idle_timeout: seconds from the accept or the end of a response to a first byte.

    Raises:
        ValueError: a bound that is not positive.
    """

    def __init__(self, *, max_connections: int, head_timeout: float, idle_timeout: float) -> None:
        if max_connections < 1 or not head_timeout > 0 or not idle_timeout > 0:
            raise ValueError("the cap and the deadlines of a listener are positive")
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.open: set[GuardedConnection] = set()
        """The connections handed to uvicorn and not lost yet."""
        self._waiting: dict[GuardedConnection, None] = {}
        """The connections waiting for a request head, the longest waiting first."""
        self._repeats = IntervalTally()

    def make_room(self) -> bool:
        """Make room for one more connection: under the cap there is; at the cap the
        connection that has waited longest for a request head is closed; returns
        ``False`` when every connection is inside a request (the newcomer is to be
        refused)."""
        if len(self.open) < self.max_connections:
            return True
        oldest = next(iter(self._waiting), None)
        if oldest is None:
            self.note("refused")
            return False
        oldest.shed()
        self.note("shed")
        return True

    def opened(self, connection: GuardedConnection) -> None:
        self.open.add(connection)

    def waiting(self, connection: GuardedConnection) -> None:
        """``connection`` waits for a request head from now on (the newest waiting)."""
        self._waiting.pop(connection, None)
        self._waiting[connection] = None

    def busy(self, connection: GuardedConnection) -> None:
        """``connection`` is inside a request."""
        self._waiting.pop(connection, None)

    def forget(self, connection: GuardedConnection) -> None:
        self.open.discard(connection)
        self._waiting.pop(connection, None)

    def flush(self) -> None:
        """Log and report the counts of the intervals still open (the service stops)."""
        self._repeats.flush()

    def accept_failed(self, error: OSError) -> None:
        self.note("accept_failed", error.strerror or type(error).__name__)

    def note(self, action: str, error: str | None = None) -> None:
        """Log and report ``action`` (a key of :data:`LINES`): the first at once, then
        the count of each interval in which more came."""
        self._repeats.note(
            action,
            lambda: self._report(action, 1, LINES[action][0], error),
            lambda count: self._report(action, count, LINES[action][1], error),
        )

    def _report(self, action: str, count: int, line: str, error: str | None) -> None:
        connections = len(self.open)
        metadata: dict[str, Any] = {"action": action}
        if error is not None:
            metadata["error"] = error
        telemetry.report(
            "statifier.service.listener", {"count": count, "connections": connections}, metadata
        )
        values = {
            "count": count,
            "cap": self.max_connections,
            "head": self.head_timeout,
            "interval": self._repeats.interval,
            "error": error,
        }
        _log.log(
            logging.ERROR if action == "accept_failed" else logging.WARNING,
            line,
            values,
            extra={"action": action, "count": count, "connections": connections},
        )


LINES: Final[dict[str, tuple[str, str]]] = {
    "shed": (
        "at the cap of %(cap)d connections: closed the one waiting longest for a request",
        (
            "at the cap of %(cap)d connections, closed the ones waiting longest for a "
            "request: %(count)d more in the last %(interval)g s"
        ),
    ),
    "refused": (
        "at the cap of %(cap)d connections, all inside a request: answered a new one 503",
        (
            "at the cap of %(cap)d connections, all inside a request, answered new ones "
            "503: %(count)d more in the last %(interval)g s"
        ),
    ),
    "head_timeout": (
        "closed a connection whose request head did not come within %(head)g s",
        (
            "closed connections whose request head did not come within %(head)g s: "
            "%(count)d more in the last %(interval)g s"
        ),
    ),
    "accept_failed": (
        "accepting a connection failed: %(error)s; trying again in half a second",
        "accept failures (%(error)s): %(count)d more in the last %(interval)g s",
    ),
}
"""What the guard logs of each action: the first line, and the line of an interval."""


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: uvicorn's protocol inside, the deadlines around it.

    asyncio's calls are handed on to ``inner``; while no request is in progress, the
    head and idle deadlines run (from the accept, or the end of the last request).
    """

    def __init__(
        self, guard: Guard, make_inner: Callable[[GuardedConnection], H11Protocol]
    ) -> None:
        self.guard = guard
        self.inner = make_inner(self)
        self.transport: asyncio.Transport | None = None
        self.requests = 0
        """Requests in progress (the app running for them)."""
        self.heard = False
        """Whether a byte came since the connection started waiting."""
        self.timers: list[asyncio.TimerHandle] = []

    # asyncio's protocol calls.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.guard.opened(self)
        self.inner.connection_made(transport)
        self._wait()

    def data_received(self, data: bytes) -> None:
        self.heard = True
        self.inner.data_received(data)

    def eof_received(self) -> None:
        self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        self.guard.forget(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # What the guard and the app tell it.

    def begin(self) -> None:
        """A request's head came and its app runs."""
        self.requests += 1
        self._stop_timers()
        self.guard.busy(self)

    def end(self) -> None:
        """A request's app returned."""
        self.requests -= 1
        if self.requests == 0 and self.transport is not None and not self.transport.is_closing():
            self._wait()

    def shed(self) -> None:
        """Close it now, to make room for a newcomer."""
        self.guard.forget(self)
        self._close()

    # The deadlines.

    def _wait(self) -> None:
        self._stop_timers()
        self.heard = False
        loop = asyncio.get_running_loop()
        self.timers = [
            loop.call_later(self.guard.idle_timeout, self._idle_over),
            loop.call_later(self.guard.head_timeout, self._head_over),
        ]
        self.guard.waiting(self)

    def _idle_over(self) -> None:
        if self.requests == 0 and not self.heard:
            self._close()

    def _head_over(self) -> None:
        if self.requests == 0:
            self.guard.note("head_timeout")
            self._close(_REQUEST_TIMEOUT if self.heard else b"")

    def _close(self, answer: bytes = b"") -> None:
        self._stop_timers()
        if self.transport is not None and not self.transport.is_closing():
            if answer:
                self.transport.write(answer)
            # At once: a client that reads nothing must not keep the descriptor.
            self.transport.abort()

    def _stop_timers(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers = []


class GuardedApp:
    """The service's ASGI app, telling each request's connection when the request
    begins and ends (the connection rides in the request's ``state``, put there by
    :class:`GuardedServer`, and is taken out before the app sees it)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        state = scope.get("state")
        connection = state.pop(_CONNECTION, None) if isinstance(state, dict) else None
        if not isinstance(connection, GuardedConnection):
            await self.app(scope, receive, send)
            return
        connection.begin()
        try:
            await self.app(scope, receive, send)
        finally:
            connection.end()


class GuardedServer(uvicorn.Server):
    """uvicorn's server over a socket the service bound, accepting through the guard
    and without signal handlers of its own (the service stops it, in order).

    Args:
        config: uvicorn's configuration, its app a :class:`GuardedApp`.
        listener: the bound socket.
        guard: the cap and the deadlines.
    """

    def __init__(self, config: uvicorn.Config, listener: socket.socket, guard: Guard) -> None:
        super().__init__(config)
        self.listener = listener
        self.guard = guard
        self.accepting: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # no server of uvicorn's: the guard accepts
        self.listener.listen(self.config.backlog)
        self.listener.setblocking(False)
        self.accepting = asyncio.create_task(self._accept(), name="http-accept")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.accepting is not None:
            self.accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.accepting
        await super().shutdown(sockets=None)
        self.guard.flush()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                accepted, _ = await loop.sock_accept(self.listener)
            except OSError as error:
                if error.errno in _PEER_GONE:
                    continue  # the peer gave up between its connect and the accept
                if error.errno not in _OUT_OF_RESOURCES:
                    # The socket itself is broken: stop, so the service sees it.
                    _log.error("the listener cannot accept connections: %s", error)
                    self.should_exit = True
                    return
                self.guard.accept_failed(error)
                await asyncio.sleep(_ACCEPT_RETRY)
                continue
            if not self.guard.make_room():
                _refuse(accepted)
                continue
            try:
                await loop.connect_accepted_socket(self._connection, accepted)
            except OSError:
                accepted.close()  # gone before its transport was made: nothing to serve

    def _connection(self) -> GuardedConnection:
        config, state = self.config, self.server_state

        def inner(connection: GuardedConnection) -> H11Protocol:
            return H11Protocol(
                config=config,
                server_state=state,
                app_state={_CONNECTION: connection},
                _loop=asyncio.get_running_loop(),
            )

        return GuardedConnection(self.guard, inner)


def _refuse(accepted: socket.socket) -> None:
    """Answer 503 to a connection there is no room for, and close it."""
    with contextlib.suppress(OSError):
        accepted.setblocking(False)
        accepted.send(_UNAVAILABLE)
    accepted.close()


def http_server(
    app: Any, settings: HttpSettings, listener: socket.socket, shutdown_timeout: float
) -> GuardedServer:
    """The service's HTTP server: ``app`` on ``listener`` (bound, not yet listening),
    with the ``[http]`` table's cap and deadlines.

    A ``max_connections`` over the default cap is logged at warning: the process may
    run out of descriptors before the listener reaches it.
    """
    ceiling = default_max_connections()
    cap = settings.max_connections or ceiling
    if cap > ceiling:
        _log.warning(
            "[http] max_connections = %d is over %d, what the descriptor limit leaves: "
            "accepts may fail before the cap is reached",
            cap,
            ceiling,
            extra={"max_connections": cap, "default": ceiling},
        )
    guard = Guard(
        max_connections=cap, head_timeout=settings.head_timeout, idle_timeout=settings.idle_timeout
    )
    config = uvicorn.Config(
        GuardedApp(app),
        http="h11",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=settings.access_log,
        timeout_graceful_shutdown=max(1, int(shutdown_timeout)),
        # uvicorn's own keep-alive deadline, never before the guard's idle one.
        timeout_keep_alive=max(1, math.ceil(settings.idle_timeout)),
        server_header=False,
    )
    return GuardedServer(config, listener, guard)
