"""BasicHTTP sends of durable executions, performed by the outbox drain.

A durable execution's ``<send type="basichttp" target="URL">`` is handed to the outbox
(queue ``basichttp``) inside the delivery that emitted it, and :func:`basichttp_sink`
performs it after the commit: it POSTs the event to the URL exactly as a live
session's BasicHTTP Event I/O Processor does
(:class:`~statifier.session.basichttp.BasicHTTP`), with the row's key as an
``Idempotency-Key`` header, so the receiver can tell a retry from a new send.

A POST that fails (an answer other than 2xx, a connection error, a timeout) raises,
and the drain tries it again with backoff. On the drain's last attempt the failure is
reported back instead: :func:`~statifier.router.deliver_event` delivers
``error.communication`` (``_event.sendid`` the send's author id, ``_event.data.message``
what went wrong) to the sending execution, under the plan ``basichttp_failure``
(``create=never``, deduped on the row's key for 72 hours, so a repeated report is a
duplicate), and the row is marked sent: settled. That delivery is the one step the
outbox drain drives: it runs under ``around_delivery`` and ``on_begin`` with
:attr:`~statifier.router.Entry.OUTBOX` and the scope of the execution's address row
(read before, outside them). A send whose event BasicHTTP cannot
carry is reported at once. When there is no one to tell (the execution has no address
row, or it has ended) the row is dead-lettered.

httpx comes with the ``http`` extra and is imported when a POST is performed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

from statifier.core import Event
from statifier.router.binding import Create, Plan
from statifier.router.config import Entry
from statifier.router.outbox import DeadLetter, OutboxMessage, Sink
from statifier.router.outcomes import Dropped, DropReason
from statifier.router.queries import address_of
from statifier.router.routing import Router
from statifier.router.sending import BASICHTTP_QUEUE
from statifier.session.basichttp import BasicHTTP
from statifier.session.handlers import Delivery

if TYPE_CHECKING:
    import httpx

__all__ = [
    "BASICHTTP_QUEUE",
    "FAILURE_HORIZON",
    "FAILURE_PLAN_ID",
    "BasicHTTPFailed",
    "basichttp_sink",
]

FAILURE_PLAN_ID: Final = "basichttp_failure"
"""The plan a failed send's ``error.communication`` is delivered under."""
FAILURE_HORIZON: Final = timedelta(hours=72)
"""How long a failure report stays deduped on the row's key."""
IDEMPOTENCY_HEADER: Final = "idempotency-key"


class BasicHTTPFailed(Exception):  # noqa: N818 - names the failure
    """A POST that did not land, raised so that the drain tries it again."""


def basichttp_sink(
    router: Router, *, timeout: float = 10.0, client: httpx.AsyncClient | None = None
) -> Sink:
    """The sink of the ``basichttp`` queue (see the module docstring).

    Args:
        router: the router whose executions sent: failures are
            delivered back through it.
        timeout: seconds a POST may take.
        client: an ``httpx.AsyncClient`` to POST with (the caller's to close); one per
            POST by default.

    The sink raises :class:`BasicHTTPFailed` for a failure the drain should retry and
    :class:`~statifier.router.outbox.DeadLetter` when the failure reaches no one; what
    the failure report's delivery raises (the database) is raised as it is.
    """
    processor = BasicHTTP(client, timeout=timeout)

    async def sink(message: OutboxMessage) -> None:
        planned = processor.plan(message.target, message.event)
        if isinstance(planned, str):
            # No attempt can change the verdict: tell the sender now.
            await _report(router, message, planned)
            return
        headers = {**planned.headers, IDEMPOTENCY_HEADER: message.key}
        failure = await processor.perform(
            Delivery(planned.target, planned.event, planned.body, headers)
        )
        if failure is None:
            return
        if not message.final:
            raise BasicHTTPFailed(failure)
        await _report(router, message, failure)

    return sink


async def _report(router: Router, message: OutboxMessage, reason: str) -> None:
    """Deliver ``error.communication`` for the failed send to its execution.

    Raises:
        DeadLetter: the execution has no address row, or it has ended.
    """
    execution_id = message.execution_id
    found = None if execution_id is None else await address_of(router, execution_id)
    if found is None:
        raise DeadLetter(f"{reason}; no addressed execution {execution_id!r} to tell")
    scope, document, key = found
    plan = Plan(FAILURE_PLAN_ID, document=document, create=Create.NEVER, horizon=FAILURE_HORIZON)
    event = Event(
        "error.communication", type="platform", data={"message": reason}, sendid=message.sendid
    )
    outcome = await router.deliver_event(
        plan, scope=scope, key=key, event=event, message_id=message.key, entry=Entry.OUTBOX
    )
    if isinstance(outcome, Dropped) and outcome.reason in (
        DropReason.NO_EXECUTION,
        DropReason.FINISHED,
    ):
        raise DeadLetter(f"{reason}; the execution is not there to tell ({outcome.reason.value})")
