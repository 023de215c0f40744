"""The interpreter's memo tables change nothing but speed: a memoised run and a run
that memoises nothing give the same states and effects, and the tables stay bounded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.chart import Machine, compile_chart
from statifier.core import Event, MachineState, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.memo import KEY, TABLE_LIMIT, ChartMemo, Table, tables_for

from .test_properties import CHARTS

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from statecharts import SCXML, large_scxml  # type: ignore[import-not-found]

NS = "http://www.w3.org/2005/07/scxml"

# Eventless transitions, wildcard and prefix descriptors, In() and datamodel guards,
# a parallel state's own transition preempted by its regions', and done events.
DESCRIPTORS = f"""<scxml xmlns="{NS}" initial="p">
  <datamodel><data id="n" expr="0"/></datamodel>
  <parallel id="p">
    <state id="r1" initial="a1">
      <state id="a1"><transition event="go.left" target="a2"/>
        <transition event="*" cond="n &gt; 2" target="a3"/></state>
      <state id="a2"><transition event="go" target="a1">
        <assign location="n" expr="n + 1"/></transition></state>
      <state id="a3"><transition cond="In('b2')" target="a1"/>
        <transition event="reset" target="a1"><assign location="n" expr="0"/></transition>
      </state>
    </state>
    <state id="r2" initial="b1">
      <state id="b1"><transition event="go.right.*" target="b2"/></state>
      <state id="b2"><transition event="go" target="b1"/>
        <transition event="end" target="b3"/></state>
      <final id="b3"/>
    </state>
    <transition event="go.left.far" target="p"/>
    <transition event="done.state.r2" target="p"/>
  </parallel>
</scxml>"""
DESCRIPTOR_EVENTS = [
    "go", "go.left", "go.left.far", "go.right", "go.right.now", "reset", "end", "other",
]  # fmt: skip

CASES: dict[str, tuple[str | Machine, list[str]]] = {
    **{name: (machine, events) for name, (machine, events) in CHARTS.items()},
    "descriptors": (DESCRIPTORS, DESCRIPTOR_EVENTS),
    "bench": (SCXML, ["next", "other", "next.more"]),
    "bench-large": (large_scxml(), ["next", "other"]),
}


def machines(case: str, limit: int) -> Machine:
    """A fresh compilation of the case's chart with memo tables of ``limit`` entries."""
    chart, _ = CASES[case]
    source = chart if isinstance(chart, str) else chart.source.decode()
    machine = compile_chart(source)
    machine.memo[KEY] = ChartMemo(limit)
    return machine


def comparable(state: MachineState) -> tuple[object, ...]:
    """Every field but the machine (two compilations are two machines)."""
    return tuple(state[1:])


def run(machine: Machine, names: list[str]) -> list[tuple[object, ...]]:
    state, effects = initialize(machine)
    seen: list[tuple[object, ...]] = [(comparable(state), effects)]
    for name in names:
        if not state.running:
            break
        state, effects = handle_event(state, Event(name))
        seen.append((comparable(state), effects))
    return seen


SETTINGS = settings(max_examples=100, deadline=None, database=None)


@pytest.mark.parametrize("case", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_memoised_and_unmemoised_runs_are_identical(case: str, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(CASES[case][1]), max_size=40))
    memoised = machines(case, TABLE_LIMIT)
    # Twice on the memoised machine: the second run takes what the first one stored.
    first = run(memoised, names)
    again = run(memoised, names)
    bare = run(machines(case, 0), names)
    assert first == bare
    assert again == bare


@pytest.mark.parametrize("case", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_tables_stay_within_their_bound(case: str, data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(CASES[case][1]), max_size=60))
    small = machines(case, 3)
    assert run(small, names) == run(machines(case, 0), names)
    for name, table in small.memo[KEY].tables().items():
        assert len(table) <= 3, name


def test_a_limit_of_zero_stores_nothing() -> None:
    machine = machines("bench", 0)
    run(machine, ["next"] * 12)
    assert all(not table for table in machine.memo[KEY].tables().values())


def test_the_default_tables_fill_on_a_cycle_and_stop_growing() -> None:
    machine = compile_chart(SCXML)
    run(machine, ["next"] * 8)
    memo = tables_for(machine)
    sizes = {name: len(table) for name, table in memo.tables().items()}
    run(machine, ["next"] * 40)
    assert {name: len(table) for name, table in memo.tables().items()} == sizes
    assert memo.steps  # the unguarded steps of the cycle are whole-step plans
    assert memo.limit == TABLE_LIMIT


def test_a_full_table_evicts_its_oldest_entry() -> None:
    table: Table[int, str] = Table(2)
    table.put(1, "a")
    table.put(2, "b")
    assert table.put(3, "c") == "c"
    assert list(table.items()) == [(2, "b"), (3, "c")]


def test_guards_are_evaluated_on_every_event() -> None:
    """A guard on the datamodel decides differently from the same configuration once
    the data changed: the memo keeps candidates, never a condition's outcome."""
    machine = compile_chart(
        f"""<scxml xmlns="{NS}" initial="a">
      <datamodel><data id="n" expr="0"/></datamodel>
      <state id="a">
        <transition event="e" cond="n &gt; 1" target="b"/>
        <transition event="e"><assign location="n" expr="n + 1"/></transition>
      </state>
      <state id="b"/>
    </scxml>"""
    )
    state, _ = initialize(machine)
    leaves = []
    for _ in range(3):
        state, _ = handle_event(state, Event("e"))
        leaves.append(state.leaf_configuration())
    assert leaves == [("a",), ("a",), ("b",)]


# Guards on the event's data and In(), from configurations whose macrosteps the memo
# decides once the guards are tested; the guards on the data fail (error.execution) when
# it is not a number, so one configuration sees clean and failing selections.
GUARDED = f"""<scxml xmlns="{NS}" initial="p">
  <datamodel><data id="n" expr="0"/></datamodel>
  <parallel id="p">
    <state id="r1" initial="a1">
      <state id="a1"><transition event="go" cond="_event.data == 1" target="a2"/>
        <transition event="go" cond="_event.data &gt; 5" target="a3"/></state>
      <state id="a2"><transition event="go" cond="In('b2')" target="a1"/></state>
      <state id="a3"><transition event="go" target="a1"/></state>
    </state>
    <state id="r2" initial="b1">
      <state id="b1"><transition event="go" cond="In('a1')" target="b2"/></state>
      <state id="b2"><transition event="go" cond="n &gt; 0" target="b1"/>
        <transition event="bump"><assign location="n" expr="n + 1"/></transition></state>
    </state>
    <transition event="go" cond="In('a3') &amp;&amp; In('b2')" target="p"/>
  </parallel>
</scxml>"""
GUARDED_EVENTS = st.tuples(
    st.sampled_from(["go", "go", "bump", "other"]),
    st.sampled_from([1, 2, 7, "s", None]),
)


def run_with_data(machine: Machine, events: list[tuple[str, object]]) -> list[object]:
    state, effects = initialize(machine)
    seen: list[object] = [(comparable(state), effects)]
    for name, data in events:
        state, effects = handle_event(state, Event(name, data=data))
        seen.append((comparable(state), effects))
    return seen


def guarded_machine(limit: int) -> Machine:
    machine = compile_chart(GUARDED)
    machine.memo[KEY] = ChartMemo(limit)
    return machine


@SETTINGS
@given(events=st.lists(GUARDED_EVENTS, max_size=40))
def test_guarded_steps_memoised_and_unmemoised_are_identical(
    events: list[tuple[str, object]],
) -> None:
    memoised = guarded_machine(TABLE_LIMIT)
    first = run_with_data(memoised, events)
    again = run_with_data(memoised, events)
    assert first == run_with_data(guarded_machine(0), events)
    assert again == first
    small = guarded_machine(3)
    assert run_with_data(small, events) == first
    assert all(len(table) <= 3 for table in small.memo[KEY].tables().values())


def test_a_memoised_guarded_step_still_tests_its_guards() -> None:
    """From one configuration, the outcome follows the event's data every time, and a
    guard that fails raises error.execution, also once the clean outcomes are plans."""
    machine = compile_chart(GUARDED)
    start, _ = initialize(machine)
    seen = []
    for data in [2, 2, 1, 1, "s", 7, 1, "s"]:
        # a1 -> a2 on 1, a1 -> a3 above 5, and b1 -> b2 (In('a1')); on "s" both guards
        # on the data fail.
        after, effects = handle_event(start, Event("go", data=data))
        event = after.datamodel["_event"]
        assert isinstance(event, dict)
        seen.append((after.leaf_configuration(), event["name"], effects))
    memo = tables_for(machine)
    assert memo.guards
    assert memo.outcomes
    assert seen[0] == seen[1] == (("a1", "b2"), "go", [])
    assert seen[2] == seen[3] == seen[6] == (("a2", "b2"), "go", [])
    assert seen[4] == seen[7]
    configuration, name, errors = seen[4]
    assert (configuration, name) == (("a1", "b2"), "error.execution")
    assert all(isinstance(e, fx.ChartError) for e in errors)
    assert [(e.event.data["element"], e.taken) for e in errors if isinstance(e, fx.ChartError)] == [
        ("transition:0", False),
        ("transition:1", False),
    ]
    assert seen[5] == (("a3", "b2"), "go", [])
