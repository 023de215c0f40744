"""Telemetry: the catalog, the handlers, and what sessions report."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from statifier import telemetry
from statifier.chart import compile_chart
from statifier.session.clock import VirtualClock
from statifier.session.live import System

CATALOG = Path(__file__).parent.parent / "docs" / "telemetry.md"


def test_the_catalog_documents_exactly_the_events_emitted() -> None:
    documented = set(
        re.findall(r"^\| `((?:statifier|scriba)\.[a-z_.]+)` \|", CATALOG.read_text(), re.M)
    )
    assert documented == set(telemetry.EVENTS)
    sources = "".join(
        path.read_text(encoding="utf-8") for path in Path(telemetry.__file__).parent.rglob("*.py")
    )
    layers = ("statifier.session.", "statifier.persistence.", "statifier.router.")
    emitted = set(re.findall(r'"(statifier\.(?:session|persistence|router)\.[a-z_]+)"', sources))
    assert emitted == {name for name in telemetry.EVENTS if name.startswith(layers)}


def test_unknown_events_and_double_attachment_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        telemetry.attach("h", "statifier.nope", lambda *args: None)
    telemetry.attach("h", "statifier.session.start", lambda *args: None)
    try:
        with pytest.raises(ValueError, match="already"):
            telemetry.attach("h", "statifier.session.start", lambda *args: None)
    finally:
        assert telemetry.detach("h")
    assert not telemetry.detach("h")


def test_a_failing_handler_is_detached_and_observing_continues() -> None:
    def broken(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        raise RuntimeError("observer bug")

    telemetry.attach("broken", "statifier.session.start", broken)
    telemetry.report("statifier.session.start", {}, {})
    assert not telemetry.detach("broken")


def test_sessions_report_their_lifecycle() -> None:
    events: list[tuple[str, dict[str, Any]]] = []

    def record(name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]) -> None:
        events.append((name, {**measurements, **metadata}))

    for name in telemetry.EVENTS:
        telemetry.attach("test", name, record)
    source = (
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
        '<state id="a"><onentry><send event="t" delay="1s"/>'
        "</onentry>"
        '<invoke id="kid" type="scxml"><content><scxml><final id="k"/></scxml></content></invoke>'
        '<invoke id="far" type="scxml" src="file:elsewhere.scxml"/>'
        '<transition event="t" target="b"/></state><final id="b"/></scxml>'
    )

    async def scenario() -> None:
        async with System(VirtualClock()) as system:
            await system.start(compile_chart(source), session_id="main")
            await system.run_until_idle()

    try:
        asyncio.run(scenario())
    finally:
        telemetry.detach("test")
    main = [(name, data) for name, data in events if data.get("session_id") == "main"]
    names = [name for name, _ in main]
    assert names[0] == "statifier.session.start"
    assert names[-1] == "statifier.session.stop"
    assert {"statifier.session.send", "statifier.session.invoke", "statifier.session.error",
            "statifier.session.macrostep"} <= set(names)  # fmt: skip
    errors = [data for name, data in main if name == "statifier.session.error"]
    # The system has no loader, so the src invoke cannot start.
    assert errors[0]["error"] == "error.execution"
    steps = [data for name, data in main if name == "statifier.session.macrostep"]
    assert all(step["duration"] >= 0 for step in steps)
