"""Paused executions on each database: what is sent to one and its timers that come due
are held, in order, and stepped in on resume; nothing is refused, lost or stepped
twice, through a resume SIGKILLed at random points and deliveries from another process
racing a resume."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from tests.child_processes import signal_child
from tests.console.conftest import CHECKOUT, shop_bindings
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.router.racing_router import HITS, SCOPE, hit
from tests.router.test_races import COUNTER, count_of, counter_router, logged_messages

from statifier.chart import compile_chart
from statifier.persistence import ExecutionNotFound, Executions, Status
from statifier.router import (
    Delivered,
    Duplicate,
    Held,
    InboundEvent,
    Resumed,
    Router,
    StaticResolver,
    TimerWorker,
    ledger,
)

HERE = Path(__file__).parent
RESUMER = HERE / "resuming_router.py"
RACER = HERE / "racing_router.py"


async def _route(router: Router, message_id: str, key: str = "k1") -> object:
    (outcome,) = (await router.route(hit(message_id, key))).outcomes
    return outcome


async def _status(router: Router, execution_id: str) -> Status:
    record = await router.adapter.fetch_execution(execution_id)
    assert record is not None
    return record.status


async def _held(router: Router, execution_id: str) -> int:
    async with router.transaction() as unit:
        return await unit.sql.count_held(execution_id)


@pytest.mark.asyncio
async def test_events_sent_to_a_paused_execution_are_held_and_stepped_on_resume(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = counter_router(router_db)
    first = await _route(router, "k1/0")
    execution_id = first.execution_id  # type: ignore[attr-defined]
    assert await router.pause(execution_id) is True
    assert await router.pause(execution_id) is False  # paused already
    assert await _status(router, execution_id) is Status.PAUSED
    held = [await _route(router, f"k1/{n}") for n in range(1, 6)]
    assert held == [Held("hits_to_count", key="k1", execution_id=execution_id)] * 5
    # A message held once is a duplicate the second time, as a delivered one is.
    assert await _route(router, "k1/3") == Duplicate("hits_to_count", key="k1")
    assert await count_of(router, execution_id) == 1  # nothing stepped while paused
    assert await _held(router, execution_id) == 5
    rows = [row for row in await ledger(router, execution_id) if row.outcome == "held"]
    assert [row.message_id for row in rows] == [f"k1/{n}" for n in range(1, 6)]
    resumed = await router.resume(execution_id)
    assert resumed == Resumed(execution_id, stepped=5, discarded=0, status=Status.ACTIVE)
    assert await logged_messages(router, execution_id) == [f"k1/{n}" for n in range(6)]
    assert await count_of(router, execution_id) == 6
    assert await _held(router, execution_id) == 0
    assert await router.resume(execution_id) is None  # not paused: nothing changes
    after = await _route(router, "k1/6")
    assert isinstance(after, Delivered)
    assert await logged_messages(router, execution_id) == [f"k1/{n}" for n in range(7)]
    with pytest.raises(ExecutionNotFound):
        await router.pause("nobody")
    with pytest.raises(ExecutionNotFound):
        await router.resume("nobody")


@pytest.mark.asyncio
async def test_timers_due_while_paused_wait_with_the_events_and_an_end_discards_the_rest(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    router = router_db.router(shop_bindings(), resolver=StaticResolver({"order": machine}))

    async def send(kind: str, message_id: str, **data: object) -> object:
        event = InboundEvent(
            scope="web",
            source="shop",
            message_id=message_id,
            data={"kind": kind, "order": "o-1", **data},
        )
        routed = await router.route(event)
        (outcome,) = [o for o in routed.outcomes if o.outcome != "no_match"]
        return outcome

    created = await send("checkout", "m1", amount=5, timeout="1h")
    execution_id = created.execution_id  # type: ignore[attr-defined]
    assert await router.pause(execution_id)
    assert isinstance(await send("checkout", "m2", amount=7), Held)
    router_db.clock.advance(timedelta(hours=2))
    worker = TimerWorker(router)
    await worker.fire_due()
    async with router.transaction() as unit:
        held = await unit.sql.held(execution_id)
    assert [(row.via, row.message_id) for row in held] == [("step", "m2"), ("timer", None)]
    assert await _status(router, execution_id) is Status.PAUSED
    assert isinstance(await send("pay", "m3"), Held)  # after the timeout: never taken
    resumed = await router.resume(execution_id)
    # The second checkout, then the timeout (expired: the end), then the payment,
    # which the ended execution discards.
    assert resumed == Resumed(execution_id, stepped=2, discarded=1, status=Status.COMPLETED)
    inputs = await Executions(router.storage).inputs(execution_id)
    assert [(e.via, e.event.name if e.event else None) for e in inputs] == [
        ("step", "checkout"),
        ("step", "checkout"),
        ("timer", "payment.timeout"),
    ]
    record = await router.adapter.fetch_execution(execution_id)
    assert record is not None
    assert record.final_state == "expired"
    assert await _held(router, execution_id) == 0


def _counter_file(tmp_path: Path) -> Path:
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    return chart


async def _hold(router: Router, start: int, count: int) -> None:
    events = [hit(f"k1/{n}", "k1") for n in range(start, start + count)]
    for offset in range(0, count, 500):
        for answer in await router.route_many(events[offset : offset + 500]):
            assert all(isinstance(o, Held) for o in answer.outcomes), answer  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_a_resume_killed_anywhere_steps_every_held_event_once_or_none(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    router = counter_router(router_db)
    chart = _counter_file(tmp_path)
    execution_id = (await _route(router, "k1/0")).execution_id  # type: ignore[attr-defined]
    logged = 1
    kills = stepped_through = 0
    rng = random.Random(5)
    while kills < 8 and stepped_through < 12:
        if await _status(router, execution_id) is Status.ACTIVE:
            assert await router.pause(execution_id)
            await _hold(router, logged, 1000)
        held = await _held(router, execution_id)
        options = router_db.store.tables.options
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(RESUMER),
            router_db.store.url,
            options.prefix,
            options.schema or "-",
            str(chart),
            execution_id,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
        await asyncio.sleep(rng.uniform(0.0, 0.4))
        if process.returncode is None:
            signal_child(process, signal.SIGKILL)
        code = await process.wait()
        if code == -signal.SIGKILL:
            kills += 1
        else:
            assert code == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]
            stepped_through += 1
        messages = await logged_messages(router, execution_id)
        if await _status(router, execution_id) is Status.PAUSED:
            # Killed before its commit: nothing of it stands.
            assert len(messages) == logged
            assert await _held(router, execution_id) == held
        else:
            assert await _held(router, execution_id) == 0
            logged += held
        assert messages == [f"k1/{n}" for n in range(logged)]
        assert await count_of(router, execution_id) == logged
    print(f"{kills} resumes killed, {stepped_through} ran through")
    assert kills >= 3, (kills, stepped_through)
    # What the last killed resume left is whole: a resume here steps it all in.
    if await _status(router, execution_id) is Status.PAUSED:
        held = await _held(router, execution_id)
        resumed = await router.resume(execution_id)
        assert resumed is not None
        assert resumed.stepped == held
        logged += held
    assert await logged_messages(router, execution_id) == [f"k1/{n}" for n in range(logged)]


@pytest.mark.asyncio
async def test_deliveries_from_another_process_racing_a_resume_keep_their_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    router = counter_router(router_db)
    chart = _counter_file(tmp_path)
    execution_id = (await _route(router, "k1/0")).execution_id  # type: ignore[attr-defined]
    assert await router.pause(execution_id)
    await _hold(router, 1, 300)
    lane = [[f"k1/{n}", "k1"] for n in range(301, 501)]
    options = router_db.store.tables.options
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(RACER),
        router_db.store.url,
        options.prefix,
        options.schema or "-",
        options.locks,
        str(chart),
        json.dumps({"lanes": [lane], "batch": False, "pause": 0.002}),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdin is not None
    assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
    process.stdin.write(b"go\n")
    await process.stdin.drain()
    await asyncio.sleep(0.1)  # some of its events are held, some come during the resume
    resumed = await router.resume(execution_id)
    assert resumed is not None
    output, errors = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, errors.decode()
    answered = dict(json.loads(output.decode().strip().splitlines()[-1]))
    assert set(answered.values()) <= {"held", "delivered"}
    assert "held" in answered.values()
    # Every event once, in the order it was sent: the held ones stepped before any that
    # came after the resume.
    messages = await logged_messages(router, execution_id)
    assert messages == [f"k1/{n}" for n in range(501)]
    assert await count_of(router, execution_id) == 501
    assert await _held(router, execution_id) == 0
    assert SCOPE == "races"


FAILING_COUNTER = COUNTER.replace(
    b'<assign location="n" expr="n + 1"/>',
    b'<assign location="n" expr="n + 1"/><assign location="n" expr="n / nothing"/>',
)
"""The counter whose every hit raises ``error.execution`` after counting (``nothing`` is
no variable), an error no transition takes."""


@pytest.mark.asyncio
async def test_a_resume_answers_the_errors_the_held_events_raised(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    resolver = StaticResolver({HITS.document: compile_chart(FAILING_COUNTER)})
    router = router_db.router([HITS], resolver=resolver)
    first = await _route(router, "k1/0")
    execution_id = first.execution_id  # type: ignore[attr-defined]
    assert await router.pause(execution_id)
    assert [await _route(router, f"k1/{n}") for n in (1, 2)] == [
        Held("hits_to_count", key="k1", execution_id=execution_id)
    ] * 2
    resumed = await router.resume(execution_id)
    assert resumed is not None
    assert resumed == Resumed(execution_id, 2, 0, Status.ACTIVE, resumed.errors)
    assert [(error.name, error.element, error.taken) for error in resumed.errors] == [
        ("error.execution", "assign", False)
    ] * 2
    assert all("nothing" in (error.message or "") for error in resumed.errors)
    assert await logged_messages(router, execution_id) == ["k1/0", "k1/1", "k1/2"]
