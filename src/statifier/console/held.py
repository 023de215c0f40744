"""The held events page's reads: the addresses whose debounce, batch and throttle
bindings hold events (:mod:`statifier.router.flow`), read-only.

:func:`held_page` lists the groups holding events a page at a time, by binding, scope
and key, through :meth:`FlowWorker.groups <statifier.router.FlowWorker.groups>` (a
router transaction that reads, and writes nothing). Each row becomes a
:class:`HeldView`: the group as stored, its binding as the router's configuration has
it now (:meth:`RouterConfig.bindings_for
<statifier.router.RouterConfig.bindings_for>`, asked once per scope of the page), the
execution its address names (one read of the ``addresses`` table on the console's
engine, for the page's rows) and whether it is late. A group whose binding is no
longer an enabled binding of its scope is shown with why (:attr:`HeldView.gone`): the
flow worker cannot deliver its events (``BindingGone``), which wait for it. A console
started alone (``statifier console``) routes by no binding, so it tells nothing of
them: :func:`held_page` is then told the router's bindings are not the deployment's
(``configured=False``).
:func:`held_totals` counts what is held: the groups' addresses and events
(:meth:`FlowWorker.totals <statifier.router.FlowWorker.totals>`), and the creates caps
hold (:meth:`FlowWorker.held_creates <statifier.router.FlowWorker.held_creates>`).

The page's cursor is the last address listed, as :func:`cursor_of` writes it. Over
several stores (decision 0119) :func:`held_pages` merges the stores' pages, an
address being in one store only, with a cursor holding a place per store
(:func:`~statifier.console.shards.merged_page`), and :func:`held_totals_over` sums
their totals.

>>> from datetime import UTC, datetime, timedelta
>>> now = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
>>> is_late(now - timedelta(seconds=5), now), is_late(now - timedelta(seconds=11), now)
(False, True)
>>> cursor = cursor_of(("typing", "web", "<doc 1>"))
>>> read_cursor(cursor)
('typing', 'web', '<doc 1>')
>>> read_cursor("[1, 2]")
Traceback (most recent call last):
...
statifier.console.queries.BadCursor: after: not a position this page made
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from statifier.console.queries import MAX_PAGE, BadCursor, Page
from statifier.console.schedules import every_text
from statifier.console.shards import Order, merged_page
from statifier.extras import MissingExtra
from statifier.router import Binding, FlowWorker, Mode, Router
from statifier.sql.engines import run_on
from statifier.sql.flow import FlowGroupRow
from statifier.sql.tables import Tables

try:
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncEngine
except ModuleNotFoundError as missing:  # SQLAlchemy: the sqlite extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "LATE_AFTER",
    "HeldTotals",
    "HeldView",
    "cursor_of",
    "held_page",
    "held_pages",
    "held_totals",
    "held_totals_over",
    "is_late",
    "read_cursor",
]

LATE_AFTER: Final = timedelta(seconds=10)
"""How long past its due time a group may wait before the page calls it late: the
flow worker looks for due groups at least every ``poll`` (a second by default, ``[flow]
poll``), so ten seconds means none is taking it (none runs, or it is stuck)."""

GONE: Final = "binding gone: events wait"
"""What a row says when its binding is no longer a binding of its scope."""
DISABLED: Final = "binding disabled: events wait"
"""What a row says when its binding is a disabled binding of its scope."""
_MAX_CURSOR: Final = 4_096


def is_late(due_at: datetime, now: datetime) -> bool:
    """Whether a group due at ``due_at`` is late at ``now``: due more than
    :data:`LATE_AFTER` before it."""
    return due_at < now - LATE_AFTER


def cursor_of(address: tuple[str, str, str]) -> str:
    """The page cursor of an address ``(binding_id, scope, key)``: its JSON array."""
    return json.dumps(list(address), ensure_ascii=False, separators=(",", ":"))


def read_cursor(text: str) -> tuple[str, str, str]:
    """The address a cursor of :func:`cursor_of` names.

    Raises:
        BadCursor: ``text`` is not such a cursor.
    """
    try:
        found: object = json.loads(text) if len(text) <= _MAX_CURSOR else None
    except ValueError:
        found = None
    if not isinstance(found, list) or len(found) != 3:
        raise BadCursor("after: not a position this page made")
    binding_id, scope, key = found
    if not (isinstance(binding_id, str) and isinstance(scope, str) and isinstance(key, str)):
        raise BadCursor("after: not a position this page made")
    return binding_id, scope, key


@dataclass(frozen=True, slots=True)
class HeldView:
    """One address holding events, as the page shows it.

    Attributes:
        row: the group as stored (:class:`~statifier.sql.flow.FlowGroupRow`).
        binding: its binding, when it is an enabled binding of the group's scope now;
            else ``None``.
        gone: why ``binding`` is ``None`` (:data:`GONE`, :data:`DISABLED`, or the
            bindings of the scope cannot be read), else ``None``; both are ``None``
            when the bindings are not known (a console started alone).
        execution_id: the execution the group's address ``(scope, document, key)``
            names, or ``None`` (none yet: the first delivery creates it).
        late: due more than :data:`LATE_AFTER` before the page was read
            (:func:`is_late`).
    """

    row: FlowGroupRow
    binding: Binding | None
    gone: str | None
    execution_id: str | None
    late: bool

    @property
    def mode(self) -> str | None:
        """The binding's mode now (``debounce``, ``batch``, ``throttle``, or
        ``each``: one turned to ``each`` delivers what it held one by one when due),
        or ``None`` when it is gone."""
        return None if self.binding is None else self.binding.mode.value

    @property
    def terms(self) -> str | None:
        """The mode's bounds in words: ``window 30s, at most 5m`` (a debounce),
        ``10 events or 1m`` (a batch), ``10 per 1m`` (a throttle), ``one by one when
        due`` (``each``); ``None`` when the binding is gone."""
        binding = self.binding
        if binding is None:
            return None
        window = "" if binding.window is None else every_text(binding.window)
        if binding.mode is Mode.DEBOUNCE:
            longest = binding.max_wait
            bounded = "" if longest is None else f", at most {every_text(longest)}"
            return f"window {window}{bounded}"
        if binding.mode is Mode.BATCH:
            return f"{binding.batch} events or {window}"
        if binding.mode is Mode.THROTTLE:
            return f"{binding.batch} per {window}"
        return "one by one when due"


@dataclass(frozen=True, slots=True)
class HeldTotals:
    """What is held, over every page.

    Attributes:
        addresses, events: the groups holding events, and how many they hold.
        capped_addresses, capped_events: the addresses whose create a cap holds, and
            how many events wait behind them (:mod:`statifier.router.caps`).
    """

    addresses: int
    events: int
    capped_addresses: int
    capped_events: int


async def held_totals(router: Router) -> HeldTotals:
    """How many addresses hold events and how many they hold, held by bindings
    (:meth:`FlowWorker.totals <statifier.router.FlowWorker.totals>`) and by caps
    (:meth:`FlowWorker.held_creates <statifier.router.FlowWorker.held_creates>`).

    Raises:
        Exception: the database failed.
    """
    worker = FlowWorker(router)
    addresses, events = await worker.totals()
    capped_addresses, capped_events = await worker.held_creates()
    return HeldTotals(addresses, events, capped_addresses, capped_events)


async def held_totals_over(routers: Sequence[Router]) -> HeldTotals:
    """:func:`held_totals` of each store's router, summed.

    Raises:
        Exception: a store's database failed.
    """
    each = await asyncio.gather(*(held_totals(router) for router in routers))
    return HeldTotals(
        sum(totals.addresses for totals in each),
        sum(totals.events for totals in each),
        sum(totals.capped_addresses for totals in each),
        sum(totals.capped_events for totals in each),
    )


def _address(view: HeldView) -> tuple[str, str, str]:
    return view.row.binding_id, view.row.scope, view.row.key


_BY_ADDRESS: Final = Order(
    "held", _address, lambda view: cursor_of(_address(view)), newest_first=False
)
"""The held page's order over several stores: by binding, scope and key."""


async def held_pages(
    stores: Sequence[tuple[Router, sa.Engine | AsyncEngine, Tables]],
    *,
    now: datetime,
    after: str | None = None,
    size: int = 50,
    configured: bool = True,
) -> Page[HeldView]:
    """:func:`held_page` over several stores (each its router and the engine and
    tables its executions are read on): every store's groups after its place in the
    cursor ``after``, merged by binding, scope and key, at most ``size``; the next
    page's cursor holds a place per store (``None`` on the last page). Over one
    store, :func:`held_page` of it.

    Raises:
        ValueError: ``size`` outside ``1..MAX_PAGE``.
        BadCursor: ``after`` is not a cursor this list made over as many stores.
        Exception: a store's database failed.
    """

    def reader(
        router: Router, engine: sa.Engine | AsyncEngine, tables: Tables
    ) -> Callable[[str | None], Awaitable[Page[HeldView]]]:
        async def read(place: str | None) -> Page[HeldView]:
            return await held_page(
                router, engine, tables, now=now, after=place, size=size, configured=configured
            )

        return read

    if len(stores) == 1:  # one database: its own page and cursor
        return await reader(*stores[0])(after)
    readers = [reader(*store) for store in stores]
    page, _ = await merged_page(_BY_ADDRESS, readers, after, size)
    return page


async def held_page(
    router: Router,
    engine: sa.Engine | AsyncEngine,
    tables: Tables,
    *,
    now: datetime,
    after: str | None = None,
    size: int = 50,
    configured: bool = True,
) -> Page[HeldView]:
    """The groups holding events after the cursor ``after`` (from the first without
    it), by binding, scope and key; at most ``size``. The next page's cursor is the last
    address listed (``None`` on the last page). Bindings are as ``router``'s
    configuration has them when asked, unless not ``configured`` (its bindings are not
    the deployment's: each view's binding is then unknown, neither found nor gone);
    executions as ``engine``'s ``tables`` name them; lateness is as at ``now``.

    Raises:
        ValueError: ``size`` outside ``1..MAX_PAGE``, or ``after`` not a cursor this
            page made.
        Exception: the database failed.
    """
    given: object = size
    if isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PAGE:
        raise ValueError(f"a page holds 1 to {MAX_PAGE} rows, not {size!r}")
    start = ("", "", "") if not after else read_cursor(after)
    rows = await FlowWorker(router).groups(after=start, limit=size + 1)
    shown = rows[:size]
    bindings: dict[str, Mapping[str, Binding] | str | None] = {}
    for scope in sorted({row.scope for row in shown}):
        bindings[scope] = await _bindings_of(router, scope) if configured else None
    executions = await _executions(engine, tables, shown)
    views = tuple(
        _view(row, bindings[row.scope], executions.get((row.scope, row.document, row.key)), now)
        for row in shown
    )
    if len(rows) <= size:
        return Page(views, None)
    last = shown[-1]
    return Page(views, cursor_of((last.binding_id, last.scope, last.key)))


async def _bindings_of(router: Router, scope: str) -> Mapping[str, Binding] | str:
    """The bindings of ``scope`` by id, or why they cannot be read."""
    try:
        found = await router.config.bindings_for(scope)
    except Exception as error:  # noqa: BLE001 - shown in the rows: the flush fails the same
        why = f"{type(error).__name__}: {error}"
        return f"bindings of the scope cannot be read ({why}): events wait"
    return {binding.id: binding for binding in found}


def _view(
    row: FlowGroupRow,
    bindings: Mapping[str, Binding] | str | None,
    execution_id: str | None,
    now: datetime,
) -> HeldView:
    binding: Binding | None = None
    gone: str | None = None
    if isinstance(bindings, str):
        gone = bindings
    elif bindings is not None:  # None: not known, neither found nor gone
        found = bindings.get(row.binding_id)
        if found is None:
            gone = GONE
        elif not found.enabled:
            gone = DISABLED
        else:
            binding, gone = found, None
    return HeldView(row, binding, gone, execution_id, is_late(row.due_at, now))


async def _executions(
    engine: sa.Engine | AsyncEngine, tables: Tables, rows: Iterable[FlowGroupRow]
) -> dict[tuple[str, str, str], str]:
    """The execution each address of ``rows`` names, by ``(scope, document, key)``:
    one read, by the page's keys (the ``addresses`` key index), its documents and
    scopes."""
    wanted = {(row.scope, row.document, row.key) for row in rows}
    if not wanted:
        return {}
    a = tables.addresses
    statement = sa.select(a.c.scope, a.c.document, a.c.key, a.c.execution_id).where(
        a.c.key.in_(sorted({key for _, _, key in wanted})),
        a.c.document.in_(sorted({document for _, document, _ in wanted})),
        a.c.scope.in_(sorted({scope for scope, _, _ in wanted})),
    )

    def read(connection: sa.Connection) -> dict[tuple[str, str, str], str]:
        found: dict[tuple[str, str, str], str] = {}
        for scope, document, key, execution_id in connection.execute(statement):
            if (scope, document, key) in wanted:
                found[(scope, document, key)] = execution_id
        return found

    return await run_on(engine, read)
