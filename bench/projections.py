"""Benchmark: scriba catching up on an event table in PostgreSQL, against a raw psycopg
loop doing the same writes (the ceiling).

Run from the repository root, with the project installed with its ``scriba`` extra
(``pip install -e '.[scriba]'``) or from a checkout, against a local PostgreSQL::

    PYTHONPATH=src python3 bench/projections.py          # full run (about two minutes)
    python bench/projections.py --quick                  # 20,000 events, 1 repeat
    python bench/projections.py --json out.json          # also write the numbers as JSON
    python bench/projections.py --profile                # cProfile of one scriba catch-up

``--database-url URL`` picks the server (default: ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``); ``--events N`` and ``--streams N``
change the workload, ``--repeats N`` the passes, ``--gc`` keeps the garbage collector
running while timing.

What it measures. One event table (``scriba.sources.event_table``) holds N events
(default 100,000) spread round-robin over S streams (default 1,000). Each row then
catches up on all of it from position 0 into a read model of one row per event, and
the time from start to the last commit is taken; events/s is N over that time.

* ``scriba``: a projection whose handler returns one ``Insert`` per event, run by the
  scriba runtime with parallelism 8 and batches of 100, reading through
  ``SqlTableSource`` and committing through ``SqlTarget`` (per-stream cursor upserts in
  the same transaction as the rows; the watermark saved as the engine does).
* ``raw psycopg``: one synchronous psycopg 3 connection in a loop: select the next 100
  events (every column, as the source does: a real handler needs the data), insert
  their 100 rows (``executemany``), upsert the cursor of each stream in the batch with
  ``GREATEST``, commit. The same reads and writes as scriba's minus everything scriba
  adds (partitions, dedup, telemetry, the watermark), so it is the ceiling.

Each pass (default 5) runs both rows back to back from empty read models and cursor
tables, in an order that alternates between passes; a row's figure is the median over
passes, and the ratio is the median of the passes' ratios (a pass compares like with
like on a machine whose load drifts). Checked after
every run: N rows in the read model and S cursors, each at its stream's last position.
Project goals: scriba at least 10,000 events/s, and at least 0.6 of the ceiling.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import sqlalchemy as sa
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
    verdict,
    versions_line,
    write_json,
)

from scriba import Event, Insert, Meta, Projection
from scriba.runtime import Scriba
from scriba.sources import SqlTableSource, event_table
from scriba.sql import define_tables, upgrade
from scriba.sql.target import SqlTarget

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
PARALLELISM = 8
BATCH = 100
GOAL_RATE = 10_000
GOAL_RATIO = 0.6


class Workload:
    """The event table, the read model and scriba's tables, under one random prefix."""

    def __init__(self, url: str, events: int, streams: int):
        self.url = url
        self.events = events
        self.streams = streams
        self.prefix = f"bench_{uuid.uuid4().hex[:8]}"
        self.engine = sa.create_engine(sa.make_url(url).set(drivername="postgresql+psycopg"))
        self.metadata = sa.MetaData()
        self.event_table = event_table(self.metadata, f"{self.prefix}_events")
        self.read_model = sa.Table(
            f"{self.prefix}_rows",
            self.metadata,
            sa.Column("event_id", sa.Text, primary_key=True),
            sa.Column("stream_id", sa.Text, nullable=False),
            sa.Column("position", sa.BigInteger, nullable=False),
        )
        self.scriba_prefix = f"{self.prefix}_scriba_"
        self.tables = define_tables(self.scriba_prefix)

    def create(self) -> None:
        """Create every table and fill the event table (COPY, in one transaction)."""
        self.metadata.create_all(self.engine)
        upgrade(self.engine, prefix=self.scriba_prefix)
        at = datetime(2024, 1, 1, tzinfo=UTC)
        with psycopg.connect(self.url) as conn, conn.cursor() as cursor:
            columns = "(id, stream_id, type, data, metadata, occurred_at)"
            with cursor.copy(f"COPY {self.event_table.name} {columns} FROM STDIN") as copy:
                for i in range(self.events):
                    stream = f"stream-{i % self.streams}"
                    data = f'{{"n": {i}}}'
                    copy.write_row((f"event-{i}", stream, "Happened", data, "{}", at))
                    at += timedelta(microseconds=10)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {self.event_table.name}")

    def clear(self) -> None:
        """Empty the read model and scriba's cursors, watermarks and dead letters."""
        with self.engine.begin() as conn:
            for table in (self.read_model, *self._scriba_tables()):
                conn.execute(table.delete())

    def _scriba_tables(self) -> tuple[sa.Table, ...]:
        return (self.tables.positions, self.tables.watermarks, self.tables.dead_letters)

    def check(self) -> list[str]:
        """What is wrong with the read model and cursors after a catch-up."""
        problems = []
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(sa.func.count()).select_from(self.read_model)).scalar()
            if rows != self.events:
                problems.append(f"{rows} rows in the read model, not {self.events}")
            positions = self.tables.positions
            cursors = conn.execute(sa.select(positions.c.stream_id, positions.c.position)).all()
        expected = {
            f"stream-{s}": max(range(s, self.events, self.streams)) + 1
            for s in range(min(self.streams, self.events))
        }
        if dict(cursors) != expected:
            problems.append("the stream cursors are not at each stream's last position")
        return problems

    def drop(self) -> None:
        self.metadata.drop_all(self.engine)
        self.tables.metadata.drop_all(self.engine)
        with self.engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{self.tables.version_table}"'))
        self.engine.dispose()


def run_scriba(work: Workload) -> float:
    """Seconds for scriba to catch up on the whole event table."""
    read_model = work.read_model

    class Catchup(Projection):
        name = "bench"
        parallelism = PARALLELISM
        batch_size = BATCH

        def handle(self, event: Event, meta: Meta) -> Insert:
            return Insert(
                read_model,
                {"event_id": event.id, "stream_id": event.stream_id, "position": event.position},
            )

    async def main() -> float:
        source = SqlTableSource(work.url, work.event_table, poll_interval=0.01)
        target = SqlTarget(work.url, prefix=work.scriba_prefix)
        async with Scriba() as scriba:
            started = time.perf_counter()
            await scriba.start(Catchup, source=source, target=target)
            async with asyncio.timeout(600):
                await scriba.wait_until_caught_up(Catchup)
            elapsed = time.perf_counter() - started
            await scriba.stop(Catchup)
        await target.close()
        return elapsed

    return asyncio.run(main())


def run_raw(work: Workload) -> float:
    """Seconds for the raw psycopg loop to do the same writes."""
    events = work.event_table.name
    rows = work.read_model.name
    cursors = work.tables.positions.name
    select = (
        f"SELECT position, id, stream_id, type, data, metadata, occurred_at FROM {events} "
        "WHERE position > %s ORDER BY position LIMIT %s"
    )
    insert = f"INSERT INTO {rows} (event_id, stream_id, position) VALUES (%s, %s, %s)"
    upsert = (
        f"INSERT INTO {cursors} (projection_name, projection_version, stream_id, position, "
        "updated_at) VALUES ('raw', 1, %s, %s, now()) "
        "ON CONFLICT (projection_name, projection_version, stream_id) DO UPDATE SET "
        f"position = GREATEST({cursors}.position, EXCLUDED.position), "
        "updated_at = EXCLUDED.updated_at"
    )
    started = time.perf_counter()
    with psycopg.connect(work.url) as conn:
        after = 0
        while True:
            with conn.cursor() as cursor:
                batch = cursor.execute(select, (after, BATCH)).fetchall()
                if not batch:
                    conn.commit()
                    break
                cursor.executemany(insert, [(e, s, p) for p, e, s, *_ in batch])
                advances = {stream: position for position, _, stream, *_ in batch}
                cursor.executemany(upsert, sorted(advances.items()))
            conn.commit()
            after = batch[-1][0]
    return time.perf_counter() - started


def measure(work: Workload, repeats: int, keep_gc: bool) -> dict[str, list[float]]:
    """Events per second of each row, per pass."""
    rows = {"scriba": run_scriba, "raw psycopg": run_raw}
    rates: dict[str, list[float]] = {name: [] for name in rows}
    order = list(rows)
    for turn in range(repeats):
        for name in order if turn % 2 == 0 else reversed(order):
            work.clear()
            with collector_paused(keep_gc):
                seconds = rows[name](work)
            problems = work.check()
            if problems:
                raise SystemExit(f"{name}: " + "; ".join(problems))
            rates[name].append(work.events / seconds)
            print(f"  pass {turn + 1} {name:<12} {work.events / seconds:>10,.0f} events/s")
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="20,000 events, 1 pass")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--events", type=int, help="events to catch up on (default 100,000)")
    parser.add_argument("--streams", type=int, default=1000, help="streams (default 1,000)")
    parser.add_argument("--repeats", type=int, help="passes (default 5, quick 1)")
    parser.add_argument(
        "--profile", action="store_true", help="instead of timing, cProfile one scriba catch-up"
    )
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    events = args.events or (20_000 if args.quick else 100_000)
    repeats = args.repeats or (1 if args.quick else 5)
    if min(events, args.streams, repeats) < 1:
        parser.error("--events, --streams and --repeats must be positive")

    info = machine_info(("statifier", "sqlalchemy", "psycopg"))
    print(machine_summary(info))
    print(versions_line(info))
    work = Workload(args.database_url, events, args.streams)
    print(f"filling {events:,} events over {args.streams:,} streams ...")
    work.create()
    try:
        if args.profile:
            work.clear()
            profiler = cProfile.Profile()
            profiler.enable()
            run_scriba(work)
            profiler.disable()
            print_profile(profiler, 40)
            return 0
        print(f"catch-up, parallelism {PARALLELISM}, batches of {BATCH}, {repeats} pass(es):")
        rates = measure(work, repeats, args.gc)
    finally:
        work.drop()

    medians = {name: statistics.median(samples) for name, samples in rates.items()}
    # Each pass runs both rows back to back, so a pass's ratio compares like with like
    # on a machine whose load drifts; the goal is checked on their median.
    ratios = [a / b for a, b in zip(rates["scriba"], rates["raw psycopg"], strict=True)]
    ratio = statistics.median(ratios)
    print()
    print_table_header(f"{'row':<14} {'median events/s':>16} {'min..max events/s':>22}")
    for name, samples in rates.items():
        spread = f"{min(samples):,.0f}..{max(samples):,.0f}"
        print(f"{name:<14} {medians[name]:>16,.0f} {spread:>22}")
    passes = ", ".join(fmt_ratio(r) for r in ratios)
    print(f"\nscriba / ceiling: {fmt_ratio(ratio)} (median of the passes: {passes})")
    print(
        f"goal >= {GOAL_RATE:,} events/s: {verdict(medians['scriba'] >= GOAL_RATE)}; "
        f"goal >= {GOAL_RATIO} of the ceiling: {verdict(ratio >= GOAL_RATIO)}"
    )
    print(f"(garbage collector {collector_state(args.gc)} while timing)")
    if args.json:
        write_json(
            args.json,
            "projections",
            {
                "machine": info,
                "events": events,
                "streams": args.streams,
                "parallelism": PARALLELISM,
                "batch": BATCH,
                "gc": collector_state(args.gc),
                "events_per_s": rates,
                "median_events_per_s": medians,
                "ratio_per_pass": ratios,
                "ratio": ratio,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
