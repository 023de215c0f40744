"""Benchmark: live sessions of ``statifier.session``: event throughput through a session
against the bare core, and many concurrent sessions holding timers.

Run from the repository root, with the project installed (``pip install -e .``; no
other engine is needed) or from a checkout::

    PYTHONPATH=src python3 bench/sessions.py            # full run (a minute or two)
    python bench/sessions.py --quick                    # short run: smaller counts, 1-3 repeats
    python bench/sessions.py --json out.json            # also write the numbers as JSON
    python bench/sessions.py --profile                  # cProfile of 10,000 timer sessions instead
    python bench/sessions.py --profile 2000 --scattered # ... of 2,000, timers scattered
    python bench/sessions.py --profile-events           # cProfile of the session throughput rows

``--sessions N`` changes the largest count of the many-sessions part (default 10,000),
``--crowd N`` the idle sessions of the crowded throughput row (0 leaves the row out),
``--real N`` the sessions of the real-clock part (0 leaves it out), ``--gc`` keeps the
garbage collector running while timing.

What it measures:

* Throughput, events per second on the reference chart of ``bench/statecharts.py``
  (its ``SCXML`` text is imported from there: a compound state beside a parallel one,
  the single event ``next`` running a 4-event cycle), all in the same run:

  * ``core``: the bare pure core, ``state, effects = handle_event(state, Event("next"))``
    threaded, as ``bench/statecharts.py`` drives it.
  * ``session, batch``: one ``Session`` on a ``System(VirtualClock())``; a turn queues
    its events with ``session.send(Event("next"))`` then awaits ``system.drain()``
    once (the session's task drains its queue, one macrostep per loop iteration).
  * ``session, one at a time``: ``send`` then ``await system.drain()`` for every event.
    The session is parked each time, so the event is stepped by ``drain()`` itself on
    the caller's turn (``System._turn_on_callers_turn``) rather than by waking its task
    and going round the event loop, as it was until 2026-12-01.
  * ``session, one at a time, N idle alongside``: the same, on a ``System`` that also
    holds N idle sessions of the same chart, started before the measured one. Not part
    of the goal; it shows what the number of sessions costs a single busy one.

  Within a repeat the rows take turns in chunks of 200 events (a multiple of the
  4-event cycle; a batch is one chunk) in a rotating order, so drifting machine load
  hits them alike; a row's figure is the median of its events per second across
  repeats. The overhead ratio is core events/s / session events/s (how many times
  longer an event takes through the session). Project goal: at most 2x.

* Many sessions on a virtual clock: a chart whose initial state's ``onentry`` sends
  ``tick`` with ``delayexpr="delay"`` and moves on ``tick`` to a final state. Session i
  (of N) is started with a datamodel value ``delay``, in one of two orders:
  ``in start order``, ``"<1000 + i>ms"``, so the timers fire in the order the sessions
  started (as they would with one timeout for everybody); ``scattered``,
  ``"<1000 + (i * 7919) % N>ms"``, the same delays in an order unrelated to the start
  order. For each order and several counts up to N (default 1,000, 2,500, 5,000,
  10,000; each on a fresh ``System(VirtualClock())``), the time to start them all
  (``await system.start(...)`` per session, then one ``asyncio.sleep(0)`` so that every
  new session task runs to its first wait), and the time for
  ``run_until_idle(max_timers=N)`` to fire every timer and let every session finish.
  Per-session and per-timer costs that grow with the count mean the work is worse than
  linear in the number of sessions.
  Checked: every session running in ``wait`` with N timers pending after the start;
  every session finished in ``done``, no timer pending, and the clock at the largest
  delay after the run.

* Memory per session, at the largest count, before anything else runs in the process:
  the growth of the resident set (``/proc/self/statm``; Linux only) across starting the
  sessions without ``tracemalloc``, then the growth of ``tracemalloc``'s traced memory
  across the same start on a fresh ``System`` (collector run before both readings),
  each divided by N, with the biggest traced growth by source file.

* Real timers: 1,000 sessions of the same chart on a ``System(RealClock())``, every
  delay ``50ms``, started in one burst (``start`` never yields, so the event loop gets
  control only once all are started); the wall time from the first start until every
  session has finished (``await session.wait()``), and its excess over the floor,
  the start burst plus the 50 ms delay. Checked: every session finished in ``done``.

The garbage collector is paused while a stretch is timed (as ``timeit`` does) unless
``--gc``. This is a measurement, not a test: it asserts nothing, and prints a warning
for any check that fails.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# bench/ is on sys.path when this file is run as a script: the shared scaffolding, and
# the reference chart of statecharts.py.
from harness import (
    RATE_COLUMNS,
    add_gc_option,
    add_json_option,
    add_profile_option,
    chunk_sizes,
    collector_paused,
    collector_state,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_profile,
    print_table_header,
    print_warnings,
    rate_cells,
    rate_stats,
    rotated,
    verdict,
    write_json,
)
from statecharts import CYCLE, EVENT, SCXML

Leaves = tuple[str, ...]

CORE = "core"
BATCH = "session, batch"
ONE = "session, one at a time"

TIMER_SCXML = """\
<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="wait">
  <datamodel><data id="delay"/></datamodel>
  <state id="wait">
    <onentry><send event="tick" delayexpr="delay"/></onentry>
    <transition event="tick" target="done"/>
  </state>
  <final id="done"/>
</scxml>
"""
WAITING: Leaves = ("wait",)
FINISHED: Leaves = ("done",)
BASE_DELAY_MS = 1000
STRIDE = 7919  # a prime: session i waits BASE_DELAY_MS + (i * STRIDE) % count ms
REAL_DELAY_MS = 50
REAL_TIMEOUT_S = 120.0

CHUNK = 200  # events per row turn within a repeat; a multiple of the 4-event cycle
WARMUP = 400
GOAL_RATIO = 2.0  # a session at most this many times the bare core's time per event


def chart_machine(source: str) -> Any:
    from statifier.chart import compile_chart

    return compile_chart(source)


IN_ORDER = "in start order"
SCATTERED = "scattered"
ORDERS = (IN_ORDER, SCATTERED)


def delays_for(count: int, order: str) -> list[int]:
    """Delays in ms for sessions 0..count-1: with ``IN_ORDER`` the timers fire in the
    order the sessions started (as with one timeout for every session), with
    ``SCATTERED`` in an order unrelated to it (a permutation when ``count`` is not a
    multiple of ``STRIDE``)."""
    if order == IN_ORDER:
        return [BASE_DELAY_MS + i for i in range(count)]
    return [BASE_DELAY_MS + (i * STRIDE) % count for i in range(count)]


# --- throughput -------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One way of running the reference chart."""

    name: str
    run: Callable[[int], Awaitable[None]]  # process this many `next` events (timed)
    leaves: Callable[[], Leaves]
    note: str = ""


def prepare_core(machine: Any) -> Row:
    from statifier.core import Event, handle_event, initialize

    state, _ = initialize(machine)
    current = [state]

    async def run(count: int) -> None:
        state = current[0]
        for _ in range(count):
            state, _effects = handle_event(state, Event(EVENT))
        current[0] = state

    return Row(CORE, run, lambda: current[0].leaf_configuration(), "handle_event threaded")


async def prepare_session(
    machine: Any, stack: AsyncExitStack, *, batch: bool, crowd: int = 0
) -> Row:
    from statifier.core import Event
    from statifier.session.clock import VirtualClock
    from statifier.session.live import System

    system = await stack.enter_async_context(System(VirtualClock()))
    for _ in range(crowd):
        await system.start(machine)
    session = await system.start(machine)
    await asyncio.sleep(0)  # every session task runs to its first wait
    await system.drain()
    send, drain = session.send, system.drain

    if batch:

        async def run(count: int) -> None:
            for _ in range(count):
                send(Event(EVENT))
            await drain()

        name, note = BATCH, "a turn's events sent, then one drain()"
    else:

        async def run(count: int) -> None:
            for _ in range(count):
                send(Event(EVENT))
                await drain()

        name, note = ONE, "send() then drain() per event"
        if crowd:
            name = f"{ONE}, {crowd:,} idle alongside"
            note += f"; {crowd:,} idle sessions started before it on the same System"
    return Row(name, run, lambda: session.configuration, note)


async def prepare_rows(machine: Any, stack: AsyncExitStack, crowd: int) -> list[Row]:
    rows = [
        prepare_core(machine),
        await prepare_session(machine, stack, batch=True),
        await prepare_session(machine, stack, batch=False),
    ]
    if crowd:
        rows.append(await prepare_session(machine, stack, batch=False, crowd=crowd))
    return rows


async def check_traces(machine: Any) -> list[str]:
    """Two cycles, one event at a time, on fresh rows (no crowd) against the cycle."""
    problems = []
    events = 2 * len(CYCLE)
    expected = [CYCLE[i % len(CYCLE)] for i in range(events + 1)]
    async with AsyncExitStack() as stack:
        for row in await prepare_rows(machine, stack, crowd=0):
            seen = [row.leaves()]
            for _ in range(events):
                await row.run(1)
                seen.append(row.leaves())
            if seen != expected:
                problems.append(f"{row.name}: trace {seen} is not the cycle {expected}")
    return problems


async def time_repeat(rows: Sequence[Row], number: int, keep_gc: bool) -> dict[str, float]:
    """One repeat: ``number`` events per row, in rotating chunks; events per second."""
    totals = {row.name: 0 for row in rows}
    clock = time.perf_counter_ns
    with collector_paused(keep_gc):
        for turn, size in enumerate(chunk_sizes(number, CHUNK)):
            for row in rotated(rows, turn):
                start = clock()
                await row.run(size)
                totals[row.name] += clock() - start
    return {name: number / (total / 1e9) for name, total in totals.items()}


async def measure_throughput(
    machine: Any, repeats: int, number: int, crowd: int, keep_gc: bool
) -> dict[str, Any]:
    problems = await check_traces(machine)
    async with AsyncExitStack() as stack:
        rows = await prepare_rows(machine, stack, crowd)
        for row in rows:
            await row.run(WARMUP)
        samples: dict[str, list[float]] = {row.name: [] for row in rows}
        for _ in range(repeats):
            for name, rate in (await time_repeat(rows, number, keep_gc)).items():
                samples[name].append(rate)
        done = WARMUP + repeats * number
        for row in rows:  # did the timed instances really run the cycle?
            want = CYCLE[done % len(CYCLE)]
            if row.leaves() != want:
                problems.append(
                    f"{row.name} ended the timed run in {row.leaves()}, not {want}, "
                    f"after {done} events"
                )
    core = statistics.median(samples[CORE])
    table = []
    for row in rows:
        rate = statistics.median(samples[row.name])
        table.append(
            {
                "row": row.name,
                "note": row.note,
                **rate_stats(samples[row.name]),
                # How many times longer an event takes than in the bare core (>1: slower).
                "overhead_vs_core": None if row.name == CORE else core / rate,
            }
        )
    return {
        "events_per_repeat": number,
        "warmup_events": WARMUP,
        "chunk": CHUNK,
        "crowd": crowd,
        "rows": table,
        "problems": problems,
    }


# --- many sessions on a virtual clock ---------------------------------------------------


async def start_timer_sessions(system: Any, machine: Any, delays: Sequence[int]) -> list[Any]:
    return [await system.start(machine, datamodel={"delay": f"{delay}ms"}) for delay in delays]


def check_started(system: Any, sessions: Sequence[Any], count: int, what: str) -> list[str]:
    problems = []
    if len(system.sessions) != count:
        problems.append(f"{what}: the system holds {len(system.sessions)} sessions, not {count}")
    waiting = sum(1 for s in sessions if s.running and s.configuration == WAITING)
    if waiting != count:
        problems.append(f"{what}: {waiting} of {count} sessions running in {WAITING}")
    pending = system.clock.pending() if hasattr(system.clock, "pending") else None
    if pending is not None and pending != count:
        problems.append(f"{what}: {pending} timers pending after the start, not {count}")
    return problems


def check_finished(sessions: Sequence[Any], count: int, what: str) -> list[str]:
    finished = sum(1 for s in sessions if not s.running and s.configuration == FINISHED)
    if finished != count:
        return [f"{what}: {finished} of {count} sessions finished in {FINISHED}"]
    return []


async def virtual_run(machine: Any, count: int, order: str, keep_gc: bool) -> dict[str, Any]:
    """Start ``count`` timer sessions on a virtual clock and run them to the end."""
    from statifier.session.clock import VirtualClock
    from statifier.session.live import System

    delays = delays_for(count, order)
    what = f"virtual clock, {count:,} sessions, timers {order}"
    clock = time.perf_counter
    virtual = VirtualClock()
    async with System(virtual) as system:
        with collector_paused(keep_gc):
            t0 = clock()
            sessions = await start_timer_sessions(system, machine, delays)
            t1 = clock()
            await asyncio.sleep(0)  # every session task runs to its first wait
            t2 = clock()
        problems = check_started(system, sessions, count, what)
        with collector_paused(keep_gc):
            t3 = clock()
            await system.run_until_idle(max_timers=count)
            t4 = clock()
        problems += check_finished(sessions, count, what)
        pending = virtual.pending()
        if pending:
            problems.append(f"{what}: {pending} timers still pending after run_until_idle")
        if virtual.now_ms() != max(delays):
            problems.append(f"{what}: the clock ended at {virtual.now_ms()} ms, not {max(delays)}")
    return {
        "sessions": count,
        "order": order,
        "start_calls_s": t1 - t0,
        "start_s": t2 - t0,  # the start() calls plus every task's first run
        "run_until_idle_s": t4 - t3,
        "virtual_ms_at_end": max(delays),
        "problems": problems,
    }


async def measure_virtual(
    machine: Any, counts: Sequence[int], repeats: int, keep_gc: bool
) -> dict[str, Any]:
    cases = [(order, count) for order in ORDERS for count in counts]
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in cases}
    problems: list[str] = []
    for repeat in range(repeats):
        for order, count in rotated(cases, repeat):
            result = await virtual_run(machine, count, order, keep_gc)
            problems += result.pop("problems")
            samples[order, count].append(result)
    rows = []
    for order, count in cases:
        runs = samples[order, count]
        start = statistics.median(r["start_s"] for r in runs)
        calls = statistics.median(r["start_calls_s"] for r in runs)
        run = statistics.median(r["run_until_idle_s"] for r in runs)
        rows.append(
            {
                "order": order,
                "sessions": count,
                "start_s": start,
                "start_calls_s": calls,
                "start_us_per_session": start / count * 1e6,
                "run_until_idle_s": run,
                "run_us_per_timer": run / count * 1e6,
                "virtual_ms_at_end": runs[0]["virtual_ms_at_end"],
                "samples": runs,
            }
        )
    for row in rows:  # per-session cost relative to the smallest count (1.0: linear)
        base = next(r for r in rows if r["order"] == row["order"])
        row["start_per_session_vs_smallest"] = (
            row["start_us_per_session"] / base["start_us_per_session"]
        )
        row["run_per_timer_vs_smallest"] = row["run_us_per_timer"] / base["run_us_per_timer"]
    return {"repeats": repeats, "rows": rows, "problems": problems}


# --- memory -----------------------------------------------------------------------------


def resident_bytes() -> int | None:
    """The current resident set size (Linux), or None."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return None
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


async def measure_memory(machine: Any, count: int, top: int = 8) -> dict[str, Any]:
    """Memory per started, parked timer session; run first, in a fresh process."""
    from statifier.session.clock import VirtualClock
    from statifier.session.live import System

    delays = delays_for(count, IN_ORDER)
    problems = []
    gc.collect()
    rss_before = resident_bytes()
    async with System(VirtualClock()) as system:
        sessions = await start_timer_sessions(system, machine, delays)
        await asyncio.sleep(0)
        gc.collect()
        rss_after = resident_bytes()
        problems += check_started(system, sessions, count, "memory (resident set)")
    del sessions, system

    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before_snapshot = tracemalloc.take_snapshot()
        before = tracemalloc.get_traced_memory()[0]
        async with System(VirtualClock()) as system:
            sessions = await start_timer_sessions(system, machine, delays)
            await asyncio.sleep(0)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            after_snapshot = tracemalloc.take_snapshot()
            problems += check_started(system, sessions, count, "memory (tracemalloc)")
    finally:
        tracemalloc.stop()
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = after_snapshot.filter_traces(ignore).compare_to(
        before_snapshot.filter_traces(ignore), "filename"
    )
    by_file = [
        {
            "file": _short_path(stat.traceback[0].filename),
            "bytes_per_session": stat.size_diff / count,
            "blocks_per_session": stat.count_diff / count,
        }
        for stat in sorted(stats, key=lambda s: s.size_diff, reverse=True)[:top]
    ]
    rss = None if rss_before is None or rss_after is None else rss_after - rss_before
    return {
        "sessions": count,
        "traced_bytes": after - before,
        "traced_bytes_per_session": (after - before) / count,
        "rss_bytes": rss,
        "rss_bytes_per_session": None if rss is None else rss / count,
        "traced_by_file": by_file,
        "problems": problems,
    }


def _short_path(filename: str) -> str:
    """A file name without this machine's directories: from ``statifier/`` or the
    standard library's ``asyncio/`` on, else the base name."""
    parts = Path(filename).parts
    for anchor in ("statifier", "asyncio"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor) - 1 :])
    return Path(filename).name


# --- real clock -------------------------------------------------------------------------


async def real_run(machine: Any, count: int, keep_gc: bool) -> dict[str, Any]:
    from statifier.session.clock import RealClock
    from statifier.session.live import System

    what = f"real clock, {count:,} sessions"
    clock = time.perf_counter
    finishes: list[float] = []
    problems: list[str] = []

    async def watch(session: Any) -> None:
        await session.wait()
        finishes.append(clock())

    async with System(RealClock()) as system:
        with collector_paused(keep_gc):
            t0 = clock()
            sessions = await start_timer_sessions(system, machine, [REAL_DELAY_MS] * count)
            t1 = clock()
            try:
                await asyncio.wait_for(
                    asyncio.gather(*(watch(s) for s in sessions)), REAL_TIMEOUT_S
                )
            except TimeoutError:
                problems.append(f"{what}: not all finished within {REAL_TIMEOUT_S:g} s")
            t2 = clock()
        problems += check_finished(sessions, count, what)
    floor = (t1 - t0) + REAL_DELAY_MS / 1000
    return {
        "sessions": count,
        "start_s": t1 - t0,
        "all_finished_s": t2 - t0,
        "floor_s": floor,
        "excess_s": (t2 - t0) - floor,
        "first_finish_s": (min(finishes) - t0) if finishes else None,
        "problems": problems,
    }


async def measure_real(machine: Any, count: int, repeats: int, keep_gc: bool) -> dict[str, Any]:
    runs = []
    problems: list[str] = []
    for _ in range(repeats):
        result = await real_run(machine, count, keep_gc)
        problems += result.pop("problems")
        runs.append(result)

    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in runs if r[key] is not None))

    return {
        "sessions": count,
        "delay_ms": REAL_DELAY_MS,
        "repeats": repeats,
        "start_s": median("start_s"),
        "all_finished_s": median("all_finished_s"),
        "floor_s": median("floor_s"),
        "excess_s": median("excess_s"),
        "first_finish_s": median("first_finish_s"),
        "samples": runs,
        "problems": problems,
    }


# --- profiling --------------------------------------------------------------------------


def profile(count: int, order: str, top: int = 15) -> None:
    """cProfile of starting ``count`` timer sessions and running them to the end."""
    machine = chart_machine(TIMER_SCXML)
    profiler = cProfile.Profile()
    result = profiler.runcall(asyncio.run, virtual_run(machine, count, order, keep_gc=False))
    print(
        f"cProfile: {count:,} timer sessions on a virtual clock (timers {order}), "
        "started and run to the end "
        f"(start {result['start_s']:.2f} s, run_until_idle {result['run_until_idle_s']:.2f} s "
        "under the profiler)"
    )
    print_warnings(result["problems"])
    print_profile(profiler, top)


def profile_events(events: int, top: int = 15) -> None:
    """cProfile of ``events`` events through each session row (no crowd)."""
    machine = chart_machine(SCXML)

    async def run() -> None:
        async with AsyncExitStack() as stack:
            rows = await prepare_rows(machine, stack, crowd=0)
            for row in rows:
                await row.run(WARMUP)
            profiler = cProfile.Profile()
            for row in rows:
                if row.name == CORE:
                    continue
                profiler.enable()
                for _ in range(events // CHUNK):
                    await row.run(CHUNK)
                profiler.disable()
            print(
                f"cProfile: {events:,} '{EVENT}' events through each of "
                f"{', '.join(r.name for r in rows if r.name != CORE)} (turns of {CHUNK})"
            )
            print_profile(profiler, top)

    asyncio.run(run())


# --- reporting --------------------------------------------------------------------------


def fmt_bytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def print_report(
    results: dict[str, Any], info: dict[str, Any], repeats: int, keep_gc: bool
) -> None:
    throughput = results["throughput"]
    print(
        f"sessions benchmark: garbage collector {collector_state(keep_gc)} while timing; "
        f"{machine_summary(info)}; statifier {info['versions']['statifier']}"
    )
    print()
    print(
        f"throughput on the reference chart: {repeats} repeats x "
        f"{throughput['events_per_repeat']} '{EVENT}' events per row, in turns of "
        f"{throughput['chunk']}"
    )
    print_table_header(f"{'row':<46} {RATE_COLUMNS} {'vs core':>8}")
    for row in throughput["rows"]:
        print(f"{row['row']:<46} {rate_cells(row)} {fmt_ratio(row['overhead_vs_core']):>8}")
    print("'vs core': core median events/s / row median events/s (time per event vs core).")
    for row in throughput["rows"]:
        print(f"note {row['row']}: {row['note']}")

    memory = results["memory"]
    print()
    print(
        f"memory per session, {memory['sessions']:,} started timer sessions: "
        f"tracemalloc {fmt_bytes(memory['traced_bytes_per_session'])} bytes, "
        f"resident set {fmt_bytes(memory['rss_bytes_per_session'])} bytes"
    )
    print("traced growth by file (bytes per session, blocks per session):")
    for entry in memory["traced_by_file"]:
        print(
            f"  {entry['file']:<40} {entry['bytes_per_session']:>8,.0f} "
            f"{entry['blocks_per_session']:>6.1f}"
        )

    virtual = results["virtual"]
    print()
    print(
        f"timer sessions on a virtual clock ({virtual['repeats']} repeat(s) per count, "
        "medians; 'x' = per-session cost / the same at the smallest count, 1.00x if linear):"
    )
    print_table_header(
        f"{'timers fire':<14} {'sessions':>8} {'start s':>8} {'us/session':>11} {'x':>6} "
        f"{'run_until_idle s':>17} {'us/timer':>9} {'x':>6} {'virtual end':>12}"
    )
    for row in virtual["rows"]:
        start = f"{row['start_s']:>8.3f} {row['start_us_per_session']:>11.1f}"
        start += f" {row['start_per_session_vs_smallest']:>5.2f}x"
        run = f"{row['run_until_idle_s']:>17.3f} {row['run_us_per_timer']:>9.1f}"
        run += f" {row['run_per_timer_vs_smallest']:>5.2f}x"
        print(
            f"{row['order']:<14} {row['sessions']:>8,} {start} {run} "
            f"{row['virtual_ms_at_end']:>9,} ms"
        )

    real = results["real"]
    if real is not None:
        print()
        print(
            f"real clock: {real['sessions']:,} sessions, every delay {real['delay_ms']} ms, "
            f"{real['repeats']} repeat(s), medians: start burst {real['start_s'] * 1000:.1f} ms, "
            f"first finished at {real['first_finish_s'] * 1000:.1f} ms, all finished at "
            f"{real['all_finished_s'] * 1000:.1f} ms (floor: burst + delay = "
            f"{real['floor_s'] * 1000:.1f} ms; excess {real['excess_s'] * 1000:.1f} ms)"
        )

    problems = (
        throughput["problems"]
        + memory["problems"]
        + virtual["problems"]
        + (real["problems"] if real else [])
    )
    print_warnings(problems)
    if not problems:
        print()
        print("checks: all passed (traces, final configurations, timers, clocks)")

    print()
    print("goals:")
    for row in throughput["rows"]:
        if row["row"] in (BATCH, ONE):
            ratio = row["overhead_vs_core"]
            print(
                f"  {row['row']}: at most {GOAL_RATIO:g}x the bare core's time per event: "
                f"{verdict(ratio <= GOAL_RATIO)} ({ratio:.2f}x)"
            )
        elif row["row"] != CORE:
            print(f"  (no goal) {row['row']}: {row['overhead_vs_core']:.2f}x the core")
    most = max(row["sessions"] for row in virtual["rows"])
    for row in virtual["rows"]:
        if row["sessions"] == most:
            print(
                f"  (no goal) {most:,} timer sessions, timers {row['order']}: start "
                f"{row['start_s']:.2f} s, all timers fired and sessions finished in "
                f"{row['run_until_idle_s']:.2f} s"
            )
    print(
        f"  (no goal) memory: {fmt_bytes(memory['traced_bytes_per_session'])} traced bytes "
        f"per session"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: smaller counts")
    parser.add_argument("--repeats", type=int, help="throughput passes (default 7, quick 3)")
    parser.add_argument("--number", type=int, help="events per row and pass (default 4000)")
    parser.add_argument(
        "--sessions", type=int, help="largest count of timer sessions (default 10,000)"
    )
    parser.add_argument(
        "--crowd", type=int, help="idle sessions beside the crowded row (default 10,000; 0: none)"
    )
    parser.add_argument(
        "--real", type=int, help="sessions on the real clock (default 1,000; 0: skip)"
    )
    add_gc_option(parser)
    add_profile_option(
        parser,
        "--profile-events",
        default=20_000,
        metavar="EVENTS",
        help_text="instead of timing, print a cProfile of the session throughput rows "
        "(default 20,000 events each)",
    )
    parser.add_argument(
        "--scattered",
        action="store_true",
        help="with --profile: timers scattered (default: in start order)",
    )
    add_json_option(parser)
    add_profile_option(
        parser,
        "--profile",
        default=10_000,
        metavar="SESSIONS",
        help_text="instead of timing, print a cProfile of the timer sessions (default 10,000)",
    )
    args = parser.parse_args(argv)
    if args.profile_events is not None:
        if args.profile_events < CHUNK:
            parser.error(f"--profile-events must be at least {CHUNK}")
        profile_events(args.profile_events)
        return 0
    if args.profile is not None:
        if args.profile < 1:
            parser.error("--profile must be positive")
        profile(args.profile, SCATTERED if args.scattered else IN_ORDER)
        return 0
    quick = args.quick
    repeats = args.repeats or (3 if quick else 7)
    number = args.number or (800 if quick else 4000)
    largest = args.sessions or (1000 if quick else 10_000)
    crowd = args.crowd if args.crowd is not None else (1000 if quick else 10_000)
    real_count = args.real if args.real is not None else (200 if quick else 1000)
    session_repeats = 1 if quick else 3
    if min(repeats, number, largest) < 1 or crowd < 0 or real_count < 0:
        parser.error(
            "--repeats, --number and --sessions must be positive, --crowd and --real not negative"
        )
    counts = sorted({c for c in (largest // 10, largest // 4, largest // 2) if c} | {largest})

    info = machine_info(("statifier",))
    reference = chart_machine(SCXML)
    timer = chart_machine(TIMER_SCXML)

    async def run_all() -> dict[str, Any]:
        memory = await measure_memory(timer, largest)  # first: a fresh process's heap
        throughput = await measure_throughput(reference, repeats, number, crowd, args.gc)
        virtual = await measure_virtual(timer, counts, session_repeats, args.gc)
        real = (
            await measure_real(timer, real_count, session_repeats, args.gc) if real_count else None
        )
        return {"throughput": throughput, "memory": memory, "virtual": virtual, "real": real}

    results = asyncio.run(run_all())
    print_report(results, info, repeats, args.gc)
    if args.json:
        document = {
            "repeats": repeats,
            "number": number,
            "session_repeats": session_repeats,
            "garbage_collector": collector_state(args.gc),
            "machine": info,
            "charts": {"reference_scxml": SCXML, "timer_scxml": TIMER_SCXML, "cycle": CYCLE},
            "goals": {"session_vs_core_at_most": GOAL_RATIO},
            **results,
        }
        write_json(args.json, "sessions", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
