"""Actions on many executions at once, chosen by the executions list's filter: cancel,
pause or resume each one it selects.

:func:`preview` counts what a run would act on now; :func:`run_bulk` acts. A run walks
the executions the filter selects, newest first, a page at a time (the list's keyset
walk, which an action does not disturb: it changes no creation time), and acts on each
through the console's action of one execution (:mod:`statifier.console.actions`), in a
transaction of its own with its audit row: an execution is acted on, with its row,
once or not at all, whatever stops the run. An execution the action does not apply to
(cancel: ended; pause: not active; resume: not paused) is skipped, with no row. When
the run ends it writes one more row, for the run itself (action ``bulk``), with its
counts.

A run stopped midway (the process killed, say) is resumed by running it again: what it
did stays done and is skipped, the rest is done; each execution still has exactly one
row for it.

>>> sorted(BULK_ACTIONS)
['cancel', 'pause', 'resume']
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Final

from statifier.console import actions
from statifier.console.actions import Action, Done, Refused
from statifier.console.audit import Audit, AuditEntry
from statifier.console.queries import MAX_PAGE, ConsoleQueries, ExecutionFilter
from statifier.persistence import Status
from statifier.persistence.sql import SqlTransaction
from statifier.router import Router

__all__ = ["APPLIES_TO", "BULK_ACTIONS", "BulkProgress", "preview", "run_bulk"]

_log = logging.getLogger("statifier.console")


BULK_ACTIONS: Final[Mapping[str, Action]] = {
    "cancel": actions.cancel,
    "pause": actions.pause,
    "resume": actions.resume,
}
"""The actions a run takes, by name."""

APPLIES_TO: Final[Mapping[str, Collection[Status]]] = {
    "cancel": (Status.ACTIVE, Status.NEEDS_MIGRATION, Status.PAUSED),
    "pause": (Status.ACTIVE,),
    "resume": (Status.PAUSED,),
}
"""The statuses each action applies to; other executions are skipped."""


@dataclass(frozen=True, slots=True)
class BulkProgress:
    """How far a run has come.

    Attributes:
        action: the action's name.
        selected: what :func:`preview` counted when the run started.
        done: executions acted on (each with its audit row).
        skipped: executions the action did not apply to (when the run came to them).
        failed: executions whose action failed (logged; no row of theirs, nothing done).
    """

    action: str
    selected: int
    done: int = 0
    skipped: int = 0
    failed: int = 0

    @property
    def seen(self) -> int:
        """Executions the run has come to."""
        return self.done + self.skipped + self.failed


def _action(name: str) -> Action:
    found = BULK_ACTIONS.get(name)
    if found is None:
        raise ValueError(f"unknown bulk action {name!r}; one of {', '.join(BULK_ACTIONS)}")
    return found


async def preview(queries: ConsoleQueries, action: str, where: ExecutionFilter) -> int:
    """How many executions a run of ``action`` over ``where`` would act on now.

    Raises:
        ValueError: an unknown action.
    """
    _action(action)
    return await queries.count(where, among=APPLIES_TO[action])


async def run_bulk(
    router: Router,
    queries: ConsoleQueries,
    audit: Audit,
    action: str,
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
        ValueError: an unknown action, or ``page`` outside ``1..MAX_PAGE``.
        Exception: what reading the list raised (what was done stays done).
    """
    act = _action(action)
    if not 1 <= page <= MAX_PAGE:
        raise ValueError(f"page is 1 to {MAX_PAGE} executions, not {page!r}")
    state = BulkProgress(action, await preview(queries, action, where))
    said = f"bulk {action} of {state.selected} selected"
    applies = APPLIES_TO[action]
    cursor: str | None = None
    while True:
        listed = await queries.executions(where, cursor=cursor, size=page)
        for row in listed.rows:
            if row.status not in applies:
                state = replace(state, skipped=state.skipped + 1)
                continue
            state = await _one(router, audit, act, action, row.id, actor, said, state)
        if progress is not None:
            progress(state)
        cursor = listed.next_cursor
        if cursor is None:
            break
    detail = f"{said}: {state.done} done, {state.skipped} skipped, {state.failed} failed"
    outcome = "failed" if state.failed else "done"
    await audit.record(
        AuditEntry(actor, action="bulk", target=action, outcome=outcome, detail=detail)
    )
    return state


async def _one(
    router: Router,
    audit: Audit,
    act: Action,
    action: str,
    execution_id: str,
    actor: str,
    said: str,
    state: BulkProgress,
) -> BulkProgress:
    async def record(tx: SqlTransaction, done: Done) -> None:
        detail = f"{done.summary} ({said})"
        entry = AuditEntry(actor, action=action, target=execution_id, detail=detail)
        await audit.record_in(tx, entry)

    try:
        await act(router, execution_id, record=record)
    except Refused:  # it changed since it was listed: no longer one to act on
        return replace(state, skipped=state.skipped + 1)
    except Exception as error:  # noqa: BLE001 - one execution's failure, the run goes on
        _log.error(
            "console: bulk %s of execution %s failed: %s: %s",
            action,
            execution_id,
            type(error).__name__,
            error,
            exc_info=error,
            extra={"execution_id": execution_id},
        )
        return replace(state, failed=state.failed + 1)
    return replace(state, done=state.done + 1)
