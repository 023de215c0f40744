"""The console as a Starlette app: pages, confirmation forms and actions.

:func:`console_routes` returns the routes to mount (everything under ``/console``);
:func:`console_app` wraps them in an app of their own (``statifier console``). The
pages:

- ``/console/`` redirects to ``/console/executions``;
- ``/console/login`` (the token form; ``POST`` starts a session), ``/console/logout``;
- ``/console/executions``: the list, filtered by status, document, scope, a metadata
  pair, created/updated times and ``errors=1`` (executions whose steps raised errors,
  newest error first), and searched by an address ``key`` (in ``scope`` when given),
  the ``final`` state an execution ended in and the name of an ``error`` its steps
  raised (each exact, at most :data:`~statifier.console.queries.MAX_SEARCH`
  characters), a page at a time (``cursor``, the filter kept); each row with its
  error count and, once completed, the final state it ended in;
- ``/console/executions/{id}`` (``?step=N`` picks a replay step): the final state or
  the configuration, its errors (each linked to the step that raised it), the chart as
  a diagram with the active states lit, the datamodel, the input log as a timeline
  replayed through the pure core (each step with its event's data, its errors and what
  became of its sends: see :mod:`statifier.console.timeline`), pending timers, outbox
  rows, ledger rows, the actions taken on it;
- ``/console/routing``: the ledger (outcome and binding filters), counts per binding
  over a window as a bar chart, the configured bindings and routes, the addresses of
  a key;
- ``/console/failures``: outbox and consumer dead letters, failed executions, the
  error events steps raised across executions, scriba's projections;
- ``/console/audit``: every action taken;
- ``/console/schedules``: the schedules (:mod:`statifier.console.schedules`), a page at
  a time by name (``after``, the last name of the page before), of one ``scope`` when
  given: each one's times, next and last fire, counts, last error and how it stands
  (running, paused, failing, late, unreadable);
- ``/console/held``: the addresses whose debounce, batch and throttle bindings hold
  events (:mod:`statifier.console.held`), a page at a time by binding, scope and key
  (``after``, the last address of the page before): each one's binding and its mode as
  the router's configuration says it now (or that it is gone: its events wait), the
  execution its address names, the events held, when they are due (late or not), its
  failures and last error; the totals held, by bindings and by caps, above;
- ``/console/leases``: how the services share each store's work by leases
  (:mod:`statifier.console.leases`): each group (a stream source's partitions, the
  bucket slices of ``[bucket_leases]``), its members, and each partition's holder
  and state (held, expired, free); what no member holds waits;
- ``/console/bulk``: a bulk action (:mod:`statifier.console.bulk`) over the executions
  list's filter (its query fields), previewed with ``action`` (the count it applies
  to), started by ``POST`` (an operator, the CSRF token, ``confirm`` equal to the count
  selected then, else 409 with the new count); ``/console/bulk/{run}`` its progress,
  read from its row (:mod:`statifier.console.bulk_runs`);
- ``/console/revisions``: a chart uploaded (``POST``, ``multipart/form-data`` with the
  session's CSRF token, under the charts' read limits) is replayed on the recorded
  executions a filter selects, read-only and in the background
  (:mod:`statifier.console.revisions`); ``/console/revisions/{job}`` shows its progress,
  then its verdicts and, for one execution (``?execution=ID``), where it parted, drawn
  on both charts;
- ``/console/events``: the server-sent events of :mod:`statifier.console.live`.

Every page but the login form, and the static files, needs a session
(:mod:`statifier.console.auth`): without one a page redirects to the login form and
``/console/events`` answers 401. An action (``/console/executions/{id}/cancel`` and
``/rotate``, ``/console/failures/outbox/{id}/retry`` and ``/discard``,
``/console/failures/consumer/{id}/retry`` and ``/discard``,
``/console/schedules/{name}/pause`` and ``/resume``) is a confirmation page on
``GET`` and the act on ``POST``, whose form must carry the session's CSRF token; a
``read_only`` operator sees no action and is answered 403 for both. Each act is
written to the audit table (:mod:`statifier.console.audit`) with the operator's name,
whatever its outcome: a done act's row in the act's own transaction (they commit
together or not at all; a consumer letter's retry routes first, see
:func:`statifier.console.actions.retry_consumer`), a refused or failed one's in a
transaction of its own. A done act redirects (303) back to the page it was taken from,
which says so (``?done=ACTION``, a fixed text); a rotation answers the one page that
shows its new location; nothing to do is 409, a failure 500.

Over several stores (a :class:`~statifier.router.ShardedRouter`, decision 0119) the
lists are every store's merged, one execution is read and acted on in its store (its
audit row there), a dead letter's links name its store (``STORE.ID``; a bad store is
400), a bulk run runs in every store under one id, the held events are every store's
merged, a revision is tried on every store's executions, the leases are shown store
by store, and the schedules are the first store's.

Everything shown is escaped by the templates (Jinja2 with autoescape); the only
markup inserted as is is the SVG the console draws itself
(:func:`statifier.console.diagram.render_chart_svg`, whose text is escaped there, and
the counts chart here, both drawn with presentation attributes, no inline style).
Responses carry a strict Content-Security-Policy (scripts and styles from the console
only, nothing inline), ``X-Frame-Options: DENY`` and ``Cache-Control:
no-store``.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from scriba.sql.tables import Tables as ScribaTables
from statifier.chart import Machine, ReadLimits
from statifier.console import actions
from statifier.console import schedules as schedule_actions
from statifier.console.audit import Audit, AuditEntry
from statifier.console.auth import COOKIE, Session, Sessions
from statifier.console.bulk import BULK_ACTIONS, BulkAction, bulk_action
from statifier.console.bulk_runs import BulkRuns, LoggedRun
from statifier.console.diagram import render_chart_svg
from statifier.console.held import LATE_AFTER as HELD_LATE_AFTER
from statifier.console.held import held_pages, held_totals_over
from statifier.console.leases import StoreLeases, lease_groups
from statifier.console.live import Live, TooManyClients
from statifier.console.queries import (
    MAX_DETAIL_ROWS,
    MAX_PAGE,
    MAX_SEARCH,
    QUERY_FIELDS,
    BadCursor,
    BadFilter,
    BucketCount,
    ConsoleQueries,
    ErrorView,
    ExecutionFilter,
    ExecutionSummary,
    LedgerFilter,
    filter_from_query,
)
from statifier.console.replay import (
    ReplayStep,
    diverges,
    replay,
    shown_datamodel,
    stored_options,
)
from statifier.console.revision_form import (
    FILTER_FIELDS,
    ChartRefused,
    ChartTooLarge,
    compile_upload,
    read_selection,
)
from statifier.console.revisions import MAX_EXECUTIONS, Job, Revisions, TooManyJobs
from statifier.console.schedules import LATE_AFTER, schedules_page
from statifier.console.shards import ShardedAudit, ShardedQueries, StoreFailed
from statifier.console.stores import BadStore, Store, Stores
from statifier.console.timeline import error_steps, fates, made_by, send_keys, timeline
from statifier.console.upload import BadForm, parse_form_data
from statifier.core import MachineState, StartOptions
from statifier.core.positions import PositionError
from statifier.core.positions import load as load_position
from statifier.error_text import error_text
from statifier.expr import tagged
from statifier.extras import MissingExtra
from statifier.persistence import (
    ChartNotFound,
    ChartRetired,
    LoggedInput,
    PersistenceError,
    Status,
    StoredChartDamaged,
)
from statifier.persistence.sql import SqlTransaction
from statifier.persistence.step_errors import MAX_STEP_ERRORS
from statifier.router import Binding, Router, ShardedRouter
from statifier.shadow import ShadowResult, Side, Verdict

try:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
    from markupsafe import Markup
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
    from starlette.routing import BaseRoute, Mount, Route
    from starlette.staticfiles import StaticFiles
except ModuleNotFoundError as missing:  # Jinja2 and Starlette: the console extra
    raise MissingExtra.of(missing) from missing

__all__ = [
    "BASE",
    "Configured",
    "ConfiguredRoute",
    "Console",
    "Ending",
    "console_app",
    "console_routes",
]

BASE: Final = "/console"
"""Where the console is mounted."""
MAX_FORM_BYTES: Final = 16 * 1024
"""The largest form body read (a login token, a CSRF token)."""
MAX_UPLOAD_BYTES: Final = ReadLimits().max_bytes + MAX_FORM_BYTES
"""The largest revision form read: a chart at the size every chart is read with, and
the filter's fields."""
MAX_LISTED_RESULTS: Final = 200
"""The most executions a revision's page lists among those that did not replay the
same (the counts count them all)."""
LOGIN_DELAY: Final = 0.25
"""Seconds a refused login waits before it is answered (slows guessing)."""
MAX_MACHINES: Final = 64
"""Compiled charts kept for the execution pages, by content hash."""
MAX_REPLAYS: Final = 16
"""Replayed input logs kept (an execution page refreshed live replays nothing twice)."""
MAX_FINALS: Final = 4_096
"""Final states of completed executions kept, by execution id (a completed execution
never moves again, so its final state never changes)."""
TIMELINE_LINKS: Final = 200
"""The most steps a timeline lists: beyond it, the start, the last step and the steps
around the one shown, with the gaps marked."""
WINDOWS: Final = (
    ("15m", "15 minutes", timedelta(minutes=15)),
    ("1h", "hour", timedelta(hours=1)),
    ("6h", "6 hours", timedelta(hours=6)),
    ("24h", "24 hours", timedelta(hours=24)),
    ("7d", "7 days", timedelta(days=7)),
)
"""The windows the routing page counts over; each is cut into :data:`BUCKETS`."""
BUCKETS: Final = 12
OUTCOMES: Final = (
    "delivered",
    "created_and_delivered",
    "duplicate",
    "key_refused",
    "dropped",
)
_BULK_FIELDS: Final = ("action", "revision", "map", "data")
"""The bulk form's fields beside the executions list's filter."""
_STATIC: Final = Path(__file__).parent / "static"
_TEMPLATES: Final = Path(__file__).parent / "templates"
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "style-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

_log = logging.getLogger("statifier.console")
_NOTICES: Final = {
    "cancel": "Done: the execution was cancelled.",
    "retry_outbox": "Done: the outbox row is due again.",
    "discard_outbox": "Done: the outbox row was discarded.",
    "retry_consumer": "Done: the dead letter's event was routed again.",
    "discard_consumer": "Done: the consumer dead letter was discarded.",
    "schedule.pause": "Done: the schedule was paused; it makes no fire until resumed.",
    "schedule.resume": "Done: the schedule was resumed; its next fire is its first from now.",
}
"""What a page says after an action redirected to it (``?done=ACTION``): fixed texts,
so the query string can never put words on the page."""
_NOT_THIS_SESSION: Final = "The form was not this session's (log in again, then retry)."
_STOPPED: Final = "none: the chart stopped without reaching one"
_CROSS_SITE: Final = "A login is taken only from the console's own form."


def _cross_site(request: Request) -> bool:
    """Whether the browser says the request comes from another site: its
    ``Sec-Fetch-Site`` is ``cross-site`` or, from a browser that sends none, its
    ``Origin`` names another host than the one asked. A browser sends one of them with
    every form post; a client that sends neither is no browser, and no CSRF vector.
    (``Sec-Fetch-Site`` is the browser's own judgement, so a proxy that rewrites the
    ``Host`` header does not confuse it.)"""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site == "cross-site"
    origin = request.headers.get("origin")
    if origin is None:
        return False
    host = request.headers.get("host")
    return origin == "null" or host is None or urlsplit(origin).netloc != host


@dataclass(frozen=True, slots=True)
class ConfiguredRoute:
    """A route of the service's configuration, as the routing page lists it."""

    name: str
    queue: str
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Configured:
    """The bindings and routes a service was configured with (``statifier serve``);
    the console alone knows none."""

    bindings: Sequence[Binding] = ()
    routes: Sequence[ConfiguredRoute] = ()


@dataclass(frozen=True, slots=True)
class ChartUnavailable:
    """Why an execution's chart cannot be shown: ``why`` completes "the chart is ..."
    (``retired``, ``not in its store``, ``damaged: ...``)."""

    why: str


@dataclass(frozen=True, slots=True)
class Ending:
    """Where a completed execution ended: ``state``, the id of its top-level
    ``<final>``, or ``note``, why that cannot be told."""

    state: str | None
    note: str | None = None


@dataclass(eq=False)
class Console:
    """Everything the console's pages and actions work with.

    Over several stores (decision 0119) ``router`` is a
    :class:`~statifier.router.ShardedRouter`, ``queries`` a
    :class:`~statifier.console.shards.ShardedQueries` and ``audit`` a
    :class:`~statifier.console.shards.ShardedAudit` over its stores, store for store:
    lists are merged over the stores, an action on one execution runs on its store's
    router with its audit row in that store, a dead letter's link names its store.
    A revision is tried on every store's executions; the schedules are the first
    store's, where they live.

    Args:
        queries: the read side over the database shown (every store's).
        audit: where actions are recorded: the database and tables of ``router``'s
            adapter, of each store's router over several (a done action's row is
            written in the action's transaction).
        router: the router over the same database (or stores): actions go through
            it (its ``basichttp`` decides whether locations can be rotated).
        sessions: the operators and the session cookie.
        configured: the service's bindings and routes, ``None`` when not served by
            ``statifier serve``.
        scopes: source name -> its fixed scope, for routing a consumer dead letter
            again (from the service's sources).
        live_interval, max_clients: the change probe's period and the most open
            event streams (:class:`~statifier.console.live.Live`).
        revision_jobs, revision_ttl: the most shadow replays running at once and the
            seconds a finished one is kept (:class:`~statifier.console.revisions.Revisions`,
            over a read-only connection to the router's database).
    """

    queries: ConsoleQueries | ShardedQueries
    audit: Audit | ShardedAudit
    router: Router | ShardedRouter
    sessions: Sessions
    configured: Configured | None = None
    scopes: Mapping[str, str] = field(default_factory=dict)
    live_interval: float = 0.5
    max_clients: int = 32
    revision_jobs: int = 2
    revision_ttl: float = 3600.0
    live: Live = field(init=False)
    revisions: Revisions = field(init=False)
    stores: Stores = field(init=False)
    _machines: OrderedDict[str, Machine] = field(init=False, default_factory=OrderedDict)
    _replays: OrderedDict[tuple[str, str, int], list[ReplayStep]] = field(
        init=False, default_factory=OrderedDict
    )
    _finals: OrderedDict[str, str] = field(init=False, default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.stores = _stores_of(self.router, self.queries, self.audit)
        self.live = Live(
            self.queries.fingerprint, interval=self.live_interval, max_clients=self.max_clients
        )
        storage = self.stores.first.router.storage
        adapters = [store.router.adapter for store in self.stores.all]
        self.revisions = Revisions(
            [adapter.engine.url.render_as_string(hide_password=False) for adapter in adapters],
            [adapter.tables.options for adapter in adapters],
            codec=storage.codec,
            functions=storage.functions,
            max_running=self.revision_jobs,
            ttl=self.revision_ttl,
        )

    @property
    def bulk_runs(self) -> BulkRuns:
        """The first store's bulk runs (over one database, its only ones)."""
        return self.stores.first.runs

    def close(self) -> None:
        """End the live streams, stop the running shadow replays and bulk runs (the
        console is stopping; what a bulk run did stays done)."""
        self.live.close()
        self.revisions.close()
        self.stores.cancel()

    @classmethod
    def of(
        cls,
        router: Router | ShardedRouter,
        sessions: Sessions,
        *,
        scriba: ScribaTables | None = None,
        configured: Configured | None = None,
        scopes: Mapping[str, str] | None = None,
        live_interval: float = 0.5,
        max_clients: int = 32,
    ) -> Console:
        """The console of ``router``'s database, or of each store of a
        :class:`~statifier.router.ShardedRouter`: its reads and its audit trail on the
        engine and tables of each router's adapter (``scriba``: scriba's tables in the
        first, to show projections). Blobs are decoded with the codec of each router's
        storage."""
        stores = Stores.of(router, scriba=scriba)
        return cls(
            queries=stores.queries,
            audit=stores.audit,
            router=router,
            sessions=sessions,
            configured=configured,
            scopes=dict(scopes or {}),
            live_interval=live_interval,
            max_clients=max_clients,
        )

    def replayed(
        self,
        record_id: str,
        machine: Machine,
        inputs: Sequence[LoggedInput],
        options: StartOptions | None = None,
    ) -> list[ReplayStep]:
        """The replay of an execution's input log (started with ``options``: those its
        position keeps, :func:`~statifier.console.replay.stored_options`), kept for the
        same log: a log only grows, so its length names it (bounded by
        :data:`MAX_REPLAYS`)."""
        key = (record_id, machine.identity.content_hash, len(inputs))
        found = self._replays.get(key)
        if found is not None:
            self._replays.move_to_end(key)
            return found
        steps = replay(machine, inputs, execution_id=record_id, options=options)
        self._replays[key] = steps
        while len(self._replays) > MAX_REPLAYS:
            self._replays.popitem(last=False)
        return steps

    async def endings(self, rows: Sequence[ExecutionSummary]) -> dict[str, Ending]:
        """Where each completed execution of ``rows`` ended, by execution id: as its
        record files it, else (it ended before records kept it) read off its stored
        position with its chart, kept for :data:`MAX_FINALS` executions (a completed
        execution's never changes)."""
        found: dict[str, Ending] = {}
        for row in rows:
            if row.status is not Status.COMPLETED:
                continue
            if row.final_state is not None:
                found[row.id] = Ending(row.final_state)
                continue
            known = self._finals.get(row.id)
            if known is not None:
                self._finals.move_to_end(row.id)
                found[row.id] = Ending(known)
                continue
            found[row.id] = ending = await self._ending(row)
            if ending.state is not None:
                self._finals[row.id] = ending.state
                while len(self._finals) > MAX_FINALS:
                    self._finals.popitem(last=False)
        return found

    async def _ending(self, row: ExecutionSummary) -> Ending:
        if row.final_position is None:
            return Ending(None, "unknown: the position was pruned")
        machine = await self.machine(row.content_hash, execution_id=row.id)
        if isinstance(machine, ChartUnavailable):
            return Ending(None, f"unknown: the chart is {machine.why}")
        try:
            state = load_position(machine, row.final_position)
        except Exception:  # noqa: BLE001 - one unreadable row must not hide the list
            _log.warning(
                "console: the position of execution %s cannot be read",
                row.id,
                exc_info=True,
                extra={"execution_id": row.id},
            )
            return Ending(None, "unknown: the position cannot be read")
        ended = state.final_state()
        return Ending(ended, None if ended else "none: it stopped in no final state")

    async def machine(
        self, content_hash: str, *, execution_id: str | None = None
    ) -> Machine | ChartUnavailable:
        """The chart stored under ``content_hash`` (compiled once, kept in a bounded
        cache), or why it cannot be shown (retired, not stored, or damaged: that one
        is logged as an error): read in the store of ``execution_id``, an execution of
        it (a chart is saved in each store an execution of it is created in), else in
        the first store.

        Raises:
            Exception: what the store raised reading it (a database that fails is
                not a chart that is gone).
        """
        cached = self._machines.get(content_hash)
        if cached is not None:
            self._machines.move_to_end(content_hash)
            return cached
        store = (
            self.stores.first if execution_id is None else self.stores.of_execution(execution_id)
        )
        try:
            machine = await store.router.storage.machine(content_hash)
        except ChartRetired:
            return ChartUnavailable("retired")
        except ChartNotFound:
            return ChartUnavailable("not in its store")
        except StoredChartDamaged as error:
            _log.error("console: the stored chart %s is damaged: %s", content_hash, error)
            return ChartUnavailable(f"damaged: {error}")
        self._machines[content_hash] = machine
        while len(self._machines) > MAX_MACHINES:
            self._machines.popitem(last=False)
        return machine


def _stores_of(
    router: Router | ShardedRouter,
    queries: ConsoleQueries | ShardedQueries,
    audit: Audit | ShardedAudit,
) -> Stores:
    """The stores of a console's parts, store for store.

    Raises:
        ValueError: one database's router with another's reads (or the other way
            round), or not as many stores of each.
    """
    if not isinstance(router, ShardedRouter):
        if not isinstance(queries, ConsoleQueries) or not isinstance(audit, Audit):
            raise ValueError("a console of one database reads and records in that database")
        return Stores([Store.on(router, queries, audit)])
    if not isinstance(queries, ShardedQueries) or not isinstance(audit, ShardedAudit):
        raise ValueError("a console over several stores reads and records in each of them")
    routers = router.routers
    if not len(routers) == len(queries.stores) == len(audit.audits):
        raise ValueError(
            f"{len(routers)} stores routed, {len(queries.stores)} read, "
            f"{len(audit.audits)} recorded in"
        )
    parts = zip(routers, queries.stores, audit.audits, strict=True)
    return Stores([Store.on(*part) for part in parts], router.shard_map)


def console_app(console: Console) -> Starlette:
    """An app serving only the console (``/`` redirects to it)."""

    async def root(request: Request) -> Response:
        return RedirectResponse(f"{BASE}/", status_code=307)

    return Starlette(routes=[Route("/", root, methods=["GET"]), *console_routes(console)])


def console_routes(console: Console) -> list[BaseRoute]:
    """The console's routes, all under :data:`BASE`, to mount in a host's app."""
    pages = _Pages(console)
    routes = [
        Route("/", pages.home, methods=["GET"]),
        Route("/login", pages.login, methods=["GET", "POST"]),
        Route("/logout", pages.logout, methods=["POST"]),
        Route("/executions", pages.executions, methods=["GET"]),
        Route("/executions/{execution_id:path}/cancel", pages.cancel, methods=["GET", "POST"]),
        Route("/executions/{execution_id:path}/rotate", pages.rotate, methods=["GET", "POST"]),
        Route("/executions/{execution_id:path}/pause", pages.pause, methods=["GET", "POST"]),
        Route("/executions/{execution_id:path}/resume", pages.resume, methods=["GET", "POST"]),
        Route("/executions/{execution_id:path}", pages.execution, methods=["GET"]),
        Route("/routing", pages.routing, methods=["GET"]),
        Route("/failures", pages.failures, methods=["GET"]),
        Route("/failures/{kind}/{row}/{verb}", pages.dead_letter, methods=["GET", "POST"]),
        Route("/audit", pages.audit_page, methods=["GET"]),
        Route("/schedules", pages.schedules, methods=["GET"]),
        Route("/schedules/{name}/pause", pages.pause_schedule, methods=["GET", "POST"]),
        Route("/schedules/{name}/resume", pages.resume_schedule, methods=["GET", "POST"]),
        Route("/held", pages.held, methods=["GET"]),
        Route("/leases", pages.leases, methods=["GET"]),
        Route("/bulk", pages.bulk, methods=["GET", "POST"]),
        Route("/bulk/{run_id}", pages.bulk_run, methods=["GET"]),
        Route("/revisions", pages.revisions, methods=["GET", "POST"]),
        Route("/revisions/{job_id}", pages.revision, methods=["GET"]),
        Route("/events", pages.events, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=_STATIC), name="static"),
    ]
    return [Mount(BASE, routes=routes)]


# Rendering.


def _when(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _time_tag(value: datetime | None) -> Markup:
    """A time as a ``<time>`` element, its text as :func:`_when` writes it (an en dash
    for none): a filter, which a long page calls far faster than a template macro."""
    if value is None:
        return Markup("\N{EN DASH}")
    return Markup('<time datetime="{}">{}</time>').format(value.isoformat(), _when(value))


def _seconds(value: timedelta | None) -> str:
    if value is None:
        return "-"
    return f"{value.total_seconds():.1f} s"


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(_TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["when"] = _when
    environment.filters["timetag"] = _time_tag
    environment.filters["seconds"] = _seconds
    environment.filters["urlpart"] = lambda value: quote(str(value), safe="")
    return environment


def _json_text(value: object) -> str:
    """A datamodel value as indented JSON text (dates, durations and undefined in the
    tagged encoding); escaped by the template like everything else."""
    try:
        return json.dumps(tagged.encode(value), ensure_ascii=False, indent=2, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _counts_svg(counts: Sequence[BucketCount], since: datetime, bucket: timedelta) -> Markup:
    """Ledger rows per binding per bucket as a small bar chart: one row of bars per
    binding, the tallest bar of the chart full height. Every text is escaped here."""
    if not counts:
        return Markup('<p class="note" id="no-counts">No ledger rows in this window.</p>')
    totals: dict[str, list[int]] = {}
    for count in counts:
        slot = int((count.bucket - since) / bucket)
        if 0 <= slot < BUCKETS:
            totals.setdefault(count.binding_id, [0] * BUCKETS)[slot] += count.count
    peak = max((n for row in totals.values() for n in row), default=1) or 1
    label, bar, gap, height = 160, 18, 4, 40
    width = label + BUCKETS * (bar + gap) + 60
    bottom = 4 + len(totals) * (height + 12)
    parts = [
        (
            f'<svg class="counts" id="counts-chart" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{bottom + 16}" role="img" '
            'aria-label="ledger rows per binding">'
        ),
        # The window's two ends under the bars.
        f'<text class="axis" x="{label}" y="{bottom + 10}">{html.escape(_when(since))}</text>',
        (
            f'<text class="axis" x="{label + BUCKETS * (bar + gap) - gap}" y="{bottom + 10}" '
            f'text-anchor="end">{html.escape(_when(since + bucket * BUCKETS))}</text>'
        ),
    ]
    for row, (binding, slots) in enumerate(sorted(totals.items())):
        top = 4 + row * (height + 12)
        name = html.escape(binding if len(binding) <= 24 else binding[:23] + "…")
        parts.append(
            f'<g class="binding" data-binding="{html.escape(binding)}">'
            f'<text x="0" y="{top + height - 4}">{name}</text>'
            f'<line x1="{label}" y1="{top + height}" x2="{label + BUCKETS * (bar + gap) - gap}" '
            f'y2="{top + height}"/>'
        )
        for slot, number in enumerate(slots):
            tall = round(height * number / peak)
            x = label + slot * (bar + gap)
            start = since + bucket * slot
            parts.append(
                f'<rect x="{x}" y="{top + height - tall}" width="{bar}" height="{max(tall, 0)}" '
                f'fill="#0b63c5"><title>{html.escape(_when(start))}: {number}</title></rect>'
            )
        parts.append(
            f'<text x="{label + BUCKETS * (bar + gap) + 4}" y="{top + height - 4}">'
            f"{sum(slots)}</text></g>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # every interpolated text is escaped above


def _execution_filter(params: Mapping[str, str]) -> tuple[dict[str, str], ExecutionFilter]:
    """The executions list's filter from its query (or a form's fields): the fields as
    given, for the form to show again, and the filter.

    Raises:
        BadFilter: a field that does not parse (named in the message).
    """
    form = {name: params.get(name, "") for name in QUERY_FIELDS}
    return form, filter_from_query(form)


def _again(run: LoggedRun) -> dict[str, str]:
    """The bulk form's fields that preview ``run`` again."""
    fields = {"action": run.action, **run.selection}
    if run.action == "migrate":
        fields["revision"] = run.revision or ""
        fields["map"] = "\n".join(f"{old}={new or ''}" for old, new in run.state_map.items())
        if run.data:
            fields["data"] = json.dumps({k: tagged.encode(v) for k, v in run.data.items()})
    return fields


def _given(form: Mapping[str, str]) -> dict[str, str]:
    """The fields of a form that were filled in."""
    return {name: value for name, value in form.items() if value}


def _size(request: Request) -> int:
    text = request.query_params.get("size", "")
    if not text:
        return 50
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise _BadRequest(f"size: a number of rows from 1 to {MAX_PAGE}")
    return int(text)


def _next_url(request: Request, cursor: str | None, name: str = "cursor") -> str | None:
    if cursor is None:
        return None
    params = dict(request.query_params)
    params[name] = cursor
    return f"{request.url.path}?{urlencode(params)}"


class _BadRequest(Exception):  # noqa: N818 - names the answer
    """A query parameter the page refuses (answered 400, the message shown)."""


@dataclass(frozen=True, slots=True)
class _Act:
    """One action: what the confirmation page asks and how to do it."""

    audit: str
    target: str
    title: str
    question: str
    label: str
    back: str
    run: Callable[[actions.Record], Awaitable[actions.Done]]
    store: Store
    """Where its audit row is written: the store it acts in."""


class _Pages:
    """The handlers, over one :class:`Console`."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.templates = _environment()

    # Plumbing.

    def base(self, request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    def render(self, request: Request, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        values.setdefault("session", None)
        values.setdefault("nav", "")
        values.setdefault("title", "")
        values["base"] = self.base(request)
        values["notice"] = _NOTICES.get(request.query_params.get("done", ""))
        text = self.templates.get_template(name).render(**values)
        return HTMLResponse(text, status_code=status, headers=_HEADERS)

    def message(
        self,
        request: Request,
        session: Session | None,
        status: int,
        title: str,
        message: str,
        back: str | None = None,
        secret: str | None = None,
    ) -> HTMLResponse:
        kind = "error" if status >= 400 else "done"
        return self.render(
            request,
            "message.html",
            status,
            session=session,
            title=title,
            message=message,
            back=back,
            secret=secret,
            kind=kind,
        )

    def session(self, request: Request) -> Session | None:
        return self.console.sessions.read(request.cookies.get(COOKIE))

    def to_login(self, request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        query = urlencode({"next": target})
        return RedirectResponse(f"{self.base(request)}/login?{query}", status_code=303)

    async def page(
        self,
        request: Request,
        build: Callable[[Session], Awaitable[Response]],
    ) -> Response:
        """A page that needs a session: the login form without one, 400 for a
        parameter refused, 500 (logged with its traceback) for anything else that
        raised: an error of the console's is never shown as the operator's."""
        session = self.session(request)
        if session is None:
            return self.to_login(request)
        try:
            return await build(session)
        except (_BadRequest, BadCursor, BadFilter) as error:
            return self.message(request, session, 400, "Not understood", str(error))
        except StoreFailed as error:
            # Said as such, naming the store (readiness says the same store): not a
            # bare driver error naming a host, nor a page of the other stores alone.
            _log.error(
                "console: the page %s failed: %s: %s",
                request.url.path,
                error,
                " ".join(str(error.error).split())[:300],
            )
            return self.message(request, session, 503, "A store failed", str(error))
        except Exception as error:  # noqa: BLE001 - answered, and logged whole
            _log.exception("console: the page %s failed", request.url.path)
            said = f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]
            return self.message(request, session, 500, "Failed", said)

    async def body(self, request: Request, limit: int) -> bytes | None:
        """The request's body, or ``None`` when it is over ``limit`` bytes (the rest is
        not read)."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return None
        body = bytearray()
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                return None
        return bytes(body)

    async def form(self, request: Request) -> dict[str, str] | None:
        """The urlencoded body (at most :data:`MAX_FORM_BYTES`), or ``None``."""
        body = await self.body(request, MAX_FORM_BYTES)
        if body is None:
            return None
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
        except (UnicodeDecodeError, ValueError):
            return None
        return dict(pairs)

    # Login.

    async def home(self, request: Request) -> Response:
        return RedirectResponse(f"{self.base(request)}/executions", status_code=303)

    def next_page(self, request: Request, given: str | None) -> str:
        """Where a login goes on to: a console page of the same origin, never elsewhere."""
        base = self.base(request)
        if given and given.startswith(base + "/") and "//" not in given and "\\" not in given:
            return given
        return f"{base}/executions"

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            session = self.session(request)
            target = self.next_page(request, request.query_params.get("next"))
            if session is not None:
                return RedirectResponse(target, status_code=303)
            return self.render(request, "login.html", title="Log in", next=target, refused=None)
        if _cross_site(request):
            # Login CSRF: another site's page posting its own token would log this
            # browser in as that operator. A session has its CSRF token; a login has
            # only the browser's word on where the form came from.
            _log.warning("console: a login posted from another site was refused")
            return self.message(request, None, 403, "Refused", _CROSS_SITE)
        fields = await self.form(request)
        token = (fields or {}).get("token", "")
        target = self.next_page(request, (fields or {}).get("next"))
        operator = self.console.sessions.operators.authenticate(token)
        if operator is None:
            await asyncio.sleep(LOGIN_DELAY)
            _log.warning("console: a login with an unknown token was refused")
            return self.render(
                request,
                "login.html",
                401,
                title="Log in",
                next=target,
                refused="That token is not an operator's.",
            )
        _log.info("console: operator %s logged in", operator.name)
        response = RedirectResponse(target, status_code=303)
        cookie = self.console.sessions.issue(operator)
        response.set_cookie(COOKIE, cookie, **self._cookie(request))
        return response

    def _cookie(self, request: Request) -> dict[str, Any]:
        attributes = self.console.sessions.cookie_attributes()
        attributes["path"] = f"{self.base(request)}/"
        return attributes

    async def logout(self, request: Request) -> Response:
        session = self.session(request)
        fields = await self.form(request)
        if session is None or fields is None or not session.csrf_ok(fields.get("csrf")):
            return self.message(request, session, 403, "Refused", _NOT_THIS_SESSION)
        response = RedirectResponse(f"{self.base(request)}/login", status_code=303)
        response.delete_cookie(COOKIE, path=f"{self.base(request)}/")
        return response

    # Executions.

    async def executions(self, request: Request) -> Response:
        async def build(session: Session) -> Response:
            params = request.query_params
            form, where = _execution_filter(params)
            page = await self.console.queries.executions(
                where, cursor=params.get("cursor") or None, size=_size(request)
            )
            return self.render(
                request,
                "executions.html",
                session=session,
                nav="executions",
                title="Executions",
                page=page,
                endings=await self.console.endings(page.rows),
                form=form,
                statuses=[s.value for s in Status],
                max_search=MAX_SEARCH,
                next_url=_next_url(request, page.next_cursor),
                bulk_url=f"{self.base(request)}/bulk?{urlencode(_given(form))}",
            )

        return await self.page(request, build)

    async def execution(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]

        async def build(session: Session) -> Response:
            console = self.console
            detail = await console.queries.execution(execution_id)
            if detail is None:
                return self.message(
                    request,
                    session,
                    404,
                    "Not found",
                    f"There is no execution {execution_id!r}.",
                    back=f"{self.base(request)}/executions",
                )
            record = detail.record
            store = console.stores.of_execution(record.id)
            machine = await console.machine(record.content_hash, execution_id=record.id)
            state = _loaded(store.router, record, machine)
            steps: list[ReplayStep] = []
            replay_note = None
            diverged = True
            if isinstance(machine, ChartUnavailable):
                replay_note = f"The chart is {machine.why}: the log cannot be replayed."
            else:
                options = None if state is None else stored_options(state)
                steps = console.replayed(record.id, machine, detail.inputs, options)
                diverged = state is None or not steps or diverges(steps[-1], state)
                if state is not None and diverged:
                    replay_note = (
                        "The replay does not end where the execution is: it started with "
                        "options, or met refusals or host functions, the log does not hold."
                    )
            selected = _step(request, len(steps))
            final: str | None = None
            final_note: str | None = None
            configuration: Sequence[str] | None = None
            if selected is not None:
                chosen = steps[selected]
                active: Sequence[str] = chosen.active
                if chosen.running:
                    configuration = chosen.configuration
                else:
                    final = chosen.final_state
                    final_note = None if final else _STOPPED
                datamodel: list[tuple[str, str]] | None = [
                    (name, _json_text(value)) for name, value in chosen.datamodel.items()
                ]
                note = ""
            elif state is not None:
                active = _active(state)
                if state.running:
                    configuration = state.leaf_configuration()
                else:
                    final = state.final_state()
                    if final is not None:
                        active = (final,)  # where it ended, lit as the replay does
                    elif record.status is Status.CANCELLED:
                        final_note = "none: it was cancelled before it reached one"
                    else:
                        final_note = _STOPPED
                datamodel = [
                    (name, _json_text(value)) for name, value in shown_datamodel(state).items()
                ]
                note = ""
            else:
                active, datamodel = (), None
                if record.status.terminal:
                    final_note = "unknown: the position is pruned or cannot be read"
                note = "The position is pruned or unreadable: no datamodel to show."
            listed = _timeline(steps, selected)
            keys = send_keys(steps, [step for step, _ in listed])
            rows = detail.step_rows(keys) or await console.queries.step_rows(record.id, keys)
            raised_in = error_steps(steps, detail.errors)
            by_step: dict[int, list[ErrorView]] = {}
            for view in reversed(detail.errors):  # oldest first within a step
                index = raised_in.get(view.id)
                if index is not None:
                    by_step.setdefault(index, []).append(view)
            makers = made_by(steps)
            # Its actions are recorded in its own store: the others need not answer.
            audit = await store.audit.entries(target=record.id, size=20)
            return self.render(
                request,
                "execution.html",
                session=session,
                nav="executions",
                title=f"Execution {record.id}",
                record=record,
                chart_name=None if detail.chart is None else detail.chart.name,
                configuration=configuration,
                final_state=final,
                final_note=final_note,
                diagram=_diagram(machine, active),
                datamodel=datamodel,
                datamodel_note=note,
                steps=timeline(
                    listed, selected=selected, errors=by_step, fates=fates(steps, rows, keys)
                ),
                step_count=len(steps),
                selected=selected,
                replay_note=replay_note,
                inputs_truncated=detail.inputs_truncated,
                errors=detail.errors,
                raised_in=raised_in,
                max_step_errors=MAX_STEP_ERRORS,
                max_rows=MAX_DETAIL_ROWS,
                timers=detail.timers,
                held=detail.held,
                outbox=detail.outbox,
                made_by=makers,
                ledger=detail.ledger,
                addresses=detail.addresses,
                audit=audit.rows,
                rotatable=store.router.config.basichttp is not None and bool(detail.addresses),
            )

        return await self.page(request, build)

    # Routing.

    async def routing(self, request: Request) -> Response:
        async def build(session: Session) -> Response:
            params = request.query_params
            form = {name: params.get(name, "") for name in ("outcome", "binding", "key", "scope")}
            window = params.get("window", "1h")
            chosen = next((w for w in WINDOWS if w[0] == window), None)
            if chosen is None:
                raise _BadRequest(f"window: one of {', '.join(w[0] for w in WINDOWS)}")
            if form["outcome"] and form["outcome"] not in OUTCOMES:
                raise _BadRequest(f"outcome: one of {', '.join(OUTCOMES)}")
            queries = self.console.queries
            ledger = await queries.ledger(
                LedgerFilter(outcome=form["outcome"] or None, binding_id=form["binding"] or None),
                cursor=params.get("cursor") or None,
                size=_size(request),
            )
            span = chosen[2]
            bucket = span / BUCKETS
            # The clock the rows were written by (the stores' routers share it).
            until = self.console.stores.first.router.storage.clock()
            since = until - span
            counts = await queries.ledger_counts(since, until, bucket)
            addresses = None
            if form["key"]:
                addresses = await queries.addresses(form["key"], scope=form["scope"] or None)
            return self.render(
                request,
                "routing.html",
                session=session,
                nav="routing",
                title="Routing",
                form=form,
                window=window,
                window_label=chosen[1],
                windows=[(w[0], w[1]) for w in WINDOWS],
                outcomes=OUTCOMES,
                ledger=ledger,
                next_url=_next_url(request, ledger.next_cursor),
                chart=_counts_svg(counts, since, bucket),
                addresses=addresses,
                configured=self.console.configured,
            )

        return await self.page(request, build)

    # Failures.

    async def failures(self, request: Request) -> Response:
        async def build(session: Session) -> Response:
            params = request.query_params
            queries = self.console.queries
            size = _size(request)
            stores = self.console.stores
            outbox_cursor = params.get("outbox_cursor") or None
            consumer_cursor = params.get("consumer_cursor") or None
            if isinstance(queries, ShardedQueries):
                outbox, outbox_in = await queries.placed_outbox_dead_letters(
                    cursor=outbox_cursor, size=size
                )
                consumer, consumer_in = await queries.placed_consumer_dead_letters(
                    cursor=consumer_cursor, size=size
                )
            else:
                outbox = await queries.outbox_dead_letters(cursor=outbox_cursor, size=size)
                consumer = await queries.consumer_dead_letters(cursor=consumer_cursor, size=size)
                outbox_in, consumer_in = (0,) * len(outbox.rows), (0,) * len(consumer.rows)
            failed = await queries.failed(cursor=params.get("failed_cursor") or None, size=size)
            errors = await queries.chart_errors(
                cursor=params.get("errors_cursor") or None, size=size
            )
            projections = await queries.projections()
            return self.render(
                request,
                "failures.html",
                session=session,
                nav="failures",
                title="Failures",
                outbox=outbox,
                outbox_ids=[
                    stores.row_text(n, row.id)
                    for n, row in zip(outbox_in, outbox.rows, strict=True)
                ],
                outbox_next=_next_url(request, outbox.next_cursor, "outbox_cursor"),
                consumer=consumer,
                consumer_ids=[
                    stores.row_text(n, row.id)
                    for n, row in zip(consumer_in, consumer.rows, strict=True)
                ],
                consumer_next=_next_url(request, consumer.next_cursor, "consumer_cursor"),
                failed=failed,
                failed_next=_next_url(request, failed.next_cursor, "failed_cursor"),
                errors=errors,
                errors_next=_next_url(request, errors.next_cursor, "errors_cursor"),
                projections=projections,
                projections_note=(
                    "No projection."
                    if queries.scriba is not None
                    else "This console reads no scriba tables."
                ),
            )

        return await self.page(request, build)

    async def audit_page(self, request: Request) -> Response:
        async def build(session: Session) -> Response:
            page = await self.console.audit.entries(
                cursor=request.query_params.get("cursor") or None, size=_size(request)
            )
            return self.render(
                request,
                "audit.html",
                session=session,
                nav="audit",
                title="Audit",
                page=page,
                next_url=_next_url(request, page.next_cursor),
            )

        return await self.page(request, build)

    async def schedules(self, request: Request) -> Response:
        """The schedules, a page at a time by name (``after``), of one ``scope`` when
        given, each with how it stands now (the router's storage clock)."""

        async def build(session: Session) -> Response:
            params = request.query_params
            scope = params.get("scope", "")
            first = self.console.stores.first  # over several stores, theirs (0119)
            queries = first.queries
            size = _size(request)
            try:
                page = await schedules_page(
                    queries.engine,
                    queries.tables,
                    now=first.router.storage.clock(),
                    after=params.get("after") or None,
                    scope=scope or None,
                    size=size,
                )
            except ValueError as refused:  # the size is checked: the scope
                raise _BadRequest(str(refused)) from None
            return self.render(
                request,
                "schedules.html",
                session=session,
                nav="schedules",
                title="Schedules",
                page=page,
                scope=scope,
                late_after=int(LATE_AFTER.total_seconds()),
                next_url=_next_url(request, page.next_cursor, "after"),
            )

        return await self.page(request, build)

    async def held(self, request: Request) -> Response:
        """The addresses holding events, a page at a time by binding, scope and key
        (``after``), with the totals held; late as at the router's storage clock. The
        bindings are judged only when the console was configured with the service's
        (alone, its router routes by none)."""

        async def build(session: Session) -> Response:
            stores = self.console.stores.all
            routers = [store.router for store in stores]
            page = await held_pages(
                [(store.router, store.queries.engine, store.queries.tables) for store in stores],
                now=routers[0].storage.clock(),  # the stores' routers share it
                after=request.query_params.get("after") or None,
                size=_size(request),
                configured=self.console.configured is not None,
            )
            return self.render(
                request,
                "held.html",
                session=session,
                nav="held",
                title="Held events",
                page=page,
                totals=await held_totals_over(routers),
                late_after=int(HELD_LATE_AFTER.total_seconds()),
                next_url=_next_url(request, page.next_cursor, "after"),
            )

        return await self.page(request, build)

    async def leases(self, request: Request) -> Response:
        """Each store's lease groups, members and leases, as at the router's storage
        clock, store by store."""

        async def build(session: Session) -> Response:
            stores = self.console.stores.all
            now = stores[0].router.storage.clock()  # the stores' routers share it
            shown: list[tuple[int, StoreLeases | None, str | None]] = []
            for number, store in enumerate(stores):
                try:
                    found = await lease_groups(store.queries.engine, store.queries.tables, now)
                except Exception as error:
                    if len(stores) == 1:
                        raise
                    # A store that does not answer is said so under its heading; the
                    # others' leases are what an operator needs most meanwhile.
                    _log.error(
                        "console: the leases of store %d could not be read: %s",
                        number,
                        error_text(error, 300),
                    )
                    shown.append((number, None, type(error).__name__))
                else:
                    shown.append((number, found, None))
            return self.render(
                request,
                "leases.html",
                session=session,
                nav="leases",
                title="Leases",
                # Numbered from 0, as readiness, the logs and the failures' links do.
                stores=shown,
                several=len(stores) > 1,
                now=now,
            )

        return await self.page(request, build)

    # Actions.

    async def pause_schedule(self, request: Request) -> Response:
        name = request.path_params["name"]
        first = self.console.stores.first  # the schedules' store
        act = _Act(
            audit="schedule.pause",
            target=name,
            title="Pause this schedule?",
            question=(
                f"Schedule {name} makes no fire until it is resumed. The fires that come "
                "due meanwhile are not made: on resume, its next fire is its first after "
                "that moment."
            ),
            label="Pause the schedule",
            back=f"{self.base(request)}/schedules",
            run=lambda record: schedule_actions.pause(first.router, name, record=record),
            store=first,
        )
        return await self.act(request, act)

    async def resume_schedule(self, request: Request) -> Response:
        name = request.path_params["name"]
        first = self.console.stores.first  # the schedules' store
        act = _Act(
            audit="schedule.resume",
            target=name,
            title="Resume this schedule?",
            question=(
                f"Schedule {name} fires again: its next fire is its first from now on. "
                "The fires its pause covered are not made, and its failures are cleared."
            ),
            label="Resume the schedule",
            back=f"{self.base(request)}/schedules",
            run=lambda record: schedule_actions.resume(first.router, name, record=record),
            store=first,
        )
        return await self.act(request, act)

    async def cancel(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        back = f"{self.base(request)}/executions/{quote(execution_id, safe='')}"
        store = self.console.stores.of_execution(execution_id)
        act = _Act(
            audit="cancel",
            target=execution_id,
            title="Cancel this execution?",
            question=(
                f"Execution {execution_id} will exit its active states (their onexit runs) "
                "and its durable children are cancelled too. This cannot be undone."
            ),
            label="Cancel the execution",
            back=back,
            run=lambda record: actions.cancel(store.router, execution_id, record=record),
            store=store,
        )
        return await self.act(request, act)

    async def pause(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        back = f"{self.base(request)}/executions/{quote(execution_id, safe='')}"
        store = self.console.stores.of_execution(execution_id)
        act = _Act(
            audit="pause",
            target=execution_id,
            title="Pause this execution?",
            question=(
                f"Execution {execution_id} takes no event until it is resumed: what is sent "
                "to it, and its timers that come due, wait in order and are stepped in on "
                "resume. Nothing is refused."
            ),
            label="Pause the execution",
            back=back,
            run=lambda record: actions.pause(store.router, execution_id, record=record),
            store=store,
        )
        return await self.act(request, act)

    async def resume(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        back = f"{self.base(request)}/executions/{quote(execution_id, safe='')}"
        store = self.console.stores.of_execution(execution_id)
        act = _Act(
            audit="resume",
            target=execution_id,
            title="Resume this execution?",
            question=(
                f"Execution {execution_id} takes events again: what it held is stepped in "
                "first, oldest first, in one transaction."
            ),
            label="Resume the execution",
            back=back,
            run=lambda record: actions.resume(store.router, execution_id, record=record),
            store=store,
        )
        return await self.act(request, act)

    async def rotate(self, request: Request) -> Response:
        execution_id = request.path_params["execution_id"]
        back = f"{self.base(request)}/executions/{quote(execution_id, safe='')}"
        store = self.console.stores.of_execution(execution_id)
        act = _Act(
            audit="rotate",
            target=execution_id,
            title="Rotate the BasicHTTP location?",
            question=(
                f"Execution {execution_id} gets a new location; the old one reaches "
                "nothing from now on. The new one is shown once."
            ),
            label="Rotate the location",
            back=back,
            run=lambda record: actions.rotate(store.router, execution_id, record=record),
            store=store,
        )
        return await self.act(request, act)

    async def dead_letter(self, request: Request) -> Response:
        kind, verb = request.path_params["kind"], request.path_params["verb"]
        text = request.path_params["row"]
        if kind not in ("outbox", "consumer") or verb not in ("retry", "discard"):
            return self.message(request, self.session(request), 404, "Not found", "No such page.")
        console = self.console
        back = f"{self.base(request)}/failures"
        try:
            store, in_store = console.stores.row(text)
        except BadStore as error:
            return self.message(
                request, self.session(request), 400, "Not understood", str(error), back
            )
        router = store.router

        async def run(record: actions.Record) -> actions.Done:
            row = actions.row_id(router.adapter.tables, in_store)
            if kind == "outbox" and verb == "retry":
                return await actions.retry_outbox(router, row, record=record)
            if kind == "outbox":
                return await actions.discard_outbox(router, row, record=record)
            if verb == "retry":
                return await actions.retry_consumer(
                    router, row, console.scopes, record=record, routing=console.router
                )
            return await actions.discard_consumer(router, row, record=record)

        what = "outbox row" if kind == "outbox" else "consumer dead letter"
        if verb == "retry":
            question = (
                f"The {what} {text} is handed on again (its sink is called again under "
                "the same key)."
                if kind == "outbox"
                else f"The event of {what} {text} is routed again (the router's dedupe "
                "answers a message already delivered as a duplicate); the dead letter "
                "is deleted once it routed."
            )
        else:
            question = f"The {what} {text} is deleted, never handed on. This cannot be undone."
        act = _Act(
            audit=f"{verb}_{kind}",
            target=f"{kind}:{text}",
            title=f"{verb.capitalize()} {what} {text}?",
            question=question,
            label=f"{verb.capitalize()} it",
            back=back,
            run=run,
            store=store,
        )
        return await self.act(request, act)

    async def bulk(self, request: Request) -> Response:
        """Bulk actions over the executions list's filter: the form (``GET``, its
        fields from the query); with ``action``, the preview, how many executions the
        action applies to now, and its confirmation; ``POST`` (an operator, the
        session's CSRF token, the ``confirm`` count the preview gave) starts the run
        and redirects to its progress. A count that moved since is answered 409 with
        the new count to confirm."""
        if request.method == "POST":
            return await self.start_bulk(request)

        async def build(session: Session) -> Response:
            params = request.query_params
            form, where = _execution_filter(params)
            chosen = {name: params.get(name, "") for name in _BULK_FIELDS}
            action = await self.bulk_action(chosen) if chosen["action"] else None
            selected = None
            if action is not None:
                selected = sum(await self.console.stores.previews(action, where))
            return await self.bulk_page(request, session, form, chosen, action, selected)

        return await self.page(request, build)

    async def bulk_page(
        self,
        request: Request,
        session: Session,
        form: Mapping[str, str],
        chosen: Mapping[str, str],
        action: BulkAction | None,
        selected: int | None,
        status: int = 200,
        changed: bool = False,
    ) -> Response:
        return self.render(
            request,
            "bulk.html",
            status,
            session=session,
            nav="executions",
            title="Bulk actions",
            form=form,
            chosen=chosen,
            action=action,
            selected=selected,
            changed=changed,
            actions=[*BULK_ACTIONS, "migrate"],
            statuses=[s.value for s in Status],
            revisions=await self.console.queries.revisions(form.get("document") or None),
            runs=await self.console.stores.latest(),
            max_search=MAX_SEARCH,
        )

    async def bulk_action(self, chosen: Mapping[str, str]) -> BulkAction:
        """The action the form chose; ``migrate`` onto the stored ``revision`` with the
        ``map`` (lines ``OLD=NEW``, or ``OLD=`` for a state removed on purpose) and the
        ``data`` (a JSON object) for variables the revision adds.

        Raises:
            _BadRequest: an unknown action or revision, or a map line that does not parse.
        """
        name = chosen["action"]
        if name != "migrate":
            try:
                return bulk_action(name)
            except ValueError as unknown:
                raise _BadRequest(f"action: {unknown}") from None
        if not chosen["revision"]:
            raise _BadRequest("revision: choose the revision to migrate to")
        state_map: dict[str, str | None] = {}
        for line in chosen["map"].splitlines():
            if not line.strip():
                continue
            old, equals, new = (part.strip() for part in line.partition("="))
            if not equals or not old:
                raise _BadRequest(f"map: one OLD=NEW a line, not {line[:80]!r}")
            state_map[old] = new or None
        data: object = {}
        if chosen["data"].strip():
            try:
                data = json.loads(chosen["data"])
            except ValueError:
                raise _BadRequest("data: not JSON") from None
        if not isinstance(data, dict):
            raise _BadRequest("data: a JSON object of variable names to values")
        try:
            return await self.console.stores.migration(
                chosen["revision"], state_map=state_map, data=data
            )
        except (ChartNotFound, ChartRetired) as missing:
            raise _BadRequest(f"revision: {missing}") from None

    async def start_bulk(self, request: Request) -> Response:
        back = f"{self.base(request)}/bulk"
        session = self.session(request)
        if session is None:
            return self.message(request, None, 401, "Log in first", "This needs a session.")
        if not session.may_act:
            return self.message(
                request, session, 403, "Refused", "A read-only operator cannot act.", back
            )
        fields = await self.form(request)
        if fields is None or not session.csrf_ok(fields.get("csrf")):
            _log.warning("console: a bulk run by %s refused: bad CSRF token", session.operator.name)
            return self.message(request, session, 403, "Refused", _NOT_THIS_SESSION, back)
        try:
            form, where = _execution_filter(fields)
            chosen = {name: fields.get(name, "") for name in _BULK_FIELDS}
            action = await self.bulk_action(chosen)
            confirmed = int(fields.get("confirm", ""))
        except (_BadRequest, ValueError) as error:
            return self.message(request, session, 400, "Not understood", str(error), back)
        try:
            counts = await self.console.stores.previews(action, where)
        except Exception as error:  # noqa: BLE001 - the page and the log say so
            # Outside self.page: answered here, never left to the server's bare 500
            # (which drops the connection).
            said = f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]
            _log.exception(
                "console: bulk %s by %s could not be counted", action.name, session.operator.name
            )
            status = 503 if isinstance(error, StoreFailed) else 500
            return self.message(request, session, status, "Failed", said, back)
        selected = sum(counts)
        if selected != confirmed:
            return await self.bulk_page(
                request, session, form, chosen, action, selected, status=409, changed=True
            )
        actor = session.operator.name
        try:
            # One run per store under one id, as the API starts them.
            run_id = await self.console.stores.start(action, where, actor=actor, selected=counts)
        except Exception as error:  # noqa: BLE001 - the page, the log and the audit say so
            said = f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]
            _log.exception("console: bulk %s by %s could not start", action.name, actor)
            entry = AuditEntry(
                actor, action="bulk", target=action.name, outcome="failed", detail=said
            )
            try:
                await self.console.stores.first.audit.record(entry)
            except Exception:  # noqa: BLE001 - the database that refused the run, most likely
                _log.exception("console: the failed start's audit row could not be written")
            return self.message(request, session, 500, "Failed", said, back)
        return RedirectResponse(f"{back}/{run_id}", status_code=303)

    async def bulk_run(self, request: Request) -> Response:
        """One bulk run: its progress while it runs (the page refreshes itself), then
        its counts and how it ended."""
        run_id = request.path_params["run_id"]

        async def build(session: Session) -> Response:
            found = await self.console.stores.progress(run_id)
            if found is None:
                return self.message(
                    request,
                    session,
                    404,
                    "Not found",
                    "There is no such bulk run.",
                    f"{self.base(request)}/bulk",
                )
            run, state = found
            return self.render(
                request,
                "bulk_run.html",
                session=session,
                nav="executions",
                title=f"Bulk {run.action}",
                run=run,
                state=state,
                again=f"{self.base(request)}/bulk?{urlencode(_again(run))}",
            )

        return await self.page(request, build)

    async def act(self, request: Request, act: _Act) -> Response:
        """The confirmation page (GET) or the act (POST), for an operator only."""
        session = self.session(request)
        if session is None:
            if request.method == "GET":
                return self.to_login(request)
            return self.message(request, None, 401, "Log in first", "This needs a session.")
        if not session.may_act:
            return self.message(
                request, session, 403, "Refused", "A read-only operator cannot act.", act.back
            )
        if request.method == "GET":
            return self.render(
                request,
                "confirm.html",
                session=session,
                title=act.title,
                question=act.question,
                label=act.label,
                action=request.url.path,
                back=act.back,
            )
        fields = await self.form(request)
        if fields is None or not session.csrf_ok(fields.get("csrf")):
            operator = session.operator.name
            _log.warning("console: %s by %s refused: bad CSRF token", act.audit, operator)
            return self.message(request, session, 403, "Refused", _NOT_THIS_SESSION, act.back)
        actor = session.operator.name

        async def record(tx: SqlTransaction, done: actions.Done) -> None:
            # In the action's own transaction: the act and its row commit together.
            entry = AuditEntry(
                actor, action=act.audit, target=act.target, outcome="done", detail=done.summary
            )
            await act.store.audit.record_in(tx, entry)

        try:
            done = await act.run(record)
        except actions.Refused as refused:
            await self.record(actor, act, "refused", str(refused))
            return self.message(request, session, 409, "Nothing done", str(refused), act.back)
        except Exception as error:  # noqa: BLE001 - the page and the audit say what failed
            said = f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]
            _log.exception("console: %s of %s failed", act.audit, act.target)
            await self.record(actor, act, "failed", said)
            return self.message(request, session, 500, "Failed", said, act.back)
        _log.info("console: %s: %s", actor, done.summary)
        if done.secret is not None:  # shown once, on this answer alone
            return self.message(request, session, 200, "Done", done.summary, act.back, done.secret)
        # Back to the page the action was taken from, which says it was done (a reload
        # of it repeats nothing).
        return RedirectResponse(f"{act.back}?{urlencode({'done': act.audit})}", status_code=303)

    async def record(self, actor: str, act: _Act, outcome: str, detail: str) -> None:
        """Write the audit row of an action refused or failed. A row that cannot be
        written (the database that failed the action, most likely) is logged and the
        action's own answer is still given."""
        entry = AuditEntry(
            actor, action=act.audit, target=act.target, outcome=outcome, detail=detail
        )
        try:
            await act.store.audit.record(entry)
        except Exception:  # noqa: BLE001 - the operator still gets the action's answer
            _log.exception(
                "console: the audit row of %s of %s (%s) could not be written",
                act.audit,
                act.target,
                outcome,
            )

    # Trying a revision.

    async def revisions(self, request: Request) -> Response:
        """The form and the jobs kept (GET), or a job started (POST)."""
        if request.method == "POST":
            return await self.try_revision(request)

        async def build(session: Session) -> Response:
            return self.revisions_form(request, session, dict.fromkeys(FILTER_FIELDS, ""))

        return await self.page(request, build)

    def revisions_form(
        self,
        request: Request,
        session: Session,
        form: Mapping[str, str],
        status: int = 200,
        refused: str | None = None,
    ) -> HTMLResponse:
        return self.render(
            request,
            "revisions.html",
            status,
            session=session,
            nav="revisions",
            title="Try a revision",
            form=form,
            refused=refused,
            statuses=[s.value for s in Status],
            jobs=self.console.revisions.jobs(),
            max_bytes=ReadLimits().max_bytes,
            max_executions=MAX_EXECUTIONS,
        )

    async def try_revision(self, request: Request) -> Response:
        """Start a shadow replay of the uploaded chart: every refusal is answered with
        the form again and its reason, and logged; nothing is written."""
        session = self.session(request)
        if session is None:
            return self.message(request, None, 401, "Log in first", "This needs a session.")
        operator = session.operator.name
        form = dict.fromkeys(FILTER_FIELDS, "")

        def refuse(status: int, why: str) -> Response:
            _log.warning("console: a revision from %s was refused: %s", operator, why)
            return self.revisions_form(request, session, form, status, why)

        body = await self.body(request, MAX_UPLOAD_BYTES)
        if body is None:
            return refuse(413, f"The upload is over {MAX_UPLOAD_BYTES} bytes.")
        try:
            posted = parse_form_data(request.headers.get("content-type", ""), body)
        except BadForm as error:
            return refuse(400, f"The form is not understood: {error}.")
        form.update((name, posted.fields.get(name, "")[:200]) for name in FILTER_FIELDS)
        if not session.csrf_ok(posted.fields.get("csrf")):
            _log.warning("console: a revision from %s refused: bad CSRF token", operator)
            return self.message(request, session, 403, "Refused", _NOT_THIS_SESSION)
        storage = self.console.stores.first.router.storage  # compiles as every store's does
        try:
            selection = read_selection(form)
            revision = compile_upload(
                posted.files.get("chart"),
                document=form["document"].strip(),
                functions=storage.functions,
            )
            job = self.console.revisions.start(operator, revision, selection)
        except ChartTooLarge as error:
            return refuse(413, str(error))
        except (ChartRefused, ValueError) as error:
            return refuse(400, str(error))
        except TooManyJobs as error:
            return refuse(429, f"Refused: {error}.")
        return RedirectResponse(
            f"{self.base(request)}/revisions/{quote(job.id, safe='')}", status_code=303
        )

    async def revision(self, request: Request) -> Response:
        """One job: its progress while it runs; then its counts, the executions that
        did not replay the same, and one of them (``?execution=ID``) with where it
        parted drawn on both charts."""
        job_id = request.path_params["job_id"]

        async def build(session: Session) -> Response:
            job = self.console.revisions.get(job_id)
            back = f"{self.base(request)}/revisions"
            if job is None:
                why = "No such replay: it expired, or the console restarted since."
                return self.message(request, session, 404, "Not found", why, back)
            shown = request.query_params.get("execution", "")
            result = job.result(shown) if shown else None
            if shown and result is None:
                raise _BadRequest(f"execution: not one this replay reported: {shown[:80]!r}")
            listed = []
            if job.summary is not None:
                listed = [r for r in job.summary.results if r.verdict is not Verdict.SAME]
            return self.render(
                request,
                "revision.html",
                session=session,
                nav="revisions",
                title=f"Revision {job.revision.identity.name or ''}",
                job=job,
                verdicts=list(Verdict),
                listed=listed[:MAX_LISTED_RESULTS],
                listed_count=len(listed),
                result=result,
                parted=None if result is None else await self.parted(job, result),
            )

        return await self.page(request, build)

    async def parted(self, job: Job, result: ShadowResult) -> _Parted | None:
        """Where ``result`` parted, drawn on the stored chart and on the revision."""
        divergence = result.divergence
        if divergence is None:
            return None
        old = (
            ChartUnavailable("not named by the replay")
            if result.content_hash is None
            else await self.console.machine(result.content_hash, execution_id=result.execution_id)
        )
        rows = [
            (
                name,
                _json_text(divergence.old.datamodel.get(name)),
                _json_text(divergence.new.datamodel.get(name)),
            )
            for name in sorted(divergence.old.datamodel.keys() | divergence.new.datamodel.keys())
        ]
        return _Parted(
            old_diagram=_diagram(old, _side_lit(old, divergence.old)),
            new_diagram=_diagram(job.revision, _side_lit(job.revision, divergence.new)),
            datamodel=rows,
        )

    # Live.

    async def events(self, request: Request) -> Response:
        if self.session(request) is None:
            return Response("log in first", status_code=401, media_type="text/plain")
        live = self.console.live
        try:
            queue = live.join()  # before the answer starts: a refusal is still a 503
        except TooManyClients:
            return Response("too many live clients", status_code=503, media_type="text/plain")

        async def body() -> AsyncIterator[str]:
            try:
                async for chunk in live.stream(queue):
                    yield chunk
            finally:  # the stream ended, or the browser went away
                live.leave(queue)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _loaded(
    router: Router, record: Any, machine: Machine | ChartUnavailable
) -> MachineState | None:
    """The execution's position, ``None`` when it cannot be shown: its chart is
    unavailable, its position pruned, or unreadable (logged as a warning)."""
    if isinstance(machine, ChartUnavailable) or record.position is None:
        return None
    try:
        return router.storage.load(record, machine)
    except (PositionError, PersistenceError) as error:
        _log.warning(
            "console: the position of execution %s cannot be read: %s",
            record.id,
            error,
            extra={"execution_id": record.id},
        )
        return None


def _active(state: MachineState) -> tuple[str, ...]:
    states = state.machine.states
    return tuple(node for index in sorted(state.configuration) if (node := states[index].id))


def _timeline(steps: Sequence[ReplayStep], selected: int | None) -> list[tuple[ReplayStep, bool]]:
    """The steps a timeline lists, each with whether steps were left out before it: all
    of them up to :data:`TIMELINE_LINKS`, else the start, the last and a window around
    the selected step (the last when none is)."""
    if len(steps) <= TIMELINE_LINKS:
        return [(step, False) for step in steps]
    middle = len(steps) - 1 if selected is None else selected
    half = TIMELINE_LINKS // 2
    low, high = max(1, middle - half), min(len(steps) - 1, middle + half)
    chosen = [0, *range(low, high + 1)]
    if chosen[-1] != len(steps) - 1:
        chosen.append(len(steps) - 1)
    listed: list[tuple[ReplayStep, bool]] = []
    previous = -1
    for index in chosen:
        listed.append((steps[index], index != previous + 1))
        previous = index
    return listed


def _step(request: Request, count: int) -> int | None:
    text = request.query_params.get("step", "")
    if not text:
        return None
    if not text.isdigit() or int(text) >= count:
        raise _BadRequest(f"step: a step of the timeline, 0 to {max(count - 1, 0)}")
    return int(text)


def _diagram(machine: Machine | ChartUnavailable, active: Sequence[str]) -> Markup:
    if isinstance(machine, ChartUnavailable):
        return Markup('<p class="note">The chart is {}.</p>').format(machine.why)
    try:
        drawn = render_chart_svg(machine, active)
    except Exception:  # noqa: BLE001 - the rest of the page is still worth showing
        _log.exception("console: the diagram could not be drawn")
        return Markup('<p class="note">The diagram could not be drawn.</p>')
    return Markup(drawn)  # the diagram escapes every text it draws


@dataclass(frozen=True, slots=True)
class _Parted:
    """Where a revision parted from the stored chart, as the page shows it: both
    diagrams lit, and the differing variables as JSON text (old, new)."""

    old_diagram: Markup
    new_diagram: Markup
    datamodel: list[tuple[str, str, str]]


def _side_lit(machine: Machine | ChartUnavailable, side: Side) -> tuple[str, ...]:
    """The states to light for one side of a divergence: the final state it ended in,
    else its active atomic states and their ancestors (as an execution's diagram lights
    its whole configuration)."""
    if side.final_state is not None:
        return (side.final_state,)
    if isinstance(machine, ChartUnavailable):
        return side.configuration
    by_id = {node.id: node for node in machine.states if node.id}
    lit = set(side.configuration)
    for leaf in side.configuration:
        node = by_id.get(leaf)
        if node is not None:
            lit.update(i for index in node.ancestors if (i := machine.states[index].id))
    return tuple(sorted(lit))
