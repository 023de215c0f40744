"""The form-post front on both databases: the fields are the data and the body's hash
the message id (a double-clicked submit is routed once, concurrent ones too), the scope
is the host's and never the posted one, the host's check runs before anything is
routed, and every status (200, 400, 401, 405, 408, 413, 415, 500, 503)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from tests.fronts.http_support import FORM_TYPE, client, datamodel, rows_of, slow_post
from tests.persistence.conftest import postgresql_store, sqlite_store  # noqa: F401 - fixtures
from tests.router.conftest import RouterDb, router_db, router_store  # noqa: F401 - fixtures

from statifier.chart import Machine, compile_chart
from statifier.core import Event
from statifier.fronts.webhook import MAX_FORM_FIELDS, body_message_id, form_app, handle
from statifier.persistence import Discarded, Executions, Stepped
from statifier.router import (
    Binding,
    CreatedAndDelivered,
    Routed,
    Router,
    StaticResolver,
    ledger,
)

PATRON = """<scxml xmlns="http://www.w3.org/2005/07/scxml" initial="applied">
  <datamodel><data id="name" expr="null"/><data id="topics" expr="null"/></datamodel>
  <state id="applied">
    <transition event="registered" target="registered">
      <assign location="name" expr="_event.data.name"/>
      <assign location="topics" expr="_event.data.topics"/>
    </transition>
  </state>
  <state id="registered"/>
</scxml>"""
"""A library patron's registration: the form's fields are kept."""

REGISTRATIONS = Binding(
    id="patron_registrations",
    source="patron_registration_form",
    match="true",
    key="event.card",
    document="patron",
    event="registered",
    data=("name", "topics"),
)
BRANCH = "branch_north"
FORM = {"content-type": FORM_TYPE}


@pytest_asyncio.fixture
async def db(router_db: RouterDb) -> RouterDb:  # noqa: F811 - the imported fixture
    """The router's database of each backend."""
    return router_db


def router_of(db: RouterDb, **options: Any) -> Router:
    options.setdefault("resolver", StaticResolver({"patron": compile_chart(PATRON)}))
    return db.router([REGISTRATIONS], **options)


def app_of(router: Router, **options: Any) -> Starlette:
    options.setdefault("source", "patron_registration_form")
    options.setdefault("scope", BRANCH)
    return form_app(router, **options)


def form(**fields: Any) -> bytes:
    return urlencode(fields, doseq=True).encode()


@pytest.mark.asyncio
async def test_the_fields_are_the_data_and_a_double_submit_is_one_message(db: RouterDb) -> None:
    router = router_of(db)
    body = form(card="c-1", name="Ada", topics=["maps", "rivers"], csrf="t0k")
    async with client(app_of(router)) as http:
        first = await http.post("/", content=body, headers=FORM)
        double = await http.post("/", content=body, headers=FORM)
    assert (first.status_code, double.status_code) == (200, 200)
    rows = await rows_of(router, "patron_registrations")
    assert [(row.message_id, row.outcome) for row in rows] == [
        (body_message_id(body), "created_and_delivered"),
        (body_message_id(body), "duplicate"),
    ]
    execution_id = rows[0].execution_id
    assert execution_id is not None
    model = await datamodel(router, execution_id)
    assert (model["name"], model["topics"]) == ("Ada", ["maps", "rivers"])


@pytest.mark.asyncio
async def test_concurrent_double_submits_are_routed_once(db: RouterDb) -> None:
    router = router_of(db)
    body = form(card="c-2", name="Grace")
    async with client(app_of(router)) as http:
        answers = await asyncio.gather(
            *(http.post("/", content=body, headers=FORM) for _ in range(6))
        )
    assert [answer.status_code for answer in answers] == [200] * 6
    outcomes = sorted(row.outcome for row in await ledger(router))
    assert outcomes == ["created_and_delivered"] + ["duplicate"] * 5


@pytest.mark.asyncio
async def test_the_scope_is_the_hosts_never_the_posted_one(db: RouterDb) -> None:
    router = router_of(db)

    def from_session(request: Request) -> str:
        return str(request.headers["x-session-branch"])

    body = form(card="c-3", name="Lin", scope="branch_south")
    async with client(app_of(router, scope=from_session)) as http:
        answer = await http.post("/", content=body, headers={**FORM, "x-session-branch": BRANCH})
    assert answer.status_code == 200
    assert [row.scope for row in await ledger(router)] == [BRANCH]


@pytest.mark.asyncio
async def test_the_hosts_check_refusing_is_401_and_routes_nothing(db: RouterDb) -> None:
    router = router_of(db)

    def csrf_checked(request: Request, body: bytes) -> bool:
        return request.cookies.get("csrf") == "t0k" and b"csrf=t0k" in body

    body = form(card="c-4", name="Mo", csrf="t0k")
    async with client(app_of(router, verifier=csrf_checked)) as http:
        forged = await http.post("/", content=body, headers={**FORM, "cookie": "csrf=other"})
        assert forged.status_code == 401
        assert await ledger(router) == []
        checked = await http.post("/", content=body, headers={**FORM, "cookie": "csrf=t0k"})
    assert checked.status_code == 200


@pytest.mark.asyncio
async def test_a_post_that_is_not_a_form_is_415_and_a_broken_form_400(db: RouterDb) -> None:
    router = router_of(db)
    many = "&".join(f"f{n}=v" for n in range(MAX_FORM_FIELDS + 1)).encode()
    async with client(app_of(router)) as http:
        as_json = {"content-type": "application/json"}
        json_post = await http.post("/", content=b'{"card": "c-5"}', headers=as_json)
        untyped = await http.post("/", content=form(card="c-5"))
        not_utf8 = await http.post("/", content=b"card=%ff%fe", headers=FORM)
        too_many = await http.post("/", content=many, headers=FORM)
    assert [a.status_code for a in (json_post, untyped, not_utf8, too_many)] == [415, 415, 400, 400]
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_another_method_an_oversized_or_slow_body_and_an_error(db: RouterDb) -> None:
    def unresolvable(scope: str, document: str) -> Any:
        raise LookupError("the chart store is down")

    router = router_of(db)
    async with client(app_of(router, max_body=256)) as http:
        wrong = await http.get("/")
        big = await http.post("/", content=form(card="c-6", name="x" * 300), headers=FORM)
    async with client(app_of(router_of(db, resolver=unresolvable))) as http:
        failed = await http.post("/", content=form(card="c-6", name="Kay"), headers=FORM)
    slow = await slow_post(app_of(router, timeout=0.2), "/")
    assert [wrong.status_code, big.status_code, failed.status_code, slow] == [405, 413, 500, 408]
    assert wrong.headers["allow"] == "POST"
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_the_routed_answer_is_a_created_execution(db: RouterDb) -> None:
    # The same post through the contract the app is built on.
    router = router_of(db)
    body = form(card="c-7", name="Ida")
    routed = await handle(
        router,
        scope=BRANCH,
        source="patron_registration_form",
        raw_body=body,
        data={"card": "c-7", "name": "Ida"},
    )
    assert isinstance(routed, Routed)
    (outcome,) = routed.outcomes
    assert isinstance(outcome, CreatedAndDelivered)


@pytest.mark.asyncio
async def test_handling_that_outlives_the_timeout_is_503_and_rolled_back(db: RouterDb) -> None:
    async def on_step(
        executions: Executions, execution_id: str, machine: Machine | None, event: Event
    ) -> Stepped | Discarded:
        await asyncio.sleep(2)
        return await executions.step(execution_id, machine, event)

    router = router_of(db, on_step=on_step)
    async with client(app_of(router, timeout=0.3)) as http:
        answer = await http.post("/", content=form(card="c-8", name="Bo"), headers=FORM)
    assert answer.status_code == 503
    assert await ledger(router) == []


@pytest.mark.asyncio
async def test_a_form_carries_no_json_and_no_lone_surrogate(db: RouterDb) -> None:
    """A form's one rule is strict UTF-8 (the body and every percent-escape); what looks
    like a number that is not finite is text, kept as posted."""
    router = router_of(db)
    async with client(app_of(router)) as http:
        escaped = await http.post("/", content=b"card=c-1&name=%ED%A0%80", headers=FORM)
        raw = await http.post("/", content=b"card=c-1&name=\xed\xa0\x80", headers=FORM)
        assert await ledger(router) == []
        numbers = await http.post(
            "/", content=form(card="c-2", name="1e999999", topics="NaN"), headers=FORM
        )
    assert [(a.status_code, a.text) for a in (escaped, raw)] == [
        (400, "the form is not UTF-8 (invalid continuation byte)"),
        (400, "the form is not UTF-8 (invalid continuation byte)"),
    ]
    assert numbers.status_code == 200
    [row] = await rows_of(router, "patron_registrations")
    assert row.execution_id is not None
    model = await datamodel(router, row.execution_id)
    assert (model["name"], model["topics"]) == ("1e999999", "NaN")


@pytest.mark.asyncio
async def test_each_refusal_of_a_form_is_a_warning_naming_its_rule(
    db: RouterDb, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "statifier.fronts")
    async with client(app_of(router_of(db), max_body=256)) as http:
        answers = [
            await http.post("/", content=b'{"card": "c-5"}', headers={"content-type": "text/json"}),
            await http.post("/", content=b"card=%ff", headers=FORM),
            await http.post("/", content=b"card=" + b"x" * 300, headers=FORM),
            await http.put("/", content=form(card="c-5"), headers=FORM),
        ]
    assert [a.status_code for a in answers] == [415, 400, 413, 405]
    lines = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(vars(r)["status"], vars(r)["refusal"]) for r in lines] == [
        (415, "content_type"),
        (400, "form"),
        (413, "size"),
        (405, "method"),
    ]
    assert {(vars(r)["front"], vars(r)["source"]) for r in lines} == {
        ("form", "patron_registration_form")
    }
    assert "c-5" not in caplog.text
