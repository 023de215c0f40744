"""The HTTP API into executions: send an event and get the execution's state after the
commit, wait for a state, read, list, pause, resume and cancel (``docs/api.md``).

:class:`Api` is a Starlette application answering at its own root; ``statifier serve``
mounts it at ``[api] path`` (``/api`` by default), and a host may mount ``api.app``
anywhere. Every call but ``GET /openapi.json`` presents a bearer token
(:mod:`statifier.api.tokens`): a token reaches its scopes, to read or to write.

Sends go through the router: ``POST /events`` routes an inbound event through the
bindings of its source, as a webhook post is; ``POST /addresses/{scope}/{document}/{key}/events``
and ``POST /executions/{id}/events`` deliver one event to the execution an address
names, never creating one, filed in the ledger under the id :data:`API_PLAN_ID`. Each
answers once the delivery committed, with the execution as that delivery's own step
left it. An ``Idempotency-Key`` header is the message id, so a retried call is a
duplicate within the dedupe horizon.

Every refusal answers JSON ``{"error": rule, "message": reason}`` and is logged at
warning level (the first of a kind at once, then a count per ten seconds); a failure
is answered 500, logged at error level with its traceback, and every answer is
reported as the telemetry event ``statifier.api.request`` (``duration``; ``route``,
``status``, ``refusal``, ``caller``: the token's name, never the token).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from statifier import telemetry
from statifier.api.openapi import openapi_document
from statifier.api.tokens import ALL_SCOPES, ApiToken, ApiTokens, Rights
from statifier.api.views import Address, Snapshot, execution_json, outcome_json, reached
from statifier.api.watcher import Mark, Watcher
from statifier.console.actions import Action, Done, cancel, pause, resume
from statifier.console.actions import Refused as ActionRefused
from statifier.console.audit import AuditEntry
from statifier.console.bulk import BULK_ACTIONS, BulkAction
from statifier.console.bulk_runs import LoggedRun
from statifier.console.queries import (
    MAX_PAGE,
    BadCursor,
    BadFilter,
    ExecutionFilter,
    ExecutionSummary,
)
from statifier.console.replay import SYSTEM_VARIABLES
from statifier.console.shards import StoreFailed
from statifier.console.stores import Stores
from statifier.core.events import Event
from statifier.expr import UNDEFINED, Value, tagged
from statifier.extras import MissingExtra
from statifier.fronts.http_body import DEFAULT_MAX_BODY, Refused, check_bounds, read_body
from statifier.fronts.source import Malformed, json_object
from statifier.persistence import ChartNotFound, ChartRetired, Status, Stepped, Unstorable
from statifier.persistence.sql import SqlTransaction
from statifier.persistence.step_errors import decode_error
from statifier.repeats import IntervalTally, Repeats
from statifier.router import (
    Create,
    Entry,
    InboundEvent,
    InvalidEvent,
    Plan,
    Router,
    ShardedRouter,
    address_of,
)
from statifier.sql.engines import run_on

try:
    import sqlalchemy as sa
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ModuleNotFoundError as missing:  # Starlette: the http extra
    raise MissingExtra.of(missing) from missing

__all__ = ["API_PLAN_ID", "MAX_IDEMPOTENCY_KEY", "Api"]

API_PLAN_ID: Final = "api"
"""The id the ledger files the API's sends to an address under (no binding may take it
while an :class:`Api` runs)."""
MAX_IDEMPOTENCY_KEY: Final = 200
"""The longest ``Idempotency-Key`` accepted."""
RECENT_ERRORS: Final = 20
"""How many of an execution's most recent errors a read shows."""
DEFAULT_LIMIT: Final = 50
"""The rows of a list page when no ``limit`` is given."""
_MARKS_CHUNK: Final = 500
_log = logging.getLogger("statifier.api")

Answer = Response | Refused
Endpoint = Callable[[Request, ApiToken], Awaitable[Answer]]


class Api:
    """The HTTP API over ``router``'s executions.

    Args:
        router: the router the sends go through, over the database read; or a
            :class:`~statifier.router.ShardedRouter` over several stores: an
            execution is read and acted on in its bucket's store, a list merges every
            store's (one cursor), and a bulk action runs in each store under one job
            id whose progress sums them (:mod:`statifier.console.stores`).
        tokens: who may call it (at least one).
        visible: for a document (as the bindings name it), the datamodel fields an
            answer may show of its executions; nothing else of a datamodel leaves.
        max_body: the largest request body read, in bytes.
        timeout: the seconds one call may take (a wait aside).
        max_wait: the longest wait answered, in seconds.
        poll: the seconds between two reads of the executions waited on.
        stores: the stores read and acted on, made from ``router`` if ``None``. A
            server gives its console's (:attr:`statifier.console.Console.stores`), so
            that a bulk run started through one is ``running`` when read through the
            other, not ``unfinished``: a process knows the runs going in it by the
            stores that started them.

    Raises:
        ValueError: no token, a bound that is not positive, a visible field that is a
            system variable, a binding whose id is :data:`API_PLAN_ID`, or ``stores``
            over other routers than ``router``'s.
        ApiTokenError: two tokens with one name or one secret.

    ``api.app`` is the ASGI application; :meth:`close` stops the watcher (the service
    calls it when it stops).
    """

    def __init__(
        self,
        router: Router | ShardedRouter,
        *,
        tokens: Sequence[ApiToken],
        visible: Mapping[str, Sequence[str]] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        timeout: float = 10.0,
        max_wait: float = 60.0,
        poll: float = 0.2,
        stores: Stores | None = None,
    ) -> None:
        check_bounds(max_body, timeout)
        if not tokens:
            raise ValueError("the API needs at least one token")
        given: object = max_wait
        if isinstance(given, bool) or not isinstance(given, int | float) or not given > 0:
            raise ValueError(f"max_wait is positive seconds, not {max_wait!r}")
        shown = {document: tuple(fields) for document, fields in (visible or {}).items()}
        for document, fields in shown.items():
            for name in fields:
                field: object = name
                if not isinstance(field, str) or not field or field in SYSTEM_VARIABLES:
                    raise ValueError(
                        f"visible fields of {document!r}: {name!r} is not a datamodel field"
                    )
        if stores is None:
            stores = Stores.of(router)
        routers = router.routers if isinstance(router, ShardedRouter) else (router,)
        given = [store.router for store in stores.all]
        if len(given) != len(routers) or any(
            a is not b for a, b in zip(given, routers, strict=True)
        ):
            raise ValueError("the stores given are not the router's")
        bindings = stores.all[0].router.config.bindings or ()
        if any(binding.id == API_PLAN_ID for binding in bindings):
            raise ValueError(
                f"a binding is named {API_PLAN_ID!r}: the API files its sends under that id"
            )
        self.router = router
        self.tokens = ApiTokens(tokens)
        self.visible = shown
        self.max_body = max_body
        self.timeout = float(timeout)
        self.max_wait = float(max_wait)
        self._documents = {binding.id: binding.document for binding in bindings}
        self._sources = frozenset(binding.source for binding in bindings)
        self._stores = stores
        self.watcher = Watcher(self._marks, self._load, poll=poll)
        self._repeats = IntervalTally()
        self._failures = Repeats()  # a database that is down fails every call alike
        self.app = Starlette(
            routes=[
                Route("/openapi.json", self._openapi, methods=["GET"]),
                self._route("/events", "POST", "route", self._route_event),
                self._route(
                    "/addresses/{scope}/{document}/{key}/events",
                    "POST",
                    "send_to_address",
                    self._send_to_address,
                ),
                self._route("/executions", "GET", "list", self._list),
                self._route("/executions/{id}/events", "POST", "send", self._send),
                self._route("/executions/{id}/cancel", "POST", "cancel", self._cancel),
                self._route("/executions/{id}/pause", "POST", "pause", self._pause),
                self._route("/executions/{id}/resume", "POST", "resume", self._resume),
                self._route("/executions/{id}/wait", "GET", "wait", self._wait),
                self._route("/executions/{id}", "GET", "read", self._read),
                self._route("/bulk", "POST", "bulk", self._bulk),
                self._route("/bulk/{job}", "GET", "bulk_progress", self._bulk_progress),
            ]
        )

    async def close(self) -> None:
        """Stop the watcher (waiting calls are answered with what they last saw) and
        the bulk runs still going (what they did stays done; posting the same bulk
        action again does the rest)."""
        await self.watcher.close()
        await self._stores.close()

    # -- the endpoints ------------------------------------------------------------

    async def _openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(request.scope.get("root_path", "")))

    async def _route_event(self, request: Request, caller: ApiToken) -> Answer:
        body = await self._body(request)
        if isinstance(body, Refused):
            return body
        source, scope = _text(body, "source"), _text(body, "scope")
        if isinstance(source, Refused):
            return source
        if isinstance(scope, Refused):
            return scope
        data = body.get("data", {})
        if not isinstance(data, dict):
            return Refused(400, "body", "data is a JSON object")
        if not caller.may(scope, Rights.WRITE):
            return _forbidden(scope)
        if source not in self._sources:
            return Refused(404, "no_source", f"no binding reads the source {source!r}")
        message_id = _message_id(request)
        if isinstance(message_id, Refused):
            return message_id
        try:
            event = InboundEvent(scope=scope, source=source, message_id=message_id, data=data)
        except InvalidEvent as invalid:
            return Refused(400, "event", str(invalid))
        try:
            routed = await self.router.route(event)
        except Unstorable as unstorable:
            return _unstorable(unstorable)
        except Exception as error:  # noqa: BLE001 - the caller's answer, and the log's
            return self._failed(error)

        def execution(binding_id: str, key: str, step: Stepped) -> dict[str, Any]:
            address = Address(scope, self._documents.get(binding_id, ""), key)
            return execution_json(Snapshot.of_step(step, address), self.visible)

        self.watcher.nudge()
        outcomes = [outcome_json(outcome, execution) for outcome in routed.outcomes]
        return JSONResponse({"message_id": message_id, "outcomes": outcomes})

    async def _send_to_address(self, request: Request, caller: ApiToken) -> Answer:
        params = request.path_params
        address = Address(params["scope"], params["document"], params["key"])
        if not caller.may(address.scope, Rights.WRITE):
            return _forbidden(address.scope)
        return await self._deliver(request, address)

    async def _send(self, request: Request, caller: ApiToken) -> Answer:
        execution_id = request.path_params["id"]
        found = await self._address(execution_id, caller, Rights.WRITE)
        if isinstance(found, Refused):
            return found
        if found is None:
            return Refused(
                409, "no_address", f"no address names execution {execution_id!r}: send with Python"
            )
        return await self._deliver(request, found)

    async def _deliver(self, request: Request, address: Address) -> Answer:
        body = await self._body(request)
        if isinstance(body, Refused):
            return body
        name = _text(body, "event")
        if isinstance(name, Refused):
            return name
        try:
            data: Value = tagged.decode(body["data"]) if "data" in body else UNDEFINED
        except tagged.TaggedValueError as bad:  # the caller's mistake: no retry mends it
            return Refused(400, "body", f"data is not in the tagged encoding: {_shorter(bad)}")
        message_id = _message_id(request)
        if isinstance(message_id, Refused):
            return message_id
        plan = Plan(API_PLAN_ID, document=address.document, create=Create.NEVER)
        try:
            outcome = await self.router.deliver_event(
                plan,
                scope=address.scope,
                key=address.key,
                event=Event(name, data=data),
                message_id=message_id,
                entry=Entry.API,
            )
        except Unstorable as unstorable:
            return _unstorable(unstorable)
        except Exception as error:  # noqa: BLE001 - the caller's answer, and the log's
            return self._failed(error)

        def execution(_binding_id: str, _key: str, step: Stepped) -> dict[str, Any]:
            return execution_json(Snapshot.of_step(step, address), self.visible)

        self.watcher.nudge()
        return JSONResponse({"message_id": message_id, "outcome": outcome_json(outcome, execution)})

    async def _read(self, request: Request, caller: ApiToken) -> Answer:
        execution_id = request.path_params["id"]
        found = await self._address(execution_id, caller, Rights.READ)
        if isinstance(found, Refused):
            return found
        snapshot = await self._snapshot(execution_id, found)
        if snapshot is None:
            return _no_execution(execution_id)
        return JSONResponse(execution_json(snapshot, self.visible))

    async def _list(self, request: Request, caller: ApiToken) -> Answer:
        query = request.query_params
        scope = query.get("scope")
        if scope is None and not caller.every_scope:
            return Refused(400, "bad_filter", "name the scope to list (scope=...)")
        if scope is not None and not caller.reaches(scope):
            return _forbidden(scope)
        limit = _bounded_int(query.get("limit"), DEFAULT_LIMIT, MAX_PAGE)
        if limit is None:
            return Refused(400, "bad_filter", f"limit is a whole number from 1 to {MAX_PAGE}")
        status_text = query.get("status")
        try:
            status = None if status_text is None else Status(status_text)
        except ValueError:
            statuses = ", ".join(s.value for s in Status)
            return Refused(400, "bad_filter", f"status is one of {statuses}")
        try:
            where = ExecutionFilter(
                status=status,
                document=query.get("document"),
                scope=scope,
                key=query.get("key"),
                final_state=query.get("final_state"),
                error=query.get("error"),
            )
            page = await self._stores.queries.executions(
                where, cursor=query.get("cursor"), size=limit
            )
        except BadFilter as bad:
            return Refused(400, "bad_filter", str(bad))
        except BadCursor:
            return Refused(400, "bad_cursor", "the cursor is not one this list made")
        rows = [_summary_json(row) for row in page.rows]
        return JSONResponse({"executions": rows, "next_cursor": page.next_cursor})

    async def _cancel(self, request: Request, caller: ApiToken) -> Answer:
        return await self._act(request, caller, "cancel", "ended", cancel)

    async def _pause(self, request: Request, caller: ApiToken) -> Answer:
        return await self._act(request, caller, "pause", "not_active", pause)

    async def _resume(self, request: Request, caller: ApiToken) -> Answer:
        return await self._act(request, caller, "resume", "not_paused", resume)

    async def _act(
        self, request: Request, caller: ApiToken, action: str, refusal: str, act: Action
    ) -> Answer:
        """One of the console's actions on the execution, its audit row (actor
        ``api:<token name>``) in the action's transaction; 409 ``refusal`` when the
        execution is not in a state the action applies to."""
        execution_id = request.path_params["id"]
        found = await self._address(execution_id, caller, Rights.WRITE)
        if isinstance(found, Refused):
            return found
        actor = f"api:{caller.name}"
        store = self._stores.of_execution(execution_id)

        async def record(tx: SqlTransaction, done: Done) -> None:
            entry = AuditEntry(actor, action=action, target=execution_id, detail=done.summary)
            await store.audit.record_in(tx, entry)

        try:
            done = await act(store.router, execution_id, record=record)
        except ActionRefused as refused:
            exists = await store.router.storage.find_execution(execution_id)
            if exists is None:
                return _no_execution(execution_id)
            return Refused(409, refusal, str(refused))
        snapshot = await self._snapshot(execution_id, found)
        if snapshot is None:
            return _no_execution(execution_id)
        body = {"done": done.summary, "execution": execution_json(snapshot, self.visible)}
        return JSONResponse(body)

    async def _bulk(self, request: Request, caller: ApiToken) -> Answer:
        """Preview a bulk action over a filter, or start it once confirmed with the
        count the preview gave (a count that changed since is refused, 409)."""
        body = await self._body(request)
        if isinstance(body, Refused):
            return body
        action = await self._bulk_action(body)
        if isinstance(action, Refused):
            return action
        chosen = body.get("filter", {})
        if not isinstance(chosen, dict):
            return Refused(400, "bad_filter", "filter is a JSON object")
        where = _bulk_filter(chosen)
        if isinstance(where, Refused):
            return where
        scope = where.scope
        if scope is None and not caller.every_scope:
            return Refused(400, "bad_filter", "name the scope to act in (filter.scope)")
        if not caller.may(scope or ALL_SCOPES, Rights.WRITE):
            return _forbidden(scope or ALL_SCOPES)
        counts = await self._stores.previews(action, where)
        selected = sum(counts)
        confirm = body.get("confirm")
        if confirm is None:
            return JSONResponse({"action": action.name, "selected": selected})
        if isinstance(confirm, bool) or not isinstance(confirm, int) or confirm < 0:
            # false == 0 and true == 1 in Python: they must not start a run
            return Refused(400, "body", "confirm is the count the preview answered, an integer")
        if confirm != selected:
            return Refused(
                409, "preview_changed", f"{selected} executions are selected now; confirm those"
            )
        run_id = await self._stores.start(
            action, where, actor=f"api:{caller.name}", selected=counts
        )
        return await self._progress(run_id, caller, 202)

    async def _bulk_action(self, body: Mapping[str, Value]) -> BulkAction | Refused:
        """The body's ``action``; ``migrate`` takes the stored ``revision`` (a content
        hash) and, optionally, the plan's ``map`` (old state id to new, or null) and
        ``data``."""
        name = _text(body, "action")
        if isinstance(name, Refused):
            return name
        if name != "migrate":
            if name not in BULK_ACTIONS:
                known = ", ".join([*BULK_ACTIONS, "migrate"])
                return Refused(400, "bad_action", f"action is one of {known}")
            return BULK_ACTIONS[name]
        revision = _text(body, "revision")
        if isinstance(revision, Refused):
            return revision
        state_map = body.get("map", {})
        data = body.get("data", {})
        if not isinstance(state_map, dict) or not all(
            value is None or isinstance(value, str) for value in state_map.values()
        ):
            return Refused(400, "bad_plan", "map is an object of state ids to a state id or null")
        if not isinstance(data, dict):
            return Refused(400, "bad_plan", "data is an object of variable names to values")
        try:
            return await self._stores.migration(revision, state_map=state_map, data=data)
        except (ChartNotFound, ChartRetired) as missing:
            return Refused(404, "no_revision", str(missing))

    async def _bulk_progress(self, request: Request, caller: ApiToken) -> Answer:
        return await self._progress(request.path_params["job"], caller, 200)

    async def _progress(self, run_id: str, caller: ApiToken, status: int) -> Answer:
        """The run's progress; a run over a scope the caller may not read is not there
        for it (as another scope's execution is not)."""
        found = await self._stores.progress(run_id)
        if found is None:
            return Refused(404, "no_job", "no such bulk run")
        run, state = found
        if not caller.may(run.selection.get("scope", ALL_SCOPES), Rights.READ):
            return Refused(404, "no_job", "no such bulk run")
        return JSONResponse(_progress_json(run, state), status_code=status)

    async def _wait(self, request: Request, caller: ApiToken) -> Answer:
        execution_id = request.path_params["id"]
        query = request.query_params
        state = query.get("state")
        end = query.get("end") in ("true", "1")
        if (state is None) == (not end):
            return Refused(400, "bad_wait", "wait for one of state=<id> or end=true")
        try:
            timeout = float(query.get("timeout", "10"))
        except ValueError:
            timeout = -1.0
        if not 0 <= timeout < float("inf"):
            return Refused(400, "bad_wait", "timeout is a number of seconds, 0 or more")
        found = await self._address(execution_id, caller, Rights.READ)
        if isinstance(found, Refused):
            return found
        seen = await self.watcher.wait(execution_id, state, within=min(timeout, self.max_wait))
        if seen is None:
            seen = await self._snapshot(execution_id, found)
            if seen is None:
                return _no_execution(execution_id)
        body = {"reached": reached(seen, state), "execution": execution_json(seen, self.visible)}
        return JSONResponse(body)

    # -- reading ------------------------------------------------------------------

    async def _address(
        self, execution_id: str, caller: ApiToken, rights: Rights
    ) -> Address | Refused | None:
        """The execution's address when ``caller`` may act on it with ``rights``; an
        execution of a scope the caller does not reach is answered as none (404), so
        that no token learns of another scope's executions."""
        found = await address_of(self._stores.of_execution(execution_id).router, execution_id)
        address = None if found is None else Address(*found)
        if not (caller.every_scope if address is None else caller.reaches(address.scope)):
            return _no_execution(execution_id)
        if rights is Rights.WRITE and caller.rights is not Rights.WRITE:
            return Refused(403, "forbidden", f"token {caller.name!r} may only read")
        return address

    async def _snapshot(self, execution_id: str, address: Address | None) -> Snapshot | None:
        storage = self._stores.of_execution(execution_id).router.storage
        record = await storage.find_execution(execution_id)
        if record is None:
            return None
        state = None
        if record.position is not None:  # a pruned execution has none to show
            try:
                machine = await storage.machine(record.content_hash)
                state = storage.load(record, machine)
            except Exception:  # noqa: BLE001 - answered without its position, and logged
                _log.warning(
                    "api: the position of execution %s cannot be read",
                    execution_id,
                    exc_info=True,
                    extra={"execution_id": execution_id},
                )
        errors = await storage.errors(execution_id, RECENT_ERRORS)
        return Snapshot(record, state, tuple(decode_error(e) for e in errors), address)

    async def _load(self, execution_id: str) -> Snapshot | None:
        found = await address_of(self._stores.of_execution(execution_id).router, execution_id)
        return await self._snapshot(execution_id, None if found is None else Address(*found))

    async def _marks(self, execution_ids: Sequence[str]) -> dict[str, Mark]:
        by_store: dict[int, list[str]] = {}
        for execution_id in execution_ids:
            by_store.setdefault(self._stores.number_of(execution_id), []).append(execution_id)
        found = await asyncio.gather(
            *(_marks_in(self._stores.all[number].router, ids) for number, ids in by_store.items())
        )
        return {key: mark for marks in found for key, mark in marks.items()}

    async def _body(self, request: Request) -> dict[str, Value] | Refused:
        deadline = asyncio.get_running_loop().time() + self.timeout
        raw = await read_body(request, max_body=self.max_body, deadline=deadline)
        if isinstance(raw, Refused):
            return raw
        data = json_object(raw, max_bytes=self.max_body, what="body")
        return Refused(400, "json", data.reason) if isinstance(data, Malformed) else data

    # -- answering ----------------------------------------------------------------

    def _route(self, path: str, method: str, name: str, endpoint: Endpoint) -> Route:
        async def answer(request: Request) -> Response:
            started = time.perf_counter()
            caller: ApiToken | None = None
            answered: Answer
            try:
                caller = self._caller(request)
                if caller is None:
                    answered = Refused(401, "unauthorized", "present a token: Bearer <token>")
                elif name == "wait":  # bounded by its own timeout
                    answered = await endpoint(request, caller)
                else:
                    async with asyncio.timeout(self.timeout):
                        answered = await endpoint(request, caller)
            except TimeoutError:
                answered = Refused(503, "deadline", "the call was not answered in time; retry")
            except Exception as error:  # noqa: BLE001 - the caller's answer, and the log's
                answered = self._failed(error)
            refused = answered if isinstance(answered, Refused) else None
            if refused is not None:
                self._warn(name, refused)
                response: Response = JSONResponse(
                    {"error": refused.rule, "message": refused.reason}, status_code=refused.status
                )
            else:
                assert isinstance(answered, Response)
                response = answered
            telemetry.report(
                "statifier.api.request",
                {"duration": time.perf_counter() - started},
                {
                    "route": name,
                    "status": response.status_code,
                    "refusal": None if refused is None else refused.rule,
                    "caller": None if caller is None else caller.name,
                },
            )
            return response

        return Route(path, answer, methods=[method], name=name)

    def _caller(self, request: Request) -> ApiToken | None:
        given = request.headers.get("authorization", "")
        kind, _, token = given.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            return None
        return self.tokens.authenticate(token.strip())

    def _failed(self, error: BaseException) -> Refused:
        """The 500 of a call that raised ``error``; logged with its traceback, once per
        type and interval."""
        self._failures.log(
            _log,
            logging.ERROR,
            type(error).__name__,
            "api: a call failed with %s: %s",
            type(error).__name__,
            error,
            exc_info=error,
        )
        if isinstance(error, StoreFailed):
            return Refused(500, "failed", f"the call failed: {error}; retry it")
        return Refused(500, "failed", f"the call failed ({type(error).__name__}); retry it")

    def _warn(self, route: str, refused: Refused) -> None:
        fields = {"route": route, "status": refused.status, "refusal": refused.rule}

        def first() -> None:
            _log.warning(
                "api %s refused a call: %d %s",
                route,
                refused.status,
                refused.reason,
                extra={**fields, "count": 1},
            )

        def later(count: int) -> None:
            _log.warning(
                "api %s refused calls by the rule %s (%d): %d more in the last %g s",
                route,
                refused.rule,
                refused.status,
                count,
                self._repeats.interval,
                extra={**fields, "count": count},
            )

        self._repeats.note((route, refused.status, refused.rule), first, later)


async def _marks_in(router: Router, execution_ids: Sequence[str]) -> dict[str, Mark]:
    """What tells a step of each of ``execution_ids`` in ``router``'s database apart:
    status, update time and newest input-log entry."""
    tables = router.adapter.tables
    e, inputs = tables.executions, tables.inputs
    # The newest input-log entry tells two steps within one clock tick apart.
    newest = (
        sa.select(sa.func.max(inputs.c.seq))
        .where(inputs.c.execution_id == e.c.execution_id)
        .scalar_subquery()
    )
    ids = list(execution_ids)

    def read(connection: sa.Connection) -> dict[str, Mark]:
        marks: dict[str, Mark] = {}
        for start in range(0, len(ids), _MARKS_CHUNK):
            chunk = ids[start : start + _MARKS_CHUNK]
            statement = sa.select(
                e.c.execution_id, e.c.status, e.c.updated_at, newest.label("seq")
            ).where(e.c.execution_id.in_(chunk))
            for row in connection.execute(statement):
                marks[row.execution_id] = (row.status, row.updated_at, row.seq)
        return marks

    return await run_on(router.adapter.engine, read)


def _progress_json(run: LoggedRun, state: str) -> dict[str, Any]:
    progress = run.progress
    return {
        "job": run.run_id,
        "action": run.action,
        "state": state,
        "selected": progress.selected,
        "done": progress.done,
        "skipped": progress.skipped,
        "failed": progress.failed,
        "parked": progress.parked,
        "last_error": progress.last_error,
        "raised_errors": progress.raised_errors,
        "last_raised_error": progress.last_raised_error,
        "finished": run.finished,
        "error": run.error,
        "started_at": run.started_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
    }


def _bulk_filter(given: Mapping[str, Value]) -> ExecutionFilter | Refused:
    known = {"scope", "document", "key", "status", "final_state", "error"}
    unknown = sorted(set(given) - known)
    if unknown:
        return Refused(400, "bad_filter", f"unknown filter fields: {', '.join(unknown)}")
    texts: dict[str, str] = {}
    for name, value in given.items():
        if not isinstance(value, str):
            return Refused(400, "bad_filter", f"filter.{name} is a string")
        texts[name] = value
    try:
        status = None if "status" not in texts else Status(texts["status"])
        return ExecutionFilter(
            status=status,
            document=texts.get("document"),
            scope=texts.get("scope"),
            key=texts.get("key"),
            final_state=texts.get("final_state"),
            error=texts.get("error"),
        )
    except ValueError as bad:  # BadFilter, or an unknown status
        return Refused(400, "bad_filter", str(bad))


def _text(body: Mapping[str, Value], name: str) -> str | Refused:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        return Refused(400, "body", f"{name} is a non-empty string")
    return value


def _message_id(request: Request) -> str | Refused:
    given = request.headers.get("idempotency-key")
    if given is None:
        return str(uuid.uuid4())
    if not 0 < len(given) <= MAX_IDEMPOTENCY_KEY:
        return Refused(
            400, "idempotency_key", f"Idempotency-Key is 1 to {MAX_IDEMPOTENCY_KEY} characters"
        )
    return given


def _bounded_int(text: str | None, default: int, most: int) -> int | None:
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= most:
        return None
    return int(text)


def _forbidden(scope: str) -> Refused:
    return Refused(403, "forbidden", f"the token may not do this in scope {scope!r}")


def _no_execution(execution_id: str) -> Refused:
    return Refused(404, "no_execution", f"no execution {execution_id!r}")


def _unstorable(error: Unstorable) -> Refused:
    """The 422 of a send whose step cannot be stored (a value too large for a position,
    say): that step was abandoned and nothing of it stored, and the same send fails
    alike."""
    return Refused(
        422,
        "unstorable",
        f"the step this event makes cannot be stored, so it was abandoned: {_shorter(error)}",
    )


def _shorter(error: Exception, most: int = 200) -> str:
    """``error``'s message on one line of at most ``most`` characters (a refusal's
    message never echoes a whole body)."""
    said = " ".join(str(error).split())
    return said if len(said) <= most else said[: most - 1] + "…"


def _summary_json(row: ExecutionSummary) -> dict[str, Any]:
    return {
        "id": row.id,
        "document": row.document,
        "status": row.status.value,
        "final_state": row.final_state,
        "failure": row.failure,
        "error_count": row.error_count,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
        "ended_at": None if row.ended_at is None else row.ended_at.isoformat(),
    }
