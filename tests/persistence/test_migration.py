"""Migrating durable executions onto a new revision of their chart, on every backend:
the in-memory reference, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core.positions import IdentityMismatch
from statifier.persistence import (
    Discarded,
    Driver,
    ExecutionNotFound,
    Executions,
    InvalidMigrationPlan,
    MemoryAdapter,
    Migrated,
    MigrationPlan,
    MigrationSummary,
    Parked,
    Status,
    Stepped,
    Storage,
)
from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.errors import MetadataUnsupported
from statifier.persistence.migration import LoggedMigration
from statifier.persistence.sql import SqlAdapter
from statifier.telemetry import attach, detach

NS = 'xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"'

V1 = compile_chart(
    f'<scxml {NS} initial="placed">'
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paid">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="paid"><transition event="ship" target="shipped"/></state>'
    '<state id="shipped"><transition event="hold" target="held"/>'
    '<transition event="deliver" target="delivered"/></state>'
    '<state id="held"><transition event="release" target="shipped"/></state>'
    '<final id="delivered"/></scxml>'
)

# The revision renames paid to charged, removes held, and declares a new variable.
V2 = compile_chart(
    f'<scxml {NS} initial="placed">'
    '<datamodel><data id="n" expr="0"/><data id="carrier" expr="\'post\'"/></datamodel>'
    '<state id="placed"><transition event="pay" target="charged">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="charged"><transition event="ship" target="shipped"/></state>'
    '<state id="shipped"><transition event="deliver" target="delivered"/></state>'
    '<final id="delivered"/></scxml>'
)

PLAN = MigrationPlan(V1, V2, state_map={"paid": "charged"}, data={"carrier": "post"})
HELD = "active state 'held' is not in the new chart and the plan maps it nowhere"

# Where each of the four groups of executions stands before the migration.
GROUPS: dict[int, tuple[tuple[str, ...], str | None]] = {
    0: ((), "placed"),
    1: (("pay",), "charged"),
    2: (("pay", "ship"), "shipped"),
    3: (("pay", "ship", "hold"), None),  # held: removed, so parked
}


async def at(executions: Executions, execution_id: str, *events: str) -> None:
    await executions.create(execution_id, V1)
    for name in events:
        answer = await executions.step(execution_id, None, Event(name))
        assert isinstance(answer, Stepped)


@asynccontextmanager
async def beside(adapter: Adapter, executions: Executions) -> AsyncIterator[Executions]:
    """Executions over a second connection pool to the same database (as another
    process would be); the same ones on the in-memory adapter."""
    if not isinstance(adapter, SqlAdapter):
        yield executions
        return
    url = adapter.engine.url.render_as_string(hide_password=False)
    async with SqlAdapter(url, adapter.tables) as second:
        yield Executions(Storage(second))


def leaves(answer: Any) -> tuple[str, ...]:
    assert isinstance(answer, Stepped | Migrated)
    return answer.state.leaf_configuration()


@pytest.mark.asyncio
async def test_one_execution_moves_and_steps_on_the_new_chart(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    await at(executions, "order-1", "pay")
    moved = await executions.migrate("order-1", PLAN)
    assert isinstance(moved, Migrated)
    assert moved.execution.content_hash == V2.identity.content_hash
    assert moved.execution.status is Status.ACTIVE
    assert moved.state.leaf_configuration() == ("charged",)
    assert moved.state.datamodel["n"] == 1
    assert moved.state.datamodel["carrier"] == "post"

    stored = await executions.storage.fetch_execution("order-1")
    assert stored.content_hash == V2.identity.content_hash
    # The stored chart and the new machine both step it; the old one is refused.
    assert leaves(await executions.step("order-1", None, Event("ship"))) == ("shipped",)
    with pytest.raises(IdentityMismatch):
        await executions.step("order-1", V1, Event("deliver"))
    done = await executions.step("order-1", V2, Event("deliver"))
    assert isinstance(done, Stepped)
    assert done.execution.status is Status.COMPLETED

    log = await executions.inputs("order-1")
    assert [(entry.via, entry.event and entry.event.name) for entry in log] == [
        ("step", "pay"),
        ("migrate", None),
        ("step", "ship"),
        ("step", "deliver"),
    ]
    assert log[1].migration == LoggedMigration(
        V1.identity.content_hash, V2.identity.content_hash, None, {"paid": "charged"}
    )


@pytest.mark.asyncio
async def test_an_unmappable_execution_is_parked_with_the_reason(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    await at(executions, "order-2", "pay", "ship", "hold")
    parked = await executions.migrate("order-2", PLAN)
    assert isinstance(parked, Parked)
    assert parked.reason == HELD
    record = await executions.storage.fetch_execution("order-2")
    assert record.status is Status.NEEDS_MIGRATION
    assert record.failure == HELD
    assert record.content_hash == V1.identity.content_hash  # left on its chart
    (*_, entry) = await executions.inputs("order-2")
    assert entry.via == "migrate"
    assert entry.migration is not None
    assert entry.migration.reason == HELD
    # Parked, it takes no event; nothing is logged for the discarded one.
    assert isinstance(await executions.step("order-2", None, Event("release")), Discarded)
    assert len(await executions.inputs("order-2")) == 4

    # A corrected plan moves it (held folded into shipped).
    fixed = MigrationPlan(
        V1, V2, state_map={"paid": "charged", "held": "shipped"}, data={"carrier": "van"}
    )
    moved = await executions.migrate("order-2", fixed)
    assert isinstance(moved, Migrated)
    assert moved.execution.failure is None
    assert moved.state.leaf_configuration() == ("shipped",)
    assert moved.state.datamodel["carrier"] == "van"


@pytest.mark.asyncio
async def test_migrations_report_their_lifecycle_transition(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    await at(executions, "t-moved", "pay")
    await at(executions, "t-parked", "pay", "ship", "hold")
    seen: list[tuple[str, str, str | None]] = []
    attach(
        "test-migration-lifecycle",
        "statifier.persistence.lifecycle",
        lambda _name, _m, meta: seen.append(
            (meta["execution_id"], meta["transition"], meta["failure"])
        ),
    )
    try:
        await executions.migrate("t-moved", PLAN)
        await executions.migrate("t-parked", PLAN)
    finally:
        detach("test-migration-lifecycle")
    assert seen == [("t-moved", "migrated", None), ("t-parked", "needs_migration", HELD)]


@pytest.mark.asyncio
async def test_unpark_clears_the_reason_and_puts_it_back_on_its_chart(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    await at(executions, "order-3", "pay", "ship", "hold")
    assert isinstance(await executions.migrate("order-3", PLAN), Parked)
    back = await executions.unpark("order-3")
    assert not isinstance(back, Discarded)
    assert (back.status, back.failure) == (Status.ACTIVE, None)
    assert leaves(await executions.step("order-3", V1, Event("release"))) == ("shipped",)


@pytest.mark.asyncio
async def test_what_a_migration_leaves_alone(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    await at(executions, "done", "pay", "ship", "deliver")
    assert isinstance(await executions.migrate("done", PLAN), Discarded)
    await at(executions, "twice")
    assert isinstance(await executions.migrate("twice", PLAN), Migrated)
    again = await executions.migrate("twice", PLAN)  # already on the new chart
    assert isinstance(again, Discarded)
    assert [entry.via for entry in await executions.inputs("twice")] == ["migrate"]
    with pytest.raises(ExecutionNotFound):
        await executions.migrate("nobody", PLAN)
    other = compile_chart(f'<scxml {NS}><state id="x"/></scxml>')
    await executions.create("elsewhere", other)
    with pytest.raises(IdentityMismatch):
        await executions.migrate("elsewhere", PLAN)
    with pytest.raises(InvalidMigrationPlan):
        await executions.migrate_all(other.identity.content_hash, PLAN)
    with pytest.raises(ValueError, match="batch"):
        await executions.migrate_all(PLAN.source_hash, PLAN, batch=0)
    with pytest.raises(ValueError, match="lifecycle's own"):
        await executions.step("elsewhere", None, Event("x"), via="migrate")


MANY = 1_000


@pytest.mark.asyncio
async def test_a_thousand_executions_move_across_renames_and_removals(adapter: Adapter) -> None:
    executions = Executions(Storage(adapter))
    for i in range(MANY):
        events, _ = GROUPS[i % 4]
        await at(executions, f"order-{i:04}", *events)
    for i in range(5):  # finished ones hold nothing and are not visited
        await at(executions, f"finished-{i}", "pay", "ship", "deliver")

    summary = await executions.migrate_all(PLAN.source_hash, PLAN, batch=50)

    expected_moved = tuple(f"order-{i:04}" for i in range(MANY) if i % 4 != 3)
    expected_parked = {f"order-{i:04}": HELD for i in range(MANY) if i % 4 == 3}
    assert summary == MigrationSummary(expected_moved, expected_parked, {}, {})
    assert len(summary.migrated) == 750
    assert len(summary.parked) == 250
    counts = await executions.executions_on(V2.identity.content_hash)
    assert counts == {"executions_active": 750}
    counts = await executions.executions_on(V1.identity.content_hash)
    assert counts == {"executions_needs_migration": 250, "executions_completed": 5}

    storage = executions.storage
    for i in range(MANY):
        execution_id = f"order-{i:04}"
        record = await storage.fetch_execution(execution_id)
        events, leaf = GROUPS[i % 4]
        log = await executions.inputs(execution_id)
        assert [entry.via for entry in log] == ["step"] * len(events) + ["migrate"]
        migration = log[-1].migration
        assert migration is not None
        assert (migration.source_hash, migration.target_hash) == (
            PLAN.source_hash,
            PLAN.target_hash,
        )
        if leaf is None:
            assert record.status is Status.NEEDS_MIGRATION
            assert migration.reason == HELD
            continue
        assert migration.reason is None
        # paid was entered on the way to shipped too: its id changed in both positions.
        assert migration.renamed == ({} if leaf == "placed" else {"paid": "charged"})
        state = storage.load(record, V2)  # the stored position resumes on the new chart
        assert state.leaf_configuration() == (leaf,)
        assert state.datamodel["n"] == (0 if leaf == "placed" else 1)
        assert state.datamodel["carrier"] == "post"

    # Stepping on the new chart works from each position, to the end.
    for i in range(MANY):
        if i % 4 == 3:
            continue
        execution_id = f"order-{i:04}"
        _, leaf = GROUPS[i % 4]
        path = {"placed": ("pay", "ship", "deliver"), "charged": ("ship", "deliver")}
        for name in path.get(str(leaf), ("deliver",)):
            answer = await executions.step(execution_id, None, Event(name))
            assert isinstance(answer, Stepped), (execution_id, name)
        record = await storage.fetch_execution(execution_id)
        assert record.status is Status.COMPLETED

    # Running it again finds only the parked ones, which still cannot move.
    again = await executions.migrate_all(PLAN.source_hash, PLAN, batch=50)
    assert again.migrated == ()
    assert again.parked == expected_parked


@pytest.mark.asyncio
async def test_a_migration_racing_steps_loses_neither(adapter: Adapter) -> None:
    """Each execution takes a step and a migration at once, many times: whichever the
    lock lets in first, both happen, once each, and the position reflects both."""
    executions = Executions(Storage(adapter))
    for i in range(40):
        await at(executions, f"race-{i}")
    async with beside(adapter, executions) as other:
        for i in range(40):
            execution_id = f"race-{i}"
            pay = executions.step(execution_id, None, Event("pay"))
            move = other.migrate(execution_id, PLAN)
            if i % 2:
                stepped, moved = await asyncio.gather(pay, move)
            else:
                moved, stepped = await asyncio.gather(move, pay)
            assert isinstance(stepped, Stepped)
            assert isinstance(moved, Migrated)
            record = await executions.storage.fetch_execution(execution_id)
            assert record.content_hash == V2.identity.content_hash
            state = executions.storage.load(record, V2)
            assert state.leaf_configuration() == ("charged",)
            assert state.datamodel["n"] == 1
            vias = [entry.via for entry in await executions.inputs(execution_id)]
            assert sorted(vias) == ["migrate", "step"]
            # The step that ran first stepped the old chart; after, the new one.
            on = stepped.execution.content_hash
            assert on == (V1 if vias[0] == "step" else V2).identity.content_hash


COUNTER_V1 = compile_chart(
    f'<scxml {NS} initial="counting"><datamodel><data id="seen" expr="[]"/></datamodel>'
    '<state id="counting"><transition event="n">'
    '<assign location="seen" expr="concat(seen, [_event.data.n])"/></transition></state>'
    "</scxml>"
)
COUNTER_V2 = compile_chart(
    f'<scxml {NS} initial="tallying"><datamodel><data id="seen" expr="[]"/></datamodel>'
    '<state id="tallying"><transition event="n">'
    '<assign location="seen" expr="concat(seen, [_event.data.n])"/></transition></state>'
    "</scxml>"
)


@pytest.mark.asyncio
async def test_a_migration_lands_between_concurrent_steps(adapter: Adapter) -> None:
    """Four tasks step one execution while a migration (through a second connection
    pool on SQL) moves it: every event is logged and seen once, in one order, and
    the migration sits between two of them."""
    executions = Executions(Storage(adapter))
    plan = MigrationPlan(COUNTER_V1, COUNTER_V2, state_map={"counting": "tallying"})
    await executions.create("counter", COUNTER_V1)
    charts: list[str] = []
    ten_steps = asyncio.Event()

    async def task(index: int) -> None:
        for k in range(15):
            answer = await executions.step("counter", None, Event("n", data={"n": index * 100 + k}))
            assert isinstance(answer, Stepped)
            charts.append(answer.execution.content_hash)
            if len(charts) >= 10:
                ten_steps.set()
            await asyncio.sleep(0.002)

    async def migrator(other: Executions) -> Migrated | Parked | Discarded:
        await ten_steps.wait()
        return await other.migrate("counter", plan)

    async with beside(adapter, executions) as other:
        *_, moved = await asyncio.gather(*(task(i) for i in range(4)), migrator(other))
    assert isinstance(moved, Migrated)
    log = await executions.inputs("counter")
    vias = [entry.via for entry in log]
    assert vias.count("migrate") == 1
    at_ = vias.index("migrate")
    assert 10 <= at_ < len(log) - 1  # after ten steps, before the last
    logged = [_number(entry.event.data) for entry in log if entry.event is not None]
    assert sorted(logged) == sorted(i * 100 + k for i in range(4) for k in range(15))
    record = await executions.storage.fetch_execution("counter")
    state = executions.storage.load(record, COUNTER_V2)
    assert state.datamodel["seen"] == logged  # in the order logged, none twice
    assert state.leaf_configuration() == ("tallying",)
    # The steps before the migration ran on the old chart, the ones after on the new.
    assert charts.count(plan.source_hash) == at_
    assert charts.count(plan.target_hash) == len(logged) - at_


def _number(data: object) -> int:
    assert isinstance(data, dict)
    number = data["n"]
    assert isinstance(number, int)
    return number


PARENT_V1 = compile_chart(
    f'<scxml {NS} initial="a">'
    '<state id="a"><invoke id="sub" type="scxml" src="child-v1"/>'
    '<transition event="done.invoke.sub" target="b"/></state>'
    '<final id="b"/></scxml>'
)
PARENT_V2 = compile_chart(
    f'<scxml {NS} initial="waiting">'
    '<state id="waiting"><invoke id="sub" type="scxml" src="child-v2"/>'
    '<transition event="done.invoke.sub" target="b"/></state>'
    '<final id="b"/></scxml>'
)
CHILDREN = {
    "child-v1": (
        f'<scxml {NS} initial="w"><state id="w"><invoke id="leaf" type="scxml" src="leaf"/>'
        '<transition event="go" target="done"/></state><final id="done"/></scxml>'
    ),
    "child-v2": (
        f'<scxml {NS} initial="working"><state id="working">'
        '<invoke id="leaf" type="scxml" src="leaf"/>'
        '<transition event="go" target="done"/></state><final id="done"/></scxml>'
    ),
    "leaf": f'<scxml {NS} initial="idle"><state id="idle"/></scxml>',
}


def load_child(src: str) -> str:
    return CHILDREN[src]


@pytest.mark.asyncio
async def test_a_tree_moves_a_parent_with_its_durable_children(adapter: Adapter) -> None:
    storage = Storage(adapter, loader=load_child)
    driver = Driver(storage)
    await driver.create("p", PARENT_V1)
    child = await storage.fetch_execution("p/sub")
    grandchild = await storage.fetch_execution("p/sub/leaf")
    assert child.status is grandchild.status is Status.ACTIVE
    child_v1 = await storage.machine(child.content_hash)
    child_v2 = compile_chart(CHILDREN["child-v2"])
    plan = MigrationPlan(PARENT_V1, PARENT_V2, state_map={"a": "waiting"})
    child_plan = MigrationPlan(child_v1, child_v2, state_map={"w": "working"})
    executions = driver.executions

    summary = await executions.migrate_tree("p", plan, {child_plan.source_hash: child_plan})
    assert summary.migrated == ("p", "p/sub")
    assert summary.unchanged == {"p/sub/leaf": "no plan for its chart"}
    assert (summary.parked, summary.failed) == ({}, {})
    parent = await storage.fetch_execution("p")
    moved_child = await storage.fetch_execution("p/sub")
    assert parent.content_hash == PARENT_V2.identity.content_hash
    assert moved_child.content_hash == child_v2.identity.content_hash
    assert storage.load(moved_child, child_v2).leaf_configuration() == ("working",)
    # The live invocation ids are carried, so the child still answers its parent.
    assert list(storage.load(parent, PARENT_V2).invocations.values()) == ["sub"]
    assert (await storage.fetch_execution("p/sub/leaf")).content_hash == grandchild.content_hash

    # Running it again changes nothing and says so.
    again = await executions.migrate_tree("p", plan, {child_plan.source_hash: child_plan})
    assert again.migrated == ()
    assert set(again.unchanged) == {"p", "p/sub", "p/sub/leaf"}

    # The moved child finishes and answers the moved parent.
    finished = await driver.send_event("p/sub", Event("go"))
    assert isinstance(finished, Stepped)
    assert (await storage.fetch_execution("p")).status is Status.COMPLETED


@pytest.mark.asyncio
async def test_a_parked_parent_leaves_its_children_alone(adapter: Adapter) -> None:
    storage = Storage(adapter, loader=load_child)
    driver = Driver(storage)
    await driver.create("p", PARENT_V1)
    child = await storage.fetch_execution("p/sub")
    child_v1 = await storage.machine(child.content_hash)
    child_plan = MigrationPlan(
        child_v1, compile_chart(CHILDREN["child-v2"]), state_map={"w": "working"}
    )
    no_map = MigrationPlan(PARENT_V1, PARENT_V2)  # "a" is gone and not mapped
    summary = await driver.executions.migrate_tree(
        "p", no_map, {child_plan.source_hash: child_plan}
    )
    assert summary.parked == {
        "p": "active state 'a' is not in the new chart and the plan maps it nowhere"
    }
    assert summary.migrated == ()
    assert (await storage.fetch_execution("p/sub")).content_hash == child.content_hash
    with pytest.raises(InvalidMigrationPlan, match="filed under"):
        await driver.executions.migrate_tree("p", no_map, {"sha256:other": child_plan})


@pytest.mark.asyncio
async def test_a_refused_execution_is_reported_failed_and_the_others_go_on(
    adapter: Adapter,
) -> None:
    executions = Executions(Storage(adapter))
    for i in range(6):
        await at(executions, f"f-{i}", "pay")
    damaged = await executions.storage.fetch_execution("f-2")
    await adapter.update_execution(replace(damaged, position=b"not a position"))
    summary = await executions.migrate_all(PLAN.source_hash, PLAN, batch=4)
    assert summary.migrated == ("f-0", "f-1", "f-3", "f-4", "f-5")
    assert list(summary.failed) == ["f-2"]
    assert "not a position" in summary.failed["f-2"]
    record = await executions.storage.fetch_execution("f-2")
    assert (record.content_hash, record.status) == (PLAN.source_hash, Status.ACTIVE)


@pytest.mark.asyncio
async def test_a_lock_held_past_the_wait_is_reported_failed_and_retried_later() -> None:
    adapter = MemoryAdapter()
    executions = Executions(Storage(adapter), lock_wait=0.05)
    for i in range(3):
        await at(executions, f"l-{i}")
    held = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with adapter.exclusive("l-1", None):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    summary = await executions.migrate_all(PLAN.source_hash, PLAN)
    release.set()
    await holder
    assert summary.migrated == ("l-0", "l-2")
    assert list(summary.failed) == ["l-1"]
    assert "stayed locked" in summary.failed["l-1"]
    again = await executions.migrate_all(PLAN.source_hash, PLAN)
    assert (again.migrated, again.failed) == (("l-1",), {})


class LockOnly(MemoryAdapter):
    """Keeps neither metadata nor an input log."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(lock=True)


@pytest.mark.asyncio
async def test_an_adapter_without_a_log_or_metadata_migrates_but_walks_no_tree() -> None:
    executions = Executions(Storage(LockOnly()))
    await at(executions, "plain", "pay")
    moved = await executions.migrate("plain", PLAN)
    assert isinstance(moved, Migrated)
    assert moved.state.leaf_configuration() == ("charged",)
    assert await executions.inputs("plain") == []
    with pytest.raises(MetadataUnsupported):
        await executions.migrate_tree("plain", PLAN)
