"""How long `statifier reshard` takes: half of one store's buckets moved to a second
store (`statifier.sql.moves.move_range`), beside the time it took to route the rows
it moves, on SQLite and PostgreSQL.

For each database the bench makes two fresh stores (two SQLite files; two schemas of
the database of `--url`), routes `--keys` keys of the counter workload (`counter.py`)
`--events` times each into the first with `route_many` batches of 100 (timed: the
write), then moves buckets 512-1023 (about half the keys, with their input logs,
addresses, dedupe claims and ledger rows) to the second with the default step of 16
buckets (timed: the move). It prints the rows moved, the move's seconds and rows per
second, and the ratio of the move's time to the write's share of the moved rows (the
write's time times the share of the executions that moved): what a move costs beside
having written the rows in the first place. It checks that every execution of the
range, and only those, is at the second store afterwards.

    python bench/reshard.py                       # 10,000 keys x 3 events, both databases
    python bench/reshard.py --keys 50000 --only postgresql
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import drop_schema, machine_info, machine_summary, new_parser, versions_line

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import InboundEvent, Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions, migrations
from statifier.sql.moves import move_range

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MOVED = (512, 1024)
BATCH = 100


async def _write(url: str, options: TableOptions, keys: int, events: int) -> float:
    """Route ``events`` rounds over ``keys`` keys into the store; answer the seconds."""
    adapter = SqlAdapter(url, options)
    try:
        config = RouterConfig(
            adapter,
            bindings=[BINDING],
            resolver=StaticResolver({DOCUMENT: compile_chart(CHART)}),
        )
        router = Router(config)
        started = time.perf_counter()
        for event in range(events):
            for first in range(0, keys, BATCH):
                batch = [
                    InboundEvent(
                        scope="bench",
                        source=SOURCE,
                        message_id=f"m{event}-{key}",
                        data={"key": f"k{key}"},
                    )
                    for key in range(first, min(first + BATCH, keys))
                ]
                await router.route_many(batch)
        return time.perf_counter() - started
    finally:
        await adapter.close()


def _buckets(url: str, options: TableOptions) -> list[int]:
    engine = sa.create_engine(migrations.sync_url(url))
    try:
        with engine.connect() as connection:
            table = options.define().executions
            return list(connection.execute(sa.select(table.c.bucket)).scalars())
    finally:
        engine.dispose()


def run(database: str, keys: int, events: int, url: str, folder: Path) -> dict[str, Any]:
    """Write the rows into a first store, then time the move of half its buckets."""
    if database == "postgresql":
        stores = [(url, TableOptions(prefix="b_", schema=f"bench_reshard_{n}")) for n in (0, 1)]
    else:
        files = [f"sqlite:///{folder / f'store{n}.db'}" for n in (0, 1)]
        stores = [(file, TableOptions(prefix="b_")) for file in files]
    try:
        for store_url, options in stores:
            migrations.upgrade(store_url, options)
        (first, first_options), (second, second_options) = stores
        wrote = asyncio.run(_write(first, first_options, keys, events))
        started = time.perf_counter()
        moved = move_range(
            first, second, MOVED, options=first_options, target_options=second_options
        )
        seconds = time.perf_counter() - started
        there = _buckets(second, second_options)
        here = _buckets(first, first_options)
        wrong = sum(not MOVED[0] <= b < MOVED[1] for b in there) + sum(
            MOVED[0] <= b < MOVED[1] for b in here
        )
        if len(there) + len(here) != keys:
            wrong += abs(keys - len(there) - len(here))
        share = len(there) / keys
        return {
            "database": database,
            "executions": len(there),
            "rows": moved.total,
            "seconds": seconds,
            "wrote": wrote * share,
            "wrong": wrong,
        }
    finally:
        if database == "postgresql":
            for _, options in stores:
                assert options.schema is not None
                drop_schema(url, options.schema)


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--keys", type=int, default=10_000, help="keys routed (10,000)")
    parser.add_argument("--events", type=int, default=3, help="events per key (3)")
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL URL")
    args = parser.parse_args()
    if args.keys < 1 or args.events < 1:
        parser.error("--keys and --events are at least 1")
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    with tempfile.TemporaryDirectory() as folder:
        results = [run(db, args.keys, args.events, args.url, Path(folder)) for db in databases]
    print(
        f"\n{args.keys:,} keys x {args.events} events routed into one store; "
        f"buckets {MOVED[0]}-{MOVED[1] - 1} moved to a second\n"
    )
    print(
        f"{'database':<12}{'executions':>11}{'rows':>9}{'seconds':>9}{'rows/s':>9}"
        f"{'write s':>9}{'move / write':>14}  wrong"
    )
    for row in results:
        print(
            f"{row['database']:<12}{row['executions']:>11,}{row['rows']:>9,}"
            f"{row['seconds']:>9.2f}{row['rows'] / row['seconds']:>9,.0f}"
            f"{row['wrote']:>9.2f}{row['seconds'] / row['wrote']:>13.2f}x  {row['wrong']}"
        )
    return 1 if any(row["wrong"] for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())
