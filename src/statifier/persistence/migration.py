"""Chart migration: a plan from one revision of a chart to another, and the pure move
of one position along it.

A position holds state *indexes*, which mean something only against the chart that
produced them. A :class:`MigrationPlan` says where each state of the old chart went in
the new one (by author id; an id the map does not name keeps its id), and
:func:`carry` moves a position along it: the position is exported by state id, its ids
are mapped, and it is imported onto the new chart, then checked to be a configuration
the new chart can be in. What cannot be carried (a removed state is active, a datamodel
variable the new chart declares is missing) is returned as a reason, never guessed
at: the execution is then parked on its old chart.

>>> from statifier.chart import compile_chart
>>> from statifier.core import initialize
>>> old = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="new">'
...     '<state id="new"/><state id="paid"/></scxml>'
... )
>>> revised = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">'
...     '<state id="placed"/><state id="paid"/></scxml>'
... )
>>> plan = MigrationPlan(old, revised, state_map={"new": "placed"})
>>> state, _ = initialize(old)
>>> carry(state, plan).leaf_configuration()
('placed',)
>>> carry(state, MigrationPlan(old, revised))
Unmappable(reason="active state 'new' is not in the new chart and the plan maps it nowhere")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from statifier.chart import Machine
from statifier.core import MachineState
from statifier.core import positions as stored
from statifier.expr import Value, tagged
from statifier.persistence.errors import (
    InvalidMigrationPlan,
    UndeclaredPlanData,
    UnknownPlanStates,
    Unstorable,
)
from statifier.persistence.records import ExecutionRecord

__all__ = [
    "MIGRATE_VIA",
    "Carried",
    "LoggedMigration",
    "Migrated",
    "MigrationPlan",
    "MigrationSummary",
    "Parked",
    "Unmappable",
    "carry",
    "left_as_is",
    "move",
    "renamed_ids",
]

MIGRATE_VIA: Final = "migrate"
"""The input log's ``via`` for a migration: its entry holds a :class:`LoggedMigration`,
not an event, so a replay that feeds logged events to the chart skips it."""

_LOG_TAG: Final = "statifier.migration"


@dataclass(frozen=True, slots=True)
class Unmappable:
    """Why a position cannot be carried along a plan (the execution is parked)."""

    reason: str


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """From one revision of a chart to another.

    Args:
        source: the chart the executions run now.
        target: the revision they move to.
        state_map: old state id to new state id, for states that were renamed or
            merged, or to ``None`` for states removed on purpose. An id it does not
            name keeps its id; if the new chart lacks it, it was removed.
        data: values for datamodel variables the new chart declares and a position
            may lack (a variable the revision added); a position that has one keeps
            its own.

    Raises:
        TypeError: ``source`` or ``target`` is not a compiled chart, or the map or
            data is not keyed by strings.
        InvalidMigrationPlan: ``source`` and ``target`` are the same chart, or a
            history state is mapped to a state that is not a history state, or back.
        UnknownPlanStates: a key is not a state id of ``source``, or a target is not
            one of ``target``.
        UndeclaredPlanData: ``data`` names a variable ``target`` does not declare.
        InvalidMigrationPlan: a value of ``data`` cannot be stored (NaN or an
            infinity, bytes, a set, a value nested too deep).

    The plan is immutable; its mappings are read-only copies.
    """

    source: Machine
    target: Machine
    state_map: Mapping[str, str | None] = field(default_factory=dict)
    data: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        charts: tuple[object, ...] = (self.source, self.target)  # untyped callers
        if not all(isinstance(chart, Machine) for chart in charts):
            raise TypeError("a plan goes from one compiled chart (Machine) to another")
        if self.source.identity.content_hash == self.target.identity.content_hash:
            raise InvalidMigrationPlan("the plan's old and new charts are the same chart")
        state_map = _string_keyed(self.state_map, "state_map")
        data = _string_keyed(self.data, "data")
        targets = [new for new in state_map.values() if new is not None]
        if not all(isinstance(new, str) for new in targets):
            raise TypeError("state_map maps old state ids to new state ids or None")
        unknown_old = sorted(old for old in state_map if old not in self.source.ids)
        if unknown_old:
            raise UnknownPlanStates("old", unknown_old)
        unknown_new = sorted({new for new in targets if new not in self.target.ids})
        if unknown_new:
            raise UnknownPlanStates("new", unknown_new)
        for old, new in state_map.items():
            if new is None:
                continue
            was = self.source.states[self.source.ids[old]].kind == "history"
            now = self.target.states[self.target.ids[new]].kind == "history"
            if was != now:
                raise InvalidMigrationPlan(
                    f"state {old!r} and {new!r}: a history state maps only to a history state"
                )
        declared = {element.id for element in self.target.data}
        undeclared = sorted(name for name in data if name not in declared)
        if undeclared:
            raise UndeclaredPlanData(undeclared)
        for name, value in data.items():  # refused here, not execution by execution
            try:
                json.dumps(tagged.encode(value), allow_nan=False)
            except (ValueError, TypeError, RecursionError) as error:
                raise InvalidMigrationPlan(
                    f"the data of {name!r} cannot be stored: {error}"
                ) from None
        object.__setattr__(self, "state_map", MappingProxyType(state_map))
        object.__setattr__(self, "data", MappingProxyType(data))

    @property
    def source_hash(self) -> str:
        """The content hash executions move from."""
        return self.source.identity.content_hash

    @property
    def target_hash(self) -> str:
        """The content hash executions move to."""
        return self.target.identity.content_hash

    def new_id(self, old: str) -> str | None:
        """Where state ``old`` went: its mapped id, its own id if the new chart has it,
        else ``None`` (removed)."""
        if old in self.state_map:
            return self.state_map[old]
        return old if old in self.target.ids else None


def _string_keyed(mapping: object, what: str) -> dict[str, Any]:
    """``mapping`` as a plain dict, checked (untyped callers pass anything)."""
    if not isinstance(mapping, Mapping) or not all(isinstance(key, str) for key in mapping):
        raise TypeError(f"{what} is a mapping keyed by strings, not {mapping!r}")
    return dict(mapping)


def carry(state: MachineState, plan: MigrationPlan) -> MachineState | Unmappable:
    """``state`` moved onto ``plan.target``, or why it cannot be.

    Active, pending-invoke and remembered (history) states must all have a place in the
    new chart; states only ever entered in the past that the new chart lacks are
    forgotten (they only decide late data binding). The result must be a legal
    configuration of the new chart (each active state's parent active, one active
    child per active compound state, every child of an active parallel state), each
    live invocation must still exist in its state, and every variable the new chart
    declares must have a value (the position's, or the plan's ``data``).

    Raises:
        IdentityMismatch: ``state`` is not a position of ``plan.source``.
    """
    if state.machine.identity != plan.source.identity:
        raise stored.IdentityMismatch(state.machine.identity, plan.source.identity)
    if not state.running:
        return Unmappable("the chart has finished")
    try:
        exported = stored.export(state)
    except stored.PositionError as error:
        return Unmappable(f"the position cannot be exported: {error}")
    moved, why = _mapped(exported, plan)
    if why is not None:
        return Unmappable(why)
    datamodel = dict(state.datamodel)
    missing = [e.id for e in plan.target.data if e.id not in datamodel and e.id not in plan.data]
    if missing:
        names = sorted(set(missing))
        return Unmappable(f"the new chart declares data the position lacks: {names}")
    for name, value in plan.data.items():
        datamodel.setdefault(name, value)
    moved["datamodel"] = tagged.encode(datamodel)
    try:
        carried = stored.import_state(plan.target, moved)
    except stored.PositionError as error:  # the checks above leave none; kept typed
        return Unmappable(f"the position cannot be imported: {error}")
    return _illegal(carried) or carried


def _mapped(exported: dict[str, Any], plan: MigrationPlan) -> tuple[dict[str, Any], str | None]:
    """The exported position with its ids mapped, or the first reason it cannot be."""
    new_id = plan.new_id

    def required(ids: list[str], what: str) -> tuple[list[str], str | None]:
        out = []
        for old in ids:
            new = new_id(old)
            if new is None:
                why = f"{what} {old!r} is not in the new chart and the plan maps it nowhere"
                return [], why
            out.append(new)
        return sorted(set(out)), None

    moved = dict(exported)
    configuration, why = required(exported["configuration"], "active state")
    if why:
        return moved, why
    to_invoke, why = required(exported["states_to_invoke"], "state about to invoke")
    if why:
        return moved, why
    history: dict[str, list[str]] = {}
    for old_history, remembered in exported["history"].items():
        targets, why = required([old_history], "history state")
        if why:
            return moved, why
        states, why = required(remembered, f"state remembered by history {old_history!r},")
        if why:
            return moved, why
        history[targets[0]] = sorted({*history.get(targets[0], ()), *states})
    invocations = []
    for old_state, index, invoke_id in exported["invocations"]:
        targets, why = required([old_state], "invoking state")
        if why:
            return moved, why
        if index >= len(plan.target.states[plan.target.ids[targets[0]]].invokes):
            return moved, f"invocation {invoke_id!r} has no <invoke> in state {targets[0]!r}"
        invocations.append([targets[0], index, invoke_id])
    entered = sorted({n for n in map(new_id, exported["entered"]) if n is not None})
    moved.update(
        configuration=configuration,
        states_to_invoke=to_invoke,
        history=history,
        invocations=invocations,
        entered=sorted(set(entered) | set(configuration)),
    )
    return moved, None


def _illegal(state: MachineState) -> Unmappable | None:
    """Why ``state``'s configuration is not one its chart can be in, or ``None``."""
    states = state.machine.states
    active = sorted(state.configuration)

    def name(index: int) -> str:
        return states[index].id or ("<scxml>" if index == 0 else f"#{index}")

    if active == [0] or not active:
        return Unmappable("no state would be active in the new chart")
    # Parents first: a state active without its parent says more than the count of
    # its parent's children would.
    for index in active:
        parent = states[index].parent
        if index != 0 and parent not in state.configuration:
            return Unmappable(
                f"state {name(index)!r} would be active without its parent {name(parent)!r}"
            )
    for index in active:
        node = states[index]
        children = [child for child in node.children if child in state.configuration]
        if node.kind == "parallel" and len(children) != len(node.children):
            return Unmappable(f"parallel state {name(index)!r} would not have every region active")
        if node.is_compound and len(children) != 1:
            return Unmappable(
                f"compound state {name(index)!r} would have {len(children)} active children, not 1"
            )
    return None


@dataclass(frozen=True, slots=True)
class LoggedMigration:
    """A migration as the input log holds it.

    Attributes:
        source_hash, target_hash: the charts it moved from and to.
        reason: why it parked the execution instead (it stayed on ``source_hash``);
            ``None`` when it moved.
        renamed: the ids of the position that changed (old to new), so a replay of
            the log can carry its own position the same way.
    """

    source_hash: str
    target_hash: str
    reason: str | None = None
    renamed: Mapping[str, str] = field(default_factory=dict)

    @property
    def parked(self) -> bool:
        """Whether the migration parked the execution rather than moving it."""
        return self.reason is not None

    def dump(self) -> bytes:
        """The entry's bytes (deterministic JSON)."""
        body = {
            "tag": _LOG_TAG,
            "from": self.source_hash,
            "to": self.target_hash,
            "reason": self.reason,
            "renamed": dict(sorted(self.renamed.items())),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def load(cls, data: bytes) -> LoggedMigration:
        """The entry :meth:`dump` wrote.

        Raises:
            NotAPosition: the bytes are not a logged migration.
        """
        try:
            body = json.loads(data)
            if body["tag"] != _LOG_TAG:
                raise ValueError(body["tag"])
            return cls(
                str(body["from"]),
                str(body["to"]),
                None if body["reason"] is None else str(body["reason"]),
                {str(old): str(new) for old, new in body["renamed"].items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            # RecursionError: a damaged entry nested deeper than json's stack reaches
            # is as unreadable as any other (UnicodeDecodeError is a ValueError).
            raise stored.NotAPosition("the bytes are not a logged migration") from None


def renamed_ids(state: MachineState, plan: MigrationPlan) -> dict[str, str]:
    """The ids of ``state``'s position (active, remembered, entered) that ``plan``
    changes, old to new."""
    machine = state.machine
    indexes = set(state.configuration) | set(state.entered) | set(state.history)
    indexes |= {s for value in state.history.values() for s in value}
    changes = {}
    for index in indexes:
        old = machine.state_id(index)
        if old is None:
            continue
        new = plan.new_id(old)
        if new is not None and new != old:
            changes[old] = new
    return dict(sorted(changes.items()))


def left_as_is(record: ExecutionRecord, target_hash: str) -> str | None:
    """Why a migration onto the chart ``target_hash`` leaves ``record`` as it is, in the words
    :attr:`MigrationSummary.unchanged` gives, or ``None`` when it tries to carry it:
    the execution is already on the new chart, or holds no chart any more (it ended).

    >>> from statifier.persistence.records import ExecutionRecord, Status
    >>> from statifier.chart import compile_chart
    >>> scxml = '<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="{}"/></scxml>'
    >>> one, two = compile_chart(scxml.format("a")), compile_chart(scxml.format("b"))
    >>> def on_one(status: Status) -> ExecutionRecord:
    ...     return ExecutionRecord(
    ...         "x", content_hash=one.identity.content_hash, status=status, position=None
    ...     )
    >>> left_as_is(on_one(Status.COMPLETED), two.identity.content_hash)
    'it is completed'
    >>> left_as_is(on_one(Status.ACTIVE), two.identity.content_hash) is None
    True
    """
    if record.content_hash == target_hash:
        return "already on the new chart"
    if not record.status.pins:
        return f"it is {record.status.value}"
    return None


@dataclass(frozen=True, slots=True)
class Carried:
    """A position :func:`move` carried: ``position`` its stored bytes, ``state`` the
    position as loaded from them (the interpreter's variables set anew for the new
    chart), ``renamed`` the ids that changed (see :func:`renamed_ids`)."""

    position: bytes
    state: MachineState
    renamed: Mapping[str, str]


def move(state: MachineState, plan: MigrationPlan) -> Carried | Unmappable:
    """``state`` carried along ``plan`` (:func:`carry`) as a migration stores it, or
    why it cannot be (the execution is then parked). Pure: nothing is stored.

    Raises:
        IdentityMismatch: ``state`` is not a position of ``plan.source``.
        Unstorable: the carried position cannot be stored.
    """
    carried = carry(state, plan)
    if isinstance(carried, Unmappable):
        return carried
    try:
        position = stored.dump(carried)
    except ValueError as error:
        raise Unstorable(f"the new position cannot be stored: {error}") from None
    return Carried(position, stored.load(plan.target, position), renamed_ids(state, plan))


@dataclass(frozen=True, slots=True)
class MigrationSummary:
    """What a migration of many executions did, each id in exactly one field.

    Attributes:
        migrated: moved onto the new chart, in id order.
        parked: parked on their old chart (``needs_migration``), with the reason.
        unchanged: left as they were (ended meanwhile, or on another chart, or already
            on the new one), with why.
        failed: the call raised for these (a lock wait ran out, say); nothing changed
            in them, and running the migration again picks them up.
    """

    migrated: tuple[str, ...] = ()
    parked: Mapping[str, str] = field(default_factory=dict)
    unchanged: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)

    def __add__(self, other: MigrationSummary) -> MigrationSummary:
        return MigrationSummary(
            tuple(sorted((*self.migrated, *other.migrated))),
            dict(sorted({**self.parked, **other.parked}.items())),
            dict(sorted({**self.unchanged, **other.unchanged}.items())),
            dict(sorted({**self.failed, **other.failed}.items())),
        )


@dataclass(frozen=True, slots=True)
class Migrated:
    """A migration that moved the execution: ``execution`` is the record as stored (on
    the new chart, ``active``), ``state`` its position there."""

    execution: ExecutionRecord
    state: MachineState


@dataclass(frozen=True, slots=True)
class Parked:
    """A migration that could not carry the execution's position: it stays on its old
    chart as ``needs_migration``, with ``reason`` (also its record's ``failure``)."""

    execution: ExecutionRecord
    reason: str
