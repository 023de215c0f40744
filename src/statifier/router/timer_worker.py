"""The worker of the built-in timer queue: fires due timers, each in the transaction
that deletes its row.

A fire and a cancel both delete the timer's row, so whichever commits first wins and
the other deletes nothing: they never both succeed. The row is deleted in the same
transaction as the step (or the route hand-off) it fires, so a crash before the commit
leaves the row, and the timer fires again; it never fires zero times, and its event is
stepped into the execution once in effect.

One pass of :meth:`TimerWorker.fire_due` takes due rows a batch at a time, one
transaction per batch:

- At once: one statement deletes the batch's rows
  (:meth:`~statifier.router.timers.SqlTimerQueue.take_due`) and the batch's timers
  fire one after the other in the same transaction, with no savepoint between them.
- One by one, only when a batch at once raised (and was rolled back whole): the rows
  are locked (:meth:`~statifier.router.timers.SqlTimerQueue.claim`) and each is
  deleted and fired at a savepoint of its own, so one failing timer does not undo the
  others. The timers before the failing one fire a second time, so a host effect a
  step performs outside the transaction (a route adapter that keeps nothing in it)
  may run twice: at least once is the contract, as after a crash.

Locks:

- On PostgreSQL rows another worker holds are skipped (``FOR UPDATE SKIP LOCKED``), so
  workers in several processes and machines share the table, and the execution's
  lock is only *tried* for each row: a step of that execution holds it and may
  be cancelling (deleting) the very rows locked here, waiting for their row locks, so
  waiting for it in turn could deadlock. A row whose lock is not granted stays for a
  later pass, and so does a row behind an earlier row of its execution that another
  worker holds: one execution's timers fire in order whatever the number of workers.
  The steps of a batch then run under the locks its claim took: they do not ask for
  them again; the rows of the executions they step are read, and locked, in one
  statement after the claim (``Storage.read_ahead``).
- On SQLite the router's transaction holds the single writer: nothing races a pass.

A route timer whose execution has ended (or is gone) is discarded unsent: a delayed
send dies with the execution that sent it. A route that refuses a due send, or raises
(rolled back to a savepoint of its own), is asked again later: the row is scheduled
again after the :class:`RouteRetries` backoff, and after its last attempt it is given
up: a ``send_refused`` routing-ledger row records it (reason ``route_failed``), the
execution hears ``error.communication`` carrying the send's id (if it still runs), and
a warning is logged. A route no longer registered is given up at once.

A fire that raises (in a batch one by one) is rolled back to its savepoint (the row
stays) and the row is made due again ``retry`` seconds later, so a failing timer is
retried without being spun on. A row whose payload the codec cannot decode
(:class:`~statifier.router.timers.UnreadableTimer`: sealed under a key this worker
lacks) is put off the same way, unfired, while the rest of its batch fires.

Every fire runs under the configuration's ``around_delivery``, told
:attr:`~statifier.router.Entry.TIMER` and the timer's scope: the scope its payload
holds, that of the delivery whose step scheduled it (the empty string for a timer a
step of no scope scheduled: a call of the host's own). ``on_begin`` is called first in
the fire, before any statement of it, so a ``SET LOCAL`` it makes reaches the fire's
step and the rows it writes; what the batch runs before its fires (the claim that
takes or locks the due rows, the read-ahead of the executions they step) runs before
any ``on_begin``, with no scope set. A fire the wrapper (or ``on_begin``) refuses is a
fire that raised: a batch at once is rolled back and fired one by one, where the
refused fire is rolled back to its savepoint and made due ``retry`` seconds later,
under its own scope (``on_begin`` is called again for that), while the rest fire.

A batch's transaction that loses a conflict (SQLSTATE 40001 or 40P01), at once or one
by one, is rolled back and run again whole
(:meth:`Router.in_transaction <statifier.router.Router.in_transaction>`): a conflict
in one fire is not that fire's failure but the transaction's, until the last attempt,
where it is answered as any failure. The fires run again, ``on_begin`` and
``around_delivery`` with them.

Telemetry: every timer taken off the queue or retried reports
``statifier.router.timer``, once its batch has committed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from statifier.buckets import ALL_BUCKETS, bucket_range
from statifier.callbacks import awaited
from statifier.core import Event
from statifier.core.events import engine_event
from statifier.error_text import error_text
from statifier.persistence import Discarded, ExecutionNotFound, Refused, Status, Stepped
from statifier.persistence.reentry import hold
from statifier.repeats import Repeats
from statifier.router.config import Entry
from statifier.router.delivery import TIMER_VIA, hold_event, step_timer_event
from statifier.router.errors import ConfigError, ExecutionParked
from statifier.router.outbox import Backoff
from statifier.router.records import LedgerRow
from statifier.router.routing import Router
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.timers import DueTimer, SqlTimerQueue, Taken, UnreadableTimer
from statifier.router.transaction import Unit, around
from statifier.telemetry import enabled, report

__all__ = ["FIRED", "HELD", "RouteRetries", "TimerWorker", "fire"]

_TIMER: Final = "statifier.router.timer"
FIRED: Final = "fired"
"""The telemetry outcome of a timer that stepped its execution or reached its route."""
HELD: Final = "held"
"""The telemetry outcome of a timer of a paused execution: its event is held, and
stepped in when the execution resumes."""
_FAILED: Final = "failed"
"""The telemetry outcome of a timer whose fire raised: it stays, due ``retry`` later."""
_BUSY: Final = 0.01
"""Seconds before the next look when a pass left due rows that others held."""
_RECHECK: Final = 0.002
"""Seconds before the first look after a wake: a schedule wakes the worker before its
transaction commits, so the new row may not be readable yet."""

_RETRIED: Final = "retried"
"""The telemetry outcome of a route timer the route refused: it is scheduled again."""
_GIVEN_UP: Final = "given_up"
"""The telemetry outcome of a route timer given up: out of attempts, or unregistered."""
_log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class RouteRetries:
    """How often a due route send is offered to a route that refuses it: ``attempts``
    in all (at least 1), waiting ``backoff`` between them.

    >>> RouteRetries().attempts
    8
    """

    attempts: int = 8
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"attempts must be a positive integer, not {self.attempts!r}")


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What one fire came to: the fields of its telemetry report, which is sent once
    the fire's transaction has committed."""

    entry: TimerEntry | UnreadableTimer
    outcome: str
    now: datetime
    duration: float
    detail: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FirePass:
    """What one pass of :meth:`TimerWorker.fire_pass` came to.

    Attributes:
        taken: timers taken off the queue (fired, or discarded because their
            execution had ended).
        failed: fires that raised or were refused, each logged as a warning and kept,
            due again ``retry`` seconds later.
        left: due timers the pass's last batch left because another worker or a step
            held them (a later pass fires them).

    Example:
        >>> FirePass(taken=3, failed=1, left=0).failed
        1
    """

    taken: int
    failed: int
    left: int


@dataclass(frozen=True, slots=True)
class _Batch:
    """What one batch's transaction came to.

    Attributes:
        picked: the due rows it looked at (at most the batch).
        taken: how many it took off the queue (fired or discarded).
        left: due rows it left to a later pass (another worker or a step held them).
        upcoming: the earliest due time after the batch's "now" of any row, or
            ``None``: when the next batch has work.
        failed: fires that failed (each logged on its own), kept for ``retry``.
    """

    picked: int
    taken: int
    left: int
    upcoming: datetime | None
    failed: int = 0


def _done(
    entry: TimerEntry | UnreadableTimer, outcome: str, now: datetime, started: float, **detail: str
) -> _Outcome:
    return _Outcome(entry, outcome, now, time.perf_counter() - started, detail)


def _report(outcomes: Iterable[_Outcome]) -> None:
    if not enabled(_TIMER):
        return
    for done in outcomes:
        entry = done.entry
        route, scope = (entry.route, entry.scope) if isinstance(entry, TimerEntry) else (None, None)
        report(
            _TIMER,
            {"duration": done.duration, "lag": (done.now - entry.due_at).total_seconds()},
            {
                "execution_id": entry.execution_id,
                "send_id": entry.send_id,
                "kind": entry.kind.value,
                "route": route,
                "scope": scope,
                "outcome": done.outcome,
                **done.detail,
            },
        )


async def fire(
    unit: Unit, entry: TimerEntry, now: datetime, retries: RouteRetries | None = None
) -> bool:
    """Perform the due ``entry`` in ``unit`` (the caller deletes its row in the same
    transaction) at ``now``, and report it. The delayed sends of a step it runs are
    timed from ``now``.

    - ``external`` and ``internal``: step the event into the execution (via
      ``timer``; ``internal`` on its internal queue), with no routing-ledger row.
    - ``route``: hand the event to the route, resolved in ``entry.scope`` at fire
      time, under the send's key, in ``unit``'s transaction; a refusal schedules it
      again on the configuration's queue until ``retries`` runs out (see the module
      docstring).

    Returns ``True`` when it fired, ``False`` when the timer is discarded (the
    execution is gone or has ended), held (the execution is paused: its event waits
    for the resume), scheduled again, or given up.

    Raises:
        ExecutionParked: the execution is parked; the timer must stay (roll back).
        Exception: whatever the step or the database raised.
    """
    done = await _perform(unit, entry, now, retries or RouteRetries())
    _report([done])
    return done.outcome == FIRED


async def _perform(
    unit: Unit,
    entry: TimerEntry,
    now: datetime,
    retries: RouteRetries,
) -> _Outcome:
    """:func:`fire` without its report."""
    started = time.perf_counter()
    if entry.kind is TimerKind.ROUTE:
        return await _hand_off(unit, entry, now, started, retries)
    try:
        stepped = await _step(unit, entry, entry.event, now)
    except ExecutionNotFound:
        return _done(entry, "discarded", now, started, reason="no_execution")
    if isinstance(stepped, Discarded):
        if stepped.execution.status is Status.PAUSED:
            # A paused execution's timers wait with its events: fired on resume.
            internal = entry.kind is TimerKind.INTERNAL
            await hold_event(
                unit,
                entry.execution_id,
                entry.event,
                via=TIMER_VIA,
                internal=internal,
                scope=entry.scope,
                message_id=None,
                now=now,
            )
            return _done(entry, HELD, now, started)
        if not stepped.execution.status.terminal:
            raise ExecutionParked(entry.execution_id)
        return _done(entry, "discarded", now, started, reason="finished")
    return _done(entry, FIRED, now, started)


async def _step(
    unit: Unit,
    entry: TimerEntry,
    event: Event,
    now: datetime,
    internal: bool | None = None,
) -> Stepped | Discarded:
    """The one step a fire makes: through the router's step of a timer event (its sends
    resolve in the timer's scope, a finishing step reaches ``on_complete``)."""
    return await step_timer_event(
        unit,
        entry.execution_id,
        event,
        internal=entry.kind is TimerKind.INTERNAL if internal is None else internal,
        scope=entry.scope,
        now=now,
    )


async def _hand_off(
    unit: Unit,
    entry: TimerEntry,
    now: datetime,
    started: float,
    retries: RouteRetries,
) -> _Outcome:
    """Hand a due route send to its route, unless its execution has ended; a refusal
    schedules it again, or gives it up (see the module docstring)."""
    record = await unit.storage.find_execution(entry.execution_id)
    if record is None:
        return _done(entry, "discarded", now, started, reason="no_execution")
    if record.status.terminal:
        return _done(entry, "discarded", now, started, reason="finished")
    found = None if entry.route is None else unit.config.route(entry.scope, entry.route)
    if found is None:
        why = f"no route named {entry.route!r} is registered"
        return await _give_up(unit, entry, now, started, why)
    adapter, route_config = found
    try:
        # A route that raises leaves nothing half-written behind it.
        async with unit.savepoint():
            answer = await awaited(
                adapter.deliver(route_config, entry.event, entry.key, unit.tx, entry.scope)
            )
    except Exception as error:  # a route's failure is a refusal of the send
        if unit.reruns(error):
            raise  # a lost conflict (the route writes in the fire's transaction): run again
        answer = Refused(error_text(error))
    if not isinstance(answer, Refused):
        return _done(entry, FIRED, now, started)
    why = f"route {entry.route!r}: {answer.reason}"
    attempts = entry.attempts + 1
    queue = unit.timers
    if attempts < retries.attempts and queue is not None:
        due_at = now + retries.backoff.delay(attempts)
        await queue.schedule(unit.tx, replace(entry, due_at=due_at, attempts=attempts))
        _log.warning(
            "execution %s: %s (attempt %d of %d); trying again at %s",
            entry.execution_id,
            why,
            attempts,
            retries.attempts,
            due_at.isoformat(),
            extra={
                "execution_id": entry.execution_id,
                "route": entry.route,
                "send_id": entry.send_id,
                "attempt": attempts,
                "attempts": retries.attempts,
            },
        )
        return _done(entry, _RETRIED, now, started, reason=why, attempt=str(attempts))
    given_up = f"{why} (gave up after {attempts} attempt{'s' if attempts != 1 else ''})"
    return await _give_up(unit, entry, now, started, given_up)


async def _give_up(
    unit: Unit,
    entry: TimerEntry,
    now: datetime,
    started: float,
    why: str,
) -> _Outcome:
    """A route send that will not go: a ``send_refused`` ledger row, the chart told
    (``error.communication`` with the send's id, if it still runs), a warning."""
    row = LedgerRow(
        "route",
        message_id=str(entry.key),
        scope=entry.scope,
        source=None,
        outcome="send_refused",
        reason=f"route_failed: {why}",
        document=None,
        key=entry.route,
        execution_id=entry.execution_id,
        inserted_at=now,
    )
    await unit.sql.record(row)
    failure = engine_event("error.communication", "platform", {"message": why}, entry.event.sendid)
    await _step(unit, entry, failure, now, internal=True)
    _log.warning(
        "execution %s: a delayed send to a route was given up: %s",
        entry.execution_id,
        why,
        extra={
            "execution_id": entry.execution_id,
            "route": entry.route,
            "send_id": entry.send_id,
        },
    )
    return _done(entry, _GIVEN_UP, now, started, reason=why)


async def _under_claim(unit: Unit, timers: Sequence[DueTimer | UnreadableTimer]) -> set[str]:
    """The executions of claimed ``timers`` whose locks the claim holds, for
    :meth:`Unit.holding`; the executions they step read ahead in one statement (each
    step would read its own)."""
    held = {timer.execution_id for timer in timers if timer.locked}
    # What the claim locked, noted as this transaction's: a route that calls back into
    # one of them is refused rather than left waiting for this very transaction.
    hold(unit.tx, [("execution", execution_id) for execution_id in held], "a timer's execution")
    stepped = {
        timer.execution_id
        for timer in timers
        if isinstance(timer, DueTimer) and timer.locked and timer.entry.kind is not TimerKind.ROUTE
    }
    await unit.storage.read_ahead(sorted(stepped))
    return held


def _scope(entry: TimerEntry) -> str:
    """The scope a fire runs under: the payload's, the scope of the delivery whose step
    scheduled the timer; the empty string when that step had none."""
    return entry.scope or ""


def _aware(now: datetime) -> datetime:
    if not isinstance(now, datetime):  # untyped callers pass anything
        raise TypeError(f"now is a timezone-aware datetime, not {now!r}")
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, not {now!r}")
    return now.astimezone(UTC)


class TimerWorker:
    """Fires the due timers of ``router``'s built-in timer queue.

    Workers in any number of processes (and machines) may run on one database: each
    timer fires in one of them, once in effect. A worker given ``buckets`` fires the
    timers of the executions of that range of buckets alone
    (:func:`statifier.buckets.bucket_of`), read by the timers' ``(bucket, due_at)``
    index: workers given ranges that cover every bucket between them fire every timer,
    and none of them scans the others' (decision 0121).

    Args:
        router: the router; its configuration's ``timer_queue`` must be the built-in one.
        batch: the most timers one transaction claims.
        poll: the most seconds :meth:`run` sleeps without looking (schedules of other
            processes wake no one here).
        retry: seconds after which a timer whose fire raised is tried again.
        route_retries: how often a route that refuses a due send is asked again.
        clock: "now" as an aware UTC datetime; by default the storage's clock.
        sleep: ``asyncio.sleep``, or a stand-in for tests.
        buckets: the range of buckets ``(start, end)``, ``end`` excluded, whose timers
            it fires; by default every bucket, ``(0, BUCKETS)``.

    Raises:
        ConfigError: the configuration has no built-in timer queue, a bound is not
            positive, or ``buckets`` is not a non-empty range within ``0..BUCKETS``.
    """

    def __init__(
        self,
        router: Router,
        *,
        batch: int = 100,
        poll: float = 1.0,
        retry: float = 5.0,
        route_retries: RouteRetries | None = None,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> None:
        queue = router.timers
        if not isinstance(queue, SqlTimerQueue):
            raise ConfigError(f"the timer worker fires the built-in timer queue, not {queue!r}")
        if batch < 1:
            raise ConfigError(f"batch must be at least 1, not {batch!r}")
        if not poll > 0 or not retry > 0:
            raise ConfigError(f"poll and retry must be positive seconds: {poll!r}, {retry!r}")
        try:
            self.buckets = bucket_range(buckets)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self.router = router
        self.queue = queue
        self.batch = batch
        self.poll = poll
        self.retry = timedelta(seconds=retry)
        self.route_retries = route_retries or RouteRetries()
        self.clock: Clock = router.storage.clock if clock is None else clock
        self.sleep = sleep
        self._woken = asyncio.Event()
        self._repeats = Repeats()

    def wake(self, due_at: datetime | None = None) -> None:
        """Cut :meth:`run`'s sleep short: something was scheduled (``due_at``, unused,
        lets this be an ``on_schedule`` callback). Call it from the worker's event loop;
        waking early is harmless."""
        self._woken.set()

    async def next_due(self) -> datetime | None:
        """The earliest due time of any pending timer of its buckets, or ``None`` when
        none is."""
        async with self.router.transaction() as unit:
            return await self.queue.next_due(unit.tx, self.buckets)

    async def fire_due(self, now: datetime | None = None) -> int:
        """Fire every timer due at ``now`` (default: the clock), in order of due time,
        then scheduling, then place in the sending step; answer how many were taken off
        the queue (fired or discarded). Timers whose fire raised are made due again
        later; those another worker or a step is busy with are left to a later pass.
        :meth:`fire_pass` fires the same way and answers how many failed too.

        Raises:
            ValueError: ``now`` is naive.
            Exception: a batch's transaction failed (the database went away): what it
                fired is rolled back and will fire again.
        """
        return (await self.fire_pass(now)).taken

    async def fire_pass(self, now: datetime | None = None) -> FirePass:
        """Fire every timer due at ``now`` as :meth:`fire_due` does, and answer what the
        pass came to: how many timers it took off the queue, how many failed (each
        logged as a warning, and due again ``retry`` seconds later), and how many it
        left to another worker or a step that held them.

        Raises:
            ValueError: ``now`` is naive.
            Exception: a batch's transaction failed (the database went away): what it
                fired is rolled back and will fire again.
        """
        done, _ = await self._pass(now, None)
        return done

    async def _pass(
        self, now: datetime | None, stop: asyncio.Event | None
    ) -> tuple[FirePass, _Batch | None]:
        """Batches until the due rows are done; returns what they came to, and the last
        batch (``None`` when stopped before one)."""
        moment = self.clock() if now is None else _aware(now)
        taken = failed = 0
        batch = None
        while stop is None or not stop.is_set():
            batch = await self._batch(moment)
            taken += batch.taken
            failed += batch.failed
            # A short batch saw every due row; one that took none left only rows that
            # are busy elsewhere or failed: claiming them again now would spin.
            if batch.picked < self.batch or batch.taken == 0:
                break
        left = 0 if batch is None else batch.left
        return FirePass(taken, failed, left), batch

    async def _batch(self, now: datetime) -> _Batch:
        """One batch at once or, when that raises, one by one."""
        try:
            return await self._at_once(now)
        except Exception as error:  # noqa: BLE001 - rolled back whole; one by one finds the culprit
            batch = await self._one_by_one(now)
            if not batch.failed:
                # Not the error of one timer (each of those is logged as it fails
                # again): a lock wait that ran out, a lost connection; seen only here.
                self._repeats.log(
                    _log,
                    logging.WARNING,
                    ("one by one", type(error).__name__),
                    "a batch of due timers failed at once and fired one at a time "
                    "with no failure: %s",
                    error_text(error),
                )
            return batch

    async def _at_once(self, now: datetime) -> _Batch:
        """One transaction: delete a batch of due rows, fire every one, their steps'
        writes sent together where the database gains by it
        (:meth:`~statifier.persistence.Storage.deferred_steps`); whatever raises undoes
        the whole batch, and a lost conflict runs it again (:meth:`Router.in_transaction
        <statifier.router.Router.in_transaction>`)."""

        async def attempt(unit: Unit) -> tuple[Taken, list[_Outcome]]:
            taken = await self.queue.take_due(unit.tx, now, self.batch, self.buckets)
            held = await _under_claim(unit, taken.timers)
            # The fires' step writes go together (on PostgreSQL), as a route batch's.
            with unit.holding(held):
                async with unit.deferred_steps():
                    outcomes = [await self._fire(unit, timer.entry, now) for timer in taken.timers]
            return taken, outcomes

        taken, outcomes = await self.router.in_transaction(attempt, entered=Entry.TIMER)
        _report(outcomes)
        done = len(outcomes)
        return _Batch(taken.picked, done, taken.picked - done, taken.upcoming)

    async def _one_by_one(self, now: datetime) -> _Batch:
        """One transaction: lock a batch of due rows, delete and fire each at a
        savepoint of its own; a lost conflict runs it all again."""

        async def attempt(
            unit: Unit,
        ) -> tuple[list[DueTimer | UnreadableTimer], list[_Outcome], datetime | None]:
            # Built anew in each attempt: what is reported is the committed attempt's.
            outcomes: list[_Outcome] = []
            due = await self.queue.claim(unit.tx, now, self.batch, self.buckets)
            locked = await _under_claim(unit, due)
            # What is not a fire runs before the fires, with no scope set: a fire's
            # on_begin leaves its setting in force for the rest of the transaction.
            held = [timer for timer in due if timer.locked]
            outcomes.extend(
                [
                    await self._put_off(unit, timer, now)
                    for timer in held
                    if isinstance(timer, UnreadableTimer)
                ]
            )
            upcoming = await self.queue.upcoming(unit.tx, now, self.buckets)
            with unit.holding(locked):
                for timer in held:
                    if isinstance(timer, DueTimer):
                        done = await self._fire_one(unit, timer, now)
                        if done is not None:
                            outcomes.append(done)
            if any(done.outcome == _FAILED for done in outcomes):
                again = now + self.retry
                upcoming = again if upcoming is None else min(upcoming, again)
            return due, outcomes, upcoming

        due, outcomes, upcoming = await self.router.in_transaction(attempt, entered=Entry.TIMER)
        _report(outcomes)
        taken = sum(done.outcome != _FAILED for done in outcomes)
        failed = len(outcomes) - taken
        return _Batch(len(due), taken, len(due) - len(outcomes), upcoming, failed)

    async def _fire(self, unit: Unit, entry: TimerEntry, now: datetime) -> _Outcome:
        """Fire ``entry`` under ``around_delivery``, ``on_begin`` first (see the module
        docstring)."""
        scope = _scope(entry)

        async def work() -> _Outcome:
            await unit.begin(scope, Entry.TIMER)
            return await _perform(unit, entry, now, self.route_retries)

        return await around(unit.config, scope, Entry.TIMER, work)

    async def _fire_one(self, unit: Unit, timer: DueTimer, now: datetime) -> _Outcome | None:
        """Delete the row and fire it at one savepoint, under ``around_delivery`` and
        ``on_begin``. A fire that raises, or that the wrapper refuses, leaves the row,
        due ``retry`` later."""
        started = time.perf_counter()
        scope = _scope(timer.entry)

        async def work() -> _Outcome | None:
            await unit.begin(scope, Entry.TIMER)
            if not await self.queue.take(unit.tx, timer.id):
                return None  # pragma: no cover - a claimed row is held by this claim
            return await _perform(unit, timer.entry, now, self.route_retries)

        try:
            # The savepoint encloses the wrapper: one that raises after the work undoes it.
            async with unit.savepoint():
                return await around(unit.config, scope, Entry.TIMER, work)
        except Exception as error:  # one timer's failure is its own
            if unit.reruns(error):
                raise  # a lost conflict: the whole batch is run again
            due_at = now + self.retry
            _log.warning(
                "execution %s: timer %s failed to fire; it is tried again at %s: %s",
                timer.entry.execution_id,
                timer.entry.send_id,
                due_at.isoformat(),
                error_text(error),
                extra={"execution_id": timer.entry.execution_id},
            )
            await self._retry(unit, timer, scope, due_at)
            return _done(timer.entry, _FAILED, now, started, error=error_text(error))

    async def _retry(self, unit: Unit, timer: DueTimer, scope: str, due_at: datetime) -> None:
        """Make a fire that raised due at ``due_at``, under its own scope: the setting
        the failed fire's ``on_begin`` made was undone with it. If ``on_begin`` refuses
        here too, the row is moved under whatever is set (a host's policy may hide it:
        it then stays due, for the next pass)."""
        try:
            async with unit.savepoint():
                await unit.begin(scope, Entry.TIMER)
                await self.queue.retry_at(unit.tx, timer.id, due_at)
        except Exception as error:  # on_begin refused the scope again
            if unit.reruns(error):
                raise  # a lost conflict: the whole batch is run again
            _log.warning(
                "execution %s: on_begin refused scope %r again for timer %s; its retry is "
                "kept under the transaction's own setting: %s",
                timer.entry.execution_id,
                scope,
                timer.entry.send_id,
                error_text(error),
                extra={"execution_id": timer.entry.execution_id},
            )
            await self.queue.retry_at(unit.tx, timer.id, due_at)

    async def _put_off(self, unit: Unit, timer: UnreadableTimer, now: datetime) -> _Outcome:
        """A row that cannot be read here cannot fire: it stays, due ``retry`` later,
        reported as a failed fire, while the rest of the batch fires."""
        started = time.perf_counter()
        await self.queue.retry_at(unit.tx, timer.id, now + self.retry)
        self._repeats.log(
            _log,
            logging.WARNING,
            ("unreadable", type(timer.error).__name__),
            "timer %r of execution %s cannot be read here (%s); it is due again in %s",
            timer.send_id,
            timer.execution_id,
            error_text(timer.error),
            self.retry,
            extra={"execution_id": timer.execution_id},
        )
        return _done(timer, _FAILED, now, started, error=error_text(timer.error))

    async def run(self, stop: asyncio.Event) -> None:
        """Fire due timers until ``stop`` is set: a pass, then sleep until the next due
        time, at most ``poll`` seconds, or until :meth:`wake` is called.

        While it runs, a schedule through this process's queue wakes it.

        Raises:
            Exception: a pass failed (the database went away); the caller decides
                whether to start it again.
        """
        self.queue.on_schedule.append(self.wake)
        recheck = 0.0
        try:
            while not stop.is_set():
                self._woken.clear()
                _, last = await self._pass(None, stop)
                if stop.is_set() or last is None:
                    break
                wait = self.poll
                if last.upcoming is not None:
                    wait = min(wait, max(0.0, (last.upcoming - self.clock()).total_seconds()))
                if last.left:
                    # Due rows another worker or a step holds: look again soon, but do
                    # not spin on them.
                    wait = min(wait, _BUSY)
                if recheck:
                    # Woken by a schedule that may not have committed yet: look again
                    # soon, then less and less often, until the poll bound.
                    wait = min(wait, recheck)
                    recheck = recheck * 2 if recheck * 2 < self.poll else 0.0
                if self._woken.is_set() or await self._nap(stop, wait):
                    recheck = _RECHECK
        finally:
            self.queue.on_schedule.remove(self.wake)

    async def _nap(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep ``seconds``, or less if woken or stopped; returns whether woken."""
        if seconds <= 0:
            return False
        nap = asyncio.ensure_future(self.sleep(seconds))
        woken = asyncio.ensure_future(self._woken.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({nap, woken, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (nap, woken, stopped):
                future.cancel()
        return self._woken.is_set()
