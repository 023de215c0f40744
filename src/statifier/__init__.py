"""statifier: durable, observable, long-lived event-driven processes.

The library is built in layers, each using only the public API of the ones below:

* ``statifier.expr`` -- a small, safe expression language for guards and data;
* ``statifier.chart``, ``statifier.core``, ``statifier.session`` -- W3C SCXML
  statecharts: the chart model, a pure interpreter and asyncio sessions;
* ``statifier.persistence`` -- durable executions stored in PostgreSQL or SQLite;
* ``statifier.router`` and ``statifier.fronts`` -- routing inbound events from
  Kafka, NATS and HTTP webhooks to the executions they belong to.

Only ``statifier.expr`` exists today; the other layers are planned. The core has
no runtime dependencies: integrations are installed through optional extras.
See ``docs/architecture.md`` in the source tree.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
