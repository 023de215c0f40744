"""Fixtures for the console's tests: each backend's database (the persistence
fixtures' session databases, emptied before each test) with the console's read side
over it; and, for the browser tests, a real ``statifier serve`` with the console and a
headless Chromium."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from selenium.webdriver import Chrome, ChromeOptions
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.remote.webdriver import WebDriver
from tests.persistence.conftest import (  # noqa: F401 - fixtures used through SQL_BACKENDS
    SQL_BACKENDS,
    SqlStore,
    fresh_database,
    postgresql_store,
    sqlite_store,
)

from statifier.console.queries import ConsoleQueries
from statifier.router import Binding, Create
from statifier.sql import migrations


@dataclass
class ConsoleDb:
    """A migrated, emptied database of one backend, the console's queries over it, and
    a synchronous engine the tests write their rows with."""

    backend: str
    store: SqlStore
    queries: ConsoleQueries
    writer: sa.Engine

    def insert(self, table: sa.Table, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``rows`` into ``table`` in one transaction."""
        with self.writer.begin() as connection:
            connection.execute(table.insert(), [dict(row) for row in rows])


@pytest.fixture(params=SQL_BACKENDS)
def console_store(request: pytest.FixtureRequest) -> SqlStore:
    """Each backend's session database."""
    store: SqlStore = request.getfixturevalue(f"{request.param}_store")
    return store


@pytest.fixture
def writer(console_store: SqlStore) -> Iterator[sa.Engine]:
    """A synchronous engine on the backend's database."""
    engine = sa.create_engine(migrations.sync_url(console_store.url))
    try:
        yield engine
    finally:
        engine.dispose()


@pytest_asyncio.fixture
async def console_db(console_store: SqlStore, writer: sa.Engine) -> AsyncIterator[ConsoleDb]:
    """Each backend's database, emptied, with the console's queries over it."""
    console_store.empty()
    queries = ConsoleQueries.open(console_store.url, console_store.tables)
    try:
        yield ConsoleDb(console_store.backend, console_store, queries, writer)
    finally:
        await queries.close()


# -- an order that pays or expires, and meets an error -----------------------------------

CHECKOUT = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">
  <datamodel><data id="total" expr="0"/></datamodel>
  <state id="placed">
    <transition event="checkout" target="awaiting_payment">
      <assign location="total" expr="_event.data.amount * 2"/>
      <send id="payment_timeout" event="payment.timeout" delayexpr="_event.data.timeout"/>{receipt}
    </transition>
  </state>
  <state id="awaiting_payment">
    <transition event="checkout">
      <assign location="total" expr="_event.data.amount * 2"/>
    </transition>
    <transition event="pay" target="paid"><cancel sendid="payment_timeout"/></transition>
    <transition event="payment.timeout" target="expired"/>
  </state>
  <final id="paid"/>
  <final id="expired"/>
</scxml>"""
"""An order: a checkout doubles its amount and arms a payment timeout; a payment
finishes it as paid (and cancels the timeout), the timeout as expired; a checkout again
while it waits changes the total. A checkout whose amount is not a number raises
error.execution at the ``<assign>`` (line 5, column 7): the rest of the transition (the
timeout) never runs, and the order waits for ever.
``{receipt}`` is where a test adds a send of its own."""

RECEIPT = (
    '\n      <send type="shop:route" target="receipts" event="order.placed">'
    '<param name="total" expr="total"/></send>'
)
"""A receipt handed to the ``receipts`` route after the timeout is armed."""

ASSIGN_AT = (5, 7)
"""Where CHECKOUT's ``<assign>`` is: line and column."""


def shop_bindings() -> list[Binding]:
    """Checkouts and payments of source ``shop``, keyed by order."""
    return [
        Binding(
            id="checkouts",
            source="shop",
            match="event.kind == 'checkout'",
            key="event.order",
            document="order",
            event="checkout",
            data=("amount", "timeout", "note"),
        ),
        Binding(
            id="payments",
            source="shop",
            match="event.kind == 'pay'",
            key="event.order",
            document="order",
            event="pay",
            create=Create.NEVER,
        ),
    ]


# -- the browser tests: a real `statifier serve` and a headless Chromium ----------------

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS_ENV = "STATIFIER_SCREENSHOTS"
"""Set to 1 to have the browser test write the screenshots of docs/console.md."""
SCREENSHOTS = ROOT / "docs" / "console"
OPERATOR_TOKEN = "operator-token-" + "a" * 24
READER_TOKEN = "reader-token-" + "b" * 24
_LISTENING = re.compile(r"listening on (http://[^\s]+)")

PARCEL = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="received">
  <datamodel><data id="note" expr="''"/><data id="scans" expr="0"/></datamodel>
  <state id="received">
    <transition event="scan" target="transit">
      <assign location="note" expr="_event.data.note"/>
      <assign location="scans" expr="scans + 1"/>
    </transition>
  </state>
  <state id="transit" initial="hub">
    <transition event="lost" target="missing"/>
    <state id="hub">
      <transition event="scan" target="van"><assign location="scans" expr="scans + 1"/></transition>
    </state>
    <state id="van">
      <transition event="scan" target="delivered">
        <assign location="scans" expr="scans + 1"/>
      </transition>
    </state>
  </state>
  <state id="missing"/>
  <final id="delivered"/>
</scxml>"""
"""A parcel: the first scan receives it (and keeps its note), two more take it through
the hub and the van to delivered."""

CONFIG = """
migrate = true
charts = "charts"

[[bindings]]
id = "carrier_scans"
source = "carrier"
match = "true"
key = "event.parcel"
document = "parcel"
event = "scan"
data = ["note"]

[[bindings]]
id = "checkouts"
source = "shop"
match = "event.kind == 'checkout'"
key = "event.order"
document = "order"
event = "checkout"
data = ["amount", "timeout"]

[[bindings]]
id = "payments"
source = "shop"
match = "event.kind == 'pay'"
key = "event.order"
document = "order"
event = "pay"
create = "never"

[database]
url = "{url}"

[http]
port = 0

[fronts.webhook.carrier]
path = "/hooks/carrier"
source = "carrier"
scope = "depot_7"
provider_id_header = "X-Event-Id"

[fronts.webhook.shop]
path = "/hooks/shop"
source = "shop"
scope = "web"
provider_id_header = "X-Event-Id"

[timers]
poll = 0.2

[console]
live_interval = 0.2

[console.operators.ada]
token_env = "CONSOLE_TEST_OPERATOR"
role = "operator"

[console.operators.rex]
token_env = "CONSOLE_TEST_READER"
role = "read_only"
"""


@dataclass
class ServedConsole:
    """A running ``statifier serve`` with the console, its SQLite database and the
    webhooks that route carrier scans and shop orders."""

    url: str
    database: str
    process: subprocess.Popen[str]
    log: Path

    def scan(self, parcel: str, message_id: str, note: str = "") -> None:
        """Post one scan of ``parcel`` to the webhook; it must be taken (2xx)."""
        response = httpx.post(
            f"{self.url}/hooks/carrier",
            json={"parcel": parcel, "note": note},
            headers={"X-Event-Id": message_id},
            timeout=10,
        )
        assert response.is_success, response.text

    def order(self, kind: str, order: str, message_id: str, **data: object) -> None:
        """Post one shop event (``checkout`` or ``pay``) of ``order``; it must be taken."""
        response = httpx.post(
            f"{self.url}/hooks/shop",
            json={"kind": kind, "order": order, **data},
            headers={"X-Event-Id": message_id},
            timeout=10,
        )
        assert response.is_success, response.text


@pytest.fixture
def served_console(tmp_path: Path) -> Iterator[ServedConsole]:
    """``statifier serve`` as a real process on 127.0.0.1 (any free port), over a
    SQLite file, with the console enabled for an operator and a read-only operator;
    parcels (scanned at ``/hooks/carrier``) and orders (checked out and paid at
    ``/hooks/shop``, their payment timeouts fired by the service's timer worker)."""
    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "parcel.scxml").write_text(PARCEL, encoding="utf-8")
    (charts / "order.scxml").write_text(CHECKOUT.format(receipt=""), encoding="utf-8")
    database = f"sqlite:///{tmp_path / 'console.db'}"
    config = tmp_path / "statifier.toml"
    config.write_text(CONFIG.format(url=database), encoding="utf-8")
    log = tmp_path / "serve.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "CONSOLE_TEST_OPERATOR": OPERATOR_TOKEN,
        "CONSOLE_TEST_READER": READER_TOKEN,
    }
    with log.open("w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", "statifier.cli", "serve", str(config)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )
    try:
        assert process.stdout is not None
        found = None
        deadline = time.monotonic() + 60
        while found is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            found = _LISTENING.search(line)
        assert found is not None, f"serve did not start:\n{log.read_text()}"
        url = found.group(1)
        assert url.startswith("http://127.0.0.1:"), url  # loopback unless told otherwise
        yield ServedConsole(url, database, process, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """A headless Chromium (Debian's, found by scripts/ensure-chromium) at 1280x900,
    driven through Debian's chromedriver: nothing is downloaded."""
    options = ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    service = ChromeService(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    driver = Chrome(service=service, options=options)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        yield driver
    finally:
        driver.quit()
