"""Supervision of the service's parts: the restart backoff goes back to its first wait
after a healthy run, failures of one kind are logged once per interval, readiness says
a part is restarting, a part whose store was down starts again as soon as the store
answers (one whose store answers waits out its backoff), a store's answer is asked of
a real PostgreSQL server stopped and started again, and every restart of a consumer
keeps its process's lease owner."""

from __future__ import annotations

import asyncio
import io
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from tests.service.helpers import HITS, HITS_BINDING, write_config
from tests.service.own_postgres import OwnPostgres, own_postgres  # noqa: F401 - the fixture

from statifier.fronts.table_source import TableSource, append_events
from statifier.persistence import DatabaseDown
from statifier.persistence.sql import SqlAdapter
from statifier.router import Failed, InboundEvent, Router
from statifier.service import load
from statifier.service.consumers import (
    FIRST_RESTART,
    HEALTHY_RUN,
    LAST_RESTART,
    Restarts,
    SupervisedConsumer,
    build_source,
    process_owner,
)
from statifier.service.health import ANSWER_WITHIN, answers
from statifier.service.service import Service, Supervised
from statifier.service.wiring import router_config
from statifier.sql import migrations


def test_the_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run() -> None:
    restarts = Restarts()
    waits = [restarts.after(ran=1.0) for _ in range(8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert (waits[0], waits[-1]) == (FIRST_RESTART, LAST_RESTART)
    assert restarts.after(ran=HEALTHY_RUN - 1) == LAST_RESTART
    assert restarts.after(ran=HEALTHY_RUN) == FIRST_RESTART
    assert restarts.after(ran=0.0) == 2.0
    shorter = Restarts(0.25)
    assert [shorter.after(ran=1.0) for _ in range(3)] == [0.25, 0.5, 1.0]
    assert shorter.after(ran=HEALTHY_RUN) == 0.25


@pytest.mark.asyncio
async def test_a_running_part_that_outlives_its_failures_says_so_through_its_watch() -> None:
    stop = asyncio.Event()
    said: list[str | None] = [None]

    async def work() -> None:
        await stop.wait()

    worker = Supervised("outbox", work, stop, watch=lambda: said[0])
    worker.start()
    try:
        assert worker.trouble() is None
        said[0] = "passes failing: ConnectionError"
        assert worker.trouble() == "passes failing: ConnectionError"
        said[0] = None
        assert worker.trouble() is None
    finally:
        stop.set()
        assert worker.task is not None
        await worker.task
    assert worker.trouble() == "not running"


@pytest.mark.asyncio
async def test_a_failing_worker_restarts_says_so_and_logs_one_line_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    runs: list[float] = []

    async def work() -> None:
        runs.append(asyncio.get_running_loop().time())
        raise ConnectionError("the database went away")

    first = 0.2
    worker = Supervised("timers", work, stop, first_restart=first)
    worker.start()
    try:
        async with asyncio.timeout(20):
            while len(runs) < 3:  # noqa: ASYNC110 - failed at once, after 0.2 s, after 0.4 s more
                await asyncio.sleep(0.01)
        assert worker.trouble() == "restarting after ConnectionError"
    finally:
        stop.set()
        assert worker.task is not None
        await worker.task
    assert runs[1] - runs[0] >= first * 0.9
    assert runs[2] - runs[1] >= 2 * first * 0.9
    failed = [r for r in caplog.records if r.getMessage().startswith("timers failed")]
    assert len(failed) == 1  # three failures of one kind within the interval
    assert [vars(failed[0])[k] for k in ("part", "error", "restart_in")] == [
        "timers",
        "ConnectionError",
        first,
    ]
    assert failed[0].exc_info is not None
    assert worker.trouble() == "not running"


@pytest.mark.asyncio
async def test_a_worker_whose_store_answers_again_starts_at_once_not_at_the_end_of_its_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    up = asyncio.Event()
    runs: list[float] = []
    asked: list[bool] = []

    async def work() -> None:
        runs.append(time.monotonic())
        if not up.is_set():
            raise ConnectionError("the database went away")
        await stop.wait()

    async def answers() -> bool:
        asked.append(up.is_set())
        return up.is_set()

    wait = 20.0  # a backoff doubled through an outage
    worker = Supervised("timers", work, stop, first_restart=wait, answers=answers)
    worker.start()
    try:
        async with asyncio.timeout(10):
            while len(asked) < 2:  # noqa: ASYNC110 - asked every ASK_EVERY while waiting
                await asyncio.sleep(0.01)
            up.set()
            while len(runs) < 2 or worker.trouble() is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        assert worker.task is not None
        await worker.task
    # Started again at the first question answered after it was seen down, a second
    # or so after it answered, far before its wait of 20 s ran out.
    assert asked[:2] == [False, False]
    assert asked[-1] is True
    assert runs[1] - runs[0] < wait / 2
    assert "timers: its store answers again: starting it now" in caplog.text


@pytest.mark.asyncio
async def test_a_worker_that_fails_with_its_store_answering_waits_out_its_backoff() -> None:
    # A failure of its own (a bug), not the store's: restarting it at the first
    # question would make a loop of failures.
    stop = asyncio.Event()
    runs: list[float] = []
    asked: list[bool] = []

    async def work() -> None:
        runs.append(time.monotonic())
        raise ValueError("a bug")

    async def answers() -> bool:
        asked.append(True)
        return True

    worker = Supervised("timers", work, stop, first_restart=2.5, answers=answers)
    worker.start()
    try:
        async with asyncio.timeout(20):
            while len(runs) < 2:  # noqa: ASYNC110 - after its whole first wait
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        assert worker.task is not None
        await worker.task
    assert len(asked) >= 2  # asked, and answered, and still it waited
    assert runs[1] - runs[0] >= 2.5 * 0.9


@pytest.mark.asyncio
async def test_a_store_answers_until_its_server_stops_and_again_once_it_starts(
    own_postgres: OwnPostgres,  # noqa: F811 - the fixture
) -> None:
    async with SqlAdapter(own_postgres.url) as adapter:
        assert await answers(adapter) is True
        await asyncio.to_thread(own_postgres.stop)
        began = time.monotonic()
        assert await answers(adapter) is False
        assert time.monotonic() - began < ANSWER_WITHIN + 1.0  # bounded, never hangs
        # What a worker's transaction raises meanwhile: logged without a traceback.
        with pytest.raises(DatabaseDown):
            async with adapter.transaction():
                pass
        await asyncio.to_thread(own_postgres.start)
        async with asyncio.timeout(30):
            while not await answers(adapter):  # noqa: ASYNC110 - the pool reconnects
                await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_a_worker_whose_database_does_not_answer_says_why_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A DatabaseDown's message says it all: the same traceback from every worker of
    # a store, for the length of an outage, would bury the lines that matter.
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    runs: list[int] = []

    async def work() -> None:
        runs.append(1)
        raise DatabaseDown("no connection within 5 s: the server does not answer")

    worker = Supervised("timers (store 1)", work, stop, first_restart=0.05)
    worker.start()
    try:
        async with asyncio.timeout(20):
            while len(runs) < 2:  # noqa: ASYNC110 - failed twice
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        if worker.task is not None:
            await asyncio.wait({worker.task})
    said = [r for r in caplog.records if r.name == "statifier.service"]
    assert said[0].getMessage() == (
        "timers (store 1) failed (DatabaseDown: no connection within 5 s: the server does "
        "not answer); starting it again in 0 s"
    )
    assert said[0].exc_info is None


async def _runs_twice(worker: Supervised, runs: list[int]) -> None:
    """Start ``worker`` and wait until its work ran a second time and the worker says
    no trouble (restarted), or its task ended."""
    worker.start()
    assert worker.task is not None
    async with asyncio.timeout(20):
        while not worker.task.done() and (len(runs) < 2 or worker.trouble() is not None):  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_a_worker_ended_by_a_cancellation_it_did_not_ask_for_is_logged_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    runs: list[int] = []

    async def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            # A future someone else cancelled (a shared client's flush, say).
            shared = asyncio.get_running_loop().create_future()
            shared.cancel()
            await shared
        await stop.wait()

    worker = Supervised("outbox", work, stop, first_restart=0.05)
    try:
        await _runs_twice(worker, runs)
        assert worker.task is not None
        assert not worker.task.done(), "the worker's task ended"
        assert len(runs) == 2
    finally:
        stop.set()
        if worker.task is not None:
            await asyncio.wait({worker.task})
    assert not worker.task.cancelled()
    said = [r for r in caplog.records if r.name == "statifier.service"]
    assert [r.getMessage() for r in said] == [
        "outbox was cancelled, though the service is not stopping; starting it again in 0 s"
    ]
    assert said[0].levelno == logging.ERROR
    assert isinstance(said[0].exc_info, tuple)  # the traceback: where it was cancelled
    assert [vars(said[0])[k] for k in ("part", "error", "restart_in")] == [
        "outbox",
        "CancelledError",
        0.05,
    ]


@pytest.mark.asyncio
async def test_a_worker_that_returns_before_its_stop_is_logged_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    runs: list[int] = []

    async def work() -> None:
        runs.append(len(runs))
        if len(runs) > 1:
            await stop.wait()

    worker = Supervised("reapers", work, stop, first_restart=0.05)
    try:
        await _runs_twice(worker, runs)
        assert worker.task is not None
        assert not worker.task.done(), "the worker's task ended"
        assert len(runs) == 2
    finally:
        stop.set()
        if worker.task is not None:
            await asyncio.wait({worker.task})
    said = [r for r in caplog.records if r.name == "statifier.service"]
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (
            logging.ERROR,
            (
                "reapers failed (RuntimeError: reapers returned before its stop); starting "
                "it again in 0 s"
            ),
        )
    ]
    assert isinstance(said[0].exc_info, tuple)
    assert "reapers returned before its stop" in str(said[0].exc_info[1])


@pytest.mark.asyncio
async def test_a_cancel_of_the_workers_own_task_ends_it_without_a_restart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    stop = asyncio.Event()
    runs: list[int] = []

    async def work() -> None:
        runs.append(len(runs))
        await stop.wait()

    worker = Supervised("timers", work, stop, first_restart=0.05)
    worker.start()
    assert worker.task is not None
    async with asyncio.timeout(20):
        while not runs:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    worker.task.cancel()  # the service's own cancel, at the bound of a stop
    await asyncio.wait({worker.task})
    assert worker.task.cancelled()
    assert runs == [0]
    assert not [r for r in caplog.records if r.name == "statifier.service"]
    assert worker.trouble() == "not running"


@pytest.mark.asyncio
async def test_a_worker_that_ended_before_the_stop_makes_the_stop_exit_1(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = f"""
migrate = true
charts = "charts"
{HITS_BINDING}
[database]
url = "sqlite:///{tmp_path / "x.db"}"

[http]
port = 0
"""
    out = io.StringIO()
    service = Service(load(write_config(tmp_path, body, {"hits": HITS})), out)
    running = asyncio.create_task(service.run())
    async with asyncio.timeout(30):
        while service.address is None:
            assert not running.done(), running
            await asyncio.sleep(0.02)
    [outbox] = [task for task in asyncio.all_tasks() if task.get_name() == "outbox"]
    outbox.cancel()  # its task ends: nothing restarts it
    await asyncio.wait({outbox})
    with caplog.at_level(logging.INFO, "statifier.service"):
        service.stop()
        status = await asyncio.wait_for(running, 30)
    assert status == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["outbox was cancelled before the stop"]
    assert out.getvalue().splitlines()[-1] == (
        "statifier serve: stopped; ended before the stop: outbox"
    )


def _table_source(
    tmp_path: Path, database: str, partitions: str, extra: str = ""
) -> tuple[str, Path]:
    """A migrated SQLite database's URL and a config with table source ``clicks`` on it."""
    url = f"sqlite:///{tmp_path / database}"
    migrations.upgrade(url)
    body = f"""
charts = "charts"
{HITS_BINDING}
[database]
url = "{url}"

[sources.clicks]
kind = "table"
partitions = {partitions}
{extra}"""
    return url, write_config(tmp_path, body, {"hits": HITS})


def test_every_build_of_a_table_source_takes_the_processs_owner(tmp_path: Path) -> None:
    url, config = _table_source(tmp_path, "owner.db", '["0", "1"]')
    settings = load(config)
    adapter = SqlAdapter(url)
    try:
        router = Router(router_config(settings, adapter))
        [source] = settings.sources
        first = build_source(source, router, str(config))
        again = build_source(source, router, str(config))
        assert isinstance(first, TableSource)
        assert isinstance(again, TableSource)
        assert first.owner == again.owner == process_owner()
        assert process_owner().count("-") >= 2  # host, process, and a random token
    finally:
        asyncio.run(adapter.close())


@pytest.mark.asyncio
async def test_a_consumer_whose_events_keep_failing_is_not_ready_until_they_flow(
    tmp_path: Path,
) -> None:
    extra = "\n[sources.clicks.consumer]\nstall_after = 0.3\n"
    url, config = _table_source(tmp_path, "stall.db", '["0"]', extra)
    settings = load(config)
    [source] = settings.sources
    assert source.consumer.stall_after == 0.3
    adapter = SqlAdapter(url)
    router = Router(router_config(settings, adapter))
    route_many = router.route_many
    down = [True]

    async def failing(events: Any, **options: Any) -> Any:
        if down[0]:
            return [Failed(event, ConnectionError("the chart store is down")) for event in events]
        return await route_many(events, **options)

    router.route_many = failing  # type: ignore[method-assign]
    part = SupervisedConsumer(source, router, str(config))
    event = InboundEvent(scope="web", source="clicks", message_id="m1", data={"key": "p1"})
    await append_events(adapter, [event], partition="0")
    part.start()
    try:
        async with asyncio.timeout(20):
            while not (part.trouble() or "").startswith("no event done for"):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert (part.trouble() or "").endswith("while 1 wait")
            down[0] = False
            while part.trouble() is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        await part.stop(5.0)
        await adapter.close()


@pytest.mark.asyncio
async def test_a_consumer_ended_by_a_cancellation_it_did_not_ask_for_is_logged_and_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "statifier.service")
    url, config = _table_source(tmp_path, "stray.db", '["0"]')
    settings = load(config)
    [source] = settings.sources
    adapter = SqlAdapter(url)
    part = SupervisedConsumer(source, Router(router_config(settings, adapter)), str(config))
    made = part.consumer
    runs: list[str] = []

    def consumer() -> Any:
        built = made()
        if runs:
            runs.append("again")
            return built

        async def run() -> None:
            runs.append("cancelled")
            shared = asyncio.get_running_loop().create_future()
            shared.cancel()  # a future a client shared, cancelled by someone else
            await shared

        built.run = run  # type: ignore[method-assign]
        return built

    part.consumer = consumer  # type: ignore[method-assign]
    part.start()
    try:
        async with asyncio.timeout(20):
            while runs != ["cancelled", "again"]:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert part.task is not None
        assert not part.task.done(), "the consumer's task ended"
    finally:
        await part.stop(5.0)
        await adapter.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert said == [
        "source clicks was cancelled, though the service is not stopping; starting it again in 1 s"
    ]
