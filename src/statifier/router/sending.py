"""The router's send handler: what a durable execution's sends become at the executor
seam, inside the transaction of the delivery whose step emitted them.

- A send to the execution itself (no target, or ``#_scxml_<its id>``), delayed or not,
  and a delayed ``#_internal`` send, become timers (with no delay: due now), so they
  are delivered back after the step that sent them commits, in send order, and a
  crash cannot lose them.
- A send of the router's type to a route name goes to the route's adapter (delayed:
  onto the timer queue, fired later through the same adapter).
- A send of the router's type to ``execution`` is delivered to another execution,
  resolved in the sender's scope, in the same transaction; in a router of a
  :class:`~statifier.router.ShardedRouter`, one whose address falls in another
  store's buckets is handed to the outbox instead (queue :data:`SHARD_HOP_QUEUE`,
  under the send's key), and delivered there after the commit. It is enclosed by the
  ``around_delivery`` call of the entry that drove the sending step; with
  ``wrap_target=True`` one that no entry encloses (a step of a call of the host's own)
  is wrapped under ``Entry.TARGET``, handed the sender's scope, with ``on_begin``
  called first: the target's delivery, or its refusal row. A wrapper that raises
  refuses the send (``wrapper_refused``) and nothing of the target's delivery stays.
- A BasicHTTP send is handed to the outbox (queue ``basichttp``) and performed after
  the commit by the drain; a delayed one is refused.
- ``<cancel>`` deletes the execution's timers of that send id.
- An invocation of the configuration's ``source_type`` subscribes the execution to the
  binding it names, and the cancel of any invocation deletes its subscription, if any
  (:mod:`statifier.router.subscriptions`); the cancel still reaches the host's executor.
  A refused source invoke reaches the chart as ``error.execution`` carrying the
  invoke's id, and writes no ledger row.
- Everything else goes to the host's executor (``RouterConfig.executor``).

A refusal (an unregistered route, a reentrant send, a delay with no timer queue or
longer than :data:`MAX_SEND_DELAY`, a timer whose event cannot be stored, a host scheme
in a target, a missing or finished target execution) writes one ``send_refused`` ledger
row in its own savepoint and reaches the sender as ``error.communication`` carrying the
send's id; the step stands.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Final

from statifier.buckets import address_bucket
from statifier.callbacks import awaited
from statifier.core import Event
from statifier.core import effects as fx
from statifier.core.events import engine_event
from statifier.core.positions import dump_event
from statifier.error_text import error_text
from statifier.persistence import EffectContext, Refused, Unstorable
from statifier.router.config import BASICHTTP_TYPES, Entry
from statifier.router.delivery import deliver_to_execution
from statifier.router.outbox import OutboxRoute
from statifier.router.records import LedgerRow
from statifier.router.routes import IdempotencyKey
from statifier.router.subscriptions import (
    SubscriptionRefused,
    source_binding,
    subscribe_in,
    unsubscribe_in,
)
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.transaction import Delivering, Unit, around

__all__ = [
    "BASICHTTP_QUEUE",
    "EXECUTION_TARGET",
    "MAX_SEND_DELAY",
    "SHARD_HOP_QUEUE",
    "SHARD_REFUSAL_QUEUE",
    "SendHandler",
    "hop_address",
    "send_key",
]

EXECUTION_TARGET: Final = "execution"
"""The target of a send of the router's type that another execution receives."""

BASICHTTP_QUEUE: Final = "basichttp"
"""The outbox queue BasicHTTP sends of durable executions wait in."""

SHARD_HOP_QUEUE: Final = "shard_hop"
"""The outbox queue a send to an execution whose address another store holds waits in
(:class:`~statifier.router.ShardedRouter` drains it)."""

SHARD_REFUSAL_QUEUE: Final = "shard_refusal"
"""The outbox queue a refused hop's ``error.communication`` waits in, in the target's
store, for the sender's store."""

MAX_SEND_DELAY: Final = timedelta(days=36_525)
"""The longest delay a durable execution's send may have: 100 years (of 365.25 days).
A longer one (``delay="99999999999999999999d"``, or a ``delayexpr`` reading an event's
data) is refused with reason ``delay``, as is one whose due time would fall past the
last date a datetime holds."""

SCXML_PROCESSOR: Final = "http://www.w3.org/TR/scxml/#SCXMLEventProcessor"
_log = logging.getLogger(__name__)

_SCXML_TYPES: Final = frozenset({"scxml", SCXML_PROCESSOR})
_INTERNAL: Final = frozenset({"#_internal", "_internal"})


def send_key(effect: fx.Send | fx.SendDelayed, context: EffectContext) -> IdempotencyKey:
    """The idempotency key of a send at the executor seam."""
    return IdempotencyKey(
        context.execution_id,
        send_id=effect.send_id,
        macrostep=effect.macrostep,
        microstep=effect.microstep,
        round=effect.round,
        content_index=effect.content_index,
        ordinal=context.ordinal,
    )


class SendHandler:
    """The executor of one delivery's steps in a router transaction: performs what the
    router owns (see the module docstring) and hands everything else to the
    configuration's ``executor``.

    Args:
        unit: the router transaction the delivery runs in.
        delivering: the delivery: its scope, its time, the executions mid-step.
    """

    def __init__(self, unit: Unit, delivering: Delivering) -> None:
        self.unit = unit
        self.config = unit.config
        self.delivering = delivering

    async def __call__(self, effect: fx.Effect, context: EffectContext) -> Refused | None:
        config = self.config
        if isinstance(effect, fx.Send | fx.SendDelayed):
            kind = effect.type
            if kind is None or kind in _SCXML_TYPES:
                timer = _own_timer(effect, context.execution_id)
                if timer is not None:
                    return await self._timer(effect, context, timer)
            elif kind == config.send_type:
                return await self._routed(effect, context)
            elif kind in BASICHTTP_TYPES:
                return await self._basichttp(effect, context)
        elif isinstance(effect, fx.Cancel) and self.unit.timers is not None:
            await self.unit.timers.cancel(self.unit.tx, context.execution_id, effect.send_id)
        elif isinstance(effect, fx.Invoke) and config.source_type is not None:
            if effect.type == config.source_type:
                return await self._source_invoke(effect, context)
        elif isinstance(effect, fx.CancelInvoke) and config.source_type is not None:
            # Whatever the invocation was: deleting no row costs nothing, and the host's
            # executor still hears the cancel of its own invocations.
            await unsubscribe_in(self.unit, context.execution_id, effect.invoke_id)
        answer: Refused | None = await awaited(config.executor(effect, context))
        return answer

    # Source invokes.

    async def _source_invoke(self, effect: fx.Invoke, context: EffectContext) -> Refused | None:
        """Subscribe the execution to the binding the invoke names, once per invocation
        (a redriven step inserts nothing); a refusal reaches the chart as
        ``error.execution`` with the invoke's id."""
        execution_id = context.execution_id
        try:
            binding_id = source_binding(effect, execution_id)
            await subscribe_in(
                self.unit, execution_id, binding_id, effect.invoke_id, self.delivering.now
            )
        except SubscriptionRefused as refused:
            return Refused(f"source invoke: {refused.reason}")
        return None

    # Sends to the execution itself.

    async def _timer(
        self, effect: fx.Send | fx.SendDelayed, context: EffectContext, kind: TimerKind
    ) -> Refused | None:
        # As a live session delivers it (the chart's name: empty for <content> alone).
        if kind is TimerKind.INTERNAL:
            event = engine_event(effect.event, "internal", effect.data, _sendid(effect))
        else:
            event = _built(effect, context.execution_id, SCXML_PROCESSOR)
        return await self._schedule(effect, context, kind, event)

    async def _schedule(
        self,
        effect: fx.Send | fx.SendDelayed,
        context: EffectContext,
        kind: TimerKind,
        event: Event,
        route: str | None = None,
    ) -> Refused | None:
        """Put the send on the timer queue, due its delay after the delivery's time (at
        once for a send with none), or refuse it when there is no queue, its delay is
        longer than :data:`MAX_SEND_DELAY` (or due past the last datetime), or the queue
        cannot store its event (:class:`~statifier.persistence.errors.Unstorable`)."""
        queue = self.unit.timers
        if queue is None:
            if route is None:
                detail = "no timer queue is configured"
            else:
                detail = f"a delayed send to {route!r} needs a timer queue"
            return await self._refuse(effect, context, "no_timer_queue", detail)
        delay = effect.delay_ms if isinstance(effect, fx.SendDelayed) else 0
        due_at = _due(self.delivering.now, delay)
        if due_at is None:
            detail = f"a delay of {delay} ms is longer than {MAX_SEND_DELAY.days} days, the longest"
            return await self._refuse(effect, context, "delay", detail)
        entry = TimerEntry(
            execution_id=context.execution_id,
            send_id=effect.send_id,
            key=send_key(effect, context),
            due_at=due_at,
            step_position=context.ordinal,
            kind=kind,
            event=event,
            route=route,
            scope=self.delivering.scope,
        )
        try:
            await queue.schedule(self.unit.tx, entry)
        except Unstorable as error:
            return await self._refuse(effect, context, "unstorable", str(error))
        self.unit.scheduled += 1
        return None

    # Sends of the router's type.

    async def _routed(
        self, effect: fx.Send | fx.SendDelayed, context: EffectContext
    ) -> Refused | None:
        target = effect.target
        if target == EXECUTION_TARGET:
            return await self._to_execution(effect, context)
        if target is None:
            return await self._refuse(
                effect,
                context,
                "unregistered",
                "a send of the router's type names no route",
            )
        if ":" in target or target.startswith("#"):
            return await self._refuse(
                effect,
                context,
                "host_scheme",
                f"target {target!r} names a transport, not a route",
            )
        scope = self.delivering.scope
        found = self.config.route(scope, target)
        if found is None:
            return await self._refuse(effect, context, "unregistered", f"no route named {target!r}")
        if scope is None and self.config.overridden_somewhere(target):
            return await self._refuse(
                effect,
                context,
                "no_delivery_scope",
                f"route {target!r} needs the delivery's scope",
            )
        event = _built(effect, context.execution_id, self.config.send_type)
        if isinstance(effect, fx.SendDelayed):
            return await self._schedule(effect, context, TimerKind.ROUTE, event, target)
        key = send_key(effect, context)
        adapter, route_config = found
        answer = await awaited(adapter.deliver(route_config, event, key, self.unit.tx, scope))
        if isinstance(answer, Refused):
            return await self._refuse(
                effect, context, "route_failed", f"route {target!r}: {answer.reason}"
            )
        return None

    async def _to_execution(
        self, effect: fx.Send | fx.SendDelayed, context: EffectContext
    ) -> Refused | None:
        if isinstance(effect, fx.SendDelayed):
            return await self._refuse(
                effect,
                context,
                "delay",
                "a send to an execution cannot be delayed",
                ledger_id=EXECUTION_TARGET,
            )
        params = effect.data if isinstance(effect.data, Mapping) else {}
        document, key = params.get("document"), params.get("key")
        if not isinstance(document, str) or not document or not isinstance(key, str) or not key:
            return await self._refuse(
                effect,
                context,
                "invalid_target",
                "an execution target needs document and key params",
                ledger_id=EXECUTION_TARGET,
            )
        create = params.get("create", "never")
        if create not in ("never", "if_absent"):
            return await self._refuse(
                effect,
                context,
                "invalid_target",
                f"create must be never or if_absent, not {create!r}",
                ledger_id=EXECUTION_TARGET,
            )
        data = {k: v for k, v in params.items() if k not in ("document", "key", "create")}
        event = engine_event(
            effect.event,
            "external",
            data,
            _sendid(effect),
            f"#_scxml_{context.execution_id}",
            self.config.send_type,
        )
        scope = self.delivering.scope
        if scope is None:
            return await self._refuse(
                effect,
                context,
                "no_delivery_scope",
                "the sender has no scope",
                ledger_id=EXECUTION_TARGET,
            )

        shard = self.unit.shard
        if shard is not None and not shard.holds(address_bucket(scope, document, key)):
            target = json.dumps([document, key, create])
            return await self._hand_off(
                effect, context, SHARD_HOP_QUEUE, event, target, ledger_id=EXECUTION_TARGET
            )

        try:
            # Checked before the target's delivery writes anything: its input log
            # stores the event, and a refusal then would leave that delivery half done.
            dump_event(event)
        except ValueError as error:
            detail = f"the send's event cannot be stored: {error}"
            return await self._refuse(
                effect, context, "unstorable", detail, ledger_id=EXECUTION_TARGET
            )

        async def work() -> Refused | None:
            why = await deliver_to_execution(
                self.unit,
                self.delivering,
                document=document,
                key=key,
                create=str(create),
                event=event,
                message_id=str(send_key(effect, context)),
            )
            if why is None:
                return None
            return await self._refuse(effect, context, *why, ledger_id=EXECUTION_TARGET)

        if not self.config.wrap_target or self.unit.entered is not None:
            return await work()
        return await self._wrapped(scope, work, effect, context)

    async def _wrapped(
        self,
        scope: str,
        work: Callable[[], Awaitable[Refused | None]],
        effect: fx.Send | fx.SendDelayed,
        context: EffectContext,
    ) -> Refused | None:
        """A target's delivery no entry encloses, under ``Entry.TARGET`` at a savepoint
        of its own: ``on_begin`` first; while it runs, a target delivery nested in it
        is enclosed. What the work raises is raised; a wrapper that raises (before or
        after the work) undoes the work and refuses the send."""
        unit = self.unit
        raised: list[BaseException] = []

        async def enclosed() -> Refused | None:
            unit.entered = Entry.TARGET
            try:
                await unit.begin(scope, Entry.TARGET)
                return await work()
            except BaseException as error:
                raised.append(error)
                raise
            finally:
                unit.entered = None

        try:
            async with unit.savepoint():
                return await around(self.config, scope, Entry.TARGET, enclosed)
        except Exception as error:
            if raised and raised[-1] is error:
                raise
            detail = f"around_delivery refused the target: {error_text(error)}"
            _log.warning(
                "execution %s: a send to an execution target was refused: %s",
                context.execution_id,
                detail,
                extra={"execution_id": context.execution_id},
            )
            return await self._refuse(
                effect, context, "wrapper_refused", detail, ledger_id=EXECUTION_TARGET
            )

    # BasicHTTP.

    async def _basichttp(
        self, effect: fx.Send | fx.SendDelayed, context: EffectContext
    ) -> Refused | None:
        if isinstance(effect, fx.SendDelayed):
            return await self._refuse(
                effect,
                context,
                "delay",
                "a delayed BasicHTTP send is not delivered",
                ledger_id=BASICHTTP_QUEUE,
            )
        target = effect.target
        if target is None or not target.startswith(("http://", "https://")):
            return await self._refuse(
                effect,
                context,
                "invalid_target",
                f"no URL to POST to: {target!r}",
                ledger_id=BASICHTTP_QUEUE,
            )
        event = _built(effect, context.execution_id, "basichttp")
        return await self._hand_off(
            effect, context, BASICHTTP_QUEUE, event, target, ledger_id=BASICHTTP_QUEUE
        )

    async def _hand_off(
        self,
        effect: fx.Send | fx.SendDelayed,
        context: EffectContext,
        queue: str,
        event: Event,
        target: str,
        *,
        ledger_id: str,
    ) -> Refused | None:
        """Hand ``event`` off to the outbox ``queue`` in the step's transaction, or
        refuse the send (reason ``unstorable``) when its event cannot be stored."""
        try:
            await OutboxRoute(self.unit.tx.adapter, codec=self.unit.storage.codec).hand_off(
                self.unit.tx,
                queue,
                send_key(effect, context),
                event,
                target=target,
                execution_id=context.execution_id,
                scope=self.delivering.scope,
                now=self.delivering.now,
            )
        except ValueError as error:  # the step's clock is aware: only the event is refused
            detail = f"the send's event cannot be stored: {error}"
            return await self._refuse(effect, context, "unstorable", detail, ledger_id=ledger_id)
        return None

    # Refusals.

    async def _refuse(
        self,
        effect: fx.Send | fx.SendDelayed,
        context: EffectContext,
        code: str,
        detail: str,
        *,
        ledger_id: str = "route",
    ) -> Refused:
        """Write the refusal's ledger row (``code`` its reason) in a savepoint of its own,
        and answer what the chart reads in ``_event.data.message`` (``detail``)."""
        row = LedgerRow(
            ledger_id,
            message_id=str(send_key(effect, context)),
            scope=self.delivering.scope,
            source=None,
            outcome="send_refused",
            reason=f"{code}: {detail}",
            document=None,
            key=effect.target,
            execution_id=context.execution_id,
            inserted_at=self.delivering.now,
        )
        async with self.unit.savepoint():
            await self.unit.sql.record(row)
        return Refused(detail)


def hop_address(target: str | None) -> tuple[str, str, str]:
    """The ``(document, key, create)`` a :data:`SHARD_HOP_QUEUE` row's target names.

    Raises:
        ValueError: ``target`` is not what the send handler writes.
    """
    try:
        document, key, create = json.loads(target or "")
    except (TypeError, ValueError) as error:
        raise ValueError(f"not a hop's target: {target!r}") from error
    if not all(isinstance(part, str) for part in (document, key, create)):
        raise ValueError(f"not a hop's target: {target!r}")
    return document, key, create


def _own_timer(effect: fx.Send | fx.SendDelayed, execution_id: str) -> TimerKind | None:
    """The timer an SCXML send to the execution itself becomes, or ``None`` for a send
    elsewhere (the host's executor decides)."""
    target = effect.target
    if target is None or target == f"#_scxml_{execution_id}":
        return TimerKind.EXTERNAL
    if target in _INTERNAL and isinstance(effect, fx.SendDelayed):
        return TimerKind.INTERNAL
    return None


def _due(now: datetime, delay_ms: int) -> datetime | None:
    """When a send ``delay_ms`` after ``now`` is due, or ``None`` when the delay is
    longer than :data:`MAX_SEND_DELAY` or the time falls past the last datetime."""
    if delay_ms > _MAX_DELAY_MS:
        return None
    try:
        return now + timedelta(milliseconds=delay_ms)
    except OverflowError:
        return None


_MAX_DELAY_MS: Final = MAX_SEND_DELAY // timedelta(milliseconds=1)


def _sendid(effect: fx.Send | fx.SendDelayed) -> str | None:
    """The ``sendid`` a delivered event carries: the author's id, never a generated one."""
    return effect.send_id if effect.author_id else None


def _built(effect: fx.Send | fx.SendDelayed, execution_id: str, origintype: str | None) -> Event:
    """The event a send delivers: the send's name, its resolved params (or content) as
    data, its author-written id, and the sender as origin."""
    return engine_event(
        effect.event,
        "external",
        effect.data,
        _sendid(effect),
        f"#_scxml_{execution_id}",
        origintype,
    )
