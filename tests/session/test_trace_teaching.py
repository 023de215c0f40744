"""``statifier trace`` that teaches: raised ``error.*`` events and "no transition took
EVENT" by default, states named by id everywhere (issue 17, item 2)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from statifier.chart import compile_chart
from statifier.cli import main
from statifier.core import Event
from statifier.core.effects import Log, TraceEntrySet
from statifier.session.trace import ErrorRaised, NoTransition, effect_json, run, state_name

NS = "http://www.w3.org/2005/07/scxml"


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


def write(directory: Path, text: str, name: str = "chart.scxml") -> str:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def trace_json(*argv: str) -> dict[str, Any]:
    status, text = cli("trace", *argv, "--json")
    assert status == 0, text
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


FAILING = f"""<scxml xmlns="{NS}" initial="idle">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="idle">
    <transition event="go" target="running">
      <log label="going" expr="count"/>
      <assign location="count" expr="count / 0"/>
    </transition>
  </state>
  <state id="running">
    <onentry><send event="ping" target="#_nowhere"/></onentry>
    <transition event="stop" cond="cout > 1" target="idle"/>
    <transition event="other" target="idle"/>
  </state>
</scxml>
"""


def notice_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("  ! ")]


def test_errors_and_untaken_events_are_printed_without_trace(tmp_path: Path) -> None:
    path = write(tmp_path, FAILING)
    status, text = cli("trace", path, "--event", "go", "--event", "stop", "--event", "what")
    assert status == 0
    lines = text.splitlines()
    # No trace effects: only the notices are new.
    assert not [line for line in lines if line.startswith("  - trace_")]
    go = lines.index("event go  [t=0ms]")
    assert lines[go + 1 : go + 5] == [
        "  configuration: running",
        '  - log {"content_index": 0, "label": "going", "value": 0}',
        (
            '  ! error.execution {"column": 7, "element": "assign", "line": 6, '
            '"message": "Division by zero", "reason": "division_by_zero"}'
        ),
        (
            '  ! error.communication {"column": 14, "element": "send", "line": 10, '
            '"message": "no route to \'#_nowhere\'", "reason": "invalid", "sendid": "send_1"}'
        ),
    ]
    stop = lines.index("event stop  [t=0ms]")
    assert lines[stop + 1 : stop + 4] == [
        "  configuration: running",
        "  ! no transition took stop",
        (
            '  ! error.execution {"column": 5, "element": "transition:11:5", "line": 11, '
            '"message": "Undefined variable: cout", "reason": "unbound_variable"}'
        ),
    ]
    assert lines[-3:] == [
        "event what  [t=0ms]",
        "  configuration: running",
        "  ! no transition took what",
    ]


def test_taken_events_and_done_events_print_no_notice(tmp_path: Path) -> None:
    chart = f"""<scxml xmlns="{NS}" initial="work">
  <state id="work" initial="one">
    <state id="one"><transition event="next" target="two"/></state>
    <final id="two"/>
  </state>
</scxml>"""
    # Reaching "two" raises done.state.work, which nothing takes: no news.
    status, text = cli("trace", write(tmp_path, chart), "--event", "next")
    assert status == 0
    assert notice_lines(text) == []
    assert trace_json(write(tmp_path, chart), "--event", "next")["steps"][1]["notices"] == []


def test_a_raised_event_nothing_takes_is_noticed_from_the_internal_queue(tmp_path: Path) -> None:
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a"><transition event="go"><raise event="typo"/></transition></state>
</scxml>"""
    document = trace_json(write(tmp_path, chart), "--event", "go")
    assert document["steps"][1]["notices"] == [
        {"notice": "no_transition", "event": "typo", "queue": "internal", "before": 0}
    ]


def test_json_notices_carry_the_error_data_in_order(tmp_path: Path) -> None:
    document = trace_json(write(tmp_path, FAILING), "--event", "go", "--event", "stop")
    steps = document["steps"]
    assert all(step["notices"] == [] for step in steps[:1])
    go = steps[1]
    assert [effect["effect"] for effect in go["effects"]] == ["log"]
    assert go["notices"] == [
        {
            "notice": "error",
            "event": "error.execution",
            "data": {
                "element": "assign",
                "reason": "division_by_zero",
                "message": "Division by zero",
                "line": 6,
                "column": 7,
            },
            "sendid": None,
            "invokeid": None,
            "before": 1,
        },
        {
            "notice": "error",
            "event": "error.communication",
            "data": {
                "element": "send",
                "reason": "invalid",
                "message": "no route to '#_nowhere'",
                "line": 10,
                "column": 14,
            },
            "sendid": "send_1",
            "invokeid": None,
            "before": 1,
        },
    ]
    assert [notice["notice"] for notice in steps[2]["notices"]] == ["no_transition", "error"]
    assert steps[2]["notices"][1]["data"]["element"] == "transition:11:5"


def test_a_session_error_is_noticed_with_its_message(tmp_path: Path) -> None:
    # An invoked chart the session cannot load raises error.execution from the session,
    # with the invoke id and a message (the chart's own errors carry more fields).
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a"><invoke id="kid" type="scxml" src="missing.scxml"/></state>
</scxml>"""
    path = write(tmp_path, chart)
    document = trace_json(path)
    [notice] = [n for step in document["steps"] for n in step["notices"]]
    assert notice["event"] == "error.execution"
    assert notice["invokeid"] == "kid"
    assert notice["data"]["message"].startswith("cannot load 'missing.scxml'")
    status, text = cli("trace", path)
    assert status == 0
    [line] = notice_lines(text)
    assert line.startswith('  ! error.execution {"invokeid": "kid", "message": "cannot load')


# -- states by id ---------------------------------------------------------------------------


INVOKING = f"""<scxml xmlns="{NS}" initial="parent">
  <state id="parent">
    <invoke id="kid" type="scxml" autoforward="true">
      <content><scxml initial="c"><state id="c"/></scxml></content>
    </invoke>
    <transition event="leave" target="gone"/>
    <state>
      <onentry><log label="in" expr="1"/></onentry>
    </state>
  </state>
  <final id="gone"/>
</scxml>
"""


def _numbers_in(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [item for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return []


def test_trace_effects_name_states_by_id_never_by_index(tmp_path: Path) -> None:
    document = trace_json(
        write(tmp_path, INVOKING), "--event", "poke", "--event", "leave", "--trace"
    )
    effects = [effect for step in document["steps"] for effect in step["effects"]]
    kinds = {effect["effect"] for effect in effects}
    assert {"invoke", "cancel_invoke", "autoforward", "trace_entry_set", "trace_exit_set"} <= kinds
    for effect in effects:
        assert "state_index" not in effect
        for key in ("states", "configuration"):
            assert _numbers_in(effect.get(key)) == [], effect
        if effect["effect"] == "trace_transitions_selected":
            for transition in effect["transitions"]:
                assert set(transition) == {"source", "event", "targets", "line", "column"}
        if effect["effect"] == "trace_content_executed":
            kind, _, rest = effect["owner"].partition(":")
            if kind != "transition":  # transition:LINE:COLUMN; the others name a state
                assert not rest.partition(":")[0].isdigit(), effect
    [invoke] = [effect for effect in effects if effect["effect"] == "invoke"]
    assert invoke["state"] == "parent"
    [cancel] = [effect for effect in effects if effect["effect"] == "cancel_invoke"]
    assert cancel["state"] == "parent"
    entered = next(effect for effect in effects if effect["effect"] == "trace_entry_set")
    assert entered["states"] == ["<scxml>", "parent", "<state 7:5>"]
    selected = [
        transition
        for effect in effects
        if effect["effect"] == "trace_transitions_selected"
        for transition in effect["transitions"]
        if transition["event"] == "leave"
    ]
    assert selected == [
        {"source": "parent", "event": "leave", "targets": ["gone"], "line": 6, "column": 5}
    ]
    owners = {e["owner"] for e in effects if e["effect"] == "trace_content_executed"}
    assert "onentry:<state 7:5>:0" in owners


def test_text_output_names_states_by_id_too(tmp_path: Path) -> None:
    status, text = cli("trace", write(tmp_path, INVOKING), "--event", "leave", "--trace")
    assert status == 0
    payloads = [
        json.loads(line[4:].partition(" ")[2])
        for line in text.splitlines()
        if line.startswith("  - ")
    ]
    for payload in payloads:
        assert "state_index" not in payload
        for key in ("states", "configuration"):
            assert _numbers_in(payload.get(key)) == []


# -- the Python API -------------------------------------------------------------------------


def test_steps_carry_notices_whether_or_not_trace_effects_are_asked_for() -> None:
    machine = compile_chart(FAILING)
    for trace in (False, True):
        steps = run(machine, [Event("go"), Event("nothing")], trace=trace)
        go, nothing = steps[1], steps[2]
        assert [type(notice) for notice in go.notices] == [ErrorRaised, ErrorRaised]
        assert [notice.event.name for notice in go.notices if isinstance(notice, ErrorRaised)] == [
            "error.execution",
            "error.communication",
        ]
        assert nothing.notices == (
            NoTransition("nothing", queue="external", before=nothing.notices[0].before),
        )
        has_trace = any(type(effect).__name__.startswith("Trace") for effect in go.effects)
        assert has_trace is trace
        if not trace:
            assert [type(effect) for effect in go.effects] == [Log]
            assert go.notices[0].before == 1


def test_state_name_and_effect_json() -> None:
    machine = compile_chart(INVOKING)
    assert state_name(machine, 0) == "<scxml>"
    assert state_name(machine, machine.ids["parent"]) == "parent"
    anonymous = next(s.index for s in machine.states if s.id is None and s.index)
    assert state_name(machine, anonymous) == "<state 7:5>"
    effect = TraceEntrySet(
        states=(0, machine.ids["gone"]), configuration=(0,), macrostep=1, microstep=1, round=0
    )
    assert effect_json(machine, effect) == {
        "effect": "trace_entry_set",
        "states": ["<scxml>", "gone"],
        "configuration": ["<scxml>"],
        "macrostep": 1,
        "microstep": 1,
        "round": 0,
    }
