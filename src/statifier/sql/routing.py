"""The statements of the router's tables: the dedupe claims (``dedupe``), the
addresses (``addresses``, beside ``executions`` for the reaper), the routing ledger
(``routing_ledger``) and the events held for paused executions (``held_events``), and
the locks a delivery takes; and the rows they read and write (:class:`AddressRow`,
:class:`ReapRow`, :class:`LedgerRow`, :class:`HeldRow`), which the router exports as
its own.

:class:`RoutingStatements` writes them once for a set of tables and a dialect;
:class:`RoutingSession` runs them on the driver connection of one transaction. What a
row means (an outcome, a refusal, a horizon) is the router's
(:mod:`statifier.router`); here a row is its columns, times aware.

On PostgreSQL the unique indexes settle every race: a second claim of one message, or
a second address for one key, waits for the first transaction and then inserts
nothing. On SQLite the transaction holds the database's single write lock, so no race
reaches these statements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any, Final

from statifier.buckets import ALL_BUCKETS, address_bucket, ledger_bucket
from statifier.sql.dialect import Dialect, Values, execution_lock_key
from statifier.sql.keys import RowKeys
from statifier.sql.locks import locks_of
from statifier.sql.names import TableNames
from statifier.sql.postgres import (
    RESTORE_LOCK_TIMEOUT,
    SET_LOCK_TIMEOUT,
    lock_timeout,
)
from statifier.sql.ranges import ByRange, also, by_range
from statifier.sql.tables import Tables

__all__ = [
    "AddressRow",
    "HeldRow",
    "LedgerRow",
    "ReapRow",
    "RoutingSession",
    "RoutingStatements",
]

_LEDGER_COLUMNS: Final = (
    "binding_id",
    "message_id",
    "scope",
    "source",
    "outcome",
    "reason",
    "document",
    "key",
    "execution_id",
    "inserted_at",
)

_LEDGER_WRITTEN: Final = (*_LEDGER_COLUMNS, "bucket")
"""What a ledger row's insert writes: its columns and its bucket, which nothing reads
back (a function of the row: :func:`~statifier.buckets.ledger_bucket`)."""


_HELD_COLUMNS: Final = (
    "execution_id",
    "via",
    "internal",
    "scope",
    "message_id",
    "event_blob",
    "held_at",
    "on_error",
)


@dataclass(frozen=True, slots=True)
class HeldRow:
    """An event a paused execution was sent, kept until it resumes.

    Attributes:
        execution_id: the paused execution.
        via: how the event came (the input log's ``via`` when it is stepped).
        internal: whether it goes to the internal queue (a timer's internal event).
        scope: the scope its step's sends resolve in.
        message_id: the message it came as (``None`` for a timer's event).
        event_blob: the event as the input log stores it, through the storage's codec.
        held_at: when it was held.
        on_error: the error policy of the delivery that held it (``"continue"`` or
            ``"fail"``; ``None``: the router's), which its step on resume takes.
        id: the row's key (``None`` before the insert); the rows are read in the
            order they came, which their ``seq`` keeps.
    """

    execution_id: str
    _: KW_ONLY
    via: str
    internal: bool
    scope: str | None
    message_id: str | None
    event_blob: bytes
    held_at: datetime
    on_error: str | None = None
    id: Any = None


@dataclass(frozen=True, slots=True)
class AddressRow:
    """An address: which execution a (scope, document, key) names.

    Attributes:
        id: the row's surrogate key.
        execution_id: the execution the address names.
        terminal_seen_at: when the router first saw that execution ended, else ``None``.
    """

    id: Any
    _: KW_ONLY
    execution_id: str
    terminal_seen_at: datetime | None


@dataclass(frozen=True, slots=True)
class ReapRow:
    """An address as the reaper reads it, beside its execution's status (``None`` when
    the execution is gone)."""

    id: Any
    _: KW_ONLY
    document: str
    terminal_seen_at: datetime | None
    status: str | None
    bucket: int


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One routing-ledger row: what happened to one event on one binding, as the
    router writes it and as it is read back (``inserted_at`` aware, UTC).

    ``outcome`` is ``delivered``, ``created_and_delivered``, ``duplicate``,
    ``key_refused`` or ``dropped``; ``reason`` is the drop reason or the refusal.
    ``id`` is the table's key of a row read back where the reader asked for it (the
    console's pages), else ``None``; it takes no part in comparing rows. ``bucket``,
    given, files the row in that bucket instead of the one
    :func:`~statifier.buckets.ledger_bucket` picks (a send refused in another store
    than its sender's: the target address's); never read back.
    """

    binding_id: str
    _: KW_ONLY
    message_id: str | None
    scope: str | None
    source: str | None
    outcome: str
    reason: str | None
    document: str | None
    key: str | None
    execution_id: str | None
    inserted_at: datetime
    id: Any = field(default=None, compare=False, repr=False)
    bucket: int | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, columns: Mapping[str, Any]) -> LedgerRow:
        """The row of the ledger's ``columns`` by name (``inserted_at`` aware), with
        the table's key ``id`` when ``columns`` holds it; other columns are left out."""
        return cls(**{name: columns[name] for name in _LEDGER_COLUMNS}, id=columns.get("id"))

    @property
    def spelled(self) -> str:
        """The outcome as the scenario report spells it (``dropped: finished``)."""
        if self.outcome == "dropped":
            return f"dropped: {self.reason}"
        return self.outcome


class RoutingStatements:
    """The router's statements on one set of tables and one database, made once (a
    router configuration holds them).

    Args:
        tables: the tables the migrations built (names them, and says whether keys
            are made by the client).
        dialect: the database's dialect (``SqlAdapter.dialect``).
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        keys = RowKeys.of(tables, dialect)
        self.keyed = keys.keyed
        """``values`` for an insert, with the row's key where the client makes keys
        (:meth:`RowKeys.keyed`)."""
        names = TableNames.of(tables)
        dedupe, addresses = names.dedupe, names.addresses
        ledger, executions = names.routing_ledger, names.executions
        # One parameter holds a list: an array on PostgreSQL, a JSON list on SQLite.
        ids = dialect.among("ids")
        sql = dialect.statement
        # A claim inserts the message's row, or takes over an expired one (its expiry
        # and its bucket); it returns a row unless a live claim exists (a duplicate).
        take_over = (
            "ON CONFLICT (binding_id, message_id) DO UPDATE SET expires_at = "
            "excluded.expires_at, bucket = excluded.bucket WHERE d.expires_at <= :now"
        )
        claimed = ("binding_id", "message_id", "expires_at", "bucket")
        claim = f"{keys.insert(f'{dedupe} AS d', claimed)} {take_over} RETURNING 1"
        find_address = (
            f"SELECT id, execution_id, terminal_seen_at FROM {addresses} "
            "WHERE scope = :scope AND document = :document AND key = :key"
        )
        self.claim = sql(claim)
        self.find_address = sql(find_address)
        # The claim and the address lookup in one round trip where a WITH clause can
        # write: the lookup reads the address table only, so the claim's insert in the
        # same statement cannot hide anything from it. Elsewhere they are two
        # statements, and the lookup runs only for a fresh claim.
        self.claim_and_find = (
            sql(
                f"WITH claim AS ({claim}) SELECT EXISTS (SELECT 1 FROM claim), "
                "a.id, a.execution_id, a.terminal_seen_at FROM (VALUES (1)) AS one "
                f"LEFT JOIN {addresses} AS a ON a.scope = :scope "
                "AND a.document = :document AND a.key = :key"
            )
            if dialect.writes_in_with
            else None
        )
        # A batch's claims in one statement, and its addresses in another, whatever its
        # size (the rows come in one JSON parameter). Where the client makes keys, each
        # claim needs a key of its own: the batch claims one message at a time.
        asked = dialect.table_of(
            "asked",
            {
                "binding_id": "text",
                "message_id": "text",
                "expires_at": "timestamptz",
                "bucket": "integer",
            },
        )
        claiming = ", ".join(claimed)
        self.claim_many = (
            None
            if keys.new_key is not None
            else sql(
                f"INSERT INTO {dedupe} AS d ({claiming}) SELECT {claiming} FROM {asked} "
                f"WHERE true {take_over} RETURNING binding_id, message_id"
            )
        )
        keyed_by = dialect.table_of("asked", {"scope": "text", "document": "text", "key": "text"})
        self.find_addresses = sql(
            "SELECT a.scope, a.document, a.key, a.id, a.execution_id, a.terminal_seen_at "
            f"FROM {keyed_by} JOIN {addresses} AS a ON a.scope = r.scope "
            "AND a.document = r.document AND a.key = r.key"
        )
        address = ("scope", "document", "key", "execution_id", "inserted_at", "bucket")
        self.insert_address = sql(
            f"{keys.insert(addresses, address, {'inserted_at': ':now'})} "
            "ON CONFLICT (scope, document, key) DO NOTHING RETURNING id"
        )
        self.stamp = sql(
            f"UPDATE {addresses} SET terminal_seen_at = :now "
            f"WHERE id {ids} AND terminal_seen_at IS NULL"
        )
        self.record = sql(keys.insert(ledger, _LEDGER_WRITTEN))
        # A batch's ledger rows in one statement, in the order given (``n``). Where the
        # client makes keys, each row needs one of its own: one statement per row.
        ledger_rows = dialect.table_of(
            "rows",
            {"n": "integer"}
            | {name: "timestamptz" if name == "inserted_at" else "text" for name in _LEDGER_COLUMNS}
            | {"bucket": "integer"},
        )
        listed = ", ".join(_LEDGER_WRITTEN)
        self.record_many = (
            None
            if keys.new_key is not None
            else sql(
                f"INSERT INTO {ledger} ({listed}) SELECT {listed} FROM {ledger_rows} ORDER BY n"
            )
        )
        # The dedupe claims that expired, and the ledger rows written before a time.
        self.reap_dedupe, self.reap_dedupe_page = _reaping(sql, dedupe, "expires_at < :now")
        self.reap_ledger, self.reap_ledger_page = _reaping(sql, ledger, "inserted_at < :before")
        # The cursor is bound twice: as text where it is only compared with NULL (the
        # cast gives that parameter a type), and as it is where the key is compared.
        reaped = (
            "SELECT a.id, a.document, a.terminal_seen_at, e.status, a.bucket "
            f"FROM {addresses} AS a LEFT JOIN {executions} AS e "
            "ON e.execution_id = a.execution_id WHERE (CAST(:after AS TEXT) IS NULL OR "
        )
        # A range pages by (bucket, id), the index's order: never a scan of the others.
        self.reap_page = by_range(
            lambda within: sql(
                f"{reaped}a.id > :after_id) ORDER BY a.id LIMIT :limit"
                if not within
                else f"{reaped}(a.bucket, a.id) > (:after_bucket, :after_id)){also(within)} "
                "ORDER BY a.bucket, a.id LIMIT :limit"
            ),
            on="a",  # the executions joined have a bucket too
        )
        self.delete_addresses = sql(f"DELETE FROM {addresses} WHERE id {ids}")
        self.count_addresses = sql(f"SELECT count(*) FROM {addresses} WHERE execution_id {ids}")
        self.named_by = sql(
            f"SELECT execution_id FROM {addresses} WHERE scope = :scope "
            "AND document = :document ORDER BY inserted_at DESC, id DESC LIMIT 1"
        )
        self.address_of = sql(
            f"SELECT scope, document, key FROM {addresses} WHERE execution_id = :execution_id"
        )
        self.ledger = sql(
            f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM {ledger} "
            "WHERE CAST(:execution_id AS TEXT) IS NULL OR execution_id = :execution_id "
            "ORDER BY inserted_at, id"
        )
        held = names.held_events
        # The next seq of the execution's held events, read in the insert itself: the
        # caller holds the execution's lock, so no other insert of it runs meanwhile.
        next_seq = {"seq": "COALESCE(MAX(seq), 0) + 1"}
        self.hold = sql(
            f"{keys.insert(held, (*_HELD_COLUMNS, 'seq'), next_seq, select=True)} "
            f"FROM {held} WHERE execution_id = :execution_id"
        )
        self.held = sql(
            f"SELECT id, {', '.join(_HELD_COLUMNS)} FROM {held} "
            "WHERE execution_id = :execution_id ORDER BY seq"
        )
        self.count_held = sql(f"SELECT count(*) FROM {held} WHERE execution_id = :execution_id")
        self.drop_held = sql(f"DELETE FROM {held} WHERE execution_id = :execution_id")
        # Taken distinct and ascending (Locks.values), so that two transactions that
        # need the same keys take them in the same order and cannot deadlock. A bounded
        # wait sets lock_timeout for the lock statement alone and puts the
        # transaction's own back after it.
        self.locks = locks_of(tables, dialect)


class RoutingSession:
    """The router's statements on the driver connection of one transaction
    (``tx.driver``): every method runs in that transaction.

    Args:
        statements: the statements, made once for the tables and the database.
        driver: the transaction's driver connection.
    """

    __slots__ = ("_driver", "_s", "dialect")

    def __init__(self, statements: RoutingStatements, driver: Any) -> None:
        self._s = statements
        self._driver = driver
        self.dialect = statements.dialect

    async def lock(self, keys: Sequence[int], wait: float | None) -> bool:
        """Take ``keys`` (in any order: they are taken ascending) as locks held until
        the transaction ends, waiting at most ``wait`` seconds for them (``None``: as long as it
        takes); answer whether they were granted.

        Where rows are not locked (SQLite), the transaction already holds the single
        write lock: nothing is taken, and the answer is ``True``. After ``False`` the
        transaction must be rolled back (or rolled back to the savepoint the call runs
        in).
        """
        locks = self._s.locks
        if locks is None or not keys:
            return True
        return await self._take(locks.take, locks.values(keys), wait)

    async def lock_executions(self, execution_ids: Sequence[str], wait: float | None) -> bool:
        """Take the locks of ``execution_ids``, the ones their steps take, held until
        the transaction ends, in one statement and in one order every such statement
        shares; wait and answer as :meth:`lock`."""
        locks = self._s.locks
        if locks is None or not execution_ids:
            return True
        keys = map(execution_lock_key, execution_ids)  # the key each step takes
        return await self._take(locks.take, locks.values(keys), wait)

    async def _take(self, statement: str, values: Values, wait: float | None) -> bool:
        dialect, driver = self.dialect, self._driver
        if wait is None:
            await dialect.execute(driver, statement, values)
            return True
        row = await dialect.row(driver, SET_LOCK_TIMEOUT, {"t": lock_timeout(wait)})
        assert row is not None  # a SELECT without FROM returns one row
        try:
            await dialect.execute(driver, statement, values)
        except Exception as error:
            if not dialect.lock_not_granted(error):
                raise
            return False
        await dialect.execute(driver, RESTORE_LOCK_TIMEOUT, {"t": row[0]})
        return True

    async def claim(
        self, binding_id: str, message_id: str, now: datetime, expires_at: datetime, bucket: int
    ) -> bool:
        """Claim the message for the binding until ``expires_at``, in ``bucket`` (its
        delivery's address's); ``False``: a claim that has not expired at ``now``
        exists (a duplicate)."""
        dialect = self.dialect
        values = {
            "binding_id": binding_id,
            "message_id": message_id,
            "expires_at": dialect.time(expires_at),
            "now": dialect.time(now),
            "bucket": bucket,
        }
        return await dialect.row(self._driver, self._s.claim, self._s.keyed(values)) is not None

    async def claim_and_find(
        self,
        binding_id: str,
        message_id: str,
        now: datetime,
        expires_at: datetime,
        address: tuple[str, str, str] | None,
        bucket: int,
    ) -> tuple[bool, AddressRow | None]:
        """Claim the message for the binding in ``bucket`` as :meth:`claim` does
        (``False``: a live claim exists, a duplicate) and read ``address`` (scope,
        document, key), if one is asked for.

        The address of a duplicate may be left unread (``None``): a duplicate is
        delivered nowhere.
        """
        statement = self._s.claim_and_find
        if address is None or statement is None:
            fresh = await self.claim(binding_id, message_id, now, expires_at, bucket)
            if address is None or not fresh:
                return fresh, None
            return fresh, await self.find_address(*address)
        dialect = self.dialect
        scope, document, key = address
        values = {
            "binding_id": binding_id,
            "message_id": message_id,
            "expires_at": dialect.time(expires_at),
            "now": dialect.time(now),
            "scope": scope,
            "document": document,
            "key": key,
            "bucket": bucket,
        }
        row = await dialect.row(self._driver, statement, self._s.keyed(values))
        assert row is not None  # the statement returns one row, found or not
        fresh, address_id, execution_id, terminal_seen_at = row
        found = (
            None
            if address_id is None
            else AddressRow(
                address_id,
                execution_id=execution_id,
                terminal_seen_at=dialect.read_time(terminal_seen_at),
            )
        )
        return bool(fresh), found

    async def claim_many(
        self, claims: Sequence[tuple[str, str, datetime, int]], now: datetime
    ) -> set[tuple[str, str]]:
        """Claim each ``(binding_id, message_id, expires_at, bucket)`` of ``claims``
        (no pair twice) as :meth:`claim` does, in one statement; answer the pairs
        claimed (the others have a live claim: duplicates)."""
        statement = self._s.claim_many
        if statement is None:
            return {
                (binding_id, message_id)
                for binding_id, message_id, expires_at, bucket in claims
                if await self.claim(binding_id, message_id, now, expires_at, bucket)
            }
        if not claims:
            return set()
        dialect = self.dialect
        asked = dialect.tabled(
            {
                "binding_id": binding_id,
                "message_id": message_id,
                "expires_at": expires_at,
                "bucket": bucket,
            }
            for binding_id, message_id, expires_at, bucket in claims
        )
        rows = await dialect.rows(
            self._driver, statement, {"asked": asked, "now": dialect.time(now)}
        )
        return {(binding_id, message_id) for binding_id, message_id in rows}

    async def find_addresses(
        self, addresses: Sequence[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], AddressRow]:
        """The address rows of those of ``addresses`` (scope, document, key) that have
        one, in one statement."""
        if not addresses:
            return {}
        dialect = self.dialect
        asked = dialect.tabled(
            {"scope": scope, "document": document, "key": key} for scope, document, key in addresses
        )
        rows = await dialect.rows(self._driver, self._s.find_addresses, {"asked": asked})
        return {
            (scope, document, key): AddressRow(
                address_id,
                execution_id=execution_id,
                terminal_seen_at=dialect.read_time(terminal_seen_at),
            )
            for scope, document, key, address_id, execution_id, terminal_seen_at in rows
        }

    async def find_address(self, scope: str, document: str, key: str) -> AddressRow | None:
        """The address row of ``(scope, document, key)``, if there is one."""
        values = {"scope": scope, "document": document, "key": key}
        row = await self.dialect.row(self._driver, self._s.find_address, values)
        if row is None:
            return None
        return AddressRow(
            row[0], execution_id=row[1], terminal_seen_at=self.dialect.read_time(row[2])
        )

    async def insert_address(
        self, scope: str, document: str, key: str, execution_id: str, now: datetime
    ) -> Any:
        """Insert the address of ``(scope, document, key)`` naming ``execution_id``;
        answer its key, or ``None`` if the address exists (another transaction's insert
        won, and committed first)."""
        values = {
            "scope": scope,
            "document": document,
            "key": key,
            "execution_id": execution_id,
            "now": self.dialect.time(now),
            "bucket": address_bucket(scope, document, key),
        }
        row = await self.dialect.row(self._driver, self._s.insert_address, self._s.keyed(values))
        return None if row is None else row[0]

    async def stamp(self, address_ids: Sequence[Any], now: datetime) -> None:
        """Set ``terminal_seen_at`` to ``now`` on those of the addresses not yet
        stamped."""
        dialect = self.dialect
        values = {"ids": dialect.listed(address_ids), "now": dialect.time(now)}
        await dialect.execute(self._driver, self._s.stamp, values)

    def _ledger_values(self, row: LedgerRow) -> dict[str, Any]:
        values = _ledger_columns(row)
        values["inserted_at"] = self.dialect.time(row.inserted_at)
        return self._s.keyed(values)

    async def record(self, row: LedgerRow) -> None:
        """Insert ``row`` into the routing ledger."""
        await self.dialect.execute(self._driver, self._s.record, self._ledger_values(row))

    async def record_many(self, rows: Sequence[LedgerRow]) -> None:
        """Insert ``rows`` into the routing ledger, in order, in one statement."""
        if not rows:
            return
        statement = self._s.record_many
        if statement is None:  # the client makes the rows' keys
            values = [self._ledger_values(row) for row in rows]
            await self.dialect.execute_many(self._driver, self._s.record, values)
            return
        tabled = self.dialect.tabled(
            {"n": number} | _ledger_columns(row) for number, row in enumerate(rows)
        )
        await self.dialect.execute(self._driver, statement, {"rows": tabled})

    async def hold(self, row: HeldRow) -> None:
        """Insert ``row`` into the held events."""
        values = {
            "execution_id": row.execution_id,
            "via": row.via,
            "internal": row.internal,
            "scope": row.scope,
            "message_id": row.message_id,
            "event_blob": row.event_blob,
            "held_at": self.dialect.time(row.held_at),
            "on_error": row.on_error,
        }
        await self.dialect.execute(self._driver, self._s.hold, self._s.keyed(values))

    async def held(self, execution_id: str) -> list[HeldRow]:
        """The events held for ``execution_id``, in the order they came."""
        dialect = self.dialect
        rows = await dialect.rows(self._driver, self._s.held, {"execution_id": execution_id})
        held: list[HeldRow] = []
        for row in rows:
            held_at = dialect.read_time(row[7])
            assert held_at is not None  # the column is NOT NULL
            held.append(
                HeldRow(
                    row[1],
                    via=row[2],
                    internal=bool(row[3]),
                    scope=row[4],
                    message_id=row[5],
                    event_blob=bytes(row[6]),
                    held_at=held_at,
                    on_error=row[8],
                    id=row[0],
                )
            )
        return held

    async def count_held(self, execution_id: str) -> int:
        """How many events are held for ``execution_id``."""
        values = {"execution_id": execution_id}
        row = await self.dialect.row(self._driver, self._s.count_held, values)
        assert row is not None  # count(*) returns one row
        return int(row[0])

    async def drop_held(self, execution_id: str) -> int:
        """Delete the events held for ``execution_id``; answer how many."""
        values = {"execution_id": execution_id}
        return await self.dialect.execute(self._driver, self._s.drop_held, values)

    async def reap_dedupe(
        self, now: datetime, buckets: tuple[int, int] = ALL_BUCKETS, limit: int | None = None
    ) -> int:
        """Delete the claims of ``buckets`` that expired before ``now``: every one, or
        at most ``limit`` of them; answer how many."""
        pair = (self._s.reap_dedupe, self._s.reap_dedupe_page)
        return await self._reap(pair, {"now": self.dialect.time(now)}, buckets, limit)

    async def reap_ledger(
        self, before: datetime, buckets: tuple[int, int] = ALL_BUCKETS, limit: int | None = None
    ) -> int:
        """Delete the ledger rows of ``buckets`` inserted before ``before``: every one,
        or at most ``limit`` of them; answer how many."""
        pair = (self._s.reap_ledger, self._s.reap_ledger_page)
        return await self._reap(pair, {"before": self.dialect.time(before)}, buckets, limit)

    async def _reap(
        self,
        pair: tuple[ByRange[str], ByRange[str]],
        values: Values,
        buckets: tuple[int, int],
        limit: int | None,
    ) -> int:
        """Run the delete of every row (``limit`` ``None``) or of a page, of
        ``buckets``, from ``pair`` (:func:`_reaping`); answer how many it deleted."""
        statement, within = (pair[0] if limit is None else pair[1]).of(buckets)
        return await self.dialect.execute(
            self._driver, statement, {**values, "limit": limit, **within}
        )

    async def reap_locks(self, after: int | None, limit: int) -> tuple[int, int | None]:
        """Delete the lock rows no one holds among the next ``limit`` after ``after``
        (:meth:`statifier.sql.locks.Locks.reap`); nothing where locks are not rows."""
        locks = self._s.locks
        if locks is None:
            return 0, None
        return await locks.reap(self.dialect, self._driver, limit, after)

    async def reap_page(
        self, after: Any, limit: int, buckets: tuple[int, int] = ALL_BUCKETS
    ) -> list[ReapRow]:
        """At most ``limit`` addresses of ``buckets`` after the cursor ``after``
        (``None``: from the first), each beside its execution's status: for every
        bucket in key order (the cursor a key), for a part by bucket then key (the
        cursor a row's ``(bucket, id)``)."""
        dialect = self.dialect
        statement, within = self._s.reap_page.of(buckets)
        after_bucket, after_id = (None, after) if not within or after is None else after
        values: Values = {
            "after": None if after is None else str(after_id),
            "after_id": after_id,
            "after_bucket": after_bucket,
            "limit": limit,
            **within,
        }
        return [
            ReapRow(
                row[0],
                document=row[1],
                terminal_seen_at=dialect.read_time(row[2]),
                status=row[3],
                bucket=int(row[4]),
            )
            for row in await dialect.rows(self._driver, statement, values)
        ]

    async def delete_addresses(self, address_ids: Sequence[Any]) -> None:
        """Delete the addresses ``address_ids``."""
        values = {"ids": self.dialect.listed(address_ids)}
        await self.dialect.execute(self._driver, self._s.delete_addresses, values)

    async def count_addresses(self, execution_ids: Sequence[str]) -> int:
        """How many addresses name one of ``execution_ids``."""
        values = {"ids": self.dialect.listed(execution_ids)}
        row = await self.dialect.row(self._driver, self._s.count_addresses, values)
        assert row is not None  # count(*) returns one row
        return int(row[0])

    async def named_by(self, scope: str, document: str) -> str | None:
        """The execution the newest address of ``document`` in ``scope`` names, if
        any."""
        values = {"scope": scope, "document": document}
        row = await self.dialect.row(self._driver, self._s.named_by, values)
        return None if row is None else str(row[0])

    async def address_of(self, execution_id: str) -> tuple[str, str, str] | None:
        """The ``(scope, document, key)`` an execution is addressed under, if any."""
        values = {"execution_id": execution_id}
        row = await self.dialect.row(self._driver, self._s.address_of, values)
        return None if row is None else (row[0], row[1], row[2])

    async def ledger(self, execution_id: str | None) -> list[LedgerRow]:
        """The ledger's rows (naming ``execution_id``, or all), by insert time, then
        key."""
        dialect = self.dialect
        values = {"execution_id": execution_id}
        rows = await dialect.rows(self._driver, self._s.ledger, values)
        return [_ledger_row(dialect, row) for row in rows]


def _reaping(sql: Callable[[str], str], table: str, old: str) -> tuple[ByRange[str], ByRange[str]]:
    """The statements that delete ``table``'s rows that ``old`` selects, of every bucket
    or of a range (by the table's index on its bucket and ``old``'s column): all of
    them, and a page of at most ``:limit``, whichever the index gives first. The page's
    delete states ``old`` again: a row its subquery picked may have changed by the time
    the delete has its lock (a dedupe claim taken over), and PostgreSQL re-checks the
    delete's own conditions on that newer row, not the subquery's."""
    every = by_range(lambda within: sql(f"DELETE FROM {table} WHERE {old}{also(within)}"))
    page = by_range(
        lambda within: sql(
            f"DELETE FROM {table} WHERE {old} AND id IN "
            f"(SELECT id FROM {table} WHERE {old}{also(within)} LIMIT :limit)"
        )
    )
    return every, page


def _ledger_row(dialect: Dialect, row: Sequence[Any]) -> LedgerRow:
    columns = dict(zip(_LEDGER_COLUMNS, row, strict=True))
    columns["inserted_at"] = dialect.read_time(columns["inserted_at"])
    return LedgerRow.of(columns)


def _ledger_columns(row: LedgerRow) -> dict[str, Any]:
    """What ``row``'s insert writes by name (:data:`_LEDGER_WRITTEN`), ``inserted_at``
    as it is."""
    columns = {name: getattr(row, name) for name in _LEDGER_COLUMNS}
    if row.bucket is not None:
        columns["bucket"] = row.bucket
        return columns
    columns["bucket"] = ledger_bucket(
        row.binding_id,
        scope=row.scope,
        document=row.document,
        key=row.key,
        execution_id=row.execution_id,
        message_id=row.message_id,
    )
    return columns
