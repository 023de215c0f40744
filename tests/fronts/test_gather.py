"""Group commit for the webhook and form fronts, on both databases: concurrent posts
answered 200 once their batch committed, each event delivered once, in fewer
``route_many`` transactions than posts and one at a time; an event that fails alone
fails only its own post (and blocks the later events of its address); a batch whose
transaction fails answers each of its posts 500, logged once; a cancelled caller
leaves the batch to the others; a full batch goes at once; ``close()`` (and the app's
lifespan) routes what waits and leaves no task; the bounds are refused."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from starlette.applications import Starlette
from tests.fronts.http_support import FORM_TYPE, LOADED, SCOPE, client, parcel_chart
from tests.persistence.conftest import postgresql_store, sqlite_store  # noqa: F401 - fixtures
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401 - fixtures

from statifier.fronts.gather import MAX_WINDOW, Gatherer
from statifier.fronts.webhook import body_message_id, form_app, webhook_app
from statifier.router import (
    Binding,
    BlockedByEarlierFailure,
    Failed,
    InboundEvent,
    Planned,
    Routed,
    Router,
    StaticResolver,
    UnresolvedDocument,
    ledger,
)
from statifier.router.routing import delivery_locks

SOURCE = "parcel_scans"
LOST = Binding(
    id="parcels_lost",
    source=SOURCE,
    match="event.kind == 'lost'",
    key="event.parcel",
    document="lost_and_found",
    event="loaded",
)
"""A binding whose document has no chart: its deliveries raise, one event at a time."""
GATHER_TASK = "statifier.fronts.gather"


class CountingRouter(Router):
    """The router, counting its ``route_many`` calls (the message ids of each) and how
    many ran at once; ``gate`` holds each call until it is set."""

    def __init__(self, db: RouterDb, **options: Any) -> None:
        options.setdefault("resolver", StaticResolver({"parcel": parcel_chart()}))
        super().__init__(db.config([LOADED, LOST], **options))
        self.batches: list[list[str]] = []
        self.running = 0
        self.most_at_once = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def route_many(
        self, events: Sequence[InboundEvent | Planned], **options: Any
    ) -> list[Routed | Failed]:
        self.batches.append([_event(e).message_id for e in events])
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.gate.wait()
            return await super().route_many(events, **options)
        finally:
            self.running -= 1


def _event(given: InboundEvent | Planned) -> InboundEvent:
    return given.event if isinstance(given, Planned) else given


@pytest_asyncio.fixture
async def db(router_db: RouterDb) -> RouterDb:  # noqa: F811 - the imported fixture
    """The router's database of each backend."""
    return router_db


def body(parcel: str, kind: str = "loaded", **more: Any) -> bytes:
    return json.dumps({"kind": kind, "parcel": parcel, **more}).encode()


def event(parcel: str, kind: str = "loaded", message_id: str | None = None) -> InboundEvent:
    return InboundEvent(
        scope=SCOPE,
        source=SOURCE,
        message_id=message_id or f"{kind}-{parcel}",
        data={"kind": kind, "parcel": parcel},
    )


def app_of(router: Router, front: str = "webhook", **options: Any) -> Starlette:
    options.setdefault("group_commit", 0.05)
    make = webhook_app if front == "webhook" else form_app
    return make(router, source=SOURCE, scope=SCOPE, **options)


def gather_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == GATHER_TASK]


async def delivered(router: Router) -> dict[str, list[str]]:
    """message id -> the outcomes the ledger filed for it, oldest first."""
    found: dict[str, list[str]] = {}
    for row in await ledger(router):
        found.setdefault(str(row.message_id), []).append(row.outcome)
    return found


# Through the apps.


@pytest.mark.parametrize("front", ["webhook", "form"])
@pytest.mark.asyncio
async def test_concurrent_posts_are_delivered_once_in_fewer_transactions_than_posts(
    db: RouterDb, front: str
) -> None:
    router = CountingRouter(db)
    if front == "webhook":
        contents = [body(f"p{n}") for n in range(40)]
        headers = {"content-type": "application/json"}
    else:
        contents = [urlencode({"kind": "loaded", "parcel": f"p{n}"}).encode() for n in range(40)]
        headers = {"content-type": FORM_TYPE}
    async with client(app_of(router, front)) as http:
        # Each body posted twice at once: the provider's retry racing its first post.
        answers = await asyncio.gather(
            *(http.post("/", content=content, headers=headers) for content in contents * 2)
        )
    assert [answer.status_code for answer in answers] == [200] * 80
    ids = {body_message_id(content) for content in contents}
    assert await delivered(router) == {
        message_id: ["created_and_delivered", "duplicate"] for message_id in ids
    }
    sizes = [len(batch) for batch in router.batches]
    assert sum(sizes) == 80
    assert len(sizes) < 80, sizes
    assert max(sizes) > 1, sizes
    assert router.most_at_once == 1  # one batch routed at a time
    assert gather_tasks() == []


@pytest.mark.asyncio
async def test_a_poisoned_event_fails_only_its_own_post(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "statifier.fronts")
    router = CountingRouter(db)
    fine = [body(f"p{n}") for n in range(6)]
    poisoned = body("p9", kind="lost", note="do-not-log-me")
    async with client(app_of(router, group_commit=0.2)) as http:
        answers = await asyncio.gather(*(http.post("/", content=c) for c in [*fine, poisoned]))
    assert [answer.status_code for answer in answers] == [200] * 6 + [500]
    poisoned_id = body_message_id(poisoned)
    (its_batch,) = [batch for batch in router.batches if poisoned_id in batch]
    assert len(its_batch) > 1  # it shared its transaction with posts answered 200
    outcomes = await delivered(router)
    assert outcomes == {body_message_id(c): ["created_and_delivered"] for c in fine}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["parcel_scans: routing failed with UnresolvedDocument"]
    assert "do-not-log-me" not in caplog.text


@pytest.mark.asyncio
async def test_a_batch_whose_transaction_fails_answers_every_post_500_and_logs_once(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "statifier.fronts")
    router = CountingRouter(db, lock_wait=0.3)
    # Every post is of parcel p1: each batch needs its address's lock (on SQLite, the
    # single writer), which the transaction below holds past the lock wait.
    contents = [body("p1", n=n) for n in range(8)]
    app = app_of(router, group_commit=0.1)
    async with client(app) as http:
        async with router.transaction() as unit:
            await unit.lock(delivery_locks(LOADED.plan, SCOPE, "p1", "any"), None)
            answers = await asyncio.gather(*(http.post("/", content=c) for c in contents))
            # Posted again while the cause lasts: failed again, and not logged again.
            retried = await asyncio.gather(*(http.post("/", content=c) for c in contents))
        assert [answer.status_code for answer in answers + retried] == [500] * 16
        assert await ledger(router) == []  # nothing of a failed batch committed
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        # One line for the cause, however many batches it failed in one interval.
        assert len(router.batches) > 1
        first = len(router.batches[0])
        assert errors == [f"parcel_scans: a group commit of {first} events failed with LockTimeout"]
        # Posted again once the locks are free, every post is routed.
        again = await asyncio.gather(*(http.post("/", content=c) for c in contents))
    assert [answer.status_code for answer in again] == [200] * 8
    outcomes = await delivered(router)
    assert sorted(outcomes) == sorted(body_message_id(c) for c in contents)
    assert all(len(each) == 1 for each in outcomes.values())  # each post routed once
    assert [each[0] for each in outcomes.values()].count("created_and_delivered") == 1


@pytest.mark.asyncio
async def test_the_apps_lifespan_routes_what_waits_and_a_next_start_gathers_afresh(
    db: RouterDb,
) -> None:
    router = CountingRouter(db)
    app = app_of(router, group_commit=MAX_WINDOW)
    async with client(app) as http:
        async with app.router.lifespan_context(app):
            began = time.monotonic()
            posts = [asyncio.create_task(http.post("/", content=body(f"p{n}"))) for n in range(3)]
            await asyncio.sleep(0.1)  # the posts wait in their window
        answers = await asyncio.gather(*posts)
        took = time.monotonic() - began
        assert [answer.status_code for answer in answers] == [200] * 3
        assert took < MAX_WINDOW / 2  # the shutdown did not wait the window out
        assert gather_tasks() == []
        later = await http.post("/", content=body("p7"))
    assert later.status_code == 200
    assert [len(batch) for batch in router.batches] == [3, 1]
    assert len(await delivered(router)) == 4


# The gatherer itself.


@pytest.mark.asyncio
async def test_each_event_gets_its_own_answer_and_a_failed_address_blocks_its_later_events(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "statifier.fronts")
    router = CountingRouter(db)
    gatherer = Gatherer(router, window=0.05)
    events = [
        event("p1"),
        event("p9", "lost", "lost-1"),
        event("p9", "lost", "lost-2"),
        event("p2"),
    ]
    answers = await asyncio.gather(*(gatherer.route(e) for e in events))
    assert [answer.event for answer in answers] == events
    assert isinstance(answers[0], Routed)
    assert isinstance(answers[1], Failed)
    assert isinstance(answers[1].error, UnresolvedDocument)
    assert isinstance(answers[2], Failed)
    assert isinstance(answers[2].error, BlockedByEarlierFailure)
    assert isinstance(answers[3], Routed)
    assert router.batches == [[e.message_id for e in events]]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "parcel_scans: routing failed with UnresolvedDocument",
        "parcel_scans: routing failed with BlockedByEarlierFailure",
    ]
    await gatherer.close()


@pytest.mark.asyncio
async def test_a_full_batch_goes_at_once_and_a_lone_event_waits_its_window(db: RouterDb) -> None:
    router = CountingRouter(db)
    full = Gatherer(router, window=MAX_WINDOW, max_batch=4)
    began = time.monotonic()
    answers = await asyncio.gather(*(full.route(event(f"p{n}")) for n in range(8)))
    assert time.monotonic() - began < MAX_WINDOW / 2
    assert all(isinstance(answer, Routed) for answer in answers)
    assert [len(batch) for batch in router.batches] == [4, 4]
    lone = Gatherer(router, window=0.1)
    began = time.monotonic()
    assert isinstance(await lone.route(event("p8")), Routed)
    assert time.monotonic() - began >= 0.1
    assert [len(batch) for batch in router.batches] == [4, 4, 1]


@pytest.mark.asyncio
async def test_a_caller_cancelled_before_its_batch_is_taken_is_not_routed(db: RouterDb) -> None:
    router = CountingRouter(db)
    gatherer = Gatherer(router, window=0.3)
    waiting = [asyncio.create_task(gatherer.route(event(p))) for p in ("p1", "p2", "p3")]
    await asyncio.sleep(0.05)  # all three in the open batch
    waiting[1].cancel()
    first, third = await waiting[0], await waiting[2]
    assert (isinstance(first, Routed), isinstance(third, Routed)) == (True, True)
    assert waiting[1].cancelled()
    assert router.batches == [["loaded-p1", "loaded-p3"]]
    assert sorted(await delivered(router)) == ["loaded-p1", "loaded-p3"]
    assert gather_tasks() == []


@pytest.mark.asyncio
async def test_a_caller_cancelled_after_its_batch_is_taken_cancels_nothing(db: RouterDb) -> None:
    router = CountingRouter(db)
    router.gate.clear()  # the batch is held in its route_many call
    gatherer = Gatherer(router, window=0.01)
    waiting = [asyncio.create_task(gatherer.route(event(p))) for p in ("p1", "p2", "p3")]
    async with asyncio.timeout(5):
        while not router.batches:  # noqa: ASYNC110 - the batch is taken in the gatherer's task
            await asyncio.sleep(0.01)
    waiting[1].cancel()
    await asyncio.sleep(0.05)
    assert waiting[1].cancelled()
    router.gate.set()
    answers = [await waiting[0], await waiting[2]]
    assert all(isinstance(answer, Routed) for answer in answers)
    # The cancelled caller's event was routed with the others; its answer was dropped.
    assert sorted(await delivered(router)) == ["loaded-p1", "loaded-p2", "loaded-p3"]
    assert gather_tasks() == []


@pytest.mark.asyncio
async def test_close_routes_what_waits_at_once_and_stops(db: RouterDb) -> None:
    router = CountingRouter(db)
    router.gate.clear()  # the first batch is held while the rest gathers
    gatherer = Gatherer(router, window=MAX_WINDOW, max_batch=2)
    waiting = [asyncio.create_task(gatherer.route(event(f"p{n}"))) for n in range(5)]
    await asyncio.sleep(0.05)
    began = time.monotonic()
    closing = asyncio.create_task(gatherer.close())
    router.gate.set()
    await closing
    answers = await asyncio.gather(*waiting)  # answered already: no window waited
    assert time.monotonic() - began < MAX_WINDOW / 2
    assert all(isinstance(answer, Routed) for answer in answers)
    assert [len(batch) for batch in router.batches] == [2, 2, 1]
    assert gather_tasks() == []
    assert len(await delivered(router)) == 5
    with pytest.raises(RuntimeError, match="closed"):
        await gatherer.route(event("p6"))
    await gatherer.close()  # closing again is nothing


@pytest.mark.asyncio
async def test_a_cancelled_close_answers_every_waiting_event_failed(db: RouterDb) -> None:
    router = CountingRouter(db)
    router.gate.clear()  # the first batch never commits
    gatherer = Gatherer(router, window=0.01, max_batch=2)
    waiting = [asyncio.create_task(gatherer.route(event(f"p{n}"))) for n in range(4)]
    async with asyncio.timeout(5):
        while not router.batches:  # noqa: ASYNC110 - the batch is taken in the gatherer's task
            await asyncio.sleep(0.01)
    closing = asyncio.create_task(gatherer.close())
    await asyncio.sleep(0.05)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    answers = await asyncio.gather(*waiting)
    errors = [answer.error for answer in answers if isinstance(answer, Failed)]
    assert len(errors) == 4
    assert all(isinstance(error, asyncio.CancelledError) for error in errors)
    assert gather_tasks() == []
    assert await ledger(router) == []  # the batch's transaction rolled back


# The bounds.


@pytest.mark.asyncio
async def test_bounds_out_of_range_are_refused(db: RouterDb) -> None:
    router = CountingRouter(db)
    windows: list[Any] = [0, -1.0, MAX_WINDOW * 1.5, float("nan"), float("inf"), True, "0.002"]
    for window in windows:
        with pytest.raises(ValueError, match="a group commit window is over 0 and at most 1"):
            Gatherer(router, window=window)
    batches: list[Any] = [0, -3, True, 2.0]
    for max_batch in batches:
        with pytest.raises(ValueError, match="max_batch is an integer of at least 1"):
            Gatherer(router, max_batch=max_batch)
    for front in ("webhook", "form"):
        with pytest.raises(ValueError, match="a group commit window is over 0"):
            app_of(router, front, group_commit=0)
        with pytest.raises(ValueError, match=r"must be shorter than timeout \(0.5 s\)"):
            app_of(router, front, group_commit=0.5, timeout=0.5)
    gatherer = Gatherer(router)
    assert (gatherer.window, gatherer.max_batch) == (0.002, 64)
