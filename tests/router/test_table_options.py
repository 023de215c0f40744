"""The router's statements honour the table options the persistence tables take: a
prefix, a PostgreSQL schema, host leading columns, and a UUID key made on the client
or a text key the database fills in."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import drop_schema, unique_name
from tests.router.conftest import Clock, impression_bindings, join_chart

from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    InboundEvent,
    Router,
    RouterConfig,
    StaticResolver,
    ledger,
    reap_addresses,
    reap_dedupe,
)
from statifier.sql import TableOptions, migrations

_TEXT_KEYS = {
    "sqlite": sa.text("(lower(hex(randomblob(16))))"),
    "postgresql": sa.text("gen_random_uuid()::text"),
}
"""A random text key each database fills in."""


@pytest.fixture(
    params=[("sqlite", "uuid"), ("postgresql", "uuid"), ("sqlite", "text"), ("postgresql", "text")],
    ids="-".join,
)
def uuid_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, TableOptions]]:
    """A database migrated with a prefix, a leading column and keys that do not order
    rows: UUIDs made on the client, or text the database fills in and the router
    reads back (and on PostgreSQL a schema of its own)."""

    def leading() -> list[sa.Column[Any]]:
        return [sa.Column("tenant_id", sa.Text(), nullable=True)]

    backend, key = request.param
    keys: dict[str, Any] = (
        {"key_type": sa.Uuid}
        if key == "uuid"
        else {"key_type": sa.Text, "key_default": _TEXT_KEYS[backend]}
    )
    if backend == "sqlite":
        options = TableOptions(prefix="u_", leading_columns=leading, **keys)
        url = f"sqlite:///{tmp_path / 'uuid.db'}"
        migrations.upgrade(url, options)
        yield url, options
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_router_")
    options = TableOptions(prefix="u_", schema=schema, leading_columns=leading, **keys)
    migrations.upgrade(url, options)
    try:
        yield url, options
    finally:
        drop_schema(url, schema)


@pytest.mark.asyncio
async def test_every_statement_runs_on_uuid_keys_in_a_prefixed_schema(
    uuid_database: tuple[str, TableOptions],
) -> None:
    url, options = uuid_database
    clock = Clock()
    async with SqlAdapter(url, options) as adapter:
        config = RouterConfig(
            Storage(adapter, clock=clock),
            bindings=impression_bindings(),
            resolver=StaticResolver({"join": join_chart()}),
        )
        router = Router(config)
        impression = {"kind": "impression", "impression_id": "imp_1"}
        first = await router.route(
            InboundEvent(scope="s", source="ad_events", message_id="m1", data=impression)
        )
        # A UUID key does not order rows: the ledger is oldest first by time alone.
        clock.advance(timedelta(seconds=1))
        again = await router.route(
            InboundEvent(scope="s", source="ad_events", message_id="m1", data=impression)
        )
        clock.advance(timedelta(seconds=1))
        click = {"kind": "click", "impression_id": "imp_1"}
        batch = [
            *await router.route_many(
                [InboundEvent(scope="s", source="ad_events", message_id="m2", data=click)]
            )
        ]
        clock.advance(timedelta(seconds=1))
        batch += await router.route_many(
            [InboundEvent(scope="s", source="ad_events", message_id="m3", data={"kind": "click"})],
        )
        assert [o.outcome for o in first.outcomes] == ["created_and_delivered", "no_match"]
        assert [o.outcome for o in again.outcomes] == ["duplicate", "no_match"]
        assert [[o.outcome for o in answer.outcomes] for answer in batch] == [  # type: ignore[union-attr]
            ["no_match", "delivered"],
            ["no_match", "key_refused"],
        ]
        rows = await ledger(router)
        assert [row.spelled for row in rows] == [
            "created_and_delivered",
            "duplicate",
            "delivered",
            "key_refused",
        ]
        clock.advance(router.config.bindings[0].dedupe.horizon * 2)  # type: ignore[index]
        assert await reap_dedupe(router, clock()) == 2  # a refusal claims nothing
        swept = await reap_addresses(router, clock())
        assert (swept.examined, swept.stamped, swept.deleted) == (1, 0, 1)
