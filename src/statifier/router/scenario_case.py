"""The routing case format that ``statifier scenario`` reads (run by
:mod:`statifier.router.scenario`).

A case is a JSON object (at most 1 MiB, at most 10,000 steps, at most 1,000 schedules).
A *script case* runs events through the router:

``document``
    The document whose execution the report describes.
``scope``
    The scope of every delivered event.
``bindings``
    A list of bindings as :meth:`~statifier.router.Binding.from_mapping` reads them
    (left out when the case runs on a serve file, which gives them).
``script``
    The steps, in order: ``{"deliver": {"source": S, "message_id": M, "data": {...}}}``
    routes one event (``data`` in the tagged JSON encoding, see
    :mod:`statifier.expr.tagged`); ``{"advance": "PT24H"}`` moves the clock by an ISO
    8601 duration of days, hours, minutes and seconds, firing the timers and the
    schedules due on the way; ``{"down": "PT2H"}`` moves it with nothing running (no
    timer and no schedule fires: what came due fires on the next step, late, a
    schedule's missed fires as its catch-up policy says); ``{"reap": "addresses"}``
    and ``{"reap": "dedupe"}`` run one reaper pass.
``schedules`` (optional)
    Schedules put when the case starts, at its start time, and fired on the virtual
    clock: each an object with ``id`` (the schedule's name) and the fields
    :meth:`Schedule.from_mapping <statifier.router.schedules.Schedule.from_mapping>`
    reads (``cron`` or ``every``, ``start``, ``timezone``, ``source``, ``scope``,
    ``data`` in plain JSON, ``catch_up``, ``catch_up_window``, ``grace``, ``paused``);
    ``scope`` defaults to the case's.
``routes`` (optional)
    The names of the registered routes, each served by a recording adapter: a chart
    reaches one with ``<send type="T" target="NAME">``, ``T`` the case's send type,
    and a send to any other name is refused.
``send_type`` (optional)
    The router's send type: the ``type`` of a chart's sends to routes and to
    ``target="execution"`` (default :data:`SEND_TYPE`). A chart written for a
    deployment names the deployment's (``"shop:route"``).
``on_complete`` (optional)
    One of ``routes``: it is handed ``done.execution`` when an execution finishes.
``expected`` (optional)
    Any keys of the report, compared exactly (``1`` is not ``1.0`` nor ``true``).
``start`` (optional)
    The clock's start, an ISO 8601 datetime with an offset (default
    2026-01-01T00:00:00Z; the command's ``--start`` wins over it).
``description`` (optional)
    What the case shows, for the reader; never read by the runner.

A *publish case* has ``declarations`` and no script: it runs the publish-time
contracts (:func:`statifier.router.contracts.check`) over the chart of ``document``
and touches no database. Its keys are ``document``, ``declarations`` (an object:
document -> the list of event names it declares, or ``null`` for none), and
optionally ``bindings``, ``routes``, ``send_type``, ``on_complete``, ``expected``
(with the one key ``contracts``) and ``description``.

A case run on a serve file (:class:`statifier.router.scenario.Deployment`, ``statifier
scenario --config``) takes its bindings, routes, ``on_complete`` and send type from
the file, and names none of them itself. A key a case leaves out is ``None`` on the
:class:`Case` (``routes`` included), so the runner can tell the two apart.

>>> parse_duration("P1DT0.5S")
datetime.timedelta(days=1, microseconds=500000)
>>> parse_duration("P1M")
Traceback (most recent call last):
...
statifier.router.scenario_case.CaseError: 'P1M' is not a duration of the form PnDTnHnMnS
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from statifier.expr import parse_datetime
from statifier.expr.tagged import TaggedValueError, decode
from statifier.router.binding import Binding
from statifier.router.config import checked_bindings
from statifier.router.durations import iso_duration
from statifier.router.errors import RouterError
from statifier.router.outcomes import InboundEvent

if TYPE_CHECKING:
    from statifier.router.schedules import Schedule

__all__ = [
    "CONTRACT_KEYS",
    "DEFAULT_START",
    "DEPLOYED_KEYS",
    "MAX_CASE_BYTES",
    "MAX_SCHEDULES",
    "MAX_STEPS",
    "REPORT_KEYS",
    "SEND_TYPE",
    "Advance",
    "Case",
    "CaseError",
    "Deliver",
    "Down",
    "Reap",
    "Step",
    "parse_duration",
    "parse_start",
]

MAX_CASE_BYTES: Final = 1 << 20
MAX_STEPS: Final = 10_000
MAX_SCHEDULES: Final = 1_000
"""The most schedules a case puts."""
DEFAULT_START: Final = datetime(2026, 1, 1, tzinfo=UTC)
SEND_TYPE: Final = "scenario:route"
"""The router's send type of a case that names none: the ``type`` of a chart's sends to
routes and to ``target="execution"``."""
REPORT_KEYS: Final = (
    "ledger",
    "status",
    "configuration",
    "final_state",
    "datamodel",
    "timers",
    "sends",
    "unhandled_sends",
    "executions",
)
"""The keys of a script case's report, in report order."""
CONTRACT_KEYS: Final = ("contracts",)
"""The one key of a publish case's report."""
DEPLOYED_KEYS: Final = ("bindings", "routes", "send_type", "on_complete")
"""The keys a serve file gives a case run on it (and the case then leaves out)."""
_SCRIPT_KEYS: Final = ("document", "scope", "script")
_SCRIPT_OPTIONAL: Final = ("expected", "start", "description", "schedules", *DEPLOYED_KEYS)
_PUBLISH_KEYS: Final = ("document", "declarations")
_PUBLISH_OPTIONAL: Final = (*DEPLOYED_KEYS, "expected", "description")

Declarations = Mapping[str, tuple[str, ...] | None]


class CaseError(ValueError):
    """A case the runner refuses (unreadable, malformed, or failing to run); the
    message says where and what, in one line."""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Route one event with :meth:`~statifier.router.Router.route`."""

    event: InboundEvent


@dataclass(frozen=True, slots=True)
class Advance:
    """Move the virtual clock forward, firing the timers due on the way."""

    by: timedelta


@dataclass(frozen=True, slots=True)
class Down:
    """Move the virtual clock forward with nothing running (the service is down): no
    timer and no schedule fires on the way, nor at the end. What came due fires on
    the next step, at that step's time: a timer late, a schedule's missed fires as its
    catch-up policy says."""

    by: timedelta


@dataclass(frozen=True, slots=True)
class Reap:
    """Run one pass of a reaper: ``"addresses"`` or ``"dedupe"``."""

    table: str


Step = Deliver | Advance | Down | Reap


@dataclass(frozen=True, slots=True)
class Case:
    """A routing case, checked as it is read (see the module docstring).

    A publish case has ``declarations`` (and an empty ``scope``, ``script`` and
    ``schedules``). ``bindings``, ``routes``, ``send_type`` and ``on_complete`` are
    ``None`` when the case leaves them out (:data:`DEPLOYED_KEYS`). ``schedules`` are
    the case's, each with its scope (the case's unless it names one), in case order.
    """

    document: str
    scope: str
    bindings: tuple[Binding, ...] | None
    script: tuple[Step, ...]
    expected: Mapping[str, Any] | None = None
    start: datetime | None = None
    routes: tuple[str, ...] | None = None
    on_complete: str | None = None
    declarations: Declarations | None = None
    send_type: str | None = None
    schedules: tuple[Schedule, ...] = ()

    @property
    def deployed(self) -> tuple[str, ...]:
        """The keys of :data:`DEPLOYED_KEYS` the case names, in that order."""
        named = {
            "bindings": self.bindings,
            "routes": self.routes,
            "send_type": self.send_type,
            "on_complete": self.on_complete,
        }
        return tuple(key for key in DEPLOYED_KEYS if named[key] is not None)

    @property
    def publish(self) -> bool:
        """Whether this is a publish case (its report is the contracts)."""
        return self.declarations is not None

    @classmethod
    def load(cls, path: Path) -> Case:
        """The case in the file at ``path``.

        Raises:
            CaseError: the file cannot be read, is too big, or is not a valid case.
        """
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_CASE_BYTES + 1)
        except OSError as error:
            raise CaseError(f"cannot read: {error.strerror}") from None
        if len(data) > MAX_CASE_BYTES:
            raise CaseError(f"larger than {MAX_CASE_BYTES} bytes")
        return cls.from_json(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> Case:
        """The case a JSON document spells.

        Raises:
            CaseError: invalid JSON (or a key given twice), or not a valid case.
        """
        try:
            raw = json.loads(text, object_pairs_hook=_unique_keys)
        except (ValueError, UnicodeDecodeError) as error:
            raise CaseError(f"not valid JSON: {error}") from None
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: object) -> Case:
        """The case a parsed JSON value spells.

        Raises:
            CaseError: an unknown or missing key, or a value of the wrong shape.
        """
        if not isinstance(raw, dict):
            raise CaseError(f"a case is a JSON object, not {type(raw).__name__}")
        publish = "declarations" in raw
        if publish and "script" in raw:
            raise CaseError("a case with declarations is a publish case: it has no script")
        required, optional = (
            (_PUBLISH_KEYS, _PUBLISH_OPTIONAL) if publish else (_SCRIPT_KEYS, _SCRIPT_OPTIONAL)
        )
        for name in raw:
            if name not in required and name not in optional:
                kind = " of a publish case" if publish and name in _SCRIPT_KEYS else ""
                raise CaseError(f"unknown key {name!r}{kind}")
        for name in required:
            if name not in raw:
                raise CaseError(f"the key {name!r} is required")
        document = _text(raw, "document")
        routes = _routes(raw["routes"]) if "routes" in raw else None
        on_complete = (
            _on_complete(raw["on_complete"], routes or ()) if "on_complete" in raw else None
        )
        bindings = _bindings(raw["bindings"]) if "bindings" in raw else None
        send_type = _text(raw, "send_type") if "send_type" in raw else None
        expected_keys = CONTRACT_KEYS if publish else REPORT_KEYS
        expected = _expected(raw["expected"], expected_keys) if "expected" in raw else None
        if publish:
            return cls(
                document,
                "",
                bindings,
                (),
                expected,
                routes=routes,
                on_complete=on_complete,
                declarations=_declarations(raw["declarations"]),
                send_type=send_type,
            )
        scope = _text(raw, "scope")
        return cls(
            document,
            scope,
            bindings,
            _script(scope, raw["script"]),
            expected,
            parse_start(raw["start"], "start") if "start" in raw else None,
            routes,
            on_complete,
            send_type=send_type,
            schedules=_schedules(scope, raw["schedules"]) if "schedules" in raw else (),
        )


def parse_duration(text: object) -> timedelta:
    """An ISO 8601 duration of the form ``PnDTnHnMnS`` (``"PT24H"``, ``"P3D"``,
    ``"PT0.5S"``), as a timedelta.

    Raises:
        CaseError: any other form (years, months, weeks, a sign, nothing at all).
    """
    try:
        return iso_duration(text)
    except ValueError as error:
        raise CaseError(str(error)) from None


def parse_start(text: object, where: str = "--start") -> datetime:
    """A start time: an ISO 8601 datetime with an offset, in UTC.

    Raises:
        CaseError: anything else (naming ``where``).
    """
    parsed = parse_datetime(text) if isinstance(text, str) else None
    if parsed is None or parsed.tzinfo is None:
        raise CaseError(f"{where}: {text!r} is not an ISO 8601 datetime with an offset")
    return parsed.astimezone(UTC)


def as_json(value: object) -> str:
    """``value`` as canonical JSON text (sorted keys): how reports are compared."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} is given twice in one object")
        result[key] = value
    return result


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str) or not value:
        raise CaseError(f"{name} must be a non-empty string, not {as_json(value)}")
    return value


def _routes(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise CaseError("routes must be a list of route names")
    for index, name in enumerate(raw):
        # A name with a scheme or a fragment is a transport to the router: no send
        # could ever reach a route so named.
        if not isinstance(name, str) or not name or ":" in name or name.startswith("#"):
            raise CaseError(
                f"routes[{index}]: a route name is a non-empty string without ':' or a "
                f"leading '#', not {as_json(name)}"
            )
        if name == "execution":
            raise CaseError(f"routes[{index}]: 'execution' is the router's execution target")
        if name in raw[:index]:
            raise CaseError(f"routes[{index}]: {name!r} is named twice")
    return tuple(raw)


def _on_complete(raw: object, routes: tuple[str, ...]) -> str:
    if not isinstance(raw, str) or raw not in routes:
        raise CaseError(f"on_complete must name one of routes, not {as_json(raw)}")
    return raw


def _declarations(raw: object) -> Declarations:
    if not isinstance(raw, dict):
        raise CaseError("declarations must be an object: document -> event names or null")
    declared: dict[str, tuple[str, ...] | None] = {}
    for document, events in raw.items():
        if events is None:
            declared[document] = None
            continue
        if not isinstance(events, list) or not all(isinstance(e, str) and e for e in events):
            raise CaseError(
                f"declarations[{document!r}] must be a list of event names or null, "
                f"not {as_json(events)}"
            )
        declared[document] = tuple(events)
    return declared


def _bindings(raw: object) -> tuple[Binding, ...]:
    if not isinstance(raw, list):
        raise CaseError("bindings must be a list of binding objects")
    bindings = []
    for index, entry in enumerate(raw):
        try:
            bindings.append(Binding.from_mapping(entry))
        except (RouterError, TypeError, ValueError) as error:
            raise CaseError(f"bindings[{index}]: {error}") from None
    try:
        return checked_bindings(bindings)
    except RouterError as error:
        raise CaseError(f"bindings: {error}") from None


def _script(scope: str, raw: object) -> tuple[Step, ...]:
    if not isinstance(raw, list):
        raise CaseError("script must be a list of steps")
    if len(raw) > MAX_STEPS:
        raise CaseError(f"script has {len(raw)} steps, more than {MAX_STEPS}")
    steps = []
    for index, entry in enumerate(raw):
        try:
            steps.append(_step(scope, entry))
        except CaseError as error:
            raise CaseError(f"script[{index}]: {error}") from None
    return tuple(steps)


def _step(scope: str, entry: object) -> Step:
    if not isinstance(entry, dict) or len(entry) != 1:
        raise CaseError('a step is an object with one key: "deliver", "advance", "down" or "reap"')
    ((kind, value),) = entry.items()
    if kind == "advance":
        return Advance(parse_duration(value))
    if kind == "down":
        return Down(parse_duration(value))
    if kind == "reap":
        if value not in ("addresses", "dedupe"):
            raise CaseError(f'reap is "addresses" or "dedupe", not {as_json(value)}')
        return Reap(value)
    if kind != "deliver":
        raise CaseError(f'unknown step {kind!r} (one of "deliver", "advance", "down", "reap")')
    if not isinstance(value, dict):
        raise CaseError("deliver takes an object: source, message_id and data")
    unknown = set(value) - {"source", "message_id", "data"}
    if unknown:
        raise CaseError(f"deliver: unknown key {sorted(unknown)[0]!r}")
    source, message_id = value.get("source"), value.get("message_id")
    if not isinstance(source, str) or not isinstance(message_id, str):
        raise CaseError("deliver: source and message_id must be strings")
    try:
        data = decode(value.get("data", {}))
        if not isinstance(data, dict):
            raise CaseError("deliver: data must be a JSON object")
        return Deliver(InboundEvent(scope=scope, source=source, message_id=message_id, data=data))
    except (RouterError, TaggedValueError) as error:
        raise CaseError(f"deliver: {error}") from None


def _schedules(scope: str, raw: object) -> tuple[Schedule, ...]:
    """The case's ``schedules``, each read by ``Schedule.from_mapping`` with ``id`` as
    its name and the case's ``scope`` unless it names one.

    Raises:
        CaseError: not a list, more than :data:`MAX_SCHEDULES`, an entry without an
            ``id`` or with one named twice, or one the schedule refuses (naming its
            index, the schedule and the field).
    """
    # Imported here, not above: the schedules module reads its durations with this
    # module's parse_duration, so importing it at the top would be a cycle.
    from statifier.router.schedules import Schedule, ScheduleError

    if not isinstance(raw, list):
        raise CaseError("schedules must be a list of schedule objects")
    if len(raw) > MAX_SCHEDULES:
        raise CaseError(f"schedules has {len(raw)} entries, more than {MAX_SCHEDULES}")
    schedules: list[Schedule] = []
    for index, entry in enumerate(raw):
        where = f"schedules[{index}]"
        if not isinstance(entry, dict):
            raise CaseError(f"{where}: a schedule is an object with an id, not {as_json(entry)}")
        name = entry.get("id")
        if not isinstance(name, str) or not name:
            raise CaseError(f"{where}: id must be a non-empty string, not {as_json(name)}")
        if any(schedule.name == name for schedule in schedules):
            raise CaseError(f"{where}: {name!r} is named twice")
        fields = {key: value for key, value in entry.items() if key != "id"}
        fields.setdefault("scope", scope)
        try:
            schedules.append(Schedule.from_mapping(name, fields))
        except ScheduleError as error:
            raise CaseError(f"{where}: {error}") from None
    return tuple(schedules)


def _expected(raw: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise CaseError("expected must be an object with report keys")
    for key in raw:
        if key not in keys:
            raise CaseError(f"expected: unknown key {key!r} (one of {', '.join(keys)})")
    return raw
