"""`Durable` and `statifier executions` given bad or hostile input: every refusal is
typed and clear and changes nothing, what is stored is what the step saw, sizes are
bounded before the work they would cost, and a password in a database URL is never
repeated."""

from __future__ import annotations

import math
import random
import string
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.test_durable import DOOR, Database, _database
from tests.test_durable_migration import ORDER_V1, ORDER_V2
from tests.test_executions_command import Place, _place, cli

import statifier.durable
from statifier.durable import (
    ChartUnusable,
    Durable,
    ExecutionNotFound,
    InvalidMigrationPlan,
    Send,
)
from statifier.persistence import MemoryAdapter
from statifier.router.binding import MAX_BATCH

SCXML = 'xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"'

# Takes "check" only when the event's data is a list of two: a tuple or a map keyed
# by something other than strings is not a value of the language, a list is.
SHAPES = (
    f'<scxml {SCXML} initial="waiting"><state id="waiting">'
    '<transition event="check" cond="len(_event.data) == 2" target="checked"/>'
    '<transition event="lookup" cond="_event.data[\'1\'] == \'one\'" target="checked"/>'
    '</state><state id="checked"/></scxml>'
)

PASSWORD = "hunter2"
# URLs that carry a password and are refused before any connection is tried.
URLS_WITH_A_PASSWORD = [
    pytest.param(f"PostgreSQL://app:{PASSWORD}@db.internal/prod", id="mixed-case-scheme"),
    pytest.param(f"mysql://app@db.internal/prod?password={PASSWORD}", id="password-parameter"),
]


@pytest.fixture(params=("sqlite", "postgresql"))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    yield from _database(request, request.param, tmp_path)


@pytest.fixture
def sqlite_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    yield from _database(request, "sqlite", tmp_path)


@pytest.fixture
def sqlite_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    yield from _place(request, "sqlite", tmp_path)


def _errors_of_statifier_durable() -> tuple[type[BaseException], ...]:
    """The error classes `statifier.durable` exports, and the builtin kinds its
    Errors table names."""
    exported = (getattr(statifier.durable, name) for name in statifier.durable.__all__)
    classes = tuple(c for c in exported if isinstance(c, type) and issubclass(c, Exception))
    return (*classes, TypeError, ValueError)


# Database URLs.


@pytest.mark.asyncio
@pytest.mark.parametrize("url", URLS_WITH_A_PASSWORD)
async def test_a_database_password_is_never_repeated(url: str) -> None:
    """Neither `repr(durable)` nor the error of a URL `Durable` refuses repeats the
    password the URL carries."""
    durable = Durable(url)
    assert PASSWORD not in repr(durable)
    with pytest.raises(ValueError, match="PostgreSQL or SQLite") as refused:
        await durable.open()
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("url", URLS_WITH_A_PASSWORD)
def test_the_command_never_echoes_a_database_password(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`statifier executions` refuses such a URL in one line, status 2, without the
    password in it."""
    status, out, err = cli(capsys, "list", "--database", url)
    assert (status, out) == (2, "")
    assert err.startswith("statifier executions list: ")
    assert PASSWORD not in err


@pytest.mark.asyncio
async def test_a_file_path_given_for_a_database_url_is_a_value_error(tmp_path: Path) -> None:
    """A path where a URL belongs is refused as `open()` documents, a `ValueError`,
    saying what a SQLite URL looks like."""
    with pytest.raises(ValueError, match="sqlite:///"):
        await Durable(str(tmp_path / "app.db")).open()


# Execution ids and metadata.


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda durable: durable.describe(5), id="describe"),
        pytest.param(lambda durable: durable.send(5, "knock"), id="send"),
        pytest.param(lambda durable: durable.cancel(None), id="cancel"),
    ],
)
async def test_an_execution_id_of_the_wrong_kind_is_a_type_error(
    database: Database, call: Callable[[Durable], Awaitable[object]]
) -> None:
    """An execution id that is not a string is refused as a `TypeError` naming the
    execution id, on every backend, as `create` and `migrate` refuse one."""
    async with database.durable(migrate=True) as durable:
        with pytest.raises(TypeError, match="an execution id"):
            await call(durable)


_LONG_ID = "".join(random.Random(0).choices(string.ascii_letters + string.digits, k=10_000))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "execution_id",
    [
        pytest.param("order\x001", id="nul"),
        pytest.param(_LONG_ID, id="10000-characters"),
        pytest.param("order\ud8001", id="lone-surrogate"),
    ],
)
async def test_an_execution_id_a_database_cannot_hold_is_refused_alike_on_each(
    database: Database, execution_id: str
) -> None:
    """An execution id with a NUL or a lone surrogate, or thousands of characters
    long, is refused by `create` with a clear `TypeError` or `ValueError` naming the
    execution id, before the database sees it, on every backend alike; nothing is
    created."""
    async with database.durable(migrate=True) as durable:
        with pytest.raises((TypeError, ValueError), match="execution id"):
            await durable.create("door", execution_id)
        assert await durable.list() == ()


@pytest.mark.asyncio
async def test_metadata_a_database_cannot_hold_is_refused_alike_on_each(
    database: Database,
) -> None:
    """A metadata value or a `list` filter holding a NUL is refused with a
    `ValueError` before the database sees it, on every backend alike."""
    async with database.durable(migrate=True) as durable:
        with pytest.raises(ValueError, match="metadata"):
            await durable.create("door", "d1", metadata={"tenant": "acme\x00"})
        with pytest.raises(ValueError, match="metadata"):
            await durable.list(tenant="acme\x00")
        assert await durable.list() == ()


# Event data.


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"amount": math.nan}, id="nan"),
        pytest.param(b"42", id="bytes"),
        pytest.param({1, 2}, id="set"),
        pytest.param({(1, 2): "pair"}, id="tuple-key"),
    ],
)
async def test_event_data_outside_the_language_is_refused_with_a_documented_error(
    sqlite_database: Database, data: object
) -> None:
    """Event data that cannot be stored is refused with an error `statifier.durable`
    exports (or a `TypeError`/`ValueError`, as its Errors table says) that names the
    data, and nothing is recorded."""
    async with sqlite_database.durable(migrate=True) as durable:
        await durable.create("door", "d1")
        with pytest.raises(Exception) as refused:  # noqa: PT011 - the kind is the check
            await durable.send("d1", "knock", data)
        inputs = (await durable.describe("d1")).inputs
    assert isinstance(refused.value, _errors_of_statifier_durable()), repr(refused.value)
    assert "data" in str(refused.value)
    assert inputs == ()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("event", "data"),
    [
        pytest.param("check", (1, 2), id="tuple"),
        pytest.param("lookup", {1: "one"}, id="integer-key"),
    ],
)
async def test_the_input_log_holds_the_data_the_step_saw(
    sqlite_database: Database, event: str, data: Any
) -> None:
    """The event data an input log records is the data the step ran on: stepping the
    logged event again takes the same transitions (or the send is refused and nothing
    is logged)."""
    async with sqlite_database.durable(migrate=True, charts={"shapes": SHAPES}) as durable:
        await durable.create("shapes", "live")
        await durable.create("shapes", "replayed")
        try:
            live = await durable.send("live", event, data)
        except (TypeError, ValueError):
            assert (await durable.describe("live")).inputs == ()
            return
        logged = (await durable.describe("live")).inputs[-1].event
        assert logged is not None
        replayed = await durable.send("replayed", logged.name, logged.data)
    assert (replayed.matched, replayed.configuration) == (live.matched, live.configuration), (
        f"the step saw {data!r}; the log holds {logged.data!r}"
    )


# Batches.


@pytest.mark.asyncio
async def test_send_many_bounds_the_executions_of_one_batch(database: Database) -> None:
    """`send_many` refuses, with a `ValueError` before it takes any lock, a batch of
    more executions than a delivery batch of the router may hold (one transaction
    takes a lock per execution: on PostgreSQL, tens of thousands exhaust the server's
    shared lock table)."""
    sends = [Send(f"missing_{index}", "knock") for index in range(2 * MAX_BATCH)]
    async with database.durable(migrate=True) as durable:
        with pytest.raises(ValueError, match="at most"):
            await durable.send_many(sends)


@pytest.mark.asyncio
async def test_send_many_names_the_send_that_raised_on_every_adapter() -> None:
    """On the memory adapter too, the error of a batch names the send that raised in
    its notes, as `send_many` documents."""
    async with Durable(MemoryAdapter(), charts={"door": DOOR}) as durable:
        await durable.create("door", "a")
        with pytest.raises(ExecutionNotFound) as raised:
            await durable.send_many([Send("a", "knock"), Send("nobody", "knock")])
    assert "send 2 of 2: 'knock' to 'nobody'" in " ".join(getattr(raised.value, "__notes__", []))


# Charts.


def test_an_oversized_chart_file_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """A chart file larger than the reader's bound is refused as `ChartUnusable`
    having read little more than the bound (a 64 MiB file is not held in memory; a
    path to an endless file would never return)."""
    big = tmp_path / "big.scxml"
    with big.open("wb") as handle:
        handle.write(b"<scxml/>")
        handle.truncate(64 << 20)  # sparse: no disk is spent
    tracemalloc.start()
    try:
        with pytest.raises(ChartUnusable, match="limit"):
            Durable("sqlite:///unused.db", charts={"big": big})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held to refuse it"


def test_a_chart_path_that_cannot_be_read_names_the_chart() -> None:
    """A chart path the file system refuses outright (a NUL in it) is refused as
    `ChartUnusable` naming the chart, as a missing file is."""
    with pytest.raises(ChartUnusable, match=r"chart 'door' .*cannot read"):
        Durable("sqlite:///unused.db", charts={"door": "charts/door\x00.scxml"})


# Arguments of the wrong kind.


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda durable: durable.fire_due("now"), id="fire_due-now"),
        pytest.param(lambda durable: durable.list(tenant=5), id="list-metadata-value"),
    ],
)
async def test_a_call_argument_of_the_wrong_kind_is_a_type_error(
    sqlite_database: Database, call: Callable[[Durable], Awaitable[object]]
) -> None:
    """An argument of the wrong kind is refused as a `TypeError` (not an
    `AttributeError`, nor silently answered)."""
    async with sqlite_database.durable(migrate=True) as durable:
        with pytest.raises(TypeError):
            await call(durable)


def test_an_on_error_of_the_wrong_kind_is_a_type_error() -> None:
    """`on_error` that is neither a policy, its name, nor a mapping is refused as a
    `TypeError` at construction."""
    with pytest.raises(TypeError, match="on_error"):
        Durable("sqlite:///unused.db", charts={"door": DOOR}, on_error=5)  # type: ignore[arg-type]


# What the command prints.


def test_show_prints_control_characters_in_event_names_escaped(
    sqlite_place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """`statifier executions show` writes an event name as escapes where it holds what
    a terminal acts on (an escape sequence, a carriage return, a newline): a name sent
    through the HTTP API may carry them, and they must not reach the operator's
    terminal as they are."""
    sqlite_place.migrate()
    at = sqlite_place.options
    charts = ["--charts", str(sqlite_place.charts)]
    assert cli(capsys, "create", "door", "--id", "d1", *charts, *at)[0] == 0
    hostile = "knock\x1b]0;owned\x07\x1b[2J\r\nfake"
    cli(capsys, "send", "d1", hostile, *at)
    status, text, _ = cli(capsys, "show", "d1", *at)
    assert status == 0
    assert "\x1b" not in text
    assert "\r" not in text
    assert "knock\\x1b]0;owned\\x07\\x1b[2J\\r\\nfake" in text


# Migrations.


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "value",
    [pytest.param(math.nan, id="nan"), pytest.param(b"dhl", id="bytes")],
)
async def test_migrate_all_refuses_data_it_cannot_store_before_moving_any(
    tmp_path: Path, value: object
) -> None:
    """`migrate_all` with a value of `data` that cannot be stored raises
    `InvalidMigrationPlan` naming the variable, before any execution is tried, rather
    than answering every execution failed."""
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    async with Durable(url, charts={"order": ORDER_V1}, migrate=True) as old:
        await old.create("order", "o1")
    async with Durable(url, charts={"order": ORDER_V2}) as new:
        with pytest.raises(InvalidMigrationPlan, match="carrier"):
            await new.migrate_all("order", data={"carrier": value})
        assert (await new.describe("o1")).content_hash == old.chart("order").identity.content_hash
