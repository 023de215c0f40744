"""Caps on active executions: at most ``max_active`` executions of a document active at
once, per scope or over every scope (:class:`~statifier.router.config.Cap`), a create
beyond it held until a slot frees or dropped (``dropped: over_limit``).

A cap counts slots, not executions: a row of ``active_slots`` for each execution of the
document the router created (by a binding's delivery, a send to an execution target, a
host's ``deliver_event``), taken in the create's transaction. A slot is given back
when a cap's check finds its execution ended (completed, failed, cancelled) or gone:
each check under a full cap deletes those first, so a cap never waits on a reaper and
the check costs at most ``max_active`` rows.

Before a delivery creates an execution of a capped document, :func:`admit` takes the
cap's lock (one per document and scope, or per document for a cap over every scope)
and counts. With a free slot, and nothing held before it, the create goes on and takes
the slot. Otherwise the event is held (a ``held_creates`` row behind its address's
others, outcome ``buffered``) or, for a cap that drops, refused. While a cap holds
anything, every create under it is held, so held creates are made in the order they
came, and an address's later events wait behind its held create.

The flow worker (:class:`~statifier.router.FlowWorker`) makes held creates when slots
free, one address a transaction: under the address's lock and then
the cap's (the order a delivery takes them), it counts again and delivers the
address's held events in order, the first creating the execution. For a cap over
every scope, a free slot goes to the scope with the fewest executions (its oldest
held create), so one busy scope does not starve the others.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from statifier.core.positions import dump_event
from statifier.router.config import Cap, CapPer, OverLimit
from statifier.router.outcomes import Buffered, Dropped, DropReason, Outcome
from statifier.router.transaction import Unit, lock_key
from statifier.sql.caps import HeldCreateRow

if TYPE_CHECKING:
    from statifier.router.delivery import Delivery

__all__ = ["admit", "behind_held_create", "bucket_of", "cap_lock", "free_slots", "occupy"]


def bucket_of(cap: Cap, scope: str) -> str | None:
    """The scope a cap counts ``scope``'s executions in: ``scope``, or ``None`` for a
    cap over every scope."""
    return scope if cap.per is CapPer.SCOPE else None


def cap_lock(document: str, bucket: str | None) -> int:
    """The lock key of one cap's count (a scope is never empty, so ``""`` names the
    whole document)."""
    return lock_key("cap", document, bucket or "")


async def admit(unit: Unit, delivery: Delivery, now: datetime) -> Outcome | None:
    """Whether ``delivery`` may create an execution now: ``None`` when it may (its
    document has no cap, or a slot is free and nothing is held before it), else what
    it becomes: held (kept behind the others, answered
    :class:`~statifier.router.outcomes.Buffered`) or ``dropped: over_limit``. Takes
    the cap's lock until the transaction ends.

    Raises:
        LockTimeout: the cap's lock was not granted within ``lock_wait``.
    """
    plan, scope, key = delivery.plan, delivery.scope, delivery.key
    document = plan.document
    cap = unit.config.caps.get(document)
    if cap is None:
        return None
    bucket = bucket_of(cap, scope)
    await unit.lock([cap_lock(document, bucket)], unit.config.lock_wait)
    # The count reads executions' statuses on the transaction: a batch's queued step
    # writes (an execution it ended) go first.
    await unit.storage.send_steps()
    table, driver = unit.caps, unit.tx.driver
    waiting = cap.over is OverLimit.HOLD and await table.any_held(driver, document, bucket)
    if not waiting and await free_slots(unit, cap, document, bucket) > 0:
        return None
    if cap.over is OverLimit.DROP:
        return Dropped(plan.id, reason=DropReason.OVER_LIMIT, key=key)
    await table.hold(driver, _held_row(unit, delivery, now))
    return Buffered(plan.id, key=key)


async def behind_held_create(unit: Unit, delivery: Delivery, now: datetime) -> Outcome | None:
    """Hold ``delivery``, an event of a binding that never creates, behind its
    address's held create when its document's cap holds one (the execution it is for
    does not exist yet, and is made with the address's held events in order); else
    ``None``. The caller holds the address's lock, as the flow worker does when it
    makes the address's held events."""
    plan = delivery.plan
    cap = unit.config.caps.get(plan.document)
    if cap is None or cap.over is not OverLimit.HOLD:
        return None
    table, driver = unit.caps, unit.tx.driver
    if not await table.held(driver, plan.document, delivery.scope, delivery.key):
        return None
    await table.hold(driver, _held_row(unit, delivery, now))
    return Buffered(plan.id, key=delivery.key)


def _held_row(unit: Unit, delivery: Delivery, now: datetime) -> HeldCreateRow:
    plan = delivery.plan
    return HeldCreateRow(
        plan.document,
        delivery.scope,
        delivery.key,
        plan.id,
        plan.create.value,
        None if plan.on_error is None else plan.on_error.value,
        delivery.message_id,
        delivery.source,
        unit.storage.codec.encode(dump_event(delivery.event)),
        now,
    )


async def free_slots(unit: Unit, cap: Cap, document: str, bucket: str | None) -> int:
    """How many more executions the cap lets be created now, its ended executions'
    slots given back first if it looks full. The caller holds the cap's lock."""
    table, driver = unit.caps, unit.tx.driver
    active = await table.count(driver, document, bucket)
    if active >= cap.max_active:
        await table.purge(driver, document, bucket)
        active = await table.count(driver, document, bucket)
    return cap.max_active - active


async def occupy(unit: Unit, document: str, scope: str, execution_id: str, now: datetime) -> None:
    """Count the new ``execution_id`` against its document's cap, if it has one."""
    if document in unit.config.caps:
        await unit.caps.occupy(unit.tx.driver, document, scope, execution_id, now)
