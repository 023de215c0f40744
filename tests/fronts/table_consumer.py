"""A stream consumer over the inbound-events table in a process of its own, for the
table source's crash-injection test.

Usage: ``python table_consumer.py URL PREFIX SCHEMA CHART OWNER AUDIT JOB`` (``SCHEMA``
``-`` for none; ``CHART`` a file holding the counter chart of document ``count``).
``JOB`` is JSON: ``{"partitions": [...], "ends": {partition: last position},
"lanes": N, "batch": N, "ttl": seconds, "pause": seconds, "commit_interval": seconds,
"broken": false}``.

The process consumes the table as member ``OWNER`` of the group ``crash`` until the
group's committed positions reach ``ends``, then stops and exits 0. Before each commit
it audits the positions: any event of a partition at or below the position to commit
that has no row in the routing ledger (its delivery has not committed) is appended to
``AUDIT``, one message id a line. With ``"broken": true`` it commits the highest
position fetched instead of the gapless prefix, and routes slowly, so the audit has
something to find. Each event's routing waits ``pause`` seconds first (none by default),
so the work outlasts a few kills. It prints ``ready`` once its source has started.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from statifier.chart import compile_chart
from statifier.fronts.acks import Acks
from statifier.fronts.consumer import StreamConsumer
from statifier.fronts.source import Rebalance
from statifier.fronts.table_source import TableSource
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver
from statifier.router.config import Entry
from statifier.sql import TableOptions
from statifier.sql.names import TableNames

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT

GROUP = "crash"


class AuditedSource(TableSource):
    """The table source, auditing every commit against the routing ledger first."""

    def __init__(self, adapter: SqlAdapter, audit: Path, **options: Any) -> None:
        super().__init__(adapter, **options)
        self.audit = audit
        names = TableNames.of(adapter.tables)
        postgres = isinstance(adapter.engine, AsyncEngine)
        partition, position = (
            ("%(partition)s", "%(position)s")
            if postgres
            else (
                ":partition",
                ":position",
            )
        )
        self.postgres = postgres
        self.missing_text = (
            f"SELECT message_id FROM {names.inbound_events} WHERE partition = {partition} "
            f"AND position <= {position} AND message_id NOT IN "
            f"(SELECT message_id FROM {names.routing_ledger} WHERE message_id IS NOT NULL)"
        )

    async def commit(self, positions: Mapping[str, int]) -> None:
        missing: list[str] = []
        async with self.adapter.transaction() as tx:
            for partition, position in positions.items():
                values = {"partition": partition, "position": position}
                if self.postgres:
                    cursor = await tx.driver.execute(self.missing_text, values)
                    rows = await cursor.fetchall()
                else:
                    rows = tx.driver.execute(self.missing_text, values).fetchall()
                missing.extend(row[0] for row in rows)
        if missing:
            with self.audit.open("a", encoding="utf-8") as file:
                file.write("".join(f"{message_id}\n" for message_id in missing))
                file.flush()
                os.fsync(file.fileno())
        await super().commit(positions)

    async def start(self, rebalance: Rebalance) -> None:
        await super().start(rebalance)
        print("ready", flush=True)


def _break_the_commit_rule() -> None:
    """Commit the highest position fetched, done or not: the rule the audit and the
    test's final checks must catch."""

    def committable(self: Acks, partitions: Collection[str] | None = None) -> dict[str, int]:
        return {
            name: state.highest
            for name, state in self._partitions.items()
            if (partitions is None or name in partitions)
            and state.highest is not None
            and (state.committed is None or state.highest > state.committed)
        }

    Acks.committable = committable  # type: ignore[method-assign]


def _paced(pause: float) -> Callable[[str, Entry, Callable[[], Awaitable[Any]]], Awaitable[Any]]:
    # An event is paced twice, as it is read (to choose its lane) and as it is routed,
    # so that the work outlasts the kills.
    async def around(scope: str, entry: Entry, work: Callable[[], Awaitable[Any]]) -> Any:
        if entry in (Entry.PARTITION, Entry.ROUTE):
            await asyncio.sleep(pause)
        return await work()

    return around


async def _consume(
    url: str, options: TableOptions, chart: Path, owner: str, audit: Path, job: dict[str, Any]
) -> None:
    machine = compile_chart(await asyncio.to_thread(chart.read_bytes))
    ends = {partition: int(end) for partition, end in job["ends"].items()}
    broken = bool(job.get("broken"))
    if broken:
        _break_the_commit_rule()
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS],
            resolver=StaticResolver({DOCUMENT: machine}),
            lock_wait=LOCK_WAIT,
            around_delivery=_paced(float(job.get("pause", 0.0))),
        )
        router = Router(config)
        source = AuditedSource(
            adapter,
            audit,
            group=GROUP,
            partitions=job["partitions"],
            owner=owner,
            ttl=float(job["ttl"]),
        )
        consumer = StreamConsumer(
            router,
            source,
            lanes=int(job["lanes"]),
            batch_size=int(job["batch"]),
            commit_interval=float(job.get("commit_interval", 0.01)),
            poll=0.05,
        )
        running = asyncio.create_task(consumer.run())
        while not running.done():
            committed = await source.committed()
            if all(committed.get(p, 0) >= end for p, end in ends.items()):
                break
            await asyncio.sleep(0.05)
        await consumer.stop(drain_timeout=5.0)
        await running


def main(argv: list[str]) -> None:
    url, prefix, schema, chart, owner, audit, job = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_consume(url, options, Path(chart), owner, Path(audit), json.loads(job)))


if __name__ == "__main__":
    main(sys.argv[1:])
