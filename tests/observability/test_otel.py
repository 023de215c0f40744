"""The OpenTelemetry bridge on the SDK's in-memory exporter and reader: durable steps and
routed events on both databases, a projection's handler calls as parent spans, the
metrics named after the events, and what never becomes an attribute."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.trace import StatusCode
from tests.observability.conftest import Otel
from tests.router.conftest import RouterDb, impression_bindings

from scriba import Event as ScribaEvent
from scriba import Insert, MemorySource, MemoryTarget, Meta, Projection, Result, RetryPolicy, Scriba
from statifier import telemetry
from statifier.chart import compile_chart
from statifier.core import Event
from statifier.observability.otel import install_otel
from statifier.persistence import Executions, Storage
from statifier.router import InboundEvent

ROWS = sa.Table("observed_rows", sa.MetaData(), sa.Column("id", sa.Text, primary_key=True))
DOOR = compile_chart(
    '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">'
    '<state id="open"><transition event="close" target="closed"/></state>'
    '<final id="closed"/></scxml>'
)
FAST: dict[str, Any] = {
    "batch_timeout": 0.002,
    "commit_backoff": (0.0,),
    "lag_interval": 0,
    "retry": RetryPolicy.never(),
}


def seconds(span: Any) -> float:
    return float(span.end_time - span.start_time) / 1e9


def ad(message_id: str, kind: str, impression_id: str) -> InboundEvent:
    return InboundEvent(
        scope="depot_7",
        source="ad_events",
        message_id=message_id,
        data={"kind": kind, "impression_id": impression_id},
    )


@pytest.mark.asyncio
async def test_a_durable_execution_reports_its_steps_as_spans_and_metrics(
    router_db: RouterDb, otel: Otel
) -> None:
    reported: list[float] = []

    def step(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        reported.append(measurements["duration"])

    telemetry.attach("test-otel-steps", "statifier.persistence.step", step)
    try:
        executions = Executions(Storage(router_db.adapter, clock=router_db.clock))
        await executions.create("door_1", DOOR)
        await executions.step("door_1", DOOR, Event("close"))
    finally:
        telemetry.detach("test-otel-steps")

    steps = otel.spans("statifier.persistence.step")
    assert [dict(span.attributes or {}) for span in steps] == [
        {"execution_id": "door_1", "via": "create", "status": "active"},
        {"execution_id": "door_1", "via": "step", "status": "completed"},
    ]
    # The span is the call the event timed: it ends when reported, ``duration`` long.
    assert [seconds(span) for span in steps] == pytest.approx(reported, abs=1e-6)
    locks = otel.spans("statifier.persistence.lock")
    assert [dict(span.attributes or {}) for span in locks] == [{"execution_id": "door_1"}] * 2
    transitions = [
        (span.attributes or {})["transition"]
        for span in otel.spans("statifier.persistence.lifecycle")
    ]
    assert transitions == ["created", "completed"]
    assert all(seconds(span) == 0 for span in otel.spans("statifier.persistence.lifecycle"))
    operations = {
        (s.attributes or {})["operation"] for s in otel.spans("statifier.persistence.adapter")
    }
    assert operations  # every adapter call is a span of its own
    assert all(span.status.status_code is StatusCode.UNSET for span in otel.spans())

    assert otel.total("statifier.persistence.step", via="create") == 1
    assert otel.total("statifier.persistence.step", via="step", status="completed") == 1
    count, total = otel.recorded("statifier.persistence.step.duration")
    assert count == 2
    assert total == pytest.approx(sum(reported))
    assert otel.recorded("statifier.persistence.step.duration", via="create")[0] == 1
    assert otel.metrics()["statifier.persistence.step.duration"].unit == "s"
    assert otel.total("statifier.persistence.lifecycle", transition="completed") == 1
    # Ids are attributes of spans, never dimensions of metrics.
    for point in otel.points("statifier.persistence.step"):
        assert "execution_id" not in dict(point.attributes)


@pytest.mark.asyncio
async def test_a_routed_event_reports_its_route_and_each_delivery(
    router_db: RouterDb, otel: Otel
) -> None:
    router = router_db.router(impression_bindings(create="never"))
    await router.route(ad("m1", "click", "imp_9"))
    router = router_db.router(impression_bindings())
    await router.route(ad("m2", "impression", "imp_1"))
    await router.route(ad("m3", "click", "imp_1"))

    routes = otel.spans("statifier.router.route")
    assert [dict(span.attributes or {}) for span in routes] == [
        {"scope": "depot_7", "source": "ad_events", "message_id": message_id}
        for message_id in ("m1", "m2", "m3")
    ]
    deliveries = [dict(span.attributes or {}) for span in otel.spans("statifier.router.delivery")]
    assert [(d["binding_id"], d["outcome"], d["message_id"]) for d in deliveries] == [
        ("clicks_to_join", "dropped: no_execution", "m1"),
        ("impressions_to_join", "created_and_delivered", "m2"),
        ("clicks_to_join", "delivered", "m3"),
    ]
    assert deliveries[0].get("execution_id") is None  # None is no attribute
    assert deliveries[1]["execution_id"] == deliveries[2]["execution_id"]
    # The delivery ran inside its route. A start is the report's time less the
    # measured duration (two clocks), so the nesting holds to within a millisecond.
    delivery = otel.spans("statifier.router.delivery")[1]
    route_m2 = routes[1]
    assert delivery.start_time is not None
    assert delivery.end_time is not None
    assert route_m2.start_time is not None
    assert route_m2.end_time is not None
    assert route_m2.start_time - 1_000_000 <= delivery.start_time <= delivery.end_time
    assert delivery.end_time <= route_m2.end_time

    assert otel.total("statifier.router.route") == 3
    assert otel.total("statifier.router.route.no_match") == 3
    assert otel.total("statifier.router.route.dropped_no_execution") == 1
    assert otel.total("statifier.router.route.created_and_delivered") == 1
    assert otel.total("statifier.router.route.delivered") == 1
    assert otel.total("statifier.router.delivery", binding_id="clicks_to_join") == 2
    assert otel.total("statifier.router.delivery", outcome="delivered") == 1
    for point in otel.points("statifier.router.delivery"):
        assert set(dict(point.attributes)) == {"binding_id", "outcome"}
    assert otel.recorded("statifier.router.route.duration")[0] == 3


@pytest.mark.asyncio
async def test_a_handler_call_is_the_parent_of_the_spans_the_handler_makes(
    otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    tracer = otel.tracer_provider.get_tracer("tests.observability")

    class Traced(Projection):
        name = "traced"

        def handle(self, event: ScribaEvent, meta: Meta) -> Result:
            with tracer.start_as_current_span("inside the handler"):
                if event.type == "broken":
                    raise RuntimeError("cannot handle https://bob:hunter2@example.test/x")
                return Insert(ROWS, {"id": event.id})

    source, target = MemorySource(), MemoryTarget()
    source.record("s1", "Happened", {"n": 1})
    source.record("s2", "broken", {"n": 2})
    runtime = Scriba()
    await runtime.start(Traced, source=source, target=target, **FAST)
    async with asyncio.timeout(10):
        await runtime.wait_until_caught_up(Traced)
    await runtime.close()

    calls = otel.spans("scriba.projection.event")
    inside = otel.spans("inside the handler")
    assert len(calls) == 2
    assert len(inside) == 2
    for call, child in zip(calls, inside, strict=True):
        assert child.parent is not None
        assert call.context is not None
        assert child.parent.span_id == call.context.span_id
    ok, broken = sorted(calls, key=lambda span: str((span.attributes or {})["stream_id"]))
    assert dict(ok.attributes or {}) == {
        "name": "traced",
        "version": 1,
        "event_id": "ev-1",
        "position": 1,
        "stream_id": "s1",
        "event_type": "Happened",
        "partition": (ok.attributes or {})["partition"],
        "attempt": 1,
        "result": "insert",
    }
    assert ok.status.status_code is StatusCode.UNSET
    assert broken.status.status_code is StatusCode.ERROR
    assert broken.status.description == "cannot handle https://***@example.test/x"
    assert "stacktrace" not in (broken.attributes or {})
    [exception] = broken.events
    assert dict(exception.attributes or {}) == {
        "exception.type": "RuntimeError",
        "exception.message": "cannot handle https://***@example.test/x",
    }
    assert otel.spans("scriba.projection.dead_letter")[0].status.status_code is StatusCode.ERROR
    assert otel.total("scriba.projection.event.exception", kind="RuntimeError") == 1
    assert otel.total("scriba.projection.event.stop", result="insert", name="traced") == 1
    assert otel.total("scriba.projection.batch.stop.applied") == 1
    assert otel.total("scriba.projection.batch.stop.dead_letters") == 1
    assert "scriba.projection.event.start.monotonic_time" not in otel.metrics()
    # No context left attached or detached out of turn, no handler detached.
    bridge_logs = [r for r in caplog.records if r.name.startswith(("opentelemetry", "statifier"))]
    assert [r.getMessage() for r in bridge_logs if r.levelno >= logging.WARNING] == []


def test_secret_and_payload_named_keys_never_become_attributes(otel: Otel) -> None:
    telemetry.report(
        "statifier.router.timer",
        {"duration": 0.01, "lag": 2.0},
        {
            "execution_id": "ex_1",
            "outcome": "failed",
            "api_token": "t0k",
            "Authorization": "Bearer abc.def",
            "request_body": "{}",
            "data": {"card": "4242"},
            "client_secret": "s",
            "idempotency_key": "k",
            "error": "POST https://svc.test/hook?sig=abc&x=1 answered 500 " + "x" * 400,
        },
    )
    [span] = otel.spans("statifier.router.timer")
    attributes = dict(span.attributes or {})
    assert set(attributes) == {"execution_id", "outcome", "error"}
    error = str(attributes["error"])
    assert error.startswith("POST https://svc.test/hook?sig=***&x=1 answered 500 ")
    assert len(error) == 256
    assert error.endswith("…")
    assert span.status.status_code is StatusCode.ERROR  # it carries an error
    for point in otel.points("statifier.router.timer"):
        assert dict(point.attributes) == {"outcome": "failed"}
    assert otel.recorded("statifier.router.timer.lag") == (1, 2.0)


def test_gauges_read_the_last_value_also_for_a_bridge_installed_again(otel: Otel) -> None:
    identity = {"name": "rows", "version": 1}
    telemetry.report("scriba.projection.lag", {"lag_ms": 250.0, "watermark": 40}, identity)
    telemetry.report("scriba.projection.lag", {"lag_ms": 0.0, "watermark": 50}, identity)
    [lag] = otel.points("scriba.projection.lag.lag_ms")
    [watermark] = otel.points("scriba.projection.lag.watermark")
    assert (lag.value, watermark.value) == (0.0, 50)
    assert dict(lag.attributes) == identity
    assert otel.metrics()["scriba.projection.lag.lag_ms"].unit == "ms"
    otel.bridge.uninstall()
    again = install_otel(otel.tracer_provider, otel.meter_provider)
    try:
        telemetry.report("scriba.projection.lag", {"lag_ms": 75.0, "watermark": 60}, identity)
    finally:
        again.uninstall()
    [lag] = otel.points("scriba.projection.lag.lag_ms")
    assert lag.value == 75.0
    assert otel.total("scriba.projection.lag") == 3


def test_a_call_without_its_stop_ends_as_an_error_when_the_bridge_goes(otel: Otel) -> None:
    # In a context of its own, as a pipeline task cancelled in its handler leaves it.
    contextvars.copy_context().run(
        telemetry.report,
        "scriba.projection.event.start",
        {"monotonic_time": 1.0},
        {"name": "rows", "version": 1, "event_id": "e1", "partition": 0, "attempt": 1},
    )
    assert otel.spans() == []
    otel.bridge.uninstall()
    [span] = otel.spans("scriba.projection.event")
    assert span.status.status_code is StatusCode.ERROR
    assert not otel.bridge.installed
    assert not telemetry.enabled("scriba.projection.event.stop")


def test_a_stop_seen_without_its_start_is_timed_from_its_duration(otel: Otel) -> None:
    telemetry.report(
        "scriba.projection.event.stop",
        {"duration": 0.5},
        {"name": "rows", "version": 1, "event_id": "e1", "partition": 0, "attempt": 1},
    )
    [span] = otel.spans("scriba.projection.event")
    assert seconds(span) == pytest.approx(0.5)


def test_an_unknown_event_name_is_refused_and_nothing_stays_attached() -> None:
    with pytest.raises(ValueError, match="unknown telemetry event"):
        install_otel(events=["statifier.persistence.step", "statifier.persistence.stpe"])
    assert not telemetry.enabled("statifier.persistence.step")


def test_a_bridge_without_the_stops_makes_no_span_it_cannot_end(otel: Otel) -> None:
    otel.bridge.uninstall()
    tracer_provider = otel.tracer_provider
    bridge = install_otel(tracer_provider, events=["scriba.projection.event.start"])
    try:
        telemetry.report(
            "scriba.projection.event.start",
            {"monotonic_time": 1.0},
            {"name": "rows", "version": 1, "event_id": "e1", "partition": 0, "attempt": 1},
        )
        with tracer_provider.get_tracer("tests.observability").start_as_current_span("after"):
            pass
        with pytest.raises(ValueError, match="installed already"):
            bridge.install(["statifier.persistence.step"])
    finally:
        bridge.uninstall()
    [start] = otel.spans("scriba.projection.event.start")
    [after] = otel.spans("after")
    assert seconds(start) == 0
    assert after.parent is None  # nothing was left current


def test_a_halt_is_an_error_without_an_exception_event(otel: Otel) -> None:
    telemetry.report(
        "scriba.projection.halted",
        {},
        {"name": "rows", "version": 1, "kind": "structural", "reason": "no such table"},
    )
    [span] = otel.spans("scriba.projection.halted")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "no such table"
    assert list(span.events) == []


def test_calls_left_open_are_bounded(otel: Otel) -> None:
    for index in range(1025):
        contextvars.copy_context().run(
            telemetry.report,
            "scriba.projection.event.start",
            {"monotonic_time": 1.0},
            {"name": "rows", "version": 1, "event_id": f"e{index}", "partition": 0, "attempt": 1},
        )
    [oldest] = otel.spans("scriba.projection.event")
    assert (oldest.attributes or {})["event_id"] == "e0"
    assert oldest.status.status_code is StatusCode.ERROR
    otel.bridge.uninstall()
    assert len(otel.spans("scriba.projection.event")) == 1025
