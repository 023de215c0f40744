"""The chart subcommands of ``statifier``: validate, trace and graph."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from statifier.cli import main

NS = "http://www.w3.org/2005/07/scxml"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return str(path)


GOOD = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a"><transition event="go" target="b"/></state>
  <final id="b"/>
</scxml>
"""

BAD = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <transition event="go" target="nowhere"/>
  </state>
  <state id="a"/>
</scxml>
"""

WARNED = f"""<scxml xmlns="{NS}">
  <datamodel><data id="x" expr="1 +"/></datamodel>
  <state id="a"/>
</scxml>
"""

UNDECLARED = f"""<scxml xmlns="{NS}">
  <state id="a">
    <transition event="go" cond="ready" target="b"/>
  </state>
  <final id="b"/>
</scxml>
"""

TIMED = f"""<scxml xmlns="{NS}" initial="a">
  <datamodel><data id="x" expr="0"/></datamodel>
  <state id="a">
    <onentry><send event="timeout" delay="5s"/><send event="early" delay="1s"/></onentry>
    <transition event="go" target="b"><assign location="x" expr="_event.data.a"/></transition>
  </state>
  <state id="b">
    <transition event="early"><log label="early" expr="x"/></transition>
    <transition event="timeout" target="f"><log label="timeout" expr="x"/></transition>
  </state>
  <final id="f"/>
</scxml>
"""


# -- validate -------------------------------------------------------------------------------


def test_validate_ok(tmp_path: Path) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    assert run("validate", path) == (0, f"{path}: ok\n")


def test_validate_reports_every_problem_with_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.scxml", BAD)
    status, text = run("validate", path)
    assert status == 1
    lines = text.splitlines()
    assert lines == [
        f"{path}:3:5: error: no state has the id 'nowhere'",
        f"{path}:5:3: error: duplicate state id 'a'",
    ]


def test_validate_reports_xml_problems(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.scxml", f'<scxml xmlns="{NS}">\n<state id="a">\n</scxml>')
    status, text = run("validate", path)
    assert status == 1
    assert text.startswith(f"{path}:3:")
    assert ": error: " in text


def test_validate_reports_an_expression_deferred_to_run_time_as_an_error(tmp_path: Path) -> None:
    # The chart compiles (SCXML raises error.execution when the <data> is reached), but
    # an expression that does not parse can never work: validate fails the chart, and
    # places the failure inside the attribute, just past "1 +" (where the input ends).
    path = write(tmp_path, "warned.scxml", WARNED)
    status, text = run("validate", path)
    assert status == 1
    assert text.splitlines() == [
        (
            f"{path}:2:36: error: <data expr> does not parse: "
            "Expected an expression but found the end of the input"
        )
    ]


def test_validate_prints_warnings_and_still_passes(tmp_path: Path) -> None:
    path = write(tmp_path, "warned.scxml", UNDECLARED)
    status, text = run("validate", path)
    assert status == 0
    assert text.splitlines() == [
        f"{path}:3:34: warning: <transition cond> reads 'ready', which no <data> declares",
        f"{path}: ok",
    ]


def test_validate_unreadable_file_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.scxml")
    status, text = run("validate", missing)
    assert status == 2
    assert text == ""
    assert f"{missing}: cannot read" in capsys.readouterr().err


def test_validate_several_files_takes_the_worst_status(tmp_path: Path) -> None:
    good = write(tmp_path, "good.scxml", GOOD)
    bad = write(tmp_path, "bad.scxml", BAD)
    missing = str(tmp_path / "missing.scxml")
    status, text = run("validate", good, bad)
    assert status == 1
    assert text.splitlines()[0] == f"{good}: ok"
    assert run("validate", bad, missing, good)[0] == 2
    assert run("validate", missing, bad)[0] == 2


def test_validate_needs_a_chart() -> None:
    with pytest.raises(SystemExit) as caught:
        run("validate")
    assert caught.value.code == 2


# -- trace ----------------------------------------------------------------------------------


def trace_json(*argv: str) -> dict[str, Any]:
    status, text = run("trace", *argv, "--json")
    assert status == 0
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


def test_trace_json_shape(tmp_path: Path) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    document = trace_json(path, "--event", "go")
    assert set(document) == {"steps", "finished"}
    assert document["finished"] is True
    steps = document["steps"]
    assert [step["event"] for step in steps] == [None, "go"]
    for step in steps:
        assert set(step) == {"event", "configuration", "effects", "notices"}
        assert step["notices"] == []
        for effect in step["effects"]:
            assert isinstance(effect["effect"], str)
            assert {"macrostep", "microstep", "round"} <= set(effect)
    assert steps[0]["configuration"] == ["a"]
    # After finishing, the configuration shown is the one the chart finished in.
    assert steps[1]["configuration"] == ["b"]
    assert steps[1]["effects"][-1]["effect"] == "done"
    assert steps[1]["effects"][-1]["configuration"] == ["b"]


def test_trace_json_not_finished(tmp_path: Path) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    document = trace_json(path, "--event", "other")
    assert document["finished"] is False
    assert [step["configuration"] for step in document["steps"]] == [["a"], ["a"]]


def test_trace_event_data_reaches_the_chart_and_delays_fire_afterwards(tmp_path: Path) -> None:
    path = write(tmp_path, "timed.scxml", TIMED)
    document = trace_json(path, "--event", 'go={"a": 1}')
    steps = document["steps"]
    assert [(step["event"], step["configuration"]) for step in steps] == [
        (None, ["a"]),
        ("go", ["b"]),
        ("early", ["b"]),
        ("timeout", ["f"]),
    ]
    logs = [
        (effect["label"], effect["value"])
        for step in steps
        for effect in step["effects"]
        if effect["effect"] == "log"
    ]
    assert logs == [("early", 1), ("timeout", 1)]
    assert document["finished"] is True


def test_trace_tagged_event_data(tmp_path: Path) -> None:
    path = write(tmp_path, "timed.scxml", TIMED)
    document = trace_json(path, "--event", 'go={"a": {"$type": "date", "value": "2024-01-02"}}')
    changes = [
        effect
        for effect in document["steps"][1]["effects"]
        if effect["effect"] == "datamodel_change"
    ]
    assert changes[0]["new_value"] == {"$type": "date", "value": "2024-01-02"}


def test_trace_text_output(tmp_path: Path) -> None:
    path = write(tmp_path, "timed.scxml", TIMED)
    status, text = run("trace", path, "--event", 'go={"a": 7}')
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == "start  [t=0ms]"
    assert lines[1] == "  configuration: a"
    assert "event go  [t=0ms]" in lines
    assert "event early  [t=1000ms]" in lines
    assert "event timeout  [t=5000ms]" in lines
    assert '  - log {"content_index": 4, "label": "timeout", "value": 7}' in lines
    assert lines[-1] == "finished"
    effect_lines = [line for line in lines if line.startswith("  - ")]
    for line in effect_lines:
        kind, _, payload = line[4:].partition(" ")
        assert kind.islower()
        fields = json.loads(payload)
        assert "macrostep" not in fields


def test_trace_prints_an_untaken_error_once_with_no_warning_beside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <onentry><assign location="nosuch.x" expr="1"/></onentry>
    <transition event="go" target="b"/>
  </state>
  <final id="b"/>
</scxml>"""
    path = write(tmp_path, "untaken.scxml", chart)
    with caplog.at_level("WARNING"):
        status, text = run("trace", path, "--event", "go")
    assert status == 0
    errors = [line for line in text.splitlines() if line.startswith("  ! ")]
    assert len(errors) == 1
    assert errors[0].startswith("  ! error.execution ")
    assert "nosuch is not declared in the datamodel" in errors[0]
    assert caplog.records == []
    assert capsys.readouterr().err == ""


def test_trace_sends_to_itself_arrive_before_the_next_given_event(tmp_path: Path) -> None:
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <transition event="first"><send event="echo"/></transition>
    <transition event="echo" target="b"/>
    <transition event="second" target="wrong"/>
  </state>
  <state id="b"><transition event="second" target="c"/></state>
  <state id="c"/><state id="wrong"/>
</scxml>"""
    path = write(tmp_path, "echo.scxml", chart)
    steps = trace_json(path, "--event", "first", "--event", "second")["steps"]
    assert [(s["event"], s["configuration"]) for s in steps] == [
        (None, ["a"]),
        ("first", ["a"]),
        ("echo", ["b"]),
        ("second", ["c"]),
    ]


def test_trace_cancelled_delayed_sends_never_fire(tmp_path: Path) -> None:
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <onentry><send id="t" event="tick" delay="1s"/><send event="tock" delay="2s"/></onentry>
    <transition event="stop"><cancel sendid="t"/></transition>
    <transition event="tick" target="wrong"/>
    <transition event="tock" target="b"/>
  </state>
  <state id="b"/><state id="wrong"/>
</scxml>"""
    path = write(tmp_path, "cancel.scxml", chart)
    steps = trace_json(path, "--event", "stop")["steps"]
    assert [(s["event"], s["configuration"]) for s in steps] == [
        (None, ["a"]),
        ("stop", ["a"]),
        ("tock", ["b"]),
    ]


def test_trace_flag_adds_trace_effects(tmp_path: Path) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    plain = trace_json(path, "--event", "go")
    traced = trace_json(path, "--event", "go", "--trace")
    kinds = {e["effect"] for step in traced["steps"] for e in step["effects"]}
    assert {"trace_entry_set", "trace_exit_set", "trace_event_dequeued", "trace_done"} <= kinds
    plain_kinds = {e["effect"] for step in plain["steps"] for e in step["effects"]}
    assert not {kind for kind in plain_kinds if kind.startswith("trace_")}


def test_trace_of_an_invalid_chart_exits_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "bad.scxml", BAD)
    assert run("trace", path) == (1, "")
    assert f"{path}:3:5: no state has the id 'nowhere'" in capsys.readouterr().err


def test_an_invalid_chart_exits_one_whatever_its_path_says(tmp_path: Path) -> None:
    directory = tmp_path / "cannot read"
    directory.mkdir()
    path = write(directory, "bad.scxml", BAD)
    assert run("trace", path)[0] == 1
    assert run("graph", path)[0] == 1


def test_trace_of_a_missing_chart_exits_two(tmp_path: Path) -> None:
    assert run("trace", str(tmp_path / "missing.scxml"))[0] == 2


@pytest.mark.parametrize("event", ["go={not json", "=1", " "])
def test_trace_with_an_unusable_event_exits_two(
    tmp_path: Path, event: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    assert run("trace", path, "--event", event) == (2, "")
    assert "statifier trace:" in capsys.readouterr().err


# -- graph ----------------------------------------------------------------------------------


DIAGRAM = f"""<scxml xmlns="{NS}" initial="idle">
  <state id="idle"><transition event="start" target="work"/></state>
  <state id="work" initial="one">
    <history id="again" type="deep"><transition target="one"/></history>
    <state id="one"><transition event="next" target="two"/></state>
    <state id="two"/>
    <transition event="split" target="both"/>
  </state>
  <parallel id="both">
    <state id="left"><state id="l1"/></state>
    <state id="right"><state id="r1"><transition event="stop" target="over"/></state></state>
  </parallel>
  <final id="over"/>
</scxml>
"""


def test_graph_mermaid(tmp_path: Path) -> None:
    path = write(tmp_path, "diagram.scxml", DIAGRAM)
    status, text = run("graph", path)
    assert status == 0
    assert run("graph", path, "--format", "mermaid") == (status, text)
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "stateDiagram-v2"
    assert "[*] --> idle" in lines
    assert "state work {" in lines
    assert "state both {" in lines
    assert "--" in lines
    assert 'state "H*" as again' in lines
    assert "idle --> work : start" in lines
    assert "over --> [*]" in lines
    assert text.endswith("\n")


def test_graph_dot(tmp_path: Path) -> None:
    path = write(tmp_path, "diagram.scxml", DIAGRAM)
    status, text = run("graph", path, "--format", "dot")
    assert status == 0
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "digraph chart {"
    assert lines[-1] == "}"
    assert "subgraph cluster_work {" in lines
    assert "subgraph cluster_both {" in lines
    assert 'over [label="over", peripheries=2];' in lines
    assert 'again [label="H*", shape=circle];' in lines
    assert "start -> idle;" in lines


def test_graph_of_an_invalid_chart_exits_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "bad.scxml", BAD)
    assert run("graph", path) == (1, "")
    assert "nowhere" in capsys.readouterr().err


def test_graph_of_a_missing_chart_exits_two(tmp_path: Path) -> None:
    assert run("graph", str(tmp_path / "missing.scxml"), "--format", "dot")[0] == 2


def test_graph_rejects_an_unknown_format(tmp_path: Path) -> None:
    path = write(tmp_path, "good.scxml", GOOD)
    with pytest.raises(SystemExit) as caught:
        run("graph", path, "--format", "svg")
    assert caught.value.code == 2


def test_trace_delivers_a_delayed_send_to_the_internal_queue(tmp_path: Path) -> None:
    # SCXML 6.2.4: a send to #_internal goes to the session's own internal queue; with a
    # delay it goes there once the delay has passed. It is this session's event, not a
    # message for someone else, so the virtual clock must deliver it.
    chart = f"""<scxml xmlns="{NS}" initial="a">
  <state id="a">
    <onentry><send event="tick" target="#_internal" delay="1s"/></onentry>
    <transition event="tick" target="b"/>
  </state>
  <state id="b"/>
</scxml>"""
    path = write(tmp_path, "internal.scxml", chart)
    steps = trace_json(path)["steps"]
    assert steps[-1]["configuration"] == ["b"]
