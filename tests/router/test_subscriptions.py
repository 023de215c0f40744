"""Source invokes on both databases: a state that invokes the configuration's source
type subscribes its execution to a subscription binding while it is active, its exit
cancels exactly that subscription, a subscription binding's event reaches only a
subscribed execution (otherwise ``dropped: not_subscribed``), refusals reach the chart
as ``error.execution``, and the host's own subscribe and unsubscribe, the bindings'
``subscription`` key and the address reaper's cleanup."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.router.conftest import RouterDb
from tests.router.test_route import caller_transaction, end, table_rows

from statifier.chart import compile_chart
from statifier.core import Event, StartOptions
from statifier.core import effects as fx
from statifier.expr import UNDEFINED
from statifier.persistence import EffectContext, Refused
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Binding,
    BindingError,
    ConfigError,
    Create,
    CreatedAndDelivered,
    Delivered,
    Dropped,
    DropReason,
    InboundEvent,
    Plan,
    Router,
    RouterConfig,
    StaticResolver,
    Subscription,
    SubscriptionRefused,
    ledger,
    load_bindings,
    reap_addresses,
)
from statifier.router.sending import SendHandler
from statifier.router.transaction import Delivering

SCOPE = "tenant_a"
SOURCE = "test:source"
SOURCE_INVOKE = (
    f'<invoke id="src" type="{SOURCE}"><param name="binding" expr="\'clicks\'"/></invoke>'
)


def _chart(invoke: str = SOURCE_INVOKE) -> str:
    """``idle`` until opened; ``watching`` holds ``invoke``; a click counts in every
    state (so only the router's gate keeps one out); a refused invocation goes to
    ``refused`` with its message and invoke id."""
    return f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="main">
  <datamodel>
    <data id="clicks" expr="0"/><data id="why" expr="null"/><data id="inv" expr="null"/>
  </datamodel>
  <state id="main" initial="idle">
    <transition event="click"><assign location="clicks" expr="clicks + 1"/></transition>
    <transition event="finish" target="end"/>
    <state id="idle"><transition event="open" target="watching"/></state>
    <state id="watching">
      {invoke}
      <transition event="error.execution" target="refused">
        <assign location="why" expr="_event.data.message"/>
        <assign location="inv" expr="_event.invokeid"/>
      </transition>
      <transition event="stop" target="done"/>
    </state>
    <state id="done"><transition event="open" target="watching"/></state>
    <state id="refused"/>
  </state>
  <final id="end"/>
</scxml>"""


PAIR = f"""<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <datamodel><data id="clicks" expr="0"/></datamodel>
  <state id="idle"><transition event="open" target="both"/></state>
  <parallel id="both">
    <transition event="click"><assign location="clicks" expr="clicks + 1"/></transition>
    <state id="left" initial="left_on">
      <state id="left_on">
        <invoke id="a" type="{SOURCE}"><param name="binding" expr="'clicks'"/></invoke>
        <transition event="stop_left" target="left_off"/>
      </state>
      <state id="left_off"/>
    </state>
    <state id="right" initial="right_on">
      <state id="right_on">
        <invoke id="b" type="{SOURCE}"><param name="binding" expr="'clicks'"/></invoke>
        <transition event="stop_right" target="right_off"/>
      </state>
      <state id="right_off"/>
    </state>
  </parallel>
</scxml>"""
"""Two parallel regions, each invoking the same binding under an invoke id of its own."""


def _bindings() -> list[Binding]:
    return [
        Binding(
            id="opens",
            source="opens",
            match="true",
            key="event.id",
            document="watch",
            event="open",
        ),
        Binding(
            id="opens_new",
            source="fresh",
            match="true",
            key="event.id",
            document="watch",
            event="open",
            create=Create.ALWAYS_NEW,
        ),
        Binding(
            id="clicks",
            source="clicks",
            match="true",
            key="event.id",
            document="watch",
            event="click",
            create=Create.NEVER,
            subscription=True,
        ),
        Binding(
            id="off_clicks",
            source="off",
            match="true",
            key="event.id",
            document="watch",
            event="click",
            create=Create.NEVER,
            subscription=True,
            enabled=False,
        ),
        Binding(
            id="elsewhere_clicks",
            source="elsewhere",
            match="true",
            key="event.id",
            document="elsewhere",
            event="click",
            create=Create.NEVER,
            subscription=True,
        ),
    ]


def _router(db: RouterDb, chart: str | None = None, **options: object) -> Router:
    options.setdefault("source_type", SOURCE)
    machine = compile_chart(_chart() if chart is None else chart)
    return db.router(_bindings(), resolver=StaticResolver({"watch": machine}), **options)


async def _routed(router: Router, source: str, message_id: str, key: str = "k1") -> Any:
    event = InboundEvent(scope=SCOPE, source=source, message_id=message_id, data={"id": key})
    [outcome] = (await router.route(event)).outcomes
    return outcome


HOST = Plan("host_commands", document="watch", create=Create.NEVER)


async def _command(router: Router, name: str, message_id: str, key: str = "k1") -> str:
    outcome = await router.deliver_event(
        HOST, scope=SCOPE, key=key, event=Event(name), message_id=message_id
    )
    return outcome.outcome


async def _where(router: Router, execution_id: str) -> set[str]:
    async with router.transaction() as unit:
        storage = unit.storage
        record = await storage.fetch_execution(execution_id)
        machine = await storage.machine(record.content_hash)
        return set(storage.load(record, machine).leaf_configuration())


async def _datamodel(router: Router, execution_id: str) -> Mapping[str, Any]:
    async with router.transaction() as unit:
        storage = unit.storage
        record = await storage.fetch_execution(execution_id)
        return storage.load(record, await storage.machine(record.content_hash)).datamodel


async def _invokes(router: Router, execution_id: str) -> list[tuple[str, str]]:
    return [(s.invoke_id, s.binding_id) for s in await router.subscriptions_of(execution_id)]


@pytest.mark.asyncio
async def test_a_subscription_lives_while_its_invoking_state_is_active(
    router_db: RouterDb,
) -> None:
    router = _router(router_db)
    opened = await _routed(router, "opens", "o1")
    assert isinstance(opened, CreatedAndDelivered)
    execution_id = opened.execution_id
    [subscription] = await router.subscriptions_of(execution_id)
    assert subscription == Subscription(
        binding_id="clicks",
        execution_id=execution_id,
        invoke_id="src",
        scope=SCOPE,
        key="k1",
        inserted_at=router_db.clock.now,
    )
    clicked = await _routed(router, "clicks", "c1")
    assert clicked == Delivered("clicks", key="k1", execution_id=execution_id)

    # Leaving the state cancels the invocation, and with it the subscription.
    assert await _command(router, "stop", "h1") == "delivered"
    assert await _invokes(router, execution_id) == []
    late = await _routed(router, "clicks", "c2")
    assert late == Dropped(
        "clicks", reason=DropReason.NOT_SUBSCRIBED, key="k1", execution_id=execution_id
    )
    assert late.outcome == "dropped: not_subscribed"
    assert (await _datamodel(router, execution_id))["clicks"] == 1  # never stepped
    row = (await ledger(router, execution_id))[-1]
    assert (row.binding_id, row.message_id, row.outcome, row.reason) == (
        "clicks",
        "c2",
        "dropped",
        "not_subscribed",
    )

    # Entering it again subscribes again, under the same invoke id.
    assert await _command(router, "open", "h2") == "delivered"
    assert await _invokes(router, execution_id) == [("src", "clicks")]
    assert isinstance(await _routed(router, "clicks", "c3"), Delivered)
    assert (await _datamodel(router, execution_id))["clicks"] == 2


@pytest.mark.asyncio
async def test_a_subscription_binding_never_reaches_another_key_or_a_missing_execution(
    router_db: RouterDb,
) -> None:
    router = _router(router_db)
    subscribed = await _routed(router, "opens", "o1", key="k1")
    await _routed(router, "opens", "o2", key="k2")
    await _command(router, "stop", "h1", key="k2")  # k2 is no longer watching
    assert isinstance(await _routed(router, "clicks", "c1", key="k1"), Delivered)
    other = await _routed(router, "clicks", "c2", key="k2")
    assert isinstance(other, Dropped)
    assert other.reason is DropReason.NOT_SUBSCRIBED
    assert other.execution_id != subscribed.execution_id
    missing = await _routed(router, "clicks", "c3", key="k3")
    assert missing == Dropped("clicks", reason=DropReason.NO_EXECUTION, key="k3")


@pytest.mark.asyncio
async def test_two_invocations_of_one_binding_cancel_independently(router_db: RouterDb) -> None:
    router = _router(router_db, PAIR)
    opened = await _routed(router, "opens", "o1")
    execution_id = opened.execution_id
    assert await _invokes(router, execution_id) == [("a", "clicks"), ("b", "clicks")]
    assert isinstance(await _routed(router, "clicks", "c1"), Delivered)

    assert await _command(router, "stop_left", "h1") == "delivered"
    assert await _invokes(router, execution_id) == [("b", "clicks")]
    assert isinstance(await _routed(router, "clicks", "c2"), Delivered)

    assert await _command(router, "stop_right", "h2") == "delivered"
    assert await _invokes(router, execution_id) == []
    late = await _routed(router, "clicks", "c3")
    assert isinstance(late, Dropped)
    assert late.reason is DropReason.NOT_SUBSCRIBED
    assert (await _datamodel(router, execution_id))["clicks"] == 2


def _invoke(binding: str) -> str:
    return f'<invoke id="src" type="{SOURCE}"><param name="binding" expr="\'{binding}\'"/></invoke>'


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("invoke", "message"),
    [
        (_invoke("nope"), "no binding 'nope' in scope 'tenant_a'"),
        (_invoke("opens"), "binding 'opens' is not a subscription binding"),
        (_invoke("off_clicks"), "binding 'off_clicks' is disabled"),
        (_invoke("elsewhere_clicks"), "addresses 'elsewhere', not 'watch'"),
        (
            (
                f'<invoke id="src" type="{SOURCE}" src="feed://x">'
                '<param name="binding" expr="\'clicks\'"/></invoke>'
            ),
            "takes no src and no content",
        ),
        (
            (
                f'<invoke id="src" type="{SOURCE}"><param name="binding" expr="\'clicks\'"/>'
                '<param name="key" expr="\'k9\'"/></invoke>'
            ),
            "names a binding param and nothing else",
        ),
        (f'<invoke id="src" type="{SOURCE}"/>', "names a binding param and nothing else"),
    ],
    ids=["unknown", "not_subscription", "disabled", "other_document", "src", "key", "none"],
)
async def test_a_refused_source_invoke_reaches_the_chart_as_error_execution(
    router_db: RouterDb, invoke: str, message: str
) -> None:
    router = _router(router_db, _chart(invoke))
    opened = await _routed(router, "opens", "o1")
    assert isinstance(opened, CreatedAndDelivered)  # the step stands
    execution_id = opened.execution_id
    assert await _where(router, execution_id) == {"refused"}
    datamodel = await _datamodel(router, execution_id)
    assert message in datamodel["why"]
    assert datamodel["why"].startswith("source invoke: ")
    assert datamodel["inv"] == "src"
    assert table_rows(router_db, "subscriptions") == []


@pytest.mark.asyncio
async def test_an_execution_with_no_address_cannot_subscribe(router_db: RouterDb) -> None:
    router = _router(router_db)
    opened = await _routed(router, "fresh", "o1")  # always_new: no address row
    assert isinstance(opened, CreatedAndDelivered)
    datamodel = await _datamodel(router, opened.execution_id)
    assert "has no address" in datamodel["why"]
    assert datamodel["inv"] == "src"
    assert table_rows(router_db, "subscriptions") == []


@pytest.mark.asyncio
async def test_a_redriven_step_subscribes_once(router_db: RouterDb) -> None:
    router = _router(router_db)
    # The opening delivery rolls back after the invocation subscribed; redriven, it
    # subscribes again, once.
    async with caller_transaction(router) as connection:
        event = InboundEvent(scope=SCOPE, source="opens", message_id="o1", data={"id": "k1"})
        await router.route(event, connection=connection)
        await end(connection, commit=False)
    opened = await _routed(router, "opens", "o1")
    execution_id = opened.execution_id
    assert await _invokes(router, execution_id) == [("src", "clicks")]
    # The same effect handed to the seam again (effects are at least once) adds nothing.
    effect = fx.Invoke(
        macrostep=1,
        microstep=1,
        round=0,
        invoke_id="src",
        type=SOURCE,
        src=None,
        data={"binding": "clicks"},
        content=UNDEFINED,
        autoforward=False,
        state_index=2,
        invoke_index=0,
    )
    context = EffectContext(execution_id, via="step", ordinal=0, macrostep=1, microstep=1, round=0)
    router_db.clock.advance(timedelta(minutes=5))
    for _ in range(2):
        async with router.transaction() as unit:
            delivering = Delivering(None, router_db.clock.now)
            assert await SendHandler(unit, delivering)(effect, context) is None
    [subscription] = await router.subscriptions_of(execution_id)
    assert subscription.inserted_at == router_db.clock.now - timedelta(minutes=5)
    assert len(table_rows(router_db, "subscriptions")) == 1


@pytest.mark.asyncio
async def test_the_host_executor_hears_other_invocations_and_every_cancel(
    router_db: RouterDb,
) -> None:
    heard: list[fx.Effect] = []

    def executor(effect: fx.Effect, context: EffectContext) -> Refused | None:
        heard.append(effect)
        return None

    invokes = SOURCE_INVOKE + '<invoke id="job" type="test:job"/>'
    router = _router(router_db, _chart(invokes), executor=executor)
    opened = await _routed(router, "opens", "o1")
    await _command(router, "stop", "h1")
    assert await _where(router, opened.execution_id) == {"done"}
    invoked = [e.invoke_id for e in heard if isinstance(e, fx.Invoke)]
    cancelled = sorted(e.invoke_id for e in heard if isinstance(e, fx.CancelInvoke))
    assert (invoked, cancelled) == (["job"], ["job", "src"])


@pytest.mark.asyncio
async def test_without_a_source_type_a_source_invoke_goes_to_the_host_executor(
    router_db: RouterDb,
) -> None:
    router = _router(router_db, source_type=None)  # the default executor refuses it
    opened = await _routed(router, "opens", "o1")
    datamodel = await _datamodel(router, opened.execution_id)
    assert datamodel["why"] == f"nothing starts an invocation of type {SOURCE!r}"
    assert table_rows(router_db, "subscriptions") == []


@pytest.mark.asyncio
async def test_the_host_subscribes_and_unsubscribes_by_invoke_id(router_db: RouterDb) -> None:
    router = _router(router_db)
    created = await router.deliver_event(
        Plan("host_commands", document="watch", create=Create.IF_ABSENT),
        scope=SCOPE,
        key="k1",
        event=Event("noop"),
        message_id="h0",
    )
    assert isinstance(created, Dropped)
    assert created.reason is DropReason.UNMATCHED_EVENT  # created, idle
    execution_id = created.execution_id
    assert execution_id is not None
    assert isinstance(await _routed(router, "clicks", "c1"), Dropped)

    subscription = await router.subscribe(execution_id, "clicks", "host-1")
    assert (subscription.scope, subscription.key, subscription.invoke_id) == (
        SCOPE,
        "k1",
        "host-1",
    )
    assert await router.subscribe(execution_id, "clicks", "host-1") == subscription
    await router.subscribe(execution_id, "clicks", "host-2")
    assert isinstance(await _routed(router, "clicks", "c2"), Delivered)

    assert await router.unsubscribe(execution_id, "host-1") is True
    assert await router.unsubscribe(execution_id, "host-1") is False
    assert await _invokes(router, execution_id) == [("host-2", "clicks")]
    assert isinstance(await _routed(router, "clicks", "c3"), Delivered)
    assert await router.unsubscribe(execution_id, "host-2") is True
    assert isinstance(await _routed(router, "clicks", "c4"), Dropped)

    with pytest.raises(SubscriptionRefused, match="not a subscription binding") as refused:
        await router.subscribe(execution_id, "opens", "host-3")
    assert (refused.value.execution_id, refused.value.binding_id) == (execution_id, "opens")
    with pytest.raises(SubscriptionRefused, match="has no address"):
        await router.subscribe("ex_unknown", "clicks", "host-3")
    with pytest.raises(SubscriptionRefused, match="no binding 'nope'"):
        await router.subscribe(execution_id, "nope", "host-3")
    with pytest.raises(ValueError, match="invoke id"):
        await router.subscribe(execution_id, "clicks", "")
    assert await _invokes(router, execution_id) == []


@pytest.mark.asyncio
async def test_the_address_reaper_deletes_the_subscriptions_of_reaped_addresses(
    router_db: RouterDb,
) -> None:
    router = _router(router_db)
    ended = (await _routed(router, "opens", "o1", key="k1")).execution_id
    live = (await _routed(router, "opens", "o2", key="k2")).execution_id
    # A host subscription nothing cancels, on the execution that is about to end.
    await router.subscribe(ended, "clicks", "host-1")
    assert await _command(router, "finish", "h1", key="k1") == "delivered"
    # The end exited the invoking state: its invocation's row is gone, the host's not.
    assert await _invokes(router, ended) == [("host-1", "clicks")]
    finished = await _routed(router, "clicks", "c1", key="k1")
    assert isinstance(finished, Dropped)
    assert finished.reason is DropReason.FINISHED

    later = router_db.clock.advance(timedelta(days=30))
    reaped = await reap_addresses(router, later)
    assert reaped.deleted == 1
    assert await _invokes(router, ended) == []
    assert await _invokes(router, live) == [("src", "clicks")]


def test_bindings_files_spell_subscription(tmp_path: Path) -> None:
    entry = {
        "id": "clicks",
        "source": "clicks",
        "match": "true",
        "key": "event.id",
        "document": "watch",
        "event": "click",
        "create": "never",
        "subscription": True,
    }
    toml = tmp_path / "bindings.toml"
    toml.write_text(
        "[[bindings]]\n"
        + "".join(
            f"{name} = {json.dumps(value) if not isinstance(value, bool) else 'true'}\n"
            for name, value in entry.items()
        )
    )
    as_json = tmp_path / "bindings.json"
    as_json.write_text(json.dumps({"bindings": [entry]}))
    for path in (toml, as_json):
        [binding] = load_bindings(path)
        assert binding.subscription is True
        assert binding.plan.subscription is True
    [plain] = load_bindings([{k: v for k, v in entry.items() if k != "subscription"}])
    assert (plain.subscription, plain.plan.subscription) == (False, False)
    with pytest.raises(BindingError, match="field 'subscription': must be true or false"):
        load_bindings([{**entry, "subscription": "yes"}])


@pytest.mark.parametrize("create", ["if_absent", "always_new"])
def test_a_subscription_binding_must_never_create(create: str) -> None:
    entry = {
        "id": "clicks",
        "source": "clicks",
        "match": "true",
        "key": "event.id",
        "document": "watch",
        "event": "click",
        "subscription": True,
    }
    with pytest.raises(BindingError, match="binding 'clicks', field 'create'") as error:
        load_bindings([{**entry, "create": create}])
    assert error.value.field == "create"
    with pytest.raises(BindingError, match="field 'create'"):
        Binding(**{**entry, "create": Create(create)})  # type: ignore[arg-type]
    with pytest.raises(BindingError, match="field 'create'"):
        Plan("clicks", document="watch", create=Create(create), subscription=True)
    if create == "if_absent":  # the default create mode
        with pytest.raises(BindingError, match="field 'create'"):
            Binding(**entry)  # type: ignore[arg-type]


@pytest.mark.parametrize("source_type", ["", "scxml", "http://www.w3.org/TR/scxml/", 7])
def test_the_source_type_is_checked(source_type: object) -> None:
    chart = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"/></scxml>')
    with pytest.raises(ConfigError, match="source_type"):
        RouterConfig(
            SqlAdapter("sqlite://"),
            bindings=_bindings(),
            resolver=StaticResolver({"watch": chart}),
            source_type=source_type,  # type: ignore[arg-type]
        )


def test_a_host_listing_its_invoke_types_gets_the_source_type_too() -> None:
    chart = compile_chart('<scxml xmlns="http://www.w3.org/2005/07/scxml"><state id="s"/></scxml>')
    config = RouterConfig(
        SqlAdapter("sqlite://"),
        bindings=_bindings(),
        resolver=StaticResolver({"watch": chart}),
        source_type=SOURCE,
        start_options=StartOptions(invoke_types=frozenset({"test:job"})),
    )
    router = Router(config)
    assert router.config.chart_start_options.invoke_types == frozenset({"test:job", SOURCE})
