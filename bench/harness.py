"""Scaffolding shared by the benchmark scripts in ``bench/``: the machine summary, pausing
the garbage collector, turn-taking and median helpers, common command line options, and
table, goal and JSON output. The benchmarks themselves (what is run, timed and checked)
stay in each script.

The scripts import this module by name (``from harness import ...``): run as scripts,
their own directory, ``bench/``, is first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import statistics
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# --- the database ---------------------------------------------------------------------


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and all it holds from the PostgreSQL database at ``url``, if it
    is there: the rows a benchmark made in a schema of its own."""
    # Imported here: a benchmark that replays in other processes has this module
    # imported again in each (spawn), and they need neither.
    import sqlalchemy as sa

    from statifier.sql.engines import database_url

    engine = sa.create_engine(database_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(sa.schema.DropSchema(schema, cascade=True, if_exists=True))
    finally:
        engine.dispose()


# --- the machine ------------------------------------------------------------------------


def machine_info(distributions: Sequence[str], *, load_average: bool = True) -> dict[str, Any]:
    """The machine and the versions of ``distributions``, for the report and the JSON.

    Keys, in this order: ``python``, ``implementation``, ``cpus``, ``cpu`` (the first
    ``model name`` of ``/proc/cpuinfo``, else what ``platform`` knows), ``platform``,
    ``load_average_at_start`` (only with ``load_average``; None where the system has
    none), and ``versions``: every distribution's installed version, or None when it is
    not installed. ``statifier``, when listed but not installed (run from the source
    tree via ``PYTHONPATH=src``), is ``"<its __version__> (source tree)"`` if importable.
    """
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for dist in distributions:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    if "statifier" in versions and versions["statifier"] is None:
        try:
            import statifier

            versions["statifier"] = f"{statifier.__version__} (source tree)"
        except ImportError:
            pass
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
    }
    if load_average:
        try:
            info["load_average_at_start"] = list(os.getloadavg())
        except OSError:
            info["load_average_at_start"] = None
    info["versions"] = versions
    return info


def machine_summary(info: Mapping[str, Any]) -> str:
    """``"Python <version> on <n> CPU(s), <cpu>"`` from a ``machine_info`` result."""
    return f"Python {info['python']} on {info['cpus']} CPU(s), {info['cpu']}"


def versions_line(info: Mapping[str, Any]) -> str:
    """``"versions: <dist> <version>, ..."`` from a ``machine_info`` result; a
    distribution without a version reads ``not installed``."""
    versions = info["versions"].items()
    return "versions: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in versions)


# --- timing -----------------------------------------------------------------------------


@contextmanager
def collector_paused(keep_gc: bool) -> Iterator[None]:
    """Pause the garbage collector for a timed stretch, as ``timeit`` does, unless
    ``keep_gc``; either way start from a collected heap. The collector is enabled again
    on leaving, also on an exception."""
    gc.collect()
    if keep_gc:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def collector_state(keep_gc: bool) -> str:
    """How the collector is while timing, as reports and JSON say it: ``running`` or
    ``paused``."""
    return "running" if keep_gc else "paused"


def chunk_sizes(total: int, chunk: int) -> list[int]:
    """``total`` split into turns of ``chunk`` (positive), the remainder, if any, last."""
    return [chunk] * (total // chunk) + ([total % chunk] if total % chunk else [])


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """``items`` (not empty) starting at position ``turn`` modulo their number, wrapping
    around: turn ``k`` of a rotating order, so that no item always runs first."""
    shift = turn % len(items)
    return [*items[shift:], *items[:shift]]


def rate_stats(samples: Sequence[float]) -> dict[str, Any]:
    """The summary of per-repeat rates in events per second (``samples``, not empty, all
    positive): ``median_events_per_s``, ``median_us_per_event`` (the median of each
    sample's time per event), ``min_events_per_s``, ``max_events_per_s`` and the samples
    themselves as ``samples_events_per_s``, in this order."""
    return {
        "median_events_per_s": statistics.median(samples),
        "median_us_per_event": statistics.median(1e6 / r for r in samples),
        "min_events_per_s": min(samples),
        "max_events_per_s": max(samples),
        "samples_events_per_s": samples,
    }


# --- command line -----------------------------------------------------------------------


def new_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc`` (the script's docstring)."""
    return argparse.ArgumentParser(description=doc.split("\n\n", 1)[0])


def add_gc_option(parser: argparse.ArgumentParser) -> None:
    """``--gc`` (``args.gc``, a bool): keep the collector running while timing."""
    parser.add_argument(
        "--gc",
        action="store_true",
        help="keep the garbage collector running while timing (default: paused, as timeit)",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json PATH`` (``args.json``, a ``Path`` or None): also write the numbers there
    (see ``write_json``)."""
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the numbers here")


def add_profile_option(
    parser: argparse.ArgumentParser, flag: str, *, default: int, metavar: str, help_text: str
) -> None:
    """``flag [N]``: an optional count, ``default`` when the flag is given alone, None
    when it is absent; the caller checks its range."""
    parser.add_argument(flag, nargs="?", const=default, type=int, metavar=metavar, help=help_text)


# --- output -----------------------------------------------------------------------------


def fmt_ratio(value: float | None) -> str:
    """``"1.23x"``, or an empty string for None."""
    return "" if value is None else f"{value:.2f}x"


def verdict(met: bool) -> str:
    """A goal's verdict: ``met`` or ``NOT met``."""
    return "met" if met else "NOT met"


def print_table_header(header: str) -> None:
    """Print a table's header line and a rule of dashes as long as it."""
    print(header)
    print("-" * len(header))


RATE_COLUMNS = f"{'median events/s':>16} {'us/event':>9} {'min..max events/s':>20}"


def rate_cells(row: Mapping[str, Any]) -> str:
    """The cells under ``RATE_COLUMNS`` for a row holding ``rate_stats`` keys."""
    spread = f"{row['min_events_per_s']:,.0f}..{row['max_events_per_s']:,.0f}"
    return f"{row['median_events_per_s']:>16,.0f} {row['median_us_per_event']:>9.1f} {spread:>20}"


def print_warnings(problems: Iterable[str]) -> None:
    """Print each problem to stderr as ``WARNING: <problem>``."""
    for problem in problems:
        print(f"WARNING: {problem}", file=sys.stderr)


def print_profile(profiler: cProfile.Profile, top: int) -> None:
    """Print the ``top`` functions of ``profiler`` by own time, directories stripped."""
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)


def write_json(path: Path, benchmark: str, fields: Mapping[str, Any]) -> None:
    """Write ``{"benchmark", "date" (today, UTC), "command", **fields}`` to ``path`` as
    indented JSON (values JSON cannot hold as their ``repr``) and say so on stdout."""
    document = {
        "benchmark": benchmark,
        "date": datetime.now(UTC).date().isoformat(),
        "command": " ".join(["python", *sys.argv]),
        **fields,
    }
    path.write_text(json.dumps(document, indent=2, default=repr) + "\n")
    print(f"\nwrote {path}")
