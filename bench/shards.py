"""Several stores: durable steps over K stores (`statifier.persistence.shards.ShardedAdapter`)
and router deliveries over K stores (`statifier.router.ShardedRouter`), the cost per step
and per delivery of K = 3 stores in one server against K = 1; with `--servers`, the
router over K = 1, 2, 3 PostgreSQL servers of the bench's own.

Durable steps (rows `steps`). Each row creates `--executions` executions of a small
counter chart through `Executions` over a `ShardedAdapter` of K stores, then steps each
`--steps` times, the executions stepped in turn (every step its own transaction: the
adapter's `record_step`). Only the steps are timed.

Router deliveries (rows `router`). Each row builds one `RouterConfig` (the counter chart
and binding of `counter.py`: every event keyed by `event.key`, the execution created if
absent) and runs it over K stores with `ShardedRouter(config, adapters)`. It first
routes a warm-up batch (30 keys, created then delivered to: every store's connection
opened), then the create pass: `--keys` keys, each created by its first event, in
`route_many` batches of `--batch` distinct keys (timed: us/create); then `--events` - 1
passes of steady deliveries to the executions now existing, each pass the keys in
another shuffled order cut into batches of `--batch` distinct keys (timed: us/delivery,
the row's figure). A batch is one `ShardedRouter.route_many` call: each store's part in
one transaction of that store, the stores concurrently. Every answer is checked
(`created_and_delivered`, then `delivered`).

Both kinds of rows are run for:

- `sqlite K=1` and `sqlite K=3`: one SQLite file, and three files in one directory;
- `postgresql K=1` and `postgresql K=3`: one schema, and three schemas of the database
  of `--url` (three stores in one server: what K costs before a second server is added).

The rows take turns (K=1, K=3, then K=3, K=1, ...), `--rounds` times each, on fresh
tables, and the medians are printed. The goal is K = 3 at most 10% slower per step, and
per steady delivery, than K = 1 (the ratio K=3/K=1 and the verdict are printed; the
creates' ratio is printed without a goal). A step or a delivery touches one store
whatever K; what K adds is choosing the store (a hash of the execution's id, of the
address's key), a connection pool per store and, for a `route_many` batch, one
transaction per store instead of one.

Separate servers (`--servers`, off by default: it starts servers). The bench starts
three PostgreSQL servers of its own (`tests/service/own_postgres.py`: `initdb` and
`pg_ctl` on free loopback ports, trust authentication, and `fsync`,
`synchronous_commit` and `full_page_writes` off, so that a delivery costs CPU rather
than waits on the disk) and, for K = 1, 2, 3, routes over the first K of them: fresh
tables in a schema of each (migrated with `statifier.sql.migrations.upgrade`),
`--clients` client processes (2) each running `--lanes` (4) concurrent `route_many`
loops in one asyncio loop, every lane on keys of its own (`--batch` keys, created
before the clock starts, then a batch of all of them again and again), for
`--duration` seconds (10; 3 with `--quick`). The K values take turns
(`--server-rounds` times, 2; 1 with `--quick`). Per K it prints deliveries/s (all
deliveries over the wall time from the go to the last lane done), the CPU seconds of
the client processes (their own count, from the go to their end), of the servers in use
(the `utime + stime` of each server's postmaster and its children, read from `/proc`
before and after, the postmaster's `cutime + cstime` counting the backends that ended
in between), the cores used ((client + servers) CPU over the wall time), deliveries
per CPU-second, and the whole machine's busy CPU seconds (`/proc/stat`: the difference
to client + servers is other work, the idle servers' included). This machine has only
2 cores: the client processes and the servers share them, so separate servers on it
show the cost structure (how the CPU per delivery of the client and of the servers
changes with K), not the scaling that separate machines would give.

Commands (from the repository root; the PostgreSQL rows need a server at `--url`):

    PYTHONPATH=bench:src python bench/shards.py                 # steps and router, both databases
    PYTHONPATH=bench:src python bench/shards.py --only sqlite --quick
    PYTHONPATH=bench:src python bench/shards.py --rows router --url postgresql://...
    PYTHONPATH=bench:src python bench/shards.py --servers       # also the separate servers
    PYTHONPATH=bench:src python bench/shards.py --rows servers --duration 20
    PYTHONPATH=bench:src python bench/shards.py --quick --json shards.json
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
    verdict,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.shards import ShardedAdapter
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Failed,
    InboundEvent,
    RouterConfig,
    ShardedRouter,
    StaticResolver,
)
from statifier.sql import TableOptions

GOAL = 1.10
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="on">
<datamodel><data id="n" expr="0"/></datamodel>
<state id="on">
  <transition event="add"><assign location="n" expr="n + _event.data.by"/></transition>
</state>
</scxml>"""
SCOPE = "bench"
CREATED = "created_and_delivered"
DELIVERED = "delivered"
WARM_KEYS = 30
SERVERS = (1, 2, 3)
REPOSITORY = Path(__file__).resolve().parent.parent
ROWS = ("steps", "router", "servers")

Place = tuple[str, TableOptions]


def places(database: str, stores: int, url: str, folder: Path) -> list[Place]:
    """``stores`` fresh, migrated places: SQLite files, or PostgreSQL schemas."""
    from statifier.sql import migrations

    made: list[Place] = []
    for _ in range(stores):
        name = uuid.uuid4().hex[:8]
        if database == "sqlite":
            place = (f"sqlite:///{folder / f'shard_{name}.db'}", TableOptions())
        else:
            place = (url, TableOptions(schema=f"bench_shards_{name}"))
        migrations.upgrade(*place)
        made.append(place)
    return made


@contextmanager
def fresh(database: str, stores: int, url: str, folder: Path) -> Iterator[list[Place]]:
    """:func:`places`, their PostgreSQL schemas dropped when the block ends."""
    made = places(database, stores, url, folder)
    try:
        yield made
    finally:
        for place_url, tables in made:
            if tables.schema is not None:
                drop_schema(place_url, tables.schema)


# --- durable steps ----------------------------------------------------------------------


async def run_row(stores: list[Place], executions: int, steps: int) -> float:
    """Seconds per step over ``stores``, the steps timed (not the creates)."""
    adapters = [SqlAdapter(url, tables) for url, tables in stores]
    try:
        lifecycle = Executions(Storage(ShardedAdapter(adapters)), executor=ignore_effects)
        machine = compile_chart(COUNTER, name="counter")
        ids = [f"ex-{uuid.uuid4().hex[:12]}" for _ in range(executions)]
        for execution_id in ids:
            await lifecycle.create(execution_id, machine)
        event = Event("add", data={"by": 1})
        started = time.perf_counter()
        for _ in range(steps):
            for execution_id in ids:
                await lifecycle.step(execution_id, machine, event)
        return (time.perf_counter() - started) / (steps * executions)
    finally:
        for adapter in adapters:
            await adapter.close()


# --- router deliveries ------------------------------------------------------------------


def sharded_router(adapters: Sequence[SqlAdapter]) -> ShardedRouter:
    """The counter's router configuration over ``adapters``, one store each."""
    resolver = StaticResolver({DOCUMENT: compile_chart(CHART)})
    config = RouterConfig(adapters[0], bindings=[BINDING], resolver=resolver)
    return ShardedRouter(config, adapters)


async def route_checked(
    router: ShardedRouter, keys: Sequence[str], turn: int, expected: str
) -> None:
    """Route one event to each of ``keys`` (message ids ``key:turn``) in one
    ``route_many`` batch; raise unless every answer is the one ``expected``."""
    events = [
        InboundEvent(scope=SCOPE, source=SOURCE, message_id=f"{key}:{turn}", data={"key": key})
        for key in keys
    ]
    for answer in await router.route_many(events):
        if isinstance(answer, Failed):
            raise RuntimeError(f"{answer.event.message_id} failed: {answer.error!r}")
        outcomes = [outcome.outcome for outcome in answer.outcomes]
        if outcomes != [expected]:
            raise RuntimeError(f"{answer.event.message_id}: {outcomes}, expected {expected}")


def cut(keys: Sequence[str], batch: int) -> list[Sequence[str]]:
    """``keys`` in consecutive batches of at most ``batch``."""
    return [keys[start : start + batch] for start in range(0, len(keys), batch)]


async def run_router_row(
    stores: list[Place], keys: int, events: int, batch: int
) -> tuple[float, float]:
    """Seconds per create and per steady delivery of ``route_many`` over ``stores``."""
    adapters = [SqlAdapter(url, tables) for url, tables in stores]
    try:
        router = sharded_router(adapters)
        prefix = uuid.uuid4().hex[:8]
        warm = [f"warm-{prefix}-{number}" for number in range(WARM_KEYS)]
        await route_checked(router, warm, 0, CREATED)
        await route_checked(router, warm, 1, DELIVERED)
        names = [f"k-{prefix}-{number}" for number in range(keys)]
        started = time.perf_counter()
        for part in cut(names, batch):
            await route_checked(router, part, 0, CREATED)
        creates = (time.perf_counter() - started) / keys
        shuffled = [random.Random(turn).sample(names, len(names)) for turn in range(1, events)]
        started = time.perf_counter()
        for turn, order in enumerate(shuffled, start=1):
            for part in cut(order, batch):
                await route_checked(router, part, turn, DELIVERED)
        deliveries = (time.perf_counter() - started) / (keys * (events - 1))
        return creates, deliveries
    finally:
        for adapter in adapters:
            await adapter.close()


# --- separate servers: CPU from /proc ---------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, int, int]]:
    """Every process's parent, own CPU ticks (utime + stime) and its ended children's
    (cutime + cstime), from ``/proc/<pid>/stat``."""
    found: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path("/proc", entry, "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()  # from field 3, the state
        found[int(entry)] = (
            int(fields[1]),
            int(fields[11]) + int(fields[12]),
            int(fields[13]) + int(fields[14]),
        )
    return found


def servers_cpu_s(postmasters: Sequence[int]) -> list[float]:
    """Each server's CPU seconds so far: its postmaster's own and ended children's, and
    its living children's own."""
    processes = _processes()
    ticks = dict.fromkeys(postmasters, 0)
    for pid, (parent, own, ended) in processes.items():
        if pid in ticks:
            ticks[pid] += own + ended
        elif parent in ticks:
            ticks[parent] += own
    return [ticks[postmaster] / TICKS for postmaster in postmasters]


def machine_busy_s() -> float:
    """The machine's busy CPU seconds since boot, all cores (``/proc/stat``: user, nice,
    system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def postmaster_pid(data: Path) -> int:
    """The postmaster's pid, the first line of ``postmaster.pid`` in its data directory."""
    return int((data / "postmaster.pid").read_text().splitlines()[0])


# --- separate servers: the clients ------------------------------------------------------


@dataclass(frozen=True)
class ClientPlan:
    """What one client process routes: over which stores, on which keys, how long."""

    client: int
    urls: tuple[str, ...]
    schema: str
    lanes: int
    batch: int
    duration: float


def client_main(plan: ClientPlan, ready: Any, go: Any, results: Any) -> None:
    """A client process: its keys created, then ``ready``, then lanes of ``route_many``
    from ``go`` for ``plan.duration``; its counts (or its error) put on ``results``."""
    try:
        asyncio.run(_client(plan, ready, go, results))
    except BaseException as error:
        ready.put(("error", plan.client, repr(error)))
        results.put({"client": plan.client, "error": repr(error)})
        raise


async def _client(plan: ClientPlan, ready: Any, go: Any, results: Any) -> None:
    tables = TableOptions(schema=plan.schema)
    adapters = [SqlAdapter(url, tables) for url in plan.urls]
    try:
        router = sharded_router(adapters)
        lanes = [
            [f"c{plan.client}-l{lane}-k{number}" for number in range(plan.batch)]
            for lane in range(plan.lanes)
        ]
        await asyncio.gather(*(route_checked(router, keys, 0, CREATED) for keys in lanes))
        ready.put(("ready", plan.client, ""))
        await asyncio.to_thread(go.wait)
        cpu = time.process_time()
        started = time.perf_counter()
        deadline = started + plan.duration

        async def lane(keys: list[str]) -> int:
            turn = 1
            while time.perf_counter() < deadline:
                await route_checked(router, keys, turn, DELIVERED)
                turn += 1
            return (turn - 1) * len(keys)

        counts = await asyncio.gather(*(lane(keys) for keys in lanes))
        results.put(
            {
                "client": plan.client,
                "deliveries": sum(counts),
                "cpu_s": time.process_time() - cpu,
                "elapsed_s": time.perf_counter() - started,
            }
        )
    finally:
        for adapter in adapters:
            await adapter.close()


def _get(channel: Any, timeout: float, what: str) -> Any:
    try:
        return channel.get(timeout=timeout)
    except queue.Empty:
        raise RuntimeError(f"no client {what} within {timeout:.0f} s") from None


def run_servers_row(
    urls: Sequence[str], postmasters: Sequence[int], k: int, args: Any
) -> dict[str, Any]:
    """One run over the first ``k`` of the servers: deliveries, wall time and CPU."""
    from statifier.sql import migrations

    schema = f"bench_shards_{uuid.uuid4().hex[:8]}"
    for url in urls[:k]:
        migrations.upgrade(url, TableOptions(schema=schema))
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    plans = [
        ClientPlan(client, tuple(urls[:k]), schema, args.lanes, args.batch, args.duration)
        for client in range(args.clients)
    ]
    clients = [
        context.Process(target=client_main, args=(plan, ready, go, results)) for plan in plans
    ]
    for process in clients:
        process.start()
    try:
        for _ in clients:
            state, client, detail = _get(ready, 300, "ready")
            if state == "error":
                raise RuntimeError(f"client {client} failed before the go: {detail}")
        servers_before = servers_cpu_s(postmasters)
        machine_before = machine_busy_s()
        started = time.perf_counter()
        go.set()
        answers = [_get(results, args.duration + 300, "result") for _ in clients]
        wall = time.perf_counter() - started
        servers_after = servers_cpu_s(postmasters)
        machine_after = machine_busy_s()
        for process in clients:
            process.join(60)
    finally:
        for process in clients:
            if process.is_alive():
                process.terminate()
                process.join(10)
    failed = [answer for answer in answers if "error" in answer]
    if failed:
        raise RuntimeError(f"clients failed: {failed}")
    per_server = [
        after - before for before, after in zip(servers_before, servers_after, strict=True)
    ]
    deliveries = sum(answer["deliveries"] for answer in answers)
    client_cpu = sum(answer["cpu_s"] for answer in answers)
    servers_cpu = sum(per_server[:k])
    return {
        "k": k,
        "deliveries": deliveries,
        "wall_s": wall,
        "deliveries_per_s": deliveries / wall,
        "client_cpu_s": client_cpu,
        "servers_cpu_s": servers_cpu,
        "each_server_cpu_s": per_server,
        "machine_busy_s": machine_after - machine_before,
        "cores_used": (client_cpu + servers_cpu) / wall,
        "deliveries_per_cpu_s": deliveries / (client_cpu + servers_cpu),
        "clients": answers,
    }


def servers_rows(args: Any, rounds: int) -> dict[str, Any]:
    """The separate servers' runs: K = 1, 2, 3 taking turns ``rounds`` times over
    servers of the bench's own, and each K's totals."""
    if str(REPOSITORY) not in sys.path:
        sys.path.insert(0, str(REPOSITORY))
    from tests.service.own_postgres import servers

    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in SERVERS}
    with servers(max(SERVERS)) as started:
        urls = [server.url for server in started]
        postmasters = [postmaster_pid(server.data) for server in started]
        print(f"\nseparate servers: {len(started)} started, on ports {[s.port for s in started]}")
        for turn in range(rounds):
            for k in rotated(list(SERVERS), turn):
                runs[k].append(run_servers_row(urls, postmasters, k, args))
    totals = {k: _totals(runs[k]) for k in SERVERS}
    header = (
        f"{'K':>2} | {'deliveries/s':>12} | {'client CPU s':>12} | {'servers CPU s':>13} | "
        f"{'deliveries/CPU-s':>16} | {'cores used':>10} | {'wall s':>6} | {'machine busy s':>14}"
    )
    print_table_header(header)
    for k in SERVERS:
        row = totals[k]
        print(
            f"{k:>2} | {row['deliveries_per_s']:>12,.0f} | {row['client_cpu_s']:>12.2f} | "
            f"{row['servers_cpu_s']:>13.2f} | {row['deliveries_per_cpu_s']:>16,.0f} | "
            f"{row['cores_used']:>10.2f} | {row['wall_s']:>6.1f} | {row['machine_busy_s']:>14.2f}"
        )
    print(
        f"{args.clients} client processes x {args.lanes} lanes, batches of {args.batch}, "
        f"{args.duration:g} s per run, {rounds} run(s) per K (CPU and wall: per run, "
        f"averaged); {os.cpu_count()} CPU(s): clients and servers share them"
    )
    return {
        "clients": args.clients,
        "lanes": args.lanes,
        "batch": args.batch,
        "duration_s": args.duration,
        "rounds": rounds,
        "totals": {str(k): totals[k] for k in SERVERS},
        "runs": {str(k): runs[k] for k in SERVERS},
    }


def _totals(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One K's runs together: rates over the summed deliveries, wall and CPU; CPU and
    wall seconds per run averaged."""
    deliveries = sum(run["deliveries"] for run in runs)
    wall = sum(run["wall_s"] for run in runs)
    client = sum(run["client_cpu_s"] for run in runs)
    servers = sum(run["servers_cpu_s"] for run in runs)
    busy = sum(run["machine_busy_s"] for run in runs)
    return {
        "deliveries_per_s": deliveries / wall,
        "client_cpu_s": client / len(runs),
        "servers_cpu_s": servers / len(runs),
        "wall_s": wall / len(runs),
        "machine_busy_s": busy / len(runs),
        "cores_used": (client + servers) / wall,
        "deliveries_per_cpu_s": deliveries / (client + servers),
        "client_cpu_us_per_delivery": client / deliveries * 1e6,
        "servers_cpu_us_per_delivery": servers / deliveries * 1e6,
    }


# --- running ----------------------------------------------------------------------------


def steps_rows(database: str, args: Any, rounds: int, steps: int, folder: Path) -> dict[str, Any]:
    samples: dict[int, list[float]] = {1: [], 3: []}
    for turn in range(rounds):
        for stores in (1, 3) if turn % 2 == 0 else (3, 1):
            with fresh(database, stores, args.url, folder) as made:
                samples[stores].append(asyncio.run(run_row(made, args.executions, steps)))
    one, three = (statistics.median(samples[k]) for k in (1, 3))
    ratio = three / one
    print(
        f"{database:<11} K=1 {one * 1e6:8.0f} us/step   K=3 {three * 1e6:8.0f} us/step"
        f"   K=3/K=1 {fmt_ratio(ratio)}   at most {GOAL:.2f}x: {verdict(ratio <= GOAL)}"
    )
    return {"k1_us_per_step": one * 1e6, "k3_us_per_step": three * 1e6, "k3_over_k1": ratio}


def router_rows(database: str, args: Any, rounds: int, events: int, folder: Path) -> dict[str, Any]:
    creates: dict[int, list[float]] = {1: [], 3: []}
    deliveries: dict[int, list[float]] = {1: [], 3: []}
    for turn in range(rounds):
        for stores in (1, 3) if turn % 2 == 0 else (3, 1):
            with fresh(database, stores, args.url, folder) as made:
                create, deliver = asyncio.run(run_router_row(made, args.keys, events, args.batch))
            creates[stores].append(create)
            deliveries[stores].append(deliver)
    one, three = (statistics.median(deliveries[k]) for k in (1, 3))
    new_one, new_three = (statistics.median(creates[k]) for k in (1, 3))
    ratio, new_ratio = three / one, new_three / new_one
    print(
        f"{database:<11} router K=1 {one * 1e6:6.0f} us/delivery   K=3 {three * 1e6:6.0f} "
        f"us/delivery   K=3/K=1 {fmt_ratio(ratio)}   at most {GOAL:.2f}x: "
        f"{verdict(ratio <= GOAL)}"
    )
    print(
        f"{database:<11} router K=1 {new_one * 1e6:6.0f} us/create     K=3 "
        f"{new_three * 1e6:6.0f} us/create     K=3/K=1 {fmt_ratio(new_ratio)}   (no goal)"
    )
    return {
        "k1_us_per_delivery": one * 1e6,
        "k3_us_per_delivery": three * 1e6,
        "k3_over_k1": ratio,
        "k1_us_per_create": new_one * 1e6,
        "k3_us_per_create": new_three * 1e6,
        "creates_k3_over_k1": new_ratio,
        "samples_us_per_delivery": {str(k): [s * 1e6 for s in v] for k, v in deliveries.items()},
        "samples_us_per_create": {str(k): [s * 1e6 for s in v] for k, v in creates.items()},
    }


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL URL")
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROWS,
        default=["steps", "router"],
        help="which rows (default: steps router; servers also with --servers)",
    )
    parser.add_argument(
        "--servers", action="store_true", help="also the separate servers' rows (starts servers)"
    )
    parser.add_argument("--executions", type=int, default=60, help="executions of a steps row")
    parser.add_argument("--steps", type=int, default=10, help="steps per execution and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=300, help="keys of a router row")
    parser.add_argument(
        "--events", type=int, help="events per key of a router row (default 5, quick 3)"
    )
    parser.add_argument("--batch", type=int, default=100, help="events per route_many call")
    parser.add_argument(
        "--duration", type=float, help="seconds per separate servers' run (default 10, quick 3)"
    )
    parser.add_argument("--clients", type=int, default=2, help="client processes (servers)")
    parser.add_argument("--lanes", type=int, default=4, help="route_many loops per client")
    parser.add_argument(
        "--server-rounds", type=int, help="runs per K over the servers (default 2, quick 1)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 rounds of 4 steps and 3 events per key; 3 s server runs, once per K",
    )
    add_json_option(parser)
    args = parser.parse_args()
    rounds, steps = (2, 4) if args.quick else (args.rounds, args.steps)
    events = args.events or (3 if args.quick else 5)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    server_rounds = args.server_rounds or (1 if args.quick else 2)
    rows = set(args.rows) | ({"servers"} if args.servers else set())
    if events < 2 or args.keys < 1 or args.batch < 1 or args.clients < 1 or args.lanes < 1:
        parser.error("need at least 2 events, 1 key, a batch of 1, 1 client and 1 lane")
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    results: dict[str, dict[str, Any]] = {}
    routed: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for database in databases:
            if "steps" in rows:
                results[database] = steps_rows(database, args, rounds, steps, Path(folder))
            if "router" in rows:
                routed[database] = router_rows(database, args, rounds, events, Path(folder))
    if "steps" in rows:
        print(f"{rounds} rounds, {args.executions} executions x {steps} steps each, medians")
    if "router" in rows:
        print(
            f"router: {rounds} rounds, {args.keys} keys x {events} events (1 create + "
            f"{events - 1} deliveries each), route_many batches of {args.batch}, medians"
        )
    servers: dict[str, Any] | None = None
    if "servers" in rows:
        servers = servers_rows(args, server_rounds)
    if args.json:
        fields: dict[str, Any] = {"machine": info, "rows": results, "goal": GOAL}
        fields["router"] = {"keys": args.keys, "events": events, "batch": args.batch}
        fields["router"].update(rounds=rounds, rows=routed)
        fields["servers"] = servers
        write_json(args.json, "shards", fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
