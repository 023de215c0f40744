"""Routing: an inbound event in, one outcome per enabled binding of its source out.

:func:`route` routes one event, one transaction per binding delivery (or a savepoint
each inside a caller's transaction). :func:`route_many` routes a batch in one
transaction, a savepoint per delivery, so a stream front commits once per batch.
:func:`deliver_event` is the door for a host's own jobs: one event to one address,
under a plan of the host's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.core import Event
from statifier.persistence.reentry import hold
from statifier.repeats import IntervalTally
from statifier.router.binding import Binding, Create, Keyed, Plan, Refused
from statifier.router.config import RESERVED_BINDING_IDS, Door, RouterConfig
from statifier.router.delivery import Delivery, deliver
from statifier.router.errors import BindingsUnresolved, RouterError
from statifier.router.outcomes import (
    Failed,
    InboundEvent,
    KeyRefused,
    NoMatch,
    Outcome,
    Routed,
)
from statifier.router.records import LedgerRow
from statifier.router.timers import SqlTimerQueue
from statifier.router.transaction import Unit, lock_key, sorted_locks
from statifier.telemetry import enabled, report

__all__ = ["BlockedByEarlierFailure", "deliver_event", "route", "route_many"]

_log = logging.getLogger(__name__)
_repeats = IntervalTally()

_T = TypeVar("_T")
_ROUTE = "statifier.router.route"
_DELIVERY = "statifier.router.delivery"

Connection = sa.Connection | AsyncConnection


class BlockedByEarlierFailure(RouterError):  # noqa: N818 - names the refusal
    """An event of a batch not routed because an earlier event of the batch, for one of
    the same addresses, failed: routing it first would break its key's order."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"an earlier event of the batch ({message_id!r}) failed on its address")
        self.message_id = message_id


@dataclass(frozen=True, slots=True)
class _Verdict:
    """One enabled binding's answer for one event: ``Keyed`` (deliver), ``Refused``
    (write a refusal) or ``None`` (no match)."""

    binding: Binding
    answer: Keyed | Refused | None

    def delivery(self, event: InboundEvent) -> Delivery:
        assert isinstance(self.answer, Keyed)
        binding = self.binding
        chart_event = Event(binding.event, data=binding.project(event.data))
        return Delivery(
            binding.plan, event.scope, self.answer.key, chart_event, event.message_id, event.source
        )

    def locks(self, event: InboundEvent) -> list[int]:
        """The advisory locks this verdict's delivery takes up front (PostgreSQL)."""
        if not isinstance(self.answer, Keyed):
            return []
        return delivery_locks(self.binding.plan, event.scope, self.answer.key, event.message_id)


def delivery_locks(plan: Plan, scope: str, key: str, message_id: str) -> list[int]:
    """The lock keys of one delivery: its dedupe claim and, unless it creates a new
    execution every time, its address."""
    keys = [lock_key("dedupe", plan.id, message_id)]
    if plan.create is not Create.ALWAYS_NEW:
        keys.append(lock_key("address", scope, plan.document, key))
    return keys


def _aware(now: datetime) -> datetime:
    """``now``, refused if naive: every stored time is an instant."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, not {now!r}")
    return now


async def _verdicts(config: RouterConfig, event: InboundEvent) -> list[_Verdict]:
    try:
        bindings = await config.bindings_for(event.scope)
    except Exception as error:
        raise BindingsUnresolved(event.scope, f"{type(error).__name__}: {error}") from error
    return [
        _Verdict(binding, binding.evaluate(event.data))
        for binding in bindings
        if binding.enabled and binding.source == event.source
    ]


def _refusal_row(event: InboundEvent, verdict: _Verdict, now: datetime) -> LedgerRow:
    assert isinstance(verdict.answer, Refused)
    binding = verdict.binding
    return LedgerRow(
        binding.id,
        message_id=event.message_id,
        scope=event.scope,
        source=event.source,
        outcome="key_refused",
        reason=verdict.answer.reason,
        document=binding.document,
        key=None,
        execution_id=None,
        inserted_at=now,
    )


async def _around(
    config: RouterConfig, scope: str, door: Door, work: Callable[[], Awaitable[_T]]
) -> _T:
    if config.around_delivery is None:
        return await work()
    result: _T = await config.around_delivery(scope, door, work)
    return result


async def _settle_one(
    unit: Unit,
    config: RouterConfig,
    event: InboundEvent,
    verdict: _Verdict,
    now: datetime,
    rows: list[LedgerRow] | None = None,
) -> Outcome:
    """Settle one verdict in ``unit``: a refusal's ledger row, or the delivery. Given
    ``rows``, ledger rows are appended there instead of written (see ``deliver``)."""
    started = time.perf_counter()
    outcome: Outcome
    if isinstance(verdict.answer, Refused):
        row = _refusal_row(event, verdict, now)
        if rows is None:
            await unit.sql.record(row)
        else:
            rows.append(row)
        outcome = KeyRefused(verdict.binding.id, reason=verdict.answer.reason)
    else:
        outcome = await deliver(unit, config, verdict.delivery(event), now, rows)
    if enabled(_DELIVERY):
        report(
            _DELIVERY,
            {"duration": time.perf_counter() - started},
            {
                "binding_id": verdict.binding.id,
                "outcome": outcome.outcome,
                "scope": event.scope,
                "message_id": event.message_id,
                "execution_id": getattr(outcome, "execution_id", None),
            },
        )
    return outcome


async def _alone(
    config: RouterConfig,
    connection: Connection | None,
    locks: list[int],
    settle: Callable[[Unit], Awaitable[Outcome]],
    scheduled: list[int] | None = None,
) -> Outcome:
    """One delivery in a transaction of its own, or in a savepoint of the caller's: its
    advisory locks first (sorted, bounded by ``lock_wait``), then ``settle``; the count
    of timers it scheduled goes to ``scheduled``."""
    async with config.transaction(connection) as unit:
        if connection is None:
            await _lock(unit, config, sorted_locks(locks))
            outcome = await settle(unit)
        else:
            async with unit.savepoint():
                await _lock(unit, config, sorted_locks(locks))
                outcome = await settle(unit)
        if scheduled is not None:
            scheduled.append(unit.scheduled)
        return outcome


def _waiting(config: RouterConfig, scheduled: int) -> tuple[str, ...]:
    """What an event's deliveries leave waiting for a timer worker that does not run in
    this process, said (and logged, once an interval), unless one runs elsewhere."""
    queue = config.timers
    if not scheduled or config.timers_elsewhere or not isinstance(queue, SqlTimerQueue):
        return ()
    if queue.on_schedule:  # a TimerWorker runs here: it was woken
        return ()
    notice = (
        f"{scheduled} timer{'s' if scheduled != 1 else ''} scheduled, and no timer worker "
        "runs in this process to fire them: run a TimerWorker (or statifier serve) on this "
        "database, or set RouterConfig(timers_elsewhere=True) where one runs elsewhere"
    )
    _repeats.note(
        ("no_timer_worker", id(queue)),
        lambda: _log.warning("%s", notice),
        lambda count: _log.warning("%d more deliveries scheduled timers no worker fires", count),
    )
    return (notice,)


async def _lock(unit: Unit, config: RouterConfig, keys: list[int]) -> None:
    """Take the router's locks ``keys`` in ``unit``, refusing at once a wait on one the
    calling task's own delivery holds (a route calling back into its sender)."""
    hold(unit.tx, [("router", key) for key in keys], "the router's lock of this address")
    await unit.lock(keys, config.lock_wait)


def _reported(routed: Routed, started: float, duration: float | None = None) -> Routed:
    if enabled(_ROUTE):
        took = time.perf_counter() - started if duration is None else duration
        counts: dict[str, float] = {"duration": took}
        for outcome in routed.outcomes:
            counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1
        event = routed.event
        metadata = {"scope": event.scope, "source": event.source, "message_id": event.message_id}
        report(_ROUTE, counts, metadata)
    return routed


async def route(
    config: RouterConfig,
    event: InboundEvent,
    *,
    now: datetime | None = None,
    connection: Connection | None = None,
) -> Routed:
    """Route ``event``: one outcome per enabled binding of its source, in binding order.

    Each binding's delivery is one transaction (a savepoint each, given ``connection``,
    a connection of the adapter's engine on which the caller began a transaction: it
    all commits or rolls back with the caller's transaction). ``now`` defaults to the
    storage's clock.

    Raises:
        BindingsUnresolved: the bindings resolver failed for the event's scope.
        UnresolvedDocument, ChartUnresolved, ExecutionParked: see
            :func:`~statifier.router.delivery.deliver`.
        Exception: from the database, persistence or the executor. The delivery that
            raised left nothing behind; those of earlier bindings stay committed. A
            front must not acknowledge the event.
    """
    started = time.perf_counter()
    moment = config.storage.clock() if now is None else _aware(now)

    async def work() -> Routed:
        outcomes: list[Outcome] = []
        scheduled: list[int] = []
        for verdict in await _verdicts(config, event):
            if verdict.answer is None:
                outcomes.append(NoMatch(verdict.binding.id))
                continue
            locks = verdict.locks(event)

            async def settle(unit: Unit, verdict: _Verdict = verdict) -> Outcome:
                return await _settle_one(unit, config, event, verdict, moment)

            outcomes.append(await _alone(config, connection, locks, settle, scheduled))
        return Routed(event, tuple(outcomes), _waiting(config, sum(scheduled)))

    return _reported(await _around(config, event.scope, Door.ROUTE, work), started)


async def route_many(
    config: RouterConfig,
    events: Sequence[InboundEvent],
    *,
    now: datetime | None = None,
    connection: Connection | None = None,
) -> list[Routed | Failed]:
    """Route a batch in one transaction (or inside the caller's, given ``connection``):
    one answer per event, in order.

    Every delivery settles at its own savepoint, so an event whose routing raises is
    answered :class:`Failed` (its earlier bindings' deliveries stand) and the others
    commit. Later events of the batch for an address a failed event touched, and for
    any address in a scope whose bindings could not be read, fail as
    :class:`BlockedByEarlierFailure`: a key's events keep their order. On PostgreSQL
    the batch takes its advisory locks for every claim and address up front, in one
    sorted order, so two batches never deadlock.

    ``around_delivery`` is called twice per event, under the event's scope: around
    reading its bindings, and around its deliveries; the batch's begin, locks and
    commit run outside it.

    Raises:
        ValueError: ``now`` is naive.
        LockTimeout: on PostgreSQL, the batch's locks were not granted within
            ``lock_wait``; nothing was written.
        Exception: the transaction itself failed (the database went away, the commit
            failed): nothing of the batch is committed.
    """
    moment = config.storage.clock() if now is None else _aware(now)
    planned: list[list[_Verdict] | BaseException] = []
    for event in events:

        async def read(event: InboundEvent = event) -> list[_Verdict]:
            return await _verdicts(config, event)

        try:
            planned.append(await _around(config, event.scope, Door.ROUTE, read))
        except Exception as error:  # noqa: BLE001 - the event's own answer, not the batch's
            planned.append(error)
    locks = sorted_locks(
        key
        for event, verdicts in zip(events, planned, strict=True)
        if isinstance(verdicts, list)
        for verdict in verdicts
        for key in verdict.locks(event)
    )
    answers: list[Routed | Failed] = []
    durations: list[float] = []
    async with config.transaction(connection) as unit:
        await _lock(unit, config, locks)
        blocked: dict[tuple[str, str, str], str] = {}
        blocked_scopes: dict[str, str] = {}
        # The deliveries' ledger rows, written at once before the commit: a row is
        # appended only by a delivery that settled, so the rows are exactly theirs.
        rows: list[LedgerRow] = []
        for event, verdicts in zip(events, planned, strict=True):

            async def settle(
                event: InboundEvent = event, verdicts: list[_Verdict] | BaseException = verdicts
            ) -> Routed | Failed:
                return await _batch_event(
                    unit, config, event, verdicts, moment, blocked, blocked_scopes, rows
                )

            started = time.perf_counter()
            try:
                answers.append(await _around(config, event.scope, Door.ROUTE, settle))
            except Exception as error:  # noqa: BLE001 - around_delivery raised for it
                blocked_scopes.setdefault(event.scope, event.message_id)
                answers.append(Failed(event, error))
            durations.append(time.perf_counter() - started)
        await unit.sql.record_many(rows)
    for answer, duration in zip(answers, durations, strict=True):
        if isinstance(answer, Routed):
            _reported(answer, 0.0, duration)
    return answers


async def _batch_event(
    unit: Unit,
    config: RouterConfig,
    event: InboundEvent,
    verdicts: list[_Verdict] | BaseException,
    now: datetime,
    blocked: dict[tuple[str, str, str], str],
    blocked_scopes: dict[str, str],
    rows: list[LedgerRow],
) -> Routed | Failed:
    if isinstance(verdicts, BaseException):
        blocked_scopes.setdefault(event.scope, event.message_id)
        return Failed(event, verdicts)
    addresses = [
        (event.scope, verdict.binding.document, verdict.answer.key)
        for verdict in verdicts
        if isinstance(verdict.answer, Keyed)
    ]
    earlier = blocked_scopes.get(event.scope) or next(
        (blocked[address] for address in addresses if address in blocked), None
    )
    if earlier is not None:
        for address in addresses:
            blocked.setdefault(address, earlier)
        return Failed(event, BlockedByEarlierFailure(earlier))
    outcomes: list[Outcome] = []
    before = unit.scheduled
    for verdict in verdicts:
        if verdict.answer is None:
            outcomes.append(NoMatch(verdict.binding.id))
            continue
        try:
            async with unit.savepoint():
                outcomes.append(await _settle_one(unit, config, event, verdict, now, rows))
        except Exception as error:  # noqa: BLE001 - one event's failure is its own answer
            for address in addresses:
                blocked.setdefault(address, event.message_id)
            return Failed(event, error)
    return Routed(event, tuple(outcomes), _waiting(config, unit.scheduled - before))


async def deliver_event(
    config: RouterConfig,
    plan: Plan,
    *,
    scope: str,
    key: str,
    event: Event,
    message_id: str,
    now: datetime | None = None,
    connection: Connection | None = None,
) -> Outcome:
    """Deliver ``event`` to the execution ``(scope, plan.document, key)`` addresses,
    with the same claim, address lookup and ledger row as a binding's delivery, filed
    under ``plan.id`` (a host job's answer coming back: a failed send, a sink's
    reply). Use an id of your own, not a binding's; ``create`` is usually ``never``.

    Raises:
        ValueError: ``plan.id`` is a binding's or a reserved id (its dedupe claims
            would be the binding's), or ``now`` is naive.
        Exception: as :func:`route`, for its one delivery.
    """
    if plan.id in RESERVED_BINDING_IDS or plan.id in {b.id for b in config.bindings or ()}:
        raise ValueError(
            f"plan id {plan.id!r} is a binding's or reserved: its claims would be the "
            "binding's; give the host job an id of its own"
        )
    moment = config.storage.clock() if now is None else _aware(now)
    delivery = Delivery(plan, scope, key, event, message_id)

    async def settle(unit: Unit) -> Outcome:
        return await deliver(unit, config, delivery, moment)

    return await _alone(config, connection, delivery_locks(plan, scope, key, message_id), settle)
