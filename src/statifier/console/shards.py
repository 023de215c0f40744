"""The console's reads over several stores: :class:`ShardedQueries`.

When executions are spread over K stores by key buckets (decisions 0116 and 0119),
each store is a whole database of the package's tables, and
:class:`~statifier.console.queries.ConsoleQueries` reads one of them. A list across
stores is the stores' lists merged: every store is asked for a page after its own
place, the rows are merged newest first, and the page takes the newest ``size`` of
them. The cursor of a merged page carries one place per store, so the next page goes
on in every store from where this one stopped, and no row is shown twice or skipped
whatever the stores' clocks or the rows' ties. Rows of the same time are ordered by
store, then as the store orders them.

What one execution has (its detail, its rows) is read in its bucket's store; counts
are summed; the newest write times are the newest of any store. A dead letter's list
can also answer each row's store (a row id names a row of one store only), and
:class:`ShardedAudit` merges the stores' audit trails the same way.

>>> import asyncio, os, tempfile
>>> from statifier.console.queries import ConsoleQueries
>>> from statifier.sql import migrations
>>> folder = tempfile.mkdtemp()
>>> urls = [f"sqlite:///{os.path.join(folder, f'store{n}.db')}" for n in range(3)]
>>> for url in urls:
...     migrations.upgrade(url)
>>> async def empty() -> tuple[int, int]:
...     async with ShardedQueries([ConsoleQueries.open(url) for url in urls]) as queries:
...         page = await queries.executions(size=10)
...         return len(page.rows), await queries.count()
>>> asyncio.run(empty())
(0, 0)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import heapq
import itertools
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from statifier.console.audit import Audit, AuditRow
from statifier.console.queries import (
    DEFAULT_PAGE,
    MAX_PAGE,
    BadCursor,
    BucketCount,
    ConsoleQueries,
    ConsumerDeadLetter,
    ErrorView,
    ExecutionDetail,
    ExecutionFilter,
    ExecutionSummary,
    Fingerprint,
    LedgerFilter,
    Page,
    ProjectionView,
    RevisionView,
    StepRows,
    encode_cursor,
)
from statifier.persistence import Status
from statifier.persistence.shards import ShardMap
from statifier.router import LedgerRow, OutboxRow

__all__ = ["Order", "ShardedAudit", "ShardedQueries", "StoreFailed", "in_store", "merged_page"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class StoreFailed(Exception):  # noqa: N818 - names the finding
    """One store of several failed a read (its server stopped, unreachable, or
    refusing): ``number`` (from 0, as readiness, the logs and the dead letters' links
    count them) of ``count``, and its error; ``every``: whether the read needs every
    store (a list), or one execution's store alone. ``str()`` names the store and the
    error's class, never its message (which may name a host); the log line gives the
    message."""

    def __init__(self, number: int, count: int, error: BaseException, every: bool = True) -> None:
        self.number = number
        self.count = count
        self.error = error
        said = f"store {number} of {count} failed ({type(error).__name__}); "
        if every:
            said += "this needs every store: the other stores' executions still open one by one"
        else:
            said += "it holds this execution: the other stores' executions still open"
        super().__init__(said)


async def in_store(number: int, count: int, call: Awaitable[_R], *, every: bool = True) -> _R:
    """``call``'s answer, its failure (other than a refusal of the caller's own,
    :class:`ValueError`) raised as :class:`StoreFailed` naming store ``number``
    when there are several (``count`` over 1); ``every`` as :class:`StoreFailed`'s."""
    if count < 2:
        return await call
    try:
        return await call
    except (ValueError, StoreFailed):
        raise
    except Exception as error:
        raise StoreFailed(number, count, error, every) from error


_DONE = True
"""A store's place in a merged cursor once its list has no rows left."""

_Place = str | bool | None
"""A store's place in a merged cursor: ``None`` (its list from the start), a cursor of
its own list (after that row), or :data:`_DONE`."""


@dataclass(frozen=True)
class Order:
    """How one list is ordered and paged, for :func:`merged_page`.

    Attributes:
        kind: the list's name, in its cursors.
        rank: what rows of different stores are interleaved by (a store's own rows
            keep the store's order, whatever their ranks).
        after: the cursor of a store's own list after a row.
        newest_first: whether the ranks descend (else they ascend).
    """

    kind: str
    rank: Callable[[Any], Any]
    after: Callable[[Any], str]
    newest_first: bool = True

    @classmethod
    def newest(cls, kind: str, of: Callable[[Any], tuple[datetime, Any]]) -> Order:
        """A console list newest first: each row's ``(time, key)`` is ``of`` it, its
        rank the time, and its store's cursor the console's of ``kind`` there."""
        return cls(kind, lambda row: of(row)[0], lambda row: encode_cursor(kind, *of(row)))


def _created(row: ExecutionSummary) -> tuple[datetime, Any]:
    return row.created_at, row.id


def _last_error(row: ExecutionSummary) -> tuple[datetime, Any]:
    assert row.last_error_at is not None  # the errors filter lists only these
    return row.last_error_at, row.id


def _inserted(row: LedgerRow) -> tuple[datetime, Any]:
    return row.inserted_at, row.id


def _outbox_dead(row: OutboxRow) -> tuple[datetime, Any]:
    assert row.dead_at is not None  # the list holds dead rows only
    return row.dead_at, row.id


def _consumer_dead(row: ConsumerDeadLetter) -> tuple[datetime, Any]:
    return row.dead_at, row.id


def _recorded(row: ErrorView) -> tuple[datetime, Any]:
    assert row.error.recorded_at is not None  # a stored error has its time
    return row.error.recorded_at, row.id


def _acted(row: AuditRow) -> tuple[datetime, Any]:
    return row.at, row.id


class ShardedQueries:
    """The console's reads over K stores, one :class:`ConsoleQueries` per store, in
    the order of ``shard_map``'s ranges (by default, even ranges: the map
    :class:`~statifier.router.ShardedRouter` and ``statifier serve`` use for the same
    number of stores).

    Each method answers what the same method of :class:`ConsoleQueries` answers over
    one database holding every store's rows, except that rows of the same time are
    ordered by store first, and a page's cursor is this class's own (a single store's
    cursor is refused with :class:`BadCursor`). Lists ask every store, concurrently;
    a store that fails fails the call (the driver's error), since a page without it
    would be a false answer.

    Raises:
        ValueError: no store, or a map with another number of ranges than stores.
    """

    def __init__(self, stores: Sequence[ConsoleQueries], shard_map: ShardMap | None = None) -> None:
        if not stores:
            raise ValueError("ShardedQueries needs at least one store")
        self.stores = tuple(stores)
        self.shard_map = ShardMap.even(len(stores)) if shard_map is None else shard_map
        if len(self.shard_map.ranges) != len(stores):
            raise ValueError(
                f"{len(stores)} stores for a map of {len(self.shard_map.ranges)} ranges"
            )

    async def close(self) -> None:
        """Close every store's queries (each disposes only an engine it made), every
        one even when an earlier close raises (then raised)."""
        async with contextlib.AsyncExitStack() as closing:
            for store in reversed(self.stores):  # closed in store order
                closing.push_async_callback(store.close)

    async def __aenter__(self) -> ShardedQueries:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    def store_of(self, execution_id: str) -> ConsoleQueries:
        """The queries of the store that holds ``execution_id`` (by its bucket)."""
        return self.stores[self.shard_map.store_of_id(execution_id)]

    @property
    def scriba(self) -> Any:
        """scriba's tables as the first store that reads them has them (``None`` when
        none does): the projections (:meth:`projections`) are read there."""
        return next((store.scriba for store in self.stores if store.scriba is not None), None)

    async def _everywhere(self, call: Callable[[ConsoleQueries], Awaitable[_R]]) -> list[_R]:
        count = len(self.stores)
        return list(
            await asyncio.gather(
                *(in_store(n, count, call(store)) for n, store in enumerate(self.stores))
            )
        )

    async def _in_its_store(
        self, execution_id: str, call: Callable[[ConsoleQueries], Awaitable[_R]]
    ) -> _R:
        """``call`` on the store of ``execution_id``, its failure naming the store."""
        number = self.shard_map.store_of_id(execution_id)
        return await in_store(number, len(self.stores), call(self.stores[number]), every=False)

    # -- executions ---------------------------------------------------------------

    async def executions(
        self,
        where: ExecutionFilter = ExecutionFilter(),  # noqa: B008 - frozen, never changed
        *,
        cursor: str | None = None,
        size: int = DEFAULT_PAGE,
    ) -> Page[ExecutionSummary]:
        """A page of executions of every store, as
        :meth:`ConsoleQueries.executions` orders them.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        order = (
            Order.newest("errors", _last_error)
            if where.errors
            else Order.newest("executions", _created)
        )

        def page(store: ConsoleQueries, after: str | None) -> Awaitable[Page[ExecutionSummary]]:
            return store.executions(where, cursor=after, size=size)

        return await self._merged(order, page, cursor, size)

    async def failed(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ExecutionSummary]:
        """Failed executions of every store, newest first (:meth:`ConsoleQueries.failed`).

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        return await self.executions(
            ExecutionFilter(status=Status.FAILED), cursor=cursor, size=size
        )

    async def count(
        self,
        where: ExecutionFilter = ExecutionFilter(),  # noqa: B008 - frozen, never changed
        *,
        among: Collection[Status] = (),
        off_revision: str | None = None,
        dead_letters: bool = False,
    ) -> int:
        """The sum of every store's :meth:`ConsoleQueries.count`."""
        counts = await self._everywhere(
            lambda store: store.count(
                where, among=among, off_revision=off_revision, dead_letters=dead_letters
            )
        )
        return sum(counts)

    async def execution(self, execution_id: str) -> ExecutionDetail | None:
        """:meth:`ConsoleQueries.execution`, read in the execution's store."""
        return await self._in_its_store(execution_id, lambda store: store.execution(execution_id))

    async def execution_fingerprint(self, execution_id: str) -> tuple[datetime, int] | None:
        """:meth:`ConsoleQueries.execution_fingerprint`, in the execution's store."""
        return await self._in_its_store(
            execution_id, lambda store: store.execution_fingerprint(execution_id)
        )

    async def step_rows(self, execution_id: str, keys: Sequence[str]) -> StepRows:
        """:meth:`ConsoleQueries.step_rows`, in the execution's store."""
        return await self._in_its_store(
            execution_id, lambda store: store.step_rows(execution_id, keys)
        )

    async def revisions(self, document: str | None = None) -> list[RevisionView]:
        """The charts any store holds and has not retired (:meth:`ConsoleQueries.revisions`),
        each once (as the store that saved it last has it), newest saved first, at most
        :data:`~statifier.console.queries.MAX_PAGE`: a chart is saved in every store an
        execution of it was created in, so one store may lack a revision another has."""
        found = await self._everywhere(lambda store: store.revisions(document))
        newest: dict[str, RevisionView] = {}
        for views in found:
            for view in views:
                kept = newest.get(view.content_hash)
                if kept is None or view.saved_at > kept.saved_at:
                    newest[view.content_hash] = view
        ordered = sorted(newest.values(), key=lambda view: view.content_hash)
        ordered.sort(key=lambda view: view.saved_at, reverse=True)
        return ordered[:MAX_PAGE]

    # -- the ledger and addresses ------------------------------------------------------

    async def ledger(
        self,
        where: LedgerFilter = LedgerFilter(),  # noqa: B008 - frozen, never changed
        *,
        cursor: str | None = None,
        size: int = DEFAULT_PAGE,
    ) -> Page[LedgerRow]:
        """A page of every store's ledger rows, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """

        def page(store: ConsoleQueries, after: str | None) -> Awaitable[Page[LedgerRow]]:
            return store.ledger(where, cursor=after, size=size)

        return await self._merged(Order.newest("ledger", _inserted), page, cursor, size)

    async def ledger_counts(
        self, since: datetime, until: datetime, bucket: timedelta
    ) -> list[BucketCount]:
        """Every store's :meth:`ConsoleQueries.ledger_counts` summed per binding,
        bucket and outcome, in the same order.

        Raises:
            ValueError: as :meth:`ConsoleQueries.ledger_counts`.
        """
        found = await self._everywhere(lambda store: store.ledger_counts(since, until, bucket))
        totals: Counter[tuple[str, datetime, str]] = Counter()
        for counts in found:
            for count in counts:
                totals[(count.binding_id, count.bucket, count.outcome)] += count.count
        return [
            BucketCount(binding, bucket=at, outcome=outcome, count=total)
            for (binding, at, outcome), total in sorted(totals.items())
        ]

    async def addresses(self, key: str, *, scope: str | None = None) -> list[Any]:
        """The addresses of ``key`` in every store, oldest first
        (:meth:`ConsoleQueries.addresses`): one key has an address in each document,
        and each document's lies in its own bucket."""
        found = await self._everywhere(lambda store: store.addresses(key, scope=scope))
        merged = [
            (address.inserted_at, number, address)
            for number, rows in enumerate(found)
            for address in rows
        ]
        return [address for _, _, address in sorted(merged, key=lambda item: item[:2])]

    # -- failures -----------------------------------------------------------------

    async def outbox_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[OutboxRow]:
        """Every store's dead outbox rows, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        page, _ = await self.placed_outbox_dead_letters(cursor=cursor, size=size)
        return page

    async def placed_outbox_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> tuple[Page[OutboxRow], tuple[int, ...]]:
        """:meth:`outbox_dead_letters` and, for each row, the number of its store: a
        row id names a row of one store only.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """

        def page(store: ConsoleQueries, after: str | None) -> Awaitable[Page[OutboxRow]]:
            return store.outbox_dead_letters(cursor=after, size=size)

        order = Order.newest("outbox", _outbox_dead)
        return await merged_page(order, self._readers(page), cursor, size)

    async def chart_errors(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ErrorView]:
        """Every store's step errors, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """

        def page(store: ConsoleQueries, after: str | None) -> Awaitable[Page[ErrorView]]:
            return store.chart_errors(cursor=after, size=size)

        return await self._merged(Order.newest("errors", _recorded), page, cursor, size)

    async def consumer_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[ConsumerDeadLetter]:
        """Every store's consumer dead letters, newest first.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        page, _ = await self.placed_consumer_dead_letters(cursor=cursor, size=size)
        return page

    async def placed_consumer_dead_letters(
        self, *, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> tuple[Page[ConsumerDeadLetter], tuple[int, ...]]:
        """:meth:`consumer_dead_letters` and, for each row, the number of its store.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """

        def page(store: ConsoleQueries, after: str | None) -> Awaitable[Page[ConsumerDeadLetter]]:
            return store.consumer_dead_letters(cursor=after, size=size)

        order = Order.newest("consumer", _consumer_dead)
        return await merged_page(order, self._readers(page), cursor, size)

    async def projections(self) -> list[ProjectionView]:
        """scriba's projections of every store that reads scriba's tables
        (:meth:`ConsoleQueries.projections`), by name and version."""
        found = await self._everywhere(lambda store: store.projections())
        views = [view for views in found for view in views]
        return sorted(views, key=lambda view: (view.name, view.version))

    async def fingerprint(self) -> Fingerprint:
        """The newest write time of each listed table over every store."""
        found = await self._everywhere(lambda store: store.fingerprint())

        def newest(field: str) -> datetime | None:
            moments = [getattr(one, field) for one in found if getattr(one, field) is not None]
            return max(moments, default=None)

        return Fingerprint(
            executions=newest("executions"),
            ledger=newest("ledger"),
            outbox_dead=newest("outbox_dead"),
            consumer_dead=newest("consumer_dead"),
            audit=newest("audit"),
            errors=newest("errors"),
        )

    # -- merged pages -------------------------------------------------------------

    async def _merged(
        self,
        order: Order,
        page: Callable[[ConsoleQueries, str | None], Awaitable[Page[_T]]],
        cursor: str | None,
        size: int,
    ) -> Page[_T]:
        """The newest ``size`` rows of every store's list after ``cursor``'s places,
        and the cursor of the places after them."""
        merged, _ = await merged_page(order, self._readers(page), cursor, size)
        return merged

    def _readers(
        self, page: Callable[[ConsoleQueries, str | None], Awaitable[Page[_T]]]
    ) -> list[Callable[[str | None], Awaitable[Page[_T]]]]:
        return [functools.partial(page, store) for store in self.stores]


class ShardedAudit:
    """The audit trails of K stores (one :class:`~statifier.console.audit.Audit` per
    store, in the stores' order) read as one: an action on an execution, or on a row,
    is recorded in the store that holds it, so the trail of every action is the
    stores' trails merged newest first, a page's cursor holding a place per store as
    :class:`ShardedQueries`' do.

    Raises:
        ValueError: no store.
    """

    def __init__(self, audits: Sequence[Audit]) -> None:
        if not audits:
            raise ValueError("ShardedAudit needs at least one store")
        self.audits = tuple(audits)

    async def entries(
        self, *, target: str | None = None, cursor: str | None = None, size: int = DEFAULT_PAGE
    ) -> Page[AuditRow]:
        """Every store's recorded actions, newest first (of ``target`` only, if given):
        :meth:`Audit.entries <statifier.console.audit.Audit.entries>` over every store.

        Raises:
            BadCursor: ``cursor`` is not one this list made over these stores.
            ValueError: ``size`` outside ``1..MAX_PAGE``.
        """
        readers = [functools.partial(_audit_page, audit, target, size) for audit in self.audits]
        page, _ = await merged_page(Order.newest("audit", _acted), readers, cursor, size)
        return page


def _audit_page(
    audit: Audit, target: str | None, size: int, after: str | None
) -> Awaitable[Page[AuditRow]]:
    return audit.entries(target=target, cursor=after, size=size)


async def merged_page(
    order: Order,
    readers: Sequence[Callable[[str | None], Awaitable[Page[_T]]]],
    cursor: str | None,
    size: int,
) -> tuple[Page[_T], tuple[int, ...]]:
    """The first ``size`` rows in ``order`` of every store's list (``readers``: each
    store's page after its own cursor, ``None`` for its first) after ``cursor``'s
    places, the cursor of the places after them, and the number of the store of each
    row. Rows of one rank are ordered by store, each store's rows as it orders them.

    Raises:
        BadCursor: ``cursor`` is not one a merged page of ``order``'s kind over as
            many stores made.
    """
    count = len(readers)
    places: list[_Place] = [None] * count if cursor is None else _places(cursor, order.kind, count)

    async def read(number: int) -> Page[_T]:
        place = places[number]
        if place is _DONE:
            return Page((), None)
        return await in_store(
            number, count, readers[number](place if isinstance(place, str) else None)
        )

    pages = await asyncio.gather(*(read(number) for number in range(count)))
    # Each store's rows stay in their store's order (a sort of the rows themselves could
    # disagree with a store's collation, and skip a row); rows of one rank by store.
    each = [
        [(number, position, row) for position, row in enumerate(found.rows)]
        for number, found in enumerate(pages)
    ]
    taken = list(
        itertools.islice(
            heapq.merge(*each, key=lambda item: order.rank(item[2]), reverse=order.newest_first),
            size,
        )
    )
    last_of = {number: (position, row) for number, position, row in taken}
    for number, found in enumerate(pages):
        if number in last_of:
            position, row = last_of[number]
            whole = position == len(found.rows) - 1 and found.next_cursor is None
            places[number] = _DONE if whole else order.after(row)
        elif not found.rows and places[number] is not _DONE:
            places[number] = _DONE
    rows = tuple(row for _, _, row in taken)
    numbers = tuple(number for number, _, _ in taken)
    if all(place is _DONE for place in places):
        return Page(rows, None), numbers
    return Page(rows, _encode_places(order.kind, places)), numbers


def _places(cursor: str, kind: str, count: int) -> list[_Place]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        found = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        made_for, places = found
    except (ValueError, TypeError, UnicodeError, binascii.Error):
        raise BadCursor("not a cursor of this list") from None
    well_formed = (
        made_for == f"stores:{kind}"
        and isinstance(places, list)
        and len(places) == count
        and all(place is None or place is _DONE or isinstance(place, str) for place in places)
    )
    if not well_formed:
        raise BadCursor("not a cursor of this list over these stores")
    return list(places)


def _encode_places(kind: str, places: Sequence[_Place]) -> str:
    text = json.dumps([f"stores:{kind}", list(places)], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
