"""Steps one durable execution from a process of its own, for the crash test.

Usage: ``python crashing_stepper.py URL PREFIX SCHEMA KEYS_FILE CRASH`` (``SCHEMA`` ``-``
for none). Creates the execution ``txn`` of the test chart if it does not exist, then
steps ``capture.requested``, appending each effect's key to ``KEYS_FILE`` as the
executor is handed it. With ``CRASH`` ``1`` the process kills itself (SIGKILL) once the
step's last effect was handed over, before the new position is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.core import effects as fx
from statifier.persistence import EffectContext, Executions, Storage
from statifier.persistence.errors import ExecutionExists
from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="awaiting">
  <state id="awaiting">
    <onexit><log label="leaving" expr="1"/></onexit>
    <transition event="capture.requested" target="capturing">
      <log label="capture" expr="2"/>
    </transition>
  </state>
  <state id="capturing">
    <onentry><send event="capture.timeout" delay="1h"/><log label="entered" expr="3"/></onentry>
  </state>
</scxml>"""


async def _main(url: str, prefix: str, schema: str, keys: str, crash: bool) -> None:
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    machine = compile_chart(CHART)

    def executor(effect: fx.Effect, context: EffectContext) -> None:
        with open(keys, "a", encoding="utf-8") as handle:
            handle.write(f"{type(effect).__name__} {context.key}\n")
            handle.flush()
            os.fsync(handle.fileno())
        if crash and isinstance(effect, fx.Log) and effect.label == "entered":
            os.kill(os.getpid(), signal.SIGKILL)

    async with SqlAdapter(url, options) as adapter:
        storage = Storage(adapter)
        with contextlib.suppress(ExecutionExists):
            await Executions(storage).create("txn", machine)
        await Executions(storage, executor=executor).step(
            "txn", machine, Event("capture.requested")
        )
    print("stepped")


if __name__ == "__main__":
    url, prefix, schema, keys, crash = sys.argv[1:]
    asyncio.run(_main(url, prefix, schema, keys, crash == "1"))
