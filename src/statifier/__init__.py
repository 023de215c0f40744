"""statifier: durable, observable, long-lived event-driven processes.

The names here are the main jobs': :class:`Durable` runs executions of charts in a
database (``sqlite:///...`` needs the ``sqlite`` extra, ``postgresql://...`` the
``postgres`` one) and returns :class:`Description`, :class:`Sent`,
:class:`Cancelled` and :class:`ExecutionSummary`, whose ``status`` is a
:class:`Status`; :func:`compile_chart` reads and checks a chart before it runs
(:class:`InvalidChart`); :class:`MissingExtra` is what an import or a call raises
when an extra it needs is not installed. The errors a caller of :class:`Durable`
catches are :class:`DurableError` (:class:`NotMigrated`, :class:`UnknownChart`),
:class:`ExecutionNotFound`, :class:`ExecutionExists` and :class:`LockTimeout`.
Importing ``statifier`` needs no extra.

>>> import asyncio, os, tempfile
>>> import statifier
>>> chart = statifier.compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="placed">'
...     '<state id="placed"><transition event="pay" target="paid"/></state>'
...     '<final id="paid"/></scxml>'
... )
>>> url = f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'orders.db')}"
>>> async def main():
...     async with statifier.Durable(url, charts={"order": chart}, migrate=True) as durable:
...         await durable.create("order", "order-1")
...         sent = await durable.send("order-1", "pay")
...         return sent.status is statifier.Status.COMPLETED, sent.final_state
>>> asyncio.run(main())
(True, 'paid')

Everything else is in the layer that owns it, each using only the public API of the
ones below (``docs/architecture.md``). These exist today:

* ``statifier.expr`` -- a small, safe expression language for guards and data;
* ``statifier.chart``, ``statifier.core``, ``statifier.session`` -- W3C SCXML
  statecharts: the chart model, a pure interpreter with stored positions, and asyncio
  sessions (with the BasicHTTP Event I/O Processor);
* ``statifier.persistence`` and ``statifier.sql`` -- durable executions stored in
  memory, PostgreSQL or SQLite, and the tables' migrations;
* ``statifier.durable`` -- ``Durable``, the shortest way in to durable executions:
  ``Durable(url, charts=...)`` with create, send, describe, list and cancel (``statifier
  executions`` on the command line);
* ``statifier.router`` -- inbound events routed by key to durable executions:
  bindings, dedupe, addresses, the routing ledger, ``route``/``route_many``, the
  reapers and the ``statifier scenario`` runner, routes, the outbox and durable
  timers;
* ``statifier.fronts`` -- what hands events to the router: a stream consumer runtime
  over Kafka, NATS JetStream or an inbound-events table, and webhook, form-post and
  BasicHTTP fronts as ASGI apps;
* ``statifier.console`` -- the operator console: executions (the chart drawn, the
  input log replayed), routing, failures and projections in a browser, with audited
  actions (``statifier console``, or ``[console]`` in ``statifier serve``);
* ``statifier.api`` -- the HTTP API into executions: send an event and get the state
  its commit left, wait for a state, read, list and cancel, under tokens per scope
  (``[api]`` in ``statifier serve``);
* ``statifier.client`` -- the API's Python client, sync and async (the ``http``
  extra alone);
* ``statifier.service`` -- ``statifier serve CONFIG.toml``: fronts, consumers, the
  timer worker, the outbox drain, the reapers, the console and the API as one process;
* ``statifier.telemetry`` -- the events sessions, durable executions, the router and
  scriba report (``docs/telemetry.md``); ``statifier.callbacks``, ``statifier.extras``,
  ``statifier.ids`` and ``statifier.cron`` (cron expressions and when they fire in a
  time zone) -- small helpers every layer may use;
* ``statifier.observability`` -- telemetry as OpenTelemetry spans and metrics (the
  ``otel`` extra) and as structured logs, for a host to install;
* ``statifier.testing`` -- the test kit for a host's suite: a pytest plugin, a clock
  that skips ahead, routing cases and exported input logs replayed on a revision;
* ``statifier.examples`` -- what ``statifier demo`` runs; ``statifier.cli`` -- the
  ``statifier`` command.

``scriba``, the projection engine, ships in the same distribution as a separate import
package.

The core has no runtime dependencies: integrations are installed through optional
extras. See ``README.md`` and ``docs/architecture.md`` in the source tree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from statifier.chart import InvalidChart, compile_chart
    from statifier.durable import (
        Cancelled,
        Description,
        Durable,
        DurableError,
        ExecutionExists,
        ExecutionNotFound,
        ExecutionSummary,
        LockTimeout,
        NotMigrated,
        Sent,
        Status,
        UnknownChart,
    )
    from statifier.extras import MissingExtra

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "Description",
    "Durable",
    "DurableError",
    "ExecutionExists",
    "ExecutionNotFound",
    "ExecutionSummary",
    "InvalidChart",
    "LockTimeout",
    "MissingExtra",
    "NotMigrated",
    "Sent",
    "Status",
    "UnknownChart",
    "__version__",
    "compile_chart",
]

_HOMES: Final = {
    "InvalidChart": "statifier.chart",
    "compile_chart": "statifier.chart",
    "MissingExtra": "statifier.extras",
    **dict.fromkeys(
        (
            "Cancelled",
            "Description",
            "Durable",
            "DurableError",
            "ExecutionExists",
            "ExecutionNotFound",
            "ExecutionSummary",
            "LockTimeout",
            "NotMigrated",
            "Sent",
            "Status",
            "UnknownChart",
        ),
        "statifier.durable",
    ),
}
"""Where each name of :data:`__all__` lives. They are imported on first use, not here:
every import of a ``statifier`` module runs this package first, and the leaves
(``statifier.telemetry``, ``statifier.expr``) and ``scriba`` must not load the
statechart layers and ``Durable`` with it (docs/decisions/0098)."""


def __getattr__(name: str) -> object:
    """Import a name of :data:`__all__` from its home on first use, and keep it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'statifier' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
