"""Bulk runs recorded in the database (the ``bulk_runs`` table), and started in the
background of a server.

A recorded run has its row written before it acts (:meth:`BulkLog.start`: the action
and its plan, the filter as the executions list's query fields, who started it and
what the preview counted), its counts after each page, and its end (``finished_at``;
``error`` when it stopped early). A resume's executions whose held events raised
errors (:attr:`BulkProgress.raised_errors` and the last such error) have no column of
their own: the row's ``plan`` document keeps them, under ``raised_errors`` (see
:meth:`BulkLog.progress`). Any process reads the rows: the console shows the
runs the API, the command or another console started. A run with no end that no
process is running was interrupted (its process was killed, say): it is run again from
its row (:func:`action_of` and :attr:`LoggedRun.selection`), which is safe, as running
a bulk action again always is: what was done is skipped.

:class:`BulkRuns` starts recorded runs as tasks of a server (the console's bulk page,
the API's ``/bulk``) and knows which of them run there.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier import telemetry
from statifier.console.audit import Audit
from statifier.console.bulk import (
    BulkAction,
    BulkProgress,
    bulk_action,
    counts,
    run_bulk,
    stored_migration,
)
from statifier.console.queries import (
    ConsoleQueries,
    ExecutionFilter,
    filter_from_query,
    filter_query,
)
from statifier.expr import Value, tagged
from statifier.extras import MissingExtra
from statifier.router import Router
from statifier.sql.engines import run_on
from statifier.sql.tables import Tables

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "LATEST_RUNS",
    "STOPPED",
    "BulkLog",
    "BulkRuns",
    "LoggedRun",
    "action_of",
    "run_recorded",
]

_log = logging.getLogger("statifier.console")

_RAISED: Final = "raised_errors"
"""The key of the ``plan`` document under which a run's row keeps its raised errors."""

LATEST_RUNS: Final = 20
"""How many runs :meth:`BulkLog.latest` answers by default."""

STOPPED: Final = "stopped: the process stopped; run it again to do the rest"
"""The ``error`` of a run whose server stopped it (cancelled) before its end."""


@dataclass(frozen=True, slots=True)
class LoggedRun:
    """A run's row.

    Attributes:
        run_id: its id (random).
        action: its action's name; ``revision``, ``state_map`` and ``data`` its
            migration's (``migrate`` only).
        selection: the executions list's query fields of the filter it walks
            (:func:`statifier.console.queries.filter_from_query` reads them).
        actor: who started it.
        progress: its counts as of ``updated_at``.
        error: why it stopped early, if it did.
        started_at, updated_at: when it started, when its row last changed.
        finished_at: when it ended, ``None`` while it has not (running, or interrupted).
    """

    run_id: str
    action: str
    revision: str | None
    state_map: Mapping[str, str | None]
    data: Mapping[str, Value]
    selection: Mapping[str, str]
    actor: str
    progress: BulkProgress
    error: str | None
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether it has ended, done or stopped."""
        return self.finished_at is not None

    @property
    def where(self) -> ExecutionFilter:
        """The filter it walks.

        Raises:
            BadFilter: the row's selection does not parse (written by hand).
        """
        return filter_from_query(self.selection)


class BulkLog:
    """The ``bulk_runs`` rows of one database, read and written through SQLAlchemy
    Core, each write in a transaction of its own."""

    def __init__(self, engine: sa.Engine | AsyncEngine, tables: Tables) -> None:
        self.engine, self.tables = engine, tables

    async def start(
        self,
        run_id: str,
        action: BulkAction,
        where: ExecutionFilter,
        *,
        actor: str,
        selected: int,
        now: datetime,
    ) -> None:
        """Write the row of a run about to act."""
        plan = None
        if action.name == "migrate":
            data = {name: tagged.encode(value) for name, value in action.data.items()}
            plan = {"map": dict(action.state_map), "data": data}
        values = {
            "run_id": run_id,
            "action": action.name,
            "revision": action.revision,
            "plan": plan,
            "selection": filter_query(where),
            "actor": actor,
            "selected": selected,
            "done": 0,
            "skipped": 0,
            "failed": 0,
            "parked": 0,
            "started_at": now,
            "updated_at": now,
        }
        new_key = self.tables.options.new_key
        if new_key is not None:  # keys the tables' options make, not the database
            values["id"] = new_key()
        await self._write(self.tables.bulk_runs.insert().values(**values))

    async def progress(self, run_id: str, progress: BulkProgress, now: datetime) -> None:
        """Write how far the run has come. Its raised errors, once it has some, go
        into the row's ``plan`` document beside what a migration keeps there (the
        table has no column for them, and a column takes a migration): ``{"count": N,
        "last": TEXT}`` under the key ``raised_errors``; a row without it has none."""
        await self._update(run_id, progress, now)

    async def finish(
        self, run_id: str, progress: BulkProgress, error: str | None, now: datetime
    ) -> None:
        """Write the run's end: its counts (as :meth:`progress`), and ``error`` if it
        stopped early."""
        await self._update(run_id, progress, now, error=error, finished_at=now)

    async def get(self, run_id: str) -> LoggedRun | None:
        """The run of ``run_id``, if there is one."""
        runs = self.tables.bulk_runs
        rows = await self._read(sa.select(runs).where(runs.c.run_id == run_id))
        return rows[0] if rows else None

    async def latest(self, limit: int = LATEST_RUNS) -> list[LoggedRun]:
        """The latest ``limit`` runs started, newest first."""
        runs = self.tables.bulk_runs
        newest = sa.select(runs).order_by(runs.c.started_at.desc(), runs.c.id.desc()).limit(limit)
        return await self._read(newest)

    async def _update(
        self, run_id: str, progress: BulkProgress, now: datetime, **ended: object
    ) -> None:
        runs = self.tables.bulk_runs
        row = runs.c.run_id == run_id
        values: dict[str, object] = {
            "done": progress.done,
            "skipped": progress.skipped,
            "failed": progress.failed,
            "parked": progress.parked,
            "last_error": None if progress.last_error is None else progress.last_error[:1000],
            "updated_at": now,
            **ended,
        }

        def write(connection: sa.Connection) -> None:
            if progress.raised_errors:
                # Read and written in one transaction: only the run's process writes
                # its row, and a migration's plan stays beside the errors.
                plan = connection.execute(sa.select(runs.c.plan).where(row)).scalar()
                last = progress.last_raised_error
                raised = {"count": progress.raised_errors, "last": last and last[:1000]}
                values["plan"] = {**(plan or {}), _RAISED: raised}
            connection.execute(runs.update().where(row).values(**values))

        await run_on(self.engine, write, write=True)

    async def _write(self, statement: sa.Executable) -> None:
        def write(connection: sa.Connection) -> None:
            connection.execute(statement)

        await run_on(self.engine, write, write=True)

    async def _read(self, statement: sa.Select[Any]) -> list[LoggedRun]:
        def read(connection: sa.Connection) -> list[LoggedRun]:
            return [_logged(row) for row in connection.execute(statement)]

        return await run_on(self.engine, read)


def _logged(row: sa.Row[Any]) -> LoggedRun:
    plan = row.plan or {}
    raised = plan.get(_RAISED) or {}
    return LoggedRun(
        run_id=row.run_id,
        action=row.action,
        revision=row.revision,
        state_map=dict(plan.get("map", {})),
        data={name: tagged.decode(value) for name, value in plan.get("data", {}).items()},
        selection=dict(row.selection),
        actor=row.actor,
        progress=BulkProgress(
            row.action,
            row.selected,
            done=row.done,
            skipped=row.skipped,
            failed=row.failed,
            parked=row.parked,
            last_error=row.last_error,
            raised_errors=int(raised.get("count", 0)),
            last_raised_error=raised.get("last"),
        ),
        error=row.error,
        started_at=row.started_at,
        updated_at=row.updated_at,
        finished_at=row.finished_at,
    )


async def action_of(router: Router, run: LoggedRun) -> BulkAction:
    """The action ``run`` took, made again to run it again.

    Raises:
        ValueError: an action this version does not know.
        ChartNotFound, ChartRetired: its migration's revision is gone.
    """
    if run.action != "migrate":
        return bulk_action(run.action)
    if run.revision is None:
        raise ValueError(f"bulk run {run.run_id} migrates to no revision")
    return await stored_migration(router, run.revision, state_map=run.state_map, data=run.data)


async def run_recorded(
    router: Router,
    queries: ConsoleQueries,
    audit: Audit,
    log: BulkLog,
    run_id: str,
    action: BulkAction,
    where: ExecutionFilter,
    *,
    actor: str,
    selected: int,
    progress: Callable[[BulkProgress], Awaitable[object]] | None = None,
) -> BulkProgress:
    """:func:`~statifier.console.bulk.run_bulk`, its row (written by
    :meth:`BulkLog.start`) kept in step: its counts after each page (``progress``
    told after that), its end; the end is reported as the telemetry event
    ``statifier.console.bulk_run``, and a run whose resumed executions raised errors
    (:attr:`BulkProgress.raised_errors`) is logged as one warning, however many they
    were. A run that raises or is cancelled has its end written with the error
    (:data:`STOPPED` when cancelled), then raises it on.
    """
    clock = router.storage.clock
    state = BulkProgress(action.name, selected)
    began = time.monotonic()

    def ended(error: str | None) -> None:
        outcome = "stopped" if error is not None else "failed" if state.failed else "finished"
        _log_end(action.name, run_id, actor, outcome, state, error)
        telemetry.report(
            "statifier.console.bulk_run",
            {
                "duration": time.monotonic() - began,
                "selected": state.selected,
                "done": state.done,
                "skipped": state.skipped,
                "failed": state.failed,
                "parked": state.parked,
                "raised_errors": state.raised_errors,
            },
            {
                "action": action.name,
                "run_id": run_id,
                "actor": actor,
                "outcome": outcome,
                "error": error,
            },
        )
        if state.raised_errors:
            # One line for the run: each error was logged by its step already, and a
            # run over thousands of executions must not add as many lines.
            _log.warning(
                "console: bulk %s run %s by %s: %d of the %d executions it resumed raised "
                "error events no transition took (each is among its execution's errors); "
                "the last: %s",
                action.name,
                run_id,
                actor,
                state.raised_errors,
                state.done,
                state.last_raised_error,
                extra={"run_id": run_id, "raised_errors": state.raised_errors},
            )

    async def told(now: BulkProgress) -> None:
        nonlocal state
        state = now
        await log.progress(run_id, now, clock())
        if progress is not None:
            await progress(now)

    def counted(now: BulkProgress) -> None:
        nonlocal state
        state = now  # the row's end, if the run stops before its next page, says these

    try:
        state = await run_bulk(
            router,
            queries,
            audit,
            action,
            where,
            actor=actor,
            selected=selected,
            progress=told,
            each=counted,
        )
    except asyncio.CancelledError:
        ended(STOPPED)
        await asyncio.shield(_finish(log, run_id, state, STOPPED, clock()))
        raise
    except Exception as error:
        said = f"{type(error).__name__}: {error}"[:1000]
        ended(said)
        await _finish(log, run_id, state, said, clock())
        raise
    ended(None)
    await log.finish(run_id, state, None, clock())
    return state


def _log_end(
    action: str, run_id: str, actor: str, outcome: str, progress: BulkProgress, error: str | None
) -> None:
    """The info line of a run's end: its outcome, counts and why it stopped, if it did."""
    _log.info(
        "console: bulk %s run %s by %s %s: %s%s",
        action,
        run_id,
        actor,
        outcome,
        counts(progress),
        "" if error is None else f" ({error})",
        extra={"run_id": run_id},
    )


async def _finish(
    log: BulkLog, run_id: str, state: BulkProgress, error: str, now: datetime
) -> None:
    """Write a stopped run's end; a failure to is logged (the row then says it never
    ended, which running it again mends)."""
    try:
        await log.finish(run_id, state, error, now)
    except Exception as failed:  # noqa: BLE001 - the run's own error is what propagates
        _log.error(
            "console: the end of bulk run %s could not be written: %s: %s",
            run_id,
            type(failed).__name__,
            failed,
        )


class BulkRuns:
    """Recorded runs started as tasks of a server; :meth:`cancel` or :meth:`close`
    stops those still going (what they did stays done: running them again does the
    rest)."""

    def __init__(self, router: Router, queries: ConsoleQueries, audit: Audit, log: BulkLog) -> None:
        self.router, self.queries, self.audit, self.log = router, queries, audit, log
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(
        self,
        action: BulkAction,
        where: ExecutionFilter,
        *,
        actor: str,
        selected: int,
        run_id: str | None = None,
    ) -> str:
        """Write the row of ``action`` over ``where`` for ``actor`` (``selected``: what
        the preview the operator confirmed counted) and start it; answer its run id
        (``run_id``, or a new random one: a run over several stores is one run id in
        each). Call it on the server's event loop.

        Raises:
            sqlalchemy.exc.DBAPIError: the row could not be written (nothing started).
        """
        run_id = uuid.uuid4().hex if run_id is None else run_id
        now = self.router.storage.clock()
        await self.log.start(run_id, action, where, actor=actor, selected=selected, now=now)
        _log.info(
            "console: bulk %s run %s by %s started: %d selected",
            action.name,
            run_id,
            actor,
            selected,
            extra={"run_id": run_id},
        )
        task = asyncio.create_task(
            self._run(run_id, action, where, actor, selected), name=f"bulk {action.name} {run_id}"
        )
        self._tasks[run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(run_id, None))
        return run_id

    def running(self, run_id: str) -> bool:
        """Whether the run of ``run_id`` is going in this process."""
        return run_id in self._tasks

    def state(self, run: LoggedRun) -> str:
        """``running`` (in this process), ``finished``, ``stopped`` (it ended early:
        its ``error`` says why) or ``unfinished``: no end recorded and not running here,
        so interrupted, or running in another process (``updated_at`` says when it
        last moved)."""
        if run.finished:
            return "finished" if run.error is None else "stopped"
        return "running" if self.running(run.run_id) else "unfinished"

    def cancel(self) -> list[asyncio.Task[None]]:
        """Stop the runs still going (each is cancelled where it is: the execution it
        was acting on is rolled back, and its row says it stopped); answer their tasks."""
        running = list(self._tasks.values())
        for task in running:
            task.cancel()
        return running

    async def close(self) -> None:
        """:meth:`cancel`, wait for the runs to stop, and make sure each one's row has
        its end (a run cancelled before its first step never wrote one)."""
        stopping = list(self._tasks)
        await asyncio.gather(*self.cancel(), return_exceptions=True)
        for run_id in stopping:
            run = await self.log.get(run_id)
            if run is not None and not run.finished:
                _log_end(run.action, run_id, run.actor, "stopped", run.progress, STOPPED)
                await _finish(self.log, run_id, run.progress, STOPPED, self.router.storage.clock())

    async def _run(
        self, run_id: str, action: BulkAction, where: ExecutionFilter, actor: str, selected: int
    ) -> None:
        try:
            await run_recorded(
                self.router,
                self.queries,
                self.audit,
                self.log,
                run_id,
                action,
                where,
                actor=actor,
                selected=selected,
            )
        except Exception as error:  # noqa: BLE001 - its row says it; logged here
            _log.error(
                "console: bulk %s run %s by %s stopped: %s: %s",
                action.name,
                run_id,
                actor,
                type(error).__name__,
                error,
                exc_info=error,
            )
