"""Impressions and clicks routed to one join per impression (:mod:`statifier.router`).

An ad server reports every impression it serves; a click tracker, a separate source,
reports every click. Both carry the impression id, so two bindings key them by it: an
impression opens an execution of the join, and a click on it lands on that same
execution and finishes it. The click binding never creates (``create = never``): a
click for an impression nobody served is recorded as ``dropped: no_execution`` and
opens nothing. A message delivered twice (a source redelivering after a lost
acknowledgement) is recorded as a ``duplicate`` and reaches no execution again.

The impression opens a 24-hour click window, a delayed send to the join itself (a row
of the durable timer queue). A click inside it cancels the window and hands the pair to
the ``joined_records`` route; a window that closes unclicked hands the impression to
``orphaned``. Both routes are queues of the built-in outbox, drained to a sink after
the commit: here, one that prints.

``statifier demo`` runs it on SQLite; so can you:

>>> import asyncio, io, tempfile
>>> from pathlib import Path
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'ads.db'}"
>>> rows = asyncio.run(run(url, io.StringIO()))
>>> [row.spelled for row in rows]  # doctest: +NORMALIZE_WHITESPACE
['created_and_delivered', 'created_and_delivered', 'created_and_delivered',
 'delivered', 'delivered', 'duplicate', 'dropped: no_execution']
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final, TextIO

from statifier.chart import compile_chart
from statifier.expr import Value
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Create,
    InboundEvent,
    LedgerRow,
    OutboxDrain,
    OutboxMessage,
    OutboxRoute,
    Router,
    RouterConfig,
    StaticResolver,
    TimerWorker,
    address,
    ledger,
)
from statifier.sql import migrations

__all__ = ["BINDINGS", "CHART", "DOCUMENT", "SCOPE", "run"]

DOCUMENT: Final = "impression_click_join"
SCOPE: Final = "demo"

CHART: Final = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
  <datamodel>
    <data id="impression_id" expr="null"/>
    <data id="url" expr="null"/>
  </datamodel>
  <state id="waiting">
    <transition event="impression.served" target="shown">
      <assign location="impression_id" expr="_event.data.impression_id"/>
      <send id="window" event="window.closed" delay="24h"/>
    </transition>
  </state>
  <state id="shown">
    <transition event="click.recorded" target="joined">
      <assign location="url" expr="_event.data.url"/>
      <cancel sendid="window"/>
      <send type="demo:route" target="joined_records" event="pair.joined">
        <param name="impression_id" expr="impression_id"/>
        <param name="url" expr="url"/>
      </send>
    </transition>
    <transition event="window.closed" target="orphaned">
      <send type="demo:route" target="orphaned" event="impression.orphaned">
        <param name="impression_id" expr="impression_id"/>
      </send>
    </transition>
  </state>
  <final id="joined"/>
  <final id="orphaned"/>
</scxml>"""
"""The join: waiting for its impression, then for a click within 24 hours; the click
ends it joined, the window's end orphaned."""

BINDINGS: Final = (
    Binding(
        id="impressions_to_join",
        source="ad_server",
        match="event.kind == 'impression'",
        key="event.impression_id",
        document=DOCUMENT,
        event="impression.served",
        data=("impression_id", "campaign"),
    ),
    Binding(
        id="clicks_to_join",
        source="click_tracker",
        match="event.kind == 'click'",
        key="event.impression_id",
        document=DOCUMENT,
        event="click.recorded",
        data=("impression_id", "url"),
        create=Create.NEVER,
    ),
)
"""Two sources, one document, one key: the impression id."""

_START: Final = datetime(2026, 9, 19, 8, 0, tzinfo=UTC)


def _impression(offset: int, impression_id: str) -> InboundEvent:
    data: dict[str, Value] = {
        "kind": "impression",
        "impression_id": impression_id,
        "campaign": "autumn",
    }
    return InboundEvent(
        scope=SCOPE, source="ad_server", message_id=f"ad_server/0/{offset}", data=data
    )


def _click(offset: int, impression_id: str) -> InboundEvent:
    data: dict[str, Value] = {
        "kind": "click",
        "impression_id": impression_id,
        "url": "https://example.com/autumn",
    }
    return InboundEvent(
        scope=SCOPE, source="click_tracker", message_id=f"click_tracker/0/{offset}", data=data
    )


async def run(url: str, out: TextIO) -> list[LedgerRow]:
    """Migrate the database at ``url``, route the demo's events, print the ledger and
    each join's status to ``out``; returns the ledger rows."""
    migrations.upgrade(url)
    events = [
        _impression(1, "imp_1"),
        _impression(2, "imp_2"),
        _impression(3, "imp_3"),  # never clicked: its window closes
        _click(1, "imp_1"),
        _click(2, "imp_2"),
        _click(1, "imp_1"),  # the click tracker redelivers a message: a duplicate
        _click(3, "imp_404"),  # a click for an impression never served
    ]
    clock = [_START]
    async with SqlAdapter(url) as adapter:
        outbox = OutboxRoute(adapter, clock=lambda: clock[0])
        config = RouterConfig(
            Storage(adapter, clock=lambda: clock[0]),
            bindings=BINDINGS,
            resolver=StaticResolver({DOCUMENT: compile_chart(CHART, name=DOCUMENT)}),
            send_type="demo:route",
            routes={
                "joined_records": (outbox, {"queue": "joined"}),
                "orphaned": (outbox, {"queue": "orphaned"}),
            },
            # The demo fires the timers itself, a virtual day later.
            timers_elsewhere=True,
        )
        router = Router(config)
        for minute, event in enumerate(events):
            clock[0] = _START + timedelta(minutes=minute)
            await router.route(event)
        rows = await ledger(router)
        _print_ledger(rows, out)
        clock[0] = _START + timedelta(hours=25)  # the virtual clock moves a day on
        fired = await TimerWorker(router).fire_due()
        out.write(f"\n  a day later: {fired} click window(s) closed by the timer queue\n")
        out.write("\n  outbox, drained after the commit:\n")

        def sink(message: OutboxMessage) -> None:
            out.write(f"    {message.queue:<9} {message.event.name:<20} {message.event.data}\n")

        await OutboxDrain(router.storage, {"joined": sink, "orphaned": sink}).drain_once()
        out.write("\n  joins:\n")
        for key in ("imp_1", "imp_2", "imp_3", "imp_404"):
            found = await address(router, SCOPE, DOCUMENT, key)
            if found is None:
                out.write(f"    {key:<8} no execution\n")
                continue
            record = await router.storage.fetch_execution(found.execution_id)
            out.write(f"    {key:<8} {record.status.value}\n")
    return rows


def _print_ledger(rows: Sequence[LedgerRow], out: TextIO) -> None:
    out.write("  ledger (binding, message id, outcome, key):\n")
    for row in rows:
        out.write(f"    {row.binding_id:<20} {row.message_id:<18} {row.spelled:<22} {row.key}\n")
