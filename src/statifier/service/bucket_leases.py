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
claim holds it: a stuck transaction; on SQLite, the database's single writer), then
fails; and readiness turns red once the leases of the last claim that succeeded ran
out (a ttl after that claim held the lock), whatever holds the claims up.

A service that stops tells its workers at once, even while a claim is under way, and
leaves the group once they ended, so the others take its slices at their next claim;
if the service's bound cuts the workers' pass short, it still leaves once they ended
(waiting at most a third of the ttl more), or says at WARNING that the slices stay
leased until their ttl. A cancellation of something a claim awaited, which someone
else cancelled, is a failed claim like any other: the next claim comes as usual.

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
from datetime import datetime, timedelta
from typing import Final, Protocol

from statifier.fronts.leases import Clock, PartitionLeases
from statifier.persistence.sql import SqlAdapter
from statifier.repeats import Repeats
from statifier.service.consumers import cancelled_elsewhere

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
        workers: the workers' tasks.
    """

    piece: Range
    ended: asyncio.Task[None]
    since: datetime
    workers: tuple[asyncio.Task[None], ...]

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
        """Why the last claim failed (``None``: it succeeded)."""
        self._release_failure: str | None = None
        """Why the last release of the surplus failed, while a surplus is held."""
        self._until: datetime | None = None
        """When (by the leases' clock) the slices held run out unless a claim renews
        them: a ttl on from the last claim's lock, or from the part's start."""
        self._surplus: tuple[str, ...] = ()
        self._waiting: tuple[str, ...] = ()
        self._repeats = Repeats()

    def start(self) -> None:
        """Run the leases and the workers in a task of their own (:attr:`task`)."""
        self._until = self.leases.clock() + timedelta(seconds=self.ttl)
        self.task = asyncio.create_task(self._run(), name=self.name)

    def trouble(self) -> str | None:
        """``None`` while work flows, else why it may not: not running, the slices'
        leases ran out (no claim renewed them in time: one hangs, or they fail), the
        last claim failed, the last release of the surplus failed, a range given up
        whose workers are still in their pass a ttl after their stop while a surplus
        slice waits for them, a worker's trouble (named with its range), or no slice
        held while slices wait for a service (free, or their holder missed a
        renewal)."""
        if self.task is None or self.task.done():
            return "not running"
        now = self.leases.clock()
        if self._until is not None and now > self._until:
            age = (now - self._until).total_seconds() + self.ttl
            cause = "a claim hangs" if self._failure is None else self._failure
            return f"leases not renewed for {age:.1f} s: {cause}"
        if self._failure is not None:
            return f"leases not renewed: {self._failure}"
        if self._release_failure is not None:
            return f"surplus not released: {self._release_failure}"
        surplus = ranges_of(self._surplus)
        for stopping in self.stopping:
            # Past a ttl, a surplus slice waits for this pass longer than it would for
            # a service that died. (A range replaced by a wider one holds up nothing.)
            age = (now - stopping.since).total_seconds()
            if age > self.ttl and any(stopping.covers(piece) for piece in surplus):
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
        told = asyncio.create_task(self._told_at_stop(), name=f"{self.name}: stop")
        try:
            while not self.stop.is_set():
                self._stopped.clear()
                await self._claim()
                await self._pause()
        finally:
            told.cancel()
            self._give_up(list(self.running))
            try:
                await asyncio.gather(*(s.ended for s in self.stopping), return_exceptions=True)
            finally:  # also when the service's bound cut the wait short
                await self._leave()

    async def _told_at_stop(self) -> None:
        """Tell every range's workers to stop as soon as the service stops, not once
        a claim under way returns (it may wait for the group's lock)."""
        await self.stop.wait()
        self._give_up(list(self.running))

    async def _leave(self) -> None:
        """Leave the group once every range's workers ended (waited for at most a third
        of the ttl, after a stop the service's bound cut short), so the others take
        the slices at once; else say that the slices wait for their leases to run
        out."""
        tasks = [task for stopping in self.stopping for task in stopping.workers]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.ttl / 3)
            if pending:
                _log.warning(
                    "%s: %d of its workers did not end; its bucket slices stay leased "
                    "until their leases run out (%g s)",
                    self.name,
                    len(pending),
                    self.ttl,
                )
                return
        try:
            async with asyncio.timeout(self.ttl / 3):
                await self.leases.leave()
        except Exception as error:  # noqa: BLE001 - the leases run out on their own
            _log.warning(
                "%s: could not give up its bucket slices (%s: %s); the other services "
                "take them once their leases run out (%g s)",
                self.name,
                type(error).__name__,
                self._told(error),
                self.ttl,
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
        except (Exception, asyncio.CancelledError) as error:  # noqa: BLE001 - next claim
            self._raise_own_cancel(error)
            self._failed(error, "claim")
            return
        self._failure = None
        self._until = change.until
        self._surplus = change.surplus
        self._waiting = change.waiting
        if self.stop.is_set():  # the stop came during the claim: start nothing
            return
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
            except (Exception, asyncio.CancelledError) as error:  # noqa: BLE001 - next claim
                self._raise_own_cancel(error)
                self._failed(error, "release")
            else:
                self._release_failure = None
                self._surplus = tuple(set(self._surplus) - set(done))
        elif not change.surplus:
            self._release_failure = None
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
            tasks = tuple(worker.task for worker in workers if worker.task is not None)
            start, end = piece
            ended = asyncio.create_task(
                self._ended(tasks), name=f"{self.name}: giving up buckets {start}-{end}"
            )
            self.stopping.append(_Stopping(piece, ended, self.leases.clock(), tasks))

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
            async with adapter.transaction(self.leases.wait) as tx:
                groups = await self.leases.table.kin(tx.driver, GROUP, self.leases.clock())
        except (Exception, asyncio.CancelledError) as error:  # noqa: BLE001 - a hint only
            self._raise_own_cancel(error)
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

    def _raise_own_cancel(self, error: BaseException) -> None:
        """Raise ``error`` again if it is this task's own cancellation (the service's,
        at the bound of a stop); a cancellation of something a claim awaited, which
        someone else cancelled, is a failed claim like any other."""
        if isinstance(error, asyncio.CancelledError) and not cancelled_elsewhere(
            self.stop.is_set()
        ):
            raise error

    def _failed(self, error: BaseException, what: str) -> None:
        """Say that a claim or a release failed, with the error's message (logged once
        per kind and interval); readiness says so until a claim (a release) succeeds."""
        kind = type(error).__name__
        if what == "claim":
            self._failure = kind
        else:
            self._release_failure = kind
        self._repeats.log(
            _log,
            logging.ERROR,
            (what, kind),
            "%s: a bucket lease %s failed (%s: %s); the next claim in %g s",
            self.name,
            what,
            kind,
            self._told(error),
            self.ttl / 3,
        )

    def _told(self, error: BaseException) -> str:
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
