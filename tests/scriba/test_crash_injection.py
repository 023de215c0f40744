"""Crash injection: the projecting process is killed (SIGKILL) at random points while
it catches up, and restarted, again and again; the read model ends exactly-once.

The child is tests/scriba/crash_child.py (SqlTableSource, SqlTarget, a one-insert
handler that also skips ``Noise`` events and fails on ``Poison`` ones). New events
arrive between runs, so there is always a backlog to crash in. After every kill the
committed state is checked (no duplicate, no row ahead of its stream's cursor, nothing
at or below the watermark missing); at the end every event is accounted for exactly
once: delivered == rows + dead letters + skipped.

The seed is printed; ``SCRIBA_CRASH_SEED=<seed>`` replays a run's kill points.
"""

from __future__ import annotations

import importlib.util
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import sqlalchemy as sa

from scriba.sources import NewEvent, append

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = 30
INITIAL_EVENTS = 3000
EVENTS_PER_RUN = 400
STREAMS = 40


def _load_child() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scriba_crash_child", CHILD)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child()


def _kind(n: int) -> str:
    if n % 47 == 5:
        return "Poison"
    if n % 10 == 3:
        return "Noise"
    return "Placed"


@dataclass
class Backlog:
    """The event table, the read model, and what has been appended so far."""

    db: SqlDatabase
    events: sa.Table
    rows: sa.Table
    kinds: dict[int, str]  # position -> type
    streams: dict[int, str]  # position -> stream id
    appended: int = 0

    @classmethod
    def create(cls, db: SqlDatabase) -> Backlog:
        events, rows = child.tables("", db.schema)
        events.metadata.create_all(db.engine)
        return cls(db, events, rows, {}, {})

    def append(self, count: int) -> None:
        at = datetime(2024, 1, 1, tzinfo=UTC)
        new = [
            NewEvent(
                f"event-{n}",
                f"stream-{n % STREAMS}",
                _kind(n),
                {"n": n},
                at + timedelta(milliseconds=n),
            )
            for n in range(self.appended, self.appended + count)
        ]
        with self.db.engine.begin() as connection:
            positions = append(connection, self.events, new)
        for position, event in zip(positions, new, strict=True):
            self.kinds[position] = event.type
            self.streams[position] = event.stream_id
        self.appended += count

    def of_kind(self, kind: str) -> set[int]:
        return {p for p, k in self.kinds.items() if k == kind}


@dataclass(frozen=True)
class Committed:
    """What the database holds after a run."""

    rows: list[tuple[str, str, int]]
    dead_letters: list[int]  # positions
    cursors: dict[str, int]
    watermark: int | None


def _committed(backlog: Backlog) -> Committed:
    tables = backlog.db.tables
    with backlog.db.engine.connect() as connection:
        rows = [tuple(r) for r in connection.execute(sa.select(backlog.rows))]
        dead = list(connection.execute(sa.select(tables.dead_letters.c.position)).scalars())
        cursors = dict(
            connection.execute(
                sa.select(tables.positions.c.stream_id, tables.positions.c.position)
            ).all()
        )
        watermark = connection.execute(sa.select(tables.watermarks.c.position)).scalar()
    return Committed(rows, dead, cursors, watermark)


def _check_consistent(backlog: Backlog, state: Committed) -> None:
    """What must hold after any crash."""
    placed, poison = backlog.of_kind("Placed"), backlog.of_kind("Poison")
    row_positions = [position for _, _, position in state.rows]
    assert len(row_positions) == len(set(row_positions)), "a row was written twice"
    assert set(row_positions) <= placed, "a row for an event that makes none"
    for event_id, stream_id, position in state.rows:
        assert event_id == f"event-{position - 1}"
        assert stream_id == backlog.streams[position]
        assert state.cursors.get(stream_id, 0) >= position, "a row ahead of its cursor"
    assert len(state.dead_letters) == len(set(state.dead_letters)), "dead-lettered twice"
    assert set(state.dead_letters) <= poison, "a good event was dead-lettered"
    if state.watermark is not None:
        below = state.watermark
        missing_rows = {p for p in placed if p <= below} - set(row_positions)
        missing_dead = {p for p in poison if p <= below} - set(state.dead_letters)
        assert not missing_rows, f"watermark {below} is ahead of rows {sorted(missing_rows)}"
        assert not missing_dead, f"watermark {below} is ahead of dead letters {missing_dead}"


def _check_complete(backlog: Backlog, state: Committed) -> None:
    """What must hold once a run caught up: every event exactly once."""
    _check_consistent(backlog, state)
    placed, poison, noise = (backlog.of_kind(k) for k in ("Placed", "Poison", "Noise"))
    assert {position for _, _, position in state.rows} == placed
    assert set(state.dead_letters) == poison
    delivered = len(backlog.kinds)
    assert delivered == len(state.rows) + len(state.dead_letters) + len(noise)
    last = {
        stream: max(p for p, s in backlog.streams.items() if s == stream)
        for stream in set(backlog.streams.values())
    }
    assert state.cursors == last
    assert state.watermark == delivered


def _spawn(db: SqlDatabase, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(CHILD), db.url, ""]
    if db.schema is not None:
        command += ["--schema", db.schema]
    return subprocess.Popen(
        [*command, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": _pythonpath()},
    )


def _pythonpath() -> str:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)


def _wait_for_line(process: subprocess.Popen[str], expected: str, timeout: float) -> None:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            if selector.select(remaining):
                line = process.stdout.readline()
                if line == f"{expected}\n":
                    return
                if line == "":
                    break
    _finish(process)
    raise AssertionError(f"the child did not print {expected!r}: {_stderr(process)}")


def _finish(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def _stderr(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    return process.stderr.read()[-3000:]


def _close(process: subprocess.Popen[str]) -> None:
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _kill_at_random(process: subprocess.Popen[str], rng: random.Random) -> str:
    """Kill ``process`` somewhere in its start-up or its catch-up; say where."""
    if rng.random() < 0.2:
        time.sleep(rng.uniform(0.0, 0.5))  # during start-up, or just after
        where = "start-up"
    else:
        _wait_for_line(process, "ready", timeout=30)
        time.sleep(rng.uniform(0.0, 0.05))
        where = "catch-up"
    if process.poll() is not None:
        raise AssertionError(f"the child ended before it was killed: {_stderr(process)}")
    process.send_signal(signal.SIGKILL)
    process.wait()
    return where


def test_killed_at_random_points_the_read_model_ends_exactly_once(
    sql_database: SqlDatabase,
) -> None:
    seed = int(os.environ.get("SCRIBA_CRASH_SEED", random.randrange(2**32)))
    print(f"SCRIBA_CRASH_SEED={seed}")
    rng = random.Random(seed)
    backlog = Backlog.create(sql_database)
    backlog.append(INITIAL_EVENTS)
    behind = 0
    for _ in range(KILLS):
        process = _spawn(sql_database)
        try:
            _kill_at_random(process, rng)
        finally:
            _finish(process)
            _close(process)
        state = _committed(backlog)
        _check_consistent(backlog, state)
        behind += (state.watermark or 0) < len(backlog.kinds)
        backlog.append(EVENTS_PER_RUN)
    # Most kills must land with work left, or they prove little.
    print(f"kills that found a backlog: {behind} of {KILLS}")
    assert behind >= KILLS * 2 // 3, f"only {behind} of {KILLS} kills found a backlog"

    process = _spawn(sql_database)
    try:
        _wait_for_line(process, "caught-up", timeout=60)
        assert process.wait(timeout=30) == 0, _stderr(process)
    finally:
        _finish(process)
        _close(process)
    _check_complete(backlog, _committed(backlog))


def test_a_crash_while_an_event_is_held_loses_nothing(sql_database: SqlDatabase) -> None:
    """The straggler defect: with parallelism > 1 and one partition's handler held on
    an event, later events of other partitions commit, but neither the watermark nor the
    acknowledgement may pass the held one; killed there and restarted, nothing is lost."""
    backlog = Backlog.create(sql_database)
    backlog.append(400)
    held = next(p for p in sorted(backlog.kinds) if backlog.kinds[p] == "Placed" and p > 5)
    process = _spawn(sql_database, "--hold", str(held), "--batch-size", "10")
    try:
        _wait_for_line(process, "ready", timeout=30)
        deadline = time.monotonic() + 20
        # The pipeline reads ahead at most 2 x batch size x parallelism events past the
        # held one (its back-pressure), so wait for a few dozen of them to commit.
        while sum(p > held for _, _, p in _committed(backlog).rows) < 30:
            assert time.monotonic() < deadline, "the other partitions did not commit"
            time.sleep(0.05)
        time.sleep(1.5)  # past the watermark's throttle: it would have been written
        state = _committed(backlog)
        assert max(position for _, _, position in state.rows) > held
        assert held not in {position for _, _, position in state.rows}
        assert state.watermark is None or state.watermark < held
        _check_consistent(backlog, state)
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        _finish(process)
        _close(process)

    process = _spawn(sql_database)
    try:
        _wait_for_line(process, "caught-up", timeout=60)
        assert process.wait(timeout=30) == 0, _stderr(process)
    finally:
        _finish(process)
        _close(process)
    _check_complete(backlog, _committed(backlog))
