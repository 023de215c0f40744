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

Each step also carries its :attr:`Step.notices`, in the order they happened: an
:class:`ErrorRaised` for every ``error.*`` event the chart took off a queue
(``error.execution``, ``error.communication``; the event's data says why), and a
:class:`NoTransition` for every other event no transition took (``done.*`` events,
which a chart often leaves alone, are left out). They are gathered whether or not
``trace`` asks for the trace effects. :func:`effect_json` gives an effect's JSON form
with states named by id instead of by index.

>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<datamodel><data id="n" expr="0"/></datamodel>'
...     '<state id="a"><transition event="go" cond="n / 0 > 1" target="b"/></state>'
...     '<final id="b"/></scxml>'
... )
>>> start, go = run(chart, [Event("go")])
>>> [type(notice).__name__ for notice in go.notices]
['NoTransition', 'ErrorRaised']
>>> go.notices[0].event, go.notices[1].event.name, go.notices[1].event.data["message"]
('go', 'error.execution', 'Division by zero')

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
import re
import stat
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias
from urllib.parse import unquote, urlsplit

from statifier.chart import Machine
from statifier.core import Event
from statifier.core import effects as fx
from statifier.core.effects import Effect, as_json
from statifier.expr.tagged import encode
from statifier.session.basichttp import BasicHTTP
from statifier.session.clock import VirtualClock
from statifier.session.handlers import Delivery, SendType
from statifier.session.live import Session, System

__all__ = [
    "MAX_SRC_BYTES",
    "Advance",
    "BesideChart",
    "ErrorRaised",
    "NoTransition",
    "Notice",
    "SrcRefused",
    "Step",
    "effect_json",
    "notice_json",
    "refused_invokes",
    "run",
    "state_name",
]

DEFAULT_MAX_STEPS = 1_000
SESSION_ID = "trace"
MAX_SRC_BYTES: Final = 1024 * 1024
"""The most a ``src`` file may hold (1 MiB)."""
_SERVER_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class ErrorRaised:
    """An ``error.*`` event the chart took off one of its queues; ``event.data`` says
    why (for ``error.execution`` raised by the chart: ``element``, ``reason``,
    ``message``, ``line`` and ``column``; for one raised by the session, ``message``).
    ``before`` is the index in the step's effects of the first effect that followed."""

    event: Event
    before: int


@dataclass(frozen=True, slots=True)
class NoTransition:
    """An event (not ``done.*`` nor ``error.*``) that no transition took, off the
    ``external`` or ``internal`` queue; ``before`` as for :class:`ErrorRaised`."""

    event: str
    _: KW_ONLY
    queue: Literal["external", "internal"]
    before: int


Notice: TypeAlias = ErrorRaised | NoTransition


@dataclass(frozen=True, slots=True)
class Step:
    """One step: the event delivered (``None`` for the start), the sorted active leaf
    configuration afterwards (the one held at the end, once finished), the effects
    (trace effects only when the run asked for them), the virtual time in
    milliseconds at which it ran, whether the chart had finished, and the notices."""

    event: str | None
    _: KW_ONLY
    configuration: tuple[str, ...]
    effects: tuple[Effect, ...]
    at_ms: int
    finished: bool
    notices: tuple[Notice, ...] = ()


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
            kept, notices = _notices(effects, trace)
            steps.append(
                Step(
                    name,
                    configuration=session.configuration,
                    effects=kept,
                    at_ms=clock.now_ms(),
                    finished=not session.running,
                    notices=notices,
                )
            )

    async with contextlib.AsyncExitStack() as stack:
        # The trace prints each error no transition took: no warning beside it.
        system = System(clock, loader=loader, warn_untaken=False)
        send_types: Mapping[str, SendType] = {}
        if basichttp:
            send_types = await stack.enter_async_context(_loopback_http(system))
            location = _processor(send_types).location(SESSION_ID)
            if serving is not None and location is not None:
                serving(location)
        # Closed first: in-flight sends are cancelled before the client and server go.
        stack.push_async_callback(system.close)
        # Always traced: the notices are read off the trace effects.
        session = await system.start(
            machine, session_id=SESSION_ID, trace=True, on_step=record, send_types=send_types
        )

        def going() -> bool:
            return session.running and len(steps) < max_steps

        await system.drain()
        for item in script:
            if not going():
                break
            if isinstance(item, Advance):
                await _advance(system, clock, item.ms, going)
            else:
                session.send(item)
                await system.drain()
        while going():
            await system.drain()
            if not clock.advance():
                break
        await system.drain()
    return steps


_TRACE_KINDS: Final = (
    fx.TraceEventDequeued,
    fx.TraceTransitionsSelected,
    fx.TraceExitSet,
    fx.TraceEntrySet,
    fx.TraceContentExecuted,
    fx.TraceMacrostepStable,
    fx.TraceDone,
    fx.TraceInvokePass,
    fx.TraceFinalizeAutoforward,
)


def _notices(effects: list[Effect], trace: bool) -> tuple[tuple[Effect, ...], tuple[Notice, ...]]:
    """The effects to keep (trace effects only when ``trace``) and the notices read
    off the trace effects, each placed before the kept effect that followed it."""
    kept: list[Effect] = []
    notices: list[Notice] = []
    dequeued: fx.TraceEventDequeued | None = None
    for effect in effects:
        if isinstance(effect, fx.TraceEventDequeued):
            dequeued = effect
            name = effect.event.name
            if name == "error" or name.startswith("error."):
                notices.append(ErrorRaised(effect.event, len(kept)))
        elif (
            isinstance(effect, fx.TraceTransitionsSelected)
            and dequeued is not None
            and dequeued.event.name == effect.event
        ):
            if not effect.transitions and not _quiet(effect.event):
                queue: Literal["external", "internal"] = (
                    "internal" if dequeued.queue == "internal" else "external"
                )
                notices.append(NoTransition(effect.event, queue=queue, before=len(kept)))
            dequeued = None
        # The interpreter's own reports of errors and unused events are the notices.
        if isinstance(effect, fx.ChartError | fx.Unmatched):
            continue
        if trace or not isinstance(effect, _TRACE_KINDS):
            kept.append(effect)
    return tuple(kept), tuple(notices)


def _quiet(name: str) -> bool:
    """Events whose going untaken is no news: ``done.*`` (a chart leaves most alone)
    and ``error.*`` (reported as errors already)."""
    return name.split(".", 1)[0] in ("done", "error")


def state_name(machine: Machine, index: int) -> str:
    """How output names a state: its id; ``<scxml>`` for the root; an unnamed state as
    its element and where it is written (``<state 4:3>``)."""
    state = machine.states[index]
    if state.id is not None:
        return state.id
    if index == 0:
        return "<scxml>"
    return f"<{state.kind} {state.where}>"


def _transition_json(machine: Machine, index: int) -> dict[str, Any]:
    transition = machine.transitions[index]
    return {
        "source": state_name(machine, transition.source),
        "event": transition.event_text,
        "targets": [state_name(machine, target) for target in transition.targets],
        "line": transition.where.line,
        "column": transition.where.column,
    }


def _owner(machine: Machine, owner: str) -> str:
    """A content owner with its state named (``onentry:open:0``) and a transition
    given by where it is written (``transition:4:7``)."""
    kind, _, rest = owner.partition(":")
    if not rest:
        return owner
    first, _, ordinal = rest.partition(":")
    if kind == "transition":
        where = machine.transitions[int(first)].where
        return f"transition:{where.line}:{where.column}"
    named = f"{kind}:{state_name(machine, int(first))}"
    return f"{named}:{ordinal}" if ordinal else named


_STATE_LISTS: Final = frozenset({"states", "configuration"})
_INDEXED_LISTS: Final = (
    fx.TraceExitSet,
    fx.TraceEntrySet,
    fx.TraceMacrostepStable,
    fx.TraceDone,
    fx.TraceInvokePass,
)


def effect_json(machine: Machine, effect: Effect) -> dict[str, Any]:
    """:func:`~statifier.core.effects.as_json` with every state named by id
    (:func:`state_name`) rather than by index: ``state_index`` becomes ``state``; the
    trace effects' ``states`` and ``configuration`` list names; a selected transition
    is ``{"source", "event", "targets", "line", "column"}``; a content owner is
    ``onentry:STATE:N``, ``onexit:STATE:N``, ``history:STATE``, ``finalize:STATE:N``,
    ``transition:LINE:COLUMN`` or ``script``."""
    data = as_json(effect)
    result: dict[str, Any] = {}
    for key, value in data.items():
        if key == "state_index":
            result["state"] = state_name(machine, value)
        elif key in _STATE_LISTS and isinstance(effect, _INDEXED_LISTS):
            result[key] = [state_name(machine, index) for index in value]
        elif key == "transitions" and isinstance(effect, fx.TraceTransitionsSelected):
            result[key] = [_transition_json(machine, index) for index in value]
        elif key == "owner" and isinstance(effect, fx.TraceContentExecuted):
            result[key] = _owner(machine, value)
        else:
            result[key] = value
    return result


_TRANSITION_OWNER: Final = re.compile(r"transition:(\d+)")


def notice_json(machine: Machine, notice: Notice) -> dict[str, Any]:
    """A notice's JSON form: ``{"notice": "error", "event", "data", "sendid",
    "invokeid", "before"}`` (data in the tagged encoding; a transition that raised it
    is named ``transition:LINE:COLUMN``, not by index) or ``{"notice": "no_transition",
    "event", "queue", "before"}``."""
    if isinstance(notice, NoTransition):
        return {
            "notice": "no_transition",
            "event": notice.event,
            "queue": notice.queue,
            "before": notice.before,
        }
    event = notice.event
    data = event.data
    if isinstance(data, dict) and isinstance(data.get("element"), str):
        found = _TRANSITION_OWNER.fullmatch(str(data["element"]))
        if found is not None and int(found.group(1)) < len(machine.transitions):
            data = {**data, "element": _owner(machine, str(data["element"]))}
    return {
        "notice": "error",
        "event": event.name,
        "data": encode(data),
        "sendid": event.sendid,
        "invokeid": event.invokeid,
        "before": notice.before,
    }


async def _advance(system: System, clock: VirtualClock, ms: int, going: Callable[[], bool]) -> None:
    """Fire, in order, every timer due within the next ``ms`` milliseconds (those armed
    meanwhile included), settling after each; the clock ends at the end of the span."""
    until = clock.now_ms() + ms
    # A timer that does nothing, so the clock reaches ``until`` even when nothing else
    # is due; armed after the timers already pending, it fires after those due at
    # ``until`` too, and the loop goes on to any armed meanwhile for that instant.
    marker = clock.call_later(ms, _nothing)
    while going() and clock.advance(until_ms=until):
        await system.drain()
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
