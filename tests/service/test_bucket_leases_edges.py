"""Bucket leases (decision 0128) at their edges: a stop cut short by the service's
bound, a cancellation from elsewhere, a stop during a claim, a failed release, a range
replaced by a wider one, the leases' end counted from the claim's lock, and a claim's
bound on SQLite. The workers and services are the stand-ins of
``tests/service/test_bucket_leases.py``; the leases' time is the test's hand-moved
clock, their claims come in real time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection
from datetime import timedelta

import pytest
import pytest_asyncio
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through router_store
    SqlStore,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - the fixtures themselves
    Clock,
    RouterDb,
    router_db,
    router_store,
)
from tests.service.test_bucket_leases import TTL, _Service, _until

from statifier.fronts.leases import LeaseChange, PartitionLeases
from statifier.persistence.sql import SqlAdapter
from statifier.service.bucket_leases import group_of, slice_name, slices_of

NAMES = [slice_name(piece) for piece in slices_of((0, 1024), 16)]
"""The names of the 16 slices of the whole range."""


@pytest_asyncio.fixture
async def sqlite_db(sqlite_store: SqlStore) -> AsyncIterator[RouterDb]:  # noqa: F811
    """The session's SQLite database alone, emptied, with an adapter and a hand-moved
    clock."""
    sqlite_store.empty()
    adapter = SqlAdapter(sqlite_store.url, sqlite_store.tables)
    try:
        yield RouterDb(sqlite_store.backend, sqlite_store, adapter, Clock())
    finally:
        await adapter.close()


def _member(db: RouterDb, owner: str, partitions: Collection[str] = NAMES) -> PartitionLeases:
    """Another member of the group of 16 slices, claiming by hand."""
    return PartitionLeases(
        db.adapter,
        group=group_of(16),
        partitions=list(partitions),
        owner=owner,
        ttl=TTL,
        clock=db.clock,
    )


@pytest.mark.asyncio
async def test_a_stop_cut_short_by_the_bound_gives_the_slices_up_or_says_they_wait(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pass outlasts the service's ``shutdown_timeout``: the service cancels the
    part (``Service._within``), which cancels the workers' pass; the part still leaves
    the group once they ended (or says that the slices stay leased), so the next start
    and the other services need not wait a whole ttl in silence."""
    caplog.set_level(logging.WARNING)
    pass_ends = asyncio.Event()  # never set: the pass outlasts the bound
    a = _Service(router_db, "a", pass_ends=pass_ends)
    a.part.start()
    await _until(lambda: a.running() == {(0, 1024)})
    a.stop.set()
    await asyncio.sleep(TTL)  # the part waits for the pass to end
    assert not a.task.done()
    a.task.cancel()  # what Service._within does at the bound
    await asyncio.wait([a.task], timeout=1.0)  # and how long it waits after that
    assert a.task.done()
    assert all(worker.done() for worker in a.workers)  # the workers were cancelled
    gained = (await _member(router_db, "next").claim()).gained  # no lease ran out
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "slices" in r.getMessage()
    ]
    assert len(gained) == 16 or said, (
        "the slices stay leased to a stopped service for a ttl, and nothing said so"
    )


@pytest.mark.asyncio
async def test_a_cancellation_the_part_was_not_sent_does_not_end_it(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """A claim ends by a cancellation the part's task was not sent (a future a client
    library shared, cancelled by someone else): the part outlives it as a failed
    claim, as ``Supervised`` does (``cancelled_elsewhere``), and runs on, its
    readiness green again at the next claim."""
    a = _Service(router_db, "a")
    a.part.start()
    try:
        await _until(lambda: a.running() == {(0, 1024)})
        claim = a.part.leases.claim
        calls = 0

        async def cancelled_once() -> LeaseChange:
            nonlocal calls
            calls += 1
            if calls == 1:
                shared = asyncio.get_running_loop().create_future()
                shared.cancel()  # someone else cancelled what the claim awaited
                await shared
            return await claim()

        a.part.leases.claim = cancelled_once  # type: ignore[method-assign]
        await _until(lambda: calls >= 2 or a.task.done())
        assert not a.task.done(), f"the part ended: {a.part.trouble()}"
        await _until(lambda: a.part.trouble() is None and a.running() == {(0, 1024)})
    finally:
        a.stop.set()
        await asyncio.wait([a.task], timeout=10)


@pytest.mark.asyncio
async def test_the_workers_are_told_to_stop_while_a_claim_is_under_way(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """The service stops while a claim waits (for the group's lock, up to a third of
    the ttl, or a claim that hangs): the ranges' workers are told to stop at once,
    not once the claim returns."""
    a = _Service(router_db, "a")
    answer = asyncio.Event()
    a.part.start()
    try:
        await _until(lambda: a.running() == {(0, 1024)})
        claim = a.part.leases.claim

        async def hanging() -> LeaseChange:
            await answer.wait()
            return await claim()

        a.part.leases.claim = hanging  # type: ignore[method-assign]
        await asyncio.sleep(TTL)  # a claim is under way, and waits
        a.stop.set()
        await _until(lambda: all(worker.done() for worker in a.workers), seconds=2.0)
    finally:
        answer.set()
        a.stop.set()
        await asyncio.wait([a.task], timeout=10)


@pytest.mark.asyncio
async def test_a_failed_release_is_not_reported_as_leases_not_renewed(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """A release of the surplus fails while every claim succeeds: readiness names the
    release (``surplus not released``), not ``leases not renewed``."""
    ttl = 3.0  # a claim every second: the answer between two claims is read at ease
    a = _Service(router_db, "a", ttl=ttl)
    releases = 0

    async def failing(partitions: Collection[str]) -> None:
        nonlocal releases
        releases += 1
        raise RuntimeError("the release failed")

    a.part.leases.release = failing  # type: ignore[method-assign]
    a.part.start()
    try:
        await _until(lambda: a.running() == {(0, 1024)})
        # Another member joins (alive as long as the clock does not move): a's next
        # claim finds half its slices surplus, stops their range, and releases them.
        other = PartitionLeases(
            router_db.adapter,
            group=group_of(16),
            partitions=NAMES,
            owner="other",
            ttl=ttl,
            clock=router_db.clock,
        )
        await other.claim()
        await _until(lambda: releases > 0)
        said = a.part.trouble()
        assert said is not None
        assert not said.startswith("leases not renewed"), said
        assert "release" in said, said
    finally:
        a.stop.set()
        await asyncio.wait([a.task], timeout=10)


@pytest.mark.asyncio
async def test_a_range_replaced_by_a_wider_one_is_not_red_while_every_bucket_runs(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """A service gains the slices of a dead one and runs its whole range at once,
    the narrower range it replaced still in its pass a ttl later: no slice waits for
    that pass and every bucket runs here, so readiness stays green (a load balancer
    would take a healthy service out)."""
    dead = _member(router_db, "dead", NAMES[:8])
    assert len((await dead.claim()).held) == 8  # buckets 0-512; then it claims no more
    pass_ends = asyncio.Event()
    a = _Service(router_db, "a", pass_ends=pass_ends)
    a.part.start()
    try:
        await _until(lambda: a.running() == {(512, 1024)})
        router_db.clock.advance(timedelta(seconds=TTL * 1.1))  # the dead's leases ran out
        await _until(lambda: a.running() == {(0, 1024)})
        for _ in range(3):  # the replaced range's pass outlasts the ttl
            router_db.clock.advance(timedelta(seconds=TTL * 0.4))
            await asyncio.sleep(TTL)  # claims, in real time
        assert a.buckets() == set(range(1024))
        assert a.part.trouble() is None
    finally:
        pass_ends.set()
        a.stop.set()
        await asyncio.wait([a.task], timeout=10)


@pytest.mark.asyncio
async def test_readiness_is_red_once_the_leases_ran_out_not_a_lock_wait_later(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    """A claim may wait for the group's lock (up to a third of the ttl) after it is
    called: the leases run a ttl from the moment it held the lock, and readiness turns
    red once they ran out (another service may then take every slice), not a lock
    wait later."""
    a = _Service(router_db, "a")
    claim = a.part.leases.claim
    answer = asyncio.Event()
    calls = 0

    async def slow_then_hanging() -> LeaseChange:
        nonlocal calls
        calls += 1
        if calls > 1:
            await answer.wait()
        change = await claim()
        if calls == 1:
            # Its wait for the group's lock, after it read the time (the test cannot
            # move the hand clock inside the claim's transaction, so it moves it here).
            router_db.clock.advance(timedelta(seconds=TTL * 0.3))
        return change

    a.part.leases.claim = slow_then_hanging  # type: ignore[method-assign]
    a.part.start()
    try:
        await _until(lambda: a.running() == {(0, 1024)} and calls >= 2)
        router_db.clock.advance(timedelta(seconds=TTL * 0.8))  # the leases ran out
        other = _member(router_db, "other")
        assert len((await other.claim()).gained) == 16  # and another service took them
        assert a.running() == {(0, 1024)}  # which this one runs still
        assert a.part.trouble() is not None
    finally:
        answer.set()
        a.stop.set()
        await asyncio.wait([a.task], timeout=10)


@pytest.mark.asyncio
async def test_on_sqlite_a_claim_waits_at_most_a_third_of_the_ttl_for_the_writer(
    sqlite_db: RouterDb,
) -> None:
    """A claim waits at most a third of the ttl for the group's lock, then fails: on
    SQLite, for the adapter's single writer held by another transaction of the
    process."""
    a = _Service(sqlite_db, "a")
    held, release = asyncio.Event(), asyncio.Event()

    async def holding() -> None:
        async with sqlite_db.adapter.transaction():
            held.set()
            await release.wait()

    holder = asyncio.create_task(holding())
    claim: asyncio.Task[LeaseChange] | None = None
    try:
        await asyncio.wait_for(held.wait(), 10)
        claim = asyncio.create_task(a.part.leases.claim())
        await asyncio.wait([claim], timeout=TTL)  # a third of it promised; a whole ttl
        assert claim.done(), "the claim still waits for the writer after a whole ttl"
        assert claim.exception() is not None
    finally:
        release.set()
        await asyncio.wait_for(holder, 10)
        if claim is not None:
            await asyncio.wait([claim], timeout=10)
            if not claim.cancelled():
                claim.exception()  # retrieved, whatever it was
