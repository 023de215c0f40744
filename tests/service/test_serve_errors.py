"""The newcomer's chart run through a real ``statifier serve`` process, on SQLite and
PostgreSQL: an order whose amount arrives as a string fails its ``<assign>``, so the
payment timeout the rest of the transition held is never sent. The error is visible in
every place an operator looks: the service's log (a warning naming the element, line
and column), ``statifier executions show`` and ``send`` (which says so and exits 1),
the console's execution page and its failures page; and the ledger's outcome stays
what happened to the event (it was taken). A correct order's timeout fires under the
same service."""

from __future__ import annotations

import argparse
import asyncio
import io
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.persistence.conftest import FreshDatabase, drop_schema, unique_name
from tests.service.helpers import database_table, start_serve, until, write_config

from statifier import executions_command
from statifier.persistence import Status, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router, ledger
from statifier.service import load
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed" datamodel="predicator">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paying">
      <assign location="amount" expr="_event.data.amount * 2"/>
      <send id="timeout" event="payment.timeout" delay="1s"/>
    </transition>
  </state>
  <state id="paying">
    <transition event="payment.timeout" target="expired"/>
    <transition event="paid" target="paid"/>
  </state>
  <final id="paid"/>
  <final id="expired"/>
</scxml>"""

TOKEN = "operator-token-3b1f9e"


def _config(directory: Path, database: FreshDatabase) -> Path:
    body = f"""
migrate = true
shutdown_timeout = 8
charts = "charts"

[[bindings]]
id = "payments"
source = "shop"
match = "true"
key = "event.order"
document = "order"
event = "pay"
data = ["amount"]

{database_table(database)}
[http]
port = 0

[fronts.webhook.shop]
path = "/hooks/shop"
source = "shop"
scope = "web"
provider_id_header = "X-Event-Id"

[timers]
poll = 0.2

[console.operators.ops]
token_env = "TEST_CONSOLE_TOKEN"
role = "read_only"
"""
    return write_config(directory, body, {"order": ORDER})


@pytest.fixture(params=("sqlite", "postgresql"))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FreshDatabase]:
    if request.param == "sqlite":
        yield FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'serve.db'}", None)
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_errors_")
    try:
        yield FreshDatabase("postgresql", url, schema)
    finally:
        drop_schema(url, schema)


def _cli(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="statifier")
    parser.add_argument("--debug", action="store_true")
    executions_command.add_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    status = executions_command.run(parser.parse_args(["executions", *argv]), out)
    return status, out.getvalue()


@pytest.mark.asyncio
async def test_the_newcomers_error_is_seen_everywhere_an_operator_looks(
    tmp_path: Path, database: FreshDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_CONSOLE_TOKEN", TOKEN)
    config = _config(tmp_path, database)
    served = await start_serve(config, tmp_path / "serve.log")
    try:
        async with httpx.AsyncClient(base_url=served.url, timeout=10) as client:
            for message, order, amount in (("m1", "o-1", "12"), ("m2", "o-2", 12)):
                answer = await client.post(
                    "/hooks/shop",
                    json={"order": order, "amount": amount},
                    headers={"X-Event-Id": message},
                )
                assert answer.status_code == 200, answer.text

            settings = load(config)
            async with SqlAdapter(
                settings.database.url,
                TableOptions(prefix="t_", schema=database.schema),
            ) as adapter:
                router = Router(router_config(settings, adapter))
                storage = Storage(adapter)
                rows = {row.key: row for row in await ledger(router)}
                assert (rows["o-1"].outcome, rows["o-2"].outcome) == (
                    "created_and_delivered",
                    "created_and_delivered",
                )
                bad = rows["o-1"].execution_id
                good = rows["o-2"].execution_id
                assert bad is not None
                assert good is not None
                record = await storage.fetch_execution(bad)
                assert (record.status, record.error_count) == (Status.ACTIVE, 1)

                # The correct order's timeout fires under the service; the bad one's
                # was never sent.
                async def expired() -> bool:
                    found = await storage.fetch_execution(good)
                    return found.final_state == "expired"

                await until(expired, 20)
                assert (await storage.fetch_execution(bad)).status is Status.ACTIVE

            # The service's log: one warning naming the element, line and column.
            async def logged() -> bool:
                return "error.execution at <assign>" in served.stderr()

            await until(logged, 10)
            (line,) = [line for line in served.stderr().splitlines() if "error.execution" in line]
            assert " WARNING statifier.persistence: " in line
            assert f"execution {bad} (step)" in line
            assert "line 5, column 7: '*' expects numbers, got a string" in line

            # The command line, on the same database.
            at = ["--database", settings.database.url, "--prefix", "t_"]
            if database.schema is not None:
                at += ["--schema", database.schema]
            status, shown = await asyncio.to_thread(_cli, "show", bad, *at)
            assert status == 0
            assert ["errors", "1"] in [text.split() for text in shown.splitlines()]
            assert "error.execution at <assign>, line 5, column 7" in shown
            # A send of the same mistake to a fresh order says it, and exits 1.
            charts = str(tmp_path / "charts")
            status, created = await asyncio.to_thread(
                _cli, "create", "order", "--id", "o-3", "--charts", charts, *at
            )
            assert status == 0, created
            status, said = await asyncio.to_thread(_cli, "send", "o-3", 'pay={"amount": "x"}', *at)
            assert status == 1
            assert said.splitlines()[1].startswith("  error.execution at <assign>, line 5")

            # The console: the execution page and the failures page.
            login = await client.post(
                "/console/login",
                data={"token": TOKEN},
                headers={"Sec-Fetch-Site": "same-origin"},
                follow_redirects=False,
            )
            assert login.status_code in (302, 303), login.text
            page = await client.get(f"/console/executions/{bad}")
            assert page.status_code == 200
            assert "error.execution" in page.text
            assert "expects numbers, got a string" in page.text
            failures = await client.get("/console/failures")
            assert failures.status_code == 200
            assert bad in failures.text
            listed = await client.get("/console/executions?errors=1")
            assert bad in listed.text
            assert good not in listed.text
            expired_page = await client.get(f"/console/executions/{good}")
            assert "expired" in expired_page.text
    finally:
        served.signal(signal.SIGTERM)
        assert await served.wait(30) == 0
    assert TOKEN not in served.stderr()
