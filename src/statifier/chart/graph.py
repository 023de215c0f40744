"""A chart as a diagram: Mermaid ``stateDiagram-v2`` or Graphviz DOT text.

Compound states nest, parallel regions are separated (Mermaid ``--``, DOT clusters),
final states lead to an end marker, and each transition is labelled with its events
and, in brackets, its condition.

>>> from statifier.chart import compile_chart
>>> chart = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<state id="a"><transition event="go" cond="ready" target="b"/></state>'
...     '<final id="b"/></scxml>'
... )
>>> print(mermaid(chart))
stateDiagram-v2
    [*] --> a
    a
    a --> b : go [ready]
    b
    b --> [*]
"""

from __future__ import annotations

from statifier.chart.model import Machine, StateNode, Transition

__all__ = ["dot", "mermaid"]


def _name(machine: Machine, index: int) -> str:
    state = machine.states[index]
    if state.id is not None and state.id.replace("_", "a").replace(".", "a").isalnum():
        return state.id
    return f"state_{index}"


def _mermaid_name(machine: Machine, index: int) -> str:
    name = _name(machine, index)
    return name if "." not in name else f"state_{index}"


def _label(transition: Transition) -> str:
    parts = []
    if transition.event_text:
        parts.append(" ".join(transition.event_text.split()))
    if transition.cond is not None:
        parts.append(f"[{transition.cond.source}]")
    return " ".join(parts).replace(":", "#58;")


def _initial_targets(machine: Machine, state: StateNode) -> tuple[int, ...]:
    if state.initial_transition is None:
        return ()
    return machine.transitions[state.initial_transition].targets


def mermaid(machine: Machine) -> str:
    """The chart as Mermaid ``stateDiagram-v2`` text."""
    lines = ["stateDiagram-v2"]
    _mermaid_children(machine, machine.states[0], lines, "    ")
    return "\n".join(lines)


def _mermaid_children(machine: Machine, parent: StateNode, lines: list[str], pad: str) -> None:
    for history in parent.histories:
        kind = "H*" if machine.states[history].history_deep else "H"
        lines.append(f'{pad}state "{kind}" as {_mermaid_name(machine, history)}')
    if parent.kind != "parallel":
        lines.extend(
            f"{pad}[*] --> {_mermaid_name(machine, target)}"
            for target in _initial_targets(machine, parent)
        )
    for position, child_index in enumerate(parent.children):
        child = machine.states[child_index]
        name = _mermaid_name(machine, child_index)
        if parent.kind == "parallel" and position:
            lines.append(f"{pad}--")
        if child.id is None or name != child.id:
            lines.append(f'{pad}state "{child.id or ""}" as {name}')
        if child.children:
            lines.append(f"{pad}state {name} {{")
            _mermaid_children(machine, child, lines, pad + "    ")
            lines.append(f"{pad}}}")
        else:
            lines.append(f"{pad}{name}")
        for t in child.transitions:
            transition = machine.transitions[t]
            label = _label(transition)
            suffix = f" : {label}" if label else ""
            lines.extend(
                f"{pad}{name} --> {_mermaid_name(machine, target)}{suffix}"
                for target in transition.targets or (child_index,)
            )
        if child.kind == "final":
            lines.append(f"{pad}{name} --> [*]")


_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})


def _quoted(text: str) -> str:
    """A DOT identifier: bare when DOT allows it, quoted otherwise (keywords, dots)."""
    bare = text.replace("_", "a")
    if (
        bare.isascii()
        and bare.isalnum()
        and not text[0].isdigit()
        and text.lower() not in _DOT_KEYWORDS
    ):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot(machine: Machine) -> str:
    """The chart as Graphviz DOT text (compound and parallel states are clusters)."""
    lines = [
        "digraph chart {",
        "    compound=true;",
        "    node [shape=box, style=rounded];",
        '    start [shape=point, label=""];',
    ]
    root = machine.states[0]
    _dot_children(machine, root, lines, "    ")
    lines.extend(
        f"    start -> {_anchor(machine, target)}{_lhead(machine, target)};"
        for target in _initial_targets(machine, root)
    )
    for transition in machine.transitions:
        source = machine.states[transition.source]
        if source.kind in ("scxml", "history") or transition.index == source.initial_transition:
            continue
        label = _label(transition).replace('"', '\\"')
        for target in transition.targets or (transition.source,):
            attributes = [f'label="{label}"'] if label else []
            if machine.states[transition.source].children:
                attributes.append(f"ltail={_cluster(machine, transition.source)}")
            if machine.states[target].children:
                attributes.append(f"lhead={_cluster(machine, target)}")
            suffix = f" [{', '.join(attributes)}]" if attributes else ""
            lines.append(
                f"    {_anchor(machine, transition.source)} -> {_anchor(machine, target)}{suffix};"
            )
    lines.append("}")
    return "\n".join(lines)


def _anchor(machine: Machine, index: int) -> str:
    name = _name(machine, index)
    return _quoted(f"{name}_anchor" if machine.states[index].children else name)


def _cluster(machine: Machine, index: int) -> str:
    return _quoted(f"cluster_{_name(machine, index)}")


def _lhead(machine: Machine, index: int) -> str:
    if machine.states[index].children:
        return f" [lhead={_cluster(machine, index)}]"
    return ""


def _dot_children(machine: Machine, parent: StateNode, lines: list[str], pad: str) -> None:
    for child_index in (*parent.children, *parent.histories):
        child = machine.states[child_index]
        label = (child.id or "").replace('"', '\\"')
        node = _anchor(machine, child_index)
        if child.children:
            style = "dashed" if child.kind == "parallel" else "rounded"
            lines.append(f"{pad}subgraph {_cluster(machine, child_index)} {{")
            lines.append(f'{pad}    label="{label}"; style={style};')
            lines.append(f'{pad}    {node} [shape=point, style=invis, label=""];')
            _dot_children(machine, child, lines, pad + "    ")
            lines.append(f"{pad}}}")
        elif child.kind == "final":
            lines.append(f'{pad}{node} [label="{label}", peripheries=2];')
        elif child.kind == "history":
            kind = "H*" if child.history_deep else "H"
            lines.append(f'{pad}{node} [label="{kind}", shape=circle];')
        else:
            lines.append(f'{pad}{node} [label="{label}"];')
