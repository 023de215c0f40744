"""Moving a range of buckets between stores (statifier.sql.moves) on both databases:
every per-key table's rows of the range, and only those, go (a location to its address
as the target keys it, a chart copied where missing), in their key order; a write to
the source during the move is refused and nothing is deleted; a move cut short is
finished by running it again, without a second copy, once the target is marked
``moving``; a target not so marked keeps every row it holds."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    SqlStore,
    postgresql_shards,
    sqlite_shards,
)

from statifier.buckets import address_bucket, bucket_of
from statifier.ids import new_execution_id
from statifier.persistence.records import PositionRecord
from statifier.persistence.sql import SqlAdapter
from statifier.sql import moves
from statifier.sql.caps import CapTable, HeldCreateRow
from statifier.sql.locations import upgrade_locations
from statifier.sql.moves import CopyMismatch, SourceChanged, move_range, moved_tables
from statifier.sql.places import resharding, write_place
from statifier.sql.tables import define_locations

NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)
SCOPE, DOCUMENT = "s", "d"


@pytest.fixture(params=["sqlite", "postgresql"])
def two(request: pytest.FixtureRequest) -> tuple[SqlStore, SqlStore]:
    """Two emptied stores of each backend, with their location tables."""
    stores: list[SqlStore] = request.getfixturevalue(f"{request.param}_shards")
    for store in stores[:2]:
        upgrade_locations(store.url, store.tables)
        store.empty()
        store.run(partial(_delete, define_locations(store.tables)))
    return stores[0], stores[1]


def _delete(table: sa.Table, connection: sa.Connection) -> None:
    connection.execute(table.delete())


def _filled(table: sa.Table, tag: str, **given: Any) -> dict[str, Any]:
    """A row of ``table``: ``given``, and a plain value of its type for every other
    required column (text: ``tag``, so that two families' rows stay apart)."""
    row = dict(given)
    for column in table.columns:
        if column.name in row or column.name == "id" or column.nullable:
            continue
        kind = column.type
        if isinstance(kind, sa.Integer):
            row[column.name] = 0
        elif isinstance(kind, sa.LargeBinary):
            row[column.name] = b"blob"
        elif isinstance(kind, sa.Boolean):
            row[column.name] = False
        elif isinstance(kind, sa.JSON):
            row[column.name] = {}
        elif column.name.endswith("_at"):
            row[column.name] = NOW
        else:
            row[column.name] = tag
    return row


def _family(store: SqlStore, key: str) -> str:
    """One of every per-key row for the address ``key`` and the execution minted for
    it (with a child), all in the address's bucket; answers the execution's id."""
    t = store.tables
    execution = new_execution_id(SCOPE, DOCUMENT, key)
    child = f"{execution}/child"
    bucket = address_bucket(SCOPE, DOCUMENT, key)
    position = next(f"{key}-p{n}" for n in range(100_000) if bucket_of(f"{key}-p{n}") == bucket)
    address = {"scope": SCOPE, "document": DOCUMENT, "key": key}
    by_execution = {"execution_id": execution}

    def write(connection: sa.Connection) -> None:
        def add(table: sa.Table, **given: Any) -> Any:
            values = _filled(table, key, **given)
            made = connection.execute(table.insert().values(values)).inserted_primary_key
            assert made is not None
            return made[0]

        add(t.charts, content_hash=f"h-{key}", name="counter", chart_blob=b"<scxml/>")
        for each in (execution, child):
            add(
                t.executions,
                execution_id=each,
                content_hash=f"h-{key}",
                bucket=bucket,
                status="active",
            )
        for table in (t.inputs, t.step_errors, t.held_events, t.active_slots):
            add(table, **by_execution)
        add(t.subscriptions, invoke_id="i", **by_execution)
        add(t.child_answers, child_id=child, parent_id=execution, content_hash=f"h-{key}")
        add(t.fan_out_ends, parent_id=execution, invoke_id="fan")
        address_id = add(t.addresses, execution_id=execution, bucket=bucket, **address)
        add(define_locations(t), address_id=address_id, token_hash=f"t-{key}", **by_execution)
        for table in (t.dedupe, t.routing_ledger, t.timers, t.outbox):
            add(table, bucket=bucket)
        add(t.flow_groups, binding_id="b", scope=SCOPE, key=key, bucket=bucket)
        add(t.flow_events, binding_id="b", scope=SCOPE, key=key, seq=1)
        add(t.held_creates, seq=1, bucket=bucket, **address)
        add(t.positions, key=position, content_hash=f"h-{key}", bucket=bucket)

    store.run(write)
    return execution


def _counts(store: SqlStore) -> dict[str, int]:
    t = store.tables
    named = {name: getattr(t, name, None) for name in moved_tables()}
    named["locations"] = define_locations(t)

    def count(connection: sa.Connection) -> dict[str, int]:
        return {
            name: connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for name, table in named.items()
            if table is not None
        }

    counted: dict[str, int] = store.run(count)
    return counted


def _two_keys() -> tuple[str, str, int]:
    """Two keys whose buckets differ; the first one's bucket."""
    first = "k0"
    other = next(f"k{n}" for n in range(1, 100) if _bucket(f"k{n}") != _bucket(first))
    return first, other, _bucket(first)


def _bucket(key: str) -> int:
    return address_bucket(SCOPE, DOCUMENT, key)


def _move(source: SqlStore, target: SqlStore, buckets: tuple[int, int], **more: Any) -> moves.Moved:
    return move_range(
        source.url,
        target.url,
        buckets,
        options=source.tables.options,
        target_options=target.tables.options,
        **more,
    )


def _mark_moving(store: SqlStore, reshard: str | None = None) -> None:
    """Record that a reshard (``reshard``) moves buckets to ``store``, as ``statifier
    reshard`` does before its first move: only then is a target's copy of a part
    replaced."""
    options = store.tables.options
    store.run(lambda c: write_place(c, options, resharding(None, 1, reshard), NOW))


class KilledError(Exception):
    """The process ends here."""


ONE = dict.fromkeys(moved_tables(), 1) | {"executions": 2}
"""A family's rows by table: one each, two executions (the parent and its child)."""


def test_every_per_key_table_moves_its_rows_of_the_range_and_only_those(
    two: tuple[SqlStore, SqlStore],
) -> None:
    source, target = two
    moving, staying, bucket = _two_keys()
    execution = _family(source, moving)
    _family(source, staying)
    moved = _move(source, target, (bucket, bucket + 1))
    assert moved.rows == ONE
    assert moved.charts == 1
    assert _counts(target) == ONE
    assert _counts(source) == ONE  # the other family's
    # The location names its address as the target keys it.
    t = target.tables
    locations = define_locations(t)

    def linked(connection: sa.Connection) -> list[Any]:
        joined = sa.select(t.addresses.c.key).join(
            locations, locations.c.address_id == t.addresses.c.id
        )
        return list(connection.execute(joined.where(locations.c.execution_id == execution)))

    assert [row.key for row in target.run(linked)] == [moving]
    assert _move(source, target, (bucket, bucket + 1)).rows == {}  # nothing left there
    with pytest.raises(ValueError, match="same tables"):
        _move(source, source, (0, 1))
    with pytest.raises(ValueError, match="buckets is a range"):
        _move(source, target, (5, 5))


def test_a_write_to_the_source_during_the_move_is_refused_and_deletes_nothing(
    two: tuple[SqlStore, SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = two
    moving, _, bucket = _two_keys()
    execution = _family(source, moving)
    locked = moves._lock
    executions = source.tables.executions

    def write_then_lock(connection: sa.Connection, side: Any) -> None:
        # Another process steps the execution between the copy and the delete.
        source.run(
            lambda c: c.execute(
                executions.update()
                .where(executions.c.execution_id == execution)
                .values(status="failed")
            ),
        )
        locked(connection, side)

    monkeypatch.setattr(moves, "_lock", write_then_lock)
    _mark_moving(target)
    with pytest.raises(SourceChanged, match="stop every process"):
        _move(source, target, (bucket, bucket + 1))
    assert _counts(source) == ONE  # nothing deleted
    monkeypatch.setattr(moves, "_lock", locked)
    assert _move(source, target, (bucket, bucket + 1)).rows == ONE
    assert _counts(target) == ONE  # the earlier copy replaced, not doubled

    def statuses(connection: sa.Connection) -> list[str]:
        t = target.tables.executions
        return sorted(connection.execute(sa.select(t.c.status)).scalars())

    assert target.run(statuses) == ["active", "failed"]


def test_a_move_cut_short_after_its_copy_is_finished_by_running_it_again(
    two: tuple[SqlStore, SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = two
    moving, _, _ = _two_keys()
    _family(source, moving)
    locked = moves._lock

    def killed(connection: sa.Connection, side: Any) -> None:
        raise KilledError

    monkeypatch.setattr(moves, "_lock", killed)
    with pytest.raises(KilledError):
        _move(source, target, (0, 1024))
    assert _counts(target) == ONE
    assert _counts(source) == ONE
    monkeypatch.setattr(moves, "_lock", locked)
    # The copy left behind is told from rows of the target's own by its record alone.
    with pytest.raises(moves.TargetNotEmpty, match="nothing was deleted on either side"):
        _move(source, target, (0, 1024))
    assert (_counts(target), _counts(source)) == (ONE, ONE)
    _mark_moving(target, "grow")
    assert _move(source, target, (0, 1024), reshard="grow").rows == ONE
    assert _counts(target) == ONE
    assert _counts(source) == dict.fromkeys(ONE, 0)


def test_a_copy_that_differs_from_the_source_deletes_nothing_there(
    two: tuple[SqlStore, SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = two
    moving, _, bucket = _two_keys()
    _family(source, moving)
    inserted = moves._insert

    def lossy(connection: sa.Connection, side: Any, rows: Any) -> None:
        inserted(connection, side, {**rows, "inputs": []})

    monkeypatch.setattr(moves, "_insert", lossy)
    with pytest.raises(CopyMismatch, match="nothing was deleted"):
        _move(source, target, (bucket, bucket + 1))
    assert _counts(source) == ONE


@pytest.mark.asyncio
async def test_a_saved_position_and_a_held_create_are_written_with_the_bucket_they_move_by(
    two: tuple[SqlStore, SqlStore],
) -> None:
    source, _ = two
    async with SqlAdapter(source.url, source.tables) as adapter:
        await adapter.save_position(
            PositionRecord("session-7", content_hash="h", position=b"p", saved_at=NOW)
        )
        held = HeldCreateRow(
            document=DOCUMENT,
            scope=SCOPE,
            key="k-7",
            binding_id="b",
            create_mode="always",
            on_error=None,
            message_id="m",
            source=None,
            event_blob=b"e",
            arrived_at=NOW,
        )
        async with adapter.transaction() as tx:
            await CapTable(adapter.tables, adapter.dialect).hold(tx.driver, held)
    t = source.tables

    def buckets(connection: sa.Connection) -> tuple[list[Any], list[Any]]:
        positions = connection.execute(sa.select(t.positions.c.key, t.positions.c.bucket))
        creates = connection.execute(sa.select(t.held_creates.c.key, t.held_creates.c.bucket))
        return list(positions), list(creates)

    positions, creates = source.run(buckets)
    assert [tuple(row) for row in positions] == [("session-7", bucket_of("session-7"))]
    assert [tuple(row) for row in creates] == [("k-7", address_bucket(SCOPE, DOCUMENT, "k-7"))]


def test_a_target_not_marked_moving_keeps_every_row_it_holds(
    two: tuple[SqlStore, SqlStore],
) -> None:
    """A store of its own (no record: a library host's, say) that holds rows of the
    range is refused, and so is one moving for another reshard: their rows may be
    their own, not an earlier copy. Nothing is deleted on either side."""
    source, target = two
    moving, _, bucket = _two_keys()
    _family(source, moving)
    _family(target, moving)  # the target's own execution at the same address's bucket
    with pytest.raises(moves.TargetNotEmpty, match="nothing was deleted on either side"):
        _move(source, target, (bucket, bucket + 1))
    assert (_counts(source), _counts(target)) == (ONE, ONE)
    _mark_moving(target, "another")
    with pytest.raises(moves.TargetNotEmpty):
        _move(source, target, (bucket, bucket + 1), reshard="this one")
    assert (_counts(source), _counts(target)) == (ONE, ONE)


def test_a_target_without_rows_of_the_range_takes_them_marked_or_not(
    two: tuple[SqlStore, SqlStore],
) -> None:
    source, target = two
    moving, staying, bucket = _two_keys()
    _family(source, moving)
    _family(target, staying)  # rows of another bucket stay where they are
    assert _move(source, target, (bucket, bucket + 1)).rows == ONE
    assert _counts(target) == {name: 2 * count for name, count in ONE.items()}


def test_a_store_says_whether_it_holds_rows_of_a_range(
    two: tuple[SqlStore, SqlStore],
) -> None:
    source, _ = two
    moving, _, bucket = _two_keys()
    options = source.tables.options

    def holds(*buckets: tuple[int, int]) -> bool:
        held: bool = source.run(lambda c: moves.holds_rows(c, options, buckets))
        return held

    assert not holds((0, 1024))
    _family(source, moving)
    assert holds((0, 1024))
    assert holds((bucket, bucket + 1))
    assert holds((0, 1), (bucket, bucket + 1))
    assert not holds((0, bucket), (bucket + 1, 1024))
    assert not holds()


def _names_in_key_order(store: SqlStore) -> list[str]:
    t = store.tables.step_errors

    def names(connection: sa.Connection) -> list[str]:
        return list(connection.execute(sa.select(t.c.name).order_by(t.c.id)).scalars())

    found: list[str] = store.run(names)
    return found


def test_moved_rows_keep_their_key_order(two: tuple[SqlStore, SqlStore]) -> None:
    """An execution's errors are read by key (its newest 20, say), so a moved part's
    rows get their new keys in the order of their old ones."""
    source, target = two
    first, other, _ = _two_keys()
    executions = [_family(source, first), _family(source, other)]
    t = source.tables.step_errors

    def write(connection: sa.Connection) -> None:
        for n in range(3):
            for execution in executions:
                values = _filled(t, "error", execution_id=execution, name=f"{execution} {n}")
                connection.execute(t.insert().values(values))
        # PostgreSQL writes a changed row anew, after the others, and SQLite reads these
        # rows by execution (their index): neither reads them in key order unasked.
        changed = t.c.name == f"{executions[0]} 0"
        connection.execute(t.update().where(changed).values(taken=True))

    source.run(write)
    before = _names_in_key_order(source)
    _move(source, target, (0, 1024), step=1024)  # one part holds both
    assert _names_in_key_order(target) == before
