"""The service's HTTP listener cannot be held down. As a real process under a
descriptor limit of 1,024: a connection trickling header bytes and 1,100 idle ones
leave ``/healthz`` and a webhook answering, and the log takes a few lines; a cap set
over what the limit allows makes accept fail, and the failures take one line per
interval, and the service answers again once the idle ones are closed. In process:
each deadline (the idle one, the request head's, after a response too), the cap
closing the connection waiting longest, and a newcomer answered 503 when every
connection is inside a request; the ``[http]`` keys."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import resource
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.child_processes import signal_child
from tests.service.helpers import (
    HITS,
    HITS_BINDING,
    Served,
    running,
    start_serve,
    write_config,
)

from statifier import telemetry
from statifier.service import ServiceConfigError, load
from statifier.service.listener import default_max_connections

LIMIT = 1024
"""The service process's descriptor limit in the tests that hold connections."""
HELD = 1100
STOP_TIMEOUT = 30.0


def served_config(directory: Path, http: str = "") -> Path:
    """A service on SQLite with a webhook front at ``/hooks/clicks``; ``http`` is more
    of its ``[http]`` table."""
    url = f"sqlite:///{directory / 'service.db'}"
    body = f"""
migrate = true
shutdown_timeout = 5
charts = "charts"
{HITS_BINDING}
[database]
url = "{url}"

[http]
port = 0
{http}

[fronts.webhook.clicks]
path = "/hooks/clicks"
source = "clicks"
scope = "web"
"""
    return write_config(directory, body, {"hits": HITS})


def client_files(needed: int) -> None:
    """Raise this process's own descriptor limit to hold ``needed`` connections.

    Raises:
        AssertionError: the hard limit does not allow it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    assert hard == resource.RLIM_INFINITY or hard >= needed, (
        f"the test needs {needed} descriptors and the hard limit is {hard}"
    )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@dataclass
class Held:
    """Connections opened and held without a request."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    readers: list[asyncio.StreamReader] = field(default_factory=list)
    refused: int = 0
    """Connections the client could not open (the kernel's queue was full)."""

    async def open(self, url: str, count: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        for _ in range(count):
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), 10
                )
            except (OSError, TimeoutError):
                self.refused += 1
                continue
            self.readers.append(reader)
            self.writers.append(writer)

    def closed_by_the_server(self) -> int:
        return sum(reader.at_eof() for reader in self.readers)

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for writer in self.writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def trickle(url: str, every: float, stop: asyncio.Event) -> bytes:
    """Send a request head a header line at a time, one each ``every`` seconds, until
    the server answers or closes, or ``stop``; answers what the server sent."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nhost: service\r\n")
        while not stop.is_set():
            writer.write(b"x-slow: " + b"a" * 3 + b"\r\n")
            with contextlib.suppress(TimeoutError):
                # What the server answered, or b"" when it closed.
                return await asyncio.wait_for(reader.read(4096), every)
        return b"still open"
    except OSError:
        return b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def healthz(url: str) -> int:
    """``/healthz`` on a connection of its own (5 s at most, failing otherwise)."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        return (await client.get(f"{url}/healthz")).status_code


async def post(url: str, key: str) -> int:
    async with httpx.AsyncClient(timeout=5.0) as client:
        return (await client.post(f"{url}/hooks/clicks/", json={"key": key})).status_code


@contextlib.asynccontextmanager
async def serving(config: Path, log: Path) -> AsyncIterator[Served]:
    """``statifier serve config`` under :data:`LIMIT` descriptors, killed on the way
    out if a failed test left it running."""
    served = await start_serve(config, log, max_files=LIMIT)
    try:
        yield served
    finally:
        if served.process.returncode is None:
            signal_child(served.process)
            await served.process.wait()


async def stop(served: Served) -> str:
    served.signal(signal.SIGTERM)
    assert await served.wait(STOP_TIMEOUT) == 0, served.stderr()
    return served.stderr()


def lines_of(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.strip()]


async def until_closed(held: Held, count: int) -> None:
    """Wait (30 s at most) until the server closed ``count`` of the held connections."""
    async with asyncio.timeout(30):
        while held.closed_by_the_server() < count:  # noqa: ASYNC110 - polls the sockets
            await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_a_trickling_head_and_1100_idle_connections_do_not_hold_the_service_down(
    tmp_path: Path,
) -> None:
    client_files(HELD + 200)
    async with serving(served_config(tmp_path), tmp_path / "serve.log") as served:
        started = len(lines_of(served.stderr()))
        cap = default_max_connections(LIMIT)
        stopped = asyncio.Event()
        held = Held()
        try:
            slow = asyncio.create_task(trickle(served.url, 0.5, stopped))
            await held.open(served.url, HELD)
            assert held.refused == 0
            # While they are held, fresh connections are answered, one after another.
            answers = [await healthz(served.url) for _ in range(5)]
            answers.append(await post(served.url, "k1"))
            assert answers == [200] * 6
            # The listener stayed under its cap: to make room for the newcomers, it
            # closed the connections that had waited longest, the trickling one first.
            await until_closed(held, HELD - cap)
            async with asyncio.timeout(30):
                trickled = await slow
            assert trickled == b"" or trickled.startswith(b"HTTP/1.1 408"), trickled
        finally:
            stopped.set()
            await held.close()
        log = await stop(served)
        during = lines_of(log)[started:]
        assert any(f"at the cap of {cap} connections" in line for line in during), log
        assert "Too many open files" not in log
        assert "ERROR" not in log, log
        # The guard's few lines, and uvicorn's and the service's on the way out.
        assert len(during) < 15, "\n".join(during)


IDLE = 5.0
"""The held connections' idle deadline: the outage it makes outlasts a few accept
attempts, and the test waits for it to end. Longer than opening them all takes on a
loaded machine: the first ones, closed at their deadline before the last are open,
would free the descriptors the outage needs."""


@pytest.mark.asyncio
async def test_accept_failures_are_a_line_an_interval_and_the_service_comes_back(
    tmp_path: Path,
) -> None:
    client_files(HELD + 200)
    config = served_config(tmp_path, f"max_connections = 5000\nidle_timeout = {IDLE}")
    async with serving(config, tmp_path / "serve.log") as served:
        assert "max_connections = 5000 is over" in served.stderr()
        held = Held()
        try:
            await held.open(served.url, HELD)  # the kernel completes what accept cannot
            async with asyncio.timeout(30):
                while "accepting a connection failed" not in served.stderr():  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
            # The held connections are closed at their idle deadline, and the service
            # answers again.
            async with asyncio.timeout(60):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if await healthz(served.url) == 200:
                            break
                    await asyncio.sleep(0.2)
        finally:
            await held.close()
        log = await stop(served)
        failures = [line for line in lines_of(log) if "accept" in line and "ERROR" in line]
        assert 1 <= len(failures) <= 4, "\n".join(failures)
        assert all("Too many open files" in line for line in failures)


# Each deadline, and the cap, in process.


async def connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (10 s at most)."""
    async with asyncio.timeout(10):
        with contextlib.suppress(ConnectionResetError):
            return await reader.read()
    return b""


async def response(reader: asyncio.StreamReader) -> bytes:
    """One response to a ``GET /healthz`` (its head and its body)."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))  # type: ignore[union-attr]
        return head + await reader.readexactly(length)


HEALTHZ = b"GET /healthz HTTP/1.1\r\nhost: service\r\n\r\n"


@contextlib.asynccontextmanager
async def observed() -> AsyncIterator[list[Mapping[str, Any]]]:
    """The ``statifier.service.listener`` events reported in the block."""
    seen: list[Mapping[str, Any]] = []
    telemetry.attach(
        "test.listener",
        "statifier.service.listener",
        lambda _name, measurements, metadata: seen.append({**measurements, **metadata}),
    )
    try:
        yield seen
    finally:
        telemetry.detach("test.listener")


@pytest.mark.asyncio
async def test_a_connection_idle_past_its_deadline_is_closed(tmp_path: Path) -> None:
    config = served_config(tmp_path, "idle_timeout = 0.5\nhead_timeout = 60")
    async with running(config) as (_, url), observed() as seen:
        silent, silent_writer = await connect(url)
        assert await closed(silent) == b""  # nothing said: an idle close is routine
        silent_writer.close()
        # After a response, the same deadline runs again.
        reader, writer = await connect(url)
        writer.write(HEALTHZ)
        assert (await response(reader)).startswith(b"HTTP/1.1 200")
        assert await closed(reader) == b""
        writer.close()
    assert seen == []


@pytest.mark.asyncio
async def test_a_request_head_past_its_deadline_is_answered_408_and_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "statifier.service.listener")
    config = served_config(tmp_path, "idle_timeout = 0.3\nhead_timeout = 1.5")
    stopped = asyncio.Event()
    async with observed() as seen, running(config) as (_, url):
        # A byte every 0.2 s keeps the idle deadline away, not the head's.
        first = await trickle(url, 0.2, stopped)
        # After a response, the next head has its own deadline.
        reader, writer = await connect(url)
        writer.write(HEALTHZ)
        assert (await response(reader)).startswith(b"HTTP/1.1 200")
        second = b""
        async with asyncio.timeout(20):
            while not second:
                writer.write(b"G")
                with contextlib.suppress(TimeoutError):
                    second = await asyncio.wait_for(reader.read(4096), 0.2)
        writer.close()
        answered = await healthz(url)
    assert first.startswith(b"HTTP/1.1 408")
    assert first.endswith(b"came too slowly\n")
    assert second.startswith(b"HTTP/1.1 408")
    assert answered == 200
    # The first at once; the second counted, and said as the service stopped.
    assert [(event["action"], event["count"]) for event in seen] == [("head_timeout", 1)] * 2
    assert [r.getMessage() for r in caplog.records if r.name == "statifier.service.listener"] == [
        "closed a connection whose request head did not come within 1.5 s",
        "closed connections whose request head did not come within 1.5 s: 1 more in the last 10 s",
    ]


@pytest.mark.asyncio
async def test_at_the_cap_the_connection_waiting_longest_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "statifier.service.listener")
    config = served_config(tmp_path, "max_connections = 2\nidle_timeout = 60\nhead_timeout = 60")
    async with running(config) as (_, url), observed() as seen:
        # The server accepts in the order the connections came.
        oldest, oldest_writer = await connect(url)
        newer, newer_writer = await connect(url)
        reader, writer = await connect(url)
        writer.write(HEALTHZ)
        assert (await response(reader)).startswith(b"HTTP/1.1 200")
        assert await closed(oldest) == b""
        assert not newer.at_eof()
        for each in (oldest_writer, newer_writer, writer):
            each.close()
    assert [(event["action"], event["count"]) for event in seen] == [("shed", 1)]
    assert [r.getMessage() for r in caplog.records if r.name == "statifier.service.listener"] == [
        "at the cap of 2 connections: closed the one waiting longest for a request"
    ]


PARTIAL_POST = (
    b"POST /hooks/clicks/ HTTP/1.1\r\nhost: service\r\ncontent-type: application/json\r\n"
    b'content-length: 40\r\n\r\n{"key": '
)
"""A post whose body is not all there: its request runs, waiting for the rest."""


@pytest.mark.asyncio
async def test_at_the_cap_with_every_connection_in_a_request_a_newcomer_is_503(
    tmp_path: Path,
) -> None:
    config = served_config(tmp_path, "max_connections = 1\nidle_timeout = 1")
    refused = b""
    async with running(config) as (_, url), observed() as seen:
        async with asyncio.timeout(60):
            while True:
                busy, busy_writer = await connect(url)
                busy_writer.write(PARTIAL_POST)
                await busy_writer.drain()
                await asyncio.sleep(0.05)  # time for the server to begin the request
                newcomer, writer = await connect(url)
                refused = await closed(newcomer)
                writer.close()
                if refused.startswith(b"HTTP/1.1 503"):
                    break
                busy_writer.close()  # the server had not begun it, and shed it: again
        busy_writer.write(b'"k1"}' + b" " * 27)
        posted = await response(busy)
        busy_writer.close()
    assert refused.endswith(b"too many connections; try again soon\n")
    assert posted.startswith(b"HTTP/1.1 200")
    assert "refused" in [event["action"] for event in seen]


def test_the_http_table_takes_the_bounds_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    settings = load(
        served_config(tmp_path, "head_timeout = 2.5\nidle_timeout = 1\nmax_connections = 64")
    )
    assert (settings.http.head_timeout, settings.http.idle_timeout) == (2.5, 1.0)
    assert settings.http.max_connections == 64
    defaults = load(served_config(tmp_path)).http
    assert (defaults.head_timeout, defaults.idle_timeout, defaults.max_connections) == (
        10.0,
        5.0,
        None,
    )
    for line, message in (
        ("head_timeout = 0", "[http] head_timeout: must be a positive number of seconds, not 0"),
        (
            'idle_timeout = "5s"',
            '[http] idle_timeout: must be a positive number of seconds, not "5s"',
        ),
        (
            "max_connections = 0",
            "[http] max_connections: must be an integer from 1 to 1000000, not 0",
        ),
    ):
        with pytest.raises(ServiceConfigError) as refused:
            load(served_config(tmp_path, line))
        assert str(refused.value).endswith(message)
