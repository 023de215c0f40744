"""Actions on many executions at once, chosen by the executions list's filter: cancel,
pause, resume, migrate to a revision, or retry the dead outbox rows of each one it
selects.

:func:`preview` counts what a run would act on now; :func:`run_bulk` acts. A run walks
the executions the filter selects, newest first, a page at a time (the list's keyset
walk, which an action does not disturb: it changes no creation time), and acts on each
through the console's action of one execution (:mod:`statifier.console.actions`), in a
transaction of its own with its audit row: an execution is acted on, with its row,
once or not at all, whatever stops the run. An execution the action does not apply to
(cancel: ended; pause: not active; resume: not paused; migrate: ended or on the
revision already; retry: no dead outbox row) is skipped, with no row. When the run
ends it writes one more row, for the run itself (action ``bulk``), with its counts.

A run stopped midway (the process killed, say) is resumed by running it again: what it
did stays done and is skipped, the rest is done; each execution still has exactly one
row for it.

:class:`BulkRuns` starts runs in the background of a server (the console's page, the
API's ``/bulk``) and keeps the latest for their progress pages; what they hold lives
in that process (the audit table is what outlives it).

>>> sorted(BULK_ACTIONS)
['cancel', 'pause', 'resume', 'retry']
>>> BULK_ACTIONS["pause"].applies_to
frozenset({<Status.ACTIVE: 'active'>})
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from statifier.chart import Machine
from statifier.console import actions
from statifier.console.actions import Action, Done, Refused
from statifier.console.audit import Audit, AuditEntry
from statifier.console.queries import (
    MAX_PAGE,
    ConsoleQueries,
    ExecutionFilter,
    ExecutionSummary,
)
from statifier.expr import Value
from statifier.persistence import Status
from statifier.persistence.sql import SqlTransaction
from statifier.router import Router

__all__ = [
    "BULK_ACTIONS",
    "KEPT_RUNS",
    "BulkAction",
    "BulkProgress",
    "BulkRun",
    "BulkRuns",
    "bulk_action",
    "migration",
    "preview",
    "run_bulk",
    "stored_migration",
]

_log = logging.getLogger("statifier.console")

KEPT_RUNS: Final = 100
"""How many runs :class:`BulkRuns` keeps for their progress (the oldest finished go first)."""

_HOLDING: Final = frozenset({Status.ACTIVE, Status.NEEDS_MIGRATION, Status.PAUSED})


@dataclass(frozen=True, slots=True)
class BulkAction:
    """What a run does to each execution it selects.

    Attributes:
        name: the action's name, in the audit rows (``cancel``, ``pause``,
            ``resume``, ``migrate``, ``retry``).
        act: the action on one execution.
        applies_to: the statuses it applies to; the run skips the others untried.
        revision: ``migrate``: the content hash of the revision executions move to;
            those on it already are skipped.
        dead_letters: ``retry``: it applies only to executions that sent an outbox row
            now dead.
        said: what it does, in a few words, for the run's audit row and the pages.
    """

    name: str
    act: Action
    applies_to: frozenset[Status]
    revision: str | None = None
    dead_letters: bool = False
    said: str = ""

    def applies(self, row: ExecutionSummary) -> bool:
        """Whether the listed ``row`` is one to try (the action may still refuse it)."""
        return row.status in self.applies_to and row.content_hash != self.revision


BULK_ACTIONS: Final[Mapping[str, BulkAction]] = {
    "cancel": BulkAction("cancel", actions.cancel, _HOLDING, said="cancel"),
    "pause": BulkAction("pause", actions.pause, frozenset({Status.ACTIVE}), said="pause"),
    "resume": BulkAction("resume", actions.resume, frozenset({Status.PAUSED}), said="resume"),
    "retry": BulkAction(
        "retry",
        actions.retry_dead_letters,
        frozenset(Status),
        dead_letters=True,
        said="retry the dead outbox rows",
    ),
}
"""The actions a run takes that need nothing more than their name; ``migrate`` is
made by :func:`migration`, for one revision."""


def bulk_action(name: str) -> BulkAction:
    """The action of ``name`` in :data:`BULK_ACTIONS`.

    Raises:
        ValueError: an unknown name (``migrate`` too: it is :func:`migration`'s).
    """
    found = BULK_ACTIONS.get(name)
    if found is None:
        known = ", ".join(BULK_ACTIONS)
        raise ValueError(f"unknown bulk action {name!r}; one of {known}, or migrate to a revision")
    return found


def migration(
    target: Machine,
    *,
    state_map: Mapping[str, str | None] | None = None,
    data: Mapping[str, Value] | None = None,
) -> BulkAction:
    """The action that moves each execution onto the revision ``target`` from the one
    it runs, by state id (``state_map`` and ``data`` as
    :class:`~statifier.persistence.MigrationPlan` takes them): see
    :func:`statifier.console.actions.migrate_to`. One the revision cannot carry is
    parked and counted under :attr:`BulkProgress.parked`.
    """
    content_hash = target.identity.content_hash
    return BulkAction(
        "migrate",
        actions.migrate_to(target, state_map=state_map, data=data),
        _HOLDING,
        revision=content_hash,
        said=f"migrate to revision {content_hash[:12]}",
    )


async def stored_migration(
    router: Router,
    revision: str,
    *,
    state_map: Mapping[str, str | None] | None = None,
    data: Mapping[str, Value] | None = None,
) -> BulkAction:
    """:func:`migration` onto the chart the store holds under the content hash
    ``revision``.

    Raises:
        ChartNotFound: the store holds no chart of that hash.
        ChartRetired: it was retired.
        StoredChartDamaged: its stored source does not compile to that hash.
    """
    target = await router.storage.machine(revision)
    return migration(target, state_map=state_map, data=data)


@dataclass(frozen=True, slots=True)
class BulkProgress:
    """How far a run has come.

    Attributes:
        action: the action's name.
        selected: what :func:`preview` counted when the run started.
        done: executions acted on (each with its audit row).
        skipped: executions the action did not apply to (when the run came to them).
        failed: executions whose action failed (logged; no row of theirs, nothing done).
        parked: ``migrate``: executions the revision could not carry, parked instead
            (each with its audit row; not counted under ``done``).
        last_error: the last failure, as ``"ErrorClass: message"`` (``None``: none).
    """

    action: str
    selected: int
    done: int = 0
    skipped: int = 0
    failed: int = 0
    parked: int = 0
    last_error: str | None = None

    @property
    def seen(self) -> int:
        """Executions the run has come to."""
        return self.done + self.skipped + self.failed + self.parked


async def preview(queries: ConsoleQueries, action: BulkAction, where: ExecutionFilter) -> int:
    """How many executions a run of ``action`` over ``where`` would act on now."""
    return await queries.count(
        where,
        among=action.applies_to,
        off_revision=action.revision,
        dead_letters=action.dead_letters,
    )


async def run_bulk(
    router: Router,
    queries: ConsoleQueries,
    audit: Audit,
    action: BulkAction,
    where: ExecutionFilter,
    *,
    actor: str,
    page: int = 200,
    progress: Callable[[BulkProgress], object] | None = None,
) -> BulkProgress:
    """Act with ``action`` on every execution ``where`` selects (see the module
    docstring); ``progress`` is told after each page. Each execution's audit row names
    ``actor`` and, in its detail, the run.

    Raises:
        ValueError: ``page`` outside ``1..MAX_PAGE``.
        Exception: what reading the list raised (what was done stays done).
    """
    if not 1 <= page <= MAX_PAGE:
        raise ValueError(f"page is 1 to {MAX_PAGE} executions, not {page!r}")
    state = BulkProgress(action.name, await preview(queries, action, where))
    said = f"bulk {action.said} of {state.selected} selected"
    cursor: str | None = None
    while True:
        listed = await queries.executions(where, cursor=cursor, size=page)
        for row in listed.rows:
            if not action.applies(row):
                state = replace(state, skipped=state.skipped + 1)
                continue
            state = await _one(router, audit, action, row.id, actor, said, state)
        if progress is not None:
            progress(state)
        cursor = listed.next_cursor
        if cursor is None:
            break
    detail = f"{said}: {state.done} done, {state.skipped} skipped, {state.failed} failed" + (
        f", {state.parked} parked" if state.parked else ""
    )
    if state.last_error is not None:
        detail += f"; last failure: {state.last_error}"
    outcome = "failed" if state.failed else "done"
    await audit.record(
        AuditEntry(actor, action="bulk", target=action.name, outcome=outcome, detail=detail)
    )
    return state


async def _one(
    router: Router,
    audit: Audit,
    action: BulkAction,
    execution_id: str,
    actor: str,
    said: str,
    state: BulkProgress,
) -> BulkProgress:
    async def record(tx: SqlTransaction, done: Done) -> None:
        detail = f"{done.summary} ({said})"
        outcome = "parked" if done.parked else "done"
        entry = AuditEntry(
            actor, action=action.name, target=execution_id, outcome=outcome, detail=detail
        )
        await audit.record_in(tx, entry)

    try:
        done = await action.act(router, execution_id, record=record)
    except Refused:  # it changed since it was listed: no longer one to act on
        return replace(state, skipped=state.skipped + 1)
    except Exception as error:  # noqa: BLE001 - one execution's failure, the run goes on
        _log.error(
            "console: bulk %s of execution %s failed: %s: %s",
            action.name,
            execution_id,
            type(error).__name__,
            error,
            exc_info=error,
            extra={"execution_id": execution_id},
        )
        said = f"{type(error).__name__}: {error}"
        return replace(state, failed=state.failed + 1, last_error=said)
    if done.parked:
        return replace(state, parked=state.parked + 1)
    return replace(state, done=state.done + 1)


@dataclass(eq=False, slots=True)
class BulkRun:
    """A run :class:`BulkRuns` started: its progress as last told, and how it ended.

    Attributes:
        id: its id (random, hard to guess), for its progress page.
        action, where, actor: what it does, to what, for whom.
        started: when it started (UTC).
        progress: as the run last told it (after each page, then at the end).
        error: why it stopped early, ``"ErrorClass: message"`` (``None``: it did not).
    """

    id: str
    action: BulkAction
    where: ExecutionFilter
    actor: str
    started: datetime
    progress: BulkProgress
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        """Whether it has ended, done or stopped."""
        return self.task is not None and self.task.done()


class BulkRuns:
    """Runs in the background of a server, the latest :data:`KEPT_RUNS` kept (oldest
    finished first dropped) for their progress; :meth:`close` stops those still going
    (what they did stays done: starting the same run again does the rest)."""

    def __init__(self, router: Router, queries: ConsoleQueries, audit: Audit) -> None:
        self.router, self.queries, self.audit = router, queries, audit
        self._runs: OrderedDict[str, BulkRun] = OrderedDict()

    def start(
        self, action: BulkAction, where: ExecutionFilter, *, actor: str, selected: int
    ) -> BulkRun:
        """Start ``action`` over ``where`` for ``actor``; ``selected`` is what the
        preview the operator confirmed counted. Call it on the server's event loop."""
        run = BulkRun(
            uuid.uuid4().hex,
            action,
            where,
            actor,
            datetime.now(UTC),
            BulkProgress(action.name, selected),
        )
        run.task = asyncio.create_task(self._run(run), name=f"bulk {action.name} {run.id}")
        self._runs[run.id] = run
        while len(self._runs) > KEPT_RUNS:
            oldest = next((r for r in self._runs.values() if r.finished), None)
            if oldest is None:
                break
            del self._runs[oldest.id]
        return run

    def get(self, run_id: str) -> BulkRun | None:
        """The run of ``run_id``, if it is still kept."""
        return self._runs.get(run_id)

    def latest(self) -> list[BulkRun]:
        """The runs kept, newest first."""
        return list(reversed(self._runs.values()))

    def cancel(self) -> list[asyncio.Task[None]]:
        """Stop the runs still going (each is cancelled where it is: the execution it
        was acting on is rolled back); answer their tasks."""
        running = [r.task for r in self._runs.values() if r.task is not None and not r.finished]
        for task in running:
            task.cancel()
        return running

    async def close(self) -> None:
        """:meth:`cancel`, and wait for the runs to stop."""
        await asyncio.gather(*self.cancel(), return_exceptions=True)

    async def _run(self, run: BulkRun) -> None:
        def told(progress: BulkProgress) -> None:
            run.progress = progress

        try:
            run.progress = await run_bulk(
                self.router,
                self.queries,
                self.audit,
                run.action,
                run.where,
                actor=run.actor,
                progress=told,
            )
        except asyncio.CancelledError:
            run.error = "stopped: the server stopped; start it again to do the rest"
            raise
        except Exception as error:  # noqa: BLE001 - told on its page and logged
            run.error = f"{type(error).__name__}: {error}"
            _log.error(
                "console: bulk %s run %s by %s stopped: %s",
                run.action.name,
                run.id,
                run.actor,
                run.error,
                exc_info=error,
            )
