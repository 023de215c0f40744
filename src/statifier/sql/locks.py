"""How a PostgreSQL transaction holds a lock key until it ends: an advisory lock (the
default) or a row of the ``locks`` table (``TableOptions(locks="rows")``, decision
0118), for a database that does not honour advisory locks across its nodes.

A key is a signed 64-bit integer hashed in Python (:func:`~statifier.sql.dialect.lock_key`,
:func:`~statifier.sql.dialect.execution_lock_key`). Either way:

- a set of keys is taken in one statement, in ascending order, so that two transactions
  that need overlapping keys cannot deadlock;
- a lock ends with the transaction, or with a rollback to a savepoint taken before it;
- a bounded wait is PostgreSQL's ``lock_timeout``, and a wait cut short is SQLSTATE
  55P03 (:meth:`~statifier.sql.dialect.Dialect.lock_not_granted`).

As rows, a key's row is made by the first transaction that takes it and then locked by
every later one. Taking a key exclusively is one statement, ``INSERT ... ON CONFLICT
(key) DO UPDATE ... WHERE false``: it inserts the row, or locks the row there as ``FOR
UPDATE`` does without writing it (PostgreSQL locks a conflicting row even where the
update's condition is false), waiting for a holder either way. A shared lock makes the
row first, then reads it ``FOR SHARE``. A try is ``FOR UPDATE SKIP LOCKED``; the timer
claim's tries also insert the rows that are missing, which their uncommitted insert
holds. Rows stay when their transaction ends; :meth:`Locks.reap` deletes the rows no one
holds, but not those of executions with pending timers, so that a timer claim seldom
has a row to insert (an insert waits while another transaction inserts the same key).

SQLite has neither: its single writer excludes every other transaction, and
:func:`locks_of` answers ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from statifier.sql.dialect import Dialect, Values, lock_key
from statifier.sql.names import TableNames
from statifier.sql.tables import TableOptions, Tables

__all__ = ["MODE_KEYS", "LockRowVanished", "Locks", "LocksMismatch", "claim_mode", "locks_of"]

_SHARE_ATTEMPTS: Final = 8
"""How many times a shared lock makes and locks its row before it gives up: each
repeat means the reaper deleted the row between the two statements, which it can do only
while no one holds it."""


MODE_KEYS: Final = {
    "advisory": lock_key("statifier.locks", "advisory"),
    "rows": lock_key("statifier.locks", "rows"),
}
"""The rows of the ``locks`` table that say which way the processes on these tables
lock (:func:`claim_mode`); the reaper keeps them."""


class LocksMismatch(ValueError):  # noqa: N818 - names the refusal
    """A process opened the tables with one way of locking while processes of the other
    way have opened them: an advisory lock and a lock row on the same key would not
    exclude each other. The message says which way the tables lock and how to switch."""


def claim_mode(connection: Any, options: TableOptions) -> None:
    """Say, in the ``locks`` table, that processes open these tables with
    ``options.locks``, and refuse if processes of the other way said so first: how a
    process opening a PostgreSQL database checks it locks as the others do
    (:func:`statifier.sql.migrations.prepare` calls it). Nothing on SQLite.

    ``connection`` is a SQLAlchemy ``Connection`` in a transaction, which commits the
    claim. Two processes of different ways opening in the same instant are not caught.

    Raises:
        LocksMismatch: the tables lock the other way.
    """
    import sqlalchemy as sa

    if connection.dialect.name != "postgresql":
        return
    table = (
        options.name("locks")
        if options.schema is None
        else (f"{options.schema}.{options.name('locks')}")
    )
    columns, made = _new_row(options)
    other = "advisory" if options.locks == "rows" else "rows"
    connection.execute(
        sa.text(
            f"INSERT INTO {table} ({columns}) VALUES ({made}:key) ON CONFLICT (key) DO NOTHING"
        ),
        {"key": MODE_KEYS[options.locks]},
    )
    found = connection.execute(
        sa.text(f"SELECT 1 FROM {table} WHERE key = :key"), {"key": MODE_KEYS[other]}
    ).first()
    if found is not None:
        raise LocksMismatch(
            f'the tables\' locks are "{other}" (processes opened them so), not '
            f'"{options.locks}": open them with locks = "{other}" (TableOptions.locks, the '
            f"serve file's [database] locks, --locks), or stop every process and delete the "
            f"rows of {table} to switch"
        )


def _new_row(options: TableOptions) -> tuple[str, str]:
    """The columns a new row of the ``locks`` table names and the SQL of its values
    before the key's: a UUID key made on the client is made in SQL, since a row inserted
    from an array has no parameter to bind it to."""
    return ("id, key", "gen_random_uuid(), ") if options.new_key else ("key", "")


class LockRowVanished(RuntimeError):  # noqa: N818 - names what happened
    """A shared lock's row was deleted every time between its making and its locking:
    the reaper ran that often in that window, which a working reaper does not."""


@dataclass(frozen=True, slots=True)
class Locks:
    """The lock statements of one set of tables on PostgreSQL, made once (by
    :func:`locks_of`).

    Attributes:
        rows: whether the locks are rows of the ``locks`` table (else advisory locks).
        take: takes ``:keys`` (ascending, distinct: :meth:`values`) exclusively.
        take_one: takes ``:key`` exclusively.
        try_one: tries ``:key`` without waiting; returns a row whose first column is
            true when it was granted (as rows: no row when it was not).
        share: takes ``:key`` shared, after :attr:`make_row` where locks are rows;
            returns a row when it was granted (advisory: always).
        make_row: makes ``:key``'s row if it is missing, waiting for nothing but a
            concurrent first insert (``None`` for advisory locks).
        reap_pick, reap_delete: the reaper's two statements (``None`` for advisory
            locks): ``reap_pick`` locks the next ``:limit`` rows by key after
            ``:after`` (``NULL``: from the start) that no one holds and returns their
            keys; ``reap_delete`` deletes those of ``:keys`` that no pending timer
            names, but never the rows of :data:`MODE_KEYS`.
        table: the ``locks`` table's name as SQL writes it (``""`` for advisory locks).
        new_row: the columns a new row names and the SQL of its values before the
            key's (:func:`_new_row`).
    """

    rows: bool
    take: str
    take_one: str
    try_one: str
    share: str
    make_row: str | None
    reap_pick: str | None
    reap_delete: str | None
    table: str = ""
    new_row: tuple[str, str] = ("key", "")

    def tried(self, keys: str, name: str) -> str:
        """The entries of a ``WITH`` clause (SQL text, no parameters) that define
        ``name`` as the query, one column ``key``, of those among the keys that
        ``keys`` selects (a query of one column) whose locks this transaction was
        granted without waiting; what it grants is held until the transaction ends.
        The keys are tried in no particular order: a try never waits.

        As rows, a key without a row gets one, inserted here (waiting for nothing but a
        concurrent first insert of the same key), and is granted: until this
        transaction ends, its uncommitted row makes every other taker wait, and every
        other try miss it.
        """
        if not self.rows:
            return (
                f"{name} AS MATERIALIZED (SELECT k AS key FROM ({keys}) AS d(k) "
                "WHERE pg_try_advisory_xact_lock(k))"
            )
        columns, made = self.new_row
        return (
            f"{name}_made AS (INSERT INTO {self.table} ({columns}) SELECT {made}k "
            f"FROM ({keys}) AS m(k) ON CONFLICT (key) DO NOTHING RETURNING key), "
            f"{name} AS MATERIALIZED (SELECT key FROM {name}_made UNION ALL "
            f"SELECT key FROM (SELECT key FROM {self.table} WHERE key IN ({keys}) "
            "FOR UPDATE SKIP LOCKED) AS held)"
        )

    @staticmethod
    def values(keys: Iterable[int]) -> Values:
        """The parameters of :attr:`take` for ``keys``: distinct and ascending, the one
        order every statement takes keys in."""
        return {"keys": sorted(set(keys))}

    async def take_shared(self, dialect: Dialect, driver: Any, key: int) -> None:
        """Take ``key`` shared until the transaction ends, in the transaction ``driver``
        runs (waiting as long as its ``lock_timeout`` allows).

        Raises:
            LockRowVanished: as rows, the row was reaped between its making and its
                locking, every time of several.
        """
        values = {"key": key}
        for _ in range(_SHARE_ATTEMPTS):
            if self.make_row is not None:
                await dialect.execute(driver, self.make_row, values)
            if await dialect.row(driver, self.share, values) is not None:
                return
        raise LockRowVanished(f"the row of lock {key} was deleted {_SHARE_ATTEMPTS} times")

    async def reap(
        self, dialect: Dialect, driver: Any, limit: int, after: int | None
    ) -> tuple[int, int | None]:
        """Delete the lock rows no transaction holds and no pending timer names among
        the next ``limit`` rows by key after ``after`` (``None``: from the start), in
        the transaction ``driver`` runs. Answer how many were deleted, and the key to
        pass as ``after`` next (``None``: the table's end). Nothing to do for advisory
        locks: ``(0, None)``."""
        if self.reap_pick is None or self.reap_delete is None:
            return 0, None
        values = {"after": after, "limit": limit}
        keys = [row[0] for row in await dialect.rows(driver, self.reap_pick, values)]
        if not keys:
            return 0, None
        deleted = await dialect.execute(driver, self.reap_delete, {"keys": keys})
        return deleted, keys[-1] if len(keys) == limit else None


def locks_of(tables: Tables, dialect: Dialect) -> Locks | None:
    """The lock statements of ``tables`` on ``dialect``'s database, bound as the
    dialect binds them; ``None`` where transactions take no locks of their own
    (SQLite's single writer)."""
    if not dialect.row_locks:
        return None
    sql = dialect.statement
    keys = "CAST(:keys AS bigint[])"
    if tables.options.locks == "advisory":
        return Locks(
            rows=False,
            take=sql(f"SELECT pg_advisory_xact_lock(k) FROM unnest({keys}) AS k"),
            take_one=sql("SELECT pg_advisory_xact_lock(:key)"),
            try_one=sql("SELECT pg_try_advisory_xact_lock(:key)"),
            share=sql("SELECT pg_advisory_xact_lock_shared(:key)"),
            make_row=None,
            reap_pick=None,
            reap_delete=None,
        )
    names = TableNames.of(tables)
    table = names.locks
    new_row = _new_row(tables.options)
    columns, made = new_row
    # Locks the row there, as FOR UPDATE would, without writing a new version of it.
    locked = "ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key WHERE false"
    return Locks(
        rows=True,
        take=sql(
            f"INSERT INTO {table} ({columns}) SELECT {made}k FROM unnest({keys}) AS k "
            f"ORDER BY k {locked}"
        ),
        take_one=sql(f"INSERT INTO {table} ({columns}) VALUES ({made}:key) {locked}"),
        try_one=sql(f"SELECT true FROM {table} WHERE key = :key FOR UPDATE SKIP LOCKED"),
        share=sql(f"SELECT true FROM {table} WHERE key = :key FOR SHARE"),
        make_row=sql(
            f"INSERT INTO {table} ({columns}) VALUES ({made}:key) ON CONFLICT (key) DO NOTHING"
        ),
        reap_pick=sql(
            f"SELECT key FROM {table} WHERE CAST(:after AS bigint) IS NULL OR key > :after "
            "ORDER BY key LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        # A second statement, so that it sees every timer committed before it: a step
        # that adds a timer holds its execution's row, which the first statement could
        # not lock while the step ran.
        reap_delete=sql(
            f"DELETE FROM {table} AS l WHERE l.key = ANY({keys}) "
            f"AND l.key NOT IN ({', '.join(map(str, MODE_KEYS.values()))}) "
            f"AND NOT EXISTS (SELECT 1 FROM {names.timers} AS t WHERE t.lock_key = l.key)"
        ),
        table=table,
        new_row=new_row,
    )
