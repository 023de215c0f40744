"""The storage facade: charts, executions and saved positions, with every load guarded.

A stored position becomes a :class:`~statifier.core.MachineState` only here, and only
against a machine whose identity matches the one it was stored under: a changed chart
is refused with :class:`~statifier.core.positions.IdentityMismatch`, never silently
resumed in the wrong configuration.

It is also where blobs cross into and out of the adapter, so it is where the blob codec
(:mod:`statifier.persistence.codec`) is applied: every position, outcome, input-log
event and chart source is encoded on its way to the adapter and decoded on its way
back, and nothing above the storage ever sees an encoded blob.

>>> import asyncio
>>> from statifier.chart import compile_chart
>>> from statifier.persistence import MemoryAdapter, Storage
>>> machine = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml"><final/></scxml>')
>>> storage = Storage(MemoryAdapter())
>>> chart = asyncio.run(storage.save_chart(machine))
>>> chart.content_hash == machine.identity.content_hash
True
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Final, TypeVar

from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.chart.model import ChartIdentity
from statifier.core import MachineState
from statifier.core import positions as stored
from statifier.expr import Function
from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.codec import PLAIN, BlobCodec, PlainBlobs, UndecodableBlob
from statifier.persistence.errors import (
    ChartNotFound,
    ChartRetired,
    ExecutionNotFound,
    MetadataUnsupported,
    StoredChartDamaged,
)
from statifier.persistence.records import (
    AnswerRecord,
    ChartRecord,
    ErrorRecord,
    ExecutionRecord,
    InputRecord,
    PositionRecord,
    Status,
    StepWrite,
)
from statifier.telemetry import enabled, report

__all__ = ["Clock", "Storage", "utc_now"]

Clock = Callable[[], datetime]
"""Returns "now" as a timezone-aware datetime."""

_T = TypeVar("_T")
_MACHINES: Final = 64  # compiled charts kept per storage
_STATES: Final = 1_024  # executions whose last stored position is kept decoded


_ADAPTER_CALLS: Final = "statifier.persistence.adapter"


async def _timed(operation: str, awaitable: Awaitable[_T]) -> _T:
    started = time.perf_counter()
    try:
        return await awaitable
    finally:
        report(
            _ADAPTER_CALLS,
            {"duration": time.perf_counter() - started},
            {"operation": operation},
        )


def _decoded(codec: BlobCodec, blob: bytes, what: str) -> bytes:
    """``blob`` decoded, or :class:`UndecodableBlob` naming ``what`` it belongs to."""
    try:
        return codec.decode(blob)
    except UndecodableBlob as failure:
        raise UndecodableBlob(f"{what} could not be decoded: {failure}") from None


def _encoded_execution(codec: BlobCodec, record: ExecutionRecord) -> ExecutionRecord:
    position, outcome = record.position, record.outcome
    return replace(
        record,
        position=None if position is None else codec.encode(position),
        outcome=None if outcome is None else codec.encode(outcome),
    )


def _decoded_execution(
    codec: BlobCodec, record: ExecutionRecord, known: tuple[bytes, bytes] | None = None
) -> ExecutionRecord:
    """``record`` with its blobs decoded; ``known`` is ``(encoded, plain)`` of the position
    this storage last wrote for it: the same encoded bytes need no decoding."""
    position, outcome = record.position, record.outcome
    if position is None and outcome is None:
        return record
    if position is not None and known is not None and known[0] == position:
        plain: bytes | None = known[1]
    elif position is not None:
        plain = _decoded(codec, position, f"the position of execution {record.id!r}")
    else:
        plain = None
    return replace(
        record,
        position=plain,
        outcome=None
        if outcome is None
        else _decoded(codec, outcome, f"the outcome of execution {record.id!r}"),
    )


def _decoded_chart(codec: BlobCodec, chart: ChartRecord) -> ChartRecord:
    if chart.source is None:  # a tombstone
        return chart
    source = _decoded(codec, chart.source, f"the source of chart {chart.content_hash}")
    return replace(chart, source=source)


class _Queued:
    """What a queued step write answers when awaited: ``None``, at once."""

    def __await__(self) -> Generator[None, None, None]:
        return None
        yield  # a generator: awaiting it suspends nothing


_QUEUED: Final = _Queued()


def utc_now() -> datetime:
    """The current time in UTC (the default clock)."""
    return datetime.now(UTC)


class Storage:
    """An adapter behind the identity guard.

    Args:
        adapter: where records live.
        input_log_cap: the most entries one execution's input log holds (the last slot
            becomes a closing marker); ``None`` keeps every input.
        clock: "now" for the times written on records.
        loader: passed to :func:`~statifier.chart.compile_chart` when a stored chart
            is compiled again (for ``<data src>`` and ``<script src>``).
        functions: the host's expression functions, passed to
            :func:`~statifier.chart.compile_chart` likewise (the functions a chart
            calls are not stored with it: give the same ones every process).
        codec: encodes every blob written (positions, outcomes, input-log events,
            chart sources) and decodes every blob read; :data:`~statifier.persistence.
            codec.PLAIN` (the default) stores them as given. Every process that opens
            the store needs a codec that decodes what the others wrote.

    Reading a blob the codec cannot decode raises
    :class:`~statifier.persistence.codec.UndecodableBlob`, naming what it belongs to.
    """

    def __init__(
        self,
        adapter: Adapter,
        *,
        input_log_cap: int | None = None,
        clock: Clock = utc_now,
        loader: Callable[[str], str] | None = None,
        functions: Mapping[str, Function] | None = None,
        codec: BlobCodec = PLAIN,
    ) -> None:
        if input_log_cap is not None and input_log_cap < 1:
            raise ValueError(f"input_log_cap must be at least 1, not {input_log_cap}")
        self.adapter = adapter
        self.input_log_cap = input_log_cap
        self.clock = clock
        self.loader = loader
        self.functions: Mapping[str, Function] = dict(functions or {})
        self.codec = codec
        # The identity codec costs nothing: its blobs are handed through untouched,
        # with no coroutine or record copy in between.
        self._sealing: BlobCodec | None = None if isinstance(codec, PlainBlobs) else codec
        self._machines: OrderedDict[str, Machine] = OrderedDict()
        self._states: dict[str, tuple[bytes, MachineState]] = {}
        # (encoded, plain) of the position last written per execution under the codec:
        # a step reads back what the step before it wrote, and the same encoded bytes
        # need not be decoded again (one decryption a step saved).
        self._written: dict[str, tuple[bytes, bytes]] = {}
        # Records read ahead by read_ahead, each returned once (as the adapter
        # returned them, still encoded).
        self._held: dict[str, ExecutionRecord] = {}
        # Inside deferred_steps: the steps' writes not sent yet (None outside), and
        # the record each one wrote, encoded, answered by find_execution until sent.
        self._deferred: list[StepWrite] | None = None
        self._pending: dict[str, ExecutionRecord] = {}

    def over(self, adapter: Adapter) -> Storage:
        """This storage over another adapter, typically a view of this one's bound to a
        caller's transaction (``SqlAdapter.joined``): same clock, cap, loader and functions, and the
        same caches of compiled charts and decoded positions, so a host that opens one
        transaction per event does not compile its charts again each time. The caches
        are safe to share: a position is reused only for the exact bytes it was stored
        as."""
        view = Storage(
            adapter,
            input_log_cap=self.input_log_cap,
            clock=self.clock,
            loader=self.loader,
            functions=self.functions,
            codec=self.codec,
        )
        view._machines = self._machines
        view._states = self._states
        view._written = self._written
        return view

    @property
    def capabilities(self) -> Capabilities:
        return self.adapter.capabilities

    def _call(
        self, operation: str, awaitable: Awaitable[_T], *, aside: bool = False
    ) -> Awaitable[_T]:
        """One adapter call, to await: timed and reported
        (``statifier.persistence.adapter``) while a handler observes adapter calls, else
        handed back untouched (a step makes three; a wrapper each would show). With
        steps' writes queued (:meth:`deferred_steps`), they are sent first, unless the
        call is ``aside``: it reads or writes nothing a queued write touches (a chart,
        an execution no queued write is for)."""
        if self._deferred and not aside:
            return self._after_steps(operation, awaitable)
        if not enabled(_ADAPTER_CALLS):
            return awaitable
        return _timed(operation, awaitable)

    async def _after_steps(self, operation: str, awaitable: Awaitable[_T]) -> _T:
        await self.send_steps()
        return await self._call(operation, awaitable)

    @asynccontextmanager
    async def deferred_steps(self) -> AsyncIterator[None]:
        """For the block, where the adapter sends steps' writes together (capability
        ``batched_steps``), :meth:`record_step` without errors queues its writes
        instead of sending them, and :meth:`find_execution` answers the record a
        queued write holds (or an :meth:`insert_execution` of the block wrote).
        They are sent together before any other adapter call, at :meth:`send_steps`,
        and when the block ends; if it raises, they are dropped (the caller rolls
        back what the block wrote). Elsewhere it changes nothing.

        For a caller stepping many executions in one transaction of this storage's
        view (:meth:`over`), which nothing else writes meanwhile: a delivery batch.
        A statement the caller runs on the transaction itself does not see the queued
        writes until :meth:`send_steps`.
        """
        if not self.adapter.capabilities.batched_steps or self._deferred is not None:
            yield
            return
        self._deferred = []
        try:
            yield
            await self.send_steps()
        finally:
            self._deferred = None
            self._pending.clear()

    async def send_steps(self) -> None:
        """Send the steps' writes :meth:`deferred_steps` queued, if any, in one adapter
        call.

        Raises:
            ExecutionNotFound: one of the executions is gone (nothing is written).
        """
        steps = self._deferred
        if not steps:
            return
        self._deferred = []
        self._pending.clear()
        await self._call("record_steps", self.adapter.record_steps(steps, self.input_log_cap))

    # Charts.

    async def save_chart(self, machine: Machine) -> ChartRecord:
        """Store the chart's source under its content hash (idempotent).

        Raises:
            ChartRetired: this hash was retired; a retired chart is never revived.
        """
        identity = machine.identity
        record = ChartRecord(
            identity.content_hash,
            source=machine.source,
            name=identity.name,
            version=identity.version,
            saved_at=self.clock(),
        )
        codec = self._sealing
        if codec is not None and record.source is not None:
            sealed = replace(record, source=codec.encode(record.source))
            saved = await self._call("save_chart", self.adapter.save_chart(sealed), aside=True)
            saved = _decoded_chart(codec, saved)
        else:
            saved = await self._call("save_chart", self.adapter.save_chart(record), aside=True)
        if saved.retired_at is not None:
            raise ChartRetired(saved.content_hash, saved.retired_by)
        self._machines.setdefault(identity.content_hash, machine)
        return saved

    async def fetch_chart(self, content_hash: str) -> ChartRecord:
        """The stored chart.

        Raises:
            ChartNotFound: nothing is stored under the hash.
            ChartRetired: the chart was retired.
        """
        chart = await self.find_chart(content_hash)
        if chart is None:
            raise ChartNotFound(content_hash)
        if chart.retired_at is not None or chart.source is None:
            raise ChartRetired(content_hash, chart.retired_by)
        return chart

    def find_chart(self, content_hash: str) -> Awaitable[ChartRecord | None]:
        """The chart stored under the hash, retired or not, or ``None``.

        Raises:
            UndecodableBlob: the codec cannot decode its source.
        """
        found = self._call("fetch_chart", self.adapter.fetch_chart(content_hash), aside=True)
        return found if self._sealing is None else self._open_chart(found)

    async def _open_chart(self, found: Awaitable[ChartRecord | None]) -> ChartRecord | None:
        assert self._sealing is not None
        chart = await found
        return None if chart is None else _decoded_chart(self._sealing, chart)

    def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> Awaitable[ChartRecord | None]:
        """Tombstone the chart (see ``Adapter.retire_chart``); ``None`` if there is none.

        Raises:
            Pinned: something in the store holds the chart (checked atomically).
        """
        return self._call(
            "retire_chart", self.adapter.retire_chart(content_hash, retired_by, retired_at)
        )

    async def machine(self, content_hash: str) -> Machine:
        """The stored chart compiled again (compiled machines are cached).

        Raises:
            ChartNotFound, ChartRetired: as :meth:`fetch_chart`.
            StoredChartDamaged: the stored source does not compile to this hash.
        """
        machine = self._machines.get(content_hash)
        if machine is not None:
            self._machines.move_to_end(content_hash)
            return machine
        chart = await self.fetch_chart(content_hash)
        assert chart.source is not None  # fetch_chart refuses tombstones
        try:
            machine = compile_chart(
                chart.source,
                name=chart.name,
                version=chart.version,
                loader=self.loader,
                functions=self.functions,
            )
        except InvalidChart as invalid:
            message = f"the chart {content_hash} no longer compiles: {invalid}"
            raise StoredChartDamaged(message) from None
        if machine.identity.content_hash != content_hash:
            raise StoredChartDamaged(f"the source stored as {content_hash} hashes otherwise")
        self._machines[content_hash] = machine
        if len(self._machines) > _MACHINES:
            self._machines.popitem(last=False)
        return machine

    # Executions.

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord:
        """The execution record.

        Raises:
            ExecutionNotFound: there is none with this id.
        """
        record = await self.find_execution(execution_id)
        if record is None:
            raise ExecutionNotFound(execution_id)
        return record

    def find_execution(self, execution_id: str) -> Awaitable[ExecutionRecord | None]:
        """The execution record, or ``None``: the one :meth:`read_ahead` read, if
        it holds one for ``execution_id``, else the adapter's.

        Raises:
            UndecodableBlob: the codec cannot decode its position or outcome.
        """
        pending = self._pending.get(execution_id) if self._pending else None
        if pending is not None:
            return self._open_held(pending)
        held = self._held.pop(execution_id, None) if self._held else None
        if held is not None:
            return self._open_held(held)
        # Not queued for (the queued record was answered above): aside.
        fetching = self.adapter.fetch_execution(execution_id)
        found = self._call("fetch_execution", fetching, aside=True)
        return found if self._sealing is None else self._open_execution(found)

    async def read_ahead(self, execution_ids: Sequence[str]) -> None:
        """Read the executions ``execution_ids`` names in one adapter call
        (``fetch_executions``, which locks their rows as ``fetch_execution`` would) and
        answer each at its next :meth:`find_execution` through this storage, once,
        without asking the adapter again. A write of one through this storage
        (``update_execution``, ``record_step``, ``rechart_execution``, ``prune``) drops
        what is held for it.

        For a caller that steps many executions in one transaction (the timer worker's
        batch): one round trip instead of one per step. Call it inside that
        transaction, on a storage no other writer of these executions shares (a
        transaction's own view, :meth:`over`): a record held here is what the row was
        when read, and only the rows' locks and this storage's writes keep it so.
        """
        if not execution_ids:
            return
        fetching = self.adapter.fetch_executions(execution_ids)
        aside = not any(execution_id in self._pending for execution_id in execution_ids)
        found = await self._call("fetch_executions", fetching, aside=aside)
        self._held.update((record.id, record) for record in found)

    async def _open_held(self, record: ExecutionRecord) -> ExecutionRecord:
        if self._sealing is None:
            return record
        return _decoded_execution(self._sealing, record, self._written.get(record.id))

    async def _open_execution(
        self, found: Awaitable[ExecutionRecord | None]
    ) -> ExecutionRecord | None:
        assert self._sealing is not None
        record = await found
        if record is None:
            return None
        return _decoded_execution(self._sealing, record, self._written.get(record.id))

    def insert_execution(self, record: ExecutionRecord) -> Awaitable[None]:
        """Store a new execution (its position and outcome encoded).

        Raises:
            ExecutionExists: one with this id exists.
        """
        if self._sealing is not None:
            record = self._encoded(record)
        inserting = self.adapter.insert_execution(record)
        call = self._call("insert_execution", inserting, aside=record.id not in self._pending)
        if self._deferred is None:
            return call
        return self._inserted(record, call)

    async def _inserted(self, record: ExecutionRecord, inserting: Awaitable[None]) -> None:
        """The insert, and then, with steps deferred, its record answered by the next
        read of the execution (a create's step) as a queued write's is."""
        await inserting
        self._pending[record.id] = record

    def update_execution(self, record: ExecutionRecord) -> Awaitable[None]:
        """Write the record's changing fields (see ``Adapter.update_execution``; its
        position and outcome encoded).

        Raises:
            ExecutionNotFound: there is no such execution.
        """
        if self._held:
            self._held.pop(record.id, None)
        if self._sealing is not None:
            record = self._encoded(record)
        return self._call("update_execution", self.adapter.update_execution(record))

    def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> Awaitable[bool]:
        """Move the execution onto ``record.content_hash`` while it is still on
        ``from_hash`` (see ``Adapter.rechart_execution``); returns whether it moved.
        The decoded position kept for it is dropped: it belongs to the old chart. The
        position and outcome are encoded, as :meth:`update_execution` encodes them."""
        self._states.pop(record.id, None)
        self._held.pop(record.id, None)
        if self._sealing is not None:
            record = self._encoded(record)
        return self._call("rechart_execution", self.adapter.rechart_execution(record, from_hash))

    def _encoded(self, record: ExecutionRecord) -> ExecutionRecord:
        """``record`` encoded, its position remembered (see ``_written``). A write that
        rolls back leaves an entry no stored bytes will ever match."""
        assert self._sealing is not None
        encoded = _encoded_execution(self._sealing, record)
        written = self._written
        if encoded.position is not None and record.position is not None:
            written[record.id] = (encoded.position, record.position)
            if len(written) > _STATES:
                del written[next(iter(written))]
        else:
            written.pop(record.id, None)
        return encoded

    def statuses_by_metadata(self, pairs: Mapping[str, str]) -> Awaitable[dict[str, Status]]:
        """The status of every execution whose metadata holds every pair, by id."""
        return self._call("statuses_by_metadata", self.adapter.statuses_by_metadata(pairs))

    def pinning_executions(self, content_hash: str) -> Awaitable[list[str]]:
        """Ids of the active or parked executions on ``content_hash``."""
        return self._call("pinning_executions", self.adapter.pinning_executions(content_hash))

    def prune(self, ended_before: datetime, limit: int) -> Awaitable[list[str]]:
        """Clear the position, input log and errors of up to ``limit`` executions that
        ended before ``ended_before``; returns their ids."""
        self._held.clear()
        return self._call("prune", self.adapter.prune(ended_before, limit))

    # Durable children's answers.

    def insert_answer(self, record: AnswerRecord) -> Awaitable[None]:
        """Store a child's answer (the first one for a child stays; its outcome
        encoded)."""
        if self._sealing is not None and record.outcome is not None:
            record = replace(record, outcome=self._sealing.encode(record.outcome))
        return self._call("insert_answer", self.adapter.insert_answer(record))

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        """The child's answer, or ``None``.

        Raises:
            UndecodableBlob: the codec cannot decode its outcome.
        """
        found = await self._call("fetch_answer", self.adapter.fetch_answer(child_id))
        return None if found is None else self._open_answer(found)

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        """Up to ``limit`` answers still owed to their parents, oldest first; those to
        a parent that waits (parked or paused) are left out until it is put back.

        Raises:
            UndecodableBlob: the codec cannot decode an outcome.
        """
        found = await self._call("undelivered_answers", self.adapter.undelivered_answers(limit))
        return [self._open_answer(record) for record in found]

    def _open_answer(self, record: AnswerRecord) -> AnswerRecord:
        if self._sealing is None or record.outcome is None:
            return record
        what = f"the answer of child {record.child_id!r}"
        return replace(record, outcome=_decoded(self._sealing, record.outcome, what))

    def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> Awaitable[None]:
        """Record that these children's answers were delivered."""
        return self._call("mark_delivered", self.adapter.mark_delivered(child_ids, delivered_at))

    def take_fan_out_end(
        self, parent_id: str, invoke_id: str, ended_at: datetime
    ) -> Awaitable[bool]:
        """Take a fan-out's end (close it): ``True`` once, ``False`` afterwards."""
        taking = self.adapter.take_fan_out_end(parent_id, invoke_id, ended_at)
        return self._call("take_fan_out_end", taking)

    def fan_out_ended(self, parent_id: str, invoke_id: str) -> Awaitable[bool]:
        """Whether the fan-out has closed (its end was taken)."""
        return self._call("fan_out_ended", self.adapter.fan_out_ended(parent_id, invoke_id))

    # The input log.

    def append_input(
        self, execution_id: str, via: str, event: bytes, recorded_at: datetime
    ) -> Awaitable[int | None]:
        """Append one entry to the execution's input log, under this storage's cap;
        returns its ``seq``, or ``None`` when the log is (or just got) closed. The event
        is stored encoded."""
        if self._sealing is not None:
            event = self._sealing.encode(event)
        appending = self.adapter.append_input(
            execution_id, via, event, recorded_at, self.input_log_cap
        )
        return self._call("append_input", appending)

    def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        errors: Sequence[ErrorRecord] = (),
    ) -> Awaitable[int | None]:
        """:meth:`update_execution`, :meth:`append_input` and (where the adapter keeps
        them) :meth:`record_errors` in one adapter call, all or nothing (see
        ``Adapter.record_step``); returns the append's ``seq``, or ``None``. Each
        error's ``seq`` becomes the append's.

        Inside :meth:`deferred_steps`, a write without errors is queued and answers
        ``None`` (its ``seq`` is not known until it is sent).

        Raises:
            ExecutionNotFound: there is no such execution (nothing is written).
        """
        if self._held:
            self._held.pop(record.id, None)
        if self._sealing is not None:
            record = self._encoded(record)
            event = self._sealing.encode(event)
        if self._deferred is not None and not errors:
            self._deferred.append(StepWrite(record, via=via, event=event, recorded_at=recorded_at))
            self._pending[record.id] = record
            return _QUEUED
        cap = self.input_log_cap
        if errors and self.adapter.capabilities.errors:
            sealed = self._sealed_errors(errors)
            writing = self.adapter.record_step(record, via, event, recorded_at, cap, sealed)
        else:
            writing = self.adapter.record_step(record, via, event, recorded_at, cap)
        return self._call("record_step", writing)

    # Errors.

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        """Store ``errors`` (their bytes encoded); nothing where the adapter keeps no
        errors (capability ``errors``)."""
        if errors and self.adapter.capabilities.errors:
            sealed = self._sealed_errors(errors)
            await self._call("record_errors", self.adapter.record_errors(sealed))

    async def errors(self, execution_id: str, limit: int = 100) -> list[ErrorRecord]:
        """The execution's ``limit`` most recent stored errors, oldest first, their
        bytes decoded (empty where the adapter keeps none).

        Raises:
            UndecodableBlob: the codec cannot decode one.
        """
        if not self.adapter.capabilities.errors:
            return []
        found = await self._call("errors", self.adapter.errors(execution_id, limit))
        codec = self._sealing
        if codec is None:
            return found
        return [
            replace(
                error,
                error=_decoded(codec, error.error, f"an error of execution {execution_id!r}"),
            )
            for error in found
        ]

    def _sealed_errors(self, errors: Sequence[ErrorRecord]) -> Sequence[ErrorRecord]:
        codec = self._sealing
        if codec is None:
            return errors
        return [replace(error, error=codec.encode(error.error)) for error in errors]

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        """The execution's input log, in ``seq`` order, its events decoded.

        Raises:
            UndecodableBlob: the codec cannot decode an entry.
        """
        entries = await self._call("inputs", self.adapter.inputs(execution_id))
        codec = self._sealing
        if codec is None:
            return entries
        return [
            entry
            if entry.event is None
            else replace(
                entry,
                event=_decoded(
                    codec, entry.event, f"input {entry.seq} of execution {execution_id!r}"
                ),
            )
            for entry in entries
        ]

    def load(self, record: ExecutionRecord | PositionRecord, machine: Machine) -> MachineState:
        """The record's position, for ``machine`` only.

        Raises:
            IdentityMismatch: the position belongs to another chart.
            NotAPosition: the record holds no position (pruned) or a damaged one.
        """
        if record.content_hash != machine.identity.content_hash:
            raise stored.IdentityMismatch(ChartIdentity(record.content_hash), machine.identity)
        position = record.position
        if position is None:
            raise stored.NotAPosition("the execution's position was pruned")
        if isinstance(record, ExecutionRecord):
            known = self._states.get(record.id)
            if known is not None and known[0] == position and known[1].machine is machine:
                return known[1]
        return stored.load(machine, position)

    def remember(self, execution_id: str, position: bytes, state: MachineState) -> None:
        """Keep the state just stored for an execution as ``position``, so its next
        load of the same bytes skips decoding them (states are immutable, and dump then
        load gives an equal state). One state per execution: the one it replaces is
        dropped at once, while still fresh in memory."""
        states = self._states
        kept = state if state.routes is None else state._replace(routes=None)
        states[execution_id] = (position, kept)  # a replaced entry keeps its place
        if len(states) > _STATES:
            del states[next(iter(states))]

    async def list_executions(self, **metadata: str) -> list[ExecutionRecord]:
        """Executions whose metadata holds every given pair.

        Raises:
            MetadataUnsupported: the adapter keeps no metadata.
        """
        if not self.capabilities.metadata:
            raise MetadataUnsupported("this adapter cannot list executions by metadata")
        records = await self._call("list_by_metadata", self.adapter.list_by_metadata(metadata))
        codec = self._sealing
        if codec is None:
            return records
        return [_decoded_execution(codec, record) for record in records]

    # Saved positions.

    async def save_position(self, key: str, state: MachineState) -> PositionRecord:
        """Save ``state`` under a key of the host's (a session id, say), replacing what
        was saved there.

        Raises:
            ValueError: the position cannot be stored (see ``positions.dump``).
        """
        record = PositionRecord(
            key,
            content_hash=state.machine.identity.content_hash,
            position=stored.dump(state),
            saved_at=self.clock(),
        )
        stored_record = record
        if self._sealing is not None:
            stored_record = replace(record, position=self._sealing.encode(record.position))
        await self._call("save_position", self.adapter.save_position(stored_record))
        return record

    async def load_position(self, key: str, machine: Machine) -> MachineState | None:
        """The position saved under ``key`` for ``machine``, or ``None``.

        Raises:
            IdentityMismatch: it was saved for another chart.
            UndecodableBlob: the codec cannot decode it.
        """
        record = await self._call("fetch_position", self.adapter.fetch_position(key))
        if record is None:
            return None
        if self._sealing is not None:
            position = _decoded(self._sealing, record.position, f"the position saved as {key!r}")
            record = replace(record, position=position)
        return self.load(record, machine)

    async def delete_position(self, key: str) -> bool:
        """Forget the position saved under ``key``; returns whether there was one."""
        return await self._call("delete_position", self.adapter.delete_position(key))

    async def counts_on(self, content_hash: str) -> Mapping[str, int]:
        """What refers to a chart: executions by status, saved positions, and ended
        durable children on it whose parent still runs (``children_linked``)."""
        by_status = await self._call(
            "count_executions_on", self.adapter.count_executions_on(content_hash)
        )
        counts = {f"executions_{status.value}": n for status, n in by_status.items() if n}
        positions = await self._call(
            "count_positions_on", self.adapter.count_positions_on(content_hash)
        )
        if positions:
            counts["positions"] = positions
        if self.capabilities.answers:
            linking = self.adapter.count_linked_children_on(content_hash)
            linked = await self._call("count_linked_children_on", linking)
            if linked:
                counts["children_linked"] = linked
        return counts
