"""Drives one parent with five durable children from a process of its own, for the
crash test of children's answers.

Usage: ``python answering_parent.py URL PREFIX SCHEMA PARENT_ID KILL_AT`` (``SCHEMA``
``-`` for none). The parent runs a fan-out of five children (``<parent>/each/<i>``) beside
a single durable child (``<parent>/solo``); each call below is idempotent, so a process
killed anywhere is followed by another that takes up where the store says: create the
parent, start the five children, send each child and the single one the event that ends
it, redrive owed answers, and print ``done`` once the parent completed. With
``KILL_AT`` above 0 the process kills itself (SIGKILL) after that many storage adapter
calls: inside a transaction, between one and the next, or just after a commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.persistence import EffectContext, MemoryAdapter, Status, Storage
from statifier.persistence.driver import Driver
from statifier.persistence.errors import ExecutionExists
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions
from statifier.telemetry import attach

CHILDREN = 5
ITEM = (
    '<scxml initial="w"><state id="w"><transition event="ok" target="ok"/></state>'
    '<final id="ok"><donedata><param name="ok" expr="1"/></donedata></final></scxml>'
)
SOLO = (
    '<scxml initial="w"><state id="w"><transition event="go" target="done"/></state>'
    '<final id="done"><donedata><param name="solo" expr="2"/></donedata></final></scxml>'
)
PARENT = compile_chart(
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="work">'
    '<parallel id="work">'
    '<state id="fan" initial="fanning"><state id="fanning">'
    f'<invoke id="each" type="myapp:map"><content>{ITEM}</content></invoke>'
    '<transition event="done.invoke.each" target="fanned"/></state>'
    '<final id="fanned"/></state>'
    '<state id="single" initial="waiting"><state id="waiting">'
    f'<invoke id="solo" type="scxml"><content>{SOLO}</content></invoke>'
    '<transition event="done.invoke.solo" target="answered"/></state>'
    '<final id="answered"/></state>'
    '<transition event="done.state.work" target="end"/>'
    "</parallel>"
    '<final id="end"/></scxml>'
)


async def fan_effect() -> fx.Invoke:
    """The fan-out's ``<invoke>`` as the parent's step emits it (a job runner would
    have it from the dispatch), read off a throwaway run in memory."""
    seen: list[fx.Invoke] = []

    def dispatch(invoke: fx.Invoke, context: EffectContext) -> None:
        seen.append(invoke)

    await Driver(Storage(MemoryAdapter()), dispatch=dispatch).create("probe", PARENT)
    return seen[0]


def kill_after(calls: int) -> None:
    """SIGKILL this process once ``calls`` adapter calls have returned."""
    made = [0]

    def count(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        made[0] += 1
        if made[0] >= calls:
            os.kill(os.getpid(), signal.SIGKILL)

    attach("crash", "statifier.persistence.adapter", count)


async def _main(url: str, prefix: str, schema: str, parent: str, kill_at: int) -> None:
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    effect = await fan_effect()
    if kill_at > 0:
        kill_after(kill_at)
    async with SqlAdapter(url, options) as adapter:
        # The fan-out's answer comes from its children, not from a dispatch.
        driver = Driver(Storage(adapter), dispatch=lambda invoke, context: None, lock_wait=30.0)
        with contextlib.suppress(ExecutionExists):
            await driver.create(parent, PARENT)
        for index in range(CHILDREN):
            await driver.start_child_at(parent, effect, index, CHILDREN)
        for index in range(CHILDREN):
            await driver.send_event(f"{parent}/each/{index}", Event("ok"))
        await driver.send_event(f"{parent}/solo", Event("go"))
        while await driver.redrive_answers(limit=3):
            pass
        record = await driver.storage.fetch_execution(parent)
        print("done" if record.status is Status.COMPLETED else record.status.value)


if __name__ == "__main__":
    url, prefix, schema, parent, kill_at = sys.argv[1:]
    asyncio.run(_main(url, prefix, schema, parent, int(kill_at)))
