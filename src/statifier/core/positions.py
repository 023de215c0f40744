"""Positions: a MachineState as bytes, and back, bound to the chart it belongs to.

:func:`dump` writes a versioned envelope holding the chart's identity and the state
(never the compiled chart) as compact JSON with sorted keys, so equal states give equal
bytes. :func:`load` checks, in this order, that the bytes are a position, that their
format version is one it reads, and that they belong to the machine given, refusing
with a typed :class:`PositionError` otherwise.

:func:`export` and :func:`import_state` move a position onto a changed chart by state
ids instead of indexes.

>>> from statifier.chart import compile_chart
>>> from statifier.core import initialize
>>> machine = compile_chart(
...     '<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="a"/></scxml>'
... )
>>> state, _ = initialize(machine)
>>> blob = dump(state)
>>> load(machine, blob).leaf_configuration()
('a',)
>>> other = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="b"/></scxml>')
>>> try:
...     load(other, blob)
... except IdentityMismatch as refusal:
...     print(type(refusal).__name__)
IdentityMismatch
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

from statifier.chart.model import ChartIdentity, Machine
from statifier.core.events import SCXML_PROCESSOR, Event, engine_event
from statifier.core.state import MachineState
from statifier.expr import UNDEFINED
from statifier.expr.jsontext import MAX_JSON_DEPTH
from statifier.expr.tagged import TaggedValueError, decode, encode
from statifier.expr.values import Undefined

__all__ = [
    "FORMAT_VERSION",
    "IdentityMismatch",
    "MalformedExport",
    "NotAPosition",
    "PositionError",
    "QueueNotEmpty",
    "UnknownStateIds",
    "UnnameableStates",
    "UnsupportedFormatVersion",
    "dump",
    "dump_event",
    "export",
    "import_state",
    "load",
    "load_event",
]

FORMAT_VERSION: Final = 1
_TAG: Final = "statifier.position"


class PositionError(Exception):
    """A position cannot be read, or not for this machine."""


class NotAPosition(PositionError):  # noqa: N818 - names the refusal
    """The bytes are not a position (corrupt, truncated, or something else)."""


class UnsupportedFormatVersion(PositionError):  # noqa: N818
    """The position was written in a format version this library does not read."""

    def __init__(self, version: object) -> None:
        super().__init__(f"position format version {version!r} is not supported")
        self.version = version


class IdentityMismatch(PositionError):  # noqa: N818
    """The position belongs to another chart (or another name or version of it)."""

    def __init__(self, stored: ChartIdentity, machine: ChartIdentity) -> None:
        super().__init__(
            "the position belongs to another chart: "
            f"stored {stored.content_hash} {stored.name} {stored.version}, "
            f"machine {machine.content_hash} {machine.name} {machine.version}"
        )
        self.stored = stored
        self.machine = machine


class QueueNotEmpty(PositionError):  # noqa: N818
    """Export needs a settled position: internal events are still queued."""


class UnnameableStates(PositionError):  # noqa: N818
    """Export needs author ids for every active or remembered state."""

    def __init__(self, indexes: list[int]) -> None:
        super().__init__(f"states without an id cannot be exported: {indexes}")
        self.indexes = indexes


class UnknownStateIds(PositionError):  # noqa: N818
    """The target chart has no state with some of the exported ids."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(f"the chart has no states with the ids {ids}")
        self.ids = ids


class MalformedExport(PositionError):  # noqa: N818
    """An exported position does not have the expected shape."""


def _identity_json(identity: ChartIdentity) -> dict[str, Any]:
    return {"hash": identity.content_hash, "name": identity.name, "version": identity.version}


def _event_json(event: Event) -> list[Any]:
    return [
        event.name,
        event.type,
        event.data,
        event.sendid,
        event.origin,
        event.origintype,
        event.invokeid,
    ]


def _event_from(data: Any) -> Event:
    name, kind, payload, sendid, origin, origintype, invokeid = data
    return engine_event(name, kind, payload, sendid, origin, origintype, invokeid)


def _tag(value: object) -> object:
    """Encode the values plain JSON lacks (the JSON encoder calls this only for those)."""
    encoded = encode(value)
    if encoded is value:
        raise TypeError(f"{type(value).__name__} cannot be stored in a position")
    return encoded


def _has_type_key(value: object, seen: set[int]) -> bool:
    """Whether a map with a ``"$type"`` key occurs in ``value`` (it would read back as
    a tagged value). Only searched when the written text mentions ``"$type"``."""
    if isinstance(value, dict | list):
        if id(value) in seen:
            return False
        seen.add(id(value))
        if isinstance(value, dict):
            return "$type" in value or any(_has_type_key(v, seen) for v in value.values())
        return any(_has_type_key(item, seen) for item in value)
    return False


def _untag(mapping: dict[str, Any]) -> Any:
    return decode(mapping) if "$type" in mapping else mapping


def _counters(state: MachineState) -> list[int]:
    return [
        state.macrostep,
        state.microstep,
        state.round,
        state.send_counter,
        state.invoke_counter,
        state.timer_counter,
    ]


_SYSTEM_DERIVED: Final = frozenset({"_sessionid", "_name", "_ioprocessors", "_event"})
_EVENT_FIELDS: Final = ("name", "type", "sendid", "origin", "origintype", "invokeid")


@lru_cache(maxsize=1024)
def _standard_io(session_id: str) -> dict[str, Any]:
    """The ``_ioprocessors`` a session starts with. Cached: like every datamodel value
    it is never changed in place, so states may share it."""
    location = f"#_scxml_{session_id}"
    return {SCXML_PROCESSOR: {"location": location}, "scxml": {"location": location}}


def _last_event(value: Any) -> Any:
    """``_event`` as a compact list: its six string-or-undefined fields, then its data
    only when it has some (undefined data is the common case and needs no tag)."""
    if not isinstance(value, dict):
        return None
    fields = [
        None if type(field) is Undefined else field for field in map(value.get, _EVENT_FIELDS)
    ]
    data = value.get("data", UNDEFINED)
    if type(data) is not Undefined:
        fields.append(data)
    return fields


def _event_value(data: Any) -> Any:
    if data is None:
        return UNDEFINED
    name, kind, sendid, origin, origintype, invokeid, *payload = data
    return {
        "name": name,
        "type": kind,
        "sendid": UNDEFINED if sendid is None else sendid,
        "origin": UNDEFINED if origin is None else origin,
        "origintype": UNDEFINED if origintype is None else origintype,
        "invokeid": UNDEFINED if invokeid is None else invokeid,
        "data": payload[0] if payload else UNDEFINED,
    }


def dump(state: MachineState) -> bytes:
    """The position as deterministic bytes (the compiled chart is not included).

    System variables that follow from the chart and the session id are not stored.

    Raises:
        ValueError: the datamodel holds a map with a ``"$type"`` key, a value outside
            the expression language's domain (NaN or an infinity among them), more
            than :data:`MAX_STORED_VALUES` values once written out (shared substructure
            counts each time it appears), a value nested deeper than
            :data:`MAX_STORED_DEPTH`, or a list or map that holds itself.
    """
    datamodel = state.datamodel
    data = {key: value for key, value in datamodel.items() if key not in _SYSTEM_DERIVED}
    io = datamodel.get("_ioprocessors")
    if io == _standard_io(state.session_id):
        io = None
    # Empty queues, histories and invocations are the common case: no comprehension.
    queue, history, invocations = state.internal_queue, state.history, state.invocations
    # Everything of the datamodel's that is written out: the variables, the last
    # event's data, the queued events' data and a host's own _ioprocessors.
    sizes: dict[int, tuple[int, int]] = {}
    size = _written_size(data.values(), sizes)
    last = datamodel.get("_event")
    if isinstance(last, dict):
        size += _written_size((last.get("data"),), sizes)
    if queue:
        size += _written_size([event.data for event in queue], sizes)
    if io is not None:
        size += _written_size((io,), sizes)
    if size > MAX_STORED_VALUES:
        raise ValueError(f"the datamodel is too large to store (over {MAX_STORED_VALUES} values)")
    body = [
        sorted(state.configuration),
        [_event_json(event) for event in queue] if queue else [],
        [[h, list(value)] for h, value in sorted(history.items())] if history else [],
        sorted(state.entered),
        sorted(state.states_to_invoke),
        [[s, i, v] for (s, i), v in sorted(invocations.items())] if invocations else [],
        data,
        _last_event(datamodel.get("_event")),
        io,
        state.session_id,
        _counters(state),
        state.running,
        state.trace,
        state.round_budget,
        sorted(state.send_types),
        None if state.invoke_types is None else sorted(state.invoke_types),
    ]
    text = _ENCODER.encode(body)
    if '"$type"' in text and _has_type_key(body, set()):
        raise ValueError("a map with a '$type' key cannot be stored in a position")
    return f"{_head(state.machine)}{text}]".encode()


MAX_STORED_VALUES: Final = 1_000_000
"""The most values a stored datamodel may hold (its variables, the last event's data
and the queued events' data), counted as they are written out; and the most an event's
data may hold."""

MAX_STORED_DEPTH: Final = MAX_JSON_DEPTH
"""The deepest a stored value may nest: a datamodel variable's value or an event's data
holds lists and maps inside one another at most this many levels deep (a list of
scalars is one level). The same bound as JSON text read from outside
(:data:`~statifier.expr.jsontext.MAX_JSON_DEPTH`), so whatever a front accepts as an
event's data can be stored."""


def _written_size(values: Iterable[Any], sizes: dict[int, tuple[int, int]]) -> int:
    """How many values writing ``values`` out produces. Containers are measured once
    each (by identity; ``sizes`` keeps each one's written size and depth), so a value
    doubled in a loop (``x = [x, x]``) is measured in time linear in the containers
    that exist, not in its written size. Walks with a stack of its own, never
    recursing, so no nesting exhausts Python's.

    Raises:
        ValueError: a value nests deeper than :data:`MAX_STORED_DEPTH`, or a list or
            map holds itself.
    """
    total = 0
    for value in values:
        if isinstance(value, _CONTAINERS):
            known = sizes.get(id(value))
            total += (known or _measured(value, sizes))[0]
        else:
            total += 1
    return total


_CONTAINERS: Final = (dict, list)  # a tuple: isinstance checks it faster than a union


def _measured(
    root: dict[Any, Any] | list[Any], sizes: dict[int, tuple[int, int]]
) -> tuple[int, int]:
    """The written size and nesting depth of the container ``root``, and of every
    unmeasured container in it, put in ``sizes`` (see :func:`_written_size`)."""
    # The open containers from ``root`` down, with (in parallel lists, cheaper than a
    # frame object each) what is left of their items, their size so far and the
    # depth of their deepest item so far.
    stack: list[Any] = [root]
    left = [iter(root.values() if isinstance(root, dict) else root)]
    counts = [1]
    depths = [0]
    opened = {id(root)}
    while stack:
        for item in left[-1]:
            if not isinstance(item, _CONTAINERS):
                counts[-1] += 1
                continue
            known = sizes.get(id(item))
            if known is None:
                if id(item) in opened:
                    raise ValueError("a list or map that holds itself cannot be stored")
                if len(stack) >= MAX_STORED_DEPTH:
                    raise _too_deep()
                opened.add(id(item))
                stack.append(item)
                left.append(iter(item.values() if isinstance(item, dict) else item))
                counts.append(1)
                depths.append(0)
                break
            counts[-1] += known[0]
            if known[1] > depths[-1]:
                depths[-1] = known[1]
        else:
            # Every item of the innermost open container is measured: close it.
            container = stack.pop()
            left.pop()
            opened.discard(id(container))
            size, depth = counts.pop(), depths.pop() + 1
            sizes[id(container)] = (size, depth)
            if depth + len(stack) > MAX_STORED_DEPTH:
                raise _too_deep()
            if stack:
                counts[-1] += size
                if depth > depths[-1]:
                    depths[-1] = depth
    return sizes[id(root)]


def _too_deep() -> ValueError:
    return ValueError(f"a value nested deeper than {MAX_STORED_DEPTH} levels cannot be stored")


_ALL_STATES: Final = ("positions", "all states")  # memo key: every state index

# No NaN or infinity: they are not JSON, and what a position or an event holds travels
# on (to a sink, into a jsonb column) as JSON. The expression language makes none; a
# host's data that holds one is refused when it would be stored.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_tag, allow_nan=False
)
_DECODER: Final = json.JSONDecoder(object_hook=_untag)


# _ENCODER without its check for a container that holds itself, which costs a fifth of
# encoding a small event: for an event without data, whose only containers are the
# list built here and the constant undefined tag, around strings and None.
_FLAT_ENCODER: Final = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    default=_tag,
    allow_nan=False,
    check_circular=False,
)
_UNDEFINED_TAG: Final = encode(UNDEFINED)  # what the encoder writes for undefined
_HEAD: Final = ("positions", "head")  # memo key: the envelope's text before the body


def _head(machine: Machine) -> str:
    """The text of a position of ``machine`` up to its body: the envelope's opening
    bracket, tag, format version and chart identity, each followed by a comma. A pure
    function of the chart, so it is written once per machine rather than per dump."""
    head: str | None = machine.memo.get(_HEAD)
    if head is None:
        identity = machine.identity
        envelope = [_TAG, FORMAT_VERSION, [identity.content_hash, identity.name, identity.version]]
        # "[tag,version,[identity]]" without its closing bracket: the body comes next.
        head = machine.memo[_HEAD] = _ENCODER.encode(envelope)[:-1] + ","
    return head


def _parsed(data: bytes, what: str) -> Any:
    """The JSON text ``data`` holds, decoded, its tagged values restored.

    Raises:
        NotAPosition: ``data`` is not UTF-8 JSON text (``what`` names what it should
            be), or nests deeper than the decoder's stack reaches.
    """
    try:
        return _DECODER.decode(data.decode("utf-8"))
    except (ValueError, TypeError, AttributeError):  # UnicodeDecodeError is a ValueError
        raise NotAPosition(f"the bytes are not {what}") from None
    except RecursionError:
        # Nothing dump or dump_event writes nests this deep (MAX_STORED_DEPTH): the
        # blob is damaged, and Python's own error would escape every caller that
        # handles a damaged blob (a shadow replay, the console, the runtime).
        raise NotAPosition(f"the bytes are not {what}: nested too deep to read") from None


def load(machine: Machine, data: bytes) -> MachineState:
    """Rebuild a position for ``machine``.

    Raises:
        NotAPosition: the bytes are not a position (not UTF-8 JSON text, nested deeper
            than the decoder reaches, or not shaped as :func:`dump` writes).
        UnsupportedFormatVersion: written by a format this library does not read.
        IdentityMismatch: the position belongs to another chart.
    """
    envelope = _parsed(data, "a position")
    if not (isinstance(envelope, list) and len(envelope) == 4 and envelope[0] == _TAG):
        raise NotAPosition("the bytes are not a position")
    if envelope[1] != FORMAT_VERSION:
        raise UnsupportedFormatVersion(envelope[1])
    identity = machine.identity
    stored = envelope[2]
    if stored != [identity.content_hash, identity.name, identity.version]:
        if not (isinstance(stored, list) and len(stored) == 3):
            raise NotAPosition("the position's chart identity is unreadable")
        content_hash, name, version = stored
        raise IdentityMismatch(ChartIdentity(content_hash, name=name, version=version), identity)
    try:
        return _state(machine, envelope[3])
    except (TypeError, KeyError, ValueError, IndexError, TaggedValueError) as error:
        raise NotAPosition(f"the position is damaged: {error}") from None


def dump_event(event: Event) -> bytes:
    """An event as deterministic JSON bytes (its data keeps dates, durations and
    undefined), for logs of what a chart was given.

    >>> from statifier.core import Event
    >>> event = Event("paid", data={"amount": 5}, invokeid="pay")
    >>> load_event(dump_event(event)) == event
    True

    Raises:
        ValueError: the data holds a map with a ``"$type"`` key, a value outside the
            expression language's domain (NaN or an infinity among them), more than
            :data:`MAX_STORED_VALUES` values once written out, a value nested deeper
            than :data:`MAX_STORED_DEPTH`, or a list or map that holds itself.
    """
    body = _event_json(event)
    data = event.data
    if type(data) is Undefined:
        # The common case: the tag goes in directly, no map could carry a "$type"
        # key, and no container can hold itself.
        body[2] = _UNDEFINED_TAG
        return _FLAT_ENCODER.encode(body).encode()
    if isinstance(data, _CONTAINERS) and _written_size((data,), {}) > MAX_STORED_VALUES:
        raise ValueError(
            f"the event's data is too large to store (over {MAX_STORED_VALUES} values)"
        )
    text = _ENCODER.encode(body)
    if '"$type"' in text and _has_type_key(body[2], set()):
        raise ValueError("a map with a '$type' key cannot be stored in an event")
    return text.encode()


def load_event(data: bytes) -> Event:
    """The event :func:`dump_event` wrote.

    Raises:
        NotAPosition: the bytes are not a stored event (not UTF-8 JSON text, nested
            deeper than the decoder reaches, or not shaped as :func:`dump_event`
            writes).
    """
    body = _parsed(data, "a stored event")
    try:
        name, kind = body[0], body[1]
        event = _event_from(body)
    except (ValueError, TypeError, LookupError, TaggedValueError):
        raise NotAPosition("the bytes are not a stored event") from None
    if not isinstance(name, str) or kind not in ("external", "internal", "platform"):
        raise NotAPosition("the bytes are not a stored event")
    return event


def _indexes(valid: frozenset[int], values: list[Any]) -> frozenset[int]:
    """State indexes, checked to be indexes of the machine (positions are untrusted)."""
    result = frozenset(values)
    if not result <= valid:
        raise ValueError("a state index is out of range")
    return result


def _state(machine: Machine, body: list[Any]) -> MachineState:
    (
        configuration,
        queue,
        history,
        entered,
        to_invoke,
        invocations,
        data,
        event,
        io,
        session,
        counters,
        running,
        trace,
        budget,
        send_types,
        invoke_types,
    ) = body
    macrostep, microstep, round_, sends, invokes, timers = counters
    if not isinstance(data, dict) or not isinstance(session, str):
        raise ValueError("the datamodel is not a map")
    if not all(type(c) is int for c in counters) or not (budget is None or type(budget) is int):
        raise ValueError("a counter or the round budget is not an integer")
    if type(running) is not bool or type(trace) is not bool:
        raise ValueError("a flag is not a boolean")
    valid: frozenset[int] | None = machine.memo.get(_ALL_STATES)
    if valid is None:
        valid = machine.memo[_ALL_STATES] = frozenset(range(len(machine.states)))
    data["_sessionid"] = session
    data["_name"] = UNDEFINED if machine.name is None else machine.name
    data["_ioprocessors"] = _standard_io(session) if io is None else io
    data["_event"] = _event_value(event)
    return MachineState(
        machine=machine,
        configuration=_indexes(valid, configuration),
        internal_queue=tuple(_event_from(item) for item in queue) if queue else (),
        history={int(h): tuple(sorted(_indexes(valid, value))) for h, value in history}
        if history
        else {},
        entered=_indexes(valid, entered),
        states_to_invoke=_indexes(valid, to_invoke),
        invocations={(int(s), int(i)): str(v) for s, i, v in invocations} if invocations else {},
        datamodel=data,
        session_id=session,
        macrostep=macrostep,
        microstep=microstep,
        round=round_,
        send_counter=sends,
        invoke_counter=invokes,
        timer_counter=timers,
        running=running,
        trace=trace,
        round_budget=budget,
        send_types=frozenset(send_types),
        invoke_types=None if invoke_types is None else frozenset(invoke_types),
    )


def export(state: MachineState) -> dict[str, Any]:
    """The position by state ids, to move it onto a changed chart with
    :func:`import_state`. JSON-ready.

    Raises:
        QueueNotEmpty: internal events are pending (export between macrosteps).
        UnnameableStates: an active, entered or remembered state has no id.
    """
    if state.internal_queue:
        raise QueueNotEmpty("export a position between macrosteps: internal events are queued")
    states = state.machine.states
    referenced = (
        set(state.configuration)
        | set(state.entered)
        | set(state.states_to_invoke)
        | set(state.history)
        | {s for value in state.history.values() for s in value}
        | {s for s, _ in state.invocations}
    )
    referenced.discard(0)
    unnamed = sorted(s for s in referenced if states[s].id is None)
    if unnamed:
        raise UnnameableStates(unnamed)

    def ids(indexes: Any) -> list[str]:
        return sorted(str(states[i].id) for i in indexes if i != 0)

    return {
        "identity": _identity_json(state.machine.identity),
        "configuration": ids(state.configuration),
        "entered": ids(state.entered),
        "states_to_invoke": ids(state.states_to_invoke),
        "history": {str(states[h].id): ids(v) for h, v in sorted(state.history.items())},
        "invocations": [[states[s].id, i, v] for (s, i), v in sorted(state.invocations.items())],
        "datamodel": encode(dict(state.datamodel)),
        "session_id": state.session_id,
        "counters": _counters(state),
        "running": state.running,
        "round_budget": state.round_budget,
        "trace": state.trace,
        "send_types": sorted(state.send_types),
        "invoke_types": None if state.invoke_types is None else sorted(state.invoke_types),
    }


def import_state(machine: Machine, exported: Mapping[str, Any]) -> MachineState:
    """A position on ``machine`` from :func:`export` output (no identity check: moving
    onto a changed chart is the point).

    Raises:
        UnknownStateIds: every exported id the machine lacks, sorted.
        MalformedExport: the mapping does not have the exported shape.
    """
    try:
        names = (
            list(exported["configuration"])
            + list(exported["entered"])
            + list(exported["states_to_invoke"])
            + list(exported["history"])
            + [s for value in exported["history"].values() for s in value]
            + [s for s, _, _ in exported["invocations"]]
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise MalformedExport(f"not an exported position: {error}") from None
    if not all(isinstance(name, str) for name in names):
        raise MalformedExport("state ids must be strings")
    unknown = sorted({name for name in names if name not in machine.ids})
    if unknown:
        raise UnknownStateIds(unknown)

    def indexes(values: Any) -> frozenset[int]:
        return frozenset(machine.ids[v] for v in values)

    try:
        macrostep, microstep, round_, sends, invokes, timers = exported["counters"]
        configuration = indexes(exported["configuration"])
        if configuration:
            configuration |= {0}
        datamodel = decode(exported["datamodel"])
        if not isinstance(datamodel, dict):
            raise MalformedExport("the datamodel is not a map")
        return MachineState(
            machine=machine,
            configuration=frozenset(configuration),
            internal_queue=(),
            history={
                machine.ids[h]: tuple(sorted(indexes(v))) for h, v in exported["history"].items()
            },
            entered=indexes(exported["entered"]) | {0},
            states_to_invoke=indexes(exported["states_to_invoke"]),
            invocations={(machine.ids[s], int(i)): str(v) for s, i, v in exported["invocations"]},
            datamodel=datamodel,
            session_id=str(exported["session_id"]),
            macrostep=int(macrostep),
            microstep=int(microstep),
            round=int(round_),
            send_counter=int(sends),
            invoke_counter=int(invokes),
            timer_counter=int(timers),
            running=bool(exported["running"]),
            trace=bool(exported.get("trace", False)),
            round_budget=exported["round_budget"],
            send_types=frozenset(exported.get("send_types", ())),
            invoke_types=(
                None
                if exported.get("invoke_types") is None
                else frozenset(exported["invoke_types"])
            ),
        )
    except (KeyError, TypeError, ValueError, TaggedValueError) as error:
        raise MalformedExport(f"not an exported position: {error}") from None
