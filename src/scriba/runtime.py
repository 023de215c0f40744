"""The runtime: start projections, steer them, ask how they are doing.

A :class:`Scriba` holds the projections started through it; there is no global
registry. Every call that names a projection takes the class, a name (version 1), a
``(name, version)`` pair, a name and a ``version``, or a :class:`ProjectionKey`. Used as
an async context manager it stops everything it started on the way out.

>>> import asyncio
>>> import sqlalchemy as sa
>>> from scriba import Insert, MemorySource, MemoryTarget, Projection
>>> orders = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
>>> class Orders(Projection):
...     name = "orders"
...     def handle(self, event, meta):
...         return Insert(orders, {"id": event.stream_id})
>>> async def main():
...     source, target = MemorySource(), MemoryTarget()
...     source.record("order-1", "OrderPlaced")
...     async with Scriba() as scriba:
...         await scriba.start(Orders, source=source, target=target, batch_timeout=0.01)
...         await scriba.wait_until_caught_up(Orders)
...         info = await scriba.info("orders")
...     return target.rows(orders), info.status, info.watermark
>>> asyncio.run(main())
([{'id': 'order-1'}], <Status.RUNNING: 'running'>, 1)
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeAlias, cast

from scriba.coordinator import Coordinator, Status
from scriba.errors import InvalidState, ProjectionBusy, UnknownProjection
from scriba.event import ProjectionKey
from scriba.projection import (
    Projection,
    Settings,
    is_factory,
    made_source,
    made_target,
    settings_of,
)
from scriba.source import ProjectionLock, Source
from scriba.target import DeadLetterStats, ResetCounts, StoredDeadLetter, Target

__all__ = ["STREAM_POSITIONS_LIMIT", "Info", "Listing", "ProjectionRef", "Scriba"]

STREAM_POSITIONS_LIMIT = 1_000
"""Above this many streams, ``Info.stream_positions`` is ``"truncated"``."""

ProjectionRef: TypeAlias = type[Projection] | str | tuple[str, int] | ProjectionKey
"""How a call names a projection: its class, its name (version 1), or name and version."""


@dataclass(frozen=True, slots=True)
class Info:
    """How a projection is doing.

    Attributes:
        name, version: its identity.
        status: its lifecycle state.
        source, target: what it reads from and writes to (their class names).
        safe_position: every event at or below it is accounted for in the running
            pipeline (acknowledged to the source); ``None`` when no pipeline has run.
        stream_positions: the committed cursor of each stream (by stream id), or ``"truncated"``
            when there are more than 1,000 streams.
        halt_reason: why it halted, when ``status`` is halted.
        watermark: the stored watermark position (``None`` before the first).
        lag: seconds behind (0 while caught up), ``None`` until known and while
            standing by.
        lag_events: positions the source holds beyond ``safe_position`` (0 while caught
            up), ``None`` unless running or paused, while standing by, or when the source
            cannot read its head (the SQL table source asks its table, on a connection
            of its own, at each call).
        standby: the source waits for another process to release the projection; the
            status is then still ``running`` (its pipeline is healthy; it reads nothing).
        tasks: the names of its asyncio tasks running now.
        restarts: pipelines started again after a crash.
    """

    name: str
    version: int
    status: Status
    source: str
    target: str
    safe_position: int | None
    stream_positions: Mapping[str, int] | Literal["truncated"]
    halt_reason: str | None
    watermark: int | None
    lag: float | None
    lag_events: int | None
    standby: bool
    tasks: tuple[str, ...]
    restarts: int


@dataclass(frozen=True, slots=True)
class Listing:
    """One projection of :meth:`Scriba.list`."""

    name: str
    version: int
    status: Status


class Scriba:
    """Projections started in this process, and the calls that steer them.

    Targets given as factories are made once per runtime and closed by :meth:`close`;
    targets given as objects belong to the caller. Sources given as factories are made
    for every pipeline run and closed when it ends.
    """

    def __init__(self) -> None:
        self._coordinators: dict[ProjectionKey, Coordinator] = {}
        self._made_targets: dict[int, tuple[object, Target]] = {}

    async def __aenter__(self) -> Scriba:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every projection still going and close the targets this runtime made."""
        for coordinator in list(self._coordinators.values()):
            if coordinator.status not in (Status.STOPPED, Status.DRAINING):
                await coordinator.stop()
        for _, target in self._made_targets.values():
            await target.close()
        self._made_targets.clear()

    async def start(self, projection: type[Projection], **overrides: Any) -> ProjectionKey:
        """Start ``projection``, with options overridden for this run; returns its key.

        Returns once its pipeline is subscribed, with the projection running.

        Raises:
            IdentityOverride: ``overrides`` names ``name`` or ``version``.
            ConfigError: a missing or invalid option.
            InvalidState: a projection of that name and version is not stopped.
            StartFailed: the target did not open or the source did not subscribe.
        """
        settings = settings_of(projection, overrides)
        current = self._coordinators.get(settings.key)
        if current is not None and current.status is not Status.STOPPED:
            raise InvalidState(
                current.status,
                f"projection {settings.key.name!r} v{settings.key.version} is "
                f"{current.status.value}; stop it before starting it again",
            )
        coordinator = Coordinator(projection, settings, self._target_of(settings))
        self._coordinators[settings.key] = coordinator
        await coordinator.start()
        return settings.key

    def pause(self, projection: ProjectionRef, version: int | None = None) -> None:
        """Stop reading; in-flight batches still commit.

        Raises:
            UnknownProjection: not started in this runtime.
            InvalidState: not running (pausing a paused projection is an error).
        """
        self._coordinator(projection, version).pause()

    def resume(self, projection: ProjectionRef, version: int | None = None) -> None:
        """Read again after a pause.

        Raises:
            UnknownProjection: not started in this runtime.
            InvalidState: not paused.
        """
        self._coordinator(projection, version).resume()

    async def stop(self, projection: ProjectionRef, version: int | None = None) -> None:
        """Stop reading, commit what was handled, end every task of the projection.

        Raises:
            UnknownProjection: not started in this runtime.
            InvalidState: already stopped, or stopping.
        """
        await self._coordinator(projection, version).stop()

    async def info(self, projection: ProjectionRef, version: int | None = None) -> Info:
        """How the projection is doing (reads its cursors and watermark from the target).

        Raises:
            UnknownProjection: not started in this runtime.
        """
        coordinator = self._coordinator(projection, version)
        key, target = coordinator.settings.key, coordinator.target
        positions = await target.load_positions(key, STREAM_POSITIONS_LIMIT + 1)
        watermark = await target.watermark(key)
        prefix, _, _ = coordinator.progress()
        return Info(
            name=key.name,
            version=key.version,
            status=coordinator.status,
            source=_describe(coordinator.settings.source),
            target=type(target).__name__,
            safe_position=prefix,
            stream_positions=(
                "truncated"
                if len(positions) > STREAM_POSITIONS_LIMIT
                else dict(sorted(positions.items()))
            ),
            halt_reason=coordinator.halt_reason,
            watermark=watermark.position if watermark is not None else None,
            lag=coordinator.lag_seconds(),
            lag_events=await coordinator.lag_events(),
            standby=coordinator.standing_by,
            tasks=coordinator.task_names(),
            restarts=coordinator.restarts,
        )

    def list(self) -> list[Listing]:
        """Every projection started in this runtime, stopped ones included."""
        return [
            Listing(key.name, key.version, coordinator.status)
            for key, coordinator in sorted(self._coordinators.items())
        ]

    async def dead_letters(
        self, projection: ProjectionRef, version: int | None = None, *, limit: int = 10
    ) -> builtins.list[StoredDeadLetter]:
        """The newest ``limit`` dead letters of the projection, newest first.

        A class not started in this runtime is handled through its own target.
        """
        key, target, made = self._target_for(projection, version)
        try:
            return await target.dead_letters(key, limit)
        finally:
            if made:
                await target.close()

    async def dead_letter_stats(
        self, projection: ProjectionRef, version: int | None = None
    ) -> DeadLetterStats:
        """How many dead letters the projection has, in all and by kind."""
        key, target, made = self._target_for(projection, version)
        try:
            return await target.dead_letter_stats(key)
        finally:
            if made:
                await target.close()

    async def reset(
        self,
        projection: ProjectionRef,
        version: int | None = None,
        *,
        dead_letters: bool = False,
    ) -> ResetCounts:
        """Clear the projection's cursors and watermark (and dead letters if asked), so
        its next start begins from the first event. The read model is left alone:
        scriba does not know which tables a handler writes.

        The projection's lock (the one its source takes) is held while clearing, so no
        process reads the projection meanwhile, and the target raises the fencing
        generation, so a reader that lost its lock without noticing commits nothing
        more. A source without a lock (the memory one) has only the state check.

        Raises:
            InvalidState: the projection is not stopped in this runtime (clearing cursors
                under a live pipeline would let it commit against a cache that no
                longer matches).
            ProjectionBusy: some process (or another runtime) holds the projection's
                lock; nothing was cleared.
        """
        key = _key_of(projection, version)
        coordinator = self._coordinators.get(key)
        if coordinator is not None and coordinator.status is not Status.STOPPED:
            raise InvalidState(
                coordinator.status,
                f"cannot reset projection {key.name!r} v{key.version} while it is "
                f"{coordinator.status.value}; stop it first",
            )
        key, target, made = self._target_for(projection, version)
        try:
            source, made_here = self._source_for(key, projection)
            try:
                return await _reset_holding(source.projection_lock(key), target, key, dead_letters)
            finally:
                if made_here:
                    await source.close()
        finally:
            if made:
                await target.close()

    async def wait_until_caught_up(
        self, projection: ProjectionRef, version: int | None = None
    ) -> None:
        """Wait until the projection has accounted for everything its source had when
        this was called: two reads in a row (so one begun after the call) found nothing
        new, with nothing in flight. Meant for tests and scripts; a paused projection
        waits for its resume. Bound the wait with ``asyncio.timeout``.

        Raises:
            InvalidState: it halted or stopped while waiting.
        """
        coordinator = self._coordinator(projection, version)
        baseline = coordinator.idle_reads()
        while True:
            if coordinator.status in (Status.HALTED, Status.STOPPED):
                raise InvalidState(coordinator.status, f"projection is {coordinator.status.value}")
            pipeline, idle = coordinator.idle_reads()
            if pipeline is not baseline[0]:
                baseline = (pipeline, 0)
            if idle >= baseline[1] + 2:
                return
            await asyncio.sleep(0.002)

    # -- inside ----------------------------------------------------------------------

    def _coordinator(self, projection: ProjectionRef, version: int | None) -> Coordinator:
        key = _key_of(projection, version)
        coordinator = self._coordinators.get(key)
        if coordinator is None:
            raise UnknownProjection(
                f"no projection {key.name!r} v{key.version} was started in this runtime"
            )
        return coordinator

    def _target_of(self, settings: Settings) -> Target:
        option = settings.target
        if not is_factory(option, "apply_batch"):
            return cast(Target, option)
        made = self._made_targets.get(id(option))
        if made is None:
            made = (option, cast(Callable[[], Target], option)())
            self._made_targets[id(option)] = made
        return made[1]

    def _source_for(self, key: ProjectionKey, projection: ProjectionRef) -> tuple[Source, bool]:
        """The projection's source option as a source, and whether it was made just for
        this call (a factory called: the caller closes it). Only asked for its lock,
        never subscribed.

        Raises:
            UnknownProjection: named without its class and not started here.
        """
        coordinator = self._coordinators.get(key)
        if coordinator is not None:
            option: object = coordinator.settings.source
        elif isinstance(projection, type):
            option = settings_of(projection).source
        else:  # _target_for refused it already
            raise UnknownProjection(f"no projection {key.name!r} v{key.version} is known here")
        return made_source(option), is_factory(option, "read")

    def _target_for(
        self, projection: ProjectionRef, version: int | None
    ) -> tuple[ProjectionKey, Target, bool]:
        """The key and target to query, and whether the target was made just for it."""
        key = _key_of(projection, version)
        coordinator = self._coordinators.get(key)
        if coordinator is not None:
            return key, coordinator.target, False
        if isinstance(projection, type):
            return key, *made_target(settings_of(projection).target)
        raise UnknownProjection(
            f"no projection {key.name!r} v{key.version} was started in this runtime; "
            "pass its class to read its target"
        )


async def _reset_holding(
    lock: ProjectionLock | None, target: Target, key: ProjectionKey, dead_letters: bool
) -> ResetCounts:
    """Reset ``key`` through ``target`` while holding ``lock`` (if any).

    Raises:
        ProjectionBusy: the lock is held elsewhere.
    """
    if lock is None:
        return await target.reset(key, dead_letters=dead_letters)
    try:
        if not await lock.try_acquire():
            raise ProjectionBusy(
                f"cannot reset projection {key.name!r} v{key.version}: another process "
                "holds its lock (stop the projection there first)"
            )
        return await target.reset(key, dead_letters=dead_letters)
    finally:
        await lock.release()


def _key_of(projection: ProjectionRef, version: int | None) -> ProjectionKey:
    candidate: object = projection
    if isinstance(projection, ProjectionKey):
        key = projection
    elif isinstance(candidate, type) and issubclass(candidate, Projection):
        key = candidate.key()
    elif isinstance(projection, str):
        return ProjectionKey(projection, 1 if version is None else version)
    elif isinstance(projection, tuple) and len(projection) == 2:
        key = ProjectionKey(*projection)
    else:
        raise TypeError(
            f"a projection is named by its class, name or (name, version), not {projection!r}"
        )
    if version is not None and version != key.version:
        raise ValueError(f"version {version} given for {key.name!r} v{key.version}")
    return key


def _describe(option: object) -> str:
    if is_factory(option, "read"):
        return str(getattr(option, "__name__", repr(option)))
    return type(option).__name__
