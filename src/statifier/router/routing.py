"""The router: a :class:`RouterConfig` run on its database, and every way into it.

:meth:`Router.route` routes one event, one transaction per binding delivery (or a
savepoint each inside a caller's transaction). :meth:`Router.route_many` routes a batch
in one transaction, its reads set-based (:mod:`statifier.router.batch`), so a stream
front commits once per batch;
:meth:`Router.plan` reads an event's bindings once, for a front that chooses a lane by
the event's key before it routes. :meth:`Router.deliver_event` is the way in for a
host's own jobs: one event to one address, under a plan of the host's.
:meth:`Router.deliver_post` is the BasicHTTP front's: an event posted to an execution's
location. Each of these calls opens its own router transaction
(:mod:`statifier.router.transaction`) and passes the delivery down explicitly.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.buckets import address_bucket
from statifier.core import Event
from statifier.persistence import Discarded, Storage
from statifier.persistence.reentry import hold
from statifier.persistence.shards import Shard
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.repeats import IntervalTally
from statifier.router.batch import prepare
from statifier.router.binding import Binding, Create, Keyed, Mode, Order, Plan, ProgramFailed
from statifier.router.config import (
    BUILT_IN,
    RESERVED_BINDING_IDS,
    Entry,
    RouterConfig,
    error_policy_of,
)
from statifier.router.delivery import (
    EXECUTION_PLAN_ID,
    Claimed,
    Delivery,
    deliver,
    deliver_to_execution,
)
from statifier.router.errors import BindingsUnresolved, ConfigError, RouterError
from statifier.router.flow import arrive
from statifier.router.locations import (
    Located,
    location_in,
    resolve,
    rotate_location_in,
    token_shaped,
)
from statifier.router.outbox import OutboxRoute
from statifier.router.outcomes import (
    Failed,
    InboundEvent,
    KeyRefused,
    NoMatch,
    Outcome,
    Routed,
)
from statifier.router.pausing import Resumed, step_held
from statifier.router.records import LedgerRow
from statifier.router.sending import SHARD_REFUSAL_QUEUE, SendHandler
from statifier.router.subscriptions import (
    Subscription,
    subscribe_in,
    subscriptions_in,
    unsubscribe_in,
)
from statifier.router.timer_queue import TimerQueue
from statifier.router.timers import SqlTimerQueue
from statifier.router.transaction import (
    Delivering,
    RouterParts,
    Unit,
    around,
    lock_key,
    retried,
    sorted_locks,
    statements_for,
    transaction,
)
from statifier.sql.caps import CapTable
from statifier.sql.flow import FlowTable
from statifier.telemetry import enabled, report

__all__ = [
    "POST_PLAN_ID",
    "BlockedByEarlierFailure",
    "Planned",
    "Router",
    "Verdict",
    "delivery_locks",
]

_log = logging.getLogger(__name__)
_repeats = IntervalTally()

_T = TypeVar("_T")
_ROUTE = "statifier.router.route"
_DELIVERY = "statifier.router.delivery"

POST_PLAN_ID: Final = "basichttp"
"""The reserved binding id the ledger files posts to BasicHTTP locations under."""

Connection = sa.Connection | AsyncConnection


class BlockedByEarlierFailure(RouterError):  # noqa: N818 - names the refusal
    """An event of a batch not routed because an earlier event of the batch, for one of
    the same addresses, failed: routing it first would break its key's order."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"an earlier event of the batch ({message_id!r}) failed on its address")
        self.message_id = message_id


@dataclass(frozen=True, slots=True)
class Verdict:
    """One enabled binding's answer for one event.

    Attributes:
        binding: the binding.
        answer: :class:`~statifier.router.Keyed` (deliver under that key),
            :class:`~statifier.router.binding.ProgramFailed` (write the refusal to the
            ledger) or ``None`` (its match does not hold).
    """

    binding: Binding
    answer: Keyed | ProgramFailed | None

    def delivery(self, event: InboundEvent) -> Delivery:
        assert isinstance(self.answer, Keyed)
        binding = self.binding
        chart_event = Event(binding.event, data=binding.project(event.data))
        return Delivery(
            binding.plan, event.scope, self.answer.key, chart_event, event.message_id, event.source
        )

    def locks(self, event: InboundEvent) -> list[int]:
        """The lock keys this verdict's delivery takes up front (PostgreSQL)."""
        if not isinstance(self.answer, Keyed):
            return []
        return delivery_locks(self.binding.plan, event.scope, self.answer.key, event.message_id)


@dataclass(frozen=True, slots=True)
class Planned:
    """An event with its bindings read and evaluated (:meth:`Router.plan`), ready to
    route without reading them again.

    Attributes:
        event: the event.
        verdicts: the results of the enabled bindings of its source, in binding order.
        key: its partition key: ``scope/document/key`` of the first enabled binding of
            its source with ``order = by_key`` that keys it, else its message id. Events
            with one partition key must be routed in order; others need not be.
    """

    event: InboundEvent
    verdicts: tuple[Verdict, ...]

    @property
    def key(self) -> str:
        event = self.event
        for verdict in self.verdicts:
            binding = verdict.binding
            if binding.order is Order.BY_KEY and isinstance(verdict.answer, Keyed):
                return f"{event.scope}/{binding.document}/{verdict.answer.key}"
        return event.message_id


def delivery_locks(plan: Plan, scope: str, key: str, message_id: str) -> list[int]:
    """The lock keys of one delivery: its dedupe claim and, unless it creates a new
    execution every time, its address."""
    keys = [lock_key("dedupe", plan.id, message_id)]
    if plan.create is not Create.ALWAYS_NEW:
        keys.append(lock_key("address", scope, plan.document, key))
    return keys


class Router:
    """A router configuration run on its database: the one object every call into the
    router goes through.

    It builds, once, what every transaction needs (the storage, the router's
    statements, the timer queue, the error policy, the start options), and opens the
    router transactions its calls and a host's jobs run in.

    >>> import asyncio, tempfile
    >>> from pathlib import Path
    >>> from statifier.chart import compile_chart
    >>> from statifier.persistence.sql import SqlAdapter
    >>> from statifier.router import Binding, InboundEvent, RouterConfig, StaticResolver
    >>> from statifier.sql import migrations
    >>> chart = compile_chart('''<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">
    ...   <state id="a"><transition event="go" target="b"/></state><state id="b"/></scxml>''')
    >>> hits = Binding(id="hits", source="clicks", match="true", key="event.user",
    ...                document="counter", event="go")
    >>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'router.db'}"
    >>> migrations.upgrade(url)
    >>> async def main() -> list[str]:
    ...     async with SqlAdapter(url) as adapter:
    ...         router = Router(RouterConfig(adapter, bindings=[hits],
    ...                                      resolver=StaticResolver({"counter": chart})))
    ...         event = InboundEvent(scope="demo", source="clicks", message_id="m1",
    ...                              data={"user": "ada"})
    ...         routed = await router.route(event)
    ...         return [outcome.outcome for outcome in routed.outcomes]
    >>> asyncio.run(main())
    ['created_and_delivered']

    Args:
        config: what it runs.
        shard: its place among the stores of a
            :class:`~statifier.router.ShardedRouter`, which gives it: a send to an
            execution whose address falls in another store's buckets is then handed
            to the outbox (queue :data:`~statifier.router.sending.SHARD_HOP_QUEUE`)
            instead of delivered in the sender's transaction.

    Raises:
        ConfigError: ``config`` is not a :class:`RouterConfig` (which refused at its
            construction whatever cannot work).
    """

    def __init__(self, config: RouterConfig, *, shard: Shard | None = None) -> None:
        if not isinstance(config, RouterConfig):
            raise ConfigError(f"a Router runs a RouterConfig, not {config!r}")
        store = config.store
        storage = store if isinstance(store, Storage) else Storage(store)
        adapter = storage.adapter
        assert isinstance(adapter, SqlAdapter)  # the configuration refuses any other
        queue = config.timer_queue
        timers: TimerQueue | None
        if queue == BUILT_IN:
            timers = SqlTimerQueue(adapter, storage.codec)
        else:
            assert not isinstance(queue, str)
            timers = queue
        self.config: Final = config
        self.storage: Final = storage
        self.adapter: Final = adapter
        self.timers: Final = timers
        self._parts = RouterParts(
            config,
            storage,
            statements_for(adapter),
            FlowTable(adapter.tables, adapter.dialect),
            CapTable(adapter.tables, adapter.dialect),
            timers,
            config.chart_start_options,
            error_policy_of(config.on_error, config.document_on_error, config.resolver),
            SendHandler,
            shard,
        )

    def transaction(
        self, connection: Connection | None = None, *, entered: Entry | None = None
    ) -> AbstractAsyncContextManager[Unit]:
        """A router transaction on this router's database (see
        :mod:`statifier.router.transaction`), or one joined to ``connection`` (with a
        transaction the caller began, and ends). ``entered`` is the entry whose
        ``around_delivery`` call encloses what runs in it (a send to an execution
        target there is not wrapped again): the timer worker's fires pass
        :attr:`~statifier.router.Entry.TIMER`."""
        return transaction(self._parts, connection, entered)

    async def in_transaction(
        self,
        work: Callable[[Unit], Awaitable[_T]],
        *,
        connection: Connection | None = None,
        entered: Entry | None = None,
        batch: bool = False,
    ) -> _T:
        """Run ``work`` in a router transaction of its own and commit it; answer what
        ``work`` returned in the attempt that committed. A transaction that fails with
        a serialization failure or a deadlock (SQLSTATE 40001 or 40P01) is rolled back
        and ``work`` run again from its start, at most
        :attr:`~statifier.router.RouterConfig.transaction_attempts` times in all, then
        the error is raised (:func:`~statifier.router.transaction.retried`): ``work``
        builds its answer anew each time, and whatever it does outside the database
        (a hook, an executor) it does again.

        Given ``connection`` (with a transaction the caller began, and ends), ``work``
        runs once in it and nothing is retried: only the caller can run its
        transaction again from the start. On SQLite nothing is retried. ``entered`` is
        as for :meth:`transaction`. ``batch`` says that the transaction writes for many
        events: on SQLite its commit then runs on a worker thread where the adapter's
        connection may cross threads, the loop free meanwhile (:meth:`SqlAdapter.transaction
        <statifier.persistence.sql.SqlAdapter.transaction>`); given ``connection`` the
        caller commits, and ``batch`` changes nothing.
        """
        return await retried(self._parts, work, connection, entered, batch)

    # Routing an event.

    async def plan(self, event: InboundEvent) -> Planned:
        """Read the bindings of ``event``'s scope under ``around_delivery`` with
        :attr:`~statifier.router.Entry.PARTITION`, and evaluate those of its source:
        :attr:`Planned.key` chooses a lane, and :meth:`route_many` routes it without
        reading them again.

        Raises:
            BindingsUnresolved: the bindings resolver failed for the event's scope.
        """
        return await self._read(event, Entry.PARTITION)

    async def route(
        self,
        event: InboundEvent | Planned,
        *,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> Routed:
        """Route ``event``: one outcome per enabled binding of its source, in binding
        order (a :class:`Planned` event: one per verdict :meth:`plan` made).

        Each binding's delivery is one transaction, run again from its start when it
        loses a conflict (:meth:`in_transaction`); a savepoint each, given
        ``connection``, a connection of the adapter's engine on which the caller began a
        transaction: it all commits or rolls back with the caller's transaction, and
        nothing is run again. ``now`` defaults to the storage's clock.

        Raises:
            ValueError: ``now`` is naive.
            BindingsUnresolved: the bindings resolver failed for the event's scope.
            UnresolvedDocument, ChartUnresolved, ExecutionParked: see
                :func:`~statifier.router.delivery.deliver`.
            Exception: from the database, persistence or the executor. The delivery that
                raised left nothing behind; those of earlier bindings stay committed. A
                front must not acknowledge the event.
        """
        started = time.perf_counter()
        moment = self._now(now)
        inbound = event.event if isinstance(event, Planned) else event
        given = event

        async def work() -> Routed:
            outcomes: list[Outcome] = []
            scheduled: list[int] = []
            planned = given if isinstance(given, Planned) else await self.evaluate(inbound)
            for verdict in planned.verdicts:
                if verdict.answer is None:
                    outcomes.append(NoMatch(verdict.binding.id))
                    continue

                async def settle(unit: Unit, verdict: Verdict = verdict) -> Outcome:
                    return await _settle_one(unit, inbound, verdict, moment)

                locks = verdict.locks(inbound)
                outcomes.append(
                    await self._alone(
                        connection, locks, settle, scheduled, (inbound.scope, Entry.ROUTE)
                    )
                )
            return Routed(inbound, tuple(outcomes), self._waiting(sum(scheduled)))

        return _reported(await self._around(inbound.scope, Entry.ROUTE, work), started)

    async def route_in(
        self,
        unit: Unit,
        event: InboundEvent | Planned,
        entry: Entry,
        *,
        now: datetime | None = None,
    ) -> Routed:
        """Route ``event`` in ``unit``, a router transaction the caller opened (and
        ends) with what else it writes: one outcome per enabled binding of its source,
        in binding order (a :class:`Planned` event: one per verdict :meth:`plan`
        made), each delivery after ``on_begin`` (told the event's scope and
        ``entry``) and under its locks, all committed or rolled back with the caller's
        transaction. The caller runs this under ``around_delivery`` if it wants one: the
        scheduler does, after it claimed the schedule's row in the same transaction.

        Raises:
            ValueError: ``now`` is naive.
            BindingsUnresolved, UnresolvedDocument, ChartUnresolved, ExecutionParked,
                Exception: as :meth:`route`; ``unit`` must then be rolled back (or
                rolled back to a savepoint the caller took before the call).
        """
        started = time.perf_counter()
        moment = self._now(now)
        planned = event if isinstance(event, Planned) else await self.evaluate(event)
        event = planned.event
        outcomes: list[Outcome] = []
        scheduled = unit.scheduled
        for verdict in planned.verdicts:
            if verdict.answer is None:
                outcomes.append(NoMatch(verdict.binding.id))
                continue
            await unit.begin(event.scope, entry)
            await _lock(unit, sorted_locks(verdict.locks(event)))
            outcomes.append(await _settle_one(unit, event, verdict, moment))
        routed = Routed(event, tuple(outcomes), self._waiting(unit.scheduled - scheduled))
        return _reported(routed, started)

    async def route_many(
        self,
        events: Sequence[InboundEvent | Planned],
        *,
        now: datetime | None = None,
        connection: Connection | None = None,
    ) -> list[Routed | Failed]:
        """Route a batch in one transaction (or inside the caller's, given
        ``connection``): one answer per event, in order. A :class:`Planned` event is
        routed by the verdicts :meth:`plan` made; for any other the bindings are read
        here.

        The batch is settled set-based first (:mod:`statifier.router.batch`: its claims,
        addresses, executions' locks and rows read in a fixed number of statements,
        then each event stepped in order). If a delivery raises, that attempt is rolled
        back and the batch settled again with every delivery at its own savepoint, so
        an event whose routing raises is returned :class:`Failed` (its earlier
        bindings' deliveries stand) and the others commit. Later events of the batch
        for an address a failed event touched, and for any address in a scope whose
        bindings could not be read, fail as
        :class:`BlockedByEarlierFailure`: a key's events keep their order. On PostgreSQL
        the batch takes its locks for every claim and address up front, in one
        sorted order, so two batches never deadlock.

        A batch whose transaction loses a conflict (SQLSTATE 40001 or 40P01, at one
        event's savepoint too) is rolled back and settled again whole
        (:meth:`in_transaction`); the answers are those of the attempt that committed.
        On its last attempt such an error is answered as any other. Given
        ``connection``, nothing is run again.

        ``around_delivery`` is called under the event's scope around reading its
        bindings (unless it comes planned) and around its deliveries; the batch's
        begin, locks and commit run outside it. With ``around_delivery`` or
        ``on_begin`` configured, each event settles at a savepoint of its own around
        the wrapper's call, ``on_begin`` first in it and the event's ledger rows last
        (a wrapper that raises undoes its event's work); without either, the ledger
        rows of the whole batch are written at once before the commit.

        Raises:
            ValueError: ``now`` is naive.
            LockTimeout: on PostgreSQL, the batch's locks were not granted within
                ``lock_wait``; nothing was written.
            Exception: the transaction itself failed (the database went away, the
                commit failed): nothing of the batch is committed.
        """
        moment = self._now(now)
        planned: list[Planned | BaseException] = []
        for given in events:
            if isinstance(given, Planned):
                planned.append(given)
                continue
            try:
                planned.append(await self._read(given, Entry.ROUTE))
            except Exception as error:  # noqa: BLE001 - the event's own answer, not the batch's
                planned.append(error)
        batch = [given.event if isinstance(given, Planned) else given for given in events]
        locks = sorted_locks(
            key
            for plan in planned
            if isinstance(plan, Planned)
            for verdict in plan.verdicts
            for key in verdict.locks(plan.event)
        )
        hooked = self.config.around_delivery is not None or self.config.on_begin is not None
        ready = [plan for plan in planned if isinstance(plan, Planned)]

        async def attempt(unit: Unit) -> tuple[list[Routed | Failed], list[float]]:
            # Each attempt settles the batch anew: its answers are the committed one's.
            await _lock(unit, locks)
            settled = None
            if not hooked and len(ready) == len(planned):
                settled = await self._at_once(unit, ready, moment)
            if settled is None:
                settled = await self._one_by_one(unit, batch, planned, moment, hooked)
            return settled

        answers, durations = await self.in_transaction(
            attempt, connection=connection, entered=Entry.ROUTE, batch=len(events) > 1
        )
        for answer, duration in zip(answers, durations, strict=True):
            if isinstance(answer, Routed):
                _reported(answer, 0.0, duration)
        return answers

    async def _at_once(
        self, unit: Unit, planned: list[Planned], now: datetime
    ) -> tuple[list[Routed | Failed], list[float]] | None:
        """Settle a batch set-based (:mod:`statifier.router.batch`): the claims,
        addresses, executions' locks and rows of every delivery read up front, then
        each event settled in order, the steps' writes sent together where the
        database gains by it (:meth:`Storage.deferred_steps`) and the ledger rows with
        the others', all at one savepoint. ``None`` when a delivery raised: the
        savepoint is rolled back, and the caller settles the batch one event at a
        time, each at its own savepoint, to answer the failing event alone."""
        deliveries = [
            verdict.delivery(plan.event)
            for plan in planned
            for verdict in plan.verdicts
            if isinstance(verdict.answer, Keyed) and verdict.binding.mode is Mode.EACH
        ]
        answers: list[Routed | Failed] = []
        durations: list[float] = []
        scheduled = unit.scheduled
        try:
            async with unit.savepoint():
                prepared = await prepare(unit, deliveries, now)
                claims = zip(deliveries, prepared.claims, strict=True)
                rows: list[LedgerRow] = []
                with unit.holding(prepared.held):
                    async with unit.deferred_steps():
                        for plan in planned:
                            started = time.perf_counter()
                            answer = await self._planned_event(unit, plan, now, rows, claims)
                            answers.append(answer)
                            durations.append(time.perf_counter() - started)
                await unit.sql.record_many(rows)
        except Exception as error:  # settled again, one event at a time
            if unit.reruns(error):
                raise  # a lost conflict: the whole batch is run again
            # An error that comes again there is the failing event's own answer; one that
            # does not (a lock wait that ran out) would be seen nowhere but here. A
            # database's error by its class and SQLSTATE only: its message may quote
            # the batch's parameters, and with them the events' data.
            cause = getattr(error, "orig", None) or error
            state = getattr(cause, "sqlstate", None)
            if state is not None or cause is not error:
                said = type(error).__name__ + (f" (SQLSTATE {state})" if state else "")
            else:
                said = f"{type(error).__name__}: {error}"
            _repeats.note(
                "batch_one_by_one",
                lambda: _log.warning(
                    "a delivery batch is settled again one event at a time after %s", said
                ),
                lambda count: _log.warning(
                    "%d more delivery batches settled again one event at a time", count
                ),
            )
            unit.scheduled = scheduled
            return None
        return answers, durations

    async def _planned_event(
        self,
        unit: Unit,
        plan: Planned,
        now: datetime,
        rows: list[LedgerRow],
        claims: Iterator[tuple[Delivery, Claimed | bool]],
    ) -> Routed:
        """One event of a set-based batch, under ``around_delivery`` (if any): each
        delivery (made once, for the batch's reads) with its claim, the next of
        ``claims``."""
        event = plan.event

        async def settle() -> Routed:
            outcomes: list[Outcome] = []
            before = unit.scheduled
            for verdict in plan.verdicts:
                if verdict.answer is None:
                    outcomes.append(NoMatch(verdict.binding.id))
                    continue
                given = (
                    next(claims)
                    if isinstance(verdict.answer, Keyed) and verdict.binding.mode is Mode.EACH
                    else None
                )
                outcomes.append(await _settle_one(unit, event, verdict, now, rows, given))
            return Routed(event, tuple(outcomes), self._waiting(unit.scheduled - before))

        return await self._around(event.scope, Entry.ROUTE, settle)

    async def _one_by_one(
        self,
        unit: Unit,
        batch: list[InboundEvent],
        planned: list[Planned | BaseException],
        now: datetime,
        hooked: bool,
    ) -> tuple[list[Routed | Failed], list[float]]:
        """Settle a batch one event at a time, each delivery at its own savepoint."""
        answers: list[Routed | Failed] = []
        durations: list[float] = []
        blocked = _Blocked()
        # The deliveries' ledger rows, written at once before the commit: a row is
        # appended only by a delivery that settled, so the rows are exactly theirs.
        rows: list[LedgerRow] = []
        for event, plan in zip(batch, planned, strict=True):

            async def settle(
                event: InboundEvent = event, plan: Planned | BaseException = plan
            ) -> Routed | Failed:
                if hooked:
                    return await self._own_batch_event(unit, event, plan, now, blocked)
                return await self._batch_event(unit, event, plan, now, blocked, rows)

            started = time.perf_counter()
            try:
                if hooked:
                    # A wrapper that raises after its work undoes the work too.
                    async with unit.savepoint():
                        answer = await self._around(event.scope, Entry.ROUTE, settle)
                else:
                    answer = await self._around(event.scope, Entry.ROUTE, settle)
                answers.append(answer)
            except Exception as error:  # around_delivery raised for it
                if unit.reruns(error):
                    raise  # a lost conflict: the whole batch is run again
                blocked.scopes.setdefault(event.scope, event.message_id)
                answers.append(Failed(event, error))
            durations.append(time.perf_counter() - started)
        await unit.sql.record_many(rows)
        return answers, durations

    async def deliver_event(
        self,
        plan: Plan,
        *,
        scope: str,
        key: str,
        event: Event,
        message_id: str,
        now: datetime | None = None,
        connection: Connection | None = None,
        entry: Entry | None = None,
    ) -> Outcome:
        """Deliver ``event`` to the execution ``(scope, plan.document, key)`` addresses,
        with the same claim, address lookup and ledger row as a binding's delivery,
        filed under ``plan.id`` (a host job's answer coming back: a failed send, a
        sink's reply). Use an id of your own, not a binding's; ``create`` is usually
        ``never``.

        It is the host's call, wrapped by nothing of the router's, unless ``entry`` is
        given: then ``around_delivery`` encloses it, and ``on_begin`` begins its
        transaction, told ``scope`` and ``entry``, as for the router's own entries
        (the outbox's failure report passes :attr:`~statifier.router.Entry.OUTBOX`).

        Raises:
            ValueError: ``plan.id`` is a binding's or a reserved id (its dedupe claims
                would be the binding's), or ``now`` is naive.
            Exception: as :meth:`route`, for its one delivery.
        """
        bindings = self.config.bindings or ()
        if plan.id in RESERVED_BINDING_IDS or plan.id in {b.id for b in bindings}:
            raise ValueError(
                f"plan id {plan.id!r} is a binding's or reserved: its claims would be the "
                "binding's; give the host job an id of its own"
            )
        moment = self._now(now)
        delivery = Delivery(plan, scope, key, event, message_id)

        async def settle(unit: Unit) -> Outcome:
            return await deliver(unit, delivery, moment)

        locks = delivery_locks(plan, scope, key, message_id)
        if entry is None:
            return await self._alone(connection, locks, settle)
        entered = entry

        async def work() -> Outcome:
            return await self._alone(connection, locks, settle, None, (scope, entered))

        return await self._around(scope, entered, work)

    async def deliver_send(
        self,
        *,
        scope: str,
        document: str,
        key: str,
        create: str,
        event: Event,
        message_id: str,
        sender: str | None,
        now: datetime | None = None,
    ) -> tuple[str, str] | None:
        """Deliver a send of the router's type to ``target="execution"`` that another
        store's execution made (:class:`~statifier.router.ShardedRouter` hands it over
        from the sender's outbox): the execution ``(scope, document, key)`` addresses
        receives ``event`` in a transaction of its own, under ``around_delivery`` and
        ``on_begin`` with :attr:`~statifier.router.Entry.TARGET`, filed under the
        ledger's ``execution`` id with ``message_id`` (the send's key: a second hand-over
        is a duplicate), as in the sender's own transaction on one database.

        Returns ``None`` when delivered (or a duplicate), else the refusal's ``(code,
        detail)`` (``no_execution``, ``finished``). Its ``send_refused`` ledger row,
        naming ``sender``, and the sender's ``error.communication`` (``_event.sendid``
        the send's id), an outbox row of queue
        :data:`~statifier.router.sending.SHARD_REFUSAL_QUEUE` under the key
        ``<message_id>/refused``, commit with it.

        Raises:
            ValueError: ``create`` is neither ``never`` nor ``if_absent``, or ``now`` is
                naive.
            Exception: as :meth:`route`, for its one delivery.
        """
        if create not in ("never", "if_absent"):
            raise ValueError(f"create must be never or if_absent, not {create!r}")
        moment = self._now(now)
        plan = Plan(EXECUTION_PLAN_ID, document=document, create=Create(create))

        async def settle(unit: Unit) -> tuple[str, str] | None:
            why = await deliver_to_execution(
                unit,
                Delivering(scope, moment),
                document=document,
                key=key,
                create=create,
                event=event,
                message_id=message_id,
            )
            if why is not None:
                await unit.sql.record(
                    LedgerRow(
                        EXECUTION_PLAN_ID,
                        message_id=message_id,
                        scope=scope,
                        source=None,
                        outcome="send_refused",
                        reason=f"{why[0]}: {why[1]}",
                        document=None,
                        key=EXECUTION_PLAN_ID,
                        execution_id=sender,
                        inserted_at=moment,
                        # In the target's store: filed in its address's bucket, which
                        # that store's reaper and a reshard reach (not the sender's).
                        bucket=address_bucket(scope, document, key),
                    )
                )
                if sender is not None:
                    # Told in the refusal's transaction: neither commits without the other.
                    told = Event(
                        "error.communication",
                        type="platform",
                        data={"message": why[1]},
                        sendid=event.sendid,
                    )
                    await OutboxRoute(unit.tx.adapter, codec=unit.storage.codec).hand_off(
                        unit.tx,
                        SHARD_REFUSAL_QUEUE,
                        f"{message_id}/refused",
                        told,
                        execution_id=sender,
                        scope=scope,
                        now=moment,
                        # This transaction is the target's, in the target's store:
                        # the row falls in its bucket, which this store's drain leases.
                        bucket=address_bucket(scope, document, key),
                    )
            return why

        async def attempt(unit: Unit) -> tuple[str, str] | None:
            await unit.begin(scope, Entry.TARGET)
            await _lock(unit, sorted_locks(delivery_locks(plan, scope, key, message_id)))
            return await settle(unit)

        async def work() -> tuple[str, str] | None:
            return await self.in_transaction(attempt, entered=Entry.TARGET)

        return await self._around(scope, Entry.TARGET, work)

    async def deliver_post(
        self,
        token: str,
        event: Event,
        *,
        send_key: str | None = None,
        now: datetime | None = None,
    ) -> Outcome | None:
        """Deliver ``event`` to the execution the BasicHTTP location ``token`` reaches,
        in a transaction of its own, filed under :data:`POST_PLAN_ID` and never
        creating one; ``None`` when it reaches none (unknown or rotated away). A post
        with a ``send_key`` is delivered once per execution and key within the
        ``basichttp`` horizon.

        The outcome is the router's: :class:`~statifier.router.Delivered` or
        ``dropped: unmatched_event`` (delivered), :class:`~statifier.router.Duplicate`
        (the send key was delivered already), ``dropped: finished`` (the execution has
        ended). The token is read again inside the delivery's transaction, after its
        locks: a rotation committed in between makes it ``None``. ``around_delivery``
        wraps the delivery with :attr:`~statifier.router.Entry.BASICHTTP`, once the
        token's scope is known, and ``on_begin`` begins the delivery's transaction, before
        its locks.

        Raises:
            ConfigError: the configuration has no ``basichttp``.
            ValueError: ``now`` is naive.
            Exception: as :meth:`route`, for its one delivery.
        """
        settings = self.config.basichttp
        if settings is None:
            raise ConfigError("the configuration has no basichttp: no execution has a location")
        moment = self._now(now)
        if not token_shaped(token):
            return None  # no token ever minted: nothing to read
        async with self.transaction() as unit:
            found = await resolve(unit, token)
        if found is None:
            return None
        plan = Plan(
            POST_PLAN_ID, document=found.document, create=Create.NEVER, horizon=settings.horizon
        )
        delivery = Delivery(plan, found.scope, found.key, event, _post_id(found, send_key))
        locks = sorted_locks(delivery_locks(plan, found.scope, found.key, delivery.message_id))

        async def attempt(unit: Unit) -> Outcome | None:
            await unit.begin(found.scope, Entry.BASICHTTP)
            await unit.lock(locks, self.config.lock_wait)
            again = await resolve(unit, token)
            if again is None or again.execution_id != found.execution_id:
                return None
            return await deliver(unit, delivery, moment)

        async def work() -> Outcome | None:
            return await self.in_transaction(attempt, entered=Entry.BASICHTTP)

        return await self._around(found.scope, Entry.BASICHTTP, work)

    # A host's operations on executions.

    async def subscribe(self, execution_id: str, binding_id: str, invoke_id: str) -> Subscription:
        """Subscribe ``execution_id`` to ``binding_id`` under the invocation
        ``invoke_id``, as a source invoke does (:mod:`statifier.router.subscriptions`),
        in a transaction of its own. Subscribing an invocation that is already
        subscribed writes nothing and returns the row written first.

        Raises:
            SubscriptionRefused: the execution has no address, or the binding is unknown
                in its scope, disabled, not a ``subscription`` binding, or addresses
                another document.
            ValueError: an empty ``invoke_id``.
        """
        given: object = invoke_id
        if not isinstance(given, str) or not given:
            raise ValueError(f"an invoke id is a non-empty string, not {given!r}")
        async with self.transaction() as unit:
            now = self.storage.clock()
            return await subscribe_in(unit, execution_id, binding_id, invoke_id, now)

    async def unsubscribe(self, execution_id: str, invoke_id: str) -> bool:
        """Delete the subscription of the invocation ``invoke_id`` of ``execution_id``,
        and nothing else (not the execution's other subscriptions, not its address);
        returns whether there was one."""
        async with self.transaction() as unit:
            return await unsubscribe_in(unit, execution_id, invoke_id)

    async def subscriptions_of(self, execution_id: str) -> list[Subscription]:
        """The live subscriptions of ``execution_id``, oldest first."""
        async with self.transaction() as unit:
            return await subscriptions_in(unit, execution_id)

    async def pause(self, execution_id: str) -> bool:
        """Pause the active ``execution_id``, in a transaction of its own: until
        :meth:`resume`, what is sent to it and its timers that come due are held, in
        order (:mod:`statifier.router.pausing`).

        Returns:
            ``True`` when it was paused now; ``False`` when it was not active (paused
            already, parked, or ended): nothing changed.

        Raises:
            ExecutionNotFound: no such execution.
            LockTimeout: a step held it longer than the lock wait.
        """
        async with self.transaction() as unit:
            lifecycle = unit.executions(Delivering(None, self._now(None)))
            return not isinstance(await lifecycle.pause(execution_id), Discarded)

    async def resume(
        self,
        execution_id: str,
        *,
        now: datetime | None = None,
        record: Callable[[SqlTransaction, Resumed], Awaitable[object]] | None = None,
    ) -> Resumed | None:
        """Resume the paused ``execution_id`` and step in what was held for it, oldest
        first, in one transaction: under ``around_delivery`` and ``on_begin`` with
        :attr:`~statifier.router.Entry.RESUME` and the scope of its address (none for an
        execution no address names). Its delayed sends are timed from ``now``.
        ``record`` (an audit row, say) runs last in the same transaction, given it and
        what the resume did; what it raises rolls the resume back.

        Returns:
            what the resume did, or ``None`` when the execution was not paused
            (nothing changed).

        Raises:
            ExecutionNotFound: no such execution.
            ValueError: ``now`` is naive.
            Exception: whatever a held event's step or the database raised: nothing
                of the resume stands, and the execution stays paused with its events.
        """
        moment = self._now(now)
        async with self.transaction() as unit:
            found = await unit.sql.address_of(execution_id)
        scope = None if found is None else found[0]

        async def work() -> Resumed | None:
            entered = None if scope is None else Entry.RESUME
            async with self.transaction(entered=entered) as unit:
                if scope is not None:
                    await unit.begin(scope, Entry.RESUME)
                lifecycle = unit.executions(Delivering(scope, moment))
                if isinstance(await lifecycle.resume(execution_id), Discarded):
                    return None
                resumed = await step_held(unit, execution_id, moment)
                if record is not None:
                    await record(unit.tx, resumed)
                return resumed

        if scope is None:
            return await work()
        return await self._around(scope, Entry.RESUME, work)

    async def location(self, execution_id: str) -> str | None:
        """The live BasicHTTP location of ``execution_id``, ``None`` when it has none
        (see :func:`~statifier.router.locations.location_in`).

        Raises:
            ConfigError: the configuration has no ``basichttp``.
            LocationRotated: it was rotated; the router keeps only the live token's
                hash, so the live location is the one :meth:`rotate_location` returned.
        """
        async with self.transaction() as unit:
            return await location_in(unit, execution_id)

    async def rotate_location(self, execution_id: str) -> str:
        """Give ``execution_id`` a new BasicHTTP location and answer it; the old one
        reaches nothing from the commit on. The chart's ``_ioprocessors`` still holds
        the first one.

        Raises:
            ConfigError: the configuration has no ``basichttp``.
            NoLocation: the execution has no location to replace.
        """
        async with self.transaction() as unit:
            return await rotate_location_in(unit, execution_id)

    # Helpers.

    def _now(self, now: datetime | None) -> datetime:
        """``now``, refused if naive (every stored time is an instant), or the storage's
        clock."""
        if now is None:
            return self.storage.clock()
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, not {now!r}")
        return now

    async def _read(self, event: InboundEvent, entry: Entry) -> Planned:
        """:meth:`_planned` under ``around_delivery``, told ``entry``."""

        async def read() -> Planned:
            return await self.evaluate(event)

        return await self._around(event.scope, entry, read)

    async def evaluate(self, event: InboundEvent) -> Planned:
        """Read the bindings of ``event``'s scope and evaluate those of its source, as
        :meth:`plan` does but under no ``around_delivery`` of its own (the caller's,
        if any: :meth:`route_in`'s caller wraps its work).

        Raises:
            BindingsUnresolved: the bindings resolver failed for the event's scope.
        """
        try:
            bindings = await self.config.bindings_for(event.scope)
        except Exception as error:
            raise BindingsUnresolved(event.scope, f"{type(error).__name__}: {error}") from error
        verdicts = tuple(
            Verdict(binding, binding.evaluate(event.data))
            for binding in bindings
            if binding.enabled and binding.source == event.source
        )
        return Planned(event, verdicts)

    async def _around(self, scope: str, entry: Entry, work: Callable[[], Awaitable[_T]]) -> _T:
        """``work`` under the configuration's ``around_delivery``, if any."""
        return await around(self.config, scope, entry, work)

    async def _alone(
        self,
        connection: Connection | None,
        locks: list[int],
        settle: Callable[[Unit], Awaitable[Outcome]],
        scheduled: list[int] | None = None,
        under: tuple[str, Entry] | None = None,
    ) -> Outcome:
        """One delivery in a transaction of its own (run again on a lost conflict:
        :meth:`in_transaction`), or in a savepoint of the caller's (never run again):
        given ``under`` (the scope and entry it runs under), ``on_begin`` first, then
        its locks (sorted, bounded by ``lock_wait``), then ``settle``; the count of
        timers it scheduled, in the attempt that committed, goes to ``scheduled``."""
        entered = None if under is None else under[1]

        async def attempt(unit: Unit) -> tuple[Outcome, int]:
            if connection is None:
                await _begun(unit, under)
                await _lock(unit, sorted_locks(locks))
                outcome = await settle(unit)
            else:
                async with unit.savepoint():
                    await _begun(unit, under)
                    await _lock(unit, sorted_locks(locks))
                    outcome = await settle(unit)
            return outcome, unit.scheduled

        outcome, count = await self.in_transaction(attempt, connection=connection, entered=entered)
        if scheduled is not None:
            scheduled.append(count)
        return outcome

    def _waiting(self, scheduled: int) -> tuple[str, ...]:
        """What an event's deliveries leave waiting for a timer worker that does not
        run in this process, said (and logged, once an interval), unless one runs
        elsewhere."""
        queue = self.timers
        if not scheduled or self.config.timers_elsewhere or not isinstance(queue, SqlTimerQueue):
            return ()
        if queue.on_schedule:  # a TimerWorker runs here: it was woken
            return ()
        notice = (
            f"{scheduled} timer{'s' if scheduled != 1 else ''} scheduled, and no timer "
            "worker runs in this process to fire them: run a TimerWorker (or statifier "
            "serve) on this database, or set RouterConfig(timers_elsewhere=True) where one "
            "runs elsewhere"
        )
        _repeats.note(
            ("no_timer_worker", id(queue)),
            lambda: _log.warning("%s", notice),
            lambda count: _log.warning(
                "%d more deliveries scheduled timers no worker fires", count
            ),
        )
        return (notice,)

    async def _own_batch_event(
        self,
        unit: Unit,
        event: InboundEvent,
        plan: Planned | BaseException,
        now: datetime,
        blocked: _Blocked,
    ) -> Routed | Failed:
        """:meth:`_batch_event` under the hooks, in the savepoint the batch opened for
        the event: ``on_begin`` first, the event's own ledger rows last."""
        rows: list[LedgerRow] = []
        await unit.begin(event.scope, Entry.ROUTE)
        answer = await self._batch_event(unit, event, plan, now, blocked, rows)
        if rows:
            await unit.sql.record_many(rows)
        return answer

    async def _batch_event(
        self,
        unit: Unit,
        event: InboundEvent,
        plan: Planned | BaseException,
        now: datetime,
        blocked: _Blocked,
        rows: list[LedgerRow],
    ) -> Routed | Failed:
        if isinstance(plan, BaseException):
            blocked.scopes.setdefault(event.scope, event.message_id)
            return Failed(event, plan)
        verdicts = plan.verdicts
        addresses = [
            (event.scope, verdict.binding.document, verdict.answer.key)
            for verdict in verdicts
            if isinstance(verdict.answer, Keyed)
        ]
        earlier = blocked.scopes.get(event.scope) or next(
            (blocked.addresses[address] for address in addresses if address in blocked.addresses),
            None,
        )
        if earlier is not None:
            for address in addresses:
                blocked.addresses.setdefault(address, earlier)
            return Failed(event, BlockedByEarlierFailure(earlier))
        outcomes: list[Outcome] = []
        before = unit.scheduled
        for verdict in verdicts:
            if verdict.answer is None:
                outcomes.append(NoMatch(verdict.binding.id))
                continue
            try:
                async with unit.savepoint():
                    outcomes.append(await _settle_one(unit, event, verdict, now, rows))
            except Exception as error:  # one event's failure is its own answer
                if unit.reruns(error):
                    raise  # a lost conflict: the whole batch is run again
                for address in addresses:
                    blocked.addresses.setdefault(address, event.message_id)
                return Failed(event, error)
        return Routed(event, tuple(outcomes), self._waiting(unit.scheduled - before))


@dataclass(slots=True)
class _Blocked:
    """What a batch's failures block: addresses, and scopes whose bindings could not be
    read, each naming the message id that failed first."""

    addresses: dict[tuple[str, str, str], str] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)


def _refusal_row(event: InboundEvent, verdict: Verdict, now: datetime) -> LedgerRow:
    assert isinstance(verdict.answer, ProgramFailed)
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


async def _settle_one(
    unit: Unit,
    event: InboundEvent,
    verdict: Verdict,
    now: datetime,
    rows: list[LedgerRow] | None = None,
    given: tuple[Delivery, Claimed | bool] | None = None,
) -> Outcome:
    """Settle one verdict in ``unit``: a refusal's ledger row, or the delivery (given
    ``given``, the delivery a batch made and its claim, made already: see
    ``deliver``). Given ``rows``, ledger rows are appended there instead of written
    (see ``deliver``)."""
    started = time.perf_counter()
    outcome: Outcome
    if isinstance(verdict.answer, ProgramFailed):
        row = _refusal_row(event, verdict, now)
        if rows is None:
            await unit.sql.record(row)
        else:
            rows.append(row)
        outcome = KeyRefused(verdict.binding.id, reason=verdict.answer.reason)
    elif verdict.binding.mode is not Mode.EACH:
        outcome = await arrive(unit, verdict.binding, verdict.delivery(event), now, rows)
    else:
        delivery, claimed = (verdict.delivery(event), False) if given is None else given
        outcome = await deliver(unit, delivery, now, rows, claimed=claimed)
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


async def _begun(unit: Unit, under: tuple[str, Entry] | None) -> None:
    """``on_begin`` for a delivery run ``under`` its scope and entry, if any."""
    if under is not None:
        await unit.begin(*under)


async def _lock(unit: Unit, keys: list[int]) -> None:
    """Take the router's locks ``keys`` in ``unit``, refusing at once a wait on one the
    calling task's own delivery holds (a route calling back into its sender)."""
    hold(unit.tx, [("router", key) for key in keys], "the router's lock of this address")
    await unit.lock(keys, unit.config.lock_wait)


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


def _post_id(found: Located, send_key: str | None) -> str:
    """The claim of one post: the execution and the send key (length-prefixed, so no
    two pairs spell one id), or a fresh id when there is no key."""
    execution_id = found.execution_id
    if send_key is None:
        return f"post:{execution_id}:{secrets.token_hex(16)}"
    return f"key:{len(execution_id)}:{execution_id}:{send_key}"
