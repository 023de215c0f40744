"""RouterConfig refuses a configuration it could not route by when it is built, and
StaticResolver names the chart a new execution of a document starts on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from tests.router.conftest import RouterDb, impression_bindings, join_chart

from statifier.chart import Machine, compile_chart
from statifier.persistence import MemoryAdapter, Storage
from statifier.router import (
    Binding,
    BindingError,
    ConfigError,
    Resolved,
    Router,
    RouterConfig,
    StaticResolver,
)
from statifier.router.config import RESERVED_BINDING_IDS

OTHER = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="idle">
  <state id="idle"><transition event="go" target="done"/></state>
  <final id="done"/>
</scxml>"""


def other_chart() -> Machine:
    return compile_chart(OTHER)


def binding(binding_id: str) -> Binding:
    return Binding(
        id=binding_id,
        source="s",
        match="true",
        key="event.k",
        document="join",
        event="e",
    )


def no_bindings(scope: str) -> Sequence[Binding]:
    return []


@pytest.mark.asyncio
async def test_a_valid_configuration_keeps_its_bindings(router_db: RouterDb) -> None:
    bindings = impression_bindings()
    config = router_db.config(bindings)
    assert config.bindings == tuple(bindings)
    assert Router(config).adapter is router_db.adapter
    assert await config.bindings_for("any scope") == tuple(bindings)


def test_both_bindings_and_a_bindings_resolver_are_refused(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="exactly one of bindings and bindings_resolver"):
        router_db.config(impression_bindings(), bindings_resolver=no_bindings)


def test_neither_bindings_nor_a_bindings_resolver_is_refused(router_db: RouterDb) -> None:
    resolver = StaticResolver({"join": join_chart()})
    with pytest.raises(ConfigError, match="exactly one of bindings and bindings_resolver"):
        RouterConfig(Storage(router_db.adapter), resolver=resolver)


@pytest.mark.parametrize("reserved", sorted(RESERVED_BINDING_IDS))
def test_a_reserved_binding_id_is_refused(router_db: RouterDb, reserved: str) -> None:
    """The router files its own ledger rows under these ids; a binding taking one
    would make those rows ambiguous."""
    assert {"execution", "basichttp", "route"} == RESERVED_BINDING_IDS
    with pytest.raises(BindingError, match="reserved") as error:
        router_db.config([binding("fine"), binding(reserved)])
    assert (error.value.binding_id, error.value.field) == (reserved, "id")


def test_duplicate_binding_ids_are_refused(router_db: RouterDb) -> None:
    with pytest.raises(BindingError, match="share this id") as error:
        router_db.config([binding("twice"), binding("once"), binding("twice")])
    assert error.value.binding_id == "twice"


def test_a_list_holding_something_other_than_a_binding_is_refused(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="not a Binding"):
        router_db.config([binding("b"), {"id": "raw"}])  # type: ignore[list-item]


@pytest.mark.asyncio
async def test_resolved_bindings_are_checked_like_a_static_list(router_db: RouterDb) -> None:
    """A bindings resolver's answer is refused for the same reasons, when it is asked."""

    def resolved(scope: str) -> Sequence[Binding]:
        return [binding("a"), binding("a")] if scope == "bad" else [binding("execution")]

    config = RouterConfig(
        Storage(router_db.adapter),
        bindings_resolver=resolved,
        resolver=StaticResolver({"join": join_chart()}),
    )
    with pytest.raises(BindingError, match="share this id"):
        await config.bindings_for("bad")
    with pytest.raises(BindingError, match="reserved"):
        await config.bindings_for("good")


@pytest.mark.asyncio
async def test_an_async_bindings_resolver_is_awaited(router_db: RouterDb) -> None:
    async def resolved(scope: str) -> Sequence[Binding]:
        return [binding(f"for_{scope}")]

    config = RouterConfig(
        Storage(router_db.adapter),
        bindings_resolver=resolved,
        resolver=StaticResolver({"join": join_chart()}),
    )
    assert [b.id for b in await config.bindings_for("t1")] == ["for_t1"]


def test_a_configuration_without_a_resolver_is_refused(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="a resolver is needed"):
        RouterConfig(Storage(router_db.adapter), bindings=impression_bindings())


@pytest.mark.parametrize(
    "hook",
    [
        "resolver",
        "chart_resolver",
        "execution_id",
        "executor",
        "on_create",
        "on_step",
        "around_delivery",
    ],
)
def test_a_hook_that_is_not_callable_is_refused(router_db: RouterDb, hook: str) -> None:
    options: dict[str, Any] = {hook: "not callable"}
    with pytest.raises(ConfigError, match=f"{hook} must be callable"):
        router_db.config(impression_bindings(), **options)


def test_a_bindings_resolver_that_is_not_callable_is_refused(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="bindings_resolver must be callable"):
        RouterConfig(
            Storage(router_db.adapter),
            bindings_resolver=["not", "callable"],  # type: ignore[arg-type]
            resolver=StaticResolver({"join": join_chart()}),
        )


@pytest.mark.parametrize("lock_wait", [0, 0.0, -1.5])
def test_a_lock_wait_that_is_not_positive_is_refused(router_db: RouterDb, lock_wait: float) -> None:
    with pytest.raises(ConfigError, match="lock_wait must be positive"):
        router_db.config(impression_bindings(), lock_wait=lock_wait)


def test_a_positive_lock_wait_is_kept(router_db: RouterDb) -> None:
    assert router_db.config(impression_bindings(), lock_wait=0.25).lock_wait == 0.25


def test_bad_start_options_are_refused(router_db: RouterDb) -> None:
    with pytest.raises(ConfigError, match="start_options"):
        router_db.config(impression_bindings(), start_options={"round_budget": 5})


def test_a_store_that_is_not_sql_is_refused() -> None:
    with pytest.raises(ConfigError, match="SqlAdapter"):
        RouterConfig(
            MemoryAdapter(),  # type: ignore[arg-type]
            bindings=impression_bindings(),
            resolver=StaticResolver({"join": join_chart()}),
        )


def test_the_store_may_be_an_adapter_or_a_storage(router_db: RouterDb) -> None:
    resolver = StaticResolver({"join": join_chart()})
    router = Router(RouterConfig(router_db.adapter, bindings=[], resolver=resolver))
    assert router.adapter is router_db.adapter
    assert router.storage.adapter is router_db.adapter


# --- StaticResolver -------------------------------------------------------------------


def test_a_document_entry_serves_every_scope() -> None:
    join = join_chart()
    resolver = StaticResolver({"join": join})
    for scope in ("tenant_a", "tenant_b"):
        assert resolver(scope, "join") == Resolved(join.identity.content_hash, join)


def test_a_scoped_entry_wins_over_the_document_entry() -> None:
    join, other = join_chart(), other_chart()
    resolver = StaticResolver({"join": join, ("tenant_b", "join"): other})
    assert resolver("tenant_a", "join").machine is join
    assert resolver("tenant_b", "join") == Resolved(other.identity.content_hash, other)
    assert resolver.documents == {"join"}


def test_a_scoped_entry_serves_only_its_scope() -> None:
    resolver = StaticResolver({("tenant_b", "other"): other_chart()})
    assert resolver("tenant_b", "other").machine.identity == other_chart().identity
    with pytest.raises(LookupError, match="'other'"):
        resolver("tenant_a", "other")


def test_an_unknown_document_raises_lookup_error() -> None:
    resolver = StaticResolver({"join": join_chart()})
    with pytest.raises(LookupError, match="no chart for document 'missing'"):
        resolver("tenant_a", "missing")


def test_a_static_resolver_refuses_what_is_not_a_machine() -> None:
    with pytest.raises(ConfigError, match="not a Machine"):
        StaticResolver({"join": "<scxml/>"})  # type: ignore[dict-item]
