"""The router's send type on a live :class:`~statifier.session.Session`.

The same routes serve both host shapes. At the executor seam a durable execution's
route sends reach :class:`~statifier.router.sending.SendHandler`; a live session
registers :class:`SessionRoutes` under the router's send type instead, and its sends
reach the same adapters under keys composed from the same fields, with the session id
as the scope half (the ordinal is a delayed send's timer ordinal, and none for an
immediate send: a live session has no call whose effects it could count).

There is no delivery transaction: the adapter is handed ``tx=None`` and hands off on
its own (an outbox route opens its own short transaction), and may be
called more than once for one send, always under the same key.

The scope a session's sends resolve routes in is ``RouterConfig.processor_scope``: a
string, or a function asked once per send. A send to ``execution`` reaches executions
through deliveries only, and is refused here.

>>> from statifier.router import RouterConfig, StaticResolver
>>> from statifier.persistence.sql import SqlAdapter
>>> class Print:
...     def deliver(self, config, event, key, tx, scope):
...         print(event.name, config["queue"], tx, scope)
>>> config = RouterConfig(SqlAdapter("sqlite://"), bindings=[], resolver=StaticResolver({}),
...                       send_type="myapp:sink", routes={"joined": (Print(), {"queue": "q"})})
>>> routes = SessionRoutes(config)
>>> from statifier.core import Event
>>> routes.plan("nowhere", Event("pair.joined"))
"no route named 'nowhere'"
>>> routes.plan("joined", Event("pair.joined")).target
'joined'
"""

from __future__ import annotations

from statifier.callbacks import awaited
from statifier.core import Event
from statifier.persistence import Refused
from statifier.router.config import RouterConfig
from statifier.router.routes import IdempotencyKey
from statifier.router.sending import EXECUTION_TARGET
from statifier.session.handlers import Delivery

__all__ = ["SessionRoutes"]

_SCOPE_HEADER = "scope"


class SessionRoutes:
    """A :class:`~statifier.session.SendType` over the configuration's routes: register
    it as ``send_types={config.send_type: SessionRoutes(config)}``.

    ``plan`` resolves the route in the processor scope (refusing an unregistered name,
    a host scheme, an execution target, or a route some scope overrides when the
    processor scope is ``None``); ``perform`` hands the event to the adapter.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        config = self.config
        if target is None:  # pragma: no cover - the session keeps a targetless send
            return "a send of the router's type names no route"
        if target == EXECUTION_TARGET:
            return "an execution target is reached from durable executions only"
        if ":" in target or target.startswith("#"):
            return f"target {target!r} names a transport, not a route"
        scope = self._scope()
        if config.route(scope, target) is None:
            return f"no route named {target!r}"
        if scope is None and config.overridden_somewhere(target):
            return f"route {target!r} needs a processor scope"
        headers = {} if scope is None else {_SCOPE_HEADER: scope}
        return Delivery(target, event, headers=headers)

    async def perform(self, delivery: Delivery) -> str | None:
        found = self.config.route(delivery.headers.get(_SCOPE_HEADER), delivery.target)
        if found is None:  # pragma: no cover - planned against the same registry
            return f"no route named {delivery.target!r}"
        if delivery.send is None:
            # No counters to key it by: a key made up here could name another send.
            return "a route delivery needs the send it carries out (the session sets it)"
        adapter, route_config = found
        scope = delivery.headers.get(_SCOPE_HEADER)
        answer = await awaited(
            adapter.deliver(route_config, delivery.event, _key(delivery), None, scope)
        )
        return answer.reason if isinstance(answer, Refused) else None

    def _scope(self) -> str | None:
        scope = self.config.processor_scope
        if scope is None or isinstance(scope, str):
            return scope
        answered = scope()
        if answered is not None and not isinstance(answered, str):
            raise TypeError(f"processor_scope answered {answered!r}, not a string or None")
        return answered


def _key(delivery: Delivery) -> IdempotencyKey:
    """The key of a live session's send: the session id (from the event's origin) and
    the send's counters, as at the executor seam."""
    origin = delivery.event.origin or ""
    session_id = origin.removeprefix("#_scxml_")
    send = delivery.send
    assert send is not None  # perform checked it
    return IdempotencyKey(
        session_id,
        send_id=send.send_id,
        macrostep=send.macrostep,
        microstep=send.microstep,
        round=send.round,
        content_index=send.content_index,
        ordinal=getattr(send, "ordinal", None),
    )
