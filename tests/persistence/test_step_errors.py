"""Error events of durable steps: recorded with their step, counted on the execution,
reported and logged on every backend; and the policy that fails an execution on an
error no transition takes."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from statifier import telemetry
from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions
from statifier.core import effects as fx
from statifier.persistence import (
    Discarded,
    EffectContext,
    Executions,
    Refused,
    Status,
    Stepped,
    Storage,
    decode_outcome,
    prune,
)
from statifier.persistence import executions as executions_module
from statifier.persistence.adapter import Adapter
from statifier.persistence.executions import CREATE_VIA
from statifier.persistence.fernet import FernetCodec
from statifier.persistence.step_errors import (
    MAX_STEP_ERRORS,
    OnError,
    StepError,
    decode_error,
    error_record,
    step_errors,
)
from statifier.repeats import IntervalTally

SCXML = 'xmlns="http://www.w3.org/2005/07/scxml"'

# The newcomer's chart: a payment whose amount arrives as a string. The <assign> fails,
# so the rest of the transition (the payment timeout) never runs.
ORDER = f"""<scxml {SCXML} initial="placed" datamodel="predicator">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paying">
      <assign location="amount" expr="_event.data.amount * 2"/>
      <send event="payment.timeout" delay="15s"/>
    </transition>
    <transition event="note"/>
  </state>
  <state id="paying">
    <transition event="payment.timeout" target="expired"/>
    <transition event="paid" target="paid"/>
  </state>
  <final id="paid"/>
  <final id="expired"/>
</scxml>"""

# The same mistake, routed: the author answers error.execution with a transition.
ROUTED = f"""<scxml {SCXML} initial="placed" datamodel="predicator">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paying">
      <assign location="amount" expr="_event.data.amount * 2"/>
    </transition>
  </state>
  <state id="paying">
    <transition event="error.execution" target="rejected"/>
  </state>
  <final id="rejected"/>
</scxml>"""

# A chart whose start fails: a <data> expression that cannot be evaluated.
BROKEN_START = f"""<scxml {SCXML} initial="idle" datamodel="predicator">
  <datamodel><data id="total" expr="'a' * 2"/></datamodel>
  <state id="idle"><transition event="go" target="done"/></state>
  <final id="done"/>
</scxml>"""

# A condition that fails on every round of a loop: far more errors than one step stores.
STORMY = f"""<scxml {SCXML} initial="a" datamodel="predicator">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="a">
    <transition event="spin" target="b"/>
  </state>
  <state id="b">
    <onentry><assign location="n" expr="n + 1"/><raise event="again"/></onentry>
    <transition event="again" cond="'x' * 1" target="a"/>
    <transition event="again" cond="n &lt; 40" target="b"/>
    <transition event="again" target="c"/>
  </state>
  <state id="c"/>
</scxml>"""


def machine(source: str) -> Machine:
    return compile_chart(source)


@pytest.fixture(autouse=True)
def fresh_log_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first error of a kind is logged at once (an interval opened by an
    earlier test would only count it)."""
    monkeypatch.setattr(executions_module, "_repeats", IntervalTally())


@pytest.fixture
def reports() -> Iterator[list[Mapping[str, Any]]]:
    seen: list[Mapping[str, Any]] = []
    telemetry.attach(
        "test-step-errors",
        "statifier.persistence.error",
        lambda name, measurements, metadata: seen.append(metadata),
    )
    try:
        yield seen
    finally:
        telemetry.detach("test-step-errors")


async def _dropping(effect: fx.Effect, context: EffectContext) -> Refused | None:
    return None


def _executions(adapter: Adapter, **options: Any) -> Executions:
    return Executions(Storage(adapter), executor=_dropping, **options)


@pytest.mark.asyncio
async def test_an_error_is_answered_counted_and_stored_with_its_step(
    adapter: Adapter, reports: list[Mapping[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter)
    await executions.create("order-1", chart)
    with caplog.at_level(logging.WARNING, logger="statifier.persistence"):
        stepped = await executions.step("order-1", chart, Event("pay", data={"amount": "12"}))
    assert isinstance(stepped, Stepped)
    # The transition was taken, the timeout never sent: the chart waits in paying.
    assert stepped.matched
    assert stepped.state.leaf_configuration() == ("paying",)
    assert not any(isinstance(e, fx.SendDelayed) for e in stepped.effects)
    (error,) = stepped.errors
    assert (error.name, error.element, error.taken) == ("error.execution", "assign", False)
    assert error.message == "'*' expects numbers, got a string"
    assert (error.line, error.column) == (5, 7)
    record = stepped.execution
    assert record.status is Status.ACTIVE
    assert record.error_count == 1
    assert record.last_error_at == record.updated_at
    # Stored with the step: under the input-log entry of the event that raised it.
    (logged,) = [entry for entry in await executions.inputs("order-1") if entry.via == "step"]
    (stored,) = await executions.storage.errors("order-1")
    assert (stored.seq, stored.via, stored.name, stored.taken) == (
        logged.seq,
        "step",
        "error.execution",
        False,
    )
    assert decode_error(stored) == StepError(
        "error.execution",
        taken=False,
        message=error.message,
        element="assign",
        line=5,
        column=7,
        reason=error.reason,
        via="step",
        seq=logged.seq,
        recorded_at=stored.recorded_at,
    )
    fetched = await executions.storage.fetch_execution("order-1")
    assert (fetched.error_count, fetched.last_error_at) == (1, record.last_error_at)
    # Reported and logged, naming where the chart failed.
    (report,) = reports
    assert report["execution_id"] == "order-1"
    assert (report["error"], report["element"], report["line"], report["taken"]) == (
        "error.execution",
        "assign",
        5,
        False,
    )
    (line,) = [r for r in caplog.records if r.name == "statifier.persistence"]
    assert line.levelno == logging.WARNING
    assert "order-1" in line.getMessage()
    assert "error.execution at <assign>, line 5, column 7" in line.getMessage()


@pytest.mark.asyncio
async def test_errors_add_up_over_steps(adapter: Adapter) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter)
    await executions.create("order-1", chart)
    first = await executions.step("order-1", chart, Event("pay", data={"amount": "x"}))
    assert isinstance(first, Stepped)
    clean = await executions.step("order-1", chart, Event("nothing"))
    assert isinstance(clean, Stepped)
    assert clean.errors == ()
    assert clean.execution.error_count == 1
    assert clean.execution.last_error_at == first.execution.last_error_at
    assert not clean.matched


@pytest.mark.asyncio
async def test_a_taken_error_is_recorded_as_taken_and_fails_nothing(adapter: Adapter) -> None:
    chart = machine(ROUTED)
    executions = _executions(adapter, on_error=OnError.FAIL)
    await executions.create("order-1", chart)
    stepped = await executions.step("order-1", chart, Event("pay", data={"amount": "x"}))
    assert isinstance(stepped, Stepped)
    assert [(e.name, e.taken) for e in stepped.errors] == [("error.execution", True)]
    assert stepped.execution.status is Status.COMPLETED
    assert stepped.state.leaf_configuration() == ()
    assert stepped.execution.error_count == 1


@pytest.mark.asyncio
async def test_on_error_fail_fails_the_execution_with_the_error_as_reason(
    adapter: Adapter,
) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter, on_error="fail")
    await executions.create("order-1", chart)
    stepped = await executions.step("order-1", chart, Event("pay", data={"amount": "x"}))
    assert isinstance(stepped, Stepped)
    record = stepped.execution
    assert record.status is Status.FAILED
    assert stepped.finished
    assert record.failure == (
        "unhandled error.execution at <assign>, line 5, column 7: '*' expects numbers, got a string"
    )
    assert record.ended_at == record.updated_at
    assert decode_outcome(record) == {
        "reason": "unhandled_error",
        "error": {
            "name": "error.execution",
            "message": "'*' expects numbers, got a string",
            "element": "assign",
            "line": 5,
            "column": 7,
        },
    }
    # The failed execution takes no more events.
    late = await executions.step("order-1", chart, Event("paid"))
    assert isinstance(late, Discarded)


@pytest.mark.asyncio
async def test_a_call_may_choose_its_own_policy(adapter: Adapter) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter)  # continue, by default
    for execution_id, on_error, status in (
        ("order-1", None, Status.ACTIVE),
        ("order-2", OnError.FAIL, Status.FAILED),
        ("order-3", "continue", Status.ACTIVE),
    ):
        await executions.create(execution_id, chart)
        stepped = await executions.step(
            execution_id, chart, Event("pay", data={"amount": "x"}), on_error=on_error
        )
        assert isinstance(stepped, Stepped)
        assert stepped.execution.status is status, execution_id
    with pytest.raises(ValueError, match="on_error is 'continue' or 'fail'"):
        Executions(Storage(adapter), on_error="explode")


@pytest.mark.asyncio
async def test_errors_of_a_create_are_recorded_and_may_fail_it(adapter: Adapter) -> None:
    chart = machine(BROKEN_START)
    executions = _executions(adapter)
    created = await executions.create("start-1", chart)
    assert [(e.name, e.element, e.taken) for e in created.errors] == [
        ("error.execution", "data", False)
    ]
    assert created.execution.error_count == 1
    (stored,) = await executions.storage.errors("start-1")
    # No start data: the create logs no input, so its error stands under no entry.
    assert (stored.via, stored.seq) == (CREATE_VIA, None)
    with_data = await executions.create(
        "start-2", chart, options=StartOptions(datamodel={"other": 1}), on_error="fail"
    )
    assert with_data.execution.status is Status.FAILED
    (stored,) = await executions.storage.errors("start-2")
    (logged,) = await executions.inputs("start-2")
    assert (stored.via, stored.seq) == (CREATE_VIA, logged.seq)


@pytest.mark.asyncio
async def test_a_step_stores_a_bounded_number_of_errors_and_counts_them_all(
    adapter: Adapter,
) -> None:
    chart = machine(STORMY)
    executions = _executions(adapter)
    await executions.create("storm", chart)
    stepped = await executions.step("storm", chart, Event("spin"))
    assert isinstance(stepped, Stepped)
    raised = len(stepped.errors)
    assert raised > MAX_STEP_ERRORS
    assert stepped.execution.error_count == raised
    stored = await executions.storage.errors("storm", limit=1_000)
    assert len(stored) == MAX_STEP_ERRORS


@pytest.mark.asyncio
async def test_a_cancel_records_what_its_onexit_raised(adapter: Adapter) -> None:
    chart = machine(
        f"""<scxml {SCXML} initial="a" datamodel="predicator">
          <state id="a"><onexit><assign location="nowhere" expr="1"/></onexit></state>
        </scxml>"""
    )
    executions = _executions(adapter)
    await executions.create("c-1", chart)
    cancelled = await executions.cancel("c-1")
    assert isinstance(cancelled, Stepped)
    assert [(e.name, e.taken) for e in step_errors(cancelled.effects)] == [
        ("error.execution", False)
    ]
    assert cancelled.execution.error_count == 1
    (stored,) = await executions.storage.errors("c-1")
    assert stored.via == "cancel"


@pytest.mark.asyncio
async def test_matched_says_whether_a_transition_took_the_event(adapter: Adapter) -> None:
    # A refused send re-enters the chart as error.communication after the event's own
    # macrostep: the event was still taken.
    chart = machine(
        f"""<scxml {SCXML} initial="a" datamodel="predicator">
          <state id="a"><transition event="go" target="b">
            <send event="out" target="#_elsewhere"/></transition></state>
          <state id="b"/>
        </scxml>"""
    )
    executions = Executions(Storage(adapter))  # refuses every send
    await executions.create("m-1", chart)
    taken = await executions.step("m-1", chart, Event("go"))
    assert isinstance(taken, Stepped)
    assert taken.matched
    assert [(e.name, e.taken) for e in taken.errors] == [("error.communication", False)]
    unused = await executions.step("m-1", chart, Event("go"))
    assert isinstance(unused, Stepped)
    assert not unused.matched


@pytest.mark.asyncio
async def test_prune_clears_the_errors_of_what_it_prunes(adapter: Adapter) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter, on_error="fail")
    await executions.create("order-1", chart)
    await executions.step("order-1", chart, Event("pay", data={"amount": "x"}))
    assert len(await executions.storage.errors("order-1")) == 1
    far = executions.storage.clock().replace(year=2999)
    assert await prune(executions.storage, ended_before=far) == 1
    assert await executions.storage.errors("order-1") == []
    fetched = await executions.storage.fetch_execution("order-1")
    assert fetched.error_count == 1  # the count outlives the rows


@pytest.mark.asyncio
async def test_stored_errors_go_through_the_codec(adapter: Adapter) -> None:
    codec = FernetCodec([FernetCodec.generate_key()])
    storage = Storage(adapter, codec=codec)
    chart = machine(ORDER)
    executions = Executions(storage, executor=_dropping)
    await executions.create("order-1", chart)
    await executions.step("order-1", chart, Event("pay", data={"amount": "x"}))
    (raw,) = await adapter.errors("order-1", 10)
    assert raw.error.startswith(b"gAAAAA")
    assert b"expects numbers" not in raw.error
    (read,) = await storage.errors("order-1")
    assert decode_error(read).message == "'*' expects numbers, got a string"


def test_a_step_error_reads_back_what_it_stored() -> None:
    from datetime import UTC, datetime

    at = datetime(2026, 1, 2, tzinfo=UTC)
    error = StepError(
        "error.communication", taken=True, message="no route 'x'", sendid="s1", reason="r"
    )
    record = error_record("ex_1", error, via="timer", seq=3, recorded_at=at)
    assert decode_error(record) == StepError(
        "error.communication",
        taken=True,
        message="no route 'x'",
        sendid="s1",
        reason="r",
        via="timer",
        seq=3,
        recorded_at=at,
    )
    assert error.describe() == "error.communication: no route 'x' (a transition took it)"


@pytest.mark.asyncio
async def test_the_final_state_an_execution_ended_in_is_stored_with_its_end(
    adapter: Adapter,
) -> None:
    chart = machine(ORDER)
    executions = _executions(adapter)
    await executions.create("paid", chart)
    await executions.create("expired", chart)
    await executions.create("cancelled", chart)
    for execution_id, events in (
        ("paid", [Event("pay", data={"amount": 3}), Event("paid")]),
        ("expired", [Event("pay", data={"amount": 3}), Event("payment.timeout")]),
    ):
        for event in events:
            stepped = await executions.step(execution_id, chart, event)
            assert isinstance(stepped, Stepped)
        assert (await executions.storage.fetch_execution(execution_id)).status is Status.COMPLETED
    await executions.cancel("cancelled")
    storage = executions.storage
    assert (await storage.fetch_execution("paid")).final_state == "paid"
    assert (await storage.fetch_execution("expired")).final_state == "expired"
    assert (await storage.fetch_execution("cancelled")).final_state is None


@pytest.mark.asyncio
async def test_a_chart_failing_on_every_event_logs_one_line_then_a_count(
    caplog: pytest.LogCaptureFixture, reports: list[Mapping[str, Any]]
) -> None:
    from statifier.persistence import MemoryAdapter

    chart = machine(ROUTED)
    executions = Executions(Storage(MemoryAdapter()), executor=_dropping)
    with caplog.at_level(logging.WARNING, logger="statifier.persistence"):
        for n in range(50):
            await executions.create(f"order-{n}", chart)
            await executions.step(f"order-{n}", chart, Event("pay", data={"amount": "x"}))
        executions_module._repeats.flush()
    lines = [r.getMessage() for r in caplog.records if r.name == "statifier.persistence"]
    assert len(lines) == 2
    assert lines[0].startswith("execution order-0 (step): error.execution at <assign>")
    assert lines[1].startswith("49 more of: error.execution at <assign>")
    assert lines[1].endswith("(the last in execution order-49)")
    assert len(reports) == 50  # telemetry is not bounded: it carries every one
