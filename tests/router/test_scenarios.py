"""``statifier scenario``: routing cases run through the real command, the corpus in
``tests/router/scenarios/`` and the examples in ``examples/``, each with the report it
expects; script cases with routes, timers and sends, and publish cases."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import unique_name

from statifier.cli import main
from statifier.core import Event
from statifier.core.positions import load_event
from statifier.expr.tagged import encode
from statifier.persistence import Storage
from statifier.persistence.sql import SqlAdapter
from statifier.router import Router
from statifier.router import scenario as scenario_module
from statifier.router.routes import IdempotencyKey
from statifier.router.scenario import (
    MAX_CASE_BYTES,
    MAX_STEPS,
    REPORT_KEYS,
    RecordingRoute,
    compare,
    parse_duration,
)
from statifier.sql import TableOptions, migrations

ROOT = Path(__file__).parent.parent.parent
CORPUS = Path(__file__).parent / "scenarios"
CHARTS = CORPUS / "charts"
CASES = [
    *((path, CHARTS) for path in sorted(CORPUS.glob("*.json"))),
    *((path, path.parent / "charts") for path in sorted((ROOT / "examples").glob("*/*.json"))),
]
JOIN_CASE = CORPUS / "join_impression_then_click.json"
SPELLINGS = {
    "delivered",
    "created_and_delivered",
    "buffered",
    "duplicate",
    "key_refused",
    "dropped: no_execution",
    "dropped: finished",
    "dropped: unmatched_event",
    "send_refused",
}
CONTRACT_LISTS = (
    "unsupported_types",
    "unregistered_routes",
    "unchecked",
    "undeclared_events",
    "undeclared_binding_events",
)


def scenario(
    capsys: pytest.CaptureFixture[str], case: Path, *options: str, charts: Path = CHARTS
) -> tuple[int, str, str]:
    """Run ``statifier scenario``: its exit status, stdout and stderr."""
    out = io.StringIO()
    status = main(["scenario", str(case), "--charts", str(charts), *options], out)
    return status, out.getvalue(), capsys.readouterr().err


def load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def write_case(path: Path, case: object) -> Path:
    path.write_text(json.dumps(case), encoding="utf-8")
    return path


def ledger_times(url: str | sa.URL, prefix: str = "statifier_") -> list[datetime]:
    ledger = TableOptions(prefix=prefix).define().routing_ledger
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            query = sa.select(ledger.c.inserted_at).order_by(ledger.c.id)
            return [row[0] for row in connection.execute(query)]
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("case", "charts"), CASES, ids=[str(case.relative_to(ROOT)) for case, _ in CASES]
)
def test_every_case_gives_the_report_it_expects(
    capsys: pytest.CaptureFixture[str], case: Path, charts: Path
) -> None:
    status, out, err = scenario(capsys, case, charts=charts)
    assert (status, err) == (0, "")
    report = json.loads(out)
    expected = load(case)["expected"]
    assert {key: report[key] for key in expected} == expected


def test_the_corpus_expects_every_report_key_and_shows_every_outcome() -> None:
    cases = [load(path) for path in sorted(CORPUS.glob("*.json"))]
    scripted = [case for case in cases if "declarations" not in case]
    assert len(scripted) >= 12
    assert all(set(case["expected"]) == set(REPORT_KEYS) for case in scripted)
    shown = {row["outcome"] for case in scripted for row in case["expected"]["ledger"]}
    assert shown == SPELLINGS
    # Final states, of the case's execution and of each other one a run touched.
    reports = [case["expected"] for case in scripted]
    assert any(report["final_state"] for report in reports)
    assert any(len(report["executions"]) > 1 for report in reports)


def test_the_corpus_shows_routes_timers_and_sends() -> None:
    """Hand-offs to routes (and on_complete's), refusals, pending timers, and sends to
    execution targets all appear in some case's expected report."""
    cases = [load(path) for path in sorted(CORPUS.glob("*.json"))]
    expected = [case["expected"] for case in cases if "declarations" not in case]
    sent = {send["event"]["name"] for report in expected for send in report["sends"]}
    assert {"click.joined", "done.execution", "timer.fired"} <= sent
    assert any(report["timers"] for report in expected)
    rows = [row for report in expected for row in report["ledger"]]
    assert {"route", "execution"} <= {row["binding"] for row in rows}
    assert any(case.get("on_complete") for case in cases)


def test_the_corpus_has_a_publish_case_for_every_contracts_list() -> None:
    cases = [load(path) for path in sorted(CORPUS.glob("*.json"))]
    publish = [case for case in cases if "declarations" in case]
    reports = [case["expected"]["contracts"] for case in publish]
    assert all(set(case["expected"]) == {"contracts"} for case in publish)
    assert all(list(report) == list(CONTRACT_LISTS) for report in reports)
    for name in CONTRACT_LISTS:
        # A case where this list is the only one with findings.
        assert any(
            report[name] and not any(report[other] for other in CONTRACT_LISTS if other != name)
            for report in reports
        ), name
    assert any(not any(report.values()) for report in reports)
    findings = [f for report in reports for entries in report.values() for f in entries]
    assert all(("binding_id" in f) != ("location" in f) for f in findings)


def test_a_wrong_expectation_prints_the_report_and_one_line_per_differing_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    case = load(JOIN_CASE)
    case["expected"]["status"] = "active"
    case["expected"]["ledger"][1]["outcome"] = "dropped: finished"
    status, out, err = scenario(capsys, write_case(tmp_path / "wrong.json", case))
    assert status == 1
    assert json.loads(out)["status"] == "completed"
    where = f"statifier scenario: {tmp_path / 'wrong.json'}"
    assert err.splitlines() == [
        (
            f'{where}: ledger[1]: expected {{"binding": "clicks_to_join", "key": "imp_7f3a", '
            '"message_id": "ad_events/0/2", "outcome": "dropped: finished"}, got '
            '{"binding": "clicks_to_join", "key": "imp_7f3a", "message_id": "ad_events/0/2", '
            '"outcome": "delivered"}'
        ),
        f'{where}: status: expected "active", got "completed"',
    ]


def test_a_case_without_expectations_prints_its_report_and_exits_zero(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    case = load(JOIN_CASE)
    del case["expected"]
    status, out, err = scenario(capsys, write_case(tmp_path / "open.json", case))
    assert (status, err) == (0, "")
    assert json.loads(out)["status"] == "completed"


def test_compare_is_exact_about_json_types() -> None:
    report = {"datamodel": {"n": 1}, "configuration": ["a", "b"]}
    assert compare(report, {"datamodel": {"n": 1}, "configuration": ["a", "b"]}) == []
    assert compare(report, {"datamodel": {"n": True}}) == [
        'datamodel: expected {"n": true}, got {"n": 1}'
    ]
    assert compare(report, {"datamodel": {"n": 1.0}}) == [
        'datamodel: expected {"n": 1.0}, got {"n": 1}'
    ]
    assert compare(report, {"configuration": ["a"]}) == [
        'configuration[1]: expected nothing, got "b"'
    ]


def _case(**changes: object) -> dict[str, Any]:
    case = load(JOIN_CASE)
    case.update(changes)
    return {key: value for key, value in case.items() if value is not None}


def _publish(**changes: object) -> dict[str, Any]:
    case: dict[str, Any] = {"document": "order_desk", "declarations": {"shipment": None}}
    case.update(changes)
    return case


def _deliver(**fields: object) -> dict[str, object]:
    return {"deliver": {"source": "ad_events", "message_id": "m1", "data": {}, **fields}}


_BINDING = load(JOIN_CASE)["bindings"][0]

MALFORMED: list[tuple[str, str, str]] = [
    ("not_json", '{"document": "impression_click_join",', "not valid JSON"),
    ("not_an_object", "[1, 2]", "a case is a JSON object, not list"),
    ("key_twice", '{"scope": "a", "scope": "b"}', "the key 'scope' is given twice"),
    ("unknown_key", json.dumps(_case(owner="me")), "unknown key 'owner'"),
    ("missing_key", json.dumps(_case(script=None)), "the key 'script' is required"),
    ("no_bindings", json.dumps(_case(bindings=None)), "the key 'bindings' is required"),
    ("empty_send_type", json.dumps(_case(send_type="")), "send_type must be a non-empty string"),
    (
        "built_in_send_type",
        json.dumps(_case(send_type="basichttp")),
        "send_type 'basichttp' is a built-in send type",
    ),
    ("empty_scope", json.dumps(_case(scope="")), "scope must be a non-empty string"),
    ("unknown_step", json.dumps(_case(script=[{"jump": "PT1S"}])), "unknown step 'jump'"),
    ("two_key_step", json.dumps(_case(script=[{"reap": "dedupe", "advance": "PT1S"}])), "one key"),
    ("months", json.dumps(_case(script=[{"advance": "P1M"}])), "'P1M' is not a duration"),
    ("reap_what", json.dumps(_case(script=[{"reap": "all"}])), 'reap is "addresses" or "dedupe"'),
    ("no_message_id", json.dumps(_case(script=[_deliver(message_id=None)])), "message_id"),
    ("empty_source", json.dumps(_case(script=[_deliver(source="")])), "needs a source"),
    ("data_list", json.dumps(_case(script=[_deliver(data=[1])])), "data must be a JSON object"),
    ("deliver_extra", json.dumps(_case(script=[_deliver(at="x")])), "unknown key 'at'"),
    (
        "binding_refused",
        json.dumps(_case(bindings=[{**_BINDING, "create": "sometimes"}])),
        "bindings[0]: binding 'impressions_to_join', field 'create'",
    ),
    (
        "binding_reserved",
        json.dumps(_case(bindings=[{**_BINDING, "id": "execution"}])),
        "reserved for the router's own ledger rows",
    ),
    (
        "bindings_share_an_id",
        json.dumps(_case(bindings=[_BINDING, _BINDING])),
        "two bindings share this id",
    ),
    ("no_chart", json.dumps(_case(document="invoices")), "no chart for document 'invoices'"),
    (
        "binding_chart_missing",
        json.dumps(_case(bindings=[{**_BINDING, "document": "invoices"}])),
        "no chart for document 'invoices'",
    ),
    ("expected_key", json.dumps(_case(expected={"effects": []})), "expected: unknown key"),
    ("bad_start", json.dumps(_case(start="2026-01-01T00:00:00")), "start: '2026-01-01T00:00:00'"),
    (
        "too_many_steps",
        json.dumps(_case(script=[{"advance": "PT1S"}] * (MAX_STEPS + 1))),
        f"more than {MAX_STEPS}",
    ),
    ("too_big", " " * MAX_CASE_BYTES + "{}", f"larger than {MAX_CASE_BYTES} bytes"),
    ("routes_not_a_list", json.dumps(_case(routes="sink")), "routes must be a list of route names"),
    ("route_scheme", json.dumps(_case(routes=["https://x"])), "routes[0]: a route name is"),
    ("route_fragment", json.dumps(_case(routes=["#_parent"])), "routes[0]: a route name is"),
    ("route_execution", json.dumps(_case(routes=["execution"])), "the router's execution target"),
    ("route_twice", json.dumps(_case(routes=["sink", "sink"])), "routes[1]: 'sink' is named twice"),
    (
        "on_complete_unrouted",
        json.dumps(_case(routes=["sink"], on_complete="done")),
        'on_complete must name one of routes, not "done"',
    ),
    (
        "declarations_and_script",
        json.dumps(_case(declarations={})),
        "a case with declarations is a publish case: it has no script",
    ),
    (
        "publish_scope",
        json.dumps(_publish(scope="tenant_a")),
        "unknown key 'scope' of a publish case",
    ),
    (
        "declarations_shape",
        json.dumps(_publish(declarations={"shipment": "shipment.requested"})),
        "declarations['shipment'] must be a list of event names or null",
    ),
    (
        "declarations_not_object",
        json.dumps(_publish(declarations=["shipment"])),
        "declarations must be an object",
    ),
    (
        "publish_expected_ledger",
        json.dumps(_publish(expected={"ledger": []})),
        "expected: unknown key 'ledger' (one of contracts)",
    ),
    (
        "script_expected_contracts",
        json.dumps(_case(expected={"contracts": {}})),
        "expected: unknown key 'contracts'",
    ),
    ("publish_no_chart", json.dumps(_publish(document="invoices")), "no chart for document"),
]


@pytest.mark.parametrize(
    ("text", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_case_exits_two_with_one_line_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    status, out, err = scenario(capsys, path)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"statifier scenario: {path}: ")
    assert message in err


def test_an_unreadable_case_file_exits_two(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = scenario(capsys, tmp_path / "absent.json")
    assert (status, out) == (2, "")
    where = f"statifier scenario: {tmp_path / 'absent.json'}"
    assert err == f"{where}: cannot read: No such file or directory\n"


def test_an_invalid_chart_in_the_directory_exits_two_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for chart in CHARTS.glob("*.scxml"):
        (tmp_path / chart.name).write_bytes(chart.read_bytes())
    (tmp_path / "broken.scxml").write_text("<scxml", encoding="utf-8")
    status, out, err = scenario(capsys, JOIN_CASE, charts=tmp_path)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert f"chart {tmp_path / 'broken.scxml'}:" in err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT24H", 86_400.0), ("P3D", 259_200.0), ("PT0.5S", 0.5), ("P1DT2H3M4.5S", 93_784.5)],
)
def test_durations_of_days_hours_minutes_and_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["P1M", "P1Y", "P2W", "P", "PT", "P1DT", "-PT1S", "PT1H30", 5])
def test_other_durations_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="is not a duration of the form PnDTnHnMnS"):
        parse_duration(text)


def test_the_given_sqlite_database_is_migrated_and_kept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Run twice on one file: the second run sees the first one's rows, and its
    redeliveries (same message ids, same clock) are duplicates."""
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    first = scenario(capsys, JOIN_CASE, "--database", url)
    second = scenario(capsys, JOIN_CASE, "--database", url)
    assert first[0] == 0
    assert second[0] == 1
    outcomes = [row["outcome"] for row in json.loads(second[1])["ledger"]]
    assert outcomes == ["created_and_delivered", "delivered", "duplicate", "duplicate"]
    assert "ledger[2]: expected nothing" in second[2]


def test_the_clock_starts_at_the_option_else_the_case_else_new_year(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    case = CORPUS / "parcel_carrier_first_finishes_at_once.json"
    assert load(case)["start"] == "2026-11-28T09:30:00+01:00"
    runs: dict[str, tuple[Path, tuple[str, ...]]] = {
        "option": (case, ("--start", "2027-03-01T12:00:00Z")),
        "case": (case, ()),
        "default": (JOIN_CASE, ()),
    }
    firsts = {}
    for name, (path, options) in runs.items():
        url = f"sqlite:///{tmp_path / name}.db"
        assert scenario(capsys, path, "--database", url, *options)[0] == 0
        firsts[name] = ledger_times(url)[0]
    assert firsts == {
        "option": datetime(2027, 3, 1, 12, tzinfo=UTC),
        "case": datetime(2026, 11, 28, 8, 30, tzinfo=UTC),
        "default": datetime(2026, 1, 1, tzinfo=UTC),
    }


def test_advance_moves_the_clock_between_deliveries(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'advanced.db'}"
    case = CORPUS / "join_reap_within_horizon_keeps_address.json"
    assert scenario(capsys, case, "--database", url)[0] == 0
    start = datetime(2026, 1, 1, tzinfo=UTC)
    later = datetime(2026, 1, 1, 0, 59, 59, 999_000, tzinfo=UTC)
    assert ledger_times(url) == [start, start, later]


@pytest.fixture
def postgresql_prefix(database_url: str) -> Iterator[str]:
    """A table prefix no other run uses, its tables dropped afterwards."""
    prefix = unique_name("scn_")
    try:
        yield prefix
    finally:
        options = TableOptions(prefix=prefix)
        migrations.downgrade(database_url, options)
        engine = sa.create_engine(migrations.sync_url(database_url))
        try:
            with engine.begin() as connection:
                connection.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}alembic_version"))
        finally:
            engine.dispose()


def test_a_case_runs_on_postgresql_under_a_prefix(
    capsys: pytest.CaptureFixture[str], database_url: str, postgresql_prefix: str
) -> None:
    case = CORPUS / "join_reap_past_horizon_new_execution.json"
    options = ("--database", database_url, "--prefix", postgresql_prefix)
    status, out, err = scenario(capsys, case, *options)
    assert (status, err) == (0, "")
    assert json.loads(out) == load(case)["expected"]
    times = ledger_times(migrations.sync_url(database_url), postgresql_prefix)
    assert len(times) == 3


def test_a_publish_case_reports_the_contracts_and_opens_no_database(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "never.db"
    case = CORPUS / "publish_undeclared_event.json"
    status, out, err = scenario(capsys, case, "--database", f"sqlite:///{path}")
    assert (status, err) == (0, "")
    assert json.loads(out) == load(case)["expected"]
    assert not path.exists()


def test_compare_names_each_differing_contracts_list() -> None:
    finding = {"event": "e", "document": "d", "reason": "targetexpr", "location": None}
    report: dict[str, Any] = {"contracts": {name: [] for name in CONTRACT_LISTS}}
    expected = {"contracts": {**report["contracts"], "unchecked": [finding]}}
    assert compare(report, expected) == [
        f"contracts.unchecked[0]: expected {json.dumps(finding, sort_keys=True)}, got nothing"
    ]
    assert compare(report, report) == []


def test_the_recording_route_records_the_name_and_tagged_data() -> None:
    sends: list[dict[str, Any]] = []
    route = RecordingRoute("sink", sends)
    key = IdempotencyKey(
        "ex_1", send_id="s", macrostep=1, microstep=1, round=0, content_index=0, ordinal=0
    )
    at = datetime(2026, 1, 2, tzinfo=UTC)
    route.deliver({}, Event("paid", data={"at": at, "n": 1}), key, None, None)
    route.deliver({}, Event("bare"), key, None, None)
    assert sends == [
        {"route": "sink", "event": {"name": "paid", "data": {"at": encode(at), "n": 1}}},
        {"route": "sink", "event": {"name": "bare", "data": encode(Event("bare").data)}},
    ]


def input_log(url: str, execution_id: str) -> list[tuple[str, str, datetime]]:
    """``(via, event name, recorded_at)`` of every input of an execution."""

    async def read() -> list[tuple[str, str, datetime]]:
        async with SqlAdapter(url) as adapter:
            inputs = await Storage(adapter).inputs(execution_id)
        return [
            (i.via, load_event(i.event).name, i.recorded_at) for i in inputs if i.event is not None
        ]

    return asyncio.run(read())


def test_advance_moves_the_clock_to_each_fire(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One advance of 25 hours fires the reminder at 10h, and the one that fire armed
    at 20h: each step runs at its timer's due time, not at the advance's end."""
    url = f"sqlite:///{tmp_path / 'reminders.db'}"
    case = CORPUS / "reminders_rearmed_from_each_fire.json"
    assert scenario(capsys, case, "--database", url)[0] == 0
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [(via, name, at - start) for via, name, at in input_log(url, "ex_1")] == [
        ("step", "order.placed", timedelta(0)),
        ("timer", "payment.reminder", timedelta(hours=10)),
        ("timer", "payment.reminder", timedelta(hours=20)),
    ]


def test_executions_are_numbered_past_those_the_database_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    first = CORPUS / "order_desk_and_shipment_execution_targets.json"
    assert scenario(capsys, first, "--database", url)[0] == 0
    status, out, _ = scenario(
        capsys, CORPUS / "window_unregistered_route_refused.json", "--database", url
    )
    assert status == 1  # its refusal names ex_3, not the ex_1 of a fresh database
    refused = [row for row in json.loads(out)["ledger"] if row["outcome"] == "send_refused"]
    assert [row["message_id"].split("/")[0] for row in refused] == ["ex_3"]


def test_a_timer_whose_fire_raises_fails_the_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("the sink is down")

    monkeypatch.setattr(RecordingRoute, "deliver", broken)
    case = CORPUS / "due_now_self_send_settles_with_its_step.json"
    status, out, err = scenario(capsys, case)
    assert (status, out) == (2, "")
    assert err == (
        f"statifier scenario: {case}: script[0]: the timer 'settled' due at "
        "2026-01-01T00:00:00+00:00 failed to fire\n"
    )


PING = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <state id="s">
    <onentry><send event="ping"/></onentry>
    <transition event="ping"><send event="ping"/></transition>
  </state>
</scxml>"""


def test_a_chart_that_keeps_sending_to_itself_fails_the_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(scenario_module, "MAX_FIRES", 25)
    (tmp_path / "ping.scxml").write_text(PING, encoding="utf-8")
    binding = {"id": "b", "source": "s", "match": "true", "key": "'k'", "document": "ping"}
    case = {
        "document": "ping",
        "scope": "tenant_a",
        "bindings": [{**binding, "event": "start"}],
        "script": [{"advance": "PT1S"}, {"deliver": {"source": "s", "message_id": "m1"}}],
    }
    status, out, err = scenario(capsys, write_case(tmp_path / "ping.json", case), charts=tmp_path)
    assert (status, out) == (2, "")
    assert err.endswith(": script[1]: more than 25 timers fired in one step\n")


@pytest.mark.parametrize(
    "name", ["due_order_fires_by_time_then_position", "order_desk_and_shipment_execution_targets"]
)
def test_timers_and_execution_targets_run_on_postgresql(
    capsys: pytest.CaptureFixture[str], database_url: str, postgresql_prefix: str, name: str
) -> None:
    case = CORPUS / f"{name}.json"
    options = ("--database", database_url, "--prefix", postgresql_prefix)
    status, out, err = scenario(capsys, case, *options)
    assert (status, err) == (0, "")
    assert json.loads(out) == load(case)["expected"]


# Schedules: a case's schedules put at its start and fired on the virtual clock.

SCHEDULE_CASES = sorted(CORPUS.glob("schedule_*.json"))
SWEEP_CASE = CORPUS / "schedule_every_sweeps_one_parcel.json"
_SWEEP = load(SWEEP_CASE)


def _sweep(**changes: object) -> dict[str, Any]:
    case = {key: value for key, value in _SWEEP.items() if key not in ("description", "expected")}
    case.update(changes)
    return case


def _schedule(**fields: object) -> dict[str, Any]:
    return {**_SWEEP["schedules"][0], **fields}


def _without(entry: dict[str, Any], field: str) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key != field}


def test_the_corpus_shows_schedules_every_policy_a_pause_and_downtime() -> None:
    cases = [load(path) for path in SCHEDULE_CASES]
    schedules = [entry for case in cases for entry in case["schedules"]]
    assert {entry.get("catch_up", "skip") for entry in schedules} == {"skip", "one", "all"}
    assert any(entry.get("paused") for entry in schedules)
    assert {"cron", "every"} <= {key for entry in schedules for key in entry}
    assert any(entry.get("timezone", "UTC") != "UTC" for entry in schedules)
    assert any("down" in step for case in cases for step in case["script"])
    # Every case shows fires in its ledger, under their message ids NAME/<fire time>.
    for case in cases:
        names = {entry["id"] for entry in case["schedules"]}
        fired = [
            row for row in case["expected"]["ledger"] if row["message_id"].split("/")[0] in names
        ]
        assert fired, case["description"]


@pytest.mark.parametrize(
    ("name", "made"),
    [
        # Each fire of an advance is made at its own instant, not at the advance's end.
        ("schedule_every_sweeps_one_parcel", ["00:15", "01:15", "02:15", "03:15"]),
        # After the downtime, the fire caught up is made when the service is back.
        ("schedule_catch_up_one_after_downtime", ["01:00", "02:00", "03:00", "06:30", "07:00"]),
        (
            "schedule_catch_up_all_within_window",
            ["01:00", "02:00", "03:00", "06:30", "06:30", "07:00"],
        ),
    ],
)
def test_each_fire_steps_the_execution_at_the_instant_it_is_made(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, made: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'fires.db'}"
    assert scenario(capsys, CORPUS / f"{name}.json", "--database", url)[0] == 0
    scans = [(via, at) for via, event, at in input_log(url, "ex_1") if event == "parcel.scanned"]
    assert [(via, at.strftime("%H:%M")) for via, at in scans] == [("step", at) for at in made]


def test_down_holds_the_timers_too_and_the_next_step_fires_them_late(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The reminder due at 10h is not fired while down; the advance of zero at 25h
    fires it then, and the reminder it arms is timed from that fire (35h)."""
    case = load(CORPUS / "reminders_rearmed_from_each_fire.json")
    del case["expected"]
    case["script"] = [case["script"][0], {"down": "PT25H"}, {"advance": "PT0S"}]
    url = f"sqlite:///{tmp_path / 'down.db'}"
    status, out, _ = scenario(capsys, write_case(tmp_path / "down.json", case), "--database", url)
    assert status == 0
    assert json.loads(out)["datamodel"]["reminders"] == 1
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [(name, at - start) for _, name, at in input_log(url, "ex_1")] == [
        ("order.placed", timedelta(0)),
        ("payment.reminder", timedelta(hours=25)),
    ]


def test_the_schedules_scope_is_the_cases_unless_it_names_one() -> None:
    case = scenario_module.Case.from_mapping(
        _sweep(
            schedules=[
                _schedule(id="here"),
                _schedule(id="there", scope="depot_9", every="PT2H", paused=True),
            ]
        )
    )
    assert [(s.name, s.scope, s.every, s.paused) for s in case.schedules] == [
        ("here", "depot_7", timedelta(hours=1), False),
        ("there", "depot_9", timedelta(hours=2), True),
    ]
    assert scenario_module.Case.from_mapping(_without(_sweep(), "schedules")).schedules == ()


SCHEDULE_MALFORMED: list[tuple[str, object, str]] = [
    ("not_a_list", {"id": "s"}, "schedules must be a list of schedule objects"),
    ("not_an_object", ["hourly"], 'schedules[0]: a schedule is an object with an id, not "hourly"'),
    ("no_id", [{"every": "PT1H", "source": "s"}], "schedules[0]: id must be a non-empty string"),
    ("twice", [_schedule(), _schedule()], "schedules[1]: 'hub_sweep' is named twice"),
    ("bad_name", [_schedule(id="a/b")], "schedules[0]: a schedule's name is letters"),
    (
        "unknown_field",
        [_schedule(catchup="all")],
        "schedules[0]: schedule 'hub_sweep': unknown field 'catchup'",
    ),
    (
        "every_months",
        [_schedule(every="P1M")],
        "schedules[0]: schedule 'hub_sweep': every: 'P1M' is not a duration",
    ),
    (
        "grace_text",
        [_schedule(grace="soon")],
        "schedules[0]: schedule 'hub_sweep': grace: 'soon' is not a duration",
    ),
    (
        "window_number",
        [_schedule(catch_up_window=3600)],
        "schedules[0]: schedule 'hub_sweep': catch_up_window: 3600 is not a duration",
    ),
    (
        "cron_fields",
        [_without(_schedule(cron="0 2 * *"), "every")],
        "schedules[0]: schedule 'hub_sweep': cron:",
    ),
    (
        "timezone_number",
        [_schedule(timezone=1)],
        "schedules[0]: schedule 'hub_sweep': timezone must be an IANA time zone name",
    ),
    (
        "timezone_unknown",
        [_schedule(timezone="Mars/Olympus")],
        "schedules[0]: schedule 'hub_sweep': timezone: unknown time zone 'Mars/Olympus'",
    ),
    (
        "cron_and_every",
        [_schedule(cron="0 * * * *")],
        "schedules[0]: schedule 'hub_sweep': give cron or every, one of them",
    ),
    (
        "catch_up_policy",
        [_schedule(catch_up="most")],
        "schedules[0]: schedule 'hub_sweep': catch_up is skip, one or all, not 'most'",
    ),
    (
        "no_source",
        [_without(_schedule(), "source")],
        "schedules[0]: schedule 'hub_sweep': source is required",
    ),
    (
        "reserved_data",
        [_schedule(data={"schedule": "x"})],
        "schedules[0]: schedule 'hub_sweep': data may not hold 'schedule'",
    ),
    (
        "paused_text",
        [_schedule(paused="yes")],
        "schedules[0]: schedule 'hub_sweep': paused is true or false",
    ),
    (
        "too_many",
        [_schedule(id=f"s{i}") for i in range(scenario_module.MAX_SCHEDULES + 1)],
        (
            f"schedules has {scenario_module.MAX_SCHEDULES + 1} entries, more than "
            f"{scenario_module.MAX_SCHEDULES}"
        ),
    ),
]


@pytest.mark.parametrize(
    ("schedules", "message"),
    [m[1:] for m in SCHEDULE_MALFORMED],
    ids=[m[0] for m in SCHEDULE_MALFORMED],
)
def test_a_malformed_schedule_exits_two_naming_it_and_its_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, schedules: object, message: str
) -> None:
    path = write_case(tmp_path / "bad.json", _sweep(schedules=schedules))
    status, out, err = scenario(capsys, path)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"statifier scenario: {path}: {message}")


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"down": "P1M"}, "script[0]: 'P1M' is not a duration"),
        ({"down": 60}, "script[0]: 60 is not a duration"),
        ({"sleep": "PT1H"}, 'unknown step \'sleep\' (one of "deliver", "advance", "down", "reap")'),
    ],
)
def test_a_malformed_down_step_exits_two(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, step: object, message: str
) -> None:
    path = write_case(tmp_path / "bad.json", _sweep(script=[step]))
    status, out, err = scenario(capsys, path)
    assert (status, out) == (2, "")
    assert message in err


def test_a_schedule_whose_fire_fails_fails_the_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the bindings are gone")

    monkeypatch.setattr(Router, "route_in", broken)
    path = write_case(tmp_path / "failing.json", _sweep(script=[{"advance": "PT2H"}]))
    status, out, err = scenario(capsys, path)
    assert (status, out) == (2, "")
    assert err == (
        f"statifier scenario: {path}: script[0]: the schedule 'hub_sweep' failed to fire at "
        "2026-01-01T00:15:00+00:00: RuntimeError: the bindings are gone\n"
    )


def test_a_schedule_firing_past_the_bound_in_one_step_fails_the_case(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(scenario_module, "MAX_FIRES", 5)
    case = _sweep(schedules=[_schedule(every="PT1M")], script=[{"advance": "PT1H"}])
    status, out, err = scenario(capsys, write_case(tmp_path / "busy.json", case))
    assert (status, out) == (2, "")
    assert err.endswith(": script[0]: more than 5 schedule fires in one step\n")


def test_a_kept_database_keeps_each_schedules_next_fire(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Run twice on one file from one start: the schedule is there, its next fire where
    the first run left it (05:15), so the second run's advances make none (fires made
    again would be duplicate rows)."""
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    assert scenario(capsys, SWEEP_CASE, "--database", url)[0] == 0
    status, out, _ = scenario(capsys, SWEEP_CASE, "--database", url)
    assert status == 1
    ledger = json.loads(out)["ledger"]
    sweeps = [row for row in ledger if row["message_id"].startswith("hub_sweep/")]
    first = _SWEEP["expected"]["ledger"]
    assert sweeps == [row for row in first if row["message_id"] != "carrier/1"]
    carrier = [row["outcome"] for row in ledger if row["message_id"] == "carrier/1"]
    assert carrier == ["delivered", "duplicate"]


@pytest.mark.parametrize(
    "name",
    ["schedule_catch_up_all_within_window", "schedule_and_timer_same_instant_timer_first"],
)
def test_schedules_run_on_postgresql(
    capsys: pytest.CaptureFixture[str], database_url: str, postgresql_prefix: str, name: str
) -> None:
    case = CORPUS / f"{name}.json"
    options = ("--database", database_url, "--prefix", postgresql_prefix)
    status, out, err = scenario(capsys, case, *options)
    assert (status, err) == (0, "")
    assert json.loads(out) == load(case)["expected"]


def test_the_documented_schedules_case_is_the_corpus_case() -> None:
    """docs/router.md shows a corpus case (without its description and expected) and
    the ledger it gives."""
    page = (ROOT / "docs" / "router.md").read_text(encoding="utf-8")
    section = page.split("### Schedules in a case", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```text\n")[1:]
    shown = json.loads(blocks[0].split("```", 1)[0])
    case = load(CORPUS / "schedule_catch_up_one_after_downtime.json")
    assert shown == {k: v for k, v in case.items() if k not in ("description", "expected")}
    for row in case["expected"]["ledger"]:
        assert row["message_id"] in blocks[1]


def test_the_corpus_shows_every_binding_mode_holding_and_delivering() -> None:
    """A case for each mode a binding holds events in; each holds some (``buffered``)
    and delivers them later, its flush filed under a held message's id."""
    cases = [load(path) for path in sorted(CORPUS.glob("*.json"))]
    modes: dict[str, list[dict[str, Any]]] = {}
    for case in cases:
        for binding in case.get("bindings", []):
            if binding.get("mode", "each") != "each":
                modes.setdefault(binding["mode"], []).append(case)
    assert set(modes) == {"debounce", "batch", "throttle"}
    for held in modes.values():
        for case in held:
            rows = case["expected"]["ledger"]
            buffered = {row["message_id"] for row in rows if row["outcome"] == "buffered"}
            later = [row for row in rows if row["outcome"] != "buffered"]
            assert buffered & {row["message_id"] for row in later}


# Over several stores (statifier.router.shards): the same reports.

SCRIPT_CASES = [(case, charts) for case, charts in CASES if "script" in load(case)]


@pytest.mark.parametrize(
    ("case", "charts"),
    SCRIPT_CASES,
    ids=[str(case.relative_to(ROOT)) for case, _ in SCRIPT_CASES],
)
def test_every_script_case_gives_the_same_report_over_three_stores(
    capsys: pytest.CaptureFixture[str], case: Path, charts: Path
) -> None:
    status, out, err = scenario(capsys, case, "--shards", "3", charts=charts)
    assert (status, err) == (0, "")
    loaded = scenario_module.Case.load(case)
    one = asyncio.run(scenario_module.run_case(loaded, charts))
    assert json.loads(out) == one


def test_a_send_between_stores_changes_only_the_ledgers_order_within_one_instant() -> None:
    case = CORPUS / "order_desk_and_shipment_execution_targets.json"
    loaded = scenario_module.Case.load(case)
    one = asyncio.run(scenario_module.run_case(loaded, CHARTS))
    # Over 16 stores the desk and its shipment are in different stores: the send between
    # them is handed over after the sender's step commits, so the shipment's ledger row
    # comes after the desk's, not before it.
    sixteen = asyncio.run(scenario_module.run_case(loaded, CHARTS, shards=16))
    assert {k: v for k, v in sixteen.items() if k != "ledger"} == {
        k: v for k, v in one.items() if k != "ledger"
    }
    assert sixteen["ledger"] != one["ledger"]

    def order(rows: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(row, sort_keys=True) for row in rows)

    assert order(sixteen["ledger"]) == order(one["ledger"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--shards", "0"), "--shards: from 1 to 16, not 0"),
        (("--shards", "17"), "--shards: from 1 to 16, not 17"),
        (("--shards", "2", "--database", "sqlite:///x.db"), "give no --database"),
    ],
)
def test_shards_out_of_bounds_or_with_a_database_exit_two(
    capsys: pytest.CaptureFixture[str], options: tuple[str, ...], message: str
) -> None:
    status, out, err = scenario(capsys, JOIN_CASE, *options)
    assert (status, out) == (2, "")
    assert message in err
