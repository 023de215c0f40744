"""Positions as bytes (dump/load) and by state ids (export/import_state)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event, MachineState, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.positions import (
    FORMAT_VERSION,
    IdentityMismatch,
    MalformedExport,
    NotAPosition,
    PositionError,
    QueueNotEmpty,
    UnknownStateIds,
    UnnameableStates,
    UnsupportedFormatVersion,
    dump,
    dump_event,
    export,
    import_state,
    load,
    load_event,
)
from statifier.expr import UNDEFINED, Duration, Value
from statifier.expr.jsontext import MAX_JSON_DEPTH

NS = "http://www.w3.org/2005/07/scxml"


def source(body: str, attrs: str = "") -> str:
    return f'<scxml xmlns="{NS}" {attrs}>{body}</scxml>'


RICH_SOURCE = source(
    """
    <datamodel><data id="n" expr="0"/><data id="v"/><data id="ids" expr="[]"/></datamodel>
    <state id="main" initial="p">
      <history id="h" type="deep"><transition target="p"/></history>
      <parallel id="p">
        <state id="r1">
          <state id="r1a"><transition event="a" target="r1b">
            <assign location="n" expr="n + 1"/></transition></state>
          <state id="r1b"><transition event="a" target="r1a"/></state>
        </state>
        <state id="r2">
          <state id="r2a">
            <invoke id="worker" type="scxml" src="w.scxml"/>
            <transition event="b" target="r2b"><send event="later" delay="2s"/></transition>
          </state>
          <state id="r2b"><transition event="b" target="r2a"/></state>
        </state>
      </parallel>
      <transition event="out" target="away"/>
      <transition event="set"><assign location="v" expr="_event.data"/></transition>
    </state>
    <state id="away">
      <transition event="back" target="h"/>
      <transition event="finish" target="end"/>
    </state>
    <final id="end"/>
    """,
    'name="rich"',
)
RICH = compile_chart(RICH_SOURCE)


def run(
    machine: Machine, *events: str | Event, options: StartOptions | None = None
) -> MachineState:
    state, _ = initialize(machine, options or StartOptions(session_id="s1"))
    for event in events:
        state, _ = handle_event(state, Event(event) if isinstance(event, str) else event)
    return state


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "events",
    [
        (),
        ("a",),
        ("a", "b"),
        ("a", "b", "out"),
        ("a", "b", "out", "back"),
        ("a", "out", "finish"),
        ("b", Event("set", data={"deep": [1, {"x": None}]}, sendid="s-9", origin="#_x")),
    ],
)
def test_dump_and_load_round_trip(events: tuple[str | Event, ...]) -> None:
    state = run(RICH, *events)
    loaded = load(RICH, dump(state))
    assert loaded == state
    assert dump(loaded) == dump(state)


def test_a_loaded_position_continues_like_the_original() -> None:
    state = run(RICH, "a", "b", "out")
    loaded = load(RICH, dump(state))
    for event in ["back", "a", "b", "out", "finish"]:
        state, effects = handle_event(state, Event(event))
        loaded, loaded_effects = handle_event(loaded, Event(event))
        assert loaded == state
        assert loaded_effects == effects


def test_round_trip_of_a_position_with_queued_events() -> None:
    machine = compile_chart(
        source(
            '<state id="a"><onentry><raise event="x"/><send event="y" target="#_internal">'
            '<param name="d" expr="#2024-02-03#"/></send></onentry></state>'
        )
    )
    state, effects = initialize(machine, StartOptions(round_budget=0))
    assert isinstance(effects[-1], fx.BudgetExhausted)
    assert len(state.internal_queue) == 2
    assert load(machine, dump(state)) == state


def test_round_trip_keeps_the_options_carried_by_the_state() -> None:
    options = StartOptions(
        session_id="abc",
        trace=True,
        round_budget=None,
        send_types=frozenset({"x-mail"}),
        invoke_types=frozenset({"x-job"}),
    )
    state = run(RICH, "a", options=options)
    loaded = load(RICH, dump(state))
    assert loaded == state
    assert (loaded.trace, loaded.round_budget, loaded.send_types, loaded.invoke_types) == (
        True,
        None,
        frozenset({"x-mail"}),
        frozenset({"x-job"}),
    )
    assert loaded.datamodel["_sessionid"] == "abc"


def test_same_state_gives_the_same_bytes() -> None:
    first = run(RICH, "a", "b", "out", "back")
    second = run(RICH, "a", "b", "out", "back")
    assert first is not second
    assert dump(first) == dump(second)
    assert dump(first) == dump(first)


def test_different_states_give_different_bytes() -> None:
    assert dump(run(RICH, "a")) != dump(run(RICH, "b"))


def test_the_bytes_are_small_and_hold_no_chart() -> None:
    big = compile_chart(
        source(
            "".join(
                f'<state id="s{i}"><onentry><log label="a fairly long label number {i}" '
                f'expr="{i} + 1"/></onentry><transition event="e{i}" target="s{i + 1}"/>'
                "</state>"
                for i in range(200)
            )
            + '<state id="s200"/>'
        )
    )
    state = run(big, "e0")
    blob = dump(state)
    assert len(big.source) > 20_000
    assert len(blob) < 1_000
    assert b"fairly long label" not in blob
    assert b"<state" not in blob
    assert load(big, blob) == state


def test_the_bytes_are_json_with_a_format_version() -> None:
    envelope = json.loads(dump(run(RICH)))
    assert isinstance(envelope, list)
    assert FORMAT_VERSION in envelope
    assert RICH.identity.content_hash in json.dumps(envelope)


# -- datamodel values -----------------------------------------------------------------------


VALUES: dict[str, Value] = {
    "int": -12345678901234567890,
    "float": 0.1,
    "whole_float": 2.0,
    "tiny": 5e-324,
    "string": 'ünïcödé "quoted" \\ \n',
    "empty_string": "",
    "true": True,
    "false": False,
    "null": None,
    "undefined": UNDEFINED,
    "date": date(2024, 2, 29),
    "datetime": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
    "datetime_fraction": datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    "duration": Duration(years=1, months=2, weeks=3, days=4, hours=5, minutes=6, seconds=7),
    "duration_ms": Duration(milliseconds=1500),
    "empty_list": [],
    "empty_map": {},
    "nested": {"a": [1, [UNDEFINED, None], {"d": date(2020, 1, 1)}], "b": {"c": {"d": []}}},
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_datamodel_values_of_every_type_round_trip(name: str) -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    state = run(machine, options=StartOptions(datamodel={"v": VALUES[name]}))
    loaded = load(machine, dump(state))
    value = loaded.datamodel["v"]
    assert value == VALUES[name]
    assert type(value) is type(VALUES[name])
    assert loaded == state


def test_undefined_and_null_stay_distinct() -> None:
    machine = compile_chart(
        source('<datamodel><data id="u"/><data id="n" expr="null"/></datamodel><state id="a"/>')
    )
    loaded = load(machine, dump(run(machine)))
    assert loaded.datamodel["u"] is UNDEFINED
    assert loaded.datamodel["n"] is None


def test_a_datetime_with_an_offset_round_trips_as_the_same_instant() -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    moment = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    state = run(machine, options=StartOptions(datamodel={"v": moment}))
    assert load(machine, dump(state)).datamodel["v"] == moment


def test_the_last_event_round_trips() -> None:
    event = Event("set", data={"k": [UNDEFINED]}, sendid="id1", origin="#_o", origintype="t")
    state = run(RICH, event)
    loaded = load(RICH, dump(state))
    assert loaded.datamodel["_event"] == state.datamodel["_event"]
    assert loaded.datamodel["v"] == {"k": [UNDEFINED]}


@pytest.mark.parametrize(
    "value",
    [
        {"$type": "date", "value": "2024-01-01"},
        {"$type": "anything"},
        [1, {"$type": "undefined"}],
        {"outer": {"$type": 1}},
    ],
)
def test_a_map_with_a_type_key_is_refused_by_dump(value: Value) -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    state = run(machine, options=StartOptions(datamodel={"v": value}))
    with pytest.raises(ValueError, match=r"\$type"):
        dump(state)


def test_strings_mentioning_type_are_fine() -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    value = {"k": "$type", "text": '{"$type": "date"}', "list": ["$type"]}
    state = run(machine, options=StartOptions(datamodel={"v": value}))
    assert load(machine, dump(state)).datamodel["v"] == value


# -- refusals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"garbage",
        b"\xff\xfe\x00",
        b"[]",
        b"{}",
        b'{"a": 1}',
        b"null",
        b"42",
        b'["statifier.position"]',
        b'["something.else", 1, {}, []]',
    ],
)
def test_not_a_position(blob: bytes) -> None:
    with pytest.raises(NotAPosition):
        load(RICH, blob)


def test_a_truncated_position_is_not_a_position() -> None:
    blob = dump(run(RICH, "a", "b"))
    for cut in (1, 2, 10, len(blob) // 2, len(blob) - 1):
        with pytest.raises(NotAPosition):
            load(RICH, blob[:cut])


def test_a_damaged_body_is_not_a_position() -> None:
    envelope = json.loads(dump(run(RICH, "a")))
    body = envelope[3]
    damaged = [
        body[:5],
        [[0, 999], *body[1:]],
        [[-1], *body[1:]],
        [*body[:6], [1, 2], *body[7:]],
        [*body[:10], [1, 2], *body[11:]],
        "not a list",
    ]
    for broken in damaged:
        blob = json.dumps([envelope[0], envelope[1], envelope[2], broken]).encode()
        with pytest.raises(NotAPosition):
            load(RICH, blob)


def test_an_unsupported_format_version_is_refused_before_identity() -> None:
    blob = dump(run(RICH, "a"))
    prefix = f'["statifier.position",{FORMAT_VERSION},'.encode()
    assert blob.startswith(prefix)
    edited = blob.replace(prefix, b'["statifier.position",99,', 1)
    with pytest.raises(UnsupportedFormatVersion) as caught:
        load(RICH, edited)
    assert caught.value.version == 99
    other = compile_chart(source('<state id="x"/>'))
    with pytest.raises(UnsupportedFormatVersion):
        load(other, edited)


def test_a_position_of_another_chart_is_refused() -> None:
    blob = dump(run(RICH))
    other = compile_chart(source('<state id="x"/>'))
    with pytest.raises(IdentityMismatch) as caught:
        load(other, blob)
    assert caught.value.stored == RICH.identity
    assert caught.value.machine == other.identity
    assert isinstance(caught.value, PositionError)


@pytest.mark.parametrize(
    ("name", "version"), [(None, None), ("rich", None), ("rich", "2"), ("other", "1")]
)
def test_the_same_source_under_another_name_or_version_is_refused(
    name: str | None, version: str | None
) -> None:
    labelled = compile_chart(RICH_SOURCE, name="rich", version="1")
    blob = dump(run(labelled, "a"))
    relabelled = compile_chart(RICH_SOURCE, name=name, version=version)
    with pytest.raises(IdentityMismatch):
        load(relabelled, blob)
    same = compile_chart(RICH_SOURCE, name="rich", version="1")
    assert dump(load(same, blob)) == blob


def test_a_whitespace_change_is_another_chart() -> None:
    blob = dump(run(RICH))
    with pytest.raises(IdentityMismatch):
        load(compile_chart(RICH_SOURCE + "\n"), blob)


# -- export and import ------------------------------------------------------------------


def test_export_is_json_ready_and_by_state_ids() -> None:
    state = run(RICH, "a", "b")
    exported = export(state)
    assert json.loads(json.dumps(exported)) == exported
    assert exported["configuration"] == ["main", "p", "r1", "r1b", "r2", "r2b"]
    assert exported["invocations"] == []
    assert exported["counters"] == [
        state.macrostep,
        state.microstep,
        state.round,
        state.send_counter,
        state.invoke_counter,
        state.timer_counter,
    ]


def test_export_and_import_on_the_same_chart_round_trips() -> None:
    for events in [(), ("a", "b"), ("a", "b", "out"), ("a", "b", "out", "back", "finish")]:
        state = run(RICH, *events)
        assert import_state(RICH, export(state)) == state


CHANGED = compile_chart(
    RICH_SOURCE.replace(
        '<state id="away">',
        '<state id="brand_new"/><state id="away"><onentry><log label="new"/></onentry>',
    ).replace('<final id="end"/>', '<final id="end"/><state id="also_new"/>')
)


def test_import_onto_a_changed_chart_keeps_ids() -> None:
    state = run(RICH, "a", "b", "out")
    moved = import_state(CHANGED, export(state))
    assert moved.leaf_configuration() == ("away",)
    assert {CHANGED.states[i].id for i in moved.configuration} == {None, "away"}
    assert moved.history == {
        CHANGED.ids["h"]: tuple(sorted(CHANGED.ids[s] for s in ("r1b", "r2b")))
    }
    assert moved.datamodel["n"] == 1
    back, _ = handle_event(moved, Event("back"))
    assert back.leaf_configuration() == ("r1b", "r2b")
    assert back.send_counter == state.send_counter


def test_import_keeps_invocations_by_state_id() -> None:
    state = run(RICH)
    assert dict(state.invocations) == {(RICH.ids["r2a"], 0): "worker"}
    moved = import_state(CHANGED, export(state))
    assert dict(moved.invocations) == {(CHANGED.ids["r2a"], 0): "worker"}
    _, effects = handle_event(moved, Event("b"))
    assert [(e.invoke_id, e.state_index) for e in effects if isinstance(e, fx.CancelInvoke)] == [
        ("worker", CHANGED.ids["r2a"])
    ]


def test_export_refuses_queued_events() -> None:
    machine = compile_chart(source('<state id="a"><onentry><raise event="x"/></onentry></state>'))
    state, _ = initialize(machine, StartOptions(round_budget=0))
    with pytest.raises(QueueNotEmpty):
        export(state)


def test_export_refuses_states_without_ids() -> None:
    machine = compile_chart(
        source('<state id="a"><state><state/></state></state><state><state id="x"/></state>')
    )
    state = run(machine)
    with pytest.raises(UnnameableStates) as caught:
        export(state)
    assert caught.value.indexes == [2, 3]


def test_import_names_every_unknown_id_sorted() -> None:
    exported = export(run(RICH, "a", "b", "out"))
    target = compile_chart(source('<state id="zz"/><state id="main"/>'))
    with pytest.raises(UnknownStateIds) as caught:
        import_state(target, exported)
    assert caught.value.ids == sorted(caught.value.ids)
    assert caught.value.ids == ["away", "h", "p", "r1", "r1a", "r1b", "r2", "r2a", "r2b"]


def _exported() -> dict[str, Any]:
    return export(run(RICH, "a"))


@pytest.mark.parametrize(
    "change",
    [
        {"configuration": None},
        {"configuration": 5},
        {"counters": [1, 2]},
        {"counters": "abc"},
        {"datamodel": [1, 2]},
        {"datamodel": {"$type": "bogus"}},
        {"history": []},
        {"invocations": [["r2a"]]},
        {"entered": 7},
    ],
)
def test_import_refuses_a_malformed_export(change: dict[str, Any]) -> None:
    with pytest.raises(MalformedExport):
        import_state(RICH, {**_exported(), **change})


@pytest.mark.parametrize("missing", ["configuration", "counters", "datamodel", "history"])
def test_import_refuses_an_export_missing_a_field(missing: str) -> None:
    exported = _exported()
    del exported[missing]
    with pytest.raises(MalformedExport):
        import_state(RICH, exported)


@pytest.mark.parametrize("bad_id", [["main"], {"id": "main"}, None, 3])
def test_import_refuses_state_ids_that_are_not_strings(bad_id: Any) -> None:
    # A state id in an export is a string; anything else is a malformed export, and
    # import must answer with a PositionError rather than crash.
    exported = _exported()
    exported["configuration"] = [*exported["configuration"], bad_id]
    with pytest.raises(MalformedExport):
        import_state(RICH, exported)


def test_a_key_that_merely_contains_type_is_stored() -> None:
    # dump refuses "a map with a '$type' key"; a key that only contains the text, such
    # as 'x"$type', is an ordinary key and must round-trip.
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    value = {'x"$type': 1}
    state = run(machine, options=StartOptions(datamodel={"v": value}))
    assert load(machine, dump(state)).datamodel["v"] == value


def test_a_datamodel_doubled_in_a_loop_is_refused_quickly() -> None:
    # x = [x, x] thirty times is small in memory but has 2**31 values written out.
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><datamodel><data id="x" expr="[1]"/></datamodel>'
        '<state id="a"><onentry><script>i = 0; while i &lt; 30 { x = [x, x]; i = i + 1 }'
        "</script></onentry></state></scxml>"
    )
    state, _ = initialize(machine)
    with pytest.raises(ValueError, match="too large"):
        dump(state)


# Positions bound nesting as JSON text from outside is bound (MAX_STORED_DEPTH).
MAX_STORED_DEPTH = MAX_JSON_DEPTH


def _nested(depth: int) -> Any:
    """A value of ``depth`` maps nested in one another (a scalar at the bottom)."""
    value: Any = 0
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_datamodel_nested_deeper_than_the_bound_is_refused_not_a_recursion_error() -> None:
    # x = {k: x} five thousand times stays within the expression budgets; writing it
    # out must be refused as too deep (a ValueError, as too large is), never crash
    # with a RecursionError.
    machine = compile_chart(
        f'<scxml xmlns="{NS}"><datamodel><data id="x" expr="0"/></datamodel>'
        '<state id="a"><onentry><script>i = 0; while i &lt; 5000 { x = {k: x}; i = i + 1 }'
        "</script></onentry></state></scxml>"
    )
    state, _ = initialize(machine)
    with pytest.raises(ValueError, match="nested deeper than 128"):
        dump(state)


def test_a_value_as_deep_as_the_bound_is_stored_and_one_level_more_is_refused() -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    value = _nested(MAX_STORED_DEPTH)
    state = run(machine, options=StartOptions(datamodel={"v": value}))
    assert load(machine, dump(state)).datamodel["v"] == value
    # The bound holds wherever the value sits: under another variable's list, shared
    # by two variables, or taken from an event.
    deeper = run(machine, options=StartOptions(datamodel={"v": [value]}))
    with pytest.raises(ValueError, match="nested deeper"):
        dump(deeper)
    shared = run(machine, options=StartOptions(datamodel={"v": value, "w": [value]}))
    with pytest.raises(ValueError, match="nested deeper"):
        dump(shared)
    heard = run(RICH, Event("set", data=_nested(MAX_STORED_DEPTH + 1)))
    with pytest.raises(ValueError, match="nested deeper"):
        dump(heard)


def test_a_host_value_that_holds_itself_is_refused_with_a_value_error() -> None:
    machine = compile_chart(source('<datamodel><data id="v"/></datamodel><state id="a"/>'))
    loop: list[Any] = []
    loop.append(loop)
    state = run(machine, options=StartOptions(datamodel={"v": loop}))
    with pytest.raises(ValueError, match="holds itself"):
        dump(state)
    with pytest.raises(ValueError, match="holds itself"):
        dump_event(Event("n", data={"v": loop}))


def test_event_data_too_deep_or_too_large_is_refused_by_dump_event() -> None:
    assert load_event(dump_event(Event("n", data=_nested(MAX_STORED_DEPTH)))).data == _nested(
        MAX_STORED_DEPTH
    )
    with pytest.raises(ValueError, match="nested deeper"):
        dump_event(Event("n", data=_nested(5000)))
    doubled: Any = [1]
    for _ in range(21):  # 2**21 ones and as many lists once written out
        doubled = [doubled, doubled]
    with pytest.raises(ValueError, match="too large"):
        dump_event(Event("n", data={"x": doubled}))


def test_events_round_trip_through_their_stored_form() -> None:
    event = Event(
        "paid",
        type="internal",
        data={"when": UNDEFINED, "n": [1, 2.5, None]},
        sendid="s1",
        origin="#_x",
        origintype="t",
        invokeid="i",
    )
    assert load_event(dump_event(event)) == event


@pytest.mark.parametrize(
    "data", [b"", b"{}", b"[1,2]", b'["a","sideways",null,null,null,null,null]', b"\xff"]
)
def test_loading_something_that_is_not_a_stored_event_is_refused(data: bytes) -> None:
    with pytest.raises(NotAPosition):
        load_event(data)
