"""Routing on both databases: every outcome and what it leaves in the router's tables,
the create modes, dedupe and its horizon, the ledger, caller transactions, errors
(which are never outcomes), batches, the host's own deliveries, the reapers, the pin
source and the host hooks."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection
from tests.router.conftest import RouterDb, impression_bindings, join_chart

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions
from statifier.expr import Value
from statifier.persistence import Discarded, Executions, Status, Stepped
from statifier.router import (
    AddressPins,
    Binding,
    BlockedByEarlierFailure,
    Create,
    CreatedAndDelivered,
    Dedupe,
    Delivered,
    Dropped,
    DropReason,
    Duplicate,
    Entry,
    ExecutionParked,
    Failed,
    InboundEvent,
    KeyRefused,
    LedgerRow,
    NoMatch,
    Plan,
    Resolved,
    Routed,
    Router,
    RouterConfig,
    StaticResolver,
    UnresolvedDocument,
    address,
    ledger,
    reap_addresses,
    reap_dedupe,
    reap_ledger,
)
from statifier.sql import migrations

SCOPE = "tenant_a"
IMPRESSIONS = "impressions_to_join"
CLICKS = "clicks_to_join"

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="ticks" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open">
      <assign location="ticks" expr="ticks + 1"/>
    </transition>
  </state>
</scxml>"""
"""A meter that takes every tick (a self-transition), so each delivery is ``delivered``."""

TICKS = Binding(
    id="ticks",
    source="meter",
    match="event.kind == 'tick'",
    key="event.meter",
    document="counter",
    event="tick",
    data=("n",),
    dedupe=Dedupe(timedelta(minutes=10)),
)

CURSED = Binding(
    id="curses",
    source="ad_events",
    match="event.kind == 'cursed'",
    key="event.impression_id",
    document="cursed",
    event="curse.cast",
)
"""A binding whose document the default resolver names no chart for: its creates fail."""


class Minter:
    """Execution ids ``ex_1``, ``ex_2``, ... in the order the router asks for them, so
    expected outcomes can be spelled out."""

    def __init__(self) -> None:
        self.minted = 0

    def __call__(self, scope: str, document: str, key: str) -> str:
        self.minted += 1
        return f"ex_{self.minted}"


def configure(db: RouterDb, bindings: list[Binding], **options: object) -> Router:
    """``db.router`` with the counter chart beside the join and predictable ids."""
    options.setdefault(
        "resolver", StaticResolver({"join": join_chart(), "counter": compile_chart(COUNTER)})
    )
    options.setdefault("execution_id", Minter())
    return db.router(bindings, **options)


def ad(
    message_id: str, kind: str, impression_id: str | None = None, **extra: Value
) -> InboundEvent:
    data: dict[str, Value] = {"kind": kind, **extra}
    if impression_id is not None:
        data["impression_id"] = impression_id
    return InboundEvent(scope=SCOPE, source="ad_events", message_id=message_id, data=data)


def tick(message_id: str, meter: str, n: int = 0) -> InboundEvent:
    return InboundEvent(
        scope=SCOPE,
        source="meter",
        message_id=message_id,
        data={"kind": "tick", "meter": meter, "n": n},
    )


def table_rows(db: RouterDb, name: str) -> list[dict[str, Any]]:
    """Every row of one of the database's tables (read on a connection of its own)."""
    table: sa.Table = getattr(db.store.tables, name)
    engine = sa.create_engine(migrations.sync_url(db.store.url))
    try:
        with engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(sa.select(table))]
    finally:
        engine.dispose()


def counts(db: RouterDb) -> dict[str, int]:
    """How many rows each table the router writes holds."""
    names = ("routing_ledger", "addresses", "dedupe", "executions", "inputs")
    return {name: len(table_rows(db, name)) for name in names}


async def executions_count(router: Router) -> int:
    return len(await router.adapter.list_by_metadata({}))


async def logged(router: Router, execution_id: str) -> list[Event | None]:
    """The events in an execution's input log, in order."""
    return [entry.event for entry in await Executions(router.storage).inputs(execution_id)]


def spelled(rows: list[LedgerRow]) -> list[tuple[str, str | None, str | None, str]]:
    return [(row.binding_id, row.message_id, row.execution_id, row.spelled) for row in rows]


# --- every outcome --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_impression_creates_the_execution_and_a_click_is_delivered_to_it(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings())
    opened = await router.route(ad("m1", "impression", "imp_1", shown_at=1))
    clicked = await router.route(ad("m2", "click", "imp_1", url="u"))
    assert opened.outcomes == (
        CreatedAndDelivered(IMPRESSIONS, key="imp_1", execution_id="ex_1"),
        NoMatch(CLICKS),
    )
    assert clicked.outcomes == (
        NoMatch(IMPRESSIONS),
        Delivered(CLICKS, key="imp_1", execution_id="ex_1"),
    )
    assert await logged(router, "ex_1") == [
        Event("impression.served", data={"impression_id": "imp_1", "shown_at": 1}),
        Event("click.recorded", data={"impression_id": "imp_1", "url": "u"}),
    ]


@pytest.mark.asyncio
async def test_an_execution_the_router_mints_an_id_for_falls_in_its_addresss_bucket(
    router_db: RouterDb,
) -> None:
    router = router_db.router(
        impression_bindings(),
        resolver=StaticResolver({"join": join_chart(), "counter": compile_chart(COUNTER)}),
    )
    opened = await router.route(ad("m1", "impression", "imp_1", shown_at=1))
    created = opened.outcomes[0]
    assert isinstance(created, CreatedAndDelivered)
    assert bucket_of(created.execution_id) == address_bucket(SCOPE, "join", "imp_1")


@pytest.mark.asyncio
async def test_a_redelivered_message_is_a_duplicate_and_changes_nothing(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings())
    await router.route(ad("m1", "impression", "imp_1"))
    again = await router.route(ad("m1", "impression", "imp_1"))
    assert again.outcomes == (Duplicate(IMPRESSIONS, key="imp_1"), NoMatch(CLICKS))
    assert await executions_count(router) == 1
    assert len(await logged(router, "ex_1")) == 1
    assert counts(router_db)["routing_ledger"] == 2


@pytest.mark.asyncio
async def test_an_event_no_binding_matches_is_never_written(router_db: RouterDb) -> None:
    """``no_match`` is counted, not recorded: the ledger would otherwise grow with
    every event of a busy source that no binding wants."""
    router = configure(router_db, impression_bindings())
    routed = await router.route(ad("m1", "view", "imp_1"))
    assert routed.outcomes == (NoMatch(IMPRESSIONS), NoMatch(CLICKS))
    assert counts(router_db) == dict.fromkeys(counts(router_db), 0)


@pytest.mark.asyncio
async def test_an_event_of_another_source_gets_no_outcome(router_db: RouterDb) -> None:
    router = configure(router_db, impression_bindings())
    routed = await router.route(
        InboundEvent(scope=SCOPE, source="elsewhere", message_id="m1", data={"kind": "impression"}),
    )
    assert routed.outcomes == ()


@pytest.mark.asyncio
async def test_a_disabled_binding_is_never_evaluated(router_db: RouterDb) -> None:
    router = configure(router_db, impression_bindings(enabled=False, key="1/0"))
    routed = await router.route(ad("m1", "click", "imp_1"))
    assert routed.outcomes == (NoMatch(IMPRESSIONS),)


@pytest.mark.parametrize(
    ("clicks", "event", "reason"),
    [
        ({"match": "event.kind"}, ad("m1", "click", "imp_1"), "match value: string 'click'"),
        ({"match": "len(5) > 0"}, ad("m1", "click", "imp_1"), "match error: EvaluationError"),
        ({}, ad("m1", "click"), "key value: undefined"),
        ({"key": "event.impression_id::integer"}, ad("m1", "click", "x"), "key value: undefined"),
        ({"key": "event.n"}, ad("m1", "click", "imp_1", n=7), "key value: integer 7"),
    ],
    ids=["match-value", "match-error", "key-undefined", "key-cast", "key-number"],
)
@pytest.mark.asyncio
async def test_a_refused_match_or_key_is_in_the_ledger_with_its_reason(
    router_db: RouterDb, clicks: dict[str, Any], event: InboundEvent, reason: str
) -> None:
    router = configure(router_db, impression_bindings(**clicks))
    routed = await router.route(event)
    refused = routed.outcomes[1]
    assert isinstance(refused, KeyRefused)
    assert refused.binding_id == CLICKS
    assert refused.reason.startswith(reason)
    (row,) = await ledger(router)
    assert (row.binding_id, row.message_id, row.outcome, row.reason) == (
        CLICKS,
        "m1",
        "key_refused",
        refused.reason,
    )
    assert (row.scope, row.source, row.document, row.key, row.execution_id) == (
        SCOPE,
        "ad_events",
        "join",
        None,
        None,
    )
    # A refusal claims nothing: once the program is fixed, a redelivery is routed.
    assert counts(router_db) | {"routing_ledger": 0} == dict.fromkeys(counts(router_db), 0)


@pytest.mark.asyncio
async def test_never_creating_a_missing_execution_is_dropped_no_execution(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings(create="never"))
    routed = await router.route(ad("m1", "click", "imp_9"))
    assert routed.outcomes == (
        NoMatch(IMPRESSIONS),
        Dropped(CLICKS, reason=DropReason.NO_EXECUTION, key="imp_9"),
    )
    assert routed.outcomes[1].outcome == "dropped: no_execution"
    assert await address(router, SCOPE, "join", "imp_9") is None
    assert await executions_count(router) == 0
    assert spelled(await ledger(router)) == [(CLICKS, "m1", None, "dropped: no_execution")]


@pytest.mark.asyncio
async def test_a_late_event_after_the_finish_is_dropped_and_never_reopens(
    router_db: RouterDb,
) -> None:
    """The address keeps naming the ended execution, stamped when its end was first
    seen; neither a late click nor a late impression (whose binding would create)
    starts a new one."""
    router = configure(router_db, impression_bindings())
    await router.route(ad("m1", "impression", "imp_1"))
    finished_at = router_db.clock.advance(timedelta(seconds=1))
    await router.route(ad("m2", "click", "imp_1"))
    router_db.clock.advance(timedelta(minutes=5))
    late_click = await router.route(ad("m3", "click", "imp_1"))
    late_impression = await router.route(ad("m4", "impression", "imp_1"))
    assert late_click.outcomes[1] == Dropped(
        CLICKS, reason=DropReason.FINISHED, key="imp_1", execution_id="ex_1"
    )
    assert late_impression.outcomes[0] == Dropped(
        IMPRESSIONS, reason=DropReason.FINISHED, key="imp_1", execution_id="ex_1"
    )
    assert late_click.outcomes[1].outcome == "dropped: finished"
    row = await address(router, SCOPE, "join", "imp_1")
    assert row is not None
    assert (row.execution_id, row.terminal_seen_at) == ("ex_1", finished_at)
    assert await executions_count(router) == 1
    assert len(await logged(router, "ex_1")) == 2


@pytest.mark.asyncio
async def test_an_event_that_selects_no_transition_is_dropped_but_logged(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings())
    await router.route(ad("m1", "impression", "imp_1", shown_at=1))
    second = await router.route(ad("m2", "impression", "imp_1", shown_at=2))
    assert second.outcomes[0] == Dropped(
        IMPRESSIONS, reason=DropReason.UNMATCHED_EVENT, key="imp_1", execution_id="ex_1"
    )
    assert second.outcomes[0].outcome == "dropped: unmatched_event"
    assert await logged(router, "ex_1") == [
        Event("impression.served", data={"impression_id": "imp_1", "shown_at": 1}),
        Event("impression.served", data={"impression_id": "imp_1", "shown_at": 2}),
    ]


@pytest.mark.asyncio
async def test_a_created_execution_that_takes_no_transition_is_dropped_unmatched(
    router_db: RouterDb,
) -> None:
    """A click first: its binding creates the join, which waits for an impression."""
    router = configure(router_db, impression_bindings())
    routed = await router.route(ad("m1", "click", "imp_1"))
    assert routed.outcomes[1] == Dropped(
        CLICKS, reason=DropReason.UNMATCHED_EVENT, key="imp_1", execution_id="ex_1"
    )
    row = await address(router, SCOPE, "join", "imp_1")
    assert row is not None
    assert row.execution_id == "ex_1"
    assert [event.name for event in await logged(router, "ex_1") if event] == ["click.recorded"]


# --- the create modes -----------------------------------------------------------------

OPENER = Binding(
    id="opener",
    source="setup",
    match="true",
    key="event.key",
    document="join",
    event="setup.opened",
)
"""Creates a waiting join under a key (the event itself selects nothing)."""


def under_test(mode: Create) -> Binding:
    return Binding(
        id="tested",
        source="test",
        match="true",
        key="event.key",
        document="join",
        event="impression.served",
        create=mode,
    )


@pytest.mark.parametrize(
    ("mode", "before", "outcome", "created", "addressed"),
    [
        (Create.IF_ABSENT, "none", "created_and_delivered", True, "new"),
        (Create.IF_ABSENT, "active", "delivered", False, "existing"),
        (Create.IF_ABSENT, "terminal", "dropped: finished", False, "existing"),
        (Create.NEVER, "none", "dropped: no_execution", False, None),
        (Create.NEVER, "active", "delivered", False, "existing"),
        (Create.NEVER, "terminal", "dropped: finished", False, "existing"),
        (Create.ALWAYS_NEW, "none", "created_and_delivered", True, None),
        (Create.ALWAYS_NEW, "active", "created_and_delivered", True, "existing"),
        (Create.ALWAYS_NEW, "terminal", "created_and_delivered", True, "existing"),
    ],
)
@pytest.mark.asyncio
async def test_the_create_mode_decides_what_a_delivery_reaches(
    router_db: RouterDb,
    mode: Create,
    before: str,
    outcome: str,
    created: bool,
    addressed: str | None,
) -> None:
    """``before`` is what the address names when the tested binding's event arrives:
    nothing, a waiting execution, or one that has ended (cancelled behind the router's
    back). ``addressed`` is what the address row names afterwards."""
    router = configure(router_db, [OPENER, under_test(mode)])
    existing: str | None = None
    if before != "none":
        opened = await router.route(
            InboundEvent(scope=SCOPE, source="setup", message_id="open", data={"key": "k"})
        )
        existing = "ex_1"
        assert opened.outcomes == (
            Dropped("opener", reason=DropReason.UNMATCHED_EVENT, key="k", execution_id=existing),
        )
    if before == "terminal":
        assert existing is not None
        await Executions(router.storage).cancel(existing)
    executions_before = await executions_count(router)

    routed = await router.route(
        InboundEvent(scope=SCOPE, source="test", message_id="m1", data={"key": "k"})
    )

    (answer,) = routed.outcomes
    assert answer.outcome == outcome
    assert await executions_count(router) == executions_before + (1 if created else 0)
    reached = getattr(answer, "execution_id", None)
    if created:
        assert reached is not None
        assert reached != existing
    elif outcome != "dropped: no_execution":
        assert reached == existing
    row = await address(router, SCOPE, "join", "k")
    expected = {None: None, "new": reached, "existing": existing}[addressed]
    assert (row.execution_id if row else None) == expected
    if before == "terminal" and mode is not Create.ALWAYS_NEW:
        # The router saw the end first: the address's horizon counts from now.
        assert row is not None
        assert row.terminal_seen_at == router_db.clock.now


@pytest.mark.asyncio
async def test_always_new_creates_one_execution_per_delivery_and_no_address(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, [under_test(Create.ALWAYS_NEW)])
    answers = [
        (
            await router.route(
                InboundEvent(scope=SCOPE, source="test", message_id=f"m{n}", data={"key": "k"}),
            )
        ).outcomes
        for n in range(3)
    ]
    assert answers == [
        (CreatedAndDelivered("tested", key="k", execution_id="ex_1"),),
        (CreatedAndDelivered("tested", key="k", execution_id="ex_2"),),
        (CreatedAndDelivered("tested", key="k", execution_id="ex_3"),),
    ]
    assert await executions_count(router) == 3
    assert table_rows(router_db, "addresses") == []
    # It still deduplicates: a redelivery creates nothing.
    again = await router.route(
        InboundEvent(scope=SCOPE, source="test", message_id="m0", data={"key": "k"})
    )
    assert again.outcomes == (Duplicate("tested", key="k"),)
    assert await executions_count(router) == 3


# --- dedupe ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_message_id_is_a_duplicate_only_within_the_horizon(router_db: RouterDb) -> None:
    """An expired claim counts as absent even before the reaper removes it, and the
    redelivery claims it again for a new horizon."""
    router = configure(router_db, [TICKS])
    horizon = TICKS.dedupe.horizon
    first = await router.route(tick("m1", "meter_1"))
    router_db.clock.advance(horizon - timedelta(milliseconds=1))
    inside = await router.route(tick("m1", "meter_1"))
    router_db.clock.advance(timedelta(milliseconds=1))
    after = await router.route(tick("m1", "meter_1"))
    router_db.clock.advance(horizon - timedelta(milliseconds=1))
    reclaimed = await router.route(tick("m1", "meter_1"))
    assert [routed.outcomes for routed in (first, inside, after, reclaimed)] == [
        (CreatedAndDelivered("ticks", key="meter_1", execution_id="ex_1"),),
        (Duplicate("ticks", key="meter_1"),),
        (Delivered("ticks", key="meter_1", execution_id="ex_1"),),
        (Duplicate("ticks", key="meter_1"),),
    ]
    assert len(await logged(router, "ex_1")) == 2


@pytest.mark.asyncio
async def test_dedupe_is_per_binding(router_db: RouterDb) -> None:
    """Two bindings may each deliver one message once."""
    other = replace(TICKS, id="ticks_again", document="counter")
    router = configure(router_db, [TICKS, other])
    routed = await router.route(tick("m1", "meter_1"))
    assert [answer.outcome for answer in routed.outcomes] == ["created_and_delivered", "delivered"]


@pytest.mark.asyncio
async def test_reap_dedupe_deletes_only_expired_claims(router_db: RouterDb) -> None:
    router = configure(router_db, [TICKS])
    horizon = TICKS.dedupe.horizon
    start = router_db.clock.now
    await router.route(tick("m1", "meter_1"))
    router_db.clock.advance(horizon / 2)
    await router.route(tick("m2", "meter_1"))

    assert await reap_dedupe(router, start + horizon) == 0
    assert await reap_dedupe(router, start + horizon + timedelta(milliseconds=1)) == 1
    assert [row["message_id"] for row in table_rows(router_db, "dedupe")] == ["m2"]
    assert await reap_dedupe(router, start + horizon + timedelta(milliseconds=1)) == 0
    assert await reap_dedupe(router, start + horizon * 2) == 1
    assert table_rows(router_db, "dedupe") == []


@pytest.mark.asyncio
async def test_a_claim_falls_in_its_address_bucket_and_reapers_of_ranges_take_their_own(
    router_db: RouterDb,
) -> None:
    # A claim carries its address's bucket, routed alone or in a batch; reapers of
    # complementary ranges delete each expired claim once, none of the other range's.
    router = configure(router_db, [TICKS])
    meters = [f"meter_{n}" for n in range(8)]
    for n, meter in enumerate(meters[:4]):
        await router.route(tick(f"m{n}", meter))
    await router.route_many([tick(f"m{n}", meter) for n, meter in enumerate(meters) if n >= 4])
    bucket = {meter: address_bucket(SCOPE, TICKS.document, meter) for meter in meters}
    rows = table_rows(router_db, "dedupe")
    assert {row["message_id"]: row["bucket"] for row in rows} == {
        f"m{n}": bucket[meter] for n, meter in enumerate(meters)
    }
    middle = sorted(bucket.values())[3] + 1  # four claims below, four at or above
    later = router_db.clock.now + TICKS.dedupe.horizon + timedelta(milliseconds=1)
    assert await reap_dedupe(router, later, buckets=(0, middle)) == 4
    kept = {row["message_id"] for row in table_rows(router_db, "dedupe")}
    assert kept == {f"m{n}" for n, meter in enumerate(meters) if bucket[meter] >= middle}
    assert await reap_dedupe(router, later, buckets=(0, middle)) == 0
    assert await reap_dedupe(router, later, buckets=(middle, 1024)) == 4
    assert table_rows(router_db, "dedupe") == []
    with pytest.raises(ValueError, match="buckets is a range"):
        await reap_dedupe(router, later, buckets=(0, 1025))


@pytest.mark.asyncio
async def test_a_ledger_row_falls_in_its_claims_bucket_and_is_reaped_by_its_range(
    router_db: RouterDb,
) -> None:
    # A delivery's ledger row falls in the bucket of its dedupe claim (its address's),
    # routed alone or in a batch; a duplicate's too. Reapers of complementary ranges
    # delete the rows written before their time, each row once.
    router = configure(router_db, [TICKS])
    start = router_db.clock.now
    meters = [f"meter_{n}" for n in range(6)]
    for n, meter in enumerate(meters[:3]):
        await router.route(tick(f"m{n}", meter))
    await router.route_many([tick(f"m{n}", meter) for n, meter in enumerate(meters) if n >= 3])
    await router.route(tick("m0", meters[0]))  # a duplicate
    claims = {row["message_id"]: row["bucket"] for row in table_rows(router_db, "dedupe")}
    ledger = [(row["message_id"], row["bucket"]) for row in table_rows(router_db, "routing_ledger")]
    assert len(ledger) == 7
    assert all(bucket == claims[message_id] for message_id, bucket in ledger)
    middle = sorted(claims.values())[2] + 1  # three addresses below, three at or above
    assert await reap_ledger(router, start, buckets=(0, middle)) == 0  # none before start
    later = router_db.clock.now + timedelta(milliseconds=1)
    below = sum(bucket < middle for _, bucket in ledger)
    assert below in (3, 4)  # the duplicate's row falls with its message's first
    assert await reap_ledger(router, later, buckets=(0, middle)) == below
    kept = {row["message_id"] for row in table_rows(router_db, "routing_ledger")}
    assert kept == {message_id for message_id, bucket in claims.items() if bucket >= middle}
    pages = [await reap_ledger(router, later, buckets=(middle, 1024), limit=2) for _ in range(3)]
    assert pages == ([2, 2, 0] if below == 3 else [2, 1, 0])
    assert table_rows(router_db, "routing_ledger") == []
    with pytest.raises(ValueError, match="buckets is a range"):
        await reap_ledger(router, later, buckets=(0, 1025))
    with pytest.raises(ValueError, match="limit is a positive number"):
        await reap_ledger(router, later, limit=0)
    with pytest.raises(ValueError, match="timezone-aware"):
        await reap_ledger(router, later.replace(tzinfo=None))


@pytest.mark.asyncio
async def test_reap_dedupe_deletes_a_backlog_in_pages_of_its_limit(router_db: RouterDb) -> None:
    router = configure(router_db, [TICKS])
    await router.route_many([tick(f"m{n}", f"meter_{n}") for n in range(7)])
    later = router_db.clock.now + TICKS.dedupe.horizon + timedelta(milliseconds=1)
    assert [await reap_dedupe(router, later, limit=3) for _ in range(4)] == [3, 3, 1, 0]
    assert table_rows(router_db, "dedupe") == []
    with pytest.raises(ValueError, match="limit is a positive number"):
        await reap_dedupe(router, later, limit=0)


# --- the ledger -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_ledger_holds_one_row_per_recorded_outcome_in_order(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings())
    start = router_db.clock.now
    events = [
        ad("m1", "impression", "imp_1"),
        ad("m2", "click"),
        ad("m3", "view", "imp_1"),
        ad("m4", "click", "imp_1"),
        ad("m5", "click", "imp_1"),
        ad("m4", "click", "imp_1"),
    ]
    for event in events:
        await router.route(event)
        router_db.clock.advance(timedelta(seconds=1))
    rows = await ledger(router)
    assert [
        (row.binding_id, row.message_id, row.key, row.execution_id, row.outcome, row.reason)
        for row in rows
    ] == [
        (IMPRESSIONS, "m1", "imp_1", "ex_1", "created_and_delivered", None),
        (CLICKS, "m2", None, None, "key_refused", "key value: undefined"),
        (CLICKS, "m4", "imp_1", "ex_1", "delivered", None),
        (CLICKS, "m5", "imp_1", "ex_1", "dropped", "finished"),
        (CLICKS, "m4", "imp_1", None, "duplicate", None),
    ]
    assert [row.inserted_at for row in rows] == [
        start + timedelta(seconds=n) for n in (0, 1, 3, 4, 5)
    ]
    assert {(row.scope, row.source, row.document) for row in rows} == {(SCOPE, "ad_events", "join")}
    assert [row.message_id for row in await ledger(router, "ex_1")] == ["m1", "m4", "m5"]


@pytest.mark.asyncio
async def test_rows_written_at_one_moment_keep_their_order(router_db: RouterDb) -> None:
    """On a clock that does not move, the ledger still reads in the order written."""
    router = configure(
        router_db, [TICKS, replace(TICKS, id="ticks_2"), replace(TICKS, id="ticks_3")]
    )
    await router.route(tick("m1", "meter_1"))
    await router.route(tick("m2", "meter_1"))
    assert [(row.message_id, row.binding_id) for row in await ledger(router)] == [
        ("m1", "ticks"),
        ("m1", "ticks_2"),
        ("m1", "ticks_3"),
        ("m2", "ticks"),
        ("m2", "ticks_2"),
        ("m2", "ticks_3"),
    ]


# --- the caller's transaction ---------------------------------------------------------

Connection = sa.Connection | AsyncConnection


@asynccontextmanager
async def caller_transaction(router: Router) -> AsyncIterator[Connection]:
    """A transaction the caller began on a connection of the adapter's engine."""
    engine = router.adapter.engine
    if isinstance(engine, sa.Engine):
        with engine.connect() as connection:
            connection.begin()
            yield connection
        return
    async with engine.connect() as own:
        await own.begin()
        yield own


async def end(connection: Connection, commit: bool) -> None:
    if isinstance(connection, sa.Connection):
        connection.commit() if commit else connection.rollback()
    elif commit:
        await connection.commit()
    else:
        await connection.rollback()


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.asyncio
async def test_routing_in_a_callers_transaction_ends_with_it(
    router_db: RouterDb, commit: bool
) -> None:
    """Everything a delivery writes (claim, address, execution, input log, ledger) is
    in the caller's transaction: its commit keeps all of it, its rollback none."""
    router = configure(router_db, impression_bindings())
    async with caller_transaction(router) as connection:
        opened = await router.route(ad("m1", "impression", "imp_1"), connection=connection)
        clicked = await router.route(ad("m2", "click", "imp_1"), connection=connection)
        # Inside the transaction the second event already sees the first's address.
        assert clicked.outcomes[1] == Delivered(CLICKS, key="imp_1", execution_id="ex_1")
        assert opened.outcomes[0] == CreatedAndDelivered(
            IMPRESSIONS, key="imp_1", execution_id="ex_1"
        )
        await end(connection, commit)
    kept = {"routing_ledger": 2, "addresses": 1, "dedupe": 2, "executions": 1, "inputs": 2}
    assert counts(router_db) == (kept if commit else dict.fromkeys(kept, 0))


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
@pytest.mark.asyncio
async def test_a_batch_in_a_callers_transaction_ends_with_it(
    router_db: RouterDb, commit: bool
) -> None:
    router = configure(router_db, impression_bindings())
    async with caller_transaction(router) as connection:
        answers = await router.route_many(
            [ad("m1", "impression", "imp_1"), ad("m2", "impression", "imp_2")],
            connection=connection,
        )
        assert all(isinstance(answer, Routed) for answer in answers)
        await end(connection, commit)
    assert counts(router_db)["executions"] == (2 if commit else 0)
    assert counts(router_db)["routing_ledger"] == (2 if commit else 0)


# --- errors are not outcomes ----------------------------------------------------------


def failing_resolver(scope: str, document: str) -> Resolved:
    raise RuntimeError("the chart store is down")


@pytest.mark.asyncio
async def test_a_resolver_that_raises_is_unresolved_document_and_writes_nothing(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings(), resolver=failing_resolver)
    with pytest.raises(UnresolvedDocument) as error:
        await router.route(ad("m1", "impression", "imp_1"))
    assert (error.value.scope, error.value.document) == (SCOPE, "join")
    assert error.value.reason == "RuntimeError: the chart store is down"
    assert counts(router_db) == dict.fromkeys(counts(router_db), 0)


@pytest.mark.asyncio
async def test_a_failing_binding_leaves_the_earlier_bindings_delivery_committed(
    router_db: RouterDb,
) -> None:
    """Two bindings take an impression; the second's document has no chart. The first
    delivery committed in its own transaction; the second left nothing, not even its
    claim, so a redelivery tries it again (and the first is then a duplicate)."""
    cursed = replace(CURSED, match="event.kind == 'impression'")
    router = configure(router_db, [impression_bindings()[0], cursed])
    for _ in range(2):
        with pytest.raises(UnresolvedDocument, match="'cursed'"):
            await router.route(ad("m1", "impression", "imp_1"))
    assert spelled(await ledger(router)) == [
        (IMPRESSIONS, "m1", "ex_1", "created_and_delivered"),
        (IMPRESSIONS, "m1", None, "duplicate"),
    ]
    assert [row["binding_id"] for row in table_rows(router_db, "dedupe")] == [IMPRESSIONS]
    assert [row["document"] for row in table_rows(router_db, "addresses")] == ["join"]
    assert await executions_count(router) == 1


# --- batches --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_poisoned_event_fails_alone_and_blocks_only_its_address(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, [*impression_bindings(), CURSED])
    batch = [
        ad("m1", "impression", "imp_1"),
        ad("m2", "cursed", "imp_2"),
        ad("m3", "impression", "imp_3"),
        ad("m4", "cursed", "imp_2"),
        ad("m5", "click", "imp_1"),
        ad("m6", "impression", "imp_2"),
    ]
    answers = await router.route_many(batch)

    assert [answer.event.message_id for answer in answers] == ["m1", "m2", "m3", "m4", "m5", "m6"]
    poisoned, blocked = answers[1], answers[3]
    assert isinstance(poisoned, Failed)
    assert isinstance(poisoned.error, UnresolvedDocument)
    assert isinstance(blocked, Failed)
    assert isinstance(blocked.error, BlockedByEarlierFailure)
    assert blocked.error.message_id == "m2"
    delivered = [answer for answer in answers if isinstance(answer, Routed)]
    assert [
        [o.outcome for o in answer.outcomes if o.outcome != "no_match"] for answer in delivered
    ] == [
        ["created_and_delivered"],
        ["created_and_delivered"],
        ["delivered"],
        # imp_2 of the join is another address than imp_2 of the cursed document.
        ["created_and_delivered"],
    ]
    assert [row.message_id for row in await ledger(router)] == ["m1", "m3", "m5", "m6"]
    assert {row["message_id"] for row in table_rows(router_db, "dedupe")} == {
        "m1",
        "m3",
        "m5",
        "m6",
    }
    assert sorted((row["document"], row["key"]) for row in table_rows(router_db, "addresses")) == [
        ("join", "imp_1"),
        ("join", "imp_2"),
        ("join", "imp_3"),
    ]
    # The batch was settled set-based first, then again one event at a time: ids are
    # minted anew, so imp_1's execution is read from its answer.
    first = answers[0]
    assert isinstance(first, Routed)
    created = first.outcomes[0]
    assert isinstance(created, CreatedAndDelivered)
    imp_1 = created.execution_id
    assert [event.name for event in await logged(router, imp_1) if event] == [
        "impression.served",
        "click.recorded",
    ]


@pytest.mark.asyncio
async def test_a_batch_keeps_each_keys_order(router_db: RouterDb) -> None:
    router = configure(router_db, [TICKS])
    batch = [
        tick("m1", "meter_a", 1),
        tick("m2", "meter_b", 1),
        tick("m3", "meter_a", 2),
        tick("m4", "meter_a", 3),
        tick("m5", "meter_b", 2),
    ]
    answers = await router.route_many(batch)
    assert all(isinstance(answer, Routed) for answer in answers)
    meter_a = await address(router, SCOPE, "counter", "meter_a")
    meter_b = await address(router, SCOPE, "counter", "meter_b")
    assert meter_a is not None
    assert meter_b is not None
    assert [e.data for e in await logged(router, meter_a.execution_id) if e] == [
        {"n": 1},
        {"n": 2},
        {"n": 3},
    ]
    assert [e.data for e in await logged(router, meter_b.execution_id) if e] == [{"n": 1}, {"n": 2}]


@pytest.mark.asyncio
async def test_a_batch_answers_a_duplicate_within_itself(router_db: RouterDb) -> None:
    router = configure(router_db, [TICKS])
    answers = await router.route_many([tick("m1", "meter_a"), tick("m1", "meter_a")])
    assert [answer.outcomes for answer in answers if isinstance(answer, Routed)] == [
        (CreatedAndDelivered("ticks", key="meter_a", execution_id="ex_1"),),
        (Duplicate("ticks", key="meter_a"),),
    ]


# --- deliver_event --------------------------------------------------------------------

FAILURES = Plan(id="basichttp_failure", document="join", create=Create.NEVER)


@pytest.mark.asyncio
async def test_deliver_event_reaches_an_existing_address_once(router_db: RouterDb) -> None:
    """A host job's answer coming back: claimed and recorded under the plan's id."""
    router = configure(router_db, impression_bindings())
    await router.route(ad("m1", "impression", "imp_1"))
    click = Event("click.recorded", data={"url": "u"})

    async def deliver(key: str, message_id: str) -> object:
        return await router.deliver_event(
            FAILURES, scope=SCOPE, key=key, event=click, message_id=message_id
        )

    assert await deliver("imp_1", "job-1") == Delivered(
        "basichttp_failure", key="imp_1", execution_id="ex_1"
    )
    assert await deliver("imp_1", "job-1") == Duplicate("basichttp_failure", key="imp_1")
    assert await deliver("imp_404", "job-2") == Dropped(
        "basichttp_failure", reason=DropReason.NO_EXECUTION, key="imp_404"
    )
    assert await logged(router, "ex_1") == [
        Event("impression.served", data={"impression_id": "imp_1"}),
        click,
    ]
    rows = [row for row in await ledger(router) if row.binding_id == "basichttp_failure"]
    assert [(row.message_id, row.key, row.spelled, row.source) for row in rows] == [
        ("job-1", "imp_1", "delivered", None),
        ("job-1", "imp_1", "duplicate", None),
        ("job-2", "imp_404", "dropped: no_execution", None),
    ]


@pytest.mark.asyncio
async def test_deliver_event_in_a_rolled_back_callers_transaction_leaves_nothing(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings())
    await router.route(ad("m1", "impression", "imp_1"))
    before = counts(router_db)
    async with caller_transaction(router) as connection:
        delivered = await router.deliver_event(
            FAILURES,
            scope=SCOPE,
            key="imp_1",
            event=Event("click.recorded"),
            message_id="job-1",
            connection=connection,
        )
        assert delivered == Delivered("basichttp_failure", key="imp_1", execution_id="ex_1")
        await end(connection, commit=False)
    assert counts(router_db) == before


# --- reap_addresses -------------------------------------------------------------------


async def open_joins(router: Router, keys: list[str], cancel: bool) -> list[str]:
    """One waiting join per key (through ``OPENER``), cancelled behind the router's back
    when ``cancel``; answers their execution ids."""
    ids = []
    for key in keys:
        routed = await router.route(
            InboundEvent(scope=SCOPE, source="setup", message_id=f"open-{key}", data={"key": key}),
        )
        execution_id = getattr(routed.outcomes[0], "execution_id", None)
        assert isinstance(execution_id, str)
        if cancel:
            await Executions(router.storage).cancel(execution_id)
        ids.append(execution_id)
    return ids


@pytest.mark.asyncio
async def test_a_finished_address_is_stamped_then_deleted_after_the_documents_horizon(
    router_db: RouterDb,
) -> None:
    """The horizon is the longest of the enabled bindings naming the document (3h here:
    not the opener's 1h, not the disabled binding's 10h), counted from the first time
    the end was seen."""
    opener = replace(OPENER, dedupe=Dedupe(timedelta(hours=1)))
    longer = replace(under_test(Create.NEVER), dedupe=Dedupe(timedelta(hours=3)))
    disabled = replace(under_test(Create.NEVER), id="off", dedupe=Dedupe(timedelta(hours=10)))
    router = configure(router_db, [opener, longer, replace(disabled, enabled=False)])
    await open_joins(router, ["k"], cancel=True)
    seen = router_db.clock.advance(timedelta(minutes=1))

    first = await reap_addresses(router, seen)
    assert (first.examined, first.stamped, first.deleted, first.next) == (1, 1, 0, None)
    row = await address(router, SCOPE, "join", "k")
    assert row is not None
    assert row.terminal_seen_at == seen

    early = await reap_addresses(router, seen + timedelta(hours=3) - timedelta(seconds=1))
    assert (early.examined, early.stamped, early.deleted) == (1, 0, 0)
    assert await address(router, SCOPE, "join", "k") is not None

    due = await reap_addresses(router, seen + timedelta(hours=3))
    assert (due.examined, due.stamped, due.deleted) == (1, 0, 1)
    assert await address(router, SCOPE, "join", "k") is None


@pytest.mark.asyncio
async def test_a_document_no_binding_names_has_no_horizon(router_db: RouterDb) -> None:
    router = configure(router_db, [OPENER])
    await open_joins(router, ["k"], cancel=True)
    reaped = await reap_addresses(router, router_db.clock.now, bindings=[TICKS])
    assert (reaped.examined, reaped.stamped, reaped.deleted) == (1, 1, 1)
    assert table_rows(router_db, "addresses") == []


@pytest.mark.asyncio
async def test_an_active_executions_address_is_never_deleted(router_db: RouterDb) -> None:
    router = configure(router_db, [OPENER])
    await open_joins(router, ["k"], cancel=False)
    far = router_db.clock.advance(timedelta(days=1000))
    for bindings in ([OPENER], []):
        reaped = await reap_addresses(router, far, bindings=bindings)
        assert (reaped.examined, reaped.stamped, reaped.deleted) == (1, 0, 0)
    row = await address(router, SCOPE, "join", "k")
    assert row is not None
    assert row.terminal_seen_at is None


@pytest.mark.parametrize("rows", [4, 5])
@pytest.mark.asyncio
async def test_paging_visits_every_address_once(router_db: RouterDb, rows: int) -> None:
    router = configure(router_db, [OPENER])
    await open_joins(router, [f"k{n}" for n in range(rows)], cancel=True)
    pages = []
    after: Any = None
    while True:
        page = await reap_addresses(router, router_db.clock.now, limit=2, after=after)
        pages.append((page.examined, page.stamped, page.deleted))
        if page.next is None:
            break
        after = page.next
    expected = [(2, 2, 0), (2, 2, 0), (0, 0, 0)] if rows == 4 else [(2, 2, 0), (2, 2, 0), (1, 1, 0)]
    assert pages == expected
    assert all(row["terminal_seen_at"] is not None for row in table_rows(router_db, "addresses"))


@pytest.mark.asyncio
async def test_reapers_of_complementary_ranges_page_through_their_buckets_addresses_alone(
    router_db: RouterDb,
) -> None:
    # A part of the buckets is paged by (bucket, id): every address of the range once,
    # none of another range, whatever the page size.
    router = configure(router_db, [OPENER])
    keys = [f"k{n}" for n in range(9)]
    await open_joins(router, keys, cancel=True)
    bucket = {key: address_bucket(SCOPE, "join", key) for key in keys}
    middle = sorted(bucket.values())[4] + 1  # five keys below, four at or above

    def stamped() -> set[str]:
        rows = table_rows(router_db, "addresses")
        return {row["key"] for row in rows if row["terminal_seen_at"] is not None}

    swept: list[set[str]] = []
    for buckets in ((0, middle), (middle, 1024)):
        before, after = stamped(), None
        while True:
            page = await reap_addresses(
                router, router_db.clock.now, limit=2, after=after, buckets=buckets
            )
            assert page.deleted == 0
            if page.next is None:
                break
            after = page.next
        swept.append(stamped() - before)
    assert swept == [
        {key for key in keys if bucket[key] < middle},
        {key for key in keys if bucket[key] >= middle},
    ]
    with pytest.raises(ValueError, match="buckets is a range"):
        await reap_addresses(router, router_db.clock.now, buckets=(3, 3))


@pytest.mark.asyncio
async def test_reap_addresses_refuses_what_it_cannot_compute(router_db: RouterDb) -> None:
    router = configure(router_db, [OPENER])
    with pytest.raises(ValueError, match="limit"):
        await reap_addresses(router, router_db.clock.now, limit=0)
    resolved = RouterConfig(
        router.storage, bindings_resolver=lambda scope: [OPENER], resolver=router.config.resolver
    )
    with pytest.raises(ValueError, match="pass bindings"):
        await reap_addresses(Router(resolved), router_db.clock.now)


# --- pins -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_address_pins_count_the_address_rows_naming_the_executions(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, [OPENER, under_test(Create.ALWAYS_NEW)])
    first, second = await open_joins(router, ["k1", "k2"], cancel=False)
    unaddressed = await router.route(
        InboundEvent(scope=SCOPE, source="test", message_id="m1", data={"key": "k3"})
    )
    third = getattr(unaddressed.outcomes[0], "execution_id", None)
    assert isinstance(third, str)
    content_hash = join_chart().identity.content_hash
    pins = AddressPins(router)
    assert await pins.pins(content_hash, [first, second, third, "ex_unknown"]) == {"addresses": 2}
    assert await pins.pins(content_hash, [second]) == {"addresses": 1}
    assert await pins.pins(content_hash, [third]) == {"addresses": 0}
    assert await pins.pins(content_hash, []) == {"addresses": 0}


# --- host hooks -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_on_create_and_on_step_stand_in_with_the_same_arguments(
    router_db: RouterDb,
) -> None:
    creates: list[tuple[Executions, str, Machine, StartOptions]] = []
    steps: list[tuple[Executions, str, Machine | None, Event]] = []

    async def on_create(
        executions: Executions, execution_id: str, machine: Machine, options: StartOptions
    ) -> Stepped:
        creates.append((executions, execution_id, machine, options))
        return await executions.create(execution_id, machine, options=options)

    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        steps.append((executions, execution_id, machine, event))
        return await executions.step(execution_id, machine, event)

    options = StartOptions(round_budget=50)
    router = configure(
        router_db,
        impression_bindings(),
        on_create=on_create,
        on_step=on_step,
        start_options=options,
    )
    await router.route(ad("m1", "impression", "imp_1"))
    await router.route(ad("m2", "click", "imp_1"))

    # The options as configured, with the send types the router handles stamped on.
    assert router.config.chart_start_options.round_budget == 50
    assert [(execution_id, machine, opts) for _, execution_id, machine, opts in creates] == [
        ("ex_1", join_chart(), router.config.chart_start_options)
    ]
    assert [(execution_id, machine, event) for _, execution_id, machine, event in steps] == [
        ("ex_1", join_chart(), Event("impression.served", data={"impression_id": "imp_1"})),
        # An existing execution is stepped on its stored chart (no chart resolver).
        ("ex_1", None, Event("click.recorded", data={"impression_id": "imp_1"})),
    ]
    assert all(isinstance(call[0], Executions) for call in [*creates, *steps])


async def ended_create(
    executions: Executions, execution_id: str, machine: Machine, options: StartOptions
) -> Stepped:
    """Creates, and answers the execution as ended (the stored one stays active)."""
    created = await executions.create(execution_id, machine, options=options)
    return replace(created, execution=replace(created.execution, status=Status.CANCELLED))


def discarding(status: Status | None) -> Any:
    """An ``on_step`` answering ``Discarded`` without stepping: the stored record, or
    that record with ``status``."""

    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        record = await executions.storage.fetch_execution(execution_id)
        return Discarded(record if status is None else replace(record, status=status))

    return on_step


@pytest.mark.asyncio
async def test_a_create_answered_as_ended_is_dropped_finished_and_never_stepped(
    router_db: RouterDb,
) -> None:
    steps: list[str] = []

    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        steps.append(execution_id)
        return await executions.step(execution_id, machine, event)

    router = configure(router_db, impression_bindings(), on_create=ended_create, on_step=on_step)
    routed = await router.route(ad("m1", "impression", "imp_1"))
    assert routed.outcomes[0] == Dropped(
        IMPRESSIONS, reason=DropReason.FINISHED, key="imp_1", execution_id="ex_1"
    )
    assert steps == []
    assert await logged(router, "ex_1") == []
    row = await address(router, SCOPE, "join", "imp_1")
    assert row is not None
    assert row.terminal_seen_at == router_db.clock.now


@pytest.mark.asyncio
async def test_a_step_answered_as_discarded_on_an_ended_record_is_dropped_finished(
    router_db: RouterDb,
) -> None:
    router = configure(router_db, impression_bindings(), on_step=discarding(Status.CANCELLED))
    routed = await router.route(ad("m1", "impression", "imp_1"))
    assert routed.outcomes[0] == Dropped(
        IMPRESSIONS, reason=DropReason.FINISHED, key="imp_1", execution_id="ex_1"
    )
    assert await logged(router, "ex_1") == []
    row = await address(router, SCOPE, "join", "imp_1")
    assert row is not None
    assert row.terminal_seen_at == router_db.clock.now


@pytest.mark.asyncio
async def test_a_step_answered_as_discarded_on_an_active_record_is_parked_and_rolled_back(
    router_db: RouterDb,
) -> None:
    """Discarded while active means parked: an error, so the event is not lost."""
    router = configure(router_db, impression_bindings(), on_step=discarding(None))
    with pytest.raises(ExecutionParked, match="'ex_1'"):
        await router.route(ad("m1", "impression", "imp_1"))
    assert counts(router_db) == dict.fromkeys(counts(router_db), 0)


@pytest.mark.asyncio
async def test_around_delivery_wraps_each_route_once(router_db: RouterDb) -> None:
    """Called once per ``route`` under the event's scope, with the route entry; the
    deliveries run inside it (the resolver sees what it set)."""
    calls: list[tuple[str, Entry]] = []
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="outside")
    resolved_in: list[str] = []
    static = StaticResolver({"join": join_chart()})

    async def around(scope: str, entry: Entry, work: Any) -> Any:
        calls.append((scope, entry))
        token = tenant.set(scope)
        try:
            return await work()
        finally:
            tenant.reset(token)

    def resolver(scope: str, document: str) -> Resolved:
        resolved_in.append(tenant.get())
        return static(scope, document)

    router = configure(router_db, impression_bindings(), around_delivery=around, resolver=resolver)
    first = await router.route(ad("m1", "impression", "imp_1"))
    assert calls == [(SCOPE, Entry.ROUTE)]
    assert first.outcomes[0] == CreatedAndDelivered(IMPRESSIONS, key="imp_1", execution_id="ex_1")
    assert resolved_in == [SCOPE]
    await router.route(ad("m2", "click", "imp_1"))
    assert calls == [(SCOPE, Entry.ROUTE), (SCOPE, Entry.ROUTE)]
