"""A parcel's life through ``statifier serve``, on SQLite, over loopback.

The service (:mod:`statifier.service`) runs in this process on a configuration file of
its own: a carrier's webhook, a depot's form and a BasicHTTP front, the timer worker
and the outbox drain. A carrier's scan posted to the webhook opens the parcel's
execution, which arms a one-second "overdue" timer and learns its own BasicHTTP
location; a note posted through the form lands on the same execution (the form's
scope comes from the service, never from the post); the timer fires and the parcel is
reported overdue; the driver's scanner posts ``delivered`` to the execution's location
and the parcel finishes. Each report is a route send, an outbox row drained to the
warehouse's sink after the step that wrote it committed. Then the service stops the
way SIGTERM stops it.

``statifier demo`` runs it; so can you:

>>> import asyncio, io, tempfile
>>> from pathlib import Path
>>> out = io.StringIO()
>>> asyncio.run(run(Path(tempfile.mkdtemp()), out))
0
>>> "parcel.delivered" in out.getvalue()
True
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TextIO

from statifier.durable import Durable
from statifier.extras import MissingExtra
from statifier.persistence.sql import SqlAdapter
from statifier.router import OutboxDrain, OutboxMessage, Router, address, ledger
from statifier.service import Service, load, router_config

try:
    import httpx
except ModuleNotFoundError as missing:  # httpx: the http extra
    raise MissingExtra.of(missing) from missing

__all__ = ["CHART", "CONFIG", "run", "warehouse"]

SCOPE: Final = "depot_7"

CHART: Final = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="in_transit">
  <datamodel>
    <data id="parcel_id" expr="null"/>
    <data id="note" expr="null"/>
  </datamodel>
  <state id="in_transit">
    <onentry><send id="overdue" event="parcel.overdue" delay="1s"/></onentry>
    <transition event="parcel.scanned">
      <assign location="parcel_id" expr="_event.data.parcel_id"/>
    </transition>
    <transition event="note.added">
      <assign location="note" expr="_event.data.note"/>
    </transition>
    <transition event="parcel.overdue" target="overdue"/>
    <transition event="delivered" target="delivered"/>
  </state>
  <state id="overdue">
    <onentry>
      <send type="depot:route" target="reports" event="parcel.overdue">
        <param name="parcel_id" expr="parcel_id"/>
      </send>
    </onentry>
    <transition event="delivered" target="delivered"/>
  </state>
  <final id="delivered">
    <onentry>
      <send type="depot:route" target="reports" event="parcel.delivered">
        <param name="parcel_id" expr="parcel_id"/>
        <param name="note" expr="note"/>
      </send>
    </onentry>
  </final>
</scxml>
"""

CONFIG: Final = """\
migrate = true
shutdown_timeout = 5
send_type = "depot:route"

[database]
url = "sqlite:///{database}"

[http]
port = {port}

[documents]
parcel = "parcel.scxml"

[[bindings]]
id = "scans_to_parcel"
source = "carrier"
match = 'event.kind == "scan"'
key = "event.parcel_id"
document = "parcel"
event = "parcel.scanned"
data = ["parcel_id"]

[[bindings]]
id = "notes_to_parcel"
source = "depot_form"
match = "true"
key = "event.parcel_id"
document = "parcel"
event = "note.added"
create = "never"
data = ["note"]

[routes.reports]
queue = "warehouse"

[sinks.warehouse]
call = "statifier.examples.parcel_service:warehouse"

[fronts.webhook.carrier]
path = "/hooks/carrier"
source = "carrier"
scope = "{scope}"
provider_id_header = "X-Delivery-Id"

[fronts.form.depot]
path = "/forms/notes"
source = "depot_form"
scope = "{scope}"

[fronts.basichttp.parcels]
path = "/scxml"
base_url = "http://127.0.0.1:{port}/scxml"

[timers]
poll = 0.1

[outbox]
idle = 0.1
"""


async def warehouse(message: OutboxMessage) -> None:
    """The warehouse's sink: it takes every report (a real one would POST it, with
    ``message.key`` as its idempotency key)."""


def _free_port() -> int:
    # The BasicHTTP front's base URL names the port, so it is chosen before the file
    # is written.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _until(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - it polls the database
            await asyncio.sleep(0.05)


async def run(directory: Path, out: TextIO) -> int:
    """Write the service's files into ``directory``, run it, drive one parcel through
    its fronts over loopback, stop it; returns the service's exit status."""
    port = _free_port()
    database = directory / "parcels.db"
    (directory / "parcel.scxml").write_text(CHART)
    config_file = directory / "statifier.toml"
    config_file.write_text(CONFIG.format(database=database, port=port, scope=SCOPE))
    settings = load(config_file)
    service = Service(settings)
    serving = asyncio.create_task(service.run())

    async def listening() -> bool:
        if serving.done():
            serving.result()
        return service.address is not None

    await _until(listening)
    base = f"http://127.0.0.1:{port}"
    out.write(f"  statifier serve {config_file.name}: listening on {base}\n\n")
    adapter = SqlAdapter(f"sqlite:///{database}")
    router = Router(router_config(settings, adapter))
    drain = OutboxDrain(router.storage, {})
    try:
        async with httpx.AsyncClient(base_url=base) as client:
            scan = {"kind": "scan", "parcel_id": "p_1042771", "depot": "north"}
            posted = await client.post(
                "/hooks/carrier", json=scan, headers={"X-Delivery-Id": "dlv_1"}
            )
            out.write(f"  POST /hooks/carrier  {json.dumps(scan)}  -> {posted.status_code}\n")
            again = await client.post(
                "/hooks/carrier", json=scan, headers={"X-Delivery-Id": "dlv_1"}
            )
            out.write(f"  POST /hooks/carrier  (the carrier retries)  -> {again.status_code}\n")
            note = {"parcel_id": "p_1042771", "note": "leave at the back door"}
            posted = await client.post("/forms/notes", data=note)
            out.write(f"  POST /forms/notes    {json.dumps(note)}  -> {posted.status_code}\n")
            found = await address(router, SCOPE, "parcel", "p_1042771")
            assert found is not None
            assert found.execution_id is not None
            execution_id = found.execution_id
            async with Durable(adapter, charts={"parcel": CHART}) as durable:

                async def overdue() -> bool:
                    described = await durable.describe(execution_id)
                    return described.configuration == ("overdue",)

                await _until(overdue)
                out.write("  ... one second later the overdue timer fired: the parcel is overdue\n")
                location = await router.location(execution_id)
                assert location is not None
                token = location.removeprefix(f"{base}/scxml/")
                posted = await client.post(
                    location,
                    content=b"_scxmleventname=delivered",
                    headers={"Content-Type": "application/x-www-form-urlencoded"},
                )
                shown = f"/scxml/{token[:4]}..."  # a location is a secret: never shown whole
                out.write(f"  POST {shown} (its BasicHTTP location)  delivered -> ")
                out.write(f"{posted.status_code}\n")

                async def drained() -> bool:
                    return len(await drain.rows(state="sent")) == 2

                await _until(drained)
                described = await durable.describe(execution_id)
                out.write(f"\n  execution {execution_id}: {described.status.value}")
                out.write(f" in {described.final_state}\n  input log:\n")
                for number, logged in enumerate(described.inputs):
                    if logged.event is not None:
                        out.write(f"    {number} {logged.event.name}\n")
        out.write("\n  ledger (binding, message id, outcome):\n")
        for row in await ledger(router):
            message = row.message_id or ""
            message = message if len(message) < 20 else message[:12] + "..."
            out.write(f"    {row.binding_id:<16} {message:<16} {row.spelled}\n")
        out.write("\n  outbox, drained to the warehouse after each commit:\n")
        for sent in await drain.rows(state="sent"):
            out.write(f"    {sent.queue}  {sent.event.name}  {dict(sent.event.data)}\n")
    finally:
        await adapter.close()
        service.stop()
    status = await serving
    out.write(f"\n  stopped as on SIGTERM: exit status {status}\n")
    return status
