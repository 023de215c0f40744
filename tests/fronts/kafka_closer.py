"""A process that starts Kafka sources and closes them while their groups' joins are
under way, for the close test of ``test_kafka.py``.

Usage: ``python kafka_closer.py BOOTSTRAP TOPIC COUNT``: ``COUNT`` sources of
``TOPIC``, each in a group of its own, started at once and never polled, each closed
at its own moment between 2 and 6 seconds later (spread evenly), when a join's answer
may come in the middle of the close. Exits 0 once every close returned; a close that
does not return within 60 seconds has every thread's stack written to stderr, and the
process exits 3 (a close frozen holding the interpreter's lock stops every other
thread of the process, so only faulthandler's own thread can still say so).
"""

from __future__ import annotations

import asyncio
import faulthandler
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository, for tests.fronts
from tests.fronts.kafka_broker import FAST_GROUP

from statifier.fronts.kafka import KafkaSource

FIRST, LAST = 2.0, 6.0
"""Seconds after the start between which the closes come."""


class _Nothing:
    async def assigned(self, partitions: Any) -> None:
        pass

    async def revoked(self, partitions: Any) -> None:
        pass


async def _start_and_close(bootstrap: str, topic: str, after: float) -> None:
    source = KafkaSource(
        bootstrap,
        group=f"closer-{uuid.uuid4().hex[:10]}",
        topics=[topic],
        source="orders",
        scope="acme",
        settings=FAST_GROUP,
    )
    await source.start(_Nothing())
    await asyncio.sleep(after)
    await source.close()


async def main(bootstrap: str, topic: str, count: int) -> None:
    step = (LAST - FIRST) / max(count - 1, 1)
    moments = [FIRST + step * n for n in range(count)]
    faulthandler.dump_traceback_later(60, exit=True)
    await asyncio.gather(*(_start_and_close(bootstrap, topic, at) for at in moments))
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
