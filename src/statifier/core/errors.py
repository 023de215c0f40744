"""The error events a step raised, as plain values.

A chart reports a failure as an event (``error.execution`` when an expression or an
element fails, ``error.communication`` when a send cannot be delivered): SCXML's way,
which a chart may answer with a transition. The interpreter reports each one as a
:class:`~statifier.core.effects.ChartError` effect, saying whether a transition took
it; :func:`step_errors` reads a step's effects into :class:`StepError` values, which
durable executions store and live sessions log, both in the same words
(:meth:`StepError.describe`).

>>> from statifier.chart import compile_chart
>>> from statifier.core import Event, handle_event, initialize
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
...     '<datamodel><data id="n" expr="0"/></datamodel>'
...     '<state id="a"><transition event="go" target="b">'
...     '<assign location="n" expr="_event.data * 2"/></transition></state>'
...     '<state id="b"/></scxml>'
... )
>>> state, _ = initialize(machine)
>>> state, effects = handle_event(state, Event("go", data="two"))
>>> (error,) = step_errors(effects)
>>> error.name, error.element, error.line, error.column, error.taken
('error.execution', 'assign', 1, 154, False)
>>> error.message
"'*' expects numbers, got a string"
>>> error.describe().endswith("(no transition took it)")
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any, Final

from statifier.core import effects as fx
from statifier.expr import Value

__all__ = ["MAX_ERROR_TEXT", "StepError", "step_error", "step_errors"]

MAX_ERROR_TEXT: Final = 1_000
"""The most characters of an error's message (or element, reason) kept: an expression
can fail on a value of any size, and quote it."""


@dataclass(frozen=True, slots=True)
class StepError:
    """One error event a step raised.

    Attributes:
        name: the event's name (``error.execution``, ``error.communication``...).
        taken: whether a transition of the chart took it.
        message: what went wrong, in the words of the element or host that failed.
        element: the element that failed (``assign``, ``send``, ``transition:0`` for a
            transition's condition...), when the chart raised it.
        line, column: where that element is in the chart's source.
        reason: the failure's short token (``multiply``, ``invalid``...).
        sendid: the send the error is about, if any.
        via, seq, recorded_at: the step it belongs to (how its event entered, its
            input-log entry if it has one, when it was stored); set when a durable
            execution's error is read back.
    """

    name: str
    _: KW_ONLY
    taken: bool
    message: str | None = None
    element: str | None = None
    line: int | None = None
    column: int | None = None
    reason: str | None = None
    sendid: str | None = None
    via: str | None = None
    seq: int | None = None
    recorded_at: datetime | None = None

    @classmethod
    def read(
        cls,
        name: str,
        data: Value,
        *,
        taken: bool,
        sendid: str | None = None,
        via: str | None = None,
        seq: int | None = None,
        recorded_at: datetime | None = None,
    ) -> StepError:
        """An error event's ``name`` and ``data`` as a value: ``message``, ``element``,
        ``reason``, ``line`` and ``column`` taken from ``data`` where they are of their
        kind (a string ``data`` is the message), text cut to :data:`MAX_ERROR_TEXT`
        characters; what is missing or of another kind is left unset, never refused."""
        return cls(
            name,
            taken=taken,
            sendid=sendid,
            via=via,
            seq=seq,
            recorded_at=recorded_at,
            **_fields(data),
        )

    def describe(self) -> str:
        """One line for an operator: :meth:`summary`, and whether a transition took
        it."""
        taken = "a transition took it" if self.taken else "no transition took it"
        return f"{self.summary()} ({taken})"

    def summary(self) -> str:
        """The name, where the chart raised it, and the message."""
        where = ""
        if self.element is not None:
            where = f" at <{self.element}>"
        if self.line is not None:
            where += f", line {self.line}" if where else f" at line {self.line}"
            if self.column is not None:
                where += f", column {self.column}"
        message = f": {self.message}" if self.message else ""
        return f"{self.name}{where}{message}"

    def as_json(self) -> dict[str, Any]:
        """The fields as a JSON-ready mapping (``recorded_at`` in ISO 8601)."""
        return {
            "name": self.name,
            "taken": self.taken,
            "message": self.message,
            "element": self.element,
            "line": self.line,
            "column": self.column,
            "reason": self.reason,
            "sendid": self.sendid,
            "via": self.via,
            "seq": self.seq,
            "recorded_at": None if self.recorded_at is None else self.recorded_at.isoformat(),
        }


def step_errors(effects: Iterable[fx.Effect]) -> tuple[StepError, ...]:
    """The error events among ``effects`` (a step's), in the order they were raised."""
    return tuple(step_error(e) for e in effects if isinstance(e, fx.ChartError))


def step_error(effect: fx.ChartError) -> StepError:
    """The error event one :class:`~statifier.core.effects.ChartError` reports."""
    event = effect.event
    return StepError.read(event.name, event.data, taken=effect.taken, sendid=event.sendid)


def _fields(data: Value) -> dict[str, Any]:
    """What an error event's data says, in :class:`StepError`'s fields, bounded."""
    if not isinstance(data, Mapping):
        return {} if data is None or not isinstance(data, str) else {"message": _text(data)}
    found: dict[str, Any] = {}
    for name in ("message", "element", "reason"):
        value = data.get(name)
        if isinstance(value, str):
            found[name] = _text(value)
    for name in ("line", "column"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
    return found


def _text(value: str) -> str:
    return value if len(value) <= MAX_ERROR_TEXT else value[: MAX_ERROR_TEXT - 1] + "…"
