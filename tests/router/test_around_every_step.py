"""``around_delivery`` and ``on_begin`` around every step the router drives, on both
databases: a timer fire under ``Entry.TIMER`` and its timer's scope, a refused fire
retried later while the rest of its batch fires, a send to an execution target wrapped
under ``Entry.TARGET`` only with ``wrap_target`` and only where no entry encloses its
sender, a wrapper refusing a target refusing that send alone, and an ``on_begin`` that
raises refusing its delivery alone."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from tests.router.conftest import RouterDb

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    Binding,
    ConfigError,
    Entry,
    InboundEvent,
    Router,
    StaticResolver,
    ledger,
)
from statifier.router.binding import Create, Plan
from statifier.router.timer_worker import TimerWorker

_T = TypeVar("_T")

SENDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle">
    <transition event="go" target="waiting">
      <send event="tick" delay="1s"/>
    </transition>
    <transition event="poke_now" target="asked">
      <send type="test:sink" target="execution" id="s1" event="poke">
        <param name="document" expr="'receiver'"/>
        <param name="key" expr="'r'"/>
        <param name="create" expr="'if_absent'"/>
      </send>
    </transition>
  </state>
  <state id="waiting">
    <transition event="tick" target="ticked">
      <send type="test:sink" target="execution" id="s1" event="poke">
        <param name="document" expr="'receiver'"/>
        <param name="key" expr="'r'"/>
        <param name="create" expr="'if_absent'"/>
      </send>
    </transition>
  </state>
  <state id="ticked"/>
  <state id="asked">
    <transition event="error.communication" cond="_event.sendid == 's1'" target="refused"/>
  </state>
  <state id="refused"/>
</scxml>"""
"""On ``go`` a timer one second on; its ``tick`` sends ``poke`` to the receiver at key
``r`` (created if absent). ``poke_now`` sends the poke at once."""

RECEIVER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
  <state id="waiting"><transition event="poke" target="poked"/></state>
  <state id="poked"/>
</scxml>"""


class Recorded:
    """An ``around_delivery`` and an ``on_begin`` that record what they are told; the
    wrapper raises for the ``(scope, entry)`` pairs in :attr:`refuse`."""

    def __init__(self) -> None:
        self.around: list[tuple[str, str]] = []
        self.begun: list[tuple[str, str]] = []
        self.refuse: set[tuple[str, Entry]] = set()
        self.refuse_begin: set[str] = set()

    async def wrapper(self, scope: str, entry: Entry, work: Callable[[], Awaitable[_T]]) -> _T:
        self.around.append((scope, entry.value))
        if (scope, entry) in self.refuse:
            raise PermissionError(f"{scope} may not {entry.value}")
        return await work()

    async def on_begin(self, tx: SqlTransaction, scope: str, entry: Entry) -> None:
        assert tx.driver is not None
        self.begun.append((scope, entry.value))
        if scope in self.refuse_begin:
            raise PermissionError(f"no tenant {scope}")

    def clear(self) -> None:
        self.around.clear()
        self.begun.clear()


def _router(db: RouterDb, recorded: Recorded, **options: Any) -> Router:
    bindings = [
        Binding(
            id=name,
            source=name,
            match="true",
            key="event.key",
            document="sender",
            event=name,
            create=Create.IF_ABSENT,
        )
        for name in ("go", "poke_now")
    ]
    charts: dict[str | tuple[str, str], Machine] = {
        "sender": compile_chart(SENDER),
        "receiver": compile_chart(RECEIVER),
    }
    return db.router(
        bindings,
        resolver=StaticResolver(charts),
        send_type="test:sink",
        around_delivery=recorded.wrapper,
        on_begin=recorded.on_begin,
        **options,
    )


def _command(scope: str, message_id: str, name: str = "go") -> InboundEvent:
    return InboundEvent(scope=scope, source=name, message_id=message_id, data={"key": "k"})


async def _states(router: Router) -> dict[str, tuple[str, ...]]:
    """Every execution's active states, by ``scope/document/key`` of its address."""
    found: dict[str, tuple[str, ...]] = {}
    for row in await ledger(router):
        if row.execution_id is None or row.document is None:
            continue
        async with router.transaction() as unit:
            record = await unit.storage.fetch_execution(row.execution_id)
            machine = await unit.storage.machine(record.content_hash)
            state = unit.storage.load(record, machine)
        ids = (machine.states[i].id for i in state.configuration)
        found[f"{row.scope}/{row.document}/{row.key}"] = tuple(i for i in ids if i)
    return found


@pytest.mark.asyncio
async def test_a_timer_fire_runs_under_the_timer_entry_and_the_scope_that_scheduled_it(
    router_db: RouterDb,
) -> None:
    recorded = Recorded()
    router = _router(router_db, recorded, wrap_target=True)
    await router.route(_command("acme", "m1"))
    assert recorded.around == recorded.begun == [("acme", "route")]
    recorded.clear()
    router_db.clock.advance(timedelta(seconds=2))
    assert await TimerWorker(router).fire_due() == 1
    # The tick's send to the receiver runs inside the fire: enclosed by it, not wrapped
    # again (wrap_target or not).
    assert recorded.around == recorded.begun == [("acme", "timer")]
    states = await _states(router)
    assert states["acme/sender/k"] == ("ticked",)
    assert states["acme/receiver/r"] == ("poked",)


@pytest.mark.asyncio
async def test_a_refused_fire_is_retried_later_while_the_rest_of_its_batch_fires(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    recorded = Recorded()
    router = _router(router_db, recorded)
    await router.route(_command("acme", "m1"))
    await router.route(_command("globex", "m2"))
    recorded.refuse = {("globex", Entry.TIMER)}
    now = router_db.clock.advance(timedelta(seconds=2))
    worker = TimerWorker(router, retry=5.0)
    with caplog.at_level(logging.WARNING, "statifier.router.timer_worker"):
        assert await worker.fire_due() == 1
    [said] = [r for r in caplog.records if r.name == "statifier.router.timer_worker"]
    assert said.levelno == logging.WARNING
    assert "failed to fire; it is tried again at" in said.getMessage()
    assert "globex may not timer" in said.getMessage()
    states = await _states(router)
    assert states["acme/sender/k"] == ("ticked",)
    assert states["globex/sender/k"] == ("waiting",)
    assert await worker.next_due() == now + timedelta(seconds=5)
    # The retry: not before its time, then fired once the wrapper lets it through.
    assert await worker.fire_due(now + timedelta(seconds=4)) == 0
    recorded.refuse.clear()
    assert await worker.fire_due(now + timedelta(seconds=5)) == 1
    states = await _states(router)
    assert states["globex/sender/k"] == ("ticked",)
    assert states["globex/receiver/r"] == ("poked",)


@pytest.mark.asyncio
async def test_a_target_send_no_entry_encloses_is_wrapped_only_with_wrap_target(
    router_db: RouterDb,
) -> None:
    plan = Plan("host_job", document="sender", create=Create.IF_ABSENT)
    poke_now = Event("poke_now")
    recorded = Recorded()
    plain = _router(router_db, recorded)
    await plain.deliver_event(plan, scope="acme", key="k", event=poke_now, message_id="j1")
    assert recorded.around == recorded.begun == []  # the host's call: its own to wrap
    wrapping = _router(router_db, recorded, wrap_target=True)
    await wrapping.deliver_event(plan, scope="globex", key="k", event=poke_now, message_id="j2")
    assert recorded.around == recorded.begun == [("globex", "target")]
    recorded.clear()
    # Under an entry of the router's, the target's delivery is enclosed by it.
    await wrapping.route(_command("initech", "m1", name="poke_now"))
    assert recorded.around == recorded.begun == [("initech", "route")]
    states = await _states(wrapping)
    for scope in ("acme", "globex", "initech"):
        assert states[f"{scope}/sender/k"] == ("asked",)
        assert states[f"{scope}/receiver/r"] == ("poked",)


@pytest.mark.asyncio
async def test_a_wrapper_refusing_a_target_refuses_that_send_and_nothing_else(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    recorded = Recorded()
    router = _router(router_db, recorded, wrap_target=True)
    recorded.refuse = {("acme", Entry.TARGET)}
    plan = Plan("host_job", document="sender", create=Create.IF_ABSENT)
    with caplog.at_level(logging.WARNING, "statifier.router.sending"):
        outcome = await router.deliver_event(
            plan, scope="acme", key="k", event=Event("poke_now"), message_id="j1"
        )
    [said] = [r for r in caplog.records if r.name == "statifier.router.sending"]
    assert said.levelno == logging.WARNING
    assert "a send to an execution target was refused" in said.getMessage()
    assert "acme may not target" in said.getMessage()
    assert outcome.outcome == "created_and_delivered"
    states = await _states(router)
    assert states["acme/sender/k"] == ("refused",)  # it heard error.communication
    assert "acme/receiver/r" not in states  # the refused delivery created nothing
    [row] = [row for row in await ledger(router) if row.outcome == "send_refused"]
    assert row.binding_id == "execution"
    assert row.reason is not None
    assert row.reason.startswith("wrapper_refused: around_delivery refused the target")


@pytest.mark.asyncio
async def test_an_on_begin_refusing_a_failed_fire_again_still_keeps_its_retry(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    recorded = Recorded()
    router = _router(router_db, recorded)
    await router.route(_command("globex", "m1"))
    recorded.refuse_begin = {"globex"}
    now = router_db.clock.advance(timedelta(seconds=2))
    worker = TimerWorker(router, retry=5.0)
    with caplog.at_level(logging.WARNING, "statifier.router.timer_worker"):
        assert await worker.fire_due() == 0
    said = [r.getMessage() for r in caplog.records if r.name == "statifier.router.timer_worker"]
    assert len(said) == 2, said
    assert "failed to fire" in said[0]
    assert "on_begin refused scope 'globex' again" in said[1]
    assert await worker.next_due() == now + timedelta(seconds=5)
    recorded.refuse_begin.clear()
    assert await worker.fire_due(now + timedelta(seconds=5)) == 1
    assert (await _states(router))["globex/sender/k"] == ("ticked",)


def test_wrap_target_needs_a_wrapper_or_on_begin(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="wrap_target needs around_delivery or on_begin"):
        router_db.config([], resolver=StaticResolver({}), wrap_target=True)
    with pytest.raises(ConfigError, match="wrap_target must be a boolean"):
        router_db.config([], resolver=StaticResolver({}), wrap_target=1)
    with pytest.raises(ConfigError, match="on_begin must be callable"):
        router_db.config([], resolver=StaticResolver({}), on_begin="SET LOCAL")


@pytest.mark.asyncio
async def test_an_on_begin_that_raises_refuses_that_delivery_and_nothing_else(
    router_db: RouterDb,
) -> None:
    recorded = Recorded()
    router = _router(router_db, recorded)
    recorded.refuse_begin = {"acme"}
    with pytest.raises(PermissionError, match="no tenant acme"):
        await router.route(_command("acme", "m1"))
    answers = await router.route_many(
        [_command("acme", "m2"), _command("globex", "m3"), _command("initech", "m4")]
    )
    assert [type(answer).__name__ for answer in answers] == ["Failed", "Routed", "Routed"]
    states = await _states(router)
    assert set(states) == {"globex/sender/k", "initech/sender/k"}  # acme wrote nothing
    assert {row.message_id for row in await ledger(router)} == {"m3", "m4"}
