"""The stream consumers a configuration names: one
:class:`~statifier.fronts.consumer.StreamConsumer` per ``[sources.NAME]``, over the
source its ``kind`` builds, kept running by the service.

A source's module is imported only when a source of its kind is configured, so a
service without one needs no broker client; a missing client library is a
:class:`~statifier.extras.MissingExtra` naming the extra to install.

Members of one consumer group share the partitions (NATS: by the lease tables of the
service's own database; each member's ``owner`` is the host name and process id
unless the file names one), so several services on one database share a source and
take over the partitions of one that dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from statifier.extras import MissingExtra
from statifier.fronts.source import Message, Rebalance, Source
from statifier.router import RouterConfig
from statifier.service.config import (
    InboundTableOptions,
    KafkaOptions,
    NatsOptions,
    ServiceConfigError,
    SourceSettings,
)

if TYPE_CHECKING:
    from statifier.fronts.consumer import StreamConsumer

__all__ = ["FIRST_RESTART", "LAST_RESTART", "SupervisedConsumer", "build_source"]

_log = logging.getLogger("statifier.service")

FIRST_RESTART: Final = 1.0
"""Seconds before a failed part (a consumer, a worker) is started again the first
time; the wait doubles after each further failure, to at most ``LAST_RESTART``."""
LAST_RESTART: Final = 30.0


def _owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def build_source(settings: SourceSettings, config: RouterConfig, file: str) -> Source:
    """The source ``settings`` names, over ``config``'s database where it needs one.

    Raises:
        MissingExtra: the kind's client library is not installed.
        ServiceConfigError: the source refuses its options (named at its table).
    """
    try:
        return _built(settings, config)
    except ModuleNotFoundError as missing:
        raise MissingExtra.of(missing) from missing
    except ValueError as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise ServiceConfigError(file, settings.table, "", message) from None


def _built(settings: SourceSettings, config: RouterConfig) -> Source:
    options = settings.options
    if isinstance(options, InboundTableOptions):
        from statifier.fronts.table_source import TableSource

        return TableSource(
            config.adapter,
            group=options.group,
            partitions=options.partitions,
            owner=options.owner,
            ttl=options.lease_ttl,
            codec=config.storage.codec,
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
            settings=dict(options.settings),
        )
    if isinstance(options, NatsOptions):
        from statifier.fronts.leases import PartitionLeases
        from statifier.fronts.nats import JetStreamSource

        leases = PartitionLeases(
            config.adapter,
            group=options.group,
            partitions=options.partitions,
            owner=options.owner or _owner(),
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
    """A source that remembers whether it has started (for ``/readyz``)."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.started = False

    @property
    def name(self) -> str:
        return self.source.name

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
    backoff of 1 s, doubling to 30 s, whenever it fails.

    Args:
        settings: the source's settings.
        config: the router configuration its events are routed through.
        file: the configuration file, for errors.
    """

    def __init__(self, settings: SourceSettings, config: RouterConfig, file: str) -> None:
        self.settings = settings
        self.config = config
        self.file = file
        self.name = f"source {settings.name}"
        self._stopping = asyncio.Event()
        self._current: StreamConsumer | None = None
        self._watched: _Watched | None = None
        self._failure: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._first: StreamConsumer | None = None

    def consumer(self) -> StreamConsumer:
        """A new consumer over a new source (what each start runs).

        Raises:
            MissingExtra, ServiceConfigError: see :func:`build_source`.
        """
        from statifier.fronts.consumer import DeadLetterAfter, Retry, StreamConsumer
        from statifier.fronts.dead_letters import TableDeadLetters

        chosen = self.settings.consumer
        watched = _Watched(build_source(self.settings, self.config, self.file))
        self._watched = watched
        failure = (
            Retry()
            if chosen.dead_letter_after is None
            else DeadLetterAfter(
                chosen.dead_letter_after,
                TableDeadLetters(self.config.adapter, self.config.storage.codec),
            )
        )
        return StreamConsumer(
            self.config,
            watched,
            lanes=chosen.lanes,
            batch_size=chosen.batch_size,
            max_in_flight=chosen.max_in_flight,
            failure=failure,
            commit_interval=chosen.commit_interval,
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
        """``None`` once the source has started and while it runs, else why not."""
        if self._task is None or self._task.done():
            return "not running"
        if self._failure is not None:
            return f"restarting after {self._failure}"
        if self._watched is None or not self._watched.started:
            return "not started yet"
        return None

    async def stop(self, drain_timeout: float) -> None:
        """Stop fetching, let in-flight deliveries finish (at most ``drain_timeout``
        seconds), commit and close; returns when the consumer's task has ended."""
        self._stopping.set()
        if self._current is not None:
            await self._current.stop(drain_timeout=max(drain_timeout, 0.0))
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        delay = FIRST_RESTART
        while not self._stopping.is_set():
            try:
                self._current, self._first = self._first or self.consumer(), None
                await self._current.run()
                if self._stopping.is_set():
                    return
                raise RuntimeError("the consumer stopped on its own")
            except (MissingExtra, ServiceConfigError):
                raise  # nothing a restart changes
            except Exception as error:  # noqa: BLE001 - a consumer outlives its failures
                self._failure = type(error).__name__
                _log.exception("%s failed; starting it again in %.0f s", self.name, delay)
            finally:
                self._current = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, LAST_RESTART)
            self._failure = None
