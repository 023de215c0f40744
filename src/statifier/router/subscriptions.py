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
to any other, the delivery answers ``dropped: not_subscribed`` and steps nothing.
Bindings without the flag never read this table.

:func:`subscribe` and :func:`unsubscribe` do the same from the host's own code, each in
a transaction of its own. A row outlives nothing it should not: apart from the
invocation's cancel, the address reaper deletes the subscriptions of the executions
whose address rows it deletes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from statifier.core import effects as fx
from statifier.expr import UNDEFINED
from statifier.router.errors import RouterError
from statifier.sql.dialect import utc_text, utc_time
from statifier.sql.names import TableNames

if TYPE_CHECKING:
    from statifier.router.config import RouterConfig
    from statifier.router.transaction import Unit

__all__ = [
    "BINDING_PARAM",
    "Subscription",
    "SubscriptionRefused",
    "subscribe",
    "subscriptions_of",
    "unsubscribe",
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


async def subscribe(
    config: RouterConfig, execution_id: str, binding_id: str, invoke_id: str
) -> Subscription:
    """Subscribe ``execution_id`` to ``binding_id`` under the invocation ``invoke_id``,
    as a source invoke does, in a transaction of its own. Subscribing an invocation
    that is already subscribed writes nothing and answers the row written first.

    Raises:
        SubscriptionRefused: the execution has no address, or the binding is unknown in
            its scope, disabled, not a ``subscription`` binding, or addresses another
            document.
        ValueError: an empty ``invoke_id``.
    """
    given: object = invoke_id
    if not isinstance(given, str) or not given:
        raise ValueError(f"an invoke id is a non-empty string, not {given!r}")
    async with config.transaction() as unit:
        return await subscribe_in(
            unit, config, execution_id, binding_id, invoke_id, config.storage.clock()
        )


async def unsubscribe(config: RouterConfig, execution_id: str, invoke_id: str) -> bool:
    """Delete the subscription of the invocation ``invoke_id`` of ``execution_id``, and
    nothing else (not the execution's other subscriptions, not its address); answers
    whether there was one."""
    async with config.transaction() as unit:
        return await unsubscribe_in(unit, execution_id, invoke_id)


async def subscriptions_of(config: RouterConfig, execution_id: str) -> list[Subscription]:
    """The live subscriptions of ``execution_id``, oldest first."""
    async with config.transaction() as unit:
        return await _Session(unit).of_execution(execution_id)


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
    unit: Unit,
    config: RouterConfig,
    execution_id: str,
    binding_id: str,
    invoke_id: str,
    now: datetime,
) -> Subscription:
    """:func:`subscribe` in ``unit``, the row stamped ``now``.

    Raises:
        SubscriptionRefused: see :func:`subscribe`.
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
    found = next((b for b in await config.bindings_for(scope) if b.id == binding_id), None)
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
    row = Subscription(
        binding_id=binding_id,
        execution_id=execution_id,
        invoke_id=invoke_id,
        scope=scope,
        key=key,
        inserted_at=now,
    )
    session = _Session(unit)
    await session.insert(row)
    # A redriven step (or a second call) inserted nothing: answer the row that stands.
    return next(s for s in await session.of_execution(execution_id) if s.invoke_id == invoke_id)


async def unsubscribe_in(unit: Unit, execution_id: str, invoke_id: str) -> bool:
    """:func:`unsubscribe` in ``unit``."""
    return await _Session(unit).delete(execution_id, invoke_id)


async def subscribed(
    unit: Unit, config: RouterConfig, binding_id: str, execution_id: str, scope: str, key: str
) -> bool:
    """Whether a live subscription of ``execution_id`` to ``binding_id`` under ``(scope,
    key)`` exists, read under the execution's lock on PostgreSQL.

    The lock is the one the step takes next (held until the commit either way): a
    step of the execution that is subscribing or cancelling right now has committed
    before the read, so the answer stays true for the step that follows.

    Raises:
        LockTimeout: the lock was not granted within ``lock_wait``.
    """
    session = _Session(unit)
    if not session.postgres:
        # SQLite's single writer, held by this transaction, already excludes them.
        return await session.exists(binding_id, execution_id, scope, key)
    async with unit.tx.adapter.exclusive(execution_id, config.lock_wait):
        return await session.exists(binding_id, execution_id, scope, key)


async def forget_addressed(unit: Unit, address_ids: Sequence[Any]) -> int:
    """Delete the subscriptions of the executions the address rows ``address_ids``
    name (before those rows go); answers how many."""
    if not address_ids:
        return 0
    return await _Session(unit).forget_addressed(address_ids)


# The SQL, per database.


@dataclass(frozen=True, slots=True)
class _Statements:
    insert: str
    delete: str
    exists: str
    of_execution: str
    forget_addressed: str


_COLUMNS: Final = ("binding_id", "execution_id", "invoke_id", "scope", "key", "inserted_at")


@cache
def _statements(names: TableNames, postgres: bool, client_keys: bool) -> _Statements:
    subscriptions, addresses = names.subscriptions, names.addresses

    def mark(name: str) -> str:
        return f"%({name})s" if postgres else f":{name}"

    columns = ("id", *_COLUMNS) if client_keys else _COLUMNS
    # Address ids as one parameter: an array on PostgreSQL, a JSON list on SQLite.
    among = "= ANY(%(ids)s)" if postgres else "IN (SELECT value FROM json_each(:ids))"
    return _Statements(
        insert=(
            f"INSERT INTO {subscriptions} ({', '.join(columns)}) VALUES "
            f"({', '.join(mark(c) for c in columns)}) "
            "ON CONFLICT (execution_id, invoke_id) DO NOTHING"
        ),
        delete=(
            f"DELETE FROM {subscriptions} WHERE execution_id = {mark('execution_id')} "
            f"AND invoke_id = {mark('invoke_id')}"
        ),
        # The leading columns of the (binding_id, scope, key) index, then the execution.
        exists=(
            f"SELECT 1 FROM {subscriptions} WHERE binding_id = {mark('binding_id')} "
            f"AND scope = {mark('scope')} AND key = {mark('key')} "
            f"AND execution_id = {mark('execution_id')} LIMIT 1"
        ),
        of_execution=(
            f"SELECT {', '.join(_COLUMNS)} FROM {subscriptions} "
            f"WHERE execution_id = {mark('execution_id')} ORDER BY inserted_at, id"
        ),
        forget_addressed=(
            f"DELETE FROM {subscriptions} WHERE execution_id IN "
            f"(SELECT execution_id FROM {addresses} WHERE id {among})"
        ),
    )


class _Session:
    """The statements on one router transaction's driver connection: psycopg 3 async
    on PostgreSQL, ``sqlite3`` (UTC times as text) on SQLite."""

    __slots__ = ("_driver", "_key", "_s", "postgres")

    def __init__(self, unit: Unit) -> None:
        tables = unit.tx.adapter.tables
        self.postgres = unit.tx.adapter.dialect.name == "postgresql"
        self._driver = unit.tx.driver
        self._key = tables.options.key_default
        self._s = _statements(TableNames.of(tables), self.postgres, self._key is not None)

    async def _run(self, sql: str, values: Mapping[str, Any]) -> tuple[list[Any], int]:
        """The rows ``sql`` answers (none for a plain write) and its row count."""
        if self.postgres:
            cursor = await self._driver.execute(sql, values)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return rows, int(cursor.rowcount)
        cursor = self._driver.execute(sql, values)
        return cursor.fetchall(), int(cursor.rowcount)

    async def insert(self, row: Subscription) -> None:
        values: dict[str, Any] = {
            "binding_id": row.binding_id,
            "execution_id": row.execution_id,
            "invoke_id": row.invoke_id,
            "scope": row.scope,
            "key": row.key,
            "inserted_at": row.inserted_at if self.postgres else utc_text(row.inserted_at),
        }
        if self._key is not None:
            values["id"] = self._key() if self.postgres else self._key().hex
        await self._run(self._s.insert, values)

    async def delete(self, execution_id: str, invoke_id: str) -> bool:
        values = {"execution_id": execution_id, "invoke_id": invoke_id}
        _, count = await self._run(self._s.delete, values)
        return count > 0

    async def exists(self, binding_id: str, execution_id: str, scope: str, key: str) -> bool:
        values = {"binding_id": binding_id, "execution_id": execution_id, "scope": scope}
        rows, _ = await self._run(self._s.exists, {**values, "key": key})
        return bool(rows)

    async def of_execution(self, execution_id: str) -> list[Subscription]:
        rows, _ = await self._run(self._s.of_execution, {"execution_id": execution_id})
        found = []
        for binding_id, execution, invoke_id, scope, key, at in rows:
            inserted_at = at if self.postgres else utc_time(at)
            assert inserted_at is not None  # inserted_at is NOT NULL
            found.append(
                Subscription(
                    binding_id=binding_id,
                    execution_id=execution,
                    invoke_id=invoke_id,
                    scope=scope,
                    key=key,
                    inserted_at=inserted_at,
                )
            )
        return found

    async def forget_addressed(self, address_ids: Sequence[Any]) -> int:
        ids: Any = list(address_ids) if self.postgres else json.dumps(list(address_ids))
        _, count = await self._run(self._s.forget_addressed, {"ids": ids})
        return count
