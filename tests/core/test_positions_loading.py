"""Loading positions and stored events: whatever the bytes, ``load`` and
``load_event`` answer with a value or a typed ``PositionError``, never Python's own
error (a shadow replay, the console and the durable runtime handle the typed one)."""

from __future__ import annotations

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event, initialize
from statifier.core.positions import (
    MAX_STORED_DEPTH,
    NotAPosition,
    dump,
    dump_event,
    load,
    load_event,
)
from statifier.expr import Value

DEEP = b"[" * 100_000 + b"]" * 100_000


def machine() -> Machine:
    return compile_chart(
        '<scxml xmlns="http://www.w3.org/2005/07/scxml">'
        '<datamodel><data id="x" expr="0"/></datamodel><state id="a"/></scxml>'
    )


def nested(depth: int) -> Value:
    """A value of lists ``depth`` deep (a list of scalars is one level)."""
    value: Value = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_stored_event_nested_too_deep_is_not_a_stored_event() -> None:
    with pytest.raises(NotAPosition, match="not a stored event: nested too deep to read"):
        load_event(DEEP)
    # The decoder's stack is whole again.
    event = Event("e", data={"a": [1]})
    assert load_event(dump_event(event)) == event


def test_a_position_nested_too_deep_is_not_a_position() -> None:
    with pytest.raises(NotAPosition, match="not a position: nested too deep to read"):
        load(machine(), DEEP)
    # A position's envelope around a value nested too deep: the same refusal.
    state, _ = initialize(machine())
    blob = dump(state).replace(b'"x":0', b'"x":' + DEEP)
    with pytest.raises(NotAPosition, match="nested too deep to read"):
        load(machine(), blob)


def test_the_deepest_values_written_read_back() -> None:
    event = Event("e", data=nested(MAX_STORED_DEPTH))
    assert load_event(dump_event(event)) == event
    state, _ = initialize(machine())
    deep = {**state.datamodel, "x": nested(MAX_STORED_DEPTH)}
    blob = dump(state._replace(datamodel=deep))
    assert load(machine(), blob).datamodel["x"] == nested(MAX_STORED_DEPTH)


@pytest.mark.parametrize("data", ["text", None, 5])
def test_what_is_not_bytes_is_not_a_stored_event(data: object) -> None:
    with pytest.raises(NotAPosition, match="not a stored event"):
        load_event(data)  # type: ignore[arg-type]
    with pytest.raises(NotAPosition, match="not a position"):
        load(machine(), data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "blob",
    [b"", b"\xff", b"[", b"{}", b"[1]", b'["e","nowhere",null,null,null,null,null]', b"[[]]"],
)
def test_malformed_bytes_are_not_a_stored_event(blob: bytes) -> None:
    with pytest.raises(NotAPosition):
        load_event(blob)
    with pytest.raises(NotAPosition):
        load(machine(), blob)
