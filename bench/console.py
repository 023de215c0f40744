"""The console's list pages on PostgreSQL with 100,000 executions and 1,000,000
routing-ledger rows: p50/p95 of each page's query, and the plan that shows which index
it walks.

The rows are written with COPY into a schema of the benchmark's own (migrated to head,
dropped at the end), then ANALYZEd. The executions run four real charts, each with a
stored position (a completed one ended in one of its chart's finals, which the list
reads back); 5% of them raised chart errors (each error a ``step_errors`` row). One
more execution, ``ex-detail``, is made through the router itself: a shopping cart of
``--detail-steps`` items whose steps schedule and cancel timers, hand rows to the
outbox and, now and then, raise ``error.execution``; the detail page is timed on it.

Each query is the one ``statifier.console.queries`` runs for the page (captured from
the engine and shown with ``EXPLAIN (ANALYZE)``), timed through ``ConsoleQueries`` over
an asyncio engine, repeated ``--runs`` times. The goal is 200 ms a page. With
``--http``, the same pages are fetched through the console's ASGI app (httpx's ASGI
transport, no network) as well.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test python bench/console.py
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from harness import machine_info, machine_summary, new_parser, versions_line
from sqlalchemy.ext.asyncio import AsyncEngine

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import compile_chart
from statifier.console.queries import (
    ConsoleQueries,
    ExecutionFilter,
    LedgerFilter,
    encode_cursor,
)
from statifier.console.replay import replay
from statifier.console.timeline import send_keys
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core.positions import dump
from statifier.persistence import Status, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    InboundEvent,
    OutboxRoute,
    Router,
    RouterConfig,
    StaticResolver,
    TimerWorker,
)
from statifier.sql import TableOptions, Tables, migrations

GOAL_MS = 200.0
EXECUTIONS = 100_000
LEDGER = 1_000_000
OUTBOX = 100_000
DAYS = 30
NOW = datetime(2026, 12, 1, tzinfo=UTC)
START = NOW - timedelta(days=DAYS)

STATUSES = ["active"] * 70 + ["completed"] * 18 + ["failed"] * 8 + ["cancelled"] * 4
OUTCOMES = ["delivered"] * 80 + ["created_and_delivered"] * 10 + ["dropped"] * 6
OUTCOMES += ["duplicate"] * 3 + ["key_refused"]  # the rarest, 1%: the filter's worst case
ERRORED = 0.05
"""The share of executions whose steps raised chart errors (1 to 3 each)."""
DETAIL_STEPS = 200
DETAIL_ID = "ex-detail"
ERROR_BLOB = (
    b'{"column":7,"element":"assign","line":5,'
    b'"message":"\'*\' expects numbers, got a string","reason":"multiply"}'
)

_CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="{start}">
  <datamodel><data id="seen" expr="0"/></datamodel>
  <state id="{start}">
    <transition event="a" target="{a}"><assign location="seen" expr="seen + 1"/></transition>
    <transition event="b" target="{b}"><assign location="seen" expr="seen + {step}"/></transition>
  </state>
  <final id="{a}"/>
  <final id="{b}"/>
</scxml>"""
CHARTS = [
    ("order", "1", {"start": "placed", "a": "paid", "b": "expired", "step": 1}),
    ("order", "2", {"start": "placed", "a": "paid", "b": "expired", "step": 2}),
    ("parcel", "1", {"start": "received", "a": "delivered", "b": "lost", "step": 1}),
    ("payment", "1", {"start": "authorized", "a": "captured", "b": "declined", "step": 1}),
]
"""Four charts of three documents, each able to end in one of two finals."""

CART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="cart">
  <datamodel><data id="items" expr="0"/><data id="total" expr="0"/></datamodel>
  <state id="cart">
    <transition event="item">
      <assign location="items" expr="items + 1"/>
      <assign location="total" expr="total + _event.data.price * _event.data.quantity"/>
      <cancel sendid="nudge"/>
      <send id="nudge" event="cart.nudge" delay="1h"/>
      <send type="bench:route" target="receipts" event="item.added">
        <param name="items" expr="items"/>
      </send>
    </transition>
    <transition event="cart.nudge"/>
    <transition event="checkout" target="paid"/>
  </state>
  <final id="paid"/>
</scxml>"""
"""The detail page's execution: each item cancels the last nudge, schedules a new one
and hands a receipt to the outbox; an item whose price is not a number raises
error.execution and does neither."""


@dataclass(frozen=True)
class Charted:
    """A chart of the seed: its hash, document and a position per status."""

    content_hash: str
    document: str
    source: bytes
    positions: dict[str, list[bytes]]


def _charts() -> list[Charted]:
    """The four charts, with positions: running (active, failed, cancelled) and ended
    in each final (completed)."""
    made = []
    for document, version, parts in CHARTS:
        source = _CHART.format(**parts)
        machine = compile_chart(source, name=document, version=version)
        start, _ = initialize(machine)
        running = dump(start)
        ended = [dump(handle_event(start, Event(name))[0]) for name in ("a", "b")]
        made.append(
            Charted(
                machine.identity.content_hash,
                document,
                source.encode(),
                {
                    "active": [running],
                    "failed": [running],
                    "cancelled": [running],
                    "completed": ended,
                },
            )
        )
    return made


@dataclass(frozen=True)
class Result:
    name: str
    p50_ms: float
    p95_ms: float
    rows: int
    plan: str


def _seed(url: str, tables: Tables, executions: int, ledger: int, outbox: int) -> None:
    """Write the rows with COPY (one transaction per table), then ANALYZE."""
    charts = _charts()
    schema = tables.options.schema
    chooser = random.Random(1042771)
    span = (NOW - START).total_seconds()

    def name(table: sa.Table) -> str:
        return f"{schema}.{table.name}"

    with psycopg.connect(url) as connection:
        with connection.cursor() as cursor:
            with cursor.copy(
                f"COPY {name(tables.charts)} (content_hash, chart_blob, name, version, saved_at)"
                " FROM STDIN"
            ) as copy:
                for chart, (_, version, _) in zip(charts, CHARTS, strict=True):
                    copy.write_row(
                        (chart.content_hash, chart.source, chart.document, version, START)
                    )
            ids = []
            errors: list[tuple[str, datetime]] = []
            with cursor.copy(
                f"COPY {name(tables.executions)} (execution_id, content_hash, status, "
                "position_blob, metadata, failure, created_at, updated_at, ended_at, "
                "error_count, last_error_at, bucket) FROM STDIN"
            ) as copy:
                for index in range(executions):
                    execution_id = f"ex-{index:07d}"
                    ids.append(execution_id)
                    status = chooser.choice(STATUSES)
                    chart = chooser.choice(charts)
                    created = START + timedelta(seconds=chooser.random() * span)
                    updated = created + timedelta(seconds=chooser.random() * 3600)
                    ended = updated if status != "active" else None
                    metadata = (
                        f'{{"tenant": "t{chooser.randrange(50)}", '
                        f'"region": "{chooser.choice("nesw")}"}}'
                    )
                    failure = "the card was declined" if status == "failed" else None
                    raised = chooser.randint(1, 3) if chooser.random() < ERRORED else 0
                    errors.extend((execution_id, updated) for _ in range(raised))
                    copy.write_row(
                        (
                            execution_id,
                            chart.content_hash,
                            status,
                            chooser.choice(chart.positions[status]),
                            metadata,
                            failure,
                            created,
                            updated,
                            ended,
                            raised,
                            updated if raised else None,
                            bucket_of(execution_id),
                        )
                    )
            with cursor.copy(
                f"COPY {name(tables.step_errors)} (execution_id, seq, via, name, taken, "
                "error_blob, recorded_at) FROM STDIN"
            ) as copy:
                for execution_id, at in errors:
                    row = (execution_id, 0, "step", "error.execution", False, ERROR_BLOB, at)
                    copy.write_row(row)
            with cursor.copy(
                f"COPY {name(tables.addresses)} (scope, document, key, execution_id, inserted_at, "
                "bucket) FROM STDIN"
            ) as copy:
                for index, execution_id in enumerate(ids):
                    scope, key = "eu" if index % 4 else "us", f"parcel-{index}"
                    bucket = address_bucket(scope, "order", key)
                    copy.write_row((scope, "order", key, execution_id, START, bucket))
            with cursor.copy(
                f"COPY {name(tables.routing_ledger)} (binding_id, message_id, scope, source, "
                "outcome, document, key, execution_id, inserted_at, bucket) FROM STDIN"
            ) as copy:
                for index in range(ledger):
                    at = START + timedelta(seconds=chooser.random() * span)
                    target = chooser.randrange(executions)
                    key = f"parcel-{target}"
                    copy.write_row(
                        (
                            f"binding-{chooser.randrange(12)}",
                            f"m-{index}",
                            "eu",
                            "parcels",
                            chooser.choice(OUTCOMES),
                            "order",
                            key,
                            ids[target],
                            at,
                            address_bucket("eu", "order", key),
                        )
                    )
            with cursor.copy(
                f"COPY {name(tables.outbox)} (queue, key, payload, attempts, next_attempt_at, "
                "sent_at, dead_at, last_error, inserted_at, execution_id, bucket) FROM STDIN"
            ) as copy:
                for index in range(outbox):
                    at = START + timedelta(seconds=chooser.random() * span)
                    sender = ids[chooser.randrange(executions)]
                    dead = index % 50 == 0  # 2% dead letters, the rest sent
                    payload = f'{{"event": "{{}}", "key": "k-{index}", "execution_id": "{sender}"}}'
                    copy.write_row(
                        (
                            "carrier_api",
                            f"k-{index}",
                            payload,
                            5 if dead else 1,
                            at,
                            None if dead else at,
                            at if dead else None,
                            "503 Service Unavailable" if dead else None,
                            at,
                            sender,
                            bucket_of(sender),
                        )
                    )
        connection.commit()
        connection.autocommit = True
        # What autovacuum would have done by the time an operator looks: statistics, and
        # the visibility map that lets a covering index answer alone.
        for table in (
            tables.executions,
            tables.routing_ledger,
            tables.addresses,
            tables.charts,
            tables.outbox,
            tables.step_errors,
        ):
            connection.execute(f"VACUUM (ANALYZE) {name(table)}")


async def _detail(url: str, tables: Tables, steps: int) -> None:
    """``ex-detail`` made through the router on a clock of the seed's: ``steps`` items
    (every 25th priced in words: error.execution), the pending nudge fired by the timer
    worker after every tenth; it stays active."""
    cart = compile_chart(CART, name="cart")
    now = [NOW - timedelta(days=1)]
    async with SqlAdapter(url, tables) as adapter:
        storage = Storage(adapter, clock=lambda: now[0])
        config = RouterConfig(
            storage,
            bindings=[
                Binding(
                    id="cart_items",
                    source="shop",
                    match="true",
                    key="event.cart",
                    document="cart",
                    event="item",
                    data=("price", "quantity"),
                )
            ],
            resolver=StaticResolver({"cart": cart}),
            execution_id=lambda scope, document, key: DETAIL_ID,
            send_type="bench:route",
            routes={
                "receipts": (OutboxRoute(adapter, clock=lambda: now[0]), {"queue": "receipts"})
            },
        )
        router = Router(config)
        worker = TimerWorker(router, clock=lambda: now[0])
        for step in range(steps):
            price: object = "twelve" if step % 25 == 24 else 12
            event = InboundEvent(
                scope="shop",
                source="shop",
                message_id=f"item-{step}",
                data={"cart": "c-1", "price": price, "quantity": 1},
            )
            await router.route(event)
            now[0] += timedelta(minutes=1)
            if step % 10 == 9:
                now[0] += timedelta(hours=2)
                await worker.fire_due()


class Captured:
    """The statements the engine ran since the last ``clear``, with their parameters
    (for EXPLAIN)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.statements: list[tuple[str, Any]] = []
        sa.event.listen(engine.sync_engine, "before_cursor_execute", self._seen)

    def clear(self) -> None:
        self.statements = []

    def _seen(self, conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        self.statements.append((statement, parameters))


def _explain(url: str, captured: Captured) -> str:
    plans = []
    with psycopg.connect(url) as connection:
        for statement, parameters in captured.statements:
            rows = connection.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + statement, parameters
            ).fetchall()
            plans.append("\n".join(str(row[0]) for row in rows))
    return "\n\n".join(plans)


async def _time(
    name: str,
    call: Callable[[], Awaitable[int]],
    runs: int,
    url: str,
    captured: Captured | None,
) -> Result:
    if captured is not None:
        captured.clear()
    rows = await call()  # warm: the pool, the plan cache, the pages in shared buffers
    plan = "" if captured is None else _explain(url, captured)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        rows = await call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return Result(name, statistics.median(samples), p95, rows, plan)


_INDEX = re.compile(r"(?:Index(?: Only)? Scan(?: Backward)? using|Bitmap Index Scan on) (\S+)")
_SEQ = re.compile(r"Seq Scan on (\S+)")


def _walks(plan: str, prefix: str) -> str:
    """The indexes a plan reads and the tables it reads whole, without the prefix."""
    indexes = sorted({found.removeprefix(prefix) for found in _INDEX.findall(plan)})
    scans = sorted({found.removeprefix(prefix) for found in _SEQ.findall(plan)})
    said = ", ".join(indexes) or "no index"
    if scans:
        said += "; whole table: " + ", ".join(scans)
    if "Index Only Scan" in plan:
        said += " (index only)"
    return said


async def _pages(
    queries: ConsoleQueries,
    url: str,
    runs: int,
    deep: str,
    depth: int,
    second_errors: str,
    deep_errors: str,
    errors_depth: int,
) -> list[Result]:
    engine = queries.engine
    assert isinstance(engine, AsyncEngine)
    captured = Captured(engine)
    day = NOW - timedelta(days=10)

    async def count(page: Awaitable[Any]) -> int:
        found = await page
        return len(found.rows) if hasattr(found, "rows") else len(found)

    cases: list[tuple[str, Callable[[], Awaitable[int]]]] = [
        ("executions, first page", lambda: count(queries.executions())),
        (
            f"executions, keyset page at row {depth:,}",
            lambda: count(queries.executions(cursor=deep)),
        ),
        (
            "executions, status failed",
            lambda: count(queries.executions(ExecutionFilter(status=Status.FAILED))),
        ),
        (
            "executions, document parcel",
            lambda: count(queries.executions(ExecutionFilter(document="parcel"))),
        ),
        (
            "executions, metadata tenant=t7",
            lambda: count(queries.executions(ExecutionFilter(metadata={"tenant": "t7"}))),
        ),
        (
            "executions, created within one day",
            lambda: count(
                queries.executions(
                    ExecutionFilter(created_from=day, created_until=day + timedelta(days=1))
                )
            ),
        ),
        (
            "executions, updated in the last hour",
            lambda: count(
                queries.executions(ExecutionFilter(updated_from=NOW - timedelta(hours=1)))
            ),
        ),
        (
            "executions, scope us",
            lambda: count(queries.executions(ExecutionFilter(scope="us"))),
        ),
        (
            "executions, failed and tenant=t7",
            lambda: count(
                queries.executions(ExecutionFilter(status=Status.FAILED, metadata={"tenant": "t7"}))
            ),
        ),
        ("ledger, first page", lambda: count(queries.ledger())),
        (
            "ledger, outcome key_refused",
            lambda: count(queries.ledger(LedgerFilter(outcome="key_refused"))),
        ),
        (
            "ledger, counts per binding per hour over a day",
            lambda: count(queries.ledger_counts(day, day + timedelta(days=1), timedelta(hours=1))),
        ),
        ("addresses of a key", lambda: count(queries.addresses("parcel-1042"))),
        ("failures, failed executions", lambda: count(queries.failed())),
        ("failures, outbox dead letters", lambda: count(queries.outbox_dead_letters())),
        ("live probe (fingerprint)", lambda: _one(queries.fingerprint())),
        ("one execution's detail", lambda: _one(queries.execution("ex-0001042"))),
        (f"{DETAIL_ID}'s detail", lambda: _one(queries.execution(DETAIL_ID))),
        (
            f"{DETAIL_ID}'s step rows (every send's key)",
            lambda: _step_rows(queries, DETAIL_ID),
        ),
        (
            "executions, errors filter",
            lambda: count(queries.executions(ExecutionFilter(errors=True))),
        ),
        (
            "executions, errors filter, second page",
            lambda: count(queries.executions(ExecutionFilter(errors=True), cursor=second_errors)),
        ),
        (
            f"executions, errors filter, keyset page at row {errors_depth:,}",
            lambda: count(queries.executions(ExecutionFilter(errors=True), cursor=deep_errors)),
        ),
        (
            "executions, errors filter and status failed",
            lambda: count(queries.executions(ExecutionFilter(errors=True, status=Status.FAILED))),
        ),
        ("failures, chart errors", lambda: count(queries.chart_errors())),
    ]
    return [await _time(name, call, runs, url, captured) for name, call in cases]


async def _one(answer: Awaitable[Any]) -> int:
    return 0 if await answer is None else 1


async def _step_rows(queries: ConsoleQueries, execution_id: str) -> int:
    """What the execution page looks up for its timeline: the rows of every send the
    replay of the log computes (the replay itself is not timed here)."""
    detail = await queries.execution(execution_id)
    assert detail is not None
    keys = _keys.get(execution_id)
    if keys is None:
        machine = compile_chart(CART, name="cart")
        steps = replay(machine, detail.inputs, execution_id=execution_id, options=_CART_OPTIONS)
        keys = _keys[execution_id] = send_keys(steps, steps)
    rows = await queries.step_rows(execution_id, keys)
    return len(rows.timers) + len(rows.outbox) + len(rows.refused)


_keys: dict[str, list[str]] = {}
_CART_OPTIONS = StartOptions(send_types=frozenset({"bench:route"}))


def _deep_cursor(url: str, tables: Tables, offset: int, errors: bool = False) -> str:
    e = tables.executions
    moment, where = (
        ("last_error_at", "WHERE last_error_at IS NOT NULL") if errors else ("created_at", "")
    )
    with psycopg.connect(url) as connection:
        row = connection.execute(
            f"SELECT {moment}, execution_id FROM {tables.options.schema}.{e.name} {where} "
            f"ORDER BY {moment} DESC, execution_id DESC OFFSET %s LIMIT 1",
            (offset,),
        ).fetchone()
    assert row is not None
    return encode_cursor("errors" if errors else "executions", row[0], row[1])


async def _http(url: str, tables: Tables, runs: int, deep: str) -> list[Result]:
    """The pages through the console's ASGI app (httpx's ASGI transport, no network),
    logged in as an operator: what an operator's browser waits for, minus the wire."""
    import httpx

    from statifier.console.app import Console, console_app
    from statifier.console.auth import Operator, Operators, Role, Sessions
    from statifier.persistence import Storage
    from statifier.persistence.sql import SqlAdapter
    from statifier.router import Router, RouterConfig, StaticResolver

    token = uuid.uuid4().hex
    results = []
    async with SqlAdapter(url, tables) as adapter:
        sessions = Sessions(Operators([Operator("bench", token, Role.OPERATOR)]))
        router = Router(RouterConfig(Storage(adapter), bindings=[], resolver=StaticResolver({})))
        console = Console.of(router, sessions)
        transport = httpx.ASGITransport(app=console_app(console))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            login = await client.post("/console/login", data={"token": token})
            assert login.status_code == 303, login.text
            for path in (
                "/console/executions",
                "/console/executions?errors=1",
                f"/console/executions?cursor={deep}",
                "/console/executions?status=failed&meta=tenant%3Dt7",
                "/console/executions/ex-0001042",
                f"/console/executions/{DETAIL_ID}",
                "/console/routing",
                "/console/routing?outcome=key_refused",
                "/console/failures",
            ):

                async def fetch(path: str = path) -> int:
                    response = await client.get(path)
                    assert response.status_code == 200, (path, response.status_code)
                    return len(response.content)

                shown = path if len(path) < 60 else path[:40] + "..."
                results.append(await _time(f"HTTP GET {shown} (bytes)", fetch, runs, "", None))

            async def afresh() -> int:
                # The console keeps the final states it read (a completed execution's
                # never changes): forget them, to time the page as first seen.
                console._finals.clear()
                response = await client.get("/console/executions")
                assert response.status_code == 200, response.status_code
                return len(response.content)

            name = "HTTP GET /console/executions, final states read afresh (bytes)"
            results.append(await _time(name, afresh, runs, "", None))
    return results


async def main() -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--runs", type=int, default=30, help="timed runs of each query")
    parser.add_argument("--executions", type=int, default=EXECUTIONS)
    parser.add_argument("--ledger", type=int, default=LEDGER)
    parser.add_argument("--outbox", type=int, default=OUTBOX, help="outbox rows (2%% dead)")
    parser.add_argument(
        "--detail-steps", type=int, default=DETAIL_STEPS, help=f"inputs of {DETAIL_ID}"
    )
    parser.add_argument("--plans", action="store_true", help="print each plan in full")
    parser.add_argument("--http", action="store_true", help="also time the pages over ASGI")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("set DATABASE_URL to a PostgreSQL server", file=sys.stderr)
        return 2
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    with psycopg.connect(url) as connection:
        print("PostgreSQL", connection.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    options = TableOptions(schema=f"bench_console_{uuid.uuid4().hex[:8]}")
    tables = options.define()
    migrations.upgrade(url, options)
    try:
        started = time.perf_counter()
        _seed(url, tables, args.executions, args.ledger, args.outbox)
        await _detail(url, tables, args.detail_steps)
        print(
            f"seeded {args.executions:,} executions, {args.executions:,} addresses, "
            f"{args.ledger:,} ledger rows, {args.outbox:,} outbox rows and "
            f"{DETAIL_ID} ({args.detail_steps} inputs) in {time.perf_counter() - started:.1f} s"
        )
        deep = _deep_cursor(url, tables, args.executions // 2)
        erring = round(args.executions * ERRORED)
        second_errors = _deep_cursor(url, tables, 49, errors=True)
        deep_errors = _deep_cursor(url, tables, erring // 2, errors=True)
        async with ConsoleQueries.open(url, tables) as queries:
            results = await _pages(
                queries,
                url,
                args.runs,
                deep,
                args.executions // 2,
                second_errors,
                deep_errors,
                erring // 2,
            )
        if args.http:
            results += await _http(url, tables, args.runs, deep)
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {options.schema} CASCADE")
    print(f"\n{args.runs} timed runs each, after one warm-up; goal {GOAL_MS:.0f} ms\n")
    print("| page | rows | p50 ms | p95 ms | goal | plan walks |")
    print("|---|---:|---:|---:|---|---|")
    for result in results:
        met = "met" if result.p95_ms < GOAL_MS else "**missed**"
        print(
            f"| {result.name} | {result.rows} | {result.p50_ms:.2f} | {result.p95_ms:.2f} | "
            f"{met} | {_walks(result.plan, options.prefix) if result.plan else ''} |"
        )
    if args.plans:
        for result in results:
            if result.plan:
                print(f"\n-- {result.name}\n{result.plan}")
    return 0 if all(r.p95_ms < GOAL_MS for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
