"""The set-based delivery batch (``statifier.router.batch``) on both databases: a
batch's claims, addresses, executions' locks and rows are read in a fixed number of
statements whatever its size, and a batch answers exactly what the same events routed
one at a time answer (a property test over random streams with repeated keys,
repeated message ids and executions that end mid-batch)."""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import SqlStore
from tests.router.conftest import RouterDb

from statifier.chart import compile_chart
from statifier.persistence import Executions
from statifier.repeats import IntervalTally
from statifier.router import (
    Binding,
    Create,
    Dedupe,
    Failed,
    InboundEvent,
    Routed,
    Router,
    StaticResolver,
    ledger,
    routing,
)
from statifier.sql.routing import RoutingSession


@pytest.fixture(name="router_store")
def _locking_router_store(locking_store: SqlStore) -> SqlStore:
    """Each backend, and PostgreSQL whose locks are rows: these tests are about what
    locks keep apart."""
    return locking_store


METER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="open">
  <datamodel><data id="ticks" expr="0"/></datamodel>
  <state id="open">
    <transition event="tick" target="open"><assign location="ticks" expr="ticks + 1"/></transition>
    <transition event="stop" target="closed"/>
  </state>
  <final id="closed"/>
</scxml>"""
"""Counts ticks until a stop ends it."""

BINDINGS = [
    Binding(
        id="ticks",
        source="meter",
        match="event.kind == 'tick'",
        key="event.meter",
        document="meter",
        event="tick",
        dedupe=Dedupe(timedelta(minutes=10)),
    ),
    Binding(
        id="stops",
        source="meter",
        match="event.kind == 'stop'",
        key="event.meter",
        document="meter",
        event="stop",
        create=Create.NEVER,
    ),
]

_runs = itertools.count()


def meter_router(db: RouterDb) -> Router:
    return db.router(BINDINGS, resolver=StaticResolver({"meter": compile_chart(METER)}))


def reading(scope: str, message_id: str, kind: str, meter: str) -> InboundEvent:
    return InboundEvent(
        scope=scope, source="meter", message_id=message_id, data={"kind": kind, "meter": meter}
    )


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, *names: str) -> Iterator[Counter[str]]:
    """Count the calls of ``names`` (methods of the router's statements on a
    transaction) while the block runs."""
    calls: Counter[str] = Counter()
    with monkeypatch.context() as patch:
        for name in names:
            method = getattr(RoutingSession, name)

            async def wrapper(self: Any, *args: Any, __m: Any = method, __n: str = name) -> Any:
                calls[__n] += 1
                return await __m(self, *args)

            patch.setattr(RoutingSession, name, wrapper)
        yield calls


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [4, 40])
async def test_a_batch_reads_its_claims_and_addresses_in_one_statement_each(
    router_db: RouterDb, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    router = meter_router(router_db)
    meters = [f"m{index}" for index in range(size)]
    # Create the executions first: the batch under test steps existing ones.
    await router.route_many([reading("s", f"new-{m}", "tick", m) for m in meters])
    batch = [reading("s", f"again-{m}", "tick", m) for m in meters]
    names = ("claim_many", "find_addresses", "lock_executions", "claim_and_find", "claim")
    with counted(monkeypatch, *names) as calls:
        answers = await router.route_many(batch)
    assert [a.outcomes[0].outcome for a in answers if isinstance(a, Routed)] == ["delivered"] * size
    assert calls == Counter(claim_many=1, find_addresses=1, lock_executions=1)


@pytest.mark.asyncio
async def test_a_message_twice_in_a_batch_is_a_duplicate_the_second_time(
    router_db: RouterDb,
) -> None:
    router = meter_router(router_db)
    answers = await router.route_many(
        [
            reading("s", "a", "tick", "m1"),
            reading("s", "a", "tick", "m1"),
            reading("s", "b", "tick", "m1"),
            reading("s", "c", "stop", "m1"),
            reading("s", "d", "tick", "m1"),
        ]
    )
    assert [
        [o.outcome for o in a.outcomes if o.outcome != "no_match"]
        for a in answers
        if isinstance(a, Routed)
    ] == [
        ["created_and_delivered"],
        ["duplicate"],
        ["delivered"],
        ["delivered"],
        ["dropped: finished"],
    ]


def _stream() -> st.SearchStrategy[list[tuple[str, str, str]]]:
    """Events as (message id, kind, meter): few ids and meters, so repeats are common."""
    return st.lists(
        st.tuples(
            st.sampled_from(["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"]),
            st.sampled_from(["tick", "tick", "tick", "stop"]),
            st.sampled_from(["a", "b", "c"]),
        ),
        max_size=24,
    )


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(stream=_stream(), size=st.integers(min_value=1, max_value=10))
@pytest.mark.asyncio
async def test_a_batch_answers_what_one_event_at_a_time_answers(
    router_db: RouterDb, stream: list[tuple[str, str, str]], size: int
) -> None:
    run = next(_runs)
    router = meter_router(router_db)
    alone, batched = f"alone{run}", f"batched{run}"

    def events(scope: str) -> list[InboundEvent]:
        # Message ids are per run and side: the dedupe claims are not per scope.
        return [reading(scope, f"{scope}-{m}", kind, meter) for m, kind, meter in stream]

    one_by_one = [await router.route(event) for event in events(alone)]
    in_batches: list[Routed | Failed] = []
    batch = events(batched)
    for start in range(0, len(batch), size):
        in_batches.extend(await router.route_many(batch[start : start + size]))

    def outcomes(answers: list[Routed] | list[Routed | Failed]) -> list[list[str]]:
        return [
            [f"{o.outcome}:{getattr(o, 'reason', None)}" for o in a.outcomes]
            for a in answers
            if isinstance(a, Routed)
        ]

    assert all(isinstance(answer, Routed) for answer in in_batches)
    assert outcomes(in_batches) == outcomes(one_by_one)
    rows = await ledger(router)
    spelled = {
        scope: [
            (row.binding_id, (row.message_id or "").removeprefix(f"{scope}-"), row.key, row.spelled)
            for row in rows
            if row.scope == scope
        ]
        for scope in (alone, batched)
    }
    assert spelled[batched] == spelled[alone]
    executions = Executions(router.storage)
    for meter in ("a", "b", "c"):
        ids = {
            scope: [row.execution_id for row in rows if row.scope == scope and row.key == meter]
            for scope in (alone, batched)
        }
        assert [i is None for i in ids[batched]] == [i is None for i in ids[alone]]
        for first, second in zip(ids[alone], ids[batched], strict=True):
            if first is None or second is None:
                continue
            one = await router.storage.fetch_execution(first)
            other = await router.storage.fetch_execution(second)
            assert (one.status, one.final_state) == (other.status, other.final_state)
            assert [e.event for e in await executions.inputs(first)] == [
                e.event for e in await executions.inputs(second)
            ]


@pytest.mark.asyncio
async def test_a_batch_settled_again_one_event_at_a_time_says_so(
    router_db: RouterDb, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(routing, "_repeats", IntervalTally())
    router = uncharted_router(router_db)
    with caplog.at_level(logging.WARNING, logger="statifier.router.routing"):
        answers = await router.route_many([reading("s", "a", "tick", "m1")])
    assert isinstance(answers[0], Failed)
    said = [r.getMessage() for r in caplog.records if r.name == "statifier.router.routing"]
    first = "a delivery batch is settled again one event at a time after UnresolvedDocument"
    assert said == [f"{first}: {answers[0].error}"]


def uncharted_router(db: RouterDb) -> Router:
    """A router whose resolver names no chart: every create raises."""
    return db.router(BINDINGS, resolver=StaticResolver({}))
