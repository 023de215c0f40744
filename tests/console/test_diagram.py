"""The chart diagram: `render_chart_svg` draws every state once, nested as the chart
is, lights exactly the active ones, escapes every text, and stays bounded."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statifier.chart import Machine, compile_chart
from statifier.console.diagram import MAX_DRAWN_STATES, MAX_LABEL, render_chart_svg

SVG = "{http://www.w3.org/2000/svg}"
NS = 'xmlns="http://www.w3.org/2005/07/scxml"'

ORDER = (
    f'<scxml {NS} initial="placed" name="order">'
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paid"/>'
    '<transition event="ping"><assign location="n" expr="n + 1"/></transition>'
    '<transition event="again" target="placed"/></state>'
    '<parallel id="paid">'
    '<state id="packing"><state id="picking"><transition event="picked" target="packed"/>'
    '</state><final id="packed"/></state>'
    '<state id="billing"><state id="invoice"/><history id="h" type="deep">'
    '<transition target="invoice"/></history></state>'
    '<transition event="done.state.paid" target="shipped"/></parallel>'
    '<state id="shipped"><transition event="deliver" target="delivered"/></state>'
    '<final id="delivered"/></scxml>'
)


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def groups(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "data-state" in g.attrib]


def box(group: ET.Element) -> tuple[float, float, float, float]:
    """The outer shape of a state's group: its first rect (or a history's circle)."""
    rect = group.find(f"{SVG}rect")
    if rect is not None:
        return tuple(float(rect.attrib[k]) for k in ("x", "y", "width", "height"))  # type: ignore[return-value]
    circle = group.find(f"{SVG}circle")
    assert circle is not None
    cx, cy, r = (float(circle.attrib[k]) for k in ("cx", "cy", "r"))
    return (cx - r, cy - r, 2 * r, 2 * r)


def inside(inner: tuple[float, ...], outer: tuple[float, ...]) -> bool:
    x, y, w, h = inner
    ox, oy, ow, oh = outer
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def ends(path: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first and the last point of a path ("Mx,y L..." or "Mx,y C... x,y")."""
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path)]
    return (numbers[0], numbers[1]), (numbers[-2], numbers[-1])


def on_border(point: tuple[float, float], shape: tuple[float, ...]) -> bool:
    x, y = point
    left, top, width, height = shape
    right, bottom = left + width, top + height
    near = 0.6
    inside = left - near <= x <= right + near and top - near <= y <= bottom + near
    edge = min(abs(x - left), abs(x - right), abs(y - top), abs(y - bottom)) <= near
    return inside and edge


def apart(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    return ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay


# Generated charts: a tree of states of every kind, with transitions between them.


@dataclass
class Node:
    id: str
    kind: str  # atomic, final, compound, parallel
    children: list[Node] = field(default_factory=list)
    transitions: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


EVENTS = ("go", "a.b", "done.state.x", "error.*", "tick")
CONDITIONS = (None, "1 &lt; 2", "'&lt;b&gt;&amp;&quot;' != 'x'")


@st.composite
def charts(draw: st.DrawFn) -> tuple[str, list[Node]]:
    ids = itertools.count()

    def node(depth: int) -> Node:
        kinds = ["atomic", "final"] if depth >= 3 else ["atomic", "final", "compound", "parallel"]
        kind = draw(st.sampled_from(kinds))
        made = Node(f"s{next(ids)}", kind)
        if kind in ("compound", "parallel"):
            count = draw(st.integers(1, 3))
            made.children = [node(depth + 1) for _ in range(count)]
        return made

    tops = [node(0) for _ in range(draw(st.integers(1, 4)))]
    every = [n for top in tops for n in top.walk()]
    names = [n.id for n in every]
    for n in every:
        if n.kind == "final":
            continue
        for _ in range(draw(st.integers(0, 2))):
            target = draw(st.none() | st.sampled_from(names))
            event = draw(st.none() | st.sampled_from(EVENTS))
            cond = draw(st.sampled_from(CONDITIONS))
            if target is None and event is None and cond is None:
                event = "go"  # a targetless eventless transition would loop forever
            n.transitions.append((event or "", target, cond))

    def xml(n: Node) -> str:
        tag = {"atomic": "state", "compound": "state"}.get(n.kind, n.kind)
        inner = []
        for event, target, cond in n.transitions:
            attrs = f' event="{event}"' if event else ""
            attrs += f' target="{target}"' if target else ""
            attrs += f' cond="{cond}"' if cond else ""
            inner.append(f"<transition{attrs}/>")
        inner.extend(xml(child) for child in n.children)
        return f'<{tag} id="{n.id}">{"".join(inner)}</{tag}>'

    return f"<scxml {NS}>{''.join(xml(top) for top in tops)}</scxml>", every


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(charts(), st.data())
def test_every_state_is_drawn_once_nested_lit_only_when_active(
    chart: tuple[str, list[Node]], data: st.DataObject
) -> None:
    source, nodes = chart
    machine = compile_chart(source)
    ids = [n.id for n in nodes]
    active = set(data.draw(st.sets(st.sampled_from(ids))))
    active_with_strangers = active | {"not-a-state"}
    svg = render_chart_svg(machine, active_with_strangers)
    root = parse(svg)
    drawn = groups(root)
    keys = [g.attrib["data-state"] for g in drawn]
    assert sorted(keys) == sorted(ids)  # each exactly once
    by_id = {g.attrib["data-state"]: g for g in drawn}
    for state_id, group in by_id.items():
        expected = "state active" if state_id in active else "state"
        assert group.attrib["class"] == expected
    # The groups nest as the chart does; boxes sit inside their parents, siblings apart.
    for n in nodes:
        group = by_id[n.id]
        nested = [g.attrib["data-state"] for g in group if "data-state" in g.attrib]
        assert nested == [child.id for child in n.children]
        for child in n.children:
            assert inside(box(by_id[child.id]), box(group))
        for one, other in itertools.combinations(n.children, 2):
            assert apart(box(by_id[one.id]), box(by_id[other.id]))
        kind = {"atomic": "atomic", "compound": "compound"}.get(n.kind, n.kind)
        assert group.attrib["data-kind"] == kind
    # One arrow per (transition, target) pair; targetless transitions are listed.
    arrows = root.findall(f".//{SVG}g[@class='transition']")
    pairs = [(n.id, t[1]) for n in nodes for t in n.transitions if t[1]]
    assert sorted((a.attrib["data-source"], a.attrib["data-target"]) for a in arrows) == sorted(
        pairs
    )
    # Each arrow starts and ends on its boxes' borders (a loop on its own box's).
    for arrow in arrows:
        drawn_from, drawn_to = (
            box(by_id[arrow.attrib["data-source"]]),
            box(by_id[arrow.attrib["data-target"]]),
        )
        start, end = ends(arrow[0].attrib["d"])
        assert on_border(start, drawn_from)
        assert on_border(end, drawn_to)
    listed = [t.text for t in root.iter(f"{SVG}text") if t.attrib.get("class") == "listed"]
    assert len(listed) == sum(1 for n in nodes for t in n.transitions if not t[1])
    # The same chart, compiled again, gives the same bytes.
    assert render_chart_svg(compile_chart(source), active_with_strangers) == svg


def test_a_chart_of_every_kind_of_state_is_drawn_as_described() -> None:
    svg = render_chart_svg(compile_chart(ORDER), active={"paid", "packing", "picking"})
    root = parse(svg)
    by_id = {g.attrib["data-state"]: g for g in groups(root)}
    assert {k: g.attrib["data-kind"] for k, g in by_id.items()} == {
        "placed": "atomic",
        "paid": "parallel",
        "packing": "compound",
        "picking": "atomic",
        "packed": "final",
        "billing": "compound",
        "invoice": "atomic",
        "h": "history",
        "shipped": "atomic",
        "delivered": "final",
    }
    # A parallel's two regions: one dashed separator between them, side by side.
    separators = by_id["paid"].findall(f"{SVG}line[@class='region']")
    assert len(separators) == 1
    x = float(separators[0].attrib["x1"])
    packing, billing = box(by_id["packing"]), box(by_id["billing"])
    assert packing[0] + packing[2] < x < billing[0]
    # A final state has a double border; a deep history says H*.
    assert len(by_id["delivered"].findall(f"{SVG}rect")) == 2
    assert by_id["h"].findtext(f"{SVG}text") == "H*"
    # The targetless transition is listed inside its state, not drawn as an arrow.
    assert [t.text for t in by_id["placed"].iter(f"{SVG}text")] == ["placed", "\u21ba ping"]
    # Arrows: labelled with their events, ending in the arrowhead marker.
    marker = root.find(f".//{SVG}marker")
    assert marker is not None
    arrows = root.findall(f".//{SVG}g[@class='transition']")
    labels = sorted(a.findtext(f"{SVG}text") or "" for a in arrows)
    assert labels == ["", "again", "deliver", "done.state.paid", "pay", "picked"]
    for arrow in arrows:
        path = arrow.find(f"{SVG}path")
        assert path is not None
        assert path.attrib["marker-end"] == f"url(#{marker.attrib['id']})"
    # The self-transition is a loop (a curve), the others straight lines.
    again = next(a for a in arrows if a.attrib["data-event"] == "again")
    assert " C" in again[0].attrib["d"]
    pay = next(a for a in arrows if a.attrib["data-event"] == "pay")
    assert " L" in pay[0].attrib["d"]
    assert " C" not in pay[0].attrib["d"]
    # The flow reads left to right: each state of the chain right of the one before.
    chain = [box(by_id[s])[0] for s in ("placed", "paid", "shipped", "delivered")]
    assert chain == sorted(chain)
    assert len(set(chain)) == 4
    # Initial markers: beside the chart's initial state and each compound's first child.
    dots = [
        (float(c.attrib["cx"]), float(c.attrib["cy"]))
        for c in root.iter(f"{SVG}circle")
        if c.attrib.get("class") == "initial"
    ]
    for first in ("placed", "picking", "invoice"):
        x0, y0, _, _ = box(by_id[first])
        assert (x0 - 14, y0 + 12) in dots
    assert len(dots) == 3


def test_markup_in_conditions_and_names_is_text_never_markup() -> None:
    chart = (
        f'<scxml {NS} name="&lt;script&gt;alert(1)&lt;/script&gt;">'
        '<state id="a"><transition event="go" '
        "cond=\"'&lt;img src=x onerror=alert(1)&gt;' != '&amp;&quot;'\" target=\"b\"/>"
        "<transition event=\"stay\" cond=\"'&lt;/svg&gt;' == 'x'\"/></state>"
        '<state id="b"/></scxml>'
    )
    svg = render_chart_svg(compile_chart(chart))
    root = parse(svg)
    assert "<script" not in svg
    assert "<img" not in svg
    assert "</svg>" not in svg[: -len("</svg>")]
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert "<script>alert(1)</script>" in texts
    assert any(t.startswith("go ['<img src=x onerror") for t in texts)
    assert "\u21ba stay ['</svg>' == 'x']" in texts
    assert root.findtext(f"{SVG}title") == "<script>alert(1)</script>"
    # Only the drawing's own elements exist.
    tags = {element.tag.removeprefix(SVG) for element in root.iter()}
    assert tags <= {"svg", "title", "defs", "marker", "path", "g", "rect", "text", "circle", "line"}


TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Cn"), blacklist_characters="'\\"), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(TEXT, st.booleans())
def test_any_text_in_a_condition_comes_back_as_the_same_text(text: str, listed: bool) -> None:
    condition = f"'{text}' != 'x'"
    target = "" if listed else ' target="b"'
    chart = (
        f'<scxml {NS} initial="a"><state id="a">'
        f'<transition event="go" cond={quoteattr(condition)}{target}/></state>'
        '<state id="b"/></scxml>'
    )
    svg = render_chart_svg(compile_chart(chart))
    root = parse(svg)  # well-formed, whatever the text
    label = f"go [{condition}]"
    label = label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "\u2026"
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert ("\u21ba " + label if listed else label) in texts
    # Nothing but the drawing's own elements, whatever the text held.
    assert len(groups(root)) == 2


def test_long_labels_are_clipped_and_unnamed_states_keyed_by_index() -> None:
    long = "e" * 100
    chart = (
        f'<scxml {NS}><state><transition event="{long}" target="z"/></state><state id="z"/></scxml>'
    )
    machine = compile_chart(chart)
    root = parse(render_chart_svg(machine))
    assert [g.attrib["data-state"] for g in groups(root)] == ["#1", "z"]
    label = root.findtext(f".//{SVG}g[@class='transition']/{SVG}text")
    assert label == "e" * (MAX_LABEL - 1) + "\u2026"
    names = [t.text for t in root.iter(f"{SVG}text") if t.attrib.get("class") == "name"]
    assert names == ["(state 1)", "z"]


def _chain(count: int) -> Machine:
    states = "".join(
        f'<state id="s{i}"><transition event="next" target="s{(i + 1) % count}"/></state>'
        for i in range(count)
    )
    return compile_chart(f"<scxml {NS}>{states}</scxml>")


def test_a_huge_chart_is_drawn_up_to_the_cap_with_a_note() -> None:
    machine = _chain(1_000)
    svg = render_chart_svg(machine, active={"s0", "s999"})
    root = parse(svg)
    drawn = groups(root)
    assert len(drawn) == MAX_DRAWN_STATES
    assert [g.attrib["data-state"] for g in drawn] == [f"s{i}" for i in range(MAX_DRAWN_STATES)]
    notes = [t.text for t in root.iter(f"{SVG}text") if t.attrib.get("class") == "note"]
    assert notes == [
        f"{1_000 - MAX_DRAWN_STATES} more states are not drawn (at most {MAX_DRAWN_STATES})",
        "1 more transitions are not drawn",  # s399 -> s400
    ]
    # Bounded: the drawing of 1,000 states is no larger than that of the cap.
    assert len(svg) < len(render_chart_svg(_chain(MAX_DRAWN_STATES))) + 500


def test_output_is_deterministic_and_inline_able() -> None:
    machine = compile_chart(ORDER)
    first = render_chart_svg(machine, ["paid", "packing"])
    assert first == render_chart_svg(machine, ("packing", "paid", "packing"))
    assert first.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="statechart"')
    assert first.endswith("</svg>")
    # No reference leaves the document: no external href, no url() but the marker's.
    assert "href" not in first
    # No inline CSS (a page's Content-Security-Policy may forbid it): attributes paint.
    root = parse(first)
    assert root.find(f".//{SVG}style") is None
    assert not any("style" in element.attrib for element in root.iter())
    assert re.findall(r"url\(([^)]*)\)", first) == ["#sc-arrow-" + _digest(machine)] * 6


def _digest(machine: Machine) -> str:
    return machine.identity.content_hash.removeprefix("sha256:")[:12]


@pytest.mark.parametrize("bad", [None, 3, "paid"])
def test_active_must_be_a_collection_of_ids(bad: object) -> None:
    with pytest.raises(TypeError):
        render_chart_svg(compile_chart(ORDER), bad)  # type: ignore[arg-type]
