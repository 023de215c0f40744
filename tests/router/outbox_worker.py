"""An outbox drain worker in a process of its own, for the outbox's race and crash
tests.

Usage: ``python outbox_worker.py URL PREFIX SCHEMA RECORD JOB`` (``SCHEMA`` ``-`` for
none). ``JOB`` is JSON: ``{"batch": N, "lease": seconds, "pause": seconds,
"kill_after": K}``.

The worker drains queue ``jobs`` with a sink that appends one JSON line to ``RECORD``
per call (the row's ``n``, the key it was handed, this process's id and the call's
start and end on the system's monotonic clock, which every process shares), flushed to
disk before the sink returns, after sleeping ``pause`` seconds in between. With ``K``
above 0 the process SIGKILLs itself right after the ``K``-th call's line is written:
the sink has done its work and the drain has not marked the row sent.

It prints ``ready`` once connected, then waits for a line on stdin (so that two
workers start draining together), drains until no row of the queue is pending, and
exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from statifier.persistence.sql import SqlAdapter
from statifier.router.outbox import OutboxDrain, OutboxMessage
from statifier.sql import TableOptions

QUEUE = "jobs"


def _record(path: Path, line: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")
        file.flush()
        os.fsync(file.fileno())


async def _drain(url: str, options: TableOptions, record: Path, job: dict[str, Any]) -> None:
    pause, kill_after = float(job["pause"]), int(job["kill_after"])
    calls = 0

    async def sink(message: OutboxMessage) -> None:
        nonlocal calls
        started = time.monotonic()
        await asyncio.sleep(pause)
        data = message.event.data
        assert isinstance(data, dict)
        line = {
            "n": data["n"],
            "key": message.key,
            "pid": os.getpid(),
            "start": started,
            "end": time.monotonic(),
        }
        _record(record, line)
        calls += 1
        if calls == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    async with SqlAdapter(url, options) as adapter:
        drain = OutboxDrain(adapter, {QUEUE: sink}, batch=int(job["batch"]), lease=job["lease"])
        await drain.pending()  # connected and warm
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        while True:
            drained = await drain.drain_once()
            if drained.claimed:
                continue
            if not await drain.pending(QUEUE):
                return
            await asyncio.sleep(0.02)  # what is left is leased by another worker


def main(argv: list[str]) -> None:
    url, prefix, schema, record, job = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    asyncio.run(_drain(url, options, Path(record), json.loads(job)))


if __name__ == "__main__":
    main(sys.argv[1:])
