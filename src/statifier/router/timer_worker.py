"""The worker of the built-in timer queue: fires due timers, each in the transaction
that deletes its row.

A fire and a cancel both delete the timer's row, so whichever commits first wins and
the other deletes nothing: they never both succeed. The row is deleted in the same
transaction as the step (or the route hand-off) it fires, so a crash before the commit
leaves the row, and the timer fires again; it never fires zero times, and its event is
stepped into the execution once in effect.

One pass of :meth:`TimerWorker.fire_due` claims due rows a batch at a time, one
transaction per batch, and fires each at a savepoint of its own, so one failing timer
does not undo the others:

- On PostgreSQL the claim is ``SELECT ... FOR UPDATE SKIP LOCKED`` (rows another
  worker holds are skipped, so workers in several processes and machines share the
  table), and the execution's advisory lock is only *tried* for each row: a step of
  that execution holds it and may be cancelling (deleting) the very rows claimed here,
  waiting for their row locks, so waiting for it in turn could deadlock. A row whose
  lock is not granted stays for a later pass. The step then takes the same lock again,
  which the transaction already holds.
- On SQLite the router's transaction holds the single writer: nothing races a pass.

A fire that raises is rolled back to its savepoint (the row stays) and the row is made
due again ``retry`` seconds later, so a failing timer is retried without being spun on.

Telemetry: every timer taken off the queue or retried reports
``statifier.router.timer``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Final

from statifier.callbacks import settle
from statifier.persistence import Discarded, Refused, Stepped
from statifier.persistence.errors import ExecutionNotFound
from statifier.router.config import RouterConfig
from statifier.router.delivery import step_timer_event
from statifier.router.errors import ConfigError, ExecutionParked
from statifier.router.timer_queue import TimerEntry, TimerKind
from statifier.router.timers import DueTimer, SqlTimerQueue
from statifier.router.transaction import Unit
from statifier.telemetry import enabled, report

__all__ = ["FIRED", "TimerWorker", "fire"]

_TIMER: Final = "statifier.router.timer"
FIRED: Final = "fired"
"""The telemetry outcome of a timer that stepped its execution or reached its route."""
_RECHECK: Final = 0.002
"""Seconds before the first look after a wake: a schedule wakes the worker before its
transaction commits, so the new row may not be readable yet."""

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[object]]


def _said(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _report(entry: TimerEntry, outcome: str, now: datetime, started: float, **more: str) -> None:
    if not enabled(_TIMER):
        return
    report(
        _TIMER,
        {
            "duration": time.perf_counter() - started,
            "lag": (now - entry.due_at).total_seconds(),
        },
        {
            "execution_id": entry.execution_id,
            "send_id": entry.send_id,
            "kind": entry.kind.value,
            "route": entry.route,
            "scope": entry.scope,
            "outcome": outcome,
            **more,
        },
    )


async def fire(unit: Unit, config: RouterConfig, entry: TimerEntry) -> bool:
    """Perform the due ``entry`` in ``unit`` (the caller deletes its row in the same
    transaction). The delayed sends of a step it runs are timed from ``unit.now``.

    - ``external`` and ``internal``: step the event into the execution (door
      ``timer``; ``internal`` on its internal queue), with no routing-ledger row.
    - ``route``: hand the event to the route, resolved in ``entry.scope`` at fire
      time, under the send's key, in ``unit``'s transaction.

    Answers ``True`` when it fired, ``False`` when the timer is discarded: the execution
    is gone or has ended, the route is no longer registered, or it refused (the last
    two are reported as telemetry outcomes ``unregistered`` and ``refused``).

    Raises:
        ExecutionParked: the execution is parked; the timer must stay (roll back).
        Exception: whatever the step, the route or the database raised.
    """
    started = time.perf_counter()
    if entry.kind is TimerKind.ROUTE:
        return await _hand_off(unit, config, entry, started)
    try:
        stepped = await _step(unit, config, entry)
    except ExecutionNotFound:
        _report(entry, "discarded", unit.now, started, reason="no_execution")
        return False
    if isinstance(stepped, Discarded):
        if not stepped.execution.status.terminal:
            raise ExecutionParked(entry.execution_id)
        _report(entry, "discarded", unit.now, started, reason="finished")
        return False
    _report(entry, FIRED, unit.now, started)
    return True


async def _step(unit: Unit, config: RouterConfig, entry: TimerEntry) -> Stepped | Discarded:
    """The one step a fire makes: through the router's step of a timer event (its sends
    resolve in the timer's scope, a finishing step reaches ``on_complete``)."""
    return await step_timer_event(
        unit,
        config,
        entry.execution_id,
        entry.event,
        internal=entry.kind is TimerKind.INTERNAL,
        scope=entry.scope,
        now=unit.now,
    )


async def _hand_off(unit: Unit, config: RouterConfig, entry: TimerEntry, started: float) -> bool:
    found = None if entry.route is None else config.route(entry.scope, entry.route)
    if found is None:
        _report(entry, "unregistered", unit.now, started, reason=f"no route {entry.route!r}")
        return False
    adapter, route_config = found
    answer = await settle(adapter.deliver(route_config, entry.event, entry.key, unit.tx))
    if isinstance(answer, Refused):
        _report(entry, "refused", unit.now, started, reason=answer.reason)
        return False
    _report(entry, FIRED, unit.now, started)
    return True


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, not {now!r}")
    return now.astimezone(UTC)


class TimerWorker:
    """Fires the due timers of ``config``'s built-in timer queue.

    Workers in any number of processes (and machines) may run on one database: each
    timer fires in one of them, once in effect.

    Args:
        config: the router configuration; its ``timer_queue`` must be the built-in one.
        batch: the most timers one transaction claims.
        poll: the most seconds :meth:`run` sleeps without looking (schedules of other
            processes wake no one here).
        retry: seconds after which a timer whose fire raised is tried again.
        clock: "now" as an aware UTC datetime; by default the storage's clock.
        sleep: ``asyncio.sleep``, or a stand-in for tests.

    Raises:
        ConfigError: the configuration has no built-in timer queue, or a bound is not
            positive.
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        batch: int = 100,
        poll: float = 1.0,
        retry: float = 5.0,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        queue = config.timers
        if not isinstance(queue, SqlTimerQueue):
            raise ConfigError(f"the timer worker fires the built-in timer queue, not {queue!r}")
        if batch < 1:
            raise ConfigError(f"batch must be at least 1, not {batch!r}")
        if not poll > 0 or not retry > 0:
            raise ConfigError(f"poll and retry must be positive seconds: {poll!r}, {retry!r}")
        self.config = config
        self.queue = queue
        self.batch = batch
        self.poll = poll
        self.retry = timedelta(seconds=retry)
        self.clock: Clock = config.storage.clock if clock is None else clock
        self.sleep = sleep
        self._woken = asyncio.Event()

    def wake(self, due_at: datetime | None = None) -> None:
        """Cut :meth:`run`'s sleep short: something was scheduled (``due_at``, unused,
        lets this be an ``on_schedule`` callback). Call it from the worker's event loop;
        waking early is harmless."""
        self._woken.set()

    async def next_due(self) -> datetime | None:
        """The earliest due time of any pending timer, or ``None`` when none is."""
        async with self.config.transaction() as unit:
            return await self.queue.next_due(unit.tx)

    async def fire_due(self, now: datetime | None = None) -> int:
        """Fire every timer due at ``now`` (default: the clock), in order of due time,
        then scheduling, then place in the sending step; answer how many were taken off
        the queue (fired or discarded). Timers whose fire raised are made due again
        later; those another worker or a step is busy with are left to a later pass.

        Raises:
            ValueError: ``now`` is naive.
            Exception: a batch's transaction failed (the database went away): what it
                fired is rolled back and will fire again.
        """
        return await self._fire_due(now, None)

    async def _fire_due(self, now: datetime | None, stop: asyncio.Event | None) -> int:
        moment = self.clock() if now is None else _aware(now)
        taken = 0
        while stop is None or not stop.is_set():
            claimed, done = await self._batch(moment)
            taken += done
            # A short batch saw every due row; one that took none left only rows that
            # are busy elsewhere or failed: claiming them again now would spin.
            if claimed < self.batch or done == 0:
                break
        return taken

    async def _batch(self, now: datetime) -> tuple[int, int]:
        """One transaction: claim a batch and fire it. Answers how many rows were
        claimed and how many taken off the queue."""
        taken = 0
        async with self.config.transaction() as unit:
            unit.now = now
            due = await self.queue.claim(unit.tx, now, self.batch)
            for timer in due:
                if timer.locked and await self._fire_one(unit, timer):
                    taken += 1
        return len(due), taken

    async def _fire_one(self, unit: Unit, timer: DueTimer) -> bool:
        """Delete the row and fire it at one savepoint; answers whether the row is gone.
        A fire that raises leaves the row, due ``retry`` later."""
        started = time.perf_counter()
        try:
            async with unit.savepoint():
                if not await self.queue.take(unit.tx, timer.id):
                    return False  # pragma: no cover - a claimed row is held by this claim
                await fire(unit, self.config, timer.entry)
        except Exception as error:  # noqa: BLE001 - one timer's failure is its own
            await self.queue.retry_at(unit.tx, timer.id, unit.now + self.retry)
            _report(timer.entry, "failed", unit.now, started, error=_said(error))
            return False
        return True

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
                await self._fire_due(None, stop)
                if stop.is_set():
                    break
                wait = self.poll
                upcoming = await self.next_due()
                if upcoming is not None:
                    wait = min(wait, max(0.0, (upcoming - self.clock()).total_seconds()))
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
        """Sleep ``seconds``, or less if woken or stopped; answers whether woken."""
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
