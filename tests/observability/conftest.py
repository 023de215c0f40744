"""Fixtures for the observability bridges' tests: an OpenTelemetry SDK whose spans and
metrics stay in memory, with the bridge installed on it; a logger whose records are
kept; and the router's database on each backend (``router_db``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.persistence.conftest import (  # noqa: F401 - fixtures router_store reads
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - the router's fixtures, used here too
    router_db,
    router_store,
)

from statifier import telemetry
from statifier.observability.otel import OtelBridge, install_otel


@dataclass
class Otel:
    """The SDK's providers, what they hold, and the bridge installed on them."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    bridge: OtelBridge
    collected: dict[str, Metric] = field(default_factory=dict)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """The finished spans (named ``name``), in the order they ended."""
        finished = self.exporter.get_finished_spans()
        return [span for span in finished if name is None or span.name == name]

    def metrics(self) -> dict[str, Metric]:
        """Every metric collected so far, by name (cumulative: a metric read once is
        kept from the earlier collections)."""
        data = self.reader.get_metrics_data()
        if data is not None:
            for resource in data.resource_metrics:
                for scope in resource.scope_metrics:
                    self.collected.update({metric.name: metric for metric in scope.metrics})
        return self.collected

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name``."""
        return list(self.metrics()[name].data.data_points)

    def recorded(self, metric: str, /, **attributes: object) -> tuple[int, float]:
        """How many values histogram ``metric`` recorded, and their sum, over the
        points whose attributes include ``attributes``."""
        points = [
            point
            for point in self.points(metric)
            if attributes.items() <= dict(point.attributes).items()
        ]
        return sum(point.count for point in points), sum(point.sum for point in points)

    def total(self, metric: str, /, **attributes: object) -> float:
        """The sum of counter ``metric`` over the points whose attributes include
        ``attributes``."""
        return float(
            sum(
                point.value
                for point in self.points(metric)
                if attributes.items() <= dict(point.attributes).items()
            )
        )


@pytest.fixture
def otel() -> Iterator[Otel]:
    """The bridge on an in-memory SDK, uninstalled and shut down afterwards; a test
    that leaves it installed fails if it is no longer attached to every event."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    bridge = install_otel(tracer_provider, meter_provider)
    try:
        yield Otel(tracer_provider, meter_provider, exporter, reader, bridge)
        if bridge.installed:  # telemetry detaches a handler that raised
            assert all(telemetry.enabled(name) for name in telemetry.EVENTS)
    finally:
        bridge.uninstall()
        tracer_provider.shutdown()
        meter_provider.shutdown()


class Kept(logging.Handler):
    """A logging handler keeping every record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def of(self, event_name: str) -> list[logging.LogRecord]:
        """The records of one telemetry event."""
        return [r for r in self.records if getattr(r, "telemetry", None) == event_name]


@pytest.fixture
def kept() -> Iterator[tuple[logging.Logger, Kept]]:
    """A logger of its own (not propagating) at DEBUG, and the handler keeping its
    records."""
    logger = logging.getLogger("tests.observability.events")
    handler = Kept()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
