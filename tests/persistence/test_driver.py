"""The driver: invocations performed and answered durably, children, fan-out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.expr import Value
from statifier.persistence import Discarded, EffectContext, Status, Stepped, Storage, decode_outcome
from statifier.persistence.adapter import Adapter
from statifier.persistence.driver import (
    Answer,
    Answered,
    Driver,
    InvocationFailed,
    MaxTurnsExceeded,
)
from statifier.session.clock import VirtualClock
from statifier.session.handlers import InvokePlan, InvokePort
from statifier.session.live import System

NS = "http://www.w3.org/2005/07/scxml"


def chart(body: str, initial: str = "a") -> Machine:
    return compile_chart(f'<scxml xmlns="{NS}" initial="{initial}">{body}</scxml>')


PAY = chart(
    '<datamodel><data id="seen" expr="null"/></datamodel>'
    '<state id="a"><invoke id="pay" type="myapp:pay"><param name="amount" expr="5"/></invoke>'
    '<transition event="done.invoke.pay" target="paid">'
    '<assign location="seen" expr="_event"/></transition>'
    '<transition event="error.communication.invoke.pay" target="refused">'
    '<assign location="seen" expr="_event"/></transition>'
    '<transition event="abandon" target="abandoned"/></state>'
    '<final id="paid"/><final id="refused"/><final id="abandoned"/>'
)


def final(result: Stepped | Discarded) -> tuple[str, ...]:
    """The configuration the chart finished in."""
    assert isinstance(result, Stepped)
    (done,) = [effect for effect in result.effects if isinstance(effect, fx.Done)]
    return done.configuration


def seen(result: Stepped | Discarded) -> Value:
    assert isinstance(result, Stepped)
    return result.state.datamodel["seen"]


@pytest.mark.asyncio
async def test_an_invocation_is_dispatched_inside_the_step_and_answered_durably(
    adapter: Adapter,
) -> None:
    calls: list[tuple[str, Value, str]] = []

    def dispatch(invoke: fx.Invoke, context: EffectContext) -> Answer:
        calls.append((invoke.type, invoke.data, context.key))
        return Answered({"auth": "A1"})

    driver = Driver(Storage(adapter), dispatch=dispatch)
    result = await driver.create("txn", PAY)
    assert result.execution.status is Status.COMPLETED
    assert calls == [("myapp:pay", {"amount": 5}, calls[0][2])]
    event = seen(result)
    assert isinstance(event, dict)
    assert event["name"] == "done.invoke.pay"
    assert event["invokeid"] == "pay"
    assert event["data"] == {"auth": "A1"}
    vias = [(entry.via, entry.event) for entry in await driver.executions.inputs("txn")]
    assert vias == [("answer", Event("done.invoke.pay", data={"auth": "A1"}, invokeid="pay"))]


@pytest.mark.asyncio
async def test_a_failed_invocation_answers_with_error_communication(adapter: Adapter) -> None:
    driver = Driver(
        Storage(adapter),
        dispatch=lambda invoke, context: InvocationFailed("declined", attempts=3, detail="51"),
    )
    result = await driver.create("txn", PAY)
    event = seen(result)
    assert isinstance(event, dict)
    assert event["name"] == "error.communication.invoke.pay"
    assert event["data"] == {"reason": "declined", "attempts": 3, "detail": "51"}
    assert final(result) == ("refused",)


@pytest.mark.asyncio
async def test_a_pending_invocation_is_answered_later_or_dropped_once_cancelled(
    adapter: Adapter,
) -> None:
    driver = Driver(Storage(adapter), dispatch=lambda invoke, context: None)
    rested = await driver.create("txn", PAY)
    assert rested.state.leaf_configuration() == ("a",)
    answered = await driver.answer("txn", "pay", Answered(7))
    assert final(answered) == ("paid",)

    await driver.create("txn2", PAY)
    await driver.send_event("txn2", Event("abandon"))
    late = await driver.answer("txn2", "pay", Answered(7))
    assert isinstance(late, Discarded)
    assert [entry.event for entry in await driver.executions.inputs("txn2")] == [Event("abandon")]


@pytest.mark.asyncio
async def test_an_answer_that_rearms_its_own_call_is_bounded_by_max_turns(adapter: Adapter) -> None:
    again = chart(
        '<state id="a"><invoke id="poll" type="myapp:poll"/>'
        '<transition event="done.invoke.poll" target="a"/></state>'
    )
    driver = Driver(Storage(adapter), dispatch=lambda i, c: Answered(), max_turns=5)
    with pytest.raises(MaxTurnsExceeded) as caught:
        await driver.create("poller", again)
    assert caught.value.turns == 5
    record = await driver.storage.fetch_execution("poller")
    assert record.status is Status.ACTIVE
    assert len(await driver.executions.inputs("poller")) == 5


CHILD = (
    '<scxml initial="w"><datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="w"><transition event="go" target="done"/></state>'
    '<final id="done"><donedata><param name="twice" expr="n * 2"/></donedata></final>'
    "</scxml>"
)

PARENT = chart(
    '<datamodel><data id="seen" expr="null"/></datamodel>'
    f'<state id="a"><invoke id="sub" type="scxml"><param name="n" expr="21"/>'
    f"<content>{CHILD}</content></invoke>"
    '<transition event="done.invoke.sub" target="b"><assign location="seen" expr="_event.data"/>'
    "</transition></state>"
    '<final id="b"/>'
)


@pytest.mark.asyncio
async def test_an_scxml_invoke_runs_as_a_durable_child_that_answers_its_parent(
    adapter: Adapter,
) -> None:
    driver = Driver(Storage(adapter))
    parent = await driver.create("p", PARENT)
    assert parent.execution.status is Status.ACTIVE
    child = await driver.storage.fetch_execution("p/sub")
    assert child.status is Status.ACTIVE
    assert child.metadata == {"statifier.parent": "p", "statifier.invoke": "sub"}
    finished = await driver.send_event("p/sub", Event("go"))
    assert isinstance(finished, Stepped)
    assert finished.donedata == {"twice": 42}
    done = await driver.storage.fetch_execution("p")
    assert done.status is Status.COMPLETED
    machine = await driver.storage.machine(done.content_hash)
    assert driver.storage.load(done, machine).datamodel["seen"] == {"twice": 42}


@pytest.mark.asyncio
async def test_cancelling_a_parent_cancels_its_durable_child(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", PARENT)
    await driver.executions.cancel("p")
    assert (await driver.storage.fetch_execution("p/sub")).status is Status.CANCELLED
    assert isinstance(await driver.send_event("p/sub", Event("go")), Discarded)


@pytest.mark.asyncio
async def test_leaving_the_invoking_state_cancels_the_durable_child(adapter: Adapter) -> None:
    leaving = chart(
        f'<state id="a"><invoke id="sub" type="scxml"><content>{CHILD}</content></invoke>'
        '<transition event="skip" target="b"/></state><final id="b"/>'
    )
    driver = Driver(Storage(adapter))
    await driver.create("p", leaving)
    result = await driver.send_event("p", Event("skip"))
    assert isinstance(result, Stepped)
    assert result.execution.status is Status.COMPLETED
    assert (await driver.storage.fetch_execution("p/sub")).status is Status.CANCELLED


ITEM = (
    '<scxml initial="w"><datamodel><data id="item" expr="null"/></datamodel>'
    '<state id="w"><transition event="ok" target="ok"/><transition event="no" target="no"/>'
    "</state>"
    '<final id="ok"><donedata><param name="item" expr="item"/></donedata></final>'
    '<final id="no"><donedata>'
    '<param name="statifier_persistence:execution_status" expr="\'failed\'"/>'
    '<param name="item" expr="item"/></donedata></final></scxml>'
)

FAN = chart(
    '<datamodel><data id="results" expr="null"/></datamodel>'
    f'<state id="a"><invoke id="each" type="myapp:map"><content>{ITEM}</content></invoke>'
    '<transition event="done.invoke.each" target="b">'
    '<assign location="results" expr="_event.data"/></transition></state><final id="b"/>'
)


async def fan_out(
    adapter: Adapter, count: int, *, canceller: Any = None, start: int | None = None
) -> tuple[Driver, fx.Invoke]:
    invokes: list[fx.Invoke] = []

    def dispatch(invoke: fx.Invoke, context: EffectContext) -> None:
        invokes.append(invoke)  # a job runner would start the children from here

    driver = Driver(Storage(adapter), dispatch=dispatch, child_canceller=canceller)
    await driver.create("p", FAN)
    for index in range(count if start is None else start):
        await driver.start_child_at("p", invokes[0], index, count, data={"item": f"i{index}"})
    return driver, invokes[0]


async def results(driver: Driver) -> Value:
    record = await driver.storage.fetch_execution("p")
    machine = await driver.storage.machine(record.content_hash)
    return driver.storage.load(record, machine).datamodel["results"]


@pytest.mark.asyncio
async def test_a_fan_out_closes_once_with_the_dense_ordered_list(adapter: Adapter) -> None:
    driver, invoke = await fan_out(adapter, 3)
    again = await driver.start_child_at("p", invoke, 1, 3, data={"item": "other"})
    assert again.id == "p/each/1"  # adopted, not made twice
    await driver.send_event("p/each/2", Event("ok"))
    await driver.send_event("p/each/1", Event("no"))
    assert (await driver.storage.fetch_execution("p")).status is Status.ACTIVE
    await driver.send_event("p/each/0", Event("ok"))
    assert (await driver.storage.fetch_execution("p")).status is Status.COMPLETED
    assert await results(driver) == [
        {"index": 0, "status": "completed", "donedata": {"item": "i0"}},
        {
            "index": 1,
            "status": "failed",
            "failure": {"statifier_persistence:execution_status": "failed", "item": "i1"},
        },
        {"index": 2, "status": "completed", "donedata": {"item": "i2"}},
    ]


@pytest.mark.asyncio
async def test_siblings_ending_together_answer_the_parent_once(adapter: Adapter) -> None:
    driver, _ = await fan_out(adapter, 4)
    await asyncio.gather(*(driver.send_event(f"p/each/{i}", Event("ok")) for i in range(4)))
    answers = [e for e in await driver.executions.inputs("p") if e.via == "answer"]
    assert len(answers) == 1
    assert isinstance(await results(driver), list)


@pytest.mark.asyncio
async def test_first_error_cancels_started_siblings_and_reports_unstarted_ones(
    adapter: Adapter,
) -> None:
    told: list[tuple[str, str, tuple[int, ...]]] = []

    async def canceller(parent: str, invoke_id: str, indices: tuple[int, ...]) -> None:
        told.append((parent, invoke_id, indices))

    driver, invoke = await fan_out(adapter, 4, canceller=canceller, start=0)
    for index in range(2):  # children 2 and 3 are never started
        await driver.start_child_at("p", invoke, index, 4, policy="first_error")
    await driver.send_event("p/each/1", Event("no"))
    assert told == [("p", "each", (2, 3))]
    assert (await driver.storage.fetch_execution("p/each/0")).status is Status.CANCELLED
    listed = await results(driver)
    assert isinstance(listed, list)
    assert [entry["status"] for entry in listed] == [
        "cancelled",
        "failed",
        "cancelled",
        "cancelled",
    ]


class Service:
    """A live session's handler for the same invoke type the driver dispatches."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer

    def plan(self, effect: fx.Invoke) -> InvokePlan | str:
        return InvokePlan.of(effect)

    async def start(self, plan: InvokePlan, port: InvokePort) -> str | None:
        if isinstance(self.answer, Answered):
            port.done(self.answer.donedata)
        else:
            port.fail(self.answer.reason, attempts=self.answer.attempts, detail=self.answer.detail)
        return None

    async def cancel(self, invoke_id: str) -> None:
        return None

    async def forward(self, invoke_id: str, event: Event) -> None:
        return None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "answer", [Answered({"auth": "A1"}), InvocationFailed("declined", attempts=2, detail=[1])]
)
async def test_a_chart_sees_the_same_answer_in_a_session_and_out_of_storage(
    adapter: Adapter,
    answer: Answer,
) -> None:
    async with System(VirtualClock()) as system:
        session = await system.start(PAY, invoke_types={"myapp:pay": Service(answer)})
        await asyncio.wait_for(session.wait(), timeout=5)
    in_session = session.state.datamodel["seen"]
    driver = Driver(Storage(adapter), dispatch=lambda invoke, context: answer)
    out_of_storage = seen(await driver.create("txn", PAY))
    assert in_session == out_of_storage
    assert decode_outcome(await driver.storage.fetch_execution("txn")) is not None
