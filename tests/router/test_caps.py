"""Caps on active executions on each database: creates beyond a cap held and made in
order when a slot frees, an address's later events behind its held create, dropped as
``over_limit`` by choice; fair across scopes; never over the cap with concurrent
creates; a failing make recorded and retried."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    pg_db,
    router_db,
    router_store,
)

from statifier.chart import Machine, compile_chart
from statifier.core.positions import load_event
from statifier.router import (
    Binding,
    Cap,
    CapPer,
    Create,
    FlowWorker,
    InboundEvent,
    OverLimit,
    Router,
    StaticResolver,
    address,
    ledger,
)
from statifier.router.errors import ConfigError

START = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)

JOB = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="running">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="running">
    <transition event="job.hit"><assign location="n" expr="n + 1"/></transition>
    <transition event="job.close" target="closed"/>
  </state>
  <final id="closed"/>
</scxml>
"""
"""A job: hits counted until a close ends it."""

_CHART: list[Machine] = []


def _chart() -> Machine:
    if not _CHART:
        _CHART.append(compile_chart(JOB))
    return _CHART[0]


HITS = Binding(
    id="hits",
    source="jobs",
    match="event.kind == 'hit'",
    key="event.job",
    document="job",
    event="job.hit",
    data=("job", "n"),
)
CLOSES = Binding(
    id="closes",
    source="jobs",
    match="event.kind == 'close'",
    key="event.job",
    document="job",
    event="job.close",
    create=Create.NEVER,
)


def _router(db: RouterDb, cap: Cap) -> Router:
    resolver = StaticResolver({"job": _chart()})
    return db.router([HITS, CLOSES], resolver=resolver, caps={"job": cap})


_SENT: list[int] = []
"""What every test has sent so far: each event's ``n`` is its number."""


@pytest.fixture(autouse=True)
def _count_from_one() -> None:
    _SENT.clear()


async def _send(router: Router, job: str, kind: str = "hit", scope: str = "t") -> str:
    _SENT.append(1)
    event = InboundEvent(
        scope=scope,
        source="jobs",
        message_id=f"{scope}/{job}/{kind}/{len(_SENT)}",
        data={"kind": kind, "job": job, "n": len(_SENT)},
    )
    routed = await router.route(event)
    return next(o.outcome for o in routed.outcomes if o.outcome != "no_match")


async def _hits(router: Router, job: str, scope: str = "t") -> list[int]:
    """The ``n`` of every hit the job's execution took, in order."""
    found = await address(router, scope, "job", job)
    if found is None:
        return []
    data: list[dict[str, Any]] = [
        dict(load_event(entry.event or b"").data)
        for entry in await router.storage.inputs(found.execution_id)
    ]
    return [entry["n"] for entry in data if "n" in entry]


async def _live(router: Router) -> int:
    records = await router.storage.list_executions()
    return sum(1 for record in records if not record.status.terminal)


@pytest.mark.asyncio
async def test_a_create_beyond_the_cap_is_held_with_its_keys_later_events_and_made_in_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, Cap(2))
    worker = FlowWorker(router)
    assert [await _send(router, job) for job in ("a", "b", "c")] == [
        "created_and_delivered",
        "created_and_delivered",
        "buffered",
    ]
    assert await _send(router, "c") == "buffered"  # behind its held create
    assert await _send(router, "d") == "buffered"  # behind the held creates
    assert await _send(router, "a") == "delivered"  # an execution that exists: never held
    assert await worker.held_creates() == (2, 3)
    made = await worker.flush_due()
    assert [(report.key, report.delivered) for report in made] == [("c", 0)]  # still full
    assert await _send(router, "a", "close") == "delivered"
    made = await worker.flush_due()
    assert [(report.key, report.delivered) for report in made] == [("c", 2), ("d", 0)]
    assert await _hits(router, "c") == [3, 4]
    assert await _live(router) == 2
    assert await _send(router, "b", "close") == "delivered"
    await worker.flush_due()
    assert await _hits(router, "d") == [5]
    assert await worker.held_creates() == (0, 0)
    rows = [(row.key, row.outcome) for row in await ledger(router)]
    assert rows.count(("c", "buffered")) == 2
    assert rows.count(("c", "created_and_delivered")) == 1
    assert rows.count(("c", "delivered")) == 1


@pytest.mark.asyncio
async def test_an_event_that_never_creates_waits_behind_its_addresss_held_create(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, Cap(1))
    worker = FlowWorker(router)
    assert await _send(router, "a") == "created_and_delivered"
    assert await _send(router, "b") == "buffered"  # the cap is full
    # b's close comes while its create is held: it waits behind it, not dropped.
    assert await _send(router, "b", "close") == "buffered"
    assert await _send(router, "c", "close") == "dropped: no_execution"  # none held: no execution
    assert await worker.held_creates() == (1, 2)
    assert await _send(router, "a", "close") == "delivered"
    await worker.flush_due()
    found = await address(router, "t", "job", "b")
    assert found is not None
    record = await router.storage.find_execution(found.execution_id)
    assert record is not None
    assert record.status.terminal  # made, then closed: its slot frees
    assert await _send(router, "d") == "created_and_delivered"
    assert await worker.held_creates() == (0, 0)


@pytest.mark.asyncio
async def test_a_cap_that_drops_refuses_the_create_and_keeps_nothing(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, Cap(1, over=OverLimit.DROP))
    assert await _send(router, "a") == "created_and_delivered"
    assert await _send(router, "b") == "dropped: over_limit"
    assert await FlowWorker(router).held_creates() == (0, 0)
    assert await _send(router, "a", "close") == "delivered"
    assert await _send(router, "b") == "created_and_delivered"


@pytest.mark.asyncio
async def test_a_cap_per_scope_counts_each_scope_alone(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, Cap(1))
    assert await _send(router, "a", scope="s1") == "created_and_delivered"
    assert await _send(router, "a", scope="s2") == "created_and_delivered"
    assert await _send(router, "b", scope="s1") == "buffered"


@pytest.mark.asyncio
async def test_a_cap_over_every_scope_gives_a_free_slot_to_the_scope_with_fewest(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, Cap(3, per=CapPer.DOCUMENT))
    worker = FlowWorker(router)
    for job in ("a1", "a2", "a3"):
        assert await _send(router, job, scope="A") == "created_and_delivered"
    # A's waiting jobs came first; B's later.
    for job, scope in (("a4", "A"), ("a5", "A"), ("b1", "B"), ("b2", "B")):
        assert await _send(router, job, scope=scope) == "buffered"
    for job in ("a1", "a2"):
        assert await _send(router, job, "close", scope="A") == "delivered"
    made = await worker.flush_due()
    # Two slots: B has none active, A has one; B's first, then A's first (A: 1 + 1,
    # B: 0 + 2, ties to the older).
    assert [(r.scope, r.key) for r in made if r.delivered] == [("B", "b1"), ("A", "a4")]


@pytest.mark.asyncio
async def test_a_make_that_fails_is_logged_backed_off_and_made_later(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    resolver = StaticResolver({"job": _chart()})
    router = router_db.router([HITS, CLOSES], resolver=resolver, caps={"job": Cap(1)})
    await _send(router, "a")
    await _send(router, "b")
    await _send(router, "a", "close")
    # The chart is gone when the slot frees: the make fails, and is tried again later.
    broken = router_db.router([HITS, CLOSES], resolver=StaticResolver({}), caps={"job": Cap(1)})
    worker = FlowWorker(broken, retry=timedelta(seconds=30))
    with caplog.at_level(logging.ERROR, "statifier.router.flow_worker"):
        (failed,) = await worker.flush_due(now=START)
    assert failed.error is not None
    assert "UnresolvedDocument" in failed.error
    assert "making its held create failed (1 in a row), tried again in 30 s" in caplog.text
    assert await worker.flush_due(now=START + timedelta(seconds=10)) == []  # backing off
    assert await FlowWorker(router).held_creates() == (1, 1)
    (made,) = await FlowWorker(router).flush_due()
    assert (made.key, made.delivered, made.error) == ("b", 1, None)


@pytest.mark.asyncio
async def test_concurrent_creates_never_pass_the_cap(
    pg_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """Twenty routers (one connection each) race to create forty jobs under a cap of
    five: at most five are ever live, and every job is made once, in the end."""
    cap = Cap(5)
    routers = [_router(pg_db, cap) for _ in range(4)]
    jobs = [f"j{index}" for index in range(40)]

    async def send(index: int) -> str:
        return await _send(routers[index % len(routers)], jobs[index])

    said = await asyncio.gather(*(send(index) for index in range(len(jobs))))
    assert said.count("created_and_delivered") == 5
    assert said.count("buffered") == 35
    router = routers[0]
    worker = FlowWorker(router)
    closed: set[str] = set()
    while len(closed) < len(jobs):
        assert await _live(router) <= 5
        opened = [job for job in jobs if job not in closed and await _hits(router, job)]
        for job in opened[:3]:
            assert await _send(router, job, "close") == "delivered"
            closed.add(job)
        await asyncio.gather(*(FlowWorker(each).flush_due() for each in routers))
    assert await worker.held_creates() == (0, 0)
    for job in jobs:
        assert len(await _hits(router, job)) == 1


def test_a_cap_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="max_active is an integer from 1 to 1000000"):
        Cap(0)
    with pytest.raises(ConfigError, match="per is one of scope, document"):
        Cap(1, per="tenant")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cap 'job': unknown key 'max'"):
        Cap.from_mapping("job", {"max": 1})
    with pytest.raises(ConfigError, match="cap 'job': over is one of hold, drop"):
        Cap.from_mapping("job", {"max_active": 1, "over": "queue"})
