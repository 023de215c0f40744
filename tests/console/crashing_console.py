"""Takes the console's actions one after another, for the console's crash-injection test.

Usage: ``python crashing_console.py URL PREFIX SCHEMA JOB`` (``SCHEMA`` ``-`` for
none). ``JOB`` is JSON: ``{"actions": [[action, target], ...]}``, each action one of
``cancel``, ``retry_outbox``, ``discard_outbox``, ``retry_consumer``,
``discard_consumer``, each target an execution id or a row id.

Every action is taken as the console takes it: through
:mod:`statifier.console.actions`, its ``done`` audit row written by
:meth:`~statifier.console.audit.Audit.record_in` in the action's transaction (after a
random pause of a few milliseconds, the window in which a process killed would leave
an act without its row if the two were separate transactions), a ``refused`` one in a
transaction of its own. The process prints ``ready`` once connected, ``recording``
when an action's statements have run and its row is about to be written, ``acted``
after each action, and exits 0 when every action was taken (done or refused).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

from statifier.console import actions
from statifier.console.audit import Audit, AuditEntry
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router import Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.conftest import impression_bindings, join_chart

ACTOR = "crash"
LOCK_WAIT = 10.0


def target_of(action: str, target: str) -> str:
    """The audit target the console writes for ``action`` on ``target``."""
    if action.endswith("_outbox"):
        return f"outbox:{target}"
    if action.endswith("_consumer"):
        return f"consumer:{target}"
    return target


async def _take(router: Router, action: str, target: str, record: actions.Record) -> actions.Done:
    if action == "cancel":
        return await actions.cancel(router, target, record=record)
    row = actions.row_id(router.adapter.tables, target)
    if action == "retry_outbox":
        return await actions.retry_outbox(router, row, record=record)
    if action == "discard_outbox":
        return await actions.discard_outbox(router, row, record=record)
    if action == "retry_consumer":
        return await actions.retry_consumer(router, row, {}, record=record)
    return await actions.discard_consumer(router, row, record=record)


async def _act(url: str, options: TableOptions, job: dict[str, Any]) -> None:
    chooser = random.Random()
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=impression_bindings(),
            resolver=StaticResolver({"join": join_chart()}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        audit = Audit(adapter.engine, adapter.tables)
        await audit.entries(size=1)  # connected and warm
        print("ready", flush=True)
        for action, target in job["actions"]:
            audited = target_of(action, target)

            async def record(
                tx: SqlTransaction, done: actions.Done, action: str = action, audited: str = audited
            ) -> None:
                print("recording", flush=True)
                await asyncio.sleep(chooser.uniform(0.002, 0.008))
                entry = AuditEntry(ACTOR, action=action, target=audited, detail=done.summary)
                await audit.record_in(tx, entry)

            try:
                await _take(router, action, target, record)
            except actions.Refused as refused:
                entry = AuditEntry(
                    ACTOR, action=action, target=audited, outcome="refused", detail=str(refused)
                )
                await audit.record(entry)
            print("acted", flush=True)


def main(argv: list[str]) -> None:
    url, prefix, schema, job = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_act(url, options, json.loads(job)))


if __name__ == "__main__":
    main(sys.argv[1:])
