"""Benchmark: the cost of writing positions and events as bytes
(``statifier.core.positions.dump`` and ``dump_event``), per call, on the small position
and event a durable step of ``bench/persistence.py`` stores.

Run from the repository root::

    PYTHONPATH=src python3 bench/positions.py            # 15 repeats x 20,000 calls per row
    PYTHONPATH=src python3 bench/positions.py --quick    # 5 repeats x 5,000 calls
    PYTHONPATH=src python3 bench/positions.py --json out.json
    PYTHONPATH=src python3 bench/positions.py --beside ../before/src   # against another tree

Rows, each timed as the median over repeats of a repeat's time per call, the rows
taking turns in a rotating order so that drifting load hits them alike:

* ``dump``: the position of ``bench/persistence.py``'s chart after one step (a counter
  in the datamodel, nothing queued).
* ``dump, containers``: the same chart with a list and a map in the datamodel, and an
  event with data as the last event.
* ``dump_event``: the event ``next`` with no data (the common case: the stored input
  of a step).
* ``dump_event, data``: an event carrying a small map.
* ``encode, position``: ``json.JSONEncoder.encode`` with the settings positions use,
  prebuilt once, of the parsed ``dump`` bytes: the JSON encoding alone, for scale.

Every row checks its output against the bytes the first call gave (the bytes are
deterministic), and ``encode, position`` that it gives ``dump``'s bytes back.

``--beside SRC`` also loads ``SRC/statifier/core/positions.py`` (another checkout's
module, on this checkout's other modules) and times its ``dump`` and ``dump_event``
rows in the same turns, marked ``beside``, checking that they write the same bytes:
a change's cost measured in one process, which drifting load cannot tell apart.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import (
    add_gc_option,
    add_json_option,
    collector_paused,
    collector_state,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.core import Event, handle_event, initialize, positions

CHART = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="left">
  <datamodel><data id="count" expr="0"/></datamodel>
  <state id="left">
    <transition event="next" target="right"><assign location="count" expr="count + 1"/></transition>
  </state>
  <state id="right">
    <transition event="next" target="left"><assign location="count" expr="count + 1"/></transition>
  </state>
</scxml>
"""
"""The chart of ``bench/persistence.py``."""

CONTAINERS = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0"
       datamodel="predicator" initial="left">
  <datamodel>
    <data id="count" expr="0"/>
    <data id="items" expr="['a', 'b', 'c']"/>
    <data id="order" expr="{'id': 'o-17', 'total': 42, 'paid': false}"/>
  </datamodel>
  <state id="left">
    <transition event="next" target="right"><assign location="count" expr="count + 1"/></transition>
  </state>
  <state id="right"/>
</scxml>
"""


def _module_beside(src: Path) -> ModuleType:
    """``statifier.core.positions`` of the checkout whose sources are at ``src``."""
    spec = importlib.util.spec_from_file_location(
        "positions_beside", src / "statifier" / "core" / "positions.py"
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"no positions module under {src}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(beside: ModuleType | None) -> dict[str, Callable[[], bytes | str]]:
    machine = compile_chart(CHART)
    state, _ = initialize(machine)
    state, _ = handle_event(state, Event("next"))
    richer = compile_chart(CONTAINERS)
    other, _ = initialize(richer)
    other, _ = handle_event(other, Event("next", data={"amount": 5, "currency": "EUR"}))
    plain, with_data = Event("next"), Event("paid", data={"amount": 5, "currency": "EUR"})
    encoder = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    parsed = json.loads(positions.dump(state))
    calls: dict[str, tuple[str, object]] = {
        "dump": ("dump", state),
        "dump, containers": ("dump", other),
        "dump_event": ("dump_event", plain),
        "dump_event, data": ("dump_event", with_data),
    }
    rows: dict[str, Callable[[], bytes | str]] = {}
    for name, (function, argument) in calls.items():
        for suffix, module in [("", positions), *([(" beside", beside)] if beside else [])]:
            rows[name + suffix] = partial(getattr(module, function), argument)
    rows["encode, position"] = partial(encoder.encode, parsed)
    return rows


def measure(
    repeats: int, number: int, keep_gc: bool, beside: ModuleType | None = None
) -> dict[str, Any]:
    rows = _rows(beside)
    expected = {name: call() for name, call in rows.items()}
    problems = [
        f"{name}: the output changed between calls"
        for name, call in rows.items()
        if call() != expected[name]
    ]
    if str(expected["encode, position"]).encode() != expected["dump"]:
        problems.append("encode, position: not the bytes dump wrote")
    problems.extend(
        f"{name}: not the bytes this checkout writes"
        for name in rows
        if name.endswith(" beside") and expected[name] != expected[name.removesuffix(" beside")]
    )
    samples: dict[str, list[float]] = {name: [] for name in rows}
    names = list(rows)
    with collector_paused(keep_gc):
        for turn in range(repeats):
            for name in rotated(names, turn):
                call = rows[name]
                started = time.perf_counter()
                for _ in range(number):
                    call()
                samples[name].append((time.perf_counter() - started) / number * 1e6)
    return {
        "rows": [
            {
                "row": name,
                "bytes": len(expected[name]),
                "median_us": statistics.median(samples[name]),
                "min_us": min(samples[name]),
                "max_us": max(samples[name]),
            }
            for name in rows
        ],
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--quick", action="store_true", help="short run: 5 repeats x 5,000")
    parser.add_argument("--repeats", type=int, help="timed passes per row (default 15)")
    parser.add_argument("--number", type=int, help="calls per row and pass (default 20,000)")
    parser.add_argument(
        "--beside",
        metavar="SRC",
        type=Path,
        help="also time the positions module of the checkout whose sources are at SRC",
    )
    add_gc_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 15)
    number = args.number or (5_000 if args.quick else 20_000)
    info = machine_info(["statifier"])
    print(machine_summary(info))
    print(versions_line(info))
    print(f"{repeats} repeats x {number:,} calls per row; collector {collector_state(args.gc)}")
    print()
    beside = None if args.beside is None else _module_beside(args.beside)
    result = measure(repeats, number, args.gc, beside)
    print_table_header(f"{'row':<24} {'bytes':>6} {'median us':>10} {'min..max us':>14}")
    for row in result["rows"]:
        spread = f"{row['min_us']:.2f}..{row['max_us']:.2f}"
        print(f"{row['row']:<24} {row['bytes']:>6} {row['median_us']:>10.2f} {spread:>14}")
    for problem in result["problems"]:
        print(f"WARNING: {problem}", file=sys.stderr)
    if args.json is not None:
        write_json(
            args.json,
            "positions",
            {
                "machine": info,
                "repeats": repeats,
                "number": number,
                "beside": None if args.beside is None else str(args.beside),
                **result,
            },
        )
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
