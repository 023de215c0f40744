"""Benchmark: cancelling durable executions one by one in a large table, beside pausing
them (the anchor), on SQLite and PostgreSQL.

Run from the repository root::

    PYTHONPATH=bench:src python bench/cancel.py                      # 20,000 executions
    PYTHONPATH=bench:src python bench/cancel.py --executions 50000 --only sqlite
    PYTHONPATH=bench:src python bench/cancel.py --url postgresql://...

A cancel, as a bulk cancel makes it, locks the execution, exits its states, writes it
ended, then looks for the durable children it started (the executions whose metadata
names it as parent) to cancel them too. A pause locks and writes the execution alike
and looks for nothing. Both act on executions of a one-state chart, none of which has
children, in a table of ``--executions`` rows: the cancel/pause ratio is what the
children's lookup costs. Before ``statifier_0029`` SQLite read every row's metadata for
it, so the ratio fell as the table grew. PostgreSQL is found through ``--url``, else
``DATABASE_URL``, else ``postgresql://postgres@127.0.0.1:5432/test``; the benchmark
works in a database schema of its own and drops it. This is a measurement, not a test.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from harness import machine_info, machine_summary, new_parser

from statifier.durable import Durable
from statifier.sql import TableOptions

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="a">
<state id="a"><transition event="go" target="b"/></state><state id="b"/></scxml>"""
ACTED = 300


async def rates(url: str, tables: TableOptions | None, executions: int) -> tuple[float, float]:
    """Cancels and pauses per second, each over :data:`ACTED` executions of a table of
    ``executions``."""
    async with Durable(url, charts={"c": CHART}, tables=tables, migrate=True) as durable:
        ids = [(await durable.create("c")).id for _ in range(executions)]
        started = time.perf_counter()
        for execution_id in ids[:ACTED]:
            await durable.pause(execution_id)
        paused = ACTED / (time.perf_counter() - started)
        started = time.perf_counter()
        for execution_id in ids[ACTED : 2 * ACTED]:
            await durable.cancel(execution_id)
        cancelled = ACTED / (time.perf_counter() - started)
    return cancelled, paused


async def main() -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--executions", type=int, default=20_000)
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"))
    args = parser.parse_args()
    if args.executions < 2 * ACTED:
        parser.error(f"--executions must be at least {2 * ACTED}")
    print(machine_summary(machine_info(["sqlalchemy", "psycopg"])))
    print(f"{args.executions:,} executions; {ACTED} paused, then {ACTED} others cancelled")
    print("| database | cancels/s | pauses/s (anchor) | cancel / pause |")
    print("|---|---:|---:|---:|")
    if args.only != "postgresql":
        with tempfile.TemporaryDirectory() as directory:
            url = f"sqlite:///{Path(directory) / 'cancel.db'}"
            cancelled, paused = await rates(url, None, args.executions)
        print(f"| sqlite | {cancelled:,.0f} | {paused:,.0f} | {cancelled / paused:.2f}x |")
    if args.only != "sqlite":
        url = args.url or "postgresql://postgres@127.0.0.1:5432/test"
        schema = f"bench_cancel_{uuid.uuid4().hex[:8]}"
        import sqlalchemy as sa

        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.begin() as connection:
            connection.execute(sa.text(f"CREATE SCHEMA {schema}"))
        try:
            cancelled, paused = await rates(url, TableOptions(schema=schema), args.executions)
            print(f"| postgresql | {cancelled:,.0f} | {paused:,.0f} | {cancelled / paused:.2f}x |")
        finally:
            with engine.begin() as connection:
                connection.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
