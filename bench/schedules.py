"""Benchmark: schedules firing on PostgreSQL, by the built-in scheduler in two processes,
beside an outside cron loop routing the same fires in two processes.

Run from the repository root, with the project installed (``pip install -e '.[postgres]'``)
or from a checkout::

    PYTHONPATH=bench:src python bench/schedules.py           # 10,000 schedules, a minute
    python bench/schedules.py --quick                         # 1,000 schedules, 20 s
    python bench/schedules.py --url postgresql://...          # another PostgreSQL
    python bench/schedules.py --json out.json                 # also write the numbers

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the rows live in a schema of their own,
dropped at the end.

The workload: ``--schedules`` (10,000) schedules, each ``every`` ``--seconds`` (60)
seconds, their starts spread evenly over that span, so that each fires once in it, at
a steady rate (about 167 fires a second by default). Each fire is routed through one
binding to the counter execution of its schedule (created by its first fire): a create
and a step in the fire's transaction.

Rows:

* ``outside cron``, the anchor: what a host without schedules would run, two processes
  each taking every other fire time, sleeping until it and calling ``router.route`` on
  the same event (same binding, same executions: a scope of its own).
* ``Scheduler.run``: the library's scheduler (``Scheduler(router).run``, ``poll`` 1 s)
  in two processes over the same table, started before the first fire.

A fire's lag is the time its routing committed minus its fire time, measured in the
process that made it (for the scheduler: the ``statifier.router.schedule`` telemetry's
lag at the claim plus the step's duration). Reported: fires made, p50, p99 and max lag,
and the ratio of the scheduler's p99 to the anchor's. Goal: p99 under 1 s.
Every transaction commits durably (``synchronous_commit`` on).
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

from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    verdict,
    write_json,
)

from statifier import telemetry
from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, Router, RouterConfig, Schedule, Scheduler, StaticResolver
from statifier.sql import TableOptions, migrations

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"
    initial="counting">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="counting">
    <transition event="tick"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""
SOURCE = "clock"
LEAD = 8.0
"""Seconds between the set-up's end and the first fire: the workers start and warm up."""
PUTS_PER_SECOND = 150
"""The slowest rate of puts the set-up plans for."""
DRAIN = 10.0
"""Seconds the scheduler's workers run past the last fire's time."""


def _router(adapter: SqlAdapter) -> Router:
    ticks = Binding(
        id="ticks",
        source=SOURCE,
        match="true",
        key="event.schedule",
        document="counter",
        event="tick",
    )
    resolver = StaticResolver({"counter": compile_chart(COUNTER)})
    return Router(RouterConfig(adapter, bindings=[ticks], resolver=resolver))


def _schedules(count: int, seconds: float, first: datetime, scope: str) -> list[Schedule]:
    every = timedelta(seconds=seconds)
    return [
        Schedule(
            name=f"{scope}-{n:05}",
            source=SOURCE,
            scope=scope,
            every=every,
            start=first + every * n / count,
        )
        for n in range(count)
    ]


async def _put(url: str, options: TableOptions, schedules: list[Schedule], now: datetime) -> None:
    async with SqlAdapter(url, options) as adapter:
        scheduler = Scheduler(_router(adapter))

        async def put(part: list[Schedule]) -> None:
            for schedule in part:
                await scheduler.put(schedule, now=now)

        await asyncio.gather(*(put(schedules[n::8]) for n in range(8)))


# --- the worker processes ---------------------------------------------------------------


async def _scheduler_worker(url: str, options: TableOptions, until: datetime) -> list[float]:
    lags: list[float] = []
    end = until - timedelta(seconds=DRAIN)

    def seen(_: str, measured: Any, meta: Any) -> None:
        # The fires of the measured span alone, not the next round's in the drain.
        if meta["outcome"] == "made" and datetime.fromisoformat(meta["fire_time"]) < end:
            lags.append(measured["lag"] + measured["duration"])

    telemetry.attach("bench", "statifier.router.schedule", seen)
    async with SqlAdapter(url, options) as adapter:
        scheduler = Scheduler(_router(adapter), poll=1.0)
        await scheduler.next_due()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        stop = asyncio.Event()
        task = asyncio.ensure_future(scheduler.run(stop))
        await asyncio.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()))
        stop.set()
        await task
    return lags


async def _cron_worker(
    url: str, options: TableOptions, schedules: list[Schedule], first: datetime
) -> list[float]:
    lags: list[float] = []
    async with SqlAdapter(url, options) as adapter:
        router = _router(adapter)
        await router.plan(schedules[0].event(first))
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for schedule in schedules:
            fire = schedule.start
            wait = (fire - datetime.now(UTC)).total_seconds()
            if wait > 0:
                await asyncio.sleep(wait)
            await router.route(schedule.event(fire))
            lags.append((datetime.now(UTC) - fire).total_seconds())
    return lags


def _workers(args: argparse.Namespace, mode: str, extra: list[str]) -> list[subprocess.Popen[str]]:
    command = [sys.executable, __file__, "--worker", mode, "--url", args.url, "--schema"]
    command += [args.schema, "--schedules", str(args.schedules), "--seconds", str(args.seconds)]
    processes = [
        subprocess.Popen(
            [*command, "--part", str(part), *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for part in range(2)
    ]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    return processes


def _lags(processes: list[subprocess.Popen[str]]) -> list[float]:
    lags: list[float] = []
    for process in processes:
        out, _ = process.communicate()
        assert process.returncode == 0, f"a worker failed: {process.returncode}"
        lags += json.loads(out.strip().splitlines()[-1])
    return lags


def _stats(lags: list[float]) -> dict[str, Any]:
    ordered = sorted(lags)
    return {
        "fires": len(ordered),
        "p50_s": statistics.median(ordered),
        "p99_s": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max_s": ordered[-1],
    }


# --- the run ------------------------------------------------------------------------------


def main() -> None:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL", DEFAULT_POSTGRES))
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="1,000 schedules over 20 s")
    parser.add_argument("--worker", choices=("scheduler", "cron"), help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--part", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first", help=argparse.SUPPRESS)  # the scheduler's: when to stop
    add_json_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.seconds = 1_000, 20.0
    if args.worker:
        _worker(args)
        return
    args.schema = f"bench_schedules_{uuid.uuid4().hex[:8]}"
    options = TableOptions(schema=args.schema)
    info = machine_info(["sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(f"{args.schedules:,} schedules, each every {args.seconds:g} s, on PostgreSQL")
    migrations.upgrade(args.url, options)
    results: dict[str, dict[str, Any]] = {}
    try:
        # The anchor first: its executions live in a scope of their own.
        first = datetime.now(UTC) + timedelta(seconds=LEAD)
        cron = _workers(args, "cron", ["--first", first.isoformat()])
        results["outside cron"] = _stats(_lags(cron))
        started = time.perf_counter()
        now = datetime.now(UTC)
        # Room for the puts (at least PUTS_PER_SECOND) before the first fire.
        first = now + timedelta(seconds=LEAD + args.schedules / PUTS_PER_SECOND)
        schedules = _schedules(args.schedules, args.seconds, first, "s")
        asyncio.run(_put(args.url, options, schedules, now))
        put_seconds = time.perf_counter() - started
        if datetime.now(UTC) > first - timedelta(seconds=LEAD / 2):
            raise SystemExit("putting the schedules took longer than planned: use --quick")
        # The workers stop a little after the last fire's time: a backlog is drained.
        until = first + timedelta(seconds=args.seconds + DRAIN)
        ours = _workers(args, "scheduler", ["--first", until.isoformat()])
        results["Scheduler.run"] = _stats(_lags(ours))
    finally:
        drop_schema(args.url, args.schema)
    print(f"put {args.schedules:,} schedules in {put_seconds:.1f} s (8 tasks)")
    print_table_header(f"{'row':<16} {'fires':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, row in results.items():
        print(
            f"{name:<16} {row['fires']:>7,} {row['p50_s'] * 1e3:>8.1f} "
            f"{row['p99_s'] * 1e3:>8.1f} {row['max_s'] * 1e3:>8.1f}"
        )
    ratio = results["Scheduler.run"]["p99_s"] / results["outside cron"]["p99_s"]
    p99 = results["Scheduler.run"]["p99_s"]
    print(f"p99 Scheduler.run / outside cron: {fmt_ratio(ratio)}")
    print(f"goal p99 under 1 s: {p99 * 1e3:.0f} ms, {verdict(p99 < 1.0)}")
    if args.json:
        write_json(args.json, "schedules", {"machine": info, "rows": results, "ratio": ratio})


def _worker(args: argparse.Namespace) -> None:
    options = TableOptions(schema=args.schema)
    when = datetime.fromisoformat(args.first)
    if args.worker == "scheduler":
        lags = asyncio.run(_scheduler_worker(args.url, options, when))
    else:
        mine = _schedules(args.schedules, args.seconds, when, "cron")[args.part :: 2]
        lags = asyncio.run(_cron_worker(args.url, options, mine, when))
    print(json.dumps(lags), flush=True)


if __name__ == "__main__":
    main()
