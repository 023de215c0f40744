"""The databases the console and the HTTP API act on: one router's database, or each
store of a :class:`~statifier.router.ShardedRouter` (decision 0119).

A :class:`Store` is what an action needs of one database: its router, the console's
reads and audit trail over it, and its bulk runs. :class:`Stores` finds the store of
an execution by its bucket and the store of a dead letter by the number its link
carries (:meth:`Stores.row`), lists over every store with one cursor
(:class:`~statifier.console.shards.ShardedQueries`,
:class:`~statifier.console.shards.ShardedAudit`), and runs a bulk action as one run
per store under one run id, its progress summed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scriba.sql.tables import Tables as ScribaTables
from statifier.console.audit import Audit
from statifier.console.bulk import BulkAction, preview, stored_migration
from statifier.console.bulk_runs import LATEST_RUNS, BulkLog, BulkRuns, LoggedRun
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.console.shards import ShardedAudit, ShardedQueries, in_store
from statifier.persistence import ChartNotFound, ChartRetired
from statifier.persistence.shards import ShardMap
from statifier.router import Router, ShardedRouter

__all__ = ["BadStore", "Store", "Stores"]

_STATES: Final = ("running", "unfinished", "stopped")
"""A run's states over its parts, the first any part is in winning (else finished)."""


class BadStore(ValueError):  # noqa: N818 - names the finding
    """A row's link names no store of these (:meth:`Stores.row`); ``str()`` says why."""


@dataclass(frozen=True)
class Store:
    """One database: its router, the console's reads and audit trail on the router's
    engine, and the bulk runs started in it."""

    router: Router
    queries: ConsoleQueries
    audit: Audit
    runs: BulkRuns

    @classmethod
    def of(cls, router: Router, *, scriba: ScribaTables | None = None) -> Store:
        """The store of ``router``'s database (blobs decoded with its storage's codec;
        ``scriba``: scriba's tables there, to show projections)."""
        adapter = router.adapter
        queries = ConsoleQueries(
            adapter.engine, adapter.tables, scriba=scriba, codec=router.storage.codec
        )
        return cls.on(router, queries, Audit(adapter.engine, adapter.tables))

    @classmethod
    def on(cls, router: Router, queries: ConsoleQueries, audit: Audit) -> Store:
        """The store of ``router`` read with ``queries`` and recorded in ``audit``,
        which must be over the same database as the router."""
        adapter = router.adapter
        return cls(
            router,
            queries,
            audit,
            BulkRuns(router, queries, audit, BulkLog(adapter.engine, adapter.tables)),
        )


class Stores:
    """The stores acted on: one database (``shard_map`` ``None``), or the stores of a
    :class:`ShardedRouter`, in the order of ``shard_map``'s ranges.

    Attributes:
        all: every store.
        queries: the lists' reads: one store's, or every store's merged.
        audit: the audit trail's reads: one store's, or every store's merged.

    Raises:
        ValueError: no store, several stores without a map, or a map with another
            number of ranges than stores.
    """

    def __init__(self, stores: Sequence[Store], shard_map: ShardMap | None = None) -> None:
        if not stores or (shard_map is None and len(stores) != 1):
            raise ValueError(f"{len(stores)} stores need a shard map, one store none")
        self.all = tuple(stores)
        self._map = shard_map
        self.queries: ConsoleQueries | ShardedQueries = self.all[0].queries
        self.audit: Audit | ShardedAudit = self.all[0].audit
        if shard_map is not None:
            self.queries = ShardedQueries([store.queries for store in self.all], shard_map)
            self.audit = ShardedAudit([store.audit for store in self.all])

    @classmethod
    def of(cls, routing: Router | ShardedRouter, *, scriba: ScribaTables | None = None) -> Stores:
        """The stores of ``routing``: one for a :class:`Router`, one per store of a
        :class:`ShardedRouter`. ``scriba``'s tables are read in the first store, the
        database that holds the service's own tables (0119)."""
        if not isinstance(routing, ShardedRouter):
            return cls([Store.of(routing, scriba=scriba)])
        stores = [
            Store.of(router, scriba=scriba if number == 0 else None)
            for number, router in enumerate(routing.routers)
        ]
        return cls(stores, routing.shard_map)

    @property
    def first(self) -> Store:
        """The first store: over several, the one holding the schedules (0119)."""
        return self.all[0]

    def number_of(self, execution_id: str) -> int:
        """The number (in :attr:`all`) of the store that holds ``execution_id``."""
        return 0 if self._map is None else self._map.store_of_id(execution_id)

    def of_execution(self, execution_id: str) -> Store:
        """The store that holds ``execution_id`` (by its bucket)."""
        return self.all[self.number_of(execution_id)]

    def row_text(self, number: int, row_id: Any) -> str:
        """How a link names the row ``row_id`` of store ``number``: the id alone over
        one database, ``N.ID`` over several (a row id names a row of one store only)."""
        return str(row_id) if self._map is None else f"{number}.{row_id}"

    def row(self, text: str) -> tuple[Store, str]:
        """The store and the row id a link's ``text`` (:meth:`row_text`) names.

        Raises:
            BadStore: over several stores, ``text`` is not ``N.ID`` with ``N`` the
                number of one of them.
        """
        if self._map is None:
            return self.all[0], text
        number, dot, row = text.partition(".")
        if not dot or not number.isdigit() or int(number) >= len(self.all) or not row:
            raise BadStore(
                f"{text[:40]!r} names no row of a store: STORE.ID, STORE from 0 to "
                f"{len(self.all) - 1}"
            )
        return self.all[int(number)], row

    async def previews(self, action: BulkAction, where: ExecutionFilter) -> list[int]:
        """How many executions a run of ``action`` over ``where`` would act on now, in
        each store."""
        count = len(self.all)
        counts = [
            in_store(n, count, preview(store.queries, action, where))
            for n, store in enumerate(self.all)
        ]
        return list(await asyncio.gather(*counts))

    async def migration(
        self, revision: str, *, state_map: Mapping[str, str | None], data: Mapping[str, Any]
    ) -> BulkAction:
        """The bulk migration onto the stored ``revision``
        (:func:`~statifier.console.bulk.stored_migration`), read from the first store
        that holds it: a revision is saved where an execution ran it.

        Raises:
            ChartNotFound, ChartRetired: no store holds it (retired, when a store
                retired it).
        """
        missing: ChartNotFound | ChartRetired | None = None
        for store in self.all:
            try:
                return await stored_migration(
                    store.router, revision, state_map=state_map, data=data
                )
            except (ChartNotFound, ChartRetired) as error:
                # A store that retired it says more than one that never held it.
                missing = missing if isinstance(missing, ChartRetired) else error
        assert missing is not None  # there is at least one store
        raise missing

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
        count = len(self.all)
        rows = await asyncio.gather(
            *(in_store(n, count, store.runs.log.get(run_id)) for n, store in enumerate(self.all))
        )
        parts = [(store, run) for store, run in zip(self.all, rows, strict=True) if run]
        return _summed(parts) if parts else None

    async def latest(self) -> list[tuple[LoggedRun, str]]:
        """The latest runs started (:meth:`BulkLog.latest` of each store, at most
        :data:`~statifier.console.bulk_runs.LATEST_RUNS`), each summed over the stores
        whose latest hold a part of it (as :meth:`progress`), newest first."""
        count = len(self.all)
        found = await asyncio.gather(
            *(in_store(n, count, store.runs.log.latest()) for n, store in enumerate(self.all))
        )
        parts: dict[str, list[tuple[Store, LoggedRun]]] = {}
        for store, runs in zip(self.all, found, strict=True):
            for run in runs:
                parts.setdefault(run.run_id, []).append((store, run))
        summed = [_summed(of_run) for of_run in parts.values()]
        return sorted(summed, key=lambda pair: pair[0].started_at, reverse=True)[:LATEST_RUNS]

    def cancel(self) -> None:
        """Stop every store's running bulk runs where they are
        (:meth:`BulkRuns.cancel`)."""
        for store in self.all:
            store.runs.cancel()

    async def close(self) -> None:
        """Stop every store's bulk runs (:meth:`BulkRuns.close`), every one even when
        an earlier close raises (then raised)."""
        async with contextlib.AsyncExitStack() as closing:
            for store in reversed(self.all):  # closed in store order
                closing.push_async_callback(store.runs.close)


def _summed(parts: Sequence[tuple[Store, LoggedRun]]) -> tuple[LoggedRun, str]:
    """One run from its parts in several stores (:meth:`Stores.progress`)."""
    runs = [run for _, run in parts]
    states = {store.runs.state(run) for store, run in parts}
    state = next((s for s in _STATES if s in states), "finished")
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
            raised_errors=counted.raised_errors + run.progress.raised_errors,
            last_raised_error=counted.last_raised_error or run.progress.last_raised_error,
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
