"""Shadow replay (`statifier.shadow`): executions replayed per second over 10,000
recorded executions, against the bare core's events per second on the same logs.

The executions are recorded through `Executions` on SQLite (a file in a temporary
directory; with `--url postgresql://...`, in a schema of the benchmark's own on that
server, dropped at the end): a shopping cart chart, each execution a random script of
adds, approvals, a checkout and a payment or a cancel (about 4 inputs each). Then, in
turns, `--repeats` times each:

- `core`: every log replayed through `initialize` and `handle_event` on the recorded
  chart, in memory (the logs read beforehand): the ceiling of one replay;
- `core x2`: the same on the recorded chart and then on the revision: the bare core's
  share of a shadow replay, which replays every log on both;
- `compare`: `compare_logs` on every log, the recorded chart against a revision that
  moves a guard (about a third of the executions part), in memory: two replays and
  the comparison;
- `shadow`: `shadow_replay` from the database URL, read-only, end to end: the
  selection, the records, the charts, the logs, and `compare`;
- `shadow/2p`: the same in two processes (`workers=2`, the machine's cores by
  default: `--workers`), each reading and replaying its own batches; its CPU seconds
  are this process's only, so its CPU column is left out.

The rates are logged inputs per second (each input replayed on both charts by
`core x2`, `compare` and `shadow`); the goal is `shadow` at least 0.5 of `core`, which
`core x2` bounds from above in one process: what is left is the reading and the
comparing. Every `shadow` run must find the same verdicts as `compare`.

    python bench/replay.py            # 10,000 executions on SQLite
    python bench/replay.py --quick    # 1,000, one repeat
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    verdict,
    versions_line,
    write_json,
)

from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.persistence import Executions, LoggedInput, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.sql import SqlAdapter
from statifier.shadow import Verdict, compare_logs, shadow_replay
from statifier.sql import TableOptions

GOAL = 0.5
CART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
<datamodel><data id="total" expr="0"/><data id="items" expr="0"/></datamodel>
<state id="cart">
  <transition event="add" cond="_event.data.amount &gt; 100" target="review">
    <assign location="total" expr="total + _event.data.amount"/>
  </transition>
  <transition event="add">
    <assign location="total" expr="total + _event.data.amount"/>
    <assign location="items" expr="items + 1"/>
  </transition>
  <transition event="checkout" target="paying"/>
</state>
<state id="review"><transition event="approve" target="cart"/></state>
<state id="paying">
  <onentry><send id="expire" event="expire" delay="1h"/></onentry>
  <transition event="paid" target="done"><cancel sendid="expire"/></transition>
  <transition event="cancel" target="cart"><cancel sendid="expire"/></transition>
</state>
<final id="done"/>
</scxml>
"""
REVISION = CART.replace("&gt; 100", "&gt; 50")
AMOUNTS = (5, 20, 60, 80, 150)


def script(rng: random.Random) -> list[Event]:
    events: list[Event] = []
    for _ in range(rng.randint(1, 4)):
        amount = rng.choice(AMOUNTS)
        events.append(Event("add", data={"amount": amount}))
        if amount > 100:
            events.append(Event("approve"))
    if rng.random() < 0.8:
        events.append(Event("checkout"))
        if rng.random() < 0.7:
            events.append(Event("paid" if rng.random() < 0.8 else "cancel"))
    return events


async def record(url: str, tables: TableOptions, count: int) -> None:
    rng = random.Random(2026)
    machine = compile_chart(CART, name="cart")
    async with SqlAdapter(url, tables) as adapter:
        lifecycle = Executions(Storage(adapter), executor=ignore_effects)
        for number in range(count):
            execution_id = f"ex-{number:06d}"
            await lifecycle.create(execution_id, machine)
            for event in script(rng):
                await lifecycle.step(execution_id, machine, event)


async def read_logs(url: str, tables: TableOptions) -> dict[str, list[LoggedInput]]:
    async with SqlAdapter(url, tables) as adapter:
        lifecycle = Executions(Storage(adapter))
        records = await lifecycle.storage.list_executions()
        return {record.id: await lifecycle.inputs(record.id) for record in records}


Timed = tuple[float, float]
"""Wall-clock and process CPU seconds."""


def clocks() -> Timed:
    return time.perf_counter(), time.process_time()


def since(started: Timed) -> Timed:
    wall, cpu = clocks()
    return wall - started[0], cpu - started[1]


def run_core(machine: Machine, logs: dict[str, list[LoggedInput]]) -> Timed:
    started = clocks()
    for execution_id, log in logs.items():
        state, _ = initialize(machine, StartOptions(session_id=execution_id))
        for entry in log:
            assert entry.event is not None
            state, _ = handle_event(state, entry.event)
    return since(started)


def run_compare(
    old: Machine, new: Machine, logs: dict[str, list[LoggedInput]]
) -> tuple[Timed, Counter[Verdict]]:
    started = clocks()
    verdicts: Counter[Verdict] = Counter()
    for execution_id, log in logs.items():
        verdicts[compare_logs(old, new, log, execution_id=execution_id).verdict] += 1
    return since(started), verdicts


def run_shadow(
    url: str, tables: TableOptions, new: Machine, workers: int = 1
) -> tuple[Timed, Counter[Verdict]]:
    started = clocks()
    summary = asyncio.run(shadow_replay(url, new, tables=tables, workers=workers))
    return since(started), Counter({v: n for v, n in summary.counts.items() if n})


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 executions, one repeat")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 2, help="processes of shadow/Np"
    )
    parser.add_argument("--url", default=None, help="a PostgreSQL URL (default: SQLite)")
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args()
    count = 1_000 if args.quick else args.executions
    repeats = 1 if args.quick else args.repeats
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    with tempfile.TemporaryDirectory() as folder:
        if args.url is None:
            url, tables, schema = f"sqlite:///{Path(folder) / 'replay.db'}", TableOptions(), None
        else:
            schema = f"bench_replay_{uuid.uuid4().hex[:8]}"
            url, tables = args.url, TableOptions(schema=schema)
        try:
            return measure(url, tables, count, repeats, args, info)
        finally:
            if schema is not None:
                drop_schema(url, schema)


def measure(
    url: str, tables: TableOptions, count: int, repeats: int, args: Any, info: dict[str, Any]
) -> int:
    # Imported here, not with the rest: the processes of shadow/Np import this script
    # again (spawn), and Alembic is no part of a replay.
    from statifier.sql import migrations

    migrations.upgrade(url, tables)
    started = time.perf_counter()
    asyncio.run(record(url, tables, count))
    print(f"recorded {count:,} executions in {time.perf_counter() - started:.1f} s")
    logs = asyncio.run(read_logs(url, tables))
    inputs = sum(len(log) for log in logs.values())
    print(f"{inputs:,} logged inputs ({inputs / count:.1f} per execution)\n")
    old = compile_chart(CART, name="cart")
    new = compile_chart(REVISION, name="cart")
    parallel = f"shadow/{args.workers}p"
    times: dict[str, list[Timed]] = {
        "core": [],
        "core x2": [],
        "compare": [],
        "shadow": [],
        parallel: [],
    }
    found: dict[str, Counter[Verdict]] = {}
    for _ in range(repeats):
        with collector_paused(args.gc):
            times["core"].append(run_core(old, logs))
        with collector_paused(args.gc):
            first, second = run_core(old, logs), run_core(new, logs)
            times["core x2"].append((first[0] + second[0], first[1] + second[1]))
        with collector_paused(args.gc):
            elapsed, found["compare"] = run_compare(old, new, logs)
            times["compare"].append(elapsed)
        with collector_paused(args.gc):
            elapsed, found["shadow"] = run_shadow(url, tables, new)
            times["shadow"].append(elapsed)
        with collector_paused(args.gc):
            elapsed, found[parallel] = run_shadow(url, tables, new, args.workers)
            times[parallel].append(elapsed)
    for name in ("shadow", parallel):
        if found[name] != found["compare"]:
            print(f"MISMATCH: {name} {found[name]} != compare {found['compare']}", file=sys.stderr)
            return 1
    rows: dict[str, dict[str, float]] = {}
    header = (
        f"{'row':<9} {'median s':>9} {'inputs/s':>10} {'executions/s':>13} {'vs core':>8}"
        f" {'cpu s':>7} {'cpu vs core':>12}"
    )
    print(header)
    print("-" * len(header))
    core_wall = statistics.median(wall for wall, _ in times["core"])
    core_cpu = statistics.median(cpu for _, cpu in times["core"])
    for name, samples in times.items():
        median = statistics.median(wall for wall, _ in samples)
        cpu = statistics.median(cpu for _, cpu in samples)
        rate = inputs / median
        rows[name] = {
            "median_s": median,
            "inputs_per_s": rate,
            "executions_per_s": count / median,
            "vs_core": core_wall / median,
        }
        cpu_columns = ""
        if name != parallel:  # the other processes' CPU is not counted here
            rows[name] |= {"median_cpu_s": cpu, "cpu_vs_core": core_cpu / cpu}
            cpu_columns = f" {cpu:>7.3f} {fmt_ratio(core_cpu / cpu):>12}"
        print(
            f"{name:<9} {median:>9.3f} {rate:>10,.0f} {count / median:>13,.0f} "
            f"{fmt_ratio(core_wall / median):>8}{cpu_columns}"
        )
    verdicts = {v.value: n for v, n in sorted(found["shadow"].items(), key=lambda i: i[0].value)}
    print(f"\nverdicts: {verdicts}")
    ratio = rows["shadow"]["vs_core"]
    print(f"goal: shadow at least {GOAL}x of core: {ratio:.2f}x, {verdict(ratio >= GOAL)}")
    both = rows["shadow"]["inputs_per_s"] / rows["core x2"]["inputs_per_s"]
    print(f"shadow against the bare core on both charts (core x2): {both:.2f}x")
    print(f"in CPU time: {rows['shadow']['cpu_vs_core']:.2f}x of core")
    spread = rows[parallel]["vs_core"]
    print(f"in {args.workers} processes: {spread:.2f}x of core, {verdict(spread >= GOAL)}")
    print(f"collector {collector_state(args.gc)}; {repeats} repeat(s)")
    if args.json:
        write_json(
            args.json,
            "replay",
            {
                "machine": info,
                "executions": count,
                "inputs": inputs,
                "database": "sqlite" if url.startswith("sqlite") else "postgresql",
                "rows": rows,
                "verdicts": verdicts,
                "goal": GOAL,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
