"""Cancels, in bulk, every execution of the race scope, for the bulk actions' crash test.

Usage: ``python bulk_cancelling.py URL PREFIX SCHEMA CHART`` (``SCHEMA`` ``-`` for none;
``CHART`` a file holding the counter chart). Prints ``ready`` once connected, then one
``page DONE`` line after each page of the run (so that a test can kill it part-way), and
``finished DONE SKIPPED FAILED`` at the end.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from statifier.chart import compile_chart
from statifier.console.audit import Audit
from statifier.console.bulk import BULK_ACTIONS, BulkProgress, run_bulk
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver, ledger
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT, SCOPE


async def _cancel(url: str, options: TableOptions, chart: bytes) -> None:
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS],
            resolver=StaticResolver({DOCUMENT: compile_chart(chart)}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        await ledger(router, "nobody")  # connected and warm
        queries = ConsoleQueries(adapter.engine, adapter.tables)
        audit = Audit(adapter.engine, adapter.tables)
        print("ready", flush=True)

        def said(progress: BulkProgress) -> None:
            print(f"page {progress.done}", flush=True)

        done = await run_bulk(
            router,
            queries,
            audit,
            BULK_ACTIONS["cancel"],
            ExecutionFilter(scope=SCOPE),
            actor="ops",
            progress=said,
        )
        print(f"finished {done.done} {done.skipped} {done.failed}", flush=True)


def main(argv: list[str]) -> None:
    url, prefix, schema, chart = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_cancel(url, options, Path(chart).read_bytes()))


if __name__ == "__main__":
    main(sys.argv[1:])
