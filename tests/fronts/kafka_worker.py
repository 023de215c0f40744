"""A consumer process for the Kafka crash test: a :class:`StreamConsumer` over a
:class:`KafkaSource`, routing hits into counters on PostgreSQL.

Usage: ``python kafka_worker.py JOB``, ``JOB`` being JSON: ``{"brokers": bootstrap,
"database": url, "prefix": table prefix, "schema": schema, "chart": counter chart
file, "topic": name, "group": consumer group, "dead_letters": topic}``.

Hits go to the counter of their key. A ``poison`` event names a document no resolver
knows, so its routing fails every time: the consumer puts it to the dead-letter topic
after three attempts and moves on; a malformed record goes there at once. The process
runs until SIGTERM (then it stops the consumer: drains, commits, leaves the group, and
prints its counts as JSON) or until it is killed. SIGUSR1 writes every thread's stack
to stderr, SIGUSR2 every asyncio task's: a test that finds the process stuck asks for
both before it fails, so the failure shows where.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import json
import logging
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from statifier.chart import compile_chart
from statifier.fronts.consumer import DeadLetterAfter, StreamConsumer
from statifier.fronts.kafka import KafkaDeadLetters, KafkaSource
from statifier.persistence.sql import SqlAdapter
from statifier.router import Backoff, Binding, Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
from tests.fronts.kafka_broker import FAST_GROUP
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT, SCOPE

POISON = Binding(
    id="poison_to_nowhere",
    source=HITS.source,
    match="event.kind == 'poison'",
    key="event.key",
    document="nowhere",
    event="hit",
)
"""Routes to a document no resolver holds: every attempt fails."""
ATTEMPTS = 3


async def _consume(job: dict[str, Any], chart: bytes) -> None:
    options = TableOptions(prefix=job["prefix"], schema=job["schema"])
    async with SqlAdapter(job["database"], options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS, POISON],
            resolver=StaticResolver({DOCUMENT: compile_chart(chart)}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        source = KafkaSource(
            job["brokers"],
            group=job["group"],
            topics=[job["topic"]],
            source=HITS.source,
            scope=SCOPE,
            settings=FAST_GROUP,
        )
        dead_letters = KafkaDeadLetters(job["brokers"], job["dead_letters"])
        backoff = Backoff(base=timedelta(milliseconds=20), factor=2.0, cap=timedelta(seconds=1))
        consumer = StreamConsumer(
            router,
            source,
            failure=DeadLetterAfter(ATTEMPTS, dead_letters, backoff=backoff),
            malformed=dead_letters,
            commit_interval=0.1,
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR2, _print_tasks)
        stopping: list[asyncio.Task[None]] = []
        loop.add_signal_handler(
            signal.SIGTERM, lambda: stopping.append(asyncio.create_task(consumer.stop()))
        )
        try:
            await consumer.run()
            await asyncio.gather(*stopping)
        finally:
            await dead_letters.close()
        print(json.dumps(dataclasses.asdict(consumer.counts)), flush=True)


def _print_tasks() -> None:
    """Each task and the chain of coroutines it awaits, innermost last (a task's own
    stack shows only its outermost coroutine)."""
    for task in asyncio.all_tasks():
        print(f"task {task.get_name()}:", file=sys.stderr)
        awaited: Any = task.get_coro()
        while getattr(awaited, "cr_frame", None) is not None:
            frame = awaited.cr_frame
            print(
                f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}",
                file=sys.stderr,
            )
            awaited = awaited.cr_await
        print(f"  awaiting {awaited!r}", file=sys.stderr)
    sys.stderr.flush()


def main(argv: list[str]) -> None:
    # Not through the loop: it answers even when the loop is stuck, or gone (exit).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    (job,) = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parsed = json.loads(job)
    asyncio.run(_consume(parsed, Path(parsed["chart"]).read_bytes()))


if __name__ == "__main__":
    main(sys.argv[1:])
