"""What the service builds from its settings for the router: :func:`router_config`."""

from __future__ import annotations

from datetime import timedelta

from statifier.chart import Machine
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    BasicHttpLocations,
    OutboxRoute,
    RouterConfig,
    RouterError,
    StaticResolver,
)
from statifier.router.routes import RouteEntry
from statifier.service.settings import BasicHttpFront, ServiceConfigError, ServiceSettings
from statifier.service.toml_reader import one_line

__all__ = ["router_config"]


def router_config(settings: ServiceSettings, adapter: SqlAdapter) -> RouterConfig:
    """The router's configuration of ``settings`` over ``adapter`` (opened on
    ``settings.database``): the bindings, a static resolver over the documents, one
    :class:`~statifier.router.OutboxRoute` for every route, the built-in timer queue.

    Raises:
        ServiceConfigError: the router refuses what only the whole configuration
            tells (a reserved binding id, two documents of one chart under different
            error policies, the BasicHTTP base URL), named at the top level of the
            file; each option's own check ran when the file was loaded.
    """
    outbox = OutboxRoute(adapter, codec=settings.codec)
    basichttp = next((f for f in settings.fronts if isinstance(f, BasicHttpFront)), None)
    routes = {
        entry.name: RouteEntry(
            outbox,
            {"queue": entry.queue, **({"target": entry.target} if entry.target else {})},
        )
        for entry in settings.routes
    }
    charts: dict[str | tuple[str, str], Machine] = dict(settings.documents.items())
    try:
        return RouterConfig(
            Storage(adapter, codec=settings.codec),
            bindings=settings.bindings,
            resolver=StaticResolver(charts),
            send_type=settings.send_type,
            routes=routes,
            on_complete=settings.on_complete,
            lock_wait=settings.database.lock_wait,
            on_error=settings.errors.default,
            document_on_error=settings.errors.documents,
            # The service never leaves a timer to no worker: it supervises one per
            # store (started again after a failure, readiness red meanwhile), or per
            # slice of the buckets it leases (the others' slices fired by the
            # services holding them), or leaves them to another process
            # ([timers] enabled = false). A delivery that schedules a timer while this
            # process's worker restarts, or holds no slice of its store, is no news.
            timers_elsewhere=True,
            basichttp=None if basichttp is None else _locations(basichttp),
            caps=settings.caps,
        )
    except (RouterError, ValueError, TypeError) as error:
        raise ServiceConfigError(settings.file, "", "", one_line(error)) from None


def _locations(front: BasicHttpFront) -> BasicHttpLocations:
    return BasicHttpLocations(front.base_url, timedelta(seconds=front.send_key_horizon))
