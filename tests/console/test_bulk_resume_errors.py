"""A bulk resume says which executions' held events raised error events when the
resume stepped them in, as ``statifier executions resume`` says it of one: a count
of its own, the last such error (where the chart raised it, never its message), the
progress and summary lines and status 1 of ``statifier executions bulk``, the run's
row and audit row, its telemetry, one warning for the run, and the console's page of
the run; on each database."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from datetime import timedelta

import httpx
import pytest
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)
from tests.test_executions_command import (  # noqa: F401 - the fixture used by name
    BOMB,
    Place,
    cli,
    place,
)

from statifier import telemetry
from statifier.chart import compile_chart
from statifier.console.app import Console, console_app
from statifier.console.audit import Audit
from statifier.console.auth import Operator, Operators, Role, Sessions
from statifier.console.bulk import BulkProgress, migration
from statifier.console.bulk_runs import BulkLog
from statifier.console.queries import ConsoleQueries, ExecutionFilter
from statifier.expr import Value
from statifier.persistence import Status
from statifier.router import Binding, InboundEvent, StaticResolver

SCOPE = "bombs"
ADA = "ada-token-0123456789abcdef"

# ``hit`` counts; ``boom`` fails its <assign> (``nothing`` is no variable) with an
# error.execution no transition takes.
HIT = '<transition event="hit"><assign location="n" expr="n + 1"/></transition>'
CHART = BOMB.format(catch=HIT)


def _binding(kind: str) -> Binding:
    return Binding(
        id=f"{kind}s",
        source="feed",
        match=f"event.kind == '{kind}'",
        key="event.key",
        document="bomb",
        event=kind,
    )


def _event(kind: str, key: str) -> InboundEvent:
    data: dict[str, Value] = {"kind": kind, "key": key}
    return InboundEvent(scope=SCOPE, source="feed", message_id=f"{kind}-{key}", data=data)


def test_the_cli_counts_the_executions_whose_held_events_raised_errors_and_exits_1(
    place: Place,  # noqa: F811 - the fixture
    capsys: pytest.CaptureFixture[str],
) -> None:
    (place.charts / "bomb.scxml").write_text(BOMB.format(catch=""), encoding="utf-8")
    caught = BOMB.format(catch='<transition event="error.execution"/>')
    (place.charts / "caught.scxml").write_text(caught, encoding="utf-8")
    place.migrate()
    at = [*place.options, "--charts", str(place.charts)]
    made = (("bomb", "held"), ("caught", "taken"), ("bomb", "quiet"))
    for chart, execution_id in made:
        assert cli(capsys, "create", chart, "--id", execution_id, *at)[0] == 0
        assert cli(capsys, "pause", execution_id, *at)[0] == 0
    for execution_id in ("held", "taken"):  # held while paused: stepped in on resume
        assert cli(capsys, "send", execution_id, "boom", *at)[0] == 0

    status, out, _ = cli(capsys, "bulk", "resume", "--status", "paused", "--yes", *at)
    lines = out.splitlines()
    assert lines[0] == "3 executions selected to resume"
    assert lines[2] == "  3 seen: 3 done, 0 skipped, 0 failed, 1 raised errors"
    assert lines[3].startswith("resume: 3 done, 0 skipped, 0 failed, 1 raised errors (audited")
    # The last one the run came to (newest first: ``held``), where the chart raised it.
    last = re.fullmatch(
        r"  last error raised: held: error\.execution at <assign>, line 1, column \d+ "
        r"\(no transition took it\); each is among its execution's errors \(`show ID`\)",
        lines[4],
    )
    assert last is not None, lines
    assert len(lines) == 5
    assert status == 1  # as `resume` of each: an error event no transition took
    # The error a transition took is the chart's to handle: no count, no status 1.
    assert cli(capsys, "create", "caught", "--id", "taken2", *at)[0] == 0
    assert cli(capsys, "pause", "taken2", *at)[0] == 0
    assert cli(capsys, "send", "taken2", "boom", *at)[0] == 0
    status, out, _ = cli(capsys, "bulk", "resume", "--status", "paused", "--yes", *at)
    assert out.splitlines()[-1].startswith("resume: 1 done, 0 skipped, 0 failed (audited")
    assert status == 0


@pytest.mark.asyncio
async def test_the_console_run_its_row_its_audit_row_telemetry_and_log_say_the_errors(
    router_db: RouterDb,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = router_db.router(
        [_binding("hit"), _binding("boom")],
        resolver=StaticResolver({"bomb": compile_chart(CHART)}),
    )
    keys = ("k0", "k1", "k2", "k3")
    made: dict[str, str] = {}
    for key in keys:
        outcome = (await router.route(_event("hit", key))).outcomes[0]  # the hits binding's
        execution_id = getattr(outcome, "execution_id", None)
        assert isinstance(execution_id, str)
        made[key] = execution_id
        assert await router.pause(execution_id)
        router_db.clock.advance(timedelta(seconds=1))  # the walk's order: k3 first, k0 last
    for key in ("k0", "k2"):  # held while paused: each raises an error on resume
        await router.route(_event("boom", key))
    await router.route(_event("hit", "k1"))  # held too, and steps in quietly
    adapter = router_db.adapter
    console = Console(
        queries=ConsoleQueries(adapter.engine, adapter.tables),
        audit=Audit(adapter.engine, adapter.tables),
        router=router,
        sessions=Sessions(Operators([Operator("ada", ADA, Role.OPERATOR)]), key=b"k" * 32),
        live_interval=0.05,
    )
    reported: list[tuple[Mapping[str, float], Mapping[str, object]]] = []
    telemetry.attach(
        "bulk-errors-test", "statifier.console.bulk_run", lambda _, m, d: reported.append((m, d))
    )
    caplog.set_level(logging.INFO, logger="statifier")
    transport = httpx.ASGITransport(app=console_app(console))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            login = await client.post("/console/login", data={"token": ADA})
            assert login.status_code == 303
            query = f"/console/bulk?action=resume&scope={SCOPE}"
            previewed = (await client.get(query)).text
            assert 'data-selected="4"' in previewed
            csrf = re.search(r'name="csrf" value="([^"]+)"', previewed)
            assert csrf is not None
            fields = {"csrf": csrf.group(1), "action": "resume", "scope": SCOPE, "confirm": "4"}
            started = await client.post("/console/bulk", data=fields)
            assert started.status_code == 303, started.text
            run_page = started.headers["location"]
            shown = ""
            for _ in range(200):
                shown = (await client.get(run_page)).text
                if 'data-state="finished"' in shown:
                    break
                await asyncio.sleep(0.05)
    finally:
        telemetry.detach("bulk-errors-test")
        console.close()
    run_id = run_page.rsplit("/", 1)[1]
    for execution_id in made.values():
        found = await router.storage.find_execution(execution_id)
        assert found is not None
        assert found.status is Status.ACTIVE

    # The page of the run: the count beside the others, and the last error.
    assert 'id="run-state">finished<' in shown
    assert '<td data-count="done">4</td>' in shown
    assert '<td data-count="raised_errors">2</td>' in shown
    said = re.search(r'<p class="error" id="run-last-raised">([^<]*)</p>', shown)
    assert said is not None, shown
    assert said.group(1).startswith(f"Last error raised: {made['k0']}: error.execution at")
    assert "(no transition took it)" in said.group(1)

    # The run's row keeps the count and the last error (the chart's place, no message).
    log = BulkLog(adapter.engine, adapter.tables)
    row = await log.get(run_id)
    assert row is not None
    progress = row.progress
    assert (progress.done, progress.failed, progress.raised_errors) == (4, 0, 2)
    assert progress.last_raised_error is not None
    assert progress.last_raised_error.startswith(f"{made['k0']}: error.execution at <assign>")
    (stored,) = await router.storage.errors(made["k0"])
    message = json.loads(stored.error)["message"]
    assert message
    assert message not in progress.last_raised_error

    # Its audit row, the telemetry of its end, and one warning for the run.
    rows = (await console.audit.entries()).rows
    (bulk,) = [r for r in rows if r.action == "bulk"]
    assert bulk.outcome == "done"
    assert "4 done, 0 skipped, 0 failed, 2 raised errors" in str(bulk.detail)
    assert f"last error raised: {made['k0']}: error.execution at <assign>" in str(bulk.detail)
    resumed = {r.target: str(r.detail) for r in rows if r.action == "resume"}
    assert "1 error event no transition took" in resumed[made["k2"]]
    assert "error event" not in resumed[made["k1"]]
    ((measured, about),) = reported
    assert (measured["done"], measured["raised_errors"]) == (4, 2)
    assert about["outcome"] == "finished"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "bulk" in r.message]
    assert len(warned) == 1, [r.message for r in warned]
    assert "2 of the 4 executions it resumed raised error events" in warned[0].message
    assert made["k0"] in warned[0].message


@pytest.mark.asyncio
async def test_the_row_keeps_a_migration_plan_beside_the_errors_and_reads_none_where_none_were(
    router_db: RouterDb,  # noqa: F811 - the fixture
) -> None:
    adapter = router_db.adapter
    log = BulkLog(adapter.engine, adapter.tables)
    renamed = migration(compile_chart(CHART.replace('"on"', '"up"')), state_map={"on": "up"})
    now = router_db.clock()
    await log.start("r1", renamed, ExecutionFilter(scope=SCOPE), actor="ada", selected=2, now=now)
    raised = BulkProgress("migrate", 2, done=2, raised_errors=1, last_raised_error="x: error.y")
    await log.finish("r1", raised, None, now)
    row = await log.get("r1")
    assert row is not None
    assert (dict(row.state_map), row.progress) == ({"on": "up"}, raised)
    # A row no run with errors wrote reads as none.
    await log.start("r2", renamed, ExecutionFilter(), actor="ada", selected=0, now=now)
    quiet = await log.get("r2")
    assert quiet is not None
    assert (quiet.progress.raised_errors, quiet.progress.last_raised_error) == (0, None)
