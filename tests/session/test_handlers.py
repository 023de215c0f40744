"""Send and invoke types registered per session (statifier.session.handlers)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.expr import UNDEFINED, Value
from statifier.session.clock import Clock, VirtualClock
from statifier.session.handlers import Delivery, InvokePlan, InvokePort, InvokeType, SendType
from statifier.session.live import Session, System
from statifier.session.recording import replay

NS = "http://www.w3.org/2005/07/scxml"


def chart(body: str) -> str:
    return f'<scxml xmlns="{NS}" initial="a">{body}</scxml>'


class Pigeon:
    """Delivers to ``loft:<name>``; ``loft:closed`` never answers."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.planned: list[tuple[str | None, str]] = []
        self.delivered: list[tuple[str, str, Value, int | None]] = []

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        self.planned.append((target, event.name))
        if target is None or not target.startswith("loft:"):
            return f"a pigeon cannot fly to {target!r}"
        return Delivery(target, event)

    async def perform(self, delivery: Delivery) -> str | None:
        await asyncio.sleep(0)
        if delivery.target == "loft:closed":
            return "the loft is closed"
        now = None if self.clock is None else self.clock.now_ms()
        self.delivered.append((delivery.target, delivery.event.name, delivery.event.data, now))
        return None


OUTCOMES = (
    '<transition event="error.communication" target="undelivered">'
    '<assign location="why" expr="_event.data.message"/>'
    '<assign location="which" expr="_event.sendid"/></transition>'
    '<transition event="error.execution" target="refused"/>'
    '<transition event="done" target="delivered"/></state>'
    '<final id="undelivered"/><final id="refused"/><final id="delivered"/>'
)
DATA = '<datamodel><data id="why"/><data id="which"/></datamodel>'


def send_chart(send: str) -> str:
    return chart(
        f'{DATA}<state id="a"><onentry>{send}<send event="done" delay="5s"/></onentry>{OUTCOMES}'
    )


async def run(
    source: str,
    send_types: dict[str, SendType] | None = None,
    invoke_types: dict[str, InvokeType] | None = None,
    clock: VirtualClock | None = None,
) -> Session:
    async with System(clock or VirtualClock()) as system:
        session = await system.start(
            compile_chart(source),
            send_types=send_types or {},
            invoke_types=invoke_types or {},
            keep_effects=True,
        )
        await asyncio.wait_for(system.run_until_idle(), timeout=5)
    return session


def test_a_registered_send_type_plans_and_performs() -> None:
    clock = VirtualClock()
    pigeon = Pigeon(clock)
    source = send_chart(
        '<send type="x-pigeon" target="loft:home" event="note"><param name="n" expr="1"/></send>'
        '<send type="x-pigeon" target="loft:late" event="later" delay="1s"/>'
    )
    session = asyncio.run(run(source, {"x-pigeon": pigeon}, clock=clock))
    assert session.configuration == ("delivered",)
    assert pigeon.delivered == [
        ("loft:home", "note", {"n": 1}, 0),
        ("loft:late", "later", UNDEFINED, 1000),  # planned and performed when the timer fired
    ]
    sends = [effect for effect in session.performed if isinstance(effect, fx.Send)]
    assert sends[0].type == "x-pigeon"


def test_a_target_the_plan_refuses_raises_error_communication() -> None:
    pigeon = Pigeon()
    source = send_chart('<send id="s" type="x-pigeon" target="sky:north" event="note"/>')
    session = asyncio.run(run(source, {"x-pigeon": pigeon}))
    assert session.configuration == ("undelivered",)
    assert session.state.datamodel["why"] == "a pigeon cannot fly to 'sky:north'"
    assert session.state.datamodel["which"] == "s"
    assert pigeon.delivered == []


def test_a_failing_perform_raises_error_communication_in_the_sender() -> None:
    source = send_chart('<send id="s" type="x-pigeon" target="loft:closed" event="note"/>')
    session = asyncio.run(run(source, {"x-pigeon": Pigeon()}))
    assert session.configuration == ("undelivered",)
    assert session.state.datamodel["why"] == "the loft is closed"


def test_a_raising_handler_raises_error_communication() -> None:
    class Broken(Pigeon):
        async def perform(self, delivery: Delivery) -> str | None:
            raise RuntimeError("feathers everywhere")

    source = send_chart('<send type="x-pigeon" target="loft:a" event="note"/>')
    session = asyncio.run(run(source, {"x-pigeon": Broken()}))
    assert session.configuration == ("undelivered",)
    assert "feathers everywhere" in str(session.state.datamodel["why"])


def test_an_unregistered_send_type_raises_error_execution() -> None:
    pigeon = Pigeon()
    source = send_chart('<send type="x-carrier" target="loft:a" event="note"/>')
    session = asyncio.run(run(source, {"x-pigeon": pigeon}))
    assert session.configuration == ("refused",)
    assert pigeon.planned == []


def test_a_send_with_no_target_joins_the_own_queue_without_the_transport() -> None:
    pigeon = Pigeon()
    source = chart(
        '<state id="a"><onentry><send type="x-pigeon" event="first"/><send event="second"/>'
        '</onentry><transition event="first" target="b"/><transition event="*" target="bad"/>'
        '</state><state id="b"><transition event="second" target="ok"/></state>'
        '<final id="ok"/><final id="bad"/>'
    )
    session = asyncio.run(run(source, {"x-pigeon": pigeon}))
    assert session.configuration == ("ok",)
    assert pigeon.planned == []


def test_invoked_children_inherit_the_registries() -> None:
    pigeon = Pigeon()
    source = chart(
        '<state id="a"><invoke type="scxml"><content><scxml initial="k">'
        '<final id="k"><onentry><send type="x-pigeon" target="loft:kid" event="hi"/>'
        "</onentry></final></scxml></content></invoke>"
        '<transition event="done.invoke" target="ok"/></state><final id="ok"/>'
    )
    session = asyncio.run(run(source, {"x-pigeon": pigeon}))
    assert session.configuration == ("ok",)
    assert [(target, name) for target, name, _, _ in pigeon.delivered] == [("loft:kid", "hi")]


class Worker:
    """An invoke type whose services the test drives through their ports."""

    def __init__(self) -> None:
        self.ports: dict[str, InvokePort] = {}
        self.started: list[InvokePlan] = []
        self.cancelled: list[str] = []
        self.forwarded: list[tuple[str, str]] = []
        self.ready = asyncio.Event()

    def plan(self, effect: fx.Invoke) -> InvokePlan | str:
        if effect.src is None:
            return "a worker needs a src"
        return InvokePlan.of(effect)

    async def start(self, plan: InvokePlan, port: InvokePort) -> str | None:
        if plan.src == "broken":
            return "the worker would not start"
        self.started.append(plan)
        self.ports[plan.invoke_id] = port
        port.send_to_parent(Event("ready", data={"src": plan.src}))
        self.ready.set()
        return None

    async def cancel(self, invoke_id: str) -> None:
        self.cancelled.append(invoke_id)

    async def forward(self, invoke_id: str, event: Event) -> None:
        self.forwarded.append((invoke_id, event.name))


WORKER_CHART = chart(
    '<datamodel><data id="result"/><data id="readyfrom"/></datamodel>'
    '<state id="a" initial="waiting"><invoke id="w" type="x-worker" src="job" autoforward="true">'
    '<param name="size" expr="3"/></invoke>'
    '<transition event="stop" target="stopped"/>'
    '<transition event="done.invoke.w" target="finished">'
    '<assign location="result" expr="_event.data.result"/></transition>'
    '<state id="waiting"><transition event="ready" target="working">'
    '<assign location="readyfrom" expr="_event.invokeid"/></transition></state>'
    '<state id="working"><invoke id="w2" type="x-worker" src="other"/></state></state>'
    '<final id="finished"/><final id="stopped"/>'
)


async def drive(worker: Worker, *, finish: bool) -> Session:
    async with System(VirtualClock()) as system:
        session = await system.start(compile_chart(WORKER_CHART), invoke_types={"x-worker": worker})
        await asyncio.wait_for(worker.ready.wait(), timeout=5)
        await system.drain()
        session.send("poke")
        await system.drain()
        if finish:
            worker.ports["w"].done({"result": 7})
        else:
            session.send("stop")
        await asyncio.wait_for(session.wait(), timeout=5)
        await system.drain()
        worker.ports["w"].send_to_parent("late")  # ignored: the invocation is over
        await system.drain()
    return session


def test_a_custom_invoke_type_reports_events_and_done() -> None:
    worker = Worker()
    session = asyncio.run(drive(worker, finish=True))
    assert session.configuration == ("finished",)
    assert session.state.datamodel["readyfrom"] == "w"
    assert session.state.datamodel["result"] == 7
    assert worker.started[0] == InvokePlan("w", type="x-worker", src="job", data={"size": 3})
    assert ("w", "poke") in worker.forwarded
    # w finished by itself; leaving "working" cancels only w2
    assert worker.cancelled == ["w2"]


def test_leaving_the_state_cancels_the_service() -> None:
    worker = Worker()
    session = asyncio.run(drive(worker, finish=False))
    assert session.configuration == ("stopped",)
    assert sorted(worker.cancelled) == ["w", "w2"]


def test_services_that_cannot_start_raise_error_execution() -> None:
    for invoke in ('<invoke type="x-worker"/>', '<invoke type="x-worker" src="broken"/>'):
        source = chart(
            '<datamodel><data id="who"/></datamodel>'
            f'<state id="a">{invoke}<transition event="error.execution" target="failed">'
            '<assign location="who" expr="_event.invokeid"/></transition></state>'
            '<final id="failed"/>'
        )
        session = asyncio.run(run(source, invoke_types={"x-worker": Worker()}))
        assert session.configuration == ("failed",)
        assert str(session.state.datamodel["who"]).startswith("a.inv_")


def test_an_unregistered_invoke_type_raises_error_execution() -> None:
    source = chart(
        '<state id="a"><invoke type="x-robot"/><transition event="error.execution" '
        'target="failed"/></state><final id="failed"/>'
    )
    session = asyncio.run(run(source, invoke_types={"x-worker": Worker()}))
    assert session.configuration == ("failed",)
    assert not any(isinstance(effect, fx.Invoke) for effect in session.performed)


def test_sends_to_a_service_are_forwarded() -> None:
    worker = Worker()
    source = chart(
        '<state id="a"><invoke id="w" type="x-worker" src="job"/>'
        '<transition event="ready"><send target="#_w" event="work"/></transition>'
        '<transition event="error.communication" target="bad"/></state><final id="bad"/>'
    )

    async def main() -> Any:
        async with System(VirtualClock()) as system:
            session = await system.start(compile_chart(source), invoke_types={"x-worker": worker})
            await asyncio.wait_for(worker.ready.wait(), timeout=5)
            for _ in range(3):
                await system.drain()
            return session.configuration

    assert asyncio.run(main()) == ("a",)
    assert worker.forwarded == [("w", "work")]


class FailingWorker(Worker):
    """A worker whose handler raises when handed an event or cancelled."""

    async def cancel(self, invoke_id: str) -> None:
        raise RuntimeError(f"cannot stop {invoke_id}")

    async def forward(self, invoke_id: str, event: Event) -> None:
        raise RuntimeError(f"cannot take {event.name}")


def test_a_forward_the_handler_fails_raises_error_communication() -> None:
    source = chart(
        '<datamodel><data id="why"/></datamodel>'
        '<state id="a"><invoke id="w" type="x-worker" src="job"/>'
        '<transition event="ready"><send target="#_w" event="work"/></transition>'
        '<transition event="error.communication" target="bad">'
        '<assign location="why" expr="_event.data.message"/></transition></state>'
        '<final id="bad"/>'
    )
    session = asyncio.run(run(source, invoke_types={"x-worker": FailingWorker()}))
    assert session.configuration == ("bad",)
    assert "cannot take work" in str(session.state.datamodel["why"])


def test_a_cancel_the_handler_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    worker = FailingWorker()
    source = chart(
        '<state id="a"><invoke id="w" type="x-worker" src="job"/>'
        '<transition event="ready" target="done"/></state><final id="done"/>'
    )
    with caplog.at_level(logging.WARNING, logger="statifier.session.live"):
        session = asyncio.run(run(source, invoke_types={"x-worker": worker}))
    assert session.configuration == ("done",)
    said = [r for r in caplog.records if "failed to cancel 'w'" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert "cannot stop w" in said[0].getMessage()


def test_replay_knows_the_registered_types() -> None:
    source = (
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a"><state id="a">'
        '<onentry><send type="loopback" event="x"/><send type="nowhere" event="y"/></onentry>'
        "</state></scxml>"
    )
    machine = compile_chart(source)

    class Loopback:
        def plan(self, target: str | None, event: Event) -> Delivery | str:
            return Delivery(target or "", event)

        async def perform(self, delivery: Delivery) -> str | None:
            return None

    async def scenario() -> Any:
        async with System(VirtualClock()) as system:
            session = await system.start(machine, record=True, send_types={"loopback": Loopback()})
            await system.run_until_idle()
            return session

    session = asyncio.run(scenario())
    assert session.recording is not None
    assert session.recording.send_types == frozenset({"loopback"})
    assert replay(machine, session.recording) == session.performed
