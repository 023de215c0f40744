"""Executable content, the datamodel and error.execution, through inline charts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, TypeVar

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.expr import UNDEFINED, Duration, Value
from statifier.expr.errors import LocationError
from statifier.expr.location import put

NS = "http://www.w3.org/2005/07/scxml"
T = TypeVar("T")

# A transition that reports every error.execution as a Log of its message and sendid.
REPORT = (
    '<transition event="error.execution">'
    '<log label="error" expr="[_event.data.message, _event.sendid]"/></transition>'
)


def chart(body: str, attrs: str = "") -> Machine:
    return compile_chart(f'<scxml xmlns="{NS}" {attrs}>{body}</scxml>')


def start(body: str, *events: str | Event) -> tuple[MachineState, list[fx.Effect]]:
    """Run the chart and the events; every effect, in order."""
    state, effects = initialize(chart(body))
    collected = list(effects)
    for event in events:
        state, effects = handle_event(state, Event(event) if isinstance(event, str) else event)
        collected += effects
    return state, collected


def logs(effects: Sequence[fx.Effect]) -> list[tuple[str | None, Value]]:
    return [(e.label, e.value) for e in effects if isinstance(e, fx.Log)]


def errors(effects: Sequence[fx.Effect]) -> list[Any]:
    """The [message, sendid] pairs logged by REPORT."""
    return [e.value for e in effects if isinstance(e, fx.Log) and e.label == "error"]


def data(state: MachineState) -> dict[str, Value]:
    return {k: v for k, v in state.datamodel.items() if not k.startswith("_")}


def of(kind: type[T], effects: Sequence[fx.Effect]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def fold(effects: Sequence[fx.Effect]) -> dict[str, Value]:
    """The datamodel rebuilt from DatamodelInit and DatamodelChange effects alone."""
    model: dict[str, Value] = {}
    for effect in effects:
        if isinstance(effect, fx.DatamodelInit):
            model = dict(effect.datamodel)
        elif isinstance(effect, fx.DatamodelChange):
            written = put(model, effect.path, effect.new_value)
            assert not isinstance(written, LocationError)
            model = written
    return model


# -- assign ---------------------------------------------------------------------------


def test_assign_to_an_undeclared_root_is_an_error_that_stops_the_block() -> None:
    state, effects = start(
        '<state id="a"><onentry><assign location="nope" expr="1"/><log label="skipped"/>'
        f'</onentry><onentry><log label="next block"/></onentry>{REPORT}</state>'
    )
    assert "nope" not in state.datamodel
    assert logs(effects)[0] == ("next block", UNDEFINED)
    assert [message for message, _ in errors(effects)] == ["nope is not declared in the datamodel"]


@pytest.mark.parametrize(
    "location", ["_sessionid", "_event", "_event.name", "_name", "_ioprocessors", "_x"]
)
def test_assign_to_a_system_variable_is_an_error(location: str) -> None:
    state, effects = start(
        f'<state id="a"><onentry><assign location="{location}" expr="1"/></onentry>{REPORT}</state>'
    )
    assert len(errors(effects)) == 1
    assert state.datamodel["_sessionid"] == "session"
    assert "_x" not in state.datamodel


def test_assign_creates_nested_containers_below_a_declared_root() -> None:
    state, effects = start(
        """
        <datamodel><data id="m"/><data id="l" expr="[]"/></datamodel>
        <state id="a"><onentry>
          <assign location="m.a.b" expr="1"/>
          <assign location="m.a['c']" expr="null"/>
          <assign location="l[2].k" expr="'v'"/>
        </onentry></state>
        """
    )
    assert data(state) == {
        "m": {"a": {"b": 1, "c": None}},
        "l": [UNDEFINED, UNDEFINED, {"k": "v"}],
    }
    changes = [
        (e.path, e.location, e.new_value, e.prior_value) for e in of(fx.DatamodelChange, effects)
    ]
    assert changes[2:] == [
        (("m", "a", "b"), "m.a.b", 1, UNDEFINED),
        (("m", "a", "c"), "m.a['c']", None, UNDEFINED),
        (("l", 2, "k"), "l[2].k", "v", UNDEFINED),
    ]


def test_assign_through_a_scalar_is_an_error() -> None:
    state, effects = start(
        f'<datamodel><data id="x" expr="1"/></datamodel><state id="a"><onentry>'
        f'<assign location="x.a" expr="2"/></onentry>{REPORT}</state>'
    )
    assert state.datamodel["x"] == 1
    assert len(errors(effects)) == 1


def test_assign_with_inline_content_and_without_expr() -> None:
    state, _ = start(
        """
        <datamodel><data id="a" expr="1"/><data id="b" expr="1"/></datamodel>
        <state id="s"><onentry>
          <assign location="a">[1, 2]</assign>
          <assign location="b"/>
        </onentry></state>
        """
    )
    assert data(state) == {"a": [1, 2], "b": UNDEFINED}


def test_assign_reports_prior_values() -> None:
    _, effects = start(
        '<datamodel><data id="x" expr="{k: 1}"/></datamodel><state id="a"><onentry>'
        '<assign location="x.k" expr="2"/><assign location="x" expr="3"/></onentry></state>'
    )
    changes = of(fx.DatamodelChange, effects)
    assert [(c.path, c.prior_value, c.new_value, c.content_index) for c in changes[1:]] == [
        (("x", "k"), 1, 2, 0),
        (("x",), {"k": 2}, 3, 1),
    ]


def test_a_deferred_assign_expression_raises_when_reached() -> None:
    machine = chart(
        f'<datamodel><data id="x" expr="1"/></datamodel><state id="a">'
        f'<transition event="go"><assign location="x" expr="x +"/></transition>{REPORT}</state>'
    )
    assert len(machine.warnings) == 1
    state, effects = initialize(machine)
    assert errors(effects) == []
    state, effects = handle_event(state, Event("go"))
    assert len(errors(effects)) == 1
    assert state.datamodel["x"] == 1


# -- data -----------------------------------------------------------------------------


def test_data_binding_emits_init_and_changes() -> None:
    state, effects = start(
        """
        <datamodel>
          <data id="a" expr="1 + 1"/>
          <data id="b">[1, 2, 3]</data>
          <data id="c">hello   there</data>
          <data id="d"/>
          <data id="e" expr="a * 10"/>
        </datamodel>
        <state id="s"/>
        """
    )
    init = of(fx.DatamodelInit, effects)
    assert len(init) == 1
    assert effects[0] is init[0]
    assert {k: v for k, v in init[0].datamodel.items() if not k.startswith("_")} == {
        "a": UNDEFINED,
        "b": UNDEFINED,
        "c": UNDEFINED,
        "d": UNDEFINED,
        "e": UNDEFINED,
    }
    # Inline text that is no literal is only trimmed (NOTES 3.5).
    assert data(state) == {"a": 2, "b": [1, 2, 3], "c": "hello   there", "d": UNDEFINED, "e": 20}
    assert [(c.path, c.data_index, c.content_index) for c in of(fx.DatamodelChange, effects)] == [
        (("a",), 0, None),
        (("b",), 1, None),
        (("c",), 2, None),
        (("d",), 3, None),
        (("e",), 4, None),
    ]


def test_a_failing_data_expression_leaves_undefined_and_raises() -> None:
    state, effects = start(
        f'<datamodel><data id="a" expr="missing + 1"/><data id="b" expr="1 +"/>'
        f'<data id="c" expr="3"/></datamodel><state id="s">{REPORT}</state>'
    )
    assert data(state) == {"a": UNDEFINED, "b": UNDEFINED, "c": 3}
    assert len(errors(effects)) == 2


def test_start_options_datamodel_overrides_top_level_data() -> None:
    machine = chart(
        '<datamodel><data id="a" expr="missing"/><data id="b" expr="2"/></datamodel>'
        f'<state id="s">{REPORT}</state>'
    )
    state, effects = initialize(machine, StartOptions(datamodel={"a": {"given": True}}))
    assert data(state) == {"a": {"given": True}, "b": 2}
    assert errors(effects) == []


def test_data_src_without_a_loader_raises_and_is_never_fetched() -> None:
    state, effects = start(
        f'<datamodel><data id="a" src="file:values.json"/></datamodel><state id="s">{REPORT}'
        "</state>"
    )
    assert state.datamodel["a"] is UNDEFINED
    assert len(errors(effects)) == 1


def test_late_binding_binds_a_state_data_on_first_entry() -> None:
    machine = chart(
        """
        <datamodel><data id="top" expr="1"/></datamodel>
        <state id="a"><transition event="go" target="b"/></state>
        <state id="b"><datamodel><data id="inner" expr="top + 1"/></datamodel>
          <transition event="back" target="a"/></state>
        """,
        'binding="late"',
    )
    state, effects = initialize(machine)
    assert data(state) == {"top": 1, "inner": UNDEFINED}
    state, effects = handle_event(state, Event("go"))
    assert data(state) == {"top": 1, "inner": 2}
    assert [c.data_index for c in of(fx.DatamodelChange, effects)] == [1]
    state, _ = handle_event(state, Event("back"))
    state, effects = handle_event(state, Event("go"))
    assert of(fx.DatamodelChange, effects) == []


# -- script ---------------------------------------------------------------------------


def test_script_may_create_new_roots() -> None:
    state, effects = start(
        '<datamodel><data id="x" expr="1"/></datamodel><state id="a"><onentry>'
        "<script>x = x + 1; fresh = [x]; fresh[1] = 'b'</script></onentry></state>"
    )
    assert data(state) == {"x": 2, "fresh": [2, "b"]}
    changes = of(fx.DatamodelChange, effects)[1:]
    assert [(c.path, c.prior_value, c.new_value) for c in changes] == [
        (("x",), 1, 2),
        (("fresh",), UNDEFINED, [2, "b"]),
    ]


def test_script_keeps_partial_writes_on_error_and_stops_the_block() -> None:
    state, effects = start(
        '<datamodel><data id="x" expr="1"/></datamodel><state id="a"><onentry>'
        "<script>x = 2; made = 3; y = missing + 1; z = 4</script><log label='skipped'/>"
        f"</onentry>{REPORT}</state>"
    )
    assert data(state) == {"x": 2, "made": 3}
    assert [label for label, _ in logs(effects)] == ["error"]


@pytest.mark.parametrize("program", ["_sessionid = 1", "_fresh = 1; kept = 2", "_event = 1"])
def test_script_cannot_write_system_variables(program: str) -> None:
    state, effects = start(
        f'<state id="a"><onentry><script>{program}</script></onentry>{REPORT}</state>'
    )
    assert len(errors(effects)) == 1
    assert "_fresh" not in state.datamodel
    assert state.datamodel["_sessionid"] == "session"


def test_global_script_runs_once_before_initial_entry() -> None:
    state, effects = start(
        """
        <datamodel><data id="n" expr="1"/></datamodel>
        <script>n = n * 10; g = 'global'</script>
        <state id="a"><onentry><log label="n" expr="[n, g]"/></onentry></state>
        """
    )
    assert logs(effects) == [("n", [10, "global"])]
    assert data(state) == {"n": 10, "g": "global"}


def test_a_deferred_script_body_raises_when_reached() -> None:
    state, effects = start(
        '<datamodel><data id="x" expr="1"/></datamodel><state id="a">'
        f'<transition event="go"><script>x = = 2</script></transition>{REPORT}</state>',
        "go",
    )
    assert state.datamodel["x"] == 1
    assert len(errors(effects)) == 1


def test_script_src_is_never_fetched_without_a_loader() -> None:
    _state, effects = start(
        f'<state id="a"><onentry><script src="file:s.txt"/></onentry>{REPORT}</state>'
    )
    assert len(errors(effects)) == 1


# -- foreach --------------------------------------------------------------------------


def test_foreach_binds_item_and_index() -> None:
    state, effects = start(
        """
        <datamodel><data id="acc" expr="[]"/></datamodel>
        <state id="a"><onentry>
          <foreach array="['x', 'y']" item="it" index="i">
            <assign location="acc" expr="acc + [[i, it]]"/>
          </foreach>
        </onentry></state>
        """
    )
    assert data(state) == {"acc": [[0, "x"], [1, "y"]], "it": "y", "i": 1}
    paths = [c.path for c in of(fx.DatamodelChange, effects)][1:]
    declarations = [("it",), ("i",)]  # undeclared item and index are declared first
    assert paths == [*declarations, ("it",), ("i",), ("acc",), ("it",), ("i",), ("acc",)]


def test_foreach_iterates_a_shallow_copy() -> None:
    state, _ = start(
        """
        <datamodel><data id="l" expr="[1, 2]"/><data id="n" expr="0"/></datamodel>
        <state id="a"><onentry>
          <foreach array="l" item="it"><assign location="l" expr="l + [it]"/>
            <assign location="n" expr="n + 1"/></foreach>
        </onentry></state>
        """
    )
    assert data(state)["n"] == 2
    assert data(state)["l"] == [1, 2, 1, 2]


@pytest.mark.parametrize("array", ["{a: 1}", "'text'", "3", "null"])
def test_foreach_over_a_non_list_is_an_error(array: str) -> None:
    _state, effects = start(
        f'<state id="a"><onentry><foreach array="{array}" item="it"><log label="body"/>'
        f'</foreach><log label="skipped"/></onentry>{REPORT}</state>'
    )
    assert [label for label, _ in logs(effects)] == ["error"]


def test_a_failing_foreach_body_stops_the_block_but_keeps_earlier_writes() -> None:
    state, effects = start(
        f"""
        <datamodel><data id="acc" expr="[]"/></datamodel>
        <state id="a"><onentry>
          <foreach array="[1, 2, 3]" item="it">
            <assign location="acc" expr="acc + [it]"/>
            <if cond="it == 2"><assign location="undeclared" expr="1"/></if>
          </foreach>
          <log label="skipped"/>
        </onentry>{REPORT}</state>
        """
    )
    assert data(state)["acc"] == [1, 2]
    assert [label for label, _ in logs(effects)] == ["error"]


def test_foreach_declares_item_and_index_even_for_an_empty_list() -> None:
    state, _ = start(
        '<state id="a"><onentry><foreach array="[]" item="it" index="i"/></onentry></state>'
    )
    assert data(state) == {"it": UNDEFINED, "i": UNDEFINED}


@pytest.mark.parametrize("item", ["_it", "1x", "a.b"])
def test_foreach_with_an_illegal_item_name_is_an_error(item: str) -> None:
    machine = chart(
        f'<state id="a"><onentry><foreach array="[1]" item="{item}"/></onentry>{REPORT}</state>'
    )
    _, effects = initialize(machine)
    assert len(errors(effects)) == 1


# -- if -------------------------------------------------------------------------------


def test_if_takes_the_first_true_branch() -> None:
    _, effects = start(
        """
        <datamodel><data id="x" expr="2"/></datamodel>
        <state id="a"><onentry>
          <if cond="x == 1"><log label="one"/>
          <elseif cond="x == 2"/><log label="two"/><log label="two again"/>
          <elseif cond="true"/><log label="other"/>
          <else/><log label="else"/>
          </if>
          <if cond="false"><log label="no"/><else/><log label="else branch"/></if>
        </onentry></state>
        """
    )
    assert [label for label, _ in logs(effects)] == ["two", "two again", "else branch"]


@pytest.mark.parametrize("cond", ["1", "'true'", "undefined", "null", "missing", "1 / 0"])
def test_a_non_boolean_if_cond_raises_but_the_block_continues(cond: str) -> None:
    _, effects = start(
        f'<state id="a"><onentry><if cond="{cond}"><log label="then"/><else/>'
        f'<log label="else"/></if><log label="after"/></onentry>{REPORT}</state>'
    )
    assert [label for label, _ in logs(effects)] == ["else", "after", "error"]


# -- log and raise --------------------------------------------------------------------


def test_log_effects_carry_label_value_and_content_index() -> None:
    _, effects = start(
        '<datamodel><data id="x" expr="{a: [1]}"/></datamodel><state id="a"><onentry>'
        '<log label="value" expr="x.a"/><log expr="#2024-01-15#"/><log label="bare"/>'
        "</onentry></state>"
    )
    found = of(fx.Log, effects)
    assert [(e.label, e.value, e.content_index) for e in found] == [
        ("value", [1], 0),
        (None, date(2024, 1, 15), 1),
        ("bare", UNDEFINED, 2),
    ]


def test_a_failing_log_expression_stops_the_block() -> None:
    _, effects = start(
        '<state id="a"><onentry><log label="bad" expr="missing"/><log label="skipped"/>'
        f"</onentry>{REPORT}</state>"
    )
    assert [label for label, _ in logs(effects)] == ["error"]


def test_raise_queues_an_internal_event() -> None:
    state, effects = start(
        """
        <state id="a">
          <onentry><raise event="hop"/></onentry>
          <transition event="hop" target="b"><log label="type" expr="_event.type"/></transition>
        </state>
        <state id="b"/>
        """
    )
    assert state.leaf_configuration() == ("b",)
    assert logs(effects) == [("type", "internal")]


# -- send -----------------------------------------------------------------------------


def test_send_without_delay_is_a_send_effect() -> None:
    _, effects = start('<state id="a"><onentry><send event="ping"/></onentry></state>')
    sends = of(fx.Send, effects)
    assert len(sends) == 1
    send = sends[0]
    assert (send.event, send.target, send.type, send.data, send.send_id, send.author_id) == (
        "ping",
        None,
        None,
        UNDEFINED,
        "send_1",
        False,
    )
    assert of(fx.SendDelayed, effects) == []


@pytest.mark.parametrize(
    ("attribute", "expected_ms"),
    [
        ('delay="1s"', 1000),
        ('delay=".5s"', 500),
        ('delay="1.5s"', 1500),
        ('delay="250ms"', 250),
        ('delay="2m"', 120_000),
        ('delay="1h"', 3_600_000),
        ("delayexpr=\"'3s'\"", 3000),
        ('delayexpr="2s"', 2000),
        ('delayexpr="d"', 1500),
        ("delayexpr=\"'.25s'\"", 250),
    ],
)
def test_send_with_delay_is_send_delayed(attribute: str, expected_ms: int) -> None:
    machine = chart(
        f'<datamodel><data id="d"/></datamodel><state id="a"><onentry>'
        f'<send event="later" {attribute}/></onentry></state>'
    )
    _, effects = initialize(
        machine, StartOptions(datamodel={"d": Duration(seconds=1, milliseconds=500)})
    )
    delayed = of(fx.SendDelayed, effects)
    assert [(e.event, e.delay_ms, e.ordinal, e.send_id) for e in delayed] == [
        ("later", expected_ms, 1, "send_1")
    ]
    assert of(fx.Send, effects) == []


@pytest.mark.parametrize("delay", ["soon", "-1s", "1x"])
def test_an_invalid_delay_is_an_error(delay: str) -> None:
    _, effects = start(
        f'<state id="a"><onentry><send event="e" delay="{delay}"/></onentry>{REPORT}</state>'
    )
    assert of(fx.SendDelayed, effects) == []
    assert of(fx.Send, effects) == []
    assert len(errors(effects)) == 1


def test_send_data_from_namelist_and_params() -> None:
    _, effects = start(
        """
        <datamodel><data id="x" expr="1"/><data id="y" expr="{k: 'v'}"/></datamodel>
        <state id="a"><onentry>
          <send event="e" namelist="x y"><param name="p" expr="x + 1"/>
            <param name="x" expr="'last wins'"/></send>
          <send event="e"><param name="loc" location="y.k"/></send>
        </onentry></state>
        """
    )
    assert [e.data for e in of(fx.Send, effects)] == [
        {"x": "last wins", "y": {"k": "v"}, "p": 2},
        {"loc": "v"},
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("<content>  hello   world </content>", "hello world"),
        ("<content>[1, 2]</content>", [1, 2]),
        ("<content>{a: 1}</content>", {"a": 1}),
        ("<content>42</content>", 42),
        ('<content expr="x + 1"/>', 2),
        ("<content/>", UNDEFINED),
    ],
)
def test_send_content_data(content: str, expected: Value) -> None:
    _, effects = start(
        '<datamodel><data id="x" expr="1"/></datamodel><state id="a"><onentry>'
        f'<send event="e">{content}</send></onentry></state>'
    )
    assert [e.data for e in of(fx.Send, effects)] == [expected]


def test_send_idlocation_stores_the_generated_id() -> None:
    state, effects = start(
        '<datamodel><data id="where"/></datamodel><state id="a"><onentry>'
        '<send event="e" idlocation="where"/><send event="f" id="mine"/></onentry></state>'
    )
    assert state.datamodel["where"] == "send_1"
    sends = of(fx.Send, effects)
    assert [(s.send_id, s.author_id) for s in sends] == [("send_1", True), ("mine", True)]
    change = of(fx.DatamodelChange, effects)[-1]
    assert (change.path, change.new_value, change.content_index) == (("where",), "send_1", 0)


def test_send_to_internal_goes_to_the_internal_queue() -> None:
    state, effects = start(
        """
        <state id="a">
          <onentry><send event="inner" target="#_internal"><param name="k" expr="1"/></send>
            <send event="tagged" id="t1" target="#_internal"/></onentry>
          <transition event="inner" target="b">
            <log label="inner" expr="[_event.type, _event.data, _event.sendid]"/></transition>
        </state>
        <state id="b"><transition event="tagged" target="c">
          <log label="tagged" expr="_event.sendid"/></transition></state>
        <state id="c"/>
        """
    )
    assert of(fx.Send, effects) == []
    assert state.leaf_configuration() == ("c",)
    assert logs(effects) == [("inner", ["internal", {"k": 1}, UNDEFINED]), ("tagged", "t1")]


@pytest.mark.parametrize("target", ["http://example.com/x", "somewhere", "#"])
def test_send_to_an_invalid_target_is_an_error_with_the_send_id(target: str) -> None:
    _, effects = start(
        f'<state id="a"><onentry><send event="e" target="{target}"/><log label="skipped"/>'
        f"</onentry>{REPORT}</state>"
    )
    assert of(fx.Send, effects) == []
    assert errors(effects) == [[f"invalid target {target!r}", "send_1"]]


def test_send_of_an_unsupported_type_is_an_error_with_the_send_id() -> None:
    state, effects = start(
        '<datamodel><data id="where"/></datamodel><state id="a"><onentry>'
        '<send event="e" type="http://example.com/carrier-pigeon" idlocation="where"/>'
        f"</onentry>{REPORT}</state>"
    )
    assert of(fx.Send, effects) == []
    assert errors(effects) == [
        ["unsupported send type 'http://example.com/carrier-pigeon'", "send_1"]
    ]
    assert state.datamodel["where"] == "send_1"


def test_send_types_named_in_the_options_are_accepted() -> None:
    machine = chart(
        '<state id="a"><onentry><send event="e" type="x-mail" target="someone"/></onentry></state>'
    )
    _, effects = initialize(machine, StartOptions(send_types=frozenset({"x-mail"})))
    assert [(s.type, s.target) for s in of(fx.Send, effects)] == [("x-mail", "someone")]


@pytest.mark.parametrize(
    "target", ["#_parent", "#_scxml_other-session", "#_child.inv_1", "_internal"]
)
def test_send_to_valid_targets(target: str) -> None:
    _, effects = start(
        f'<state id="a"><onentry><send event="e" target="{target}" delay="1s"/></onentry>'
        f"{REPORT}</state>"
    )
    assert [s.target for s in of(fx.SendDelayed, effects)] == [target]
    assert errors(effects) == []


def test_a_failing_send_argument_discards_the_message() -> None:
    _state, effects = start(
        f'<state id="a"><onentry><send event="e"><param name="p" expr="missing"/></send>'
        f"</onentry>{REPORT}</state>"
    )
    assert of(fx.Send, effects) == []
    assert len(errors(effects)) == 1


def test_send_eventexpr_and_targetexpr() -> None:
    _, effects = start(
        '<datamodel><data id="n" expr="\'dyn\'"/></datamodel><state id="a"><onentry>'
        "<send eventexpr=\"n + '.event'\" targetexpr=\"'#_parent'\"/></onentry></state>"
    )
    assert [(s.event, s.target) for s in of(fx.Send, effects)] == [("dyn.event", "#_parent")]


# -- cancel ---------------------------------------------------------------------------


def test_cancel_is_an_effect_with_an_ordinal_shared_with_delayed_sends() -> None:
    _, effects = start(
        '<datamodel><data id="which" expr="\'t\'"/></datamodel><state id="a"><onentry>'
        '<send id="t" event="e" delay="1s"/><cancel sendid="t"/>'
        "<cancel sendidexpr=\"which + '2'\"/></onentry></state>"
    )
    assert [(e.send_id, e.ordinal) for e in of(fx.SendDelayed, effects)] == [("t", 1)]
    assert [(e.send_id, e.ordinal) for e in of(fx.Cancel, effects)] == [("t", 2), ("t2", 3)]


# -- invoke ---------------------------------------------------------------------------


INVOKING = """
<datamodel><data id="got"/><data id="iid"/><data id="x" expr="5"/></datamodel>
<state id="w">
  <onentry><log label="enter w"/></onentry>
  <invoke type="scxml" src="child.scxml" idlocation="iid" autoforward="true">
    <param name="p" expr="x"/>
    <finalize><assign location="got" expr="_event.data"/></finalize>
  </invoke>
  <invoke id="fixed" type="http://www.w3.org/TR/scxml/"><content expr="[x]"/></invoke>
  <invoke><content><scxml xmlns="http://www.w3.org/2005/07/scxml"><final id="f"/></scxml>
  </content></invoke>
  <transition event="leave" target="v"/>
</state>
<state id="v"/>
"""


def test_invokes_start_at_the_end_of_the_macrostep_with_generated_ids() -> None:
    state, effects = start(INVOKING)
    invokes = of(fx.Invoke, effects)
    assert [(i.invoke_id, i.src, i.data, i.content, i.autoforward) for i in invokes] == [
        ("w.inv_1", "child.scxml", {"p": 5}, UNDEFINED, True),
        ("fixed", None, UNDEFINED, [5], False),
        (
            "w.inv_2",
            None,
            UNDEFINED,
            '<scxml xmlns="http://www.w3.org/2005/07/scxml"><final id="f"/></scxml>',
            False,
        ),
    ]
    assert [i.invoke_index for i in invokes] == [0, 1, 2]
    assert effects[-3:] == invokes
    assert state.datamodel["iid"] == "w.inv_1"
    assert sorted(state.invocations.values()) == ["fixed", "w.inv_1", "w.inv_2"]
    assert state.states_to_invoke == frozenset()


def test_invoke_ids_of_a_state_without_id_have_no_prefix() -> None:
    _, effects = start(
        '<state id="outer"><state><invoke type="scxml" src="a"/><invoke type="scxml" src="b"/>'
        "</state></state>"
    )
    assert [i.invoke_id for i in of(fx.Invoke, effects)] == ["inv_1", "inv_2"]


def test_exit_cancels_invocations() -> None:
    state, effects = start(INVOKING, "leave")
    cancelled = of(fx.CancelInvoke, effects)
    assert [c.invoke_id for c in cancelled] == ["w.inv_1", "fixed", "w.inv_2"]
    assert dict(state.invocations) == {}


def test_a_state_entered_and_left_in_one_macrostep_invokes_nothing() -> None:
    state, effects = start(
        '<state id="a"><invoke type="scxml" src="c.scxml"/><transition target="b"/></state>'
        '<state id="b"/>'
    )
    assert of(fx.Invoke, effects) == []
    assert of(fx.CancelInvoke, effects) == []
    assert state.invoke_counter == 0


def test_finalize_runs_for_the_matching_invokeid_and_autoforward_copies_the_event() -> None:
    event = Event("result", data={"v": 1}, invokeid="w.inv_1")
    state, effects = start(INVOKING, event, Event("other", invokeid="fixed"))
    assert state.datamodel["got"] == {"v": 1}
    forwarded = of(fx.Autoforward, effects)
    assert [(f.invoke_id, f.event) for f in forwarded] == [
        ("w.inv_1", event),
        ("w.inv_1", Event("other", invokeid="fixed")),
    ]


def test_finalize_sees_the_event_before_transitions_are_selected() -> None:
    state, _ = start(
        """
        <datamodel><data id="seen" expr="0"/></datamodel>
        <state id="w">
          <invoke id="child" type="scxml" src="c.scxml">
            <finalize><assign location="seen" expr="_event.data"/></finalize>
          </invoke>
          <transition event="answer" cond="seen == 7" target="done"/>
        </state>
        <state id="done"/>
        """,
        Event("answer", data=7, invokeid="child"),
    )
    assert state.leaf_configuration() == ("done",)


def test_an_empty_finalize_assigns_param_locations_from_the_event() -> None:
    state, _ = start(
        """
        <datamodel><data id="a"/><data id="b"/></datamodel>
        <state id="w">
          <invoke id="child" type="scxml" src="c.scxml" namelist="a">
            <param name="bee" location="b"/></invoke>
        </state>
        """,
        Event("reply", data={"a": 1, "bee": 2}, invokeid="child"),
    )
    assert data(state) == {"a": 1, "b": 2}


def test_an_unsupported_invoke_type_is_an_error() -> None:
    machine = chart(f'<state id="w"><invoke type="x-robot"/>{REPORT}</state>')
    _, effects = initialize(machine, StartOptions(invoke_types=frozenset({"x-human"})))
    assert of(fx.Invoke, effects) == []
    assert len(errors(effects)) == 1


# -- donedata -------------------------------------------------------------------------


def test_donedata_params_and_content() -> None:
    _, effects = start(
        """
        <datamodel><data id="x" expr="3"/></datamodel>
        <state id="c">
          <state id="c1"><transition event="a" target="c2"/><transition event="b" target="c3"/>
          </state>
          <final id="c2"><donedata><param name="x" location="x"/><param name="bad" expr="nope"/>
            <param name="y" expr="x * 2"/></donedata></final>
          <final id="c3"><donedata><content expr="[x]"/></donedata></final>
          <transition event="done.state.c"><log label="done" expr="_event.data"/></transition>
          <transition event="error.execution"><log label="error"/></transition>
        </state>
        """,
        "a",
    )
    # The failing param is left out; its error comes before the done event.
    assert [(label, value) for label, value in logs(effects)] == [
        ("error", UNDEFINED),
        ("done", {"x": 3, "y": 6}),
    ]


def test_donedata_content_failure_gives_no_data() -> None:
    machine = chart('<final id="f"><donedata><content expr="nope"/></donedata></final>')
    _, effects = initialize(machine)
    assert [d.donedata for d in of(fx.Done, effects)] == [UNDEFINED]


# -- clock and randomness ---------------------------------------------------------------


@pytest.mark.parametrize(
    "expr", ["Date.now()", "3d ago", "2h from now", "next 1d", "last 1w", "Math.random()"]
)
def test_charts_have_no_clock_and_no_randomness(expr: str) -> None:
    state, effects = start(
        f'<datamodel><data id="x" expr="0"/></datamodel><state id="a"><onentry>'
        f'<assign location="x" expr="{expr}"/></onentry>{REPORT}</state>'
    )
    assert state.datamodel["x"] == 0
    assert len(errors(effects)) == 1


def test_in_reads_the_configuration() -> None:
    _, effects = start(
        '<state id="a"><onentry><log label="a" expr="In(\'a\')"/><log label="b" expr="In(\'b\')"/>'
        '<log label="missing" expr="In(\'nowhere\')"/></onentry></state><state id="b"/>'
    )
    assert logs(effects) == [("a", True), ("b", False), ("missing", False)]


# -- the change stream ----------------------------------------------------------------


def test_datamodel_changes_rebuild_the_datamodel() -> None:
    state, effects = start(
        """
        <datamodel><data id="m" expr="{a: 1}"/><data id="l"/><data id="sid"/></datamodel>
        <state id="a">
          <onentry>
            <assign location="m.b.c" expr="[1]"/>
            <assign location="l[1]" expr="'x'"/>
            <script>m.a = 2; fresh = {k: true}</script>
            <foreach array="[3, 4]" item="it" index="i"><assign location="m.a" expr="it"/></foreach>
            <send event="e" idlocation="sid"/>
          </onentry>
          <transition event="go"><assign location="m.go" expr="_event.data"/></transition>
        </state>
        """,
        Event("go", data={"d": [1]}),
    )
    rebuilt = fold(effects)
    rebuilt.pop("_event")
    expected = dict(state.datamodel)
    expected.pop("_event")
    assert rebuilt == expected


def test_foreach_declarations_are_in_the_change_stream() -> None:
    # DatamodelChange reports <foreach> writes; declaring item and index (undefined, even
    # for an empty array: NOTES 3.6) is such a write, so the stream must still rebuild
    # the datamodel.
    state, effects = start(
        '<state id="a"><onentry><foreach array="[]" item="it" index="i"/></onentry></state>'
    )
    rebuilt = fold(effects)
    rebuilt.pop("_event")
    expected = dict(state.datamodel)
    expected.pop("_event")
    assert rebuilt == expected


@pytest.mark.parametrize(
    ("content", "element"),
    [
        ('<onentry><cancel sendidexpr="5"/></onentry>', "cancel"),
        ('<invoke type="scxml" srcexpr="5"/>', "invoke"),
        ('<invoke typeexpr="5"/>', "invoke"),
        ('<onentry><send event="e" targetexpr="5"/></onentry>', "send"),
    ],
)
def test_error_data_names_the_element_that_failed(content: str, element: str) -> None:
    # The error.execution data names the failing element ("element"), as every other
    # failure of that element does.
    _, effects = start(
        f'<state id="a">{content}<transition event="error.execution">'
        '<log label="element" expr="_event.data.element"/></transition></state>'
    )
    assert logs(effects) == [("element", element)]


def test_global_script_changes_name_the_script() -> None:
    # DatamodelChange: "Exactly one of content_index and data_index is set"; a global
    # script is executable content with an index of its own.
    machine = chart(
        '<datamodel><data id="n" expr="1"/></datamodel><script>n = 2</script><state id="a"/>'
    )
    _, effects = initialize(machine)
    change = of(fx.DatamodelChange, effects)[-1]
    assert (change.path, change.new_value) == (("n",), 2)
    assert (change.content_index, change.data_index) == (machine.scripts[0].index, None)
