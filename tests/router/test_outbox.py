"""The built-in outbox on both databases: the route inserts once per key and commits
or rolls back with its transaction; the drain hands each row to its sink under the
row's key, backs off and dead-letters, shares the rows between worker processes
without sending one twice at once, and retries under the same key what a killed
worker left leased; a sink's answer routed back is a duplicate the second time;
BasicHTTP sends POST to a real server and report a failure back to the sender."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from tests.router.conftest import Clock, RouterDb
from tests.router.test_route import caller_transaction, end
from tests.router.test_table_options import uuid_database  # noqa: F401 - a fixture

from statifier import telemetry
from statifier.buckets import bucket_of, outbox_bucket
from statifier.callbacks import awaited
from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import DatabaseDown, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.repeats import Repeats
from statifier.router import (
    Binding,
    ConfigError,
    Create,
    Entry,
    InboundEvent,
    Router,
    RouterConfig,
    StaticResolver,
    ledger,
)
from statifier.router.basichttp_sends import BASICHTTP_QUEUE, FAILURE_PLAN_ID, basichttp_sink
from statifier.router.outbox import (
    Backoff,
    DeadLetter,
    DrainReport,
    OutboxDrain,
    OutboxMessage,
    OutboxRoute,
    OutboxRow,
)
from statifier.router.routes import IdempotencyKey
from statifier.sql import TableOptions

SCOPE = "depot_7"
WORKER = Path(__file__).with_name("outbox_worker.py")


def send_key(
    execution_id: str = "ex_1", macrostep: int = 1, send_id: str = "book"
) -> IdempotencyKey:
    return IdempotencyKey(
        execution_id,
        send_id=send_id,
        macrostep=macrostep,
        microstep=1,
        round=0,
        content_index=3,
        ordinal=0,
    )


async def leaves(router: Router, execution_id: str) -> list[str]:
    """The execution's active leaf states, read back from the database."""
    storage = router.storage
    record = await storage.fetch_execution(execution_id)
    state = storage.load(record, await storage.machine(record.content_hash))
    return sorted(state.leaf_configuration())


def only(rows: list[OutboxRow]) -> OutboxRow:
    assert len(rows) == 1, rows
    return rows[0]


# The route.


@pytest.mark.asyncio
async def test_the_route_inserts_once_per_key_and_commits_or_rolls_back_with_the_step(
    router_db: RouterDb,
) -> None:
    router = router_db.router([])
    route_ = OutboxRoute(router_db.adapter, clock=router_db.clock)
    reader = OutboxDrain(router.storage, {})
    event = Event("pickup.requested", data={"parcel_id": "p1"}, sendid="book")
    settings = {"queue": "pickups"}

    # A redriven step re-emits the send under the same key: one row.
    async with router.transaction() as unit:
        assert await route_.deliver(settings, event, send_key(), unit.tx) is None
        assert await route_.deliver(settings, event, send_key(), unit.tx) is None
    row = only(await reader.rows())
    assert (row.queue, row.key, row.attempts) == ("pickups", str(send_key()), 0)
    assert row.event == event
    assert row.next_attempt_at == row.inserted_at == router_db.clock.now
    assert row.payload["execution_id"] == "ex_1"  # the key's scope, at the executor seam
    assert row.payload["sendid"] == "book"
    assert (row.sent_at, row.dead_at, row.lease) == (None, None, None)

    # A delivery that rolls back takes its row with it.
    class RolledBackError(Exception):
        pass

    async def rolled_back() -> None:
        async with router.transaction() as unit:
            await route_.deliver(settings, event, send_key(macrostep=2), unit.tx)
            raise RolledBackError

    with pytest.raises(RolledBackError):
        await rolled_back()
    assert [r.key for r in await reader.rows()] == [str(send_key())]

    # A live session has no transaction: the route commits its own, once per key.
    live = send_key("session_9", macrostep=5)
    await route_.deliver(settings, event, live, None)
    await route_.deliver(settings, event, live, None)
    rows = await reader.rows()
    assert [r.key for r in rows] == [str(send_key()), str(live)]
    assert rows[1].payload["execution_id"] is None  # a session id names no execution

    # Another queue is another row under the same key.
    await route_.deliver({"queue": "other", "target": "carrier-a"}, event, live, None)
    assert only(await reader.rows(queue="other")).payload["target"] == "carrier-a"

    with pytest.raises(ConfigError, match="names its queue"):
        await route_.deliver({}, event, send_key(), None)


# The drain.


@pytest.mark.asyncio
async def test_the_sink_gets_the_row_key_and_a_sent_row_is_not_sent_again(
    router_db: RouterDb,
) -> None:
    router = router_db.router([])
    route_ = OutboxRoute(router_db.adapter, clock=router_db.clock)
    event = Event("pickup.requested", data={"parcel_id": "p1"}, sendid="book")
    await route_.hand_off(
        None, "pickups", send_key(), event, target="carrier", execution_id="ex_1", scope=SCOPE
    )
    await route_.hand_off(None, "unsinked", send_key(), event)
    seen: list[OutboxMessage] = []

    async def sink(message: OutboxMessage) -> None:
        seen.append(message)

    drain = OutboxDrain(router.storage, {"pickups": sink})
    report = await drain.drain_once()
    assert (report.claimed, report.sent, report.failed, report.dead) == (1, 1, 0, 0)
    assert seen == [
        OutboxMessage(
            "pickups",
            str(send_key()),
            event,
            target="carrier",
            execution_id="ex_1",
            scope=SCOPE,
            sendid="book",
            attempts=0,
            final=False,
        )
    ]
    sent = only(await drain.rows(state="sent"))
    assert (sent.sent_at, sent.lease, sent.leased_until) == (router_db.clock.now, None, None)
    assert (await drain.drain_once()).claimed == 0
    assert len(seen) == 1
    # A queue no sink drains stays pending.
    assert [r.queue for r in await drain.pending()] == ["unsinked"]


@pytest.mark.asyncio
async def test_drains_of_complementary_ranges_each_send_their_buckets_rows_once(
    router_db: RouterDb,
) -> None:
    # A row falls in its sending execution's bucket (a child with its root), in the
    # bucket a writer names, or outside any execution in its (queue, key)'s.
    router = router_db.router([])
    route_ = OutboxRoute(router_db.adapter, clock=router_db.clock)
    event = Event("pickup.requested", sendid="book")
    executions = [f"order-{n}" for n in range(12)] + ["order-3/payment"]
    for execution_id in executions:
        key = send_key(execution_id)
        await route_.hand_off(None, "pickups", key, event, execution_id=execution_id)
    await route_.hand_off(None, "pickups", "host-1", event)
    await route_.hand_off(None, "pickups", "named", event, execution_id="order-1", bucket=1000)
    with pytest.raises(ValueError, match="a bucket is from 0 to 1023"):
        await route_.hand_off(None, "pickups", "bad", event, bucket=1024)
    expected = {str(send_key(execution_id)): bucket_of(execution_id) for execution_id in executions}
    expected.update({"host-1": outbox_bucket("pickups", "host-1"), "named": 1000})
    assert len(set(expected.values()) & set(range(512))) > 1  # both halves have rows
    assert len(set(expected.values()) & set(range(512, 1024))) > 1

    seen: dict[str, list[str]] = {"low": [], "high": []}

    def sink(half: str) -> Any:
        async def sent(message: OutboxMessage) -> None:
            seen[half].append(message.key)

        return sent

    low = OutboxDrain(router.storage, {"pickups": sink("low")}, buckets=(0, 512), batch=100)
    high = OutboxDrain(router.storage, {"pickups": sink("high")}, buckets=(512, 1024), batch=100)
    await low.drain_once()
    assert sorted(seen["low"]) == sorted(k for k, b in expected.items() if b < 512)
    assert seen["high"] == []
    await high.drain_once()
    assert sorted(seen["high"]) == sorted(k for k, b in expected.items() if b >= 512)
    assert (await low.drain_once()).claimed == (await high.drain_once()).claimed == 0
    assert await low.pending() == []
    for wrong in ((5, 5), (-1, 3), (0, 1025)):
        with pytest.raises(ConfigError, match="buckets is a range"):
            OutboxDrain(router.storage, {"pickups": sink("low")}, buckets=wrong)


@pytest.mark.asyncio
async def test_a_failing_sink_backs_off_on_the_clock_then_is_dead_lettered_and_re_armed(
    router_db: RouterDb,
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    secret = "card 4111 1111 1111 1111"
    event = Event("charge", data={"card": secret})
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "charges", "charge/1", event)
    calls: list[tuple[int, bool]] = []
    healthy = False

    def sink(message: OutboxMessage) -> None:  # a plain function is a sink too
        calls.append((message.attempts, message.final))
        if not healthy:
            raise RuntimeError("the carrier is down")

    reports: list[tuple[dict[str, float], dict[str, Any]]] = []
    telemetry.attach(
        "outbox-test",
        "statifier.router.outbox",
        lambda name, counts, meta: reports.append((dict(counts), dict(meta))),
    )
    try:
        drain = OutboxDrain(
            router.storage,
            {"charges": sink},
            max_attempts=3,
            backoff=Backoff(base=timedelta(seconds=1), factor=2, cap=timedelta(seconds=3)),
        )
        assert (await drain.drain_once()).failed == 1
        row = only(await drain.pending())
        assert row.attempts == 1
        assert row.next_attempt_at == clock.now + timedelta(seconds=1)
        assert row.last_error == "RuntimeError: the carrier is down"
        assert row.lease is None
        assert (await drain.drain_once()).claimed == 0  # not due yet
        clock.advance(timedelta(seconds=1))
        assert (await drain.drain_once()).failed == 1
        assert only(await drain.pending()).next_attempt_at == clock.now + timedelta(seconds=2)
        clock.advance(timedelta(seconds=1))
        assert (await drain.drain_once()).claimed == 0
        clock.advance(timedelta(seconds=1))
        assert (await drain.drain_once()).dead == 1
        assert calls == [(0, False), (1, False), (2, True)]
        assert await drain.pending() == []
        dead = only(await drain.dead_letters())
        assert (dead.attempts, dead.dead_at) == (3, clock.now)
        clock.advance(timedelta(hours=1))
        assert (await drain.drain_once()).claimed == 0  # dead stays dead

        # An operator re-arms it once the carrier is back: a fresh round of attempts.
        healthy = True
        assert await drain.retry_dead("charge/1") == 1
        assert await drain.retry_dead("charge/1") == 0  # no longer dead
        assert only(await drain.pending()).attempts == 0
        assert (await drain.drain_once()).sent == 1
        assert calls[-1] == (0, False)
    finally:
        telemetry.detach("outbox-test")
    for counts, meta in reports:
        assert meta == {"queues": ("charges",)}
        assert secret not in repr(counts) + repr(meta)
    assert [(c["claimed"], c["sent"], c["failed"], c["dead"]) for c, _ in reports] == [
        (1, 0, 1, 0),
        (1, 0, 1, 0),
        (1, 0, 0, 1),
        (1, 1, 0, 0),
    ]
    for row in await drain.rows():
        assert secret not in (row.last_error or "")


@pytest.mark.asyncio
async def test_a_sink_whose_database_does_not_answer_is_tried_again_soon_and_not_counted(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    # A hop's sink routes into another store: while that store's server is stopped,
    # its attempts are no fault of the row. Counted and doubled, a long outage would
    # dead-letter it, and its delivery would wait minutes past the store's return.
    router = router_db.router([])
    clock = router_db.clock
    event = Event("ping")
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "hops", "hop/1", event)
    down = True

    def sink(message: OutboxMessage) -> None:
        if down:
            raise DatabaseDown("no connection within 5 s: the server does not answer")

    drain = OutboxDrain(
        router.storage,
        {"hops": sink},
        max_attempts=2,
        backoff=Backoff(base=timedelta(seconds=1), factor=2, cap=timedelta(seconds=60)),
    )
    with caplog.at_level(logging.WARNING, "statifier.router.outbox"):
        for _ in range(5):
            assert (await drain.drain_once()).failed == 1
            row = only(await drain.pending())
            assert row.attempts == 0
            assert row.next_attempt_at == clock.now + timedelta(seconds=1)
            assert row.last_error == (
                "DatabaseDown: no connection within 5 s: the server does not answer"
            )
            clock.advance(timedelta(seconds=1))
    assert "failed: a database did not answer (not counted among its 2 attempts)" in caplog.text
    assert await drain.dead_letters() == []
    down = False
    assert (await drain.drain_once()).sent == 1


@pytest.mark.asyncio
async def test_every_failed_attempt_and_the_dead_letter_warn_once_and_report(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    token = "https://sink.example/hook?token=s3cr3t"
    event = Event("charge", data={"to": token})
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(
        None, "charges", "charge/1", event, execution_id="ex_1"
    )

    def sink(message: OutboxMessage) -> None:
        raise RuntimeError(f"POST {token} answered 500")

    failures: list[dict[str, Any]] = []
    telemetry.attach(
        "outbox-failed-test",
        "statifier.router.outbox_failed",
        lambda name, counts, meta: failures.append({**counts, **meta}),
    )
    drain = OutboxDrain(
        router.storage,
        {"charges": sink},
        max_attempts=2,
        backoff=Backoff(base=timedelta(seconds=1)),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="statifier.router.outbox"):
            assert (await drain.drain_once()).failed == 1
            clock.advance(timedelta(seconds=1))
            assert (await drain.drain_once()).dead == 1
    finally:
        telemetry.detach("outbox-failed-test")
    lines = [r for r in caplog.records if r.name == "statifier.router.outbox"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    assert "failed (attempt 1 of 2)" in lines[0].getMessage()
    assert "dead-lettered after 2 attempts" in lines[1].getMessage()
    assert [
        (f["queue"], f["key"], f["execution_id"], f["attempt"], f["dead"], f["error"])
        for f in failures
    ] == [
        ("charges", "charge/1", "ex_1", 1, False, "RuntimeError"),
        ("charges", "charge/1", "ex_1", 2, True, "RuntimeError"),
    ]
    # What the sink was handed stays out of the log and the telemetry.
    assert "s3cr3t" not in " ".join(r.getMessage() for r in lines) + repr(failures)


@pytest.mark.asyncio
async def test_a_dead_letter_raised_by_the_sink_is_final_at_once(router_db: RouterDb) -> None:
    router = router_db.router([])
    route_ = OutboxRoute(router_db.adapter, clock=router_db.clock)
    await route_.hand_off(None, "q", "k/1", Event("e"))

    def sink(message: OutboxMessage) -> None:
        raise DeadLetter("no such carrier account")

    drain = OutboxDrain(router.storage, {"q": sink}, max_attempts=5)
    assert (await drain.drain_once()).dead == 1
    dead = only(await drain.dead_letters())
    assert (dead.attempts, dead.last_error) == (1, "DeadLetter: no such carrier account")
    assert await drain.retry_dead(row_id=dead.id) == 1  # by id as well as by key
    for neither_or_both in ({}, {"key": "k/1", "row_id": dead.id}):
        with pytest.raises(ValueError, match="exactly one"):
            await drain.retry_dead(**neither_or_both)


@pytest.mark.asyncio
async def test_a_row_whose_lease_passed_to_another_worker_keeps_that_workers_mark(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "q", "k/1", Event("e"))
    second = OutboxDrain(router.storage, {"q": lambda message: None}, lease=timedelta(seconds=5))
    later: list[Any] = []

    async def slow(message: OutboxMessage) -> None:
        # The sink outlives its lease: the other worker claims and sends the row.
        clock.advance(timedelta(seconds=10))
        later.append(await second.drain_once())

    first = OutboxDrain(router.storage, {"q": slow}, lease=timedelta(seconds=5))
    report = await first.drain_once()
    assert (report.claimed, report.sent, report.lost) == (1, 0, 1)
    assert (later[0].claimed, later[0].sent, later[0].reclaimed) == (1, 1, 1)
    assert only(await first.rows(state="sent")).attempts == 0
    said = [r for r in caplog.records if "its lease ran out" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]  # the first drain's, sent too late
    assert "k/1 of queue 'q'" in said[0].getMessage()


@pytest.mark.asyncio
async def test_run_drains_until_stopped(router_db: RouterDb) -> None:
    route_ = OutboxRoute(router_db.adapter)  # on the wall clock, as run's drain
    for n in range(5):
        await route_.hand_off(None, "q", f"k/{n}", Event("e", data={"n": n}))
    seen: list[str] = []
    everything = asyncio.Event()

    def sink(message: OutboxMessage) -> None:
        seen.append(message.key)
        if len(seen) == 5:
            everything.set()

    stop = asyncio.Event()
    drain = OutboxDrain(router_db.adapter, {"q": sink}, batch=2)
    worker = asyncio.create_task(drain.run(stop, idle=0.01))
    await asyncio.wait_for(everything.wait(), 10)
    stop.set()
    await asyncio.wait_for(worker, 10)
    assert sorted(seen) == [f"k/{n}" for n in range(5)]
    assert await drain.pending() == []


@pytest.mark.asyncio
async def test_run_says_while_its_passes_fail_and_logs_one_line_per_interval(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    drain = OutboxDrain(router_db.adapter, {})
    real = drain.drain_once
    passes: list[DrainReport] = []
    seen: list[str | None] = []  # the drain's failure as each pass begins
    failing = 4

    async def once(now: datetime | None = None) -> DrainReport:
        seen.append(drain.failure)
        if len(passes) < failing:
            passes.append(DrainReport())
            raise ConnectionError("the database went away")
        report = await real(now)
        passes.append(report)
        return report

    drain.drain_once = once  # type: ignore[method-assign]
    stop = asyncio.Event()
    worker = asyncio.create_task(drain.run(stop, idle=0.01))
    try:
        async with asyncio.timeout(10):
            while len(passes) < failing + 2:  # noqa: ASYNC110 - the passes come every 10 ms
                await asyncio.sleep(0.001)
    finally:
        stop.set()
        await asyncio.wait_for(worker, 10)
    failed = "ConnectionError"
    assert seen[: failing + 2] == [None, failed, failed, failed, failed, None]
    said = [r for r in caplog.records if "an outbox drain pass failed" in r.getMessage()]
    assert [r.levelname for r in said] == ["ERROR"]  # four failures, one line
    assert "ConnectionError: the database went away" in said[0].getMessage()


@pytest.mark.asyncio
async def test_a_sink_call_that_never_returns_is_ended_at_nine_tenths_of_the_lease(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    # The rows' leases are on the hand-moved clock, which stands still: they never run
    # out, so the bound (on the loop's clock) is what ends the hung call.
    router = router_db.router([])
    route_ = OutboxRoute(router_db.adapter, clock=router_db.clock)
    await route_.hand_off(None, "hung", "k/hung", Event("e"))
    await route_.hand_off(None, "other", "k/other", Event("e"))
    cancelled: list[str] = []

    async def hung(message: OutboxMessage) -> None:
        try:
            await asyncio.Event().wait()  # a peer that never answers
        except asyncio.CancelledError:
            cancelled.append(message.key)
            raise

    drain = OutboxDrain(
        router.storage,
        {"hung": hung, "other": lambda message: None},
        lease=timedelta(seconds=0.5),
    )
    with caplog.at_level(logging.WARNING, logger="statifier.router.outbox"):
        report = await asyncio.wait_for(drain.drain_once(), 10)
    assert (report.claimed, report.sent, report.failed, report.lost) == (2, 1, 1, 0)
    assert cancelled == ["k/hung"]
    row = only(await drain.pending())
    assert (row.key, row.attempts, row.lease) == ("k/hung", 1, None)
    assert row.last_error == (
        "TimeoutError: the sink call timed out after 0.45 s (nine tenths of the 0.5 s lease)"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "statifier.router.outbox"]
    next_at = (router_db.clock.now + timedelta(seconds=1)).isoformat()
    line = f"outbox row k/hung of queue 'hung' failed (attempt 1 of 8), tried again at {next_at}"
    assert said == [f"{line}: TimeoutError"]


@pytest.mark.asyncio
async def test_a_cancelled_error_the_drain_did_not_ask_for_is_a_failed_attempt(
    router_db: RouterDb,
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "q", "k/1", Event("e"))
    calls: list[int] = []

    async def sink(message: OutboxMessage) -> None:
        calls.append(message.attempts)
        if len(calls) == 1:
            shared = asyncio.get_running_loop().create_future()
            shared.cancel()  # a shared client's future, cancelled by someone else
            await shared

    drain = OutboxDrain(router.storage, {"q": sink})
    assert (await drain.drain_once()).failed == 1
    row = only(await drain.pending())
    assert (row.attempts, row.last_error, row.lease) == (1, "CancelledError", None)
    clock.advance(timedelta(seconds=1))
    assert (await drain.drain_once()).sent == 1
    assert calls == [0, 1]

    # A drain that is itself cancelled still stops, its row left leased.
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "q", "k/2", Event("e"))
    started = asyncio.Event()

    async def hung(message: OutboxMessage) -> None:
        started.set()
        await asyncio.Event().wait()

    hanging = OutboxDrain(router.storage, {"q": hung})
    task = asyncio.create_task(hanging.drain_once())
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = only(await drain.pending())
    assert (row.key, row.attempts, row.last_error) == ("k/2", 0, None)
    assert row.lease is not None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    # NUL: PostgreSQL's text refuses it; a lone surrogate: UTF-8 cannot encode it.
    "refused",
    ["\x00", "\ud800"],
    ids=["nul", "surrogate"],
)
async def test_a_sink_error_a_text_column_refuses_is_stored_replaced_and_counted(
    router_db: RouterDb, refused: str
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    await OutboxRoute(router_db.adapter, clock=clock).hand_off(None, "q", "k/1", Event("e"))
    calls: list[int] = []

    def sink(message: OutboxMessage) -> None:
        calls.append(message.attempts)
        raise ValueError(f"the receiver answered b'ok{refused}garbage'")

    drain = OutboxDrain(router.storage, {"q": sink}, max_attempts=2)
    assert (await drain.drain_once()).failed == 1
    row = only(await drain.pending())
    assert (row.attempts, row.lease) == (1, None)
    assert row.last_error == "ValueError: the receiver answered b'ok\ufffdgarbage'"
    clock.advance(timedelta(seconds=1))
    assert (await drain.drain_once()).dead == 1
    assert calls == [0, 1]
    assert only(await drain.dead_letters()).attempts == 2


@pytest.mark.asyncio
async def test_one_failing_receiver_writes_a_warning_per_kind_and_interval_with_the_count(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    router = router_db.router([])
    clock = router_db.clock
    route_ = OutboxRoute(router_db.adapter, clock=clock)
    async with router_db.adapter.transaction() as tx:
        for n in range(20):
            await route_.hand_off(tx, "q", f"k/{n:02d}", Event("e"))

    def down(message: OutboxMessage) -> None:
        raise ConnectionRefusedError("the receiver is down")

    failures: list[dict[str, Any]] = []
    telemetry.attach(
        "outbox-flood-test",
        "statifier.router.outbox_failed",
        lambda name, counts, meta: failures.append(dict(meta)),
    )
    drain = OutboxDrain(router.storage, {"q": down}, max_attempts=3, batch=20)
    seconds = [0.0]  # the drain's lines' interval runs on this clock
    drain._repeats = Repeats(interval=30.0, clock=lambda: seconds[0])
    try:
        with caplog.at_level(logging.WARNING, logger="statifier.router.outbox"):
            assert (await drain.drain_once()).failed == 20
            clock.advance(timedelta(seconds=1))
            seconds[0] = 31.0
            assert (await drain.drain_once()).failed == 20
            clock.advance(timedelta(seconds=2))
            assert (await drain.drain_once()).dead == 20
    finally:
        telemetry.detach("outbox-flood-test")
    said = [r.getMessage() for r in caplog.records if r.name == "statifier.router.outbox"]
    assert len(said) == 3, said
    assert "failed (attempt 1 of 3)" in said[0]
    assert "failed (attempt 2 of 3)" in said[1]
    assert said[1].endswith("ConnectionRefusedError (19 more like it in the last 31 s)")
    assert "was dead-lettered after 3 attempts: ConnectionRefusedError" in said[2]
    # Each row and attempt is still reported, and keeps its own last_error.
    assert len(failures) == 60
    assert sorted((f["key"], f["attempt"]) for f in failures) == sorted(
        (f"k/{n:02d}", attempt) for n in range(20) for attempt in (1, 2, 3)
    )
    dead = await drain.dead_letters()
    assert [row.last_error for row in dead] == ["ConnectionRefusedError: the receiver is down"] * 20


# Workers in processes of their own.


def _rows_of(n: int) -> list[tuple[str, Event]]:
    return [(f"job/{i:03d}", Event("job", data={"n": i})) for i in range(n)]


async def _fill(router_db: RouterDb, n: int) -> dict[int, str]:
    """``n`` rows in queue ``jobs``; answers each row's key by its ``n``."""
    route_ = OutboxRoute(router_db.adapter)  # the workers run on the wall clock
    async with router_db.adapter.transaction() as tx:
        for key, event in _rows_of(n):
            await route_.hand_off(tx, "jobs", key, event)
    return {i: key for i, (key, _) in enumerate(_rows_of(n))}


@dataclass
class _Worker:
    process: asyncio.subprocess.Process
    errors: list[str] = field(default_factory=list)


async def _start(router_db: RouterDb, record: Path, job: Mapping[str, Any]) -> _Worker:
    options = router_db.store.tables.options
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        router_db.store.url,
        options.prefix,
        options.schema or "-",
        str(record),
        json.dumps(job),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    ready = await asyncio.wait_for(process.stdout.readline(), 60)
    if ready.strip() != b"ready":
        _, err = await process.communicate()
        pytest.fail(f"the worker did not start: {err.decode()}")
    return _Worker(process)


async def _go_and_wait(*workers: _Worker) -> list[int | None]:
    for worker in workers:
        assert worker.process.stdin is not None
        worker.process.stdin.write(b"go\n")
        await worker.process.stdin.drain()
    statuses = []
    for worker in workers:
        _, err = await asyncio.wait_for(worker.process.communicate(), 120)
        statuses.append(worker.process.returncode)
        assert worker.process.returncode in (0, -signal.SIGKILL), err.decode()
    return statuses


def _calls(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def _assert_no_overlap(calls: list[dict[str, Any]]) -> None:
    """No row's sink calls overlap in time, whichever processes made them."""
    by_row: dict[int, list[tuple[float, float]]] = {}
    for call in calls:
        by_row.setdefault(call["n"], []).append((call["start"], call["end"]))
    for n, spans in by_row.items():
        spans.sort()
        for (_, ended), (started, _) in itertools.pairwise(spans):
            assert started >= ended, f"row {n} was being sent twice at once"


@pytest.mark.asyncio
async def test_two_worker_processes_share_the_rows_and_never_send_one_twice(
    router_db: RouterDb, tmp_path: Path
) -> None:
    keys = await _fill(router_db, 60)
    record = tmp_path / "calls.jsonl"
    job = {"batch": 3, "lease": 60, "pause": 0.005, "kill_after": 0}
    workers = [await _start(router_db, record, job) for _ in range(2)]
    assert await _go_and_wait(*workers) == [0, 0]

    calls = _calls(record)
    assert sorted(call["n"] for call in calls) == sorted(keys)  # each row exactly once
    assert all(call["key"] == keys[call["n"]] for call in calls)
    assert len({call["pid"] for call in calls}) == 2  # both workers drained
    _assert_no_overlap(calls)
    drain = OutboxDrain(router_db.adapter, {})
    assert await drain.pending() == []
    assert len(await drain.rows(state="sent")) == len(keys)


KILLS = 20
MAX_RUNS = 120


@pytest.mark.asyncio
async def test_a_worker_killed_between_the_sink_and_the_mark_is_retried_under_the_same_key(
    router_db: RouterDb, tmp_path: Path
) -> None:
    keys = await _fill(router_db, 40)
    record = tmp_path / "calls.jsonl"
    chooser = random.Random(20261201)
    kills = 0
    for _ in range(MAX_RUNS):
        kill_after = chooser.randint(1, 3) if kills < KILLS else 0
        job = {
            "batch": chooser.choice([1, 2, 4]),
            "lease": 0.3,
            "pause": chooser.uniform(0.0, 0.005),
            "kill_after": kill_after,
        }
        [status] = await _go_and_wait(await _start(router_db, record, job))
        if status == 0:
            break
        kills += 1
    assert kills >= KILLS

    drain = OutboxDrain(router_db.adapter, {})
    rows = await drain.rows()
    assert len(rows) == len(keys)
    assert all(row.sent_at is not None and row.attempts == 0 for row in rows)
    calls = _calls(record)
    assert {call["n"] for call in calls} == set(keys)
    # Repeats only under the row's own key, never at once; each kill left one repeat.
    assert all(call["key"] == keys[call["n"]] for call in calls)
    _assert_no_overlap(calls)
    assert len(calls) - len(keys) >= kills
    print(f"kills: {kills}, sink calls: {len(calls)} for {len(keys)} rows")


# A sink's answer, routed back in.

PARCEL = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="at_depot">
  <datamodel><data id="booking" expr="null"/><data id="answered" expr="0"/></datamodel>
  <state id="at_depot">
    <transition event="parcel.scanned" target="awaiting_pickup"/>
  </state>
  <state id="awaiting_pickup">
    <transition event="pickup.booked" target="booked">
      <assign location="booking" expr="_event.data.booking_id"/>
      <assign location="answered" expr="answered + 1"/>
    </transition>
  </state>
  <state id="booked"/>
</scxml>"""

PARCEL_BINDINGS = [
    Binding(
        id="scans_to_parcel",
        source="depot",
        match="event.kind == 'scan'",
        key="event.parcel_id",
        document="parcel",
        event="parcel.scanned",
    ),
    Binding(
        id="pickups_to_parcel",
        source="carrier",
        match="event.kind == 'pickup_booked'",
        key="event.parcel_id",
        document="parcel",
        event="pickup.booked",
        data=("booking_id", "send_id"),
        create=Create.NEVER,
    ),
]


@pytest.mark.asyncio
async def test_a_sinks_answer_routed_back_under_the_row_key_is_a_duplicate_the_second_time(
    router_db: RouterDb,
) -> None:
    router = router_db.router(
        PARCEL_BINDINGS, resolver=StaticResolver({"parcel": compile_chart(PARCEL)})
    )
    scan = InboundEvent(
        scope=SCOPE, source="depot", message_id="depot/1", data={"kind": "scan", "parcel_id": "p1"}
    )
    [created] = (await router.route(scan)).outcomes
    execution_id = getattr(created, "execution_id", None)
    assert isinstance(execution_id, str)
    await OutboxRoute(router_db.adapter, clock=router_db.clock).hand_off(
        None,
        "pickups",
        send_key(execution_id, send_id="book_pickup"),
        Event("pickup.requested", data={"parcel_id": "p1"}, sendid="book_pickup"),
        execution_id=execution_id,
        scope=SCOPE,
    )
    answers: list[str] = []

    async def carrier(message: OutboxMessage) -> None:
        data = message.event.data
        assert isinstance(data, dict)
        answer = InboundEvent(
            scope=SCOPE,
            source="carrier",
            message_id="pickup_booked/" + message.key,
            data={
                "kind": "pickup_booked",
                "parcel_id": data["parcel_id"],
                "send_id": message.sendid,
                "booking_id": "bk_1",
            },
        )
        routed = await router.route(answer)
        answers.append(routed.outcomes[-1].outcome)
        if len(answers) == 1:
            raise ConnectionError("the worker lost the carrier's acknowledgement")

    drain = OutboxDrain(router.storage, {"pickups": carrier})
    assert (await drain.drain_once()).failed == 1
    router_db.clock.advance(timedelta(seconds=1))
    assert (await drain.drain_once()).sent == 1
    assert answers == ["delivered", "duplicate"]
    assert await leaves(router, execution_id) == ["booked"]
    record = await router.storage.fetch_execution(execution_id)
    position = router.storage.load(record, await router.storage.machine(record.content_hash))
    assert position.datamodel["answered"] == 1


# BasicHTTP sends.


@dataclass
class _Server:
    url: str
    statuses: list[int] = field(default_factory=list)
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def http_server() -> Iterator[_Server]:
    """A real HTTP server on 127.0.0.1: it records every POST and answers the next of
    ``statuses`` (204 once they run out)."""
    server = _Server("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            server.requests.append((self.path, headers, body))
            status = server.statuses.pop(0) if server.statuses else 204
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its name
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


MANIFEST = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="loading">
  <state id="loading">
    <transition event="parcel.loaded" target="on_van"/>
  </state>
  <state id="on_van">
    <transition event="delivered" target="doorstep"/>
    <transition event="error.communication" cond="_event.sendid == 'manifest'"
                target="returned_to_depot"/>
  </state>
  <state id="returned_to_depot"/>
  <final id="doorstep"/>
</scxml>"""

VAN_BINDINGS = [
    Binding(
        id="loads_to_parcel",
        source="van",
        match="event.kind == 'loaded'",
        key="event.parcel_id",
        document="parcel_manifest",
        event="parcel.loaded",
    ),
    Binding(
        id="deliveries_to_parcel",
        source="van",
        match="event.kind == 'delivered'",
        key="event.parcel_id",
        document="parcel_manifest",
        event="delivered",
    ),
]


def _van_router(router_db: RouterDb) -> Router:
    return router_db.router(
        VAN_BINDINGS, resolver=StaticResolver({"parcel_manifest": compile_chart(MANIFEST)})
    )


async def _loaded(router: Router, parcel_id: str) -> str:
    """Route a parcel's loading: answers the execution it created."""
    event = InboundEvent(
        scope=SCOPE,
        source="van",
        message_id=f"van/{parcel_id}/loaded",
        data={"kind": "loaded", "parcel_id": parcel_id},
    )
    outcome = (await router.route(event)).outcomes[0]
    assert outcome.outcome == "created_and_delivered"
    execution_id = getattr(outcome, "execution_id", None)
    assert isinstance(execution_id, str)
    return execution_id


async def _manifest_row(router_db: RouterDb, server: _Server, execution_id: str) -> IdempotencyKey:
    key = send_key(execution_id, send_id="manifest")
    await OutboxRoute(router_db.adapter, clock=router_db.clock).hand_off(
        None,
        BASICHTTP_QUEUE,
        key,
        Event("parcel.loaded", data={"parcel_id": "p1", "stops": 3}, sendid="manifest"),
        target=f"{server.url}/manifests",
        execution_id=execution_id,
        scope=SCOPE,
    )
    return key


@pytest.mark.asyncio
async def test_a_basichttp_send_posts_the_event_with_the_row_key(
    router_db: RouterDb, http_server: _Server
) -> None:
    router = _van_router(router_db)
    key = await _manifest_row(router_db, http_server, "ex_1")
    drain = OutboxDrain(router.storage, {BASICHTTP_QUEUE: basichttp_sink(router)})
    assert (await drain.drain_once()).sent == 1
    [(path, headers, body)] = http_server.requests
    assert path == "/manifests"
    assert body == b"_scxmleventname=parcel.loaded&parcel_id=p1&stops=3"
    assert headers["content-type"] == "application/x-www-form-urlencoded"
    assert headers["idempotency-key"] == str(key)
    assert only(await drain.rows(state="sent")).key == str(key)


@pytest.mark.asyncio
async def test_a_failing_basichttp_send_is_retried_then_reported_to_the_sender(
    router_db: RouterDb, http_server: _Server
) -> None:
    router = _van_router(router_db)
    clock = router_db.clock
    execution_id = await _loaded(router, "p1")
    key = await _manifest_row(router_db, http_server, execution_id)
    http_server.statuses = [500, 503, 500, 500]
    async with httpx.AsyncClient() as client:
        sink = basichttp_sink(router, client=client, timeout=5)
        drain = OutboxDrain(router.storage, {BASICHTTP_QUEUE: sink}, max_attempts=3)
        assert (await drain.drain_once()).failed == 1
        assert only(await drain.pending()).last_error == (
            f"BasicHTTPFailed: BasicHTTP POST to {http_server.url}/manifests answered 500"
        )
        assert await leaves(router, execution_id) == ["on_van"]
        clock.advance(timedelta(seconds=1))
        assert (await drain.drain_once()).failed == 1
        clock.advance(timedelta(seconds=2))
        # The last attempt fails too: the failure goes back to the sender, settled.
        assert (await drain.drain_once()).sent == 1
        assert await leaves(router, execution_id) == ["returned_to_depot"]
        assert [h["idempotency-key"] for _, h, _ in http_server.requests] == [str(key)] * 3

        # A report retried (a worker lost after reporting) is a duplicate.
        row = only(await drain.rows())
        again = OutboxMessage(
            BASICHTTP_QUEUE,
            row.key,
            row.event,
            target=row.payload["target"],
            execution_id=execution_id,
            scope=SCOPE,
            sendid="manifest",
            attempts=2,
            final=True,
        )
        await awaited(sink(again))
    reports = [r for r in await ledger(router) if r.binding_id == FAILURE_PLAN_ID]
    assert [(r.outcome, r.message_id, r.execution_id) for r in reports] == [
        ("delivered", str(key), execution_id),
        ("duplicate", str(key), None),
    ]


@pytest.mark.asyncio
async def test_a_basichttp_failure_with_no_one_to_tell_is_dead_lettered(
    router_db: RouterDb, http_server: _Server
) -> None:
    router = _van_router(router_db)
    finished = await _loaded(router, "p2")
    delivered = InboundEvent(
        scope=SCOPE,
        source="van",
        message_id="van/p2/delivered",
        data={"kind": "delivered", "parcel_id": "p2"},
    )
    assert (await router.route(delivered)).outcomes[1].outcome == "delivered"
    await _manifest_row(router_db, http_server, "ex_never_addressed")
    await _manifest_row(router_db, http_server, finished)
    http_server.statuses = [500, 500]
    drain = OutboxDrain(router.storage, {BASICHTTP_QUEUE: basichttp_sink(router)}, max_attempts=1)
    assert (await drain.drain_once()).dead == 2
    errors = sorted(row.last_error or "" for row in await drain.dead_letters())
    assert "answered 500; no addressed execution 'ex_never_addressed' to tell" in errors[0]
    assert "answered 500; the execution is not there to tell (finished)" in errors[1]


# Table options.


@pytest.mark.asyncio
async def test_the_outbox_runs_on_uuid_keys_in_a_prefixed_schema(
    uuid_database: tuple[str, TableOptions],  # noqa: F811 - the imported fixture
) -> None:
    url, options = uuid_database
    clock = Clock()
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            Storage(adapter, clock=clock), bindings=[], resolver=StaticResolver({})
        )
        router = Router(config)
        route_ = OutboxRoute(adapter, clock=clock)
        async with router.transaction() as unit:
            await route_.deliver({"queue": "q"}, Event("e"), send_key(), unit.tx)
            await route_.deliver({"queue": "q"}, Event("e"), send_key(), unit.tx)

        def sink(message: OutboxMessage) -> None:
            raise DeadLetter("no")

        drain = OutboxDrain(router.storage, {"q": sink})
        assert (await drain.drain_once()).dead == 1
        dead = only(await drain.dead_letters())
        # A text key comes back as the text the database made.
        assert isinstance(dead.id, str if options.key_kind == "text" else sa.Uuid().python_type)
        assert await drain.retry_dead(row_id=dead.id) == 1
        assert only(await drain.pending()).id == dead.id


# End to end: a chart's sends, through the send handler, the outbox and the drain.

PICKUP = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="at_depot">
  <datamodel><data id="booking" expr="null"/></datamodel>
  <state id="at_depot">
    <transition event="parcel.scanned" target="awaiting_pickup">
      <send type="test:sink" target="pickups" id="book_pickup" event="pickup.requested">
        <param name="parcel_id" expr="_event.data.parcel_id"/>
      </send>
    </transition>
  </state>
  <state id="awaiting_pickup">
    <transition event="pickup.booked" target="booked">
      <assign location="booking" expr="_event.data.booking_id"/>
    </transition>
  </state>
  <state id="booked"/>
</scxml>"""


@pytest.mark.asyncio
async def test_a_charts_route_send_reaches_the_sink_after_the_commit_and_its_answer_comes_back(
    router_db: RouterDb,
) -> None:
    scans = replace(PARCEL_BINDINGS[0], data=("parcel_id",))
    router = router_db.router(
        [scans, PARCEL_BINDINGS[1]],
        resolver=StaticResolver({"parcel": compile_chart(PICKUP)}),
        send_type="test:sink",
        routes={
            "pickups": (OutboxRoute(router_db.adapter, clock=router_db.clock), {"queue": "pickups"})
        },
    )
    scan = InboundEvent(
        scope=SCOPE, source="depot", message_id="depot/9", data={"kind": "scan", "parcel_id": "p9"}
    )
    reader = OutboxDrain(router.storage, {})

    # The step that sent rolled back: so did its row, and nothing reaches the sink.
    async with caller_transaction(router) as connection:
        await router.route(scan, connection=connection)
        await end(connection, commit=False)
    assert await reader.rows() == []

    [created] = (await router.route(scan)).outcomes
    execution_id = getattr(created, "execution_id", None)
    assert isinstance(execution_id, str)
    row = only(await reader.pending())
    assert row.key.startswith(f"{execution_id}/book_pickup/")
    assert row.payload["execution_id"] == execution_id
    answers: list[str] = []

    async def carrier(message: OutboxMessage) -> None:
        data = message.event.data
        assert isinstance(data, dict)
        assert message.sendid == "book_pickup"
        answer = InboundEvent(
            scope=SCOPE,
            source="carrier",
            message_id="pickup_booked/" + message.key,
            data={
                "kind": "pickup_booked",
                "parcel_id": data["parcel_id"],
                "send_id": message.sendid,
                "booking_id": "bk_9",
            },
        )
        # The carrier's webhook may call twice.
        answers.append((await router.route(answer)).outcomes[-1].outcome)
        answers.append((await router.route(answer)).outcomes[-1].outcome)

    assert (await OutboxDrain(router.storage, {"pickups": carrier}).drain_once()).sent == 1
    assert answers == ["delivered", "duplicate"]
    assert await leaves(router, execution_id) == ["booked"]


@pytest.mark.asyncio
async def test_a_charts_basichttp_send_is_posted_and_its_failure_reaches_the_chart(
    router_db: RouterDb, http_server: _Server
) -> None:
    chart = MANIFEST.replace(
        '<state id="on_van">',
        '<state id="on_van"><onentry><send id="manifest" type="basichttp" '
        f'target="{http_server.url}/manifests" event="parcel.loaded"/></onentry>',
    )
    router = router_db.router(
        VAN_BINDINGS, resolver=StaticResolver({"parcel_manifest": compile_chart(chart)})
    )
    execution_id = await _loaded(router, "p3")
    row = only(await OutboxDrain(router.storage, {}).pending(BASICHTTP_QUEUE))
    assert row.payload["sendid"] == "manifest"
    assert row.payload["scope"] == SCOPE
    http_server.statuses = [500, 500]
    drain = OutboxDrain(router.storage, {BASICHTTP_QUEUE: basichttp_sink(router)}, max_attempts=2)
    # The send handler stamps rows on the wall clock: drain after it, whatever the
    # test's clock says.
    later = max(datetime.now(UTC), router_db.clock.now) + timedelta(seconds=1)
    assert (await drain.drain_once(now=later)).failed == 1
    assert (await drain.drain_once(now=later + timedelta(seconds=2))).sent == 1
    assert [path for path, _, _ in http_server.requests] == ["/manifests"] * 2
    assert await leaves(router, execution_id) == ["returned_to_depot"]
    [report] = [r for r in await ledger(router) if r.binding_id == FAILURE_PLAN_ID]
    assert (report.outcome, report.message_id) == ("delivered", row.key)


@pytest.mark.asyncio
async def test_the_failure_report_is_wrapped_and_begun_under_the_outbox_entry(
    router_db: RouterDb, http_server: _Server
) -> None:
    """The one step the drain drives, the failure report, runs under ``around_delivery``
    and ``on_begin`` with ``Entry.OUTBOX`` and the sender's scope; the sink's POSTs run
    under neither."""
    calls: list[tuple[str, str, str]] = []

    async def around(scope: str, entry: Entry, work: Any) -> Any:
        calls.append(("around", scope, entry.value))
        return await work()

    async def on_begin(tx: Any, scope: str, entry: Entry) -> None:
        calls.append(("begin", scope, entry.value))

    router = router_db.router(
        VAN_BINDINGS,
        resolver=StaticResolver({"parcel_manifest": compile_chart(MANIFEST)}),
        around_delivery=around,
        on_begin=on_begin,
    )
    execution_id = await _loaded(router, "p4")
    await _manifest_row(router_db, http_server, execution_id)
    calls.clear()
    http_server.statuses = [500]
    drain = OutboxDrain(router.storage, {BASICHTTP_QUEUE: basichttp_sink(router)}, max_attempts=1)
    assert (await drain.drain_once()).sent == 1
    assert calls == [("around", SCOPE, "outbox"), ("begin", SCOPE, "outbox")]
    assert await leaves(router, execution_id) == ["returned_to_depot"]
