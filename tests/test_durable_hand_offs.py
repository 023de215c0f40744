"""What a `Durable` chart sends is kept, on SQLite and PostgreSQL: delayed sends and
sends to itself are timer rows a worker fires (`fire_due`, `run`), the answer of a call
says what waits for a worker and what errors its step raised, and a chart that finishes
under `statifier trace` finishes under `Durable` too. On an adapter without a timer
queue the chart hears why its delayed send did not go."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from tests.test_durable import Database, _database

from statifier.chart import compile_chart
from statifier.durable import Durable, Status
from statifier.persistence import MemoryAdapter
from statifier.session.trace import Advance
from statifier.session.trace import run as trace

SCXML = 'xmlns="http://www.w3.org/2005/07/scxml"'

# The newcomer's order: an amount that arrives as a string fails the <assign>, and the
# rest of the transition, the payment timeout, never runs.
ORDER = f"""<scxml {SCXML} initial="placed" datamodel="predicator">
  <datamodel><data id="amount" expr="0"/></datamodel>
  <state id="placed">
    <transition event="pay" target="paying">
      <assign location="amount" expr="_event.data.amount * 2"/>
      <send id="timeout" event="payment.timeout" delay="15s"/>
    </transition>
  </state>
  <state id="paying">
    <transition event="payment.timeout" target="expired"/>
    <transition event="paid" target="paid"><cancel sendid="timeout"/></transition>
  </state>
  <final id="paid"/>
  <final id="expired"/>
</scxml>"""

# Sends to itself with no delay, in a chain, then waits a little: what a live session
# does at once needs a worker here.
CHAIN = f"""<scxml {SCXML} initial="one" datamodel="predicator">
  <state id="one">
    <onentry><send event="next"/></onentry>
    <transition event="next" target="two"/>
  </state>
  <state id="two">
    <onentry><send event="next"/><send event="later" delay="200ms"/></onentry>
    <transition event="next" target="three"/>
  </state>
  <state id="three"><transition event="later" target="done"/></state>
  <final id="done"/>
</scxml>"""

CHARTS = {"order": ORDER, "chain": CHAIN}
LATER = timedelta(seconds=16)


@pytest.fixture(params=("sqlite", "postgresql"))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    yield from _database(request, request.param, tmp_path)


def durable(database: Database, **options: object) -> Durable:
    return database.durable(charts=CHARTS, migrate=True, **options)


@pytest.mark.asyncio
async def test_the_newcomers_error_is_in_the_answer_and_the_description(
    database: Database,
) -> None:
    async with durable(database) as front:
        await front.create("order", "order-1")
        sent = await front.send("order-1", "pay", {"amount": "12"})
        assert (sent.matched, sent.status, sent.configuration) == (
            True,
            Status.ACTIVE,
            ("paying",),
        )
        (error,) = sent.errors
        assert (error.name, error.element, error.taken) == ("error.execution", "assign", False)
        assert error.message == "'*' expects numbers, got a string"
        # The timeout was never sent: nothing waits, and the answer says nothing waits.
        assert (sent.timers, sent.notices) == ((), ())
        described = await front.describe("order-1")
        assert described.error_count == 1
        assert [(e.name, e.via, e.seq) for e in described.errors] == [
            ("error.execution", "step", 0)
        ]
        assert described.as_json()["errors"][0]["element"] == "assign"
        (row,) = await front.list()
        assert (row.error_count, row.last_error_at) == (1, described.updated_at)


@pytest.mark.asyncio
async def test_a_delayed_send_is_a_pending_timer_a_worker_fires(database: Database) -> None:
    async with durable(database) as front:
        await front.create("order", "order-1")
        sent = await front.send("order-1", "pay", {"amount": 12})
        assert sent.errors == ()
        (timer,) = sent.timers
        assert (timer.send_id, timer.event, timer.kind) == (
            "timeout",
            "payment.timeout",
            "external",
        )
        (notice,) = sent.notices
        assert "1 timer pending" in notice
        assert "no worker runs in this process" in notice
        assert (await front.describe("order-1")).timers == sent.timers
        # Not due yet; then due: the execution times out into its final state.
        assert await front.fire_due() == 0
        clock = front.executions.storage.clock
        assert await front.fire_due(clock() + LATER) == 1
        described = await front.describe("order-1")
        assert (described.status, described.final_state, described.timers) == (
            Status.COMPLETED,
            "expired",
            (),
        )
        (summary,) = await front.list()
        assert summary.final_state == "expired"


@pytest.mark.asyncio
async def test_a_cancel_in_a_later_step_deletes_the_timer(database: Database) -> None:
    async with durable(database) as front:
        await front.create("order", "order-1")
        await front.send("order-1", "pay", {"amount": 12})
        paid = await front.send("order-1", "paid")
        assert (paid.status, paid.final_state, paid.timers) == (Status.COMPLETED, "paid", ())
        clock = front.executions.storage.clock
        assert await front.fire_due(clock() + LATER) == 0


def test_a_chart_that_finishes_under_trace_finishes_under_durable(database: Database) -> None:
    traced = trace(compile_chart(CHAIN), [Advance(300)])
    assert traced[-1].finished
    asyncio.run(_finishes_under_durable(database))


async def _finishes_under_durable(database: Database) -> None:
    async with durable(database) as front:
        created = await front.create("chain", "c-1")
        assert created.configuration == ("one",)
        clock = front.executions.storage.clock
        fired = 0
        # Each pass is a second later: a fire's step times its own delayed sends from
        # the pass's time.
        for seconds in range(1, 6):
            fired += await front.fire_due(clock() + timedelta(seconds=seconds))
        assert fired == 3
        described = await front.describe("c-1")
        assert (described.status, described.final_state) == (Status.COMPLETED, "done")


@pytest.mark.asyncio
async def test_run_fires_what_comes_due_and_no_notice_is_given_while_it_runs(
    database: Database,
) -> None:
    async with durable(database) as front:
        stop = asyncio.Event()
        workers = asyncio.create_task(front.run(stop))
        try:
            await asyncio.sleep(0.05)
            created = await front.create("chain", "c-1")
            assert created.configuration == ("one",)
            async with asyncio.timeout(20):
                while (await front.describe("c-1")).status is Status.ACTIVE:  # noqa: ASYNC110 - polls the database
                    await asyncio.sleep(0.05)
            assert (await front.describe("c-1")).final_state == "done"
            await front.create("order", "order-1")
            sent = await front.send("order-1", "pay", {"amount": 1})
            assert len(sent.timers) == 1
            assert sent.notices == ()  # a worker runs here: nothing is left behind
        finally:
            stop.set()
            await asyncio.wait_for(workers, 10)


@pytest.mark.asyncio
async def test_without_a_timer_queue_the_chart_hears_why() -> None:
    async with Durable(MemoryAdapter(), charts=CHARTS) as front:
        await front.create("order", "order-1")
        sent = await front.send("order-1", "pay", {"amount": 12})
        assert sent.timers == ()
        (error,) = sent.errors
        assert (error.name, error.sendid, error.taken) == (
            "error.communication",
            "timeout",
            False,
        )
        with pytest.raises(RuntimeError, match="only a SQL database keeps timers"):
            await front.fire_due()


def test_the_fail_policy_per_chart_fails_an_execution_on_an_untaken_error(
    database: Database,
) -> None:
    async def main() -> None:
        async with durable(database, on_error={"order": "fail"}) as front:
            await front.create("order", "order-1")
            sent = await front.send("order-1", "pay", {"amount": "12"})
            assert (sent.status, sent.finished) == (Status.FAILED, True)
            assert sent.failure is not None
            assert sent.failure.startswith("unhandled error.execution at <assign>")
            chained = await front.create("chain", "c-1")  # another chart: continues
            assert chained.status is Status.ACTIVE

    asyncio.run(main())


def test_an_unknown_chart_in_the_policy_is_refused(database: Database) -> None:
    with pytest.raises(Exception, match="no chart named 'ordr'"):
        durable(database, on_error={"ordr": "fail"})
    with pytest.raises(ValueError, match="on_error is 'continue' or 'fail'"):
        durable(database, on_error="always")


def test_trace_takes_the_chain_to_done() -> None:
    steps = trace(compile_chart(CHAIN), [Advance(300)])
    assert [step.event for step in steps] == [None, "next", "next", "later"]
    assert steps[-1].finished
