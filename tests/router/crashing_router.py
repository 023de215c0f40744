"""Routes a stream of hits as a front would, for the router's crash-injection test.

Usage: ``python crashing_router.py URL PREFIX SCHEMA LOCKS CHART ACKS JOB`` (``LOCKS``
the tables' ``advisory`` or ``rows``; ``SCHEMA`` ``-``
for none; ``CHART`` a file holding the counter chart). ``JOB`` is JSON:
``{"events": [[message_id, key], ...], "batch": N, "pause": seconds}``.

``ACKS`` is the stream's acknowledgements: the message ids already acknowledged, one a
line. The process routes every event not acknowledged yet, in the stream's order, ``N``
at a time (``route`` for 1, ``route_many`` for more), and acknowledges an event (appends
its id to ``ACKS``, flushed to disk) only once the call that routed it has returned, as
a front acknowledges only what committed. A process killed anywhere leaves events
routed but not acknowledged; the next one routes them again. It prints ``ready`` once
connected and ``acked`` after each acknowledgement (so a test can kill it part-way),
and exits 0 when every event is acknowledged.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from statifier.chart import Machine, compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Routed, Router, RouterConfig, StaticResolver, ledger
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.router.racing_router import HITS, LOCK_WAIT, hit


def _acknowledge(acks: Path, message_ids: list[str]) -> None:
    with acks.open("a", encoding="utf-8") as file:
        file.write("".join(f"{message_id}\n" for message_id in message_ids))
        file.flush()
        os.fsync(file.fileno())


async def _route(
    url: str, options: TableOptions, machine: Machine, acks: Path, job: dict[str, Any]
) -> None:
    done = set(acks.read_text(encoding="utf-8").split()) if acks.exists() else set()  # noqa: ASYNC240 - a few lines, before any work
    pending = [hit(message_id, key) for message_id, key in job["events"] if message_id not in done]
    batch, pause = int(job["batch"]), float(job["pause"])
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS],
            resolver=StaticResolver({"count": machine}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        await ledger(router)  # connected and warm
        print("ready", flush=True)
        for start in range(0, len(pending), batch):
            chunk = pending[start : start + batch]
            if batch == 1:
                answers: list[object] = [await router.route(chunk[0])]
            else:
                answers = list(await router.route_many(chunk))
            if not all(isinstance(answer, Routed) for answer in answers):
                raise RuntimeError(f"an event of {[e.message_id for e in chunk]} failed")
            _acknowledge(acks, [event.message_id for event in chunk])
            print("acked", flush=True)
            await asyncio.sleep(pause)


def main(argv: list[str]) -> None:
    url, prefix, schema, locks, chart, acks, job = argv
    options = TableOptions(
        prefix=prefix,
        schema=None if schema == "-" else schema,
        locks="rows" if locks == "rows" else "advisory",
    )
    machine = compile_chart(Path(chart).read_bytes())
    asyncio.run(_route(url, options, machine, Path(acks), json.loads(job)))


if __name__ == "__main__":
    main(sys.argv[1:])
