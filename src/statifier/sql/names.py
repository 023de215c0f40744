"""The names of statifier's tables as SQL text writes them.

>>> from statifier.sql import TableOptions
>>> names = TableNames.of(TableOptions(prefix="app_", schema="flow").define())
>>> names.executions, names.timers
('flow.app_executions', 'flow.app_timers')
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from statifier.sql.tables import Tables

__all__ = ["TableNames", "table_names"]


@dataclass(frozen=True, slots=True)
class TableNames:
    """The names of the tables (durable executions' and the router's) as SQL text writes
    them: with the prefix, and on PostgreSQL the schema. ``TableOptions`` admits only
    plain lowercase identifiers for both, so no name needs quoting."""

    charts: str
    positions: str
    executions: str
    inputs: str
    addresses: str
    dedupe: str
    routing_ledger: str
    timers: str
    outbox: str
    subscriptions: str
    inbound_events: str
    consumer_positions: str
    consumer_dead_letters: str
    partition_leases: str
    consumer_members: str
    child_answers: str
    fan_out_ends: str
    step_errors: str
    held_events: str
    schedules: str
    flow_groups: str
    flow_events: str
    active_slots: str
    held_creates: str
    locks: str
    store_place: str
    store_identity: str

    @classmethod
    def of(cls, tables: Tables) -> TableNames:
        options = tables.options
        schema = f"{options.schema}." if options.schema else ""
        return cls(
            *(
                f"{schema}{options.name(table)}"
                for table in (
                    "charts",
                    "positions",
                    "executions",
                    "inputs",
                    "addresses",
                    "dedupe",
                    "routing_ledger",
                    "timers",
                    "outbox",
                    "subscriptions",
                    "inbound_events",
                    "consumer_positions",
                    "consumer_dead_letters",
                    "partition_leases",
                    "consumer_members",
                    "child_answers",
                    "fan_out_ends",
                    "step_errors",
                    "held_events",
                    "schedules",
                    "flow_groups",
                    "flow_events",
                    "active_slots",
                    "held_creates",
                    "locks",
                    "store_place",
                    "store_identity",
                )
            )
        )


def table_names(tables: Tables) -> frozenset[str]:
    """Every table name of ``tables`` as SQL text writes it: what a missing-table error
    is checked against (:func:`statifier.sql.engines.tables_missing`)."""
    return frozenset(astuple(TableNames.of(tables)))
