"""Benchmark: durable steps of ``statifier.persistence`` on SQLite and PostgreSQL, beside
the raw driver running the same SQL statements without the library (the ceiling).

Run from the repository root, with the project installed (``pip install -e '.[postgres]'``)
or from a checkout::

    PYTHONPATH=src python3 bench/persistence.py              # both databases
    python bench/persistence.py --quick                      # short run
    python bench/persistence.py --only sqlite                # one database
    python bench/persistence.py --url postgresql://...       # another PostgreSQL
    python bench/persistence.py --json out.json              # also write the numbers
    python bench/persistence.py --profile sqlite             # cProfile of the library row

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the benchmark works in a schema of its
own and drops it at the end. SQLite is a file in a temporary directory (WAL, as the
adapter opens it).

What it measures, per database, in the same run:

* ``library``: 8 executions of a small chart (two states and a counter in the
  datamodel), each stepped by a task of its own with the event ``next``, all at once:
  ``Executions.step`` over ``Storage(SqlAdapter(...))`` with the default serialization
  (the adapter's lock, no lock wait). One step is the whole durable operation: lock,
  ``fetch_execution`` (``FOR UPDATE`` on PostgreSQL), the identity-guarded load of the
  position, the pure interpreter, the stored position, ``record_step`` (the row's update
  and the input-log append: one statement on PostgreSQL, two on SQLite), commit.
* ``fernet``: the ``library`` row with its blobs encrypted at rest:
  ``Storage(SqlAdapter(...), codec=FernetCodec([key]))`` (extra ``crypto``), so each step
  decrypts the position it loads and encrypts the position and the input it stores.
  Reported with its ratio to the ``library`` row (``--no-fernet`` leaves it out).
* ``raw driver``: the same 8 tasks run the same statements per step, written out by
  hand on the driver (``sqlite3``; psycopg 3 async, one connection per task), with the
  stored position written back as it was read: SQLite ``BEGIN IMMEDIATE`` under one
  asyncio lock, the select, the update of the position alone (the adapter's form for
  a step that changed nothing else), the insert into the input log, ``COMMIT``;
  PostgreSQL ``pg_advisory_xact_lock``, ``SELECT ... FOR UPDATE``, the update of every
  column a step writes and the insert in one statement, ``COMMIT``. This is the
  ceiling: what the database and the driver cost.

* ``DBOS``: DBOS Transact doing the same idiomatically on the same database server
  (``bench/dbos_anchor.py``): a workflow per execution receiving its ``--steps`` events
  with ``DBOS.recv_async``, sent with ``DBOS.send_async`` by one task per workflow; run
  once per database after the rounds (``--no-dbos`` leaves it out; it needs the ``dbos``
  package of the ``bench`` extra). Project goal: the library at least 10x its events/s.

The rows take turns (rounds of ``--steps`` steps per execution, in a rotating order) so
drifting load hits them alike. Reported: steps per second (the median over rounds of
all steps of a round over its wall time), p50 and p99 step latency (over every step of
every round), the ratio library / raw, and this process's CPU time per step (``cpu us``,
which load from other processes barely moves; PostgreSQL's own work is not in it).
Project goal: at least 0.7 on both databases.
Every step commits durably (SQLite ``synchronous`` FULL in WAL, PostgreSQL
``synchronous_commit`` on), so the disk's flush time is part of both rows.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import dbos_anchor
from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_profile,
    print_table_header,
    rotated,
    verdict,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core.positions import dump_event
from statifier.persistence import PLAIN, BlobCodec, Executions, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions, migrations
from statifier.sql.dialect import execution_lock_key

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="left">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="left">
    <transition event="next" target="right"><assign location="count" expr="count + 1"/></transition>
  </state>
  <state id="right">
    <transition event="next" target="left"><assign location="count" expr="count + 1"/></transition>
  </state>
</scxml>
"""
EXECUTIONS = 8
GOAL = 0.7
DBOS_GOAL = 10.0
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"

Step = Callable[[str], Awaitable[None]]


async def _round(step: Step, ids: Sequence[str], steps: int) -> tuple[float, list[float]]:
    """One round: every execution stepped ``steps`` times by its own task, all at once.
    Answers the wall time and every step's latency."""
    latencies: list[float] = []

    async def worker(execution_id: str) -> None:
        clock = time.perf_counter
        for _ in range(steps):
            started = clock()
            await step(execution_id)
            latencies.append(clock() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker(execution_id) for execution_id in ids))
    return time.perf_counter() - started, latencies


# --- the library ------------------------------------------------------------------------


class Library:
    """The row under test: ``Executions.step`` through ``SqlAdapter``."""

    def __init__(self, url: str, options: TableOptions, codec: BlobCodec = PLAIN) -> None:
        self.adapter = SqlAdapter(url, options)
        self.executions = Executions(Storage(self.adapter, codec=codec))
        self.machine = compile_chart(CHART)
        self.event = Event("next")

    async def create(self, ids: Sequence[str]) -> None:
        for execution_id in ids:
            await self.executions.create(execution_id, self.machine)

    async def step(self, execution_id: str) -> None:
        await self.executions.step(execution_id, self.machine, self.event)

    async def close(self) -> None:
        await self.adapter.close()


# --- the raw drivers --------------------------------------------------------------------

_SELECT = (
    "SELECT execution_id, content_hash, status, position_blob, metadata, outcome_blob, "
    "failure, created_at, updated_at, ended_at, error_count, last_error_at, final_state "
    "FROM {e} WHERE execution_id = {p}{lock}"
)
_APPEND = (
    "INSERT INTO {i} (execution_id, seq, via, input_blob, recorded_at) "
    "SELECT {p} AS anon_1, following.seq, {p} AS anon_2, "
    "CASE WHEN (CAST({p} AS INTEGER) IS NOT NULL AND following.seq >= CAST({p} AS INTEGER) - 1) "
    "THEN NULL ELSE {p} END AS anon_3, "
    "{p} AS anon_4 FROM (SELECT coalesce(max({i}.seq), -1) + 1 AS seq FROM {i} "
    "WHERE {i}.execution_id = {p}) AS following WHERE NOT (EXISTS (SELECT 1 AS anon_5 "
    "FROM {i} AS last WHERE last.execution_id = {p} AND last.seq = following.seq - 1 "
    "AND last.input_blob IS NULL)) RETURNING seq"
)
_UPDATE = (
    "UPDATE {e} SET status={p}, position_blob={p}, outcome_blob={p}, failure={p}, "
    "updated_at={p}, ended_at={p}, error_count={p}, last_error_at={p}, final_state={p} "
    "WHERE execution_id = {p}"
)
# SQLite: the adapter's update of a step that changed only the position (the row's
# other columns already hold the values given), which writes no index page.
_UPDATE_POSITION = (
    "UPDATE {e} SET position_blob = {p}, updated_at = {p} WHERE execution_id = {p} "
    "AND status = {p} AND outcome_blob IS {p} AND failure IS {p} AND ended_at IS {p} "
    "AND error_count = {p} AND last_error_at IS {p} AND final_state IS {p}"
)
# PostgreSQL: the step's two writes in one statement, as the adapter's record_step
# runs them (the append only where the update found the row).
_RECORD_STEP = (
    "WITH stepped AS ("
    + _UPDATE
    + " RETURNING 1), logged AS ("
    + _APPEND.replace(" RETURNING seq", " AND EXISTS (SELECT 1 FROM stepped) RETURNING seq")
    + ") SELECT (SELECT count(*) FROM stepped), (SELECT seq FROM logged)"
)


def _sql(template: str, options: TableOptions, placeholder: str, lock: str = "") -> str:
    schema = f"{options.schema}." if options.schema else ""
    return template.format(
        e=f"{schema}{options.name('executions')}",
        i=f"{schema}{options.name('inputs')}",
        p=placeholder,
        lock=lock,
    )


class RawSqlite:
    """The same statements on one ``sqlite3`` connection, one writer at a time."""

    def __init__(self, path: str, options: TableOptions, event: bytes) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None)
        self.connection.execute("PRAGMA busy_timeout = 0")
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.lock = asyncio.Lock()
        self.event = event
        self.select = _sql(_SELECT, options, "?")
        self.append = _sql(_APPEND, options, "?")
        self.update = _sql(_UPDATE_POSITION, options, "?")

    async def step(self, execution_id: str) -> None:
        async with self.lock:
            cursor = self.connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            row = cursor.execute(self.select, (execution_id,)).fetchone()
            now = datetime.now(UTC).replace(tzinfo=None).isoformat(" ")
            unchanged = ("active", None, None, None, 0, None, None)
            cursor.execute(self.update, (row[3], now, execution_id, *unchanged))
            cursor.execute(
                self.append,
                (execution_id, "step", None, None, self.event, now, execution_id, execution_id),
            ).fetchall()
            cursor.execute("COMMIT")

    async def close(self) -> None:
        self.connection.close()


class RawPostgres:
    """The same statements on psycopg 3 async, one connection per task."""

    def __init__(self, url: str, options: TableOptions, event: bytes) -> None:
        self.url = url
        self.event = event
        self.connections: dict[str, Any] = {}
        self.lock = "SELECT pg_advisory_xact_lock(%s)"
        self.select = _sql(_SELECT, options, "%s", " FOR UPDATE")
        self.record_step = _sql(_RECORD_STEP, options, "%s")

    async def open(self, ids: Sequence[str]) -> None:
        import psycopg

        for execution_id in ids:
            self.connections[execution_id] = await psycopg.AsyncConnection.connect(self.url)

    async def step(self, execution_id: str) -> None:
        connection = self.connections[execution_id]
        async with connection.cursor() as cursor:
            await cursor.execute(self.lock, (execution_lock_key(execution_id),))
            await cursor.execute(self.select, (execution_id,))
            row = await cursor.fetchone()
            now = datetime.now(UTC)
            row_values = ("active", row[3], None, None, now, None, 0, None, None, execution_id)
            log_values = (execution_id, "step", None, None, self.event, now)
            await cursor.execute(
                self.record_step, (*row_values, *log_values, execution_id, execution_id)
            )
            await cursor.fetchone()
        await connection.commit()

    async def close(self) -> None:
        for connection in self.connections.values():
            await connection.close()


# --- running ----------------------------------------------------------------------------


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _codec_cost(library: Library, execution_id: str, repeats: int = 2_000) -> dict[str, Any]:
    """The Fernet codec's own work per step, in process and without the database: one
    decode of the stored position, one encode of it and one of the logged event, on the
    very bytes a step of this benchmark stores. (A step of an execution whose position
    the same storage wrote last skips the decode.)"""
    record = await library.executions.storage.fetch_execution(execution_id)
    assert record.position is not None
    position, event = record.position, dump_event(library.event)
    codec = _fernet()
    sealed = codec.encode(position)
    started = time.perf_counter()
    for _ in range(repeats):
        codec.decode(sealed)
        codec.encode(position)
        codec.encode(event)
    per_step = (time.perf_counter() - started) / repeats
    return {
        "position_bytes": len(position),
        "event_bytes": len(event),
        "us_per_step": per_step * 1e6,
    }


def _fernet() -> BlobCodec:
    from statifier.persistence.fernet import FernetCodec

    return FernetCodec([FernetCodec.generate_key()])


async def _database(
    name: str,
    url: str,
    options: TableOptions,
    rounds: int,
    steps: int,
    keep_gc: bool,
    fernet: bool = True,
) -> dict[str, Any]:
    ids = [f"bench-{index}" for index in range(EXECUTIONS)]
    library = Library(url, options)
    await library.create(ids)
    # The encrypted row steps executions of its own, in tables of its own beside the
    # others (one database holds blobs of one codec: the chart row is shared by hash).
    sealed_ids = [f"sealed-{index}" for index in range(EXECUTIONS)]
    sealed: Library | None = None
    if fernet:
        sealed_options = TableOptions(prefix="bench_sealed_", schema=options.schema)
        await asyncio.to_thread(migrations.upgrade, url, sealed_options)
        sealed = Library(url, sealed_options, _fernet())
        await sealed.create(sealed_ids)
    stored_event = dump_event(library.event)
    raw: RawSqlite | RawPostgres
    if name == "sqlite":
        raw = RawSqlite(url.removeprefix("sqlite:///"), options, stored_event)
    else:
        raw = RawPostgres(url, options, stored_event)
        await raw.open(ids)
    rows: dict[str, Step] = {"library": library.step, "raw driver": raw.step}
    row_ids = {"library": ids, "raw driver": ids}
    if sealed is not None:
        rows["fernet"] = sealed.step
        row_ids["fernet"] = sealed_ids
    rates: dict[str, list[float]] = {row: [] for row in rows}
    latencies: dict[str, list[float]] = {row: [] for row in rows}
    # This process's CPU time per step: unlike the rates, it barely moves when other
    # processes load the machine (PostgreSQL's own work is not in it).
    cpu: dict[str, float] = dict.fromkeys(rows, 0.0)
    try:
        for row, step in rows.items():  # warm up: connections, prepared statements
            await _round(step, row_ids[row], 5)
        with collector_paused(keep_gc):
            for turn in range(rounds):
                for row in rotated(list(rows), turn):
                    cpu_started = time.process_time()
                    elapsed, samples = await _round(rows[row], row_ids[row], steps)
                    cpu[row] += time.process_time() - cpu_started
                    rates[row].append(len(samples) / elapsed)
                    latencies[row].extend(samples)
        cost = await _codec_cost(library, ids[0]) if sealed is not None else None
    finally:
        await raw.close()
        await library.close()
        if sealed is not None:
            await sealed.close()
    result: dict[str, Any] = {}
    for row in rows:
        result[row] = {
            "median_steps_per_s": statistics.median(rates[row]),
            "p50_ms": _percentile(latencies[row], 0.50) * 1e3,
            "p99_ms": _percentile(latencies[row], 0.99) * 1e3,
            "samples_steps_per_s": rates[row],
            "cpu_us_per_step": cpu[row] / len(latencies[row]) * 1e6,
        }
    result["ratio"] = (
        result["library"]["median_steps_per_s"] / result["raw driver"]["median_steps_per_s"]
    )
    if cost is not None:
        result["fernet_codec"] = cost
    if sealed is not None:
        result["fernet_ratio"] = (
            result["fernet"]["median_steps_per_s"] / result["library"]["median_steps_per_s"]
        )
        result["fernet_cpu_ratio"] = (
            result["fernet"]["cpu_us_per_step"] / result["library"]["cpu_us_per_step"]
        )
    return result


def _prepare(name: str, postgres_url: str, directory: str) -> tuple[str, TableOptions]:
    if name == "sqlite":
        url = f"sqlite:///{os.path.join(directory, 'bench.db')}"
        options = TableOptions(prefix="bench_")
    else:
        url = postgres_url
        options = TableOptions(prefix="bench_", schema=f"statifier_bench_{uuid.uuid4().hex[:8]}")
    migrations.upgrade(url, options)
    return url, options


def _drop(name: str, url: str, options: TableOptions) -> None:
    if name == "postgresql" and options.schema is not None:
        import sqlalchemy as sa

        engine = sa.create_engine(migrations.sync_url(url))
        with engine.begin() as connection:
            connection.execute(sa.schema.DropSchema(options.schema, cascade=True))
        engine.dispose()


def _profile(name: str, postgres_url: str, steps: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        url, options = _prepare(name, postgres_url, directory)

        async def run() -> None:
            ids = [f"bench-{index}" for index in range(EXECUTIONS)]
            library = Library(url, options)
            await library.create(ids)
            profiler = cProfile.Profile()
            profiler.enable()
            await _round(library.step, ids, steps)
            profiler.disable()
            await library.close()
            print_profile(profiler, 40)

        try:
            asyncio.run(run())
        finally:
            _drop(name, url, options)


def _dbos(name: str, postgres_url: str, directory: str, steps: int) -> dict[str, Any]:
    """DBOS's row: a workflow per execution, each sent ``steps`` events."""
    measured = dbos_anchor.run(
        name,
        postgres_url,
        directory,
        keys=EXECUTIONS,
        events=steps,
        senders=EXECUTIONS,
        wait_s=max(120.0, steps * 2.0),
    )
    latencies = sorted(measured.latencies)
    return {
        "median_steps_per_s": measured.rate,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: fewer rounds and steps")
    parser.add_argument("--rounds", type=int, help="rounds per row (default 7, quick 3)")
    parser.add_argument("--steps", type=int, help="steps per execution and round (default 100)")
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", help="the PostgreSQL URL")
    parser.add_argument("--no-dbos", action="store_true", help="leave the DBOS row out")
    parser.add_argument(
        "--no-fernet", action="store_true", help="leave the encrypted (Fernet) row out"
    )
    parser.add_argument(
        "--profile", choices=("sqlite", "postgresql"), help="cProfile the library row instead"
    )
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    steps = args.steps or (40 if args.quick else 100)
    postgres_url = args.url or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES
    if args.profile:
        _profile(args.profile, postgres_url, steps)
        return 0

    with_dbos = not args.no_dbos and dbos_anchor.available()
    info = machine_info(["statifier", "sqlalchemy", "psycopg", "alembic", "dbos"])
    print(machine_summary(info))
    print(versions_line(info))
    print(
        f"{EXECUTIONS} executions at once, {rounds} rounds of {steps} steps each per row; "
        f"collector {collector_state(args.gc)}\n"
    )
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    results: dict[str, Any] = {}
    header = (
        f"{'database':<11} {'row':<11} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>7}"
        f" {'cpu us':>8}"
    )
    print_table_header(header)
    for name in databases:
        with tempfile.TemporaryDirectory() as directory:
            url, options = _prepare(name, postgres_url, directory)
            try:
                result = asyncio.run(
                    _database(name, url, options, rounds, steps, args.gc, not args.no_fernet)
                )
            finally:
                _drop(name, url, options)
            if with_dbos:
                result["DBOS"] = _dbos(name, postgres_url, directory, steps)
                library = result["library"]["median_steps_per_s"]
                result["dbos_ratio"] = library / result["DBOS"]["median_steps_per_s"]
        results[name] = result
        for row in ("raw driver", "library", "fernet", "DBOS"):
            if row not in result:
                continue
            cells = result[row]
            ratio = ""
            if row == "library":
                ratio = fmt_ratio(result["ratio"])
            elif row == "fernet":
                ratio = fmt_ratio(result["fernet_ratio"])
            elif row == "DBOS":
                ratio = f"1/{result['dbos_ratio']:.1f}"
            cpu = cells.get("cpu_us_per_step")
            print(
                f"{name:<11} {row:<11} {cells['median_steps_per_s']:>9,.0f} "
                f"{cells['p50_ms']:>8.2f} {cells['p99_ms']:>8.2f} {ratio:>7} "
                f"{'' if cpu is None else f'{cpu:,.0f}':>8}"
            )
    print()
    for name, result in results.items():
        met = result["ratio"] >= GOAL
        print(f"goal (library >= {GOAL} of the raw driver) on {name}: {verdict(met)}")
        if "fernet_ratio" in result:
            cost = result["fernet_codec"]
            print(
                f"encrypted blobs (Fernet) on {name}: {result['fernet_ratio']:.2f} of the "
                f"library row's steps/s, {result['fernet_cpu_ratio']:.2f} of its CPU time a "
                f"step; the codec's own work {cost['us_per_step']:.0f} us "
                f"a step (a {cost['position_bytes']}-byte position decoded and encoded, a "
                f"{cost['event_bytes']}-byte event encoded)"
            )
        if "dbos_ratio" in result:
            met = result["dbos_ratio"] >= DBOS_GOAL
            print(
                f"goal (library >= {DBOS_GOAL:.0f}x DBOS) on {name}: {verdict(met)} "
                f"({result['dbos_ratio']:.1f}x)"
            )
    if args.json:
        write_json(
            args.json,
            "persistence",
            {
                "machine": info,
                "executions": EXECUTIONS,
                "rounds": rounds,
                "steps": steps,
                "collector": collector_state(args.gc),
                "results": results,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
