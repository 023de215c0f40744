"""``statifier reshard``: move a deployment's rows from K stores to K' stores, with
every process that writes to them stopped (decision 0126).

``statifier reshard --from URL [--from URL]... --to URL [--to URL]... [--prefix P]
[--schema S] [--step N] [--dry-run]``
    The stores before (``--from``, in the order of the deployment's ``[database]
    shards``, or its one ``url``) and after (``--to``); a store in both lists is the
    same store. Stores are told apart by the random name each holds
    (:func:`statifier.sql.places.store_identity`), not by their URLs: two URLs that
    reach one store in one list are refused. Each holds an even range of the 1,024 buckets
    (``ShardMap.even``), so the command works out which ranges change store
    (:func:`plan`) and moves each (:func:`statifier.sql.moves.move_range`), ``N``
    buckets at a time (default 16). It prints one line per range, then a summary.
    With ``--dry-run`` it prints the ranges and moves nothing. A store is named by its
    place in ``--from`` or ``--to``, never by its URL (which may hold a password).

Every store must exist (a SQLite file that does not is refused, not created) and be
at the package's revision (``statifier db upgrade`` each one, the new ones included),
and no service may run on any of them: a store a service said it serves within the
last few seconds is refused. A ``--from`` store that records another place than its
place in ``--from``, or that a reshard retired, and a store only in ``--to`` that
serves another list already are refused (``statifier.sql.places``; a store without a
record is taken at its word). So is a store that holds rows the reshard would lose:
rows of keys in a store only in ``--to``, rows of the buckets it is to receive in a
store in both lists, unless this reshard reached the store already (its record says
``moving`` for it, or its new place), for a move takes a ``moving`` store's rows of a
part for an earlier copy and replaces them (:mod:`statifier.sql.moves`). So is a pair
of stores a move cannot go between (:func:`statifier.sql.moves.check_move`). Every
check is made before a store is marked, a dry run included.

Before a row moves, every store named is marked ``moving``, which ``statifier
serve`` refuses to start on (and a service still running stops at its next check);
once every range moved, the ``--to`` stores are marked serving in their places and
the stores left out ``retired``. A move cut short (an error, Ctrl-C, a crash) is
finished by running the same command again, and an error or Ctrl-C that leaves stores
``moving`` says so; a reshard with other lists of stores is refused while a store is
``moving`` for it (the records name the reshard,
:func:`statifier.sql.places.reshard_name`). Then start the processes with the new
stores.

Exit status: 0 when every range moved (or the dry run printed), 2 for an error,
printed as one line, ``statifier reshard: message``, 130 when Ctrl-C (SIGINT)
interrupted it, said in one line too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

if TYPE_CHECKING:
    import sqlalchemy as sa

    from statifier.sql import TableOptions
    from statifier.sql.places import Place

T = TypeVar("T")

__all__ = ["Range", "add_parser", "plan", "run"]


@dataclass(frozen=True, slots=True)
class Range:
    """A range of buckets that changes store.

    Attributes:
        buckets: ``(start, end)``, ``end`` excluded.
        source: its store's place among the stores before.
        target: its store's place among the stores after.
    """

    buckets: tuple[int, int]
    source: int
    target: int


def plan(sources: Sequence[str], targets: Sequence[str]) -> list[Range]:
    """The ranges of buckets whose store changes when the stores ``sources`` (each an
    even range of the buckets, in order) become the stores ``targets``, in bucket
    order. A store is named by anything that is equal for one store and only for it:
    the command names each by its :func:`~statifier.sql.places.store_identity`.

    >>> plan(["a"], ["a", "b"])
    [Range(buckets=(512, 1024), source=0, target=1)]
    >>> plan(["a", "b"], ["a", "c"])
    [Range(buckets=(512, 1024), source=1, target=1)]

    Raises:
        ValueError: a list is empty or names a store twice, or the first stores
            differ (the first holds what is not per key: schedules, the inbound-events
            table and its consumers' rows, which stay where they are).
    """
    from statifier.buckets import BUCKETS
    from statifier.persistence.shards import ShardMap

    for named, stores in (("--from", sources), ("--to", targets)):
        if not stores:
            raise ValueError(f"{named}: name at least one store")
        if len(set(stores)) != len(stores):
            raise ValueError(
                f"{named}: a store is named twice (two of its URLs reach one store, or "
                "one store is a copy of another)"
            )
    if sources[0] != targets[0]:
        raise ValueError(
            "the first store of --to must be the first of --from: it holds what is not "
            "per key (schedules, the inbound-events table), which does not move"
        )
    before, after = ShardMap.even(len(sources)), ShardMap.even(len(targets))
    same = [[a == b for b in targets] for a in sources]
    ranges: list[Range] = []
    for bucket in range(BUCKETS):
        source, target = before.store_of(bucket), after.store_of(bucket)
        if same[source][target]:
            continue
        last = ranges[-1] if ranges else None
        if last and (last.source, last.target, last.buckets[1]) == (source, target, bucket):
            ranges[-1] = Range((last.buckets[0], bucket + 1), source, target)
        else:
            ranges.append(Range((bucket, bucket + 1), source, target))
    return ranges


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``reshard`` to ``commands`` (what ``ArgumentParser.add_subparsers``
    returned) and return its parser."""
    reshard: argparse.ArgumentParser = commands.add_parser(
        "reshard", help="move rows between stores for a new number of stores (writers stopped)"
    )
    reshard.add_argument(
        "--from", dest="sources", action="append", required=True, metavar="URL",
        help="a store before, in the deployment's order; repeat for each",
    )  # fmt: skip
    reshard.add_argument(
        "--to", dest="targets", action="append", required=True, metavar="URL",
        help="a store after, in the new order; repeat for each",
    )  # fmt: skip
    reshard.add_argument("--prefix", default="statifier_", help="the table name prefix")
    reshard.add_argument("--schema", default=None, help="the schema (PostgreSQL)")
    reshard.add_argument(
        "--step", type=int, default=16, metavar="N", help="buckets moved at a time (16)"
    )
    reshard.add_argument("--dry-run", action="store_true", help="print the ranges, move nothing")
    return reshard


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``statifier reshard``; returns the exit status."""
    import sqlalchemy as sa

    from statifier.executions_command import refused
    from statifier.extras import MissingExtra
    from statifier.sql.moves import CopyMismatch, SourceChanged, TargetNotEmpty
    from statifier.sql.places import PlaceMismatch

    progress = _Progress()
    try:
        _reshard(args, out, progress)
    except KeyboardInterrupt:
        # Ctrl-C: the transaction under way rolls back, and running the command again
        # finishes what it cut short; the operator needs to know which it was.
        left = progress.left() or (
            ": before the stores' records were read: this run changed none"
            if progress.marked is None
            else ": no store was marked moving, none changed"
        )
        sys.stderr.write(f"statifier reshard: interrupted{left}\n")
        return INTERRUPTED
    except (
        ValueError,
        CopyMismatch,
        SourceChanged,
        TargetNotEmpty,
        MissingExtra,
        PlaceMismatch,
    ) as error:
        return refused("reshard", args, f"{error}{progress.left()}")
    except _StoreError as failed:
        # The driver's own words: SQLAlchemy's add the statement and its values.
        cause = getattr(failed.error, "orig", None) or failed.error
        said = f"database ({failed.where}): {type(cause).__name__}: {cause}"
        return refused("reshard", args, f"{said}{progress.left()}")
    except sa.exc.SQLAlchemyError as error:  # a statement no store was named for
        cause = getattr(error, "orig", None) or error
        said = f"database: {type(cause).__name__}: {cause}"
        return refused("reshard", args, f"{said}{progress.left()}")
    return 0


class _StoreError(Exception):
    """A store's database failed: ``error`` (SQLAlchemy's), and ``where`` says which
    store, or which pair of them a move was between."""

    def __init__(self, where: str, error: Exception) -> None:
        super().__init__(where, error)
        self.where = where
        self.error = error


@contextmanager
def _at(where: str) -> Iterator[None]:
    """Raise a database error of the block as :class:`_StoreError` naming ``where``:
    the driver's message names a host and a port, which do not tell an operator which
    of several databases on one server failed."""
    import sqlalchemy as sa

    try:
        yield
    except sa.exc.SQLAlchemyError as error:
        raise _StoreError(where, error) from error


INTERRUPTED = 130
"""The exit status of a reshard interrupted by Ctrl-C (SIGINT): the shell's own for a
process that SIGINT ended."""


@dataclass(slots=True)
class _Progress:
    """How far a reshard got: whether its stores are marked ``moving`` (``None``:
    their records not read yet, so not known: an earlier run may have left them so),
    and whether it marked them in their new places."""

    marked: bool | None = None
    done: bool = False

    def left(self) -> str:
        """What a message that ends the reshard adds: that it leaves the stores
        ``moving``, when it does."""
        if not self.marked or self.done:
            return ""
        return (
            ": the stores are left moving (statifier serve refuses them): run the same "
            "statifier reshard again to finish"
        )


def _reshard(args: argparse.Namespace, out: TextIO, progress: _Progress) -> None:
    """Check, mark, move and mark again, printing to ``out``; ``progress`` says how
    far it got when it raises.

    Raises:
        ValueError: a store is missing, not at the package's revision, named twice,
            or holds rows the reshard would replace; or a move cannot be.
        PlaceMismatch: a store's record forbids the reshard, or a service runs on it.
        TargetNotEmpty, CopyMismatch, SourceChanged: a move refused a part.
    """
    from statifier.sql import TableOptions
    from statifier.sql.places import reshard_name, resharded, resharding, store_identity

    options = TableOptions(prefix=args.prefix, schema=args.schema)
    if args.step < 1:
        raise ValueError(f"--step is a positive number of buckets, not {args.step}")
    _check_revisions(args.sources, args.targets, options)
    # Each URL asked once for the store it reaches: two URLs may reach one.
    urls = dict.fromkeys([*args.sources, *args.targets])
    known = {}
    for url in urls:
        with _at(_first_named(url, args.sources, args.targets)):
            known[url] = _on(url, partial(store_identity, options=options))
    sources = [known[url] for url in args.sources]
    targets = [known[url] for url in args.targets]
    ranges = plan(sources, targets)
    reshard = reshard_name(sources, targets)
    stores = _stores(args.sources, args.targets, known)
    records = _check_places(stores, len(sources), len(targets), options, reshard)
    # A run cut short left stores moving (for this reshard: another one was refused).
    progress.marked = any(record is not None and record.state == "moving" for record in records)
    _check_rows(stores, records, ranges, len(targets), options, reshard)
    # What a move would refuse is found now, while no store is marked yet.
    _check_moves(ranges, args.sources, args.targets, options)
    said = [_said(moving) for moving in ranges]
    if args.dry_run:
        out.writelines(f"{line}\n" for line in said)
        out.write(f"{len(ranges)} ranges would move\n")
        return
    progress.marked = True
    _mark(stores, options, lambda store: resharding(store.before, len(sources), reshard))
    total = 0
    for moving, line in zip(ranges, said, strict=True):
        total += _move(moving, line, args, options, reshard, out)
    _mark(stores, options, lambda store: resharded(store.after, len(targets)))
    progress.done = True
    out.write(f"moved {total} rows in {len(ranges)} ranges: start the processes on --to\n")


def _said(moving: Range) -> str:
    start, end = moving.buckets
    return (
        f"buckets {start}-{end - 1}: store {moving.source} of --from "
        f"to store {moving.target} of --to"
    )


def _move(
    moving: Range,
    line: str,
    args: argparse.Namespace,
    options: TableOptions,
    reshard: str,
    out: TextIO,
) -> int:
    """Move one range, say so on ``out`` after ``line``; how many rows moved."""
    from statifier.sql.moves import move_range

    source, target = args.sources[moving.source], args.targets[moving.target]
    with _at(line):
        moved = move_range(
            source, target, moving.buckets, options=options, step=args.step, reshard=reshard
        )
    rows = ", ".join(f"{name} {count}" for name, count in moved.rows.items())
    out.write(f"{line}: {moved.total} rows ({rows or 'none'}), {moved.charts} charts\n")
    return moved.total


def _check_revisions(sources: Sequence[str], targets: Sequence[str], options: TableOptions) -> None:
    """Refuse a store that does not exist or is not at the package's revision.

    Raises:
        ValueError: one is missing (a SQLite file, which is not created: a mistyped
            path would leave an empty database behind) or behind.
    """
    for named, urls in (("--from", sources), ("--to", targets)):
        for place, url in enumerate(urls):
            with _at(f"store {place} of {named}"):
                _check_revision(url, f"store {place} of {named}", options)


def _check_revision(url: str, named: str, options: TableOptions) -> None:
    """Refuse the store ``named`` at ``url`` if missing or behind (see
    :func:`_check_revisions`)."""
    from statifier.sql import migrations

    if migrations.missing_file(url):
        raise ValueError(
            f"no such store: {named} names a SQLite file that does not exist (make a "
            "new store with statifier db upgrade)"
        )
    found = migrations.current(url, options)
    if found != migrations.head():
        raise ValueError(
            f"{named} is at revision {found or 'none'}, not {migrations.head()}: run "
            "statifier db upgrade on it first"
        )


def _first_named(url: str, sources: Sequence[str], targets: Sequence[str]) -> str:
    """How a message names the store at ``url``: by its place in ``--from`` if it is
    there, else in ``--to``."""
    if url in sources:
        return f"store {sources.index(url)} of --from"
    return f"store {targets.index(url)} of --to"


@dataclass(frozen=True, slots=True)
class _Store:
    """A store the reshard names, once even when in both lists: its URL, its place in
    ``--from`` and in ``--to`` (``None`` where it is not there)."""

    url: str
    before: int | None
    after: int | None

    def __str__(self) -> str:
        if self.before is not None:
            return f"store {self.before} of --from"
        return f"store {self.after} of --to"


def _stores(
    sources: Sequence[str], targets: Sequence[str], known: Mapping[str, str]
) -> list[_Store]:
    """Each store of ``sources`` and ``targets`` (URLs) once, in their order, told
    apart by ``known``: the store each URL reaches."""
    stores: dict[str, _Store] = {}
    for place, url in enumerate(sources):
        stores[known[url]] = _Store(url, place, None)
    for place, url in enumerate(targets):
        before = stores.get(known[url])
        stores[known[url]] = _Store(url, before.before if before else None, place)
    return list(stores.values())


def _check_places(
    stores: Sequence[_Store], sources: int, targets: int, options: TableOptions, reshard: str
) -> list[Place | None]:
    """Read each store's record and refuse what :func:`statifier.sql.places.reshard_refusal`
    refuses for the reshard named ``reshard``, and a store a service runs on
    (:func:`statifier.sql.places.serving_since`); each store's record, in order.

    Raises:
        PlaceMismatch: a store's record forbids the reshard.
    """
    from datetime import UTC, datetime

    from statifier.sql.places import (
        RUNNING_FOR,
        PlaceMismatch,
        read_place,
        reshard_refusal,
        serving_since,
    )

    def read(connection: sa.Connection) -> tuple[Place | None, float | None]:
        now = datetime.now(UTC)
        return read_place(connection, options), serving_since(connection, options, now)

    # Each store read once: its record and when a service last said it serves it.
    found = []
    for store in stores:
        with _at(str(store)):
            found.append(_on(store.url, read))
    records = [(s.before, s.after, place) for s, (place, _) in zip(stores, found, strict=True)]
    said = reshard_refusal(records, sources, targets, reshard=reshard)
    if said is not None:
        raise PlaceMismatch(said)
    for store, (_, ago) in zip(stores, found, strict=True):
        if ago is not None:
            raise PlaceMismatch(
                f"{store} is served: a service said so {ago:.0f} s ago. Stop every "
                f"process that writes to the stores first (one stopped within the last "
                f"{RUNNING_FOR:g} s counts as running: wait, and run the command again)"
            )
    return [place for place, _ in found]


def _check_rows(
    stores: Sequence[_Store],
    records: Sequence[Place | None],
    ranges: Sequence[Range],
    targets: int,
    options: TableOptions,
    reshard: str,
) -> None:
    """Refuse a store that holds rows this reshard would lose: a store only in
    ``--to`` that holds rows of keys (outside the buckets it receives, no process would
    read them), or a store in both lists that holds rows of the buckets it is to
    receive (a move replaces a target's rows of a part, taking them for an earlier
    copy, once the store is marked ``moving``). A store this reshard reached already
    (``moving`` for it, or in its new place) is let through: what it holds there, the
    reshard copied.

    Raises:
        ValueError: a store holds such rows.
    """
    from statifier.buckets import BUCKETS
    from statifier.sql.moves import holds_rows

    for store, record in zip(stores, records, strict=True):
        if store.after is None or _reached(store, record, targets, reshard):
            continue
        if store.before is None:
            buckets = [(0, BUCKETS)]
        else:
            buckets = [r.buckets for r in ranges if r.target == store.after]
        if not buckets:
            continue
        with _at(str(store)):
            held = _on(store.url, partial(holds_rows, options=options, buckets=buckets))
        if held:
            where = "" if store.before is None else " in the buckets it is to receive"
            raise ValueError(
                f"{store} holds rows of keys already{where}, which no reshard put "
                "there: moving rows to it would lose them. Name a store that holds none "
                "(statifier db upgrade makes a new one)"
            )


def _reached(store: _Store, record: Place | None, targets: int, reshard: str) -> bool:
    """Whether the reshard named ``reshard`` reached ``store`` already: its record
    says ``moving`` for it (or for an unnamed reshard, as records written before they
    named one do), or the store is in its new place among ``targets`` stores."""
    from statifier.sql.places import resharded

    if record is not None and record.state == "moving":
        return record.reshard in (None, reshard)
    return record == resharded(store.after, targets)


def _check_moves(
    ranges: Sequence[Range], sources: Sequence[str], targets: Sequence[str], options: TableOptions
) -> None:
    """Refuse what :func:`statifier.sql.moves.move_range` would refuse of each pair of
    stores a range goes between (:func:`statifier.sql.moves.check_move`).

    Raises:
        ValueError: a move cannot be, with which range it is.
    """
    from statifier.sql.moves import check_move

    for source, target in dict.fromkeys((r.source, r.target) for r in ranges):
        try:
            with _at(f"store {source} of --from to store {target} of --to"):
                check_move(sources[source], targets[target], options=options)
        except ValueError as error:
            raise ValueError(
                f"store {source} of --from to store {target} of --to: {error}"
            ) from error


def _mark(
    stores: Sequence[_Store], options: TableOptions, place: Callable[[_Store], Place]
) -> None:
    """Write each store's record: ``place(store)``."""
    from datetime import UTC, datetime

    from statifier.sql.places import write_place

    for store in stores:
        write = partial(write_place, options=options, place=place(store), now=datetime.now(UTC))
        with _at(str(store)):
            _on(store.url, write)


def _on(url: str, work: Callable[[sa.Connection], T]) -> T:
    """``work`` in one transaction on the store at ``url``."""
    from statifier.sql.engines import sync_engine

    engine = sync_engine(url)
    try:
        with engine.begin() as connection:
            return work(connection)
    finally:
        engine.dispose()
