"""Routes keyed events through a debounce, batch or throttle binding and flushes what
it holds, for the flow modes' crash injection.

Usage: ``python -m tests.router.flow_process URL PREFIX SCHEMA``: a forking server
(:mod:`tests.router.forking_server`) whose work, a JSON line, names the ``mode``, the
``keys`` the process sends to and ``events``, how many each. Round ``n`` sends every
key's event ``n``, then runs a pass of the flow worker (which flushes the other
process's groups too). The process prints ``working PID`` once connected, ``fresh
PID`` when it first sends a message that is not a duplicate, and ``done PID`` at the
end.

The work is the same every time, message ids included (``KEY/N``): a process started
again after a kill sends everything again, and what the killed one sent answers
``duplicate``. The clock is the real one, the windows short, so groups come due while
the processes work.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Final

from tests.router.forking_server import say, serve

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    FlowWorker,
    InboundEvent,
    Mode,
    Router,
    RouterConfig,
    StaticResolver,
)

SCOPE = "crash"
SOURCE = "keys"
DOCUMENT = "tally"
LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the other works."""

TALLY = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="counting">
  <state id="counting"><transition event="tally"/></state>
</scxml>
"""
"""Takes every event; its input log is what was delivered."""

MODES: Final = {
    Mode.DEBOUNCE: {"window": timedelta(milliseconds=40), "max_wait": timedelta(milliseconds=150)},
    Mode.BATCH: {"batch": 3, "window": timedelta(milliseconds=60)},
    Mode.THROTTLE: {"batch": 2, "window": timedelta(milliseconds=60)},
}
"""Each mode's bounds: short enough that groups come due between rounds."""


def binding_of(mode: Mode) -> Binding:
    return Binding(
        id=f"keys_{mode.value}",
        source=SOURCE,
        match="true",
        key="event.key",
        document=DOCUMENT,
        event="tally",
        data=("key", "n"),
        mode=mode,
        **MODES[mode],  # type: ignore[arg-type]
    )


def router_of(adapter: SqlAdapter, mode: Mode) -> Router:
    """The router the test and this process route with, on the storage's real clock."""
    config = RouterConfig(
        adapter,
        bindings=[binding_of(mode)],
        resolver=StaticResolver({DOCUMENT: compile_chart(TALLY)}),
        lock_wait=LOCK_WAIT,
    )
    return Router(config)


def message_id(key: str, n: int) -> str:
    """The message id of the key's event ``n``: the same in every process."""
    return f"{key}/{n}"


async def send(router: Router, key: str, n: int) -> str:
    """Route the key's event ``n``; answer its binding's outcome."""
    event = InboundEvent(
        scope=SCOPE, source=SOURCE, message_id=message_id(key, n), data={"key": key, "n": n}
    )
    routed = await router.route(event)
    return routed.outcomes[0].outcome


async def _work(adapter: SqlAdapter, spec: dict[str, object]) -> None:
    mode, keys, events = spec["mode"], spec["keys"], spec["events"]
    assert isinstance(mode, str)
    assert isinstance(keys, list)
    assert isinstance(events, int)
    router = router_of(adapter, Mode(mode))
    worker = FlowWorker(router)
    await worker.totals()  # connected and warm
    pid = os.getpid()
    say(f"working {pid}")
    fresh = False
    for n in range(1, events + 1):
        for key in keys:
            if await send(router, str(key), n) != "duplicate" and not fresh:
                fresh = True
                say(f"fresh {pid}")
        await worker.flush_due()
    say(f"done {pid}")


if __name__ == "__main__":
    compile_chart(TALLY)  # the imports and the chart warm before any fork
    serve(sys.argv[1:], _work)
