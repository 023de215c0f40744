"""Memo tables: what the interpreter derives from the chart and a configuration alone.

A compiled :class:`~statifier.chart.model.Machine` never changes, so a fact computed
from the chart and from keys the interpreter includes (a configuration, an event name,
a set of transitions) is the same every time it is computed again; nothing ever
invalidates it. The interpreter keeps such facts in the tables of one
:class:`ChartMemo` per machine (stored in ``machine.memo`` under :data:`KEY`), and
stores a result only when computing it read nothing outside its key: a result that
consulted history values or evaluated a condition is never stored. (The plans in
``outcomes`` follow the conditions of a selection, but those conditions are not part of
what is stored: they are tested on every event and their outcome is part of the key.)

Every table is bounded (:data:`TABLE_LIMIT` entries by default): when a table is full,
storing evicts its oldest entry, so a chart with a huge configuration space keeps the
recent ones and memory stays bounded. A limit of 0 stores nothing, which runs every
procedure from scratch (the tests compare such runs against memoised ones).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

if TYPE_CHECKING:
    from statifier.chart.model import Block, Machine
    from statifier.core.content import ConditionContext

__all__ = [
    "KEY",
    "TABLE_LIMIT",
    "ChartMemo",
    "EntryPlan",
    "ExitPlan",
    "StepPlan",
    "Table",
    "tables_for",
]

TABLE_LIMIT: Final = 4096
"""Entries per table per machine, unless a :class:`ChartMemo` is built with another."""

KEY: Final = "statifier.core.memo"
"""Where a machine's :class:`ChartMemo` lives in ``machine.memo``."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Configuration: TypeAlias = frozenset[int]  # state indexes
Transitions: TypeAlias = tuple[int, ...]  # transition indexes, in document order


class Table(dict[K, V]):
    """A dict bounded in size: :meth:`put` evicts the oldest entry of a full table.

    Lookups are plain ``dict.get`` (nothing is reordered on a hit), so a hit costs no
    more than in a dict; only a store pays for the bound.
    """

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        """Store ``value`` under ``key`` (unless the limit is 0) and return it."""
        if self.limit <= 0:
            return value
        if len(self) >= self.limit:
            del self[next(iter(self))]  # insertion order: the oldest first
        self[key] = value
        return value


@dataclass(frozen=True, slots=True)
class ExitPlan:
    """What ``exitStates`` does for one (configuration, transitions): the exit set in
    exit order (reverse document order), the history values it records, and whether
    any exited state has ``<onexit>`` or ``<invoke>`` (if not, exiting is only removing
    ``states`` from the configuration)."""

    ordered: tuple[int, ...]
    states: frozenset[int]
    records: tuple[tuple[int, tuple[int, ...]], ...]
    quiet: bool


@dataclass(frozen=True, slots=True)
class EntryPlan:
    """What ``enterStates`` does for one set of transitions (when no history is
    involved): the entry set in document order, the states entered by default, the
    default history content, and whether entering runs anything at all (if not:
    no ``<onentry>``, no initial or history content, no final state, no late-bound
    data, entering is only adding ``ordered`` to the configuration)."""

    ordered: tuple[int, ...]
    default_entry: frozenset[int]
    history_content: Mapping[int, Block]
    quiet: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A whole macrostep the chart alone decided: an external event that, from a
    configuration, tested no condition, ran no executable content, consulted no
    history, raised nothing and produced no effect. Taking it again from the same
    configuration with an event of the same name changes only the configuration (to
    ``after``), the history values ``records`` writes, the states ``entries`` adds to
    those ever entered, the step counters and ``_event``.

    ``rounds`` is how many rounds the macrostep took (its final ``round`` counter): a
    position whose round budget is smaller runs the procedures instead.

    The same plan also describes the rest of a macrostep whose selection tested
    conditions (table ``outcomes``): it then holds for one outcome of those
    conditions, and everything after the selection must satisfy the same terms."""

    after: frozenset[int]
    records: tuple[tuple[int, tuple[int, ...]], ...]
    entries: frozenset[int]
    microsteps: int
    rounds: int


class ChartMemo:
    """The memo tables of one machine, each bounded by ``limit`` entries.

    Keys and values:

    * ``candidates``: (state, event name or None) -> the transitions of the state and
      its ancestors, nearest first and in document order, whose descriptors match the
      name (None: eventless), before any condition is tested.
    * ``selection``: (configuration, event name or None) -> for each active atomic
      state in document order that has any, its candidates.
    * ``conflicts``: (configuration, enabled transitions) ->
      ``removeConflictingTransitions``' answer.
    * ``domains``: transition index -> ``getTransitionDomain``.
    * ``exits``: (configuration, transitions) -> :class:`ExitPlan`.
    * ``entries``: transitions -> :class:`EntryPlan`.
    * ``after``: (configuration, transitions) -> the configuration after the
      microstep, one frozenset shared by every state that holds it.
    * ``steps``: (configuration, event name) -> :class:`StepPlan`, for the external
      events whose whole macrostep the chart decided.
    * ``guards``: (configuration, event name) -> the selection candidates (as in
      ``selection``), for the external events whose macrostep the chart decided once
      the conditions of the selection are tested: they are tested on every event.
    * ``outcomes``: (configuration, event name, enabled transitions before conflicts
      are removed) -> :class:`StepPlan`, the rest of such a macrostep for one outcome
      of those conditions.
    * ``contexts``: configuration -> the
      :class:`~statifier.core.content.ConditionContext` conditions are tested in
      before any transition is taken (its ``In()`` sees that configuration).
    """

    __slots__ = (
        "after",
        "candidates",
        "conflicts",
        "contexts",
        "domains",
        "entries",
        "exits",
        "guards",
        "limit",
        "outcomes",
        "selection",
        "steps",
    )

    def __init__(self, limit: int = TABLE_LIMIT) -> None:
        self.limit = limit
        self.candidates: Table[tuple[int, str | None], Transitions] = Table(limit)
        self.selection: Table[tuple[Configuration, str | None], tuple[Transitions, ...]] = Table(
            limit
        )
        self.conflicts: Table[tuple[Configuration, Transitions], Transitions] = Table(limit)
        self.domains: Table[int, int | None] = Table(limit)
        self.exits: Table[tuple[Configuration, Transitions], ExitPlan] = Table(limit)
        self.entries: Table[Transitions, EntryPlan] = Table(limit)
        self.after: Table[tuple[Configuration, Transitions], Configuration] = Table(limit)
        self.steps: Table[tuple[Configuration, str], StepPlan] = Table(limit)
        self.guards: Table[tuple[Configuration, str], tuple[Transitions, ...]] = Table(limit)
        self.outcomes: Table[tuple[Configuration, str, Transitions], StepPlan] = Table(limit)
        self.contexts: Table[Configuration, ConditionContext] = Table(limit)

    def tables(self) -> dict[str, Table[Any, Any]]:
        """Every table by name (for tests and diagnostics)."""
        return {name: getattr(self, name) for name in self.__slots__ if name != "limit"}


def tables_for(machine: Machine) -> ChartMemo:
    """The machine's memo tables, created on first use."""
    memo: ChartMemo | None = machine.memo.get(KEY)
    if memo is None:
        memo = machine.memo.setdefault(KEY, ChartMemo())
    return memo
