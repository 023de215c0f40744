"""What only the whole of a ``statifier serve`` file can tell: its tables read, the
combinations that cannot work are refused here (see :func:`cross_check`)."""

from __future__ import annotations

from statifier.console.standalone import is_loopback
from statifier.router import SINK_SHARE, ConfigError, check_on_complete, check_send_type
from statifier.service.settings import (
    CONSOLE_PATH,
    HEALTH_PATHS,
    BasicHttpFront,
    HttpSink,
    ServiceConfigError,
    ServiceSettings,
    front_table,
)
from statifier.service.toml_reader import Table, one_line, shown

__all__ = ["cross_check"]


def cross_check(top: Table, settings: ServiceSettings) -> None:
    """Refuse what no one table tells: a queue no sink drains or no route writes, routes
    without a send type (or a send type the router refuses), an ``on_complete`` naming
    no route, a sink that outlives the outbox lease, a console on a listener other than
    loopback without operators, a front, a stream source or a schedule whose source no
    enabled binding reads, a front whose path overlaps another's, the console's or the
    health endpoints, the access log beside a BasicHTTP front (it would log tokens),
    bucket leases beside a timer, flow or reaper worker turned off
    (:func:`_leased_workers`).

    Raises:
        ServiceConfigError: naming the table and the key at fault (``top`` is the
            file's top table).
    """
    file = settings.file
    _leased_workers(settings)
    queues = {route.queue for route in settings.routes}
    drained = {sink.queue for sink in settings.sinks}
    for route in settings.routes:
        if route.queue not in drained:
            raise ServiceConfigError(
                file,
                f"routes.{route.name}",
                "queue",
                f"no [sinks.{route.queue}] drains queue {shown(route.queue)}",
            )
    for sink in settings.sinks:
        if sink.queue not in queues:
            raise ServiceConfigError(
                file, f"sinks.{sink.queue}", "", "no route writes to this queue"
            )
    # The router's own checks of these options, run now to name the key at fault.
    names = [route.name for route in settings.routes]
    try:
        check_send_type(settings.send_type, names)
    except ConfigError as error:
        raise top.refuse("send_type", one_line(error)) from None
    try:
        check_on_complete(settings.on_complete, names)
    except ConfigError as error:
        raise top.refuse("on_complete", one_line(error)) from None
    lease = settings.outbox.lease
    bound = lease * SINK_SHARE  # a sink call still running then is ended by the drain
    for sink in settings.sinks:
        if isinstance(sink, HttpSink) and sink.timeout >= bound:
            raise ServiceConfigError(
                file,
                f"sinks.{sink.queue}",
                "timeout",
                f"must be shorter than nine tenths of the outbox lease ({bound:g} of "
                f"{lease:g} seconds)",
            )
    console = settings.console
    if console.enabled and not console.operators and not is_loopback(settings.http.host):
        raise ServiceConfigError(
            file,
            "console",
            "operators",
            f"a console listening on {shown(settings.http.host)} (not loopback) needs "
            "operators ([console.operators.NAME] with token_env and role)",
        )
    read = {binding.source for binding in settings.bindings if binding.enabled}
    paths: dict[str, str] = {}
    if console.enabled:
        paths[CONSOLE_PATH] = "the console"
    api = settings.api
    if api.enabled:
        for taken in (*HEALTH_PATHS, *paths):
            if _nested(api.path, taken) or _nested(taken, api.path):
                other = paths.get(taken, "the health endpoints")
                raise ServiceConfigError(
                    file, "api", "path", f"{shown(api.path)} overlaps {other} ({shown(taken)})"
                )
        paths[api.path] = "the API"
    for front in settings.fronts:
        table = front_table(front)
        if isinstance(front, BasicHttpFront) and settings.http.access_log:
            raise ServiceConfigError(
                file,
                "http",
                "access_log",
                f"would log the tokens of [{table}] (each location's last path segment "
                "is its token): leave it off while a BasicHTTP front is set",
            )
        if not isinstance(front, BasicHttpFront) and front.source not in read:
            raise ServiceConfigError(
                file,
                table,
                "source",
                f"no enabled binding reads source {shown(front.source)}",
            )
        for taken in (*HEALTH_PATHS, *paths):
            if _nested(front.path, taken) or _nested(taken, front.path):
                other = paths.get(taken, "the health endpoints")
                raise ServiceConfigError(
                    file,
                    table,
                    "path",
                    f"{shown(front.path)} overlaps {other} ({shown(taken)})",
                )
        paths[front.path] = f"[{table}]"
    for schedule in settings.schedules:
        if schedule.source not in read:
            raise ServiceConfigError(
                file,
                f"schedules.{schedule.name}",
                "source",
                f"no enabled binding reads source {shown(schedule.source)}",
            )
    for source in settings.sources:
        if source.kind != "table" and source.name not in read:
            raise ServiceConfigError(
                file,
                source.table,
                "",
                f"no enabled binding reads source {shown(source.name)}",
            )


_LEFT_UNDONE = {
    "timers": ("timer", "their timers would never fire"),
    "flow": ("flow", "the events and creates held for them would never be delivered"),
    "reapers": ("reaper", "their dedupe claims, ledger rows and addresses would never be reaped"),
}
"""The sections of the workers that run per leased slice: the worker's name, and what
a slice leased without it leaves undone."""


def _leased_workers(settings: ServiceSettings) -> None:
    """Refuse ``[bucket_leases] enabled`` beside a section of a worker that runs per
    leased slice turned off: the other services leave the slices a service leases to
    its workers alone, so that work of its slices would be done by no one.

    Raises:
        ServiceConfigError: naming ``[bucket_leases] enabled`` and the section off.
    """
    if not settings.bucket_leases.enabled:
        return
    sections = {
        "timers": settings.timers.enabled,
        "flow": settings.flow.enabled,
        "reapers": settings.reapers.enabled,
    }
    for section, enabled in sections.items():
        if not enabled:
            worker, undone = _LEFT_UNDONE[section]
            raise ServiceConfigError(
                settings.file,
                "bucket_leases",
                "enabled",
                f"refused beside [{section}] enabled = false: the other services leave "
                f"the slices this one leases to its own workers, and it runs no {worker} "
                f"worker, so {undone}; enable [{section}] in every service that leases, "
                f"or leave [bucket_leases] off in this one",
            )


def _nested(path: str, under: str) -> bool:
    return path == under or path.startswith(under.rstrip("/") + "/")
