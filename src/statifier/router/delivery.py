"""One binding's delivery of one event, inside a router transaction, in the order that
makes it safe:

1. the dedupe claim on (binding, message id): a live claim makes it a duplicate, and
   nothing but the ledger row is written;
2. the address lookup, and for a new key the address insert (before any create: the
   unique index settles a race, and its loser reads the winner's row and never
   creates);
3. the create, when the binding's mode calls for one (a subscription binding never
   creates, and delivers only to an execution a source invoke subscribed to it:
   otherwise ``dropped: not_subscribed``), if its document's cap lets it
   (:mod:`statifier.router.caps`: else the event is held, ``buffered``, or
   ``dropped: over_limit``);
4. the step, under the execution's lock (the input log is written there, only there);
5. the ledger row.

Whatever raises rolls the delivery back whole (the caller's savepoint or transaction).

The delivery that finishes an execution hands its donedata to the ``on_complete``
route, if one is configured (:func:`completed`); a send to an execution target is a
delivery nested in the sender's (:func:`deliver_to_execution`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from statifier.buckets import address_bucket
from statifier.callbacks import awaited
from statifier.chart import Machine
from statifier.core import Event
from statifier.core.events import engine_event
from statifier.core.positions import dump_event
from statifier.error_text import error_text
from statifier.persistence import Discarded, Executions, OnError, Refused, Status, Stepped
from statifier.router.binding import Create, Plan
from statifier.router.caps import admit, behind_held_create, occupy
from statifier.router.config import RouterConfig
from statifier.router.errors import (
    ChartUnresolved,
    ExecutionParked,
    OnCompleteFailed,
    UnresolvedDocument,
)
from statifier.router.locations import start_options
from statifier.router.outcomes import (
    CreatedAndDelivered,
    Delivered,
    Dropped,
    DropReason,
    Duplicate,
    Held,
    Outcome,
)
from statifier.router.records import AddressRow, HeldRow, LedgerRow
from statifier.router.routes import IdempotencyKey
from statifier.router.subscriptions import subscribed
from statifier.router.transaction import Delivering, Unit

EXECUTION_PLAN_ID = "execution"
"""The id the ledger files sends to execution targets under (reserved for bindings)."""

__all__ = [
    "STEP_VIA",
    "TIMER_VIA",
    "Claimed",
    "Delivery",
    "completed",
    "deliver",
    "deliver_to_execution",
    "hold_event",
    "step_timer_event",
]

STEP_VIA: Final = "step"
"""The input log's ``via`` of a delivery's step (the lifecycle's default)."""
TIMER_VIA: Final = "timer"
"""The input log's ``via`` of a timer's step."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where one event goes on one binding: the plan, the address and the event.

    Attributes:
        plan: the binding's id, document, create mode and dedupe horizon.
        scope, key: with ``plan.document``, the address.
        event: the chart event to step in.
        message_id: the message's identity, claimed under ``plan.id``.
        source: the source it came from (for the ledger), if any.
    """

    plan: Plan
    scope: str
    key: str
    event: Event
    message_id: str
    source: str | None = None

    @property
    def bucket(self) -> int:
        """The bucket of the address (:func:`~statifier.buckets.address_bucket`): its
        dedupe claim's, and the store's that a sharded router routes it in."""
        return address_bucket(self.scope, self.plan.document, self.key)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery's dedupe claim, made and its address read before the delivery runs
    (a set-based batch makes every claim of the batch in one statement, and reads
    every address in another).

    Attributes:
        fresh: the claim was made (``False``: a live claim existed, a duplicate).
        found: the address row, if the delivery has an address and it has a row
            (a duplicate's is not read).
    """

    fresh: bool
    found: AddressRow | None


async def deliver(
    unit: Unit,
    delivery: Delivery,
    now: datetime,
    rows: list[LedgerRow] | None = None,
    within: Delivering | None = None,
    *,
    claimed: bool | Claimed = False,
    admitted: bool = False,
) -> Outcome:
    """Deliver one event on one binding in ``unit``; see the module docstring.
    ``claimed``: the message's dedupe claim was made already (``True``: a held event's,
    when it came), and is not made again; given as :class:`Claimed`, its address was
    read too. ``admitted``: a create it makes was let through its document's cap by
    the caller (the flow worker making a held create), and is not checked again.

    The ledger row is written last, or, given ``rows``, appended there for the caller
    to write later in the same transaction (a batch writes its rows at once). A
    delivery nested in another's step (a send to an execution target) gives the outer
    one as ``within``: the executions mid-step there stay refused as targets.

    Raises:
        UnresolvedDocument: the resolver names no chart for a new execution.
        ChartUnresolved: the chart resolver names none for an existing one.
        ExecutionParked: the addressed execution is parked.
        Exception: whatever persistence, the executor or the database raised.
    """
    stepping = () if within is None else within.stepping
    delivering = Delivering(delivery.scope, now, stepping)
    return await _deliver(unit, delivery, delivering, rows, claimed, admitted)


async def _deliver(
    unit: Unit,
    delivery: Delivery,
    delivering: Delivering,
    rows: list[LedgerRow] | None,
    claimed: bool | Claimed,
    admitted: bool,
) -> Outcome:
    plan = delivery.plan
    now = delivering.now
    addressed = plan.create is not Create.ALWAYS_NEW
    address = (delivery.scope, plan.document, delivery.key) if addressed else None
    if isinstance(claimed, Claimed):
        fresh, found = claimed.fresh, claimed.found
    elif claimed:
        fresh, found = True, None if address is None else await unit.sql.find_address(*address)
    else:
        fresh, found = await unit.sql.claim_and_find(
            plan.id, delivery.message_id, now, now + plan.horizon, address, delivery.bucket
        )
    capped: Outcome | None = None
    creates = fresh and (not addressed or (found is None and plan.create is not Create.NEVER))
    if creates and not admitted:
        capped = await admit(unit, delivery, now)
    if not fresh:
        outcome: Outcome = Duplicate(plan.id, key=delivery.key)
    elif capped is not None:
        outcome = capped
    elif not addressed:
        outcome = await _create(unit, delivery, delivering, None)
    elif found is None and plan.create is Create.NEVER:
        # The execution may not exist yet because a cap holds its create: the event
        # waits behind it, as the address's other later events do.
        held = None if admitted else await behind_held_create(unit, delivery, now)
        outcome = held or Dropped(plan.id, reason=DropReason.NO_EXECUTION, key=delivery.key)
    elif found is None:
        outcome = await _claim_address(unit, delivery, delivering)
    elif plan.subscription and await _unsubscribed(unit, delivery, found):
        outcome = Dropped(
            plan.id,
            reason=DropReason.NOT_SUBSCRIBED,
            key=delivery.key,
            execution_id=found.execution_id,
        )
    else:
        outcome = await _existing(unit, delivery, delivering, found)
    row = ledger_row(delivery, outcome, now)
    if rows is None:
        await unit.sql.record(row)
    else:
        rows.append(row)
    return outcome


async def _unsubscribed(unit: Unit, delivery: Delivery, found: AddressRow) -> bool:
    """Whether a subscription binding's event is dropped ``not_subscribed``: the
    addressed execution has not been seen ended (an ended one returns ``finished``, as
    on any binding) and no live source invoke of it subscribes to the binding."""
    if found.terminal_seen_at is not None:
        return False
    return not await subscribed(
        unit, delivery.plan.id, found.execution_id, delivery.scope, delivery.key
    )


async def _claim_address(unit: Unit, delivery: Delivery, delivering: Delivering) -> Outcome:
    plan = delivery.plan
    execution_id = minted(unit.config, delivery.scope, plan.document, delivery.key)
    address_id = await unit.sql.insert_address(
        delivery.scope, plan.document, delivery.key, execution_id, delivering.now
    )
    if address_id is not None:
        return await _create(unit, delivery, delivering, address_id, execution_id)
    # Another delivery inserted the address first and has committed (the insert waited
    # for it): deliver to its execution; the id minted here names nothing.
    found = await unit.sql.find_address(delivery.scope, plan.document, delivery.key)
    if found is None:  # pragma: no cover - a committed row cannot vanish in between
        raise RuntimeError("an address row that won a race is not readable")
    return await _existing(unit, delivery, delivering, found)


async def _create(
    unit: Unit,
    delivery: Delivery,
    delivering: Delivering,
    address_id: Any,
    execution_id: str | None = None,
) -> Outcome:
    plan = delivery.plan
    config = unit.config
    now = delivering.now
    if execution_id is None:
        execution_id = minted(config, delivery.scope, plan.document, delivery.key)
    try:
        resolved = await config.resolve(delivery.scope, plan.document)
    except Exception as error:
        raise UnresolvedDocument(delivery.scope, plan.document, error_text(error)) from error
    machine = resolved.machine
    executions = unit.executions(delivering.into(execution_id))
    # With basichttp, an addressed execution starts knowing its own location.
    options = await start_options(unit, address_id, execution_id, now)
    if config.on_create is not None:
        created = await config.on_create(executions, execution_id, machine, options)
    else:
        created = await executions.create(
            execution_id, machine, options=options, on_error=plan.on_error
        )
    unit.locked(execution_id)  # the create took its lock, held to the commit
    if not created.finished:
        await occupy(unit, plan.document, delivery.scope, execution_id, now)
    if created.finished:
        await completed(unit, created, delivery.scope)
        if address_id is not None:
            await unit.sql.stamp([address_id], now)
        return Dropped(
            plan.id, reason=DropReason.FINISHED, key=delivery.key, execution_id=execution_id
        )
    stepped = await _step(unit, delivering, execution_id, machine, delivery.event, plan, executions)
    return await _stepped(unit, delivery, stepped, address_id, now, created=True)


async def _existing(
    unit: Unit, delivery: Delivery, delivering: Delivering, found: AddressRow
) -> Outcome:
    plan = delivery.plan
    execution_id = found.execution_id
    if found.terminal_seen_at is not None:
        return Dropped(
            plan.id, reason=DropReason.FINISHED, key=delivery.key, execution_id=execution_id
        )
    machine: Machine | None = None
    chart_resolver = unit.config.chart_resolver
    if chart_resolver is not None:
        record = await unit.storage.fetch_execution(execution_id)
        try:
            machine = await awaited(chart_resolver(record.content_hash))
        except Exception as error:
            raise ChartUnresolved(record.content_hash, error_text(error)) from error
    result = await _step(unit, delivering, execution_id, machine, delivery.event, plan)
    return await _stepped(unit, delivery, result, found.id, delivering.now, created=False)


async def _step(
    unit: Unit,
    delivering: Delivering,
    execution_id: str,
    machine: Machine | None,
    event: Event,
    plan: Plan,
    executions: Executions | None = None,
) -> Stepped | Discarded:
    """Step ``event`` into the execution through ``executions`` (made for this
    delivery's step of it unless given: a create hands on the lifecycle it ran)."""
    if executions is None:
        executions = unit.executions(delivering.into(execution_id))
    on_step = unit.config.on_step
    if on_step is not None:
        stepped = await on_step(executions, execution_id, machine, event)
    else:
        stepped = await executions.step(execution_id, machine, event, on_error=plan.on_error)
    if isinstance(stepped, Stepped):
        await completed(unit, stepped, delivering.scope)
    return stepped


async def completed(unit: Unit, stepped: Stepped, scope: str | None) -> None:
    """If ``stepped`` finished its execution, hand ``done.execution`` (the donedata
    verbatim, the execution as origin) to the ``on_complete`` route, resolved in
    ``scope``, under the execution id and the finishing step's counters, in the
    delivery's transaction.

    Raises:
        OnCompleteFailed: the route refused; the delivery must roll back (a finished
            execution has no transition left to hear of it).
    """
    config = unit.config
    route_name = config.on_complete
    if route_name is None or not stepped.finished:
        return
    found = config.route(scope, route_name)
    assert found is not None  # the configuration refuses an unregistered name
    adapter, route_config = found
    execution_id = stepped.execution.id
    state = stepped.state
    event = engine_event(
        "done.execution", "external", stepped.donedata, None, f"#_scxml_{execution_id}", None
    )
    key = IdempotencyKey(
        execution_id,
        send_id=None,
        macrostep=state.macrostep,
        microstep=state.microstep,
        round=state.round,
        content_index=None,
        ordinal=None,
    )
    # The route runs on the transaction and may read what the steps wrote.
    await unit.storage.send_steps()
    answer = await awaited(adapter.deliver(route_config, event, key, unit.tx, scope))
    if isinstance(answer, Refused):
        raise OnCompleteFailed(route_name, execution_id, answer.reason)


async def hold_event(
    unit: Unit,
    execution_id: str,
    event: Event,
    *,
    via: str,
    internal: bool,
    scope: str | None,
    message_id: str | None,
    now: datetime,
    on_error: OnError | None = None,
) -> None:
    """Keep ``event`` for the paused ``execution_id``, in this transaction, behind what
    is held for it already: :meth:`Router.resume <statifier.router.Router.resume>` steps
    it in with ``via``, on the internal queue when ``internal``, its sends resolved in
    ``scope``, an error no transition takes handled by ``on_error`` (the delivering
    binding's; ``None``: the router's). The event is stored as the input log stores it,
    through the storage's codec. The caller holds the execution's exclusion (the step
    that found it paused took it, until the commit), so a resume cannot pass between the
    two."""
    blob = unit.storage.codec.encode(dump_event(event))
    row = HeldRow(
        execution_id,
        via=via,
        internal=internal,
        scope=scope,
        message_id=message_id,
        event_blob=blob,
        held_at=now,
        on_error=None if on_error is None else on_error.value,
    )
    await unit.sql.hold(row)


async def step_timer_event(
    unit: Unit,
    execution_id: str,
    event: Event,
    *,
    internal: bool,
    scope: str | None,
    now: datetime,
) -> Stepped | Discarded:
    """Step a fired timer's event into its execution, as a delivery would (its sends
    resolve in ``scope``, a finishing step reaches ``on_complete``), writing no ledger
    row. The step takes the unit's exclusion (in the timer worker's
    :meth:`~statifier.router.transaction.Unit.holding` block, one that knows the locks
    its claim holds).

    Raises:
        ExecutionNotFound: the execution is gone.
    """
    lifecycle = unit.executions(Delivering(scope, now, (execution_id,)))
    stepped = await lifecycle.step(execution_id, None, event, via=TIMER_VIA, internal=internal)
    if isinstance(stepped, Stepped):
        await completed(unit, stepped, scope)
    return stepped


async def deliver_to_execution(
    unit: Unit,
    within: Delivering,
    *,
    document: str,
    key: str,
    create: str,
    event: Event,
    message_id: str,
) -> tuple[str, str] | None:
    """Deliver a send of the router's type to ``target="execution"``, from a step of
    the delivery ``within``: the execution ``(within.scope, document, key)`` addresses
    receives ``event`` in this transaction, at ``within``'s time, filed under the
    ledger's ``execution`` binding id with ``message_id`` (the send's composed key, so
    a replayed step is a duplicate).

    Returns ``None`` when delivered (or a duplicate, or delivered and unused), else the
    refusal's ``(code, detail)``: ``reentrant`` (the target is mid-step in this
    transaction: the sender itself, or a sender further out), ``no_execution``,
    ``finished``.
    """
    scope = within.scope
    assert scope is not None  # the send handler refuses a send with no scope
    found = await unit.sql.find_address(scope, document, key)
    if found is not None and found.execution_id in within.stepping:
        return "reentrant", f"execution {found.execution_id!r} is sending; it cannot receive"
    plan = Plan(EXECUTION_PLAN_ID, document=document, create=Create(create))
    delivery = Delivery(plan, scope, key, event, message_id)
    outcome = await deliver(unit, delivery, within.now, within=within)
    if isinstance(outcome, Dropped) and outcome.reason is not DropReason.UNMATCHED_EVENT:
        reason = outcome.reason.value
        return reason, f"no live execution of {document!r} at key {key!r} ({reason})"
    return None


async def _stepped(
    unit: Unit,
    delivery: Delivery,
    stepped: Stepped | Discarded,
    address_id: Any,
    now: datetime,
    created: bool,
) -> Outcome:
    plan = delivery.plan
    execution_id = stepped.execution.id
    if isinstance(stepped, Discarded):
        if stepped.execution.status is Status.PAUSED:
            await hold_event(
                unit,
                execution_id,
                delivery.event,
                via=STEP_VIA,
                internal=False,
                scope=delivery.scope,
                message_id=delivery.message_id,
                now=now,
                on_error=plan.on_error,
            )
            return Held(plan.id, key=delivery.key, execution_id=execution_id)
        if not stepped.execution.status.terminal:
            raise ExecutionParked(execution_id)
        if address_id is not None:
            await unit.sql.stamp([address_id], now)
        return Dropped(
            plan.id, reason=DropReason.FINISHED, key=delivery.key, execution_id=execution_id
        )
    if stepped.finished and address_id is not None:
        # The first sighting of the end: the address's horizon counts from here.
        await unit.sql.stamp([address_id], now)
    if not stepped.matched:
        # No transition took the event: it is in the input log, unused.
        return Dropped(
            plan.id,
            reason=DropReason.UNMATCHED_EVENT,
            key=delivery.key,
            execution_id=execution_id,
            step=stepped,
        )
    if created:
        return CreatedAndDelivered(
            plan.id, key=delivery.key, execution_id=execution_id, step=stepped
        )
    return Delivered(plan.id, key=delivery.key, execution_id=execution_id, step=stepped)


def minted(config: RouterConfig, scope: str, document: str, key: str) -> str:
    """A new execution id from the configured minting function.

    Raises:
        TypeError: it returned something other than a non-empty string.
    """
    execution_id: object = config.execution_id(scope, document, key)
    if not isinstance(execution_id, str) or not execution_id:
        raise TypeError(f"execution_id answered {execution_id!r}, not a non-empty string")
    return execution_id


def ledger_row(delivery: Delivery, outcome: Outcome, now: datetime) -> LedgerRow:
    """The ledger row of ``outcome`` (never a :class:`~statifier.router.NoMatch`)."""
    reason = outcome.reason.value if isinstance(outcome, Dropped) else None
    execution_id = getattr(outcome, "execution_id", None)
    kind = "dropped" if isinstance(outcome, Dropped) else outcome.outcome
    return LedgerRow(
        delivery.plan.id,
        message_id=delivery.message_id,
        scope=delivery.scope,
        source=delivery.source,
        outcome=kind,
        reason=reason,
        document=delivery.plan.document,
        key=delivery.key,
        execution_id=execution_id,
        inserted_at=now,
    )
