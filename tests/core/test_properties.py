"""Properties over random event sequences: determinism, position fidelity and legal
configurations, for a few fixed charts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.chart import Machine, compile_chart
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.positions import dump, load

NS = "http://www.w3.org/2005/07/scxml"

# Parallel regions, deep and shallow history and datamodel counters.
WORKSHOP = compile_chart(
    f"""<scxml xmlns="{NS}" initial="shop" name="workshop">
  <datamodel>
    <data id="made" expr="0"/><data id="broken" expr="0"/><data id="log" expr="[]"/>
  </datamodel>
  <state id="shop" initial="floor">
    <history id="deep_h" type="deep"><transition target="floor"/></history>
    <history id="shallow_h"><transition target="office"/></history>
    <parallel id="floor">
      <state id="press" initial="idle">
        <state id="idle"><transition event="load" target="pressing"/></state>
        <state id="pressing">
          <onentry><assign location="made" expr="made + 1"/></onentry>
          <transition event="load" cond="made &gt; 1" target="jammed"/>
          <transition event="unload" target="idle"/>
        </state>
        <state id="jammed">
          <onentry><assign location="broken" expr="broken + 1"/><raise event="alarm"/></onentry>
          <transition event="fix" target="idle"/>
        </state>
      </state>
      <state id="belt" initial="stopped">
        <state id="stopped"><transition event="run" target="running"/></state>
        <state id="running">
          <transition event="run" target="fast"/>
          <transition event="alarm" target="stopped"/>
          <transition event="unload">
            <assign location="log" expr="log + [made]"/>
          </transition>
        </state>
        <state id="fast"><transition event="run" target="running"/>
          <transition event="alarm" target="stopped"/></state>
      </state>
      <transition event="lunch" target="canteen"/>
    </parallel>
    <state id="office"><transition event="work" target="floor"/>
      <transition event="lunch" target="canteen"/></state>
    <transition event="fix" cond="broken &gt; 0" target="closed"/>
  </state>
  <state id="canteen">
    <transition event="back" target="deep_h"/>
    <transition event="work" target="shallow_h"/>
    <transition event="office" target="office"/>
  </state>
  <final id="closed"><donedata><param name="made" location="made"/></donedata></final>
</scxml>"""
)
WORKSHOP_EVENTS = [
    "load", "load", "unload", "run", "fix", "lunch", "back", "work", "office", "noise",
]  # fmt: skip

# Eventless transitions, raised events, nested completion (done.state) and errors.
STEPS = compile_chart(
    f"""<scxml xmlns="{NS}" initial="top">
  <datamodel><data id="n" expr="0"/><data id="errors" expr="0"/></datamodel>
  <state id="top" initial="a">
    <state id="a">
      <transition event="go" target="b"><raise event="hop"/></transition>
      <transition event="bad" cond="nope" target="b"/>
    </state>
    <state id="b" initial="b1">
      <state id="b1"><transition event="hop" target="b2"/></state>
      <state id="b2"><transition cond="n &gt;= 2" target="bf"/>
        <transition event="inc"><assign location="n" expr="n + 1"/></transition></state>
      <final id="bf"/>
      <transition event="done.state.b" target="a">
        <assign location="n" expr="0"/><raise event="again"/>
      </transition>
    </state>
    <transition event="error.execution"><assign location="errors" expr="errors + 1"/>
    </transition>
    <transition event="again" cond="errors &gt; 1" target="c"/>
  </state>
  <parallel id="c">
    <state id="c1"><state id="c1a"><transition event="inc" target="c1f"/></state>
      <final id="c1f"/></state>
    <state id="c2"><state id="c2a"><transition event="go" target="c2f"/></state>
      <final id="c2f"/></state>
    <transition event="done.state.c" target="end"/>
  </parallel>
  <final id="end"/>
</scxml>"""
)
STEPS_EVENTS = ["go", "hop", "inc", "bad", "again", "other"]

# Sends, cancels, invocations, foreach and scripts.
EFFECTS = compile_chart(
    f"""<scxml xmlns="{NS}" initial="w">
  <datamodel><data id="items" expr="[]"/><data id="sid"/></datamodel>
  <state id="w">
    <invoke type="scxml" src="child.scxml" autoforward="true"/>
    <onentry><send event="tick" delay="1s" idlocation="sid"/></onentry>
    <transition event="add">
      <foreach array="[1, 2]" item="it" index="i">
        <assign location="items" expr="items + [it * 10 + i]"/></foreach>
    </transition>
    <transition event="tick" target="v"><cancel sendidexpr="sid"/></transition>
    <transition event="script"><script>items = items + [len(items)]; extra = 1</script>
    </transition>
  </state>
  <state id="v">
    <onentry><send event="ping" target="#_parent"><param name="n" expr="len(items)"/></send>
    </onentry>
    <transition event="add" target="w"/>
  </state>
</scxml>"""
)
EFFECTS_EVENTS = ["add", "tick", "script", "other"]

CHARTS = {
    "workshop": (WORKSHOP, WORKSHOP_EVENTS),
    "steps": (STEPS, STEPS_EVENTS),
    "effects": (EFFECTS, EFFECTS_EVENTS),
}


@st.composite
def scenario(draw: st.DrawFn, names: Sequence[str]) -> list[Event]:
    count = draw(st.integers(min_value=0, max_value=25))
    events = []
    for _ in range(count):
        name = draw(st.sampled_from(names))
        data = draw(st.one_of(st.none(), st.integers(-3, 3), st.just([1, "x"])))
        events.append(Event(name, data=data) if draw(st.booleans()) else Event(name))
    return events


def drive(
    machine: Machine, events: Sequence[Event], options: StartOptions
) -> tuple[list[MachineState], list[list[fx.Effect]]]:
    """Every state and the effects of every step, stopping when the chart finishes."""
    state, effects = initialize(machine, options)
    states, steps = [state], [effects]
    for event in events:
        if not state.running:
            break
        state, effects = handle_event(state, event)
        states.append(state)
        steps.append(effects)
    return states, steps


def check_configuration(state: MachineState) -> None:
    machine = state.machine
    configuration = state.configuration
    assert 0 in configuration
    for index in configuration:
        node = machine.states[index]
        assert node.kind != "history"
        if index != 0:
            assert node.parent in configuration
        active_children = [child for child in node.children if child in configuration]
        if node.is_compound:
            assert len(active_children) == 1, (node.id, active_children)
        elif node.kind == "parallel":
            assert active_children == list(node.children)
        else:
            assert active_children == []


SETTINGS = settings(max_examples=150, deadline=None, database=None)


@pytest.mark.parametrize("chart", sorted(CHARTS))
@SETTINGS
@given(data=st.data())
def test_dump_and_load_at_any_point_continues_identically(chart: str, data: st.DataObject) -> None:
    machine, names = CHARTS[chart]
    events = data.draw(scenario(names))
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    trace = data.draw(st.booleans())
    options = StartOptions(session_id="prop", trace=trace)
    states, steps = drive(machine, events, options)
    if cut >= len(states):
        return  # the chart finished before the cut
    resumed = load(machine, dump(states[cut]))
    assert resumed == states[cut]
    for position, event in enumerate(events[cut:], start=cut + 1):
        if position >= len(states):
            break
        resumed, effects = handle_event(resumed, event)
        assert effects == steps[position]
        assert resumed == states[position]
        assert dump(resumed) == dump(states[position])


@pytest.mark.parametrize("chart", sorted(CHARTS))
@SETTINGS
@given(data=st.data())
def test_the_same_events_give_the_same_states_and_effects(chart: str, data: st.DataObject) -> None:
    machine, names = CHARTS[chart]
    events = data.draw(scenario(names))
    options = StartOptions(session_id="prop", trace=True)
    assert drive(machine, events, options) == drive(machine, events, options)


@pytest.mark.parametrize("chart", sorted(CHARTS))
@SETTINGS
@given(data=st.data())
def test_every_macrostep_ends_in_a_legal_configuration(chart: str, data: st.DataObject) -> None:
    machine, names = CHARTS[chart]
    events = data.draw(scenario(names))
    states, steps = drive(machine, events, StartOptions())
    for state, effects in zip(states, steps, strict=True):
        assert state.internal_queue == ()
        if state.running:
            check_configuration(state)
            assert not [e for e in effects if isinstance(e, fx.Done)]
        else:
            assert state.configuration == frozenset()
            done = [e for e in effects if isinstance(e, fx.Done)]
            assert len(done) == 1
            assert done[0].configuration
        stamps = [(e.macrostep, e.round, e.microstep) for e in effects]
        assert stamps == sorted(stamps)
        assert {e.macrostep for e in effects} <= {state.macrostep}
