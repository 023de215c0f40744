"""Fires the due schedules once, for the schedules' crash injection.

Usage: ``python scheduling_router.py URL PREFIX SCHEMA CHART NOW`` (``SCHEMA`` ``-``
for none; ``CHART`` a file holding the counter chart; ``NOW`` the ISO 8601 instant the
pass fires at). Prints ``ready`` once connected, then runs one pass of the scheduler
(:meth:`~statifier.router.Scheduler.fire_due`) once it reads a line on its standard
input (so that a test keeps a process started ahead, ready to go), and prints how many
fires it made.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime
from pathlib import Path

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, Router, RouterConfig, Scheduler, StaticResolver
from statifier.sql import TableOptions

SCOPE = "crash"
SOURCE = "clock"
DOCUMENT = "count"
LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the other works."""

TICKS = Binding(
    id="ticks_to_count",
    source=SOURCE,
    match="true",
    key="event.schedule",
    document=DOCUMENT,
    event="hit",
    data=("fire_time",),
)
"""Every fire goes to the counter of its schedule, created by the first one, carrying
its fire time so the input log shows which fire each entry is."""


def router_of(adapter: SqlAdapter, chart: bytes) -> Router:
    """The router both the test and this process route the fires with."""
    config = RouterConfig(
        adapter,
        bindings=[TICKS],
        resolver=StaticResolver({DOCUMENT: compile_chart(chart)}),
        lock_wait=LOCK_WAIT,
    )
    return Router(config)


async def _fire(url: str, options: TableOptions, chart: bytes, now: datetime) -> None:
    async with SqlAdapter(url, options) as adapter:
        scheduler = Scheduler(router_of(adapter, chart))
        await scheduler.next_due()  # connected and warm
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        made = await scheduler.fire_due(now=now)
        print(sum(1 for report in made if report.fire_time is not None), flush=True)


def main(argv: list[str]) -> None:
    url, prefix, schema, chart, now = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_fire(url, options, Path(chart).read_bytes(), datetime.fromisoformat(now)))


if __name__ == "__main__":
    main(sys.argv[1:])
