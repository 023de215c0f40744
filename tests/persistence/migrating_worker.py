"""Migrates every execution of a chart from a process of its own, for the crash test.

Usage: ``python migrating_worker.py URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none).
Prints ``migrating`` once connected, then runs ``migrate_all`` from :data:`OLD` to
:data:`NEW` in batches of :data:`BATCH` and prints ``done`` with the number migrated.
The test kills it (SIGKILL) at random moments in between.
"""

from __future__ import annotations

import asyncio
import sys

from statifier.chart import compile_chart
from statifier.persistence import Executions, MigrationPlan, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions

NS = 'xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"'
OLD = compile_chart(
    f'<scxml {NS} initial="placed"><datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paid">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="paid"><transition event="ship" target="shipped"/></state>'
    '<final id="shipped"/></scxml>'
)
NEW = compile_chart(
    f'<scxml {NS} initial="placed"><datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="charged">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="charged"><transition event="ship" target="shipped"/></state>'
    '<final id="shipped"/></scxml>'
)
PLAN = MigrationPlan(OLD, NEW, state_map={"paid": "charged"})
BATCH = 10


async def _main(url: str, prefix: str, schema: str) -> None:
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    async with SqlAdapter(url, options) as adapter:
        executions = Executions(Storage(adapter))
        await adapter.fetch_chart(PLAN.source_hash)  # connected and warm
        print("migrating", flush=True)
        summary = await executions.migrate_all(PLAN.source_hash, PLAN, batch=BATCH)
    print("done", len(summary.migrated), flush=True)


if __name__ == "__main__":
    asyncio.run(_main(*sys.argv[1:]))
