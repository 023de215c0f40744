"""The Python client of the HTTP API (:mod:`statifier.api`, ``docs/api.md``): typed
calls, typed answers, typed errors, sync (:class:`Client`) or async
(:class:`AsyncClient`), on httpx (the ``http`` extra).

Each call is one request; each answer is a frozen dataclass parsed from the API's JSON
(:class:`Execution`, :class:`Outcome`, :class:`Routed`, :class:`Sent`,
:class:`Summary`, :class:`Page`, :class:`Waited`), with times as aware datetimes and
datamodel values decoded from the tagged encoding (:mod:`statifier.expr.tagged`)::

    from statifier.client import Client, NotFound

    with Client("https://orders.example/api", token) as api:
        routed = api.route("shop", "web", {"kind": "checkout", "order": "o-1", "amount": 20})
        execution_id = routed.outcomes[0].execution_id
        sent = api.send_to("web", "order", "o-1", "pay", idempotency_key="pay-o-1")
        assert sent.outcome.execution and sent.outcome.execution.final_state == "paid"
        waited = api.wait(execution_id, end=True, timeout=5)
        for row in api.iterate(scope="web", status="active"):
            print(row.id, row.updated_at)
        try:
            api.get("nobody")
        except NotFound as missing:
            print(missing.error)  # no_execution

:class:`AsyncClient` has the same methods, each awaited (``iterate`` is an async
iterator): ``async with AsyncClient(url, token) as api: await api.get(...)``.

Errors: an answer that is not 2xx raises :class:`ApiError` (its ``status``, the API's
``error`` rule and ``message``), as :class:`Unauthorized` (401), :class:`Forbidden`
(403), :class:`NotFound` (404) or :class:`Conflict` (409) where the status says so. An
answer that is not the API's JSON (a proxy's page, a field missing or of another type)
raises :class:`ApiError` with ``error == "bad_answer"``. A request that never got an
answer (no connection, a timeout) raises httpx's own :class:`httpx.TransportError`.
The token is never part of an error's message or of a client's repr.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, get_args
from urllib.parse import quote

from statifier.expr import Value
from statifier.expr.tagged import TaggedValueError, decode, encode
from statifier.extras import MissingExtra

try:
    import httpx
except ModuleNotFoundError as missing:  # httpx: the http extra
    raise MissingExtra.of(missing, extra="http", what="statifier.client") from missing

__all__ = [
    "UNSET",
    "Address",
    "ApiError",
    "AsyncClient",
    "BulkRun",
    "Client",
    "Conflict",
    "Execution",
    "ExecutionStatus",
    "Forbidden",
    "MigrateTo",
    "NotFound",
    "Outcome",
    "OutcomeKind",
    "Page",
    "RaisedError",
    "Routed",
    "Sent",
    "Summary",
    "Unauthorized",
    "Unset",
    "Waited",
]

ExecutionStatus = Literal["active", "needs_migration", "paused", "completed", "failed", "cancelled"]
"""Where an execution is in its life, as the API names it."""
OutcomeKind = Literal[
    "delivered",
    "created_and_delivered",
    "held",
    "buffered",
    "duplicate",
    "no_match",
    "key_refused",
    "dropped",
]
"""What one binding (or a send to an address) did with an event."""

_STATUSES: Final = frozenset(get_args(ExecutionStatus))
_OUTCOMES: Final = frozenset(get_args(OutcomeKind))
_WAIT_MARGIN: Final = 5.0
"""Seconds the HTTP timeout of a wait exceeds the wait's own, so that the API's answer
when the wait runs out arrives before the request gives up."""


class Unset(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "unset"


UNSET: Final = Unset.UNSET
"""A send without data: the event's ``_event.data`` is undefined."""


# -- errors ---------------------------------------------------------------------------


class ApiError(Exception):
    """The API refused a call, failed it, or answered what is not its JSON.

    Attributes:
        status: the HTTP status of the answer.
        error: the API's rule (``no_execution``, ``bad_filter``, ``ended``...), or
            ``bad_answer`` when the answer is not the API's JSON.
        message: the API's one line, or what was wrong with its answer.
    """

    def __init__(self, status: int, error: str, message: str) -> None:
        # The three arguments, so that the error pickles and its repr shows them.
        super().__init__(status, error, message)
        self.status = status
        self.error = error
        self.message = message

    def __str__(self) -> str:
        return f"{self.status} {self.error}: {self.message}"


class Unauthorized(ApiError):  # noqa: N818 - names the status
    """401: no token, or one the API does not know."""


class Forbidden(ApiError):  # noqa: N818 - names the status
    """403: the token lacks the scope or the write right."""


class NotFound(ApiError):  # noqa: N818 - names the status
    """404: no such execution (or none the token's scopes reach), or no such source."""


class Conflict(ApiError):  # noqa: N818 - names the status
    """409: the execution has ended (a cancel), or no address names it (a send)."""


_ERRORS: Final[dict[int, type[ApiError]]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
}


class _BadAnswer(Exception):  # noqa: N818 - names the finding
    """The answer is not the contract's JSON; the message says where."""


# -- answers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Address:
    """The ``(scope, document, key)`` an execution is addressed under."""

    scope: str
    document: str
    key: str


@dataclass(frozen=True, slots=True)
class RaisedError:
    """One error event a step of the execution raised.

    Attributes:
        name: the event's name (``error.execution``, ``error.communication``...).
        taken: whether a transition of the chart took it.
        message: what went wrong.
        element, line, column: the element that failed and where it is in the chart.
        reason: the failure's short token.
        sendid: the send the error is about, if any.
        via, seq, recorded_at: the step it belongs to, when recorded.
    """

    name: str
    taken: bool
    message: str | None
    element: str | None
    line: int | None
    column: int | None
    reason: str | None
    sendid: str | None
    via: str | None
    seq: int | None
    recorded_at: datetime | None


@dataclass(frozen=True, slots=True)
class Execution:
    """An execution as one read, or one delivery's own step, left it.

    Attributes:
        id: the execution id.
        document: the document its address names (``None`` without an address).
        status: where it is in its life.
        configuration: its active leaf states while it runs (empty once it ended).
        final_state: the final state it ended in, if it completed.
        failure: why it failed, if it did.
        errors: the errors of the step the answer is about, or its most recent ones.
        error_count: how many errors it has raised in all.
        data: the datamodel fields the API shows for its document, decoded.
        addresses: the addresses that name it.
        created_at, updated_at, ended_at: when it was created, last stepped, ended.
    """

    id: str
    document: str | None
    status: ExecutionStatus
    configuration: tuple[str, ...]
    final_state: str | None
    failure: str | None
    errors: tuple[RaisedError, ...]
    error_count: int
    data: Mapping[str, Value]
    addresses: tuple[Address, ...]
    created_at: datetime | None
    updated_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one binding did with a routed event, or what a send to an address did.

    Attributes:
        binding: the binding's id (``api`` for a send to an address).
        outcome: what happened.
        key: the address key, where one was computed.
        execution_id: the execution delivered to (or dropped at).
        reason: why the event was dropped or its key refused.
        execution: the execution as the delivery's own step left it, for
            ``delivered``, ``created_and_delivered`` and a ``dropped`` unmatched event.
    """

    binding: str
    outcome: OutcomeKind
    key: str | None
    execution_id: str | None
    reason: str | None
    execution: Execution | None


@dataclass(frozen=True, slots=True)
class Routed:
    """The answer to :meth:`Client.route`: the message id and each binding's outcome."""

    message_id: str
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True, slots=True)
class Sent:
    """The answer to :meth:`Client.send` and :meth:`Client.send_to`."""

    message_id: str
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Summary:
    """One row of a list of executions."""

    id: str
    document: str | None
    status: ExecutionStatus
    final_state: str | None
    failure: str | None
    error_count: int
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list, newest first; ``next_cursor`` asks for the next one
    (``None`` on the last)."""

    rows: tuple[Summary, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class Waited:
    """The answer to a wait: whether the state (or the end) was reached before the
    time ran out, and the execution as last seen."""

    reached: bool
    execution: Execution


@dataclass(frozen=True, slots=True)
class BulkRun:
    """How far a bulk action the API runs has come.

    Attributes:
        job: its id, to ask again (:meth:`Client.bulk_progress`).
        action: ``cancel``, ``pause``, ``resume``, ``retry`` or ``migrate``.
        selected: how many executions the filter selected when it started.
        done, skipped, failed: executions acted on, not applying any more, failed.
        finished: whether it has ended.
        error: why it stopped early, if it did (an error's type name).
        parked: ``migrate``: executions the revision could not carry, parked instead.
        last_error: the last execution's failure, ``"ErrorClass: message"``.
        raised_errors: ``resume``: executions resumed (counted under ``done``) whose
            held events raised error events no transition took.
        last_raised_error: the last such error: the execution, the error's name and
            where the chart raised it.
        state: ``running`` (in the API process answering), ``finished``, ``stopped``
            (``error`` says why), or ``unfinished``: no end recorded and not running
            there (interrupted, or running in another process); run it again to
            finish it.
    """

    job: str
    action: str
    selected: int
    done: int
    skipped: int
    failed: int
    finished: bool
    error: str | None = None
    parked: int = 0
    last_error: str | None = None
    state: str = "running"
    raised_errors: int = 0
    last_raised_error: str | None = None


@dataclass(frozen=True, slots=True)
class MigrateTo:
    """What a bulk ``migrate`` moves executions onto: a revision the store holds.

    Attributes:
        revision: the revision's content hash.
        state_map: old state id to new, or to ``None`` for a state removed on purpose.
        data: values for the variables the revision adds.

    >>> MigrateTo("9f2c...", state_map={"review": "checking"}).state_map
    {'review': 'checking'}
    """

    revision: str
    state_map: Mapping[str, str | None] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)


# -- parsing the API's JSON -----------------------------------------------------------

_T = TypeVar("_T")
_KINDS: Final[dict[type, str]] = {
    str: "a string",
    int: "a whole number",
    bool: "true or false",
    list: "a list",
    dict: "a JSON object",
}


def _field(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    found = _nullable(body, name, kind)
    if found is None:
        raise _BadAnswer(f"{name} is null")
    return found


def _nullable(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T | None:
    if name not in body:
        raise _BadAnswer(f"{name} is missing")
    value = body[name]
    # bool is an int to Python, never to the API.
    if value is not None and (
        not isinstance(value, kind) or (kind is int and isinstance(value, bool))
    ):
        raise _BadAnswer(f"{name} is not {_KINDS.get(kind, kind.__name__)}")
    return value


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _BadAnswer(f"{what} is not a JSON object")
    return value


def _items(body: Mapping[str, Any], name: str) -> list[Any]:
    found: list[Any] = _field(body, name, list)
    return found


def _text(body: Mapping[str, Any], name: str) -> str:
    return _field(body, name, str)


def _maybe_text(body: Mapping[str, Any], name: str) -> str | None:
    return _nullable(body, name, str)


def _maybe_int(body: Mapping[str, Any], name: str) -> int | None:
    return _nullable(body, name, int)


def _time(body: Mapping[str, Any], name: str) -> datetime:
    moment = _maybe_time(body, name)
    if moment is None:
        raise _BadAnswer(f"{name} is null")
    return moment


def _maybe_time(body: Mapping[str, Any], name: str) -> datetime | None:
    text = _maybe_text(body, name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _BadAnswer(f"{name} is not an ISO 8601 time") from None
    if moment.utcoffset() is None:
        raise _BadAnswer(f"{name} has no time zone")
    return moment


def _status(body: Mapping[str, Any]) -> ExecutionStatus:
    status = _text(body, "status")
    if status not in _STATUSES:
        raise _BadAnswer(f"status {status!r} is not one the API names")
    return status  # type: ignore[return-value]


def _raised(value: object) -> RaisedError:
    body = _object(value, "an error")
    return RaisedError(
        name=_text(body, "name"),
        taken=_field(body, "taken", bool),
        message=_maybe_text(body, "message"),
        element=_maybe_text(body, "element"),
        line=_maybe_int(body, "line"),
        column=_maybe_int(body, "column"),
        reason=_maybe_text(body, "reason"),
        sendid=_maybe_text(body, "sendid"),
        via=_maybe_text(body, "via"),
        seq=_maybe_int(body, "seq"),
        recorded_at=_maybe_time(body, "recorded_at"),
    )


def _address(value: object) -> Address:
    body = _object(value, "an address")
    return Address(_text(body, "scope"), _text(body, "document"), _text(body, "key"))


def _execution(value: object) -> Execution:
    body = _object(value, "the execution")
    configuration = _items(body, "configuration")
    if not all(isinstance(state, str) for state in configuration):
        raise _BadAnswer("configuration is not a list of state ids")
    data = _field(body, "data", dict)
    try:
        decoded = {str(name): decode(item) for name, item in data.items()}
    except TaggedValueError as malformed:
        raise _BadAnswer(f"data: {malformed}") from None
    return Execution(
        id=_text(body, "id"),
        document=_maybe_text(body, "document"),
        status=_status(body),
        configuration=tuple(configuration),
        final_state=_maybe_text(body, "final_state"),
        failure=_maybe_text(body, "failure"),
        errors=tuple(_raised(error) for error in _items(body, "errors")),
        error_count=_field(body, "error_count", int),
        data=decoded,
        addresses=tuple(_address(address) for address in _items(body, "addresses")),
        created_at=_maybe_time(body, "created_at"),
        updated_at=_maybe_time(body, "updated_at"),
        ended_at=_maybe_time(body, "ended_at"),
    )


def _outcome(value: object) -> Outcome:
    body = _object(value, "an outcome")
    kind = _text(body, "outcome")
    if kind not in _OUTCOMES:
        raise _BadAnswer(f"outcome {kind!r} is not one the API names")
    execution = _nullable(body, "execution", dict)
    return Outcome(
        binding=_text(body, "binding"),
        outcome=kind,  # type: ignore[arg-type]
        key=_maybe_text(body, "key"),
        execution_id=_maybe_text(body, "execution_id"),
        reason=_maybe_text(body, "reason"),
        execution=None if execution is None else _execution(execution),
    )


def _summary(value: object) -> Summary:
    body = _object(value, "a row")
    return Summary(
        id=_text(body, "id"),
        document=_maybe_text(body, "document"),
        status=_status(body),
        final_state=_maybe_text(body, "final_state"),
        failure=_maybe_text(body, "failure"),
        error_count=_field(body, "error_count", int),
        created_at=_time(body, "created_at"),
        updated_at=_time(body, "updated_at"),
        ended_at=_maybe_time(body, "ended_at"),
    )


def _routed(body: Mapping[str, Any]) -> Routed:
    outcomes = tuple(_outcome(outcome) for outcome in _items(body, "outcomes"))
    return Routed(_text(body, "message_id"), outcomes)


def _sent(body: Mapping[str, Any]) -> Sent:
    return Sent(_text(body, "message_id"), _outcome(_field(body, "outcome", dict)))


def _page(body: Mapping[str, Any]) -> Page:
    rows = tuple(_summary(row) for row in _items(body, "executions"))
    return Page(rows, _maybe_text(body, "next_cursor"))


def _waited(body: Mapping[str, Any]) -> Waited:
    return Waited(_field(body, "reached", bool), _execution(_field(body, "execution", dict)))


def _selected(body: Mapping[str, Any]) -> int:
    return _field(body, "selected", int)


def _bulk_run(job: str) -> Callable[[Mapping[str, Any]], BulkRun]:
    def parse(body: Mapping[str, Any]) -> BulkRun:
        return BulkRun(
            job,
            _text(body, "action"),
            _field(body, "selected", int),
            _field(body, "done", int),
            _field(body, "skipped", int),
            _field(body, "failed", int),
            _field(body, "finished", bool),
            _maybe_text(body, "error"),
            _field(body, "parked", int),
            _maybe_text(body, "last_error"),
            _text(body, "state"),
            _field(body, "raised_errors", int) if "raised_errors" in body else 0,
            _maybe_text(body, "last_raised_error"),
        )

    return parse


def _started(body: Mapping[str, Any]) -> BulkRun:
    return _bulk_run(_text(body, "job"))(body)


def _bulk_call(
    action: str, filters: Mapping[str, str], confirm: int | None, to: MigrateTo | None
) -> _Call:
    body: dict[str, object] = {"action": action, "filter": dict(filters)}
    if to is not None:
        body.update(revision=to.revision, map=dict(to.state_map), data=dict(to.data))
    if confirm is not None:
        body["confirm"] = confirm
    return _Call("POST", "/bulk", body=_json(body))


def _acted(body: Mapping[str, Any]) -> Execution:
    """The execution an action (cancel, pause, resume) answers with."""
    return _execution(_field(body, "execution", dict))


# -- requests -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """One request, as both clients make it."""

    method: str
    path: str
    params: dict[str, str] | None = None
    body: bytes | None = None
    headers: dict[str, str] | None = None
    timeout: float | None = None

    def send_on(self, http: httpx.Client) -> httpx.Response:
        return http.request(self.method, self.path, **self._options())

    async def send_on_async(self, http: httpx.AsyncClient) -> httpx.Response:
        return await http.request(self.method, self.path, **self._options())

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"params": self.params, "headers": self.headers}
        if self.body is not None:
            options["content"] = self.body
        if self.timeout is not None:
            options["timeout"] = self.timeout
        return options


def _path(*parts: str) -> str:
    """A path of the API, each part percent-encoded whole (a ``/`` in a key included)."""
    return "".join("/" + quote(part, safe="") for part in parts)


def _json(body: Mapping[str, object]) -> bytes:
    """The request body: the API's one JSON rule refuses what is not finite."""
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as refused:
        raise ValueError(f"the request body is not JSON: {refused}") from None


def _key_header(idempotency_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return headers


def _route_call(
    source: str, scope: str, data: Mapping[str, object], idempotency_key: str | None
) -> _Call:
    # The API routes the data as a webhook post's: plain JSON, never tagged.
    body = _json({"source": source, "scope": scope, "data": data})
    return _Call("POST", "/events", body=body, headers=_key_header(idempotency_key))


def _event_call(path: str, event: str, data: Value | Unset, idempotency_key: str | None) -> _Call:
    body: dict[str, object] = {"event": event}
    if data is not UNSET:
        body["data"] = encode(data)
    return _Call("POST", path, body=_json(body), headers=_key_header(idempotency_key))


def _list_call(
    scope: str | None,
    document: str | None,
    key: str | None,
    status: str | None,
    final_state: str | None,
    error: str | None,
    limit: int,
    cursor: str | None,
) -> _Call:
    given = {
        "scope": scope,
        "document": document,
        "key": key,
        "status": status,
        "final_state": final_state,
        "error": error,
        "limit": str(limit),
        "cursor": cursor,
    }
    return _Call("GET", "/executions", params={k: v for k, v in given.items() if v is not None})


def _wait_call(
    execution_id: str, state: str | None, end: bool, timeout: float, http_timeout: float
) -> _Call:
    if (state is None) == (not end):
        raise ValueError("wait for one of state=<id> or end=True")
    if isinstance(timeout, bool) or not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout is seconds, 0 or more, not {timeout!r}")
    params = {"end": "true"} if state is None else {"state": state}
    params["timeout"] = repr(float(timeout))
    return _Call(
        "GET",
        _path("executions", execution_id, "wait"),
        params=params,
        timeout=timeout + max(http_timeout, _WAIT_MARGIN),
    )


def _answer(response: httpx.Response, parse: Callable[[Mapping[str, Any]], _T], token: str) -> _T:
    """``parse`` of a 2xx answer's JSON object, else the :class:`ApiError` it stands for."""
    status = response.status_code
    try:
        body: object = json.loads(response.content)
    except ValueError:
        body = None
    if not 200 <= status < 300:
        raise _refusal(status, body, response, token)
    try:
        return parse(_object(body, "the answer"))
    except _BadAnswer as bad:
        raise _bad_answer(status, response, str(bad), token) from None


def _refusal(status: int, body: object, response: httpx.Response, token: str) -> ApiError:
    kind = _ERRORS.get(status, ApiError)
    if isinstance(body, dict):
        rule, message = body.get("error"), body.get("message", "")
        if isinstance(rule, str) and rule and isinstance(message, str):
            return kind(status, rule, _redacted(message, token))
    return _bad_answer(status, response, "the refusal is not the API's JSON error", token, kind)


def _bad_answer(
    status: int,
    response: httpx.Response,
    what: str,
    token: str,
    kind: type[ApiError] = ApiError,
) -> ApiError:
    request = response.request
    # The answer's own text is not quoted: whatever answered may echo the request.
    where = f"{request.method} {request.url.path}"
    return kind(status, "bad_answer", _redacted(f"the answer to {where}: {what}", token))


def _redacted(text: str, token: str) -> str:
    return text.replace(token, "***")


def _check(base_url: str, token: str, timeout: float) -> None:
    given: object = token
    if not isinstance(given, str) or not token or token != token.strip():
        raise ValueError("the token is a non-empty string without surrounding spaces")
    if not token.isprintable() or not token.isascii() or " " in token:
        raise ValueError("the token has characters a header cannot carry")
    if isinstance(timeout, bool) or not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout is positive seconds, not {timeout!r}")
    if not base_url:
        raise ValueError("the base URL is empty")


# -- the clients ----------------------------------------------------------------------


class Client:
    """A synchronous client of the API at ``base_url`` (where it is mounted, such as
    ``https://host/api``), calling with ``token``.

    Args:
        base_url: the API's root URL.
        token: the bearer token; kept out of every repr and error.
        timeout: the seconds one call may take (a wait adds its own).
        transport: an httpx transport to call through (tests: ``httpx.MockTransport``).

    Raises:
        ValueError: an empty token, one a header cannot carry, a timeout that is not
            positive.

    Use it as a context manager, or :meth:`close` it.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        _check(base_url, token, timeout)
        self._token = token
        self._timeout = float(timeout)
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"Client({str(self._http.base_url)!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _call(self, call: _Call, parse: Callable[[Mapping[str, Any]], _T]) -> _T:
        return _answer(call.send_on(self._http), parse, self._token)

    def route(
        self,
        source: str,
        scope: str,
        data: Mapping[str, object],
        *,
        idempotency_key: str | None = None,
    ) -> Routed:
        """Route an inbound event of ``source`` in ``scope`` through its bindings, as a
        webhook post is (``POST /events``, the write right on ``scope``).

        ``data`` is the event as plain JSON (the bindings read it as a post's body);
        ``idempotency_key`` is its message id (a retry with it is a duplicate).

        Raises:
            ValueError: ``data`` is not JSON (a value that is not finite, a date...).
            ApiError: the API refused or failed the call (``no_source`` 404,
                ``routing_failed`` 500...).
        """
        return self._call(_route_call(source, scope, data, idempotency_key), _routed)

    def send(
        self,
        execution_id: str,
        event: str,
        data: Value | Unset = UNSET,
        *,
        idempotency_key: str | None = None,
    ) -> Sent:
        """Deliver ``event`` to the execution ``execution_id`` (at its address; never
        creates one). ``data`` is any value of the language (sent in the tagged
        encoding).

        Raises:
            TaggedValueError: ``data`` holds a map with a ``"$type"`` key, or a value
                outside the language.
            ValueError: ``data`` is not finite.
            NotFound: no such execution (``no_execution``).
            Conflict: no address names it (``no_address``).
        """
        path = _path("executions", execution_id, "events")
        return self._call(_event_call(path, event, data, idempotency_key), _sent)

    def send_to(
        self,
        scope: str,
        document: str,
        key: str,
        event: str,
        data: Value | Unset = UNSET,
        *,
        idempotency_key: str | None = None,
    ) -> Sent:
        """Deliver ``event`` to the execution at the address ``(scope, document,
        key)``; without one the outcome is ``dropped`` (``no_execution``). As
        :meth:`send` otherwise."""
        path = _path("addresses", scope, document, key, "events")
        return self._call(_event_call(path, event, data, idempotency_key), _sent)

    def get(self, execution_id: str) -> Execution:
        """The execution as it is now.

        Raises:
            NotFound: no such execution, or none the token's scopes reach.
        """
        return self._call(_Call("GET", _path("executions", execution_id)), _execution)

    def list(
        self,
        *,
        scope: str | None = None,
        document: str | None = None,
        key: str | None = None,
        status: str | None = None,
        final_state: str | None = None,
        error: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        """One page of the executions that match every filter given, newest first.

        ``scope`` is required unless the token reaches every scope; ``cursor`` is a
        page's ``next_cursor``; ``limit`` 1 to 500.

        Raises:
            ApiError: ``bad_filter`` or ``bad_cursor`` (400).
            Forbidden: the token does not reach ``scope``.
        """
        call = _list_call(scope, document, key, status, final_state, error, limit, cursor)
        return self._call(call, _page)

    def iterate(
        self,
        *,
        scope: str | None = None,
        document: str | None = None,
        key: str | None = None,
        status: str | None = None,
        final_state: str | None = None,
        error: str | None = None,
        limit: int = 50,
    ) -> Iterator[Summary]:
        """Every row :meth:`list` finds, page after page (``limit`` rows a request)."""
        cursor: str | None = None
        while True:
            page = self.list(
                scope=scope,
                document=document,
                key=key,
                status=status,
                final_state=final_state,
                error=error,
                limit=limit,
                cursor=cursor,
            )
            yield from page.rows
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def wait(
        self,
        execution_id: str,
        *,
        state: str | None = None,
        end: bool = False,
        timeout: float = 10.0,
    ) -> Waited:
        """Wait until the execution has ``state`` active (or, with ``end``, has ended),
        or ``timeout`` seconds pass (the API caps it at its ``max_wait``).

        Raises:
            ValueError: neither or both of ``state`` and ``end``; a timeout below 0.
            NotFound: no such execution.
        """
        call = _wait_call(execution_id, state, end, timeout, self._timeout)
        return self._call(call, _waited)

    def cancel(self, execution_id: str) -> Execution:
        """Cancel the execution; answers it cancelled.

        Raises:
            Conflict: it has already ended (``ended``).
            NotFound: no such execution.
        """
        return self._call(_Call("POST", _path("executions", execution_id, "cancel")), _acted)

    def bulk_preview(self, action: str, *, to: MigrateTo | None = None, **filters: str) -> int:
        """How many executions a bulk ``action`` (``cancel``, ``pause``, ``resume``,
        ``retry`` their dead outbox rows, or ``migrate`` ``to`` a revision) over
        ``filters`` (``scope``, ``document``, ``key``, ``status``, ``final_state``,
        ``error``) would act on now.

        Raises:
            NotFound: ``migrate`` to a revision the store does not hold.
        """
        return self._call(_bulk_call(action, filters, None, to), _selected)

    def bulk(
        self, action: str, *, confirm: int, to: MigrateTo | None = None, **filters: str
    ) -> BulkRun:
        """Start a bulk ``action`` over ``filters``, confirming the count
        :meth:`bulk_preview` gave; the API runs it and :meth:`bulk_progress` follows it.

        Raises:
            Conflict: the count selected changed since (``preview_changed``).
        """
        return self._call(_bulk_call(action, filters, confirm, to), _started)

    def bulk_progress(self, job: str) -> BulkRun:
        """How far the bulk run ``job`` has come."""
        return self._call(_Call("GET", _path("bulk", job)), _bulk_run(job))

    def pause(self, execution_id: str) -> Execution:
        """Pause the execution: until it resumes, what is sent to it is held, in order
        (a send answers ``held``); answers it paused.

        Raises:
            Conflict: it is not active (``not_active``).
            NotFound: no such execution.
        """
        return self._call(_Call("POST", _path("executions", execution_id, "pause")), _acted)

    def resume(self, execution_id: str) -> Execution:
        """Resume the paused execution, stepping in what it held; answers it after.

        Raises:
            Conflict: it is not paused (``not_paused``).
            NotFound: no such execution.
        """
        return self._call(_Call("POST", _path("executions", execution_id, "resume")), _acted)


class AsyncClient:
    """The asynchronous :class:`Client`: the same arguments (an
    ``httpx.AsyncBaseTransport``), the same methods, each awaited; :meth:`iterate` is
    an async iterator. Use it as an async context manager, or :meth:`aclose` it."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        _check(base_url, token, timeout)
        self._token = token
        self._timeout = float(timeout)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"AsyncClient({str(self._http.base_url)!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _call(self, call: _Call, parse: Callable[[Mapping[str, Any]], _T]) -> _T:
        return _answer(await call.send_on_async(self._http), parse, self._token)

    async def route(
        self,
        source: str,
        scope: str,
        data: Mapping[str, object],
        *,
        idempotency_key: str | None = None,
    ) -> Routed:
        """As :meth:`Client.route`."""
        return await self._call(_route_call(source, scope, data, idempotency_key), _routed)

    async def send(
        self,
        execution_id: str,
        event: str,
        data: Value | Unset = UNSET,
        *,
        idempotency_key: str | None = None,
    ) -> Sent:
        """As :meth:`Client.send`."""
        path = _path("executions", execution_id, "events")
        return await self._call(_event_call(path, event, data, idempotency_key), _sent)

    async def send_to(
        self,
        scope: str,
        document: str,
        key: str,
        event: str,
        data: Value | Unset = UNSET,
        *,
        idempotency_key: str | None = None,
    ) -> Sent:
        """As :meth:`Client.send_to`."""
        path = _path("addresses", scope, document, key, "events")
        return await self._call(_event_call(path, event, data, idempotency_key), _sent)

    async def get(self, execution_id: str) -> Execution:
        """As :meth:`Client.get`."""
        return await self._call(_Call("GET", _path("executions", execution_id)), _execution)

    async def list(
        self,
        *,
        scope: str | None = None,
        document: str | None = None,
        key: str | None = None,
        status: str | None = None,
        final_state: str | None = None,
        error: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page:
        """As :meth:`Client.list`."""
        call = _list_call(scope, document, key, status, final_state, error, limit, cursor)
        return await self._call(call, _page)

    async def iterate(
        self,
        *,
        scope: str | None = None,
        document: str | None = None,
        key: str | None = None,
        status: str | None = None,
        final_state: str | None = None,
        error: str | None = None,
        limit: int = 50,
    ) -> AsyncIterator[Summary]:
        """As :meth:`Client.iterate`."""
        cursor: str | None = None
        while True:
            page = await self.list(
                scope=scope,
                document=document,
                key=key,
                status=status,
                final_state=final_state,
                error=error,
                limit=limit,
                cursor=cursor,
            )
            for row in page.rows:
                yield row
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def wait(
        self,
        execution_id: str,
        *,
        state: str | None = None,
        end: bool = False,
        timeout: float = 10.0,  # noqa: ASYNC109 - the API's wait, sent to it
    ) -> Waited:
        """As :meth:`Client.wait`."""
        call = _wait_call(execution_id, state, end, timeout, self._timeout)
        return await self._call(call, _waited)

    async def cancel(self, execution_id: str) -> Execution:
        """As :meth:`Client.cancel`."""
        call = _Call("POST", _path("executions", execution_id, "cancel"))
        return await self._call(call, _acted)

    async def bulk_preview(
        self, action: str, *, to: MigrateTo | None = None, **filters: str
    ) -> int:
        """As :meth:`Client.bulk_preview`."""
        return await self._call(_bulk_call(action, filters, None, to), _selected)

    async def bulk(
        self, action: str, *, confirm: int, to: MigrateTo | None = None, **filters: str
    ) -> BulkRun:
        """As :meth:`Client.bulk`."""
        return await self._call(_bulk_call(action, filters, confirm, to), _started)

    async def bulk_progress(self, job: str) -> BulkRun:
        """As :meth:`Client.bulk_progress`."""
        return await self._call(_Call("GET", _path("bulk", job)), _bulk_run(job))

    async def pause(self, execution_id: str) -> Execution:
        """As :meth:`Client.pause`."""
        call = _Call("POST", _path("executions", execution_id, "pause"))
        return await self._call(call, _acted)

    async def resume(self, execution_id: str) -> Execution:
        """As :meth:`Client.resume`."""
        call = _Call("POST", _path("executions", execution_id, "resume"))
        return await self._call(call, _acted)
