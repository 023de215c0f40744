"""Benchmark: ``Durable.send_many`` beside ``Durable.send``, on SQLite and PostgreSQL.

Run from the repository root, with the project installed (``pip install -e
'.[postgres]'``) or from a checkout::

    PYTHONPATH=bench:src python bench/durable_batch.py          # both databases
    python bench/durable_batch.py --only sqlite                 # one database
    python bench/durable_batch.py --url postgresql://... --rounds 5

PostgreSQL is found through ``--url``, else ``DATABASE_URL``, else
``postgresql://postgres@127.0.0.1:5432/test``; the benchmark works in a schema of its
own and drops it at the end. SQLite is a file in a temporary directory.

The chart counts ``tick`` events. ``--executions`` (200) executions are created first
(untimed); then each row sends every execution ``--sends`` (5) ticks, the rows taking
turns for ``--rounds`` (3) rounds on the same executions:

* ``send, 8 tasks``: eight tasks, each sending its share of the ticks one
  ``Durable.send`` at a time (one transaction each), the way a host with concurrent
  callers sends;
* ``send, 1 task``: one task sending every tick one ``send`` at a time;
* ``send_many``: one task sending the ticks in batches of ``--batch`` (50) sends to
  distinct executions, one ``send_many`` call (one transaction) each.

Reported: sends per second (the median of the rounds), the ratio of each row to
``send, 8 tasks``, and this process's CPU time per send. Every commit is durable
(SQLite ``synchronous`` FULL in WAL, PostgreSQL ``synchronous_commit`` on). At the end
each execution's input log must hold every tick sent to it.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from harness import (
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
)

from statifier.durable import Durable, Send
from statifier.sql import TableOptions

COUNTER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open"><assign location="n" expr="n + 1"/></transition>
  </state>
</scxml>"""
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
TASKS = 8
ROWS = ("send, 8 tasks", "send, 1 task", "send_many")

Sender = Callable[[Durable, list[str]], Awaitable[None]]


async def _send_tasks(durable: Durable, ids: list[str]) -> None:
    async def task(share: Sequence[str]) -> None:
        for execution_id in share:
            await durable.send(execution_id, "tick")

    await asyncio.gather(*(task(ids[index::TASKS]) for index in range(TASKS)))


async def _send_one_task(durable: Durable, ids: list[str]) -> None:
    for execution_id in ids:
        await durable.send(execution_id, "tick")


def _send_many(batch: int) -> Sender:
    async def send(durable: Durable, ids: list[str]) -> None:
        for start in range(0, len(ids), batch):
            answers = await durable.send_many([Send(i, "tick") for i in ids[start : start + batch]])
            assert all(answer.delivered for answer in answers)

    return send


async def _database(url: str, tables: TableOptions, args: Any) -> dict[str, dict[str, float]]:
    senders: dict[str, Sender] = {
        "send, 8 tasks": _send_tasks,
        "send, 1 task": _send_one_task,
        "send_many": _send_many(args.batch),
    }
    rates: dict[str, list[float]] = {row: [] for row in ROWS}
    cpu: dict[str, list[float]] = {row: [] for row in ROWS}
    ids = [f"ex_{index:05d}" for index in range(args.executions)]
    # Each pass sends every execution one tick; a batch's sends go to distinct ones.
    order = [execution_id for _ in range(args.sends) for execution_id in ids]
    async with Durable(url, charts={"counter": COUNTER}, tables=tables, migrate=True) as durable:
        for execution_id in ids:
            await durable.create("counter", execution_id)
        for row in ROWS:  # warm: connections, statements, caches
            await senders[row](durable, ids[:16])
        for turn in range(args.rounds):
            for row in rotated(list(ROWS), turn):
                started, used = time.perf_counter(), time.process_time()
                await senders[row](durable, order)
                wall, cpu_used = time.perf_counter() - started, time.process_time() - used
                rates[row].append(len(order) / wall)
                cpu[row].append(cpu_used / len(order))
        timed = args.sends * args.rounds * len(ROWS)
        for execution_id, warmed in [(ids[0], len(ROWS)), (ids[-1], 0)]:
            logged = len((await durable.describe(execution_id)).inputs)
            if logged != timed + warmed:
                raise RuntimeError(f"{execution_id} logged {logged} ticks, not {timed + warmed}")
    return {
        row: {"per_s": statistics.median(rates[row]), "cpu_us": statistics.median(cpu[row]) * 1e6}
        for row in ROWS
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--executions", type=int, default=200)
    parser.add_argument("--sends", type=int, default=5, help="ticks per execution per round")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(machine_summary(machine_info(["sqlalchemy", "psycopg"])))
    databases = [args.only] if args.only else ["sqlite", "postgresql"]
    for name in databases:
        with tempfile.TemporaryDirectory() as directory:
            if name == "sqlite":
                url, tables = f"sqlite:///{os.path.join(directory, 'batch.db')}", TableOptions()
                result = asyncio.run(_database(url, tables, args))
            else:
                schema = f"bench_send_many_{uuid.uuid4().hex[:8]}"
                try:
                    result = asyncio.run(_database(args.url, TableOptions(schema=schema), args))
                finally:
                    drop_schema(args.url, schema)
        print_table_header(f"{name}: {args.executions} executions, {args.sends} ticks each a round")
        anchor = result["send, 8 tasks"]["per_s"]
        for row in ROWS:
            cells = result[row]
            ratio = fmt_ratio(cells["per_s"] / anchor)
            print(
                f"{row:16s} {cells['per_s']:10,.0f} sends/s  {ratio:>7s}"
                f"  cpu {cells['cpu_us']:6.0f} us/send"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
