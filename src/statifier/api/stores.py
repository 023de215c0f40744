"""The databases the HTTP API answers over: one router's database, or each store of a
:class:`~statifier.router.ShardedRouter` (decision 0119).

A :class:`Store` is what the API needs of one database: its router, the console's
reads and audit trail over it, and its bulk runs. :class:`Stores` finds the store of
an execution by its bucket, lists over every store with one cursor
(:class:`~statifier.console.shards.ShardedQueries`), and runs a bulk action as one run
per store under one run id, its progress summed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from statifier.console.audit import Audit
from statifier.console.bulk import BulkAction, preview
from statifier.console.bulk_runs import BulkLog, BulkRuns, LoggedRun
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.console.shards import ShardedQueries
from statifier.persistence.shards import ShardMap
from statifier.router import Router, ShardedRouter

__all__ = ["Store", "Stores"]


@dataclass(frozen=True)
class Store:
    """One database: its router, the console's reads and audit trail on the router's
    engine, and the bulk runs started in it."""

    router: Router
    queries: ConsoleQueries
    audit: Audit
    runs: BulkRuns

    @classmethod
    def of(cls, router: Router) -> Store:
        """The store of ``router``'s database (blobs decoded with its storage's codec)."""
        adapter = router.adapter
        queries = ConsoleQueries(adapter.engine, adapter.tables, codec=router.storage.codec)
        audit = Audit(adapter.engine, adapter.tables)
        runs = BulkRuns(router, queries, audit, BulkLog(adapter.engine, adapter.tables))
        return cls(router, queries, audit, runs)


class Stores:
    """The stores of ``routing``: one for a :class:`Router`, one per store of a
    :class:`ShardedRouter` (in its order).

    Attributes:
        all: every store.
        queries: the list's reads: one store's, or every store's merged.
    """

    def __init__(self, routing: Router | ShardedRouter) -> None:
        self.queries: ConsoleQueries | ShardedQueries
        if isinstance(routing, ShardedRouter):
            self.all: tuple[Store, ...] = tuple(Store.of(router) for router in routing.routers)
            self._map: ShardMap | None = routing.shard_map
            self.queries = ShardedQueries([store.queries for store in self.all], self._map)
        else:
            self.all = (Store.of(routing),)
            self._map = None
            self.queries = self.all[0].queries

    def number_of(self, execution_id: str) -> int:
        """The number (in :attr:`all`) of the store that holds ``execution_id``."""
        return 0 if self._map is None else self._map.store_of_id(execution_id)

    def of_execution(self, execution_id: str) -> Store:
        """The store that holds ``execution_id`` (by its bucket)."""
        return self.all[self.number_of(execution_id)]

    async def previews(self, action: BulkAction, where: ExecutionFilter) -> list[int]:
        """How many executions a run of ``action`` over ``where`` would act on now, in
        each store."""
        counts = [preview(store.queries, action, where) for store in self.all]
        return list(await asyncio.gather(*counts))

    async def start(
        self, action: BulkAction, where: ExecutionFilter, *, actor: str, selected: Sequence[int]
    ) -> str:
        """Start a run of ``action`` over ``where`` in each store whose count in
        ``selected`` (:meth:`previews`, as confirmed) is above 0, or in the first store
        when none is, all under one run id; answer the id.

        Raises:
            sqlalchemy.exc.DBAPIError: a store's row could not be written (the stores
                started before it run on).
        """
        run_id = uuid.uuid4().hex
        chosen = [number for number, count in enumerate(selected) if count] or [0]
        for number in chosen:
            await self.all[number].runs.start(
                action, where, actor=actor, selected=selected[number], run_id=run_id
            )
        return run_id

    async def progress(self, run_id: str) -> tuple[LoggedRun, str] | None:
        """The run ``run_id`` over every store that holds a part of it, with its state
        (:meth:`BulkRuns.state`): counts summed, the first error, the earliest start and
        latest change, finished once every part is, and ``running`` while any part
        runs here; ``None`` when no store has it."""
        rows = await asyncio.gather(*(store.runs.log.get(run_id) for store in self.all))
        parts = [(store, run) for store, run in zip(self.all, rows, strict=True) if run]
        if not parts:
            return None
        runs = [run for _, run in parts]
        states = {store.runs.state(run) for store, run in parts}
        state = next((s for s in ("running", "unfinished", "stopped") if s in states), "finished")
        if len(runs) == 1:
            return runs[0], state
        first = runs[0]
        counted = first.progress
        for run in runs[1:]:
            counted = dataclasses.replace(
                counted,
                selected=counted.selected + run.progress.selected,
                done=counted.done + run.progress.done,
                skipped=counted.skipped + run.progress.skipped,
                failed=counted.failed + run.progress.failed,
                parked=counted.parked + run.progress.parked,
                last_error=counted.last_error or run.progress.last_error,
            )
        ends = [run.finished_at for run in runs]
        merged = dataclasses.replace(
            first,
            progress=counted,
            error=next((run.error for run in runs if run.error is not None), None),
            started_at=min(run.started_at for run in runs),
            updated_at=max(run.updated_at for run in runs),
            finished_at=None if None in ends else max(end for end in ends if end is not None),
        )
        return merged, state

    async def close(self) -> None:
        """Stop every store's bulk runs (:meth:`BulkRuns.close`)."""
        for store in self.all:
            await store.runs.close()
