"""A PostgreSQL server of a test's own, which it may stop and start again (the shared
server of the suite is never stopped): a fresh data directory made by the local
server binaries (``initdb``, ``pg_ctl``, found as ``scripts/ensure-postgres`` finds
them), trust authentication, listening on 127.0.0.1 only, on a free port that stays
the same across a stop and a start.

As root (which ``initdb`` refuses) the server runs as the ``postgres`` user, else
``nobody``, through ``runuser``. Missing binaries fail the test that needs them; they
never skip it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["OwnPostgres", "own_postgres", "server_binaries", "servers"]

_START_WAIT = 60


def server_binaries() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: the one on the path first, then
    the newest of the usual places.

    Raises:
        FileNotFoundError: none holds both.
    """
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found is not None:
        candidates.append(Path(found).resolve().parent)
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"):
        candidates.extend(sorted(Path("/").glob(pattern.lstrip("/")), key=_version, reverse=True))
    candidates.append(Path("/usr/local/pgsql/bin"))
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in ("initdb", "pg_ctl")):
            return directory
    raise FileNotFoundError(
        "no PostgreSQL server binaries (initdb, pg_ctl): install the server package "
        f"(looked in {[str(c) for c in candidates]})"
    )


def _version(path: Path) -> tuple[int, ...]:
    digits = "".join(c if c.isdigit() else " " for c in str(path)).split()
    return tuple(int(d) for d in digits)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _runner() -> list[str]:
    """How to run the server's commands: as is, or as an unprivileged user when root."""
    if os.geteuid() != 0:
        return []
    import pwd

    for user in ("postgres", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            continue
        return ["runuser", "-u", user, "--"]
    raise FileNotFoundError("running as root, and no postgres or nobody user to run initdb as")


@dataclass
class OwnPostgres:
    """A server of the test's own: where it keeps its data, and its URL."""

    binaries: Path
    directory: Path
    port: int
    runner: list[str]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *arguments: str) -> None:
        command = [*self.runner, str(self.binaries / "pg_ctl"), "-D", str(self.data), *arguments]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = (self.directory / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"pg_ctl {arguments[-1]} failed: {done.stderr}\n{log}")

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def start(self) -> None:
        """Start the server; returns once it accepts connections."""
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        log = str(self.directory / "server.log")
        self.ctl("-l", log, "-w", "-t", str(_START_WAIT), "-o", options, "start")

    def stop(self) -> None:
        """Stop the server (``fast``: sessions are ended, the data kept); returns once
        it is down."""
        self.ctl("-m", "fast", "-w", "stop")


@contextmanager
def servers(count: int) -> Iterator[list[OwnPostgres]]:
    """``count`` started servers of the caller's own, stopped and removed when the block
    ends; fails (never skips) the test when the binaries are missing."""
    try:
        binaries, runner = server_binaries(), _runner()
    except FileNotFoundError as missing:
        pytest.fail(str(missing), pytrace=False)
    made: list[OwnPostgres] = []
    try:
        for _ in range(count):
            directory = Path(tempfile.mkdtemp(prefix="statifier-pg-"))
            server = OwnPostgres(binaries, directory, _free_port(), runner)
            made.append(server)
            if runner:
                shutil.chown(directory, user=runner[2])
            initdb = [*runner, str(binaries / "initdb"), "-D", str(server.data)]
            initdb += ["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N"]
            done = subprocess.run(
                initdb, capture_output=True, text=True, check=False, cwd=directory
            )
            if done.returncode != 0:
                pytest.fail(f"initdb failed: {done.stdout}{done.stderr}", pytrace=False)
            server.start()
        yield made
    finally:
        for server in made:
            try:
                if (server.data / "postmaster.pid").exists():
                    server.ctl("-m", "immediate", "-w", "stop")
            finally:
                shutil.rmtree(server.directory, ignore_errors=True)


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    """A started server of the test's own, stopped and removed afterwards; fails (never
    skips) when the binaries are missing."""
    with servers(1) as (server,):
        yield server
