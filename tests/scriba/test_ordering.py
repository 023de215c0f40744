"""P1: for every stream, events reach the target in source order (no database).

Read from the memory target's commit log, so it measures what was applied, not what
a handler saw. Random streams, parallelism, batch sizes, skips and transient commit
failures; each run also checks that every event was applied exactly once.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scriba import Event, Insert, MemorySource, MemoryTarget, Meta, Projection, Result, Scriba, Skip
from scriba.memory import BatchCall
from scriba.target import FailureKind

ROWS = sa.Table("p1_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))


class Ordered(Projection):
    name = "p1"

    def handle(self, event: Event, meta: Meta) -> Result:
        if event.type == "skip":
            return Skip()
        return Insert(ROWS, {"id": event.id})


async def run(
    streams: list[int], skips: set[int], parallelism: int, batch_size: int, seed: int
) -> None:
    source = MemorySource(read_wait=0.0005)
    for index, stream in enumerate(streams):
        source.record(f"stream-{stream}", "skip" if index in skips else "E")
    chance = random.Random(seed)

    def sometimes_transient(call: BatchCall) -> FailureKind | None:
        return FailureKind.TRANSIENT if chance.random() < 0.2 else None

    target = MemoryTarget(fail=sometimes_transient)
    options: dict[str, Any] = {
        "parallelism": parallelism,
        "batch_size": batch_size,
        "batch_timeout": 0.001,
        "commit_backoff": (0.0,),
        "lag_interval": 0,
    }
    async with Scriba() as runtime:
        await runtime.start(Ordered, source=source, target=target, **options)
        async with asyncio.timeout(10):
            while True:
                if source.acknowledged == len(streams):
                    break
                await asyncio.sleep(0.0005)
    by_stream: dict[str, list[int]] = {}
    for stream_id, position in target.commit_log:
        by_stream.setdefault(stream_id, []).append(position)
    for positions in by_stream.values():
        assert positions == sorted(positions)
    applied = sorted(position for _, position in target.commit_log)
    assert applied == [i + 1 for i in range(len(streams)) if i not in skips]


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    streams=st.lists(st.integers(0, 7), min_size=1, max_size=60),
    skip_every=st.integers(2, 9),
    parallelism=st.integers(1, 8),
    batch_size=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_per_stream_order_is_preserved(
    streams: list[int], skip_every: int, parallelism: int, batch_size: int, seed: int
) -> None:
    skips = set(range(0, len(streams), skip_every))
    asyncio.run(run(streams, skips, parallelism, batch_size, seed))
