"""The ``statifier`` command.

Subcommands:

``statifier demo``
    Runs the main job on the embedded default (no server needed): a few expression
    rules against a sample event, a shipped example chart traced through an order's
    life, a card payment run as a durable execution on SQLite across two restarts
    (:mod:`statifier.examples.card_payment`), its inputs projected into a read
    model by scriba (:mod:`statifier.examples.payment_history`), and impressions and
    clicks from two sources routed to their joins (:mod:`statifier.examples.ad_join`);
    then the whole service, ``statifier serve`` on SQLite in this process, fed by a
    webhook, a form and a BasicHTTP post over loopback, firing a timer, draining its
    outbox and stopping as SIGTERM stops it (:mod:`statifier.examples.parcel_service`).

``statifier validate CHART... [--strict]``
    Checks charts (``-`` reads one from standard input, named ``<stdin>``). Prints one
    ``CHART:LINE:COLUMN: error|warning: message`` line per finding of
    :func:`statifier.chart.validation.check`, in source order: errors for what rejects
    the chart or is certain to raise ``error.execution`` when reached (an expression
    that does not parse, placed at the column inside the attribute where it fails);
    warnings for reads of datamodel variables nothing declares. A target naming no
    state suggests the closest id (``did you mean 'running'?``). Then ``CHART: ok`` for
    a chart that passes. Exits with 1 if any chart has an error (with ``--strict``, a
    warning too), 0 if only warnings, 2 if a file cannot be read.

``statifier trace CHART [--event NAME | --event NAME=JSON | --advance DURATION]...
[--json] [--trace] [--basichttp]``
    Starts the chart, delivers the events in order on a virtual clock (see
    :mod:`statifier.session.trace` for the order of delivery; ``--advance 4s`` lets
    time pass between two events, firing the timers due; ``src`` files are read beside
    the chart, confined to its directory; ``--basichttp`` serves and sends BasicHTTP
    events on loopback) and prints, after the
    start and after each event, the active leaf configuration (sorted) and the effects
    of the step. Text output: a ``start`` or ``event NAME`` line with the virtual time,
    a ``configuration:`` line, and one ``- KIND {fields}`` line per effect, among which,
    where they happened, ``! error.NAME {data}`` for each ``error.*`` event the chart
    took (its data says why) and ``! no transition took NAME`` for each other event
    (not ``done.*``) that no transition took. States are named by id, never by index
    (:func:`statifier.session.trace.effect_json`). With ``--json``: one document
    ``{"steps": [{"event": null|NAME, "configuration": [...], "effects": [...],
    "notices": [...]}, ...], "finished": true|false}``, a notice being ``{"notice":
    "error", "event", "data", "sendid", "invokeid", "before"}`` or ``{"notice":
    "no_transition", "event", "queue", "before"}`` (``before``: the index of the first
    effect after it). ``--trace`` adds trace effects.

``statifier graph CHART --format mermaid|dot``
    Prints the chart as a diagram.

``statifier db upgrade|downgrade [--url URL] [--prefix P] [--schema S] [--revision R] [--locks L]``
    Migrates the tables of durable executions (:mod:`statifier.sql.migrations`) up to
    ``R`` (default ``head``) or down to it (default ``base``: drops them). The default
    URL is a SQLite file in the working directory, ``statifier.db``; a bare
    ``postgresql://`` URL uses psycopg 3. It holds the migration lock that
    ``statifier serve`` and ``Durable(migrate=True)`` take too, so that any of them
    starting together migrate once (``--locks rows``, as the deployment's ``[database]
    locks``: the row of ``<prefix>migration_lock`` rather than the advisory lock).
    Prints the revision reached; a database that cannot be reached, a bad option, or
    another process holding the lock for five minutes prints a message and exits with 2.

``statifier executions list|show|create|send|cancel --database URL [--charts DIR]``
    Reads and drives durable executions through :class:`statifier.durable.Durable`
    (see :mod:`statifier.executions_command` and ``docs/durable.md``); never migrates.

``statifier scenario CASE.json --charts DIR | --config CONFIG.toml [--start ISO]
[--database URL | --shards K] [--prefix P]``
    Runs one routing case (bindings and a script of deliveries, clock moves and reaper
    passes; see :mod:`statifier.router.scenario`) on a virtual clock, against a freshly
    migrated database (a temporary SQLite file unless ``--database`` names one; with
    ``--shards K``, K temporary SQLite files under one
    :class:`~statifier.router.ShardedRouter`; tables under ``--prefix``, default
    ``statifier_``), and prints its report as one JSON
    document: the ledger, the case's execution, the sends, and the final state of every
    execution the case touched. With ``--config``, the charts, bindings, routes,
    ``on_complete`` and send type are a serve file's, read as ``statifier serve`` reads
    it (its ``*_env`` variables set), and the case names none of them; nothing the file
    names is opened. When the case carries ``expected``, prints one line per differing
    key on stderr and exits with 1; each send the scenario does not handle is such a
    line when ``expected`` has ``sends``, else a ``warning:`` line on stderr (the exit
    status unchanged). A case or serve file that cannot be read or run prints one line
    naming the file and exits with 2.

``statifier check CONFIG [--charts DIR] [--json]``
    Checks one chart against the router's publish-time contracts (see
    :mod:`statifier.check_command` and ``docs/contracts.md``): prints one
    ``FILE:LINE:COL: reason: event (document)`` line per finding and exits with 1, or
    ``FILE: ok`` and 0; input it cannot use prints one line naming the file and key and
    exits with 2.

``statifier replay --chart NEW.scxml --database URL [--document NAME] [--status S] ...``
    Replays recorded executions' input logs on their stored chart and on a revision of
    it, read-only, and prints where the revision would part from what they did (see
    :mod:`statifier.replay_command` and ``docs/replay.md``): 0 when every execution
    replayed the same, 1 when one did not (or could not be trusted), 2 for an error.

``statifier reshard --from URL... --to URL... [--prefix P] [--schema S] [--step N] [--dry-run]``
    Moves the rows of the buckets whose store changes when a deployment's stores
    (``--from``, in order) become others (``--to``), with every process that writes
    to them stopped (see :mod:`statifier.reshard_command` and ``docs/scaling.md``):
    0 when every range moved, 2 for an error, 130 when Ctrl-C interrupted it.

``statifier serve CONFIG.toml``
    Runs the service a configuration file names (see :mod:`statifier.service` and
    ``docs/serve.md``): the HTTP fronts and health endpoints (on ``127.0.0.1`` unless
    the file says otherwise), the stream consumers, the timer worker, the outbox drain
    and the reapers, in one process, until SIGTERM or SIGINT; then it stops intake,
    drains what is in flight and exits with 0 (1 when ``shutdown_timeout`` cut it
    short). A file it refuses prints one line naming the file, the table and the key,
    and exits with 2; so does a database that is not migrated (unless the file says
    ``migrate = true``).

``statifier console --database URL [--host H] [--port P] [--operator NAME:ROLE:ENV]...``
    Serves the operator console alone (see :mod:`statifier.console` and
    ``docs/console.md``) on ``127.0.0.1:8081`` unless told otherwise, until SIGTERM or
    SIGINT. Each ``--operator`` names an operator, its role (``operator`` or
    ``read_only``) and the environment variable holding its login token; without one
    the console listens on loopback only and prints a login token made for this start.
    Never migrates; options it refuses, or a database that is not migrated, print one
    line and exit with 2.

``statifier expr SOURCE [--context JSON] [--program] [--now DATETIME]``
    Evaluates one expression (or, with ``--program``, runs a statement program) and
    prints the result as JSON in the tagged encoding (``{"$type": "undefined"}`` and
    so on). An evaluation error is printed as ``{"error": {"type", "reason",
    "message", "line", "column"}}`` (and ``"code"``, the stable token, where it is not
    the reason: a failing function) and exits with 1; unusable arguments exit with 2.

Errors (every command): an error of the command itself is one line on stderr,
``statifier COMMAND: message``, and exit status 2: a missing extra names the extra to
install (``PostgreSQL needs the postgres extra: pip install 'statifier[postgres]'``), a
database without the tables says to run ``statifier db upgrade``, and an unexpected
exception is named with its type. ``statifier --debug COMMAND ...`` adds the traceback.
What a command reports as its finding keeps its own status (1 for ``validate``'s
errors, ``scenario``'s differences, ``check``'s findings, ``replay``'s divergences and
``expr``'s evaluation errors).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from statifier import (
    check_command,
    executions_command,
    expr,
    replay_command,
    reshard_command,
    schedules_command,
)
from statifier.chart import InvalidChart, Machine, compile_chart
from statifier.chart.graph import dot, mermaid
from statifier.core import Event
from statifier.examples import read as read_example
from statifier.expr.tagged import TaggedValueError, decode, encode
from statifier.extras import MissingExtra

if TYPE_CHECKING:
    from statifier.router.scenario import Deployment
    from statifier.session.trace import Notice, Step

__all__ = ["main"]


def _error_json(error: expr.ExprError) -> dict[str, object]:
    details: dict[str, object] = {
        "type": error.kind,
        "reason": error.reason,
        "message": error.message,
    }
    if error.code != error.reason:  # a failing function: the corpus's reason is its message
        details["code"] = error.code
    if error.span is not None:
        details["line"], details["column"] = error.span.line, error.span.column
    return {"error": details}


def _dump(data: object, out: TextIO) -> None:
    out.write(json.dumps(data, ensure_ascii=False) + "\n")


def _run_expr(args: argparse.Namespace, out: TextIO) -> int:
    try:
        raw = json.loads(args.context)
        if not isinstance(raw, dict):
            raise TaggedValueError("the context must be a JSON object")
        context = decode(raw)
    except (json.JSONDecodeError, TaggedValueError) as problem:
        sys.stderr.write(f"statifier expr: --context is not a usable JSON object: {problem}\n")
        return 2
    options = expr.Options()
    if args.now is not None:
        fixed = expr.parse_datetime(args.now)
        if fixed is None:
            sys.stderr.write("statifier expr: --now needs an ISO 8601 datetime with an offset\n")
            return 2
        options = expr.Options(clock=lambda: fixed)
    if args.program:
        execution = expr.execute(args.source, context, options)
        if isinstance(execution, expr.ParseError):
            _dump(_error_json(execution), out)
            return 1
        report: dict[str, object] = {
            "context": encode(execution.context),
            "value": encode(execution.value),
        }
        if execution.error is not None:
            report.update(_error_json(execution.error))
        _dump(report, out)
        return 1 if execution.error is not None else 0
    result = expr.evaluate(args.source, context, options)
    if isinstance(result, expr.ExprError):
        _dump(_error_json(result), out)
        return 1
    _dump(encode(result), out)
    return 0


_DEMO_EVENT = {
    "event": {
        "kind": "impression",
        "id": "ev_01",
        "parcel_id": 4711,
        "at": "2026-11-28T09:30:00Z",
        "tags": ["mobile", "eu"],
        "user": {"plan": "pro", "age": 34},
    }
}

_DEMO_RULES = (
    'event.kind == "impression" and len(event.id) > 0',
    "trim(event.parcel_id::string)",
    'event.user.plan in ["pro", "team"] and event.user.age >= 18',
    '"eu" in event.tags',
    "event.at::datetime > 3d ago",
    "event.user.missing",
    "event.user.age / 0",
)


def _run_demo(out: TextIO) -> int:
    out.write("statifier demo\n\n1. Expression rules against one event\n\n")
    out.write(f"event = {json.dumps(_DEMO_EVENT['event'])}\n\n")
    now = datetime.fromisoformat("2026-11-29T12:00:00+00:00")
    options = expr.Options(clock=lambda: now)
    for source in _DEMO_RULES:
        result = expr.evaluate(source, _DEMO_EVENT, options)
        shown = str(result) if isinstance(result, expr.ExprError) else json.dumps(encode(result))
        out.write(f"  {source}\n    => {shown}\n")
    program = "score = 0; if event.user.plan == 'pro' { score = score + 10 }; tier = score > 5"
    execution = expr.execute(program, _DEMO_EVENT, options)
    assert not isinstance(execution, expr.ParseError)
    out.write(f"\n  program: {program}\n")
    written = {name: execution.context[name] for name in ("score", "tier")}
    out.write(f"    => {json.dumps(encode(written))}\n")
    # Imported here, as in the commands that need them: the others start without the
    # session stack.
    import asyncio
    import tempfile

    from statifier.session.trace import run

    out.write("\n2. The shipped order chart (statifier/examples/order.scxml), traced\n\n")
    machine = compile_chart(read_example("order.scxml"), name="order")
    events = [
        Event("item.added", data={"sku": "tea", "price": 4}),
        Event("item.added", data={"sku": "cup", "price": 9}),
        Event("checkout"),
        Event("payment.failed"),
        Event("packed"),
    ]
    _print_steps(machine, run(machine, events), out)
    out.write("\n  (no payment arrived: the 30 minute timer fired on the virtual clock)\n")
    out.write("\n3. A card payment as a durable execution on SQLite, across two restarts\n\n")
    # Imported here: only the demo needs durable executions and projections (and the
    # projection needs the sql extra).
    from statifier.examples import ad_join, card_payment, payment_history

    with tempfile.TemporaryDirectory() as directory:
        database = Path(directory) / "payments.db"
        asyncio.run(card_payment.run_on_sqlite(database, out))
        out.write("\n4. Its inputs projected into a read model by scriba, exactly once\n\n")
        asyncio.run(payment_history.project(database, out))
        out.write("\n5. Impressions and clicks routed by impression id to their joins\n\n")
        asyncio.run(ad_join.run(f"sqlite:///{Path(directory) / 'ads.db'}", out))
        out.write("\n6. The whole service: statifier serve on SQLite, fed over loopback\n\n")
        from statifier.examples import parcel_service

        service_dir = Path(directory) / "service"
        service_dir.mkdir()
        return asyncio.run(parcel_service.run(service_dir, out))


def _print_steps(machine: Machine, steps: list[Step], out: TextIO) -> None:
    from statifier.session.trace import effect_json

    for step in steps:
        heading = "start" if step.event is None else f"event {step.event}"
        out.write(f"{heading}  [t={step.at_ms}ms]\n")
        out.write(f"  configuration: {', '.join(step.configuration)}\n")
        notices = list(step.notices)
        for position, effect in enumerate(step.effects):
            while notices and notices[0].before <= position:
                _print_notice(machine, notices.pop(0), out)
            data = effect_json(machine, effect)
            kind = data.pop("effect")
            for counter in ("macrostep", "microstep", "round"):
                data.pop(counter)
            out.write(f"  - {kind} {json.dumps(data, ensure_ascii=False, sort_keys=True)}\n")
        for notice in notices:
            _print_notice(machine, notice, out)
    if steps and steps[-1].finished:
        out.write("finished\n")


def _print_notice(machine: Machine, notice: Notice, out: TextIO) -> None:
    from statifier.session.trace import notice_json

    data = notice_json(machine, notice)
    if data["notice"] == "no_transition":
        out.write(f"  ! no transition took {data['event']}\n")
        return
    shown = data["data"]
    extra = {key: data[key] for key in ("sendid", "invokeid") if data[key] is not None}
    if isinstance(shown, dict):
        shown = {**extra, **shown}
    elif extra:
        shown = {**extra, "data": shown}
    out.write(f"  ! {data['event']} {json.dumps(shown, ensure_ascii=False, sort_keys=True)}\n")


@dataclass(frozen=True)
class _NotLoaded:
    """Why a chart file gave no chart: its exit status (2 unreadable, 1 invalid) and
    the lines that say so."""

    status: int
    message: str


def _load_chart(path: str) -> Machine | _NotLoaded:
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as error:
        return _NotLoaded(2, f"{path}: cannot read: {error.strerror}")
    try:
        return compile_chart(source)
    except InvalidChart as invalid:
        return _NotLoaded(1, "\n".join(f"{path}:{problem}" for problem in invalid.problems))


_STDIN_NAME = "<stdin>"


def _read_chart(path: str) -> bytes | str:
    """The chart's bytes (``-``: standard input), or why it cannot be read."""
    if path == "-":
        stream = sys.stdin
        buffer = getattr(stream, "buffer", None)
        return buffer.read() if buffer is not None else stream.read().encode("utf-8")
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        return f"cannot read: {error.strerror}"


def _run_validate(args: argparse.Namespace, out: TextIO) -> int:
    from statifier.chart.validation import check

    status = 0
    for path in args.charts:
        name = _STDIN_NAME if path == "-" else path
        source = _read_chart(path)
        if isinstance(source, str):
            # An unreadable file is an error of the command; findings are its answer.
            sys.stderr.write(f"{name}: {source}\n")
            status = 2
            continue
        findings = check(source)
        for finding in findings:
            out.write(finding.format(name) + "\n")
        if any(finding.severity == "error" or args.strict for finding in findings):
            status = max(status, 1)
        else:
            out.write(f"{name}: ok\n")
    return status


def _parse_event(text: str) -> Event:
    name, separator, payload = text.partition("=")
    if not name.strip():
        raise ValueError(f"an event needs a name: {text!r}")
    if not separator:
        return Event(name.strip())
    try:
        data = decode(json.loads(payload))
    except (json.JSONDecodeError, TaggedValueError) as error:
        raise ValueError(f"the data of event {name!r} is not JSON: {error}") from None
    return Event(name.strip(), data=data)


class _ScriptItem(argparse.Action):
    """``--event`` and ``--advance`` append ``(option kind, text)`` to one list, so the
    script keeps the order they were given in."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        script = list(getattr(namespace, self.dest, None) or [])
        script.append((self.const, values))
        setattr(namespace, self.dest, script)


def _run_trace(args: argparse.Namespace, out: TextIO) -> int:
    # Only tracing needs the session stack.
    from statifier.session.trace import (
        Advance,
        BesideChart,
        effect_json,
        notice_json,
        refused_invokes,
        run,
    )

    path = args.chart
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as error:
        sys.stderr.write(f"{path}: cannot read: {error.strerror}\n")
        return 2
    loader = BesideChart.of(path)  # every src is read beside the chart, and only there
    try:
        loaded = compile_chart(source, loader=loader)
    except InvalidChart as invalid:
        sys.stderr.write("".join(f"{path}:{problem}\n" for problem in invalid.problems))
        return 1
    refused = refused_invokes(loaded, loader)
    if refused:
        sys.stderr.write("".join(f"{path}:{problem}\n" for problem in refused))
        return 1
    script: list[Event | Advance] = []
    try:
        for kind, text in args.script:
            if kind == "event":
                script.append(_parse_event(text))
                continue
            duration = expr.parse_duration(text.strip())
            if duration is None:
                raise ValueError(
                    f"--advance needs a duration such as 4s, 1m30s or 250ms, not {text!r}"
                )
            script.append(Advance(duration.total_milliseconds()))
    except ValueError as error:
        sys.stderr.write(f"statifier trace: {error}\n")
        return 2
    location: list[str] = []

    def serving(url: str) -> None:
        location.append(url)
        if not args.json:
            out.write(f"serving BasicHTTP at {url}\n")

    try:
        steps = run(
            loaded,
            script,
            trace=args.trace,
            loader=loader,
            basichttp=args.basichttp,
            serving=serving,
        )
    except ModuleNotFoundError as error:
        if not isinstance(MissingExtra.of(error), MissingExtra):
            raise
        _debug_traceback(args)
        sys.stderr.write(f"statifier trace: --basichttp: {describe(error)}\n")
        return 2
    except OSError as error:
        if not args.basichttp:
            raise
        sys.stderr.write(f"statifier trace: BasicHTTP: {error}\n")
        return 2
    if args.json:
        document: dict[str, object] = {
            "steps": [
                {
                    "event": step.event,
                    "configuration": list(step.configuration),
                    "effects": [effect_json(loaded, effect) for effect in step.effects],
                    "notices": [notice_json(loaded, notice) for notice in step.notices],
                }
                for step in steps
            ],
            "finished": steps[-1].finished,
        }
        if location:
            document["basichttp"] = location[0]
        _dump(document, out)
    else:
        _print_steps(loaded, steps, out)
    return 0


def _run_graph(args: argparse.Namespace, out: TextIO) -> int:
    loaded = _load_chart(args.chart)
    if isinstance(loaded, _NotLoaded):
        sys.stderr.write(loaded.message + "\n")
        return loaded.status
    out.write((mermaid(loaded) if args.format == "mermaid" else dot(loaded)) + "\n")
    return 0


_DEFAULT_DATABASE = "sqlite:///statifier.db"


def _run_db(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: the migrations need the sql extra, the other commands do not.
    import sqlalchemy as sa

    from statifier.sql import TableOptions, migrations

    try:
        locks = executions_command.locks_of_args(args)
        options = TableOptions(prefix=args.prefix, schema=args.schema, locks=locks)
        if args.action == "upgrade":
            migrations.upgrade(args.url, options, args.revision or "head")
        else:
            migrations.downgrade(args.url, options, args.revision or "base")
        reached = migrations.current(args.url, options)
    except (ValueError, migrations.MigrationBusy, sa.exc.SQLAlchemyError) as error:
        _debug_traceback(args)
        sys.stderr.write(f"statifier db {args.action}: {describe(error)}\n")
        return 2
    out.write(f"{options.prefix}tables at revision {reached or 'base (none)'}\n")
    return 0


def _run_scenario(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: the router needs the sql extra, the other commands do not.
    import asyncio

    import sqlalchemy as sa

    from statifier.router import scenario

    where = f"statifier scenario: {args.case}"
    charts: Path | scenario.Deployment
    if args.config is None:
        charts = Path(args.charts)
    else:
        from statifier.service import ServiceConfigError

        try:
            charts = _deployment(args.config)
        except ServiceConfigError as error:  # its message names the file
            _debug_traceback(args)
            sys.stderr.write(f"statifier scenario: {_one_line(error)}\n")
            return 2
    try:
        case = scenario.Case.load(Path(args.case))
        start = None if args.start is None else scenario.parse_start(args.start)
        run = scenario.run_case(
            case, charts, args.database, start, prefix=args.prefix, shards=args.shards
        )
        report = asyncio.run(run)
    except scenario.CaseError as error:
        _debug_traceback(args)
        sys.stderr.write(f"{where}: {_one_line(error)}\n")
        return 2
    except (sa.exc.SQLAlchemyError, OSError) as error:
        _debug_traceback(args)
        sys.stderr.write(f"{where}: database: {describe(error)}\n")
        return 2
    _dump(report, out)
    differences = [] if case.expected is None else scenario.compare(report, case.expected)
    for line in [*scenario.warning_lines(report, case.expected), *differences]:
        sys.stderr.write(f"{where}: {line}\n")
    return 1 if differences else 0


def _deployment(path: str) -> Deployment:
    """What the serve file at ``path`` deploys, read by the service's own loader: its
    documents, and the bindings, routes (each with its configuration), ``on_complete``
    and send type of the router ``statifier serve`` would build from it.

    Raises:
        ServiceConfigError: the file is refused (the message names the file).
    """
    # Imported here: the service needs the http extra, the other commands do not.
    import asyncio

    from statifier.persistence.sql import SqlAdapter
    from statifier.router.scenario import Deployment
    from statifier.service import load, router_config

    settings = load(path)

    async def deployed() -> Deployment:
        # An in-memory adapter, never written: it only carries the router's
        # configuration, which is built as the service builds it.
        async with SqlAdapter("sqlite://") as adapter:
            router = router_config(settings, adapter)
        return Deployment(
            file=settings.file,
            documents=settings.documents,
            bindings=tuple(router.bindings or ()),
            send_type=router.send_type,
            routes={
                name: dict(found[1])
                for name in router.routes
                if (found := router.route(None, name)) is not None
            },
            on_complete=router.on_complete,
        )

    return asyncio.run(deployed())


def _run_serve(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: the service needs the sql and http extras, the others do not.
    import sqlalchemy as sa

    from statifier import service
    from statifier.sql.locks import LocksMismatch
    from statifier.sql.places import PlaceMismatch

    refusals = (service.ServiceConfigError, service.NotMigrated, LocksMismatch, PlaceMismatch)
    try:
        return service.serve(args.config, out)
    except (*refusals, OSError) as error:
        _debug_traceback(args)
        sys.stderr.write(f"statifier serve: {_one_line(error)}\n")
        return 2
    except sa.exc.SQLAlchemyError as error:
        _debug_traceback(args)
        sys.stderr.write(f"statifier serve: database: {describe(error)}\n")
        return 2


def _run_console(args: argparse.Namespace, out: TextIO) -> int:
    # Imported here: the console needs the sql, http and console extras.
    import os

    import sqlalchemy as sa

    from statifier.console import standalone

    try:
        key = None
        if args.session_key_env is not None:
            key = os.environ.get(args.session_key_env, "").encode("utf-8")
            if len(key) < 32:
                raise standalone.ConsoleRefused(
                    f"--session-key-env: {args.session_key_env} must hold at least 32 bytes"
                )
        options = standalone.StandaloneOptions(
            database=args.database,
            host=args.host,
            port=args.port,
            prefix=args.prefix,
            schema=args.schema,
            locks=executions_command.locks_of_args(args),
            operators=[standalone.parse_operator(o, os.environ) for o in args.operator],
            session_key=key,
            secure_cookie=args.secure_cookie,
            basichttp_base_url=args.basichttp_base_url,
            scriba_prefix=args.scriba_prefix,
            codec=executions_command.codec_of(args.keys_env),
        )
        return standalone.run(options, out)
    except (standalone.ConsoleRefused, OSError, ValueError) as error:  # ValueError: a key
        _debug_traceback(args)
        sys.stderr.write(f"statifier console: {_one_line(error)}\n")
        return 2
    except sa.exc.SQLAlchemyError as error:
        _debug_traceback(args)
        sys.stderr.write(f"statifier console: database: {describe(error)}\n")
        return 2


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def describe(error: BaseException) -> str:
    """One line saying what went wrong, in the user's words: the extra to install for
    a missing library, ``statifier db upgrade`` for a database without the tables,
    else the error's own message."""
    if isinstance(error, ModuleNotFoundError):
        named = MissingExtra.of(error)
        if isinstance(named, MissingExtra):
            return str(named)
    table = _missing_table(error)
    if table is not None:
        return (
            f"the database has no table {table}: run `statifier db upgrade` "
            "(with the same --url and --prefix) first"
        )
    return _one_line(error)


def _missing_table(error: BaseException) -> str | None:
    try:
        from statifier.sql.engines import TablesMissing, missing_table
    except ImportError:  # without the sql extra no database was opened
        return None
    if isinstance(error, TablesMissing):
        return error.table
    return missing_table(error)


def _debug_traceback(args: argparse.Namespace) -> None:
    if getattr(args, "debug", False):
        traceback.print_exc(file=sys.stderr)


def _unexpected(args: argparse.Namespace, error: Exception) -> int:
    """The one line (and, under ``--debug``, the traceback) for an exception no
    command handled; exit status 2."""
    _debug_traceback(args)
    command = " ".join(filter(None, (args.command, getattr(args, "action", None))))
    if isinstance(error, ModuleNotFoundError) or _missing_table(error) is not None:
        message = describe(error)
    else:
        hint = "" if args.debug else f" (statifier --debug {command} ... shows the traceback)"
        message = f"unexpected {type(error).__name__}: {_one_line(error)}{hint}"
    sys.stderr.write(f"statifier {command}: {message}\n")
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statifier", description=__doc__.split("\n\n")[0])
    from importlib.metadata import version  # the installed distribution's version

    parser.add_argument("--version", action="version", version=f"statifier {version('statifier')}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the demo on the embedded default (no server)")
    evaluate = commands.add_parser("expr", help="evaluate an expression and print it as JSON")
    evaluate.add_argument("source", help="the expression (or program, with --program)")
    evaluate.add_argument("--context", default="{}", help="the context as a JSON object")
    evaluate.add_argument("--program", action="store_true", help="run SOURCE as a program")
    evaluate.add_argument("--now", help="fix the clock (ISO 8601 datetime with an offset)")
    check = commands.add_parser("validate", help="check charts; report every problem")
    check.add_argument("charts", nargs="+", metavar="CHART", help="a chart file, or - for stdin")
    check.add_argument("--strict", action="store_true", help="fail on warnings too")
    trace = commands.add_parser("trace", help="run a chart through events and print each step")
    trace.add_argument("chart", metavar="CHART")
    trace.add_argument(
        "--event",
        action=_ScriptItem,
        const="event",
        dest="script",
        default=[],
        metavar="NAME[=JSON]",
        help="an event to deliver, with optional JSON data; repeat for more",
    )
    trace.add_argument(
        "--advance",
        action=_ScriptItem,
        const="advance",
        dest="script",
        metavar="DURATION",
        help="let virtual time pass here (4s, 1m30s, 250ms), firing the timers due",
    )
    trace.add_argument(
        "--basichttp",
        action="store_true",
        help="serve and send BasicHTTP events on 127.0.0.1 (needs the http extra)",
    )
    trace.add_argument("--json", action="store_true", help="print one JSON document")
    trace.add_argument("--trace", action="store_true", help="include trace effects")
    graph = commands.add_parser("graph", help="print a chart as a diagram")
    graph.add_argument("chart", metavar="CHART")
    graph.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")
    database = commands.add_parser("db", help="migrate the tables of durable executions")
    database.add_argument("action", choices=("upgrade", "downgrade"))
    database.add_argument("--url", default=_DEFAULT_DATABASE, help="the database URL")
    database.add_argument("--prefix", default="statifier_", help="the table name prefix")
    database.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    database.add_argument("--revision", default=None, help="head/base, or a revision id")
    executions_command.add_locks_option(database)
    routing = commands.add_parser("scenario", help="run a routing case and print its report")
    routing.add_argument("case", metavar="CASE.json")
    given = routing.add_mutually_exclusive_group(required=True)
    given.add_argument("--charts", metavar="DIR", help="DOCUMENT.scxml files")
    given.add_argument(
        "--config",
        metavar="CONFIG.toml",
        help="a serve file: its charts, bindings, routes and send type",
    )
    routing.add_argument("--start", default=None, help="the clock's start (ISO 8601 datetime)")
    routing.add_argument("--database", default=None, metavar="URL", help="default: temp SQLite")
    routing.add_argument(
        "--shards",
        type=int,
        default=1,
        metavar="K",
        help="run over K temporary SQLite files, by key buckets (default 1)",
    )
    routing.add_argument("--prefix", default="statifier_", help="the table name prefix")
    executions_command.add_parser(commands)
    schedules_command.add_parser(commands)
    check_command.add_parser(commands)
    replay_command.add_parser(commands)
    reshard_command.add_parser(commands)
    serving = commands.add_parser("serve", help="run the fronts, consumers and workers")
    serving.add_argument("config", metavar="CONFIG.toml", help="the service's configuration")
    console = commands.add_parser("console", help="serve the operator console in a browser")
    console.add_argument("--database", required=True, metavar="URL", help="the database URL")
    console.add_argument("--host", default="127.0.0.1", help="where to listen (127.0.0.1)")
    console.add_argument("--port", type=int, default=8081, help="the port (8081; 0: any free)")
    console.add_argument("--prefix", default="statifier_", help="the table name prefix")
    console.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    executions_command.add_locks_option(console)
    console.add_argument(
        "--operator",
        action="append",
        default=[],
        metavar="NAME:ROLE:ENV",
        help="an operator, its role (operator or read_only) and the variable of its token",
    )
    console.add_argument(
        "--session-key-env", default=None, metavar="ENV", help="the cookie key's variable"
    )
    console.add_argument("--secure-cookie", action="store_true", help="HTTPS-only cookie")
    console.add_argument(
        "--basichttp-base-url", default=None, metavar="URL", help="for rotating locations"
    )
    console.add_argument("--scriba-prefix", default=None, help="show scriba's projections")
    executions_command.add_keys_env(console)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status.

    An exception no command handles becomes one line on stderr naming the command
    and the error, and exit status 2 (with ``--debug``, after the traceback).
    """
    args = _parser().parse_args(argv)
    stream = out if out is not None else sys.stdout
    try:
        return _dispatch(args, stream)
    except Exception as error:  # noqa: BLE001 - every command's errors end in one line
        return _unexpected(args, error)


def _dispatch(args: argparse.Namespace, stream: TextIO) -> int:
    if args.command == "demo":
        return _run_demo(stream)
    if args.command == "validate":
        return _run_validate(args, stream)
    if args.command == "trace":
        return _run_trace(args, stream)
    if args.command == "graph":
        return _run_graph(args, stream)
    if args.command == "db":
        return _run_db(args, stream)
    if args.command == "scenario":
        return _run_scenario(args, stream)
    if args.command == "executions":
        return executions_command.run(args, stream)
    if args.command == "schedules":
        return schedules_command.run(args, stream)
    if args.command == "check":
        return check_command.run(args, stream)
    if args.command == "replay":
        return replay_command.run(args, stream)
    if args.command == "reshard":
        return reshard_command.run(args, stream)
    if args.command == "serve":
        return _run_serve(args, stream)
    if args.command == "console":
        return _run_console(args, stream)
    return _run_expr(args, stream)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
