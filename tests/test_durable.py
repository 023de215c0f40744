"""`Durable`, the shortest way in to durable executions, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.persistence.conftest import drop_schema, unique_name

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core.effects import Done
from statifier.durable import (
    ChartUnusable,
    Durable,
    ExecutionExists,
    ExecutionNotFound,
    NotMigrated,
    Send,
    Sent,
    Status,
    UnknownChart,
)
from statifier.durable.values import CHART_KEY
from statifier.expr import UNDEFINED
from statifier.ids import new_execution_id
from statifier.persistence import MemoryAdapter, Stepped, prune
from statifier.sql import TableOptions, migrations

SRC = Path(__file__).parent.parent / "src"

DOOR = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
    '<datamodel><data id="knocks" expr="0"/></datamodel>'
    '<state id="open">'
    '<transition event="knock"><assign location="knocks" expr="knocks + 1"/></transition>'
    '<transition event="close" target="closed"/></state>'
    '<final id="closed"><donedata><param name="knocks" expr="knocks"/></donedata></final>'
    "</scxml>"
)

# Two top-level finals, reached from inside a parallel state.
CHECKOUT = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="working">'
    '<parallel id="working">'
    '<state id="payment" initial="unpaid"><state id="unpaid">'
    '<transition event="pay" target="paid"/></state><state id="paid"/></state>'
    '<state id="shipping" initial="packing"><state id="packing">'
    '<transition event="ship" target="shipped"/></state><state id="shipped"/></state>'
    '<transition event="abandon" target="abandoned"/>'
    '<transition event="finish" target="delivered"/>'
    "</parallel>"
    '<final id="delivered"/>'
    '<final id="abandoned">'
    '<donedata><param name="statifier_persistence:execution_status" expr="\'failed\'"/>'
    "</donedata></final>"
    "</scxml>"
)

COUNTER = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="counting">'
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="counting">'
    '<transition event="tick"><assign location="n" expr="n + 1"/></transition>'
    '<transition cond="n == 3" target="done"/></state>'
    '<final id="done"><donedata><param name="n" expr="n"/></donedata></final>'
    "</scxml>"
)


class Database:
    """A place to open a `Durable` on: a URL and the table options, fresh per test."""

    def __init__(self, backend: str, url: str, tables: TableOptions) -> None:
        self.backend, self.url, self.tables = backend, url, tables

    def durable(self, **options: object) -> Durable:
        charts = options.pop("charts", {"door": DOOR, "checkout": CHECKOUT})
        return Durable(self.url, charts=charts, tables=self.tables, **options)  # type: ignore[arg-type]


def _database(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Database]:
    if backend == "sqlite":
        yield Database("sqlite", f"sqlite:///{tmp_path / 'durable.db'}", TableOptions(prefix="d_"))
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_durable_")
    try:
        yield Database("postgresql", url, TableOptions(prefix="d_", schema=schema))
    finally:
        drop_schema(url, schema)


@pytest.fixture(params=("sqlite", "postgresql"))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """Each backend, empty: migrate it with ``migrate=True``."""
    yield from _database(request, request.param, tmp_path)


@pytest.fixture
def sqlite_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    yield from _database(request, "sqlite", tmp_path)


# The lifecycle.


@pytest.mark.asyncio
async def test_create_send_describe_on_each_backend(database: Database) -> None:
    async with database.durable(migrate=True) as durable:
        created = await durable.create("door", "door_1", metadata={"tenant": "acme"})
        assert (created.id, created.chart, created.status) == ("door_1", "door", Status.ACTIVE)
        assert (created.configuration, created.final_state, created.inputs) == (("open",), None, ())
        knocked = await durable.send("door_1", "knock", {"by": "me"})
        assert (knocked.delivered, knocked.matched, knocked.finished) == (True, True, False)
        assert (knocked.status, knocked.configuration, knocked.outcome) == (
            Status.ACTIVE,
            ("open",),
            UNDEFINED,
        )
        closed = await durable.send("door_1", "close")
        assert (closed.delivered, closed.finished, closed.status) == (True, True, Status.COMPLETED)
        assert (closed.configuration, closed.final_state, closed.outcome) == (
            (),
            "closed",
            {"knocks": 1},
        )
        description = await durable.describe("door_1")
    assert description.status is Status.COMPLETED
    assert description.finished
    assert (description.chart, description.final_state, description.configuration) == (
        "door",
        "closed",
        (),
    )
    assert description.outcome == {"knocks": 1}
    assert description.failure is None
    assert description.metadata == {"tenant": "acme"}  # the chart's own key is not shown
    assert [(i.seq, i.via, i.event and i.event.name) for i in description.inputs] == [
        (0, "step", "knock"),
        (1, "step", "close"),
    ]
    assert description.inputs[0].event is not None
    assert description.inputs[0].event.data == {"by": "me"}
    assert description.timers == ()
    assert description.position == "kept"
    assert description.created_at is not None
    assert description.ended_at is not None
    assert description.created_at.tzinfo is UTC or description.created_at.utcoffset() == timedelta(
        0
    )
    with pytest.raises(FrozenInstanceError):
        description.status = Status.ACTIVE  # type: ignore[misc]


@pytest.mark.asyncio
async def test_send_to_an_ended_execution_is_discarded_not_raised(database: Database) -> None:
    async with database.durable(migrate=True) as durable:
        await durable.create("door", "door_1")
        await durable.send("door_1", "close")
        late = await durable.send("door_1", "knock")
        inputs = (await durable.describe("door_1")).inputs
    assert (late.delivered, late.matched, late.finished) == (False, False, False)
    assert (late.status, late.final_state, late.outcome) == (
        Status.COMPLETED,
        "closed",
        {"knocks": 0},
    )
    assert len(inputs) == 1  # nothing was recorded


@pytest.mark.asyncio
async def test_final_state_is_the_top_level_final_the_chart_ended_in(database: Database) -> None:
    async with database.durable(migrate=True) as durable:
        await durable.create("checkout", "c1")
        paid = await durable.send("c1", "pay")
        assert paid.configuration == ("packing", "paid")
        done = await durable.send("c1", "finish")
        await durable.create("checkout", "c2")
        gave_up = await durable.send("c2", "abandon")
        # The finishing step's Done names the same final the stored position gives.
        await durable.create("checkout", "c3")
        stepped = await durable.executions.step("c3", None, Event("abandon"))
        assert isinstance(stepped, Stepped)
        described = [await durable.describe(i) for i in ("c1", "c2", "c3")]
    assert (done.final_state, done.status) == ("delivered", Status.COMPLETED)
    assert (gave_up.final_state, gave_up.status, gave_up.failure) == (
        "abandoned",
        Status.FAILED,
        "failed_final",
    )
    ending = stepped.effects[-1]
    assert isinstance(ending, Done)
    assert ending.configuration == ("abandoned",)
    assert [(d.final_state, d.configuration) for d in described] == [
        ("delivered", ()),
        ("abandoned", ()),
        ("abandoned", ()),
    ]


@pytest.mark.asyncio
async def test_cancel_and_list(database: Database) -> None:
    async with database.durable(migrate=True) as durable:
        await durable.create("door", "a", metadata={"tenant": "acme"})
        await durable.create("checkout", "b", metadata={"tenant": "acme"})
        await durable.create("door", "c", metadata={"tenant": "other"})
        cancelled = await durable.cancel("a")
        again = await durable.cancel("a")
        described = await durable.describe("a")
        everything = await durable.list()
        active = await durable.list("active")
        acme_doors = await durable.list(chart="door", tenant="acme")
        by_enum = await durable.list(Status.CANCELLED)
        with pytest.raises(ValueError, match="unknown status 'actve'; the statuses are active"):
            await durable.list("actve")
    assert (cancelled.cancelled, cancelled.status) == (True, Status.CANCELLED)
    assert (again.cancelled, again.status) == (False, Status.CANCELLED)
    assert (described.configuration, described.final_state, described.outcome) == (
        (),
        None,
        UNDEFINED,
    )
    assert [(row.id, row.chart, row.status.value) for row in everything] == [
        ("a", "door", "cancelled"),
        ("b", "checkout", "active"),
        ("c", "door", "active"),
    ]
    assert [row.id for row in active] == ["b", "c"]
    assert [row.id for row in acme_doors] == ["a"]
    assert [row.id for row in by_enum] == ["a"]
    assert by_enum[0].metadata == {"tenant": "acme"}


@pytest.mark.asyncio
async def test_a_paused_execution_holds_what_is_sent_and_takes_it_on_resume(
    database: Database,
) -> None:
    async with database.durable(migrate=True) as durable:
        await durable.create("door", "d")
        await durable.send("d", "knock")
        assert await durable.pause("d") is True
        held = [await durable.send("d", name) for name in ("knock", "knock", "close")]
        paused = await durable.describe("d")
        resumed = await durable.resume("d")
        ended = await durable.describe("d")
        assert await durable.resume("d") is None
        await durable.create("door", "e")
        await durable.pause("e")
        await durable.send("e", "knock")
        cancelled = await durable.cancel("e")
    assert [(s.delivered, s.held, s.status) for s in held] == [(False, True, Status.PAUSED)] * 3
    assert held[0].as_json()["held"] is True
    assert (paused.status, len(paused.inputs)) == (Status.PAUSED, 1)
    assert resumed is not None
    assert (resumed.stepped, resumed.discarded, resumed.status) == (3, 0, Status.COMPLETED)
    assert [i.event.name for i in ended.inputs if i.event] == ["knock", "knock", "knock", "close"]
    assert ended.outcome == {"knocks": 3}
    assert cancelled.cancelled is True


# Sends in one transaction.

REMINDER = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">'
    '<state id="idle"><transition event="remind"><send event="ping" delay="3600s"/>'
    "</transition></state></scxml>"
)


def _answered(sent: Sent) -> tuple[object, ...]:
    """What a send answered, but its execution's id and timers."""
    said = (sent.delivered, sent.held, sent.matched, sent.finished, sent.status, sent.errors)
    ended = (sent.configuration, sent.final_state, sent.outcome, sent.failure)
    return (sent.event, *said, *ended)


@pytest.mark.asyncio
async def test_send_many_answers_what_each_send_would_at_its_turn(database: Database) -> None:
    plan = [
        ("a", "knock"),
        ("b", "knock"),
        ("a", "knock"),
        ("t", "remind"),
        ("a", "close"),
        ("a", "knock"),  # ended by the close before it: discarded
        ("p", "knock"),  # paused: held for its resume
        ("b", "knock"),
        ("t", "remind"),
    ]
    charts = {"door": DOOR, "reminder": REMINDER}
    async with database.durable(migrate=True, charts=charts) as durable:
        for side in ("alone", "together"):
            await durable.create("door", f"{side}-a")
            await durable.create("door", f"{side}-b")
            await durable.create("reminder", f"{side}-t")
            await durable.create("door", f"{side}-p")
            await durable.pause(f"{side}-p")
        alone = [await durable.send(f"alone-{name}", event) for name, event in plan]
        together = await durable.send_many([Send(f"together-{n}", e) for n, e in plan])
        described = {name: await durable.describe(f"together-{name}") for name in "abp"}
        resumed = await durable.resume("together-p")
    assert [_answered(sent) for sent in together] == [_answered(sent) for sent in alone]
    assert [sent.execution_id for sent in together] == [f"together-{n}" for n, _ in plan]
    assert described["a"].outcome == {"knocks": 2}
    assert [i.event.name for i in described["b"].inputs if i.event] == ["knock", "knock"]
    # The timers are the execution's after the batch, the last send's alone's.
    assert [timer.event for timer in together[8].timers] == ["ping", "ping"]
    assert together[3].timers == together[8].timers
    assert [(t.event, t.kind) for t in together[3].timers] == [
        (t.event, t.kind) for t in alone[8].timers
    ]
    assert len(together[3].notices) == 1  # no worker runs here to fire them
    assert (together[5].delivered, together[6].held) == (False, True)
    assert described["p"].status is Status.PAUSED
    assert resumed is not None
    assert resumed.stepped == 1


@pytest.mark.asyncio
async def test_send_many_commits_every_send_or_none(database: Database) -> None:
    async with database.durable(migrate=True) as durable:
        await durable.create("door", "a")
        batch = [Send("a", "knock"), Send("nobody", "knock"), Send("a", "close")]
        with pytest.raises(ExecutionNotFound) as raised:
            await durable.send_many(batch)
        kept = await durable.describe("a")
        assert await durable.send_many([]) == []
        with pytest.raises(TypeError, match="Send values"):
            await durable.send_many([("a", "knock")])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="an event name"):
            await durable.send_many([Send("a", "knock"), Send("a", "")])
        after = await durable.describe("a")
    assert "send 2 of 3: 'knock' to 'nobody'" in " ".join(raised.value.__notes__)
    assert (kept.inputs, kept.status) == ((), Status.ACTIVE)
    assert after.inputs == ()  # the refused batches stepped nothing either


@pytest.mark.asyncio
async def test_a_batch_of_sends_runs_the_same_statements_whatever_its_size(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL: the locks, the reads, the steps' writes and the timers of a batch
    are one statement each, for 3 sends as for 30."""
    import psycopg

    statements: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(cursor: Any, query: Any, *args: Any, **options: Any) -> Any:
        statements.append(str(query))
        return await execute(cursor, query, *args, **options)

    runs: dict[int, list[str]] = {}
    for database in _database(request, "postgresql", tmp_path):
        async with database.durable(migrate=True, charts={"door": DOOR}) as durable:
            for index in range(30):
                await durable.create("door", f"d{index}")
            for size in (3, 30):
                statements.clear()
                with monkeypatch.context() as patch:
                    patch.setattr(psycopg.AsyncCursor, "execute", counted)
                    sent = await durable.send_many(
                        [Send(f"d{index}", "knock") for index in range(size)]
                    )
                assert all(answer.delivered for answer in sent)
                runs[size] = list(statements)
            described = await durable.describe("d1")
        assert [i.event.name for i in described.inputs if i.event] == ["knock", "knock"]
    assert len(runs[3]) == len(runs[30]), (runs[3], runs[30])
    assert len(runs[3]) <= 6, runs[3]


# Errors that say what to do.


@pytest.mark.asyncio
async def test_an_unmigrated_database_says_to_run_db_upgrade(database: Database) -> None:
    with pytest.raises(NotMigrated) as refused:
        await database.durable().open()
    message = str(refused.value)
    assert "has no tables for durable executions" in message
    assert "run `statifier db upgrade --url " in message
    assert "--prefix d_" in message
    assert message.endswith("or pass migrate=True")
    assert refused.value.revision is None
    assert refused.value.head == "statifier_0029"
    if database.backend == "sqlite":  # checking did not leave an empty file behind
        assert not _exists(database.url.removeprefix("sqlite:///"))
    else:
        assert f"--schema {database.tables.schema}" in message
    migrations.upgrade(database.url, database.tables, "statifier_0001")
    with pytest.raises(NotMigrated, match="at revision statifier_0001, this statifier needs"):
        await database.durable().open()
    async with database.durable(migrate=True) as durable:  # migrating fixes it
        await durable.create("door", "d1")
    async with database.durable() as durable:  # and checking then passes
        assert (await durable.describe("d1")).status is Status.ACTIVE


@pytest.mark.asyncio
async def test_unknown_names_are_refused_with_the_known_ones(sqlite_database: Database) -> None:
    async with sqlite_database.durable(migrate=True) as durable:
        with pytest.raises(UnknownChart) as unknown:
            await durable.create("dor")
        await durable.create("door", "d1")
        with pytest.raises(ExecutionExists, match="execution 'd1' already exists"):
            await durable.create("door", "d1")
        for call in (
            durable.send("nope", "close"),
            durable.describe("nope"),
            durable.cancel("nope"),
        ):
            with pytest.raises(ExecutionNotFound, match="no execution 'nope'"):
                await call
        with pytest.raises(TypeError, match="an event name is a non-empty str"):
            await durable.send("d1", {"amount": 42})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"keys starting with 'statifier\.'"):
            await durable.create("door", metadata={CHART_KEY: "x"})
    assert str(unknown.value) == (
        "no chart named 'dor' (did you mean 'door'?); the charts are: checkout, door"
    )
    assert isinstance(unknown.value, LookupError)


def test_charts_that_cannot_be_used_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(ChartUnusable, match=r"chart 'door' \(.*missing.scxml\): cannot read"):
        Durable("sqlite:///x.db", charts={"door": str(tmp_path / "missing.scxml")})
    broken = (
        '<scxml xmlns="http://www.w3.org/2005/07/scxml">'
        '<state id="a"><transition target="b"/></state></scxml>'
    )
    with pytest.raises(
        ChartUnusable, match=r"chart 'bad' \(source\): 1:\d+: no state has the id 'b'"
    ):
        Durable("sqlite:///x.db", charts={"bad": broken})
    with pytest.raises(ChartUnusable, match="not a directory"):
        Durable("sqlite:///x.db", charts=str(tmp_path / "nowhere"))


@pytest.mark.asyncio
async def test_not_open_and_bad_urls() -> None:
    assert (
        repr(Durable("postgresql://me:secret@db/app"))
        == "Durable(postgresql://me:***@db/app, charts=[])"
    )
    durable = Durable("mysql://localhost/app")
    with pytest.raises(RuntimeError, match="open the Durable first"):
        durable.executions  # noqa: B018 - the property raises
    with pytest.raises(ValueError, match="PostgreSQL or SQLite, not 'mysql://localhost/app'"):
        await durable.open()
    with pytest.raises(ValueError, match="in-memory SQLite database lasts one connection"):
        await Durable("sqlite://").open()


# Charts, ids, data.


@pytest.mark.asyncio
async def test_charts_by_directory_path_source_and_machine(
    sqlite_database: Database, tmp_path: Path
) -> None:
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / "door.scxml").write_text(DOOR, encoding="utf-8")
    (tmp_path / "charts" / "notes.txt").write_text("not a chart", encoding="utf-8")
    by_directory = Durable("sqlite:///x.db", charts=tmp_path / "charts")
    assert sorted(by_directory.charts) == ["door"]
    machine = compile_chart(COUNTER)
    charts = {
        "path": str(tmp_path / "charts" / "door.scxml"),
        "pathlike": tmp_path / "charts" / "door.scxml",
        "bytes": DOOR.encode(),
        "text": "\n  " + DOOR,
        "machine": machine,
    }
    durable = sqlite_database.durable(charts=charts, migrate=True)
    assert durable.charts["machine"] is machine
    hashes = {m.identity.content_hash for name, m in durable.charts.items() if name != "machine"}
    assert len(hashes) == 2  # the file and the source differ only by the leading blank
    async with durable:
        created = await durable.create("machine")
        assert created.id.startswith("ex_")
        assert created.chart == "machine"
        assert created.configuration == ("counting",)


def test_minted_ids_are_ulids_that_sort_by_time() -> None:
    first = new_execution_id()
    assert first.startswith("ex_")
    assert len(first) == 29
    assert set(first[3:]) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    later = [new_execution_id() for _ in range(5)]
    assert first[3:13] <= later[-1][3:13]  # the time part


@pytest.mark.asyncio
async def test_data_overrides_the_datamodel_and_event_data_keeps_null_apart(
    sqlite_database: Database,
) -> None:
    async with sqlite_database.durable(migrate=True) as durable:
        await durable.create("door", "d1", data={"knocks": 40})
        await durable.send("d1", "knock", None)
        await durable.send("d1", "knock")
        closed = await durable.send("d1", "close")
        inputs = (await durable.describe("d1")).inputs
        with pytest.raises(TypeError, match="data maps variable names to values"):
            await durable.create("door", data=[1])  # type: ignore[arg-type]
    assert closed.outcome == {"knocks": 42}
    # The start data opens the log (via "create"), so a replay starts where d1 did.
    assert [i.via for i in inputs] == ["create", "step", "step", "step"]
    assert [i.event.data if i.event else "marker" for i in inputs] == [
        {"knocks": 40},
        None,
        UNDEFINED,
        UNDEFINED,
    ]


@pytest.mark.asyncio
async def test_an_adapter_given_is_used_and_left_open() -> None:
    adapter = MemoryAdapter()
    async with Durable(adapter, charts={"door": DOOR}) as durable:
        await durable.create("door", "d1")
        await durable.send("d1", "close")
    async with Durable(adapter) as durable:  # no charts: the stored one runs
        description = await durable.describe("d1")
        assert description.chart == "door"  # filed at create
        assert (await durable.send("d1", "close")).delivered is False


@pytest.mark.asyncio
async def test_a_pruned_execution_says_so(sqlite_database: Database) -> None:
    async with sqlite_database.durable(migrate=True) as durable:
        await durable.create("door", "d1")
        await durable.send("d1", "close")
        await prune(durable.executions.storage, datetime.now(UTC) + timedelta(days=1))
        description = await durable.describe("d1")
    assert (description.position, description.configuration, description.final_state) == (
        "pruned",
        (),
        None,
    )
    assert (description.status, description.outcome, description.inputs) == (
        Status.COMPLETED,
        {"knocks": 0},
        (),
    )


def _exists(path: str) -> bool:
    return Path(path).exists()


# Processes.

_CREATE = """
import asyncio, sys
from statifier.durable import Durable
from statifier.sql import TableOptions

async def main():
    url, schema, name = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    tables = TableOptions(prefix="d_", schema=schema)
    async with Durable(url, charts={"door": sys.argv[4]}, tables=tables, migrate=True) as d:
        await d.create("door", name)

asyncio.run(main())
"""


def test_three_processes_migrate_and_create_at_once(database: Database) -> None:
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    schema = database.tables.schema or ""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE, database.url, schema, f"p{n}", DOOR],
            env=environment,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    errors = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], errors

    async def listed() -> list[str]:
        async with database.durable() as durable:  # migrated: checking passes
            return sorted(row.id for row in await durable.list(chart="door"))

    assert asyncio.run(listed()) == ["p0", "p1", "p2"]


def test_describe_runs_in_a_fresh_loop_each_time(sqlite_database: Database) -> None:
    # A Durable is opened and closed inside each asyncio.run: scripts call it so.
    async def create() -> None:
        async with sqlite_database.durable(migrate=True) as durable:
            await durable.create("door", "d1")

    async def read() -> str:
        async with sqlite_database.durable() as durable:
            return (await durable.describe("d1")).status.value

    asyncio.run(create())
    assert asyncio.run(read()) == "active"
