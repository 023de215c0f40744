"""An in-memory source and target, for tests and examples.

:class:`MemorySource` is an event log in a list; :class:`MemoryTarget` keeps tables as
dictionaries, with the cursors, watermark and dead letters beside them, a log of what
it committed in commit order, and a hook to make a batch fail.

>>> import asyncio
>>> source = MemorySource()
>>> source.record("order-1", "OrderPlaced", {"id": 1}).position
1
>>> async def first_read():
...     await source.subscribe(ProjectionKey("orders"), after=0)
...     return [event.type for event in await source.read(10)]
>>> asyncio.run(first_read())
['OrderPlaced']
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import sqlalchemy as sa

from scriba.event import Event, ProjectionKey
from scriba.operations import Delete, Insert, Multi, Operation, Update
from scriba.source import ProjectionLock, SourceError
from scriba.target import (
    ApplyFailed,
    DeadLetter,
    DeadLetterStats,
    FailureKind,
    ResetCounts,
    StoredDeadLetter,
    Watermark,
)
from statifier import telemetry

__all__ = ["BatchCall", "FailureInjector", "MemorySource", "MemoryTarget"]


class MemorySource:
    """A :class:`~scriba.source.Source` over events held in memory.

    Args:
        events: the initial log; positions must increase.
        start_from: positions at or below it are never delivered (as a source that
            resumes from its own stored position would behave).
        replay_from_zero: ignore the ``after`` of ``subscribe`` and deliver the whole
            log again on every subscription (a naive source; deduplication must cope).
        read_wait: seconds ``read`` waits for an ``append`` when there is nothing new.

    Attributes:
        reads: how many times ``read`` was called (pause tests watch it stay put).
        acknowledged: the greatest position acknowledged.
        acknowledgements: every acknowledged position, in order.
        subscriptions: the ``after`` of each ``subscribe``, in order.
    """

    def __init__(
        self,
        events: Iterable[Event] = (),
        *,
        start_from: int = 0,
        replay_from_zero: bool = False,
        read_wait: float = 0.01,
    ) -> None:
        self.events: list[Event] = []
        self.start_from = start_from
        self.replay_from_zero = replay_from_zero
        self.read_wait = read_wait
        self.reads = 0
        self.acknowledged = 0
        self.subscriptions: list[int] = []
        self.acknowledgements: list[int] = []
        self.closed = False
        self._next = 0
        self._appended: asyncio.Event | None = None  # made per subscription, in its loop
        self._fail_next_read: BaseException | None = None
        self.append(*events)

    def append(self, *events: Event) -> None:
        """Add events to the log.

        Raises:
            ValueError: a position is not above the last one (nothing is added).
        """
        last = self.events[-1].position if self.events else 0
        for event in events:
            if event.position <= last:
                raise ValueError(f"position {event.position} after {last}: not increasing")
            last = event.position
        self.events.extend(events)
        if self._appended is not None:
            self._appended.set()

    def record(
        self,
        stream_id: str,
        type: str,  # noqa: A002 - the Event field it fills
        data: Any = None,
        *,
        occurred_at: datetime | None = None,
    ) -> Event:
        """Append one event at the next position (id ``"ev-<position>"``) and return it."""
        position = (self.events[-1].position if self.events else 0) + 1
        event = Event(
            id=f"ev-{position}",
            stream_id=stream_id,
            type=type,
            data=data,
            position=position,
            occurred_at=occurred_at or datetime.now(UTC),
        )
        self.append(event)
        return event

    def fail_next_read(self, error: BaseException) -> None:
        """Make the next ``read`` raise ``error`` (a source crash)."""
        self._fail_next_read = error

    def rewind(self) -> None:
        """Deliver the log again from ``start_from`` (redelivery while subscribed)."""
        self._next = self._index_after(self.start_from)

    async def subscribe(self, projection: ProjectionKey, after: int) -> None:
        self.subscriptions.append(after)
        self.closed = False
        self._appended = asyncio.Event()
        start = self.start_from if self.replay_from_zero else max(after, self.start_from)
        self._next = self._index_after(start)
        telemetry.report(
            "scriba.source.subscribed",
            {},
            {
                "name": projection.name,
                "version": projection.version,
                "source": "memory",
                "after": after,
            },
        )

    async def read(self, limit: int) -> Sequence[Event]:
        self.reads += 1
        if self._fail_next_read is not None:
            error, self._fail_next_read = self._fail_next_read, None
            raise error
        if self._next >= len(self.events):
            if self._appended is None:
                raise SourceError("read before subscribe")
            appended = self._appended
            appended.clear()
            try:
                async with asyncio.timeout(self.read_wait):
                    await appended.wait()
            except TimeoutError:
                return []
        chunk = self.events[self._next : self._next + limit]
        self._next += len(chunk)
        return chunk

    async def acknowledge(self, position: int) -> None:
        self.acknowledgements.append(position)
        self.acknowledged = max(self.acknowledged, position)

    @property
    def standing_by(self) -> bool:
        """Never: a memory source takes no lock (one process sees it)."""
        return False

    @property
    def blocked(self) -> bool:
        """Never: a memory log has no gaps."""
        return False

    async def confirm_held(self) -> None:
        """Nothing to check: there is no lock."""

    async def head(self) -> int | None:
        """The position of the last event in the log (0 when empty)."""
        return self.events[-1].position if self.events else 0

    def projection_lock(self, projection: ProjectionKey) -> ProjectionLock | None:
        """None: a memory source takes no lock."""
        del projection
        return None

    async def close(self) -> None:
        self.closed = True

    def _index_after(self, position: int) -> int:
        for index, event in enumerate(self.events):
            if event.position > position:
                return index
        return len(self.events)


@dataclass(frozen=True, slots=True)
class BatchCall:
    """What one ``apply_batch`` call was given (the injector sees it before applying)."""

    projection: ProjectionKey
    applied: Sequence[tuple[Event, Operation]]
    advances: Mapping[str, int]
    dead_letters: Sequence[DeadLetter]


FailureInjector: TypeAlias = Callable[[BatchCall], FailureKind | None]
"""Decides, per batch, whether it fails and how (``None``: apply it)."""

_Key: TypeAlias = tuple[Any, ...]


class MemoryTarget:
    """A :class:`~scriba.target.Target` in dictionaries, all or nothing per batch.

    Tables are ``tables[table_name][primary_key_values] = row``. An ``Insert`` over an
    existing primary key, or without one, fails the batch as an integrity error; a
    column the table does not have fails it as a structural one (a schema that does not
    match the code). ``Execute`` is not accepted (there is no SQL to run), so a handler
    returning it has its event dead-lettered as rejected.

    Fencing is kept as a generation per projection (:meth:`generation`), raised by
    ``claim`` and ``reset``; a write given an older ``fence`` fails ``FENCED``.

    Args:
        fail: called with each batch before it is applied; a ``FailureKind`` makes the
            batch raise :class:`~scriba.target.ApplyFailed` of that kind.

    Attributes:
        commit_log: ``(stream_id, position)`` of every applied event, in commit order.
        batches: every batch that committed, in order.
        watermark_log: every stored watermark position, in order.
        calls: how many times ``apply_batch`` was called (committed or not).
    """

    def __init__(self, *, fail: FailureInjector | None = None) -> None:
        self.fail = fail
        self.tables: dict[str, dict[_Key, dict[str, Any]]] = {}
        self.commit_log: list[tuple[str, int]] = []
        self.batches: list[BatchCall] = []
        self.watermark_log: list[int] = []
        self.calls = 0
        self.opened: list[ProjectionKey] = []
        self.closed = False
        self._cursors: dict[ProjectionKey, dict[str, int]] = {}
        self._watermarks: dict[ProjectionKey, Watermark] = {}
        self._dead: dict[ProjectionKey, list[StoredDeadLetter]] = {}
        self._dead_ids = 0
        self._generations: dict[ProjectionKey, int] = {}

    def generation(self, projection: ProjectionKey) -> int:
        """The projection's generation: how many times it was claimed (or reset)."""
        return self._generations.get(projection, 0)

    def rows(self, table: sa.Table | str) -> list[dict[str, Any]]:
        """The rows of ``table``, in primary-key order."""
        name = table if isinstance(table, str) else table.name
        stored = self.tables.get(name, {})
        return [dict(stored[key]) for key in sorted(stored)]

    def cursors(self, projection: ProjectionKey) -> dict[str, int]:
        """The stream cursors of ``projection``."""
        return dict(self._cursors.get(projection, {}))

    async def open(self, projection: ProjectionKey) -> None:
        self.opened.append(projection)
        self.closed = False

    def accepts(self, operation: Operation) -> bool:
        if isinstance(operation, Multi):
            return all(self.accepts(inner) for inner in operation.operations)
        return isinstance(operation, Insert | Update | Delete)

    async def load_positions(self, projection: ProjectionKey, limit: int) -> dict[str, int]:
        cursors = self._cursors.get(projection, {})
        return dict(list(cursors.items())[:limit])

    async def stream_position(self, projection: ProjectionKey, stream_id: str) -> int | None:
        return self._cursors.get(projection, {}).get(stream_id)

    async def claim(self, projection: ProjectionKey) -> int:
        self._generations[projection] = self.generation(projection) + 1
        return self._generations[projection]

    def _check_fence(self, projection: ProjectionKey, fence: int | None) -> None:
        current = self.generation(projection)
        if fence is not None and fence != current:
            raise ApplyFailed(
                FailureKind.FENCED,
                f"fenced: generation {fence} was superseded by {current}",
            )

    async def apply_batch(
        self,
        projection: ProjectionKey,
        applied: Sequence[tuple[Event, Operation]],
        advances: Mapping[str, int],
        dead_letters: Sequence[DeadLetter],
        *,
        fence: int | None = None,
    ) -> None:
        self.calls += 1
        call = BatchCall(projection, tuple(applied), dict(advances), tuple(dead_letters))
        if self.fail is not None:
            kind = self.fail(call)
            if kind is not None:
                raise ApplyFailed(kind, f"injected {kind.value} failure")
        self._check_fence(projection, fence)
        undo: list[tuple[str, _Key, dict[str, Any] | None]] = []
        try:
            for _, operation in applied:
                self._apply(operation, undo)
        except ApplyFailed:
            for name, key, row in reversed(undo):
                if row is None:
                    del self.tables[name][key]
                else:
                    self.tables[name][key] = row
            raise
        cursors = self._cursors.setdefault(projection, {})
        for stream_id, position in advances.items():
            if cursors.get(stream_id, -1) < position:
                cursors[stream_id] = position
        for letter in dead_letters:
            self._store_dead_letter(projection, letter)
        self.commit_log.extend((event.stream_id, event.position) for event, _ in applied)
        self.batches.append(call)

    async def save_watermark(
        self,
        projection: ProjectionKey,
        position: int,
        occurred_at: datetime | None,
        *,
        fence: int | None = None,
    ) -> None:
        self._check_fence(projection, fence)
        current = self._watermarks.get(projection)
        if current is None or position > current.position:
            self._watermarks[projection] = Watermark(position, occurred_at, datetime.now(UTC))
            self.watermark_log.append(position)

    async def watermark(self, projection: ProjectionKey) -> Watermark | None:
        return self._watermarks.get(projection)

    async def dead_letters(self, projection: ProjectionKey, limit: int) -> list[StoredDeadLetter]:
        return list(reversed(self._dead.get(projection, [])))[:limit]

    async def dead_letter_stats(self, projection: ProjectionKey) -> DeadLetterStats:
        letters = self._dead.get(projection, [])
        by_kind: dict[str, int] = {}
        for letter in letters:
            by_kind[letter.error_kind] = by_kind.get(letter.error_kind, 0) + 1
        positions = [letter.position for letter in letters]
        return DeadLetterStats(
            total=len(letters),
            by_kind=by_kind,
            first_position=min(positions, default=None),
            last_position=max(positions, default=None),
        )

    async def reset(self, projection: ProjectionKey, *, dead_letters: bool) -> ResetCounts:
        positions = len(self._cursors.pop(projection, {}))
        watermarks = 1 if self._watermarks.pop(projection, None) is not None else 0
        removed = len(self._dead.pop(projection, [])) if dead_letters else 0
        await self.claim(projection)
        return ResetCounts(positions=positions, watermarks=watermarks, dead_letters=removed)

    async def close(self) -> None:
        self.closed = True

    def _store_dead_letter(self, projection: ProjectionKey, letter: DeadLetter) -> None:
        self._dead_ids += 1
        event = letter.event
        self._dead.setdefault(projection, []).append(
            StoredDeadLetter(
                id=self._dead_ids,
                projection=projection,
                position=event.position,
                stream_id=event.stream_id,
                event_type=event.type,
                event_data=event.data,
                error_kind=letter.error_kind,
                error_message=letter.error_message,
                error_stacktrace=letter.error_stacktrace,
                occurred_at=datetime.now(UTC),
            )
        )

    def _apply(
        self, operation: Operation, undo: list[tuple[str, _Key, dict[str, Any] | None]]
    ) -> None:
        if isinstance(operation, Multi):
            for inner in operation.operations:
                self._apply(inner, undo)
            return
        if isinstance(operation, Insert):
            table = operation.table
            _check_columns(table, operation.values)
            key = _primary_key(table, operation.values)
            rows = self.tables.setdefault(table.name, {})
            if key in rows:
                raise ApplyFailed(FailureKind.INTEGRITY, f"duplicate key {key!r} in {table.name}")
            undo.append((table.name, key, None))
            rows[key] = {**_defaults(table), **operation.values}
            return
        if isinstance(operation, Update | Delete):
            table = operation.table
            _check_columns(table, operation.where)
            if isinstance(operation, Update):
                _check_columns(table, operation.values)
            rows = self.tables.setdefault(table.name, {})
            matching = [
                key
                for key, row in rows.items()
                if all(row.get(column) == value for column, value in operation.where.items())
            ]
            for key in matching:
                undo.append((table.name, key, rows[key]))
                if isinstance(operation, Update):
                    rows[key] = {**rows[key], **operation.values}
                else:
                    del rows[key]
            return
        raise ApplyFailed(FailureKind.STRUCTURAL, f"cannot apply {type(operation).__name__}")


def _check_columns(table: sa.Table, values: Mapping[str, Any]) -> None:
    unknown = set(values) - set(table.columns.keys())
    if unknown:
        raise ApplyFailed(
            FailureKind.STRUCTURAL,
            f"{table.name} has no column {', '.join(sorted(unknown))}",
        )


def _primary_key(table: sa.Table, values: Mapping[str, Any]) -> _Key:
    columns = [column.name for column in table.primary_key.columns]
    if not columns:
        raise ApplyFailed(FailureKind.STRUCTURAL, f"{table.name} has no primary key")
    missing = [column for column in columns if values.get(column) is None]
    if missing:
        raise ApplyFailed(
            FailureKind.INTEGRITY, f"{table.name}: no value for key {', '.join(missing)}"
        )
    return tuple(values[column] for column in columns)


def _defaults(table: sa.Table) -> dict[str, Any]:
    return {column.name: None for column in table.columns}
