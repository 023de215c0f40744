"""The BasicHTTP front on both databases: each execution created under an address gets a
location whose token is random and stored only as its hash, written into the chart's
``_ioprocessors``; every status of the front (204, 400, 404, 405, 408, 413, 500, 503);
send keys dedupe per execution, concurrent duplicates included; a rotated location
answers 404; the location table is outside the version walk; and one run through a
real server on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from tests.fronts.http_support import (
    LOADED,
    SCOPE,
    client,
    datamodel,
    located_db,  # noqa: F401 - a fixture
    location_rows,
    parcel_router,
    rows_of,
    serving,
    slow_post,
)
from tests.persistence.conftest import (  # noqa: F401 - fixtures
    FreshDatabase,
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401 - fixtures

from statifier import telemetry
from statifier.buckets import bucket_of
from statifier.chart import Machine
from statifier.core import Event
from statifier.expr import UNDEFINED
from statifier.fronts.basichttp import SEND_KEY_HEADER, basichttp_app
from statifier.persistence import Discarded, Executions, Stepped
from statifier.router import (
    BasicHttpLocations,
    ConfigError,
    Create,
    CreatedAndDelivered,
    Delivered,
    Duplicate,
    InboundEvent,
    Router,
)
from statifier.router.locations import LocationRotated, NoLocation, token_bucket, token_digest
from statifier.router.routing import POST_PLAN_ID
from statifier.sql import TableOptions, migrations
from statifier.sql.locations import downgrade_locations, upgrade_locations

BASE = "https://depot.example/scxml"
FORM = {"content-type": "application/x-www-form-urlencoded"}


def router_of(db: RouterDb, **options: Any) -> Router:
    options.setdefault("basichttp", BasicHttpLocations(base_url=BASE + "/"))
    return parcel_router(db, [LOADED], **options)


async def loaded(router: Router, parcel: str = "p1") -> str:
    """Route the parcel's ``loaded`` event and answer the execution it created."""
    event = InboundEvent(
        scope=SCOPE,
        source="parcel_scans",
        message_id=f"load-{parcel}",
        data={"kind": "loaded", "parcel": parcel},
    )
    routed = await router.route(event)
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)
    return outcome.execution_id


@pytest_asyncio.fixture
async def db(located_db: RouterDb) -> RouterDb:  # noqa: F811 - the imported fixture
    """The router's database of each backend, with the location table."""
    return located_db


async def token_of(router: Router, execution_id: str) -> str:
    found = await router.location(execution_id)
    assert found is not None
    assert found.startswith(BASE + "/")
    return found.removeprefix(BASE + "/")


async def scans(router: Router, execution_id: str) -> Any:
    return (await datamodel(router, execution_id))["scans"]


@pytest.mark.asyncio
async def test_a_created_execution_knows_its_location_and_the_table_keeps_only_its_hash(
    db: RouterDb,
) -> None:
    router = router_of(db)
    first, second = await loaded(router, "p1"), await loaded(router, "p2")
    token = await token_of(router, first)
    assert len(token) == 47  # 43 random characters, a dot, the bucket in hex
    assert token_bucket(token) == bucket_of(first)
    assert first not in token
    assert token != await token_of(router, second)
    # The chart reads the same location, at _ioprocessors['basichttp'].location.
    assert (await datamodel(router, first))["where"] == f"{BASE}/{token}"
    rows = location_rows(db)
    assert len(rows) == 2
    stored = {value for row in rows for value in row}
    assert token_digest(token) in stored
    assert all(token not in str(value) for value in stored)


@pytest.mark.asyncio
async def test_a_delivered_event_is_204_and_reaches_the_chart(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    async with client(basichttp_app(router)) as http:
        answer = await http.post(
            f"/{token}", content=b"_scxmleventname=scanned&at=gate_3", headers=FORM
        )
        unused = await http.post(f"/{token}?_scxmleventname=misrouted", content=b"")
    assert (answer.status_code, answer.content) == (204, b"")
    assert unused.status_code == 204  # delivered, taken by no transition
    model = await datamodel(router, execution_id)
    assert model["scans"] == 1
    assert model["note"] == {"at": "gate_3"}
    rows = await rows_of(router, POST_PLAN_ID)
    assert [(row.outcome, row.reason, row.execution_id) for row in rows] == [
        ("delivered", None, execution_id),
        ("dropped", "unmatched_event", execution_id),
    ]


@pytest.mark.asyncio
async def test_a_send_key_delivers_once_per_execution_and_no_key_every_time(
    db: RouterDb,
) -> None:
    router = router_of(db)
    first, second = await loaded(router, "p1"), await loaded(router, "p2")
    tokens = [await token_of(router, first), await token_of(router, second)]
    keyed = {**FORM, SEND_KEY_HEADER: "scan-0001"}
    async with client(basichttp_app(router)) as http:
        for token in tokens:  # one key, two executions: each takes it once
            for _ in range(2):
                answer = await http.post(
                    f"/{token}", content=b"_scxmleventname=scanned", headers=keyed
                )
                assert answer.status_code == 204
        for _ in range(2):
            answer = await http.post(
                f"/{tokens[0]}", content=b"_scxmleventname=scanned", headers=FORM
            )
            assert answer.status_code == 204
    assert await scans(router, first) == 3
    assert await scans(router, second) == 1
    outcomes = [row.outcome for row in await rows_of(router, POST_PLAN_ID)]
    assert (outcomes.count("duplicate"), outcomes.count("delivered")) == (2, 4)


@pytest.mark.asyncio
async def test_a_send_key_is_forgotten_after_the_horizon(db: RouterDb) -> None:
    router = router_of(db, basichttp=BasicHttpLocations(base_url=BASE, horizon=timedelta(hours=1)))
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    keyed = {**FORM, SEND_KEY_HEADER: "scan-0001"}
    async with client(basichttp_app(router)) as http:
        await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
        db.clock.advance(timedelta(minutes=59))
        await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
        db.clock.advance(timedelta(minutes=2))
        await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
    assert await scans(router, execution_id) == 2


@pytest.mark.asyncio
async def test_concurrent_posts_of_one_send_key_deliver_once(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    keyed = {**FORM, SEND_KEY_HEADER: "scan-0001"}
    async with client(basichttp_app(router)) as http:
        answers = await asyncio.gather(
            *(
                http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
                for _ in range(8)
            )
        )
    assert [answer.status_code for answer in answers] == [204] * 8
    assert await scans(router, execution_id) == 1
    outcomes = sorted(row.outcome for row in await rows_of(router, POST_PLAN_ID))
    assert outcomes == ["delivered"] + ["duplicate"] * 7


@pytest.mark.asyncio
async def test_a_rotated_location_answers_404_and_the_new_one_204(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    old = await token_of(router, execution_id)
    rotated = await router.rotate_location(execution_id)
    new = rotated.removeprefix(BASE + "/")
    assert new != old
    assert len(new) == 47
    assert token_bucket(new) == token_bucket(old) == bucket_of(execution_id)
    # Only the hash is kept: the router cannot hand the rotated location out again,
    # and says so.
    with pytest.raises(LocationRotated, match="rotate again"):
        await router.location(execution_id)
    assert (await datamodel(router, execution_id))["where"] == f"{BASE}/{old}"  # the chart's copy
    async with client(basichttp_app(router)) as http:
        stale = await http.post(f"/{old}", content=b"_scxmleventname=scanned", headers=FORM)
        fresh = await http.post(f"/{new}", content=b"_scxmleventname=scanned", headers=FORM)
    assert (stale.status_code, fresh.status_code) == (404, 204)
    assert await scans(router, execution_id) == 1
    assert [row[3] for row in location_rows(db)] == [token_digest(new)]


@pytest.mark.asyncio
async def test_unknown_malformed_and_finished_locations_answer_404(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    unknown = "A" * 43
    async with client(basichttp_app(router)) as http:
        assert (await http.post(f"/{unknown}", content=b"", headers=FORM)).status_code == 404
        assert (await http.post("/ex_not_a_token", content=b"", headers=FORM)).status_code == 404
        assert (await http.post(f"/{token}/more", content=b"")).status_code == 404
        done = await http.post(f"/{token}", content=b"_scxmleventname=delivered", headers=FORM)
        after = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
    assert (done.status_code, after.status_code) == (204, 404)
    assert [row.outcome for row in await rows_of(router, POST_PLAN_ID)] == ["delivered", "dropped"]


@pytest.mark.asyncio
async def test_another_method_is_405_naming_post(db: RouterDb) -> None:
    router = router_of(db)
    token = await token_of(router, await loaded(router))
    async with client(basichttp_app(router)) as http:
        for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS"):
            answer = await http.request(method, f"/{token}")
            assert (answer.status_code, answer.headers["allow"]) == (405, "POST")
    assert await rows_of(router, POST_PLAN_ID) == []


@pytest.mark.asyncio
async def test_a_body_or_send_key_the_decoder_refuses_is_400(db: RouterDb) -> None:
    router = router_of(db)
    token = await token_of(router, await loaded(router))
    async with client(basichttp_app(router)) as http:
        for content, headers in [
            (b"\xff\xfe", {"content-type": "text/plain"}),
            (b"_scxmleventname=two words", FORM),
            (b"_scxmleventname=", FORM),
            (b"_scxmleventname=scanned", {**FORM, SEND_KEY_HEADER: "has space"}),
            (b"_scxmleventname=scanned", {**FORM, SEND_KEY_HEADER: "k" * 257}),
        ]:
            answer = await http.post(f"/{token}", content=content, headers=headers)
            assert answer.status_code == 400, content
            assert token not in answer.text
    assert await rows_of(router, POST_PLAN_ID) == []


@pytest.mark.asyncio
async def test_an_oversized_body_is_413_declared_or_streamed(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"_scxmleventname=scanned&pad="
        for _ in range(10):
            yield b"x" * 100

    async with client(basichttp_app(router, max_body=512)) as http:
        declared = await http.post(f"/{token}", content=b"x" * 513, headers=FORM)
        streamed = await http.post(f"/{token}", content=chunks(), headers=FORM)
        fits = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
    assert "content-length" not in streamed.request.headers
    assert (declared.status_code, streamed.status_code, fits.status_code) == (413, 413, 204)
    assert await scans(router, execution_id) == 1


@pytest.mark.asyncio
async def test_a_body_that_does_not_arrive_in_time_is_408(db: RouterDb) -> None:
    router = router_of(db)
    token = await token_of(router, await loaded(router))
    app = basichttp_app(router, timeout=0.2)
    status = await slow_post(app, f"/{token}")
    assert status == 408
    assert await rows_of(router, POST_PLAN_ID) == []


def _stepping(
    slow: Callable[[], Awaitable[None]],
) -> Callable[[Executions, str, Machine | None, Event], Awaitable[Stepped | Discarded]]:
    """An ``on_step`` that runs ``slow`` before stepping a ``scanned`` event."""

    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        if event.name == "scanned":
            await slow()
        return await executions.step(execution_id, machine, event)

    return on_step


@pytest.mark.asyncio
async def test_an_unsettled_delivery_is_500_and_leaves_nothing(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken() -> None:
        raise RuntimeError("the step store is down")

    router = router_of(db, on_step=_stepping(broken))
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    body = b"_scxmleventname=scanned&secret_field=s3cret-value"
    async with client(basichttp_app(router)) as http:
        answers = [await http.post(f"/{token}", content=body, headers=FORM) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [500] * 3
    assert await scans(router, execution_id) == 0
    assert await rows_of(router, POST_PLAN_ID) == []
    said = [r.getMessage() for r in caplog.records if "a delivery failed" in r.getMessage()]
    assert said == ["basichttp: a delivery failed with RuntimeError"]  # once per interval
    logged = caplog.text
    assert token not in logged
    assert "s3cret-value" not in logged


@pytest.mark.asyncio
async def test_a_delivery_that_outlives_the_timeout_is_503_and_rolled_back(
    db: RouterDb,
) -> None:
    async def slow() -> None:
        await asyncio.sleep(2)

    router = router_of(db, on_step=_stepping(slow))
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    async with client(basichttp_app(router, timeout=0.3)) as http:
        answer = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
    assert answer.status_code == 503
    assert await scans(router, execution_id) == 0
    assert await rows_of(router, POST_PLAN_ID) == []


@pytest.mark.asyncio
async def test_around_delivery_and_on_begin_take_each_post_under_its_scope(db: RouterDb) -> None:
    seen: list[tuple[str, str]] = []

    async def around(scope: str, entry: Any, work: Callable[[], Awaitable[Any]]) -> Any:
        seen.append((scope, str(entry)))
        return await work()

    async def on_begin(tx: Any, scope: str, entry: Any) -> None:
        seen.append((scope, f"begin {entry}"))

    router = router_of(db, around_delivery=around, on_begin=on_begin)
    token = await token_of(router, await loaded(router))
    seen.clear()
    async with client(basichttp_app(router)) as http:
        await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
    assert seen == [(SCOPE, "basichttp"), (SCOPE, "begin basichttp")]


@pytest.mark.asyncio
async def test_always_new_and_configurations_without_basichttp_give_no_location(
    db: RouterDb,
) -> None:
    fresh = parcel_router(
        db,
        [LOADED.__class__(**{**_fields(LOADED), "create": Create.ALWAYS_NEW})],
        basichttp=BasicHttpLocations(base_url=BASE),
    )
    execution_id = await loaded(fresh)
    assert await fresh.location(execution_id) is None
    assert (await datamodel(fresh, execution_id))["where"] is UNDEFINED
    with pytest.raises(NoLocation):
        await fresh.rotate_location(execution_id)
    plain = parcel_router(db, [LOADED])
    with pytest.raises(ConfigError, match="basichttp"):
        basichttp_app(plain)
    with pytest.raises(ConfigError, match="basichttp"):
        await plain.rotate_location(execution_id)
    assert location_rows(db) == []


def _fields(binding: Any) -> dict[str, Any]:
    return {
        name: getattr(binding, name)
        for name in ("id", "source", "match", "key", "document", "event")
    }


def test_a_base_url_must_be_an_http_url() -> None:
    for bad in ("depot.example/scxml", "ftp://depot.example", "https://depot.example/?a=1", ""):
        with pytest.raises(ConfigError, match="base_url"):
            BasicHttpLocations(base_url=bad)
    with pytest.raises(ConfigError, match="horizon"):
        BasicHttpLocations(base_url=BASE, horizon=timedelta(0))


def test_the_location_table_is_outside_the_version_walk(
    fresh_database: FreshDatabase,  # noqa: F811 - the imported fixture
) -> None:
    options = TableOptions(prefix="loc_", schema=fresh_database.schema)
    url = fresh_database.url

    def tables() -> set[str]:
        engine = sa.create_engine(migrations.sync_url(url))
        try:
            return set(sa.inspect(engine).get_table_names(schema=options.schema))
        finally:
            engine.dispose()

    migrations.upgrade(url, options)
    assert "loc_locations" not in tables()
    upgrade_locations(url, options)
    upgrade_locations(url, options)  # creates only what is missing
    assert "loc_locations" in tables()
    migrations.downgrade(url, options, "statifier_0002")  # the walk never touches it
    assert "loc_locations" in tables()
    downgrade_locations(url, options)  # it goes before the address table does
    downgrade_locations(url, options)  # dropping only what is there
    assert "loc_locations" not in tables()
    migrations.downgrade(url, options)
    assert not {name for name in tables() if name.startswith("loc_")} - {"loc_alembic_version"}


@pytest.mark.asyncio
async def test_a_real_server_on_loopback_serves_every_answer(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    async with (
        serving(basichttp_app(router, max_body=1024)) as base,
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as http,
    ):
        keyed = {**FORM, SEND_KEY_HEADER: "scan-9"}
        delivered = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
        duplicate = await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=keyed)
        wrong = await http.get(f"/{token}")
        big = await http.post(f"/{token}", content=b"x" * 2048, headers=FORM)
        bad = await http.post(f"/{token}", content=b"\xff", headers={"content-type": "text/plain"})
        unknown = await http.post("/" + "B" * 43, content=b"", headers=FORM)
    assert [a.status_code for a in (delivered, duplicate, wrong, big, bad, unknown)] == [
        204, 204, 405, 413, 400, 404,
    ]  # fmt: skip
    assert wrong.headers["allow"] == "POST"
    assert await scans(router, execution_id) == 1
    assert hashlib.sha256(token.encode()).hexdigest() == token_digest(token)


@pytest.mark.asyncio
async def test_deliver_post_is_the_contract_the_app_is_built_on(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    scanned = Event("scanned", data={"at": "gate_1"})
    assert await router.deliver_post("C" * 43, scanned) is None
    delivered = await router.deliver_post(token, scanned, send_key="k1", now=db.clock())
    assert isinstance(delivered, Delivered)
    assert delivered.execution_id == execution_id
    again = await router.deliver_post(token, scanned, send_key="k1")
    assert isinstance(again, Duplicate)
    with pytest.raises(ValueError, match="timezone-aware"):
        await router.deliver_post(token, scanned, now=datetime(2026, 9, 19, 8, 0))  # noqa: DTZ001
    with pytest.raises(ConfigError, match="basichttp"):
        await parcel_router(db, [LOADED]).deliver_post(token, scanned)


@pytest.mark.asyncio
async def test_every_answer_is_reported_without_the_location(db: RouterDb) -> None:
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    seen: list[tuple[dict[str, float], dict[str, Any]]] = []
    telemetry.attach(
        "test.basichttp",
        "statifier.fronts.request",
        lambda _name, measurements, metadata: seen.append((dict(measurements), dict(metadata))),
    )
    try:
        async with client(basichttp_app(router)) as http:
            await http.post(f"/{token}", content=b"_scxmleventname=scanned", headers=FORM)
            await http.post(f"/{'x' * 43}", content=b"_scxmleventname=scanned", headers=FORM)
            await http.get(f"/{token}")
    finally:
        telemetry.detach("test.basichttp")
    assert [metadata for _, metadata in seen] == [
        {
            "front": "basichttp",
            "source": "basichttp",
            "status": status,
            "refusal": refusal,
            "reason": reason,
        }
        for status, refusal, reason in (
            (204, None, None),
            (404, "location", "no execution takes events at this location"),
            (405, "method", "a front takes POST only"),
        )
    ]
    assert all(measurements["duration"] >= 0 for measurements, _ in seen)
    assert token not in repr(seen)


@pytest.mark.asyncio
async def test_a_post_carries_no_json_and_refuses_a_lone_surrogate(db: RouterDb) -> None:
    """BasicHTTP data is form fields or text (SCXML C.2), never parsed as JSON: its one
    rule is strict UTF-8, so a raw surrogate is refused and JSON-looking text is kept
    as the text it is."""
    router = router_of(db)
    execution_id = await loaded(router)
    token = await token_of(router, execution_id)
    plain = {"content-type": "text/plain"}
    as_json = {"content-type": "application/json"}
    poisoned = b'{"n": 1e999999, "k": "\\ud800", "deep": ' + b"[" * 900 + b"]" * 900 + b"}"
    async with client(basichttp_app(router)) as http:
        raw_text = await http.post(
            f"/{token}?_scxmleventname=scanned", content=b"\xed\xa0\x80", headers=plain
        )
        raw_field = await http.post(
            f"/{token}", content=b"_scxmleventname=scanned&at=\xed\xa0\x80", headers=FORM
        )
        assert await scans(router, execution_id) == 0
        text = await http.post(
            f"/{token}?_scxmleventname=scanned", content=poisoned, headers=as_json
        )
    assert [(a.status_code, a.text) for a in (raw_text, raw_field)] == [
        (400, "the request is not UTF-8"),
        (400, "the request is not UTF-8"),
    ]
    assert text.status_code == 204
    assert (await datamodel(router, execution_id))["note"] == poisoned.decode()


@pytest.mark.asyncio
async def test_refusals_are_warnings_that_never_name_the_location(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "statifier.fronts")
    router = router_of(db)
    token = await token_of(router, await loaded(router))
    unknown = "u" * 43
    async with client(basichttp_app(router, max_body=64)) as http:
        answers = [
            await http.post(f"/{unknown}", content=b"_scxmleventname=scanned", headers=FORM),
            await http.post(f"/{token}", content=b"_scxmleventname=two words", headers=FORM),
            await http.post(f"/{token}", content=b"x" * 100, headers=FORM),
            await http.post(
                f"/{token}",
                content=b"_scxmleventname=scanned",
                headers={**FORM, SEND_KEY_HEADER: " "},
            ),
        ]
    assert [a.status_code for a in answers] == [404, 400, 413, 400]
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(vars(r)["status"], vars(r)["refusal"]) for r in lines] == [
        (404, "location"),
        (400, "event"),
        (413, "size"),
        (400, "send_key"),
    ]
    assert token not in caplog.text
    assert unknown not in caplog.text
