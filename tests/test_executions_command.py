"""`statifier executions list|show|create|send|cancel`, run through the module's own
parser (`add_parser`) and runner (`run`), and from separate processes; ``list``'s
search options (``--key``, ``--scope``, ``--final``, ``--error``) on both databases,
every page of them, and their refusals."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import drop_schema, unique_name

from statifier import executions_command
from statifier.buckets import address_bucket, bucket_of
from statifier.console.queries import MAX_PAGE, MAX_SEARCH
from statifier.durable import Durable, Status
from statifier.sql import TableOptions, migrations
from statifier.sql.dialect import execution_lock_key

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

COUNTER = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="counting">'
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="counting">'
    '<transition event="tick"><assign location="n" expr="n + 1"/></transition>'
    '<transition cond="n == 3" target="done"/></state>'
    '<final id="done"><donedata><param name="n" expr="n"/></donedata></final>'
    "</scxml>"
)


# A payment whose amount may come as a string (the <assign> then fails) and whose
# timeout is a delayed send to itself, a second out.
ORDER = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed" datamodel="predicator">'
    '<datamodel><data id="amount" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paying">'
    '<assign location="amount" expr="_event.data.amount * 2"/>'
    '<send id="timeout" event="payment.timeout" delay="1s"/></transition></state>'
    '<state id="paying"><transition event="payment.timeout" target="expired"/></state>'
    '<final id="expired"/>'
    "</scxml>"
)


class Place:
    """A database for the command, and the options that name its tables."""

    def __init__(self, url: str, tables: TableOptions, charts: Path) -> None:
        self.url, self.tables, self.charts = url, tables, charts

    @property
    def options(self) -> list[str]:
        given = ["--database", self.url, "--prefix", self.tables.prefix]
        if self.tables.schema is not None:
            given += ["--schema", self.tables.schema, "--locks", self.tables.locks]
        return given

    def migrate(self) -> None:
        migrations.upgrade(self.url, self.tables)


def _place(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Place]:
    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "door.scxml").write_text(DOOR, encoding="utf-8")
    (charts / "counter.scxml").write_text(COUNTER, encoding="utf-8")
    (charts / "order.scxml").write_text(ORDER, encoding="utf-8")
    if backend == "sqlite":
        yield Place(f"sqlite:///{tmp_path / 'cli.db'}", TableOptions(prefix="c_"), charts)
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_cli_")
    locks: Literal["advisory", "rows"] = "rows" if backend == "postgresql_rows" else "advisory"
    try:
        yield Place(url, TableOptions(prefix="c_", schema=schema, locks=locks), charts)
    finally:
        drop_schema(url, schema)


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """Each backend, empty (``place.migrate()`` builds the tables)."""
    yield from _place(request, request.param, tmp_path)


@pytest.fixture(params=("sqlite", "postgresql", "postgresql_rows"))
def locking_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """Each backend, and PostgreSQL whose locks are rows (``--locks rows``), empty."""
    yield from _place(request, request.param, tmp_path)


@pytest.fixture
def sqlite_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    yield from _place(request, "sqlite", tmp_path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statifier")
    parser.add_argument("--debug", action="store_true")
    executions_command.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``statifier executions ARGV``: the status, stdout and stderr."""
    out = io.StringIO()
    status = executions_command.run(_parser().parse_args(["executions", *argv]), out)
    return status, out.getvalue(), capsys.readouterr().err


def test_bulk_acts_on_what_a_search_selects_once_confirmed(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    for name in ("d1", "d2", "d3"):
        assert cli(capsys, "create", "door", "--id", name, *at, *charts)[0] == 0
    assert cli(capsys, "send", "d3", "close", *at)[0] == 0
    unconfirmed = cli(capsys, "bulk", "pause", *at)
    assert unconfirmed[0] == 2
    assert "confirm with --yes to pause: 2 executions" in unconfirmed[2]
    status, text, _ = cli(capsys, "bulk", "pause", "--chart", "door", "--yes", *at)
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == "2 executions selected to pause"
    assert lines[1].startswith("bulk run ")  # its row, which the console shows
    assert lines[-1].startswith("pause: 2 done, 0 skipped, 0 failed (audited as cli:")
    assert cli(capsys, "bulk", "pause", "--yes", *at)[1] == "0 executions selected to pause\n"
    resumed = cli(capsys, "bulk", "resume", "--status", "paused", "--yes", *at)
    assert resumed[1].splitlines()[-1].startswith("resume: 2 done, 0 skipped, 0 failed")
    listed = json.loads(cli(capsys, "list", "--json", *at)[1])
    assert sorted((row["id"], row["status"]) for row in listed) == [
        ("d1", "active"),
        ("d2", "active"),
        ("d3", "completed"),
    ]


def test_bulk_migrates_onto_the_charts_given_or_a_stored_revision_and_retries_dead_rows(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    for name in ("d1", "d2"):
        assert cli(capsys, "create", "door", "--id", name, *at, *charts)[0] == 0
    # The revision renames "open": without a map each execution is parked, with one moved.
    (place.charts / "door.scxml").write_text(DOOR.replace('"open"', '"ajar"'), encoding="utf-8")
    parked = cli(capsys, "bulk", "migrate", "--chart", "door", "--yes", *at, *charts)
    assert parked[0] == 1
    assert parked[1].splitlines()[-1].startswith("migrate: 0 done, 0 skipped, 0 failed, 2 parked")
    moved = cli(
        capsys, "bulk", "migrate", "--chart", "door", "--map", "open=ajar", "--yes", *at, *charts
    )
    assert moved[0] == 0, moved
    assert moved[1].splitlines()[-1].startswith("migrate: 2 done, 0 skipped, 0 failed (audited")
    shown = json.loads(cli(capsys, "show", "d1", "--json", *at)[1])
    assert (shown["status"], shown["configuration"]) == ("active", ["ajar"])
    revision = shown["content_hash"]
    # An execution of another chart is never one a revision of the door selects.
    assert cli(capsys, "create", "counter", "--id", "c1", *at, *charts)[0] == 0
    again = cli(capsys, "bulk", "migrate", "--revision", revision, "--yes", *at)
    assert again == (0, "0 executions selected to migrate to revision " + revision[:12] + "\n", "")
    unknown = cli(capsys, "bulk", "migrate", "--revision", "0" * 64, "--yes", *at)
    assert unknown[0] == 2
    assert "0000000000" in unknown[2]
    needs = cli(capsys, "bulk", "migrate", "--yes", *at)
    assert needs[0] == 2
    assert "migrate needs --revision HASH, or --charts DIR with --chart NAME" in needs[2]
    nothing_dead = cli(capsys, "bulk", "retry", "--yes", *at)
    assert nothing_dead == (0, "0 executions selected to retry the dead outbox rows\n", "")


def test_pause_holds_what_is_sent_and_resume_steps_it_in(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    assert cli(capsys, "create", "door", "--id", "d1", *at, *charts)[0] == 0
    assert cli(capsys, "pause", "d1", *at) == (
        0,
        "d1: paused; what is sent to it waits for the resume\n",
        "",
    )
    assert cli(capsys, "pause", "d1", *at)[:2] == (
        1,
        "d1: not paused: it is not active (paused); nothing changed\n",
    )
    held = cli(capsys, "send", "d1", "close", *at)
    assert held == (0, "d1: close held: the execution is paused; it is stepped in on resume\n", "")
    assert cli(capsys, "resume", "d1", *at) == (
        0,
        "d1: resumed; 1 held events stepped in; completed\n",
        "",
    )
    again = json.loads(cli(capsys, "resume", "d1", "--json", *at)[1])
    assert again == {"execution_id": "d1", "resumed": False, "status": "completed"}


def test_create_send_show_list_cancel(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    created = cli(capsys, "create", "door", "--id", "d1", "--metadata", "tenant=acme", *at, *charts)
    assert created == (0, "d1: created, active in open\n", "")
    assert cli(capsys, "send", "d1", "knock", *at) == (0, "d1: knock taken; active in open\n", "")
    assert cli(capsys, "send", "d1", 'knock={"by": "me"}', *at)[0] == 0
    unmatched = cli(capsys, "send", "d1", "clsoe", *at)
    assert unmatched[1] == "d1: no transition took clsoe (it is in the input log); active in open\n"
    assert cli(capsys, "send", "d1", "close", *at)[1] == "d1: close taken; completed in closed\n"
    late = cli(capsys, "send", "d1", "knock", *at)
    assert late == (
        1,
        "d1: knock discarded: the execution has completed; nothing was recorded\n",
        "",
    )

    status, text, _ = cli(capsys, "show", "d1", *at)
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == "execution    d1"
    assert lines[1].startswith("chart        door (sha256:")
    assert lines[2:5] == [
        "status       completed",
        "final state  closed",
        'outcome      {"knocks": 2}',
    ]
    assert "metadata     tenant=acme" in lines
    assert lines[-7:] == [
        "errors       none",
        "inputs       4",
        "  0  step  knock",
        '  1  step  knock {"by": "me"}',
        "  2  step  clsoe",
        "  3  step  close",
        "timers       none",
    ]
    shown = json.loads(cli(capsys, "show", "d1", "--json", *at)[1])
    assert {key: shown[key] for key in ("status", "final_state", "outcome", "timers")} == {
        "status": "completed",
        "final_state": "closed",
        "outcome": {"knocks": 2},
        "timers": [],
    }
    assert [entry["event"] for entry in shown["inputs"]] == ["knock", "knock", "clsoe", "close"]
    assert shown["inputs"][1]["data"] == {"by": "me"}

    cli(capsys, "create", "door", "--id", "d2", *at, *charts)
    listed = cli(capsys, "list", *at)[1].splitlines()
    assert [line.split()[:-1] for line in listed] == [
        ["ID", "STATUS", "CHART", "ERRORS"],
        ["d1", "completed", "in", "closed", "door", "0"],
        ["d2", "active", "door", "0"],
    ]
    assert cli(capsys, "list", "--status", "cancelled", *at) == (0, "no executions\n", "")
    rows = json.loads(cli(capsys, "list", "--where", "tenant=acme", "--json", *at)[1])
    assert [(row["id"], row["metadata"]) for row in rows] == [("d1", {"tenant": "acme"})]

    assert cli(capsys, "cancel", "d2", *at) == (0, "d2: cancelled\n", "")
    again = cli(capsys, "cancel", "d2", *at)
    assert again == (
        1,
        "d2: not cancelled: it had already ended (cancelled); nothing changed\n",
        "",
    )
    status, text, _ = cli(capsys, "show", "d2", *at)
    assert "configuration  none (it ended in no final state)" in text.splitlines()


def test_send_and_show_tell_of_errors_and_timers_and_fire_fires_them(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    assert cli(capsys, "create", "order", "--id", "o1", *at, *charts)[0] == 0
    assert cli(capsys, "create", "order", "--id", "o2", *at, *charts)[0] == 0
    # The newcomer's mistake: taken, but the error is said and the status is 1.
    status, text, _ = cli(capsys, "send", "o1", 'pay={"amount": "12"}', *at)
    assert status == 1
    error = (
        "  error.execution at <assign>, line 1, column 198: '*' expects numbers, got a "
        "string (no transition took it)"
    )
    assert text.splitlines() == ["o1: pay taken; active in paying", error]
    shown = cli(capsys, "show", "o1", *at)[1].splitlines()
    assert ["errors", "1"] in [line.split() for line in shown]
    (line,) = [line for line in shown if "error.execution at <assign>" in line]
    assert "  step input 0  error.execution" in line
    assert ["timers", "none"] in [line.split() for line in shown]
    # A clean send: its timer waits for a worker, and the answer says so.
    status, text, _ = cli(capsys, "send", "o2", 'pay={"amount": 12}', *at)
    assert status == 0
    lines = text.splitlines()
    assert lines[0] == "o2: pay taken; active in paying"
    assert lines[1].startswith("  timer: payment.timeout (external, send timeout) due ")
    assert lines[2].startswith("  note: 1 timer pending")
    assert "`statifier executions run`" in lines[2]
    shown = cli(capsys, "show", "o2", *at)[1].splitlines()
    assert ["timers", "1"] in [line.split() for line in shown]
    # A second later the timer is due: fire fires it and the order expires.
    asyncio.run(asyncio.sleep(1.1))
    assert cli(capsys, "fire", *at) == (0, "1 timer fired\n", "")
    assert cli(capsys, "fire", *at) == (0, "0 timers fired\n", "")
    listed = cli(capsys, "list", *at)[1].splitlines()
    assert [line.split()[:-1] for line in listed[1:]] == [
        ["o1", "active", "order", "1"],
        ["o2", "completed", "in", "expired", "order", "0"],
    ]


def test_a_command_of_the_other_way_of_locking_is_refused(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A deployment whose locks are rows: a command without --locks rows would take
    # advisory locks, which would not keep its step apart from the services'.
    for place in _place(request, "postgresql_rows", tmp_path):
        migrations.prepare(place.url, place.tables, migrate=True)
        assert cli(capsys, "list", *place.options)[0] == 0
        assert place.options[-2:] == ["--locks", "rows"]
        status, out, err = cli(capsys, "list", *place.options[:-2])
        assert (status, out) == (2, "")
        assert err.startswith(
            'statifier executions list: the tables\' locks are "rows" (processes opened them '
            'so), not "advisory": open them with locks = "rows"'
        )


def test_errors_are_one_line_with_status_2(
    sqlite_place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    at = sqlite_place.options
    unmigrated = cli(capsys, "list", *at)
    assert unmigrated == (
        2,
        "",
        (
            f"statifier executions list: the database {sqlite_place.url} has no tables for durable "
            f"executions: run `statifier db upgrade --url {sqlite_place.url} --prefix c_` first\n"
        ),
    )
    sqlite_place.migrate()
    charts = ["--charts", str(sqlite_place.charts)]
    expected = {
        ("show", "nope"): "statifier executions show: no execution 'nope'\n",
        ("send", "nope", "close"): "statifier executions send: no execution 'nope'\n",
        ("create", "dor", *charts): (
            "statifier executions create: no chart named 'dor' (did you mean 'door'?); "
            "the charts are: counter, door, order\n"
        ),
        ("create", "door"): (
            "statifier executions create: create needs --charts DIR "
            "(DIR/CHART.scxml is the chart)\n"
        ),
        ("create", "door", "--data", "[1]", *charts): (
            "statifier executions create: --data is a JSON object of variable names, not '[1]'\n"
        ),
        ("send", "x", "pay={oops"): (
            "statifier executions send: the data of event 'pay' is not JSON: "
            "unexpected byte 0x6F at position 1\n"
        ),
        (
            "list",
            "--where",
            "tenant",
        ): "statifier executions list: --where takes KEY=VALUE, not 'tenant'\n",
        ("list", "--status", "done"): (
            "statifier executions list: unknown status 'done'; the statuses are active, "
            "needs_migration, paused, completed, failed, cancelled\n"
        ),
    }
    for argv, error in expected.items():
        assert cli(capsys, *argv, *at) == (2, "", error), argv


def test_debug_adds_the_traceback(sqlite_place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    sqlite_place.migrate()
    args = _parser().parse_args(["--debug", "executions", "show", "nope", *sqlite_place.options])
    assert executions_command.run(args, io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith("statifier executions show: no execution 'nope'\n")


def test_three_sends_from_three_processes(locking_place: Place) -> None:
    place = locking_place
    place.migrate()

    async def create() -> None:
        async with Durable(place.url, charts=place.charts, tables=place.tables) as durable:
            await durable.create("counter", "c1")

    asyncio.run(create())
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "statifier.executions_command", "executions"]
    processes = [
        subprocess.Popen(
            [*command, "send", "c1", "tick", *place.options],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    answers = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], answers
    outputs = sorted(out for out, _ in answers)
    assert outputs == [
        "c1: tick taken; active in counting\n",
        "c1: tick taken; active in counting\n",
        "c1: tick taken; completed in done\n",
    ]

    async def read() -> tuple[Status, str | None, object, int]:
        async with Durable(place.url, tables=place.tables) as durable:
            described = await durable.describe("c1")
        return described.status, described.final_state, described.outcome, len(described.inputs)

    assert asyncio.run(read()) == (Status.COMPLETED, "done", {"n": 3}, 3)
    if place.tables.schema is not None:
        # With --locks rows the processes took c1's row of the locks table; else none.
        engine = sa.create_engine(migrations.sync_url(place.url))
        try:
            with engine.connect() as connection:
                rows = connection.execute(
                    sa.text(f"SELECT count(*) FROM {place.tables.schema}.c_locks WHERE key = :k"),
                    {"k": execution_lock_key("c1")},
                ).scalar()
        finally:
            engine.dispose()
        assert rows == (1 if place.tables.locks == "rows" else 0)


def test_fire_stops_at_a_chart_that_sends_to_itself_without_end(
    sqlite_place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    sqlite_place.migrate()
    (sqlite_place.charts / "loop.scxml").write_text(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">'
        '<state id="s"><onentry><send event="again"/></onentry>'
        '<transition event="again" target="s"/></state></scxml>',
        encoding="utf-8",
    )
    at = sqlite_place.options
    charts = ["--charts", str(sqlite_place.charts)]
    assert cli(capsys, "create", "loop", "--id", "l1", *at, *charts)[0] == 0
    status, text, _ = cli(capsys, "fire", *at)
    assert status == 1
    assert text == (
        "100 timers fired; more are still due after 100 passes (a chart sending to itself "
        "without end?): run `statifier executions run`\n"
    )


# Searching: the console's query from the shell.

SEARCHED_AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _insert(place: Place, table: str, rows: list[dict[str, Any]]) -> None:
    tables = place.tables.define()
    engine = sa.create_engine(migrations.sync_url(place.url))
    try:
        with engine.begin() as connection:
            connection.execute(getattr(tables, table).insert(), rows)
    finally:
        engine.dispose()


def _ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines()[1:]]


def _seed(place: Place, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """d1 closed, d2 open, o1 raised error.execution; addresses of three of them."""
    place.migrate()
    at = place.options
    charts = ["--charts", str(place.charts)]
    for chart, execution_id in (("door", "d1"), ("door", "d2"), ("order", "o1")):
        created = cli(capsys, "create", chart, "--id", execution_id, *at, *charts)
        assert created[0] == 0, created
    assert cli(capsys, "send", "d1", "close", *at)[0] == 0
    assert cli(capsys, "send", "o1", 'pay={"amount": "12"}', *at)[0] == 1  # error.execution
    _insert(
        place,
        "addresses",
        [
            {
                "scope": s,
                "document": d,
                "key": k,
                "execution_id": e,
                "inserted_at": SEARCHED_AT,
                "bucket": address_bucket(s, d, k),
            }
            for s, d, k, e in (
                ("web", "door", "K-1", "d2"),
                ("web", "door", "shared", "d1"),
                ("shop", "order", "shared", "o1"),
            )
        ],
    )
    return at


def test_each_search_option_alone_and_with_the_others(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    at = _seed(place, capsys)
    expected = {
        ("--key", "K-1"): ["d2"],
        ("--key", "k-1"): [],  # exact
        ("--key", "shared"): ["d1", "o1"],  # oldest first, as the plain list
        ("--key", "shared", "--scope", "shop"): ["o1"],
        ("--key", "K-1", "--scope", "shop"): [],
        ("--scope", "web"): ["d1", "d2"],
        ("--final", "closed"): ["d1"],
        ("--final", "open"): [],  # a state it is in is no final state
        ("--error", "error.execution"): ["o1"],
        ("--error", "error.execution", "--final", "closed"): [],
        ("--key", "shared", "--chart", "door"): ["d1"],
        ("--key", "shared", "--status", "active"): ["o1"],
        ("--key", "shared", "--status", "completed", "--final", "closed"): ["d1"],
    }
    for argv, ids in expected.items():
        status, text, err = cli(capsys, "list", *argv, *at)
        assert (status, err) == (0, ""), argv
        assert (_ids(text) if ids else text) == (ids or "no executions\n"), argv
    status, text, _ = cli(capsys, "list", "--key", "shared", *at)
    lines = [line.split()[:-1] for line in text.splitlines()]
    assert lines == [
        ["ID", "STATUS", "CHART", "ERRORS"],
        ["d1", "completed", "in", "closed", "door", "0"],
        ["o1", "active", "order", "1"],
    ]
    # The JSON rows are the plain list's rows.
    searched = json.loads(cli(capsys, "list", "--key", "shared", "--json", *at)[1])
    plain = json.loads(cli(capsys, "list", "--json", *at)[1])
    assert searched == [row for row in plain if row["id"] in ("d1", "o1")]


def test_a_search_lists_every_page(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    place.migrate()
    count = 2 * MAX_PAGE + 3
    _insert(
        place,
        "executions",
        [
            {
                "execution_id": f"ex-{n:05d}",
                "content_hash": "h",
                "status": "completed",
                "metadata": {},
                "created_at": SEARCHED_AT + timedelta(seconds=n // 4),  # ties across page bounds
                "updated_at": SEARCHED_AT,
                "final_state": "done" if n % 2 else "other",
                "bucket": bucket_of(f"ex-{n:05d}"),
            }
            for n in range(count)
        ],
    )
    status, text, _ = cli(capsys, "list", "--final", "done", *place.options)
    assert status == 0
    assert _ids(text) == [f"ex-{n:05d}" for n in range(count) if n % 2]


def test_bad_searches_are_refused_in_one_line_with_status_2(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    command = "statifier executions list"
    expected = {
        ("--key", ""): f"{command}: key: a non-empty text, or None for any\n",
        ("--error", "e" * (MAX_SEARCH + 1)): (
            f"{command}: error: at most {MAX_SEARCH} characters, not {MAX_SEARCH + 1}\n"
        ),
        ("--final", "a\x00b"): f"{command}: final_state: a NUL character is never stored\n",
        ("--key", "k", "--status", "done"): (
            f"{command}: unknown status 'done'; the statuses are active, "
            "needs_migration, paused, completed, failed, cancelled\n"
        ),
    }
    for argv, error in expected.items():
        assert cli(capsys, "list", *argv, *at) == (2, "", error), argv


# A step of ``boom`` raises error.execution (``nothing`` is no variable): ``bomb`` takes
# no transition on it, ``caught`` takes one.
BOMB = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">'
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="on"><transition event="boom"><assign location="n" expr="1 / nothing"/>'
    "</transition>{catch}</state></scxml>"
)


def test_resume_says_the_errors_of_the_held_events_it_stepped_in(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    (place.charts / "bomb.scxml").write_text(BOMB.format(catch=""), encoding="utf-8")
    caught = BOMB.format(catch='<transition event="error.execution"/>')
    (place.charts / "caught.scxml").write_text(caught, encoding="utf-8")
    place.migrate()
    at = [*place.options, "--charts", str(place.charts)]
    for chart, execution_id in (("bomb", "direct"), ("bomb", "held"), ("caught", "taken")):
        assert cli(capsys, "create", chart, "--id", execution_id, *at)[0] == 0
    status, out, _ = cli(capsys, "send", "direct", "boom", *at)
    assert status == 1
    said = out.splitlines()[1]  # the error line `send` writes
    assert said.startswith("  error.execution at <assign>")
    assert said.endswith("(no transition took it)")

    # The same event held while paused, stepped in by the resume: the same line and 1.
    assert cli(capsys, "pause", "held", *at)[0] == 0
    assert cli(capsys, "send", "held", "boom", *at)[0] == 0  # held
    assert cli(capsys, "resume", "held", *at) == (
        1,
        f"held: resumed; 1 held events stepped in; active\n{said}\n",
        "",
    )
    assert cli(capsys, "pause", "held", *at)[0] == 0
    for _ in range(2):
        assert cli(capsys, "send", "held", "boom", *at)[0] == 0
    status, out, _ = cli(capsys, "resume", "held", "--json", *at)
    assert status == 1
    answer = json.loads(out)
    assert (answer["resumed"], answer["stepped"], answer["status"]) == (True, 2, "active")
    assert [(e["name"], e["taken"]) for e in answer["errors"]] == [("error.execution", False)] * 2

    # An error a transition took is said, as `send` says it, and is no failure.
    assert cli(capsys, "pause", "taken", *at)[0] == 0
    assert cli(capsys, "send", "taken", "boom", *at)[0] == 0
    status, out, _ = cli(capsys, "resume", "taken", *at)
    assert status == 0
    head, error = out.splitlines()
    assert head == "taken: resumed; 1 held events stepped in; active"
    assert error.startswith("  error.execution at <assign>")
    assert error.endswith("(a transition took it)")


# Three revisions of one chart: ``flow`` created on V1 and on V2, then migrated onto V3.
FLOW_V1 = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s1"><state id="s1">'
    '<transition event="go" target="end"/></state><final id="end"/></scxml>'
)
FLOW_V2 = FLOW_V1.replace('"s1"', '"s2"')
FLOW_V3 = (
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s1"><state id="s1"/>'
    '<state id="s2"/><state id="x"/><final id="end"/></scxml>'
)


def _flows(
    capsys: pytest.CaptureFixture[str], at: list[str], charts: Path, ids: tuple[str, str]
) -> dict[str, str]:
    """Create ``ids[0]`` on FLOW_V1 and ``ids[1]`` on FLOW_V2, leave FLOW_V3 as the
    chart given; answer each id's content hash."""
    for execution_id, chart in zip(ids, (FLOW_V1, FLOW_V2), strict=True):
        (charts / "flow.scxml").write_text(chart, encoding="utf-8")
        created = cli(capsys, "create", "flow", "--id", execution_id, *at, "--charts", str(charts))
        assert created[0] == 0, created
    (charts / "flow.scxml").write_text(FLOW_V3, encoding="utf-8")
    return _hashes(capsys, at, ids)


def _hashes(
    capsys: pytest.CaptureFixture[str], at: list[str], ids: tuple[str, ...] | dict[str, str]
) -> dict[str, str]:
    found = {}
    for execution_id in ids:
        status, out, err = cli(capsys, "show", execution_id, "--json", *at)
        assert status == 0, err
        found[execution_id] = json.loads(out)["content_hash"]
    return found


def test_a_plan_refused_for_one_revision_migrates_none(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = [*place.options]
    charts = ["--charts", str(place.charts)]
    before = _flows(capsys, at, place.charts, ("one", "two"))
    # Each map fits one revision only: whichever revision comes first, none moves.
    for state in ("s1", "s2"):
        status, out, err = cli(capsys, "migrate", "flow", "--map", f"{state}=x", *at, *charts)
        assert (status, out) == (2, "")
        assert err.startswith("statifier executions migrate: the old chart has no states")
        assert _hashes(capsys, at, before) == before
    # Without a map each state keeps its id on V3: both move.
    moved = cli(capsys, "migrate", "flow", *at, *charts)
    assert moved == (0, "flow: 2 migrated, 0 parked, 0 failed\n", "")
    after = _hashes(capsys, at, before)
    assert after["one"] == after["two"] != before["one"]


def test_migrate_says_what_it_moved_before_a_database_error_stopped_it(
    place: Place, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from statifier.persistence import Executions

    place.migrate()
    at = [*place.options]
    charts = ["--charts", str(place.charts)]
    before = _flows(capsys, at, place.charts, ("one", "two"))
    # The revision migrated second fails as a database going away would.
    first, second = sorted(before, key=before.__getitem__)
    migrate_all = Executions.migrate_all

    async def failing(self: Executions, content_hash: str, plan: Any, **options: Any) -> Any:
        if content_hash == before[second]:
            raise sqlite3.OperationalError("disk I/O error")
        return await migrate_all(self, content_hash, plan, **options)

    monkeypatch.setattr(Executions, "migrate_all", failing)
    said = (
        "flow: stopped by an error after 1 migrated, 0 parked, 0 failed (what moved stays "
        f"moved)\n  migrated {first}\n"
        "  (more may have moved in the revision it stopped in: run it again to finish)\n"
    )
    assert cli(capsys, "migrate", "flow", *at, *charts) == (
        2,
        said,
        "statifier executions migrate: database: disk I/O error\n",
    )
    after = _hashes(capsys, at, before)
    assert after[first] != before[first]
    assert after[second] == before[second]
    monkeypatch.undo()
    assert cli(capsys, "migrate", "flow", *at, *charts) == (
        0,
        "flow: 1 migrated, 0 parked, 0 failed\n",
        "",
    )


def test_migrate_over_stores_says_what_a_store_moved_before_another_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from statifier.persistence.shards import ShardMap

    urls = [f"sqlite:///{tmp_path / f'store{n}.db'}" for n in range(2)]
    for url in urls:
        migrations.upgrade(url)
    over = [option for url in urls for option in ("--shard", url)]
    charts = tmp_path / "charts"
    charts.mkdir()
    shard_map = ShardMap.even(2)
    # The first store's execution runs V1, the second's V2: the map fits the first's.
    first = next(f"a{n}" for n in range(100) if shard_map.store_of_id(f"a{n}") == 0)
    second = next(f"b{n}" for n in range(100) if shard_map.store_of_id(f"b{n}") == 1)
    before = _flows(capsys, over, charts, (first, second))
    status, out, err = cli(
        capsys, "migrate", "flow", "--map", "s1=x", "--json", *over, "--charts", str(charts)
    )
    assert status == 2
    refusal = "the old chart has no states with the ids ['s1']"
    assert json.loads(out) == {
        "migrated": [first],
        "parked": {},
        "unchanged": {},
        "failed": {},
        "error": refusal,
    }
    assert err == f"statifier executions migrate: {refusal}\n"
    after = _hashes(capsys, over, before)
    assert after[first] != before[first]
    assert after[second] == before[second]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ("[" * 600 + "]" * 600, "nesting deeper than"),
        ("9" * 5000, "number too long"),
        ('{"n": NaN}', "non-finite"),
    ],
)
def test_send_refuses_data_the_fronts_refuse_in_one_line(
    sqlite_place: Place, capsys: pytest.CaptureFixture[str], data: str, said: str
) -> None:
    sqlite_place.migrate()
    at = [*sqlite_place.options, "--charts", str(sqlite_place.charts)]
    assert cli(capsys, "create", "door", "--id", "d1", *at)[0] == 0
    status, _, err = cli(capsys, "send", "d1", f"knock={data}", *sqlite_place.options)
    assert status == 2
    assert err.startswith("statifier executions send: the data of event 'knock' is not JSON: ")
    assert said in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_bulk_run_stopped_by_a_signal_says_so_and_the_same_command_does_the_rest(
    place: Place, signum: signal.Signals
) -> None:
    place.migrate()

    async def create() -> None:
        async with Durable(place.url, charts=place.charts, tables=place.tables) as durable:
            for n in range(600):
                await durable.create("counter", f"c{n}")

    asyncio.run(create())
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "statifier.executions_command", "executions"]
    bulk = [*command, "bulk", "pause", "--yes", *place.options]
    process = subprocess.Popen(bulk, env=environment, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    assert lines[0] == "600 executions selected to pause\n"
    assert lines[2].startswith("  200 seen: 200 done"), lines  # a page in: mid-run
    process.send_signal(signum)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, rest
    assert rest.splitlines()[-1].startswith(f"pause: stopped by {signum.name}: ")
    engine = sa.create_engine(migrations.sync_url(place.url))
    executions = place.tables.define().executions
    try:
        with engine.connect() as connection:
            statement = sa.select(sa.func.count()).where(executions.c.status == "paused")
            paused = int(connection.execute(statement).scalar_one())
    finally:
        engine.dispose()
    assert 200 <= paused < 600
    again = subprocess.run(bulk, env=environment, capture_output=True, text=True, check=True)
    assert again.stdout.splitlines()[0] == f"{600 - paused} executions selected to pause"
    assert again.stdout.splitlines()[-1].startswith(f"pause: {600 - paused} done, 0 skipped")
