"""``statifier executions``: durable executions from the shell, on
:class:`statifier.durable.Durable`.

``statifier executions list [--status S] [--chart NAME] [--where KEY=VALUE]... [--json]``
``statifier executions list [...] [--key K] [--scope S] [--final STATE] [--error NAME]``
    One line per execution, oldest first: id, status, chart, last update. ``--key``
    finds the executions an address key names (in ``--scope`` when given; ``--scope``
    alone, those addressed there), ``--final`` those that ended in that final state,
    ``--error`` those whose steps raised an error event of that name; each exact, at
    most :data:`~statifier.console.queries.MAX_SEARCH` characters, through the
    console's query (:class:`~statifier.console.queries.ExecutionFilter`).
``statifier executions show ID [--json]``
    The execution described: status, configuration or the final state it ended in,
    outcome, failure, metadata, times, the errors its steps raised, the input log, the
    pending timers.
``statifier executions create CHART --charts DIR [--id ID] [--data JSON] [--metadata KEY=VALUE]...``
    Starts an execution of ``DIR/CHART.scxml``; prints its id and where it is.
``statifier executions send ID EVENT[=JSON] [--json]``
    Steps one event in (with optional JSON data, as ``statifier trace --event``);
    prints whether a transition took it, where the execution is, every error the step
    raised, and the timers that wait for a worker.
``statifier executions cancel ID [--json]``
    Cancels an execution.
``statifier executions pause ID [--json]`` and ``statifier executions resume ID [--json]``
    Pause an active execution: what is sent to it and its timers that come due wait,
    in order; resume it: they are stepped in, oldest first, in one transaction, and
    every error their steps raised is printed, as ``send`` prints a step's.
``statifier executions bulk ACTION [--key K] [--scope S] [--status S] [...] [--yes]``
    ``ACTION`` is ``cancel``, ``pause``, ``resume``, ``retry`` (re-arm the dead outbox
    rows each execution sent) or ``migrate`` (onto the stored chart ``--revision HASH``,
    or onto ``--charts DIR``'s ``CHART.scxml`` for ``--chart CHART``; ``--map``,
    ``--remove`` and ``--data`` as ``migrate`` takes them). ``--chart NAME``,
    ``--final STATE`` and ``--error NAME`` search too.
    Acts on every execution the search selects (as ``list`` searches, through the
    console's query): prints how many it selects, asks to go on (or takes ``--yes``;
    without a terminal, ``--yes`` is needed), then acts on each in a transaction of its
    own with its audit row (actor ``cli:USER``), printing the progress after each
    page, and one row for the run (:mod:`statifier.console.bulk`). Run again after an
    interruption, it acts on what is left.
``statifier executions fire``
    Fires the timers due now, until none is (their steps' own due timers too), and
    prints how many.
``statifier executions run``
    Fires timers as they come due and drains the outbox (BasicHTTP sends), until
    interrupted: the workers ``statifier serve`` runs, without its fronts.
``statifier executions migrate CHART --charts DIR [--id ID] [--map OLD=NEW]... [--json]``
    Moves the executions of the chart named ``CHART`` that run an earlier revision
    (or only ``ID``) onto ``DIR/CHART.scxml``, by state id: ``--map`` names a renamed
    state, ``--remove OLD`` (repeatable) a state removed on purpose, ``--data JSON``
    values for variables the revision adds. Prints what moved and what was parked,
    with the reasons. Every earlier revision's plan is checked before anything moves:
    a map that fits none or only some of them is refused, nothing migrated. An error
    after some executions moved (another store's refusal, the database failing)
    prints, before it, what moved, was parked or failed until then.
``statifier executions export FILE [--chart NAME] [--status S] [--id ID]...``
    Writes the executions' input logs, each with the chart it ran and where it ended,
    to the JSON file ``FILE`` (:mod:`statifier.durable.export`), for a test suite to
    replay on a revision (``statifier.testing.assert_replays_same``); prints how many.

Every action takes ``--database URL`` (default ``sqlite:///statifier.db``, as
``statifier db upgrade``), ``--prefix P``, ``--schema S`` and ``--locks advisory|rows``
(the tables' options: ``--locks`` as the deployment's ``[database] locks``, since a
step must take the lock its services take),
``--charts DIR`` (``*.scxml`` files named by their stem; only ``create`` needs it), and
``--keys-env NAME`` (repeated, the newest first) for a database whose blobs are encrypted
with Fernet keys held by those environment variables. The command never migrates: a
database without the tables says to run ``statifier db upgrade``. Values print in the
tagged JSON encoding (:mod:`statifier.expr.tagged`).

Over executions spread over several stores by key buckets (``statifier serve``'s
``[database] shards``), ``--shard URL`` repeated (two or more, in that order) replaces
``--database``: an action on one execution opens the store of its id's bucket alone
(``create`` without ``--id`` mints the id first); ``list``, ``export``, ``fire``,
``run``, ``migrate`` of a chart and ``bulk`` act over every store and merge what they
print (``bulk`` asks once for the total, then runs store by store).

Exit status: 0 done; 1 when ``send`` or ``cancel`` was discarded (the execution had
ended or is parked: nothing changed, and the line says why), when ``pause`` found the
execution not active or ``resume`` found it not paused, when ``bulk`` was not
confirmed, failed on an execution or parked one (``migrate``), when ``send``,
``create`` or ``resume`` raised an error event no transition took (the step was
stored; the lines say which), when ``fire`` found timers still due after 100 passes
(a chart sending to itself without end), or ``migrate`` parked or failed to move an
execution; 2 for an error of the command, printed as one line, ``statifier
executions ACTION: message`` (with ``statifier --debug``, after the traceback); when
``migrate`` of a chart had moved, parked or failed executions before it, it prints
them first.

The ``statifier`` command wires it with :func:`add_parser` and :func:`run`;
``python -m statifier.executions_command executions ...`` runs it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import signal
import sqlite3
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO

from statifier.expr import UNDEFINED, Value, tagged

if TYPE_CHECKING:
    from statifier.console.bulk import BulkAction, BulkProgress
    from statifier.console.queries import ConsoleQueries, ExecutionFilter
    from statifier.durable import Description, Durable, ExecutionSummary
    from statifier.durable.values import PendingTimer
    from statifier.persistence import BlobCodec, MigrationSummary, StepError
    from statifier.persistence.sql import SqlAdapter

__all__ = ["DEFAULT_DATABASE", "add_parser", "main", "run"]

DEFAULT_DATABASE = "sqlite:///statifier.db"
"""The database when ``--database`` is not given: the one ``statifier db upgrade``
migrates by default."""

_DRIVER_ERRORS = ("sqlalchemy", "psycopg", "psycopg_pool")
_FIRE_PASSES = 100
"""The most passes ``fire`` makes over the timers due now."""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``executions`` to ``commands`` (what ``ArgumentParser.add_subparsers``
    returned) and return its parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database",
        "--url",
        dest="database",
        default=DEFAULT_DATABASE,
        metavar="URL",
        help=f"the database URL (default {DEFAULT_DATABASE})",
    )
    common.add_argument(
        "--shard",
        dest="shards",
        action="append",
        default=None,
        metavar="URL",
        help="a store of executions spread over several (repeat, in the order of the "
        "deployment's [database] shards; in place of --database)",
    )
    common.add_argument("--prefix", default=None, help="the table name prefix (statifier_)")
    common.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    add_locks_option(common)
    common.add_argument("--charts", default=None, metavar="DIR", help="DIR/NAME.scxml charts")
    add_keys_env(common)
    executions = commands.add_parser(
        "executions",
        help="list, show, create, send to, pause, resume, cancel and migrate durable executions",
    )
    actions = executions.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="list executions, oldest first")
    listing.add_argument("--status", default=None, help="only executions in this status")
    listing.add_argument("--chart", default=None, help="only executions of this chart")
    listing.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only executions whose metadata holds the pair; repeat for more",
    )
    listing.add_argument("--key", default=None, help="only executions an address key names")
    listing.add_argument("--scope", default=None, help="only executions addressed in this scope")
    listing.add_argument(
        "--final", default=None, metavar="STATE", help="only executions that ended in STATE"
    )
    listing.add_argument(
        "--error", default=None, metavar="NAME", help="only executions whose steps raised NAME"
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    show = actions.add_parser("show", parents=[common], help="describe one execution")
    show.add_argument("execution_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print one JSON document")
    create = actions.add_parser("create", parents=[common], help="start an execution")
    create.add_argument("chart", metavar="CHART", help="the chart's name (DIR/CHART.scxml)")
    create.add_argument("--id", dest="execution_id", default=None, help="default: ex_ + ULID")
    create.add_argument("--data", default=None, metavar="JSON", help="initial datamodel values")
    create.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a metadata pair; repeat for more",
    )
    create.add_argument("--json", action="store_true", help="print one JSON document")
    send = actions.add_parser("send", parents=[common], help="step one event in")
    send.add_argument("execution_id", metavar="ID")
    send.add_argument("event", metavar="EVENT[=JSON]", help="the event, with optional JSON data")
    send.add_argument("--json", action="store_true", help="print one JSON document")
    migrate = actions.add_parser(
        "migrate", parents=[common], help="move executions onto a new revision of their chart"
    )
    migrate.add_argument("chart", metavar="CHART", help="the chart's name (DIR/CHART.scxml)")
    migrate.add_argument("--id", dest="execution_id", default=None, help="only this execution")
    _plan_arguments(migrate)
    migrate.add_argument("--json", action="store_true", help="print one JSON document")
    cancel = actions.add_parser("cancel", parents=[common], help="cancel an execution")
    cancel.add_argument("execution_id", metavar="ID")
    cancel.add_argument("--json", action="store_true", help="print one JSON document")
    bulk = actions.add_parser(
        "bulk",
        parents=[common],
        help="cancel, pause, resume, migrate or retry every execution a search selects",
    )
    bulk.add_argument(
        "bulk_action",
        metavar="ACTION",
        choices=("cancel", "pause", "resume", "retry", "migrate"),
        help="cancel, pause, resume, retry (the dead outbox rows) or migrate",
    )
    bulk.add_argument(
        "--revision",
        default=None,
        metavar="HASH",
        help="migrate: onto the stored chart of this content hash "
        "(else onto --charts DIR/CHART.scxml, CHART the --chart searched)",
    )
    _plan_arguments(bulk)
    bulk.add_argument("--key", default=None, help="executions an address key names")
    bulk.add_argument("--scope", default=None, help="executions addressed in this scope")
    bulk.add_argument("--status", default=None, help="executions in this status")
    bulk.add_argument("--chart", default=None, help="executions of this chart")
    bulk.add_argument("--final", default=None, help="executions that ended in this state")
    bulk.add_argument("--error", default=None, help="executions that raised this error")
    bulk.add_argument("--yes", action="store_true", help="act without asking")
    pause = actions.add_parser(
        "pause", parents=[common], help="pause an execution: what is sent to it waits"
    )
    pause.add_argument("execution_id", metavar="ID")
    pause.add_argument("--json", action="store_true", help="print one JSON document")
    resume = actions.add_parser(
        "resume", parents=[common], help="resume a paused execution, stepping in what waited"
    )
    resume.add_argument("execution_id", metavar="ID")
    resume.add_argument("--json", action="store_true", help="print one JSON document")
    export = actions.add_parser(
        "export", parents=[common], help="write executions' input logs to a JSON file"
    )
    export.add_argument("file", metavar="FILE", help="the JSON file to write (replaced)")
    export.add_argument("--chart", default=None, help="only executions of this chart")
    export.add_argument("--status", default=None, help="only executions in this status")
    export.add_argument(
        "--id",
        dest="execution_ids",
        action="append",
        default=None,
        metavar="ID",
        help="only this execution; repeat for more",
    )
    actions.add_parser("fire", parents=[common], help="fire the timers due now, and exit")
    actions.add_parser(
        "run", parents=[common], help="fire timers and drain the outbox until interrupted"
    )
    return executions  # type: ignore[no-any-return]


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``statifier executions ACTION``; returns the exit status."""
    return run_refusing(f"executions {args.action}", args, lambda: _run(args, out))


def run_refusing(
    command: str, args: argparse.Namespace, work: Callable[[], Coroutine[Any, Any, int]]
) -> int:
    """Run ``work()`` to its exit status; what a command on a database refuses
    (not migrated, a library error, bad input, the database failing) is said in one
    line by :func:`refused`, exit status 2. Anything else raises."""
    from statifier.core.positions import PositionError
    from statifier.durable import DurableError, NotMigrated
    from statifier.extras import MissingExtra
    from statifier.persistence import PersistenceError

    try:
        return asyncio.run(work())
    except NotMigrated as error:  # the command never migrates: one remedy
        return refused(command, args, f"{error.finding}: run `{error.upgrade}` first")
    except (DurableError, PersistenceError, ValueError, TypeError, MissingExtra) as error:
        return refused(command, args, str(error))
    except PositionError as error:  # a stored blob is not what it should be
        keys = getattr(args, "keys_env", None)
        hint = "" if keys else " (if its blobs are encrypted, give --keys-env)"
        return refused(command, args, f"{error}{hint}")
    except _StoreFailed as failed:
        return refused(command, args, f"{failed}: database: {_one_line(failed.error)}")
    except Exception as error:
        if not _database_error(error):
            raise
        return refused(command, args, f"database: {_one_line(error)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m statifier.executions_command executions ...``."""
    parser = argparse.ArgumentParser(prog="statifier")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(argv), sys.stdout)


def _codec(args: argparse.Namespace) -> BlobCodec:
    return codec_of(args.keys_env)


def add_keys_env(parser: argparse.ArgumentParser) -> None:
    """The ``--keys-env NAME`` option (repeated, the newest first) of every command that
    reads blobs a database may hold encrypted; :func:`codec_of` reads it."""
    parser.add_argument(
        "--keys-env",
        dest="keys_env",
        action="append",
        default=None,
        metavar="NAME",
        help="an environment variable holding a Fernet key the blobs are encrypted with "
        "(repeat, the newest first; the crypto extra)",
    )


def add_locks_option(parser: argparse.ArgumentParser) -> None:
    """The ``--locks advisory|rows`` option of every command that writes executions: it
    must take the locks the deployment's services take (their ``[database] locks``),
    or the two would not exclude each other; :func:`locks_of_args` reads it."""
    parser.add_argument(
        "--locks",
        choices=("advisory", "rows"),
        default="advisory",
        help="how the deployment holds its PostgreSQL locks: its [database] locks (advisory)",
    )


def locks_of_args(args: argparse.Namespace) -> Literal["advisory", "rows"]:
    """What ``--locks`` says (:func:`add_locks_option`)."""
    return "rows" if args.locks == "rows" else "advisory"


def codec_of(keys_env: Sequence[str] | None) -> BlobCodec:
    """The Fernet codec of the key variables ``keys_env`` (``--keys-env``, the newest
    first), or :data:`PLAIN` without any.

    Raises:
        FernetKeyError: (a ``ValueError``) a variable unset, or not a key.
        MissingExtra: the crypto extra is not installed.
    """
    from statifier.persistence import PLAIN

    if not keys_env:
        return PLAIN
    from statifier.persistence.fernet import FernetCodec

    return FernetCodec.from_env(keys_env)


# The actions.


_ONE_EXECUTION = frozenset({"show", "create", "send", "pause", "resume", "cancel"})
"""The actions on one execution (``migrate --id`` too): they open its store alone."""


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    if args.action in ("create", "migrate") and args.charts is None:
        raise ValueError(f"{args.action} needs --charts DIR (DIR/CHART.scxml is the chart)")
    urls = _stores(args)
    if args.action in _ONE_EXECUTION or (args.action == "migrate" and args.execution_id):
        if args.execution_id is None and len(urls) > 1:  # create: the id chooses the store
            from statifier.ids import new_execution_id

            args = argparse.Namespace(**{**vars(args), "execution_id": new_execution_id()})
        number = 0 if args.execution_id is None else _store_of(args.execution_id, len(urls))
        async with _in_store(number, len(urls)), _durable(urls[number], args) as durable:
            return await _on_one(durable, args, out)
    async with contextlib.AsyncExitStack() as opened:
        durables = []
        for number, url in enumerate(urls):
            async with _in_store(number, len(urls)):
                durables.append(await opened.enter_async_context(_durable(url, args)))
        return await _on_all(durables, args, out)


class _StoreFailed(Exception):  # noqa: N818 - names the finding
    """A database error of one store of several (``--shard``): ``run_refusing`` names
    the store, then the error."""

    def __init__(self, number: int, count: int, error: BaseException) -> None:
        super().__init__(f"store {number} of {count} (--shard number {number + 1})")
        self.error = error


@contextlib.asynccontextmanager
async def _in_store(number: int, count: int) -> AsyncIterator[None]:
    """A database error inside, of store ``number`` of ``count``, raised as
    :class:`_StoreFailed` when there are several stores."""
    try:
        yield
    except Exception as error:
        if count < 2 or not _database_error(error):
            raise
        raise _StoreFailed(number, count, error) from error


def _database_error(error: BaseException) -> bool:
    """Whether ``error`` is the database's (its driver's, SQLAlchemy's, sqlite3's), or
    says that a table is missing from it."""
    from statifier.sql.engines import TablesMissing

    return isinstance(error, sqlite3.Error | TablesMissing) or (
        type(error).__module__.partition(".")[0] in _DRIVER_ERRORS
    )


def _stores(args: argparse.Namespace) -> list[str]:
    """The database ``--database`` names, or the stores of executions spread over
    several by key buckets that ``--shard`` names, in their order: the order of
    :class:`~statifier.persistence.shards.ShardedAdapter`'s and ``statifier serve``'s
    ``[database] shards`` (even ranges)."""
    if args.shards is None:
        return [args.database]
    if args.database != DEFAULT_DATABASE:
        raise ValueError("give --database or --shard, not both")
    if len(args.shards) < 2:
        raise ValueError("--shard names each store of several: give two or more")
    return list(args.shards)


def _store_of(execution_id: str, stores: int) -> int:
    """The number of the store of ``stores`` that holds ``execution_id``."""
    from statifier.persistence.shards import ShardMap

    return ShardMap.even(stores).store_of_id(execution_id)


def _durable(database: str, args: argparse.Namespace) -> Durable:
    from statifier.durable import Durable
    from statifier.sql import TableOptions
    from statifier.sql.tables import DEFAULT_PREFIX

    tables = TableOptions(
        prefix=args.prefix or DEFAULT_PREFIX, schema=args.schema, locks=locks_of_args(args)
    )
    return Durable(database, charts=args.charts, tables=tables, codec=_codec(args))


async def _on_one(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    """An action on one execution, in the store ``durable`` opened."""
    if args.action == "show":
        description = await durable.describe(args.execution_id)
        _print_description(description, args.json, out)
        return 0
    if args.action == "create":
        data = None if args.data is None else _json_object(args.data, "--data")
        metadata = _pairs(args.metadata, "--metadata")
        created = await durable.create(args.chart, args.execution_id, data=data, metadata=metadata)
        if args.json:
            _dump(created.as_json(), out)
        else:
            out.write(f"{created.id}: created, {_where(created.status.value, created)}\n")
            _write_errors(created.errors, out)
        return 1 if _untaken(created.errors) else 0
    if args.action == "send":
        return await _send(durable, args, out)
    if args.action == "migrate":
        return await _migrate_one(durable, args, out)
    if args.action == "pause":
        return await _pause(durable, args, out)
    if args.action == "resume":
        return await _resume(durable, args, out)
    return await _cancel(durable, args, out)


async def _on_all(durables: Sequence[Durable], args: argparse.Namespace, out: TextIO) -> int:
    """An action over every store ``durables`` opened (one, or each of several), what
    it prints merged: a list, an export, the timers due, the workers, a bulk action,
    the migration of a chart."""
    if args.action == "list":
        return await _list(durables, args, out)
    if args.action == "export":
        return await _export(durables, args, out)
    if args.action == "fire":
        return await _fire(durables, out)
    if args.action == "run":
        return await _run_workers(durables, out)
    if args.action == "bulk":
        return await _bulk(durables, args, out)
    return await _migrate_all(durables, args, out)


async def _list(durables: Sequence[Durable], args: argparse.Namespace, out: TextIO) -> int:
    pairs = _pairs(args.where, "--where")
    searched = (args.key, args.scope, args.final, args.error)
    found: list[ExecutionSummary] = []
    for number, durable in enumerate(durables):
        async with _in_store(number, len(durables)):
            if any(value is not None for value in searched):
                found.extend(await _searched(durable, args, pairs))
            else:
                found.extend(await durable.list(args.status, chart=args.chart, **pairs))
    # Every store's, oldest first, as one store's list orders them.
    rows = sorted(found, key=lambda r: (r.created_at is None, r.created_at, r.id))
    if args.json:
        _dump([row.as_json() for row in rows], out)
        return 0
    if not rows:
        out.write("no executions\n")
        return 0
    table = [("ID", "STATUS", "CHART", "ERRORS", "UPDATED")]
    for row in rows:
        updated = "-" if row.updated_at is None else row.updated_at.isoformat(timespec="seconds")
        status = row.status.value
        if row.final_state is not None:
            status = f"{status} in {row.final_state}"
        table.append((row.id, status, row.chart or "-", str(row.error_count), updated))
    widths = [max(len(line[column]) for line in table) for column in range(4)]
    for line in table:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.write("  ".join([*cells, line[4]]) + "\n")
    return 0


async def _searched(
    durable: Durable, args: argparse.Namespace, pairs: dict[str, str]
) -> tuple[ExecutionSummary, ...]:
    """The executions the console's list finds for the search options, every page of
    it, oldest first, as :meth:`Durable.list` answers them."""
    from statifier.console.queries import MAX_PAGE, ConsoleQueries, ExecutionFilter
    from statifier.console.queries import ExecutionSummary as ConsoleSummary
    from statifier.durable import ExecutionSummary
    from statifier.durable.values import CHART_KEY, status_named
    from statifier.persistence.sql import SqlAdapter

    adapter = durable.executions.storage.adapter
    if not isinstance(adapter, SqlAdapter):  # the command opens a database URL
        raise TypeError("--key, --scope, --final and --error search a SQL database")
    # The status is read as Durable.list reads it (the same refusal).
    status = None if args.status is None else status_named(args.status)
    if args.chart is not None:
        pairs = {**pairs, CHART_KEY: args.chart}  # as Durable.list chooses a chart
    where = ExecutionFilter(
        status=status,
        metadata=pairs,
        key=args.key,
        scope=args.scope,
        final_state=args.final,
        error=args.error,
    )
    queries = ConsoleQueries(adapter.engine, adapter.tables, codec=_codec(args))
    found: list[ConsoleSummary] = []
    cursor = None
    while True:
        page = await queries.executions(where, cursor=cursor, size=MAX_PAGE)
        found.extend(page.rows)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    return tuple(
        ExecutionSummary(
            id=row.id,
            chart=row.metadata.get(CHART_KEY) or row.document,
            status=row.status,
            failure=row.failure,
            metadata={k: v for k, v in row.metadata.items() if k != CHART_KEY},
            created_at=row.created_at,
            updated_at=row.updated_at,
            ended_at=row.ended_at,
            final_state=row.final_state,
            error_count=row.error_count,
            last_error_at=row.last_error_at,
        )
        for row in reversed(found)
    )


async def _send(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    name, data = _event(args.event)
    sent = await durable.send(args.execution_id, name, data)
    if args.json:
        _dump(sent.as_json(), out)
        return 0 if (sent.delivered or sent.held) and not _untaken(sent.errors) else 1
    status = sent.status.value
    if sent.held:
        held = "held: the execution is paused; it is stepped in on resume"
        out.write(f"{sent.execution_id}: {name} {held}\n")
        return 0
    if not sent.delivered:
        why = "is parked (needs_migration)" if status == "needs_migration" else f"has {status}"
        out.write(
            f"{sent.execution_id}: {name} discarded: the execution {why}; nothing was recorded\n"
        )
        return 1
    if sent.matched:
        out.write(f"{sent.execution_id}: {name} taken; {_where(status, sent)}\n")
    else:
        out.write(
            f"{sent.execution_id}: no transition took {name} (it is in the input log); "
            f"{_where(status, sent)}\n"
        )
    if sent.failure is not None:
        out.write(f"  failure: {sent.failure}\n")
    _write_errors(sent.errors, out)
    for timer in sent.timers:
        out.write(f"  timer: {_timer(timer)}\n")
    for notice in sent.notices:
        out.write(f"  note: {notice}\n")
    return 1 if _untaken(sent.errors) else 0


async def _export(durables: Sequence[Durable], args: argparse.Namespace, out: TextIO) -> int:
    from statifier.durable.export import FORMAT, VERSION, input_logs_json, write_input_logs

    if args.execution_ids is not None and (args.chart or args.status):
        raise ValueError("--id names the executions: give it without --chart and --status")
    ids_in: list[list[str] | None] = [None] * len(durables)
    if args.execution_ids is not None:
        grouped: list[list[str]] = [[] for _ in durables]
        for execution_id in args.execution_ids:
            grouped[_store_of(execution_id, len(durables))].append(execution_id)
        ids_in = list(grouped)
    charts: dict[str, Any] = {}
    executions: list[Any] = []
    for number, (durable, ids) in enumerate(zip(durables, ids_in, strict=True)):
        if ids == []:
            continue
        async with _in_store(number, len(durables)):
            part = await input_logs_json(
                durable, chart=args.chart, status=args.status, execution_ids=ids
            )
        charts.update(part["charts"])
        executions.extend(part["executions"])
    document = {"format": FORMAT, "version": VERSION, "charts": charts, "executions": executions}
    try:
        count = await write_input_logs(document, args.file)
    except OSError as error:
        raise ValueError(f"{args.file}: cannot write: {error.strerror}") from None
    out.write(f"{count} execution{'s' if count != 1 else ''} exported to {args.file}\n")
    return 0


async def _fire(durables: Sequence[Durable], out: TextIO) -> int:
    fired = failed = 0
    # A fired timer's step may schedule another, due at once: pass again until none is
    # due, but not for ever (a chart may send to itself in an endless loop). A failed
    # fire is due again only seconds later, so it does not make another pass.
    for _ in range(_FIRE_PASSES):
        passes = []
        for number, durable in enumerate(durables):
            async with _in_store(number, len(durables)):
                passes.append(await durable.fire_pass())
        taken = sum(done.taken for done in passes)
        failed += sum(done.failed for done in passes)
        if not taken:
            break
        fired += taken
    else:
        out.write(
            f"{fired} timers fired; more are still due after {_FIRE_PASSES} passes "
            "(a chart sending to itself without end?): run `statifier executions run`\n"
        )
        return 1
    out.write(f"{fired} timer{'s' if fired != 1 else ''} fired\n")
    if failed:
        out.write(
            f"{failed} fire{'s' if failed != 1 else ''} failed (the warnings above say "
            "why); the timers stay, due again in a few seconds\n"
        )
        return 1
    return 0


async def _run_workers(durables: Sequence[Durable], out: TextIO) -> int:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    out.write("firing timers and draining the outbox; interrupt to stop\n")
    out.flush()

    async def run(number: int, durable: Durable) -> None:
        async with _in_store(number, len(durables)):
            await durable.run(stop)

    runs = [asyncio.ensure_future(run(n, durable)) for n, durable in enumerate(durables)]
    try:
        await asyncio.gather(*runs)
    finally:
        # One store's workers failing stops the others' too, before their stores close.
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    out.write("stopped\n")
    return 0


async def _bulk(durables: Sequence[Durable], args: argparse.Namespace, out: TextIO) -> int:
    """``bulk`` on every store of ``durables``: one count and one confirmation of the
    total, then a recorded run in each store (its own run row and audit rows). The
    status is 1 when an execution's action failed, a migration parked one, or a resumed
    one's held events raised an error event no transition took (as ``resume`` of it
    would answer 1); 130 or 143 when SIGINT or SIGTERM stopped it."""
    from statifier.console.bulk import bulk_action, counts, migration, preview
    from statifier.console.queries import ConsoleQueries, ExecutionFilter
    from statifier.durable.values import status_named
    from statifier.persistence import ChartNotFound
    from statifier.persistence.sql import SqlAdapter

    if args.bulk_action != "migrate":
        action = bulk_action(args.bulk_action)
    else:
        state_map, data = _plan(args)
        if args.revision is not None:
            target = None
            for number, durable in enumerate(durables):  # saved where an execution ran it
                with contextlib.suppress(ChartNotFound):
                    async with _in_store(number, len(durables)):
                        target = await durable.executions.storage.machine(args.revision)
                    break
            if target is None:
                raise ValueError(f"no chart of content hash {args.revision!r} is stored")
        elif args.charts is not None and args.chart is not None:
            target = durables[0].chart(args.chart)
        else:
            raise ValueError("migrate needs --revision HASH, or --charts DIR with --chart NAME")
        action = migration(target, state_map=state_map, data=data)
    where = ExecutionFilter(
        status=None if args.status is None else status_named(args.status),
        document=args.chart,
        key=args.key,
        scope=args.scope,
        final_state=args.final,
        error=args.error,
    )
    stores: list[tuple[Durable, SqlAdapter, ConsoleQueries, int]] = []
    for number, durable in enumerate(durables):
        adapter = durable.executions.storage.adapter
        if not isinstance(adapter, SqlAdapter) or durable.router is None:  # a URL's
            raise TypeError("bulk actions act on a SQL database")
        queries = ConsoleQueries(adapter.engine, adapter.tables, codec=_codec(args))
        async with _in_store(number, len(durables)):
            stores.append((durable, adapter, queries, await preview(queries, action, where)))
    selected = sum(count for *_, count in stores)
    out.write(f"{selected} executions selected to {action.said}\n")
    if selected == 0:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise ValueError(f"confirm with --yes to {action.said}: {selected} executions")
        out.flush()
        # The terminal's answer: nothing else runs on this loop meanwhile.
        question = f"{action.said}: {selected} executions? [y/N] "
        answer = await asyncio.to_thread(input, question)
        if answer.strip().lower() not in ("y", "yes"):
            out.write("nothing done\n")
            return 1

    async def said(progress: BulkProgress) -> None:
        out.write(f"  {progress.seen} seen: {counts(progress)}\n")
        out.flush()

    actor = f"cli:{getpass.getuser()}"
    stopped = _Stopping()
    with stopped.on_signals():
        try:
            return await _bulk_runs(stores, action, where, actor, said, out)
        except asyncio.CancelledError:
            if stopped.by is None:
                raise
            out.write(
                f"{action.name}: stopped by {stopped.by.name}: what was done is recorded "
                "in its run (its executions' rows say so too); run the same command again "
                "to do the rest (what was done is not selected again)\n"
            )
            return 128 + int(stopped.by)


class _Stopping:
    """SIGINT and SIGTERM cancel the task that runs the bulk runs: the run under way
    records its end (``stopped``, its counts) before the command says so."""

    def __init__(self) -> None:
        self.by: signal.Signals | None = None

    @contextmanager
    def on_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None  # run in asyncio.run

        def stop(signum: signal.Signals) -> None:
            if self.by is None:
                self.by = signum
                task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop, signum)
        try:
            yield
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            if self.by is not None:
                task.uncancel()


async def _bulk_runs(
    stores: Sequence[tuple[Durable, SqlAdapter, ConsoleQueries, int]],
    action: BulkAction,
    where: ExecutionFilter,
    actor: str,
    said: Callable[[BulkProgress], Awaitable[None]],
    out: TextIO,
) -> int:
    """A recorded run of ``action`` over ``where`` in each store that holds some of
    its executions, said on ``out``; the exit status (see :func:`_bulk`)."""
    from statifier.console.audit import Audit
    from statifier.console.bulk import counts
    from statifier.console.bulk_runs import BulkLog, run_recorded

    status = 0
    for number, (durable, adapter, queries, count) in enumerate(stores):
        router = durable.router
        assert router is not None  # checked above
        if count == 0:
            continue
        audit = Audit(adapter.engine, adapter.tables)
        log = BulkLog(adapter.engine, adapter.tables)
        run_id = uuid.uuid4().hex
        now = router.storage.clock()
        in_store = f" in store {number}" if len(stores) > 1 else ""
        async with _in_store(number, len(stores)):
            await log.start(run_id, action, where, actor=actor, selected=count, now=now)
            out.write(f"bulk run {run_id}{in_store}\n")
            done = await run_recorded(
                router,
                queries,
                audit,
                log,
                run_id,
                action,
                where,
                actor=actor,
                selected=count,
                progress=said,
            )
        out.write(f"{action.name}{in_store}: {counts(done)} (audited as {actor})\n")
        if done.last_error is not None:
            out.write(f"  last failure: {done.last_error}\n")
        if done.last_raised_error is not None:
            out.write(
                f"  last error raised: {done.last_raised_error}; "
                "each is among its execution's errors (`show ID`)\n"
            )
        if done.failed or done.parked or done.raised_errors:
            status = 1
    return status


async def _pause(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    paused = await durable.pause(args.execution_id)
    status = (await durable.describe(args.execution_id)).status.value
    if args.json:
        _dump({"execution_id": args.execution_id, "paused": paused, "status": status}, out)
    elif paused:
        out.write(f"{args.execution_id}: paused; what is sent to it waits for the resume\n")
    else:
        out.write(
            f"{args.execution_id}: not paused: it is not active ({status}); nothing changed\n"
        )
    return 0 if paused else 1


async def _resume(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    resumed = await durable.resume(args.execution_id)
    if resumed is None:
        status = (await durable.describe(args.execution_id)).status.value
        if args.json:
            _dump({"execution_id": args.execution_id, "resumed": False, "status": status}, out)
        else:
            out.write(f"{args.execution_id}: not resumed: it is not paused ({status})\n")
        return 1
    if args.json:
        _dump(
            {
                "execution_id": resumed.execution_id,
                "resumed": True,
                "stepped": resumed.stepped,
                "discarded": resumed.discarded,
                "status": resumed.status.value,
                "errors": [error.as_json() for error in resumed.errors],
            },
            out,
        )
    else:
        said = f"{resumed.execution_id}: resumed; {resumed.stepped} held events stepped in"
        if resumed.discarded:
            said += f", {resumed.discarded} discarded (it ended first)"
        out.write(f"{said}; {resumed.status.value}\n")
        _write_errors(resumed.errors, out)
    # As a send of the same events: an error event no transition took is exit 1.
    return 1 if _untaken(resumed.errors) else 0


async def _cancel(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    cancelled = await durable.cancel(args.execution_id)
    if args.json:
        _dump(
            {
                "execution_id": cancelled.execution_id,
                "cancelled": cancelled.cancelled,
                "status": cancelled.status.value,
            },
            out,
        )
    elif cancelled.cancelled:
        out.write(f"{cancelled.execution_id}: cancelled\n")
    else:
        out.write(
            f"{cancelled.execution_id}: not cancelled: it had already ended "
            f"({cancelled.status.value}); nothing changed\n"
        )
    return 0 if cancelled.cancelled else 1


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    """A migration plan's options: ``--map``, ``--remove``, ``--data``."""
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="state OLD was renamed NEW; repeat for more",
    )
    parser.add_argument(
        "--remove",
        action="append",
        default=[],
        metavar="OLD",
        help="state OLD was removed on purpose (its executions are parked); repeat for more",
    )
    parser.add_argument(
        "--data", default=None, metavar="JSON", help="values for variables the revision adds"
    )


def _plan(args: argparse.Namespace) -> tuple[dict[str, str | None], dict[str, Value]]:
    """The plan's state map and data from :func:`_plan_arguments`' options."""
    state_map: dict[str, str | None] = dict(_pairs(args.map, "--map"))
    for old in args.remove:
        state_map[old] = None
    data = {} if args.data is None else _json_object(args.data, "--data")
    return state_map, data


async def _migrate_one(durable: Durable, args: argparse.Namespace, out: TextIO) -> int:
    state_map, data = _plan(args)
    durable.chart(args.chart)  # the name must be one of the charts given
    moved = await durable.migrate(args.execution_id, state_map=state_map, data=data)
    if args.json:
        _dump(moved.as_json(), out)
    elif moved.migrated:
        where = " ".join(moved.configuration)
        out.write(f"{moved.execution_id}: migrated, {moved.status.value} in {where}\n")
    else:
        out.write(f"{moved.execution_id}: not migrated ({moved.status.value}): {moved.reason}\n")
    return 0 if moved.migrated or moved.status.value == "active" else 1


async def _migrate_all(durables: Sequence[Durable], args: argparse.Namespace, out: TextIO) -> int:
    state_map, data = _plan(args)
    migrated: list[str] = []
    parked: dict[str, str] = {}
    unchanged: dict[str, str] = {}
    failed: dict[str, str] = {}

    def add(summary: MigrationSummary) -> None:
        migrated.extend(summary.migrated)
        parked.update(summary.parked)
        unchanged.update(summary.unchanged)
        failed.update(summary.failed)

    for number, durable in enumerate(durables):
        revisions: list[MigrationSummary] = []  # what this store's call did so far
        try:
            async with _in_store(number, len(durables)):
                summary = await durable.migrate_all(
                    args.chart, state_map=state_map, data=data, progress=revisions.append
                )
        except BaseException as error:
            # An earlier store, or an earlier revision in this one, may have moved
            # executions: say so before the error is said (and the status is 2).
            for done in revisions:
                add(done)
            if migrated or parked or failed:
                _migration_stopped(args, error, (migrated, parked, unchanged, failed), out)
            raise
        add(summary)
    if args.json:
        _dump(
            {"migrated": migrated, "parked": parked, "unchanged": unchanged, "failed": failed},
            out,
        )
    else:
        out.write(
            f"{args.chart}: {len(migrated)} migrated, {len(parked)} parked, {len(failed)} failed\n"
        )
        for execution_id, reason in parked.items():
            out.write(f"  parked {execution_id}: {reason}\n")
        for execution_id, reason in failed.items():
            out.write(f"  failed {execution_id}: {reason}\n")
    return 1 if parked or failed else 0


def _migration_stopped(
    args: argparse.Namespace,
    error: BaseException,
    done: tuple[list[str], dict[str, str], dict[str, str], dict[str, str]],
    out: TextIO,
) -> None:
    """What a migration of a chart did before ``error`` stopped it: each id it
    migrated, parked or failed to move (they stay so; running it again goes on). A
    refused plan moved nothing of its store; any other error may have come in the
    middle of a revision, some of whose executions moved too."""
    from statifier.persistence import InvalidMigrationPlan

    migrated, parked, unchanged, failed = done
    if args.json:
        _dump(
            {
                "migrated": migrated,
                "parked": parked,
                "unchanged": unchanged,
                "failed": failed,
                "error": _one_line(error),
            },
            out,
        )
        return
    out.write(
        f"{args.chart}: stopped by an error after {len(migrated)} migrated, "
        f"{len(parked)} parked, {len(failed)} failed (what moved stays moved)\n"
    )
    for execution_id in migrated:
        out.write(f"  migrated {execution_id}\n")
    for execution_id, reason in parked.items():
        out.write(f"  parked {execution_id}: {reason}\n")
    for execution_id, reason in failed.items():
        out.write(f"  failed {execution_id}: {reason}\n")
    if not isinstance(error, InvalidMigrationPlan):
        out.write("  (more may have moved in the revision it stopped in: run it again to finish)\n")


# Text.


class _Placed(Protocol):
    """What :func:`_where` reads: a :class:`Description` or a ``Sent``."""

    @property
    def configuration(self) -> tuple[str, ...]: ...

    @property
    def final_state(self) -> str | None: ...


def _where(status: str, value: _Placed) -> str:
    """``active in open``, ``completed in closed``, ``cancelled``."""
    if value.final_state is not None:
        return f"{status} in {value.final_state}"
    if value.configuration:
        return f"{status} in {' '.join(value.configuration)}"
    return status


def _print_description(description: Description, as_json: bool, out: TextIO) -> None:
    if as_json:
        _dump(description.as_json(), out)
        return
    lines: list[tuple[str, str]] = [
        ("execution", description.id),
        ("chart", f"{description.chart or '(unnamed)'} ({description.content_hash})"),
        ("status", description.status.value),
    ]
    if description.position != "kept":
        why = "pruned" if description.position == "pruned" else "its chart is gone"
        lines.append(("position", f"{why}: configuration and final state unknown"))
    elif description.final_state is not None:
        lines.append(("final state", description.final_state))
    elif description.configuration:
        lines.append(("configuration", " ".join(description.configuration)))
    else:
        lines.append(("configuration", "none (it ended in no final state)"))
    if description.outcome is not UNDEFINED:
        lines.append(("outcome", _value(description.outcome)))
    if description.failure is not None:
        lines.append(("failure", description.failure))
    if description.metadata:
        pairs = sorted(description.metadata.items())
        lines.append(("metadata", " ".join(f"{key}={value}" for key, value in pairs)))
    for label, moment in (
        ("created", description.created_at),
        ("updated", description.updated_at),
        ("ended", description.ended_at),
    ):
        if moment is not None:
            lines.append((label, moment.isoformat()))
    lines.append(("errors", str(description.error_count) if description.error_count else "none"))
    lines.append(("inputs", str(len(description.inputs)) if description.inputs else "none"))
    lines.append(("timers", str(len(description.timers)) if description.timers else "none"))
    width = max(len(label) for label, _ in lines)
    for label, text in lines:
        _line(out, f"{label.ljust(width)}  {text}")
        if label == "errors":
            for error in description.errors:
                step = "" if error.seq is None else f" input {error.seq}"
                at = "" if error.recorded_at is None else error.recorded_at.isoformat()
                _line(out, f"  {at}  {error.via}{step}  {error.describe()}")
        if label == "timers":
            ended = description.finished
            for timer in description.timers:
                gone = "  (discarded when due: the execution has ended)" if ended else ""
                _line(out, f"  {_timer(timer)}{gone}")
        if label == "inputs":
            for entry in description.inputs:
                migration = entry.migration
                if migration is not None:
                    moved = (
                        f"parked: {migration.reason}"
                        if migration.reason is not None
                        else f"to {migration.target_hash}"
                    )
                    _line(out, f"  {entry.seq}  {entry.via}  {moved}")
                    continue
                if entry.event is None:
                    _line(out, f"  {entry.seq}  (the log was closed at its cap)")
                    continue
                data = "" if entry.event.data is UNDEFINED else " " + _value(entry.event.data)
                _line(out, f"  {entry.seq}  {entry.via}  {entry.event.name}{data}")


def _line(out: TextIO, text: str) -> None:
    """Write ``text`` and a newline, what a terminal would act on written as escapes
    (a control character, a line separator): an event's name or a metadata value may
    come from anyone who can send to the execution."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    out.write(f"{text}\n")


def _write_errors(errors: Sequence[StepError], out: TextIO) -> None:
    for error in errors:
        out.write(f"  {error.describe()}\n")


def _untaken(errors: Sequence[StepError]) -> bool:
    return any(not error.taken for error in errors)


def _timer(timer: PendingTimer) -> str:
    what = timer.event or "(unreadable here)"
    to = f" to route {timer.route}" if timer.route else ""
    tries = f", {timer.attempts} refused" if timer.attempts else ""
    return f"{what}{to} ({timer.kind}, send {timer.send_id}) due {timer.due_at.isoformat()}{tries}"


def _value(value: Value) -> str:
    return json.dumps(tagged.encode(value), sort_keys=True, ensure_ascii=False)


def _dump(data: object, out: TextIO) -> None:
    out.write(json.dumps(data, ensure_ascii=False) + "\n")


# Arguments.


def _event(text: str) -> tuple[str, Value]:
    name, separator, payload = text.partition("=")
    name = name.strip()
    if not name:
        raise ValueError(f"an event needs a name: {text!r}")
    if not separator:
        return name, UNDEFINED
    return name, _json(payload, f"the data of event {name!r}")


def _json(text: str, what: str) -> Value:
    # The fronts' parser: bounded in depth and number size, NaN and lone surrogates
    # refused, every refusal a ValueError that says where.
    from statifier.expr import jsontext

    try:
        return tagged.decode(jsontext.loads(text))
    except (jsontext.JSONTextError, tagged.TaggedValueError) as error:
        raise ValueError(f"{what} is not JSON: {error}") from None


def _json_object(text: str, what: str) -> dict[str, Value]:
    value = _json(text, what)
    if not isinstance(value, dict):
        raise ValueError(f"{what} is a JSON object of variable names, not {text!r}")
    return value


def _pairs(items: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"{option} takes KEY=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


def _one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def refused(command: str, args: argparse.Namespace, message: str) -> int:
    """Say on standard error that ``command`` refused, in one line (with the traceback
    under ``--debug``), and return the exit status of a refusal, 2."""
    if getattr(args, "debug", False):
        traceback.print_exc(file=sys.stderr)
    sys.stderr.write(f"statifier {command}: {_one_line(message)}\n")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
