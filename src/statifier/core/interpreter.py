"""The interpreter: W3C SCXML Appendix D, procedure for procedure, as pure functions.

:func:`initialize` and :func:`handle_event` take a position and return a new one with
the effects the step produced; they never change their input, read a clock, draw
randomness or perform I/O. Internally one step works on a :class:`_Interpreter`, a
private mutable copy of the position whose methods carry the Appendix D names
(``enter_states``, ``compute_exit_set``, ``remove_conflicting_transitions`` ...), so the
code can be read side by side with the Recommendation.

Two departures from the pseudocode are deliberate and documented: the core takes one
external event per call (the caller owns the external queue), and a macrostep is
bounded by a round budget, answering :class:`~statifier.core.effects.BudgetExhausted`
instead of running forever.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from statifier.chart import model as m
from statifier.core import effects as fx
from statifier.core.content import ConditionContext, ContentRunner
from statifier.core.events import Event
from statifier.core.memo import KEY as MEMO_KEY
from statifier.core.memo import ChartMemo, EntryPlan, ExitPlan, StepPlan, tables_for
from statifier.core.state import MachineState, StartOptions
from statifier.expr import UNDEFINED, Value

__all__ = [
    "MachineNotRunning",
    "cancel",
    "deliver_internal",
    "handle_event",
    "initialize",
    "macrostep",
    "microstep",
]

DEFAULT_START = StartOptions()


class MachineNotRunning(Exception):  # noqa: N818 - names the condition
    """The position has finished (reached a top-level final state or was cancelled)."""


def initialize(
    machine: m.Machine, options: StartOptions = DEFAULT_START
) -> tuple[MachineState, list[fx.Effect]]:
    """Start ``machine``: build the datamodel, run global scripts, enter the initial
    configuration and run to the first stable configuration (Appendix D ``interpret``).
    """
    work = _Interpreter.fresh(machine, options)
    work.interpret(options.datamodel)
    return work.freeze(), work.effects


def handle_event(state: MachineState, event: Event) -> tuple[MachineState, list[fx.Effect]]:
    """Process one external event to completion (the tail of ``mainEventLoop``).

    Raises:
        MachineNotRunning: ``state`` has finished.
    """
    if not state.running:
        raise MachineNotRunning("the chart has finished; it takes no more events")
    machine = state.machine
    tables = machine.memo.get(MEMO_KEY) or tables_for(machine)
    # A position between macrosteps with nothing pending, no invocation and no trace:
    # the macrostep may be one the chart alone decides (see StepPlan), possibly once
    # the conditions of its selection are tested.
    idle = not (state.internal_queue or state.invocations or state.states_to_invoke or state.trace)
    selected: tuple[int, ...] | None = None
    if idle:
        key = (state.configuration, event.name)
        plan = tables.steps.get(key)
        if plan is not None:
            if state.round_budget is None or state.round_budget >= plan.rounds:
                after = _take_step(state, event, plan, _with_event(state.datamodel, event))
                return after, _plan_effects(after, event, plan)
        else:
            candidates = tables.guards.get(key)
            if candidates is not None:
                datamodel = _with_event(state.datamodel, event)
                selected = _test_guards(state, candidates, datamodel, tables)
                if selected is not None:
                    plan = tables.outcomes.get((*key, selected))
                    if plan is not None and (
                        state.round_budget is None or state.round_budget >= plan.rounds
                    ):
                        after = _take_step(state, event, plan, datamodel)
                        return after, _plan_effects(after, event, plan)
    work = _Interpreter.resume(state)
    work.external_event(event, selected)
    if idle:
        work.remember_step(event.name)
    return work.freeze(), work.effects


def _plan_effects(after: MachineState, event: Event, plan: StepPlan) -> list[fx.Effect]:
    """The effects of a macrostep a memoised plan took: none, but the
    :class:`~statifier.core.effects.Unmatched` of an event that took no transition
    (a plan is memoised only for a step with no other effect)."""
    if plan.microsteps:
        return []
    return [fx.Unmatched(macrostep=after.macrostep, microstep=0, round=0, event=event.name)]


def _with_event(datamodel: Mapping[str, Value], event: Event) -> dict[str, Value]:
    """A copy of ``datamodel`` whose ``_event`` is ``event``: what the datamodel is
    once an external event is dequeued."""
    copy = dict(datamodel)
    copy["_event"] = event.as_value()
    return copy


def _condition_context(
    tables: ChartMemo, machine: m.Machine, configuration: frozenset[int]
) -> ConditionContext:
    """The context conditions are tested in from ``configuration``, built once."""
    context = tables.contexts.get(configuration)
    if context is None:
        context = tables.contexts.put(configuration, ConditionContext(machine, configuration))
    return context


class _Undecided(Exception):  # noqa: N818 - internal control flow
    """A condition :func:`_test_guards` tested would raise ``error.execution``."""


def _test_guards(
    state: MachineState,
    candidates: tuple[tuple[int, ...], ...],
    datamodel: Mapping[str, Value],
    tables: ChartMemo,
) -> tuple[int, ...] | None:
    """The transitions ``selectTransitions`` enables from an idle ``state`` (before
    conflicts are removed), testing the conditions of ``candidates`` (the memoised
    selection candidates) in the same order against ``datamodel`` (``_event`` already
    set) and the configuration, without building a working interpreter; or None if a
    condition would raise ``error.execution``, which is left to the working
    interpreter (it tests again and raises the error).

    Why: a step whose structure the memo decided but whose conditions must be tested
    every time (``In('a2')`` on the benchmark chart) otherwise pays for copying the
    position into a working interpreter and back just to test them."""
    context = _condition_context(tables, state.machine, state.configuration)

    def holds(transition: m.Transition) -> bool:
        assert transition.cond is not None
        value = context.holds(transition.cond, datamodel)
        if value is None:
            raise _Undecided
        return value

    try:
        return enabled_transitions(candidates, state.machine.transitions, holds)
    except _Undecided:
        return None


def enabled_transitions(
    selection: tuple[tuple[int, ...], ...],
    transitions: tuple[m.Transition, ...],
    holds: Callable[[m.Transition], bool],
) -> tuple[int, ...]:
    """The loop of Appendix D ``selectTransitions``: for each active atomic state in
    document order (``selection``: their candidates, nearest first), the first
    transition whose condition ``holds``; before conflicts are removed."""
    enabled: dict[int, None] = {}
    for candidates in selection:
        for t in candidates:
            transition = transitions[t]
            # A transition already selected through another state of a parallel
            # region is not tested again: its condition held and has no effects.
            if t in enabled or transition.cond is None or holds(transition):
                enabled[t] = None
                break
    return tuple(enabled)


def _take_step(
    state: MachineState, event: Event, plan: StepPlan, datamodel: dict[str, Value]
) -> MachineState:
    """The position after a macrostep the chart alone decided, as the procedures
    would leave it: only the configuration, the history values the exit recorded, the
    states ever entered, ``_event`` (``datamodel`` has it) and the counters change."""
    entered = state.entered
    if not plan.entries <= entered:
        entered = entered | plan.entries
    (
        machine,
        _,
        queue,
        history,
        _,
        states_to_invoke,
        invocations,
        _,
        session_id,
        macrostep,
        _,
        _,
        *rest,
    ) = state
    # Positional, in MachineState's field order, as freeze() builds it.
    return _make_state(
        (
            machine,
            plan.after,
            queue,
            {**history, **dict(plan.records)} if plan.records else history,
            entered,
            states_to_invoke,
            invocations,
            datamodel,
            session_id,
            macrostep + 1,
            plan.microsteps,
            plan.rounds,
            *rest,
        )
    )


def deliver_internal(
    state: MachineState, event: Event, *more: Event
) -> tuple[MachineState, list[fx.Effect]]:
    """Put ``event`` (and ``more``, in order) on the internal queue and run to a stable
    configuration.

    This is how a host delivers what belongs on the internal queue but arrives later:
    a delayed ``<send target="#_internal">`` when its timer fires, or an
    ``error.communication`` for a send it could not deliver.

    Raises:
        MachineNotRunning: ``state`` has finished.
    """
    if not state.running:
        raise MachineNotRunning("the chart has finished; it takes no more events")
    work = _Interpreter.resume(state)
    work.begin_macrostep()
    work.internal_queue.append(event)
    work.internal_queue.extend(more)
    work.main_event_loop()
    return work.freeze(), work.effects


def macrostep(state: MachineState) -> tuple[MachineState, list[fx.Effect]]:
    """Run pending internal events and eventless transitions to a stable configuration."""
    if not state.running:
        raise MachineNotRunning("the chart has finished")
    work = _Interpreter.resume(state)
    work.begin_macrostep()
    work.main_event_loop()
    return work.freeze(), work.effects


def microstep(state: MachineState) -> tuple[MachineState, list[fx.Effect], bool]:
    """One round, for step debuggers: take the enabled eventless transitions, or else
    dequeue one internal event and take the transitions it enables.

    Returns the new state, the round's effects and whether the state was already
    stable (nothing to do).
    """
    if not state.running:
        raise MachineNotRunning("the chart has finished")
    work = _Interpreter.resume(state)
    stable = not work.round_once()
    if not work.running:
        work.exit_interpreter()
    elif stable:
        work.invoke_pass()  # the macrostep ends here: start its invocations
    return work.freeze(), work.effects, stable


def cancel(state: MachineState) -> tuple[MachineState, list[fx.Effect]]:
    """Stop the chart from outside: exit every active state (running their onexit
    content and cancelling invocations) and finish without donedata."""
    if not state.running:
        raise MachineNotRunning("the chart has finished")
    work = _Interpreter.resume(state)
    work.begin_macrostep()
    work.running = False
    work.exit_interpreter()
    return work.freeze(), work.effects


_NOTHING: frozenset[int] = frozenset()
_make_state = MachineState._make


class _Interpreter(ContentRunner):
    """One step's working copy of a position, with the Appendix D procedures."""

    history_reads = 0  # how often history was consulted: memoise only what did not
    original: MachineState | None = None  # the state a step resumed from
    tables: ChartMemo  # the machine's memo tables (see statifier.core.memo)
    # The configuration as a frozenset while it is known (None once it was changed and
    # not yet frozen again): the memo tables' key, and what freeze() stores.
    frozen: frozenset[int] | None = None
    # What a step did besides the structural work, for remember_step().
    conditions_tested = 0
    ran_content = False
    # The last selection: its candidates, and what it enabled before conflicts were
    # removed. The external event's is kept for remember_step(), with whether it
    # tested conditions, how many had been tested once it was done, and whether it
    # raised an error.
    last_selection: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]] = ((), ())
    external_selection: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]] = ((), ())
    guarded = False
    tested_by_selection = 0
    selection_raised = False
    last_exit: ExitPlan | None = None
    last_entry: EntryPlan | None = None

    # -- construction and freezing ----------------------------------------------------

    @classmethod
    def fresh(cls, machine: m.Machine, options: StartOptions) -> _Interpreter:
        work = cls(machine)
        work.tables = tables_for(machine)
        work.session_id = options.session_id
        work.trace = options.trace
        work.round_budget = options.round_budget
        work.send_types = options.send_types
        work.invoke_types = options.invoke_types
        work.routes = options.routes
        return work

    @classmethod
    def resume(cls, state: MachineState) -> _Interpreter:
        machine = state.machine
        # Every field of the position is set below: skip the defaults __init__ sets.
        work = cls.__new__(cls)
        work.bind(machine)
        work.tables = machine.memo.get(MEMO_KEY) or tables_for(machine)
        (
            _,
            configuration,
            queue,
            work.history,
            entered,
            states_to_invoke,
            work.invocations,
            datamodel,
            work.session_id,
            work.macrostep,
            work.microstep_count,
            work.round,
            work.send_counter,
            work.invoke_counter,
            work.timer_counter,
            work.running,
            work.trace,
            work.round_budget,
            work.send_types,
            work.invoke_types,
            work.routes,
        ) = state
        work.configuration = set(configuration)
        work.frozen = configuration
        work.internal_queue = deque(queue)
        work.entered = set(entered)
        work.states_to_invoke = set(states_to_invoke)
        work.datamodel = dict(datamodel)
        work.original = state
        return work

    def freeze(self) -> MachineState:
        # The step is over: drop the options that point back at this object, so the
        # work is freed by reference counting rather than left to the cycle collector.
        self._options = None
        original = self.original
        entered = self.entered
        states_to_invoke = self.states_to_invoke
        frozen = self.frozen
        # Positional, in MachineState's field order (cheaper than keywords: every step
        # builds one); resume() unpacks in the same order.
        return _make_state(
            (
                self.machine,
                frozenset(self.configuration) if frozen is None else frozen,
                tuple(self.internal_queue) if self.internal_queue else (),
                self.history,
                original.entered
                if original and len(entered) == len(original.entered)
                else frozenset(entered),
                frozenset(states_to_invoke) if states_to_invoke else _NOTHING,
                self.invocations,
                self.datamodel,
                self.session_id,
                self.macrostep,
                self.microstep_count,
                self.round,
                self.send_counter,
                self.invoke_counter,
                self.timer_counter,
                self.running,
                self.trace,
                self.round_budget,
                self.send_types,
                self.invoke_types,
                self.routes,
            )
        )

    def configuration_key(self) -> frozenset[int]:
        """The configuration as a frozenset: the key of the memo tables. While the
        configuration is one a memo table handed out, it is that very object, so
        lookups compare by identity and successive states share it."""
        frozen = self.frozen
        if frozen is None:
            frozen = self.frozen = frozenset(self.configuration)
        return frozen

    # -- counters ----------------------------------------------------------------------

    def begin_macrostep(self) -> None:
        self.macrostep += 1
        self.microstep_count = 0
        self.round = 0

    def begin_microstep(self) -> None:
        self.microstep_count += 1

    # -- interpret and the event loop -------------------------------------------------

    def interpret(self, overrides: Mapping[str, Value]) -> None:
        """Appendix D ``interpret``, up to the first stable configuration."""
        self.begin_macrostep()
        self.begin_microstep()
        self.initialize_datamodel(overrides)
        self.running = True
        for script in self.machine.scripts:
            self.execute_content((script,), "script")
        root = self.states[0]
        assert root.initial_transition is not None
        self.enter_states((root.initial_transition,))
        self.main_event_loop()

    def external_event(self, event: Event, selected: tuple[int, ...] | None = None) -> None:
        """The external-event tail of ``mainEventLoop``, then the next macrostep.

        Internal events left by a macrostep that ran out of budget are processed
        first, with a fresh budget, since an external event is only taken once the
        internal queue is empty. ``selected``: the transitions the event enables
        (before conflicts are removed) when :func:`handle_event` already tested the
        conditions of the selection; they are not tested again.
        """
        if self.internal_queue:
            self.begin_macrostep()
            self.main_event_loop()
            if not self.running:
                self.emit(fx.Unmatched, event=event.name)
                return
        self.begin_macrostep()
        if self.trace:
            self.emit(fx.TraceEventDequeued, event=event, queue="external")
        self.datamodel["_event"] = event.as_value()
        if self.invocations or self.trace:
            self.finalize_and_autoforward(event)
        tested, queued = self.conditions_tested, len(self.internal_queue)
        enabled = self.select_transitions(event, selected)
        self.external_selection = self.last_selection
        self.guarded = selected is not None or self.conditions_tested != tested
        self.tested_by_selection = self.conditions_tested
        self.selection_raised = len(self.internal_queue) != queued
        if enabled:
            self.begin_microstep()
            self.microstep(enabled)
        else:
            self.emit(fx.Unmatched, event=event.name)
        self.main_event_loop()

    def remember_step(self, event: str) -> None:
        """After :meth:`external_event` from an idle position: store the macrostep as
        a :class:`~statifier.core.memo.StepPlan` if the chart alone decided it (at most
        one microstep, no content run, no history consulted, nothing queued or
        invoked, no effect, still running, and no condition tested but by the
        selection of the external event, which raised no error).

        A selection that tested no condition makes the plan the whole step (table
        ``steps``); one that tested conditions makes it the rest of the step for what
        they enabled (``outcomes``, beside the candidates in ``guards``), and
        :func:`handle_event` tests them again on every event."""
        effects = self.effects
        if (
            (effects and not (len(effects) == 1 and type(effects[0]) is fx.Unmatched))
            or self.conditions_tested != self.tested_by_selection
            or self.selection_raised
            or self.ran_content
            or self.history_reads
            or self.internal_queue
            or self.states_to_invoke
            or self.invocations
            or not self.running
            or self.microstep_count > 1
            or self.original is None
        ):
            return
        exits, entries = self.last_exit, self.last_entry
        if self.microstep_count == 1 and (exits is None or entries is None):
            return
        plan = StepPlan(
            after=self.configuration_key(),
            records=exits.records if exits is not None else (),
            entries=frozenset(entries.ordered) if entries is not None else _NOTHING,
            microsteps=self.microstep_count,
            rounds=self.round,
        )
        key = (self.original.configuration, event)
        if self.guarded:
            candidates, selected = self.external_selection
            self.tables.guards.put(key, candidates)
            self.tables.outcomes.put((*key, selected), plan)
        else:
            self.tables.steps.put(key, plan)

    def main_event_loop(self) -> None:
        """Appendix D ``mainEventLoop`` for the current macrostep: eventless and internal
        transitions to quiescence, the invoke pass, and again while it raised events."""
        budget = self.round_budget
        spent = 0
        while True:
            while self.running:
                if budget is not None and spent >= budget:
                    self.emit(
                        fx.BudgetExhausted,
                        configuration=self.leaf_ids(),
                        budget=budget,
                        pending_internal_events=len(self.internal_queue),
                    )
                    return
                spent += 1
                if not self.round_once():
                    break
            if not self.running:
                self.exit_interpreter()
                return
            self.invoke_pass()
            if self.internal_queue:
                continue
            if self.trace:
                self.emit(fx.TraceMacrostepStable, configuration=tuple(sorted(self.configuration)))
            return

    def round_once(self) -> bool:
        """One round of the inner loop; False when nothing was left to do."""
        self.round += 1
        enabled = self.select_eventless_transitions()
        if not enabled:
            if not self.internal_queue:
                return False
            event = self.internal_queue.popleft()
            if self.trace:
                self.emit(fx.TraceEventDequeued, event=event, queue="internal")
            self.datamodel["_event"] = event.as_value()
            enabled = self.select_transitions(event)
            if _is_error(event):
                self.emit(fx.ChartError, event=event, taken=bool(enabled))
        if enabled:
            self.begin_microstep()
            self.microstep(enabled)
        return True

    def exit_interpreter(self) -> None:
        """Appendix D ``exitInterpreter``: exit everything; report done."""
        final_configuration = self.leaf_ids()
        donedata: Value = UNDEFINED
        self.frozen = None  # the configuration changes below
        for s in sorted(self.configuration, reverse=True):
            node = self.states[s]
            for ordinal, block in enumerate(node.onexit):
                self.execute_content(block, f"onexit:{s}:{ordinal}")
            self.cancel_invokes(s)
            self.configuration.discard(s)
            if node.kind == "final" and node.parent == 0:
                donedata = self.done_data(node)
        self.running = False
        self.states_to_invoke.clear()
        # Error events the chart raised but will never take: reported all the same.
        for event in self.internal_queue:
            if _is_error(event):
                self.emit(fx.ChartError, event=event, taken=False)
        if self.trace:
            self.emit(fx.TraceDone, donedata=donedata, configuration=())
        self.emit(fx.Done, donedata=donedata, configuration=final_configuration)

    # -- selection -------------------------------------------------------------------
    #
    # Which transitions an event can select is decided by the chart, the active atomic
    # states and the event's name; only the conditions depend on the datamodel. The
    # structural part is memoised (``candidates`` per state and name, ``selection`` per
    # configuration and name); the conditions are tested on every event.

    def atomic_states(self) -> list[int]:
        states = self.states
        return sorted(s for s in self.configuration if states[s].is_atomic)

    def candidates(self, state: int, event: str | None) -> tuple[int, ...]:
        """The transitions of ``state`` and its ancestors, nearest first and in document
        order, that ``event`` (``None``: no event) would select if their condition
        held. A pure function of the chart, so it is computed once per state and name."""
        key = (state, event)
        found = self.tables.candidates.get(key)
        if found is not None:
            return found
        tokens = event.split(".") if event is not None else None
        matching = []
        for s in (state, *self.states[state].ancestors):
            for t in self.states[s].transitions:
                events = self.transitions[t].events
                if (not events) if tokens is None else (events and name_match(events, tokens)):
                    matching.append(t)
        return self.tables.candidates.put(key, tuple(matching))

    def selection_candidates(self, event: str | None) -> tuple[tuple[int, ...], ...]:
        """For each active atomic state in document order, its :meth:`candidates`
        (states without any left out): a pure function of the configuration and the
        event's name."""
        key = (self.configuration_key(), event)
        found = self.tables.selection.get(key)
        if found is not None:
            return found
        per_state = (self.candidates(state, event) for state in self.atomic_states())
        return self.tables.selection.put(key, tuple(c for c in per_state if c))

    def select_eventless_transitions(self) -> tuple[int, ...]:
        if not self.machine.has_eventless:
            if self.trace:
                self.emit(fx.TraceTransitionsSelected, transitions=(), event=None)
            return ()
        return self._select(None)

    def select_transitions(
        self, event: Event, selected: tuple[int, ...] | None = None
    ) -> tuple[int, ...]:
        return self._select(event.name, selected)

    def _select(
        self, event: str | None, selected: tuple[int, ...] | None = None
    ) -> tuple[int, ...]:
        """Appendix D ``selectTransitions`` (``selectEventlessTransitions`` for None):
        for each active atomic state in document order, the first transition of it or
        its ancestors that matches and whose condition holds (``selected``: those
        transitions, when the caller already tested the conditions), without the
        conflicting ones."""
        selection = self.selection_candidates(event)
        if selected is None:
            selected = enabled_transitions(selection, self.transitions, self.condition_match)
        self.last_selection = (selection, selected)
        result = self.remove_conflicting_transitions(selected) if len(selected) > 1 else selected
        if self.trace:
            self.emit(fx.TraceTransitionsSelected, transitions=result, event=event)
        return result

    def condition_match(self, transition: m.Transition) -> bool:
        """Only ``true`` enables; any other value or an error disables the transition
        and raises ``error.execution``."""
        if transition.cond is None:
            return True
        self.conditions_tested += 1
        # Only selection tests transition conditions, and it runs between microsteps,
        # on a configuration that holds still: the condition is tested in the context
        # memoised for it, which spares building expression options for the step. A
        # condition that would raise is tested again by test(), which raises
        # error.execution (expressions have no effects, so it gets the same value).
        value = self.condition_context().holds(transition.cond, self.datamodel)
        if value is not None:
            return value
        return self.test(transition.cond, f"transition:{transition.index}")

    def condition_context(self) -> ConditionContext:
        """The memoised :class:`~statifier.core.content.ConditionContext` of the
        current configuration."""
        return _condition_context(self.tables, self.machine, self.configuration_key())

    def remove_conflicting_transitions(self, enabled: tuple[int, ...]) -> tuple[int, ...]:
        """Appendix D ``removeConflictingTransitions``; memoised per configuration and
        enabled set unless an exit set consulted history."""
        if len(enabled) == 1:
            return enabled
        key = (self.configuration_key(), enabled)
        found = self.tables.conflicts.get(key)
        if found is not None:
            return found
        reads = self.history_reads
        # Two transitions conflict when their exit sets meet. A transition's exit set is
        # the active part of its domain's subtree, and never empty (its source is active
        # there): so two conflict exactly when one domain's subtree holds the other's.
        # The subtrees of the transitions kept so far are disjoint; kept in order, a
        # candidate finds its rivals by bisection rather than by comparing exit sets,
        # which made a step of a parallel state of n regions cost n^2 of them.
        kept: dict[int, None] = {}
        firsts: list[int] = []  # each kept subtree's first state, in order
        spans: dict[int, tuple[int, int]] = {}  # first state -> (last state, transition)
        transitions = self.transitions
        for t1 in enabled:
            transition = transitions[t1]
            if not transition.targets:  # exits nothing, conflicts with nothing
                kept[t1] = None
                continue
            first, last = self.domain_span(transition)
            low, high = bisect_left(firsts, first), bisect_right(firsts, last)
            if low and spans[firsts[low - 1]][0] >= last:
                low -= 1  # a kept subtree holds t1's
            rivals = [spans[f][1] for f in firsts[low:high]]
            source = transition.source
            if any(not self.is_descendant(source, transitions[t2].source) for t2 in rivals):
                continue  # an earlier transition preempts t1
            for f in firsts[low:high]:  # t1's source is within each rival's: t1 wins
                del kept[spans.pop(f)[1]]
            firsts[low:high] = [first]
            spans[first] = (last, t1)
            kept[t1] = None
        filtered = tuple(kept)
        if self.history_reads != reads:
            return filtered
        return self.tables.conflicts.put(key, filtered)

    # -- microstep -------------------------------------------------------------------
    #
    # Exit and entry sets, their document-order sorts and the history values an exit
    # records are memoised as plans (see statifier.core.memo), stored only when
    # computing them consulted no history value; the executable content runs every time.

    def microstep(self, enabled: tuple[int, ...]) -> None:
        before = self.configuration_key()
        reads = self.history_reads
        self.exit_states(enabled)
        self.execute_transition_content(enabled)
        self.enter_states(enabled)
        # The configuration now is a pure function of the one before and the
        # transitions, unless history was consulted: share one frozenset for it.
        if self.history_reads == reads:
            key = (before, enabled)
            after = self.tables.after.get(key)
            if after is None:
                after = self.tables.after.put(key, frozenset(self.configuration))
            self.frozen = after

    def exit_plan(self, enabled: tuple[int, ...]) -> ExitPlan:
        """The exit set of ``enabled`` in exit order, and the history values exiting
        records (computed from the configuration before any state is exited)."""
        key = (self.configuration_key(), enabled)
        plan = self.tables.exits.get(key)
        if plan is not None:
            return plan
        reads = self.history_reads
        states_to_exit = self.compute_exit_set(enabled)
        ordered = tuple(sorted(states_to_exit, reverse=True))
        states = self.states
        configuration = self.configuration
        records = []
        for s in ordered:
            for h in states[s].histories:
                if states[h].history_deep:
                    last = states[s].last
                    value = tuple(
                        sorted(
                            s0 for s0 in configuration if states[s0].is_atomic and s < s0 <= last
                        )
                    )
                else:
                    value = tuple(sorted(s0 for s0 in configuration if states[s0].parent == s))
                records.append((h, value))
        quiet = not any(states[s].onexit or states[s].invokes for s in ordered)
        plan = ExitPlan(ordered, frozenset(states_to_exit), tuple(records), quiet)
        if self.history_reads != reads:
            return plan
        return self.tables.exits.put(key, plan)

    def exit_states(self, enabled: tuple[int, ...]) -> None:
        plan = self.last_exit = self.exit_plan(enabled)
        if self.states_to_invoke:
            self.states_to_invoke -= plan.states
        if plan.records:
            self.history = {**self.history, **dict(plan.records)}
        configuration = self.configuration
        self.frozen = None
        if plan.quiet:  # nothing runs: the states just leave the configuration
            configuration.difference_update(plan.ordered)
        else:
            self.ran_content = True
            states = self.states
            for s in plan.ordered:
                node = states[s]
                if node.onexit:
                    for ordinal, block in enumerate(node.onexit):
                        self.execute_content(block, f"onexit:{s}:{ordinal}")
                if node.invokes:
                    self.cancel_invokes(s)
                configuration.discard(s)
        if self.trace:
            self.emit(
                fx.TraceExitSet,
                states=plan.ordered,
                configuration=tuple(sorted(configuration)),
            )

    def domain_span(self, transition: m.Transition) -> tuple[int, int]:
        """The first and last state of the subtree whose active part a transition with
        targets exits: its domain's, or every state's when it has no domain."""
        domain = self.get_transition_domain(transition)
        if domain is None:
            return -1, len(self.states)
        return domain, self.states[domain].last

    def compute_exit_set(self, transitions: Iterable[int]) -> set[int]:
        states_to_exit: set[int] = set()
        for t in transitions:
            transition = self.transitions[t]
            if transition.targets:
                domain = self.get_transition_domain(transition)
                if domain is None:
                    states_to_exit.update(self.configuration)
                    continue
                states_to_exit.update(
                    _descendants_in(self.configuration, domain, self.states[domain].last)
                )
        return states_to_exit

    def execute_transition_content(self, enabled: tuple[int, ...]) -> None:
        for t in enabled:
            content = self.transitions[t].content
            if content:
                self.ran_content = True
                self.execute_content(content, f"transition:{t}")

    def entry_plan(self, enabled: tuple[int, ...]) -> EntryPlan:
        """The entry set of ``enabled`` in document order, with the states entered by
        default and the default history content; it does not depend on the
        configuration, only on history when a history state is entered."""
        plan = self.tables.entries.get(enabled)
        if plan is not None:
            return plan
        states_to_enter: set[int] = set()
        states_for_default_entry: set[int] = set()
        default_history_content: dict[int, m.Block] = {}
        reads = self.history_reads
        self.compute_entry_set(
            enabled, states_to_enter, states_for_default_entry, default_history_content
        )
        ordered = tuple(sorted(states_to_enter))
        states, transitions = self.states, self.transitions
        late_binding = self.machine.late_binding

        def runs_something(s: int) -> bool:
            node = states[s]
            initial = node.initial_transition
            return bool(
                node.onentry
                or node.kind == "final"
                or (late_binding and s != 0 and node.data)
                or (
                    s in states_for_default_entry
                    and initial is not None
                    and transitions[initial].content
                )
            )

        quiet = not default_history_content and not any(runs_something(s) for s in ordered)
        plan = EntryPlan(
            ordered, frozenset(states_for_default_entry), default_history_content, quiet
        )
        if self.history_reads != reads:
            return plan
        return self.tables.entries.put(enabled, plan)

    def enter_states(self, enabled: tuple[int, ...]) -> None:
        plan = self.last_entry = self.entry_plan(enabled)
        ordered = plan.ordered
        self.frozen = None
        if plan.quiet:  # nothing runs: the states just join the configuration
            self.configuration.update(ordered)
            self.states_to_invoke.update(ordered)
            self.entered.update(ordered)
            if self.trace:
                self.emit(
                    fx.TraceEntrySet,
                    states=ordered,
                    configuration=tuple(sorted(self.configuration)),
                )
            return
        self.ran_content = True
        states_for_default_entry = plan.default_entry
        default_history_content = plan.history_content
        states = self.states
        configuration, entered = self.configuration, self.entered
        late_binding = self.machine.late_binding
        for s in ordered:
            node = states[s]
            configuration.add(s)
            self.states_to_invoke.add(s)
            if s not in entered:
                entered.add(s)
                if late_binding and s != 0:
                    self.bind_data(node.data)
            for ordinal, block in enumerate(node.onentry):
                self.execute_content(block, f"onentry:{s}:{ordinal}")
            if s in states_for_default_entry and node.initial_transition is not None:
                content = self.transitions[node.initial_transition].content
                if content:
                    self.execute_content(content, f"transition:{node.initial_transition}")
            if s in default_history_content:
                self.execute_content(default_history_content[s], f"history:{s}")
            if node.kind == "final":
                if node.parent == 0:
                    self.running = False
                else:
                    parent = states[node.parent]
                    self.enqueue_platform(f"done.state.{parent.id or ''}", self.done_data(node))
                    if parent.parent >= 0:
                        grandparent = states[parent.parent]
                        if grandparent.kind == "parallel" and all(
                            self.is_in_final_state(child) for child in grandparent.children
                        ):
                            self.enqueue_platform(f"done.state.{grandparent.id or ''}", UNDEFINED)
        if self.trace:
            self.emit(
                fx.TraceEntrySet,
                states=ordered,
                configuration=tuple(sorted(self.configuration)),
            )

    def compute_entry_set(
        self,
        transitions: tuple[int, ...],
        states_to_enter: set[int],
        states_for_default_entry: set[int],
        default_history_content: dict[int, m.Block],
    ) -> None:
        for t in transitions:
            transition = self.transitions[t]
            for s in transition.targets:
                self.add_descendant_states_to_enter(
                    s, states_to_enter, states_for_default_entry, default_history_content
                )
            ancestor = self.get_transition_domain(transition)
            for s in self.get_effective_target_states(transition):
                self.add_ancestor_states_to_enter(
                    s, ancestor, states_to_enter, states_for_default_entry, default_history_content
                )

    def add_descendant_states_to_enter(
        self,
        state: int,
        states_to_enter: set[int],
        states_for_default_entry: set[int],
        default_history_content: dict[int, m.Block],
    ) -> None:
        node = self.states[state]
        if node.kind == "history":
            self.history_reads += 1
            stored = self.history.get(state)
            if stored:
                for s in stored:
                    self.add_descendant_states_to_enter(
                        s, states_to_enter, states_for_default_entry, default_history_content
                    )
                for s in stored:
                    self.add_ancestor_states_to_enter(
                        s,
                        node.parent,
                        states_to_enter,
                        states_for_default_entry,
                        default_history_content,
                    )
            else:
                default = self.transitions[node.transitions[0]]
                default_history_content[node.parent] = default.content
                for s in default.targets:
                    self.add_descendant_states_to_enter(
                        s, states_to_enter, states_for_default_entry, default_history_content
                    )
                for s in default.targets:
                    self.add_ancestor_states_to_enter(
                        s,
                        node.parent,
                        states_to_enter,
                        states_for_default_entry,
                        default_history_content,
                    )
            return
        states_to_enter.add(state)
        if node.is_compound:
            states_for_default_entry.add(state)
            assert node.initial_transition is not None
            initial = self.transitions[node.initial_transition]
            for s in initial.targets:
                self.add_descendant_states_to_enter(
                    s, states_to_enter, states_for_default_entry, default_history_content
                )
            for s in initial.targets:
                self.add_ancestor_states_to_enter(
                    s, state, states_to_enter, states_for_default_entry, default_history_content
                )
        elif node.kind == "parallel":
            for child in node.children:
                if not _has_descendant_in(states_to_enter, child, self.states[child].last):
                    self.add_descendant_states_to_enter(
                        child, states_to_enter, states_for_default_entry, default_history_content
                    )

    def add_ancestor_states_to_enter(
        self,
        state: int,
        ancestor: int | None,
        states_to_enter: set[int],
        states_for_default_entry: set[int],
        default_history_content: dict[int, m.Block],
    ) -> None:
        for anc in self.get_proper_ancestors(state, ancestor):
            states_to_enter.add(anc)
            node = self.states[anc]
            if node.kind == "parallel":
                for child in node.children:
                    if not _has_descendant_in(states_to_enter, child, self.states[child].last):
                        self.add_descendant_states_to_enter(
                            child,
                            states_to_enter,
                            states_for_default_entry,
                            default_history_content,
                        )

    def is_in_final_state(self, s: int) -> bool:
        node = self.states[s]
        if node.is_compound:
            return any(
                self.states[child].kind == "final" and child in self.configuration
                for child in node.children
            )
        if node.kind == "parallel":
            return all(self.is_in_final_state(child) for child in node.children)
        return False

    def get_transition_domain(self, transition: m.Transition) -> int | None:
        domains = self.tables.domains
        if transition.index in domains:
            return domains[transition.index]
        reads = self.history_reads
        domain = self._transition_domain(transition)
        if self.history_reads == reads:
            domains.put(transition.index, domain)
        return domain

    def _transition_domain(self, transition: m.Transition) -> int | None:
        tstates = self.get_effective_target_states(transition)
        if not tstates:
            return None
        source = transition.source
        if (
            transition.internal
            and self.states[source].is_compound
            and all(self.is_descendant(s, source) for s in tstates)
        ):
            return source
        return self.find_lcca([source, *tstates])

    def find_lcca(self, state_list: list[int]) -> int | None:
        head, tail = state_list[0], state_list[1:]
        for anc in self.get_proper_ancestors(head, None):
            if self.states[anc].is_compound and all(self.is_descendant(s, anc) for s in tail):
                return anc
        return None

    def get_effective_target_states(self, transition: m.Transition) -> list[int]:
        targets: dict[int, None] = {}
        for s in transition.targets:
            node = self.states[s]
            if node.kind == "history":
                self.history_reads += 1
                stored = self.history.get(s)
                if stored:
                    targets.update(dict.fromkeys(stored))
                else:
                    default = self.transitions[node.transitions[0]]
                    targets.update(dict.fromkeys(self.get_effective_target_states(default)))
            else:
                targets[s] = None
        return list(targets)

    def get_proper_ancestors(self, state: int, stop: int | None) -> list[int]:
        ancestors = []
        for anc in self.states[state].ancestors:
            if anc == stop:
                break
            ancestors.append(anc)
        else:
            if stop is not None:
                return []  # stop was not an ancestor: state1 is stop or an ancestor of it
        return ancestors

    def is_descendant(self, state1: int, state2: int) -> bool:
        return state2 < state1 <= self.states[state2].last

    # -- invocations -------------------------------------------------------------------

    def cancel_invokes(self, state: int) -> None:
        node = self.states[state]
        if not node.invokes or not self.invocations:
            return
        for position in range(len(node.invokes)):
            invoke_id = self.invocations.get((state, position))
            if invoke_id is not None:
                self.invocations = {
                    key: value
                    for key, value in self.invocations.items()
                    if key != (state, position)
                }
                self.emit(fx.CancelInvoke, invoke_id=invoke_id, state_index=state)

    def invoke_pass(self) -> None:
        started_states: list[int] = []
        started_ids: list[str] = []
        states = self.states
        if not self.machine.has_invokes:
            self.states_to_invoke.clear()
            if self.trace:
                self.emit(fx.TraceInvokePass, states=(), invoke_ids=())
            return
        for s in sorted(s for s in self.states_to_invoke if states[s].invokes):
            for invoke in states[s].invokes:
                invoke_id = self.start_invoke(s, invoke)
                if invoke_id is not None:
                    started_states.append(s)
                    started_ids.append(invoke_id)
        self.states_to_invoke.clear()
        if self.trace:
            self.emit(
                fx.TraceInvokePass, states=tuple(started_states), invoke_ids=tuple(started_ids)
            )

    def finalize_and_autoforward(self, event: Event) -> None:
        finalized: list[str] = []
        forwarded: list[str] = []
        for s in sorted(self.configuration) if self.invocations else ():
            for invoke in self.states[s].invokes:
                invoke_id = self.invocations.get((s, invoke.index))
                if invoke_id is None:
                    continue
                if event.invokeid == invoke_id:
                    self.apply_finalize(s, invoke, event)
                    finalized.append(invoke_id)
                if invoke.autoforward:
                    self.emit(fx.Autoforward, invoke_id=invoke_id, state_index=s, event=event)
                    forwarded.append(invoke_id)
        if self.trace:
            self.emit(
                fx.TraceFinalizeAutoforward,
                event=event.name,
                finalized=tuple(finalized),
                forwarded=tuple(forwarded),
            )

    def leaf_ids(self) -> tuple[str, ...]:
        states = self.states
        return tuple(sorted(states[s].id or "" for s in self.configuration if states[s].is_atomic))


def _descendants_in(configuration: set[int], state: int, last: int) -> Iterable[int]:
    """The states of ``configuration`` that descend from ``state``, whose descendants
    are numbered ``state + 1`` to ``last``: walked from the smaller side, so exiting
    one region of a wide parallel state costs the region, not the configuration."""
    if last - state < len(configuration):
        return (s for s in range(state + 1, last + 1) if s in configuration)
    return (s for s in configuration if state < s <= last)


def _has_descendant_in(states: set[int], state: int, last: int) -> bool:
    """Whether ``states`` holds a descendant of ``state`` (see :func:`_descendants_in`)."""
    return any(True for _ in _descendants_in(states, state, last))


def _is_error(event: Event) -> bool:
    """Whether ``event`` is an error event: ``error`` or a name under it."""
    name = event.name
    return name == "error" or name.startswith("error.")


def name_match(descriptors: tuple[tuple[str, ...], ...], tokens: list[str]) -> bool:
    """Whether an event name (split on dots) matches any descriptor: a descriptor
    matches when its tokens are a prefix of the name's (no tokens: every event)."""
    for descriptor in descriptors:
        if len(descriptor) <= len(tokens) and all(
            a == b for a, b in zip(descriptor, tokens, strict=False)
        ):
            return True
    return False
