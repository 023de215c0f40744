"""Tenancy by PostgreSQL row-level security through every step the router drives.

The tables get a leading ``tenant`` column whose default is the transaction's
``app.tenant`` setting, and the executions' and the router's tables a forced policy: a
row is seen when its tenant is the setting, or when no tenant is set (what the router
runs before ``on_begin``: a timer batch's claim and read-ahead, a route batch's
locks); a row is inserted only with the tenant set, and only as its own (one may be
moved with none set: a timer whose payload cannot be read is put off unscoped). The charts
table is shared: a chart is stored once by its content hash, whoever runs it. The
router connects as a plain login role (a superuser bypasses every policy), and
``on_begin`` sets the tenant with ``SET LOCAL`` (``set_config(..., true)``).

Two tenants route events, have timers fire (two in one batch transaction, then one
fire refused by the wrapper and retried later) and send to execution targets from
those fires; a route batch's wrapper refuses one tenant's event. Every row the steps
wrote carries its own tenant, and each step saw its own rows only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from psycopg import sql
from tests.persistence.conftest import drop_schema, unique_name
from tests.router.conftest import Clock

from statifier.chart import Machine, compile_chart
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router import (
    Binding,
    Entry,
    Failed,
    InboundEvent,
    Routed,
    Router,
    RouterConfig,
    StaticResolver,
)
from statifier.router.binding import Create
from statifier.router.timer_worker import TimerWorker
from statifier.sql import TableOptions, migrations

_T = TypeVar("_T")

PREFIX = "r_"
GUARDED = (
    "executions",
    "inputs",
    "step_errors",
    "addresses",
    "dedupe",
    "routing_ledger",
    "timers",
    "outbox",
    "subscriptions",
)
"""The tables under the policy: the executions' and the router's."""

SENDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle">
    <transition event="go" target="waiting"><send event="tick" delay="1s"/></transition>
  </state>
  <state id="waiting">
    <transition event="tick" target="ticked">
      <send type="test:sink" target="execution" event="poke">
        <param name="document" expr="'receiver'"/>
        <param name="key" expr="'r'"/>
        <param name="create" expr="'if_absent'"/>
      </send>
    </transition>
  </state>
  <state id="ticked"/>
</scxml>"""
"""``go`` schedules a tick a second on; the tick pokes the receiver at key ``r``."""

RECEIVER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
  <datamodel><data id="got" expr="0"/></datamodel>
  <state id="on">
    <transition event="poke"><assign location="got" expr="got + 1"/></transition>
  </state>
</scxml>"""


def _tenant() -> list[sa.Column[Any]]:
    default = sa.text("current_setting('app.tenant', true)")
    return [sa.Column("tenant", sa.Text(), nullable=True, server_default=default)]


@dataclass(frozen=True)
class Tenancy:
    """A schema migrated with the tenant column and the policy, and a plain login role
    that may use it."""

    admin_url: str
    role_url: str
    schema: str
    options: TableOptions

    def table(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(PREFIX + name))

    def rows(self, query: sql.Composed) -> list[tuple[Any, ...]]:
        """``query``'s rows, read as the superuser: every tenant's."""
        with psycopg.connect(self.admin_url) as connection:
            return connection.execute(query).fetchall()


def _guard(connection: psycopg.Connection[Any], tenancy: Tenancy, role: str) -> None:
    ident = sql.Identifier
    schema = ident(tenancy.schema)
    connection.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(role)))
    connection.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, ident(role)))
    connection.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
            schema, ident(role)
        )
    )
    connection.execute(
        sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
            schema, ident(role)
        )
    )
    setting = "coalesce(current_setting('app.tenant', true), '')"
    for name in GUARDED:
        table = tenancy.table(name)
        connection.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table))
        connection.execute(sql.SQL("ALTER TABLE {} FORCE ROW LEVEL SECURITY").format(table))
        connection.execute(
            sql.SQL(
                "CREATE POLICY tenant_rows ON {} "
                "USING (tenant = {setting} OR {setting} = '') "
                "WITH CHECK (coalesce(tenant, '') <> '' AND (tenant = {setting} OR {setting} = ''))"
            ).format(table, setting=sql.SQL(setting))
        )


@pytest.fixture
def tenancy(database_url: str) -> Iterator[Tenancy]:
    schema = unique_name("statifier_tenancy_")
    role = unique_name("statifier_tenant_")
    options = TableOptions(prefix=PREFIX, schema=schema, leading_columns=_tenant)
    migrations.upgrade(database_url, options)
    given = sa.make_url(database_url).set(drivername="postgresql")
    admin_url = given.render_as_string(hide_password=False)
    role_url = given.set(username=role, password=None).render_as_string(hide_password=False)
    made = Tenancy(admin_url, role_url, schema, options)
    try:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            _guard(connection, made, role)
        yield made
    finally:
        drop_schema(database_url, schema)
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@dataclass
class Hooks:
    """The host's tenancy: ``on_begin`` sets the tenant for the rest of the
    transaction and notes which tenants' executions it can see then; the wrapper notes
    its calls and refuses the ``(scope, entry)`` pairs in :attr:`refuse`."""

    executions: sql.Composed
    seen: list[tuple[str, str, frozenset[str]]] = field(default_factory=list)
    wrapped: list[tuple[str, str]] = field(default_factory=list)
    refuse: set[tuple[str, Entry]] = field(default_factory=set)

    async def on_begin(self, tx: SqlTransaction, scope: str, entry: Entry) -> None:
        connection: psycopg.AsyncConnection[Any] = tx.driver
        await connection.execute("SELECT set_config('app.tenant', %s, true)", (scope,))
        cursor = await connection.execute(
            sql.SQL("SELECT DISTINCT tenant FROM {}").format(self.executions)
        )
        visible = frozenset(row[0] for row in await cursor.fetchall())
        self.seen.append((scope, entry.value, visible))

    async def around(self, scope: str, entry: Entry, work: Callable[[], Awaitable[_T]]) -> _T:
        self.wrapped.append((scope, entry.value))
        if (scope, entry) in self.refuse:
            raise PermissionError(f"tenant {scope} is suspended")
        return await work()


@pytest_asyncio.fixture
async def routed(tenancy: Tenancy) -> AsyncIterator[tuple[Router, Hooks, Clock]]:
    """A router on the guarded schema, connected as the plain role."""
    clock = Clock()
    hooks = Hooks(tenancy.table("executions"))
    bindings = [
        Binding(
            id="go",
            source="go",
            match="true",
            key="event.key",
            document="sender",
            event="go",
            create=Create.IF_ABSENT,
        ),
        Binding(
            id="poke",
            source="poke",
            match="true",
            key="event.key",
            document="receiver",
            event="poke",
            create=Create.NEVER,
        ),
    ]
    charts: dict[str | tuple[str, str], Machine] = {
        "sender": compile_chart(SENDER),
        "receiver": compile_chart(RECEIVER),
    }
    async with SqlAdapter(tenancy.role_url, tenancy.options.define()) as adapter:
        config = RouterConfig(
            Storage(adapter, clock=clock),
            bindings=bindings,
            resolver=StaticResolver(charts),
            send_type="test:sink",
            around_delivery=hooks.around,
            on_begin=hooks.on_begin,
            timers_elsewhere=True,
        )
        yield Router(config), hooks, clock


def _event(scope: str, source: str, key: str, message_id: str) -> InboundEvent:
    return InboundEvent(scope=scope, source=source, message_id=message_id, data={"key": key})


async def _got(router: Router, scope: str) -> int:
    """How many pokes ``scope``'s receiver counted, read under its own tenant."""
    async with router.transaction() as unit:
        await unit.begin(scope, Entry.ROUTE)
        found = await unit.sql.find_address(scope, "receiver", "r")
        assert found is not None
        record = await unit.storage.fetch_execution(found.execution_id)
        machine = await unit.storage.machine(record.content_hash)
        got = unit.storage.load(record, machine).datamodel["got"]
    assert isinstance(got, int)
    return got


@pytest.mark.asyncio
async def test_every_step_writes_and_sees_its_own_tenants_rows_only(
    tenancy: Tenancy, routed: tuple[Router, Hooks, Clock]
) -> None:
    router, hooks, clock = routed
    worker = TimerWorker(router, retry=5.0)
    for round_, key in enumerate(("k1", "k2")):
        for scope in ("acme", "globex"):
            answer = await router.route(_event(scope, "go", key, f"{scope}/go/{round_}"))
            assert [o.outcome for o in answer.outcomes] == ["created_and_delivered"]
        if round_ == 0:
            # Both ticks fire in one batch transaction, each under its own tenant; each
            # tick's poke creates its tenant's receiver.
            now = clock.advance(timedelta(seconds=2))
            before = len(hooks.wrapped)
            assert await worker.fire_due(now) == 2
            # Wrapped once each: the batch at once did not fail over to one by one.
            assert hooks.wrapped[before:] == [("acme", "timer"), ("globex", "timer")]
            continue
        # The wrapper refuses one tenant's fire: the other fires, the refused one stays,
        # due again later, and fires then.
        hooks.refuse = {("globex", Entry.TIMER)}
        now = clock.advance(timedelta(seconds=2))
        assert await worker.fire_due(now) == 1
        # Moved under its own tenant: the policy hides it from any other.
        waiting = tenancy.rows(
            sql.SQL("SELECT tenant, due_at FROM {}").format(tenancy.table("timers"))
        )
        assert waiting == [("globex", now + timedelta(seconds=5))]
        hooks.refuse.clear()
        assert await worker.fire_due(now + timedelta(seconds=5)) == 1
    assert not tenancy.rows(sql.SQL("SELECT 1 FROM {}").format(tenancy.table("timers")))
    assert (await _got(router, "acme"), await _got(router, "globex")) == (2, 2)

    # A route batch whose wrapper refuses one tenant's event routes the other's.
    hooks.refuse = {("globex", Entry.ROUTE)}
    acme, globex = await router.route_many(
        [_event("acme", "poke", "r", "acme/poke"), _event("globex", "poke", "r", "globex/poke")]
    )
    assert isinstance(acme, Routed)
    assert [o.outcome for o in acme.outcomes] == ["delivered"]
    assert isinstance(globex, Failed)
    assert isinstance(globex.error, PermissionError)
    assert (await _got(router, "acme"), await _got(router, "globex")) == (3, 2)

    # Each step saw its own tenant's executions, and only those.
    assert {(scope, entry) for scope, entry, _ in hooks.seen} >= {
        ("acme", "route"),
        ("globex", "route"),
        ("acme", "timer"),
        ("globex", "timer"),
    }
    for scope, entry, visible in hooks.seen:
        assert visible <= {scope}, (scope, entry, visible)
    assert ("globex", "timer") in hooks.wrapped

    # Every row the steps wrote carries the tenant of the scope it was written for.
    for name in GUARDED:
        table = tenancy.table(name)
        tenants = tenancy.rows(sql.SQL("SELECT DISTINCT tenant FROM {}").format(table))
        assert set(tenants) <= {("acme",), ("globex",)}, (name, tenants)
    scopes = dict(
        tenancy.rows(
            sql.SQL("SELECT execution_id, scope FROM {}").format(tenancy.table("addresses"))
        )
    )
    for name in ("addresses", "routing_ledger"):
        query = sql.SQL("SELECT tenant, scope FROM {} WHERE scope IS NOT NULL")
        for tenant, scope in tenancy.rows(query.format(tenancy.table(name))):
            assert tenant == scope, (name, tenant, scope)
    # A claim's message id starts with the event's scope, or (a target delivery's) with
    # the sending execution's id.
    claims = tenancy.rows(
        sql.SQL("SELECT tenant, message_id FROM {}").format(tenancy.table("dedupe"))
    )
    assert len(claims) == 9  # four go, four ticks poking, acme's poke (globex's was refused)
    for tenant, message_id in claims:
        head = message_id.split("/")[0]
        assert tenant == scopes.get(head, head), (tenant, message_id)
    addresses = tenancy.table("addresses")
    for name in ("executions", "inputs", "routing_ledger"):
        mismatched = tenancy.rows(
            sql.SQL(
                "SELECT t.execution_id, t.tenant, a.scope FROM {} t JOIN {} a "
                "ON a.execution_id = t.execution_id WHERE t.tenant IS DISTINCT FROM a.scope"
            ).format(tenancy.table(name), addresses)
        )
        assert not mismatched, (name, mismatched)
    counts = tenancy.rows(
        sql.SQL("SELECT tenant, count(*) FROM {} GROUP BY tenant ORDER BY tenant").format(
            tenancy.table("executions")
        )
    )
    assert counts == [("acme", 3), ("globex", 3)]  # two senders and a receiver each
