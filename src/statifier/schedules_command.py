"""``statifier schedules ACTION``: the schedules stored in a database
(:mod:`statifier.router.scheduler`), from the shell.

``list`` prints every schedule, one line each (``--json``: a list of objects);
``show NAME`` one in full, its definition too; ``pause NAME`` and ``resume NAME`` act
as :meth:`Scheduler.pause <statifier.router.Scheduler.pause>` and ``resume`` do (a
resume makes the next fire the first after now); ``remove NAME`` deletes one. A
schedule a serve file names is put again when that service starts: remove it from the
file too.

Every action takes ``--database URL`` (default ``sqlite:///statifier.db``), ``--prefix``,
``--schema`` and ``--locks`` (the deployment's ``[database] locks``), and never
migrates. A refusal (no such schedule, a database without the tables, the database
failing) is one line on standard error, exit status 2;
``pause`` of a paused schedule and ``resume`` of a running one change nothing and say
so, exit status 1; so does ``list`` when a stored schedule cannot be read (it lists the
others and names those on standard error).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from statifier.executions_command import (
    DEFAULT_DATABASE,
    add_locks_option,
    locks_of_args,
    refused,
    run_refusing,
)

if TYPE_CHECKING:
    from statifier.router import Scheduler, ScheduleState

__all__ = ["add_parser", "run", "state_json"]


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``schedules`` to ``commands`` (what ``ArgumentParser.add_subparsers``
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
    common.add_argument("--prefix", default=None, help="the table name prefix (statifier_)")
    common.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    add_locks_option(common)
    schedules: argparse.ArgumentParser = commands.add_parser(
        "schedules", help="list, show, pause, resume and remove stored schedules"
    )
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[common], help="every schedule, by name")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    show = actions.add_parser("show", parents=[common], help="one schedule in full")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print JSON")
    for action, text in (
        ("pause", "make no fire until it resumes"),
        ("resume", "fire again, from the first fire after now"),
        ("remove", "delete the schedule"),
    ):
        actions.add_parser(action, parents=[common], help=text).add_argument("name")
    return schedules


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``statifier schedules ACTION``; returns the exit status."""
    return run_refusing(f"schedules {args.action}", args, lambda: _run(args, out))


def late(state: ScheduleState, now: datetime | None = None) -> bool:
    """Whether ``state`` is running and was due more than
    :data:`~statifier.router.SCHEDULE_LATE_AFTER` before ``now`` (the wall clock's by
    default), as the console's page says it: no worker is taking it."""
    from statifier.router import SCHEDULE_LATE_AFTER

    moment = datetime.now(UTC) if now is None else now
    return not state.paused and state.due_at < moment - SCHEDULE_LATE_AFTER


def state_json(state: ScheduleState) -> dict[str, Any]:
    """``state`` as one JSON object: the name, the definition's fields (as
    :meth:`Schedule.as_json <statifier.router.Schedule.as_json>` writes them), and the
    row's state (times in UTC ISO 8601, ``null`` when there is none)."""
    schedule = state.schedule
    return {
        "name": schedule.name,
        **schedule.as_json(),
        "paused": state.paused,
        "failing": state.failures > 0,
        "late": late(state),
        "next_fire_at": _time(state.next_fire_at),
        "due_at": _time(state.due_at),
        "last_fire_at": _time(state.last_fire_at),
        "last_made_at": _time(state.last_made_at),
        "fired": state.fired,
        "skipped": state.skipped,
        "failures": state.failures,
        "last_error": state.last_error,
    }


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    from statifier.durable import Durable
    from statifier.router import ScheduleError, Scheduler
    from statifier.sql import TableOptions
    from statifier.sql.tables import DEFAULT_PREFIX

    tables = TableOptions(
        prefix=args.prefix or DEFAULT_PREFIX, schema=args.schema, locks=locks_of_args(args)
    )
    async with Durable(args.database, tables=tables) as durable:
        router = durable.router
        assert router is not None  # an open Durable has its router
        scheduler = Scheduler(router)
        try:
            return await _act(scheduler, args, out)
        except ScheduleError as error:
            return refused(f"schedules {args.action}", args, str(error))


async def _act(scheduler: Scheduler, args: argparse.Namespace, out: TextIO) -> int:
    """One action; ``ScheduleNotFound`` (a :class:`ScheduleError`) for a missing name."""
    from statifier.router import ScheduleNotFound

    if args.action == "list":
        states, unreadable = await _every(scheduler)
        if args.json:
            _dump([state_json(state) for state in states], out)
        else:
            for state in states:
                out.write(_line(state) + "\n")
            if not states and not unreadable:
                out.write("no schedules\n")
        if unreadable:
            shown = ", ".join(unreadable[:20]) + (", ..." if len(unreadable) > 20 else "")
            sys.stderr.write(
                f"statifier schedules list: {len(unreadable)} stored schedule(s) cannot "
                f"be read, not listed: {shown}\n"
            )
            return 1
        return 0
    if args.action == "show":
        found = await scheduler.get(args.name)
        if found is None:
            raise ScheduleNotFound(args.name)
        if args.json:
            _dump(state_json(found), out)
        else:
            for key, value in state_json(found).items():
                out.write(f"{key}: {json.dumps(value, ensure_ascii=False)}\n")
        return 0
    if args.action == "pause":
        done = await scheduler.pause(args.name)
        out.write(f"{args.name}: {'paused' if done else 'paused already, nothing changed'}\n")
        return 0 if done else 1
    if args.action == "resume":
        done = await scheduler.resume(args.name)
        resumed = await scheduler.get(args.name)
        next_fire = "" if resumed is None else f", next fire {_time(resumed.next_fire_at)}"
        said = f"resumed{next_fire}" if done else "running already, nothing changed"
        out.write(f"{args.name}: {said}\n")
        return 0 if done else 1
    if not await scheduler.remove(args.name):
        raise ScheduleNotFound(args.name)
    out.write(f"{args.name}: removed\n")
    return 0


async def _every(scheduler: Scheduler) -> tuple[list[ScheduleState], list[str]]:
    """Every stored schedule, by name, a page at a time: those that can be read, and
    the names of those that cannot (logged by the scheduler)."""
    states: list[ScheduleState] = []
    unreadable: list[str] = []
    after = ""
    while True:
        page = await scheduler.page(after=after)
        states.extend(page.states)
        unreadable.extend(page.unreadable)
        if page.last is None:
            return states, unreadable
        after = page.last


def _line(state: ScheduleState) -> str:
    schedule = state.schedule
    standing = "paused" if state.paused else "failing" if state.failures else "running"
    if schedule.cron is not None:
        times = f"cron {schedule.cron.text!r} {schedule.timezone}"
    else:
        times = f"every {schedule.as_json()['every']}"
    last = _time(state.last_fire_at) or "none"
    error = f" last error: {state.last_error}" if state.last_error else ""
    if late(state):
        error += f" LATE: due at {_time(state.due_at)}, no worker has taken it"
    return (
        f"{schedule.name} {standing} {times} source={schedule.source} "
        f"scope={schedule.scope} next={_time(state.next_fire_at)} last={last} "
        f"fired={state.fired} skipped={state.skipped}{error}"
    )


def _time(instant: datetime | None) -> str | None:
    return None if instant is None else instant.isoformat().replace("+00:00", "Z")


def _dump(value: object, out: TextIO) -> None:
    out.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")
