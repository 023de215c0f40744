"""Driving durable executions that invoke services, until they rest.

:class:`Executions` steps an execution once. A chart that invokes a service is then
waiting for an answer it cannot fetch; the :class:`Driver` performs each ``<invoke>``
through a dispatch function inside the step that emitted it, and steps every answer
back in as ``done.invoke.<id>`` or ``error.communication.invoke.<id>``, built by the
same functions a live session uses, until nothing is left to answer.

``<invoke type="scxml">`` becomes a durable child: an execution of its own (id
``<parent>/<invoke id>``), created inside the parent's step, which answers its parent
when it ends. A fan-out (one ``<invoke>`` over N items) is started child by child with
:meth:`Driver.start_child_at`, and settled under the parent's exclusion once all N
have ended.

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

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Final, Literal, TypeAlias, TypeVar

from statifier.callbacks import settle
from statifier.chart import Machine
from statifier.core import SCXML_INVOKE_TYPE, Event, MachineState, StartOptions
from statifier.core import effects as fx
from statifier.expr import UNDEFINED, Value
from statifier.persistence.errors import (
    ExecutionExists,
    MetadataUnsupported,
    PersistenceError,
)
from statifier.persistence.executions import (
    PARENT_KEY,
    Discarded,
    Executions,
    Stepped,
    decode_outcome,
)
from statifier.persistence.executor import EffectContext, Executor, Refused, refuse_unperformed
from statifier.persistence.records import ExecutionRecord, Status
from statifier.persistence.serialization import Serialization
from statifier.persistence.storage import Storage
from statifier.session.children import invoked_chart, seeded_datamodel
from statifier.session.handlers import invocation_done, invocation_failed
from statifier.telemetry import report

__all__ = [
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

CHILD_TYPES: Final = frozenset({SCXML_INVOKE_TYPE})
"""Invoke types the driver runs as durable child executions: the SCXML type, which every
``Invoke`` effect carries whichever spelling the chart wrote (see
:data:`statifier.core.SCXML_INVOKE_TYPES`)."""

INVOKE_KEY: Final = "statifier.invoke"
"""Metadata key: the invoke id a durable child answers."""
INDEX_KEY: Final = "statifier.index"
"""Metadata key: a fan-out child's place among its siblings."""
_COUNT_KEY: Final = "statifier.count"
_POLICY_KEY: Final = "statifier.policy"
_SETTLED_KEY: Final = "statifier.settled"


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
``first_error`` settlement cancels the rest."""
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
    """Answers collected while one call's effects run, to step in once it is stored:
    ``(invoke id, answer event)`` in the order they came."""

    answers: list[tuple[str, Event]] = field(default_factory=list)


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
        lock_wait: float | None = None,
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

    async def _step(
        self,
        execution_id: str,
        event: Event,
        door: str,
        when: Callable[[MachineState], bool] | None,
    ) -> Stepped | Discarded:
        pending = _Pending()
        result = await self.executions.step(
            execution_id, None, event, door=door, when=when, executor=self._collecting(pending)
        )
        return await self._drain(execution_id, result, pending)

    async def _drive(
        self, execution_id: str, result: Stepped | Discarded, pending: _Pending
    ) -> Stepped | Discarded:
        """Step in the answers a call collected, one durable step each (answers to
        those steps' own invocations included), until none is left."""
        turns = 0
        while pending.answers and isinstance(result, Stepped) and not result.finished:
            answers, pending.answers = pending.answers, []
            for invoke_id, event in answers:
                turns += 1
                if turns > self.max_turns:
                    raise MaxTurnsExceeded(execution_id, self.max_turns)
                machine = result.state.machine
                stepped = await self.executions.step(
                    execution_id,
                    machine,
                    event,
                    door="answer",
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
            return await settle(self.effects(effect, context))
        if pending is None:
            raise RuntimeError(f"an invocation outside a driver call: {effect.invoke_id!r}")
        if effect.type in CHILD_TYPES:
            await self._start_child(context.execution_id, effect, pending)
            return None
        if self.dispatch is None:
            answer: Answer | None = InvocationFailed("no dispatch for invoke type " + effect.type)
        else:
            answer = await settle(self.dispatch(effect, context))
        if answer is not None:
            event = _answer_event(effect.invoke_id, answer)
            pending.answers.append((effect.invoke_id, event))
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
        if not self.storage.capabilities.metadata:
            raise MetadataUnsupported("durable children need an adapter that keeps metadata")
        machine = invoked_chart(effect, self.storage.loader, self.storage.functions)
        if isinstance(machine, str):
            failed = invocation_failed(effect.invoke_id, machine)
            pending.answers.append((effect.invoke_id, failed))
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
            pending.answers.append((effect.invoke_id, _child_answer(created)))

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
        """A durable child ended: answer its parent (or settle its fan-out)."""
        parent_id = child.metadata.get(PARENT_KEY)
        invoke_id = child.metadata.get(INVOKE_KEY)
        if parent_id is None or invoke_id is None:
            return
        if INDEX_KEY in child.metadata:
            await self._settle(parent_id, invoke_id, child.metadata)
            return
        await self._step(parent_id, _child_answer(child), "answer", _live(invoke_id))

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
        if not self.storage.capabilities.metadata:
            raise MetadataUnsupported("fan-out children need an adapter that keeps metadata")
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
        except ExecutionExists:
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
            await self._settle(parent_id, effect.invoke_id, metadata)
        return record

    async def _settle(self, parent_id: str, invoke_id: str, metadata: Mapping[str, str]) -> None:
        """Answer the parent once when every sibling has ended (or, under
        ``first_error``, one failed: the rest are then cancelled).

        The decision is taken under the parent's exclusion, from the indexed status
        projection, and recorded by a settlement marker (an ended execution
        ``<parent>/<invoke id>#settled``) whose id can be taken only once, so siblings
        ending together answer once. Cancelling and answering happen after the
        exclusion is released, since each takes exclusions of its own.
        """
        count = int(metadata[_COUNT_KEY])
        policy = metadata[_POLICY_KEY]
        storage = self.storage
        prefix = f"{parent_id}/{invoke_id}/"
        siblings = {PARENT_KEY: parent_id, INVOKE_KEY: invoke_id}
        async with self.executions.serialization.exclusive(parent_id):
            statuses = await storage.statuses_by_metadata(siblings)
            by_index = _by_index(statuses, prefix)
            first_error = policy == "first_error" and Status.FAILED in by_index.values()
            ended = len(by_index) == count and all(s.terminal for s in by_index.values())
            if not (first_error or ended):
                return
            now = storage.clock()
            marker = ExecutionRecord(
                f"{parent_id}/{invoke_id}#settled",
                content_hash=(await storage.fetch_execution(parent_id)).content_hash,
                status=Status.COMPLETED,
                position=None,
                metadata={_SETTLED_KEY: parent_id},
                created_at=now,
                updated_at=now,
                ended_at=now,
            )
            try:
                await storage.insert_execution(marker)
            except ExecutionExists:
                return  # a sibling's settlement answered already
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
        for index in running:
            await self.executions.cancel(prefix + str(index))
        missing = tuple(i for i in range(count) if i not in by_index)
        if missing and self.child_canceller is not None:
            await settle(self.child_canceller(parent_id, invoke_id, missing))
        report(
            "statifier.persistence.child",
            {"count": count},
            {"parent": parent_id, "invoke_id": invoke_id, "action": "settled", "index": -1},
        )
        event = invocation_done(invoke_id, outcomes)
        await self._step(parent_id, event, "answer", _live(invoke_id))


def _by_index(children: Mapping[str, _V], prefix: str) -> dict[int, _V]:
    """The fan-out children among ``children`` (keyed by execution id), keyed by their
    index: the ids ``<prefix><index>``."""
    return {
        int(child_id[len(prefix) :]): value
        for child_id, value in children.items()
        if child_id.startswith(prefix) and child_id[len(prefix) :].isdigit()
    }


def _outcome(index: int, record: ExecutionRecord) -> Value:
    """What an ended fan-out child contributes to the settled answer."""
    entry: dict[str, Value] = {"index": index, "status": record.status.value}
    if record.status is Status.COMPLETED:
        entry["donedata"] = decode_outcome(record)
    elif record.status is Status.FAILED:
        entry["failure"] = decode_outcome(record)
    return entry


def _child_answer(child: ExecutionRecord) -> Event:
    """What a durable child's end means to its parent."""
    invoke_id = child.metadata[INVOKE_KEY]
    if child.status is Status.COMPLETED:
        return invocation_done(invoke_id, decode_outcome(child))
    if child.status is Status.FAILED:
        return invocation_failed(invoke_id, child.failure or "failed", detail=decode_outcome(child))
    return invocation_failed(invoke_id, "cancelled")
