"""scriba: projections that keep read models in step with event streams.

scriba is shipped in the ``statifier`` distribution but stands on its own: it
never imports statechart internals (``statifier.chart``, ``statifier.core``,
``statifier.session``). It needs the ``scriba`` extra (SQLAlchemy; the
``eventsourcing`` library for its notification-log source).
"""

from scriba.event import Event, Meta, ProjectionKey
from scriba.operations import Delete, Error, Execute, Insert, Multi, Operation, Result, Skip, Update

__all__ = [
    "Delete",
    "Error",
    "Event",
    "Execute",
    "Insert",
    "Meta",
    "Multi",
    "Operation",
    "ProjectionKey",
    "Result",
    "Skip",
    "Update",
]
