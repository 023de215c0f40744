"""Host expression functions: a chart compiled with ``functions=`` calls them in its
conditions, values and scripts, in a live session, in a durable execution whose
stored chart is compiled again after a restart, through `Durable`, and in an
invoked child."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from statifier.chart import compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.durable import Durable
from statifier.expr import Function, FunctionError, Value
from statifier.persistence import Executions, MemoryAdapter, Stepped, Storage
from statifier.session.clock import VirtualClock
from statifier.session.live import System


def _vip(args: tuple[Value, ...]) -> Value:
    (amount,) = args
    if not isinstance(amount, int):
        raise FunctionError("vip expects an integer amount", "invalid_argument")
    return amount >= 100


def _double(args: tuple[Value, ...]) -> Value:
    (value,) = args
    return value * 2 if isinstance(value, int) else None


FUNCTIONS = {"vip": Function(_vip, 1), "double": Function(_double, 1)}

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="doubled" expr="0"/></datamodel>
  <state id="open">
    <transition event="pay" cond="vip(_event.data.amount)" target="priority">
      <assign location="doubled" expr="double(_event.data.amount)"/>
    </transition>
    <transition event="pay" target="standard"/>
  </state>
  <state id="priority"><onentry><script>doubled = double(doubled)</script></onentry></state>
  <state id="standard"/>
</scxml>"""


def test_a_chart_calls_the_functions_it_was_compiled_with() -> None:
    machine = compile_chart(CHART, functions=FUNCTIONS)
    state, _ = initialize(machine, StartOptions())
    big, _ = handle_event(state, Event("pay", data={"amount": 150}))
    small, _ = handle_event(state, Event("pay", data={"amount": 5}))
    assert big.leaf_configuration() == ("priority",)
    assert big.datamodel["doubled"] == 600
    assert small.leaf_configuration() == ("standard",)


def test_without_them_the_call_is_an_error_and_the_fallback_transition_is_taken() -> None:
    state, _ = initialize(compile_chart(CHART), StartOptions())
    after, _ = handle_event(state, Event("pay", data={"amount": 150}))
    assert after.leaf_configuration() == ("standard",)
    last = after.datamodel["_event"]
    assert isinstance(last, dict)
    assert last["name"] == "error.execution"


def test_a_function_that_fails_raises_error_execution_in_the_chart() -> None:
    machine = compile_chart(CHART, functions=FUNCTIONS)
    state, _ = initialize(machine, StartOptions())
    after, _ = handle_event(state, Event("pay", data={"amount": "lots"}))
    assert after.leaf_configuration() == ("standard",)


def test_the_chart_keeps_its_own_in_and_refuses_what_is_not_a_function() -> None:
    with pytest.raises(ValueError, match="'In' is the chart's own"):
        compile_chart(CHART, functions={"In": FUNCTIONS["vip"]})
    with pytest.raises(ValueError, match="not a Function"):
        compile_chart(CHART, functions={"vip": _vip})  # type: ignore[dict-item]


def test_a_live_session_and_its_invoked_child_call_them() -> None:
    parent_source = (
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="asking">'
        '<state id="asking"><invoke id="kid"><content>'
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="k">'
        '<state id="k"><transition cond="vip(200)" target="done"/></state>'
        '<final id="done"/></scxml></content></invoke>'
        '<transition event="done.invoke.kid" target="answered"/></state>'
        '<final id="answered"/></scxml>'
    )

    async def finished(functions: dict[str, Function] | None) -> bool:
        system = System(VirtualClock())
        session = await system.start(compile_chart(parent_source, functions=functions))
        await system.run_until_idle()
        return not session.state.running

    # The child's condition calls vip(): with the functions it finishes, and so does
    # its parent; without them the condition fails and both wait.
    assert asyncio.run(finished(FUNCTIONS)) is True
    assert asyncio.run(finished(None)) is False


def test_a_durable_execution_steps_its_stored_chart_with_the_storage_functions() -> None:
    machine = compile_chart(CHART, functions=FUNCTIONS)
    adapter = MemoryAdapter()

    async def run() -> tuple[tuple[str, ...], Value]:
        await Executions(Storage(adapter)).create("order_1", machine)
        # A restart: a new storage compiles the stored source again, with the functions.
        restarted = Executions(Storage(adapter, functions=FUNCTIONS))
        stepped = await restarted.step("order_1", None, Event("pay", data={"amount": 120}))
        assert isinstance(stepped, Stepped)
        state = stepped.state
        return state.leaf_configuration(), state.datamodel["doubled"]

    assert asyncio.run(run()) == (("priority",), 480)


def test_durable_compiles_its_charts_with_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"

    async def run() -> tuple[str, ...]:
        async with Durable(url, charts={"order": CHART}, functions=FUNCTIONS, migrate=True) as d:
            await d.create("order", "order_7")
            await d.send("order_7", "pay", {"amount": 999})
            return (await d.describe("order_7")).configuration

    assert asyncio.run(run()) == ("priority",)
