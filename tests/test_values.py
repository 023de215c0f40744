"""Values that cannot be misbuilt (docs/decisions/0062): an Event takes only its name
positionally and checks its fields; every public value whose fields a positional call
could swap takes them by keyword."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from statifier.chart import Problem, ReadLimits, compile_chart
from statifier.chart.model import ChartIdentity, SourceLocation
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core.events import engine_event
from statifier.expr import UNDEFINED
from statifier.persistence import EffectContext, ExecutionRecord, Stepped
from statifier.persistence.driver import InvocationFailed
from statifier.persistence.records import ChartRecord, InputRecord, PositionRecord
from statifier.router import (
    AddressReap,
    AddressRow,
    Binding,
    CreatedAndDelivered,
    Delivered,
    Dropped,
    Duplicate,
    InboundEvent,
    KeyRefused,
    LedgerRow,
    Plan,
    RouterConfig,
)
from statifier.router.binding import ProgramFailed
from statifier.router.records import ReapRow
from statifier.session.handlers import InvokePlan
from statifier.session.recording import Recording
from statifier.session.trace import NoTransition, Step

# -- Event: the name positionally, the rest by keyword, every field checked ------------


def test_an_event_takes_its_data_by_keyword_only() -> None:
    with pytest.raises(TypeError, match="positional"):
        Event("pay", {"amount": 42})  # type: ignore[call-arg, arg-type]
    event = Event("pay", data={"amount": 42})
    assert (event.type, event.data) == ("external", {"amount": 42})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"name": 7}, "Event name must be a str, not int"),
        ({"name": ""}, "Event name must be a non-empty str"),
        ({"name": "e", "type": {"amount": 42}}, "Event type must be 'external'"),
        ({"name": "e", "type": "externl"}, "Event type must be 'external'"),
        ({"name": "e", "sendid": 1}, "Event sendid must be a str or None, not int"),
        ({"name": "e", "origin": b"#_x"}, "Event origin must be a str or None, not bytes"),
        ({"name": "e", "origintype": ["t"]}, "Event origintype must be a str or None"),
        ({"name": "e", "invokeid": 3.5}, "Event invokeid must be a str or None"),
    ],
)
def test_a_misbuilt_event_raises_a_type_error_naming_the_field(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(TypeError, match=named):
        Event(**fields)
    with pytest.raises(TypeError, match=named):  # the check holds for copies too
        replace(Event("e"), **fields)


@pytest.mark.parametrize("kind", ["external", "internal", "platform"])
def test_every_event_type_is_accepted(kind: Any) -> None:
    event = Event("e", type=kind, sendid="s", origin="o", origintype="t", invokeid="i")
    assert event.type == kind


def test_the_engine_builder_makes_the_same_value_without_the_checks() -> None:
    checked = Event("e", type="internal", data="d", sendid="s", invokeid="i")
    built = engine_event("e", "internal", "d", "s", None, None, "i")
    assert built == checked
    assert hash(built) == hash(checked)
    assert repr(built) == repr(checked)
    assert engine_event("", "internal").name == ""  # a <send> of <content> alone


def test_a_chart_can_still_send_itself_a_nameless_event() -> None:
    machine = compile_chart(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="a">'
        '<state id="a"><onentry><send target="#_internal"><content expr="5"/></send>'
        "</onentry>"
        '<transition event="*" cond="_event.name == \'\'" target="b"/></state>'
        '<final id="b"/></scxml>'
    )
    state, _effects = initialize(machine)
    assert not state.running  # the nameless event took the transition to b
    with pytest.raises(TypeError, match="non-empty"):
        handle_event(state, Event(""))


# -- every other value: which fields stay positional ------------------------------------

POSITIONAL: dict[type[Any], tuple[str, ...]] = {
    Event: ("name",),
    ChartIdentity: ("content_hash",),
    Problem: ("message",),
    ReadLimits: (),
    SourceLocation: ("line",),
    ChartRecord: ("content_hash",),
    PositionRecord: ("key",),
    InputRecord: ("execution_id",),
    EffectContext: ("execution_id",),
    InvocationFailed: ("reason",),
    InboundEvent: (),
    Delivered: ("binding_id",),
    CreatedAndDelivered: ("binding_id",),
    Duplicate: ("binding_id",),
    KeyRefused: ("binding_id",),
    Dropped: ("binding_id",),
    ProgramFailed: (),
    Plan: ("id",),
    Binding: ("id",),
    RouterConfig: ("store",),
    AddressRow: ("id",),
    LedgerRow: ("binding_id",),
    ReapRow: ("id",),
    AddressReap: (),
    InvokePlan: ("invoke_id",),
    NoTransition: ("event",),
    Step: ("event",),
    StartOptions: (),
    ExecutionRecord: ("id",),
    Stepped: ("execution",),
    Recording: ("session_id",),
}


@pytest.mark.parametrize("kind", list(POSITIONAL), ids=lambda kind: kind.__name__)
def test_only_the_subject_of_a_value_is_positional(kind: type[Any]) -> None:
    fields = [field for field in dataclasses.fields(kind) if field.init]
    assert tuple(field.name for field in fields if not field.kw_only) == POSITIONAL[kind]
    assert len(fields) > len(POSITIONAL[kind])  # something is keyword-only


@pytest.mark.parametrize("kind", list(POSITIONAL), ids=lambda kind: kind.__name__)
def test_a_value_built_positionally_past_its_subject_is_refused(kind: type[Any]) -> None:
    arguments = ["x"] * (len(POSITIONAL[kind]) + 1)
    with pytest.raises(TypeError, match="positional"):
        kind(*arguments)


def test_an_inbound_event_names_each_field() -> None:
    event = InboundEvent(scope="t", source="orders", message_id="m-1", data={"n": 1})
    assert (event.scope, event.source, event.message_id) == ("t", "orders", "m-1")
    with pytest.raises(TypeError, match="unexpected keyword argument 'message'"):
        InboundEvent(scope="t", source="orders", message="m-1")  # type: ignore[call-arg]


def test_an_outcome_names_its_fields() -> None:
    dropped = Dropped("b", reason="finished", key="k", execution_id="ex")  # type: ignore[arg-type]
    assert (dropped.key, dropped.execution_id) == ("k", "ex")
    assert Delivered("b", key="k", execution_id="ex").execution_id == "ex"
    assert InvocationFailed("boom", attempts=2).detail is UNDEFINED
