"""A route that calls back into the execution whose step it serves is refused at once
with a typed error, on both databases, instead of waiting for a lock its own step
holds; a call for another execution goes ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from tests.router.conftest import RouterDb

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.ids import new_execution_id
from statifier.persistence import Executions, ReentrantCall, Refused, Stepped
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    Binding,
    CreatedAndDelivered,
    InboundEvent,
    Router,
    StaticResolver,
)
from statifier.router.routes import IdempotencyKey

SENDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a" datamodel="predicator">
  <state id="a">
    <transition event="go" target="b"><send type="app:route" target="back" event="x"/></transition>
  </state>
  <state id="b"><transition event="again" target="c"/></state>
  <final id="c"/>
</scxml>"""

BINDING = Binding(
    id="orders",
    source="shop",
    match="true",
    key="event.order",
    document="sender",
    event="go",
)

# Well inside the lock wait: a refusal comes at once, a hang would run past it.
PROMPTLY = 5.0


class CallingBack:
    """A route adapter that, inside the step it serves, runs ``call``."""

    def __init__(self) -> None:
        self.call: Callable[[], Awaitable[object]] | None = None
        self.raised: list[BaseException] = []

    async def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> Refused | None:
        assert self.call is not None
        try:
            await self.call()
        except ReentrantCall as refused:
            self.raised.append(refused)
            return Refused(str(refused))
        return None


def _router(router_db: RouterDb, adapter: CallingBack, **options: object) -> Router:
    return router_db.router(
        [BINDING],
        resolver=StaticResolver({"sender": compile_chart(SENDER)}),
        send_type="app:route",
        routes={"back": (adapter, {})},
        **options,
    )


def _event(order: str, message_id: str) -> InboundEvent:
    return InboundEvent(scope="s", source="shop", message_id=message_id, data={"order": order})


def test_the_lock_wait_is_bounded_by_default(router_db: RouterDb) -> None:
    router = router_db.router([BINDING], resolver=StaticResolver({}))
    assert router.config.lock_wait == DEFAULT_LOCK_WAIT == 30.0
    assert Executions(router.storage).serialization.wait == 30.0  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_routing_back_to_the_sender_is_refused_at_once(router_db: RouterDb) -> None:
    adapter = CallingBack()
    router = _router(router_db, adapter)
    adapter.call = lambda: router.route(_event("o-1", "m-back"))
    async with asyncio.timeout(PROMPTLY):
        routed = await router.route(_event("o-1", "m-1"))
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    (refused,) = adapter.raised
    assert "must not call back into the execution it serves" in str(refused)
    # The chart heard the refusal as error.communication; its own step stood.
    record = await router.storage.fetch_execution(outcome.execution_id)
    assert record.error_count == 1


@pytest.mark.asyncio
async def test_stepping_the_sender_from_its_route_is_refused_at_once(router_db: RouterDb) -> None:
    adapter = CallingBack()
    ids: list[str] = []

    def minted(scope: str, document: str, key: str) -> str:
        ids.append(str(new_execution_id(scope, document, key)))
        return ids[-1]

    router = _router(router_db, adapter, execution_id=minted)

    async def step_sender() -> object:
        return await Executions(router.storage).step(ids[0], None, Event("again"))

    adapter.call = step_sender
    async with asyncio.timeout(PROMPTLY):
        routed = await router.route(_event("o-1", "m-1"))
    assert isinstance(routed.outcomes[0], CreatedAndDelivered)
    assert len(adapter.raised) == 1


@pytest.mark.asyncio
async def test_a_route_may_reach_another_execution(router_db: RouterDb) -> None:
    adapter = CallingBack()
    router = _router(router_db, adapter)
    other = compile_chart(SENDER)
    executions = Executions(router.storage)
    await executions.create("other", other)

    async def step_other() -> object:
        stepped = await executions.step("other", other, Event("nothing"))
        assert isinstance(stepped, Stepped)
        return stepped

    adapter.call = step_other
    async with asyncio.timeout(PROMPTLY):
        routed = await router.route(_event("o-1", "m-1"))
    assert isinstance(routed.outcomes[0], CreatedAndDelivered)
    assert adapter.raised == []
