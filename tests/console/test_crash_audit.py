"""Crash injection for the console's audit: a process taking the console's actions is
SIGKILLed at random points, many times, and started again on the same actions. After
every kill, each action took place exactly when its ``done`` audit row exists, and no
action has two: an act and its row commit in one transaction, on SQLite and
PostgreSQL. The kills that land after an action's statements ran and before its row
was written (where two transactions would lose the row) are counted, and must happen.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.child_processes import signal_child
from tests.console.crashing_console import ACTOR, target_of
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    impression_bindings,
    router_db,
    router_store,
)

from statifier.buckets import bucket_of
from statifier.persistence import Status
from statifier.router import InboundEvent
from statifier.sql import migrations

CRASHER = Path(__file__).with_name("crashing_console.py")
PER_ACTION = 6
KILLS = 20
"""Kills that must land while actions are still being taken."""
IN_THE_WINDOW = 3
"""Of them, kills that must land between an act's statements and its audit row."""
MAX_RUNS = 200


def _engine(db: RouterDb) -> sa.Engine:
    return sa.create_engine(migrations.sync_url(db.store.url))


async def _setup(db: RouterDb) -> list[tuple[str, str]]:
    """Executions to cancel, dead outbox rows to retry and to discard, consumer dead
    letters to route again and to discard: the actions, in the order they are taken."""
    router = db.router(impression_bindings())
    executions = []
    for index in range(PER_ACTION):
        event = InboundEvent(
            scope="web",
            source="ad_events",
            message_id=f"m-{index}",
            data={"kind": "impression", "impression_id": f"k{index}", "shown_at": "now"},
        )
        routed = await router.route(event)
        execution_id = getattr(routed.outcomes[0], "execution_id", None)
        assert isinstance(execution_id, str)
        executions.append(execution_id)
    tables = db.store.tables
    now = datetime.now(UTC)
    outbox = [
        {
            "queue": "joined",
            "key": f"o{index}",
            "payload": {"event": "e", "execution_id": "ex_1", "scope": "web"},
            "execution_id": "ex_1",
            "bucket": bucket_of("ex_1"),
            "attempts": 8,
            "next_attempt_at": now,
            "dead_at": now,
            "last_error": "HTTP 500",
            "inserted_at": now,
        }
        for index in range(2 * PER_ACTION)
    ]
    letters = []
    for index in range(2 * PER_ACTION):
        envelope = {
            "scope": "web",
            "source": "ad_events",
            "message_id": f"q-{index}",
            "data": {"kind": "impression", "impression_id": f"q{index}", "shown_at": "now"},
        }
        letters.append(
            {
                "source": "inbound",
                "partition": "0",
                "position": index,
                "message_id": f"q-{index}",
                "reason": "failed too often",
                "raw": json.dumps(envelope).encode(),
                "dead_at": now,
            }
        )
    engine = _engine(db)
    try:
        with engine.begin() as connection:
            connection.execute(tables.outbox.insert(), outbox)
            connection.execute(tables.consumer_dead_letters.insert(), letters)
            outbox_ids = [
                str(r) for (r,) in connection.execute(sa.select(tables.outbox.c.id).order_by("id"))
            ]
            letter_ids = [
                str(r)
                for (r,) in connection.execute(
                    sa.select(tables.consumer_dead_letters.c.id).order_by("id")
                )
            ]
    finally:
        engine.dispose()
    taken = [("cancel", execution_id) for execution_id in executions]
    taken += [("retry_outbox", row) for row in outbox_ids[:PER_ACTION]]
    taken += [("discard_outbox", row) for row in outbox_ids[PER_ACTION:]]
    taken += [("retry_consumer", row) for row in letter_ids[:PER_ACTION]]
    taken += [("discard_consumer", row) for row in letter_ids[PER_ACTION:]]
    random.Random(7).shuffle(taken)
    return taken


def _check(db: RouterDb, taken: list[tuple[str, str]]) -> int:
    """Each action took place exactly when its one ``done`` row exists; answers how
    many took place."""
    tables = db.store.tables
    engine = _engine(db)
    try:
        with engine.connect() as connection:
            statuses = dict(
                connection.execute(
                    sa.select(tables.executions.c.execution_id, tables.executions.c.status)
                ).all()
            )
            outbox = {
                str(row): dead
                for row, dead in connection.execute(
                    sa.select(tables.outbox.c.id, tables.outbox.c.dead_at)
                )
            }
            letters = {
                str(row)
                for (row,) in connection.execute(sa.select(tables.consumer_dead_letters.c.id))
            }
            audit = tables.console_audit
            done = Counter(
                (str(action), str(target))
                for action, target in connection.execute(
                    sa.select(audit.c.action, audit.c.target).where(
                        audit.c.outcome == "done", audit.c.actor == ACTOR
                    )
                )
            )
    finally:
        engine.dispose()
    happened = 0
    for action, target in taken:
        if action == "cancel":
            effect = statuses[target] == Status.CANCELLED.value
        elif action == "retry_outbox":
            effect = outbox[target] is None
        elif action == "discard_outbox":
            effect = target not in outbox
        else:
            effect = target not in letters
        rows = done[(action, target_of(action, target))]
        assert rows == int(effect), (action, target, effect, rows)
        happened += effect
    return happened


async def _run_once(
    db: RouterDb, taken: list[tuple[str, str]], kill: tuple[int, float] | None
) -> tuple[int, bool]:
    """One process taking every action. With ``kill = (acts, delay)`` it is SIGKILLed
    ``delay`` seconds after its ``acts``-th action, unless it has finished by then.
    Answers its exit status and whether it died between an act's statements and the
    end of its transaction."""
    options = db.store.tables.options
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CRASHER),
        db.store.url,
        options.prefix,
        options.schema or "-",
        json.dumps({"actions": taken}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    ready = await asyncio.wait_for(process.stdout.readline(), 60)
    if ready.strip() != b"ready":
        _, err = await process.communicate()
        pytest.fail(f"the console process did not start: {err.decode()}")
    lines: list[bytes] = []
    if kill is not None:
        wanted, delay = kill
        acts = 0
        while acts < wanted:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            if not line:
                break  # it finished
            lines.append(line.strip())
            acts += line.strip() == b"acted"
        else:
            await asyncio.sleep(delay)
            if process.returncode is None:
                signal_child(process, signal.SIGKILL)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode in (0, -signal.SIGKILL), err.decode()
    lines += out.split()
    in_window = process.returncode != 0 and bool(lines) and lines[-1] == b"recording"
    return process.returncode, in_window


@pytest.mark.asyncio
async def test_a_console_killed_at_random_points_never_leaves_an_act_without_its_row(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    taken = await _setup(router_db)
    assert _check(router_db, taken) == 0
    chooser = random.Random(20261202)
    kills = in_window = 0
    for _ in range(MAX_RUNS):
        kill = (chooser.randint(0, 3), chooser.uniform(0.0, 0.02)) if kills < 30 else None
        status, window = await _run_once(router_db, taken, kill)
        _check(router_db, taken)  # after every kill, not only at the end
        if status == 0:
            break
        kills += 1
        in_window += window
    assert kills >= KILLS
    assert in_window >= IN_THE_WINDOW
    assert _check(router_db, taken) == len(taken)  # every action took place, once
    print(f"kills: {kills}, of them between an act and its row: {in_window}")
