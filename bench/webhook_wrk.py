"""Benchmark: the webhook front under a load generator written in C (``wrk``), one
``route()`` per post beside group commit, on PostgreSQL.

``bench/fronts.py`` drives the webhook from Python (``httpx``): its client takes as
much CPU as the server it loads, so on two cores it measures the client as much as the
front. Here ``wrk`` (Debian's ``wrk`` package) posts from one thread over
``--connections`` kept-alive connections for ``--seconds``, each post a fresh JSON
event ``{"key": ..., "n": ..., "scope": ...}`` over ``--keys`` keys (a Lua script
numbers them; the webhook's message id is the body's hash, so each is delivered once),
and the server is ``webhook_app`` under uvicorn in a process of its own, as
``bench/fronts.py`` runs it (``fronts.py --serve``).

Rows, taking turns for ``--rounds`` rounds, each round in a scope of its own and a
fresh server process, warmed by one untimed second of posts first:

* ``webhook``: each post routed by one ``route()`` call, its own transaction;
* ``webhook, group commit``: the posts that come together routed by one
  ``route_many()`` call (``group_commit``, ``--group-commit-ms``, 2 ms by default);
* with ``--before DIR`` (a checkout of an earlier commit, such as a ``git worktree``),
  ``webhook, before``: that checkout's own ``bench/fronts.py --serve`` on its own
  ``src``, in a schema its own migrations made, one ``route()`` per post as it did.

Reported: posts per second (wrk's count over its duration, the median of the rounds),
p50 and p99 latency (wrk's, of the median round), the cores used by the server, by
PostgreSQL, by wrk and by anything else while it ran, and the ratio of group commit to
the one-``route()`` row. Every answer must be 200 (wrk counts any other status and any
socket error), and the ledger must hold at least as many deliveries in the scope as
wrk counted answers (a post in flight when wrk stops is answered to nobody but may
still commit).

    PYTHONPATH=bench:src python bench/webhook_wrk.py --url postgresql://...
    python bench/webhook_wrk.py --quick            # 1 round of 5 s
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    add_json_option,
    drop_schema,
    fmt_ratio,
    machine_info,
    machine_summary,
    new_parser,
    print_table_header,
    rotated,
    versions_line,
    write_json,
)

from fronts import DEFAULT_POSTGRES, Child, CpuWatch, Ledger
from statifier.fronts.gather import DEFAULT_WINDOW, check_window
from statifier.sql import TableOptions

ALONE = "webhook"
GROUP_COMMIT = "webhook, group commit"
BEFORE = "webhook, before"
HERE = Path(__file__).resolve().parents[1]
"""The checkout this script is in."""

SCRIPT = """
local counter = 0
local scope = os.getenv("BENCH_SCOPE")
local keys = tonumber(os.getenv("BENCH_KEYS"))
local headers = {["Content-Type"] = "application/json"}

request = function()
  counter = counter + 1
  local body = string.format('{"key":"k%d","n":%d,"scope":"%s"}', counter % keys, counter, scope)
  return wrk.format("POST", "/", headers, body)
end

done = function(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    "RESULT %d %d %d %d %d %d\\n",
    summary.requests, summary.duration, errors.status,
    errors.connect + errors.read + errors.write + errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""
"""wrk's Lua: numbered bodies (one wrk thread, so one counter), and one line of
results: requests, duration and latencies in microseconds, and the failures."""

_RESULT = re.compile(r"^RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class Posted:
    """One wrk run."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


@dataclass(frozen=True)
class Checkout:
    """A checkout the server runs from, and its schema for the run."""

    root: Path
    options: TableOptions

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": f"{self.root / 'bench'}:{self.root / 'src'}"}

    def migrate(self, url: str) -> None:
        """Create this checkout's tables with its own migrations."""
        code = (
            "import sys; from statifier.sql import TableOptions, migrations; "
            "migrations.upgrade(sys.argv[1], TableOptions(prefix=sys.argv[2], schema=sys.argv[3]))"
        )
        prefix, schema = self.options.prefix, str(self.options.schema)
        subprocess.run([sys.executable, "-c", code, url, prefix, schema], env=self.env, check=True)


async def _post(
    port: int,
    scope: str,
    keys: int,
    connections: int,
    seconds: float,
    script: Path,
    server_pid: int,
) -> Posted:
    """wrk posting in ``scope`` for ``seconds``, the CPU of the server, PostgreSQL and
    wrk watched meanwhile.

    Raises:
        RuntimeError: wrk failed, or counted an answer other than 200 or a socket error.
    """
    process = await asyncio.create_subprocess_exec(
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}/",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "BENCH_SCOPE": scope, "BENCH_KEYS": str(keys)},
    )
    # wrk has ended when its CPU could be read from /proc: its share comes from the
    # children's resource usage instead (no other child ends meanwhile).
    watch = CpuWatch({"server": [server_pid]})
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    watch.start()
    said, _ = await process.communicate()
    wall = time.perf_counter() - watch.began
    cpu = watch.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    cpu["wrk"] = spent / wall
    cpu["others"] = max(0.0, cpu["others"] - cpu["wrk"])
    text = said.decode(errors="replace")
    found = _RESULT.search(text)
    if process.returncode != 0 or found is None:
        raise RuntimeError(f"wrk exited {process.returncode}: {text}")
    requests, duration, bad_status, socket_errors, p50, p99 = (int(g) for g in found.groups())
    if bad_status or socket_errors:
        raise RuntimeError(f"{scope}: {bad_status} answers not 200, {socket_errors} socket errors")
    return Posted(requests, duration / 1e6, p50 / 1e3, p99 / 1e3, cpu)


async def _row(
    url: str,
    checkout: Checkout,
    ledger: Ledger,
    logs: Path,
    lua: Path,
    args: Any,
    scope: str,
    group_commit: float | None,
) -> Posted:
    job = {
        "database": url,
        "prefix": checkout.options.prefix,
        "schema": checkout.options.schema,
        "scope": scope,
        "keep_gc": False,
        "group_commit": group_commit,
    }
    fronts = str(checkout.root / "bench" / "fronts.py")
    server = await Child.start(logs, "--serve", job, script=fronts, env=checkout.env)
    try:
        port = int(await server.line())
        pid = server.process.pid
        await _post(port, f"{scope}-warm", args.keys, args.connections, 1, lua, pid)
        posted = await _post(port, scope, args.keys, args.connections, args.seconds, lua, pid)
        await server.stop()
    finally:
        server.kill()
    delivered = await ledger.delivered(scope)
    if delivered < posted.requests:
        raise RuntimeError(f"{scope}: wrk counted {posted.requests} answers, {delivered} delivered")
    return posted


async def _rows(url: str, checkouts: dict[str, Checkout], args: Any) -> dict[str, list[Posted]]:
    group_commit = args.group_commit_ms / 1000
    rows = list(checkouts)
    measured: dict[str, list[Posted]] = {row: [] for row in rows}
    ledgers = {row: await Ledger.open(url, checkout.options) for row, checkout in checkouts.items()}
    try:
        with tempfile.TemporaryDirectory() as directory:
            logs = Path(directory)
            script = logs / "post.lua"
            script.write_text(SCRIPT)
            for turn in range(args.rounds):
                for row in rotated(rows, turn):
                    scope = f"r{turn}-{rows.index(row)}"
                    window = group_commit if row == GROUP_COMMIT else None
                    one = await _row(
                        url, checkouts[row], ledgers[row], logs, script, args, scope, window
                    )
                    measured[row].append(one)
                    print(f"  round {turn + 1}, {row}: {one.rate:,.0f} posts/s")
    finally:
        for ledger in ledgers.values():
            await ledger.close()
    return measured


def _summary(passes: list[Posted]) -> dict[str, Any]:
    ordered = sorted(passes, key=lambda one: one.rate)
    middle = ordered[len(ordered) // 2]
    return {
        "posts_per_s": statistics.median(one.rate for one in passes),
        "samples_posts_per_s": [one.rate for one in passes],
        "p50_ms": middle.p50_ms,
        "p99_ms": middle.p99_ms,
        "cpu": middle.cpu,
    }


def main() -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round of 5 s")
    parser.add_argument("--seconds", type=float, help="seconds of posts per row (default 10)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--connections", type=int, default=32, help="wrk's connections")
    parser.add_argument("--keys", type=int, default=1000, help="keys the posts spread over")
    parser.add_argument(
        "--group-commit-ms",
        type=float,
        default=DEFAULT_WINDOW * 1000,
        help="the group commit row's window, in milliseconds (default 2)",
    )
    parser.add_argument("--url", help="the PostgreSQL URL")
    parser.add_argument(
        "--before", type=Path, help="a checkout of an earlier commit: its webhook row beside"
    )
    add_json_option(parser)
    args = parser.parse_args()
    args.seconds = args.seconds or (5.0 if args.quick else 10.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (Debian: apt-get install wrk)")
    try:
        check_window(args.group_commit_ms / 1000)
    except ValueError as error:
        parser.error(str(error))
    url = args.url or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES
    info = machine_info(["statifier", "psycopg", "uvicorn", "starlette"])
    print(machine_summary(info))
    print(versions_line(info))
    print(
        f"wrk: 1 thread, {args.connections} connections, {args.seconds:g} s a row, "
        f"{args.keys} keys; group commit window {args.group_commit_ms:g} ms; "
        f"{args.rounds} rounds\n"
    )
    started = time.monotonic()

    def schema() -> TableOptions:
        return TableOptions(prefix="bench_", schema=f"statifier_wrk_bench_{uuid.uuid4().hex[:8]}")

    here = Checkout(HERE, schema())
    checkouts = {ALONE: here, GROUP_COMMIT: here}
    if args.before is not None:
        checkouts[BEFORE] = Checkout(args.before.resolve(), schema())
    try:
        for checkout in {id(c): c for c in checkouts.values()}.values():
            checkout.migrate(url)
        measured = asyncio.run(_rows(url, checkouts, args))
    finally:
        for checkout in {id(c): c for c in checkouts.values()}.values():
            drop_schema(url, str(checkout.options.schema))
    results: dict[str, Any] = {row: _summary(passes) for row, passes in measured.items()}
    ratio = results[GROUP_COMMIT]["posts_per_s"] / results[ALONE]["posts_per_s"]
    results["ratio"] = ratio
    if BEFORE in results:
        for row in (ALONE, GROUP_COMMIT):
            results[row]["ratio_to_before"] = (
                results[row]["posts_per_s"] / results[BEFORE]["posts_per_s"]
            )
    print()
    print_table_header(
        f"{'row':<22} {'posts/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'server':>7} "
        f"{'postgres':>9} {'wrk':>5} {'others':>7}"
    )
    for row in measured:
        cells, cpu = results[row], results[row]["cpu"]
        print(
            f"{row:<22} {cells['posts_per_s']:>8,.0f} {cells['p50_ms']:>7.2f} "
            f"{cells['p99_ms']:>7.2f} {cpu['server']:>7.2f} {cpu['postgres']:>9.2f} "
            f"{cpu['wrk']:>5.2f} {cpu['others']:>7.2f}"
        )
    print("(cores used in the server, PostgreSQL, wrk and other columns)")
    print(f"\ngroup commit / one route() per post: {fmt_ratio(ratio)}")
    if BEFORE in results:
        for row in (ALONE, GROUP_COMMIT):
            print(f"{row} / {BEFORE}: {fmt_ratio(results[row]['ratio_to_before'])}")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(args.json, "webhook_wrk", {"machine": info, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
