"""Executions spread over several stores by key buckets: :class:`ShardedAdapter`.

Every execution falls in one of :data:`~statifier.buckets.BUCKETS` virtual buckets,
fixed by its root id (:func:`~statifier.buckets.bucket_of`: a durable child,
``parent/invoke``, falls in its root's bucket, and an id minted for an address in the
address's), and a :class:`ShardMap` gives each range of buckets to one store. What one
execution needs (its row, input log, errors, lock, its children's answers to it, its
fan-out ends) is in its bucket's store; charts are saved in every store; what spans
executions (counts, listings, answers owed, pruning) asks every store and merges.

>>> from statifier.persistence import MemoryAdapter
>>> adapter = ShardedAdapter([MemoryAdapter(), MemoryAdapter(), MemoryAdapter()])
>>> adapter.shard_of("order-17") == adapter.shard_of("order-17/payment")
True
>>> ShardMap.even(3).ranges
((0, 341), (341, 682), (682, 1024))
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from statifier.buckets import BUCKETS, bucket_of
from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.errors import ExecutionNotFound, Pinned
from statifier.persistence.executions import PARENT_KEY
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
from statifier.repeats import Repeats

__all__ = ["BUCKETS", "Shard", "ShardMap", "ShardedAdapter", "bucket_of"]

T = TypeVar("T")
_log = logging.getLogger(__name__)

_HELD: ContextVar[Adapter | None] = ContextVar("statifier.shards.held", default=None)
"""The store whose ``exclusive`` block the running task is in (a task's own: a block
holds its store for the task that entered it), so that a chart saved there is saved
in that store alone: another store's writer waited for inside a block could be held
by a task waiting for this one's."""


def _is_range(each: object) -> bool:
    """Whether ``each`` is a pair of whole numbers (untyped callers pass anything)."""
    return (
        isinstance(each, tuple | list)
        and len(each) == 2
        and all(type(edge) is int for edge in each)
    )


@dataclass(frozen=True)
class ShardMap:
    """Which store holds which buckets: ``ranges[i]`` is store ``i``'s ``[start, end)``;
    the ranges follow one another from 0 to :data:`BUCKETS`.

    Raises:
        ValueError: no range, or ranges that leave a gap, overlap, or are empty.
    """

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.ranges:
            raise ValueError("a shard map has at least one range")
        for number, each in enumerate(self.ranges):
            if not _is_range(each):
                raise ValueError(
                    f"range {number} is {each!r}: each range is a pair of whole numbers "
                    "(start, end)"
                )
        expected = 0
        for number, (start, end) in enumerate(self.ranges):
            if start != expected or end <= start:
                raise ValueError(
                    f"range {number} is [{start}, {end}): the ranges must follow one "
                    f"another from 0, each non-empty (this one must start at {expected})"
                )
            expected = end
        if expected != BUCKETS:
            raise ValueError(f"the ranges end at {expected}, not at {BUCKETS}")

    @classmethod
    def even(cls, stores: int) -> ShardMap:
        """``stores`` ranges of (nearly) equal size.

        Raises:
            ValueError: ``stores`` is below 1 or above :data:`BUCKETS`.
        """
        if not 1 <= stores <= BUCKETS:
            raise ValueError(f"between 1 and {BUCKETS} stores, not {stores}")
        cuts = [BUCKETS * number // stores for number in range(stores + 1)]
        return cls(tuple(itertools.pairwise(cuts)))

    def store_of(self, bucket: int) -> int:
        """The number of the store that holds ``bucket``."""
        for number, (start, end) in enumerate(self.ranges):
            if start <= bucket < end:
                return number
        raise ValueError(f"bucket {bucket} is not between 0 and {BUCKETS - 1}")

    def store_of_id(self, execution_id: str) -> int:
        """The number of the store that holds ``execution_id`` (its bucket:
        :func:`~statifier.buckets.bucket_of`)."""
        return self.store_of(bucket_of(execution_id))


@dataclass(frozen=True)
class Shard:
    """One store's place in a :class:`ShardMap`: store number ``index`` of ``shard_map``.

    >>> Shard(ShardMap.even(2), 1).holds(600), Shard(ShardMap.even(2), 1).holds(3)
    (True, False)

    Raises:
        ValueError: ``index`` names no range of the map.
    """

    shard_map: ShardMap
    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.shard_map.ranges):
            raise ValueError(
                f"store {self.index} is not one of the map's {len(self.shard_map.ranges)}"
            )

    def holds(self, bucket: int) -> bool:
        """Whether ``bucket`` is in this store's range."""
        start, end = self.shard_map.ranges[self.index]
        return start <= bucket < end


class ShardedAdapter:
    """An :class:`~statifier.persistence.adapter.Adapter` over several stores, one per
    range of a :class:`ShardMap` (by default, even ranges).

    What it promises beyond each store's own:

    - Everything of one execution is in one store, so a step (``record_step``), an
      ``exclusive`` block and whatever the block does to that execution are one unit
      of work of that store, as on one database.
    - A call over several executions (``record_steps``, ``fetch_executions``,
      ``mark_delivered``, ``prune``) is split per store; the parts are not one unit:
      one store's part may be written when another's fails (``record_steps`` checks
      first that every execution exists, so a missing one still writes nothing).
    - Charts are saved in every store (outside a block), so that each can check its
      executions against them. ``retire_chart`` counts the pins in every store
      first and refuses as one store would; between that count and the last
      store's tombstone, an execution created on the chart in a store already
      retired is refused there
      (``ChartRetired``), and one created in a store not yet retired makes that store
      refuse: the stores before it keep their tombstone, and ``Pinned`` is raised.
      A chart saved inside an ``exclusive`` block (a durable child's, created in
      its parent's step) is saved in the block's store alone, and in another store
      when an execution is first inserted there, or before a retire; ``fetch_chart``
      reads the block's store first, then the first store, then the others. A
      child's answer, and a listing by its parent's metadata, are read in the
      parent's store alone (a child's id starts with its parent's). So no block
      waits for another store's writer, which on SQLite a task waiting for this
      block's could hold.
    - Listings (``list_by_metadata``, ``pinning_executions``) concatenate the stores'
      in store order; counts are summed; ``undelivered_answers`` merges the stores'
      oldest first.

    Raises:
        ValueError: no store, or a map of another number of ranges.
    """

    def __init__(self, stores: Sequence[Adapter], shard_map: ShardMap | None = None) -> None:
        if not stores:
            raise ValueError("a sharded adapter needs at least one store")
        self.stores: tuple[Adapter, ...] = tuple(stores)
        self.shard_map = shard_map or ShardMap.even(len(self.stores))
        if len(self.shard_map.ranges) != len(self.stores):
            raise ValueError(
                f"the map has {len(self.shard_map.ranges)} ranges for {len(self.stores)} stores"
            )
        self._unplaced: dict[str, tuple[ChartRecord, set[int]]] = {}
        """By content hash: a chart saved inside a block, or while a store failed, and
        the stores known to hold it."""
        self._repeats = Repeats()

    def shard_of(self, execution_id: str) -> Adapter:
        """The store that holds ``execution_id`` (and its durable children)."""
        return self.stores[self.shard_map.store_of_id(execution_id)]

    def _grouped(self, items: Iterable[T], key: Callable[[T], str]) -> dict[int, list[T]]:
        groups: dict[int, list[T]] = {}
        for item in items:
            groups.setdefault(self.shard_map.store_of_id(key(item)), []).append(item)
        return groups

    async def _everywhere(self, call: Callable[[Adapter], Awaitable[T]]) -> list[T]:
        # One store after another, in this task: a store's calls belong to the
        # caller's ``exclusive`` block only when made by the task that holds it.
        return [await call(store) for store in self.stores]

    @property
    def capabilities(self) -> Capabilities:
        """What every store can do (batched steps excepted: a batch spans stores)."""
        each = [store.capabilities for store in self.stores]
        return Capabilities(
            lock=all(c.lock for c in each),
            metadata=all(c.metadata for c in each),
            input_log=all(c.input_log for c in each),
            chart_retirement=all(c.chart_retirement for c in each),
            answers=all(c.answers for c in each),
            errors=all(c.errors for c in each),
        )

    # Charts: in every store, but inside a block or while a store fails.

    async def save_chart(self, chart: ChartRecord) -> ChartRecord:
        held = _HELD.get()
        if held is not None and held in self.stores:
            # Inside a block (a durable child created in its parent's step): its store
            # alone, the child's too; the others when an execution goes there.
            placed = self._unplaced.setdefault(chart.content_hash, (chart, set()))[1]
            placed.add(self.stores.index(held))
            return await held.save_chart(chart)
        # Every store, but a store that fails holds up no other's executions: the chart
        # goes there when an execution is first inserted there (which fails while it
        # is away), or before a retire.
        saved: list[ChartRecord] = []
        failed: list[tuple[int, BaseException]] = []
        for number, store in enumerate(self.stores):
            try:
                saved.append(await store.save_chart(chart))
            except Exception as error:  # noqa: BLE001 - raised below if every store fails
                failed.append((number, error))
        if not saved:
            raise failed[0][1]
        if failed:
            placed = set(range(len(self.stores))) - {number for number, _ in failed}
            self._unplaced[chart.content_hash] = (chart, placed)
            for number, why in failed:
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    ("chart", number, type(why).__name__),
                    "store %d of %d failed to save a chart (%s); it is saved there when an "
                    "execution first goes there",
                    number,
                    len(self.stores),
                    type(why).__name__,
                )
        else:
            self._unplaced.pop(chart.content_hash, None)
        return saved[0]

    async def fetch_chart(self, content_hash: str) -> ChartRecord | None:
        # The block's store first (a chart saved inside a block is there), then the
        # first store, then the others (a chart saved in a block's store alone).
        held = _HELD.get()
        first = held if held is not None and held in self.stores else self.stores[0]
        for store in (first, *(store for store in self.stores if store is not first)):
            if (chart := await store.fetch_chart(content_hash)) is not None:
                return chart
        return None

    async def _placed(self, store: Adapter, content_hash: str) -> None:
        """Save in ``store`` a chart it may lack (saved inside a block of another
        store, or while ``store`` failed)."""
        unplaced = self._unplaced.get(content_hash)
        if unplaced is None:
            return
        chart, placed = unplaced
        number = self.stores.index(store)
        if number not in placed:
            await store.save_chart(chart)  # saves nothing where it is stored
            placed.add(number)

    async def retire_chart(
        self, content_hash: str, retired_by: str, retired_at: datetime
    ) -> ChartRecord | None:
        for store in self.stores:  # every store holds what it tombstones
            await self._placed(store, content_hash)
        self._unplaced.pop(content_hash, None)
        chart = await self.stores[0].fetch_chart(content_hash)
        if chart is None or chart.retired_at is not None:
            return chart
        pins = await self._pins(content_hash)
        if pins:
            raise Pinned(content_hash, pins)
        # The first store last: it answers fetch_chart, so a chart shows retired only
        # once every store holds its tombstone.
        tombstone = None
        for store in (*self.stores[1:], self.stores[0]):
            tombstone = await store.retire_chart(content_hash, retired_by, retired_at)
        return tombstone

    async def _pins(self, content_hash: str) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for status, count in (await self.count_executions_on(content_hash)).items():
            if status.pins:
                counts[f"executions_{status.value}"] += count
        counts["positions"] = await self.count_positions_on(content_hash)
        counts["children_linked"] = await self.count_linked_children_on(content_hash)
        return {name: count for name, count in counts.items() if count}

    # Executions: in their bucket's store.

    async def insert_execution(self, record: ExecutionRecord) -> None:
        store = self.shard_of(record.id)
        await self._placed(store, record.content_hash)
        await store.insert_execution(record)

    async def fetch_execution(self, execution_id: str) -> ExecutionRecord | None:
        return await self.shard_of(execution_id).fetch_execution(execution_id)

    async def fetch_executions(self, execution_ids: Sequence[str]) -> list[ExecutionRecord]:
        found: list[ExecutionRecord] = []
        for number, ids in self._grouped(execution_ids, str).items():
            found += await self.stores[number].fetch_executions(ids)
        return found

    async def update_execution(self, record: ExecutionRecord) -> None:
        await self.shard_of(record.id).update_execution(record)

    async def rechart_execution(self, record: ExecutionRecord, from_hash: str) -> bool:
        return await self.shard_of(record.id).rechart_execution(record, from_hash)

    async def count_executions_on(self, content_hash: str) -> Mapping[Status, int]:
        total: Counter[Status] = Counter()
        for counts in await self._everywhere(lambda s: s.count_executions_on(content_hash)):
            total.update(counts)
        return dict(total)

    async def pinning_executions(self, content_hash: str) -> list[str]:
        lists = await self._everywhere(lambda s: s.pinning_executions(content_hash))
        return [execution_id for ids in lists for execution_id in ids]

    def _holding(self, pairs: Mapping[str, str]) -> Sequence[Adapter]:
        """The stores that may hold executions whose metadata holds ``pairs``: a
        parent's durable children are in its store (a child's id starts with its
        parent's), asked alone, so that a parent's step cancelling its children
        waits for no other store's writer; else every store."""
        parent = pairs.get(PARENT_KEY)
        return self.stores if parent is None else (self.shard_of(parent),)

    async def list_by_metadata(self, pairs: Mapping[str, str]) -> list[ExecutionRecord]:
        lists = [await store.list_by_metadata(pairs) for store in self._holding(pairs)]
        return [record for records in lists for record in records]

    async def statuses_by_metadata(self, pairs: Mapping[str, str]) -> dict[str, Status]:
        merged: dict[str, Status] = {}
        for store in self._holding(pairs):
            merged.update(await store.statuses_by_metadata(pairs))
        return merged

    async def count_linked_children_on(self, content_hash: str) -> int:
        # An answer is kept with its parent: the parent's status is read in one store.
        return sum(await self._everywhere(lambda s: s.count_linked_children_on(content_hash)))

    # Answers and fan-out ends: with the parent they answer.

    async def insert_answer(self, record: AnswerRecord) -> None:
        await self.shard_of(record.parent_id).insert_answer(record)

    async def fetch_answer(self, child_id: str) -> AnswerRecord | None:
        # An answer is kept with its parent, and a child's id starts with its parent's
        # (``parent/invoke``): its bucket's store holds it, the one whose block the
        # parent's step holds. Asked alone, so that no other store's writer is waited
        # for there; the others only for an answer it lacks (an id minted otherwise).
        own = self.shard_of(child_id)
        answer = await own.fetch_answer(child_id)
        if answer is not None:
            return answer
        for store in self.stores:
            if store is not own and (answer := await store.fetch_answer(child_id)):
                return answer
        return None

    async def undelivered_answers(self, limit: int) -> list[AnswerRecord]:
        lists = await self._everywhere(lambda s: s.undelivered_answers(limit))
        owed = sorted(
            (answer for answers in lists for answer in answers),
            key=lambda answer: (answer.created_at, answer.child_id),
        )
        return owed[: max(limit, 0)]

    async def mark_delivered(self, child_ids: Sequence[str], delivered_at: datetime) -> None:
        # In each child's bucket's store, its parent's (see fetch_answer); in the
        # others only for an answer that store lacks (an id minted otherwise).
        elsewhere: list[str] = []
        for number, ids in self._grouped(child_ids, str).items():
            store = self.stores[number]
            await store.mark_delivered(ids, delivered_at)
            elsewhere += [i for i in ids if await store.fetch_answer(i) is None]
        for store in self.stores if elsewhere else ():
            await store.mark_delivered(elsewhere, delivered_at)

    async def take_fan_out_end(self, parent_id: str, invoke_id: str, ended_at: datetime) -> bool:
        return await self.shard_of(parent_id).take_fan_out_end(parent_id, invoke_id, ended_at)

    async def fan_out_ended(self, parent_id: str, invoke_id: str) -> bool:
        return await self.shard_of(parent_id).fan_out_ended(parent_id, invoke_id)

    # Saved positions: by the bucket of their key.

    async def save_position(self, record: PositionRecord) -> None:
        await self.shard_of(record.key).save_position(record)

    async def fetch_position(self, key: str) -> PositionRecord | None:
        return await self.shard_of(key).fetch_position(key)

    async def delete_position(self, key: str) -> bool:
        return await self.shard_of(key).delete_position(key)

    async def count_positions_on(self, content_hash: str) -> int:
        return sum(await self._everywhere(lambda s: s.count_positions_on(content_hash)))

    # The input log and the errors: with their execution.

    async def append_input(
        self,
        execution_id: str,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
    ) -> int | None:
        store = self.shard_of(execution_id)
        return await store.append_input(execution_id, via, event, recorded_at, cap)

    async def inputs(self, execution_id: str) -> list[InputRecord]:
        return await self.shard_of(execution_id).inputs(execution_id)

    async def record_step(
        self,
        record: ExecutionRecord,
        via: str,
        event: bytes,
        recorded_at: datetime,
        cap: int | None,
        errors: Sequence[ErrorRecord] = (),
    ) -> int | None:
        store = self.shard_of(record.id)
        return await store.record_step(record, via, event, recorded_at, cap, errors)

    async def record_steps(self, steps: Sequence[StepWrite], cap: int | None) -> None:
        groups = self._grouped(steps, lambda step: step.record.id)
        if len(groups) > 1:
            # Executions are never deleted: one found now is there for its write, so
            # a missing one is refused before any store writes.
            ids = [step.record.id for step in steps]
            found = {record.id for record in await self.fetch_executions(ids)}
            missing = next(
                (execution_id for execution_id in ids if execution_id not in found), None
            )
            if missing is not None:
                raise ExecutionNotFound(missing)
        # In order within each store: one execution's steps are all in one.
        for number, part in groups.items():
            await self.stores[number].record_steps(part, cap)

    async def record_errors(self, errors: Sequence[ErrorRecord]) -> None:
        for number, part in self._grouped(errors, lambda error: error.execution_id).items():
            await self.stores[number].record_errors(part)

    async def errors(self, execution_id: str, limit: int) -> list[ErrorRecord]:
        return await self.shard_of(execution_id).errors(execution_id, limit)

    # Retention: store after store, up to ``limit`` in all.

    async def prune(self, ended_before: datetime, limit: int) -> list[str]:
        pruned: list[str] = []
        for store in self.stores:
            if len(pruned) >= limit:
                break
            pruned += await store.prune(ended_before, limit - len(pruned))
        return pruned

    # Serialization: the execution's store's lock.

    def exclusive(self, execution_id: str, wait: float | None) -> AbstractAsyncContextManager[None]:
        return self._held(self.shard_of(execution_id), execution_id, wait)

    @asynccontextmanager
    async def _held(
        self, store: Adapter, execution_id: str, wait: float | None
    ) -> AsyncIterator[None]:
        """``store``'s block, the task marked as in it (:data:`_HELD`) meanwhile."""
        async with store.exclusive(execution_id, wait):
            token = _HELD.set(store)
            try:
                yield
            finally:
                _HELD.reset(token)
