"""Host registries for ``<send type>`` and ``<invoke type>``: what a handler looks like.

A session performs SCXML sends and ``<invoke type="scxml">`` itself. Every other type
is handled by a handler the host registers per session
(``System.start(..., send_types=..., invoke_types=...)``); the core refuses the types
nobody registered with ``error.execution``.

A handler comes in two parts, so that what can be decided without I/O is decided
inside the step, in order, and only the transport waits:

- :class:`SendType`: ``plan(target, event)`` is pure: it checks the target and builds a
  :class:`Delivery`, or returns why it cannot (the session raises
  ``error.communication`` in the sender at once). ``perform(delivery)`` is effectful
  and runs in a task; an error message it returns (or an exception it raises) becomes
  ``error.communication`` in the sender when the transport answers.
- :class:`InvokeType`: ``plan(effect)`` is pure and builds an :class:`InvokePlan`, or
  returns why the invocation cannot start (``error.execution`` with the invoke id);
  ``start``, ``cancel`` and ``forward`` are effectful. The service talks back through
  the :class:`InvokePort` it is given.

>>> from statifier.core import Event
>>> class Shout:
...     def plan(self, target, event):
...         return Delivery(target, event) if target == "everyone" else "nobody to shout at"
...     async def perform(self, delivery):
...         return None
>>> Shout().plan("everyone", Event("hey")).target, Shout().plan("x", Event("hey"))
('everyone', 'nobody to shout at')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol, runtime_checkable

from statifier.core import Event
from statifier.core import effects as fx
from statifier.expr import UNDEFINED, Value

__all__ = [
    "Addressable",
    "Delivery",
    "InvokePlan",
    "InvokePort",
    "InvokeType",
    "SendType",
    "invocation_done",
    "invocation_failed",
]


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one send hands its transport: where, which event, the bytes and headers the
    transport needs (empty for transports that carry events as values), and the send
    effect it carries out."""

    target: str
    event: Event
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    send: fx.Send | fx.SendDelayed | None = None
    """The send it carries out (the session sets it after ``plan``): its counters and
    send id are what a transport composes an idempotency key from."""


class SendType(Protocol):
    """A send type: a pure planning part and an effectful perform part."""

    def plan(self, target: str | None, event: Event) -> Delivery | str:
        """The delivery for ``event`` to ``target``, or why there can be none. Pure."""
        ...

    async def perform(self, delivery: Delivery) -> str | None:
        """Carry the delivery out; ``None`` when delivered, else what went wrong."""
        ...


@runtime_checkable
class Addressable(Protocol):
    """A send type that can also receive: it names where a session can be reached, and
    the session lists that location in ``_ioprocessors`` under the type's names."""

    def location(self, session_id: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class InvokePlan:
    """A checked invocation: the fields of the ``Invoke`` effect a service needs."""

    invoke_id: str
    _: KW_ONLY
    type: str
    src: str | None = None
    data: Value = UNDEFINED
    content: Value = UNDEFINED

    @classmethod
    def of(cls, effect: fx.Invoke) -> InvokePlan:
        """The plan that takes the effect as it is."""
        return cls(
            effect.invoke_id,
            type=effect.type,
            src=effect.src,
            data=effect.data,
            content=effect.content,
        )


class InvokePort(Protocol):
    """How a service talks to the session that invoked it. Both calls queue an external
    event on that session, tagged with the invoke id; after ``done`` or once the
    invocation is cancelled, calls are ignored."""

    def send_to_parent(self, event: Event | str) -> None:
        """Queue ``event`` (its ``invokeid`` set) on the invoking session; raises
        :class:`statifier.session.live.SessionQueueFull` when that session's queue is
        full (:attr:`statifier.session.live.System.max_queued`)."""
        ...

    def done(self, donedata: Value = UNDEFINED) -> None:
        """Queue ``done.invoke.<id>`` with ``donedata``; the invocation is over."""
        ...

    def fail(self, reason: str, *, attempts: int = 1, detail: Value = UNDEFINED) -> None:
        """Queue ``error.communication.invoke.<id>`` (see :func:`invocation_failed`):
        the service failed for good and the invocation is over."""
        ...


class InvokeType(Protocol):
    """An invoke type other than SCXML (which sessions always handle themselves)."""

    def plan(self, effect: fx.Invoke) -> InvokePlan | str:
        """The invocation to start, or why it cannot start. Pure."""
        ...

    async def start(self, plan: InvokePlan, port: InvokePort) -> str | None:
        """Start the service; ``None`` when started, else why it did not start. A
        service that runs on should do so in its own task and return."""
        ...

    async def cancel(self, invoke_id: str) -> None:
        """Stop the service: the invoking state was exited. What it raises is logged as
        a warning (no chart is left to hear it)."""
        ...

    async def forward(self, invoke_id: str, event: Event) -> None:
        """Hand the service an event (autoforward, or a send to ``#_<invokeid>``). What it
        raises queues ``error.communication`` on the invoking session."""
        ...


def invocation_done(invoke_id: str, donedata: Value = UNDEFINED) -> Event:
    """The event that tells an invoking chart its invocation finished:
    ``done.invoke.<id>`` carrying the donedata, tagged with the invoke id. Sessions and
    the durable ``Driver`` both build it here, so a chart sees the same event either way.

    >>> invocation_done("pay", {"auth": "A1"}).name
    'done.invoke.pay'
    """
    return Event(f"done.invoke.{invoke_id}", data=donedata, invokeid=invoke_id)


def invocation_failed(
    invoke_id: str, reason: str, *, attempts: int = 1, detail: Value = UNDEFINED
) -> Event:
    """The event that tells an invoking chart its invocation failed for good:
    ``error.communication.invoke.<id>`` whose data holds ``reason``, ``attempts`` and
    ``detail``, tagged with the invoke id.

    >>> event = invocation_failed("pay", "declined", attempts=3)
    >>> event.name, event.data["reason"], event.data["attempts"]
    ('error.communication.invoke.pay', 'declined', 3)
    """
    data: dict[str, Value] = {"reason": reason, "attempts": attempts, "detail": detail}
    return Event(f"error.communication.invoke.{invoke_id}", data=data, invokeid=invoke_id)
