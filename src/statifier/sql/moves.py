"""Moving a range of buckets from one store to another while no process writes to
either (decision 0126): how a deployment grows from K stores to more, or shrinks.

A store holds whole ranges of the 1,024 buckets (:mod:`statifier.buckets`); every row
that belongs to a key falls in one. :func:`move_range` copies the rows of a range from
the *source* store to the *target* store, checks the copy, then deletes them at the
source, a few buckets at a time (``step``), each part in three transactions:

1. the source's rows of the part are written at the target, in one transaction on
   the target, in their key order (so where the target's database makes the keys, the
   new keys of a part's rows, and so of an execution's, follow the source's order);
   the target's rows of the part, if it holds any, are replaced, on the terms below, and the
   commit waits until the rows are on the target's disk (PostgreSQL's
   ``synchronous_commit`` on for it: a commit acknowledged before it is written is
   lost if the server stops at once, and the source is about to delete its rows);
2. the target's rows are read back and compared with the source's (a digest of every
   row, keys aside): a difference raises :class:`CopyMismatch` and deletes nothing;
3. in one transaction on the source, with its tables locked against writers
   (PostgreSQL; SQLite's single writer does the same), the rows are read again and
   compared with what was copied (a difference raises :class:`SourceChanged`: a
   process wrote meanwhile), then deleted.

A part whose rows the source no longer holds is skipped, so a move cut short anywhere
(a crash, a refusal) is finished by running it again.

A target never loses a row it held before, other than an earlier copy of the same
part. Rows cannot say where they came from, so the target's record
(:mod:`statifier.sql.places`) says it: the target's rows of a part are replaced only
while its record says ``moving`` (for the reshard ``move_range`` is given, when it is
given one). ``statifier reshard`` marks a store ``moving`` only once it found the store
held no row of the buckets it is to receive (:func:`holds_rows`), so what such a store
holds there was copied by that reshard. A target not so marked that holds rows of a
part is refused with :class:`TargetNotEmpty`, and nothing is deleted on either side:
a store of its own (one without a record, as a library host's may be) keeps every row.
A caller that runs :func:`move_range` itself and runs it again after a crash marks the
target ``moving`` first (:func:`statifier.sql.places.write_place`,
:func:`~statifier.sql.places.resharding`).

What moves, by the bucket of each row:

- by their own ``bucket`` column: executions, addresses, dedupe claims, ledger rows,
  timers, outbox rows, flow groups, events held by a cap (their address's bucket) and
  saved positions (their key's);
- with their execution (whose bucket is its root's): input logs, step errors, held
  events, subscriptions, active slots, and, with the parent they are owed to, child
  answers and fan-out ends (a child falls in its root's bucket); a BasicHTTP location
  with its address, a flow group's events with their group;
- charts are copied where the target lacks them, and stay at the source.

What is not per key stays where it is: the inbound-events table and its consumers'
positions, leases, members and dead letters, schedules, bulk runs, the console audit
and lock rows.

Every row is read into memory for its part: a smaller ``step`` bounds that.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import sqlalchemy as sa

from statifier.buckets import bucket_range
from statifier.sql.engines import is_busy, sync_engine
from statifier.sql.places import Place, read_place, store_identity
from statifier.sql.tables import TableOptions, define_locations

__all__ = [
    "CopyMismatch",
    "Moved",
    "SourceChanged",
    "TargetNotEmpty",
    "check_move",
    "holds_rows",
    "move_range",
    "moved_tables",
]

_BY_BUCKET: Final = (
    "executions",
    "addresses",
    "dedupe",
    "routing_ledger",
    "timers",
    "outbox",
    "flow_groups",
    "held_creates",
    "positions",
)
"""The tables whose rows carry their bucket."""

_BY_EXECUTION: Final = {
    "inputs": "execution_id",
    "step_errors": "execution_id",
    "held_events": "execution_id",
    "subscriptions": "execution_id",
    "active_slots": "execution_id",
    "child_answers": "parent_id",
    "fan_out_ends": "parent_id",
}
"""The tables whose rows go with an execution, and the column naming it."""

_INSERT_ORDER: Final = (
    *_BY_BUCKET,
    *_BY_EXECUTION,
    "flow_events",
    "locations",  # references its address
)
_DELETE_ORDER: Final = tuple(reversed(_INSERT_ORDER))
_CHARTED: Final = ("executions", "child_answers", "positions")
"""The tables whose rows name a chart by its content hash."""


class CopyMismatch(RuntimeError):  # noqa: N818 - names what was found
    """The target's rows of a part of the range, read back after the copy, are not
    the source's. Nothing was deleted at the source."""


class SourceChanged(RuntimeError):  # noqa: N818 - names what was found
    """The source's rows of a part of the range changed between the copy and the
    delete: a process wrote to the source during the move. Nothing was deleted at the
    source; stop every process that writes to it and run the move again (the target's
    copy of the part is replaced)."""


class TargetNotEmpty(RuntimeError):  # noqa: N818 - names what was found
    """The target holds rows of a part of the range and its record does not say a
    reshard is moving buckets to it (``moving``, for the reshard given): they may be
    rows of its own, not an earlier copy, so nothing was deleted on either side."""


@dataclass(frozen=True, slots=True)
class Moved:
    """What :func:`move_range` moved.

    Attributes:
        buckets: the range ``(start, end)``, ``end`` excluded.
        rows: rows deleted at the source and written at the target, by table
            (unprefixed), for the tables where any moved.
        charts: charts copied to the target (it lacked them).
    """

    buckets: tuple[int, int]
    rows: Mapping[str, int]
    charts: int

    @property
    def total(self) -> int:
        """Every row moved, charts aside."""
        return sum(self.rows.values())


def moved_tables() -> tuple[str, ...]:
    """The tables (unprefixed) whose rows :func:`move_range` moves, in the order it
    writes them.

    >>> moved_tables()[:3]
    ('executions', 'addresses', 'dedupe')
    """
    return _INSERT_ORDER


def move_range(
    source: str,
    target: str,
    buckets: tuple[int, int],
    *,
    options: TableOptions,
    target_options: TableOptions | None = None,
    step: int = 16,
    reshard: str | None = None,
) -> Moved:
    """Move the rows of ``buckets`` (``(start, end)``, ``end`` excluded) from the
    store at ``source`` to the store at ``target`` (database URLs; the tables under
    ``options``, at the target under ``target_options`` if given; both migrated to the
    package's revision), ``step`` buckets at a time, as the module says. No process may
    write to either store meanwhile. The target's rows of a part are replaced only
    while its record says ``moving`` (for the reshard named ``reshard``, when given:
    :func:`statifier.sql.places.reshard_name`); parts moved before a refusal stay
    moved.

    Raises:
        ValueError: ``buckets`` is not a range of buckets, ``step`` is below 1, or
            :func:`check_move` refuses the stores.
        TargetNotEmpty: the target holds rows of a part and is not marked ``moving``
            (for ``reshard``).
        CopyMismatch: a part's copy differs from the source's rows.
        SourceChanged: a process wrote to the source during the move.
    """
    start, end = bucket_range(buckets)
    if step < 1:
        raise ValueError(f"step is a positive number of buckets, not {step!r}")
    to_options = options if target_options is None else target_options
    counted: dict[str, int] = {}
    charts = 0
    with _Side.open(source, options) as origin, _Side.open(target, to_options) as destination:
        _refuse(origin, destination)
        replace = _moving(destination.record, reshard)
        for first in range(start, end, step):
            part = (first, min(first + step, end))
            moved, copied = _move_part(origin, destination, part, replace=replace)
            charts += copied
            for name, count in moved.items():
                counted[name] = counted.get(name, 0) + count
    return Moved(buckets, {name: n for name, n in counted.items() if n}, charts)


def check_move(
    source: str,
    target: str,
    *,
    options: TableOptions,
    target_options: TableOptions | None = None,
) -> None:
    """Refuse what :func:`move_range` refuses of the stores at ``source`` and
    ``target`` before it moves a row, with the same arguments, and move nothing: so a
    caller that marks the stores first (``statifier reshard``) finds a refusal before
    it marks them.

    Raises:
        ValueError: ``source`` and ``target`` are the same tables, or the source has
            BasicHTTP locations and the target no table for them.
    """
    to_options = options if target_options is None else target_options
    with _Side.open(source, options) as origin, _Side.open(target, to_options) as destination:
        _refuse(origin, destination)


def holds_rows(
    connection: sa.Connection, options: TableOptions, buckets: Sequence[tuple[int, int]]
) -> bool:
    """Whether the store ``connection`` reaches (its tables under ``options``) holds a
    row of a key in any of the ranges ``buckets`` (each ``(start, end)``, ``end``
    excluded). Only the tables whose rows carry their bucket are read: every other
    moved row goes with one of theirs."""
    tables = options.define()
    for name in _BY_BUCKET:
        table: sa.Table = getattr(tables, name)
        for start, end in buckets:
            # A range of the bucket column: read by its index, and stopped at one row.
            within = table.c.bucket.between(start, end - 1)
            found = sa.select(sa.literal(1)).select_from(table).where(within)
            if connection.execute(found.limit(1)).first() is not None:
                return True
    return False


def _refuse(origin: _Side, destination: _Side) -> None:
    """Raise ValueError where a move from ``origin`` to ``destination`` cannot be."""
    if origin.identity == destination.identity:
        # Told apart by what they hold, not by their URLs: two URLs may reach one.
        raise ValueError(
            "the source and the target are the same tables (or one is a copy of the other)"
        )
    if "locations" in origin.by_name and "locations" not in destination.by_name:
        raise ValueError(
            "the source has BasicHTTP locations and the target no table for them: "
            "build it first (statifier.sql.locations.upgrade_locations)"
        )


def _moving(record: Place | None, reshard: str | None) -> bool:
    """Whether ``record`` says a reshard moves buckets to its store: the one named
    ``reshard``, when given. Only then are its rows of a part taken for an earlier
    copy of it."""
    if record is None or record.state != "moving":
        return False
    return reshard is None or record.reshard == reshard


@dataclass(frozen=True, slots=True)
class _Side:
    """One store of a move: its engine, the tables a move reads by unprefixed name
    (the locations table where the store has it), how a new row gets its key, the
    name it is known by and its place record as the move began."""

    engine: sa.Engine
    by_name: Mapping[str, sa.Table]
    charts: sa.Table
    new_key: Any
    identity: str
    record: Place | None

    @classmethod
    @contextmanager
    def open(cls, url: str, options: TableOptions) -> Iterator[_Side]:
        engine = sync_engine(url)
        try:
            tables = options.define()
            by_name = {name: getattr(tables, name) for name in _INSERT_ORDER if name != "locations"}
            locations = define_locations(tables)
            if sa.inspect(engine).has_table(locations.name, locations.schema):
                by_name["locations"] = locations
            with engine.begin() as connection:
                identity = store_identity(connection, options)
                record = read_place(connection, options)
            yield cls(engine, by_name, tables.charts, options.new_key, identity, record)
        finally:
            engine.dispose()


_Rows = dict[str, list[tuple[Any, dict[str, Any]]]]
"""Each table's rows of a part: its key, and its other columns by name."""


def _move_part(
    source: _Side, target: _Side, part: tuple[int, int], *, replace: bool
) -> tuple[dict[str, int], int]:
    """Move ``part``'s rows, the target's rows of it replaced only when ``replace``
    (they are an earlier copy); the rows moved by table, and the charts copied."""
    with source.engine.connect() as connection:
        rows = _read(connection, source, part)
        if not any(rows.values()):
            return {}, 0
        charts = _charts(connection, source, rows)
    copied = _digest(rows)
    with target.engine.begin() as connection:
        # The source deletes the part once this commit is acknowledged: it must be on
        # the target's disk by then, whatever the server's default says.
        _durable(connection)
        held = _read(connection, target, part)
        if not replace and any(held.values()):
            raise TargetNotEmpty(
                f"buckets {part[0]} to {part[1] - 1}: the target holds rows of them and is "
                "not marked moving for this move, so they may be its own, not an earlier "
                "copy; nothing was deleted on either side"
            )
        _delete(connection, target, held)
        added = _add_charts(connection, target, charts)
        _insert(connection, target, rows)
    with target.engine.connect() as connection:
        if _digest(_read(connection, target, part)) != copied:
            raise CopyMismatch(
                f"buckets {part[0]} to {part[1] - 1}: the target's rows, read back, are not "
                "the source's; nothing was deleted at the source"
            )
    try:
        with source.engine.begin() as connection:
            _lock(connection, source)
            again = _read(connection, source, part)
            if _digest(again) != copied:
                raise SourceChanged(_changed(part))
            _delete(connection, source, again)
    except sa.exc.OperationalError as error:
        if is_busy(error):  # SQLite: another connection wrote since this one read
            raise SourceChanged(_changed(part)) from error
        raise
    return {name: len(found) for name, found in rows.items()}, added


def _changed(part: tuple[int, int]) -> str:
    return (
        f"buckets {part[0]} to {part[1] - 1}: the source's rows changed during the move "
        "(a process wrote to it); nothing was deleted there: stop every process that "
        "writes to the stores and run the move again"
    )


def _read(connection: sa.Connection, side: _Side, part: tuple[int, int]) -> _Rows:
    """Every moved table's rows of ``part`` in ``side``'s tables, each table's in key
    order: they are written in the order read, and reads such as an execution's newest
    errors go by key."""
    start, end = part
    tables = side.by_name
    executions, addresses, groups = (
        tables["executions"],
        tables["addresses"],
        tables["flow_groups"],
    )

    def within(table: sa.Table) -> Any:
        return table.c.bucket.between(start, end - 1)

    of_part = sa.select(executions.c.execution_id).where(within(executions))
    found: _Rows = {}
    for name, table in tables.items():
        if name in _BY_BUCKET:
            where: Any = within(table)
        elif name in _BY_EXECUTION:
            where = table.c[_BY_EXECUTION[name]].in_(of_part)
        elif name == "locations":
            where = table.c.address_id.in_(sa.select(addresses.c.id).where(within(addresses)))
        else:  # a flow group's events, with their group
            where = sa.exists().where(
                groups.c.binding_id == table.c.binding_id,
                groups.c.scope == table.c.scope,
                groups.c.key == table.c.key,
                within(groups),
            )
        found[name] = [
            (row.id, {k: v for k, v in row._mapping.items() if k != "id"})
            for row in connection.execute(sa.select(table).where(where).order_by(table.c.id))
        ]
    return found


def _digest(rows: _Rows) -> str:
    """A digest of ``rows`` that two databases agree on for the same rows: keys (and a
    location's reference to its address's key) aside, each table's rows in any order,
    a table not there as one without rows."""
    digest = hashlib.sha256()
    for name in _INSERT_ORDER:
        plain = sorted(
            json.dumps(
                {k: _plain(v) for k, v in row.items() if k != "address_id"},
                sort_keys=True,
            )
            for _, row in rows.get(name, [])
        )
        digest.update(json.dumps([name, plain]).encode())
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping | list | str | int | float | bool) or value is None:
        return value
    return str(value)


def _charts(connection: sa.Connection, side: _Side, rows: _Rows) -> list[dict[str, Any]]:
    """The charts ``rows`` name, as rows of the charts table without their keys."""
    hashes = sorted({row["content_hash"] for name in _CHARTED for _, row in rows.get(name, [])})
    if not hashes:
        return []
    charts = side.charts
    found = connection.execute(sa.select(charts).where(charts.c.content_hash.in_(hashes)))
    return [{k: v for k, v in row._mapping.items() if k != "id"} for row in found]


def _add_charts(connection: sa.Connection, side: _Side, charts: Sequence[dict[str, Any]]) -> int:
    """Insert those of ``charts`` the target lacks; how many."""
    table = side.charts
    hashes = [chart["content_hash"] for chart in charts]
    have = set(
        connection.execute(
            sa.select(table.c.content_hash).where(table.c.content_hash.in_(hashes))
        ).scalars()
    )
    missing = [chart for chart in charts if chart["content_hash"] not in have]
    if missing:
        connection.execute(table.insert(), [_keyed(side, chart) for chart in missing])
    return len(missing)


def _keyed(side: _Side, row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` to insert: with a new key where the client makes keys, else without
    one (the database makes it)."""
    return dict(row) if side.new_key is None else {"id": side.new_key(), **row}


def _insert(connection: sa.Connection, side: _Side, rows: _Rows) -> None:
    for name in _INSERT_ORDER:
        found = rows.get(name)
        if not found:
            continue
        table = side.by_name[name]
        values = [_keyed(side, row) for _, row in found]
        if name == "locations":
            values = _to_addresses(connection, side, rows, values)
        connection.execute(table.insert(), values)


def _to_addresses(
    connection: sa.Connection, side: _Side, rows: _Rows, locations: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``locations`` with ``address_id`` the key of their address as the target made
    it (the address row was copied before, under a key of the target's)."""
    where = dict(rows["addresses"])
    addresses = side.by_name["addresses"]
    for location in locations:
        named = where[location["address_id"]]
        location["address_id"] = connection.execute(
            sa.select(addresses.c.id).where(
                addresses.c.scope == named["scope"],
                addresses.c.document == named["document"],
                addresses.c.key == named["key"],
            )
        ).scalar_one()
    return locations


def _delete(connection: sa.Connection, side: _Side, rows: _Rows) -> None:
    for name in _DELETE_ORDER:
        found = rows.get(name)
        if not found:
            continue
        table = side.by_name[name]
        keys = [key for key, _ in found]
        for first in range(0, len(keys), 500):
            connection.execute(table.delete().where(table.c.id.in_(keys[first : first + 500])))


def _durable(connection: sa.Connection) -> None:
    """Make the commit of ``connection``'s transaction wait until its rows are written
    to the write-ahead log (PostgreSQL: ``synchronous_commit`` on for this transaction,
    whatever the server, database or role default). With ``synchronous_commit = off``
    a commit is acknowledged before it is written, and a server that stops in the next
    moments (a crash, ``pg_ctl stop -m immediate``) comes back without it: the source,
    told the copy is there, would have deleted the only rows left. SQLite's commit is
    written before it returns (WAL)."""
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SET LOCAL synchronous_commit TO on"))


def _lock(connection: sa.Connection, side: _Side) -> None:
    """Keep every writer out of the moved tables until the transaction ends (on
    PostgreSQL; SQLite's writer is one, and this transaction's first write fails if
    another wrote since it read)."""
    if connection.dialect.name != "postgresql":
        return
    names = ", ".join(
        f'"{table.schema}"."{table.name}"' if table.schema else f'"{table.name}"'
        for table in side.by_name.values()
    )
    connection.execute(sa.text(f"LOCK TABLE {names} IN SHARE MODE"))
