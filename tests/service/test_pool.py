"""The PostgreSQL pool a service's adapter takes its connections from: a connection
the server ended fails no transaction (each is checked as it is handed out), and with
the server away a transaction fails after the pool wait with a typed error, well
within an HTTP front's deadline."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid

import psycopg
import pytest

from statifier.fronts.http_body import DEFAULT_TIMEOUT
from statifier.persistence.sql import SqlAdapter
from statifier.persistence.sql.postgres import POOL_WAIT, DatabaseUnavailable


async def _select_one(adapter: SqlAdapter, hold: float = 0.0) -> None:
    async with adapter.transaction() as tx:
        await tx.driver.execute("SELECT 1")
        await asyncio.sleep(hold)


@pytest.mark.asyncio
async def test_connections_the_server_ended_fail_no_transaction(database_url: str) -> None:
    name = f"pool-check-{uuid.uuid4().hex[:8]}"
    separator = "&" if "?" in database_url else "?"
    adapter = SqlAdapter(f"{database_url}{separator}application_name={name}")
    try:
        # Six transactions at once: the pool holds six connections afterwards.
        await asyncio.gather(*(_select_one(adapter, hold=0.2) for _ in range(6)))
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            )
            row = await cursor.fetchone()
            # pg_terminate_backend only signals: wait until the backends have left
            # pg_stat_activity, which they do after sending their FATAL goodbye.
            async with asyncio.timeout(10):
                while True:
                    cursor = await admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        (name,),
                    )
                    left = await cursor.fetchone()
                    if left is not None and left[0] == 0:
                        break
                    await asyncio.sleep(0.02)
        assert row is not None
        assert row[0] >= 6
        started = time.monotonic()
        for _ in range(8):  # one after the other: each takes a dead one first
            await _select_one(adapter)
        assert time.monotonic() - started < POOL_WAIT
    finally:
        await adapter.close()


def _unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.asyncio
async def test_without_a_server_a_transaction_fails_after_the_pool_wait() -> None:
    assert POOL_WAIT < DEFAULT_TIMEOUT  # a front's request hears the database's error
    adapter = SqlAdapter(f"postgresql://postgres@127.0.0.1:{_unused_port()}/nothing")
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=r"no PostgreSQL connection within 5 s"):
            await _select_one(adapter)
        waited = time.monotonic() - started
        assert POOL_WAIT - 0.5 <= waited < POOL_WAIT + 2.0, waited
        assert isinstance(DatabaseUnavailable("x"), psycopg.OperationalError)
    finally:
        await adapter.close()
