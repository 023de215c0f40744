"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /openapi.json``.

>>> document = openapi_document("/api")
>>> document["openapi"], document["servers"]
('3.1.0', [{'url': '/api'}])
>>> sorted(document["paths"])[:2]
['/addresses/{scope}/{document}/{key}/events', '/bulk']
"""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF + name}


def _string(description: str = "") -> dict[str, Any]:
    return {"type": "string", **({"description": description} if description else {})}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "403": {"$ref": "#/components/responses/Forbidden"},
    "404": {"$ref": "#/components/responses/NotFound"},
    "500": {"$ref": "#/components/responses/Failed"},
    "503": {"$ref": "#/components/responses/Deadline"},
}
_SEND_ERRORS = {**_ERRORS, "422": {"$ref": "#/components/responses/Unstorable"}}
"""What a route that steps an execution answers besides: a step that cannot be stored."""


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": description,
    }


def _query(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": {"type": kind}, "description": description}


_IDEMPOTENCY = {
    "name": "Idempotency-Key",
    "in": "header",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    "description": "The message id: a retried call with the same key is a duplicate.",
}
_SEND_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["event"],
                "properties": {
                    "event": _string("the chart event's name"),
                    "data": {"description": "the event's data, in the tagged encoding"},
                },
            }
        }
    },
}
_EXECUTION_ID = _path_param("id", "the execution id")


def _schemas() -> dict[str, Any]:
    error = {
        "type": "object",
        "required": ["error", "message"],
        "properties": {
            "error": _string("the rule broken"),
            "message": _string("one line"),
        },
    }
    execution = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "document": _nullable("string"),
            "status": {"enum": ["active", "needs_migration", "completed", "failed", "cancelled"]},
            "configuration": {"type": "array", "items": {"type": "string"}},
            "final_state": _nullable("string"),
            "failure": _nullable("string"),
            "errors": {"type": "array", "items": {"type": "object"}},
            "error_count": {"type": "integer"},
            "data": {
                "type": "object",
                "description": "the datamodel fields declared visible, tagged encoding",
            },
            "addresses": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"scope": {}, "document": {}, "key": {}},
                },
            },
            "created_at": _nullable("string"),
            "updated_at": _nullable("string"),
            "ended_at": _nullable("string"),
        },
    }
    outcome = {
        "type": "object",
        "properties": {
            "binding": {"type": "string"},
            "outcome": {
                "enum": [
                    "delivered",
                    "created_and_delivered",
                    "held",
                    "buffered",
                    "duplicate",
                    "no_match",
                    "key_refused",
                    "dropped",
                ]
            },
            "key": _nullable("string"),
            "execution_id": _nullable("string"),
            "reason": _nullable("string"),
            "execution": {"oneOf": [_ref("Execution"), {"type": "null"}]},
        },
    }
    summary = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "document": _nullable("string"),
            "status": {"type": "string"},
            "final_state": _nullable("string"),
            "failure": _nullable("string"),
            "error_count": {"type": "integer"},
            "created_at": {"type": "string"},
            "updated_at": {"type": "string"},
            "ended_at": _nullable("string"),
        },
    }
    progress = {
        "type": "object",
        "properties": {
            "job": {"type": "string"},
            "action": {"type": "string"},
            "selected": {"type": "integer"},
            "done": {"type": "integer"},
            "skipped": {"type": "integer"},
            "failed": {"type": "integer"},
            "parked": {"type": "integer"},
            "last_error": _nullable("string"),
            "raised_errors": {"type": "integer"},
            "last_raised_error": _nullable("string"),
            "finished": {"type": "boolean"},
            "error": _nullable("string"),
        },
    }
    return {
        "Error": error,
        "Execution": execution,
        "Outcome": outcome,
        "Summary": summary,
        "BulkProgress": progress,
    }


def _responses() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    return {
        "BadRequest": {"description": "the request breaks a rule", **error},
        "Unauthorized": {"description": "no known token", **error},
        "Forbidden": {"description": "the token may not do this in this scope", **error},
        "NotFound": {"description": "no such execution (in the token's scopes)", **error},
        "Unstorable": {
            "description": "the step this event makes cannot be stored; it was abandoned",
            **error,
        },
        "Failed": {"description": "the call failed; retry it", **error},
        "Deadline": {"description": "the call was not answered in time", **error},
    }


def _action(name: str, summary: str, refusal: str) -> dict[str, Any]:
    done = {
        "type": "object",
        "properties": {"done": {"type": "string"}, "execution": _ref("Execution")},
    }
    conflict = {
        "description": f"{refusal}: the execution is not in a state to {name}",
        "content": {"application/json": {"schema": _ref("Error")}},
    }
    return {
        "post": {
            "summary": summary,
            "operationId": name,
            "parameters": [_EXECUTION_ID],
            "responses": {"200": _json(done, "done, and audited"), "409": conflict, **_ERRORS},
        }
    }


def _paths() -> dict[str, Any]:
    sent = _json(
        {
            "type": "object",
            "properties": {"message_id": {"type": "string"}, "outcome": _ref("Outcome")},
        },
        "delivered and committed (or why not, in the outcome)",
    )
    one = _json(_ref("Execution"), "the execution")
    return {
        "/events": {
            "post": {
                "summary": "Route an event through the bindings of its source",
                "operationId": "route",
                "parameters": [_IDEMPOTENCY],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["source", "scope"],
                                "properties": {
                                    "source": {"type": "string"},
                                    "scope": {"type": "string"},
                                    "data": {"type": "object"},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "message_id": {"type": "string"},
                                "outcomes": {"type": "array", "items": _ref("Outcome")},
                            },
                        },
                        "routed and committed: one outcome per binding of the source",
                    ),
                    **_SEND_ERRORS,
                },
            }
        },
        "/addresses/{scope}/{document}/{key}/events": {
            "post": {
                "summary": "Send an event to the execution an address names",
                "operationId": "send_to_address",
                "parameters": [
                    _path_param("scope", "the address's scope"),
                    _path_param("document", "the address's document"),
                    _path_param("key", "the address's key"),
                    _IDEMPOTENCY,
                ],
                "requestBody": _SEND_BODY,
                "responses": {"200": sent, **_SEND_ERRORS},
            }
        },
        "/executions": {
            "get": {
                "summary": "List executions, newest first, a page at a time",
                "operationId": "list",
                "parameters": [
                    _query("scope", "required unless the token reaches every scope"),
                    _query("document", "the chart's name"),
                    _query("key", "an address key"),
                    _query(
                        "status", "active, needs_migration, paused, completed, failed, cancelled"
                    ),
                    _query("final_state", "the final state it ended in"),
                    _query("error", "an error event's name its steps raised"),
                    _query("cursor", "the next_cursor of the page before"),
                    _query("limit", "rows per page, 1 to 500 (50)", "integer"),
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "executions": {"type": "array", "items": _ref("Summary")},
                                "next_cursor": _nullable("string"),
                            },
                        },
                        "a page",
                    ),
                    **_ERRORS,
                },
            }
        },
        "/executions/{id}": {
            "get": {
                "summary": "Read one execution",
                "operationId": "read",
                "parameters": [_EXECUTION_ID],
                "responses": {"200": one, **_ERRORS},
            }
        },
        "/executions/{id}/events": {
            "post": {
                "summary": "Send an event to an execution (through its address)",
                "operationId": "send",
                "parameters": [_EXECUTION_ID, _IDEMPOTENCY],
                "requestBody": _SEND_BODY,
                "responses": {"200": sent, **_SEND_ERRORS},
            }
        },
        "/executions/{id}/cancel": _action("cancel", "Cancel an execution", "ended"),
        "/executions/{id}/pause": _action(
            "pause", "Pause an execution: what is sent to it is held", "not_active"
        ),
        "/executions/{id}/resume": _action(
            "resume", "Resume a paused execution: what it held is stepped in", "not_paused"
        ),
        "/bulk": {
            "post": {
                "summary": "Preview a bulk action over a filter, or start it, confirmed",
                "operationId": "bulk",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["action"],
                                "properties": {
                                    "action": {
                                        "enum": ["cancel", "pause", "resume", "retry", "migrate"]
                                    },
                                    "revision": {
                                        "type": "string",
                                        "description": "migrate: the content hash of a "
                                        "stored chart, the revision to move to",
                                    },
                                    "map": {
                                        "type": "object",
                                        "additionalProperties": _nullable("string"),
                                        "description": "migrate: old state id to new, or "
                                        "null for a state removed on purpose",
                                    },
                                    "data": {
                                        "type": "object",
                                        "description": "migrate: values for variables the "
                                        "revision adds",
                                    },
                                    "filter": {
                                        "type": "object",
                                        "description": "scope (required unless the token "
                                        "reaches every scope), document, key, status, "
                                        "final_state, error",
                                    },
                                    "confirm": {
                                        "type": "integer",
                                        "description": "the count the preview gave: starts it",
                                    },
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"selected": {"type": "integer"}}},
                        "the preview: how many executions it would act on",
                    ),
                    "202": _json(_ref("BulkProgress"), "started: its job id and progress"),
                    "409": {
                        "description": "preview_changed: confirm the count selected now",
                        "content": {"application/json": {"schema": _ref("Error")}},
                    },
                    **_ERRORS,
                },
            }
        },
        "/bulk/{job}": {
            "get": {
                "summary": "How far a bulk run has come",
                "operationId": "bulk_progress",
                "parameters": [_path_param("job", "the job id the start answered")],
                "responses": {"200": _json(_ref("BulkProgress"), "its progress"), **_ERRORS},
            }
        },
        "/executions/{id}/wait": {
            "get": {
                "summary": "Wait until a state is active or the execution ends, bounded",
                "operationId": "wait",
                "parameters": [
                    _EXECUTION_ID,
                    _query("state", "a state id to wait for"),
                    _query("end", "true: wait for the end", "boolean"),
                    _query("timeout", "seconds, at most the API's max_wait", "number"),
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "reached": {"type": "boolean"},
                                "execution": _ref("Execution"),
                            },
                        },
                        "reached, or the timeout passed (reached is false)",
                    ),
                    **_ERRORS,
                },
            }
        },
    }


def openapi_document(base: str = "") -> dict[str, Any]:
    """The document, its server at ``base`` (where the API is mounted)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "statifier API", "version": "1"},
        "servers": [{"url": base or "/"}],
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
            "responses": _responses(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
