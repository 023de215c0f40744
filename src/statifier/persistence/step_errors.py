"""The error events of durable steps: what a step raised, how it is stored, and what
an error no transition takes does to the execution.

A chart reports a failure as an event (``error.execution`` when an expression or an
element fails, ``error.communication`` when a send cannot be delivered): SCXML's way,
which a chart may answer with a transition. The interpreter reports each one as a
:class:`~statifier.core.effects.ChartError` effect, saying whether a transition took
it. The lifecycle turns those into :class:`StepError` values, returns them with the
step (:attr:`~statifier.persistence.Stepped.errors`), counts them on the execution,
stores them (:class:`~statifier.persistence.records.ErrorRecord`, at most
:data:`MAX_STEP_ERRORS` a step), reports them as telemetry and logs them; and, under
:attr:`OnError.FAIL`, fails an execution whose step left an error untaken.

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
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, Final

from statifier.core import effects as fx
from statifier.expr import Value
from statifier.persistence.records import ErrorRecord

__all__ = [
    "MAX_STEP_ERRORS",
    "ErrorPolicy",
    "OnError",
    "StepError",
    "decode_error",
    "error_record",
    "step_errors",
]

MAX_STEP_ERRORS: Final = 16
"""The most error records one step stores; every error is counted on the execution
(a chart whose condition fails in a loop can raise thousands in one step)."""
MAX_ERROR_TEXT: Final = 1_000
"""The most characters of an error's message (or element, reason) stored."""


class OnError(enum.Enum):
    """What an error event that no transition takes does to its execution.

    ``CONTINUE`` is SCXML's behaviour: the error is an event, and one the chart does
    not take changes nothing (it is recorded, counted, reported and logged all the
    same). ``FAIL`` ends the execution as ``failed``, its failure the error: for charts
    whose author did not route errors, where an error means the process cannot go on.
    """

    CONTINUE = "continue"
    FAIL = "fail"

    @classmethod
    def of(cls, value: OnError | str) -> OnError:
        """``value`` as an :class:`OnError` (``"continue"`` or ``"fail"``).

        Raises:
            ValueError: any other value.
        """
        if isinstance(value, OnError):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"on_error is 'continue' or 'fail', not {value!r}") from None


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    """:class:`OnError` per chart: ``charts`` by content hash, ``default`` for every
    other chart.

    >>> policy = ErrorPolicy(OnError.CONTINUE, {"h1": OnError.FAIL})
    >>> policy.of("h1"), policy.of("h2")
    (<OnError.FAIL: 'fail'>, <OnError.CONTINUE: 'continue'>)
    """

    default: OnError = OnError.CONTINUE
    charts: Mapping[str, OnError] = field(default_factory=dict)

    def of(self, content_hash: str) -> OnError:
        """The policy of the chart ``content_hash``."""
        return self.charts.get(content_hash, self.default)

    @classmethod
    def of_value(cls, value: ErrorPolicy | OnError | str) -> ErrorPolicy:
        """``value`` as a policy: one :class:`OnError` (or its name) for every chart.

        Raises:
            ValueError: a name other than ``continue`` and ``fail``.
        """
        if isinstance(value, ErrorPolicy):
            return value
        return cls(OnError.of(value))


@dataclass(frozen=True, slots=True)
class StepError:
    """One error event a durable step raised.

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
            input-log entry if it has one, when it was stored); set when read back.
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
    return tuple(_from_effect(e) for e in effects if isinstance(e, fx.ChartError))


def _from_effect(effect: fx.ChartError) -> StepError:
    event = effect.event
    fields = _fields(event.data)
    return StepError(event.name, taken=effect.taken, sendid=event.sendid, **fields)


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


def error_record(
    execution_id: str, error: StepError, *, via: str, seq: int | None, recorded_at: datetime
) -> ErrorRecord:
    """The stored form of ``error``, raised by a step of ``execution_id`` (its bytes
    are plain: the storage encodes them)."""
    detail = {
        key: value
        for key, value in (
            ("message", error.message),
            ("element", error.element),
            ("line", error.line),
            ("column", error.column),
            ("reason", error.reason),
            ("sendid", error.sendid),
        )
        if value is not None
    }
    return ErrorRecord(
        execution_id,
        seq=seq,
        via=via,
        name=error.name,
        taken=error.taken,
        error=json.dumps(detail, sort_keys=True, separators=(",", ":")).encode(),
        recorded_at=recorded_at,
    )


def decode_error(record: ErrorRecord) -> StepError:
    """A stored error read back (its bytes already decoded by the storage's codec);
    fields it cannot read are left unset rather than refused."""
    try:
        detail = json.loads(record.error)
    except ValueError:
        detail = {}
    if not isinstance(detail, dict):
        detail = {}
    fields = _fields(detail)
    sendid = detail.get("sendid")
    return StepError(
        record.name,
        taken=record.taken,
        sendid=sendid if isinstance(sendid, str) else None,
        via=record.via,
        seq=record.seq,
        recorded_at=record.recorded_at,
        **fields,
    )
