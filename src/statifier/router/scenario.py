"""Routing cases: one JSON file of bindings and a script, run through the router on a
virtual clock, answered by one report (``statifier scenario CASE.json --charts DIR``).

A case is a JSON object (at most 1 MiB, at most 10,000 steps):

``document``
    The document whose execution the report describes.
``scope``
    The scope of every delivered event.
``bindings``
    A list of bindings as :meth:`~statifier.router.Binding.from_mapping` reads them.
``script``
    The steps, in order: ``{"deliver": {"source": S, "message_id": M, "data": {...}}}``
    routes one event (``data`` in the tagged JSON encoding, see
    :mod:`statifier.expr.tagged`); ``{"advance": "PT24H"}`` moves the clock by an ISO
    8601 duration of days, hours, minutes and seconds; ``{"reap": "addresses"}`` and
    ``{"reap": "dedupe"}`` run one reaper pass.
``expected`` (optional)
    Any keys of the report, compared exactly (``1`` is not ``1.0`` nor ``true``).
``start`` (optional)
    The clock's start, an ISO 8601 datetime with an offset (default
    2026-01-01T00:00:00Z; the command's ``--start`` wins over it).
``description`` (optional)
    What the case shows, for the reader; never read by the runner.

The chart of document ``D`` is ``DIR/D.scxml``; every ``*.scxml`` of the directory is
compiled at boot, named by its stem. Each run migrates its database first: a SQLite
file in a temporary directory unless a URL is given, under a table prefix (by default
the package's).

The report: ``ledger``, every ledger row oldest first as ``{"binding", "message_id",
"outcome", "key"}`` (the outcome as :attr:`~statifier.router.LedgerRow.spelled`);
and the case's execution, the one the address table names for the case's document and
scope (remembered after every step, so it stays the case's execution after a reaper
deletes its address; with no address ever, as under ``always_new``, the first
execution the ledger names for the document): ``status`` (``null`` without one),
``configuration`` (its sorted active leaf states, ``[]`` once finished) and
``datamodel`` (its data without the ``_`` system variables, tagged JSON).

>>> parse_duration("P1DT0.5S")
datetime.timedelta(days=1, microseconds=500000)
>>> parse_duration("P1M")
Traceback (most recent call last):
...
statifier.router.scenario.CaseError: 'P1M' is not a duration of the form PnDTnHnMnS
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.expr import parse_datetime
from statifier.expr.tagged import TaggedValueError, decode, encode
from statifier.persistence import ExecutionNotFound, PersistenceError, Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router.binding import Binding
from statifier.router.config import RouterConfig, StaticResolver, checked_bindings
from statifier.router.errors import RouterError
from statifier.router.outcomes import InboundEvent
from statifier.router.queries import ledger, newest_address
from statifier.router.reapers import reap_addresses, reap_dedupe
from statifier.router.routing import route
from statifier.sql import DEFAULT_PREFIX, TableOptions, migrations

__all__ = [
    "DEFAULT_START",
    "MAX_CASE_BYTES",
    "MAX_STEPS",
    "REPORT_KEYS",
    "Advance",
    "Case",
    "CaseError",
    "Deliver",
    "Reap",
    "Step",
    "compare",
    "parse_duration",
    "parse_start",
    "run_case",
]

MAX_CASE_BYTES: Final = 1 << 20
MAX_STEPS: Final = 10_000
DEFAULT_START: Final = datetime(2026, 1, 1, tzinfo=UTC)
REPORT_KEYS: Final = ("ledger", "status", "configuration", "datamodel")
_REQUIRED_KEYS: Final = ("document", "scope", "bindings", "script")
_OPTIONAL_KEYS: Final = ("expected", "start", "description")
_DURATION: Final = re.compile(
    r"P(?:(?P<days>\d+)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?"
)


class CaseError(ValueError):
    """A case the runner refuses (unreadable, malformed, or failing to run); the
    message says where and what, in one line."""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Route one event with :func:`~statifier.router.route`."""

    event: InboundEvent


@dataclass(frozen=True, slots=True)
class Advance:
    """Move the virtual clock forward."""

    by: timedelta


@dataclass(frozen=True, slots=True)
class Reap:
    """Run one pass of a reaper: ``"addresses"`` or ``"dedupe"``."""

    table: str


Step = Deliver | Advance | Reap


@dataclass(frozen=True, slots=True)
class Case:
    """A routing case, checked as it is read (see the module docstring)."""

    document: str
    scope: str
    bindings: tuple[Binding, ...]
    script: tuple[Step, ...]
    expected: Mapping[str, Any] | None = None
    start: datetime | None = None

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
        for name in raw:
            if name not in _REQUIRED_KEYS and name not in _OPTIONAL_KEYS:
                raise CaseError(f"unknown key {name!r}")
        for name in _REQUIRED_KEYS:
            if name not in raw:
                raise CaseError(f"the key {name!r} is required")
        document, scope = _text(raw, "document"), _text(raw, "scope")
        return cls(
            document,
            scope,
            _bindings(raw["bindings"]),
            _script(scope, raw["script"]),
            _expected(raw["expected"]) if "expected" in raw else None,
            parse_start(raw["start"], "start") if "start" in raw else None,
        )


def parse_duration(text: object) -> timedelta:
    """An ISO 8601 duration of the form ``PnDTnHnMnS`` (``"PT24H"``, ``"P3D"``,
    ``"PT0.5S"``), as a timedelta.

    Raises:
        CaseError: any other form (years, months, weeks, a sign, nothing at all).
    """
    found = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if found is None or text in ("P", "PT") or str(text).endswith("T"):
        raise CaseError(f"{text!r} is not a duration of the form PnDTnHnMnS")
    parts = {name: float(value) for name, value in found.groupdict().items() if value}
    return timedelta(**parts)


def parse_start(text: object, where: str = "--start") -> datetime:
    """A start time: an ISO 8601 datetime with an offset, in UTC.

    Raises:
        CaseError: anything else (naming ``where``).
    """
    parsed = parse_datetime(text) if isinstance(text, str) else None
    if parsed is None or parsed.tzinfo is None:
        raise CaseError(f"{where}: {text!r} is not an ISO 8601 datetime with an offset")
    return parsed.astimezone(UTC)


class _Clock:
    """The virtual clock: storage and router read it, the script moves it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


async def run_case(
    case: Case,
    charts_dir: Path,
    database_url: str | None = None,
    start: datetime | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
) -> dict[str, Any]:
    """Run ``case`` on a freshly migrated database (``database_url``, else SQLite in a
    temporary file) with tables under ``prefix``, from ``start`` (else the case's, else
    :data:`DEFAULT_START`), and answer its report.

    Raises:
        CaseError: a chart is missing, unreadable or invalid, the prefix is not one, or
            a step failed in the router or persistence (named by its index).
        sqlalchemy.exc.SQLAlchemyError, OSError: the database failed.
    """
    resolver = _resolver(charts_dir, case)
    try:
        options = TableOptions(prefix=prefix)
    except ValueError as error:
        raise CaseError(f"--prefix: {error}") from None
    clock = _Clock(start or case.start or DEFAULT_START)
    with contextlib.ExitStack() as stack:
        if database_url is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory())
            database_url = f"sqlite:///{Path(directory) / 'scenario.db'}"
        await asyncio.to_thread(migrations.upgrade, database_url, options)
        try:
            adapter = SqlAdapter(database_url, options)
        except ValueError as error:
            raise CaseError(f"database: {error}") from None
        async with adapter:
            storage = Storage(adapter, clock=clock)
            config = RouterConfig(storage, bindings=case.bindings, resolver=resolver)
            # The case's execution: the one the address table names, remembered after
            # every step, so that it stays the case's once a reap deletes its row.
            named: str | None = None
            for index, step in enumerate(case.script):
                try:
                    await _run_step(config, step, clock)
                    named = await newest_address(config, case.scope, case.document) or named
                except (RouterError, PersistenceError) as error:
                    name = type(error).__name__
                    raise CaseError(f"script[{index}]: {name}: {error}") from None
            return await _report(config, case.document, named)


def compare(report: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """One line per key of ``expected`` whose value differs from the report's, compared
    exactly as JSON (``1``, ``1.0`` and ``true`` differ); a list names its first
    differing item."""
    lines = []
    for key in REPORT_KEYS:
        if key not in expected or _json(expected[key]) == _json(report.get(key)):
            continue
        want, got = expected[key], report.get(key)
        if isinstance(want, list) and isinstance(got, list):
            index = next(
                i
                for i in range(max(len(want), len(got)))
                if i >= len(want) or i >= len(got) or _json(want[i]) != _json(got[i])
            )
            shown_want = _json(want[index]) if index < len(want) else "nothing"
            shown_got = _json(got[index]) if index < len(got) else "nothing"
            lines.append(f"{key}[{index}]: expected {shown_want}, got {shown_got}")
        else:
            lines.append(f"{key}: expected {_json(want)}, got {_json(got)}")
    return lines


async def _run_step(config: RouterConfig, step: Step, clock: _Clock) -> None:
    if isinstance(step, Deliver):
        await route(config, step.event, now=clock.now)
    elif isinstance(step, Advance):
        clock.now += step.by
    elif step.table == "addresses":
        await reap_addresses(config, clock.now)
    else:
        await reap_dedupe(config, clock.now)


async def _report(config: RouterConfig, document: str, named: str | None) -> dict[str, Any]:
    rows = await ledger(config)
    report: dict[str, Any] = {
        "ledger": [
            {
                "binding": r.binding_id,
                "message_id": r.message_id,
                "outcome": r.spelled,
                "key": r.key,
            }
            for r in rows
        ],
        "status": None,
        "configuration": [],
        "datamodel": {},
    }
    # Without an address (create always_new), the first execution of the document.
    execution_id = named or next(
        (r.execution_id for r in rows if r.execution_id is not None and r.document == document),
        None,
    )
    if execution_id is None:
        return report
    storage = config.storage
    try:
        record = await storage.fetch_execution(execution_id)
    except ExecutionNotFound:
        return report
    report["status"] = record.status.value
    if record.position is None:
        return report
    state = storage.load(record, await storage.machine(record.content_hash))
    if state.running and not record.status.terminal:
        report["configuration"] = list(state.leaf_configuration())
    report["datamodel"] = {
        name: encode(value)
        for name, value in sorted(state.datamodel.items())
        if not name.startswith("_")
    }
    return report


def _resolver(directory: Path, case: Case) -> StaticResolver:
    """A resolver over every chart of ``directory``, by file stem; refuses a case whose
    document (or an enabled binding's) has none."""
    if not directory.is_dir():
        raise CaseError(f"--charts {directory}: not a directory")
    charts: dict[str | tuple[str, str], Machine] = {}
    for path in sorted(directory.glob("*.scxml")):
        try:
            charts[path.stem] = compile_chart(path.read_bytes(), name=path.stem)
        except OSError as error:
            raise CaseError(f"chart {path}: cannot read: {error.strerror}") from None
        except InvalidChart as invalid:
            raise CaseError(f"chart {path}:{invalid.problems[0]}") from None
    wanted = [case.document, *(b.document for b in case.bindings if b.enabled)]
    for document in wanted:
        if document not in charts:
            raise CaseError(f"no chart for document {document!r}: no {directory / document}.scxml")
    return StaticResolver(charts)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} is given twice in one object")
        result[key] = value
    return result


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw[name]
    if not isinstance(value, str) or not value:
        raise CaseError(f"{name} must be a non-empty string, not {_json(value)}")
    return value


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
        raise CaseError('a step is an object with one key: "deliver", "advance" or "reap"')
    ((kind, value),) = entry.items()
    if kind == "advance":
        return Advance(parse_duration(value))
    if kind == "reap":
        if value not in ("addresses", "dedupe"):
            raise CaseError(f'reap is "addresses" or "dedupe", not {_json(value)}')
        return Reap(value)
    if kind != "deliver":
        raise CaseError(f'unknown step {kind!r} (one of "deliver", "advance", "reap")')
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


def _expected(raw: object) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise CaseError("expected must be an object with report keys")
    for key in raw:
        if key not in REPORT_KEYS:
            raise CaseError(f"expected: unknown key {key!r} (one of {', '.join(REPORT_KEYS)})")
    return raw
