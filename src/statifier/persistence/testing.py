"""The storage conformance suite: hold any adapter to the
:class:`~statifier.persistence.adapter.Adapter` contract from pytest.

The suite is a set of test classes: :class:`AdapterConformance` checks the required
operations, and one class per optional capability checks it
(:class:`ChartRetirementConformance`, :class:`MetadataConformance`,
:class:`InputLogConformance`, :class:`LockConformance`,
:class:`AnswersConformance`, :class:`ErrorsConformance`); :class:`FullConformance` is all
of them together. Subclass the ones your adapter declares in a test module, name the
subclass ``Test...`` so pytest collects it, and answer a fresh adapter over an empty
store from ``make_adapter``:

>>> from statifier.persistence import MemoryAdapter
>>> from statifier.persistence.testing import FullConformance
>>> class TestMemoryAdapter(FullConformance):
...     async def make_adapter(self) -> MemoryAdapter:
...         return MemoryAdapter()
>>> sorted(name for name in dir(TestMemoryAdapter) if name.startswith("test_"))[:2]
['test_answers_a_fan_out_end_is_taken_once', 'test_answers_fan_out_ends_are_not_executions']

The suite needs pytest and pytest-asyncio (it marks its coroutines itself, so it runs in
strict mode) and no particular database. Every check it collects runs; nothing is
skipped. It assumes what the contract promises and nothing more:

- Each capability class first checks that the adapter declares the capability, so
  holding an adapter to a capability it does not declare fails at once. An adapter that
  does not declare ``lock`` leaves out :class:`LockConformance` and is held to nothing
  about ``exclusive``.
- Times are compared as instants, to within a microsecond, and must come back
  timezone-aware (a time stored with a ``+05:30`` offset may come back in UTC).
- ``list_by_metadata({})`` lists every execution: the contract lists executions whose
  metadata holds every given pair, and with no pairs every execution does.
- The closing marker of a capped input log keeps the ``via`` and ``recorded_at`` of the
  append it replaced.
- The suite writes in the facade's order: an execution after its chart, an input log
  entry for an execution that exists. Saved positions are written without their chart
  and locks are taken on ids that may not exist yet, as the facade does.

Two attributes of :class:`LockConformance` describe what the contract leaves to the
store:

- :attr:`~LockConformance.exclusive_locks_whole_store`: set it for a store whose lock
  admits one writer at a time whatever the execution (SQLite's single writer). The suite
  then checks that a block on another execution enters once the first one ends, instead
  of beside it.
- :attr:`~LockConformance.exclusive_rolls_back`: set it for an adapter whose
  ``exclusive`` block is a transaction; the suite then checks that a block which raises
  leaves nothing behind. The in-memory adapter keeps what a raising block wrote.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import pytest_asyncio

from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.errors import (
    ChartRetired,
    ExecutionExists,
    ExecutionNotFound,
    LockTimeout,
    Pinned,
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

__all__ = [
    "AdapterConformance",
    "AnswersConformance",
    "ChartRetirementConformance",
    "ErrorsConformance",
    "FullConformance",
    "InputLogConformance",
    "LockConformance",
    "MetadataConformance",
]

# Times carry microseconds, so a store that keeps milliseconds or seconds is caught.
_BASE = datetime(2024, 5, 1, 12, 0, 0, 123457, tzinfo=UTC)
_INDIA = timezone(timedelta(hours=5, minutes=30))
_TOLERANCE = timedelta(microseconds=1)
# How long a lock check waits for something that must happen; only a failing adapter
# ever waits this long.
_PATIENCE = 10.0

_HASH_A = "a" * 63 + "1"
_HASH_B = "b" * 63 + "2"
# Bytes that are not UTF-8, so a store that decodes blobs as text is caught.
_BLOB = b"\x00\xff\xfe position \xc3\x28 \n"


def _at(minutes: float) -> datetime:
    return _BASE + timedelta(minutes=minutes)


def _chart(
    content_hash: str = _HASH_A,
    source: bytes = b"<scxml/>",
    *,
    name: str | None = "payment",
    version: str | None = "3",
    saved_at: datetime = _BASE,
) -> ChartRecord:
    return ChartRecord(content_hash, source=source, name=name, version=version, saved_at=saved_at)


def _execution(
    execution_id: str = "exec-1",
    content_hash: str = _HASH_A,
    *,
    status: Status = Status.ACTIVE,
    position: bytes | None = _BLOB,
    metadata: Mapping[str, str] | None = None,
    outcome: bytes | None = None,
    failure: str | None = None,
    updated_at: datetime = _BASE,
    ended_at: datetime | None = None,
) -> ExecutionRecord:
    return ExecutionRecord(
        id=execution_id,
        content_hash=content_hash,
        status=status,
        position=position,
        metadata=dict(metadata or {}),
        outcome=outcome,
        failure=failure,
        created_at=_BASE,
        updated_at=updated_at,
        ended_at=ended_at,
    )


def _ended(
    execution_id: str,
    ended_at: datetime,
    *,
    status: Status = Status.COMPLETED,
    failure: str | None = None,
    position: bytes | None = _BLOB,
    metadata: Mapping[str, str] | None = None,
) -> ExecutionRecord:
    """An execution that reached ``status`` at ``ended_at``."""
    return _execution(
        execution_id,
        status=status,
        position=position,
        metadata=metadata,
        outcome=b'{"done": true}',
        failure=failure,
        updated_at=ended_at,
        ended_at=ended_at,
    )


def _answer(
    child_id: str,
    parent_id: str = "parent-1",
    *,
    content_hash: str = _HASH_B,
    status: Status = Status.COMPLETED,
    created_at: datetime = _BASE,
    delivered_at: datetime | None = None,
) -> AnswerRecord:
    return AnswerRecord(
        child_id,
        parent_id=parent_id,
        invoke_id="sub",
        content_hash=content_hash,
        status=status,
        outcome=b'{"ok": 1}' if status is Status.COMPLETED else None,
        failure="declined" if status is Status.FAILED else None,
        created_at=created_at,
        delivered_at=delivered_at,
    )


def _assert_same_answer(actual: AnswerRecord | None, expected: AnswerRecord) -> None:
    assert actual is not None, f"answer {expected.child_id!r} missing"
    for name in ("child_id", "parent_id", "invoke_id", "content_hash", "status"):
        assert getattr(actual, name) == getattr(expected, name), f"answer {name} differs"
    assert actual.outcome == expected.outcome, "answer outcome differs"
    assert actual.failure == expected.failure, "answer failure differs"
    _assert_same_time(actual.created_at, expected.created_at, "answer created_at")
    _assert_same_time(actual.delivered_at, expected.delivered_at, "answer delivered_at")


# Comparisons. Records are compared field by field so that a failure names the field,
# and times as instants within the tolerance.


def _assert_same_time(actual: datetime | None, expected: datetime | None, what: str) -> None:
    if expected is None:
        assert actual is None, f"{what}: expected None, got {actual!r}"
        return
    assert actual is not None, f"{what}: expected {expected!r}, got None"
    assert actual.utcoffset() is not None, f"{what}: {actual!r} came back without a time zone"
    assert abs(actual - expected) <= _TOLERANCE, f"{what}: expected {expected!r}, got {actual!r}"


def _assert_same_chart(actual: ChartRecord | None, expected: ChartRecord) -> None:
    assert actual is not None, f"chart {expected.content_hash}: expected a record, got None"
    for name in ("content_hash", "source", "name", "version", "retired_by"):
        got, want = getattr(actual, name), getattr(expected, name)
        assert got == want, f"chart {name}: expected {want!r}, got {got!r}"
    _assert_same_time(actual.saved_at, expected.saved_at, "chart saved_at")
    _assert_same_time(actual.retired_at, expected.retired_at, "chart retired_at")


def _assert_same_execution(actual: ExecutionRecord | None, expected: ExecutionRecord) -> None:
    assert actual is not None, f"execution {expected.id!r}: expected a record, got None"
    for name in ("id", "content_hash", "status", "position", "outcome", "failure", "final_state"):
        got, want = getattr(actual, name), getattr(expected, name)
        assert got == want, f"execution {expected.id!r} {name}: expected {want!r}, got {got!r}"
    assert dict(actual.metadata) == dict(expected.metadata), (
        f"execution {expected.id!r} metadata: expected {dict(expected.metadata)!r}, "
        f"got {dict(actual.metadata)!r}"
    )
    for name in ("created_at", "updated_at", "ended_at", "last_error_at"):
        _assert_same_time(getattr(actual, name), getattr(expected, name), f"execution {name}")
    assert actual.error_count == expected.error_count, (
        f"execution {expected.id!r} error_count: expected {expected.error_count!r}, "
        f"got {actual.error_count!r}"
    )


def _error(
    execution_id: str = "exec-1",
    name: str = "error.execution",
    *,
    seq: int | None = None,
    via: str = "step",
    taken: bool = False,
    error: bytes = b'{"message": "boom"}',
    recorded_at: datetime = _BASE,
) -> ErrorRecord:
    return ErrorRecord(
        execution_id,
        seq=seq,
        via=via,
        name=name,
        taken=taken,
        error=error,
        recorded_at=recorded_at,
    )


def _assert_same_errors(actual: list[ErrorRecord], expected: list[ErrorRecord]) -> None:
    def fields(record: ErrorRecord) -> tuple[object, ...]:
        return (record.execution_id, record.seq, record.via, record.name, record.taken)

    assert [fields(r) for r in actual] == [fields(r) for r in expected]
    for got, want in zip(actual, expected, strict=True):
        assert got.error == want.error, f"error bytes: expected {want.error!r}, got {got.error!r}"
        _assert_same_time(got.recorded_at, want.recorded_at, "error recorded_at")


def _assert_same_position(actual: PositionRecord | None, expected: PositionRecord) -> None:
    assert actual is not None, f"position {expected.key!r}: expected a record, got None"
    for name in ("key", "content_hash", "position"):
        got, want = getattr(actual, name), getattr(expected, name)
        assert got == want, f"position {expected.key!r} {name}: expected {want!r}, got {got!r}"
    _assert_same_time(actual.saved_at, expected.saved_at, "position saved_at")


def _assert_same_log(actual: list[InputRecord], expected: list[InputRecord]) -> None:
    assert [(r.execution_id, r.seq, r.via, r.event) for r in actual] == [
        (r.execution_id, r.seq, r.via, r.event) for r in expected
    ], f"input log: expected {expected!r}, got {actual!r}"
    for got, want in zip(actual, expected, strict=True):
        _assert_same_time(got.recorded_at, want.recorded_at, f"input {want.seq} recorded_at")


def _nonzero(counts: Mapping[Status, int]) -> dict[Status, int]:
    return {status: count for status, count in counts.items() if count}


async def _insert(adapter: Adapter, record: ExecutionRecord) -> None:
    """Insert ``record`` as the facade does, with its chart saved first (so a store may
    tie an execution to its chart)."""
    await adapter.save_chart(_chart(record.content_hash))
    await adapter.insert_execution(record)


# Lock helpers: small coroutines, so that each ``pytest.raises`` holds one await.


async def _enter(adapter: Adapter, execution_id: str, wait: float | None) -> None:
    async with adapter.exclusive(execution_id, wait):
        pass


class _BoomError(Exception):
    """Raised inside a block to see what the adapter does with it."""


async def _raise_inside(adapter: Adapter, execution_id: str, record: ExecutionRecord) -> None:
    async with adapter.exclusive(execution_id, _PATIENCE):
        await _insert(adapter, record)
        raise _BoomError


class _Holder:
    """A task that holds an execution's lock until told to let go."""

    def __init__(self, adapter: Adapter, execution_id: str) -> None:
        self.entered = asyncio.Event()
        self._release = asyncio.Event()
        self.task = asyncio.create_task(self._hold(adapter, execution_id))

    async def _hold(self, adapter: Adapter, execution_id: str) -> None:
        async with adapter.exclusive(execution_id, _PATIENCE):
            self.entered.set()
            await self._release.wait()

    async def wait_entered(self) -> None:
        async with asyncio.timeout(_PATIENCE):
            await self.entered.wait()

    async def release(self) -> None:
        self._release.set()
        async with asyncio.timeout(_PATIENCE):
            await self.task


class _AdapterSuite:
    """What every conformance class shares: the adapter under test and helpers.

    Override :meth:`make_adapter` (and :meth:`close_adapter` if the adapter holds
    resources). Each test method gets its own adapter, which must start over an empty
    store: the checks count and list what they stored and nothing else. Settings a
    subclass may need (a database URL, say) can come from an autouse fixture of the
    subclass that stores them on ``self``; pytest runs it before :meth:`adapter`.
    """

    async def make_adapter(self) -> Adapter:
        """A fresh adapter over an empty store."""
        raise NotImplementedError("override make_adapter to answer the adapter under test")

    async def close_adapter(self, adapter: Adapter) -> None:
        """Release what :meth:`make_adapter` acquired (nothing by default)."""

    @pytest_asyncio.fixture
    async def adapter(self) -> AsyncIterator[Adapter]:
        """The adapter under test, closed after the test."""
        adapter = await self.make_adapter()
        try:
            yield adapter
        finally:
            await self.close_adapter(adapter)

    # Helpers the checks share.

    async def _insert_tagged(self, adapter: Adapter, tags: Mapping[str, Mapping[str, str]]) -> None:
        for execution_id, metadata in tags.items():
            await _insert(adapter, _execution(execution_id, metadata=metadata))

    async def _listed(self, adapter: Adapter, pairs: Mapping[str, str]) -> set[str]:
        records = await adapter.list_by_metadata(pairs)
        ids = [record.id for record in records]
        assert len(ids) == len(set(ids)), f"listed an execution twice: {ids!r}"
        return set(ids)

    async def _insert_for_prune(self, adapter: Adapter) -> dict[str, ExecutionRecord]:
        cutoff = _at(60)
        records = {
            "old-completed": _ended("old-completed", cutoff - timedelta(days=3)),
            "old-failed": _ended(
                "old-failed",
                (cutoff - timedelta(microseconds=1)).astimezone(_INDIA),
                status=Status.FAILED,
                failure="failed_final",
            ),
            "at-cutoff": _ended("at-cutoff", cutoff),
            "recent": _ended("recent", cutoff + timedelta(minutes=1)),
            "running": _execution("running", updated_at=cutoff - timedelta(days=3)),
            "already-pruned": _ended("already-pruned", cutoff - timedelta(days=5), position=None),
        }
        if adapter.capabilities.metadata:
            records["old-completed"] = replace(records["old-completed"], metadata={"t": "1"})
        for record in records.values():
            await _insert(adapter, record)
            if adapter.capabilities.input_log and record.position is not None:
                await adapter.append_input(record.id, "step", b"[1]", _at(0), None)
        return records


class AdapterConformance(_AdapterSuite):
    """The required operations: charts, executions, saved positions, prune."""

    @pytest.mark.asyncio
    async def test_capabilities_are_declared(self, adapter: Adapter) -> None:
        declared = adapter.capabilities
        assert isinstance(declared, Capabilities)
        assert adapter.capabilities == declared, "capabilities changed between two reads"

    @pytest.mark.asyncio
    async def test_chart_save_and_fetch_round_trip(self, adapter: Adapter) -> None:
        chart = _chart(source="<scxml name='pay'>é</scxml>".encode(), saved_at=_at(1))
        bare = _chart(_HASH_B, name=None, version=None, saved_at=_at(2).astimezone(_INDIA))
        _assert_same_chart(await adapter.save_chart(chart), chart)
        _assert_same_chart(await adapter.save_chart(bare), bare)
        _assert_same_chart(await adapter.fetch_chart(_HASH_A), chart)
        _assert_same_chart(await adapter.fetch_chart(_HASH_B), bare)

    @pytest.mark.asyncio
    async def test_chart_fetch_of_a_missing_hash_answers_none(self, adapter: Adapter) -> None:
        assert await adapter.fetch_chart(_HASH_A) is None
        await adapter.save_chart(_chart())
        assert await adapter.fetch_chart(_HASH_B) is None

    @pytest.mark.asyncio
    async def test_chart_first_save_wins(self, adapter: Adapter) -> None:
        first = _chart(source=b"<scxml>first</scxml>")
        second = _chart(source=b"<scxml>second</scxml>", name="other", saved_at=_at(5))
        await adapter.save_chart(first)
        _assert_same_chart(await adapter.save_chart(second), first)
        _assert_same_chart(await adapter.fetch_chart(_HASH_A), first)

    @pytest.mark.asyncio
    async def test_execution_round_trips_every_field(self, adapter: Adapter) -> None:
        metadata = {"tenant_id": "acct_01H8X", "processor_account_id": "pacct_4471"}
        if not adapter.capabilities.metadata:
            metadata = {}
        record = ExecutionRecord(
            id="exec-ünïcode 'quoted' \"id\"",
            content_hash=_HASH_A,
            status=Status.FAILED,
            position=_BLOB,
            metadata=metadata,
            outcome=b'{"reason": "declined", "code": 51}',
            failure="failed_final",
            created_at=_at(1),
            updated_at=_at(2).astimezone(_INDIA),
            ended_at=_at(3),
            error_count=7,
            last_error_at=_at(2).astimezone(_INDIA),
            final_state="declined",
        )
        await _insert(adapter, record)
        _assert_same_execution(await adapter.fetch_execution(record.id), record)

    @pytest.mark.asyncio
    async def test_execution_update_keeps_its_error_count_and_final_state(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution())
        counted = replace(_execution(updated_at=_at(1)), error_count=3, last_error_at=_at(1))
        await adapter.update_execution(counted)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), counted)
        ended = replace(_ended("exec-1", _at(2)), error_count=3, final_state="settled")
        await adapter.update_execution(ended)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), ended)

    @pytest.mark.asyncio
    async def test_execution_round_trips_a_running_record(self, adapter: Adapter) -> None:
        record = _execution()
        await _insert(adapter, record)
        fetched = await adapter.fetch_execution("exec-1")
        _assert_same_execution(fetched, record)

    @pytest.mark.asyncio
    async def test_execution_round_trips_without_a_position(self, adapter: Adapter) -> None:
        # Markers of a closed fan-out are ended executions that never had a position.
        record = _ended("exec-1", _at(2), position=None)
        await _insert(adapter, record)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), record)

    @pytest.mark.asyncio
    async def test_execution_round_trips_a_large_position(self, adapter: Adapter) -> None:
        large = bytes(range(256)) * 1024
        record = _execution(position=large)
        await _insert(adapter, record)
        await adapter.update_execution(_execution(position=large[::-1]))
        _assert_same_execution(
            await adapter.fetch_execution("exec-1"), replace(record, position=large[::-1])
        )

    @pytest.mark.asyncio
    async def test_execution_round_trips_every_status(self, adapter: Adapter) -> None:
        for status in Status:
            await _insert(adapter, _execution(f"exec-{status.value}", status=status))
        for status in Status:
            fetched = await adapter.fetch_execution(f"exec-{status.value}")
            assert fetched is not None
            assert fetched.status is status, f"expected {status}, got {fetched.status!r}"

    @pytest.mark.asyncio
    async def test_execution_fetch_of_a_missing_id_answers_none(self, adapter: Adapter) -> None:
        assert await adapter.fetch_execution("exec-1") is None
        await _insert(adapter, _execution())
        assert await adapter.fetch_execution("exec-2") is None
        assert await adapter.fetch_execution("EXEC-1") is None

    @pytest.mark.asyncio
    async def test_execution_fetch_of_many_answers_those_that_exist(self, adapter: Adapter) -> None:
        quoted = "exec-'quoted' \"id\" ünï"
        records = [_execution("exec-1"), _ended("exec-2", _at(2)), _execution(quoted)]
        for record in records:
            await _insert(adapter, record)
        asked = ["exec-2", "exec-missing", quoted, "exec-1", "EXEC-1"]
        fetched = {record.id: record for record in await adapter.fetch_executions(asked)}
        assert sorted(fetched) == sorted(record.id for record in records)
        for record in records:
            _assert_same_execution(fetched[record.id], record)
        assert await adapter.fetch_executions([]) == []

    @pytest.mark.asyncio
    async def test_execution_insert_refuses_an_existing_id(self, adapter: Adapter) -> None:
        first = _execution()
        await _insert(adapter, first)
        await adapter.save_chart(_chart(_HASH_B))
        with pytest.raises(ExecutionExists) as refused:
            await adapter.insert_execution(_execution(content_hash=_HASH_B, position=b"other"))
        assert refused.value.execution_id == "exec-1"
        _assert_same_execution(await adapter.fetch_execution("exec-1"), first)

    @pytest.mark.asyncio
    async def test_execution_update_overwrites_the_documented_fields(
        self, adapter: Adapter
    ) -> None:
        metadata = {"tenant_id": "t1"} if adapter.capabilities.metadata else {}
        stored = _execution(metadata=metadata)
        await _insert(adapter, stored)
        update = ExecutionRecord(
            id="exec-1",
            # The id, chart, metadata and created_at of the update are ignored.
            content_hash=_HASH_B,
            metadata={"tenant_id": "t2", "extra": "x"},
            created_at=_at(-60),
            status=Status.FAILED,
            position=b"later position",
            outcome=b'{"why": "timeout"}',
            failure="round_budget",
            updated_at=_at(7),
            ended_at=_at(7),
        )
        await adapter.update_execution(update)
        expected = replace(update, content_hash=_HASH_A, metadata=metadata, created_at=_BASE)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), expected)

    @pytest.mark.asyncio
    async def test_execution_update_can_clear_fields(self, adapter: Adapter) -> None:
        stored = _ended("exec-1", _at(5), failure="failed_final", status=Status.FAILED)
        await _insert(adapter, stored)
        # Back to active with nothing ended: every overwritten field may become None.
        update = replace(
            stored, status=Status.ACTIVE, position=None, outcome=None, failure=None, ended_at=None
        )
        await adapter.update_execution(update)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), update)

    @pytest.mark.asyncio
    async def test_execution_update_writes_each_column_it_changes(self, adapter: Adapter) -> None:
        # A store may write a step that changes only the position some cheaper way:
        # every column an update changes, alone or with others, must still land.
        cases: list[dict[str, Any]] = [
            {},
            {"status": Status.COMPLETED},
            {"outcome": b'{"done": true}'},
            {"failure": "round_budget"},
            {"ended_at": _at(9)},
            {"error_count": 3},
            {"last_error_at": _at(8)},
            {"final_state": "done"},
            {"outcome": None, "failure": None, "error_count": 0, "last_error_at": None},
        ]
        for number, changed in enumerate(cases):
            stored = replace(
                _execution(f"exec-{number}", outcome=b"{}", failure="earlier"),
                error_count=1,
                last_error_at=_at(2),
                final_state="earlier",
            )
            await _insert(adapter, stored)
            update = replace(stored, position=b"next position", updated_at=_at(10), **changed)
            await adapter.update_execution(update)
            _assert_same_execution(await adapter.fetch_execution(stored.id), update)
            again = replace(update, position=b"after that", updated_at=_at(11))
            await adapter.update_execution(again)
            _assert_same_execution(await adapter.fetch_execution(stored.id), again)

    @pytest.mark.asyncio
    async def test_execution_update_touches_only_its_id(self, adapter: Adapter) -> None:
        other = _execution("exec-2")
        await _insert(adapter, _execution())
        await _insert(adapter, other)
        await adapter.update_execution(_execution(status=Status.CANCELLED, ended_at=_at(3)))
        _assert_same_execution(await adapter.fetch_execution("exec-2"), other)

    @pytest.mark.asyncio
    async def test_execution_update_of_a_missing_id_refuses(self, adapter: Adapter) -> None:
        with pytest.raises(ExecutionNotFound) as refused:
            await adapter.update_execution(_execution("exec-9"))
        assert refused.value.execution_id == "exec-9"
        assert await adapter.fetch_execution("exec-9") is None

    @pytest.mark.asyncio
    async def test_execution_rechart_moves_it_while_on_the_old_chart(
        self, adapter: Adapter
    ) -> None:
        metadata = {"tenant_id": "t1"} if adapter.capabilities.metadata else {}
        stored = _execution(status=Status.NEEDS_MIGRATION, failure="parked", metadata=metadata)
        other = _execution("exec-2")
        await _insert(adapter, stored)
        await _insert(adapter, other)
        await adapter.save_chart(_chart(_HASH_B))
        moved = replace(
            stored,
            content_hash=_HASH_B,
            status=Status.ACTIVE,
            position=b"carried \xff position",
            failure=None,
            updated_at=_at(9),
        )
        assert await adapter.rechart_execution(moved, _HASH_A) is True
        _assert_same_execution(await adapter.fetch_execution("exec-1"), moved)
        _assert_same_execution(await adapter.fetch_execution("exec-2"), other)
        # The guard: no longer on the old chart, it is not written again.
        assert await adapter.rechart_execution(replace(moved, position=b"x"), _HASH_A) is False
        _assert_same_execution(await adapter.fetch_execution("exec-1"), moved)
        assert await adapter.rechart_execution(_execution("exec-9"), _HASH_A) is False
        assert await adapter.fetch_execution("exec-9") is None

    @pytest.mark.asyncio
    async def test_execution_counts_by_status(self, adapter: Adapter) -> None:
        assert _nonzero(await adapter.count_executions_on(_HASH_A)) == {}
        statuses = [Status.ACTIVE, Status.ACTIVE, Status.COMPLETED, Status.NEEDS_MIGRATION]
        for number, status in enumerate(statuses):
            await _insert(adapter, _execution(f"exec-{number}", status=status))
        await _insert(adapter, _execution("exec-b", _HASH_B, status=Status.FAILED))
        expected = {Status.ACTIVE: 2, Status.COMPLETED: 1, Status.NEEDS_MIGRATION: 1}
        assert _nonzero(await adapter.count_executions_on(_HASH_A)) == expected
        assert _nonzero(await adapter.count_executions_on(_HASH_B)) == {Status.FAILED: 1}
        await adapter.update_execution(_execution("exec-0", status=Status.CANCELLED))
        expected = {
            Status.ACTIVE: 1,
            Status.COMPLETED: 1,
            Status.NEEDS_MIGRATION: 1,
            Status.CANCELLED: 1,
        }
        assert _nonzero(await adapter.count_executions_on(_HASH_A)) == expected

    @pytest.mark.asyncio
    async def test_execution_pinning_lists_active_parked_and_paused(self, adapter: Adapter) -> None:
        assert await adapter.pinning_executions(_HASH_A) == []
        for status in Status:
            await _insert(adapter, _execution(f"exec-{status.value}", status=status))
        await _insert(adapter, _execution("exec-b", _HASH_B))
        pinning = await adapter.pinning_executions(_HASH_A)
        assert sorted(pinning) == ["exec-active", "exec-needs_migration", "exec-paused"], pinning
        await adapter.update_execution(_execution("exec-active", status=Status.COMPLETED))
        await adapter.update_execution(_execution("exec-paused", status=Status.CANCELLED))
        assert await adapter.pinning_executions(_HASH_A) == ["exec-needs_migration"]
        assert await adapter.pinning_executions(_HASH_B) == ["exec-b"]

    # Listing by metadata.

    @pytest.mark.asyncio
    async def test_position_save_fetch_and_replace(self, adapter: Adapter) -> None:
        first = PositionRecord(
            "session-1", content_hash=_HASH_A, position=_BLOB, saved_at=_at(1).astimezone(_INDIA)
        )
        await adapter.save_position(first)
        _assert_same_position(await adapter.fetch_position("session-1"), first)
        second = PositionRecord(
            "session-1", content_hash=_HASH_B, position=b"next", saved_at=_at(2)
        )
        await adapter.save_position(second)
        _assert_same_position(await adapter.fetch_position("session-1"), second)

    @pytest.mark.asyncio
    async def test_position_fetch_of_a_missing_key_answers_none(self, adapter: Adapter) -> None:
        assert await adapter.fetch_position("session-1") is None
        await adapter.save_position(
            PositionRecord("session-1", content_hash=_HASH_A, position=_BLOB, saved_at=_at(1))
        )
        assert await adapter.fetch_position("session-2") is None

    @pytest.mark.asyncio
    async def test_position_delete_answers_whether_there_was_one(self, adapter: Adapter) -> None:
        kept = PositionRecord("session-2", content_hash=_HASH_A, position=b"kept", saved_at=_at(1))
        await adapter.save_position(
            PositionRecord("session-1", content_hash=_HASH_A, position=_BLOB, saved_at=_at(1))
        )
        await adapter.save_position(kept)
        assert await adapter.delete_position("session-1") is True
        assert await adapter.fetch_position("session-1") is None
        assert await adapter.delete_position("session-1") is False
        assert await adapter.delete_position("never") is False
        _assert_same_position(await adapter.fetch_position("session-2"), kept)

    @pytest.mark.asyncio
    async def test_position_counts_by_chart(self, adapter: Adapter) -> None:
        assert await adapter.count_positions_on(_HASH_A) == 0
        for key in ("s1", "s2", "s3"):
            await adapter.save_position(
                PositionRecord(key, content_hash=_HASH_A, position=_BLOB, saved_at=_at(1))
            )
        await adapter.save_position(
            PositionRecord("s4", content_hash=_HASH_B, position=_BLOB, saved_at=_at(1))
        )
        assert await adapter.count_positions_on(_HASH_A) == 3
        assert await adapter.count_positions_on(_HASH_B) == 1
        await adapter.save_position(
            PositionRecord("s1", content_hash=_HASH_B, position=_BLOB, saved_at=_at(2))
        )
        await adapter.delete_position("s2")
        assert await adapter.count_positions_on(_HASH_A) == 1
        assert await adapter.count_positions_on(_HASH_B) == 2

    @pytest.mark.asyncio
    async def test_positions_are_apart_from_executions(self, adapter: Adapter) -> None:
        # An execution's position is a field of its record, not a saved position.
        await _insert(adapter, _execution("shared-id"))
        assert await adapter.fetch_position("shared-id") is None
        assert await adapter.count_positions_on(_HASH_A) == 0
        saved = PositionRecord(
            "shared-id", content_hash=_HASH_B, position=b"saved", saved_at=_at(1)
        )
        await adapter.save_position(saved)
        _assert_same_execution(await adapter.fetch_execution("shared-id"), _execution("shared-id"))
        assert await adapter.delete_position("shared-id") is True
        _assert_same_execution(await adapter.fetch_execution("shared-id"), _execution("shared-id"))

    @pytest.mark.asyncio
    async def test_prune_clears_only_what_ended_before_the_cutoff(self, adapter: Adapter) -> None:
        records = await self._insert_for_prune(adapter)
        kept = PositionRecord(
            "old-completed", content_hash=_HASH_A, position=b"saved", saved_at=_at(0)
        )
        await adapter.save_position(kept)
        pruned = await adapter.prune(_at(60).astimezone(_INDIA), 100)
        assert sorted(pruned) == ["old-completed", "old-failed"]
        for execution_id, record in records.items():
            fetched = await adapter.fetch_execution(execution_id)
            if execution_id in pruned:
                # The row stays, with its status, answer and ended_at; only the position goes.
                _assert_same_execution(fetched, replace(record, position=None))
            else:
                _assert_same_execution(fetched, record)
            if adapter.capabilities.input_log:
                log = await adapter.inputs(execution_id)
                emptied = execution_id in pruned or record.position is None
                assert len(log) == (0 if emptied else 1), (execution_id, log)
        # Saved positions are the host's, not the executions': prune leaves them.
        _assert_same_position(await adapter.fetch_position("old-completed"), kept)
        counts = {Status.COMPLETED: 4, Status.FAILED: 1, Status.ACTIVE: 1}
        assert _nonzero(await adapter.count_executions_on(_HASH_A)) == counts

    @pytest.mark.asyncio
    async def test_prune_is_idempotent(self, adapter: Adapter) -> None:
        await self._insert_for_prune(adapter)
        assert len(await adapter.prune(_at(60), 100)) == 2
        assert await adapter.prune(_at(60), 100) == []

    @pytest.mark.asyncio
    async def test_prune_respects_its_limit(self, adapter: Adapter) -> None:
        eligible = {f"old-{n}" for n in range(5)}
        for n, execution_id in enumerate(sorted(eligible)):
            await _insert(adapter, _ended(execution_id, _at(n)))
        await _insert(adapter, _ended("recent", _at(90)))
        assert await adapter.prune(_at(60), 0) == []
        batches = [await adapter.prune(_at(60), 2) for _ in range(4)]
        assert [len(batch) for batch in batches] == [2, 2, 1, 0], batches
        pruned = [execution_id for batch in batches for execution_id in batch]
        assert sorted(pruned) == sorted(eligible)
        recent = await adapter.fetch_execution("recent")
        assert recent is not None
        assert recent.position is not None


class ChartRetirementConformance(_AdapterSuite):
    """``retire_chart``, for an adapter declaring ``chart_retirement``."""

    @pytest.mark.asyncio
    async def test_chart_retirement_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.chart_retirement, (
            "these checks are for an adapter declaring chart_retirement"
        )

    @pytest.mark.asyncio
    async def test_chart_retire_leaves_a_tombstone(self, adapter: Adapter) -> None:
        chart = _chart()
        await adapter.save_chart(chart)
        tombstone = replace(chart, source=None, retired_by="ops@example.test", retired_at=_at(9))
        answer = await adapter.retire_chart(_HASH_A, "ops@example.test", _at(9))
        _assert_same_chart(answer, tombstone)
        _assert_same_chart(await adapter.fetch_chart(_HASH_A), tombstone)

    @pytest.mark.asyncio
    async def test_chart_retire_of_a_missing_hash_answers_none(self, adapter: Adapter) -> None:
        assert await adapter.retire_chart(_HASH_A, "ops", _at(9)) is None
        assert await adapter.fetch_chart(_HASH_A) is None

    @pytest.mark.asyncio
    async def test_chart_retire_twice_answers_the_first_tombstone(self, adapter: Adapter) -> None:
        chart = _chart()
        await adapter.save_chart(chart)
        await adapter.retire_chart(_HASH_A, "first", _at(9))
        tombstone = replace(chart, source=None, retired_by="first", retired_at=_at(9))
        _assert_same_chart(await adapter.retire_chart(_HASH_A, "second", _at(20)), tombstone)
        _assert_same_chart(await adapter.fetch_chart(_HASH_A), tombstone)

    @pytest.mark.asyncio
    async def test_chart_save_after_retire_answers_the_tombstone(self, adapter: Adapter) -> None:
        chart = _chart()
        await adapter.save_chart(chart)
        await adapter.retire_chart(_HASH_A, "ops", _at(9))
        tombstone = replace(chart, source=None, retired_by="ops", retired_at=_at(9))
        _assert_same_chart(await adapter.save_chart(chart), tombstone)
        _assert_same_chart(await adapter.fetch_chart(_HASH_A), tombstone)

    @pytest.mark.asyncio
    async def test_chart_retire_touches_only_its_hash(self, adapter: Adapter) -> None:
        other = _chart(_HASH_B)
        await adapter.save_chart(_chart())
        await adapter.save_chart(other)
        await adapter.retire_chart(_HASH_A, "ops", _at(9))
        _assert_same_chart(await adapter.fetch_chart(_HASH_B), other)

    @pytest.mark.asyncio
    async def test_chart_retire_refuses_while_an_execution_pins_it(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution("running"))
        await _insert(adapter, _execution("parked", status=Status.NEEDS_MIGRATION))
        await _insert(adapter, _ended("finished", _at(3)))
        with pytest.raises(Pinned) as refused:
            await adapter.retire_chart(_HASH_A, "ops", _at(9))
        assert refused.value.counts == {"executions_active": 1, "executions_needs_migration": 1}
        chart = await adapter.fetch_chart(_HASH_A)
        assert chart is not None
        assert chart.retired_at is None, "a refused retirement retired"

    @pytest.mark.asyncio
    async def test_chart_retire_refuses_while_a_position_pins_it(self, adapter: Adapter) -> None:
        await adapter.save_chart(_chart())
        await adapter.save_position(
            PositionRecord("k", content_hash=_HASH_A, position=_BLOB, saved_at=_BASE)
        )
        with pytest.raises(Pinned) as refused:
            await adapter.retire_chart(_HASH_A, "ops", _at(9))
        assert refused.value.counts == {"positions": 1}

    @pytest.mark.asyncio
    async def test_insert_on_a_retired_chart_is_refused(self, adapter: Adapter) -> None:
        await adapter.save_chart(_chart())
        await adapter.retire_chart(_HASH_A, "ops", _at(9))
        with pytest.raises(ChartRetired):
            await adapter.insert_execution(_execution())
        assert await adapter.fetch_execution("exec-1") is None


class AnswersConformance(_AdapterSuite):
    """Durable children's answers and fan-out ends, for an adapter declaring
    ``answers``."""

    @pytest.mark.asyncio
    async def test_answers_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.answers, "these checks are for an adapter declaring answers"

    @pytest.mark.asyncio
    async def test_answers_round_trip_every_field(self, adapter: Adapter) -> None:
        for answer in (
            _answer("c-done"),
            _answer("c-failed", status=Status.FAILED),
            _answer("c-cancelled", status=Status.CANCELLED, delivered_at=_at(2)),
        ):
            await adapter.insert_answer(answer)
            _assert_same_answer(await adapter.fetch_answer(answer.child_id), answer)
        assert await adapter.fetch_answer("c-missing") is None

    @pytest.mark.asyncio
    async def test_answers_the_first_one_for_a_child_stays(self, adapter: Adapter) -> None:
        first = _answer("c-1")
        await adapter.insert_answer(first)
        await adapter.insert_answer(_answer("c-1", "parent-2", status=Status.FAILED))
        _assert_same_answer(await adapter.fetch_answer("c-1"), first)

    @pytest.mark.asyncio
    async def test_answers_undelivered_oldest_first_within_the_limit(
        self, adapter: Adapter
    ) -> None:
        await adapter.insert_answer(_answer("c-late", created_at=_at(5)))
        await adapter.insert_answer(_answer("c-early", created_at=_at(1)))
        await adapter.insert_answer(_answer("c-taken", created_at=_at(0), delivered_at=_at(1)))
        await adapter.insert_answer(_answer("c-middle", created_at=_at(3)))
        owed = await adapter.undelivered_answers(10)
        assert [a.child_id for a in owed] == ["c-early", "c-middle", "c-late"]
        assert [a.child_id for a in await adapter.undelivered_answers(2)] == ["c-early", "c-middle"]

    @pytest.mark.asyncio
    async def test_answers_to_a_waiting_parent_are_left_out_until_it_takes_them(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution("parked", status=Status.NEEDS_MIGRATION))
        await _insert(adapter, _execution("paused", status=Status.PAUSED))
        await _insert(adapter, _execution("taking"))
        await adapter.insert_answer(_answer("c-parked", "parked", created_at=_at(1)))
        await adapter.insert_answer(_answer("c-paused", "paused", created_at=_at(2)))
        await adapter.insert_answer(_answer("c-taking", "taking", created_at=_at(3)))
        await adapter.insert_answer(_answer("c-gone", "gone", created_at=_at(4)))
        owed = await adapter.undelivered_answers(2)
        assert [a.child_id for a in owed] == ["c-taking", "c-gone"]
        await adapter.update_execution(_execution("paused"))
        owed = await adapter.undelivered_answers(10)
        assert [a.child_id for a in owed] == ["c-paused", "c-taking", "c-gone"]

    @pytest.mark.asyncio
    async def test_answers_marked_delivered_keep_their_first_time(self, adapter: Adapter) -> None:
        await adapter.insert_answer(_answer("c-1"))
        await adapter.insert_answer(_answer("c-2"))
        await adapter.mark_delivered(["c-1", "c-none"], _at(4))
        await adapter.mark_delivered(["c-1"], _at(8))
        _assert_same_answer(await adapter.fetch_answer("c-1"), _answer("c-1", delivered_at=_at(4)))
        assert [a.child_id for a in await adapter.undelivered_answers(10)] == ["c-2"]

    @pytest.mark.asyncio
    async def test_answers_a_fan_out_end_is_taken_once(self, adapter: Adapter) -> None:
        assert not await adapter.fan_out_ended("parent-1", "each")
        assert await adapter.take_fan_out_end("parent-1", "each", _at(1))
        assert not await adapter.take_fan_out_end("parent-1", "each", _at(2))
        assert await adapter.fan_out_ended("parent-1", "each")
        assert not await adapter.fan_out_ended("parent-1", "other")
        assert not await adapter.fan_out_ended("parent-2", "each")

    @pytest.mark.asyncio
    async def test_answers_fan_out_ends_are_not_executions(self, adapter: Adapter) -> None:
        await adapter.take_fan_out_end("parent-1", "each", _at(1))
        assert await adapter.fetch_execution("parent-1") is None
        assert _nonzero(await adapter.count_executions_on(_HASH_A)) == {}

    @pytest.mark.asyncio
    async def test_answers_linked_children_count_while_the_parent_runs(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution("parent-1"))
        await _insert(adapter, _ended("parent-2", _at(3)))
        await adapter.save_chart(_chart(_HASH_B))
        await adapter.insert_answer(_answer("c-1", "parent-1"))
        await adapter.insert_answer(_answer("c-2", "parent-1", delivered_at=_at(4)))
        await adapter.insert_answer(_answer("c-3", "parent-2"))
        await adapter.insert_answer(_answer("c-4", "parent-gone"))
        assert await adapter.count_linked_children_on(_HASH_B) == 2
        assert await adapter.count_linked_children_on(_HASH_A) == 0


class MetadataConformance(_AdapterSuite):
    """Metadata kept and listed, for an adapter declaring ``metadata``."""

    @pytest.mark.asyncio
    async def test_metadata_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.metadata, "these checks are for an adapter declaring metadata"

    @pytest.mark.asyncio
    async def test_metadata_lists_by_equality_on_all_pairs(self, adapter: Adapter) -> None:
        await self._insert_tagged(
            adapter,
            {
                "a1": {"tenant": "a", "account": "1"},
                "a2": {"tenant": "a", "account": "2", "region": "eu"},
                "b1": {"tenant": "b", "account": "1"},
                "ab": {"tenant": "ab", "account": "1"},
                "none": {},
            },
        )
        assert await self._listed(adapter, {"tenant": "a"}) == {"a1", "a2"}
        assert await self._listed(adapter, {"tenant": "a", "account": "1"}) == {"a1"}
        assert await self._listed(adapter, {"account": "1"}) == {"a1", "b1", "ab"}
        assert await self._listed(adapter, {"account": "2", "region": "eu"}) == {"a2"}
        assert await self._listed(adapter, {"tenant": "a", "missing": "x"}) == set()
        assert await self._listed(adapter, {"tenant": "c"}) == set()
        assert await self._listed(adapter, {"tenant": "A"}) == set()
        assert await self._listed(adapter, {"tenan": "a"}) == set()
        assert await self._listed(adapter, {"tenant": ""}) == set()

    @pytest.mark.asyncio
    async def test_metadata_listing_answers_whole_records(self, adapter: Adapter) -> None:
        record = _ended("exec-1", _at(4), metadata={"tenant": "a", "parent": "p-1"})
        await _insert(adapter, record)
        listed = await adapter.list_by_metadata({"parent": "p-1"})
        assert len(listed) == 1, f"expected one record, got {listed!r}"
        _assert_same_execution(listed[0], record)

    @pytest.mark.asyncio
    async def test_metadata_with_awkward_keys_and_values(self, adapter: Adapter) -> None:
        awkward = {
            "quote'key": "it's",
            'double"key': 'say "hi"',
            "dotted.key": "a.b.c",
            "$.path[0]": "$[0]",
            "back\\slash": "c:\\dir",
            "like%_": "50%_off",
            "ключ": "значение 🙂",
            "spaced key": " padded ",
            "blank": "",
            "number": "123",
            "truth": "true",
            "nothing": "null",
            "json": '{"a": [1]}',
        }
        await self._insert_tagged(adapter, {"odd": awkward, "plain": {"tenant": "a"}})
        fetched = await adapter.fetch_execution("odd")
        assert fetched is not None
        assert dict(fetched.metadata) == awkward
        for key, value in awkward.items():
            assert await self._listed(adapter, {key: value}) == {"odd"}, (key, value)
        assert await self._listed(adapter, awkward) == {"odd"}
        assert await adapter.statuses_by_metadata(awkward) == {"odd": Status.ACTIVE}
        # Near misses match nothing.
        for pairs in (
            {"number": "0123"},
            {"truth": "True"},
            {"blank": " "},
            {"dotted": "a"},
            {"dotted.key": "a"},
            {"like%_": "50"},
            {"like%": "50%_off"},
        ):
            assert await self._listed(adapter, pairs) == set(), pairs

    @pytest.mark.asyncio
    async def test_metadata_empty_pairs_list_every_execution(self, adapter: Adapter) -> None:
        assert await self._listed(adapter, {}) == set()
        await self._insert_tagged(adapter, {"tagged": {"tenant": "a"}, "untagged": {}})
        assert await self._listed(adapter, {}) == {"tagged", "untagged"}
        expected = {"tagged": Status.ACTIVE, "untagged": Status.ACTIVE}
        assert await adapter.statuses_by_metadata({}) == expected

    @pytest.mark.asyncio
    async def test_metadata_statuses_by_metadata(self, adapter: Adapter) -> None:
        await self._insert_tagged(
            adapter,
            {
                "child-1": {"parent": "p"},
                "child-2": {"parent": "p", "slot": "2"},
                "child-3": {"parent": "p"},
                "stranger": {"parent": "q"},
            },
        )
        await adapter.update_execution(
            _execution("child-2", status=Status.FAILED, ended_at=_at(3), failure="x")
        )
        await adapter.update_execution(_execution("child-3", status=Status.COMPLETED))
        assert await adapter.statuses_by_metadata({"parent": "p"}) == {
            "child-1": Status.ACTIVE,
            "child-2": Status.FAILED,
            "child-3": Status.COMPLETED,
        }
        assert await adapter.statuses_by_metadata({"parent": "p", "slot": "2"}) == {
            "child-2": Status.FAILED
        }
        assert await adapter.statuses_by_metadata({"parent": "z"}) == {}

    @pytest.mark.asyncio
    async def test_metadata_finds_a_parents_durable_children(self, adapter: Adapter) -> None:
        # The keys the durable driver files a child under: a parent's children are
        # looked up by them when it is cancelled (an index serves it on SQL).
        parent, invoke = "statifier.parent", "statifier.invoke"
        await self._insert_tagged(
            adapter,
            {
                "p/a": {parent: "p", invoke: "a"},
                "p/b": {parent: "p", invoke: "b", "tenant": "t"},
                "q/a": {parent: "q", invoke: "a"},
                "p-named": {"parent": "p", invoke: "a"},
                "orphan": {invoke: "a"},
            },
        )
        assert await self._listed(adapter, {parent: "p"}) == {"p/a", "p/b"}
        assert await self._listed(adapter, {parent: "p", invoke: "a"}) == {"p/a"}
        assert await self._listed(adapter, {invoke: "a", parent: "q"}) == {"q/a"}
        assert await self._listed(adapter, {parent: "p", "tenant": "t"}) == {"p/b"}
        assert await self._listed(adapter, {parent: "p", "tenant": "u"}) == set()
        assert await self._listed(adapter, {parent: "z"}) == set()
        assert await self._listed(adapter, {invoke: "a"}) == {"p/a", "q/a", "p-named", "orphan"}
        assert await adapter.statuses_by_metadata({parent: "p", invoke: "b"}) == {
            "p/b": Status.ACTIVE
        }

    @pytest.mark.asyncio
    async def test_metadata_is_kept_by_updates(self, adapter: Adapter) -> None:
        await self._insert_tagged(adapter, {"exec-1": {"tenant": "a"}})
        await adapter.update_execution(_execution(metadata={"tenant": "b"}))
        assert await self._listed(adapter, {"tenant": "a"}) == {"exec-1"}
        assert await self._listed(adapter, {"tenant": "b"}) == set()


class InputLogConformance(_AdapterSuite):
    """The input log, for an adapter declaring ``input_log``."""

    @pytest.mark.asyncio
    async def test_input_log_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.input_log, "these checks are for an adapter declaring input_log"

    @pytest.mark.asyncio
    async def test_input_log_is_dense_from_zero(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        assert await adapter.inputs("exec-1") == []
        entries = [
            ("step", b'["advance"]', _at(1)),
            ("answer", b'["done.invoke.call", {"ok": 1}]', _at(2).astimezone(_INDIA)),
            ("cancel", _BLOB, _at(3)),
        ]
        for seq, (via, event, recorded_at) in enumerate(entries):
            assert await adapter.append_input("exec-1", via, event, recorded_at, None) == seq
        expected = [
            InputRecord("exec-1", seq=seq, via=via, event=event, recorded_at=recorded_at)
            for seq, (via, event, recorded_at) in enumerate(entries)
        ]
        _assert_same_log(await adapter.inputs("exec-1"), expected)

    @pytest.mark.asyncio
    async def test_input_log_without_a_cap_keeps_everything(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        answers = [
            await adapter.append_input("exec-1", "step", b"[%d]" % n, _at(n), None)
            for n in range(25)
        ]
        assert answers == list(range(25))
        log = await adapter.inputs("exec-1")
        assert [(r.seq, r.event) for r in log] == [(n, b"[%d]" % n) for n in range(25)]

    @pytest.mark.asyncio
    async def test_input_log_cap_closes_the_log_with_a_marker(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        assert await adapter.append_input("exec-1", "step", b"[0]", _at(0), 3) == 0
        assert await adapter.append_input("exec-1", "step", b"[1]", _at(1), 3) == 1
        # The third entry would take the last slot: a marker takes it instead.
        assert await adapter.append_input("exec-1", "answer", b"[2]", _at(2), 3) is None
        # A closed log takes nothing more, whatever the cap.
        assert await adapter.append_input("exec-1", "step", b"[3]", _at(3), 3) is None
        assert await adapter.append_input("exec-1", "step", b"[4]", _at(4), None) is None
        assert await adapter.append_input("exec-1", "step", b"[5]", _at(5), 10) is None
        expected = [
            InputRecord("exec-1", seq=0, via="step", event=b"[0]", recorded_at=_at(0)),
            InputRecord("exec-1", seq=1, via="step", event=b"[1]", recorded_at=_at(1)),
            InputRecord("exec-1", seq=2, via="answer", event=None, recorded_at=_at(2)),
        ]
        _assert_same_log(await adapter.inputs("exec-1"), expected)

    @pytest.mark.asyncio
    async def test_input_log_cap_of_one_holds_only_the_marker(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        assert await adapter.append_input("exec-1", "step", b"[0]", _at(0), 1) is None
        assert await adapter.append_input("exec-1", "step", b"[1]", _at(1), 1) is None
        expected = [InputRecord("exec-1", seq=0, via="step", event=None, recorded_at=_at(0))]
        _assert_same_log(await adapter.inputs("exec-1"), expected)

    @pytest.mark.asyncio
    async def test_input_log_cap_of_two(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        assert await adapter.append_input("exec-1", "step", b"[0]", _at(0), 2) == 0
        assert await adapter.append_input("exec-1", "step", b"[1]", _at(1), 2) is None
        assert await adapter.append_input("exec-1", "step", b"[2]", _at(2), 2) is None
        log = await adapter.inputs("exec-1")
        assert [(r.seq, r.event) for r in log] == [(0, b"[0]"), (1, None)]

    @pytest.mark.asyncio
    async def test_input_logs_are_per_execution(self, adapter: Adapter) -> None:
        for execution_id in ("exec-1", "exec-2", "exec-3"):
            await _insert(adapter, _execution(execution_id))
        assert await adapter.append_input("exec-1", "step", b"[10]", _at(0), 2) == 0
        assert await adapter.append_input("exec-2", "step", b"[20]", _at(0), 2) == 0
        assert await adapter.append_input("exec-1", "step", b"[11]", _at(1), 2) is None
        # exec-1's log is closed; exec-2's is not.
        assert await adapter.append_input("exec-2", "step", b"[21]", _at(1), None) == 1
        assert await adapter.append_input("exec-2", "step", b"[22]", _at(2), None) == 2
        log_1 = await adapter.inputs("exec-1")
        log_2 = await adapter.inputs("exec-2")
        assert [(r.execution_id, r.seq, r.event) for r in log_1] == [
            ("exec-1", 0, b"[10]"),
            ("exec-1", 1, None),
        ]
        assert [(r.execution_id, r.seq, r.event) for r in log_2] == [
            ("exec-2", 0, b"[20]"),
            ("exec-2", 1, b"[21]"),
            ("exec-2", 2, b"[22]"),
        ]
        assert await adapter.inputs("exec-3") == []
        assert await adapter.inputs("exec-missing") == []

    @pytest.mark.asyncio
    async def test_input_log_recorded_step_updates_the_row_and_appends(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution())
        await _insert(adapter, _execution("exec-2"))
        first = _execution(position=b"after one", updated_at=_at(1))
        assert await adapter.record_step(first, "step", b'["go"]', _at(1), None) == 0
        done = _ended("exec-1", _at(2), position=b"after two")
        done = replace(done, outcome=b'{"ok": true}', updated_at=_at(2))
        assert await adapter.record_step(done, "timer", b'["tick"]', _at(2), None) == 1
        _assert_same_execution(await adapter.fetch_execution("exec-1"), done)
        expected = [
            InputRecord("exec-1", seq=0, via="step", event=b'["go"]', recorded_at=_at(1)),
            InputRecord("exec-1", seq=1, via="timer", event=b'["tick"]', recorded_at=_at(2)),
        ]
        _assert_same_log(await adapter.inputs("exec-1"), expected)
        _assert_same_execution(await adapter.fetch_execution("exec-2"), _execution("exec-2"))
        assert await adapter.inputs("exec-2") == []

    @pytest.mark.asyncio
    async def test_input_log_recorded_step_keeps_the_cap(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        record = _execution(position=b"later", updated_at=_at(1))
        assert await adapter.record_step(record, "step", b"[0]", _at(1), 2) == 0
        assert await adapter.record_step(record, "step", b"[1]", _at(2), 2) is None
        # A closed log takes nothing more; the row is written all the same.
        last = _execution(position=b"last", updated_at=_at(3))
        assert await adapter.record_step(last, "step", b"[2]", _at(3), 2) is None
        log = await adapter.inputs("exec-1")
        assert [(r.seq, r.event) for r in log] == [(0, b"[0]"), (1, None)]
        _assert_same_execution(await adapter.fetch_execution("exec-1"), last)

    @pytest.mark.asyncio
    async def test_input_log_recorded_step_of_a_missing_execution_writes_nothing(
        self, adapter: Adapter
    ) -> None:
        with pytest.raises(ExecutionNotFound) as refused:
            await adapter.record_step(_execution("exec-9"), "step", b"[0]", _at(1), None)
        assert refused.value.execution_id == "exec-9"
        assert await adapter.fetch_execution("exec-9") is None
        assert await adapter.inputs("exec-9") == []

    @pytest.mark.asyncio
    async def test_input_log_recorded_steps_are_written_in_order(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        await _insert(adapter, _execution("exec-2"))
        one = _execution(position=b"one", updated_at=_at(1))
        two = _execution("exec-2", position=b"two", updated_at=_at(2))
        three = _execution(position=b"three", updated_at=_at(3))
        await adapter.record_steps(
            [
                StepWrite(one, via="step", event=b"[1]", recorded_at=_at(1)),
                StepWrite(two, via="step", event=b"[2]", recorded_at=_at(2)),
                StepWrite(three, via="timer", event=b"[3]", recorded_at=_at(3)),
            ],
            None,
        )
        _assert_same_execution(await adapter.fetch_execution("exec-1"), three)
        _assert_same_execution(await adapter.fetch_execution("exec-2"), two)
        log = await adapter.inputs("exec-1")
        assert [(r.seq, r.via, r.event) for r in log] == [(0, "step", b"[1]"), (1, "timer", b"[3]")]
        assert [(r.seq, r.event) for r in await adapter.inputs("exec-2")] == [(0, b"[2]")]

    @pytest.mark.asyncio
    async def test_input_log_recorded_steps_follow_the_log_and_keep_the_cap(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution())
        await _insert(adapter, _execution("exec-2"))
        assert await adapter.append_input("exec-1", "step", b"[0]", _at(1), None) == 0
        await adapter.append_input("exec-2", "step", b"[0]", _at(1), 1)  # closed at once
        steps = [
            StepWrite(_execution(position=b"a"), via="step", event=b"[1]", recorded_at=_at(2)),
            StepWrite(_execution("exec-2"), via="step", event=b"[1]", recorded_at=_at(2)),
            StepWrite(_execution(position=b"b"), via="step", event=b"[2]", recorded_at=_at(3)),
            StepWrite(_execution(position=b"c"), via="step", event=b"[3]", recorded_at=_at(4)),
        ]
        await adapter.record_steps(steps, 3)
        # The entry in the cap's last slot is the marker; the step after it and the
        # step into a closed log append nothing, and each row takes its last record.
        log = await adapter.inputs("exec-1")
        assert [(r.seq, r.event) for r in log] == [(0, b"[0]"), (1, b"[1]"), (2, None)]
        assert [(r.seq, r.event) for r in await adapter.inputs("exec-2")] == [(0, None)]
        _assert_same_execution(await adapter.fetch_execution("exec-1"), _execution(position=b"c"))

    @pytest.mark.asyncio
    async def test_input_log_recorded_steps_with_a_missing_execution_write_nothing(
        self, adapter: Adapter
    ) -> None:
        await _insert(adapter, _execution())
        steps = [
            StepWrite(_execution(position=b"one"), via="step", event=b"[1]", recorded_at=_at(1)),
            StepWrite(_execution("exec-9"), via="step", event=b"[0]", recorded_at=_at(1)),
        ]
        with pytest.raises(ExecutionNotFound) as refused:
            await adapter.record_steps(steps, None)
        assert refused.value.execution_id == "exec-9"
        assert await adapter.inputs("exec-1") == []
        _assert_same_execution(await adapter.fetch_execution("exec-1"), _execution())

    # Retention.


class LockConformance(_AdapterSuite):
    """``exclusive``, for an adapter declaring ``lock``."""

    #: The store admits one ``exclusive`` block at a time whatever the execution.
    exclusive_locks_whole_store: bool = False
    #: An ``exclusive`` block is a transaction: a block that raises leaves nothing.
    exclusive_rolls_back: bool = False

    @pytest.mark.asyncio
    async def test_lock_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.lock, "these checks are for an adapter declaring lock"

    @pytest.mark.asyncio
    async def test_exclusive_serializes_one_execution(self, adapter: Adapter) -> None:
        order: list[str] = []
        first_in = asyncio.Event()
        let_go = asyncio.Event()

        async def first() -> None:
            async with adapter.exclusive("exec-1", None):
                order.append("first in")
                first_in.set()
                await let_go.wait()
                order.append("first out")

        async def second() -> None:
            await first_in.wait()
            async with adapter.exclusive("exec-1", None):
                order.append("second in")

        async with asyncio.timeout(_PATIENCE):
            tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
            await first_in.wait()
            # Real time, not just a turn of the loop: a store may wait in a server.
            await asyncio.sleep(0.1)
            assert order == ["first in"], "a second block entered while the first held"
            let_go.set()
            await asyncio.gather(*tasks)
        assert order == ["first in", "first out", "second in"]

    @pytest.mark.asyncio
    async def test_exclusive_loses_no_update(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution(position=b"0"))

        async def bump() -> None:
            async with adapter.exclusive("exec-1", _PATIENCE):
                current = await adapter.fetch_execution("exec-1")
                assert current is not None
                assert current.position is not None
                await asyncio.sleep(0)
                position = b"%d" % (int(current.position) + 1)
                await adapter.update_execution(replace(current, position=position))

        async with asyncio.timeout(_PATIENCE):
            await asyncio.gather(*(bump() for _ in range(8)))
        final = await adapter.fetch_execution("exec-1")
        assert final is not None
        assert final.position == b"8"

    @pytest.mark.asyncio
    async def test_exclusive_on_other_executions_do_not_wait(self, adapter: Adapter) -> None:
        holder = _Holder(adapter, "exec-1")
        await holder.wait_entered()
        if self.exclusive_locks_whole_store:
            other = asyncio.create_task(_enter(adapter, "exec-2", _PATIENCE))
            await holder.release()
            async with asyncio.timeout(_PATIENCE):
                await other
            return
        try:
            await _enter(adapter, "exec-2", 2.0)
        except LockTimeout:
            pytest.fail("a block on exec-2 waited for a block on exec-1")
        finally:
            await holder.release()

    @pytest.mark.asyncio
    async def test_exclusive_wait_bound_raises_lock_timeout(self, adapter: Adapter) -> None:
        holder = _Holder(adapter, "exec-1")
        await holder.wait_entered()
        try:
            started = time.monotonic()
            with pytest.raises(LockTimeout) as refused:
                async with asyncio.timeout(_PATIENCE):
                    await _enter(adapter, "exec-1", 0.2)
            waited = time.monotonic() - started
            assert refused.value.execution_id == "exec-1"
            assert waited >= 0.1, f"refused after {waited:.3f}s, before the wait bound of 0.2s"
            assert refused.value.waited >= 0.1, refused.value.waited
        finally:
            await holder.release()
        # The refused waiter left nothing behind: the lock is free once released.
        await _enter(adapter, "exec-1", 1.0)

    @pytest.mark.asyncio
    async def test_exclusive_wait_of_zero_does_not_wait(self, adapter: Adapter) -> None:
        await _enter(adapter, "exec-1", 0)
        holder = _Holder(adapter, "exec-1")
        await holder.wait_entered()
        try:
            with pytest.raises(LockTimeout) as refused:
                async with asyncio.timeout(_PATIENCE):
                    await _enter(adapter, "exec-1", 0)
            assert refused.value.execution_id == "exec-1"
        finally:
            await holder.release()
        await _enter(adapter, "exec-1", 0)

    @pytest.mark.asyncio
    async def test_exclusive_is_released_when_the_block_raises(self, adapter: Adapter) -> None:
        record = _execution()
        with pytest.raises(_BoomError):
            await _raise_inside(adapter, "exec-1", record)
        async with asyncio.timeout(_PATIENCE):
            await _enter(adapter, "exec-1", 1.0)
        if self.exclusive_rolls_back:
            assert await adapter.fetch_execution("exec-1") is None, "a raising block left a row"

    @pytest.mark.asyncio
    async def test_exclusive_is_released_when_the_holder_is_cancelled(
        self, adapter: Adapter
    ) -> None:
        holder = _Holder(adapter, "exec-1")
        await holder.wait_entered()
        holder.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder.task
        async with asyncio.timeout(_PATIENCE):
            await _enter(adapter, "exec-1", 1.0)

    @pytest.mark.asyncio
    async def test_exclusive_cancelled_waiter_leaves_the_lock_free(self, adapter: Adapter) -> None:
        holder = _Holder(adapter, "exec-1")
        await holder.wait_entered()
        waiter = asyncio.create_task(_enter(adapter, "exec-1", None))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder.release()
        async with asyncio.timeout(_PATIENCE):
            await _enter(adapter, "exec-1", 1.0)

    @pytest.mark.asyncio
    async def test_exclusive_block_sees_its_writes_and_keeps_them(self, adapter: Adapter) -> None:
        record = _execution()
        async with adapter.exclusive("exec-1", _PATIENCE):
            await _insert(adapter, record)
            _assert_same_execution(await adapter.fetch_execution("exec-1"), record)
            updated = replace(record, position=b"stepped", updated_at=_at(1))
            await adapter.update_execution(updated)
            _assert_same_execution(await adapter.fetch_execution("exec-1"), updated)
        _assert_same_execution(await adapter.fetch_execution("exec-1"), updated)

    @pytest.mark.asyncio
    async def test_exclusive_block_survives_a_refusal(self, adapter: Adapter) -> None:
        # Closing a fan-out inserts a marker under a parent's lock and carries on when the id
        # is taken: a typed refusal must leave the block usable and its writes kept.
        taken = _ended("marker", _at(1), position=None)
        await _insert(adapter, taken)
        await _insert(adapter, _execution("parent"))
        stepped = _execution("parent", position=b"stepped", updated_at=_at(2))
        async with adapter.exclusive("parent", _PATIENCE):
            await adapter.update_execution(stepped)
            with pytest.raises(ExecutionExists):
                await adapter.insert_execution(_ended("marker", _at(3), position=None))
            with pytest.raises(ExecutionNotFound):
                await adapter.update_execution(_execution("missing"))
            _assert_same_execution(await adapter.fetch_execution("parent"), stepped)
            await _insert(adapter, _execution("child"))
        _assert_same_execution(await adapter.fetch_execution("parent"), stepped)
        _assert_same_execution(await adapter.fetch_execution("marker"), taken)
        _assert_same_execution(await adapter.fetch_execution("child"), _execution("child"))


class ErrorsConformance(_AdapterSuite):
    """The errors steps raised, for an adapter declaring ``errors``."""

    @pytest.mark.asyncio
    async def test_errors_is_declared(self, adapter: Adapter) -> None:
        assert adapter.capabilities.errors, "these checks are for an adapter declaring errors"

    @pytest.mark.asyncio
    async def test_errors_come_back_as_stored_oldest_first(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        assert await adapter.errors("exec-1", 10) == []
        stored = [
            _error(seq=None, via="create", recorded_at=_at(0)),
            _error(name="error.communication", seq=4, taken=True, recorded_at=_at(1)),
            _error(seq=5, error=_BLOB, recorded_at=_at(2).astimezone(_INDIA)),
        ]
        await adapter.record_errors(stored[:2])
        await adapter.record_errors(stored[2:])
        await adapter.record_errors([])
        _assert_same_errors(await adapter.errors("exec-1", 10), stored)

    @pytest.mark.asyncio
    async def test_errors_answer_the_most_recent_up_to_the_limit(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        stored = [_error(seq=n, recorded_at=_at(n)) for n in range(6)]
        await adapter.record_errors(stored)
        _assert_same_errors(await adapter.errors("exec-1", 2), stored[4:])
        _assert_same_errors(await adapter.errors("exec-1", 6), stored)
        assert await adapter.errors("exec-1", 0) == []

    @pytest.mark.asyncio
    async def test_errors_are_per_execution(self, adapter: Adapter) -> None:
        for execution_id in ("exec-1", "exec-2"):
            await _insert(adapter, _execution(execution_id))
        await adapter.record_errors([_error("exec-1", seq=0), _error("exec-2", seq=3)])
        _assert_same_errors(await adapter.errors("exec-1", 10), [_error("exec-1", seq=0)])
        _assert_same_errors(await adapter.errors("exec-2", 10), [_error("exec-2", seq=3)])
        assert await adapter.errors("exec-missing", 10) == []


class FullConformance(
    AdapterConformance,
    AnswersConformance,
    ChartRetirementConformance,
    MetadataConformance,
    InputLogConformance,
    LockConformance,
    ErrorsConformance,
):
    """Everything, for an adapter declaring every capability (the shipped ones do),
    plus the checks that need two capabilities at once."""

    @pytest.mark.asyncio
    async def test_exclusive_keeps_an_input_log_dense(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())

        async def append(n: int) -> int | None:
            async with adapter.exclusive("exec-1", _PATIENCE):
                await asyncio.sleep(0)
                return await adapter.append_input("exec-1", "step", b"[%d]" % n, _at(n), None)

        async with asyncio.timeout(_PATIENCE):
            answers = await asyncio.gather(*(append(n) for n in range(8)))
        assert sorted(a for a in answers if a is not None) == list(range(8))
        log = await adapter.inputs("exec-1")
        assert [r.seq for r in log] == list(range(8))
        assert sorted(r.event or b"" for r in log) == sorted(b"[%d]" % n for n in range(8))

    @pytest.mark.asyncio
    async def test_recorded_step_files_its_errors_under_its_entry(self, adapter: Adapter) -> None:
        await _insert(adapter, _execution())
        first = replace(_execution(updated_at=_at(1)), error_count=2, last_error_at=_at(1))
        raised = [_error(recorded_at=_at(1)), _error("exec-1", "error.communication", taken=True)]
        assert await adapter.record_step(first, "step", b"[0]", _at(1), None, raised) == 0
        assert await adapter.record_step(first, "step", b"[1]", _at(2), None) == 1
        # A log closed at its cap files the step's errors under no entry.
        assert await adapter.record_step(first, "timer", b"[2]", _at(3), 3, [_error()]) is None
        _assert_same_execution(await adapter.fetch_execution("exec-1"), first)
        _assert_same_errors(
            await adapter.errors("exec-1", 10),
            [replace(raised[0], seq=0), replace(raised[1], seq=0), _error()],
        )

    @pytest.mark.asyncio
    async def test_recorded_step_of_a_missing_execution_files_no_error(
        self, adapter: Adapter
    ) -> None:
        with pytest.raises(ExecutionNotFound):
            await adapter.record_step(
                _execution("exec-9"), "step", b"[0]", _at(1), None, [_error("exec-9")]
            )
        assert await adapter.errors("exec-9", 10) == []

    @pytest.mark.asyncio
    async def test_prune_clears_the_errors_with_the_log(self, adapter: Adapter) -> None:
        records = await self._insert_for_prune(adapter)
        for execution_id in records:
            await adapter.record_errors([_error(execution_id, seq=0)])
        pruned = await adapter.prune(_at(60), 100)
        assert sorted(pruned) == ["old-completed", "old-failed"]
        for execution_id in records:
            kept = await adapter.errors(execution_id, 10)
            assert (kept == []) is (execution_id in pruned), execution_id
