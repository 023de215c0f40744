"""The SQLite adapter's single writer: a free lock is taken without arming a timer,
and every other caller keeps its bound on the wait."""

from __future__ import annotations

import asyncio

import pytest

from statifier.persistence import LockTimeout
from statifier.persistence.sql.sqlite import Writer


@pytest.mark.asyncio
async def test_a_caller_behind_a_woken_waiter_still_times_out() -> None:
    writer = Writer()
    await writer.acquire(None, "holder")
    first = asyncio.create_task(writer.acquire(None, "first"))
    await asyncio.sleep(0)  # first is queued
    writer.lock.release()  # first is woken but has not run: the lock is free, yet taken
    assert not writer.lock.locked()
    # first keeps the lock; the next caller, running before first does (awaited in
    # this task, not a new one), must get LockTimeout, not wait unbounded.
    with pytest.raises(LockTimeout):
        async with asyncio.timeout(2.0):
            await writer.acquire(0.05, "second")
    await first
    assert writer.lock.locked()
    assert writer.waiting == 0
    writer.lock.release()


@pytest.mark.asyncio
async def test_a_cancelled_waiter_leaves_the_lock_free_for_the_next_caller() -> None:
    writer = Writer()
    await writer.acquire(None, "holder")
    waiter = asyncio.create_task(writer.acquire(None, "waiter"))
    async with asyncio.timeout(2.0):
        # It lets the loop run once before it queues (decision 0131).
        while writer.waiting == 0:  # noqa: ASYNC110 - polled
            await asyncio.sleep(0)
    assert writer.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert writer.waiting == 0
    writer.lock.release()
    async with asyncio.timeout(2.0):
        await writer.acquire(0.05, "next")
    assert writer.lock.locked()
    writer.lock.release()


@pytest.mark.asyncio
async def test_a_free_lock_is_taken_even_with_no_time_to_wait() -> None:
    writer = Writer()
    await writer.acquire(0.0, "first")
    assert writer.lock.locked()
    with pytest.raises(LockTimeout):
        await writer.acquire(0.0, "second")
    writer.lock.release()
