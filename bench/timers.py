"""Benchmark: the built-in durable timer queue's worker (``statifier.router.timer_worker``)
on PostgreSQL, beside the raw psycopg driver claiming, deleting and stepping the same
timers by hand.

Run from the repository root, with the project installed (``pip install -e '.[postgres]'``)
or from a checkout::

    PYTHONPATH=bench:src python bench/timers.py            # the full run
    python bench/timers.py --quick                          # short run
    python bench/timers.py --url postgresql://...           # another PostgreSQL
    python bench/timers.py --json out.json                  # also write the numbers

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the rows work in a schema of their own,
dropped at the end.

The workload: ``--executions`` (200) counter executions (one state whose
self-transition on ``tick`` adds one to a datamodel counter), and ``--timers`` (4,000)
external ``tick`` timers, spread round-robin over them, scheduled through the library's
queue (``SqlTimerQueue.schedule``) before each pass, every one already due.

Rows:

* ``raw``, the anchor: the library's claim-and-delete and a step's writes, by hand on
  one psycopg 3 async connection per worker. One transaction per batch of ``--batch``
  (100): the claim is the library's one statement (lock up to ``n`` due rows ``FOR
  UPDATE SKIP LOCKED`` in firing order, try each execution's advisory lock once,
  ``DELETE ... RETURNING`` the rows whose lock was granted and which no earlier row of
  their execution, held elsewhere, precedes), then per timer the execution row's
  ``UPDATE`` (a position prepared once: no interpreter work) and the input-log ``INSERT
  ... SELECT`` at the next ``seq``; ``COMMIT``. It never reads the execution row: a
  real step must (it steps from the stored position).
* ``raw, same statements`` (one worker; a diagnosis beside the anchor): the statements
  the library runs, by hand: the same claim, the batch's execution rows read ``FOR
  UPDATE`` in one ``SELECT``, then per timer the step's one write (the row's ``UPDATE``
  and the input-log append in one statement); ``COMMIT``. What separates it from the
  library is the library's Python.
* ``fire_due()``: the library, ``TimerWorker(router, batch=100).fire_due()`` until none
  is left.
* ``x2`` rows: the same in two worker processes (this script started again with
  ``--worker``), released together; timed from the release to the last exit.
* ``fire_due() x2, halves``: two processes each firing half of the buckets
  (``TimerWorker(router, buckets=...)``), as two services sharing a store with
  ``[bucket_leases]`` do, beside ``fire_due() x2``, where both read every bucket.

Reported: timers fired per second (the median over ``--rounds`` rounds, rows taking
turns), and the ratio fire_due() / raw (goal at least 0.7).

Then the lag: ``--lag-seconds`` (5) of timers due at a steady 1,000 per second (one
every millisecond, the first due after the schedule has committed), fired by
``TimerWorker.run`` (one worker, ``poll`` 1 s, in this process) and by the raw anchor
running the same loop
(a pass, then sleep until the next due time, at most 1 s). A timer's lag is its
input-log row's ``recorded_at`` (the clock when its step ran) minus its due time;
reported p50, p99 and max (goal p99 under 50 ms). ``run()`` runs again in two worker
processes sharing the 1,000 due timers per second (as workers on two machines would),
and at 250 due timers per second in one, a rate one worker sustains on a small
machine, to show the loop's own lag apart from a backlog. Every transaction commits durably
(``synchronous_commit`` on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
    verdict,
    versions_line,
    write_json,
)

from statifier.buckets import ALL_BUCKETS, BUCKETS
from statifier.chart import Machine, compile_chart
from statifier.core import Event, handle_event, initialize
from statifier.core.positions import dump, load_event
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver, TimerWorker
from statifier.router.routes import IdempotencyKey
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.transaction import Delivering
from statifier.sql import TableOptions, migrations
from statifier.sql.names import TableNames

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="counting">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="counting">
    <transition event="tick"><assign location="count" expr="count + 1"/></transition>
  </state>
</scxml>
"""
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
PREFIX = "bt_"
RATIO_GOAL = 0.7
LAG_GOAL_MS = 50.0
RATE = 1_000
"""Timers due per second in the lag run."""
SLOW_RATE = 250
"""A rate one worker keeps up with on a small machine: the lag of the loop itself."""
POLL = 1.0
SCHEDULE_LEAD = timedelta(seconds=1)
SCHEDULE_PER_TIMER = timedelta(microseconds=400)
"""Before the lag run's first due time: a second, and time to insert every row."""


class Raw:
    """The anchor's statements on one psycopg connection."""

    def __init__(self, tables: TableNames, same_statements: bool) -> None:
        self.same = same_statements
        order = "ORDER BY due_at, inserted_at, step_position, id"
        # The library's claim: each execution's lock tried once, and a row left while
        # an earlier row of its execution is held elsewhere.
        earlier = "(e.due_at, e.inserted_at, e.step_position, e.id)"
        mine = "(p.due_at, p.inserted_at, p.step_position, p.id)"
        self.claim = (
            "WITH picked AS MATERIALIZED (SELECT id, execution_id, due_at, inserted_at, "
            f"step_position FROM {tables.timers} "
            f"WHERE due_at <= %(now)s {order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
            "locked AS MATERIALIZED (SELECT execution_id FROM "
            "(SELECT DISTINCT execution_id FROM picked) AS d "
            "WHERE pg_try_advisory_xact_lock(hashtextextended(execution_id, 0))), "
            "granted AS MATERIALIZED (SELECT p.id FROM picked AS p "
            "WHERE p.execution_id IN (SELECT execution_id FROM locked) "
            f"AND NOT EXISTS (SELECT 1 FROM {tables.timers} AS e "
            "WHERE e.execution_id = p.execution_id "
            f"AND {earlier} < {mine} "
            "AND e.id NOT IN (SELECT id FROM picked))), "
            f"taken AS (DELETE FROM {tables.timers} AS t USING granted "
            "WHERE t.id = granted.id RETURNING t.id, t.execution_id, t.payload, "
            "t.due_at, t.inserted_at, t.step_position) "
            f"SELECT id, execution_id, payload FROM taken {order}"
        )
        self.read = (
            f"SELECT status, position_blob FROM {tables.executions} "
            "WHERE execution_id = ANY(%(ids)s) ORDER BY execution_id FOR UPDATE"
        )
        self.update = (
            f"UPDATE {tables.executions} SET position_blob = %(position)s, "
            "updated_at = %(now)s WHERE execution_id = %(id)s"
        )
        self.append = (
            f"INSERT INTO {tables.inputs} (execution_id, seq, via, input_blob, recorded_at) "
            "SELECT %(id)s, coalesce(max(seq), -1) + 1, 'timer', %(blob)s, %(now)s "
            f"FROM {tables.inputs} WHERE execution_id = %(id)s"
        )
        # The step's writes as the library makes them: one statement, the log's
        # append gated on the row's update (and on a log not closed by its cap).
        self.step = (
            f"WITH stepped AS ({self.update} RETURNING 1), "
            f"logged AS (INSERT INTO {tables.inputs} "
            "(execution_id, seq, via, input_blob, recorded_at) "
            "SELECT %(id)s, following.seq, 'timer', %(blob)s, %(now)s "
            "FROM (SELECT coalesce(max(seq), -1) + 1 AS seq "
            f"FROM {tables.inputs} WHERE execution_id = %(id)s) AS following "
            f"WHERE NOT EXISTS (SELECT 1 FROM {tables.inputs} AS last "
            "WHERE last.execution_id = %(id)s AND last.seq = following.seq - 1 "
            "AND last.input_blob IS NULL) AND EXISTS (SELECT 1 FROM stepped) RETURNING seq) "
            "SELECT (SELECT count(*) FROM stepped), (SELECT seq FROM logged)"
        )
        self.earliest = f"SELECT min(due_at) FROM {tables.timers}"

    async def batch(
        self, connection: psycopg.AsyncConnection[Any], position: bytes, limit: int
    ) -> tuple[int, int]:
        """One transaction: claim and fire a batch. Answers (fired, deadlocks)."""
        deadlocks = 0
        while True:
            try:
                return await self._batch(connection, position, limit), deadlocks
            except psycopg.errors.DeadlockDetected:
                deadlocks += 1  # rolled back: run it again

    async def _batch(
        self, connection: psycopg.AsyncConnection[Any], position: bytes, limit: int
    ) -> int:
        fired = 0
        async with connection.transaction():
            now = datetime.now(UTC)
            cursor = await connection.execute(self.claim, {"now": now, "limit": limit})
            taken = await cursor.fetchall()
            if self.same and taken:  # the library's: the batch's rows read at once
                ids = sorted({execution_id for _, execution_id, _ in taken})
                await (await connection.execute(self.read, {"ids": ids})).fetchall()
            for _, execution_id, payload in taken:
                blob = json.dumps(payload["event"]).encode()
                values = {"id": execution_id, "position": position, "blob": blob}
                if self.same:
                    values["now"] = datetime.now(UTC)
                    await (await connection.execute(self.step, values)).fetchone()
                else:
                    # The row first: its lock keeps two workers' next seq apart.
                    values["now"] = datetime.now(UTC)
                    await connection.execute(self.update, values)
                    await connection.execute(self.append, values)
                fired += 1
        return fired

    async def next_due(self, connection: psycopg.AsyncConnection[Any]) -> datetime | None:
        cursor = await connection.execute(self.earliest)
        row = await cursor.fetchone()
        await connection.commit()
        return None if row is None else row[0]


def _position(machine: Machine) -> bytes:
    state, _ = initialize(machine)
    state, _ = handle_event(state, Event("tick"))
    return dump(state)


def _options(schema: str) -> TableOptions:
    return TableOptions(prefix=PREFIX, schema=schema)


def _router(adapter: SqlAdapter) -> Router:
    return Router(RouterConfig(adapter, bindings=[], resolver=StaticResolver({})))


def _entry(execution_id: str, k: int, due_at: datetime) -> TimerEntry:
    key = IdempotencyKey(
        execution_id,
        send_id=f"t{k}",
        macrostep=k,
        microstep=1,
        round=0,
        content_index=0,
        ordinal=0,
    )
    return TimerEntry(
        execution_id=execution_id,
        send_id=f"t{k}",
        key=key,
        due_at=due_at,
        step_position=0,
        kind=TimerKind.EXTERNAL,
        event=Event("tick", data={"k": k}),
    )


async def _schedule(router: Router, executions: int, dues: list[datetime]) -> None:
    assert router.timers is not None
    async with router.transaction() as unit:
        for k, due_at in enumerate(dues):
            await router.timers.schedule(unit.tx, _entry(f"ex_{k % executions}", k, due_at))


async def _raw_drain(url: str, names: TableNames, same: bool, batch: int) -> tuple[int, int]:
    position = _position(compile_chart(CHART))
    raw = Raw(names, same)
    fired = deadlocks = 0
    async with await psycopg.AsyncConnection.connect(url) as connection:
        while True:
            done, dead = await raw.batch(connection, position, batch)
            fired, deadlocks = fired + done, deadlocks + dead
            if done == 0:
                if await raw.next_due(connection) is None:
                    return fired, deadlocks
                await asyncio.sleep(0.005)  # what is left is the other worker's


async def _ours_drain(router: Router, batch: int, buckets: tuple[int, int] = ALL_BUCKETS) -> int:
    worker = TimerWorker(router, batch=batch, buckets=buckets)
    taken = 0
    while True:
        taken += await worker.fire_due()
        if await worker.next_due() is None:
            return taken
        await asyncio.sleep(0.005)  # what is left is the other worker's


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


async def _worker_main(url: str, schema: str, mode: str, batch: int, half: int) -> None:
    """``--worker``: one worker process of an ``x2`` row (``half``: which half of the
    buckets a ``halves`` worker fires)."""
    names = TableNames.of(_options(schema).define())
    async with SqlAdapter(url, _options(schema)) as adapter:
        router = _router(adapter)
        await TimerWorker(router).next_due()  # connected and warm
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if mode == "run":
            await _run_until_told(router)
            fired, deadlocks = 0, 0
        elif mode == "raw":
            fired, deadlocks = await _raw_drain(_libpq(url), names, False, batch)
        elif mode == "halves":
            middle = BUCKETS // 2
            buckets = (0, middle) if half == 0 else (middle, BUCKETS)
            fired, deadlocks = await _ours_drain(router, batch, buckets), 0
        else:
            fired, deadlocks = await _ours_drain(router, batch), 0
    print(json.dumps({"fired": fired, "deadlocks": deadlocks}), flush=True)


async def _run_until_told(router: Router) -> None:
    """``--worker run``: ``TimerWorker.run`` until a line on standard input."""
    stop = asyncio.Event()
    running = asyncio.create_task(TimerWorker(router, poll=POLL).run(stop))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await running


def _started_workers(url: str, schema: str, mode: str, batch: int) -> list[subprocess.Popen[str]]:
    """Two ``--worker`` processes, connected, warm and told to go."""
    command = [sys.executable, __file__, "--worker", mode, "--schema", schema]
    command += ["--url", url, "--batch", str(batch)]
    processes = [
        subprocess.Popen(
            [*command, "--half", str(half)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for half in range(2)
    ]
    for process in processes:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker process did not start")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    return processes


def _two_processes(url: str, schema: str, mode: str, batch: int) -> tuple[float, int, int]:
    processes = _started_workers(url, schema, mode, batch)
    started = time.perf_counter()
    fired = deadlocks = 0
    for process in processes:
        out, _ = process.communicate(timeout=300)
        if process.returncode != 0:
            raise RuntimeError(f"a worker process failed: {process.returncode}")
        answer = json.loads(out.strip().splitlines()[-1])
        fired += answer["fired"]
        deadlocks += answer["deadlocks"]
    return time.perf_counter() - started, fired, deadlocks


async def _count_inputs(url: str, names: TableNames) -> int:
    async with await psycopg.AsyncConnection.connect(url) as connection:
        cursor = await connection.execute(f"SELECT count(*) FROM {names.inputs}")
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def _throughput(
    url: str, schema: str, router: Router, row: str, timers: int, executions: int, batch: int
) -> tuple[float, int]:
    """One pass of one row: schedule, fire all, check. Answers (timers/s, deadlocks)."""
    names = TableNames.of(_options(schema).define())
    libpq = _libpq(url)
    past = datetime.now(UTC) - timedelta(hours=1)
    await _schedule(router, executions, [past + timedelta(microseconds=k) for k in range(timers)])
    before = await _count_inputs(libpq, names)
    deadlocks = 0
    started = time.perf_counter()
    if row == "raw":
        fired, deadlocks = await _raw_drain(libpq, names, False, batch)
    elif row == "raw, same statements":
        fired, deadlocks = await _raw_drain(libpq, names, True, batch)
    elif row == "fire_due()":
        fired = await _ours_drain(router, batch)
    else:
        mode = "raw" if row.startswith("raw") else "halves" if row.endswith("halves") else "ours"
        elapsed, fired, deadlocks = await asyncio.to_thread(
            _two_processes, url, schema, mode, batch
        )
        started = time.perf_counter() - elapsed
    elapsed = time.perf_counter() - started
    logged = await _count_inputs(libpq, names) - before
    if fired != timers or logged != timers:
        raise RuntimeError(f"{row}: fired {fired}, logged {logged}, expected {timers}")
    return timers / elapsed, deadlocks


async def _lags(url: str, names: TableNames, t0: datetime, rate: int) -> list[float]:
    """Every lag of the lag run, in milliseconds."""
    async with await psycopg.AsyncConnection.connect(url) as connection:
        cursor = await connection.execute(
            f"SELECT input_blob, recorded_at FROM {names.inputs} WHERE recorded_at >= %(t)s",
            {"t": t0 - timedelta(seconds=1)},
        )
        rows = await cursor.fetchall()
    lags = []
    for blob, recorded_at in rows:
        data = load_event(bytes(blob)).data
        assert isinstance(data, dict)
        k = data["k"]
        assert isinstance(k, int)
        due = t0 + timedelta(seconds=k / rate)
        lags.append((recorded_at - due).total_seconds() * 1000)
    return lags


async def _lag_run(
    url: str,
    schema: str,
    router: Router,
    row: str,
    seconds: float,
    executions: int,
    rate: int,
) -> list[float]:
    names = TableNames.of(_options(schema).define())
    count = int(seconds * rate)
    workers = _started_workers(url, schema, "run", 100) if row == "run() x2" else []
    # The first timer is due after the schedule has committed: a schedule still running
    # at t0 would start every row with a backlog and measure the insert, not the worker.
    t0 = datetime.now(UTC) + SCHEDULE_LEAD + count * SCHEDULE_PER_TIMER
    await _schedule(router, executions, [t0 + timedelta(seconds=k / rate) for k in range(count)])
    if datetime.now(UTC) >= t0:
        raise RuntimeError(f"{row}: scheduling ran past the first due time")
    if row == "fire_due()":
        worker = TimerWorker(router, poll=POLL)
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        deadline = t0 + timedelta(seconds=seconds + 60)
        while datetime.now(UTC) < deadline:
            await asyncio.sleep(0.25)
            if datetime.now(UTC) > t0 + timedelta(seconds=seconds) and (
                await worker.next_due() is None
            ):
                break
        stop.set()
        await running
    elif workers:
        await _until_drained(router, t0 + timedelta(seconds=seconds))
        for process in workers:
            process.communicate("stop\n", timeout=60)
            if process.returncode != 0:
                raise RuntimeError(f"a worker process failed: {process.returncode}")
    else:
        await _raw_loop(_libpq(url), names)
    lags = await _lags(_libpq(url), names, t0, rate)
    if len(lags) != count:
        raise RuntimeError(f"{row}: {len(lags)} of {count} timers fired")
    return lags


async def _until_drained(router: Router, last_due: datetime) -> None:
    """Wait until every timer due by ``last_due`` has fired (a minute at most)."""
    probe = TimerWorker(router)
    deadline = last_due + timedelta(seconds=60)
    while datetime.now(UTC) < deadline:
        await asyncio.sleep(0.25)
        if datetime.now(UTC) > last_due and await probe.next_due() is None:
            return


async def _raw_loop(url: str, names: TableNames) -> None:
    """The anchor under ``run``'s policy: a pass, then sleep until the next due time
    (at most ``POLL``), until the table is empty."""
    position = _position(compile_chart(CHART))
    raw = Raw(names, False)
    async with await psycopg.AsyncConnection.connect(url) as connection:
        while True:
            while (await raw.batch(connection, position, 100))[0] == 100:
                pass
            upcoming = await raw.next_due(connection)
            if upcoming is None:
                return
            wait = (upcoming - datetime.now(UTC)).total_seconds()
            await asyncio.sleep(min(POLL, max(0.0, wait)))


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


THROUGHPUT_ROWS = (
    "raw",
    "raw, same statements",
    "fire_due()",
    "raw x2",
    "fire_due() x2",
    "fire_due() x2, halves",
)


async def main() -> None:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL", DEFAULT_POSTGRES))
    parser.add_argument("--timers", type=int, default=4_000)
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lag-seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="1,000 timers, 1 round, 2 s lag")
    parser.add_argument(
        "--worker", choices=("raw", "ours", "halves", "run"), help=argparse.SUPPRESS
    )
    parser.add_argument("--half", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    add_json_option(parser)
    args = parser.parse_args()
    if args.worker:
        await _worker_main(args.url, args.schema, args.worker, args.batch, args.half)
        return
    if args.quick:
        args.timers, args.rounds, args.lag_seconds = 1_000, 1, 2.0
    info = machine_info(["statifier", "psycopg", "psycopg-binary"])
    print(machine_summary(info))
    print(versions_line(info))
    started = time.perf_counter()
    schema = f"bench_timers_{uuid.uuid4().hex[:8]}"
    migrations.upgrade(args.url, _options(schema))
    results: dict[str, Any] = {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        async with SqlAdapter(args.url, _options(schema)) as adapter:
            router = _router(adapter)
            machine = compile_chart(CHART)
            async with router.transaction() as unit:
                executions = unit.executions(Delivering(None, router.storage.clock()))
                for index in range(args.executions):
                    await executions.create(f"ex_{index}", machine)
            rates: dict[str, list[float]] = {row: [] for row in THROUGHPUT_ROWS}
            deadlocks: dict[str, int] = dict.fromkeys(THROUGHPUT_ROWS, 0)
            for turn in range(args.rounds):
                for row in rotated(THROUGHPUT_ROWS, turn):
                    rate, dead = await _throughput(
                        args.url, schema, router, row, args.timers, args.executions, args.batch
                    )
                    rates[row].append(rate)
                    deadlocks[row] += dead
            medians = {row: statistics.median(values) for row, values in rates.items()}
            print(
                f"\n{args.timers:,} due timers over {args.executions} executions, "
                f"batches of {args.batch}, {args.rounds} round(s), median timers/s"
            )
            print_table_header(f"{'row':<24} {'timers/s':>10} {'us/timer':>9} {'ratio':>16}")
            for row in THROUGHPUT_ROWS:
                ratio = ""
                if row.startswith("fire_due()"):
                    anchor = "raw x2" if "x2" in row else "raw"
                    ratio = f"{fmt_ratio(medians[row] / medians[anchor])} of {anchor}"
                note = f"  ({deadlocks[row]} deadlocks retried)" if deadlocks[row] else ""
                print(
                    f"{row:<24} {medians[row]:>10,.0f} {1e6 / medians[row]:>9.0f} {ratio:>16}{note}"
                )
            one = medians["fire_due()"] / medians["raw"]
            two = medians["fire_due() x2"] / medians["raw x2"]
            print(
                f"goal fire_due() >= {RATIO_GOAL}x raw: {verdict(one >= RATIO_GOAL)} "
                f"(one worker {one:.2f}x, two processes {two:.2f}x)"
            )
            results["throughput"] = {"rates": rates, "medians": medians, "deadlocks": deadlocks}

            print(f"\nlag, timers due at a steady rate for {args.lag_seconds:g} s (ms)")
            print_table_header(f"{'row':<24} {'p50':>8} {'p99':>8} {'max':>8}")
            lag_rows: dict[str, dict[str, float]] = {}
            lag_runs = (
                ("raw", RATE),
                ("fire_due()", RATE),
                ("run() x2", RATE),
                ("fire_due()", SLOW_RATE),
            )
            for row, rate in lag_runs:
                name = {"fire_due()": "run()", "raw": "raw (run's loop)"}.get(row, row)
                label = f"{name} at {rate:,}/s"
                lags = await _lag_run(
                    args.url, schema, router, row, args.lag_seconds, args.executions, rate
                )
                cells = {
                    "p50": _percentile(lags, 0.50),
                    "p99": _percentile(lags, 0.99),
                    "max": max(lags),
                }
                lag_rows[label] = cells
                print(f"{label:<24} {cells['p50']:>8.1f} {cells['p99']:>8.1f} {cells['max']:>8.1f}")
            p99 = lag_rows[f"run() at {RATE:,}/s"]["p99"]
            p99_two = lag_rows[f"run() x2 at {RATE:,}/s"]["p99"]
            print(
                f"goal run() p99 lag < {LAG_GOAL_MS:g} ms: "
                f"one worker {verdict(p99 < LAG_GOAL_MS)}, "
                f"two processes {verdict(p99_two < LAG_GOAL_MS)}"
            )
            results["lag"] = lag_rows
    finally:
        drop_schema(args.url, schema)
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.json:
        write_json(args.json, "timers", results)


if __name__ == "__main__":
    asyncio.run(main())
