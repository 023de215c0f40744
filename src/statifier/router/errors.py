"""What the router raises. An error is never an outcome: it writes no ledger row, the
delivery it happened in is rolled back, and a front must not acknowledge the message.

Errors of the layers below (a database that is down, a lock wait that ran out, an
executor that raised) propagate unchanged: they are typed where they come from.
"""

from __future__ import annotations

__all__ = [
    "BindingError",
    "BindingsUnresolved",
    "ChartUnresolved",
    "ConfigError",
    "ExecutionParked",
    "InvalidEvent",
    "OnCompleteFailed",
    "RouterError",
    "UnresolvedDocument",
]


class RouterError(Exception):
    """Base of the router's own errors."""


class ConfigError(RouterError, ValueError):
    """A configuration the router refuses at construction, naming what is wrong."""


class BindingError(ConfigError):
    """A binding the router refuses, naming the binding and the field.

    Attributes:
        binding_id: the binding's id (``"?"`` when it has none yet).
        field: the offending field.
    """

    def __init__(self, binding_id: str, field: str, message: str) -> None:
        super().__init__(f"binding {binding_id!r}, field {field!r}: {message}")
        self.binding_id = binding_id
        self.field = field


class InvalidEvent(RouterError, ValueError):  # noqa: N818 - names the refusal
    """An inbound event the router cannot route: no message id, no scope, data that is
    not a mapping. Nothing was written."""


class BindingsUnresolved(RouterError):  # noqa: N818 - names the refusal
    """The bindings resolver failed, or returned bindings the router refuses, for a
    scope; nothing was evaluated."""

    def __init__(self, scope: str, reason: str) -> None:
        super().__init__(f"no bindings for scope {scope!r}: {reason}")
        self.scope = scope
        self.reason = reason


class UnresolvedDocument(RouterError):  # noqa: N818 - names the refusal
    """The resolver could not name a chart for a new execution of ``document``; the
    delivery was rolled back."""

    def __init__(self, scope: str, document: str, reason: str) -> None:
        super().__init__(f"no chart for document {document!r} in scope {scope!r}: {reason}")
        self.scope = scope
        self.document = document
        self.reason = reason


class ChartUnresolved(RouterError):  # noqa: N818 - names the refusal
    """The chart resolver could not name the chart an existing execution runs."""

    def __init__(self, content_hash: str, reason: str) -> None:
        super().__init__(f"no chart for content hash {content_hash}: {reason}")
        self.content_hash = content_hash
        self.reason = reason


class ExecutionParked(RouterError):  # noqa: N818 - names the refusal
    """The addressed execution is parked (``needs_migration``) and takes no events
    until it is unparked; the delivery was rolled back so the event is not lost."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"execution {execution_id!r} is parked and takes no events")
        self.execution_id = execution_id


class OnCompleteFailed(RouterError):  # noqa: N818 - names the refusal
    """The ``on_complete`` route refused the finishing delivery's hand-off: the delivery
    rolls back, and the execution stays where it was before that step."""

    def __init__(self, route: str, execution_id: str, reason: str) -> None:
        super().__init__(f"on_complete route {route!r} refused {execution_id!r}: {reason}")
        self.route = route
        self.execution_id = execution_id
        self.reason = reason
