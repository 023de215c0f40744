"""A server that forks a working process for each line it reads, for the crash tests
that kill processes many times a second (forking, not starting an interpreter for each,
makes a process ready at once).

It imports and warms up once, prints ``ready``, then for each line on its standard
input (a JSON work) forks a process and answers ``forked PID``; the process runs the
work given to :func:`serve` and exits (0, or 1 with the error on the standard error);
the server prints ``exit PID CODE`` when one has exited (``-9`` when SIGKILLed). What a
work says meanwhile it says with :func:`say`.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import NoReturn

from statifier.persistence.sql import SqlAdapter
from statifier.sql import TableOptions

Work = Callable[[SqlAdapter, dict[str, object]], Awaitable[None]]
"""What a forked process does, on an adapter opened for it, given its JSON work."""

REAP = 0.01
"""Seconds between the server's looks for exited processes."""


def say(line: str) -> None:
    """One line on the standard output, written at once (processes forked from one
    server share it)."""
    os.write(1, f"{line}\n".encode())


async def _work(url: str, options: TableOptions, spec: dict[str, object], work: Work) -> None:
    async with SqlAdapter(url, options) as adapter:
        await work(adapter, spec)


def _forked(url: str, options: TableOptions, spec: dict[str, object], work: Work) -> NoReturn:
    """The forked process: do the work, then exit at once, never returning into the
    server's loop."""
    code = 0
    try:
        asyncio.run(_work(url, options, spec, work))
    except BaseException:  # noqa: BLE001 - whatever it is, the test reads it
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _reap() -> None:
    """Report every forked process that has exited."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def serve(argv: list[str], work: Work) -> None:
    """Given ``URL PREFIX SCHEMA`` (``SCHEMA`` ``-`` for none), fork a process running
    ``work`` for each line read; report each one's exit; stop at the end of the
    input."""
    url, prefix, schema = argv
    options = TableOptions(prefix=prefix, schema=None if schema == "-" else schema)
    say("ready")
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
                    _forked(url, options, spec, work)
                say(f"forked {pid}")
        _reap()
