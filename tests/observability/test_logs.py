"""The log bridge: one structured record per telemetry event with the ids as fields,
on both databases; failures at their own level; the JSON formatter under basicConfig
and dictConfig; and what never reaches a record."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from typing import Any

import pytest
from tests.observability.conftest import Kept
from tests.router.conftest import RouterDb, impression_bindings

from statifier import telemetry
from statifier.observability import FieldPolicy, JsonFormatter, install_logging
from statifier.router import InboundEvent

Logged = tuple[logging.Logger, Kept]


def ad(message_id: str, kind: str, impression_id: str) -> InboundEvent:
    return InboundEvent(
        scope="depot_7",
        source="ad_events",
        message_id=message_id,
        data={"kind": kind, "impression_id": impression_id, "note": "inbound-payload-marker"},
    )


def fields(record: logging.LogRecord, *names: str) -> dict[str, Any]:
    return {name: getattr(record, name, None) for name in names}


@pytest.mark.asyncio
async def test_a_routed_event_logs_its_route_deliveries_and_steps_with_their_ids(
    router_db: RouterDb, kept: Logged
) -> None:
    logger, handler = kept
    bridge = install_logging(logger)
    try:
        router = router_db.router(impression_bindings())
        await router.route(ad("m1", "impression", "imp_1"))
        await router.route(ad("m2", "click", "imp_1"))
    finally:
        bridge.uninstall()

    [first, second] = handler.of("statifier.router.route")
    assert fields(first, "scope", "source", "message_id") == {
        "scope": "depot_7",
        "source": "ad_events",
        "message_id": "m1",
    }
    assert second.measurements["delivered"] == 1.0  # type: ignore[attr-defined]
    assert second.levelno == logging.INFO
    deliveries = [
        fields(r, "binding_id", "message_id", "outcome", "scope")
        for r in handler.of("statifier.router.delivery")
    ]
    assert deliveries == [
        {
            "binding_id": "impressions_to_join",
            "message_id": "m1",
            "outcome": "created_and_delivered",
            "scope": "depot_7",
        },
        {
            "binding_id": "clicks_to_join",
            "message_id": "m2",
            "outcome": "delivered",
            "scope": "depot_7",
        },
    ]
    [created, delivered] = handler.of("statifier.router.delivery")
    execution_id = created.execution_id  # type: ignore[attr-defined]
    assert isinstance(execution_id, str)
    assert execution_id
    assert delivered.execution_id == execution_id  # type: ignore[attr-defined]
    steps = handler.of("statifier.persistence.step")
    assert [fields(r, "execution_id", "via", "status") for r in steps] == [
        {"execution_id": execution_id, "via": "create", "status": "active"},
        {"execution_id": execution_id, "via": "step", "status": "active"},
        {"execution_id": execution_id, "via": "step", "status": "completed"},
    ]
    assert (
        steps[0]
        .getMessage()
        .startswith(
            f"statifier.persistence.step execution_id={execution_id} via=create status=active"
            " duration="
        )
    )
    # Nothing of the inbound payload is in any record.
    assert all(
        "inbound-payload-marker" not in json.dumps(vars(r), default=str) for r in handler.records
    )
    assert not telemetry.enabled("statifier.router.route")


def test_a_failure_logs_at_the_failure_level_with_clashing_keys_renamed(kept: Logged) -> None:
    logger, handler = kept
    bridge = install_logging(logger, level=logging.DEBUG, failure_level=logging.ERROR)
    try:
        telemetry.report(
            "scriba.projection.event.exception",
            {"duration": 0.01},
            {
                "name": "rows",
                "version": 1,
                "event_id": "ev-3",
                "kind": "KeyError",
                "reason": "'n'",
                "stacktrace": "Traceback (most recent call last):\n  ...",
            },
        )
        telemetry.report("scriba.projection.paused", {}, {"name": "rows", "version": 1})
    finally:
        bridge.uninstall()
    [failure] = handler.of("scriba.projection.event.exception")
    [paused] = handler.of("scriba.projection.paused")
    assert (failure.levelno, paused.levelno) == (logging.ERROR, logging.DEBUG)
    assert failure.name == "tests.observability.events"  # the logger's, not the projection's
    assert fields(failure, "meta_name", "version", "event_id", "kind") == {
        "meta_name": "rows",
        "version": 1,
        "event_id": "ev-3",
        "kind": "KeyError",
    }
    assert not hasattr(failure, "stacktrace")


def test_a_logger_that_writes_nothing_at_the_level_costs_no_record(kept: Logged) -> None:
    logger, handler = kept
    logger.setLevel(logging.WARNING)
    bridge = install_logging(logger, events=["statifier.persistence.lock"])
    try:
        telemetry.report("statifier.persistence.lock", {"duration": 0.1}, {"execution_id": "e"})
    finally:
        bridge.uninstall()
    assert handler.records == []


def test_secret_named_keys_never_reach_a_record_or_its_json(kept: Logged) -> None:
    logger, handler = kept
    bridge = install_logging(logger)
    try:
        telemetry.report(
            "statifier.persistence.effect_failed",
            {},
            {
                "execution_id": "ex_1",
                "via": "step",
                "error": "ConnectError('https://svc:pw@api.test/v1?api_key=zzz')",
                "session_token": "t0k",
                "x_secret": "s",
                "body": "{}",
                "payload": [1, 2],
                "headers": {"Authorization": "Bearer abc"},
            },
        )
    finally:
        bridge.uninstall()
    [record] = handler.of("statifier.persistence.effect_failed")
    assert record.levelno == logging.WARNING
    line = json.loads(JsonFormatter().format(record))
    for shown in (vars(record), line):
        assert not {"session_token", "x_secret", "body", "payload", "headers"} & set(shown)
    assert line["error"] == "ConnectError('https://***@api.test/v1?api_key=***')"
    assert line["execution_id"] == "ex_1"
    assert "zzz" not in line["message"]
    assert "pw@" not in line["message"]


def test_the_json_formatter_under_basic_config(kept: Logged) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(policy=FieldPolicy(max_text=8)))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    try:
        logging.getLogger("tests.observability.app").info(
            "placed %s", "o1", extra={"order_id": "o1", "password": "p", "note": "x" * 20}
        )
    finally:
        root.removeHandler(handler)
        for old in before:
            root.addHandler(old)
    line = json.loads(stream.getvalue())
    assert list(line)[:4] == ["time", "level", "logger", "message"]
    assert line["time"].endswith("+00:00")
    assert (line["level"], line["logger"], line["message"]) == (
        "INFO",
        "tests.observability.app",
        "placed o1",
    )
    assert line["order_id"] == "o1"
    assert line["note"] == "xxxxxxx…"
    assert "password" not in line


def test_the_json_formatter_under_dict_config(capsys: pytest.CaptureFixture[str]) -> None:
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"json": {"()": "statifier.observability.logs.JsonFormatter"}},
            "handlers": {
                "out": {
                    "class": "logging.StreamHandler",
                    "formatter": "json",
                    "stream": "ext://sys.stdout",
                }
            },
            "loggers": {
                "tests.observability.dict": {
                    "handlers": ["out"],
                    "level": "INFO",
                    "propagate": False,
                }
            },
        }
    )
    logger = logging.getLogger("tests.observability.dict")
    bridge = install_logging(logger, events=["statifier.persistence.lifecycle"])
    try:
        telemetry.report(
            "statifier.persistence.lifecycle",
            {},
            {"execution_id": "ex_1", "transition": "failed", "failure": "boom"},
        )
        try:
            raise RuntimeError("at https://bob:hunter2@db.test/")
        except RuntimeError:
            logger.exception("it broke")
    finally:
        bridge.uninstall()
        for old in list(logger.handlers):
            logger.removeHandler(old)
    [event, broke] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert event["telemetry"] == "statifier.persistence.lifecycle"
    assert (event["execution_id"], event["transition"], event["failure"]) == (
        "ex_1",
        "failed",
        "boom",
    )
    assert event["measurements"] == {}
    assert broke["level"] == "ERROR"
    assert "RuntimeError: at https://***@db.test/" in broke["exception"]
    assert "hunter2" not in json.dumps(broke)


def test_the_services_text_lines_mask_credentials_of_any_logger() -> None:
    from statifier.service import configure_logging
    from statifier.service.settings import LoggingSettings

    stream = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    root.handlers.clear()
    try:
        configure_logging(LoggingSettings(format="text", level="info", events=False), stream)
        logger = logging.getLogger("tests.observability.text")
        logger.warning("cannot reach %s", "postgresql://app:hunter2@db.test/prod")
        try:
            raise RuntimeError("GET /hook?token=s3cret Authorization: Bearer abc.def")
        except RuntimeError:
            logger.exception("it broke")
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    written = stream.getvalue()
    assert "cannot reach postgresql://***@db.test/prod" in written
    assert "RuntimeError" in written
    for secret in ("hunter2", "s3cret", "abc.def"):
        assert secret not in written
