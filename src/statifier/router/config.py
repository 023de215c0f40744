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

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar
from urllib.parse import urlsplit

from statifier.callbacks import awaited
from statifier.chart import Machine
from statifier.core import Event, StartOptions
from statifier.core.events import SCXML_INVOKE_TYPES
from statifier.ids import new_execution_id
from statifier.persistence import (
    Discarded,
    ErrorPolicy,
    Executions,
    Executor,
    OnError,
    Stepped,
    Storage,
)
from statifier.persistence.executor import refuse_unperformed
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.binding import Binding, unique_ids
from statifier.router.errors import BindingError, ConfigError
from statifier.router.routes import Route, RouteEntry
from statifier.router.timer_queue import TimerQueue

__all__ = [
    "BASICHTTP_TYPES",
    "DEFAULT_SEND_KEY_HORIZON",
    "DEFAULT_TRANSACTION_ATTEMPTS",
    "RESERVED_BINDING_IDS",
    "BasicHttpLocations",
    "BindingsResolver",
    "Cap",
    "CapPer",
    "ChartResolver",
    "Entry",
    "MintExecutionId",
    "OnBegin",
    "OnCreate",
    "OnStep",
    "OverLimit",
    "Resolved",
    "Resolver",
    "RouterConfig",
    "StaticResolver",
    "check_on_complete",
    "check_send_type",
    "error_policy_of",
]

RESERVED_BINDING_IDS: Final = frozenset({"execution", "basichttp", "route"})
"""Ids the router files its own ledger rows under (sends to execution targets, refused
route sends, the BasicHTTP front); no binding may take them."""

BUILT_IN: Final = "built-in"
"""``timer_queue="built-in"``: the timer table on the configuration's own database."""

BUILT_IN_SEND_TYPES: Final = frozenset(
    {
        "scxml",
        "http://www.w3.org/TR/scxml/#SCXMLEventProcessor",
        "basichttp",
        "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor",
    }
)
"""Send types the engine or the router performs; none can be the router's send type."""

BASICHTTP_TYPES: Final = frozenset(
    {"basichttp", "http://www.w3.org/TR/scxml/#BasicHTTPEventProcessor"}
)
"""The BasicHTTP send type's two names: the router hands such sends to the outbox."""

DEFAULT_SEND_KEY_HORIZON: Final = timedelta(hours=72)
"""How long a posted ``scxml-send-key`` is remembered per execution."""

DEFAULT_TRANSACTION_ATTEMPTS: Final = 5
"""How many times a router transaction that loses a conflict is run in all, unless
configured (:attr:`RouterConfig.transaction_attempts`)."""

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


class Entry(StrEnum):
    """Which of the router's calls a delivery entered by: what ``around_delivery`` and
    ``on_begin`` are told."""

    ROUTE = "route"
    """:meth:`Router.route <statifier.router.Router.route>` and
    :meth:`~statifier.router.Router.route_many`."""
    PARTITION = "partition"
    """:meth:`Router.plan <statifier.router.Router.plan>`: a front reading an event's
    bindings to choose its lane or partition."""
    BASICHTTP = "basichttp"
    """:meth:`Router.deliver_post <statifier.router.Router.deliver_post>`: the BasicHTTP
    front."""
    TIMER = "timer"
    """The built-in timer worker firing one timer
    (:class:`~statifier.router.TimerWorker`), under the scope its payload holds: the
    scope of the delivery whose step scheduled it."""
    OUTBOX = "outbox"
    """The outbox drain's BasicHTTP sink telling a sender that its send failed for good
    (``error.communication``, delivered through
    :meth:`Router.deliver_event <statifier.router.Router.deliver_event>`)."""
    RESUME = "resume"
    """:meth:`Router.resume <statifier.router.Router.resume>` stepping in the events
    held for a paused execution, under the scope of its address."""
    API = "api"
    """The HTTP API (:mod:`statifier.api`) sending an event to an execution's address,
    through :meth:`Router.deliver_event <statifier.router.Router.deliver_event>`."""
    SCHEDULE = "schedule"
    """A schedule's fire (:class:`~statifier.router.Scheduler`) routed as an inbound
    event, under the schedule's scope."""
    FLOW = "flow"
    """The flow worker (:class:`~statifier.router.FlowWorker`) delivering what a
    debounce, batch or throttle binding held, under the scope of the address."""
    TARGET = "target"
    """A send to an execution target, only with ``wrap_target=True`` and only when no
    other entry's work encloses the sending step (a step of the host's own call, such
    as :meth:`Router.deliver_event <statifier.router.Router.deliver_event>`); and
    always a send from another store of a :class:`~statifier.router.ShardedRouter`,
    handed over from the sender's outbox (:meth:`Router.deliver_send
    <statifier.router.Router.deliver_send>`)."""


AroundDelivery = Callable[[str, Entry, Callable[[], Awaitable[_T]]], Awaitable[_T]]

OnBegin = Callable[[SqlTransaction, str, Entry], Awaitable[None]]
"""``(tx, scope, entry)``: called first in each delivery's transaction or savepoint, on
its connection, before any statement of the delivery (``SET LOCAL`` of a tenant)."""


class CapPer(StrEnum):
    """What one cap counts."""

    SCOPE = "scope"
    """The document's active executions in each scope, each scope its own count."""
    DOCUMENT = "document"
    """The document's active executions in every scope together; a free slot goes to
    the scope with the fewest executions, so no scope starves the others."""


class OverLimit(StrEnum):
    """What a create beyond a cap becomes."""

    HOLD = "hold"
    """Held (outcome ``buffered``) and made when a slot frees, in arrival order."""
    DROP = "drop"
    """Refused: ``dropped: over_limit``; nothing is kept."""


@dataclass(frozen=True, slots=True)
class Cap:
    """At most ``max_active`` executions of one document active at once (active,
    paused or parked: not ended), counted per scope or over the whole document
    (:class:`CapPer`); a create beyond it held or dropped (:class:`OverLimit`). Only
    executions the router created count (:mod:`statifier.router.caps`).

    >>> Cap.from_mapping("orders", {"max_active": 100, "per": "document"})
    Cap(max_active=100, per=<CapPer.DOCUMENT: 'document'>, over=<OverLimit.HOLD: 'hold'>)

    Raises:
        ConfigError: ``max_active`` not an integer from 1 to 1,000,000, an unknown
            ``per`` or ``over``.
    """

    max_active: int
    _: KW_ONLY
    per: CapPer = CapPer.SCOPE
    over: OverLimit = OverLimit.HOLD

    def __post_init__(self) -> None:
        given: object = self.max_active
        if type(given) is not int or not 1 <= given <= 1_000_000:
            raise ConfigError(f"max_active is an integer from 1 to 1000000, not {given!r}")
        for name, kind in (("per", CapPer), ("over", OverLimit)):
            value: object = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(str(value)))
            except ValueError:
                allowed = ", ".join(member.value for member in kind)
                raise ConfigError(f"{name} is one of {allowed}, not {value!r}") from None

    @classmethod
    def from_mapping(cls, document: str, entry: Mapping[str, Any]) -> Cap:
        """A cap from a plain mapping (a serve file's ``[caps.DOCUMENT]``): ``max_active``,
        ``per`` and ``over`` as strings.

        Raises:
            ConfigError: an unknown or missing key, or a value :class:`Cap` refuses;
                the message names the document.
        """
        unknown = sorted(set(entry) - {"max_active", "per", "over"})
        if unknown:
            raise ConfigError(f"cap {document!r}: unknown key {unknown[0]!r}")
        if "max_active" not in entry:
            raise ConfigError(f"cap {document!r}: max_active is required")
        try:
            return cls(
                entry["max_active"],
                per=entry.get("per", CapPer.SCOPE),
                over=entry.get("over", OverLimit.HOLD),
            )
        except ConfigError as error:
            raise ConfigError(f"cap {document!r}: {error}") from None


@dataclass(frozen=True, slots=True)
class BasicHttpLocations:
    """The ``basichttp`` option of a router configuration: where its BasicHTTP front
    answers (see :mod:`statifier.router.locations`).

    Attributes:
        base_url: the ``http`` or ``https`` URL the front is mounted at (no query, no
            fragment; a trailing ``/`` is dropped). Serve it over TLS.
        horizon: how long a posted send key is remembered per execution.

    Raises:
        ConfigError: a base URL that is not an absolute http(s) URL, or a horizon that
            is not a positive timedelta.
    """

    base_url: str
    horizon: timedelta = DEFAULT_SEND_KEY_HORIZON

    def __post_init__(self) -> None:
        given: object = self.base_url
        parts = urlsplit(given) if isinstance(given, str) else None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            raise ConfigError(
                f"basichttp base_url must be an http(s) URL without query or fragment, "
                f"not {given!r}"
            )
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        horizon: object = self.horizon
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise ConfigError(f"basichttp horizon must be a positive timedelta, not {horizon!r}")

    def location(self, token: str) -> str:
        """The location of ``token``: the base URL, ``/``, the token."""
        return f"{self.base_url}/{token}"


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

    def machines(self, document: str) -> tuple[Machine, ...]:
        """The charts ``document`` names, for every scope and for any one scope."""
        return tuple(
            machine
            for name, machine in self._charts.items()
            if (name if isinstance(name, str) else name[1]) == document
        )


@dataclass(frozen=True)
class RouterConfig:
    """What a router is configured with: plain data, validated at construction; a
    :class:`~statifier.router.Router` runs it.

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
        executor: receives every effect of every create and step that the router
            does not perform itself (see :mod:`statifier.router.sending`); by default
            it refuses every send and invocation.
        send_type: the send type whose targets name routes (``<send type=...
            target="ROUTE">``), and the type of ``target="execution"`` sends.
        source_type: the invoke type of source invokes (``<invoke type=...>`` naming a
            ``binding`` param; see :mod:`statifier.router.subscriptions`), or ``None``.
        routes: ``name -> (adapter, config)`` (or a :class:`RouteEntry`).
        route_overrides: ``scope -> name -> config``: a scope's configuration of a
            registered route, laid over the route's own.
        processor_scope: the scope a live session's route sends resolve in: a
            string, or a function asked once per send.
        timer_queue: where delayed sends wait: ``"built-in"`` (the timer table on
            this database), a :class:`~statifier.router.timer_queue.TimerQueue` of
            the host's, or ``None`` (a delayed send is refused).
        timers_elsewhere: a timer worker runs in another process (``statifier
            serve``, a worker of the host's): a delivery that schedules timers while
            no :class:`~statifier.router.timer_worker.TimerWorker` runs in this one is
            then no news. Otherwise :attr:`~statifier.router.Routed.notices` says so,
            and a warning is logged (once an interval).
        on_complete: a registered route handed ``done.execution`` when a delivery
            finishes an execution. If that route refuses or raises, the finishing
            delivery rolls back: a route that never succeeds is a poison pill.
        start_options: what every create starts with (send and invoke types, round
            budget), widened by :attr:`chart_start_options`; the session id is always
            the execution id.
        on_create, on_step: stand-ins for ``Executions.create`` and ``Executions.step``,
            called in the same transaction and savepoint.
        around_delivery: ``(scope, entry, work) -> await work()``: wraps every read and
            write of one of the router's calls, and every timer fire (a tenancy context,
            say; :class:`Entry` says which); it must call ``work`` exactly once and
            return what it returned. One that raises refuses that delivery or fire
            alone: the rest of a batch goes on, and a refused fire is tried again later.
        wrap_target: a send to an execution target whose sending step no entry's work
            encloses is wrapped under :attr:`Entry.TARGET` too (by default a target
            delivery is enclosed by its sender's and not wrapped again); it needs
            ``around_delivery`` or ``on_begin``.
        on_begin: ``async (tx, scope, entry)``, called first in the transaction (or
            savepoint) of each delivery and timer fire the router drives, on its
            connection, before any statement of it, so that a ``SET LOCAL`` reaches
            every statement of it; in a batch transaction it is called again before
            each delivery or fire, with that one's scope. What runs before it is not
            covered: a timer batch's claim (the due rows taken or locked, the
            executions they step read ahead), a route batch's plan (the bindings
            read: the host's resolver, no statement) and its locks, the
            BasicHTTP token's first lookup, the failed send's address lookup; a
            row-level security policy must let those through with the setting unset.
            What it raises refuses the delivery or fire, as ``around_delivery`` does.
        lock_wait: the most seconds a delivery waits for an execution's lock (30 by
            default); ``None`` waits without bound.
        transaction_attempts: how many times a router transaction of one delivery, one
            batch or one worker's fire or flush is run in all when it fails with a
            serialization failure or a deadlock (SQLSTATE 40001 or 40P01), the first
            included (5 by default; 1 never runs one again). Each attempt starts
            afresh: ``on_begin``, ``around_delivery`` and executors called inside it
            run again (:func:`~statifier.router.transaction.retried`).
        on_error: what an error event no transition takes does to an execution
            (:class:`~statifier.persistence.OnError`: ``continue``, SCXML's behaviour,
            or ``fail``; or an :class:`~statifier.persistence.ErrorPolicy` per chart),
            unless its document or the delivering binding says otherwise.
        document_on_error: ``document -> OnError`` for the documents whose executions
            differ from ``on_error`` (it needs a :class:`StaticResolver`, whose charts
            say which executions run a document).
        basichttp: where the BasicHTTP front answers
            (:class:`BasicHttpLocations`): each execution
            created under a new address row then gets a location of its own (it
            needs the opt-in location table); ``None``, no execution gets one.
        caps: a :class:`Cap` per document's name: how many of its executions the
            router lets be active at once, and what a create beyond that becomes.

    Raises:
        ConfigError: both or neither of ``bindings`` and ``bindings_resolver``, a
            reserved binding id, something not callable, a store that is not SQL, a
            ``source_type`` that is empty or an SCXML invoke type, ``wrap_target``
            without ``around_delivery`` or ``on_begin``.
        BindingError: two bindings with one id.
    """

    store: SqlAdapter | Storage
    _: KW_ONLY
    bindings: Sequence[Binding] | None = None
    bindings_resolver: BindingsResolver | None = None
    resolver: Resolver | None = None
    chart_resolver: ChartResolver | None = None
    execution_id: MintExecutionId = new_execution_id
    executor: Executor = refuse_unperformed
    start_options: StartOptions = field(default_factory=StartOptions)
    send_type: str | None = None
    source_type: str | None = None
    routes: Mapping[str, RouteEntry | tuple[Route, Mapping[str, Any]]] = field(default_factory=dict)
    route_overrides: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    processor_scope: str | Callable[[], str | None] | None = None
    timer_queue: TimerQueue | Literal["built-in"] | None = BUILT_IN
    timers_elsewhere: bool = False
    on_complete: str | None = None
    on_create: OnCreate | None = None
    on_step: OnStep | None = None
    around_delivery: AroundDelivery[Any] | None = None
    wrap_target: bool = False
    on_begin: OnBegin | None = None
    lock_wait: float | None = DEFAULT_LOCK_WAIT
    transaction_attempts: int = DEFAULT_TRANSACTION_ATTEMPTS
    on_error: ErrorPolicy | OnError | str = OnError.CONTINUE
    document_on_error: Mapping[str, OnError | str] = field(default_factory=dict)
    basichttp: BasicHttpLocations | None = None
    caps: Mapping[str, Cap] = field(default_factory=dict)

    def __post_init__(self) -> None:
        store: object = self.store
        if not isinstance(store, SqlAdapter | Storage):
            raise ConfigError(f"store must be a SqlAdapter or a Storage, not {store!r}")
        adapter = store if isinstance(store, SqlAdapter) else store.adapter
        if not isinstance(adapter, SqlAdapter):
            raise ConfigError("the router runs on a SqlAdapter (PostgreSQL or SQLite)")
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
            "on_begin",
        ):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"{name} must be callable, not {value!r}")
        if not isinstance(self.start_options, StartOptions):
            raise ConfigError("start_options must be a StartOptions")
        if not isinstance(self.wrap_target, bool):
            raise ConfigError(f"wrap_target must be a boolean, not {self.wrap_target!r}")
        if self.wrap_target and self.around_delivery is None and self.on_begin is None:
            raise ConfigError("wrap_target needs around_delivery or on_begin: nothing to wrap with")
        if self.lock_wait is not None and not self.lock_wait > 0:
            raise ConfigError(f"lock_wait must be positive seconds, not {self.lock_wait!r}")
        attempts: object = self.transaction_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigError(
                f"transaction_attempts must be an integer of at least 1: {attempts!r}"
            )
        if self.basichttp is not None and not isinstance(self.basichttp, BasicHttpLocations):
            raise ConfigError(f"basichttp must be a BasicHttpLocations, not {self.basichttp!r}")
        error_policy_of(self.on_error, self.document_on_error, self.resolver)
        for document, cap in self.caps.items():
            given: object = document
            if not isinstance(given, str) or not given or not isinstance(cap, Cap):
                raise ConfigError(f"caps maps a document's name to a Cap, not {cap!r}")
        object.__setattr__(self, "caps", MappingProxyType(dict(self.caps)))
        self._check_outbound()
        self._check_source_type()

    def _check_outbound(self) -> None:
        check_send_type(self.send_type, self.routes)
        routes = {name: _route_entry(name, entry) for name, entry in self.routes.items()}
        object.__setattr__(self, "routes", MappingProxyType(routes))
        overrides: dict[str, Mapping[str, Mapping[str, Any]]] = {}
        for scope, by_route in self.route_overrides.items():
            for name in by_route:
                if name not in routes:
                    raise ConfigError(
                        f"route_overrides[{scope!r}] names {name!r}, which is not a "
                        "registered route: a scope overrides a route, never adds one"
                    )
            overrides[scope] = MappingProxyType({n: dict(c) for n, c in by_route.items()})
        object.__setattr__(self, "route_overrides", MappingProxyType(overrides))
        check_on_complete(self.on_complete, routes)
        processor_scope: object = self.processor_scope
        if processor_scope is not None and not (
            isinstance(processor_scope, str) or callable(processor_scope)
        ):
            raise ConfigError(
                f"processor_scope must be a string or callable, not {processor_scope!r}"
            )
        queue: object = self.timer_queue
        if isinstance(queue, str) and queue != BUILT_IN:
            raise ConfigError(f"timer_queue must be 'built-in', None or a TimerQueue: {queue!r}")

    def _check_source_type(self) -> None:
        source_type: object = self.source_type
        if source_type is None:
            return
        if not isinstance(source_type, str) or not source_type:
            raise ConfigError(f"source_type must be a non-empty string, not {source_type!r}")
        if source_type in SCXML_INVOKE_TYPES:
            raise ConfigError(f"source_type {source_type!r} is the SCXML invoke type")

    @property
    def chart_start_options(self) -> StartOptions:
        """What every create starts with: ``start_options``, accepting the router's send
        type and BasicHTTP (which the router hands to the outbox), and, when the host
        lists its invoke types, the source type. The types are stamped on every
        position a create starts."""
        options = self.start_options
        send_types = options.send_types | BASICHTTP_TYPES
        if self.send_type is not None:
            send_types |= {self.send_type}
        invoke_types = options.invoke_types
        if invoke_types is not None and self.source_type is not None:
            invoke_types = invoke_types | {self.source_type}
        return replace(options, send_types=send_types, invoke_types=invoke_types)

    def overridden_somewhere(self, name: str) -> bool:
        """Whether some scope overrides the route ``name`` (a send to it then needs the
        delivery's scope)."""
        return any(name in by_route for by_route in self.route_overrides.values())

    def route(self, scope: str | None, name: str) -> tuple[Route, Mapping[str, Any]] | None:
        """The adapter and configuration ``name`` has in ``scope``, or ``None`` when no
        such route is registered."""
        entry = self.routes.get(name)
        if not isinstance(entry, RouteEntry):
            return None
        override = None if scope is None else self.route_overrides.get(scope, {}).get(name)
        return entry.adapter, entry.overridden(override)

    async def bindings_for(self, scope: str) -> Sequence[Binding]:
        """The bindings ``scope`` routes by (checked like a static list).

        Raises:
            BindingError: the resolver returned two bindings with one id, or a
                reserved one.
            Exception: whatever the resolver raised.
        """
        if self.bindings is not None:
            return self.bindings
        assert self.bindings_resolver is not None
        return checked_bindings(await awaited(self.bindings_resolver(scope)))

    async def resolve(self, scope: str, document: str) -> Resolved:
        """The chart a new execution of ``document`` in ``scope`` starts on.

        Raises:
            TypeError: the resolver returned something other than a :class:`Resolved`.
            Exception: whatever the resolver raised.
        """
        assert self.resolver is not None
        resolved = await awaited(self.resolver(scope, document))
        if not isinstance(resolved, Resolved):
            raise TypeError(f"the resolver answered {resolved!r}, not a Resolved")
        return resolved


# The checks of single options, for a host that reads a configuration in parts (a file,
# say) and would name the part at fault before the whole RouterConfig exists.


def check_send_type(send_type: object, routes: Collection[str] = ()) -> None:
    """Refuse a ``send_type`` the router cannot take: one that is not a non-empty
    string, a built-in send type, or none while ``routes`` names routes (a route is
    reached only by a send of that type).

    Raises:
        ConfigError: naming what is wrong.
    """
    if send_type is None:
        if routes:
            raise ConfigError("routes need a send_type: the type whose targets name them")
        return
    if not isinstance(send_type, str) or not send_type:
        raise ConfigError(f"send_type must be a non-empty string, not {send_type!r}")
    if send_type in BUILT_IN_SEND_TYPES:
        raise ConfigError(f"send_type {send_type!r} is a built-in send type")


def check_on_complete(on_complete: str | None, routes: Collection[str]) -> None:
    """Refuse an ``on_complete`` that is none of ``routes``' names.

    Raises:
        ConfigError: naming it.
    """
    if on_complete is not None and on_complete not in routes:
        raise ConfigError(f"on_complete names {on_complete!r}, which is not a route")


def error_policy_of(
    on_error: ErrorPolicy | OnError | str,
    document_on_error: Mapping[str, OnError | str],
    resolver: Resolver | None,
) -> ErrorPolicy:
    """``on_error``, and ``document_on_error`` laid over it, as a policy per chart:
    ``resolver``, a :class:`StaticResolver` when ``document_on_error`` names documents,
    says which charts each document runs.

    Raises:
        ConfigError: a policy other than ``continue`` and ``fail``; a document without
            a chart; two documents of one chart with different policies; documents
            named while ``resolver`` is not a :class:`StaticResolver`.
    """
    try:
        base = ErrorPolicy.of_value(on_error)
        documents = {document: OnError.of(value) for document, value in document_on_error.items()}
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if not documents:
        return base
    if not isinstance(resolver, StaticResolver):
        raise ConfigError(
            "document_on_error needs a StaticResolver: it says which chart a document runs"
        )
    charts: dict[str, OnError] = dict(base.charts)
    for document, policy in documents.items():
        machines = resolver.machines(document)
        if not machines:
            raise ConfigError(f"document_on_error names {document!r}, which has no chart")
        for machine in machines:
            content_hash = machine.identity.content_hash
            if charts.setdefault(content_hash, policy) is not policy:
                raise ConfigError(
                    f"document_on_error: documents of one chart differ ({document!r})"
                )
    return ErrorPolicy(base.default, charts)


def _route_entry(name: object, entry: object) -> RouteEntry:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a route name is a non-empty string, not {name!r}")
    if isinstance(entry, tuple) and len(entry) == 2:
        entry = RouteEntry(entry[0], entry[1])
    if not isinstance(entry, RouteEntry):
        raise ConfigError(f"route {name!r}: give (adapter, config) or a RouteEntry, not {entry!r}")
    if not callable(getattr(entry.adapter, "deliver", None)):
        raise ConfigError(f"route {name!r}: the adapter has no deliver method")
    return entry


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
