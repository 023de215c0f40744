"""What routing one event returns: an inbound event in, one outcome per binding out.

Every outcome is a plain frozen value. All but :class:`NoMatch` are written to the
routing ledger; ``outcome`` is the ledger's spelling of each.

>>> Dropped(
...     "clicks_to_join", reason=DropReason.FINISHED, key="imp_7f3a", execution_id="ex_01"
... ).outcome
'dropped: finished'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import ClassVar, Final

from statifier.expr import Value
from statifier.persistence import Stepped
from statifier.router.errors import InvalidEvent

__all__ = [
    "Buffered",
    "CreatedAndDelivered",
    "Delivered",
    "DropReason",
    "Dropped",
    "Duplicate",
    "Failed",
    "Held",
    "InboundEvent",
    "KeyRefused",
    "NoMatch",
    "Outcome",
    "Routed",
]

MAX_ID_LENGTH: Final = 1_024


@dataclass(frozen=True, slots=True, kw_only=True)
class InboundEvent:
    """An event handed to the router.

    Attributes:
        scope: the host's scope (a tenant, an environment); never read from the event.
        source: the source's name; bindings are chosen by it.
        message_id: the message's identity in its source, the same on every redelivery
            (a topic/partition/offset, a provider's event id, a body hash).
        data: the normalized event, bound as ``event`` in match and key programs.

    Raises:
        InvalidEvent: an empty or over-long scope, source or message id, or data that
            is not a mapping.
    """

    scope: str
    source: str
    message_id: str
    data: Mapping[str, Value] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("scope", "source", "message_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidEvent(f"an inbound event needs a {name}: got {value!r}")
            if len(value) > MAX_ID_LENGTH:
                raise InvalidEvent(f"the {name} is longer than {MAX_ID_LENGTH} characters")
        if not isinstance(self.data, Mapping):
            raise InvalidEvent(f"an inbound event's data is a mapping, not {type(self.data)}")


class DropReason(StrEnum):
    """Why a delivery reached no execution, or changed nothing in it."""

    NO_EXECUTION = "no_execution"
    """``create = never`` and the address names no execution."""
    FINISHED = "finished"
    """The addressed execution has ended; it is not reopened."""
    UNMATCHED_EVENT = "unmatched_event"
    """The execution took the event but no transition was selected (it is in the input
    log)."""
    NOT_SUBSCRIBED = "not_subscribed"
    """A subscription binding's event reached an execution that no live source invoke
    has subscribed to that binding: it was not stepped (it is not in the input log)."""
    OVER_LIMIT = "over_limit"
    """The event would create an execution of a document whose cap
    (:class:`~statifier.router.config.Cap`, ``over = "drop"``) is full."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """Stepped into the execution the address already named.

    ``step`` is what the delivery's step left, as its transaction committed it (the
    record, the new position, the errors it raised); it is neither compared nor shown
    in ``repr``, and ``None`` on an outcome built by hand.
    """

    binding_id: str
    _: KW_ONLY
    key: str
    execution_id: str
    step: Stepped | None = field(default=None, compare=False, repr=False)
    outcome: ClassVar[str] = "delivered"


@dataclass(frozen=True, slots=True)
class CreatedAndDelivered:
    """A new execution was created for the event and stepped with it; ``step`` as
    :class:`Delivered`'s."""

    binding_id: str
    _: KW_ONLY
    key: str
    execution_id: str
    step: Stepped | None = field(default=None, compare=False, repr=False)
    outcome: ClassVar[str] = "created_and_delivered"


@dataclass(frozen=True, slots=True)
class Held:
    """The addressed execution is paused: the event is kept (a ``held_events`` row,
    written with the ledger's) and stepped in, in the order it came, when the execution
    resumes (:meth:`Router.resume <statifier.router.Router.resume>`)."""

    binding_id: str
    _: KW_ONLY
    key: str
    execution_id: str
    outcome: ClassVar[str] = "held"


@dataclass(frozen=True, slots=True)
class Buffered:
    """The binding's ``mode`` (debounce, batch or throttle) holds the event under its
    address (a ``flow_events`` row, written with the ledger's): it reaches the
    execution later, in its key's order (:mod:`statifier.router.flow`)."""

    binding_id: str
    _: KW_ONLY
    key: str
    outcome: ClassVar[str] = "buffered"


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The binding had already claimed this message id within its horizon."""

    binding_id: str
    _: KW_ONLY
    key: str
    outcome: ClassVar[str] = "duplicate"


@dataclass(frozen=True, slots=True)
class NoMatch:
    """The binding's match did not hold (false, null or undefined). Counted in
    telemetry, never written."""

    binding_id: str
    outcome: ClassVar[str] = "no_match"


@dataclass(frozen=True, slots=True)
class KeyRefused:
    """The binding's match or key program returned something unusable; ``reason`` says
    which program and what (e.g. ``"key value: undefined"``)."""

    binding_id: str
    _: KW_ONLY
    reason: str
    outcome: ClassVar[str] = "key_refused"


@dataclass(frozen=True, slots=True)
class Dropped:
    """The delivery reached no execution, or changed nothing in it; ``step`` is
    :class:`Delivered`'s for ``unmatched_event`` (the event is in the input log,
    unused), else ``None``."""

    binding_id: str
    _: KW_ONLY
    reason: DropReason
    key: str
    execution_id: str | None = None
    step: Stepped | None = field(default=None, compare=False, repr=False)

    @property
    def outcome(self) -> str:
        return f"dropped: {self.reason.value}"


Outcome = (
    Delivered | CreatedAndDelivered | Held | Buffered | Duplicate | NoMatch | KeyRefused | Dropped
)
"""One binding's outcome for one event."""


@dataclass(frozen=True, slots=True)
class Routed:
    """One event routed: an outcome per enabled binding of its source, in the order of
    the bindings; ``notices`` says what the caller should know that is no outcome (the
    deliveries scheduled timers and no timer worker runs in this process to fire
    them)."""

    event: InboundEvent
    outcomes: tuple[Outcome, ...]
    notices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Failed:
    """One event of a batch whose routing raised: its deliveries were rolled back (those
    of earlier bindings of the same event stand), and it must not be acknowledged."""

    event: InboundEvent
    error: BaseException
