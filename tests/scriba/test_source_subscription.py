"""What both sources do alike, on PostgreSQL and SQLite: resuming, reading in
batches, acknowledging, never reading past a gap a writer may still fill, and one
reader per projection."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from tests.child_processes import signal_child
from tests.scriba import source_logs as logs
from tests.scriba.source_logs import ORDERS, EventLog, holding, read_all

from scriba import Event, ProjectionKey
from scriba.source import SourceError
from scriba.sources import LostLockError
from scriba.sources.gaps import GapTracker
from scriba.sources.standby import AdvisoryLock, FileLock, ProjectionLock, lock_path_beside
from scriba.sources.subscription import GAP_PATIENCE, SubscribedSource
from statifier import telemetry

SOURCES = ["eventsourcing", "sql_table"]


def _open(source: str, kind: str, request: pytest.FixtureRequest) -> Iterator[EventLog]:
    if source == "eventsourcing":
        yield from logs.open_log(kind, request)
    else:
        yield from logs.open_table(kind, request)


@pytest.fixture(
    params=[(source, kind) for source in SOURCES for kind in ("postgres", "sqlite")],
    ids=lambda param: "-".join(param),
)
def log(request: pytest.FixtureRequest) -> Iterator[EventLog]:
    source, kind = request.param
    yield from _open(source, kind, request)


@pytest.fixture(params=SOURCES)
def pg_log(request: pytest.FixtureRequest) -> Iterator[EventLog]:
    yield from _open(request.param, "postgres", request)


@pytest.fixture(params=SOURCES)
def sqlite_log(request: pytest.FixtureRequest) -> Iterator[EventLog]:
    yield from _open(request.param, "sqlite", request)


@pytest.mark.asyncio
async def test_resumes_after_the_position_given_and_sees_later_writes(log: EventLog) -> None:
    log.write(6)
    source = log.source()
    await source.subscribe(ORDERS, after=4)
    assert [e.position for e in await read_all(source)] == [5, 6]
    log.write(2)
    assert [e.position for e in await read_all(source)] == [7, 8]
    await source.close()


@pytest.mark.asyncio
async def test_a_read_returns_at_most_limit_and_the_next_one_continues(log: EventLog) -> None:
    log.write(7)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    sizes: list[int] = []
    positions: list[int] = []
    while batch := await source.read(3):
        sizes.append(len(batch))
        positions.extend(e.position for e in batch)
    log.write(2)  # arrive later: the same subscription sees them
    positions.extend(e.position for e in await read_all(source))
    await source.close()
    assert sizes == [3, 3, 1]
    assert positions == list(range(1, 10))


@pytest.mark.asyncio
async def test_acknowledging_past_what_was_read_is_refused(log: EventLog) -> None:
    log.write(3)
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    await source.read(2)
    await source.acknowledge(1)
    await source.acknowledge(2)
    with pytest.raises(ValueError, match="only events up to 2"):
        await source.acknowledge(3)
    assert source.acknowledged == 2
    await source.close()


@pytest.mark.asyncio
async def test_reading_before_subscribing_or_subscribing_twice_is_an_error(log: EventLog) -> None:
    source = log.source()
    with pytest.raises(SourceError, match="before subscribe"):
        await source.read(1)
    with pytest.raises(ValueError, match="limit"):
        await source.read(0)
    await source.subscribe(ORDERS, after=0)
    with pytest.raises(SourceError, match="already subscribed"):
        await source.subscribe(ORDERS, after=0)
    await source.close()


# --- gaps ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_old_gaps_are_passed_in_one_read(log: EventLog) -> None:
    """Gaps whose writers are long gone (here: rows deleted) are passed in one read."""
    log.write(10)
    log.delete([3, 4, 7])
    source = log.source()
    await source.subscribe(ORDERS, after=0)
    got = await source.read(100)
    await source.close()
    assert [e.position for e in got] == [1, 2, 5, 6, 8, 9, 10]


@pytest.mark.asyncio
async def test_postgresql_a_straggler_holds_reading_back_until_it_commits(
    pg_log: EventLog,
) -> None:
    """Position 3 is drawn by a transaction held open while 4 commits: the source
    delivers neither until 3 commits, then both, in order."""
    pg_log.write(2)
    source = pg_log.source()
    await source.subscribe(ORDERS, after=0)
    assert [e.position for e in await read_all(source)] == [1, 2]
    assert not source.blocked
    with pg_log.pending() as straggler, pg_log.pending() as other:
        late = straggler.write()
        assert late.position == 3  # drawn, not committed
        on_time = other.write()
        other.commit()
        assert on_time.position == 4  # committed and visible
        for _ in range(3):
            assert await source.read(10) == []  # never 4 while 3 may still come
            assert source.blocked  # which a pipeline does not take for caught up
        straggler.commit()
    got = await read_all(source)
    assert not source.blocked
    await source.close()
    assert [(e.position, e.id, e.stream_id) for e in got] == [
        (3, late.id, late.stream_id),
        (4, on_time.id, on_time.stream_id),
    ]


@pytest.mark.asyncio
async def test_postgresql_a_rolled_back_gap_is_passed_once_its_writer_ended(
    pg_log: EventLog,
) -> None:
    source = pg_log.source()
    await source.subscribe(ORDERS, after=0)
    with pg_log.pending() as aborted, pg_log.pending() as other:
        aborted.write()
        assert other.write().position == 2
        other.commit()
        assert await source.read(10) == []
        aborted.rollback()
    assert [e.position for e in await read_all(source)] == [2]
    await source.close()


@pytest.mark.asyncio
async def test_postgresql_unrelated_transactions_do_not_hold_a_gap(pg_log: EventLog) -> None:
    """Only transactions that write the event table can fill a gap in it."""
    assert pg_log.url is not None
    pg_log.write(3)
    pg_log.delete([2])
    with psycopg.connect(pg_log.url) as unrelated:
        unrelated.execute("CREATE TEMPORARY TABLE scratch (x int)")
        unrelated.execute("INSERT INTO scratch VALUES (1)")
        source = pg_log.source()
        await source.subscribe(ORDERS, after=0)
        assert [e.position for e in await source.read(10)] == [1, 3]
        await source.close()
        unrelated.rollback()


# --- one reader per projection -------------------------------------------------------------


@pytest.fixture
def seen() -> Iterator[list[tuple[str, Mapping[str, Any]]]]:
    """Every standby and subscribed telemetry event, in order."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    handler_id = f"test-{uuid.uuid4().hex}"
    for name in ("scriba.source.standby", "scriba.source.subscribed"):
        telemetry.attach(handler_id, name, lambda n, _m, meta: found.append((n, meta)))
    yield found
    telemetry.detach(handler_id)


@pytest.mark.asyncio
async def test_a_second_subscription_stands_by_and_takes_over_on_release(
    log: EventLog, seen: list[tuple[str, Mapping[str, Any]]]
) -> None:
    log.write(3)
    holder, standby = log.source(), log.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=1)
    assert holding(holder)
    assert not holding(standby)
    for _ in range(3):
        assert await standby.read(10) == []
    assert [e.position for e in await read_all(holder)] == [1, 2, 3]
    # Another version of the same name is another projection: no contention.
    other_version = log.source()
    await other_version.subscribe(ProjectionKey("orders", 2), after=0)
    assert holding(other_version)
    await other_version.close()

    await holder.close()
    assert [e.position for e in await read_all(standby)] == [2, 3]
    assert holding(standby)
    await standby.close()
    reported = [(n, m["source"], m["name"], m["version"], m.get("after")) for n, m in seen]
    assert reported == [
        ("scriba.source.subscribed", log.source_name, "orders", 1, 0),
        # once for the whole standby period, and without "after": nothing is read yet
        ("scriba.source.standby", log.source_name, "orders", 1, None),
        ("scriba.source.subscribed", log.source_name, "orders", 2, 0),  # version 2
        ("scriba.source.subscribed", log.source_name, "orders", 1, 1),  # the takeover
    ]


def _wait_until_ended(admin: psycopg.Connection[Any], backend_pid: int) -> None:
    """pg_terminate_backend only signals the backend; its locks go when it has exited."""
    deadline = time.monotonic() + 10.0
    while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [backend_pid]).fetchone():
        assert time.monotonic() < deadline, f"backend {backend_pid} did not end"
        time.sleep(0.01)


@pytest.mark.asyncio
async def test_postgresql_a_holder_whose_connection_dies_is_replaced(pg_log: EventLog) -> None:
    """The server releases the advisory lock of a dead connection; the standby takes
    over, and the old holder learns it lost the projection on its next read."""
    assert pg_log.url is not None
    pg_log.write(2)
    holder = pg_log.source(lock_check_interval=0.0)
    standby = pg_log.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=0)
    assert await standby.read(10) == []
    lock = holder.lock
    assert isinstance(lock, AdvisoryLock)
    assert lock.backend_pid is not None
    with psycopg.connect(pg_log.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [lock.backend_pid])
        _wait_until_ended(admin, lock.backend_pid)
    assert [e.position for e in await read_all(standby)] == [1, 2]
    with pytest.raises(LostLockError):
        await holder.read(10)
    await holder.close()
    await standby.close()


_HOLD_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_sqlite_a_holder_process_that_dies_is_replaced(sqlite_log: EventLog) -> None:
    """The kernel drops the flock of a killed process; the standby takes over."""
    sqlite_log.write(2)
    lock_file = lock_path_beside(sqlite_log.database_file, ORDERS)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD_FLOCK, str(lock_file), stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert await holder.stdout.readline() == b"held\n"
        standby = sqlite_log.source()
        await standby.subscribe(ORDERS, after=0)
        assert await standby.read(10) == []
        assert not holding(standby)
        os.kill(holder.pid, signal.SIGKILL)
        await holder.wait()
        assert [e.position for e in await read_all(standby)] == [1, 2]
        await standby.close()
    finally:
        if holder.returncode is None:
            signal_child(holder)
            await holder.wait()


@pytest.mark.asyncio
async def test_the_head_is_the_greatest_position_and_a_standby_says_it_waits(
    log: EventLog,
) -> None:
    holder, standby = log.source(), log.source()
    await holder.subscribe(ORDERS, after=0)
    await standby.subscribe(ORDERS, after=0)
    assert await holder.head() == 0  # an empty log
    log.write(4)
    positions = [e.position for e in await read_all(holder)]
    assert await holder.head() == positions[-1]
    assert await standby.head() == positions[-1]  # the head needs no lock
    assert (holder.standing_by, standby.standing_by) == (False, True)
    await holder.confirm_held()
    with pytest.raises(LostLockError):
        await standby.confirm_held()
    await holder.close()
    await standby.close()


@pytest.mark.asyncio
async def test_postgresql_confirming_finds_a_lost_lock_at_once(pg_log: EventLog) -> None:
    """However long the periodic check interval, confirming asks the lock's session."""
    assert pg_log.url is not None
    holder = pg_log.source(lock_check_interval=3600.0)
    await holder.subscribe(ORDERS, after=0)
    lock = holder.lock
    assert isinstance(lock, AdvisoryLock)
    assert lock.backend_pid is not None
    with psycopg.connect(pg_log.url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [lock.backend_pid])
        _wait_until_ended(admin, lock.backend_pid)
    assert await holder.read(10) == []  # the periodic check is not due: it reads on
    with pytest.raises(LostLockError):
        await holder.confirm_held()
    await holder.close()


class _HeadlessLog(SubscribedSource):
    """A source whose log's head cannot be read (its database refuses the query)."""

    def __init__(self) -> None:
        super().__init__("headless", gaps_can_fill=False, lock_path="unused.lock")

    def _make_lock(self, projection: ProjectionKey) -> ProjectionLock:
        raise AssertionError("no lock is taken to read the head")

    async def _read_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        raise AssertionError("nothing is read")

    async def _head(self) -> int | None:
        raise PermissionError("permission denied for table events")


@pytest.mark.asyncio
async def test_a_head_that_cannot_be_read_is_unknown_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = _HeadlessLog()
    assert [await source.head() for _ in range(3)] == [None, None, None]
    said = [r for r in caplog.records if "the log's head cannot be read" in r.getMessage()]
    expected = (
        "headless: the log's head cannot be read (the lag in events is unknown): "
        "PermissionError: permission denied for table events"
    )
    assert [(r.levelname, r.getMessage()) for r in said] == [("WARNING", expected)]


class _GappedLog(SubscribedSource):
    """Positions 1, 2 and 4 are visible; 3 was taken by a writer that never commits."""

    def __init__(self, lock_path: str, clock: Callable[[], float]) -> None:
        super().__init__("gapped", gaps_can_fill=True, lock_path=lock_path, clock=clock)
        self.poll = 0.0

    def _make_lock(self, projection: ProjectionKey) -> ProjectionLock:
        return FileLock(self._lock_file("", projection))

    async def _read_batch(self, tracker: GapTracker, limit: int) -> list[Event]:
        visible = [p for p in (1, 2, 4) if p > tracker.cursor]
        accepted = tracker.accept(visible)
        if tracker.blocked and tracker.fenced_writers is None:
            tracker.fence(4, frozenset({"4/17"}))
        at = datetime(2026, 1, 1, tzinfo=UTC)
        return [Event(f"e{p}", "s", "Happened", p, p, at) for p in visible[:accepted]]

    async def _head(self) -> int | None:
        return 4


@pytest.mark.asyncio
async def test_a_gap_held_past_the_patience_is_logged_with_its_writers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    source = _GappedLog(str(tmp_path / "gapped.lock"), lambda: now[0])
    await source.subscribe(ORDERS, after=0)
    try:
        assert [e.position for e in await source.read(10)] == [1, 2]
        assert source.blocked
        now[0] = GAP_PATIENCE - 1
        assert await source.read(10) == []
        assert not [r for r in caplog.records if "reading waits" in r.getMessage()]
        now[0] = GAP_PATIENCE + 5
        assert await source.read(10) == []
        assert await source.read(10) == []  # the same cause: not said again yet
    finally:
        await source.close()
    said = [r for r in caplog.records if "reading waits" in r.getMessage()]
    expected = (
        f"gapped: reading waits at position 3 for {GAP_PATIENCE + 5:.0f} s: a writer that "
        "has not committed took it (transactions 4/17); later events are held back "
        "until it ends"
    )
    assert [(r.levelname, r.getMessage()) for r in said] == [("WARNING", expected)]
