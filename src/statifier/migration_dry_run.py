"""Migration dry run: what a migration of recorded executions onto a revision of
their chart would do, and what the revision would then have done with the traffic
after the migration point, without writing anything.

:func:`migration_dry_run` reads each selected execution, read-only, and gives its
:class:`DryRunResult`:

* **now**: what :meth:`~statifier.persistence.Executions.migrate_all` would do to it
  if it ran now, decided by the code the migration itself decides with
  (:func:`~statifier.persistence.migration.left_as_is` and
  :func:`~statifier.persistence.migration.move`): ``moved`` (with the migrated
  position's active states and datamodel), ``parked`` (with the reason the migration
  would give), ``unchanged`` (already on the revision, or ended), or ``failed`` (its
  stored chart or position cannot be read, or the plan does not fit its chart). The
  plan of each execution goes from its own stored chart to the revision, with the
  same ``state_map`` and ``data``, as
  :meth:`~statifier.durable.Durable.migrate_all` builds one for every earlier
  revision.
* **after input K** (``at=K``): a migration that had happened after the ``K``-th
  logged input (0: right after the start). The log is replayed on the stored chart up
  to ``K``; that position is carried along the plan by the same code; the rest of the
  log is replayed on the stored chart and, from the carried position, on the revision,
  in lockstep, and compared after every input as :mod:`statifier.shadow` compares
  (:class:`Continuation`): where they first part, new errors, the same final
  configuration. The stored chart's states are compared under the names the plan
  gives them, and the variables the revision adds are not compared. A ``K`` past the
  log's end is its end: nothing is left to compare.

Nothing is written: a URL is opened read-only (:func:`statifier.shadow.open_read_only`).

>>> from statifier.chart import compile_chart
>>> from statifier.core import initialize
>>> old = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="new">'
...     '<state id="new"><transition event="pay" target="paid"/></state>'
...     '<state id="paid"/></scxml>'
... )
>>> revised = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">'
...     '<state id="placed"><transition event="pay" target="paid"/></state>'
...     '<state id="paid"/></scxml>'
... )
>>> from datetime import UTC, datetime
>>> from statifier.core import Event
>>> from statifier.persistence import LoggedInput
>>> at = datetime(2026, 1, 1, tzinfo=UTC)
>>> log = [LoggedInput(0, "step", Event("pay"), at)]
>>> plan = MigrationPlan(old, revised, state_map={"new": "placed"})
>>> after = continue_log(plan, log, 0)
>>> after.outcome, after.replay.verdict
(<Outcome.MOVED: 'moved'>, <Verdict.SAME: 'same'>)
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from statifier.chart import Machine
from statifier.chart.validation import SYSTEM_VARIABLES
from statifier.core import MachineState, StartOptions
from statifier.core.positions import PositionError
from statifier.expr import Function, Value, tagged
from statifier.persistence import (
    PLAIN,
    BlobCodec,
    ExecutionRecord,
    Executions,
    InvalidMigrationPlan,
    LoggedInput,
    MigrationPlan,
    MigrationSummary,
    PersistenceError,
    Status,
    Storage,
    UndecodableBlob,
)
from statifier.persistence.executions import logged_start
from statifier.persistence.migration import (
    Unmappable,
    left_as_is,
    move,
)
from statifier.shadow import (
    _READ_AHEAD,
    MAX_INPUTS,
    Selection,
    ShadowResult,
    Verdict,
    _Comparison,
    _read_logs,
    _said,
    _selected,
    _sql_adapter,
    _start_options,
    _start_stored,
    _step_stored,
    open_read_only,
)

if TYPE_CHECKING:
    from statifier.persistence.adapter import Adapter
    from statifier.sql import TableOptions

__all__ = [
    "Continuation",
    "DryRunResult",
    "DryRunSummary",
    "Outcome",
    "continue_log",
    "migration_dry_run",
]


class Outcome(enum.Enum):
    """What a migration does to one execution, as
    :class:`~statifier.persistence.MigrationSummary` sorts them."""

    MOVED = "moved"
    PARKED = "parked"
    UNCHANGED = "unchanged"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Continuation:
    """A migration after input ``at`` of the log, and what followed it.

    Attributes:
        at: the migration point: 0 for right after the start, ``n`` for after the
            ``n``-th logged input (at most the log's length).
        outcome: what the migration would have done there: ``moved``, ``parked``,
            ``unchanged`` (the chart had ended by then) or ``failed``; ``None`` when the
            log cannot be replayed up to it (``replay`` says why).
        reason: why it would have parked, left it or failed there.
        replay: the rest of the log on the stored chart and on the revision from the
            carried position, compared (:class:`~statifier.shadow.ShadowResult`; its
            ``inputs`` is the index of the last input replayed, ``divergence`` and
            ``new_errors`` count inputs from the log's start); ``None`` unless moved.
    """

    at: int
    outcome: Outcome | None
    reason: str | None = None
    replay: ShadowResult | None = None

    @property
    def clean(self) -> bool:
        """Whether it moved and replayed the same, or found the chart ended."""
        return self.outcome is Outcome.UNCHANGED or self.verdict is Verdict.SAME

    @property
    def verdict(self) -> Verdict | None:
        """The replay's verdict, or ``None`` when the execution did not move there."""
        return None if self.replay is None else self.replay.verdict

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "outcome": None if self.outcome is None else self.outcome.value,
            "reason": self.reason,
            "replay": None if self.replay is None else self.replay.as_json(),
        }


@dataclass(frozen=True, slots=True)
class DryRunResult:
    """What a migration would do to one execution.

    Attributes:
        execution_id: the execution.
        outcome: what a migration run now would do (see :class:`Outcome`).
        reason: why it would be parked, left unchanged or fail, in the words
            :class:`~statifier.persistence.MigrationSummary` gives; ``None`` if moved.
        configuration: when moved, the sorted ids of the active atomic states it
            would be in on the revision.
        datamodel: when moved, its datamodel there (the interpreter's variables left
            out).
        continuation: with ``at``, the migration at that input of its log and what
            followed (for every execution still on an earlier revision, ended ones
            too), else ``None``.
        content_hash: the chart it runs; status: its status when read.
    """

    execution_id: str
    _: KW_ONLY
    outcome: Outcome
    reason: str | None = None
    configuration: tuple[str, ...] = ()
    datamodel: Mapping[str, Value] = field(default_factory=dict)
    continuation: Continuation | None = None
    content_hash: str | None = None
    status: Status | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "configuration": list(self.configuration),
            "datamodel": {name: tagged.encode(value) for name, value in self.datamodel.items()},
            "continuation": None if self.continuation is None else self.continuation.as_json(),
            "content_hash": self.content_hash,
            "status": None if self.status is None else self.status.value,
        }


@dataclass(frozen=True, slots=True)
class DryRunSummary:
    """The results of one dry run, oldest execution first.

    Attributes:
        revision: the revision's content hash.
        at: the migration point of the continuations, or ``None``.
        results: one per execution read.
        counts: how many executions got each outcome (every outcome present).
    """

    revision: str
    at: int | None
    results: tuple[DryRunResult, ...]
    counts: Mapping[Outcome, int]

    @property
    def selected(self) -> int:
        """How many executions the selection chose (each has a result). ``0``: nothing
        was tried, which is no evidence about the migration: :attr:`clean` is then
        true of nothing, and a gate checks this first (``statifier replay --migrate``
        exits 1)."""
        return len(self.results)

    @classmethod
    def of(cls, revision: str, at: int | None, results: Sequence[DryRunResult]) -> DryRunSummary:
        tally = Counter(result.outcome for result in results)
        return cls(revision, at, tuple(results), {outcome: tally[outcome] for outcome in Outcome})

    @property
    def clean(self) -> bool:
        """Whether nothing would be parked or fail now, and every continuation either
        moved and replayed the same or found the chart ended. True when none was
        selected: see :attr:`selected`."""
        if self.counts[Outcome.PARKED] or self.counts[Outcome.FAILED]:
            return False
        return all(
            result.continuation is None or result.continuation.clean for result in self.results
        )

    def migration_summary(self) -> MigrationSummary:
        """The outcomes as a :class:`~statifier.persistence.MigrationSummary`, each id
        under its outcome (``migrate_all`` itself lists only the executions that hold
        the old chart: ended ones never appear in its answer)."""
        sorted_results = sorted(self.results, key=lambda result: result.execution_id)

        def reasons(outcome: Outcome) -> dict[str, str]:
            return {r.execution_id: r.reason or "" for r in sorted_results if r.outcome is outcome}

        moved = tuple(r.execution_id for r in sorted_results if r.outcome is Outcome.MOVED)
        return MigrationSummary(
            moved, reasons(Outcome.PARKED), reasons(Outcome.UNCHANGED), reasons(Outcome.FAILED)
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "at": self.at,
            "selected": self.selected,
            "counts": {outcome.value: count for outcome, count in self.counts.items()},
            "results": [result.as_json() for result in self.results],
        }


# One log.


def continue_log(
    plan: MigrationPlan,
    inputs: Sequence[LoggedInput],
    at: int,
    *,
    execution_id: str = "session",
    options: StartOptions | None = None,
    stored: MachineState | None = None,
    status: Status | None = None,
    max_inputs: int = MAX_INPUTS,
) -> Continuation:
    """A migration along ``plan`` after input ``at`` of ``inputs`` (an input log
    recorded on ``plan.source``, in order), and the rest of the log replayed on both
    charts and compared.

    Args:
        plan: from the chart the log was recorded on to the revision.
        at: the migration point (0: right after the start); past the log's end, its
            end.
        execution_id, options, stored, status, max_inputs: as
            :func:`statifier.shadow.compare_logs` takes them (``stored``: the replay
            on the stored chart must end there, else the replay is untrusted).

    Never raises for what the log holds: what cannot be replayed is reported untrusted.

    Raises:
        ValueError: ``at`` or ``max_inputs`` is negative.
    """
    if at < 0:
        raise ValueError(f"at is an input's index, not {at!r}")
    if max_inputs < 0:
        raise ValueError(f"max_inputs is a count of inputs, not {max_inputs!r}")
    start = replace(options or StartOptions(), session_id=execution_id, trace=False)
    start, rest = logged_start(inputs, start)
    at = min(at, len(rest))
    added = {e.id for e in plan.target.data} - {e.id for e in plan.source.data}
    comparison = _Comparison(
        plan.source,
        plan.target,
        execution_id,
        status,
        old_id=plan.new_id,
        hidden=SYSTEM_VARIABLES | added,
    )
    reached = _replayed_to(plan.source, start, rest[:at], max_inputs)
    if isinstance(reached, str):
        return Continuation(at, None, replay=comparison._untrusted(reached))
    if not reached.running:  # a migration leaves an execution that has ended as it is
        return Continuation(at, Outcome.UNCHANGED, "the chart had ended")
    try:
        carried = move(reached, plan)
    except PersistenceError as error:
        return Continuation(at, Outcome.FAILED, str(error))
    if isinstance(carried, Unmappable):
        return Continuation(at, Outcome.PARKED, carried.reason)
    comparison.replayed = at
    replay = comparison.follow(reached, carried.state, rest[at:], at + 1, stored, max_inputs)
    return Continuation(at, Outcome.MOVED, replay=replay)


def _replayed_to(
    old: Machine, start: StartOptions, inputs: Sequence[LoggedInput], max_inputs: int
) -> MachineState | str:
    """The stored chart's position after ``inputs``, or why the replay cannot be
    trusted, as the shadow replay steps it."""
    started = _start_stored(old, start)
    if isinstance(started, str):
        return started
    state = started[0]
    for index, entry in enumerate(inputs, start=1):
        if index > max_inputs:
            return f"the log is longer than {max_inputs} inputs"
        stepped = _step_stored(index, entry, state)
        if isinstance(stepped, str):
            return stepped
        state = stepped[0]
    return state


# The database.


Progress = Callable[[int, int, DryRunResult], None]
"""Told after each execution: ``(done, total, its result)``."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every execution's plan is built from."""

    revision: Machine
    state_map: Mapping[str, str | None]
    data: Mapping[str, Value]
    at: int | None
    max_inputs: int


async def migration_dry_run(
    source: Storage | Adapter | str,
    revision: Machine,
    selection: Selection | None = None,
    *,
    state_map: Mapping[str, str | None] | None = None,
    data: Mapping[str, Value] | None = None,
    at: int | None = None,
    codec: BlobCodec = PLAIN,
    functions: Mapping[str, Function] | None = None,
    tables: TableOptions | None = None,
    max_inputs: int = MAX_INPUTS,
    progress: Progress | None = None,
) -> DryRunSummary:
    """What migrating the selected executions onto ``revision`` would do, and with
    ``at``, what the revision would have done with their logs after a migration at
    that input (see the module's description). Nothing is written.

    Args:
        source: a :class:`~statifier.persistence.Storage`, an adapter, or a database
            URL (opened read-only, under ``tables``).
        revision: the chart they would move to.
        selection: which executions (every one of the revision's chart by default),
            as :func:`statifier.shadow.shadow_replay` selects them.
        state_map, data: the plan's, as
            :class:`~statifier.persistence.MigrationPlan` takes them; each execution's
            plan goes from its own stored chart to ``revision``.
        at: the migration point of the continuations (0: right after the start), or
            ``None`` for none.
        codec, functions, max_inputs, progress: as
            :func:`statifier.shadow.shadow_replay` takes them.

    Returns:
        The results, oldest execution first, with their counts; none when the
        selection chose none (:attr:`DryRunSummary.selected` is ``0``).

    Raises:
        ValueError: a bad selection, source, ``at`` or ``max_inputs``.
        PersistenceError: the database could not be read (a record it cannot decode
            is reported ``failed`` instead, an input-log entry it cannot decode makes
            that execution's continuation untrusted).
    """
    if at is not None and at < 0:
        raise ValueError(f"at is an input's index, not {at!r}")
    if max_inputs < 0:
        raise ValueError(f"max_inputs is a count of inputs, not {max_inputs!r}")
    chosen = selection or Selection()
    if chosen.document is None and revision.identity.name is not None:
        chosen = replace(chosen, document=revision.identity.name)
    plan = _Plan(revision, dict(state_map or {}), dict(data or {}), at, max_inputs)
    if isinstance(source, str):
        async with open_read_only(source, tables=tables) as adapter:
            storage = Storage(adapter, codec=codec, functions=functions)
            return await _dry_run_all(storage, plan, chosen, progress)
    if not isinstance(source, Storage):
        source = Storage(source, codec=codec, functions=functions)
    return await _dry_run_all(source, plan, chosen, progress)


async def _dry_run_all(
    storage: Storage, plan: _Plan, selection: Selection, progress: Progress | None
) -> DryRunSummary:
    ids = await _selected(storage, selection)
    lifecycle = Executions(storage)  # only read through: its input log, decoded
    sql = None if plan.at is None else _sql_adapter(storage)
    results: list[DryRunResult] = []
    for first in range(0, len(ids), _READ_AHEAD):
        batch = ids[first : first + _READ_AHEAD]
        await storage.read_ahead(batch)
        logs = None if sql is None else await _read_logs(sql, storage.codec, batch)
        for execution_id in batch:
            log = None if logs is None else logs.get(execution_id, [])
            result = await _dry_run_one(storage, lifecycle, plan, execution_id, log)
            results.append(result)
            if progress is not None:
                progress(len(results), len(ids), result)
    return DryRunSummary.of(plan.revision.identity.content_hash, plan.at, results)


async def _dry_run_one(
    storage: Storage,
    lifecycle: Executions,
    plan: _Plan,
    execution_id: str,
    log: list[LoggedInput] | str | None,
) -> DryRunResult:
    """One execution; ``log`` is its input log read ahead (a string: why it could not
    be read), or ``None`` to read it now if needed."""
    try:
        record = await storage.find_execution(execution_id)
    except UndecodableBlob as error:
        return DryRunResult(
            execution_id, outcome=Outcome.FAILED, reason=f"its record cannot be decoded: {error}"
        )
    if record is None:
        why = "it was deleted while the dry run ran"
        return DryRunResult(execution_id, outcome=Outcome.UNCHANGED, reason=why)

    def result(outcome: Outcome, reason: str | None, **found: Any) -> DryRunResult:
        return DryRunResult(
            execution_id,
            outcome=outcome,
            reason=reason,
            content_hash=record.content_hash,
            status=record.status,
            **found,
        )

    target = plan.revision.identity.content_hash
    unchanged = left_as_is(record, target)
    if unchanged is not None and (plan.at is None or record.content_hash == target):
        return result(Outcome.UNCHANGED, unchanged)
    # A migration never reads an execution it leaves: its chart, position and plan
    # matter here only for the continuation.
    migration, state, failure = await _read(storage, record, plan)
    if unchanged is not None:
        now = result(Outcome.UNCHANGED, unchanged)
    elif failure is not None:
        now = result(Outcome.FAILED, failure)
    else:
        assert migration is not None  # _read gives a reason when either is missing
        assert state is not None
        now = _now(state, migration, result)
    if plan.at is None:
        return now
    if migration is None:
        return replace(now, continuation=Continuation(plan.at, Outcome.FAILED, failure))
    after = await _continuation(lifecycle, record, migration, state, log, plan)
    return replace(now, continuation=after)


async def _read(
    storage: Storage, record: ExecutionRecord, plan: _Plan
) -> tuple[MigrationPlan | None, MachineState | None, str | None]:
    """The execution's plan and position, as far as they can be had, and why not."""
    try:
        old = await storage.machine(record.content_hash)
    except PersistenceError as error:  # not found, retired, damaged, undecodable
        return None, None, f"its stored chart cannot be read: {_said(error)}"
    try:
        migration = MigrationPlan(old, plan.revision, plan.state_map, plan.data)
    except (InvalidMigrationPlan, TypeError) as error:
        return None, None, f"the plan does not fit its chart: {error}"
    try:
        return migration, storage.load(record, old), None
    except PositionError as error:  # as migrate_all reports a damaged or pruned one
        return migration, None, str(error)


def _now(
    state: MachineState, plan: MigrationPlan, result: Callable[..., DryRunResult]
) -> DryRunResult:
    """What a migration along ``plan`` now does to an execution it does not leave as
    it is (:func:`~statifier.persistence.migration.left_as_is`), decided as the
    migration decides."""
    try:
        carried = move(state, plan)
    except PersistenceError as error:  # the carried position cannot be stored
        return result(Outcome.FAILED, str(error))
    if isinstance(carried, Unmappable):
        return result(Outcome.PARKED, carried.reason)
    moved = carried.state
    shown = {k: v for k, v in moved.datamodel.items() if k not in SYSTEM_VARIABLES}
    return result(Outcome.MOVED, None, configuration=moved.leaf_configuration(), datamodel=shown)


async def _continuation(
    lifecycle: Executions,
    record: ExecutionRecord,
    plan: MigrationPlan,
    state: MachineState | None,
    log: list[LoggedInput] | str | None,
    settings: _Plan,
) -> Continuation:
    assert settings.at is not None
    untrusted = _Comparison(plan.source, plan.target, record.id, record.status)._untrusted
    if isinstance(log, str):
        return Continuation(settings.at, None, replay=untrusted(f"its input log: {log}"))
    try:
        inputs = await lifecycle.inputs(record.id) if log is None else log
    except (UndecodableBlob, PositionError) as error:
        why = f"its input log cannot be read: {_said(error)}"
        return Continuation(settings.at, None, replay=untrusted(why))
    if state is None:  # its start options and its end are unknown
        return Continuation(settings.at, None, replay=untrusted("its position cannot be read"))
    return continue_log(
        plan,
        inputs,
        settings.at,
        execution_id=record.id,
        options=_start_options(state),
        stored=state,
        status=record.status,
        max_inputs=settings.max_inputs,
    )
