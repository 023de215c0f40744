"""Live sessions: charts running in asyncio, performing what the pure core plans.

A :class:`System` holds sessions that can reach each other and the clock they share.
Each :class:`Session` owns an external queue and runs one macrostep at a time through
:func:`~statifier.core.handle_event`, then performs the step's effects in order:

- a send with no target, or to ``#_scxml_<own id>``, joins its own queue; to
  ``#_scxml_<other id>`` another session's; to ``#_parent`` its parent's; to
  ``#_<invokeid>`` an invoked child's. A target nobody answers to raises
  ``error.communication`` in the sender.
- a delayed send arms a timer on the clock (``#_internal`` ones are delivered to the
  internal queue when they fire); ``<cancel>`` disarms every timer armed under that
  send id.
- ``<invoke type="scxml">`` starts a child session from the inline chart or, through
  the system's loader, from ``src``; its ``#_parent`` sends and its completion
  (``done.invoke.<id>``) come back tagged with the invoke id; leaving the state cancels
  the child, and events still in flight from a cancelled child are dropped.
- other send and invoke types go to the handlers the host registered for the session
  (:mod:`statifier.session.handlers`); the core refuses unregistered ones with
  ``error.execution``. A send is planned inside the step (a refusal raises
  ``error.communication`` at once) and performed in a task (a failure raises
  ``error.communication`` when the transport answers).

How a session ends, and what :meth:`Session.wait` then does:

- its chart finishes (a top-level final state, or a cancel): ``wait()`` returns.
- it fails (:class:`SessionFailed`): a step raised (host code such as an ``on_step``
  observer or a handler's ``location()``, or a defect of the library), or a macrostep
  spent its round budget (an eventless loop). The failure is logged at ERROR on this
  module's logger and reported as ``statifier.session.error`` (``error``
  ``step_raised`` or ``round_budget``); the session's timers, children and services
  are cancelled, an invoking parent gets ``error.communication.invoke.<id>``, and
  ``wait()`` raises :class:`SessionFailed`, whose ``__cause__`` is what the step raised.
  A start that raises (the observer, say) fails its session so too: :meth:`System.start`
  raises what it raised and keeps no such session in ``system.sessions``; an invoked
  child's parent hears of it as of a later failure, and goes on.
- its system is closed first (:meth:`System.close`): ``wait()`` raises
  :class:`SessionClosed`.

Once ended, ``running`` is False and ``send()`` raises :class:`SessionNotRunning`
(:class:`SessionClosed` after a close); nothing more is queued.

An error event of the chart's (``error.execution``, ``error.communication``) that no
transition takes ends nothing: the chart goes on, as SCXML has it. The session logs it
as a warning on this module's logger (the first of a kind at once, the rest as one
count an interval: ``System.untaken``) and reports it as ``statifier.session.error``
(``untaken`` true); one a transition took is the chart's own business and stays silent.

>>> import asyncio
>>> from statifier.chart import compile_chart
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><onentry><send event="tick" delay="1s"/></onentry>'
...     '<transition event="tick" target="b"/></state><final id="b"/></scxml>'
... )
>>> async def main():
...     async with System(VirtualClock()) as system:
...         session = await system.start(chart)
...         await system.run_until_idle()
...         return session.configuration, system.clock.now_ms()
>>> asyncio.run(main())
(('b',), 1000)
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable, Container, Coroutine, Mapping
from contextlib import suppress
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from statifier.chart import Machine
from statifier.core import Event, MachineState, StartOptions, initialize
from statifier.core import effects as fx
from statifier.core.errors import step_error
from statifier.core.events import SCXML_INVOKE_TYPE, SCXML_PROCESSOR, SCXML_SEND_TYPES, engine_event
from statifier.expr import UNDEFINED, Value
from statifier.repeats import IntervalTally
from statifier.session.children import invoked_chart, seeded_datamodel
from statifier.session.clock import Clock, RealClock, TimerHandle, VirtualClock
from statifier.session.handlers import (
    Addressable,
    Delivery,
    InvokePlan,
    InvokeType,
    SendType,
    invocation_done,
    invocation_failed,
)
from statifier.session.recording import Input, Recording, RecordingRoutes, step
from statifier.telemetry import enabled, report

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "Session",
    "SessionClosed",
    "SessionError",
    "SessionFailed",
    "SessionNotRunning",
    "SessionQueueFull",
    "System",
]

_log = logging.getLogger(__name__)

_STEPS_PER_TURN = 16
DEFAULT_MAX_QUEUED = 100_000
"""The most inputs one session's queue holds unless its :class:`System` says otherwise."""
_NO_SEND_TYPES: Mapping[str, SendType] = MappingProxyType({})
_NO_INVOKE_TYPES: Mapping[str, InvokeType] = MappingProxyType({})


class SessionError(Exception):
    """What a live session raises to its host; ``session_id`` names the session (None
    when no session is concerned: a closed system refusing to start one)."""

    def __init__(self, session_id: str | None, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionNotRunning(SessionError):  # noqa: N818 - names the condition
    """The session has ended (finished, failed, or closed with its system): it takes no
    more events."""


class SessionClosed(SessionNotRunning):
    """The system was closed: raised by :meth:`Session.wait` of a session that had not
    ended before, by ``send()`` to any of its sessions, and by :meth:`System.start` and
    :meth:`System.resume`."""


class SessionQueueFull(SessionError):  # noqa: N818 - names the condition
    """The session's queue holds :attr:`System.max_queued` inputs already; the event
    was not queued."""


class SessionFailed(SessionError):  # noqa: N818 - names the condition
    """The session ended without finishing its chart: ``reason`` is ``"step_raised"``
    (a step raised; the exception is this error's ``__cause__``) or ``"round_budget"``
    (a macrostep spent its round budget); ``detail`` says what happened."""

    def __init__(self, session_id: str, reason: str, detail: str) -> None:
        super().__init__(session_id, f"session {session_id} failed ({reason}): {detail}")
        self.reason = reason
        self.detail = detail


class _Ending(NamedTuple):
    """Why a session ended other than by finishing its chart."""

    closed: bool  # the system was closed; else the session failed
    reason: str
    detail: str
    cause: BaseException | None = None

    def error(self, session_id: str) -> SessionError:
        """A fresh error for each raise, so tracebacks do not pile up on one object."""
        if self.closed:
            return SessionClosed(session_id, f"session {session_id}: {self.detail}")
        error = SessionFailed(session_id, self.reason, self.detail)
        error.__cause__ = self.cause
        return error


class _Entry(NamedTuple):  # (a tuple: built once per input, cheaper than a dataclass)
    """A queued input: an external event (``from_invoke`` names the child it came
    from), an event for the internal queue, or a request to cancel."""

    kind: Literal["event", "internal", "cancel"]
    event: Event | None = None
    from_invoke: str | None = None


StepObserver = Callable[["Session", Event | None, list[fx.Effect]], None]
"""Called with a session, the event it just stepped (None for its start) and the
effects of that step."""


class System:
    """Sessions that can address each other, a shared clock, and a loader for
    ``<invoke src>`` (nothing is ever fetched without one).

    ``max_queued`` bounds each session's queue (a chart that sends itself two events
    for each it takes would otherwise grow it until memory runs out). An event that
    would go past it is refused: ``send()`` raises :class:`SessionQueueFull`, an
    invoked service's ``port.send_to_parent`` too, and a chart's send (to itself,
    another session, its parent or a child, or an autoforward) raises
    ``error.communication`` in the sender. The session's own error events, cancels,
    and the ``done.invoke`` and failures of its invocations are always queued.

    ``warn_untaken`` False leaves out the warnings of errors no transition took, for a
    host that shows every step's errors itself (``statifier trace`` prints each);
    ``statifier.session.error`` reports them all the same.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        loader: Callable[[str], str] | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        warn_untaken: bool = True,
    ) -> None:
        given: object = max_queued  # checked at run time: hosts pass settings through
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"max_queued is a positive count, not {max_queued!r}")
        self.clock: Clock = clock if clock is not None else RealClock()
        self.loader = loader
        self.max_queued = max_queued
        # Sessions by id: every top-level session started here, and the invoked
        # children until they end.
        self.sessions: dict[str, Session] = {}
        # Sessions with queued work; a session joins on its first queued input and
        # leaves when its queue runs dry or it finishes.
        self.active: set[Session] = set()
        # Sessions started and not finished, so "has everything finished?" is cheap.
        self.unfinished: set[Session] = set()
        # Handler calls under way: sends whose transport has not answered yet, and
        # service starts, cancels and forwards. The system is not idle while one is.
        self.handler_calls: set[asyncio.Task[None]] = set()
        # Errors no transition took, logged once per kind and interval: a chart that
        # fails on every event must not flood the log.
        self.untaken = IntervalTally()
        self.warn_untaken = warn_untaken
        self._issued = 0
        self.closed = False

    def new_id(self) -> str:
        """A session id unique within this system."""
        self._issued += 1
        return f"session_{self._issued}"

    async def start(
        self,
        machine: Machine,
        *,
        session_id: str | None = None,
        datamodel: Mapping[str, Value] | None = None,
        parent: tuple[Session, str] | None = None,
        record: bool = False,
        send_types: Mapping[str, SendType] = _NO_SEND_TYPES,
        invoke_types: Mapping[str, InvokeType] = _NO_INVOKE_TYPES,
        trace: bool = False,
        on_step: StepObserver | None = None,
        keep_effects: bool = False,
    ) -> Session:
        """Start ``machine`` as a new session and run it to its first stable point.

        ``keep_effects`` (implied by ``record``) keeps every performed effect in
        ``session.performed``, for inspection; it grows with the session's life, so
        long-lived hosts observe through ``on_step`` or telemetry instead.

        ``trace`` asks the core for trace effects; ``on_step(session, event, effects)``
        is called after the start (``event`` None) and after every step the session
        takes, once its effects are performed (``statifier trace`` is built on it).

        With ``record``, the session keeps a :class:`~statifier.session.recording.Recording`
        of its inputs in ``session.recording``. ``send_types`` and ``invoke_types``
        register handlers (:mod:`statifier.session.handlers`) for this session and the
        children it invokes; the SCXML types are always built in, and any other type
        is refused with ``error.execution``.

        Raises:
            SessionClosed: the system has been closed.
            Exception: what the start raised (``on_step``, a send type's
                ``location()``...). The session has then failed, as when a step raises:
                logged at ERROR, reported, its timers, children and services released;
                it is not kept in ``sessions``.
        """
        self._refuse_if_closed()
        session = Session(
            self, machine, session_id or self.new_id(), parent, send_types, invoke_types
        )
        self.sessions[session.id] = session
        session.observer = on_step
        session.keep_effects = keep_effects or record
        session.begin(datamodel or {}, record=record, trace=trace)
        return session

    async def resume(
        self,
        position: MachineState,
        *,
        parent: tuple[Session, str] | None = None,
        send_types: Mapping[str, SendType] = _NO_SEND_TYPES,
        invoke_types: Mapping[str, InvokeType] = _NO_INVOKE_TYPES,
        keep_effects: bool = False,
    ) -> Session:
        """Continue a stored position as a live session under its own session id
        (``keep_effects`` as for :meth:`start`).

        Restores where the chart is, not what was in flight: timers armed before the
        position was stored and invoked children are not re-created (a host re-arms
        timers from its own records of ``SendDelayed`` effects and restarts services
        it still wants). Nothing is re-initialised: no ``<data>``, no global script,
        no onentry runs again.

        Raises:
            ValueError: the position has finished, or has internal events queued
                (store positions between macrosteps), or its session id is in use.
            SessionClosed: the system has been closed.
        """
        self._refuse_if_closed()
        if not position.running:
            raise ValueError("the position has finished")
        if position.internal_queue:
            raise ValueError("the position has internal events queued; store it between steps")
        if position.session_id in self.sessions:
            raise ValueError(f"session id {position.session_id!r} is already running here")
        session = Session(
            self, position.machine, position.session_id, parent, send_types, invoke_types
        )
        self.sessions[session.id] = session
        session.keep_effects = keep_effects
        session.continue_from(position)
        return session

    def idle(self) -> bool:
        """No session has queued work and no handler call is under way (both kept as
        sets, so the check is constant time)."""
        return not self.active and not self.handler_calls

    async def drain(self) -> None:
        """Let every session work through its queue.

        Returns once no session has queued work and no handler call is under way. It
        yields to the event loop only while it must: the turn of a lone session that
        is next in line is taken right here (see :meth:`_turn_on_callers_turn`), so
        ``send()`` then ``drain()`` on an otherwise quiet system need not wake a task.
        """
        # A scheduling barrier: yield until the session tasks have run dry.
        while not self.idle():
            if not self._turn_on_callers_turn():
                await asyncio.sleep(0)

    def _turn_on_callers_turn(self) -> bool:
        """Take the next session turn here, on the caller's turn of the loop, when it is
        certainly the next thing the system would do; False when it is not.

        Why: one event sent and drained costs a core step of a few microseconds, and
        twice that again to wake the session and go round the event loop for it (issue
        16). When exactly one session has work, it was parked (its turn is scheduled
        but has not run) and no handler call is under way, nothing else in the system
        can act before that turn: so taking it now, in the session's own context,
        steps the same inputs in the same order, performs the same effects and leaves
        the rest of the system as the scheduled turn would. Only callbacks of the host
        that were already due (and real-clock timers coming due) run after it instead
        of before, as if they had come a moment later.
        """
        if self.handler_calls or len(self.active) != 1:
            return False
        (session,) = self.active
        return session._take_turn(inline=True)

    def _refuse_if_closed(self) -> None:
        if self.closed:
            raise SessionClosed(None, "the system is closed; it starts no more sessions")

    async def close(self) -> None:
        """Stop every session: each one still running ends (its charts' ``onexit`` does
        not run), its delayed sends are disarmed, the sends still in flight and the
        service starts under way are cancelled, and every live invoked service gets
        ``cancel`` (awaited here; one that raises is logged as a warning). Afterwards
        ``running`` is False for every session, ``wait()`` of a session that had not
        ended raises :class:`SessionClosed`, and ``start``, ``resume`` and ``send`` raise
        :class:`SessionClosed`. Closing again does nothing.
        """
        if self.closed:
            return
        self.closed = True
        ending = _Ending(closed=True, reason="closed", detail="its system was closed")
        everyone = list(self.sessions.values())  # (ended children leave the mapping)
        closing = [s for s in everyone if s.running]
        # Every session is marked before any is released, so nothing released next
        # (a child's cancel, a service's answer) is queued on a session still "running".
        for session in closing:
            session._ending = ending
            session.final_configuration = session.state.leaf_configuration()
        in_flight = list(self.handler_calls)
        for session in closing:
            session._release()  # spawns the services' cancel calls, awaited below
        cancels = [task for task in self.handler_calls if task not in in_flight]
        # (A turn already scheduled for a parked session sees its task cancelled.)
        tasks = [s._task for s in everyone if s._task is not None]
        tasks += in_flight
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *cancels, return_exceptions=True)

    async def __aenter__(self) -> System:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run_until_idle(self, *, max_timers: int = 1_000_000) -> int:
        """With a virtual clock: drain, then fire the next timer, until none remain
        or every session has finished. Returns how many timers fired; stops after
        ``max_timers`` (a chart that re-arms a timer forever would never end)."""
        clock = self.clock
        assert isinstance(clock, VirtualClock), "run_until_idle needs a VirtualClock"
        fired = 0
        while fired < max_timers:
            await self.drain()
            if not self.unfinished or not clock.advance():
                break
            fired += 1
        await self.drain()
        return fired

    def spawn(self, call: Coroutine[Any, Any, None]) -> None:
        """Run a handler call in a task the system keeps (and cancels on close)."""
        task = asyncio.get_running_loop().create_task(call)
        self.handler_calls.add(task)
        task.add_done_callback(self.handler_calls.discard)


class Session:
    """One running chart. Build with :meth:`System.start`."""

    def __init__(
        self,
        system: System,
        machine: Machine,
        session_id: str,
        parent: tuple[Session, str] | None,
        send_types: Mapping[str, SendType] = _NO_SEND_TYPES,
        invoke_types: Mapping[str, InvokeType] = _NO_INVOKE_TYPES,
    ) -> None:
        self.system = system
        self.send_types = send_types
        self.invoke_types = invoke_types
        self.machine = machine
        self.id = session_id
        self.parent = parent
        # Every effect performed, kept only when asked for (it grows with the session).
        self.keep_effects = False
        self.performed: list[fx.Effect] = []
        self.logs: list[tuple[str | None, Value]] = []
        self.final_configuration: tuple[str, ...] = ()
        self.donedata: Value = None
        self._inbox: deque[_Entry] = deque()
        # The task parks on _wake when the queue runs dry. The first input after that
        # schedules the session's next turn as a callback (_turn_call, cancellable,
        # see _take_turn), which sets _wake when it is done.
        self._wake = asyncio.Event()
        self._parked = False
        self._turn_call: asyncio.Handle | None = None
        # The context the session's task runs in; every turn runs in it.
        self._context = contextvars.copy_context()
        # Why the session ended without finishing its chart (failed, or closed).
        self._ending: _Ending | None = None
        self._timers: dict[str, list[TimerHandle]] = {}
        self._children: dict[str, Session] = {}
        # Invocations of registered types that are live: their handler and port.
        self._services: dict[str, tuple[InvokeType, _Port]] = {}
        # Invocations cancelled while their child still ran and had sent something
        # still queued here: that is dropped. (A child that finished first is not in
        # here: its done.invoke was sent before the cancel and is delivered.) An id
        # leaves once nothing of it is queued, so the set stays as small as the queue.
        self._cancelled: set[str] = set()
        self._said_full = False
        # How many queued entries each invocation sent (ids with none are absent).
        self._queued_from: dict[str, int] = {}
        # Started by an invocation: the system forgets it once it has ended.
        self.invoked = parent is not None
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._finished = asyncio.Event()
        self.observer: StepObserver | None = None
        self._stop_reported = False
        self._routes = _Routes(self)
        self.recording: Recording | None = None
        self.state: MachineState

    # -- queries -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Started and not yet ended (finished, failed, or closed with its system)."""
        return self._started and self._ending is None and self.state.running

    def _over(self) -> bool:
        """Ended: failed or closed (a start can fail before its chart runs), or its
        chart finished. An ended session takes nothing more."""
        return self._ending is not None or (self._started and not self.state.running)

    @property
    def configuration(self) -> tuple[str, ...]:
        """The active leaf states (the final ones once the chart has finished)."""
        return self.state.leaf_configuration() if self.running else self.final_configuration

    # -- inputs --------------------------------------------------------------------------

    async def wait(self) -> None:
        """Wait until the session has ended; return when its chart finished.

        Raises:
            SessionFailed: the session failed (a step raised: the exception is the
                error's ``__cause__``; or it spent its round budget).
            SessionClosed: its system was closed before it ended.
        """
        await self._finished.wait()
        if self._ending is not None:
            raise self._ending.error(self.id)

    def send(self, event: Event | str) -> None:
        """Queue an external event.

        Raises:
            SessionNotRunning: the session has ended (finished or failed); nothing is
                queued.
            SessionClosed: its system was closed.
            SessionQueueFull: its queue holds ``system.max_queued`` inputs already.
        """
        if self._over():
            if self._ending is not None and self._ending.closed:
                raise self._ending.error(self.id)
            raise SessionNotRunning(self.id, f"session {self.id} has ended; it takes no events")
        if len(self._inbox) >= self.system.max_queued:
            self._say_full()
            raise SessionQueueFull(self.id, self._full_message())
        self._append(_Entry("event", Event(event) if isinstance(event, str) else event))

    def request_cancel(self) -> None:
        """Stop the chart: it exits its states (running onexit) and finishes. Does
        nothing once the session has ended."""
        self._put(_Entry("cancel"))

    def _offer(self, entry: _Entry) -> bool:
        """Queue an event another party sent, unless the queue is full (False). An
        ended session takes it (and drops it), as :meth:`_put` does."""
        if self._over():
            return True
        if len(self._inbox) >= self.system.max_queued:
            self._say_full()
            return False
        self._append(entry)
        return True

    def _say_full(self) -> None:
        if not self._said_full:  # once per session: a flooding chart would repeat it
            self._said_full = True
            _log.warning("%s; events sent to it are refused", self._full_message())

    def _full_message(self) -> str:
        return f"the queue of session {self.id} is full ({self.system.max_queued} inputs)"

    def _put(self, entry: _Entry, *, first: bool = False) -> None:
        """Queue ``entry`` whatever the bound (the session's own and its invocations'
        events); an ended session drops it: it steps nothing more."""
        if not self._over():
            self._append(entry, first=first)

    def _append(self, entry: _Entry, *, first: bool = False) -> None:
        if first:
            self._inbox.appendleft(entry)
        else:
            self._inbox.append(entry)
        if entry.from_invoke is not None:
            queued = self._queued_from
            queued[entry.from_invoke] = queued.get(entry.from_invoke, 0) + 1
        self.system.active.add(self)
        if self._parked and self._task is not None:
            # Where the task itself would have been woken: its turn, in its context.
            self._parked = False
            loop = self._task.get_loop()
            self._turn_call = loop.call_soon(self._take_turn, context=self._context)

    # -- the loop ------------------------------------------------------------------------

    def routes(self) -> Container[str]:
        """Where an immediate send from this session can go right now: a view answering
        ``target in routes`` in constant time (a step runs without interruption, so
        the view cannot change under it)."""
        return self._routes

    def begin(
        self, datamodel: Mapping[str, Value], *, record: bool = False, trace: bool = False
    ) -> None:
        """Start the chart: initialise it, perform the start's effects, call the
        observer, then run the session in its task.

        Raises:
            Exception: what host code (a send type's ``location()``, the ``on_step``
                observer, an invoked child's start) or a defect raised on the way. The
                session has then failed as a failing step fails one (:meth:`_fail`)
                and left ``system.sessions``: what it started is released and nothing
                is left waiting on it.
        """
        try:
            self._begin(datamodel, record=record, trace=trace)
        except Exception as error:
            self._start_failed(error)
            raise

    def _begin(self, datamodel: Mapping[str, Value], *, record: bool, trace: bool) -> None:
        routes = RecordingRoutes(self.routes()) if record else self.routes()
        locations = self._locations()
        if locations:  # the host's processors join _ioprocessors (the SCXML ones stay)
            datamodel = {**datamodel, "_ioprocessors": locations}
        options = StartOptions(
            session_id=self.id,
            datamodel=datamodel,
            routes=routes,
            send_types=frozenset(self.send_types),
            invoke_types=frozenset(self.invoke_types),
            trace=trace,
        )
        self.state, effects = initialize(self.machine, options)
        if isinstance(routes, RecordingRoutes):
            self.recording = Recording(
                self.id,
                datamodel=dict(datamodel),
                start_routes=routes.answers,
                send_types=options.send_types,
                invoke_types=options.invoke_types,
            )
        self._started = True
        self.system.unfinished.add(self)
        report("statifier.session.start", {}, self._about(resumed=False))
        self._perform(effects)
        self._report_stop()
        if self.observer is not None:
            self.observer(self, None, effects)
        self._task = self._new_task()

    def _start_failed(self, error: Exception) -> None:
        """End a session whose start raised, as a failing step ends one, and take it out
        of ``system.sessions``: its caller got no session back to wait on, send to or
        close, so nothing may find it there (or wait for it, in ``drain()``)."""
        self._fail("step_raised", f"its start raised {error!r}", error)
        self._forget()

    def _locations(self) -> dict[str, Value]:
        """``_ioprocessors`` entries for the registered send types that can receive."""
        locations: dict[str, Value] = {}
        for name, handler in self.send_types.items():
            location = handler.location(self.id) if isinstance(handler, Addressable) else None
            if location is not None:
                locations[name] = {"location": location}
        return locations

    def continue_from(self, position: MachineState) -> None:
        # Unlike begin(), nothing here runs host code or can raise before the task
        # exists (report() contains its handlers' errors), so it needs no failure path.
        # What this host can perform now decides which types the core accepts.
        self.state = position._replace(
            send_types=frozenset(self.send_types), invoke_types=frozenset(self.invoke_types)
        )
        self._started = True
        self.system.unfinished.add(self)
        report("statifier.session.start", {}, self._about(resumed=True))
        self._task = self._new_task()

    def _new_task(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._run(), context=self._context)

    async def _run(self) -> None:
        try:
            while self.running:
                if not self._inbox:
                    self._park()
                    await self._wake.wait()  # set once _take_turn has taken a turn
                    continue
                if not self._turn_or_fail():
                    break
                await asyncio.sleep(0)
        finally:  # finished, cancelled, or failed: it has no more work either way
            self._parked = False
            self._clear_inbox()
            self.system.active.discard(self)

    def _park(self) -> None:
        self.system.active.discard(self)
        self._wake.clear()
        self._parked = True

    def _turn(self) -> None:
        """Step a few queued inputs (a turn of the loop costs more than a simple step),
        then let the other sessions run. A session stays in system.active while it
        steps, so drain() waits."""
        for _ in range(_STEPS_PER_TURN):
            if not self._inbox or not self.running:
                break
            self._step(self._inbox.popleft())

    def _take_turn(self, *, inline: bool = False) -> bool:
        """The first turn after the session was parked: scheduled as a callback by the
        input that found it parked, exactly where waking the task would have put it,
        or, with ``inline``, taken in its stead by :meth:`System.drain` (False: no such
        turn is scheduled). Afterwards the task goes on from the end of the turn, as
        after a turn of its own; an inline turn that leaves the whole system idle
        parks the session again instead, so nothing is left to wake.
        """
        if inline:
            if self._turn_call is None:
                return False
            self._turn_call.cancel()
        self._turn_call = None
        task = self._task
        if task is None or task.done() or task.cancelling():
            return True  # the system is closing: the task ends without another turn
        # A callback runs in the session's context already; drain()'s caller does not.
        if not (self._context.run(self._turn_or_fail) if inline else self._turn_or_fail()):
            return True
        if inline and self._alone_and_done():
            self._park()
            return True
        self._wake.set()
        return True

    def _alone_and_done(self) -> bool:
        """Running with nothing queued, and the system idle but for this session."""
        system = self.system
        return (
            self.running
            and not self._inbox
            and len(system.active) == 1
            and not system.handler_calls
        )

    def _turn_or_fail(self) -> bool:
        """A turn, in the task or outside it; False when a step raised, which fails
        the session (and wakes its task, which then ends)."""
        try:
            self._turn()
        except Exception as error:  # noqa: BLE001 - host code or a defect: fail, loudly
            self._fail("step_raised", f"a step raised {error!r}", error)
            self._wake.set()
            return False
        return True

    def _fail(self, reason: str, detail: str, cause: BaseException | None = None) -> None:
        """End the session as failed: log at ERROR (with ``cause``'s traceback), report
        ``statifier.session.error`` (``error`` is ``reason``), release what it holds,
        tell an invoking parent (``error.communication.invoke.<id>``) and wake
        ``wait()``, which raises :class:`SessionFailed`. A session that had already
        ended (a host callback raising after the step that finished the chart) keeps
        its ending; the failure is logged and reported all the same."""
        _log.error("session %s failed (%s): %s", self.id, reason, detail, exc_info=cause)
        report(
            "statifier.session.error", {}, self._about(error=reason, message=detail, raised=False)
        )
        if self._over():
            return
        self._ending = _Ending(closed=False, reason=reason, detail=detail, cause=cause)
        if self._started:  # (a start can raise before its chart has a configuration)
            self.final_configuration = self.state.leaf_configuration()
        self._clear_inbox()
        self.system.active.discard(self)
        self._release()
        if self.parent is not None:
            parent, invoke_id = self.parent
            failed = invocation_failed(invoke_id, reason, detail=detail)
            parent._put(_Entry("event", failed, from_invoke=invoke_id))

    def _about(self, **more: Any) -> dict[str, Any]:
        return {"session_id": self.id, "chart": self.machine.identity.content_hash, **more}

    def _step(self, entry: _Entry) -> None:
        if not enabled("statifier.session.macrostep"):  # nothing to measure for
            self._step_core(entry)
            self._report_stop()
            return
        started = time.perf_counter()
        self._step_core(entry)
        report(
            "statifier.session.macrostep",
            {"duration": time.perf_counter() - started},
            self._about(
                input=entry.kind,
                event=None if entry.event is None else entry.event.name,
                macrostep=self.state.macrostep,
            ),
        )
        self._report_stop()

    def _report_stop(self) -> None:
        """Report the end once, after the step that reached it has been reported."""
        if not self.state.running and not self._stop_reported:
            self._stop_reported = True
            report(
                "statifier.session.stop", {}, self._about(configuration=self.final_configuration)
            )

    def _clear_inbox(self) -> None:
        self._inbox.clear()
        self._queued_from.clear()
        self._cancelled.clear()

    def _mark_cancelled(self, invoke_id: str) -> None:
        """Drop what ``invoke_id`` sent that is still queued (nothing more can come:
        its child was orphaned, its port closed)."""
        if invoke_id in self._queued_from:
            self._cancelled.add(invoke_id)

    def _taken_from(self, invoke_id: str) -> bool:
        """An entry ``invoke_id`` sent leaves the queue; whether it is to be dropped."""
        dropped = invoke_id in self._cancelled
        left = self._queued_from[invoke_id] - 1
        if left:
            self._queued_from[invoke_id] = left
        else:
            del self._queued_from[invoke_id]
            self._cancelled.discard(invoke_id)
        return dropped

    def _step_core(self, entry: _Entry) -> None:
        recorded: RecordingRoutes | None = None
        if self.recording is not None:
            recorded = RecordingRoutes(self._routes)
            self.state = self.state._replace(routes=recorded)
        elif self.state.routes is not self._routes:  # the core hands the view back
            self.state = self.state._replace(routes=self._routes)
        if entry.from_invoke is not None and self._taken_from(entry.from_invoke):
            return  # sent by a child after its invocation was cancelled
        self.state, effects = step(self.state, entry.kind, entry.event)
        if self.recording is not None and recorded is not None:
            self.recording.inputs.append(Input(entry.kind, entry.event, recorded.answers))
        self._perform(effects)
        if self.observer is not None:
            self.observer(self, entry.event, effects)

    # -- effects -------------------------------------------------------------------------

    def _perform(self, effects: list[fx.Effect]) -> None:
        for effect in effects:
            if self._ending is not None:
                break  # the session failed (or closed) on an earlier effect: no more
            if self.keep_effects:
                self.performed.append(effect)
            if isinstance(effect, fx.Send | fx.SendDelayed):
                if enabled("statifier.session.send"):
                    delay = effect.delay_ms if isinstance(effect, fx.SendDelayed) else 0
                    about = self._about(
                        event=effect.event, target=effect.target, send_id=effect.send_id
                    )
                    report("statifier.session.send", {"delay_ms": delay}, about)
                if isinstance(effect, fx.SendDelayed):
                    self._arm(effect)
                else:
                    self._route(effect.target, self._delivered(effect), effect.type, effect)
            elif isinstance(effect, fx.Cancel):
                for handle in self._timers.pop(effect.send_id, []):
                    handle.cancel()
            elif isinstance(effect, fx.Invoke):
                self._invoke(effect)
            elif isinstance(effect, fx.CancelInvoke):
                self._cancel_service(effect.invoke_id)
                child = self._children.pop(effect.invoke_id, None)
                if child is not None and child.running:
                    self._mark_cancelled(effect.invoke_id)
                    child.parent = None  # its completion no longer concerns us
                    child.request_cancel()
            elif isinstance(effect, fx.Autoforward):
                child = self._children.get(effect.invoke_id)
                if child is not None:  # (dropped if the child has ended)
                    self._deliver_to(child, _Entry("event", effect.event), effect.event)
                else:
                    self._forward(effect.invoke_id, effect.event)
            elif isinstance(effect, fx.Log):
                self.logs.append((effect.label, effect.value))
            elif isinstance(effect, fx.Done):
                self._finish(effect)
            elif isinstance(effect, fx.BudgetExhausted):
                # The core leaves the chart running for the next event; a live session
                # that nothing may ever send to again would sit there silently, so it
                # fails, as a durable execution does (FAILED, "round_budget").
                detail = (
                    f"macrostep {effect.macrostep} spent its round budget of "
                    f"{effect.budget} in {effect.configuration}"
                )
                self._fail("round_budget", detail)
            elif isinstance(effect, fx.ChartError) and not effect.taken:
                self._untaken(effect)

    def _untaken(self, effect: fx.ChartError) -> None:
        """Tell the host of an error event no transition took. The chart skipped the
        rest of the failing block and went on, as SCXML has it, so nothing else would
        show it: ``statifier.session.error`` with ``untaken`` true, and a warning on
        this module's logger, the first of a kind (an element of a chart failing the
        same way) at once and the rest as one count an interval. (One a transition took
        is the chart's to handle: silent.)"""
        error = step_error(effect)
        if enabled("statifier.session.error"):
            where = {"element": error.element, "line": error.line, "column": error.column}
            about = self._about(
                error=error.name, message=error.message, raised=False, untaken=True, **where
            )
            report("statifier.session.error", {}, about)
        if not self.system.warn_untaken:
            return
        said = error.describe()
        kind = (
            self.machine.identity.content_hash,
            error.name,
            error.element,
            error.line,
            error.column,
        )

        def first() -> None:
            _log.warning("session %s: %s", self.id, said)

        def later(count: int) -> None:
            _log.warning("%d more of: %s (the last in session %s)", count, said, self.id)

        self.system.untaken.note(kind, first, later)

    def _delivered(self, effect: fx.Send | fx.SendDelayed) -> Event:
        internal = effect.target in ("#_internal", "_internal")
        return engine_event(  # the chart's name: empty for a send of <content> alone
            effect.event,
            "internal" if internal else "external",
            effect.data,
            sendid=effect.send_id if effect.author_id else None,
            origin=None if internal else f"#_scxml_{self.id}",
            origintype=None if internal else SCXML_PROCESSOR,
        )

    def _route(
        self,
        target: str | None,
        event: Event,
        kind: str | None,
        effect: fx.Send | fx.SendDelayed | None = None,
    ) -> None:
        """Deliver ``event`` to ``target`` now, or raise error.communication here."""
        if kind is not None and kind not in SCXML_SEND_TYPES:
            handler = self.send_types.get(kind)
            if handler is None:
                self._communication_error(f"no I/O processor for send type {kind!r}", event)
            else:
                self._route_through(handler, kind, target, event, effect)
            return
        if target in ("#_internal", "_internal"):
            self._put(_Entry("internal", event), first=True)
            return
        if target is None or target == f"#_scxml_{self.id}":
            self._deliver_to(self, _Entry("event", event), event)
            return
        if target in ("#_parent", "_parent"):
            if self.parent is None:
                self._communication_error("this session has no parent", event)
                return
            parent, invoke_id = self.parent
            tagged = _Entry("event", _with_invokeid(event, invoke_id), from_invoke=invoke_id)
            self._deliver_to(parent, tagged, event)
            return
        if target.startswith("#_scxml_"):
            other = self.system.sessions.get(target.removeprefix("#_scxml_"))
            if other is None or not other.running:
                self._communication_error(f"no session answers to {target}", event)
                return
            self._deliver_to(other, _Entry("event", event), event)
            return
        if target.startswith("#_"):
            child = self._children.get(target[2:])
            if child is not None and child.running:
                self._deliver_to(child, _Entry("event", event), event)
            elif target[2:] in self._services:
                self._forward(target[2:], event)
            else:
                self._communication_error(f"no invoked child answers to {target}", event)
            return
        self._communication_error(f"cannot deliver to {target!r}", event)

    def _deliver_to(self, receiver: Session, entry: _Entry, event: Event) -> None:
        """Queue what this session sent on ``receiver``; a full queue raises
        error.communication here."""
        if not receiver._offer(entry):
            self._communication_error(receiver._full_message(), event)

    def _route_through(
        self,
        handler: SendType,
        kind: str,
        target: str | None,
        event: Event,
        effect: fx.Send | fx.SendDelayed | None,
    ) -> None:
        """A send of a registered type: planned now, performed in a task."""
        if target is None:
            # SCXML: a send with no target goes to the sending session's external
            # queue, whatever its type; no transport is involved.
            location = handler.location(self.id) if isinstance(handler, Addressable) else None
            self._deliver_to(self, _Entry("event", _from(event, location, kind)), event)
            return
        try:
            planned = handler.plan(target, event)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            planned = f"the {kind} handler failed to plan: {error!r}"
        if isinstance(planned, str):
            self._communication_error(planned, event)
            return
        if effect is not None:
            planned = replace(planned, send=effect)
        self.system.spawn(self._deliver(handler, kind, planned))

    async def _deliver(self, handler: SendType, kind: str, delivery: Delivery) -> None:
        try:
            failure = await handler.perform(delivery)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            failure = f"the {kind} handler failed: {error!r}"
        if failure is not None:
            if self.running:
                self._communication_error(failure, delivery.event)
            else:
                message = f"the {kind} send of {delivery.event.name!r} failed: {failure}"
                self._unheard("error.communication", message)

    def _raise_error(self, name: str, message: str, **fields: Any) -> None:
        report("statifier.session.error", {}, self._about(error=name, message=message, raised=True))
        failure = Event(name, type="platform", data={"message": message}, **fields)
        self._put(_Entry("internal", failure), first=True)

    def _unheard(self, name: str, message: str) -> None:
        """A failure no chart is left to hear (the session ended before its handler
        answered, or a state it left): logged as a warning for the host and reported as
        ``statifier.session.error`` with ``raised`` False; no error event is queued."""
        _log.warning("session %s: %s (no chart is left to raise %s)", self.id, message, name)
        report(
            "statifier.session.error", {}, self._about(error=name, message=message, raised=False)
        )

    def _communication_error(self, message: str, event: Event) -> None:
        self._raise_error("error.communication", message, sendid=event.sendid)

    def _arm(self, effect: fx.SendDelayed) -> None:
        event = self._delivered(effect)

        def fire() -> None:
            handles = self._timers.get(effect.send_id, [])
            if handle in handles:
                handles.remove(handle)
            if not self.running:
                return
            try:
                self._route(effect.target, event, effect.type, effect)
            except Exception as error:  # noqa: BLE001 - host code (a handler's location())
                self._fail("step_raised", f"a delayed send raised {error!r}", error)

        handle = self.system.clock.call_later(effect.delay_ms, fire)
        self._timers.setdefault(effect.send_id, []).append(handle)

    def _invoke(self, effect: fx.Invoke) -> None:
        invoke_id = effect.invoke_id
        if effect.type != SCXML_INVOKE_TYPE:
            service = self.invoke_types.get(effect.type)
            if service is None:
                self._invoke_failed(invoke_id, f"no handler for invoke type {effect.type!r}")
            else:
                self._invoke_service(service, effect)
            return
        machine = invoked_chart(effect, self.system.loader, self.machine.functions)
        if isinstance(machine, str):
            self._invoke_failed(invoke_id, machine)
            return
        seeded = seeded_datamodel(machine, effect.data)
        child = Session(
            self.system,
            machine,
            self.system.new_id(),
            (self, invoke_id),
            self.send_types,
            self.invoke_types,
        )
        self.system.sessions[child.id] = child
        self._children[invoke_id] = child
        self._cancelled.discard(invoke_id)
        report("statifier.session.invoke", {}, self._about(invoke_id=invoke_id, child=child.id))
        # A child whose start raises has failed as a failing step fails one: logged,
        # reported, and this session told (error.communication.invoke.<id>). The
        # failure is the child's, as when it fails later on, so this step goes on.
        with suppress(Exception):
            child.begin(seeded)

    def _invoke_failed(self, invoke_id: str, message: str) -> None:
        self._raise_error("error.execution", message, invokeid=invoke_id)

    def _invoke_service(self, service: InvokeType, effect: fx.Invoke) -> None:
        """An invocation of a registered type: planned now, started in a task."""
        invoke_id = effect.invoke_id
        try:
            planned = service.plan(effect)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            planned = f"the {effect.type} handler failed to plan: {error!r}"
        if isinstance(planned, str):
            self._invoke_failed(invoke_id, planned)
            return
        port = _Port(self, invoke_id)
        self._services[invoke_id] = (service, port)
        self._cancelled.discard(invoke_id)
        self.system.spawn(self._start_service(service, planned, port))

    async def _start_service(self, service: InvokeType, plan: InvokePlan, port: _Port) -> None:
        try:
            failure = await service.start(plan, port)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            failure = f"the {plan.type} service failed to start: {error!r}"
        if failure is not None and port.open:
            port.close()
            if self.running:
                self._invoke_failed(plan.invoke_id, failure)
            else:
                self._unheard("error.execution", f"invoke {plan.invoke_id!r}: {failure}")

    def _cancel_service(self, invoke_id: str) -> None:
        entry = self._services.pop(invoke_id, None)
        if entry is None:
            return
        service, port = entry
        port.close()
        self._mark_cancelled(invoke_id)
        self.system.spawn(self._cancel_invoked(service, invoke_id))

    def _forward(self, invoke_id: str, event: Event) -> None:
        entry = self._services.get(invoke_id)
        if entry is not None:
            self.system.spawn(self._forward_to(entry[0], invoke_id, event))

    async def _cancel_invoked(self, service: InvokeType, invoke_id: str) -> None:
        """Cancel an invoked service: the state that invoked it was exited (or the
        session ended), so a failing handler concerns no chart; it is logged and
        reported for the host (:meth:`_unheard`)."""
        try:
            await service.cancel(invoke_id)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            message = f"the invoke handler failed to cancel {invoke_id!r}: {error!r}"
            self._unheard("error.execution", message)

    async def _forward_to(self, service: InvokeType, invoke_id: str, event: Event) -> None:
        """Hand an invoked service an event; a failing handler is an
        ``error.communication`` for the chart, as a failing send is."""
        try:
            await service.forward(invoke_id, event)
        except Exception as error:  # noqa: BLE001 - handlers are host code
            message = f"the invoke handler failed to take the event for {invoke_id!r}: {error!r}"
            if self.running:
                self._communication_error(message, event)
            else:
                self._unheard("error.communication", message)

    def _finish(self, effect: fx.Done) -> None:
        self.final_configuration = effect.configuration
        self.donedata = effect.donedata
        self._release()
        if self.parent is not None:
            parent, invoke_id = self.parent
            done = invocation_done(invoke_id, effect.donedata)
            parent._put(_Entry("event", done, from_invoke=invoke_id))

    def _forget(self) -> None:
        """Leave ``system.sessions``, unless another session took the id since."""
        if self.system.sessions.get(self.id) is self:
            del self.system.sessions[self.id]

    def _release(self) -> None:
        """What an ending session holds goes: its timers are disarmed, its children
        cancelled, its services told to cancel; it leaves the unfinished sessions (and,
        invoked, the system's sessions) and ``wait()`` wakes."""
        self.system.unfinished.discard(self)
        if self.invoked:
            # Nothing can reach an ended child by its id; kept, a parent that invokes
            # again and again would grow the system by one session each time.
            self._forget()
        for handles in self._timers.values():
            for handle in handles:
                handle.cancel()
        self._timers.clear()
        for child in self._children.values():
            child.parent = None
            child.request_cancel()
        self._children.clear()
        for invoke_id in list(self._services):
            self._cancel_service(invoke_id)
        self._finished.set()


class _Routes:
    """``target in routes`` for one session: ``#_scxml_<id>`` of a running session,
    ``#_parent`` when invoked, ``#_<invokeid>`` of a running child."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session

    def __contains__(self, target: object) -> bool:
        session = self.session
        if not isinstance(target, str) or not target.startswith("#_"):
            return False
        if target.startswith("#_scxml_"):
            other = session.system.sessions.get(target.removeprefix("#_scxml_"))
            return other is not None and (other is session or other.running)
        if target == "#_parent":
            return session.parent is not None
        child = session._children.get(target[2:])
        return (child is not None and child.running) or target[2:] in session._services


class _Port:
    """The :class:`~statifier.session.handlers.InvokePort` of one invocation."""

    __slots__ = ("invoke_id", "open", "session")

    def __init__(self, session: Session, invoke_id: str) -> None:
        self.session = session
        self.invoke_id = invoke_id
        self.open = True

    def close(self) -> None:
        self.open = False

    def send_to_parent(self, event: Event | str) -> None:
        if not self.open:
            return
        event = Event(event) if isinstance(event, str) else event
        tagged = _with_invokeid(event, self.invoke_id)
        if not self.session._offer(_Entry("event", tagged, from_invoke=self.invoke_id)):
            raise SessionQueueFull(self.session.id, self.session._full_message())

    def done(self, donedata: Value = UNDEFINED) -> None:
        self._finish(invocation_done(self.invoke_id, donedata))

    def fail(self, reason: str, *, attempts: int = 1, detail: Value = UNDEFINED) -> None:
        self._finish(invocation_failed(self.invoke_id, reason, attempts=attempts, detail=detail))

    def _finish(self, answer: Event) -> None:
        if not self.open:
            return
        self.close()
        invoke_id = self.invoke_id
        session = self.session
        if session._services.get(invoke_id, (None, None))[1] is self:
            del session._services[invoke_id]
        session._put(_Entry("event", answer, from_invoke=invoke_id))


def _from(event: Event, origin: str | None, origintype: str) -> Event:
    return engine_event(
        event.name, event.type, event.data, event.sendid, origin, origintype, event.invokeid
    )


def _with_invokeid(event: Event, invoke_id: str) -> Event:
    return engine_event(
        event.name, event.type, event.data, event.sendid, event.origin, event.origintype, invoke_id
    )
