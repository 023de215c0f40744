"""Projection classes: options, validation, warnings, overrides, identity and partitions."""

from __future__ import annotations

import warnings

import pytest

from scriba import (
    ConfigError,
    Event,
    IdentityOverride,
    MemorySource,
    MemoryTarget,
    Meta,
    Projection,
    ProjectionKey,
    ProjectionNameWarning,
    Result,
    RetryPolicy,
    Scriba,
    Skip,
    UnknownProjection,
)
from scriba.partition import partition_of
from scriba.projection import settings_of


class Orders(Projection):
    name = "orders"
    source = MemorySource
    target = MemoryTarget

    def handle(self, event: Event, meta: Meta) -> Result:
        return Skip()


def test_defaults() -> None:
    settings = settings_of(Orders)
    assert settings.key == ProjectionKey("orders", 1)
    assert settings.parallelism == 1
    assert settings.batch_size == 100
    assert settings.retry == RetryPolicy(3, (0.1, 1.0, 10.0))
    assert settings.lag_interval == 1.0
    assert settings.start_from is None


def test_retry_policy_is_validated() -> None:
    assert RetryPolicy.never().max_attempts == 1
    assert RetryPolicy(4, (0.1, 1.0, 10.0)).delay_before(4) == 10.0
    with pytest.raises(ConfigError, match="need 3 backoff entries"):
        RetryPolicy(4, (0.1,))
    with pytest.raises(ConfigError):
        RetryPolicy(0)
    with pytest.raises(ConfigError):
        RetryPolicy(2, (-1.0,))
    with pytest.raises(ConfigError):
        RetryPolicy(True)
    assert settings_of(Orders, {"retry": None}).retry == RetryPolicy.never()


def test_invalid_options_fail_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigError, match="parallelism"):

        class Bad(Projection):
            name = "bad"
            parallelism = 0

    with pytest.raises(ConfigError, match="name"):

        class Nameless(Projection):
            name = ""

    with pytest.raises(ConfigError, match="version"):

        class Versionless(Projection):
            name = "v"
            version = 0

    with pytest.raises(ConfigError, match="retry"):

        class Retry(Projection):
            name = "r"
            retry = 3  # type: ignore[assignment]


def test_missing_endpoints_and_handler_fail_at_start() -> None:
    class Base(Projection):
        """No name: a shared base is allowed."""

        target = MemoryTarget

    class NoSource(Base):
        name = "no_source"

        def handle(self, event: Event, meta: Meta) -> Result:
            return Skip()

    class NoHandler(Base):
        name = "no_handler"
        source = MemorySource

    with pytest.raises(ConfigError, match="no name"):
        settings_of(Base)
    with pytest.raises(ConfigError, match="no source"):
        settings_of(NoSource)
    with pytest.raises(ConfigError, match="handle"):
        settings_of(NoHandler)
    assert settings_of(NoSource, {"source": MemorySource()}).key.name == "no_source"


def test_a_legacy_version_suffix_warns() -> None:
    with pytest.warns(ProjectionNameWarning, match="orders_v2"):

        class Legacy(Projection):
            name = "orders_v2"

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Fine(Projection):
            name = "orders_vat"
            version = 2


def test_overrides_refuse_identity_and_unknown_options() -> None:
    with pytest.raises(IdentityOverride, match="name"):
        settings_of(Orders, {"name": "other"})
    with pytest.raises(IdentityOverride, match="version"):
        settings_of(Orders, {"version": 2})
    with pytest.raises(ConfigError, match="unknown"):
        settings_of(Orders, {"paralelism": 2})
    with pytest.raises(ConfigError, match="batch_size"):
        settings_of(Orders, {"batch_size": 0})
    assert settings_of(Orders, {"parallelism": 8}).parallelism == 8


@pytest.mark.asyncio
async def test_start_refuses_identity_overrides_and_every_call_names_a_projection() -> None:
    async with Scriba() as runtime:
        with pytest.raises(IdentityOverride):
            await runtime.start(Orders, version=2)
        key = await runtime.start(Orders, lag_interval=0)
        for name in (Orders, "orders", ("orders", 1), key):
            assert (await runtime.info(name)).name == "orders"
        assert (await runtime.info("orders", 1)).version == 1
        with pytest.raises(UnknownProjection):
            await runtime.info("orders", 2)
        with pytest.raises(TypeError):
            await runtime.info(42)  # type: ignore[arg-type]
        assert (await runtime.info(Orders)).source == "MemorySource"


def test_partitions_are_stable_and_spread() -> None:
    # Fixed values: a change of hash would re-route streams between releases.
    assert [partition_of(f"stream-{n}", 8) for n in range(8)] == [
        partition_of(f"stream-{n}", 8) for n in range(8)
    ]
    assert partition_of("order-17", 8) == 4
    assert partition_of("", 3) == 0
    assert partition_of("naïve-ünïcode", 1000) == partition_of("naïve-ünïcode", 1000)
    counts = [0] * 8
    for n in range(8000):
        counts[partition_of(f"stream-{n}", 8)] += 1
    assert min(counts) > 800
    with pytest.raises(ValueError, match="at least one"):
        partition_of("s", 0)
