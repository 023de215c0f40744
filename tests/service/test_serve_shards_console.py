"""``statifier serve`` with ``[console]`` over three SQLite stores (``[database]
shards``): the console lists every store's executions, pauses one in its own store
(the audit row there), and serves its held events and revisions pages there."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from tests.service.helpers import HITS, running, write_config
from tests.service.test_serve_shards import KEYS, _body, _ready, _router

from statifier.console.audit import Audit
from statifier.fronts.table_source import append_events
from statifier.persistence import Status
from statifier.persistence.sql import SqlAdapter
from statifier.router import InboundEvent
from statifier.service import load
from statifier.sql import TableOptions

OPERATOR = "ops-token-" + "o" * 24


@pytest.mark.asyncio
async def test_the_console_over_three_stores_lists_them_all_and_acts_in_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPS_TOKEN", OPERATOR)
    console = '[console.operators.ops]\ntoken_env = "OPS_TOKEN"\nrole = "operator"\n'
    config = write_config(tmp_path, _body(tmp_path, console), {"hits": HITS})
    settings = load(config)
    adapters = [SqlAdapter(url, TableOptions(prefix="t_")) for url in settings.database.urls]
    try:
        async with (
            running(config) as (_, base),
            httpx.AsyncClient(base_url=base, timeout=5.0) as client,
        ):
            await _ready(client, base)
            router = _router(settings, adapters)
            events = [
                InboundEvent(scope="web", source="clicks", message_id=f"c{n}", data={"key": key})
                for n, key in enumerate(KEYS)
            ]
            await append_events(adapters[0], events, partition="0")
            async with asyncio.timeout(30):
                while True:
                    held = [await each.storage.list_executions() for each in router.routers]
                    if sum(len(records) for records in held) == len(KEYS):
                        break
                    await asyncio.sleep(0.05)
            assert all(held)  # every store holds some
            login = await client.post("/console/login", data={"token": OPERATOR})
            assert login.status_code == 303, login.text
            listed = await client.get("/console/executions?size=100")
            assert listed.status_code == 200, listed.text
            shown = re.findall(r'<tr data-execution-id="([^"]+)"', listed.text)
            assert sorted(shown) == sorted(r.id for records in held for r in records)
            (paused, *_) = held[2]
            path = f"/console/executions/{paused.id}/pause"
            form = await client.get(path)
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf is not None
            answer = await client.post(path, data={"csrf": csrf.group(1)})
            assert answer.status_code == 303, answer.text
            record = await router.routers[2].storage.fetch_execution(paused.id)
            assert record.status is Status.PAUSED
            for number, each in enumerate(router.routers):
                audit = Audit(each.adapter.engine, each.adapter.tables)
                rows = [(r.action, r.target) for r in (await audit.entries()).rows]
                assert rows == ([("pause", paused.id)] if number == 2 else []), number
            audit_page = await client.get("/console/audit")
            assert paused.id in audit_page.text
            for path in ("/console/revisions", "/console/held"):
                served = await client.get(path)
                assert served.status_code == 200, (path, served.text)
    finally:
        for adapter in adapters:
            await adapter.close()
