"""Benchmark: the HTTP API's send (answered after its commit with the execution's state)
and send-and-wait, against the webhook front, through one real ``statifier serve``.

Run from the repository root, with the project installed with its dev dependencies, or
from a checkout::

    PYTHONPATH=src python3 bench/api.py                  # SQLite in a temporary directory
    python bench/api.py --url postgresql://...           # PostgreSQL (a schema of its own)
    python bench/api.py --quick                          # a short run
    python bench/api.py --json out.json                  # also write the numbers

One ``statifier serve`` process runs a webhook front (``/hooks/bench``, its provider id
header the message id) and the API (``/api``, one write token, the counter's ``count``
visible, the watcher reading every 0.05 s) over the counter chart of ``bench/counter.py``
(a key's first event creates its execution, each event adds one). ``--concurrency``
(8) tasks of one ``httpx.AsyncClient`` in this process send ``--requests`` (2,000)
events a row over ``--keys`` (200) keys, round-robin, on kept-alive connections (2 per
task first, untimed, to open them). Rows:

* ``webhook``: ``POST /hooks/bench``, answered 200 once the delivery committed, with no
  state: the anchor.
* ``api send``: ``POST /api/events`` through the same binding, answered once the
  delivery committed with the execution as its step left it (status, configuration,
  the visible ``count``); an ``Idempotency-Key`` per event.
* ``api send+wait``: the same send, then ``GET /api/executions/{id}/wait`` for the state
  it is in (answered at the watcher's next read): what a caller that waits for a state
  pays.

Every answer must be 200 and every send's outcome a delivery. Reported: requests per
second (the median over ``--rounds`` (3) rounds, the rows taking turns in a rotating
order, each round with keys of its own), p50 and p99 latency (pooled over rounds), and
the ratio of each API row to the webhook row. The goal: ``api send`` at least 0.8x the
webhook's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from counter import BINDING, CHART, DOCUMENT, SOURCE
from harness import (
    drop_schema,
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

TOKEN = "bench-api-token-" + "0" * 16
SOURCE_TREE = Path(__file__).resolve().parents[1] / "src"
GOAL = 0.8
ROWS = ("webhook", "api send", "api send+wait")

Call = Callable[[httpx.AsyncClient, int, str], Awaitable[None]]


def _config(directory: Path, url: str, schema: str | None) -> Path:
    (directory / "charts").mkdir()
    (directory / "charts" / f"{DOCUMENT}.scxml").write_bytes(CHART)
    schema_line = f'schema = "{schema}"\n' if schema else ""
    body = f"""
migrate = true
charts = "charts"

[[bindings]]
id = "{BINDING.id}"
source = "{SOURCE}"
match = "true"
key = "event.key"
document = "{DOCUMENT}"
event = "{BINDING.event}"

[database]
url = "{url}"
prefix = "bench_"
{schema_line}
[http]
port = 0

[fronts.webhook.bench]
path = "/hooks/bench"
source = "{SOURCE}"
scope = "web"
provider_id_header = "X-Event-Id"

[api]
poll = 0.05

[api.visible]
{DOCUMENT} = ["count"]

[api.tokens.bench]
token_env = "BENCH_API_TOKEN"
scopes = ["*"]
rights = "write"
"""
    path = directory / "statifier.toml"
    path.write_text(body, encoding="utf-8")
    return path


async def _serve(config: Path, log: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {**os.environ, "BENCH_API_TOKEN": TOKEN, "PYTHONPATH": str(SOURCE_TREE)}
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "statifier.cli",
            "serve",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env=env,
        )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 120)).decode()
    if "listening on " not in line:
        raise RuntimeError(f"serve did not start: {line!r}; its log is {log}")
    return process, line.split("listening on ", 1)[1].strip()


def _event(n: int, keys: int, tag: str) -> dict[str, Any]:
    return {"key": f"{tag}-k{n % keys}", "n": n}


def _calls(keys: int) -> dict[str, Call]:
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def webhook(client: httpx.AsyncClient, n: int, tag: str) -> None:
        headers = {"X-Event-Id": f"{tag}-{n}"}
        answer = await client.post("/hooks/bench", json=_event(n, keys, tag), headers=headers)
        if answer.status_code != 200:
            raise RuntimeError(f"webhook answered {answer.status_code}")

    async def send(client: httpx.AsyncClient, n: int, tag: str) -> dict[str, Any]:
        body = {"source": SOURCE, "scope": "web", "data": _event(n, keys, tag)}
        headers = {**auth, "Idempotency-Key": f"{tag}-{n}"}
        answer = await client.post("/api/events", json=body, headers=headers)
        if answer.status_code != 200:
            raise RuntimeError(f"the API answered {answer.status_code}: {answer.text[:200]}")
        (outcome,) = answer.json()["outcomes"]
        if outcome["outcome"] not in ("created_and_delivered", "delivered"):
            raise RuntimeError(f"the API's outcome: {outcome}")
        execution: dict[str, Any] = outcome["execution"]
        return execution

    async def api_send(client: httpx.AsyncClient, n: int, tag: str) -> None:
        await send(client, n, tag)

    async def send_and_wait(client: httpx.AsyncClient, n: int, tag: str) -> None:
        execution = await send(client, n, tag)
        (state,) = execution["configuration"]
        answer = await client.get(
            f"/api/executions/{execution['id']}/wait",
            params={"state": state, "timeout": "10"},
            headers=auth,
        )
        if answer.status_code != 200 or not answer.json()["reached"]:
            raise RuntimeError(f"the wait answered {answer.status_code}: {answer.text[:200]}")

    return {"webhook": webhook, "api send": api_send, "api send+wait": send_and_wait}


async def _row(
    base: str, call: Call, requests: int, concurrency: int, tag: str
) -> tuple[float, list[float]]:
    """``requests`` calls from ``concurrency`` tasks: the rate and each call's latency."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=30.0, limits=limits) as client:
        warm = [call(client, -1 - n, f"{tag}w") for n in range(2 * concurrency)]
        await asyncio.gather(*warm)
        shares = [range(start, requests, concurrency) for start in range(concurrency)]

        async def task(share: Sequence[int]) -> None:
            for n in share:
                began = time.perf_counter()
                await call(client, n, tag)
                latencies.append(time.perf_counter() - began)

        started = time.perf_counter()
        await asyncio.gather(*(task(share) for share in shares))
        elapsed = time.perf_counter() - started
    return requests / elapsed, latencies


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    schema = None
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        url = args.url or f"sqlite:///{directory / 'bench.db'}"
        if url.startswith("postgresql"):
            schema = f"bench_api_{uuid.uuid4().hex[:8]}"
        config = _config(directory, url, schema)
        process, base = await _serve(config, directory / "serve.log")
        try:
            calls = _calls(args.keys)
            rates: dict[str, list[float]] = {row: [] for row in ROWS}
            latencies: dict[str, list[float]] = {row: [] for row in ROWS}
            for turn in range(args.rounds):
                for row in rotated(ROWS, turn):
                    tag = f"r{turn}-{row.replace(' ', '_').replace('+', '_')}"
                    rate, taken = await _row(base, calls[row], args.requests, args.concurrency, tag)
                    rates[row].append(rate)
                    latencies[row].extend(taken)
                    print(f"  round {turn + 1} {row:>14}: {rate:8.0f}/s", flush=True)
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 60)
            if schema is not None:
                drop_schema(url, schema)
    backend = "postgresql" if schema is not None else "sqlite"
    results: dict[str, Any] = {"backend": backend, "rows": {}}
    anchor = statistics.median(rates["webhook"])
    for row in ROWS:
        median = statistics.median(rates[row])
        results["rows"][row] = {
            "rate": median,
            "rates": rates[row],
            "p50_ms": 1000 * _percentile(latencies[row], 0.5),
            "p99_ms": 1000 * _percentile(latencies[row], 0.99),
            "ratio": median / anchor,
        }
    return results


def _print(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n{results['backend']}: {args.requests} requests a row over {args.keys} keys, "
        f"{args.concurrency} at once, {args.rounds} rounds"
    )
    print_table_header(f"{'row':>14} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'x webhook':>10}")
    for row, cells in results["rows"].items():
        print(
            f"{row:>14} {cells['rate']:9.0f} {cells['p50_ms']:8.2f} {cells['p99_ms']:8.2f} "
            f"{fmt_ratio(cells['ratio']):>10}"
        )
    ratio = results["rows"]["api send"]["ratio"]
    met = verdict(ratio >= GOAL)
    print(f"\ngoal: api send at least {GOAL}x the webhook: {fmt_ratio(ratio)} {met}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__ or "")
    parser.add_argument("--url", default=None, help="a PostgreSQL URL (default: SQLite)")
    parser.add_argument("--requests", type=int, default=2000, help="requests a row and round")
    parser.add_argument("--keys", type=int, default=200, help="keys the events spread over")
    parser.add_argument("--concurrency", type=int, default=8, help="requests at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the rows taking turns")
    parser.add_argument("--quick", action="store_true", help="500 requests, one round")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds = 500, 1
    info = machine_info(["statifier", "uvicorn", "httpx", "starlette", "psycopg"])
    print(machine_summary(info))
    print(versions_line(info))
    results = asyncio.run(_run(args))
    _print(results, args)
    if args.json is not None:
        write_json(args.json, "api", {"machine": info, "results": results, "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
