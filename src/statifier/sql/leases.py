"""The statements of the ``partition_leases`` and ``consumer_members`` tables: which
member of a consumer group holds each of its partitions, until when, and which members
are alive.

:class:`LeaseTable` serializes the claims of one group (:meth:`LeaseTable.serialize`),
marks a member alive and counts the live ones, reads the leases (making a row for each
partition the first time), and sets, frees and forgets them. What a claim decides from
the rows (the fair share) is the fronts' (:mod:`statifier.fronts.leases`).

Where transactions take locks (:mod:`statifier.sql.locks`: PostgreSQL), the claims of one
group take the group's lock (:func:`group_lock`) exclusively, so members on several
machines never split a partition, and a writer that must not race a claim (a fenced
commit of :mod:`statifier.sql.inbound`) takes it shared; on SQLite the transaction
holds the single writer, which serializes them (several processes on one file
included). A claim may bound its wait for the group's lock (:meth:`LeaseTable.serialize`'s
``wait``: PostgreSQL's ``lock_timeout``, for the lock statement alone), so that a member
whose claim transaction is stuck holding the lock makes the others' claims fail rather
than hang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from statifier.sql.dialect import Dialect, lock_key
from statifier.sql.keys import RowKeys
from statifier.sql.locks import locks_of
from statifier.sql.names import TableNames
from statifier.sql.postgres import RESTORE_LOCK_TIMEOUT, SET_LOCK_TIMEOUT, lock_timeout
from statifier.sql.tables import Tables

__all__ = ["LeaseRow", "LeaseTable", "group_lock"]


def group_lock(names: TableNames, group: str) -> int:
    """The lock key that claims of ``group`` take exclusively: a writer that
    must not race a claim (a fenced commit) takes it shared."""
    return lock_key("partition_leases", names.partition_leases, group)


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A row of the leases table as read: a partition's holder (``None``: free) and
    until when (aware, UTC; ``None`` when free)."""

    partition: str
    owner: str | None
    leased_until: datetime | None


class LeaseTable:
    """The statements of one group's lease and member tables on one database, made once.

    Args:
        tables: the tables the migrations built.
        dialect: the database's dialect (``SqlAdapter.dialect``).

    Every method takes the driver's connection of the caller's transaction
    (``tx.driver``) and runs in it; call :meth:`serialize` first in a transaction that
    changes a group's leases.
    """

    def __init__(self, tables: Tables, dialect: Dialect) -> None:
        self.dialect = dialect
        self.names = names = TableNames.of(tables)
        self.keys = keys = RowKeys.of(tables, dialect)
        leases, members = names.partition_leases, names.consumer_members
        among = f"partition {dialect.among('partitions')}"
        sql = dialect.statement
        locks = locks_of(tables, dialect)
        self._serialize = None if locks is None else locks.take_one
        member = {"consumer_group": ":group", "seen_until": ":until"}
        self._member = sql(
            f"{keys.insert(members, ('consumer_group', 'owner', 'seen_until'), member)} "
            "ON CONFLICT (consumer_group, owner) DO UPDATE SET seen_until = EXCLUDED.seen_until"
        )
        self._prune = sql(
            f"DELETE FROM {members} WHERE consumer_group = :group AND seen_until <= :now"
        )
        self._count = sql(f"SELECT count(*) FROM {members} WHERE consumer_group = :group")
        lease = {"consumer_group": ":group"}
        self._ensure = sql(
            f"{keys.insert(leases, ('consumer_group', 'partition'), lease)} "
            "ON CONFLICT (consumer_group, partition) DO NOTHING"
        )
        self._read = sql(
            f"SELECT partition, owner, leased_until FROM {leases} "
            f"WHERE consumer_group = :group AND {among}"
        )
        self._hold = sql(
            f"UPDATE {leases} SET owner = :owner, leased_until = :until "
            f"WHERE consumer_group = :group AND {among}"
        )
        self._free = sql(
            f"UPDATE {leases} SET owner = NULL, leased_until = NULL "
            f"WHERE consumer_group = :group AND owner = :owner AND {among}"
        )
        self._forget = sql(
            f"DELETE FROM {members} WHERE consumer_group = :group AND owner = :owner"
        )
        self._kin = sql(
            f"SELECT DISTINCT consumer_group FROM {members} "
            "WHERE (consumer_group = :family OR consumer_group LIKE :named) AND seen_until > :now"
        )

    async def serialize(self, driver: Any, group: str, wait: float | None = None) -> None:
        """Take ``group``'s lock exclusively until the transaction ends (see the module
        docstring), waiting at most ``wait`` seconds for it (``None``: as long as it
        takes); nothing to take where the transaction holds the single writer.

        Raises:
            Exception: the driver's, from the database; a wait past ``wait`` is one the
                dialect's :meth:`~statifier.sql.dialect.Dialect.lock_not_granted` knows
                (SQLSTATE 55P03), after which the transaction must be rolled back.
        """
        if self._serialize is None:
            return
        dialect, values = self.dialect, {"key": group_lock(self.names, group)}
        if wait is None:
            await dialect.execute(driver, self._serialize, values)
            return
        # lock_timeout for the lock statement alone; the transaction's own after it.
        row = await dialect.row(driver, SET_LOCK_TIMEOUT, {"t": lock_timeout(wait)})
        assert row is not None  # a SELECT without FROM returns one row
        await dialect.execute(driver, self._serialize, values)
        await dialect.execute(driver, RESTORE_LOCK_TIMEOUT, {"t": row[0]})

    async def alive(
        self, driver: Any, group: str, owner: str, now: datetime, until: datetime
    ) -> int:
        """Forget the members of ``group`` not seen alive after ``now``, mark ``owner``
        alive until ``until``, and answer how many members are alive (``owner``
        counted)."""
        dialect = self.dialect
        await dialect.execute(driver, self._prune, {"group": group, "now": dialect.time(now)})
        values = {"group": group, "owner": owner, "until": dialect.time(until)}
        await dialect.execute(driver, self._member, self.keys.keyed(values))
        row = await dialect.row(driver, self._count, {"group": group})
        assert row is not None  # count(*) returns a row
        return int(row[0])

    async def holdings(self, driver: Any, group: str, partitions: Sequence[str]) -> list[LeaseRow]:
        """The rows of ``partitions`` of ``group``, in no promised order; a partition
        without one gets a free row first."""
        dialect = self.dialect
        for partition in partitions:
            values = {"group": group, "partition": partition}
            await dialect.execute(driver, self._ensure, self.keys.keyed(values))
        values = {"group": group, "partitions": dialect.listed(partitions)}
        return [
            LeaseRow(row[0], row[1], dialect.read_time(row[2]))
            for row in await dialect.rows(driver, self._read, values)
        ]

    async def hold(
        self, driver: Any, group: str, owner: str, partitions: Sequence[str], until: datetime
    ) -> None:
        """Lease ``partitions`` of ``group`` to ``owner`` until ``until``, whoever held
        them."""
        dialect = self.dialect
        values = {
            "group": group,
            "owner": owner,
            "until": dialect.time(until),
            "partitions": dialect.listed(partitions),
        }
        await dialect.execute(driver, self._hold, values)

    async def free(self, driver: Any, group: str, owner: str, partitions: Sequence[str]) -> None:
        """Free those of ``partitions`` of ``group`` that ``owner`` holds."""
        values = {"group": group, "owner": owner, "partitions": self.dialect.listed(partitions)}
        await self.dialect.execute(driver, self._free, values)

    async def forget(self, driver: Any, group: str, owner: str) -> None:
        """Take ``owner`` off ``group``'s live members."""
        await self.dialect.execute(driver, self._forget, {"group": group, "owner": owner})

    async def kin(self, driver: Any, family: str, now: datetime) -> list[str]:
        """The groups named ``family`` or ``family/<anything>`` that have a member seen
        alive after ``now``, in no promised order (``family`` must hold no ``%`` or
        ``_``)."""
        dialect = self.dialect
        values = {"family": family, "named": f"{family}/%", "now": dialect.time(now)}
        return [str(row[0]) for row in await dialect.rows(driver, self._kin, values)]
