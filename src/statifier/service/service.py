"""The service: one asyncio process running everything a configuration names.

:class:`Service` opens the database (migrating it first when the file says
``migrate = true``, else refusing one whose tables are not at the latest revision),
then runs, on one event loop:

- the HTTP fronts, each mounted at its path in one Starlette app beside ``/healthz``
  and ``/readyz`` (:mod:`statifier.service.health`), served by uvicorn on a socket the
  service binds itself (``127.0.0.1`` unless the file says otherwise), behind a guard
  that bounds the connections and the time a request head may take
  (:mod:`statifier.service.listener`);
- one :class:`~statifier.fronts.consumer.StreamConsumer` per configured source;
- the :class:`~statifier.router.TimerWorker`;
- the :class:`~statifier.router.OutboxDrain`, with every queue's sink
  (:mod:`statifier.service.sinks`);
- the reapers, every ``[reapers] interval`` seconds;
- with ``[console]``, the operator console at ``/console`` on the same listener
  (:mod:`statifier.service.console`, ``docs/console.md``);
- with ``[api]``, the HTTP API at its path on the same listener
  (:mod:`statifier.service.api`, ``docs/api.md``).

A worker or a consumer that fails (the database went away, a broker dropped) is logged
(once per kind of failure and interval, with a count) and started again after a
backoff (1 s, doubling, at most 30 s, and 1 s again after a run of a minute or more);
a worker that returns, or is cancelled by something other than the service, before
the stop has failed too (:class:`Supervised`); meanwhile ``/readyz`` says so, as it
says when a consumer's broker or the database does not answer, or a consumer holds no
partition while others wait (see :mod:`statifier.service.health`).

Several services may run on one PostgreSQL database: timers and outbox rows are
claimed with ``SKIP LOCKED``, and consumers of one source share its partitions through
the source's group; a service killed outright leaves nothing that the others do not
take over (a leased outbox row once its lease runs out, a timer row at once, a
partition once its lease, or the consumer group's session, runs out). With
``[bucket_leases] enabled = true`` they share each store's timer, flow, outbox and
reaper workers by leased slices of its buckets instead of each reading every bucket
(:mod:`statifier.service.bucket_leases`).

:meth:`Service.stop` (what SIGTERM and SIGINT call) stops intake first: the listener
closes and in-flight requests are answered, and consumers stop fetching, finish the
deliveries they started (within half of what is left of the bound: the rest is for
their last commit and their close, which leaves the group) and commit their offsets;
then the fronts' lifespans end (the
service runs them: the server runs none), and a front with group commit routes what it
gathered. Then the workers finish the pass they are in. All of it within
``shutdown_timeout`` seconds; what is still running then is cancelled (its transaction
rolls back, and at-least-once delivery redoes it), and :meth:`Service.run` returns 1
instead of 0; so it does when a worker's or a consumer's task had ended before the
stop (an ERROR names it). A second signal cancels at once.

While it runs, the telemetry bridges the file asks for are installed
(:func:`install_bridges`: ``[logging] events`` and ``[otel] enabled``); they are
uninstalled when :meth:`Service.run` returns or raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TextIO

from statifier.buckets import ALL_BUCKETS
from statifier.extras import MissingExtra
from statifier.persistence import worth_a_traceback
from statifier.persistence.sql import SqlAdapter
from statifier.repeats import Repeats
from statifier.router import (
    FlowWorker,
    Mode,
    OutboxDrain,
    OverLimit,
    Router,
    ShardedRouter,
    TimerWorker,
    reap_addresses,
    reap_dedupe,
    reap_ledger,
    reap_locks,
)
from statifier.router.scheduler import Scheduler, ScheduleState
from statifier.service.api import service_api
from statifier.service.bucket_leases import LeasedWorkers, Worker
from statifier.service.console import ServedConsole, service_console
from statifier.service.consumers import (
    FIRST_RESTART,
    Restarts,
    SupervisedConsumer,
    cancelled_elsewhere,
    log_failure,
    process_owner,
    told,
)
from statifier.service.health import Health, answers, health_routes
from statifier.service.mounts import Mounted, front_app
from statifier.service.settings import BasicHttpFront, HttpSettings, ServiceSettings
from statifier.service.sinks import Sinks, build_sinks
from statifier.service.wiring import router_config
from statifier.sql import TableOptions
from statifier.sql.places import Place, PlaceMismatch

if TYPE_CHECKING:
    import uvicorn

    from statifier.api import Api
    from statifier.service.listener import GuardedServer

__all__ = [
    "ASK_EVERY",
    "Bridge",
    "NotMigrated",
    "Service",
    "Supervised",
    "install_bridges",
    "prepare_database",
]

_log = logging.getLogger("statifier.service")

_EXIT_CLEAN: Final = 0
_EXIT_CUT_SHORT: Final = 1
_EXIT_MISPLACED: Final = 3
"""A store's record changed while the service ran (a reshard began): it stopped."""
_SHOWN_SCHEDULES: Final = 10
"""The most names of stored schedules a file leaves out the start's warning lists."""
ASK_EVERY: Final = 1.0
"""Seconds between the questions a part waiting to restart asks its store (whether it
answers: :func:`statifier.service.health.answers`, each bounded by
:data:`~statifier.service.health.ANSWER_WITHIN`)."""


class NotMigrated(RuntimeError):  # noqa: N818 - names the refusal
    """The database's tables are missing or behind, and the file does not say
    ``migrate = true``."""


# Telemetry.


class Bridge(Protocol):
    """An installed telemetry bridge (:mod:`statifier.observability`)."""

    def uninstall(self) -> None:
        """Detach it from telemetry."""


def install_bridges(settings: ServiceSettings) -> list[Bridge]:
    """Install the bridges ``settings`` asks for and answer them (the caller
    uninstalls them): one log record per telemetry event on the logger
    ``statifier.events`` when ``[logging] events`` (metadata through the default
    :class:`~statifier.observability.FieldPolicy`, so secret-named keys never pass),
    and spans and metrics on the global OpenTelemetry providers when ``[otel]
    enabled``.

    Raises:
        MissingExtra: ``[otel] enabled`` without the ``otel`` extra (nothing stays
            installed).
    """
    from statifier.observability import install_logging

    bridges: list[Bridge] = []
    if settings.otel.enabled:
        try:
            from statifier.observability.otel import install_otel
        except ModuleNotFoundError as missing:
            raise MissingExtra.of(missing) from missing
        bridges.append(install_otel())
    if settings.logging.events:
        bridges.append(install_logging())
    return bridges


# The database.


def _options(settings: ServiceSettings) -> TableOptions:
    database = settings.database
    return TableOptions(prefix=database.prefix, schema=database.schema, locks=database.locks)


def prepare_database(settings: ServiceSettings) -> None:
    """Migrate the database, or each store of ``[database] shards``, one after the
    other (``migrate = true``), or check that it is migrated, through
    :func:`statifier.sql.migrations.prepare`: the migration holds the migration lock
    (``statifier db upgrade`` and ``Durable(migrate=True)`` take the same one), so
    services starting together migrate one after the other.

    Each store claims its place in the list (``statifier.sql.places``): a store that
    holds another, or that a reshard is moving or emptied, refuses the start.

    Raises:
        NotMigrated: not migrated, and the file does not ask for it.
        PlaceMismatch: a store holds another place than the list gives it, or a
            reshard is moving its buckets or moved them away.
        MigrationBusy: another process held the migration lock too long.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached.
    """
    from statifier.sql import migrations
    from statifier.sql.locations import upgrade_locations

    options = _options(settings)
    locations = any(isinstance(front, BasicHttpFront) for front in settings.fronts)
    then = (lambda connection: upgrade_locations(connection, options)) if locations else None
    urls = settings.database.urls
    try:
        for number, url in enumerate(urls):
            place = Place.serving(number, len(urls))
            migrations.prepare(url, options, migrate=settings.migrate, then=then, place=place)
    except migrations.NotAtHead as behind:
        found = f"at revision {behind.revision}" if behind.revision else "not there"
        raise NotMigrated(
            f"the database's {options.prefix}* tables are {found}, and this release needs "
            f"revision {behind.head}: run `statifier db upgrade` (with the same --url and "
            "--prefix) first, or set migrate = true in the configuration"
        ) from None
    if not locations or settings.migrate:
        return
    for number, url in enumerate(urls):
        if not _has_locations(url, options):
            where = f" in store {number}" if settings.database.shards else ""
            raise NotMigrated(
                f"the BasicHTTP front needs the table {options.prefix}locations{where}: "
                "set migrate = true, or create it with "
                "statifier.sql.locations.upgrade_locations"
            )


def _has_locations(url: str, options: TableOptions) -> bool:
    import sqlalchemy as sa

    from statifier.sql.engines import database_url, new_engine

    engine = new_engine(database_url(url))
    try:
        names = sa.inspect(engine).get_table_names(schema=options.schema)
    finally:
        engine.dispose()
    return f"{options.prefix}locations" in names


# Supervision.


class Supervised:
    """One long-running part (a worker): ``work()`` run until ``stop`` is set, and
    started again after a backoff (``first_restart`` seconds, doubling to
    :data:`LAST_RESTART`, and ``first_restart`` again after a run of
    :data:`HEALTHY_RUN` seconds or more) whenever it raises, returns before ``stop``
    is set, or ends by a cancellation its task was not sent (a future someone else
    cancelled); its failures are logged at ERROR, with their traceback, once per kind
    and interval, with a count. Only a cancel of its own task (the service's, at the
    bound of a stop) ends it before ``stop``.

    A part working on one store is given ``answers``, which asks the store whether it
    answers: while the part waits to restart, the store is asked every
    :data:`ASK_EVERY` seconds, and once it was seen not answering, the part starts
    again as soon as it answers, not at the end of a wait that doubled through an
    outage (its timers and outbox rows late by up to :data:`LAST_RESTART` seconds,
    readiness red meanwhile). A part that fails with its store answering waits out its
    backoff.

    Args:
        name: the part's name, in logs and readiness reasons.
        work: runs the part; returns once ``stop`` is set.
        stop: set when the part is to stop.
        first_restart: the seconds before the first restart, where the backoff
            starts (:data:`FIRST_RESTART` by default).
        watch: what the running part says of its own trouble (a part that outlives
            its failures without raising, as an outbox drain does), ``None`` if nothing.
        answers: whether the part's store answers now (never raises), ``None`` for a
            part of no one store.
    """

    def __init__(
        self,
        name: str,
        work: Callable[[], Awaitable[None]],
        stop: asyncio.Event,
        *,
        first_restart: float = FIRST_RESTART,
        watch: Callable[[], str | None] | None = None,
        answers: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.name = name
        self.work = work
        self.stop = stop
        self.first_restart = first_restart
        self.watch = watch
        self.answers = answers
        self.failure: str | None = None
        self.task: asyncio.Task[None] | None = None
        self._repeats = Repeats()

    def start(self) -> None:
        """Run the part in a task of its own (:attr:`task`)."""
        self.task = asyncio.create_task(self._run(), name=self.name)

    def trouble(self) -> str | None:
        """``None`` while the part runs and its ``watch`` sees no trouble, else why not."""
        if self.task is None or self.task.done():
            return "not running"
        if self.failure is not None:
            return f"restarting after {self.failure}"
        return None if self.watch is None else self.watch()

    async def _run(self) -> None:
        restarts = Restarts(self.first_restart)
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                await self.work()
                if self.stop.is_set():
                    return
                raise RuntimeError(f"{self.name} returned before its stop")
            except asyncio.CancelledError as cancelled:
                if not cancelled_elsewhere(self.stop.is_set()):
                    raise  # the service's own cancel, at the bound of a stop
                self.failure = type(cancelled).__name__
                wait = restarts.after(ran=time.monotonic() - began)
                log_failure(self._repeats, self.name, cancelled, wait)
            except Exception as error:  # noqa: BLE001 - a part outlives its failures
                self.failure = type(error).__name__
                wait = restarts.after(ran=time.monotonic() - began)
                log_failure(self._repeats, self.name, error, wait)
            await self._restart_after(wait)
            self.failure = None

    async def _restart_after(self, wait: float) -> None:
        """Return after ``wait`` seconds, once ``stop`` is set, or (given
        :attr:`answers`) once the store answers after it was seen not answering."""
        deadline = time.monotonic() + wait
        down = False
        while (left := deadline - time.monotonic()) > 0 and not self.stop.is_set():
            step = left if self.answers is None else min(left, ASK_EVERY)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), step)
            if self.answers is None or self.stop.is_set() or time.monotonic() >= deadline:
                continue
            if await self.answers():
                if down:
                    _log.info("%s: its store answers again: starting it now", self.name)
                    return
            else:
                down = True


def _warn_flow_elsewhere(settings: ServiceSettings) -> None:
    """Say, once at start, that the bindings holding events, and the caps holding the
    creates beyond them (``over = "hold"``), wait for a flow worker this service does
    not run (``[flow] enabled = false``)."""
    holding = [b.id for b in settings.bindings if b.enabled and b.mode is not Mode.EACH]
    if holding:
        _log.warning(
            "[flow] enabled = false: what bindings %s hold is delivered only by a flow "
            "worker elsewhere on this database",
            ", ".join(repr(name) for name in holding),
        )
    capped = [name for name, cap in settings.caps.items() if cap.over is OverLimit.HOLD]
    if capped:
        _log.warning(
            '[flow] enabled = false: the creates the caps of %s hold (over = "hold") are '
            "made only by a flow worker elsewhere on this database",
            ", ".join(repr(name) for name in capped),
        )


async def _all_states(scheduler: Scheduler) -> AsyncIterator[ScheduleState]:
    """Every stored schedule that can be read, by name, a page at a time (one that
    cannot is logged by the scheduler, and passed)."""
    after = ""
    while True:
        page = await scheduler.page(after=after)
        for state in page.states:
            yield state
        if page.last is None:
            return
        after = page.last


def _stores(routing: Router | ShardedRouter) -> tuple[Router, ...]:
    """Each store's router: a sharded router's, else the one."""
    return routing.routers if isinstance(routing, ShardedRouter) else (routing,)


def _draining(
    name: str, drain: OutboxDrain, idle: float, stop: asyncio.Event, store: SqlAdapter
) -> Supervised:
    """The worker ``name`` running ``drain`` until ``stop``, on ``store``; readiness
    says while its passes fail."""

    def failing() -> str | None:
        return None if drain.failure is None else f"passes failing: {drain.failure}"

    work = partial(drain.run, stop, idle)
    return Supervised(name, work, stop, watch=failing, answers=partial(answers, store))


def _scheduling(scheduler: Scheduler, stop: asyncio.Event, store: SqlAdapter) -> Supervised:
    """The worker running ``scheduler`` until ``stop``, on ``store`` (the first);
    readiness says while schedules' fires fail (three named at most, then how many
    more)."""

    def failing() -> str | None:
        names = scheduler.failing()
        if not names:
            return None
        more = len(names) - 3
        return f"schedules failing: {', '.join(names[:3])}" + (
            f" and {more} more" if more > 0 else ""
        )

    work = partial(scheduler.run, stop)
    return Supervised("scheduler", work, stop, watch=failing, answers=partial(answers, store))


def _in_store(number: int) -> Callable[[str], str]:
    """How a worker of store ``number`` is named (in health reasons and logs)."""
    return lambda part: f"{part} (store {number})"


def _in_range(named: Callable[[str], str], piece: tuple[int, int]) -> Callable[[str], str]:
    """How a worker of leased buckets ``piece`` is named: ``timers (buckets 0-512)``."""
    return lambda part: named(f"{part} (buckets {piece[0]}-{piece[1]})")


async def _in_pages(delete: Callable[[], Awaitable[int]], limit: int, stop: asyncio.Event) -> None:
    """Call ``delete`` (a reaper that deletes at most ``limit`` rows and answers how
    many) until a call deletes fewer, or ``stop``: a backlog goes in short
    transactions."""
    while not stop.is_set():
        if await delete() < limit:
            return


async def _reap(
    router: Router,
    settings: ServiceSettings,
    stop: asyncio.Event,
    buckets: tuple[int, int] | None,
    *,
    locks: bool = True,
) -> None:
    """Run the reapers every ``interval`` seconds until ``stop``: the expired dedupe
    claims, old ledger rows and unused addresses of ``buckets`` (none: not these), and
    with ``locks`` the lock rows no one holds (they belong to no bucket); a failed
    pass is logged (once per kind of failure and interval), and the next comes on
    schedule."""
    every = settings.reapers
    repeats = Repeats()
    while not stop.is_set():
        try:
            now = datetime.now(UTC)
            limit = every.limit
            if buckets is not None:
                await _reap_buckets(router, settings, now, buckets, stop)
            lock_after: int | None = None
            while locks and not stop.is_set():
                page = await reap_locks(router, limit=limit, after=lock_after)
                if page.next is None:
                    break
                lock_after = page.next
        except Exception as error:  # noqa: BLE001 - the next pass may succeed
            repeats.log(
                _log,
                logging.ERROR,
                type(error).__name__,
                "a reaper pass failed (%s); the next comes in %g s",
                told(error),
                every.interval,
                extra={"part": "reapers", "error": type(error).__name__},
                exc_info=worth_a_traceback(error),
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every.interval)


async def _reap_buckets(
    router: Router,
    settings: ServiceSettings,
    now: datetime,
    buckets: tuple[int, int],
    stop: asyncio.Event,
) -> None:
    """One pass over ``buckets``: expired dedupe claims, ledger rows older than
    ``ledger_days``, addresses whose executions are gone."""
    every = settings.reapers
    limit = every.limit
    await _in_pages(partial(reap_dedupe, router, now, buckets=buckets, limit=limit), limit, stop)
    if every.ledger_days:
        before = now - timedelta(days=every.ledger_days)
        ledger = partial(reap_ledger, router, before, buckets=buckets, limit=limit)
        await _in_pages(ledger, limit, stop)
    after: Any = None
    while not stop.is_set():
        page = await reap_addresses(router, now, limit=limit, after=after, buckets=buckets)
        if page.next is None:
            return
        after = page.next


# HTTP.


def _listening_socket(host: str, port: int) -> socket.socket:
    """A bound socket for uvicorn: bound here so that port 0 names a free port the
    service can report, and an address in use is a clear error before anything runs.

    Raises:
        OSError: the address cannot be bound (named in the message).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        listener = socket.socket(family, kind, proto)
    except OSError as error:
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
    except OSError as error:
        listener.close()
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return listener


def _http_server() -> Callable[[Any, HttpSettings, socket.socket, float], GuardedServer]:
    """What builds the HTTP server (:func:`statifier.service.listener.http_server`),
    imported here so that a missing ``http`` extra is refused before anything binds.

    Raises:
        MissingExtra: uvicorn is not installed.
    """
    try:
        from statifier.service.listener import http_server
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing
    return http_server


def _ended(parts: Sequence[Worker | SupervisedConsumer]) -> list[str]:
    """The names of the parts of ``parts`` whose task ended, though each is to run
    until its stop; an ERROR names each (the stop is then not clean: exit status 1)."""
    ended: list[str] = []
    for part in parts:
        task = part.task
        if task is None or not task.done():
            continue
        how = "was cancelled" if task.cancelled() else "ended"
        failed = None if task.cancelled() else task.exception()
        _log.error("%s %s before the stop", part.name, how, exc_info=failed)
        ended.append(part.name)
    return ended


async def _abandon(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel what of ``tasks`` still runs, and wait for it to end."""
    left = [task for task in tasks if not task.done()]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left)


async def check_places(
    stores: Sequence[tuple[SqlAdapter, Place | None]], repeats: Repeats
) -> str | None:
    """One turn of a running service's check of its stores (those given a place):
    why the first store that no longer holds its place does not (``"store N: ..."``,
    ``"the database: ..."`` when there is one store), or ``None`` once each that
    answered holds it and has its ``seen_at`` set
    (:func:`statifier.sql.places.check_and_say_seen`). A check that fails (a store
    that does not answer) is logged as a warning, one line per store and error class
    every ``repeats.interval`` seconds, and skipped: while it fails, ``statifier
    reshard`` cannot see the service."""
    from statifier.sql.places import check_and_say_seen

    for number, (adapter, place) in enumerate(stores):
        if place is None:
            continue
        try:
            async with adapter.transaction() as tx:
                options, now = adapter.tables.options, datetime.now(UTC)
                said = await check_and_say_seen(adapter.dialect, tx.driver, options, place, now)
        except PlaceMismatch as error:
            said = str(error)
        except Exception as error:  # noqa: BLE001 - tried again next turn
            repeats.log(
                _log,
                logging.WARNING,
                ("places", number, type(error).__name__),
                "store %d: checking its place failed (statifier reshard cannot see this "
                "service meanwhile): %s: %s",
                number,
                type(error).__name__,
                error,
            )
            continue
        if said is not None:
            where = f"store {number}" if len(stores) > 1 else "the database"
            return f"{where}: {said}"
    return None


class Service:
    """Everything one configuration names, in one asyncio process (see the module
    docstring).

    Args:
        settings: the checked configuration (:func:`statifier.service.config_file.load`).
        out: where the service says where it listens and that it stopped.
    """

    def __init__(self, settings: ServiceSettings, out: TextIO | None = None) -> None:
        self.settings = settings
        self.out = out
        self.address: tuple[str, int] | None = None
        """Where it listens, once it does."""
        self._stopping = asyncio.Event()
        self._workers_stop = asyncio.Event()
        self._forced = asyncio.Event()
        self._console: ServedConsole | None = None
        self._api: Api | None = None
        self._misplaced: str | None = None
        """Why the service stopped by itself: a store's record changed while it ran."""
        self._ended: list[str] = []
        """The parts whose task had ended before the stop (a stop then exits 1)."""

    def stop(self) -> None:
        """Begin the orderly stop (SIGTERM, SIGINT); a second call cancels at once."""
        if self._stopping.is_set():
            self._forced.set()
        self._stopping.set()

    async def run(self) -> int:
        """Start everything, run until :meth:`stop`, stop in order; returns 0 when
        everything ran until the stop and stopped within ``shutdown_timeout``, else 1
        (a part whose task had ended before the stop is named in an ERROR); 3 when the
        service stopped by itself because a store no longer held its place (a reshard
        began).

        Raises:
            NotMigrated: the database is not migrated (and the file does not ask).
            PlaceMismatch: a store holds another place than the list gives it, or a
                reshard is moving its buckets or moved them away.
            ServiceConfigError: a front, sink or source the configuration names cannot
                be built.
            OSError: the listener cannot be bound.
            MissingExtra: a library the configuration needs is not installed.
        """
        bridges = install_bridges(self.settings)
        try:
            # Synchronous (Alembic's), and before anything else runs on the loop.
            prepare_database(self.settings)
            async with self._opened() as (router, health, sinks):
                status = await self._serve(router, health, sinks)
            return _EXIT_MISPLACED if self._misplaced is not None else status
        finally:
            for bridge in bridges:
                bridge.uninstall()

    @contextlib.asynccontextmanager
    async def _opened(
        self,
    ) -> AsyncIterator[tuple[Router | ShardedRouter, Health, list[Sinks]]]:
        """The router (over every store of ``[database] shards``, else over the one
        database), the health checks and each store's sinks, closed when the block
        ends."""
        options = _options(self.settings)
        adapters = [SqlAdapter(url, options) for url in self.settings.database.urls]
        try:
            config = router_config(self.settings, adapters[0])
            routing = ShardedRouter(config, adapters) if len(adapters) > 1 else Router(config)
            sinks: list[Sinks] = []
            try:
                # One by one: the sinks built before one that raises are closed.
                sinks.extend(build_sinks(self.settings, router) for router in _stores(routing))
                places = [Place.serving(n, len(adapters)) for n in range(len(adapters))]
                yield routing, Health(*adapters, places=places), sinks
            finally:
                for built in sinks:
                    await built.aclose()
        finally:
            async with contextlib.AsyncExitStack() as closing:  # each, whatever raises
                for adapter in reversed(adapters):  # closed in store order
                    closing.push_async_callback(adapter.close)

    async def _serve(
        self, routing: Router | ShardedRouter, health: Health, sinks: list[Sinks]
    ) -> int:
        settings = self.settings
        from starlette.applications import Starlette

        # Everything that can be refused is built before any task starts. The fronts,
        # the console and the API route over every store (one over one database).
        front_apps = [front_app(front, routing, settings.file) for front in settings.fronts]
        fronts = [(f.path, app) for f, app in zip(settings.fronts, front_apps, strict=True)]
        routes: list[Any] = list(health_routes(health))
        if settings.console.enabled:
            self._console = service_console(settings, routing)
            routes.extend(self._console.routes)
        if settings.api.enabled:
            # The console's stores: a bulk run started by either is going for both.
            shared = None if self._console is None else self._console.console.stores
            self._api = service_api(settings, routing, shared)
            fronts.append((settings.api.path, self._api.app))
        app = Mounted(fronts, Starlette(routes=routes))
        # The server runs no lifespan: the service runs the fronts' (a group commit's
        # gatherer closes in its front's), and closes them once intake has stopped.
        lifespans = contextlib.AsyncExitStack()
        make_server = _http_server()
        consumers = [
            SupervisedConsumer(source, routing, settings.file) for source in settings.sources
        ]
        for consumer in consumers:
            consumer.prepare()
        scheduler = await self._put_schedules(routing)
        workers = self._workers(routing, sinks, scheduler)
        listener = _listening_socket(settings.http.host, settings.http.port)
        try:
            server = make_server(app, settings.http, listener, settings.shutdown_timeout)
        except BaseException:
            listener.close()
            raise
        host, port = listener.getsockname()[:2]
        loop = asyncio.get_running_loop()
        started: list[asyncio.Task[Any]] = []
        parts: list[Worker | SupervisedConsumer] = [*workers, *consumers]
        try:
            for front in front_apps:
                await lifespans.enter_async_context(front.router.lifespan_context(front))
            for part in parts:
                health.watch(part.name, part.trouble)
                part.start()
                assert part.task is not None
                started.append(part.task)
            started.append(asyncio.create_task(self._watch_places(health), name="places"))
            serving = asyncio.create_task(server.serve(), name="http")
            started.append(serving)
            health.watch("http", lambda: None if server.started else "not listening yet")
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
            # uvicorn sets a flag, not an event, once it listens.
            while not server.started and not serving.done():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            if serving.done():
                serving.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped before it started")
            self.address = (host, port)
            self._say(f"listening on http://{host}:{port}")
            if self._api is not None:
                self._say(f"API at http://{host}:{port}{settings.api.path}/")
            if self._console is not None:
                self._say(f"console at http://{host}:{port}/console/")
                if self._console.generated is not None:
                    # Said once, to whoever started the service; never logged.
                    self._say(f"console login token (this start only): {self._console.generated}")
            stopped = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({stopped, serving}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            status = await self._shutdown(server, serving, consumers, workers, health, lifespans)
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            listener.close()
            await _abandon(started)  # after an orderly stop, nothing is left
            # After an orderly stop, closed already; else (a stop cut short, or a
            # failed start) a second at most, then cancelled: a group commit's batch
            # waiting for a lock must not hold the exit for its lock_wait.
            closing = asyncio.ensure_future(lifespans.aclose())
            await self._within([closing], loop.time() + 1.0)
        if status == _EXIT_CLEAN:
            self._say("stopped")
        elif self._ended:
            self._say(f"stopped; ended before the stop: {', '.join(self._ended)}")
        else:
            self._say("stopped, cut short by shutdown_timeout")
        return status

    async def _watch_places(self, health: Health) -> None:
        """Every ``SEEN_EVERY`` seconds, :func:`check_places`; once a store does not
        hold its place (a reshard marked it moving), log an error and stop the
        service: it must not write to stores whose buckets move."""
        from statifier.sql.places import SEEN_EVERY

        repeats = Repeats()
        stores = list(zip(health.adapters, health.places, strict=True))
        while not self._stopping.is_set():
            said = await check_places(stores, repeats)
            if said is not None:
                self._misplaced = said
                _log.error(
                    "%s; the service stops: it must not write while a reshard moves "
                    "buckets (start it again on the stores' new list once it is done)",
                    said,
                )
                self.stop()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), SEEN_EVERY)

    async def _put_schedules(self, router: Router | ShardedRouter) -> Scheduler:
        """Put the file's schedules on the database (each keeps its paused state and,
        its times unchanged, its next fire); warn of the stored ones the file does not
        name, which still fire. Answers the scheduler this service runs.

        Raises:
            ScheduleError: a schedule's first fire cannot be computed.
        """
        found = self.settings.scheduler
        scheduler = Scheduler(
            router,
            retry=timedelta(seconds=found.retry),
            max_retry=timedelta(seconds=found.max_retry),
            poll=found.poll,
        )
        named: set[str] = set()
        for schedule in self.settings.schedules:
            await scheduler.put(schedule)
            named.add(schedule.name)
        others = [
            state.schedule.name
            async for state in _all_states(scheduler)
            if state.schedule.name not in named
        ]
        if others:
            _log.warning(
                "%d schedule(s) in the database are not in %s and still fire: %s "
                "(`statifier schedules remove NAME` drops one)",
                len(others),
                self.settings.file,
                ", ".join(others[:_SHOWN_SCHEDULES])
                + (", ..." if len(others) > _SHOWN_SCHEDULES else ""),
            )
        return scheduler

    def _workers(
        self, routing: Router | ShardedRouter, sinks: list[Sinks], scheduler: Scheduler
    ) -> list[Worker]:
        """The workers: the scheduler, and each store's timers, flow, outbox drain and
        reapers (over several stores, each named with its store's number, its timers,
        held groups, outbox rows, addresses and dedupe claims those of its range of
        buckets, and each store's drain of the sends between stores). With bucket
        leases, a store's timers, flow, outbox and reapers run over the slices of its
        range this service leases (:class:`LeasedWorkers`)."""
        settings, stop = self.settings, self._workers_stop
        stores = _stores(routing)
        workers: list[Worker] = []
        if settings.scheduler.enabled:
            workers.append(_scheduling(scheduler, stop, stores[0].adapter))
        if not settings.flow.enabled:
            _warn_flow_elsewhere(settings)
        outbox = settings.outbox
        hops = (
            routing.hop_drains(batch=outbox.batch, lease=outbox.lease)
            if isinstance(routing, ShardedRouter)
            else []
        )
        ranges = routing.shard_map.ranges if isinstance(routing, ShardedRouter) else (ALL_BUCKETS,)
        for number, router in enumerate(stores):
            named = (lambda part: part) if len(stores) == 1 else _in_store(number)
            workers.extend(self._range_workers(router, sinks[number], named, ranges[number]))
            if hops:
                hop = hops[number]
                workers.append(_draining(named("hops"), hop, outbox.idle, stop, router.adapter))
        return workers

    def _range_workers(
        self,
        router: Router,
        sinks: Sinks,
        named: Callable[[str], str],
        buckets: tuple[int, int],
    ) -> list[Worker]:
        """A store's timers, flow, outbox drain and reapers over its range of buckets,
        or, with bucket leases, the part that runs them over the slices leased (each
        of them: the file reader refuses bucket leases beside a timer, flow or reaper
        worker turned off, whose work of the slices leased no service would do)."""
        settings, stop = self.settings, self._workers_stop
        leases = settings.bucket_leases
        if not leases.enabled:
            return [*self._store_workers(router, sinks, named, buckets, stop)]

        def build(piece: tuple[int, int], ended: asyncio.Event) -> list[Supervised]:
            in_range = _in_range(named, piece)
            return self._store_workers(router, sinks, in_range, piece, ended, reap_locks=False)

        # The lock rows belong to no bucket: reaped once per store, whatever is leased.
        locks: list[Worker] = []
        if settings.reapers.enabled:
            reap = partial(_reap, router, settings, stop, None)
            asked = partial(answers, router.adapter)
            locks.append(Supervised(named("reapers (locks)"), reap, stop, answers=asked))
        return [
            *locks,
            LeasedWorkers(
                named("workers"),
                router.adapter,
                buckets,
                build,
                stop,
                owner=process_owner(),
                slices=leases.slices,
                ttl=leases.ttl,
            ),
        ]

    def _store_workers(
        self,
        router: Router,
        sinks: Sinks,
        named: Callable[[str], str],
        buckets: tuple[int, int],
        stop: asyncio.Event,
        *,
        reap_locks: bool = True,
    ) -> list[Supervised]:
        """The timers, flow, outbox drain and reapers of ``buckets``, each stopped by
        ``stop``; the reapers reap the lock rows too unless ``reap_locks`` is false."""
        settings = self.settings
        workers: list[Supervised] = []
        asked = partial(answers, router.adapter)
        if settings.timers.enabled:
            timers = settings.timers
            worker = TimerWorker(
                router, batch=timers.batch, poll=timers.poll, retry=timers.retry, buckets=buckets
            )
            work = partial(worker.run, stop)
            workers.append(Supervised(named("timers"), work, stop, answers=asked))
        if settings.flow.enabled:
            found = settings.flow
            flow = FlowWorker(
                router,
                poll=found.poll,
                retry=timedelta(seconds=found.retry),
                max_retry=timedelta(seconds=found.max_retry),
                buckets=buckets,
            )
            run = partial(flow.run, stop)
            workers.append(Supervised(named("flow"), run, stop, answers=asked))
        outbox = settings.outbox
        drain = OutboxDrain(
            router.storage,
            sinks.by_queue,
            max_attempts=outbox.max_attempts,
            backoff=outbox.backoff,
            lease=outbox.lease,
            batch=outbox.batch,
            buckets=buckets,
        )
        workers.append(_draining(named("outbox"), drain, outbox.idle, stop, router.adapter))
        if settings.reapers.enabled:
            reap = partial(_reap, router, settings, stop, buckets, locks=reap_locks)
            workers.append(Supervised(named("reapers"), reap, stop, answers=asked))
        return workers

    async def _shutdown(
        self,
        server: uvicorn.Server,
        serving: asyncio.Task[None],
        consumers: list[SupervisedConsumer],
        workers: list[Worker],
        health: Health,
        lifespans: contextlib.AsyncExitStack,
    ) -> int:
        """Intake first (HTTP, consumers, then the fronts' lifespans: what a group commit
        gathered is routed), then the workers, within the bound."""
        health.stopping = True
        self._ended = _ended(consumers)
        if self._console is not None:
            # Its event streams would hold the listener open; its replays, threads.
            self._console.close()
            await self._console.console.bulk_runs.close()  # each run's row says it stopped
        if self._api is not None:
            await self._api.close()  # its waiting calls are answered now
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_timeout
        _log.info(
            "stopping: intake first, then the workers (at most %g s)",
            self.settings.shutdown_timeout,
        )
        server.should_exit = True
        # Half the bound at most for the deliveries in flight: the last commit and the
        # close (which leaves the group; cut short, the other members wait a session
        # timeout for the partitions) must not be what the bound cancels.
        drain = (deadline - loop.time()) / 2
        intake = [
            serving,
            *(asyncio.create_task(c.stop(drain_timeout=drain), name=c.name) for c in consumers),
        ]
        clean = await self._within(intake, deadline)
        closing = asyncio.create_task(lifespans.aclose(), name="fronts")
        # Started before the bound may cancel it: a task cancelled before its first
        # step never runs, and the fronts' close would be left to the unbounded end.
        await asyncio.sleep(0)
        clean = await self._within([closing], deadline) and clean
        self._ended.extend(_ended(workers))
        self._workers_stop.set()
        tasks = [worker.task for worker in workers if worker.task is not None]
        clean = await self._within(tasks, deadline) and clean
        if serving.done() and not serving.cancelled() and serving.exception() is not None:
            _log.error("the HTTP server failed", exc_info=serving.exception())
            clean = False
        return _EXIT_CLEAN if clean and not self._ended else _EXIT_CUT_SHORT

    async def _within(self, tasks: list[asyncio.Task[Any]], deadline: float) -> bool:
        """Wait for ``tasks`` until ``deadline`` (or a second signal); cancel what is
        left. Returns whether all of them finished on their own."""
        if not tasks:
            return True
        loop = asyncio.get_running_loop()
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            pending = set(tasks)
            while pending and not self._forced.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    break
                _, pending = await asyncio.wait(
                    {*pending, forced}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(forced)
        finally:
            forced.cancel()
        for task in pending:
            _log.warning("cancelling %s: it did not stop in time", task.get_name())
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        return not pending

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out.write(f"statifier serve: {line}\n")
            self.out.flush()
