"""The timeline's ties of rows to steps, on SQLite and PostgreSQL, against what the router
itself writes: the replay's send keys name the timer and outbox rows a step made, its
errors name their step, and a send whose timer is gone is followed through the log
(fired, cancelled, or gone); plus the bounds of a step's data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from tests.console.conftest import ASSIGN_AT, CHECKOUT, RECEIPT, shop_bindings
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)

from statifier.chart import compile_chart
from statifier.console.queries import ConsoleQueries, ExecutionDetail, StepRows
from statifier.console.replay import ReplayStep, StepSend, replay, stored_options
from statifier.console.timeline import (
    MAX_DATA_CHARS,
    PREVIEW_CHARS,
    SendFate,
    error_steps,
    fates,
    made_by,
    send_keys,
    timeline,
)
from statifier.core import Event
from statifier.persistence import LoggedInput
from statifier.router import InboundEvent, OutboxRoute, Router, StaticResolver, TimerWorker
from statifier.sql import migrations


@dataclass
class Shop:
    """The checkout chart routed on one backend, with a receipts route and timers."""

    db: RouterDb
    router: Router
    queries: ConsoleQueries

    async def send(self, kind: str, order: str, **data: Any) -> str:
        event = InboundEvent(
            scope="web",
            source="shop",
            message_id=f"{kind}-{order}-{len(data)}-{sorted(data.items())}",
            data={"kind": kind, "order": order, **data},
        )
        routed = await self.router.route(event)
        (execution_id,) = {getattr(o, "execution_id", None) for o in routed.outcomes} - {None}
        assert isinstance(execution_id, str), routed
        return execution_id

    async def seen(self, execution_id: str) -> tuple[ExecutionDetail, list[ReplayStep]]:
        detail = await self.queries.execution(execution_id)
        assert detail is not None
        storage = self.router.storage
        machine = await storage.machine(detail.record.content_hash)
        options = stored_options(storage.load(detail.record, machine))
        return detail, replay(machine, detail.inputs, execution_id=execution_id, options=options)

    async def fates(self, execution_id: str) -> tuple[list[ReplayStep], dict[str, SendFate]]:
        _, steps = await self.seen(execution_id)
        keys = send_keys(steps, steps)
        rows = await self.queries.step_rows(execution_id, keys)
        return steps, fates(steps, rows, keys)


@pytest.fixture
def shop(router_db: RouterDb) -> Shop:  # noqa: F811 - the fixture
    machine = compile_chart(CHECKOUT.format(receipt=RECEIPT), name="order")
    adapter = router_db.adapter
    router = router_db.router(
        shop_bindings(),
        resolver=StaticResolver({"order": machine}),
        send_type="shop:route",
        routes={"receipts": (OutboxRoute(adapter, clock=router_db.clock), {"queue": "receipts"})},
    )
    return Shop(router_db, router, ConsoleQueries(adapter.engine, adapter.tables))


def _sends(steps: Sequence[ReplayStep], found: dict[str, SendFate]) -> list[list[tuple[str, ...]]]:
    return [[(s.event, found[s.key].kind, found[s.key].status) for s in st.sends] for st in steps]


@pytest.mark.asyncio
async def test_an_error_stops_the_transition_and_names_its_step(shop: Shop) -> None:
    execution_id = await shop.send("checkout", "o-1", amount="two", timeout="15s")
    detail, steps = await shop.seen(execution_id)
    assert detail.record.error_count == 1
    (view,) = detail.errors
    error = view.error
    assert (error.name, error.element, (error.line, error.column)) == (
        "error.execution",
        "assign",
        ASSIGN_AT,
    )
    assert error.message is not None
    assert "expects numbers" in error.message
    assert not error.taken
    assert view.unreadable is None
    assert error_steps(steps, detail.errors) == {view.id: 1}
    assert [s.configuration for s in steps] == [("placed",), ("awaiting_payment",)]
    # The rest of the transition never ran: no timer, no receipt, in the log or the rows.
    assert steps[1].handed == ()
    assert detail.timers == ()
    assert detail.outbox == ()


@pytest.mark.asyncio
async def test_send_keys_are_the_rows_the_router_wrote(shop: Shop) -> None:
    execution_id = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    detail, steps = await shop.seen(execution_id)
    timeout, receipt = steps[1].sends
    assert (timeout.send_id, timeout.delay_ms, timeout.to_self) == (
        "payment_timeout",
        3_600_000,
        True,
    )
    assert (receipt.target, receipt.delay_ms, receipt.to_self) == ("receipts", None, False)
    (timer,) = detail.timers
    assert timer.key == timeout.key  # the row's dedup_key
    assert timer.event == "payment.timeout"
    (row,) = detail.outbox
    assert row.key == receipt.key
    assert made_by(steps) == {timeout.key: 1, receipt.key: 1}
    found = fates(
        steps,
        await shop.queries.step_rows(execution_id, [timeout.key, receipt.key]),
        [timeout.key, receipt.key],
    )
    assert found[timeout.key].status == "pending"
    assert found[timeout.key].timer == timer
    assert (found[receipt.key].kind, found[receipt.key].status) == ("outbox", "pending")
    # The detail's own rows answer the same, while its lists are not at their bound.
    keys = [timeout.key, receipt.key]
    assert detail.step_rows(keys) == await shop.queries.step_rows(execution_id, keys)
    # Only keys looked up are known; another execution's timer is never matched.
    assert (await shop.queries.step_rows("someone-else", [timeout.key])).timers == {}
    unknown = fates(steps, await shop.queries.step_rows(execution_id, []), [])
    assert {f.kind for f in unknown.values()} == {"unknown"}


@pytest.mark.asyncio
async def test_a_paid_order_cancelled_its_timeout_and_an_expired_one_fired_it(shop: Shop) -> None:
    paid = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    await shop.send("pay", "o-1")
    expired = await shop.send("checkout", "o-2", amount=5, timeout="1s")
    shop.db.clock.advance(timedelta(seconds=2))
    assert await TimerWorker(shop.router).fire_due() == 1

    steps, found = await shop.fates(paid)
    assert [s.final_state for s in steps] == [None, None, "paid"]
    assert _sends(steps, found) == [
        [],
        [("payment.timeout", "timer", "cancelled"), ("order.placed", "outbox", "pending")],
        [],
    ]
    assert found[steps[1].sends[0].key].describe() == "cancelled at step 2"

    steps, found = await shop.fates(expired)
    assert [(s.via, s.final_state) for s in steps] == [
        ("create", None),
        ("step", None),
        ("timer", "expired"),
    ]
    timeout = steps[1].sends[0]
    assert (found[timeout.key].status, found[timeout.key].step) == ("fired", 2)
    assert found[timeout.key].describe() == "fired at step 2"


@pytest.mark.asyncio
async def test_a_timer_deleted_with_no_step_taking_it_is_gone(shop: Shop) -> None:
    execution_id = await shop.send("checkout", "o-1", amount=5, timeout="1h")
    _delete(shop, shop.db.store.tables.timers)  # as if fired with no step, or deleted
    steps, found = await shop.fates(execution_id)
    timeout = steps[1].sends[0]
    assert found[timeout.key].status == "gone"
    assert "no logged step took it" in found[timeout.key].describe()


@pytest.mark.asyncio
async def test_a_refused_send_is_named_by_its_ledger_row(shop: Shop) -> None:
    unrouted = compile_chart(
        CHECKOUT.format(receipt='\n<send type="shop:route" target="nowhere" event="lost"/>'),
        name="order",
    )
    router = shop.db.router(
        shop_bindings(), resolver=StaticResolver({"order": unrouted}), send_type="shop:route"
    )
    routed = await router.route(
        InboundEvent(
            scope="web",
            source="shop",
            message_id="m-1",
            data={"kind": "checkout", "order": "o-9", "amount": 1, "timeout": "1h"},
        ),
    )
    execution_id = getattr(routed.outcomes[0], "execution_id", None)
    assert isinstance(execution_id, str)
    steps, found = await shop.fates(execution_id)
    lost = steps[1].sends[1]
    assert (found[lost.key].kind, found[lost.key].status) == ("refused", "refused")
    assert "no route named 'nowhere'" in found[lost.key].describe()
    detail, _ = await shop.seen(execution_id)
    (view,) = detail.errors  # the refusal the chart heard
    assert view.error.name == "error.communication"
    assert error_steps(steps, detail.errors) == {view.id: 1}


def _delete(shop: Shop, table: sa.Table) -> None:
    engine = sa.create_engine(migrations.sync_url(shop.db.store.url))
    try:
        with engine.begin() as connection:
            connection.execute(table.delete())
    finally:
        engine.dispose()


def _step(index: int, data: Any) -> tuple[ReplayStep, bool]:
    return ReplayStep(index, "step", "e", data, ("a",), {}), False


def test_a_steps_data_is_previewed_bounded_and_whole_only_for_the_step_picked() -> None:
    short = {"note": "<b>hi</b>"}
    long = {"text": "x" * (MAX_DATA_CHARS * 2)}
    listed = [_step(1, short), _step(2, long), _step(3, long)]
    shown = timeline(listed, selected=3, errors={}, fates={})
    assert (shown[0].preview, shown[0].more, shown[0].data) == (
        '{"note": "<b>hi</b>"}',
        False,
        None,
    )
    assert shown[1].more  # a "more" link, not the data
    assert shown[1].data is None
    assert shown[1].preview is not None
    assert len(shown[1].preview) == PREVIEW_CHARS
    assert shown[2].data is not None
    assert shown[2].data.endswith("more characters not shown)")
    assert len(shown[2].data) < MAX_DATA_CHARS + 100


def test_an_event_without_data_shows_none_and_an_unknown_send_says_so() -> None:
    step = ReplayStep(
        1,
        "step",
        "go",
        Event("go").data,
        ("a",),
        {},
        handed=(
            StepSend(
                "s1",
                event="x",
                type=None,
                target=None,
                delay_ms=None,
                author_id=False,
                key="k",
                to_self=True,
            ),
        ),
    )
    (shown,) = timeline([(step, False)], selected=None, errors={}, fates={})
    assert shown.preview is None
    (fate,) = shown.sends
    assert fate.describe() == "not looked up (too many sends on this page)"


def test_a_timer_step_that_carries_the_sends_id_fired_it() -> None:
    machine = compile_chart(CHECKOUT.format(receipt=""))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    log = [
        LoggedInput(0, "step", Event("checkout", data={"amount": 1, "timeout": "1s"}), now),
        LoggedInput(1, "timer", Event("payment.timeout", sendid="payment_timeout"), now),
    ]
    steps = replay(machine, log, execution_id="ex_1")
    assert steps[2].event_sendid == "payment_timeout"
    keys = send_keys(steps, steps)
    found = fates(steps, StepRows({}, {}, {}), keys)
    assert found[steps[1].sends[0].key].status == "fired"
    # A timer event of another send id fired nothing of this one.
    other = [log[0], LoggedInput(1, "timer", Event("payment.timeout", sendid="other"), now)]
    steps = replay(machine, other, execution_id="ex_1")
    found = fates(steps, StepRows({}, {}, {}), send_keys(steps, steps))
    assert found[steps[1].sends[0].key].status == "gone"
