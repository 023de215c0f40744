"""The configuration file of ``statifier serve``: a whole file loads into settings and
a router configuration; every refusal names the file, the table and the key; unknown
keys, oversized files and missing secrets are refused; secrets never show; a database
that is not migrated is refused unless the file asks for the migration, on both
databases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - a fixture
from tests.service.helpers import (
    HITS,
    HITS_BINDING,
    ORDER,
    ORDER_BINDING,
    database_table,
    write_config,
)

from statifier.callbacks import awaited
from statifier.core import Event
from statifier.persistence.sql import SqlAdapter
from statifier.router import InboundEvent, OutboxDrain, OutboxRoute, Router, error_policy_of
from statifier.router.routes import IdempotencyKey
from statifier.service import NotMigrated, ServiceConfigError, load
from statifier.service.service import prepare_database
from statifier.service.settings import (
    BasicHttpFront,
    BucketLeaseSettings,
    CallSink,
    FormFront,
    HttpSink,
    InboundTableOptions,
    LoggingSettings,
    NatsOptions,
    OtelSettings,
    WebhookFront,
)
from statifier.service.toml_reader import MAX_CONFIG_BYTES
from statifier.service.wiring import router_config
from statifier.sql import TableOptions, migrations

WHOLE = """
migrate = true
shutdown_timeout = 4.5
charts = "charts"
send_type = "test:route"
on_complete = "finished"
bindings = "bindings.toml"

[database]
url_env = "TEST_DATABASE_URL"
prefix = "svc_"
lock_wait = 3
locks = "rows"

[http]
host = "0.0.0.0"
port = 9090

[documents]
orders = "charts/order.scxml"

[routes.finished]
queue = "done"
target = "https://example.com/t"

[sinks.done]
url = "https://example.com/done"
timeout = 5
authorization_env = "TEST_SINK_TOKEN"

[routes.audit]
queue = "audit"

[sinks.audit]
call = "tests.service.recording:record"

[fronts.webhook.carrier]
path = "/hooks/carrier"
source = "clicks"
scope = "depot_7"
provider_id_header = "X-Delivery-Id"
max_body = 2048
timeout = 3

[fronts.webhook.carrier.hmac]
secret_env = "TEST_HMAC_SECRET"
header = "X-Signature"
prefix = "sha256="

[fronts.form.signup]
path = "/forms/signup"
source = "clicks"
scope = "web"

[fronts.basichttp.events]
path = "/basichttp"
base_url = "https://svc.example.com/basichttp"

[sources.clicks]
kind = "nats"
scope = "web"
servers = ["nats://127.0.0.1:4222"]
token_env = "TEST_NATS_TOKEN"
stream = "CLICKS"
subject_prefix = "clicks"
partitions = ["0", "1"]

[sources.clicks.consumer]
lanes = 4
dead_letter_after = 5

[sources.inbound]
kind = "table"
partitions = ["a"]

[timers]
poll = 0.5

[outbox]
lease = 30
max_attempts = 3

[reapers]
interval = 60
ledger_days = 7

[bucket_leases]
enabled = true
slices = 8
"""

SECRETS = {
    "TEST_DATABASE_URL": "sqlite:///svc.db",
    "TEST_SINK_TOKEN": "Bearer tok-3f9a",
    "TEST_HMAC_SECRET": "hmac-7c1d",
    "TEST_NATS_TOKEN": "nats-55e2",
}


def whole(tmp_path: Path) -> Path:
    (tmp_path / "bindings.toml").write_text(HITS_BINDING, encoding="utf-8")
    return write_config(tmp_path, WHOLE, {"hits": HITS, "order": ORDER})


def test_a_whole_file_loads_into_settings(tmp_path: Path) -> None:
    settings = load(whole(tmp_path), SECRETS)
    assert settings.migrate is True
    assert settings.shutdown_timeout == 4.5
    assert settings.database.url == "sqlite:///svc.db"
    assert (settings.database.prefix, settings.database.lock_wait) == ("svc_", 3.0)
    assert settings.database.locks == "rows"
    assert (settings.http.host, settings.http.port) == ("0.0.0.0", 9090)
    assert sorted(settings.documents) == ["hits", "order", "orders"]
    assert [binding.id for binding in settings.bindings] == ["hits"]
    assert settings.sinks == [
        HttpSink("done", "https://example.com/done", 5.0, "Bearer tok-3f9a"),
        CallSink("audit", "tests.service.recording:record"),
    ]
    webhook, _form, basichttp = settings.fronts
    assert isinstance(webhook, WebhookFront)
    assert (webhook.path, webhook.provider_id_header, webhook.max_body) == (
        "/hooks/carrier",
        "X-Delivery-Id",
        2048,
    )
    assert webhook.hmac is not None
    assert webhook.hmac.secret == b"hmac-7c1d"
    assert webhook.hmac.prefix == "sha256="
    assert isinstance(basichttp, BasicHttpFront)
    assert basichttp.base_url == "https://svc.example.com/basichttp"
    nats, table = settings.sources
    assert isinstance(nats.options, NatsOptions)
    assert nats.options.connect == {"token": "nats-55e2"}
    assert (nats.consumer.lanes, nats.consumer.dead_letter_after) == (4, 5)
    assert table.options == InboundTableOptions(partitions=("a",), group="inbound")
    assert table.scope is None
    assert settings.timers.poll == 0.5
    assert (settings.outbox.lease, settings.outbox.max_attempts) == (30.0, 3)
    assert (settings.reapers.interval, settings.reapers.ledger_days) == (60.0, 7)
    assert settings.bucket_leases == BucketLeaseSettings(enabled=True, slices=8, ttl=15.0)
    # No secret (nor the database URL) shows in the settings' repr.
    shown = repr(settings)
    for secret in SECRETS.values():
        assert secret not in shown


@pytest.mark.asyncio
async def test_the_settings_build_the_router_configuration(tmp_path: Path) -> None:
    settings = load(whole(tmp_path), SECRETS)
    async with SqlAdapter("sqlite://") as adapter:
        config = router_config(settings, adapter)
        assert config.send_type == "test:route"
        assert config.on_complete == "finished"
        assert config.lock_wait == 3.0
        assert config.basichttp is not None
        assert config.basichttp.base_url == "https://svc.example.com/basichttp"
        found = config.route("depot_7", "finished")
        assert found is not None
        adapter_of_route, route_config = found
        assert isinstance(adapter_of_route, OutboxRoute)
        assert dict(route_config) == {"queue": "done", "target": "https://example.com/t"}
        assert [binding.id for binding in config.bindings or ()] == ["hits"]
        resolved = await config.resolve("web", "orders")
        assert resolved.machine.identity.name == "orders"


def refused(tmp_path: Path, body: str, environ: dict[str, str] | None = None) -> str:
    config = write_config(tmp_path, body, {"hits": HITS})
    with pytest.raises(ServiceConfigError) as error:
        load(config, environ or {})
    text = str(error.value)
    assert text.startswith(f"{config}: ")
    return text.removeprefix(f"{config}: ")


def test_a_refused_value_names_the_file_the_table_and_the_key(tmp_path: Path) -> None:
    body = """
[fronts.webhook.carrier]
path = "/hooks/carrier"
source = "carrier"
scope = "depot_7"
max_body = "big"
"""
    config = write_config(tmp_path, body)
    with pytest.raises(ServiceConfigError) as error:
        load(config, {})
    assert str(error.value) == (
        f'{config}: [fronts.webhook.carrier] max_body: must be a positive integer, not "big"'
    )
    assert (error.value.file, error.value.table, error.value.key) == (
        str(config),
        "fronts.webhook.carrier",
        "max_body",
    )


HEAD = f'charts = "charts"\n{HITS_BINDING}\n'
SENDING = 'send_type = "t:r"\n' + HEAD
WEBHOOK = '[fronts.webhook.w]\npath = "/w"\nsource = "clicks"\nscope = "s"\n'
ROUTED = '[routes.r]\nqueue = "q"\n'


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("migrat = true\n", "migrat: unknown key"),
        ("[http]\nhots = 'x'\n", "[http] hots: unknown key"),
        ("[timers]\npoll = 0\n", "[timers] poll: must be a positive number of seconds, not 0"),
        ("shutdown_timeout = true\n", "shutdown_timeout: must be a positive number of seconds"),
        ("[http]\nport = 70000\n", "[http] port: must be an integer from 0 to 65535, not 70000"),
        (
            "[reapers]\nledger_days = -1\n",
            "[reapers] ledger_days: must be an integer from 0 to 36500, not -1",
        ),
        (
            "[bucket_leases]\nslices = 2000\n",
            "[bucket_leases] slices: must be an integer from 1 to 1024, not 2000",
        ),
        ("[bucket_leases]\nttl = 0\n", "[bucket_leases] ttl: must be a positive number"),
        (
            "[bucket_leases]\nttl = 0.5\n",
            "[bucket_leases] ttl: must be from 1 to 86400 seconds (a day), not 0.5",
        ),
        # Past a day: a third of it in milliseconds (the claims' lock_timeout) soon
        # leaves PostgreSQL's range, and then a timedelta's.
        (
            "[bucket_leases]\nttl = 1e7\n",
            "[bucket_leases] ttl: must be from 1 to 86400 seconds (a day), not 1e+07",
        ),
        (
            "[bucket_leases]\nttl = 1e14\n",
            "[bucket_leases] ttl: must be from 1 to 86400 seconds (a day), not 1e+14",
        ),
        ("[database]\nurl = 'mysql://h/db'\n", "[database] url: PostgreSQL (psycopg 3)"),
        ("[database]\nschema = 's'\n", "[database] schema: a schema needs PostgreSQL"),
        (
            "[database]\nlocks = 'table'\n",
            '[database] locks: must be one of advisory, rows, not "table"',
        ),
        ("[database]\nurl = 5\n", "[database] url: must be a non-empty string, not 5"),
        (
            (
                f"{HEAD}[[bindings]]\nid='b'\nsource='s'\nmatch='true'\nkey='k'\ndocument='hits'"
                "\nevent='e'\nbatch=1\n"
            ),
            "[bindings #2 \"b\"] batch: not taken by mode 'each'",
        ),
        (
            (
                f"{HEAD}[[bindings]]\nid='b'\nsource='s'\nmatch='(('\nkey='k'\ndocument='hits'"
                "\nevent='e'\n"
            ),
            '[bindings #2 "b"] match: does not compile',
        ),
        (
            (
                'charts = "charts"\n[[bindings]]\nid="b"\nsource="s"\nmatch="true"\nkey="k"\n'
                'document="nowhere"\nevent="e"\n'
            ),
            '[bindings #1 "b"] document: no chart for document "nowhere"',
        ),
        (SENDING + ROUTED, '[routes.r] queue: no [sinks.q] drains queue "q"'),
        (
            HEAD + '[routes.r]\nqueue = "q"\n[sinks.q]\ncall = "m:f"\n',
            "send_type: routes need a send_type: the type whose targets name them",
        ),
        (
            'send_type = "basichttp"\n' + HEAD,
            "send_type: send_type 'basichttp' is a built-in send type",
        ),
        (
            'on_complete = "done"\n' + SENDING + ROUTED + '[sinks.q]\ncall = "m:f"\n',
            "on_complete: on_complete names 'done', which is not a route",
        ),
        (
            "[outbox]\nbackoff_factor = 0.5\n",
            "[outbox] backoff_factor: a backoff's factor must be at least 1, not 0.5",
        ),
        (HEAD + '[sinks.q]\ncall = "m:f"\n', "[sinks.q] no route writes to this queue"),
        (
            SENDING + ROUTED + '[sinks.q]\ncall = "m:f"\nurl = "http://x"\n',
            "[sinks.q] url: give url (an HTTP POST sink) or call (a Python callable)",
        ),
        (
            SENDING + ROUTED + '[sinks.q]\ncall = "not a path"\n',
            "[sinks.q] call: must be 'package.module:function'",
        ),
        (
            SENDING + ROUTED + '[sinks.q]\nurl = "ftp://x"\n',
            "[sinks.q] url: must be an http:// or https:// URL",
        ),
        (
            SENDING + ROUTED + '[sinks.q]\nurl = "http://x"\ntimeout = 54\n',
            (
                "[sinks.q] timeout: must be shorter than nine tenths of the outbox lease "
                "(54 of 60 seconds)"
            ),
        ),
        (
            SENDING + ROUTED + '[sinks.q]\ncall = "m:f"\non_complete = "x"\n',
            "[sinks.q] on_complete: unknown key",
        ),
        (
            HEAD + '[fronts.webhook.w]\npath = "/w"\nsource = "nobody"\nscope = "s"\n',
            '[fronts.webhook.w] source: no enabled binding reads source "nobody"',
        ),
        (
            HEAD + '[fronts.webhook.w]\npath = "/healthz"\nsource = "clicks"\nscope = "s"\n',
            '[fronts.webhook.w] path: "/healthz" overlaps the health endpoints',
        ),
        (
            HEAD + WEBHOOK + '[fronts.form.f]\npath = "/w/f"\nsource = "clicks"\nscope = "s"\n',
            '[fronts.form.f] path: "/w/f" overlaps [fronts.webhook.w] ("/w")',
        ),
        (
            HEAD + '[fronts.webhook.w]\npath = "w"\nsource = "clicks"\nscope = "s"\n',
            '[fronts.webhook.w] path: must be an absolute path such as "/hooks/x", not "w"',
        ),
        (
            HEAD + WEBHOOK + "[fronts.webhook.w.hmac]\n",
            "[fronts.webhook.w.hmac] secret_env: required",
        ),
        (
            HEAD + WEBHOOK + '[fronts.webhook.w.hmac]\nsecret_env = "NOT_SET_ANYWHERE"\n',
            (
                "[fronts.webhook.w.hmac] secret_env: the environment variable NOT_SET_ANYWHERE"
                " is not set"
            ),
        ),
        (
            HEAD + '[fronts.basichttp.a]\npath = "/a"\nbase_url = "https://x/a"\n'
            '[fronts.basichttp.b]\npath = "/b"\nbase_url = "https://x/b"\n',
            "[fronts] basichttp: at most one BasicHTTP front",
        ),
        (
            HEAD + '[http]\naccess_log = true\n[fronts.basichttp.a]\npath = "/a"\n'
            'base_url = "https://x/a"\n',
            "[http] access_log: would log the tokens of [fronts.basichttp.a]",
        ),
        (HEAD + '[fronts.grpc.g]\npath = "/g"\n', "[fronts] grpc: unknown key"),
        (
            HEAD + '[sources.clicks]\nkind = "mqtt"\n',
            '[sources.clicks] kind: must be one of kafka, nats, table, not "mqtt"',
        ),
        (
            HEAD + '[sources.clicks]\nkind = "nats"\nscope = "s"\nstream = "S"\n',
            "[sources.clicks] servers: give servers (a list of URLs) or servers_env",
        ),
        (
            HEAD + '[sources.clicks]\nkind = "nats"\nscope = "s"\nservers = ["nats://h"]\n'
            'stream = "S"\nsubject_prefix = "c"\npartitions = []\n',
            "[sources.clicks] partitions: must be a list of 1 to 1000 non-empty strings",
        ),
        (
            HEAD + '[sources.other]\nkind = "table"\npartitions = ["0"]\nscope = "s"\n',
            "[sources.other] scope: unknown key",
        ),
        (
            HEAD + '[sources.other]\nkind = "table"\npartitions = ["0"]\n'
            "[sources.other.consumer]\nlanes = 0\n",
            "[sources.other.consumer] lanes: must be an integer from 1 to 1024, not 0",
        ),
        ("[errors]\ndefault = 'sometimes'\n", "[errors] default: must be one of continue, fail"),
        (
            "[errors.documents]\nghost = 'fail'\n",
            "[errors.documents] ghost: document_on_error names 'ghost', which has no chart",
        ),
        (f"{HEAD}[errors.documents]\nhits = 'never'\n", "[errors.documents] hits: must be one"),
        ("[errors]\nfail = true\n", "[errors] fail: unknown key"),
        ("charts = 'missing'\n", 'charts: "missing" is not a directory'),
        ("[documents]\nx = 'charts/none.scxml'\n", "[documents] x: cannot read"),
        ("bindings = 'none.toml'\n", "bindings: cannot read"),
    ],
)
def test_refusals_name_the_table_and_the_key(tmp_path: Path, body: str, said: str) -> None:
    assert refused(tmp_path, body).startswith(said)


@pytest.mark.parametrize(
    ("section", "worker", "undone"),
    [
        ("timers", "timer", "their timers would never fire"),
        ("flow", "flow", "the events and creates held for them would never be delivered"),
        (
            "reapers",
            "reaper",
            "their dedupe claims, ledger rows and addresses would never be reaped",
        ),
    ],
)
def test_bucket_leases_are_refused_beside_a_worker_of_the_slices_turned_off(
    tmp_path: Path, section: str, worker: str, undone: str
) -> None:
    # The other services leave the slices a service leases to it: one that runs no
    # timer worker would lease slices whose timers nobody fires, while every
    # service says it is ready.
    body = f"[bucket_leases]\nenabled = true\n[{section}]\nenabled = false\n"
    assert refused(tmp_path, body) == (
        f"[bucket_leases] enabled: refused beside [{section}] enabled = false: the other "
        f"services leave the slices this one leases to its own workers, and it runs no "
        f"{worker} worker, so {undone}; enable [{section}] in every service that leases, "
        "or leave [bucket_leases] off in this one"
    )
    # Without bucket leases, the worker may run in another process.
    config = write_config(tmp_path, f"[{section}]\nenabled = false\n", {"hits": HITS})
    assert not getattr(load(config, {}), section).enabled


@pytest.mark.asyncio
async def test_the_errors_table_sets_the_policy_per_document(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        f"{HEAD}[errors]\ndefault = 'fail'\n[errors.documents]\nhits = 'continue'\n",
        {"hits": HITS, "order": ORDER},
    )
    settings = load(path, {})
    assert (settings.errors.default, dict(settings.errors.documents)) == (
        "fail",
        {"hits": "continue"},
    )
    async with SqlAdapter("sqlite://") as adapter:
        config = router_config(settings, adapter)
        policy = error_policy_of(config.on_error, config.document_on_error, config.resolver)
        hits = (await config.resolve("s", "hits")).machine.identity.content_hash
        order = (await config.resolve("s", "order")).machine.identity.content_hash
        assert (policy.of(hits).value, policy.of(order).value) == ("continue", "fail")
        assert config.timers_elsewhere is True


@pytest.mark.asyncio
async def test_a_delivery_that_schedules_a_timer_warns_of_no_missing_timer_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The service's timer workers are supervised (one restarting after its store went
    # away) or, with bucket leases, run where a slice is held (maybe in another
    # service): a delivery meanwhile must not say that no timer worker runs.
    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrations.upgrade(url)
    body = (
        f'charts = "charts"\nsend_type = "test:route"\n{ORDER_BINDING}\n'
        f'[database]\nurl = "{url}"\n[routes.finished]\nqueue = "finished"\n'
        '[sinks.finished]\ncall = "tests.service.recording:record"\n'
        "[bucket_leases]\nenabled = true\n"
    )
    settings = load(write_config(tmp_path, body, {"order": ORDER}), {})
    async with SqlAdapter(url) as adapter:
        router = Router(router_config(settings, adapter))
        event = InboundEvent(scope="s", source="shop", message_id="o1", data={"order": "o1"})
        with caplog.at_level("WARNING", logger="statifier.router.routing"):
            routed = await router.route(event)
    assert [o.outcome for o in routed.outcomes] == ["created_and_delivered"]
    assert routed.notices == ()
    assert "no timer worker" not in caplog.text


FORM = '[fronts.form.f]\npath = "/f"\nsource = "clicks"\nscope = "s"\n'


def test_group_commit_ms_is_the_fronts_window_in_seconds(tmp_path: Path) -> None:
    body = HEAD + WEBHOOK + "group_commit_ms = 2\n" + FORM + "group_commit_ms = 0.5\n"
    settings = load(write_config(tmp_path, body, {"hits": HITS}), {})
    webhook, form = settings.fronts
    assert isinstance(webhook, WebhookFront)
    assert isinstance(form, FormFront)
    assert (webhook.group_commit, form.group_commit) == (0.002, 0.0005)
    (alone,) = load(write_config(tmp_path, HEAD + WEBHOOK, {"hits": HITS}), {}).fronts
    assert isinstance(alone, WebhookFront)
    assert alone.group_commit is None  # each post routed alone


@pytest.mark.parametrize(
    ("table", "value", "said"),
    [
        (WEBHOOK, "0", "must be a number of milliseconds over 0 and at most 1000, not 0"),
        (WEBHOOK, "-2", "must be a number of milliseconds over 0 and at most 1000, not -2"),
        (FORM, "1000.5", "must be a number of milliseconds over 0 and at most 1000, not 1000.5"),
        (FORM, "nan", "must be a number of milliseconds over 0 and at most 1000, not nan"),
        (WEBHOOK, "true", "must be a number of milliseconds over 0 and at most 1000, not true"),
        (WEBHOOK, '"2"', 'must be a number of milliseconds over 0 and at most 1000, not "2"'),
        (FORM, "500\ntimeout = 0.5", "must be shorter than timeout (0.5 seconds)"),
    ],
)
def test_group_commit_ms_out_of_range_is_refused(
    tmp_path: Path, table: str, value: str, said: str
) -> None:
    name = "[fronts.webhook.w]" if table == WEBHOOK else "[fronts.form.f]"
    assert refused(tmp_path, f"{HEAD}{table}group_commit_ms = {value}\n") == (
        f"{name} group_commit_ms: {said}"
    )


def test_a_file_over_the_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    body = "# " + "x" * MAX_CONFIG_BYTES + "\n"
    assert refused(tmp_path, body).endswith(f"is larger than {MAX_CONFIG_BYTES} bytes")


def test_a_file_that_is_not_toml_is_refused(tmp_path: Path) -> None:
    assert refused(tmp_path, "migrate = \n").startswith("not valid TOML: ")


@pytest.mark.parametrize(
    "body",
    [
        "x = " + "[" * 20000 + "]" * 20000 + "\n",
        "[http]\nport = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n",
    ],
    ids=["array", "inline_table"],
)
def test_a_file_nested_too_deeply_is_refused_as_not_toml(tmp_path: Path, body: str) -> None:
    assert refused(tmp_path, body) == "not valid TOML: nested too deeply"


def test_an_integer_too_long_to_read_or_show_is_refused_naming_its_key(tmp_path: Path) -> None:
    # Past the interpreter's limit of digits, a decimal integer cannot be read at all.
    said = refused(tmp_path, "[http]\nport = " + "9" * 5000 + "\n")
    assert said == "not valid TOML: an integer has more than 4300 digits"
    # A hexadecimal one is read, and too long to write in decimal: it is named.
    huge = "[http]\nport = 0x" + "f" * 5000 + "\n"
    assert refused(tmp_path, huge) == (
        "[http] port: must be an integer from 0 to 65535, not a very large integer"
    )
    # Seconds past the largest float are refused, not an OverflowError.
    for digits in ("9" * 400, "0x" + "f" * 5000):
        assert refused(tmp_path, f"shutdown_timeout = {digits}\n") == (
            "shutdown_timeout: must be a positive number of seconds, not a very large integer"
        )
    # Up to 40 digits, it is shown as written.
    assert refused(tmp_path, "[http]\nport = " + "9" * 40 + "\n") == (
        f"[http] port: must be an integer from 0 to 65535, not {'9' * 40}"
    )


def test_a_database_url_and_secrets_never_show_in_a_refusal(tmp_path: Path) -> None:
    password = "pw-91c4"
    said = refused(
        tmp_path,
        '[database]\nurl_env = "TEST_URL"\n',
        {"TEST_URL": f"mysql://admin:{password}@db.internal/app"},
    )
    assert said == (
        "[database] url_env: PostgreSQL (psycopg 3) and SQLite (sqlite3) are supported, not 'mysql'"
    )
    assert password not in said
    assert "db.internal" not in said
    said = refused(tmp_path, '[database]\nurl = "not a url pw-91c4"\n')
    assert said == "[database] url: is not a database URL"
    # A secret read before a later refusal is not in it either.
    body = HEAD + WEBHOOK + '[fronts.webhook.w.hmac]\nsecret_env = "S"\nencoding = "rot13"\n'
    said = refused(tmp_path, body, {"S": "hmac-secret-value"})
    assert said == '[fronts.webhook.w.hmac] encoding: must be hex or base64, not "rot13"'


# The database at start.


def served_on(tmp_path: Path, database: FreshDatabase, *, migrate: bool) -> Path:
    body = f"migrate = {'true' if migrate else 'false'}\n{database_table(database)}"
    return write_config(tmp_path, body)


def test_a_database_that_is_not_migrated_is_refused_unless_the_file_migrates(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    options = TableOptions(prefix="t_", schema=fresh_database.schema)
    refusing = load(served_on(tmp_path, fresh_database, migrate=False))
    with pytest.raises(NotMigrated, match=r"t_\* tables are not there.*statifier db upgrade"):
        prepare_database(refusing)
    migrations.upgrade(fresh_database.url, options, "statifier_0002")
    with pytest.raises(NotMigrated, match="at revision statifier_0002"):
        prepare_database(refusing)
    prepare_database(load(served_on(tmp_path, fresh_database, migrate=True)))
    prepare_database(refusing)  # at the head now: accepted as it is
    assert migrations.current(fresh_database.url, options) is not None


@pytest.mark.asyncio
async def test_the_route_of_a_loaded_file_writes_outbox_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'routes.db'}"
    body = (
        f'migrate = true\n{SENDING}[database]\nurl = "{url}"\n'
        '[routes.r]\nqueue = "q"\n[sinks.q]\ncall = "tests.service.recording:record"\n'
    )
    settings = load(write_config(tmp_path, body, {"hits": HITS}))
    prepare_database(settings)
    async with SqlAdapter(url) as adapter:
        config = router_config(settings, adapter)
        router = Router(config)
        found = config.route("any", "r")
        assert found is not None
        key = IdempotencyKey(
            "ex_1", send_id="s", macrostep=1, microstep=1, round=0, content_index=1, ordinal=0
        )
        async with router.transaction() as unit:
            assert await awaited(found[0].deliver(found[1], Event("e"), key, unit.tx, None)) is None
        rows = await OutboxDrain(router.storage, {}).pending()
        assert [(row.queue, row.key) for row in rows] == [("q", str(key))]


@pytest.mark.asyncio
async def test_readiness_names_a_database_that_does_not_answer_and_a_part_in_trouble() -> None:
    from statifier.service.health import Health

    async with SqlAdapter("postgresql://statifier:pw-5d1e@127.0.0.1:1/none") as adapter:
        health = Health(adapter, probe_timeout=1.0)
        health.watch("timers", lambda: "restarting after OperationalError")
        health.watch("outbox", lambda: None)
        reasons = await health.reasons()
    assert reasons[1:] == ["timers: restarting after OperationalError"]
    assert reasons[0].startswith("database: ")
    assert "pw-5d1e" not in reasons[0]
    assert "127.0.0.1" not in reasons[0]


@pytest.mark.asyncio
async def test_a_database_failing_the_probe_is_logged_when_it_starts_and_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from statifier.service import health as health_module
    from statifier.service.health import Health
    from statifier.sql.dialect import ping as real_ping

    down = [True]

    async def ping(dialect: Any, driver: Any) -> None:
        if down:
            raise ConnectionError("server closed the connection unexpectedly")
        await real_ping(dialect, driver)

    monkeypatch.setattr(health_module, "ping", ping)
    url = f"sqlite:///{tmp_path / 'probe.db'}"
    migrations.upgrade(url)
    async with SqlAdapter(url) as adapter:
        health = Health(adapter, probe_interval=0.0)
        for _ in range(3):
            assert await health.reasons() == ["database: ConnectionError"]
        down.clear()
        assert await health.reasons() == []
        assert await health.reasons() == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith("health")]
    failing = (
        "store 0: the database fails the readiness probe: ConnectionError: server closed "
        "the connection unexpectedly; the service is not ready until it answers"
    )
    assert said == [("ERROR", failing), ("WARNING", "store 0: the database answers again")]


@pytest.mark.asyncio
async def test_a_failing_worker_is_reported_and_started_again() -> None:
    import asyncio

    from statifier.service.service import Supervised

    stop = asyncio.Event()
    runs: list[int] = []

    async def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise ConnectionError("the database went away")
        await stop.wait()

    part = Supervised("timers", work, stop, first_restart=0.5)
    assert part.trouble() == "not running"
    part.start()
    await asyncio.sleep(0.1)
    assert part.trouble() == "restarting after ConnectionError"
    async with asyncio.timeout(10):  # first_restart later, it runs again
        while len(runs) < 2:  # noqa: ASYNC110 - polls the part's runs
            await asyncio.sleep(0.01)
    assert (runs, part.trouble()) == ([0, 1], None)
    stop.set()
    assert part.task is not None
    await asyncio.wait_for(part.task, 5)
    assert part.trouble() == "not running"


def test_the_kafka_example_is_a_valid_configuration() -> None:
    example = Path(__file__).parents[2] / "examples" / "kafka_join" / "statifier.toml"
    environ = {"DATABASE_URL": "postgresql://app@db/ads", "KAFKA_BROKERS": "kafka:9092"}
    settings = load(example, environ)
    (source,) = settings.sources
    assert (source.name, source.kind, source.scope) == ("ad_events", "kafka", "ads")
    assert settings.migrate
    assert {front.path for front in settings.fronts} == set()


# Observability.


def test_logging_and_otel_default_to_text_at_info_without_bridges(tmp_path: Path) -> None:
    settings = load(write_config(tmp_path, ""), {})
    assert settings.logging == LoggingSettings(format="text", level="info", events=False)
    assert settings.otel == OtelSettings(enabled=False)
    body = '[logging]\nformat = "json"\nlevel = "warning"\nevents = true\n[otel]\nenabled = true\n'
    settings = load(write_config(tmp_path, body), {})
    assert settings.logging == LoggingSettings(format="json", level="warning", events=True)
    assert settings.otel == OtelSettings(enabled=True)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("[logging]\nformat = 'xml'\n", '[logging] format: must be one of text, json, not "xml"'),
        ("[logging]\nformat = 1\n", "[logging] format: must be one of text, json, not 1"),
        (
            "[logging]\nlevel = 'INFO'\n",
            '[logging] level: must be one of debug, info, warning, error, not "INFO"',
        ),
        ("[logging]\nevents = 'yes'\n", '[logging] events: must be true or false, not "yes"'),
        ("[logging]\nfile = 'x.log'\n", "[logging] file: unknown key"),
        ("logging = 'json'\n", 'logging: must be a table, not "json"'),
        ("[otel]\nenabled = 1\n", "[otel] enabled: must be true or false, not 1"),
        ("[otel]\nendpoint = 'http://collector:4317'\n", "[otel] endpoint: unknown key"),
    ],
)
def test_logging_and_otel_refusals_name_the_table_and_the_key(
    tmp_path: Path, body: str, said: str
) -> None:
    assert refused(tmp_path, body) == said


def _mark(database: FreshDatabase, options: TableOptions, place: Any) -> None:
    """Make ``place`` (a :class:`statifier.sql.places.Place`) the store's record, as
    ``statifier serve`` and ``statifier reshard`` write it."""
    from datetime import UTC, datetime

    import sqlalchemy as sa

    from statifier.sql.places import write_place

    engine = sa.create_engine(migrations.sync_url(database.url))
    try:
        with engine.begin() as connection:
            write_place(connection, options, place, datetime.now(UTC))
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_readiness_names_a_store_whose_place_record_changed_until_it_is_back(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    from statifier.service.health import Health
    from statifier.sql.places import Place

    options = TableOptions(prefix="t_", schema=fresh_database.schema)
    migrations.upgrade(fresh_database.url, options)

    def mark(place: Place) -> None:
        _mark(fresh_database, options, place)

    mark(Place.serving(0, 1))
    async with SqlAdapter(fresh_database.url, options) as adapter:
        health = Health(adapter, places=[Place.serving(0, 1)], probe_interval=0.0)
        assert await health.reasons() == []
        mark(Place(0, 1, "moving"))  # what a reshard does first
        assert await health.reasons() == ["database: statifier reshard is moving its buckets"]
        mark(Place.serving(0, 2))
        assert await health.reasons() == ["database: it holds place 0 of 2, not 0 of 1"]
        mark(Place.serving(0, 1))
        assert await health.reasons() == []
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith("health")]
    start = "store 0 is not the store this service was started on: "
    end = "; the service is not ready until it is"
    assert said == [
        ("ERROR", f"{start}statifier reshard is moving its buckets{end}"),
        ("ERROR", f"{start}it holds place 0 of 2, not 0 of 1{end}"),
        ("WARNING", "store 0 holds its place again"),
    ]


@pytest.mark.asyncio
async def test_the_services_check_of_its_places_says_it_serves_stops_on_a_mark_and_warns_on_failure(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    from datetime import UTC, datetime

    import sqlalchemy as sa

    from statifier.repeats import Repeats
    from statifier.service.service import check_places
    from statifier.sql.places import Place, serving_since

    options = TableOptions(prefix="t_", schema=fresh_database.schema)
    migrations.upgrade(fresh_database.url, options)
    engine = sa.create_engine(migrations.sync_url(fresh_database.url))

    def seen() -> float | None:
        with engine.begin() as connection:
            return serving_since(connection, options, datetime.now(UTC))

    def mark(place: Place) -> None:
        _mark(fresh_database, options, place)

    try:
        mark(Place.serving(0, 1))
        assert seen() is None  # no service said it serves the store yet
        repeats = Repeats()
        async with SqlAdapter(fresh_database.url, options) as adapter:
            stores = [(adapter, Place.serving(0, 1))]
            assert await check_places(stores, repeats) is None
            ago = seen()
            assert ago is not None  # what statifier reshard refuses on
            assert 0 <= ago < 2
            mark(Place(0, 1, "moving"))
            said = await check_places(stores, repeats)
            assert said == "the database: statifier reshard is moving its buckets"
            with engine.begin() as connection:
                connection.execute(sa.text(f"DROP TABLE {adapter.tables.store_place.fullname}"))
            for _ in range(3):  # failing: logged once, never taken for a mark
                assert await check_places(stores, repeats) is None
    finally:
        engine.dispose()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "store 0: checking its place failed (statifier reshard cannot see this service meanwhile): "
    )


def test_a_bindings_file_toml_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "deep.toml").write_text("x = " + "[" * 20000 + "]" * 20000 + "\n")
    said = refused(tmp_path, 'charts = "charts"\nbindings = "deep.toml"\n')
    assert said == f"bindings: {tmp_path / 'deep.toml'}: not valid TOML: nested too deeply"
