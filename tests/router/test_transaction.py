"""A router transaction's locks (:meth:`Unit.lock`): granted at once on SQLite, whose
transaction is the single writer; on PostgreSQL, advisory locks that another
transaction holding them past the wait answers with :class:`LockTimeout`."""

from __future__ import annotations

import asyncio

import pytest
from tests.router.conftest import RouterDb, impression_bindings

from statifier.persistence import LockTimeout
from statifier.router.transaction import sorted_locks


@pytest.mark.asyncio
async def test_the_locks_of_one_transaction_are_granted(router_db: RouterDb) -> None:
    router = router_db.router(impression_bindings(), lock_wait=0.05)
    async with router.transaction() as unit:
        await unit.lock([], router.config.lock_wait)
        await unit.lock(sorted_locks([3, -1, 3]), router.config.lock_wait)
        await unit.lock([-1, 3], None)


@pytest.mark.asyncio
async def test_locks_held_past_the_wait_raise_lock_timeout(pg_db: RouterDb) -> None:
    router = pg_db.router(impression_bindings(), lock_wait=0.05)
    held, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with router.transaction() as unit:
            await unit.lock([11], None)
            held.set()
            await release.wait()

    task = asyncio.create_task(holder())
    try:
        await held.wait()
        with pytest.raises(LockTimeout, match="the router's locks") as raised:
            async with router.transaction() as unit:
                await unit.lock([10, 11], router.config.lock_wait)
        assert raised.value.waited >= 0.04
        release.set()
        await task
        async with router.transaction() as unit:
            await unit.lock([10, 11], router.config.lock_wait)
    finally:
        release.set()
        await asyncio.gather(task, return_exceptions=True)
