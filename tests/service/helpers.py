"""Helpers of the service's tests: configuration files, the charts they name, and
``statifier serve`` started as a real process."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tests.child_processes import signal_child
from tests.persistence.conftest import FreshDatabase
from tests.service.recording import RECORD_ENV

from statifier.service import Service, load

ROOT = Path(__file__).resolve().parents[2]
"""The repository: on the serve processes' path (its ``src`` first, so that they run
this checkout's code whatever the environment installed), so ``tests.service.recording``
imports there."""
START_TIMEOUT = 60.0
_LISTENING = re.compile(rb"listening on http://([^:]+):(\d+)")

HITS = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="hits" expr="0"/></datamodel>
  <state id="open">
    <transition event="hit"><assign location="hits" expr="hits + 1"/></transition>
  </state>
</scxml>"""
"""A counter: every ``hit`` adds one, for ever."""

ORDER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="waiting">
  <datamodel><data id="order" expr="null"/></datamodel>
  <state id="waiting">
    <transition event="order.placed" target="placed">
      <assign location="order" expr="_event.data.order"/>
      <send event="order.due" delay="1s"/>
    </transition>
  </state>
  <state id="placed">
    <transition event="order.due" target="done">
      <send type="test:route" target="finished" event="order.finished">
        <param name="order" expr="order"/>
      </send>
    </transition>
  </state>
  <final id="done"/>
</scxml>"""
"""An order: placed, then a timer a second later hands it to the ``finished`` route
(an outbox queue) and ends it."""

HITS_BINDING = """
[[bindings]]
id = "hits"
source = "clicks"
match = "true"
key = "event.key"
document = "hits"
event = "hit"
"""

ORDER_BINDING = """
[[bindings]]
id = "orders"
source = "shop"
match = "true"
key = "event.order"
document = "order"
event = "order.placed"
data = ["order"]
"""


def database_table(database: FreshDatabase) -> str:
    """The ``[database]`` table of ``database``."""
    schema = "" if database.schema is None else f'schema = "{database.schema}"\n'
    return f'[database]\nurl = "{database.url}"\nprefix = "t_"\n{schema}'


def write_config(directory: Path, body: str, charts: dict[str, str] | None = None) -> Path:
    """``directory/statifier.toml`` holding ``body``, with ``charts/NAME.scxml`` for
    each chart (``charts = "charts"`` is for the body to say)."""
    folder = directory / "charts"
    folder.mkdir(exist_ok=True)
    for name, chart in (charts or {}).items():
        (folder / f"{name}.scxml").write_text(chart, encoding="utf-8")
    path = directory / "statifier.toml"
    path.write_text(body, encoding="utf-8")
    return path


@dataclass
class Served:
    """A running ``statifier serve`` process and where it listens."""

    process: asyncio.subprocess.Process
    url: str
    log: Path

    def signal(self, signum: signal.Signals) -> None:
        signal_child(self.process, signum)

    async def wait(self, seconds: float) -> int:
        return await asyncio.wait_for(self.process.wait(), seconds)

    def stderr(self) -> str:
        return _text(self.log)


def _text(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")


_UNDER_LIMIT = (
    "import resource, runpy, sys; limit = int(sys.argv.pop(1)); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)); "
    "sys.argv[0] = 'statifier'; runpy.run_module('statifier.cli', run_name='__main__')"
)
"""``statifier`` run with its descriptor limit (soft and hard) set to ``argv[1]``."""


async def start_serve(
    config: Path, log: Path, record: Path | None = None, *, max_files: int | None = None
) -> Served:
    """Start ``statifier serve config`` (its stderr to ``log``) and wait until it says
    where it listens; with ``max_files``, under that descriptor limit.

    Raises:
        AssertionError: it exited or said nothing in time (with its stderr).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    if record is not None:
        env[RECORD_ENV] = str(record)
    command = ["-m", "statifier.cli"] if max_files is None else ["-c", _UNDER_LIMIT, str(max_files)]
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *command,
            "serve",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env=env,
        )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT)
    except TimeoutError:
        signal_child(process)
        await process.wait()
        line = b""
    found = _LISTENING.search(line)
    if found is None:
        await process.wait()
        raise AssertionError(f"serve did not start: {line!r}\n{_text(log)}")
    host, port = found.group(1).decode(), found.group(2).decode()
    return Served(process, f"http://{host}:{port}", log)


@contextlib.asynccontextmanager
async def running(config: Path) -> AsyncIterator[tuple[Service, str]]:
    """The service ``config`` names, run in this process until the block ends; answers
    it and its base URL. Leaving the block stops it and checks it exited 0."""
    service = Service(load(config), io.StringIO())
    task = asyncio.create_task(service.run())
    while service.address is None:
        if task.done():
            task.result()  # raises why it stopped
            raise AssertionError("the service stopped before it listened")
        await asyncio.sleep(0.02)
    try:
        yield service, f"http://{service.address[0]}:{service.address[1]}"
    finally:
        service.stop()
        status = await asyncio.wait_for(task, 30)
    assert status == 0


async def until(condition: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    """Wait until ``condition()`` holds, at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.05)
