"""Drive a chart through a script of events on a virtual clock, recording each step.

This is the engine behind ``statifier trace``. The chart runs as a live session
(:mod:`statifier.session.live`) on a :class:`~statifier.session.clock.VirtualClock`,
so it sends, arms and cancels timers, and invokes child charts exactly as it would in
production, but never waits. Only the traced chart's own steps are recorded; invoked
children run inside it.

The script is a list of events and :class:`Advance` items. Order of delivery, which
makes every run deterministic:

1. after each step, events the chart sent to itself (and those its children sent to
   it) are delivered first, in order;
2. then the next item of the script: an event is delivered; an ``Advance(ms)`` lets
   ``ms`` milliseconds of virtual time pass, firing the timers that fall due within
   them in order of due time (ties by the order they were armed), each followed by
   what it sets off, and leaves the clock at the end of the span;
3. when the script is done, pending delayed sends fire in order of due time,
   advancing the virtual clock, until none remain, the chart finishes, or
   ``max_steps`` steps have been taken.

>>> from statifier.chart import compile_chart
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><onentry><send event="tick" delay="5s"/></onentry>'
...     '<transition event="tick" target="b"/><transition event="poke" target="c"/></state>'
...     '<final id="b"/><final id="c"/></scxml>'
... )
>>> [(step.event, step.configuration, step.at_ms) for step in run(chart, [])]
[(None, ('a',), 0), ('tick', ('b',), 5000)]
>>> script = [Advance(4000), Event("poke")]
>>> [(step.event, step.configuration, step.at_ms) for step in run(chart, script)]
[(None, ('a',), 0), ('poke', ('c',), 4000)]

``src`` attributes are read by a :class:`BesideChart` loader when one is given: only
files in the chart's directory (or below it), at most :data:`MAX_SRC_BYTES` each.
With ``basichttp=True`` the trace serves the BasicHTTP Event I/O Processor on
127.0.0.1 (an ephemeral port) and sends BasicHTTP events to loopback addresses only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from statifier.chart import Machine
from statifier.core import Event
from statifier.core.effects import Effect
from statifier.session.basichttp import BasicHTTP
from statifier.session.clock import VirtualClock
from statifier.session.handlers import Delivery, SendType
from statifier.session.live import Session, System

__all__ = [
    "MAX_SRC_BYTES",
    "Advance",
    "BesideChart",
    "SrcRefused",
    "Step",
    "refused_invokes",
    "run",
]

DEFAULT_MAX_STEPS = 1_000
SESSION_ID = "trace"
MAX_SRC_BYTES: Final = 1024 * 1024
"""The most a ``src`` file may hold (1 MiB)."""
_SERVER_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Step:
    """One step: the event delivered (``None`` for the start), the sorted active leaf
    configuration afterwards (the one held at the end, once finished), the effects,
    and the virtual time in milliseconds at which it ran."""

    event: str | None
    configuration: tuple[str, ...]
    effects: tuple[Effect, ...]
    at_ms: int
    finished: bool


@dataclass(frozen=True, slots=True)
class Advance:
    """A script item: let ``ms`` milliseconds of virtual time pass."""

    ms: int

    def __post_init__(self) -> None:
        if self.ms < 0:
            raise ValueError("time only moves forward")


def run(
    machine: Machine,
    events: Iterable[Event | Advance],
    *,
    trace: bool = False,
    max_steps: int = DEFAULT_MAX_STEPS,
    loader: Callable[[str], str] | None = None,
    basichttp: bool = False,
    serving: Callable[[str], None] | None = None,
) -> list[Step]:
    """Start ``machine``, play the script ``events`` and return every step the chart took.

    ``loader`` reads ``<invoke src>`` (``<data src>`` and ``<script src>`` are read when
    the chart is compiled: pass the same loader to ``compile_chart``). ``basichttp``
    serves and sends BasicHTTP events on loopback (it needs the ``http`` extra);
    ``serving`` is then called with the location the chart receives at, once the
    server listens. The server is stopped before this returns.

    Runs its own event loop, so call it from synchronous code (inside a running loop,
    start a ``System`` with a ``VirtualClock`` and an ``on_step`` observer instead).
    """
    script = list(events)
    return asyncio.run(_run(machine, script, trace, max_steps, loader, basichttp, serving))


async def _run(
    machine: Machine,
    script: list[Event | Advance],
    trace: bool,
    max_steps: int,
    loader: Callable[[str], str] | None,
    basichttp: bool,
    serving: Callable[[str], None] | None,
) -> list[Step]:
    clock = VirtualClock()
    steps: list[Step] = []

    def record(session: Session, event: Event | None, effects: list[Effect]) -> None:
        if len(steps) < max_steps:
            name = None if event is None else event.name
            steps.append(
                Step(
                    name, session.configuration, tuple(effects), clock.now_ms(), not session.running
                )
            )

    async with contextlib.AsyncExitStack() as stack:
        system = System(clock, loader=loader)
        send_types: Mapping[str, SendType] = {}
        if basichttp:
            send_types = await stack.enter_async_context(_loopback_http(system))
            location = _processor(send_types).location(SESSION_ID)
            if serving is not None and location is not None:
                serving(location)
        # Closed first: in-flight sends are cancelled before the client and server go.
        stack.push_async_callback(system.close)
        session = await system.start(
            machine, session_id=SESSION_ID, trace=trace, on_step=record, send_types=send_types
        )

        def going() -> bool:
            return session.running and len(steps) < max_steps

        await system.settle()
        for item in script:
            if not going():
                break
            if isinstance(item, Advance):
                await _advance(system, clock, item.ms, going)
            else:
                session.send(item)
                await system.settle()
        while going():
            await system.settle()
            if not clock.advance():
                break
        await system.settle()
    return steps


async def _advance(system: System, clock: VirtualClock, ms: int, going: Callable[[], bool]) -> None:
    """Fire, in order, every timer due within the next ``ms`` milliseconds (those armed
    meanwhile included), settling after each; the clock ends at the end of the span."""
    until = clock.now_ms() + ms
    # A timer that does nothing, so the clock reaches ``until`` even when nothing else
    # is due; armed after the timers already pending, it fires after those due at
    # ``until`` too, and the loop goes on to any armed meanwhile for that instant.
    marker = clock.call_later(ms, _nothing)
    while going() and clock.advance(until_ms=until):
        await system.settle()
    marker.cancel()


def _nothing() -> None:
    pass


# -- src beside the chart -------------------------------------------------------------------


class SrcRefused(Exception):  # noqa: N818 - the name says what happened to the src
    """A ``src`` the trace does not read, and why."""


class BesideChart:
    """A loader for ``src`` attributes reading only files in one directory (the
    chart's) or below it.

    A ``src`` is a path relative to the directory, an absolute path inside it, or a
    ``file:`` URI of either (``file:data.json``, ``file:///charts/data.json``). It is
    refused (:class:`SrcRefused`) when it leaves the directory, by ``..``, by an absolute
    path elsewhere or through a symbolic link pointing out; when it names another
    scheme (``http:`` and so on: nothing is fetched from the network); when the file is
    not a regular file, is over ``limit`` bytes or is not UTF-8.

    >>> import tempfile
    >>> scratch = tempfile.TemporaryDirectory()
    >>> _ = (Path(scratch.name) / "limit.json").write_text("3")
    >>> load = BesideChart(scratch.name)
    >>> load("limit.json"), load("file:limit.json")
    ('3', '3')
    >>> load("../elsewhere.json")
    Traceback (most recent call last):
      ...
    statifier.session.trace.SrcRefused: the path leaves the chart's directory ...
    >>> load("http://example.com/limit.json")
    Traceback (most recent call last):
      ...
    statifier.session.trace.SrcRefused: only files beside the chart are read, not http: URIs
    >>> scratch.cleanup()
    """

    def __init__(self, directory: str | os.PathLike[str], *, limit: int = MAX_SRC_BYTES) -> None:
        self.directory = Path(directory).resolve()
        self.limit = limit

    @classmethod
    def of(cls, chart: str | os.PathLike[str], *, limit: int = MAX_SRC_BYTES) -> BesideChart:
        """The loader for the chart file ``chart``: its directory as named (the chart
        file itself may be a symbolic link to elsewhere)."""
        return cls(Path(chart).absolute().parent, limit=limit)

    def where(self, src: str) -> Path:
        """The file ``src`` names, symbolic links resolved, without reading it.

        Raises:
            SrcRefused: ``src`` is empty, names a scheme other than ``file:``, or leaves
                the directory.
        """
        path = _path_of(src)
        candidate = path if path.is_absolute() else self.directory / path
        if not _inside(Path(os.path.normpath(candidate)), self.directory):
            raise SrcRefused(f"the path leaves the chart's directory {self.directory}")
        resolved = candidate.resolve()
        if not _inside(resolved, self.directory):
            raise SrcRefused(f"a symbolic link leads out of the chart's directory {self.directory}")
        return resolved

    def __call__(self, src: str) -> str:
        """The text of the file ``src`` names.

        Raises:
            SrcRefused: as :meth:`where`, or the file cannot be read, is not a regular
                file, is over the limit or is not UTF-8.
        """
        path = self.where(src)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            descriptor = os.open(path, flags)
        except OSError as error:
            raise SrcRefused(f"{path}: {error.strerror}") from None
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise SrcRefused(f"{path} is not a regular file")
        with open(descriptor, "rb") as handle:
            data = handle.read(self.limit + 1)
        if len(data) > self.limit:
            raise SrcRefused(f"{path} is over {self.limit} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SrcRefused(f"{path} is not UTF-8 text") from None


def _path_of(src: str) -> Path:
    text = src.strip()
    if not text:
        raise SrcRefused("the src is empty")
    parts = urlsplit(text)
    if not parts.scheme:
        return Path(text)
    if parts.scheme.lower() != "file":
        raise SrcRefused(f"only files beside the chart are read, not {parts.scheme}: URIs")
    if parts.netloc not in ("", "localhost"):
        raise SrcRefused(f"a file: URI names no host here, not {parts.netloc!r}")
    if parts.query or parts.fragment:
        raise SrcRefused("a file: URI takes no query or fragment here")
    path = unquote(parts.path)
    if not path:
        raise SrcRefused("the file: URI names no file")
    return Path(path)


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or path.is_relative_to(directory)


def refused_invokes(machine: Machine, loader: BesideChart) -> list[str]:
    """``LINE:COLUMN: message`` for each ``<invoke src>`` written in the chart that
    ``loader`` refuses outright (a scheme or a path out of its directory). A file that
    is merely missing is not reported: the invocation fails when it runs, as the chart
    may expect."""
    problems: list[str] = []
    for state in machine.states:
        for invoke in state.invokes:
            if invoke.src is None:
                continue
            try:
                loader.where(invoke.src)
            except SrcRefused as refused:
                where = invoke.where
                problems.append(
                    f"{where.line}:{where.column}: cannot load {invoke.src!r}: {refused}"
                )
    return problems


# -- BasicHTTP on loopback ------------------------------------------------------------------


class _LoopbackHTTP(BasicHTTP):
    """BasicHTTP that delivers to loopback addresses only: a traced chart reaches
    nothing beyond this machine."""

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        host = urlsplit(target or "").hostname
        if host is not None and not _loopback(host):
            return f"statifier trace sends BasicHTTP events to loopback only, not {target!r}"
        return super().plan(target, event)


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _processor(send_types: Mapping[str, SendType]) -> BasicHTTP:
    sender = send_types["basichttp"]
    assert isinstance(sender, BasicHTTP)
    return sender


@contextlib.asynccontextmanager
async def _loopback_http(system: System) -> AsyncIterator[Mapping[str, SendType]]:
    """Serve ``system``'s sessions on 127.0.0.1 (an ephemeral port) and yield the send
    types posting to loopback; on exit close the client, then stop the server."""
    import httpx  # the http extra is needed only here
    import uvicorn

    from statifier.session.basichttp import basichttp_app

    config = uvicorn.Config(
        basichttp_app(system),
        host="127.0.0.1",
        port=0,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        http="h11",
        timeout_graceful_shutdown=int(_SERVER_TIMEOUT_S),
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                raise OSError("the BasicHTTP server did not start on 127.0.0.1")
            await asyncio.sleep(0.005)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(trust_env=False, timeout=_SERVER_TIMEOUT_S) as client:
            sender = _LoopbackHTTP(client, base_url=f"http://127.0.0.1:{port}")
            yield sender.send_types()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=_SERVER_TIMEOUT_S)
