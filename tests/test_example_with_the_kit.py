"""The shipped order chart (``statifier/examples/order.scxml``) tested with the test kit's
fixtures, as a host's suite would: its store, its clock, its scenario runner, and its
exported input logs replayed on revisions, one that keeps them and one that does not."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statifier.durable import Durable
from statifier.durable.export import export_input_logs
from statifier.examples import read
from statifier.shadow import Verdict
from statifier.testing import ManualClock, ScenarioRunner, assert_replays_same

pytest_plugins = ["pytester"]

DOCS = Path(__file__).parent.parent / "docs" / "testing.md"
ORDER = read("order.scxml").decode()

DurableFactory = Callable[..., Durable]


@pytest.fixture
def charts(statifier_charts: Path) -> Path:
    (statifier_charts / "order.scxml").write_text(ORDER, encoding="utf-8")
    return statifier_charts


async def _checked_out(durable: Durable, order: str) -> None:
    await durable.create("order", order)
    await durable.send(order, "item.added", {"sku": "tea", "price": 4})
    await durable.send(order, "checkout")


def test_an_unpaid_order_is_cancelled_when_the_clock_passes_its_timeout(
    charts: Path, statifier_durable: DurableFactory, statifier_clock: ManualClock
) -> None:
    async def run() -> tuple[int, int, Any, Any]:
        async with statifier_durable() as durable:
            await _checked_out(durable, "o_1")
            early = await statifier_clock.advance(durable, "PT29M59S")
            waiting = await durable.describe("o_1")
            fired = await statifier_clock.advance(durable, "PT1S")
            return early, fired, waiting, await durable.describe("o_1")

    early, fired, waiting, ended = asyncio.run(run())
    assert (early, fired) == (0, 1)
    assert waiting.configuration == ("awaiting_payment", "picking")
    assert [timer.event for timer in waiting.timers] == ["payment.timeout"]
    assert ended.final_state == "cancelled"
    assert ended.outcome == {"order": "o-1", "reason": "unpaid"}
    assert ended.ended_at == statifier_clock() == waiting.created_at + timedelta(minutes=30)


def test_a_paid_order_cancels_its_timeout_and_the_clock_fires_nothing(
    charts: Path, statifier_durable: DurableFactory, statifier_clock: ManualClock
) -> None:
    async def run() -> tuple[int, Any]:
        async with statifier_durable() as durable:
            await _checked_out(durable, "o_2")
            await durable.send("o_2", "payment.received")
            await durable.send("o_2", "packed")
            return await statifier_clock.advance(durable, "P1D"), await durable.describe("o_2")

    fired, shipped = asyncio.run(run())
    assert fired == 0
    assert (shipped.final_state, shipped.timers) == ("shipped", ())


def test_the_store_is_one_database_for_every_durable_of_a_test(
    charts: Path, statifier_durable: DurableFactory
) -> None:
    async def first() -> None:
        async with statifier_durable() as durable:
            await _checked_out(durable, "o_3")

    async def next_day() -> str:
        async with statifier_durable() as durable:
            return (await durable.describe("o_3")).status.value

    asyncio.run(first())
    assert asyncio.run(next_day()) == "active"


def _case(expected: dict[str, Any]) -> dict[str, Any]:
    return {
        "document": "order",
        "scope": "shop",
        "bindings": [
            {
                "id": "items",
                "source": "shop",
                "match": 'event.kind == "item"',
                "key": "event.order",
                "document": "order",
                "event": "item.added",
                "data": ["sku", "price"],
            },
            {
                "id": "payments",
                "source": "shop",
                "match": 'event.kind == "payment"',
                "key": "event.order",
                "document": "order",
                "event": "payment.received",
            },
            {
                "id": "checkouts",
                "source": "shop",
                "match": 'event.kind == "checkout"',
                "key": "event.order",
                "document": "order",
                "event": "checkout",
            },
        ],
        "script": [
            {"deliver": _message("m1", kind="item", sku="tea", price=4)},
            {"deliver": _message("m2", kind="checkout")},
            {"advance": "PT10M"},
            {"deliver": _message("m3", kind="payment")},
            {"advance": "PT1H"},
        ],
        "expected": expected,
    }


def _message(message_id: str, **data: Any) -> dict[str, Any]:
    return {"source": "shop", "message_id": message_id, "data": {"order": "o-1", **data}}


def test_the_scenario_runner_runs_a_case_on_the_charts_directory(
    charts: Path, statifier_scenario: ScenarioRunner
) -> None:
    expected = {"status": "active", "configuration": ["paid", "picking"], "timers": []}
    report = asyncio.run(statifier_scenario.check(_case(expected)))
    assert report["datamodel"]["order"] == {"id": "o-1", "items": ["tea"], "total": 4}
    assert [row["outcome"] for row in report["ledger"]] == [
        "created_and_delivered",
        "delivered",
        "delivered",
    ]


def test_the_scenario_runner_fails_with_each_difference_on_a_line(
    charts: Path, statifier_scenario: ScenarioRunner
) -> None:
    case = _case({"status": "completed", "timers": ["payment.timeout"]})
    with pytest.raises(AssertionError) as failed:
        asyncio.run(statifier_scenario.check(case))
    assert str(failed.value) == (
        "the scenario's report differs in 2 places:\n"
        '  status: expected "completed", got "active"\n'
        '  timers[0]: expected "payment.timeout", got nothing'
    )


def _recorded(factory: DurableFactory, clock: ManualClock, file: Path) -> int:
    """Three orders: shipped after a failed payment, cancelled unpaid, still packing."""

    async def run() -> int:
        async with factory() as durable:
            await _checked_out(durable, "shipped")
            for event in ("payment.failed", "payment.received", "packed"):
                await durable.send("shipped", event)
            await _checked_out(durable, "unpaid")
            await clock.advance(durable, "PT30M")
            await _checked_out(durable, "packing")
            await durable.send("packing", "payment.received")
            return await export_input_logs(durable, file, chart="order")

    return asyncio.run(run())


def test_exported_logs_replay_the_same_on_a_revision_that_keeps_their_outcomes(
    charts: Path, statifier_durable: DurableFactory, statifier_clock: ManualClock, tmp_path: Path
) -> None:
    file = tmp_path / "orders.json"
    assert _recorded(statifier_durable, statifier_clock, file) == 3
    # A revision that logs differently and adds a state no recorded input reaches.
    revision = ORDER.replace('label="processing"', 'label="order"').replace(
        '<final id="shipped">', '<state id="held"/><final id="shipped">'
    )
    replayed = assert_replays_same(file, {"order": revision})
    assert [(r.execution.id, r.execution.ended()) for r in replayed] == [
        ("shipped", "completed in shipped"),
        ("unpaid", "completed in cancelled"),
        ("packing", "active in paid picking"),
    ]
    assert {r.result.verdict for r in replayed} == {Verdict.SAME}


def test_a_revision_that_changes_an_outcome_fails_with_where_it_parted(
    charts: Path, statifier_durable: DurableFactory, statifier_clock: ManualClock, tmp_path: Path
) -> None:
    file = tmp_path / "orders.json"
    _recorded(statifier_durable, statifier_clock, file)
    # The timeout now ships the order instead of cancelling it.
    revision = ORDER.replace(
        '<transition event="payment.timeout" target="cancelled"/>',
        '<transition event="payment.timeout" target="shipped"/>',
    )
    with pytest.raises(AssertionError) as failed:
        assert_replays_same(file, {"order": revision})
    assert str(failed.value) == (
        "1 of 3 recorded executions replay differently on the revision:\n"
        "  unpaid (order, recorded completed in cancelled): parted after input 3 "
        "('payment.timeout', seq 2) in configuration: recorded chart in cancelled (ended); "
        "revision in shipped (ended)"
    )


def test_the_documented_test_file_passes_through_pytester(pytester: pytest.Pytester) -> None:
    snippet = re.search(r"```python\n(# test_orders\.py\n.*?)```", DOCS.read_text(), re.DOTALL)
    assert snippet is not None, "docs/testing.md lost its test file"
    pytester.makepyfile(test_orders=snippet[1])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_documented_test_file_fails_when_the_chart_does(pytester: pytest.Pytester) -> None:
    snippet = re.search(r"```python\n(# test_orders\.py\n.*?)```", DOCS.read_text(), re.DOTALL)
    assert snippet is not None
    # The chart's timeout is made an hour: the test's 30 minutes no longer fire it.
    broken = snippet[1].replace(
        'read("order.scxml"))', 'read("order.scxml").replace(b\'delay="30m"\', b\'delay="1h"\'))'
    )
    assert broken != snippet[1]
    pytester.makepyfile(test_orders=broken)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert (0, 0) == (0, 1)*"])
