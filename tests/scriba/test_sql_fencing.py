"""One reader per projection, even when the lock fails: fencing, standby, reset, lag.

Two runtimes read the same event table into the same database. The first one's lock
is cut while it has a batch in flight (on PostgreSQL its lock session is terminated;
on SQLite its lock file is released behind its back, so it still believes it holds
it); the second takes over. The first one's late commit must apply nothing: the read
model is an incrementing counter, so a double-applied ``Update`` shows as a count too
high. Then: a standby says so (and does not claim a lag of 0), ``reset`` refuses while
another connection holds the lock, lag is measured in events, and a failure between
the read-model write and the cursor write leaves nothing half-committed.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa

from scriba import Event, Meta, Multi, Projection, ProjectionBusy, Result, Scriba, Status, Update
from scriba.operations import Insert
from scriba.sources import NewEvent, SqlTableSource, append, event_table
from scriba.sources.standby import AdvisoryLock, FileLock, lock_key, lock_path_beside
from scriba.sql.target import SqlTarget
from scriba.target import ApplyFailed, FailureKind
from statifier import telemetry

if TYPE_CHECKING:
    from tests.scriba.conftest import SqlDatabase

WAIT = 20.0
FAST: dict[str, Any] = {"batch_timeout": 0.005, "lag_interval": 0, "commit_backoff": (0.01,)}


@dataclass
class Counted:
    """An event table, and a read model counting the events applied (per stream)."""

    db: SqlDatabase
    events: sa.Table
    counters: sa.Table
    appended: int = 0

    @property
    def database(self) -> str | sa.Engine:
        """What a source reads: the URL on PostgreSQL, the shared engine on SQLite."""
        return self.db.url if self.db.dialect == "postgresql" else self.db.engine

    def append(self, count: int, streams: int = 3) -> None:
        at = datetime(2024, 1, 1, tzinfo=UTC)
        new = [
            NewEvent(f"e{n}", f"s{n % streams}", "Counted", {"n": n}, at)
            for n in range(self.appended, self.appended + count)
        ]
        with self.db.engine.begin() as connection:
            append(connection, self.events, new)
        self.appended += count

    def counts(self) -> dict[str, int]:
        with self.db.engine.connect() as connection:
            query = sa.select(self.counters.c.stream_id, self.counters.c.n)
            return {row.stream_id: row.n for row in connection.execute(query)}

    def source(self, **options: Any) -> SqlTableSource:
        return SqlTableSource(self.database, self.events, poll_interval=0.01, **options)


@pytest.fixture
def counted(sql_database: SqlDatabase) -> Counted:
    suffix = uuid.uuid4().hex[:8]
    events = event_table(sql_database.metadata, f"events_{suffix}")
    counters = sa.Table(
        f"counters_{suffix}",
        sql_database.metadata,
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("n", sa.Integer, nullable=False),
    )
    sql_database.metadata.create_all(sql_database.engine)
    with sql_database.engine.begin() as connection:
        connection.execute(counters.insert(), [{"stream_id": f"s{i}", "n": 0} for i in range(3)])
    return Counted(sql_database, events, counters)


@pytest_asyncio.fixture
async def targets(sql_database: SqlDatabase) -> AsyncIterator[list[SqlTarget]]:
    """Targets made on demand (``targets.append(db.target())``), all closed afterwards."""
    made: list[SqlTarget] = []
    try:
        yield made
    finally:
        for target in made:
            await target.close()


def counting(counters: sa.Table, hold: tuple[int, asyncio.Event] | None = None) -> type[Projection]:
    """Each event adds one to its stream's counter: applied twice, it counts twice."""

    class Counting(Projection):
        name = "counting"

        async def handle(self, event: Event, meta: Meta) -> Result:
            if hold is not None and event.position == hold[0]:
                await hold[1].wait()
            return Update(
                counters, where={"stream_id": event.stream_id}, values={"n": counters.c.n + 1}
            )

    return Counting


class Recorder:
    """Telemetry events of some names, as (name, measurements and metadata)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, measurements: Any, metadata: Any) -> None:
        self.seen.append((name, {**measurements, **metadata}))

    def of(self, event_name: str, **match: Any) -> list[dict[str, Any]]:
        return [
            data
            for seen, data in self.seen
            if seen == event_name and all(data.get(k) == v for k, v in match.items())
        ]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    names = ("scriba.source.batch.failed", "scriba.projection.crashed")
    for name in names:
        telemetry.attach(f"test-fencing-{name}", name, recorder)
    try:
        yield recorder
    finally:
        for name in names:
            telemetry.detach(f"test-fencing-{name}")


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` until it holds (bound it with ``asyncio.timeout``)."""
    while True:
        if await check():
            return
        await asyncio.sleep(0.01)


async def cut_lock(db: SqlDatabase, source: SqlTableSource) -> None:
    """Take ``source``'s lock from under it without its noticing (it checks the lock
    only every ``lock_check_interval``): on PostgreSQL the server ends its lock
    session, on SQLite its lock file is released behind the standby's back."""
    lock = source.lock
    if isinstance(lock, AdvisoryLock):
        pid = lock.backend_pid
        assert pid is not None
        with db.engine.connect() as connection:
            ended = connection.execute(sa.text("select pg_terminate_backend(:pid)"), {"pid": pid})
            assert ended.scalar_one() is True
    else:
        assert isinstance(lock, FileLock)
        await lock.release()


@pytest.mark.asyncio
async def test_a_deposed_reader_commits_nothing_when_two_overlap(
    counted: Counted, targets: list[SqlTarget], recorder: Recorder
) -> None:
    counted.append(60)
    release = asyncio.Event()
    held = 30
    first = counting(counted.counters, hold=(held, release))
    second = counting(counted.counters)
    targets.extend([counted.db.target(), counted.db.target()])
    # The first runtime never re-checks its lock on its own: it goes on believing.
    deposed = counted.source(lock_check_interval=3600)
    async with Scriba() as one, Scriba() as two:
        await one.start(first, source=deposed, target=targets[0], batch_size=100, **FAST)
        # Events up to 29 commit; 30 waits in its handler with the rest read behind it.
        async with asyncio.timeout(WAIT):
            await until(lambda: _safe_at_least(one, first, held - 1))
        await two.start(second, source=counted.source, target=targets[1], **FAST)
        # The second stands by: running, but reading nothing, its lag unknown (not 0).
        waiting = await two.info(second)
        assert (waiting.status, waiting.standby, waiting.lag, waiting.lag_events) == (
            Status.RUNNING,
            True,
            None,
            None,
        )
        await cut_lock(counted.db, deposed)
        async with asyncio.timeout(WAIT):
            await until(lambda: _not_standing_by(two, second))
            await two.wait_until_caught_up(second)
        assert sum(counted.counts().values()) == 60
        # Now the deposed reader's handler returns and its batch goes to commit.
        release.set()
        async with asyncio.timeout(WAIT):
            # Fenced out (a crash), or, were it not, committed to the end.
            await until(_crashed_or_safe_at(recorder, one, first, 60))
        assert sum(counted.counts().values()) == 60, "the deposed reader's batch applied"
        [fenced, *_] = recorder.of("scriba.source.batch.failed", name="counting")
        assert fenced["kind"] == FailureKind.FENCED.value
        assert fenced["first_position"] == held
        # Its next pipeline stands by behind the one that holds the projection now.
        async with asyncio.timeout(WAIT):
            await until(lambda: _standing_by(one, first))
        info = await one.info(first)
        assert (info.status, info.standby, info.lag, info.lag_events) == (
            Status.RUNNING,
            True,
            None,
            None,
        )
        counted.append(9)
        async with asyncio.timeout(WAIT):
            await two.wait_until_caught_up(second)
    # Every event counted exactly once, whoever committed it.
    assert counted.counts() == {"s0": 23, "s1": 23, "s2": 23}


async def _safe_at_least(runtime: Scriba, projection: type[Projection], position: int) -> bool:
    safe = (await runtime.info(projection)).safe_position
    return safe is not None and safe >= position


async def _standing_by(runtime: Scriba, projection: type[Projection]) -> bool:
    info = await runtime.info(projection)
    return info.standby and info.status is Status.RUNNING  # a restart is subscribed


async def _not_standing_by(runtime: Scriba, projection: type[Projection]) -> bool:
    return not (await runtime.info(projection)).standby


def _crashed_or_safe_at(
    recorder: Recorder, runtime: Scriba, projection: type[Projection], position: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        crashed = bool(recorder.of("scriba.projection.crashed"))
        return crashed or await _safe_at_least(runtime, projection, position)

    return check


@pytest.mark.asyncio
async def test_a_claim_fences_out_every_older_generation(
    sql_database: SqlDatabase, sql_target: SqlTarget
) -> None:
    """The target alone: a batch or watermark of a superseded generation fails FENCED
    and writes nothing; the current one commits; a reset supersedes every reader."""
    counters = sa.Table(
        "fence_counters",
        sql_database.metadata,
        sa.Column("stream_id", sa.String(255), primary_key=True),
        sa.Column("n", sa.Integer, nullable=False),
    )
    counters.create(sql_database.engine)
    with sql_database.engine.begin() as connection:
        connection.execute(counters.insert(), [{"stream_id": "s", "n": 0}])
    key = counting(counters).key()
    at = datetime(2024, 1, 1, tzinfo=UTC)
    bump = Update(counters, where={"stream_id": "s"}, values={"n": counters.c.n + 1})

    async def commit(position: int, fence: int) -> None:
        event = Event(f"e{position}", "s", "Counted", {}, position, at)
        await sql_target.apply_batch(key, [(event, bump)], {"s": position}, [], fence=fence)

    assert await sql_target.generation(key) == 0
    old = await sql_target.claim(key)
    await commit(1, old)
    new = await sql_target.claim(key)
    assert (old, new) == (1, 2)
    with pytest.raises(ApplyFailed) as refused:
        await commit(2, old)
    assert refused.value.kind is FailureKind.FENCED
    with pytest.raises(ApplyFailed) as refused_mark:
        await sql_target.save_watermark(key, 2, at, fence=old)
    assert refused_mark.value.kind is FailureKind.FENCED
    await commit(3, new)
    await sql_target.save_watermark(key, 3, at, fence=new)
    assert await sql_target.stream_position(key, "s") == 3
    with sql_database.engine.connect() as connection:
        assert connection.execute(sa.select(counters.c.n)).scalar_one() == 2
    await sql_target.reset(key, dead_letters=False)
    assert await sql_target.generation(key) == 3
    with pytest.raises(ApplyFailed) as after_reset:
        await commit(4, new)
    assert after_reset.value.kind is FailureKind.FENCED
    assert await sql_target.stream_position(key, "s") is None


@pytest.mark.asyncio
async def test_reset_refuses_while_another_connection_holds_the_lock(
    counted: Counted, targets: list[SqlTarget]
) -> None:
    counted.append(6)
    targets.append(counted.db.target())
    reads, writes = counted.source(), targets[0]

    class Owned(counting(counted.counters)):  # type: ignore[misc]
        name = "owned"
        source = reads
        target = writes

    key = Owned.key()
    async with Scriba() as runtime:
        await runtime.start(Owned, **FAST)
        async with asyncio.timeout(WAIT):
            await runtime.wait_until_caught_up(Owned)
        await runtime.stop(Owned)
    # Another process takes the projection's lock, as a source there would.
    holder: AdvisoryLock | FileLock
    if counted.db.dialect == "postgresql":
        url = sa.make_url(counted.db.url).set(drivername="postgresql")
        conninfo = url.render_as_string(hide_password=False)

        async def connect() -> psycopg.AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)

        holder = AdvisoryLock(connect, lock_key(key))
    else:
        holder = FileLock(lock_path_beside(str(counted.db.engine.url.database), key))
    assert await holder.try_acquire()
    try:
        async with Scriba() as other:
            with pytest.raises(ProjectionBusy):
                await other.reset(Owned)
        assert await targets[0].load_positions(key, 10) == {"s0": 4, "s1": 5, "s2": 6}
    finally:
        await holder.release()
    async with Scriba() as other:
        counts = await other.reset(Owned)
    assert (counts.positions, counts.watermarks) == (3, 1)
    assert await targets[0].load_positions(key, 10) == {}


@pytest.mark.asyncio
async def test_lag_in_events_is_measured_against_the_tables_head(
    counted: Counted, targets: list[SqlTarget]
) -> None:
    counted.append(10)
    targets.append(counted.db.target())
    projection = counting(counted.counters)
    async with Scriba() as runtime:
        await runtime.start(projection, source=counted.source, target=targets[0], **FAST)
        async with asyncio.timeout(WAIT):
            await runtime.wait_until_caught_up(projection)
        caught_up = await runtime.info(projection)
        runtime.pause(projection)
        await asyncio.sleep(0.05)  # what was read is handled and committed
        counted.append(7)
        paused = await runtime.info(projection)
        runtime.resume(projection)
        async with asyncio.timeout(WAIT):
            await runtime.wait_until_caught_up(projection)
        resumed = await runtime.info(projection)
    assert (caught_up.safe_position, caught_up.lag_events) == (10, 0)
    assert (paused.safe_position, paused.lag_events, paused.standby) == (10, 7, False)
    assert (resumed.safe_position, resumed.lag_events) == (17, 0)


@pytest.mark.asyncio
async def test_a_failure_between_the_read_model_and_the_cursor_commits_neither(
    counted: Counted, targets: list[SqlTarget]
) -> None:
    """PD2: the cursor upsert is made to fail, at random, after the read-model writes of
    its batch ran in the same transaction. Whatever fails, nothing is half-committed:
    each event ends counted exactly once, with its row, under its stream's cursor."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    rows = sa.Table(
        f"rows_{uuid.uuid4().hex[:8]}",
        counted.db.metadata,
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("stream_id", sa.String(255), nullable=False),
    )
    rows.create(counted.db.engine)
    counted.append(120)
    target = counted.db.target()
    targets.append(target)
    positions_table = counted.db.tables.positions.name
    injected: list[int] = []
    observed: list[tuple[dict[str, int], set[int], dict[str, int]]] = []

    def before_execute(
        conn: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        cursor_write = statement.lstrip().upper().startswith("INSERT")
        if cursor_write and positions_table in statement and rng.random() < 0.4:
            injected.append(1)
            # A lost connection, as the driver would report it: transient.
            raise ConnectionResetError("injected between the read model and the cursors")

    engine = counted.db.engine if counted.db.dialect == "sqlite" else _sync_engine_of(target)
    sa.event.listen(engine, "before_cursor_execute", before_execute)

    class Both(Projection):
        name = "pd2"
        parallelism = 2

        def handle(self, event: Event, meta: Meta) -> Result:
            return Multi(
                (
                    Insert(rows, {"position": event.position, "stream_id": event.stream_id}),
                    Update(
                        counted.counters,
                        where={"stream_id": event.stream_id},
                        values={"n": counted.counters.c.n + 1},
                    ),
                )
            )

    try:
        async with Scriba() as runtime:
            await runtime.start(Both, source=counted.source, target=target, batch_size=7, **FAST)
            async with asyncio.timeout(WAIT):
                while True:
                    info = await runtime.info(Both)
                    if info.safe_position == 120 or info.status is Status.HALTED:
                        break
                    observed.append(_state(counted, rows, target))
                    await asyncio.sleep(0.005)
    finally:
        sa.event.remove(engine, "before_cursor_execute", before_execute)
    assert injected, "no failure was injected"
    assert info.status is Status.RUNNING, info.halt_reason
    for counts, row_positions, cursors in [*observed, _state(counted, rows, target)]:
        # Rows and counts only ever move with the cursors they were committed with.
        assert sum(counts.values()) == len(row_positions)
        for position in row_positions:
            stream = f"s{(position - 1) % 3}"
            assert cursors.get(stream, 0) >= position
    counts, row_positions, cursors = _state(counted, rows, target)
    assert row_positions == set(range(1, 121))
    assert counts == {"s0": 40, "s1": 40, "s2": 40}
    assert cursors == {"s0": 118, "s1": 119, "s2": 120}


def _sync_engine_of(target: SqlTarget) -> sa.Engine:
    """The synchronous engine under a PostgreSQL target's asyncio one (where
    SQLAlchemy's execution events fire)."""
    runner: Any = target._runner  # the test's seam into the transaction
    engine: sa.Engine = runner._engine.sync_engine
    return engine


def _state(
    counted: Counted, rows: sa.Table, target: SqlTarget
) -> tuple[dict[str, int], set[int], dict[str, int]]:
    """Counts, row positions and cursors, read in one snapshot."""
    positions = target.tables.positions
    with counted.db.engine.begin() as connection:
        if counted.db.dialect == "postgresql":
            connection.execute(sa.text("set transaction isolation level repeatable read"))
        counters = counted.counters
        query = sa.select(counters.c.stream_id, counters.c.n)
        counts = {row.stream_id: row.n for row in connection.execute(query)}
        row_positions = set(connection.execute(sa.select(rows.c.position)).scalars())
        marks = sa.select(positions.c.stream_id, positions.c.position)
        cursors = {row.stream_id: row.position for row in connection.execute(marks)}
    return counts, row_positions, cursors
