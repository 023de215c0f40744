"""A chart drawn as SVG: nested boxes for states, arrows for transitions.

:func:`render_chart_svg` draws a compiled chart by itself (no network, no external
binary), with the active configuration highlighted, for the console's execution page.

The layout is a plain box layout, computed bottom-up then placed top-down: an atomic
state is a box as wide as its name (and the targetless transitions it lists); a
compound state flows its children in rows inside its box; a parallel state puts its
regions side by side with dashed separators between them. Transitions are straight
arrows between the edges of their boxes, a self-transition a loop. Coordinates are
integers or fixed one-decimal numbers, and nothing depends on a dict's or a set's
order, so the same chart and configuration give the same bytes.

>>> from statifier.chart import compile_chart
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<state id="open"><transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> svg = render_chart_svg(machine, active={"open"})
>>> svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"')
True
>>> '<g class="state active" data-state="open" data-kind="atomic">' in svg
True
>>> '<g class="state" data-state="closed" data-kind="final">' in svg
True
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from html import escape
from typing import Final

from statifier.chart import Machine
from statifier.chart.model import StateNode, Transition

__all__ = ["MAX_DRAWN_STATES", "MAX_DRAWN_TRANSITIONS", "render_chart_svg"]

MAX_DRAWN_STATES: Final = 400
"""The most states one diagram draws (the root not counted). A larger chart is drawn
up to the cap in document order, which keeps every drawn state's parent drawn, with a
note saying how many states were left out."""

MAX_DRAWN_TRANSITIONS: Final = 1_000
"""The most transition arrows one diagram draws; a note says how many were left out."""

MAX_LABEL: Final = 40
"""The most characters of a label drawn; a longer one ends in an ellipsis."""

MAX_LISTED: Final = 6
"""The most targetless transitions listed inside one state; the rest are counted."""

_CHAR: Final = 7  # the width of one character at the 12px font, estimated
_LINE: Final = 16  # one line of listed text
_HEADER: Final = 24  # a box's name line
_PAD: Final = 12  # inside a box, around its content
_INDENT: Final = 24  # left of a compound's children: room for the initial marker
_GAP: Final = 48  # between sibling boxes: room for arrows and their labels
_MIN_WIDTH: Final = 72
_MIN_HEIGHT: Final = 40
_HISTORY: Final = 28  # a history state's circle, its diameter
_MARGIN: Final = 16
_TITLE: Final = 28
_LOOP: Final = 22  # how far a self-transition's loop reaches out of its box

# Presentation attributes, not a <style> element: the drawing then needs no inline
# CSS (a page may forbid it by its Content-Security-Policy), and a page's stylesheet
# still overrides them through the classes.
_PLAIN: Final = 'fill="#fff" stroke="#555" stroke-width="1.2"'
_GROUP: Final = 'fill="#f6f7f9" stroke="#555" stroke-width="1.2"'
_LIT: Final = 'fill="#fff3c4" stroke="#c77700" stroke-width="2.5"'
_PLAIN_LINE: Final = 'fill="none" stroke="#555" stroke-width="1.2"'
_LIT_LINE: Final = 'fill="none" stroke="#c77700" stroke-width="2.5"'
_NAME: Final = 'font-weight="bold" fill="#222"'
_NAME_LIT: Final = 'font-weight="bold" fill="#8a4b00"'
_LISTED: Final = 'fill="#444" font-size="11"'
_REGION: Final = 'stroke="#555" stroke-dasharray="6 4"'
_ARROW: Final = 'fill="none" stroke="#3461a8" stroke-width="1.2"'
_LABEL: Final = 'fill="#23467d" font-size="11" paint-order="stroke" stroke="#fff" stroke-width="3"'


@dataclass(frozen=True, slots=True)
class _Box:
    """Where a state is drawn: top-left corner and size, in pixels."""

    x: int
    y: int
    w: int
    h: int

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    def contains(self, other: _Box) -> bool:
        return (
            self.x <= other.x
            and self.y <= other.y
            and other.x + other.w <= self.x + self.w
            and other.y + other.h <= self.y + self.h
        )


@dataclass(frozen=True, slots=True)
class _Size:
    w: int
    h: int


class _Layout:
    """Sizes then places the drawn states of one chart."""

    def __init__(self, machine: Machine, drawn: int) -> None:
        self.machine = machine
        self.drawn = drawn  # states with an index below this are drawn
        self.sizes: dict[int, _Size] = {}
        self.boxes: dict[int, _Box] = {}
        self.gaps: dict[int, int] = {}
        self.laid: dict[int, list[tuple[int, ...]]] = {}

    def children(self, node: StateNode) -> tuple[int, ...]:
        """The drawn state children, histories first (they sit by the name line)."""
        return tuple(i for i in (*node.histories, *node.children) if i < self.drawn)

    def size(self, index: int) -> _Size:
        node = self.machine.states[index]
        found = _Size(_HISTORY, _HISTORY) if node.kind == "history" else self._box_size(node)
        self.sizes[index] = found
        return found

    def _box_size(self, node: StateNode) -> _Size:
        lines = _listed(self.machine, node)
        text_width = max((len(line) for line in lines), default=0) * _CHAR
        name_width = len(_name(node)) * _CHAR + 2 * _PAD
        children = self.children(node)
        head = _HEADER + len(lines) * _LINE
        if not children:
            width = max(_MIN_WIDTH, name_width, text_width + 2 * _PAD)
            return _Size(width, max(_MIN_HEIGHT, head + _PAD))
        inner = self._inner_size(node)
        width = max(name_width, text_width + 2 * _PAD, _INDENT + inner.w + _PAD)
        return _Size(width, head + _PAD + inner.h + _PAD)

    def _inner_size(self, node: StateNode) -> _Size:
        """The size of the columns holding a state's children, sized first."""
        columns = self.columns(node)
        widths = [max(self.size(c).w for c in column) for column in columns]
        heights = [sum(self.sizes[c].h for c in col) + _GAP * (len(col) - 1) for col in columns]
        return _Size(sum(widths) + self.across(node) * (len(columns) - 1), max(heights))

    def across(self, node: StateNode) -> int:
        """The gap between a state's columns: wide enough for the longest label of an
        arrow between its children (a loop's label reaches out to the right too)."""
        found = self.gaps.get(node.index)
        if found is not None:
            return found
        owner = self._owners(self.children(node))
        longest = 0
        for transition in self._under(node):
            source = owner.get(transition.source)
            if source is None:
                continue
            for target in transition.targets:
                reached = owner.get(target)
                if reached is None or (reached == source and target != source):
                    continue  # inside one child (its own loops too): drawn within its box
                loop = _LOOP if target == transition.source else 0
                longest = max(longest, len(_clip(_transition_label(transition))) * _CHAR + loop)
        found = max(_GAP, min(longest, MAX_LABEL * _CHAR + _LOOP) + 2 * _PAD)
        self.gaps[node.index] = found
        return found

    def _under(self, node: StateNode) -> Iterator[Transition]:
        """The transitions of the drawn states under ``node``, in document order."""
        states, transitions = self.machine.states, self.machine.transitions
        for index in range(node.index + 1, min(node.last + 1, self.drawn)):
            for number in states[index].transitions:
                yield transitions[number]

    def _owners(self, children: Sequence[int]) -> dict[int, int]:
        """Every state under one of ``children``, mapped to that child."""
        states = self.machine.states
        owner: dict[int, int] = {}
        for child in children:
            for index in range(child, states[child].last + 1):
                owner[index] = child
        return owner

    def columns(self, node: StateNode) -> list[tuple[int, ...]]:
        """A state's drawn children in columns, left to right.

        A parallel's regions stand side by side, one per column. Other children are
        ranked by how many transitions they are from the initial one (transitions of
        their descendants count as theirs), each rank a column, so a flow reads left to
        right; children no transition reaches share the first column.
        """
        found = self.laid.get(node.index)
        if found is not None:
            return found
        children = self.children(node)
        if node.kind == "parallel":
            found = [(child,) for child in children]
        else:
            ranks = self._ranks(node, children)
            count = max(ranks.values(), default=0) + 1
            found = [tuple(c for c in children if ranks[c] == rank) for rank in range(count)]
        self.laid[node.index] = found
        return found

    def _ranks(self, node: StateNode, children: Sequence[int]) -> dict[int, int]:
        owner = self._owners(children)
        edges: dict[int, list[int]] = {child: [] for child in children}
        for transition in self._under(node):
            source = owner.get(transition.source)
            if source is None:
                continue
            for target in transition.targets:
                reached = owner.get(target)
                if reached is not None and reached != source and reached not in edges[source]:
                    edges[source].append(reached)
        firsts = [owner[t] for t in _initial_targets(self.machine, node.index) if t in owner]
        start = firsts[0] if firsts else children[0]
        ranks = {start: 0}
        queue = [start]
        for current in queue:  # breadth first, in transition order: deterministic
            for reached in edges[current]:
                if reached not in ranks:
                    ranks[reached] = ranks[current] + 1
                    queue.append(reached)
        return {child: ranks.get(child, 0) for child in children}

    def place(self, index: int, x: int, y: int) -> None:
        node = self.machine.states[index]
        size = self.sizes[index]
        self.boxes[index] = _Box(x, y, size.w, size.h)
        if not self.children(node):
            return
        top = y + _HEADER + len(_listed(self.machine, node)) * _LINE + _PAD
        self.place_columns(node, x + _INDENT, top)

    def place_columns(self, node: StateNode, left: int, top: int) -> None:
        gap = self.across(node)
        for column in self.columns(node):
            y = top
            for child in column:
                self.place(child, left, y)
                y += self.sizes[child].h + _GAP
            left += max(self.sizes[c].w for c in column) + gap


def render_chart_svg(machine: Machine, active: Collection[str] = ()) -> str:
    """Draw ``machine`` as one standalone ``<svg>`` element, inline-able in HTML.

    Args:
        machine: a compiled chart (:func:`statifier.chart.compile_chart`).
        active: author ids of the states to light (any of the configuration: leaves,
            ancestors, or both); ids the chart does not have are ignored.

    Returns:
        The SVG text, painted with presentation attributes (no ``<style>``: it needs
        no inline CSS; a page's stylesheet may restyle it through its classes).
        Every drawn state is a ``<g>`` with ``data-state="<id>"`` (an unnamed state
        ``#<index>``), ``data-kind`` (``atomic``, ``compound``, ``parallel``, ``final``
        or ``history``) and the class ``state``, or ``state active`` when its id is in
        ``active``; a state's ``<g>`` holds those of its children. Compound and
        parallel states are boxes holding their children, a parallel's regions side by
        side with dashed separators; a final state has a double border; transitions
        are arrows (``<g class="transition">`` with ``data-source``, ``data-target`` and
        ``data-event``) labelled with their events (and
        conditions), a self-transition a loop, a targetless one listed inside its
        state; each initial child is marked with a dot. Every text is escaped, and the
        same input gives the same bytes. At most :data:`MAX_DRAWN_STATES` states and
        :data:`MAX_DRAWN_TRANSITIONS` arrows are drawn; a note counts the rest.

    Raises:
        TypeError: ``active`` is one ``str`` (a collection of ids is meant) or not a
            collection.
    """
    if isinstance(active, str):
        raise TypeError(f"active is a collection of state ids, not one str: {active!r}")
    lit = frozenset(active)
    states = machine.states
    drawn = min(len(states), MAX_DRAWN_STATES + 1)
    layout = _Layout(machine, drawn)
    root = states[0]
    tops = layout.children(root)
    inner = layout._inner_size(root) if tops else _Size(0, 0)
    layout.place_columns(root, _MARGIN + _INDENT, _MARGIN + _TITLE)
    arrows, arrows_left = _transitions(machine, layout)
    notes = _notes(len(states) - drawn, arrows_left)
    height = _MARGIN + _TITLE + inner.h + _LOOP + _MARGIN + _LINE * len(notes)
    width = _MARGIN + _INDENT + inner.w + _LOOP + _MARGIN
    width = max(width, 240, *(len(n) * _CHAR + 2 * _MARGIN for n in notes))
    marker = "sc-arrow-" + machine.identity.content_hash.removeprefix("sha256:")[:12]
    title = machine.name or "chart"
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" class="statechart" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{_text(title)}" font-family="sans-serif" font-size="12">'
        ),
        f"<title>{_text(title)}</title>",
        (
            f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" '
            'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
            '<path d="M0,0 L10,5 L0,10 z" fill="#3461a8"/></marker></defs>'
        ),
        f'<text class="title" x="{_MARGIN}" y="{_MARGIN + 14}">{_text(title)}</text>',
    ]
    for child in tops:
        parts.extend(_state(machine, layout, child, lit))
    parts.extend(_initial_markers(machine, layout, 0))
    parts.append('<g class="transitions">')
    parts.extend(_arrow(arrow, marker) for arrow in arrows)
    parts.append("</g>")
    for number, note in enumerate(notes):
        y = height - _MARGIN - _LINE * (len(notes) - 1 - number)
        parts.append(f'<text class="note" x="{_MARGIN}" y="{y}" fill="#a00">{_text(note)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _state(machine: Machine, layout: _Layout, index: int, lit: frozenset[str]) -> Iterator[str]:
    node = machine.states[index]
    box = layout.boxes[index]
    kind = _kind(node)
    lit_here = node.id is not None and node.id in lit
    css = "state active" if lit_here else "state"
    paint = _LIT if lit_here else _GROUP if kind in ("compound", "parallel") else _PLAIN
    name = _NAME_LIT if lit_here else _NAME
    key = node.id if node.id is not None else f"#{index}"
    yield f'<g class="{css}" data-state="{_text(key)}" data-kind="{kind}">'
    if kind == "history":
        r = _HISTORY // 2
        mark = "H*" if node.history_deep else "H"
        yield f'<circle class="history" cx="{box.x + r}" cy="{box.y + r}" r="{r}" {paint}/>'
        yield (
            f'<text class="name" x="{box.x + r}" y="{box.y + r + 4}" '
            f'text-anchor="middle" {name}>{mark}</text>'
        )
        yield "</g>"
        return
    yield _rect(box, 10 if kind != "final" else 14, paint)
    if kind == "final":
        inner = _Box(box.x + 4, box.y + 4, box.w - 8, box.h - 8)
        yield _rect(inner, 10, _LIT_LINE if lit_here else _PLAIN_LINE, "inner")
    yield (
        f'<text class="name" x="{box.x + _PAD}" y="{box.y + 17}" {name}>{_text(_name(node))}</text>'
    )
    for number, line in enumerate(_listed(machine, node)):
        y = box.y + _HEADER + _LINE * number + 11
        yield f'<text class="listed" x="{box.x + _PAD}" y="{y}" {_LISTED}>{_text(line)}</text>'
    children = layout.children(node)
    if kind == "parallel":
        yield from _separators(layout, children, box)
    for child in children:
        yield from _state(machine, layout, child, lit)
    yield from _initial_markers(machine, layout, index)
    yield "</g>"


def _separators(layout: _Layout, regions: Sequence[int], box: _Box) -> Iterator[str]:
    """Dashed lines between a parallel's regions, halfway across each gap."""
    for left, right in itertools.pairwise(regions):
        x = (layout.boxes[left].x + layout.boxes[left].w + layout.boxes[right].x) // 2
        top = layout.boxes[left].y - _PAD // 2
        bottom = box.y + box.h - 4
        yield f'<line class="region" x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" {_REGION}/>'


def _initial_markers(machine: Machine, layout: _Layout, index: int) -> Iterator[str]:
    """A dot beside each drawn state the parent ``index`` enters first."""
    for target in _initial_targets(machine, index):
        box = layout.boxes.get(target)
        if box is None:
            continue
        y = box.y + 12
        yield f'<circle class="initial" cx="{box.x - 14}" cy="{y}" r="4" fill="#222"/>'
        yield f'<path class="initial" d="M{box.x - 10},{y} L{box.x},{y}" stroke="#222"/>'


def _initial_targets(machine: Machine, index: int) -> tuple[int, ...]:
    node = machine.states[index]
    if node.kind not in ("scxml", "state") or not node.children:
        return ()
    if node.initial_transition is not None:
        return machine.transitions[node.initial_transition].targets
    return (node.children[0],)


@dataclass(frozen=True, slots=True)
class _Arrow:
    path: str
    label: str
    label_x: float
    label_y: float
    source: str
    event: str
    anchor: str = "middle"
    target: str = ""


def _transitions(machine: Machine, layout: _Layout) -> tuple[list[_Arrow], int]:
    """The arrows to draw, in transition order, and how many were left out."""
    arrows: list[_Arrow] = []
    left_out = 0
    pairs: dict[tuple[int, int], int] = {}
    initials = {
        node.initial_transition for node in machine.states if node.initial_transition is not None
    }
    for transition in machine.transitions:
        if transition.index in initials or not transition.targets:
            continue  # initial transitions are dots; targetless ones are listed
        source = transition.source
        if source not in layout.boxes:
            continue  # inside a state past the cap: counted in the states' note
        for target in transition.targets:
            if target not in layout.boxes:
                left_out += 1
                continue
            if len(arrows) >= MAX_DRAWN_TRANSITIONS:
                left_out += 1
                continue
            pair = (min(source, target), max(source, target))
            nth = pairs.get(pair, 0)
            pairs[pair] = nth + 1
            arrow = _arrow_for(machine, layout, transition, target, nth)
            arrows.append(replace(arrow, target=machine.states[target].id or f"#{target}"))
    return arrows, left_out


def _arrow_for(
    machine: Machine, layout: _Layout, transition: Transition, target: int, nth: int
) -> _Arrow:
    source_box = layout.boxes[transition.source]
    target_box = layout.boxes[target]
    label = _clip(_transition_label(transition))
    source_id = machine.states[transition.source].id or f"#{transition.source}"
    event = transition.event_text or ""
    if target == transition.source:
        return _loop(source_box, label, source_id, event, nth)
    if source_box.contains(target_box) or target_box.contains(source_box):
        outward = source_box.contains(target_box)
        inner, outer = (target_box, source_box) if outward else (source_box, target_box)
        # Between nested boxes: a short horizontal arrow from the outer box's left
        # border to the inner box's left edge (or back), near the inner box's top,
        # labelled just left of the inner box.
        y = inner.y + min(inner.h - 6, 12 + 12 * nth)
        ends = ((outer.x, y), (inner.x, y)) if outward else ((inner.x, y), (outer.x, y))
        arrow = _straight(*ends, label, source_id, event)
        return replace(arrow, label_x=inner.x - 3, label_y=y - 3, anchor="end")
    # Several arrows between one pair: alternately either side of the centre line,
    # 12px apart, never off the smaller box.
    spread = 12.0 * ((nth + 1) // 2) * (1 if nth % 2 else -1)
    room = min(source_box.w, source_box.h, target_box.w, target_box.h) / 2 - 4
    offset = max(-room, min(room, spread))
    start = _edge(source_box, target_box.cx, target_box.cy, offset)
    end = _edge(target_box, source_box.cx, source_box.cy, -offset)
    return _straight(start, end, label, source_id, event)


def _edge(box: _Box, toward_x: float, toward_y: float, offset: float) -> tuple[float, float]:
    """Where a line toward a point leaves the box: the line from the box's centre,
    moved sideways by ``offset`` (which stays inside the box) so that several arrows
    between one pair stay apart."""
    dx, dy = toward_x - box.cx, toward_y - box.cy
    length = math.hypot(dx, dy) or 1.0
    cx, cy = box.cx - dy / length * offset, box.cy + dx / length * offset
    # The ray leaves through the nearer of the edges it heads for.
    steps = []
    if dx:
        steps.append(((box.x + box.w if dx > 0 else box.x) - cx) / dx)
    if dy:
        steps.append(((box.y + box.h if dy > 0 else box.y) - cy) / dy)
    if not steps:
        return cx, cy
    step = min(steps)
    return cx + dx * step, cy + dy * step


def _straight(
    start: tuple[float, float], end: tuple[float, float], label: str, source: str, event: str
) -> _Arrow:
    """A straight arrow from ``start`` to ``end``, labelled at its middle."""
    (x1, y1), (x2, y2) = start, end
    path = f"M{_n(x1)},{_n(y1)} L{_n(x2)},{_n(y2)}"
    return _Arrow(path, label, (x1 + x2) / 2, (y1 + y2) / 2 - 4, source, event)


def _loop(box: _Box, label: str, source: str, event: str, nth: int) -> _Arrow:
    """A self-transition: out of the top edge near the right corner and back into the
    right edge, bulging outside the box."""
    reach = _LOOP + 8 * nth
    x1, y1 = box.x + box.w - 18, box.y
    x2, y2 = box.x + box.w, box.y + 18
    path = f"M{x1},{y1} C{x1},{y1 - reach} {x2 + reach},{y2} {x2},{y2}"
    return _Arrow(path, label, x2 + 6, y1 - reach / 2 + 4, source, event, "start")


def _arrow(arrow: _Arrow, marker: str) -> str:
    return (
        f'<g class="transition" data-source="{_text(arrow.source)}" '
        f'data-target="{_text(arrow.target)}" data-event="{_text(arrow.event)}">'
        f'<path d="{arrow.path}" marker-end="url(#{marker})" {_ARROW}/>'
        f'<text x="{_n(arrow.label_x)}" y="{_n(arrow.label_y)}" {_LABEL} '
        f'text-anchor="{arrow.anchor}">{_text(arrow.label)}</text></g>'
    )


def _listed(machine: Machine, node: StateNode) -> tuple[str, ...]:
    """The lines naming a state's targetless transitions (bounded)."""
    lines = [
        "\u21ba " + _clip(_transition_label(machine.transitions[t]))
        for t in node.transitions
        if not machine.transitions[t].targets
    ]
    if len(lines) > MAX_LISTED:
        more = len(lines) - MAX_LISTED + 1
        lines = [*lines[: MAX_LISTED - 1], f"\u2026 {more} more"]
    return tuple(lines)


def _transition_label(transition: Transition) -> str:
    event = transition.event_text or ""
    if transition.cond is not None:
        condition = f"[{transition.cond.source}]"
        return f"{event} {condition}" if event else condition
    return event


def _notes(states_left: int, arrows_left: int) -> list[str]:
    notes = []
    if states_left > 0:
        notes.append(f"{states_left} more states are not drawn (at most {MAX_DRAWN_STATES})")
    if arrows_left > 0:
        notes.append(f"{arrows_left} more transitions are not drawn")
    return notes


def _kind(node: StateNode) -> str:
    if node.kind in ("parallel", "final", "history"):
        return node.kind
    return "compound" if node.is_compound else "atomic"


def _name(node: StateNode) -> str:
    return _clip(node.id) if node.id is not None else f"(state {node.index})"


def _rect(box: _Box, radius: int, paint: str, css: str | None = None) -> str:
    attr = f' class="{css}"' if css else ""
    return (
        f'<rect{attr} x="{box.x}" y="{box.y}" width="{box.w}" height="{box.h}" '
        f'rx="{radius}" ry="{radius}" {paint}/>'
    )


def _clip(text: str) -> str:
    # Control characters are not allowed in XML 1.0 text, escaped or not.
    text = "".join(c if c >= " " else " " for c in text)
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "\u2026"


def _text(text: str) -> str:
    return escape(text, quote=True)


def _n(value: float) -> str:
    """A coordinate, printed one way only."""
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"
