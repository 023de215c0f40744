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
ends it writes one more row, for the run itself (action ``bulk``), with its counts;
outcome ``stopped`` when it ended early (cancelled, or an error such as the database
going down), saying why.

A resume steps in what each execution held while paused. An execution whose held
events raised an error event no transition took (what makes ``statifier executions
resume`` exit 1) is resumed all the same and counted ``done``, and also under
:attr:`BulkProgress.raised_errors`, with the last such error; its audit row says how
many it raised. Each error stays among its execution's errors, as a step records it.

A run stopped midway (the process killed, say) is resumed by running it again: what it
did stays done and is skipped, the rest is done; each execution still has exactly one
row for it.

:mod:`statifier.console.bulk_runs` records runs in the database and starts them in the
background of a server.

>>> sorted(BULK_ACTIONS)
['cancel', 'pause', 'resume', 'retry']
>>> BULK_ACTIONS["pause"].applies_to
frozenset({<Status.ACTIVE: 'active'>})
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypedDict

from statifier.chart import Machine
from statifier.console import actions
from statifier.console.actions import Action, Done, Refused
from statifier.console.audit import Audit, AuditEntry
from statifier.console.queries import (
    MAX_PAGE,
    ConsoleQueries,
    ExecutionFilter,
)
from statifier.error_text import error_text
from statifier.expr import Value
from statifier.persistence import Status, database_down
from statifier.persistence.sql import SqlTransaction
from statifier.router import Router

__all__ = [
    "BULK_ACTIONS",
    "BulkAction",
    "BulkProgress",
    "bulk_action",
    "counts",
    "migration",
    "preview",
    "run_bulk",
    "stored_migration",
]

_log = logging.getLogger("statifier.console")

_HOLDING: Final = frozenset({Status.ACTIVE, Status.NEEDS_MIGRATION, Status.PAUSED})


class Selection(TypedDict):
    """The narrowing of a bulk action, as :class:`ConsoleQueries` ``count`` and
    ``executions`` take it."""

    among: frozenset[Status]
    off_revision: str | None
    dead_letters: bool


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
        state_map, data: ``migrate``: the plan's, as :func:`migration` was given them.
        document: ``migrate``: the chart name of the revision; a run selects only the
            executions of that name (a filter naming another document selects none).
    """

    name: str
    act: Action
    applies_to: frozenset[Status]
    revision: str | None = None
    dead_letters: bool = False
    said: str = ""
    state_map: Mapping[str, str | None] = field(default_factory=dict)
    data: Mapping[str, Value] = field(default_factory=dict)
    document: str | None = None

    def selection(self) -> Selection:
        """How it narrows a list or a count of :class:`ConsoleQueries` beyond the
        filter (``among``, ``off_revision``, ``dead_letters``): the preview counts, and
        the run walks, the same executions."""
        return {
            "among": self.applies_to,
            "off_revision": self.revision,
            "dead_letters": self.dead_letters,
        }

    def narrowed(self, where: ExecutionFilter) -> ExecutionFilter | None:
        """``where`` as this action reads it: a migration's limited to its chart's
        name (a revision saved without one is not narrowed: each execution's action
        still refuses a chart of another name); ``None`` when that leaves nothing
        (``where`` names another document)."""
        if self.name != "migrate" or self.document is None:
            return where
        if where.document not in (None, self.document):
            return None
        return replace(where, document=self.document)


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
    parked and counted under :attr:`BulkProgress.parked`. A run of it selects only the
    executions of ``target``'s chart name (:meth:`BulkAction.narrowed`).
    """
    content_hash = target.identity.content_hash
    return BulkAction(
        "migrate",
        actions.migrate_to(target, state_map=state_map, data=data),
        _HOLDING,
        revision=content_hash,
        said=f"migrate to revision {content_hash[:12]}",
        state_map=dict(state_map or {}),
        data=dict(data or {}),
        document=target.identity.name,
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
        raised_errors: ``resume``: executions resumed (counted under ``done``) whose
            held events raised an error event no transition took.
        last_raised_error: the last such error, as ``"EXECUTION_ID: NAME at <ELEMENT>,
            line L, column C (no transition took it)"``: where the chart raised it,
            not its message (``None``: none).
    """

    action: str
    selected: int
    done: int = 0
    skipped: int = 0
    failed: int = 0
    parked: int = 0
    last_error: str | None = None
    raised_errors: int = 0
    last_raised_error: str | None = None

    @property
    def seen(self) -> int:
        """Executions the run has come to."""
        return self.done + self.skipped + self.failed + self.parked


def counts(progress: BulkProgress) -> str:
    """``progress``'s counts in one line: parked and raised errors only when there are
    some.

    >>> counts(BulkProgress("resume", 3, done=3, raised_errors=1))
    '3 done, 0 skipped, 0 failed, 1 raised errors'
    """
    said = f"{progress.done} done, {progress.skipped} skipped, {progress.failed} failed"
    if progress.parked:
        said += f", {progress.parked} parked"
    if progress.raised_errors:
        said += f", {progress.raised_errors} raised errors"
    return said


async def preview(queries: ConsoleQueries, action: BulkAction, where: ExecutionFilter) -> int:
    """How many executions a run of ``action`` over ``where`` would act on now."""
    selected = action.narrowed(where)
    if selected is None:
        return 0
    return await queries.count(selected, **action.selection())


async def run_bulk(
    router: Router,
    queries: ConsoleQueries,
    audit: Audit,
    action: BulkAction,
    where: ExecutionFilter,
    *,
    actor: str,
    page: int = 200,
    selected: int | None = None,
    progress: Callable[[BulkProgress], Awaitable[object]] | None = None,
    each: Callable[[BulkProgress], object] | None = None,
) -> BulkProgress:
    """Act with ``action`` on every execution ``where`` selects (see the module
    docstring); ``progress`` is told (and awaited) after each page. Each execution's
    audit row names ``actor`` and, in its detail, the run. ``selected`` is what the
    preview the run was confirmed with counted (``None``: it is counted now).

    Raises:
        ValueError: ``page`` outside ``1..MAX_PAGE``.
        Exception: what reading the list raised (what was done stays done).
    """
    if not 1 <= page <= MAX_PAGE:
        raise ValueError(f"page is 1 to {MAX_PAGE} executions, not {page!r}")
    if selected is None:
        selected = await preview(queries, action, where)
    state = BulkProgress(action.name, selected)
    said = f"bulk {action.said} of {state.selected} selected"
    walked = action.narrowed(where)
    cursor: str | None = None
    try:
        while walked is not None:
            # What the preview counted, not every execution of the filter: the others
            # would be counted skipped, and (retry) each tried in a transaction of its own.
            listed = await queries.executions(
                walked, cursor=cursor, size=page, **action.selection()
            )
            for row in listed.rows:
                state = await _one(router, audit, action, row.id, actor, said, state)
                if each is not None:  # the counts as of this execution, for a stop here
                    each(state)
            if progress is not None:
                await progress(state)
            cursor = listed.next_cursor
            if cursor is None:
                break
    except (Exception, asyncio.CancelledError) as stopped:
        await _record_stop(audit, actor, action, said, state, stopped)
        raise
    await audit.record(_run_entry(actor, action, f"{said}: {counts(state)}", state))
    return state


def _run_entry(actor: str, action: BulkAction, detail: str, state: BulkProgress) -> AuditEntry:
    """The run's own audit row (action ``bulk``): ``detail``, then its last failures."""
    if state.last_error is not None:
        detail += f"; last failure: {state.last_error}"
    if state.last_raised_error is not None:
        detail += f"; last error raised: {state.last_raised_error}"
    outcome = "failed" if state.failed else "done"
    return AuditEntry(actor, action="bulk", target=action.name, outcome=outcome, detail=detail)


async def _record_stop(
    audit: Audit,
    actor: str,
    action: BulkAction,
    said: str,
    state: BulkProgress,
    stopped: BaseException,
) -> None:
    """The run's row for a run that ended early (outcome ``stopped``): cancelled (its
    process stopping, Ctrl-C) or an error (the database down, the list unreadable).
    Where the row cannot be written (the database down), a warning says so; the
    caller re-raises what stopped the run either way."""
    why = "cancelled" if isinstance(stopped, asyncio.CancelledError) else error_text(stopped)
    detail = f"{said}: {counts(state)}; stopped ({why}) before the rest"
    entry = replace(_run_entry(actor, action, detail, state), outcome="stopped")
    try:
        await audit.record(entry)
    except Exception as unwritten:  # noqa: BLE001 - told, and the stop re-raised
        _log.warning(
            "console: bulk %s stopped (%s) and its audit row could not be written: %s",
            action.name,
            why,
            error_text(unwritten),
        )


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
    except Exception as error:
        if database_down(error):
            # No fault of this execution: the rest would fail the same way, each after
            # its wait for a connection. The run stops; run again, it does the rest.
            raise
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
    if done.raised:
        last = f"{execution_id}: {actions.placed(done.raised[-1])}"
        return replace(
            state,
            done=state.done + 1,
            raised_errors=state.raised_errors + 1,
            last_raised_error=last,
        )
    return replace(state, done=state.done + 1)
