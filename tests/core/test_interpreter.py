"""The Appendix D interpreter: entry and exit, selection, history, completion, budget,
counters, purity and the step-by-step entry points (inline charts, public API only)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import (
    Event,
    MachineNotRunning,
    MachineState,
    StartOptions,
    handle_event,
    initialize,
)
from statifier.core import effects as fx
from statifier.core.interpreter import cancel, macrostep, microstep
from statifier.expr import UNDEFINED

NS = "http://www.w3.org/2005/07/scxml"


def chart(body: str, attrs: str = "") -> Machine:
    return compile_chart(f'<scxml xmlns="{NS}" {attrs}>{body}</scxml>')


def labels(effects: Sequence[fx.Effect]) -> list[str | None]:
    return [effect.label for effect in effects if isinstance(effect, fx.Log)]


def leaves(state: MachineState, effects: Sequence[fx.Effect]) -> tuple[str, ...]:
    """The leaf configuration, or the one held at the end when the chart finished."""
    done = [effect for effect in effects if isinstance(effect, fx.Done)]
    return done[-1].configuration if done else state.leaf_configuration()


def drive(
    machine: Machine, *events: str | Event, options: StartOptions | None = None
) -> tuple[MachineState, list[list[fx.Effect]]]:
    """Start the chart and deliver the events; the effects of every step."""
    state, effects = initialize(machine, options or StartOptions())
    steps = [effects]
    for event in events:
        state, effects = handle_event(state, Event(event) if isinstance(event, str) else event)
        steps.append(effects)
    return state, steps


def log(label: str) -> str:
    return f'<log label="{label}"/>'


def entry_exit(label: str) -> str:
    return f"<onentry>{log('enter ' + label)}</onentry><onexit>{log('exit ' + label)}</onexit>"


# -- entry and exit order ---------------------------------------------------------------


PARALLEL = chart(
    f"""
    <parallel id="p">{entry_exit("p")}
      <state id="r1">{entry_exit("r1")}
        <state id="r1a">{entry_exit("r1a")}</state>
      </state>
      <state id="r2">{entry_exit("r2")}
        <state id="r2a">{entry_exit("r2a")}</state>
      </state>
      <transition event="out" target="z"/>
    </parallel>
    <final id="z">{entry_exit("z")}</final>
    """
)


def test_parallel_entry_is_in_document_order() -> None:
    state, effects = initialize(PARALLEL)
    assert state.leaf_configuration() == ("r1a", "r2a")
    assert labels(effects) == ["enter p", "enter r1", "enter r1a", "enter r2", "enter r2a"]


def test_exit_is_in_reverse_document_order_and_a_top_level_final_finishes() -> None:
    state, _ = initialize(PARALLEL)
    state, effects = handle_event(state, Event("out"))
    assert labels(effects) == [
        "exit r2a",
        "exit r2",
        "exit r1a",
        "exit r1",
        "exit p",
        "enter z",
        "exit z",
    ]
    assert not state.running
    assert state.status == "done"
    assert state.leaf_configuration() == ()
    done = [effect for effect in effects if isinstance(effect, fx.Done)]
    assert len(done) == 1
    assert done[0].configuration == ("z",)
    assert effects[-1] is done[0]


def test_compound_entry_runs_onentry_blocks_then_initial_content_then_children() -> None:
    machine = chart(
        f"""
        <state id="a">
          <onentry>{log("a 1")}</onentry>
          <initial><transition target="a2">{log("initial")}</transition></initial>
          <onentry>{log("a 2")}</onentry>
          <state id="a1">{entry_exit("a1")}</state>
          <state id="a2"><onentry>{log("a2 1")}{log("a2 2")}</onentry></state>
        </state>
        """
    )
    state, effects = initialize(machine)
    assert state.leaf_configuration() == ("a2",)
    assert labels(effects) == ["a 1", "a 2", "initial", "a2 1", "a2 2"]


def test_default_initial_is_the_first_child_in_document_order() -> None:
    machine = chart('<state id="a"><state id="a1"/><state id="a2"/></state><state id="b"/>')
    state, _ = initialize(machine)
    assert state.leaf_configuration() == ("a1",)


def test_initial_attribute_may_name_a_deep_descendant() -> None:
    machine = chart(
        '<state id="a" initial="a2x"><state id="a1"/>'
        '<state id="a2"><state id="a2w"/><state id="a2x"/></state></state>',
        'initial="a"',
    )
    state, _ = initialize(machine)
    assert state.leaf_configuration() == ("a2x",)


def test_initial_of_a_parallel_target_enters_other_regions_by_default() -> None:
    machine = chart(
        '<parallel id="p"><state id="r1"><state id="r1a"/><state id="r1b"/></state>'
        '<state id="r2"><state id="r2a"/><state id="r2b"/></state></parallel>',
        'initial="r2b"',
    )
    state, _ = initialize(machine)
    assert state.leaf_configuration() == ("r1a", "r2b")


# -- internal, external, targetless and eventless transitions ---------------------------


COMPOUND = chart(
    f"""
    <state id="p" initial="p1">{entry_exit("p")}
      <transition event="int" type="internal" target="p2"/>
      <transition event="ext" target="p2"/>
      <transition event="self" target="p"/>
      <transition event="self_internal" type="internal" target="p"/>
      <transition event="note">{log("note")}</transition>
      <state id="p1">{entry_exit("p1")}
        <transition event="atomic_internal" type="internal" target="p1"/>
      </state>
      <state id="p2">{entry_exit("p2")}</state>
    </state>
    """
)


def test_internal_transition_does_not_exit_its_compound_source() -> None:
    state, _ = initialize(COMPOUND)
    state, effects = handle_event(state, Event("int"))
    assert labels(effects) == ["exit p1", "enter p2"]
    assert state.leaf_configuration() == ("p2",)


def test_external_transition_exits_and_reenters_its_source() -> None:
    state, _ = initialize(COMPOUND)
    state, effects = handle_event(state, Event("ext"))
    assert labels(effects) == ["exit p1", "exit p", "enter p", "enter p2"]
    assert state.leaf_configuration() == ("p2",)


def test_external_self_transition_reenters_with_the_default_child() -> None:
    state, _ = initialize(COMPOUND)
    state, _ = handle_event(state, Event("int"))
    state, effects = handle_event(state, Event("self"))
    assert labels(effects) == ["exit p2", "exit p", "enter p", "enter p1"]
    assert state.leaf_configuration() == ("p1",)


def test_internal_transition_to_its_own_compound_source_is_external() -> None:
    # 3.13: an internal transition's targets must be proper descendants of its source
    # for the source to stay; the source itself is not one.
    state, _ = initialize(COMPOUND)
    state, effects = handle_event(state, Event("self_internal"))
    assert labels(effects) == ["exit p1", "exit p", "enter p", "enter p1"]


def test_internal_transition_of_an_atomic_state_behaves_as_external() -> None:
    state, _ = initialize(COMPOUND)
    state, effects = handle_event(state, Event("atomic_internal"))
    assert labels(effects) == ["exit p1", "enter p1"]


def test_targetless_transition_runs_content_without_exiting() -> None:
    state, _ = initialize(COMPOUND)
    after, effects = handle_event(state, Event("note"))
    assert labels(effects) == ["note"]
    assert after.configuration == state.configuration


def test_unmatched_event_changes_nothing_but_counters() -> None:
    state, _ = initialize(COMPOUND)
    after, effects = handle_event(state, Event("nobody.listens"))
    assert effects == [
        fx.Unmatched(macrostep=state.macrostep + 1, microstep=0, round=0, event="nobody.listens")
    ]
    assert after.configuration == state.configuration
    assert after.macrostep == state.macrostep + 1


def test_transition_content_runs_between_exit_and_entry() -> None:
    machine = chart(
        f'<state id="a">{entry_exit("a")}<transition event="go" target="b">{log("t")}'
        f'</transition></state><state id="b">{entry_exit("b")}</state>'
    )
    _, steps = drive(machine, "go")
    assert labels(steps[1]) == ["exit a", "t", "enter b"]


def test_eventless_transitions_run_to_quiescence() -> None:
    machine = chart(
        """
        <datamodel><data id="x" expr="0"/></datamodel>
        <state id="a">
          <transition cond="x &gt;= 3" target="b"/>
          <transition event="inc"><assign location="x" expr="x + 1"/></transition>
        </state>
        <state id="b"><transition target="c"/></state>
        <state id="c"/>
        """
    )
    state, _ = initialize(machine)
    for _ in range(2):
        state, _ = handle_event(state, Event("inc"))
        assert state.leaf_configuration() == ("a",)
    state, _ = handle_event(state, Event("inc"))
    assert state.leaf_configuration() == ("c",)
    assert state.datamodel["x"] == 3


def test_eventless_transitions_are_taken_before_internal_events() -> None:
    machine = chart(
        """
        <state id="a">
          <onentry><raise event="r"/></onentry>
          <transition target="b"/>
          <transition event="r" target="wrong"/>
        </state>
        <state id="b"><transition event="r" target="right"/></state>
        <state id="wrong"/><state id="right"/>
        """
    )
    state, _ = initialize(machine)
    assert state.leaf_configuration() == ("right",)


def test_raised_events_are_processed_in_order_before_the_next_external_event() -> None:
    machine = chart(
        """
        <state id="a">
          <transition event="go" target="b"><raise event="one"/><raise event="two"/></transition>
        </state>
        <state id="b"><transition event="one" target="c"/><transition event="two" target="x"/>
        </state>
        <state id="c"><transition event="two" target="d"/><transition event="one" target="x"/>
        </state>
        <state id="d"/><state id="x"/>
        """
    )
    state, _ = drive(machine, "go")
    assert state.leaf_configuration() == ("d",)
    assert state.internal_queue == ()


def test_a_state_picks_its_first_enabled_transition_in_document_order() -> None:
    machine = chart(
        """
        <state id="a">
          <transition event="e" cond="false" target="x"/>
          <transition event="e" target="b"/>
          <transition event="e" target="x"/>
        </state>
        <state id="b"/><state id="x"/>
        """
    )
    state, _ = drive(machine, "e")
    assert state.leaf_configuration() == ("b",)


def test_descendant_transitions_take_priority_over_ancestor_ones() -> None:
    machine = chart(
        """
        <state id="p"><transition event="e" target="x"/>
          <state id="c"><transition event="e" target="y"/></state>
        </state>
        <state id="x"/><state id="y"/>
        """
    )
    state, _ = drive(machine, "e")
    assert state.leaf_configuration() == ("y",)


# -- parallel regions and conflicts -----------------------------------------------------


REGIONS = chart(
    """
    <parallel id="p">
      <state id="r1">
        <state id="r1a">
          <transition event="both" target="r1b"/>
          <transition event="leave" target="out1"/>
          <transition event="mixed" target="r1b"/>
        </state>
        <state id="r1b"/>
      </state>
      <state id="r2">
        <state id="r2a">
          <transition event="both" target="r2b"/>
          <transition event="leave" target="out2"/>
        </state>
        <state id="r2b"/>
      </state>
      <transition event="mixed" target="out2"/>
    </parallel>
    <state id="out1"/><state id="out2"/>
    """
)


def test_non_conflicting_transitions_in_parallel_regions_are_all_taken() -> None:
    state, _ = drive(REGIONS, "both")
    assert state.leaf_configuration() == ("r1b", "r2b")


def test_conflicting_transitions_the_first_in_document_order_wins() -> None:
    state, _ = drive(REGIONS, "leave")
    assert state.leaf_configuration() == ("out1",)


def test_a_descendant_transition_preempts_a_conflicting_ancestor_transition() -> None:
    # r1a selects its own 'mixed'; r2a finds the parallel's 'mixed', whose exit set
    # intersects the first's; its source is no descendant of r1a, so it is preempted.
    state, _ = drive(REGIONS, "mixed")
    assert state.leaf_configuration() == ("r1b", "r2a")


def test_a_descendant_transition_selected_later_removes_a_conflicting_ancestor_one() -> None:
    # r1a finds only the parallel's own 'x' (selected first); r2a's own 'x' conflicts with
    # it and its source is a descendant of the parallel, so it replaces it.
    machine = chart(
        """
        <parallel id="p">
          <state id="r1"><state id="r1a"/></state>
          <state id="r2"><state id="r2a"><transition event="x" target="r2b"/></state>
            <state id="r2b"/></state>
          <transition event="x" target="out"/>
        </parallel>
        <state id="out"/>
        """
    )
    state, _ = drive(machine, "x")
    assert state.leaf_configuration() == ("r1a", "r2b")


def test_a_transition_may_target_a_state_in_each_region() -> None:
    machine = chart(
        """
        <state id="o"><transition event="x" target="r1b r2b"/></state>
        <parallel id="p">
          <state id="r1"><state id="r1a"/><state id="r1b"/></state>
          <state id="r2"><state id="r2a"/><state id="r2b"/></state>
        </parallel>
        """
    )
    state, _ = drive(machine, "x")
    assert state.leaf_configuration() == ("r1b", "r2b")


def test_a_transition_of_the_parallel_itself_is_taken_once() -> None:
    machine = chart(
        f"""
        <parallel id="p">
          <transition event="e" target="x">{log("once")}</transition>
          <state id="r1"/><state id="r2"/>
        </parallel>
        <state id="x"/>
        """
    )
    state, steps = drive(machine, "e")
    assert labels(steps[1]) == ["once"]
    assert state.leaf_configuration() == ("x",)


# -- history --------------------------------------------------------------------------


HISTORY = chart(
    f"""
    <state id="out">
      <transition event="shallow" target="hs"/>
      <transition event="deep" target="hd"/>
      <transition event="main" target="main"/>
    </state>
    <state id="main" initial="m1">
      <onentry>{log("enter main")}</onentry>
      <history id="hs" type="shallow">
        <transition target="m2">{log("shallow default")}</transition>
      </history>
      <history id="hd" type="deep">
        <transition target="m1b">{log("deep default")}</transition>
      </history>
      <state id="m1" initial="m1a">
        <state id="m1a"><transition event="next" target="m1b"/></state>
        <state id="m1b"/>
      </state>
      <state id="m2"><onentry>{log("enter m2")}</onentry></state>
      <transition event="leave" target="out"/>
      <transition event="to_m2" target="m2"/>
    </state>
    """,
    'initial="out"',
)


def test_shallow_history_without_a_record_takes_its_default_with_content() -> None:
    state, steps = drive(HISTORY, "shallow")
    assert state.leaf_configuration() == ("m2",)
    # The default's content runs right after the parent's onentry (Appendix D).
    assert labels(steps[1]) == ["enter main", "shallow default", "enter m2"]


def test_deep_history_without_a_record_takes_its_default() -> None:
    state, steps = drive(HISTORY, "deep")
    assert state.leaf_configuration() == ("m1b",)
    assert labels(steps[1]) == ["enter main", "deep default"]


def test_shallow_history_restores_the_child_and_its_default_descendants() -> None:
    state, steps = drive(HISTORY, "main", "next", "leave", "shallow")
    assert state.leaf_configuration() == ("m1a",)
    assert "shallow default" not in labels(steps[-1])


def test_deep_history_restores_the_leaves() -> None:
    state, steps = drive(HISTORY, "main", "next", "leave", "deep")
    assert state.leaf_configuration() == ("m1b",)
    assert labels(steps[-1]) == ["enter main"]


def test_history_records_the_last_exit() -> None:
    state, _ = drive(HISTORY, "main", "next", "leave", "deep", "to_m2", "leave", "deep")
    assert state.leaf_configuration() == ("m2",)
    state, _ = drive(HISTORY, "main", "to_m2", "leave", "shallow")
    assert state.leaf_configuration() == ("m2",)


def test_history_state_is_never_active() -> None:
    state, _ = drive(HISTORY, "main", "next", "leave", "deep")
    kinds = {HISTORY.states[index].kind for index in state.configuration}
    assert "history" not in kinds


def test_deep_history_in_parallel_restores_every_region() -> None:
    machine = chart(
        """
        <state id="out"><transition event="back" target="h"/></state>
        <state id="box">
          <history id="h" type="deep"><transition target="p"/></history>
          <parallel id="p">
            <state id="r1"><state id="r1a"><transition event="a" target="r1b"/></state>
              <state id="r1b"/></state>
            <state id="r2"><state id="r2a"><transition event="b" target="r2b"/></state>
              <state id="r2b"/></state>
          </parallel>
          <transition event="leave" target="out"/>
        </state>
        """,
        'initial="box"',
    )
    state, _ = drive(machine, "b", "leave", "back")
    assert state.leaf_configuration() == ("r1a", "r2b")


# -- completion -----------------------------------------------------------------------


def test_done_state_of_a_compound_state_carries_donedata() -> None:
    machine = chart(
        """
        <state id="c">
          <state id="c1"><transition event="finish" target="c2"/></state>
          <final id="c2"><donedata><param name="v" expr="40 + 2"/></donedata></final>
          <transition event="done.state.c" target="after">
            <log label="data" expr="_event.data.v"/>
          </transition>
        </state>
        <state id="after"/>
        """
    )
    state, steps = drive(machine, "finish")
    assert state.leaf_configuration() == ("after",)
    assert [(e.label, e.value) for e in steps[1] if isinstance(e, fx.Log)] == [("data", 42)]
    assert state.running


def test_done_state_of_a_parallel_follows_its_regions() -> None:
    machine = chart(
        """
        <datamodel><data id="seen" expr="[]"/></datamodel>
        <parallel id="p">
          <state id="r1"><state id="r1a"><transition event="a" target="r1f"/></state>
            <final id="r1f"/></state>
          <state id="r2"><state id="r2a"><transition event="b" target="r2f"/></state>
            <final id="r2f"/></state>
          <transition event="done.state.p" target="end"/>
          <transition event="done.state.*">
            <assign location="seen" expr="seen + [_event.name]"/>
          </transition>
        </parallel>
        <state id="end"/>
        """
    )
    state, _ = drive(machine, "a")
    assert state.datamodel["seen"] == ["done.state.r1"]
    assert state.leaf_configuration() == ("r1f", "r2a")
    state, _ = handle_event(state, Event("b"))
    # done.state.r2 is handled by the targetless transition first; done.state.p follows.
    assert state.datamodel["seen"] == ["done.state.r1", "done.state.r2"]
    assert state.leaf_configuration() == ("end",)


def test_top_level_final_gives_done_with_donedata_and_the_exit_configuration() -> None:
    machine = chart(
        """
        <datamodel><data id="total" expr="7"/></datamodel>
        <state id="a"><transition event="go" target="end"/></state>
        <final id="end">
          <donedata><param name="total" location="total"/><param name="ok" expr="true"/>
          </donedata>
        </final>
        """
    )
    state, steps = drive(machine, "go")
    done = [e for e in steps[1] if isinstance(e, fx.Done)]
    assert len(done) == 1
    assert done[0].donedata == {"total": 7, "ok": True}
    assert done[0].configuration == ("end",)
    assert not state.running
    assert state.configuration == frozenset()


def test_reaching_a_top_level_final_at_start_finishes_in_initialize() -> None:
    machine = chart('<final id="f"><donedata><content expr="[1, 2]"/></donedata></final>')
    state, effects = initialize(machine)
    assert not state.running
    done = [e for e in effects if isinstance(e, fx.Done)]
    assert [(d.donedata, d.configuration) for d in done] == [([1, 2], ("f",))]


def test_events_after_done_are_refused() -> None:
    machine = chart('<state id="a"><transition event="go" target="f"/></state><final id="f"/>')
    state, _ = drive(machine, "go")
    with pytest.raises(MachineNotRunning):
        handle_event(state, Event("go"))
    with pytest.raises(MachineNotRunning):
        macrostep(state)
    with pytest.raises(MachineNotRunning):
        microstep(state)
    with pytest.raises(MachineNotRunning):
        cancel(state)


def test_done_state_raised_during_initial_entry_is_handled_at_start() -> None:
    machine = chart(
        '<state id="c"><final id="cf"/><transition event="done.state.c" target="x"/></state>'
        '<state id="x"/>'
    )
    state, _ = initialize(machine)
    assert state.leaf_configuration() == ("x",)


def test_a_nested_final_does_not_finish_the_chart() -> None:
    machine = chart('<state id="a"><final id="af"/></state>')
    state, effects = initialize(machine)
    assert state.running
    assert state.leaf_configuration() == ("af",)
    assert not [e for e in effects if isinstance(e, fx.Done)]


# -- event descriptors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("descriptor", "event", "matches"),
    [
        ("foo", "foo", True),
        ("foo", "foo.bar", True),
        ("foo", "foo.bar.baz", True),
        ("foo", "foobar", False),
        ("foo.bar", "foo", False),
        ("foo.bar", "foo.bar.baz", True),
        ("foo.bar", "foo.baz", False),
        ("foo.*", "foo.bar", True),
        ("foo.*", "foo", True),
        ("foo.", "foo.bar", True),
        ("*", "anything.at.all", True),
        ("error", "error.execution", True),
        ("error", "errors.execution", False),
        ("a b", "b.c", True),
        ("a b", "c", False),
        ("f*o", "fxo", False),
    ],
)
def test_event_descriptor_matching(descriptor: str, event: str, matches: bool) -> None:
    machine = chart(
        f'<state id="a"><transition event="{descriptor}" target="b"/></state><state id="b"/>'
    )
    state, _ = drive(machine, event)
    assert state.leaf_configuration() == (("b",) if matches else ("a",))


# -- conditions -------------------------------------------------------------------------


@pytest.mark.parametrize("cond", ["undeclared", "1", "'true'", "null", "1 / 0", "x"])
def test_a_cond_that_is_not_true_disables_and_raises_error_execution(cond: str) -> None:
    machine = chart(
        f"""
        <datamodel><data id="x"/></datamodel>
        <state id="a">
          <transition event="go" cond="{cond}" target="wrong"/>
          <transition event="error.execution" target="err">
            <log label="element" expr="_event.data.element"/>
          </transition>
        </state>
        <state id="wrong"/><state id="err"/>
        """
    )
    state, steps = drive(machine, "go")
    assert state.leaf_configuration() == ("err",)
    values = [e.value for e in steps[1] if isinstance(e, fx.Log)]
    assert len(values) == 1
    assert isinstance(values[0], str)
    assert values[0].startswith("transition")


def test_a_false_cond_raises_nothing() -> None:
    machine = chart(
        '<state id="a"><transition event="go" cond="false" target="wrong"/>'
        '<transition event="error" target="err"/></state><state id="wrong"/><state id="err"/>'
    )
    state, _ = drive(machine, "go")
    assert state.leaf_configuration() == ("a",)
    assert state.internal_queue == ()


def test_in_predicate_sees_the_current_configuration() -> None:
    machine = chart(
        """
        <parallel id="p">
          <state id="r1"><state id="r1a"><transition event="e" cond="In('r2b')" target="r1b"/>
            </state><state id="r1b"/></state>
          <state id="r2"><state id="r2a"><transition event="f" target="r2b"/></state>
            <state id="r2b"/></state>
        </parallel>
        """
    )
    state, _ = drive(machine, "e")
    assert state.leaf_configuration() == ("r1a", "r2a")
    state, _ = drive(machine, "f", "e")
    assert state.leaf_configuration() == ("r1b", "r2b")


# -- the round budget -------------------------------------------------------------------


LIVELOCK = chart(
    """
    <datamodel><data id="n" expr="0"/></datamodel>
    <state id="spin">
      <transition target="spin"><assign location="n" expr="n + 1"/></transition>
      <transition event="stop" target="rest"/>
    </state>
    <state id="rest"/>
    """
)


def test_an_eventless_livelock_stops_at_the_round_budget() -> None:
    state, effects = initialize(LIVELOCK, StartOptions(round_budget=50))
    exhausted = [e for e in effects if isinstance(e, fx.BudgetExhausted)]
    assert len(exhausted) == 1
    assert exhausted[0].budget == 50
    assert exhausted[0].configuration == ("spin",)
    assert effects[-1] is exhausted[0]
    assert not [e for e in effects if isinstance(e, fx.Done)]
    assert state.running
    assert state.leaf_configuration() == ("spin",)
    assert state.datamodel["n"] == 50


def test_a_later_event_gets_a_fresh_budget() -> None:
    state, _ = initialize(LIVELOCK, StartOptions(round_budget=50))
    state, effects = handle_event(state, Event("poke"))
    assert [e.budget for e in effects if isinstance(e, fx.BudgetExhausted)] == [50]
    assert state.datamodel["n"] == 100
    state, effects = handle_event(state, Event("stop"))
    assert not [e for e in effects if isinstance(e, fx.BudgetExhausted)]
    assert state.leaf_configuration() == ("rest",)


def test_an_erroring_eventless_cond_livelock_is_bounded() -> None:
    machine = chart('<state id="a"><transition cond="nope" target="b"/></state><state id="b"/>')
    state, effects = initialize(machine, StartOptions(round_budget=20))
    exhausted = [e for e in effects if isinstance(e, fx.BudgetExhausted)]
    assert len(exhausted) == 1
    assert state.running
    assert exhausted[0].pending_internal_events == len(state.internal_queue)


def test_budget_exhaustion_reports_pending_internal_events() -> None:
    machine = chart(
        '<state id="a"><onentry><raise event="x"/><raise event="y"/><raise event="z"/>'
        "</onentry></state>"
    )
    state, effects = initialize(machine, StartOptions(round_budget=1))
    exhausted = [e for e in effects if isinstance(e, fx.BudgetExhausted)]
    assert [e.pending_internal_events for e in exhausted] == [2]
    assert [event.name for event in state.internal_queue] == ["y", "z"]
    state, effects = macrostep(state._replace(round_budget=None))
    assert state.internal_queue == ()
    assert not [e for e in effects if isinstance(e, fx.BudgetExhausted)]


# -- counters and identifiers -----------------------------------------------------------


COUNTED = chart(
    """
    <datamodel><data id="n" expr="0"/></datamodel>
    <state id="a">
      <onentry><raise event="r"/><log label="entered"/></onentry>
      <transition event="r" target="b"><assign location="n" expr="n + 1"/></transition>
    </state>
    <state id="b">
      <onentry><send event="s"/><send event="s" delay="1s"/></onentry>
      <transition event="go" target="c"><send event="t"/></transition>
    </state>
    <state id="c">
      <invoke type="scxml" src="child.scxml"/>
      <transition event="again" target="b"/>
    </state>
    """
)


def test_counters_are_stamped_and_monotone() -> None:
    state, steps = drive(COUNTED, "go", "again", "go", options=StartOptions(trace=True))
    stamps = [(e.macrostep, e.round, e.microstep) for step in steps for e in step]
    assert stamps == sorted(stamps)
    assert {e.macrostep for e in steps[0]} == {1}
    for number, step in enumerate(steps[1:], start=2):
        assert {e.macrostep for e in step} == {number}
    assert state.macrostep == 4
    # Initial entry is microstep 1; the raised event's transition is microstep 2.
    first = [e for e in steps[0] if isinstance(e, fx.Log)]
    assert (first[0].macrostep, first[0].microstep, first[0].round) == (1, 1, 0)
    change = [e for e in steps[0] if isinstance(e, fx.DatamodelChange) and e.path == ("n",)]
    assert (change[-1].microstep, change[-1].round) == (2, 1)


def test_generated_ids_come_from_counters() -> None:
    state, steps = drive(COUNTED, "go", "again", "go")
    sends = [e.send_id for step in steps for e in step if isinstance(e, fx.Send | fx.SendDelayed)]
    assert sends == ["send_1", "send_2", "send_3", "send_4", "send_5", "send_6"]
    ordinals = [e.ordinal for step in steps for e in step if isinstance(e, fx.SendDelayed)]
    assert ordinals == [1, 2]
    invokes = [e.invoke_id for step in steps for e in step if isinstance(e, fx.Invoke)]
    assert invokes == ["c.inv_1", "c.inv_2"]
    assert state.send_counter == 6
    assert state.invoke_counter == 2


def test_two_runs_are_identical() -> None:
    first = drive(COUNTED, "go", "again", "go", options=StartOptions(trace=True))
    second = drive(COUNTED, "go", "again", "go", options=StartOptions(trace=True))
    assert first == second


def test_the_session_id_comes_from_the_options() -> None:
    state, _ = initialize(COUNTED, StartOptions(session_id="s-42"))
    assert state.datamodel["_sessionid"] == "s-42"
    io = state.datamodel["_ioprocessors"]
    assert isinstance(io, dict)
    assert io["http://www.w3.org/TR/scxml/#SCXMLEventProcessor"] == {"location": "#_scxml_s-42"}


# -- purity ---------------------------------------------------------------------------


PURE = chart(
    """
    <datamodel>
      <data id="doc" expr="{a: {b: [1, 2]}, list: [1]}"/>
      <data id="items" expr="[]"/>
    </datamodel>
    <state id="a">
      <transition event="go" target="b">
        <assign location="doc.a.b[1]" expr="20"/>
        <assign location="doc.a.c.d" expr="'new'"/>
        <script>doc.list[3] = 4; fresh = 1</script>
        <foreach array="[1, 2, 3]" item="it" index="at">
          <assign location="items" expr="items + [it]"/>
        </foreach>
        <raise event="r"/>
      </transition>
    </state>
    <state id="b"><transition event="r" target="c"/></state>
    <state id="c"/>
    """
)


def test_handle_event_never_changes_its_input() -> None:
    state, _ = initialize(PURE)
    snapshot = copy.deepcopy(tuple(state)[1:])
    datamodel = state.datamodel
    after, _ = handle_event(state, Event("go", data={"x": [1]}))
    assert tuple(state)[1:] == snapshot
    assert state.datamodel is datamodel
    assert state.datamodel["doc"] == {"a": {"b": [1, 2]}, "list": [1]}
    assert after.datamodel["doc"] == {
        "a": {"b": [1, 20], "c": {"d": "new"}},
        "list": [1, UNDEFINED, UNDEFINED, 4],
    }
    assert after.datamodel["items"] == [1, 2, 3]
    assert after.leaf_configuration() == ("c",)
    again, _ = handle_event(state, Event("go", data={"x": [1]}))
    assert again == after


def test_stepping_functions_never_change_their_input() -> None:
    start, _ = initialize(PURE)
    state, _ = handle_event(start._replace(round_budget=0), Event("go"))
    assert state.internal_queue
    snapshot = copy.deepcopy(tuple(state)[1:])
    stepped, _, _ = microstep(state)
    drained, _ = macrostep(state._replace(round_budget=None))
    stopped, _ = cancel(state)
    assert tuple(state)[1:] == snapshot
    assert stepped != state
    assert drained.internal_queue == ()
    assert not stopped.running


def test_initialize_never_changes_the_start_options() -> None:
    given = {"items": [1, 2]}
    options = StartOptions(datamodel=given)
    state, _ = initialize(PURE, options)
    after, _ = handle_event(state, Event("go"))
    assert given == {"items": [1, 2]}
    assert after.datamodel["items"] == [1, 2, 1, 2, 3]


# -- step by step ---------------------------------------------------------------------


STEPPED = chart(
    f"""
    <datamodel><data id="n" expr="0"/></datamodel>
    <state id="a">
      <transition event="go" target="b"><raise event="one"/><raise event="two"/></transition>
    </state>
    <state id="b">{entry_exit("b")}
      <transition event="one" target="c"><assign location="n" expr="n + 1"/></transition>
    </state>
    <state id="c">{entry_exit("c")}
      <transition cond="n &lt; 3" target="c"><assign location="n" expr="n + 1"/></transition>
      <transition event="two" target="d"/>
    </state>
    <state id="d">{entry_exit("d")}</state>
    """
)


def test_microsteps_reach_the_same_result_as_handle_event() -> None:
    start, _ = initialize(STEPPED)
    whole, whole_effects = handle_event(start, Event("go"))
    state, effects = handle_event(start._replace(round_budget=0), Event("go"))
    assert isinstance(effects[-1], fx.BudgetExhausted)
    collected = effects[:-1]
    rounds = 0
    while True:
        state, step_effects, stable = microstep(state)
        collected += step_effects
        rounds += 1
        if stable:
            break
        assert rounds < 100
    assert rounds > 3
    # Stepping does no invoke pass: the states entered wait for the next macrostep's.
    assert state.states_to_invoke <= state.configuration
    settled = state._replace(round_budget=None, states_to_invoke=frozenset())
    assert settled == whole._replace(round_budget=None)
    assert collected == whole_effects
    assert whole.leaf_configuration() == ("d",)
    assert whole.datamodel["n"] == 3


def test_microstep_on_a_stable_state_reports_stable() -> None:
    state, _ = initialize(STEPPED)
    after, effects, stable = microstep(state)
    assert stable
    assert effects == []
    assert after.configuration == state.configuration


def test_microstep_into_a_top_level_final_finishes() -> None:
    machine = chart(
        '<state id="a"><onentry><raise event="end"/></onentry>'
        '<transition event="end" target="f"/></state><final id="f"/>'
    )
    state, effects = initialize(machine, StartOptions(round_budget=0))
    assert state.running
    assert [type(e) for e in effects] == [fx.DatamodelInit, fx.BudgetExhausted]
    state, effects, stable = microstep(state)
    assert not stable
    assert not state.running
    assert [(e.configuration) for e in effects if isinstance(e, fx.Done)] == [("f",)]


# -- cancel -----------------------------------------------------------------------------


def test_cancel_runs_onexit_in_exit_order_and_finishes_without_donedata() -> None:
    machine = chart(
        f"""
        <state id="outer">{entry_exit("outer")}
          <state id="inner">{entry_exit("inner")}
            <invoke id="job" type="scxml" src="x.scxml"/>
          </state>
        </state>
        """
    )
    state, _ = initialize(machine)
    done_state, effects = cancel(state)
    assert labels(effects) == ["exit inner", "exit outer"]
    assert [e.invoke_id for e in effects if isinstance(e, fx.CancelInvoke)] == ["job"]
    assert isinstance(effects[-1], fx.Done)
    assert effects[-1].donedata is UNDEFINED
    assert effects[-1].configuration == ("inner",)
    assert not done_state.running
    assert done_state.configuration == frozenset()
    assert state.running  # the input is untouched
    with pytest.raises(MachineNotRunning):
        handle_event(done_state, Event("x"))


# -- trace effects ----------------------------------------------------------------------


def test_trace_effects_only_when_asked() -> None:
    _, quiet = drive(COUNTED, "go")
    _, loud = drive(COUNTED, "go", options=StartOptions(trace=True))
    trace_kinds = {
        fx.TraceEventDequeued,
        fx.TraceTransitionsSelected,
        fx.TraceExitSet,
        fx.TraceEntrySet,
        fx.TraceContentExecuted,
        fx.TraceMacrostepStable,
        fx.TraceInvokePass,
        fx.TraceFinalizeAutoforward,
    }
    assert not [e for step in quiet for e in step if type(e) in trace_kinds]
    seen = {type(e) for step in loud for e in step}
    assert trace_kinds - {fx.TraceFinalizeAutoforward} <= seen
    assert {fx.TraceFinalizeAutoforward} <= seen
    core_loud = [[e for e in step if type(e) not in trace_kinds] for step in loud]
    assert core_loud == quiet


def test_trace_done_only_when_asked() -> None:
    machine = chart('<final id="f"/>')
    _, quiet = initialize(machine)
    _, loud = initialize(machine, StartOptions(trace=True))
    assert not [e for e in quiet if isinstance(e, fx.TraceDone)]
    assert [type(e) for e in loud if isinstance(e, fx.TraceDone | fx.Done)] == [
        fx.TraceDone,
        fx.Done,
    ]


def test_trace_entry_set_lists_indexes_in_document_order() -> None:
    state, effects = initialize(PARALLEL, StartOptions(trace=True))
    entry = [e for e in effects if isinstance(e, fx.TraceEntrySet)]
    ids = [[PARALLEL.states[i].id for i in e.states] for e in entry]
    assert ids == [[None, "p", "r1", "r1a", "r2", "r2a"]]
    assert sorted(entry[-1].configuration) == sorted(state.configuration)
