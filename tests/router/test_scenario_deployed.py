"""Routing cases of the charts one deploys: a case's own ``send_type``, a serve file's
charts, bindings, routes and send type (``statifier scenario --config``, and
:class:`~statifier.router.scenario.Deployment` through the library), the sends no
handler takes listed and failing a case that expects ``sends``, and the final state of
every execution a run touched; on SQLite and PostgreSQL, through ``run_case`` and the
command line."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from tests.persistence.conftest import SQL_BACKENDS, unique_name

from statifier.chart import compile_chart
from statifier.cli import main
from statifier.router import Binding
from statifier.router.scenario import (
    Case,
    CaseError,
    Deployment,
    RecordingRoute,
    compare,
    run_case,
    unhandled_line,
    warning_lines,
)
from statifier.sql import TableOptions, migrations

DEPLOYED = Path(__file__).parent / "scenarios" / "deployed"
CONFIG = DEPLOYED / "statifier.toml"
CHARTS = DEPLOYED / "charts"
PAID = DEPLOYED / "paid.json"
EXPIRED = DEPLOYED / "expired.json"
DATABASE_ENV = "SHOP_DATABASE_URL"
"""The variable the serve file reads its database's URL from."""

ORDERS_BINDING = {
    "id": "orders_to_checkout",
    "source": "shop",
    "match": 'event.kind == "placed"',
    "key": "event.order_id",
    "document": "checkout",
    "event": "order.placed",
    "data": ["order_id", "total"],
}
PAYMENTS_BINDING = {
    "id": "payments_to_checkout",
    "source": "payments",
    "match": 'event.kind == "captured"',
    "key": "event.order_id",
    "document": "checkout",
    "event": "payment.received",
    "create": "never",
    "data": ["order_id"],
}
ROUTES = {
    "invoices": {"queue": "billing", "target": "invoice-service"},
    "receipts": {"queue": "billing", "target": "receipt-mailer"},
    "finished_orders": {"queue": "orders_done"},
}
UNHANDLED = [
    {
        "step": 0,
        "execution": "ex_1",
        "type": "shop:route",
        "target": "invoices",
        "event": "invoice.requested",
    },
    {
        "step": 2,
        "execution": "ex_1",
        "type": "shop:route",
        "target": "receipts",
        "event": "receipt.requested",
    },
]
"""The checkout's sends to routes when the case's router has another send type."""


def load_json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def deployment() -> Deployment:
    """The serve file's values, spelled by hand: what the command line hands over."""
    return Deployment(
        file="statifier.toml",
        documents={"checkout": compile_chart((CHARTS / "checkout.scxml").read_bytes())},
        bindings=(Binding.from_mapping(ORDERS_BINDING), Binding.from_mapping(PAYMENTS_BINDING)),
        send_type="shop:route",
        routes=ROUTES,
        on_complete="finished_orders",
    )


def retyped(**changes: object) -> dict[str, Any]:
    """The paid case as it had to be written before: its bindings and routes retyped as
    JSON, run on the charts directory; ``None`` removes a key."""
    case = load_json(PAID)
    del case["expected"]
    case.update(
        bindings=[ORDERS_BINDING, PAYMENTS_BINDING],
        routes=["invoices", "receipts", "finished_orders"],
        on_complete="finished_orders",
    )
    case.update(changes)
    return {key: value for key, value in case.items() if value is not None}


@dataclass(frozen=True)
class Database:
    """Where a run keeps its tables: a URL and a table prefix."""

    url: str
    prefix: str


@pytest.fixture(params=SQL_BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A SQLite file of this test, or PostgreSQL under a prefix no other run uses (its
    tables dropped afterwards)."""
    if request.param == "sqlite":
        yield Database(f"sqlite:///{tmp_path / 'scenario.db'}", "statifier_")
        return
    url: str = request.getfixturevalue("database_url")
    prefix = unique_name("scd_")
    try:
        yield Database(url, prefix)
    finally:
        migrations.downgrade(url, TableOptions(prefix=prefix))
        engine = sa.create_engine(migrations.sync_url(url))
        try:
            with engine.begin() as connection:
                connection.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}alembic_version"))
        finally:
            engine.dispose()


def run(case: Case, charts: Path | Deployment, database: Database | None = None) -> dict[str, Any]:
    url, prefix = (None, "statifier_") if database is None else (database.url, database.prefix)
    return asyncio.run(run_case(case, charts, url, prefix=prefix))


# The library: run_case on a Deployment, and a case's own send type.


@pytest.mark.parametrize("path", [PAID, EXPIRED], ids=["paid", "expired"])
def test_a_case_runs_on_a_deployment_and_reports_each_final_state(
    database: Database, path: Path
) -> None:
    report = run(Case.load(path), deployment(), database)
    assert report == load_json(path)["expected"]


def test_a_deployments_routes_record_their_configuration() -> None:
    report = run(Case.load(PAID), deployment())
    assert [(send["route"], send["config"]) for send in report["sends"]] == [
        ("invoices", ROUTES["invoices"]),
        ("receipts", ROUTES["receipts"]),
        ("finished_orders", ROUTES["finished_orders"]),
    ]


def test_a_chart_of_another_send_type_lists_its_sends_and_fails_expected_sends(
    database: Database,
) -> None:
    """The checkout written for shop:route, run under the scenario's default type: its
    sends reach no route. They are listed (step, execution, type, target, event),
    refused as serve refuses them, and the case expecting its sends fails on each."""
    case = Case.from_mapping(retyped(expected={"sends": [], "final_state": "paid"}))
    report = run(case, CHARTS, database)
    assert report["sends"] == [
        {
            "route": "finished_orders",
            "event": {"name": "done.execution", "data": {"order_id": "o-17", "outcome": "paid"}},
        }
    ]
    assert report["unhandled_sends"] == UNHANDLED
    assert report["final_state"] == "paid"
    # The chart heard the refusal of its first send, as error.communication.
    assert report["datamodel"]["failure"] == (
        "nothing delivers a send of type 'shop:route' to 'invoices' from a durable execution"
    )
    assert case.expected is not None
    done = '{"event": {"data": {"order_id": "o-17", "outcome": "paid"}, "name": "done.execution"}'
    assert compare(report, case.expected) == [
        f'sends[0]: expected nothing, got {done}, "route": "finished_orders"}}',
        *(
            f"sends: script[{step}]: ex_1 sent '{event}' to '{target}' with type "
            "'shop:route', which the scenario does not handle"
            for step, event, target in [
                (0, "invoice.requested", "invoices"),
                (2, "receipt.requested", "receipts"),
            ]
        ),
    ]
    assert warning_lines(report, case.expected) == []


def test_unhandled_sends_fail_a_case_whose_expected_sends_match() -> None:
    """Expecting exactly the sends that did arrive is not enough: the unhandled ones
    still fail the case."""
    report = run(Case.from_mapping(retyped()), CHARTS)
    expected = {"sends": report["sends"]}
    assert compare(report, expected) == [f"sends: {unhandled_line(s)}" for s in UNHANDLED]


def test_a_case_without_expected_sends_is_warned_of_each_unhandled_send() -> None:
    report = run(Case.from_mapping(retyped()), CHARTS)
    lines = [f"warning: {unhandled_line(s)}" for s in UNHANDLED]
    assert warning_lines(report, None) == lines
    assert warning_lines(report, {"status": "completed"}) == lines
    assert compare(report, {"status": "completed"}) == []


def test_a_case_naming_the_deployments_send_type_reaches_its_routes(database: Database) -> None:
    case = Case.from_mapping(retyped(send_type="shop:route"))
    report = run(case, CHARTS, database)
    assert report["unhandled_sends"] == []
    assert [send["event"]["name"] for send in report["sends"]] == [
        "invoice.requested",
        "receipt.requested",
        "done.execution",
    ]
    # A case's routes have no configuration: their sends carry none.
    assert all("config" not in send for send in report["sends"])
    assert report["datamodel"]["failure"] is None


FOREIGN = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="s">
  <state id="s">
    <transition event="go" target="t">
      <send event="hello" target="#_elsewhere"/>
      <send type="acme:mail" target="ops" event="mail.queued" delay="1s"/>
      <send type="acme:mail" targetexpr="'ops'" event="mail.sent"/>
    </transition>
  </state>
  <state id="t"/>
</scxml>"""
"""An SCXML send to a target no execution is, a delayed send of a host's type, and a
send of that type to a computed target."""


def test_untyped_and_delayed_sends_to_no_handler_are_listed(tmp_path: Path) -> None:
    (tmp_path / "foreign.scxml").write_text(FOREIGN, encoding="utf-8")
    binding = {"id": "b", "source": "s", "match": "true", "key": "'k'", "document": "foreign"}
    case = Case.from_mapping(
        {
            "document": "foreign",
            "scope": "tenant_a",
            "bindings": [{**binding, "event": "go"}],
            "script": [{"advance": "PT1S"}, {"deliver": {"source": "s", "message_id": "m1"}}],
        }
    )
    report = run(case, tmp_path)
    assert report["unhandled_sends"] == [
        {"step": 1, "execution": "ex_1", "type": None, "target": "#_elsewhere", "event": "hello"},
        {
            "step": 1,
            "execution": "ex_1",
            "type": "acme:mail",
            "target": "ops",
            "event": "mail.queued",
        },
        {
            "step": 1,
            "execution": "ex_1",
            "type": "acme:mail",
            "target": "ops",
            "event": "mail.sent",
        },
    ]
    assert report["configuration"] == ["t"]
    assert report["timers"] == []
    assert unhandled_line(report["unhandled_sends"][0]) == (
        "script[1]: ex_1 sent 'hello' to '#_elsewhere' with no type, which the scenario "
        "does not handle"
    )


def test_executions_lists_those_the_run_created_then_those_it_stepped(tmp_path: Path) -> None:
    """On a kept database, a second run lists the execution it created, then the first
    run's that it stepped; the first run's untouched one is not listed."""
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    place = [
        {"deliver": {"source": "shop", "message_id": f"shop/{n}", "data": data}}
        for n, data in enumerate(
            [
                {"kind": "placed", "order_id": "o-1", "total": 1},
                {"kind": "placed", "order_id": "o-2", "total": 2},
            ]
        )
    ]
    first = {"document": "checkout", "scope": "shop_eu", "script": place}
    asyncio.run(run_case(Case.from_mapping(first), deployment(), url))
    second = {
        "document": "checkout",
        "scope": "shop_eu",
        "script": [
            {
                "deliver": {
                    "source": "payments",
                    "message_id": "payments/1",
                    "data": {"kind": "captured", "order_id": "o-2"},
                }
            },
            {
                "deliver": {
                    "source": "shop",
                    "message_id": "shop/3",
                    "data": {"kind": "placed", "order_id": "o-3", "total": 3},
                }
            },
        ],
    }
    report = asyncio.run(run_case(Case.from_mapping(second), deployment(), url))
    assert list(report["executions"].items()) == [
        (
            "ex_3",
            {
                "document": "checkout",
                "status": "active",
                "configuration": ["awaiting_payment"],
                "final_state": None,
            },
        ),
        (
            "ex_2",
            {
                "document": "checkout",
                "status": "completed",
                "configuration": [],
                "final_state": "paid",
            },
        ),
    ]


def test_a_publish_case_is_judged_by_the_deployments_send_type_and_routes() -> None:
    publish = {"document": "checkout", "declarations": {}}
    on_deployment = run(Case.from_mapping(publish), deployment())
    assert all(not found for found in on_deployment["contracts"].values())
    on_directory = run(Case.from_mapping(publish), CHARTS)
    assert [f["type"] for f in on_directory["contracts"]["unsupported_types"]] == [
        "shop:route",
        "shop:route",
    ]
    named = run(Case.from_mapping({**publish, "send_type": "shop:route"}), CHARTS)
    assert [f["route"] for f in named["contracts"]["unregistered_routes"]] == [
        "invoices",
        "receipts",
    ]


@pytest.mark.parametrize(
    ("named", "key"),
    [
        ({"bindings": [ORDERS_BINDING]}, "bindings"),
        ({"routes": ["invoices"]}, "routes"),
        ({"send_type": "shop:route"}, "send_type"),
        ({"routes": ["invoices"], "on_complete": "invoices"}, "routes"),
    ],
    ids=["bindings", "routes", "send_type", "on_complete"],
)
def test_a_case_on_a_deployment_names_none_of_its_keys(named: dict[str, Any], key: str) -> None:
    case = Case.from_mapping({**load_json(PAID), **named})
    with pytest.raises(CaseError, match=rf"^{key}: statifier\.toml gives the bindings"):
        run(case, deployment())


def test_a_script_case_on_a_directory_needs_bindings() -> None:
    with pytest.raises(CaseError, match="the key 'bindings' is required"):
        run(Case.from_mapping(retyped(bindings=None)), CHARTS)


def test_a_document_without_a_chart_in_the_deployment_is_named() -> None:
    case = {**load_json(PAID), "document": "refunds"}
    with pytest.raises(CaseError, match=r"^no chart for document 'refunds' in statifier\.toml$"):
        run(Case.from_mapping(case), deployment())


@pytest.mark.parametrize(
    ("send_type", "message"),
    [
        ("", "send_type must be a non-empty string"),
        (7, "send_type must be a non-empty string, not 7"),
        ("scxml", "send_type 'scxml' is a built-in send type"),
    ],
)
def test_a_send_type_the_router_refuses_fails_the_case(send_type: object, message: str) -> None:
    with pytest.raises(CaseError, match=message):
        run(Case.from_mapping(retyped(send_type=send_type)), CHARTS)


def test_the_recording_route_records_a_configuration_it_has() -> None:
    sends: list[dict[str, Any]] = []
    route = RecordingRoute("invoices", sends)
    from statifier.core import Event
    from statifier.router.routes import IdempotencyKey

    key = IdempotencyKey(
        "ex_1", send_id="s", macrostep=1, microstep=1, round=0, content_index=0, ordinal=0
    )
    route.deliver(ROUTES["invoices"], Event("invoice.requested", data={"n": 1}), key, None, None)
    route.deliver({}, Event("bare", data={"n": 2}), key, None, None)
    assert sends == [
        {
            "route": "invoices",
            "event": {"name": "invoice.requested", "data": {"n": 1}},
            "config": {"queue": "billing", "target": "invoice-service"},
        },
        {"route": "invoices", "event": {"name": "bare", "data": {"n": 2}}},
    ]


# The command line: --config.


def scenario(capsys: pytest.CaptureFixture[str], case: Path, *options: str) -> tuple[int, str, str]:
    """Run ``statifier scenario``: its exit status, stdout and stderr."""
    out = io.StringIO()
    status = main(["scenario", str(case), *options], out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def production_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The serve file's database, named by its variable: a file no run may create."""
    path = tmp_path / "production.db"
    monkeypatch.setenv(DATABASE_ENV, f"sqlite:///{path}")
    return path


@pytest.mark.parametrize("path", [PAID, EXPIRED], ids=["paid", "expired"])
def test_the_command_runs_a_case_on_a_serve_file(
    capsys: pytest.CaptureFixture[str], database: Database, production_url: Path, path: Path
) -> None:
    options = ("--config", str(CONFIG), "--database", database.url, "--prefix", database.prefix)
    status, out, err = scenario(capsys, path, *options)
    assert (status, err) == (0, "")
    assert json.loads(out) == load_json(path)["expected"]
    assert not production_url.exists()


def test_the_command_warns_of_unhandled_sends_and_exits_zero(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "retyped.json"
    path.write_text(json.dumps(retyped()), encoding="utf-8")
    status, out, err = scenario(capsys, path, "--charts", str(CHARTS))
    assert status == 0
    assert json.loads(out)["unhandled_sends"] == UNHANDLED
    assert err.splitlines() == [
        f"statifier scenario: {path}: warning: {unhandled_line(send)}" for send in UNHANDLED
    ]


def test_the_command_fails_a_case_expecting_sends_with_unhandled_ones(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "retyped.json"
    report = run(Case.from_mapping(retyped()), CHARTS)
    path.write_text(json.dumps(retyped(expected={"sends": report["sends"]})), encoding="utf-8")
    status, out, err = scenario(capsys, path, "--charts", str(CHARTS))
    assert status == 1
    assert json.loads(out) == report
    assert err.splitlines() == [
        f"statifier scenario: {path}: sends: {unhandled_line(send)}" for send in UNHANDLED
    ]


def test_a_serve_file_variable_unset_exits_two_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATABASE_ENV, raising=False)
    status, out, err = scenario(capsys, PAID, "--config", str(CONFIG))
    assert (status, out) == (2, "")
    assert err == (
        f"statifier scenario: {CONFIG}: [database] url_env: the environment variable "
        f"{DATABASE_ENV} is not set (or empty)\n"
    )


def test_a_serve_file_refused_exits_two_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, production_url: Path
) -> None:
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / "checkout.scxml").write_bytes((CHARTS / "checkout.scxml").read_bytes())
    config = tmp_path / "statifier.toml"
    config.write_text(
        CONFIG.read_text(encoding="utf-8").replace("[sinks.orders_done]", "[sinks.orders_gone]"),
        encoding="utf-8",
    )
    status, out, err = scenario(capsys, PAID, "--config", str(config))
    assert (status, out) == (2, "")
    assert err.startswith(f"statifier scenario: {config}: [routes.finished_orders] queue: ")
    assert len(err.splitlines()) == 1


def test_a_case_naming_bindings_on_a_serve_file_exits_two(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, production_url: Path
) -> None:
    path = tmp_path / "both.json"
    path.write_text(json.dumps({**load_json(PAID), "bindings": [ORDERS_BINDING]}), "utf-8")
    status, out, err = scenario(capsys, path, "--config", str(CONFIG))
    assert (status, out) == (2, "")
    assert err == (
        f"statifier scenario: {path}: bindings: {CONFIG} gives the bindings, routes, "
        "on_complete and send type: a case run on a serve file names none of them\n"
    )


@pytest.mark.parametrize(
    "options",
    [("--charts", str(CHARTS), "--config", str(CONFIG)), ()],
    ids=["both", "neither"],
)
def test_the_command_takes_charts_or_a_serve_file(
    capsys: pytest.CaptureFixture[str], options: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["scenario", str(PAID), *options], io.StringIO())
    assert exited.value.code == 2
    said = capsys.readouterr().err
    if options:
        assert "argument --config: not allowed with argument --charts" in said
    else:
        assert "one of the arguments --charts --config is required" in said
