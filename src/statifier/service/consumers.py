"""The stream consumers a configuration names: one
:class:`~statifier.fronts.consumer.StreamConsumer` per ``[sources.NAME]``, over the
source its ``kind`` builds, kept running by the service.

A source's module is imported only when a source of its kind is configured, so a
service without one needs no broker client; a missing client library is a
:class:`~statifier.extras.MissingExtra` naming the extra to install.

Members of one consumer group share the partitions (the inbound-events table and
NATS: by the lease tables of the service's own database; each member's ``owner`` is
:func:`process_owner` unless the file names one), so several services on one database
share a source and take over the partitions of one that dies. A consumer started again
after a failure keeps its process's owner, so it takes its own leases back at once
rather than waiting for them to run out.

A failed consumer is started again after a backoff (:class:`Restarts`); its failures
are logged once per kind and interval (:class:`~statifier.repeats.Repeats`), and
meanwhile :meth:`SupervisedConsumer.trouble` says why it does not read, for
``/readyz``: restarting, not started yet, or what its source says (a broker that does
not answer, leases not renewed, no partition while others wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from statifier.error_text import error_text
from statifier.extras import MissingExtra
from statifier.fronts.source import Message, Rebalance, Source
from statifier.persistence import worth_a_traceback
from statifier.repeats import Repeats
from statifier.router import Router, ShardedRouter
from statifier.service.settings import (
    InboundTableOptions,
    KafkaOptions,
    NatsOptions,
    ServiceConfigError,
    SourceSettings,
)

if TYPE_CHECKING:
    from statifier.fronts.consumer import StreamConsumer

__all__ = [
    "FIRST_RESTART",
    "HEALTHY_RUN",
    "LAST_RESTART",
    "Restarts",
    "SupervisedConsumer",
    "Troubled",
    "build_source",
    "log_failure",
    "process_owner",
]

_log = logging.getLogger("statifier.service")

FIRST_RESTART: Final = 1.0
"""Seconds before a failed part (a consumer, a worker) is started again the first
time; the wait doubles after each further failure, to at most ``LAST_RESTART``."""
LAST_RESTART: Final = 30.0
_TOLD: Final = 300
"""Characters at most of a failure's class and message in its line."""
HEALTHY_RUN: Final = 60.0
"""Seconds a part must have run before it failed for its next restart to wait
``FIRST_RESTART`` again: a failure after a healthy run is a new trouble, not one more
of a series."""

_OWNERS: dict[int, str] = {}


def process_owner() -> str:
    """This process's name in the consumer groups whose leases are in the database:
    ``<host>-<pid>-<random>``, the same for every source and every restart of a
    consumer in this process (so a restarted consumer holds its leases still), and
    another in every other process, a forked child included."""
    pid = os.getpid()
    owner = _OWNERS.get(pid)
    if owner is None:
        owner = _OWNERS[pid] = f"{socket.gethostname()}-{pid}-{secrets.token_hex(4)}"
    return owner


@dataclass
class Restarts:
    """The waits between the restarts of a supervised part: ``first`` seconds
    (``FIRST_RESTART`` by default), doubling after each failure to at most
    ``LAST_RESTART``, and ``first`` again after a run of at least ``HEALTHY_RUN``
    seconds.

    >>> restarts = Restarts()
    >>> [restarts.after(ran=0.5) for _ in range(7)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    >>> restarts.after(ran=HEALTHY_RUN)
    1.0
    """

    first: float = FIRST_RESTART
    next_wait: float = field(init=False)

    def __post_init__(self) -> None:
        self.next_wait = self.first

    def after(self, *, ran: float) -> float:
        """The seconds to wait before the next start, after a run of ``ran`` seconds
        that failed."""
        if ran >= HEALTHY_RUN:
            self.next_wait = self.first
        wait = self.next_wait
        self.next_wait = min(wait * 2, LAST_RESTART)
        return wait


@runtime_checkable
class Troubled(Protocol):
    """A source that can say what keeps it from reading (for ``/readyz``)."""

    def trouble(self) -> str | None:
        """``None`` while it reads, else why not: one short phrase naming no address
        and no secret."""


def told(error: BaseException) -> str:
    """``error``'s class and message, as a failure's log line gives them (at most
    :data:`_TOLD` characters)."""
    return error_text(error, _TOLD)


def log_failure(repeats: Repeats, name: str, error: BaseException, wait: float) -> None:
    """Log a supervised part's failure (its class and message, and its traceback
    unless the database did not answer: :func:`~statifier.persistence.errors.worth_a_traceback`)
    and the wait before its restart, once per part, kind of error and interval. A
    cancellation the part was not sent (:func:`cancelled_elsewhere`) is such a
    failure."""
    how = (
        "was cancelled, though the service is not stopping;"
        if isinstance(error, asyncio.CancelledError)
        else f"failed ({told(error)});"
    )
    repeats.log(
        _log,
        logging.ERROR,
        (name, type(error).__name__),
        "%s %s starting it again in %.0f s",
        name,
        how,
        wait,
        extra={"part": name, "error": type(error).__name__, "restart_in": wait},
        exc_info=worth_a_traceback(error),
    )


def cancelled_elsewhere(stopping: bool) -> bool:
    """Whether a ``CancelledError`` caught in a supervised part's task is a failure to
    restart after rather than the end of the part: the service is not ``stopping`` and
    the task itself is not being cancelled (the service's own cancel, at the bound of a
    stop), so it came from something the part awaited (a future a client library
    shared, which someone else cancelled)."""
    task = asyncio.current_task()
    return not stopping and (task is None or not task.cancelling())


def build_source(settings: SourceSettings, router: Router | ShardedRouter, file: str) -> Source:
    """The source ``settings`` names, over ``router``'s database where it needs one
    (a sharded router's first store).

    Raises:
        MissingExtra: the kind's client library is not installed.
        ServiceConfigError: the source refuses its options (named at its table).
    """
    try:
        return _built(settings, router)
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing
    except ValueError as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise ServiceConfigError(file, settings.table, "", message) from None


def _built(settings: SourceSettings, routing: Router | ShardedRouter) -> Source:
    router = _home(routing)
    options = settings.options
    if isinstance(options, InboundTableOptions):
        from statifier.fronts.table_source import TableSource

        return TableSource(
            router.adapter,
            group=options.group,
            partitions=options.partitions,
            owner=options.owner or process_owner(),
            ttl=options.lease_ttl,
            codec=router.storage.codec,
        )
    if isinstance(options, KafkaOptions):
        from statifier.fronts.kafka import KafkaSource, header_scope

        return KafkaSource(
            options.brokers,
            group=options.group,
            topics=list(options.topics),
            source=settings.name,
            scope=settings.scope,
            scope_of=None if options.scope_header is None else header_scope(options.scope_header),
            max_payload=options.max_payload,
            assignment=options.assignment,
            rebalance_timeout=options.rebalance_timeout,
            commit_timeout=options.commit_timeout,
            settings=dict(options.settings),
        )
    if isinstance(options, NatsOptions):
        from statifier.fronts.leases import PartitionLeases
        from statifier.fronts.nats import JetStreamSource

        leases = PartitionLeases(
            router.adapter,
            group=options.group,
            partitions=options.partitions,
            owner=options.owner or process_owner(),
            ttl=options.lease_ttl,
        )
        return JetStreamSource(
            list(options.servers),
            leases,
            stream=options.stream,
            subject_prefix=options.subject_prefix,
            scope=settings.scope or "",
            source=settings.name,
            ack_wait=options.ack_wait,
            max_payload=options.max_payload,
            pull_batch=options.pull_batch,
            buffer=options.buffer,
            pull_wait=options.pull_wait,
            ack_timeout=options.ack_timeout,
            connect_options=dict(options.connect),
        )
    raise ServiceConfigError("", settings.table, "kind", f"no source of kind {settings.kind!r}")


class _Watched:
    """A source that remembers whether it has started, and asks the source what keeps
    it from reading (for ``/readyz``)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.started = False

    @property
    def name(self) -> str:
        return self.source.name

    def trouble(self) -> str | None:
        source = self.source
        return source.trouble() if isinstance(source, Troubled) else None

    async def start(self, rebalance: Rebalance) -> None:
        await self.source.start(rebalance)
        self.started = True

    async def fetch(self, max_messages: int, wait: float) -> Sequence[Message]:
        return await self.source.fetch(max_messages, wait)

    async def commit(self, positions: Mapping[str, int]) -> None:
        await self.source.commit(positions)

    async def close(self) -> None:
        self.started = False
        await self.source.close()


class SupervisedConsumer:
    """One configured source's consumer, started again (with a new source) after a
    backoff (:class:`Restarts`) whenever it fails.

    Args:
        settings: the source's settings.
        router: the router its events are routed through.
        file: the configuration file, for errors.
    """

    def __init__(self, settings: SourceSettings, router: Router | ShardedRouter, file: str) -> None:
        self.settings = settings
        self.router = router
        self.file = file
        self.name = f"source {settings.name}"
        self._stopping = asyncio.Event()
        self._current: StreamConsumer | None = None
        self._watched: _Watched | None = None
        self._failure: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._first: StreamConsumer | None = None
        self._repeats = Repeats()

    def consumer(self) -> StreamConsumer:
        """A new consumer over a new source (what each start runs).

        Raises:
            MissingExtra, ServiceConfigError: see :func:`build_source`.
        """
        from statifier.fronts.consumer import DeadLetterAfter, Retry, StreamConsumer
        from statifier.fronts.dead_letters import TableDeadLetters

        chosen = self.settings.consumer
        watched = _Watched(build_source(self.settings, self.router, self.file))
        self._watched = watched
        failure = (
            Retry()
            if chosen.dead_letter_after is None
            else DeadLetterAfter(
                chosen.dead_letter_after,
                TableDeadLetters(_home(self.router).adapter, _home(self.router).storage.codec),
            )
        )
        return StreamConsumer(
            self.router,
            watched,
            lanes=chosen.lanes,
            batch_size=chosen.batch_size,
            max_in_flight=chosen.max_in_flight,
            failure=failure,
            commit_interval=chosen.commit_interval,
            stall_after=chosen.stall_after,
        )

    def prepare(self) -> None:
        """Build the first consumer, so that a source the configuration cannot build is
        refused before anything runs.

        Raises:
            MissingExtra, ServiceConfigError: see :func:`build_source`.
        """
        self._first = self.consumer()

    def start(self) -> None:
        """Run the consumer (the prepared one first) in a task of its own until
        :meth:`stop`."""
        self._task = asyncio.create_task(self._run(), name=self.name)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running the consumer, once started."""
        return self._task

    def trouble(self) -> str | None:
        """``None`` once the source has started and while it reads, else why not: not
        running, restarting after a failure (its class), not started yet, what the
        source says keeps it from reading (see :class:`Troubled`), or that no event
        was done for a while though events wait
        (:meth:`~statifier.fronts.consumer.StreamConsumer.trouble`)."""
        if self._task is None or self._task.done():
            return "not running"
        if self._failure is not None:
            return f"restarting after {self._failure}"
        if self._watched is None or not self._watched.started:
            return "not started yet"
        if (why := self._watched.trouble()) is not None:
            return why
        return None if self._current is None else self._current.trouble()

    async def stop(self, drain_timeout: float) -> None:
        """Stop fetching, let in-flight deliveries finish (at most ``drain_timeout``
        seconds), commit and close; returns when the consumer's task has ended."""
        self._stopping.set()
        if self._current is not None:
            await self._current.stop(drain_timeout=max(drain_timeout, 0.0))
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        restarts = Restarts()
        while not self._stopping.is_set():
            began = time.monotonic()
            try:
                self._current, self._first = self._first or self.consumer(), None
                await self._current.run()
                if self._stopping.is_set():
                    return
                raise RuntimeError("the consumer stopped on its own")
            except (MissingExtra, ServiceConfigError):
                raise  # nothing a restart changes
            except asyncio.CancelledError as cancelled:
                if not cancelled_elsewhere(self._stopping.is_set()):
                    raise
                self._failure = type(cancelled).__name__
                wait = restarts.after(ran=time.monotonic() - began)
                log_failure(self._repeats, self.name, cancelled, wait)
            except Exception as error:  # noqa: BLE001 - a consumer outlives its failures
                self._failure = type(error).__name__
                wait = restarts.after(ran=time.monotonic() - began)
                log_failure(self._repeats, self.name, error, wait)
            finally:
                self._current = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
            self._failure = None


def _home(router: Router | ShardedRouter) -> Router:
    """The router of the database a source's own tables and dead letters are in: a
    sharded router's first store."""
    return router.routers[0] if isinstance(router, ShardedRouter) else router
