"""Resumes one paused counter, for the pause tests' crash injection.

Usage: ``python resuming_router.py URL PREFIX SCHEMA CHART EXECUTION_ID`` (``SCHEMA``
``-`` for none; ``CHART`` a file holding the counter chart). Prints ``ready`` once
connected, then resumes the execution (stepping in every event held for it, in one
transaction) and prints what the resume did.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver, ledger
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT


async def _resume(url: str, options: TableOptions, chart: bytes, execution_id: str) -> None:
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS],
            resolver=StaticResolver({DOCUMENT: compile_chart(chart)}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        await ledger(router, execution_id)  # connected and warm
        print("ready", flush=True)
        print(await router.resume(execution_id), flush=True)


def main(argv: list[str]) -> None:
    url, prefix, schema, chart, execution_id = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_resume(url, options, Path(chart).read_bytes(), execution_id))


if __name__ == "__main__":
    main(sys.argv[1:])
