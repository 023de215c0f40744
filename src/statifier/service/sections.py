"""The sections of a ``statifier serve`` file, each read into its settings.

:class:`SectionReader` reads one file's top table (a
:class:`~statifier.service.toml_reader.Table`) and then has the whole checked
(:func:`~statifier.service.cross_checks.cross_check`); every refusal is a
:class:`~statifier.service.settings.ServiceConfigError` naming the file, the table and
the key. Charts are compiled, bindings built and ``[codec]``'s keys read here; sources'
modules are imported only when the service starts one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

from statifier.chart import InvalidChart, Machine, ReadLimits, compile_chart
from statifier.extras import MissingExtra
from statifier.fronts.gather import MAX_WINDOW
from statifier.persistence import PLAIN, BlobCodec, OnError
from statifier.persistence.serialization import DEFAULT_LOCK_WAIT
from statifier.router import (
    Backoff,
    Binding,
    BindingError,
    Cap,
    CapPer,
    ConfigError,
    OverLimit,
    StaticResolver,
    error_policy_of,
    load_bindings,
)
from statifier.router.schedules import Schedule, ScheduleError
from statifier.router.sending import BASICHTTP_QUEUE
from statifier.service.cross_checks import cross_check
from statifier.service.settings import (
    API_PATH,
    API_RIGHTS,
    CODEC_KINDS,
    CONSOLE_ROLES,
    DEFAULT_DATABASE,
    LOG_FORMATS,
    LOG_LEVELS,
    SOURCE_KINDS,
    ApiSettings,
    ApiTokenSettings,
    BasicHttpFront,
    BucketLeaseSettings,
    CallSink,
    ConsoleOperator,
    ConsoleSettings,
    ConsumerSettings,
    DatabaseSettings,
    ErrorSettings,
    FlowSettings,
    FormFront,
    Front,
    HmacSettings,
    HttpSettings,
    HttpSink,
    InboundTableOptions,
    KafkaOptions,
    LoggingSettings,
    NatsOptions,
    OtelSettings,
    OutboxSettings,
    ReaperSettings,
    RouteSettings,
    SchedulerSettings,
    ServiceConfigError,
    ServiceSettings,
    SinkSettings,
    SourceOptions,
    SourceSettings,
    TimerSettings,
    WebhookFront,
)
from statifier.service.toml_reader import (
    MAX_NAMED,
    MISSING,
    Table,
    leaf,
    one_line,
    read_bounded,
    shown,
    toml_document,
)

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_DOCUMENTS",
    "MAX_LEASE_TTL",
    "MAX_SHARDS",
    "MIN_LEASE_TTL",
    "SectionReader",
]

MAX_DOCUMENTS: Final = 1000
"""The most charts one configuration names."""
MAX_CONNECTIONS: Final = 1_000_000
"""The largest ``[http] max_connections`` taken."""
MAX_SHARDS: Final = 64
"""The most stores ``[database] shards`` lists."""
MIN_LEASE_TTL: Final = 1.0
"""The shortest ``[bucket_leases] ttl`` taken: a claim comes every third of it, and a
database that pauses for longer than the ttl lets every slice run out."""
MAX_LEASE_TTL: Final = 86_400.0
"""The longest ``[bucket_leases] ttl`` taken, a day: a killed service's slices wait
that long, and a claim's wait for the group's lock (a third of it) stays within what
PostgreSQL's ``lock_timeout`` takes."""


class SectionReader:
    """Reads one file's tables into settings.

    Args:
        file: the file as it was named, for refusals.
        base: the directory relative paths in the file (charts, bindings) are under.
        environ: where ``*_env`` keys are read.
    """

    def __init__(self, file: str, base: Path, environ: Mapping[str, str]) -> None:
        self.file = file
        self.base = base
        self.environ = environ

    def settings(self, top: Table) -> ServiceSettings:
        """The settings of the file whose top table is ``top``, every table read and
        the whole checked.

        Raises:
            ServiceConfigError: a value is refused.
        """
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
        schedules = [self.schedule(table) for table in top.named("schedules")]
        scheduler = self.scheduler(top.table("scheduler"))
        flow = self.flow(top.table("flow"))
        caps = {leaf(table): self.cap(table, documents) for table in top.named("caps")}
        outbox = self.outbox(top.table("outbox"))
        reapers = self.reapers(top.table("reapers"))
        bucket_leases = self.bucket_leases(top.table("bucket_leases"))
        errors = self.errors(top.table("errors"), documents)
        logging = self.logging(top.table("logging"))
        otel = self.otel(top.table("otel"))
        console = self.console(top)
        api = self.api(top, documents)
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
            bucket_leases=bucket_leases,
            errors=errors,
            logging=logging,
            otel=otel,
            console=console,
            api=api,
            codec=codec,
            schedules=schedules,
            scheduler=scheduler,
            flow=flow,
            caps=caps,
        )
        cross_check(top, settings)
        return settings

    # The database and the listener.

    def database(self, table: Table) -> DatabaseSettings:
        from statifier.sql.engines import url_dialect

        given = [key for key in ("url", "url_env", "shards", "shards_env") if table.has(key)]
        if len(given) > 1:
            raise table.refuse(
                given[1], f"give one of url, url_env, shards and shards_env, not {given[0]} too"
            )
        key = given[0] if given else "url"
        shards: tuple[str, ...] = ()
        if key in ("shards", "shards_env"):
            shards = self.shard_urls(table, key)
            url = shards[0]
        else:
            url = (
                table.secret("url_env") if key == "url_env" else table.text("url", DEFAULT_DATABASE)
            )
        parsed = [self.parsed_url(table, key, each) for each in shards or (url,)]
        schema = table.optional_text("schema")
        if schema is not None and not all(url_dialect(each).schemas for each in parsed):
            raise table.refuse("schema", "a schema needs PostgreSQL")
        settings = DatabaseSettings(
            url=url,
            prefix=table.text("prefix", "statifier_"),
            schema=schema,
            lock_wait=table.seconds("lock_wait", DEFAULT_LOCK_WAIT),
            locks="rows"
            if self.choice(table, "locks", ("advisory", "rows")) == "rows"
            else "advisory",
            shards=shards,
        )
        table.done()
        return settings

    def shard_urls(self, table: Table, key: str) -> tuple[str, ...]:
        """The stores' URLs ``shards`` lists, or those of the environment variables
        ``shards_env`` names: at least two, at most :data:`MAX_SHARDS`, no two alike."""
        listed = table.value(key, MISSING)
        if (
            not isinstance(listed, list)
            or not all(isinstance(item, str) and item for item in listed)
            or not 2 <= len(listed) <= MAX_SHARDS
        ):
            raise table.refuse(
                key, f"must list 2 to {MAX_SHARDS} non-empty strings, not {shown(listed)}"
            )
        urls: list[str] = []
        for item in listed:
            if key == "shards":
                urls.append(item)
                continue
            value = table.environ.get(item)
            if not value:
                raise table.refuse(key, f"the environment variable {item} is not set (or empty)")
            urls.append(value)
        if len(set(urls)) != len(urls):
            raise table.refuse(key, "names one store twice")
        return tuple(urls)

    def parsed_url(self, table: Table, key: str, url: str) -> sa.URL:
        from statifier.sql.engines import database_url

        try:
            return database_url(url)
        except ValueError as error:  # the message names the driver, never the URL
            raise table.refuse(key, one_line(error)) from None
        except Exception:  # noqa: BLE001 - SQLAlchemy's parse errors quote the URL
            raise table.refuse(key, "is not a database URL") from None

    def http(self, table: Table) -> HttpSettings:
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

    def documents(self, top: Table) -> dict[str, Machine]:
        files: dict[str, tuple[Path, str, str]] = {}
        directory = top.optional_text("charts")
        if directory is not None:
            folder = self.base / directory
            if not folder.is_dir():
                raise top.refuse("charts", f"{shown(directory)} is not a directory")
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

    def bindings(self, top: Table, documents: Mapping[str, Machine]) -> list[Binding]:
        value = top.raw.get("bindings", [])
        top.seen.add("bindings")
        where = self.file  # the file the bindings are in
        if isinstance(value, str) and value:
            file = self.base / value
            data = read_bounded(file, self.file, "bindings")
            try:
                entries = toml_document(data).get("bindings", [])
            except ValueError as error:
                raise ServiceConfigError(self.file, "", "bindings", f"{file}: {error}") from None
            where = str(file)
        elif isinstance(value, list):
            entries = value
        else:
            raise top.refuse("bindings", f"a file name or [[bindings]] tables, not {shown(value)}")
        if not isinstance(entries, list) or len(entries) > MAX_NAMED * 10:
            raise ServiceConfigError(
                where, "", "bindings", "must be at most 10000 [[bindings]] tables"
            )
        try:
            bindings = load_bindings(entries)
        except BindingError as error:
            raise ServiceConfigError(
                where, _binding_table(entries, error), error.field, _bare(error)
            ) from None
        for index, binding in enumerate(bindings):
            if binding.enabled and binding.document not in documents:
                raise ServiceConfigError(
                    where,
                    _binding_label(index, binding.id),
                    "document",
                    f"no chart for document {shown(binding.document)} "
                    "(name it under [documents] or put it in the charts directory)",
                )
        return bindings

    # Routes and sinks.

    def route(self, table: Table) -> RouteSettings:
        settings = RouteSettings(
            name=leaf(table), queue=table.text("queue"), target=table.optional_text("target")
        )
        table.done()
        if settings.queue == BASICHTTP_QUEUE:
            raise table.refuse("queue", f"{shown(BASICHTTP_QUEUE)} is the built-in BasicHTTP queue")
        return settings

    def sink(self, table: Table) -> SinkSettings:
        queue = leaf(table)
        if queue == BASICHTTP_QUEUE:
            raise table.refuse("", "the basichttp queue is drained by the built-in BasicHTTP sink")
        if table.has("url") == table.has("call"):
            raise table.refuse("url", "give url (an HTTP POST sink) or call (a Python callable)")
        sink: SinkSettings
        if table.has("call"):
            call = table.text("call")
            module, colon, function = call.partition(":")
            if not colon or not module or not function.isidentifier():
                raise table.refuse("call", f"must be 'package.module:function', not {shown(call)}")
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

    def fronts(self, table: Table) -> list[Front]:
        fronts: list[Front] = []
        for named in table.named("webhook"):
            fronts.append(
                WebhookFront(
                    name=leaf(named),
                    path=self.path(named),
                    source=named.text("source"),
                    scope=named.text("scope"),
                    provider_id_header=named.optional_text("provider_id_header"),
                    max_body=named.integer("max_body", 1 << 20),
                    timeout=(timeout := named.seconds("timeout", 10.0)),
                    hmac=self.hmac(named),
                    group_commit=self.group_commit(named, timeout),
                )
            )
            named.done()
        for named in table.named("form"):
            fronts.append(
                FormFront(
                    name=leaf(named),
                    path=self.path(named),
                    source=named.text("source"),
                    scope=named.text("scope"),
                    max_body=named.integer("max_body", 1 << 16),
                    timeout=(timeout := named.seconds("timeout", 10.0)),
                    hmac=self.hmac(named),
                    group_commit=self.group_commit(named, timeout),
                )
            )
            named.done()
        for named in table.named("basichttp"):
            fronts.append(
                BasicHttpFront(
                    name=leaf(named),
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

    def path(self, table: Table) -> str:
        path = table.text("path")
        if not path.startswith("/") or path != path.rstrip("/") or "//" in path or "?" in path:
            raise table.refuse(
                "path", f'must be an absolute path such as "/hooks/x", not {shown(path)}'
            )
        return path

    def group_commit(self, front: Table, timeout: float) -> float | None:
        """``group_commit_ms``, the group commit window, as seconds (``None`` when
        absent: each post is routed alone); shorter than the front's ``timeout``."""
        key = "group_commit_ms"
        front.seen.add(key)
        if not front.has(key):
            return None
        value = front.raw[key]
        longest = MAX_WINDOW * 1000
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 < value <= longest
        ):
            wanted = f"a number of milliseconds over 0 and at most {longest:g}"
            raise front.refuse(key, f"must be {wanted}, not {shown(value)}")
        window = value / 1000
        if window >= timeout:
            raise front.refuse(key, f"must be shorter than timeout ({timeout:g} seconds)")
        return window

    def hmac(self, front: Table) -> HmacSettings | None:
        if not front.has("hmac"):
            front.seen.add("hmac")
            return None
        table = front.table("hmac")
        encoding = table.text("encoding", "hex")
        if encoding not in ("hex", "base64"):
            raise table.refuse("encoding", f"must be hex or base64, not {shown(encoding)}")
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

    def source(self, table: Table) -> SourceSettings:
        kind = table.text("kind")
        if kind not in SOURCE_KINDS:
            kinds = ", ".join(sorted(SOURCE_KINDS))
            raise table.refuse("kind", f"must be one of {kinds}, not {shown(kind)}")
        scope = None
        if kind == "kafka" and table.has("scope_header"):
            if table.has("scope"):
                raise table.refuse("scope_header", "give scope or scope_header, not both")
        elif kind != "table":  # the table's rows carry their own scope
            scope = table.text("scope")
        consumer = self.consumer(table.table("consumer"))
        options = self.options(kind, table)
        table.done()
        return SourceSettings(leaf(table), kind, scope, options, consumer, table.name)

    def options(self, kind: str, table: Table) -> SourceOptions:
        if kind == "nats":
            return self.nats(table)
        if kind == "kafka":
            return self.kafka(table)
        if kind == "table":
            return InboundTableOptions(
                partitions=tuple(self.names(table, "partitions")),
                group=table.text("group", leaf(table)),
                owner=table.optional_text("owner"),
                lease_ttl=table.seconds("lease_ttl", 15.0),
            )
        raise AssertionError(kind)  # pragma: no cover - the kinds are checked above

    def nats(self, table: Table) -> NatsOptions:
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

    def kafka(self, table: Table) -> KafkaOptions:
        if table.has("brokers") == table.has("brokers_env"):
            raise table.refuse("brokers", "give brokers (host:port[,host:port...]) or brokers_env")
        brokers = table.secret("brokers_env") if table.has("brokers_env") else table.text("brokers")
        table.seen.update({"brokers", "brokers_env"})
        settings: dict[str, str | int | float | bool] = {}
        plain = table.table("settings")
        for name, value in plain.raw.items():
            plain.seen.add(name)
            if not isinstance(value, str | int | float | bool):
                raise plain.refuse(name, f"must be a string, number or boolean, not {shown(value)}")
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
            commit_timeout=table.seconds("commit_timeout", 10.0),
            settings=settings,
        )

    def names(self, table: Table, key: str) -> list[str]:
        value = table.value(key, MISSING)
        if (
            not isinstance(value, list)
            or not value
            or len(value) > MAX_NAMED
            or not all(isinstance(item, str) and item for item in value)
        ):
            raise table.refuse(
                key, f"must be a list of 1 to {MAX_NAMED} non-empty strings, not {shown(value)}"
            )
        return value

    def consumer(self, table: Table) -> ConsumerSettings:
        settings = ConsumerSettings(
            lanes=table.integer("lanes", 8, maximum=1024),
            batch_size=table.integer("batch_size", 32, maximum=10_000),
            max_in_flight=table.integer("max_in_flight", 1024, maximum=1_000_000),
            commit_interval=table.seconds("commit_interval", 0.2),
            stall_after=table.seconds("stall_after", 60.0),
            dead_letter_after=table.optional_integer("dead_letter_after", maximum=1_000_000),
        )
        table.done()
        return settings

    def errors(self, table: Table, documents: Mapping[str, Machine]) -> ErrorSettings:
        policies = tuple(policy.value for policy in OnError)
        default = self.choice(table, "default", policies)
        per_document = table.table("documents")
        charts: dict[str | tuple[str, str], Machine] = dict(documents.items())
        resolver = StaticResolver(charts)
        chosen: dict[str, str] = {}
        for document in per_document.raw:
            chosen[document] = self.choice(per_document, document, policies)
            try:  # the router's check, one document at a time to name the key
                error_policy_of(default, {document: chosen[document]}, resolver)
            except ConfigError as error:
                raise per_document.refuse(document, one_line(error)) from None
        per_document.done()
        table.done()
        return ErrorSettings(default, chosen)

    # Workers.

    def timers(self, table: Table) -> TimerSettings:
        settings = TimerSettings(
            enabled=table.boolean("enabled", True),
            batch=table.integer("batch", 100, maximum=100_000),
            poll=table.seconds("poll", 1.0),
            retry=table.seconds("retry", 5.0),
        )
        table.done()
        return settings

    def schedule(self, table: Table) -> Schedule:
        """``[schedules.NAME]``: the fields :meth:`Schedule.from_mapping
        <statifier.router.schedules.Schedule.from_mapping>` reads, its unknown keys
        refused there."""
        try:
            return Schedule.from_mapping(leaf(table), table.raw)
        except ScheduleError as error:
            raise table.refuse("", one_line(error)) from None

    def scheduler(self, table: Table) -> SchedulerSettings:
        settings = SchedulerSettings(
            enabled=table.boolean("enabled", True),
            poll=table.seconds("poll", 1.0),
            retry=table.seconds("retry", 5.0),
            max_retry=table.seconds("max_retry", 600.0),
        )
        table.done()
        if settings.max_retry < settings.retry:
            raise table.refuse("max_retry", "must be at least retry")
        return settings

    def cap(self, table: Table, documents: Mapping[str, Machine]) -> Cap:
        """``[caps.DOCUMENT]``: ``max_active``, ``per`` and ``over``, for a document the
        file names."""
        document = leaf(table)
        if document not in documents:
            raise table.refuse("", f"no document {document!r} in the file's charts")
        if not table.has("max_active"):
            raise table.refuse("max_active", "required")
        cap = Cap(
            table.integer("max_active", 1, maximum=1_000_000),
            per=CapPer(self.choice(table, "per", tuple(member.value for member in CapPer))),
            over=OverLimit(self.choice(table, "over", tuple(m.value for m in OverLimit))),
        )
        table.done()
        return cap

    def flow(self, table: Table) -> FlowSettings:
        settings = FlowSettings(
            enabled=table.boolean("enabled", True),
            poll=table.seconds("poll", 1.0),
            retry=table.seconds("retry", 5.0),
            max_retry=table.seconds("max_retry", 600.0),
        )
        table.done()
        if settings.max_retry < settings.retry:
            raise table.refuse("max_retry", "must be at least retry")
        return settings

    def outbox(self, table: Table) -> OutboxSettings:
        base = table.seconds("backoff_base", 1.0)
        cap = table.seconds("backoff_cap", 300.0)
        factor = table.seconds("backoff_factor", 2.0)
        try:
            backoff = Backoff(timedelta(seconds=base), factor, timedelta(seconds=cap))
        except ConfigError as error:  # base and cap are positive: the factor is refused
            raise table.refuse("backoff_factor", one_line(error)) from None
        settings = OutboxSettings(
            batch=table.integer("batch", 10, maximum=10_000),
            lease=table.seconds("lease", 60.0),
            max_attempts=table.integer("max_attempts", 8, maximum=1_000_000),
            idle=table.seconds("idle", 0.5),
            backoff=backoff,
            basichttp_timeout=table.seconds("basichttp_timeout", 10.0),
        )
        table.done()
        return settings

    def reapers(self, table: Table) -> ReaperSettings:
        settings = ReaperSettings(
            enabled=table.boolean("enabled", True),
            interval=table.seconds("interval", 300.0),
            limit=table.integer("limit", 1000, maximum=1_000_000),
            ledger_days=table.integer("ledger_days", 30, minimum=0, maximum=36_500),
        )
        table.done()
        return settings

    def bucket_leases(self, table: Table) -> BucketLeaseSettings:
        settings = BucketLeaseSettings(
            enabled=table.boolean("enabled", False),
            slices=table.integer("slices", 16, maximum=1024),
            ttl=self.lease_ttl(table),
        )
        table.done()
        return settings

    def lease_ttl(self, table: Table) -> float:
        """``[bucket_leases] ttl``: seconds from :data:`MIN_LEASE_TTL` to
        :data:`MAX_LEASE_TTL`."""
        ttl = table.seconds("ttl", 15.0)
        if not MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL:
            raise table.refuse(
                "ttl",
                f"must be from {MIN_LEASE_TTL:g} to {MAX_LEASE_TTL:g} seconds (a day), not {ttl:g}",
            )
        return ttl

    # Observability.

    def logging(self, table: Table) -> LoggingSettings:
        settings = LoggingSettings(
            format=self.choice(table, "format", LOG_FORMATS),
            level=self.choice(table, "level", LOG_LEVELS, "info"),
            events=table.boolean("events", False),
        )
        table.done()
        return settings

    def otel(self, table: Table) -> OtelSettings:
        settings = OtelSettings(enabled=table.boolean("enabled", False))
        table.done()
        return settings

    # The console.

    def console(self, top: Table) -> ConsoleSettings:
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
            tokens[token] = leaf(named)
            operators.append(
                ConsoleOperator(leaf(named), token, self.choice(named, "role", CONSOLE_ROLES))
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

    # The HTTP API.

    def api(self, top: Table, documents: Mapping[str, Machine]) -> ApiSettings:
        """``[api]``: absent, no API is served."""
        if not top.has("api"):
            top.seen.add("api")
            return ApiSettings()
        table = top.table("api")
        tokens = []
        seen: dict[str, str] = {}
        for named in table.named("tokens"):
            token = named.secret("token_env")
            if not 16 <= len(token) <= 512:
                raise named.refuse("token_env", "the token must be 16 to 512 characters")
            if token in seen:
                raise named.refuse("token_env", f"the same token as [api.tokens.{seen[token]}]")
            seen[token] = leaf(named)
            scopes = named.value("scopes", MISSING)
            if (
                not isinstance(scopes, list)
                or not scopes
                or not all(isinstance(scope, str) and scope for scope in scopes)
            ):
                raise named.refuse(
                    "scopes", f'must be a list of scopes (["*"]: every one), not {shown(scopes)}'
                )
            if "*" in scopes and len(scopes) > 1:  # the other scopes would read as limits
                raise named.refuse("scopes", '"*" is every scope: give it alone')
            rights = self.choice(named, "rights", API_RIGHTS, "read")
            tokens.append(ApiTokenSettings(leaf(named), token, tuple(scopes), rights))
            named.done()
        enabled = table.boolean("enabled", True)
        if enabled and not tokens:
            raise table.refuse("tokens", "the API needs a token: [api.tokens.NAME]")
        visible: dict[str, tuple[str, ...]] = {}
        shown_fields = table.table("visible")
        for document, fields in shown_fields.raw.items():
            shown_fields.seen.add(document)
            if document not in documents:
                raise shown_fields.refuse(document, "no chart of this document is loaded")
            if not isinstance(fields, list) or not all(
                isinstance(name, str) and name and not name.startswith("_") for name in fields
            ):
                raise shown_fields.refuse(
                    document, f"must be a list of datamodel field names, not {shown(fields)}"
                )
            visible[document] = tuple(fields)
        settings = ApiSettings(
            enabled=enabled,
            path=self.path(table) if table.has("path") else API_PATH,
            tokens=tuple(tokens),
            visible=visible,
            max_body=table.integer("max_body", 1024 * 1024, maximum=64 * 1024 * 1024),
            timeout=table.seconds("timeout", 10.0),
            max_wait=table.seconds("max_wait", 60.0),
            poll=table.seconds("poll", 0.2),
        )
        table.seen.add("path")
        table.done()
        return settings

    def codec(self, table: Table) -> BlobCodec:
        """``[codec]``: absent, blobs are stored as given; ``kind = "fernet"`` with
        ``keys_env``, the variables holding the keys, the newest first."""
        if not table.raw:
            return PLAIN
        kind = table.text("kind")
        if kind not in CODEC_KINDS:
            kinds = ", ".join(CODEC_KINDS)
            raise table.refuse("kind", f"must be one of {kinds}, not {shown(kind)}")
        names = table.value("keys_env", MISSING)
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(name, str) and name for name in names)
        ):
            raise table.refuse(
                "keys_env",
                "must be a list of environment variable names, the newest key first, "
                f"not {shown(names)}",
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
        self, table: Table, key: str, choices: Sequence[str], default: str | None = None
    ) -> str:
        """The value of ``key``, one of ``choices`` (the first when absent, unless
        ``default`` says otherwise)."""
        value = table.value(key, choices[0] if default is None else default)
        if value not in choices:
            raise table.refuse(key, f"must be one of {', '.join(choices)}, not {shown(value)}")
        assert isinstance(value, str)
        return value


def _bare(error: BindingError) -> str:
    """The binding error's message without the ``binding 'b', field 'f': `` it begins
    with (the file's location names them)."""
    text = one_line(error)
    _, found, message = text.partition(f"field {error.field!r}: ")
    return message if found else text


def _binding_label(index: int, binding_id: str) -> str:
    """How an error names a ``[[bindings]]`` table: its place (from 1) and its id."""
    return f"bindings #{index + 1} {shown(binding_id)}"


def _binding_table(entries: Sequence[object], error: BindingError) -> str:
    for index, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("id") == error.binding_id:
            return _binding_label(index, error.binding_id)
    return "bindings"
