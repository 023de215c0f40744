"""The operator console as the service serves it (``[console]``, ``docs/console.md``).

:func:`service_console` builds the :class:`~statifier.console.app.Console` over the
service's own database, or over every store of ``[database] shards`` (decision 0119:
lists merged, each action in its execution's or row's store, a revision tried on
every store's executions), and the router configuration: the
bindings and routes of the file are what the routing page lists, the fixed scopes of
its sources are what a consumer dead letter is routed again under, and its BasicHTTP
front's base URL is what a rotation mints locations on. Its routes are mounted at
``/console`` beside the health endpoints, on the service's listener.

With no operator configured (allowed on a loopback listener only; the configuration
refuses it elsewhere) the service makes one ``operator`` login token per start, named
``local``, and :attr:`ServedConsole.generated` holds it for the service to print on
standard output once, where the person who started it reads it; it is never logged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.routing import BaseRoute

from statifier.router import Router, ShardedRouter
from statifier.service.settings import ServiceSettings

if TYPE_CHECKING:
    from statifier.console.app import Console  # the console extra's

__all__ = ["ServedConsole", "service_console"]

GENERATED_OPERATOR = "local"
"""The name of the operator a console without configured operators makes."""


@dataclass(frozen=True, slots=True)
class ServedConsole:
    """The console a service serves: its routes, the console itself (closed when the
    service stops, so no event stream or shadow replay holds the stop up) and the
    token made for this start, if any (kept out of ``repr``)."""

    routes: list[BaseRoute]
    console: Console
    generated: str | None = None

    def close(self) -> None:
        """End the console's live streams and stop its running replays."""
        self.console.close()

    def __repr__(self) -> str:
        return f"ServedConsole(routes={len(self.routes)}, generated={self.generated is not None})"


def service_console(settings: ServiceSettings, router: Router | ShardedRouter) -> ServedConsole:
    """The console of ``settings`` (which must have ``[console]`` enabled) over the
    router configuration's database, or over each store of a
    :class:`~statifier.router.ShardedRouter` (scriba's tables read in the first).

    Raises:
        MissingExtra: Jinja2 (the ``console`` extra) is not installed.
    """
    from statifier.extras import MissingExtra

    try:
        from statifier.console.app import Configured, ConfiguredRoute, Console, console_routes
        from statifier.console.auth import Operator, Operators, Role, Sessions
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing

    chosen = settings.console
    generated = None
    if chosen.operators:
        operators = Operators(Operator(o.name, o.token, Role(o.role)) for o in chosen.operators)
    else:
        generated = secrets.token_urlsafe(24)
        operators = Operators([Operator(GENERATED_OPERATOR, generated, Role.OPERATOR)])
    scriba = None
    if chosen.scriba_prefix is not None:
        from scriba.sql.tables import define_tables

        scriba = define_tables(prefix=chosen.scriba_prefix, schema=settings.database.schema)
    console = Console.of(
        router,
        Sessions(
            operators,
            key=chosen.session_key,
            max_age=chosen.session_max_age,
            secure=chosen.secure_cookie,
        ),
        scriba=scriba,
        configured=Configured(
            bindings=tuple(settings.bindings),
            routes=tuple(ConfiguredRoute(r.name, r.queue, r.target) for r in settings.routes),
        ),
        scopes={s.name: s.scope for s in settings.sources if s.scope is not None},
        live_interval=chosen.live_interval,
        max_clients=chosen.max_clients,
    )
    return ServedConsole(list(console_routes(console)), console, generated)
