"""Partition leases: the members of a consumer group share its partitions through the
database, each holding a fair share, renewed while it lives.

API::

    leases = PartitionLeases(adapter, group="billing", partitions=["0", "1", "2"],
                             owner="host-a/1234", ttl=15.0)
    change = await leases.claim()   # LeaseChange(gained, lost, surplus, held, waiting)
    ...                             # revoke change.surplus's work, then:
    await leases.release(change.surplus)
    await leases.leave()            # on shutdown: release everything, leave the group

:meth:`PartitionLeases.claim` is one short transaction: it marks the member alive for
``ttl`` seconds (table ``consumer_members``), renews every lease it holds (table
``partition_leases``), and takes free or expired partitions up to its fair share,
``ceil(len(partitions) / live members)``. It never takes more than that share. A member
holding more than its share (the group grew) is told which partitions are
``surplus``: it finishes their work, commits it, and calls :meth:`release`, after which
the others' next claims take them. ``lost`` names partitions the member held and no
longer does (its lease expired and another member took it): their work must stop,
and a commit for them is fenced off by the source (see
:mod:`statifier.fronts.table_source`).

Call ``claim`` well within ``ttl`` (every ``ttl / 3`` is the usual rhythm); a member
that stops calling it is dead to the others once ``ttl`` has passed. Leases are timed
by each member's own clock, so keep the members' clocks in step to well within
``ttl``.

On PostgreSQL the claims of one group are serialized by a transaction-scoped advisory
lock on the group's name, so members on several machines never split a partition; on
SQLite the adapter's single writer serializes them (several processes on one file
database included).

>>> import asyncio, tempfile
>>> from pathlib import Path
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'leases.db'}"
>>> migrations.upgrade(url)
>>> async def main():
...     async with SqlAdapter(url) as adapter:
...         a = PartitionLeases(adapter, group="g", partitions=["0", "1", "2", "3"], owner="a")
...         b = PartitionLeases(adapter, group="g", partitions=["0", "1", "2", "3"], owner="b")
...         first = await a.claim()           # alone: a takes all four
...         joined = await b.claim()          # b joins: nothing is free yet
...         shrunk = await a.claim()          # a's share is two now
...         await a.release(shrunk.surplus)
...         taken = await b.claim()
...         return first.gained, joined.gained, shrunk.surplus, taken.gained
>>> asyncio.run(main())
(('0', '1', '2', '3'), (), ('2', '3'), ('2', '3'))
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from statifier.extras import MissingExtra
from statifier.persistence.sql import SqlAdapter
from statifier.router import ConfigError
from statifier.router.transaction import lock_key
from statifier.sql.dialect import utc_text, utc_time
from statifier.sql.names import TableNames

try:
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "Clock",
    "Holding",
    "LeaseChange",
    "PartitionLeases",
    "divide",
    "group_lock",
    "waiting",
]

Clock = Callable[[], datetime]


def _wall_clock() -> datetime:
    return datetime.now(UTC)


def group_lock(names: TableNames, group: str) -> int:
    """The PostgreSQL advisory lock key that claims of ``group`` take exclusively: a
    writer that must not race a claim (a fenced commit) takes it shared."""
    return lock_key("partition_leases", names.partition_leases, group)


@dataclass(frozen=True, slots=True)
class LeaseChange:
    """What one :meth:`PartitionLeases.claim` changed, each in sorted order.

    Attributes:
        gained: partitions taken by this claim (free, or their holder's lease expired).
        lost: partitions held before this claim and no longer (another member took
            them after this member's lease expired).
        surplus: partitions held beyond the fair share: finish their work, commit it,
            then :meth:`~PartitionLeases.release` them.
        held: every partition held after the claim (``surplus`` included).
        waiting: partitions of the group that no live member reads, as the claim
            found them (see :func:`waiting`).
    """

    gained: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    surplus: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Holding:
    """One partition's lease as read: its holder (``None``: free) and until when."""

    partition: str
    owner: str | None
    leased_until: datetime | None


def divide(
    partitions: Sequence[str],
    holdings: Mapping[str, Holding],
    owner: str,
    members: int,
    now: datetime,
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The pure rule of a claim: ``(kept, taken, surplus)`` for ``owner`` among
    ``members`` live members (at least 1, ``owner`` counted).

    ``owner`` keeps every partition it holds (an expired lease nobody took is still
    its own) up to the share ``ceil(len(partitions) / members)``; what it holds beyond
    that is ``surplus``; below it, it takes free and expired partitions, in order, up to
    the share. A partition another member holds under a live lease is never taken.

    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> later = now + timedelta(seconds=10)
    >>> held = {"0": Holding("0", "a", later), "1": Holding("1", "b", later)}
    >>> divide(["0", "1", "2", "3"], held, "a", 2, now)
    (('0',), ('2',), ())
    """
    share = math.ceil(len(partitions) / max(members, 1))
    mine = [p for p in sorted(partitions) if (h := holdings.get(p)) and h.owner == owner]
    free = [
        p
        for p in sorted(partitions)
        if (h := holdings.get(p)) is None
        or h.owner is None
        or (h.owner != owner and (h.leased_until is None or h.leased_until <= now))
    ]
    if len(mine) > share:
        return tuple(mine[:share]), (), tuple(mine[share:])
    return tuple(mine), tuple(free[: share - len(mine)]), ()


def waiting(
    partitions: Sequence[str],
    holdings: Mapping[str, Holding],
    held: Collection[str],
    ttl: timedelta,
    now: datetime,
) -> tuple[str, ...]:
    """The partitions of a group that wait for a reader, as one member's claim sees
    them at ``now``: those it does not hold (``held``, after the claim) that are free,
    whose lease has expired, or whose lease has less than a third of ``ttl`` left. A
    live holder renews its leases every third of the ttl, so a lease that has run down
    below a third has missed a renewal: its holder is dead or cut off from the
    database, and the partition is read by nobody until the lease runs out and
    another member takes it.

    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> ttl = timedelta(seconds=15)
    >>> holdings = {
    ...     "0": Holding("0", "a", now + timedelta(seconds=12)),  # renewed on time
    ...     "1": Holding("1", "b", now + timedelta(seconds=2)),   # missed a renewal
    ...     "2": Holding("2", None, None),                        # free
    ... }
    >>> waiting(["0", "1", "2", "3"], holdings, [], ttl, now)
    ('1', '2', '3')
    """
    fresh = now + ttl / 3
    found = []
    for partition in sorted(partitions):
        if partition in held:
            continue
        holding = holdings.get(partition)
        if (
            holding is None
            or holding.owner is None
            or holding.leased_until is None
            or holding.leased_until < fresh
        ):
            found.append(partition)
    return tuple(found)


class PartitionLeases:
    """One member's leases on a consumer group's partitions (see the module docstring).

    Args:
        adapter: the SQL adapter whose database holds the lease tables.
        group: the consumer group's name: members of one group share its partitions.
        partitions: every partition of the group (the same list in every member).
        owner: this member's name, unique in the group (a host name and process id, or
            a random token); a restarted member may take its old name again.
        ttl: seconds a claim keeps the member alive and its leases held.
        clock: the time leases are measured by; the wall clock by default.

    Raises:
        ConfigError: no partitions, a blank group or owner, or ``ttl`` not positive.
    """

    def __init__(
        self,
        adapter: SqlAdapter,
        *,
        group: str,
        partitions: Sequence[str],
        owner: str,
        ttl: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        if not group or not owner:
            raise ConfigError(f"a lease needs a group and an owner: {group!r}, {owner!r}")
        if not partitions or not all(partitions):
            raise ConfigError(f"a group's partitions are non-empty strings: {partitions!r}")
        if not ttl > 0:
            raise ConfigError(f"a lease's ttl is a positive number of seconds, not {ttl!r}")
        self.adapter = adapter
        self.group = group
        self.partitions: tuple[str, ...] = tuple(sorted(set(partitions)))
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.clock = clock or _wall_clock
        self._held: frozenset[str] = frozenset()
        self._sql = _statements(adapter)
        # A claim and a release of one member never interleave: each sets ``held``.
        self._lock = asyncio.Lock()

    @property
    def held(self) -> frozenset[str]:
        """The partitions held as of the last claim or release."""
        return self._held

    async def claim(self) -> LeaseChange:
        """Mark this member alive, renew its leases and take its fair share (see the
        module docstring).

        Raises:
            Exception: from the database; nothing changed, and the leases held run on
                until they expire.
        """
        async with self._lock:
            return await self._claim()

    async def _claim(self) -> LeaseChange:
        now = self.clock()
        until = now + self.ttl
        async with self.adapter.transaction() as tx:
            driver = tx.driver
            await self._sql.serialize(driver, self.group)
            members = await self._sql.alive(driver, self.group, self.owner, now, until)
            holdings = await self._sql.holdings(driver, self.group, self.partitions)
            kept, taken, surplus = divide(self.partitions, holdings, self.owner, members, now)
            held = (*kept, *taken, *surplus)
            await self._sql.hold(driver, self.group, self.owner, held, until)
        before = self._held
        self._held = frozenset(held)
        return LeaseChange(
            gained=tuple(sorted(set(held) - before)),
            lost=tuple(sorted(before - set(held))),
            surplus=surplus,
            held=tuple(sorted(held)),
            waiting=waiting(self.partitions, holdings, held, self.ttl, now),
        )

    async def release(self, partitions: Collection[str]) -> None:
        """Give ``partitions`` up (those this member holds; others are left alone): the
        next claim of another member may take them."""
        chosen = tuple(sorted(set(partitions)))
        if not chosen:
            return
        async with self._lock, self.adapter.transaction() as tx:
            await self._sql.serialize(tx.driver, self.group)
            await self._sql.free(tx.driver, self.group, self.owner, chosen)
            self._held = self._held - set(chosen)

    async def leave(self) -> None:
        """Release every partition and leave the group, so the others' next claims
        share the partitions without waiting for this member's ttl."""
        async with self._lock, self.adapter.transaction() as tx:
            await self._sql.serialize(tx.driver, self.group)
            await self._sql.free(tx.driver, self.group, self.owner, self.partitions)
            await self._sql.forget(tx.driver, self.group, self.owner)
            self._held = frozenset()


# The statements, one class per database.


def _statements(adapter: SqlAdapter) -> _PostgresLeases | _SqliteLeases:
    if isinstance(adapter.engine, AsyncEngine):
        return _PostgresLeases(adapter)
    return _SqliteLeases(adapter)


class _PostgresLeases:
    """The leases' statements on psycopg 3."""

    def __init__(self, adapter: SqlAdapter) -> None:
        names = TableNames.of(adapter.tables)
        leases, members = names.partition_leases, names.consumer_members
        self.names = names
        self.client_keys = adapter.tables.options.key_default
        key_column, key_value = ("id, ", "%(id)s, ") if self.client_keys else ("", "")
        self.member_text = (
            f"INSERT INTO {members} ({key_column}consumer_group, owner, seen_until) "
            f"VALUES ({key_value}%(group)s, %(owner)s, %(until)s) "
            "ON CONFLICT (consumer_group, owner) DO UPDATE SET seen_until = EXCLUDED.seen_until"
        )
        self.prune_text = (
            f"DELETE FROM {members} WHERE consumer_group = %(group)s AND seen_until <= %(now)s"
        )
        self.count_text = f"SELECT count(*) FROM {members} WHERE consumer_group = %(group)s"
        self.ensure_text = (
            f"INSERT INTO {leases} ({key_column}consumer_group, partition) "
            f"VALUES ({key_value}%(group)s, %(partition)s) "
            "ON CONFLICT (consumer_group, partition) DO NOTHING"
        )
        self.read_text = (
            f"SELECT partition, owner, leased_until FROM {leases} "
            "WHERE consumer_group = %(group)s AND partition = ANY(%(partitions)s)"
        )
        self.hold_text = (
            f"UPDATE {leases} SET owner = %(owner)s, leased_until = %(until)s "
            "WHERE consumer_group = %(group)s AND partition = ANY(%(partitions)s)"
        )
        self.free_text = (
            f"UPDATE {leases} SET owner = NULL, leased_until = NULL "
            "WHERE consumer_group = %(group)s AND owner = %(owner)s "
            "AND partition = ANY(%(partitions)s)"
        )
        self.forget_text = (
            f"DELETE FROM {members} WHERE consumer_group = %(group)s AND owner = %(owner)s"
        )

    async def serialize(self, driver: Any, group: str) -> None:
        key = group_lock(self.names, group)
        await driver.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": key})

    def _keyed(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.client_keys is not None:
            values["id"] = self.client_keys()
        return values

    async def alive(
        self, driver: Any, group: str, owner: str, now: datetime, until: datetime
    ) -> int:
        await driver.execute(self.prune_text, {"group": group, "now": now})
        await driver.execute(
            self.member_text, self._keyed({"group": group, "owner": owner, "until": until})
        )
        cursor = await driver.execute(self.count_text, {"group": group})
        row = await cursor.fetchone()
        return int(row[0])

    async def holdings(
        self, driver: Any, group: str, partitions: Sequence[str]
    ) -> dict[str, Holding]:
        for partition in partitions:
            await driver.execute(
                self.ensure_text, self._keyed({"group": group, "partition": partition})
            )
        cursor = await driver.execute(
            self.read_text, {"group": group, "partitions": list(partitions)}
        )
        return {r[0]: Holding(r[0], r[1], r[2]) for r in await cursor.fetchall()}

    async def hold(
        self, driver: Any, group: str, owner: str, partitions: Sequence[str], until: datetime
    ) -> None:
        values = {"group": group, "owner": owner, "until": until, "partitions": list(partitions)}
        await driver.execute(self.hold_text, values)

    async def free(self, driver: Any, group: str, owner: str, partitions: Sequence[str]) -> None:
        values = {"group": group, "owner": owner, "partitions": list(partitions)}
        await driver.execute(self.free_text, values)

    async def forget(self, driver: Any, group: str, owner: str) -> None:
        await driver.execute(self.forget_text, {"group": group, "owner": owner})


class _SqliteLeases:
    """The leases' statements on ``sqlite3``, under the adapter's single writer (which
    serializes claims, other processes' included)."""

    def __init__(self, adapter: SqlAdapter) -> None:
        names = TableNames.of(adapter.tables)
        leases, members = names.partition_leases, names.consumer_members
        self.client_keys = adapter.tables.options.key_default
        key_column, key_value = ("id, ", ":id, ") if self.client_keys else ("", "")
        self.member_text = (
            f"INSERT INTO {members} ({key_column}consumer_group, owner, seen_until) "
            f"VALUES ({key_value}:group, :owner, :until) "
            "ON CONFLICT (consumer_group, owner) DO UPDATE SET seen_until = excluded.seen_until"
        )
        self.prune_text = (
            f"DELETE FROM {members} WHERE consumer_group = :group AND seen_until <= :now"
        )
        self.count_text = f"SELECT count(*) FROM {members} WHERE consumer_group = :group"
        self.ensure_text = (
            f"INSERT INTO {leases} ({key_column}consumer_group, partition) "
            f"VALUES ({key_value}:group, :partition) "
            "ON CONFLICT (consumer_group, partition) DO NOTHING"
        )
        among = "partition IN (SELECT value FROM json_each(:partitions))"
        self.read_text = (
            f"SELECT partition, owner, leased_until FROM {leases} "
            f"WHERE consumer_group = :group AND {among}"
        )
        self.hold_text = (
            f"UPDATE {leases} SET owner = :owner, leased_until = :until "
            f"WHERE consumer_group = :group AND {among}"
        )
        self.free_text = (
            f"UPDATE {leases} SET owner = NULL, leased_until = NULL "
            f"WHERE consumer_group = :group AND owner = :owner AND {among}"
        )
        self.forget_text = f"DELETE FROM {members} WHERE consumer_group = :group AND owner = :owner"

    async def serialize(self, driver: Any, group: str) -> None:
        """Nothing to take: the transaction holds the single writer already."""

    def _keyed(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.client_keys is not None:
            values["id"] = self.client_keys().hex  # as SQLAlchemy stores a UUID there
        return values

    async def alive(
        self, driver: Any, group: str, owner: str, now: datetime, until: datetime
    ) -> int:
        driver.execute(self.prune_text, {"group": group, "now": utc_text(now)})
        driver.execute(
            self.member_text,
            self._keyed({"group": group, "owner": owner, "until": utc_text(until)}),
        )
        return int(driver.execute(self.count_text, {"group": group}).fetchone()[0])

    async def holdings(
        self, driver: Any, group: str, partitions: Sequence[str]
    ) -> dict[str, Holding]:
        for partition in partitions:
            driver.execute(self.ensure_text, self._keyed({"group": group, "partition": partition}))
        values = {"group": group, "partitions": json.dumps(list(partitions))}
        return {
            r[0]: Holding(r[0], r[1], utc_time(r[2]))
            for r in driver.execute(self.read_text, values).fetchall()
        }

    async def hold(
        self, driver: Any, group: str, owner: str, partitions: Sequence[str], until: datetime
    ) -> None:
        values = {
            "group": group,
            "owner": owner,
            "until": utc_text(until),
            "partitions": json.dumps(list(partitions)),
        }
        driver.execute(self.hold_text, values)

    async def free(self, driver: Any, group: str, owner: str, partitions: Sequence[str]) -> None:
        values = {"group": group, "owner": owner, "partitions": json.dumps(list(partitions))}
        driver.execute(self.free_text, values)

    async def forget(self, driver: Any, group: str, owner: str) -> None:
        driver.execute(self.forget_text, {"group": group, "owner": owner})
