"""A SQLite transaction's commit on a worker thread (``commit_in_thread``): where it
runs, that the loop runs other tasks meanwhile, that a cancellation waits for it, and
where it does not apply. A router batch commits so; one delivery does not."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy as sa

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, InboundEvent, Routed, Router, RouterConfig, StaticResolver
from statifier.sql import migrations
from statifier.sql.engines import sqlite_engine

COMMIT_TAKES = 0.3
"""How long a commit is held up in the tests that need it under way."""


class Commits:
    """What a connection's trace says of its ``COMMIT`` statements: the thread each ran
    on; with ``slow``, each held up ``COMMIT_TAKES`` seconds in its thread first."""

    def __init__(self, slow: bool = False) -> None:
        self.threads: list[int] = []
        self.started = threading.Event()
        self.slow = slow

    def __call__(self, statement: str) -> None:
        if statement.strip().upper() != "COMMIT":
            return
        self.threads.append(threading.get_ident())
        self.started.set()
        if self.slow:
            time.sleep(COMMIT_TAKES)


@pytest.fixture(name="path")
def _path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest_asyncio.fixture(name="adapter")
async def _adapter(path: Path) -> AsyncIterator[SqlAdapter]:
    adapter = SqlAdapter(f"sqlite:///{path}")
    yield adapter
    await adapter.close()


async def _insert(
    adapter: SqlAdapter, trace: Callable[[str], None], value: int, in_thread: bool
) -> None:
    async with adapter.transaction(commit_in_thread=in_thread) as tx:
        tx.driver.set_trace_callback(trace)
        tx.driver.execute("CREATE TABLE IF NOT EXISTS t (value INTEGER)")
        tx.driver.execute("INSERT INTO t VALUES (?)", (value,))


def _values(path: Path) -> list[int]:
    with sqlite3.connect(path) as reader:
        return [value for (value,) in reader.execute("SELECT value FROM t ORDER BY value")]


@pytest.mark.asyncio
async def test_a_commit_in_a_thread_runs_off_the_loop_and_commits(
    adapter: SqlAdapter, path: Path
) -> None:
    commits = Commits()
    await _insert(adapter, commits, 1, in_thread=True)
    await _insert(adapter, commits, 2, in_thread=False)
    loop_thread = threading.get_ident()
    assert len(commits.threads) == 2
    assert commits.threads[0] != loop_thread
    assert commits.threads[1] == loop_thread
    assert _values(path) == [1, 2]


@pytest.mark.asyncio
async def test_the_loop_runs_other_tasks_while_a_commit_is_under_way(adapter: SqlAdapter) -> None:
    commits = Commits(slow=True)
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(ticking())
    try:
        await asyncio.sleep(0)
        before = ticks
        await _insert(adapter, commits, 1, in_thread=True)
        in_thread = ticks - before
        before = ticks
        await _insert(adapter, commits, 2, in_thread=False)
        on_loop = ticks - before
    finally:
        ticker.cancel()
    assert in_thread >= 5  # about COMMIT_TAKES / 0.01 ticks while the commit ran
    assert on_loop <= 2  # the commit held the loop


@pytest.mark.asyncio
async def test_a_cancellation_during_the_commit_is_raised_once_the_commit_ended(
    adapter: SqlAdapter, path: Path
) -> None:
    commits = Commits(slow=True)
    inserting = asyncio.create_task(_insert(adapter, commits, 1, in_thread=True))
    async with asyncio.timeout(5.0):
        while not commits.started.is_set():  # noqa: ASYNC110 - polled
            await asyncio.sleep(0.005)
    cancelled_at = time.monotonic()
    inserting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inserting
    # Raised after the commit's thread let go of the connection, not at once.
    assert time.monotonic() - cancelled_at >= COMMIT_TAKES / 2
    assert _values(path) == [1]
    # The writer is free and the connection out of any transaction: the next goes through.
    async with asyncio.timeout(5.0):
        await _insert(adapter, Commits(), 2, in_thread=True)
    assert _values(path) == [1, 2]


@pytest.mark.asyncio
async def test_a_commit_that_fails_in_the_thread_rolls_back_and_frees_the_writer(
    adapter: SqlAdapter, path: Path
) -> None:
    await _insert(adapter, Commits(), 1, in_thread=True)
    async with adapter.transaction() as tx:
        driver = tx.driver
        driver.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        driver.execute("CREATE TABLE child (parent INTEGER REFERENCES parent (id))")
    driver.execute("PRAGMA foreign_keys = ON")  # outside a transaction, or a no-op

    async def orphan() -> None:
        async with adapter.transaction(commit_in_thread=True) as tx:
            # Checked at the commit: the error comes from the commit's thread.
            tx.driver.execute("PRAGMA defer_foreign_keys = ON")
            tx.driver.execute("INSERT INTO t VALUES (2)")
            tx.driver.execute("INSERT INTO child VALUES (7)")

    with pytest.raises(sqlite3.IntegrityError):
        await orphan()
    assert _values(path) == [1]
    await _insert(adapter, Commits(), 3, in_thread=True)
    assert _values(path) == [1, 3]


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["engine", "check_same_thread", "memory"])
async def test_a_connection_not_opened_for_any_thread_commits_on_the_loop(
    where: str, path: Path
) -> None:
    engine: sa.Engine | None = None
    if where == "engine":  # the caller's engine: how it opens connections is its own
        engine = sqlite_engine(f"sqlite:///{path}")
        adapter = SqlAdapter(engine)
    elif where == "check_same_thread":
        adapter = SqlAdapter(f"sqlite:///{path}?check_same_thread=true")
    else:
        adapter = SqlAdapter("sqlite://")
    commits = Commits()
    try:
        await _insert(adapter, commits, 1, in_thread=True)
    finally:
        await adapter.close()
        if engine is not None:
            engine.dispose()
    assert commits.threads == [threading.get_ident()]


METER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="ticks" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open"><assign location="ticks" expr="ticks + 1"/></transition>
  </state>
</scxml>"""

TICKS = Binding(
    id="ticks", source="meter", match="true", key="event.meter", document="meter", event="tick"
)


def _tick(meter: str, number: int) -> InboundEvent:
    return InboundEvent(
        scope="plant", source="meter", message_id=f"{meter}:{number}", data={"meter": meter}
    )


@pytest.mark.asyncio
async def test_a_router_batch_commits_off_the_loop_and_one_delivery_on_it(path: Path) -> None:
    url = f"sqlite:///{path}"
    migrations.upgrade(url)
    adapter = SqlAdapter(url)
    resolver = StaticResolver({"meter": compile_chart(METER)})
    router = Router(RouterConfig(adapter, bindings=[TICKS], resolver=resolver))
    try:
        await router.route(_tick("m-0", 0))  # the connection opened
        async with adapter.transaction() as tx:
            commits = Commits()
            tx.driver.set_trace_callback(commits)
        batch = await router.route_many([_tick(f"m-{n}", 1) for n in range(3)])
        assert all(isinstance(answer, Routed) for answer in batch)
        await router.route(_tick("m-0", 2))
    finally:
        await adapter.close()
    loop_thread = threading.get_ident()
    # The first COMMIT is the trace's own transaction's.
    assert commits.threads[0] == loop_thread
    assert commits.threads[1] != loop_thread  # the batch
    assert commits.threads[2] == loop_thread  # one delivery
    with sqlite3.connect(path) as reader:
        (count,) = reader.execute("SELECT count(*) FROM statifier_routing_ledger").fetchone()
    assert count == 5
