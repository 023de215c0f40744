"""Routing cases: one JSON file of bindings and a script, run through the router on a
virtual clock, summed up in one report (``statifier scenario CASE.json --charts DIR``,
or ``--config statifier.toml`` for the charts, bindings, routes and send type a serve
file deploys). The case format is :mod:`statifier.router.scenario_case`.

**What a case runs with.** Either a charts directory and the case's own keys: the
chart of document ``D`` is ``DIR/D.scxml`` (every ``*.scxml`` of the directory is
compiled at boot, named by its stem), with the case's ``bindings``, its ``routes``
(each a :class:`RecordingRoute`), its ``on_complete`` and its ``send_type`` (else
:data:`~statifier.router.scenario_case.SEND_TYPE`). Or a :class:`Deployment`: a serve
file's documents, bindings, routes (each a :class:`RecordingRoute` with the route's
configuration as the service registers it), ``on_complete`` and send type, as plain
values the command line reads with the service's own loader; the case then names none
of those keys. Each run of a script case migrates its database first: a SQLite file
in a temporary directory unless a URL is given, under a table prefix (by default the
package's); a deployment's own database is never opened. Timers live in the built-in
timer queue, fired by a :class:`~statifier.router.timer_worker.TimerWorker` on the
virtual clock. Executions are named ``ex_1``, ``ex_2``, ... in the order the run
creates them (past any the database already holds), so a report that shows a send's
key is the same on every run.

**Timers.** After every step the runner fires every timer due up to the step's time
(for ``advance``, the new time), one due instant at a time, in order of due time,
then scheduling, then the send's position in its step: the clock moves to each due
instant before its timers fire, so a timer that a fired step arms is timed from that
fire, and fires in the same step when it is due by then. A send to the execution
itself with no delay is due at once, so it is delivered at the end of the step that
sent it (the script never sees it pending). A fire that raises fails the case, and so
do more than :data:`MAX_FIRES` fires in one step (a chart that keeps sending to itself).

**Schedules.** A case's ``schedules`` are put (:meth:`Scheduler.put
<statifier.router.scheduler.Scheduler.put>`) on the run's database when the case
starts, at its start time, and fired by a :class:`~statifier.router.scheduler.Scheduler`
on the virtual clock, together with the timers: after every step the runner takes the
earliest instant at which a timer or a schedule is due, up to the step's time, moves
the clock there and fires what is due then (:meth:`Scheduler.fire_due
<statifier.router.scheduler.Scheduler.fire_due>` at that instant), and so on. At one
instant the timers due fire first (they were armed by steps already taken), then the
schedules due, by name (each fire is an input from outside, as a ``deliver`` is), then
any timer those fires armed due at once. So an ``advance`` makes each fire on time, at
its own instant, whatever the catch-up policy: it models time passing with the
service running. A ``down`` step models the service stopped: the clock moves and
nothing fires; the next step (an ``advance`` of ``PT0S`` for nothing else) makes what
came due, a schedule's missed fires as its catch-up policy and grace say. Each fire
is routed as the scheduler routes it (message id ``NAME/<fire time, UTC ISO
8601>``), so its deliveries are the report's ledger rows under that message id, as a
delivered event's are; a fire no binding matches, or a missed fire let pass, writes
none. A fire that fails fails the case, and so do more than :data:`MAX_FIRES` schedule
steps in one step. On a kept database the schedules already there stay, and fire too;
``put`` keeps a schedule's paused state, and its next fire unless its times changed.

**Held events.** What a binding whose ``mode`` is ``debounce``, ``batch`` or
``throttle`` holds (:mod:`statifier.router.flow`) is delivered by a
:class:`~statifier.router.FlowWorker` on the virtual clock, with the timers and the
schedules: when a group of held events comes due, the clock moves to that instant and
the group is flushed; at one instant the timers first, then the held events (they came
in before anything that comes in at that instant), then the schedules. A delivered
event that a binding holds is ``buffered`` in the report's ledger rows; its flush's
delivery is filed under the last delivered message's id. A flush that fails fails the
case, and so do more than :data:`MAX_FIRES` flushes in one step.

**Over several stores** (``--shards K``): the case runs over K temporary SQLite
files under a :class:`~statifier.router.ShardedRouter`, each store with its own timer
and flow workers, the schedules in the first; before each due instant is looked for,
every send between stores waiting in an outbox is handed over. Ids are minted in
their address's bucket and reported as ``ex_1``, ``ex_2``, ... as over one store.

**Sends the scenario does not handle.** The router performs sends of its send type
(to routes and to ``target="execution"``), sends to the execution itself, and
BasicHTTP sends (into the outbox, which no scenario drains). Any other send, a type
written for a host's executor or for another deployment's send type, or an SCXML send
to a target no execution is, is *unhandled*: the runner lists it in the report and
refuses it as ``statifier serve`` refuses it (the chart hears ``error.communication``).
So that a send of a literal type the router does not know reaches that list instead
of raising ``error.execution`` at the ``<send>``, executions start accepting every
literal send type the charts write (found as the publish-time contracts find
``unsupported_types``); a type computed by ``typeexpr`` is not known in advance, and
a send of one the executions do not accept raises ``error.execution`` as it would
when deployed.

**The report** of a script case: ``ledger``, every ledger row oldest first as
``{"binding", "message_id", "outcome", "key"}`` (the outcome as
:attr:`~statifier.router.LedgerRow.spelled`); the case's execution, the one the
address table names for the case's document and scope (remembered after every step,
so it stays the case's execution after a reaper deletes its address; with no address
ever, as under ``always_new``, the first execution the ledger names for the
document): ``status`` (``null`` without one), ``configuration`` (its sorted active
leaf states, ``[]`` once ended), ``final_state`` (the id of the top-level ``<final>``
it ended in, else ``null``) and ``datamodel`` (its data without the ``_`` system
variables, tagged JSON); ``timers``, the event names of the pending timers, sorted;
``sends``, every hand-off to a route in order, each ``{"route", "event": {"name",
"data"}}`` (the data in tagged JSON: a send's resolved params, the donedata of
``done.execution``), with ``"config"``, the route's configuration, when it has one (a
serve file's route: its ``queue``, its ``target``); ``unhandled_sends``, every
unhandled send in order, each ``{"step", "execution", "type", "target", "event"}``
(``step`` the index in the script of the step during which it was sent); and
``executions``, every execution the run created or stepped, by id (those it created
first, in order), each ``{"document", "status", "configuration", "final_state"}``.

A case that expects ``sends`` fails on any unhandled send (:func:`compare` names each);
a case that does not is warned of each (:func:`warning_lines`).

The report of a publish case is ``{"contracts": {...}}``, the five lists of
:meth:`~statifier.router.contracts.Contracts.as_json`, each finding
``{"event", "document", "reason"}`` with ``"binding_id"`` or ``"location": {"line",
"column"}`` (and ``"route"`` or ``"type"`` where it has one). The chart checked is the
case's document's; the other charts (of the directory or the deployment) judge the
documents the declarations leave out.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from statifier.buckets import address_bucket, tagged
from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.core import Event, MachineState, StartOptions
from statifier.core import effects as fx
from statifier.expr.tagged import encode
from statifier.ids import new_execution_id
from statifier.persistence import (
    EffectContext,
    ExecutionNotFound,
    ExecutionRecord,
    PersistenceError,
    Refused,
    Storage,
)
from statifier.persistence.executor import Executor, refuse_unperformed
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router.binding import Binding
from statifier.router.config import MintExecutionId, RouterConfig, StaticResolver
from statifier.router.contracts import check
from statifier.router.errors import RouterError
from statifier.router.flow_worker import FlowWorker
from statifier.router.outbox import OutboxDrain
from statifier.router.queries import ledger, newest_address
from statifier.router.reapers import reap_addresses, reap_dedupe
from statifier.router.routes import IdempotencyKey
from statifier.router.routing import Router
from statifier.router.scenario_case import (
    CONTRACT_KEYS,
    DEFAULT_START,
    DEPLOYED_KEYS,
    MAX_CASE_BYTES,
    MAX_SCHEDULES,
    MAX_STEPS,
    REPORT_KEYS,
    SEND_TYPE,
    Advance,
    Case,
    CaseError,
    Deliver,
    Down,
    Reap,
    Step,
    as_json,
    parse_duration,
    parse_start,
)
from statifier.router.scheduler import Scheduler
from statifier.router.schedules import ScheduleError
from statifier.router.sending import SHARD_HOP_QUEUE, SHARD_REFUSAL_QUEUE
from statifier.router.shards import ShardedRouter
from statifier.router.timer_queue import TimerEntry
from statifier.router.timer_worker import TimerWorker
from statifier.router.timers import SqlTimerQueue, UnreadableTimer
from statifier.sql import TableOptions, migrations
from statifier.sql.tables import DEFAULT_PREFIX

__all__ = [
    "CONTRACT_KEYS",
    "DEFAULT_START",
    "DEPLOYED_KEYS",
    "MAX_CASE_BYTES",
    "MAX_FIRES",
    "MAX_SCHEDULES",
    "MAX_SHARDS",
    "MAX_STEPS",
    "REPORT_KEYS",
    "SEND_TYPE",
    "Advance",
    "Case",
    "CaseError",
    "Deliver",
    "Deployment",
    "Down",
    "Reap",
    "RecordingRoute",
    "Step",
    "compare",
    "parse_duration",
    "parse_start",
    "run_case",
    "unhandled_line",
    "warning_lines",
]

MAX_SHARDS: Final = 16
"""The most stores ``--shards`` spreads a case over."""
MAX_FIRES: Final = 10_000
"""The most timers one step may fire, and the most schedule steps (fires made, or
missed ones let pass)."""
_FAR_FUTURE: Final = datetime(9999, 12, 31, tzinfo=UTC)
_MAX_PENDING: Final = 100_000
"""The most pending timers a report (or a check after a fire) reads."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """What a serve file deploys, as plain values a case runs with in place of a charts
    directory and its own bindings, routes, ``on_complete`` and send type. ``statifier
    scenario --config`` reads the file with the loader ``statifier serve`` uses and
    hands its values over; the runner opens nothing the file names (its database, its
    sinks, fronts and sources).

    Attributes:
        file: the file as it was named, for messages.
        documents: document -> its compiled chart.
        bindings: every binding, in file order.
        send_type: the router's send type (``None`` when the file names none: then
            every typed send is unhandled).
        routes: route name -> its configuration as the service registers it (JSON
            values: an outbox ``queue``, a ``target``); each is served by a
            :class:`RecordingRoute`.
        on_complete: the route handed ``done.execution``, or ``None``.
    """

    file: str
    documents: Mapping[str, Machine]
    bindings: Sequence[Binding] = ()
    send_type: str | None = None
    routes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    on_complete: str | None = None


@dataclass(frozen=True, slots=True)
class RecordingRoute:
    """A route adapter that hands nothing anywhere: it appends each hand-off to
    ``sends`` as ``{"route": name, "event": {"name", "data"}}`` (data in tagged JSON),
    with ``"config"``, the route's configuration, when it is not empty, and returns
    ``None``, so every send to it succeeds."""

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
        sent: dict[str, Any] = {
            "route": self.name,
            "event": {"name": event.name, "data": _data(event)},
        }
        if config:
            sent["config"] = dict(config)
        self.sends.append(sent)


class _Unhandled:
    """The executor of a scenario's router: what the router hands on (a send of a type
    it does not perform, an SCXML send to a target no execution is, an invocation)
    reaches it. It lists each send with the script step it came from, then refuses it
    as ``statifier serve``'s executor does (:func:`refuse_unperformed`)."""

    def __init__(self) -> None:
        self.step = 0
        self.sends: list[dict[str, Any]] = []

    def __call__(self, effect: fx.Effect, context: EffectContext) -> Refused | None:
        if isinstance(effect, fx.Send | fx.SendDelayed):
            # Like the recording route: a step that rolls back would leave its entry,
            # but in a scenario a rollback is a failure, and a failure ends the case.
            self.sends.append(
                {
                    "step": self.step,
                    "execution": context.execution_id,
                    "type": effect.type,
                    "target": effect.target,
                    "event": effect.event,
                }
            )
        return refuse_unperformed(effect, context)


@dataclass(frozen=True, slots=True)
class _Setup:
    """What a case runs with: its own keys over a charts directory, or a deployment's."""

    source: Path | Deployment
    charts: Mapping[str, Machine]
    bindings: tuple[Binding, ...]
    send_type: str | None
    routes: Mapping[str, Mapping[str, Any]]
    on_complete: str | None


class _Clock:
    """The virtual clock: storage, router and timer worker read it, the script moves it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class _Mint:
    """Execution ids ``ex_1``, ``ex_2``, ...: deterministic, so a report is the same on
    every run, and past every id in ``taken`` (a kept database's). ``minted`` keeps
    them in the order given. Over several stores (``tagged``), ``ex_``, the number in
    26 digits and the address's bucket (:func:`~statifier.buckets.tagged`), so that
    each execution falls in its address's store; :func:`_untagged` spells them back
    ``ex_N`` in the report."""

    def __init__(self, taken: set[str], *, tagged: bool = False) -> None:
        self.taken = taken
        self.numbers = itertools.count(1)
        self.minted: list[str] = []
        self.tagged = tagged

    def __call__(self, scope: str, document: str, key: str) -> str:
        while True:
            number = next(self.numbers)
            candidate = (
                f"ex_{number:026d}{tagged(address_bucket(scope, document, key))}"
                if self.tagged
                else f"ex_{number}"
            )
            if candidate not in self.taken:
                self.taken.add(candidate)
                self.minted.append(candidate)
                return candidate


_TAGGED_ID: Final = re.compile(r"ex_(\d{26})_[0-3][0-9a-f]{2}")


def _untagged(report: Any) -> Any:
    """``report`` with every id a tagged :class:`_Mint` made spelled ``ex_N``."""
    text = json.dumps(report)
    return json.loads(_TAGGED_ID.sub(lambda found: f"ex_{int(found[1])}", text))


async def run_case(
    case: Case,
    charts: Path | Deployment,
    database_url: str | None = None,
    start: datetime | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    shards: int = 1,
) -> dict[str, Any]:
    """Run ``case`` and answer its report (see the module docstring), with the charts
    of the directory ``charts`` and the case's own bindings, routes and send type, or
    with a :class:`Deployment`'s: a publish case by the contracts alone (no database);
    a script case on a freshly migrated database (``database_url``, else SQLite in a
    temporary file) with tables under ``prefix``, from ``start`` (else the case's,
    else :data:`DEFAULT_START`). With ``shards`` above 1, the case runs over that many
    temporary SQLite files, a :class:`~statifier.router.ShardedRouter` over them (each
    store with its timer and flow workers, the schedules in the first, the sends
    between stores handed over at once); the report is the same as over one, but
    that a send between stores is delivered after the sending step commits (its
    target's ledger row comes after the sender's of the same instant) and its refusal
    reaches the sender later.

    Raises:
        CaseError: a chart is missing, unreadable or invalid; a script case without
            bindings run on a directory, or a case naming one of
            :data:`DEPLOYED_KEYS` run on a deployment; the router refuses the
            configuration; the prefix is not one; ``shards`` is below 1 or above
            :data:`MAX_SHARDS`, or above 1 with ``database_url``; or a step failed in
            the router, persistence, a timer's fire or a schedule's (named by its
            index); a schedule could not be put.
        sqlalchemy.exc.SQLAlchemyError, OSError: the database failed.
    """
    setup = _setup(case, charts)
    if case.publish:
        return await _publish(case, setup)
    _require(setup, [case.document, *(b.document for b in setup.bindings if b.enabled)])
    try:
        options = TableOptions(prefix=prefix)
    except ValueError as error:
        raise CaseError(f"--prefix: {error}") from None
    if not 1 <= shards <= MAX_SHARDS:
        raise CaseError(f"--shards: from 1 to {MAX_SHARDS}, not {shards}")
    if shards > 1 and database_url is not None:
        raise CaseError("--shards runs on temporary SQLite files: give no --database")
    clock = _Clock(start or case.start or DEFAULT_START)
    with contextlib.ExitStack() as stack:
        if database_url is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            urls = [f"sqlite:///{directory / f'scenario{number}.db'}" for number in range(shards)]
        else:
            urls = [database_url]
        adapters = []
        for url in urls:
            await asyncio.to_thread(migrations.upgrade, url, options)
            try:
                adapters.append(SqlAdapter(url, options))
            except ValueError as error:
                raise CaseError(f"database: {error}") from None
        try:
            report = await _run_script(case, setup, adapters, clock)
        finally:
            for adapter in adapters:
                await adapter.close()
        return _untagged(report) if shards > 1 else report


async def _run_script(
    case: Case, setup: _Setup, adapters: list[SqlAdapter], clock: _Clock
) -> dict[str, Any]:
    storage = Storage(adapters[0], clock=clock)
    before = {record.id: _seen(record) for record in await storage.list_executions()}
    mint = _Mint(set(before), tagged=len(adapters) > 1)
    sends: list[dict[str, Any]] = []
    unhandled = _Unhandled()
    accepted = _literal_types(_config(setup, storage, sends), setup.charts)
    router = ShardedRouter(_config(setup, storage, sends, mint, unhandled, accepted), adapters)
    scheduler = Scheduler(router, clock=clock)
    for index, schedule in enumerate(case.schedules):
        try:
            await scheduler.put(schedule, now=clock.now)
        except ScheduleError as error:
            raise CaseError(f"schedules[{index}]: {error}") from None
    firing = _Firing(
        router,
        tuple(TimerWorker(each, clock=clock) for each in router.routers),
        scheduler,
        tuple(FlowWorker(each, clock=clock) for each in router.routers),
        tuple(router.hop_drains()),
        clock,
    )
    # The case's execution: the one the address table names, remembered after every
    # step, so that it stays the case's once a reap deletes its row.
    named: str | None = None
    for index, step in enumerate(case.script):
        unhandled.step = index
        try:
            await _run_step(firing, step)
            named = await _newest(router, case.scope, case.document, mint.minted) or named
        except CaseError as error:
            raise CaseError(f"script[{index}]: {error}") from None
        except (RouterError, PersistenceError) as error:
            name = type(error).__name__
            raise CaseError(f"script[{index}]: {name}: {error}") from None
    report = await _report(router, case.document, named)
    pending = [entry for each in router.routers for entry in await _pending(each)]
    report["timers"] = sorted(entry.event.name for entry in pending)
    report["sends"] = sends
    report["unhandled_sends"] = unhandled.sends
    report["executions"] = await _executions(router, setup.charts, before, mint.minted)
    return {key: report[key] for key in REPORT_KEYS}


async def _newest(
    router: ShardedRouter, scope: str, document: str, minted: Sequence[str]
) -> str | None:
    """The execution the newest address of ``document`` in ``scope`` names, of every
    store: over several, the one minted last (a create mints as it writes the address)."""
    named = [
        found
        for each in router.routers
        if (found := await newest_address(each, scope, document)) is not None
    ]
    if len(named) < 2:
        return named[0] if named else None
    order = {execution_id: index for index, execution_id in enumerate(minted)}
    return max(named, key=lambda execution_id: order.get(execution_id, -1))


def compare(report: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """One line per key of ``expected`` whose value differs from the report's, compared
    exactly as JSON (``1``, ``1.0`` and ``true`` differ); a list names its first
    differing item, and ``contracts`` each differing list (``contracts.unchecked[0]``).
    When ``expected`` has ``sends``, each of the report's ``unhandled_sends`` is one
    more line (``sends: script[1]: ...``, :func:`unhandled_line`): the sends a case
    expects are not all there while one went to no handler."""
    lines: list[str] = []
    for key in (*REPORT_KEYS, *CONTRACT_KEYS):
        if key not in expected:
            continue
        if as_json(expected[key]) != as_json(report.get(key)):
            want, got = expected[key], report.get(key)
            if key == "contracts" and isinstance(want, dict) and isinstance(got, dict):
                lines.extend(
                    _difference(f"{key}.{name}", want.get(name), got.get(name))
                    for name in dict.fromkeys([*want, *got])
                    if as_json(want.get(name)) != as_json(got.get(name))
                )
            else:
                lines.append(_difference(key, want, got))
        if key == "sends":
            lines.extend(f"sends: {unhandled_line(s)}" for s in report.get("unhandled_sends", []))
    return lines


def warning_lines(report: Mapping[str, Any], expected: Mapping[str, Any] | None) -> list[str]:
    """One ``warning: ...`` line per unhandled send of ``report``
    (:func:`unhandled_line`), unless ``expected`` has ``sends``: then :func:`compare`
    names each as a difference instead."""
    if expected is not None and "sends" in expected:
        return []
    return [f"warning: {unhandled_line(s)}" for s in report.get("unhandled_sends", [])]


def unhandled_line(send: Mapping[str, Any]) -> str:
    """An entry of a report's ``unhandled_sends`` in words.

    >>> unhandled_line({"step": 1, "execution": "ex_1", "type": "shop:route",
    ...                 "target": "paid", "event": "ok"})
    "script[1]: ex_1 sent 'ok' to 'paid' with type 'shop:route', which the scenario does not handle"
    """
    target = "no target" if send.get("target") is None else repr(send["target"])
    kind = "no type" if send.get("type") is None else f"type {send['type']!r}"
    return (
        f"script[{send.get('step')}]: {send.get('execution')} sent {send.get('event')!r} "
        f"to {target} with {kind}, which the scenario does not handle"
    )


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


def _setup(case: Case, source: Path | Deployment) -> _Setup:
    """What ``case`` runs with on ``source``.

    Raises:
        CaseError: a deployment and a case that names one of its keys, a directory and
            a script case without bindings, or a chart the directory cannot give.
    """
    if isinstance(source, Deployment):
        named = case.deployed
        if named:
            raise CaseError(
                f"{named[0]}: {source.file} gives the bindings, routes, on_complete and "
                "send type: a case run on a serve file names none of them"
            )
        return _Setup(
            source,
            source.documents,
            tuple(source.bindings),
            source.send_type,
            source.routes,
            source.on_complete,
        )
    if case.bindings is None and not case.publish:
        raise CaseError("the key 'bindings' is required (unless the case runs on a serve file)")
    return _Setup(
        source,
        _charts(source),
        case.bindings or (),
        case.send_type or SEND_TYPE,
        {name: {} for name in case.routes or ()},
        case.on_complete,
    )


def _config(
    setup: _Setup,
    store: SqlAdapter | Storage,
    sends: list[dict[str, Any]],
    mint: MintExecutionId = new_execution_id,
    executor: Executor = refuse_unperformed,
    send_types: frozenset[str] = frozenset(),
) -> RouterConfig:
    """The router a case runs with: its bindings, its routes recording into ``sends``,
    its ``on_complete`` and send type, the built-in timer queue, executions started
    accepting ``send_types`` besides the router's own.

    Raises:
        CaseError: the router refuses the combination (a built-in send type, say).
    """
    try:
        return RouterConfig(
            store,
            bindings=setup.bindings,
            resolver=_resolver(setup.charts),
            send_type=setup.send_type,
            routes={
                name: (RecordingRoute(name, sends), config) for name, config in setup.routes.items()
            },
            on_complete=setup.on_complete,
            execution_id=mint,
            executor=executor,
            start_options=StartOptions(send_types=send_types),
            # The scenario fires the timers itself, on its virtual clock.
            timers_elsewhere=True,
        )
    except RouterError as error:
        raise CaseError(str(error)) from None


def _literal_types(config: RouterConfig, charts: Mapping[str, Machine]) -> frozenset[str]:
    """Every literal send type of ``charts`` that executions under ``config`` do not
    accept: the ``unsupported_types`` of the publish-time contracts."""
    return frozenset(
        finding.type
        for document, chart in charts.items()
        for finding in check(config, document, chart, {}).unsupported_types
        if finding.type is not None
    )


async def _publish(case: Case, setup: _Setup) -> dict[str, Any]:
    _require(setup, [case.document])
    assert case.declarations is not None
    charts = setup.charts
    others = {name: chart for name, chart in charts.items() if name != case.document}
    # An in-memory adapter, never written: it only satisfies the configuration.
    async with SqlAdapter("sqlite://") as adapter:
        config = _config(setup, adapter, [])
        found = check(config, case.document, charts[case.document], case.declarations, others)
    return {"contracts": found.as_json()}


@dataclass(frozen=True, slots=True)
class _Firing:
    """What fires on the virtual clock: each store's timer worker, flow worker and
    drain of the sends between stores, and the scheduler."""

    router: ShardedRouter
    workers: tuple[TimerWorker, ...]
    scheduler: Scheduler
    flows: tuple[FlowWorker, ...]
    hops: tuple[OutboxDrain, ...]
    clock: _Clock


async def _run_step(firing: _Firing, step: Step) -> None:
    router, clock = firing.router, firing.clock
    until = clock.now
    if isinstance(step, Deliver):
        await router.route(step.event, now=clock.now)
    elif isinstance(step, Advance):
        until = clock.now + step.by
    elif isinstance(step, Down):
        # Nothing runs while the service is down: what comes due waits for the next
        # step, which fires it late (a schedule's as its catch-up policy says).
        clock.now += step.by
        return
    else:
        for each in router.routers:
            if step.table == "addresses":
                await reap_addresses(each, clock.now)
            else:
                await reap_dedupe(each, clock.now)
    await _fire_until(firing, until)
    clock.now = until


async def _earliest(calls: Sequence[Callable[[], Awaitable[datetime | None]]]) -> datetime | None:
    dues = [due for call in calls if (due := await call()) is not None]
    return min(dues, default=None)


async def _fire_until(firing: _Firing, until: datetime) -> None:
    """Fire every timer, held group and schedule due at or before ``until``, one due
    instant at a time, the clock moved to each first (never back: what is overdue is
    due at the clock); at one instant the timers due first, then the held events, then
    the schedules.

    Raises:
        CaseError: a due timer's fire raised (the worker left it, due again later), a
            flush or a schedule's fire failed, or more than :data:`MAX_FIRES` timers
            fired, groups were flushed, or schedule steps were taken.
    """
    clock = firing.clock
    timers = flushes = steps = 0
    while True:
        await _hand_over(firing)
        timer_due = await _earliest([worker.next_due for worker in firing.workers])
        flow_due = await _earliest([flow.next_due for flow in firing.flows])
        schedule_due = await firing.scheduler.next_due()
        dues = [
            due for due in (timer_due, flow_due, schedule_due) if due is not None and due <= until
        ]
        if not dues:
            return
        clock.now = max(clock.now, min(dues))
        # Timers first: a timer due at this instant was armed by a step already taken,
        # and settles before the schedules' fires come in from outside, as the steps of
        # the script come in after the timers their predecessors armed. Held events
        # came in before this instant: they go before the schedules' fires too.
        if timer_due is not None and timer_due <= clock.now:
            for router, worker in zip(firing.router.routers, firing.workers, strict=True):
                timers += await _fire_timers(router, worker, clock.now)
            if timers > MAX_FIRES:
                raise CaseError(f"more than {MAX_FIRES} timers fired in one step")
        elif flow_due is not None and flow_due <= clock.now:
            for flow in firing.flows:
                flushes += await _flush(flow, clock.now)
            if flushes > MAX_FIRES:
                raise CaseError(f"more than {MAX_FIRES} held groups flushed in one step")
        else:
            steps += await _fire_schedules(firing.scheduler, clock.now)
            if steps > MAX_FIRES:
                raise CaseError(f"more than {MAX_FIRES} schedule fires in one step")


async def _hand_over(firing: _Firing) -> None:
    """Deliver every send between stores waiting in an outbox, until none is left.

    Raises:
        CaseError: a hand-over failed.
    """
    for _ in range(MAX_FIRES):
        claimed = 0
        for drain in firing.hops:
            report = await drain.drain_once(firing.clock.now)
            if report.failed or report.dead:
                errors = [
                    row.last_error
                    for queue in (SHARD_HOP_QUEUE, SHARD_REFUSAL_QUEUE)
                    for row in await drain.rows(queue=queue)
                ]
                why = next((error for error in errors if error), "")
                raise CaseError(f"a send to another store's execution failed: {why}")
            claimed += report.claimed
        if not claimed:
            return
    raise CaseError(f"more than {MAX_FIRES} passes handing sends between stores")


async def _fire_timers(router: Router, worker: TimerWorker, now: datetime) -> int:
    """Fire ``router``'s timers due at ``now``; answer how many the worker took.

    Raises:
        CaseError: a due timer's fire raised (the worker left it, due again later).
    """
    due = {str(entry.key): entry for entry in await _pending(router, now)}
    if not due:
        return 0
    fired = await worker.fire_due(now)
    still = {str(entry.key) for entry in await _pending(router)}
    left = [entry for key, entry in due.items() if key in still]
    if left:
        at = left[0].due_at.isoformat()
        raise CaseError(f"the timer {left[0].event.name!r} due at {at} failed to fire")
    return fired


async def _flush(flow: FlowWorker, now: datetime) -> int:
    """One pass of ``flow`` at ``now``: every group of held events due then is
    delivered; answer how many.

    Raises:
        CaseError: a flush failed (the worker recorded the error on the group).
    """
    reports = await flow.flush_due(now=now)
    failed = next((report for report in reports if report.error is not None), None)
    if failed is not None:
        where = f"binding {failed.binding_id!r}, key {failed.key!r}"
        raise CaseError(f"the events held for {where} failed to deliver: {failed.error}")
    return len(reports)


async def _fire_schedules(scheduler: Scheduler, now: datetime) -> int:
    """One pass of ``scheduler`` at ``now``: every schedule due then steps, the
    earliest due first (by name among those due at one instant), one fire a
    transaction; answer how many steps were taken.

    Raises:
        CaseError: a schedule's step failed (the scheduler recorded the error on it).
    """
    reports = await scheduler.fire_due(now=now)
    failed = next((report for report in reports if report.error is not None), None)
    if failed is not None:
        at = now.isoformat()
        raise CaseError(f"the schedule {failed.name!r} failed to fire at {at}: {failed.error}")
    return len(reports)


async def _pending(router: Router, upto: datetime = _FAR_FUTURE) -> list[TimerEntry]:
    """The pending timers due at or before ``upto``, in firing order."""
    queue = router.timers
    assert isinstance(queue, SqlTimerQueue)
    # A claim reads the rows without taking them; its locks end with this transaction.
    async with router.transaction() as unit:
        entries = []
        for timer in await queue.claim(unit.tx, upto, _MAX_PENDING):
            if isinstance(timer, UnreadableTimer):
                raise timer.error
            entries.append(timer.entry)
        return entries


async def _report(router: ShardedRouter, document: str, named: str | None) -> dict[str, Any]:
    # Each store's rows oldest first, merged by time (a store's own rows keep their
    # order among those of one instant).
    rows = list(
        heapq.merge(*[await ledger(each) for each in router.routers], key=lambda r: r.inserted_at)
    )
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
        "final_state": None,
        "datamodel": {},
    }
    # Without an address (create always_new), the first execution of the document.
    execution_id = named or next(
        (r.execution_id for r in rows if r.execution_id is not None and r.document == document),
        None,
    )
    if execution_id is None:
        return report
    storage = router.router_of_execution(execution_id).storage
    try:
        record = await storage.fetch_execution(execution_id)
    except ExecutionNotFound:
        return report
    state = await _state(storage, record)
    report.update(_where(record, state))
    if state is not None:
        report["datamodel"] = {
            name: encode(value)
            for name, value in sorted(state.datamodel.items())
            if not name.startswith("_")
        }
    return report


_Seen = tuple[object, ...]


def _seen(record: ExecutionRecord) -> _Seen:
    """What changes when a call stores an execution: a step moves its position (its
    counters at least) and its update time."""
    return (record.status, record.updated_at, record.position)


async def _executions(
    router: ShardedRouter,
    charts: Mapping[str, Machine],
    before: Mapping[str, _Seen],
    minted: Sequence[str],
) -> dict[str, Any]:
    """Every execution the run created or stepped, by id: those it created in order of
    creation, then the rest by id; each ``{"document", "status", "configuration",
    "final_state"}``."""
    records = {
        record.id: record
        for each in router.routers
        for record in await each.storage.list_executions()
    }
    order = {execution_id: index for index, execution_id in enumerate(minted)}
    touched = sorted(
        (r for r in records.values() if before.get(r.id) != _seen(r)),
        key=lambda r: (r.id in before, order.get(r.id, len(order)), r.id),
    )
    # A document's chart by content hash; two documents of one source share it, and
    # the first name (sorted) speaks for both.
    documents = {chart.identity.content_hash: name for name, chart in sorted(charts.items())[::-1]}
    described: dict[str, Any] = {}
    for record in touched:
        state = await _state(router.router_of_execution(record.id).storage, record)
        document = documents.get(record.content_hash)
        if document is None and state is not None:
            document = state.machine.name
        described[record.id] = {"document": document, **_where(record, state)}
    return described


async def _state(storage: Storage, record: ExecutionRecord) -> MachineState | None:
    """The execution's stored position, ``None`` once pruned."""
    if record.position is None:
        return None
    return storage.load(record, await storage.machine(record.content_hash))


def _where(record: ExecutionRecord, state: MachineState | None) -> dict[str, Any]:
    """``status``, ``configuration`` (the sorted active leaf states while it runs, else
    ``[]``) and ``final_state`` (the top-level final it ended in, else ``None``)."""
    running = state is not None and state.running and not record.status.terminal
    return {
        "status": record.status.value,
        "configuration": list(state.leaf_configuration()) if state is not None and running else [],
        "final_state": _final_state(state),
    }


def _final_state(state: MachineState | None) -> str | None:
    """The id of the top-level ``<final>`` a finished chart entered. Entering one ends
    the chart, so a position holds at most one among the states it ever entered; a
    cancelled or failed chart may hold none."""
    if state is None or state.running:
        return None
    nodes = state.machine.states
    # Index 0 is the root: a top-level state's parent.
    finals = (nodes[i] for i in sorted(state.entered) if i != 0 and nodes[i].parent == 0)
    return next((node.id for node in finals if node.kind == "final"), None)


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


def _require(setup: _Setup, documents: list[str]) -> None:
    source = setup.source
    for document in documents:
        if document in setup.charts:
            continue
        if isinstance(source, Deployment):
            raise CaseError(f"no chart for document {document!r} in {source.file}")
        raise CaseError(f"no chart for document {document!r}: no {source / document}.scxml")


def _data(event: Event) -> Any:
    """An event's data as tagged JSON (``null`` for a send with none)."""
    return encode(event.data)
