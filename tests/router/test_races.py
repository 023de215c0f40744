"""Deliveries racing for one key, on SQLite and PostgreSQL: tasks of one process and OS
processes routing first events for a new key, redeliveries of one message, and batches
taking the same keys in opposite orders. Whatever the interleaving, one key has one
execution, every message is in the ledger once, and the input log holds each delivered
event once: none lost, none twice."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from tests.persistence.conftest import SqlStore
from tests.router.conftest import RouterDb
from tests.router.racing_router import DOCUMENT, HITS, LOCK_WAIT, SCOPE, hit

from statifier.chart import Machine, compile_chart
from statifier.persistence import Executions
from statifier.router import Failed, InboundEvent, Routed, Router, StaticResolver, address, ledger


@pytest.fixture(name="router_store")
def _locking_router_store(locking_store: SqlStore) -> SqlStore:
    """Each backend, and PostgreSQL whose locks are rows: these tests are about what
    locks keep apart."""
    return locking_store


COUNTER = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="counting">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="counting">
    <transition event="hit"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>
"""
"""Counts hits: every hit takes the self-transition, so ``n`` is the number of events
the execution stepped with."""

TASKS = 8
PROCESSES = 2
PER_PROCESS = 25
LANES_PER_PROCESS = 5
KEYS = 20
DEADLINE = 60.0
PAUSE = 0.01
"""Seconds between one task's events in the racing processes, so that on SQLite each
process gets the file's write lock while the other still has events to route."""
RACER = Path(__file__).with_name("racing_router.py")

_T = TypeVar("_T")
_CHART: list[Machine] = []


def counter_chart() -> Machine:
    """The counter chart, compiled once."""
    if not _CHART:
        _CHART.append(compile_chart(COUNTER))
    return _CHART[0]


def counter_router(router_db: RouterDb) -> Router:
    """Hits routed to counters on ``router_db``, with a lock wait long enough that only
    a lost or duplicated event, never a slow machine, fails a test."""
    resolver = StaticResolver({DOCUMENT: counter_chart()})
    return router_db.router([HITS], resolver=resolver, lock_wait=LOCK_WAIT)


async def all_at_once(count: int, work: Callable[[int], Awaitable[_T]]) -> list[_T]:
    """``work(0)`` ... ``work(count - 1)`` as tasks released together by a barrier."""
    barrier = asyncio.Barrier(count)

    async def racer(index: int) -> _T:
        await barrier.wait()
        return await work(index)

    async with asyncio.timeout(DEADLINE):
        return await asyncio.gather(*(racer(index) for index in range(count)))


def outcomes_of(answers: list[Routed]) -> list[tuple[str, str]]:
    """``(message_id, outcome)`` of every outcome of ``answers``."""
    return [(a.event.message_id, outcome.outcome) for a in answers for outcome in a.outcomes]


async def logged_messages(router: Router, execution_id: str) -> list[str]:
    """The message ids of the execution's input log, in log order."""
    logged = []
    for entry in await Executions(router.storage).inputs(execution_id):
        assert entry.event is not None
        data = entry.event.data
        assert isinstance(data, dict)
        logged.append(data["message_id"])
    return logged


async def count_of(router: Router, execution_id: str) -> object:
    """The counter ``n`` the execution holds."""
    record = await router.adapter.fetch_execution(execution_id)
    assert record is not None
    return router.storage.load(record, counter_chart()).datamodel["n"]


async def assert_each_message_once(
    router: Router, sent: dict[str, list[str]], answered: list[tuple[str, str]]
) -> None:
    """Every key of ``sent`` has one execution, named by its address; every message in
    ``sent`` has one ledger row (the first of each key created the execution, the rest
    were delivered to it), its event is in that execution's input log once, and the
    counter counted it; ``answered`` (what the routing calls returned) agrees with the
    ledger."""
    executions = {record.id for record in await router.adapter.list_by_metadata({})}
    assert len(executions) == len(sent)
    rows = await ledger(router)
    assert Counter(row.message_id for row in rows) == Counter(
        message_id for messages in sent.values() for message_id in messages
    )
    assert sorted(answered) == sorted((row.message_id, row.spelled) for row in rows)
    for key, messages in sent.items():
        found = await address(router, SCOPE, DOCUMENT, key)
        assert found is not None
        execution_id = found.execution_id
        assert execution_id in executions
        mine = [row for row in rows if row.key == key]
        assert {row.execution_id for row in mine} == {execution_id}
        assert Counter(row.spelled for row in mine) == {
            "created_and_delivered": 1,
            "delivered": len(messages) - 1,
        }
        logged = await logged_messages(router, execution_id)
        assert sorted(logged) == sorted(messages)
        assert await count_of(router, execution_id) == len(messages)


async def start_racers(
    router_db: RouterDb, tmp_path: Path, jobs: list[dict[str, object]]
) -> list[asyncio.subprocess.Process]:
    """One racing router process per job, each connected before the next starts, then
    all told to go at once.

    Connecting one at a time, not the routing: SQLite connections that two processes
    open at the same moment can fail in the adapter's connect hook (``PRAGMA
    journal_mode = WAL`` answers "database is locked"), a startup race of the
    persistence layer that is not what these tests are about."""
    chart = tmp_path / "counter.scxml"
    chart.write_bytes(COUNTER)
    options = router_db.store.tables.options
    processes = []
    async with asyncio.timeout(DEADLINE):
        for job in jobs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(RACER),
                router_db.store.url,
                options.prefix,
                options.schema or "-",
                options.locks,
                str(chart),
                json.dumps(job),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            processes.append(process)
            assert process.stdout is not None
            if (await process.stdout.readline()).strip() != b"ready":
                _, err = await process.communicate()
                pytest.fail(f"a racing router did not start: {err.decode()}")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await process.stdin.drain()
    return processes


async def meet(processes: list[asyncio.subprocess.Process]) -> None:
    """Wait until every process (started with ``"meet": true``) has routed its first
    event, then let them all go on. Without it a loaded machine can run one process to
    its end before the other routes anything (SQLite's writer waits by polling the
    file's lock), and the race the test is about never happens."""
    async with asyncio.timeout(DEADLINE):
        for process in processes:
            assert process.stdout is not None
            if (await process.stdout.readline()).strip() != b"first":
                _, err = await process.communicate()
                pytest.fail(f"a racing router did not route its first event: {err.decode()}")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write(b"on\n")
        await process.stdin.drain()


async def finish_racers(processes: list[asyncio.subprocess.Process]) -> list[tuple[str, str]]:
    """What every process answered, once all have exited cleanly."""
    answered: list[tuple[str, str]] = []
    async with asyncio.timeout(DEADLINE):
        for process in processes:
            out, err = await process.communicate()
            assert process.returncode == 0, err.decode()
            answered.extend((message_id, outcome) for message_id, outcome in json.loads(out))
    return answered


@pytest.mark.asyncio
async def test_tasks_racing_first_events_for_a_new_key_create_one_execution(
    router_db: RouterDb,
) -> None:
    """Eight first events for one new key at once: the address's unique index (and, on
    PostgreSQL, its advisory lock) lets one create; the others deliver to its execution,
    none creates a second and none is lost."""
    router = counter_router(router_db)
    messages = [f"m{index}" for index in range(TASKS)]

    async def send(index: int) -> Routed:
        return await router.route(hit(messages[index], "k"))

    answers = await all_at_once(TASKS, send)

    await assert_each_message_once(router, {"k": messages}, outcomes_of(answers))


@pytest.mark.asyncio
async def test_processes_racing_for_a_new_key_share_one_execution(
    router_db: RouterDb, tmp_path: Path
) -> None:
    """Two processes of five tasks each route 25 hits for one new key at once: across
    processes (SQLite's file lock, PostgreSQL's advisory locks) there is still one
    execution, and its input log holds the 50 events once each."""
    router = counter_router(router_db)
    sent = [f"p{p}-m{m}" for p in range(PROCESSES) for m in range(PER_PROCESS)]
    jobs: list[dict[str, object]] = []
    for p in range(PROCESSES):
        mine = sent[p * PER_PROCESS : (p + 1) * PER_PROCESS]
        lanes = [[[m, "k"] for m in mine[n::LANES_PER_PROCESS]] for n in range(LANES_PER_PROCESS)]
        jobs.append({"batch": False, "pause": PAUSE, "lanes": lanes, "meet": True})

    processes = await start_racers(router_db, tmp_path, jobs)
    await meet(processes)
    answered = await finish_racers(processes)

    await assert_each_message_once(router, {"k": sent}, answered)
    # They really ran at once: each process's first event was logged before the other's
    # last one (the meeting makes sure of it; the rest then race freely).
    (execution,) = await router.adapter.list_by_metadata({})
    logged = await logged_messages(router, execution.id)
    by_process = [[at for at, m in enumerate(logged) if m.startswith(f"p{p}-")] for p in (0, 1)]
    assert by_process[0][0] < by_process[1][-1]
    assert by_process[1][0] < by_process[0][-1]


@pytest.mark.asyncio
@pytest.mark.parametrize("existing", [False, True], ids=["new_key", "existing_key"])
async def test_tasks_redelivering_one_message_deliver_it_once(
    router_db: RouterDb, existing: bool
) -> None:
    """Eight tasks route the same message at once: the dedupe claim lets one through,
    the other seven are duplicates (a ledger row each, nothing stepped), for a new key
    and for one whose execution exists."""
    router = counter_router(router_db)
    before = []
    if existing:
        await router.route(hit("m0", "k"))
        before = ["m0"]

    async def send(_index: int) -> Routed:
        return await router.route(hit("m1", "k"))

    answers = await all_at_once(TASKS, send)

    first = "delivered" if existing else "created_and_delivered"
    assert Counter(outcome for _, outcome in outcomes_of(answers)) == {
        first: 1,
        "duplicate": TASKS - 1,
    }
    rows = [row for row in await ledger(router) if row.message_id == "m1"]
    assert Counter(row.spelled for row in rows) == {first: 1, "duplicate": TASKS - 1}
    (execution,) = await router.adapter.list_by_metadata({})
    assert await logged_messages(router, execution.id) == [*before, "m1"]
    assert await count_of(router, execution.id) == len(before) + 1


def opposite_batches(prefixes: tuple[str, str]) -> tuple[list[InboundEvent], list[InboundEvent]]:
    """Two batches for keys k01..k20, the first in ascending order and the second in
    descending, with message ids of their own."""
    keys = [f"k{index:02}" for index in range(1, KEYS + 1)]
    first, second = prefixes
    ascending = [hit(f"{first}-{key}", key) for key in keys]
    descending = [hit(f"{second}-{key}", key) for key in reversed(keys)]
    return ascending, descending


def sent_by_key(*batches: list[InboundEvent]) -> dict[str, list[str]]:
    """The message ids of ``batches``, by key."""
    sent: dict[str, list[str]] = {}
    for batch in batches:
        for event in batch:
            key = event.data["key"]
            assert isinstance(key, str)
            sent.setdefault(key, []).append(event.message_id)
    return sent


@pytest.mark.asyncio
async def test_batches_taking_keys_in_opposite_orders_do_not_deadlock(
    router_db: RouterDb,
) -> None:
    """Two ``route_many`` batches for the same 20 new keys, in opposite orders, at once:
    each takes its locks in one sorted order, so both complete; each key has one
    execution that got both its events."""
    router = counter_router(router_db)
    batches = opposite_batches(("a", "b"))

    async def send(index: int) -> list[Routed | Failed]:
        return await router.route_many(batches[index])

    results = await asyncio.wait_for(all_at_once(2, send), DEADLINE)

    answers = [answer for result in results for answer in result]
    routed = [answer for answer in answers if isinstance(answer, Routed)]
    assert routed == answers
    await assert_each_message_once(router, sent_by_key(*batches), outcomes_of(routed))


@pytest.mark.asyncio
async def test_batches_from_two_processes_in_opposite_orders_do_not_deadlock(
    router_db: RouterDb, tmp_path: Path
) -> None:
    """The same opposite batches from two OS processes: on SQLite they contend for the
    file's write lock rather than the process's writer, on PostgreSQL for the advisory
    locks from two connections of two engines; both complete, nothing lost."""
    router = counter_router(router_db)
    batches = opposite_batches(("a", "b"))
    jobs: list[dict[str, object]] = [
        {"batch": True, "lanes": [[[event.message_id, event.data["key"]] for event in batch]]}
        for batch in batches
    ]

    answered = await finish_racers(await start_racers(router_db, tmp_path, jobs))

    await assert_each_message_once(router, sent_by_key(*batches), answered)
