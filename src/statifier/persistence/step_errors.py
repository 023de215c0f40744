"""The error events of durable steps: how they are stored, and what an error no
transition takes does to the execution.

The lifecycle reads a step's error events into :class:`~statifier.core.errors.StepError`
values (:func:`~statifier.core.errors.step_errors`, re-exported here), returns them
with the step (:attr:`~statifier.persistence.Stepped.errors`), counts them on the
execution, stores them (:class:`~statifier.persistence.records.ErrorRecord`, at most
:data:`MAX_STEP_ERRORS` a step), reports them as telemetry and logs them; and, under
:attr:`OnError.FAIL`, fails an execution whose step left an error untaken.

>>> from datetime import UTC, datetime
>>> error = StepError("error.execution", taken=False, element="assign", message="boom")
>>> at = datetime(2026, 1, 1, tzinfo=UTC)
>>> decode_error(error_record("e1", error, via="step", seq=3, recorded_at=at)).describe()
'error.execution at <assign>: boom (no transition took it)'
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from statifier.core.errors import StepError, step_errors
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
    sendid = detail.get("sendid")
    return StepError.read(
        record.name,
        detail,
        taken=record.taken,
        sendid=sendid if isinstance(sendid, str) else None,
        via=record.via,
        seq=record.seq,
        recorded_at=record.recorded_at,
    )
