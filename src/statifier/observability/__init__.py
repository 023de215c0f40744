"""Observability bridges: telemetry as OpenTelemetry spans and metrics, and as logs.

The library reports what it does through :mod:`statifier.telemetry`; these bridges
are telemetry handlers a host installs (``statifier serve`` installs them when its
configuration asks); nothing else of the library imports them.

- :mod:`statifier.observability.otel` (the ``otel`` extra): ``install_otel()``
  turns every event into spans and metrics.
- :mod:`statifier.observability.logs` (no third-party library): ``install_logging()``
  writes one structured log record per event; ``JsonFormatter`` writes records as
  JSON lines, ``ScrubbingFormatter`` as text lines, both with credentials masked.
- :mod:`statifier.observability.fields`: the :class:`FieldPolicy` both read
  metadata through, which drops secret- and payload-named keys and bounds values.

The guide is ``docs/observability.md``.
"""

from statifier.observability.fields import FieldPolicy
from statifier.observability.logs import (
    JsonFormatter,
    LogBridge,
    ScrubbingFormatter,
    install_logging,
)

__all__ = [
    "FieldPolicy",
    "JsonFormatter",
    "LogBridge",
    "ScrubbingFormatter",
    "install_logging",
]
