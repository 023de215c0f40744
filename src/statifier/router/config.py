"""The router's configuration: one validated object, refused at construction when it
cannot work.

>>> from statifier.chart import compile_chart
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.router import Binding, RouterConfig, StaticResolver
>>> chart = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"/></scxml>')
>>> binding = Binding(id="b", source="s", match="true", key="event.id", document="d", event="e")
>>> RouterConfig(SqlAdapter("sqlite://"), bindings=[binding, binding],
...              resolver=StaticResolver({"d": chart}))
Traceback (most recent call last):
...
statifier.router.errors.BindingError: binding 'b', field 'id': two bindings share this id
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Any, Final, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from statifier.callbacks import settle
from statifier.chart import Machine
from statifier.core import Event, StartOptions
from statifier.ids import new_execution_id
from statifier.persistence import Discarded, Executions, Executor, Stepped, Storage
from statifier.persistence.executor import ignore_effects
from statifier.persistence.sql import SqlAdapter
from statifier.router.binding import Binding, unique_ids
from statifier.router.errors import BindingError, ConfigError
from statifier.router.transaction import Statements, Unit, statements_for, transaction

__all__ = [
    "RESERVED_BINDING_IDS",
    "BindingsResolver",
    "ChartResolver",
    "Door",
    "MintExecutionId",
    "OnCreate",
    "OnStep",
    "Resolved",
    "Resolver",
    "RouterConfig",
    "StaticResolver",
]

RESERVED_BINDING_IDS: Final = frozenset({"execution", "basichttp"})
"""Ids the router files its own ledger rows under (sends to execution targets, the
BasicHTTP front); no binding may take them."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Resolved:
    """The chart a new execution of a document starts on, and its content hash."""

    content_hash: str
    machine: Machine


Resolver = Callable[[str, str], "Resolved | Awaitable[Resolved]"]
"""``(scope, document)`` to the chart new executions start on; raising refuses the
create (:class:`~statifier.router.errors.UnresolvedDocument`)."""

ChartResolver = Callable[[str], "Machine | Awaitable[Machine]"]
"""A content hash to the chart an existing execution runs; raising refuses the step."""

BindingsResolver = Callable[[str], "Sequence[Binding] | Awaitable[Sequence[Binding]]"]
"""A scope to the bindings it routes by, asked once per routed event."""

MintExecutionId = Callable[[str, str, str], str]
"""``(scope, document, key)`` to a new, unused execution id."""

OnCreate = Callable[[Executions, str, Machine, StartOptions], Awaitable[Stepped]]
"""Stands in for ``Executions.create(execution_id, machine, options=...)``."""

OnStep = Callable[[Executions, str, "Machine | None", Event], "Awaitable[Stepped | Discarded]"]
"""Stands in for ``Executions.step(execution_id, machine, event)``."""


class Door(StrEnum):
    """Where a delivery entered: what ``around_delivery`` is told."""

    ROUTE = "route"
    """:func:`~statifier.router.route` and :func:`~statifier.router.route_many`."""
    PARTITION = "partition"
    """A front's partitioner reading the bindings for one message."""
    BASICHTTP = "basichttp"
    """The BasicHTTP front."""
    TARGET = "target"
    """A send to an execution target."""


AroundDelivery = Callable[[str, Door, Callable[[], Awaitable[_T]]], Awaitable[_T]]


class StaticResolver:
    """A resolver over charts compiled at boot.

    Args:
        charts: ``document -> machine`` for every scope, and ``(scope, document) ->
            machine`` for one scope (a scoped entry wins).

    A pair it does not hold raises :class:`LookupError`.
    """

    def __init__(self, charts: Mapping[str | tuple[str, str], Machine]) -> None:
        self._charts: dict[str | tuple[str, str], Machine] = {}
        for name, machine in charts.items():
            if not isinstance(machine, Machine):
                raise ConfigError(f"StaticResolver: {name!r} maps to {machine!r}, not a Machine")
            self._charts[name] = machine

    def __call__(self, scope: str, document: str) -> Resolved:
        machine = self._charts.get((scope, document)) or self._charts.get(document)
        if machine is None:
            raise LookupError(f"no chart for document {document!r}")
        return Resolved(machine.identity.content_hash, machine)

    @property
    def documents(self) -> frozenset[str]:
        """Every document it names."""
        return frozenset(name if isinstance(name, str) else name[1] for name in self._charts)


@dataclass(frozen=True)
class RouterConfig:
    """Everything a delivery needs.

    Args:
        store: the SQL adapter the executions live in (the router's tables are in the
            same database), or a :class:`~statifier.persistence.Storage` over one
            (its clock, input-log cap and loader then apply).
        bindings: the bindings of every scope; exclusive with ``bindings_resolver``.
        bindings_resolver: ``scope -> bindings``, asked once per routed event.
        resolver: ``(scope, document) -> Resolved``, for new executions
            (:class:`StaticResolver` over charts compiled at boot).
        chart_resolver: ``content_hash -> Machine`` for existing executions; by default
            the chart stored with the execution.
        execution_id: mints the id of a new execution from ``(scope, document, key)``;
            by default ``ex_`` and a ULID.
        executor: receives every effect of every create and step.
        start_options: what every create starts with (send and invoke types, round
            budget); the session id is always the execution id.
        on_create, on_step: stand-ins for ``Executions.create`` and ``Executions.step``,
            called in the same transaction and savepoint.
        around_delivery: ``(scope, door, work) -> await work()``: wraps every read and
            write of one door's call (a tenancy context, say); it must call ``work``
            exactly once and answer what it answered.
        lock_wait: the most seconds a delivery waits for an execution's lock.

    Raises:
        ConfigError: both or neither of ``bindings`` and ``bindings_resolver``, a
            reserved binding id, something not callable, a store that is not SQL.
        BindingError: two bindings with one id.
    """

    store: SqlAdapter | Storage
    _: KW_ONLY
    bindings: Sequence[Binding] | None = None
    bindings_resolver: BindingsResolver | None = None
    resolver: Resolver | None = None
    chart_resolver: ChartResolver | None = None
    execution_id: MintExecutionId = new_execution_id
    executor: Executor = ignore_effects
    start_options: StartOptions = field(default_factory=StartOptions)
    on_create: OnCreate | None = None
    on_step: OnStep | None = None
    around_delivery: AroundDelivery[Any] | None = None
    lock_wait: float | None = None
    storage: Storage = field(init=False, repr=False, compare=False)
    adapter: SqlAdapter = field(init=False, repr=False, compare=False)
    statements: Statements = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        store = self.store
        storage = store if isinstance(store, Storage) else Storage(store)
        if not isinstance(storage.adapter, SqlAdapter):
            raise ConfigError("the router runs on a SqlAdapter (PostgreSQL or SQLite)")
        object.__setattr__(self, "storage", storage)
        object.__setattr__(self, "adapter", storage.adapter)
        object.__setattr__(self, "statements", statements_for(storage.adapter))
        if (self.bindings is None) == (self.bindings_resolver is None):
            raise ConfigError("give exactly one of bindings and bindings_resolver")
        if self.bindings is not None:
            object.__setattr__(self, "bindings", checked_bindings(self.bindings))
        if self.resolver is None:
            raise ConfigError("a resolver is needed: it names the chart new executions start on")
        for name in (
            "bindings_resolver",
            "resolver",
            "chart_resolver",
            "execution_id",
            "executor",
            "on_create",
            "on_step",
            "around_delivery",
        ):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"{name} must be callable, not {value!r}")
        if not isinstance(self.start_options, StartOptions):
            raise ConfigError("start_options must be a StartOptions")
        if self.lock_wait is not None and not self.lock_wait > 0:
            raise ConfigError(f"lock_wait must be positive seconds, not {self.lock_wait!r}")

    async def bindings_for(self, scope: str) -> Sequence[Binding]:
        """The bindings ``scope`` routes by (checked like a static list).

        Raises:
            BindingError: the resolver answered two bindings with one id, or a
                reserved one.
            Exception: whatever the resolver raised.
        """
        if self.bindings is not None:
            return self.bindings
        assert self.bindings_resolver is not None
        return checked_bindings(await settle(self.bindings_resolver(scope)))

    def transaction(
        self, connection: sa.Connection | AsyncConnection | None = None
    ) -> AbstractAsyncContextManager[Unit]:
        """A router transaction on this configuration's database (see
        :mod:`statifier.router.transaction`), or one joined to ``connection``."""
        executions = {"executor": self.executor, "lock_wait": self.lock_wait}
        return transaction(self.storage, self.statements, executions, connection, self.lock_wait)

    async def resolve(self, scope: str, document: str) -> Resolved:
        assert self.resolver is not None
        resolved = await settle(self.resolver(scope, document))
        if not isinstance(resolved, Resolved):
            raise TypeError(f"the resolver answered {resolved!r}, not a Resolved")
        return resolved


def checked_bindings(bindings: Sequence[Binding]) -> tuple[Binding, ...]:
    """``bindings`` as a tuple, refusing a non-binding, a reserved id or a shared one."""
    chosen = tuple(bindings)
    for binding in chosen:
        if not isinstance(binding, Binding):
            raise ConfigError(f"not a Binding: {binding!r}")
        if binding.id in RESERVED_BINDING_IDS:
            raise BindingError(binding.id, "id", "reserved for the router's own ledger rows")
    unique_ids(chosen)
    return chosen
