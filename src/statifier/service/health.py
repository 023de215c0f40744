"""The service's health endpoints: ``/healthz`` (liveness) and ``/readyz`` (readiness).

``GET /healthz`` answers ``200 {"status": "ok"}`` whenever the process serves HTTP at
all: a failing liveness check means the process is stuck and should be restarted.

``GET /readyz`` answers ``200 {"status": "ready"}`` when the service can do its work,
else ``503 {"status": "not ready", "reasons": [...]}``, one short reason per failed
check, each ``"<part>: <why>"``:

- ``database: ...``: the database did not answer ``SELECT 1`` within
  ``probe_timeout`` seconds (or answered with an error: its class is named); over
  several stores, ``database (store N): ...`` for each store that did not; and, given
  the place each store must hold (``places``), a store whose record says otherwise
  (:func:`statifier.sql.places.trouble`: ``statifier reshard is moving its buckets``,
  ``statifier reshard moved its buckets away``, ``it holds place 2 of 3, not 1 of 3``),
  which a reshard started while the service runs makes it say; an error is logged
  when a store's reason appears (a failing database's with the error's message, which
  the answer leaves out), and a warning when it clears;
- a worker (``timers``, ``outbox``, ``reapers``): not running, or restarting after
  a failure (its class is named); the outbox (and the hops between stores) while its
  drain passes fail: ``passes failing: <class>`` (a drain outlives a failed pass, so
  it never restarts); the reapers' failed passes are logged, not reported here (they
  keep no event from flowing); with bucket leases, the part ``workers``: its leases
  ran out (``leases not renewed for N s``), its last claim failed, its last release
  of a surplus failed, a range it gives up is still in its pass a ttl after its stop
  while a surplus slice waits for it, a worker of a leased range is in trouble (named
  with its range), or it holds no slice while slices wait
  (:meth:`statifier.service.bucket_leases.LeasedWorkers.trouble`);
- a stream consumer (``source NAME``): not running, restarting after a failure, not
  started yet, or what its source says keeps it from reading:

  - Kafka: ``no broker answers`` (no connection to a broker of the cluster is up, as
    the client's statistics report every second), or ``no partition and not in the
    group for N s`` (the member holds no partition and has not been a steady member
    of its group for 30 s: the coordinator gives every partition to a steady member,
    so only a member that cannot join can leave partitions unread);
  - the inbound-events table and NATS: ``leases not renewed: ...`` /
    ``claims failing: ...`` (the last lease claim failed), ``server unreachable``
    (NATS: the client is not connected), ``acknowledgements failing: ...`` (NATS: the
    last acknowledgement failed), or ``no partition while N wait``: the member
    holds no partition while its last claim found partitions no live member reads
    (free, expired, or leased by a member that missed a renewal: less than a third of
    the ttl left; see :func:`statifier.fronts.leases.waiting`);
  - whatever the source: ``no event done for N s while M wait`` (events were
    fetched and none was done for the consumer's ``stall_after`` seconds:
    :meth:`statifier.fronts.consumer.StreamConsumer.trouble`);
- ``http: not listening yet``, or ``stopping``.

Each check reads what the part knows now, so its result is green again as soon
as the fault clears (the database's within ``probe_interval``, a broker's within a
second). A database answer is kept for ``probe_interval`` seconds, so probes polled
often do not load the database. A reason names the part, never a URL or a secret.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from statifier.persistence.sql import SqlAdapter
from statifier.sql.dialect import ping
from statifier.sql.places import Place, PlaceMismatch, read_place_async, trouble

_log = logging.getLogger(__name__)

__all__ = ["ANSWER_WITHIN", "Health", "answers", "health_routes"]

ANSWER_WITHIN: Final = 2.0
"""Seconds :func:`answers` waits for a store's answer."""


async def answers(adapter: SqlAdapter, within: float = ANSWER_WITHIN) -> bool:
    """Whether the store of ``adapter`` answers ``SELECT 1`` within ``within`` seconds
    (a connection, a transaction, the statement): ``False`` for any failure, never an
    error (a cancellation aside)."""
    try:
        async with asyncio.timeout(within), adapter.transaction(wait=within) as tx:
            await ping(adapter.dialect, tx.driver)
    except Exception:  # noqa: BLE001 - any failure is no answer
        return False
    return True


class Health:
    """What the readiness endpoint checks, kept up to date by the service.

    Args:
        adapters: the database to probe, or every store's (probed concurrently).
        places: the place each store must hold (``None``: not checked).
        probe_timeout: the most seconds the probe waits for the database.
        probe_interval: how long one probe's answer is reused.
        clock: monotonic seconds (``time.monotonic``), for tests.
    """

    def __init__(
        self,
        *adapters: SqlAdapter,
        places: Sequence[Place] | None = None,
        probe_timeout: float = 2.0,
        probe_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not adapters:
            raise ValueError("a health check probes at least one database")
        if places is not None and len(places) != len(adapters):
            raise ValueError(f"{len(places)} places for {len(adapters)} stores")
        self.adapters = adapters
        self.places: Sequence[Place | None] = places or [None] * len(adapters)
        self.probe_timeout = probe_timeout
        self.probe_interval = probe_interval
        self.clock = clock
        self.stopping = False
        self._parts: dict[str, Callable[[], str | None]] = {}
        self._probed: tuple[float, list[str]] | None = None
        self._probing: asyncio.Lock = asyncio.Lock()
        self._misplaced: dict[int, str] = {}
        """The stores whose place was wrong at the last probe, and why."""
        self._unanswered: dict[int, str] = {}
        """The stores whose database failed the last probe, and how."""

    def watch(self, part: str, check: Callable[[], str | None]) -> None:
        """Check ``part`` on every readiness probe: ``check`` returns ``None`` when it
        is fine, else why not (one short phrase)."""
        self._parts[part] = check

    async def reasons(self) -> list[str]:
        """Why the service is not ready (empty: it is)."""
        found: list[str] = ["stopping"] if self.stopping else []
        found.extend(await self._databases())
        for part, check in self._parts.items():
            said = check()
            if said is not None:
                found.append(f"{part}: {said}")
        return found

    async def _databases(self) -> list[str]:
        async with self._probing:
            now = self.clock()
            if self._probed is not None and now - self._probed[0] < self.probe_interval:
                return self._probed[1]
            answers = await asyncio.gather(
                *(
                    self._probe(number, adapter, place)
                    for number, (adapter, place) in enumerate(
                        zip(self.adapters, self.places, strict=True)
                    )
                )
            )
            several = len(self.adapters) > 1
            found = [
                f"database (store {number}): {answer}" if several else f"database: {answer}"
                for number, answer in enumerate(answers)
                if answer is not None
            ]
            self._probed = (self.clock(), found)
            return found

    async def _probe(self, number: int, adapter: SqlAdapter, place: Place | None) -> str | None:
        try:
            found = await asyncio.wait_for(self._read(adapter, place), self.probe_timeout)
        except TimeoutError:
            return self._unanswering(number, f"no answer within {self.probe_timeout:g} seconds")
        except PlaceMismatch as error:
            found = str(error)
        except Exception as error:  # noqa: BLE001 - any failure means not ready
            # The answer names the class only: a driver's message may name the host
            # and the user, and /readyz is read by more than the operators.
            said = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            return self._unanswering(number, f"{type(error).__name__}", said)
        self._answering(number)
        if place is not None:
            self._say(place, found)
        return found

    def _unanswering(self, number: int, reason: str, said: str | None = None) -> str:
        """Log a store's database failing its probe when it starts to (or fails
        otherwise); ``reason`` is the readiness answer, ``said`` the log's."""
        if self._unanswered.get(number) != reason:
            self._unanswered[number] = reason
            _log.error(
                "store %d: the database fails the readiness probe: %s; the service is not "
                "ready until it answers",
                number,
                said or reason,
                extra={"store": number},
            )
        return reason

    def _answering(self, number: int) -> None:
        """Log a store's database answering again after it failed."""
        if self._unanswered.pop(number, None) is not None:
            _log.warning("store %d: the database answers again", number, extra={"store": number})

    async def _read(self, adapter: SqlAdapter, place: Place | None) -> str | None:
        """Ping the store; given its ``place``, read its record: why it is not that
        store (``None``: it is)."""
        async with adapter.transaction(wait=self.probe_timeout) as tx:
            if place is None:
                await ping(adapter.dialect, tx.driver)
                return None
            recorded = await read_place_async(adapter.dialect, tx.driver, adapter.tables.options)
        return trouble(recorded, place)

    def _say(self, place: Place, found: str | None) -> None:
        """Log a store's place trouble when it appears and when it clears."""
        number = place.place or 0
        before = self._misplaced.get(number)
        if found == before:
            return
        if found is None:
            del self._misplaced[number]
            _log.warning("store %d holds its place again", number, extra={"store": number})
            return
        self._misplaced[number] = found
        _log.error(
            "store %d is not the store this service was started on: %s; the service is "
            "not ready until it is",
            number,
            found,
            extra={"store": number},
        )


def health_routes(health: Health) -> list[Route]:
    """The Starlette routes of ``/healthz`` and ``/readyz`` over ``health``."""

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> JSONResponse:
        reasons = await health.reasons()
        if reasons:
            body: Mapping[str, object] = {"status": "not ready", "reasons": reasons}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready"})

    return [
        Route("/healthz", live, methods=["GET"]),
        Route("/readyz", ready, methods=["GET"]),
    ]
