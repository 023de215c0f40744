"""Errors of routed steps on both databases: recorded and counted whatever the policy,
the policy chosen by the binding, the document or the configuration, and an event whose
transition was taken never filed as unused, even when a send of that step was refused."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from tests.router.conftest import RouterDb

from statifier.chart import Machine, compile_chart
from statifier.persistence import OnError, Status
from statifier.router import (
    Binding,
    ConfigError,
    CreatedAndDelivered,
    Dropped,
    DropReason,
    InboundEvent,
    StaticResolver,
    ledger,
)
from statifier.router.errors import BindingError
from statifier.router.timer_worker import TimerWorker

SCXML = 'xmlns="http://www.w3.org/2005/07/scxml"'

ORDER = f"""<scxml {SCXML} initial="placed" datamodel="predicator">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paying">
      <assign location="amount" expr="_event.data.amount * 2"/>
      <send event="payment.timeout" delay="15s"/>
    </transition>
  </state>
  <state id="paying">
    <transition event="payment.timeout" target="expired"/>
  </state>
  <final id="expired"/>
</scxml>"""

# Takes "go", and on the way sends to a route the configuration does not know: the
# refusal comes back as error.communication after the event's own macrostep.
REFUSED = f"""<scxml {SCXML} initial="a" datamodel="predicator">
  <state id="a"><transition event="go" target="b">
    <send type="app:route" event="out" target="nowhere"/></transition></state>
  <state id="b"/>
</scxml>"""


def _binding(document: str = "order", **fields: Any) -> Binding:
    return Binding(
        **{
            "id": f"{document}_events",
            "source": "shop",
            "match": "true",
            "key": "event.order",
            "document": document,
            "event": "pay",
            "data": ("amount",),
            **fields,
        }
    )


def _pay(message_id: str, order: str = "o-1", amount: object = "12") -> InboundEvent:
    return InboundEvent(
        scope="shop_a",
        source="shop",
        message_id=message_id,
        data={"order": order, "amount": amount},
    )


@pytest.mark.asyncio
async def test_a_routed_error_is_recorded_and_the_execution_keeps_running(
    router_db: RouterDb,
) -> None:
    router = router_db.router(
        [_binding()], resolver=StaticResolver({"order": compile_chart(ORDER)})
    )
    routed = await router.route(_pay("m1"))
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    record = await router.storage.fetch_execution(outcome.execution_id)
    assert record.status is Status.ACTIVE
    assert record.error_count == 1
    (stored,) = await router.storage.errors(outcome.execution_id)
    assert (stored.name, stored.via, stored.taken) == ("error.execution", "step", False)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("binding", "options", "status"),
    [
        ({}, {"on_error": "fail"}, Status.FAILED),
        ({}, {"document_on_error": {"order": OnError.FAIL}}, Status.FAILED),
        ({"on_error": "fail"}, {}, Status.FAILED),
        # The binding's word wins over the configuration's.
        ({"on_error": "continue"}, {"on_error": "fail"}, Status.ACTIVE),
        ({}, {"document_on_error": {"other": "fail"}}, Status.ACTIVE),
    ],
)
async def test_the_policy_comes_from_the_binding_the_document_or_the_configuration(
    router_db: RouterDb, binding: dict[str, Any], options: dict[str, Any], status: Status
) -> None:
    charts: dict[str | tuple[str, str], Machine] = {
        "order": compile_chart(ORDER),
        "other": compile_chart(REFUSED),
    }
    router = router_db.router([_binding(**binding)], resolver=StaticResolver(charts), **options)
    routed = await router.route(_pay("m1"))
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    record = await router.storage.fetch_execution(outcome.execution_id)
    assert record.status is status
    assert record.error_count == 1
    if status is Status.FAILED:
        assert record.failure is not None
        assert record.failure.startswith("unhandled error.execution at <assign>")


def test_a_policy_that_is_not_one_is_refused(router_db: RouterDb) -> None:
    resolver = StaticResolver({"order": compile_chart(ORDER)})
    with pytest.raises(ConfigError, match="on_error is 'continue' or 'fail'"):
        router_db.router([_binding()], resolver=resolver, on_error="sometimes")
    with pytest.raises(ConfigError, match="names 'ghost', which has no chart"):
        router_db.router([_binding()], resolver=resolver, document_on_error={"ghost": "fail"})
    with pytest.raises(BindingError, match="on_error"):
        _binding(on_error="explode")
    assert (
        Binding.from_mapping(
            {
                "id": "b",
                "source": "s",
                "match": "true",
                "key": "event.k",
                "document": "d",
                "event": "e",
                "on_error": "fail",
            }
        ).on_error
        is OnError.FAIL
    )


@pytest.mark.asyncio
async def test_an_event_taken_by_a_step_whose_send_was_refused_is_delivered(
    router_db: RouterDb,
) -> None:
    router = router_db.router(
        [_binding("refused", event="go")],
        resolver=StaticResolver({"refused": compile_chart(REFUSED)}),
        send_type="app:route",
    )
    created = await router.route(_pay("m1"))
    (first,) = created.outcomes
    assert isinstance(first, CreatedAndDelivered)
    again = await router.route(_pay("m2"))
    (second,) = again.outcomes
    # b takes no "go": that one is unused.
    assert isinstance(second, Dropped)
    assert second.reason is DropReason.UNMATCHED_EVENT
    record = await router.storage.fetch_execution(first.execution_id)
    assert record.error_count == 1  # the refusal's error.communication
    rows = await ledger(router, first.execution_id)
    assert [(row.outcome, row.reason) for row in rows if row.binding_id != "route"] == [
        ("created_and_delivered", None),
        ("dropped", "unmatched_event"),
    ]


# A chart whose step sends to itself: what only a timer worker delivers.
SELF_SEND = f"""<scxml {SCXML} initial="a" datamodel="predicator">
  <state id="a"><transition event="pay" target="b"><send event="next"/></transition></state>
  <state id="b"><transition event="next" target="c"/></state>
  <final id="c"/>
</scxml>"""


@pytest.mark.asyncio
async def test_route_says_when_no_timer_worker_runs_to_fire_what_it_scheduled(
    router_db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    resolver = StaticResolver({"order": compile_chart(SELF_SEND)})
    router = router_db.router([_binding()], resolver=resolver)
    with caplog.at_level(logging.WARNING, logger="statifier.router.routing"):
        routed = await router.route(_pay("m1"))
    (notice,) = routed.notices
    assert notice.startswith("1 timer scheduled, and no timer worker runs in this process")
    assert [r.getMessage() for r in caplog.records if r.name == "statifier.router.routing"] == [
        notice
    ]
    # While a worker runs here it is woken instead, and nothing is said.
    worker = TimerWorker(router, poll=0.05)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.sleep(0.05)
        quiet = await router.route(_pay("m2", order="o-2"))
        assert quiet.notices == ()
    finally:
        stop.set()
        await running
    # Nor when the configuration says a worker runs elsewhere.
    elsewhere = router_db.router([_binding()], resolver=resolver, timers_elsewhere=True)
    assert (await elsewhere.route(_pay("m3", order="o-3"))).notices == ()
    # A routing that schedules nothing says nothing either.
    quiet_chart = compile_chart(
        f'<scxml {SCXML} initial="a"><state id="a"><transition event="pay"/></state></scxml>'
    )
    plain = router_db.router([_binding()], resolver=StaticResolver({"order": quiet_chart}))
    assert (await plain.route(_pay("m4", order="o-4"))).notices == ()


TOTAL = f"""<scxml {SCXML} initial="open" datamodel="predicator">
  <datamodel><data id="total" expr="0"/></datamodel>
  <state id="open">
    <transition event="pay"><assign location="total" expr="_event.data.amount * 2"/></transition>
  </state>
</scxml>"""
"""Takes every payment where it is; one whose amount is not a number raises
error.execution at the ``<assign>``."""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("binding", "options", "status"),
    [
        ({"on_error": "fail"}, {}, Status.FAILED),
        ({"on_error": "continue"}, {"on_error": "fail"}, Status.ACTIVE),
    ],
)
async def test_an_event_held_while_paused_is_stepped_on_resume_under_its_bindings_policy(
    router_db: RouterDb, binding: dict[str, Any], options: dict[str, Any], status: Status
) -> None:
    router = router_db.router(
        [_binding(**binding)], resolver=StaticResolver({"order": compile_chart(TOTAL)}), **options
    )
    (created,) = (await router.route(_pay("m1", amount=5))).outcomes
    assert isinstance(created, CreatedAndDelivered)
    execution_id = created.execution_id
    assert await router.pause(execution_id)
    (held,) = (await router.route(_pay("m2", amount="five"))).outcomes
    assert held.outcome == "held"
    resumed = await router.resume(execution_id)
    assert resumed is not None
    assert resumed.stepped == 1
    record = await router.storage.fetch_execution(execution_id)
    assert (record.status, record.error_count) == (status, 1)
