"""Fixtures for the router's tests: each backend's database, migrated once for the
session (the persistence fixtures' databases), emptied before each test, and charts the
tests route to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    LOCKING_BACKENDS,
    SQL_BACKENDS,
    SqlStore,
    postgresql_rows_store,
    postgresql_store,
    sqlite_store,
)

from statifier.chart import Machine, compile_chart
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, Router, RouterConfig, StaticResolver

JOIN = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
  <datamodel><data id="impression_id" expr="null"/><data id="clicks" expr="0"/></datamodel>
  <state id="waiting">
    <transition event="impression.served" target="shown">
      <assign location="impression_id" expr="_event.data.impression_id"/>
    </transition>
  </state>
  <state id="shown">
    <transition event="click.recorded" target="joined">
      <assign location="clicks" expr="clicks + 1"/>
    </transition>
  </state>
  <final id="joined"/>
</scxml>"""
"""The impression/click join: an impression opens it, a click finishes it; anything
else (a second impression) selects no transition."""


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 9, 19, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta) -> datetime:
        self.now += by
        return self.now


@dataclass
class RouterDb:
    """A migrated, emptied database of one backend and an adapter over it."""

    backend: str
    store: SqlStore
    adapter: SqlAdapter
    clock: Clock

    def config(self, bindings: list[Binding], **options: object) -> RouterConfig:
        """A configuration routing ``bindings`` to the join chart (document ``join``)
        unless ``resolver`` is given, on this database and clock."""
        options.setdefault("resolver", StaticResolver({"join": join_chart()}))
        storage = Storage(self.adapter, clock=self.clock)
        return RouterConfig(storage, bindings=bindings, **options)  # type: ignore[arg-type]

    def router(self, bindings: list[Binding], **options: object) -> Router:
        """A router running :meth:`config` with the same arguments."""
        return Router(self.config(bindings, **options))


_JOIN: list[Machine] = []


def join_chart() -> Machine:
    """The join chart, compiled once."""
    if not _JOIN:
        _JOIN.append(compile_chart(JOIN))
    return _JOIN[0]


@pytest.fixture(params=SQL_BACKENDS)
def router_store(request: pytest.FixtureRequest) -> SqlStore:
    """Each backend's session database."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture(params=LOCKING_BACKENDS)
def locking_store(request: pytest.FixtureRequest) -> SqlStore:
    """Each backend's session database, and PostgreSQL's whose locks are rows: a module
    whose tests are about what locks keep apart runs on it by overriding
    ``router_store`` with it."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest_asyncio.fixture
async def router_db(router_store: SqlStore) -> AsyncIterator[RouterDb]:
    """Each backend's database, emptied, with an adapter and a hand-moved clock."""
    router_store.empty()
    adapter = SqlAdapter(router_store.url, router_store.tables)
    try:
        yield RouterDb(router_store.backend, router_store, adapter, Clock())
    finally:
        await adapter.close()


@pytest.fixture(params=("postgresql", "postgresql_rows"))
def pg_store(request: pytest.FixtureRequest) -> SqlStore:
    """The session's PostgreSQL database, with advisory locks and with locks as rows."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest_asyncio.fixture
async def pg_db(pg_store: SqlStore) -> AsyncIterator[RouterDb]:
    """The session's PostgreSQL database alone (with each way of locking), emptied, with
    an adapter: for the tests of concurrent writers, which SQLite's single writer would
    only serialize."""
    pg_store.empty()
    adapter = SqlAdapter(pg_store.url, pg_store.tables)
    try:
        yield RouterDb("postgresql", pg_store, adapter, Clock())
    finally:
        await adapter.close()


def impression_bindings(**clicks: object) -> list[Binding]:
    """The join's two bindings on source ``ad_events``; ``clicks`` overrides fields of
    the click binding."""
    return [
        Binding(
            id="impressions_to_join",
            source="ad_events",
            match="event.kind == 'impression'",
            key="event.impression_id",
            document="join",
            event="impression.served",
            data=("impression_id", "shown_at"),
        ),
        Binding(
            **{  # type: ignore[arg-type]
                "id": "clicks_to_join",
                "source": "ad_events",
                "match": "event.kind == 'click'",
                "key": "event.impression_id",
                "document": "join",
                "event": "click.recorded",
                "data": ("impression_id", "url"),
                **clicks,
            }
        ),
    ]


Maker = Callable[..., list[Binding]]
