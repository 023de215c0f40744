"""Mermaid and DOT diagrams of a chart with compound, parallel, final and history states."""

from __future__ import annotations

import re

import pytest

from statifier.chart import Machine, compile_chart
from statifier.chart.graph import dot, mermaid

NS = "http://www.w3.org/2005/07/scxml"

CHART = compile_chart(
    f"""<scxml xmlns="{NS}" initial="idle">
  <state id="idle"><transition event="start" target="work"/></state>
  <state id="work" initial="step1">
    <history id="hist" type="deep"><transition target="step1"/></history>
    <history id="shallow_hist"><transition target="step2"/></history>
    <state id="step1"><transition event="next" cond="n &gt; 1" target="step2"/></state>
    <state id="step2"><transition event="tick"/></state>
    <transition event="pause" target="paused"/>
  </state>
  <state id="paused"><transition event="resume" target="hist"/></state>
  <parallel id="both">
    <state id="left"><state id="l1"/></state>
    <state id="right"><state id="r1"><transition event="finish" target="over"/></state></state>
  </parallel>
  <final id="over"/>
</scxml>"""
)


def chart(body: str, attrs: str = "") -> Machine:
    return compile_chart(f'<scxml xmlns="{NS}" {attrs}>{body}</scxml>')


# -- Mermaid --------------------------------------------------------------------------


def mermaid_blocks(text: str) -> dict[str, list[str]]:
    """For each line, the stack of enclosing ``state X {`` blocks (outermost first)."""
    stack: list[str] = []
    where: dict[str, list[str]] = {}
    for raw in text.splitlines()[1:]:
        line = raw.strip()
        opened = re.fullmatch(r"state (\S+) \{", line)
        if opened:
            where.setdefault(line, list(stack))
            stack.append(opened.group(1))
            continue
        if line == "}":
            stack.pop()
            continue
        where.setdefault(line, list(stack))
    assert stack == []
    return where


def test_mermaid_header_and_initial_markers() -> None:
    text = mermaid(CHART)
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    where = mermaid_blocks(text)
    assert where["[*] --> idle"] == []
    assert where["[*] --> step1"] == ["work"]
    assert where["[*] --> l1"] == ["both", "left"]
    assert where["[*] --> r1"] == ["both", "right"]


def test_mermaid_nests_compound_and_parallel_states() -> None:
    where = mermaid_blocks(mermaid(CHART))
    assert where["state work {"] == []
    assert where["step1"] == ["work"]
    assert where["step2"] == ["work"]
    assert where["state both {"] == []
    assert where["state left {"] == ["both"]
    assert where["state right {"] == ["both"]
    assert where["l1"] == ["both", "left"]
    assert where["--"] == ["both"]


def test_mermaid_separates_parallel_regions() -> None:
    lines = [line.strip() for line in mermaid(CHART).splitlines()]
    left, separator, right = (
        lines.index("state left {"),
        lines.index("--"),
        lines.index("state right {"),
    )
    assert left < separator < right


def test_mermaid_transitions_are_labelled_with_events_and_conditions() -> None:
    where = mermaid_blocks(mermaid(CHART))
    assert where["idle --> work : start"] == []
    assert where["step1 --> step2 : next [n > 1]"] == ["work"]
    assert where["step2 --> step2 : tick"] == ["work"]
    assert where["work --> paused : pause"] == []
    assert where["paused --> hist : resume"] == []
    assert where["r1 --> over : finish"] == ["both", "right"]


def test_mermaid_final_states_lead_to_the_end_marker() -> None:
    where = mermaid_blocks(mermaid(CHART))
    assert where["over"] == []
    assert where["over --> [*]"] == []


def test_mermaid_history_states_belong_to_their_compound_state() -> None:
    # A history pseudo-state is a child of its parent state; declared outside the
    # parent's block, Mermaid would draw it at the top level instead.
    where = mermaid_blocks(mermaid(CHART))
    assert where['state "H*" as hist'] == ["work"]
    assert where['state "H" as shallow_hist'] == ["work"]


def test_mermaid_escapes_colons_in_labels_and_names_odd_ids() -> None:
    machine = chart(
        '<state id="a-b"><transition event="go" cond="x == \'a:b\'" target="c"/></state>'
        '<state id="c"/>'
    )
    text = mermaid(machine)
    assert 'state "a-b" as state_1' in text
    assert "state_1 --> c : go [x == 'a#58;b']" in text


def test_mermaid_of_a_minimal_chart() -> None:
    assert mermaid(chart('<state id="only"/>')) == "stateDiagram-v2\n    [*] --> only\n    only"


# -- DOT ------------------------------------------------------------------------------


DOT_ID = re.compile(r"[A-Za-z_\x80-\uffff][A-Za-z_0-9\x80-\uffff]*|-?(\.[0-9]+|[0-9]+(\.[0-9]*)?)")
DOT_KEYWORDS = {"node", "edge", "graph", "digraph", "subgraph", "strict"}


def dot_statements(text: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Node ids and (tail, head, attributes) edges of our DOT output."""
    nodes: list[str] = []
    edges: list[tuple[str, str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        edge = re.fullmatch(r"(\S+) -> (\S+?)(?: \[(.*)\])?;", line)
        if edge:
            edges.append((edge.group(1), edge.group(2), edge.group(3) or ""))
            continue
        node = re.fullmatch(r"(\S+) \[(.*)\];", line)
        if node and node.group(1) not in ("node", "edge", "graph"):
            nodes.append(node.group(1))
    return nodes, edges


def test_dot_is_a_balanced_digraph() -> None:
    text = dot(CHART)
    lines = text.splitlines()
    assert lines[0] == "digraph chart {"
    assert lines[-1] == "}"
    assert text.count("{") == text.count("}")
    assert "compound=true;" in text


def test_dot_clusters_for_compound_and_parallel_states() -> None:
    text = dot(CHART)
    assert "subgraph cluster_work {" in text
    assert 'label="work"; style=rounded;' in text
    assert "subgraph cluster_both {" in text
    assert 'label="both"; style=dashed;' in text
    assert "subgraph cluster_left {" in text
    assert "subgraph cluster_right {" in text


def test_dot_nodes_for_atomic_final_and_history_states() -> None:
    text = dot(CHART)
    assert 'idle [label="idle"];' in text
    assert 'over [label="over", peripheries=2];' in text
    assert 'hist [label="H*", shape=circle];' in text
    assert 'shallow_hist [label="H", shape=circle];' in text
    work = text[text.index("subgraph cluster_work") : text.index("paused [")]
    assert "hist [" in work
    assert "step1 [" in work


def test_dot_edges() -> None:
    nodes, edges = dot_statements(dot(CHART))
    assert ("start", "idle", "") in edges
    assert ("idle", "work_anchor", 'label="start", lhead=cluster_work') in edges
    assert ("step1", "step2", 'label="next [n > 1]"') in edges
    assert ("step2", "step2", 'label="tick"') in edges
    assert ("work_anchor", "paused", 'label="pause", ltail=cluster_work') in edges
    assert ("paused", "hist", 'label="resume"') in edges
    assert ("r1", "over", 'label="finish"') in edges
    declared = set(nodes)
    for tail, head, _ in edges:
        assert tail in declared
        assert head in declared


def test_dot_escapes_quotes_in_labels() -> None:
    machine = chart('<state id="a"><transition event="go" cond="x == &quot;q&quot;"/></state>')
    assert 'a -> a [label="go [x == \\"q\\"]"];' in dot(machine)


def valid_dot_id(name: str) -> bool:
    quoted = name.startswith('"') and name.endswith('"')
    return quoted or (DOT_ID.fullmatch(name) is not None and name.lower() not in DOT_KEYWORDS)


@pytest.mark.parametrize("state_id", ["node", "edge", "a.b"])
def test_dot_ids_are_valid_for_every_state_id(state_id: str) -> None:
    # SCXML ids are NCNames (dots allowed); DOT IDs are letters/digits/underscores or
    # quoted strings, and its keywords cannot be bare node ids.
    machine = chart(
        f'<state id="{state_id}"><transition event="go" target="other"/></state><state id="other"/>'
    )
    _, edges = dot_statements(dot(machine))
    used = sorted({end for tail, head, _ in edges for end in (tail, head)})
    assert [name for name in used if not valid_dot_id(name)] == []
