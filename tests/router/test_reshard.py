"""A router's stores grown from two to three with the writers stopped (statifier.sql.moves,
``statifier reshard``): every row lands in the store of its bucket under the new map,
nothing is lost or doubled, and routing goes on over three stores as it would have over
two: the same executions, the same duplicates, the timers and hops where they belong."""

from __future__ import annotations

import asyncio
import io
import json
import random
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.child_processes import signal_child
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)
from tests.service.own_postgres import servers

from statifier import reshard_command
from statifier.buckets import ledger_bucket
from statifier.chart import compile_chart
from statifier.cli import main
from statifier.persistence.shards import ShardMap
from statifier.persistence.sql import SqlAdapter
from statifier.reshard_command import plan
from statifier.router import (
    Binding,
    Create,
    InboundEvent,
    Routed,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
    TimerWorker,
)
from statifier.router.queries import address
from statifier.sql import TableOptions, migrations, moves
from statifier.sql.locations import downgrade_locations, upgrade_locations
from statifier.sql.moves import SourceChanged, move_range, moved_tables
from statifier.sql.places import Place, PlaceMismatch, read_place, resharding, write_place

SCOPE = "shop"
ROOT = Path(__file__).parent.parent.parent

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="live">
  <datamodel><data id="total" expr="0"/><data id="got" expr="0"/></datamodel>
  <state id="live">
    <transition event="add"><assign location="total" expr="total + _event.data.n"/></transition>
    <transition event="later">
      <send event="add" delay="1h"><param name="n" expr="100"/></send>
    </transition>
    <transition event="pass">
      <send type="test:sink" target="execution" event="poke">
        <param name="document" expr="'counter'"/>
        <param name="key" expr="_event.data.to"/>
        <param name="create" expr="'never'"/>
        <param name="n" expr="_event.data.n"/>
      </send>
    </transition>
    <transition event="poke"><assign location="got" expr="got + _event.data.n"/></transition>
  </state>
</scxml>"""
"""A counter: ``add`` adds, ``later`` adds 100 in an hour (a timer), ``pass`` sends
``poke`` to another counter (a hop through the outbox where it lives elsewhere)."""


def _binding(kind: str, data: tuple[str, ...], create: Create) -> Binding:
    return Binding(
        id=f"{kind}s",
        source="cmd",
        match=f"event.kind == '{kind}'",
        key="event.key",
        document="counter",
        event=kind,
        data=data,
        create=create,
    )


BINDINGS = [
    _binding("add", ("n",), Create.IF_ABSENT),
    _binding("later", (), Create.NEVER),
    _binding("pass", ("n", "to"), Create.NEVER),
]


def _config(adapter: SqlAdapter) -> RouterConfig:
    return RouterConfig(
        adapter,
        bindings=BINDINGS,
        resolver=StaticResolver({"counter": compile_chart(COUNTER)}),
        send_type="test:sink",
        timers_elsewhere=True,
    )


def _event(message_id: str, kind: str, key: str, **data: Any) -> InboundEvent:
    return InboundEvent(
        scope=SCOPE, source="cmd", message_id=message_id, data={"kind": kind, "key": key, **data}
    )


@pytest_asyncio.fixture(params=["sqlite", "postgresql"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[list[SqlStore]]:
    shards: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for shard in shards:
        shard.empty()
    yield shards


def _mark_moving(store: SqlStore) -> None:
    """Record that a reshard moves buckets to ``store``, as ``statifier reshard`` does
    before its first move: only then does a move replace the store's copy of a part."""
    options = store.tables.options
    now = datetime.now(UTC)
    store.run(lambda c: write_place(c, options, resharding(None, 1), now))


def _records(*stores: SqlStore) -> list[Place | None]:
    return [store.run(partial(read_place, options=store.tables.options)) for store in stores]


def _command_url(store: SqlStore) -> str:
    """A URL that reaches ``store``'s tables with no ``--schema``: a PostgreSQL store of
    the suite is a schema of its own, which the URL makes its search path."""
    schema = store.tables.options.schema
    if schema is None:
        return store.url
    url = sa.make_url(store.url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


def _reshard(sources: list[SqlStore], targets: list[SqlStore], *more: str) -> int:
    """``statifier reshard`` from ``sources`` to ``targets``, its output dropped."""
    given = [a for store in sources for a in ("--from", _command_url(store))]
    given += [a for store in targets for a in ("--to", _command_url(store))]
    return main(["reshard", *given, "--prefix", "t_", *more], io.StringIO())


async def _route_alone(store: SqlStore, keys: list[str]) -> None:
    """Route an ``add`` to each of ``keys`` through a router over ``store`` alone (a
    deployment of one store that recorded no place: a library host's, say)."""
    adapter = SqlAdapter(store.url, store.tables)
    try:
        alone = ShardedRouter(_config(adapter), [adapter])
        await alone.route_many([_event(f"m-{key}", "add", key, n=1) for key in keys])
    finally:
        await adapter.close()


def _executions(store: SqlStore) -> set[str]:
    return {row["execution_id"] for row in _rows(store, "executions")}


def _rows(store: SqlStore, table: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(migrations.sync_url(store.url))
    try:
        with engine.connect() as connection:
            found = connection.execute(sa.select(getattr(store.tables, table)))
            return [dict(row._mapping) for row in found]
    finally:
        engine.dispose()


async def _total(router: ShardedRouter, key: str) -> tuple[int, int]:
    found = await address(router.router_of_address(SCOPE, "counter", key), SCOPE, "counter", key)
    assert found is not None
    async with router.router_of_execution(found.execution_id).transaction() as unit:
        record = await unit.storage.fetch_execution(found.execution_id)
        machine = await unit.storage.machine(record.content_hash)
        data = unit.storage.load(record, machine).datamodel
    return data["total"], data["got"]


def _move(stores: list[SqlStore], before: int, after: int) -> int:
    """Move the rows of ``before`` stores to ``after`` (the first stores of
    ``stores``); how many rows moved."""
    urls = [f"{store.url}#{number}" for number, store in enumerate(stores)]  # named apart
    moved = 0
    for changing in plan(urls[:before], urls[:after]):
        source, target = stores[changing.source], stores[changing.target]
        moved += move_range(
            source.url,
            target.url,
            changing.buckets,
            options=source.tables.options,
            target_options=target.tables.options,
            step=64,
        ).total
    return moved


@pytest.mark.asyncio
async def test_two_stores_grown_to_three_keep_every_row_once_in_its_buckets_store(
    stores: list[SqlStore],
) -> None:
    adapters = [SqlAdapter(store.url, store.tables) for store in stores]
    try:
        two = ShardedRouter(_config(adapters[0]), adapters[:2])
        keys = [f"k{number}" for number in range(30)]
        await two.route_many([_event(f"a{n}", "add", key, n=n) for n, key in enumerate(keys)])
        await two.route_many([_event(f"l{n}", "later", key) for n, key in enumerate(keys[:10])])
        passes = [(keys[n], keys[-1 - n]) for n in range(5)]
        for n, (sender, receiver) in enumerate(passes):
            await two.route(_event(f"p{n}", "pass", sender, to=receiver, n=1000))
        paused = keys[20]
        found = await address(
            two.router_of_address(SCOPE, "counter", paused), SCOPE, "counter", paused
        )
        assert found is not None
        assert await two.router_of_execution(found.execution_id).pause(found.execution_id)
        held = await two.route(_event("h1", "add", paused, n=7))
        assert [o.outcome for o in held.outcomes] == ["held", "no_match", "no_match"]
        before = {
            table: sum(len(_rows(s, table)) for s in stores)
            for table in moved_tables()
            if table != "locations"
        }
        hops = sum(
            two.router_of_address(SCOPE, "counter", sender)
            is not two.router_of_address(SCOPE, "counter", receiver)
            for sender, receiver in passes
        )
        assert hops > 0
        assert (before["timers"], before["held_events"], before["outbox"]) == (10, 1, hops)
        assert all(not _rows(stores[2], table) for table in before)

        assert _move(stores, 2, 3) > 0
        assert _move(stores, 2, 3) == 0  # run again: nothing left to move

        # Every row once, in the store its bucket falls in under the map of three.
        after = {table: sum(len(_rows(s, table)) for s in stores) for table in before}
        assert after == before
        three_map = ShardMap.even(3)
        for number, store in enumerate(stores):
            ids = {row["execution_id"] for row in _rows(store, "executions")}
            for table in (
                "executions",
                "addresses",
                "dedupe",
                "routing_ledger",
                "timers",
                "outbox",
            ):
                for row in _rows(store, table):
                    assert three_map.store_of(row["bucket"]) == number, (table, row)
            for row in _rows(store, "routing_ledger"):
                assert row["bucket"] == ledger_bucket(
                    row["binding_id"],
                    scope=row["scope"],
                    document=row["document"],
                    key=row["key"],
                    execution_id=row["execution_id"],
                    message_id=row["message_id"],
                )
            for table in ("inputs", "held_events"):
                assert {row["execution_id"] for row in _rows(store, table)} <= ids
            assert _rows(store, "charts") or not ids  # each store with executions has the chart

        # Routing goes on over three stores: the same executions, the same duplicates.
        three = ShardedRouter(_config(adapters[0]), adapters)
        again = await three.route_many(
            [_event(f"a{n}", "add", key, n=n) for n, key in enumerate(keys)]
        )
        assert {a.outcomes[0].outcome for a in again if isinstance(a, Routed)} == {"duplicate"}
        more = await three.route_many(
            [_event(f"b{n}", "add", key, n=1) for n, key in enumerate(keys)]
        )
        assert [a.outcomes[0].outcome for a in more if isinstance(a, Routed)] == [
            "held" if key == paused else "delivered" for key in keys
        ]
        assert await three.router_of_execution(found.execution_id).resume(found.execution_id)
        for drain in three.hop_drains():
            while (await drain.drain_once()).claimed:
                pass
        # Each store's timer worker, over its range, fires the timers moved to it.
        later = datetime.now(UTC) + timedelta(hours=2)
        fired = [
            await TimerWorker(router, buckets=buckets).fire_due(later)
            for router, buckets in zip(three.routers, three.shard_map.ranges, strict=True)
        ]
        assert sum(fired) == 10
        for n, key in enumerate(keys):
            total, got = await _total(three, key)
            expected_got = 1000 * sum(1 for _, receiver in passes if receiver == key)
            expected = n + 1 + (7 if key == paused else 0) + (100 if n < 10 else 0)
            assert (total, got) == (expected, expected_got), key
        assert sum(len(_rows(s, "executions")) for s in stores) == len(keys)
    finally:
        for adapter in adapters:
            await adapter.close()


@pytest.mark.asyncio
async def test_the_command_prints_its_plan_refuses_what_it_cannot_move_and_moves(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for store in sqlite_shards:
        store.empty()
    one, other = sqlite_shards[0].url, sqlite_shards[1].url
    grow = ["reshard", "--from", one, "--to", one, "--to", other, "--prefix", "t_"]
    out = io.StringIO()
    assert main([*grow, "--dry-run"], out) == 0
    assert out.getvalue() == (
        "buckets 512-1023: store 0 of --from to store 1 of --to\n1 ranges would move\n"
    )
    (tmp_path / "new.db").touch()  # a database, but not migrated
    behind = f"sqlite:///{tmp_path / 'new.db'}"
    assert main(["reshard", "--from", one, "--to", one, "--to", behind, "--prefix", "t_"]) == 2
    said = capsys.readouterr().err
    assert "store 1 of --to is at revision none" in said
    assert "new.db" not in said  # a store is named by its place, never its URL
    assert main(["reshard", "--from", one, "--from", one, "--to", one, "--prefix", "t_"]) == 2
    assert "--from: a store is named twice" in capsys.readouterr().err
    # Stores are told apart by what they hold: one file reached by two paths is one.
    spelled = one.rsplit("/", 1)
    one_again = f"{spelled[0]}/./{spelled[1]}"
    assert one_again != one
    assert main(["reshard", "--from", one, "--to", one, "--to", one_again, "--prefix", "t_"]) == 2
    assert "--to: a store is named twice" in capsys.readouterr().err
    assert main(["reshard", "--from", one, "--to", other, "--to", one, "--prefix", "t_"]) == 2
    assert "the first store of --to must be the first of --from" in capsys.readouterr().err

    adapters = [SqlAdapter(store.url, store.tables) for store in sqlite_shards[:2]]
    try:
        alone = ShardedRouter(_config(adapters[0]), adapters[:1])
        keys = [f"k{number}" for number in range(20)]
        await alone.route_many([_event(f"a{n}", "add", key, n=n) for n, key in enumerate(keys)])
        out = io.StringIO()
        assert main(grow, out) == 0
        lines = out.getvalue().splitlines()
        assert lines[0].startswith("buckets 512-1023: store 0 of --from to store 1 of --to: ")
        assert lines[-1].endswith("in 1 ranges: start the processes on --to")
        moved = [row["bucket"] for row in _rows(sqlite_shards[1], "executions")]
        kept = [row["bucket"] for row in _rows(sqlite_shards[0], "executions")]
        assert len(moved) + len(kept) == len(keys)
        assert all(bucket >= 512 for bucket in moved)
        assert all(bucket < 512 for bucket in kept)
        both = ShardedRouter(_config(adapters[0]), adapters)
        again = await both.route_many([_event(f"a{n}", "add", key) for n, key in enumerate(keys)])
        assert {a.outcomes[0].outcome for a in again if isinstance(a, Routed)} == {"duplicate"}
    finally:
        for adapter in adapters:
            await adapter.close()


KILLS = 15
"""How many times the crash test kills a move before it lets one go through."""


def _snapshot(store: SqlStore) -> dict[str, list[str]]:
    """Every routed row of ``store``, keys aside, sorted, by table."""
    engine = sa.create_engine(migrations.sync_url(store.url))
    tables = ("executions", "inputs", "addresses", "dedupe", "routing_ledger", "charts")
    try:
        with engine.connect() as connection:
            return {
                name: sorted(
                    json.dumps({k: str(v) for k, v in row._mapping.items() if k != "id"})
                    for row in connection.execute(sa.select(getattr(store.tables, name)))
                )
                for name in tables
            }
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_a_move_killed_at_random_points_and_run_again_moves_every_row_once(
    stores: list[SqlStore],
) -> None:
    source, target = stores[0], stores[1]
    adapter = SqlAdapter(source.url, source.tables)
    try:
        alone = ShardedRouter(_config(adapter), [adapter])
        for event in range(2):
            batch = [_event(f"e{event}-{n}", "add", f"k{n}", n=1) for n in range(600)]
            await alone.route_many(batch)
    finally:
        await adapter.close()
    before = _snapshot(source)
    _mark_moving(target)  # as the command does: only then is an earlier copy replaced
    rng = random.Random(17)
    args = [
        *(source.url, source.tables.options.schema or "-"),
        *(target.url, target.tables.options.schema or "-"),
        source.tables.options.prefix,
    ]
    kills = 0
    while True:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.router.moving_process",
            *args,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
        )
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 60) == b"moving\n"
        if kills < KILLS:
            try:
                await asyncio.wait_for(process.wait(), rng.uniform(0.01, 0.2))
            except TimeoutError:
                signal_child(process)
                await process.wait()
                kills += 1
                continue
        said = await asyncio.wait_for(process.stdout.read(), 120)
        assert await process.wait() == 0
        break
    assert kills == KILLS, f"the move went through after {kills} kills: {said!r}"
    assert _snapshot(target) == before  # every row once, the chart copied
    emptied = _snapshot(source)
    assert all(not rows for name, rows in emptied.items() if name != "charts")


def test_the_stores_record_their_places_and_a_list_changed_without_a_reshard_is_refused(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for store in sqlite_shards:
        store.empty()
    options = sqlite_shards[0].tables.options
    first, second, third = (store.url for store in sqlite_shards)

    def claim(url: str, place: int, stores: int) -> None:
        migrations.prepare(url, options, migrate=False, place=Place.serving(place, stores))

    def records() -> list[Place | None]:
        found = []
        for url in (first, second, third):
            engine = sa.create_engine(migrations.sync_url(url))
            try:
                with engine.connect() as connection:
                    found.append(read_place(connection, options))
            finally:
                engine.dispose()
        return found

    def reshard(sources: list[str], targets: list[str]) -> int:
        given = [*(a for url in sources for a in ("--from", url))]
        given += [a for url in targets for a in ("--to", url)]
        return main(["reshard", *given, "--prefix", "t_"], io.StringIO())

    claim(first, 0, 2)
    claim(second, 1, 2)
    # A --from list that is not the one the stores serve in.
    assert reshard([first], [first, third]) == 2
    said = capsys.readouterr().err
    assert "--from store 0 of 1 holds place 0 of 2: the list of stores changed" in said
    assert records() == [Place(0, 2, "serving"), Place(1, 2, "serving"), None]
    # Grown to three: each store serves in its new place, and the old list is refused.
    assert reshard([first, second], [first, second, third]) == 0
    assert records() == [Place.serving(0, 3), Place.serving(1, 3), Place.serving(2, 3)]
    with pytest.raises(PlaceMismatch, match="store 1 of 2 holds place 1 of 3"):
        claim(second, 1, 2)
    claim(second, 1, 3)
    # Shrunk to two: the store left out is retired.
    assert reshard([first, second, third], [first, third]) == 0
    assert records() == [Place.serving(0, 2), Place(None, None, "retired"), Place.serving(1, 2)]
    with pytest.raises(PlaceMismatch, match="moved every bucket of it to the other stores"):
        claim(second, 1, 3)
    # A reshard cut short leaves its stores moving, or some of them in their new
    # places: a process is refused, and the same command, run again, finishes.
    cut_short = [
        [Place(0, 3, "moving"), Place(1, 3, "moving"), Place(2, 3, "moving")],
        [Place.serving(0, 2), Place(None, None, "retired"), Place(2, 3, "moving")],
    ]
    for marks in cut_short:
        for url, mark in zip((first, second, third), marks, strict=True):
            engine = sa.create_engine(migrations.sync_url(url))
            try:
                with engine.begin() as connection:
                    write_place(connection, options, mark, datetime.now(UTC))
            finally:
                engine.dispose()
        with pytest.raises(PlaceMismatch, match="statifier reshard is moving its buckets"):
            claim(third, 1, 2)
        assert reshard([first, second, third], [first, third]) == 0
        assert records() == [
            Place.serving(0, 2),
            Place(None, None, "retired"),
            Place.serving(1, 2),
        ]
    # A --to store that serves another list is refused.
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    migrations.prepare(elsewhere, options, migrate=True, place=Place.serving(0, 1))
    assert reshard([first, third], [first, third, elsewhere]) == 2
    assert "--to store 2 serves already, as place 0 of 1" in capsys.readouterr().err


def _count(store: SqlStore) -> int:
    return len(_rows(store, "executions"))


@pytest.mark.asyncio
async def test_a_store_reached_by_two_urls_is_one_store_and_loses_no_row(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
) -> None:
    """Grown from [A, B] to [A, B spelled otherwise, C]: B's rows stay in B where the
    new map keeps them, and nothing is deleted as moved "from B to B"."""
    for store in sqlite_shards:
        store.empty()
    a, b, c = sqlite_shards
    head, tail = b.url.rsplit("/", 1)
    b_again = f"{head}/./{tail}"
    adapters = [SqlAdapter(store.url, store.tables) for store in (a, b)]
    try:
        two = ShardedRouter(_config(adapters[0]), adapters)
        await two.route_many([_event(f"a{n}", "add", f"k{n}", n=1) for n in range(300)])
    finally:
        for adapter in adapters:
            await adapter.close()
    given = ["--from", a.url, "--from", b.url, "--to", a.url, "--to", b_again, "--to", c.url]
    out = io.StringIO()
    assert main(["reshard", *given, "--prefix", "t_"], out) == 0
    assert "store 1 of --from to store 1 of --to" not in out.getvalue()
    assert sum(_count(store) for store in sqlite_shards) == 300
    three = ShardMap.even(3)
    for place, store in enumerate(sqlite_shards):
        start, end = three.ranges[place]
        assert all(start <= row["bucket"] < end for row in _rows(store, "executions"))


@pytest.mark.asyncio
async def test_a_reshard_cut_short_is_finished_only_with_its_own_lists(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A reshard from [A] to [A, B] cut short after its first part leaves rows in B;
    one from [A] to [A, C] is refused (those rows would be left in B, outside the new
    list), and the first, run again, finishes with every row once."""
    for store in sqlite_shards:
        store.empty()
    a, b, c = sqlite_shards
    adapter = SqlAdapter(a.url, a.tables)
    try:
        alone = ShardedRouter(_config(adapter), [adapter])
        await alone.route_many([_event(f"a{n}", "add", f"k{n}", n=1) for n in range(200)])
    finally:
        await adapter.close()
    real, parts = moves._move_part, list[int]()

    def cut_short(*args: Any, **kwargs: Any) -> Any:
        if parts:
            raise SourceChanged("cut short here")
        parts.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(moves, "_move_part", cut_short)
    grow = ["reshard", "--from", a.url, "--to", a.url, "--to", b.url, "--prefix", "t_"]
    assert main([*grow, "--step", "64"], io.StringIO()) == 2
    monkeypatch.undo()
    assert _count(b) > 0
    said = capsys.readouterr().err
    assert said.startswith("statifier reshard: cut short here: the stores are left moving")
    assert said.endswith("run the same statifier reshard again to finish\n")

    elsewhere = ["reshard", "--from", a.url, "--to", a.url, "--to", c.url, "--prefix", "t_"]
    assert main(elsewhere, io.StringIO()) == 2
    said = capsys.readouterr().err
    assert "--from store 0 is moving for another reshard" in said
    assert _count(c) == 0

    assert main(grow, io.StringIO()) == 0
    assert (_count(a) + _count(b), _count(c)) == (200, 0)


@pytest.mark.asyncio
async def test_a_store_that_holds_rows_the_moves_would_replace_is_refused_and_loses_none(
    stores: list[SqlStore], capsys: pytest.CaptureFixture[str]
) -> None:
    """A --to store with rows of its own and no record (a library host's store, or one
    not started since stores record their places) would see a move replace its rows
    of each part, taken for an earlier copy: it is refused before a store is marked,
    and so is a store in both lists that holds rows of the buckets it is to receive."""
    a, b, c = stores
    await _route_alone(a, [f"a{n}" for n in range(100)])
    await _route_alone(b, [f"b{n}" for n in range(100)])
    held = [_executions(store) for store in stores]
    for more in ((), ("--dry-run",)):
        assert _reshard([a], [a, b], *more) == 2
        said = capsys.readouterr().err
        assert said == (
            "statifier reshard: store 1 of --to holds rows of keys already, which no "
            "reshard put there: moving rows to it would lose them. Name a store that holds "
            "none (statifier db upgrade makes a new one)\n"
        )
    # B is in both lists now, and holds rows of the buckets A gives it (341-511).
    assert _reshard([a, b], [a, b, c]) == 2
    said = capsys.readouterr().err
    assert "store 1 of --from holds rows of keys already in the buckets it is to receive" in said
    assert [_executions(store) for store in stores] == held
    assert _records(a, b, c) == [None, None, None]  # nothing marked
    # Emptied, B takes A's rows of its range.
    b.empty()
    assert _reshard([a], [a, b]) == 0
    assert _executions(a) | _executions(b) == held[0]


@pytest.mark.asyncio
async def test_what_a_move_would_refuse_is_refused_before_a_store_is_marked(
    stores: list[SqlStore], capsys: pytest.CaptureFixture[str]
) -> None:
    """The source has BasicHTTP locations and the target no table for them: refused
    while every store still holds the place it held, so the deployment starts as
    before."""
    a, b, _ = stores
    options = a.tables.options
    downgrade_locations(b.url, b.tables)
    upgrade_locations(a.url, a.tables)
    try:
        await _route_alone(a, [f"k{n}" for n in range(20)])
        migrations.prepare(a.url, options, migrate=False, place=Place.serving(0, 1))
        assert _reshard([a], [a, b]) == 2
        assert _records(a, b) == [Place.serving(0, 1), None]
        migrations.prepare(a.url, options, migrate=False, place=Place.serving(0, 1))
        said = capsys.readouterr().err
        assert said == (
            "statifier reshard: store 0 of --from to store 1 of --to: the source has "
            "BasicHTTP locations and the target no table for them: build it first "
            "(statifier.sql.locations.upgrade_locations)\n"
        )
        assert (len(_executions(a)), _executions(b)) == (20, set())
    finally:
        downgrade_locations(a.url, a.tables)


@pytest.mark.asyncio
async def test_ctrl_c_says_where_it_leaves_the_stores_and_the_same_command_finishes(
    stores: list[SqlStore],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b, _ = stores
    await _route_alone(a, [f"k{n}" for n in range(200)])
    real_check, real_part = moves.check_move, moves._move_part

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(moves, "check_move", interrupted)
    assert _reshard([a], [a, b]) == 130
    assert capsys.readouterr().err == (
        "statifier reshard: interrupted: no store was marked moving, none changed\n"
    )
    assert _records(a, b) == [None, None]
    monkeypatch.setattr(moves, "check_move", real_check)
    parts: list[int] = []

    def after_one_part(*args: Any, **kwargs: Any) -> Any:
        if parts:
            raise KeyboardInterrupt
        parts.append(1)
        return real_part(*args, **kwargs)

    monkeypatch.setattr(moves, "_move_part", after_one_part)
    assert _reshard([a], [a, b], "--step", "64") == 130
    assert capsys.readouterr().err == (
        "statifier reshard: interrupted: the stores are left moving (statifier serve "
        "refuses them): run the same statifier reshard again to finish\n"
    )
    assert [record and record.state for record in _records(a, b)] == ["moving", "moving"]
    assert _count(b) > 0
    # Cut short again before the records are read: it cannot say they are not moving.
    monkeypatch.setattr(reshard_command, "_check_revisions", interrupted)
    assert _reshard([a], [a, b]) == 130
    assert capsys.readouterr().err == (
        "statifier reshard: interrupted: before the stores' records were read: this run "
        "changed none\n"
    )
    monkeypatch.undo()
    monkeypatch.setattr(moves, "_move_part", real_part)
    assert _reshard([a], [a, b]) == 0
    assert (_count(a) + _count(b), _records(a, b)) == (
        200,
        [Place.serving(0, 2), Place.serving(1, 2)],
    )


@pytest.mark.parametrize("more", [(), ("--dry-run",)])
def test_a_sqlite_store_that_does_not_exist_is_refused_not_created(
    sqlite_shards: list[SqlStore],  # noqa: F811 - the fixture
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    more: tuple[str, ...],
) -> None:
    one = sqlite_shards[0].url
    for missing in (tmp_path / "typo.db", tmp_path / "no" / "such" / "folder" / "new.db"):
        url = f"sqlite:///{missing}"
        for given, place in (
            (["--from", one, "--to", one, "--to", url], "store 1 of --to"),
            (["--from", url, "--to", url, "--to", one], "store 0 of --from"),
        ):
            assert main(["reshard", *given, "--prefix", "t_", *more]) == 2
            said = capsys.readouterr().err
            assert said.startswith(f"statifier reshard: no such store: {place} names a SQLite")
            assert not missing.exists()
            assert not (tmp_path / "no").exists()


@pytest.mark.asyncio
async def test_a_database_error_names_its_store_or_the_range_it_moved(
    stores: list[SqlStore],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    a, b, _ = stores
    await _route_alone(a, [f"k{n}" for n in range(50)])
    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database, whatever its name says\n" * 100)
    url = f"sqlite:///{garbage}"
    given = ["--from", _command_url(a), "--to", _command_url(a), "--to", url]
    assert main(["reshard", *given, "--prefix", "t_"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("statifier reshard: database (store 1 of --to): DatabaseError: ")
    assert "left moving" not in said  # nothing marked yet

    def cut(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("COPY", {}, ConnectionError("server closed the connection"))

    monkeypatch.setattr(moves, "_move_part", cut)
    assert _reshard([a], [a, b]) == 2
    assert capsys.readouterr().err == (
        "statifier reshard: database (buckets 512-1023: store 0 of --from to store 1 of "
        "--to): ConnectionError: server closed the connection: the stores are left moving "
        "(statifier serve refuses them): run the same statifier reshard again to finish\n"
    )
    monkeypatch.undo()
    assert _reshard([a], [a, b]) == 0
    assert _count(a) + _count(b) == 50


@pytest.mark.asyncio
async def test_a_target_server_that_stops_right_after_the_move_keeps_every_row_it_took() -> None:
    """A PostgreSQL target acknowledging commits before it writes them
    (``synchronous_commit = off``, as the servers of tests/service/own_postgres.py run,
    its WAL writer slowed so that nothing reaches the log by chance) stopped with
    ``-m immediate`` right after the reshard: the source deleted each part once the
    target said it held it, so the target must hold every row when it comes back."""
    options = TableOptions(prefix="t_")
    with servers(2) as (first, second):
        for server in (first, second):
            migrations.upgrade(server.url, options)
        engine = sa.create_engine(second.url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("ALTER SYSTEM SET wal_writer_delay = '10s'"))
                connection.execute(sa.text("SELECT pg_reload_conf()"))
        finally:
            engine.dispose()
        adapter = SqlAdapter(first.url, options)
        keys = [f"k{n}" for n in range(200)]
        try:
            alone = ShardedRouter(_config(adapter), [adapter])
            await alone.route_many([_event(f"a-{key}", "add", key, n=1) for key in keys])
        finally:
            await adapter.close()
        given = ["--from", first.url, "--to", first.url, "--to", second.url, "--prefix", "t_"]
        assert main(["reshard", *given], io.StringIO()) == 0
        second.ctl("-m", "immediate", "-w", "stop")
        second.start()

        def executions(url: str) -> int:
            engine = sa.create_engine(url)
            try:
                with engine.connect() as connection:
                    table = options.define().executions
                    return connection.execute(
                        sa.select(sa.func.count()).select_from(table)
                    ).scalar_one()
            finally:
                engine.dispose()

        moved = executions(second.url)
        assert moved > 0
        assert executions(first.url) + moved == len(keys)
