"""Migration plans and the pure move of one position along a plan (no store)."""

from __future__ import annotations

from typing import Any

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event, MachineState, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.positions import IdentityMismatch
from statifier.persistence import InvalidMigrationPlan, MigrationPlan
from statifier.persistence.errors import UndeclaredPlanData, UnknownPlanStates
from statifier.persistence.migration import LoggedMigration, Unmappable, carry, renamed_ids

NS = 'xmlns="http://www.w3.org/2005/07/scxml" datamodel="predicator"'


def chart(body: str, initial: str) -> Machine:
    return compile_chart(f'<scxml {NS} initial="{initial}">{body}</scxml>')


ORDER = chart(
    '<datamodel><data id="n" expr="0"/></datamodel>'
    '<state id="placed"><transition event="pay" target="paid">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="paid"><transition event="ship" target="shipping"/></state>'
    '<state id="shipping" initial="packing">'
    '<history id="was" type="shallow"><transition target="packing"/></history>'
    '<state id="packing"><transition event="packed" target="in_transit"/></state>'
    '<state id="in_transit"/>'
    '<transition event="hold" target="held"/></state>'
    '<state id="held"><transition event="release" target="was"/></state>'
    '<final id="delivered"/>',
    "placed",
)

REVISED = chart(
    '<datamodel><data id="n" expr="0"/><data id="carrier" expr="\'post\'"/></datamodel>'
    '<state id="placed"><transition event="pay" target="charged">'
    '<assign location="n" expr="n + 1"/></transition></state>'
    '<state id="charged"><transition event="ship" target="shipping"/></state>'
    '<state id="shipping" initial="packing">'
    '<history id="resume" type="shallow"><transition target="packing"/></history>'
    '<state id="packing"><transition event="packed" target="moving"/></state>'
    '<state id="moving"><transition event="deliver" target="delivered"/></state>'
    "</state>"
    '<final id="delivered"/>',
    "placed",
)

MAP: dict[str, str | None] = {"paid": "charged", "in_transit": "moving", "was": "resume"}


def at(machine: Machine, *events: str) -> MachineState:
    state, _ = initialize(machine)
    for name in events:
        state, _ = handle_event(state, Event(name))
    return state


def plan(**options: Any) -> MigrationPlan:
    options.setdefault("state_map", MAP)
    options.setdefault("data", {"carrier": "post"})
    return MigrationPlan(ORDER, REVISED, **options)


def test_unmapped_ids_keep_their_id_and_mapped_ones_move() -> None:
    moved = carry(at(ORDER), plan())
    assert isinstance(moved, MachineState)
    assert moved.machine is REVISED
    assert moved.leaf_configuration() == ("placed",)
    paid = carry(at(ORDER, "pay"), plan())
    assert isinstance(paid, MachineState)
    assert paid.leaf_configuration() == ("charged",)
    assert paid.datamodel["n"] == 1  # the datamodel is carried as it was


def test_a_carried_position_steps_on_the_new_chart() -> None:
    moved = carry(at(ORDER, "pay", "ship", "packed"), plan())
    assert isinstance(moved, MachineState)
    assert moved.leaf_configuration() == ("moving",)
    done, effects = handle_event(moved, Event("deliver"))
    assert not done.running
    assert [e.configuration for e in effects if isinstance(e, fx.Done)] == [("delivered",)]


def test_history_memories_are_carried_under_the_mapped_history() -> None:
    # held is removed: leave it first, so only the memory of shipping is carried.
    state = at(ORDER, "pay", "ship", "packed", "hold", "release")
    assert state.leaf_configuration() == ("in_transit",)
    moved = carry(state, plan())
    assert isinstance(moved, MachineState)
    assert {REVISED.state_id(h) for h in moved.history} == {"resume"}
    (remembered,) = moved.history.values()
    assert [REVISED.state_id(s) for s in remembered] == ["moving"]


def test_an_active_removed_state_is_unmappable_with_the_reason() -> None:
    held = carry(at(ORDER, "pay", "ship", "hold"), plan())
    assert held == Unmappable(
        "active state 'held' is not in the new chart and the plan maps it nowhere"
    )


def test_a_state_removed_on_purpose_is_unmappable() -> None:
    removed = carry(at(ORDER, "pay"), plan(state_map={**MAP, "paid": None}))
    assert isinstance(removed, Unmappable)
    assert "'paid'" in removed.reason


def test_a_remembered_removed_state_is_unmappable() -> None:
    state = at(ORDER, "pay", "ship", "packed", "hold")
    without_moving = {**MAP, "held": "placed", "in_transit": None}
    answer = carry(state, plan(state_map=without_moving))
    assert isinstance(answer, Unmappable)
    assert "remembered by history 'was'" in answer.reason


def test_states_only_entered_in_the_past_are_forgotten() -> None:
    state = at(ORDER, "pay", "ship", "hold", "release")  # held entered, then left
    moved = carry(state, plan())
    assert isinstance(moved, MachineState)
    assert "held" not in {REVISED.state_id(s) for s in moved.entered}


def test_a_mapping_that_breaks_the_configuration_is_unmappable() -> None:
    # packing is a child of shipping; mapping paid onto it leaves its parent inactive.
    answer = carry(at(ORDER, "pay"), plan(state_map={**MAP, "paid": "packing"}))
    assert answer == Unmappable("state 'packing' would be active without its parent 'shipping'")
    # mapping a leaf onto a compound state leaves it without an active child.
    answer = carry(at(ORDER, "pay"), plan(state_map={**MAP, "paid": "shipping"}))
    assert answer == Unmappable("compound state 'shipping' would have 0 active children, not 1")


def test_a_parallel_state_needs_every_region() -> None:
    old = chart(
        '<parallel id="p"><state id="a"/><state id="b"/></parallel>',
        "p",
    )
    new = chart('<parallel id="p"><state id="a"/><state id="b"/><state id="c"/></parallel>', "p")
    answer = carry(at(old), MigrationPlan(old, new))
    assert answer == Unmappable("parallel state 'p' would not have every region active")


def test_declared_data_the_position_lacks_is_unmappable_unless_the_plan_gives_it() -> None:
    answer = carry(at(ORDER), plan(data={}))
    assert answer == Unmappable("the new chart declares data the position lacks: ['carrier']")
    moved = carry(at(ORDER), plan(data={"carrier": "courier"}))
    assert isinstance(moved, MachineState)
    assert moved.datamodel["carrier"] == "courier"


def test_a_live_invocation_must_keep_its_invoke() -> None:
    old = chart(
        '<state id="a"><invoke id="pay" type="myapp:pay"/></state>',
        "a",
    )
    kept = chart('<state id="a"><invoke id="pay" type="myapp:pay"/><transition/></state>', "a")
    gone = chart('<state id="a"/><state id="b"/>', "a")
    state = at(old)
    assert state.invocations
    moved = carry(state, MigrationPlan(old, kept))
    assert isinstance(moved, MachineState)
    assert list(moved.invocations.values()) == list(state.invocations.values())
    answer = carry(state, MigrationPlan(old, gone))
    assert isinstance(answer, Unmappable)
    assert "has no <invoke> in state 'a'" in answer.reason


def test_a_finished_chart_is_unmappable() -> None:
    ended = at(REVISED, "pay", "ship", "packed", "deliver")
    back = MigrationPlan(REVISED, ORDER, state_map={"charged": "paid", "moving": "in_transit"})
    assert carry(ended, back) == Unmappable("the chart has finished")


def test_carrying_a_position_of_another_chart_is_refused() -> None:
    with pytest.raises(IdentityMismatch):
        carry(at(REVISED), plan())


def test_renamed_ids_name_what_changed_in_this_position() -> None:
    assert renamed_ids(at(ORDER), plan()) == {}
    assert renamed_ids(at(ORDER, "pay"), plan()) == {"paid": "charged"}


# Building plans.


def test_a_plan_is_frozen_and_keeps_copies() -> None:
    given: dict[str, str | None] = {"paid": "charged"}
    built = MigrationPlan(ORDER, REVISED, state_map=given, data={"carrier": "x"})
    given["paid"] = None
    assert built.state_map == {"paid": "charged"}
    with pytest.raises(TypeError):
        built.state_map["paid"] = None  # type: ignore[index]
    with pytest.raises(AttributeError):
        built.target = ORDER  # type: ignore[misc]
    assert built.source_hash == ORDER.identity.content_hash
    assert built.target_hash == REVISED.identity.content_hash
    assert built.new_id("paid") == "charged"
    assert built.new_id("placed") == "placed"
    assert built.new_id("held") is None


def test_a_mapped_target_missing_from_the_new_chart_is_refused() -> None:
    with pytest.raises(UnknownPlanStates) as refused:
        MigrationPlan(ORDER, REVISED, state_map={"paid": "settled", "held": "limbo"})
    assert refused.value.side == "new"
    assert refused.value.ids == ["limbo", "settled"]
    assert isinstance(refused.value, InvalidMigrationPlan)


def test_a_key_missing_from_the_old_chart_is_refused() -> None:
    with pytest.raises(UnknownPlanStates) as refused:
        MigrationPlan(ORDER, REVISED, state_map={"refunded": "placed"})
    assert (refused.value.side, refused.value.ids) == ("old", ["refunded"])


def test_a_history_maps_only_to_a_history() -> None:
    with pytest.raises(InvalidMigrationPlan, match="history state maps only to a history"):
        MigrationPlan(ORDER, REVISED, state_map={"was": "shipping"})
    with pytest.raises(InvalidMigrationPlan, match="history state maps only to a history"):
        MigrationPlan(ORDER, REVISED, state_map={"paid": "resume"})


def test_data_the_new_chart_does_not_declare_is_refused() -> None:
    with pytest.raises(UndeclaredPlanData) as refused:
        MigrationPlan(ORDER, REVISED, data={"carrier": "post", "colour": "red"})
    assert refused.value.names == ["colour"]


def test_a_plan_onto_the_same_chart_is_refused() -> None:
    with pytest.raises(InvalidMigrationPlan, match="same chart"):
        MigrationPlan(ORDER, ORDER)


@pytest.mark.parametrize(
    ("source", "target", "state_map"),
    [
        ("not a chart", REVISED, {}),
        (ORDER, None, {}),
        (ORDER, REVISED, {1: "placed"}),
        (ORDER, REVISED, {"paid": 7}),
        (ORDER, REVISED, ["paid"]),
    ],
)
def test_untyped_arguments_are_refused(source: Any, target: Any, state_map: Any) -> None:
    with pytest.raises(TypeError):
        MigrationPlan(source, target, state_map=state_map)


# The input log's entry.


def test_a_logged_migration_round_trips() -> None:
    entry = LoggedMigration("sha256:a", "sha256:b", None, {"paid": "charged"})
    assert LoggedMigration.load(entry.dump()) == entry
    assert not entry.parked
    parked = LoggedMigration("sha256:a", "sha256:b", "active state 'held' is gone")
    assert LoggedMigration.load(parked.dump()) == parked
    assert parked.parked


@pytest.mark.parametrize("data", [b"", b"[]", b'{"tag": "other"}', b'["n", "external"]', b"\xff"])
def test_bytes_that_are_no_logged_migration_are_refused(data: bytes) -> None:
    from statifier.core.positions import NotAPosition

    with pytest.raises(NotAPosition):
        LoggedMigration.load(data)
