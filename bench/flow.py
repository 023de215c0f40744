"""Benchmark: a debounced binding (``mode = "debounce"``) against the same binding with
``mode = "each"``, on SQLite and PostgreSQL: the execution steps the same keyed events
cost, and the incoming events per second the router takes, flushes included.

Run from the repository root, with the project installed (``pip install -e '.[postgres]'``)
or from a checkout::

    PYTHONPATH=bench:src python bench/flow.py             # both databases
    python bench/flow.py --quick                          # short run
    python bench/flow.py --only sqlite                    # one database
    python bench/flow.py --url postgresql://...           # another PostgreSQL
    python bench/flow.py --json out.json                  # also write the numbers
    python bench/flow.py --profile sqlite                 # cProfile of the debounce path

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the rows work in a schema of their own,
dropped at the end. SQLite is a file in a temporary directory.

The workload, per row: 1,000 keys (``--keys``) x 10 events each (``--events``), 10,000
incoming events, interleaved round-robin over the keys (every key's first event, then
every key's second, ...), as a stream consumer sees a thousand busy keys. Each event
carries ``{"key", "count": 1}``; the binding passes ``count`` on and the chart, one
state whose self-transition on ``tick`` adds ``_event.data.count`` to a datamodel
counter, so ends at 10 for every key in both modes (checked on a sample of keys). The
first event of a key creates its execution (``create`` = ``if_absent``).

The events run on a virtual clock given to the router as ``now``: one every 0.1 ms (a
key's events 100 ms apart), so under a debounce window of 1 s (``PT1S``) every key's
ten events coalesce into one delivery, whatever the machine's speed.

Rows, per database (one consumer, one call at a time):

* ``each``, the anchor: the binding with ``mode = "each"``; every event is a step.
* ``debounce``: the same binding with ``mode = "debounce"``, ``window`` ``PT1S``; every
  event is held (answered ``buffered``), then ``FlowWorker(router).flush_due(now=...)``
  at a ``now`` one window after the last event delivers every key's group: one step a
  key, its event ``count`` 10. The flush's wall time is part of the row's time.

Both modes run through ``Router.route_many`` in batches of ``--batch`` (100) events, one
transaction a batch, the batch's ``now`` its last event's, and through ``Router.route``
one event at a time, one transaction an event (``--no-route`` leaves these out).

Reported per row: the routing time, the flush time, incoming events per second
(10,000 / (routing + flush)), this process's CPU time, and the execution steps: rows of
the input log of the row's executions, counted after the row. Every outcome is checked
(``created_and_delivered`` or ``delivered`` for ``each``, ``buffered`` for
``debounce``, every group flushed with all its events). Rows take turns (``--rounds``,
in a rotating order, each round on keys of its own); rates are the median over rounds,
and the ratio of rates is also given within each round. Every transaction commits
durably (SQLite ``synchronous`` FULL in WAL, PostgreSQL ``synchronous_commit`` on).

Goals, on each database, for ``route_many()`` (the ``route()`` pair is judged the same
way): the execution steps fall by at least 5x (steps of ``each`` / steps of
``debounce``), and the incoming events per second stay at least 0.7x of ``each``'s
(``debounce`` / ``each``).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_profile,
    print_table_header,
    rotated,
    verdict,
    versions_line,
    write_json,
)

from statifier.chart import Machine, compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Failed,
    FlowWorker,
    InboundEvent,
    Mode,
    Router,
    RouterConfig,
    StaticResolver,
    address,
)
from statifier.sql import TableOptions, migrations

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="counting">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="counting">
    <transition event="tick" target="counting">
      <assign location="count" expr="count + _event.data.count"/>
    </transition>
  </state>
</scxml>
"""
DOCUMENT = "counter"
SOURCE = "bench"
WINDOW = timedelta(seconds=1)
GAP = timedelta(microseconds=100)
"""The virtual time between two incoming events."""
STEPS_GOAL = 5.0
RATE_GOAL = 0.7
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
MODES = ("each", "debounce")
CALLS = ("route_many()", "route()")
CHECKED_KEYS = 50
"""Keys whose execution's counter is read back after a row (spread over the keys)."""


def _binding(mode: str) -> Binding:
    return Binding(
        id=f"ticks_{mode}",
        source=SOURCE,
        match="true",
        key="event.key",
        document=DOCUMENT,
        event="tick",
        data=("count",),
        mode=Mode(mode),
        window=None if mode == "each" else WINDOW,
    )


@dataclass(frozen=True)
class Workload:
    keys: int
    events: int
    batch: int


@dataclass
class Measured:
    """One pass of the workload through one row."""

    routing_s: float
    flush_s: float
    cpu_s: float
    steps: int

    @property
    def total_s(self) -> float:
        return self.routing_s + self.flush_s


class Bench:
    """The two routers (one binding each) over one database, and a virtual clock that
    only moves forward across the run."""

    def __init__(self, url: str, options: TableOptions, machine: Machine) -> None:
        self.url = url
        self.options = options
        self.machine = machine
        self.adapter = SqlAdapter(url, options)
        resolver = StaticResolver({DOCUMENT: machine})
        self.routers = {
            mode: Router(RouterConfig(self.adapter, bindings=[_binding(mode)], resolver=resolver))
            for mode in MODES
        }
        self.workers = {mode: FlowWorker(router) for mode, router in self.routers.items()}
        self.clock = datetime.now(UTC).replace(microsecond=0)
        self.engine = sa.create_engine(migrations.sync_url(url))
        schema = f"{options.schema}." if options.schema else ""
        inputs, addresses = (f"{schema}{options.name(name)}" for name in ("inputs", "addresses"))
        self.count_steps = sa.text(
            f"SELECT count(*) FROM {inputs} AS i JOIN {addresses} AS a "
            "ON a.execution_id = i.execution_id WHERE a.scope = :scope AND a.document = :document"
        )

    def events(self, scope: str, work: Workload) -> tuple[list[InboundEvent], list[datetime]]:
        """The workload's incoming events in arrival order, and their virtual times."""
        names = [f"k{index:05}" for index in range(work.keys)]
        events = [
            InboundEvent(
                scope=scope,
                source=SOURCE,
                message_id=f"{scope}:{key}:{turn}",
                data={"key": key, "count": 1},
            )
            for turn in range(work.events)
            for key in names
        ]
        start = self.clock
        times = [start + GAP * index for index in range(len(events))]
        # The next pass starts well after this one's flush.
        self.clock = times[-1] + WINDOW + timedelta(minutes=1)
        return events, times

    async def run(self, mode: str, call: str, scope: str, work: Workload) -> Measured:
        """The whole workload through one row, timed, then checked."""
        router = self.routers[mode]
        events, times = self.events(scope, work)
        outcomes: Counter[str] = Counter()
        cpu = time.process_time()
        started = time.perf_counter()
        if call == "route_many()":
            for first in range(0, len(events), work.batch):
                part = events[first : first + work.batch]
                answers = await router.route_many(part, now=times[first + len(part) - 1])
                for answer in answers:
                    if isinstance(answer, Failed):
                        raise answer.error
                    outcomes.update(outcome.outcome for outcome in answer.outcomes)
        else:
            for event, moment in zip(events, times, strict=True):
                routed = await router.route(event, now=moment)
                outcomes.update(outcome.outcome for outcome in routed.outcomes)
        routed_at = time.perf_counter()
        flushed = []
        if mode == "debounce":
            flushed = await self.workers[mode].flush_due(now=times[-1] + WINDOW)
        ended = time.perf_counter()
        cpu = time.process_time() - cpu
        self._check(mode, scope, work, outcomes, [(r.delivered, r.error) for r in flushed])
        await self._check_counters(mode, scope, work)
        steps = self._steps(scope)
        return Measured(routed_at - started, ended - routed_at, cpu, steps)

    def _check(
        self,
        mode: str,
        scope: str,
        work: Workload,
        outcomes: Counter[str],
        flushed: list[tuple[int, str | None]],
    ) -> None:
        keys, events = work.keys, work.events
        if mode == "each":
            expected = Counter({"created_and_delivered": keys, "delivered": keys * (events - 1)})
            flushes: Counter[tuple[int, str | None]] = Counter()
        else:
            expected = Counter({"buffered": keys * events})
            flushes = Counter({(events, None): keys})
        if outcomes != expected:
            raise RuntimeError(f"{scope}: outcomes {dict(outcomes)}, expected {dict(expected)}")
        if Counter(flushed) != flushes:
            raise RuntimeError(f"{scope}: flushes {Counter(flushed)}, expected {flushes}")

    async def _check_counters(self, mode: str, scope: str, work: Workload) -> None:
        router = self.routers[mode]
        storage = router.storage
        step = max(1, work.keys // CHECKED_KEYS)
        for index in range(0, work.keys, step):
            found = await address(router, scope, DOCUMENT, f"k{index:05}")
            if found is None:
                raise RuntimeError(f"{scope}: key k{index:05} has no execution")
            record = await storage.fetch_execution(found.execution_id)
            count = storage.load(record, self.machine).datamodel["count"]
            if count != work.events:
                raise RuntimeError(f"{scope}: key k{index:05} counted {count}")
        if mode == "debounce" and await self.workers[mode].totals() != (0, 0):
            raise RuntimeError(f"{scope}: events still held after the flush")

    def _steps(self, scope: str) -> int:
        with self.engine.connect() as connection:
            found = connection.execute(self.count_steps, {"scope": scope, "document": DOCUMENT})
            return int(found.scalar_one())

    async def close(self) -> None:
        await self.adapter.close()
        self.engine.dispose()


def _rows(with_route: bool) -> list[tuple[str, str]]:
    calls = CALLS if with_route else CALLS[:1]
    return [(mode, call) for call in calls for mode in MODES]


def _label(mode: str, call: str) -> str:
    return f"{mode} {call}"


async def _database_rows(
    url: str, options: TableOptions, work: Workload, rounds: int, with_route: bool, keep_gc: bool
) -> dict[str, Any]:
    bench = Bench(url, options, compile_chart(CHART))
    rows = _rows(with_route)
    measured: dict[str, list[Measured]] = {_label(*row): [] for row in rows}
    try:
        for index, (mode, call) in enumerate(rows):  # connections, statements, caches
            await bench.run(mode, call, f"warm{index}", Workload(16, 2, 8))
        with collector_paused(keep_gc):
            for turn in range(rounds):
                for mode, call in rotated(rows, turn):
                    label = _label(mode, call)
                    scope = f"r{turn}-{mode}-{CALLS.index(call)}"
                    measured[label].append(await bench.run(mode, call, scope, work))
    finally:
        await bench.close()
    incoming = work.keys * work.events
    result: dict[str, Any] = {}
    for label, samples in measured.items():
        rates = [incoming / sample.total_s for sample in samples]
        steps = {sample.steps for sample in samples}
        if len(steps) != 1:
            raise RuntimeError(f"{label}: steps differ between rounds: {sorted(steps)}")
        result[label] = {
            "events_per_s": statistics.median(rates),
            "routing_s": statistics.median(sample.routing_s for sample in samples),
            "flush_s": statistics.median(sample.flush_s for sample in samples),
            "cpu_s": statistics.median(sample.cpu_s for sample in samples),
            "steps": steps.pop(),
            "samples_events_per_s": rates,
        }
    for call in CALLS if with_route else CALLS[:1]:
        each, debounce = result[_label("each", call)], result[_label("debounce", call)]
        result[f"ratios {call}"] = {
            "steps_each_vs_debounce": each["steps"] / debounce["steps"],
            "rate_debounce_vs_each": debounce["events_per_s"] / each["events_per_s"],
            # The same ratio within each round (the rows of a round run back to back).
            "rate_by_round": [
                ours / theirs
                for ours, theirs in zip(
                    debounce["samples_events_per_s"], each["samples_events_per_s"], strict=True
                )
            ],
        }
    return result


# --- running ----------------------------------------------------------------------------


def _prepare(name: str, postgres_url: str, directory: str) -> tuple[str, TableOptions]:
    if name == "sqlite":
        url = f"sqlite:///{os.path.join(directory, 'flow.db')}"
        options = TableOptions(prefix="bench_")
    else:
        url = postgres_url
        options = TableOptions(
            prefix="bench_", schema=f"statifier_flow_bench_{uuid.uuid4().hex[:8]}"
        )
    migrations.upgrade(url, options)
    return url, options


def _drop(name: str, url: str, options: TableOptions) -> None:
    if name == "postgresql" and options.schema is not None:
        drop_schema(url, options.schema)


def _profile(name: str, postgres_url: str, work: Workload, top: int = 40) -> None:
    """Print a cProfile of the debounce ``route_many()`` row: routing and flush."""
    with tempfile.TemporaryDirectory() as directory:
        url, options = _prepare(name, postgres_url, directory)

        async def run() -> None:
            bench = Bench(url, options, compile_chart(CHART))
            try:
                await bench.run("debounce", "route_many()", "warm", Workload(16, 2, 8))
                profiler = cProfile.Profile()
                profiler.enable()
                measured = await bench.run("debounce", "route_many()", "profiled", work)
                profiler.disable()
            finally:
                await bench.close()
            print(
                f"debounce route_many() on {name} (profiled, checks included): routing "
                f"{measured.routing_s:.2f} s, flush {measured.flush_s:.2f} s\n"
            )
            print_profile(profiler, top)

        try:
            asyncio.run(run())
        finally:
            _drop(name, url, options)


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--quick", action="store_true", help="short run: 200 keys, one round")
    parser.add_argument("--keys", type=int, help="keys per row (default 1000, quick 200)")
    parser.add_argument("--events", type=int, default=10, help="events per key (default 10)")
    parser.add_argument("--batch", type=int, default=100, help="events per route_many call")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 3, quick 1)")
    parser.add_argument("--no-route", action="store_true", help="leave the route() rows out")
    parser.add_argument("--only", choices=("sqlite", "postgresql"), help="one database")
    parser.add_argument("--url", help="the PostgreSQL URL")
    parser.add_argument(
        "--profile",
        choices=("sqlite", "postgresql"),
        help="cProfile the debounce route_many() row (routing and flush) instead",
    )
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    keys = args.keys or (200 if args.quick else 1000)
    rounds = args.rounds or (1 if args.quick else 3)
    if keys < 1 or args.events < 2 or args.batch < 1 or rounds < 1:
        parser.error("need at least 1 key, 2 events, a batch of 1 and 1 round")
    work = Workload(keys, args.events, args.batch)
    postgres_url = args.url or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES
    if args.profile:
        _profile(args.profile, postgres_url, work)
        return 0
    with_route = not args.no_route
    started = time.monotonic()
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    print(
        f"{keys} keys x {args.events} events = {keys * args.events} incoming events per row "
        f"and round, round-robin over the keys, one every {GAP.total_seconds() * 1e3:g} ms "
        f"virtual; debounce window {WINDOW.total_seconds():g} s; route_many batches of "
        f"{args.batch}; {rounds} round(s); collector {collector_state(args.gc)}\n"
    )
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    results: dict[str, Any] = {}
    for name in databases:
        with tempfile.TemporaryDirectory() as directory:
            url, options = _prepare(name, postgres_url, directory)
            try:
                results[name] = asyncio.run(
                    _database_rows(url, options, work, rounds, with_route, args.gc)
                )
            finally:
                _drop(name, url, options)
    header = (
        f"{'database':<11} {'row':<22} {'routing s':>9} {'flush s':>8} {'events/s':>9} "
        f"{'cpu s':>7} {'steps':>7} {'ratio':>7}  ratio of"
    )
    print_table_header(header)
    for name, result in results.items():
        for mode, call in _rows(with_route):
            row = result[_label(mode, call)]
            ratio: float | None = None
            of = ""
            if mode == "debounce":
                ratio = result[f"ratios {call}"]["rate_debounce_vs_each"]
                of = "events/s debounce / each"
            print(
                f"{name:<11} {_label(mode, call):<22} {row['routing_s']:>9.2f} "
                f"{row['flush_s']:>8.2f} {row['events_per_s']:>9,.0f} {row['cpu_s']:>7.2f} "
                f"{row['steps']:>7,} {fmt_ratio(ratio):>7}  {of}"
            )
    print()
    for name, result in results.items():
        for call in CALLS if with_route else CALLS[:1]:
            ratios = result[f"ratios {call}"]
            steps, rate = ratios["steps_each_vs_debounce"], ratios["rate_debounce_vs_each"]
            print(
                f"{name}, {call}: steps each / debounce {fmt_ratio(steps)} "
                f"(goal >= {STEPS_GOAL:g}x: {verdict(steps >= STEPS_GOAL)}); "
                f"events/s debounce / each {fmt_ratio(rate)} "
                f"(goal >= {RATE_GOAL:g}x: {verdict(rate >= RATE_GOAL)})"
            )
            if len(ratios["rate_by_round"]) > 1:
                spread = ", ".join(fmt_ratio(r) for r in ratios["rate_by_round"])
                print(f"  events/s debounce / each within each round: {spread}")
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(
            args.json,
            "flow",
            {
                "machine": info,
                "keys": keys,
                "events": args.events,
                "batch": args.batch,
                "rounds": rounds,
                "window_s": WINDOW.total_seconds(),
                "gap_s": GAP.total_seconds(),
                "collector": collector_state(args.gc),
                "results": results,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
