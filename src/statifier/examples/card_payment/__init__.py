"""A card payment as a durable execution: authorize it, capture it before its capture
window closes, settle it, across simulated restarts.

No process holds the chart between calls. Everything that must survive lives in the
storage (the chart, the execution, its input log) or in the host's own tables (the
payment gateway's idempotency keys and the timer table here). Each "restart" drops
every object but the storage's database and the host's tables, and continues from the
execution id alone.

Run it on SQLite with ``python -m statifier.examples.card_payment`` (``statifier
demo`` runs it too), or on any storage:

>>> import asyncio, io
>>> from statifier.persistence import MemoryAdapter, Storage
>>> adapter = MemoryAdapter()
>>> out = io.StringIO()
>>> record = asyncio.run(run(lambda: Storage(adapter), out))
>>> record.status.value, record.failure
('completed', None)
>>> "replayed from its input log to the same position: True" in out.getvalue()
True
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TextIO

from statifier.chart import compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.positions import dump
from statifier.examples import read
from statifier.persistence import (
    Driver,
    EffectContext,
    ExecutionRecord,
    Stepped,
    Storage,
    decode_outcome,
)
from statifier.persistence.driver import Answer, Answered
from statifier.persistence.executions import logged_start

__all__ = ["TRANSACTION", "Host", "run", "run_on_sqlite"]

TRANSACTION: Final = "txn_01H8"
"""The execution id: the transaction's own key, chosen by the host."""


@dataclass
class Host:
    """The host's side: a payment gateway that is idempotent on effect keys, and a
    table of armed timers. In a real host both are rows of its own database."""

    gateway_calls: dict[str, str] = field(default_factory=dict)
    gateway_performed: int = 0
    timers: dict[str, str] = field(default_factory=dict)
    settlements_requested: list[str] = field(default_factory=list)

    def dispatch(self, invoke: fx.Invoke, context: EffectContext) -> Answer | None:
        """Perform an ``<invoke>``: authorization answers at once; settlement is
        asynchronous (the gateway calls back later, through ``Driver.answer``)."""
        if invoke.type == "myapp:authorize":
            return Answered({"authorization": self._gateway(context.key, "auth")})
        self.settlements_requested.append(self._gateway(context.key, "stl"))
        return None

    def effects(self, effect: fx.Effect, context: EffectContext) -> None:
        """Keep the timer table: arm on a delayed send, disarm on its cancel."""
        if isinstance(effect, fx.SendDelayed):
            self.timers[effect.send_id] = f"{effect.event} in {effect.delay_ms // 86_400_000}d"
        elif isinstance(effect, fx.Cancel):
            self.timers.pop(effect.send_id, None)

    def _gateway(self, key: str, kind: str) -> str:
        # Effects are delivered at least once; the key makes the side effect happen once.
        if key not in self.gateway_calls:
            self.gateway_performed += 1
            self.gateway_calls[key] = f"{kind}_{self.gateway_performed}"
        return self.gateway_calls[key]


def _options() -> StartOptions:
    return StartOptions(
        datamodel={"amount": 4200},
        invoke_types=frozenset({"myapp:authorize", "myapp:settle"}),
    )


async def run(make_storage: Callable[[], Storage], out: TextIO) -> ExecutionRecord:
    """Run the payment through two restarts; ``make_storage`` opens the storage anew
    each time (as a new process would). Writes what happens to ``out`` and returns the
    final execution record."""
    host = Host()

    def boot() -> Driver:
        return Driver(
            make_storage(), dispatch=host.dispatch, effects=host.effects, options=_options()
        )

    def show(label: str, record: ExecutionRecord, leaves: tuple[str, ...]) -> None:
        where = ", ".join(leaves) or "(finished)"
        out.write(f"  {label}: {record.status.value}, in {where}\n")

    driver = boot()
    machine = compile_chart(read("card_payment/chart.scxml"), name="card_payment", version="1")
    created = await driver.create(TRANSACTION, machine)
    show("created, authorized at once", created.execution, created.state.leaf_configuration())
    out.write(f"  host timers: {host.timers}\n")

    async def restart(label: str) -> Driver:
        out.write(f"  -- {label}: every object is dropped; only the database remains --\n")
        fresh = boot()
        record = await fresh.storage.fetch_execution(TRANSACTION)
        rebooted = await fresh.storage.machine(record.content_hash)
        state = fresh.storage.load(record, rebooted)
        show("reloaded from the execution id", record, state.leaf_configuration())
        return fresh

    driver = await restart("restart 1")
    captured = await driver.send_event(TRANSACTION, Event("capture.requested"))
    assert isinstance(captured, Stepped), "the payment is active until it settles"
    show("capture requested", captured.execution, captured.state.leaf_configuration())
    out.write(f"  host timers: {host.timers} (the capture window was disarmed)\n")
    out.write(f"  settlement requested from the gateway: {host.settlements_requested}\n")

    driver = await restart("restart 2")
    settled = await driver.answer(
        TRANSACTION, "settle", Answered({"settlement": host.settlements_requested[-1]})
    )
    record = settled.execution
    show("the gateway called back", record, ())
    out.write(f"  donedata: {json.dumps(decode_outcome(record), sort_keys=True)}\n")
    out.write(f"  gateway side effects performed: {host.gateway_performed} (one per key)\n")

    inputs = await driver.executions.inputs(TRANSACTION)
    out.write("  input log:\n")
    for entry in inputs:
        name = entry.event.name if entry.event else "(closed)"
        out.write(f"    {entry.seq} {entry.via:<6} {name}\n")
    start, logged = logged_start(inputs, replace(_options(), session_id=TRANSACTION))
    state, _ = initialize(machine, start)
    for entry in logged:
        if entry.event is not None:
            state, _ = handle_event(state, entry.event)
    same = dump(state) == record.position
    out.write(f"  replayed from its input log to the same position: {same}\n")
    return record


async def run_on_sqlite(path: Path, out: TextIO) -> ExecutionRecord:
    """:func:`run` on a SQLite database at ``path`` (created and migrated if new); each
    restart opens it afresh. Needs the ``sql`` extra."""
    from statifier.persistence.sql import SqlAdapter
    from statifier.sql import migrations

    url = f"sqlite:///{path}"
    migrations.upgrade(url)
    adapters: list[SqlAdapter] = []

    def open_storage() -> Storage:
        adapter = SqlAdapter(url)
        adapters.append(adapter)
        return Storage(adapter)

    try:
        return await run(open_storage, out)
    finally:
        for adapter in adapters:
            await adapter.close()
