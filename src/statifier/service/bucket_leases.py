"""Bucket leases: the services on one store share its workers by ranges of buckets.

Without leases, each service runs the timer, flow, outbox and reaper workers over its
store's whole range of buckets, and the services' claims skip the rows another holds
(``FOR UPDATE SKIP LOCKED``): correct, but every process scans every bucket. With
``[bucket_leases] enabled = true`` the store's range is cut into ``slices`` even
slices, leased through the store's ``partition_leases`` table as the inbound table's
partitions are (:class:`statifier.fronts.leases.PartitionLeases`, group
:func:`group_of` the slice count: :data:`GROUP` ``/16``): each live service holds its
fair share, and runs one set of workers per run of adjacent slices it holds. A service
that joins takes slices as the others give up their surplus; one that stops gives its
slices up at once; one that dies leaves its slices to the others once their ttl ran
out.

A slice given up (a surplus, or lost) stops its range's workers at the end of their
pass, in the background: the claims go on renewing the slices kept meanwhile, however
long that pass runs. A surplus slice stays held (each claim renews it) until every
range of this service covering it has stopped, and is released only then, so two
services never run one slice's workers at once; within this service, the range it
keeps may start while the wider range it replaces ends its pass (its buckets read
twice for that pass: safe, as below).

Services cut in different counts lease different groups: each serves the whole range
among those of its own count, so their slices overlap (safe, see below) rather than
leave buckets to nobody, and a claim that finds another count's group alive says so
in a warning (once per interval).

A claim waits at most a third of the ttl for the group's lock (another service's
claim holds it: a stuck transaction), then fails; and readiness turns red once the
last claim that succeeded is older than the ttl, whatever holds the claims up.

The leases divide the work; they do not guard it. A service that lost a slice (its
claims failed for longer than the ttl) fires its timers until its next claim tells
it so, and a timer, an outbox row or a held group is still claimed one holder at a
time, so nothing fires twice; a slice nobody holds waits, and readiness says so.

>>> group_of(16)
'statifier.buckets/16'
>>> slices_of((0, 1024), 4)
((0, 256), (256, 512), (512, 768), (768, 1024))
>>> ranges_of(["0256-0512", "0000-0256", "0768-1024"])
((0, 512), (768, 1024))
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

from statifier.fronts.leases import Clock, PartitionLeases
from statifier.persistence.sql import SqlAdapter
from statifier.repeats import Repeats

__all__ = [
    "GROUP",
    "LeasedWorkers",
    "Worker",
    "group_of",
    "ranges_of",
    "slice_name",
    "slices_of",
]

_log = logging.getLogger(__name__)

GROUP = "statifier.buckets"
"""The family of the bucket slices' lease groups, in each store's ``partition_leases``
(:func:`group_of`); the group itself of the versions before the count was in its name."""

_TOLD: Final = 300
"""Characters at most of an error's message in a failed claim's line."""
_URL: Final = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
_PASSWORD: Final = re.compile(r"(password\s*=\s*)\S+", re.IGNORECASE)

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


def group_of(slices: int) -> str:
    """The lease group of a range cut into ``slices`` slices: the services of one count
    share one group, and those of another count lease another (their slices' names
    differ, and as members of one group they would halve each other's shares over
    names the other does not lease)."""
    return f"{GROUP}/{slices}"


def slice_name(piece: Range) -> str:
    """A slice's name in the leases table: its bounds, four digits each, so names
    sort as the slices do."""
    return f"{piece[0]:04d}-{piece[1]:04d}"


def _shown(pieces: Collection[Range]) -> str:
    """Ranges as the logs name them: ``0-512, 768-1024``, or ``none``."""
    return ", ".join(f"{start}-{end}" for start, end in sorted(pieces)) or "none"


@dataclass(frozen=True, slots=True)
class _Stopping:
    """A range whose workers were told to stop and may still be in their pass.

    Attributes:
        piece: the range.
        ended: done once every worker of the range returned.
        since: when (by the leases' clock) they were told to stop.
    """

    piece: Range
    ended: asyncio.Task[None]
    since: datetime

    def covers(self, piece: Range) -> bool:
        """Whether this range, still stopping, shares a bucket with ``piece``."""
        return not self.ended.done() and self.piece[0] < piece[1] and piece[0] < self.piece[1]


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
            it usefully); the services of one count share a lease group
            (:func:`group_of`).
        ttl: seconds a claim holds the slices; claims come every third of it, and
            each waits at most a third of it for the group's lock.
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
        self.group = group_of(len(names))
        self.leases = PartitionLeases(
            adapter,
            group=self.group,
            partitions=names,
            owner=owner,
            ttl=ttl,
            clock=clock,
            wait=ttl / 3,
        )
        self.task: asyncio.Task[None] | None = None
        self.running: dict[Range, tuple[asyncio.Event, Sequence[Worker]]] = {}
        """The ranges whose workers run, each with the event that stops them."""
        self.stopping: list[_Stopping] = []
        """The ranges given up whose workers may still be in their pass."""
        self._stopped = asyncio.Event()
        """Set when a range's workers all returned: the next claim comes at once, to
        release the surplus they held."""
        self._failure: str | None = None
        self._renewed: datetime | None = None
        """When (by the leases' clock) the last claim succeeded, or the part started."""
        self._waiting: tuple[str, ...] = ()
        self._repeats = Repeats()

    def start(self) -> None:
        """Run the leases and the workers in a task of their own (:attr:`task`)."""
        self._renewed = self.leases.clock()
        self.task = asyncio.create_task(self._run(), name=self.name)

    def trouble(self) -> str | None:
        """``None`` while work flows, else why it may not: not running, no claim
        succeeded for longer than the ttl (one hangs, or they fail), the last claim
        failed, a range given up whose workers are still in their pass a ttl after
        their stop (its slices wait for them), a worker's trouble (named with its
        range), or no slice held while slices wait for a service (free, or their
        holder missed a renewal)."""
        if self.task is None or self.task.done():
            return "not running"
        now = self.leases.clock()
        if self._renewed is not None:
            age = (now - self._renewed).total_seconds()
            if age > self.ttl:
                cause = "a claim hangs" if self._failure is None else self._failure
                return f"leases not renewed for {age:.1f} s: {cause}"
        if self._failure is not None:
            return f"leases not renewed: {self._failure}"
        for stopping in self.stopping:
            # Past a ttl, the slices wait for this pass longer than they would for a
            # service that died.
            age = (now - stopping.since).total_seconds()
            if not stopping.ended.done() and age > self.ttl:
                start, end = stopping.piece
                return f"giving up buckets {start}-{end}: a pass still runs after {age:.1f} s"
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
                self._stopped.clear()
                await self._claim()
                await self._pause()
        finally:
            # Every range's workers ended before the leave frees their slices.
            self._give_up(list(self.running))
            await asyncio.gather(*(s.ended for s in self.stopping), return_exceptions=True)
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

    async def _pause(self) -> None:
        """Wait a third of the ttl for the next claim; less once the service stops, or
        once a range given up stopped (its surplus is then released at once, not a
        third of the ttl later)."""
        waits = [asyncio.ensure_future(event.wait()) for event in (self.stop, self._stopped)]
        try:
            await asyncio.wait(waits, timeout=self.ttl / 3, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _claim(self) -> None:
        """One claim: the workers of the slices held (its surplus aside) run; those of
        the others are told to stop, without waiting for their pass (the claims renew
        the slices kept meanwhile); and the surplus is released once no range of this
        service that covers it is still in its pass."""
        try:
            change = await self.leases.claim()
        except Exception as error:  # noqa: BLE001 - the leases held run on; next claim
            self._failed(error, "claim")
            return
        self._failure = None
        self._renewed = self.leases.clock()
        self._waiting = change.waiting
        self.stopping = [s for s in self.stopping if not s.ended.done()]
        wanted = set(ranges_of(set(change.held) - set(change.surplus)))
        before = set(self.running)
        self._give_up([piece for piece in self.running if piece not in wanted])
        for piece in sorted(wanted - before):
            stop = asyncio.Event()
            workers = self.build(piece, stop)
            for worker in workers:
                worker.start()
            self.running[piece] = (stop, workers)
        self._say(wanted, before, change.lost)
        done = [name for name in change.surplus if not self._still_covered(name)]
        if done:
            try:
                await self.leases.release(done)
            except Exception as error:  # noqa: BLE001 - the next claim says surplus again
                self._failed(error, "release")
        await self._kin()

    def _say(self, wanted: set[Range], before: set[Range], lost: Collection[str]) -> None:
        """Log the ranges run once they change: at WARNING when slices were lost
        (another service took them once this one's leases ran out: its claims failed
        or hung for longer than the ttl, and it ran their workers meanwhile)."""
        if lost:
            _log.warning(
                "%s: buckets %s; lost buckets %s to another service: no claim of this "
                "one succeeded for longer than the ttl (%g s)",
                self.name,
                _shown(wanted),
                _shown(ranges_of(lost)),
                self.ttl,
            )
        elif wanted != before:
            _log.info("%s: buckets %s", self.name, _shown(wanted))

    def _give_up(self, pieces: Sequence[Range]) -> None:
        """Tell the workers of ``pieces`` to stop, and watch in the background
        (:attr:`stopping`) for them to end their pass: nothing here waits for it."""
        for piece in pieces:
            stop, workers = self.running.pop(piece)
            stop.set()
            tasks = [worker.task for worker in workers if worker.task is not None]
            start, end = piece
            ended = asyncio.create_task(
                self._ended(tasks), name=f"{self.name}: giving up buckets {start}-{end}"
            )
            self.stopping.append(_Stopping(piece, ended, self.leases.clock()))

    async def _ended(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """Wait for ``tasks`` (a range's workers), then wake the claims."""
        await asyncio.gather(*tasks, return_exceptions=True)
        self._stopped.set()

    def _still_covered(self, name: str) -> bool:
        """Whether the slice ``name`` is in a range whose workers may still be in
        their pass: until they ended, it is not released."""
        (piece,) = ranges_of([name])
        return any(stopping.covers(piece) for stopping in self.stopping)

    async def _kin(self) -> None:
        """Warn (once per interval) while services that cut the range in another count
        of slices, or of a version that leased one group for every count, are alive on
        the store: their slices overlap this service's."""
        try:
            adapter = self.leases.adapter
            async with adapter.transaction() as tx:
                groups = await self.leases.table.kin(tx.driver, GROUP, self.leases.clock())
        except Exception as error:  # noqa: BLE001 - a hint only; the next claim looks again
            self._repeats.log(
                _log,
                logging.WARNING,
                ("kin", type(error).__name__),
                "%s: could not read the other lease groups (%s: %s); looked for again at "
                "the next claim",
                self.name,
                type(error).__name__,
                self._told(error),
            )
            return
        others = sorted(set(groups) - {self.group})
        if others:
            self._repeats.log(
                _log,
                logging.WARNING,
                ("slices", tuple(others)),
                "%s: services of other [bucket_leases] slices or versions run beside "
                "this one on the store (lease groups %s; this one's %s): each group's "
                "services serve every bucket among themselves, so their workers read "
                "the same buckets (safe: a timer or an outbox row is claimed by one "
                "holder at a time); give every service the same slices and version",
                self.name,
                ", ".join(f"{g} (an older version)" if g == GROUP else g for g in others),
                self.group,
            )

    def _failed(self, error: Exception, what: str) -> None:
        """Say that a claim or a release failed, with the error's message (logged once
        per kind and interval); readiness says so until a claim succeeds."""
        self._failure = type(error).__name__
        self._repeats.log(
            _log,
            logging.ERROR,
            (what, self._failure),
            "%s: a bucket lease %s failed (%s: %s); the next claim in %g s",
            self.name,
            what,
            self._failure,
            self._told(error),
            self.ttl / 3,
        )

    def _told(self, error: Exception) -> str:
        """What ``error`` says, on one line and at most :data:`_TOLD` characters: the
        driver's message (SQLAlchemy's wrapper's ``orig``, without the statement and
        its parameters), URLs and passwords left out; a wait for the group's lock cut
        short says so."""
        if self.leases.adapter.dialect.lock_not_granted(error):
            return (
                f"no lock on the lease group within {self.ttl / 3:g} s: another "
                "service's claim holds it"
            )
        cause = getattr(error, "orig", None)
        told = " ".join(str(cause if isinstance(cause, BaseException) else error).split())
        told = _PASSWORD.sub(r"\1***", _URL.sub("<url>", told)) or "no message"
        return told if len(told) <= _TOLD else f"{told[: _TOLD - 3]}..."
