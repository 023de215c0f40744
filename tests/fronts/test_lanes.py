"""Partition keys and lanes: the address of the first enabled by-key binding of the
event's source whose match holds and whose key resolves, else the message id (the key
:meth:`Router.plan` gives); one key always hashes to one lane."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.fronts.lanes import lane_of
from statifier.persistence.sql import SqlAdapter
from statifier.router import Binding, InboundEvent, Order, Router, RouterConfig, StaticResolver


def _binding(binding_id: str, **more: object) -> Binding:
    fields: dict[str, object] = {
        "id": binding_id,
        "source": "ads",
        "match": "event.kind == 'click'",
        "key": "event.impression_id",
        "document": "join",
        "event": "click.recorded",
        **more,
    }
    return Binding(**fields)  # type: ignore[arg-type]


def _event(message_id: str = "m1", **data: object) -> InboundEvent:
    return InboundEvent(scope="tenant", source="ads", message_id=message_id, data=data)


CLICK = _event(kind="click", impression_id="i7", user="u3")


async def partition_key(bindings: list[Binding], event: InboundEvent) -> str:
    """The partition key a router with ``bindings`` plans ``event`` under."""
    async with SqlAdapter("sqlite://") as adapter:
        config = RouterConfig(adapter, bindings=bindings, resolver=StaticResolver({}))
        return (await Router(config).plan(event)).key


@pytest.mark.asyncio
async def test_the_first_keyed_binding_gives_the_address() -> None:
    by_user = _binding("by_user", key="event.user", document="people")
    assert await partition_key([_binding("clicks"), by_user], CLICK) == "tenant/join/i7"
    assert await partition_key([by_user, _binding("clicks")], CLICK) == "tenant/people/u3"


@pytest.mark.asyncio
async def test_bindings_that_cannot_key_the_event_are_passed_over() -> None:
    passed_over = [
        _binding("off", enabled=False, document="off"),
        _binding("unordered", order=Order.NONE, document="unordered"),
        _binding("elsewhere", source="other", document="elsewhere"),
        _binding("views", match="event.kind == 'view'", document="views"),
        _binding("no_key", key="event.missing", document="no_key"),
        _binding("failing", match="event.kind.nope()", document="failing"),
    ]
    assert await partition_key(passed_over, CLICK) == "m1"
    assert await partition_key([*passed_over, _binding("clicks")], CLICK) == "tenant/join/i7"


@pytest.mark.asyncio
async def test_an_unkeyed_event_falls_back_to_its_message_id() -> None:
    assert await partition_key([], CLICK) == "m1"
    assert await partition_key([_binding("clicks")], _event("m9", kind="view")) == "m9"


def test_a_lane_is_the_crc32_of_the_key() -> None:
    assert lane_of("tenant/join/i7", 8) == zlib.crc32(b"tenant/join/i7") % 8
    assert lane_of("anything", 1) == 0


@settings(max_examples=200, deadline=None, database=None)
@given(key=st.text(max_size=40), lanes=st.integers(1, 64))
def test_one_key_always_runs_on_one_lane(key: str, lanes: int) -> None:
    lane = lane_of(key, lanes)
    assert 0 <= lane < lanes
    assert lane_of(key, lanes) == lane
