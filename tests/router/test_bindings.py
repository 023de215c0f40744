"""Bindings as configuration: what is refused (by binding and field), how they load from
TOML and JSON, and how ``match``, ``key`` and ``data`` read a normalized event.

No database: a binding is a plain value whose programs are compiled once."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statifier.expr import Value
from statifier.router import (
    Binding,
    BindingError,
    Create,
    Dedupe,
    Keyed,
    Mode,
    Order,
    load_bindings,
)
from statifier.router.binding import DEFAULT_HORIZON, ProgramFailed

BASE: dict[str, Any] = {
    "id": "parcels",
    "source": "carrier",
    "match": "event.kind == 'scan'",
    "key": "event.parcel_id",
    "document": "parcel",
    "event": "parcel.scanned",
}
"""The required fields of a valid binding."""


def make(**overrides: Any) -> Binding:
    """A binding built from ``BASE`` with ``overrides``."""
    return Binding(**{**BASE, **overrides})


def refusal(error: pytest.ExceptionInfo[BindingError]) -> tuple[str, str]:
    return error.value.binding_id, error.value.field


# --- construction ---------------------------------------------------------------------


def test_a_binding_takes_its_defaults() -> None:
    """What a binding means when it says only the required fields."""
    binding = make()
    assert binding.create is Create.IF_ABSENT
    assert binding.order is Order.BY_KEY
    assert binding.dedupe == Dedupe(DEFAULT_HORIZON)
    assert binding.data == ()
    assert binding.enabled is True
    assert binding.plan.horizon == DEFAULT_HORIZON


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"id": ""}, "id"),
        ({"source": 7}, "source"),
        ({"document": ""}, "document"),
        ({"event": None}, "event"),
        ({"match": "event.kind =="}, "match"),
        ({"match": ""}, "match"),
        ({"key": "trim("}, "key"),
        ({"create": "sometimes"}, "create"),
        ({"create": 1}, "create"),
        ({"order": "random"}, "order"),
        ({"data": "parcel_id"}, "data"),
        ({"data": ("a..b",)}, "data"),
        ({"data": (".a",)}, "data"),
        ({"data": ("",)}, "data"),
        ({"data": (7,)}, "data"),
        ({"data": tuple(f"p{n}" for n in range(257))}, "data"),
        ({"selector": ["topic"]}, "selector"),
        ({"dedupe": {"horizon_ms": 5}}, "dedupe"),
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_a_bad_field_is_refused_naming_the_binding_and_the_field(
    overrides: dict[str, Any], field: str
) -> None:
    """Configuration errors are caught when the binding is built, not when an event
    arrives, and say where to look."""
    with pytest.raises(BindingError) as error:
        make(**overrides)
    expected_id = overrides.get("id", BASE["id"])
    assert refusal(error) == (expected_id, field)
    assert f"field {field!r}" in str(error.value)


def test_create_and_order_accept_their_spellings() -> None:
    binding = make(create="always_new", order="none")
    assert binding.create is Create.ALWAYS_NEW
    assert binding.order is Order.NONE


def test_data_paths_are_kept_dotted() -> None:
    assert make(data=["a", "b.c"]).data == ("a", "b.c")


@pytest.mark.parametrize("horizon", [timedelta(0), timedelta(seconds=-1)])
def test_a_dedupe_horizon_must_be_positive(horizon: timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        Dedupe(horizon)


def test_dedupe_is_only_by_message_id() -> None:
    with pytest.raises(ValueError, match="message_id"):
        Dedupe(by="body")


# --- from_mapping ---------------------------------------------------------------------


def test_from_mapping_reads_the_file_spellings() -> None:
    """``create``/``order`` as strings and ``dedupe`` as ``{by, horizon_ms}``."""
    binding = Binding.from_mapping(
        {
            **BASE,
            "create": "never",
            "order": "none",
            "data": ["parcel_id", "where.city"],
            "dedupe": {"by": "message_id", "horizon_ms": 60_000},
            "selector": {"topic": "scans"},
            "enabled": False,
        }
    )
    assert binding.create is Create.NEVER
    assert binding.order is Order.NONE
    assert binding.data == ("parcel_id", "where.city")
    assert binding.dedupe.horizon == timedelta(minutes=1)
    assert binding.selector == {"topic": "scans"}
    assert binding.enabled is False


def test_from_mapping_without_dedupe_keeps_the_default_horizon() -> None:
    assert Binding.from_mapping(BASE).dedupe.horizon == DEFAULT_HORIZON
    assert Binding.from_mapping({**BASE, "dedupe": {}}).dedupe.horizon == DEFAULT_HORIZON


def test_a_mode_reads_its_fields_from_a_mapping() -> None:
    debounce = Binding.from_mapping(
        {**BASE, "mode": "debounce", "window": "PT30S", "max_wait": "PT5M"}
    )
    assert (debounce.mode, debounce.window, debounce.max_wait, debounce.batch) == (
        Mode.DEBOUNCE,
        timedelta(seconds=30),
        timedelta(minutes=5),
        None,
    )
    batch = Binding.from_mapping({**BASE, "mode": "batch", "batch": 50, "window": "PT10S"})
    assert (batch.mode, batch.batch, batch.window) == (Mode.BATCH, 50, timedelta(seconds=10))
    throttle = Binding(**{**BASE, "mode": "throttle", "batch": 5, "window": timedelta(minutes=1)})
    assert (throttle.mode, throttle.batch) == (Mode.THROTTLE, 5)
    assert Binding.from_mapping(BASE).mode is Mode.EACH


@pytest.mark.parametrize(
    ("fields", "name", "said"),
    [
        ({"mode": "sometimes"}, "mode", "must be one of each, debounce, batch, throttle"),
        ({"window": "PT1S"}, "window", "not taken by mode 'each'"),
        ({"batch": 10}, "batch", "not taken by mode 'each'"),
        ({"mode": "debounce"}, "window", "required by mode 'debounce'"),
        ({"mode": "debounce", "window": "PT1S", "batch": 2}, "batch", "not taken by mode"),
        ({"mode": "batch", "window": "PT1S"}, "batch", "required by mode 'batch'"),
        ({"mode": "throttle", "batch": 2}, "window", "required by mode 'throttle'"),
        (
            {"mode": "throttle", "batch": 2, "window": "PT1S", "max_wait": "PT2S"},
            "max_wait",
            "not taken",
        ),
        ({"mode": "batch", "batch": 0, "window": "PT1S"}, "batch", "from 1 to 1000"),
        ({"mode": "batch", "batch": 1001, "window": "PT1S"}, "batch", "from 1 to 1000"),
        ({"mode": "batch", "batch": "5", "window": "PT1S"}, "batch", "an integer"),
        ({"mode": "batch", "batch": 5, "window": "P1M"}, "window", "PnDTnHnMnS"),
        ({"mode": "batch", "batch": 5, "window": "PT0S"}, "window", "a positive duration"),
        ({"mode": "debounce", "window": "PT1M", "max_wait": "PT30S"}, "max_wait", "at least"),
        (
            {"mode": "debounce", "window": "PT1M", "create": "always_new"},
            "mode",
            "needs an address",
        ),
    ],
)
def test_a_mode_refuses_fields_it_does_not_take_or_lacks(
    fields: dict[str, object], name: str, said: str
) -> None:
    """A mode's fields are checked when the binding is read, each refusal naming the
    field: a file never means something other than it says."""
    with pytest.raises(BindingError, match=said) as error:
        Binding.from_mapping({**BASE, **fields})
    assert refusal(error) == ("parcels", name)


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(BindingError, match="unknown field") as error:
        Binding.from_mapping({**BASE, "colour": "red"})
    assert refusal(error) == ("parcels", "colour")


@pytest.mark.parametrize("name", ["id", "source", "match", "key", "document", "event"])
def test_a_missing_required_field_is_refused(name: str) -> None:
    entry = {field: value for field, value in BASE.items() if field != name}
    with pytest.raises(BindingError, match="required") as error:
        Binding.from_mapping(entry)
    assert refusal(error) == ("?" if name == "id" else "parcels", name)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"create": "sometimes"}, "create"),
        ({"order": "shuffled"}, "order"),
        ({"match": "event.kind == "}, "match"),
        ({"key": "event..parcel_id"}, "key"),
        ({"data": "parcel_id"}, "data"),
        ({"data": 5}, "data"),
        ({"data": ["a.", "b"]}, "data"),
        ({"dedupe": 60_000}, "dedupe"),
        ({"dedupe": {"by": "body"}}, "dedupe"),
        ({"dedupe": {"horizon_ms": 0}}, "dedupe"),
        ({"dedupe": {"horizon_ms": -5}}, "dedupe"),
        ({"dedupe": {"horizon_ms": 10**30}}, "dedupe"),  # past what a date holds
        ({"dedupe": {"horizon_ms": "60000"}}, "dedupe"),
        ({"dedupe": {"horizon_ms": 1.5}}, "dedupe"),
        ({"dedupe": {"horizon_ms": True}}, "dedupe"),
        ({"dedupe": {"horizon_ms": 1, "window": 2}}, "dedupe"),
    ],
)
def test_a_bad_value_in_a_mapping_is_refused(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(BindingError) as error:
        Binding.from_mapping({**BASE, **entry})
    assert refusal(error) == ("parcels", field)


def test_a_binding_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(BindingError, match="a binding is a table"):
        Binding.from_mapping(["id", "parcels"])  # type: ignore[arg-type]


# --- load_bindings --------------------------------------------------------------------

TOML = """
[[bindings]]
id = "scans"
source = "carrier"
match = "event.kind == 'scan'"
key = "trim(event.parcel_id::string)"
document = "parcel"
event = "parcel.scanned"
data = ["parcel_id", "where.city"]
create = "if_absent"
dedupe = { horizon_ms = 3_600_000 }

[[bindings]]
id = "deliveries"
source = "carrier"
match = "event.kind == 'delivered'"
key = "trim(event.parcel_id::string)"
document = "parcel"
event = "parcel.delivered"
create = "never"
order = "none"
"""


def test_load_bindings_reads_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "bindings.toml"
    path.write_text(TOML, encoding="utf-8")
    scans, deliveries = load_bindings(path)
    assert (scans.id, scans.create, scans.dedupe.horizon) == (
        "scans",
        Create.IF_ABSENT,
        timedelta(hours=1),
    )
    assert scans.data == ("parcel_id", "where.city")
    assert (deliveries.id, deliveries.create, deliveries.order) == (
        "deliveries",
        Create.NEVER,
        Order.NONE,
    )
    assert deliveries.dedupe.horizon == DEFAULT_HORIZON
    assert scans.evaluate({"kind": "scan", "parcel_id": 1042771}) == Keyed("1042771")


@pytest.mark.parametrize("wrapped", [False, True], ids=["list", "object"])
def test_load_bindings_reads_a_json_file(tmp_path: Path, wrapped: bool) -> None:
    """A JSON file holds a list of bindings, or an object with ``"bindings"``."""
    entries = [BASE, {**BASE, "id": "other", "create": "always_new"}]
    path = tmp_path / "bindings.json"
    path.write_text(json.dumps({"bindings": entries} if wrapped else entries), encoding="utf-8")
    loaded = load_bindings(path)
    assert [binding.id for binding in loaded] == ["parcels", "other"]
    assert loaded[1].create is Create.ALWAYS_NEW


def test_load_bindings_reads_mappings_already_read() -> None:
    assert [binding.id for binding in load_bindings([BASE])] == ["parcels"]


def test_duplicate_ids_are_refused_naming_the_id(tmp_path: Path) -> None:
    with pytest.raises(BindingError, match="share this id") as error:
        load_bindings([BASE, {**BASE, "source": "elsewhere"}])
    assert refusal(error) == ("parcels", "id")
    path = tmp_path / "twice.json"
    path.write_text(json.dumps([BASE, BASE]), encoding="utf-8")
    with pytest.raises(BindingError, match="'parcels'"):
        load_bindings(path)


def test_a_malformed_binding_in_a_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(TOML.replace('order = "none"', "batch = 10"), encoding="utf-8")
    with pytest.raises(BindingError) as error:
        load_bindings(path)
    assert refusal(error) == ("deliveries", "batch")


@pytest.mark.parametrize(
    ("name", "text"),
    [("broken.toml", "[[bindings]\n"), ("broken.json", "[{"), ("scalar.json", '"x"')],
)
def test_an_unreadable_file_is_refused(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BindingError, match=name):
        load_bindings(path)


def test_load_bindings_refuses_a_string_path() -> None:
    """A ``str`` could be a path or file content: it is refused rather than guessed."""
    with pytest.raises(TypeError):
        load_bindings("bindings.toml")


# --- match ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match", "held"),
    [
        ("true", True),
        ("event.kind == 'scan'", True),
        ("false", False),
        ("event.kind == 'other'", False),
        ("null", False),
        ("event.missing", False),
        ("event.kind.deeper", False),
    ],
)
def test_match_holds_only_when_it_answers_exactly_true(match: str, held: bool) -> None:
    """Three-valued: false, null and undefined all mean "not for this binding"."""
    binding = make(match=match)
    event = {"kind": "scan", "parcel_id": "p1"}
    assert binding.matches(event) is held
    assert binding.evaluate(event) == (Keyed("p1") if held else None)


@pytest.mark.parametrize(
    ("match", "reason"),
    [
        ("len(5) > 0", "match error: EvaluationError "),
        ("'yes'", "match value: string "),
        ("1", "match value: integer 1"),
        ("[true]", "match value: list "),
    ],
)
def test_a_match_that_errs_or_answers_a_non_boolean_is_a_refusal(match: str, reason: str) -> None:
    """Neither is silently a "no": the ledger says the binding could not decide."""
    binding = make(match=match)
    answer = binding.evaluate({"kind": "scan", "parcel_id": "p1"})
    assert isinstance(answer, ProgramFailed)
    assert answer.program == "match"
    assert answer.reason.startswith(reason)


# --- key ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "parcel_id", "expected"),
    [
        ("event.parcel_id", "1042771", "1042771"),
        ("event.parcel_id", " 1042771 ", " 1042771 "),
        ("trim(event.parcel_id::string)", 1042771, "1042771"),
        ("trim(event.parcel_id::string)", " 1042771 ", "1042771"),
        ("'parcel-' + event.parcel_id", "7", "parcel-7"),
    ],
)
def test_a_key_is_used_exactly_as_answered(key: str, parcel_id: Value, expected: str) -> None:
    """The router never normalizes: ``" 1042771 "`` stays with its spaces unless the
    program trims it, and a program can make a number and a padded string one key."""
    binding = make(match="true", key=key)
    assert binding.evaluate({"parcel_id": parcel_id}) == Keyed(expected)


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("event.missing", "key value: undefined"),
        ("null", "key value: null"),
        ("''", "key value: empty string"),
        ("trim('   ')", "key value: empty string"),
        ("1042771", "key value: integer 1042771"),
        ("1.5", "key value: float 1.5"),
        ("['a']", "key value: list "),
        ("true", "key value: boolean "),
        ("len(5)", "key error: EvaluationError "),
    ],
)
def test_a_key_that_is_not_a_non_empty_string_is_refused(key: str, reason: str) -> None:
    binding = make(match="true", key=key)
    answer = binding.evaluate({"parcel_id": "p1"})
    assert isinstance(answer, ProgramFailed)
    assert answer.program == "key"
    assert answer.reason.startswith(reason)


def test_the_key_is_not_evaluated_when_the_match_fails() -> None:
    """A key that would be refused does not matter to an event the binding ignores."""
    assert make(match="false", key="event.missing").evaluate({}) is None


# --- data -----------------------------------------------------------------------------


def test_project_copies_the_listed_paths_and_nothing_else() -> None:
    binding = make(data=("parcel_id", "where.city", "where.zip", "note", "missing", "kind.x"))
    event: dict[str, Value] = {
        "kind": "scan",
        "parcel_id": "p1",
        "where": {"city": "Lyon", "zip": None, "street": "secret"},
        "note": None,
        "ip": "10.0.0.1",
    }
    assert binding.project(event) == {
        "parcel_id": "p1",
        "where": {"city": "Lyon", "zip": None},
        "note": None,
    }


def test_project_without_data_is_empty() -> None:
    assert make().project({"parcel_id": "p1"}) == {}


SEGMENT = st.sampled_from(["a", "b", "c", "d"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(SEGMENT | st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
PATHS = st.lists(st.lists(SEGMENT, min_size=1, max_size=3).map(".".join), max_size=5)


def _leaves(value: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, item in value.items():
        path = (*prefix, name)
        if isinstance(item, Mapping) and item:
            found.extend(_leaves(item, path))
        else:
            found.append(path)
    return found


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@settings(max_examples=300, deadline=None, database=None)
@given(event=st.dictionaries(SEGMENT | st.text(max_size=3), JSON, max_size=5), paths=PATHS)
def test_project_returns_only_listed_paths_and_never_raises(
    event: dict[str, Any], paths: list[str]
) -> None:
    """For any JSON-like event: every leaf of the projection lies under a listed path,
    every listed path the event holds is carried with its value, and the event itself
    is left as it was."""
    before = copy.deepcopy(event)
    projected = make(data=paths).project(event)
    listed = [tuple(path.split(".")) for path in paths]
    for leaf in _leaves(projected):
        assert any(leaf[: len(path)] == path for path in listed), (leaf, listed)
    for path in listed:
        try:
            expected = _at(event, path)
        except (KeyError, TypeError, IndexError):
            continue
        assert _at(projected, path) == expected
    assert event == before
