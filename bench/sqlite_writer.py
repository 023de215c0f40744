"""Benchmark: taking the SQLite adapter's single writer when it is free (every durable
step on SQLite does), against the same lock taken under ``asyncio.timeout``.

Run from the repository root::

    PYTHONPATH=src python3 bench/sqlite_writer.py            # 100,000 takes, best of 5
    PYTHONPATH=src python3 bench/sqlite_writer.py --takes 1000000

Rows: the CPU microseconds of one take and release of a free lock. ``statifier`` is
``Writer.acquire`` with a bound on the wait (as ``exclusive`` passes its lock wait);
``anchor`` is the same ``asyncio.Lock`` taken inside ``asyncio.timeout(wait)``, which
arms and cancels a timer per take whether or not it waits. This is a measurement, not
a test: it asserts nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable

from harness import machine_info, machine_summary, new_parser

WAIT = 30.0
REPEATS = 5


async def best_of(
    take: Callable[[], Awaitable[None]], release: Callable[[], None], n: int
) -> float:
    """The least CPU microseconds per take and release over ``REPEATS`` runs of ``n``."""
    best = float("inf")
    for _ in range(REPEATS):
        started = time.process_time()
        for _ in range(n):
            await take()
            release()
        best = min(best, time.process_time() - started)
    return best / n * 1e6


async def measure(n: int) -> tuple[float, float]:
    from statifier.persistence.sql.sqlite import Writer

    writer = Writer()
    lock = asyncio.Lock()

    async def anchor() -> None:
        async with asyncio.timeout(WAIT):
            await lock.acquire()

    ours = await best_of(lambda: writer.acquire(WAIT, "bench"), writer.lock.release, n)
    theirs = await best_of(anchor, lock.release, n)
    return ours, theirs


def main() -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--takes", type=int, default=100_000)
    args = parser.parse_args()
    print(machine_summary(machine_info([])))
    ours, theirs = asyncio.run(measure(args.takes))
    print(f"{'row':>10} {'cpu us per take':>16}")
    print(f"{'statifier':>10} {ours:16.2f}")
    print(f"{'anchor':>10} {theirs:16.2f}")
    print(f"anchor / statifier: {theirs / ours:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
