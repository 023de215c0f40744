"""Fires due timers from a process of its own, for the timer worker's race and crash
tests.

Usage: ``python timer_process.py URL PREFIX SCHEMA JOB`` (``SCHEMA`` ``-`` for none).
``JOB`` is JSON: ``{"batch": N, "pause": seconds, "barrier": bool}``.

It prints ``ready`` once connected; with ``"barrier"`` it then waits for a line on its
standard input, so a test can start several processes at once. It fires due timers
(``TimerWorker.fire_due`` with ``batch``) until none is left, ``pause`` seconds inside
every fire (its executor sleeps on each ``<log>``, so a kill lands mid-transaction),
and prints one JSON line: how many timers it took off the queue. A test kills it
anywhere for the crash test.
"""

from __future__ import annotations

import asyncio
import json
import sys

from statifier.core import effects as fx
from statifier.persistence import EffectContext, Refused
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, RouterConfig, StaticResolver, ledger
from statifier.router.timer_worker import TimerWorker
from statifier.sql import TableOptions

LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the other works."""


async def _main(argv: list[str]) -> None:
    url, prefix, schema, job_text = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    job = json.loads(job_text)
    pause = float(job["pause"])

    async def slow(effect: fx.Effect, context: EffectContext) -> Refused | None:
        if isinstance(effect, fx.Log) and pause:
            await asyncio.sleep(pause)
        return None

    async with SqlAdapter(url, options) as adapter:
        # Existing executions run their stored chart: no document is ever created.
        config = RouterConfig(
            adapter,
            bindings=[],
            resolver=StaticResolver({}),
            executor=slow,
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        worker = TimerWorker(router, batch=int(job["batch"]))
        await ledger(router)  # connected and warm
        print("ready", flush=True)
        if job.get("barrier"):
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        taken = 0
        while True:
            taken += await worker.fire_due()
            if await worker.next_due() is None:
                break
            # What is left is being fired by another process: look again shortly.
            await asyncio.sleep(0.005)
    print(json.dumps({"taken": taken}), flush=True)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
