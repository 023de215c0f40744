"""The projecting process that tests/scriba/test_crash_injection.py kills and restarts.

It projects an event table (``<prefix>events``) into a read model of one row per
event (``<prefix>rows``) with scriba's runtime, ``SqlTableSource`` and ``SqlTarget``
(scriba's tables under ``<prefix>scriba_``), prints ``ready`` once the projection runs
and ``caught-up`` once it has accounted for everything, then stops cleanly and exits.

Events of type ``Noise`` are skipped by the handler and ``Poison`` ones fail it (no
retry), so they are dead-lettered. With ``--hold P`` the handler never returns for
the event at position P, so everything after it in its partition waits too.

    python tests/scriba/crash_child.py URL PREFIX [--schema S] [--parallelism N]
        [--batch-size N] [--hold P]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import sqlalchemy as sa

from scriba import Error, Event, Insert, Meta, Projection, Result, Skip
from scriba.projection import RetryPolicy
from scriba.runtime import Scriba
from scriba.sources import SqlTableSource, event_table
from scriba.sql.target import SqlTarget


def tables(prefix: str, schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The event table and the read model."""
    metadata = sa.MetaData(schema=schema)
    events = event_table(metadata, f"{prefix}events")
    rows = sa.Table(
        f"{prefix}rows",
        metadata,
        sa.Column("event_id", sa.String(255), primary_key=True),
        sa.Column("stream_id", sa.String(255), nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
    )
    return events, rows


def projection(rows: sa.Table, hold: int | None) -> type[Projection]:
    def outcome(event: Event) -> Result:
        if event.type == "Noise":
            return Skip("noise")
        if event.type == "Poison":
            return Error("poison")
        values = {"event_id": event.id, "stream_id": event.stream_id, "position": event.position}
        return Insert(rows, values)

    class Crashing(Projection):
        name = "crash"
        retry = RetryPolicy.never()
        batch_timeout = 0.01

        def handle(self, event: Event, meta: Meta) -> Result:
            return outcome(event)

    class Holding(Crashing):
        async def handle(self, event: Event, meta: Meta) -> Result:  # type: ignore[override]
            if event.position == hold:
                await asyncio.Event().wait()
            return outcome(event)

    return Crashing if hold is None else Holding


async def run(args: argparse.Namespace) -> None:
    events, rows = tables(args.prefix, args.schema)
    database: str | sa.Engine = args.url
    if args.url.startswith("sqlite"):
        # One engine for both: SQLite runs inline, so they never wait on each other.
        database = sa.create_engine(args.url)
    source = SqlTableSource(database, events, poll_interval=0.01)
    target = SqlTarget(database, prefix=f"{args.prefix}scriba_", schema=args.schema)
    projecting = projection(rows, args.hold)
    async with Scriba() as scriba:
        await scriba.start(
            projecting,
            source=source,
            target=target,
            parallelism=args.parallelism,
            batch_size=args.batch_size,
        )
        print("ready", flush=True)
        await scriba.wait_until_caught_up(projecting)
        print("caught-up", flush=True)
    await target.close()
    if isinstance(database, sa.Engine):
        database.dispose()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("--schema")
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--hold", type=int)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
