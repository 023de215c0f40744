"""compile_chart and validate: located problems, deferred expressions, identity,
numbering and loaders."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from statifier.chart import InvalidChart, Machine, compile_chart, validate
from statifier.core import Event, handle_event, initialize
from statifier.core import effects as fx

NS = "http://www.w3.org/2005/07/scxml"


def document(body: str, attrs: str = "") -> str:
    return f'<scxml xmlns="{NS}" {attrs}>\n{body}\n</scxml>'


def locate(source: str, needle: str) -> tuple[int, int]:
    """Line and column (1-based) of the first occurrence of ``needle``."""
    offset = source.index(needle)
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return line, column


def problems_of(source: str | bytes) -> list[tuple[int, int, str]]:
    with pytest.raises(InvalidChart) as caught:
        compile_chart(source)
    found = [(p.line, p.column, p.message) for p in caught.value.problems]
    assert [(p.line, p.column, p.message) for p in validate(source)] == found
    return found


# -- one problem at a time ----------------------------------------------------------------


PROBLEMS = [
    ("unknown element", '<state id="a">\n  <bogus/>\n</state>', "<bogus", "not allowed"),
    (
        "unknown executable content",
        '<state id="a"><onentry>\n  <bogus/></onentry></state>',
        "<bogus",
        "not executable content",
    ),
    ("unknown attribute", '<state id="a" colour="red"/>', "<state", "colour"),
    (
        "unknown attribute on content",
        '<state id="a"><onentry><log expr="1" colour="red"/></onentry></state>',
        "<log",
        "colour",
    ),
    ("duplicate id", '<state id="a"/>\n<final id="a"/>', '<final id="a"', "duplicate"),
    ("invalid id", '<state id="a b"/>', "<state", "invalid state id"),
    (
        "unknown target",
        '<state id="a">\n  <transition event="e" target="zz"/>\n</state>',
        "<transition",
        "'zz'",
    ),
    ("unknown initial attribute target", '<state id="a"/>', None, "'nope'"),
    (
        "initial not a descendant",
        '<state id="a" initial="b"><state id="a1"/></state>\n<state id="b"/>',
        '<state id="a"',
        "descendant",
    ),
    (
        "initial element not a descendant",
        (
            '<state id="a"><initial>\n<transition target="b"/></initial><state id="a1"/></state>'
            '<state id="b"/>'
        ),
        "<transition",
        "descendant",
    ),
    (
        "initial attribute and element",
        (
            '<state id="a" initial="a1">\n  <initial><transition target="a1"/></initial>'
            '<state id="a1"/></state>'
        ),
        "<initial>",
        "both",
    ),
    (
        "initial on an atomic state",
        '<state id="a" initial="b"/><state id="b"/>',
        '<state id="a"',
        "atomic",
    ),
    (
        "initial with two transitions",
        (
            '<state id="a"><initial><transition target="a1"/><transition target="a1"/></initial>'
            '<state id="a1"/></state>'
        ),
        "<initial>",
        "exactly one",
    ),
    (
        "initial transition with an event",
        (
            '<state id="a"><initial><transition event="e" target="a1"/></initial>'
            '<state id="a1"/></state>'
        ),
        "<transition",
        "no event or cond",
    ),
    (
        "history without a transition",
        '<state id="a">\n  <history id="h"/><state id="a1"/></state>',
        "<history",
        "exactly one",
    ),
    (
        "history with two transitions",
        (
            '<state id="a"><history id="h"><transition target="a1"/><transition target="a1"/>'
            '</history><state id="a1"/></state>'
        ),
        "<history",
        "exactly one",
    ),
    (
        "history default with a cond",
        (
            '<state id="a"><history id="h"><transition cond="true" target="a1"/></history>'
            '<state id="a1"/></state>'
        ),
        "<transition",
        "no event or cond",
    ),
    (
        "history type",
        (
            '<state id="a"><history id="h" type="medium"><transition target="a1"/></history>'
            '<state id="a1"/></state>'
        ),
        "<history",
        "'medium'",
    ),
    (
        "history under scxml",
        '<history id="h"><transition target="a"/></history><state id="a"/>',
        "<history",
        "cannot be a child",
    ),
    (
        "transition type",
        '<state id="a">\n  <transition event="e" type="sideways" target="a"/></state>',
        "<transition",
        "'sideways'",
    ),
    (
        "empty event attribute",
        '<state id="a"><transition event=" " target="a"/></state>',
        "<transition",
        "names no event",
    ),
    (
        "bad cond",
        '<state id="a">\n  <transition event="e" cond="1 +" target="a"/></state>',
        "<transition",
        "<transition cond> does not parse",
    ),
    (
        "bad elseif cond",
        '<state id="a"><onentry><if cond="true"><elseif cond="(("/></if></onentry></state>',
        "<elseif",
        "<elseif cond> does not parse",
    ),
    (
        "bad log expr",
        '<state id="a"><onentry>\n<log expr="(("/></onentry></state>',
        "<log",
        "<log expr> does not parse",
    ),
    (
        "bad foreach array",
        '<state id="a"><onentry><foreach array="[1," item="x"/></onentry></state>',
        "<foreach",
        "<foreach array> does not parse",
    ),
    (
        "bad content expr",
        '<state id="a"><onentry><send event="e"><content expr="{"/></send></onentry></state>',
        "<content",
        "<content expr> does not parse",
    ),
    (
        "bad param expr",
        (
            '<state id="a"><onentry><send event="e"><param name="p" expr="(("/></send>'
            "</onentry></state>"
        ),
        "<param",
        "<param expr> does not parse",
    ),
    ("raise without event", '<state id="a"><onentry><raise/></onentry></state>', "<raise", "event"),
    ("if without cond", '<state id="a"><onentry><if/></onentry></state>', "<if", "cond"),
    (
        "elseif after else",
        (
            '<state id="a"><onentry><if cond="true"><else/><elseif cond="true"/></if></onentry>'
            "</state>"
        ),
        "<elseif",
        "after <else>",
    ),
    (
        "send event and eventexpr",
        '<state id="a"><onentry><send event="e" eventexpr="\'e\'"/></onentry></state>',
        "<send",
        "only one of",
    ),
    ("send without event", '<state id="a"><onentry><send/></onentry></state>', "<send", "needs"),
    (
        "send content and params",
        (
            '<state id="a"><onentry><send event="e"><content>x</content>'
            '<param name="p" expr="1"/></send></onentry></state>'
        ),
        "<send",
        "not both",
    ),
    (
        "foreach without item",
        '<state id="a"><onentry><foreach array="[1]"/></onentry></state>',
        "<foreach",
        "item",
    ),
    (
        "cancel without sendid",
        '<state id="a"><onentry><cancel/></onentry></state>',
        "<cancel",
        "sendid",
    ),
    (
        "assign without location",
        '<state id="a"><onentry><assign expr="1"/></onentry></state>',
        "<assign",
        "location",
    ),
    ("data without id", "<datamodel><data/></datamodel>", "<data/", "id"),
    (
        "data with expr and body",
        '<datamodel><data id="x" expr="1">2</data></datamodel>',
        "<data ",
        "only one",
    ),
    (
        "donedata with content and params",
        '<final id="f"><donedata><content>1</content><param name="p" expr="1"/></donedata></final>',
        "<donedata",
        "not both",
    ),
    (
        "autoforward",
        '<state id="a"><invoke type="scxml" src="x" autoforward="yes"/></state>',
        "<invoke",
        "'yes'",
    ),
    (
        "state inside final",
        '<final id="f"><state id="x"/></final>',
        '<state id="x"',
        "not allowed inside <final>",
    ),
    (
        "initial on parallel",
        '<parallel id="p" initial="x"><state id="x"/></parallel>',
        "<parallel",
        "initial",
    ),
]


@pytest.mark.parametrize(
    ("body", "needle", "fragment"),
    [case[1:] for case in PROBLEMS],
    ids=[case[0] for case in PROBLEMS],
)
def test_each_problem_is_reported_with_its_location(
    body: str, needle: str | None, fragment: str
) -> None:
    attrs = 'initial="nope"' if needle is None else ""
    source = document(body, attrs)
    found = problems_of(source)
    assert len(found) == 1, found
    line, column, message = found[0]
    assert fragment in message
    assert (line, column) == (locate(source, needle) if needle else (1, 1))


@pytest.mark.parametrize(
    ("attrs", "fragment"),
    [
        ('datamodel="xpath"', "unknown datamodel"),
        ('binding="lazy"', "'lazy'"),
        ('version="2.0"', "'2.0'"),
        ('colour="red"', "colour"),
    ],
)
def test_root_attribute_problems(attrs: str, fragment: str) -> None:
    found = problems_of(document('<state id="a"/>', attrs))
    assert [(line, column) for line, column, _ in found] == [(1, 1)]
    assert fragment in found[0][2]


def test_the_root_must_be_scxml_in_its_namespace() -> None:
    assert len(problems_of('<scxml><state id="a"/></scxml>')) == 1
    assert len(problems_of(f'<chart xmlns="{NS}"/>')) == 1


def test_foreign_namespace_elements_and_attributes_are_ignored() -> None:
    machine = compile_chart(
        document(
            '<state id="a" xmlns:x="urn:x" x:note="hi"><x:anything><x:deeper/></x:anything>'
            '<onentry><x:ext/><log label="l"/></onentry></state>'
        )
    )
    assert [state.id for state in machine.states] == [None, "a"]
    assert len(machine.states[1].onentry[0]) == 1


# -- several problems -----------------------------------------------------------------------


def test_several_problems_are_reported_at_once_in_line_order() -> None:
    source = document(
        """<state id="a">
  <transition event="e" target="nowhere"/>
  <transition event="e" cond="((" target="a"/>
</state>
<state id="a"/>
<state id="b" colour="red">
  <bogus/>
</state>"""
    )
    found = problems_of(source)
    assert [(line, column) for line, column, _ in found] == [
        locate(source, '<transition event="e" target="nowhere"'),
        locate(source, '<transition event="e" cond'),
        locate(source, '<state id="a"/>'),
        locate(source, '<state id="b"'),
        locate(source, "<bogus"),
    ]
    assert found == sorted(found)
    with pytest.raises(InvalidChart) as caught:
        compile_chart(source)
    assert str(caught.value).splitlines()[0].startswith(f"{found[0][0]}:{found[0][1]}: ")


def test_validate_is_empty_for_a_good_chart() -> None:
    assert validate(document('<state id="a"/>')) == ()


# -- datamodels and deferred expressions ----------------------------------------------------


def test_ecmascript_datamodel_is_accepted() -> None:
    machine = compile_chart(document('<state id="a"/>', 'datamodel="ecmascript"'))
    assert machine.datamodel == "ecmascript"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (
            (
                '<datamodel><data id="x"/></datamodel><state id="a"><onentry>'
                '<assign location="x" expr="1 +"/></onentry></state>'
            ),
            "<assign",
        ),
        ('<datamodel><data id="x" expr="1 +"/></datamodel><state id="a"/>', "<data "),
        ('<state id="a"><onentry><script>x = = 1</script></onentry></state>', "<script"),
    ],
)
def test_ecmascript_rejects_every_malformed_expression(body: str, needle: str) -> None:
    source = document(body, 'datamodel="ecmascript"')
    found = problems_of(source)
    assert [(line, column) for line, column, _ in found] == [locate(source, needle)]
    assert "does not parse" in found[0][2]


def test_null_datamodel_refuses_data() -> None:
    found = problems_of(
        document('<datamodel><data id="x"/></datamodel><state id="a"/>', 'datamodel="null"')
    )
    assert len(found) == 1
    assert "null" in found[0][2]
    assert compile_chart(document('<state id="a"/>', 'datamodel="null"')).datamodel == "null"


@pytest.mark.parametrize(
    ("body", "needle", "element"),
    [
        (
            (
                '<datamodel><data id="x" expr="1"/></datamodel><state id="a">'
                '<transition event="go"><assign location="x" expr="1 +"/></transition>'
            ),
            "<assign",
            "assign",
        ),
        (
            (
                '<datamodel><data id="x" expr="1 +"/></datamodel><state id="a">'
                '<transition event="go"><log label="no-op"/></transition>'
            ),
            "<data ",
            "data",
        ),
        (
            (
                '<datamodel><data id="x" expr="1"/></datamodel><state id="a">'
                '<transition event="go"><script>x = = 2</script></transition>'
            ),
            "<script",
            "script",
        ),
    ],
)
def test_deferred_expressions_compile_with_a_warning_and_fail_when_reached(
    body: str, needle: str, element: str
) -> None:
    source = document(
        body + '<transition event="error.execution" target="failed">'
        '<log label="element" expr="_event.data.element"/></transition></state>'
        '<state id="failed"/>'
    )
    machine = compile_chart(source)
    line, column = locate(source, needle)
    assert len(machine.warnings) == 1
    assert machine.warnings[0].startswith(f"{line}:{column}: ")
    assert "does not parse" in machine.warnings[0]
    state, effects = initialize(machine)
    if element == "data":
        assert state.leaf_configuration() == ("failed",)
        assert [e.value for e in effects if isinstance(e, fx.Log)] == ["data"]
        return
    assert state.leaf_configuration() == ("a",)
    state, effects = handle_event(state, Event("go"))
    assert state.leaf_configuration() == ("failed",)
    assert [e.value for e in effects if isinstance(e, fx.Log)] == [element]


# -- identity ---------------------------------------------------------------------------


SOURCE = document('<state id="a"><transition event="go" target="b"/></state><final id="b"/>')


def test_identity_is_the_sha256_of_the_exact_bytes() -> None:
    machine = compile_chart(SOURCE)
    expected = "sha256:" + hashlib.sha256(SOURCE.encode()).hexdigest()
    assert machine.identity.content_hash == expected
    assert (machine.identity.name, machine.identity.version) == (None, None)
    assert machine.source == SOURCE.encode()
    assert compile_chart(SOURCE.encode()).identity == machine.identity


def test_identity_is_whitespace_sensitive() -> None:
    spaced = SOURCE.replace("<final", " <final")
    assert compile_chart(spaced).identity != compile_chart(SOURCE).identity
    crlf = SOURCE.replace("\n", "\r\n")
    assert compile_chart(crlf).identity.content_hash == (
        "sha256:" + hashlib.sha256(crlf.encode()).hexdigest()
    )


def test_identity_carries_name_and_version() -> None:
    machine = compile_chart(SOURCE, name="orders", version="7")
    assert machine.identity.name == "orders"
    assert machine.identity.version == "7"
    assert machine.identity.content_hash == compile_chart(SOURCE).identity.content_hash
    assert machine.identity != compile_chart(SOURCE, name="orders", version="8").identity


def test_the_machine_is_immutable() -> None:
    machine = compile_chart(SOURCE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        machine.name = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        machine.states[1].id = "x"  # type: ignore[misc]


# -- numbering --------------------------------------------------------------------------


NUMBERED = compile_chart(
    document(
        """<state id="a">
  <datamodel><data id="d1" expr="1"/></datamodel>
  <history id="h"><transition target="a2"/></history>
  <state id="a1"><state id="a11"/></state>
  <state id="a2"/>
</state>
<parallel id="p"><datamodel><data id="d2"/></datamodel>
  <state id="p1"/><state id="p2"/>
</parallel>
<final id="f"/>""",
        'name="numbered"',
    )
)


def test_states_are_numbered_in_document_order_with_subtree_ranges() -> None:
    states = NUMBERED.states
    assert [(s.index, s.id, s.kind) for s in states] == [
        (0, None, "scxml"),
        (1, "a", "state"),
        (2, "h", "history"),
        (3, "a1", "state"),
        (4, "a11", "state"),
        (5, "a2", "state"),
        (6, "p", "parallel"),
        (7, "p1", "state"),
        (8, "p2", "state"),
        (9, "f", "final"),
    ]
    assert [s.last for s in states] == [9, 5, 2, 4, 4, 5, 8, 7, 8, 9]
    assert [s.parent for s in states] == [-1, 0, 1, 1, 3, 1, 0, 6, 6, 0]
    assert states[1].children == (3, 5)
    assert states[1].histories == (2,)
    assert states[4].ancestors == (3, 1, 0)
    assert [s.is_atomic for s in states] == [
        False, False, False, False, True, True, False, True, True, True,
    ]  # fmt: skip
    assert [s.is_compound for s in states] == [
        True, True, False, True, False, False, False, False, False, False,
    ]  # fmt: skip
    assert dict(NUMBERED.ids) == {s.id: s.index for s in states if s.id is not None}
    for state in states:
        for child in state.children:
            assert state.index < child <= state.last
    assert NUMBERED.name == "numbered"


def test_data_elements_are_numbered_in_document_order() -> None:
    assert [(d.index, d.id, d.state) for d in NUMBERED.data] == [(0, "d1", 1), (1, "d2", 6)]
    assert NUMBERED.states[1].data == (0,)
    assert NUMBERED.states[6].data == (1,)


def test_transition_events_are_tokenised() -> None:
    machine = compile_chart(
        document('<state id="a"><transition event="a.b  c.* d. *" target="a"/></state>')
    )
    (transition,) = [t for t in machine.transitions if t.event_text is not None]
    assert transition.events == (("a", "b"), ("c",), ("d",), ())
    assert transition.targets == (1,)


def test_executable_content_is_numbered_in_document_order() -> None:
    # NOTES 1.2: every executable node is numbered in document order; effects and trace
    # name content by that number.
    machine = compile_chart(
        document(
            '<state id="a"><initial><transition target="a1"><log label="first"/></transition>'
            '</initial><state id="a1"><onentry><log label="second"/></onentry></state></state>'
        )
    )
    _, effects = initialize(machine)
    assert [(e.label, e.content_index) for e in effects if isinstance(e, fx.Log)] == [
        ("first", 0),
        ("second", 1),
    ]


# -- loaders -------------------------------------------------------------------------------


def test_a_loader_provides_data_src_and_script_src() -> None:
    calls: list[str] = []

    def loader(src: str) -> str:
        calls.append(src)
        return {"values.json": "[1, 2, 3]", "setup.txt": "total = len(values)"}[src]

    machine = compile_chart(
        document(
            '<datamodel><data id="values" src="values.json"/><data id="total"/></datamodel>'
            '<state id="a"><onentry><script src="setup.txt"/></onentry></state>'
        ),
        loader=loader,
    )
    assert calls == ["values.json", "setup.txt"]
    state, _ = initialize(machine)
    assert state.datamodel["values"] == [1, 2, 3]
    assert state.datamodel["total"] == 3


def test_a_failing_loader_is_a_located_problem() -> None:
    def loader(src: str) -> str:
        raise OSError(f"refused {src}")

    source = document('<datamodel>\n  <data id="x" src="secret"/></datamodel><state id="a"/>')
    with pytest.raises(InvalidChart) as caught:
        compile_chart(source, loader=loader)
    assert [(p.line, p.column) for p in caught.value.problems] == [locate(source, "<data ")]
    assert "secret" in caught.value.problems[0].message


def test_a_loader_is_not_called_when_nothing_has_src() -> None:
    def loader(src: str) -> str:
        raise AssertionError("called")

    compile_chart(SOURCE, loader=loader)


def test_without_a_loader_nothing_is_fetched(tmp_path: Path) -> None:
    data_file = tmp_path / "values.json"
    data_file.write_text("[1, 2, 3]", encoding="utf-8")
    script_file = tmp_path / "setup.txt"
    script_file.write_text("made = 1", encoding="utf-8")
    machine: Machine = compile_chart(
        document(
            f'<datamodel><data id="values" src="{data_file.as_uri()}"/></datamodel>'
            f'<state id="a"><onentry><script src="{script_file.as_uri()}"/></onentry>'
            '<transition event="error.execution"><log label="error"/></transition></state>'
        )
    )
    state, effects = initialize(machine)
    assert state.datamodel["values"] != [1, 2, 3]
    assert "made" not in state.datamodel
    assert len([e for e in effects if isinstance(e, fx.Log)]) == 2
