"""The router's routes on a live session: the same adapters as at the executor seam,
keys with the session id as their scope half, the processor scope, and refusals the
chart hears as ``error.communication``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from statifier.chart import compile_chart
from statifier.core import Event
from statifier.persistence import Refused
from statifier.persistence.sql import SqlAdapter, SqlTransaction
from statifier.router import RouterConfig, StaticResolver
from statifier.router.routes import IdempotencyKey
from statifier.router.session_sends import SessionRoutes
from statifier.session.clock import VirtualClock
from statifier.session.live import System

CHART = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <datamodel><data id="errors" expr="[]"/></datamodel>
  <state id="s">
    <onentry>
      <send type="test:sink" target="ledger" id="s1" event="pair.joined">
        <param name="n" expr="7"/>
      </send>
      <send type="test:sink" target="nowhere" id="s2" event="lost"/>
      <send type="test:sink" target="execution" id="s3" event="poke"/>
      <send type="test:sink" target="refusing" id="s4" event="full"/>
    </onentry>
    <transition event="error.communication">
      <assign location="errors" expr="errors + [_event.sendid]"/>
    </transition>
  </state>
</scxml>"""


class Recorder:
    def __init__(self, refuse: str | None = None) -> None:
        self.calls: list[tuple[dict[str, Any], Event, IdempotencyKey, SqlTransaction | None]] = []
        self.refuse = refuse

    def deliver(
        self,
        config: Mapping[str, Any],
        event: Event,
        key: IdempotencyKey,
        tx: SqlTransaction | None,
        scope: str | None,
    ) -> Refused | None:
        self.calls.append((dict(config), event, key, tx))
        return None if self.refuse is None else Refused(self.refuse)


@pytest.mark.asyncio
@pytest.mark.parametrize("scope", ["staging", lambda: "staging", None])
async def test_a_live_session_hands_its_route_sends_to_the_same_adapters(scope: Any) -> None:
    recorder = Recorder()
    config = RouterConfig(
        SqlAdapter("sqlite://"),
        bindings=[],
        resolver=StaticResolver({}),
        send_type="test:sink",
        routes={"ledger": (recorder, {"queue": "joined"}), "refusing": (Recorder("full"), {})},
        route_overrides={"staging": {"ledger": {"queue": "staging_joined"}}},
        processor_scope=scope,
    )
    async with System(VirtualClock()) as system:
        session = await system.start(
            compile_chart(CHART),
            session_id="live_1",
            send_types={"test:sink": SessionRoutes(config)},
        )
        await system.run_until_idle()
        errors = sorted(session.state.datamodel["errors"])
    if scope is None:
        # Some scope overrides ledger: with no processor scope it cannot resolve.
        assert errors == ["s1", "s2", "s3", "s4"]
        assert recorder.calls == []
        return
    assert errors == ["s2", "s3", "s4"]
    [(route_config, event, key, tx)] = recorder.calls
    assert route_config == {"queue": "staging_joined"}
    assert tx is None
    assert (event.name, event.data, event.sendid) == ("pair.joined", {"n": 7}, "s1")
    assert (key.scope, key.send_id) == ("live_1", "s1")
    assert str(key).startswith("live_1/s1/")
