"""Bucket leases on both databases (and PostgreSQL with lock rows): the services on
one store share its range's workers by leased slices, a service that stops gives its
slices up at once, a dead one's wait until its leases run out, and readiness says so
meanwhile. The workers here are stand-ins that record their range; the services'
test (``tests/service/test_serve.py``) runs the real ones in two processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through router_store
    SqlStore,
    postgresql_rows_store,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - the fixtures themselves
    RouterDb,
    locking_store,
    router_db,
)

from statifier.fronts.leases import PartitionLeases
from statifier.service.bucket_leases import (
    GROUP,
    LeasedWorkers,
    ranges_of,
    slice_name,
    slices_of,
)
from statifier.sql import migrations

TTL = 0.3
"""Seconds a claim holds; claims come every third of it (in real time), while the
leases' own time is the test's hand-moved clock."""


@pytest.fixture
def router_store(locking_store: SqlStore) -> SqlStore:  # noqa: F811
    """Both databases, and PostgreSQL whose locks are rows: the claims lock."""
    return locking_store


def test_a_range_is_cut_into_even_slices_and_held_slices_are_joined() -> None:
    assert slices_of((0, 1024), 1) == ((0, 1024),)
    assert slices_of((341, 682), 3) == ((341, 454), (454, 568), (568, 682))
    assert slices_of((10, 13), 16) == ((10, 11), (11, 12), (12, 13))  # one bucket each
    pieces = slices_of((0, 1024), 16)
    assert [b - a for a, b in pieces] == [64] * 16
    names = [slice_name(piece) for piece in pieces]
    assert names == sorted(names)
    assert ranges_of(names) == ((0, 1024),)
    assert ranges_of([names[3], names[0], names[1], names[15]]) == (
        (0, 128),
        (192, 256),
        (960, 1024),
    )
    assert ranges_of([]) == ()


class _Worker:
    """A stand-in for a supervised worker: runs until its range's stop is set."""

    def __init__(self, name: str, stop: asyncio.Event) -> None:
        self.name, self.stop = name, stop
        self.task: asyncio.Task[None] | None = None
        self.failing: str | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.stop.wait())  # type: ignore[arg-type]

    def trouble(self) -> str | None:
        return self.failing


class _Service:
    """One service's leased workers on the store, recording every range it ran."""

    def __init__(self, db: RouterDb, owner: str) -> None:
        self.stop = asyncio.Event()
        self.ran: list[tuple[int, int]] = []
        self.workers: list[_Worker] = []
        self.part = LeasedWorkers(
            f"workers of {owner}",
            db.adapter,
            (0, 1024),
            self.build,
            self.stop,
            owner=owner,
            slices=16,
            ttl=TTL,
            clock=db.clock,
        )

    def build(self, piece: tuple[int, int], stop: asyncio.Event) -> list[_Worker]:
        self.ran.append(piece)
        worker = _Worker(f"timers (buckets {piece[0]}-{piece[1]})", stop)
        self.workers.append(worker)
        return [worker]

    def running(self) -> set[tuple[int, int]]:
        return set(self.part.running)

    def buckets(self) -> set[int]:
        return {b for start, end in self.running() for b in range(start, end)}


async def _until(condition: Callable[[], bool | Awaitable[bool]], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        found = condition()
        if not isinstance(found, bool):
            found = await found
        if found:
            return
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.02)


@contextmanager
def _started(*services: _Service) -> Iterator[None]:
    for service in services:
        service.part.start()
    try:
        yield
    finally:
        for service in services:
            service.stop.set()


@contextmanager
def _leases_moved_away(db: RouterDb) -> Iterator[None]:
    """The partition lease table renamed away inside the block, and back under its name after."""
    tables = db.adapter.tables.metadata.tables
    leases = next(t for t in tables.values() if t.name.endswith("partition_leases"))
    schema = "" if leases.schema is None else f'"{leases.schema}".'
    moved = f"{leases.name}_away"
    engine = sa.create_engine(migrations.sync_url(db.store.url))

    def rename(old: str, new: str) -> None:
        with engine.begin() as connection:
            connection.execute(sa.text(f'ALTER TABLE {schema}"{old}" RENAME TO "{new}"'))

    try:
        rename(leases.name, moved)
        try:
            yield
        finally:
            rename(moved, leases.name)
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_services_share_the_slices_and_one_that_stops_gives_them_up_at_once(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    a, b = _Service(router_db, "a"), _Service(router_db, "b")
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        assert a.part.trouble() is None
        with _started(b):
            # b joins: a gives up its surplus, b takes it, and between them every
            # bucket runs once.
            await _until(lambda: len(a.buckets()) == 512 and len(b.buckets()) == 512)
            assert a.buckets().isdisjoint(b.buckets())
            assert a.running() == {(0, 512)}
            assert b.running() == {(512, 1024)}
            # Every worker of a range a gave up was stopped.
            stopped = [w for w in a.workers if w.name == "timers (buckets 0-1024)"]
            assert stopped
            assert all(w.task is not None and w.task.done() for w in stopped)
            assert b.part.trouble() is None
        # b stops: its slices are free at once, and a's next claim takes them (the
        # clock has not moved, so no lease ran out).
        assert b.part.task is not None
        await asyncio.wait_for(b.part.task, 10)
        assert b.running() == set()
        assert all(w.task is not None and w.task.done() for w in b.workers)
        await _until(lambda: a.running() == {(0, 1024)})
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    leases = PartitionLeases(
        router_db.adapter, group=GROUP, partitions=["0000-0064"], owner="c", ttl=TTL
    )
    assert (await leases.claim()).gained == ("0000-0064",)  # a left too


@pytest.mark.asyncio
async def test_a_dead_services_slices_wait_until_its_leases_run_out_and_readiness_says_so(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    names = [slice_name(piece) for piece in slices_of((0, 1024), 16)]
    dead = PartitionLeases(
        router_db.adapter,
        group=GROUP,
        partitions=names,
        owner="dead",
        ttl=TTL,
        clock=router_db.clock,
    )
    assert len((await dead.claim()).held) == 16  # then it claims no more
    b = _Service(router_db, "b")
    with _started(b):
        await asyncio.sleep(TTL)  # claims, in real time: the dead's leases are fresh
        assert b.running() == set()
        assert b.part.trouble() is None
        router_db.clock.advance(timedelta(seconds=TTL * 0.8))  # a renewal missed
        await _until(lambda: b.part.trouble() == "no buckets while 16 slices wait")
        router_db.clock.advance(timedelta(seconds=TTL * 0.3))  # ran out
        await _until(lambda: b.running() == {(0, 1024)})
        assert b.part.trouble() is None


@pytest.mark.asyncio
async def test_readiness_names_a_failing_worker_with_its_range(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    a = _Service(router_db, "a")
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        a.workers[-1].failing = "restarting after OperationalError"
        assert a.part.trouble() == "timers (buckets 0-1024): restarting after OperationalError"
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    assert a.part.trouble() == "not running"


@pytest.mark.asyncio
async def test_a_failing_claim_turns_readiness_red_and_is_logged_until_a_claim_succeeds(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = _Service(router_db, "a")
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        with _leases_moved_away(router_db):
            await _until(lambda: (a.part.trouble() or "").startswith("leases not renewed: "))
            assert a.running() == {(0, 1024)}  # the workers run on meanwhile
        await _until(lambda: a.part.trouble() is None)
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    said = [r for r in caplog.records if "a bucket lease claim failed" in r.getMessage()]
    assert said
    assert said[0].levelname == "ERROR"


@pytest.mark.asyncio
async def test_a_failing_leave_on_stop_is_logged_and_the_workers_stop(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = _Service(router_db, "a")
    a.part.start()
    await _until(lambda: a.running() == {(0, 1024)})
    with _leases_moved_away(router_db):
        a.stop.set()
        assert a.part.task is not None
        await asyncio.wait_for(a.part.task, 10)
    assert all(worker.task is not None and worker.task.done() for worker in a.workers)
    said = [r for r in caplog.records if "could not give up its bucket slices" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
