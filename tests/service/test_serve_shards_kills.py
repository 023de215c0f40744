"""``statifier serve`` over three stores (``[database] shards``: three SQLite files,
and three PostgreSQL databases of the test's own), SIGKILLed again and again at random
moments while orders stream into the inbound-events table, their timers fire and their
outbox rows are handed to a sink; then run to the end. Every order is stepped once in
its key's store (one execution, its placement and its timer's event each logged once,
every redelivery a duplicate), ends, and reaches the sink at least once under one key."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import pytest
from tests.child_processes import signal_child
from tests.service.helpers import start_serve
from tests.service.test_serve import EXIT_SLACK, SHUTDOWN_TIMEOUT, order_config, recorded
from tests.test_executions_over_stores import urls  # noqa: F401 - the stores, by name

from statifier.fronts.table_source import append_events
from statifier.persistence import Status
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    InboundEvent,
    OutboxDrain,
    ShardedRouter,
    TimerWorker,
    ledger,
)
from statifier.service import load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

KILLS = 8
ORDERS_PER_LIFE = 8


def _config(directory: Path, stores: list[str]) -> Path:
    listed = ", ".join(f'"{url}"' for url in stores)
    return order_config(directory, f"[database]\nshards = [{listed}]\n")


async def _ended(router: ShardedRouter) -> int:
    """How many executions have ended, in every store."""
    ended = 0
    for each in router.routers:
        records = await each.storage.list_executions()
        ended += sum(record.status is Status.COMPLETED for record in records)
    return ended


async def _settled(router: ShardedRouter, orders: int) -> bool:
    """Whether every order's execution has ended and no store holds a pending timer
    or outbox row."""
    for each in router.routers:
        if await OutboxDrain(each.storage, {}).pending():
            return False
        if await TimerWorker(each).next_due() is not None:
            return False
    return await _ended(router) == orders


@pytest.mark.asyncio
async def test_a_service_over_three_stores_killed_again_and_again_steps_each_order_once(
    urls: list[str],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    seed = random.randrange(2**32)
    chooser = random.Random(seed)
    config = _config(tmp_path, urls)
    settings = load(config)
    record = tmp_path / "record.jsonl"
    adapters = [SqlAdapter(url, TableOptions()) for url in settings.database.urls]
    router = ShardedRouter(router_config(settings, adapters[0]), adapters)
    orders = 0
    unfinished: list[int] = []  # orders not ended yet at each kill
    try:
        for life in range(KILLS):
            served = await start_serve(config, tmp_path / f"life{life}.log", record)
            try:
                for _ in range(ORDERS_PER_LIFE):
                    event = InboundEvent(
                        scope="shop",
                        source="shop",
                        message_id=f"o{orders}",
                        data={"order": f"o{orders}"},
                    )
                    await append_events(adapters[0], [event], partition=str(orders % 4))
                    orders += 1
                    await asyncio.sleep(chooser.uniform(0.0, 0.1))
                await asyncio.sleep(chooser.uniform(0.1, 1.5))
            finally:
                signal_child(served.process)
                assert await served.wait(10) == -signal.SIGKILL, f"seed {seed}"
            unfinished.append(orders - await _ended(router))
        last = await start_serve(config, tmp_path / "last.log", record)
        try:
            deadline = time.monotonic() + 60
            while not await _settled(router, orders):
                assert time.monotonic() < deadline, f"never settled (seed {seed})"
                assert last.process.returncode is None, last.stderr()
                await asyncio.sleep(0.2)
            last.signal(signal.SIGTERM)
            assert await last.wait(SHUTDOWN_TIMEOUT + EXIT_SLACK) == 0, last.stderr()
        finally:
            if last.process.returncode is None:
                last.process.kill()
                await last.process.wait()

        # Each order: one execution, in its key's store, placed and timed out once.
        for number in range(orders):
            order = f"o{number}"
            home = router.router_of_address("shop", "order", order)
            rows = [
                (each, row)
                for each in router.routers
                for row in await ledger(each)
                if row.binding_id == "orders" and row.message_id == order
            ]
            assert all(each is home for each, _ in rows), f"{order} outside its store ({seed})"
            outcomes = sorted(row.outcome for _, row in rows)
            assert outcomes[0] == "created_and_delivered", (order, outcomes, seed)
            assert set(outcomes[1:]) <= {"duplicate"}, (order, outcomes, seed)
            execution_id = rows[0][1].execution_id
            assert execution_id is not None
            found = await home.storage.find_execution(execution_id)
            assert found is not None
            assert found.status is Status.COMPLETED, (order, found.status, seed)
            assert found.final_state == "done"
            logged = [entry.via for entry in await home.storage.inputs(execution_id)]
            assert len(logged) == 2, (order, logged, seed)  # the placement and the timer's
        # The kills landed with work under way: orders not stepped in, or their timers
        # not fired yet (each order waits a second for its timer).
        print(f"seed {seed}: orders unfinished at each kill {unfinished}")
        assert sum(unfinished) > 0, unfinished
        held = [len(await each.storage.list_executions()) for each in router.routers]
        assert sum(held) == orders, (held, seed)
        assert all(held), (held, seed)
        # The sink: every order at least once (a row handed over just before a kill
        # is handed again once its lease runs out), always under one key.
        keys: dict[str, set[str]] = {}
        for line in recorded(record):
            keys.setdefault(line["order"], set()).add(line["key"])
        assert set(keys) == {f"o{number}" for number in range(orders)}, seed
        assert all(len(each) == 1 for each in keys.values()), (keys, seed)
    finally:
        for adapter in adapters:
            await adapter.close()
