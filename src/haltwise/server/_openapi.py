"""The OpenAPI 3.1 document of the API, served at ``/api/openapi.json``.

Request bodies are the pydantic models of :mod:`._bodies` (so the document and the validation
cannot disagree: the ``$defs`` a model's schema holds are hoisted into ``components``, where
every ``$ref`` points); responses are the shapes of :mod:`haltwise._core.views` (``Run``,
``RunList``, ``Step``, ``Error`` ...). The document validates with openapi-spec-validator
(tests/server/test_openapi.py).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

from .._core.states import State
from ._bodies import (
    NO_NUL,
    BulkCancelBody,
    CancelBody,
    DecisionBody,
    EmptyBody,
    ForkBody,
    ResumeBody,
    SubmitBody,
    UnpauseBody,
)
from ._sse import MAX_CHANGE

__all__ = ["openapi_document"]

_MODELS: tuple[type[BaseModel], ...] = (
    CancelBody,
    BulkCancelBody,
    EmptyBody,
    SubmitBody,
    ResumeBody,
    ForkBody,
    DecisionBody,
    UnpauseBody,
)
_ERRORS = {
    "400": "malformed request (a query parameter out of range, a cursor no page gave, a run id "
    "that is not percent-encoded UTF-8, a body that is not JSON)",
    "401": "no or wrong token",
    "403": "read-only token, or a cross-origin cookie request",
    "404": "unknown run or task",
    "405": "another method is needed here (the Allow header names it)",
    "409": "a run held by a live owner, a refused resume, an existing id with other input, or "
    "a decision on an approval request that is not awaiting",
    "413": "a body over 1 MiB",
    "422": "a body that does not fit (the message names every problem)",
    "501": "a verb this haltwise does not have",
    "503": "the store cannot be reached",
}
_RUN_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The run id, percent-encoded UTF-8 (p%2F0 for p/0).",
    "schema": {"type": "string", "minLength": 1},
}

_NULLABLE_TEXT = {"type": ["string", "null"]}
_STATE = {"type": "string", "enum": [state.value for state in State]}
_ERROR_INFO = {
    "type": "object",
    "required": ["type", "message"],
    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
}

#: The response shapes (JSON Schema), by component name.
_RESPONSES: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "ErrorInfo": _ERROR_INFO,
    "RunRow": {
        "description": "one run as `list --json` shows it",
        "type": "object",
        "required": ["id", "task", "state", "reason", "retry"],
        "properties": {
            "id": {"type": "string"},
            "task": {"type": "string"},
            "state": _STATE,
            "reason": _NULLABLE_TEXT,
            "retry": {"type": "string"},
            "created_at": {"type": "number", "description": "with ?times=1"},
            "updated_at": {"type": "number", "description": "with ?times=1"},
            "progress": {
                "description": "with ?progress=1: the run's committed steps and its steps "
                "journaled so far",
                "type": "object",
                "required": ["done", "known"],
                "properties": {
                    "done": {"type": "integer", "minimum": 0},
                    "known": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
    "RunList": {
        "type": "object",
        "required": ["runs", "next"],
        "properties": {
            "runs": {"type": "array", "items": {"$ref": "#/components/schemas/RunRow"}},
            "next": {
                **_NULLABLE_TEXT,
                "description": "the cursor of the next page, null on the last",
            },
        },
    },
    "Step": {
        "description": "one step as `status --json` shows it, with its last attempt's times",
        "type": "object",
        "required": ["index", "tool", "cancel", "effect", "idempotent", "status", "attempts"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "tool": {"type": "string"},
            "cancel": _NULLABLE_TEXT,
            "effect": {"type": "string"},
            "idempotent": {"type": "boolean"},
            "status": {"type": "string"},
            "attempts": {"type": "integer", "minimum": 0},
            "error": {"$ref": "#/components/schemas/ErrorInfo"},
            "started_at": {"type": ["number", "null"], "description": "epoch seconds"},
            "settled_at": {"type": ["number", "null"], "description": "epoch seconds"},
        },
    },
    "Run": {
        "description": "the `status --json` object plus owner, events, waiting and times",
        "type": "object",
        "required": ["id", "task", "state", "reason", "retry", "result", "error", "partials"],
        "properties": {
            "id": {"type": "string"},
            "task": {"type": "string"},
            "state": _STATE,
            "reason": _NULLABLE_TEXT,
            "retry": {"type": "string"},
            "result": {},
            "error": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/ErrorInfo"}]},
            "cancel_error": {"$ref": "#/components/schemas/ErrorInfo"},
            "partials": {"type": "array"},
            "steps": {"type": "array", "items": {"$ref": "#/components/schemas/Step"}},
            "owner": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["host", "pid", "alive"],
                        "properties": {
                            "host": {"type": "string"},
                            "pid": {"type": "integer"},
                            "alive": {"type": "boolean"},
                        },
                    },
                ]
            },
            "events": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["from", "to", "reason", "at"],
                    "properties": {
                        "from": {"oneOf": [{"type": "null"}, _STATE]},
                        "to": _STATE,
                        "reason": _NULLABLE_TEXT,
                        "at": {"type": "number"},
                    },
                },
            },
            "waiting": {"type": "array"},
            "retry_why": {"type": "string"},
            "created_at": {"type": "number"},
            "updated_at": {"type": "number"},
        },
    },
    "RunState": {
        "description": "the run and its state once the request was made (null, and the id in "
        "`remembered`, for a cancel before start of an id no run has yet)",
        "type": "object",
        "required": ["id", "state"],
        "properties": {
            "id": {"type": "string"},
            "state": {"oneOf": [{"type": "null"}, _STATE]},
            "remembered": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Submitted": {
        "type": "object",
        "required": ["id"],
        "properties": {"id": {"type": "string"}},
    },
    "BulkCancelResult": {
        "description": "what a bulk cancel did; with dry_run, `{would_cancel}` only",
        "type": "object",
        "properties": {
            name: {"type": "array", "items": {"type": "string"}}
            for name in ("cancelled", "already_final", "unknown", "would_cancel")
        },
    },
    "ForkPlan": {
        "description": "which committed write/external steps the fork runs again",
        "type": "object",
        "required": ["source", "from_step", "will_repeat"],
        "properties": {
            "source": {"type": "string"},
            "from_step": {"type": "integer"},
            "will_repeat": {"type": "array"},
            "id": _NULLABLE_TEXT,
        },
    },
    "Forked": {
        "type": "object",
        "required": ["id", "state", "fork"],
        "properties": {
            "id": {"type": "string"},
            "state": _STATE,
            "fork": {"$ref": "#/components/schemas/ForkPlan"},
        },
    },
    "Approvals": {
        "description": "the pending approval requests, oldest first",
        "type": "object",
        "required": ["approvals"],
        "properties": {
            "approvals": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["run", "step", "tool", "arguments", "requested_at", "timeout_at"],
                    "properties": {
                        "run": {"type": "string"},
                        "step": {"type": "integer"},
                        "tool": {"type": "string"},
                        "arguments": {"type": "object"},
                        "requested_at": {"type": "number"},
                        "timeout_at": {"type": ["number", "null"]},
                    },
                },
            }
        },
    },
    "DecidedStep": {
        "description": "the step as decided: the `status --json` step with its `approval`",
        "type": "object",
        "required": ["index", "approval"],
        "properties": {
            "index": {"type": "integer"},
            "approval": {
                "type": "object",
                "required": ["state", "by", "at", "note"],
                "properties": {
                    "state": {"enum": ["approved", "edited", "refused"]},
                    "by": _NULLABLE_TEXT,
                    "at": {"type": "number"},
                    "note": _NULLABLE_TEXT,
                },
            },
        },
    },
    "Audit": {
        "description": "the `audit --json` object of FILE.py",
        "type": "object",
        "required": ["tools", "findings"],
        "properties": {"tools": {"type": "array"}, "findings": {"type": "array"}},
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(model: type[BaseModel], *, required: bool = False) -> dict[str, Any]:
    return {"required": required, "content": _json(_ref(model.__name__))}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _answers(ok: dict[str, str], *codes: str) -> dict[str, Any]:
    """``ok``: success code -> (description, response schema name), then the error codes."""
    answers: dict[str, Any] = {}
    for code, text in ok.items():
        description, _, name = text.rpartition(":")
        answers[code] = {"description": description, "content": _json(_ref(name))}
    for code in ("401", *codes):
        answers[code] = {"description": _ERRORS[code], "content": _json(_ref("Error"))}
    return answers


def _events(summary: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    since = {"type": "string", "pattern": "^[0-9]{1,18}$"}
    return {
        "get": {
            "summary": summary,
            "description": (
                "One event per change: `id` its number, `event` its kind (`transition`, `step`, "
                "`partial`), `data` the change as JSON with what it is about (a transition's "
                "`from`, `to` and `reason`; a step's `step` and `status`; a partial's `value`)."
            ),
            "parameters": [
                *parameters,
                {
                    "name": "since",
                    "in": "query",
                    "description": "replay the changes after this one",
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_CHANGE},
                },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "description": "as `since`: the id of the last event a client saw",
                    "schema": since,
                },
            ],
            "responses": {
                "200": {
                    "description": "text/event-stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **_answers({}, "400", "404", "405"),
            },
        }
    }


def _post(summary: str, model: type[BaseModel], ok: dict[str, str], *codes: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_RUN_ID],
            "requestBody": _body(model),
            "responses": _answers(ok, "400", "403", "404", "405", *codes, "413", "422", "503"),
        }
    }


def _schemas() -> dict[str, Any]:
    """The request bodies' schemas and the response shapes, every ``$defs`` hoisted."""
    schemas: dict[str, Any] = dict(_RESPONSES)
    for model in _MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document (built once)."""
    list_parameters = [
        {"name": "state", "in": "query", "schema": _STATE},
        {"name": "task", "in": "query", "schema": {"type": "string", "pattern": NO_NUL}},
        {
            "name": "limit",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        {
            "name": "times",
            "in": "query",
            "description": "1: each row also has `created_at` and `updated_at` (epoch seconds)",
            "schema": {"type": "string", "enum": ["0", "1"]},
        },
        {
            "name": "progress",
            "in": "query",
            "description": '1: each row also has `progress`: `{"done", "known"}`, its '
            "`committed` steps and the steps journaled so far",
            "schema": {"type": "string", "enum": ["0", "1"]},
        },
        {
            "name": "cursor",
            "in": "query",
            "description": "the `next` of the page before (opaque); any other text is a 400",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
        },
    ]
    accepted = {"202": "the request was made:RunState", "200": "the run is final already:RunState"}
    paths: dict[str, Any] = {
        "/api/runs": {
            "get": {
                "summary": "runs, newest first: {runs, next}",
                "parameters": list_parameters,
                "responses": _answers({"200": "a page of runs:RunList"}, "400", "503"),
            },
            "post": {
                "summary": "submit a pending run (with FILE.py only)",
                "requestBody": _body(SubmitBody, required=True),
                "responses": _answers(
                    {
                        "201": "a new pending run:Submitted",
                        "200": "the id exists with the same task and input:Submitted",
                    },
                    "400",
                    "403",
                    "404",
                    "409",
                    "413",
                    "422",
                    "503",
                ),
            },
        },
        "/api/runs/{id}": {
            "get": {
                "summary": "one run: the status --json object, owner, events, waiting",
                "parameters": [_RUN_ID],
                "responses": _answers({"200": "the run:Run"}, "400", "404", "405", "503"),
            }
        },
        "/api/runs/{id}/cancel": _post("cancel the run", CancelBody, accepted),
        "/api/runs/{id}/pause": _post(
            "pause the run", EmptyBody, {"202": "requested:RunState"}, "409", "501"
        ),
        "/api/runs/{id}/unpause": _post(
            "unpause the run (optionally raising its budget)",
            UnpauseBody,
            {"202": "requested:RunState"},
            "409",
            "501",
        ),
        "/api/runs/{id}/resume": _post(
            "resume the run in the server (with FILE.py only)",
            ResumeBody,
            {"202": "resumed:RunState", "200": "resumed, and completed already:RunState"},
            "409",
        ),
        "/api/runs/{id}/reconcile": _post(
            "ask the reconcile hooks of the run's unknown steps, journal the answers "
            "(with FILE.py only): 200 with the run's outcome and steps",
            EmptyBody,
            {"200": "the run's outcome, its steps among it:Run"},
            "409",
        ),
        "/api/runs/{id}/fork": _post(
            "fork the run from a step: the plan (dry_run), or the fork run in the server "
            "(with FILE.py only)",
            ForkBody,
            {"202": "the fork runs:Forked", "200": "dry_run: the plan:ForkPlan"},
            "409",
        ),
        "/api/runs/{id}/events": _events("the run's changes (SSE)", [_RUN_ID]),
        "/api/runs/{id}/approvals/{step}": {
            "post": {
                **_post(
                    "decide the step's pending approval request",
                    DecisionBody,
                    {"200": "the step as decided:DecidedStep"},
                    "409",
                )["post"],
                "parameters": [
                    _RUN_ID,
                    {
                        "name": "step",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 0},
                    },
                ],
                "requestBody": _body(DecisionBody, required=True),
            }
        },
        "/api/approvals": {
            "get": {
                "summary": "the pending approval requests, oldest first",
                "responses": _answers({"200": "the pending requests:Approvals"}, "503"),
            }
        },
        "/api/cancel": {
            "post": {
                "summary": "bulk cancel in one transaction",
                "requestBody": _body(BulkCancelBody, required=True),
                "responses": _answers(
                    {"200": "done:BulkCancelResult"}, "400", "403", "413", "422", "503"
                ),
            }
        },
        "/api/events": _events("every run's changes (SSE)", []),
        "/api/audit": {
            "get": {
                "summary": "audit --json of FILE.py",
                "responses": _answers({"200": "the audit:Audit"}, "404"),
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "haltwise", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
