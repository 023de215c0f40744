"""Fronts: what hands events from the outside world to the router.

Streams: :mod:`statifier.fronts.source` is the contract of a stream of events (messages
by partition and position, acknowledged by gapless prefix);
:class:`~statifier.fronts.consumer.StreamConsumer` reads one and routes its events in
per-key lanes, committing only what is done; the sources are the inbound-events table
(:mod:`statifier.fronts.table_source`), Kafka (:mod:`statifier.fronts.kafka`) and NATS
JetStream (:mod:`statifier.fronts.nats`).

Requests: :func:`~statifier.fronts.webhook.webhook_app`,
:func:`~statifier.fronts.webhook.form_app` and
:func:`~statifier.fronts.basichttp.basichttp_app` are Starlette applications a host
mounts. See ``docs/fronts.md``.
"""
