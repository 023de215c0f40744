"""The execution lifecycle over the in-memory reference adapter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from statifier.chart import Machine, compile_chart
from statifier.core import Event, StartOptions, handle_event, initialize
from statifier.core import effects as fx
from statifier.core.positions import IdentityMismatch, dump
from statifier.persistence import (
    Discarded,
    EffectContext,
    ExecutionNotFound,
    Executions,
    LockTimeout,
    MemoryAdapter,
    Status,
    Stepped,
    Storage,
    decode_outcome,
    prune,
)
from statifier.persistence.adapter import Adapter, Capabilities
from statifier.persistence.errors import (
    ChartNotFound,
    ChartRetired,
    ExecutionExists,
    MetadataUnsupported,
    Pinned,
    PinSourceFailed,
    SerializationUnsupported,
    Unstorable,
)
from statifier.persistence.executions import CREATE_VIA, PARENT_KEY, START_EVENT, logged_start
from statifier.persistence.serialization import Unserialized

SCXML = 'xmlns="http://www.w3.org/2005/07/scxml"'

PAYMENT = f"""<scxml {SCXML} initial="authorizing" datamodel="predicator">
  <state id="authorizing">
    <onentry><log label="authorizing" expr="1"/></onentry>
    <transition event="authorized" target="capturing"/>
    <transition event="declined" target="declined"/>
  </state>
  <state id="capturing">
    <onexit><log label="leaving capture" expr="2"/></onexit>
    <transition event="captured" target="settled"/>
  </state>
  <final id="settled">
    <donedata><param name="amount" expr="42"/></donedata>
  </final>
  <final id="declined">
    <donedata>
      <param name="statifier_persistence:execution_status" expr="'failed'"/>
      <param name="reason" expr="'card_declined'"/>
    </donedata>
  </final>
</scxml>"""

COUNTER = f"""<scxml {SCXML} initial="counting" datamodel="predicator">
  <datamodel><data id="seen" expr="[]"/></datamodel>
  <state id="counting">
    <transition event="n"><assign location="seen" expr="seen + [_event.data]"/></transition>
    <transition event="stop" target="stopped"/>
  </state>
  <final id="stopped"/>
</scxml>"""

LOOP = f"""<scxml {SCXML} initial="a" datamodel="predicator">
  <state id="a"><transition event="spin" target="b"/></state>
  <state id="b"><transition target="c"/></state>
  <state id="c"><transition target="b"/></state>
</scxml>"""


@pytest.fixture
def payment() -> Machine:
    return compile_chart(PAYMENT)


@pytest.fixture
def counter() -> Machine:
    return compile_chart(COUNTER)


class Recorder:
    """An executor that remembers what it was handed."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, effect: fx.Effect, context: EffectContext) -> None:
        self.seen.append((type(effect).__name__, context.key))


Make = Callable[..., Executions]


@pytest.fixture
def make(adapter: Adapter) -> Make:
    """Executions over the test's store, with an executor and options."""

    def build(executor: Any = None, **options: Any) -> Executions:
        storage = Storage(adapter, input_log_cap=options.pop("cap", None))
        if executor is None:
            return Executions(storage, **options)
        return Executions(storage, executor=executor, **options)

    return build


@pytest.mark.asyncio
async def test_an_execution_runs_to_completion_and_the_finishing_call_returns_donedata(
    make: Make,
    payment: Machine,
) -> None:
    executions = make()
    created = await executions.create("txn_1", payment)
    assert created.execution.status is Status.ACTIVE
    assert created.state.leaf_configuration() == ("authorizing",)
    stepped = await executions.step("txn_1", payment, Event("authorized"))
    assert isinstance(stepped, Stepped)
    assert stepped.state.leaf_configuration() == ("capturing",)
    assert not stepped.finished
    done = await executions.step("txn_1", payment, Event("captured"))
    assert isinstance(done, Stepped)
    assert done.finished
    assert done.donedata == {"amount": 42}
    record = done.execution
    assert record.status is Status.COMPLETED
    assert record.ended_at is not None
    assert decode_outcome(record) == {"amount": 42}


@pytest.mark.asyncio
async def test_a_step_to_a_terminal_execution_is_discarded_and_logs_nothing(
    make: Make,
    payment: Machine,
) -> None:
    executions = make()
    await executions.create("txn_1", payment)
    await executions.step("txn_1", payment, Event("declined"))
    late = await executions.step("txn_1", payment, Event("authorized"))
    assert isinstance(late, Discarded)
    assert late.execution.status is Status.FAILED
    assert [entry.event.name for entry in await executions.inputs("txn_1") if entry.event] == [
        "declined"
    ]


@pytest.mark.asyncio
async def test_a_failure_classed_final_ends_the_execution_as_failed(
    make: Make, payment: Machine
) -> None:
    executions = make()
    await executions.create("txn_1", payment)
    result = await executions.step("txn_1", payment, Event("declined"))
    assert isinstance(result, Stepped)
    assert result.execution.status is Status.FAILED
    assert result.execution.failure == "failed_final"
    assert decode_outcome(result.execution) == {
        "statifier_persistence:execution_status": "failed",
        "reason": "card_declined",
    }


@pytest.mark.asyncio
async def test_exhausting_the_round_budget_ends_the_execution_as_failed(make: Make) -> None:
    machine = compile_chart(LOOP)
    executions = make()
    await executions.create("loop", machine, options=StartOptions(round_budget=50))
    result = await executions.step("loop", machine, Event("spin"))
    assert isinstance(result, Stepped)
    assert result.execution.status is Status.FAILED
    assert result.execution.failure == "round_budget"
    assert decode_outcome(result.execution) == {"reason": "round_budget", "budget": 50}


@pytest.mark.asyncio
async def test_the_identity_guard_refuses_another_chart(make: Make, payment: Machine) -> None:
    executions = make()
    await executions.create("txn_1", payment)
    edited = compile_chart(PAYMENT.replace("card_declined", "declined"))
    with pytest.raises(IdentityMismatch):
        await executions.step("txn_1", edited, Event("authorized"))
    record = await executions.storage.fetch_execution("txn_1")
    assert executions.storage.load(record, payment).leaf_configuration() == ("authorizing",)


@pytest.mark.asyncio
async def test_a_taken_id_is_refused_before_any_effect(make: Make, payment: Machine) -> None:
    recorder = Recorder()
    executions = make(recorder)
    await executions.create("txn_1", payment)
    before = list(recorder.seen)
    with pytest.raises(ExecutionExists):
        await executions.create("txn_1", payment)
    assert recorder.seen == before
    with pytest.raises(ExecutionNotFound):
        await executions.step("nope", payment, Event("authorized"))


@pytest.mark.asyncio
async def test_effects_reach_the_executor_in_order_with_deterministic_keys(
    make: Make,
    payment: Machine,
) -> None:
    recorder = Recorder()
    executions = make(recorder)
    await executions.create("txn_1", payment)
    await executions.step("txn_1", payment, Event("authorized"))
    await executions.step("txn_1", payment, Event("captured"))
    kinds = [kind for kind, _ in recorder.seen]
    assert "Done" not in kinds
    assert kinds.count("Log") == 2
    keys = [key for _, key in recorder.seen]
    assert len(set(keys)) == len(keys)
    assert all(key.startswith("txn_1/") for key in keys)


@pytest.mark.asyncio
async def test_a_coroutine_executor_is_awaited_one_effect_at_a_time(
    make: Make, payment: Machine
) -> None:
    order: list[str] = []

    async def executor(effect: fx.Effect, context: EffectContext) -> None:
        order.append(f"start {context.ordinal}")
        await asyncio.sleep(0)
        order.append(f"end {context.ordinal}")

    executions = make(executor)
    await executions.create("txn_1", payment)
    await executions.step("txn_1", payment, Event("authorized"))
    assert order == [f"{edge} {n}" for n in range(len(order) // 2) for edge in ("start", "end")]


@pytest.mark.asyncio
async def test_a_failing_executor_stores_nothing_and_the_redrive_repeats_the_keys(
    make: Make,
    payment: Machine,
) -> None:
    keys: list[str] = []
    fail = True

    def executor(effect: fx.Effect, context: EffectContext) -> None:
        keys.append(context.key)
        if fail and isinstance(effect, fx.Log) and effect.label == "leaving capture":
            raise RuntimeError("gateway down")

    executions = make(executor)
    await executions.create("txn_1", payment)
    await executions.step("txn_1", payment, Event("authorized"))
    keys.clear()
    with pytest.raises(RuntimeError, match="gateway down"):
        await executions.step("txn_1", payment, Event("captured"))
    first = list(keys)
    record = await executions.storage.fetch_execution("txn_1")
    assert record.status is Status.ACTIVE
    assert len(await executions.inputs("txn_1")) == 1
    fail = False
    keys.clear()
    result = await executions.step("txn_1", payment, Event("captured"))
    assert isinstance(result, Stepped)
    assert result.finished
    assert keys[: len(first)] == first


@pytest.mark.asyncio
async def test_the_input_log_replays_to_the_same_position(make: Make, counter: Machine) -> None:
    executions = make()
    await executions.create("c", counter)
    for n in range(5):
        await executions.step("c", counter, Event("n", data=n), via="webhook" if n % 2 else "step")
    entries = await executions.inputs("c")
    assert [entry.seq for entry in entries] == [0, 1, 2, 3, 4]
    assert [entry.via for entry in entries] == ["step", "webhook", "step", "webhook", "step"]
    state, _ = initialize(counter, StartOptions(session_id="c"))
    for entry in entries:
        assert entry.event is not None
        state, _ = handle_event(state, entry.event)
    record = await executions.storage.fetch_execution("c")
    assert dump(state) == record.position
    assert state.datamodel["seen"] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
async def test_a_capped_log_closes_with_a_marker_and_the_execution_carries_on(
    make: Make,
    counter: Machine,
) -> None:
    executions = make(cap=3)
    await executions.create("c", counter)
    for n in range(6):
        await executions.step("c", counter, Event("n", data=n))
    entries = await executions.inputs("c")
    assert [(entry.seq, entry.event is None) for entry in entries] == [
        (0, False),
        (1, False),
        (2, True),
    ]
    record = await executions.storage.fetch_execution("c")
    assert executions.storage.load(record, counter).datamodel["seen"] == list(range(6))


@pytest.mark.asyncio
async def test_start_data_opens_the_log_and_a_replay_from_it_reaches_the_stored_position(
    make: Make,
    counter: Machine,
) -> None:
    executions = make()
    await executions.create("plain", counter)
    await executions.create("seeded", counter, options=StartOptions(datamodel={"seen": [7]}))
    for n in (1, 2):
        await executions.step("seeded", counter, Event("n", data=n))
    assert await executions.inputs("plain") == []
    entries = await executions.inputs("seeded")
    assert [(entry.seq, entry.via) for entry in entries] == [
        (0, "create"),
        (1, "step"),
        (2, "step"),
    ]
    assert entries[0].event == Event(START_EVENT, data={"seen": [7]})
    start, rest = logged_start(entries, StartOptions(session_id="seeded"))
    state, _ = initialize(counter, start)
    for entry in rest:
        assert entry.event is not None
        state, _ = handle_event(state, entry.event)
    record = await executions.storage.fetch_execution("seeded")
    assert dump(state) == record.position
    assert state.datamodel["seen"] == [7, 1, 2]
    with pytest.raises(ValueError, match="lifecycle's own"):
        await executions.step("seeded", counter, Event("n", data=3), via=CREATE_VIA)


@pytest.mark.asyncio
async def test_concurrent_steps_of_one_execution_lose_and_duplicate_nothing(
    make: Make,
    counter: Machine,
) -> None:
    executions = make()
    await executions.create("c", counter)

    async def deliver(task: int) -> None:
        for n in range(task * 25, task * 25 + 25):
            await executions.step("c", counter, Event("n", data=n))

    await asyncio.gather(*(deliver(task) for task in range(8)))
    record = await executions.storage.fetch_execution("c")
    seen = executions.storage.load(record, counter).datamodel["seen"]
    assert isinstance(seen, list)
    assert sorted(seen) == list(range(200))
    logged = [entry.event.data for entry in await executions.inputs("c") if entry.event]
    assert logged == seen
    assert [entry.seq for entry in await executions.inputs("c")] == list(range(200))


@pytest.mark.asyncio
async def test_a_lock_wait_beyond_the_bound_is_a_typed_error(
    adapter: Adapter, payment: Machine
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(effect: fx.Effect, context: EffectContext) -> None:
        entered.set()  # the holder is inside its block, holding the lock
        await release.wait()

    storage = Storage(adapter)
    holder = Executions(storage, executor=slow)
    waiter = Executions(storage, lock_wait=0.05)
    held = asyncio.create_task(holder.create("c", payment))  # its onentry log waits
    await asyncio.wait_for(entered.wait(), timeout=10)
    with pytest.raises(LockTimeout) as caught:
        await waiter.step("c", payment, Event("authorized"))
    assert caught.value.execution_id == "c"
    assert caught.value.waited >= 0.04
    release.set()
    assert (await held).execution.status is Status.ACTIVE
    assert isinstance(await waiter.step("c", payment, Event("authorized")), Stepped)


@pytest.mark.asyncio
async def test_metadata_is_written_once_and_listed_by_equality_on_all_pairs(
    make: Make,
    payment: Machine,
) -> None:
    executions = make()
    await executions.create("a", payment, metadata={"tenant": "t1", "account": "p1"})
    await executions.create("b", payment, metadata={"tenant": "t1", "account": "p2"})
    await executions.create("c", payment)
    await executions.step("a", payment, Event("authorized"))
    listed = await executions.storage.list_executions(tenant="t1", account="p1")
    assert [record.id for record in listed] == ["a"]
    assert listed[0].metadata == {"tenant": "t1", "account": "p1"}
    assert {r.id for r in await executions.storage.list_executions(tenant="t1")} == {"a", "b"}
    with pytest.raises(TypeError):
        await executions.create("d", payment, metadata={"tenant": 7})  # type: ignore[dict-item]


class NoMetadata(MemoryAdapter):
    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(lock=True)


class NoLock(MemoryAdapter):
    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(metadata=True)


@pytest.mark.asyncio
async def test_declared_capabilities_decide_what_is_refused(payment: Machine) -> None:
    executions = Executions(Storage(NoMetadata()))
    with pytest.raises(MetadataUnsupported):
        await executions.create("a", payment, metadata={"tenant": "t1"})
    created = await executions.create("a", payment, metadata={})
    assert created.execution.metadata == {}
    assert await executions.inputs("a") == []
    with pytest.raises(SerializationUnsupported):
        Executions(Storage(NoLock()))
    single_writer = Executions(Storage(NoLock()), serialization=Unserialized())
    assert (await single_writer.create("a", payment)).execution.status is Status.ACTIVE


@pytest.mark.asyncio
async def test_fail_ends_an_execution_on_the_hosts_word(make: Make, payment: Machine) -> None:
    executions = make()
    await executions.create("a", payment)
    failed = await executions.fail("a", "fraud_suspected")
    assert not isinstance(failed, Discarded)
    assert failed.status is Status.FAILED
    assert failed.failure == "fraud_suspected"
    assert decode_outcome(failed) == {"reason": "fraud_suspected"}
    assert isinstance(await executions.fail("a", "again"), Discarded)


@pytest.mark.asyncio
async def test_cancel_runs_exit_content_and_cascades_to_durable_children(
    make: Make,
    payment: Machine,
) -> None:
    recorder = Recorder()
    executions = make(recorder)
    await executions.create("parent", payment)
    await executions.step("parent", payment, Event("authorized"))
    await executions.create("child_0", payment, metadata={PARENT_KEY: "parent"})
    await executions.create("child_1", payment, metadata={PARENT_KEY: "parent"})
    await executions.step("child_1", payment, Event("declined"))
    recorder.seen.clear()
    cancelled = await executions.cancel("parent")
    assert isinstance(cancelled, Stepped)
    assert cancelled.execution.status is Status.CANCELLED
    # the onexit log of "capturing" ran through the executor
    assert [kind for kind, key in recorder.seen if key.startswith("parent/")] == ["Log"]
    child_0 = await executions.storage.fetch_execution("child_0")
    child_1 = await executions.storage.fetch_execution("child_1")
    assert child_0.status is Status.CANCELLED
    assert child_1.status is Status.FAILED  # already ended: left as it was
    assert isinstance(await executions.cancel("parent"), Discarded)


@pytest.mark.asyncio
async def test_cancel_matching_cancels_the_unended_executions_holding_every_pair(
    make: Make, payment: Machine
) -> None:
    executions = make()
    await executions.create("a", payment, metadata={"batch": "b1", "region": "eu"})
    await executions.create("b", payment, metadata={"batch": "b1", "region": "us"})
    await executions.create("c", payment, metadata={"batch": "b1", "region": "eu"})
    await executions.step("c", payment, Event("declined"))
    await executions.cancel_matching({"batch": "b1", "region": "eu"})
    statuses = {
        execution_id: (await executions.storage.fetch_execution(execution_id)).status
        for execution_id in ("a", "b", "c")
    }
    assert statuses == {"a": Status.CANCELLED, "b": Status.ACTIVE, "c": Status.FAILED}
    with pytest.raises(MetadataUnsupported):
        await Executions(Storage(NoMetadata())).cancel_matching({"batch": "b1"})


@pytest.mark.asyncio
async def test_a_parked_execution_takes_no_event_until_unparked(
    make: Make, payment: Machine
) -> None:
    executions = make()
    await executions.create("a", payment)
    parked = await executions.park("a")
    assert not isinstance(parked, Discarded)
    assert parked.status is Status.NEEDS_MIGRATION
    assert isinstance(await executions.step("a", payment, Event("authorized")), Discarded)
    assert isinstance(await executions.unpark("a"), type(parked))
    assert isinstance(await executions.step("a", payment, Event("authorized")), Stepped)


@pytest.mark.asyncio
async def test_an_unstorable_event_is_refused_before_any_effect(
    make: Make, counter: Machine
) -> None:
    recorder = Recorder()
    executions = make(recorder)
    await executions.create("c", counter)
    recorder.seen.clear()
    with pytest.raises(Unstorable):
        await executions.step("c", counter, Event("n", data={"$type": "sneaky"}))
    # Neither NaN nor an infinity is JSON: a sink or a jsonb column could not take it.
    for number in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(Unstorable, match="not JSON compliant"):
            await executions.step("c", counter, Event("n", data={"amount": number}))
    assert recorder.seen == []
    assert await executions.inputs("c") == []


GROWING = f"""<scxml {SCXML} initial="a">
  <datamodel><data id="x" expr="0"/></datamodel>
  <state id="a">
    <transition event="grow" target="b">
      <log label="growing" expr="1"/>
      <script>i = 0; while i &lt; TIMES {{ x = GROWTH; i = i + 1 }}</script>
    </transition>
  </state>
  <state id="b"/>
</scxml>"""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("growth", "times", "refusal"),
    [("{k: x}", 5000, "nested deeper than 128"), ("[x, x]", 30, "too large to store")],
    ids=["too_deep", "too_large"],
)
async def test_a_datamodel_too_deep_is_refused_unstored_as_one_too_large(
    make: Make, growth: str, times: int, refusal: str
) -> None:
    # x = {k: x} five thousand times: the step's new position is refused as Unstorable
    # (never a RecursionError), exactly as one doubled past the size bound is: nothing
    # stored or logged, the execution where it was, every time.
    machine = compile_chart(GROWING.replace("GROWTH", growth).replace("TIMES", str(times)))
    recorder = Recorder()
    executions = make(recorder)
    created = await executions.create("g", machine)
    recorder.seen.clear()
    for _ in range(2):
        with pytest.raises(Unstorable, match=refusal):
            await executions.step("g", machine, Event("grow"))
    # Refused before the executor was handed the step's log, as the lifecycle promises.
    assert recorder.seen == []
    assert await executions.inputs("g") == []
    record = await executions.storage.fetch_execution("g")
    assert (record.status, record.position) == (Status.ACTIVE, created.execution.position)
    assert executions.storage.load(record, machine).leaf_configuration() == ("a",)


GROWING_AT_START = f"""<scxml {SCXML} initial="a">
  <datamodel><data id="x" expr="0"/></datamodel>
  <state id="a">
    <onentry>
      <log label="starting" expr="1"/>
      <script>i = 0; while i &lt; 5000 {{ x = {{k: x}}; i = i + 1 }}</script>
    </onentry>
  </state>
</scxml>"""


@pytest.mark.asyncio
async def test_a_start_that_cannot_be_stored_is_refused_before_any_effect(make: Make) -> None:
    recorder = Recorder()
    executions = make(recorder)
    with pytest.raises(Unstorable, match="nested deeper than 128"):
        await executions.create("g", compile_chart(GROWING_AT_START))
    assert recorder.seen == []
    assert await executions.storage.find_execution("g") is None


@pytest.mark.asyncio
async def test_an_event_nested_too_deep_is_refused_before_any_effect(
    make: Make, counter: Machine
) -> None:
    recorder = Recorder()
    executions = make(recorder)
    await executions.create("c", counter)
    recorder.seen.clear()
    deep: Any = 0
    for _ in range(5000):
        deep = {"k": deep}
    with pytest.raises(Unstorable, match="nested deeper than 128"):
        await executions.step("c", counter, Event("n", data=deep))
    assert recorder.seen == []
    assert await executions.inputs("c") == []


class Timers:
    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.asked: list[Sequence[str]] = []

    async def pins(self, content_hash: str, execution_ids: Sequence[str]) -> Mapping[str, int]:
        self.asked.append(execution_ids)
        return {"pending_timers": self.pending}


class Broken:
    async def pins(self, content_hash: str, execution_ids: Sequence[str]) -> Mapping[str, int]:
        raise TimeoutError("timer store unreachable")


@pytest.mark.asyncio
async def test_retiring_a_chart_refuses_with_every_count_then_tombstones_it(
    make: Make,
    payment: Machine,
) -> None:
    executions = make()
    chart = payment.identity.content_hash
    await executions.create("a", payment)
    await executions.create("b", payment)
    await executions.step("b", payment, Event("declined"))
    timers = Timers(pending=2)
    with pytest.raises(Pinned) as pinned:
        await executions.retire_chart(chart, retired_by="ops", pin_sources=[timers])
    assert pinned.value.counts == {
        "executions_active": 1,
        "executions_failed": 1,
        "Timers.pending_timers": 2,
    }
    assert timers.asked == [("a",)]
    with pytest.raises(PinSourceFailed):
        await executions.retire_chart(chart, retired_by="ops", pin_sources=[Broken()])
    await executions.fail("a", "abandoned")
    timers.pending = 0
    retired = await executions.retire_chart(chart, retired_by="ops", pin_sources=[timers])
    assert retired.source is None
    assert retired.retired_by == "ops"
    with pytest.raises(ChartRetired):
        await executions.storage.fetch_chart(chart)
    with pytest.raises(ChartRetired):
        await executions.storage.save_chart(payment)
    with pytest.raises(ChartNotFound):
        await executions.retire_chart("sha256:none", retired_by="ops")


@pytest.mark.asyncio
async def test_a_saved_position_pins_its_chart_and_loads_only_for_it(
    make: Make, payment: Machine
) -> None:
    executions = make()
    state, _ = initialize(payment)
    storage = executions.storage
    await storage.save_chart(payment)
    await storage.save_position("session_1", state)
    with pytest.raises(Pinned) as pinned:
        await executions.retire_chart(payment.identity.content_hash, retired_by="ops")
    assert pinned.value.counts == {"positions": 1}
    loaded = await storage.load_position("session_1", payment)
    assert loaded is not None
    assert loaded.leaf_configuration() == ("authorizing",)
    with pytest.raises(IdentityMismatch):
        await storage.load_position("session_1", compile_chart(LOOP))
    assert await storage.delete_position("session_1")
    assert await storage.load_position("session_1", payment) is None


@pytest.mark.asyncio
async def test_prune_clears_what_ended_before_the_cutoff_and_keeps_the_rows(
    adapter: Adapter,
    counter: Machine,
) -> None:
    now = datetime(2026, 11, 1, tzinfo=UTC)
    clock = [now]
    storage = Storage(adapter, clock=lambda: clock[0])
    executions = Executions(storage)
    for name in ("old", "new", "running"):
        await executions.create(name, counter)
        await executions.step(name, counter, Event("n", data=1))
    await executions.step("old", counter, Event("stop"))
    clock[0] = now + timedelta(days=30)
    await executions.step("new", counter, Event("stop"))
    assert await prune(storage, now + timedelta(days=1), batch_size=1) == 1
    old = await storage.fetch_execution("old")
    assert old.position is None
    assert old.status is Status.COMPLETED
    assert await executions.inputs("old") == []
    assert (await storage.fetch_execution("new")).position is not None
    assert len(await executions.inputs("running")) == 1
    assert await prune(storage, now + timedelta(days=1)) == 0
    with pytest.raises(ValueError, match="aware"):
        await prune(storage, datetime(2026, 1, 1))  # noqa: DTZ001 - the point of the test


@pytest.mark.asyncio
async def test_the_chart_is_compiled_again_from_storage_after_a_restart(
    adapter: Adapter,
    payment: Machine,
) -> None:
    before = Executions(Storage(adapter))
    await before.create("txn", payment)
    after = Executions(Storage(adapter))  # a new process: nothing but the adapter's records
    record = await after.storage.fetch_execution("txn")
    rebooted = await after.storage.machine(record.content_hash)
    assert rebooted is not payment
    assert rebooted.identity == payment.identity
    result = await after.step("txn", rebooted, Event("authorized"))
    assert isinstance(result, Stepped)
    assert result.state.leaf_configuration() == ("capturing",)


@pytest.mark.asyncio
async def test_calls_lock_waits_adapter_calls_and_lifecycle_are_reported(
    make: Make, payment: Machine
) -> None:
    from statifier import telemetry

    seen: list[tuple[str, dict[str, Any]]] = []
    names = [name for name in telemetry.EVENTS if name.startswith("statifier.persistence.")]
    for name in names:
        telemetry.attach(f"test-{name}", name, lambda n, m, meta: seen.append((n, {**meta})))

    def broken(effect: fx.Effect, context: EffectContext) -> None:
        raise RuntimeError("no")

    try:
        executions = make()
        await executions.create("a", payment)
        await executions.step("a", payment, Event("declined"))
        with pytest.raises(RuntimeError):
            await make(broken).create("b", payment)
    finally:
        for name in names:
            telemetry.detach(f"test-{name}")
    kinds = {name for name, _ in seen}
    assert {
        "statifier.persistence.step",
        "statifier.persistence.lock",
        "statifier.persistence.adapter",
        "statifier.persistence.lifecycle",
        "statifier.persistence.effect_failed",
    } <= kinds
    transitions = [meta["transition"] for name, meta in seen if name.endswith("lifecycle")]
    assert transitions == ["created", "failed"]
    assert ("statifier.persistence.lock", {"execution_id": "b"}) in seen


@pytest.mark.asyncio
async def test_a_step_without_a_machine_runs_the_stored_chart(make: Make, payment: Machine) -> None:
    executions = make()
    await executions.create("txn", payment)
    stepped = await executions.step("txn", None, Event("authorized"))
    assert isinstance(stepped, Stepped)
    assert stepped.state.leaf_configuration() == ("capturing",)
