"""The migration dry run (``statifier.migration_dry_run`` and ``statifier replay
--migrate``) on SQLite and PostgreSQL: what it predicts for each execution is what a
real ``migrate_all`` then does on the same store, and what it says the revision does
after a migration at input K is what a fresh store does when it migrates there."""

from __future__ import annotations

import asyncio
import io
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import drop_schema, unique_name

from statifier import cli
from statifier.chart import Machine, compile_chart
from statifier.chart.validation import SYSTEM_VARIABLES
from statifier.core import Event, MachineState
from statifier.migration_dry_run import (
    Outcome,
    continue_log,
    migration_dry_run,
)
from statifier.persistence import (
    Discarded,
    Executions,
    InvalidMigrationPlan,
    LoggedInput,
    MemoryAdapter,
    Migrated,
    MigrationPlan,
    Parked,
    Status,
    Stepped,
    Storage,
)
from statifier.persistence.executor import ignore_effects
from statifier.persistence.sql import SqlAdapter
from statifier.shadow import Selection, Verdict, open_read_only
from statifier.sql import TableOptions, Tables, migrations

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
<datamodel><data id="total" expr="0"/></datamodel>
<state id="cart">
  <transition event="add"><assign location="total" expr="total + _event.data"/></transition>
  <transition event="checkout" target="paying"/>
</state>
<state id="paying">
  <transition event="paid" target="done"/>
  <transition event="cancel" target="cart"/>
</state>
<final id="done"/>
</scxml>
"""

# Revisions: a state renamed; a state removed (checkout pays at once); a variable
# added; adds capped at 10 (the same states, another datamodel after a big add).
RENAMED = ORDER.replace('"paying"', '"payment"')
REMOVED = ORDER.replace(
    """<state id="paying">
  <transition event="paid" target="done"/>
  <transition event="cancel" target="cart"/>
</state>""",
    "",
).replace('event="checkout" target="paying"', 'event="checkout" target="done"')
ADDED = ORDER.replace('<data id="total" expr="0"/>', '<data id="total" expr="0"/><data id="fee"/>')
CAPPED = ORDER.replace(
    '<transition event="add">',
    '<transition event="add" cond="_event.data &gt; 10">'
    '<assign location="total" expr="total + 10"/></transition><transition event="add">',
)

PLANS: dict[str, tuple[str, dict[str, str | None], dict[str, object]]] = {
    "renamed": (RENAMED, {"paying": "payment"}, {}),
    "renamed-unmapped": (RENAMED, {}, {}),
    "removed": (REMOVED, {"paying": None}, {}),
    "added-no-data": (ADDED, {}, {}),
    "added": (ADDED, {}, {"fee": 2}),
    "capped": (CAPPED, {}, {}),
}


def order(source: str = ORDER) -> Machine:
    return compile_chart(source, name="order")


def script(rng: random.Random) -> tuple[list[Event], str]:
    """One execution's events and what happens to it after them (``step``: nothing,
    ``park`` or ``cancel``)."""
    events = [Event("add", data=rng.choice((1, 5, 30))) for _ in range(rng.randint(0, 3))]
    if rng.random() < 0.7:
        events.append(Event("checkout"))
        ending = rng.random()
        if ending < 0.35:
            events.append(Event("paid"))
        elif ending < 0.55:
            events += [Event("cancel"), Event("add", data=50)]
    after = rng.choice(("step", "step", "step", "park", "cancel"))
    return events, after


@dataclass
class Place:
    url: str
    tables: TableOptions


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "sqlite":
        here = Place(f"sqlite:///{tmp_path / 'dry.db'}", TableOptions(prefix="m_"))
        migrations.upgrade(here.url, here.tables)
        yield here
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_dryrun_")
    here = Place(url, TableOptions(prefix="m_", schema=schema))
    migrations.upgrade(here.url, here.tables)
    try:
        yield here
    finally:
        drop_schema(url, schema)


async def record(place: Place, count: int, seed: int = 3) -> dict[str, list[Event]]:
    """``count`` executions of ORDER; returns their events by id."""
    rng = random.Random(seed)
    scripts: dict[str, list[Event]] = {}
    machine = order()
    async with SqlAdapter(place.url, place.tables) as adapter:
        lifecycle = Executions(Storage(adapter), executor=ignore_effects)
        for number in range(count):
            execution_id = f"ex-{number:03d}"
            events, after = script(rng)
            scripts[execution_id] = events
            await lifecycle.create(execution_id, machine)
            for event in events:
                await lifecycle.step(execution_id, machine, event)
            if after == "park":
                await lifecycle.park(execution_id)
            elif after == "cancel":
                await lifecycle.cancel(execution_id)
    return scripts


def contents(place: Place) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, sorted: what a write would change."""
    defined = Tables.define(prefix=place.tables.prefix, schema=place.tables.schema)
    engine = sa.create_engine(migrations.sync_url(place.url))
    try:
        with engine.connect() as connection:
            return {
                table.name: sorted(map(tuple, connection.execute(sa.select(table))), key=repr)
                for table in defined.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def shown(datamodel: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in datamodel.items() if k not in SYSTEM_VARIABLES}


# What migrate_all then does.


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_prediction_is_what_migrate_all_then_does(place: Place, name: str) -> None:
    source, state_map, data = PLANS[name]
    revision = order(source)

    async def main() -> None:
        await record(place, 30, seed=len(name))
        before = contents(place)
        predicted = await migration_dry_run(
            place.url, revision, tables=place.tables, state_map=state_map, data=data
        )
        assert contents(place) == before  # nothing written
        assert len(predicted.results) == 30
        plan = MigrationPlan(order(), revision, state_map=state_map, data=data)
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter), executor=ignore_effects)
            before_records = {r.id: r for r in await lifecycle.storage.list_executions()}
            done = await lifecycle.migrate_all(plan.source_hash, plan)
            after = {r.id: r for r in await lifecycle.storage.list_executions()}
            positions = {
                r.id: lifecycle.storage.load(r, revision)
                for r in after.values()
                if r.content_hash == plan.target_hash
            }
        by_outcome = predicted.migration_summary()
        assert done.migrated == by_outcome.migrated
        assert dict(done.parked) == dict(by_outcome.parked)
        assert dict(done.failed) == dict(by_outcome.failed) == {}
        assert not done.unchanged
        for result in predicted.results:
            was, now = before_records[result.execution_id], after[result.execution_id]
            if result.outcome is Outcome.MOVED:
                position = positions[result.execution_id]
                assert result.configuration == position.leaf_configuration()
                assert dict(result.datamodel) == shown(position.datamodel)
                assert now.status is Status.ACTIVE
            elif result.outcome is Outcome.PARKED:
                assert now.status is Status.NEEDS_MIGRATION
                assert now.failure == result.reason
            else:
                assert result.outcome is Outcome.UNCHANGED
                assert result.reason == f"it is {was.status.value}"
                assert (now.status, now.content_hash) == (was.status, was.content_hash)
        # What moved is now on the revision: a second dry run leaves it unchanged.
        again = await migration_dry_run(
            place.url, revision, Selection(document="order"), tables=place.tables
        )
        for result in again.results:
            if result.execution_id in done.migrated:
                assert result.outcome is Outcome.UNCHANGED
                assert result.reason == "already on the new chart"

    asyncio.run(main())


def test_moved_parked_with_the_reason_and_unchanged(place: Place) -> None:
    async def main() -> None:
        machine = order()
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter), executor=ignore_effects)
            for execution_id, events in (
                ("in-cart", [Event("add", data=4)]),
                ("paying", [Event("checkout")]),
                ("paid", [Event("checkout"), Event("paid")]),
            ):
                await lifecycle.create(execution_id, machine)
                for event in events:
                    await lifecycle.step(execution_id, machine, event)
        summary = await migration_dry_run(
            place.url, order(REMOVED), tables=place.tables, state_map={"paying": None}
        )
        got = {r.execution_id: r for r in summary.results}
        assert got["in-cart"].outcome is Outcome.MOVED
        assert got["in-cart"].configuration == ("cart",)
        assert dict(got["in-cart"].datamodel) == {"total": 4}
        assert got["paying"].outcome is Outcome.PARKED
        assert got["paying"].reason == (
            "active state 'paying' is not in the new chart and the plan maps it nowhere"
        )
        assert (got["paid"].outcome, got["paid"].reason) == (Outcome.UNCHANGED, "it is completed")
        assert summary.counts == {
            Outcome.MOVED: 1,
            Outcome.PARKED: 1,
            Outcome.UNCHANGED: 1,
            Outcome.FAILED: 0,
        }
        assert not summary.clean
        assert all(r.continuation is None for r in summary.results)
        # A map naming a state the stored chart lacks: the plan does not fit it, as
        # migrate_all refuses it, but an ended execution is never read for it.
        wrong = await migration_dry_run(
            place.url, order(REMOVED), tables=place.tables, state_map={"nowhere": None}
        )
        got = {r.execution_id: r for r in wrong.results}
        fits = "the plan does not fit its chart: the old chart has no states with the ids"
        for execution_id in ("in-cart", "paying"):
            assert got[execution_id].outcome is Outcome.FAILED
            assert (got[execution_id].reason or "").startswith(fits)
        assert (got["paid"].outcome, got["paid"].reason) == (Outcome.UNCHANGED, "it is completed")
        with pytest.raises(InvalidMigrationPlan, match="no states with the ids"):
            MigrationPlan(order(), order(REMOVED), state_map={"nowhere": None})
        # Its continuation needs the plan.
        wrong = await migration_dry_run(
            place.url, order(REMOVED), tables=place.tables, state_map={"nowhere": None}, at=1
        )
        paid = next(r for r in wrong.results if r.execution_id == "paid")
        assert paid.outcome is Outcome.UNCHANGED
        assert paid.continuation is not None
        assert paid.continuation.outcome is Outcome.FAILED
        assert (paid.continuation.reason or "").startswith(fits)

    asyncio.run(main())


# After input K.


async def _reference(
    plan: MigrationPlan, events: Sequence[Event], at: int
) -> tuple[str, int | None, bool | None]:
    """A fresh store in memory: one execution runs every event on the old chart;
    another migrates after ``at`` of them and takes the rest on the revision. Returns
    what the migration did there and, when it moved, the first input after which the
    two differ (by the plan's names; the variables the revision adds left out) and
    whether they end alike."""
    lifecycle = Executions(Storage(MemoryAdapter()), executor=ignore_effects)
    await lifecycle.create("old", plan.source)
    await lifecycle.create("new", plan.source)
    for event in events[:at]:
        for execution_id in ("old", "new"):
            await lifecycle.step(execution_id, None, event)
    moved = await lifecycle.migrate("new", plan)
    if isinstance(moved, Parked):
        return "parked", None, None
    if isinstance(moved, Discarded):  # the chart had ended
        return "unchanged", None, None
    assert isinstance(moved, Migrated)
    added = {e.id for e in plan.target.data} - {e.id for e in plan.source.data}

    def seen(state: MachineState, renamed: bool) -> tuple[object, ...]:
        leaves, final = state.leaf_configuration(), state.final_state()
        if renamed:
            leaves = tuple(sorted(plan.new_id(s) or s for s in leaves))
            final = None if final is None else (plan.new_id(final) or final)
        data = {k: v for k, v in shown(state.datamodel).items() if k not in added}
        return leaves, final, data

    storage = lifecycle.storage
    old_state = storage.load(await storage.fetch_execution("old"), plan.source)
    new_state = moved.state
    first: int | None = None
    for index, event in enumerate(events[at:], start=at + 1):
        stepped = await lifecycle.step("old", None, event)
        if isinstance(stepped, Stepped):
            old_state = stepped.state
        stepped = await lifecycle.step("new", None, event)
        if isinstance(stepped, Stepped):
            new_state = stepped.state
        if first is None and seen(old_state, True) != seen(new_state, False):
            first = index
    same_final = seen(old_state, True)[:2] == seen(new_state, False)[:2]
    return "moved", first, same_final


@pytest.mark.parametrize("name", ["renamed", "removed", "added", "capped"])
def test_after_input_k_is_what_a_fresh_store_does(place: Place, name: str) -> None:
    source, state_map, data = PLANS[name]
    revision = order(source)
    plan = MigrationPlan(order(), revision, state_map=state_map, data=data)

    async def main() -> None:
        scripts = await record(place, 16, seed=11)
        for at in (0, 1, 2, 4):
            before = contents(place)
            summary = await migration_dry_run(
                place.url, revision, tables=place.tables, state_map=state_map, data=data, at=at
            )
            assert contents(place) == before
            assert summary.at == at
            for result in summary.results:
                after = result.continuation
                assert after is not None
                events = scripts[result.execution_id]
                assert after.at == min(at, len(events))
                kind, first, same_final = await _reference(plan, events, at)
                assert after.outcome is Outcome(kind), result.execution_id
                if kind != "moved":
                    assert after.replay is None
                    continue
                replay = after.replay
                assert replay is not None
                assert replay.untrusted is None, replay
                found = None if replay.divergence is None else replay.divergence.index
                assert found == first, (result.execution_id, at)
                assert replay.same_final is same_final
                assert replay.inputs == len(events)

    asyncio.run(main())


def test_a_moved_one_whose_continuation_diverges(place: Place) -> None:
    async def main() -> None:
        machine = order()
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter), executor=ignore_effects)
            await lifecycle.create("big", machine)
            for amount in (3, 40, 2):
                await lifecycle.step("big", machine, Event("add", data=amount))
        summary = await migration_dry_run(place.url, order(CAPPED), tables=place.tables, at=1)
        (result,) = summary.results
        assert result.outcome is Outcome.MOVED
        assert dict(result.datamodel) == {"total": 45}
        after = result.continuation
        assert after is not None
        assert after.replay is not None
        assert after.outcome is Outcome.MOVED
        assert after.verdict is Verdict.DIVERGED
        divergence = after.replay.divergence
        assert divergence is not None
        assert (divergence.index, divergence.event, divergence.parts) == (2, "add", ("datamodel",))
        assert dict(divergence.old.datamodel) == {"total": 43}
        assert dict(divergence.new.datamodel) == {"total": 13}
        assert after.replay.same_final is True
        assert not summary.clean
        # Migrated after the last input: nothing is left to differ.
        late = await migration_dry_run(place.url, order(CAPPED), tables=place.tables, at=99)
        assert late.results[0].continuation is not None
        assert late.results[0].continuation.at == 3
        assert late.results[0].continuation.verdict is Verdict.SAME
        assert late.clean
        document = json.loads(json.dumps(summary.as_json()))
        assert document["results"][0]["continuation"]["replay"]["verdict"] == "diverged"

    asyncio.run(main())


def test_a_read_only_connection_is_enough(place: Place) -> None:
    async def main() -> None:
        await record(place, 8)
        before = contents(place)
        async with open_read_only(place.url, tables=place.tables) as adapter:
            summary = await migration_dry_run(
                adapter, order(RENAMED), state_map={"paying": "payment"}, at=1
            )
        assert len(summary.results) == 8
        assert contents(place) == before

    asyncio.run(main())


def test_an_execution_that_migrated_before_is_untrusted_after_k() -> None:
    async def main() -> None:
        storage = Storage(MemoryAdapter())
        lifecycle = Executions(storage, executor=ignore_effects)
        await lifecycle.create("x", order())
        await lifecycle.step("x", None, Event("add", data=1))
        first = MigrationPlan(order(), order(ADDED), data={"fee": 0})
        assert isinstance(await lifecycle.migrate("x", first), Migrated)
        await lifecycle.step("x", None, Event("checkout"))
        summary = await migration_dry_run(
            storage, order(RENAMED), state_map={"paying": "payment"}, at=3
        )
        (result,) = summary.results
        assert result.outcome is Outcome.MOVED  # now: it moves from ADDED
        assert result.configuration == ("payment",)
        after = result.continuation
        assert after is not None
        assert after.outcome is None
        assert after.replay is not None
        assert after.replay.verdict is Verdict.UNTRUSTED
        assert "moved between revisions" in (after.replay.untrusted or "")

    asyncio.run(main())


EVENTS = st.sampled_from(
    [Event("add", data=amount) for amount in (1, 30)]
    + [Event(name) for name in ("checkout", "paid", "cancel")]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(EVENTS, max_size=10), st.integers(0, 12))
def test_a_rename_alone_never_diverges(events: list[Event], at: int) -> None:
    from datetime import UTC, datetime

    moment = datetime(2026, 1, 1, tzinfo=UTC)
    log = [LoggedInput(seq, "step", event, moment) for seq, event in enumerate(events, 1)]
    plan = MigrationPlan(order(), order(RENAMED), state_map={"paying": "payment"})
    after = continue_log(plan, log, at)
    assert after.at == min(at, len(events))
    if after.outcome is Outcome.UNCHANGED:
        assert after.reason == "the chart had ended"
        return
    assert after.replay is not None
    assert after.replay.divergence is None
    assert after.replay.verdict in (Verdict.SAME, Verdict.UNTRUSTED)
    if after.replay.verdict is Verdict.UNTRUSTED:
        assert "after the stored chart stopped" in (after.replay.untrusted or "")


def test_bad_arguments_are_refused() -> None:
    plan = MigrationPlan(order(), order(RENAMED), state_map={"paying": "payment"})
    with pytest.raises(ValueError, match="an input's index"):
        continue_log(plan, [], -1)
    with pytest.raises(ValueError, match="a count of inputs"):
        continue_log(plan, [], 0, max_inputs=-1)
    with pytest.raises(ValueError, match="an input's index"):
        asyncio.run(migration_dry_run(Storage(MemoryAdapter()), order(), at=-2))


# The command.


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(["replay", *argv], out), out.getvalue()


def test_the_command(place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scripts = asyncio.run(record(place, 12))
    options = ["--database", place.url, "--prefix", place.tables.prefix]
    if place.tables.schema is not None:
        options += ["--schema", place.tables.schema]
    chart = tmp_path / "order.scxml"
    chart.write_text(REMOVED, encoding="utf-8")
    before = contents(place)
    status, text = run_cli("--chart", str(chart), "--migrate", "--remove", "paying", *options)
    assert contents(place) == before
    status_json, text_json = run_cli(
        "--chart", str(chart), "--migrate", "--remove", "paying", "--json", *options
    )
    document = json.loads(text_json)
    counts = document["counts"]
    assert sum(counts.values()) == 12
    assert status == status_json == (1 if counts["parked"] or counts["failed"] else 0)
    lines = text.splitlines()
    assert lines[-1] == (
        f"12 executions on {document['revision']}: {counts['moved']} moved, "
        f"{counts['parked']} parked, {counts['unchanged']} unchanged, {counts['failed']} failed"
    )
    parked = [r for r in document["results"] if r["outcome"] == "parked"]
    for result in parked:
        assert f"{result['execution_id']}: parked: {result['reason']}" in lines
    moved = [r for r in document["results"] if r["outcome"] == "moved"]
    for result in moved:
        where = " ".join(result["configuration"])
        assert f"{result['execution_id']}: moved, in {where}" in lines
    # After input 1, with the revision capping adds.
    capped = tmp_path / "capped.scxml"
    capped.write_text(CAPPED, encoding="utf-8")
    status, text = run_cli(
        "--chart", str(capped), "--document", "order", "--migrate", "--from-index", "1", *options
    )
    big = sorted(
        i
        for i, events in scripts.items()
        if any(e.name == "add" and isinstance(e.data, int) and e.data > 10 for e in events[1:])
    )
    summary = text.splitlines()[-1]
    assert "; after input 1:" in summary
    assert big  # the seed records some
    assert status == 1
    assert any(
        line.startswith(f"{big[0]}: ") and "after input 1: diverged at input" in line
        for line in text.splitlines()
    )
    capsys.readouterr()
    assert run_cli("--chart", str(chart), "--migrate", "--map", "paying", *options)[0] == 2
    assert "--map takes KEY=VALUE" in capsys.readouterr().err
    assert run_cli("--chart", str(chart), "--migrate", "--data", "[1]", *options)[0] == 2
    assert "--data is a JSON object" in capsys.readouterr().err
    assert run_cli("--chart", str(chart), "--from-index", "1", *options)[0] == 2
    assert "--from-index need --migrate" in capsys.readouterr().err
    assert run_cli("--chart", str(chart), "--migrate", "--from-index", "-1", *options)[0] == 2
    assert "--from-index is" in capsys.readouterr().err
