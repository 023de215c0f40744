"""Telemetry as structured log records, and a JSON formatter to write them.

:func:`install_logging` attaches one handler to every event of
:data:`statifier.telemetry.EVENTS` and returns a :class:`LogBridge`;
:meth:`LogBridge.uninstall` detaches it. Each event becomes one :mod:`logging` record
on the logger ``statifier.events`` (or the one given), at ``level``, or at
``failure_level`` for a failure (:func:`statifier.observability.fields.failed`).
The record carries, as ``extra`` fields:

- ``telemetry``: the event's name;
- ``measurements``: its measurements, a mapping of floats;
- every metadata key a :class:`FieldPolicy` lets through, flat, under its own name
  (``execution_id``, ``binding_id``, ``message_id``, ``scope``, ``source``, ...). A
  key a log record already has, such as scriba's ``name``, is written as
  ``meta_name``.

Its message reads ``<event> key=value ...`` with the same fields, for plain
formatters. :class:`JsonFormatter` writes a record as one JSON object, with every
extra field, through the same policy, so secret-named fields of any logger's
records are dropped too. It plugs into :func:`logging.basicConfig` (as a handler's
formatter) or :func:`logging.config.dictConfig` (``{"()":
"statifier.observability.logs.JsonFormatter"}``). :class:`ScrubbingFormatter` is its
plain-text counterpart: a :class:`logging.Formatter` whose whole output line (message,
exception and stack included) has its credentials masked.

>>> import io, json, logging
>>> from statifier import telemetry
>>> stream = io.StringIO()
>>> handler = logging.StreamHandler(stream)
>>> handler.setFormatter(JsonFormatter())
>>> logger = logging.getLogger("doctest.events")
>>> logger.addHandler(handler)
>>> logger.setLevel(logging.INFO)
>>> logger.propagate = False
>>> bridge = install_logging(logger)
>>> telemetry.report("statifier.router.delivery", {"duration": 0.5},
...                  {"binding_id": "clicks", "outcome": "delivered",
...                   "execution_id": "ex_1", "auth_token": "t0k"})
>>> bridge.uninstall()
>>> line = json.loads(stream.getvalue())
>>> print(line["message"])
statifier.router.delivery binding_id=clicks outcome=delivered execution_id=ex_1 duration=0.5
>>> {key: line[key] for key in ("level", "telemetry", "execution_id")}
{'level': 'INFO', 'telemetry': 'statifier.router.delivery', 'execution_id': 'ex_1'}
>>> line["measurements"]
{'duration': 0.5}
>>> "auth_token" in line
False
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from statifier import telemetry
from statifier.observability.fields import Attribute, FieldPolicy, failed

__all__ = ["LOGGER_NAME", "JsonFormatter", "LogBridge", "ScrubbingFormatter", "install_logging"]

LOGGER_NAME: Final = "statifier.events"
"""The logger the records go to unless another is given."""

_OWN_FIELDS: Final = frozenset({"telemetry", "measurements"})
_RECORD_FIELDS: Final = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}
"""The attributes every log record has: an extra field of one of these names would
overwrite it (``logging`` refuses that)."""
_FIRST: Final = ("time", "level", "logger", "message")


class LogBridge:
    """A telemetry handler writing one log record per event (see the module docstring
    for the record's fields). Made by :func:`install_logging`; lives until
    :meth:`uninstall`."""

    def __init__(
        self, logger: logging.Logger, level: int, failure_level: int, policy: FieldPolicy
    ) -> None:
        self._logger = logger
        self._level = level
        self._failure_level = failure_level
        self._policy = policy
        self._handler_id = f"statifier.observability.logs.{id(self)}"
        self._installed = False

    def install(self, events: Iterable[str]) -> None:
        """Attach to ``events``, once.

        Raises:
            ValueError: an event name is not in the catalog (nothing stays attached),
                or the bridge is installed already.
        """
        if self._installed:
            raise ValueError("the bridge is installed already")
        try:
            for name in events:
                telemetry.attach(self._handler_id, name, self.observe)
        except ValueError:
            telemetry.detach(self._handler_id)
            raise
        self._installed = True

    def uninstall(self) -> None:
        """Detach from every event. Idempotent."""
        telemetry.detach(self._handler_id)
        self._installed = False

    @property
    def installed(self) -> bool:
        """Whether the bridge is attached."""
        return self._installed

    def observe(
        self, event_name: str, measurements: Mapping[str, float], metadata: Mapping[str, Any]
    ) -> None:
        """The telemetry handler: log one event, if the logger writes its level."""
        level = self._failure_level if failed(event_name, metadata) else self._level
        if not self._logger.isEnabledFor(level):
            return
        fields = self._policy.attributes(metadata)
        counts = {name: float(value) for name, value in measurements.items()}
        extra: dict[str, object] = {"telemetry": event_name, "measurements": counts}
        for key, value in fields.items():
            extra[_field_name(key)] = value
        self._logger.log(level, "%s", _line(event_name, fields, counts), extra=extra)


def install_logging(
    logger: logging.Logger | None = None,
    *,
    level: int = logging.INFO,
    failure_level: int = logging.WARNING,
    policy: FieldPolicy | None = None,
    events: Iterable[str] | None = None,
) -> LogBridge:
    """Log every telemetry event until the answer's :meth:`~LogBridge.uninstall`.

    Args:
        logger: where records go; the logger :data:`LOGGER_NAME` when ``None``.
        level: the level of an ordinary event.
        failure_level: the level of a failure.
        policy: which metadata keys pass and how long values may be.
        events: the event names to log; every name of the catalog when ``None``.

    Raises:
        ValueError: a name of ``events`` is not in the catalog.
    """
    bridge = LogBridge(
        logger or logging.getLogger(LOGGER_NAME), level, failure_level, policy or FieldPolicy()
    )
    bridge.install(telemetry.EVENTS if events is None else events)
    return bridge


class JsonFormatter(logging.Formatter):
    """Format a record as one line of JSON: ``time`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, then every extra field the policy lets through, bounded
    (see :meth:`FieldPolicy.jsonable`), then ``exception`` and ``stack`` when the
    record has them. The message, the exception and the stack are written whole, with
    credentials masked (see :meth:`FieldPolicy.scrub`)."""

    def __init__(self, *, policy: FieldPolicy | None = None) -> None:
        super().__init__()
        self._policy = policy or FieldPolicy()

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        document: dict[str, object] = {
            "time": moment.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": self._policy.scrub(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key in _RECORD_FIELDS or key in _FIRST or not self._policy.allows(key):
                continue
            document[key] = self._policy.jsonable(value)
        if record.exc_info:
            document["exception"] = self._policy.scrub(self.formatException(record.exc_info))
        if record.stack_info:
            document["stack"] = self._policy.scrub(self.formatStack(record.stack_info))
        return json.dumps(document, ensure_ascii=False, default=str)


class ScrubbingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` (same arguments) whose formatted line has the
    credentials of :meth:`FieldPolicy.scrub` masked: the user and password of URLs,
    secret-named query parameters, ``Bearer``/``Basic`` credentials. Any logger's
    records pass through it, so an error quoting a database URL cannot print its
    password.

    >>> record = logging.LogRecord("db", logging.ERROR, "", 0, "cannot reach %s", (
    ...     "postgresql://app:hunter2@db/prod?sslpassword=x",), None)
    >>> ScrubbingFormatter("%(levelname)s %(message)s").format(record)
    'ERROR cannot reach postgresql://***@db/prod?sslpassword=***'
    """

    def __init__(
        self,
        fmt: str | None = None,
        datefmt: str | None = None,
        *,
        policy: FieldPolicy | None = None,
    ) -> None:
        super().__init__(fmt, datefmt)
        self._policy = policy or FieldPolicy()

    def format(self, record: logging.LogRecord) -> str:
        return self._policy.scrub(super().format(record))


def _field_name(key: str) -> str:
    return f"meta_{key}" if key in _RECORD_FIELDS or key in _OWN_FIELDS else key


def _line(event_name: str, fields: Mapping[str, Attribute], counts: Mapping[str, float]) -> str:
    shown = [f"{key}={_plain(value)}" for key, value in [*fields.items(), *counts.items()]]
    return " ".join([event_name, *shown])


def _plain(value: Attribute) -> str:
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)
