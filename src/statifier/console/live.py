"""Live updates: a server-sent event when what the console lists has changed.

One :class:`Live` per console polls a cheap probe (the read side's
:meth:`~statifier.console.queries.ConsoleQueries.fingerprint`: the newest write time of
each listed table) every :attr:`Live.interval` seconds, and only while a browser
listens: one poller for all the clients, however many. When the answer moves, every
client's stream of ``GET /console/events`` (``text/event-stream``) receives::

    event: changed
    data: {}

and the console's script fetches the page again and replaces its live fragments. A
comment line every :data:`HEARTBEAT` seconds keeps proxies from closing an idle stream;
a stream ends after :data:`STREAM_LIFETIME` seconds (the browser reconnects, after the
``retry`` the stream announced), and at once when :meth:`Live.close` is called (the
service stopping), so no stream holds a shutdown up. At most :attr:`Live.max_clients`
streams are open at once; one more is answered 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

__all__ = ["HEARTBEAT", "STREAM_LIFETIME", "Live", "TooManyClients"]

HEARTBEAT: Final = 15.0
"""Seconds between comment lines on an idle stream."""
STREAM_LIFETIME: Final = 300.0
"""Seconds one stream lasts before the browser is asked to reconnect."""
RETRY_MS: Final = 2000
"""The reconnection delay a stream announces, in milliseconds."""

_log = logging.getLogger("statifier.console")


class TooManyClients(Exception):  # noqa: N818 - names the refusal
    """Every stream slot is taken."""


class Live:
    """Watches ``probe`` and tells every open stream when its answer changes.

    Args:
        probe: returns a value that changes when the listed tables change (compared
            with ``==``); called every ``interval`` seconds while a stream is open.
        interval: seconds between probes.
        max_clients: the most streams open at once.
    """

    def __init__(
        self,
        probe: Callable[[], Awaitable[object]],
        *,
        interval: float = 0.5,
        max_clients: int = 32,
    ) -> None:
        if not interval > 0 or max_clients < 1:
            raise ValueError("interval is positive seconds, max_clients a positive count")
        self.probe = probe
        self.interval = interval
        self.max_clients = max_clients
        self._clients: set[asyncio.Queue[str]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @property
    def clients(self) -> int:
        """How many streams are open."""
        return len(self._clients)

    def close(self) -> None:
        """End every stream now and refuse new ones (the service is stopping)."""
        self._closed.set()
        for queue in self._clients:
            queue.put_nowait("close")

    def join(self) -> asyncio.Queue[str]:
        """A queue that hears ``"changed"`` (and ``"close"``) until :meth:`leave`; the
        poller starts with the first client.

        Raises:
            TooManyClients: :attr:`max_clients` streams are open, or :meth:`close` was
                called.
        """
        if self._closed.is_set() or len(self._clients) >= self.max_clients:
            raise TooManyClients
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=4)
        self._clients.add(queue)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="console-live")
        return queue

    def leave(self, queue: asyncio.Queue[str]) -> None:
        """Stop telling ``queue``; the poller stops with the last client (it is only
        cancelled, not awaited: a stream that leaves may itself be being cancelled)."""
        self._clients.discard(queue)
        if not self._clients and self._poller is not None:
            self._poller.cancel()
            self._poller = None

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[str]]:
        """:meth:`join` for the block, :meth:`leave` after it.

        Raises:
            TooManyClients: as :meth:`join`.
        """
        queue = self.join()
        try:
            yield queue
        finally:
            self.leave(queue)

    async def stream(
        self,
        queue: asyncio.Queue[str],
        *,
        lifetime: float = STREAM_LIFETIME,
        heartbeat: float = HEARTBEAT,
    ) -> AsyncIterator[str]:
        """The text of one event stream over ``queue``: the ``retry`` line, then one
        ``changed`` event per change, comments while idle; it ends after ``lifetime``
        seconds or on :meth:`close`."""
        loop = asyncio.get_running_loop()
        ends = loop.time() + lifetime
        yield f"retry: {RETRY_MS}\n\n"
        while True:
            left = ends - loop.time()
            if left <= 0 or self._closed.is_set():
                return
            try:
                said = await asyncio.wait_for(queue.get(), min(heartbeat, left))
            except TimeoutError:
                yield ": idle\n\n"
                continue
            if said == "close":
                return
            yield "event: changed\ndata: {}\n\n"

    async def _poll(self) -> None:
        last: object = None
        known = False
        while True:
            try:
                now = await self.probe()
            except Exception:  # noqa: BLE001 - a failed probe is tried again
                _log.warning("the console's change probe failed", exc_info=True)
            else:
                if known and now != last:
                    for queue in list(self._clients):
                        with contextlib.suppress(asyncio.QueueFull):
                            queue.put_nowait("changed")  # a full queue has a change already
                last, known = now, True
            await asyncio.sleep(self.interval)
