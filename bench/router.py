"""Benchmark: the event router (``statifier.router``) delivering keyed events to durable
executions on SQLite and PostgreSQL, beside the raw driver running the same statements
(the ceiling), ``route_many`` batches, the same rows written in bulk (the database's
limit for a batch), and DBOS Transact doing the same with workflows.

Run from the repository root, with the project installed (``pip install -e '.[postgres]'``,
and ``dbos`` from the ``bench`` extra for the DBOS row) or from a checkout::

    PYTHONPATH=src python3 bench/router.py                 # both databases
    python bench/router.py --quick                         # short run
    python bench/router.py --only sqlite                   # one database
    python bench/router.py --url postgresql://...          # another PostgreSQL
    python bench/router.py --no-dbos                       # leave DBOS out
    python bench/router.py --json out.json                 # also write the numbers
    python bench/router.py --profile sqlite                # cProfile of the route() row
    python bench/router.py --split                         # where a SQLite delivery's time goes

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the router's rows work in a schema of
their own, dropped at the end. DBOS keeps its system tables in a database of its own on
the same server (``dbos_bench``, which DBOS creates if it is missing), in a schema made
for the run and dropped at the end. SQLite is a file in a temporary directory for the
router and another for DBOS.

The workload, per row: 1,000 keys (``--keys``), 8 routers (asyncio tasks) each owning an
eighth of them, 5 events per key (``--events``), delivered round-robin over a router's
keys: the first event of a key creates its execution (a binding with ``create`` =
``if_absent``), the later ones are delivered to it. The chart is a counter: one state
whose self-transition on ``tick`` adds one to a datamodel counter, so every step selects
a transition. Every delivery is checked: the router must answer ``created_and_delivered``
for the first event of each key and ``delivered`` for every other.

Rows, per database:

* ``raw driver`` (the ceiling): the statements a delivery runs, written out by hand on
  the driver (``sqlite3``; psycopg 3 async, one connection per router), one transaction
  per delivery, with the position and event bytes prepared once (no interpreter work).
  PostgreSQL: the advisory locks on the dedupe claim and the address, the claim, the
  address lookup, for a new key the address insert, the chart save and read, the
  execution's advisory lock, ``SELECT ... FOR UPDATE`` and insert; then the step: the
  execution's advisory lock, ``SELECT ... FOR UPDATE``, the input-log ``INSERT ...
  SELECT``, the ``UPDATE`` of every column a step writes; the ledger row; ``COMMIT``.
  SQLite: the same inside ``BEGIN IMMEDIATE`` (no advisory locks), under one asyncio
  lock, the ``UPDATE`` of the position alone (the adapter's form for a step that
  changed nothing else).
* ``route()``: the library, one transaction per delivery.
* ``route_many()``: the library, each router handing over ``--batch`` events (50) per
  call: one transaction per batch, a savepoint per delivery.
* ``set-based raw``: the bulk write below with the locks and reads a ``route_many()``
  batch takes before it writes, each in one statement over the batch, on the driver:
  PostgreSQL the router's advisory locks on the claims and addresses, the addresses'
  lookup, the executions' advisory locks, their rows ``SELECT ... FOR UPDATE``; SQLite
  the addresses' lookup and the executions' rows (``json_each``). The writes are the
  bulk write's. No interpreter: the yardstick of ``route_many()`` (goal at least 0.7).
* ``bulk write`` (the physical limit for ``route_many()``): the rows a batch of
  ``route_many()`` writes, written in bulk on the driver, the same batches from the
  same 8 routers (on PostgreSQL a connection each): one transaction per batch holding
  one statement per table: the batch's dedupe claims, for the keys new in the batch
  their address rows and their execution rows (at the created position), the batch's
  executions' new positions (each execution once), the input-log rows and the ledger
  rows, then ``COMMIT``. PostgreSQL: ``INSERT ... SELECT FROM unnest(...)`` for the
  inserts, ``UPDATE ... FROM unnest(...)`` for the positions, the claims and inserts
  with the router's ``ON CONFLICT`` clauses. SQLite: an ``executemany`` per table in
  ``BEGIN IMMEDIATE``. No locks, no reads, no interpreter: the position and event bytes
  are prepared once, and the bench works out each message's outcome, execution and
  input-log ``seq`` from how many events its key has had. Checked by the driver's row
  counts of the claims, inserts and update, and after each round (untimed) by counting
  the round's ledger rows by outcome, claims, executions at the stepped position,
  input-log rows and last ``seq`` per execution.
* ``DBOS``: DBOS Transact's idiom for the same: a workflow per key (the key is its
  workflow id) looping on ``DBOS.recv_async("tick")`` and counting, started by the first
  event of its key (``DBOS.start_workflow_async``), every event sent with
  ``DBOS.send_async(workflow_id, message, "tick")`` by the same 8 routers. Measured from
  the first send to the last event received; a delivery's latency is from its send to
  its ``recv`` returning in the workflow. It runs once per database (not in the rounds:
  it is slow), after the router's rows, with DBOS launched for it alone.

The router's rows and the bulk write take turns (``--rounds`` rounds of the whole
workload per row, in a rotating order, each round on keys of its own). Reported:
deliveries per second (the median over rounds of a round's deliveries over its wall
time), p50 and p99 latency per delivery (a ``route()`` or raw delivery's own time; in a
batch every delivery is given its batch's time, since none commits before the batch
does), and the ratios: route() / raw (goal at least 0.7), route_many() / route() (goal
at least 3x on PostgreSQL, 4x on SQLite), route_many() / set-based raw (goal at least
0.7), route_many() / bulk write (no goal: how far the batch path is from the
database's limit), and route() / DBOS (goal at least 10x). Every
transaction commits durably (SQLite ``synchronous`` FULL in WAL, PostgreSQL
``synchronous_commit`` on).

The run bounds itself: no new round starts after ``--budget`` seconds (default 540),
and the DBOS row waits at most the budget left (at least 60 s) for its events.

``--split`` runs instead, on SQLite, the raw driver's row and the ``route()`` row with
one router (no other task waiting), ``--keys`` keys and ``--events`` events each,
taking turns ``--rounds`` times, every statement timed on the driver (a
``sqlite3.Connection`` whose cursors time ``execute``, given to the library through
its engine): it prints the wall time per delivery, the ``COMMIT``'s share, the other
statements', and the rest (the Python around them), the medians of the rounds. The
timing adds the same small cost per statement to both rows.
"""

from __future__ import annotations

import asyncio
import cProfile
import hashlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dbos_anchor
import sqlalchemy as sa
from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_profile,
    print_table_header,
    rotated,
    verdict,
    versions_line,
    write_json,
)

from statifier.buckets import address_bucket, bucket_of
from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core.positions import dump, dump_event
from statifier.persistence.sql import SqlAdapter
from statifier.router import Failed, InboundEvent, Router, RouterConfig, StaticResolver
from statifier.router.binding import DEFAULT_HORIZON
from statifier.sql import TableOptions, migrations
from statifier.sql.engines import sqlite_engine

ROUTERS = 8
ROUTE_GOAL = 0.7
BATCH_GOAL = {"postgresql": 3.0, "sqlite": 4.0}
SET_BASED_GOAL = 0.7
DBOS_GOAL = 10.0
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
CREATED = "created_and_delivered"
DELIVERED = "delivered"
ROWS = ("raw driver", "route()", "route_many()", "set-based raw", "bulk write")


@dataclass(frozen=True, slots=True)
class Message:
    """One event of the workload: its key and message id."""

    key: str
    message_id: str


Deliver = Callable[[Sequence[Message]], Awaitable[list[str]]]
"""Deliver some messages (one, or a batch), answering one outcome name per message."""


def _shares(scope: str, keys: int, events: int) -> list[list[Message]]:
    """Each router's messages in delivery order: round-robin over its own keys, so a
    key's first event comes before any key's second."""
    names = [f"{scope}-k{index}" for index in range(keys)]
    return [
        [Message(key, f"{key}:{turn}") for turn in range(events) for key in names[router::ROUTERS]]
        for router in range(ROUTERS)
    ]


@dataclass
class Measured:
    """One pass of the workload through one row."""

    elapsed: float
    latencies: list[float]
    outcomes: Counter[str]


async def _workload(deliver: Deliver, scope: str, keys: int, events: int, chunk: int) -> Measured:
    """The whole workload, ``chunk`` messages per call, the 8 routers at once."""
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()

    async def router(messages: list[Message]) -> None:
        clock = time.perf_counter
        for start in range(0, len(messages), chunk):
            part = messages[start : start + chunk]
            began = clock()
            answered = await deliver(part)
            latency = clock() - began
            latencies.extend([latency] * len(part))
            outcomes.update(answered)

    shares = _shares(scope, keys, events)
    started = time.perf_counter()
    await asyncio.gather(*(router(share) for share in shares))
    elapsed = time.perf_counter() - started
    expected = Counter({CREATED: keys, DELIVERED: keys * (events - 1)})
    if outcomes != expected:
        raise RuntimeError(f"{scope}: outcomes {dict(outcomes)}, expected {dict(expected)}")
    return Measured(elapsed, latencies, outcomes)


# --- the library ------------------------------------------------------------------------


class Library:
    """The rows under test: ``Router.route`` and ``Router.route_many`` over ``SqlAdapter``
    (of ``url``, or of the engine given)."""

    def __init__(self, url: str | sa.Engine, options: TableOptions, machine: Machine) -> None:
        self.adapter = SqlAdapter(url, options)
        resolver = StaticResolver({DOCUMENT: machine})
        self.router = Router(RouterConfig(self.adapter, bindings=[BINDING], resolver=resolver))
        self.scope = "bench"

    def _event(self, message: Message) -> InboundEvent:
        return InboundEvent(
            scope=self.scope,
            source=SOURCE,
            message_id=message.message_id,
            data={"key": message.key},
        )

    async def one(self, messages: Sequence[Message]) -> list[str]:
        (message,) = messages
        routed = await self.router.route(self._event(message))
        return [outcome.outcome for outcome in routed.outcomes]

    async def batch(self, messages: Sequence[Message]) -> list[str]:
        answers = await self.router.route_many([self._event(m) for m in messages])
        names: list[str] = []
        for answer in answers:
            if isinstance(answer, Failed):
                raise answer.error
            names.extend(outcome.outcome for outcome in answer.outcomes)
        return names

    async def close(self) -> None:
        await self.adapter.close()


# --- the raw drivers --------------------------------------------------------------------

_CLAIM = (
    "INSERT INTO {dedupe} AS d (binding_id, message_id, expires_at, bucket) "
    "VALUES ({p}, {p}, {p}, {p}) ON CONFLICT (binding_id, message_id) DO UPDATE SET "
    "expires_at = excluded.expires_at, bucket = excluded.bucket "
    "WHERE d.expires_at <= {p} RETURNING 1"
)
_FIND_ADDRESS = (
    "SELECT id, execution_id, terminal_seen_at FROM {addresses} "
    "WHERE scope = {p} AND document = {p} AND key = {p}"
)
_INSERT_ADDRESS = (
    "INSERT INTO {addresses} (scope, document, key, execution_id, inserted_at, bucket) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (scope, document, key) DO NOTHING "
    "RETURNING id"
)
_SAVE_CHART = (
    "INSERT INTO {charts} (content_hash, chart_blob, name, version, saved_at, retired_at, "
    "retired_by) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (content_hash) DO NOTHING"
)
_FETCH_CHART = (
    "SELECT content_hash, chart_blob, name, version, saved_at, retired_at, retired_by "
    "FROM {charts} WHERE content_hash = {p}"
)
_FETCH_EXECUTION = (
    "SELECT execution_id, content_hash, status, position_blob, metadata, outcome_blob, "
    "failure, created_at, updated_at, ended_at, error_count, last_error_at, final_state "
    "FROM {executions} WHERE execution_id = {p}{lock}"
)
_INSERT_EXECUTION = (
    "INSERT INTO {executions} (execution_id, content_hash, status, position_blob, metadata, "
    "outcome_blob, failure, created_at, updated_at, ended_at, bucket) VALUES "
    "({p}, {p}, {p}, {p}, '{{}}', {p}, {p}, {p}, {p}, {p}, {p}) "
    "ON CONFLICT (execution_id) DO NOTHING RETURNING id"
)
_APPEND = (
    "INSERT INTO {inputs} (execution_id, seq, via, input_blob, recorded_at) "
    "SELECT {p} AS anon_1, following.seq, {p} AS anon_2, "
    "CASE WHEN (CAST({p} AS INTEGER) IS NOT NULL AND following.seq >= CAST({p} AS INTEGER) - 1) "
    "THEN NULL ELSE {p} END AS anon_3, "
    "{p} AS anon_4 FROM (SELECT coalesce(max({inputs}.seq), -1) + 1 AS seq FROM {inputs} "
    "WHERE {inputs}.execution_id = {p}) AS following WHERE NOT (EXISTS (SELECT 1 AS anon_5 "
    "FROM {inputs} AS last WHERE last.execution_id = {p} AND last.seq = following.seq - 1 "
    "AND last.input_blob IS NULL)) RETURNING seq"
)
_UPDATE = (
    "UPDATE {executions} SET status={p}, position_blob={p}, outcome_blob={p}, failure={p}, "
    "updated_at={p}, ended_at={p}, error_count={p}, last_error_at={p}, final_state={p} "
    "WHERE execution_id = {p}"
)
# SQLite: the adapter's update of a step that changed only the position (the row's
# other columns already hold the values given), which writes no index page.
_UPDATE_POSITION = (
    "UPDATE {executions} SET position_blob = {p}, updated_at = {p} WHERE execution_id = {p} "
    "AND status = 'active' AND outcome_blob IS NULL AND failure IS NULL AND ended_at IS NULL "
    "AND error_count = 0 AND last_error_at IS NULL AND final_state IS NULL"
)
_RECORD = (
    "INSERT INTO {ledger} (binding_id, message_id, scope, source, outcome, reason, document, "
    "key, execution_id, inserted_at, bucket) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})"
)
_LOCKS = "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k"
_EXECUTION_LOCK = "SELECT pg_advisory_xact_lock(%s)"


def _table_names(options: TableOptions) -> dict[str, str]:
    """The qualified names of the tables a delivery writes, by their template names."""
    schema = f"{options.schema}." if options.schema else ""

    def table(name: str) -> str:
        return f"{schema}{options.name(name)}"

    return {
        "dedupe": table("dedupe"),
        "addresses": table("addresses"),
        "charts": table("charts"),
        "executions": table("executions"),
        "inputs": table("inputs"),
        "ledger": table("routing_ledger"),
    }


@dataclass(frozen=True)
class RawStatements:
    """The statement texts for one set of tables and one placeholder style."""

    claim: str
    find_address: str
    insert_address: str
    save_chart: str
    fetch_chart: str
    fetch_execution: str
    insert_execution: str
    append: str
    update: str
    record: str

    @classmethod
    def build(
        cls, options: TableOptions, placeholder: str, lock: str = "", update: str = _UPDATE
    ) -> RawStatements:
        names = _table_names(options)

        def sql(template: str) -> str:
            return template.format(p=placeholder, lock=lock, **names)

        return cls(
            sql(_CLAIM),
            sql(_FIND_ADDRESS),
            sql(_INSERT_ADDRESS),
            sql(_SAVE_CHART),
            sql(_FETCH_CHART),
            sql(_FETCH_EXECUTION),
            sql(_INSERT_EXECUTION),
            sql(_APPEND),
            sql(update),
            sql(_RECORD),
        )


@dataclass(frozen=True)
class Prepared:
    """What the ceiling prepares once: the chart's bytes and hash, a created and a
    stepped position, the stored event."""

    content_hash: str
    chart: bytes
    created: bytes
    stepped: bytes
    event: bytes

    @classmethod
    def of(cls, machine: Machine) -> Prepared:
        state, _ = initialize(machine, StartOptions(session_id="ex_01M8RCDM67CH73K8T8BA5ED4R6"))
        event = Event(BINDING.event)
        after, _ = handle_event(state, event)
        return cls(
            machine.identity.content_hash,
            machine.source,
            dump(state),
            dump(after),
            dump_event(event),
        )


def _lock_key(*parts: str) -> int:
    """The router's advisory lock key for a claim, an address or an execution (the
    same hash)."""
    digest = hashlib.blake2b("\x00".join(("statifier.router", *parts)).encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def _sqlite_time(moment: datetime) -> str:
    return moment.isoformat(" ", "microseconds")[:-6]


class RawSqlite:
    """A delivery's statements on one ``sqlite3`` connection, one writer at a time."""

    def __init__(
        self,
        path: str,
        options: TableOptions,
        prepared: Prepared,
        factory: type[sqlite3.Connection] = sqlite3.Connection,
    ) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, factory=factory)
        self.connection.execute("PRAGMA busy_timeout = 0")
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.lock = asyncio.Lock()
        self.s = RawStatements.build(options, "?", update=_UPDATE_POSITION)
        self.p = prepared
        self.scope = "bench"

    async def one(self, messages: Sequence[Message]) -> list[str]:
        (message,) = messages
        s, p, key, scope = self.s, self.p, message.key, self.scope
        async with self.lock:
            cursor = self.connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            moment = datetime.now(UTC)
            now = _sqlite_time(moment)
            expires = _sqlite_time(moment + DEFAULT_HORIZON)
            bucket = address_bucket(scope, DOCUMENT, key)
            claimed = cursor.execute(
                s.claim, (BINDING.id, message.message_id, expires, bucket, now)
            ).fetchone()
            assert claimed is not None
            found = cursor.execute(s.find_address, (scope, DOCUMENT, key)).fetchone()
            if found is None:
                outcome = CREATED
                execution_id = f"ex_{scope}_{key}"
                cursor.execute(s.insert_address, (scope, DOCUMENT, key, execution_id, now, bucket))
                cursor.fetchall()
                cursor.execute(s.save_chart, (p.content_hash, p.chart, None, None, now, None, None))
                cursor.execute(s.fetch_chart, (p.content_hash,)).fetchall()
                cursor.execute(s.fetch_execution, (execution_id,)).fetchall()
                values = (execution_id, p.content_hash, "active", p.created)
                created = (*values, None, None, now, now, None, bucket_of(execution_id))
                cursor.execute(s.insert_execution, created)
                cursor.fetchall()
            else:
                outcome = DELIVERED
                execution_id = found[1]
            cursor.execute(s.fetch_execution, (execution_id,)).fetchone()
            now = _sqlite_time(datetime.now(UTC))
            appended = (execution_id, "step", None, None, p.event, now, execution_id, execution_id)
            cursor.execute(s.append, appended).fetchall()
            cursor.execute(s.update, (p.stepped, now, execution_id))
            row = (BINDING.id, message.message_id, scope, SOURCE, outcome, None, DOCUMENT, key)
            cursor.execute(s.record, (*row, execution_id, now, bucket))
            cursor.execute("COMMIT")
        return [outcome]

    async def close(self) -> None:
        self.connection.close()


class RawPostgres:
    """A delivery's statements on psycopg 3 async, one connection per router."""

    def __init__(self, url: str, options: TableOptions, prepared: Prepared) -> None:
        self.url = url
        self.s = RawStatements.build(options, "%s", " FOR UPDATE")
        self.p = prepared
        self.idle: list[Any] = []
        self.scope = "bench"

    async def open(self, count: int) -> None:
        import psycopg

        for _ in range(count):
            self.idle.append(await psycopg.AsyncConnection.connect(self.url))

    async def one(self, messages: Sequence[Message]) -> list[str]:
        (message,) = messages
        s, p, key, scope = self.s, self.p, message.key, self.scope
        connection = self.idle.pop()
        try:
            async with connection.cursor() as cursor:
                locks = sorted(
                    {
                        _lock_key("dedupe", BINDING.id, message.message_id),
                        _lock_key("address", scope, DOCUMENT, key),
                    }
                )
                await cursor.execute(_LOCKS, (locks,))
                moment = datetime.now(UTC)
                expires = moment + DEFAULT_HORIZON
                bucket = address_bucket(scope, DOCUMENT, key)
                claim = (BINDING.id, message.message_id, expires, bucket, moment)
                await cursor.execute(s.claim, claim)
                assert await cursor.fetchone() is not None
                await cursor.execute(s.find_address, (scope, DOCUMENT, key))
                found = await cursor.fetchone()
                if found is None:
                    outcome = CREATED
                    execution_id = f"ex_{scope}_{key}"
                    address = (scope, DOCUMENT, key, execution_id, moment, bucket)
                    await cursor.execute(s.insert_address, address)
                    chart = (p.content_hash, p.chart, None, None, moment, None, None)
                    await cursor.execute(s.save_chart, chart)
                    await cursor.execute(s.fetch_chart, (p.content_hash,))
                    await cursor.fetchall()
                    await cursor.execute(_EXECUTION_LOCK, (_lock_key("execution", execution_id),))
                    await cursor.execute(s.fetch_execution, (execution_id,))
                    await cursor.fetchall()
                    values = (execution_id, p.content_hash, "active", p.created)
                    created = (*values, None, None, moment, moment, None, bucket_of(execution_id))
                    await cursor.execute(s.insert_execution, created)
                else:
                    outcome = DELIVERED
                    execution_id = found[1]
                await cursor.execute(_EXECUTION_LOCK, (_lock_key("execution", execution_id),))
                await cursor.execute(s.fetch_execution, (execution_id,))
                await cursor.fetchone()
                now = datetime.now(UTC)
                appended = (execution_id, "step", None, None, p.event, now, execution_id)
                await cursor.execute(s.append, (*appended, execution_id))
                await cursor.fetchall()
                stepped = ("active", p.stepped, None, None, now, None, 0, None, None, execution_id)
                await cursor.execute(s.update, stepped)
                row = (BINDING.id, message.message_id, scope, SOURCE, outcome, None, DOCUMENT)
                await cursor.execute(s.record, (*row, key, execution_id, moment, bucket))
            await connection.commit()
        except BaseException:
            await connection.rollback()
            raise
        finally:
            self.idle.append(connection)
        return [outcome]

    async def close(self) -> None:
        for connection in self.idle:
            await connection.close()


# --- the bulk writes --------------------------------------------------------------------

_BULK_PG_CLAIM = (
    "INSERT INTO {dedupe} AS d (binding_id, message_id, expires_at, bucket) "
    "SELECT %s, u.message_id, %s, u.bucket FROM unnest(%s::text[], %s::smallint[]) "
    "AS u(message_id, bucket) ON CONFLICT (binding_id, message_id) DO UPDATE SET "
    "expires_at = excluded.expires_at, bucket = excluded.bucket WHERE d.expires_at <= %s"
)
_BULK_PG_ADDRESSES = (
    "INSERT INTO {addresses} (scope, document, key, execution_id, inserted_at, bucket) "
    "SELECT %s, %s, u.key, u.execution_id, %s, u.bucket "
    "FROM unnest(%s::text[], %s::text[], %s::smallint[]) "
    "AS u(key, execution_id, bucket) ON CONFLICT (scope, document, key) DO NOTHING"
)
_BULK_PG_EXECUTIONS = (
    "INSERT INTO {executions} (execution_id, content_hash, status, position_blob, metadata, "
    "created_at, updated_at, bucket) SELECT u.execution_id, %s, 'active', u.position_blob, "
    "'{{}}'::jsonb, %s, %s, u.bucket FROM unnest(%s::text[], %s::bytea[], %s::smallint[]) "
    "AS u(execution_id, position_blob, bucket) ON CONFLICT (execution_id) DO NOTHING"
)
_BULK_PG_POSITIONS = (
    "UPDATE {executions} AS x SET status = 'active', position_blob = u.position_blob, "
    "outcome_blob = NULL, failure = NULL, updated_at = %s, ended_at = NULL, error_count = 0, "
    "last_error_at = NULL, final_state = NULL "
    "FROM unnest(%s::text[], %s::bytea[]) AS u(execution_id, position_blob) "
    "WHERE x.execution_id = u.execution_id"
)
_BULK_PG_INPUTS = (
    "INSERT INTO {inputs} (execution_id, seq, via, input_blob, recorded_at) "
    "SELECT u.execution_id, u.seq, 'step', u.input_blob, %s "
    "FROM unnest(%s::text[], %s::integer[], %s::bytea[]) AS u(execution_id, seq, input_blob)"
)
_BULK_PG_LEDGER = (
    "INSERT INTO {ledger} (binding_id, message_id, scope, source, outcome, document, key, "
    "execution_id, inserted_at, bucket) SELECT %s, u.message_id, %s, %s, u.outcome, %s, u.key, "
    "u.execution_id, %s, u.bucket "
    "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::smallint[]) "
    "AS u(message_id, outcome, key, execution_id, bucket)"
)
_BULK_SQLITE_CLAIM = (
    "INSERT INTO {dedupe} AS d (binding_id, message_id, expires_at, bucket) "
    "VALUES (?, ?, ?, ?) ON CONFLICT (binding_id, message_id) DO UPDATE SET "
    "expires_at = excluded.expires_at, bucket = excluded.bucket WHERE d.expires_at <= ?"
)
_BULK_SQLITE_ADDRESSES = (
    "INSERT INTO {addresses} (scope, document, key, execution_id, inserted_at, bucket) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, document, key) DO NOTHING"
)
_BULK_SQLITE_EXECUTIONS = (
    "INSERT INTO {executions} (execution_id, content_hash, status, position_blob, metadata, "
    "created_at, updated_at, bucket) VALUES (?, ?, 'active', ?, '{{}}', ?, ?, ?) "
    "ON CONFLICT (execution_id) DO NOTHING"
)
_BULK_SQLITE_POSITIONS = _UPDATE_POSITION.replace("{p}", "?")
_BULK_SQLITE_INPUTS = (
    "INSERT INTO {inputs} (execution_id, seq, via, input_blob, recorded_at) "
    "VALUES (?, ?, 'step', ?, ?)"
)
_BULK_SQLITE_LEDGER = (
    "INSERT INTO {ledger} (binding_id, message_id, scope, source, outcome, document, key, "
    "execution_id, inserted_at, bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BULK_CHECK = (
    "SELECT (SELECT count(*) FROM {ledger} WHERE scope = {p} AND outcome = {p}), "
    "(SELECT count(*) FROM {ledger} WHERE scope = {p} AND outcome = {p}), "
    "(SELECT count(*) FROM {dedupe} WHERE message_id LIKE {p}), "
    "(SELECT count(*) FROM {addresses} AS a JOIN {executions} AS x "
    "ON x.execution_id = a.execution_id WHERE a.scope = {p} AND x.position_blob = {p}), "
    "(SELECT count(*) FROM {addresses} AS a JOIN {inputs} AS i "
    "ON i.execution_id = a.execution_id WHERE a.scope = {p}), "
    "(SELECT count(*) FROM {addresses} AS a JOIN {inputs} AS i "
    "ON i.execution_id = a.execution_id WHERE a.scope = {p} AND i.seq = {p})"
)


_READ_ADDRESSES_PG = (
    "SELECT key, execution_id FROM {addresses} WHERE scope = %s AND document = %s "
    "AND key = ANY(%s::text[])"
)
_READ_EXECUTIONS_PG = (
    "SELECT execution_id, content_hash, status, position_blob, metadata, outcome_blob, "
    "failure, created_at, updated_at, ended_at, error_count, last_error_at, final_state "
    "FROM {executions} WHERE execution_id = ANY(%s::text[]) ORDER BY execution_id FOR UPDATE"
)
_READ_ADDRESSES_SQLITE = (
    "SELECT key, execution_id FROM {addresses} WHERE scope = ? AND document = ? "
    "AND key IN (SELECT value FROM json_each(?))"
)
_READ_EXECUTIONS_SQLITE = (
    "SELECT execution_id, content_hash, status, position_blob, metadata, outcome_blob, "
    "failure, created_at, updated_at, ended_at, error_count, last_error_at, final_state "
    "FROM {executions} WHERE execution_id IN (SELECT value FROM json_each(?)) "
    "ORDER BY execution_id"
)


@dataclass(frozen=True)
class BulkStatements:
    """The bulk rows' statement texts for one set of tables: one statement per table a
    batch writes, the count that checks a round, and the reads the set-based raw row
    adds."""

    claim: str
    insert_addresses: str
    insert_executions: str
    update_positions: str
    append_inputs: str
    record: str
    check: str
    read_addresses: str
    read_executions: str

    @classmethod
    def postgres(cls, options: TableOptions) -> BulkStatements:
        names = _table_names(options)
        return cls(
            _BULK_PG_CLAIM.format(**names),
            _BULK_PG_ADDRESSES.format(**names),
            _BULK_PG_EXECUTIONS.format(**names),
            _BULK_PG_POSITIONS.format(**names),
            _BULK_PG_INPUTS.format(**names),
            _BULK_PG_LEDGER.format(**names),
            _BULK_CHECK.format(p="%s", **names),
            _READ_ADDRESSES_PG.format(**names),
            _READ_EXECUTIONS_PG.format(**names),
        )

    @classmethod
    def sqlite(cls, options: TableOptions) -> BulkStatements:
        names = _table_names(options)
        return cls(
            _BULK_SQLITE_CLAIM.format(**names),
            _BULK_SQLITE_ADDRESSES.format(**names),
            _BULK_SQLITE_EXECUTIONS.format(**names),
            _BULK_SQLITE_POSITIONS.format(**names),
            _BULK_SQLITE_INPUTS.format(**names),
            _BULK_SQLITE_LEDGER.format(**names),
            _BULK_CHECK.format(p="?", **names),
            _READ_ADDRESSES_SQLITE.format(**names),
            _READ_EXECUTIONS_SQLITE.format(**names),
        )


@dataclass(frozen=True, slots=True)
class BulkBatch:
    """What one batch writes, worked out by the bench from its messages alone (it knows
    how many events each key has had): no reads, no interpreter. Per message its claim,
    key, execution, input-log ``seq`` and ledger outcome; the keys new in the batch with
    their executions; and the batch's executions, each once, for the position update.
    ``buckets``: each message's claim's bucket (its address's)."""

    message_ids: list[str]
    keys: list[str]
    buckets: list[int]
    execution_ids: list[str]
    seqs: list[int]
    outcomes: list[str]
    new_keys: list[str]
    new_execution_ids: list[str]
    stepped: list[str]

    @classmethod
    def of(cls, scope: str, messages: Sequence[Message], counts: dict[str, int]) -> BulkBatch:
        """The batch of ``messages``; ``counts`` (events so far per key) is brought up to
        date."""
        keys = [message.key for message in messages]
        execution_ids = [f"ex_{scope}_{key}" for key in keys]
        seqs: list[int] = []
        outcomes: list[str] = []
        new_keys: list[str] = []
        for key in keys:
            seq = counts.get(key, 0)
            counts[key] = seq + 1
            seqs.append(seq)
            outcomes.append(DELIVERED if seq else CREATED)
            if not seq:
                new_keys.append(key)
        return cls(
            [message.message_id for message in messages],
            keys,
            [address_bucket(scope, DOCUMENT, key) for key in keys],
            execution_ids,
            seqs,
            outcomes,
            new_keys,
            [f"ex_{scope}_{key}" for key in new_keys],
            list(dict.fromkeys(execution_ids)),
        )


def _expect(what: str, count: int, expected: int) -> None:
    """Check a bulk statement's row count (the driver's, no read)."""
    if count != expected:
        raise RuntimeError(f"bulk write: {count} {what}, expected {expected}")


def _check_params(scope: str, prepared: Prepared, events: int) -> tuple[Any, ...]:
    return (
        *(scope, CREATED, scope, DELIVERED, f"{scope}-k%"),
        *(scope, prepared.stepped, scope, scope, events - 1),
    )


def _verify(scope: str, found: Sequence[Any], keys: int, events: int) -> None:
    """Check the rows a round of the bulk row left: its ledger rows by outcome, its
    claims, its executions at the stepped position, its input-log rows and their last
    ``seq`` per execution."""
    expected = (keys, keys * (events - 1), keys * events, keys, keys * events, keys)
    if tuple(found) != expected:
        raise RuntimeError(
            f"{scope}: bulk write left {tuple(found)} (ledger created, delivered, claims, "
            f"stepped executions, input-log rows, last seqs), expected {expected}"
        )


class BulkSqlite:
    """A batch's rows written in bulk on one ``sqlite3`` connection, one writer at a
    time: in one ``BEGIN IMMEDIATE`` transaction per batch, one ``executemany`` per
    table (the claims, the new keys' addresses and executions, the positions, the
    input-log rows, the ledger rows), then ``COMMIT``."""

    def __init__(self, path: str, options: TableOptions, prepared: Prepared) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None)
        self.connection.execute("PRAGMA busy_timeout = 0")
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("PRAGMA synchronous = FULL")
        self.lock = asyncio.Lock()
        self.s = BulkStatements.sqlite(options)
        self.p = prepared
        self.scope = "bench"
        self.counts: dict[str, int] = {}

    async def batch(self, messages: Sequence[Message]) -> list[str]:
        s, p, scope = self.s, self.p, self.scope
        b = BulkBatch.of(scope, messages, self.counts)
        async with self.lock:
            cursor = self.connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            moment = datetime.now(UTC)
            now = _sqlite_time(moment)
            expires = _sqlite_time(moment + DEFAULT_HORIZON)
            claims = [
                (BINDING.id, message_id, expires, bucket, now)
                for message_id, bucket in zip(b.message_ids, b.buckets, strict=True)
            ]
            cursor.executemany(s.claim, claims)
            _expect("claims", cursor.rowcount, len(claims))
            self.read(cursor, b)
            if b.new_keys:
                new = list(zip(b.new_keys, b.new_execution_ids, strict=True))
                addresses = [
                    (scope, DOCUMENT, key, execution, now, address_bucket(scope, DOCUMENT, key))
                    for key, execution in new
                ]
                cursor.executemany(s.insert_addresses, addresses)
                _expect("addresses", cursor.rowcount, len(new))
                created = [
                    (e, p.content_hash, p.created, now, now, bucket_of(e))
                    for e in b.new_execution_ids
                ]
                cursor.executemany(s.insert_executions, created)
                _expect("executions", cursor.rowcount, len(new))
            cursor.executemany(s.update_positions, [(p.stepped, now, e) for e in b.stepped])
            _expect("positions", cursor.rowcount, len(b.stepped))
            steps = zip(b.execution_ids, b.seqs, strict=True)
            cursor.executemany(s.append_inputs, [(e, seq, p.event, now) for e, seq in steps])
            rows = zip(b.message_ids, b.outcomes, b.keys, b.execution_ids, b.buckets, strict=True)
            ledger = [
                (BINDING.id, m, scope, SOURCE, o, DOCUMENT, k, e, now, bucket)
                for m, o, k, e, bucket in rows
            ]
            cursor.executemany(s.record, ledger)
            cursor.execute("COMMIT")
        return b.outcomes

    def read(self, cursor: sqlite3.Cursor, b: BulkBatch) -> None:
        """What the batch reads before it writes: nothing here (see
        :class:`SetBasedSqlite`)."""

    async def check(self, keys: int, events: int) -> None:
        """Count what the round just run (``self.scope``) left (not timed)."""
        params = _check_params(self.scope, self.p, events)
        _verify(self.scope, self.connection.execute(self.s.check, params).fetchone(), keys, events)

    async def close(self) -> None:
        self.connection.close()


class BulkPostgres:
    """A batch's rows written in bulk on psycopg 3 async, one connection per router: in
    one transaction per batch, one statement per table over arrays (``unnest``: the
    claims, the new keys' addresses and executions, the positions' ``UPDATE ... FROM``,
    the input-log rows, the ledger rows), then ``COMMIT``."""

    def __init__(self, url: str, options: TableOptions, prepared: Prepared) -> None:
        self.url = url
        self.s = BulkStatements.postgres(options)
        self.p = prepared
        self.idle: list[Any] = []
        self.scope = "bench"
        self.counts: dict[str, int] = {}

    async def open(self, count: int) -> None:
        import psycopg

        for _ in range(count):
            self.idle.append(await psycopg.AsyncConnection.connect(self.url))

    async def batch(self, messages: Sequence[Message]) -> list[str]:
        s, p, scope = self.s, self.p, self.scope
        b = BulkBatch.of(scope, messages, self.counts)
        connection = self.idle.pop()
        try:
            async with connection.cursor() as cursor:
                moment = datetime.now(UTC)
                expires = moment + DEFAULT_HORIZON
                claims = (BINDING.id, expires, b.message_ids, b.buckets, moment)
                await cursor.execute(s.claim, claims)
                _expect("claims", cursor.rowcount, len(b.message_ids))
                await self.read(cursor, b)
                if b.new_keys:
                    buckets = [address_bucket(scope, DOCUMENT, key) for key in b.new_keys]
                    new = (b.new_keys, b.new_execution_ids, buckets)
                    await cursor.execute(s.insert_addresses, (scope, DOCUMENT, moment, *new))
                    _expect("addresses", cursor.rowcount, len(b.new_keys))
                    blobs = [p.created] * len(b.new_keys)
                    made = b.new_execution_ids
                    created = (
                        p.content_hash,
                        moment,
                        moment,
                        made,
                        blobs,
                        list(map(bucket_of, made)),
                    )
                    await cursor.execute(s.insert_executions, created)
                    _expect("executions", cursor.rowcount, len(b.new_keys))
                positions = (moment, b.stepped, [p.stepped] * len(b.stepped))
                await cursor.execute(s.update_positions, positions)
                _expect("positions", cursor.rowcount, len(b.stepped))
                inputs = (moment, b.execution_ids, b.seqs, [p.event] * len(b.seqs))
                await cursor.execute(s.append_inputs, inputs)
                rows = (b.message_ids, b.outcomes, b.keys, b.execution_ids, b.buckets)
                await cursor.execute(s.record, (BINDING.id, scope, SOURCE, DOCUMENT, moment, *rows))
            await connection.commit()
        except BaseException:
            await connection.rollback()
            raise
        finally:
            self.idle.append(connection)
        return b.outcomes

    async def read(self, cursor: Any, b: BulkBatch) -> None:
        """What the batch locks and reads before it writes: nothing here (see
        :class:`SetBasedPostgres`)."""

    async def check(self, keys: int, events: int) -> None:
        """Count what the round just run (``self.scope``) left (not timed)."""
        connection = self.idle[0]
        async with connection.cursor() as cursor:
            await cursor.execute(self.s.check, _check_params(self.scope, self.p, events))
            found = await cursor.fetchone()
        await connection.rollback()
        _verify(self.scope, found, keys, events)

    async def close(self) -> None:
        for connection in self.idle:
            await connection.close()


class SetBasedSqlite(BulkSqlite):
    """The bulk write with the reads a ``route_many()`` batch makes before it writes,
    each in one statement: the batch's addresses and its executions' rows."""

    def read(self, cursor: sqlite3.Cursor, b: BulkBatch) -> None:
        keys = json.dumps(list(dict.fromkeys(b.keys)))
        cursor.execute(self.s.read_addresses, (self.scope, DOCUMENT, keys)).fetchall()
        found = cursor.execute(self.s.read_executions, (json.dumps(b.stepped),)).fetchall()
        _expect("executions read", len(found), len(b.stepped) - len(b.new_keys))


class SetBasedPostgres(BulkPostgres):
    """The bulk write with the locks and reads a ``route_many()`` batch takes before
    it writes, each in one statement: the router's locks on the claims and the
    addresses, the addresses, the executions' locks and their rows."""

    async def read(self, cursor: Any, b: BulkBatch) -> None:
        keys = list(dict.fromkeys(b.keys))
        router_locks = sorted(
            {_lock_key("dedupe", BINDING.id, m) for m in b.message_ids}
            | {_lock_key("address", self.scope, DOCUMENT, k) for k in keys}
        )
        await cursor.execute(_LOCKS, (router_locks,))
        await cursor.execute(self.s.read_addresses, (self.scope, DOCUMENT, keys))
        await cursor.fetchall()
        execution_locks = sorted({_lock_key("execution", i) for i in b.stepped})
        await cursor.execute(_LOCKS, (execution_locks,))
        await cursor.execute(self.s.read_executions, (b.stepped,))
        found = await cursor.fetchall()
        _expect("executions read", len(found), len(b.stepped) - len(b.new_keys))


Bulk = BulkSqlite | BulkPostgres


# --- the router's rows ------------------------------------------------------------------


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _summary(rates: list[float], latencies: list[float]) -> dict[str, Any]:
    return {
        "deliveries_per_s": statistics.median(rates),
        "p50_ms": _percentile(latencies, 0.50) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
        "samples_deliveries_per_s": rates,
    }


@dataclass(frozen=True)
class Workload:
    keys: int
    events: int
    batch: int
    rounds: int
    deadline: float


async def _router_rows(
    name: str, url: str, options: TableOptions, work: Workload, keep_gc: bool
) -> dict[str, Any]:
    machine = compile_chart(CHART)
    library = Library(url, options, machine)
    prepared = Prepared.of(machine)
    raw: RawSqlite | RawPostgres
    bulk: Bulk
    set_based: Bulk
    if name == "sqlite":
        path = url.removeprefix("sqlite:///")
        raw = RawSqlite(path, options, prepared)
        bulk = BulkSqlite(path, options, prepared)
        set_based = SetBasedSqlite(path, options, prepared)
    else:
        raw = RawPostgres(url, options, prepared)
        bulk = BulkPostgres(url, options, prepared)
        set_based = SetBasedPostgres(url, options, prepared)
        await raw.open(ROUTERS)
        await bulk.open(ROUTERS)
        await set_based.open(ROUTERS)
    rows: dict[str, tuple[Deliver, int, Library | RawSqlite | RawPostgres | Bulk]] = {
        "raw driver": (raw.one, 1, raw),
        "route()": (library.one, 1, library),
        "route_many()": (library.batch, work.batch, library),
        "set-based raw": (set_based.batch, work.batch, set_based),
        "bulk write": (bulk.batch, work.batch, bulk),
    }
    checks: dict[str, Callable[[int, int], Awaitable[None]]] = {
        "bulk write": bulk.check,
        "set-based raw": set_based.check,
    }
    rates: dict[str, list[float]] = {row: [] for row in rows}
    latencies: dict[str, list[float]] = {row: [] for row in rows}
    rounds_run = 0
    try:
        for index, (row, (deliver, chunk, owner)) in enumerate(rows.items()):
            owner.scope = f"warm{index}"  # connections, statements, caches
            await _workload(deliver, owner.scope, ROUTERS * 2, 2, chunk)
            if row in checks:
                await checks[row](ROUTERS * 2, 2)
        with collector_paused(keep_gc):
            for turn in range(work.rounds):
                if turn and time.monotonic() > work.deadline:
                    print(f"({name}: budget spent, stopped after {turn} rounds)")
                    break
                for row in rotated(list(rows), turn):
                    deliver, chunk, owner = rows[row]
                    owner.scope = f"r{turn}-{ROWS.index(row)}"
                    measured = await _workload(deliver, owner.scope, work.keys, work.events, chunk)
                    if row in checks:
                        await checks[row](work.keys, work.events)
                    rates[row].append(len(measured.latencies) / measured.elapsed)
                    latencies[row].extend(measured.latencies)
                rounds_run = turn + 1
    finally:
        await raw.close()
        await bulk.close()
        await set_based.close()
        await library.close()
    result: dict[str, Any] = {row: _summary(rates[row], latencies[row]) for row in rows}
    result["rounds"] = rounds_run
    return result


# --- DBOS -------------------------------------------------------------------------------


def _dbos_row(
    name: str, postgres_url: str, directory: str, keys: int, events: int, wait_s: float
) -> dict[str, Any]:
    measured = dbos_anchor.run(
        name, postgres_url, directory, keys=keys, events=events, senders=ROUTERS, wait_s=wait_s
    )
    result = _summary([measured.rate], measured.latencies)
    result["sends_s"] = measured.sends_s
    result["keys"] = keys
    result["events"] = events
    return result


# --- running ----------------------------------------------------------------------------


def _prepare(name: str, postgres_url: str, directory: str) -> tuple[str, TableOptions]:
    if name == "sqlite":
        url = f"sqlite:///{os.path.join(directory, 'router.db')}"
        options = TableOptions(prefix="bench_")
    else:
        url = postgres_url
        schema = f"statifier_router_bench_{uuid.uuid4().hex[:8]}"
        options = TableOptions(prefix="bench_", schema=schema)
    migrations.upgrade(url, options)
    return url, options


def _drop(name: str, url: str, options: TableOptions) -> None:
    if name == "postgresql" and options.schema is not None:
        import sqlalchemy as sa

        engine = sa.create_engine(migrations.sync_url(url))
        with engine.begin() as connection:
            connection.execute(sa.schema.DropSchema(options.schema, cascade=True))
        engine.dispose()


def _profile(name: str, postgres_url: str, keys: int, events: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        url, options = _prepare(name, postgres_url, directory)

        async def run() -> None:
            library = Library(url, options, compile_chart(CHART))
            library.scope = "warm"
            await _workload(library.one, library.scope, ROUTERS * 2, 2, 1)
            library.scope = "profiled"
            profiler = cProfile.Profile()
            profiler.enable()
            await _workload(library.one, library.scope, keys, events, 1)
            profiler.disable()
            await library.close()
            print_profile(profiler, 40)

        try:
            asyncio.run(run())
        finally:
            _drop(name, url, options)


# --- where a SQLite delivery's time goes ------------------------------------------------


class StatementTimes:
    """The time spent in ``execute`` on the driver, by statement kind (its first word,
    ``INSERT``/``UPDATE`` with their table), over every connection made with
    :meth:`factory`."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def factory(self) -> type[sqlite3.Connection]:
        """A connection class whose cursors add each ``execute``'s time here."""
        seconds = self.seconds
        clock = time.perf_counter

        def kind(sql: str) -> str:
            words = sql.split(maxsplit=3)
            if words[0] in ("INSERT", "UPDATE") and len(words) > 2:
                table = words[2] if words[0] == "INSERT" else words[1]
                return f"{words[0]} {table.split('.')[-1]}"
            return words[0]

        class TimedCursor(sqlite3.Cursor):
            def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
                began = clock()
                try:
                    return super().execute(sql, parameters)
                finally:
                    seconds[kind(sql)] += clock() - began

        class TimedConnection(sqlite3.Connection):
            def cursor(self, factory: Any = TimedCursor) -> Any:
                return super().cursor(factory)

            def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
                return self.cursor().execute(sql, parameters)

        return TimedConnection


def _split(keys: int, events: int, rounds: int) -> None:
    """Print where a delivery's time goes on SQLite, for the raw row and ``route()``."""
    times = StatementTimes()
    factory = times.factory()
    with tempfile.TemporaryDirectory() as directory:
        url, options = _prepare("sqlite", "", directory)
        engine = sqlite_engine(url, connect_args={"factory": factory})
        machine = compile_chart(CHART)
        library = Library(engine, options, machine)
        raw = RawSqlite(url.removeprefix("sqlite:///"), options, Prepared.of(machine), factory)
        owners: dict[str, Library | RawSqlite] = {"raw driver": raw, "route()": library}
        found: dict[str, list[dict[str, float]]] = {row: [] for row in owners}

        async def run() -> None:
            for index, owner in enumerate(owners.values()):
                owner.scope = f"warm{index}"
                for message in _shares(owner.scope, ROUTERS * 2, 2)[0]:
                    await owner.one([message])
            for turn in range(rounds):
                for row in rotated(list(owners), turn):
                    owner = owners[row]
                    owner.scope = f"r{turn}-{row}"
                    messages = _shares(owner.scope, keys, events)
                    ordered = [m for share in messages for m in share]
                    ordered.sort(key=lambda message: int(message.message_id.rsplit(":", 1)[1]))
                    times.seconds.clear()
                    started = time.perf_counter()
                    for message in ordered:
                        await owner.one([message])
                    wall = time.perf_counter() - started
                    count = len(ordered)
                    split = {kind: spent / count for kind, spent in times.seconds.items()}
                    split["wall"] = wall / count
                    found[row].append(split)
            await library.close()
            await raw.close()

        try:
            with collector_paused(False):
                asyncio.run(run())
        finally:
            engine.dispose()
    print(f"SQLite, one router, {keys} keys x {events} events, {rounds} rounds (medians, us)")
    print(f"{'row':<11} {'delivery':>9} {'COMMIT':>8} {'other statements':>17} {'the rest':>9}")
    for row, splits in found.items():
        parts = [
            _median_us(splits, lambda split: split["wall"]),
            _median_us(splits, lambda split: split.get("COMMIT", 0.0)),
            _median_us(splits, lambda split: _statements(split) - split.get("COMMIT", 0.0)),
            _median_us(splits, lambda split: split["wall"] - _statements(split)),
        ]
        wall, commit, other, rest = parts
        print(f"{row:<11} {wall:>9.0f} {commit:>8.0f} {other:>17.0f} {rest:>9.0f}")
    print()
    for row, splits in found.items():
        kinds = sorted({kind for split in splits for kind in split if kind != "wall"})
        spent = ", ".join(
            f"{kind} {_median_us(splits, lambda split, kind=kind: split.get(kind, 0.0)):.1f}"
            for kind in kinds
        )
        print(f"{row}: {spent}")


def _statements(split: dict[str, float]) -> float:
    """The seconds of a delivery spent in the driver's ``execute``."""
    return sum(seconds for kind, seconds in split.items() if kind != "wall")


def _median_us(splits: list[dict[str, float]], of: Callable[[dict[str, float]], float]) -> float:
    """The median over the rounds' ``splits`` of ``of``, in microseconds."""
    return statistics.median(of(split) for split in splits) * 1e6


def _ratio(numerator: dict[str, Any] | None, denominator: dict[str, Any] | None) -> float | None:
    if not numerator or not denominator:
        return None
    return float(numerator["deliveries_per_s"] / denominator["deliveries_per_s"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: fewer keys and rounds")
    parser.add_argument("--keys", type=int, help="keys per row (default 1000, quick 200)")
    parser.add_argument("--events", type=int, help="events per key (default 5, quick 3)")
    parser.add_argument("--batch", type=int, default=50, help="events per route_many call")
    parser.add_argument("--rounds", type=int, help="rounds per router row (default 3, quick 2)")
    parser.add_argument("--dbos-keys", type=int, help="keys of the DBOS row (default: --keys)")
    parser.add_argument("--no-dbos", action="store_true", help="leave the DBOS row out")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds before rounds stop")
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", help="the PostgreSQL URL")
    parser.add_argument(
        "--profile", choices=("sqlite", "postgresql"), help="cProfile the route() row instead"
    )
    parser.add_argument(
        "--split", action="store_true", help="time the statements of SQLite's route() and raw rows"
    )
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    keys = args.keys or (200 if args.quick else 1000)
    events = args.events or (3 if args.quick else 5)
    rounds = args.rounds or (2 if args.quick else 3)
    dbos_keys = args.dbos_keys or keys
    if keys < ROUTERS or events < 2 or args.batch < 1 or rounds < 1:
        parser.error(f"need at least {ROUTERS} keys, 2 events, a batch of 1 and 1 round")
    postgres_url = args.url or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES
    if args.profile:
        _profile(args.profile, postgres_url, keys, events)
        return 0
    if args.split:
        _split(keys, events, rounds)
        return 0
    with_dbos = not args.no_dbos and dbos_anchor.available()
    started = time.monotonic()
    work = Workload(keys, events, args.batch, rounds, started + args.budget)

    info = machine_info(["statifier", "sqlalchemy", "psycopg", "dbos"])
    print(machine_summary(info))
    print(versions_line(info))
    print(
        f"{keys} keys x {events} events = {keys * events} deliveries per row and round, "
        f"{ROUTERS} routers, route_many batches of {args.batch}, {rounds} rounds; DBOS "
        + (f"{dbos_keys} keys x {events} events, once" if with_dbos else "not run")
        + f"; collector {collector_state(args.gc)}\n"
    )
    if not args.no_dbos and not with_dbos:
        print("(dbos is not installed: pip install dbos, or the project's bench extra)\n")
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    results: dict[str, Any] = {}
    header = (
        f"{'database':<11} {'row':<13} {'deliveries/s':>12} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'ratio':>7}  ratio of"
    )
    print_table_header(header)

    def line(name: str, row: str, cells: dict[str, Any], ratio: float | None, of: str) -> None:
        print(
            f"{name:<11} {row:<13} {cells['deliveries_per_s']:>12,.0f} "
            f"{cells['p50_ms']:>8.2f} {cells['p99_ms']:>8.2f} {fmt_ratio(ratio):>7}  {of}"
        )

    for name in databases:
        with tempfile.TemporaryDirectory() as directory:
            url, options = _prepare(name, postgres_url, directory)
            try:
                result = asyncio.run(_router_rows(name, url, options, work, args.gc))
            finally:
                _drop(name, url, options)
            if with_dbos:
                timeout = max(60.0, work.deadline - time.monotonic())
                result["DBOS"] = _dbos_row(
                    name, postgres_url, directory, dbos_keys, events, timeout
                )
        result["route_vs_raw"] = _ratio(result["route()"], result["raw driver"])
        result["batch_vs_route"] = _ratio(result["route_many()"], result["route()"])
        result["batch_vs_bulk"] = _ratio(result["route_many()"], result["bulk write"])
        result["batch_vs_set_based"] = _ratio(result["route_many()"], result["set-based raw"])
        result["route_vs_dbos"] = _ratio(result["route()"], result.get("DBOS"))
        result["batch_vs_dbos"] = _ratio(result["route_many()"], result.get("DBOS"))
        results[name] = result
        line(name, "raw driver", result["raw driver"], None, "")
        line(name, "route()", result["route()"], result["route_vs_raw"], "route() / raw")
        line(
            name,
            "route_many()",
            result["route_many()"],
            result["batch_vs_route"],
            "route_many() / route()",
        )
        set_of = "route_many() / set-based raw"
        line(name, "set-based raw", result["set-based raw"], result["batch_vs_set_based"], set_of)
        bulk_of = "route_many() / bulk write"
        line(name, "bulk write", result["bulk write"], result["batch_vs_bulk"], bulk_of)
        if "DBOS" in result:
            ratios = f"route() / DBOS; route_many() / DBOS {fmt_ratio(result['batch_vs_dbos'])}"
            line(name, "DBOS", result["DBOS"], result["route_vs_dbos"], ratios)
    print()
    for name, result in results.items():
        print(f"route_many() / bulk write on {name}: {fmt_ratio(result['batch_vs_bulk'])}")
    for name, result in results.items():
        print(
            f"goal (route() >= {ROUTE_GOAL} of the raw driver) on {name}: "
            f"{verdict(result['route_vs_raw'] >= ROUTE_GOAL)}"
        )
        goal = BATCH_GOAL[name]
        met = result["batch_vs_route"] >= goal
        print(f"goal (route_many() >= {goal:.0f}x route()) on {name}: {verdict(met)}")
        met = result["batch_vs_set_based"] >= SET_BASED_GOAL
        print(
            f"goal (route_many() >= {SET_BASED_GOAL} of the set-based raw) on {name}: "
            f"{verdict(met)}"
        )
        if result["route_vs_dbos"] is not None:
            print(
                f"goal (route() >= {DBOS_GOAL:.0f}x DBOS) on {name}: "
                f"{verdict(result['route_vs_dbos'] >= DBOS_GOAL)}"
            )
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(
            args.json,
            "router",
            {
                "machine": info,
                "keys": keys,
                "events": events,
                "batch": args.batch,
                "rounds": rounds,
                "routers": ROUTERS,
                "dbos_keys": dbos_keys if with_dbos else None,
                "collector": collector_state(args.gc),
                "results": results,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
