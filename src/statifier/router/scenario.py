"""Routing cases: one JSON file of bindings and a script, run through the router on a
virtual clock, answered by one report (``statifier scenario CASE.json --charts DIR``).
The case format is :mod:`statifier.router.scenario_case`.

The chart of document ``D`` is ``DIR/D.scxml``; every ``*.scxml`` of the directory is
compiled at boot, named by its stem. Each run of a script case migrates its database
first: a SQLite file in a temporary directory unless a URL is given, under a table
prefix (by default the package's). The router runs with the send type
:data:`~statifier.router.scenario_case.SEND_TYPE`, the case's ``routes`` (each a
:class:`RecordingRoute`), its ``on_complete``, and the built-in timer queue, fired by
a :class:`~statifier.router.timer_worker.TimerWorker` on the virtual clock.
Executions are named ``ex_1``, ``ex_2``, ... in the order the run creates them (past
any the database already holds), so a report that shows a send's key is the same on
every run.

**Timers.** After every step the runner fires every timer due up to the step's time
(for ``advance``, the new time), one due instant at a time, in order of due time,
then scheduling, then the send's position in its step: the clock moves to each due
instant before its timers fire, so a timer that a fired step arms is timed from that
fire, and fires in the same step when it is due by then. A send to the execution
itself with no delay is due at once, so it is delivered at the end of the step that
sent it (the script never sees it pending). A fire that raises fails the case, and so
do more than :data:`MAX_FIRES` fires in one step (a chart that keeps sending to itself).

**The report** of a script case: ``ledger``, every ledger row oldest first as
``{"binding", "message_id", "outcome", "key"}`` (the outcome as
:attr:`~statifier.router.LedgerRow.spelled`); the case's execution, the one the
address table names for the case's document and scope (remembered after every step,
so it stays the case's execution after a reaper deletes its address; with no address
ever, as under ``always_new``, the first execution the ledger names for the
document): ``status`` (``null`` without one), ``configuration`` (its sorted active
leaf states, ``[]`` once finished) and ``datamodel`` (its data without the ``_``
system variables, tagged JSON); ``timers``, the event names of the pending timers,
sorted; and ``sends``, every hand-off to a route in order, each ``{"route", "event":
{"name", "data"}}`` (the data in tagged JSON: a send's resolved params, the donedata
of ``done.execution``).

The report of a publish case is ``{"contracts": {...}}``, the five lists of
:meth:`~statifier.router.contracts.Contracts.as_json`, each finding
``{"event", "document", "reason"}`` with ``"binding_id"`` or ``"location": {"line",
"column"}`` (and ``"route"`` or ``"type"`` where it has one). The chart checked is the
case's document's; the directory's other charts judge the documents the declarations
leave out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.core import Event
from statifier.expr.tagged import encode
from statifier.ids import new_execution_id
from statifier.persistence import ExecutionNotFound, PersistenceError, Storage
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.config import MintExecutionId, RouterConfig, StaticResolver
from statifier.router.contracts import check
from statifier.router.errors import RouterError
from statifier.router.queries import ledger, newest_address
from statifier.router.reapers import reap_addresses, reap_dedupe
from statifier.router.routes import IdempotencyKey
from statifier.router.routing import route
from statifier.router.scenario_case import (
    CONTRACT_KEYS,
    DEFAULT_START,
    MAX_CASE_BYTES,
    MAX_STEPS,
    REPORT_KEYS,
    SEND_TYPE,
    Advance,
    Case,
    CaseError,
    Deliver,
    Reap,
    Step,
    as_json,
    parse_duration,
    parse_start,
)
from statifier.router.timer_queue import TimerEntry
from statifier.router.timer_worker import TimerWorker
from statifier.router.timers import SqlTimerQueue, UnreadableTimer
from statifier.sql import DEFAULT_PREFIX, TableOptions, migrations

__all__ = [
    "CONTRACT_KEYS",
    "DEFAULT_START",
    "MAX_CASE_BYTES",
    "MAX_FIRES",
    "MAX_STEPS",
    "REPORT_KEYS",
    "SEND_TYPE",
    "Advance",
    "Case",
    "CaseError",
    "Deliver",
    "Reap",
    "RecordingRoute",
    "Step",
    "compare",
    "parse_duration",
    "parse_start",
    "run_case",
]

MAX_FIRES: Final = 10_000
"""The most timers one step may fire."""
_FAR_FUTURE: Final = datetime(9999, 12, 31, tzinfo=UTC)
_MAX_PENDING: Final = 100_000
"""The most pending timers a report (or a check after a fire) reads."""


@dataclass(frozen=True, slots=True)
class RecordingRoute:
    """A route adapter that hands nothing anywhere: it appends each hand-off to
    ``sends`` as ``{"route": name, "event": {"name", "data"}}`` (data in tagged JSON)
    and answers ``None``, so every send to it succeeds."""

    name: str
    sends: list[dict[str, Any]] = field(default_factory=list)

    def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> None:
        # A hand-off whose transaction then rolls back stays recorded: in a scenario
        # only a failure rolls back, and a failure ends the case.
        self.sends.append({"route": self.name, "event": {"name": event.name, "data": _data(event)}})


class _Clock:
    """The virtual clock: storage, router and timer worker read it, the script moves it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class _Mint:
    """Execution ids ``ex_1``, ``ex_2``, ...: deterministic, so a report is the same on
    every run, and past every id in ``taken`` (a kept database's)."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken
        self.numbers = itertools.count(1)

    def __call__(self, scope: str, document: str, key: str) -> str:
        while True:
            candidate = f"ex_{next(self.numbers)}"
            if candidate not in self.taken:
                self.taken.add(candidate)
                return candidate


async def run_case(
    case: Case,
    charts_dir: Path,
    database_url: str | None = None,
    start: datetime | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
) -> dict[str, Any]:
    """Run ``case`` and answer its report: a publish case by the contracts alone (no
    database); a script case on a freshly migrated database (``database_url``, else
    SQLite in a temporary file) with tables under ``prefix``, from ``start`` (else the
    case's, else :data:`DEFAULT_START`).

    Raises:
        CaseError: a chart is missing, unreadable or invalid, the prefix is not one, or
            a step failed in the router, persistence or a timer's fire (named by its
            index).
        sqlalchemy.exc.SQLAlchemyError, OSError: the database failed.
    """
    charts = _charts(charts_dir)
    if case.publish:
        return await _publish(case, charts, charts_dir)
    wanted = [case.document, *(b.document for b in case.bindings if b.enabled)]
    _require(charts, charts_dir, wanted)
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
            taken = {record.id for record in await storage.list_executions()}
            sends: list[dict[str, Any]] = []
            config = _config(case, storage, _resolver(charts), sends, _Mint(taken))
            worker = TimerWorker(config, clock=clock)
            # The case's execution: the one the address table names, remembered after
            # every step, so that it stays the case's once a reap deletes its row.
            named: str | None = None
            for index, step in enumerate(case.script):
                try:
                    await _run_step(config, worker, step, clock)
                    named = await newest_address(config, case.scope, case.document) or named
                except CaseError as error:
                    raise CaseError(f"script[{index}]: {error}") from None
                except (RouterError, PersistenceError) as error:
                    name = type(error).__name__
                    raise CaseError(f"script[{index}]: {name}: {error}") from None
            report = await _report(config, case.document, named)
            report["timers"] = sorted(entry.event.name for entry in await _pending(config))
            report["sends"] = sends
            return report


def compare(report: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """One line per key of ``expected`` whose value differs from the report's, compared
    exactly as JSON (``1``, ``1.0`` and ``true`` differ); a list names its first
    differing item, and ``contracts`` each differing list (``contracts.unchecked[0]``)."""
    lines: list[str] = []
    for key in (*REPORT_KEYS, *CONTRACT_KEYS):
        if key not in expected or as_json(expected[key]) == as_json(report.get(key)):
            continue
        want, got = expected[key], report.get(key)
        if key == "contracts" and isinstance(want, dict) and isinstance(got, dict):
            lines.extend(
                _difference(f"{key}.{name}", want.get(name), got.get(name))
                for name in dict.fromkeys([*want, *got])
                if as_json(want.get(name)) != as_json(got.get(name))
            )
        else:
            lines.append(_difference(key, want, got))
    return lines


def _difference(where: str, want: object, got: object) -> str:
    if isinstance(want, list) and isinstance(got, list):
        index = next(
            i
            for i in range(max(len(want), len(got)))
            if i >= len(want) or i >= len(got) or as_json(want[i]) != as_json(got[i])
        )
        shown_want = as_json(want[index]) if index < len(want) else "nothing"
        shown_got = as_json(got[index]) if index < len(got) else "nothing"
        return f"{where}[{index}]: expected {shown_want}, got {shown_got}"
    return f"{where}: expected {as_json(want)}, got {as_json(got)}"


def _config(
    case: Case,
    store: SqlAdapter | Storage,
    resolver: StaticResolver,
    sends: list[dict[str, Any]],
    mint: MintExecutionId = new_execution_id,
) -> RouterConfig:
    """The router a case runs with: its bindings, its routes recording into ``sends``,
    its ``on_complete``, the built-in timer queue."""
    return RouterConfig(
        store,
        bindings=case.bindings,
        resolver=resolver,
        send_type=SEND_TYPE,
        routes={name: (RecordingRoute(name, sends), {}) for name in case.routes},
        on_complete=case.on_complete,
        execution_id=mint,
    )


async def _publish(case: Case, charts: dict[str, Machine], directory: Path) -> dict[str, Any]:
    _require(charts, directory, [case.document])
    assert case.declarations is not None
    others = {name: chart for name, chart in charts.items() if name != case.document}
    # An in-memory adapter, never written: it only satisfies the configuration.
    async with SqlAdapter("sqlite://") as adapter:
        config = _config(case, adapter, _resolver(charts), [])
        found = check(config, case.document, charts[case.document], case.declarations, others)
    return {"contracts": found.as_json()}


async def _run_step(config: RouterConfig, worker: TimerWorker, step: Step, clock: _Clock) -> None:
    until = clock.now
    if isinstance(step, Deliver):
        await route(config, step.event, now=clock.now)
    elif isinstance(step, Advance):
        until = clock.now + step.by
    elif step.table == "addresses":
        await reap_addresses(config, clock.now)
    else:
        await reap_dedupe(config, clock.now)
    await _fire_until(config, worker, clock, until)
    clock.now = until


async def _fire_until(
    config: RouterConfig, worker: TimerWorker, clock: _Clock, until: datetime
) -> None:
    """Fire every timer due at or before ``until``, one due instant at a time, the clock
    moved to each first (never back: a timer due now is due at the clock).

    Raises:
        CaseError: a due timer's fire raised (the worker left it, due again later), or
            more than :data:`MAX_FIRES` timers fired.
    """
    fired = 0
    while True:
        upcoming = await worker.next_due()
        if upcoming is None or upcoming > until:
            return
        clock.now = max(clock.now, upcoming)
        due = {str(entry.key): entry for entry in await _pending(config, clock.now)}
        fired += await worker.fire_due(clock.now)
        still = {str(entry.key) for entry in await _pending(config)}
        left = [entry for key, entry in due.items() if key in still]
        if left:
            at = left[0].due_at.isoformat()
            raise CaseError(f"the timer {left[0].event.name!r} due at {at} failed to fire")
        if fired > MAX_FIRES:
            raise CaseError(f"more than {MAX_FIRES} timers fired in one step")


async def _pending(config: RouterConfig, upto: datetime = _FAR_FUTURE) -> list[TimerEntry]:
    """The pending timers due at or before ``upto``, in firing order."""
    queue = config.timers
    assert isinstance(queue, SqlTimerQueue)
    # A claim reads the rows without taking them; its locks end with this transaction.
    async with config.transaction() as unit:
        entries = []
        for timer in await queue.claim(unit.tx, upto, _MAX_PENDING):
            if isinstance(timer, UnreadableTimer):
                raise timer.error
            entries.append(timer.entry)
        return entries


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


def _charts(directory: Path) -> dict[str, Machine]:
    """Every chart of ``directory``, by file stem."""
    if not directory.is_dir():
        raise CaseError(f"--charts {directory}: not a directory")
    charts: dict[str, Machine] = {}
    for path in sorted(directory.glob("*.scxml")):
        try:
            charts[path.stem] = compile_chart(path.read_bytes(), name=path.stem)
        except OSError as error:
            raise CaseError(f"chart {path}: cannot read: {error.strerror}") from None
        except InvalidChart as invalid:
            raise CaseError(f"chart {path}:{invalid.problems[0]}") from None
    return charts


def _resolver(charts: Mapping[str, Machine]) -> StaticResolver:
    by_document: dict[str | tuple[str, str], Machine] = {}
    by_document.update(charts)
    return StaticResolver(by_document)


def _require(charts: Mapping[str, Machine], directory: Path, documents: list[str]) -> None:
    for document in documents:
        if document not in charts:
            raise CaseError(f"no chart for document {document!r}: no {directory / document}.scxml")


def _data(event: Event) -> Any:
    """An event's data as tagged JSON (``null`` for a send with none)."""
    return encode(event.data)
