"""Bucket leases on both databases (and PostgreSQL with lock rows): the services on
one store share its range's workers by leased slices, a service that stops gives its
slices up at once, a dead one's wait until its leases run out, and readiness says so
meanwhile. The workers here are stand-ins that record their range; the services'
test (``tests/service/test_serve.py``) runs the real ones in two processes."""

from __future__ import annotations

import asyncio
import logging
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
    pg_db,
    pg_store,
    router_db,
)

from statifier.fronts.leases import LeaseChange, PartitionLeases
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
    """A stand-in for a supervised worker: runs until its range's stop is set, and
    then until ``pass_ends`` is set too, when given (a pass in flight at the stop)."""

    def __init__(
        self, name: str, stop: asyncio.Event, pass_ends: asyncio.Event | None = None
    ) -> None:
        self.name, self.stop, self.pass_ends = name, stop, pass_ends
        self.task: asyncio.Task[None] | None = None
        self.failing: str | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        await self.stop.wait()
        if self.pass_ends is not None:
            await self.pass_ends.wait()

    def trouble(self) -> str | None:
        return self.failing

    def done(self) -> bool:
        return self.task is not None and self.task.done()


class _Service:
    """One service's leased workers on the store, recording every range it ran."""

    def __init__(
        self,
        db: RouterDb,
        owner: str,
        slices: int = 16,
        pass_ends: asyncio.Event | None = None,
        *,
        ttl: float = TTL,
    ) -> None:
        self.stop = asyncio.Event()
        self.pass_ends = pass_ends
        self.ran: list[tuple[int, int]] = []
        self.workers: list[_Worker] = []
        self.part = LeasedWorkers(
            f"workers of {owner}",
            db.adapter,
            (0, 1024),
            self.build,
            self.stop,
            owner=owner,
            slices=slices,
            ttl=ttl,
            clock=db.clock,
        )

    def build(self, piece: tuple[int, int], stop: asyncio.Event) -> list[_Worker]:
        self.ran.append(piece)
        worker = _Worker(f"timers (buckets {piece[0]}-{piece[1]})", stop, self.pass_ends)
        self.workers.append(worker)
        return [worker]

    def running(self) -> set[tuple[int, int]]:
        return set(self.part.running)

    def buckets(self) -> set[int]:
        return {b for start, end in self.running() for b in range(start, end)}

    @property
    def task(self) -> asyncio.Task[None]:
        assert self.part.task is not None
        return self.part.task


def _hold_claims(service: _Service, answer: asyncio.Event) -> None:
    """Make every claim of ``service`` wait for ``answer`` before it runs (whatever
    holds a claim up: a network that drops every packet)."""
    claim = service.part.leases.claim

    async def hanging() -> LeaseChange:
        await answer.wait()
        return await claim()

    service.part.leases.claim = hanging  # type: ignore[method-assign]


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
        router_db.adapter, group=f"{GROUP}/16", partitions=["0000-0064"], owner="c", ttl=TTL
    )
    assert (await leases.claim()).gained == ("0000-0064",)  # a left too


@pytest.mark.asyncio
async def test_slices_kept_are_renewed_while_a_range_given_up_ends_its_pass(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # b joins while a's workers are in a long pass (a slow sink): a renews the
    # slices it keeps and runs their range at once, while the range it gave up ends
    # its pass; its surplus is released only once that pass ended, so b never runs
    # a bucket a's workers still run.
    pass_ends = asyncio.Event()
    a, b = _Service(router_db, "a", pass_ends=pass_ends), _Service(router_db, "b")
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        with _started(b):
            await _until(lambda: a.running() != {(0, 1024)})  # a's claim saw its surplus
            for _ in range(3):  # the pass outlasts the ttl, in the leases' time
                router_db.clock.advance(timedelta(seconds=TTL * 0.4))
                await asyncio.sleep(TTL)  # claims, in real time
                assert not (a.part.trouble() or "").startswith("leases not renewed"), (
                    a.part.trouble()
                )
            assert a.running() == {(0, 512)}
            assert b.running() == set()  # the surplus is still a's
            assert a.part.trouble() == "giving up buckets 0-1024: a pass still runs after 0.4 s"
            pass_ends.set()
            await _until(lambda: b.running() == {(512, 1024)})
            assert a.running() == {(0, 512)}
            assert a.part.trouble() is None
            assert b.part.trouble() is None
    for service in (a, b):
        assert service.part.task is not None
        await asyncio.wait_for(service.part.task, 10)
        assert all(w.task is not None and w.task.done() for w in service.workers)


@pytest.mark.asyncio
async def test_slices_lost_to_another_service_are_logged_as_a_warning(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a's claims hang past the ttl; another service takes every slice; a's next
    # claim finds them lost: trouble, not news.
    a = _Service(router_db, "a")
    answer = asyncio.Event()

    names = [slice_name(piece) for piece in slices_of((0, 1024), 16)]
    other = PartitionLeases(
        router_db.adapter,
        group=f"{GROUP}/16",
        partitions=names,
        owner="other",
        ttl=TTL,
        clock=router_db.clock,
    )
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        _hold_claims(a, answer)
        await asyncio.sleep(TTL)  # a claim is under way, and hangs
        router_db.clock.advance(timedelta(seconds=TTL * 2))
        assert len((await other.claim()).gained) == 16
        answer.set()
        await _until(lambda: a.running() == set())
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    said = [r for r in caplog.records if "lost buckets" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING"]
    assert said[0].getMessage() == (
        "workers of a: buckets none; lost buckets 0-1024 to another service: no claim "
        "of this one succeeded for longer than the ttl (0.3 s)"
    )


@pytest.mark.asyncio
async def test_a_dead_services_slices_wait_until_its_leases_run_out_and_readiness_says_so(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    names = [slice_name(piece) for piece in slices_of((0, 1024), 16)]
    dead = PartitionLeases(
        router_db.adapter,
        group=f"{GROUP}/16",  # the group of 16 slices
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


@pytest.mark.asyncio
async def test_a_claim_held_up_by_a_stuck_claims_lock_fails_within_a_third_of_the_ttl(
    pg_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Another member's claim transaction, stuck while it holds the group's lock (a
    # frozen process, or one cut off whose transaction lives on in the server): the
    # claims wait a third of the ttl for the lock, then fail, say so and turn
    # readiness red, and succeed again once it is released.
    a = _Service(pg_db, "a")
    held, release = asyncio.Event(), asyncio.Event()

    async def stuck() -> None:
        async with pg_db.adapter.transaction() as tx:
            await a.part.leases.table.serialize(tx.driver, a.part.leases.group)
            held.set()
            await release.wait()

    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        holder = asyncio.create_task(stuck())
        try:
            await asyncio.wait_for(held.wait(), 10)
            await _until(lambda: (a.part.trouble() or "").startswith("leases not renewed: "))
            assert a.running() == {(0, 1024)}  # the workers run on meanwhile
        finally:
            release.set()
            await asyncio.wait_for(holder, 10)
        await _until(lambda: a.part.trouble() is None)
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    said = [r.getMessage() for r in caplog.records if "bucket lease claim failed" in r.getMessage()]
    assert said
    assert "no lock on the lease group within 0.1 s: another service's claim holds it" in said[0]


@pytest.mark.asyncio
async def test_a_claim_that_never_returns_turns_readiness_red_once_the_ttl_passed(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    # Whatever holds a claim up (a network that drops every packet): no claim
    # succeeded for longer than the ttl, so the leases ran out; readiness says so.
    a = _Service(router_db, "a")
    answer = asyncio.Event()

    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        _hold_claims(a, answer)
        try:
            await asyncio.sleep(TTL)  # a claim is under way, and hangs
            assert a.part.trouble() is None  # the leases' time has not moved
            router_db.clock.advance(timedelta(seconds=TTL * 2))
            assert a.part.trouble() == "leases not renewed for 0.6 s: a claim hangs"
            assert a.running() == {(0, 1024)}  # the workers run on meanwhile
        finally:
            answer.set()
        await _until(lambda: a.part.trouble() is None)
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)


@pytest.mark.asyncio
async def test_services_cut_in_different_counts_lease_groups_of_their_own_and_say_so(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One group for both would count each as the other's member and halve their
    # shares over names the other does not lease: half the buckets would run nowhere.
    # Each count leases a group of its own, serves every bucket among its own
    # services (overlapping the other's: safe, the claims of rows skip what another
    # holds), and says it runs beside another count; a member of the group a version
    # before the count was in its name is named too.
    caplog.set_level(logging.WARNING)
    names = [slice_name(piece) for piece in slices_of((0, 1024), 16)]
    old = PartitionLeases(
        router_db.adapter,
        group=GROUP,
        partitions=names,
        owner="old",
        ttl=TTL,
        clock=router_db.clock,
    )
    await old.claim()  # alive as long as the clock does not move
    a, b = _Service(router_db, "a", slices=16), _Service(router_db, "b", slices=8)
    with _started(a, b):
        await _until(lambda: len(a.buckets()) == 1024 and len(b.buckets()) == 1024)
        assert a.part.trouble() is None
        assert b.part.trouble() is None

        def warned(service: _Service, groups: str) -> bool:
            return any(
                r.levelname == "WARNING"
                and r.getMessage().startswith(f"{service.part.name}: services of other")
                and f"(lease groups {groups}; this one's" in r.getMessage()
                for r in caplog.records
            )

        await _until(lambda: warned(a, f"{GROUP} (an older version), {GROUP}/8"))
        await _until(lambda: warned(b, f"{GROUP} (an older version), {GROUP}/16"))
    assert (a.part.leases.group, b.part.leases.group) == (f"{GROUP}/16", f"{GROUP}/8")
    for service in (a, b):
        assert service.part.task is not None
        await asyncio.wait_for(service.part.task, 10)


@pytest.mark.asyncio
async def test_a_failing_claims_line_says_what_failed_on_one_bounded_line(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = _Service(router_db, "a")
    with _started(a):
        await _until(lambda: a.running() == {(0, 1024)})
        with _leases_moved_away(router_db):
            await _until(lambda: (a.part.trouble() or "").startswith("leases not renewed: "))
    assert a.part.task is not None
    await asyncio.wait_for(a.part.task, 10)
    said = [r.getMessage() for r in caplog.records if "bucket lease claim failed" in r.getMessage()]
    assert said
    # The error's message names the table that is missing.
    line = said[0]
    assert "partition_leases" in line
    assert "\n" not in line
    assert len(line) < 500
