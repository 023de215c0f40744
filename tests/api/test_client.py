"""The Python client of the HTTP API: every call's request, every answer parsed, every
refusal mapped to its error, through a mock transport (sync and async alike); then the
async client against the real API on each database."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tests.console.conftest import ASSIGN_AT, CHECKOUT, shop_bindings
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

from statifier.api import Api, ApiToken, Rights
from statifier.chart import compile_chart
from statifier.client import (
    UNSET,
    Address,
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    Execution,
    Forbidden,
    MigrateTo,
    NotFound,
    Outcome,
    Page,
    RaisedError,
    Routed,
    Sent,
    Summary,
    Unauthorized,
    Waited,
)
from statifier.expr import UNDEFINED, Duration, tagged
from statifier.router import Router, StaticResolver

TOKEN = "client-token-" + "t" * 24
BASE = "http://api.test/base"

EXECUTION: dict[str, Any] = {
    "id": "e-1",
    "document": "order",
    "status": "active",
    "configuration": ["awaiting_payment"],
    "final_state": None,
    "failure": None,
    "errors": [
        {
            "name": "error.execution",
            "taken": False,
            "message": "cannot multiply",
            "element": "assign",
            "line": 5,
            "column": 7,
            "reason": "multiply",
            "sendid": None,
            "via": "api",
            "seq": 2,
            "recorded_at": "2026-09-19T08:00:01+00:00",
        }
    ],
    "error_count": 1,
    "data": {
        "total": 42,
        "due": {"$type": "date", "value": "2026-10-01"},
        "grace": {"$type": "duration", "value": {"days": 3}},
        "note": {"$type": "undefined"},
        "lines": [{"sku": "a", "at": {"$type": "datetime", "value": "2026-09-19T08:00:00Z"}}],
    },
    "addresses": [{"scope": "web", "document": "order", "key": "o-1"}],
    "created_at": "2026-09-19T08:00:00+00:00",
    "updated_at": "2026-09-19T08:00:01.500000+00:00",
    "ended_at": None,
}
PARSED = Execution(
    id="e-1",
    document="order",
    status="active",
    configuration=("awaiting_payment",),
    final_state=None,
    failure=None,
    errors=(
        RaisedError(
            name="error.execution",
            taken=False,
            message="cannot multiply",
            element="assign",
            line=5,
            column=7,
            reason="multiply",
            sendid=None,
            via="api",
            seq=2,
            recorded_at=datetime(2026, 9, 19, 8, 0, 1, tzinfo=UTC),
        ),
    ),
    error_count=1,
    data={
        "total": 42,
        "due": date(2026, 10, 1),
        "grace": Duration(days=3),
        "note": UNDEFINED,
        "lines": [{"sku": "a", "at": datetime(2026, 9, 19, 8, 0, tzinfo=UTC)}],
    },
    addresses=(Address("web", "order", "o-1"),),
    created_at=datetime(2026, 9, 19, 8, 0, tzinfo=UTC),
    updated_at=datetime(2026, 9, 19, 8, 0, 1, 500000, tzinfo=UTC),
    ended_at=None,
)
OUTCOME: dict[str, Any] = {
    "binding": "checkouts",
    "outcome": "created_and_delivered",
    "key": "o-1",
    "execution_id": "e-1",
    "reason": None,
    "execution": EXECUTION,
}
SUMMARY: dict[str, Any] = {
    "id": "e-2",
    "document": "order",
    "status": "completed",
    "final_state": "paid",
    "failure": None,
    "error_count": 0,
    "created_at": "2026-09-19T08:00:00+00:00",
    "updated_at": "2026-09-19T09:00:00+00:00",
    "ended_at": "2026-09-19T09:00:00+00:00",
}

Handler = Callable[[httpx.Request], httpx.Response]


class Recording:
    """A mock API: answers each request with the next of ``answers`` (status, JSON or
    bytes), and keeps the requests."""

    def __init__(self, *answers: tuple[int, object]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body = self.answers.pop(0)
        if isinstance(body, bytes):
            return httpx.Response(status, content=body, headers={"Content-Type": "text/html"})
        return httpx.Response(status, json=body)

    @property
    def request(self) -> httpx.Request:
        (only,) = self.requests
        return only

    def body(self) -> Any:
        return json.loads(self.request.content)


class Calls:
    """One client kind (sync or async) over a mock API: ``calls(handler, "get", "e-1")``
    makes the call and gives its answer (``iterate`` as a list)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, handler: Handler, method: str, *args: Any, **kwargs: Any) -> Any:
        transport = httpx.MockTransport(handler)
        if self.kind == "sync":
            with Client(BASE, TOKEN, transport=transport) as client:
                answer = getattr(client, method)(*args, **kwargs)
                return list(answer) if method == "iterate" else answer

        async def run() -> Any:
            async with AsyncClient(BASE, TOKEN, transport=transport) as client:
                if method == "iterate":
                    return [row async for row in client.iterate(*args, **kwargs)]
                return await getattr(client, method)(*args, **kwargs)

        return asyncio.run(run())


@pytest.fixture(params=["sync", "async"])
def calls(request: pytest.FixtureRequest) -> Calls:
    return Calls(request.param)


# -- the requests and their answers ---------------------------------------------------


def test_a_route_posts_the_event_and_parses_each_outcome(calls: Calls) -> None:
    no_match: dict[str, Any] = {"binding": "payments", "outcome": "no_match", "key": None}
    no_match |= {"execution_id": None, "reason": None, "execution": None}
    api = Recording((200, {"message_id": "m-1", "outcomes": [OUTCOME, no_match]}))
    data = {"kind": "checkout", "order": "o-1", "amount": 21.5, "tags": ["a"]}
    routed = calls(api, "route", "shop", "web", data, idempotency_key="m-1")
    assert routed == Routed(
        "m-1",
        (
            Outcome("checkouts", "created_and_delivered", "o-1", "e-1", None, PARSED),
            Outcome("payments", "no_match", None, None, None, None),
        ),
    )
    request = api.request
    assert (request.method, request.url.path) == ("POST", "/base/events")
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Idempotency-Key"] == "m-1"
    assert request.headers["Content-Type"] == "application/json"
    assert api.body() == {"source": "shop", "scope": "web", "data": data}


def test_a_route_without_a_key_sends_no_header(calls: Calls) -> None:
    api = Recording((200, {"message_id": "random", "outcomes": []}))
    assert calls(api, "route", "shop", "web", {}) == Routed("random", ())
    assert "Idempotency-Key" not in api.request.headers


def test_a_send_encodes_its_data_tagged_and_leaves_unset_data_out(calls: Calls) -> None:
    answer = {"message_id": "m-2", "outcome": OUTCOME | {"outcome": "delivered"}}
    api = Recording(*[(200, answer)] * 4)
    data = {"due": date(2026, 10, 1), "grace": Duration(hours=2), "n": None}
    sent = calls(api, "send", "e-1", "checkout", data, idempotency_key="k")
    assert sent == Sent("m-2", Outcome("checkouts", "delivered", "o-1", "e-1", None, PARSED))
    assert api.request.url.path == "/base/executions/e-1/events"
    assert api.body() == {"event": "checkout", "data": tagged.encode(data)}
    assert api.body()["data"]["due"] == {"$type": "date", "value": "2026-10-01"}
    api.requests.clear()
    calls(api, "send", "e-1", "pay")
    assert api.body() == {"event": "pay"}
    api.requests.clear()
    calls(api, "send", "e-1", "pay", None, idempotency_key=None)
    assert api.body() == {"event": "pay", "data": None}  # null is data
    api.requests.clear()
    calls(api, "send", "e-1", "pay", UNSET)
    assert api.body() == {"event": "pay"}


def test_a_send_to_an_address_quotes_each_part_whole(calls: Calls) -> None:
    dropped: dict[str, Any] = {"binding": "api", "outcome": "dropped", "key": "o 1/2?x#y"}
    dropped |= {"execution_id": None, "reason": "no_execution", "execution": None}
    api = Recording((200, {"message_id": "m-3", "outcome": dropped}))
    sent = calls(api, "send_to", "web/eu", "order", "o 1/2?x#y", "pay", 1)
    assert sent.outcome == Outcome("api", "dropped", "o 1/2?x#y", None, "no_execution", None)
    assert api.request.url.raw_path == b"/base/addresses/web%2Feu/order/o%201%2F2%3Fx%23y/events"
    assert api.body() == {"event": "pay", "data": 1}


def test_get_and_cancel_answer_the_execution(calls: Calls) -> None:
    cancelled = EXECUTION | {"status": "cancelled", "configuration": []}
    cancelled |= {"ended_at": "2026-09-19T10:00:00+01:00"}
    api = Recording((200, EXECUTION), (200, {"execution": cancelled}))
    assert calls(api, "get", "e/1") == PARSED
    assert api.requests[0].url.raw_path == b"/base/executions/e%2F1"
    assert api.requests[0].method == "GET"
    api.requests.clear()
    found = calls(api, "cancel", "e-1")
    assert (api.request.method, api.request.url.path) == ("POST", "/base/executions/e-1/cancel")
    assert found == replace(
        PARSED,
        status="cancelled",
        configuration=(),
        ended_at=datetime(2026, 9, 19, 9, 0, tzinfo=UTC),
    )
    assert found.ended_at.utcoffset() == timedelta(hours=1)


def test_a_list_sends_the_filters_given_and_iterate_follows_the_cursor(calls: Calls) -> None:
    first = {"executions": [SUMMARY, SUMMARY | {"id": "e-3"}], "next_cursor": "c-1"}
    last = {"executions": [SUMMARY | {"id": "e-4", "ended_at": None}], "next_cursor": None}
    api = Recording((200, first))
    page = calls(api, "list", scope="web", status="completed", limit=2, cursor="c-0")
    row = Summary(
        id="e-2",
        document="order",
        status="completed",
        final_state="paid",
        failure=None,
        error_count=0,
        created_at=datetime(2026, 9, 19, 8, 0, tzinfo=UTC),
        updated_at=datetime(2026, 9, 19, 9, 0, tzinfo=UTC),
        ended_at=datetime(2026, 9, 19, 9, 0, tzinfo=UTC),
    )
    assert page == Page((row, replace(row, id="e-3")), "c-1")
    assert api.request.url.path == "/base/executions"
    assert dict(api.request.url.params) == {
        "scope": "web",
        "status": "completed",
        "limit": "2",
        "cursor": "c-0",
    }
    api = Recording((200, first), (200, last))
    rows = calls(api, "iterate", scope="web", key="o 1", final_state="paid", limit=2)
    assert [r.id for r in rows] == ["e-2", "e-3", "e-4"]
    assert rows[2].ended_at is None
    params = [dict(request.url.params) for request in api.requests]
    wanted = {"scope": "web", "key": "o 1", "final_state": "paid", "limit": "2"}
    assert params == [wanted, wanted | {"cursor": "c-1"}]


def test_a_wait_asks_for_a_state_or_the_end_and_outwaits_it(calls: Calls) -> None:
    answer = {"reached": True, "execution": EXECUTION}
    api = Recording((200, answer), (200, answer | {"reached": False}))
    assert calls(api, "wait", "e-1", state="paid", timeout=40) == Waited(True, PARSED)
    request = api.requests[0]
    assert request.url.path == "/base/executions/e-1/wait"
    assert dict(request.url.params) == {"state": "paid", "timeout": "40.0"}
    # The request waits longer than the API does (the client's timeout is 30 s).
    assert request.extensions["timeout"]["read"] > 40
    waited = calls(api, "wait", "e-1", end=True, timeout=0.5)
    assert waited.reached is False
    assert dict(api.requests[1].url.params) == {"end": "true", "timeout": "0.5"}
    wrongs: list[dict[str, Any]] = [
        {},
        {"state": "paid", "end": True},
        {"end": True, "timeout": -1},
    ]
    for wrong in wrongs:
        with pytest.raises(ValueError, match=r"wait for one|timeout is seconds"):
            calls(api, "wait", "e-1", **wrong)
    with pytest.raises(ValueError, match="timeout is seconds"):
        calls(api, "wait", "e-1", end=True, timeout=float("nan"))
    assert len(api.requests) == 2  # nothing was sent for a wrong wait


# -- refusals and answers that are not the API's --------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ApiError),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (408, ApiError),
        (409, Conflict),
        (413, ApiError),
        (500, ApiError),
        (503, ApiError),
    ],
)
def test_each_refusal_raises_its_error(calls: Calls, status: int, kind: type[ApiError]) -> None:
    api = Recording((status, {"error": "some_rule", "message": "one line"}))
    with pytest.raises(ApiError) as raised:
        calls(api, "get", "e-1")
    assert type(raised.value) is kind
    error = raised.value
    assert (error.status, error.error, error.message) == (status, "some_rule", "one line")
    assert str(error) == f"{status} some_rule: one line"
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again)) == (kind, str(error))


def test_a_refusal_of_each_call_is_raised(calls: Calls) -> None:
    refusal = (409, {"error": "ended", "message": "it has ended"})
    each: list[tuple[str, tuple[Any, ...]]] = [
        ("route", ("shop", "web", {})),
        ("send", ("e-1", "pay")),
        ("send_to", ("web", "order", "o-1", "pay")),
        ("get", ("e-1",)),
        ("list", ()),
        ("iterate", ()),
        ("wait", ("e-1",)),
        ("cancel", ("e-1",)),
    ]
    for method, args in each:
        kwargs = {"end": True} if method == "wait" else {}
        with pytest.raises(Conflict, match="ended"):
            calls(Recording(refusal), method, *args, **kwargs)


NOT_THE_API: list[tuple[int, object, str]] = [
    (200, b"<html>a proxy</html>", "not a JSON object"),
    (200, [EXECUTION], "not a JSON object"),
    (200, {k: v for k, v in EXECUTION.items() if k != "status"}, "status is missing"),
    (200, EXECUTION | {"status": "sleeping"}, "status 'sleeping'"),
    (200, EXECUTION | {"error_count": "1"}, "error_count is not a whole number"),
    (200, EXECUTION | {"error_count": True}, "error_count is not a whole number"),
    (200, EXECUTION | {"error_count": None}, "error_count is null"),
    (200, EXECUTION | {"id": 7}, "id is not a string"),
    (200, EXECUTION | {"configuration": [1]}, "configuration is not a list of state ids"),
    (200, EXECUTION | {"configuration": "a"}, "configuration is not a list"),
    (200, EXECUTION | {"created_at": "yesterday"}, "created_at is not an ISO 8601 time"),
    (200, EXECUTION | {"created_at": "2026-09-19T08:00:00"}, "created_at has no time zone"),
    (200, EXECUTION | {"data": {"d": {"$type": "date"}}}, "data: malformed tagged value"),
    (200, EXECUTION | {"data": []}, "data is not a JSON object"),
    (200, EXECUTION | {"addresses": [{"scope": "web"}]}, "document is missing"),
    (200, EXECUTION | {"errors": ["boom"]}, "an error is not a JSON object"),
    (200, EXECUTION | {"errors": [{"name": "e"}]}, "taken is missing"),
]


@pytest.mark.parametrize(("status", "body", "why"), NOT_THE_API)
def test_an_answer_that_is_not_the_apis_json_is_a_bad_answer(
    calls: Calls, status: int, body: object, why: str
) -> None:
    with pytest.raises(ApiError) as raised:
        calls(Recording((status, body)), "get", "e-1")
    error = raised.value
    assert type(error) is ApiError
    assert (error.status, error.error) == (status, "bad_answer")
    assert error.message.startswith("the answer to GET /base/executions/e-1: ")
    assert why in error.message


def test_bad_answers_of_the_other_shapes(calls: Calls) -> None:
    bad_outcome = OUTCOME | {"outcome": "x"}
    no_time = SUMMARY | {"updated_at": None}
    cases: list[tuple[str, tuple[Any, ...], object, str]] = [
        ("route", ("s", "w", {}), {"message_id": "m", "outcomes": [bad_outcome]}, "outcome 'x'"),
        ("route", ("s", "w", {}), {"outcomes": []}, "message_id is missing"),
        ("send", ("e", "x"), {"message_id": "m", "outcome": None}, "outcome is null"),
        (
            "send",
            ("e", "x"),
            {"message_id": "m", "outcome": OUTCOME | {"execution": 1}},
            "execution is not a JSON",
        ),
        ("list", (), {"executions": [no_time], "next_cursor": None}, "updated_at is null"),
        ("list", (), {"executions": [SUMMARY]}, "next_cursor is missing"),
        ("list", (), {"executions": ["e-1"], "next_cursor": None}, "a row is not a JSON object"),
        ("wait", ("e",), {"reached": 1, "execution": EXECUTION}, "reached is not true or false"),
        ("cancel", ("e",), EXECUTION, "execution is missing"),
    ]
    for method, args, body, why in cases:
        kwargs = {"end": True} if method == "wait" else {}
        with pytest.raises(ApiError, match="bad_answer") as raised:
            calls(Recording((200, body)), method, *args, **kwargs)
        assert why in raised.value.message, (method, raised.value.message)


def test_a_refusal_that_is_not_the_apis_json_keeps_its_status(calls: Calls) -> None:
    for status, body, kind in [
        (502, b"<html>bad gateway</html>", ApiError),
        (404, b"<html>not here</html>", NotFound),
        (401, {"detail": "no"}, Unauthorized),
        (500, {"error": 5, "message": "x"}, ApiError),
    ]:
        with pytest.raises(ApiError) as raised:
            calls(Recording((status, body)), "get", "e-1")
        assert type(raised.value) is kind
        assert (raised.value.status, raised.value.error) == (status, "bad_answer")
        assert "not the API's JSON error" in raised.value.message


def test_the_token_appears_in_no_error_and_no_repr(calls: Calls) -> None:
    echoed = f"you sent Bearer {TOKEN}"
    with pytest.raises(Unauthorized) as raised:
        calls(Recording((401, {"error": "unauthorized", "message": echoed})), "get", "e-1")
    assert TOKEN not in str(raised.value)
    assert TOKEN not in repr(raised.value)
    assert raised.value.message == "you sent Bearer ***"
    for status, body in [(502, echoed.encode()), (200, {"echo": echoed})]:
        with pytest.raises(ApiError) as bad:
            calls(Recording((status, body)), "get", TOKEN)  # even in the path
        assert TOKEN not in str(bad.value)
        assert TOKEN not in repr(bad.value)
    assert repr(Client(BASE, TOKEN)) == "Client('http://api.test/base/')"
    assert repr(AsyncClient(BASE, TOKEN)) == "AsyncClient('http://api.test/base/')"
    for wrong in ["", " x", "a b", "line\nbreak", "é" * 20]:
        with pytest.raises(ValueError, match="token") as refused:
            Client(BASE, wrong)
        if wrong:
            assert wrong not in str(refused.value)


def test_what_is_not_json_is_refused_before_a_request(calls: Calls) -> None:
    api = Recording()
    with pytest.raises(ValueError, match="not JSON"):
        calls(api, "route", "shop", "web", {"amount": float("nan")})
    with pytest.raises(ValueError, match="not JSON"):
        calls(api, "route", "shop", "web", {"on": date(2026, 1, 1)})  # plain JSON only
    with pytest.raises(ValueError, match="not JSON"):
        calls(api, "send", "e-1", "pay", float("inf"))
    with pytest.raises(tagged.TaggedValueError):
        calls(api, "send", "e-1", "pay", {"$type": "date", "value": "2026-01-01"})
    assert api.requests == []


def test_a_client_closes_its_transport_and_checks_its_timeout() -> None:
    closed: list[str] = []

    class Closing(httpx.MockTransport):
        def close(self) -> None:
            closed.append("sync")

        async def aclose(self) -> None:
            closed.append("async")

    transport = Closing(Recording((200, EXECUTION)))
    with Client(BASE, TOKEN, transport=transport) as client:
        client.get("e-1")
    assert closed == ["sync"]

    async def run() -> None:
        async with AsyncClient(BASE, TOKEN, transport=transport) as client:
            await client.get("e-1")

    transport = Closing(Recording((200, EXECUTION)))
    asyncio.run(run())
    assert closed == ["sync", "async"]
    for wrong in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            Client(BASE, TOKEN, timeout=wrong)
        with pytest.raises(ValueError, match="timeout"):
            AsyncClient(BASE, TOKEN, timeout=wrong)


# -- against the API, on each database ------------------------------------------------

WRITER = "writer-token-" + "w" * 20
READER = "reader-token-" + "r" * 20


@dataclass
class Shop:
    db: RouterDb
    api: Api
    client: AsyncClient
    transport: httpx.ASGITransport

    def as_(self, token: str) -> AsyncClient:
        return AsyncClient("http://api", token, transport=self.transport)

    async def checkout(self, order: str, amount: object = 20) -> Outcome:
        data = {"kind": "checkout", "order": order, "amount": amount, "timeout": "1h"}
        routed = await self.client.route("shop", "web", data)
        self.db.clock.advance(timedelta(seconds=1))
        (outcome,) = [o for o in routed.outcomes if o.binding == "checkouts"]
        return outcome


@pytest_asyncio.fixture
async def shop(router_db: RouterDb) -> AsyncIterator[Shop]:  # noqa: F811 - the fixture
    machine = compile_chart(CHECKOUT.format(receipt=""), name="order")
    router = router_db.router(shop_bindings(), resolver=StaticResolver({"order": machine}))
    api = Api(
        router,
        tokens=[
            ApiToken("shop", WRITER, ("web",), Rights.WRITE),
            ApiToken("viewer", READER, ("web",)),
        ],
        visible={"order": ["total"]},
        poll=0.05,
    )
    transport = httpx.ASGITransport(app=api.app)
    async with AsyncClient("http://api", WRITER, transport=transport) as client:
        yield Shop(router_db, api, client, transport)
    await api.close()


@pytest.mark.asyncio
async def test_a_routed_event_answers_the_execution_its_commit_left(shop: Shop) -> None:
    outcome = await shop.checkout("o-1", amount=21)
    assert (outcome.outcome, outcome.key) == ("created_and_delivered", "o-1")
    execution = outcome.execution
    assert execution is not None
    assert execution.id == outcome.execution_id
    assert (execution.status, execution.configuration) == ("active", ("awaiting_payment",))
    assert execution.data == {"total": 42}
    assert execution.addresses == (Address("web", "order", "o-1"),)
    assert execution.document == "order"
    record = await shop.db.adapter.fetch_execution(execution.id)
    assert record is not None
    assert execution.updated_at == record.updated_at
    assert execution.created_at is not None
    assert execution.created_at.utcoffset() == timedelta(0)
    read = await shop.client.get(execution.id)
    assert replace(read, errors=()) == replace(execution, errors=())
    nothing = await shop.client.route("shop", "web", {})
    assert [o.outcome for o in nothing.outcomes] == ["no_match", "no_match"]


@pytest.mark.asyncio
async def test_sends_carry_tagged_data_and_their_step_s_errors(shop: Shop) -> None:
    execution_id = (await shop.checkout("o-2", amount=5)).execution_id
    assert execution_id is not None
    sent = await shop.client.send(execution_id, "checkout", {"amount": 8})
    assert sent.outcome.outcome == "delivered"
    assert sent.outcome.execution is not None
    assert sent.outcome.execution.data == {"total": 16}
    failed = await shop.client.send(execution_id, "checkout", {"amount": date(2026, 1, 1)})
    assert failed.outcome.execution is not None
    (error,) = failed.outcome.execution.errors
    assert error.name == "error.execution"
    # The <assign> of awaiting_payment's checkout, six lines below the first one.
    assert (error.element, error.line, error.column) == ("assign", ASSIGN_AT[0] + 6, ASSIGN_AT[1])
    # The chart got a date (the tagged encoding decoded), not a map.
    assert error.message is not None
    assert "date" in error.message, error.message
    assert failed.outcome.execution.error_count == 1
    assert failed.outcome.execution.data == {"total": 16}
    key = "pay-o-2"
    one = await shop.client.send_to("web", "order", "o-2", "pay", idempotency_key=key)
    two = await shop.client.send_to("web", "order", "o-2", "pay", idempotency_key=key)
    assert one.message_id == two.message_id == key
    assert one.outcome.execution is not None
    assert (one.outcome.execution.status, one.outcome.execution.final_state) == (
        "completed",
        "paid",
    )
    assert one.outcome.execution.ended_at is not None
    assert two.outcome.outcome == "duplicate"
    nobody = await shop.client.send_to("web", "order", "nobody", "pay")
    assert (nobody.outcome.outcome, nobody.outcome.reason) == ("dropped", "no_execution")


@pytest.mark.asyncio
async def test_the_apis_refusals_are_the_clients_errors(shop: Shop) -> None:
    execution_id = (await shop.checkout("o-3")).execution_id
    assert execution_id is not None
    async with shop.as_("unknown-token-" + "u" * 20) as stranger:
        with pytest.raises(Unauthorized) as unauthorized:
            await stranger.get(execution_id)
    assert unauthorized.value.error == "unauthorized"
    async with shop.as_(READER) as reader:
        assert (await reader.get(execution_id)).id == execution_id
        with pytest.raises(Forbidden):
            await reader.route("shop", "web", {"kind": "pay", "order": "o-3"})
        with pytest.raises(Forbidden):
            await reader.cancel(execution_id)
        with pytest.raises(Forbidden):
            await reader.list(scope="partners")
    with pytest.raises(NotFound) as missing:
        await shop.client.get("nobody")
    assert missing.value.error == "no_execution"
    with pytest.raises(NotFound, match="no_source"):
        await shop.client.route("elsewhere", "web", {})
    with pytest.raises(ApiError) as bad:
        await shop.client.list(scope="web", limit=0)
    assert (type(bad.value), bad.value.status, bad.value.error) == (ApiError, 400, "bad_filter")
    with pytest.raises(ApiError, match="bad_cursor"):
        await shop.client.list(scope="web", cursor="x")
    cancelled = await shop.client.cancel(execution_id)
    assert cancelled.status == "cancelled"
    assert cancelled.ended_at is not None
    with pytest.raises(Conflict) as ended:
        await shop.client.cancel(execution_id)
    assert ended.value.error == "ended"
    assert WRITER not in str(ended.value)


@pytest.mark.asyncio
async def test_a_list_is_walked_page_by_page(shop: Shop) -> None:
    made = [(await shop.checkout(order)).execution_id for order in ("o-4", "o-5", "o-6")]
    await shop.client.send_to("web", "order", "o-5", "pay")
    rows = [row async for row in shop.client.iterate(scope="web", limit=2)]
    assert [row.id for row in rows] == made[::-1]  # newest first
    first = await shop.client.list(scope="web", limit=2)
    assert len(first.rows) == 2
    assert first.next_cursor is not None
    (paid,) = (await shop.client.list(scope="web", final_state="paid")).rows
    assert (paid.id, paid.status, paid.final_state) == (made[1], "completed", "paid")
    assert paid.ended_at is not None
    assert paid.created_at.utcoffset() == timedelta(0)
    (keyed,) = (await shop.client.list(scope="web", key="o-6")).rows
    assert keyed.id == made[2]
    assert (await shop.client.list(scope="web", status="cancelled")).rows == ()


@pytest.mark.asyncio
async def test_a_wait_returns_when_the_state_is_reached_or_the_time_is_up(shop: Shop) -> None:
    execution_id = (await shop.checkout("o-7")).execution_id
    assert execution_id is not None
    waiting = asyncio.create_task(shop.client.wait(execution_id, state="paid", timeout=5))
    ending = asyncio.create_task(shop.client.wait(execution_id, end=True, timeout=5))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await shop.client.send_to("web", "order", "o-7", "pay")
    for task in (waiting, ending):
        waited = await asyncio.wait_for(task, 5)
        assert waited.reached is True
        assert waited.execution.final_state == "paid"
    other = (await shop.checkout("o-8")).execution_id
    assert other is not None
    late = await shop.client.wait(other, state="paid", timeout=0.2)
    assert late.reached is False
    assert late.execution.configuration == ("awaiting_payment",)
    with pytest.raises(NotFound):
        await shop.client.wait("nobody", end=True, timeout=0)


@pytest.mark.asyncio
async def test_a_paused_execution_holds_a_send_until_it_resumes(shop: Shop) -> None:
    execution_id = (await shop.checkout("o-9")).execution_id
    assert execution_id is not None
    paused = await shop.client.pause(execution_id)
    assert paused.status == "paused"
    with pytest.raises(Conflict) as twice:
        await shop.client.pause(execution_id)
    assert twice.value.error == "not_active"
    held = await shop.client.send(execution_id, "pay")
    assert held.outcome.outcome == "held"
    assert held.outcome.execution is None
    resumed = await shop.client.resume(execution_id)
    assert (resumed.status, resumed.final_state) == ("completed", "paid")
    with pytest.raises(Conflict):
        await shop.client.resume(execution_id)


@pytest.mark.asyncio
async def test_a_bulk_action_is_previewed_started_and_followed(shop: Shop) -> None:
    for order in ("b-1", "b-2", "b-3"):
        await shop.checkout(order)
    selected = await shop.client.bulk_preview("pause", scope="web")
    assert selected == 3
    with pytest.raises(Conflict) as changed:
        await shop.client.bulk("pause", confirm=2, scope="web")
    assert changed.value.error == "preview_changed"
    run = await shop.client.bulk("pause", confirm=3, scope="web")
    assert (run.action, run.selected) == ("pause", 3)
    for _ in range(200):
        run = await shop.client.bulk_progress(run.job)
        if run.finished:
            break
        await asyncio.sleep(0.05)
    assert (run.done, run.skipped, run.failed, run.error, run.state) == (3, 0, 0, None, "finished")
    assert await shop.client.bulk_preview("resume", scope="web") == 3
    revision = compile_chart(CHECKOUT.format(receipt="<log expr=\"'r2'\"/>"), name="order")
    router = shop.api.router
    assert isinstance(router, Router)
    await router.storage.save_chart(revision)
    to = MigrateTo(revision.identity.content_hash)
    assert await shop.client.bulk_preview("migrate", to=to, scope="web") == 3
    run = await shop.client.bulk("migrate", to=to, confirm=3, scope="web")
    for _ in range(200):
        run = await shop.client.bulk_progress(run.job)
        if run.finished:
            break
        await asyncio.sleep(0.05)
    assert (run.action, run.done, run.parked, run.failed, run.last_error) == (
        "migrate",
        3,
        0,
        0,
        None,
    )
    with pytest.raises(NotFound):
        await shop.client.bulk_preview("migrate", to=MigrateTo("0" * 64), scope="web")
