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

On PostgreSQL the claims of one group are serialized by a transaction-scoped lock on
the group's name, so members on several machines never split a partition; on
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
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from statifier.persistence.sql import SqlAdapter
from statifier.router import ConfigError
from statifier.sql.leases import LeaseTable, group_lock

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
        until: when (by the leases' clock) the leases held run out unless renewed:
            the ttl on from the moment the claim held the group's lock.
    """

    gained: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    surplus: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    until: datetime | None = None


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
        wait: seconds a claim, a release or a leave waits for the group's lock
            before it fails: on PostgreSQL the lock statement's (SQLSTATE 55P03), on
            SQLite the database's single writer (``LockTimeout``); ``None`` (the
            default): as long as the lock is held, so a member whose transaction is
            stuck holding it holds up the others' claims with it.

    Raises:
        ConfigError: no partitions, a blank group or owner, or ``ttl`` or ``wait`` not
            positive.
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
        wait: float | None = None,
    ) -> None:
        if not group or not owner:
            raise ConfigError(f"a lease needs a group and an owner: {group!r}, {owner!r}")
        if not partitions or not all(partitions):
            raise ConfigError(f"a group's partitions are non-empty strings: {partitions!r}")
        if not ttl > 0:
            raise ConfigError(f"a lease's ttl is a positive number of seconds, not {ttl!r}")
        if wait is not None and not wait > 0:
            raise ConfigError(f"a lock wait is a positive number of seconds, not {wait!r}")
        self.adapter = adapter
        self.group = group
        self.partitions: tuple[str, ...] = tuple(sorted(set(partitions)))
        self.owner = owner
        self.ttl = timedelta(seconds=ttl)
        self.clock = clock or _wall_clock
        self.wait = wait
        self._held: frozenset[str] = frozenset()
        self.table = LeaseTable(adapter.tables, adapter.dialect)
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
        async with self.adapter.transaction(self.wait) as tx:
            driver, table = tx.driver, self.table
            await table.serialize(driver, self.group, self.wait)
            # The time once the lock is held: a lease must not count the wait for it.
            now = self.clock()
            until = now + self.ttl
            members = await table.alive(driver, self.group, self.owner, now, until)
            holdings = {
                row.partition: Holding(row.partition, row.owner, row.leased_until)
                for row in await table.holdings(driver, self.group, self.partitions)
            }
            kept, taken, surplus = divide(self.partitions, holdings, self.owner, members, now)
            held = (*kept, *taken, *surplus)
            await table.hold(driver, self.group, self.owner, held, until)
        before = self._held
        self._held = frozenset(held)
        return LeaseChange(
            gained=tuple(sorted(set(held) - before)),
            lost=tuple(sorted(before - set(held))),
            surplus=surplus,
            held=tuple(sorted(held)),
            waiting=waiting(self.partitions, holdings, held, self.ttl, now),
            until=until,
        )

    async def release(self, partitions: Collection[str]) -> None:
        """Give ``partitions`` up (those this member holds; others are left alone): the
        next claim of another member may take them."""
        chosen = tuple(sorted(set(partitions)))
        if not chosen:
            return
        async with self._lock, self.adapter.transaction(self.wait) as tx:
            await self.table.serialize(tx.driver, self.group, self.wait)
            await self.table.free(tx.driver, self.group, self.owner, chosen)
            self._held = self._held - set(chosen)

    async def leave(self) -> None:
        """Release every partition and leave the group, so the others' next claims
        share the partitions without waiting for this member's ttl."""
        async with self._lock, self.adapter.transaction(self.wait) as tx:
            await self.table.serialize(tx.driver, self.group, self.wait)
            await self.table.free(tx.driver, self.group, self.owner, self.partitions)
            await self.table.forget(tx.driver, self.group, self.owner)
            self._held = frozenset()
