"""Telemetry: named events with measurements and metadata, for handlers to observe.

Components call :func:`report`; hosts :func:`attach` handlers to the event names they
care about (see ``docs/telemetry.md`` for the catalog). With nothing attached an event
costs one dictionary lookup. A handler that raises is detached and logged, so
observing can never break what is observed.

>>> seen = []
>>> attach("demo", "statifier.session.start", lambda name, m, meta: seen.append(meta))
>>> report("statifier.session.start", {}, {"session_id": "s1"})
>>> detach("demo"), seen
(True, [{'session_id': 's1'}])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["EVENTS", "Handler", "attach", "detach", "enabled", "execute", "report"]

Handler = Callable[[str, Mapping[str, float], Mapping[str, Any]], None]

EVENTS: Final[Mapping[str, str]] = {
    "statifier.session.start": "a session started (or resumed) and reached its first stable point",
    "statifier.session.stop": "a session finished: its chart reached a final state, or cancelled",
    "statifier.session.macrostep": "a session stepped one input to a stable configuration",
    "statifier.session.send": "a session delivered or armed a send",
    "statifier.session.invoke": "a session started an invoked child",
    "statifier.session.error": (
        "a session raised error.communication or error.execution itself, a failure"
        " reached no chart (raised false), a chart's error went untaken (untaken true),"
        " or the session failed"
    ),
    # durable executions (see the persistence section of docs/telemetry.md)
    "statifier.persistence.step": "a durable call ran the chart and stored the result",
    "statifier.persistence.error": "a durable call's chart raised an error event (stored)",
    "statifier.persistence.lock": "a durable call got its execution's exclusion",
    "statifier.persistence.adapter": "a storage adapter call returned",
    "statifier.persistence.lifecycle": "an execution was created, ended, parked or unparked",
    "statifier.persistence.effect_failed": "an executor raised; the call stored nothing",
    "statifier.persistence.child": "a durable child was started, or its fan-out closed",
    # the event router (see the router section of docs/telemetry.md)
    "statifier.router.route": "an inbound event was routed: an outcome per enabled binding",
    "statifier.router.delivery": "one binding's delivery of one event settled",
    "statifier.router.outbox": "an outbox drain pass leased rows and settled their sinks",
    "statifier.router.outbox_failed": "an outbox row's sink failed: retried later, or dead",
    "statifier.router.timer": "a due timer was fired, discarded, refused or failed",
    "statifier.router.schedule": "a due schedule made its fire, let missed ones pass, or failed",
    "statifier.router.flow": "a flow worker delivered what a debounce, batch or throttle held",
    # the stream consumer (see the fronts section of docs/telemetry.md)
    "statifier.fronts.commit": "a stream consumer committed its gapless prefix of done messages",
    "statifier.fronts.retry": "a stream consumer's routing attempt failed; the event waits",
    "statifier.fronts.dead_letter": "a stream consumer dead-lettered a message and moved on",
    "statifier.fronts.request": "an HTTP front (webhook, form, BasicHTTP) answered a request",
    "statifier.fronts.trouble": "a stream source began, or stopped, being kept from reading",
    # the HTTP API (see the API section of docs/telemetry.md)
    "statifier.api.request": "the HTTP API answered a call",
    "statifier.api.watch": "the HTTP API's watcher read the executions waited on",
    "statifier.api.watch_failed": "the HTTP API's watcher failed to read; it reads again",
    # the console's bulk actions (see the console section of docs/telemetry.md)
    "statifier.console.bulk_run": "a bulk run ended: finished, failed on executions, or stopped",
    # the service (see the service section of docs/telemetry.md)
    "statifier.service.listener": "the HTTP listener shed, refused or timed out connections",
    # scriba, the projection engine (see the scriba section of docs/telemetry.md)
    "scriba.projection.started": "a projection started running, or resumed after a pause",
    "scriba.projection.paused": "a projection paused: it stopped reading its source",
    "scriba.projection.stopped": "a projection stopped and no longer runs anything",
    "scriba.projection.halted": "a projection halted on a failure no replay can fix",
    "scriba.projection.crashed": "a projection's pipeline crashed",
    "scriba.projection.restarted": "a projection's pipeline was started again after a crash",
    "scriba.projection.event.start": "a handler call began",
    "scriba.projection.event.stop": "a handler call returned",
    "scriba.projection.event.exception": "a handler call raised",
    "scriba.projection.event.skipped": "an event was accounted for without a write",
    "scriba.projection.batch.stop": "a batch committed",
    "scriba.projection.dead_letter": "an event was dead-lettered",
    "scriba.projection.lag": "a projection's lag, on a timer",
    "scriba.projection.cache_initialized": "a pipeline loaded the stream cursors it dedups by",
    "scriba.source.batch.failed": "a batch did not commit and is not acknowledged",
    "scriba.source.standby": "a source stands by: another process holds the projection",
    "scriba.source.subscribed": "a source holds the projection's subscription and delivers",
}
"""Every event name this library emits, with what it means."""

_handlers: dict[str, dict[str, Handler]] = {}
_log = logging.getLogger(__name__)


def attach(handler_id: str, event_name: str, handler: Handler) -> None:
    """Call ``handler(event_name, measurements, metadata)`` on every ``event_name``.

    Raises:
        ValueError: the event name is not in :data:`EVENTS`, or ``handler_id`` is
            already attached to it.
    """
    if event_name not in EVENTS:
        raise ValueError(f"unknown telemetry event {event_name!r}")
    handlers = _handlers.setdefault(event_name, {})
    if handler_id in handlers:
        raise ValueError(f"handler {handler_id!r} is already attached to {event_name!r}")
    handlers[handler_id] = handler


def detach(handler_id: str) -> bool:
    """Remove ``handler_id`` from every event; returns whether it was attached."""
    found = False
    for handlers in _handlers.values():
        found = handlers.pop(handler_id, None) is not None or found
    return found


def enabled(event_name: str) -> bool:
    """Whether any handler is attached to ``event_name``: lets a hot path skip measuring
    what nobody observes."""
    return bool(_handlers.get(event_name))


def report(event_name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
    """Report ``event_name`` to its handlers."""
    handlers = _handlers.get(event_name)
    if not handlers:
        return
    for handler_id, handler in list(handlers.items()):
        try:
            handler(event_name, measurements, metadata)
        except Exception:  # noqa: BLE001 - a failing observer must not break the observed
            handlers.pop(handler_id, None)
            _log.exception("telemetry handler %r failed and was detached", handler_id)


execute = report
"""The same function under the name the telemetry API of the design documents uses
(``execute(event_name, measurements, metadata)``); components call :func:`report`."""
