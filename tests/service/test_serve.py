"""``statifier serve`` as a real process: a webhook front under load stops on SIGTERM
or SIGINT within its bound and exits 0 having lost nothing it answered 200, on SQLite
and on PostgreSQL, and a stop cut short by the bound exits 1 in time; two services on
one PostgreSQL share the inbound-events table's partitions, the timers and the outbox,
and the one left keeps consuming, firing and draining after the other is SIGKILLed.
In-process: the health endpoints and the table source's consumer, a webhook with group
commit, the HTTP sink's header and statuses, and the command's refusals."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.child_processes import signal_child
from tests.persistence.conftest import FreshDatabase, fresh_database  # noqa: F401 - a fixture
from tests.service.helpers import (
    HITS,
    HITS_BINDING,
    ORDER,
    ORDER_BINDING,
    Served,
    database_table,
    start_serve,
    write_config,
)

from statifier.cli import main
from statifier.core import Event
from statifier.fronts.table_source import append_events
from statifier.persistence.sql import SqlAdapter
from statifier.router import (
    DeadLetter,
    InboundEvent,
    OutboxDrain,
    OutboxMessage,
    Router,
    TimerWorker,
    ledger,
)
from statifier.service import Service, load
from statifier.service.settings import HttpSink, ServiceSettings
from statifier.service.sinks import IDEMPOTENCY_HEADER, HttpPostSink, SinkFailed, body_of
from statifier.service.wiring import router_config
from statifier.sql import TableOptions

SHUTDOWN_TIMEOUT = 8.0
"""The services' ``shutdown_timeout``; a stop must end within it (plus start-up of
the interpreter's exit)."""
EXIT_SLACK = 3.0


def options_of(database: FreshDatabase, settings: ServiceSettings) -> TableOptions:
    return TableOptions(prefix="t_", schema=database.schema, locks=settings.database.locks)


@contextlib.asynccontextmanager
async def router_on(
    config_path: Path, database: FreshDatabase
) -> Any:  # an async iterator of Router
    """The router of the configuration the file names, over an adapter of the test's own."""
    settings = load(config_path)
    adapter = SqlAdapter(database.url, options_of(database, settings))
    try:
        yield Router(router_config(settings, adapter))
    finally:
        await adapter.close()


# SIGTERM under load.


@dataclass
class Load:
    """Posts to a webhook from several clients until the service stops answering."""

    url: str
    answered: dict[str, int] = field(default_factory=dict)
    """message id -> the status answered."""
    unanswered: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, number: int) -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            sent = 0
            while not self.stop.is_set():
                message_id = f"c{number}-{sent}"
                sent += 1
                body = {"key": f"k{sent % 7}", "n": sent}
                try:
                    answer = await client.post(
                        f"{self.url}/hooks/clicks", json=body, headers={"X-Event-Id": message_id}
                    )
                except httpx.HTTPError:
                    self.unanswered += 1
                    await asyncio.sleep(0.01)
                    continue
                self.answered[message_id] = answer.status_code


def webhook_config(directory: Path, database: FreshDatabase, extra: str = "") -> Path:
    """A service file with one webhook front; ``extra`` is appended to its table."""
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{HITS_BINDING}
{database_table(database)}
[http]
port = 0

[fronts.webhook.clicks]
path = "/hooks/clicks"
source = "clicks"
scope = "web"
provider_id_header = "X-Event-Id"
{extra}"""
    return write_config(directory, body, {"hits": HITS})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.asyncio
async def test_a_signal_under_load_exits_0_in_bound_and_every_200_was_delivered(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
    signum: signal.Signals,
) -> None:
    config = webhook_config(tmp_path, fresh_database)
    served = await start_serve(config, tmp_path / "serve.log")
    assert served.url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
    load = Load(served.url)
    clients = [asyncio.create_task(load.client(n)) for n in range(6)]
    try:
        while len(load.answered) < 60:
            await asyncio.sleep(0.05)
            assert served.process.returncode is None, served.stderr()
        sent_at = time.monotonic()
        served.signal(signum)
        status = await served.wait(SHUTDOWN_TIMEOUT + EXIT_SLACK)
        took = time.monotonic() - sent_at
    finally:
        load.stop.set()
        await asyncio.gather(*clients)
    assert status == 0, served.stderr()
    print(f"stopped in {took:.2f} s; {len(load.answered)} answered")
    assert took < SHUTDOWN_TIMEOUT + EXIT_SLACK
    assert "stopping: intake first" in served.stderr()
    ok = {message_id for message_id, code in load.answered.items() if code == 200}
    assert set(load.answered.values()) == {200}, load.answered  # nothing refused under load
    async with router_on(config, fresh_database) as router:
        rows = await ledger(router)
    delivered = {row.message_id for row in rows if row.spelled.endswith("delivered")}
    assert ok <= delivered, sorted(ok - delivered)[:5]
    assert len(ok) >= 60


# Two services on one PostgreSQL.


def order_config(
    directory: Path,
    database: FreshDatabase | str,
    locks: str = "advisory",
    *,
    bucket_leases: bool = False,
) -> Path:
    """The orders' service: the table source, the timers, the outbox to the recording
    sink, with short leases; over ``database``, or the ``[database]`` table given; with
    ``bucket_leases``, the workers over the buckets leased."""
    table = database if isinstance(database, str) else database_table(database)
    leases = "[bucket_leases]\nenabled = true\nttl = 2\n" if bucket_leases else ""
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
send_type = "test:route"
{ORDER_BINDING}
{table}locks = "{locks}"
[http]
port = 0

[routes.finished]
queue = "finished"

[sinks.finished]
call = "tests.service.recording:record"

[timers]
batch = 2
poll = 0.1

[outbox]
batch = 2
idle = 0.05
lease = 2

[reapers]
interval = 1

[sources.inbound]
kind = "table"
partitions = ["0", "1", "2", "3"]
lease_ttl = 2

[sources.inbound.consumer]
commit_interval = 0.05

{leases}"""
    return write_config(directory, body, {"order": ORDER})


def recorded(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


@pytest.fixture
def postgresql_database(
    database_url: str, request: pytest.FixtureRequest
) -> Iterator[FreshDatabase]:
    """A fresh PostgreSQL schema (dropped afterwards)."""
    from tests.persistence.conftest import drop_schema, unique_name

    schema = unique_name("statifier_serve_")
    try:
        yield FreshDatabase("postgresql", database_url, schema)
    finally:
        drop_schema(database_url, schema)


ORDERS = 60


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("locks", "bucket_leases"), [("advisory", False), ("rows", False), ("advisory", True)]
)
async def test_two_services_share_the_work_and_one_survives_the_others_sigkill(
    postgresql_database: FreshDatabase, tmp_path: Path, locks: str, bucket_leases: bool
) -> None:
    # Both ways of locking: the lease claims, the fenced commits, the appends, the
    # timer claims and the steps all lock, and the services' reapers reap lock rows.
    # With bucket leases, each service fires and drains its slices' timers and rows,
    # and the survivor takes the killed one's slices once their leases ran out.
    database = postgresql_database
    config = order_config(tmp_path, database, locks, bucket_leases=bucket_leases)
    record = tmp_path / "record.jsonl"
    first = await start_serve(config, tmp_path / "first.log", record)
    second = await start_serve(config, tmp_path / "second.log", record)
    try:
        async with router_on(config, database) as router:
            # Orders placed in the inbound-events table over three seconds (both
            # services consume its partitions), each finished by its timer a second
            # later: the kill lands while both consume, fire and drain, once the one
            # killed has drained some.
            killed_at = None
            for n in range(ORDERS):
                event = InboundEvent(
                    scope="shop", source="shop", message_id=f"o{n}", data={"order": f"o{n}"}
                )
                await append_events(router.adapter, [event], partition=str(n % 4))
                await asyncio.sleep(0.05)
                if killed_at is None and n >= ORDERS // 2 and _drained_by(record, first):
                    signal_child(first.process)
                    killed_at = time.monotonic()
            deadline = time.monotonic() + 30
            while killed_at is None:
                assert time.monotonic() < deadline, "the first service drained nothing"
                await asyncio.sleep(0.05)
                if _drained_by(record, first):
                    signal_child(first.process)
                    killed_at = time.monotonic()
            assert killed_at is not None
            assert await first.wait(10) == -signal.SIGKILL
            deadline = time.monotonic() + 30
            while len({line["order"] for line in recorded(record)}) < ORDERS:
                assert time.monotonic() < deadline, recorded(record)
                assert second.process.returncode is None, second.stderr()
                await asyncio.sleep(0.1)
            await _until_settled(router)
        second.signal(signal.SIGTERM)
        assert await second.wait(SHUTDOWN_TIMEOUT + EXIT_SLACK) == 0, second.stderr()
    finally:
        for served in (first, second):
            if served.process.returncode is None:
                signal_child(served.process)
                await served.process.wait()
    lines = recorded(record)
    assert {line["order"] for line in lines} == {f"o{n}" for n in range(ORDERS)}
    pids = {line["pid"] for line in lines}
    assert pids == {first.process.pid, second.process.pid}  # both did their share
    after = [line for line in lines if line["at"] > killed_at]
    assert after, "the survivor drained nothing after the kill"
    assert {line["pid"] for line in after} == {second.process.pid}
    if bucket_leases:
        assert "workers: buckets 0-1024" in second.stderr()  # the killed one's slices
    # A row the killed service had leased may have reached its sink before the kill
    # and again after the lease ran out: at least once, under one key.
    by_key: dict[str, set[str]] = {}
    for line in lines:
        by_key.setdefault(line["order"], set()).add(line["key"])
    assert all(len(keys) == 1 for keys in by_key.values()), by_key


def _drained_by(record: Path, served: Served) -> bool:
    return any(line["pid"] == served.process.pid for line in recorded(record))


async def _until_settled(router: Router) -> None:
    """Wait until no timer and no outbox row is pending."""
    drain = OutboxDrain(router.storage, {})
    timers = TimerWorker(router)
    deadline = time.monotonic() + 30
    while await drain.pending() or await timers.next_due() is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


# In-process.


@pytest.mark.asyncio
async def test_health_and_the_table_source_in_process(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    body = f"""
migrate = true
shutdown_timeout = {SHUTDOWN_TIMEOUT}
charts = "charts"
{HITS_BINDING}
{database_table(fresh_database)}
[http]
port = 0

[sources.inbound]
kind = "table"
partitions = ["0", "1"]

[sources.inbound.consumer]
commit_interval = 0.05
"""
    config = write_config(tmp_path, body, {"hits": HITS})
    service = Service(load(config), io.StringIO())
    running = asyncio.create_task(service.run())
    async with httpx.AsyncClient(timeout=5.0) as client:
        while service.address is None:
            assert not running.done(), running
            await asyncio.sleep(0.02)
        base = f"http://{service.address[0]}:{service.address[1]}"
        assert (await client.get(f"{base}/healthz")).json() == {"status": "ok"}
        ready = await _ready(client, base)
        assert ready == {"status": "ready"}
        async with router_on(config, fresh_database) as router:
            events = [
                InboundEvent(scope="web", source="clicks", message_id=f"t{n}", data={"key": "k"})
                for n in range(5)
            ]
            await append_events(router.adapter, events, partition="0")
            deadline = time.monotonic() + 20
            while len(await ledger(router)) < 5:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            rows = await ledger(router)
        assert sorted(str(row.message_id) for row in rows) == [f"t{n}" for n in range(5)]
        service.stop()
        assert await asyncio.wait_for(running, SHUTDOWN_TIMEOUT + EXIT_SLACK) == 0


@pytest.mark.asyncio
async def test_a_webhook_with_group_commit_in_process(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches: list[int] = []
    route_many = Router.route_many

    async def counted(self: Router, events: Any, **options: Any) -> Any:
        batches.append(len(events))
        return await route_many(self, events, **options)

    monkeypatch.setattr(Router, "route_many", counted)
    config = webhook_config(tmp_path, fresh_database, "group_commit_ms = 20\n")
    service = Service(load(config), io.StringIO())
    running = asyncio.create_task(service.run())
    async with httpx.AsyncClient(timeout=5.0) as client:
        while service.address is None:
            assert not running.done(), running
            await asyncio.sleep(0.02)
        url = f"http://{service.address[0]}:{service.address[1]}/hooks/clicks"
        answers = await asyncio.gather(
            *(
                client.post(url, json={"key": f"k{n % 3}"}, headers={"X-Event-Id": f"e{n}"})
                for n in range(30)
            )
        )
    assert [answer.status_code for answer in answers] == [200] * 30
    service.stop()
    assert await asyncio.wait_for(running, SHUTDOWN_TIMEOUT + EXIT_SLACK) == 0
    assert sum(batches) == 30
    assert len(batches) < 30  # the posts shared transactions
    async with router_on(config, fresh_database) as router:
        rows = await ledger(router)
    assert sorted(str(row.message_id) for row in rows) == sorted(f"e{n}" for n in range(30))


async def _ready(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    """``/readyz``'s answer once it is 200 (the consumer starts after the listener)."""
    deadline = time.monotonic() + 20
    while True:
        answer = await client.get(f"{base}/readyz")
        if answer.status_code == 200:
            body: dict[str, Any] = answer.json()
            return body
        assert answer.status_code == 503
        assert time.monotonic() < deadline, answer.json()
        await asyncio.sleep(0.05)


# The HTTP sink.


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    delay: float = 0.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP server on 127.0.0.1 recording each POST and answering the next of
    ``statuses`` (204 once they run out), after ``delay`` seconds."""
    server = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            server.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
            time.sleep(server.delay)
            self.send_response(server.statuses.pop(0) if server.statuses else 204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its name
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/joined?token=x"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def message(attempts: int = 0) -> OutboxMessage:
    event = Event("pair.joined", data={"impression_id": "imp_1", "n": 2})
    return OutboxMessage(
        "joined", "ex_1/%/4/1/0/7/0", event, execution_id="ex_1", attempts=attempts
    )


@pytest.mark.asyncio
async def test_the_http_sink_posts_the_key_and_retries_or_dead_letters_by_status(
    receiver: Receiver,
) -> None:
    sink = HttpPostSink(HttpSink("joined", receiver.url, 1.0, authorization="Bearer s3cret"))
    try:
        await sink(message())
        headers, body = receiver.requests[0]
        assert headers[IDEMPOTENCY_HEADER.lower()] == "ex_1/%/4/1/0/7/0"
        assert headers["authorization"] == "Bearer s3cret"
        assert headers["content-type"] == "application/json"
        assert json.loads(body) == json.loads(body_of(message()))
        assert json.loads(body)["event"] == {
            "name": "pair.joined",
            "data": {"impression_id": "imp_1", "n": 2},
        }
        for status in (500, 503, 429, 408):
            receiver.statuses.append(status)
            with pytest.raises(SinkFailed, match=str(status)) as failed:
                await sink(message(1))
            assert "token" not in str(failed.value)
            assert "s3cret" not in str(failed.value)
        receiver.statuses.append(400)
        with pytest.raises(DeadLetter, match="400"):
            await sink(message(2))
        receiver.delay = 1.5
        with pytest.raises(SinkFailed, match="Timeout"):
            await sink(message(3))
    finally:
        await sink.aclose()


# The command's refusals.


def test_serve_refuses_a_database_that_is_not_migrated(
    fresh_database: FreshDatabase,  # noqa: F811 - the fixture
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    body = f'charts = "charts"\n{HITS_BINDING}\n{database_table(fresh_database)}'
    config = write_config(tmp_path, body, {"hits": HITS})
    assert main(["serve", str(config)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("statifier serve: the database's t_* tables are not there")
    assert "run `statifier db upgrade`" in error
    assert "or set migrate = true" in error


def test_serve_names_the_file_table_and_key_of_a_refused_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = """
[fronts.webhook.carrier]
path = "/hooks/carrier"
source = "carrier"
scope = "depot_7"
max_body = "big"
"""
    config = write_config(tmp_path, body)
    assert main(["serve", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"statifier serve: {config}: [fronts.webhook.carrier] max_body: must be a positive "
        'integer, not "big"\n'
    )


def test_serve_says_when_the_port_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        url = f"sqlite:///{tmp_path / 'taken.db'}"
        body = f'migrate = true\n[database]\nurl = "{url}"\n[http]\nport = {port}\n'
        config = write_config(tmp_path, body)
        assert main(["serve", str(config)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"statifier serve: cannot listen on 127.0.0.1:{port}:")


@pytest.mark.asyncio
async def test_a_stop_cut_short_by_the_bound_exits_1_in_time(tmp_path: Path) -> None:
    database = FreshDatabase("sqlite", f"sqlite:///{tmp_path / 'stall.db'}", None)
    config = order_config(tmp_path, database)
    text = config.read_text(encoding="utf-8")
    text = text.replace(f"shutdown_timeout = {SHUTDOWN_TIMEOUT}", "shutdown_timeout = 1")
    config.write_text(text.replace("recording:record", "recording:stall"), encoding="utf-8")
    record = tmp_path / "record.jsonl"
    served = await start_serve(config, tmp_path / "serve.log", record)
    try:
        async with router_on(config, database) as router:
            event = InboundEvent(scope="shop", source="shop", message_id="o1", data={"order": "o1"})
            await router.route(event)
        deadline = time.monotonic() + 30
        while not recorded(record):  # the sink is called, and hangs
            assert time.monotonic() < deadline, served.stderr()
            await asyncio.sleep(0.05)
        sent_at = time.monotonic()
        served.signal(signal.SIGTERM)
        assert await served.wait(1 + EXIT_SLACK) == 1
        assert time.monotonic() - sent_at < 1 + EXIT_SLACK
    finally:
        if served.process.returncode is None:
            signal_child(served.process)
            await served.process.wait()
    assert "cancelling outbox: it did not stop in time" in served.stderr()
