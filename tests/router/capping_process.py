"""Routes jobs under a cap and makes held creates, for the caps' crash injection.

Usage: ``python capping_process.py URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none): a
server that imports and warms up once, prints ``ready``, then forks a working process
for each line it reads on its standard input, a JSON work: ``jobs``, the job names the
process works through in order, ``hits``, how many hits each job takes, and
``window``, how many jobs it has open at once. It answers ``forked PID``; the process
prints ``working PID`` once connected, ``fresh PID`` when it first sends a message
that is not a duplicate, and ``done PID`` at the end; the server prints
``exit PID CODE`` when it has exited (``-9`` when SIGKILLed). Forking, not starting an
interpreter for each, lets a test kill a process many times a second.

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
import json
import os
import select
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

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
from statifier.sql import TableOptions

SCOPE = "crash"
SOURCE = "jobs"
DOCUMENT = "job"
CAP = Cap(3, per=CapPer.SCOPE, over=OverLimit.HOLD)
LOCK_WAIT = 30.0
"""Generous: a slow, shared machine must not time a writer out while the other works."""
IDLE = 0.005
"""Seconds a process waits after a round in which it could only wait for slots."""
REAP = 0.01
"""Seconds between the server's looks for exited processes."""

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


def _say(line: str) -> None:
    """One line on the standard output, written at once (processes forked from one
    server share it)."""
    os.write(1, f"{line}\n".encode())


async def _work(url: str, options: TableOptions, spec: dict[str, object]) -> None:
    jobs = spec["jobs"]
    hits, window = spec["hits"], spec["window"]
    assert isinstance(jobs, list)
    assert isinstance(hits, int)
    assert isinstance(window, int)
    async with SqlAdapter(url, options) as adapter:
        router = router_of(adapter)
        await FlowWorker(router).held_creates()  # connected and warm
        _say(f"working {os.getpid()}")
        pid = os.getpid()
        await work(router, [str(job) for job in jobs], hits, window, lambda: _say(f"fresh {pid}"))
        _say(f"done {os.getpid()}")


def _forked(url: str, options: TableOptions, spec: dict[str, object]) -> NoReturn:
    """The forked process: do the work, then exit at once (0, or 1 with the error on
    the standard error), never returning into the server's loop."""
    code = 0
    try:
        asyncio.run(_work(url, options, spec))
    except BaseException:  # noqa: BLE001 - whatever it is, the test reads it
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _reap() -> None:
    """Report every forked process that has exited: ``exit PID CODE`` (``-9`` when
    SIGKILLed)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def serve(url: str, options: TableOptions) -> None:
    """Fork a working process for each line read (a JSON work), answering
    ``forked PID``; report each one's exit; stop at the end of the input."""
    compile_chart(JOB)  # the imports and the chart warm before any fork
    _say("ready")
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], REAP)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                spec = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _forked(url, options, spec)
                _say(f"forked {pid}")
        _reap()


def main(argv: list[str]) -> None:
    url, prefix, schema = argv
    serve(url, TableOptions(prefix=prefix, schema=None if schema == "-" else schema))


if __name__ == "__main__":
    main(sys.argv[1:])
