"""The SQLite adapter's edges around its commit (decision 0134, and its amendment): a
close while a transaction is under way (it ends first, or is rolled back, never
committed halfway), a cancellation during a commit on the thread (the very error,
after the commit, also when the commit failed), an in-memory database named by URI
(its commit stays on the loop), nothing started after a close, and a commit once the
interpreter's exit has begun."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

import pytest
import pytest_asyncio

from statifier.chart import compile_chart
from statifier.persistence import AdapterClosed
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.sql import sqlite as sqlite_adapter
from statifier.router import Binding, InboundEvent, Routed, Router, RouterConfig, StaticResolver
from statifier.sql import migrations

COMMIT_TAKES = 0.3
"""How long a commit is held up in its thread in the tests that need it under way."""


class SlowCommits:
    """A trace callback that holds each ``COMMIT`` up ``COMMIT_TAKES`` seconds in the
    thread it runs on, and says when the first began."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def __call__(self, statement: str) -> None:
        if statement.strip().upper() == "COMMIT":
            self.started.set()
            time.sleep(COMMIT_TAKES)

    async def wait_started(self) -> None:
        async with asyncio.timeout(5.0):
            while not self.started.is_set():  # noqa: ASYNC110 - set on another thread
                await asyncio.sleep(0.005)


@pytest.fixture(name="path")
def _path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest_asyncio.fixture(name="adapter")
async def _adapter(path: Path) -> AsyncIterator[SqlAdapter]:
    adapter = SqlAdapter(f"sqlite:///{path}")
    yield adapter
    await adapter.close()


async def _make_table(adapter: SqlAdapter) -> None:
    async with adapter.transaction() as tx:
        tx.driver.execute("CREATE TABLE IF NOT EXISTS t (value INTEGER)")


async def _insert(
    adapter: SqlAdapter, value: int, trace: SlowCommits | None = None, in_thread: bool = True
) -> None:
    async with adapter.transaction(commit_in_thread=in_thread) as tx:
        tx.driver.set_trace_callback(trace)
        tx.driver.execute("INSERT INTO t VALUES (?)", (value,))


def _values(path: Path) -> list[int]:
    with sqlite3.connect(path) as reader:
        return [value for (value,) in reader.execute("SELECT value FROM t ORDER BY value")]


def _commit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("statifier-commit")}


# A close while a transaction is under way lets it end first: all of it or none of it.


@pytest.mark.asyncio
@pytest.mark.parametrize("in_thread", [True, False], ids=["batch", "on-loop"])
async def test_close_while_a_transaction_is_open_commits_none_of_it_halfway(
    adapter: SqlAdapter, path: Path, in_thread: bool
) -> None:
    await _make_table(adapter)
    first_written = asyncio.Event()
    go_on = asyncio.Event()

    async def two_rows() -> None:
        async with adapter.transaction(commit_in_thread=in_thread) as tx:
            tx.driver.execute("INSERT INTO t VALUES (10)")
            first_written.set()
            await go_on.wait()  # a batch awaiting a hook, between two statements
            tx.driver.execute("INSERT INTO t VALUES (11)")

    writing = asyncio.create_task(two_rows())
    await first_written.wait()
    closing = asyncio.create_task(adapter.close())  # a shutdown racing the batch
    await asyncio.sleep(0.05)
    go_on.set()
    async with asyncio.timeout(5.0):
        await asyncio.gather(writing, closing, return_exceptions=True)
    # All of the transaction or none of it: never its first row alone.
    assert _values(path) in ([], [10, 11])


@pytest.mark.asyncio
async def test_a_transaction_past_the_close_wait_is_rolled_back_and_said(
    adapter: SqlAdapter,
    path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(sqlite_adapter, "CLOSE_WAIT", 0.2)
    await _make_table(adapter)
    first_written = asyncio.Event()
    go_on = asyncio.Event()

    async def stuck() -> None:
        async with adapter.transaction(commit_in_thread=True) as tx:
            tx.driver.execute("INSERT INTO t VALUES (20)")
            first_written.set()
            await go_on.wait()  # longer than the close waits
            tx.driver.execute("INSERT INTO t VALUES (21)")

    writing = asyncio.create_task(stuck())
    await first_written.wait()
    async with asyncio.timeout(5.0):
        await adapter.close()
    assert _values(path) == []  # rolled back, not committed
    assert any("rolled back, not committed" in r.getMessage() for r in caplog.records)
    go_on.set()
    with pytest.raises(sqlite3.ProgrammingError):  # its connection is gone
        await writing
    with pytest.raises(AdapterClosed):  # and the writer is free: refused, not waiting
        await adapter.fetch_chart("h")


# A close during a commit on the thread waits for it: the block ends without an error,
# and the calls queued behind it are refused, not stranded.


@pytest.mark.asyncio
async def test_close_during_a_commit_in_the_thread_leaves_its_transaction_unharmed(
    adapter: SqlAdapter, path: Path
) -> None:
    await _make_table(adapter)
    commits = SlowCommits()
    writing = asyncio.create_task(_insert(adapter, 1, commits))
    await commits.wait_started()
    await adapter.close()
    assert _values(path) == [1]  # it committed ...
    async with asyncio.timeout(5.0):
        await writing  # ... so its block ends without an error


@pytest.mark.asyncio
async def test_close_during_a_commit_in_the_thread_strands_no_task_waiting_for_the_writer(
    adapter: SqlAdapter,
) -> None:
    await _make_table(adapter)
    commits = SlowCommits()
    writing = asyncio.create_task(_insert(adapter, 1, commits))
    await commits.wait_started()
    # A call of its own transaction, queued for the single writer behind the commit.
    waiting = asyncio.create_task(adapter.fetch_chart("h"))
    await asyncio.sleep(0.01)
    await adapter.close()
    with suppress(Exception):
        await writing
    try:
        async with asyncio.timeout(5.0):
            with suppress(Exception):  # an answer or an error, but an end
                await waiting
    finally:
        waiting.cancel()


# A cancellation during a commit is raised once the commit ended: the very error, also
# when the commit failed.


@pytest.mark.asyncio
async def test_a_cancellation_during_a_commit_that_fails_is_not_lost(
    adapter: SqlAdapter,
) -> None:
    async with adapter.transaction() as tx:
        driver = tx.driver
        driver.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        driver.execute("CREATE TABLE child (parent INTEGER REFERENCES parent (id))")
    driver.execute("PRAGMA foreign_keys = ON")  # outside a transaction, or a no-op
    commits = SlowCommits()

    async def orphan() -> None:
        async with adapter.transaction(commit_in_thread=True) as tx:
            tx.driver.set_trace_callback(commits)
            tx.driver.execute("PRAGMA defer_foreign_keys = ON")  # fails at the commit
            tx.driver.execute("INSERT INTO child VALUES (7)")

    inserting = asyncio.create_task(orphan())
    await commits.wait_started()
    inserting.cancel()
    # Decision 0134: the CancelledError is raised once the commit has ended, "whether
    # it committed or not". A task that swallows its cancellation and raises an
    # ordinary error keeps a worker loop that catches Exception running after a stop.
    with pytest.raises(asyncio.CancelledError):
        await inserting


@pytest.mark.asyncio
async def test_a_cancellation_during_the_commit_keeps_its_message(adapter: SqlAdapter) -> None:
    await _make_table(adapter)
    commits = SlowCommits()
    inserting = asyncio.create_task(_insert(adapter, 1, commits))
    await commits.wait_started()
    inserting.cancel("the service is stopping")
    with pytest.raises(asyncio.CancelledError) as raised:
        await inserting
    assert raised.value.args == ("the service is stopping",)


# An in-memory database named by a URI (``file:...?mode=memory``) keeps its connection
# to one thread: its commits stay on the loop.


def _memory_url() -> str:
    return f"sqlite:///file:memory-{uuid.uuid4().hex}?mode=memory&cache=shared&uri=true"


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
async def test_an_in_memory_database_named_by_uri_commits_on_the_loop() -> None:
    adapter = SqlAdapter(_memory_url())
    try:
        async with adapter.transaction(commit_in_thread=True) as tx:
            tx.driver.execute("CREATE TABLE t (value INTEGER)")
            tx.driver.execute("INSERT INTO t VALUES (1)")
        async with adapter.transaction() as tx:
            assert tx.driver.execute("SELECT value FROM t").fetchall() == [(1,)]
    finally:
        await adapter.close()


METER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <state id="open"><transition event="tick" target="open"/></state>
</scxml>"""

TICKS = Binding(
    id="ticks", source="meter", match="true", key="event.meter", document="meter", event="tick"
)


def _tick(meter: str, number: int) -> InboundEvent:
    return InboundEvent(
        scope="plant", source="meter", message_id=f"{meter}:{number}", data={"meter": meter}
    )


@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SADeprecationWarning")
async def test_a_router_batch_on_an_in_memory_database_named_by_uri_is_routed() -> None:
    url = _memory_url()
    adapter = SqlAdapter(url)
    try:
        async with adapter.transaction():  # its connection keeps the database alive
            pass
        migrations.upgrade(url)
        resolver = StaticResolver({"meter": compile_chart(METER)})
        router = Router(RouterConfig(adapter, bindings=[TICKS], resolver=resolver))
        assert isinstance(await router.route(_tick("a", 0)), Routed)
        answers = await router.route_many([_tick("a", 1), _tick("b", 1)])
        assert all(isinstance(answer, Routed) for answer in answers)
    finally:
        await adapter.close()


# After a close nothing starts: a transaction or a call is refused.


@pytest.mark.asyncio
async def test_no_commit_thread_starts_after_close(adapter: SqlAdapter) -> None:
    await _make_table(adapter)
    await _insert(adapter, 1)
    await adapter.close()
    before = _commit_threads()
    with pytest.raises(AdapterClosed):
        await _insert(adapter, 2)
    with pytest.raises(AdapterClosed):
        await adapter.fetch_chart("h")
    assert _commit_threads() <= before


# Once the interpreter's exit has begun (the main thread ended, the loop running on
# another), its executors take no work: the commit runs on the loop.

AFTER_MAIN = """
import asyncio, sys, threading
from statifier.persistence.sql import SqlAdapter

async def main(adapter: SqlAdapter) -> None:
    try:
        for value in range(2):
            if value:
                while threading.main_thread().is_alive():
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # the interpreter's atexit calls have run
            try:
                async with adapter.transaction(commit_in_thread=True) as tx:
                    tx.driver.execute("CREATE TABLE IF NOT EXISTS t (value INTEGER)")
                    tx.driver.execute("INSERT INTO t VALUES (?)", (value,))
                print(value, "committed", flush=True)
            except Exception as error:
                print(value, type(error).__name__, error, flush=True)
            first.set()
    finally:
        await adapter.close()

adapter = SqlAdapter(sys.argv[1])
first = threading.Event()
threading.Thread(target=asyncio.run, args=(main(adapter),)).start()
first.wait(10.0)  # then the main thread ends, the loop's thread going on
"""


def test_a_batch_commits_after_the_main_thread_has_ended(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(AFTER_MAIN), f"sqlite:///{path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["0 committed", "1 committed"]
    assert _values(path) == [0, 1]
