"""Signals to the child processes the tests start with :mod:`asyncio`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal


def signal_child(process: asyncio.subprocess.Process, signum: int = signal.SIGKILL) -> None:
    """Send ``signum`` (SIGKILL by default) to ``process`` unless its exit is known.

    Not :meth:`~asyncio.subprocess.Process.send_signal` nor ``kill``: on Python 3.11
    those poll the child first (:meth:`subprocess.Popen.poll`), which reaps a child that
    exited an instant before out from under the event loop's child watcher; the watcher
    then reports the exit as 255, and a test that killed a process which had just
    finished reads a failure. The kernel keeps the pid of an exited child until it is
    reaped, so a signal sent to it here reaches that child or, exited, nothing.
    """
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)
