"""Debounce, batch and throttle bindings under two processes SIGKILLed at random points,
many times, on each database: every event reaches its key's execution exactly once (a
debounce's coalesced into the count of one delivery), in its key's order, every message
arrives once in the ledger (its resends are duplicates), and nothing stays held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.router.flow_process import DOCUMENT, SCOPE, message_id, router_of, send
from tests.router.test_caps_crashes import Server, _text

from statifier.persistence import Executions
from statifier.router import FlowWorker, Mode, Router, address, ledger

PROCESS = "tests.router.flow_process"

KEYS = 6
"""Each process's keys (the two processes' are apart; their flow workers are not)."""
EVENTS = {"sqlite": 1000, "postgresql": 300}
"""Each key's events, by database: more than the kills let a process send."""
KILLS = 30
PAUSE = (0.02, 0.3)
"""Seconds a process works before it is killed (from when it sent its first new
message, or connected)."""
STALL = 5.0
"""Seconds a process may take to send its first new message before it is killed
anyway."""
EARLY = 0.25
"""How often the time before a kill counts from when the process connected."""
DEADLINE = 150.0
"""Seconds the kills and the final pass may take, together, on one database."""
DELIVERED = ("delivered", "created_and_delivered")


async def _finish(router: Router, keys: list[str], events: int) -> None:
    """The final clean pass: every event sent again, then passes of the flow worker
    until nothing is held and no window is open."""
    for n in range(1, events + 1):
        for key in keys:
            await send(router, key, n)
    worker = FlowWorker(router)
    # Time moved on a window a pass, not waited for: a throttle's backlog drains at
    # once.
    base = router.storage.clock()
    for index in range(5_000):
        await worker.flush_due(now=base + timedelta(milliseconds=70 * index))
        if await worker.next_due() is None:
            return
    pytest.fail(f"still held after the final pass: {await worker.totals()}")


async def _delivered(router: Router, key: str) -> list[dict[str, Any]]:
    """The data of every event the key's execution took, in order."""
    found = await address(router, SCOPE, DOCUMENT, key)
    assert found is not None, key
    logged = []
    for entry in await Executions(router.storage).inputs(found.execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        logged.append(data)
    return logged


def _check_key(mode: Mode, delivered: list[dict[str, Any]], events: int) -> None:
    """What one key's execution took says every event once, in order."""
    every = list(range(1, events + 1))
    if mode is Mode.DEBOUNCE:
        # Each delivery is the last event of a burst, counting the burst: the bursts'
        # last events rise, the last is the key's last, and the counts add up.
        lasts = [entry["n"] for entry in delivered]
        assert lasts == sorted(set(lasts)), lasts
        assert lasts[-1] == events
        assert sum(entry["count"] for entry in delivered) == events
    elif mode is Mode.BATCH:
        batches = [[event["n"] for event in entry["events"]] for entry in delivered]
        assert all(1 <= len(batch) <= 3 for batch in batches), batches
        assert [n for batch in batches for n in batch] == every
    else:
        assert [entry["n"] for entry in delivered] == every


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", [Mode.DEBOUNCE, Mode.BATCH, Mode.THROTTLE], ids=str)
async def test_two_processes_killed_anywhere_deliver_each_event_once_in_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
    mode: Mode,
) -> None:
    started = time.monotonic()
    options = router_db.store.tables.options
    router = router_of(router_db.adapter, mode)
    events = EVENTS[router_db.backend]
    works = [[f"p{slot}k{index}" for index in range(KEYS)] for slot in range(2)]
    keys = [key for work in works for key in work]
    specs: list[dict[str, object]] = [
        {"mode": mode.value, "keys": work, "events": events} for work in works
    ]
    rng = random.Random(30)
    kills = finished = 0
    server = await Server.start(
        router_db.store.url, options, tmp_path / "server.err", module=PROCESS
    )

    async def slot(spec: dict[str, object]) -> None:
        """One process after another on ``spec`` until the kills are made, each killed
        a random time after it began to send new messages (one in four: after it
        connected, most likely while it sends again what was sent)."""
        nonlocal kills, finished
        while kills < KILLS:
            pid = await server.fork(spec)
            exited = server.said("exit", pid)
            start = server.said("working" if rng.random() < EARLY else "fresh", pid)
            # A process that sends nothing new for long (all its jobs wait on the
            # other's) is killed all the same.
            await asyncio.wait([start, exited], timeout=STALL, return_when="FIRST_COMPLETED")
            await asyncio.wait([exited], timeout=rng.uniform(*PAUSE))
            if not exited.done():
                with contextlib.suppress(ProcessLookupError):  # it exited just now
                    os.kill(pid, signal.SIGKILL)
            code = await exited
            if code != -signal.SIGKILL:
                assert code == 0, await _text(server.errors)
                finished += 1
                return
            kills += 1

    try:
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*(slot(spec) for spec in specs))
            killing = time.monotonic() - started
            await _finish(router, keys, events)
    finally:
        await server.stop()
    print(
        f"{router_db.backend} {mode.value}: {kills} processes killed mid-work, {finished} "
        f"ran through; {killing:.1f} s killing, {time.monotonic() - started:.1f} s in all"
    )
    assert kills >= KILLS, (kills, finished)
    assert await FlowWorker(router).totals() == (0, 0)

    # 1. Each key's execution took every event once, in order.
    for key in keys:
        _check_key(mode, await _delivered(router, key), events)

    # 2. Each message arrived once: held (and later delivered, or coalesced), or
    # delivered at once; its resends are duplicates; each key created one execution.
    rows = await ledger(router)
    sent = {message_id(key, n) for key in keys for n in range(1, events + 1)}
    assert {row.message_id for row in rows} == sent
    said: dict[str | None, list[str]] = {}
    for row in rows:
        if row.outcome != "duplicate":
            said.setdefault(row.message_id, []).append(row.spelled)
    for message, outcomes in said.items():
        arrival, *delivery = outcomes
        assert arrival in ("buffered", *DELIVERED), (message, outcomes)
        assert delivery in ([], *([d] for d in DELIVERED)), (message, outcomes)
        assert arrival == "buffered" or not delivery, (message, outcomes)
    created = [str(row.key) for row in rows if row.outcome == "created_and_delivered"]
    assert sorted(created) == sorted(keys)
    assert any(row.outcome == "duplicate" for row in rows)
    assert any(row.outcome == "buffered" for row in rows)
