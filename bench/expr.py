"""Benchmark: evaluation speed of ``statifier.expr`` against a CPython floor and two CEL bindings.

Run from the repository root, with the project installed (``pip install -e '.[bench]'``)::

    python bench/expr.py                 # full run: 7 repeats x 5000 evaluations per engine
    python bench/expr.py --quick         # short run: 3 repeats x 1000 evaluations
    python bench/expr.py --json out.json # also write the numbers as JSON

or without installing: ``PYTHONPATH=src python3 bench/expr.py``.

What it measures: the time to *evaluate* an already compiled expression against one
event, in nanoseconds per evaluation. Compilation happens once, outside the timer.
Each evaluation gets a distinct, freshly decoded 6-field event dict (kind, id,
parcel_id, ts, source, weight), passed as the context ``{"event": event}``, so no
engine can cache on object identity; building that one-entry context dict is part
of every engine's timed loop (its cost is printed separately as "harness").

Engines, all timed in the same run; within each repeat they take turns in chunks of
250 evaluations (rotating order), so drifting machine load hits them alike:

* ``statifier``: ``compile_expression(source)`` once, ``.evaluate({"event": ev})``.
* ``cpython eval (floor)``: the equivalent Python expression compiled once with the
  builtin ``compile(..., "eval")`` and run with ``eval(code, globals, {"event": ev})``.
  Only this benchmark uses ``eval``, as the floor to measure against; the library
  never does.
* ``cel-expr-python`` (import ``cel_expr_python``, the CEL C++ runtime): an
  environment declaring ``event`` as ``map(string, dyn)`` with the strings extension,
  ``env.compile(source)`` once (type-checked), ``expr.eval(data=...).value()`` per
  event (``.value()`` turns the CEL result into a Python value, as the others return).
* ``common-expression-language`` (import ``cel``, the Rust cel crate): ``cel.compile``
  once, ``program.execute(context)`` per event. It has no native ``trim``; its opt-in
  ``cel.stdlib.trim`` (a Python callback) is registered through a ``cel.Context`` for
  the trim workload, and a second row shows the same workload without the trim.

Workloads:

* ``filter``: ``event.kind == "impression" and len(event.id) > 0``
* ``trim``:   ``trim(event.parcel_id::string)``

The figure per engine is the median across repeats of (its time in the repeat /
evaluations); the ratios are ratios of those medians.
Before timing, every engine's answers are checked against the CPython floor on a
sample; a mismatch prints a warning. The garbage collector is paused while a repeat
is timed (as ``timeit`` does). This is a measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

# bench/ is on sys.path when this file is run as a script.
from harness import (
    add_json_option,
    collector_paused,
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

Event = dict[str, Any]
Runner = Callable[[Sequence[Event]], None]
Single = Callable[[Event], object]

FLOOR = "cpython eval (floor)"
STATIFIER = "statifier"


@dataclass(frozen=True)
class Workload:
    name: str
    statifier: str
    python: str
    cel: str


WORKLOADS = (
    Workload(
        name="filter",
        statifier='event.kind == "impression" and len(event.id) > 0',
        python='event["kind"] == "impression" and len(event["id"]) > 0',
        cel='event.kind == "impression" && size(event.id) > 0',
    ),
    Workload(
        name="trim",
        statifier="trim(event.parcel_id::string)",
        python='str(event["parcel_id"]).strip()',
        cel="string(event.parcel_id).trim()",
    ),
)


@dataclass(frozen=True)
class Prepared:
    """A compiled expression, ready to run over a batch of events."""

    run: Runner  # evaluates every event in the batch (the timed part)
    one: Single  # evaluates one event and returns a plain Python value (for checks)
    source: str
    note: str = ""


class UnavailableError(Exception):
    """The engine could not be imported or cannot express the workload."""


# --- events -----------------------------------------------------------------------------

KINDS = ("impression", "impression", "click", "view", "conversion")
SOURCES = ("web", "ios", "android", "partner-feed")
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


def make_events(count: int, seed: int) -> list[Event]:
    """``count`` distinct event dicts; decoded from JSON so every object is fresh."""
    rng = random.Random(seed)
    raw = []
    for i in range(count):
        ident = "" if rng.random() < 0.1 else f"evt-{seed}-{i}-{rng.getrandbits(32):08x}"
        raw.append(
            {
                "kind": rng.choice(KINDS),
                "id": ident,
                "parcel_id": rng.randrange(1, 10**9),
                "ts": (EPOCH + timedelta(seconds=rng.randrange(10**7))).isoformat(),
                "source": rng.choice(SOURCES),
                "weight": round(rng.uniform(0.0, 10.0), 3),
            }
        )
    events: list[Event] = json.loads(json.dumps(raw))
    return events


# --- engines ----------------------------------------------------------------------------


def prepare_statifier(workload: Workload) -> Prepared:
    from statifier.expr import ParseError, compile_expression

    compiled = compile_expression(workload.statifier)
    if isinstance(compiled, ParseError):
        raise UnavailableError(f"statifier could not compile {workload.statifier!r}: {compiled}")
    evaluate = compiled.evaluate

    def run(events: Sequence[Event]) -> None:
        for ev in events:
            evaluate({"event": ev})

    return Prepared(run, lambda ev: evaluate({"event": ev}), workload.statifier)


def prepare_floor(workload: Workload) -> Prepared:
    code = compile(workload.python, "<bench>", "eval")
    env: dict[str, Any] = {"__builtins__": {"len": len, "str": str}}
    run_eval = eval

    def run(events: Sequence[Event]) -> None:
        for ev in events:
            run_eval(code, env, {"event": ev})

    return Prepared(run, lambda ev: run_eval(code, env, {"event": ev}), workload.python)


def prepare_cel_cpp(workload: Workload) -> Prepared:
    try:
        from cel_expr_python import cel
        from cel_expr_python.ext.ext_strings import ExtStrings
    except ImportError as error:
        raise UnavailableError(f"not installed ({error}); pip install cel-expr-python") from error
    env = cel.NewEnv(
        variables={"event": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)},
        extensions=[ExtStrings()],
    )
    try:
        expression = env.compile(workload.cel)
    except Exception as error:  # the binding reports compile errors as RuntimeError
        raise UnavailableError(f"cannot compile {workload.cel!r}: {error}") from error
    evaluate = expression.eval

    def run(events: Sequence[Event]) -> None:
        for ev in events:
            evaluate(data={"event": ev}).value()

    return Prepared(
        run,
        lambda ev: evaluate(data={"event": ev}).value(),
        workload.cel,
        "trim from its strings extension (native)" if "trim" in workload.cel else "",
    )


def _import_cel_rust() -> Any:
    try:
        import cel
    except ImportError as error:
        raise UnavailableError(
            f"not installed ({error}); pip install common-expression-language"
        ) from error
    if not (hasattr(cel, "compile") and hasattr(cel, "Context")):
        raise UnavailableError("the importable `cel` module is not common-expression-language")
    return cel


def prepare_cel_rust(workload: Workload) -> Prepared:
    cel = _import_cel_rust()
    program = cel.compile(workload.cel)
    execute = program.execute
    if "trim" not in workload.cel:

        def run(events: Sequence[Event]) -> None:
            for ev in events:
                execute({"event": ev})

        return Prepared(run, lambda ev: execute({"event": ev}), workload.cel)

    # No native trim: register the library's own opt-in stdlib trim (a Python callback).
    from cel.stdlib import trim

    context = cel.Context
    functions = {"trim": trim}

    def run_with_trim(events: Sequence[Event]) -> None:
        for ev in events:
            execute(context({"event": ev}, functions))

    return Prepared(
        run_with_trim,
        lambda ev: execute(context({"event": ev}, functions)),
        workload.cel,
        "no native trim: uses the library's opt-in cel.stdlib.trim, a Python callback",
    )


def prepare_cel_rust_no_trim(workload: Workload) -> Prepared | None:
    """The trim workload without the trim, which this binding lacks natively."""
    if "trim" not in workload.cel:
        return None  # only meaningful for the trim workload
    cel = _import_cel_rust()
    source = "string(event.parcel_id)"
    execute = cel.compile(source).execute

    def run(events: Sequence[Event]) -> None:
        for ev in events:
            execute({"event": ev})

    return Prepared(
        run,
        lambda ev: execute({"event": ev}),
        source,
        "does less work than the others: string() only, no trim",
    )


ENGINES: tuple[tuple[str, Callable[[Workload], Prepared | None]], ...] = (
    (FLOOR, prepare_floor),
    (STATIFIER, prepare_statifier),
    ("cel-expr-python", prepare_cel_cpp),
    ("common-expression-language", prepare_cel_rust),
    ("common-expression-language (no trim)", prepare_cel_rust_no_trim),
)
CEL_ENGINES = tuple(name for name, _ in ENGINES if name.startswith(("cel-", "common-")))


def run_harness(events: Sequence[Event]) -> None:
    """The loop and the context dict alone: the overhead every engine's figure includes."""
    for ev in events:
        {"event": ev}  # noqa: B018


# --- measuring --------------------------------------------------------------------------


CHUNK = 250  # evaluations per engine turn within a repeat


def time_repeat(runners: dict[str, Runner], number: int, seed: int) -> dict[str, float]:
    """One repeat: ``number`` evaluations per engine, in nanoseconds per evaluation.

    Every engine gets its own freshly decoded events (same content for all). The
    engines take turns chunk by chunk, in a rotating order, so that load from the
    rest of the machine is spread over all of them alike instead of landing on
    whichever engine happened to be running.
    """
    names = list(runners)
    chunks = {}
    for name in names:
        events = make_events(number, seed)
        chunks[name] = [events[i : i + CHUNK] for i in range(0, number, CHUNK)]
    totals = dict.fromkeys(names, 0)
    clock = time.perf_counter_ns
    with collector_paused(keep_gc=False):
        for turn in range(len(chunks[names[0]])):
            for name in rotated(names, turn):
                run, batch = runners[name], chunks[name][turn]
                start = clock()
                run(batch)
                totals[name] += clock() - start
    return {name: total / number for name, total in totals.items()}


def check_answers(prepared: dict[str, Prepared], sample: Sequence[Event]) -> list[dict[str, Any]]:
    """Compare every engine with the floor on ``sample``; return the disagreements."""
    floor = prepared[FLOOR]
    expected = [floor.one(ev) for ev in sample]
    problems = []
    for name, engine in prepared.items():
        if name == FLOOR:
            continue
        wrong = 0
        first: dict[str, Any] | None = None
        for ev, want in zip(sample, expected, strict=True):
            try:
                got: object = engine.one(ev)
            except Exception as error:  # noqa: BLE001 - a crash is a wrong answer here
                got = error
            if type(got) is not type(want) or got != want:
                wrong += 1
                if first is None:
                    first = {"event": ev, "expected": repr(want), "got": repr(got)}
        if wrong:
            problems.append({"engine": name, "wrong": wrong, "of": len(sample), "first": first})
    return problems


def measure(workload: Workload, repeats: int, number: int) -> dict[str, Any]:
    prepared: dict[str, Prepared] = {}
    unavailable: dict[str, str] = {}
    for name, prepare in ENGINES:
        try:
            engine = prepare(workload)
        except UnavailableError as why:
            unavailable[name] = str(why)
            continue
        if engine is not None:
            prepared[name] = engine

    mismatches = check_answers(prepared, make_events(500, seed=10_000))

    runners: dict[str, Runner] = {"harness": run_harness}
    runners.update({name: engine.run for name, engine in prepared.items()})
    warmup = make_events(min(number, 500), seed=20_000)
    for run in runners.values():
        run(warmup)

    samples: dict[str, list[float]] = {name: [] for name in runners}
    for repeat in range(repeats):
        for name, ns in time_repeat(runners, number, seed=repeat).items():
            samples[name].append(ns)

    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor = medians.get(FLOOR)
    mine = medians.get(STATIFIER)
    harness = medians["harness"]
    rows = []
    for name in prepared:
        median = medians[name]
        rows.append(
            {
                "engine": name,
                "source": prepared[name].source,
                "note": prepared[name].note,
                "median_ns": median,
                "min_ns": min(samples[name]),
                "max_ns": max(samples[name]),
                "samples_ns": samples[name],
                "vs_floor": median / floor if floor else None,
                # The same with the shared harness cost taken out of both sides.
                "vs_floor_net": (
                    (median - harness) / (floor - harness) if floor and floor > harness else None
                ),
                # How many times faster statifier is than this engine (>1: statifier wins).
                "statifier_speedup": (median / mine if mine and name in CEL_ENGINES else None),
            }
        )
    return {
        "workload": workload.name,
        "harness_ns": medians["harness"],
        "rows": rows,
        "unavailable": unavailable,
        "mismatches": mismatches,
    }


# --- reporting --------------------------------------------------------------------------


DISTRIBUTIONS = ("statifier", "cel-expr-python", "common-expression-language")


def print_report(
    results: list[dict[str, Any]], info: dict[str, Any], repeats: int, number: int
) -> None:
    print(
        f"statifier.expr benchmark: {repeats} repeats x {number} evaluations per engine; "
        f"{machine_summary(info)}"
    )
    print(versions_line(info))
    print()
    print_table_header(
        f"{'workload':<9} {'engine':<37} {'median ns/eval':>15} {'vs floor':>9} "
        f"{'net':>7} {'statifier speedup':>18}"
    )
    for result in results:
        for row in result["rows"]:
            print(
                f"{result['workload']:<9} {row['engine']:<37} {row['median_ns']:>15,.0f} "
                f"{fmt_ratio(row['vs_floor']):>9} {fmt_ratio(row['vs_floor_net']):>7} "
                f"{fmt_ratio(row['statifier_speedup']):>18}"
            )
        print(
            f"{result['workload']:<9} {'(harness: loop + context dict)':<37} "
            f"{result['harness_ns']:>15,.0f}"
        )
        print()

    print("'vs floor': engine median / CPython eval median (lower is better).")
    print("'net': the same after subtracting the harness cost from both medians.")
    print("'statifier speedup': CEL engine median / statifier median (>1: statifier is faster).")
    for result in results:
        for row in result["rows"]:
            if row["note"]:
                print(f"note [{result['workload']}] {row['engine']}: {row['note']}")
        for name, why in result["unavailable"].items():
            print(f"unavailable [{result['workload']}] {name}: {why}")
        for problem in result["mismatches"]:
            print(
                f"WARNING [{result['workload']}] {problem['engine']} disagrees with the floor "
                f"on {problem['wrong']} of {problem['of']} sample events; "
                f"first: {problem['first']}",
                file=sys.stderr,
            )

    print()
    print("goals:")
    for result in results:
        rows = {row["engine"]: row for row in result["rows"]}
        mine = rows.get(STATIFIER)
        if mine is None:
            print(f"  [{result['workload']}] statifier unavailable")
            continue
        within = mine["vs_floor"] is not None and mine["vs_floor"] <= 3.0
        print(
            f"  [{result['workload']}] within 3x of the CPython floor: "
            f"{verdict(within)} ({mine['vs_floor']:.2f}x; "
            f"net of the harness {fmt_ratio(mine['vs_floor_net']) or 'n/a'})"
        )
        for name in CEL_ENGINES:
            if name in rows:
                speedup = rows[name]["statifier_speedup"]
                print(
                    f"  [{result['workload']}] faster than {name}: "
                    f"{verdict(speedup > 1.0)} ({speedup:.2f}x)"
                )
            elif name in result["unavailable"]:
                print(f"  [{result['workload']}] faster than {name}: not measured (unavailable)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="short run: 3 repeats x 1000")
    parser.add_argument("--repeats", type=int, help="timed passes per engine (default 7)")
    parser.add_argument("--number", type=int, help="evaluations per pass (default 5000)")
    add_json_option(parser)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    number = args.number or (1000 if args.quick else 5000)
    if repeats < 1 or number < 1:
        parser.error("--repeats and --number must be positive")

    info = machine_info(DISTRIBUTIONS, load_average=False)
    results = [measure(workload, repeats, number) for workload in WORKLOADS]
    print_report(results, info, repeats, number)
    if args.json:
        document = {
            "repeats": repeats,
            "number": number,
            "machine": info,
            "workloads": [
                {"name": w.name, "statifier": w.statifier, "python": w.python, "cel": w.cel}
                for w in WORKLOADS
            ],
            "results": results,
        }
        write_json(args.json, "expr", document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
