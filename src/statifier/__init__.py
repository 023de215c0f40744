"""statifier: durable, observable, long-lived event-driven processes.

The library is built in layers, each using only the public API of the ones below.
These exist today:

* ``statifier.expr`` -- a small, safe expression language for guards and data;
* ``statifier.chart``, ``statifier.core``, ``statifier.session`` -- W3C SCXML
  statecharts: the chart model, a pure interpreter with stored positions, and asyncio
  sessions (with the BasicHTTP Event I/O Processor);
* ``statifier.persistence`` and ``statifier.sql`` -- durable executions stored in
  memory, PostgreSQL or SQLite, and the tables' migrations;
* ``statifier.durable`` -- the front door to durable executions: ``Durable(url,
  charts=...)`` with create, send, describe, list and cancel (``statifier
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
* ``statifier.service`` -- ``statifier serve CONFIG.toml``: fronts, consumers, the
  timer worker, the outbox drain, the reapers and the console as one process;
* ``statifier.telemetry`` -- the events sessions, durable executions, the router and
  scriba report (``docs/telemetry.md``); ``statifier.callbacks``, ``statifier.extras``
  and ``statifier.ids`` -- small helpers every layer may use;
* ``statifier.observability`` -- telemetry as OpenTelemetry spans and metrics (the
  ``otel`` extra) and as structured logs, for a host to install;
* ``statifier.examples`` -- what ``statifier demo`` runs; ``statifier.cli`` -- the
  ``statifier`` command.

``scriba``, the projection engine, ships in the same distribution as a separate import
package.

The core has no runtime dependencies: integrations are installed through optional
extras. See ``README.md`` and ``docs/architecture.md`` in the source tree.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
