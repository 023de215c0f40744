"""Crash injection over the inbound-events table: two consumer processes of one group,
SIGKILLed at random points many times and started again. Afterwards every event is in
its key's execution's input log exactly once, in the key's order, and no commit ever
passed an event whose delivery had not committed (each process audits its commits
against the routing ledger). A consumer with the commit rule deliberately broken is
caught by the same audit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.child_processes import signal_child
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, SCOPE, hit
from tests.router.test_races import COUNTER, count_of, counter_router, logged_messages

from statifier.fronts.table_source import ByKey, TableSource, append_events
from statifier.router import address, ledger

WORKER = Path(__file__).with_name("table_consumer.py")
PARTITIONS = ["0", "1", "2", "3"]
KEYS = 16
EVENTS_PER_KEY = 12
KILLS = 8
"""Kills that must land while the group still has events to commit."""
PAUSE = 0.15
"""Seconds each event's routing waits while the kills go on, so the work outlasts them
on a loaded machine too (0.05 s once let the work end after six kills, a process
start taking longer there); the last members route without it."""
BUDGET = 40.0
"""Seconds the kills may take at most."""
MAX_RUNS = 100


def _stream() -> list[tuple[str, str]]:
    """The stream: each key's events in order, the keys interleaved."""
    return [
        (f"k{key:02d}/{turn}", f"k{key:02d}")
        for turn in range(EVENTS_PER_KEY)
        for key in range(KEYS)
    ]


class Member:
    """One consumer process of the group."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ready(self) -> bool:
        """Whether it started its source (``False``: it has ended already)."""
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        return line.strip() == b"ready"

    async def ended(self) -> int:
        _, err = await asyncio.wait_for(self.process.communicate(), 60)
        assert self.process.returncode in (0, -signal.SIGKILL), err.decode()
        return self.process.returncode


async def _spawn(
    router_db: RouterDb, chart: Path, audit: Path, owner: str, job: dict[str, Any]
) -> Member:
    options = router_db.store.tables.options
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        router_db.store.url,
        options.prefix,
        options.schema or "-",
        str(chart),
        owner,
        str(audit),
        json.dumps(job),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Member(process)


async def _enqueue(router_db: RouterDb) -> dict[str, int]:
    """Append the stream, each key's events in one partition; answers each partition's
    last position."""
    router = counter_router(router_db)
    events = [hit(message_id, key) for message_id, key in _stream()]
    placed = await append_events(router_db.adapter, events, partition=ByKey(router, PARTITIONS))
    ends: dict[str, int] = {}
    for partition, position in placed:
        ends[partition] = max(ends.get(partition, 0), position)
    return ends


async def _done(router_db: RouterDb, ends: dict[str, int]) -> bool:
    source = TableSource(router_db.adapter, group="crash", partitions=PARTITIONS)
    committed = await source.committed()
    return all(committed.get(p, 0) >= end for p, end in ends.items())


@pytest.mark.asyncio
async def test_consumers_killed_at_random_points_route_every_event_once(
    router_db: RouterDb, tmp_path: Path
) -> None:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    audit = tmp_path / "audit"
    audit.touch()
    ends = await _enqueue(router_db)
    chooser = random.Random(20261201)
    job = {"partitions": PARTITIONS, "ends": ends, "ttl": 0.6, "pause": PAUSE}
    started = time.monotonic()
    kills = 0
    members: dict[str, Member] = {}
    try:
        for turn in range(MAX_RUNS):
            if kills >= KILLS or time.monotonic() - started > BUDGET:
                break
            for owner in ("a", "b"):
                if owner not in members:
                    # A restarted member takes its old name, as a host restarted in place.
                    options = {
                        "lanes": 2,
                        "batch": chooser.choice([1, 2, 4, 8]),
                        # A long interval leaves committed deliveries unacknowledged.
                        "commit_interval": chooser.choice([0.01, 0.1, 0.3]),
                    }
                    members[owner] = await _spawn(
                        router_db, chart, audit, owner, {**job, **options}
                    )
            # The members die in turn, so the victim has mostly started already.
            member = members.pop("ab"[turn % 2])
            if await member.ready():
                await asyncio.sleep(chooser.uniform(0.2, 1.2))
                with contextlib.suppress(ProcessLookupError):  # it may have ended
                    signal_child(member.process, signal.SIGKILL)
            if await member.ended() != 0:
                kills += 1
            if await _done(router_db, ends):
                break
        assert kills >= KILLS, f"only {kills} kills landed before the work was done"
        for owner in ("a", "b"):
            if owner not in members:
                final = {**job, "lanes": 4, "batch": 8, "pause": 0.0}
                members[owner] = await _spawn(router_db, chart, audit, owner, final)
        for owner in list(members):
            assert await members.pop(owner).ended() == 0
    finally:
        for member in members.values():
            with contextlib.suppress(ProcessLookupError):
                signal_child(member.process, signal.SIGKILL)
            await member.process.communicate()
    assert await _done(router_db, ends)
    assert audit.read_text().split() == []  # no commit passed a pending event

    router = counter_router(router_db)
    rows = await ledger(router)
    stream = _stream()
    assert {r.outcome for r in rows} <= {"created_and_delivered", "delivered", "duplicate"}
    stepped = sorted(
        str(r.message_id) for r in rows if r.outcome in ("created_and_delivered", "delivered")
    )
    assert stepped == sorted(message_id for message_id, _ in stream)  # each exactly once
    for key in sorted({key for _, key in stream}):
        found = await address(router, SCOPE, DOCUMENT, key)
        assert found is not None, key
        expected = [message_id for message_id, k in stream if k == key]
        assert await logged_messages(router, found.execution_id) == expected
        assert await count_of(router, found.execution_id) == EVENTS_PER_KEY
    created = [r.execution_id for r in rows if r.outcome == "created_and_delivered"]
    assert len(created) == len(set(created)) == KEYS  # one execution per key, no more
    assert len(await router.adapter.list_by_metadata({})) == KEYS
    duplicates = sum(1 for r in rows if r.outcome == "duplicate")
    print(f"kills: {kills}, redeliveries answered duplicate: {duplicates}")


@pytest.mark.asyncio
async def test_the_audit_catches_a_commit_past_a_pending_event(
    router_db: RouterDb, tmp_path: Path
) -> None:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    audit = tmp_path / "audit"
    audit.touch()
    ends = await _enqueue(router_db)
    job = {
        "partitions": PARTITIONS,
        "ends": ends,
        "ttl": 5.0,
        "lanes": 2,
        "batch": 2,
        "pause": 0.02,
    }
    member = await _spawn(router_db, chart, audit, "a", {**job, "broken": True})
    assert await member.ready()
    assert await member.ended() == 0  # it thinks it is done
    assert audit.read_text().split() != []
