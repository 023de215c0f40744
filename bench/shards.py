"""Durable steps over K stores (`statifier.persistence.shards.ShardedAdapter`): the cost
per step of K = 3 stores in one server against K = 1, the same executions and events.

Each row creates `--executions` executions of a small counter chart through
`Executions` over a `ShardedAdapter` of K stores, then steps each `--steps` times, the
executions stepped in turn (every step its own transaction: the adapter's
`record_step`). The rows take turns, `--rounds` times each, on fresh tables:

- `sqlite K=1` and `sqlite K=3`: one SQLite file, and three files in one directory;
- `postgresql K=1` and `postgresql K=3`: one schema, and three schemas of the same
  database (three stores in one server: what K costs before a second server is added).

The goal is K = 3 at most 10% slower per step than K = 1 (the ratio is printed). A
step touches one store whatever K; what K adds is choosing the store (a hash of the
execution's id) and a connection pool per store.

    python bench/shards.py                      # both databases
    python bench/shards.py --only sqlite --quick
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    verdict,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.shards import ShardedAdapter
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions

GOAL = 1.10
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/></datamodel>
<state id="on">
  <transition event="add"><assign location="n" expr="n + _event.data.by"/></transition>
</state>
</scxml>"""

Place = tuple[str, TableOptions]


def places(database: str, stores: int, url: str, folder: Path) -> list[Place]:
    """``stores`` fresh, migrated places: SQLite files, or PostgreSQL schemas."""
    from statifier.sql import migrations

    made: list[Place] = []
    for _ in range(stores):
        name = uuid.uuid4().hex[:8]
        if database == "sqlite":
            place = (f"sqlite:///{folder / f'shard_{name}.db'}", TableOptions())
        else:
            place = (url, TableOptions(schema=f"bench_shards_{name}"))
        migrations.upgrade(*place)
        made.append(place)
    return made


async def run_row(stores: list[Place], executions: int, steps: int) -> float:
    """Seconds per step over ``stores``, the steps timed (not the creates)."""
    adapters = [SqlAdapter(url, tables) for url, tables in stores]
    try:
        lifecycle = Executions(Storage(ShardedAdapter(adapters)), executor=ignore_effects)
        machine = compile_chart(COUNTER, name="counter")
        ids = [f"ex-{uuid.uuid4().hex[:12]}" for _ in range(executions)]
        for execution_id in ids:
            await lifecycle.create(execution_id, machine)
        event = Event("add", data={"by": 1})
        started = time.perf_counter()
        for _ in range(steps):
            for execution_id in ids:
                await lifecycle.step(execution_id, machine, event)
        return (time.perf_counter() - started) / (steps * executions)
    finally:
        for adapter in adapters:
            await adapter.close()


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL URL")
    parser.add_argument("--executions", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10, help="steps per execution and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two rounds of fewer steps")
    add_json_option(parser)
    args = parser.parse_args()
    rounds, steps = (2, 4) if args.quick else (args.rounds, args.steps)
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for database in databases:
            samples: dict[int, list[float]] = {1: [], 3: []}
            for turn in range(rounds):
                for stores in (1, 3) if turn % 2 == 0 else (3, 1):
                    made = places(database, stores, args.url, Path(folder))
                    try:
                        samples[stores].append(asyncio.run(run_row(made, args.executions, steps)))
                    finally:
                        for url, tables in made:
                            if tables.schema is not None:
                                drop_schema(url, tables.schema)
            one, three = (statistics.median(samples[k]) for k in (1, 3))
            ratio = three / one
            results[database] = {"k1_us_per_step": one * 1e6, "k3_us_per_step": three * 1e6}
            results[database]["k3_over_k1"] = ratio
            print(
                f"{database:<11} K=1 {one * 1e6:8.0f} us/step   K=3 {three * 1e6:8.0f} us/step"
                f"   K=3/K=1 {fmt_ratio(ratio)}   at most {GOAL:.2f}x: {verdict(ratio <= GOAL)}"
            )
    print(f"{rounds} rounds, {args.executions} executions x {steps} steps each, medians")
    if args.json:
        write_json(args.json, "shards", {"machine": info, "rows": results, "goal": GOAL})
    return 0


if __name__ == "__main__":
    sys.exit(main())
