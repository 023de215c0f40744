"""Benchmark: one step of a parallel state with many regions, against the W3C
Appendix D selection of conflicting transitions run in the same process.

Run from the repository root::

    PYTHONPATH=src python3 bench/wide.py            # regions 100, 400, 1600 (anchor to 800)
    PYTHONPATH=src python3 bench/wide.py --regions 100 200 400 800 3200 12800

The chart: a parallel state ``p`` of n regions, each ``a<i> -> b<i>`` on ``go`` and
``b<i> -> a<i>`` on ``back``, and in every ``b<i>`` a transition on ``out`` to a state
``z`` beside ``p`` (n transitions that all conflict). Rows: the milliseconds of one
``handle_event`` for ``go`` (n transitions, none in conflict), ``back`` and ``out``
(n in conflict, the first wins), each the median of three steps on fresh charts.

``anchor`` runs the same steps with ``removeConflictingTransitions`` as the
specification writes it (each pair of enabled transitions compares exit sets: n^2
exit sets of up to n states); ``statifier`` is the interpreter's own, which finds
rivals through the transitions' domains. Both must reach the same configurations; the
anchor is skipped past 800 regions (it takes minutes there). A charts' size limit of
100,000 elements allows about 20,000 regions: the last rows show what such an
untrusted chart costs a step. This is a measurement, not a test: it asserts only that
both selections agree.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from harness import machine_info, machine_summary, new_parser

NS = "http://www.w3.org/2005/07/scxml"
ANCHOR_LIMIT = 800


def chart_text(regions: int) -> str:
    body = "".join(
        f'<state id="r{i}"><state id="a{i}"><transition event="go" target="b{i}"/></state>'
        f'<state id="b{i}"><transition event="back" target="a{i}"/>'
        f'<transition event="out" target="z"/></state></state>'
        for i in range(regions)
    )
    states = f'<parallel id="p">{body}</parallel><state id="z"/>'
    return f'<scxml xmlns="{NS}" version="1.0">{states}</scxml>'


def appendix_d(self: Any, enabled: tuple[int, ...]) -> tuple[int, ...]:
    """``removeConflictingTransitions`` as the specification writes it."""
    filtered: list[int] = []
    for t1 in enabled:
        preempted = False
        to_remove: list[int] = []
        for t2 in filtered:
            if self.compute_exit_set([t1]) & self.compute_exit_set([t2]):
                if self.is_descendant(self.transitions[t1].source, self.transitions[t2].source):
                    to_remove.append(t2)
                else:
                    preempted = True
                    break
        if not preempted:
            for t3 in to_remove:
                filtered.remove(t3)
            filtered.append(t1)
    return tuple(filtered)


def steps(regions: int) -> tuple[dict[str, float], list[frozenset[int]]]:
    """Milliseconds per event (median of three fresh runs) and the configurations."""
    from statifier.chart import compile_chart
    from statifier.core import Event, handle_event, initialize

    times: dict[str, list[float]] = {"go": [], "back": [], "out": []}
    configurations: list[frozenset[int]] = []
    for _ in range(3):
        state, _effects = initialize(compile_chart(chart_text(regions)))
        configurations = []
        for timed, name in ((True, "go"), (True, "back"), (False, "go"), (True, "out")):
            started = time.perf_counter()
            state, _effects = handle_event(state, Event(name))
            spent = (time.perf_counter() - started) * 1000
            configurations.append(state.configuration)
            if timed:
                times[name].append(spent)
    return {name: statistics.median(spent) for name, spent in times.items()}, configurations


def with_selection(selection: Callable[..., tuple[int, ...]], regions: int) -> Any:
    from statifier.core.interpreter import _Interpreter

    own = _Interpreter.remove_conflicting_transitions
    _Interpreter.remove_conflicting_transitions = selection  # type: ignore[method-assign]
    try:
        return steps(regions)
    finally:
        _Interpreter.remove_conflicting_transitions = own  # type: ignore[method-assign]


def main() -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--regions", type=int, nargs="+", default=[100, 400, 1600])
    args = parser.parse_args()
    print(machine_summary(machine_info([])))
    print(f"{'regions':>8} {'event':>6} {'statifier ms':>13} {'anchor ms':>10} {'ratio':>7}")
    for regions in args.regions:
        ours, our_configurations = steps(regions)
        theirs: dict[str, float] = {}
        if regions <= ANCHOR_LIMIT:
            theirs, their_configurations = with_selection(appendix_d, regions)
            if their_configurations != our_configurations:
                print(f"MISMATCH at {regions} regions: the selections disagree")
                return 1
        for name, spent in ours.items():
            anchor = theirs.get(name)
            shown = "-" if anchor is None else f"{anchor:10.1f}"
            ratio = "-" if anchor is None else f"{anchor / spent:6.1f}x"
            print(f"{regions:>8} {name:>6} {spent:13.2f} {shown:>10} {ratio:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
