"""Crash injection: a router process SIGKILLed at random points, many times, and started
again on the events its stream has not acknowledged, as a front redelivers them. Every
event ends up stepped into its key's execution exactly once, in the key's order; what
was committed but not acknowledged comes back as a duplicate, never as a second step.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from tests.child_processes import signal_child
from tests.persistence.conftest import SqlStore
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, SCOPE
from tests.router.test_races import COUNTER, count_of, counter_router, logged_messages

from statifier.router import address, ledger


@pytest.fixture(name="router_store")
def _locking_router_store(locking_store: SqlStore) -> SqlStore:
    """Each backend, and PostgreSQL whose locks are rows: a kill must leave no lock
    held either way."""
    return locking_store


CRASHER = Path(__file__).with_name("crashing_router.py")
KEYS = 24
EVENTS_PER_KEY = 16
KILLS = 20
"""Kills that must land while events are still unacknowledged (about 30 do)."""
MAX_RUNS = 200


def _stream() -> list[list[str]]:
    """The stream: each key's events in order, the keys interleaved."""
    return [
        [f"k{key:02d}/{turn}", f"k{key:02d}"]
        for turn in range(EVENTS_PER_KEY)
        for key in range(KEYS)
    ]


async def _run_once(
    router_db: RouterDb, chart: Path, acks: Path, batch: int, kill: tuple[int, float] | None
) -> int:
    """One router process. With ``kill = (acks, delay)`` it is SIGKILLed ``delay``
    seconds after its ``acks``-th acknowledgement, somewhere inside the delivery (or
    batch) after it, unless it has finished by then. Answers its exit status."""
    options = router_db.store.tables.options
    job = json.dumps({"events": _stream(), "batch": batch, "pause": 0.001})
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CRASHER),
        router_db.store.url,
        options.prefix,
        options.schema or "-",
        options.locks,
        str(chart),
        str(acks),
        job,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    ready = await asyncio.wait_for(process.stdout.readline(), 60)
    if ready.strip() != b"ready":
        _, err = await process.communicate()
        pytest.fail(f"the router did not start: {err.decode()}")
    if kill is not None:
        wanted, delay = kill
        for _ in range(wanted):
            if not await asyncio.wait_for(process.stdout.readline(), 60):
                break  # it finished
        else:
            await asyncio.sleep(delay)
            if process.returncode is None:
                signal_child(process, signal.SIGKILL)
    _, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode in (0, -signal.SIGKILL), err.decode()
    return process.returncode


@pytest.mark.asyncio
async def test_a_router_killed_at_random_points_steps_every_event_once(
    router_db: RouterDb, tmp_path: Path
) -> None:
    # One transaction per event, and batches.
    kills = await _killed_until_done(router_db, tmp_path, [1, 1, 4, 8], 20261201, 5)
    assert kills >= KILLS
    await _every_event_once(router_db, tmp_path, kills)


@pytest.mark.asyncio
async def test_a_router_killed_inside_set_based_batches_steps_every_event_once(
    router_db: RouterDb, tmp_path: Path
) -> None:
    """Every run routes batches (``route_many``, settled set-based: decision 0113), and
    each kill lands a few milliseconds after an acknowledgement, inside the next batch."""
    kills = await _killed_until_done(router_db, tmp_path, [4, 6, 8], 20261204, 1)
    assert kills >= 30
    await _every_event_once(router_db, tmp_path, kills)


async def _killed_until_done(
    router_db: RouterDb, tmp_path: Path, batches: list[int], seed: int, most_acks: int
) -> int:
    """Run router processes on the stream, SIGKILLing each of the first 30 at a random
    point (after at most ``most_acks`` acknowledged calls), until one finishes; answers
    the kills that landed."""
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    acks = tmp_path / "acks"
    chooser = random.Random(seed)
    kills = 0
    for _ in range(MAX_RUNS):
        batch = chooser.choice(batches)
        kill = (chooser.randint(0, most_acks), chooser.uniform(0.0, 0.01)) if kills < 30 else None
        status = await _run_once(router_db, chart, acks, batch, kill)
        if status == 0:
            break
        kills += 1
    return kills


async def _every_event_once(router_db: RouterDb, tmp_path: Path, kills: int) -> None:
    """Every event of the stream acknowledged, stepped once into its key's execution,
    in the key's order."""
    acks = tmp_path / "acks"
    acknowledged = acks.read_text().split()
    stream = _stream()
    assert sorted(acknowledged) == sorted(message_id for message_id, _ in stream)

    router = counter_router(router_db)
    rows = await ledger(router)
    stepped = Counter(
        r.message_id for r in rows if r.outcome in ("created_and_delivered", "delivered")
    )
    assert {r.outcome for r in rows} <= {"created_and_delivered", "delivered", "duplicate"}
    assert stepped == Counter(message_id for message_id, _ in stream)  # each exactly once
    duplicates = sum(1 for r in rows if r.outcome == "duplicate")
    print(f"kills: {kills}, redeliveries answered duplicate: {duplicates}")

    for key in sorted({key for _, key in stream}):
        found = await address(router, SCOPE, DOCUMENT, key)
        assert found is not None, key
        expected = [message_id for message_id, k in stream if k == key]
        assert await logged_messages(router, found.execution_id) == expected
        assert await count_of(router, found.execution_id) == EVENTS_PER_KEY
    created = [r.execution_id for r in rows if r.outcome == "created_and_delivered"]
    assert len(created) == len(set(created)) == KEYS  # one execution per key, no more
