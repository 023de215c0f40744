"""Driving durable executions that invoke services, until they rest.

:class:`Executions` steps an execution once. A chart that invokes a service is then
waiting for an answer it cannot fetch; the :class:`Driver` performs each ``<invoke>``
through a dispatch function inside the step that emitted it, and steps every answer
back in as ``done.invoke.<id>`` or ``error.communication.invoke.<id>``, built by the
same functions a live session uses, until nothing is left to answer.

``<invoke type="scxml">`` becomes a durable child: an execution of its own (id
``<parent>/<invoke id>``), created inside the parent's step. Its answer is written
in the transaction that ends it and delivered to the parent once, marked delivered in
the parent's step that takes it; :meth:`Driver.redrive_answers` delivers what a crash
left owed. A fan-out (one ``<invoke>`` over N items) is started child by child with
:meth:`Driver.start_child_at`, and closed under the parent's exclusion once all N
have ended, recorded in the fan-out ends table.

>>> import asyncio
>>> from statifier.chart import compile_chart
>>> from statifier.persistence import MemoryAdapter, Storage
>>> from statifier.persistence.driver import Answered, Driver
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="paying">'
...     '<state id="paying"><invoke id="pay" type="myapp:pay"/>'
...     '<transition event="done.invoke.pay" target="paid"/></state>'
...     '<final id="paid"/></scxml>'
... )
>>> driver = Driver(Storage(MemoryAdapter()), dispatch=lambda invoke, ctx: Answered({"ok": 1}))
>>> asyncio.run(driver.create("order_7", machine)).execution.status
<Status.COMPLETED: 'completed'>
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Final, Literal, TypeAlias, TypeVar

from statifier.callbacks import awaited
from statifier.chart import Machine
from statifier.core import Event, MachineState, StartOptions
from statifier.core import effects as fx
from statifier.core.events import SCXML_INVOKE_TYPE
from statifier.expr import UNDEFINED, Value, tagged
from statifier.persistence.errors import (
    ExecutionExists,
    ExecutionNotFound,
    MetadataUnsupported,
    PersistenceError,
)
from statifier.persistence.executions import (
    INVOKE_KEY,
    PARENT_KEY,
    Discarded,
    Executions,
    Stepped,
    decode_outcome,
)
from statifier.persistence.executor import EffectContext, Executor, Refused, refuse_unperformed
from statifier.persistence.records import AnswerRecord, ExecutionRecord, Status
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT, Serialization
from statifier.persistence.storage import Storage
from statifier.repeats import Repeats
from statifier.session.children import invoked_chart, seeded_datamodel
from statifier.session.handlers import invocation_done, invocation_failed
from statifier.telemetry import report

__all__ = [
    "ANSWER_RETRY",
    "CHILD_TYPES",
    "INDEX_KEY",
    "INVOKE_KEY",
    "Answer",
    "Answered",
    "ChildCanceller",
    "Dispatch",
    "Driver",
    "InvocationFailed",
    "MaxTurnsExceeded",
    "Policy",
]

_log = logging.getLogger("statifier.persistence")

ANSWER_RETRY: Final = 30.0
"""Seconds a driver puts off an owed answer whose delivery raised before
:meth:`Driver.redrive_answers` tries it again."""
CHILD_TYPES: Final = frozenset({SCXML_INVOKE_TYPE})
"""Invoke types the driver runs as durable child executions: the SCXML type, which every
``Invoke`` effect carries whichever spelling the chart wrote (see
:data:`statifier.core.events.SCXML_INVOKE_TYPES`)."""

INDEX_KEY: Final = "statifier.index"
"""Metadata key: a fan-out child's place among its siblings."""
_COUNT_KEY: Final = "statifier.count"
_POLICY_KEY: Final = "statifier.policy"
_NO_EVENT: Final = Event("statifier.answer")  # a child's answer is read from its row


@dataclass(frozen=True, slots=True)
class Answered:
    """The invoked service finished; ``done.invoke.<id>`` carries ``donedata``."""

    donedata: Value = UNDEFINED


@dataclass(frozen=True, slots=True)
class InvocationFailed:
    """The invoked service failed for good (not "retry");
    ``error.communication.invoke.<id>`` carries reason, attempts and detail."""

    reason: str
    _: KW_ONLY
    attempts: int = 1
    detail: Value = UNDEFINED


Answer: TypeAlias = Answered | InvocationFailed
Dispatch: TypeAlias = Callable[[fx.Invoke, EffectContext], Answer | Awaitable[Answer | None] | None]
"""Performs one ``<invoke>``: answers now, or ``None`` when the answer comes later
through :meth:`Driver.answer`. A plain function or a coroutine function."""
ChildCanceller: TypeAlias = Callable[[str, str, tuple[int, ...]], Awaitable[None] | None]
"""Told ``(parent id, invoke id, indices)`` of fan-out children never started, when a
fan-out closed under ``first_error`` cancels the rest."""
Policy: TypeAlias = Literal["all", "first_error"]


class MaxTurnsExceeded(PersistenceError):  # noqa: N818 - names the refusal
    """Answers kept re-arming invocations past ``max_turns``; the execution rests
    where it was, with its last answer stepped in."""

    def __init__(self, execution_id: str, turns: int) -> None:
        super().__init__(f"execution {execution_id!r} was still answering after {turns} turns")
        self.execution_id = execution_id
        self.turns = turns


@dataclass(slots=True)
class _Pending:
    """Answers collected while one call's effects run, to step in once it is stored,
    in the order they came."""

    answers: list[tuple[str, Event, str | None]] = field(default_factory=list)
    """``(invoke id, answer event, child id)``: a durable child's answer (child id
    given) is delivered from its stored row, so it is marked delivered."""


_V = TypeVar("_V")


def _live(invoke_id: str) -> Callable[[MachineState], bool]:
    """Accept an answer only while the chart still runs the invocation (SCXML 6.4.3)."""
    return lambda state: invoke_id in state.invocations.values()


def _answer_event(invoke_id: str, answer: Answer) -> Event:
    if isinstance(answer, Answered):
        return invocation_done(invoke_id, answer.donedata)
    return invocation_failed(
        invoke_id, answer.reason, attempts=answer.attempts, detail=answer.detail
    )


class Driver:
    """Drives durable executions to quiescence over a :class:`Storage`.

    Args:
        storage: the guarded store (its adapter must keep metadata for durable
            children and fan-out).
        dispatch: performs non-SCXML ``<invoke>`` effects; without one, such an
            invocation is answered with ``InvocationFailed("no dispatch")``.
        effects: receives every other effect, in order, and may refuse a send (by
            default every send is refused, as nothing here delivers one).
        options: how charts start (``invoke_types`` and ``send_types`` registrations);
            stored with each position, so they hold for every later step.
        serialization, lock_wait: as for :class:`Executions`.
        max_turns: the most answers one call steps in before :class:`MaxTurnsExceeded`.
        child_canceller: see :data:`ChildCanceller`.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        dispatch: Dispatch | None = None,
        effects: Executor = refuse_unperformed,
        options: StartOptions | None = None,
        serialization: Serialization | None = None,
        lock_wait: float | None = DEFAULT_LOCK_WAIT,
        max_turns: int = 64,
        child_canceller: ChildCanceller | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, not {max_turns}")
        self.storage = storage
        self.dispatch = dispatch
        self.effects = effects
        self.options = options or StartOptions()
        self.max_turns = max_turns
        self.child_canceller = child_canceller
        self.executions = Executions(
            storage, executor=self._outside_calls, serialization=serialization, lock_wait=lock_wait
        )
        self._put_off: dict[str, float] = {}
        """Owed answers whose delivery raised, by child id: when (``time.monotonic``)
        :meth:`redrive_answers` may try each again."""
        self._repeats = Repeats()

    # Doors.

    async def create(
        self, execution_id: str, machine: Machine, *, metadata: Mapping[str, str] | None = None
    ) -> Stepped:
        """Create the execution and drive it until it rests."""
        pending = _Pending()
        result = await self.executions.create(
            execution_id,
            machine,
            options=self.options,
            metadata=metadata,
            executor=self._collecting(pending),
        )
        final = await self._drain(execution_id, result, pending)
        assert isinstance(final, Stepped)  # a created execution answers its own invokes
        return final

    async def send_event(self, execution_id: str, event: Event) -> Stepped | Discarded:
        """Step ``event`` into the execution, then drive it until it rests."""
        return await self._step(execution_id, event, "step", None)

    async def answer(
        self, execution_id: str, invoke_id: str, answer: Answer
    ) -> Stepped | Discarded:
        """Step the late answer of an invocation that ``dispatch`` left pending (or of
        a host's own service). Dropped (:class:`Discarded`) if the chart has since
        cancelled the invocation or ended."""
        event = _answer_event(invoke_id, answer)
        return await self._step(execution_id, event, "answer", _live(invoke_id))

    async def fail(self, execution_id: str, reason: str) -> ExecutionRecord | Discarded:
        """End the execution as failed on the host's word (see
        :meth:`Executions.fail`); a durable child then answers its parent at once
        (``error.communication.invoke.<id>``), from the answer its failure wrote."""
        result = await self.executions.fail(execution_id, reason)
        if isinstance(result, ExecutionRecord):
            await self._answer_parent(result)
        return result

    async def cancel(self, execution_id: str) -> Stepped | Discarded:
        """Cancel the execution (see :meth:`Executions.cancel`); a durable child then
        answers its parent at once, from the answer its cancellation wrote."""
        result = await self.executions.cancel(execution_id)
        if isinstance(result, Stepped):
            await self._answer_parent(result.execution)
        return result

    async def redrive_answers(self, limit: int = 100) -> int:
        """Deliver up to ``limit`` answers durable children still owe their parents,
        oldest first: the call a reaper makes, since a crash between a child's end and
        its parent's step leaves the answer written and undelivered. Delivery is
        deduplicated at the parent (an answer is marked delivered in the parent's step
        that takes it), so a redrive beside the normal path delivers nothing twice.

        An answer to a parent that waits (parked or paused) is not listed: it stays
        owed until the parent is put back, and does not hide the rest. Nor does an
        answer whose delivery raises: the pass reads past it, and this driver puts it
        off for :data:`ANSWER_RETRY` seconds (later passes read past it meanwhile), so
        answers that always fail never starve the ones behind them.

        Returns how many owed answers it handed over; one whose delivery raised is
        logged (a warning naming the parent and the child, once per kind of error and
        interval, with the count of the others), reported
        (``statifier.persistence.effect_failed``) and left owed. Returns 0 when the
        adapter keeps no answers.

        Raises:
            ValueError: ``limit`` is below 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        if not self.storage.capabilities.answers:
            return 0
        now = time.monotonic()
        self._put_off = {child: at for child, at in self._put_off.items() if at > now}
        seen: set[str] = set()
        handed = 0
        while handed < limit:
            # Oldest first, past what this pass tried and what is put off.
            skipped = len(seen) + len(self._put_off)
            owed = await self.storage.undelivered_answers(limit - handed + skipped)
            fresh = [
                answer
                for answer in owed
                if answer.child_id not in seen and answer.child_id not in self._put_off
            ]
            if not fresh:
                break
            for answer in fresh[: limit - handed]:
                seen.add(answer.child_id)
                try:
                    await self._hand_over(answer)
                except Exception as error:  # noqa: BLE001 - one poisoned answer must not stop the rest
                    self._put_off[answer.child_id] = time.monotonic() + ANSWER_RETRY
                    self._undelivered(answer, error)
                    continue
                handed += 1
        return handed

    def _undelivered(self, answer: AnswerRecord, error: Exception) -> None:
        """Say that an owed answer's delivery raised: a warning (once per kind of error
        and interval) and a telemetry event (each time)."""
        self._repeats.log(
            _log,
            logging.WARNING,
            ("answer", type(error).__name__),
            "execution %s: the answer of child %s could not be delivered; it stays owed, "
            "tried again in %g s: %r",
            answer.parent_id,
            answer.child_id,
            ANSWER_RETRY,
            error,
            extra={"execution_id": answer.parent_id},
        )
        report(
            "statifier.persistence.effect_failed",
            {},
            {"execution_id": answer.parent_id, "via": "answer", "error": repr(error)},
        )

    async def _step(
        self,
        execution_id: str,
        event: Event,
        via: str,
        when: Callable[[MachineState], bool] | None,
    ) -> Stepped | Discarded:
        pending = _Pending()
        result = await self.executions.step(
            execution_id, None, event, via=via, when=when, executor=self._collecting(pending)
        )
        return await self._drain(execution_id, result, pending)

    async def _drive(
        self, execution_id: str, result: Stepped | Discarded, pending: _Pending
    ) -> Stepped | Discarded:
        """Step in the answers a call collected, one durable step each (answers to
        those steps' own invocations included), until none is left. A durable child's
        answer is delivered from its stored row even when the execution has ended
        meanwhile (the delivery then only marks it delivered)."""
        turns = 0
        while pending.answers:
            answers, pending.answers = pending.answers, []
            for invoke_id, event, child_id in answers:
                turns += 1
                if turns > self.max_turns:
                    raise MaxTurnsExceeded(execution_id, self.max_turns)
                if child_id is not None:
                    owed = await self.storage.fetch_answer(child_id)
                    delivered = None if owed is None else await self._deliver(owed, pending)
                    if isinstance(delivered, Stepped):
                        result = delivered
                    continue
                if not isinstance(result, Stepped) or result.finished:
                    continue
                stepped = await self.executions.step(
                    execution_id,
                    result.state.machine,
                    event,
                    via="answer",
                    when=_live(invoke_id),
                    executor=self._collecting(pending),
                )
                if isinstance(stepped, Stepped):
                    result = stepped
        return result

    async def _drain(
        self, execution_id: str, result: Stepped | Discarded, pending: _Pending
    ) -> Stepped | Discarded:
        """Drive the execution to rest, then let it answer its parent if it ended."""
        result = await self._drive(execution_id, result, pending)
        if isinstance(result, Stepped) and result.finished:
            await self._answer_parent(result.execution)
        return result

    # The executors the calls run with.

    def _collecting(self, pending: _Pending) -> Executor:
        """The executor of one driver call: ``pending`` collects the answers of the
        invocations it performs, to step in once the call is stored."""

        async def execute(effect: fx.Effect, context: EffectContext) -> Refused | None:
            return await self._execute(effect, context, pending)

        return execute

    async def _outside_calls(self, effect: fx.Effect, context: EffectContext) -> Refused | None:
        """The executor of the lifecycle's own calls (a cancel): they exit states and
        cancel invocations, never start one."""
        return await self._execute(effect, context, None)

    async def _execute(
        self, effect: fx.Effect, context: EffectContext, pending: _Pending | None
    ) -> Refused | None:
        if isinstance(effect, fx.CancelInvoke):
            await self._cancel_children(context.execution_id, effect.invoke_id)
        if not isinstance(effect, fx.Invoke):
            return await awaited(self.effects(effect, context))
        if pending is None:
            raise RuntimeError(f"an invocation outside a driver call: {effect.invoke_id!r}")
        if effect.type in CHILD_TYPES:
            await self._start_child(context.execution_id, effect, pending)
            return None
        if self.dispatch is None:
            answer: Answer | None = InvocationFailed("no dispatch for invoke type " + effect.type)
        else:
            answer = await awaited(self.dispatch(effect, context))
        if answer is not None:
            event = _answer_event(effect.invoke_id, answer)
            pending.answers.append((effect.invoke_id, event, None))
        return None

    # Durable children.

    async def _cancel_children(self, parent_id: str, invoke_id: str) -> None:
        """The chart left the state that invoked them: cancel the durable children of
        the invocation (a single child or a fan-out's started ones)."""
        if self.storage.capabilities.metadata:
            await self.executions.cancel_matching({PARENT_KEY: parent_id, INVOKE_KEY: invoke_id})

    def _child_options(self, machine: Machine, data: Value) -> StartOptions:
        return replace(self.options, datamodel=seeded_datamodel(machine, data))

    async def _start_child(self, parent_id: str, effect: fx.Invoke, pending: _Pending) -> None:
        _check_children(self.storage)
        machine = invoked_chart(effect, self.storage.loader, self.storage.functions)
        if isinstance(machine, str):
            failed = invocation_failed(effect.invoke_id, machine)
            pending.answers.append((effect.invoke_id, failed, None))
            return
        child_id = f"{parent_id}/{effect.invoke_id}"
        metadata = {PARENT_KEY: parent_id, INVOKE_KEY: effect.invoke_id}
        try:
            created = await self._create_child(child_id, machine, effect.data, metadata)
        except ExecutionExists:  # a re-driven parent step adopts the child it made
            created = await self.storage.fetch_execution(child_id)
        report(
            "statifier.persistence.child",
            {"count": 1},
            {"parent": parent_id, "invoke_id": effect.invoke_id, "action": "started", "index": 0},
        )
        if created.status.terminal:  # finished while being created: answer in the parent's turn
            pending.answers.append((effect.invoke_id, _NO_EVENT, child_id))

    async def _create_child(
        self, child_id: str, machine: Machine, data: Value, metadata: dict[str, str]
    ) -> ExecutionRecord:
        pending = _Pending()
        options = self._child_options(machine, data)
        result = await self.executions.create(
            child_id,
            machine,
            options=options,
            metadata=metadata,
            executor=self._collecting(pending),
        )
        # Driven without answering the parent: the parent's step is still running.
        driven = await self._drive(child_id, result, pending)
        return driven.execution

    async def _answer_parent(self, child: ExecutionRecord) -> None:
        """A durable child ended: hand its stored answer to its parent (or closes
        its fan-out)."""
        if PARENT_KEY not in child.metadata or INVOKE_KEY not in child.metadata:
            return
        if not self.storage.capabilities.answers:
            return
        owed = await self.storage.fetch_answer(child.id)
        if owed is not None:
            await self._hand_over(owed)

    async def _hand_over(self, answer: AnswerRecord) -> None:
        """Deliver ``answer``, then drive its parent until it rests."""
        pending = _Pending()
        result = await self._deliver(answer, pending)
        if result is not None:
            await self._drain(answer.parent_id, result, pending)

    async def _deliver(self, answer: AnswerRecord, pending: _Pending) -> Stepped | Discarded | None:
        """Deliver one owed answer: a fan-out child's to its fan-out's close, any other's
        as one step of its parent. ``None`` when nothing was stepped."""
        child = await self.storage.find_execution(answer.child_id)
        if child is not None and INDEX_KEY in child.metadata:
            return await self._close_fan_out(answer, child.metadata, pending)
        return await self._deliver_one(answer, pending)

    async def _deliver_one(
        self, answer: AnswerRecord, pending: _Pending
    ) -> Stepped | Discarded | None:
        """Step a single child's answer into its parent and mark it delivered, in one
        unit of work under the parent's exclusion: delivered once, or not at all (a
        crash leaves it owed). An answer the parent no longer takes (it ended, or
        cancelled the invocation) is marked delivered without a step; one for a parked
        parent stays owed."""
        started = time.perf_counter()
        executions, storage = self.executions, self.storage
        async with executions.exclusive(answer.parent_id):
            owed = await storage.fetch_answer(answer.child_id)
            if owed is None or owed.delivered_at is not None:
                return None  # delivered by another path (deduplicated by the child's id)
            try:
                result: Stepped | Discarded | None = await executions.step_held(
                    answer.parent_id,
                    None,
                    _answer_event_of(owed),
                    via="answer",
                    when=_live(owed.invoke_id),
                    executor=self._collecting(pending),
                )
            except ExecutionNotFound:
                result = None  # no parent to answer
            if _parked(result):
                return None  # owed until the parent is put back
            await storage.mark_delivered([owed.child_id], storage.clock())
        if result is not None:
            executions.report_step(result, "answer", started)
        return result

    async def start_child_at(
        self,
        parent_id: str,
        effect: fx.Invoke,
        index: int,
        count: int,
        *,
        data: Value = UNDEFINED,
        policy: Policy = "all",
    ) -> ExecutionRecord:
        """Start child ``index`` of ``count`` for a fan-out ``effect`` of ``parent_id``
        and drive it; idempotent on the child's id (``<parent>/<invoke id>/<index>``):
        a repeated start adopts the child already made. ``data`` seeds the child's
        declared data. When the last child ends, the parent is answered once with the
        dense, index-ordered list of outcomes.

        Raises:
            ValueError: ``index`` is outside ``range(count)`` or the policy is unknown.
            MetadataUnsupported: the adapter keeps no metadata.
        """
        if not 0 <= index < count:
            raise ValueError(f"index {index} is outside range({count})")
        if policy not in ("all", "first_error"):
            raise ValueError(f"unknown policy {policy!r}")
        _check_children(self.storage)
        child_id = f"{parent_id}/{effect.invoke_id}/{index}"
        machine = invoked_chart(effect, self.storage.loader, self.storage.functions)
        if isinstance(machine, str):
            raise ValueError(machine)
        metadata = {
            PARENT_KEY: parent_id,
            INVOKE_KEY: effect.invoke_id,
            INDEX_KEY: str(index),
            _COUNT_KEY: str(count),
            _POLICY_KEY: policy,
        }
        try:
            record = await self._create_child(child_id, machine, data, metadata)
        except ExecutionExists:  # adopted; if it ended, its answer is owed or delivered
            return await self.storage.fetch_execution(child_id)
        report(
            "statifier.persistence.child",
            {"count": count},
            {
                "parent": parent_id,
                "invoke_id": effect.invoke_id,
                "action": "started",
                "index": index,
            },
        )
        if record.status.terminal:
            await self._answer_parent(record)
        return record

    async def _close_fan_out(
        self, answer: AnswerRecord, metadata: Mapping[str, str], pending: _Pending
    ) -> Stepped | Discarded | None:
        """Hand a fan-out child's answer to its fan-out's close: the parent is answered
        once, when every sibling has ended (or, under ``first_error``, one failed: the
        rest are then cancelled).

        Under the parent's exclusion, in one unit of work: read whether the fan-out
        has closed (its row in the fan-out ends table), read the siblings' statuses
        from the indexed projection, and then either step the dense outcome list into
        the parent, take the fan-out's end and mark every ended sibling's answer
        delivered; or, when siblings still run, mark only this answer delivered. Each
        child's end commits before its own answer is handed over, and handovers are
        serialized by the parent's exclusion, so the last one sees every sibling
        ended: the fan-out closes exactly once, and a crash anywhere leaves the
        answer owed, for :meth:`redrive_answers`. Under ``first_error`` the running
        siblings are cancelled in the same unit of work; the ``child_canceller`` is
        told of the unstarted ones after it commits.
        """
        parent_id, invoke_id = answer.parent_id, answer.invoke_id
        count = int(metadata[_COUNT_KEY])
        policy = metadata[_POLICY_KEY]
        executions, storage = self.executions, self.storage
        prefix = f"{parent_id}/{invoke_id}/"
        siblings = {PARENT_KEY: parent_id, INVOKE_KEY: invoke_id}
        started = time.perf_counter()
        async with executions.exclusive(parent_id):
            now = storage.clock()
            owed = await storage.fetch_answer(answer.child_id)
            if owed is None or owed.delivered_at is not None:
                return None
            statuses = await storage.statuses_by_metadata(siblings)
            by_index = _by_index(statuses, prefix)
            first_error = policy == "first_error" and Status.FAILED in by_index.values()
            ended = len(by_index) == count and all(s.terminal for s in by_index.values())
            if await storage.fan_out_ended(parent_id, invoke_id) or not (first_error or ended):
                # Closed already, or the last sibling to end closes it: nothing owed.
                await storage.mark_delivered([answer.child_id], now)
                return None
            running = sorted(i for i, status in by_index.items() if not status.terminal)
            # The ended siblings' records, read at once: their outcomes no longer change.
            records = _by_index(
                {record.id: record for record in await storage.list_executions(**siblings)},
                prefix,
            )
            outcomes = [
                _outcome(index, records[index])
                if index in by_index and by_index[index].terminal
                else {"index": index, "status": "cancelled"}
                for index in range(count)
            ]
            # The rest are cancelled in this unit of work too (each child's exclusion
            # nested in the parent's, the order every nesting takes), so a crash
            # cannot leave them running past the close.
            for index in running:
                await executions.cancel(prefix + str(index), by_parent=True)
            try:
                result: Stepped | Discarded | None = await executions.step_held(
                    parent_id,
                    None,
                    invocation_done(invoke_id, outcomes),
                    via="answer",
                    when=_live(invoke_id),
                    executor=self._collecting(pending),
                )
            except ExecutionNotFound:
                result = None
            if _parked(result):
                return None  # every answer stays owed until the parent is put back
            # Taken after the step, so a step that raises takes nothing (the in-memory
            # adapter keeps what a raising block wrote); under the parent's exclusion
            # nobody else can have taken it since `fan_out_ended` said no.
            if not await storage.take_fan_out_end(parent_id, invoke_id, now):
                raise RuntimeError(
                    f"the fan-out {invoke_id!r} of {parent_id!r} closed concurrently: "
                    "the serialization does not keep the parent's calls apart"
                )
            answered = [prefix + str(i) for i, status in by_index.items() if status.terminal]
            await storage.mark_delivered(answered, now)
        if result is not None:
            executions.report_step(result, "answer", started)
        missing = tuple(i for i in range(count) if i not in by_index)
        if missing and self.child_canceller is not None:
            await awaited(self.child_canceller(parent_id, invoke_id, missing))
        report(
            "statifier.persistence.child",
            {"count": count},
            {"parent": parent_id, "invoke_id": invoke_id, "action": "closed", "index": -1},
        )
        return result


def _by_index(children: Mapping[str, _V], prefix: str) -> dict[int, _V]:
    """The fan-out children among ``children`` (keyed by execution id), keyed by their
    index: the ids ``<prefix><index>``."""
    return {
        int(child_id[len(prefix) :]): value
        for child_id, value in children.items()
        if child_id.startswith(prefix) and child_id[len(prefix) :].isdigit()
    }


def _outcome(index: int, record: ExecutionRecord) -> Value:
    """What an ended fan-out child contributes to its closed fan-out's answer."""
    entry: dict[str, Value] = {"index": index, "status": record.status.value}
    if record.status is Status.COMPLETED:
        entry["donedata"] = decode_outcome(record)
    elif record.status is Status.FAILED:
        entry["failure"] = decode_outcome(record)
    return entry


def _parked(result: Stepped | Discarded | None) -> bool:
    """Whether a delivery was discarded because the parent is parked or paused: it
    takes no event now, but will once it is put back, so the answer stays owed."""
    return isinstance(result, Discarded) and result.execution.status.waits


def _check_children(storage: Storage) -> None:
    capabilities = storage.capabilities
    if not (capabilities.metadata and capabilities.answers):
        raise MetadataUnsupported(
            "durable children need an adapter that keeps metadata and answers"
        )


def _answer_event_of(answer: AnswerRecord) -> Event:
    """What a durable child's end means to its parent, from its stored answer."""
    invoke_id = answer.invoke_id
    outcome = UNDEFINED if answer.outcome is None else tagged.decode(json.loads(answer.outcome))
    if answer.status is Status.COMPLETED:
        return invocation_done(invoke_id, outcome)
    if answer.status is Status.FAILED:
        return invocation_failed(invoke_id, answer.failure or "failed", detail=outcome)
    return invocation_failed(invoke_id, "cancelled")
