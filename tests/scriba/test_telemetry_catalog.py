"""The scriba part of the telemetry catalog matches what the code emits, key by key."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import scriba
from scriba import (
    Error,
    Event,
    Insert,
    MemorySource,
    MemoryTarget,
    Meta,
    Projection,
    Result,
    RetryPolicy,
    Scriba,
    Skip,
    Status,
)
from scriba.target import FailureKind
from statifier import telemetry

CATALOG = Path(__file__).parents[2] / "docs" / "telemetry.md"
ROW = re.compile(r"^\| `(scriba\.[a-z_.]+)` \|([^|]*)\|([^|]*)\|", re.M)
ROWS = sa.Table("cat_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))


def keys_in(cell: str) -> set[str]:
    """The backticked names of a table cell, leaving out the values in parentheses."""
    return set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", cell)))


def documented() -> dict[str, tuple[set[str], set[str]]]:
    """Event name -> (measurement keys, metadata keys) from the catalog's table; a
    metadata cell reading "as `event.start`, plus ..." adds that row's keys."""
    rows = {
        name: (measures.strip(), meta.strip())
        for name, measures, meta in ROW.findall(CATALOG.read_text())
    }
    keys: dict[str, tuple[set[str], set[str]]] = {}
    for name, (measures, meta) in rows.items():
        inherited: set[str] = set()
        alias = re.match(r"as `([a-z_.]+)`", meta)
        if alias:
            inherited = keys_in(rows[f"scriba.projection.{alias[1]}"][1])
            meta = meta[alias.end() :]
        keys[name] = (keys_in(measures), keys_in(meta) | inherited | {"name", "version"})
    return keys


def test_seventeen_events_documented_cataloged_and_emitted_by_the_code() -> None:
    names = set(documented())
    assert len(names) == 17
    assert names == {name for name in telemetry.EVENTS if name.startswith("scriba.")}
    root = Path(scriba.__file__).parent
    sources = "".join(path.read_text(encoding="utf-8") for path in root.rglob("*.py"))
    assert set(re.findall(r'"(scriba\.(?:projection|source)\.[a-z_.]+)"', sources)) == names


class Everything(Projection):
    name = "catalog"

    def handle(self, event: Event, meta: Meta) -> Result:
        if event.type == "raise":
            raise RuntimeError("boom")
        if event.type == "error":
            return Error("no")
        if event.type == "skip":
            return Skip()
        return Insert(ROWS, {"id": event.id})


@pytest.mark.asyncio
async def test_what_the_engine_emits_carries_exactly_the_documented_keys() -> None:
    seen: dict[str, tuple[set[str], set[str]]] = {}

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        keys = (set(measurements), set(metadata))
        assert seen.setdefault(name, keys) == keys, name  # always the same keys

    scriba_events = [name for name in telemetry.EVENTS if name.startswith("scriba.")]
    for name in scriba_events:
        telemetry.attach("catalog", name, record)
    failures = iter([FailureKind.TRANSIENT])
    source = MemorySource(replay_from_zero=True)
    for kind in ("E", "skip", "error", "raise", "E"):
        source.record("s", kind)
    target = MemoryTarget(fail=lambda call: next(failures, None))
    options: dict[str, Any] = {
        "batch_timeout": 0.002,
        "commit_backoff": (0.0,),
        "lag_interval": 0.01,
        "retry": RetryPolicy(2, (0.0,)),
    }
    try:
        async with Scriba() as runtime:
            await runtime.start(Everything, source=source, target=target, **options)
            await runtime.wait_until_caught_up(Everything)
            runtime.pause(Everything)
            runtime.resume(Everything)
            await asyncio.sleep(0.03)  # a lag tick or two
            source.fail_next_read(RuntimeError("the source broke"))  # a crash, a restart
            async with asyncio.timeout(5):
                while True:
                    if (await runtime.info(Everything)).restarts:
                        break
                    await asyncio.sleep(0.002)
            await runtime.stop(Everything)
            # Again: the replay is deduplicated; then a structural failure halts it.
            source.record("s", "E")
            target.fail = lambda call: FailureKind.STRUCTURAL if call.applied else None
            await runtime.start(Everything, source=source, target=target, **options)
            async with asyncio.timeout(5):
                while True:
                    if (await runtime.info(Everything)).status is Status.HALTED:
                        break
                    await asyncio.sleep(0.002)
    finally:
        telemetry.detach("catalog")
    catalog = documented()
    # The sources' standby is emitted by the eventsourcing and SQL-table sources.
    assert set(seen) == set(catalog) - {"scriba.source.standby"}
    for name, keys in seen.items():
        assert keys == catalog[name], name


class Slow(Projection):
    name = "catalog_slow"

    async def handle(self, event: Event, meta: Meta) -> Result:
        await asyncio.sleep(0.02)
        return Insert(ROWS, {"id": event.id})


@pytest.mark.asyncio
async def test_durations_are_seconds_under_duration_as_in_every_layer() -> None:
    # A handler call of 20 ms reports a duration of about 0.02 (seconds), not 20.
    durations: dict[str, list[float]] = {}

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        assert not any(key.startswith("duration_") for key in measurements), name
        durations.setdefault(name, []).append(measurements["duration"])

    event_stop, batch_stop = "scriba.projection.event.stop", "scriba.projection.batch.stop"
    for name in (event_stop, batch_stop):
        telemetry.attach("durations", name, record)
    source = MemorySource(replay_from_zero=True)
    source.record("s", "E")
    options: dict[str, Any] = {"batch_timeout": 0.002, "lag_interval": 0}
    try:
        async with Scriba() as runtime:
            await runtime.start(Slow, source=source, target=MemoryTarget(), **options)
            await runtime.wait_until_caught_up(Slow)
            await runtime.stop(Slow)
    finally:
        telemetry.detach("durations")
    assert [0.02 <= value < 5.0 for value in durations[event_stop]] == [True]
    # A batch's duration is its commit's (retries included), not its handlers'.
    assert [0.0 <= value < 5.0 for value in durations[batch_stop]] == [True]
