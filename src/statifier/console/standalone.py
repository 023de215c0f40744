"""``statifier console --database URL``: the console alone, on a database of its own.

:func:`run` opens the database (never migrating it: tables behind the shipped head are
refused with the advice to run ``statifier db upgrade``), builds the
:class:`~statifier.console.app.Console` over it and serves it with uvicorn on
``host:port`` (``127.0.0.1`` unless told otherwise) until SIGINT or SIGTERM.

Operators come from :class:`StandaloneOptions.operators`, each token read from the
environment variable its option names. With none, the console listens on a loopback
host only, and makes one ``operator`` token for this start, printed once on ``out``;
a non-loopback host with no operator is refused.

Alone, the console knows no bindings or routes (the routing page says so) and no
source's scope (a broker's dead letter can be discarded, not routed again); with
``basichttp_base_url`` it can rotate BasicHTTP locations.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import signal
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.extras import MissingExtra
from statifier.persistence.codec import PLAIN, BlobCodec
from statifier.sql import TableOptions

__all__ = ["ConsoleRefused", "StandaloneOptions", "is_loopback", "parse_operator", "run"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface only (``localhost``,
    ``127.0.0.0/8``, ``::1``): where a console without configured operators may listen.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: it may resolve anywhere
        return False


class ConsoleRefused(ValueError):  # noqa: N818 - names the refusal
    """Options the console refuses, or a database it cannot serve; one line, never a
    token or a database URL."""


@dataclass(frozen=True, slots=True)
class StandaloneOptions:
    """What ``statifier console`` was given.

    Attributes:
        database: the database URL (kept out of ``repr``).
        host, port: where to listen (port 0: any free one).
        prefix, schema, locks: the tables' options (``locks`` as the deployment's
            ``[database] locks``: an operator's action takes the locks its services take).
        operators: ``(name, role, token)`` triples (tokens kept out of ``repr``).
        session_key: the cookie's signing key; random per start when ``None``.
        secure_cookie: mark the cookie ``Secure`` (behind HTTPS).
        basichttp_base_url: the public URL of the BasicHTTP front, for rotations.
        scriba_prefix: the prefix of scriba's tables, to show projections.
        codec: what the database's blobs are encoded with (``statifier console
            --keys-env``); stored as given by default.
    """

    database: str = field(repr=False)
    host: str = "127.0.0.1"
    port: int = 8081
    prefix: str = "statifier_"
    schema: str | None = None
    locks: Literal["advisory", "rows"] = "advisory"
    operators: Sequence[tuple[str, str, str]] = field(default=(), repr=False)
    session_key: bytes | None = field(default=None, repr=False)
    secure_cookie: bool = False
    basichttp_base_url: str | None = None
    scriba_prefix: str | None = None
    codec: BlobCodec = field(default=PLAIN, repr=False)


def parse_operator(text: str, environ: Mapping[str, str]) -> tuple[str, str, str]:
    """``NAME:ROLE:ENV`` (as ``--operator`` takes it) as ``(name, role, token)``, the
    token read from the environment variable ``ENV``.

    >>> parse_operator("ada:operator:ADA", {"ADA": "t" * 20})[:2]
    ('ada', 'operator')

    Raises:
        ConsoleRefused: not three parts, an unknown role, an unset variable.
    """
    name, _, rest = text.partition(":")
    role, _, variable = rest.partition(":")
    if not name or not variable:
        raise ConsoleRefused(f"--operator is NAME:ROLE:ENV_VARIABLE, not {text[:60]!r}")
    if role not in {r.value for r in Role}:
        raise ConsoleRefused(f"--operator {name}: the role is operator or read_only, not {role!r}")
    token = environ.get(variable)
    if not token:
        raise ConsoleRefused(f"--operator {name}: the environment variable {variable} is not set")
    return name, role, token


def _check_migrated(url: str, options: TableOptions) -> None:
    from statifier.sql import migrations

    try:
        migrations.prepare(url, options, migrate=False)
    except migrations.NotAtHead as behind:
        found = f"at revision {behind.revision}" if behind.revision else "not there"
        raise ConsoleRefused(
            f"the database's {options.prefix}* tables are {found}, and the console needs "
            f"revision {behind.head}: run `statifier db upgrade` (with the same --url and "
            "--prefix)"
        ) from None


def _operators(options: StandaloneOptions) -> tuple[Operators, str | None]:
    if options.operators:
        try:
            return Operators(Operator(n, t, Role(r)) for n, r, t in options.operators), None
        except ValueError as error:
            raise ConsoleRefused(str(error)) from None
    if not is_loopback(options.host):
        raise ConsoleRefused(
            f"a console listening on {options.host} (not loopback) needs --operator "
            "NAME:ROLE:ENV_VARIABLE"
        )
    token = secrets.token_urlsafe(24)
    return Operators([Operator("local", token, Role.OPERATOR)]), token


def run(options: StandaloneOptions, out: TextIO) -> int:
    """Serve the console until SIGINT or SIGTERM; returns 0.

    Raises:
        ConsoleRefused: options refused, or the database is not migrated.
        MissingExtra: Jinja2, uvicorn or a database driver is missing.
        OSError: the address cannot be bound.
    """
    table_options = TableOptions(prefix=options.prefix, schema=options.schema, locks=options.locks)
    operators, generated = _operators(options)
    _check_migrated(options.database, table_options)
    return asyncio.run(_serve(options, table_options, operators, generated, out))


async def _serve(
    options: StandaloneOptions,
    table_options: TableOptions,
    operators: Operators,
    generated: str | None,
    out: TextIO,
) -> int:
    try:
        import uvicorn

        from statifier.console.app import Console, console_app
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing
    from datetime import timedelta

    from statifier.persistence import Storage
    from statifier.persistence.sql import SqlAdapter
    from statifier.router import BasicHttpLocations, Router, RouterConfig, StaticResolver

    scriba = None
    if options.scriba_prefix is not None:
        from scriba.sql.tables import define_tables

        scriba = define_tables(prefix=options.scriba_prefix, schema=options.schema)
    async with SqlAdapter(options.database, table_options) as adapter:
        locations = None
        if options.basichttp_base_url is not None:
            try:
                locations = BasicHttpLocations(options.basichttp_base_url, timedelta(hours=72))
            except ValueError as error:
                raise ConsoleRefused(str(error)) from None
        # No bindings: the console routes nothing of its own; its router configuration
        # is what its actions (cancel, retry, rotate) run through.
        router = Router(
            RouterConfig(
                Storage(adapter, codec=options.codec),
                bindings=[],
                resolver=StaticResolver({}),
                basichttp=locations,
                # The service on the same database fires the timers.
                timers_elsewhere=True,
            )
        )
        sessions = Sessions(operators, key=options.session_key, secure=options.secure_cookie)
        console = Console.of(router, sessions, scriba=scriba)

        class Quiet(uvicorn.Server):
            """uvicorn without its own signal handlers: the console stops it."""

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        config = uvicorn.Config(
            console_app(console), lifespan="off", log_config=None, access_log=False
        )
        server = Quiet(config)
        listener = _bound(options.host, options.port)
        host, port = listener.getsockname()[:2]
        loop = asyncio.get_running_loop()

        def stop() -> None:
            console.close()
            server.should_exit = True

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop)
        try:
            serving = asyncio.create_task(server.serve(sockets=[listener]))
            while not server.started and not serving.done():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            if not serving.done():
                out.write(f"statifier console: listening on http://{host}:{port}/console/\n")
                if generated is not None:
                    out.write(f"statifier console: login token (this start only): {generated}\n")
                out.flush()
            await serving
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            listener.close()
            await console.bulk_runs.close()  # each run's row says it stopped
    out.write("statifier console: stopped\n")
    return 0


def _bound(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as error:
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return listener
