"""The pipeline: dedup, retry, batching, failure responses, watermark and acknowledgement."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa

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
from scriba.memory import BatchCall
from scriba.operations import Execute
from scriba.target import FailureKind
from statifier import telemetry

ROWS = sa.Table(
    "rows",
    sa.MetaData(),
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("stream", sa.Text),
    sa.Column("position", sa.Integer),
)
FAST = {"batch_timeout": 0.005, "commit_backoff": (0.001,), "lag_interval": 0}


class Rows(Projection):
    """One row per event, keyed by event id; events of type "skip" are skipped."""

    name = "rows"

    def handle(self, event: Event, meta: Meta) -> Result:
        if event.type == "skip":
            return Skip()
        return Insert(ROWS, {"id": event.id, "stream": event.stream_id, "position": event.position})


@contextmanager
def recording(*names: str) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        seen.append((name, {**measurements, **metadata}))

    for name in names or tuple(n for n in telemetry.EVENTS if n.startswith("scriba.")):
        telemetry.attach("test-pipeline", name, record)
    try:
        yield seen
    finally:
        telemetry.detach("test-pipeline")


def fill(source: MemorySource, count: int, streams: int = 5, kind: str = "Happened") -> None:
    for index in range(count):
        source.record(f"s{index % streams}", kind, {"n": index})


async def project(
    projection: type[Projection],
    source: MemorySource,
    target: MemoryTarget,
    **overrides: Any,
) -> Scriba:
    runtime = Scriba()
    await runtime.start(projection, source=source, target=target, **{**FAST, **overrides})
    async with asyncio.timeout(10):
        await runtime.wait_until_caught_up(projection)
    return runtime


async def reaches(runtime: Scriba, projection: type[Projection], status: Status) -> None:
    async with asyncio.timeout(5):
        while True:
            if (await runtime.info(projection)).status is status:
                return
            await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_every_event_is_applied_once_and_the_watermark_reaches_the_end() -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 50)
    runtime = await project(Rows, source, target, parallelism=4, batch_size=7)
    info = await runtime.info(Rows)
    await runtime.close()
    assert sorted(row["position"] for row in target.rows(ROWS)) == list(range(1, 51))
    assert info.watermark == 50
    assert source.acknowledged == 50
    assert target.cursors(Rows.key()) == {f"s{i}": 46 + i for i in range(5)}
    assert info.stream_positions == target.cursors(Rows.key())
    assert info.lag == 0.0


@pytest.mark.asyncio
async def test_a_source_that_replays_from_zero_changes_nothing_the_second_time() -> None:
    source, target = MemorySource(replay_from_zero=True), MemoryTarget()
    fill(source, 20)
    runtime = await project(Rows, source, target)
    await runtime.stop(Rows)
    calls = target.calls
    with recording("scriba.projection.event.skipped", "scriba.projection.event.start") as seen:
        await runtime.start(Rows, source=source, target=target, **FAST)
        async with asyncio.timeout(5):
            await runtime.wait_until_caught_up(Rows)
        await runtime.close()
    assert len(target.rows(ROWS)) == 20
    assert len(target.commit_log) == 20
    assert [data["reason"] for _, data in seen] == ["dedup"] * 20  # no handler call at all
    assert target.calls == calls  # nothing to commit


@pytest.mark.asyncio
async def test_redelivery_while_running_is_deduplicated() -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 10)
    runtime = await project(Rows, source, target)
    source.rewind()
    await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        await runtime.wait_until_caught_up(Rows)
    await runtime.close()
    assert len(target.commit_log) == 10


@pytest.mark.asyncio
async def test_a_cursor_beyond_the_preload_is_read_once_from_the_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 6, streams=3)
    runtime = await project(Rows, source, target)
    await runtime.stop(Rows)
    asked: list[str] = []
    original = target.stream_position

    async def counting(projection: Any, stream_id: str) -> int | None:
        asked.append(stream_id)
        return await original(projection, stream_id)

    target.stream_position = counting  # type: ignore[method-assign]
    monkeypatch.setattr("scriba.pipeline.PRELOAD_LIMIT", 1)
    with recording("scriba.projection.cache_initialized") as seen:
        # start_from=0 reads past the watermark, so the cursors have to do the dedup.
        await runtime.start(Rows, source=source, target=target, start_from=0, **FAST)
        async with asyncio.timeout(5):
            await runtime.wait_until_caught_up(Rows)
        await runtime.close()
    assert len(asked) == 2
    assert len(set(asked)) == 2
    assert len(target.commit_log) == 6
    assert [(data["rows"], data["complete"]) for _, data in seen] == [(1, False)]


class Flaky(Projection):
    """Fails the first ``failures[event.id]`` calls for an event."""

    name = "flaky"
    failures: ClassVar[dict[str, int]] = {}
    calls: ClassVar[list[tuple[str, int]]] = []

    def handle(self, event: Event, meta: Meta) -> Result:
        self.calls.append((event.id, meta.attempt))
        if self.failures.get(event.id, 0) >= meta.attempt:
            if event.type == "raise":
                raise RuntimeError(f"boom {event.id}")
            return Error(f"no {event.id}")
        return Insert(ROWS, {"id": event.id, "stream": event.stream_id})


@pytest.mark.asyncio
async def test_retries_then_dead_letters_with_the_cause_as_kind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = MemorySource(), MemoryTarget()
    ok = source.record("a", "Happened")
    twice = source.record("a", "Happened")
    never = source.record("b", "Happened")
    raising = source.record("c", "raise")
    Flaky.failures = {twice.id: 2, never.id: 9, raising.id: 9}
    Flaky.calls = []
    retry = RetryPolicy(max_attempts=3, backoff=(0.001, 0.001))
    with recording("scriba.projection.dead_letter", "scriba.projection.event.exception") as seen:
        runtime = await project(Flaky, source, target, retry=retry, parallelism=3)
        stats = await runtime.dead_letter_stats(Flaky)
        letters = await runtime.dead_letters(Flaky, limit=5)
        await runtime.close()
    assert sorted(row["id"] for row in target.rows(ROWS)) == [ok.id, twice.id]
    assert [attempt for event_id, attempt in Flaky.calls if event_id == twice.id] == [1, 2, 3]
    assert stats.total == 2
    assert dict(stats.by_kind) == {"error": 1, "exception": 1}
    by_position = {letter.position: letter for letter in letters}
    assert by_position[never.position].error_message == f"no {never.id}"
    assert "RuntimeError: boom" in (by_position[raising.position].error_message or "")
    assert "Traceback" in (by_position[raising.position].error_stacktrace or "")
    assert [name for name, _ in seen].count("scriba.projection.event.exception") == 3
    assert [data["error_kind"] for name, data in seen if name.endswith("dead_letter")].count(
        "error"
    ) == 1
    # Dead-lettered events are accounted for: the cursor moved past them.
    assert target.cursors(Flaky.key())["b"] == never.position
    # Each kind is logged (throttled), naming the event's place, never its message.
    said = sorted(r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage())
    assert said == [
        f"projection flaky v1: event {kind} at position {event.position} was dead-lettered ({why})"
        for kind, event, why in (("Happened", never, "error"), ("raise", raising, "exception"))
    ]
    assert not [r for r in caplog.records if "boom" in r.getMessage()]


@pytest.mark.asyncio
async def test_no_retry_means_one_attempt() -> None:
    source, target = MemorySource(), MemoryTarget()
    bad = source.record("a", "Happened")
    Flaky.failures, Flaky.calls = {bad.id: 1}, []
    runtime = await project(Flaky, source, target, retry=None)
    await runtime.close()
    assert Flaky.calls == [(bad.id, 1)]
    assert target.rows(ROWS) == []


@pytest.mark.asyncio
async def test_a_retry_sleep_blocks_only_its_partition() -> None:
    source, target = MemorySource(), MemoryTarget()
    slow = source.record("slow", "Happened")
    for index in range(20):
        source.record(f"fast{index}", "Happened")
    Flaky.failures, Flaky.calls = {slow.id: 1}, []
    retry = RetryPolicy(max_attempts=2, backoff=(0.5,))
    runtime = Scriba()
    await runtime.start(Flaky, source=source, target=target, retry=retry, parallelism=4, **FAST)
    await asyncio.sleep(0.2)
    committed = {event_id for event_id, _ in Flaky.calls}
    info = await runtime.info(Flaky)
    await runtime.close()
    # Partitions other than the sleeping one went on and committed.
    others = [row for row in target.rows(ROWS) if row["stream"] != "slow"]
    assert len(committed) > 1
    assert others
    assert info.safe_position == 0  # the sleeping event holds the prefix back


class Rejected(Projection):
    name = "rejected"

    def handle(self, event: Event, meta: Meta) -> Any:
        if event.type == "sql":
            return Execute(sa.text("select 1"))
        if event.type == "junk":
            return 42
        return Insert(ROWS, {"id": event.id})


@pytest.mark.asyncio
async def test_results_the_target_does_not_accept_are_dead_lettered_as_rejected() -> None:
    source, target = MemorySource(), MemoryTarget()
    source.record("a", "sql")
    source.record("a", "junk")
    source.record("a", "fine")
    runtime = await project(Rejected, source, target)
    stats = await runtime.dead_letter_stats(Rejected)
    await runtime.close()
    assert dict(stats.by_kind) == {"rejected": 2}
    assert len(target.rows(ROWS)) == 1


def failing(kind: FailureKind, when: Callable[[BatchCall], bool]) -> Callable[[BatchCall], Any]:
    def decide(call: BatchCall) -> FailureKind | None:
        return kind if when(call) else None

    return decide


@pytest.mark.asyncio
async def test_a_transient_failure_replays_the_batch_and_acknowledges_nothing_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 10, streams=1)
    failures = iter(range(3))

    def three_times(call: BatchCall) -> FailureKind | None:
        return FailureKind.TRANSIENT if next(failures, None) is not None else None

    target.fail = three_times
    timeline: list[str] = []
    acknowledge = source.acknowledge

    async def acknowledging(position: int) -> None:
        # What the target had been asked, and had committed, when this came.
        timeline.append(f"ack {position} after {target.calls} calls, {len(target.batches)} commits")
        await acknowledge(position)

    source.acknowledge = acknowledging  # type: ignore[method-assign]
    with recording("scriba.source.batch.failed") as seen:
        runtime = await project(Rows, source, target, batch_size=100, batch_timeout=0.02)
        await runtime.close()
    assert len(seen) == 3
    assert {data["kind"] for _, data in seen} == {"transient"}
    assert [(data["first_position"], data["last_position"]) for _, data in seen] == [(1, 10)] * 3
    # Logged too, once for the three (one cause, one interval).
    said = [r for r in caplog.records if "could not be committed" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert "a batch of 10 events could not be committed (transient)" in said[0].getMessage()
    assert len(target.commit_log) == 10
    # One batch, failed three times, then committed; acknowledged once, only after that.
    assert [len(batch.applied) for batch in target.batches] == [10]
    assert timeline == ["ack 10 after 4 calls, 1 commits"]


class HeldAtAGap(MemorySource):
    """A log whose events from position ``gap`` on are held back while ``gap_open``, as
    a SQL source holds them behind a position an uncommitted writer took."""

    gap = 4
    gap_open = True
    delivered = 0

    @property
    def blocked(self) -> bool:
        return self.gap_open and any(e.position >= self.gap for e in self.events)

    async def read(self, limit: int) -> list[Event]:
        held = self.gap if self.gap_open else None
        chunk = [
            event
            for event in self.events
            if event.position > self.delivered and (held is None or event.position < held)
        ][:limit]
        if not chunk:
            await asyncio.sleep(0.01)
            return []
        self.delivered = chunk[-1].position
        return chunk


@pytest.mark.asyncio
async def test_a_source_blocked_at_a_gap_is_not_caught_up_until_the_gap_closes() -> None:
    """Reads come back empty while a writer holds a position: the projection says it is
    behind (lag in events, no caught-up wait), not caught up with a lag of 0."""
    source, target = HeldAtAGap(), MemoryTarget()
    fill(source, 6, streams=1)
    runtime = Scriba()
    await runtime.start(Rows, source=source, target=target, **FAST)
    try:
        async with asyncio.timeout(10):
            while True:
                if len(target.rows(ROWS)) == 3:  # positions 1 to 3, before the gap
                    break
                await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await runtime.wait_until_caught_up(Rows)
        info = await runtime.info(Rows)
        assert info.lag_events == 3  # positions 4 to 6, held back
        source.gap_open = False
        async with asyncio.timeout(10):
            await runtime.wait_until_caught_up(Rows)
        assert len(target.rows(ROWS)) == 6
        assert (await runtime.info(Rows)).lag_events == 0
    finally:
        await runtime.close()


@pytest.mark.asyncio
async def test_a_stop_with_a_batch_its_database_refuses_says_what_it_leaves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 5, streams=1)
    target.fail = failing(FailureKind.TRANSIENT, lambda call: True)  # the database is down
    runtime = Scriba()
    await runtime.start(Rows, source=source, target=target, **{**FAST, "commit_backoff": (5.0,)})
    async with asyncio.timeout(10):
        while True:
            if target.calls:
                break
            await asyncio.sleep(0.005)
    await runtime.stop(Rows)
    await runtime.close()
    assert target.batches == []
    said = [r for r in caplog.records if "stopped with a batch" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert "a batch of 5 events not committed (" in said[0].getMessage()
    assert "read again at the next start" in said[0].getMessage()


class FailingClose(MemorySource):
    async def close(self) -> None:
        raise RuntimeError("the connection broke as it closed")


@pytest.mark.asyncio
async def test_a_pipeline_that_fails_as_it_stops_is_logged_not_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = FailingClose(), MemoryTarget()
    fill(source, 3, streams=1)
    runtime = await project(Rows, source, target)
    await runtime.stop(Rows)
    assert (await runtime.info(Rows)).restarts == 0
    await runtime.close()
    said = [r for r in caplog.records if "ended with an error while stopping" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert said[0].exc_info is not None
    assert "the connection broke as it closed" in str(said[0].exc_info[1])


@pytest.mark.asyncio
async def test_info_truncates_the_stream_positions_above_a_thousand_streams() -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 1_000, streams=1_000)
    runtime = await project(Rows, source, target, batch_size=500)
    at_limit = await runtime.info(Rows)
    source.record("one-more", "Happened")
    async with asyncio.timeout(10):
        await runtime.wait_until_caught_up(Rows)
    above = await runtime.info(Rows)
    await runtime.close()
    assert isinstance(at_limit.stream_positions, dict)
    assert len(at_limit.stream_positions) == 1_000
    assert above.stream_positions == "truncated"
    assert above.safe_position == 1_001  # the rest of the info is still there


@pytest.mark.asyncio
async def test_an_integrity_failure_isolates_and_dead_letters_only_the_offender() -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 10, streams=2)
    poison = 4
    target.fail = failing(
        FailureKind.INTEGRITY, lambda call: any(e.position == poison for e, _ in call.applied)
    )
    runtime = await project(Rows, source, target, batch_size=100, batch_timeout=0.02)
    info = await runtime.info(Rows)
    letters = await runtime.dead_letters(Rows)
    await runtime.close()
    assert info.status is Status.RUNNING
    assert sorted(position for _, position in target.commit_log) == [
        p for p in range(1, 11) if p != poison
    ]
    assert [(letter.position, letter.error_kind) for letter in letters] == [(poison, "integrity")]
    assert info.watermark == 10


@pytest.mark.asyncio
async def test_a_batch_whose_every_write_fails_on_integrity_halts_at_once() -> None:
    source, target = MemorySource(), MemoryTarget()
    fill(source, 5, streams=1)
    target.fail = failing(FailureKind.INTEGRITY, lambda call: bool(call.applied))
    with recording("scriba.projection.halted") as seen:
        runtime = Scriba()
        await runtime.start(Rows, source=source, target=target, **FAST, batch_size=100)
        await reaches(runtime, Rows, Status.HALTED)
        info = await runtime.info(Rows)
        stats = await runtime.dead_letter_stats(Rows)
        await runtime.close()
    assert stats.total == 0
    assert target.rows(ROWS) == []
    assert info.halt_reason is not None
    assert "integrity" in info.halt_reason
    assert [data["kind"] for _, data in seen] == ["integrity"]
    assert source.acknowledged == 0


class Held(Projection):
    """Rows, except that event 4 waits in its handler until released."""

    name = "held"
    release: ClassVar[asyncio.Event]

    async def handle(self, event: Event, meta: Meta) -> Result:
        if event.position == 4:
            await self.release.wait()
        return Insert(ROWS, {"id": event.id, "stream": event.stream_id, "position": event.position})


@pytest.mark.asyncio
async def test_the_watermark_moves_on_a_timer_while_a_handler_is_held() -> None:
    # One stream, one partition, a read-ahead of two: the reader waits for room behind
    # the held event, and the watermark must still be stored about once a second.
    Held.release = asyncio.Event()
    source, target = MemorySource(), MemoryTarget()
    for _ in range(8):
        source.record("s", "Happened")
    runtime = Scriba()
    await runtime.start(Held, source=source, target=target, **{**FAST, "batch_size": 1})
    try:
        async with asyncio.timeout(5):
            while True:
                stored = await target.watermark(Held.key())
                if stored is not None and stored.position >= 3:
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.2)  # another interval: still never past the held event
        stored = await target.watermark(Held.key())
        assert stored is not None
        assert stored.position == 3
    finally:
        Held.release.set()
        await runtime.close()
