"""Selecting among enabled transitions that conflict: the interpreter's
``removeConflictingTransitions`` finds rivals through the transitions' domains; on
random charts with parallel states, history and internal transitions it must choose
exactly what the W3C Appendix D procedure, which compares exit sets pairwise, chooses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.chart import compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core.interpreter import _Interpreter

NS = "http://www.w3.org/2005/07/scxml"
EVENTS = ("a", "b", "c")


def appendix_d(self: _Interpreter, enabled: tuple[int, ...]) -> tuple[int, ...]:
    """The specification's procedure, word for word, without memoisation."""
    filtered: list[int] = []
    for t1 in enabled:
        t1_preempted = False
        to_remove: list[int] = []
        for t2 in filtered:
            if self.compute_exit_set([t1]) & self.compute_exit_set([t2]):
                if self.is_descendant(self.transitions[t1].source, self.transitions[t2].source):
                    to_remove.append(t2)
                else:
                    t1_preempted = True
                    break
        if not t1_preempted:
            for t3 in to_remove:
                filtered.remove(t3)
            filtered.append(t1)
    return tuple(filtered)


@st.composite
def charts(draw: st.DrawFn) -> str:
    """A random chart: compound and parallel states up to four deep, deep and shallow
    history, and transitions (external, internal or targetless) on a few events, each
    of which logs its name so that the chosen set shows in the effects."""
    ids: list[str] = []
    histories: list[str] = []

    def state(depth: int) -> str:
        name = f"s{len(ids)}"
        ids.append(name)
        kind = draw(
            st.sampled_from(("atomic", "compound", "parallel")) if depth < 4 else st.just("atomic")
        )
        if kind == "atomic":
            return f'<state id="{name}">{{transitions:{name}}}</state>'
        first = f"s{len(ids)}"
        children = [state(depth + 1) for _ in range(draw(st.integers(2, 3)))]
        history = ""
        if draw(st.booleans()):
            hid = f"h{len(histories)}"
            histories.append(hid)
            deep = draw(st.booleans())
            style = "deep" if deep else "shallow"
            default = f'<transition target="{first}"/>'
            history = f'<history id="{hid}" type="{style}">{default}</history>'
        tag = "parallel" if kind == "parallel" else "state"
        return f'<{tag} id="{name}">{history}{"".join(children)}{{transitions:{name}}}</{tag}>'

    body = "".join(state(1) for _ in range(draw(st.integers(1, 2))))
    targets = ids + histories
    for name in ids:
        transitions = []
        for number in range(draw(st.integers(0, 3))):
            event = draw(st.sampled_from(EVENTS))
            label = f"{name}.{number}"
            log = f"<log label='{label}'/>"
            target = draw(st.one_of(st.none(), st.sampled_from(targets)))
            where = "" if target is None else f' target="{target}"'
            internal = ' type="internal"' if draw(st.booleans()) else ""
            transitions.append(f'<transition event="{event}"{where}{internal}>{log}</transition>')
        body = body.replace(f"{{transitions:{name}}}", "".join(transitions))
    return f'<scxml xmlns="{NS}" version="1.0">{body}</scxml>'


@settings(max_examples=300, deadline=None, database=None)
@given(chart=charts(), events=st.lists(st.sampled_from(EVENTS), max_size=12))
def test_the_chosen_transitions_are_appendix_ds(chart: str, events: list[str]) -> None:
    machine = compile_chart(chart)
    reference = compile_chart(chart)  # its own memo tables
    options = StartOptions(session_id="conflicts", trace=True)
    ours, _ = initialize(machine, options)
    theirs, _ = initialize(reference, options)
    for name in events:
        ours, our_effects = handle_event(ours, Event(name))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_Interpreter, "remove_conflicting_transitions", appendix_d)
            theirs, their_effects = handle_event(theirs, Event(name))
        assert our_effects == their_effects
        assert ours.configuration == theirs.configuration
        assert ours.history == theirs.history


def test_a_wide_parallel_state_selects_one_transition_per_region() -> None:
    regions = "".join(
        f'<state id="r{i}"><state id="a{i}"><transition event="go" target="b{i}"/></state>'
        f'<state id="b{i}"><transition event="out" target="z"/></state></state>'
        for i in range(300)
    )
    chart = compile_chart(
        f'<scxml xmlns="{NS}" version="1.0"><parallel id="p">{regions}</parallel>'
        '<state id="z"/></scxml>'
    )
    state, _ = initialize(chart)
    calls = 0
    exit_set = _Interpreter.compute_exit_set

    def counted(self: _Interpreter, transitions: object) -> set[int]:
        nonlocal calls
        calls += 1
        return exit_set(self, transitions)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Interpreter, "compute_exit_set", counted)
        state, _ = handle_event(state, Event("go"))
        entered = {chart.states[s].id for s in state.configuration}
        assert entered >= {f"b{i}" for i in range(300)}
        # One exit set for the microstep, not one per pair of the 300 transitions.
        assert calls <= 2
        state, _ = handle_event(state, Event("out"))
    assert [chart.states[s].id for s in state.configuration if s] == ["z"]
