"""Benchmark: statechart event throughput of ``statifier.core`` against sismic and
python-statemachine, and the cost and size of ``statifier`` position round trips.

Run from the repository root, with the project installed (``pip install -e '.[bench]'``,
plus ``pip install sismic 'python-statemachine>=3.2'`` until those are in the ``bench``
extra; see ``bench/README.md``)::

    python bench/statecharts.py                 # full run: 7 repeats x 4000 events per engine
    python bench/statecharts.py --quick         # short run: 3 repeats x 800 events
    python bench/statecharts.py --json out.json # also write the numbers as JSON
    python bench/statecharts.py --profile       # cProfile of 20,000 statifier events instead

or without installing: ``PYTHONPATH=src python3 bench/statecharts.py``.

The chart, the same in every engine: a compound state ``c`` (children ``c1``, ``c2``)
beside a parallel state ``p`` with two regions, ``r1`` (``a1``, ``a2``) and ``r2``
(``b1``, ``b2``). Four transitions, all on the single event ``next``: ``c1 -> c2``,
``c2 -> p`` (entering ``a1`` and ``b1``), ``a1 -> a2`` (inside ``r1``), and one from
``p`` itself, guarded by "``a2`` is active", back to ``c`` (entering ``c1``). So every
four events run the cycle ``c1 -> c2 -> {a1,b1} -> {a2,b1} -> c1``: a sibling move,
entering a parallel state, a move inside one region, and leaving the parallel state
through a guarded transition on the parallel state itself (the guard is evaluated on
both events spent inside ``p``). ``b2`` is never entered. The guard is written in each
library's own way: ``In('a2')`` in SCXML and python-statemachine, ``active('a2')`` in
sismic. It costs an evaluation but does not decide the cycle: in ``{a1,b1}`` the
``a1 -> a2`` transition would win over ``p``'s anyway (a transition from a descendant
preempts a conflicting one from its ancestor), so the configuration check below would
not notice a guard that always held.

What it measures:

* Throughput: events per second for one running chart, one external ``next`` event at
  a time, each processed to completion (the macrostep). Engines, all in the same run:

  * ``statifier``: the chart compiled from SCXML once; per event
    ``state, effects = handle_event(state, Event("next"))``, threading the returned
    state (the core is pure: every event builds a new state). The ``Event`` is built
    per call, as the other engines build theirs from the event name.
  * ``sismic``: the chart in sismic's YAML format, ``Interpreter(chart,
    ignore_contract=True)``; per event ``queue("next")`` then ``execute_once()``. The
    chart has no contracts, so skipping contract checks changes nothing but speed.
  * ``sismic (contract checks on)``: the same with the constructor default
    ``ignore_contract=False``.
  * ``python-statemachine (StateChart)``: the chart as a ``StateChart`` class with
    ``State.Compound`` and ``State.Parallel``; per event ``send("next")``. ``StateChart``
    is the library's SCXML-conforming flavour, the one matching statifier's semantics.
  * ``python-statemachine (StateMachine)``: the same class body on the library's other
    base class, ``StateMachine`` (atomic configuration updates, callback errors raised
    instead of turned into ``error.execution`` events, events without a transition
    refused). None of that changes what this chart does, only what it costs.

  Within each repeat the engines take turns in chunks of 200 events (a multiple of the
  4-event cycle) in a rotating order, so drifting machine load hits them alike. The
  figure per engine is the median across repeats of its events per second; a goal
  against a library is judged against that library's faster row.

* The larger chart: the same engines, timing and goals on a chart of 40 states,
  generated for all three engines from one description (``large_tree``): ``idle``,
  then the parallel state ``run`` with the regions ``line`` (six compound stages of
  four steps, three levels below ``run``) and ``qa``, with guards and assignments on
  the datamodel (see the section "the larger chart"). The first 120 events are
  compared across engines, and each timed instance's final configuration against a
  fresh statifier instance run for as many events.

* Positions: for the statifier state after each of the 4 steps of the first cycle,
  ``statifier.core.positions.dump(state)`` (bytes) and ``load(machine, blob)``: the
  median time of a round trip ``load(machine, dump(state))`` in microseconds (dump and
  load are also timed alone) and the size of the dump in bytes. The size grows by one
  byte for each further decimal digit of the state's macrostep counter.

Before timing, every engine runs two cycles on a fresh instance and its leaf
configuration after each event is compared with statifier's (and statifier's with the
cycle above); after timing, each timed instance must be where the event count says.
Mismatches print a warning. The garbage collector is paused while a repeat is timed
(as ``timeit`` does); ``--gc`` keeps it running, closer to a long-lived service, where
collections triggered by each engine's allocations count against it. This is a
measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import cProfile
import operator
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial, reduce
from importlib import metadata
from typing import Any

# bench/ is on sys.path when this file is run as a script.
from harness import (
    RATE_COLUMNS,
    add_gc_option,
    add_json_option,
    add_profile_option,
    chunk_sizes,
    collector_paused,
    collector_state,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_profile,
    print_table_header,
    print_warnings,
    rate_cells,
    rate_stats,
    rotated,
    verdict,
    versions_line,
    write_json,
)

Leaves = tuple[str, ...]

EVENT = "next"
STATIFIER = "statifier"
SISMIC = "sismic"
SISMIC_CONTRACTS = "sismic (contract checks on)"
PSM = "python-statemachine"
PSM_CHART = "python-statemachine (StateChart)"
PSM_MACHINE = "python-statemachine (StateMachine)"

# The leaf configuration after 0, 1, 2, 3 events (and again every 4 events).
CYCLE: tuple[Leaves, ...] = (("c1",), ("c2",), ("a1", "b1"), ("a2", "b1"))

SCXML = """\
<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="c">
  <state id="c" initial="c1">
    <state id="c1"><transition event="next" target="c2"/></state>
    <state id="c2"><transition event="next" target="p"/></state>
  </state>
  <parallel id="p">
    <state id="r1">
      <state id="a1"><transition event="next" target="a2"/></state>
      <state id="a2"/>
    </state>
    <state id="r2">
      <state id="b1"/>
      <state id="b2"/>
    </state>
    <transition event="next" cond="In('a2')" target="c"/>
  </parallel>
</scxml>
"""

SISMIC_YAML = """\
statechart:
  name: bench
  root state:
    name: root
    initial: c
    states:
    - name: c
      initial: c1
      states:
      - name: c1
        transitions:
        - event: next
          target: c2
      - name: c2
        transitions:
        - event: next
          target: p
    - name: p
      parallel states:
      - name: r1
        initial: a1
        states:
        - name: a1
          transitions:
          - event: next
            target: a2
        - name: a2
      - name: r2
        initial: b1
        states:
        - name: b1
        - name: b2
      transitions:
      - event: next
        guard: active('a2')
        target: c
"""


@dataclass(frozen=True)
class Engine:
    """One running instance of the chart."""

    name: str
    library: str  # the distribution measured (goals compare against its fastest row)
    run: Callable[[int], None]  # process this many `next` events (the timed part)
    leaves: Callable[[], Leaves]  # the current leaf configuration, sorted
    note: str = ""


class UnavailableError(Exception):
    """The engine could not be imported or cannot express the chart."""


# --- engines ----------------------------------------------------------------------------


@cache
def statifier_machine() -> Any:
    from statifier.chart import compile_chart

    return compile_chart(SCXML)


def prepare_statifier() -> Engine:
    from statifier.core import Event, handle_event, initialize

    state, _ = initialize(statifier_machine())
    current = [state]

    def run(count: int) -> None:
        state = current[0]
        for _ in range(count):
            state, _effects = handle_event(state, Event(EVENT))
        current[0] = state

    return Engine(STATIFIER, STATIFIER, run, lambda: current[0].leaf_configuration())


def _prepare_sismic(name: str, *, check_contracts: bool, note: str) -> Engine:
    try:
        from sismic.interpreter import Interpreter
        from sismic.io import import_from_yaml
    except ImportError as error:
        raise UnavailableError(f"not installed ({error}); pip install sismic") from error
    chart = import_from_yaml(SISMIC_YAML)
    interpreter = Interpreter(chart, ignore_contract=not check_contracts)
    interpreter.execute_once()  # the initial step: enter c, c1
    leaf_names = frozenset(s for s in chart.states if not chart.children_for(s))
    queue, execute_once = interpreter.queue, interpreter.execute_once

    def run(count: int) -> None:
        for _ in range(count):
            queue(EVENT)
            execute_once()

    def leaves() -> Leaves:
        return tuple(sorted(s for s in interpreter.configuration if s in leaf_names))

    return Engine(name, SISMIC, run, leaves, note)


def prepare_sismic() -> Engine:
    return _prepare_sismic(
        SISMIC, check_contracts=False, note="Interpreter(ignore_contract=True); no contracts"
    )


def prepare_sismic_contracts() -> Engine:
    return _prepare_sismic(
        SISMIC_CONTRACTS,
        check_contracts=True,
        note="Interpreter() defaults: contracts checked (the chart has none)",
    )


@cache
def psm_chart_class(flavour: str) -> Any:
    """The chart as a python-statemachine class on the base class named ``flavour``."""
    try:
        import statemachine
        from statemachine import State
    except ImportError as error:
        raise UnavailableError(
            f"not installed ({error}); pip install python-statemachine"
        ) from error
    base = getattr(statemachine, flavour, None)
    if base is None or not hasattr(State, "Parallel"):
        raise UnavailableError(
            f"python-statemachine {metadata.version('python-statemachine')} has no {flavour} "
            "with State.Compound and State.Parallel (measured with 3.2)"
        )

    class Chart(base):  # type: ignore[misc, valid-type]
        # b2 is never entered, which the library's definition check refuses by default.
        validate_disconnected_states = False

        class c(State.Compound):  # noqa: N801 - state ids as in the SCXML chart
            c1 = State(initial=True)
            c2 = State()

        class p(State.Parallel):  # noqa: N801
            class r1(State.Compound):  # noqa: N801
                a1 = State(initial=True)
                a2 = State()

            class r2(State.Compound):  # noqa: N801
                b1 = State(initial=True)
                b2 = State()

        next = (  # the event's name is the attribute's
            c.c1.to(c.c2) | c.c2.to(p) | p.r1.a1.to(p.r1.a2) | p.to(c, cond="In('a2')")
        )

    return Chart


def _prepare_psm(name: str, flavour: str, note: str) -> Engine:
    machine = psm_chart_class(flavour)()
    send = machine.send

    def run(count: int) -> None:
        for _ in range(count):
            send(EVENT)

    def leaves() -> Leaves:
        return tuple(sorted(s.id for s in machine.configuration if not s.states))

    return Engine(name, PSM, run, leaves, note)


def prepare_psm_chart() -> Engine:
    return _prepare_psm(PSM_CHART, "StateChart", "SCXML-conforming flavour; send('next')")


def prepare_psm_machine() -> Engine:
    return _prepare_psm(
        PSM_MACHINE,
        "StateMachine",
        "non-SCXML flavour (atomic configuration update); send('next')",
    )


Prepare = Callable[[], Engine]  # a fresh instance, in the initial configuration

ENGINES: tuple[tuple[str, Prepare], ...] = (
    (STATIFIER, prepare_statifier),
    (SISMIC, prepare_sismic),
    (SISMIC_CONTRACTS, prepare_sismic_contracts),
    (PSM_CHART, prepare_psm_chart),
    (PSM_MACHINE, prepare_psm_machine),
)


# --- the larger chart -------------------------------------------------------------------
#
# One description, rendered for each engine so that the three stay the same chart: 40
# states under the root. ``idle`` moves on the first event to the parallel state ``run``,
# whose regions never leave it: ``line`` (six compound stages ``s1``..``s6`` of four
# atomic steps ``a``..``d``: three levels below ``run``) and ``qa`` (``watch``, and the
# compound ``check`` with ``c1``..``c4``). Every event is ``next``. Conditions read the
# datamodel and transition actions write it: a stage's last step moves on to the next
# stage if ``ok`` holds; ``s3d`` goes back to ``s3a`` while ``n < 2`` (adding 1 to ``n``)
# and on to ``s4`` once ``n >= 2`` (resetting ``n``); ``watch`` re-enters itself while
# ``k < 2`` (adding 1 to ``k``) and moves to ``check`` once ``k >= 2`` (resetting ``k``).
# Both regions take a transition on every event once in ``run``.

LARGE_STAGES = 6
LARGE_STEPS = ("a", "b", "c", "d")
LARGE_CHECKS = 4
# guard and action kinds: (SCXML, sismic, python-statemachine method body)
LARGE_GUARDS = {
    "ok": ("ok", "ok", "return self.dm_ok"),
    "n_low": ("n &lt; 2", "n < 2", "return self.dm_n < 2"),
    "n_high": ("n &gt;= 2", "n >= 2", "return self.dm_n >= 2"),
    "k_low": ("k &lt; 2", "k < 2", "return self.dm_k < 2"),
    "k_high": ("k &gt;= 2", "k >= 2", "return self.dm_k >= 2"),
}
LARGE_ACTIONS = {
    "n_inc": (("n", "n + 1"), "n = n + 1", "self.dm_n += 1"),
    "n_reset": (("n", "0"), "n = 0", "self.dm_n = 0"),
    "k_inc": (("k", "k + 1"), "k = k + 1", "self.dm_k += 1"),
    "k_reset": (("k", "0"), "k = 0", "self.dm_k = 0"),
}


@dataclass(frozen=True)
class Node:
    """A state of the larger chart: kind ``state`` (atomic or compound) or
    ``parallel``; the first child is the initial one."""

    id: str
    kind: str = "state"
    children: tuple[Node, ...] = ()
    # (target, guard kind or None, action kind or None), all on the event ``next``
    transitions: tuple[tuple[str, str | None, str | None], ...] = ()


def large_tree() -> tuple[Node, ...]:
    """The top-level states of the larger chart."""
    stages = []
    for i in range(1, LARGE_STAGES + 1):
        steps = []
        for j, step in enumerate(LARGE_STEPS):
            sid = f"s{i}{step}"
            if j + 1 < len(LARGE_STEPS):
                moves: tuple[tuple[str, str | None, str | None], ...] = (
                    (f"s{i}{LARGE_STEPS[j + 1]}", None, None),
                )
            elif i == 3:
                moves = (("s3a", "n_low", "n_inc"), ("s4", "n_high", "n_reset"))
            else:
                moves = ((f"s{i % LARGE_STAGES + 1}", "ok", None),)
            steps.append(Node(sid, transitions=moves))
        stages.append(Node(f"s{i}", children=tuple(steps)))
    checks = [
        Node(f"c{i}", transitions=((f"c{i + 1}" if i < LARGE_CHECKS else "watch", None, None),))
        for i in range(1, LARGE_CHECKS + 1)
    ]
    qa = Node(
        "qa",
        children=(
            Node(
                "watch", transitions=(("watch", "k_low", "k_inc"), ("check", "k_high", "k_reset"))
            ),
            Node("check", children=tuple(checks)),
        ),
    )
    run = Node("run", "parallel", (Node("line", children=tuple(stages)), qa))
    return (Node("idle", transitions=(("run", None, None),)), run)


def large_states(nodes: Sequence[Node]) -> list[Node]:
    return [n for node in nodes for n in (node, *large_states(node.children))]


def large_scxml() -> str:
    def render(node: Node, depth: int) -> list[str]:
        pad = "  " * depth
        tag = "parallel" if node.kind == "parallel" else "state"
        initial = f' initial="{node.children[0].id}"' if node.children and tag == "state" else ""
        lines = [f'{pad}<{tag} id="{node.id}"{initial}>']
        for target, guard, action in node.transitions:
            cond = f' cond="{LARGE_GUARDS[guard][0]}"' if guard else ""
            head = f'{pad}  <transition event="next"{cond} target="{target}"'
            if action:
                location, expr = LARGE_ACTIONS[action][0]
                lines += [
                    head + ">",
                    f'{pad}    <assign location="{location}" expr="{expr}"/>',
                    f"{pad}  </transition>",
                ]
            else:
                lines.append(head + "/>")
        for child in node.children:
            lines += render(child, depth + 1)
        lines.append(f"{pad}</{tag}>")
        return lines

    body = [line for node in large_tree() for line in render(node, 1)]
    return "\n".join(
        [
            '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">',
            '  <datamodel><data id="n" expr="0"/><data id="k" expr="0"/>\
<data id="ok" expr="true"/></datamodel>',
            *body,
            "</scxml>",
            "",
        ]
    )


def large_sismic_yaml() -> str:
    def render(node: Node, depth: int) -> list[str]:
        pad = "  " * depth
        lines = [f"{pad}- name: {node.id}"]
        if node.transitions:
            lines.append(f"{pad}  transitions:")
            for target, guard, action in node.transitions:
                lines += [f"{pad}  - event: next", f"{pad}    target: {target}"]
                if guard:
                    lines.append(f"{pad}    guard: {LARGE_GUARDS[guard][1]}")
                if action:
                    lines.append(f"{pad}    action: {LARGE_ACTIONS[action][1]}")
        if node.children:
            if node.kind == "parallel":
                lines.append(f"{pad}  parallel states:")
            else:
                lines += [f"{pad}  initial: {node.children[0].id}", f"{pad}  states:"]
            for child in node.children:
                lines += render(child, depth + 1)
        return lines

    body = [line for node in large_tree() for line in render(node, 2)]
    return "\n".join(
        [
            "statechart:",
            "  name: large",
            "  preamble: |",
            "    n = 0",
            "    k = 0",
            "    ok = True",
            "  root state:",
            "    name: root",
            "    initial: idle",
            "    states:",
            *body,
            "",
        ]
    )


@cache
def large_psm_class(flavour: str) -> Any:
    """The larger chart as a python-statemachine class on the base class ``flavour``,
    built from the same description (nested ``State.Compound`` and ``State.Parallel``
    classes, one ``next`` event joining every transition, guards and actions as
    methods on the machine, the datamodel as its attributes)."""
    try:
        import statemachine
        from statemachine import State
    except ImportError as error:
        raise UnavailableError(
            f"not installed ({error}); pip install python-statemachine"
        ) from error
    base = getattr(statemachine, flavour, None)
    if base is None or not hasattr(State, "Parallel"):
        raise UnavailableError(f"python-statemachine has no {flavour} with State.Parallel")

    def build(node: Node, initial: bool) -> Any:
        if not node.children:
            return State(initial=initial) if initial else State()
        kind = State.Parallel if node.kind == "parallel" else State.Compound
        body = {
            child.id: build(child, position == 0) for position, child in enumerate(node.children)
        }
        return type(node.id, (kind,), body)

    namespace: dict[str, Any] = {"validate_disconnected_states": False}
    tops = large_tree()
    for position, node in enumerate(tops):
        namespace[node.id] = build(node, position == 0)
    found: dict[str, Any] = {}

    def collect(owner: Any, nodes: Sequence[Node]) -> None:
        for node in nodes:
            state = found[node.id] = getattr(owner, node.id) if owner else namespace[node.id]
            collect(state, node.children)

    collect(None, tops)
    moves = []
    for node in large_states(tops):
        for target, guard, action in node.transitions:
            options: dict[str, Any] = {}
            if guard:
                options["cond"] = f"g_{guard}"
            if action:
                options["on"] = f"a_{action}"
            source = found[node.id]
            if target == node.id:
                moves.append(source.to.itself(**options))
            else:
                moves.append(source.to(found[target], **options))
    namespace["next"] = reduce(operator.or_, moves)
    scope: dict[str, Any] = {}
    for guard, (_, _, code) in LARGE_GUARDS.items():
        exec(f"def g_{guard}(self):\n    {code}\n", scope)
        namespace[f"g_{guard}"] = scope[f"g_{guard}"]
    for action, (_, _, code) in LARGE_ACTIONS.items():
        exec(f"def a_{action}(self):\n    {code}\n", scope)
        namespace[f"a_{action}"] = scope[f"a_{action}"]
    namespace.update(dm_n=0, dm_k=0, dm_ok=True)
    return type("Large", (base,), namespace)


@cache
def large_statifier_machine() -> Any:
    from statifier.chart import compile_chart

    return compile_chart(large_scxml())


def prepare_large_statifier() -> Engine:
    from statifier.core import Event, handle_event, initialize

    state, _ = initialize(large_statifier_machine())
    current = [state]

    def run(count: int) -> None:
        state = current[0]
        for _ in range(count):
            state, _effects = handle_event(state, Event(EVENT))
        current[0] = state

    return Engine(STATIFIER, STATIFIER, run, lambda: current[0].leaf_configuration())


def _prepare_large_sismic(name: str, *, check_contracts: bool, note: str) -> Engine:
    try:
        from sismic.interpreter import Interpreter
        from sismic.io import import_from_yaml
    except ImportError as error:
        raise UnavailableError(f"not installed ({error}); pip install sismic") from error
    chart = import_from_yaml(large_sismic_yaml())
    interpreter = Interpreter(chart, ignore_contract=not check_contracts)
    interpreter.execute_once()  # the initial step: enter idle
    leaf_names = frozenset(s for s in chart.states if not chart.children_for(s))
    queue, execute_once = interpreter.queue, interpreter.execute_once

    def run(count: int) -> None:
        for _ in range(count):
            queue(EVENT)
            execute_once()

    def leaves() -> Leaves:
        return tuple(sorted(s for s in interpreter.configuration if s in leaf_names))

    return Engine(name, SISMIC, run, leaves, note)


def _prepare_large_psm(name: str, flavour: str, note: str) -> Engine:
    machine = large_psm_class(flavour)()
    send = machine.send

    def run(count: int) -> None:
        for _ in range(count):
            send(EVENT)

    def leaves() -> Leaves:
        return tuple(sorted(s.id for s in machine.configuration if not s.states))

    return Engine(name, PSM, run, leaves, note)


LARGE_ENGINES: tuple[tuple[str, Prepare], ...] = (
    (STATIFIER, prepare_large_statifier),
    (
        SISMIC,
        partial(
            _prepare_large_sismic,
            SISMIC,
            check_contracts=False,
            note="Interpreter(ignore_contract=True); Python guards and actions",
        ),
    ),
    (
        SISMIC_CONTRACTS,
        partial(
            _prepare_large_sismic,
            SISMIC_CONTRACTS,
            check_contracts=True,
            note="Interpreter() defaults: contracts checked (the chart has none)",
        ),
    ),
    (
        PSM_CHART,
        partial(_prepare_large_psm, PSM_CHART, "StateChart", "guards and actions as methods"),
    ),
    (
        PSM_MACHINE,
        partial(_prepare_large_psm, PSM_MACHINE, "StateMachine", "guards and actions as methods"),
    ),
)
LARGE_CHECKED_EVENTS = 120  # events compared across engines before timing


# --- checking ---------------------------------------------------------------------------


def trace(prepare: Prepare, events: int) -> list[Leaves]:
    """Leaf configurations of a fresh instance: initially and after each event."""
    engine = prepare()
    seen = [engine.leaves()]
    for _ in range(events):
        engine.run(1)
        seen.append(engine.leaves())
    return seen


def check_traces(prepares: Sequence[tuple[str, Prepare]]) -> tuple[list[Leaves], list[str]]:
    """Two cycles on fresh instances; every engine against statifier, statifier against
    the documented cycle. Returns statifier's trace and the problems found."""
    events = 2 * len(CYCLE)
    reference = trace(prepare_statifier, events)
    problems = []
    expected = [CYCLE[i % len(CYCLE)] for i in range(events + 1)]
    if reference != expected:
        problems.append(f"statifier's trace {reference} is not the documented cycle {expected}")
    for name, prepare in prepares:
        if name == STATIFIER:
            continue
        got = trace(prepare, events)
        if got != reference:
            step = next(i for i, (a, b) in enumerate(zip(got, reference, strict=True)) if a != b)
            problems.append(
                f"{name} differs from statifier after {step} event(s): "
                f"{got[step]} instead of {reference[step]} (whole trace {got})"
            )
    return reference, problems


# --- measuring throughput ---------------------------------------------------------------

CHUNK = 200  # events per engine turn within a repeat; a multiple of the 4-event cycle
WARMUP = 400


def time_repeat(engines: Sequence[Engine], number: int, keep_gc: bool) -> dict[str, float]:
    """One repeat: ``number`` events per engine; returns events per second.

    The engines take turns chunk by chunk, in a rotating order, so that load from the
    rest of the machine is spread over all of them alike.
    """
    totals = {engine.name: 0 for engine in engines}
    clock = time.perf_counter_ns
    with collector_paused(keep_gc):
        for turn, size in enumerate(chunk_sizes(number, CHUNK)):
            for engine in rotated(engines, turn):
                start = clock()
                engine.run(size)
                totals[engine.name] += clock() - start
    return {name: number / (total / 1e9) for name, total in totals.items()}


def check_large_traces(
    prepares: Sequence[tuple[str, Prepare]],
) -> tuple[list[Leaves], list[str]]:
    """The larger chart: every engine against statifier over the first events."""
    reference = trace(prepare_large_statifier, LARGE_CHECKED_EVENTS)
    problems = []
    for name, prepare in prepares:
        if name == STATIFIER:
            continue
        got = trace(prepare, LARGE_CHECKED_EVENTS)
        if got != reference:
            step = next(i for i, (a, b) in enumerate(zip(got, reference, strict=True)) if a != b)
            problems.append(
                f"larger chart: {name} differs from statifier after {step} event(s): "
                f"{got[step]} instead of {reference[step]}"
            )
    return reference, problems


def measure_throughput(
    repeats: int, number: int, keep_gc: bool, *, large: bool = False
) -> dict[str, Any]:
    """Events per second of every engine on the reference chart (``large``: on the
    larger chart), all in one run."""
    prepares: list[tuple[str, Prepare]] = []
    unavailable: dict[str, str] = {}
    for name, prepare in LARGE_ENGINES if large else ENGINES:
        try:
            prepare()
        except UnavailableError as why:
            unavailable[name] = str(why)
            continue
        prepares.append((name, prepare))

    reference, problems = check_large_traces(prepares) if large else check_traces(prepares)

    engines = [prepare() for _, prepare in prepares]
    for engine in engines:
        engine.run(WARMUP)
    samples: dict[str, list[float]] = {engine.name: [] for engine in engines}
    for _ in range(repeats):
        for name, rate in time_repeat(engines, number, keep_gc).items():
            samples[name].append(rate)

    done = WARMUP + repeats * number
    if large:  # where a fresh statifier instance is after as many events
        fresh = prepare_large_statifier()
        fresh.run(done)
        final = fresh.leaves()
    for engine in engines:  # did the timed instances really run the cycle?
        want = final if large else CYCLE[done % len(CYCLE)]
        if engine.leaves() != want:
            problems.append(
                f"{engine.name} ended the timed run in {engine.leaves()}, not {want}, "
                f"after {done} events"
            )

    medians = {name: statistics.median(values) for name, values in samples.items()}
    mine = medians.get(STATIFIER)
    rows = []
    for engine in engines:
        rate = medians[engine.name]
        rows.append(
            {
                "engine": engine.name,
                "library": engine.library,
                "note": engine.note,
                **rate_stats(samples[engine.name]),
                # How many times more events per second statifier handles (>1: it wins).
                "statifier_speedup": (mine / rate if mine and engine.name != STATIFIER else None),
            }
        )
    return {
        "events_per_repeat": number,
        "warmup_events": WARMUP,
        "trace": [list(leaves) for leaves in reference],
        "rows": rows,
        "unavailable": unavailable,
        "problems": problems,
    }


# --- measuring positions ----------------------------------------------------------------


def measure_positions(repeats: int, number: int, keep_gc: bool) -> dict[str, Any]:
    """Round trips of the statifier state after each step of the first cycle."""
    from statifier.core import Event, handle_event, initialize
    from statifier.core.positions import dump, load

    machine = statifier_machine()
    state, _ = initialize(machine)
    states = []
    for _ in CYCLE:
        state, _effects = handle_event(state, Event(EVENT))
        states.append(state)

    problems = []
    for step, state in enumerate(states, 1):
        blob = dump(state)
        back = load(machine, blob)
        if back.leaf_configuration() != state.leaf_configuration() or dump(back) != blob:
            problems.append(f"step {step}: load(dump(state)) does not give the state back")

    def round_trip(state: Any, count: int) -> None:
        for _ in range(count):
            load(machine, dump(state))

    def dump_only(state: Any, count: int) -> None:
        for _ in range(count):
            dump(state)

    def load_only(blob: bytes, count: int) -> None:
        for _ in range(count):
            load(machine, blob)

    kinds: dict[str, Callable[[int], None]] = {}
    for step, state in enumerate(states, 1):
        blob = dump(state)
        kinds[f"round trip {step}"] = partial(round_trip, state)
        kinds[f"dump {step}"] = partial(dump_only, state)
        kinds[f"load {step}"] = partial(load_only, blob)
    for run in kinds.values():  # warm up
        run(min(number, 100))
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    clock = time.perf_counter_ns
    names = list(kinds)
    for repeat in range(repeats):
        with collector_paused(keep_gc):
            for name in rotated(names, repeat):
                start = clock()
                kinds[name](number)
                samples[name].append((clock() - start) / number / 1000)

    trips = [statistics.median(samples[f"round trip {step}"]) for step in range(1, len(states) + 1)]
    sizes = [len(dump(state)) for state in states]
    rows = []
    for step, state in enumerate(states, 1):
        rows.append(
            {
                "step": step,
                "leaves": list(state.leaf_configuration()),
                "size_bytes": sizes[step - 1],
                "round_trip_us": trips[step - 1],
                "dump_us": statistics.median(samples[f"dump {step}"]),
                "load_us": statistics.median(samples[f"load {step}"]),
                "round_trip_samples_us": samples[f"round trip {step}"],
            }
        )
    return {
        "round_trips_per_repeat": number,
        "rows": rows,
        "round_trip_us_max": max(trips),
        "round_trip_us_median": statistics.median(trips),
        "size_bytes_max": max(sizes),
        "size_bytes_median": statistics.median(sizes),
        "problems": problems,
    }


# --- profiling --------------------------------------------------------------------------


def profile(events: int, top: int = 15) -> None:
    """cProfile of ``events`` statifier ``handle_event`` calls on the chart."""
    engine = prepare_statifier()
    engine.run(WARMUP)
    profiler = cProfile.Profile()
    profiler.runcall(engine.run, events)
    print(f"cProfile: {events:,} statifier handle_event calls on the benchmark chart")
    print_profile(profiler, top)


# --- reporting --------------------------------------------------------------------------

GOALS = {SISMIC: 10.0, PSM: 15.0}  # statifier at least this many times the events/s
ROUND_TRIP_GOAL_US = 20.0
SIZE_GOAL_BYTES = 1000  # "under 1 KB", read strictly


DISTRIBUTIONS = ("statifier", "sismic", "python-statemachine")  # versions in the report


def best_speedups(throughput: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per library: its fastest row and statifier's speedup over it."""
    best: dict[str, dict[str, Any]] = {}
    for row in throughput["rows"]:
        library = row["library"]
        if library == STATIFIER:
            continue
        if library not in best or row["median_events_per_s"] > best[library]["median_events_per_s"]:
            best[library] = row
    return best


def print_rates(throughput: dict[str, Any]) -> None:
    print_table_header(f"{'engine':<38} {RATE_COLUMNS} {'statifier speedup':>18}")
    for row in throughput["rows"]:
        print(f"{row['engine']:<38} {rate_cells(row)} {fmt_ratio(row['statifier_speedup']):>18}")


def print_goals(throughput: dict[str, Any], label: str) -> None:
    best = best_speedups(throughput)
    mine = any(row["engine"] == STATIFIER for row in throughput["rows"])
    for library, goal in GOALS.items():
        if not mine:
            print(f"  {label}at least {goal:g}x {library}: not measured (statifier unavailable)")
        elif library not in best:
            print(f"  {label}at least {goal:g}x {library}: not measured (unavailable)")
        else:
            speedup = best[library]["statifier_speedup"]
            print(
                f"  {label}at least {goal:g}x the events/s of {library}: "
                f"{verdict(speedup >= goal)} "
                f"({speedup:.2f}x its fastest row, {best[library]['engine']})"
            )


def print_report(
    throughput: dict[str, Any],
    large: dict[str, Any],
    positions: dict[str, Any],
    info: dict[str, Any],
    repeats: int,
    number: int,
    keep_gc: bool,
) -> None:
    print(
        f"statecharts benchmark: {repeats} repeats x {number} '{EVENT}' events per engine, "
        f"garbage collector {collector_state(keep_gc)} while timing; {machine_summary(info)}"
    )
    print(versions_line(info))
    print("cycle (leaf configuration after 0..8 events, statifier): ", end="")
    print(" -> ".join("{" + ",".join(leaves) + "}" for leaves in throughput["trace"]))
    print()
    print_rates(throughput)
    print()
    print("'statifier speedup': statifier median events/s / engine median events/s.")
    for row in throughput["rows"]:
        if row["note"]:
            print(f"note {row['engine']}: {row['note']}")
    for name, why in throughput["unavailable"].items():
        print(f"unavailable {name}: {why}")
    print()
    print(
        f"larger chart ({len(large_states(large_tree()))} states, 3 levels below a parallel "
        f"state with 2 regions, datamodel guards and assignments), same engines and timing:"
    )
    print_rates(large)
    for row in large["rows"]:
        if row["note"] and row["library"] != STATIFIER:
            print(f"note {row['engine']}: {row['note']}")
    for name, why in large["unavailable"].items():
        print(f"unavailable {name}: {why}")

    print()
    print(
        f"positions (statifier, state after each step of the first cycle; "
        f"{positions['round_trips_per_repeat']} round trips per repeat, median us):"
    )
    print_table_header(
        f"{'step':>4} {'leaves':<10} {'dump bytes':>10} {'dump+load us':>13} "
        f"{'dump us':>8} {'load us':>8}"
    )
    for row in positions["rows"]:
        print(
            f"{row['step']:>4} {','.join(row['leaves']):<10} {row['size_bytes']:>10,} "
            f"{row['round_trip_us']:>13.1f} {row['dump_us']:>8.1f} {row['load_us']:>8.1f}"
        )
    print(
        f"round trip: max {positions['round_trip_us_max']:.1f} us, "
        f"median {positions['round_trip_us_median']:.1f} us; "
        f"size: max {positions['size_bytes_max']} bytes, "
        f"median {positions['size_bytes_median']:g} bytes"
    )

    print_warnings(throughput["problems"] + large["problems"] + positions["problems"])

    print()
    print("goals:")
    print_goals(throughput, "")
    print_goals(large, "larger chart: ")
    trip = positions["round_trip_us_max"]
    size = positions["size_bytes_max"]
    print(
        f"  position dump+load under {ROUND_TRIP_GOAL_US:g} us: "
        f"{verdict(trip < ROUND_TRIP_GOAL_US)} (worst step {trip:.1f} us)"
    )
    print(
        f"  position under 1 KB ({SIZE_GOAL_BYTES:,} bytes): "
        f"{verdict(size < SIZE_GOAL_BYTES)} (largest {size} bytes)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: 3 repeats x 800")
    parser.add_argument("--repeats", type=int, help="timed passes per engine (default 7)")
    parser.add_argument("--number", type=int, help="events per engine and pass (default 4000)")
    parser.add_argument(
        "--round-trips", type=int, help="position round trips per pass (default 1000)"
    )
    add_gc_option(parser)
    add_json_option(parser)
    add_profile_option(
        parser,
        "--profile",
        default=20_000,
        metavar="EVENTS",
        help_text="instead of timing, print a cProfile of statifier (default 20,000 events)",
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        if args.profile < 1:
            parser.error("--profile must be positive")
        profile(args.profile)
        return 0
    repeats = args.repeats or (3 if args.quick else 7)
    number = args.number or (800 if args.quick else 4000)
    round_trips = args.round_trips or (200 if args.quick else 1000)
    if repeats < 1 or number < 1 or round_trips < 1:
        parser.error("--repeats, --number and --round-trips must be positive")

    info = machine_info(DISTRIBUTIONS)
    throughput = measure_throughput(repeats, number, args.gc)
    large = measure_throughput(repeats, number, args.gc, large=True)
    positions = measure_positions(repeats, round_trips, args.gc)
    print_report(throughput, large, positions, info, repeats, number, args.gc)
    if args.json:
        document = {
            "repeats": repeats,
            "number": number,
            "round_trips": round_trips,
            "garbage_collector": collector_state(args.gc),
            "machine": info,
            "chart": {"scxml": SCXML, "sismic_yaml": SISMIC_YAML, "cycle": CYCLE},
            "goals": {
                "speedup": GOALS,
                "round_trip_us": ROUND_TRIP_GOAL_US,
                "size_bytes": SIZE_GOAL_BYTES,
            },
            "throughput": throughput,
            "large_chart": {
                "scxml": large_scxml(),
                "sismic_yaml": large_sismic_yaml(),
                "states": len(large_states(large_tree())),
                "throughput": large,
            },
            "positions": positions,
        }
        write_json(args.json, "statecharts", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
