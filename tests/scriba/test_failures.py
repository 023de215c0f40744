"""Failure responses with injected faults, the conservation identity, and the watermark."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from scriba import (
    Error,
    Event,
    Insert,
    MemorySource,
    MemoryTarget,
    Meta,
    Projection,
    ProjectionKey,
    Result,
    RetryPolicy,
    Scriba,
    Skip,
    Status,
)
from scriba.memory import BatchCall
from scriba.target import FailureKind
from statifier import telemetry

ROWS = sa.Table("f_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
FAST: dict[str, Any] = {
    "batch_timeout": 0.002,
    "commit_backoff": (0.0,),
    "lag_interval": 0,
    "retry": RetryPolicy(max_attempts=2, backoff=(0.0,)),
    "drain_timeout": 1.0,
}


class Mixed(Projection):
    """Types decide: "skip" skips, "error" fails, "poison" writes what the target refuses."""

    name = "mixed"

    def handle(self, event: Event, meta: Meta) -> Result:
        if event.type == "skip":
            return Skip()
        if event.type == "error":
            return Error("cannot")
        return Insert(ROWS, {"id": event.id})


def refusing_poison(call: BatchCall) -> FailureKind | None:
    if any(event.type == "poison" for event, _ in call.applied):
        return FailureKind.INTEGRITY
    return None


class Outcomes:
    """Counts what telemetry says became of each event."""

    def __init__(self) -> None:
        self.skipped = 0
        self.dead_lettered = 0
        self.applied = 0

    def __enter__(self) -> Outcomes:
        telemetry.attach("outcomes", "scriba.projection.event.skipped", self.skip)
        telemetry.attach("outcomes", "scriba.projection.dead_letter", self.dead)
        telemetry.attach("outcomes", "scriba.projection.batch.stop", self.batch)
        return self

    def __exit__(self, *exc: object) -> None:
        telemetry.detach("outcomes")

    def skip(self, name: str, m: Mapping[str, float], meta: Mapping[str, Any]) -> None:
        self.skipped += 1

    def dead(self, name: str, m: Mapping[str, float], meta: Mapping[str, Any]) -> None:
        self.dead_lettered += 1

    def batch(self, name: str, m: Mapping[str, float], meta: Mapping[str, Any]) -> None:
        self.applied += int(m["applied"])


async def settle(runtime: Scriba, source: MemorySource, projection: Any) -> Status:
    """Wait until every event is acknowledged, or the projection halted."""
    async with asyncio.timeout(10):
        while True:
            info = await runtime.info(projection)
            if info.status is Status.HALTED or source.acknowledged == len(source.events):
                return info.status
            await asyncio.sleep(0.001)


@settings(max_examples=60, deadline=None)
@given(
    kinds=st.lists(
        st.sampled_from(["E", "E", "E", "E", "skip", "error", "poison"]), min_size=1, max_size=40
    ),
    streams=st.integers(1, 5),
    parallelism=st.integers(1, 4),
    batch_size=st.integers(2, 10),
    seed=st.integers(0, 1000),
)
def test_delivered_equals_rows_plus_dead_letters_plus_skipped(
    kinds: list[str], streams: int, parallelism: int, batch_size: int, seed: int
) -> None:
    async def scenario() -> None:
        source = MemorySource(read_wait=0.0005)
        for index, kind in enumerate(kinds):
            source.record(f"s{index % streams}", kind)
        chance = random.Random(seed)

        def faults(call: BatchCall) -> FailureKind | None:
            if chance.random() < 0.15:
                return FailureKind.TRANSIENT
            return refusing_poison(call)

        target = MemoryTarget(fail=faults)
        options = {**FAST, "parallelism": parallelism, "batch_size": batch_size}
        with Outcomes() as outcomes:
            async with Scriba() as runtime:
                await runtime.start(Mixed, source=source, target=target, **options)
                status = await settle(runtime, source, Mixed)
                stats = await runtime.dead_letter_stats(Mixed)
        rows = len(target.rows(ROWS))
        if status is Status.HALTED:
            # Halting leaves the failing batch unacknowledged: nothing is lost, and
            # what was accounted for still adds up.
            assert rows + stats.total + outcomes.skipped <= len(kinds)
            assert source.acknowledged < len(kinds)
            return
        assert len(kinds) == rows + stats.total + outcomes.skipped
        assert outcomes.applied == rows
        assert outcomes.dead_lettered == stats.total
        assert stats.by_kind.get("integrity", 0) == kinds.count("poison")
        assert stats.by_kind.get("error", 0) == kinds.count("error")

    asyncio.run(scenario())


async def run_batches(kinds: list[str]) -> tuple[Status, MemoryTarget, Scriba]:
    source = MemorySource(read_wait=0.0005)
    for kind in kinds:
        source.record("one-stream", kind)
    target = MemoryTarget(fail=refusing_poison)
    runtime = Scriba()
    await runtime.start(Mixed, source=source, target=target, **{**FAST, "batch_size": 1})
    status = await settle(runtime, source, Mixed)
    return status, target, runtime


@pytest.mark.asyncio
async def test_lone_integrity_failures_dead_letter_then_halt_on_the_third_in_a_row() -> None:
    status, target, runtime = await run_batches(["poison", "poison", "poison", "E"])
    stats = await runtime.dead_letter_stats(Mixed)
    info = await runtime.info(Mixed)
    await runtime.close()
    assert status is Status.HALTED
    assert stats.total == 2  # the third is not dead-lettered: it halts instead
    assert info.halt_reason is not None
    assert "3 batches in a row" in info.halt_reason
    assert target.rows(ROWS) == []


@pytest.mark.asyncio
async def test_a_committed_write_between_lone_failures_resets_the_count() -> None:
    status, target, runtime = await run_batches(["poison", "poison", "E", "poison", "poison", "E"])
    stats = await runtime.dead_letter_stats(Mixed)
    await runtime.close()
    assert status is Status.RUNNING
    assert stats.total == 4
    assert len(target.rows(ROWS)) == 2


@pytest.mark.asyncio
async def test_a_structural_failure_halts_with_nothing_acknowledged() -> None:
    source = MemorySource()
    for _ in range(5):
        source.record("s", "E")
    target = MemoryTarget(fail=lambda call: FailureKind.STRUCTURAL)
    async with Scriba() as runtime:
        await runtime.start(Mixed, source=source, target=target, **FAST)
        assert await settle(runtime, source, Mixed) is Status.HALTED
        info = await runtime.info(Mixed)
    assert info.watermark is None
    assert source.acknowledged == 0
    assert target.calls == 1  # halted at once: no replay


@pytest.mark.asyncio
async def test_a_missing_column_halts_and_a_duplicate_key_is_dead_lettered() -> None:
    narrow = sa.Table("narrow", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))

    class Wide(Projection):
        name = "wide"

        def handle(self, event: Event, meta: Meta) -> Result:
            if event.type == "wide":
                return Insert(narrow, {"id": event.id, "missing": 1})
            return Insert(narrow, {"id": event.stream_id})  # one row per stream

    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    source.record("a", "E")  # the same key again: integrity
    source.record("b", "E")
    async with Scriba() as runtime:
        await runtime.start(Wide, source=source, target=target, **{**FAST, "batch_size": 10})
        assert await settle(runtime, source, Wide) is Status.RUNNING
        letters = await runtime.dead_letters(Wide)
        source.record("c", "wide")
        assert await settle(runtime, source, Wide) is Status.HALTED
    assert [(letter.position, letter.error_kind) for letter in letters] == [(2, "integrity")]
    assert target.rows(narrow) == [{"id": "a"}, {"id": "b"}]


class Checking(MemoryTarget):
    """Checks, at every watermark it stores, that nothing at or below it is unaccounted."""

    source: MemorySource

    async def save_watermark(
        self,
        projection: ProjectionKey,
        position: int,
        occurred_at: datetime | None,
        *,
        fence: int | None = None,
    ) -> None:
        cursors = self.cursors(projection)
        for event in self.source.events:
            if event.position <= position:
                assert cursors.get(event.stream_id, 0) >= event.position, (position, event)
        await super().save_watermark(projection, position, occurred_at, fence=fence)


class Slow(Projection):
    name = "slow"
    held: ClassVar[asyncio.Event]

    async def handle(self, event: Event, meta: Meta) -> Result:
        if event.stream_id == "held":
            await self.held.wait()
        else:
            await asyncio.sleep(random.random() / 2000)
        return Insert(ROWS, {"id": event.id})


@pytest.mark.asyncio
async def test_the_watermark_never_runs_ahead_is_throttled_while_busy_and_flushed_when_idle() -> (
    None
):
    source = MemorySource()
    for index in range(600):
        source.record(f"s{index % 13}", "E")
    source.record("held", "E")  # the last event waits in its handler
    target = Checking()
    target.source = source
    Slow.held = asyncio.Event()
    async with Scriba() as runtime:
        options = {**FAST, "parallelism": 4, "batch_size": 10}
        await runtime.start(Slow, source=source, target=target, **options)
        async with asyncio.timeout(10):
            while True:
                if (await runtime.info(Slow)).safe_position == 600:
                    break
                await asyncio.sleep(0.002)
        # Busy all along (the held event was in flight): at most one write a second.
        busy_writes = len(target.watermark_log)
        info = await runtime.info(Slow)
        Slow.held.set()
        async with asyncio.timeout(5):
            await runtime.wait_until_caught_up(Slow)
        final = await runtime.info(Slow)
    assert busy_writes <= 2
    assert info.safe_position == 600
    assert info.watermark is None or info.watermark <= 600
    assert final.watermark == 601  # flushed as soon as nothing was in flight
