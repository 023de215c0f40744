"""Steps one durable execution from a process of its own, for the concurrency test.

Usage: ``python sql_stepper.py URL PREFIX SCHEMA CHART EXECUTION_ID FIRST COUNT``
(``SCHEMA`` ``-`` for none). Sends events ``n`` with ``{"n": FIRST}`` ...
``{"n": FIRST + COUNT - 1}`` in order, each as one durable step, and prints ``done``.
It prints ``ready`` first and waits for a line on its standard input before stepping,
so the test can start everyone at once.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions


async def _main(argv: list[str]) -> None:
    url, prefix, schema, chart, execution_id, first, count = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    machine = compile_chart(await asyncio.to_thread(Path(chart).read_bytes))
    async with SqlAdapter(url, options) as adapter:
        executions = Executions(Storage(adapter))
        await adapter.fetch_execution(execution_id)  # connected and warm
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for n in range(int(first), int(first) + int(count)):
            await executions.step(execution_id, machine, Event("n", data={"n": n}))
    print("done")


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
