"""Debounce, batch and throttle bindings on each database: what is held, when it is
delivered and as what, in each key's order, once; duplicates held once; a flush that
fails recorded on its group and retried; workers given ranges of buckets flushing
their range's groups alone; two workers sharing the groups."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
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
from tests.router.test_races import counter_chart
from tests.router.test_route import table_rows

from statifier import telemetry
from statifier.buckets import BUCKETS, address_bucket
from statifier.core.positions import load_event
from statifier.persistence import Storage
from statifier.router import (
    Binding,
    Buffered,
    Duplicate,
    FlowWorker,
    InboundEvent,
    Router,
    RouterConfig,
    StaticResolver,
    address,
    ledger,
)

START = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)
"""The clock of :class:`~tests.router.conftest.RouterDb` starts here."""


def _binding(**mode: Any) -> Binding:
    return Binding(
        id="hits",
        source="clicks",
        match="true",
        key="event.user",
        document="counter",
        event="hit",
        data=("user", "n"),
        **mode,
    )


def _router(db: RouterDb, binding: Binding) -> Router:
    return db.router([binding], resolver=StaticResolver({"counter": counter_chart()}))


def _resolving(db: RouterDb, bindings: Callable[[str], Awaitable[list[Binding]]]) -> Router:
    """A router asking ``bindings`` for the bindings of each scope."""
    storage = Storage(db.adapter, clock=db.clock)
    resolver = StaticResolver({"counter": counter_chart()})
    return Router(RouterConfig(storage, bindings_resolver=bindings, resolver=resolver))


def _event(user: str, n: int) -> InboundEvent:
    return InboundEvent(
        scope="t", source="clicks", message_id=f"{user}-{n}", data={"user": user, "n": n}
    )


async def _send(router: Router, user: str, n: int, at: datetime) -> str:
    routed = await router.route(_event(user, n), now=at)
    return routed.outcomes[0].outcome


async def _inputs(router: Router, user: str) -> list[dict[str, Any]]:
    """The data of every event the user's execution stepped with, in order."""
    found = await address(router, "t", "counter", user)
    if found is None:
        return []
    entries = await router.storage.inputs(found.execution_id)
    return [dict(load_event(entry.event or b"").data) for entry in entries]


async def _outcomes(router: Router) -> list[tuple[str | None, str]]:
    return [(row.message_id, row.outcome) for row in await ledger(router)]


def _at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


@pytest.mark.asyncio
async def test_debounce_delivers_the_last_event_with_the_count_after_the_quiet_window(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, _binding(mode="debounce", window=timedelta(seconds=30)))
    worker = FlowWorker(router)
    said = [await _send(router, "ada", n, _at(n * 10)) for n in range(3)]
    assert said == ["buffered"] * 3
    assert await worker.totals() == (1, 3)
    assert await worker.next_due() == _at(50)
    assert await worker.flush_due(now=_at(49)) == []
    flushed = await worker.flush_due(now=_at(50))
    assert [(report.key, report.delivered, report.error) for report in flushed] == [
        ("ada", 3, None)
    ]
    assert await _inputs(router, "ada") == [{"user": "ada", "n": 2, "count": 3}]
    assert await _outcomes(router) == [
        ("ada-0", "buffered"),
        ("ada-1", "buffered"),
        ("ada-2", "buffered"),
        ("ada-2", "created_and_delivered"),
    ]
    assert await worker.totals() == (0, 0)
    assert await worker.next_due() is None
    # A later burst starts again, and goes to the same execution.
    assert await _send(router, "ada", 3, _at(100)) == "buffered"
    await worker.flush_due(now=_at(130))
    assert (await _inputs(router, "ada"))[-1] == {"user": "ada", "n": 3, "count": 1}


@pytest.mark.asyncio
async def test_debounce_max_wait_bounds_a_burst_that_never_pauses(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    binding = _binding(
        mode="debounce", window=timedelta(seconds=30), max_wait=timedelta(seconds=60)
    )
    router = _router(router_db, binding)
    worker = FlowWorker(router)
    for n in range(6):  # every 20 s: never 30 s quiet
        await _send(router, "ada", n, _at(n * 20))
    # Due 60 s after the first (at 60), not 30 s after the last (at 130).
    assert await worker.next_due() == _at(60)
    await worker.flush_due(now=_at(100))
    assert await _inputs(router, "ada") == [{"user": "ada", "n": 5, "count": 6}]


@pytest.mark.asyncio
async def test_batch_delivers_when_full_in_the_filling_events_transaction(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, _binding(mode="batch", batch=3, window=timedelta(seconds=10)))
    said = [await _send(router, "ada", n, _at(n)) for n in range(4)]
    assert said == ["buffered", "buffered", "created_and_delivered", "buffered"]
    assert await _inputs(router, "ada") == [
        {"events": [{"user": "ada", "n": 0}, {"user": "ada", "n": 1}, {"user": "ada", "n": 2}]}
    ]
    worker = FlowWorker(router)
    # The fourth waits for its window: 10 s after it came.
    assert await worker.next_due() == _at(13)
    await worker.flush_due(now=_at(13))
    assert (await _inputs(router, "ada"))[-1] == {"events": [{"user": "ada", "n": 3}]}
    assert await worker.totals() == (0, 0)


@pytest.mark.asyncio
async def test_throttle_lets_batch_through_each_window_and_the_rest_wait_in_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    binding = _binding(mode="throttle", batch=2, window=timedelta(minutes=1))
    router = _router(router_db, binding)
    worker = FlowWorker(router)
    said = [await _send(router, "ada", n, _at(n)) for n in range(5)]
    assert said == ["created_and_delivered", "delivered", "buffered", "buffered", "buffered"]
    # Another key has its own window.
    assert await _send(router, "bob", 0, _at(5)) == "created_and_delivered"
    assert [entry["n"] for entry in await _inputs(router, "ada")] == [0, 1]
    assert await worker.flush_due(now=_at(59)) == []
    flushed = await worker.flush_due(now=_at(60))
    assert [(report.key, report.delivered) for report in flushed] == [("ada", 2)]
    assert [entry["n"] for entry in await _inputs(router, "ada")] == [0, 1, 2, 3]
    # The window the flush opened is full: a new event waits behind the one held.
    assert await _send(router, "ada", 5, _at(61)) == "buffered"
    await worker.flush_due(now=_at(120))
    assert [entry["n"] for entry in await _inputs(router, "ada")] == [0, 1, 2, 3, 4, 5]
    # The window that delivered them closes with nothing held: the group goes.
    await worker.flush_due(now=_at(180))
    assert await worker.next_due() is None
    assert await _send(router, "ada", 6, _at(181)) == "delivered"
    rows = await _outcomes(router)
    assert rows.count(("ada-2", "buffered")) == 1
    assert rows.count(("ada-2", "delivered")) == 1


@pytest.mark.asyncio
async def test_a_held_event_redelivered_is_a_duplicate_and_held_once(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, _binding(mode="batch", batch=5, window=timedelta(seconds=10)))
    first = await router.route(_event("ada", 0), now=_at(0))
    again = await router.route(_event("ada", 0), now=_at(1))
    assert first.outcomes == (Buffered("hits", key="ada"),)
    assert again.outcomes == (Duplicate("hits", key="ada"),)
    await FlowWorker(router).flush_due(now=_at(10))
    assert await _inputs(router, "ada") == [{"events": [{"user": "ada", "n": 0}]}]


@pytest.mark.asyncio
async def test_a_held_events_claim_falls_in_its_address_bucket(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # A held event's claim is made as any other's: in its address's bucket, which a
    # dedupe reaper given a range deletes by.
    router = _router(router_db, _binding(mode="batch", batch=5, window=timedelta(seconds=10)))
    await router.route(_event("ada", 0), now=_at(0))
    await router.route_many([_event("bob", 0), _event("cy", 0)], now=_at(0))
    claims = {row["message_id"]: row["bucket"] for row in table_rows(router_db, "dedupe")}
    assert claims == {
        f"{user}-0": address_bucket("t", "counter", user) for user in ("ada", "bob", "cy")
    }


@pytest.mark.asyncio
async def test_route_many_holds_and_fills_batches_in_each_keys_order(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, _binding(mode="batch", batch=2, window=timedelta(seconds=10)))
    events = [_event(user, n) for n in range(3) for user in ("ada", "bob")]
    answers = await router.route_many(events, now=_at(0))
    said = [answer.outcomes[0].outcome for answer in answers]  # type: ignore[union-attr]
    assert said == [
        "buffered",
        "buffered",
        "created_and_delivered",
        "created_and_delivered",
        "buffered",
        "buffered",
    ]
    await FlowWorker(router).flush_due(now=_at(10))
    for user in ("ada", "bob"):
        batches = await _inputs(router, user)
        assert [[entry["n"] for entry in batch["events"]] for batch in batches] == [[0, 1], [2]]


@pytest.mark.asyncio
async def test_a_flush_whose_binding_is_gone_is_recorded_retried_and_then_delivered(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    binding = _binding(mode="debounce", window=timedelta(seconds=5))
    bindings: list[Binding] = [binding]

    async def current(scope: str) -> list[Binding]:
        return list(bindings)

    router = _resolving(router_db, current)
    await _send(router, "ada", 0, _at(0))
    bindings.clear()
    worker = FlowWorker(router, retry=timedelta(seconds=30))
    seen: list[dict[str, object]] = []
    telemetry.attach(
        "flow-test", "statifier.router.flow", lambda n, m, meta: seen.append(dict(meta))
    )
    try:
        with caplog.at_level(logging.ERROR, "statifier.router.flow_worker"):
            flushed = await worker.flush_due(now=_at(5))
    finally:
        telemetry.detach("flow-test")
    assert [report.error for report in flushed] == [
        (
            "BindingGone: binding 'hits' is not an enabled binding of scope 't': "
            "its 1 held event wait for it"
        )
    ]
    assert "delivering its 1 held event failed (1 in a row), tried again in 30 s" in caplog.text
    assert [meta["error"] for meta in seen] == [flushed[0].error]
    [group] = await worker.groups()
    assert (group.failures, group.held, group.due_at) == (1, 1, _at(35))
    assert group.last_error == flushed[0].error
    bindings.append(binding)
    assert await worker.flush_due(now=_at(20)) == []  # not due until the backoff ends
    flushed = await worker.flush_due(now=_at(35))
    assert [(report.delivered, report.error) for report in flushed] == [(1, None)]
    assert await _inputs(router, "ada") == [{"user": "ada", "n": 0, "count": 1}]


@pytest.mark.asyncio
async def test_a_failure_not_recorded_because_the_group_changed_is_still_logged(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flush fails, and an arrival changes the group before the failure is recorded
    (the race this stages by hand): the group is left as the arrival made it, and the
    failure is logged all the same."""
    binding = _binding(mode="debounce", window=timedelta(seconds=5))

    async def current(scope: str) -> list[Binding]:
        return [binding]

    router = _resolving(router_db, current)
    await _send(router, "ada", 0, _at(0))
    worker = FlowWorker(router, retry=timedelta(seconds=30))
    [before] = await worker.groups()
    await _send(router, "ada", 1, _at(1))  # the arrival, after the flush took the group
    with caplog.at_level(logging.ERROR, "statifier.router.flow_worker"):
        await worker._failed(before, "ConnectionError: the sink went away", _at(5))
    said = "(not recorded: the group changed meanwhile): ConnectionError: the sink went away"
    assert said in caplog.text
    [after] = await worker.groups()
    assert (after.failures, after.held, after.last_error) == (0, 2, None)


@pytest.mark.asyncio
async def test_a_binding_turned_to_each_delivers_what_it_held_one_by_one(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    held = _binding(mode="batch", batch=10, window=timedelta(seconds=10))
    bindings = [held]

    async def current(scope: str) -> list[Binding]:
        return list(bindings)

    router = _resolving(router_db, current)
    for n in range(3):
        await _send(router, "ada", n, _at(n))
    bindings[0] = _binding()
    await FlowWorker(router).flush_due(now=_at(10))
    assert [entry["n"] for entry in await _inputs(router, "ada")] == [0, 1, 2]


@pytest.mark.asyncio
async def test_workers_given_bucket_ranges_flush_their_ranges_groups_alone(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    router = _router(router_db, _binding(mode="debounce", window=timedelta(seconds=30)))
    users = [f"u{n}" for n in range(16)]
    half = BUCKETS // 2
    low = [u for u in users if address_bucket("t", "counter", u) < half]
    high = [u for u in users if u not in low]
    assert low  # the addresses fall on both sides
    assert high
    for n, user in enumerate(users):
        assert await _send(router, user, n, _at(n * 0.1)) == "buffered"
    first = FlowWorker(router, buckets=(0, half))
    second = FlowWorker(router, buckets=(half, BUCKETS))
    assert await first.next_due() is not None
    flushed = await first.flush_due(now=_at(60))
    assert sorted(report.key for report in flushed) == sorted(low)
    assert await first.next_due() is None  # nothing left in its range
    assert await second.next_due() is not None
    assert await second.totals() == (len(high), len(high))  # the totals are every range's
    flushed = await second.flush_due(now=_at(60))
    assert sorted(report.key for report in flushed) == sorted(high)
    for user in users:
        assert len(await _inputs(router, user)) == 1, user
    for wrong in ((0, 0), (-1, 4), (512, 1025)):
        with pytest.raises(ValueError, match="buckets is a range"):
            FlowWorker(router, buckets=wrong)


@pytest.mark.asyncio
async def test_two_workers_deliver_each_group_once(
    pg_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    binding = _binding(mode="debounce", window=timedelta(seconds=1))
    router = _router(pg_db, binding)
    users = [f"u{index}" for index in range(40)]
    for user in users:
        for n in range(3):
            await _send(router, user, n, _at(0))
    workers = [FlowWorker(_router(pg_db, binding)) for _ in range(2)]
    reports = await asyncio.gather(*(worker.flush_due(now=_at(5)) for worker in workers))
    flushed = sorted(report.key for made in reports for report in made)
    assert flushed == sorted(users)
    for user in users:
        assert await _inputs(router, user) == [{"user": user, "n": 2, "count": 3}]
