"""Locks as rows (`TableOptions(locks="rows")`) against PostgreSQL's advisory locks (the
default), on the same PostgreSQL server, the rows taking turns on fresh schemas:

- `durable step`: `--executions` counters created through `Executions`, then each
  stepped `--steps` times, every step its own transaction holding the execution's lock
  (a row already there, after the create made it);
- `route_many`: eight routers at once deliver `--keys` keys x `--events` events in
  batches of `--batch` (each key's first event creates its execution), each batch
  taking its dedupe claims', its addresses' and its executions' locks in one
  statement; every message's claim is a new key, so as rows every batch inserts a lock
  row per message;
- `route_many, reaped`: the executions made in an untimed first round, then the lock
  rows reaped (`reap_locks`), then the same workload timed: the addresses' and
  executions' rows are made again too.

Printed: each row's rate for both and rows / advisory. Decision 0118 reads these to
choose the default; locks as rows are a choice for a database that does not honour
advisory locks across its nodes.

    python bench/locks.py --url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    versions_line,
    write_json,
)

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Executions, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Failed,
    InboundEvent,
    Router,
    RouterConfig,
    StaticResolver,
    reap_locks,
)
from statifier.sql import TableOptions

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ROUTERS = 8
Kind = Literal["advisory", "rows"]
KINDS: tuple[Kind, ...] = ("advisory", "rows")


def fresh(url: str, locks: Kind) -> TableOptions:
    from statifier.sql import migrations

    options = TableOptions(schema=f"bench_locks_{uuid.uuid4().hex[:8]}", locks=locks)
    migrations.upgrade(url, options)
    return options


async def durable_steps(url: str, options: TableOptions, executions: int, steps: int) -> float:
    """Steps per second, the steps timed (not the creates)."""
    async with SqlAdapter(url, options) as adapter:
        lifecycle = Executions(Storage(adapter), executor=ignore_effects)
        machine = compile_chart(CHART, name=DOCUMENT)
        ids = [f"ex-{n}" for n in range(executions)]
        for execution_id in ids:
            await lifecycle.create(execution_id, machine)
        event = Event("tick")
        started = time.perf_counter()
        for _ in range(steps):
            for execution_id in ids:
                await lifecycle.step(execution_id, machine, event)
        return steps * executions / (time.perf_counter() - started)


async def _deliver(router: Router, share: Sequence[tuple[str, str]], batch: int) -> int:
    delivered = 0
    for start in range(0, len(share), batch):
        part = share[start : start + batch]
        events = [
            InboundEvent(scope="bench", source=SOURCE, message_id=m, data={"key": k})
            for k, m in part
        ]
        for answer in await router.route_many(events):
            if isinstance(answer, Failed):
                raise answer.error
            delivered += len(answer.outcomes)
    return delivered


async def deliveries(
    url: str, options: TableOptions, keys: int, events: int, batch: int, reap: bool
) -> float:
    """Deliveries per second of the whole workload, eight routers at once; with
    ``reap``, a first round creates the executions, the lock rows are reaped, and the
    second round is timed."""
    async with SqlAdapter(url, options) as adapter:
        resolver = StaticResolver({DOCUMENT: compile_chart(CHART, name=DOCUMENT)})
        router = Router(RouterConfig(adapter, bindings=[BINDING], resolver=resolver))
        names = [f"k{n}" for n in range(keys)]

        def shares(round_: int) -> list[list[tuple[str, str]]]:
            return [
                [(k, f"{k}:{round_}:{turn}") for turn in range(events) for k in names[r::ROUTERS]]
                for r in range(ROUTERS)
            ]

        if reap:
            await asyncio.gather(*(_deliver(router, s, batch) for s in shares(0)))
            after: int | None = None
            while True:
                page = await reap_locks(router, limit=10_000, after=after)
                if page.next is None:
                    break
                after = page.next
        started = time.perf_counter()
        done = await asyncio.gather(*(_deliver(router, s, batch) for s in shares(1)))
        elapsed = time.perf_counter() - started
        if sum(done) != keys * events:
            raise RuntimeError(f"delivered {sum(done)} of {keys * events}")
        return keys * events / elapsed


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--url", default=DEFAULT_URL, help="the PostgreSQL URL")
    parser.add_argument("--executions", type=int, default=50)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--keys", type=int, default=800)
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    add_json_option(parser)
    args = parser.parse_args()
    info = machine_info(["statifier", "sqlalchemy", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    rows: dict[str, Any] = {
        "durable step": lambda o: durable_steps(args.url, o, args.executions, args.steps),
        "route_many": lambda o: deliveries(
            args.url, o, args.keys, args.events, args.batch, reap=False
        ),
        "route_many, reaped": lambda o: deliveries(
            args.url, o, args.keys, args.events, args.batch, reap=True
        ),
    }
    results: dict[str, dict[str, float]] = {}
    print(f"{'row':<20} {'advisory /s':>12} {'rows /s':>10} {'rows / advisory':>16}")
    for name, run in rows.items():
        samples: dict[Kind, list[float]] = {kind: [] for kind in KINDS}
        for turn in range(args.rounds):
            for kind in KINDS if turn % 2 == 0 else tuple(reversed(KINDS)):
                options = fresh(args.url, kind)
                try:
                    samples[kind].append(asyncio.run(run(options)))
                finally:
                    assert options.schema is not None
                    drop_schema(args.url, options.schema)
        advisory, as_rows = (statistics.median(samples[kind]) for kind in KINDS)
        results[name] = {"advisory": advisory, "rows": as_rows, "ratio": as_rows / advisory}
        print(f"{name:<20} {advisory:12,.0f} {as_rows:10,.0f} {fmt_ratio(as_rows / advisory):>16}")
    print(
        f"{args.rounds} rounds, medians; {args.executions} executions x {args.steps} steps; "
        f"{args.keys} keys x {args.events} events in batches of {args.batch}, "
        f"{ROUTERS} routers"
    )
    if args.json:
        write_json(args.json, "locks", {"machine": info, "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
