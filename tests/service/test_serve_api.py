"""The HTTP API through a real ``statifier serve`` on each database: ``[api]`` read and
checked, a send answered with what the database holds after its commit, a wait
answered when the execution ends, tokens held to their scopes and rights, two hundred
waiters served by one watcher (counted by its telemetry in the service's log)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - a fixture
from tests.service.helpers import database_table, start_serve, write_config

from statifier.persistence.sql import SqlAdapter
from statifier.service import load
from statifier.service.settings import ServiceConfigError
from statifier.sql import TableOptions

WRITER = "writer-token-0123456789"
READER = "reader-token-0123456789"
OTHER = "other-token-01234567890"

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">
  <datamodel><data id="total" expr="0"/><data id="card" expr="''"/></datamodel>
  <state id="placed">
    <transition event="checkout" target="awaiting_payment">
      <assign location="total" expr="_event.data.amount"/>
      <assign location="card" expr="_event.data.card"/>
    </transition>
  </state>
  <state id="awaiting_payment"><transition event="pay" target="paid"/></state>
  <final id="paid"/>
</scxml>"""
"""An order: a checkout keeps its total (visible) and card (not), a payment ends it."""


def _config(directory: Path, database: FreshDatabase, api: str) -> Path:
    body = f"""
migrate = true
charts = "charts"

[[bindings]]
id = "checkouts"
source = "shop"
match = "true"
key = "event.order"
document = "order"
event = "checkout"
data = ["amount", "card"]

{database_table(database)}
[http]
port = 0

[logging]
format = "json"
events = true

{api}
"""
    return write_config(directory, body, {"order": ORDER})


API = """
[api]
poll = 0.05

[api.visible]
order = ["total"]

[api.tokens.shop]
token_env = "TEST_API_WRITER"
scopes = ["web"]
rights = "write"

[api.tokens.viewer]
token_env = "TEST_API_READER"
scopes = ["web"]

[api.tokens.partner]
token_env = "TEST_API_OTHER"
scopes = ["partners"]
rights = "write"
"""


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_API_WRITER", WRITER)
    monkeypatch.setenv("TEST_API_READER", READER)
    monkeypatch.setenv("TEST_API_OTHER", OTHER)


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.usefixtures("tokens")
@pytest.mark.asyncio
async def test_the_api_through_serve_answers_what_the_database_holds(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, fresh_database, API)
    log = tmp_path / "serve.log"
    served = await start_serve(config, log)
    base = f"{served.url}/api"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
            document = (await client.get("/openapi.json")).json()
            assert document["openapi"] == "3.1.0"
            assert document["servers"] == [{"url": "/api"}]
            body = {
                "source": "shop",
                "scope": "web",
                "data": {"order": "o-1", "amount": 42, "card": "4111 1111"},
            }
            answer = await client.post("/events", json=body, headers=_headers(WRITER))
            assert answer.status_code == 200, answer.text
            (outcome,) = answer.json()["outcomes"]
            execution = outcome["execution"]
            assert outcome["outcome"] == "created_and_delivered"
            assert execution["configuration"] == ["awaiting_payment"]
            assert execution["data"] == {"total": 42}  # the card never leaves
            # What the database holds after the commit is what the answer said.
            async with SqlAdapter(
                fresh_database.url, TableOptions(prefix="t_", schema=fresh_database.schema)
            ) as adapter:
                record = await adapter.fetch_execution(execution["id"])
                assert record is not None
                assert record.updated_at is not None
                assert record.status.value == execution["status"] == "active"
                assert record.updated_at.isoformat() == execution["updated_at"]
            read = await client.get(f"/executions/{execution['id']}", headers=_headers(READER))
            assert read.json()["updated_at"] == execution["updated_at"]

            # Tokens: a reader may not send; another scope's token sees nothing here.
            refused = await client.post("/events", json=body, headers=_headers(READER))
            assert refused.status_code == 403
            elsewhere = await client.post("/events", json=body, headers=_headers(OTHER))
            assert elsewhere.status_code == 403
            hidden = await client.get(f"/executions/{execution['id']}", headers=_headers(OTHER))
            assert hidden.status_code == 404
            assert (await client.get("/executions", headers=_headers("x" * 20))).status_code == 401

            # Send and wait: two hundred waiters on twenty orders, one watcher.
            orders = [f"w-{n}" for n in range(20)]
            ids = []
            for order in orders:
                placed = {"source": "shop", "scope": "web", "data": {"order": order, "amount": 1}}
                routed = await client.post("/events", json=placed, headers=_headers(WRITER))
                ids.append(routed.json()["outcomes"][0]["execution_id"])
            # The waiters' own client: two hundred connections open at once.
            waiting = httpx.AsyncClient(
                base_url=base, timeout=30.0, limits=httpx.Limits(max_connections=200)
            )
            waiters = [
                asyncio.create_task(
                    waiting.get(
                        f"/executions/{ids[n % 20]}/wait",
                        params={"end": "true", "timeout": "20"},
                        headers=_headers(READER),
                    )
                )
                for n in range(200)
            ]
            for _ in range(600):  # until the watcher has read for every waiter
                if any(read["waiters"] == 200 for read in _watch_reads(log)):
                    break
                await asyncio.sleep(0.05)
            before = _watch_reads(log)
            for order in orders:
                paid = await client.post(
                    f"/addresses/web/order/{order}/events",
                    json={"event": "pay"},
                    headers=_headers(WRITER),
                )
                assert paid.json()["outcome"]["execution"]["final_state"] == "paid"
            answers = await asyncio.wait_for(asyncio.gather(*waiters), 30)
            await waiting.aclose()
            assert all(a.json()["reached"] for a in answers)
            assert all(a.json()["execution"]["status"] == "completed" for a in answers)
    finally:
        served.process.terminate()
        await served.wait(30)
    reads = _watch_reads(log)
    assert reads, served.stderr()[-2000:]
    most = max(fields["executions"] for fields in reads)
    assert most == 20  # one read covers every order waited on
    assert max(fields["waiters"] for fields in reads) == 200
    # A read per interval (0.05 s) while anyone waited: far from one per waiter.
    print(f"200 waiters on 20 executions: {len(reads)} reads of the watcher ({len(before)} idle)")
    assert len(reads) < 200


def _watch_reads(log: Path) -> list[dict[str, float]]:
    """The ``statifier.api.watch`` events the service logged."""
    reads = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if '"statifier.api.watch"' not in line:
            continue
        try:
            reads.append(json.loads(line)["measurements"])
        except ValueError:  # the line the service is writing now
            continue
    return reads


@pytest.mark.usefixtures("tokens")
def test_api_settings_are_checked(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    settings = load(_config(tmp_path, fresh_database, API))
    assert settings.api.enabled
    assert settings.api.path == "/api"
    assert [t.name for t in settings.api.tokens] == ["shop", "viewer", "partner"]
    assert WRITER not in repr(settings.api)
    assert settings.api.visible == {"order": ("total",)}
    refused = {
        "[api]\n": "the API needs a token",
        API.replace("poll = 0.05", 'poll = 0.05\npath = "/readyz"'): "overlaps the health",
        API.replace('scopes = ["web"]', "scopes = []", 1): "must be a list of scopes",
        API.replace('rights = "write"', 'rights = "admin"', 1): "must be one of read, write",
        API.replace('order = ["total"]', 'nothing = ["total"]'): "no chart of this document",
        API.replace('order = ["total"]', 'order = ["_event"]'): "datamodel field names",
        API.replace("TEST_API_READER", "TEST_API_WRITER"): "the same token as",
        API.replace("poll = 0.05", "poll = 0.05\nwait = 3"): "unknown key",
    }
    for text, message in refused.items():
        path = _config(tmp_path, fresh_database, text)
        with pytest.raises(ServiceConfigError, match=message) as raised:
            load(path)
        assert WRITER not in str(raised.value)
