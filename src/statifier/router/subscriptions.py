"""Source invokes: a state of an execution that hears a binding's events only while it
is active.

A chart asks for it with an ``<invoke>`` of the configuration's ``source_type``,
naming the binding and nothing else:

.. code-block:: xml

    <state id="watching">
      <invoke type="myapp:source"><param name="binding" expr="'clicks_to_join'"/></invoke>
    </state>

Entering the state subscribes the execution to the binding: the send handler turns
the ``Invoke`` effect into one row of the ``subscriptions`` table, in the step's
transaction. Leaving it unsubscribes: the engine emits ``CancelInvoke`` for the
invocation when the state is exited (the execution's end included), and the send
handler deletes that row, and only that row, so two invocations of one binding in one
execution come and go independently. The key a subscription reads events under is the
execution's own address key, found by execution id: a chart never names a key (it
could name another execution's), and an execution with no address (one an
``always_new`` binding created) cannot subscribe.

A binding with ``subscription = true`` delivers only to an execution subscribed to it;
to any other, the delivery returns ``dropped: not_subscribed`` and steps nothing.
Bindings without the flag never read this table.

:meth:`Router.subscribe <statifier.router.Router.subscribe>` and
:meth:`~statifier.router.Router.unsubscribe` do the same from the host's own code, each
in a transaction of its own. A row outlives nothing it should not: apart from the
invocation's cancel, the address reaper deletes the subscriptions of the executions
whose address rows it deletes.

The statements are :class:`statifier.sql.subscriptions.SubscriptionTable`'s; this
module says what a row means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, Final

from statifier.core import effects as fx
from statifier.expr import UNDEFINED
from statifier.router.errors import RouterError
from statifier.router.transaction import Unit
from statifier.sql.dialect import Dialect
from statifier.sql.subscriptions import SubscriptionRow, SubscriptionTable
from statifier.sql.tables import Tables

__all__ = [
    "BINDING_PARAM",
    "Subscription",
    "SubscriptionRefused",
    "forget_addressed",
    "source_binding",
    "subscribe_in",
    "subscribed",
    "subscriptions_in",
    "unsubscribe_in",
]

BINDING_PARAM: Final = "binding"
"""The one param of a source invoke: the id of the binding it subscribes to."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscription:
    """One live subscription: the invocation ``invoke_id`` of the execution subscribed
    it to ``binding_id``, for events under the execution's address ``(scope, key)``."""

    binding_id: str
    execution_id: str
    invoke_id: str
    scope: str
    key: str
    inserted_at: datetime


class SubscriptionRefused(RouterError):  # noqa: N818 - names the refusal
    """A subscription the router will not write; nothing was.

    At the executor seam it is not raised: the chart hears ``error.execution`` with the
    invocation's id and ``reason`` as its message, and the step stands.

    Attributes:
        execution_id: the execution that asked.
        binding_id: the binding it named (``None`` when it named none).
        reason: why, in one line.
    """

    def __init__(self, execution_id: str, binding_id: str | None, reason: str) -> None:
        super().__init__(f"execution {execution_id!r}: {reason}")
        self.execution_id = execution_id
        self.binding_id = binding_id
        self.reason = reason


async def subscriptions_in(unit: Unit, execution_id: str) -> list[Subscription]:
    """The live subscriptions of ``execution_id``, oldest first, read in ``unit``."""
    rows = await _table(unit).of_execution(unit.tx.driver, execution_id)
    return [_subscription(row) for row in rows]


# Inside a router transaction: the send handler, the delivery and the reaper.


def source_binding(effect: fx.Invoke, execution_id: str) -> str:
    """The binding id a source invoke names.

    Raises:
        SubscriptionRefused: it has a ``src`` or ``<content>``, or its params are not
            exactly one non-empty string named ``binding``.
    """
    if effect.src is not None or effect.content is not UNDEFINED:
        raise SubscriptionRefused(execution_id, None, "a source invoke takes no src and no content")
    params = effect.data
    named = params.get(BINDING_PARAM) if isinstance(params, Mapping) else None
    if not isinstance(params, Mapping) or set(params) != {BINDING_PARAM}:
        raise SubscriptionRefused(
            execution_id, None, "a source invoke names a binding param and nothing else"
        )
    if not isinstance(named, str) or not named:
        raise SubscriptionRefused(
            execution_id, None, f"the binding param is a non-empty string, not {named!r}"
        )
    return named


async def subscribe_in(
    unit: Unit, execution_id: str, binding_id: str, invoke_id: str, now: datetime
) -> Subscription:
    """Subscribe ``execution_id`` to ``binding_id`` under the invocation ``invoke_id``
    in ``unit``, the row stamped ``now``. Subscribing an invocation that is already
    subscribed writes nothing and returns the row written first.

    Raises:
        SubscriptionRefused: the execution has no address, or the binding is unknown in
            its scope, disabled, not a ``subscription`` binding, or addresses another
            document.
        Exception: what the bindings resolver raised.
    """
    address = await unit.sql.address_of(execution_id)
    if address is None:
        raise SubscriptionRefused(
            execution_id,
            binding_id,
            "it has no address to subscribe under (an always_new binding created it)",
        )
    scope, document, key = address
    found = next((b for b in await unit.config.bindings_for(scope) if b.id == binding_id), None)
    why = None
    if found is None:
        why = f"no binding {binding_id!r} in scope {scope!r}"
    elif not found.enabled:
        why = f"binding {binding_id!r} is disabled"
    elif not found.subscription:
        why = f"binding {binding_id!r} is not a subscription binding"
    elif found.document != document:
        why = f"binding {binding_id!r} addresses {found.document!r}, not {document!r}"
    if why is not None:
        raise SubscriptionRefused(execution_id, binding_id, why)
    table, driver = _table(unit), unit.tx.driver
    await table.insert(
        driver,
        binding_id=binding_id,
        execution_id=execution_id,
        invoke_id=invoke_id,
        scope=scope,
        key=key,
        inserted_at=now,
    )
    # A redriven step (or a second call) inserted nothing: answer the row that stands.
    rows = await table.of_execution(driver, execution_id)
    return _subscription(next(row for row in rows if row.invoke_id == invoke_id))


async def unsubscribe_in(unit: Unit, execution_id: str, invoke_id: str) -> bool:
    """Delete the subscription of the invocation ``invoke_id`` of ``execution_id`` in
    ``unit``, and nothing else (not the execution's other subscriptions, not its
    address); returns whether there was one."""
    return await _table(unit).delete(unit.tx.driver, execution_id, invoke_id)


async def subscribed(unit: Unit, binding_id: str, execution_id: str, scope: str, key: str) -> bool:
    """Whether a live subscription of ``execution_id`` to ``binding_id`` under ``(scope,
    key)`` exists, read under the execution's lock where the database has more than one
    writer (PostgreSQL).

    The lock is the one the step takes next (held until the commit either way): a
    step of the execution that is subscribing or cancelling right now has committed
    before the read, so the answer stays true for the step that follows.

    Raises:
        LockTimeout: the lock was not granted within ``lock_wait``.
    """
    table, tx = _table(unit), unit.tx
    if table.dialect.single_writer:
        # The database's single writer, held by this transaction, already excludes them.
        return await table.exists(tx.driver, binding_id, execution_id, scope, key)
    async with tx.adapter.exclusive(execution_id, unit.config.lock_wait):
        return await table.exists(tx.driver, binding_id, execution_id, scope, key)


async def forget_addressed(unit: Unit, address_ids: Sequence[Any]) -> int:
    """Delete the subscriptions of the executions the address rows ``address_ids``
    name (before those rows go); returns how many."""
    if not address_ids:
        return 0
    return await _table(unit).delete_addressed(unit.tx.driver, address_ids)


# The table, made once per set of tables and database.


@cache
def _made(tables: Tables, dialect: Dialect) -> SubscriptionTable:
    return SubscriptionTable(tables, dialect)


def _table(unit: Unit) -> SubscriptionTable:
    adapter = unit.tx.adapter
    return _made(adapter.tables, adapter.dialect)


def _subscription(row: SubscriptionRow) -> Subscription:
    return Subscription(
        binding_id=row.binding_id,
        execution_id=row.execution_id,
        invoke_id=row.invoke_id,
        scope=row.scope,
        key=row.key,
        inserted_at=row.inserted_at,
    )
