"""The router's send handler on both databases: route sends and their keys, scope
overrides, refusals (each one ``send_refused`` ledger row and ``error.communication`` to
the sender, the step standing), sends to the execution itself becoming timers,
``on_complete``, and sends to execution targets in the sender's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from tests.router.conftest import RouterDb
from tests.router.test_route import caller_transaction, end, table_rows
from tests.router.test_timers import entry

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.persistence import Refused, Status
from statifier.persistence.sql import SqlTransaction
from statifier.router import (
    Binding,
    ConfigError,
    CreatedAndDelivered,
    InboundEvent,
    Router,
    StaticResolver,
    ledger,
)
from statifier.router.binding import Create, Plan
from statifier.router.delivery import Delivery, deliver
from statifier.router.errors import OnCompleteFailed
from statifier.router.locations import start_options
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_worker import TimerWorker
from statifier.router.transaction import Delivering

SCOPE = "tenant_a"
SINK = "test:sink"


def _chart(send: str, final: str = "") -> str:
    return f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle">
    <transition event="go" target="sent">{send}</transition>
    <transition event="finish" target="end"/>
  </state>
  <state id="sent">
    <transition event="error.communication" cond="_event.sendid == 's1'" target="failed">
      <assign location="why" expr="_event.data.message"/>
    </transition>
    <transition event="finish" target="end"/>
  </state>
  <state id="failed"/>
  <final id="end">{final}</final>
  <datamodel><data id="why" expr="null"/></datamodel>
</scxml>"""


class Recorder:
    """A route adapter that records every hand-off, or refuses when told to."""

    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[dict[str, Any], Event, IdempotencyKey, bool]] = []
        self.refuse = refuse

    def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> Refused | None:
        self.calls.append((dict(config), event, key, tx is not None))
        return None if self.refuse is None else Refused(self.refuse)


def _binding(document: str) -> Binding:
    return Binding(
        id=f"{document}_commands",
        source="cmd",
        match="event.document == '" + document + "'",
        key="event.key",
        document=document,
        event="go",
        data=("n",),
        create=Create.IF_ABSENT,
    )


def _finishing(document: str) -> Binding:
    return Binding(
        id=f"{document}_finish",
        source="finish",
        match="event.document == '" + document + "'",
        key="event.key",
        document=document,
        event="finish",
        create=Create.NEVER,
    )


def _router(db: RouterDb, charts: Mapping[str, str], **options: object) -> Router:
    machines: dict[str | tuple[str, str], Machine] = {
        name: compile_chart(source) for name, source in charts.items()
    }
    bindings = [b for name in charts for b in (_binding(name), _finishing(name))]
    options.setdefault("send_type", SINK)
    return db.router(bindings, resolver=StaticResolver(machines), **options)


def _command(document: str, message_id: str, key: str = "k1", n: int = 7) -> InboundEvent:
    return InboundEvent(
        scope=SCOPE,
        source="cmd",
        message_id=message_id,
        data={"document": document, "key": key, "n": n},
    )


def _executed(routed: Any) -> str:
    """The execution the one delivering outcome of ``routed`` names."""
    [execution_id] = [o.execution_id for o in routed.outcomes if hasattr(o, "execution_id")]
    assert isinstance(execution_id, str)
    return execution_id


async def _where(router: Router, execution_id: str) -> tuple[str, ...]:
    async with router.transaction() as unit:
        record = await unit.storage.fetch_execution(execution_id)
        machine = await unit.storage.machine(record.content_hash)
        state = unit.storage.load(record, machine)
        ids = (machine.states[i].id for i in state.configuration)
        return tuple(i for i in ids if i is not None)


async def _datamodel(router: Router, execution_id: str) -> Mapping[str, Any]:
    async with router.transaction() as unit:
        record = await unit.storage.fetch_execution(execution_id)
        machine = await unit.storage.machine(record.content_hash)
        return unit.storage.load(record, machine).datamodel


ROUTED = (
    '<send type="test:sink" target="ledger" id="s1" event="pair.joined">'
    '<param name="n" expr="_event.data.n"/></send>'
)


@pytest.mark.asyncio
async def test_a_route_send_reaches_its_adapter_with_the_built_event_and_a_stable_key(
    router_db: RouterDb,
) -> None:
    recorder = Recorder()
    router = _router(router_db, {"doc": _chart(ROUTED)}, routes={"ledger": (recorder, {"q": 1})})
    routed = await router.route(_command("doc", "m1"))
    [outcome] = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    [(route_config, event, key, in_tx)] = recorder.calls
    assert route_config == {"q": 1}
    assert in_tx
    assert (event.name, event.data, event.sendid) == ("pair.joined", {"n": 7}, "s1")
    assert event.origin == f"#_scxml_{outcome.execution_id}"
    assert (key.scope, key.send_id) == (outcome.execution_id, "s1")
    assert str(key).startswith(f"{outcome.execution_id}/s1/")
    assert await _where(router, outcome.execution_id) == ("sent",)


LOOP = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle">
    <transition event="go" target="idle">
      <send type="test:sink" target="ledger" id="s1" event="pair.joined"/>
    </transition>
  </state>
</scxml>"""


@pytest.mark.asyncio
async def test_a_redriven_step_hands_off_again_under_the_same_key(router_db: RouterDb) -> None:
    recorder = Recorder()
    router = _router(router_db, {"doc": LOOP}, routes={"ledger": (recorder, {})})
    await router.route(_command("doc", "m1"))
    # The second event's delivery rolls back after the hand-off (the caller's
    # transaction ends in a rollback); redriven, it hands off under the same key.
    async with caller_transaction(router) as connection:
        await router.route(_command("doc", "m2"), connection=connection)
        await end(connection, commit=False)
    await router.route(_command("doc", "m2"))
    first, rolled_back, redriven = (str(call[2]) for call in recorder.calls)
    assert rolled_back == redriven != first


@pytest.mark.asyncio
async def test_a_scope_overrides_a_routes_config_never_its_existence(router_db: RouterDb) -> None:
    recorder = Recorder()
    router = _router(
        router_db,
        {"doc": _chart(ROUTED)},
        routes={"ledger": (recorder, {"queue": "joined", "region": "eu"})},
        route_overrides={SCOPE: {"ledger": {"queue": "staging_joined"}}},
    )
    await router.route(_command("doc", "m1"))
    assert recorder.calls[0][0] == {"queue": "staging_joined", "region": "eu"}
    with pytest.raises(ConfigError, match="never adds one"):
        _router(
            router_db,
            {"doc": _chart(ROUTED)},
            routes={"ledger": (recorder, {})},
            route_overrides={SCOPE: {"third": {}}},
        )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("send", "options", "code"),
    [
        (ROUTED.replace('target="ledger"', 'target="nowhere"'), {}, "unregistered"),
        (ROUTED.replace('target="ledger"', 'target="https://x.example/in"'), {}, "host_scheme"),
        (
            ROUTED.replace('id="s1"', 'id="s1" delay="5s"'),
            {"timer_queue": None},
            "no_timer_queue",
        ),
        (ROUTED, {"refuse": "queue full"}, "route_failed"),
        (
            ROUTED.replace('target="ledger"', 'target="execution"'),
            {},
            "invalid_target",
        ),
    ],
)
async def test_a_refused_send_writes_one_ledger_row_and_the_sender_hears_it(
    router_db: RouterDb, send: str, options: dict[str, Any], code: str
) -> None:
    options = dict(options)
    recorder = Recorder(refuse=options.pop("refuse", None))
    router = _router(router_db, {"doc": _chart(send)}, routes={"ledger": (recorder, {})}, **options)
    routed = await router.route(_command("doc", "m1"))
    [outcome] = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)  # the step stands
    execution_id = outcome.execution_id
    assert await _where(router, execution_id) == ("failed",)
    assert (await _datamodel(router, execution_id))["why"]
    refused = [row for row in await ledger(router, execution_id) if row.outcome == "send_refused"]
    assert len(refused) == 1
    assert refused[0].reason is not None
    assert refused[0].reason.startswith(code + ":")
    assert refused[0].message_id is not None
    assert refused[0].message_id.startswith(execution_id)


@pytest.mark.asyncio
async def test_a_send_nothing_performs_is_refused_by_the_default_executor(
    router_db: RouterDb,
) -> None:
    send = '<send target="#_elsewhere" id="s1" event="ping"/>'
    router = _router(router_db, {"doc": _chart(send)})
    routed = await router.route(_command("doc", "m1"))
    execution_id = _executed(routed)
    assert await _where(router, execution_id) == ("failed",)
    assert "nothing delivers" in (await _datamodel(router, execution_id))["why"]


@pytest.mark.asyncio
async def test_sends_to_the_execution_itself_and_delayed_sends_become_timers(
    router_db: RouterDb,
) -> None:
    sends = (
        '<send event="again" id="s1"/>'
        '<send event="later" id="s2" delay="2s"/>'
        '<send event="inner" target="#_internal" id="s3" delay="1s"/>'
        '<send type="test:sink" target="ledger" event="out" id="s4" delay="3s"/>'
    )
    router = _router(router_db, {"doc": _chart(sends)}, routes={"ledger": (Recorder(), {})})
    routed = await router.route(_command("doc", "m1"))
    execution_id = _executed(routed)
    rows = sorted(table_rows(router_db, "timers"), key=lambda row: row["step_position"])
    now = router_db.clock.now
    assert [(row["send_id"], row["kind"]) for row in rows] == [
        ("s1", "external"),
        ("s2", "external"),
        ("s3", "internal"),
        ("s4", "route"),
    ]
    assert [row["due_at"] - now for row in rows] == [
        timedelta(seconds=0),
        timedelta(seconds=2),
        timedelta(seconds=1),
        timedelta(seconds=3),
    ]
    assert {row["execution_id"] for row in rows} == {execution_id}
    # A redelivery of the same message is a duplicate and schedules nothing more.
    await router.route(_command("doc", "m1"))
    assert len(table_rows(router_db, "timers")) == 4


CANCELLING = (
    '<send event="later" id="t1" delay="60s"/>'
    '<send event="later" id="t2" delay="60s"/>'
    '<cancel sendid="t1"/>'
)


@pytest.mark.asyncio
async def test_a_cancel_deletes_the_executions_timers_of_that_send_id(router_db: RouterDb) -> None:
    router = _router(router_db, {"doc": _chart(CANCELLING)})
    await router.route(_command("doc", "m1"))
    assert [row["send_id"] for row in table_rows(router_db, "timers")] == ["t2"]


HUGE = "99999999999999999999d"


async def _refused_send(
    router_db: RouterDb, send: str, code: str, data: Mapping[str, Any] | None = None
) -> str:
    """Route ``go`` (with ``data``) to a chart sending ``send`` (id ``s1``), check the
    send was refused with ``code`` (one ``send_refused`` row, ``error.communication``
    heard, the step standing, no timer), and answer what the chart read of it."""
    router = _router(router_db, {"doc": _chart(send)}, routes={"ledger": (Recorder(), {})})
    event = InboundEvent(
        scope=SCOPE,
        source="cmd",
        message_id="m1",
        data={"document": "doc", "key": "k1", "n": 7, **(data or {})},
    )
    routed = await router.route(event)
    [outcome] = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)  # the step stands
    execution_id = outcome.execution_id
    assert await _where(router, execution_id) == ("failed",)
    refused = [row for row in await ledger(router, execution_id) if row.outcome == "send_refused"]
    assert [row.reason.split(":")[0] for row in refused if row.reason] == [code]
    assert table_rows(router_db, "timers") == []
    why = (await _datamodel(router, execution_id))["why"]
    assert isinstance(why, str)
    return why


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "send",
    [
        f'<send event="later" id="s1" delay="{HUGE}"/>',
        '<send event="later" id="s1" delay="36526d"/>',
        '<send event="later" id="s1" delayexpr="_event.data.n"/>',
        f'<send event="later" target="#_internal" id="s1" delay="{HUGE}"/>',
        f'<send type="test:sink" target="ledger" event="out" id="s1" delay="{HUGE}"/>',
    ],
    ids=["literal", "a_day_too_long", "from_the_event", "internal", "route"],
)
async def test_a_send_delayed_past_the_longest_delay_is_refused_and_the_sender_hears_it(
    router_db: RouterDb, send: str
) -> None:
    # Never an OverflowError out of the step: the delay may come from a caller's data.
    why = await _refused_send(router_db, send, "delay", {"n": HUGE})
    assert "longer than 36525 days" in why


@pytest.mark.asyncio
async def test_a_send_delayed_by_the_longest_delay_is_a_timer(router_db: RouterDb) -> None:
    router = _router(router_db, {"doc": _chart('<send event="later" id="s1" delay="36525d"/>')})
    execution_id = _executed(await router.route(_command("doc", "m1")))
    assert await _where(router, execution_id) == ("sent",)
    [row] = table_rows(router_db, "timers")
    assert row["due_at"] - router_db.clock.now == timedelta(days=36_525)


BASICHTTP_TYPE = "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor"
TO_K2 = "".join(
    f'<param name="{name}" expr="\'{value}\'"/>'
    for name, value in (("document", "doc"), ("key", "k2"), ("create", "if_absent"))
)
"""An execution-target send's params: another execution of ``doc``, made if absent."""

# An integer too long to write as JSON.
BIG = '<param name="p" expr="Math.pow(2, 30000) * Math.pow(2, 30000)"/></send>'


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "send",
    [
        f'<send event="later" id="s1">{BIG}',
        f'<send event="later" id="s1" delay="1s">{BIG}',
        f'<send event="later" target="#_internal" id="s1" delay="1s">{BIG}',
        f'<send type="test:sink" target="ledger" event="out" id="s1" delay="1s">{BIG}',
        f'<send type="{BASICHTTP_TYPE}" target="http://rx.test/in" event="out" id="s1">{BIG}',
        f'<send type="test:sink" target="execution" event="poke" id="s1">{TO_K2}{BIG}',
    ],
    ids=["due_now", "delayed", "internal", "route", "basichttp", "execution"],
)
async def test_a_timer_whose_event_cannot_be_stored_is_refused_and_the_sender_hears_it(
    router_db: RouterDb, send: str
) -> None:
    # Never a ValueError out of the step: the chart hears error.communication.
    why = await _refused_send(router_db, send, "unstorable")
    assert why.startswith("the send's event cannot be stored")


DONE = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle"><transition event="go" target="end"/></state>
  <final id="end"><donedata><param name="total" expr="_event.data.n * 2"/></donedata></final>
</scxml>"""


@pytest.mark.asyncio
async def test_on_complete_receives_the_donedata_on_the_finishing_delivery_only(
    router_db: RouterDb,
) -> None:
    recorder = Recorder()
    router = _router(router_db, {"doc": DONE}, routes={"done": (recorder, {})}, on_complete="done")
    routed = await router.route(_command("doc", "m1", n=21))
    execution_id = _executed(routed)
    [(_, event, key, _)] = recorder.calls
    assert (event.name, event.data, event.origin) == (
        "done.execution",
        {"total": 42},
        f"#_scxml_{execution_id}",
    )
    assert (key.scope, key.send_id, key.ordinal) == (execution_id, None, None)
    await router.route(_command("doc", "m2", n=1))  # finished: dropped, fires nothing
    assert len(recorder.calls) == 1


@pytest.mark.asyncio
async def test_a_refusing_on_complete_rolls_the_finishing_delivery_back(
    router_db: RouterDb,
) -> None:
    router = _router(
        router_db,
        {"doc": DONE},
        routes={"done": (Recorder(refuse="sink down"), {})},
        on_complete="done",
    )
    with pytest.raises(OnCompleteFailed, match="sink down"):
        await router.route(_command("doc", "m1"))
    assert table_rows(router_db, "executions") == []
    assert table_rows(router_db, "routing_ledger") == []
    with pytest.raises(ConfigError, match="not a route"):
        _router(router_db, {"doc": DONE}, routes={"done": (Recorder(), {})}, on_complete="gone")


TARGETED = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <datamodel><data id="got" expr="0"/><data id="why" expr="null"/></datamodel>
  <state id="idle">
    <transition event="go" target="asked">
      <send type="test:sink" target="execution" id="s1" event="poke">
        <param name="document" expr="'receiver'"/>
        <param name="key" expr="_event.data.target"/>
        <param name="create" expr="_event.data.create"/>
        <param name="n" expr="_event.data.n"/>
      </send>
    </transition>
    <transition event="poke" target="idle">
      <assign location="got" expr="got + _event.data.n"/>
    </transition>
  </state>
  <state id="asked">
    <transition event="error.communication" cond="_event.sendid == 's1'" target="failed">
      <assign location="why" expr="_event.data.message"/>
    </transition>
  </state>
  <state id="failed"/>
</scxml>"""

RECEIVER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
  <datamodel><data id="got" expr="0"/></datamodel>
  <state id="waiting">
    <transition event="poke" target="poked">
      <assign location="got" expr="_event.data.n"/>
    </transition>
    <transition event="finish" target="end"/>
  </state>
  <state id="poked"/>
  <final id="end"/>
</scxml>"""


def _target_command(message_id: str, target: str, create: str = "never") -> InboundEvent:
    return InboundEvent(
        scope=SCOPE,
        source="cmd",
        message_id=message_id,
        data={"document": "sender", "key": "s", "n": 5, "target": target, "create": create},
    )


def _target_router(db: RouterDb) -> Router:
    bindings = [
        Binding(
            id="sender_commands",
            source="cmd",
            match="event.document == 'sender'",
            key="event.key",
            document="sender",
            event="go",
            data=("n", "target", "create"),
            create=Create.IF_ABSENT,
        ),
        _binding("receiver"),
        _finishing("receiver"),
    ]
    charts: dict[str | tuple[str, str], Machine] = {
        "sender": compile_chart(TARGETED),
        "receiver": compile_chart(RECEIVER),
    }
    return db.router(bindings, resolver=StaticResolver(charts), send_type=SINK)


@pytest.mark.asyncio
async def test_an_execution_target_send_steps_the_receiver_in_the_senders_transaction(
    router_db: RouterDb,
) -> None:
    router = _target_router(router_db)
    made = await router.route(_command("receiver", "r1", key="r"))
    receiver = _executed(made)
    routed = await router.route(_target_command("m1", "r"))
    sender = _executed(routed)
    assert await _where(router, sender) == ("asked",)
    assert await _where(router, receiver) == ("poked",)
    assert (await _datamodel(router, receiver))["got"] == 5
    [row] = [row for row in await ledger(router, receiver) if row.binding_id == "execution"]
    assert (row.outcome, row.scope, row.key) == ("delivered", SCOPE, "r")
    assert row.message_id is not None
    assert row.message_id.startswith(f"{sender}/s1/")


@pytest.mark.asyncio
async def test_a_timer_batch_steps_a_target_its_sender_stepped_from_the_row_as_written(
    router_db: RouterDb,
) -> None:
    """The timer worker reads a batch's executions ahead: one stepped by another's
    execution-target send earlier in the batch must step from what that send wrote,
    not from the row as read before the batch."""
    router = _target_router(router_db)
    receiver = _executed(await router.route(_command("receiver", "r1", key="r")))
    now = router_db.clock.now
    async with router.transaction() as unit:
        options = await start_options(unit, None, "sender_1", now)
        executions = unit.executions(Delivering(None, now))
        await executions.create("sender_1", compile_chart(TARGETED), options=options)
    go = Event("go", data={"target": "r", "create": "never", "n": 5})
    entries = [
        replace(entry("sender_1", 1, now - timedelta(seconds=2), event=go), scope=SCOPE),
        replace(
            entry(receiver, 2, now - timedelta(seconds=1), event=Event("poke", data={"n": 1})),
            scope=SCOPE,
        ),
    ]
    assert router.timers is not None
    async with router.transaction() as unit:
        for one in entries:
            await router.timers.schedule(unit.tx, one)
    assert await TimerWorker(router, batch=10).fire_due(now) == 2
    # The sender's poke moved the receiver to "poked" (got 5); its own poke, second,
    # finds it there and does nothing. From the row read ahead it would have been the
    # first poke, and got 1.
    assert await _where(router, receiver) == ("poked",)
    assert (await _datamodel(router, receiver))["got"] == 5
    assert await _where(router, "sender_1") == ("asked",)


@pytest.mark.asyncio
async def test_an_execution_target_may_be_created_if_absent(router_db: RouterDb) -> None:
    router = _target_router(router_db)
    await router.route(_target_command("m1", "new", create=Create.IF_ABSENT))
    rows = [row for row in await ledger(router) if row.binding_id == "execution"]
    assert [row.outcome for row in rows] == ["created_and_delivered"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("setup", "code"), [("missing", "no_execution"), ("finished", "finished")])
async def test_a_missing_or_finished_target_is_refused_to_the_sender(
    router_db: RouterDb, setup: str, code: str
) -> None:
    router = _target_router(router_db)
    if setup == "finished":
        await router.route(_command("receiver", "r1", key="r"))
        await router.route(
            InboundEvent(
                scope=SCOPE,
                source="finish",
                message_id="f1",
                data={"document": "receiver", "key": "r"},
            ),
        )
    routed = await router.route(_target_command("m1", "r"))
    sender = _executed(routed)
    assert await _where(router, sender) == ("failed",)
    [row] = [row for row in await ledger(router, sender) if row.outcome == "send_refused"]
    assert row.binding_id == "execution"
    assert row.reason is not None
    assert row.reason.startswith(code + ":")


@pytest.mark.asyncio
async def test_a_send_to_the_senders_own_address_is_refused_as_reentrant(
    router_db: RouterDb,
) -> None:
    # The sender's own key is "s": sending to (sender, "s") would step it mid-step.
    charts: dict[str | tuple[str, str], Machine] = {
        "sender": compile_chart(TARGETED.replace("'receiver'", "'sender'"))
    }
    router = router_db.router(
        [
            Binding(
                id="sender_commands",
                source="cmd",
                match="true",
                key="event.key",
                document="sender",
                event="go",
                data=("n", "target", "create"),
                create=Create.IF_ABSENT,
            )
        ],
        resolver=StaticResolver(charts),
        send_type=SINK,
    )
    routed = await router.route(_target_command("m1", "s"))
    sender = _executed(routed)
    assert await _where(router, sender) == ("failed",)
    [row] = [row for row in await ledger(router, sender) if row.outcome == "send_refused"]
    assert row.reason is not None
    assert row.reason.startswith("reentrant:")


@pytest.mark.asyncio
async def test_a_rolled_back_sender_takes_the_receivers_step_with_it(router_db: RouterDb) -> None:
    router = _target_router(router_db)
    made = await router.route(_command("receiver", "r1", key="r"))
    receiver = _executed(made)

    class BoomError(Exception):
        pass

    outcomes = []

    async def deliver_then_fail() -> None:
        async with router.transaction() as unit:
            plan = Plan("sender_commands", document="sender", create=Create.IF_ABSENT)
            event = Event("go", data={"n": 5, "target": "r", "create": "never"})
            delivery = Delivery(plan, SCOPE, "s", event, "m1")
            outcomes.append(await deliver(unit, delivery, router_db.clock.now))
            raise BoomError

    with pytest.raises(BoomError):
        await deliver_then_fail()
    assert isinstance(outcomes[0], CreatedAndDelivered)
    assert await _where(router, receiver) == ("waiting",)
    record = [row for row in table_rows(router_db, "executions") if row["execution_id"] == receiver]
    assert record[0]["status"] == Status.ACTIVE.value
    assert [
        row for row in table_rows(router_db, "routing_ledger") if row["binding_id"] == "execution"
    ] == []
