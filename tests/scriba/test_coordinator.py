"""The lifecycle: states, transitions, invalid commands, pause, crashes, lag, tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

from scriba import (
    Event,
    Insert,
    InvalidState,
    MemorySource,
    MemoryTarget,
    Meta,
    Projection,
    Result,
    Scriba,
    StartFailed,
    Status,
    UnknownProjection,
)
from scriba.memory import BatchCall
from scriba.source import SourceError
from scriba.target import FailureKind
from statifier import telemetry

ROWS = sa.Table("rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
FAST: dict[str, Any] = {"batch_timeout": 0.005, "commit_backoff": (0.001,), "lag_interval": 0}


class Rows(Projection):
    name = "rows"

    def handle(self, event: Event, meta: Meta) -> Result:
        return Insert(ROWS, {"id": event.id})


class Gated(Projection):
    """Waits at ``gate`` before handling each event (async handler)."""

    name = "gated"
    gate: ClassVar[asyncio.Event]
    entered: ClassVar[asyncio.Event]

    async def handle(self, event: Event, meta: Meta) -> Result:
        self.entered.set()
        await self.gate.wait()
        return Insert(ROWS, {"id": event.id})


def scriba_tasks() -> list[str]:
    return sorted(
        task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("scriba:")
    )


async def reaches(runtime: Scriba, projection: Any, status: Status) -> None:
    async with asyncio.timeout(5):
        while True:
            if (await runtime.info(projection)).status is status:
                return
            await asyncio.sleep(0.002)


async def caught_up(runtime: Scriba, projection: Any) -> None:
    async with asyncio.timeout(5):
        await runtime.wait_until_caught_up(projection)


class Lifecycle:
    """Records scriba lifecycle telemetry."""

    NAMES = (
        "scriba.projection.started",
        "scriba.projection.paused",
        "scriba.projection.stopped",
        "scriba.projection.halted",
    )

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __enter__(self) -> Lifecycle:
        for name in self.NAMES:
            telemetry.attach("lifecycle", name, self.record)
        return self

    def __exit__(self, *exc: object) -> None:
        telemetry.detach("lifecycle")

    def record(self, name: str, measurements: Mapping[str, float], meta: Mapping[str, Any]) -> None:
        self.seen.append((name.rsplit(".", 1)[1], dict(meta)))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


@pytest.mark.asyncio
async def test_running_paused_running_draining_stopped() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    with Lifecycle() as lifecycle:
        async with Scriba() as runtime:
            key = await runtime.start(Rows, source=source, target=target, parallelism=3, **FAST)
            assert (await runtime.info(Rows)).status is Status.RUNNING
            assert sorted((await runtime.info(Rows)).tasks) == [
                "scriba:rows:v1:partition-0",
                "scriba:rows:v1:partition-0-batcher",
                "scriba:rows:v1:partition-1",
                "scriba:rows:v1:partition-1-batcher",
                "scriba:rows:v1:partition-2",
                "scriba:rows:v1:partition-2-batcher",
                "scriba:rows:v1:reader",
                "scriba:rows:v1:supervisor",
            ]
            runtime.pause(key)
            assert (await runtime.info("rows")).status is Status.PAUSED
            runtime.resume(("rows", 1))
            assert (await runtime.info("rows", 1)).status is Status.RUNNING
            await caught_up(runtime, Rows)
            await runtime.stop(Rows)
            info = await runtime.info(Rows)
            assert info.status is Status.STOPPED
            assert info.tasks == ()
            assert [(p.name, p.version, p.status) for p in runtime.list()] == [
                ("rows", 1, Status.STOPPED)
            ]
    assert lifecycle.names == ["started", "paused", "started", "stopped"]
    assert [meta.get("resumed") for _, meta in lifecycle.seen[::2]] == [False, True]
    assert lifecycle.seen[-1][1]["from_state"] == "running"
    assert scriba_tasks() == []
    assert target.rows(ROWS) == [{"id": "ev-1"}]


@pytest.mark.asyncio
async def test_stop_passes_through_draining_while_a_batch_finishes() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    Gated.gate, Gated.entered = asyncio.Event(), asyncio.Event()
    async with Scriba() as runtime:
        await runtime.start(Gated, source=source, target=target, **FAST)
        await Gated.entered.wait()
        stopping = asyncio.create_task(runtime.stop(Gated))
        await asyncio.sleep(0.01)
        assert (await runtime.info(Gated)).status is Status.DRAINING
        with pytest.raises(InvalidState) as refused:
            await runtime.stop(Gated)
        assert refused.value.state is Status.DRAINING
        Gated.gate.set()
        await stopping
        assert (await runtime.info(Gated)).status is Status.STOPPED
    # The event the handler was on when the stop came was committed, not dropped.
    assert target.rows(ROWS) == [{"id": "ev-1"}]
    assert source.acknowledged == 1


@pytest.mark.asyncio
async def test_every_invalid_command_is_refused_with_the_current_state() -> None:
    source, target = MemorySource(), MemoryTarget()
    async with Scriba() as runtime:
        await runtime.start(Rows, source=source, target=target, **FAST)
        with pytest.raises(InvalidState) as refused:
            runtime.resume(Rows)
        assert refused.value.state is Status.RUNNING
        with pytest.raises(InvalidState) as refused:
            await runtime.start(Rows, source=source, target=target)
        assert refused.value.state is Status.RUNNING
        with pytest.raises(InvalidState):
            await runtime.reset(Rows)
        runtime.pause(Rows)
        with pytest.raises(InvalidState) as refused:
            runtime.pause(Rows)  # not a no-op
        assert refused.value.state is Status.PAUSED
        with pytest.raises(InvalidState):
            await runtime.reset("rows")
        with Lifecycle() as lifecycle:
            await runtime.stop(Rows)  # paused -> stopped, no draining
        assert lifecycle.seen == [
            ("stopped", {"name": "rows", "version": 1, "from_state": "paused"})
        ]
        for command in (runtime.pause, runtime.resume):
            with pytest.raises(InvalidState) as refused:
                command(Rows)
            assert refused.value.state is Status.STOPPED
        with pytest.raises(InvalidState):
            await runtime.stop(Rows)
        with pytest.raises(UnknownProjection):
            runtime.pause("nothing")
        with pytest.raises(UnknownProjection):
            await runtime.info("rows", 2)
        # A stopped projection starts again.
        await runtime.start(Rows, source=source, target=target, **FAST)
        assert (await runtime.info(Rows)).status is Status.RUNNING


@pytest.mark.asyncio
async def test_a_halted_projection_refuses_pause_and_resume_and_stops() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    target.fail = lambda call: FailureKind.STRUCTURAL
    with Lifecycle() as lifecycle:
        async with Scriba() as runtime:
            options = {**FAST, "lag_interval": 0.01}
            await runtime.start(Rows, source=source, target=target, **options)
            await reaches(runtime, Rows, Status.HALTED)
            # The pipeline winds down and releases its source; then nothing runs but
            # the lag ticker (lag keeps growing while halted).
            async with asyncio.timeout(5):
                while True:
                    info = await runtime.info(Rows)
                    if info.tasks == ("scriba:rows:v1:lag",):
                        break
                    await asyncio.sleep(0.002)
            assert info.halt_reason == "injected structural failure"
            assert source.closed
            for command in (runtime.pause, runtime.resume):
                with pytest.raises(InvalidState) as refused:
                    command(Rows)
                assert refused.value.state is Status.HALTED
            with pytest.raises(InvalidState):
                await runtime.reset(Rows)
            await asyncio.sleep(0.03)
            assert (await runtime.info(Rows)).status is Status.HALTED  # stays halted
            await runtime.stop(Rows)
            assert (await runtime.info(Rows)).status is Status.STOPPED
            assert scriba_tasks() == []
            counts = await runtime.reset(Rows)
            assert counts.positions == 0
    assert lifecycle.names == ["started", "halted", "stopped"]
    assert lifecycle.seen[1][1]["kind"] == "structural"
    assert target.rows(ROWS) == []
    assert source.acknowledged == 0


@pytest.mark.asyncio
async def test_pause_holds_demand_and_in_flight_batches_still_commit() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    Gated.gate, Gated.entered = asyncio.Event(), asyncio.Event()
    async with Scriba() as runtime:
        await runtime.start(Gated, source=source, target=target, **FAST)
        await Gated.entered.wait()
        runtime.pause(Gated)
        Gated.gate.set()  # the in-flight event finishes and commits while paused
        async with asyncio.timeout(5):
            while True:
                if target.rows(ROWS):
                    break
                await asyncio.sleep(0.002)
        await asyncio.sleep(0.02)
        reads = source.reads
        source.record("b", "E")
        await asyncio.sleep(0.05)
        assert source.reads == reads  # nothing read while paused
        assert len(target.rows(ROWS)) == 1
        info = await runtime.info(Gated)
        assert info.watermark == 1  # flushed once idle, even while paused
        runtime.resume(Gated)
        await caught_up(runtime, Gated)
        assert len(target.rows(ROWS)) == 2


@pytest.mark.asyncio
async def test_a_crashed_pipeline_restarts_into_running_and_dedup_absorbs_the_replay() -> None:
    source, target = MemorySource(replay_from_zero=True), MemoryTarget()
    for index in range(10):
        source.record(f"s{index % 3}", "E")
    async with Scriba() as runtime:
        await runtime.start(Rows, source=source, target=target, **FAST)
        await caught_up(runtime, Rows)
        source.fail_next_read(SourceError("connection lost"))
        async with asyncio.timeout(5):
            while True:
                info = await runtime.info(Rows)
                if info.restarts == 1 and info.status is Status.RUNNING:
                    break
                await asyncio.sleep(0.002)
        await caught_up(runtime, Rows)
        assert len(source.subscriptions) == 2
        source.record("s9", "E")
        await caught_up(runtime, Rows)
    assert len(target.commit_log) == 11  # no duplicate from the replay
    assert scriba_tasks() == []


@pytest.mark.asyncio
async def test_a_pipeline_lost_while_paused_comes_back_paused() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "E")
    Gated.gate, Gated.entered = asyncio.Event(), asyncio.Event()
    crash = [True]

    def crash_once(call: BatchCall) -> FailureKind | None:
        if crash.pop() if crash else False:
            raise RuntimeError("target bug")
        return None

    async with Scriba() as runtime:
        await runtime.start(Gated, source=source, target=target, **FAST)
        await Gated.entered.wait()
        runtime.pause(Gated)
        target.fail = crash_once
        Gated.gate.set()
        async with asyncio.timeout(5):
            while True:
                info = await runtime.info(Gated)
                if info.restarts == 1 and info.status is Status.PAUSED:
                    break
                await asyncio.sleep(0.002)
        reads = source.reads
        await asyncio.sleep(0.05)
        assert source.reads == reads  # the pause was reapplied to the new pipeline
        assert target.rows(ROWS) == []
        runtime.resume(Gated)
        await caught_up(runtime, Gated)
    assert target.rows(ROWS) == [{"id": "ev-1"}]


@pytest.mark.asyncio
async def test_a_source_that_cannot_subscribe_fails_the_start_and_leaves_it_stopped() -> None:
    class Broken(MemorySource):
        async def subscribe(self, projection: Any, after: int) -> None:
            raise SourceError("no such log")

    async with Scriba() as runtime:
        with pytest.raises(StartFailed, match="no such log"):
            await runtime.start(Rows, source=Broken(), target=MemoryTarget(), **FAST)
        assert (await runtime.info(Rows)).status is Status.STOPPED
        assert scriba_tasks() == []


@pytest.mark.asyncio
async def test_the_lag_tick_fires_on_its_own_timer_under_heavy_load() -> None:
    source, target = MemorySource(), MemoryTarget()
    # The commit counts at which a tick found the pipeline behind (a positive lag): ticks
    # at several of them show the timer runs while work is waiting, not once it idles.
    busy_ticks: set[int] = set()
    enough = asyncio.Event()

    def on_lag(name: str, measurements: Mapping[str, float], meta: Mapping[str, Any]) -> None:
        if measurements["lag_ms"] > 0 and target.commit_log:
            busy_ticks.add(len(target.commit_log))
        if len(busy_ticks) >= 5:
            enough.set()

    telemetry.attach("lag", "scriba.projection.lag", on_lag)
    stop = asyncio.Event()

    async def produce() -> None:
        # Keeps the pipeline busy: there is always something to read and commit.
        index = 0
        while not stop.is_set():
            for _ in range(500):
                source.record(f"s{index % 50}", "E")
                index += 1
            await asyncio.sleep(0)

    try:
        async with Scriba() as runtime:
            options = {**FAST, "lag_interval": 0.02, "batch_size": 50, "parallelism": 4}
            await runtime.start(Rows, source=source, target=target, **options)
            producer = asyncio.create_task(produce())
            # No wall-clock ratio: a slow machine delays every timer alike. Starvation
            # would show as no tick while the pipeline is behind, and so a timeout here.
            async with asyncio.timeout(30):
                await enough.wait()
            stop.set()
            await producer
    finally:
        telemetry.detach("lag")
    assert len(busy_ticks) >= 5


@pytest.mark.asyncio
async def test_the_context_manager_stops_everything_and_closes_made_targets() -> None:
    made: list[MemoryTarget] = []

    def make_target() -> MemoryTarget:
        made.append(MemoryTarget())
        return made[-1]

    class Other(Rows):
        name = "other"

    source = MemorySource()
    async with Scriba() as runtime:
        await runtime.start(Rows, source=source, target=make_target, **FAST)
        await runtime.start(Other, source=MemorySource, target=make_target, **FAST)
        runtime.pause(Other)
        assert len(scriba_tasks()) == 8
    assert scriba_tasks() == []
    assert len(made) == 1  # one target per factory per runtime
    assert made[0].closed
    assert [p.status for p in runtime.list()] == [Status.STOPPED, Status.STOPPED]
    assert source.closed
