"""The console's read side, on SQLite and PostgreSQL: what the durable API and the
router write reads back; pages walk every row once, newest first, under every filter;
counts per bucket match a count made by hand; bad cursors and sizes are refused."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.console.conftest import ConsoleDb

from scriba.sql.tables import define_tables
from statifier.buckets import address_bucket, bucket_of
from statifier.chart import compile_chart
from statifier.console.queries import (
    MAX_DETAIL_ROWS,
    MAX_PAGE,
    MAX_STEP_KEYS,
    BadCursor,
    ConsoleQueries,
    ErrorView,
    ExecutionFilter,
    ExecutionSummary,
    LedgerFilter,
    Page,
    StepRows,
    encode_cursor,
)
from statifier.core import Event
from statifier.persistence import Executions, Status, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, InboundEvent, Router, RouterConfig, StaticResolver
from statifier.sql.dialect import execution_lock_key

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">
  <datamodel><data id="total" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paid">
      <assign location="total" expr="_event.data.amount"/>
    </transition>
  </state>
  <state id="paid"><transition event="ship" target="shipped"/></state>
  <final id="shipped"/>
</scxml>"""


def _execution(index: int, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "execution_id": f"ex-{index:04d}",
        "content_hash": "h-a",
        "status": "active",
        "position_blob": None,
        "metadata": {},
        "outcome_blob": None,
        "failure": None,
        "created_at": T0 + timedelta(seconds=index // 3),  # three share each second
        "updated_at": T0 + timedelta(seconds=index),
        "ended_at": None,
        "error_count": 0,
        "last_error_at": None,
        "final_state": None,
    }
    row.update(fields)
    row["bucket"] = bucket_of(row["execution_id"])
    return row


def _charts() -> list[dict[str, Any]]:
    return [
        {"content_hash": h, "chart_blob": b"<scxml/>", "name": name, "version": "1", "saved_at": T0}
        for h, name in (("h-a", "order"), ("h-b", "order"), ("h-c", "parcel"))
    ]


def _newest_first(rows: list[dict[str, Any]]) -> list[str]:
    ordered = sorted(rows, key=lambda r: (r["created_at"], r["execution_id"]), reverse=True)
    return [r["execution_id"] for r in ordered]


async def _walk(queries: ConsoleQueries, where: ExecutionFilter, size: int) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page: Page[ExecutionSummary] = await queries.executions(where, cursor=cursor, size=size)
        assert len(page.rows) <= size
        seen.extend(row.id for row in page.rows)
        if page.next_cursor is None:
            return seen
        assert len(page.rows) == size
        cursor = page.next_cursor


def _seed_executions(db: ConsoleDb) -> list[dict[str, Any]]:
    t = db.store.tables
    chooser = random.Random(7)
    rows = []
    for index in range(60):
        status = chooser.choice(["active", "active", "completed", "failed", "cancelled"])
        rows.append(
            _execution(
                index,
                content_hash=chooser.choice(["h-a", "h-b", "h-c"]),
                status=status,
                failure="boom" if status == "failed" else None,
                metadata={"tenant": chooser.choice(["t1", "t2"]), "zone": chooser.choice("xy")},
            )
        )
    db.insert(t.charts, _charts())
    db.insert(t.executions, rows)
    db.insert(
        t.addresses,
        [
            {
                "scope": "eu" if i % 2 else "us",
                "document": "order",
                "key": f"k{i}",
                "execution_id": rows[i]["execution_id"],
                "inserted_at": T0,
                "bucket": address_bucket("eu" if i % 2 else "us", "order", f"k{i}"),
            }
            for i in range(0, 60, 3)
        ],
    )
    return rows


async def test_what_the_durable_api_and_the_router_write_reads_back(console_db: ConsoleDb) -> None:
    machine = compile_chart(ORDER)
    async with SqlAdapter(console_db.store.url, console_db.store.tables) as adapter:
        storage = Storage(adapter)
        executions = Executions(storage, lock_wait=5.0)
        await executions.create("order-1", machine, metadata={"tenant": "t<1>"})
        await executions.step("order-1", machine, Event("pay", data={"amount": 12}))
        config = RouterConfig(
            storage,
            bindings=[
                Binding(
                    id="pay_orders",
                    source="shop",
                    match="event.kind == 'pay'",
                    key="event.order",
                    document="order",
                    event="pay",
                    data=("amount",),
                )
            ],
            resolver=StaticResolver({"order": machine}),
        )
        router = Router(config)
        await router.route(
            InboundEvent(
                scope="eu", source="shop", message_id="m-1", data={"kind": "pay", "order": "o-9"}
            ),
        )
        await router.route(
            InboundEvent(
                scope="eu", source="shop", message_id="m-2", data={"kind": "pay", "order": "o-9"}
            ),
        )
    queries = console_db.queries
    page = await queries.executions(ExecutionFilter(metadata={"tenant": "t<1>"}))
    assert [(row.id, row.status, row.document) for row in page.rows] == [
        ("order-1", Status.ACTIVE, None)
    ]
    detail = await queries.execution("order-1")
    assert detail is not None
    assert detail.record.status is Status.ACTIVE
    assert detail.record.metadata == {"tenant": "t<1>"}
    assert detail.chart is not None
    assert detail.chart.source is not None
    assert [(i.seq, i.via) for i in detail.inputs] == [(0, "step")]
    stepped = detail.inputs[0].event
    assert stepped is not None
    assert (stepped.name, stepped.data) == ("pay", {"amount": 12})
    assert not detail.inputs_truncated
    assert await queries.execution("nobody") is None
    # The router created an execution for key o-9 in scope eu and wrote its ledger.
    (address,) = await queries.addresses("o-9")
    assert (address.scope, address.document, address.status) == ("eu", "order", Status.ACTIVE)
    routed = await queries.execution(address.execution_id)
    assert routed is not None
    assert [row.outcome for row in routed.ledger] == ["dropped", "created_and_delivered"]
    assert [a.key for a in routed.addresses] == ["o-9"]
    in_scope = await queries.executions(ExecutionFilter(scope="eu"))
    assert [row.id for row in in_scope.rows] == [address.execution_id]
    ledger = await queries.ledger()
    assert [row.message_id for row in ledger.rows] == ["m-2", "m-1"]
    assert ledger.next_cursor is None


async def test_pages_walk_every_execution_once_newest_first(console_db: ConsoleDb) -> None:
    rows = _seed_executions(console_db)
    for size in (1, 7, 60, MAX_PAGE):
        assert await _walk(console_db.queries, ExecutionFilter(), size) == _newest_first(rows)


@pytest.mark.parametrize(
    ("where", "keep"),
    [
        (ExecutionFilter(status=Status.FAILED), lambda r: r["status"] == "failed"),
        (ExecutionFilter(document="order"), lambda r: r["content_hash"] in ("h-a", "h-b")),
        (ExecutionFilter(document="parcel"), lambda r: r["content_hash"] == "h-c"),
        (ExecutionFilter(document="nothing"), lambda r: False),
        (
            ExecutionFilter(metadata={"tenant": "t1", "zone": "x"}),
            lambda r: r["metadata"] == {"tenant": "t1", "zone": "x"},
        ),
        (ExecutionFilter(metadata={"tenant": "t3"}), lambda r: False),
        (
            ExecutionFilter(status=Status.ACTIVE, metadata={"zone": "y"}),
            lambda r: r["status"] == "active" and r["metadata"]["zone"] == "y",
        ),
        (
            ExecutionFilter(
                created_from=T0 + timedelta(seconds=5), created_until=T0 + timedelta(seconds=9)
            ),
            lambda r: T0 + timedelta(seconds=5) <= r["created_at"] < T0 + timedelta(seconds=9),
        ),
        (
            ExecutionFilter(updated_from=T0 + timedelta(seconds=50)),
            lambda r: r["updated_at"] >= T0 + timedelta(seconds=50),
        ),
    ],
)
async def test_filters_choose_what_they_say(
    console_db: ConsoleDb, where: ExecutionFilter, keep: Any
) -> None:
    rows = _seed_executions(console_db)
    expected = _newest_first([r for r in rows if keep(r)])
    assert await _walk(console_db.queries, where, 4) == expected


async def test_scope_chooses_the_executions_addressed_there(console_db: ConsoleDb) -> None:
    rows = _seed_executions(console_db)
    expected = _newest_first([r for i, r in enumerate(rows) if i % 3 == 0 and i % 2])
    assert await _walk(console_db.queries, ExecutionFilter(scope="eu"), 3) == expected
    failed = await console_db.queries.failed(size=MAX_PAGE)
    assert {row.id for row in failed.rows} == {r["execution_id"] for r in rows if r["failure"]}
    assert {row.failure for row in failed.rows} == {"boom"}


async def test_bad_cursors_and_sizes_are_refused(console_db: ConsoleDb) -> None:
    queries = console_db.queries
    for cursor in ("", "garbage", encode_cursor("ledger", T0, 1), "eyJ4IjoxfQ"):
        with pytest.raises(BadCursor):
            await queries.executions(cursor=cursor)
    with pytest.raises(BadCursor):
        await queries.ledger(cursor=encode_cursor("ledger", T0, "not-a-number"))
    for size in (0, MAX_PAGE + 1, -3):
        with pytest.raises(ValueError, match="a page holds"):
            await queries.executions(size=size)
    with pytest.raises(ValueError, match="timezone-aware"):
        ExecutionFilter(created_from=datetime(2026, 1, 1))  # noqa: DTZ001 - naive on purpose
    with pytest.raises(ValueError, match="strings"):
        ExecutionFilter(metadata={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="timezone-aware"):
        LedgerFilter(since=datetime(2026, 1, 1))  # noqa: DTZ001 - naive on purpose


def _ledger_rows(count: int) -> list[dict[str, Any]]:
    chooser = random.Random(11)
    return [
        {
            "binding_id": chooser.choice(["b1", "b2", "b3"]),
            "message_id": f"m{i}",
            "scope": "eu",
            "source": "shop",
            "outcome": chooser.choice(["delivered", "created", "unmatched", "failed"]),
            "reason": None,
            "document": "order",
            "key": f"k{i % 10}",
            "execution_id": f"ex-{i % 10:04d}",
            "inserted_at": T0 + timedelta(seconds=chooser.randrange(0, 3600), microseconds=i),
            "bucket": address_bucket("eu", "order", f"k{i % 10}"),
        }
        for i in range(count)
    ]


async def test_the_ledger_pages_by_outcome_and_counts_by_bucket(console_db: ConsoleDb) -> None:
    rows = _ledger_rows(300)
    console_db.insert(console_db.store.tables.routing_ledger, rows)
    queries = console_db.queries
    for where in (LedgerFilter(), LedgerFilter(outcome="failed"), LedgerFilter(binding_id="b2")):
        seen: list[str | None] = []
        cursor = None
        while True:
            page = await queries.ledger(where, cursor=cursor, size=17)
            seen.extend(row.message_id for row in page.rows)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        chosen = [
            r
            for r in rows
            if where.outcome in (None, r["outcome"]) and where.binding_id in (None, r["binding_id"])
        ]
        chosen.sort(key=lambda r: r["inserted_at"], reverse=True)  # times are distinct
        assert seen == [r["message_id"] for r in chosen]
    since, until = T0 + timedelta(minutes=5), T0 + timedelta(minutes=50)
    window = await queries.ledger(LedgerFilter(since=since, until=until), size=MAX_PAGE)
    assert {r.message_id for r in window.rows} == {
        r["message_id"] for r in rows if since <= r["inserted_at"] < until
    }
    counts = await queries.ledger_counts(since, until, timedelta(minutes=10))
    expected: dict[tuple[str, datetime, str], int] = {}
    for r in rows:
        if since <= r["inserted_at"] < until:
            start = since + (r["inserted_at"].replace(microsecond=0) - since) // timedelta(
                minutes=10
            ) * timedelta(minutes=10)
            key = (r["binding_id"], start, r["outcome"])
            expected[key] = expected.get(key, 0) + 1
    assert {(c.binding_id, c.bucket, c.outcome): c.count for c in counts} == expected
    assert [(c.binding_id, c.bucket, c.outcome) for c in counts] == sorted(expected)


async def test_bad_windows_are_refused(console_db: ConsoleDb) -> None:
    queries = console_db.queries
    cases = [
        (T0, T0, timedelta(minutes=1), "after"),
        (T0, T0 + timedelta(days=1), timedelta(milliseconds=500), "whole number"),
        (T0, T0 + timedelta(days=1), timedelta(seconds=1.5), "whole number"),
        (T0, T0 + timedelta(days=30), timedelta(minutes=1), "at most"),
        (
            datetime(2026, 1, 1),  # noqa: DTZ001 - naive on purpose
            T0,
            timedelta(minutes=1),
            "timezone-aware",
        ),
    ]
    for since, until, bucket, message in cases:
        with pytest.raises(ValueError, match=message):
            await queries.ledger_counts(since, until, bucket)


async def test_dead_letters_page_newest_first(console_db: ConsoleDb) -> None:
    t = console_db.store.tables
    outbox: list[dict[str, Any]] = [
        {
            "queue": "mail",
            "key": f"k{i}",
            "payload": {"event": "{}", "execution_id": "ex-0001" if i % 2 else "ex-0002"},
            "execution_id": "ex-0001" if i % 2 else "ex-0002",
            "bucket": bucket_of("ex-0001" if i % 2 else "ex-0002"),
            "attempts": 3,
            "next_attempt_at": T0,
            "dead_at": T0 + timedelta(minutes=i) if i % 3 else None,
            "last_error": f"refused <{i}>",
            "inserted_at": T0 + timedelta(seconds=i),
        }
        for i in range(20)
    ]
    console_db.insert(t.outbox, outbox)
    letters = [
        {
            "source": "orders",
            "partition": "0",
            "position": i,
            "message_id": None if i == 3 else f"m{i}",
            "reason": "malformed: not JSON",
            "raw": b"\x00\x01",
            "dead_at": T0 + timedelta(seconds=i // 2),
        }
        for i in range(9)
    ]
    console_db.insert(t.consumer_dead_letters, letters)
    queries = console_db.queries
    first = await queries.outbox_dead_letters(size=5)
    second = await queries.outbox_dead_letters(size=50, cursor=first.next_cursor)
    keys = [row.key for row in (*first.rows, *second.rows)]
    dead = sorted((r for r in outbox if r["dead_at"]), key=lambda r: r["dead_at"], reverse=True)
    assert keys == [r["key"] for r in dead]
    assert second.next_cursor is None
    assert (first.rows[0].last_error, first.rows[0].attempts) == ("refused <19>", 3)
    walked: list[int] = []
    cursor = None
    while True:
        page = await queries.consumer_dead_letters(size=2, cursor=cursor)
        walked.extend(row.position for row in page.rows)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert walked == [8, 7, 6, 5, 4, 3, 2, 1, 0]  # ties in dead_at by key, descending
    detail_rows = [{**_execution(1), "execution_id": "ex-0001"}]
    console_db.insert(t.executions, detail_rows)
    detail = await queries.execution("ex-0001")
    assert detail is not None
    assert sorted(row.key for row in detail.outbox) == sorted(
        r["key"] for r in outbox if r["payload"]["execution_id"] == "ex-0001"
    )


async def test_timers_of_an_execution_soonest_first(console_db: ConsoleDb) -> None:
    t = console_db.store.tables
    console_db.insert(t.executions, [_execution(1)])
    console_db.insert(
        t.timers,
        [
            {
                "execution_id": "ex-0001",
                "send_id": f"s{i}",
                "dedup_key": f"d{i}",
                "lock_key": execution_lock_key("ex-0001"),
                "bucket": bucket_of("ex-0001"),
                "kind": "event",
                "due_at": T0 + timedelta(minutes=5 - i),
                "step_position": 1,
                "payload": {"name": "tick"},
                "inserted_at": T0,
            }
            for i in range(3)
        ],
    )
    detail = await console_db.queries.execution("ex-0001")
    assert detail is not None
    assert [timer.send_id for timer in detail.timers] == ["s2", "s1", "s0"]
    assert detail.timers[0].payload == {"name": "tick"}


async def test_a_detail_at_its_bound_leaves_the_step_rows_to_a_query(
    console_db: ConsoleDb,
) -> None:
    t = console_db.store.tables
    console_db.insert(t.executions, [_execution(1)])
    timers = [
        {
            "execution_id": "ex-0001",
            "send_id": f"s{i}",
            "dedup_key": f"d{i}",
            "lock_key": execution_lock_key("ex-0001"),
            "bucket": bucket_of("ex-0001"),
            "kind": "external",
            "due_at": T0 + timedelta(seconds=i),
            "step_position": 0,
            "payload": {},
            "inserted_at": T0,
        }
        for i in range(MAX_DETAIL_ROWS + 1)
    ]
    console_db.insert(t.timers, timers[:-2])
    detail = await console_db.queries.execution("ex-0001")
    assert detail is not None
    rows = detail.step_rows(["d3", "nope"])
    assert rows is not None
    assert list(rows.timers) == ["d3"]
    console_db.insert(t.timers, timers[-2:])
    detail = await console_db.queries.execution("ex-0001")
    assert detail is not None
    assert len(detail.timers) == MAX_DETAIL_ROWS
    assert detail.step_rows([f"d{MAX_DETAIL_ROWS}"]) is None  # it may not hold them all
    looked_up = await console_db.queries.step_rows("ex-0001", [f"d{MAX_DETAIL_ROWS}"])
    assert list(looked_up.timers) == [f"d{MAX_DETAIL_ROWS}"]


async def test_projections_read_from_scribas_tables(console_db: ConsoleDb) -> None:
    scriba = define_tables(prefix="csl_", schema=console_db.store.tables.options.schema)
    scriba.metadata.create_all(console_db.writer)
    try:
        console_db.insert(
            scriba.projections,
            [
                {
                    "projection_name": "totals",
                    "projection_version": 1,
                    "generation": 4,
                    "claimed_at": T0,
                }
            ],
        )
        console_db.insert(
            scriba.watermarks,
            [
                {
                    "projection_name": "totals",
                    "projection_version": 1,
                    "position": 41,
                    "occurred_at": T0,
                    "updated_at": T0,
                }
            ],
        )
        console_db.insert(
            scriba.dead_letters,
            [
                {
                    "projection_name": name,
                    "projection_version": 2,
                    "position": p,
                    "event_data": {},
                    "error_kind": "exception",
                    "occurred_at": T0,
                }
                for name, p in (("totals", 5), ("totals", 6), ("audit", 1))
            ],
        )
        now = T0 + timedelta(minutes=3)
        queries = ConsoleQueries(
            console_db.queries.engine, console_db.store.tables, scriba=scriba, clock=lambda: now
        )
        views = await queries.projections()
        summary = [(v.name, v.version, v.status, v.dead_letters, v.watermark, v.lag) for v in views]
        assert summary == [
            ("audit", 2, "dead_letters", 1, None, None),
            ("totals", 1, "claimed", 0, 41, timedelta(minutes=3)),
            ("totals", 2, "dead_letters", 2, None, None),
        ]
        assert views[1].generation == 4
        assert await console_db.queries.projections() == []  # no scriba tables given
    finally:
        scriba.metadata.drop_all(console_db.writer)


async def test_the_fingerprint_moves_with_each_write(console_db: ConsoleDb) -> None:
    t = console_db.store.tables
    queries = console_db.queries
    empty = await queries.fingerprint()
    assert (empty.executions, empty.ledger, empty.audit) == (None, None, None)
    console_db.insert(t.executions, [_execution(1)])
    created = await queries.fingerprint()
    assert created.executions == T0  # its created_at
    console_db.insert(
        t.inputs,
        [
            {
                "execution_id": "ex-0001",
                "seq": 0,
                "via": "step",
                "input_blob": None,
                "recorded_at": T0 + timedelta(minutes=5),
            }
        ],
    )
    assert (await queries.fingerprint()).executions == T0 + timedelta(minutes=5)
    with console_db.writer.begin() as connection:
        ended = T0 + timedelta(hours=1)
        connection.execute(
            t.executions.update().values(updated_at=ended, ended_at=ended, status="cancelled")
        )
    assert (await queries.fingerprint()).executions == T0 + timedelta(hours=1)
    console_db.insert(t.routing_ledger, _ledger_rows(1))
    assert (await queries.fingerprint()).ledger is not None
    assert await queries.execution_fingerprint("ex-0001") == (T0 + timedelta(hours=1), 1)
    console_db.insert(
        t.inputs,
        [
            {
                "execution_id": "ex-0001",
                "seq": 1,
                "via": "step",
                "input_blob": None,
                "recorded_at": T0,
            }
        ],
    )
    assert await queries.execution_fingerprint("ex-0001") == (T0 + timedelta(hours=1), 2)
    assert await queries.execution_fingerprint("nobody") is None


# Errors and final states.


def _errors_seed(db: ConsoleDb) -> list[dict[str, Any]]:
    """60 executions, a third of which raised errors (their last error's time in an
    order of its own, ties included); each error one ``step_errors`` row."""
    t = db.store.tables
    chooser = random.Random(23)
    rows = []
    errors: list[dict[str, Any]] = []
    for index in range(60):
        row = _execution(index, status=chooser.choice(["active", "failed"]))
        if index % 3 == 0:
            count = chooser.randint(1, 3)
            last = T0 + timedelta(minutes=chooser.randrange(0, 8))  # ties on purpose
            row.update(error_count=count, last_error_at=last)
            errors.extend(
                {
                    "execution_id": row["execution_id"],
                    "seq": n,
                    "via": "step",
                    "name": "error.execution",
                    "taken": n % 2 == 1,
                    "error_blob": (
                        b'{"element":"assign","line":5,"column":7,'
                        b'"message":"\'*\' expects numbers, got a string"}'
                    ),
                    "recorded_at": last - timedelta(seconds=count - 1 - n),
                }
                for n in range(count)
            )
        rows.append(row)
    db.insert(t.charts, _charts())
    db.insert(t.executions, rows)
    db.insert(t.step_errors, errors)
    return rows


async def test_the_errors_filter_walks_every_erring_execution_newest_error_first(
    console_db: ConsoleDb,
) -> None:
    rows = _errors_seed(console_db)
    erring = [r for r in rows if r.get("last_error_at") is not None]
    expected = [
        r["execution_id"]
        for r in sorted(erring, key=lambda r: (r["last_error_at"], r["execution_id"]), reverse=True)
    ]
    for size in (1, 4, 20, MAX_PAGE):
        assert await _walk(console_db.queries, ExecutionFilter(errors=True), size) == expected
    failed = ExecutionFilter(errors=True, status=Status.FAILED)
    assert await _walk(console_db.queries, failed, 3) == [
        i for i in expected if next(r for r in rows if r["execution_id"] == i)["status"] == "failed"
    ]
    page = await console_db.queries.executions(ExecutionFilter(errors=True), size=1)
    (first,) = page.rows
    source = next(r for r in rows if r["execution_id"] == first.id)
    assert (first.error_count, first.last_error_at) == (
        source["error_count"],
        source["last_error_at"],
    )
    plain = await console_db.queries.executions(size=1)
    assert plain.next_cursor is not None
    with pytest.raises(BadCursor):  # a cursor of the list by creation is not this list's
        await console_db.queries.executions(ExecutionFilter(errors=True), cursor=plain.next_cursor)


async def test_chart_errors_page_newest_first_across_executions(console_db: ConsoleDb) -> None:
    _errors_seed(console_db)
    queries = console_db.queries
    seen: list[ErrorView] = []
    cursor = None
    while True:
        page = await queries.chart_errors(cursor=cursor, size=7)
        seen.extend(page.rows)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    keys = [(v.error.recorded_at, v.id) for v in seen]
    assert keys == sorted(keys, reverse=True)
    assert len({v.id for v in seen}) == len(seen) == sum(1 for r in (await _all_errors(console_db)))
    view = seen[0]
    error = view.error
    assert (error.name, error.element, error.line, error.column) == (
        "error.execution",
        "assign",
        5,
        7,
    )
    assert error.message == "'*' expects numbers, got a string"
    assert (error.via, view.unreadable) == ("step", None)
    detail = await queries.execution(view.execution_id)
    assert detail is not None
    assert detail.record.error_count == len(detail.errors) >= 1
    assert [v.id for v in detail.errors] == sorted((v.id for v in detail.errors), reverse=True)
    with pytest.raises(BadCursor):
        await queries.chart_errors(cursor=encode_cursor("outbox", T0, 1))


async def _all_errors(db: ConsoleDb) -> list[Any]:
    with db.writer.connect() as connection:
        return list(connection.execute(db.store.tables.step_errors.select()))


async def test_an_error_the_codec_cannot_decode_is_listed_as_unreadable(
    console_db: ConsoleDb, caplog: pytest.LogCaptureFixture
) -> None:
    from statifier.persistence.fernet import FernetCodec

    _errors_seed(console_db)  # plain bytes: not what a Fernet codec reads
    sealed = ConsoleQueries(
        console_db.queries.engine,
        console_db.store.tables,
        codec=FernetCodec([FernetCodec.generate_key()]),
    )
    page = await sealed.chart_errors(size=3)
    assert len(page.rows) == 3
    for view in page.rows:
        assert view.unreadable is not None
        assert view.error.name == "error.execution"  # what the row says in the clear
        assert view.error.message is None
    assert "could not be decoded" in caplog.text


async def test_a_dead_outbox_row_the_codec_cannot_decode_is_listed_with_no_event(
    console_db: ConsoleDb, caplog: pytest.LogCaptureFixture
) -> None:
    from statifier.persistence.codec import sealed_json
    from statifier.persistence.fernet import FernetCodec

    elsewhere = FernetCodec([FernetCodec.generate_key()])  # a key the console lacks
    console_db.insert(
        console_db.store.tables.outbox,
        [
            {
                "queue": "mail",
                "key": "k1",
                "payload": {"event": sealed_json(elsewhere, "{}"), "execution_id": "ex-0001"},
                "execution_id": "ex-0001",
                "bucket": bucket_of("ex-0001"),
                "attempts": 1,
                "next_attempt_at": T0,
                "dead_at": T0,
                "last_error": "the payload is unreadable",
                "inserted_at": T0,
            }
        ],
    )
    sealed = ConsoleQueries(
        console_db.queries.engine,
        console_db.store.tables,
        codec=FernetCodec([FernetCodec.generate_key()]),
    )
    (row,) = (await sealed.outbox_dead_letters()).rows
    assert row.key == "k1"
    assert row.payload["event"] is None
    assert row.payload["execution_id"] == "ex-0001"
    said = [r for r in caplog.records if "outbox row 'k1' could not be decoded" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]


async def test_an_execution_whose_position_and_timer_the_codec_cannot_decode_still_shows(
    console_db: ConsoleDb, caplog: pytest.LogCaptureFixture
) -> None:
    from statifier.persistence.codec import sealed_json
    from statifier.persistence.fernet import FernetCodec

    elsewhere = FernetCodec([FernetCodec.generate_key()])  # keys the console lacks
    t = console_db.store.tables
    console_db.insert(
        t.executions,
        [_execution(1, position_blob=elsewhere.encode(b"{}"), outcome_blob=b"plain")],
    )
    timer = {
        "execution_id": "ex-0001",
        "send_id": "s1",
        "dedup_key": "d1",
        "lock_key": execution_lock_key("ex-0001"),
        "bucket": bucket_of("ex-0001"),
        "kind": "event",
        "due_at": T0,
        "step_position": 1,
        "payload": sealed_json(elsewhere, '{"name": "tick"}'),
        "inserted_at": T0,
    }
    console_db.insert(t.timers, [timer])
    sealed = ConsoleQueries(
        console_db.queries.engine, t, codec=FernetCodec([FernetCodec.generate_key()])
    )
    detail = await sealed.execution("ex-0001")
    assert detail is not None
    assert (detail.record.position, detail.record.outcome) == (None, None)
    [shown] = detail.timers
    assert (shown.send_id, shown.payload, shown.event) == ("s1", {}, None)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("the position of execution 'ex-0001' could not be decoded" in m for m in said)
    assert any("the outcome of execution 'ex-0001' could not be decoded" in m for m in said)
    assert any("the payload of timer 's1'" in m for m in said)


async def test_a_completed_rows_final_state_is_its_records_else_read_off_its_position(
    console_db: ConsoleDb,
) -> None:
    t = console_db.store.tables
    console_db.insert(t.charts, _charts())
    console_db.insert(
        t.executions,
        [
            _execution(1, status="completed", position_blob=b"ended here"),
            _execution(2, status="active", position_blob=b"running"),
            _execution(3, status="completed", position_blob=None),  # pruned
            _execution(4, status="completed", position_blob=b"filed", final_state="paid"),
        ],
    )
    page = await console_db.queries.executions()
    found = {row.id: (row.final_state, row.final_position) for row in page.rows}
    assert found == {
        "ex-0001": (None, b"ended here"),  # ended before records kept it: read it there
        "ex-0002": (None, None),
        "ex-0003": (None, None),
        "ex-0004": ("paid", None),  # filed: no position is read
    }


async def test_the_fingerprint_moves_with_an_error_and_step_rows_are_bounded(
    console_db: ConsoleDb,
) -> None:
    t = console_db.store.tables
    queries = console_db.queries
    console_db.insert(t.executions, [_execution(1)])
    before = await queries.fingerprint()
    assert before.errors is None
    console_db.insert(
        t.step_errors,
        [
            {
                "execution_id": "ex-0001",
                "seq": None,
                "via": "step",
                "name": "error.execution",
                "taken": False,
                "error_blob": b"{}",
                "recorded_at": T0 + timedelta(hours=2),
            }
        ],
    )
    after = await queries.fingerprint()
    assert after != before
    assert after.errors == T0 + timedelta(hours=2)
    with pytest.raises(ValueError, match="at most"):
        await queries.step_rows("ex-0001", [f"k{i}" for i in range(MAX_STEP_KEYS + 1)])
    assert await queries.step_rows("ex-0001", []) == StepRows({}, {}, {})
