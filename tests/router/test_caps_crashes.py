"""A cap on active executions under two processes SIGKILLed at random points, many
times, on each database: the cap is never exceeded, every job's events are delivered
once and in order, every held create is made once, and every message has one arrival
in the ledger (its resends are duplicates)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    postgresql_store,
    sqlite_store,
)
from tests.router.capping_process import (
    CAP,
    DOCUMENT,
    SCOPE,
    exists,
    message_id,
    router_of,
    send,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)

from statifier.persistence import Executions, Status
from statifier.router import FlowWorker, Router, address, ledger
from statifier.sql import TableOptions, Tables, migrations

PROCESS = "tests.router.capping_process"
ROOT = Path(__file__).parent.parent.parent

JOBS = {"sqlite": 800, "postgresql": 200}
"""Each process's jobs, by database: more than the kills let them finish."""
HITS = 3
"""Each job's hits, before its close."""
WINDOW = 4
"""How many jobs a process has open at once: with two processes, twice the cap."""
KILLS = 30
PAUSE = (0.02, 0.5)
"""Seconds a process works before it is killed (from when it sent its first new
message, or connected)."""
STALL = 5.0
"""Seconds a process may take to send its first new message before it is killed
anyway."""
EARLY = 0.25
"""How often the time before a kill counts from when the process connected."""
DEADLINE = 120.0
"""Seconds the kills and the final pass may take, together, on one database."""
SAMPLE = 0.002
"""Seconds between the sampler's counts of live executions."""
LIVE = ("active", "paused", "needs_migration")


@dataclass
class Sampler:
    """Counts the live executions every few milliseconds, on a connection of its own,
    while the processes work: each count is one statement, a consistent snapshot of
    what was committed."""

    url: str
    tables: Tables
    counts: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        executions = self.tables.executions
        live = (
            sa.select(sa.func.count()).select_from(executions).where(executions.c.status.in_(LIVE))
        )
        engine = sa.create_engine(migrations.sync_url(self.url))
        try:
            with engine.connect() as connection:
                while not self._stop.is_set():
                    try:
                        self.counts[int(connection.execute(live).scalar_one())] += 1
                        connection.rollback()
                    except sa.exc.OperationalError as error:  # SQLite busy: sample again
                        self.errors.append(str(error))
                        connection.rollback()
                    time.sleep(SAMPLE)
        finally:
            engine.dispose()


async def _text(path: Path) -> str:
    return await asyncio.to_thread(path.read_text)


class Server:
    """A forking server (:mod:`tests.router.forking_server`) and what it says of the
    processes it forks."""

    def __init__(self, process: asyncio.subprocess.Process, errors: Path) -> None:
        self.process = process
        self.errors = errors
        self._forking = asyncio.Lock()
        self._forked: asyncio.Queue[int] = asyncio.Queue()
        self.pids: list[int] = []
        self._said: dict[tuple[str, int], asyncio.Future[int]] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(
        cls, url: str, options: TableOptions, errors: Path, module: str = PROCESS
    ) -> Server:
        """The forking server ``module`` (run as ``python -m``) on ``url``."""
        with errors.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                url,
                options.prefix,
                options.schema or "-",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                cwd=ROOT,
            )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if line != b"ready\n":
            pytest.fail(f"the forking server did not start: {await _text(errors)}")
        return cls(process, errors)

    def said(self, word: str, pid: int) -> asyncio.Future[int]:
        """Done once ``pid`` said ``word``: ``working`` (connected), ``fresh`` (its
        first message that is not a duplicate) or ``exit`` (the server saw it exit);
        with its exit code (``-9`` when SIGKILLed) for ``exit``, else ``pid``."""
        if (word, pid) not in self._said:
            self._said[(word, pid)] = asyncio.get_running_loop().create_future()
        return self._said[(word, pid)]

    async def fork(self, spec: dict[str, object]) -> int:
        """A new process working through ``spec``: its pid."""
        assert self.process.stdin is not None
        async with self._forking:  # the pids answered in the order asked
            self.process.stdin.write(json.dumps(spec).encode() + b"\n")
            pid = await asyncio.wait_for(self._forked.get(), 30)
        self.pids.append(pid)
        return pid

    async def stop(self) -> None:
        """Kill what still runs (a test that failed midway), then stop the server."""
        for pid in self.pids:
            if not self.said("exit", pid).done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        assert self.process.stdin is not None
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), 30)
        await self._reader

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            word, pid, *more = line.decode().split()
            if word == "forked":
                self._forked.put_nowait(int(pid))
            else:
                self.said(word, int(pid)).set_result(int(more[0]) if more else int(pid))


async def _finish(router: Router, jobs: list[str]) -> int:
    """The final clean pass: every job's hits sent again, then held creates made and
    the jobs whose execution exists closed, until nothing is held and every job is
    closed. Answers how many rounds it took."""
    worker = FlowWorker(router)
    for job in jobs:
        for n in range(1, HITS + 1):
            await send(router, job, "hit", n)
    left = list(jobs)
    rounds = 0
    while left or await worker.held_creates() != (0, 0):
        rounds += 1
        assert rounds <= 10 * len(jobs), (left, await worker.held_creates())
        await worker.flush_due()
        for job in list(left):
            if await exists(router, job):
                assert await send(router, job, "close") in ("delivered", "duplicate")
                left.remove(job)
    return rounds


def _most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans ``[created, ended)`` that hold one instant (an end before a
    create at the same instant)."""
    moments = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = live = 0
    for _, step in moments:
        live += step
        most = max(most, live)
    return most


async def _inputs(router: Router, execution_id: str) -> list[tuple[str, object]]:
    """The execution's input log: each event's name and its hit's ``n`` (``None`` for a
    close)."""
    logged = []
    for entry in await Executions(router.storage).inputs(execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        logged.append((entry.event.name, data.get("n")))
    return logged


async def _closed(router: Router, job: str) -> bool:
    """Whether the job's execution was created and has ended."""
    found = await address(router, SCOPE, DOCUMENT, job)
    if found is None:
        return False
    record = await router.adapter.fetch_execution(found.execution_id)
    return record is not None and record.status is Status.COMPLETED


@pytest.mark.asyncio
async def test_two_processes_killed_anywhere_never_pass_the_cap_and_make_each_job_once(
    router_db: RouterDb,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    options = router_db.store.tables.options
    router = router_of(router_db.adapter)
    per_process = JOBS[router_db.backend]
    works = [[f"p{slot}j{index:02}" for index in range(per_process)] for slot in range(2)]
    jobs = [job for work in works for job in work]
    specs: list[dict[str, object]] = [
        {"jobs": work, "hits": HITS, "window": WINDOW} for work in works
    ]
    rng = random.Random(31)
    kills = finished = 0
    sampler = Sampler(router_db.store.url, router_db.store.tables)
    server = await Server.start(router_db.store.url, options, tmp_path / "server.err")

    async def slot(spec: dict[str, object]) -> None:
        """One process after another on ``spec`` until the kills are made, each killed
        a random time after it began to send new messages (one in four: after it
        connected, most likely while it sends again what was sent), the last wherever
        it is; until one runs through its work."""
        nonlocal kills, finished
        while kills < KILLS:
            pid = await server.fork(spec)
            exited = server.said("exit", pid)
            start = server.said("working" if rng.random() < EARLY else "fresh", pid)
            # A process that sends nothing new for long (all its jobs wait on the
            # other's) is killed all the same.
            await asyncio.wait([start, exited], timeout=STALL, return_when="FIRST_COMPLETED")
            await asyncio.wait([exited], timeout=rng.uniform(*PAUSE))
            if not exited.done():
                with contextlib.suppress(ProcessLookupError):  # it exited just now
                    os.kill(pid, signal.SIGKILL)
            code = await exited
            if code != -signal.SIGKILL:
                assert code == 0, await _text(server.errors)
                finished += 1
                return
            kills += 1

    sampler.start()
    try:
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(*(slot(spec) for spec in specs))
            killing = time.monotonic() - started
            closed_by_processes = sum([await _closed(router, job) for job in jobs])
            rounds = await _finish(router, jobs)
    finally:
        sampler.stop()
        await server.stop()
    took = time.monotonic() - started
    print(
        f"{router_db.backend}: {kills} processes killed mid-work, {finished} ran through; "
        f"{closed_by_processes} of {len(jobs)} jobs closed before the final pass "
        f"({rounds} rounds); {sum(sampler.counts.values())} samples of the live "
        f"executions {dict(sorted(sampler.counts.items()))}; {killing:.1f} s killing, "
        f"{took:.1f} s in all"
    )
    assert kills >= KILLS, (kills, finished)

    # 1. Never more than the cap live: in any committed state the sampler saw, and
    # over the executions' lives, from their create to their end. A create reads the
    # clock under the cap's lock after it found the slot of an ended execution given
    # back, so after that execution's end was stamped: the lives of a cap's executions
    # overlap no more than it allows.
    assert sum(sampler.counts.values()) > 100, sampler.errors
    assert max(sampler.counts) <= CAP.max_active, sampler.counts
    records = await router.storage.list_executions()
    assert {record.status for record in records} == {Status.COMPLETED}
    spans = []
    for record in records:
        assert record.created_at is not None
        assert record.ended_at is not None
        spans.append((record.created_at, record.ended_at))
    most = _most_at_once(spans)
    assert 1 < most <= CAP.max_active, most

    # 2. One execution a job, every held create made once: its hits in order, once
    # each, then its close.
    assert len(records) == len(jobs)
    assert await FlowWorker(router).held_creates() == (0, 0)
    execution_of: dict[str, str] = {}
    for job in jobs:
        found = await address(router, SCOPE, DOCUMENT, job)
        assert found is not None, job
        execution_of[job] = found.execution_id
        expected = [("job.hit", n) for n in range(1, HITS + 1)] + [("job.close", None)]
        assert await _inputs(router, found.execution_id) == expected, job
    assert len(set(execution_of.values())) == len(jobs)

    # 3. Each message arrived once (a buffered hit is made later, once); its resends
    # are duplicates; a job's first hit created its execution.
    rows = await ledger(router)
    sent = {
        message_id(job, kind, n): job
        for job in jobs
        for kind, n in [*(("hit", n) for n in range(1, HITS + 1)), ("close", 0)]
    }
    assert {row.message_id for row in rows} == set(sent)
    # The ledger lists one message's rows in time order: a made create's after its
    # arrival's, whichever process held it.
    outcomes: dict[str, list[str]] = {}
    for row in rows:
        assert row.message_id is not None
        assert row.key == sent[row.message_id]
        if row.outcome != "duplicate":
            outcomes.setdefault(row.message_id, []).append(row.spelled)
            made = None if row.outcome == "buffered" else execution_of[row.key]
            assert row.execution_id == made, row
    held = 0
    for job in jobs:
        first = message_id(job, "hit", 1)
        assert outcomes[first] in (
            ["created_and_delivered"],
            ["buffered", "created_and_delivered"],
        ), (first, outcomes[first])
        for n in range(2, HITS + 1):
            hit = message_id(job, "hit", n)
            assert outcomes[hit] in (["delivered"], ["buffered", "delivered"]), (hit, outcomes[hit])
        close = message_id(job, "close", 0)
        assert outcomes[close] == ["delivered"], (close, outcomes[close])
        held += "buffered" in outcomes[first]
    # The cap held most creates: two processes keep twice its jobs open.
    assert held > len(jobs) // 2, held
    assert sum(row.outcome == "duplicate" for row in rows) > 0
