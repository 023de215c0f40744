"""Cancels, in bulk, every execution of the race scope, for the bulk actions' crash test.

Usage: ``python bulk_cancelling.py URL PREFIX SCHEMA CHART [RUN]`` (``SCHEMA`` ``-`` for
none; ``CHART`` a file holding the counter chart; ``RUN`` the id of a recorded run to
run again, its action and filter read from its row). Prints ``ready`` once connected,
``run ID`` once its row is written, then one ``page DONE`` line after each page of the
run (so that a test can kill it part-way), and ``finished DONE SKIPPED FAILED`` at the
end.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from statifier.chart import compile_chart
from statifier.console.audit import Audit
from statifier.console.bulk import BULK_ACTIONS, BulkProgress, preview
from statifier.console.bulk_runs import BulkLog, action_of, run_recorded
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver, ledger
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT, SCOPE


async def _cancel(url: str, options: TableOptions, chart: bytes, again: str | None) -> None:
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
        log = BulkLog(adapter.engine, adapter.tables)
        print("ready", flush=True)
        action, where = BULK_ACTIONS["cancel"], ExecutionFilter(scope=SCOPE)
        if again is not None:  # what the interrupted run's row says it did
            interrupted = await log.get(again)
            assert interrupted is not None
            assert not interrupted.finished, interrupted
            action, where = await action_of(router, interrupted), interrupted.where
        selected = await preview(queries, action, where)
        run_id = uuid.uuid4().hex
        await log.start(
            run_id, action, where, actor="ops", selected=selected, now=router.storage.clock()
        )
        print(f"run {run_id}", flush=True)

        async def said(progress: BulkProgress) -> None:
            print(f"page {progress.done}", flush=True)

        done = await run_recorded(
            router,
            queries,
            audit,
            log,
            run_id,
            action,
            where,
            actor="ops",
            selected=selected,
            progress=said,
        )
        print(f"finished {done.done} {done.skipped} {done.failed}", flush=True)


def main(argv: list[str]) -> None:
    url, prefix, schema, chart, *again = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_cancel(url, options, Path(chart).read_bytes(), again[0] if again else None))


if __name__ == "__main__":
    main(sys.argv[1:])
