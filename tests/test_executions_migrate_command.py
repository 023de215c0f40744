"""`statifier executions migrate`, through the module's parser and runner, on SQLite
and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_durable_migration import HELD, ORDER_V1, ORDER_V2
from .test_executions_command import Place, _place, cli


@pytest.fixture(params=("sqlite", "postgresql"))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """Each backend, empty (``place.migrate()`` builds the tables)."""
    yield from _place(request, request.param, tmp_path)


@pytest.fixture
def charts(place: Place) -> list[str]:
    (place.charts / "order.scxml").write_text(ORDER_V1, encoding="utf-8")
    return ["--charts", str(place.charts)]


def test_migrate_moves_parks_and_says_why(
    place: Place, charts: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    place.migrate()
    at = place.options
    for execution_id, events in (("a", ()), ("b", ("pay",)), ("c", ("pay", "hold"))):
        assert cli(capsys, "create", "order", "--id", execution_id, *at, *charts)[0] == 0
        for event in events:
            assert cli(capsys, "send", execution_id, event, *at)[0] == 0
    (place.charts / "order.scxml").write_text(ORDER_V2, encoding="utf-8")
    data = ["--data", '{"carrier": "post"}']

    one = cli(capsys, "migrate", "order", "--id", "b", "--map", "paid=charged", *data, *at, *charts)
    assert one == (0, "b: migrated, active in charged\n", "")
    everything = cli(capsys, "migrate", "order", "--map", "paid=charged", *data, *at, *charts)
    assert everything == (
        1,
        f"order: 1 migrated, 1 parked, 0 failed\n  parked c: {HELD}\n",
        "",
    )
    status, text, _ = cli(capsys, "show", "c", *at)
    assert status == 0
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "status needs_migration" in lines
    assert f"failure {HELD}" in lines
    assert f"2 migrate parked: {HELD}" in lines
    status, text, _ = cli(capsys, "show", "b", *at)
    assert status == 0
    assert any(line.startswith("  1  migrate  to sha256:") for line in text.splitlines())

    removed = cli(
        capsys,
        "migrate",
        "order",
        "--map",
        "paid=charged",
        "--remove",
        "held",
        *data,
        "--json",
        *at,
        *charts,
    )
    assert removed[0] == 1
    assert json.loads(removed[1]) == {
        "migrated": [],
        "parked": {"c": "active state 'held' is not in the new chart and the plan maps it nowhere"},
        "unchanged": {},
        "failed": {},
    }
    fixed = cli(
        capsys,
        "migrate",
        "order",
        "--id",
        "c",
        "--map",
        "held=charged",
        *data,
        "--json",
        *at,
        *charts,
    )
    assert fixed[0] == 0
    assert json.loads(fixed[1])["configuration"] == ["charged"]

    refused = cli(capsys, "migrate", "order", "--map", "paid", *at, *charts)
    assert refused[0] == 2
    assert "--map takes KEY=VALUE" in refused[2]
    assert cli(capsys, "migrate", "order", *at)[0] == 2  # --charts is needed
