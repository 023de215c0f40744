"""Live sessions on a virtual clock (and one on the real clock)."""

from __future__ import annotations

import asyncio
import json

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.core.effects import as_json
from statifier.core.positions import dump, load
from statifier.session.children import invoked_chart
from statifier.session.clock import RealClock, VirtualClock
from statifier.session.live import Session, System
from statifier.session.recording import replay

NS = "http://www.w3.org/2005/07/scxml"


def chart(body: str, attrs: str = "") -> str:
    return f'<scxml xmlns="{NS}" {attrs}>{body}</scxml>'


async def run_virtual(source: str, *events: str) -> tuple[System, Session]:
    async with System(VirtualClock()) as system:
        session = await system.start(compile_chart(source))
        for event in events:
            await system.drain()
            session.send(Event(event))
        await system.run_until_idle()
    return system, session


def test_delayed_sends_fire_in_due_order_on_the_virtual_clock() -> None:
    source = chart(
        '<datamodel><data id="seen" expr="[]"/></datamodel>'
        '<state id="a"><onentry><send event="late" delay="2s"/><send event="early" delay="1s"/>'
        "</onentry>"
        '<transition event="early"><assign location="seen" expr="seen + [\'early\']"/>'
        "</transition>"
        '<transition event="late" target="done"><assign location="seen" '
        "expr=\"seen + ['late']\"/></transition></state>"
        '<final id="done"/>'
    )
    system, session = asyncio.run(run_virtual(source))
    assert session.configuration == ("done",)
    assert system.clock.now_ms() == 2000
    assert session.state.datamodel["seen"] == ["early", "late"]


def test_cancel_disarms_every_timer_under_the_send_id() -> None:
    source = chart(
        '<state id="a"><onentry><send id="t" event="timeout" delay="5s"/>'
        '<send id="t" event="timeout" delay="6s"/><cancel sendid="t"/>'
        '<send event="go" delay="1s"/></onentry>'
        '<transition event="go" target="ok"/><transition event="timeout" target="bad"/></state>'
        '<final id="ok"/><final id="bad"/>'
    )
    _, session = asyncio.run(run_virtual(source))
    assert session.configuration == ("ok",)


def test_external_events_and_self_sends_share_the_queue() -> None:
    source = chart(
        '<state id="a"><transition event="ping" target="b"><send event="pong"/></transition>'
        "</state>"
        '<state id="b"><transition event="pong" target="c"/></state><final id="c"/>'
    )
    _, session = asyncio.run(run_virtual(source, "ping"))
    assert session.configuration == ("c",)


def test_invoked_child_talks_to_its_parent_and_reports_done() -> None:
    source = chart(
        '<state id="a"><invoke id="kid" type="scxml"><content>'
        '<scxml initial="k1"><state id="k1"><onentry>'
        '<send target="#_parent" event="hello"/></onentry>'
        '<transition event="reply" target="k2"/></state>'
        '<final id="k2"><donedata><param name="v" expr="42"/></donedata></final></scxml>'
        "</content></invoke>"
        '<transition event="hello"><send target="#_kid" event="reply"/></transition>'
        '<transition event="done.invoke.kid" cond="_event.data.v == 42" target="ok"/></state>'
        '<final id="ok"/>'
    )
    _, session = asyncio.run(run_virtual(source))
    assert session.configuration == ("ok",)


def test_leaving_the_invoking_state_cancels_the_child() -> None:
    source = chart(
        '<state id="a"><invoke id="kid" type="scxml"><content>'
        '<scxml><state id="k"><onexit><send target="#_parent" event="late"/></onexit>'
        "</state></scxml></content></invoke>"
        '<transition event="leave" target="b"/></state>'
        '<state id="b"><onentry><send event="check" delay="1s"/></onentry>'
        '<transition event="late" target="bad"/><transition event="check" target="ok"/></state>'
        '<final id="ok"/><final id="bad"/>'
    )
    system, session = asyncio.run(run_virtual(source, "leave"))
    assert session.configuration == ("ok",)
    # The child ended; an ended child leaves the system's sessions.
    assert list(system.sessions.values()) == [session]


def test_unreachable_targets_raise_error_communication() -> None:
    source = chart(
        '<state id="a"><onentry><send event="x" target="#_scxml_nobody"/></onentry>'
        '<transition event="error.communication" target="ok"/></state><final id="ok"/>'
    )
    _, session = asyncio.run(run_virtual(source))
    assert session.configuration == ("ok",)


def test_sessions_reach_each_other_by_id() -> None:
    async def scenario() -> tuple[Session, Session]:
        system = System(VirtualClock())
        receiver = await system.start(
            compile_chart(
                chart(
                    '<state id="r"><transition event="note" target="got"/></state><final id="got"/>'
                )
            ),
            session_id="receiver",
        )
        sender = await system.start(
            compile_chart(
                chart(
                    '<state id="s"><onentry>'
                    '<send event="note" target="#_scxml_receiver"/></onentry>'
                    "</state>"
                )
            )
        )
        await system.run_until_idle()
        await system.close()
        return receiver, sender

    receiver, _ = asyncio.run(scenario())
    assert receiver.configuration == ("got",)


def test_autoforward_copies_external_events_to_the_child() -> None:
    source = chart(
        '<state id="a"><invoke id="kid" type="scxml" autoforward="true"><content>'
        '<scxml><state id="k"><transition event="poke" target="kdone"/></state>'
        '<final id="kdone"/></scxml></content></invoke>'
        '<transition event="done.invoke.kid" target="ok"/></state><final id="ok"/>'
    )
    _, session = asyncio.run(run_virtual(source, "poke"))
    assert session.configuration == ("ok",)


def test_real_clock_fires_short_delays() -> None:
    source = chart(
        '<state id="a"><onentry><send event="tick" delay="20ms"/></onentry>'
        '<transition event="tick" target="b"/></state><final id="b"/>'
    )

    async def scenario() -> tuple[str, ...]:
        system = System(RealClock())
        session = await system.start(compile_chart(source))
        await asyncio.wait_for(session.wait(), timeout=5)
        await system.close()
        return session.configuration

    assert asyncio.run(scenario()) == ("b",)


def _effect_bytes(effects: list[fx.Effect]) -> bytes:
    return json.dumps([as_json(effect) for effect in effects], sort_keys=True).encode()


def test_replay_reproduces_the_effect_stream_byte_for_byte() -> None:
    source = chart(
        '<datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><onentry><send event="tick" delay="1s"/><send id="g" event="guard" '
        'delay="5s"/><send event="x" target="#_scxml_nobody"/></onentry>'
        '<invoke id="kid" type="scxml"><content><scxml><state id="k"><onentry>'
        '<send target="#_parent" event="hello"/></onentry></state></scxml></content></invoke>'
        '<transition event="hello"><assign location="n" expr="n + 1"/></transition>'
        '<transition event="error.communication"><assign location="n" expr="n + 10"/>'
        "</transition>"
        '<transition event="tick" target="b"><cancel sendid="g"/></transition></state>'
        '<state id="b"><onentry><send event="in" target="#_internal" delay="1s"/></onentry>'
        '<transition event="in" target="done"/><transition event="go" target="done"/></state>'
        '<final id="done"/>'
    )
    machine = compile_chart(source)

    async def scenario() -> Session:
        async with System(VirtualClock()) as system:
            session = await system.start(machine, record=True)
            await system.run_until_idle()
            return session

    session = asyncio.run(scenario())
    assert session.configuration == ("done",)
    assert session.state.datamodel["n"] == 11
    assert session.recording is not None
    kinds = [item.kind for item in session.recording.inputs]
    assert {"internal", "event"} <= set(kinds)
    replayed = replay(machine, session.recording)
    assert _effect_bytes(replayed) == _effect_bytes(session.performed)


def test_a_stored_position_resumes_as_a_live_session() -> None:
    source = chart(
        '<datamodel><data id="n" expr="0"/></datamodel>'
        '<state id="a"><transition event="inc"><assign location="n" expr="n + 1"/>'
        '</transition><transition event="stop" target="b"/></state><final id="b"/>'
    )
    machine = compile_chart(source)

    async def first_life() -> bytes:
        async with System(VirtualClock()) as system:
            session = await system.start(machine, session_id="order-7")
            session.send("inc")
            session.send("inc")
            await system.drain()
            return dump(session.state)

    async def second_life(blob: bytes) -> Session:
        async with System(VirtualClock()) as system:
            session = await system.resume(load(compile_chart(source), blob), keep_effects=True)
            session.send("inc")
            session.send("stop")
            await system.drain()
            return session

    resumed = asyncio.run(second_life(asyncio.run(first_life())))
    assert resumed.id == "order-7"
    assert resumed.configuration == ("b",)
    assert resumed.state.datamodel["n"] == 3
    # Nothing ran again on resumption: no DatamodelInit, only the two steps' effects.
    assert not any(isinstance(effect, fx.DatamodelInit) for effect in resumed.performed)


def test_resume_refuses_a_finished_position() -> None:
    source = chart('<final id="done"/>')

    async def scenario() -> str:
        async with System(VirtualClock()) as system:
            session = await system.start(compile_chart(source))
            try:
                await system.resume(session.state._replace(session_id="other"))
            except ValueError as refusal:
                return str(refusal)
            return "resumed"

    assert asyncio.run(scenario()) == "the position has finished"


def test_an_invoked_chart_with_a_lone_surrogate_fails_the_invoke_not_the_system() -> None:
    # The child's text, made by an expression, holds a lone surrogate: no chart, so the
    # invoke fails with error.execution, and the System and its other sessions go on.
    child = (
        f"'&lt;scxml xmlns=&quot;{NS}&quot;&gt;&lt;state id=&quot;\\ud800&quot;/&gt;&lt;/scxml&gt;'"
    )
    source = chart(
        '<datamodel><data id="why"/></datamodel>'
        f'<state id="a"><invoke type="scxml"><content expr="{child}"/></invoke>'
        '<transition event="error.execution" target="failed">'
        '<assign location="why" expr="_event.data.message"/></transition></state>'
        '<final id="failed"/>'
    )
    other = chart('<state id="a"><transition event="go" target="b"/></state><final id="b"/>')

    async def scenario() -> tuple[Session, Session]:
        async with System(VirtualClock()) as system:
            bystander = await system.start(compile_chart(other))
            invoking = await system.start(compile_chart(source))
            await system.run_until_idle()
            bystander.send(Event("go"))
            await system.run_until_idle()
        return invoking, bystander

    invoking, bystander = asyncio.run(scenario())
    assert invoking.configuration == ("failed",)
    why = invoking.state.datamodel["why"]
    assert isinstance(why, str)
    assert why.startswith("the invoked chart is invalid: 1:")
    assert why.endswith("the document is not UTF-8: a lone surrogate U+D800")
    assert bystander.configuration == ("b",)


def test_an_invoke_src_whose_loader_gives_a_lone_surrogate_is_a_reason_not_an_error() -> None:
    at = {"macrostep": 1, "microstep": 1, "round": 1, "state_index": 1, "invoke_index": 0}
    invoke = fx.Invoke(
        invoke_id="i", type="scxml", src="child.scxml", content=None, data=None,
        autoforward=False, **at,
    )  # fmt: skip
    reason = invoked_chart(invoke, loader=lambda _src: chart('<state id="\udc80"/>'))
    assert isinstance(reason, str)
    assert reason.endswith("the document is not UTF-8: a lone surrogate U+DC80")
