"""MachineState: a complete, resumable position of one chart."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from statifier.chart.model import Machine
from statifier.core.events import Event
from statifier.expr import Value

__all__ = ["DEFAULT_ROUND_BUDGET", "MachineState", "StartOptions"]

DEFAULT_ROUND_BUDGET: Final = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StartOptions:
    """How :func:`~statifier.core.initialize` starts a chart.

    Attributes:
        session_id: the value of ``_sessionid``; hosts pass a unique one (the core never
            invents identifiers from clocks or randomness).
        datamodel: initial values that override ``<data>`` declarations of the same
            top-level name (their expressions are then not evaluated). An
            ``_ioprocessors`` entry (type -> ``{"location": ...}``) names the host's
            further event I/O processors; they join the SCXML ones, which cannot be
            replaced.
        trace: whether to produce trace effects.
        round_budget: rounds one macrostep may take before it stops with a
            ``BudgetExhausted`` effect; ``None`` lifts the bound.
        send_types: ``<send type>`` values the host handles besides the SCXML processor.
        invoke_types: ``<invoke type>`` values the host handles; ``None`` accepts any.
        routes: the targets an immediate send can reach right now (``#_scxml_<id>``,
            ``#_parent``, ``#_<invokeid>``), as the host sees them; ``None`` makes no
            determination. A send to anything else raises ``error.communication`` in
            the sending block.
    """

    session_id: str = "session"
    datamodel: Mapping[str, Value] = field(default_factory=dict)
    trace: bool = False
    round_budget: int | None = DEFAULT_ROUND_BUDGET
    send_types: frozenset[str] = frozenset()
    invoke_types: frozenset[str] | None = None
    routes: Container[str] | None = None


class MachineState(NamedTuple):
    """Where a chart is: everything needed to continue it, and nothing else.

    A named tuple: immutable and cheap to build, since every step builds one. The
    interpreter never changes a state it was given; the mappings inside are shared
    between successive states and must not be changed by callers either. Two states
    compare equal when every field does. States are indexes into ``machine.states``;
    use :meth:`leaf_configuration` for author ids.

    Attributes:
        configuration: every active state, ancestors and the root included.
        internal_queue: internal events not yet processed (empty between macrosteps).
        history: stored configuration per history state index.
        entered: states entered at least once (for late data binding).
        states_to_invoke: states whose invocations start at the end of the macrostep.
        invocations: live invocation ids by ``(state index, invoke index)``.
        datamodel: the data, system variables (``_event``, ``_sessionid``, ``_name``,
            ``_ioprocessors``) included.
        macrostep, microstep, round: the step counters stamped on effects.
        send_counter, invoke_counter, timer_counter: sources of generated ids.
        running: false once the chart reached a top-level final state or was cancelled.
    """

    machine: Machine
    configuration: frozenset[int]
    internal_queue: tuple[Event, ...]
    history: Mapping[int, tuple[int, ...]]
    entered: frozenset[int]
    states_to_invoke: frozenset[int]
    invocations: Mapping[tuple[int, int], str]
    datamodel: Mapping[str, Value]
    session_id: str
    macrostep: int
    microstep: int
    round: int
    send_counter: int
    invoke_counter: int
    timer_counter: int
    running: bool
    trace: bool
    round_budget: int | None
    send_types: frozenset[str] = frozenset()
    invoke_types: frozenset[str] | None = None
    routes: Container[str] | None = None
    """A per-step snapshot of reachable send targets (see :class:`StartOptions`); a
    host stamps it with ``state._replace(routes=...)`` before each step. Never stored."""

    @property
    def status(self) -> Literal["running", "done"]:
        return "running" if self.running else "done"

    def leaf_configuration(self) -> tuple[str, ...]:
        """Ids of the active atomic and final states, sorted."""
        states = self.machine.states
        return tuple(
            sorted(
                states[index].id or "" for index in self.configuration if states[index].is_atomic
            )
        )

    def final_state(self) -> str | None:
        """The id of the top-level ``<final>`` a finished chart ended in, else ``None``
        (it runs, or was cancelled).

        A chart ends the moment it enters a top-level final, so at most one is ever
        entered, and ``entered`` keeps every state ever entered."""
        if self.running:
            return None
        states = self.machine.states
        for index in sorted(self.entered):
            node = states[index]
            if node.kind == "final" and node.parent == 0 and index != 0:
                return node.id
        return None

    def is_in(self, state_id: str) -> bool:
        """Whether the state with this author id is active (``In()`` in expressions)."""
        index = self.machine.ids.get(state_id)
        return index is not None and index in self.configuration
