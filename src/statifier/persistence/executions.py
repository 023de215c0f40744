"""The lifecycle of durable executions: create, step, fail, cancel.

Each call is one guarded, serialized operation: take the execution's exclusion, fetch
its record, load its position against the machine given (the identity guard), run the
pure interpreter, hand the effects to the executor one at a time, then store the new
position, status and input. Between calls nothing lives in memory but the records.

>>> import asyncio
>>> from statifier.chart import compile_chart
>>> from statifier.core import Event
>>> from statifier.persistence import Executions, MemoryAdapter, Storage
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
...     '<state id="open"><transition event="close" target="closed"/></state>'
...     '<final id="closed"/></scxml>'
... )
>>> executions = Executions(Storage(MemoryAdapter()))
>>> async def run():
...     created = await executions.create("door_1", machine)
...     closed = await executions.step("door_1", machine, Event("close"))
...     late = await executions.step("door_1", machine, Event("close"))
...     return created.execution.status, closed.execution.status, type(late).__name__
>>> asyncio.run(run())
(<Status.ACTIVE: 'active'>, <Status.COMPLETED: 'completed'>, 'Discarded')
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Container, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, replace
from datetime import datetime
from typing import Any, Final, Protocol

from statifier.chart import Machine
from statifier.chart.model import ChartIdentity
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core import positions as stored
from statifier.core.interpreter import cancel as cancel_chart
from statifier.core.interpreter import deliver_internal
from statifier.expr import UNDEFINED, Value, tagged
from statifier.persistence.errors import (
    ChartNotFound,
    ChartRetirementUnsupported,
    ExecutionExists,
    ExecutionNotFound,
    InvalidMigrationPlan,
    MetadataUnsupported,
    PersistenceError,
    Pinned,
    PinSourceFailed,
    RefusalsUnsettled,
    Unstorable,
)
from statifier.persistence.executor import Executor, ignore_effects, perform, refuse_unperformed
from statifier.persistence.migration import (
    MIGRATE_VIA,
    LoggedMigration,
    Migrated,
    MigrationPlan,
    MigrationSummary,
    Parked,
    Unmappable,
    left_as_is,
    move,
)
from statifier.persistence.records import (
    AnswerRecord,
    ChartRecord,
    ErrorRecord,
    ExecutionRecord,
    Status,
)
from statifier.persistence.reentry import stepping
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT, AdapterLock, Serialization
from statifier.persistence.step_errors import (
    MAX_STEP_ERRORS,
    ErrorPolicy,
    OnError,
    StepError,
    error_record,
    step_errors,
)
from statifier.persistence.storage import Storage
from statifier.repeats import IntervalTally
from statifier.telemetry import enabled, report

__all__ = [
    "CREATE_VIA",
    "EXECUTION_STATUS_KEY",
    "INVOKE_KEY",
    "PARENT_KEY",
    "START_EVENT",
    "Discarded",
    "Executions",
    "LoggedInput",
    "PinSource",
    "Stepped",
    "decode_outcome",
    "logged_input",
    "logged_start",
]

CREATE_VIA: Final = "create"
"""The input log's ``via`` for a create's start data: an execution created with initial
datamodel values logs them first, as the event :data:`START_EVENT` whose data is those
values, so that a replay of the log from the chart alone starts where the execution
did. A create with no start data logs nothing. No step may log under it."""

START_EVENT: Final = "statifier.start"
"""The name of the :data:`CREATE_VIA` entry's event (never delivered to a chart)."""

EXECUTION_STATUS_KEY: Final = "statifier_persistence:execution_status"
"""A top-level ``<final>`` whose donedata maps this key to ``"failed"`` ends its
execution as failed (``failure`` ``"failed_final"``) rather than completed."""

PARENT_KEY: Final = "statifier.parent"
"""Metadata key naming a durable child's parent execution; cancelling the parent
cancels the children."""
INVOKE_KEY: Final = "statifier.invoke"
"""Metadata key: the invoke id a durable child answers. An execution whose metadata
names both a parent and an invoke id owes its parent an answer when it ends, written
(:class:`~statifier.persistence.records.AnswerRecord`) in the transaction that ends it."""

MAX_REFUSAL_ROUNDS: Final = 32
"""How many times one call tells the chart of refused effects before it gives up: a
chart that meets every refusal with another refused send would never settle."""

MIGRATION_BATCH: Final = 64
"""How many executions :meth:`Executions.migrate_all` migrates at once by default."""

MAX_METADATA_PAIRS: Final = 64
MAX_METADATA_TEXT: Final = 1_024
UNHANDLED_ERROR: Final = "unhandled_error"
"""The outcome's ``reason`` of an execution :attr:`OnError.FAIL` failed."""
_MAX_FAILURE: Final = 500
_log = logging.getLogger("statifier.persistence")
_repeats = IntervalTally()


@dataclass(frozen=True, slots=True)
class Stepped:
    """A call that ran the chart.

    Attributes:
        execution: the record as stored by this call.
        state: the new position.
        effects: everything the interpreter emitted, ``Done`` included (the executor
            saw all but ``Done``).
        donedata: the chart's donedata when this call finished it, else undefined.
    """

    execution: ExecutionRecord
    _: KW_ONLY
    state: MachineState
    effects: tuple[fx.Effect, ...]
    donedata: Value = UNDEFINED

    @property
    def finished(self) -> bool:
        """Whether this call ended the execution."""
        return self.execution.status.terminal

    @property
    def matched(self) -> bool:
        """Whether a transition took the call's external event (``False`` when the
        chart discarded it unused: :class:`~statifier.core.effects.Unmatched`)."""
        return not any(isinstance(effect, fx.Unmatched) for effect in self.effects)

    @property
    def errors(self) -> tuple[StepError, ...]:
        """The error events this call raised, in order (see
        :mod:`statifier.persistence.step_errors`)."""
        return step_errors(self.effects)


@dataclass(frozen=True, slots=True)
class Discarded:
    """A call that changed nothing because the execution does not take it: it has
    ended, or is parked (``needs_migration``), or (a migration) is already on the
    plan's new chart. Nothing was logged."""

    execution: ExecutionRecord


@dataclass(frozen=True, slots=True)
class LoggedInput:
    """An input log entry, decoded. ``event`` is ``None`` for a migration (via
    ``"migrate"``; ``migration`` says what it did) and for the marker that closed a log
    at its cap (``migration`` is ``None`` too)."""

    seq: int
    via: str
    event: Event | None
    recorded_at: datetime
    migration: LoggedMigration | None = None


class PinSource(Protocol):
    """Something of the host's that can hold a chart in use (pending timers, address
    rows). Asked during retirement; what it raises refuses the retirement."""

    async def pins(self, content_hash: str, execution_ids: Sequence[str]) -> Mapping[str, int]:
        """Named counts of what holds ``content_hash``; ``execution_ids`` are the
        executions still active on it."""
        ...


def decode_outcome(record: ExecutionRecord) -> Value:
    """The answer a finished execution left: its donedata, or a failure's details
    (``{"reason": ...}``); undefined when it left none."""
    if record.outcome is None:
        return UNDEFINED
    return tagged.decode(json.loads(record.outcome))


class Executions:
    """Creates and steps durable executions over a :class:`Storage`.

    Args:
        storage: the guarded store.
        executor: receives every effect (except ``Done``) of every call, in order;
            by default :func:`~statifier.persistence.executor.refuse_unperformed`,
            which performs nothing and refuses every send and invocation.
        serialization: how calls for one execution are kept apart; by default the
            adapter's lock (see :mod:`statifier.persistence.serialization`).
        lock_wait: for the default serialization, the most seconds a call waits for
            the execution's lock before :class:`LockTimeout` (30 by default,
            :data:`~statifier.persistence.serialization.DEFAULT_LOCK_WAIT`); ``None``
            waits without bound.
        on_error: what an error event no transition takes does (see
            :class:`~statifier.persistence.step_errors.OnError`): ``continue`` (SCXML's
            behaviour, the default) or ``fail``, for every chart or per chart (an
            :class:`~statifier.persistence.step_errors.ErrorPolicy`); a call may say
            otherwise for itself.

    Every error event a call raises is recorded whatever the policy: counted on the
    execution (``error_count``, ``last_error_at``), stored with the step where the
    adapter keeps errors, returned in :attr:`Stepped.errors`, reported as the
    telemetry event ``statifier.persistence.error`` and logged at warning level on the
    logger ``statifier.persistence``.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        executor: Executor = refuse_unperformed,
        serialization: Serialization | None = None,
        lock_wait: float | None = DEFAULT_LOCK_WAIT,
        on_error: ErrorPolicy | OnError | str = OnError.CONTINUE,
    ) -> None:
        self.storage = storage
        self.executor = executor
        self.serialization = serialization or AdapterLock(storage.adapter, lock_wait)
        self.on_error = ErrorPolicy.of_value(on_error)

    @asynccontextmanager
    async def exclusive(self, execution_id: str) -> AsyncIterator[None]:
        """The execution's exclusion for the block, the way every call of this
        lifecycle takes it (for :meth:`step_held`).

        Raises:
            ReentrantCall: the block would be inside a call for the same execution
                (from its route, executor or sink).
            LockTimeout: the execution stayed locked longer than the lock wait.
        """
        started = time.perf_counter()
        with stepping(execution_id):
            async with self.serialization.exclusive(execution_id):
                _locked(execution_id, started)
                yield

    async def create(
        self,
        execution_id: str,
        machine: Machine,
        *,
        options: StartOptions | None = None,
        metadata: Mapping[str, str] | None = None,
        executor: Executor | None = None,
        on_error: OnError | str | None = None,
    ) -> Stepped:
        """Start ``machine`` as a new execution: store the chart, initialize, hand the
        effects over, store the position.

        ``options.session_id`` is replaced by ``execution_id``, so a replay of the input
        log starts exactly where this did. ``metadata`` holds host identities (never
        personal data); it is written once. ``executor`` and ``on_error`` replace this
        lifecycle's for the call.

        Raises:
            ExecutionExists: the id is taken (checked before any effect).
            MetadataUnsupported: metadata given to an adapter that keeps none.
            Unstorable: the initial position cannot be stored.
            ChartRetired: the chart was retired.
        """
        started = time.perf_counter()
        pairs = _checked_metadata(metadata)
        if pairs and not self.storage.capabilities.metadata:
            raise MetadataUnsupported("this adapter cannot store execution metadata")
        await self.storage.save_chart(machine)
        start = replace(options or StartOptions(), session_id=execution_id)
        async with self.exclusive(execution_id):
            if await self.storage.find_execution(execution_id):
                raise ExecutionExists(execution_id)
            state, effects = initialize(machine, start)
            position = _dump(state)  # an unstorable start is refused before any effect
            carried, effects = await self._carry_out(
                state, effects, execution_id, "create", executor
            )
            if carried is not state:  # refusals stepped the chart on
                state, position = carried, _dump(carried)
            errors = step_errors(effects)
            policy = self._policy(on_error, machine.identity.content_hash)
            status, failure, outcome, donedata = _ending(effects, errors, policy)
            now = self.storage.clock()
            record = ExecutionRecord(
                execution_id,
                content_hash=machine.identity.content_hash,
                status=status,
                position=position,
                metadata=pairs,
                outcome=outcome,
                failure=failure,
                created_at=now,
                updated_at=now,
                ended_at=now if status.terminal else None,
                error_count=len(errors),
                last_error_at=now if errors else None,
                final_state=state.final_state(),
            )
            await self.storage.insert_execution(record)
            seq = None
            if start.datamodel and self.storage.capabilities.input_log:
                seq = await self.storage.append_input(
                    execution_id, CREATE_VIA, _dump_event(_start_entry(start)), now
                )
            if errors:
                await self.storage.record_errors(_records(record, errors, CREATE_VIA, seq))
            if status.terminal:
                await self._owe_answer(record)
        self._lifecycle(record, "created")
        if status.terminal:
            self._lifecycle(record, status.value)
        self._stepped(record, "create", effects, started, errors)
        return Stepped(record, state=state, effects=tuple(effects), donedata=donedata)

    async def step(
        self,
        execution_id: str,
        machine: Machine | None,
        event: Event,
        *,
        routes: Container[str] | None = None,
        via: str = "step",
        when: Callable[[MachineState], bool] | None = None,
        executor: Executor | None = None,
        internal: bool = False,
        on_error: OnError | str | None = None,
    ) -> Stepped | Discarded:
        """Deliver one external event (or, with ``internal``, one for the internal
        queue: a delayed ``<send target="#_internal">`` when it fires).

        Args:
            machine: the chart the execution runs (the guard checks it), or ``None`` to
                use the stored chart (compiled once per storage).
            routes: the send targets reachable during this step (see
                :class:`~statifier.core.StartOptions`); never stored.
            via: how the event entered, recorded in the input log.
            when: checked against the loaded position; ``False`` discards the event
                (the driver drops answers to invocations the chart has cancelled).
            executor: replaces this lifecycle's executor for the call (the driver
                passes one that collects the answers of the call's invocations).
            internal: put ``event`` on the internal queue rather than the external one.
            on_error: replaces this lifecycle's :class:`OnError` for the call.

        Returns:
            :class:`Stepped`, or :class:`Discarded` when the execution has ended or is
            parked, or ``when`` declined (a step never raises for that).

        Raises:
            ExecutionNotFound: no such execution.
            IdentityMismatch: ``machine`` is not the chart the execution runs.
            LockTimeout: the execution stayed locked longer than the lock wait.
            Unstorable: the event or the new position cannot be stored (nothing
                happened: no effect ran).
        """
        started = time.perf_counter()
        # The hot path: the exclusion is entered directly, not through exclusive().
        with stepping(execution_id):
            async with self.serialization.exclusive(execution_id):
                _locked(execution_id, started)
                result = await self.step_held(
                    execution_id,
                    machine,
                    event,
                    routes=routes,
                    via=via,
                    when=when,
                    executor=executor,
                    internal=internal,
                    on_error=on_error,
                )
        self.report_step(result, via, started)
        return result

    async def step_held(
        self,
        execution_id: str,
        machine: Machine | None,
        event: Event,
        *,
        routes: Container[str] | None = None,
        via: str = "step",
        when: Callable[[MachineState], bool] | None = None,
        executor: Executor | None = None,
        internal: bool = False,
        on_error: OnError | str | None = None,
    ) -> Stepped | Discarded:
        """:meth:`step`, for a caller that already holds the execution's exclusion
        (:meth:`exclusive`) and does more in the same unit
        of work (the driver marks a child's answer delivered in the step that takes
        it). Reports nothing: pass the result to :meth:`report_step` once the
        exclusion is released. Arguments, results and errors as :meth:`step`."""
        if via in (MIGRATE_VIA, CREATE_VIA):
            raise ValueError(f"the via {via!r} is the lifecycle's own")
        storage = self.storage
        found = await storage.find_execution(execution_id)
        if found is None:
            raise ExecutionNotFound(execution_id)
        record = found
        if record.status is not Status.ACTIVE:
            return Discarded(record)
        if machine is None:
            machine = await storage.machine(record.content_hash)
        state = storage.load(record, machine)
        if not state.running or (when is not None and not when(state)):
            return Discarded(record)
        if routes is not None:
            state = state._replace(routes=routes)
        entry = _dump_event(event)
        if internal:
            state, effects = deliver_internal(state, event)
        else:
            state, effects = handle_event(state, event)
        position = _dump(state)  # an unstorable result is refused before any effect
        performer = self.executor if executor is None else executor
        if performer is not ignore_effects and effects:
            carried, effects = await self._carry_out(state, effects, execution_id, via, performer)
            if carried is not state:  # refusals stepped the chart on
                state, position = carried, _dump(carried)
        errors = step_errors(effects) if effects else ()
        policy = self._policy(on_error, record.content_hash)
        status, failure, outcome, donedata = _ending(effects, errors, policy)
        ended = status is not Status.ACTIVE  # _ending returns active or an end
        now = storage.clock()
        record = ExecutionRecord(
            record.id,
            content_hash=record.content_hash,
            status=status,
            position=position,
            metadata=record.metadata,
            outcome=outcome,
            failure=failure,
            created_at=record.created_at,
            updated_at=now,
            ended_at=now if ended else None,
            error_count=record.error_count + len(errors),
            last_error_at=now if errors else record.last_error_at,
            final_state=state.final_state() if ended else None,
        )
        if storage.capabilities.input_log:
            await storage.record_step(record, via, entry, now, _records(record, errors, via, None))
        else:
            await storage.update_execution(record)
            await storage.record_errors(_records(record, errors, via, None))
        if ended:
            await self._owe_answer(record)
        storage.remember(execution_id, position, state)
        return Stepped(record, state=state, effects=tuple(effects), donedata=donedata)

    def report_step(self, result: Stepped | Discarded, via: str, started: float) -> None:
        """Report what :meth:`step_held` did (``started``: its ``time.perf_counter()``)."""
        if not isinstance(result, Stepped):
            return
        record = result.execution
        if record.status.terminal:
            self._lifecycle(record, record.status.value)
        self._stepped(record, via, result.effects, started, result.errors)

    async def fail(self, execution_id: str, reason: str) -> ExecutionRecord | Discarded:
        """End an execution as failed on the host's word; its position stays as it was
        and its outcome is ``{"reason": reason}``. A terminal execution is discarded."""
        async with self.exclusive(execution_id):
            record = await self.storage.fetch_execution(execution_id)
            if record.status.terminal:
                return Discarded(record)
            now = self.storage.clock()
            record = replace(
                record,
                status=Status.FAILED,
                outcome=_encode({"reason": reason}),
                failure=reason,
                updated_at=now,
                ended_at=now,
            )
            await self.storage.update_execution(record)
            await self._owe_answer(record)
        self._lifecycle(record, "failed")
        return record

    async def cancel(self, execution_id: str, *, by_parent: bool = False) -> Stepped | Discarded:
        """Stop an execution from outside: its active states are exited (their onexit
        content runs and their invocations are cancelled, all through the executor),
        then every durable child it started (executions whose metadata names it under
        :data:`PARENT_KEY`) is cancelled the same way, each under its own exclusion
        and after this one's is released. A terminal execution is discarded.

        A durable child's answer (``cancelled``) is written in the same transaction;
        ``by_parent`` (its parent, or the parent's driver, cancels it) writes it
        already delivered, since the parent asked for the end it would be told of."""
        started = time.perf_counter()
        async with self.exclusive(execution_id):
            record = await self.storage.fetch_execution(execution_id)
            if record.status.terminal:
                return Discarded(record)
            machine = await self.storage.machine(record.content_hash)
            state = self.storage.load(record, machine)
            effects: list[fx.Effect] = []
            if state.running:
                state, effects = cancel_chart(state)
            position = _dump(state)
            await self._perform(effects, execution_id, "cancel")
            errors = step_errors(effects)
            now = self.storage.clock()
            record = replace(
                record,
                status=Status.CANCELLED,
                position=position,
                outcome=None,
                updated_at=now,
                ended_at=now,
                error_count=record.error_count + len(errors),
                last_error_at=now if errors else record.last_error_at,
            )
            await self.storage.update_execution(record)
            await self.storage.record_errors(_records(record, errors, "cancel", None))
            await self._owe_answer(record, delivered=by_parent)
        self._lifecycle(record, "cancelled")
        self._stepped(record, "cancel", effects, started, errors)
        if self.storage.capabilities.metadata:
            await self.cancel_matching({PARENT_KEY: execution_id})
        return Stepped(record, state=state, effects=tuple(effects))

    async def cancel_matching(self, pairs: Mapping[str, str]) -> None:
        """Cancel, in id order, every execution not yet ended whose metadata holds all
        of ``pairs`` (the durable children of a parent, or of one of its invocations),
        each ``by_parent`` (see :meth:`cancel`).

        Raises:
            MetadataUnsupported: the adapter keeps no metadata.
        """
        storage = self.storage
        if not storage.capabilities.metadata:
            raise MetadataUnsupported("this adapter cannot find executions by metadata")
        statuses = await storage.statuses_by_metadata(pairs)
        for execution_id, status in sorted(statuses.items()):
            if not status.terminal:
                await self.cancel(execution_id, by_parent=True)

    async def _owe_answer(self, record: ExecutionRecord, *, delivered: bool = False) -> None:
        """A durable child ended: write what it owes its parent, in the unit of work
        that ended it (so the answer commits with the end, or neither does)."""
        parent_id = record.metadata.get(PARENT_KEY)
        invoke_id = record.metadata.get(INVOKE_KEY)
        if parent_id is None or invoke_id is None or not self.storage.capabilities.answers:
            return
        now = record.ended_at or self.storage.clock()
        answer = AnswerRecord(
            record.id,
            parent_id=parent_id,
            invoke_id=invoke_id,
            content_hash=record.content_hash,
            status=record.status,
            outcome=record.outcome,
            failure=record.failure,
            created_at=now,
            delivered_at=now if delivered else None,
        )
        await self.storage.insert_answer(answer)

    async def park(self, execution_id: str) -> ExecutionRecord | Discarded:
        """Set an active execution aside (``needs_migration``): it takes no event until
        :meth:`unpark`. A terminal execution is discarded."""
        return await self._set_status(execution_id, Status.ACTIVE, Status.NEEDS_MIGRATION)

    async def unpark(self, execution_id: str) -> ExecutionRecord | Discarded:
        """Put a parked execution back to ``active`` on its chart (a migration's reason
        for parking it is cleared)."""
        return await self._set_status(execution_id, Status.NEEDS_MIGRATION, Status.ACTIVE)

    async def pause(self, execution_id: str) -> ExecutionRecord | Discarded:
        """Pause an active execution: it takes no event until :meth:`resume` (a step
        to it is discarded; the router keeps what is sent meanwhile and steps it in on
        resume, :meth:`statifier.router.Router.resume`). An execution that is not
        active is discarded: nothing changes.

        Raises:
            ExecutionNotFound: no such execution.
        """
        return await self._set_status(execution_id, Status.ACTIVE, Status.PAUSED)

    async def resume(self, execution_id: str) -> ExecutionRecord | Discarded:
        """Put a paused execution back to ``active``; one that is not paused is
        discarded. Steps nothing: what was held for it is the router's to step, in the
        same transaction.

        Raises:
            ExecutionNotFound: no such execution.
        """
        return await self._set_status(execution_id, Status.PAUSED, Status.ACTIVE)

    async def _set_status(
        self, execution_id: str, before: Status, after: Status
    ) -> ExecutionRecord | Discarded:
        async with self.exclusive(execution_id):
            record = await self.storage.fetch_execution(execution_id)
            if record.status is not before:
                return Discarded(record)
            record = replace(record, status=after, failure=None, updated_at=self.storage.clock())
            await self.storage.update_execution(record)
        self._lifecycle(record, after.value)
        return record

    async def inputs(self, execution_id: str) -> list[LoggedInput]:
        """The execution's input log, decoded (empty when the adapter keeps none)."""
        if not self.storage.capabilities.input_log:
            return []
        entries = await self.storage.inputs(execution_id)
        return [
            logged_input(entry.seq, entry.via, entry.event, entry.recorded_at) for entry in entries
        ]

    # Migration.

    async def migrate(
        self, execution_id: str, plan: MigrationPlan
    ) -> Migrated | Parked | Discarded:
        """Move one execution onto ``plan.target``, as one guarded operation under its
        exclusion: its position is carried by state id (see
        :func:`~statifier.persistence.migration.carry`), and the record moves to the new
        chart only while it is still on the old one. No executable content runs and
        no effect is emitted: states keep being active, invocations stay live. The
        attempt is logged in the input log (via ``"migrate"``) either way.

        The new chart is stored first (idempotent). An ``active`` or ``needs_migration``
        execution is migrated; one whose position the plan cannot carry is parked on
        its old chart as ``needs_migration`` with the reason (also its ``failure``),
        until :meth:`unpark` or a corrected plan. A ``paused`` execution stays paused
        either way (moved, or left on its old chart with the reason as its
        ``failure``): what it holds waits for its resume.

        Returns:
            :class:`~statifier.persistence.Migrated`,
            :class:`~statifier.persistence.Parked`, or :class:`Discarded` for
            an execution that has ended or is already on the new chart.

        Raises:
            ExecutionNotFound: no such execution.
            IdentityMismatch: it runs neither of the plan's charts.
            LockTimeout: it stayed locked longer than the lock wait.
            ChartRetired: the new chart was retired.
            Unstorable: the carried position cannot be stored (nothing changed).
            NotAPosition: its stored position is damaged or was pruned.
        """
        await self.storage.save_chart(plan.target)
        return await self._migrate_one(execution_id, plan)

    async def _migrate_one(
        self, execution_id: str, plan: MigrationPlan
    ) -> Migrated | Parked | Discarded:
        storage = self.storage
        async with self.exclusive(execution_id):
            record = await storage.fetch_execution(execution_id)
            if left_as_is(record, plan.target_hash) is not None:
                return Discarded(record)
            if record.content_hash != plan.source_hash:
                stored_identity = ChartIdentity(record.content_hash)
                raise stored.IdentityMismatch(stored_identity, plan.source.identity)
            state = storage.load(record, plan.source)
            carried = move(state, plan)
            now = storage.clock()
            if isinstance(carried, Unmappable):
                reason = carried.reason
                entry = LoggedMigration(plan.source_hash, plan.target_hash, reason)
                # A paused execution stays paused (what it holds waits for its
                # resume, which a parked one would never get), with the reason.
                parked = Status.PAUSED if record.status is Status.PAUSED else Status.NEEDS_MIGRATION
                record = replace(record, status=parked, failure=reason, updated_at=now)
                await storage.update_execution(record)
                await self._log_migration(execution_id, entry, now)
                outcome: Migrated | Parked = Parked(record, reason)
            else:
                entry = LoggedMigration(plan.source_hash, plan.target_hash, None, carried.renamed)
                record = replace(
                    record,
                    content_hash=plan.target_hash,
                    status=Status.PAUSED if record.status is Status.PAUSED else Status.ACTIVE,
                    position=carried.position,
                    failure=None,
                    updated_at=now,
                )
                if not await storage.rechart_execution(record, plan.source_hash):
                    # Only a writer that bypasses the exclusion gets here.
                    raise ExecutionNotFound(execution_id)
                await self._log_migration(execution_id, entry, now)
                storage.remember(execution_id, carried.position, carried.state)
                outcome = Migrated(record, carried.state)
        # A parked one reports as a manual park does, its reason as the failure.
        self._lifecycle(
            record, "migrated" if isinstance(outcome, Migrated) else record.status.value
        )
        return outcome

    async def _log_migration(
        self, execution_id: str, entry: LoggedMigration, now: datetime
    ) -> None:
        if self.storage.capabilities.input_log:
            await self.storage.append_input(execution_id, MIGRATE_VIA, entry.dump(), now)

    async def migrate_all(
        self, content_hash: str, plan: MigrationPlan, *, batch: int = MIGRATION_BATCH
    ) -> MigrationSummary:
        """Migrate every execution on ``content_hash`` that holds it (``active`` and
        ``needs_migration``), ``batch`` at a time, each as :meth:`migrate` does. Safe to
        run again: what already moved is left as it is, so a run stopped half-way is
        finished by the next.

        An execution whose migration raises a :class:`PersistenceError` (a lock wait
        ran out, say) or a position error (its stored position is damaged) is reported
        under ``failed`` and the others go on; any other error propagates once the
        batch has settled.

        Raises:
            InvalidMigrationPlan: the plan does not start from ``content_hash``.
            ValueError: ``batch`` is below 1.
            ChartRetired: the new chart was retired.
        """
        if content_hash != plan.source_hash:
            raise InvalidMigrationPlan(
                f"the plan migrates from {plan.source_hash}, not {content_hash}"
            )
        size: object = batch  # untyped callers pass anything
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"batch is a whole number of at least 1, not {batch!r}")
        await self.storage.save_chart(plan.target)
        ids = sorted(await self.storage.pinning_executions(content_hash))
        summary = MigrationSummary()
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            answers = await asyncio.gather(
                *(self._migrate_one(execution_id, plan) for execution_id in chunk),
                return_exceptions=True,
            )
            summary = summary + _summarized(chunk, answers, plan)
        return summary

    async def migrate_tree(
        self,
        execution_id: str,
        plan: MigrationPlan,
        children: Mapping[str, MigrationPlan] | None = None,
    ) -> MigrationSummary:
        """Migrate an execution and then its durable children (executions whose
        metadata names it under :data:`PARENT_KEY`), theirs in turn, each under its own
        exclusion once the parent's is released.

        ``children`` holds the plans for the children's charts, by the content hash
        they move from (a child's chart is a chart of its own, which the parent's
        revision may change too). A child on a chart with no plan stays on it; its own
        children are still visited. A parked parent's children are left as they are:
        the tree stays on the old revision from there down. Running it again after a
        stop finishes the tree (what moved is left as it is, and still walked).

        Raises:
            as :meth:`migrate`, for the parent; a child's refusal is under ``failed``.
            MetadataUnsupported: the adapter keeps no metadata (children cannot be
                found).
            InvalidMigrationPlan: a plan in ``children`` is filed under another hash
                than the one it moves from.
        """
        if not self.storage.capabilities.metadata:
            raise MetadataUnsupported("durable children need an adapter that keeps metadata")
        plans = dict(children or {})
        for content_hash, child_plan in plans.items():
            if content_hash != child_plan.source_hash:
                raise InvalidMigrationPlan(
                    f"the plan filed under {content_hash} migrates from {child_plan.source_hash}"
                )
        for child_plan in plans.values():
            await self.storage.save_chart(child_plan.target)
        answer = await self.migrate(execution_id, plan)
        summary = _summarized([execution_id], [answer], plan)
        if isinstance(answer, Parked) or answer.execution.status.terminal:
            return summary
        targets = {p.target_hash for p in plans.values()} | {plan.target_hash}
        return summary + await self._migrate_children(execution_id, plans, targets)

    async def _migrate_children(
        self, parent_id: str, plans: Mapping[str, MigrationPlan], targets: set[str]
    ) -> MigrationSummary:
        summary = MigrationSummary()
        statuses = await self.storage.statuses_by_metadata({PARENT_KEY: parent_id})
        for child_id, status in sorted(statuses.items()):
            if status.terminal:
                continue
            try:
                child = await self.storage.fetch_execution(child_id)
                plan = plans.get(child.content_hash)
                if plan is None:
                    why = (
                        "already on the new chart"
                        if child.content_hash in targets
                        else ("no plan for its chart")
                    )
                    summary = summary + MigrationSummary(unchanged={child_id: why})
                    walk = child.status is Status.ACTIVE
                else:
                    answer = await self._migrate_one(child_id, plan)
                    summary = summary + _summarized([child_id], [answer], plan)
                    walk = not isinstance(answer, Parked) and not answer.execution.status.terminal
            except (PersistenceError, stored.PositionError) as error:
                summary = summary + MigrationSummary(failed={child_id: str(error)})
                continue
            if walk:
                summary = summary + await self._migrate_children(child_id, plans, targets)
        return summary

    async def executions_on(self, content_hash: str) -> Mapping[str, int]:
        """What refers to a chart: executions by status, saved positions and linked
        children (``children_linked``: ended durable children on it whose parent is
        active or parked). Finished executions are included, though they never hold
        a chart in use; fan-out ends are not executions and never appear."""
        return await self.storage.counts_on(content_hash)

    async def retire_chart(
        self,
        content_hash: str,
        *,
        retired_by: str,
        pin_sources: Sequence[PinSource] = (),
    ) -> ChartRecord:
        """Tombstone a chart nothing can resume any more: its row and hash stay, its
        source goes, and it can never be saved or fetched again.

        Held in use by: an active or parked execution, a saved position, an ended
        durable child on it whose parent is active or parked (``children_linked``), or
        a non-zero count from a pin source. The store's own pins are counted again
        atomically with the tombstone, which is serialized against a concurrent
        create on the chart: that create is either counted (and the retirement
        refused) or refused with ``ChartRetired``.

        Raises:
            ChartRetirementUnsupported: the adapter cannot retire charts.
            ChartNotFound: no such chart.
            Pinned: something holds it; ``counts`` carries every count known.
            PinSourceFailed: a pin source could not answer (no complete count exists).
        """
        storage = self.storage
        if not storage.capabilities.chart_retirement:
            raise ChartRetirementUnsupported("this adapter cannot retire charts")
        chart = await storage.find_chart(content_hash)
        if chart is None:
            raise ChartNotFound(content_hash)
        if chart.retired_at is not None:
            return chart
        counts = dict(await self.storage.counts_on(content_hash))
        holding = {f"executions_{status.value}" for status in Status if status.pins}
        holding |= {"positions", "children_linked"}
        held = sum(n for name, n in counts.items() if name in holding)
        active = await storage.pinning_executions(content_hash)
        for source in pin_sources:
            name = type(source).__name__
            try:
                answer = await source.pins(content_hash, tuple(active))
                answered = {f"{name}.{key}": int(n) for key, n in answer.items()}
            except Exception as error:
                raise PinSourceFailed(name, error) from error
            counts.update(answered)
            held += sum(n for n in answered.values() if n > 0)
        if held:
            raise Pinned(content_hash, counts)
        try:
            retired = await storage.retire_chart(content_hash, retired_by, storage.clock())
        except Pinned as pinned:  # something arrived since the counts: say everything
            raise Pinned(content_hash, {**counts, **pinned.counts}) from None
        if retired is None:
            raise ChartNotFound(content_hash)
        return retired

    async def _carry_out(
        self,
        state: MachineState,
        effects: list[fx.Effect],
        execution_id: str,
        via: str,
        executor: Executor | None = None,
    ) -> tuple[MachineState, list[fx.Effect]]:
        """Hand ``effects`` over; tell the chart of what the executor refused (each
        refusal raises its event on the internal queue, in order) and hand over what
        that ran, until nothing is refused. Returns the position and every effect.

        Raises:
            RefusalsUnsettled: refusals kept coming for :data:`MAX_REFUSAL_ROUNDS`.
        """
        refusals = await self._perform(effects, execution_id, via, executor)
        rounds = 0
        while refusals and state.running:
            rounds += 1
            if rounds > MAX_REFUSAL_ROUNDS:
                raise RefusalsUnsettled(execution_id, MAX_REFUSAL_ROUNDS)
            state, more = deliver_internal(state, *refusals)
            effects = [*effects, *more]
            refusals = await self._perform(more, execution_id, via, executor)
        return state, effects

    async def _perform(
        self,
        effects: list[fx.Effect],
        execution_id: str,
        via: str,
        executor: Executor | None = None,
    ) -> list[Event]:
        try:
            return await perform(
                self.executor if executor is None else executor, effects, execution_id, via
            )
        except Exception as error:
            report(
                "statifier.persistence.effect_failed",
                {},
                {"execution_id": execution_id, "via": via, "error": repr(error)},
            )
            raise

    @staticmethod
    def _lifecycle(record: ExecutionRecord, transition: str) -> None:
        report(
            "statifier.persistence.lifecycle",
            {},
            {"execution_id": record.id, "transition": transition, "failure": record.failure},
        )

    def _policy(self, on_error: OnError | str | None, content_hash: str) -> OnError:
        """A call's policy: its own, else the chart's."""
        return self.on_error.of(content_hash) if on_error is None else OnError.of(on_error)

    @staticmethod
    def _stepped(
        record: ExecutionRecord,
        via: str,
        effects: Sequence[fx.Effect],
        started: float,
        errors: Sequence[StepError] = (),
    ) -> None:
        if errors:
            _errors_raised(record, via, errors)
        if not enabled("statifier.persistence.step"):
            return
        report(
            "statifier.persistence.step",
            {
                "duration": time.perf_counter() - started,
                "effects": len(effects),
                "errors": len(errors),
            },
            {"execution_id": record.id, "via": via, "status": record.status.value},
        )


def _errors_raised(record: ExecutionRecord, via: str, errors: Sequence[StepError]) -> None:
    """Report each error a committed call raised, and log it: the first of its kind (a
    chart's element failing the same way) at once, the rest as one count an interval,
    so that a chart failing on every event cannot flood the log."""
    for error in errors:
        report(
            "statifier.persistence.error",
            {},
            {
                "execution_id": record.id,
                "via": via,
                "error": error.name,
                "message": error.message,
                "element": error.element,
                "line": error.line,
                "column": error.column,
                "taken": error.taken,
                "status": record.status.value,
            },
        )
        fields: dict[str, object] = {
            "execution_id": record.id,
            "via": via,
            "error": error.name,
            "element": error.element,
            "line": error.line,
            "column": error.column,
            "taken": error.taken,
        }
        said = error.describe()
        kind = (record.content_hash, error.name, error.element, error.line, error.column)

        def first(said: str = said, fields: dict[str, object] = fields) -> None:
            _log.warning("execution %s (%s): %s", record.id, via, said, extra=fields)

        def later(count: int, said: str = said, fields: dict[str, object] = fields) -> None:
            _log.warning(
                "%d more of: %s (the last in execution %s)",
                count,
                said,
                record.id,
                extra={**fields, "count": count},
            )

        _repeats.note(kind, first, later)


def _records(
    record: ExecutionRecord, errors: Sequence[StepError], via: str, seq: int | None
) -> list[ErrorRecord]:
    """What a call stores of ``errors``: the first :data:`MAX_STEP_ERRORS`."""
    at = record.updated_at or record.created_at
    assert at is not None
    return [
        error_record(record.id, error, via=via, seq=seq, recorded_at=at)
        for error in errors[:MAX_STEP_ERRORS]
    ]


def _summarized(
    ids: Sequence[str],
    answers: Sequence[Migrated | Parked | Discarded | BaseException],
    plan: MigrationPlan,
) -> MigrationSummary:
    """The summary of migrating ``ids`` with these answers, in order. Refusals of
    persistence are reported; any other exception is raised again."""
    migrated: list[str] = []
    parked: dict[str, str] = {}
    unchanged: dict[str, str] = {}
    failed: dict[str, str] = {}
    for execution_id, answer in zip(ids, answers, strict=True):
        if isinstance(answer, Migrated):
            migrated.append(execution_id)
        elif isinstance(answer, Parked):
            parked[execution_id] = answer.reason
        elif isinstance(answer, Discarded):
            record = answer.execution
            # A discarded migration found a reason: the same record gives it again.
            unchanged[execution_id] = (
                left_as_is(record, plan.target_hash) or f"it is {record.status.value}"
            )
        elif isinstance(answer, PersistenceError | stored.PositionError):
            failed[execution_id] = str(answer)
        else:
            raise answer
    return MigrationSummary(tuple(migrated), parked, unchanged, failed)


def _locked(execution_id: str, started: float) -> None:
    """Report the wait for an execution's exclusion, if anyone listens."""
    if enabled("statifier.persistence.lock"):
        report(
            "statifier.persistence.lock",
            {"duration": time.perf_counter() - started},
            {"execution_id": execution_id},
        )


def _ending(
    effects: list[fx.Effect], errors: Sequence[StepError] = (), on_error: OnError = OnError.CONTINUE
) -> tuple[Status, str | None, bytes | None, Value]:
    """Status, failure, outcome and donedata that a call's effects lead to: a finish,
    a spent budget, or (under :attr:`OnError.FAIL`) an error no transition took."""
    for effect in effects:
        if isinstance(effect, fx.Done):
            donedata = effect.donedata
            failed = isinstance(donedata, dict) and donedata.get(EXECUTION_STATUS_KEY) == "failed"
            if failed:
                return Status.FAILED, "failed_final", _encode(donedata), donedata
            return Status.COMPLETED, None, _encode(donedata), donedata
        if isinstance(effect, fx.BudgetExhausted):
            outcome = {"reason": "round_budget", "budget": effect.budget}
            return Status.FAILED, "round_budget", _encode(outcome), UNDEFINED
    if on_error is OnError.FAIL:
        untaken = next((error for error in errors if not error.taken), None)
        if untaken is not None:
            failure = f"unhandled {untaken.summary()}"
            if len(failure) > _MAX_FAILURE:
                failure = failure[: _MAX_FAILURE - 1] + "…"
            answer = {"reason": UNHANDLED_ERROR, "error": _said(untaken)}
            return Status.FAILED, failure, _encode(answer), UNDEFINED
    return Status.ACTIVE, None, None, UNDEFINED


def _said(error: StepError) -> dict[str, Value]:
    """What an unhandled error's outcome says of it (a parent reads it)."""
    fields = error.as_json()
    return {
        key: fields[key]
        for key in ("name", "message", "element", "line", "column", "sendid")
        if fields[key] is not None
    }


def _encode(value: Value) -> bytes:
    return json.dumps(tagged.encode(value), sort_keys=True, separators=(",", ":")).encode()


def _dump(state: MachineState) -> bytes:
    try:
        return stored.dump(state)
    except (ValueError, RecursionError) as error:
        # RecursionError: a last guard, should a value nest deeper than the encoder's
        # stack reaches despite the positions' own depth bound.
        raise Unstorable(f"the new position cannot be stored: {error}") from None


def logged_input(seq: int, via: str, blob: bytes | None, recorded_at: datetime) -> LoggedInput:
    """One input-log entry decoded from its stored (plain, already decoded by the
    codec) bytes: a stored event, a migration's record (via ``"migrate"``), or the
    cap's marker (``blob`` ``None``).

    Raises:
        statifier.core.NotAPosition: the bytes are not what that ``via`` stores.
    """
    if blob is None:
        return LoggedInput(seq, via, None, recorded_at)
    if via == MIGRATE_VIA:
        return LoggedInput(seq, via, None, recorded_at, LoggedMigration.load(blob))
    return LoggedInput(seq, via, stored.load_event(blob), recorded_at)


def logged_start(
    inputs: Sequence[LoggedInput], options: StartOptions | None = None
) -> tuple[StartOptions, Sequence[LoggedInput]]:
    """Where a replay of ``inputs`` (an input log, in order) starts: ``options`` (the
    host's start options; defaults when ``None``) with the datamodel values of the
    log's opening :data:`CREATE_VIA` entry added, and the entries after it. A log that
    opens with no such entry returns ``options`` and every entry.

    >>> from datetime import UTC, datetime
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> log = [LoggedInput(0, CREATE_VIA, Event(START_EVENT, data={"n": 2}), at),
    ...        LoggedInput(1, "step", Event("go"), at)]
    >>> start, rest = logged_start(log)
    >>> dict(start.datamodel), [entry.seq for entry in rest]
    ({'n': 2}, [1])
    """
    start = options or StartOptions()
    if not inputs or inputs[0].via != CREATE_VIA:
        return start, inputs
    event = inputs[0].event
    if event is None or event.name != START_EVENT or not isinstance(event.data, dict):
        return start, inputs
    return replace(start, datamodel={**start.datamodel, **event.data}), inputs[1:]


def _start_entry(start: StartOptions) -> Event:
    """The :data:`CREATE_VIA` entry of a create's start data."""
    return Event(START_EVENT, data=dict(start.datamodel))


def _dump_event(event: Event) -> bytes:
    try:
        return stored.dump_event(event)
    except (ValueError, TypeError, RecursionError) as error:  # RecursionError: as in _dump
        raise Unstorable(f"the event's data cannot be stored: {error}") from None


def storable_text(text: str, what: str) -> None:
    """Refuse ``text`` where some database cannot store it: a NUL (PostgreSQL refuses
    one in text) or a lone surrogate (not UTF-8), so that both databases refuse alike.

    Raises:
        ValueError: naming ``what``.
    """
    if "\x00" in text:
        raise ValueError(f"{what} holds a NUL character, which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate, which is not UTF-8") from None


def _checked_metadata(metadata: Mapping[Any, Any] | None) -> dict[str, str]:
    """The metadata as a plain dict, checked: untyped callers pass anything."""
    if not metadata:
        return {}
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata maps strings to strings, not {key!r}: {value!r}")
        if len(key) > MAX_METADATA_TEXT or len(value) > MAX_METADATA_TEXT:
            raise ValueError(f"metadata keys and values are at most {MAX_METADATA_TEXT} long")
        storable_text(key, "a metadata key")
        storable_text(value, f"the metadata value of {key!r}")
    return {str(key): str(value) for key, value in metadata.items()}
