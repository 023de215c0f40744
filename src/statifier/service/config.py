"""The configuration file of ``statifier serve``: its TOML schema, read and checked in
full before anything starts.

One file names everything the service runs (``docs/serve.md`` shows a whole one)::

    migrate = true                      # run the migrations at start (default: refuse)
    shutdown_timeout = 10               # seconds to drain on SIGTERM
    send_type = "myapp:route"           # the type whose send targets name routes
    charts = "charts"                   # every charts/NAME.scxml is document NAME
    bindings = "bindings.toml"          # or [[bindings]] tables here

    [database]
    url_env = "DATABASE_URL"            # or url = "sqlite:///statifier.db" (the default)

    [codec]                             # blobs encrypted at rest (extra crypto)
    kind = "fernet"
    keys_env = ["BLOB_KEY_NEW", "BLOB_KEY_OLD"]  # the newest key first

    [http]
    port = 8080                         # on 127.0.0.1 unless host says otherwise

    [routes.joined_records]
    queue = "joined"                    # an outbox queue

    [sinks.joined]
    url = "https://example.com/joined"  # POSTed, with the row's Idempotency-Key

    [fronts.webhook.carrier]
    path = "/hooks/carrier"
    source = "carrier"
    scope = "depot_7"

    [sources.scans]
    kind = "kafka"
    scope = "depot_7"
    brokers_env = "KAFKA_BROKERS"
    topics = ["parcel-scans"]

    [console]                           # the operator console at /console
    [console.operators.ada]
    token_env = "ADA_TOKEN"
    role = "operator"                   # or "read_only"

Every mistake is a :class:`ServiceConfigError` naming the file, the table and the key
(``statifier.toml: [fronts.webhook.carrier] max_body: must be a positive integer, not
"big"``); a key the schema does not know is one too, so a typo never passes silently.
The file is read up to :data:`MAX_CONFIG_BYTES`. A secret is named, never written:
``secret_env = "NAME"`` reads the environment variable ``NAME`` when the file is
loaded, and neither errors nor ``repr`` ever show its value (nor a database URL's).

:func:`load` answers a :class:`ServiceSettings`: plain frozen values, the charts
compiled and the bindings built, but nothing opened. :func:`router_config` builds the
:class:`~statifier.router.RouterConfig` over an open adapter. Sources' own options are
checked here too; their modules are imported only when the service starts one.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "statifier.toml"
>>> _ = path.write_text('[http]\\nhots = "0.0.0.0"\\n')
>>> load(path)
Traceback (most recent call last):
...
statifier.service.config.ServiceConfigError: .../statifier.toml: [http] hots: unknown key
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from statifier.chart import InvalidChart, Machine, ReadLimits, compile_chart
from statifier.console.standalone import is_loopback
from statifier.extras import MissingExtra
from statifier.persistence import PLAIN, BlobCodec, Storage
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    Backoff,
    Binding,
    BindingError,
    OutboxRoute,
    RouterConfig,
    RouterError,
    StaticResolver,
    load_bindings,
)
from statifier.router.locations import BasicHttpLocations
from statifier.router.routes import RouteEntry
from statifier.router.sending import BASICHTTP_QUEUE

__all__ = [
    "CODEC_KINDS",
    "DEFAULT_DATABASE",
    "HEALTH_PATHS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MAX_CONFIG_BYTES",
    "MAX_CONNECTIONS",
    "MAX_DOCUMENTS",
    "BasicHttpFront",
    "CallSink",
    "ConsoleOperator",
    "ConsoleSettings",
    "ConsumerSettings",
    "DatabaseSettings",
    "ErrorSettings",
    "FormFront",
    "Front",
    "HmacSettings",
    "HttpSettings",
    "HttpSink",
    "InboundTableOptions",
    "KafkaOptions",
    "LoggingSettings",
    "NatsOptions",
    "OtelSettings",
    "OutboxSettings",
    "ReaperSettings",
    "RouteSettings",
    "ServiceConfigError",
    "ServiceSettings",
    "SinkSettings",
    "SourceOptions",
    "SourceSettings",
    "TimerSettings",
    "WebhookFront",
    "front_table",
    "load",
    "router_config",
]

MAX_CONFIG_BYTES: Final = 1 << 20
"""The largest configuration (or bindings) file read; a larger one is refused."""
MAX_DOCUMENTS: Final = 1000
"""The most charts one configuration names."""
MAX_NAMED: Final = 1000
"""The most routes, sinks, fronts or sources of one configuration."""
MAX_CONNECTIONS: Final = 1_000_000
"""The largest ``[http] max_connections`` taken."""
DEFAULT_DATABASE: Final = "sqlite:///statifier.db"
"""The database when the file names none: ``statifier.db`` in the working directory."""
HEALTH_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""The service's own paths; no front may be mounted on or under them."""
CONSOLE_PATH: Final = "/console"
"""Where the console is served (with ``[console]``); no front may be mounted there."""
CONSOLE_ROLES: Final = ("operator", "read_only")
"""The roles of ``[console.operators.NAME]``."""
SOURCE_KINDS: Final = frozenset({"table", "kafka", "nats"})
CODEC_KINDS: Final = ("fernet",)
"""The ``[codec]`` kinds: Fernet (``statifier.persistence.fernet``)."""
LOG_FORMATS: Final = ("text", "json")
"""The ``[logging]`` formats: plain lines, or one JSON object a line."""
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
"""The ``[logging]`` levels, lowest first."""
_SHOWN_LIMIT: Final = 40


class ServiceConfigError(ValueError):
    """A configuration ``statifier serve`` refuses.

    ``str()`` is one line, ``FILE: [TABLE] KEY: message`` (no ``[TABLE]`` at the top
    level). The message never carries a secret's value or a database URL.

    Attributes:
        file: the file as it was named.
        table: the dotted table (``fronts.webhook.carrier``), ``""`` at the top level.
        key: the offending key, ``""`` when the file as a whole is refused.
    """

    def __init__(self, file: str, table: str, key: str, message: str) -> None:
        where = f"[{table}] " if table else ""
        named = f"{key}: " if key else ""
        super().__init__(f"{file}: {where}{named}{message}")
        self.file = file
        self.table = table
        self.key = key


# The values a file loads into.


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    """Where executions and the router's tables live.

    Attributes:
        url: a ``postgresql://`` or ``sqlite:///`` URL (kept out of ``repr``: it may
            carry a password).
        prefix, schema: the tables' :class:`~statifier.sql.TableOptions`.
        lock_wait: the most seconds a delivery waits for an execution's lock (30 by
            default).
    """

    url: str = field(default=DEFAULT_DATABASE, repr=False)
    prefix: str = "statifier_"
    schema: str | None = None
    lock_wait: float = DEFAULT_LOCK_WAIT


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Where the HTTP fronts and the health endpoints listen (port 0: any free one),
    and the listener's bounds (:mod:`statifier.service.listener`).

    Attributes:
        head_timeout: seconds from the accept, or the end of the previous response, to
            a complete request head.
        idle_timeout: seconds from the accept, or the end of the previous response, to
            a first byte; an idle connection is closed then.
        max_connections: the most open connections; ``None`` for the default, derived
            from the process's descriptor limit when the service starts.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    access_log: bool = False
    head_timeout: float = 10.0
    idle_timeout: float = 5.0
    max_connections: int | None = None


@dataclass(frozen=True, slots=True)
class TimerSettings:
    """The timer worker's bounds (:class:`~statifier.router.timer_worker.TimerWorker`)."""

    enabled: bool = True
    batch: int = 100
    poll: float = 1.0
    retry: float = 5.0


@dataclass(frozen=True, slots=True)
class ErrorSettings:
    """What an error event no transition takes does to an execution (``[errors]``):
    ``default`` for every document, ``documents`` per document (``continue``, SCXML's
    behaviour, or ``fail``); a binding's own ``on_error`` wins over both for the
    deliveries it makes."""

    default: str = "continue"
    documents: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    """The outbox drain's bounds (:class:`~statifier.router.OutboxDrain`)."""

    batch: int = 10
    lease: float = 60.0
    max_attempts: int = 8
    idle: float = 0.5
    backoff: Backoff = field(default_factory=Backoff)
    basichttp_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class ReaperSettings:
    """How often the reapers run (:mod:`statifier.router.reapers`), and their page."""

    enabled: bool = True
    interval: float = 300.0
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class RouteSettings:
    """A route of the configuration: an outbox queue (and the target copied into each
    row for its sink)."""

    name: str
    queue: str
    target: str | None = None


@dataclass(frozen=True, slots=True)
class HttpSink:
    """A queue drained by POSTing each message as JSON to ``url``, the row's key in the
    ``Idempotency-Key`` header (see :mod:`statifier.service.sinks`).

    ``authorization`` (from ``authorization_env``) is sent as the ``Authorization``
    header; it and ``url`` stay out of ``repr``.
    """

    queue: str
    url: str = field(repr=False)
    timeout: float = 10.0
    authorization: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class CallSink:
    """A queue drained by a Python callable named ``package.module:function``."""

    queue: str
    call: str


SinkSettings = HttpSink | CallSink


@dataclass(frozen=True, slots=True)
class HmacSettings:
    """An HMAC-SHA256 signature check of a front's bodies
    (:func:`statifier.fronts.verifiers.hmac_sha256`); ``secret`` came from the
    environment and stays out of ``repr``."""

    secret: bytes = field(repr=False)
    header: str = "X-Signature"
    encoding: str = "hex"
    prefix: str = ""
    timestamp_header: str | None = None
    tolerance: float = 300.0


@dataclass(frozen=True, slots=True)
class WebhookFront:
    """A JSON webhook mounted at ``path``: each POST is one event of ``source`` in
    ``scope``."""

    name: str
    path: str
    source: str
    scope: str
    provider_id_header: str | None = None
    max_body: int = 1 << 20
    timeout: float = 10.0
    hmac: HmacSettings | None = None


@dataclass(frozen=True, slots=True)
class FormFront:
    """An HTML form POST front mounted at ``path``."""

    name: str
    path: str
    source: str
    scope: str
    max_body: int = 1 << 16
    timeout: float = 10.0
    hmac: HmacSettings | None = None


@dataclass(frozen=True, slots=True)
class BasicHttpFront:
    """The BasicHTTP front of durable executions (:mod:`statifier.fronts.basichttp`),
    mounted at ``path`` and reached by senders at ``base_url`` (the public URL of that
    path: each execution's location is ``base_url/<token>``). At most one."""

    name: str
    path: str
    base_url: str
    send_key_horizon: float = 72 * 3600.0
    max_body: int = 1 << 20
    timeout: float = 10.0


Front = WebhookFront | FormFront | BasicHttpFront


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """A stream consumer's bounds (:class:`statifier.fronts.consumer.StreamConsumer`);
    ``dead_letter_after`` attempts before a failing event is dead-lettered to the
    table (``None``: retried until it succeeds)."""

    lanes: int = 8
    batch_size: int = 32
    max_in_flight: int = 1024
    commit_interval: float = 0.2
    dead_letter_after: int | None = None


@dataclass(frozen=True, slots=True)
class NatsOptions:
    """A ``kind = "nats"`` source (:class:`statifier.fronts.nats.JetStreamSource`):
    the servers (from ``servers`` or ``servers_env``), the stream and its subjects,
    the group its members share partitions in, and the connection's credentials
    (``token_env``, ``user_env`` and ``password_env``, ``credentials`` a file), kept
    out of ``repr``."""

    servers: tuple[str, ...] = field(repr=False)
    stream: str
    subject_prefix: str
    partitions: tuple[str, ...]
    group: str = "statifier"
    owner: str | None = None
    lease_ttl: float = 15.0
    ack_wait: float = 60.0
    max_payload: int = 1_048_576
    pull_batch: int = 64
    buffer: int = 256
    pull_wait: float = 1.0
    ack_timeout: float = 5.0
    connect: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class InboundTableOptions:
    """A ``kind = "table"`` source (:class:`statifier.fronts.table_source.TableSource`):
    the inbound-events table of the service's database, read by a consumer group
    (its name, by default the source's) sharing ``partitions``. Its rows carry their
    own scope and source."""

    partitions: tuple[str, ...]
    group: str
    owner: str | None = None
    lease_ttl: float = 15.0


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """A ``kind = "kafka"`` source (:class:`statifier.fronts.kafka.KafkaSource`): the
    brokers (``brokers`` or ``brokers_env``), the topics, the consumer group, the
    scope's header when the source's ``scope`` is not fixed, and further librdkafka
    settings (``[sources.NAME.settings]``, and ``[sources.NAME.settings_env]`` naming
    the environment variables of secret ones), kept out of ``repr``."""

    brokers: str = field(repr=False)
    topics: tuple[str, ...]
    group: str = "statifier"
    scope_header: str | None = None
    max_payload: int = 1_048_576
    assignment: str = "cooperative-sticky"
    rebalance_timeout: float = 60.0
    settings: Mapping[str, str | int | float | bool] = field(default_factory=dict, repr=False)


SourceOptions = NatsOptions | InboundTableOptions | KafkaOptions


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """How the service logs (``[logging]``), to standard error.

    Attributes:
        format: one of :data:`LOG_FORMATS`: ``text`` lines, or ``json`` objects
            (:class:`statifier.observability.JsonFormatter`, which drops secret-named
            fields and masks credentials in messages).
        level: one of :data:`LOG_LEVELS`, the lowest level written.
        events: whether every telemetry event is one log record too
            (:func:`statifier.observability.install_logging`), its ids as fields.
    """

    format: str = "text"
    level: str = "info"
    events: bool = False


@dataclass(frozen=True, slots=True)
class OtelSettings:
    """Whether telemetry goes to OpenTelemetry (``[otel]``): spans and metrics through
    :func:`statifier.observability.otel.install_otel`, on the providers the process
    configured globally (the SDK's own environment variables, or a host's set-up)."""

    enabled: bool = False


@dataclass(frozen=True, slots=True)
class ConsoleOperator:
    """An operator of the console: a name (in the audit table), a login token read from
    the environment (``token_env``; kept out of ``repr``) and a role, one of
    :data:`CONSOLE_ROLES`."""

    name: str
    token: str = field(repr=False)
    role: str = "read_only"


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """The operator console (``[console]``, see ``docs/console.md``), served under
    :data:`CONSOLE_PATH` beside the fronts.

    Attributes:
        enabled: whether it is served (the table's presence, unless ``enabled =
            false``).
        operators: who may log in. None on a loopback listener: the service makes
            one login token per start and prints it; none on any other listener is
            refused.
        session_key: the cookie's signing key (from ``session_key_env``, at least 32
            bytes; kept out of ``repr``); ``None``: random per start.
        session_max_age: the seconds a session lasts.
        secure_cookie: whether the session cookie is marked ``Secure`` (HTTPS only).
        live_interval: the seconds between the live probe's reads.
        max_clients: the most live streams open at once.
        scriba_prefix: the prefix of scriba's tables in the same database, to show
            its projections; ``None``: none shown.
    """

    enabled: bool = False
    operators: tuple[ConsoleOperator, ...] = ()
    session_key: bytes | None = field(default=None, repr=False)
    session_max_age: float = 12 * 3600.0
    secure_cookie: bool = False
    live_interval: float = 0.5
    max_clients: int = 32
    scriba_prefix: str | None = None


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """A stream source: its name (the events' source, but for the table, whose rows
    name theirs), kind, scope (the table's rows carry their own), the kind's own
    options and the consumer's bounds."""

    name: str
    kind: str
    scope: str | None
    options: SourceOptions
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    table: str = ""
    """Where the options were read (``sources.NAME``), for errors found later."""


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    """A checked configuration file (see the module docstring).

    Attributes:
        file: the file as it was named, for errors found later.
        documents: document -> its compiled chart.
        bindings: every binding, in file order.
        codec: what encodes the executions' blobs (``[codec]``; stored as given when
            the table is absent). Its keys were read from the environment at load and
            never appear in a ``repr``.
    """

    file: str
    database: DatabaseSettings
    migrate: bool
    shutdown_timeout: float
    http: HttpSettings
    documents: Mapping[str, Machine]
    bindings: Sequence[Binding]
    send_type: str | None
    on_complete: str | None
    routes: Sequence[RouteSettings]
    sinks: Sequence[SinkSettings]
    fronts: Sequence[Front]
    sources: Sequence[SourceSettings]
    timers: TimerSettings
    outbox: OutboxSettings
    reapers: ReaperSettings
    errors: ErrorSettings = field(default_factory=ErrorSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    otel: OtelSettings = field(default_factory=OtelSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    codec: BlobCodec = PLAIN


def load(path: Path | str, environ: Mapping[str, str] | None = None) -> ServiceSettings:
    """Read and check the configuration file at ``path``; secrets named by ``*_env``
    keys are read from ``environ`` (the process's environment by default). Relative
    paths in the file (charts, bindings) are relative to the file's directory.

    Raises:
        ServiceConfigError: the file cannot be read, is larger than
            :data:`MAX_CONFIG_BYTES`, is not TOML, or any value is refused.
    """
    shown = str(path)
    chosen = Path(path)
    data = _read(chosen, shown, shown, "")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ServiceConfigError(shown, "", "", f"not valid TOML: {_one_line(error)}") from None
    reader = _Reader(shown, chosen.parent, os.environ if environ is None else environ)
    return reader.settings(_Table(reader, "", raw))


def router_config(settings: ServiceSettings, adapter: SqlAdapter) -> RouterConfig:
    """The router's configuration of ``settings`` over ``adapter`` (opened on
    ``settings.database``): the bindings, a static resolver over the documents, one
    :class:`~statifier.router.OutboxRoute` for every route, the built-in timer queue.

    Raises:
        ServiceConfigError: the router refuses the combination (named at the top
            level of the file).
    """
    outbox = OutboxRoute(adapter, codec=settings.codec)
    basichttp = next((f for f in settings.fronts if isinstance(f, BasicHttpFront)), None)
    routes = {
        entry.name: RouteEntry(
            outbox,
            {"queue": entry.queue, **({"target": entry.target} if entry.target else {})},
        )
        for entry in settings.routes
    }
    charts: dict[str | tuple[str, str], Machine] = dict(settings.documents.items())
    try:
        return RouterConfig(
            Storage(adapter, codec=settings.codec),
            bindings=settings.bindings,
            resolver=StaticResolver(charts),
            send_type=settings.send_type,
            routes=routes,
            on_complete=settings.on_complete,
            lock_wait=settings.database.lock_wait,
            on_error=settings.errors.default,
            document_on_error=settings.errors.documents,
            timers_elsewhere=not settings.timers.enabled,
            basichttp=None if basichttp is None else _locations(basichttp),
        )
    except (RouterError, ValueError, TypeError) as error:
        raise ServiceConfigError(settings.file, "", "", _one_line(error)) from None


def _locations(front: BasicHttpFront) -> BasicHttpLocations:
    return BasicHttpLocations(front.base_url, timedelta(seconds=front.send_key_horizon))


# Reading.


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _shown(value: object) -> str:
    """A value as the file spells it, short: strings quoted, tables and lists named."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= _SHOWN_LIMIT else text[: _SHOWN_LIMIT - 2] + '…"'
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _read(path: Path, shown: str, file: str, key: str) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ServiceConfigError(file, "", key, f"cannot read {shown}: {error.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ServiceConfigError(file, "", key, f"{shown} is larger than {MAX_CONFIG_BYTES} bytes")
    return data


_MISSING: Final = object()
_NEVER: Final = float("inf")


class _Table:
    """One table of the file being read: typed getters that name the table and key in
    every refusal, and :meth:`done`, which refuses any key no getter asked for."""

    def __init__(self, reader: _Reader, name: str, raw: Mapping[str, Any]) -> None:
        self.reader = reader
        self.name = name
        self.raw = raw
        self.seen: set[str] = set()

    def refuse(self, key: str, message: str) -> ServiceConfigError:
        return ServiceConfigError(self.reader.file, self.name, key, message)

    def has(self, key: str) -> bool:
        return key in self.raw

    def value(self, key: str, default: object) -> object:
        self.seen.add(key)
        if key in self.raw:
            return self.raw[key]
        if default is _MISSING:
            raise self.refuse(key, "required")
        return default

    def text(self, key: str, default: object = _MISSING) -> str:
        value = self.value(key, default)
        if not isinstance(value, str) or not value:
            raise self.refuse(key, f"must be a non-empty string, not {_shown(value)}")
        return value

    def optional_text(self, key: str) -> str | None:
        self.seen.add(key)
        return self.text(key) if key in self.raw else None

    def integer(
        self, key: str, default: int, *, minimum: int = 1, maximum: int | None = None
    ) -> int:
        value = self.value(key, default)
        if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
            if minimum == 1 and maximum is None:
                wanted = "a positive integer"
            elif maximum is None:
                wanted = f"an integer of at least {minimum}"
            else:
                wanted = f"an integer from {minimum} to {maximum}"
            raise self.refuse(key, f"must be {wanted}, not {_shown(value)}")
        return value

    def optional_integer(self, key: str, *, maximum: int) -> int | None:
        self.seen.add(key)
        return self.integer(key, 1, maximum=maximum) if key in self.raw else None

    def seconds(self, key: str, default: float) -> float:
        value = self.value(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < _NEVER:
            raise self.refuse(key, f"must be a positive number of seconds, not {_shown(value)}")
        return float(value)

    def optional_seconds(self, key: str) -> float | None:
        self.seen.add(key)
        return self.seconds(key, 0.0) if key in self.raw else None

    def boolean(self, key: str, default: bool) -> bool:
        value = self.value(key, default)
        if not isinstance(value, bool):
            raise self.refuse(key, f"must be true or false, not {_shown(value)}")
        return value

    def table(self, key: str) -> _Table:
        """The sub-table ``key`` (an empty one when absent)."""
        value = self.value(key, {})
        if not isinstance(value, dict):
            raise self.refuse(key, f"must be a table, not {_shown(value)}")
        return _Table(self.reader, f"{self.name}.{key}" if self.name else key, value)

    def named(self, key: str) -> list[_Table]:
        """The sub-tables of table ``key``, one per name (``[routes.NAME]``)."""
        outer = self.table(key)
        if len(outer.raw) > MAX_NAMED:
            raise self.refuse(key, f"at most {MAX_NAMED} entries")
        return [outer.table(name) for name in outer.raw]

    def secret(self, key: str) -> str:
        """The value of the environment variable that ``key`` (a ``*_env`` key) names."""
        variable = self.text(key)
        value = self.reader.environ.get(variable)
        if not value:
            raise self.refuse(key, f"the environment variable {variable} is not set (or empty)")
        return value

    def done(self) -> None:
        for key in self.raw:
            if key not in self.seen:
                raise self.refuse(key, "unknown key")


def _leaf(table: _Table) -> str:
    return table.name.rpartition(".")[2]


class _Reader:
    """Reads one file's tables into settings; relative paths are under ``base``."""

    def __init__(self, file: str, base: Path, environ: Mapping[str, str]) -> None:
        self.file = file
        self.base = base
        self.environ = environ

    def settings(self, top: _Table) -> ServiceSettings:
        migrate = top.boolean("migrate", False)
        shutdown_timeout = top.seconds("shutdown_timeout", 10.0)
        send_type = top.optional_text("send_type")
        on_complete = top.optional_text("on_complete")
        database = self.database(top.table("database"))
        http = self.http(top.table("http"))
        documents = self.documents(top)
        bindings = self.bindings(top, documents)
        routes = [self.route(table) for table in top.named("routes")]
        sinks = [self.sink(table) for table in top.named("sinks")]
        fronts = self.fronts(top.table("fronts"))
        sources = [self.source(table) for table in top.named("sources")]
        timers = self.timers(top.table("timers"))
        outbox = self.outbox(top.table("outbox"))
        reapers = self.reapers(top.table("reapers"))
        errors = self.errors(top.table("errors"), documents)
        logging = self.logging(top.table("logging"))
        otel = self.otel(top.table("otel"))
        console = self.console(top)
        codec = self.codec(top.table("codec"))
        top.done()
        settings = ServiceSettings(
            file=self.file,
            database=database,
            migrate=migrate,
            shutdown_timeout=shutdown_timeout,
            http=http,
            documents=documents,
            bindings=bindings,
            send_type=send_type,
            on_complete=on_complete,
            routes=routes,
            sinks=sinks,
            fronts=fronts,
            sources=sources,
            timers=timers,
            outbox=outbox,
            reapers=reapers,
            errors=errors,
            logging=logging,
            otel=otel,
            console=console,
            codec=codec,
        )
        self.cross_check(top, settings)
        return settings

    # The database and the listener.

    def database(self, table: _Table) -> DatabaseSettings:
        from statifier.sql.engines import database_url

        if table.has("url") and table.has("url_env"):
            raise table.refuse("url", "give url or url_env, not both")
        url = (
            table.secret("url_env") if table.has("url_env") else table.text("url", DEFAULT_DATABASE)
        )
        key = "url_env" if table.has("url_env") else "url"
        try:
            parsed = database_url(url)
        except ValueError as error:  # the message names the driver, never the URL
            raise table.refuse(key, _one_line(error)) from None
        except Exception:  # noqa: BLE001 - SQLAlchemy's parse errors quote the URL
            raise table.refuse(key, "is not a database URL") from None
        schema = table.optional_text("schema")
        if schema is not None and parsed.get_backend_name() != "postgresql":
            raise table.refuse("schema", "a schema needs PostgreSQL")
        settings = DatabaseSettings(
            url=url,
            prefix=table.text("prefix", "statifier_"),
            schema=schema,
            lock_wait=table.seconds("lock_wait", DEFAULT_LOCK_WAIT),
        )
        table.done()
        return settings

    def http(self, table: _Table) -> HttpSettings:
        settings = HttpSettings(
            host=table.text("host", "127.0.0.1"),
            port=table.integer("port", 8080, minimum=0, maximum=65535),
            access_log=table.boolean("access_log", False),
            head_timeout=table.seconds("head_timeout", 10.0),
            idle_timeout=table.seconds("idle_timeout", 5.0),
            max_connections=table.optional_integer("max_connections", maximum=MAX_CONNECTIONS),
        )
        table.done()
        return settings

    # Charts and bindings.

    def documents(self, top: _Table) -> dict[str, Machine]:
        files: dict[str, tuple[Path, str, str]] = {}
        directory = top.optional_text("charts")
        if directory is not None:
            folder = self.base / directory
            if not folder.is_dir():
                raise top.refuse("charts", f"{_shown(directory)} is not a directory")
            found = sorted(folder.glob("*.scxml"))
            if len(found) > MAX_DOCUMENTS:
                raise top.refuse("charts", f"more than {MAX_DOCUMENTS} charts")
            for file in found:
                files[file.stem] = (file, "", "charts")
        named = top.table("documents")
        for document in named.raw:
            files[document] = (self.base / named.text(document), named.name, document)
        named.done()
        if len(files) > MAX_DOCUMENTS:
            raise top.refuse("documents", f"more than {MAX_DOCUMENTS} charts")
        return {name: self.chart(name, *where) for name, where in files.items()}

    def chart(self, document: str, file: Path, table: str, key: str) -> Machine:
        limit = ReadLimits().max_bytes
        try:
            with file.open("rb") as handle:
                source = handle.read(limit + 1)  # compile_chart refuses what is over
        except OSError as error:
            raise ServiceConfigError(
                self.file, table, key, f"cannot read {file}: {error.strerror}"
            ) from None
        try:
            return compile_chart(source, name=document)
        except InvalidChart as invalid:
            raise ServiceConfigError(
                self.file, table, key, f"{file}:{invalid.problems[0]}"
            ) from None

    def bindings(self, top: _Table, documents: Mapping[str, Machine]) -> list[Binding]:
        value = top.raw.get("bindings", [])
        top.seen.add("bindings")
        shown = self.file
        if isinstance(value, str) and value:
            file = self.base / value
            data = _read(file, str(file), self.file, "bindings")
            try:
                entries = tomllib.loads(data.decode("utf-8")).get("bindings", [])
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
                raise ServiceConfigError(
                    self.file, "", "bindings", f"{file}: not valid TOML: {_one_line(error)}"
                ) from None
            shown = str(file)
        elif isinstance(value, list):
            entries = value
        else:
            raise top.refuse("bindings", f"a file name or [[bindings]] tables, not {_shown(value)}")
        if not isinstance(entries, list) or len(entries) > MAX_NAMED * 10:
            raise ServiceConfigError(
                shown, "", "bindings", "must be at most 10000 [[bindings]] tables"
            )
        try:
            bindings = load_bindings(entries)
        except BindingError as error:
            raise ServiceConfigError(
                shown, _binding_table(entries, error), error.field, _bare(error)
            ) from None
        for index, binding in enumerate(bindings):
            if binding.enabled and binding.document not in documents:
                raise ServiceConfigError(
                    shown,
                    _binding_label(index, binding.id),
                    "document",
                    f"no chart for document {_shown(binding.document)} "
                    "(name it under [documents] or put it in the charts directory)",
                )
        return bindings

    # Routes and sinks.

    def route(self, table: _Table) -> RouteSettings:
        settings = RouteSettings(
            name=_leaf(table), queue=table.text("queue"), target=table.optional_text("target")
        )
        table.done()
        if settings.queue == BASICHTTP_QUEUE:
            raise table.refuse(
                "queue", f"{_shown(BASICHTTP_QUEUE)} is the built-in BasicHTTP queue"
            )
        return settings

    def sink(self, table: _Table) -> SinkSettings:
        queue = _leaf(table)
        if queue == BASICHTTP_QUEUE:
            raise table.refuse("", "the basichttp queue is drained by the built-in BasicHTTP sink")
        if table.has("url") == table.has("call"):
            raise table.refuse("url", "give url (an HTTP POST sink) or call (a Python callable)")
        sink: SinkSettings
        if table.has("call"):
            call = table.text("call")
            module, colon, function = call.partition(":")
            if not colon or not module or not function.isidentifier():
                raise table.refuse("call", f"must be 'package.module:function', not {_shown(call)}")
            sink = CallSink(queue, call)
        else:
            url = table.text("url")
            if not url.startswith(("http://", "https://")):
                raise table.refuse("url", "must be an http:// or https:// URL")
            authorization = (
                table.secret("authorization_env") if table.has("authorization_env") else None
            )
            table.seen.add("authorization_env")
            sink = HttpSink(queue, url, table.seconds("timeout", 10.0), authorization)
        table.done()
        return sink

    # Fronts and sources.

    def fronts(self, table: _Table) -> list[Front]:
        fronts: list[Front] = []
        for named in table.named("webhook"):
            fronts.append(
                WebhookFront(
                    name=_leaf(named),
                    path=self.path(named),
                    source=named.text("source"),
                    scope=named.text("scope"),
                    provider_id_header=named.optional_text("provider_id_header"),
                    max_body=named.integer("max_body", 1 << 20),
                    timeout=named.seconds("timeout", 10.0),
                    hmac=self.hmac(named),
                )
            )
            named.done()
        for named in table.named("form"):
            fronts.append(
                FormFront(
                    name=_leaf(named),
                    path=self.path(named),
                    source=named.text("source"),
                    scope=named.text("scope"),
                    max_body=named.integer("max_body", 1 << 16),
                    timeout=named.seconds("timeout", 10.0),
                    hmac=self.hmac(named),
                )
            )
            named.done()
        for named in table.named("basichttp"):
            fronts.append(
                BasicHttpFront(
                    name=_leaf(named),
                    path=self.path(named),
                    base_url=named.text("base_url"),
                    send_key_horizon=named.seconds("send_key_horizon", 72 * 3600.0),
                    max_body=named.integer("max_body", 1 << 20),
                    timeout=named.seconds("timeout", 10.0),
                )
            )
            named.done()
        table.done()
        if sum(isinstance(front, BasicHttpFront) for front in fronts) > 1:
            raise table.refuse("basichttp", "at most one BasicHTTP front")
        return fronts

    def path(self, table: _Table) -> str:
        path = table.text("path")
        if not path.startswith("/") or path != path.rstrip("/") or "//" in path or "?" in path:
            raise table.refuse(
                "path", f'must be an absolute path such as "/hooks/x", not {_shown(path)}'
            )
        return path

    def hmac(self, front: _Table) -> HmacSettings | None:
        if not front.has("hmac"):
            front.seen.add("hmac")
            return None
        table = front.table("hmac")
        encoding = table.text("encoding", "hex")
        if encoding not in ("hex", "base64"):
            raise table.refuse("encoding", f"must be hex or base64, not {_shown(encoding)}")
        settings = HmacSettings(
            secret=table.secret("secret_env").encode("utf-8"),
            header=table.text("header", "X-Signature"),
            encoding=encoding,
            prefix=table.optional_text("prefix") or "",
            timestamp_header=table.optional_text("timestamp_header"),
            tolerance=table.seconds("tolerance", 300.0),
        )
        table.done()
        return settings

    def source(self, table: _Table) -> SourceSettings:
        kind = table.text("kind")
        if kind not in SOURCE_KINDS:
            kinds = ", ".join(sorted(SOURCE_KINDS))
            raise table.refuse("kind", f"must be one of {kinds}, not {_shown(kind)}")
        scope = None
        if kind == "kafka" and table.has("scope_header"):
            if table.has("scope"):
                raise table.refuse("scope_header", "give scope or scope_header, not both")
        elif kind != "table":  # the table's rows carry their own scope
            scope = table.text("scope")
        consumer = self.consumer(table.table("consumer"))
        options = self.options(kind, table)
        table.done()
        return SourceSettings(_leaf(table), kind, scope, options, consumer, table.name)

    def options(self, kind: str, table: _Table) -> SourceOptions:
        if kind == "nats":
            return self.nats(table)
        if kind == "kafka":
            return self.kafka(table)
        if kind == "table":
            return InboundTableOptions(
                partitions=tuple(self.names(table, "partitions")),
                group=table.text("group", _leaf(table)),
                owner=table.optional_text("owner"),
                lease_ttl=table.seconds("lease_ttl", 15.0),
            )
        raise AssertionError(kind)  # pragma: no cover - the kinds are checked above

    def nats(self, table: _Table) -> NatsOptions:
        if table.has("servers") == table.has("servers_env"):
            raise table.refuse("servers", "give servers (a list of URLs) or servers_env")
        if table.has("servers_env"):
            servers = tuple(table.secret("servers_env").split(","))
        else:
            servers = tuple(self.names(table, "servers"))
        table.seen.update({"servers", "servers_env"})
        connect: dict[str, str] = {}
        for key, option in (
            ("token_env", "token"),
            ("user_env", "user"),
            ("password_env", "password"),
        ):
            if table.has(key):
                connect[option] = table.secret(key)
            table.seen.add(key)
        credentials = table.optional_text("credentials")
        if credentials is not None:
            connect["user_credentials"] = str(self.base / credentials)
        return NatsOptions(
            servers=servers,
            stream=table.text("stream"),
            subject_prefix=table.text("subject_prefix"),
            partitions=tuple(self.names(table, "partitions")),
            group=table.text("group", "statifier"),
            owner=table.optional_text("owner"),
            lease_ttl=table.seconds("lease_ttl", 15.0),
            ack_wait=table.seconds("ack_wait", 60.0),
            max_payload=table.integer("max_payload", 1_048_576),
            pull_batch=table.integer("pull_batch", 64, maximum=100_000),
            buffer=table.integer("buffer", 256, maximum=1_000_000),
            pull_wait=table.seconds("pull_wait", 1.0),
            ack_timeout=table.seconds("ack_timeout", 5.0),
            connect=connect,
        )

    def kafka(self, table: _Table) -> KafkaOptions:
        if table.has("brokers") == table.has("brokers_env"):
            raise table.refuse("brokers", "give brokers (host:port[,host:port...]) or brokers_env")
        brokers = table.secret("brokers_env") if table.has("brokers_env") else table.text("brokers")
        table.seen.update({"brokers", "brokers_env"})
        settings: dict[str, str | int | float | bool] = {}
        plain = table.table("settings")
        for name, value in plain.raw.items():
            plain.seen.add(name)
            if not isinstance(value, str | int | float | bool):
                raise plain.refuse(
                    name, f"must be a string, number or boolean, not {_shown(value)}"
                )
            settings[name] = value
        secret = table.table("settings_env")
        for name in secret.raw:
            settings[name] = secret.secret(name)
        secret.done()
        return KafkaOptions(
            brokers=brokers,
            topics=tuple(self.names(table, "topics")),
            group=table.text("group", "statifier"),
            scope_header=table.optional_text("scope_header"),
            max_payload=table.integer("max_payload", 1_048_576),
            assignment=table.text("assignment", "cooperative-sticky"),
            rebalance_timeout=table.seconds("rebalance_timeout", 60.0),
            settings=settings,
        )

    def names(self, table: _Table, key: str) -> list[str]:
        value = table.value(key, _MISSING)
        if (
            not isinstance(value, list)
            or not value
            or len(value) > MAX_NAMED
            or not all(isinstance(item, str) and item for item in value)
        ):
            raise table.refuse(
                key, f"must be a list of 1 to {MAX_NAMED} non-empty strings, not {_shown(value)}"
            )
        return value

    def consumer(self, table: _Table) -> ConsumerSettings:
        settings = ConsumerSettings(
            lanes=table.integer("lanes", 8, maximum=1024),
            batch_size=table.integer("batch_size", 32, maximum=10_000),
            max_in_flight=table.integer("max_in_flight", 1024, maximum=1_000_000),
            commit_interval=table.seconds("commit_interval", 0.2),
            dead_letter_after=table.optional_integer("dead_letter_after", maximum=1_000_000),
        )
        table.done()
        return settings

    def errors(self, table: _Table, documents: Mapping[str, Machine]) -> ErrorSettings:
        policies = ("continue", "fail")
        default = self.choice(table, "default", policies)
        per_document = table.table("documents")
        chosen: dict[str, str] = {}
        for document in per_document.raw:
            if document not in documents:
                raise per_document.refuse(document, "no such document")
            chosen[document] = self.choice(per_document, document, policies)
        per_document.done()
        table.done()
        return ErrorSettings(default, chosen)

    # Workers.

    def timers(self, table: _Table) -> TimerSettings:
        settings = TimerSettings(
            enabled=table.boolean("enabled", True),
            batch=table.integer("batch", 100, maximum=100_000),
            poll=table.seconds("poll", 1.0),
            retry=table.seconds("retry", 5.0),
        )
        table.done()
        return settings

    def outbox(self, table: _Table) -> OutboxSettings:
        base = table.seconds("backoff_base", 1.0)
        cap = table.seconds("backoff_cap", 300.0)
        factor = table.seconds("backoff_factor", 2.0)
        if factor < 1:
            raise table.refuse("backoff_factor", f"must be at least 1, not {_shown(factor)}")
        settings = OutboxSettings(
            batch=table.integer("batch", 10, maximum=10_000),
            lease=table.seconds("lease", 60.0),
            max_attempts=table.integer("max_attempts", 8, maximum=1_000_000),
            idle=table.seconds("idle", 0.5),
            backoff=Backoff(timedelta(seconds=base), factor, timedelta(seconds=cap)),
            basichttp_timeout=table.seconds("basichttp_timeout", 10.0),
        )
        table.done()
        return settings

    def reapers(self, table: _Table) -> ReaperSettings:
        settings = ReaperSettings(
            enabled=table.boolean("enabled", True),
            interval=table.seconds("interval", 300.0),
            limit=table.integer("limit", 1000, maximum=1_000_000),
        )
        table.done()
        return settings

    # Observability.

    def logging(self, table: _Table) -> LoggingSettings:
        settings = LoggingSettings(
            format=self.choice(table, "format", LOG_FORMATS),
            level=self.choice(table, "level", LOG_LEVELS, "info"),
            events=table.boolean("events", False),
        )
        table.done()
        return settings

    def otel(self, table: _Table) -> OtelSettings:
        settings = OtelSettings(enabled=table.boolean("enabled", False))
        table.done()
        return settings

    # The console.

    def console(self, top: _Table) -> ConsoleSettings:
        if not top.has("console"):
            top.seen.add("console")
            return ConsoleSettings()
        table = top.table("console")
        operators = []
        tokens: dict[str, str] = {}
        for named in table.named("operators"):
            token = named.secret("token_env")
            if len(token) < 16:
                raise named.refuse("token_env", "the token must be at least 16 characters")
            if token in tokens:
                raise named.refuse(
                    "token_env", f"the same token as [console.operators.{tokens[token]}]"
                )
            tokens[token] = _leaf(named)
            operators.append(
                ConsoleOperator(_leaf(named), token, self.choice(named, "role", CONSOLE_ROLES))
            )
            named.done()
        key = None
        if table.has("session_key_env"):
            key = table.secret("session_key_env").encode("utf-8")
            if len(key) < 32:
                raise table.refuse("session_key_env", "the key must be at least 32 bytes")
        table.seen.add("session_key_env")
        scriba_prefix = table.optional_text("scriba_prefix")
        settings = ConsoleSettings(
            enabled=table.boolean("enabled", True),
            operators=tuple(operators),
            session_key=key,
            session_max_age=table.seconds("session_max_age", 12 * 3600.0),
            secure_cookie=table.boolean("secure_cookie", False),
            live_interval=table.seconds("live_interval", 0.5),
            max_clients=table.integer("max_clients", 32, maximum=10_000),
            scriba_prefix=scriba_prefix,
        )
        table.done()
        return settings

    def codec(self, table: _Table) -> BlobCodec:
        """``[codec]``: absent, blobs are stored as given; ``kind = "fernet"`` with
        ``keys_env``, the variables holding the keys, the newest first."""
        if not table.raw:
            return PLAIN
        kind = table.text("kind")
        if kind not in CODEC_KINDS:
            kinds = ", ".join(CODEC_KINDS)
            raise table.refuse("kind", f"must be one of {kinds}, not {_shown(kind)}")
        names = table.value("keys_env", _MISSING)
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(name, str) and name for name in names)
        ):
            raise table.refuse(
                "keys_env",
                "must be a list of environment variable names, the newest key first, "
                f"not {_shown(names)}",
            )
        table.done()
        try:
            from statifier.persistence.fernet import FernetCodec, FernetKeyError
        except MissingExtra as missing:
            raise table.refuse("kind", str(missing)) from None
        try:
            return FernetCodec.from_env(names, self.environ)
        except FernetKeyError as error:  # names the variable, never its value
            raise table.refuse("keys_env", str(error)) from None

    def choice(
        self, table: _Table, key: str, choices: Sequence[str], default: str | None = None
    ) -> str:
        """The value of ``key``, one of ``choices`` (the first when absent, unless
        ``default`` says otherwise)."""
        value = table.value(key, choices[0] if default is None else default)
        if value not in choices:
            raise table.refuse(key, f"must be one of {', '.join(choices)}, not {_shown(value)}")
        assert isinstance(value, str)
        return value

    # What only the whole file can tell.

    def cross_check(self, top: _Table, settings: ServiceSettings) -> None:
        queues = {route.queue for route in settings.routes}
        drained = {sink.queue for sink in settings.sinks}
        for route in settings.routes:
            if route.queue not in drained:
                raise ServiceConfigError(
                    self.file,
                    f"routes.{route.name}",
                    "queue",
                    f"no [sinks.{route.queue}] drains queue {_shown(route.queue)}",
                )
        for sink in settings.sinks:
            if sink.queue not in queues:
                raise ServiceConfigError(
                    self.file, f"sinks.{sink.queue}", "", "no route writes to this queue"
                )
        if settings.routes and settings.send_type is None:
            raise top.refuse("send_type", "required when there are routes: their sends' type")
        if settings.on_complete is not None and settings.on_complete not in {
            r.name for r in settings.routes
        }:
            raise top.refuse("on_complete", f"no [routes.{settings.on_complete}]")
        lease = settings.outbox.lease
        for sink in settings.sinks:
            if isinstance(sink, HttpSink) and sink.timeout >= lease:
                raise ServiceConfigError(
                    self.file,
                    f"sinks.{sink.queue}",
                    "timeout",
                    f"must be shorter than the outbox lease ({lease:g} seconds)",
                )
        console = settings.console
        if console.enabled and not console.operators and not is_loopback(settings.http.host):
            raise ServiceConfigError(
                self.file,
                "console",
                "operators",
                f"a console listening on {_shown(settings.http.host)} (not loopback) needs "
                "operators ([console.operators.NAME] with token_env and role)",
            )
        read = {binding.source for binding in settings.bindings if binding.enabled}
        paths: dict[str, str] = {}
        if console.enabled:
            paths[CONSOLE_PATH] = "the console"
        for front in settings.fronts:
            table = front_table(front)
            if not isinstance(front, BasicHttpFront) and front.source not in read:
                raise ServiceConfigError(
                    self.file,
                    table,
                    "source",
                    f"no enabled binding reads source {_shown(front.source)}",
                )
            for taken in (*HEALTH_PATHS, *paths):
                if _nested(front.path, taken) or _nested(taken, front.path):
                    other = paths.get(taken, "the health endpoints")
                    raise ServiceConfigError(
                        self.file,
                        table,
                        "path",
                        f"{_shown(front.path)} overlaps {other} ({_shown(taken)})",
                    )
            paths[front.path] = f"[{table}]"
        for source in settings.sources:
            if source.kind != "table" and source.name not in read:
                raise ServiceConfigError(
                    self.file,
                    source.table,
                    "",
                    f"no enabled binding reads source {_shown(source.name)}",
                )


def front_table(front: Front) -> str:
    """The table that configures ``front`` (``fronts.webhook.carrier``)."""
    if isinstance(front, WebhookFront):
        kind = "webhook"
    elif isinstance(front, FormFront):
        kind = "form"
    else:
        kind = "basichttp"
    return f"fronts.{kind}.{front.name}"


def _nested(path: str, under: str) -> bool:
    return path == under or path.startswith(under.rstrip("/") + "/")


def _bare(error: BindingError) -> str:
    """The binding error's message without the ``binding 'b', field 'f': `` it begins
    with (the file's location names them)."""
    text = _one_line(error)
    _, found, message = text.partition(f"field {error.field!r}: ")
    return message if found else text


def _binding_label(index: int, binding_id: str) -> str:
    """How an error names a ``[[bindings]]`` table: its place (from 1) and its id."""
    return f"bindings #{index + 1} {_shown(binding_id)}"


def _binding_table(entries: Sequence[object], error: BindingError) -> str:
    for index, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("id") == error.binding_id:
            return _binding_label(index, error.binding_id)
    return "bindings"
