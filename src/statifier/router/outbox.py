"""The built-in transactional outbox: a route that hands events off as rows, and the
drain that gives them to the host's sinks after the commit.

:class:`OutboxRoute` inserts one row per send into the ``outbox`` table, on the
delivery's transaction, so the row commits with the step that sent and rolls back with
it; the unique ``(queue, key)`` index makes a re-driven step's repeat of one send one
row. :class:`OutboxDrain` reads committed rows only, and never holds a transaction (or
an execution's lock) while a sink runs: it *leases* a batch of due rows in one short
transaction, calls each row's sink outside any transaction, then marks the row sent,
or records the failure and retries it later with backoff, dead-lettering it after
``max_attempts``; a sink call still running at nine tenths of the lease is ended, a
failed attempt, before another worker may claim the row. A worker that dies between
the sink call and the mark leaves its rows leased; once the lease runs out another
worker tries them again, under the same key. The sink gets the row's key as its own
idempotency key: a sink that dedupes on it turns that retry into no second effect.

With a blob codec (``codec=``; the drain takes a router configuration's storage's), a
row's event is stored in the codec's sealed form
(:func:`~statifier.persistence.codec.sealed_json`): its data is the host's. The drain
decodes it before a sink sees it; a row it cannot decode is dead-lettered at once, as
an unreadable payload.

Each row carries a bucket (decision 0122): the bucket of the key whose transaction
wrote it, which is the bucket of the sending execution (:func:`statifier.buckets.bucket_of`)
unless the writer names another (a refused hop's report, written in the target's
transaction, carries the target address's), and for a row handed off outside any
execution, the bucket of its ``(queue, key)`` (:func:`statifier.buckets.outbox_bucket`).
A drain given a range of buckets (``OutboxDrain(buckets=...)``) leases that range's
rows alone; by default it leases every bucket's.

On PostgreSQL the claim locks the rows it picks with ``FOR UPDATE SKIP LOCKED``, so
workers on several machines share one outbox without waiting for one another; on
SQLite it runs under the adapter's single writer. Leases are timed by each worker's
own clock: keep the workers' clocks in step to well within the lease. The statements
are :class:`statifier.sql.outbox.OutboxTable`'s; this module says what a row means.

>>> import asyncio, tempfile
>>> from pathlib import Path
>>> from statifier.core import Event
>>> from statifier.persistence.sql import SqlAdapter
>>> from statifier.router.routes import IdempotencyKey
>>> from statifier.sql import migrations
>>> url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'outbox.db'}"
>>> migrations.upgrade(url)
>>> key = IdempotencyKey("ex_1", send_id="book", macrostep=1, microstep=1, round=0,
...                      content_index=4, ordinal=0)
>>> sent = []
>>> async def main():
...     async with SqlAdapter(url) as adapter:
...         route = OutboxRoute(adapter)
...         event = Event("pickup.requested", data={"parcel_id": "p1"}, sendid="book")
...         async with adapter.transaction() as tx:
...             await route.deliver({"queue": "pickups"}, event, key, tx, "shop_a")
...             await route.deliver({"queue": "pickups"}, event, key, tx, "shop_a")  # a redrive
...         drain = OutboxDrain(adapter, {"pickups": lambda m: sent.append((m.key, m.event.name))})
...         return await drain.drain_once(), await drain.pending()
>>> asyncio.run(main())
(DrainReport(claimed=1, sent=1, failed=0, dead=0, reclaimed=0, lost=0), [])
>>> sent
[('ex_1/book/1/1/0/4/0', 'pickup.requested')]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from statifier.buckets import ALL_BUCKETS, bucket_of, bucket_range, one_bucket, outbox_bucket
from statifier.callbacks import awaited
from statifier.core import Event
from statifier.core.positions import NotAPosition, dump_event, load_event
from statifier.error_text import error_text
from statifier.persistence import (
    PLAIN,
    BlobCodec,
    Refused,
    Storage,
    UndecodableBlob,
    database_down,
    worth_a_traceback,
)
from statifier.persistence.codec import PlainBlobs, opened_text, sealed_json
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.repeats import Repeats
from statifier.router.errors import ConfigError
from statifier.router.routes import IdempotencyKey
from statifier.sql.outbox import LeasedRow, OutboxTable, StoredRow
from statifier.telemetry import report

__all__ = [
    "SINK_SHARE",
    "Backoff",
    "DeadLetter",
    "DrainReport",
    "OutboxDrain",
    "OutboxMessage",
    "OutboxRoute",
    "OutboxRow",
    "Sink",
]

_TELEMETRY: Final = "statifier.router.outbox"
_FAILED: Final = "statifier.router.outbox_failed"
_ERROR_LIMIT: Final = 500
"""The most characters of a failure kept in ``last_error``."""
_UNSTORABLE: Final = re.compile(r"[\x00\ud800-\udfff]")
"""What a SQL text column refuses: NUL (PostgreSQL) and lone surrogates (UTF-8)."""
SINK_SHARE: Final = 0.9
"""The share of the lease, from the claim, a sink call may take; the last tenth is for
marking the row before another worker may claim it."""
_log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def _wall_clock() -> datetime:
    return datetime.now(UTC)


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, not {now!r}")
    return now


# Values.


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """What a sink is handed: one outbox row, read back.

    Attributes:
        queue: the row's queue (the sink's name).
        key: the row's key, fixed when the row was written: use it as the sink's own
            idempotency key (a retry after a lost worker carries the same one).
        event: the event the route was handed.
        target: where to (a BasicHTTP URL, or the route configuration's ``target``).
        execution_id: the sending execution, when the send came from one.
        scope: the delivery's scope, when the hand-off was given one.
        sendid: the send's author-written id (``None`` when the author gave none).
        attempts: how many earlier attempts failed (0 the first time).
        final: whether this is the last attempt: a failure now dead-letters the row.
    """

    queue: str
    key: str
    event: Event
    _: KW_ONLY
    target: str | None = None
    execution_id: str | None = None
    scope: str | None = None
    sendid: str | None = None
    attempts: int = 0
    final: bool = False


Sink = Callable[[OutboxMessage], "Awaitable[None] | None"]
"""A queue's consumer: returns when the message is handled (the row is marked sent),
raises when it is not (retried with backoff; :class:`DeadLetter` gives up at once).
A plain function or a coroutine function; a coroutine still running at nine tenths of
the drain's lease is cancelled, a failed attempt, as is a ``CancelledError`` the drain
did not ask for."""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as stored.

    ``payload`` holds ``event`` (the stored event: the text
    :func:`~statifier.core.positions.dump_event` wrote), ``key``, ``sendid``, ``target``,
    ``execution_id`` and ``scope``. A row is pending until ``sent_at`` or ``dead_at``
    is set; ``lease`` and ``leased_until`` name the worker holding it, if any.
    """

    id: Any
    _: KW_ONLY
    queue: str
    key: str
    payload: Mapping[str, Any]
    attempts: int
    next_attempt_at: datetime
    lease: str | None
    leased_until: datetime | None
    sent_at: datetime | None
    dead_at: datetime | None
    last_error: str | None
    inserted_at: datetime

    @property
    def event(self) -> Event:
        """The stored event."""
        return _event(self.payload)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a failed row waits before its next attempt: ``base`` after the first
    failure, multiplied by ``factor`` after each further one, never more than ``cap``.

    >>> backoff = Backoff()
    >>> [backoff.delay(n).total_seconds() for n in (1, 2, 3, 10)]
    [1.0, 2.0, 4.0, 300.0]
    """

    base: timedelta = timedelta(seconds=1)
    factor: float = 2.0
    cap: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.base < timedelta(0) or self.cap < timedelta(0):
            raise ConfigError(f"a backoff's base and cap are never negative: {self!r}")
        if not self.factor >= 1:
            raise ConfigError(f"a backoff's factor must be at least 1, not {self.factor!r}")

    def delay(self, failures: int) -> timedelta:
        """The wait after ``failures`` failed attempts (at least 1)."""
        try:
            seconds = self.base.total_seconds() * self.factor ** max(failures - 1, 0)
        except OverflowError:
            return self.cap
        return min(timedelta(seconds=min(seconds, self.cap.total_seconds())), self.cap)


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What one :meth:`OutboxDrain.drain_once` pass did.

    Attributes:
        claimed: rows leased by the pass.
        sent: rows whose sink returned, marked sent.
        failed: rows whose sink raised, to be tried again.
        dead: rows dead-lettered (out of attempts, or :class:`DeadLetter`).
        reclaimed: claimed rows whose earlier lease had run out (a worker was lost).
        lost: rows whose lease had passed to another worker before the pass marked
            them (a sink that outlived the lease); the other worker's mark stands.
    """

    claimed: int = 0
    sent: int = 0
    failed: int = 0
    dead: int = 0
    reclaimed: int = 0
    lost: int = 0


class DeadLetter(Exception):  # noqa: N818 - names what happens to the row
    """Raised by a sink for a message no retry can handle: the row is dead-lettered at
    once, with this as its ``last_error``."""


# The route.


class OutboxRoute:
    """A :class:`~statifier.router.routes.Route` that inserts one outbox row per send.

    Args:
        adapter: the SQL adapter whose database holds the ``outbox`` table (the
            router's configuration's).
        clock: the time new rows are stamped with (due at once); the wall clock by
            default.
        codec: encodes each row's event (give the configuration's ``storage.codec``,
            and the drain the same).

    Register it with a queue: ``routes={"pickups": (OutboxRoute(adapter), {"queue":
    "pickups"})}``; an optional ``"target"`` in the configuration is copied into each
    row for the sink.
    """

    def __init__(
        self, adapter: SqlAdapter, *, clock: Clock | None = None, codec: BlobCodec = PLAIN
    ) -> None:
        self.adapter = adapter
        self.clock = clock or _wall_clock
        self.codec = codec
        self._sql = OutboxTable(adapter.tables, adapter.dialect)

    async def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None = None,
    ) -> Refused | None:
        """Insert the send's row on ``tx`` (a transaction of its own when ``tx`` is
        ``None``, on a live session), once per ``(queue, key)``; the row carries
        ``scope``, which its sink reads as :attr:`OutboxMessage.scope`.

        Raises:
            ConfigError: the configuration names no queue.
        """
        queue = config.get("queue")
        if not isinstance(queue, str) or not queue:
            raise ConfigError(
                "an OutboxRoute's configuration names its queue, as {'queue': 'pickups'}; "
                f"got {dict(config)!r}"
            )
        target = config.get("target")
        await self.hand_off(
            tx,
            queue,
            key,
            event,
            target=target if isinstance(target, str) else None,
            # At the executor seam the key's scope is the sending execution's id; on a
            # live session it is a session id, which names no execution.
            execution_id=key.scope if tx is not None else None,
            scope=scope,
        )
        return None

    async def hand_off(
        self,
        tx: SqlTransaction | None,
        queue: str,
        key: IdempotencyKey | str,
        event: Event,
        *,
        target: str | None = None,
        execution_id: str | None = None,
        scope: str | None = None,
        now: datetime | None = None,
        bucket: int | None = None,
    ) -> None:
        """Insert the row ``(queue, str(key))`` carrying ``event`` on ``tx``, unless it
        exists (then nothing changes); with ``tx`` ``None``, in a transaction of its
        own. ``now`` (the route's clock by default) is when the row is due.

        The row's bucket is ``bucket`` if given (a writer whose transaction is another
        key's than ``execution_id``), else ``execution_id``'s, else the bucket of
        ``(queue, str(key))``: over several stores, hand a row off to the store that
        holds its bucket, or no drain of the stores' ranges leases it.

        Raises:
            ValueError: ``event`` cannot be stored (see
                :func:`~statifier.core.positions.dump_event`), ``now`` is naive, or
                ``bucket`` is not one of the buckets.
        """
        moment = self.clock() if now is None else _aware(now)
        if bucket is not None:
            one_bucket(bucket)
        elif execution_id is not None:
            bucket = bucket_of(execution_id)
        else:
            bucket = outbox_bucket(queue, str(key))
        payload = {
            # As text: the bytes dump_event wrote, in its key order, which jsonb would
            # not keep (and a form POST built from the event would show).
            "event": sealed_json(self.codec, dump_event(event).decode("utf-8")),
            "key": str(key),
            "sendid": event.sendid,
            "target": target,
            "execution_id": execution_id,
            "scope": scope,
        }
        if tx is None:
            async with self.adapter.transaction() as own:
                await self._insert(own, queue, str(key), payload, bucket, moment)
            return
        await self._insert(tx, queue, str(key), payload, bucket, moment)

    async def _insert(
        self,
        tx: SqlTransaction,
        queue: str,
        key: str,
        payload: Mapping[str, Any],
        bucket: int,
        now: datetime,
    ) -> None:
        await self._sql.insert(
            tx.driver,
            queue=queue,
            key=key,
            payload=json.dumps(payload),
            execution_id=payload["execution_id"],
            bucket=bucket,
            now=now,
        )


# The drain.


@dataclass(frozen=True, slots=True)
class _Claimed:
    """A row the pass leased: what its sink needs, and whether a lease had lapsed."""

    id: Any
    queue: str
    key: str
    payload: Mapping[str, Any]
    attempts: int
    reclaimed: bool


class OutboxDrain:
    """Hands committed outbox rows to their queues' sinks (see the module docstring).

    Args:
        source: the SQL adapter, or a storage over one (a router's
            :attr:`~statifier.router.Router.storage`: its clock unless ``clock`` is
            given, and its codec unless ``codec`` is).
        sinks: ``queue -> sink``; only these queues are drained (none: read only).
        max_attempts: attempts before a row is dead-lettered (at least 1).
        backoff: the wait between attempts.
        lease: how long a claimed row is the claiming worker's. A sink call still
            running when nine tenths of it have passed since the claim is ended (its
            task cancelled) and counts as a failed attempt, ``TimeoutError``; the last
            tenth is for marking the row before another worker may claim it. Give a
            sink's own timeout less than that bound.
        batch: the most rows one pass claims; their sinks run concurrently.
        clock: the time leases, attempts and marks are measured by.
        codec: decodes each row's event (the routes' codec); by default the storage's
            codec, else stored as given.
        buckets: the range of buckets ``(start, end)``, ``end`` excluded, whose rows it
            leases (decision 0122); by default every bucket.

    Raises:
        ConfigError: a sink that is not callable, a bound out of range, a storage that
            is not over a SQL adapter, or ``buckets`` not a non-empty range within
            ``0..BUCKETS``.
    """

    def __init__(
        self,
        source: SqlAdapter | Storage,
        sinks: Mapping[str, Sink],
        *,
        max_attempts: int = 8,
        backoff: Backoff | None = None,
        lease: timedelta | float = timedelta(seconds=60),
        batch: int = 10,
        clock: Clock | None = None,
        codec: BlobCodec | None = None,
        buckets: tuple[int, int] = ALL_BUCKETS,
    ) -> None:
        try:
            self.buckets = bucket_range(buckets)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if isinstance(source, SqlAdapter):
            self.adapter = source
            self.clock = clock or _wall_clock
            self.codec: BlobCodec = codec or PLAIN
        else:
            adapter = source.adapter
            if not isinstance(adapter, SqlAdapter):
                raise ConfigError(f"the outbox lives in a SQL database, not in {adapter!r}")
            self.adapter = adapter
            self.clock = clock or source.clock
            self.codec = codec or source.codec
        for queue, sink in sinks.items():
            if not queue or not callable(sink):
                raise ConfigError(f"a sink is a callable under a queue name: {queue!r}: {sink!r}")
        self.sinks: Mapping[str, Sink] = dict(sinks)
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be a positive integer, not {max_attempts!r}")
        if batch < 1:
            raise ConfigError(f"batch must be a positive integer, not {batch!r}")
        held = lease if isinstance(lease, timedelta) else timedelta(seconds=lease)
        if held <= timedelta(0):
            raise ConfigError(f"lease must be positive, not {lease!r}")
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.lease = held
        self.batch = batch
        self._sql = OutboxTable(self.adapter.tables, self.adapter.dialect)
        self.failure: str | None = None
        """Why :meth:`run`'s last pass failed (the error's type), ``None`` once a pass
        succeeds: what a host's readiness reads."""
        self._repeats = Repeats()
        # A sink call ends before its row's lease runs out, leaving a tenth of the lease
        # to mark the row (and for the workers' clocks to differ) before another
        # worker may claim it.
        self._bound = held.total_seconds() * SINK_SHARE

    async def drain_once(self, now: datetime | None = None) -> DrainReport:
        """One pass: lease up to ``batch`` due rows of the sinks' queues, call their
        sinks concurrently, outside any transaction, and mark each row as its sink
        settles. ``now`` (the clock by default) is the pass's time throughout.

        Raises:
            Exception: from the database. A row whose sink ran but whose mark failed
                stays leased, and is tried again once the lease runs out.
        """
        if not self.sinks:
            return DrainReport()
        started = time.perf_counter()
        moment = self.clock() if now is None else _aware(now)
        # The sinks' calls end by this time on the loop's clock: before the lease does.
        deadline = asyncio.get_running_loop().time() + self._bound
        token = secrets.token_hex(16)
        async with self.adapter.transaction() as tx:
            leased = await self._sql.claim(
                tx.driver,
                sorted(self.sinks),
                now=moment,
                until=moment + self.lease,
                token=token,
                limit=self.batch,
                buckets=self.buckets,
            )
        if not leased:
            return DrainReport()
        claimed = [_claimed(row) for row in leased]
        answers = await asyncio.gather(
            *(self._settle(row, token, now, deadline) for row in claimed),
            return_exceptions=True,
        )
        counts = {"sent": 0, "failed": 0, "dead": 0, "lost": 0}
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            counts[answer] += 1
        drained = DrainReport(
            claimed=len(claimed), reclaimed=sum(row.reclaimed for row in claimed), **counts
        )
        report(
            _TELEMETRY,
            {
                "duration": time.perf_counter() - started,
                "claimed": drained.claimed,
                "sent": drained.sent,
                "failed": drained.failed,
                "dead": drained.dead,
                "reclaimed": drained.reclaimed,
                "lost": drained.lost,
            },
            {"queues": tuple(sorted({row.queue for row in claimed}))},
        )
        return drained

    async def _settle(
        self, row: _Claimed, token: str, now: datetime | None, deadline: float
    ) -> Literal["sent", "failed", "dead", "lost"]:
        """Call the row's sink, until ``deadline`` at most (on the loop's clock), and
        mark the row; returns what became of it."""
        error: str | None = None
        dead = down = False
        try:
            message = _message(row, self.codec, final=row.attempts + 1 >= self.max_attempts)
        except ValueError as unreadable:
            error, dead = f"the payload is unreadable: {unreadable}", True
        else:
            limit = asyncio.timeout_at(deadline)
            try:
                async with limit:
                    await awaited(self.sinks[row.queue](message))
            except DeadLetter as given_up:
                error, dead = error_text(given_up, _ERROR_LIMIT), True
            except asyncio.CancelledError as cancelled:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the drain is being cancelled: the row stays leased
                # Not asked for (the sink awaited what someone else cancelled): the
                # row's failure, as any other.
                error = error_text(cancelled, _ERROR_LIMIT)
            except Exception as failure:  # noqa: BLE001 - a sink's failure is the row's
                error = self._timed_out() if limit.expired() else error_text(failure, _ERROR_LIMIT)
                down = database_down(failure)
        moment = self.clock() if now is None else now
        if error is not None:
            error = storable_text(error)
        async with self.adapter.transaction() as tx:
            if error is None:
                marked = await self._sql.mark_sent(tx.driver, row.id, token, moment)
                if not marked:
                    _lost(row, None)
                return "sent" if marked else "lost"
            # A database that did not answer (a hop's target store stopped) is no
            # fault of the row: not counted toward its dead letter, and tried again
            # after the first wait, not one doubled through the outage.
            failures = row.attempts + (0 if down else 1)
            dead = dead or failures >= self.max_attempts
            next_at = moment + self.backoff.delay(1 if down else failures)
            marked = await self._sql.mark_failed(
                tx.driver,
                row.id,
                token,
                error=error,
                next_at=next_at,
                dead_at=moment if dead else None,
                counted=not down,
            )
        if not marked:
            _lost(row, error)
            return "lost"
        self._failed(row, failures, dead, error, next_at, counted=not down)
        return "dead" if dead else "failed"

    def _timed_out(self) -> str:
        """The ``last_error`` of a sink call that outlived its bound."""
        return (
            f"TimeoutError: the sink call timed out after {self._bound:g} s "
            f"(nine tenths of the {self.lease.total_seconds():g} s lease)"
        )

    def _failed(
        self,
        row: _Claimed,
        failures: int,
        dead: bool,
        error: str,
        next_at: datetime,
        *,
        counted: bool = True,
    ) -> None:
        """Say that a row's sink failed: one telemetry event per row and attempt, and a
        warning, one line per queue, kind of failure (dead-lettered or not) and
        interval, with the count of the others. Only the failure's class is said (its
        message, kept in ``last_error`` for the console, may carry what a sink was
        handed, a URL with a token say). An attempt not ``counted`` (its database did
        not answer) says so."""
        kind = error.split(":", 1)[0]
        execution_id = row.payload.get("execution_id")
        fields = {
            "queue": row.queue,
            "key": row.key,
            "execution_id": execution_id if isinstance(execution_id, str) else None,
            "attempt": failures,
            "attempts": self.max_attempts,
            "dead": dead,
            "counted": counted,
            "error": kind,
        }
        report(_FAILED, {"attempt": float(failures)}, fields)
        if dead:
            self._repeats.log(
                _log,
                logging.WARNING,
                (row.queue, kind, True),
                "outbox row %s of queue %r was dead-lettered after %d attempt%s: %s",
                row.key,
                row.queue,
                failures,
                "" if failures == 1 else "s",
                kind,
                extra=fields,
            )
        elif not counted:
            self._repeats.log(
                _log,
                logging.WARNING,
                (row.queue, kind, False),
                "outbox row %s of queue %r failed: a database did not answer (not counted "
                "among its %d attempts), tried again at %s: %s",
                row.key,
                row.queue,
                self.max_attempts,
                next_at.isoformat(),
                kind,
                extra=fields,
            )
        else:
            self._repeats.log(
                _log,
                logging.WARNING,
                (row.queue, kind, False),
                "outbox row %s of queue %r failed (attempt %d of %d), tried again at %s: %s",
                row.key,
                row.queue,
                failures,
                self.max_attempts,
                next_at.isoformat(),
                kind,
                extra=fields,
            )

    async def run(self, stop: asyncio.Event, idle: float = 0.5) -> None:
        """Drain until ``stop`` is set: pass after pass while passes fill their batch,
        waiting ``idle`` seconds (or for ``stop``) after one that did not. A pass that
        raises (the database went away) sets :attr:`failure` until a pass succeeds and
        is logged at ERROR (one line per kind of error and interval, with a count); the
        next pass comes after ``idle``.
        """
        while not stop.is_set():
            try:
                drained = await self.drain_once()
                self.failure = None
            except Exception as error:  # noqa: BLE001 - a worker outlives a failed pass
                self.failure = type(error).__name__
                self._repeats.log(
                    _log,
                    logging.ERROR,
                    type(error).__name__,
                    "an outbox drain pass failed: %s: %s",
                    type(error).__name__,
                    error,
                    exc_info=worth_a_traceback(error),
                )
                drained = DrainReport()
            if drained.claimed >= self.batch:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), idle)

    async def rows(
        self,
        *,
        queue: str | None = None,
        state: Literal["pending", "sent", "dead"] | None = None,
    ) -> list[OutboxRow]:
        """Outbox rows in id order: every row, or one queue's, or those pending (not
        sent, not dead: leased ones too), sent, or dead."""
        async with self.adapter.transaction() as tx:
            found = [_row(row) for row in await self._sql.rows(tx.driver, queue=queue, state=state)]
        if isinstance(self.codec, PlainBlobs):
            return found
        return [replace(row, payload=_opened(row.payload, self.codec, row.key)) for row in found]

    async def pending(self, queue: str | None = None) -> list[OutboxRow]:
        """The rows neither sent nor dead-lettered, leased ones included."""
        return await self.rows(queue=queue, state="pending")

    async def dead_letters(self, queue: str | None = None) -> list[OutboxRow]:
        """The dead-lettered rows."""
        return await self.rows(queue=queue, state="dead")

    async def retry_dead(
        self,
        key: str | None = None,
        *,
        row_id: int | uuid.UUID | str | None = None,
        execution_id: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Re-arm dead rows: those of the row key ``key`` (in every queue, or
        ``queue``'s), the one row whose id is ``row_id`` (an integer, a UUID or, under
        ``TableOptions(key_type=sa.Text)``, a string), or those the execution
        ``execution_id`` sent. They are due at once with a fresh
        round of attempts; ``last_error`` stays until the next failure. Returns how many
        were re-armed.

        Raises:
            ValueError: not exactly one of ``key``, ``row_id`` and ``execution_id``.
        """
        async with self.adapter.transaction() as tx:
            return await self.retry_dead_in(
                tx, key, row_id=row_id, execution_id=execution_id, queue=queue
            )

    async def retry_dead_in(
        self,
        tx: SqlTransaction,
        key: str | None = None,
        *,
        row_id: int | uuid.UUID | str | None = None,
        execution_id: str | None = None,
        queue: str | None = None,
    ) -> int:
        """:meth:`retry_dead` inside ``tx``, a transaction the caller opened on this
        drain's adapter (``adapter.transaction()``, or a router unit's ``tx``): the rows
        are re-armed when ``tx`` commits, and stay dead if it rolls back. Returns how
        many were re-armed.

        Raises:
            ValueError: not exactly one of ``key``, ``row_id`` and ``execution_id``.
        """
        if sum(which is not None for which in (key, row_id, execution_id)) != 1:
            raise ValueError("retry_dead takes a row key, a row_id or an execution_id, exactly one")
        if key is not None:
            return await self._sql.retry_dead_key(tx.driver, key, queue, self.clock())
        if execution_id is not None:
            return await self._sql.retry_dead_of(tx.driver, execution_id, queue, self.clock())
        return await self._sql.retry_dead_id(tx.driver, row_id, queue, self.clock())


def _lost(row: _Claimed, error: str | None) -> None:
    """Say that a row's lease ran out before its sink's answer was marked: another drain
    holds it now and may call the sink again (a send twice, if the sink sent)."""
    _log.warning(
        "outbox row %s of queue %r: its lease ran out before the sink's answer (%s) was "
        "marked; another drain holds it and may send it again (raise the lease above "
        "the sink's longest call)",
        row.key,
        row.queue,
        "sent" if error is None else f"failed: {error.split(':', 1)[0]}",
    )


def _message(row: _Claimed, codec: BlobCodec, *, final: bool) -> OutboxMessage:
    """What the row's sink is handed.

    Raises:
        ValueError: the row stores no event, or one the codec cannot decode.
    """
    payload = _readable(row, codec)  # under PLAIN: refuses a sealed event, by name

    def text(name: str) -> str | None:
        value = payload.get(name)
        return value if isinstance(value, str) else None

    return OutboxMessage(
        row.queue,
        row.key,
        _event(payload),
        target=text("target"),
        execution_id=text("execution_id"),
        scope=text("scope"),
        sendid=text("sendid"),
        attempts=row.attempts,
        final=final,
    )


def _readable(row: _Claimed, codec: BlobCodec) -> Mapping[str, Any]:
    try:
        return _opened(row.payload, codec, row.key)
    except UndecodableBlob as undecodable:
        raise ValueError(str(undecodable)) from None


def _opened(payload: Mapping[str, Any], codec: BlobCodec, key: str) -> Mapping[str, Any]:
    """``payload`` with its event decoded.

    Raises:
        UndecodableBlob: the codec cannot decode it.
    """
    stored = payload.get("event")
    if not isinstance(stored, str):
        return payload
    event = opened_text(codec, stored, f"the event of outbox row {key!r}")
    return {**payload, "event": event}


def _event(payload: Mapping[str, Any]) -> Event:
    """The event a payload stores.

    Raises:
        ValueError: it stores none.
    """
    try:
        stored = payload["event"]
        text = stored if isinstance(stored, str) else json.dumps(stored)
        return load_event(text.encode("utf-8"))
    except (KeyError, TypeError, ValueError, NotAPosition) as error:
        raise ValueError(f"no stored event ({type(error).__name__})") from None


def storable_text(text: str) -> str:
    """``text`` as a SQL text column takes it: NUL (which PostgreSQL's text refuses) and
    lone surrogates (which UTF-8 cannot encode) replaced by U+FFFD. For an error's
    account, stored (``last_error``) so that the failure is counted, not refused.

    >>> storable_text("answered ok" + chr(0) + "garbage" + chr(0xD800)) == (
    ...     "answered ok\\ufffdgarbage\\ufffd"
    ... )
    True
    """
    return _UNSTORABLE.sub("\ufffd", text)


def _loaded(payload: Any) -> Mapping[str, Any]:
    """A payload as read: PostgreSQL's driver returns ``jsonb`` parsed, SQLite text."""
    value = json.loads(payload) if isinstance(payload, str | bytes) else payload
    return value if isinstance(value, dict) else {}


def _claimed(row: LeasedRow) -> _Claimed:
    return _Claimed(row.id, row.queue, row.key, _loaded(row.payload), row.attempts, row.reclaimed)


def _row(row: StoredRow) -> OutboxRow:
    return OutboxRow(
        row.id,
        queue=row.queue,
        key=row.key,
        payload=_loaded(row.payload),
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        lease=row.lease,
        leased_until=row.leased_until,
        sent_at=row.sent_at,
        dead_at=row.dead_at,
        last_error=row.last_error,
        inserted_at=row.inserted_at,
    )
