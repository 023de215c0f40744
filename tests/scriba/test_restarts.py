"""Crashes escalate: a pipeline that keeps crashing halts with the reason, never loops
or hangs; every crash and every restart is reported."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from scriba import (
    ConfigError,
    Event,
    Insert,
    MemorySource,
    MemoryTarget,
    Meta,
    Projection,
    Result,
    Scriba,
    Status,
)
from scriba.projection import settings_of
from scriba.source import SourceError
from statifier import telemetry

ROWS = sa.Table("restart_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
FAST = {"batch_timeout": 0.005, "lag_interval": 0}
NAMES = ("scriba.projection.crashed", "scriba.projection.restarted", "scriba.projection.halted")


class Rows(Projection):
    name = "restarts"

    def handle(self, event: Event, meta: Meta) -> Result:
        return Insert(ROWS, {"id": event.id})


class BrokenSource(MemorySource):
    """Subscribes, then fails every read (after ``delay`` seconds)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay

    async def read(self, limit: int) -> Sequence[Event]:
        await asyncio.sleep(self.delay)
        raise SourceError("the log is unreadable")


@contextmanager
def recording() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        seen.append((name, {**measurements, **metadata}))

    for name in NAMES:
        telemetry.attach(f"test-restarts-{name}", name, record)
    try:
        yield seen
    finally:
        for name in NAMES:
            telemetry.detach(f"test-restarts-{name}")


async def settled(runtime: Scriba, projection: type[Projection], status: Status) -> None:
    async with asyncio.timeout(10):
        while True:
            if (await runtime.info(projection)).status is status:
                return
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_an_always_failing_source_halts_after_max_restarts_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with recording() as seen:
        async with Scriba() as runtime:
            await runtime.start(
                Rows, source=BrokenSource, target=MemoryTarget(), max_restarts=3, **FAST
            )
            await settled(runtime, Rows, Status.HALTED)
            info = await runtime.info(Rows)
            await asyncio.sleep(0.3)  # nothing more happens once halted
            assert (await runtime.info(Rows)).restarts == 3
    assert info.restarts == 3
    assert info.halt_reason is not None
    assert info.halt_reason.startswith("the pipeline crashed 4 times within 60s")
    assert "SourceError: the log is unreadable" in info.halt_reason
    [logged] = [r for r in caplog.records if " halted: " in r.getMessage()]
    assert logged.levelname == "ERROR"
    assert logged.getMessage().endswith(info.halt_reason)
    assert info.tasks == ()
    names = [name for name, _ in seen]
    assert names == [
        *["scriba.projection.crashed", "scriba.projection.restarted"] * 3,
        "scriba.projection.crashed",
        "scriba.projection.halted",
    ]
    crashes = [data for name, data in seen if name == "scriba.projection.crashed"]
    assert [crash["restarts"] for crash in crashes] == [0, 1, 2, 3]
    assert {crash["kind"] for crash in crashes} == {"SourceError"}
    restarts = [data for name, data in seen if name == "scriba.projection.restarted"]
    assert [restart["restarts"] for restart in restarts] == [1, 2, 3]
    assert all(restart["state"] == "running" for restart in restarts)
    assert all(restart["delay"] > 0 for restart in restarts)
    [halted] = [data for name, data in seen if name == "scriba.projection.halted"]
    assert halted["kind"] == "restarts"
    assert halted["reason"] == info.halt_reason


@pytest.mark.asyncio
async def test_a_source_factory_that_fails_on_restart_halts_instead_of_hanging() -> None:
    made: list[MemorySource] = []

    def factory() -> MemorySource:
        if made:
            raise ConnectionRefusedError("the event store is gone")
        made.append(BrokenSource())
        return made[0]

    async with Scriba() as runtime:
        await runtime.start(Rows, source=factory, target=MemoryTarget(), max_restarts=2, **FAST)
        await settled(runtime, Rows, Status.HALTED)
        info = await runtime.info(Rows)
    assert info.restarts == 2
    assert info.halt_reason is not None
    assert "ConnectionRefusedError: the event store is gone" in info.halt_reason


@pytest.mark.asyncio
async def test_crashes_spread_wider_than_the_window_restart_without_end() -> None:
    # Each crash comes 60 ms after its restart, past the 50 ms window: never escalates.
    async with Scriba() as runtime:
        await runtime.start(
            Rows,
            source=lambda: BrokenSource(delay=0.06),
            target=MemoryTarget(),
            max_restarts=1,
            restart_window=0.05,
            **FAST,
        )
        async with asyncio.timeout(10):
            while True:
                if (await runtime.info(Rows)).restarts >= 4:
                    break
                await asyncio.sleep(0.01)
        info = await runtime.info(Rows)
    assert info.status is not Status.HALTED
    assert info.halt_reason is None


@pytest.mark.asyncio
async def test_max_restarts_zero_halts_on_the_first_crash() -> None:
    async with Scriba() as runtime:
        await runtime.start(
            Rows, source=BrokenSource, target=MemoryTarget(), max_restarts=0, **FAST
        )
        await settled(runtime, Rows, Status.HALTED)
        info = await runtime.info(Rows)
    assert info.restarts == 0
    assert info.halt_reason is not None
    assert info.halt_reason.startswith("the pipeline crashed 1 time within 60s")


@pytest.mark.parametrize(
    "options",
    [{"max_restarts": -1}, {"max_restarts": 1.5}, {"restart_window": 0}, {"restart_window": "1"}],
)
def test_restart_options_are_checked(options: dict[str, Any]) -> None:
    class Checked(Rows):
        source = MemorySource()
        target = MemoryTarget()

    with pytest.raises(ConfigError):
        settings_of(Checked, options)
