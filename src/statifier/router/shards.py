"""A router over several databases: :class:`ShardedRouter`.

Each database (a *store*) holds whole ranges of the key buckets of a
:class:`~statifier.persistence.shards.ShardMap` and is a complete router database:
addresses, dedupe claims, ledger, executions, timers, held events, outbox. A delivery
goes to the store of its address's bucket
(:func:`~statifier.buckets.address_bucket`), and the execution it creates there gets
an id minted in that bucket (:func:`~statifier.ids.new_execution_id`), so everything
of one key (its address, its execution, the execution's timers and durable children,
its dedupe claims and ledger rows) is in one store, and a bare execution id finds its
store (:meth:`ShardedRouter.router_of_execution`).

What changes against one database:

- An event whose bindings key it to addresses in several stores is routed in each of
  them, one transaction per store: the parts are not one unit. A front acknowledges
  the event only when every part committed (:meth:`ShardedRouter.route_many` answers
  :class:`~statifier.router.Failed` otherwise, and a redelivery finds the committed
  parts' claims: duplicates).
- A send to ``target="execution"`` whose address another store holds is an *outbox
  hop*: the sender's step hands it to its store's outbox (queue
  :data:`~statifier.router.sending.SHARD_HOP_QUEUE`) under the send's key, and
  :meth:`ShardedRouter.hop_drains` deliver it to the target's store after the
  commit, deduped on that key (:meth:`Router.deliver_send
  <statifier.router.Router.deliver_send>`). A refusal (no execution at the address,
  or a finished one) is written to the target store's ledger together with an outbox
  row (queue :data:`~statifier.router.sending.SHARD_REFUSAL_QUEUE`) that the same
  drains deliver to the sender as ``error.communication`` (``_event.sendid`` the
  send's id): a later external event under the plan :data:`HOP_REFUSED_PLAN_ID`, not
  in the sending step as on one database. A sender with no address row to be told at
  is logged.
- A binding whose key cannot be computed writes its refusal row in the store of the
  event's message id's bucket.
- Timers, held events (debounce, batch, throttle) and outbox rows live in their
  execution's store: run one :class:`~statifier.router.TimerWorker`,
  :class:`~statifier.router.FlowWorker` and outbox drain per store
  (:attr:`ShardedRouter.routers`). Schedules live in the first store: a
  :class:`~statifier.router.Scheduler` given a sharded router claims a schedule's
  row there and routes its fire with :meth:`ShardedRouter.route_in`.
- A BasicHTTP token carries its execution's bucket (decision 0123):
  :meth:`ShardedRouter.deliver_post` asks that bucket's store alone. A token minted
  before tokens carried it is asked of every store, and the store that holds it
  delivers the post.
- An execution id that a host's ``execution_id`` mints outside the store of its
  address's bucket is refused (:class:`MisplacedExecution`): a bare id would not find
  it.

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
>>> folder = Path(tempfile.mkdtemp())
>>> urls = [f"sqlite:///{folder / f'store{number}.db'}" for number in range(3)]
>>> for url in urls:
...     migrations.upgrade(url)
>>> async def main() -> list[str]:
...     adapters = [SqlAdapter(url) for url in urls]
...     config = RouterConfig(adapters[0], bindings=[hits],
...                           resolver=StaticResolver({"counter": chart}))
...     router = ShardedRouter(config, adapters)
...     answers = await router.route_many(
...         [InboundEvent(scope="demo", source="clicks", message_id=f"m{number}",
...                       data={"user": f"user-{number}"}) for number in range(6)])
...     for adapter in adapters:
...         await adapter.close()
...     return [answer.outcomes[0].outcome for answer in answers]
>>> asyncio.run(main())[:2]
['created_and_delivered', 'created_and_delivered']
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Final, TypeVar

from statifier.buckets import address_bucket, bucket_of
from statifier.core import Event
from statifier.persistence import Storage
from statifier.persistence.shards import Shard, ShardMap
from statifier.persistence.sql import SqlAdapter
from statifier.router.binding import Create, Keyed, Order, Plan
from statifier.router.config import Entry, RouterConfig
from statifier.router.errors import RouterError
from statifier.router.locations import token_bucket
from statifier.router.outbox import DeadLetter, OutboxDrain, OutboxMessage
from statifier.router.outcomes import Failed, InboundEvent, NoMatch, Outcome, Routed
from statifier.router.queries import address_of
from statifier.router.routing import BlockedByEarlierFailure, Planned, Router, Verdict
from statifier.router.sending import SHARD_HOP_QUEUE, SHARD_REFUSAL_QUEUE, hop_address
from statifier.router.transaction import Unit

__all__ = [
    "HOP_ATTEMPTS",
    "HOP_REFUSED_HORIZON",
    "HOP_REFUSED_PLAN_ID",
    "MisplacedExecution",
    "ShardedRouter",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

HOP_REFUSED_PLAN_ID: Final = "execution_refused"
"""The plan a refused hop's ``error.communication`` reaches its sender under."""
HOP_ATTEMPTS: Final = 1_000
"""How many times a hop is tried before it is dead-lettered: at the outbox's backoff,
at most five minutes apart, over three days."""
HOP_REFUSED_HORIZON: Final = timedelta(hours=72)
"""How long a refused hop's report stays deduped on the send's key."""


class MisplacedExecution(RouterError):  # noqa: N818 - names the refusal
    """The configuration's ``execution_id`` minted an id whose bucket another store
    holds than the address's: a bare id would look for it in the wrong store."""

    def __init__(self, execution_id: str, scope: str, document: str, key: str) -> None:
        super().__init__(
            f"execution id {execution_id!r} falls in another store than its address "
            f"({scope!r}, {document!r}, {key!r}); over several stores, mint ids with "
            "statifier.ids.new_execution_id(scope, document, key) (the default)"
        )
        self.execution_id = execution_id


class ShardedRouter:
    """One router configuration run over several stores (see the module docstring).

    Args:
        config: what every store's router runs; its ``store`` is replaced by each of
            ``stores`` in turn (a :class:`~statifier.persistence.Storage` keeps its
            clock, input-log cap, loader, functions and codec, over each store's
            adapter).
        stores: the SQL adapters, one per range of ``shard_map``, each migrated.
        shard_map: which buckets each store holds; by default even ranges.

    Attributes:
        config: the configuration given (each store's router runs it over its store).
        routers: each store's :class:`~statifier.router.Router`, in store order.
        shard_map: the map.

    Raises:
        ConfigError: from :class:`RouterConfig`, for a store it refuses.
        ValueError: no store, or a map of another number of ranges.
    """

    def __init__(
        self,
        config: RouterConfig,
        stores: Sequence[SqlAdapter],
        shard_map: ShardMap | None = None,
    ) -> None:
        if not stores:
            raise ValueError("a sharded router needs at least one store")
        self.config: Final = config
        self.shard_map: Final = shard_map or ShardMap.even(len(stores))
        if len(self.shard_map.ranges) != len(stores):
            raise ValueError(
                f"the map has {len(self.shard_map.ranges)} ranges for {len(stores)} stores"
            )
        self.routers: Final = tuple(
            Router(
                dataclasses.replace(
                    config,
                    store=_over(config.store, store),
                    execution_id=self._placed(config, number),
                ),
                shard=Shard(self.shard_map, number),
            )
            for number, store in enumerate(stores)
        )

    def _placed(self, config: RouterConfig, number: int) -> Callable[[str, str, str], str]:
        mint = config.execution_id
        shard = Shard(self.shard_map, number)

        def placed(scope: str, document: str, key: str) -> str:
            minted = mint(scope, document, key)
            if not shard.holds(bucket_of(minted)):
                raise MisplacedExecution(minted, scope, document, key)
            return minted

        return placed

    # Where things are.

    def router_of_address(self, scope: str, document: str, key: str) -> Router:
        """The router of the store that holds the address ``(scope, document, key)``."""
        return self.routers[self.shard_map.store_of(address_bucket(scope, document, key))]

    def router_of_execution(self, execution_id: str) -> Router:
        """The router of the store that holds ``execution_id`` (and its durable
        children): ask it to pause, resume, locate or subscribe the execution."""
        return self.routers[self.shard_map.store_of_id(execution_id)]

    def store_of_key(self, planned: Planned) -> int:
        """The number of the store of ``planned``'s partition key
        (:attr:`Planned.key <statifier.router.Planned.key>`): of the address it names,
        else of its message id's bucket. A front that keeps lanes per store chooses
        among that store's."""
        event = planned.event
        for verdict in planned.verdicts:
            if verdict.binding.order is Order.BY_KEY and isinstance(verdict.answer, Keyed):
                return self._store_of(event, verdict)
        return self.shard_map.store_of_id(event.message_id)

    def _store_of(self, event: InboundEvent, verdict: Verdict) -> int:
        answer = verdict.answer
        if isinstance(answer, Keyed):
            bucket = address_bucket(event.scope, verdict.binding.document, answer.key)
        else:
            bucket = bucket_of(event.message_id)
        return self.shard_map.store_of(bucket)

    # Routing.

    async def plan(self, event: InboundEvent) -> Planned:
        """Read and evaluate ``event``'s bindings once (:meth:`Router.plan
        <statifier.router.Router.plan>`), for :meth:`route` or :meth:`route_many`."""
        return await self.routers[0].plan(event)

    async def route(self, event: InboundEvent | Planned, *, now: datetime | None = None) -> Routed:
        """Route ``event`` as :meth:`Router.route <statifier.router.Router.route>` does,
        one transaction per binding delivery, in binding order, each in its address's
        store.

        Raises:
            BindingsUnresolved: the bindings resolver failed for the event's scope.
            Exception: as :meth:`Router.route <statifier.router.Router.route>`: the
                delivery that raised left nothing behind, those of earlier bindings
                stay committed.
        """
        planned = event if isinstance(event, Planned) else await self.plan(event)
        outcomes: list[Outcome] = []
        notices: dict[str, None] = {}
        for verdict in planned.verdicts:
            if verdict.answer is None:
                outcomes.append(NoMatch(verdict.binding.id))
                continue
            router = self.routers[self._store_of(planned.event, verdict)]
            routed = await router.route(Planned(planned.event, (verdict,)), now=now)
            outcomes.extend(routed.outcomes)
            notices.update(dict.fromkeys(routed.notices))
        return Routed(planned.event, tuple(outcomes), tuple(notices))

    async def route_in(
        self, unit: Unit, event: InboundEvent, entry: Entry, *, now: datetime | None = None
    ) -> Routed:
        """Route ``event`` with the first store's part in ``unit``, a router transaction
        of the first store's router that the caller opened (and ends), as
        :meth:`Router.route_in <statifier.router.Router.route_in>` does; the other
        stores' parts first, each delivery in a transaction of its own there. A
        :class:`~statifier.router.Scheduler` over this router fires this way: its
        schedule's row is in the first store, and when ``unit`` rolls back after
        another store committed, the fire made again is a duplicate there (its
        message id is claimed).

        Raises:
            BindingsUnresolved: the bindings resolver failed for the event's scope.
            Exception: as :meth:`Router.route_in <statifier.router.Router.route_in>`;
                roll ``unit`` back.
        """
        planned = await self.routers[0].evaluate(event)
        parts = self._parts(planned)
        routed: dict[int, Routed] = {}
        for number, part in sorted(parts.items()):
            if number != 0:
                # In a transaction of that store's, told the caller's entry, and under
                # the caller's around_delivery alone (route would wrap it again).
                router = self.routers[number]

                async def there(
                    unit: Unit, router: Router = router, part: Planned = part
                ) -> Routed:
                    return await router.route_in(unit, part, entry, now=now)

                routed[number] = await router.in_transaction(there, entered=entry)
        if 0 in parts:
            routed[0] = await self.routers[0].route_in(unit, parts[0], entry, now=now)
        return self._merged(planned, routed)

    async def route_many(
        self, events: Sequence[InboundEvent | Planned], *, now: datetime | None = None
    ) -> list[Routed | Failed]:
        """Route a batch: each store's part in one transaction of that store
        (:meth:`Router.route_many <statifier.router.Router.route_many>`), the stores
        concurrently; one answer per event, in order.

        An event is :class:`~statifier.router.Failed` when any store's part of it
        failed (the other parts stand: route it again, and they are duplicates), and
        when a whole store's transaction failed (its database went away). An event
        whose bindings could not be read fails, and so do the later events of its
        scope (:class:`~statifier.router.BlockedByEarlierFailure`), as on one
        database; a key's events are all in one store, whose batch keeps their order.
        """
        planned: list[Planned | Failed] = []
        blocked: dict[str, str] = {}
        for given in events:
            event = given.event if isinstance(given, Planned) else given
            if event.scope in blocked:
                planned.append(Failed(event, BlockedByEarlierFailure(blocked[event.scope])))
            elif isinstance(given, Planned):
                planned.append(given)
            else:
                try:
                    planned.append(await self.plan(given))
                except Exception as error:  # noqa: BLE001 - the event's own answer
                    blocked[event.scope] = event.message_id
                    planned.append(Failed(event, error))
        batches: dict[int, list[tuple[int, Planned]]] = {}
        for index, plan in enumerate(planned):
            if isinstance(plan, Planned):
                for number, part in self._parts(plan).items():
                    batches.setdefault(number, []).append((index, part))
        stores = sorted(batches)
        results = await _each(
            [
                self.routers[number].route_many([part for _, part in batches[number]], now=now)
                for number in stores
            ]
        )
        answered: list[dict[int, Routed | Failed]] = [{} for _ in planned]
        for number, result in zip(stores, results, strict=True):
            for position, (index, part) in enumerate(batches[number]):
                answered[index][number] = (
                    Failed(part.event, result)
                    if isinstance(result, BaseException)
                    else result[position]
                )
        answers: list[Routed | Failed] = []
        for plan, parts in zip(planned, answered, strict=True):
            if isinstance(plan, Failed):
                answers.append(plan)
                continue
            routed = {n: part for n, part in parts.items() if isinstance(part, Routed)}
            # A part's own failure before a part only blocked behind an earlier one:
            # a consumer counts and logs the one, and lets the other go uncounted.
            failed = sorted(
                (part for part in parts.values() if isinstance(part, Failed)),
                key=lambda part: isinstance(part.error, BlockedByEarlierFailure),
            )
            answers.append(failed[0] if failed else self._merged(plan, routed))
        return answers

    def _merged(self, planned: Planned, parts: dict[int, Routed]) -> Routed:
        """One answer for ``planned`` from its stores' answers: the outcomes back in
        verdict order, the notices of every store."""
        # A binding id is one verdict's: the stores' outcomes are found by it, with no
        # second hash of each address.
        by_binding = {o.binding_id: o for routed in parts.values() for o in routed.outcomes}
        outcomes: list[Outcome] = [
            NoMatch(verdict.binding.id)
            if verdict.answer is None
            else by_binding[verdict.binding.id]
            for verdict in planned.verdicts
        ]
        notices = tuple(dict.fromkeys(n for routed in parts.values() for n in routed.notices))
        return Routed(planned.event, tuple(outcomes), notices)

    def _parts(self, planned: Planned) -> dict[int, Planned]:
        """``planned``'s verdicts that write, by store (a verdict whose match does not
        hold writes nothing, and is answered :class:`~statifier.router.NoMatch`
        without any store)."""
        parts: dict[int, list[Verdict]] = {}
        for verdict in planned.verdicts:
            if verdict.answer is not None:
                parts.setdefault(self._store_of(planned.event, verdict), []).append(verdict)
        return {number: Planned(planned.event, tuple(part)) for number, part in parts.items()}

    async def deliver_event(
        self,
        plan: Plan,
        *,
        scope: str,
        key: str,
        event: Event,
        message_id: str,
        now: datetime | None = None,
        entry: Entry | None = None,
    ) -> Outcome:
        """:meth:`Router.deliver_event <statifier.router.Router.deliver_event>` in the
        store of the address ``(scope, plan.document, key)``."""
        router = self.router_of_address(scope, plan.document, key)
        return await router.deliver_event(
            plan, scope=scope, key=key, event=event, message_id=message_id, now=now, entry=entry
        )

    async def deliver_post(
        self,
        token: str,
        event: Event,
        *,
        send_key: str | None = None,
        now: datetime | None = None,
    ) -> Outcome | None:
        """Deliver ``event`` to the execution the BasicHTTP location ``token`` reaches,
        as :meth:`Router.deliver_post <statifier.router.Router.deliver_post>` does, in
        the store that holds the token; ``None`` when no store does.

        A token carries its execution's bucket
        (:func:`~statifier.router.locations.token_bucket`): the store that holds the
        bucket alone is asked. A token minted before tokens carried it names no
        bucket: every store is asked at once, each reading the token's digest in its
        own table, and the one that holds it delivers.

        Raises:
            ConfigError: the configuration has no ``basichttp``.
            Exception: what the holding store's delivery raised; and, for a token
                without a bucket that no store answered, what a store that could not
                be read raised (the token may be there: the post is not answered as
                reaching nothing).
        """
        bucket = token_bucket(token)
        if bucket is not None:
            router = self.routers[self.shard_map.store_of(bucket)]
            return await router.deliver_post(token, event, send_key=send_key, now=now)
        answers = await _each(
            [
                router.deliver_post(token, event, send_key=send_key, now=now)
                for router in self.routers
            ]
        )
        errors = [answer for answer in answers if isinstance(answer, BaseException)]
        found = [a for a in answers if a is not None and not isinstance(a, BaseException)]
        if found:
            return found[0]
        if errors:
            raise errors[0]
        return None

    # Hops between stores.

    def hop_drains(
        self,
        *,
        batch: int = 10,
        lease: timedelta | float = timedelta(seconds=60),
        max_attempts: int = HOP_ATTEMPTS,
    ) -> list[OutboxDrain]:
        """One outbox drain per store for the hops its executions' sends wait in
        (queue :data:`~statifier.router.sending.SHARD_HOP_QUEUE`) and the refusals
        its executions owe senders in other stores (queue
        :data:`~statifier.router.sending.SHARD_REFUSAL_QUEUE`), each over its
        router's storage (its clock and codec), with ``batch``, ``lease`` and
        ``max_attempts`` as :class:`~statifier.router.outbox.OutboxDrain` takes them.
        Run them as the other drains are run (``drain_once``, or ``run``). A hop whose
        delivery raises (its target's database away) is tried again with the outbox's
        backoff, at most five minutes apart: :data:`HOP_ATTEMPTS` attempts outlast a
        store away for three days before the hop is dead-lettered (``retry_dead``
        takes it back). Each leases its store's range of buckets (decision 0122)."""
        return [
            OutboxDrain(
                router.storage,
                {SHARD_HOP_QUEUE: self._hop, SHARD_REFUSAL_QUEUE: self._refused},
                batch=batch,
                lease=lease,
                max_attempts=max_attempts,
                buckets=buckets,
            )
            for router, buckets in zip(self.routers, self.shard_map.ranges, strict=True)
        ]

    async def _hop(self, message: OutboxMessage) -> None:
        """Deliver one hop in its target's store (a refusal writes its report there)."""
        try:
            document, key, create = hop_address(message.target)
        except ValueError as error:
            raise DeadLetter(str(error)) from None
        scope = message.scope
        if scope is None:
            raise DeadLetter(f"hop {message.key!r} has no scope")
        await self.router_of_address(scope, document, key).deliver_send(
            scope=scope,
            document=document,
            key=key,
            create=create,
            event=message.event,
            message_id=message.key,
            sender=message.execution_id,
        )

    async def _refused(self, message: OutboxMessage) -> None:
        """Deliver a refused hop's ``error.communication`` to its sender, deduped on
        the row's key; a sender with no address row is logged, the row settled."""
        sender = message.execution_id
        router = None if sender is None else self.router_of_execution(sender)
        found = None if router is None or sender is None else await address_of(router, sender)
        if router is None or found is None:
            _log.warning(
                "a send of %r was refused (%s) and its sender has no address to be told at",
                sender,
                message.event.data,
            )
            return
        scope, document, key = found
        plan = Plan(
            HOP_REFUSED_PLAN_ID, document=document, create=Create.NEVER, horizon=HOP_REFUSED_HORIZON
        )
        await router.deliver_event(
            plan,
            scope=scope,
            key=key,
            event=message.event,
            message_id=message.key,
            entry=Entry.OUTBOX,
        )


def _over(store: SqlAdapter | Storage, adapter: SqlAdapter) -> SqlAdapter | Storage:
    """``store``'s settings over ``adapter``: a storage keeps its own (and shares its
    caches of compiled charts and decoded positions, keyed by content: safe across
    stores), an adapter is replaced."""
    return store.over(adapter) if isinstance(store, Storage) else adapter


async def _each(calls: Sequence[Awaitable[_T]]) -> list[_T | BaseException]:
    """Each call's answer or what it raised, in order; the calls run concurrently."""
    return await asyncio.gather(*calls, return_exceptions=True)
