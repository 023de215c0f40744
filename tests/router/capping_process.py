"""Routes jobs under a cap and makes held creates, for the caps' crash injection.

Usage: ``python -m tests.router.capping_process URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none): a
forking server (:mod:`tests.router.forking_server`) whose work, a JSON line, names
``jobs``, the job names the process works through in order, ``hits``, how many hits
each job takes, and ``window``, how many jobs it has open at once. The process prints
``working PID`` once connected, ``fresh PID`` when it first sends a message that is
not a duplicate, and ``done PID`` at the end.

The work is the same every time, message ids included: a process started again after
a kill sends everything again from the first job, and what the killed one had sent
answers ``duplicate``. Each round sends the next hit of every open job (the first hit
creates the job's execution, or is held with the later ones behind it while the cap is
full); a job whose hits are all sent is closed once its execution exists (before, the
close, on a binding that never creates, would find none and be lost), which ends the
execution and frees its slot; while a job waits for its execution, a pass of the flow
worker makes what the cap holds, the other process's jobs too.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

from tests.router.forking_server import say, serve

from statifier.chart import compile_chart
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    Cap,
    CapPer,
    Create,
    FlowWorker,
    InboundEvent,
    OverLimit,
    Router,
    RouterConfig,
    StaticResolver,
    address,
)

SCOPE = "crash"
SOURCE = "jobs"
DOCUMENT = "job"
CAP = Cap(3, per=CapPer.SCOPE, over=OverLimit.HOLD)
LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the other works."""
IDLE = 0.005
"""Seconds a process waits after a round in which it could only wait for slots."""

JOB = b"""<scxml xmlns="http://www.w3.org/2005/07/scxml" version="1.0" initial="running">
  <datamodel><data id="n" expr="0"/></datamodel>
  <state id="running">
    <transition event="job.hit"><assign location="n" expr="n + 1"/></transition>
    <transition event="job.close" target="closed"/>
  </state>
  <final id="closed"/>
</scxml>
"""
"""A job: hits counted until a close ends it."""

HITS = Binding(
    id="hits",
    source=SOURCE,
    match="event.kind == 'hit'",
    key="event.job",
    document=DOCUMENT,
    event="job.hit",
    data=("job", "n"),
)
CLOSES = Binding(
    id="closes",
    source=SOURCE,
    match="event.kind == 'close'",
    key="event.job",
    document=DOCUMENT,
    event="job.close",
    create=Create.NEVER,
)


def router_of(adapter: SqlAdapter) -> Router:
    """The router both the test and this process route the jobs with, on the storage's
    real clock (the times of creates and ends are compared across processes)."""
    config = RouterConfig(
        adapter,
        bindings=[HITS, CLOSES],
        resolver=StaticResolver({DOCUMENT: compile_chart(JOB)}),
        caps={DOCUMENT: CAP},
        lock_wait=LOCK_WAIT,
    )
    return Router(config)


def message_id(job: str, kind: str, n: int) -> str:
    """The message id of a job's hit ``n`` (or its close, ``n`` 0): the same in every
    process, so that a resent message is a duplicate."""
    return f"{job}/{kind}/{n}"


async def send(router: Router, job: str, kind: str, n: int = 0) -> str:
    """Route a job's hit ``n`` or its close; answer the outcome of its binding."""
    data: dict[str, object] = {"kind": kind, "job": job}
    if kind == "hit":
        data["n"] = n
    event = InboundEvent(scope=SCOPE, source=SOURCE, message_id=message_id(job, kind, n), data=data)
    routed = await router.route(event)
    return next(o.outcome for o in routed.outcomes if o.outcome != "no_match")


async def exists(router: Router, job: str) -> bool:
    """Whether the job's execution was created (its held create made)."""
    return await address(router, SCOPE, DOCUMENT, job) is not None


async def work(
    router: Router, jobs: list[str], hits: int, window: int, news: Callable[[], None]
) -> None:
    """Send every job's hits and close, ``window`` jobs open at once, making held
    creates while a job waits for its execution; call ``news`` once, when a message
    is first not a duplicate (what an earlier process sent has all been sent again)."""
    worker = FlowWorker(router)
    fresh = False

    async def sent(job: str, kind: str, n: int = 0) -> None:
        nonlocal fresh
        if await send(router, job, kind, n) != "duplicate" and not fresh:
            fresh = True
            news()

    upcoming = list(reversed(jobs))
    opened: dict[str, int] = {}  # an open job: the next hit it is sent
    while upcoming or opened:
        while upcoming and len(opened) < window:
            opened[upcoming.pop()] = 1
        waiting = False
        for job, n in list(opened.items()):
            if n <= hits:
                await sent(job, "hit", n)
                opened[job] = n + 1
            elif await exists(router, job):
                await sent(job, "close")
                del opened[job]
            else:
                waiting = True
        if waiting:
            made = await worker.flush_due()
            if not any(report.delivered for report in made):
                await asyncio.sleep(IDLE)


async def _work(adapter: SqlAdapter, spec: dict[str, object]) -> None:
    jobs = spec["jobs"]
    hits, window = spec["hits"], spec["window"]
    assert isinstance(jobs, list)
    assert isinstance(hits, int)
    assert isinstance(window, int)
    router = router_of(adapter)
    await FlowWorker(router).held_creates()  # connected and warm
    pid = os.getpid()
    say(f"working {pid}")
    await work(router, [str(job) for job in jobs], hits, window, lambda: say(f"fresh {pid}"))
    say(f"done {pid}")


if __name__ == "__main__":
    compile_chart(JOB)  # the imports and the chart warm before any fork
    serve(sys.argv[1:], _work)
