"""`statifier executions --shard URL --shard URL ...` over executions spread over three
SQLite files and over three PostgreSQL databases of the test's own: an execution is
created, sent to, shown, paused, resumed and cancelled in its bucket's store alone; a
list, a search, an export, the timers due and a bulk action cover every store; and
the refusals of a mixed or single store."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import unique_name
from tests.test_executions_command import COUNTER, DOOR, ORDER, cli

from statifier.buckets import bucket_of
from statifier.persistence.shards import ShardMap
from statifier.sql import Tables, migrations


@pytest.fixture(params=("sqlite", "postgresql"))
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """Three migrated stores: SQLite files, or PostgreSQL databases made for the test."""
    if request.param == "sqlite":
        found = [f"sqlite:///{tmp_path / f'store{n}.db'}" for n in range(3)]
        for url in found:
            migrations.upgrade(url)
        yield found
        return
    server: str = request.getfixturevalue("database_url")
    names = [unique_name("statifier_stores_") for _ in range(3)]
    admin = sa.create_engine(migrations.sync_url(server), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            for name in names:
                connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        found = [sa.make_url(server).set(database=name).render_as_string(False) for name in names]
        for url in found:
            migrations.upgrade(url)
        yield found
    finally:
        with admin.connect() as connection:
            for name in names:
                connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def charts(tmp_path: Path) -> Path:
    folder = tmp_path / "charts"
    folder.mkdir()
    for name, source in (("door", DOOR), ("counter", COUNTER), ("order", ORDER)):
        (folder / f"{name}.scxml").write_text(source, encoding="utf-8")
    return folder


def _over(urls: list[str]) -> list[str]:
    return [option for url in urls for option in ("--shard", url)]


def _ids_in(capsys: pytest.CaptureFixture[str], url: str) -> set[str]:
    status, out, _ = cli(capsys, "list", "--database", url, "--json")
    assert status == 0
    return {row["id"] for row in json.loads(out)}


def test_each_execution_lives_in_its_buckets_store_and_lists_merge(
    urls: list[str], charts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over, shard_map = _over(urls), ShardMap.even(3)
    made: list[str] = []
    for number in range(12):
        given = [] if number % 2 else ["--id", f"door-{number}"]
        status, out, err = cli(
            capsys, "create", "door", *over, "--charts", str(charts), *given, "--json"
        )
        assert status == 0, err
        made.append(json.loads(out)["id"])
    for number, url in enumerate(urls):
        held = _ids_in(capsys, url)
        assert held == {i for i in made if shard_map.store_of(bucket_of(i)) == number}
    assert all(_ids_in(capsys, url) for url in urls), "twelve ids leave no store empty"
    status, out, _ = cli(capsys, "list", *over, "--json")
    listed = json.loads(out)
    assert sorted(row["id"] for row in listed) == sorted(made)
    times = [(row["created_at"], row["id"]) for row in listed]
    assert times == sorted(times), "oldest first, over every store"
    status, out, _ = cli(capsys, "list", *over)
    assert status == 0
    assert len(out.splitlines()) == 13

    # One execution's actions reach its store alone.
    door = made[0]
    assert cli(capsys, "send", door, "knock", *over)[0] == 0
    assert cli(capsys, "pause", door, *over)[0] == 0
    assert cli(capsys, "send", door, "knock", *over)[0] == 0
    status, out, _ = cli(capsys, "resume", door, *over, "--json")
    assert status == 0
    assert json.loads(out)["stepped"] == 1
    status, out, _ = cli(capsys, "show", door, *over, "--json")
    shown = json.loads(out)
    assert status == 0
    assert len(shown["inputs"]) == 2, shown
    assert cli(capsys, "cancel", door, *over)[0] == 0
    status, out, _ = cli(capsys, "list", *over, "--status", "cancelled", "--json")
    assert [row["id"] for row in json.loads(out)] == [door]

    # A search reads every store through the console's query.
    status, out, _ = cli(capsys, "list", *over, "--final", "closed", "--json")
    assert status == 0
    assert json.loads(out) == []
    closing = made[1]
    assert cli(capsys, "send", closing, "close", *over)[0] == 0
    status, out, _ = cli(capsys, "list", *over, "--final", "closed", "--json")
    assert [row["id"] for row in json.loads(out)] == [closing]

    # An export holds every store's executions, or those named, wherever they are.
    exported = charts.parent / "export.json"
    status, out, _ = cli(capsys, "export", str(exported), *over)
    assert status == 0
    assert out == f"12 executions exported to {exported}\n"
    document = json.loads(exported.read_text(encoding="utf-8"))
    assert sorted(row["id"] for row in document["executions"]) == sorted(made)
    assert len(document["charts"]) == 1
    named = [made[2], made[5], made[7]]
    status, out, _ = cli(capsys, "export", str(exported), *over, *[f"--id={i}" for i in named])
    assert status == 0, out
    document = json.loads(exported.read_text(encoding="utf-8"))
    assert sorted(row["id"] for row in document["executions"]) == sorted(named)

    # A bulk action counts every store once, then acts store by store.
    status, out, _ = cli(capsys, "bulk", "cancel", *over, "--status", "active", "--yes")
    assert status == 0, out
    assert out.splitlines()[0] == "10 executions selected to cancel"
    assert out.count("bulk run ") == 3
    status, out, _ = cli(capsys, "list", *over, "--status", "active", "--json")
    assert json.loads(out) == []


def test_timers_due_fire_in_every_store(
    urls: list[str], charts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over, shard_map = _over(urls), ShardMap.even(3)
    # Three seconds, not the chart's one: three CLI creates and sends on a loaded
    # machine have taken more than a second, and the first fire must find none due.
    (charts / "order.scxml").write_text(ORDER.replace('delay="1s"', 'delay="3s"'), "utf-8")
    ids: dict[int, str] = {}
    candidate = 0
    while len(ids) < 3:  # one order in each store
        execution_id = f"order-{candidate}"
        ids.setdefault(shard_map.store_of(bucket_of(execution_id)), execution_id)
        candidate += 1
    for execution_id in ids.values():
        status, _, err = cli(
            capsys, "create", "order", *over, "--charts", str(charts), "--id", execution_id
        )
        assert status == 0, err
        assert cli(capsys, "send", execution_id, 'pay={"amount": 3}', *over)[0] == 0
    status, out, _ = cli(capsys, "fire", *over)
    assert (status, out) == (0, "0 timers fired\n")  # due in three seconds
    time.sleep(3.1)
    status, out, _ = cli(capsys, "fire", *over)
    assert (status, out) == (0, "3 timers fired\n")
    status, out, _ = cli(capsys, "list", *over, "--final", "expired", "--json")
    assert sorted(row["id"] for row in json.loads(out)) == sorted(ids.values())


def test_stores_given_wrongly_are_refused(
    urls: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(capsys, "list", "--shard", urls[0])
    assert status == 2
    assert "two or more" in err
    status, _, err = cli(capsys, "list", *_over(urls), "--database", urls[0])
    assert status == 2
    assert "--database or --shard, not both" in err
    assert "postgresql://" not in err
    assert "sqlite://" not in err


def test_a_store_that_does_not_answer_is_named(
    urls: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The driver's error names a host and port (or nothing, on SQLite): which --shard
    # it was is what an operator needs.
    if urls[0].startswith("sqlite"):
        down = f"sqlite:///{tmp_path}"  # a directory: SQLite cannot open it
    else:
        down = sa.make_url(urls[0]).set(port=1).render_as_string(False)  # nothing listens
    over = _over([urls[0], down, urls[2]])
    status, _, err = cli(capsys, "list", *over)
    assert status == 2
    assert err.startswith("statifier executions list: store 1 of 3 (--shard number 2): database: ")
    door = next(f"door-{n}" for n in range(1000) if ShardMap.even(3).store_of_id(f"door-{n}") == 1)
    status, _, err = cli(capsys, "show", door, *over)
    assert status == 2
    assert err.startswith("statifier executions show: store 1 of 3 (--shard number 2): database: ")


def test_a_store_that_fails_after_it_opened_is_named(
    urls: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Opened, then failing in the middle of a command over every store: the list, the
    # export, the timers due, a bulk count, a migration each name the store.
    engine = sa.create_engine(migrations.sync_url(urls[1]))
    try:
        with engine.begin() as connection:
            tables = Tables.define()
            for table in (tables.executions, tables.timers):
                connection.execute(sa.text(f"ALTER TABLE {table.name} RENAME TO gone_{table.name}"))
    finally:
        engine.dispose()
    (tmp_path / "order.scxml").write_text(ORDER, encoding="utf-8")
    over = _over(urls)
    for command in (
        ["list"],
        ["list", "--key", "k"],
        ["export", str(tmp_path / "out.json")],
        ["fire"],
        ["bulk", "cancel", "--yes"],
        ["migrate", "order", "--charts", str(tmp_path)],
    ):
        status, _, err = cli(capsys, *command, *over)
        assert status == 2, (command, err)
        said = f"statifier executions {command[0]}: store 1 of 3 (--shard number 2): database: "
        assert err.startswith(said), (command, err)
