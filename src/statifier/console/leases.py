"""The leases page's reads: how the services on a store share its work, read-only.

Two kinds of work are shared by leases in a store's ``partition_leases`` table, each in
groups of its own: the partitions of a stream source's consumer group (the inbound
table, NATS: :mod:`statifier.fronts.leases`), and, with ``[bucket_leases]``, the slices
of the store's buckets whose timer, flow, outbox and reaper workers a service runs
(:mod:`statifier.service.bucket_leases`, groups named ``statifier.buckets/N``). The
members a group counts alive are in ``consumer_members``.

:func:`lease_groups` reads one store's groups, each with its members and its leases as
of ``now``: a lease is ``held`` until its time, ``expired`` after it (its holder missed
its renewals: the partition waits for another member's next claim), or ``free`` (given
up, or never taken). A partition that is not held waits: no member does its work.

>>> from datetime import UTC, datetime, timedelta
>>> now = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
>>> state_of("svc-a", now + timedelta(seconds=5), now), state_of("svc-a", now, now)
('held', 'expired')
>>> state_of(None, None, now)
'free'
>>> kind_of("statifier.buckets/16"), kind_of("billing")
('bucket slices', 'source partitions')
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from statifier.extras import MissingExtra
from statifier.sql.engines import run_on
from statifier.sql.tables import Tables

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "BUCKET_GROUPS",
    "MAX_LEASES",
    "GroupView",
    "LeaseView",
    "MemberView",
    "StoreLeases",
    "kind_of",
    "lease_groups",
    "state_of",
]

BUCKET_GROUPS: Final = "statifier.buckets"
"""The family of the bucket slices' groups (``statifier.buckets/16``; the family's
name alone in the versions before the count was in it)."""
MAX_LEASES: Final = 4_096
"""The most lease rows read of one store: four groups of 1,024 slices, or many
sources' partitions; past it the page says how many it leaves out."""

State = Literal["held", "expired", "free"]
Kind = Literal["bucket slices", "source partitions"]


def state_of(owner: str | None, until: datetime | None, now: datetime) -> State:
    """A lease's state at ``now``: ``held`` by ``owner`` until ``until``, ``expired``
    at or after it, ``free`` without a holder."""
    if owner is None or until is None:
        return "free"
    return "held" if until > now else "expired"


def kind_of(group: str) -> Kind:
    """What a group's partitions are: slices of the buckets (a group of the
    :data:`BUCKET_GROUPS` family) or a stream source's partitions."""
    if group == BUCKET_GROUPS or group.startswith(f"{BUCKET_GROUPS}/"):
        return "bucket slices"
    return "source partitions"


@dataclass(frozen=True, slots=True)
class LeaseView:
    """One partition of a group: its holder (``None``: free) until when, and its state
    at the page's time."""

    partition: str
    owner: str | None
    until: datetime | None
    state: State


@dataclass(frozen=True, slots=True)
class MemberView:
    """A member of the group: seen alive until ``seen_until`` (``alive``: after the
    page's time; ``None``: a holder of a partition that is no member, its membership
    pruned since or never recorded), holding ``holds`` of its partitions."""

    owner: str
    seen_until: datetime | None
    alive: bool
    holds: int


@dataclass(frozen=True, slots=True)
class GroupView:
    """One lease group of a store: its members (alive first, by name), its leases (by
    partition), and how many of them wait (expired or free)."""

    group: str
    kind: Kind
    members: tuple[MemberView, ...]
    leases: tuple[LeaseView, ...]

    @property
    def waiting(self) -> int:
        """The partitions no member holds now: their work waits for a claim."""
        return sum(1 for lease in self.leases if lease.state != "held")


@dataclass(frozen=True, slots=True)
class StoreLeases:
    """One store's lease groups (by name), and how many lease rows were left unread
    past :data:`MAX_LEASES`."""

    groups: tuple[GroupView, ...]
    left_out: int


async def lease_groups(
    engine: sa.Engine | AsyncEngine, tables: Tables, now: datetime, *, limit: int = MAX_LEASES
) -> StoreLeases:
    """The lease groups of the store of ``engine`` as of ``now`` (aware): one read-only
    transaction of three short statements, at most ``limit`` lease rows (by group and
    partition).

    Raises:
        sqlalchemy.exc.DBAPIError: the database failed.
    """
    leases, members = tables.partition_leases, tables.consumer_members

    def read(connection: sa.Connection) -> StoreLeases:
        total = connection.execute(sa.select(sa.func.count()).select_from(leases)).scalar_one()
        rows = connection.execute(
            sa.select(
                leases.c.consumer_group, leases.c.partition, leases.c.owner, leases.c.leased_until
            )
            .order_by(leases.c.consumer_group, leases.c.partition)
            .limit(limit)
        ).all()
        seen = connection.execute(
            sa.select(members.c.consumer_group, members.c.owner, members.c.seen_until).order_by(
                members.c.consumer_group, members.c.owner
            )
        ).all()
        return StoreLeases(_grouped(rows, seen, now), max(0, int(total) - len(rows)))

    return await run_on(engine, read)


def _grouped(rows: Sequence[Any], seen: Sequence[Any], now: datetime) -> tuple[GroupView, ...]:
    by_group: dict[str, list[LeaseView]] = {}
    for group, partition, owner, until in rows:
        view = LeaseView(partition, owner, until, state_of(owner, until, now))
        by_group.setdefault(group, []).append(view)
    alive: dict[str, list[tuple[str, datetime]]] = {}
    for group, owner, seen_until in seen:
        alive.setdefault(group, []).append((owner, seen_until))
    groups = []
    for group in sorted(by_group.keys() | alive.keys()):
        views = by_group.get(group, [])
        holds = Counter(view.owner for view in views if view.state == "held")
        listed = {owner for owner, _ in alive.get(group, [])}
        known = [
            MemberView(owner, until, until > now, holds[owner])
            for owner, until in alive.get(group, [])
        ]
        # A holder that is no member (an older version's claims, or pruned since):
        # still shown, so every held partition has its holder among the members.
        known += [
            MemberView(owner, None, False, count)
            for owner, count in holds.items()
            if owner is not None and owner not in listed
        ]
        known.sort(key=lambda member: (not member.alive, member.owner))
        groups.append(GroupView(group, kind_of(group), tuple(known), tuple(views)))
    return tuple(groups)
