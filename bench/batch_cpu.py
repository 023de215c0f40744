"""Benchmark: the CPU one delivery of a ``route_many`` batch costs the calling process,
in all and by stage, on PostgreSQL.

Run from the repository root, with the project installed with ``postgres`` (or from a
checkout, ``PYTHONPATH=src``); run it against an older checkout's ``src`` to compare::

    python bench/batch_cpu.py                      # CPU per delivery, then by stage
    python bench/batch_cpu.py --url postgresql://...
    PYTHONPATH=../old/src python bench/batch_cpu.py   # the same on another commit

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the tables are migrated into a schema of
their own, dropped at the end.

The workload: the counter chart of ``bench/router.py`` (one self-transition that
counts), 250 keys whose executions are created first (untimed), then ``--batches``
(40) batches of 50 events, each batch 50 distinct keys, routed one batch after the
other by one caller: every delivery steps an existing execution. Reported:

* wall time and CPU time (``time.process_time``) per delivery, without a profiler
  (the median of ``--runs``, 3);
* the same run under ``cProfile``, the profiler's own time per delivery split by where
  it was spent: the interpreter (``statifier.core``, ``expr``, ``chart``), durable steps
  (``statifier.persistence``), the router, the statements (``statifier.sql``), the
  driver (psycopg), the event loop (``asyncio``, ``selectors``), ``json``, and the rest
  (builtins and C calls: the socket, ``sqlite3``, ``hashlib``...). A profiler inflates
  every call, so the stages are shares, not costs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import statistics
import time
import uuid
from collections import defaultdict

import sqlalchemy as sa

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, InboundEvent, Router, RouterConfig, StaticResolver
from statifier.sql import TableOptions, migrations

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""
BINDING = Binding(
    id="ticks", source="meter", match="true", key="event.k", document="counter", event="tick"
)
KEYS = 250
BATCH = 50
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
STAGES = (
    ("statifier/core", "interpreter"),
    ("statifier/expr", "interpreter"),
    ("statifier/chart", "interpreter"),
    ("statifier/persistence", "durable steps"),
    ("statifier/router", "router"),
    ("statifier/sql", "statements"),
    ("psycopg", "driver"),
    ("asyncio", "event loop"),
    ("selectors", "event loop"),
    ("json", "json"),
)


class Workload:
    """One router on a fresh schema, its keys' executions created, handing out
    batches of fresh messages."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.sent = 0

    async def batch(self, turn: int) -> None:
        """Route the ``turn``-th batch: 50 distinct keys, one event each."""
        start = (turn % (KEYS // BATCH)) * BATCH
        events = []
        for index in range(start, start + BATCH):
            self.sent += 1
            data = {"k": f"k{index}"}
            events.append(
                InboundEvent(scope="s", source="meter", message_id=f"m{self.sent}", data=data)
            )
        for answer in await self.router.route_many(events):
            if not hasattr(answer, "outcomes"):
                raise RuntimeError(f"a delivery failed: {answer!r}")


async def _timed(workload: Workload, batches: int, profile: cProfile.Profile | None) -> float:
    """Route ``batches`` batches; answer the CPU seconds they took."""
    gc.disable()
    try:
        started = time.process_time()
        if profile is not None:
            profile.enable()
        for turn in range(batches):
            await workload.batch(turn)
        if profile is not None:
            profile.disable()
        return time.process_time() - started
    finally:
        gc.enable()


def _stages(profile: cProfile.Profile) -> dict[str, float]:
    """The profiler's own time (seconds) by stage."""
    by_stage: dict[str, float] = defaultdict(float)
    stats = pstats.Stats(profile)
    for (file, _line, _name), (_cc, _nc, own, _cum, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        stage = next((name for part, name in STAGES if part in file), "the rest")
        by_stage[stage] += own
    return dict(by_stage)


async def main(url: str, batches: int, runs: int) -> None:
    options = TableOptions(schema=f"bench_{uuid.uuid4().hex[:8]}")
    migrations.upgrade(url, options)
    try:
        async with SqlAdapter(url, options) as adapter:
            resolver = StaticResolver({"counter": compile_chart(COUNTER)})
            router = Router(RouterConfig(adapter, bindings=[BINDING], resolver=resolver))
            workload = Workload(router)
            for turn in range(KEYS // BATCH):  # every key's execution, created untimed
                await workload.batch(turn)
            deliveries = batches * BATCH
            cpu = [await _timed(workload, batches, None) / deliveries for _ in range(runs)]
            wall_started = time.perf_counter()
            await _timed(workload, batches, None)
            wall = (time.perf_counter() - wall_started) / deliveries
            print(
                f"{deliveries} deliveries per run in batches of {BATCH}: CPU "
                f"{statistics.median(cpu) * 1e6:.0f} us per delivery (median of {runs}), "
                f"wall {wall * 1e6:.0f} us"
            )
            profile = cProfile.Profile()
            await _timed(workload, batches, profile)
            stages = _stages(profile)
            total = sum(stages.values())
            print("under cProfile, its own time by stage:")
            for stage, seconds in sorted(stages.items(), key=lambda item: -item[1]):
                share = seconds / total
                print(f"  {stage:15s} {seconds / deliveries * 1e6:6.0f} us  {share:6.1%}")
    finally:
        _drop(url, options)


def _drop(url: str, options: TableOptions) -> None:
    """Drop the run's schema."""
    engine = sa.create_engine(migrations.sync_url(url))
    with engine.begin() as connection:
        connection.execute(sa.schema.DropSchema(options.schema, cascade=True))
    engine.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.batches, args.runs))
