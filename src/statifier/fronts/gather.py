"""Group commit for the request fronts: the events of concurrent posts gathered for a
short window and routed together, in one transaction.

A front that answers a post only once its event committed (a webhook, a form post) pays
a commit per post when it routes each alone. A :class:`Gatherer` takes the events of
concurrent posts into one batch and routes it with one
:meth:`~statifier.router.Router.route_many` call: one transaction, one commit, and each
post answered once the batch committed, with its own event's answer.

- A batch is routed when it holds ``max_batch`` events, or ``window`` seconds after its
  first event came, whichever is first.
- One batch is routed at a time: while one commits, the next gathers, and it is routed
  as soon as the one before is done if its window has passed by then. This is where
  the gain is: the posts that come during a commit share the next one.
- Each event is answered as ``route_many`` answers it: :class:`~statifier.router.Routed`,
  or :class:`~statifier.router.Failed` for an event that failed alone (and for a later
  event of its address, :class:`~statifier.router.BlockedByEarlierFailure`). When the
  transaction itself fails, every event of the batch is answered ``Failed`` with its
  error; nothing of the batch committed.
- A caller cancelled while it waits (a request's deadline) cancels nothing of the
  others: before its batch is taken, its event leaves the batch and is not routed;
  after, its event is routed with the others and its answer dropped.

Failures are logged under ``statifier.fronts.gather`` at error level with the error's
type name, never an event's data: one line per event that failed alone, one line for a
batch whose transaction failed.

A gatherer holds nothing of an event loop while idle: its one task runs while events
wait and ends with the last of them. It is used from one event loop at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from statifier.repeats import Repeats
from statifier.router import Failed, InboundEvent, Routed, Router, ShardedRouter

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_WINDOW", "MAX_WINDOW", "Gatherer", "check_window"]

DEFAULT_WINDOW: Final = 0.002
"""The seconds a batch gathers after its first event by default (see
``docs/decisions/0114-group-commit-for-http-fronts.md``)."""
MAX_WINDOW: Final = 1.0
"""The longest window a gatherer takes: a post that comes alone waits its window out
(see the decision record)."""
DEFAULT_MAX_BATCH: Final = 64
"""The most events one batch routes by default."""

_TASK_NAME: Final = "statifier.fronts.gather"
_log = logging.getLogger(__name__)


def check_window(window: object) -> float:
    """``window`` as seconds, if it is a window a gatherer takes: over 0 and at most
    :data:`MAX_WINDOW`.

    Raises:
        ValueError: it is not a number, or out of that range.
    """
    if (
        isinstance(window, bool)
        or not isinstance(window, int | float)
        or not 0 < window <= MAX_WINDOW  # false for NaN, and no float made of a huge int
    ):
        raise ValueError(
            f"a group commit window is over 0 and at most {MAX_WINDOW:g} seconds, not {window!r}"
        )
    return float(window)


@dataclass(eq=False, slots=True)
class _Waiting:
    """An event in a batch, when it came (the loop's clock), and where its answer goes."""

    event: InboundEvent
    came: float
    answer: asyncio.Future[Routed | Failed]


class Gatherer:
    """Routes the events handed to :meth:`route` in batches, one
    :meth:`~statifier.router.Router.route_many` transaction each (see the module
    docstring).

    Args:
        router: the router the batches are routed through.
        window: the seconds a batch gathers after its first event, over 0 and at most
            :data:`MAX_WINDOW`.
        max_batch: the most events of one batch; a full batch is routed at once.

    Raises:
        ValueError: a window out of range, or a ``max_batch`` that is not an integer of
            at least 1.
    """

    def __init__(
        self,
        router: Router | ShardedRouter,
        *,
        window: float = DEFAULT_WINDOW,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        seconds = check_window(window)
        given: object = max_batch
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"max_batch is an integer of at least 1, not {max_batch!r}")
        self.router: Final = router
        self.window: Final = seconds
        self.max_batch: Final = max_batch
        self._open: list[_Waiting] = []
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._failures = Repeats()  # a database that is down fails every batch alike

    async def route(self, event: InboundEvent) -> Routed | Failed:
        """Add ``event`` to the open batch and answer it once its batch committed (or
        failed): :class:`~statifier.router.Routed`, or :class:`~statifier.router.Failed`
        (the post must not be acknowledged).

        Cancelling the call leaves the batch to the others (see the module docstring).

        Raises:
            RuntimeError: the gatherer is closed.
        """
        if self._closed:
            raise RuntimeError("the gatherer is closed: it routes nothing more")
        loop = asyncio.get_running_loop()
        waiting = _Waiting(event, loop.time(), loop.create_future())
        self._open.append(waiting)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(self._wake), name=_TASK_NAME)
        elif len(self._open) >= self.max_batch and self._wake is not None:
            self._wake.set()
        try:
            return await waiting.answer
        except asyncio.CancelledError:  # the caller's alone: the batch goes on without it
            if waiting in self._open:  # not taken yet: it is not routed at all
                self._open.remove(waiting)
            raise

    async def close(self) -> None:
        """Route what waits, without waiting out its window, and stop: a later
        :meth:`route` raises. Returns once every batch is answered and the task ended.

        Cancelling the call cancels the batch being routed and answers its events,
        and every event still waiting, ``Failed`` (logged at ERROR). The batch's
        transaction rolls back, unless its commit was under way: then it may have
        committed, and a provider's retry of such a post is answered as a duplicate.
        """
        self._closed = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self, wake: asyncio.Event) -> None:
        """Route batch after batch while events wait; end with the last of them."""
        batch: list[_Waiting] = []
        try:
            while self._open:
                await self._gathered(wake)
                batch = self._open[: self.max_batch]
                del self._open[: self.max_batch]
                if batch:  # empty when every waiter of the window was cancelled
                    await self._routed(batch)
        except BaseException as stopped:  # cancelled: no waiter is left without an answer
            left = [*batch, *self._open]
            if left:
                _log.error(
                    "a group commit stopped (%s) with %d events unanswered; each is answered "
                    "failed (a batch under way may have committed: a retry is a duplicate)",
                    type(stopped).__name__,
                    len(left),
                )
            for waiting in left:
                _answer(waiting, Failed(waiting.event, stopped))
            self._open.clear()
            raise
        finally:
            self._task = self._wake = None

    async def _gathered(self, wake: asyncio.Event) -> None:
        """Return once the open batch is full, its window has passed since its first
        event came, or the gatherer is closing."""
        wake.clear()
        if len(self._open) >= self.max_batch or self._closed:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(self._open[0].came + self.window):
                await wake.wait()

    async def _routed(self, batch: Sequence[_Waiting]) -> None:
        """Route ``batch`` in one transaction and answer each of its events."""
        events = [waiting.event for waiting in batch]
        try:
            answers = await self.router.route_many(events)
        except Exception as error:  # noqa: BLE001 - the transaction failed: every event's answer
            said = type(error).__name__
            self._failures.log(
                _log,
                logging.ERROR,
                ("batch", said),
                "%s: a group commit of %d events failed with %s",
                _sources(events),
                len(events),
                said,
            )
            for waiting in batch:
                _answer(waiting, Failed(waiting.event, error))
            return
        for waiting, answer in zip(batch, answers, strict=True):
            if isinstance(answer, Failed):
                said = type(answer.error).__name__
                self._failures.log(
                    _log,
                    logging.ERROR,
                    ("routing", said),
                    "%s: routing failed with %s",
                    answer.event.source,
                    said,
                )
            _answer(waiting, answer)


def _answer(waiting: _Waiting, answer: Routed | Failed) -> None:
    if not waiting.answer.done():
        waiting.answer.set_result(answer)


def _sources(events: Sequence[InboundEvent]) -> str:
    return ", ".join(sorted({event.source for event in events}))
