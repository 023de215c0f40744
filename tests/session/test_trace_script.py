"""``statifier trace`` with a script: ``--advance`` between events, ``src`` files read
beside the chart (and nowhere else), and BasicHTTP on loopback with ``--basichttp``."""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.cli import main
from statifier.core import Event
from statifier.core.effects import Log
from statifier.session.basichttp import BASICHTTP
from statifier.session.trace import (
    MAX_SRC_BYTES,
    Advance,
    BesideChart,
    SrcRefused,
    refused_invokes,
    run,
)

NS = "http://www.w3.org/2005/07/scxml"


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


def trace_json(*argv: str) -> dict[str, Any]:
    status, text = cli("trace", *argv, "--json")
    assert status == 0, text
    document = json.loads(text)
    assert isinstance(document, dict)
    return document


def write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def scxml(body: str, initial: str = "a") -> str:
    return f'<scxml xmlns="{NS}" initial="{initial}">{body}</scxml>'


def timeline(document: dict[str, Any]) -> list[tuple[str | None, list[str]]]:
    return [(step["event"], step["configuration"]) for step in document["steps"]]


def logs(document: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (effect["label"], effect["value"])
        for step in document["steps"]
        for effect in step["effects"]
        if effect["effect"] == "log"
    ]


# -- --advance ------------------------------------------------------------------------------

# "go" arms a 5 s timer; "probe" logs where the chart is, so each probe shows whether
# the timer has fired by then.
DELAYED = scxml(
    '<datamodel><data id="fired" expr="false"/></datamodel>'
    '<state id="a">'
    '<transition event="go"><send event="tick" delay="5s"/></transition>'
    '<transition event="tick" target="b"><assign location="fired" expr="true"/></transition>'
    '<transition event="probe"><log label="probe" expr="fired"/></transition>'
    "</state>"
    '<state id="b"><transition event="probe"><log label="probe" expr="fired"/></transition>'
    '<transition event="stop" target="end"/></state>'
    '<final id="end"/>'
)


def test_advance_fires_a_delayed_send_only_once_enough_time_has_passed(tmp_path: Path) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    status, text = cli(
        "trace", path, "--event", "go", "--advance", "4s", "--event", "probe",
        "--advance", "999ms", "--event", "probe", "--advance", "1ms", "--event", "probe",
    )  # fmt: skip
    assert status == 0
    headings = [line for line in text.splitlines() if not line.startswith(" ")]
    assert headings == [
        "start  [t=0ms]",
        "event go  [t=0ms]",
        "event probe  [t=4000ms]",  # 4 s on: not yet
        "event probe  [t=4999ms]",  # still not
        "event tick  [t=5000ms]",  # due exactly at the end of the last span
        "event probe  [t=5000ms]",
    ]
    document = trace_json(
        path, "--event", "go", "--advance", "4s", "--event", "probe",
        "--advance", "1s", "--event", "probe",
    )  # fmt: skip
    assert timeline(document) == [
        (None, ["a"]),
        ("go", ["a"]),
        ("probe", ["a"]),
        ("tick", ["b"]),
        ("probe", ["b"]),
    ]
    assert logs(document) == [("probe", False), ("probe", True)]


def test_without_advance_events_arrive_at_once_and_timers_fire_afterwards(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    document = trace_json(path, "--event", "go", "--event", "probe")
    assert timeline(document) == [(None, ["a"]), ("go", ["a"]), ("probe", ["a"]), ("tick", ["b"])]
    assert logs(document) == [("probe", False)]


def test_timers_left_after_the_script_still_fire(tmp_path: Path) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    status, text = cli("trace", path, "--event", "go", "--advance", "2s", "--event", "probe")
    assert status == 0
    assert "event probe  [t=2000ms]" in text
    headings = [line for line in text.splitlines() if not line.startswith(" ")]
    assert headings[-1] == "event tick  [t=5000ms]"


def test_an_advance_with_nothing_due_moves_the_clock(tmp_path: Path) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    status, text = cli("trace", path, "--advance", "1m30s", "--event", "probe")
    assert status == 0
    assert "event probe  [t=90000ms]" in text.splitlines()


def test_an_advance_fires_every_timer_due_in_order_with_what_each_sets_off() -> None:
    # "a" arms t1 at 1 s and t3 at 3 s; t1 arms t2 for 1 s later (2 s) and sends itself
    # "echo" at once. A 3 s advance fires all of them, each followed by its echo.
    machine = compile_chart(
        scxml(
            '<state id="a">'
            '<onentry><send event="t1" delay="1s"/><send event="t3" delay="3s"/></onentry>'
            '<transition event="t1"><send event="t2" delay="1s"/><send event="echo"/></transition>'
            '<transition event="t3" target="done"/>'
            '</state><final id="done"/>'
        )
    )
    steps = run(machine, [Advance(3000), Event("late")])
    assert [(s.event, s.at_ms) for s in steps] == [
        (None, 0),
        ("t1", 1000),
        ("echo", 1000),
        ("t2", 2000),
        ("t3", 3000),
    ]
    assert steps[-1].finished


def test_advances_add_up() -> None:
    machine = compile_chart(DELAYED)
    script: list[Event | Advance] = [
        Event("go"),
        Advance(2500),
        Advance(2499),
        Event("probe"),
        Advance(1),
        Event("probe"),
    ]
    steps = run(machine, script)
    assert [(s.event, s.at_ms, s.configuration) for s in steps][-3:] == [
        ("probe", 4999, ("a",)),
        ("tick", 5000, ("b",)),
        ("probe", 5000, ("b",)),
    ]


def test_a_cancelled_timer_never_fires_during_an_advance() -> None:
    machine = compile_chart(
        scxml(
            '<state id="a"><onentry><send id="t" event="tick" delay="1s"/></onentry>'
            '<transition event="stop"><cancel sendid="t"/></transition>'
            '<transition event="tick" target="wrong"/></state><state id="wrong"/>'
        )
    )
    steps = run(machine, [Event("stop"), Advance(10_000), Event("after")])
    assert [(s.event, s.at_ms, s.configuration) for s in steps] == [
        (None, 0, ("a",)),
        ("stop", 0, ("a",)),
        ("after", 10_000, ("a",)),
    ]


def test_a_negative_advance_is_refused() -> None:
    with pytest.raises(ValueError, match="forward"):
        Advance(-1)


@pytest.mark.parametrize("duration", ["soon", "4", "-1s", "4 s", "", "PT4S", "1.0005s"])
def test_a_bad_duration_exits_two_with_one_line(
    tmp_path: Path, duration: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    assert cli("trace", path, "--event", "go", f"--advance={duration}") == (2, "")
    error = capsys.readouterr().err
    assert error.startswith("statifier trace: --advance needs a duration")
    assert repr(duration) in error
    assert error.count("\n") == 1


def test_the_script_keeps_the_order_of_the_options(tmp_path: Path) -> None:
    path = write(tmp_path, "delayed.scxml", DELAYED)
    document = trace_json(
        path, "--event", "go", "--advance", "5s", "--event", "probe", "--event", "stop"
    )
    assert [step["event"] for step in document["steps"]] == [None, "go", "tick", "probe", "stop"]
    assert document["finished"] is True
    assert set(document) == {"steps", "finished"}


# -- src beside the chart -------------------------------------------------------------------

CHILD = scxml(
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="a"><onentry><send target="#_parent" event="hello"/></onentry>'
    '<transition event="bye" target="end"/></state>'
    '<final id="end"><donedata><param name="n" expr="n"/></donedata></final>'
)


def parent_chart(src: str, attribute: str = "src") -> str:
    return scxml(
        f'<state id="a"><invoke id="kid" {attribute}="{src}"/>'
        '<transition event="hello"><send target="#_kid" event="bye"/></transition>'
        '<transition event="done.invoke.kid" target="end"/>'
        '<transition event="error.execution" target="failed">'
        '<log label="failed" expr="_event.data.message"/></transition>'
        '</state><final id="end"/><final id="failed"/>'
    )


def test_data_script_and_invoke_src_are_read_beside_the_chart(tmp_path: Path) -> None:
    write(tmp_path, "limit.json", '{"max": 3}')
    write(tmp_path, "lib/setup.expr", "doubled = limit.max * 2")
    write(tmp_path, "children/child.scxml", CHILD)
    chart = scxml(
        '<datamodel><data id="limit" src="limit.json"/><data id="doubled" expr="0"/>'
        "</datamodel>"
        '<state id="a"><onentry><script src="file:lib/setup.expr"/>'
        '<log label="doubled" expr="doubled"/></onentry>'
        '<invoke id="kid" src="children/child.scxml"/>'
        '<transition event="hello"><send target="#_kid" event="bye"/></transition>'
        '<transition event="done.invoke.kid" target="end"/></state><final id="end"/>'
    )
    path = write(tmp_path, "main.scxml", chart)
    document = trace_json(path)
    assert logs(document) == [("doubled", 6)]
    assert timeline(document) == [
        (None, ["a"]),
        ("hello", ["a"]),
        ("done.invoke.kid", ["end"]),
    ]
    assert document["finished"] is True


def test_file_uris_and_absolute_paths_inside_the_directory_are_read(tmp_path: Path) -> None:
    write(tmp_path, "values.json", "[1, 2]")
    write(tmp_path, "more values.json", "[3]")
    absolute = tmp_path.resolve() / "values.json"
    chart = scxml(
        f'<datamodel><data id="a1" src="{absolute.as_uri()}"/>'
        f'<data id="a2" src="{absolute}"/>'
        '<data id="a3" src="file://localhost' + absolute.as_posix() + '"/>'
        '<data id="a4" src="file:more%20values.json"/></datamodel>'
        '<state id="a"><onentry><log label="all" expr="a1 + a2 + a3 + a4"/></onentry></state>'
    )
    path = write(tmp_path, "main.scxml", chart)
    assert logs(trace_json(path)) == [("all", [1, 2, 1, 2, 1, 2, 3])]


def outside_file(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.json"
    secret.write_text('"secret"', encoding="utf-8")
    return secret


def refusals(tmp_path: Path) -> dict[str, str]:
    """Each kind of src that leaves the chart's directory, and what the error says."""
    secret = outside_file(tmp_path)
    inside = tmp_path / "charts"
    inside.mkdir()
    (inside / "link.json").symlink_to(secret)
    (inside / "sub").mkdir()
    return {
        "../secret.json": "leaves the chart's directory",
        "sub/../../secret.json": "leaves the chart's directory",
        str(secret): "leaves the chart's directory",
        secret.as_uri(): "leaves the chart's directory",
        "file:../secret.json": "leaves the chart's directory",
        "link.json": "a symbolic link leads out",
        "http://127.0.0.1:9/secret.json": "not http: URIs",
        "https://example.com/x.json": "not https: URIs",
        "file://elsewhere/secret.json": "names no host",
    }


@pytest.mark.parametrize("element", ["data", "script", "invoke"])
def test_a_src_leaving_the_directory_is_refused(
    tmp_path: Path, element: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for src, reason in refusals(tmp_path).items():
        if element == "data":
            body = f'<datamodel><data id="x" src="{src}"/></datamodel><state id="a"/>'
        elif element == "script":
            body = f'<state id="a"><onentry><script src="{src}"/></onentry></state>'
        else:
            body = f'<state id="a"><invoke src="{src}"/></state>'
        path = write(tmp_path / "charts", f"{element}.scxml", scxml(body))
        assert cli("trace", path) == (1, ""), src
        error = capsys.readouterr().err
        assert f"cannot load {src!r}" in error, error
        assert reason in error, error
        assert error.startswith(f"{path}:1:"), error
        assert '"secret"' not in error, error  # nothing was read


def test_a_srcexpr_leaving_the_directory_fails_the_invocation(tmp_path: Path) -> None:
    outside_file(tmp_path)
    charts = tmp_path / "charts"
    path = write(charts, "main.scxml", parent_chart("'../secret.json'", "srcexpr"))
    document = trace_json(path)
    assert timeline(document)[-1] == ("error.execution", ["failed"])
    [(_, message)] = logs(document)
    assert "cannot load '../secret.json'" in message
    assert "leaves the chart's directory" in message


def test_a_missing_invoke_src_fails_when_it_runs(tmp_path: Path) -> None:
    path = write(tmp_path, "main.scxml", parent_chart("nobody.scxml"))
    document = trace_json(path)
    assert timeline(document)[-1] == ("error.execution", ["failed"])
    [(_, message)] = logs(document)
    assert "cannot load 'nobody.scxml'" in message
    assert "No such file" in message


def test_a_src_over_the_limit_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "big.json", "1" * (MAX_SRC_BYTES + 1))
    write(tmp_path, "fits.json", "1" * MAX_SRC_BYTES)
    load = BesideChart(tmp_path)
    assert len(load("fits.json")) == MAX_SRC_BYTES
    with pytest.raises(SrcRefused, match=f"over {MAX_SRC_BYTES} bytes"):
        load("big.json")
    with pytest.raises(SrcRefused, match="over 10 bytes"):
        BesideChart(tmp_path, limit=10)("fits.json")


def test_what_is_not_a_readable_text_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    load = BesideChart(tmp_path)
    for src, reason in [
        ("binary.bin", "not UTF-8"),
        ("folder", "not a regular file"),
        ("pipe", "not a regular file"),
        ("", "empty"),
        ("missing.json", "No such file"),
        (".", "not a regular file"),
    ]:
        with pytest.raises(SrcRefused, match=reason):
            load(src)


def test_a_symbolic_link_that_stays_inside_is_followed(tmp_path: Path) -> None:
    write(tmp_path, "real/values.json", "[7]")
    (tmp_path / "values.json").symlink_to(tmp_path / "real" / "values.json")
    assert BesideChart(tmp_path)("values.json") == "[7]"


def test_the_directory_is_the_one_the_chart_is_named_in(tmp_path: Path) -> None:
    write(tmp_path, "elsewhere/chart.scxml", scxml('<state id="a"/>'))
    write(tmp_path, "here/limit.json", "3")
    (tmp_path / "here" / "chart.scxml").symlink_to(tmp_path / "elsewhere" / "chart.scxml")
    assert BesideChart.of(tmp_path / "here" / "chart.scxml")("limit.json") == "3"


def test_refused_invokes_names_only_refusals(tmp_path: Path) -> None:
    machine = compile_chart(
        scxml(
            '<state id="a"><invoke src="missing.scxml"/>'
            '<invoke src="../out.scxml"/><invoke srcexpr="\'../x\'"/></state>'
        )
    )
    [problem] = refused_invokes(machine, BesideChart(tmp_path))
    assert problem.startswith("1:")
    assert "cannot load '../out.scxml': the path leaves" in problem


# -- --basichttp ----------------------------------------------------------------------------

LOCATION = f"_ioprocessors['{BASICHTTP}'].location"

# Sends itself "ping" over BasicHTTP, to the location it is served at, and ends on it.
PINGS_ITSELF = scxml(
    '<state id="a"><onentry>'
    f'<send type="{BASICHTTP}" targetexpr="{LOCATION}" event="ping"><param name="n" expr="1"/>'
    "</send></onentry>"
    '<transition event="ping" cond="_event.origintype == \''
    + BASICHTTP
    + '\'" target="end"><log label="n" expr="_event.data.n"/></transition>'
    '<transition event="error.*" target="failed"/>'
    '</state><final id="end"/><final id="failed"/>'
)


def port_of(url: str) -> int:
    port = url.split(":")[2].split("/")[0]
    return int(port)


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_a_chart_sends_itself_a_basichttp_event_and_finishes(tmp_path: Path) -> None:
    path = write(tmp_path, "ping.scxml", PINGS_ITSELF)
    status, text = cli("trace", path, "--basichttp")
    assert status == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("serving BasicHTTP at http://127.0.0.1:")
    assert lines[0].endswith("/trace")
    assert "event ping  [t=0ms]" in lines
    assert "  configuration: end" in lines
    assert lines[-1] == "finished"
    assert refused(port_of(lines[0].removeprefix("serving BasicHTTP at ")))  # shut down


def test_basichttp_in_json_names_the_location(tmp_path: Path) -> None:
    path = write(tmp_path, "ping.scxml", PINGS_ITSELF)
    document = trace_json(path, "--basichttp")
    assert document["basichttp"].startswith("http://127.0.0.1:")
    assert timeline(document)[-1] == ("ping", ["end"])
    assert logs(document) == [("n", "1")]  # a form field arrives as a string
    assert document["finished"] is True
    assert refused(port_of(document["basichttp"]))


def test_basichttp_events_arrive_before_the_next_given_event(tmp_path: Path) -> None:
    chart = scxml(
        '<state id="a"><transition event="go">'
        f'<send type="basichttp" targetexpr="{LOCATION}" event="ping"/></transition>'
        '<transition event="ping" target="b"/></state>'
        '<state id="b"><transition event="next" target="end"/></state><final id="end"/>'
    )
    path = write(tmp_path, "ping.scxml", chart)
    document = trace_json(path, "--basichttp", "--event", "go", "--event", "next")
    assert [step["event"] for step in document["steps"]] == [None, "go", "ping", "next"]
    assert document["finished"] is True


def test_basichttp_sends_to_loopback_only() -> None:
    chart = compile_chart(
        scxml(
            '<state id="a"><onentry>'
            f'<send type="{BASICHTTP}" target="http://example.com/x" event="out"/></onentry>'
            '<transition event="error.communication" target="end">'
            '<log label="why" expr="_event.data.message"/></transition></state>'
            '<final id="end"/>'
        )
    )
    served: list[str] = []
    steps = run(chart, [], basichttp=True, serving=served.append)
    assert len(served) == 1
    assert steps[-1].finished
    assert steps[-1].configuration == ("end",)
    [why] = [effect.value for step in steps for effect in step.effects if isinstance(effect, Log)]
    assert (
        why == "statifier trace sends BasicHTTP events to loopback only, not 'http://example.com/x'"
    )
    assert refused(port_of(served[0]))


def test_without_basichttp_the_type_is_refused_as_today(tmp_path: Path) -> None:
    path = write(tmp_path, "ping.scxml", PINGS_ITSELF)
    document = trace_json(path)
    assert "basichttp" not in document
    assert timeline(document) == [(None, ["failed"])]  # error.execution, within the start


def test_basichttp_with_advance_and_a_delayed_send(tmp_path: Path) -> None:
    chart = scxml(
        '<state id="a"><onentry>'
        f'<send type="basichttp" targetexpr="{LOCATION}" event="ping" delay="2s"/></onentry>'
        '<transition event="ping" target="end"/><transition event="probe">'
        '<log label="probe" expr="1"/></transition></state><final id="end"/>'
    )
    path = write(tmp_path, "later.scxml", chart)
    document = trace_json(
        path, "--basichttp", "--advance", "1s", "--event", "probe", "--advance", "1s"
    )
    assert timeline(document) == [(None, ["a"]), ("probe", ["a"]), ("ping", ["end"])]
