"""The input-log timeline of an execution page: each replayed step with what it left
behind: its event's data, the errors it raised, and what became of each send it made.

A step's stored errors name it by their input-log ``seq`` (a create's by its ``via``). A
send names its rows by the idempotency key the router composed for it, which the replay
recomputes (:attr:`~statifier.console.replay.StepSend.key`): a pending timer row's
``dedup_key``, an outbox row's ``key``, a refused send's ``send_refused`` ledger
``message_id``. A timer row is deleted when it fires or is cancelled, so a delayed send
(or a send to the execution itself, which the router also makes a timer) with no row
left is followed through the log: the first later step that took its event via
``"timer"`` (its ``sendid`` the send's when the author wrote one) fired it; a later
``<cancel>`` of its id cancelled it; otherwise it is *gone* (it fired after the
execution ended, or into a route that keeps no row). Nothing is hidden: a send is listed
whatever became of it.

>>> from statifier.console.replay import StepSend
>>> send = StepSend("nudge", event="cart.nudge", type=None, target=None, delay_ms=60_000,
...                 author_id=True, key="ex_1/nudge/1/1/0/4/2", to_self=True)
>>> SendFate(send, "timer", "cancelled", step=3).describe()
'cancelled at step 3'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from statifier.console.queries import MAX_STEP_KEYS, ErrorView, StepRows, TimerView
from statifier.console.replay import ReplayStep, StepCancel, StepSend
from statifier.expr import tagged
from statifier.expr.values import Undefined
from statifier.router import LedgerRow, OutboxRow

__all__ = [
    "MAX_DATA_CHARS",
    "PREVIEW_CHARS",
    "SendFate",
    "TimelineStep",
    "error_steps",
    "made_by",
    "send_keys",
    "timeline",
]

PREVIEW_CHARS: Final = 120
"""The most characters of a step's event data shown in the timeline line itself."""

MAX_DATA_CHARS: Final = 20_000
"""The most characters of one step's event data a page shows (the step picked)."""

TIMER_VIA: Final = "timer"


@dataclass(frozen=True, slots=True)
class SendFate:
    """What became of one send a step made.

    Attributes:
        send: the send, as the replay recomputed it.
        kind: ``"timer"`` (it became a timer row), ``"outbox"`` (an outbox row),
            ``"refused"`` (the router refused it: a ``send_refused`` ledger row),
            ``"handed_on"`` (no row: to another execution, or the host's executor or
            route) or ``"unknown"`` (not looked up).
        status: for a timer ``pending``, ``fired``, ``cancelled`` or ``gone``; for an
            outbox row ``pending``, ``sent`` or ``dead``; else the kind again.
        timer, outbox, ledger: the row found, if any.
        step: the step that fired or cancelled it.
    """

    send: StepSend
    kind: str
    status: str
    _: KW_ONLY
    timer: TimerView | None = None
    outbox: OutboxRow | None = None
    ledger: LedgerRow | None = None
    step: int | None = None

    def describe(self) -> str:
        """What became of it, in a few words (without the row's own fields)."""
        if self.status == "fired":
            return f"fired at step {self.step}"
        if self.status == "cancelled":
            return f"cancelled at step {self.step}"
        if self.status == "gone":
            return "gone: no longer pending, and no logged step took it"
        if self.kind == "refused":
            reason = None if self.ledger is None else self.ledger.reason
            return f"refused: {reason}" if reason else "refused"
        if self.kind == "handed_on":
            return "handed on (no timer or outbox row)"
        if self.kind == "unknown":
            return "not looked up (too many sends on this page)"
        return self.status


@dataclass(frozen=True, slots=True)
class TimelineStep:
    """One step of the timeline as the page lists it.

    Attributes:
        step: the replayed step.
        gap: whether steps were left out before it.
        preview: its event's data as one line of JSON, cut to :data:`PREVIEW_CHARS`
            (``None`` when the event had no data).
        data: the whole data as indented JSON, cut to :data:`MAX_DATA_CHARS`, for the
            step picked; ``None`` otherwise.
        more: whether ``preview`` was cut.
        errors: the errors it raised, as stored, in the order raised.
        sends: what became of each send it made, in order.
        cancels: the send ids it cancelled, in order.
    """

    step: ReplayStep
    _: KW_ONLY
    gap: bool
    preview: str | None
    data: str | None
    more: bool
    errors: tuple[ErrorView, ...]
    sends: tuple[SendFate, ...]
    cancels: tuple[str, ...]


def send_keys(steps: Sequence[ReplayStep], listed: Iterable[ReplayStep]) -> list[str]:
    """The send keys to look up (:meth:`~statifier.console.queries.ConsoleQueries.step_rows`):
    those of the ``listed`` steps first, then every other step's, newest first, at most
    :data:`~statifier.console.queries.MAX_STEP_KEYS` (every send's row is needed to
    follow fires through the log; past the bound the listed steps come first)."""
    keys: dict[str, None] = {}
    for step in listed:
        keys.update((send.key, None) for send in step.sends)
    for step in reversed(steps):
        keys.update((send.key, None) for send in step.sends)
    return list(keys)[:MAX_STEP_KEYS]


def fates(
    steps: Sequence[ReplayStep], rows: StepRows, looked_up: Iterable[str]
) -> dict[str, SendFate]:
    """What became of every send of ``steps``, by send key (see the module docstring);
    ``rows`` are what :meth:`~statifier.console.queries.ConsoleQueries.step_rows`
    found for the keys ``looked_up``."""
    known = set(looked_up)
    found: dict[str, SendFate] = {}
    outstanding: list[StepSend] = []  # timers with no row left, oldest first
    for step in steps:
        if step.via == TIMER_VIA and step.event_name is not None:
            fired = next((s for s in outstanding if _fired_by(s, step)), None)
            if fired is not None:
                outstanding.remove(fired)
                found[fired.key] = SendFate(fired, "timer", "fired", step=step.index)
        for item in step.handed:
            if isinstance(item, StepCancel):
                for send in [s for s in outstanding if s.send_id == item.send_id]:
                    outstanding.remove(send)
                    found[send.key] = SendFate(send, "timer", "cancelled", step=step.index)
                continue
            found[item.key] = _found(item, rows, known)
            if found[item.key].status == "gone":
                outstanding.append(item)
    return found


def _fired_by(send: StepSend, step: ReplayStep) -> bool:
    """Whether ``step`` (via ``"timer"``) took ``send``'s event."""
    if send.event != step.event_name:
        return False
    return step.event_sendid == (send.send_id if send.author_id else None)


def _found(send: StepSend, rows: StepRows, known: set[str]) -> SendFate:
    """A send's fate by the rows its key names (``gone`` until the log says more)."""
    key = send.key
    if key not in known:
        return SendFate(send, "unknown", "unknown")
    timer = rows.timers.get(key)
    if timer is not None:
        return SendFate(send, "timer", "pending", timer=timer)
    row = rows.outbox.get(key)
    if row is not None:
        status = "sent" if row.sent_at is not None else "dead" if row.dead_at else "pending"
        return SendFate(send, "outbox", status, outbox=row)
    ledger = rows.refused.get(key)
    if ledger is not None:
        return SendFate(send, "refused", "refused", ledger=ledger)
    if send.to_self or send.delay_ms is not None:
        return SendFate(send, "timer", "gone")
    return SendFate(send, "handed_on", "handed_on")


def error_steps(steps: Sequence[ReplayStep], errors: Iterable[ErrorView]) -> dict[Any, int]:
    """The timeline step each stored error was raised in, by the error row's id (an
    error of a step the log does not hold is left out: a cancel's, or one past the
    log's cap)."""
    by_seq = {step.seq: step.index for step in steps if step.seq is not None}
    found: dict[Any, int] = {}
    for view in errors:
        error = view.error
        if error.seq is not None and error.seq in by_seq:
            found[view.id] = by_seq[error.seq]
        elif error.seq is None and error.via == "create" and steps:
            found[view.id] = 0  # a create that logged no start data is still step 0
    return found


def made_by(steps: Sequence[ReplayStep]) -> dict[str, int]:
    """The step that made each send, by send key."""
    return {send.key: step.index for step in steps for send in step.sends}


def timeline(
    listed: Sequence[tuple[ReplayStep, bool]],
    *,
    selected: int | None,
    errors: Mapping[int, Sequence[ErrorView]],
    fates: Mapping[str, SendFate],
) -> list[TimelineStep]:
    """The listed steps (each with whether a gap comes before it) with their data,
    errors (``errors``: by step index) and sends' ``fates``; the ``selected`` step's
    data in full."""
    made = []
    for step, gap in listed:
        preview, data, more = _data(step, step.index == selected)
        made.append(
            TimelineStep(
                step,
                gap=gap,
                preview=preview,
                data=data,
                more=more,
                errors=tuple(errors.get(step.index, ())),
                sends=tuple(
                    fates.get(send.key) or SendFate(send, "unknown", "unknown")
                    for send in step.sends
                ),
                cancels=tuple(i.send_id for i in step.handed if isinstance(i, StepCancel)),
            )
        )
    return made


def _data(step: ReplayStep, whole: bool) -> tuple[str | None, str | None, bool]:
    """``(preview, data, more)`` of a step's event data (see :class:`TimelineStep`)."""
    value = step.event_data
    if isinstance(value, Undefined):
        return None, None, False
    try:
        encoded = tagged.encode(value)
        line = json.dumps(encoded, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        line = repr(value)
        encoded = None
    more = len(line) > PREVIEW_CHARS
    preview = line[: PREVIEW_CHARS - 1] + "…" if more else line
    if not whole or not more:
        return preview, None, more
    text = (
        line
        if encoded is None
        else json.dumps(encoded, ensure_ascii=False, indent=2, sort_keys=True)
    )
    if len(text) > MAX_DATA_CHARS:
        left = len(text) - MAX_DATA_CHARS
        text = f"{text[:MAX_DATA_CHARS]}\n… ({left:,} more characters not shown)"
    return preview, text, more
