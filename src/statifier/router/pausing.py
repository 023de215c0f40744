"""Paused executions: what is sent to one waits, in order, and is stepped in on resume.

:meth:`Router.pause <statifier.router.Router.pause>` sets an active execution
``paused``. While it is, every delivery to it (a binding's, a send to an execution
target, the HTTP API's, a BasicHTTP post) and every timer of it that comes due is kept
as a ``held_events`` row, in the transaction that found it paused and under the
execution's exclusion, with the ledger row ``held`` for a delivery: nothing is refused
and nothing is lost. :meth:`Router.resume <statifier.router.Router.resume>` sets it
``active`` again and steps every held event in, in the order they came, in one
transaction: a delivery arriving meanwhile waits for the execution's exclusion and
steps after them. An execution that ends on one of them discards the rest, as it
discards any later event.

:func:`hold_event` is how a host's own step (``Durable.send``) holds what a paused
execution discards, in its transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from statifier.core.positions import load_event
from statifier.persistence import OnError, Status, StepError, Stepped
from statifier.router.delivery import STEP_VIA, completed, hold_event
from statifier.router.transaction import Delivering, Unit

__all__ = ["STEP_VIA", "Resumed", "hold_event", "step_held"]


@dataclass(frozen=True, slots=True)
class Resumed:
    """What resuming one paused execution did.

    Attributes:
        execution_id: the execution.
        stepped: how many held events were stepped in, in the order they came.
        discarded: how many were not, because the execution ended on an earlier one.
        status: its status after them.
        errors: the error events the stepped events raised, in order (each step's
            :attr:`~statifier.persistence.Stepped.errors`, as a send answers them);
            each is recorded with its step, whether a transition took it or not.
    """

    execution_id: str
    stepped: int
    discarded: int
    status: Status
    errors: tuple[StepError, ...] = ()


async def step_held(unit: Unit, execution_id: str, now: datetime) -> Resumed:
    """Step the events held for ``execution_id`` in, oldest first, at ``now``, each
    with the ``via``, scope and error policy it came with, and delete them, in ``unit``'s
    transaction. The caller has just resumed the execution in the same transaction
    (:meth:`statifier.persistence.Executions.resume`).

    Raises:
        Exception: whatever a step or the database raised; the caller's transaction
            rolls back, and the execution stays paused with its events.
    """
    codec = unit.storage.codec
    stepped = discarded = 0
    status = Status.ACTIVE
    errors: list[StepError] = []
    for row in await unit.sql.held(execution_id):
        event = load_event(codec.decode(row.event_blob))
        lifecycle = unit.executions(Delivering(row.scope, now, (execution_id,)))
        on_error = None if row.on_error is None else OnError.of(row.on_error)
        result = await lifecycle.step(
            execution_id, None, event, via=row.via, internal=row.internal, on_error=on_error
        )
        status = result.execution.status
        if isinstance(result, Stepped):
            stepped += 1
            errors.extend(result.errors)
            await completed(unit, result, row.scope)
        else:
            discarded += 1
    await unit.sql.drop_held(execution_id)
    return Resumed(execution_id, stepped, discarded, status, tuple(errors))
