"""Shadow replay (``statifier.shadow`` and ``statifier replay``) on SQLite and
PostgreSQL: executions recorded through ``Executions``, their logs replayed on
revisions of their chart, every verdict checked against the same logs run through a
fresh durable store on each chart."""

from __future__ import annotations

import asyncio
import io
import json
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import drop_schema, unique_name

from statifier import cli, shadow
from statifier.buckets import address_bucket
from statifier.chart import Machine, compile_chart
from statifier.console.replay import shown_datamodel
from statifier.core import Event, handle_event, positions
from statifier.core import effects as fx
from statifier.expr import Function
from statifier.persistence import (
    PLAIN,
    ExecutionRecord,
    Executions,
    LoggedInput,
    MemoryAdapter,
    Status,
    Stepped,
    Storage,
)
from statifier.persistence.executor import ignore_effects
from statifier.persistence.sql import SqlAdapter
from statifier.shadow import (
    MAX_INPUTS,
    Selection,
    ShadowResult,
    Verdict,
    compare_logs,
    open_read_only,
    shadow_replay,
)
from statifier.sql import TableOptions, Tables, migrations

CART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
<datamodel><data id="total" expr="0"/><data id="items" expr="0"/></datamodel>
<state id="cart">
  <transition event="add" cond="_event.data.amount &gt; 100" target="review">
    <assign location="total" expr="total + _event.data.amount"/>
  </transition>
  <transition event="add">
    <assign location="total" expr="total + _event.data.amount"/>
    <assign location="items" expr="items + 1"/>
  </transition>
  <transition event="checkout" target="paying"/>
</state>
<state id="review"><transition event="approve" target="cart"/></state>
<state id="paying">
  <transition event="paid" target="done"/>
  <transition event="cancel" target="cart"/>
</state>
<final id="done"/>
</scxml>
"""

# (b) a state renamed, (c) a guard moved, (d) a timer added, (e) an expression that
# raises (an assign: the data parts too) and one that raises without changing anything.
RENAMED = CART.replace('"paying"', '"payment"')
GUARD = CART.replace("&gt; 100", "&gt; 50")
TIMER = CART.replace(
    '<state id="paying">',
    '<state id="paying"><onentry><send id="expire" event="expire" delay="1h"/></onentry>',
)
RAISES = CART.replace(
    '<transition event="checkout" target="paying"/>',
    '<transition event="checkout" target="paying"><log expr="nothing.there"/></transition>',
)

AMOUNTS = (5, 20, 60, 80, 150)
"""Amounts that cross the guard of GUARD (60, 80) and of CART (150), or neither."""


def script(rng: random.Random) -> list[tuple[str, dict[str, int] | None]]:
    """One execution's inputs: some adds, an approval after a review, a checkout, and
    a payment or a cancel, sometimes cut short."""
    events: list[tuple[str, dict[str, int] | None]] = []
    for _ in range(rng.randint(0, 4)):
        amount = rng.choice(AMOUNTS)
        events.append(("add", {"amount": amount}))
        if amount > 100:
            events.append(("approve", None))
    if rng.random() < 0.8:
        events.append(("checkout", None))
        ending = rng.random()
        if ending < 0.5:
            events.append(("paid", None))
        elif ending < 0.7:
            events.append(("cancel", None))
    return events


@dataclass
class Place:
    url: str
    tables: TableOptions


def _place(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Place]:
    if backend == "sqlite":
        place = Place(f"sqlite:///{tmp_path / 'shadow.db'}", TableOptions(prefix="s_"))
        migrations.upgrade(place.url, place.tables)
        yield place
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_shadow_")
    place = Place(url, TableOptions(prefix="s_", schema=schema))
    migrations.upgrade(place.url, place.tables)
    try:
        yield place
    finally:
        drop_schema(url, schema)


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    yield from _place(request, request.param, tmp_path)


def cart(source: str = CART) -> Machine:
    return compile_chart(source, name="cart")


async def record(place: Place, count: int, seed: int = 7) -> dict[str, list[tuple[str, object]]]:
    """``count`` executions of CART, each its own script; returns the scripts by id."""
    scripts: dict[str, list[tuple[str, object]]] = {}
    rng = random.Random(seed)
    machine = cart()
    async with SqlAdapter(place.url, place.tables) as adapter:
        lifecycle = Executions(Storage(adapter), executor=ignore_effects)
        for number in range(count):
            execution_id = f"ex-{number:04d}"
            events = script(rng)
            scripts[execution_id] = list(events)
            await lifecycle.create(execution_id, machine)
            for name, data in events:
                event = Event(name) if data is None else Event(name, data=data)
                await lifecycle.step(execution_id, machine, event)
    return scripts


# The reference: the same logs through a fresh durable store, on each chart.


@dataclass(frozen=True)
class Expected:
    index: int | None
    parts: tuple[str, ...]
    new_errors: int
    same_final: bool


def _observed(result: Stepped) -> tuple[object, ...]:
    state = result.state
    handed = tuple(
        (type(e).__name__, e.event, getattr(e, "delay_ms", None), e.data)
        if isinstance(e, fx.Send | fx.SendDelayed)
        else (type(e).__name__, e.send_id)
        for e in result.effects
        if isinstance(e, fx.Send | fx.SendDelayed | fx.Cancel)
    )
    where = (state.leaf_configuration(), state.final_state())
    return where, shown_datamodel(state), handed


async def _run_fresh(machine: Machine, log: Sequence[LoggedInput]) -> list[Stepped]:
    lifecycle = Executions(Storage(MemoryAdapter()), executor=ignore_effects)
    steps = [await lifecycle.create("ex", machine)]
    for entry in log:
        assert entry.event is not None
        stepped = await lifecycle.step("ex", None, entry.event)
        if isinstance(stepped, Stepped):
            steps.append(stepped)
        else:  # the chart stopped: the step changed nothing
            steps.append(replace_effects(steps[-1]))
    return steps


def replace_effects(result: Stepped) -> Stepped:
    return Stepped(result.execution, state=result.state, effects=())


async def expected(old: Machine, new: Machine, log: Sequence[LoggedInput]) -> Expected:
    before, after = await _run_fresh(old, log), await _run_fresh(new, log)
    index: int | None = None
    parts: tuple[str, ...] = ()
    new_errors = 0
    for number, (a, b) in enumerate(zip(before, after, strict=True)):
        seen_a, seen_b = _observed(a), _observed(b)
        if index is None and seen_a != seen_b:
            index = number
            names = ("configuration", "datamodel", "handed")
            parts = tuple(n for n, x, y in zip(names, seen_a, seen_b, strict=True) if x != y)
        keys = [(e.name, e.element, e.reason, e.message) for e in a.errors]
        for error in b.errors:
            key = (error.name, error.element, error.reason, error.message)
            if key in keys:
                keys.remove(key)
            else:
                new_errors += 1
    same = _observed(before[-1])[0] == _observed(after[-1])[0]
    return Expected(index, parts, new_errors, same)


async def logs(place: Place) -> dict[str, list[LoggedInput]]:
    async with SqlAdapter(place.url, place.tables) as adapter:
        lifecycle = Executions(Storage(adapter))
        ids = [record.id for record in await lifecycle.storage.list_executions()]
        return {execution_id: await lifecycle.inputs(execution_id) for execution_id in ids}


async def check_against_fresh_store(place: Place, revision: str) -> list[ShadowResult]:
    """Every result of a shadow replay on ``revision`` is what the fresh store says."""
    new = cart(revision)
    summary = await shadow_replay(place.url, new, tables=place.tables)
    recorded = await logs(place)
    assert sorted(result.execution_id for result in summary.results) == sorted(recorded)
    for result in summary.results:
        want = await expected(cart(), new, recorded[result.execution_id])
        assert result.untrusted is None, result
        got_index = None if result.divergence is None else result.divergence.index
        assert got_index == want.index, result.execution_id
        assert (result.divergence.parts if result.divergence else ()) == want.parts
        assert result.new_error_count == want.new_errors, result.execution_id
        assert result.same_final is want.same_final, result.execution_id
        if want.index is not None:
            assert result.verdict is Verdict.DIVERGED
        elif want.new_errors:
            assert result.verdict is Verdict.NEW_ERRORS
        else:
            assert result.verdict is Verdict.SAME
    counts = summary.counts
    assert sum(counts.values()) == len(summary.results)
    return list(summary.results)


def first_index(events: Sequence[tuple[str, object]], name: str) -> int | None:
    for index, (event, _) in enumerate(events, start=1):
        if event == name:
            return index
    return None


def test_the_same_chart_never_diverges(place: Place) -> None:
    asyncio.run(record(place, 40))
    results = asyncio.run(check_against_fresh_store(place, CART))
    assert {result.verdict for result in results} == {Verdict.SAME}


def test_a_renamed_state_diverges_at_the_checkout(place: Place) -> None:
    scripts = asyncio.run(record(place, 40))
    results = asyncio.run(check_against_fresh_store(place, RENAMED))
    for result in results:
        at = first_index(scripts[result.execution_id], "checkout")
        if at is None:
            assert result.verdict is Verdict.SAME
            continue
        assert result.divergence is not None
        assert result.divergence.index == at
        assert result.divergence.event == "checkout"
        assert result.divergence.parts == ("configuration",)
        assert result.divergence.old.configuration == ("paying",)
        assert result.divergence.new.configuration == ("payment",)
    assert any(r.verdict is Verdict.DIVERGED for r in results)
    assert any(r.verdict is Verdict.SAME for r in results)


def test_a_moved_guard_diverges_only_where_an_input_crosses_it(place: Place) -> None:
    scripts = asyncio.run(record(place, 60))
    results = asyncio.run(check_against_fresh_store(place, GUARD))
    for result in results:
        events = scripts[result.execution_id]
        crossing = [
            index
            for index, (name, data) in enumerate(events, start=1)
            if name == "add" and isinstance(data, dict) and 50 < data["amount"] <= 100
        ]
        if not crossing:
            assert result.verdict is Verdict.SAME, result
            continue
        assert result.divergence is not None
        assert result.divergence.index == crossing[0]
        assert "configuration" in result.divergence.parts
        assert result.divergence.new.configuration == ("review",)
    assert {r.verdict for r in results} == {Verdict.SAME, Verdict.DIVERGED}


def test_an_added_timer_is_a_difference_of_what_was_handed(place: Place) -> None:
    scripts = asyncio.run(record(place, 40))
    results = asyncio.run(check_against_fresh_store(place, TIMER))
    for result in results:
        at = first_index(scripts[result.execution_id], "checkout")
        if at is None:
            assert result.verdict is Verdict.SAME
            continue
        divergence = result.divergence
        assert divergence is not None
        assert divergence.index == at
        assert divergence.parts == ("handed",)
        assert divergence.old.handed == ()
        (timer,) = divergence.new.handed
        assert (timer.kind, timer.send_id, timer.event, timer.delay_ms) == (
            "delayed",
            "expire",
            "expire",
            3_600_000,
        )
        assert result.same_final is True


def test_an_expression_that_raises_is_reported(place: Place) -> None:
    scripts = asyncio.run(record(place, 40))
    results = asyncio.run(check_against_fresh_store(place, RAISES))
    for result in results:
        checkouts = sum(1 for name, _ in scripts[result.execution_id] if name == "checkout")
        if not checkouts:
            assert result.verdict is Verdict.SAME
            continue
        # The log fails, and nothing else changes: the executions never part.
        assert result.verdict is Verdict.NEW_ERRORS
        assert result.divergence is None
        assert result.new_error_count == checkouts
        error = result.new_errors[0]
        assert error.event == "checkout"
        assert (error.error.name, error.error.element) == ("error.execution", "log")


def test_two_hundred_executions_against_a_fresh_store(place: Place) -> None:
    asyncio.run(record(place, 200, seed=11))
    for revision in (GUARD, TIMER, RAISES):
        asyncio.run(check_against_fresh_store(place, revision))


class CountingPool(ProcessPoolExecutor):
    """A process pool that notes the batches handed to it."""

    handed: ClassVar[list[Sequence[str]]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        CountingPool.handed.append(args[1])
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def counting_pool(monkeypatch: pytest.MonkeyPatch) -> type[CountingPool]:
    CountingPool.handed = []
    monkeypatch.setattr(shadow, "ProcessPoolExecutor", CountingPool)
    return CountingPool


def test_a_replay_in_two_processes_gives_the_same_results_in_the_same_order(
    place: Place, counting_pool: type[CountingPool]
) -> None:
    # This process takes the first batch (500), the other process the next two
    # (75 and 65) at once; the rest go to whichever is free first.
    asyncio.run(record(place, 1_100, seed=5))
    told: list[tuple[int, int]] = []
    alone = asyncio.run(shadow_replay(place.url, cart(GUARD), tables=place.tables))
    shared = asyncio.run(
        shadow_replay(
            place.url,
            cart(GUARD),
            tables=place.tables,
            workers=2,
            progress=lambda done, total, _: told.append((done, total)),
        )
    )
    assert shared == alone
    assert told == [(n, 1_100) for n in range(1, 1_101)]
    handed = [len(batch) for batch in counting_pool.handed]
    assert handed[:2] == [75, 65]
    assert 500 not in handed


def test_a_replaying_process_opens_its_storage_once_for_all_its_batches(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a process of the pool runs, run here: its first batch opens the storage
    # and compiles the revision; the next ones reuse them.
    asyncio.run(record(place, 40, seed=8))
    revision = cart(GUARD)
    alone = asyncio.run(shadow_replay(place.url, revision, tables=place.tables))
    ids = [result.execution_id for result in alone.results]
    job = shadow._Job.of(place.url, place.tables, PLAIN, None, revision)
    monkeypatch.setattr(shadow, "_replayer", None)
    first = shadow._replay_in_process(job, ids[:25], MAX_INPUTS)
    kept = shadow._replayer
    assert kept is not None
    try:
        second = shadow._replay_in_process(job, ids[25:], MAX_INPUTS)
        assert shadow._replayer is kept
    finally:
        kept.close()
    assert first + second == list(alone.results)


def test_a_replay_of_one_batch_in_two_processes_starts_no_process(
    place: Place, counting_pool: type[CountingPool]
) -> None:
    asyncio.run(record(place, 30, seed=6))
    alone = asyncio.run(shadow_replay(place.url, cart(GUARD), tables=place.tables))
    shared = asyncio.run(shadow_replay(place.url, cart(GUARD), tables=place.tables, workers=2))
    assert shared == alone
    assert counting_pool.handed == []


def test_a_replay_in_several_processes_refuses_what_it_cannot_hand_them(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    migrations.upgrade(url, TableOptions())
    with pytest.raises(ValueError, match="workers is a whole number of at least 1, not 0"):
        asyncio.run(shadow_replay(url, cart(), workers=0))
    with pytest.raises(ValueError, match="several processes reads a database URL"):
        asyncio.run(shadow_replay(MemoryAdapter(), cart(), workers=2))
    unpicklable = {"rate": Function(lambda _args: 1, 0)}
    with pytest.raises(ValueError, match="pickles the table options, codec and functions"):
        asyncio.run(shadow_replay(url, cart(), workers=2, functions=unpicklable))


def test_an_assign_that_raises_parts_and_raises(tmp_path: Path) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    failing = CART.replace("total + _event.data.amount", "total + _event.data.amount * rate")
    log = [LoggedInput(1, "step", Event("add", data={"amount": 5}), at)]
    result = compare_logs(cart(), cart(failing), log)
    assert result.verdict is Verdict.DIVERGED
    assert result.divergence is not None
    assert result.divergence.parts == ("datamodel",)
    # The failing assign ends its block: the next one does not run either.
    assert dict(result.divergence.old.datamodel) == {"items": 1, "total": 5}
    assert dict(result.divergence.new.datamodel) == {"items": 0, "total": 0}
    assert result.new_error_count == 1


# What cannot be trusted.


def test_a_capped_log_a_missing_function_and_a_long_log_are_untrusted() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    add = LoggedInput(1, "step", Event("add", data={"amount": 5}), at)
    capped = [add, LoggedInput(2, "step", None, at)]
    result = compare_logs(cart(), cart(), capped)
    assert result.verdict is Verdict.UNTRUSTED
    assert result.untrusted == "input 2: the log was closed here at its cap"
    assert result.inputs == 1
    long = compare_logs(cart(), cart(), [add, add], max_inputs=1)
    assert long.verdict is Verdict.UNTRUSTED
    assert long.untrusted == "the log is longer than 1 inputs"
    calls = cart(CART.replace('expr="total + _event.data.amount"/>', 'expr="host_rate()"/>', 1))
    add_big = LoggedInput(1, "step", Event("add", data={"amount": 500}), at)
    missing = compare_logs(calls, cart(), [add_big])
    assert missing.verdict is Verdict.UNTRUSTED
    assert missing.untrusted is not None
    assert "host_rate()" in missing.untrusted


def test_a_divergence_before_the_log_stops_being_trustworthy_is_kept() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    log = [
        LoggedInput(1, "step", Event("add", data={"amount": 60}), at),
        LoggedInput(2, "step", None, at),
    ]
    result = compare_logs(cart(), cart(GUARD), log)
    assert result.verdict is Verdict.UNTRUSTED
    assert result.divergence is not None
    assert result.divergence.index == 1


def test_a_stored_position_the_log_does_not_reach_is_untrusted(tmp_path: Path) -> None:
    place = Place(f"sqlite:///{tmp_path / 'p.db'}", TableOptions(prefix="s_"))
    migrations.upgrade(place.url, place.tables)

    async def main() -> ShadowResult:
        async with SqlAdapter(place.url, place.tables) as adapter:
            storage = Storage(adapter)
            lifecycle = Executions(storage, executor=ignore_effects)
            await lifecycle.create("ex-1", cart())
            await lifecycle.step("ex-1", None, Event("checkout"))
            # A step stored without its input, as a log written by another version
            # might be: the replay must not call that "same".
            record = await storage.fetch_execution("ex-1")
            state = storage.load(record, cart())
            stepped, _ = handle_event(state, Event("paid"))
            await storage.update_execution(replace(record, position=positions.dump(stepped)))
        summary = await shadow_replay(place.url, cart(), tables=place.tables)
        (result,) = summary.results
        return result

    result = asyncio.run(main())
    assert result.verdict is Verdict.UNTRUSTED
    assert result.untrusted is not None
    assert "does not end where the execution is" in result.untrusted


def test_a_cancelled_execution_is_compared_after_its_cancel(tmp_path: Path) -> None:
    place = Place(f"sqlite:///{tmp_path / 'c.db'}", TableOptions(prefix="s_"))
    migrations.upgrade(place.url, place.tables)

    async def main() -> ShadowResult:
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter), executor=ignore_effects)
            await lifecycle.create("ex-1", cart())
            await lifecycle.step("ex-1", None, Event("add", data={"amount": 5}))
            await lifecycle.cancel("ex-1")
        summary = await shadow_replay(place.url, cart(), tables=place.tables)
        (result,) = summary.results
        return result

    result = asyncio.run(main())
    assert result.verdict is Verdict.SAME
    assert result.status is Status.CANCELLED


# Selecting.


def test_the_selection_filters_by_chart_status_time_sample_and_limit(tmp_path: Path) -> None:
    place = Place(f"sqlite:///{tmp_path / 'sel.db'}", TableOptions(prefix="s_"))
    migrations.upgrade(place.url, place.tables)
    start = datetime(2026, 3, 1, tzinfo=UTC)

    async def main() -> None:
        clock = iter(start + timedelta(minutes=n) for n in range(1000))
        async with SqlAdapter(place.url, place.tables) as adapter:
            storage = Storage(adapter, clock=lambda: next(clock))
            lifecycle = Executions(storage, executor=ignore_effects)
            other = compile_chart(CART + "<!-- another chart -->", name="other")
            for number in range(10):
                machine = other if number % 5 == 4 else cart()
                await lifecycle.create(f"ex-{number}", machine)
                if number % 2:
                    await lifecycle.step(f"ex-{number}", None, Event("checkout"))
                    await lifecycle.step(f"ex-{number}", None, Event("paid"))

        async def ids(selection: Selection) -> list[str]:
            summary = await shadow_replay(place.url, cart(), selection, tables=place.tables)
            return [result.execution_id for result in summary.results]

        everyone = ["ex-0", "ex-1", "ex-2", "ex-3", "ex-5", "ex-6", "ex-7", "ex-8"]
        assert await ids(Selection()) == everyone
        assert await ids(Selection(document="other")) == ["ex-4", "ex-9"]
        assert await ids(Selection(status=Status.COMPLETED)) == ["ex-1", "ex-3", "ex-5", "ex-7"]
        # ex-0 was created at the first tick, each later one three ticks after it
        # (or one, after an execution with no steps).
        created = {}
        async with SqlAdapter(place.url, place.tables) as adapter:
            for record in await Storage(adapter).list_executions():
                created[record.id] = record.created_at
        after, before = created["ex-2"], created["ex-6"]
        window = Selection(created_after=after, created_before=before)
        assert await ids(window) == ["ex-2", "ex-3", "ex-5"]
        assert await ids(Selection(limit=3)) == everyone[:3]
        sampled = await ids(Selection(sample=3, seed=5))
        assert len(sampled) == 3
        assert set(sampled) <= set(everyone)
        assert sampled == sorted(sampled)  # still oldest first
        assert await ids(Selection(sample=3, seed=5)) == sampled
        # The router's address table names the executions of a scope.
        addresses = Tables.define(prefix="s_").addresses
        engine = sa.create_engine(migrations.sync_url(place.url))
        with engine.begin() as connection:
            for scope, key, execution_id in (
                ("eu", "a", "ex-1"),
                ("eu", "b", "ex-6"),
                ("us", "c", "ex-2"),
            ):
                connection.execute(
                    addresses.insert().values(
                        scope=scope,
                        document="cart",
                        key=key,
                        execution_id=execution_id,
                        inserted_at=start,
                        bucket=address_bucket(scope, "cart", key),
                    )
                )
        engine.dispose()
        assert await ids(Selection(scope="eu")) == ["ex-1", "ex-6"]
        assert await ids(Selection(scope="eu", status=Status.ACTIVE)) == ["ex-6"]
        assert await ids(Selection(scope="nowhere")) == []

    asyncio.run(main())


# Never writing.


def _counts(place: Place) -> dict[str, int]:
    defined = Tables.define(prefix=place.tables.prefix, schema=place.tables.schema)
    engine = sa.create_engine(migrations.sync_url(place.url))
    try:
        with engine.connect() as connection:
            return {
                name: connection.execute(
                    sa.select(sa.func.count()).select_from(getattr(defined, name))
                ).scalar_one()
                for name in ("charts", "executions", "inputs", "step_errors", "positions")
            }
    finally:
        engine.dispose()


def test_a_shadow_replay_writes_nothing_and_cannot(place: Place) -> None:
    asyncio.run(record(place, 12))
    before = _counts(place)
    assert before["executions"] == 12
    asyncio.run(shadow_replay(place.url, cart(RAISES), tables=place.tables))
    assert _counts(place) == before

    async def write() -> str:
        async with open_read_only(place.url, tables=place.tables) as adapter:
            record = await adapter.fetch_execution("ex-0000")
            assert record is not None
            copy = ExecutionRecord(
                "ex-new",
                content_hash=record.content_hash,
                status=record.status,
                position=record.position,
                created_at=record.created_at,
                updated_at=record.updated_at,
            )
            with pytest.raises(Exception) as refused:  # noqa: PT011 - the driver's own
                await adapter.insert_execution(copy)
            return str(refused.value).lower()

    said = asyncio.run(write())
    assert "read-only" in said or "readonly" in said
    assert _counts(place) == before


# The property.


EVENTS = st.sampled_from(["add", "approve", "checkout", "paid", "cancel", "unknown"])
DATA = st.one_of(st.none(), st.fixed_dictionaries({"amount": st.integers(-10, 300)}), st.text())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(EVENTS, DATA), max_size=12))
def test_replaying_on_the_identical_chart_never_diverges(
    inputs: list[tuple[str, object]],
) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    log = [
        LoggedInput(seq, "step", Event(name) if data is None else Event(name, data=data), at)
        for seq, (name, data) in enumerate(inputs, start=1)
    ]
    # A fresh compile: the same source, another Machine object.
    result = compare_logs(cart(), cart(), log)
    assert result.divergence is None
    assert result.new_error_count == 0
    assert result.verdict in (Verdict.SAME, Verdict.UNTRUSTED)
    if result.verdict is Verdict.UNTRUSTED:  # only a log that goes on after the end
        assert result.untrusted is not None
        assert "after the stored chart stopped" in result.untrusted


# The command.


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(["replay", *argv], out), out.getvalue()


def test_the_command(place: Place, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scripts = asyncio.run(record(place, 20))
    options = ["--database", place.url, "--prefix", place.tables.prefix]
    if place.tables.schema is not None:
        options += ["--schema", place.tables.schema]
    same = tmp_path / "cart.scxml"
    same.write_text(CART, encoding="utf-8")
    status, text = run_cli("--chart", str(same), *options)
    assert status == 0
    summary = text.splitlines()[-1]
    assert summary.startswith("20 executions replayed on sha256:")
    assert summary.endswith(": 20 same, 0 diverged, 0 with new errors, 0 untrusted")
    renamed = tmp_path / "renamed.scxml"
    renamed.write_text(RENAMED, encoding="utf-8")
    status, text = run_cli("--chart", str(renamed), "--document", "cart", *options)
    assert status == 1
    lines = text.splitlines()
    checked_out = sorted(i for i, events in scripts.items() if first_index(events, "checkout"))
    assert [line.split(":")[0] for line in lines[:-1]] == checked_out
    first = checked_out[0]
    at = first_index(scripts[first], "checkout")
    assert lines[0].startswith(f"{first}: diverged at input {at} (seq ")
    assert "configuration paying -> payment" in lines[0] or "-> ended in" in lines[0]
    status, text = run_cli("--chart", str(renamed), "--document", "cart", "--json", *options)
    assert status == 1
    document = json.loads(text)
    assert document["counts"]["diverged"] == len(checked_out)
    assert len(document["results"]) == 20
    spread = run_cli(
        "--chart", str(renamed), "--document", "cart", "--json", "--workers", "2", *options
    )
    assert spread == (1, text)
    # Nothing of the chart's name: nothing selected, which is no pass.
    status, text = run_cli("--chart", str(renamed), *options)
    assert (status, text) == (
        1,
        (
            "no executions selected: document 'renamed' (the chart file's stem: "
            f"--document names another); nothing tried on {document['revision']}\n"
        ),
    )
    capsys.readouterr()
    assert run_cli("--chart", str(same), *options, "--status", "done")[0] == 2
    assert "--status is one of" in capsys.readouterr().err
    assert run_cli("--chart", str(same), *options, "--created-after", "2026-01-01")[0] == 2
    assert "needs an offset" in capsys.readouterr().err
    assert run_cli("--chart", str(same), *options, "--workers", "0")[0] == 2
    assert "workers is a whole number of at least 1" in capsys.readouterr().err
    assert run_cli("--chart", str(tmp_path / "none.scxml"), *options)[0] == 2
    assert "cannot read" in capsys.readouterr().err
    big = tmp_path / "big.scxml"
    big.write_bytes(b" " * (4 * 1024 * 1024 + 10))
    assert run_cli("--chart", str(big), *options)[0] == 2
    assert "statifier replay: " in capsys.readouterr().err


def test_the_command_on_a_database_without_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "cart.scxml"
    chart.write_text(CART, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    sa.create_engine(url).connect().close()  # an empty file
    status, _ = run_cli("--chart", str(chart), "--database", url)
    assert status == 2
    assert "statifier db upgrade" in capsys.readouterr().err
    assert run_cli("--chart", str(chart), "--database", f"sqlite:///{tmp_path / 'no.db'}")[0] == 2
    assert "database:" in capsys.readouterr().err


# Other sources: a storage in memory, encrypted blobs.


def test_a_storage_in_memory_is_read_through_its_calls() -> None:
    async def main() -> list[tuple[int, int, str]]:
        storage = Storage(MemoryAdapter())
        lifecycle = Executions(storage, executor=ignore_effects)
        other = compile_chart(CART + "<!-- another chart -->", name="other")
        for number, machine in enumerate((cart(), other, cart())):
            await lifecycle.create(f"ex-{number}", machine)
            await lifecycle.step(f"ex-{number}", None, Event("add", data={"amount": 60}))
        told: list[tuple[int, int, str]] = []
        summary = await shadow_replay(
            storage,
            cart(GUARD),
            progress=lambda done, total, result: told.append((done, total, result.execution_id)),
        )
        assert [r.verdict for r in summary.results] == [Verdict.DIVERGED, Verdict.DIVERGED]
        return told

    assert asyncio.run(main()) == [(1, 2, "ex-0"), (2, 2, "ex-2")]

    with pytest.raises(ValueError, match="SQL only"):
        asyncio.run(shadow_replay(Storage(MemoryAdapter()), cart(), Selection(scope="eu")))


def test_encrypted_blobs_are_read_with_the_codec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from statifier.persistence.fernet import FernetCodec

    key = FernetCodec.generate_key()
    codec = FernetCodec([key])
    place = Place(f"sqlite:///{tmp_path / 'sealed.db'}", TableOptions(prefix="s_"))
    migrations.upgrade(place.url, place.tables)

    async def main() -> tuple[list[Verdict], list[Verdict]]:
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter, codec=codec), executor=ignore_effects)
            for number in range(3):
                await lifecycle.create(f"ex-{number}", cart())
                await lifecycle.step(f"ex-{number}", None, Event("add", data={"amount": 60}))
        opened = await shadow_replay(place.url, cart(GUARD), tables=place.tables, codec=codec)
        sealed = await shadow_replay(place.url, cart(GUARD), tables=place.tables)
        return [r.verdict for r in opened.results], [r.verdict for r in sealed.results]

    opened, sealed = asyncio.run(main())
    assert opened == [Verdict.DIVERGED] * 3
    assert sealed == [Verdict.UNTRUSTED] * 3  # without the key nothing can be read
    chart = tmp_path / "cart.scxml"
    chart.write_text(GUARD, encoding="utf-8")
    monkeypatch.setenv("SHADOW_KEY", key)
    options = ["--database", place.url, "--prefix", "s_", "--chart", str(chart)]
    status, text = run_cli(*options, "--keys-env", "SHADOW_KEY")
    assert status == 1
    assert text.splitlines()[-1].endswith(": 0 same, 3 diverged, 0 with new errors, 0 untrusted")
    status, text = run_cli(*options)
    assert status == 1
    assert "untrusted: its stored chart cannot be read" in text.splitlines()[0]


# Executions recorded through Durable: fired timers, a capped log.

TIMED = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
<datamodel><data id="polls" expr="0"/></datamodel>
<state id="waiting">
  <onentry>
    <send id="timeout" event="timeout" delay="1s"/>
    <send event="poll" target="#_internal" delay="500ms"/>
  </onentry>
  <transition event="poll" type="internal"><assign location="polls" expr="polls + 1"/></transition>
  <transition event="timeout" target="expired"/>
  <transition event="done" target="finished"><cancel sendid="timeout"/></transition>
</state>
<final id="expired"/>
<final id="finished"/>
</scxml>
"""


def test_fired_timers_replay_as_the_timer_worker_stepped_them(tmp_path: Path) -> None:
    from statifier.durable import Durable

    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "timed.scxml").write_text(TIMED, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'timed.db'}"

    async def main() -> tuple[list[ShadowResult], list[ShadowResult], list[ShadowResult]]:
        async with Durable(url, charts=charts, migrate=True) as durable:
            await durable.create("timed", "t-1")
            await durable.create("timed", "t-2")
            await durable.send("t-2", "done")
            later = datetime.now(UTC) + timedelta(seconds=5)
            # t-1's poll and timeout; t-2's poll, discarded (t-2 had finished).
            assert await durable.fire_due(later) == 3
            vias = [entry.via for entry in (await durable.describe("t-1")).inputs]
            assert vias == ["timer", "timer"]
        same = await shadow_replay(url, compile_chart(TIMED, name="timed"))
        slower = TIMED.replace('delay="1s"', 'delay="2s"')
        moved = await shadow_replay(url, compile_chart(slower, name="timed"))
        renamed = TIMED.replace('"expired"', '"lapsed"')
        ends = await shadow_replay(url, compile_chart(renamed, name="timed"))
        return list(same.results), list(moved.results), list(ends.results)

    same, moved, ends = asyncio.run(main())
    # Same: each replay on the stored chart ended where its execution is, the poll
    # counted (the stored position says polls 1 for t-1).
    assert [r.verdict for r in same] == [Verdict.SAME, Verdict.SAME]
    assert [r.inputs for r in same] == [2, 1]
    # The longer timeout is a difference at the start, where the timer is made.
    assert [r.verdict for r in moved] == [Verdict.DIVERGED, Verdict.DIVERGED]
    assert {r.divergence.index for r in moved if r.divergence} == {0}
    assert moved[0].divergence is not None
    assert [h.delay_ms for h in moved[0].divergence.new.handed] == [2000, 500]
    # The timeout fired into a final the revision names otherwise: input 2 of t-1.
    assert ends[0].divergence is not None
    assert (ends[0].divergence.index, ends[0].divergence.event) == (2, "timeout")
    assert ends[0].divergence.old.final_state == "expired"
    assert ends[0].divergence.new.final_state == "lapsed"
    assert ends[0].same_final is False
    assert ends[1].verdict is Verdict.SAME


def test_a_log_closed_at_its_cap_is_untrusted(tmp_path: Path) -> None:
    from statifier.durable import Durable

    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "cart.scxml").write_text(CART, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'capped.db'}"

    async def main() -> ShadowResult:
        async with Durable(url, charts=charts, migrate=True, input_log_cap=2) as durable:
            await durable.create("cart", "c-1")
            for amount in (5, 20, 30):
                await durable.send("c-1", "add", {"amount": amount})
        summary = await shadow_replay(url, cart())
        (result,) = summary.results
        return result

    result = asyncio.run(main())
    assert result.verdict is Verdict.UNTRUSTED
    assert result.untrusted == "input 2: the log was closed here at its cap"


@pytest.mark.parametrize(("before", "after"), [("1", "true"), ("1", "1.0"), ("[1]", "[true]")])
def test_values_of_another_type_differ(before: str, after: str) -> None:
    def chart(value: str) -> Machine:
        return compile_chart(
            '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">'
            '<datamodel><data id="x" expr="0"/></datamodel>'
            f'<state id="s"><transition event="set"><assign location="x" expr="{value}"/>'
            "</transition></state></scxml>"
        )

    at = datetime(2026, 1, 1, tzinfo=UTC)
    log = [LoggedInput(1, "step", Event("set"), at)]
    result = compare_logs(chart(before), chart(after), log)
    assert result.divergence is not None
    assert (result.divergence.index, result.divergence.parts) == (1, ("datamodel",))
    assert compare_logs(chart(before), chart(before), log).verdict is Verdict.SAME


def test_send_data_of_another_type_differs() -> None:
    def chart(value: str) -> Machine:
        return compile_chart(
            '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">'
            '<state id="s"><transition event="go">'
            f'<send event="out" target="#_elsewhere"><param name="n" expr="{value}"/></send>'
            "</transition></state></scxml>"
        )

    at = datetime(2026, 1, 1, tzinfo=UTC)
    log = [LoggedInput(1, "step", Event("go"), at)]
    result = compare_logs(chart("1"), chart("true"), log)
    assert result.divergence is not None
    assert (result.divergence.index, result.divergence.parts) == (1, ("handed",))
    assert result.divergence.old.handed[0].data == {"n": 1}
    assert compare_logs(chart("1"), chart("1"), log).verdict is Verdict.SAME


def test_host_functions_are_given_to_the_stored_charts(tmp_path: Path) -> None:
    from statifier.expr import Function

    def rate(args: tuple[object, ...]) -> object:
        (amount,) = args
        assert isinstance(amount, int)
        return amount * 2

    functions = {"rate": Function(rate, 1)}
    source = CART.replace(
        'expr="total + _event.data.amount"', 'expr="total + rate(_event.data.amount)"'
    )
    place = Place(f"sqlite:///{tmp_path / 'host.db'}", TableOptions(prefix="s_"))
    migrations.upgrade(place.url, place.tables)

    async def main() -> tuple[ShadowResult, ShadowResult]:
        machine = compile_chart(source, name="cart", functions=functions)
        async with SqlAdapter(place.url, place.tables) as adapter:
            lifecycle = Executions(Storage(adapter, functions=functions), executor=ignore_effects)
            await lifecycle.create("ex-1", machine)
            await lifecycle.step("ex-1", None, Event("add", data={"amount": 5}))
        given = await shadow_replay(place.url, machine, tables=place.tables, functions=functions)
        lacking = await shadow_replay(place.url, machine, tables=place.tables)
        return given.results[0], lacking.results[0]

    given, lacking = asyncio.run(main())
    assert given.verdict is Verdict.SAME
    assert lacking.verdict is Verdict.UNTRUSTED
    assert lacking.untrusted == (
        "input 1: the stored chart called rate(), a host function not given"
    )
