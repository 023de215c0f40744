"""A sink for the serve processes of the tests, named by import path in their
configuration (``call = "tests.service.recording:record"``)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from statifier.router import OutboxMessage

RECORD_ENV = "STATIFIER_TEST_RECORD"


def record(message: OutboxMessage) -> None:
    """Append one JSON line per call to the file ``$STATIFIER_TEST_RECORD`` names: the
    row's key, the event's ``order``, this process's id and the system's monotonic
    time (which every process shares), flushed to disk before returning."""
    data = message.event.data
    order = data.get("order") if isinstance(data, dict) else None
    line = {"key": message.key, "order": order, "pid": os.getpid(), "at": time.monotonic()}
    with Path(os.environ[RECORD_ENV]).open("a", encoding="utf-8") as file:
        file.write(json.dumps(line) + "\n")
        file.flush()
        os.fsync(file.fileno())


async def stall(message: OutboxMessage) -> None:
    """Record the call as :func:`record` does, then never return (a sink that hangs)."""
    record(message)
    await asyncio.sleep(3600)
