"""Debounce, batch and throttle: how a binding's events reach one address's execution
when its :class:`~statifier.router.binding.Mode` is not ``each``.

An event of such a binding is claimed for dedupe as any other, then, under its
address's lock and in the delivery's transaction, either delivered at once or held (a
``flow_events`` row behind the address's others, its ``flow_groups`` row saying how
many are held and when they are due) and answered
:class:`~statifier.router.outcomes.Buffered`, with a ``buffered`` ledger row. What is
held is delivered by :func:`flush`, which the flow worker
(:class:`~statifier.router.FlowWorker`) runs for each group due, in a transaction of
its own under the same lock: the held events are read, delivered and deleted, and the
group moved on, all committed together or not at all. A held event is so delivered
exactly once, after every event of its address that came before it.

- ``debounce``: every event is held (only the last one's data is kept; the group
  counts them) and the group is due ``window`` after the last, or ``max_wait`` after
  the first, whichever comes first. Then one event is delivered: the binding's
  ``event``, the last event's projected data plus ``count``.
- ``batch``: every event is held, the group due ``window`` after the first; the event
  that makes ``batch`` held delivers them at once. One event is delivered, its data
  ``{"events": [projected data, in arrival order]}``.
- ``throttle``: an event is delivered at once while its address's window (``window``
  long, opened by the first delivery after the last one closed) has let fewer than
  ``batch`` through and nothing is held; otherwise it is held, and when the window
  closes the next ``batch`` held ones are delivered, one by one, in a new window.

A flush's delivery is filed in the ledger under the last delivered event's message id
(its arrival's row says ``buffered``): the ledger shows, for that message, when it came
and what its delivery did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Final

from statifier.core import Event
from statifier.core.positions import dump_event, load_event
from statifier.expr import Value
from statifier.router.binding import Binding, Mode
from statifier.router.delivery import Delivery, deliver, ledger_row
from statifier.router.errors import RouterError
from statifier.router.outcomes import Buffered, Duplicate, Outcome
from statifier.router.records import LedgerRow
from statifier.router.transaction import Unit
from statifier.sql.caps import HeldCreateRow
from statifier.sql.flow import FlowEventRow, FlowGroupRow

__all__ = ["BindingGone", "arrive", "flush", "not_before"]

EACH_PAGE: Final = 500
"""The most held events one flush delivers one by one (the group is then due again at
once for the rest): a binding turned to ``each`` while events were held."""


class BindingGone(RouterError):  # noqa: N818 - names the refusal
    """A group's events cannot be delivered: its binding is no longer an enabled
    binding of its scope. They stay held, and are tried again."""

    def __init__(self, binding_id: str, scope: str, held: int) -> None:
        super().__init__(
            f"binding {binding_id!r} is not an enabled binding of scope {scope!r}: "
            f"its {held} held event{'s' if held != 1 else ''} wait for it"
        )
        self.binding_id = binding_id
        self.scope = scope


async def arrive(
    unit: Unit,
    binding: Binding,
    delivery: Delivery,
    now: datetime,
    rows: list[LedgerRow] | None = None,
) -> Outcome:
    """Settle ``delivery``, an event of ``binding`` (its mode not ``each``), in
    ``unit``, whose caller holds the address's lock: the dedupe claim, then held or
    delivered as the mode says (see the module docstring). Ledger rows go to ``rows``
    when given (a batch writes its rows at once), else are written.

    Raises:
        Exception: as :func:`~statifier.router.delivery.deliver`, for an event
            delivered at once; the caller's transaction or savepoint must be rolled
            back.
    """
    plan = delivery.plan
    fresh = await unit.sql.claim(
        plan.id, delivery.message_id, now, now + plan.horizon, delivery.bucket
    )
    if not fresh:
        outcome: Outcome = Duplicate(plan.id, key=delivery.key)
        await _record(unit, ledger_row(delivery, outcome, now), rows)
        return outcome
    table, driver = unit.flow, unit.tx.driver
    group = await table.locked(driver, plan.id, delivery.scope, delivery.key)
    if group is None:
        group = _empty(delivery, now)
    if binding.mode is Mode.THROTTLE:
        opened = _window(binding, group, now)
        if opened is not None:
            await table.put(driver, opened)
            return await deliver(unit, delivery, now, rows, claimed=True)
    elif binding.mode is Mode.BATCH and group.held + 1 >= _batch(binding):
        held = await table.events(driver, plan.id, delivery.scope, delivery.key, group.held)
        await table.drop(driver, plan.id, delivery.scope, delivery.key, group.last_seq)
        await table.delete(driver, plan.id, delivery.scope, delivery.key)
        data: list[Value] = [_data(unit, row) for row in held]
        data.append(delivery.event.data)
        return await deliver(unit, _composed(binding, delivery, data), now, rows, claimed=True)
    await _hold(unit, binding, delivery, group, now)
    outcome = Buffered(plan.id, key=delivery.key)
    await _record(unit, ledger_row(delivery, outcome, now), rows)
    return outcome


async def flush(unit: Unit, binding: Binding | None, group: FlowGroupRow, now: datetime) -> int:
    """Deliver what ``group`` (locked by the caller, who holds its address's lock, and
    due at ``now``) holds, as ``binding``'s mode says, and move the group on: deleted
    when nothing is left to hold or time, else due again. Answers how many held events
    were delivered.

    Raises:
        BindingGone: ``binding`` is ``None`` (the group's binding is gone or
            disabled) and events are held; nothing changed.
        Exception: as :func:`~statifier.router.delivery.deliver`: ``unit`` must be
            rolled back.
    """
    table, driver = unit.flow, unit.tx.driver
    where = (group.binding_id, group.scope, group.key)
    if group.held == 0:  # a throttle window closed with nothing waiting
        await table.delete(driver, *where)
        return 0
    if binding is None:
        raise BindingGone(group.binding_id, group.scope, group.held)
    mode = binding.mode
    if mode is Mode.DEBOUNCE:
        taken = await table.events(driver, *where, group.held)
        last = taken[-1]
        data = {**_mapping(_data(unit, last)), "count": group.held}
        at = not_before(now, taken)
        await deliver(unit, _from_row(binding, last, data), at, claimed=True)
        consumed = group.held  # every event it coalesced; only the last kept its row
    elif mode is Mode.BATCH:
        taken = await table.events(driver, *where, _batch(binding))
        batch: list[Value] = [_data(unit, row) for row in taken]
        at = not_before(now, taken)
        await deliver(unit, _from_row(binding, taken[-1], {"events": batch}), at, claimed=True)
        consumed = len(taken)
    else:  # throttle, or each: a binding turned to each delivers what it held
        page = _batch(binding) if mode is Mode.THROTTLE else EACH_PAGE
        taken = await table.events(driver, *where, page)
        at = not_before(now, taken)
        for row in taken:
            await deliver(unit, _from_row(binding, row, _data(unit, row)), at, claimed=True)
        consumed = len(taken)
    await table.drop(driver, *where, taken[-1].seq)
    left = group.held - consumed
    window = binding.window
    if mode is Mode.THROTTLE and window is not None:
        # The deliveries open a new window; the group lives until it closes.
        moved = replace(
            group, held=left, window_start=now, window_count=consumed, failures=0, last_error=None
        )
        await table.put(driver, _moved(moved, now + window, now))
    elif left > 0:
        first = await table.events(driver, *where, 1)
        moved = replace(group, held=left, first_at=first[0].arrived_at, failures=0, last_error=None)
        await table.put(driver, _moved(moved, _due(binding, moved, now), now))
    else:
        await table.delete(driver, *where)
    return consumed


def not_before(now: datetime, held: Sequence[FlowEventRow | HeldCreateRow]) -> datetime:
    """The time a delivery of ``held`` is made at: ``now``, or the latest arrival
    among them if later. A worker reads its clock before the database lets it in, and
    an arrival that committed meanwhile may carry a later time: its delivery's ledger
    row must not come before its arrival's."""
    return max([now, *(row.arrived_at for row in held)])


def _window(binding: Binding, group: FlowGroupRow, now: datetime) -> FlowGroupRow | None:
    """``group`` with one more delivery in its throttle window (a new window when the
    last one closed), or ``None`` when the event must wait: events are held before it,
    or the window has let ``batch`` through."""
    window = binding.window
    assert window is not None  # a throttle binding has one
    if group.held > 0:
        return None
    start, count = group.window_start, group.window_count
    if start is None or now >= start + window:
        start, count = now, 0
    if count >= _batch(binding):
        return None
    opened = replace(group, window_start=start, window_count=count + 1)
    return _moved(opened, start + window, now)


async def _hold(
    unit: Unit, binding: Binding, delivery: Delivery, group: FlowGroupRow, now: datetime
) -> None:
    """Hold ``delivery``'s event behind ``group``'s, and write the group: one more
    held, due as the mode says. A debounce keeps only the last event's row."""
    table, driver = unit.flow, unit.tx.driver
    plan = delivery.plan
    if binding.mode is Mode.DEBOUNCE and group.held > 0:
        await table.drop(driver, plan.id, delivery.scope, delivery.key, group.last_seq)
    seq = group.last_seq + 1
    blob = unit.storage.codec.encode(dump_event(delivery.event))
    row = FlowEventRow(
        plan.id, delivery.scope, delivery.key, seq, delivery.message_id, delivery.source, blob, now
    )
    await table.hold(driver, row)
    first_at = group.first_at if group.held > 0 and group.first_at is not None else now
    grown = replace(group, held=group.held + 1, last_seq=seq, first_at=first_at)
    await table.put(driver, _moved(grown, _due(binding, grown, now), now))


def _due(binding: Binding, group: FlowGroupRow, now: datetime) -> datetime:
    """When ``group``, holding events, is next due under ``binding``'s mode."""
    window = binding.window
    assert window is not None  # every mode but each has one
    first_at = group.first_at or now
    if binding.mode is Mode.DEBOUNCE:
        if binding.max_wait is None:
            return now + window
        return min(now + window, first_at + binding.max_wait)
    if binding.mode is Mode.BATCH:
        return first_at + window
    if binding.mode is Mode.THROTTLE and group.window_start is not None:
        return max(group.window_start + window, now)
    return now


def _moved(group: FlowGroupRow, due_at: datetime, now: datetime) -> FlowGroupRow:
    return replace(group, due_at=due_at, updated_at=now)


def _empty(delivery: Delivery, now: datetime) -> FlowGroupRow:
    return FlowGroupRow(
        delivery.plan.id,
        delivery.scope,
        delivery.key,
        delivery.plan.document,
        held=0,
        last_seq=0,
        first_at=None,
        window_start=None,
        window_count=0,
        due_at=now,
        failures=0,
        last_error=None,
        updated_at=now,
    )


def _batch(binding: Binding) -> int:
    assert binding.batch is not None  # batch and throttle bindings have one
    return binding.batch


def _data(unit: Unit, row: FlowEventRow) -> Value:
    """The projected data ``row`` holds."""
    return load_event(unit.storage.codec.decode(row.data_blob)).data


def _mapping(data: Value) -> dict[str, Value]:
    return dict(data) if isinstance(data, dict) else {}


def _composed(binding: Binding, delivery: Delivery, events: list[Value]) -> Delivery:
    """A batch's delivery, filed under ``delivery``'s message (the last of it)."""
    event = Event(binding.event, data={"events": events})
    return replace(delivery, event=event)


def _from_row(binding: Binding, row: FlowEventRow, data: Value) -> Delivery:
    """The delivery of ``data`` as ``binding``'s event, filed under ``row``'s message."""
    return Delivery(
        binding.plan,
        row.scope,
        row.key,
        Event(binding.event, data=data),
        row.message_id,
        row.source,
    )


async def _record(unit: Unit, row: LedgerRow, rows: list[LedgerRow] | None) -> None:
    if rows is None:
        await unit.sql.record(row)
    else:
        rows.append(row)
