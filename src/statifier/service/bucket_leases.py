"""Bucket leases: the services on one store share its workers by ranges of buckets.

Without leases, each service runs the timer, flow, outbox and reaper workers over its
store's whole range of buckets, and the services' claims skip the rows another holds
(``FOR UPDATE SKIP LOCKED``): correct, but every process scans every bucket. With
``[bucket_leases] enabled = true`` the store's range is cut into ``slices`` even
slices, leased through the store's ``partition_leases`` table as the inbound table's
partitions are (:class:`statifier.fronts.leases.PartitionLeases`, group
:data:`GROUP`): each live service holds its fair share, and runs one set of workers
per run of adjacent slices it holds. A service that joins takes slices as the others
give up their surplus; one that stops gives its slices up at once; one that dies
leaves its slices to the others once their ttl ran out.

The leases divide the work; they do not guard it. A service that lost a slice (its
claims failed for longer than the ttl) fires its timers until its next claim tells
it so, and a timer, an outbox row or a held group is still claimed one holder at a
time, so nothing fires twice; a slice nobody holds waits, and readiness says so.

>>> slices_of((0, 1024), 4)
((0, 256), (256, 512), (512, 768), (768, 1024))
>>> ranges_of(["0256-0512", "0000-0256", "0768-1024"])
((0, 512), (768, 1024))
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from statifier.fronts.leases import Clock, PartitionLeases
from statifier.persistence.sql import SqlAdapter
from statifier.repeats import Repeats

__all__ = ["GROUP", "LeasedWorkers", "Worker", "ranges_of", "slice_name", "slices_of"]

_log = logging.getLogger(__name__)

GROUP = "statifier.buckets"
"""The lease group of the bucket slices, in each store's ``partition_leases``."""

Range = tuple[int, int]


class Worker(Protocol):
    """What :class:`LeasedWorkers` runs for a range: a supervised part
    (:class:`statifier.service.service.Supervised`)."""

    name: str
    task: asyncio.Task[None] | None

    def start(self) -> None: ...

    def trouble(self) -> str | None: ...


def slices_of(buckets: Range, count: int) -> tuple[Range, ...]:
    """``buckets`` (``(start, end)``, ``end`` excluded) cut into ``count`` even
    slices, in order; fewer when the range holds fewer buckets than ``count``."""
    start, end = buckets
    count = max(1, min(count, end - start))
    width = end - start
    edges = [start + width * n // count for n in range(count + 1)]
    return tuple(itertools.pairwise(edges))


def slice_name(piece: Range) -> str:
    """A slice's name in the leases table: its bounds, four digits each, so names
    sort as the slices do."""
    return f"{piece[0]:04d}-{piece[1]:04d}"


def ranges_of(names: Collection[str]) -> tuple[Range, ...]:
    """The slices named (see :func:`slice_name`), adjacent ones joined, in order."""
    pieces = sorted(tuple(int(edge) for edge in name.split("-")) for name in names)
    joined: list[Range] = []
    for start, end in pieces:
        if joined and joined[-1][1] == start:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return tuple(joined)


class LeasedWorkers:
    """One store's workers over the bucket slices this service leases (see the module
    docstring): a part of the service, with a task, a name and a readiness reason.

    Args:
        name: the part's name in logs and readiness (``workers``, or ``workers
            (store N)``).
        adapter: the store's adapter (its ``partition_leases`` table).
        buckets: the store's range of buckets.
        build: the workers of one range, each to stop once the event given is set;
            built, not started.
        stop: set when the service stops: the workers stop, and the slices are given
            up for the other services to take at once.
        owner: this service's name among the store's services.
        slices: how many slices the range is cut into (the most services that share
            it usefully).
        ttl: seconds a claim holds the slices; claims come every third of it.
        clock: the time leases are measured by (the wall clock by default).
    """

    def __init__(
        self,
        name: str,
        adapter: SqlAdapter,
        buckets: Range,
        build: Callable[[Range, asyncio.Event], Sequence[Worker]],
        stop: asyncio.Event,
        *,
        owner: str,
        slices: int = 16,
        ttl: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.build = build
        self.stop = stop
        self.ttl = ttl
        names = [slice_name(piece) for piece in slices_of(buckets, slices)]
        self.leases = PartitionLeases(
            adapter, group=GROUP, partitions=names, owner=owner, ttl=ttl, clock=clock
        )
        self.task: asyncio.Task[None] | None = None
        self.running: dict[Range, tuple[asyncio.Event, Sequence[Worker]]] = {}
        """The ranges whose workers run, each with the event that stops them."""
        self._failure: str | None = None
        self._waiting: tuple[str, ...] = ()
        self._repeats = Repeats()

    def start(self) -> None:
        """Run the leases and the workers in a task of their own (:attr:`task`)."""
        self.task = asyncio.create_task(self._run(), name=self.name)

    def trouble(self) -> str | None:
        """``None`` while work flows, else why it may not: not running, the last claim
        failed, a worker's trouble (named with its range), or no slice held while
        slices wait for a service (free, or their holder missed a renewal)."""
        if self.task is None or self.task.done():
            return "not running"
        if self._failure is not None:
            return f"leases not renewed: {self._failure}"
        for _, workers in self.running.values():
            for worker in workers:
                if (why := worker.trouble()) is not None:
                    return f"{worker.name}: {why}"
        if not self.running and self._waiting:
            return f"no buckets while {len(self._waiting)} slices wait"
        return None

    async def _run(self) -> None:
        try:
            while not self.stop.is_set():
                await self._claim()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.ttl / 3)
        finally:
            await self._stop(list(self.running))
            try:
                await self.leases.leave()
            except Exception as error:  # noqa: BLE001 - the leases run out on their own
                _log.warning(
                    "%s: could not give up its bucket slices (%s: %s); the other "
                    "services take them once their leases run out",
                    self.name,
                    type(error).__name__,
                    error,
                )

    async def _claim(self) -> None:
        """One claim: the workers of the slices held (its surplus aside) run, the
        others stop, and the surplus is given up once its workers stopped."""
        try:
            change = await self.leases.claim()
        except Exception as error:  # noqa: BLE001 - the leases held run on; next claim
            self._failed(error, "claim")
            return
        self._failure = None
        self._waiting = change.waiting
        wanted = set(ranges_of(set(change.held) - set(change.surplus)))
        await self._stop([piece for piece in self.running if piece not in wanted])
        for piece in sorted(wanted - set(self.running)):
            stop = asyncio.Event()
            workers = self.build(piece, stop)
            for worker in workers:
                worker.start()
            self.running[piece] = (stop, workers)
        if change.gained or change.lost or change.surplus:
            ranges = ", ".join(f"{a}-{b}" for a, b in sorted(wanted)) or "none"
            _log.info("%s: buckets %s", self.name, ranges)
        if change.surplus:
            try:
                await self.leases.release(change.surplus)
            except Exception as error:  # noqa: BLE001 - the next claim says surplus again
                self._failed(error, "release")

    def _failed(self, error: Exception, what: str) -> None:
        """Say that a claim or a release failed (logged once per kind and interval);
        readiness says so until a claim succeeds."""
        self._failure = type(error).__name__
        self._repeats.log(
            _log,
            logging.ERROR,
            (what, self._failure),
            "%s: a bucket lease %s failed (%s); the next claim in %g s",
            self.name,
            what,
            self._failure,
            self.ttl / 3,
        )

    async def _stop(self, pieces: Sequence[Range]) -> None:
        """Stop the workers of ``pieces`` and wait until they finished their pass."""
        tasks: list[asyncio.Task[None]] = []
        for piece in pieces:
            stop, workers = self.running.pop(piece)
            stop.set()
            tasks.extend(worker.task for worker in workers if worker.task is not None)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
