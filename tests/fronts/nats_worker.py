"""A consumer process for the JetStream crash test: a :class:`StreamConsumer` over a
:class:`JetStreamSource`, routing hits into counters on PostgreSQL.

Usage: ``python nats_worker.py JOB``, ``JOB`` being JSON: ``{"nats": url, "database":
url, "prefix": table prefix, "schema": schema, "chart": counter chart file, "stream":
name, "subjects": subject prefix, "partitions": [...], "owner": member name, "ttl":
lease seconds}``.

Hits go to the counter of their key. A ``poison`` event names a document no resolver
knows, so its routing fails every time: the consumer dead-letters it after three
attempts and moves on. The process runs until SIGTERM (then it stops the consumer:
drains, commits, leaves the group, and prints its counts as JSON) or until it is
killed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from statifier.chart import compile_chart
from statifier.fronts.consumer import DeadLetterAfter, StreamConsumer
from statifier.fronts.dead_letters import TableDeadLetters
from statifier.fronts.leases import PartitionLeases
from statifier.fronts.nats import JetStreamSource
from statifier.persistence.sql import SqlAdapter
from statifier.router import Backoff, Binding, Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.router
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
GROUP = "counters"
ATTEMPTS = 3


async def _consume(job: dict[str, Any]) -> None:
    options = TableOptions(prefix=job["prefix"], schema=job["schema"])
    machine = compile_chart(Path(job["chart"]).read_bytes())  # noqa: ASYNC240 - tiny file
    async with SqlAdapter(job["database"], options) as adapter:
        config = RouterConfig(
            adapter,
            bindings=[HITS, POISON],
            resolver=StaticResolver({DOCUMENT: machine}),
            lock_wait=LOCK_WAIT,
        )
        router = Router(config)
        leases = PartitionLeases(
            adapter,
            group=GROUP,
            partitions=job["partitions"],
            owner=job["owner"],
            ttl=float(job["ttl"]),
        )
        source = JetStreamSource(
            job["nats"],
            leases,
            stream=job["stream"],
            subject_prefix=job["subjects"],
            scope=SCOPE,
            source=HITS.source,
            pull_wait=0.5,
            ack_wait=30.0,
        )
        backoff = Backoff(base=timedelta(milliseconds=20), factor=2.0, cap=timedelta(seconds=1))
        consumer = StreamConsumer(
            router,
            source,
            failure=DeadLetterAfter(ATTEMPTS, TableDeadLetters(adapter), backoff=backoff),
            batch_size=64,
            commit_interval=0.1,
        )
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Task[None]] = []
        loop.add_signal_handler(
            signal.SIGTERM, lambda: stopping.append(asyncio.create_task(consumer.stop()))
        )
        await consumer.run()
        await asyncio.gather(*stopping)
        print(json.dumps(dataclasses.asdict(consumer.counts)), flush=True)


def main(argv: list[str]) -> None:
    (job,) = argv
    asyncio.run(_consume(json.loads(job)))


if __name__ == "__main__":
    main(sys.argv[1:])
