"""The reapers, plain functions a host calls on a schedule of its own.

None is needed for correctness: an expired dedupe claim already counts as absent, an
address kept past its horizon only keeps a late event ``dropped: finished`` longer, a
ledger row is history that nothing routed reads back, and a lock row
(``TableOptions(locks="rows")``) no one holds is made again by the next taker. They
reclaim space; the address reaper also deletes the source-invoke
subscriptions of the executions whose addresses it deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from statifier.buckets import ALL_BUCKETS, bucket_range
from statifier.persistence import Status
from statifier.router.binding import Binding
from statifier.router.routing import Router
from statifier.router.subscriptions import forget_addressed

__all__ = [
    "AddressReap",
    "LockReap",
    "horizons",
    "reap_addresses",
    "reap_dedupe",
    "reap_ledger",
    "reap_locks",
]

_TERMINAL = frozenset(status.value for status in Status if status.terminal)


async def reap_dedupe(
    router: Router,
    now: datetime,
    *,
    buckets: tuple[int, int] = ALL_BUCKETS,
    limit: int | None = None,
) -> int:
    """Delete the dedupe claims of ``buckets`` (a range ``(start, end)``, ``end``
    excluded; by default every bucket) that expired before ``now``, in one
    transaction: every one (``limit=None``), or at most ``limit`` of them, so that a
    large backlog goes in short transactions (call again while it answers ``limit``).
    Returns how many it deleted. A claim falls in the bucket of the address its
    delivery was for (decision 0122).

    Raises:
        ValueError: ``buckets`` is not a non-empty range within ``0..BUCKETS``, or
            ``limit`` is not positive.
    """
    _paged(buckets, limit)
    async with router.transaction() as unit:
        return await unit.sql.reap_dedupe(now, buckets, limit)


async def reap_ledger(
    router: Router,
    before: datetime,
    *,
    buckets: tuple[int, int] = ALL_BUCKETS,
    limit: int | None = None,
) -> int:
    """Delete the routing-ledger rows of ``buckets`` (a range ``(start, end)``, ``end``
    excluded; by default every bucket) written before ``before``, in one transaction:
    every one (``limit=None``), or at most ``limit`` of them (call again while it
    answers ``limit``). Returns how many it deleted. A row falls in the bucket of the
    address it names, else of its execution, else of its message id
    (:func:`~statifier.buckets.ledger_bucket`, decision 0125). The ledger is history:
    the console's pages and :func:`~statifier.router.ledger` read it, nothing routed
    does, so how long to keep it is the host's choice.

    Raises:
        ValueError: ``before`` is naive, ``buckets`` is not a non-empty range within
            ``0..BUCKETS``, or ``limit`` is not positive.
    """
    if before.tzinfo is None:
        raise ValueError("before must be timezone-aware")
    _paged(buckets, limit)
    async with router.transaction() as unit:
        return await unit.sql.reap_ledger(before, buckets, limit)


def _paged(buckets: tuple[int, int], limit: int | None) -> None:
    """Check a reaper's range of buckets and page size.

    Raises:
        ValueError: ``buckets`` is not a range of buckets, or ``limit`` not positive.
    """
    bucket_range(buckets)
    if limit is not None and limit < 1:
        raise ValueError(f"limit is a positive number of rows, not {limit!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LockReap:
    """What one :func:`reap_locks` call did.

    Attributes:
        deleted: lock rows deleted.
        next: the cursor to pass as ``after`` for the next page, ``None`` at the end.
    """

    deleted: int
    next: int | None


async def reap_locks(router: Router, *, limit: int = 1000, after: int | None = None) -> LockReap:
    """Delete the lock rows that no transaction holds and no pending timer names, among
    the next ``limit`` rows after the cursor ``after`` (``None``: from the start), in
    one transaction. Where locks are advisory (the default) or the database is SQLite,
    there are none: ``LockReap(deleted=0, next=None)``.

    Raises:
        ValueError: ``limit`` is not positive.
    """
    if limit < 1:
        raise ValueError(f"limit is a positive number of rows, not {limit!r}")
    async with router.transaction() as unit:
        deleted, cursor = await unit.sql.reap_locks(after, limit)
    return LockReap(deleted=deleted, next=cursor)


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressReap:
    """What one :func:`reap_addresses` call did.

    Attributes:
        examined: address rows read.
        stamped: rows whose execution was first seen ended (``terminal_seen_at`` set).
        deleted: rows deleted: ended longer ago than their document's horizon, or
            naming an execution that no longer exists.
        next: the cursor to pass as ``after`` for the next page, ``None`` at the end.
    """

    examined: int
    stamped: int
    deleted: int
    next: Any


def horizons(bindings: Iterable[Binding]) -> dict[str, timedelta]:
    """Each document's horizon: the longest dedupe horizon of the enabled bindings
    naming it (a document no enabled binding names has none: zero)."""
    longest: dict[str, timedelta] = {}
    for binding in bindings:
        if binding.enabled:
            horizon = binding.dedupe.horizon
            if horizon > longest.get(binding.document, timedelta(0)):
                longest[binding.document] = horizon
    return longest


async def reap_addresses(
    router: Router,
    now: datetime,
    *,
    bindings: Sequence[Binding] | None = None,
    limit: int = 1_000,
    after: Any = None,
    buckets: tuple[int, int] = ALL_BUCKETS,
) -> AddressReap:
    """Examine at most ``limit`` address rows of ``buckets`` after the cursor ``after``:
    stamp the ones whose execution has ended (the horizon counts from that first
    sighting), and delete those stamped at least their document's horizon ago (with a
    horizon of zero, in the same pass that stamps them), and those whose execution is
    gone. Sweep the table (or the range) by calling again with ``after=result.next``
    until it is ``None``. A part of the buckets is paged by its ``(bucket, id)`` index
    (decision 0122), and its cursor is a row's ``(bucket, id)``.

    The subscriptions of the executions whose address rows it deletes go with them
    (an ended execution's source invokes were cancelled when it ended; these are the
    rows nothing else would ever delete: an execution removed or cancelled outside the
    router, a host's :func:`~statifier.router.subscribe` never undone).

    Args:
        bindings: the bindings the horizons come from; by default the configuration's
            (give every scope's bindings when the configuration has a resolver).
        buckets: the range of buckets ``(start, end)``, ``end`` excluded, whose
            addresses it examines.

    Raises:
        ValueError: no bindings to compute horizons from, a limit below 1, or
            ``buckets`` not a non-empty range within ``0..BUCKETS``.
    """
    bucket_range(buckets)
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    chosen = router.config.bindings if bindings is None else bindings
    if chosen is None:
        raise ValueError("pass bindings: the configuration resolves them per scope")
    longest = horizons(chosen)
    async with router.transaction() as unit:
        rows = await unit.sql.reap_page(after, limit, buckets)
        stamp: list[Any] = []
        delete: list[Any] = []
        for row in rows:
            if row.status is None:
                delete.append(row.id)
                continue
            if row.status not in _TERMINAL:
                continue
            seen = row.terminal_seen_at
            if seen is None:
                stamp.append(row.id)
                seen = now
            if seen + longest.get(row.document, timedelta(0)) <= now:
                delete.append(row.id)
        if stamp:
            await unit.sql.stamp(stamp, now)
        if delete:
            # Before the address rows go: they are what names the executions.
            await forget_addressed(unit, delete)
            await unit.sql.delete_addresses(delete)
    last = rows[-1] if len(rows) == limit else None
    following = (
        None if last is None else last.id if buckets == ALL_BUCKETS else (last.bucket, last.id)
    )
    return AddressReap(examined=len(rows), stamped=len(stamp), deleted=len(delete), next=following)
