"""``statifier replay``: a revision of a chart tried on the recorded executions of its
chart, read-only (:func:`statifier.shadow.shadow_replay`).

``statifier replay --chart NEW.scxml --database URL [--document NAME] [--status S]
[--scope S] [--created-after T] [--created-before T] [--sample N] [--seed N] [--limit N]
[--max-inputs N] [--json] [--prefix P] [--schema S] [--keys-env NAME]...``
    Replays the input log of each selected execution (of the chart stored under
    ``NAME``, by default the file's stem) on its own stored chart and on ``NEW.scxml``,
    and prints one line per execution that did not replay the same (where it parted
    and how, the errors only the revision raised, or why its replay cannot be
    trusted), then a summary line; ``--scope`` keeps the executions the router addresses
    in that scope; with ``--json``, one document
    (:meth:`statifier.shadow.ShadowSummary.as_json`). ``T`` is an ISO 8601 time with
    an offset. The database is opened read-only.

``statifier replay --chart NEW.scxml --database URL --migrate [--map OLD=NEW]...
[--remove OLD]... [--data JSON] [--from-index K] [selection and output as above]``
    The migration dry run (:func:`statifier.migration_dry_run.migration_dry_run`):
    for each selected execution, what migrating it onto ``NEW.scxml`` now would do
    (moved, with the states it would be in; parked, with the reason; unchanged; or
    failed), the plan given as ``statifier executions migrate`` takes it. With
    ``--from-index K``, also a migration after the ``K``-th logged input (0: right
    after the start) and the rest of the log replayed on the stored chart and, from
    the migrated position, on ``NEW.scxml``, compared. One line per execution that
    moves, parks, fails or whose continuation differs, then a summary line; with
    ``--json``, :meth:`statifier.migration_dry_run.DryRunSummary.as_json`. Nothing is
    written.

When the selection chooses no execution, one line says so and names the document and
the other filters given, in place of the counts (with ``--json``, on standard error
beside the document, whose ``selected`` is 0).

Exit status: 0 when every execution replayed the same (a dry run: nothing would be
parked or fail, and every continuation moved and replayed the same); 1 otherwise,
including when no execution was selected (nothing compared is no pass); 2 for an error
of the command, printed as one line, ``statifier replay: message``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from statifier.executions_command import _json_object, _pairs, add_keys_env, codec_of, refused
from statifier.expr import tagged

if TYPE_CHECKING:
    from statifier.migration_dry_run import DryRunResult, DryRunSummary
    from statifier.shadow import Selection, ShadowResult, ShadowSummary

__all__ = ["add_parser", "run"]

_DRIVER_ERRORS = ("sqlalchemy", "psycopg", "psycopg_pool")


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``replay`` to ``commands`` (what ``ArgumentParser.add_subparsers``
    returned) and return its parser."""
    replay = commands.add_parser(
        "replay", help="try a chart revision on recorded executions' input logs, read-only"
    )
    replay.add_argument("--chart", required=True, metavar="NEW.scxml", help="the revision")
    replay.add_argument("--database", "--url", dest="database", required=True, metavar="URL")
    replay.add_argument(
        "--document", default=None, metavar="NAME", help="the chart's name (default: the stem)"
    )
    replay.add_argument("--status", default=None, help="only executions in this status")
    replay.add_argument("--scope", default=None, help="only executions addressed in this scope")
    replay.add_argument("--created-after", default=None, metavar="T", help="ISO 8601, offset")
    replay.add_argument("--created-before", default=None, metavar="T", help="ISO 8601, offset")
    replay.add_argument("--sample", type=int, default=None, metavar="N", help="N at random")
    replay.add_argument("--seed", type=int, default=0, metavar="N", help="the sample's seed")
    replay.add_argument("--limit", type=int, default=None, metavar="N", help="at most N")
    replay.add_argument(
        "--max-inputs", type=int, default=None, metavar="N", help="inputs per execution"
    )
    replay.add_argument(
        "--workers", type=int, default=1, metavar="N", help="replay in N processes (1)"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON document")
    replay.add_argument(
        "--migrate", action="store_true", help="a migration dry run onto the revision"
    )
    replay.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="with --migrate: state OLD was renamed NEW; repeat for more",
    )
    replay.add_argument(
        "--remove",
        action="append",
        default=[],
        metavar="OLD",
        help="with --migrate: state OLD was removed on purpose; repeat for more",
    )
    replay.add_argument(
        "--data", default=None, metavar="JSON", help="with --migrate: values for added variables"
    )
    replay.add_argument(
        "--from-index",
        type=int,
        default=None,
        metavar="K",
        help="with --migrate: also migrate after input K and compare the rest of the log",
    )
    replay.add_argument("--prefix", default=None, help="the table name prefix (statifier_)")
    replay.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    add_keys_env(replay)
    return replay  # type: ignore[no-any-return]


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``statifier replay``; returns the exit status."""
    from statifier.extras import MissingExtra
    from statifier.persistence import PersistenceError
    from statifier.shadow import ShadowSummary

    summary: ShadowSummary | DryRunSummary
    try:
        summary = asyncio.run(_dry_run(args)) if args.migrate else asyncio.run(_replay(args))
    except (ValueError, TypeError, PersistenceError, MissingExtra) as error:
        return _refused(args, str(error))
    except sqlite3.Error as error:
        return _refused(args, f"database: {_database_error(error)}")
    except Exception as error:
        if type(error).__module__.partition(".")[0] not in _DRIVER_ERRORS:
            raise
        return _refused(args, f"database: {_database_error(error)}")
    if args.json:
        out.write(json.dumps(summary.as_json(), ensure_ascii=False) + "\n")
    if summary.selected == 0:
        # No execution compared says nothing of the revision: a CI gate that took
        # exit 0 here would pass a --document typo, or a file named unlike the chart.
        (sys.stderr if args.json else out).write(_nothing_selected(args, summary.revision))
        return 1
    if isinstance(summary, ShadowSummary):
        if not args.json:
            _print(summary, out)
        return 0 if summary.all_same else 1
    if not args.json:
        _print_dry_run(summary, out)
    return 0 if summary.clean else 1


async def _replay(args: argparse.Namespace) -> ShadowSummary:
    from statifier.shadow import read_revision, shadow_replay
    from statifier.sql import TableOptions
    from statifier.sql.tables import DEFAULT_PREFIX

    if args.map or args.remove or args.data is not None or args.from_index is not None:
        raise ValueError("--map, --remove, --data and --from-index need --migrate")
    revision = read_revision(args.chart)
    return await shadow_replay(
        args.database,
        revision,
        _selection(args),
        codec=codec_of(args.keys_env),
        tables=TableOptions(prefix=args.prefix or DEFAULT_PREFIX, schema=args.schema),
        max_inputs=_max_inputs(args),
        workers=args.workers,
    )


async def _dry_run(args: argparse.Namespace) -> DryRunSummary:
    from statifier.migration_dry_run import migration_dry_run
    from statifier.shadow import read_revision
    from statifier.sql import TableOptions
    from statifier.sql.tables import DEFAULT_PREFIX

    # The plan as `statifier executions migrate` takes it.
    state_map: dict[str, str | None] = dict(_pairs(args.map, "--map"))
    for old in args.remove:
        state_map[old] = None
    data = {} if args.data is None else _json_object(args.data, "--data")
    if args.from_index is not None and args.from_index < 0:
        raise ValueError(f"--from-index is an input's index (0 or more), not {args.from_index}")
    revision = read_revision(args.chart)
    return await migration_dry_run(
        args.database,
        revision,
        _selection(args),
        state_map=state_map,
        data=data,
        at=args.from_index,
        codec=codec_of(args.keys_env),
        tables=TableOptions(prefix=args.prefix or DEFAULT_PREFIX, schema=args.schema),
        max_inputs=_max_inputs(args),
    )


def _max_inputs(args: argparse.Namespace) -> int:
    from statifier.shadow import MAX_INPUTS

    if args.max_inputs is not None and args.max_inputs < 0:
        raise ValueError(f"--max-inputs is a count, not {args.max_inputs}")
    return MAX_INPUTS if args.max_inputs is None else int(args.max_inputs)


def _selection(args: argparse.Namespace) -> Selection:
    from statifier.persistence import Status
    from statifier.shadow import Selection

    status = None
    if args.status is not None:
        try:
            status = Status(args.status)
        except ValueError:
            known = ", ".join(s.value for s in Status)
            raise ValueError(f"--status is one of {known}, not {args.status!r}") from None
    return Selection(
        document=args.document,
        status=status,
        scope=args.scope,
        created_after=_moment(args.created_after, "--created-after"),
        created_before=_moment(args.created_before, "--created-before"),
        sample=args.sample,
        limit=args.limit,
        seed=args.seed,
    )


def _moment(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option} is an ISO 8601 time, not {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"{option} needs an offset (2026-01-01T00:00:00+00:00), not {text!r}")
    return moment


def _nothing_selected(args: argparse.Namespace, revision: str) -> str:
    """``no executions selected: document 'cart-v2' (...), status active; nothing
    tried on sha256:...``: the selection as given, so a wrong filter shows."""
    if args.document is None:
        # The revision is named after its file (read_revision), and selects by it.
        document = (
            f"document {Path(args.chart).stem!r} (the chart file's stem: --document names another)"
        )
    else:
        document = f"document {args.document!r}"
    filters = [document]
    for option, value in (
        ("status", args.status),
        ("scope", args.scope),
        ("created after", args.created_after),
        ("created before", args.created_before),
        ("a sample of", args.sample),
        ("at most", args.limit),
    ):
        if value is not None:
            filters.append(f"{option} {value}")
    return f"no executions selected: {', '.join(filters)}; nothing tried on {revision}\n"


def _print(summary: ShadowSummary, out: TextIO) -> None:
    from statifier.shadow import Verdict

    for result in summary.results:
        if result.verdict is not Verdict.SAME:
            out.write(_line(result) + "\n")
    counts = summary.counts
    out.write(
        f"{len(summary.results)} executions replayed on {summary.revision}: "
        f"{counts[Verdict.SAME]} same, {counts[Verdict.DIVERGED]} diverged, "
        f"{counts[Verdict.NEW_ERRORS]} with new errors, {counts[Verdict.UNTRUSTED]} untrusted\n"
    )


def _print_dry_run(summary: DryRunSummary, out: TextIO) -> None:
    from statifier.migration_dry_run import Outcome
    from statifier.shadow import Verdict

    for result in summary.results:
        line = _dry_run_line(result)
        if line is not None:
            out.write(line + "\n")
    counts = summary.counts
    out.write(
        f"{len(summary.results)} executions on {summary.revision}: "
        f"{counts[Outcome.MOVED]} moved, {counts[Outcome.PARKED]} parked, "
        f"{counts[Outcome.UNCHANGED]} unchanged, {counts[Outcome.FAILED]} failed"
    )
    if summary.at is not None:
        verdicts = [r.continuation.verdict for r in summary.results if r.continuation]
        tally = {verdict: verdicts.count(verdict) for verdict in (*Verdict, None)}
        out.write(
            f"; after input {summary.at}: {tally[Verdict.SAME]} same, "
            f"{tally[Verdict.DIVERGED]} diverged, {tally[Verdict.NEW_ERRORS]} with new errors, "
            f"{tally[Verdict.UNTRUSTED]} untrusted, {tally[None]} not moved"
        )
    out.write("\n")


def _dry_run_line(result: DryRunResult) -> str | None:
    """``ID: moved, in cart; after input 2: diverged at input 3 ...``, or ``None`` for
    an execution left unchanged whose continuation, if any, says nothing."""
    from statifier.migration_dry_run import Outcome
    from statifier.shadow import Verdict

    said: list[str] = []
    if result.outcome is Outcome.MOVED:
        said.append(f"moved, in {' '.join(result.configuration)}")
    elif result.outcome is not Outcome.UNCHANGED:
        said.append(f"{result.outcome.value}: {result.reason}")
    after = result.continuation
    if after is not None and after.replay is not None and after.verdict is not Verdict.SAME:
        said.append(f"after input {after.at}: {'; '.join(_findings(after.replay))}")
    elif after is not None and after.outcome in (Outcome.PARKED, Outcome.FAILED):
        assert after.outcome is not None
        said.append(f"after input {after.at}: {after.outcome.value}: {after.reason}")
    if not said:
        return None
    return f"{result.execution_id}: {'; '.join(said)}"


def _line(result: ShadowResult) -> str:
    """``ID: diverged at input 3 (seq 3, checkout): configuration cart -> review; ...``"""
    return f"{result.execution_id}: {'; '.join(_findings(result))}"


def _findings(result: ShadowResult) -> list[str]:
    """What a replay found: why it is untrusted, where it parted, its new errors."""
    said: list[str] = []
    if result.untrusted is not None:
        said.append(f"untrusted: {result.untrusted}")
    divergence = result.divergence
    if divergence is not None:
        at = "the start" if divergence.seq is None else f"input {divergence.index}"
        if divergence.seq is not None:
            at += f" (seq {divergence.seq}, {divergence.event})"
        old, new = divergence.old, divergence.new
        parts = []
        if "configuration" in divergence.parts:
            parts.append(f"configuration {_where(old)} -> {_where(new)}")
        if "datamodel" in divergence.parts:
            names = sorted(old.datamodel.keys() | new.datamodel.keys())
            changes = ", ".join(
                f"{name} {_value(old.datamodel, name)} -> {_value(new.datamodel, name)}"
                for name in names
            )
            parts.append(f"datamodel {changes}")
        if "handed" in divergence.parts:
            parts.append(f"handed {_handed(old.handed)} -> {_handed(new.handed)}")
        said.append(f"diverged at {at}: {'; '.join(parts)}")
    if result.new_errors:
        first = result.new_errors[0]
        more = result.new_error_count - 1
        also = f" (and {more} more)" if more else ""
        said.append(f"new error at input {first.index}: {first.error.summary()}{also}")
    return said


def _where(side: Any) -> str:
    if side.final_state is not None:
        return f"ended in {side.final_state}"
    return " ".join(side.configuration) or "(none)"


def _value(data: Any, name: str) -> str:
    if name not in data:
        return "(unset)"
    return json.dumps(tagged.encode(data[name]), sort_keys=True, ensure_ascii=False)


def _handed(items: Any) -> str:
    return "[" + ", ".join(item.describe() for item in items) + "]"


def _database_error(error: BaseException) -> str:
    from statifier.sql.engines import missing_table

    table = missing_table(error)
    if table is not None:
        return f"it has no table {table}: run `statifier db upgrade` (same --url and --prefix)"
    return " ".join(str(error).split()) or type(error).__name__


def _refused(args: argparse.Namespace, message: str) -> int:
    return refused("replay", args, message)
