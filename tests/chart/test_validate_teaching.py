"""``statifier validate`` that teaches: undeclared reads, positions inside attributes,
"did you mean", one format, ``--strict`` and standard input (issue 17, item 2)."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from statifier.chart import compile_chart
from statifier.chart.validation import SYSTEM_VARIABLES, Finding, check
from statifier.cli import main

NS = "http://www.w3.org/2005/07/scxml"
LINE: re.Pattern[str] = re.compile(r"^(.+):(\d+):(\d+): (error|warning): (.+)$")


def scxml(body: str, initial: str = "a", datamodel: str = "") -> str:
    return f'<scxml xmlns="{NS}" initial="{initial}">\n{datamodel}{body}\n</scxml>'


def findings(source: str) -> list[tuple[str, int, int, str]]:
    return [(f.severity, f.line, f.column, f.message) for f in check(source)]


def locate(source: str, needle: str, within: int = 0) -> tuple[int, int]:
    """Line and column (1-based) of ``needle``'s ``within``-th character."""
    offset = source.index(needle) + within
    before = source[:offset]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main(list(argv), out)
    return status, out.getvalue()


# -- reads of undeclared datamodel roots ------------------------------------------------


def test_a_cond_reading_an_undeclared_variable_is_a_warning_placed_at_the_read() -> None:
    source = scxml(
        '<state id="a"><transition event="go" cond="count > 1 and cout &lt; 9" target="b"/>'
        '</state><final id="b"/>',
        datamodel='<datamodel><data id="count" expr="0"/></datamodel>\n',
    )
    line, column = locate(source, "cout")
    assert findings(source) == [
        (
            "warning",
            line,
            column,
            "<transition cond> reads 'cout', which no <data> declares; did you mean 'count'?",
        )
    ]
    compile_chart(source)  # a warning: the chart still compiles


def test_what_a_chart_may_read_without_a_data_element_is_not_flagged() -> None:
    # System variables, functions and In(), foreach variables and what a script
    # assigns are all readable; only "nope" is not.
    reads = " and ".join(f"{name} != 1" for name in sorted(SYSTEM_VARIABLES))
    source = scxml(
        f'<state id="a"><onentry>'
        f"<script>made = 1; if made > 0 {{ nested = 2 }}</script>"
        f'<foreach array="[1, 2]" item="it" index="ix">'
        f'<log expr="it + ix + made + nested + len([1]) + abs(-1)"/></foreach>'
        f'<if cond="In(\'a\') and {reads} and _event.name != 1"><log expr="1"/></if>'
        f'<log expr="Math.abs(-1)"/>'
        f'<log expr="nope"/>'
        f"</onentry></state>"
    )
    assert [(severity, message) for severity, _, _, message in findings(source)] == [
        ("warning", "<log expr> reads 'nope', which no <data> declares")
    ]


def test_every_kind_of_expression_is_read_for_undeclared_roots() -> None:
    source = scxml(
        '<state id="a"><onentry>'
        '<send eventexpr="e1" targetexpr="e2" delayexpr="e3" namelist="n1  n2">'
        '<param name="p" expr="e4"/><param name="q" location="e5"/></send>'
        '<assign location="w1[i1]" expr="e6"/>'
        "<script>s1 = e7</script>"
        '<foreach array="e8" item="x"/>'
        "</onentry></state>"
    )
    flagged = {
        message.split("'")[1]: (severity, message.split(" ")[1])
        for severity, _, _, message in findings(source)
    }
    assert flagged == {
        "e1": ("warning", "eventexpr>"),
        "e2": ("warning", "targetexpr>"),
        "e3": ("warning", "delayexpr>"),
        "n1": ("warning", "namelist>"),
        "n2": ("warning", "namelist>"),
        "e4": ("warning", "expr>"),
        "e5": ("warning", "location>"),
        "w1": ("warning", "location>"),
        "i1": ("warning", "location>"),
        "e6": ("warning", "expr>"),
        "e7": ("warning", "reads"),  # "<script> reads 'e7'"
        "e8": ("warning", "array>"),
    }
    [write] = [message for _, _, _, message in findings(source) if "w1" in message]
    assert write == "<assign location> writes 'w1', which no <data> declares"
    line, column = locate(source, "n1  n2", 4)
    assert ("warning", line, column) in [
        (s, ln, c) for s, ln, c, m in findings(source) if "n2" in m
    ]


def test_a_variable_read_twice_in_one_attribute_is_reported_once() -> None:
    source = scxml('<state id="a"><transition cond="x > 1 or x &lt; 0 or y" target="a"/></state>')
    assert [message.split("'")[1] for _, _, _, message in findings(source)] == ["x", "y"]


# -- broken expressions: errors, placed inside the attribute --------------------------------


def test_a_broken_assign_expr_is_an_error_even_though_the_chart_compiles() -> None:
    source = scxml(
        '<state id="a"><onentry><assign location="x" expr="x +"/></onentry></state>',
        datamodel='<datamodel><data id="x" expr="1"/></datamodel>\n',
    )
    machine = compile_chart(source)  # SCXML defers it: error.execution when reached
    assert len(machine.warnings) == 1
    line, column = locate(source, 'x +"', 3)  # the end of the expression
    assert findings(source) == [
        (
            "error",
            line,
            column,
            "<assign expr> does not parse: Expected an expression but found the end of the input",
        )
    ]


def test_a_broken_cond_is_placed_inside_the_attribute() -> None:
    source = scxml('<state id="a">\n  <transition event="go" cond="1 = = 2" target="a"/></state>')
    [(severity, line, column, message)] = findings(source)
    assert severity == "error"
    assert message.startswith("<transition cond> does not parse")
    assert (line, column) == locate(source, "= = 2")


def test_positions_count_an_entity_as_the_one_character_it_stands_for() -> None:
    source = scxml('<state id="a"><transition cond="1 &lt; 2 &amp;&amp; @" target="a"/></state>')
    [(_, line, column, _)] = findings(source)
    assert (line, column) == locate(source, "@")


def test_positions_follow_a_multi_line_attribute() -> None:
    source = scxml(
        '<state id="a">\n'
        '  <transition event="go"\n'
        '      cond="1 &lt; 2 and\n'
        '            3 &gt; @"\n'
        '      target="a"/>\n'
        "</state>"
    )
    [(_, line, column, _)] = findings(source)
    assert (line, column) == locate(source, "@")


def test_positions_follow_a_line_break_written_as_a_character_reference() -> None:
    # &#10; is a real line feed in the value: the expression's error is on its line 2.
    source = scxml('<state id="a"><transition cond="1 &lt; 2 and&#10;  @" target="a"/></state>')
    [(_, line, column, _)] = findings(source)
    assert (line, column) == locate(source, "@")


def test_positions_skip_other_attributes_even_with_quotes_and_brackets_inside() -> None:
    source = scxml(
        '<state id="a"><transition event=\'go\' target="a" cond=\'"cond=" > @\'/></state>'
    )
    [(_, line, column, _)] = findings(source)
    assert (line, column) == locate(source, "@")


def test_positions_inside_a_location_and_a_namelist_entry() -> None:
    source = scxml(
        '<state id="a"><onentry><assign location="  x[" expr="1"/>'
        '<send event="e" namelist="x  y["/></onentry></state>',
        datamodel='<datamodel><data id="x"/><data id="y"/></datamodel>\n',
    )
    assert [(severity, line, column) for severity, line, column, _ in findings(source)] == [
        ("error", *locate(source, 'x["', 2)),
        ("error", *locate(source, 'y["', 2)),
    ]


def test_positions_inside_a_script_body_with_cdata() -> None:
    source = scxml(
        '<state id="a"><onentry><script><![CDATA[\n'
        "  made = 1;\n"
        "  made = made < @\n"
        "]]></script></onentry></state>"
    )
    [(severity, line, column, message)] = findings(source)
    assert severity == "error"
    assert message.startswith("<script body> does not parse")
    assert (line, column) == locate(source, "@")


def test_positions_inside_a_script_body_with_entities() -> None:
    source = scxml('<state id="a"><onentry><script>\n  a = 1 &lt; 2 @</script></onentry></state>')
    [(_, line, column, _)] = findings(source)
    assert (line, column) == locate(source, "@")


def test_an_illegal_foreach_variable_is_an_error() -> None:
    source = scxml('<state id="a"><onentry><foreach array="[1]" item="1x"/></onentry></state>')
    assert [(severity, message) for severity, _, _, message in findings(source)] == [
        ("error", "illegal foreach variable '1x'")
    ]


# -- did you mean -----------------------------------------------------------------------------


def test_a_near_miss_target_suggests_the_state_id() -> None:
    source = scxml(
        '<state id="idle"><transition event="start" target="runing"/></state>'
        '<state id="running"/><state id="stopped"/>',
        initial="idle",
    )
    line, column = locate(source, "<transition")
    assert findings(source) == [
        ("error", line, column, "no state has the id 'runing'; did you mean 'running'?")
    ]


def test_a_target_near_no_id_suggests_nothing() -> None:
    source = scxml('<state id="idle"><transition target="zzzzzz"/></state>', initial="idle")
    [(_, _, _, message)] = findings(source)
    assert message == "no state has the id 'zzzzzz'"


def test_a_near_miss_initial_attribute_suggests_too() -> None:
    source = scxml('<state id="running"/>', initial="runnin")
    [(_, _, _, message)] = findings(source)
    assert message.endswith("did you mean 'running'?")


# -- the command: one format, exit statuses, --strict, standard input -------------------------


MIXED = scxml(
    '<state id="idle">\n'
    '  <transition event="start" cond="ready" target="runing"/>\n'
    '  <onentry><assign location="count" expr="count +"/></onentry>\n'
    "</state>\n"
    '<state id="running"/>',
    initial="idle",
    datamodel='<datamodel><data id="count" expr="0"/></datamodel>\n',
)

WARNED = scxml('<state id="a"><transition event="go" cond="ready" target="a"/></state>')


def test_every_finding_is_one_line_in_one_format(tmp_path: Path) -> None:
    path = tmp_path / "mixed.scxml"
    path.write_text(MIXED, encoding="utf-8")
    status, text = cli("validate", str(path))
    assert status == 1
    lines = text.splitlines()
    assert len(lines) == 3
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    # In source order: the target (placed at its <transition>), the read inside its
    # cond, then the assign.
    assert [(m.group(1), m.group(4)) for m in parsed if m] == [
        (str(path), "error"),
        (str(path), "warning"),
        (str(path), "error"),
    ]
    assert lines == [finding.format(str(path)) for finding in check(MIXED)]
    assert Finding("warning", "m", 3, 4).format("c.scxml") == "c.scxml:3:4: warning: m"


def test_warnings_alone_pass_and_strict_fails_them(tmp_path: Path) -> None:
    path = tmp_path / "warned.scxml"
    path.write_text(WARNED, encoding="utf-8")
    status, text = cli("validate", str(path))
    assert status == 0
    assert text.splitlines()[-1] == f"{path}: ok"
    status, strict = cli("validate", "--strict", str(path))
    assert status == 1
    assert strict.splitlines() == text.splitlines()[:-1]
    clean = tmp_path / "clean.scxml"
    clean.write_text(scxml('<state id="a"/>'), encoding="utf-8")
    assert cli("validate", "--strict", str(clean)) == (0, f"{clean}: ok\n")


def test_errors_exit_one_and_an_unreadable_file_two(tmp_path: Path) -> None:
    path = tmp_path / "mixed.scxml"
    path.write_text(MIXED, encoding="utf-8")
    assert cli("validate", str(path))[0] == 1
    assert cli("validate", str(path), str(tmp_path / "missing.scxml"))[0] == 2


def test_dash_reads_the_chart_from_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(WARNED.encode("utf-8"))))
    status, text = cli("validate", "-")
    assert status == 0
    line, column = locate(WARNED, "ready")
    assert text.splitlines() == [
        (
            f"<stdin>:{line}:{column}: warning: <transition cond> reads 'ready', which no <data> "
            "declares"
        ),
        "<stdin>: ok",
    ]


def test_dash_with_a_broken_document_names_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(f'<scxml xmlns="{NS}">\n<state id="a">'))
    status, text = cli("validate", "-")
    assert status == 1
    [line] = text.splitlines()
    found = LINE.match(line)
    assert found is not None
    assert (found.group(1), found.group(4)) == ("<stdin>", "error")
