"""What a configuration file of ``statifier serve`` loads into: plain frozen values,
:class:`ServiceSettings` and its parts, and :class:`ServiceConfigError`, the one error
a refused file raises, naming the file, the table and the key.

The values hold what the file said, checked (:func:`statifier.service.config_file.load`
reads them) but nothing opened; the fields a secret fills stay out of ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from statifier.chart import Machine
from statifier.persistence import PLAIN, BlobCodec
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.router import Backoff, Binding, Cap
from statifier.router.schedules import Schedule

__all__ = [
    "API_PATH",
    "API_RIGHTS",
    "CODEC_KINDS",
    "CONSOLE_PATH",
    "CONSOLE_ROLES",
    "DEFAULT_DATABASE",
    "HEALTH_PATHS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SOURCE_KINDS",
    "ApiSettings",
    "ApiTokenSettings",
    "BasicHttpFront",
    "CallSink",
    "ConsoleOperator",
    "ConsoleSettings",
    "ConsumerSettings",
    "DatabaseSettings",
    "ErrorSettings",
    "FlowSettings",
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
    "SchedulerSettings",
    "ServiceConfigError",
    "ServiceSettings",
    "SinkSettings",
    "SourceOptions",
    "SourceSettings",
    "TimerSettings",
    "WebhookFront",
    "front_table",
]

DEFAULT_DATABASE: Final = "sqlite:///statifier.db"
"""The database when the file names none: ``statifier.db`` in the working directory."""
HEALTH_PATHS: Final = frozenset({"/healthz", "/readyz"})
"""The service's own paths; no front may be mounted on or under them."""
CONSOLE_PATH: Final = "/console"
"""Where the console is served (with ``[console]``); no front may be mounted there."""
API_PATH: Final = "/api"
"""Where the HTTP API is served by default (with ``[api]``)."""
API_RIGHTS: Final = ("read", "write")
"""The rights of ``[api.tokens.NAME]``."""
CONSOLE_ROLES: Final = ("operator", "read_only")
"""The roles of ``[console.operators.NAME]``."""
SOURCE_KINDS: Final = frozenset({"table", "kafka", "nats"})
"""The ``[sources.NAME]`` kinds: the inbound-events table, Kafka, NATS JetStream."""
CODEC_KINDS: Final = ("fernet",)
"""The ``[codec]`` kinds: Fernet (``statifier.persistence.fernet``)."""
LOG_FORMATS: Final = ("text", "json")
"""The ``[logging]`` formats: plain lines, or one JSON object a line."""
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
"""The ``[logging]`` levels, lowest first."""


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


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    """Where executions and the router's tables live.

    Attributes:
        url: a ``postgresql://`` or ``sqlite:///`` URL (kept out of ``repr``: it may
            carry a password).
        prefix, schema: the tables' :class:`~statifier.sql.TableOptions`.
        lock_wait: the most seconds a delivery waits for an execution's lock (30 by
            default).
        locks: how a PostgreSQL transaction holds its locks, the tables'
            :attr:`~statifier.sql.TableOptions.locks`: ``"advisory"`` (the default)
            or ``"rows"``.
        shards: the URLs of the stores when the executions and the router's tables
            are spread over several by key buckets (a
            :class:`~statifier.router.ShardedRouter`, even ranges), the first being
            ``url``; empty for one database (kept out of ``repr``).
    """

    url: str = field(default=DEFAULT_DATABASE, repr=False)
    prefix: str = "statifier_"
    schema: str | None = None
    lock_wait: float = DEFAULT_LOCK_WAIT
    locks: Literal["advisory", "rows"] = "advisory"
    shards: tuple[str, ...] = field(default=(), repr=False)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every store's URL: the shards', else ``url`` alone."""
        return self.shards or (self.url,)


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
class SchedulerSettings:
    """The scheduler's bounds (``[scheduler]``, :class:`~statifier.router.scheduler.Scheduler`):
    whether this service fires schedules, the longest sleep between passes, and the
    delays before a failed fire is tried again (doubling from ``retry`` up to
    ``max_retry``), in seconds."""

    enabled: bool = True
    poll: float = 1.0
    retry: float = 5.0
    max_retry: float = 600.0


@dataclass(frozen=True, slots=True)
class FlowSettings:
    """The flow worker's bounds (``[flow]``, :class:`~statifier.router.FlowWorker`):
    whether this service delivers what debounce, batch and throttle bindings hold, the
    longest sleep between passes, and the delays before a failed flush is tried again
    (doubling from ``retry`` up to ``max_retry``), in seconds."""

    enabled: bool = True
    poll: float = 1.0
    retry: float = 5.0
    max_retry: float = 600.0


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
    """How often the reapers run (:mod:`statifier.router.reapers`), their page, and how
    long the ledger is kept."""

    enabled: bool = True
    interval: float = 300.0
    limit: int = 1000
    ledger_days: int = 30
    """How many days of routing-ledger rows to keep; 0 keeps every row."""


@dataclass(frozen=True, slots=True)
class BucketLeaseSettings:
    """Whether the services on one store share its workers by leased ranges of
    buckets (:mod:`statifier.service.bucket_leases`), in how many slices, and how long
    a claim holds them."""

    enabled: bool = False
    slices: int = 16
    ttl: float = 15.0


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
    ``scope``. ``group_commit``: the seconds concurrent posts are gathered to be routed
    in one transaction (``group_commit_ms`` / 1000); ``None``: each post routed alone."""

    name: str
    path: str
    source: str
    scope: str
    provider_id_header: str | None = None
    max_body: int = 1 << 20
    timeout: float = 10.0
    hmac: HmacSettings | None = None
    group_commit: float | None = None


@dataclass(frozen=True, slots=True)
class FormFront:
    """An HTML form POST front mounted at ``path``; ``group_commit`` as a webhook's."""

    name: str
    path: str
    source: str
    scope: str
    max_body: int = 1 << 16
    timeout: float = 10.0
    hmac: HmacSettings | None = None
    group_commit: float | None = None


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
    table (``None``: retried until it succeeds); readiness says the consumer is stalled
    once events wait and none was done for ``stall_after`` seconds."""

    lanes: int = 8
    batch_size: int = 32
    max_in_flight: int = 1024
    commit_interval: float = 0.2
    stall_after: float = 60.0
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
    commit_timeout: float = 10.0
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
class ApiTokenSettings:
    """A caller of the HTTP API (``[api.tokens.NAME]``): its name, its token read from
    the environment (``token_env``; kept out of ``repr``), the scopes it reaches
    (``["*"]``: every scope) and its rights, one of :data:`API_RIGHTS`."""

    name: str
    token: str = field(repr=False)
    scopes: tuple[str, ...]
    rights: str = "read"


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """The HTTP API (``[api]``, see ``docs/api.md``), mounted at ``path`` beside the
    fronts.

    Attributes:
        enabled: whether it is served (the table's presence, unless ``enabled =
            false``).
        path: where it is mounted.
        tokens: who may call it (at least one).
        visible: for a document, the datamodel fields an answer may show.
        max_body: the largest request body read, in bytes.
        timeout: the seconds one call may take (a wait aside).
        max_wait: the longest wait answered, in seconds.
        poll: the seconds between two reads of the executions waited on.
    """

    enabled: bool = False
    path: str = API_PATH
    tokens: tuple[ApiTokenSettings, ...] = ()
    visible: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_body: int = 1024 * 1024
    timeout: float = 10.0
    max_wait: float = 60.0
    poll: float = 0.2


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
    """A checked configuration file (its schema: :mod:`statifier.service.config_file`).

    Attributes:
        file: the file as it was named, for errors found later.
        documents: document -> its compiled chart.
        bindings: every binding, in file order.
        codec: what encodes the executions' blobs (``[codec]``; stored as given when
            the table is absent). Its keys were read from the environment at load and
            never appear in a ``repr``.
        schedules: the file's ``[schedules.NAME]``, in file order, put on the
            database when the service starts.
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
    api: ApiSettings = field(default_factory=ApiSettings)
    codec: BlobCodec = PLAIN
    schedules: Sequence[Schedule] = ()
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    flow: FlowSettings = field(default_factory=FlowSettings)
    caps: Mapping[str, Cap] = field(default_factory=dict)
    bucket_leases: BucketLeaseSettings = field(default_factory=BucketLeaseSettings)


def front_table(front: Front) -> str:
    """The table that configures ``front`` (``fronts.webhook.carrier``)."""
    if isinstance(front, WebhookFront):
        kind = "webhook"
    elif isinstance(front, FormFront):
        kind = "form"
    else:
        kind = "basichttp"
    return f"fronts.{kind}.{front.name}"
