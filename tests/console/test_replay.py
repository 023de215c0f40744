"""Replaying an input log: `replay` recomputes, through the pure core, the position a
durable execution had after each input, and ends where the stored execution is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.persistence.conftest import drop_schema, postgresql_store, sqlite_store, unique_name  # noqa: F401 - fixtures
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401 - fixtures

import statifier.console.replay as replay_module
from statifier.chart import compile_chart
from statifier.console.replay import (
    SYSTEM_VARIABLES,
    ReplayStep,
    assume_performed,
    diverges,
    replay,
    shown_datamodel,
)
from statifier.core import Event, MachineState, StartOptions
from statifier.core import effects as fx
from statifier.core import positions as stored_positions
from statifier.durable import Durable
from statifier.expr import UNDEFINED, Function
from statifier.persistence import Executions, LoggedInput, MemoryAdapter, Stepped, Storage
from statifier.persistence.executor import EffectContext, Refused, refuse_unperformed
from statifier.router import (
    Binding,
    CreatedAndDelivered,
    InboundEvent,
    StaticResolver,
    TimerWorker,
)
from statifier.sql import TableOptions

NS = 'xmlns="http://www.w3.org/2005/07/scxml"'

# A parcel: a parallel state, data, a raised internal event, an eventless transition,
# and a send nothing delivers (the default executor refuses it: the chart counts it).
PARCEL = (
    f'<scxml {NS} initial="sorting" name="parcel">'
    '<datamodel><data id="scans" expr="0"/><data id="note" expr="null"/>'
    '<data id="refused" expr="0"/><data id="who" expr="_sessionid"/></datamodel>'
    '<state id="sorting">'
    '<transition event="scan"><assign location="scans" expr="scans + 1"/>'
    '<assign location="note" expr="_event.data"/></transition>'
    '<transition event="load" target="transit"><raise event="loaded"/></transition>'
    "</state>"
    '<parallel id="transit">'
    '<state id="vehicle" initial="parked"><state id="parked">'
    '<transition event="loaded" target="driving"/></state>'
    '<state id="driving"><transition event="arrive" target="arrived"/></state>'
    '<state id="arrived"/></state>'
    '<state id="tracking" initial="silent"><state id="silent">'
    '<transition event="ping" target="pinged">'
    '<send event="tracked" target="#_elsewhere"/></transition></state>'
    '<state id="pinged"><transition event="error.communication">'
    '<assign location="refused" expr="refused + 1"/></transition></state></state>'
    "<transition cond=\"In('arrived') and In('pinged')\" target=\"delivered\"/>"
    "</parallel>"
    '<final id="delivered"><donedata><param name="scans" expr="scans"/></donedata></final>'
    "</scxml>"
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def logged(*events: Event | None, via: str = "step") -> list[LoggedInput]:
    return [LoggedInput(seq, via, event, AT) for seq, event in enumerate(events)]


# Against the stored execution, on both databases.


class Database:
    def __init__(self, url: str, tables: TableOptions) -> None:
        self.url, self.tables = url, tables

    def durable(self) -> Durable:
        return Durable(self.url, charts={"parcel": PARCEL}, tables=self.tables, migrate=True)


@pytest.fixture(params=("sqlite", "postgresql"))
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        yield Database(f"sqlite:///{tmp_path / 'replay.db'}", TableOptions(prefix="r_"))
        return
    url = request.getfixturevalue("database_url")
    schema = unique_name("statifier_replay_")
    try:
        yield Database(url, TableOptions(prefix="r_", schema=schema))
    finally:
        drop_schema(url, schema)


async def stored(durable: Durable, execution_id: str) -> MachineState:
    storage = durable.executions.storage
    record = await storage.fetch_execution(execution_id)
    return storage.load(record, await storage.machine(record.content_hash))


@pytest.mark.asyncio
async def test_each_step_is_where_the_stored_execution_was(database: Database) -> None:
    data = {"scans": 10, "note": "<b>from the start</b>"}
    async with database.durable() as durable:
        await durable.create("parcel", "parcel-1042771", data=data)
        seen = []  # (configuration, datamodel) after each send, read from the store
        for name, payload in [
            ("scan", {"at": "<hub>"}),
            ("scan", None),
            ("load", UNDEFINED),
            ("ping", UNDEFINED),
        ]:
            await durable.send("parcel-1042771", name, payload)
            state = await stored(durable, "parcel-1042771")
            seen.append((state.leaf_configuration(), shown_datamodel(state)))
        running = await stored(durable, "parcel-1042771")
        inputs = await durable.executions.inputs("parcel-1042771")
        machine = durable.chart("parcel")
        steps = replay(
            machine,
            inputs,
            execution_id="parcel-1042771",
            refusals=refuse_unperformed,
        )
        # The create's start data opens the log and is step 0: no options needed.
        assert [(s.index, s.via, s.event_name, s.seq) for s in steps] == [
            (0, "create", "statifier.start", 0),
            (1, "step", "scan", 1),
            (2, "step", "scan", 2),
            (3, "step", "load", 3),
            (4, "step", "ping", 4),
        ]
        assert [(s.configuration, dict(s.datamodel)) for s in steps[1:]] == seen
        assert steps[0].configuration == ("sorting",)
        assert steps[0].datamodel == {
            "note": "<b>from the start</b>",
            "refused": 0,
            "scans": 10,
            "who": "parcel-1042771",
        }
        assert steps[1].event_data == {"at": "<hub>"}
        assert steps[1].datamodel["note"] == {"at": "<hub>"}
        assert steps[2].datamodel["scans"] == 12
        assert steps[4].datamodel["refused"] == 1  # the refusal was told to the chart
        assert steps[4].active == (
            "transit",
            "vehicle",
            "driving",
            "tracking",
            "pinged",
        )
        assert not diverges(steps[-1], running)
        # What the log does not hold, a replay cannot know: it then says it diverged.
        without_data = replay(
            machine, inputs[1:], execution_id="parcel-1042771", refusals=refuse_unperformed
        )
        assert diverges(without_data[-1], running)
        all_performed = replay(machine, inputs, execution_id="parcel-1042771")
        assert all_performed[-1].datamodel["refused"] == 0
        assert diverges(all_performed[-1], running)
        # The last input ends it in its final state; the store agrees.
        sent = await durable.send("parcel-1042771", "arrive")
        assert sent.finished
        inputs = await durable.executions.inputs("parcel-1042771")
        finished = await stored(durable, "parcel-1042771")
        described = await durable.describe("parcel-1042771")
    steps = replay(
        machine,
        inputs,
        execution_id="parcel-1042771",
        options=StartOptions(datamodel=data),
        refusals=refuse_unperformed,
    )
    last = steps[-1]
    assert (last.running, last.configuration, last.active) == (False, (), ("delivered",))
    assert last.final_state == described.final_state == "delivered"
    assert last.configuration == described.configuration
    assert not diverges(last, finished)
    assert all(step.not_replayed is None for step in steps)


# Through the router: its timers step the execution (via "timer"), internal or not.

REMINDER = (
    f'<scxml {NS} initial="waiting">'
    '<datamodel><data id="kinds" expr="[]"/></datamodel>'
    '<state id="waiting"><onentry>'
    '<send event="remind" delay="1s" target="#_internal"/><send event="nudge" delay="2s"/>'
    '</onentry><transition event="start"/>'
    '<transition event="remind"><assign location="kinds" expr="kinds + [_event.type]"/>'
    "</transition>"
    '<transition event="nudge" target="nudged">'
    '<assign location="kinds" expr="kinds + [_event.type]"/></transition></state>'
    '<state id="nudged"><transition event="close" target="closed"/></state>'
    '<final id="closed"/></scxml>'
)


@pytest.mark.asyncio
async def test_timers_fired_by_the_router_replay_as_they_were_stepped(
    router_db: RouterDb,  # noqa: F811 - the imported fixture
) -> None:
    machine = compile_chart(REMINDER)
    binding = Binding(
        id="jobs_to_reminder",
        source="jobs",
        match="event.kind == 'start'",
        key="event.id",
        document="reminder",
        event="start",
    )
    router = router_db.router(
        [binding], resolver=StaticResolver({"reminder": machine}), lock_wait=30.0
    )
    job = InboundEvent(
        scope="tenant", source="jobs", message_id="m1", data={"kind": "start", "id": "r-1"}
    )
    routed = await router.route(job)
    created = routed.outcomes[0]
    assert isinstance(created, CreatedAndDelivered)
    execution_id = created.execution_id
    worker = TimerWorker(router)
    now = router_db.clock.now
    assert await worker.fire_due(now + timedelta(seconds=1)) == 1  # remind, internal
    assert await worker.fire_due(now + timedelta(seconds=2)) == 1  # nudge, external
    storage = router.storage
    record = await storage.fetch_execution(execution_id)
    state = storage.load(record, machine)
    inputs = await Executions(storage).inputs(execution_id)
    assert [(i.via, i.event and i.event.type) for i in inputs] == [
        ("step", "external"),
        ("timer", "internal"),
        ("timer", "external"),
    ]
    # The router scheduled the sends: nothing was refused, the default policy.
    steps = replay(machine, inputs, execution_id=execution_id)
    assert [(s.via, s.event_name, s.configuration) for s in steps] == [
        ("create", None, ("waiting",)),
        ("step", "start", ("waiting",)),
        ("timer", "remind", ("waiting",)),
        ("timer", "nudge", ("nudged",)),
    ]
    assert steps[-1].datamodel == {"kinds": ["internal", "external"]}
    assert not diverges(steps[-1], state)


# Against the lifecycle itself, for generated inputs.

COUNTER = (
    f'<scxml {NS} initial="idle">'
    '<datamodel><data id="n" expr="0"/><data id="kinds" expr="[]"/></datamodel>'
    '<state id="idle"><transition event="tick"><assign location="n" expr="n + 1"/>'
    '<assign location="kinds" expr="kinds + [_event.type]"/></transition>'
    '<transition event="go" target="busy"/></state>'
    '<state id="busy"><onentry><raise event="entered"/></onentry>'
    '<transition event="entered"><assign location="n" expr="n * 2"/></transition>'
    '<transition event="tick" cond="n &gt; 6" target="done"/>'
    '<transition event="tick"><assign location="kinds" expr="kinds + [_event.type]"/>'
    '</transition><transition event="back" target="idle"/></state>'
    '<final id="done"/></scxml>'
)

INPUTS = st.lists(
    st.tuples(
        st.sampled_from(["tick", "go", "back", "other", "scan", "load", "ping", "arrive"]),
        st.sampled_from(["step", "timer"]),
        st.booleans(),
    ),
    max_size=12,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([COUNTER, PARCEL]), INPUTS)
def test_replay_agrees_with_the_lifecycle_after_every_input(
    chart: str, inputs: list[tuple[str, str, bool]]
) -> None:
    """Byte for byte: each replayed position, written as the store writes one, is the
    position the lifecycle stored after that input (counters and queues included)."""
    machine = compile_chart(chart)

    async def run() -> tuple[list[tuple[object, ...]], list[LoggedInput]]:
        storage = Storage(MemoryAdapter())
        executions = Executions(storage)
        created = await executions.create("ex", machine)
        after = [_seen(created.state, created.execution.position)]
        for name, via, internal in inputs:
            # A timer's send to #_internal is stepped onto the internal queue.
            internal = internal and via == "timer"
            event = Event(name, type="internal" if internal else "external")
            stepped = await executions.step("ex", machine, event, via=via, internal=internal)
            if isinstance(stepped, Stepped):
                after.append(_seen(stepped.state, stepped.execution.position))
        return after, await executions.inputs("ex")

    after, log = asyncio.run(run())
    positions: list[bytes] = []
    computed = replay_module._step

    def step(
        index: int,
        via: str,
        entry: LoggedInput | None,
        state: MachineState,
        made: replay_module.Made,
    ) -> ReplayStep:
        positions.append(stored_positions.dump(state._replace(trace=False)))
        return computed(index, via, entry, state, made)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay_module, "_step", step)
        steps = replay(machine, log, execution_id="ex", refusals=refuse_unperformed)
    assert all(s.not_replayed is None for s in steps)
    replayed = [
        (s.configuration, dict(s.datamodel), p) for s, p in zip(steps, positions, strict=True)
    ]
    assert replayed == after


def _seen(state: MachineState, position: bytes | None) -> tuple[object, ...]:
    return (state.leaf_configuration(), shown_datamodel(state), position)


# What cannot be replayed is marked, never raised.


def test_a_log_closed_at_its_cap_marks_what_it_did_not_keep() -> None:
    machine = compile_chart(COUNTER)

    async def run() -> tuple[list[LoggedInput], MachineState]:
        storage = Storage(MemoryAdapter(), input_log_cap=3)
        executions = Executions(storage)
        await executions.create("ex", machine)
        for _ in range(5):
            await executions.step("ex", machine, Event("tick"))
        record = await storage.fetch_execution("ex")
        return await executions.inputs("ex"), storage.load(record, machine)

    log, state = asyncio.run(run())
    assert [entry.event is None for entry in log] == [False, False, True]
    steps = replay(machine, log, execution_id="ex")
    assert [s.not_replayed for s in steps] == [
        None,
        None,
        None,
        "the input log was closed here at its cap",
    ]
    assert steps[3].datamodel == steps[2].datamodel == {"kinds": ["external"] * 2, "n": 2}
    assert state.datamodel["n"] == 5
    assert diverges(steps[-1], state)


def test_inputs_after_a_failure_are_marked_and_the_rest_kept() -> None:
    machine = compile_chart(COUNTER)

    def broken(effect: fx.Effect, context: EffectContext) -> Refused | None:
        if isinstance(effect, fx.Send):
            raise RuntimeError("the host's policy broke")
        return None

    # PARCEL's "ping" sends: the policy asked about that send raises.
    parcel = compile_chart(PARCEL)
    log = logged(Event("load"), Event("ping"), Event("arrive"))
    steps = replay(parcel, log, refusals=broken)
    assert [s.not_replayed for s in steps] == [
        None,
        None,
        "the interpreter could not replay this input: RuntimeError: the host's policy broke",
        "an earlier input could not be replayed",
    ]
    # A marked step repeats the last computed position and names its own input.
    assert (steps[3].event_name, steps[3].seq) == ("arrive", 2)
    assert steps[3].configuration == steps[1].configuration == ("driving", "silent")
    # An input after the chart stopped (the lifecycle never logs one) is marked too.
    log = logged(*[Event("tick")] * 4, Event("go"), Event("tick"), Event("tick"))
    steps = replay(machine, log)
    assert [s.datamodel["n"] for s in steps] == [0, 1, 2, 3, 4, 8, 8, 8]
    assert (steps[6].final_state, steps[6].not_replayed) == ("done", None)
    assert steps[7].not_replayed == "the chart had stopped before this input"


def test_a_start_that_cannot_be_replayed_marks_every_step() -> None:
    chart = compile_chart(
        f'<scxml {NS}><state id="s"><onentry><send event="x" target="#_elsewhere"/>'
        "</onentry></state></scxml>"
    )

    def broken(effect: fx.Effect, context: EffectContext) -> Refused | None:
        raise ValueError("no")

    steps = replay(chart, logged(Event("a"), Event("b")), refusals=broken)
    assert steps[0].not_replayed == "the start could not be replayed: ValueError: no"
    assert [s.not_replayed for s in steps[1:]] == ["an earlier input could not be replayed"] * 2
    assert [s.event_name for s in steps] == [None, "a", "b"]


def test_the_limit_bounds_the_work() -> None:
    machine = compile_chart(COUNTER)
    steps = replay(machine, logged(*[Event("tick")] * 5), limit=2)
    assert [s.datamodel["n"] for s in steps] == [0, 1, 2, 2, 2, 2]
    assert [s.not_replayed for s in steps[3:]] == ["past the replay limit of 2 inputs"] * 3
    with pytest.raises(ValueError, match="limit"):
        replay(machine, [], limit=-1)
    assert replay(machine, [], limit=0) == [
        ReplayStep(0, "create", None, UNDEFINED, ("idle",), {"kinds": [], "n": 0}, ("idle",))
    ]


def test_system_variables_never_reach_a_step() -> None:
    # A router-created execution's _ioprocessors carries its BasicHTTP bearer token.
    location = {"location": "https://example.test/basichttp/SECRET-TOKEN"}
    options = StartOptions(datamodel={"_ioprocessors": {"basichttp": location}})
    chart = compile_chart(
        f'<scxml {NS}><datamodel><data id="me" expr="_sessionid"/></datamodel>'
        '<state id="s"><transition event="e"><assign location="me" expr="_event.name"/>'
        "</transition></state></scxml>"
    )
    steps = replay(chart, logged(Event("e")), execution_id="ex-9", options=options)
    assert [dict(s.datamodel) for s in steps] == [{"me": "ex-9"}, {"me": "e"}]
    assert not any(name in s.datamodel for s in steps for name in SYSTEM_VARIABLES)
    assert "SECRET-TOKEN" not in repr(steps)


def test_assume_performed_refuses_nothing() -> None:
    context = EffectContext("ex", via="step", ordinal=0, macrostep=0, microstep=0, round=0)
    send = fx.Send(
        macrostep=0,
        microstep=0,
        round=0,
        event="x",
        target="#_elsewhere",
        type=None,
        data=UNDEFINED,
        send_id="s1",
        author_id=False,
        content_index=0,
    )
    assert assume_performed(send, context) is None
    assert isinstance(refuse_unperformed(send, context), Refused)


def test_a_call_to_a_host_function_the_replay_lacks_is_marked() -> None:
    chart = (
        f'<scxml {NS} initial="a"><datamodel><data id="x" expr="1"/></datamodel>'
        '<state id="a"><transition event="price">'
        '<assign location="x" expr="tariff(x)"/></transition>'
        '<transition event="error.execution" target="broken"/></state>'
        '<state id="broken"/></scxml>'
    )
    tariff = Function(lambda args: args[0] * 10, arity=1)
    log = logged(Event("price"), Event("price"))
    hosted = replay(compile_chart(chart, functions={"tariff": tariff}), log)
    assert [s.datamodel["x"] for s in hosted] == [1, 10, 100]
    assert all(s.not_replayed is None for s in hosted)
    bare = replay(compile_chart(chart), log)
    assert [s.not_replayed for s in bare] == [
        None,
        "the chart called tariff(), a host function the replay was not given",
        "an earlier input could not be replayed",
    ]
    assert bare[1].configuration == ("a",)  # the last position known, not ("broken",)
    # At the start too.
    start = chart.replace('expr="1"', 'expr="tariff(2)"')
    steps = replay(compile_chart(start), log)
    assert steps[0].not_replayed == (
        "the chart called tariff(), a host function the replay was not given"
    )
    assert [s.not_replayed for s in steps[1:]] == ["an earlier input could not be replayed"] * 2
