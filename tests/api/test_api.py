"""The HTTP API on each database: sends answered with the state their commit left,
tokens held to their scopes and rights, reads, lists, cancels and waits, one watcher
for every waiter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
from tests.console.conftest import CHECKOUT, shop_bindings
from tests.persistence.conftest import (  # noqa: F401 - fixtures used by name
    fresh_database,
    postgresql_store,
    sqlite_store,
)
from tests.router.conftest import (  # noqa: F401 - fixtures used by name
    RouterDb,
    router_db,
    router_store,
)

from statifier.api import API_PLAN_ID, Api, ApiToken, ApiTokenError, Rights
from statifier.chart import compile_chart
from statifier.console.audit import Audit
from statifier.persistence import Status
from statifier.router import Binding, Router, StaticResolver
from statifier.router.transaction import Delivering

WRITER = "writer-token-" + "w" * 20
READER = "reader-token-" + "r" * 20
OTHER = "other-token-" + "o" * 20
ADMIN = "admin-token-" + "a" * 20


@dataclass
class Shop:
    db: RouterDb
    api: Api
    client: httpx.AsyncClient

    async def call(
        self, method: str, path: str, token: str | None = WRITER, **kwargs: Any
    ) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return await self.client.request(method, path, headers=headers, **kwargs)

    async def checkout(self, order: str, amount: object = 20, **headers: str) -> dict[str, Any]:
        body = {
            "source": "shop",
            "scope": "web",
            "data": {"kind": "checkout", "order": order, "amount": amount, "timeout": "1h"},
        }
        answer = await self.call("POST", "/events", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        self.db.clock.advance(timedelta(seconds=1))
        result: dict[str, Any] = answer.json()
        return result


@pytest_asyncio.fixture
async def shop(router_db: RouterDb) -> AsyncIterator[Shop]:  # noqa: F811 - the fixture
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    router = router_db.router(shop_bindings(), resolver=StaticResolver({"order": machine}))
    api = Api(
        router,
        tokens=[
            ApiToken("shop", WRITER, ("web",), Rights.WRITE),
            ApiToken("viewer", READER, ("web",)),
            ApiToken("partner", OTHER, ("partners",), Rights.WRITE),
            ApiToken("ops", ADMIN, ("*",), Rights.WRITE),
        ],
        visible={"order": ["total"]},
        poll=0.05,
    )
    transport = httpx.ASGITransport(app=api.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield Shop(router_db, api, client)
    await api.close()


def _checkout(answer: dict[str, Any]) -> dict[str, Any]:
    """The outcome of the checkouts binding (the payments binding's is no match)."""
    (outcome,) = [o for o in answer["outcomes"] if o["binding"] == "checkouts"]
    (other,) = [o for o in answer["outcomes"] if o["binding"] != "checkouts"]
    assert other["outcome"] == "no_match"
    found: dict[str, Any] = outcome
    return found


def _execution(answer: dict[str, Any]) -> dict[str, Any]:
    execution: dict[str, Any] = _checkout(answer)["execution"]
    return execution


@pytest.mark.asyncio
async def test_a_routed_event_is_answered_with_the_state_its_commit_left(shop: Shop) -> None:
    answer = await shop.checkout("o-1", amount=21)
    outcome = _checkout(answer)
    assert outcome["outcome"] == "created_and_delivered"
    assert outcome["binding"] == "checkouts"
    assert outcome["key"] == "o-1"
    execution = outcome["execution"]
    assert execution["status"] == "active"
    assert execution["configuration"] == ["awaiting_payment"]
    assert execution["data"] == {"total": 42}  # the visible field, nothing else
    assert execution["addresses"] == [{"scope": "web", "document": "order", "key": "o-1"}]
    assert execution["errors"] == []
    # What the database holds after the commit is what the answer said.
    record = await shop.db.adapter.fetch_execution(outcome["execution_id"])
    assert record is not None
    assert record.updated_at is not None
    assert record.status is Status.ACTIVE
    assert execution["updated_at"] == record.updated_at.isoformat()
    read = await shop.call("GET", f"/executions/{outcome['execution_id']}", READER)
    assert read.status_code == 200
    assert {k: v for k, v in read.json().items() if k != "errors"} == {
        k: v for k, v in execution.items() if k != "errors"
    }


@pytest.mark.asyncio
async def test_a_call_that_fails_is_500_and_logged_once_per_interval(
    shop: Shop, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(event: object) -> object:
        raise ConnectionError("the database went away")

    monkeypatch.setattr(shop.api.router, "route", broken)
    body = {"source": "shop", "scope": "web", "data": {"kind": "checkout", "order": "o-9"}}
    answers = [await shop.call("POST", "/events", json=body) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [500] * 3
    assert "the call failed (ConnectionError); retry it" in answers[0].text
    said = [r for r in caplog.records if "a call failed" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in said] == [
        ("ERROR", "api: a call failed with ConnectionError: the database went away")
    ]
    assert said[0].exc_info is not None


@pytest.mark.asyncio
async def test_the_answer_names_the_errors_of_its_own_step(shop: Shop) -> None:
    first = _execution(await shop.checkout("o-2", amount=5))
    assert first["errors"] == []
    body = {"event": "checkout", "data": {"amount": "five"}}
    answer = await shop.call("POST", f"/executions/{first['id']}/events", json=body)
    assert answer.status_code == 200, answer.text
    outcome = answer.json()["outcome"]
    assert outcome["outcome"] == "delivered"
    errors = outcome["execution"]["errors"]
    assert [e["name"] for e in errors] == ["error.execution"]
    assert outcome["execution"]["error_count"] == 1
    assert outcome["execution"]["data"] == {"total": 10}  # the failed assign changed nothing


@pytest.mark.asyncio
async def test_an_idempotency_key_makes_a_retry_a_duplicate(shop: Shop) -> None:
    first = await shop.checkout("o-3", **{"Idempotency-Key": "checkout-o-3"})
    again = await shop.checkout("o-3", **{"Idempotency-Key": "checkout-o-3"})
    assert first["message_id"] == again["message_id"] == "checkout-o-3"
    outcome = _checkout(again)
    assert outcome["outcome"] == "duplicate"
    assert outcome["execution"] is None
    execution_id = _checkout(first)["execution_id"]
    inputs = await shop.db.adapter.inputs(execution_id)
    assert len(inputs) == 1  # stepped once
    paid = {"event": "pay"}
    key = {"Idempotency-Key": "pay-o-3"}
    path = "/addresses/web/order/o-3/events"
    one = await shop.call("POST", path, json=paid, headers=key)
    two = await shop.call("POST", path, json=paid, headers=key)
    assert one.json()["outcome"]["outcome"] == "delivered"
    assert one.json()["outcome"]["execution"]["final_state"] == "paid"
    assert one.json()["outcome"]["execution"]["status"] == "completed"
    assert two.json()["outcome"]["outcome"] == "duplicate"
    assert len(await shop.db.adapter.inputs(execution_id)) == 2


@pytest.mark.asyncio
async def test_a_send_to_an_address_without_an_execution_is_dropped(shop: Shop) -> None:
    answer = await shop.call("POST", "/addresses/web/order/nobody/events", json={"event": "pay"})
    assert answer.status_code == 200
    outcome = answer.json()["outcome"]
    assert (outcome["outcome"], outcome["reason"]) == ("dropped", "no_execution")
    assert outcome["binding"] == API_PLAN_ID


@pytest.mark.asyncio
async def test_tokens_reach_their_scopes_with_their_rights(shop: Shop) -> None:
    execution_id = _execution(await shop.checkout("o-4"))["id"]
    body = {"source": "shop", "scope": "web", "data": {"kind": "pay", "order": "o-4"}}
    assert (await shop.call("POST", "/events", None, json=body)).status_code == 401
    wrong = await shop.call("POST", "/events", "not-a-token-" + "x" * 20, json=body)
    assert wrong.status_code == 401
    assert wrong.json()["error"] == "unauthorized"
    # Read rights: reads, never writes.
    refused = await shop.call("POST", "/events", READER, json=body)
    assert refused.status_code == 403
    assert refused.json()["error"] == "forbidden"
    assert (await shop.call("GET", f"/executions/{execution_id}", READER)).status_code == 200
    cancel = await shop.call("POST", f"/executions/{execution_id}/cancel", READER)
    assert cancel.status_code == 403
    # Another scope: refused there, and its executions are none of this token's.
    assert (await shop.call("POST", "/events", OTHER, json=body)).status_code == 403
    for method, path in [
        ("GET", f"/executions/{execution_id}"),
        ("GET", f"/executions/{execution_id}/wait?end=true&timeout=0"),
        ("POST", f"/executions/{execution_id}/cancel"),
    ]:
        answer = await shop.call(method, path, OTHER)
        assert answer.status_code == 404, (path, answer.text)
    sent = await shop.call("POST", f"/executions/{execution_id}/events", OTHER, json=body)
    assert sent.status_code == 404
    assert (await shop.call("GET", "/executions?scope=web", OTHER)).status_code == 403
    assert (await shop.call("GET", "/executions", OTHER)).status_code == 400
    # Nothing was stepped by the refused calls.
    assert len(await shop.db.adapter.inputs(execution_id)) == 1


@pytest.mark.asyncio
async def test_the_list_searches_and_pages(shop: Shop) -> None:
    for order in ("o-5", "o-6", "o-7"):
        await shop.checkout(order)
    await shop.call("POST", "/addresses/web/order/o-6/events", json={"event": "pay"})
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params = {"scope": "web", "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await shop.call("GET", "/executions", READER, params=params)).json()
        seen.extend(row["id"] for row in page["executions"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 3
    paid = await shop.call(
        "GET", "/executions", READER, params={"final_state": "paid"} | {"scope": "web"}
    )
    (row,) = paid.json()["executions"]
    assert row["status"] == "completed"
    assert row["final_state"] == "paid"
    keyed = await shop.call("GET", "/executions", READER, params={"scope": "web", "key": "o-7"})
    assert len(keyed.json()["executions"]) == 1
    bad = await shop.call("GET", "/executions", READER, params={"scope": "web", "limit": "0"})
    assert bad.status_code == 400
    assert bad.json()["error"] == "bad_filter"
    cursor_bad = await shop.call(
        "GET", "/executions", READER, params={"scope": "web", "cursor": "x"}
    )
    assert cursor_bad.json()["error"] == "bad_cursor"
    status_bad = await shop.call(
        "GET", "/executions", READER, params={"scope": "web", "status": "x"}
    )
    assert status_bad.status_code == 400


@pytest.mark.asyncio
async def test_a_cancel_is_done_once_and_audited(shop: Shop) -> None:
    execution_id = _execution(await shop.checkout("o-8"))["id"]
    answer = await shop.call("POST", f"/executions/{execution_id}/cancel")
    assert answer.status_code == 200
    assert answer.json()["execution"]["status"] == "cancelled"
    again = await shop.call("POST", f"/executions/{execution_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"] == "ended"
    missing = await shop.call("POST", "/executions/nobody/cancel", ADMIN)
    assert missing.status_code == 404
    rows = (await Audit(shop.db.adapter.engine, shop.db.adapter.tables).entries()).rows
    assert [(r.actor, r.action, r.target, r.outcome) for r in rows] == [
        ("api:shop", "cancel", execution_id, "done")
    ]


@pytest.mark.asyncio
async def test_a_wait_is_answered_when_the_state_is_reached_or_the_time_is_up(
    shop: Shop,
) -> None:
    execution_id = _execution(await shop.checkout("o-9"))["id"]
    waited = asyncio.create_task(
        shop.call("GET", f"/executions/{execution_id}/wait", READER, params={"state": "paid"})
    )
    ended = asyncio.create_task(
        shop.call("GET", f"/executions/{execution_id}/wait?end=true&timeout=5", READER)
    )
    await asyncio.sleep(0.2)
    assert not waited.done()
    await shop.call("POST", "/addresses/web/order/o-9/events", json={"event": "pay"})
    for task in (waited, ended):
        answer = (await asyncio.wait_for(task, 5)).json()
        assert answer["reached"] is True
        assert answer["execution"]["final_state"] == "paid"
    # A state already active is answered at once; one never reached when the time is up.
    other = _execution(await shop.checkout("o-10"))["id"]
    now = await shop.call("GET", f"/executions/{other}/wait?state=awaiting_payment&timeout=5")
    assert now.json()["reached"] is True
    late = await shop.call("GET", f"/executions/{other}/wait?state=paid&timeout=0.2")
    assert late.status_code == 200
    assert late.json()["reached"] is False
    assert late.json()["execution"]["configuration"] == ["awaiting_payment"]
    # An execution that ended elsewhere answers a waiter for a state it will never reach.
    gone = await shop.call("GET", f"/executions/{execution_id}/wait?state=expired&timeout=5")
    assert gone.json()["reached"] is False
    assert gone.json()["execution"]["status"] == "completed"
    assert (await shop.call("GET", "/executions/nobody/wait?end=true", ADMIN)).status_code == 404
    for query in ("", "?state=paid&end=true", "?end=true&timeout=-1", "?end=true&timeout=x"):
        bad = await shop.call("GET", f"/executions/{other}/wait{query}")
        assert bad.status_code == 400, query
    assert shop.api.watcher.waiting == 0


@pytest.mark.asyncio
async def test_two_hundred_waiters_are_served_by_one_watcher(shop: Shop) -> None:
    ids = [_execution(await shop.checkout(f"w-{n}"))["id"] for n in range(20)]
    engine = shop.db.adapter.engine
    sync_engine = engine.sync_engine if hasattr(engine, "sync_engine") else engine
    statements: list[tuple[str, str]] = []

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        statements.append((statement, repr(parameters)))

    sa.event.listen(sync_engine, "before_cursor_execute", count)
    started = asyncio.get_running_loop().time()
    try:
        waiters = [
            asyncio.create_task(
                shop.call("GET", f"/executions/{ids[n % 20]}/wait?state=paid&timeout=10", READER)
            )
            for n in range(200)
        ]
        for _ in range(400):  # every waiter in (each reads its address first)
            if shop.api.watcher.waiting == 200:
                break
            await asyncio.sleep(0.05)
        assert shop.api.watcher.waiting == 200
        for n in range(20):
            await shop.call("POST", f"/addresses/web/order/w-{n}/events", json={"event": "pay"})
        answers = await asyncio.wait_for(asyncio.gather(*waiters), 20)
    finally:
        sa.event.remove(sync_engine, "before_cursor_execute", count)
    elapsed = asyncio.get_running_loop().time() - started
    assert all(a.json()["reached"] for a in answers)
    marks = [parameters for statement, parameters in statements if "max(" in statement.lower()]
    # One read of every watched execution at a time, at most one per tenth of the
    # interval (0.005 s here), however many wait or nudge: never one per waiter.
    assert 0 < len(marks) <= elapsed / 0.005 + 2, (len(marks), elapsed)
    assert len(marks) < 200
    # Once every waiter came, one read covers all twenty executions.
    assert any(all(execution_id in read for execution_id in ids) for read in marks)
    print(f"200 waiters over {elapsed:.2f} s: {len(marks)} reads of the watcher")


@pytest.mark.asyncio
async def test_bodies_are_bounded_and_read_by_the_one_json_rule(shop: Shop) -> None:
    refused = [
        (b"not json", 400, "json"),
        (b"[1]", 400, "json"),
        (b'{"source": "shop"}', 400, "body"),
        (b'{"source": "shop", "scope": "web", "data": [1]}', 400, "body"),
        (b'{"source": "elsewhere", "scope": "web"}', 404, "no_source"),
        (b"{" + b'"a": ' * 200 + b"1" + b"}" * 200, 400, "json"),
    ]
    for body, status, rule in refused:
        answer = await shop.call("POST", "/events", content=body)
        assert (answer.status_code, answer.json()["error"]) == (status, rule), body[:40]
    small = Api(shop.api.router, tokens=[ApiToken("t", WRITER, ("*",), Rights.WRITE)], max_body=64)
    transport = httpx.ASGITransport(app=small.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        answer = await client.post(
            "/events",
            content=b"{" + b" " * 100 + b"}",
            headers={"Authorization": f"Bearer {WRITER}"},
        )
    assert answer.status_code == 413
    long_key = {"Idempotency-Key": "k" * 201}
    answer = await shop.call(
        "POST", "/addresses/web/order/o/events", json={"event": "pay"}, headers=long_key
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "idempotency_key"


def _errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.asyncio
async def test_a_malformed_tagged_value_is_a_400_naming_data_not_a_500(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    execution_id = _execution(await shop.checkout("o-t"))["id"]
    paths = [f"/executions/{execution_id}/events", "/addresses/web/order/o-t/events"]
    malformed: list[object] = [
        {"$type": "date"},
        {"when": {"$type": "datetime", "value": "not a moment"}},
        [{"$type": "no such type"}],
        {"$type": "duration", "value": {"days": "three"}},
    ]
    for path in paths:
        for data in malformed:
            answer = await shop.call("POST", path, json={"event": "pay", "data": data})
            assert answer.status_code == 400, (path, data, answer.text)
            refused = answer.json()
            assert refused["error"] == "body"
            assert refused["message"].startswith("data is not in the tagged encoding: ")
            assert "retry" not in refused["message"]
    long = {"$type": "date", "value": "x" * 5000}
    answer = await shop.call("POST", paths[0], json={"event": "pay", "data": long})
    assert answer.status_code == 400
    assert len(answer.json()["message"]) <= 250  # the body is not echoed whole
    assert _errors_logged(caplog) == []
    assert any("refused a call: 400 data is not" in r.getMessage() for r in caplog.records)
    read = (await shop.call("GET", f"/executions/{execution_id}", READER)).json()
    assert (read["status"], read["configuration"]) == ("active", ["awaiting_payment"])


@pytest.mark.asyncio
async def test_a_step_that_cannot_be_stored_is_a_422_and_changes_nothing(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    huge = int("9" * 4300)  # doubled by the chart: more digits than a position keeps
    body = {
        "source": "shop",
        "scope": "web",
        "data": {"kind": "checkout", "order": "o-big", "amount": huge, "timeout": "1h"},
    }
    answer = await shop.call("POST", "/events", json=body)
    assert answer.status_code == 422, answer.text
    refused = answer.json()
    assert refused["error"] == "unstorable"
    assert refused["message"].startswith("the step this event makes cannot be stored")
    assert "retry" not in refused["message"]
    listed = await shop.call("GET", "/executions?scope=web&key=o-big", READER)
    assert listed.json()["executions"] == []  # the creating step was abandoned
    execution_id = _execution(await shop.checkout("o-small", amount=4))["id"]
    again = {"event": "checkout", "data": {"amount": huge}}
    for path in (f"/executions/{execution_id}/events", "/addresses/web/order/o-small/events"):
        answer = await shop.call("POST", path, json=again)
        assert (answer.status_code, answer.json()["error"]) == (422, "unstorable"), answer.text
    read = (await shop.call("GET", f"/executions/{execution_id}", READER)).json()
    assert read["data"] == {"total": 8}  # as it was
    assert read["errors"] == []
    assert _errors_logged(caplog) == []


@pytest.mark.asyncio
async def test_an_execution_no_address_names_is_read_but_not_sent_to(shop: Shop) -> None:
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    router = shop.api.router
    assert isinstance(router, Router)
    async with router.transaction() as unit:
        await unit.executions(Delivering(None, shop.db.clock())).create("plain-1", machine)
    read = await shop.call("GET", "/executions/plain-1", ADMIN)
    assert read.status_code == 200
    assert read.json()["addresses"] == []
    assert (await shop.call("GET", "/executions/plain-1", WRITER)).status_code == 404
    sent = await shop.call("POST", "/executions/plain-1/events", ADMIN, json={"event": "pay"})
    assert sent.status_code == 409
    assert sent.json()["error"] == "no_address"


@pytest.mark.asyncio
async def test_the_openapi_document_needs_no_token_and_lists_every_route(shop: Shop) -> None:
    answer = await shop.client.get("/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    assert document["openapi"] == "3.1.0"
    served = {getattr(route, "path", "") for route in shop.api.app.routes} - {"/openapi.json"}
    assert served == set(document["paths"])
    validate(document)  # against the OpenAPI 3.1 schema
    # The routes that step an execution say that a step may be refused as unstorable.
    paths = document["paths"]
    for path in ("/events", "/addresses/{scope}/{document}/{key}/events"):
        assert "422" in paths[path]["post"]["responses"], path
    assert "422" in paths["/executions/{id}/events"]["post"]["responses"]
    assert "422" not in paths["/executions/{id}"]["get"]["responses"]
    with pytest.raises(OpenAPIValidationError):  # which is not vacuous
        validate(document | {"paths": {"/x": {"get": {"responses": {"200": {}}}}}})


def test_tokens_are_checked_and_never_shown() -> None:
    token = ApiToken("shop", WRITER, ("web",), Rights.WRITE)
    assert WRITER not in repr(token)
    for bad in [
        {"name": "", "token": WRITER, "scopes": ("web",)},
        {"name": "x", "token": "short", "scopes": ("web",)},
        {"name": "x", "token": WRITER, "scopes": ()},
        {"name": "x", "token": WRITER, "scopes": ("web",), "rights": "admin"},
    ]:
        with pytest.raises(ApiTokenError) as raised:
            ApiToken(**bad)  # type: ignore[arg-type]
        assert WRITER not in str(raised.value)


@pytest.mark.asyncio
async def test_the_api_refuses_a_binding_that_takes_its_id(router_db: RouterDb) -> None:  # noqa: F811
    binding = Binding(
        id=API_PLAN_ID, source="s", match="true", key="event.k", document="join", event="e"
    )
    router = router_db.router([binding])
    with pytest.raises(ValueError, match="binding is named 'api'"):
        Api(router, tokens=[ApiToken("t", WRITER, ("*",))])
    with pytest.raises(ValueError, match="not a datamodel field"):
        Api(router_db.router([]), tokens=[ApiToken("t", WRITER, ("*",))], visible={"d": ["_event"]})


@pytest.mark.asyncio
async def test_a_paused_execution_holds_what_is_sent_and_takes_it_on_resume(shop: Shop) -> None:
    execution_id = _execution(await shop.checkout("o-11"))["id"]
    assert (await shop.call("POST", f"/executions/{execution_id}/pause", READER)).status_code == 403
    paused = await shop.call("POST", f"/executions/{execution_id}/pause")
    assert paused.status_code == 200
    assert paused.json()["execution"]["status"] == "paused"
    again = await shop.call("POST", f"/executions/{execution_id}/pause")
    assert again.status_code == 409
    assert again.json()["error"] == "not_active"
    sent = await shop.call("POST", "/addresses/web/order/o-11/events", json={"event": "pay"})
    outcome = sent.json()["outcome"]
    assert outcome["outcome"] == "held"
    assert outcome["execution_id"] == execution_id
    assert outcome["execution"] is None  # nothing stepped
    resumed = await shop.call("POST", f"/executions/{execution_id}/resume")
    assert resumed.status_code == 200
    assert resumed.json()["execution"]["final_state"] == "paid"
    assert "1 held events stepped in" in resumed.json()["done"]
    not_paused = await shop.call("POST", f"/executions/{execution_id}/resume")
    assert not_paused.status_code == 409
    assert not_paused.json()["error"] == "not_paused"
    rows = (await Audit(shop.db.adapter.engine, shop.db.adapter.tables).entries()).rows
    assert [(r.actor, r.action, r.outcome) for r in reversed(rows)] == [
        ("api:shop", "pause", "done"),
        ("api:shop", "resume", "done"),
    ]


@pytest.mark.asyncio
async def test_a_bulk_action_is_previewed_confirmed_and_followed(shop: Shop) -> None:
    ids = [_execution(await shop.checkout(f"b-{n}"))["id"] for n in range(6)]
    body: dict[str, Any] = {"action": "pause", "filter": {"scope": "web", "document": "order"}}
    preview = await shop.call("POST", "/bulk", json=body)
    assert preview.json() == {"action": "pause", "selected": 6}
    assert (await shop.call("POST", "/bulk", READER, json=body)).status_code == 403
    assert (await shop.call("POST", "/bulk", OTHER, json=body)).status_code == 403
    unscoped = await shop.call("POST", "/bulk", json={"action": "pause"})
    assert unscoped.status_code == 400
    changed = await shop.call("POST", "/bulk", json=body | {"confirm": 5})
    assert changed.status_code == 409
    assert changed.json()["error"] == "preview_changed"
    started = await shop.call("POST", "/bulk", json=body | {"confirm": 6})
    assert started.status_code == 202
    job = started.json()["job"]
    progress: dict[str, Any] = {}
    for _ in range(200):
        progress = (await shop.call("GET", f"/bulk/{job}", READER)).json()
        if progress["finished"]:
            break
        await asyncio.sleep(0.05)
    assert (progress["done"], progress["skipped"], progress["failed"]) == (6, 0, 0)
    for execution_id in ids:
        read = await shop.call("GET", f"/executions/{execution_id}", READER)
        assert read.json()["status"] == "paused"
    rows = (await Audit(shop.db.adapter.engine, shop.db.adapter.tables).entries()).rows
    assert sorted((r.actor, r.action) for r in rows).count(("api:shop", "pause")) == 6
    assert ("api:shop", "bulk") in [(r.actor, r.action) for r in rows]
    for bad in ({"action": "delete"}, {"action": "pause", "filter": {"colour": "red"}}):
        assert (await shop.call("POST", "/bulk", ADMIN, json=bad)).status_code == 400
    assert (await shop.call("GET", "/bulk/nope", READER)).status_code == 404


async def _finished(shop: Shop, job: str) -> dict[str, Any]:
    progress: dict[str, Any] = {}
    for _ in range(200):
        progress = (await shop.call("GET", f"/bulk/{job}", READER)).json()
        if progress["finished"]:
            return progress
        await asyncio.sleep(0.05)
    raise AssertionError(f"the bulk run did not finish: {progress}")


@pytest.mark.asyncio
async def test_a_bulk_migrate_moves_the_selected_executions_onto_a_stored_revision(
    shop: Shop,
) -> None:
    ids = [_execution(await shop.checkout(f"m-{n}"))["id"] for n in range(3)]
    # The revision renames the state the orders wait in: they move with a map.
    revision = compile_chart(
        CHECKOUT.format(receipt="").replace("awaiting_payment", "to_pay"), name="order"
    )
    router = shop.api.router
    assert isinstance(router, Router)
    await router.storage.save_chart(revision)
    content_hash = revision.identity.content_hash
    body: dict[str, Any] = {
        "action": "migrate",
        "revision": content_hash,
        "map": {"awaiting_payment": "to_pay"},
        "filter": {"scope": "web"},
    }
    preview = await shop.call("POST", "/bulk", json=body)
    assert preview.json() == {"action": "migrate", "selected": 3}
    started = await shop.call("POST", "/bulk", json=body | {"confirm": 3})
    assert started.status_code == 202
    progress = await _finished(shop, started.json()["job"])
    assert (progress["done"], progress["parked"], progress["failed"]) == (3, 0, 0)
    assert (progress["state"], progress["action"]) == ("finished", "migrate")
    job = started.json()["job"]
    assert (await shop.call("GET", f"/bulk/{job}", OTHER)).status_code == 404  # scope web
    for execution_id in ids:
        read = (await shop.call("GET", f"/executions/{execution_id}", READER)).json()
        assert (read["status"], read["configuration"]) == ("active", ["to_pay"])
    assert (await shop.call("POST", "/bulk", json=body)).json()["selected"] == 0
    unknown = await shop.call("POST", "/bulk", json=body | {"revision": "0" * 64})
    assert (unknown.status_code, unknown.json()["error"]) == (404, "no_revision")
    for bad in ({"map": ["x"]}, {"map": {"a": 1}}, {"data": 3}, {"revision": ""}):
        answer = await shop.call("POST", "/bulk", json=body | bad)
        assert answer.status_code == 400, bad
    retry = await shop.call("POST", "/bulk", json={"action": "retry", "filter": {"scope": "web"}})
    assert retry.json() == {"action": "retry", "selected": 0}
