"""The OpenTelemetry bridge: every telemetry event of every layer as spans and metrics.

:func:`install_otel` attaches one handler to every event of
:data:`statifier.telemetry.EVENTS` (``statifier.*`` and ``scriba.*``) and returns an
:class:`OtelBridge`; :meth:`OtelBridge.uninstall` detaches it. The bridge reads
events as they are reported, so what it shows is exactly what telemetry reports:

- **Spans.** An event that carries a ``duration`` (seconds) reports something that
  just finished; it becomes a span named after the event, ending now and starting
  ``duration`` earlier, a child of whatever span is current. A handler call of a
  projection is a pair: ``scriba.projection.event.start`` opens a span named
  ``scriba.projection.event`` and makes it current for the handler (so spans the
  handler makes are its children); ``.stop`` or ``.exception`` ends it (a bridge
  given ``events`` without all three makes no such span). Every other event becomes
  a span of zero length. A failure (see
  :func:`statifier.observability.fields.failed`) sets the span's status to error.
  Attributes are the event's metadata through a :class:`FieldPolicy`.
- **Metrics**, named after the event. A counter ``<event>`` counts the events. The
  measurements ``duration``, ``lag`` and ``delay`` become histograms
  ``<event>.<measurement>`` in seconds, ``delay_ms`` one in milliseconds and
  ``attempts`` one of plain numbers; ``lag_ms`` and ``watermark`` become gauges (the
  last reading); ``monotonic_time`` (a clock reading) nothing; every other
  measurement is a count and becomes a counter ``<event>.<measurement>`` (characters
  an instrument name cannot hold become ``_``: ``dropped: finished`` is
  ``dropped_finished``). Metric attributes are only the low-cardinality keys of
  ``metric_keys`` (:data:`METRIC_KEYS` by default): ids, positions and free text never
  become metric dimensions.

Without the ``otel`` extra, importing this module raises
:class:`statifier.extras.MissingExtra` naming it.

>>> from opentelemetry.sdk.trace import TracerProvider
>>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
>>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
>>> from statifier import telemetry
>>> spans = InMemorySpanExporter()
>>> provider = TracerProvider()
>>> provider.add_span_processor(SimpleSpanProcessor(spans))
>>> bridge = install_otel(provider)
>>> telemetry.report("statifier.persistence.lock", {"duration": 0.25}, {"execution_id": "ex_1"})
>>> bridge.uninstall()
>>> [span] = spans.get_finished_spans()
>>> span.name, dict(span.attributes), (span.end_time - span.start_time) / 1e9
('statifier.persistence.lock', {'execution_id': 'ex_1'}, 0.25)
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Final, Protocol

from statifier import telemetry
from statifier.extras import MissingExtra
from statifier.observability.fields import Attribute, FieldPolicy, failed

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.util.types import Attributes
except ModuleNotFoundError as missing:  # the otel extra
    raise MissingExtra.of(missing) from missing

__all__ = ["METRIC_KEYS", "OtelBridge", "install_otel"]

METRIC_KEYS: Final[frozenset[str]] = frozenset(
    {
        "action",
        "binding_id",
        "complete",
        "from_state",
        "input",
        "kind",
        "name",
        "operation",
        "outcome",
        "partition",
        "result",
        "resumed",
        "source",
        "status",
        "transition",
        "version",
        "via",
    }
)
"""The metadata keys that become metric attributes: each takes a few values (a ``via``, an
outcome, a binding, a projection's name). ``scope``, ids, positions and messages are
left out: one time series per execution or message would swamp a metrics store."""

_HISTOGRAMS: Final[Mapping[str, str]] = {
    "duration": "s",
    "lag": "s",
    "delay": "s",
    "delay_ms": "ms",
    "attempts": "1",
}
"""Measurements that are a value per event, not a count to add up: their unit."""
_GAUGES: Final[Mapping[str, str]] = {"lag_ms": "ms", "watermark": "1"}
"""Measurements that are a reading of a level: the last one counts."""
_READINGS: Final[frozenset[str]] = frozenset({"monotonic_time"})
_NOT_IN_NAMES: Final = re.compile(r"[^A-Za-z0-9_./-]+")
_EXCEPTION: Final = (("type", "kind"), ("message", "reason"))
"""The exception span event's attributes, from the metadata of a handler that raised."""
_MAX_OPEN: Final = 1024
"""Open handler-call spans kept waiting for their stop; beyond it the oldest is ended as
abandoned (a stop that never comes must not grow memory)."""


@dataclass(frozen=True)
class _Pair:
    """Two events that open and close one span."""

    span: str
    start: str
    stop: str
    raised: str
    identity: tuple[str, ...]
    """The metadata keys, common to start and stop, that tell one call from another."""

    @property
    def stops(self) -> frozenset[str]:
        """The events that end the span."""
        return frozenset({self.stop, self.raised})


_HANDLER_CALL: Final = _Pair(
    span="scriba.projection.event",
    start="scriba.projection.event.start",
    stop="scriba.projection.event.stop",
    raised="scriba.projection.event.exception",
    identity=("name", "version", "partition", "event_id", "attempt"),
)


class _Gauge(Protocol):
    """What the bridge needs of a synchronous gauge (OpenTelemetry 1.23 and later)."""

    def set(self, amount: float, attributes: Attributes = None) -> None: ...


@dataclass
class _Open:
    span: trace.Span
    token: Token[context.Context]


class OtelBridge:
    """Telemetry handlers turning events into spans and metrics (see the module
    docstring for the mapping). Made by :func:`install_otel`; lives until
    :meth:`uninstall`."""

    def __init__(
        self,
        tracer: trace.Tracer,
        meter: metrics.Meter,
        policy: FieldPolicy,
        metric_keys: frozenset[str],
    ) -> None:
        self._tracer = tracer
        self._meter = meter
        self._policy = policy
        self._metric_keys = metric_keys
        self._handler_id = f"statifier.observability.otel.{id(self)}"
        self._counters: dict[str, metrics.Counter] = {}
        self._histograms: dict[str, metrics.Histogram] = {}
        self._gauges: dict[str, _Gauge] = {}
        self._open: dict[tuple[object, ...], _Open] = {}
        self._pairing = False
        self._installed = False

    def install(self, events: Iterable[str]) -> None:
        """Attach to ``events``, once.

        Raises:
            ValueError: an event name is not in the catalog (nothing stays attached),
                or the bridge is installed already.
        """
        if self._installed:
            raise ValueError("the bridge is installed already")
        names = list(events)
        try:
            for name in names:
                telemetry.attach(self._handler_id, name, self.observe)
        except ValueError:
            telemetry.detach(self._handler_id)
            raise
        # A start whose stops are not observed would open a span nothing ends.
        self._pairing = {_HANDLER_CALL.start, *_HANDLER_CALL.stops} <= set(names)
        self._installed = True

    def uninstall(self) -> None:
        """Detach from every event and end the spans still waiting for their stop (as
        errors: the bridge never saw them finish). Idempotent."""
        telemetry.detach(self._handler_id)
        self._installed = False
        while self._open:
            _, waiting = self._open.popitem()
            _abandon(waiting.span, "the bridge was uninstalled before the call ended")

    @property
    def installed(self) -> bool:
        """Whether the bridge is attached."""
        return self._installed

    def observe(
        self, event_name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]
    ) -> None:
        """The telemetry handler: record one event as a span and as metrics."""
        attributes = self._policy.attributes(metadata)
        self._trace(event_name, measurements, metadata, attributes)
        self._measure(event_name, measurements, attributes)

    def _trace(
        self,
        event_name: str,
        measurements: Mapping[str, float],
        metadata: Mapping[str, Any],
        attributes: dict[str, Attribute],
    ) -> None:
        pair = _HANDLER_CALL
        if event_name == pair.start and self._pairing:
            self._start(pair, metadata, attributes)
            return
        if event_name in pair.stops:
            raised = event_name == pair.raised
            waiting = self._open.pop(_identity(pair, metadata), None)
            if waiting is not None:
                context.detach(waiting.token)
                end = time.time_ns()
                _finish(waiting.span, event_name, metadata, attributes, end, raised=raised)
                return
            # Installed while the call ran: the span is rebuilt from its duration.
            self._finished(pair.span, event_name, measurements, metadata, attributes, raised)
            return
        self._finished(event_name, event_name, measurements, metadata, attributes)

    def _start(
        self, pair: _Pair, metadata: Mapping[str, Any], attributes: dict[str, Attribute]
    ) -> None:
        span = self._tracer.start_span(pair.span, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span))
        self._open[_identity(pair, metadata)] = _Open(span, token)
        if len(self._open) > _MAX_OPEN:
            oldest = next(iter(self._open))
            _abandon(self._open.pop(oldest).span, "no stop event came for this call")

    def _finished(
        self,
        span_name: str,
        event_name: str,
        measurements: Mapping[str, float],
        metadata: Mapping[str, Any],
        attributes: dict[str, Attribute],
        raised: bool = False,
    ) -> None:
        end = time.time_ns()
        duration = measurements.get("duration")
        start = end if duration is None else end - max(0, round(duration * 1e9))
        span = self._tracer.start_span(span_name, start_time=start, attributes=attributes)
        _finish(span, event_name, metadata, attributes, end, raised=raised)

    def _measure(
        self, event_name: str, measurements: Mapping[str, float], attributes: dict[str, Attribute]
    ) -> None:
        dimensions = {k: v for k, v in attributes.items() if k in self._metric_keys}
        self._counter(event_name, "{event}").add(1, dimensions)
        for measurement, value in measurements.items():
            if measurement in _READINGS:
                continue
            name = f"{event_name}.{_NOT_IN_NAMES.sub('_', measurement)}"
            if measurement in _HISTOGRAMS:
                self._histogram(name, _HISTOGRAMS[measurement]).record(value, dimensions)
            elif measurement in _GAUGES:
                self._gauge(name, _GAUGES[measurement]).set(value, dimensions)
            elif value >= 0:  # a counter only grows
                self._counter(name, "1").add(value, dimensions)

    def _counter(self, name: str, unit: str) -> metrics.Counter:
        found = self._counters.get(name)
        if found is None:
            found = self._counters[name] = self._meter.create_counter(
                name, unit=unit, description=_described(name)
            )
        return found

    def _histogram(self, name: str, unit: str) -> metrics.Histogram:
        found = self._histograms.get(name)
        if found is None:
            found = self._histograms[name] = self._meter.create_histogram(
                name, unit=unit, description=_described(name)
            )
        return found

    def _gauge(self, name: str, unit: str) -> _Gauge:
        found = self._gauges.get(name)
        if found is None:
            found = self._gauges[name] = self._meter.create_gauge(
                name, unit=unit, description=_described(name)
            )
        return found


def install_otel(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    *,
    policy: FieldPolicy | None = None,
    metric_keys: frozenset[str] = METRIC_KEYS,
    events: Iterable[str] | None = None,
) -> OtelBridge:
    """Bridge telemetry to OpenTelemetry until the answer's
    :meth:`~OtelBridge.uninstall`.

    Args:
        tracer_provider: where spans go; the global provider when ``None``.
        meter_provider: where metrics go; the global provider when ``None``.
        policy: which metadata keys pass and how long values may be (the default
            :class:`FieldPolicy` drops secret- and payload-named keys).
        metric_keys: the metadata keys that become metric attributes.
        events: the event names to bridge; every name of the catalog when ``None``.

    Raises:
        ValueError: a name of ``events`` is not in the catalog.
    """
    tracers = tracer_provider or trace.get_tracer_provider()
    meters = meter_provider or metrics.get_meter_provider()
    bridge = OtelBridge(
        tracers.get_tracer("statifier"),
        meters.get_meter("statifier"),
        policy or FieldPolicy(),
        metric_keys,
    )
    bridge.install(telemetry.EVENTS if events is None else events)
    return bridge


def _identity(pair: _Pair, metadata: Mapping[str, Any]) -> tuple[object, ...]:
    return tuple(str(metadata.get(key)) for key in pair.identity)


def _finish(
    span: trace.Span,
    event_name: str,
    metadata: Mapping[str, Any],
    attributes: dict[str, Attribute],
    end: int,
    *,
    raised: bool,
) -> None:
    """End ``span`` at ``end`` with the event's attributes; a failure sets its status,
    and a handler that ``raised`` adds the exception as a span event."""
    span.set_attributes(attributes)
    if raised:
        exception = {f"exception.{k}": attributes[a] for k, a in _EXCEPTION if a in attributes}
        span.add_event("exception", exception, timestamp=end)
    if failed(event_name, metadata):
        span.set_status(trace.StatusCode.ERROR, _failure(attributes, event_name))
    span.end(end_time=end)


def _failure(attributes: dict[str, Attribute], event_name: str) -> str:
    for key in ("error", "reason", "message", "kind"):
        value = attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return event_name


def _abandon(span: trace.Span, why: str) -> None:
    span.set_status(trace.StatusCode.ERROR, why)
    span.end()


def _described(instrument: str) -> str:
    """The catalog's line for the event an instrument is named after."""
    event_name = instrument if instrument in telemetry.EVENTS else instrument.rpartition(".")[0]
    return telemetry.EVENTS.get(event_name, "")
