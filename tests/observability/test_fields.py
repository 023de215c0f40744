"""The field policy both bridges read metadata through: denied keys, bounded and
scrubbed values; and every event of the catalog passing through both bridges."""

from __future__ import annotations

import logging

import pytest
from tests.observability.conftest import Kept, Otel

from statifier import telemetry
from statifier.observability import FieldPolicy, install_logging
from statifier.observability.fields import FAILURES, failed


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "api_token",
        "client_secret",
        "Password",
        "credentials",
        "Authorization",
        "cookie",
        "idempotency_key",
        "signature",
        "private_note",
        "body",
        "data",
        "payload",
        "headers",
        "stacktrace",
    ],
)
def test_a_secret_or_payload_named_key_is_denied(key: str) -> None:
    assert not FieldPolicy().allows(key)
    assert FieldPolicy().attributes({key: "x", "execution_id": "ex_1"}) == {"execution_id": "ex_1"}


@pytest.mark.parametrize(
    "key",
    [
        "execution_id",
        "binding_id",
        "message_id",
        "scope",
        "source",
        "outcome",
        "error",
        "reason",
        "name",
        "version",
        "partition",
        "queues",
        "session_id",
    ],
)
def test_the_librarys_own_keys_pass(key: str) -> None:
    assert FieldPolicy().allows(key)


def test_values_are_bounded_and_only_flat() -> None:
    policy = FieldPolicy(max_text=10, max_items=3)
    shown = policy.attributes(
        {
            "long": "abcdefghijklmnop",
            "queues": ("a", "b", "c", "d"),
            "positions": {0: 12},
            "mixed": [1, "two", 3.0],
            "ints": [1, 2],
            "nothing": None,
            "flag": True,
            "raw": b"\x00",
            "status": _Status(),
        }
    )
    assert shown == {
        "long": "abcdefghi…",
        "queues": ("a", "b", "c"),
        "mixed": ("1", "two", "3.0"),
        "ints": (1, 2),
        "flag": True,
        "status": "active",
    }


class _Status:
    def __str__(self) -> str:
        return "active"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://bob:pw@h.test/p", "https://***@h.test/p"),
        ("https://h.test/p?access_token=abc&page=2", "https://h.test/p?access_token=***&page=2"),
        ("GET /x?api_key=k1;sig=s1", "GET /x?api_key=***;sig=***"),
        ("Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer ***"),
        ("plain words stay", "plain words stay"),
    ],
)
def test_text_is_scrubbed_of_credentials(text: str, shown: str) -> None:
    assert FieldPolicy().text(text) == shown


def test_json_values_keep_mappings_within_bounds() -> None:
    policy = FieldPolicy(max_items=2)
    nested: object = {"a": {"b": {"c": {"d": {"e": 1}}}}}
    assert policy.jsonable(nested) == {"a": {"b": {"c": {"d": "<nested too deep>"}}}}
    assert policy.jsonable({"x": 1, "user_token": 2, "y": 3, "z": 4}) == {"x": 1, "y": 3}
    assert policy.jsonable([float("nan"), b"abc", (1, 2, 3)]) == ["nan", "<3 bytes>"]
    assert policy.jsonable({"n": (1, 2, 3)}) == {"n": [1, 2]}


def test_bounds_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FieldPolicy(max_text=0)


def test_failures_are_catalog_events_or_carry_an_error() -> None:
    assert set(FAILURES) <= set(telemetry.EVENTS)
    assert failed("statifier.router.timer", {"outcome": "failed", "error": "Boom"})
    assert not failed("statifier.router.timer", {"outcome": "fired", "error": None})
    assert failed("statifier.persistence.error", {"error": "error.execution"})
    assert failed("statifier.fronts.request", {"status": 400, "refusal": "json"})
    assert not failed("statifier.fronts.request", {"status": 200, "refusal": None})


def test_every_catalog_event_passes_both_bridges(
    otel: Otel, kept: tuple[logging.Logger, Kept]
) -> None:
    logger, handler = kept
    bridge = install_logging(logger)
    try:
        for name in telemetry.EVENTS:
            telemetry.report(name, {"duration": 0.001, "count": 2}, {"name": "p", "data": {}})
        for name in telemetry.EVENTS:  # nothing raised: no handler was detached
            assert telemetry.enabled(name)
    finally:
        bridge.uninstall()
    assert [record.telemetry for record in handler.records] == list(telemetry.EVENTS)  # type: ignore[attr-defined]
    names = {span.name for span in otel.spans()}
    assert names == {n for n in telemetry.EVENTS if n != "scriba.projection.event.start"} - {
        "scriba.projection.event.stop",
        "scriba.projection.event.exception",
    } | {"scriba.projection.event"}
    for name in telemetry.EVENTS:
        assert otel.total(name) == 1
        assert otel.recorded(f"{name}.duration")[0] == 1
