"""Bindings: which inbound events an execution of a document receives, under which key.

A :class:`Binding` is plain configuration: a frozen value whose ``match`` and ``key``
are expression programs, compiled once when the binding is built and evaluated over the
normalized event, bound as ``event``.

>>> clicks = Binding(
...     id="clicks_to_join",
...     source="ad_events",
...     match="event.kind == 'click'",
...     key="event.impression_id",
...     document="impression_click_join",
...     event="click.recorded",
...     data=("impression_id", "url"),
... )
>>> clicks.evaluate({"kind": "click", "impression_id": "imp_7f3a", "url": "u", "ip": "…"})
Keyed(key='imp_7f3a')
>>> clicks.evaluate({"kind": "impression", "impression_id": "imp_7f3a"}) is None
True
>>> clicks.evaluate({"kind": "click"})
ProgramFailed(program='key', kind='value', detail='undefined')
>>> clicks.project({"kind": "click", "impression_id": "imp_7f3a", "url": "u", "ip": "…"})
{'impression_id': 'imp_7f3a', 'url': 'u'}

Bindings also load from plain mappings (a TOML or JSON file's tables), with errors that
name the binding and the field:

>>> Binding.from_mapping({"id": "b", "source": "s", "match": "true", "key": "'k'",
...                       "document": "d", "event": "e", "mode": "batch", "batch": 10})
Traceback (most recent call last):
...
statifier.router.errors.BindingError: binding 'b', field 'window': required by mode 'batch'

A binding's ``mode`` says how the events of one address reach its execution
(:class:`Mode`; :mod:`statifier.router.flow` holds the events of the others than
``each``):

>>> typing = Binding.from_mapping({"id": "typing", "source": "keys", "match": "true",
...     "key": "event.user", "document": "drafts", "event": "typed",
...     "mode": "debounce", "window": "PT30S", "max_wait": "PT5M"})
>>> typing.mode, typing.window, typing.max_wait
(<Mode.DEBOUNCE: 'debounce'>, datetime.timedelta(seconds=30), datetime.timedelta(seconds=300))
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from statifier.expr import UNDEFINED, ExprError, Expression, ParseError, Value, compile_expression
from statifier.expr.values import Undefined, type_name
from statifier.persistence import OnError
from statifier.router.durations import iso_duration
from statifier.router.errors import BindingError

__all__ = [
    "DEFAULT_HORIZON",
    "Binding",
    "Create",
    "Dedupe",
    "Keyed",
    "Mode",
    "Order",
    "Plan",
    "ProgramFailed",
    "load_bindings",
]

DEFAULT_HORIZON: Final = timedelta(hours=72)
"""How long a binding remembers a message id unless it says otherwise."""

MAX_DATA_PATHS: Final = 256
MAX_BATCH: Final = 1_000
"""The most events one ``batch`` or ``throttle`` binding's ``batch`` may name."""


class Create(StrEnum):
    """When a delivery creates an execution."""

    IF_ABSENT = "if_absent"
    """Create one when the address names none; otherwise deliver to the one it names."""
    NEVER = "never"
    """Deliver only to an execution the address already names."""
    ALWAYS_NEW = "always_new"
    """Create one execution per delivery; no address is read or written."""


@dataclass(frozen=True, slots=True)
class Dedupe:
    """How a binding recognizes a message it has seen: by message id, for ``horizon``
    after it first claimed it (an expired claim counts as absent)."""

    horizon: timedelta = DEFAULT_HORIZON
    by: str = "message_id"

    def __post_init__(self) -> None:
        if self.by != "message_id":
            raise ValueError(f"dedupe is by 'message_id', not {self.by!r}")
        horizon: object = self.horizon
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise ValueError(f"a dedupe horizon is a positive timedelta, not {horizon!r}")


class Mode(StrEnum):
    """How the events of one address reach its execution."""

    EACH = "each"
    """Each event is delivered as it comes."""
    DEBOUNCE = "debounce"
    """Events less than ``window`` apart coalesce: ``window`` after the last (or
    ``max_wait`` after the first) one event is delivered, the last one's data with
    ``count``."""
    BATCH = "batch"
    """Events are collected and delivered as one, ``{"events": [...]}``, when ``batch``
    are held or ``window`` after the first."""
    THROTTLE = "throttle"
    """At most ``batch`` deliveries per ``window``; the rest wait, in order."""


class Order(StrEnum):
    """Whether a front keeps one key's events in order on one lane."""

    BY_KEY = "by_key"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Keyed:
    """A binding whose match held and whose key program returned ``key``."""

    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramFailed:
    """A binding's match or key program could not be used for this event.

    Attributes:
        program: ``"match"`` or ``"key"``.
        kind: ``"error"`` (the program failed) or ``"value"`` (it returned a value the
            router cannot use).
        detail: the error's kind and reason token, or the value described.
    """

    program: str
    kind: str
    detail: str

    @property
    def reason(self) -> str:
        """One line for the ledger, e.g. ``"key value: undefined"``."""
        return f"{self.program} {self.kind}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Plan:
    """What one delivery needs of a binding, once its key is known: the id its dedupe
    claims and ledger rows are filed under, the document, the create mode, the dedupe
    horizon, and whether it delivers only to executions subscribed to it (a source
    invoke's, see :mod:`statifier.router.subscriptions`; its create mode is then
    ``never``). :func:`~statifier.router.deliver_event` takes one directly."""

    id: str
    _: KW_ONLY
    document: str
    create: Create = Create.NEVER
    horizon: timedelta = DEFAULT_HORIZON
    subscription: bool = False
    on_error: OnError | None = None

    def __post_init__(self) -> None:
        _text(self.id, "id", self.id)
        _text(self.id, "document", self.document)
        object.__setattr__(self, "create", _choice(self.id, "create", self.create, Create))
        object.__setattr__(self, "on_error", _on_error(self.id, self.on_error))
        horizon: object = self.horizon
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise BindingError(self.id, "dedupe", "the horizon must be a positive timedelta")
        _subscription(self.id, self.subscription, self.create)


@dataclass(frozen=True, slots=True)
class Binding:
    """One routing declaration.

    Attributes:
        id: unique among the bindings of one configuration (or one scope).
        source: the name of the source whose events this binding reads.
        match: an expression over ``event``; the binding applies only when it returns
            exactly ``true`` (``false``, ``null`` and undefined mean "not for this
            binding"; an error or any other value is a refusal).
        key: an expression over ``event`` answering the key: a non-empty string, used
            exactly as returned (normalize in the program, e.g. ``trim(x::string)``).
        document: the document whose executions the key addresses.
        event: the name of the chart event delivered.
        selector: the source's own selection, never read by the router.
        data: dotted paths of the normalized event carried in the delivered event's
            data, under the same paths (a missing path is left out, ``null`` is kept).
        create: when a delivery creates an execution (:class:`Create`).
        dedupe: how long a message id stays claimed (:class:`Dedupe`).
        order: :class:`Order`, read by fronts that partition by key.
        enabled: a disabled binding is never evaluated.
        subscription: the binding delivers only to an execution a source invoke has
            subscribed to it (:mod:`statifier.router.subscriptions`); to any other it
            returns ``dropped: not_subscribed``. Such a binding never creates: its
            ``create`` must be ``never``.
        on_error: what an error event no transition takes does to the executions this
            binding's deliveries step (:class:`~statifier.persistence.OnError`:
            ``continue`` or ``fail``); ``None`` leaves it to the router's
            configuration (per document, else its default).
        mode: how one address's events reach its execution (:class:`Mode`);
            ``each`` by default.
        window: the debounce quiet time, the batch's longest wait, the throttle's
            period; required by every mode but ``each``, which refuses it.
        max_wait: a debounce's longest wait from its first event (at least
            ``window``); ``None``: none. Only ``debounce`` takes it.
        batch: the most events one batch delivers, or one throttle window lets
            through (1 to :data:`MAX_BATCH`); required by ``batch`` and ``throttle``.

    Raises:
        BindingError: a field of the wrong type or value, a program that does not
            compile, a data path that is not a dotted path, a subscription binding
            whose create mode is not ``never``, a mode's field missing or out of
            range, a mode other than ``each`` on an ``always_new`` binding (it
            holds events by address, and such a binding has none).
    """

    id: str
    _: KW_ONLY
    source: str
    match: str
    key: str
    document: str
    event: str
    selector: Mapping[str, Value] = field(default_factory=dict)
    data: Sequence[str] = ()
    create: Create = Create.IF_ABSENT
    dedupe: Dedupe = field(default_factory=Dedupe)
    order: Order = Order.BY_KEY
    enabled: bool = True
    subscription: bool = False
    on_error: OnError | None = None
    mode: Mode = Mode.EACH
    window: timedelta | None = None
    max_wait: timedelta | None = None
    batch: int | None = None
    _match: Expression = field(init=False, repr=False, compare=False)
    _key: Expression = field(init=False, repr=False, compare=False)
    _paths: tuple[tuple[str, ...], ...] = field(init=False, repr=False, compare=False)
    _plan: Plan = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        given_id: object = self.id
        where = given_id if isinstance(given_id, str) else repr(given_id)
        for name in ("id", "source", "document", "event"):
            _text(where, name, getattr(self, name))
        object.__setattr__(self, "_match", _program(where, "match", self.match))
        object.__setattr__(self, "_key", _program(where, "key", self.key))
        selector: object = self.selector
        if not isinstance(selector, Mapping):
            raise BindingError(where, "selector", "must be a mapping")
        paths = _paths(where, self.data)
        object.__setattr__(self, "data", tuple(".".join(path) for path in paths))
        object.__setattr__(self, "_paths", paths)
        object.__setattr__(self, "create", _choice(where, "create", self.create, Create))
        object.__setattr__(self, "order", _choice(where, "order", self.order, Order))
        if not isinstance(self.dedupe, Dedupe):
            raise BindingError(where, "dedupe", f"must be a Dedupe, not {self.dedupe!r}")
        if not isinstance(self.enabled, bool):
            raise BindingError(where, "enabled", "must be true or false")
        object.__setattr__(self, "mode", _choice(where, "mode", self.mode, Mode))
        _flow(where, self)
        plan = Plan(
            self.id,
            document=self.document,
            create=self.create,
            horizon=self.dedupe.horizon,
            subscription=self.subscription,
            on_error=self.on_error,
        )
        object.__setattr__(self, "on_error", plan.on_error)
        object.__setattr__(self, "_plan", plan)

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> Binding:
        """A binding from a plain mapping, as a TOML or JSON file spells it: ``create``
        and ``order`` as strings, ``dedupe`` as ``{"by": "message_id", "horizon_ms":
        N}`` (either key optional), ``enabled`` and ``subscription`` as booleans,
        ``on_error`` as ``"continue"`` or ``"fail"``, ``mode`` as a string,
        ``window`` and ``max_wait`` as ISO 8601 durations (``"PT30S"``), ``batch`` as
        an integer.

        Raises:
            BindingError: an unknown field, a missing required one, or a value
                :class:`Binding` refuses.
        """
        given: object = entry
        if not isinstance(given, Mapping):
            kind = type(given).__name__
            raise BindingError("?", "(binding)", f"a binding is a table, not {kind}")
        raw_id = entry.get("id")
        where = raw_id if isinstance(raw_id, str) else "?"
        for name in entry:
            if name not in _MAPPING_FIELDS:
                raise BindingError(where, str(name), "unknown field")
        for name in _REQUIRED:
            if name not in entry:
                raise BindingError(where, name, "required")
        values = {name: entry[name] for name in _MAPPING_FIELDS - {"dedupe"} if name in entry}
        if "data" in values and (
            isinstance(values["data"], (str, bytes)) or not isinstance(values["data"], Iterable)
        ):
            raise BindingError(where, "data", "must be a list of dotted paths")
        if "data" in values:
            values["data"] = tuple(values["data"])
        if "dedupe" in entry:
            values["dedupe"] = Dedupe(_horizon(where, entry["dedupe"]))
        for name in ("window", "max_wait"):
            if name in values:
                values[name] = _duration(where, name, values[name])
        return cls(**values)

    @property
    def plan(self) -> Plan:
        """The delivery plan of this binding (its id, document, create mode, horizon,
        subscription flag), made once with the binding."""
        return self._plan

    def matches(self, event: Mapping[str, Value]) -> bool | ProgramFailed:
        """Whether this binding applies to ``event``: ``True`` only when ``match``
        returned exactly ``true``; ``False`` for false, null and undefined; a
        :class:`ProgramFailed` for an error or any other value."""
        answer = self._match.evaluate({"event": event})
        if answer is True:
            return True
        if answer is False or answer is None or type(answer) is Undefined:
            return False
        if isinstance(answer, ExprError):
            return ProgramFailed(program="match", kind="error", detail=_error(answer))
        return ProgramFailed(program="match", kind="value", detail=_describe(answer))

    def key_for(self, event: Mapping[str, Value]) -> Keyed | ProgramFailed:
        """The key ``event`` is addressed under, or why there is none."""
        answer = self._key.evaluate({"event": event})
        if type(answer) is str and answer:
            return Keyed(answer)
        if isinstance(answer, ExprError):
            return ProgramFailed(program="key", kind="error", detail=_error(answer))
        return ProgramFailed(program="key", kind="value", detail=_describe(answer))

    def evaluate(self, event: Mapping[str, Value]) -> Keyed | ProgramFailed | None:
        """``match`` then ``key``: ``None`` when the binding does not apply."""
        held = self.matches(event)
        if held is True:
            return self.key_for(event)
        if held is False:
            return None
        return held

    def project(self, event: Mapping[str, Value]) -> dict[str, Value]:
        """The delivered event's data: the listed paths of ``event`` and nothing else."""
        projected: dict[str, Value] = {}
        for path in self._paths:
            value = _lookup(event, path)
            if value is not UNDEFINED:
                _put(projected, path, value)
        return projected


_REQUIRED: Final = ("id", "source", "match", "key", "document", "event")
_MAPPING_FIELDS: Final = frozenset(
    {
        *_REQUIRED,
        "selector",
        "data",
        "create",
        "dedupe",
        "order",
        "enabled",
        "subscription",
        "on_error",
        "mode",
        "window",
        "max_wait",
        "batch",
    }
)


def load_bindings(source: str | Path | Sequence[Mapping[str, Any]]) -> list[Binding]:
    """Bindings from a TOML file (``[[bindings]]`` tables), a JSON file (a list, or an
    object with ``"bindings"``), or a list of mappings already read.

    Raises:
        BindingError: a binding is malformed (named with its field), or two share an id.
        OSError: the file cannot be read.
    """
    if isinstance(source, Path):
        text = source.read_text(encoding="utf-8")
        entries: Any
        if source.suffix == ".toml":
            try:
                entries = tomllib.loads(text).get("bindings", [])
            except tomllib.TOMLDecodeError as error:
                raise BindingError("?", "(file)", f"{source.name}: {error}") from None
        else:
            try:
                entries = json.loads(text)
            except json.JSONDecodeError as error:
                raise BindingError("?", "(file)", f"{source.name}: {error}") from None
            if isinstance(entries, dict):
                entries = entries.get("bindings", [])
        if not isinstance(entries, list):
            raise BindingError("?", "bindings", f"{source.name}: a list of tables is expected")
    elif isinstance(source, str):
        raise TypeError("load_bindings takes a Path or a list of mappings, not a str")
    else:
        entries = list(source)
    bindings = [Binding.from_mapping(entry) for entry in entries]
    unique_ids(bindings)
    return bindings


def unique_ids(bindings: Sequence[Binding]) -> None:
    """Refuse two bindings with one id (:class:`BindingError` naming it)."""
    seen: set[str] = set()
    for binding in bindings:
        if binding.id in seen:
            raise BindingError(binding.id, "id", "two bindings share this id")
        seen.add(binding.id)


def _text(where: str, name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise BindingError(where, name, f"must be a non-empty string, not {value!r}")
    return value


def _subscription(where: str, subscription: object, create: Create) -> None:
    if not isinstance(subscription, bool):
        raise BindingError(where, "subscription", "must be true or false")
    # A subscription exists only for an execution that is already running (its source
    # invoke wrote it), so creating one for the event could never deliver it.
    if subscription and create is not Create.NEVER:
        raise BindingError(
            where, "create", f"a subscription binding never creates: 'never', not {create.value!r}"
        )


def _flow(where: str, binding: Binding) -> None:
    """Refuse a mode's fields that are missing, out of range, or not its own."""
    mode = binding.mode
    fields: dict[str, object] = {
        "window": binding.window,
        "max_wait": binding.max_wait,
        "batch": binding.batch,
    }
    takes = {
        Mode.EACH: (),
        Mode.DEBOUNCE: ("window", "max_wait"),
        Mode.BATCH: ("window", "batch"),
        Mode.THROTTLE: ("window", "batch"),
    }[mode]
    for name, value in fields.items():
        if value is not None and name not in takes:
            raise BindingError(where, name, f"not taken by mode {mode.value!r}")
    for name in ("window", "batch"):
        if name in takes and fields[name] is None:
            raise BindingError(where, name, f"required by mode {mode.value!r}")
    for name in ("window", "max_wait"):
        value = fields[name]
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            raise BindingError(where, name, f"must be a positive duration, not {value!r}")
    window, max_wait, batch = binding.window, binding.max_wait, binding.batch
    if max_wait is not None and window is not None and max_wait < window:
        raise BindingError(where, "max_wait", "must be at least the window")
    if batch is not None and (type(batch) is not int or not 1 <= batch <= MAX_BATCH):
        raise BindingError(where, "batch", f"must be an integer from 1 to {MAX_BATCH}")
    # Held events wait under their address; an always_new binding has none.
    if mode is not Mode.EACH and binding.create is Create.ALWAYS_NEW:
        raise BindingError(where, "mode", f"{mode.value!r} needs an address: not always_new")


def _duration(where: str, name: str, value: object) -> object:
    """An ISO 8601 duration read as a timedelta (a timedelta passes as it is)."""
    if isinstance(value, timedelta):
        return value
    try:
        return iso_duration(value)
    except ValueError as error:
        raise BindingError(where, name, str(error)) from None


def _on_error(where: str, value: object) -> OnError | None:
    if value is None or isinstance(value, OnError):
        return value
    if isinstance(value, str):
        try:
            return OnError(value)
        except ValueError:
            pass
    raise BindingError(where, "on_error", f"must be one of continue, fail, not {value!r}")


def _program(where: str, name: str, source: object) -> Expression:
    _text(where, name, source)
    assert isinstance(source, str)
    compiled = compile_expression(source)
    if isinstance(compiled, ParseError):
        raise BindingError(where, name, f"does not compile: {compiled}")
    return compiled


def _choice(where: str, name: str, value: object, kind: type[StrEnum]) -> Any:
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value)) if isinstance(value, str) else kind(repr(value))
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise BindingError(where, name, f"must be one of {allowed}, not {value!r}") from None


def _paths(where: str, data: object) -> tuple[tuple[str, ...], ...]:
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise BindingError(where, "data", "must be a list of dotted paths")
    paths = []
    for path in data:
        parts = tuple(path.split(".")) if isinstance(path, str) else ()
        if not parts or not all(parts):
            raise BindingError(where, "data", f"{path!r} is not a dotted path")
        paths.append(parts)
    if len(paths) > MAX_DATA_PATHS:
        raise BindingError(where, "data", f"at most {MAX_DATA_PATHS} paths")
    return tuple(paths)


def _horizon(where: str, dedupe: object) -> timedelta:
    if not isinstance(dedupe, Mapping):
        raise BindingError(where, "dedupe", "must be a table with 'by' and 'horizon_ms'")
    unknown = set(dedupe) - {"by", "horizon_ms"}
    if unknown:
        raise BindingError(where, "dedupe", f"unknown key {sorted(unknown)[0]!r}")
    if dedupe.get("by", "message_id") != "message_id":
        raise BindingError(where, "dedupe", "'by' must be 'message_id'")
    milliseconds = dedupe.get("horizon_ms", int(DEFAULT_HORIZON.total_seconds() * 1000))
    if type(milliseconds) is not int or not 0 < milliseconds <= _LONGEST_HORIZON_MS:
        raise BindingError(
            where,
            "dedupe",
            f"'horizon_ms' must be a positive integer, at most {_LONGEST_HORIZON_MS} (100 years)",
        )
    return timedelta(milliseconds=milliseconds)


_LONGEST_HORIZON_MS: Final = 36_525 * 24 * 3600 * 1000
"""The longest dedupe horizon a binding takes: 100 years, far below what a date holds."""


def _error(error: ExprError) -> str:
    return f"{error.kind} {error.reason}"


def _describe(value: Value) -> str:
    if type(value) is Undefined:
        return "undefined"
    if value is None:
        return "null"
    if value == "":
        return "empty string"
    return f"{type_name(value)} {_short(value)}"


def _short(value: Value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _lookup(event: Mapping[str, Value], path: tuple[str, ...]) -> Value:
    current: Value = event
    for part in path:
        if not isinstance(current, Mapping) or part not in current:
            return UNDEFINED
        current = current[part]
    return current


def _put(into: dict[str, Value], path: tuple[str, ...], value: Value) -> None:
    current = into
    for part in path[:-1]:
        nested = current.get(part)
        if not isinstance(nested, dict):
            nested = {}
            current[part] = nested
        current = nested
    current[path[-1]] = value
