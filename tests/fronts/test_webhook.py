"""The webhook front on both databases: the message id (the provider's event id, else
the body's hash), 200 for every recorded outcome and 500 for an error, the verifier
before anything is routed (and the HMAC-SHA256 helper), the scope from the host,
every other status (400, 401, 405, 408, 413, 503), concurrent duplicates, a mount in a
host's app and a run through a real server on loopback."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from tests.fronts.http_support import (
    LOADED,
    SCOPE,
    client,
    parcel_router,
    rows_of,
    serving,
    slow_post,
)
from tests.persistence.conftest import postgresql_store, sqlite_store  # noqa: F401 - fixtures
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401 - fixtures

from statifier import telemetry
from statifier.chart import Machine
from statifier.core import Event
from statifier.fronts.verifiers import hmac_sha256
from statifier.fronts.webhook import body_message_id, handle, status, webhook_app
from statifier.persistence import Discarded, Executions, Stepped
from statifier.repeats import IntervalTally
from statifier.router import Binding, Create, Failed, Routed, Router, ledger

SECRET = b"whsec_test_secret"
SCANNED = Binding(
    id="parcels_scanned",
    source="parcel_scans",
    match="event.kind == 'scan'",
    key="event.parcel",
    document="parcel",
    event="scanned",
    data=("at",),
    create=Create.NEVER,
)


@pytest_asyncio.fixture
async def db(router_db: RouterDb) -> RouterDb:  # noqa: F811 - the imported fixture
    """The router's database of each backend."""
    return router_db


def router_of(db: RouterDb, **options: Any) -> Router:
    return parcel_router(db, [LOADED, SCANNED], **options)


def scan(kind: str = "loaded", parcel: str | None = "p1", **more: Any) -> bytes:
    fields: dict[str, Any] = {"kind": kind, **more}
    if parcel is not None:
        fields["parcel"] = parcel
    return json.dumps(fields).encode()


def app_of(router: Router, **options: Any) -> Starlette:
    options.setdefault("source", "parcel_scans")
    options.setdefault("scope", SCOPE)
    return webhook_app(router, **options)


@pytest.mark.asyncio
async def test_the_provider_event_id_is_the_message_id_when_it_sends_one(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router, provider_id_header="x-provider-event-id")) as http:
        first = await http.post("/", content=scan(), headers={"x-provider-event-id": "evt_1"})
        # The provider's retry carries the same id, whatever its body now says.
        retry = await http.post("/", content=scan(at="x"), headers={"x-provider-event-id": "evt_1"})
        hashed = await http.post(
            "/", content=scan(parcel="p2"), headers={"x-provider-event-id": ""}
        )
    assert [a.status_code for a in (first, retry, hashed)] == [200, 200, 200]
    rows = await rows_of(router, "parcels_loaded")
    assert [(row.message_id, row.outcome) for row in rows] == [
        ("evt_1", "created_and_delivered"),
        ("evt_1", "duplicate"),
        (hashlib.sha256(scan(parcel="p2")).hexdigest(), "created_and_delivered"),
    ]
    assert {row.scope for row in rows} == {SCOPE}
    assert {row.source for row in rows} == {"parcel_scans"}


@pytest.mark.asyncio
async def test_without_a_provider_id_the_body_hash_is_the_message_id(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router)) as http:
        first = await http.post("/", content=scan(), headers={"x-provider-event-id": "evt_9"})
        again = await http.post("/", content=scan())
    assert (first.status_code, again.status_code) == (200, 200)
    rows = await rows_of(router, "parcels_loaded")
    assert [row.message_id for row in rows] == [body_message_id(scan())] * 2
    assert [row.outcome for row in rows] == ["created_and_delivered", "duplicate"]
    assert body_message_id(scan()) == hashlib.sha256(scan()).hexdigest()


@pytest.mark.asyncio
async def test_every_recorded_outcome_is_200(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router)) as http:
        answers = [
            await http.post("/", content=scan(kind="weighed")),  # no match
            await http.post("/", content=scan(parcel=None)),  # key refused
            await http.post("/", content=scan(kind="scan", parcel="p404")),  # dropped
            await http.post("/", content=scan()),  # created
            await http.post("/", content=scan()),  # duplicate
            await http.post("/", content=scan(kind="scan", at="gate_3")),  # delivered
        ]
    assert [answer.status_code for answer in answers] == [200] * 6
    outcomes = [(row.binding_id, row.outcome, row.reason) for row in await ledger(router)]
    assert outcomes == [  # the event no binding matched leaves no row
        ("parcels_loaded", "key_refused", outcomes[0][2]),
        ("parcels_scanned", "dropped", "no_execution"),
        ("parcels_loaded", "created_and_delivered", None),
        ("parcels_loaded", "duplicate", None),
        ("parcels_scanned", "delivered", None),
    ]
    assert outcomes[0][2]


@pytest.mark.asyncio
async def test_an_error_is_500_and_leaves_nothing(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    def unresolvable(scope: str, document: str) -> Any:
        raise LookupError("the chart store is down")

    router = router_of(db, resolver=unresolvable)
    body = scan(secret_note="do-not-log-me")
    async with client(app_of(router)) as http:
        answers = [await http.post("/", content=body) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [500] * 3
    assert await ledger(router) == []
    said = [r for r in caplog.records if "routing failed with" in r.getMessage()]
    # One line for one cause within an interval, however many posts it failed.
    assert [(r.levelname, r.getMessage()) for r in said] == [
        ("ERROR", "parcel_scans: routing failed with UnresolvedDocument")
    ]
    assert "do-not-log-me" not in caplog.text


@pytest.mark.asyncio
async def test_handle_and_status_are_the_contract(db: RouterDb) -> None:
    router = router_of(db)
    routed = await handle(
        router, scope=SCOPE, source="parcel_scans", raw_body=scan(), data=json.loads(scan())
    )
    assert isinstance(routed, Routed)
    assert status(routed) == 200
    assert routed.event.message_id == body_message_id(scan())

    def unresolvable(scope: str, document: str) -> Any:
        raise LookupError("down")

    failed = await handle(
        router_of(db, resolver=unresolvable),
        scope=SCOPE,
        source="parcel_scans",
        raw_body=scan(parcel="p2"),
        data=json.loads(scan(parcel="p2")),
        provider_id="evt_2",
    )
    assert isinstance(failed, Failed)
    assert status(failed) == 500
    assert failed.event.message_id == "evt_2"


def signed(body: bytes, *, encoding: str = "hex", timestamp: str | None = None) -> str:
    message = body if timestamp is None else timestamp.encode() + b"." + body
    digest = hmac.new(SECRET, message, hashlib.sha256).digest()
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()


@pytest.mark.asyncio
async def test_a_bad_signature_is_401_before_anything_is_routed(db: RouterDb) -> None:
    router = router_of(db)
    verifier = hmac_sha256(SECRET, header="x-signature", prefix="sha256=")
    body = scan()
    async with client(app_of(router, verifier=verifier)) as http:
        forged = await http.post("/", content=body, headers={"x-signature": "sha256=" + "ab" * 32})
        unsigned = await http.post("/", content=body)
        other_body = await http.post(
            "/", content=scan(parcel="p9"), headers={"x-signature": "sha256=" + signed(body)}
        )
        garbled = await http.post("/", content=body, headers={"x-signature": "sha256=zz"})
        assert [a.status_code for a in (forged, unsigned, other_body, garbled)] == [401] * 4
        assert await ledger(router) == []
        good = await http.post("/", content=body, headers={"x-signature": "sha256=" + signed(body)})
    assert good.status_code == 200
    assert [row.outcome for row in await ledger(router)] == ["created_and_delivered"]


@pytest.mark.asyncio
async def test_a_base64_signature_over_a_timestamp_within_tolerance(db: RouterDb) -> None:
    router = router_of(db)
    now = 1_800_000_000.0
    verifier = hmac_sha256(
        SECRET,
        header="x-signature",
        encoding="base64",
        timestamp_header="x-timestamp",
        tolerance=300,
        clock=lambda: now,
    )
    body = scan()

    def headers(at: int) -> dict[str, str]:
        stamp = str(at)
        return {"x-timestamp": stamp, "x-signature": signed(body, encoding="b64", timestamp=stamp)}

    async with client(app_of(router, verifier=verifier)) as http:
        stale = await http.post("/", content=body, headers=headers(int(now) - 301))
        early = await http.post("/", content=body, headers=headers(int(now) + 301))
        no_time = await http.post(
            "/", content=body, headers={"x-signature": signed(body, encoding="b64")}
        )
        # a latin-1 byte that str.isdigit() takes for a digit ("²") and int() refuses
        odd = await http.post(
            "/",
            content=body,
            headers={
                b"x-timestamp": b"\xb2",
                b"x-signature": signed(body, encoding="b64").encode(),
            },
        )
        assert [a.status_code for a in (stale, early, no_time, odd)] == [401] * 4
        assert await ledger(router) == []
        fresh = await http.post("/", content=body, headers=headers(int(now) - 299))
    assert fresh.status_code == 200


@pytest.mark.asyncio
async def test_a_verifier_of_the_hosts_own_may_be_async_and_its_failure_is_500(
    db: RouterDb,
) -> None:
    router = router_of(db)

    async def verified(request: Request, body: bytes) -> bool:
        return request.headers.get("authorization") == "Bearer host-checked"

    def broken(request: Request, body: bytes) -> bool:
        raise RuntimeError("the key store is down")

    async with client(app_of(router, verifier=verified)) as http:
        refused = await http.post("/", content=scan())
        accepted = await http.post(
            "/", content=scan(), headers={"authorization": "Bearer host-checked"}
        )
    async with client(app_of(router, verifier=broken)) as http:
        failed = await http.post("/", content=scan(parcel="p2"))
    assert [a.status_code for a in (refused, accepted, failed)] == [401, 200, 500]
    assert [row.key for row in await ledger(router)] == ["p1"]


def test_the_hmac_helper_refuses_what_cannot_verify() -> None:
    with pytest.raises(ValueError, match="secret"):
        hmac_sha256(b"", header="x-signature")
    with pytest.raises(ValueError, match="header"):
        hmac_sha256(SECRET, header="")
    with pytest.raises(ValueError, match="hex or base64"):
        hmac_sha256(SECRET, header="x", encoding="b32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tolerance"):
        hmac_sha256(SECRET, header="x", timestamp_header="t", tolerance=0)


@pytest.mark.asyncio
async def test_the_scope_comes_from_the_host_never_the_body(db: RouterDb) -> None:
    router = router_of(db)

    async def tenant(request: Request) -> str:
        return str(request.headers["x-host-tenant"])

    def broken(request: Request) -> str:
        raise KeyError("no session")

    body = scan(scope="someone_elses")
    async with client(app_of(router, scope=tenant)) as http:
        answer = await http.post("/", content=body, headers={"x-host-tenant": "depot_9"})
    async with client(app_of(router, scope=broken)) as http:
        failed = await http.post("/", content=scan(parcel="p2"))
    assert (answer.status_code, failed.status_code) == (200, 500)
    assert [row.scope for row in await ledger(router)] == ["depot_9"]


@pytest.mark.asyncio
async def test_another_method_is_405_naming_post(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router)) as http:
        for method in ("GET", "PUT", "DELETE"):
            answer = await http.request(method, "/")
            assert (answer.status_code, answer.headers["allow"]) == (405, "POST")


@pytest.mark.asyncio
async def test_malformed_bodies_are_400(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router, provider_id_header="x-provider-event-id")) as http:
        for content in (
            b"{not json",
            b'["a", "list"]',
            b'{"kind": NaN}',
            b"\xff\xfe{}",
            b"[" * 100_000 + b"]" * 100_000,
            b"",
        ):
            answer = await http.post("/", content=content)
            assert answer.status_code == 400, content[:20]
        long_id = await http.post("/", content=scan(), headers={"x-provider-event-id": "e" * 1025})
    assert long_id.status_code == 400
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_an_oversized_body_is_413_declared_or_streamed(db: RouterDb) -> None:
    router = router_of(db)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 100

    async with client(app_of(router, max_body=1024)) as http:
        declared = await http.post("/", content=scan(pad="x" * 2000))
        streamed = await http.post("/", content=chunks())
        fits = await http.post("/", content=scan())
    assert (declared.status_code, streamed.status_code, fits.status_code) == (413, 413, 200)
    assert [row.outcome for row in await ledger(router)] == ["created_and_delivered"]


@pytest.mark.asyncio
async def test_a_slow_body_is_408_and_slow_handling_503(db: RouterDb) -> None:
    assert await slow_post(app_of(router_of(db), timeout=0.2), "/", "application/json") == 408

    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        await asyncio.sleep(2)
        return await executions.step(execution_id, machine, event)

    router = router_of(db, on_step=on_step)
    async with client(app_of(router, timeout=0.3)) as http:
        answer = await http.post("/", content=scan())
    assert answer.status_code == 503
    assert await ledger(router) == []  # the delivery's transaction was rolled back


@pytest.mark.asyncio
async def test_concurrent_duplicate_posts_give_one_delivery(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router)) as http:
        answers = await asyncio.gather(*(http.post("/", content=scan()) for _ in range(8)))
    assert [answer.status_code for answer in answers] == [200] * 8
    outcomes = sorted(row.outcome for row in await ledger(router))
    assert outcomes == ["created_and_delivered"] + ["duplicate"] * 7


def _mounted(app: Starlette) -> Starlette:
    return Starlette(routes=[Mount("/hooks/parcels", app=app)])


@pytest.mark.asyncio
async def test_mounted_in_a_hosts_app_and_served_on_loopback(db: RouterDb) -> None:
    router = router_of(db)
    host = _mounted(app_of(router))
    async with client(host) as http:
        mounted = await http.post("/hooks/parcels/", content=scan())
    async with (
        serving(host) as base,
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as http,
    ):
        served = await http.post("/hooks/parcels/", content=scan(parcel="p2"))
        duplicate = await http.post("/hooks/parcels/", content=scan(parcel="p2"))
        wrong = await http.get("/hooks/parcels/")
        big = await http.post("/hooks/parcels/", content=b" " * 2_000_000)
    assert [a.status_code for a in (mounted, served, duplicate, wrong, big)] == [
        200, 200, 200, 405, 413,
    ]  # fmt: skip
    assert sorted(row.outcome for row in await ledger(router)) == [
        "created_and_delivered",
        "created_and_delivered",
        "duplicate",
    ]


@pytest.mark.asyncio
async def test_a_front_refuses_bounds_that_are_not_positive(db: RouterDb) -> None:
    router = router_of(db)
    bad: list[dict[str, Any]] = [{"max_body": 0}, {"timeout": 0}, {"timeout": -1.0}, {"source": ""}]
    for options in bad:
        with pytest.raises(ValueError, match=r"max_body|timeout|source"):
            app_of(router, **options)


@pytest.mark.asyncio
async def test_every_answer_is_reported_as_telemetry(db: RouterDb) -> None:
    router = router_of(db)
    seen: list[dict[str, Any]] = []
    telemetry.attach(
        "test.webhook",
        "statifier.fronts.request",
        lambda _name, _measurements, metadata: seen.append(dict(metadata)),
    )
    try:
        async with client(app_of(router, max_body=1024)) as http:
            await http.post("/", content=scan())
            await http.post("/", content=b"{not json")
            await http.post("/", content=scan(pad="x" * 2000))
    finally:
        telemetry.detach("test.webhook")
    assert seen == [
        {
            "front": "webhook",
            "source": "parcel_scans",
            "status": status,
            "refusal": refusal,
            "reason": reason,
        }
        for status, refusal, reason in (
            (200, None, None),
            (400, "json", "the body is not JSON: unexpected byte 0x6E at position 1"),
            (413, "size", "the body is over 1024 bytes"),
        )
    ]


# The one JSON rule, and refusals that reach an operator.

LOADED_HEAD = b'{"kind": "loaded", "parcel": "p1", "n": '
POISONED = [
    (LOADED_HEAD + b"[" * 900 + b"]" * 900 + b"}", "nesting deeper than 128 at position 167"),
    (LOADED_HEAD + b'"\\ud800"}', "a lone surrogate U+D800 at position 41"),
    (LOADED_HEAD + b'"\xed\xa0\x80"}', "a lone surrogate U+D800 at position 41"),
    (LOADED_HEAD + b"1e999999}", "a non-finite number (out of range) at position 40"),
    (LOADED_HEAD + b"NaN}", "a non-finite number (NaN) at position 40"),
    (LOADED_HEAD + b"Infinity}", "a non-finite number (Infinity) at position 40"),
    (LOADED_HEAD + b"-Infinity}", "a non-finite number (-Infinity) at position 40"),
]


@pytest.mark.asyncio
async def test_each_json_rule_is_a_400_naming_it_and_nothing_is_routed(db: RouterDb) -> None:
    router = router_of(db)
    async with client(app_of(router)) as http:
        for body, rule in POISONED:
            answer = await http.post("/", content=body)
            assert (answer.status_code, answer.text) == (400, f"the body is not JSON: {rule}")
        assert await ledger(router) == []
        # The same post within the rule is routed.
        fine = await http.post("/", content=LOADED_HEAD + b'"\\ud83d\\ude00"}')
    assert fine.status_code == 200
    assert [row.outcome for row in await ledger(router)] == ["created_and_delivered"]


FRONTS = "statifier.fronts"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith(FRONTS)]


def sign(body: bytes) -> str:
    return hmac.new(SECRET, body, hashlib.sha256).hexdigest()


@pytest.mark.asyncio
async def test_every_refusal_is_one_warning_without_the_body_or_the_signature(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, FRONTS)
    router = router_of(db)
    verifier = hmac_sha256(SECRET, header="x-signature")
    signed = scan(parcel="secret-parcel")
    good = sign(signed)
    app = app_of(router, verifier=verifier, provider_id_header="x-id", max_body=2048)
    async with client(app) as http:
        statuses = [
            (await http.get("/")).status_code,
            (await http.post("/", content=signed, headers={"x-signature": "0" * 64})).status_code,
            (
                await http.post(
                    "/",
                    content=b'{"card": "4111-secret"',
                    headers={"x-signature": sign(b'{"card": "4111-secret"')},
                )
            ).status_code,
            (await http.post("/", content=b"x" * 4096, headers={"x-signature": good})).status_code,
            (
                await http.post(
                    "/", content=signed, headers={"x-signature": good, "x-id": "e" * 1025}
                )
            ).status_code,
        ]
    assert statuses == [405, 401, 400, 413, 400]
    lines = warnings_of(caplog)
    assert [(vars(r)["status"], vars(r)["refusal"]) for r in lines] == [
        (405, "method"),
        (401, "verifier"),
        (400, "json"),
        (413, "size"),
        (400, "provider_id"),
    ]
    assert {(vars(r)["front"], vars(r)["source"]) for r in lines} == {("webhook", "parcel_scans")}
    text = caplog.text
    for secret in ("secret-parcel", "4111-secret", good, "0" * 64, SECRET.decode(), "e" * 1025):
        assert secret not in text
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_a_repeated_refusal_is_one_line_in_its_interval_and_each_is_reported(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, FRONTS)
    seen: list[Any] = []
    telemetry.attach(
        "test.refusals",
        "statifier.fronts.request",
        lambda _name, _measurements, metadata: seen.append(metadata["refusal"]),
    )
    try:
        async with client(app_of(router_of(db))) as http:
            for _ in range(40):
                await http.post("/", content=b"{not json")
            await http.post("/", content=b'{"n": NaN}')
    finally:
        telemetry.detach("test.refusals")
    assert seen == ["json"] * 41
    lines = warnings_of(caplog)
    # One line for the rule within the interval; the NaN is the same rule (json).
    assert len(lines) == 1
    assert lines[0].getMessage() == (
        "webhook parcel_scans refused a request: "
        "400 the body is not JSON: unexpected byte 0x6E at position 1"
    )
    assert vars(lines[0])["count"] == 1


@pytest.mark.asyncio
async def test_the_refusals_of_an_interval_are_counted_in_one_line_at_its_end(
    db: RouterDb, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, FRONTS)
    monkeypatch.setattr(IntervalTally, "interval", 0.1)
    async with client(app_of(router_of(db))) as http:
        for _ in range(5):
            await http.post("/", content=b"[1, 2]")
        async with asyncio.timeout(10):
            while len(warnings_of(caplog)) < 2:  # noqa: ASYNC110 - the log has no event
                await asyncio.sleep(0.02)
        # Ten intervals without a refusal (the summary's interval saw none): the
        # next refusal is written at once.
        await asyncio.sleep(1.0)
        await http.post("/", content=b"[1, 2]")
    lines = warnings_of(caplog)
    assert [line.getMessage() for line in lines] == [
        "webhook parcel_scans refused a request: 400 the body is JSON but not an object: list",
        "webhook parcel_scans refused requests by the rule json (400): 4 more in the last 0.1 s",
        "webhook parcel_scans refused a request: 400 the body is JSON but not an object: list",
    ]
    assert [vars(line)["count"] for line in lines] == [1, 4, 1]
