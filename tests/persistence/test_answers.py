"""Durable children's answers: written when the child ends, delivered once, re-driven
after a crash; a fan-out closed in its own table; retirement pins on linked children
and refuses a create it races with (every backend; the race on two real connections)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.persistence import EffectContext, ExecutionRecord, Executions, Status, Storage
from statifier.persistence.adapter import Adapter
from statifier.persistence.driver import Driver
from statifier.persistence.errors import ChartRetired, Pinned
from statifier.persistence.sql import SqlAdapter

from .conftest import SqlStore

NS = "http://www.w3.org/2005/07/scxml"


def chart(body: str, initial: str = "a") -> Machine:
    return compile_chart(f'<scxml xmlns="{NS}" initial="{initial}">{body}</scxml>')


CHILD = (
    '<scxml initial="w"><state id="w"><transition event="go" target="done"/></state>'
    '<final id="done"><donedata><param name="v" expr="7"/></donedata></final></scxml>'
)

# The parent stays in the invoking state after an answer and counts what it was told:
# only the answer row's delivered mark stops a second delivery, not the chart.
COUNTING = chart(
    '<datamodel><data id="told" expr="[]"/></datamodel>'
    f'<state id="a"><invoke id="sub" type="scxml"><content>{CHILD}</content></invoke>'
    '<transition event="done.invoke.sub">'
    '<assign location="told" expr="told + [_event.name]"/></transition>'
    '<transition event="error.communication.invoke.sub">'
    '<assign location="told" expr="told + [_event.data.reason]"/></transition>'
    '<transition event="stop" target="b"/></state><final id="b"/>'
)

ITEM = (
    '<scxml initial="w"><state id="w"><transition event="ok" target="ok"/></state>'
    '<final id="ok"><donedata><param name="ok" expr="1"/></donedata></final></scxml>'
)
FAN = chart(
    '<datamodel><data id="results" expr="null"/></datamodel>'
    f'<state id="a"><invoke id="each" type="myapp:map"><content>{ITEM}</content></invoke>'
    '<transition event="done.invoke.each" target="b">'
    '<assign location="results" expr="_event.data"/></transition></state><final id="b"/>'
)


async def told(driver: Driver, execution_id: str = "p") -> object:
    record = await driver.storage.fetch_execution(execution_id)
    machine = await driver.storage.machine(record.content_hash)
    return driver.storage.load(record, machine).datamodel["told"]


async def answers_logged(driver: Driver, execution_id: str = "p") -> list[str]:
    return [
        entry.event.name
        for entry in await driver.executions.inputs(execution_id)
        if entry.via == "answer" and entry.event is not None
    ]


@pytest.mark.asyncio
async def test_an_ended_childs_answer_is_written_in_its_end_and_delivered_once(
    adapter: Adapter,
) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    assert await driver.storage.fetch_answer("p/sub") is None  # owed only once it ends
    await driver.send_event("p/sub", Event("go"))
    answer = await driver.storage.fetch_answer("p/sub")
    assert answer is not None
    assert (answer.parent_id, answer.invoke_id, answer.status) == ("p", "sub", Status.COMPLETED)
    assert answer.delivered_at is not None
    assert await told(driver) == ["done.invoke.sub"]
    assert await driver.redrive_answers() == 0


@pytest.mark.asyncio
async def test_a_child_failed_or_cancelled_by_the_host_answers_its_parent(
    adapter: Adapter,
) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    await driver.fail("p/sub", "declined")
    assert await told(driver) == ["declined"]
    await driver.create("q", COUNTING)
    await driver.cancel("q/sub")
    assert await told(driver, "q") == ["cancelled"]


@pytest.mark.asyncio
async def test_an_answer_left_owed_by_a_crash_is_redriven_exactly_once(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    # The child ends through the lifecycle alone, as if the process died right after
    # the child's transaction committed: the answer is written and owed.
    await driver.executions.step("p/sub", None, Event("go"))
    owed = await driver.storage.undelivered_answers(10)
    assert [a.child_id for a in owed] == ["p/sub"]
    assert await told(driver) == []
    # Three redrives race, each handed the same owed answer: one step in the parent.
    handed = await asyncio.gather(*(driver.redrive_answers() for _ in range(3)))
    assert sum(handed) >= 1
    assert await told(driver) == ["done.invoke.sub"]
    # A deliverer holding the answer as it read it before the first delivery (a reaper
    # that listed it just before): the mark in the store stops it.
    await driver._hand_over(owed[0])
    assert await told(driver) == ["done.invoke.sub"]
    assert await answers_logged(driver) == ["done.invoke.sub"]
    assert await driver.storage.undelivered_answers(10) == []


@pytest.mark.asyncio
async def test_an_answer_to_a_parked_parent_stays_owed_until_it_is_put_back(
    adapter: Adapter,
) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    await driver.executions.park("p")
    await driver.send_event("p/sub", Event("go"))
    owed = await driver.storage.fetch_answer("p/sub")
    assert owed is not None
    assert owed.delivered_at is None
    assert await driver.storage.undelivered_answers(10) == []  # until it takes it
    await driver.executions.unpark("p")
    assert await driver.redrive_answers() == 1
    assert await told(driver) == ["done.invoke.sub"]
    assert await driver.storage.undelivered_answers(10) == []


@pytest.mark.asyncio
async def test_answers_to_parked_parents_do_not_hide_the_rest_from_a_redrive(
    adapter: Adapter,
) -> None:
    """Answers owed to waiting parents are the oldest and stay owed: a redrive of the
    oldest few reaches the others all the same, and a loop until none is handed ends."""
    driver = Driver(Storage(adapter))
    for parent in ("p1", "p2", "q"):
        await driver.create(parent, COUNTING)
        await driver.executions.step(f"{parent}/sub", None, Event("go"))  # owed, undelivered
    await driver.executions.park("p1")
    await driver.executions.pause("p2")
    assert await driver.redrive_answers(limit=1) == 1
    assert await told(driver, "q") == ["done.invoke.sub"]
    assert await driver.redrive_answers(limit=1) == 0
    owed = [a.child_id for a in await driver.storage.undelivered_answers(10)]
    assert owed == []
    await driver.executions.unpark("p1")
    assert await driver.redrive_answers() == 1
    assert await told(driver, "p1") == ["done.invoke.sub"]


@pytest.mark.asyncio
async def test_an_answer_whose_delivery_raises_is_logged_and_stays_owed(
    adapter: Adapter, caplog: pytest.LogCaptureFixture
) -> None:
    down = [True]

    def effects(effect: fx.Effect, context: EffectContext) -> None:
        if isinstance(effect, fx.Log) and down:
            raise RuntimeError("the log sink is down")

    telling = chart(
        f'<state id="a"><invoke id="sub" type="scxml"><content>{CHILD}</content></invoke>'
        '<transition event="done.invoke.sub" target="b"><log expr="1"/></transition>'
        '</state><final id="b"/>'
    )
    driver = Driver(Storage(adapter), effects=effects)
    await driver.create("p", telling)
    await driver.executions.step("p/sub", None, Event("go"))
    with caplog.at_level(logging.WARNING, "statifier.persistence"):
        assert await driver.redrive_answers() == 0
    [said] = [r for r in caplog.records if "could not be delivered" in r.getMessage()]
    assert said.levelno == logging.WARNING
    assert "execution p: the answer of child p/sub" in said.getMessage()
    assert "the log sink is down" in said.getMessage()
    assert [a.child_id for a in await driver.storage.undelivered_answers(10)] == ["p/sub"]
    down.clear()
    # This driver puts the answer off for a while; the next (a reaper's next run) takes it.
    assert await driver.redrive_answers() == 0
    assert await Driver(Storage(adapter), effects=effects).redrive_answers() == 1
    assert await driver.storage.undelivered_answers(10) == []


# Taking the answer starts a service whose dispatch always raises: a poisoned answer.
POISONED = chart(
    f'<state id="a"><invoke id="sub" type="scxml"><content>{CHILD}</content></invoke>'
    '<transition event="done.invoke.sub" target="b"/></state>'
    '<state id="b"><invoke id="svc" type="myapp:boom"/></state>'
)
HEALTHY = chart(
    f'<state id="a"><invoke id="sub" type="scxml"><content>{CHILD}</content></invoke>'
    '<transition event="done.invoke.sub" target="b"/></state><final id="b"/>'
)


@pytest.mark.asyncio
async def test_answers_that_always_fail_do_not_starve_the_ones_behind_them(
    adapter: Adapter, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(invoke: object, context: object) -> None:
        raise RuntimeError("the service is down")

    driver = Driver(Storage(adapter), dispatch=boom)
    for number in range(3):  # three poisoned answers, older than the healthy one
        await driver.create(f"poisoned{number}", POISONED)
        await driver.executions.step(f"poisoned{number}/sub", None, Event("go"))
    await driver.create("healthy", HEALTHY)
    await driver.executions.step("healthy/sub", None, Event("go"))
    with caplog.at_level(logging.WARNING, "statifier.persistence"):
        assert await driver.redrive_answers(limit=1) == 1
        # The failing ones are put off: the next passes read past them.
        assert await driver.redrive_answers(limit=1) == 0
    assert (await driver.storage.fetch_execution("healthy")).status is Status.COMPLETED
    owed = {answer.child_id for answer in await driver.storage.undelivered_answers(10)}
    assert owed == {"poisoned0/sub", "poisoned1/sub", "poisoned2/sub"}
    said = [r.getMessage() for r in caplog.records if "could not be delivered" in r.getMessage()]
    assert len(said) == 1  # one line for one kind of failure, the others counted later


@pytest.mark.asyncio
async def test_an_answer_the_parent_no_longer_takes_is_marked_delivered(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    await driver.executions.step("p/sub", None, Event("go"))
    await driver.executions.step("p", None, Event("stop"))  # leaves; the child has ended
    assert await driver.redrive_answers() == 1
    assert await answers_logged(driver) == []
    assert await driver.storage.undelivered_answers(10) == []


async def fan_out(driver: Driver, count: int) -> fx.Invoke:
    invokes: list[fx.Invoke] = []

    def dispatch(invoke: fx.Invoke, context: EffectContext) -> None:
        invokes.append(invoke)

    driver.dispatch = dispatch
    await driver.create("p", FAN)
    for index in range(count):
        await driver.start_child_at("p", invokes[0], index, count)
    return invokes[0]


@pytest.mark.asyncio
async def test_a_fan_out_closes_in_its_own_table_not_as_an_execution(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await fan_out(driver, 3)
    for index in range(3):
        await driver.send_event(f"p/each/{index}", Event("ok"))
    parent = await driver.storage.fetch_execution("p")
    assert parent.status is Status.COMPLETED
    assert await driver.storage.fan_out_ended("p", "each")
    assert await driver.executions.executions_on(parent.content_hash) == {"executions_completed": 1}
    listed = sorted(record.id for record in await driver.storage.list_executions())
    assert listed == ["p", "p/each/0", "p/each/1", "p/each/2"]
    assert await driver.storage.undelivered_answers(10) == []


@pytest.mark.asyncio
async def test_fan_out_answers_left_owed_close_once_when_redriven(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await fan_out(driver, 3)
    for index in range(3):  # every child ends; every process dies before closing it
        await driver.executions.step(f"p/each/{index}", None, Event("ok"))
    assert len(await driver.storage.undelivered_answers(10)) == 3
    assert (await driver.storage.fetch_execution("p")).status is Status.ACTIVE
    await asyncio.gather(driver.redrive_answers(limit=2), driver.redrive_answers(limit=3))
    assert (await driver.storage.fetch_execution("p")).status is Status.COMPLETED
    assert await answers_logged(driver) == ["done.invoke.each"]
    assert await driver.storage.undelivered_answers(10) == []


@pytest.mark.asyncio
async def test_redrive_refuses_a_limit_below_one(adapter: Adapter) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        await Driver(Storage(adapter)).redrive_answers(limit=0)


@pytest.mark.asyncio
async def test_a_childs_chart_is_pinned_while_its_parent_runs(adapter: Adapter) -> None:
    driver = Driver(Storage(adapter))
    await driver.create("p", COUNTING)
    await driver.send_event("p/sub", Event("go"))  # ended; the parent stays active
    child = await driver.storage.fetch_execution("p/sub")
    assert child.status is Status.COMPLETED
    with pytest.raises(Pinned) as refused:
        await driver.executions.retire_chart(child.content_hash, retired_by="ops")
    assert refused.value.counts["children_linked"] == 1
    await driver.executions.cancel("p")
    retired = await driver.executions.retire_chart(child.content_hash, retired_by="ops")
    assert retired.retired_at is not None


@pytest.mark.asyncio
async def test_a_create_on_a_retired_chart_is_refused(adapter: Adapter) -> None:
    machine = chart('<state id="a"/>')
    executions = Executions(Storage(adapter))
    await executions.storage.save_chart(machine)
    await executions.retire_chart(machine.identity.content_hash, retired_by="ops")
    with pytest.raises(ChartRetired):
        await executions.create("late", machine)


# The race, on two real connections (two adapters over one database).

RACED = chart('<state id="a"/>')
HASH = RACED.identity.content_hash


async def _create_held(store: SqlStore, inserted: asyncio.Event, release: asyncio.Event) -> None:
    """Insert an execution on RACED and hold its transaction open until ``release``."""
    async with SqlAdapter(store.url, store.tables) as adapter:
        storage = Storage(adapter)
        await storage.save_chart(RACED)
        async with adapter.exclusive("racer", 10.0):
            await Executions(storage).create("racer", RACED)  # nested: one transaction
            inserted.set()
            await release.wait()


@pytest.mark.asyncio
async def test_a_retirement_waits_for_a_concurrent_create_and_counts_it(
    sql_store: SqlStore,
) -> None:
    sql_store.empty()
    inserted, release = asyncio.Event(), asyncio.Event()
    creating = asyncio.create_task(_create_held(sql_store, inserted, release))
    await asyncio.wait_for(inserted.wait(), 10)
    async with SqlAdapter(sql_store.url, sql_store.tables) as other:
        retiring = asyncio.create_task(
            Executions(Storage(other)).retire_chart(HASH, retired_by="ops")
        )
        await asyncio.sleep(0.5)
        assert not retiring.done()  # it waits for the create's transaction
        release.set()
        await creating
        with pytest.raises(Pinned) as refused:
            await retiring
        assert refused.value.counts.get("executions_active") == 1
        chart_row = await other.fetch_chart(HASH)
        assert chart_row is not None
        assert chart_row.retired_at is None


@pytest.mark.asyncio
async def test_a_create_waits_for_a_concurrent_retirement_and_is_refused(
    sql_store: SqlStore,
) -> None:
    sql_store.empty()
    async with (
        SqlAdapter(sql_store.url, sql_store.tables) as retirer,
        SqlAdapter(sql_store.url, sql_store.tables) as creator,
    ):
        await Storage(creator).save_chart(RACED)
        creating: asyncio.Task[object] | None = None
        async with retirer.transaction(10.0) as tx:
            retired = await tx.adapter.retire_chart(HASH, "ops", Storage(retirer).clock())
            assert retired is not None
            # Past the chart's save (done above), the insert itself meets the retirement.
            record = ExecutionRecord(
                "late",
                content_hash=HASH,
                status=Status.ACTIVE,
                position=b"",
                created_at=retired.saved_at,
                updated_at=retired.saved_at,
            )
            creating = asyncio.create_task(creator.insert_execution(record))
            await asyncio.sleep(0.5)
            assert not creating.done()  # it waits for the retirement's transaction
        with pytest.raises(ChartRetired):
            await creating
        assert await creator.fetch_execution("late") is None
