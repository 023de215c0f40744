"""``System.drain()`` taking a lone session's turn on the caller's turn of the loop.

The turn a parked session was given when an input reached it is taken by ``drain()``
itself when nothing else in the system could act first (see
``System._turn_on_callers_turn``). These tests check that it changes nothing a chart,
a host or a recording can see: the same steps in the same order across sessions and
their children, the same effects, logs, recordings and configurations, as with every
turn left to the event loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.core.effects import as_json
from statifier.session import trace
from statifier.session.clock import VirtualClock
from statifier.session.live import Session, SessionFailed, System
from statifier.session.recording import replay
from statifier.telemetry import attach, detach

NS = "http://www.w3.org/2005/07/scxml"

# Three of these run side by side as "p", "q" and "r", each knowing the next (p, q, r,
# p) as ``peer``: self-sends, <raise>, delayed sends (external and #_internal),
# <cancel>, an invoked child that talks to its parent on a timer of its own, a poke of
# the peer that it answers after nudging its own peer (a third session), an
# unreachable target (error.communication), and finishing.
HUB = f"""\
<scxml xmlns="{NS}" initial="top">
  <datamodel><data id="peer"/><data id="n" expr="0"/></datamodel>
  <state id="top" initial="idle">
    <state id="idle">
      <transition event="go" target="busy">
        <raise event="inner"/>
        <send event="tick"/>
        <send id="late" event="late" delay="1s"/>
      </transition>
      <transition event="spawn" target="calling"/>
    </state>
    <state id="busy">
      <transition event="go" target="idle">
        <send target="#_internal" event="soon" delay="200ms"/>
      </transition>
      <transition event="spawn" target="calling"/>
    </state>
    <state id="calling">
      <invoke id="kid" type="scxml"><content>
        <scxml initial="k1">
          <state id="k1">
            <onentry>
              <send target="#_parent" event="hello"/>
              <send event="bye" delay="500ms"/>
            </onentry>
            <transition event="reply"><send target="#_parent" event="thanks"/></transition>
            <transition event="bye" target="k2"/>
          </state>
          <final id="k2"/>
        </scxml>
      </content></invoke>
      <transition event="hello"><send target="#_kid" event="reply"/></transition>
      <transition event="go" target="busy"/>
      <transition event="done.invoke.kid" target="idle"/>
    </state>
    <transition event="tick" cond="n &lt; 3">
      <assign location="n" expr="n + 1"/><send event="tick"/>
    </transition>
    <transition event="stop"><cancel sendid="late"/></transition>
    <transition event="poke"><send targetexpr="peer" event="poked"/></transition>
    <transition event="poked">
      <send targetexpr="peer" event="nudge"/><send targetexpr="_event.origin" event="ack"/>
    </transition>
    <transition event="bad"><send target="#_scxml_nobody" event="lost"/></transition>
    <transition event="fin" target="end"/>
    <transition event="*"><log label="heard" expr="_event.name"/></transition>
  </state>
  <final id="end"/>
</scxml>
"""

EVENTS = ("go", "spawn", "tick", "stop", "poke", "bad", "fin", "noise")

Op = tuple[str, ...]
ops = st.one_of(
    st.tuples(st.sampled_from(("p", "q", "r")), st.sampled_from(EVENTS)),
    st.just(("drain",)),
    st.just(("advance",)),
)


@contextmanager
def drain_through_the_loop() -> Iterator[None]:
    """Every turn taken by a callback or a task, none by drain() itself."""
    with mock.patch.object(System, "_turn_on_callers_turn", return_value=False):
        yield


_handler_ids = itertools.count()


@contextmanager
def macrosteps() -> Iterator[list[tuple[Any, ...]]]:
    """Every step of every session, children included, in the order they were taken."""
    seen: list[tuple[Any, ...]] = []
    handler_id = f"test_live_inline_{next(_handler_ids)}"

    def note(_name: str, _measures: Mapping[str, float], about: Mapping[str, Any]) -> None:
        seen.append((about["session_id"], about["input"], about["event"], about["macrostep"]))

    attach(handler_id, "statifier.session.macrostep", note)
    try:
        yield seen
    finally:
        detach(handler_id)


def snapshot(system: System) -> list[tuple[Any, ...]]:
    clock = system.clock
    assert isinstance(clock, VirtualClock)
    return [
        (clock.now_ms(), clock.pending(), system.idle()),
        *((s.id, s.running, s.configuration) for s in system.sessions.values()),
    ]


def outcome(session: Session) -> dict[str, Any]:
    assert session.recording is not None
    return {
        "configuration": session.configuration,
        "donedata": session.donedata,
        "logs": session.logs,
        "performed": [as_json(effect) for effect in session.performed],
        "recording": [
            (item.kind, repr(item.event), sorted(item.routes.items()))
            for item in session.recording.inputs
        ],
    }


async def play(machine: Machine, script: list[Op]) -> dict[str, Any]:
    with macrosteps() as steps:
        clock = VirtualClock()
        async with System(clock) as system:
            peers = {"p": "#_scxml_q", "q": "#_scxml_r", "r": "#_scxml_p"}
            sessions = {
                name: await system.start(
                    machine, session_id=name, datamodel={"peer": peer}, record=True
                )
                for name, peer in peers.items()
            }
            seen = [snapshot(system)]
            for op in script:
                if op == ("drain",):
                    await system.drain()
                    seen.append(snapshot(system))
                elif op == ("advance",):
                    await system.drain()
                    clock.advance()  # fires one timer; the next drain steps it
                elif sessions[op[0]].running:  # an ended session refuses events
                    sessions[op[0]].send(Event(op[1]))
            await system.run_until_idle(max_timers=100)
            seen.append(snapshot(system))
            for session in sessions.values():  # recording and replay still agree
                assert session.recording is not None
                assert replay(machine, session.recording) == session.performed
            return {
                "steps": list(steps),
                "snapshots": seen,
                "sessions": {name: outcome(s) for name, s in sessions.items()},
            }


@pytest.fixture(scope="module")
def hub() -> Machine:
    return compile_chart(HUB)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(ops, max_size=30))
def test_settling_on_the_callers_turn_changes_nothing(hub: Machine, script: list[Op]) -> None:
    inline = asyncio.run(play(hub, script))
    with drain_through_the_loop():
        looped = asyncio.run(play(hub, script))
    assert inline == looped


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(st.sampled_from(EVENTS), max_size=20))
def test_one_event_at_a_time_matches_the_loop(hub: Machine, events: list[str]) -> None:
    """The benchmark's pattern: send one event, drain, again; and fire timers."""
    script: list[Op] = []
    for event in events:
        script += [("p", event), ("drain",)]
    script.append(("advance",))
    inline = asyncio.run(play(hub, script))
    with drain_through_the_loop():
        looped = asyncio.run(play(hub, script))
    assert inline == looped


def test_a_lone_session_steps_on_the_callers_turn(hub: Machine) -> None:
    """send() then drain() on a quiet system: the turn is taken inline, and nothing is
    left scheduled for the session."""
    taken: list[bool] = []
    original = Session._take_turn

    def spy(self: Session, *, inline: bool = False) -> bool:
        result = original(self, inline=inline)
        if inline:
            taken.append(result)
        return result

    async def main() -> None:
        async with System(VirtualClock()) as system:
            session = await system.start(hub, session_id="p", datamodel={"peer": "#_scxml_q"})
            await asyncio.sleep(0)  # its task runs to its first wait
            for event in ("noise", "stop", "noise"):
                session.send(Event(event))
                await system.drain()
                assert system.idle()
                assert session._turn_call is None
            assert session.logs == [("heard", "noise"), ("heard", "noise")]  # stop: cancel

    with mock.patch.object(Session, "_take_turn", spy):
        asyncio.run(main())
    assert taken == [True, True, True]


def test_inline_turns_run_in_the_sessions_context() -> None:
    """Steps see the context the session was started in, not drain()'s caller's."""
    who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><state id="a"><transition event="e"/></state></scxml>'
    )
    seen: list[str] = []

    def observe(_session: Session, event: Event | None, _effects: list[fx.Effect]) -> None:
        if event is not None:
            seen.append(who.get())

    async def main() -> None:
        async with System(VirtualClock()) as system:
            who.set("starter")
            session = await system.start(machine, on_step=observe)
            await asyncio.sleep(0)
            who.set("drainer")
            for _ in range(3):
                session.send("e")
                await system.drain()

    asyncio.run(main())
    assert seen == ["starter"] * 3


@pytest.mark.parametrize("inline", [True, False])
def test_a_failing_step_ends_the_sessions_task_not_drain(inline: bool) -> None:
    """An observer that raises ends the session's task, whoever took the turn; drain()
    returns, and the error comes out of wait() as the cause of SessionFailed."""
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><state id="a"><transition event="e"/></state></scxml>'
    )

    def observe(_session: Session, event: Event | None, _effects: list[fx.Effect]) -> None:
        if event is not None and event.name == "e":
            raise RuntimeError("observer broke")

    async def main() -> BaseException | None:
        system = System(VirtualClock())
        session = await system.start(machine, on_step=observe)
        await asyncio.sleep(0)
        session.send("e")
        session.send("e")
        await system.drain()
        assert system.idle()
        task = session._task
        assert task is not None
        await asyncio.wait([task], timeout=1)
        assert task.done()
        with pytest.raises(SessionFailed) as failed:
            await asyncio.wait_for(session.wait(), 5)
        await system.close()
        return failed.value.__cause__

    if inline:
        error = asyncio.run(main())
    else:
        with drain_through_the_loop():
            error = asyncio.run(main())
    assert isinstance(error, RuntimeError)
    assert str(error) == "observer broke"


@pytest.mark.parametrize("inline", [True, False])
def test_a_chart_that_never_drains_still_lets_the_loop_turn(inline: bool) -> None:
    """A chart sending itself events forever: drain() never returns, but it keeps
    yielding, so a timeout around it fires."""
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><state id="a"><transition event="e"><send event="e"/>'
        "</transition></state></scxml>"
    )

    async def main() -> int:
        async with System(VirtualClock()) as system:
            session = await system.start(machine)
            await asyncio.sleep(0)
            session.send("e")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(system.drain(), 0.05)
            return session.state.macrostep

    if inline:
        steps = asyncio.run(main())
    else:
        with drain_through_the_loop():
            steps = asyncio.run(main())
    assert steps > 16


def test_closing_drops_a_turn_already_scheduled() -> None:
    """An input reached a parked session, then the system closed: the turn that was
    scheduled for it is not taken (as a cancelled task takes no turn)."""
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><state id="a"><transition event="e" target="b"/></state>'
        '<state id="b"/></scxml>'
    )

    async def main() -> tuple[str, ...]:
        system = System(VirtualClock())
        session = await system.start(machine)
        await asyncio.sleep(0)
        session.send("e")
        await system.close()
        await asyncio.sleep(0)
        return session.configuration

    assert asyncio.run(main()) == ("a",)


TRACED = f"""\
<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <onentry><send event="t" delay="1s"/></onentry>
    <invoke id="kid" type="scxml"><content>
      <scxml initial="k"><state id="k">
        <onentry><send target="#_parent" event="hi"/></onentry>
        <transition event="ping"><send target="#_parent" event="pong"/></transition>
      </state></scxml>
    </content></invoke>
    <transition event="go"><raise event="r"/><send event="self"/>
      <send target="#_kid" event="ping"/></transition>
    <transition event="t" target="b"/>
    <transition event="*"><log expr="_event.name"/></transition>
  </state>
  <state id="b"><transition event="go" target="a"/></state>
</scxml>
"""


def test_the_trace_driver_keeps_its_delivery_order() -> None:
    """``statifier trace`` (decisions 0020, 0023): the same steps either way."""
    machine = compile_chart(TRACED)
    script: list[Event | trace.Advance] = [
        Event("go"),
        Event("x"),
        trace.Advance(500),
        Event("go"),
        Event("go"),
        trace.Advance(600),
        Event("go"),
    ]
    inline = trace.run(machine, script, trace=True)
    with drain_through_the_loop():
        looped = trace.run(machine, script, trace=True)
    assert inline == looped
    names = [step.event for step in inline]
    assert names[:6] == [None, "hi", "go", "self", "pong", "x"]  # 0020: own sends first
