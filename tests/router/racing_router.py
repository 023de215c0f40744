"""Routes hit events from a process of its own, for the router's race tests.

Usage: ``python racing_router.py URL PREFIX SCHEMA LOCKS CHART JOB`` (``SCHEMA`` ``-``
for none; ``LOCKS`` the tables' ``advisory`` or ``rows``; ``CHART`` a file holding the
counter chart of document ``count``). ``JOB`` is JSON:
``{"lanes": [[[message_id, key], ...], ...], "batch": false, "pause": 0.01}``. Every
lane is one task: it routes its events one by one with
:meth:`~statifier.router.Router.route`, ``pause`` seconds apart (none by default), or,
with ``"batch": true``, as one :meth:`~statifier.router.Router.route_many` call.

It prints ``ready`` once connected, waits for a line on its standard input so the test
can start every process at once, then prints one JSON line: the outcome of every event
it routed (``[[message_id, outcome], ...]``). With ``"meet": true`` it first routes the
first event of its first lane alone, prints ``first`` and waits for another line, so
the test can hold every process until each has routed one event: then no process can
route all its events before another has begun, however the machine schedules them.

The test imports :data:`HITS` and :func:`hit` from here, so both route the same way.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from statifier.chart import compile_chart
from statifier.expr import Value
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Failed,
    InboundEvent,
    Routed,
    Router,
    RouterConfig,
    StaticResolver,
    ledger,
)
from statifier.sql import TableOptions

SCOPE = "races"
SOURCE = "hits"
DOCUMENT = "count"
LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the others work."""

HITS = Binding(
    id="hits_to_count",
    source=SOURCE,
    match="event.kind == 'hit'",
    key="event.key",
    document=DOCUMENT,
    event="hit",
    data=("message_id",),
)
"""Every hit goes to the counter of its key, created by the first one, carrying its
message id so the input log shows which message each entry is."""


def hit(message_id: str, key: str) -> InboundEvent:
    """The inbound hit ``message_id`` for ``key``."""
    data: dict[str, Value] = {"kind": "hit", "key": key, "message_id": message_id}
    return InboundEvent(scope=SCOPE, source=SOURCE, message_id=message_id, data=data)


async def _lane(
    router: Router, events: list[InboundEvent], batch: bool, pause: float
) -> list[list[str]]:
    if batch:
        answers = await router.route_many(events)
        for answer in answers:
            if isinstance(answer, Failed):
                raise RuntimeError(f"{answer.event.message_id} failed") from answer.error
        routed = [answer for answer in answers if isinstance(answer, Routed)]
        return [[r.event.message_id, outcome.outcome] for r in routed for outcome in r.outcomes]
    outcomes: list[list[str]] = []
    for event in events:
        one = await router.route(event)
        outcomes.extend([event.message_id, outcome.outcome] for outcome in one.outcomes)
        # Events arrive a little apart. Back to back, this process's tasks would keep
        # SQLite's writer busy, and another process, which can only poll for the file's
        # write lock, would route after them: correct, but not at once.
        await asyncio.sleep(pause)
    return outcomes


async def _main(argv: list[str]) -> None:
    url, prefix, schema, locks, chart, job_text = argv
    options = TableOptions(
        prefix=prefix,
        schema=None if schema == "-" else schema,
        locks="rows" if locks == "rows" else "advisory",
    )
    machine = compile_chart(await asyncio.to_thread(Path(chart).read_bytes))
    job = json.loads(job_text)
    lanes = [[hit(message_id, key) for message_id, key in lane] for lane in job["lanes"]]
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS],
            resolver=StaticResolver({DOCUMENT: machine}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        await ledger(router)  # connected and warm
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        batch, pause = job["batch"], job.get("pause", 0.0)
        met: list[list[str]] = []
        if job.get("meet"):
            met = await _lane(router, lanes[0][:1], batch, 0.0)
            lanes[0] = lanes[0][1:]
            print("first", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        done = await asyncio.gather(*(_lane(router, lane, batch, pause) for lane in lanes))
    print(json.dumps([*met, *(pair for lane in done for pair in lane)]))


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1:]))
