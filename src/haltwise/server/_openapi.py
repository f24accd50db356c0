"""The OpenAPI 3.1 document of the API, served at ``/api/openapi.json``.

Request bodies are the pydantic models of :mod:`._bodies` (so the document and the validation
cannot disagree); responses are described loosely.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel

from .._core.states import State
from ._bodies import (
    BulkCancelBody,
    CancelBody,
    EmptyBody,
    ForkBody,
    ResumeBody,
    SubmitBody,
    UnpauseBody,
)

__all__ = ["openapi_document"]

_MODELS: tuple[type[BaseModel], ...] = (
    CancelBody,
    BulkCancelBody,
    EmptyBody,
    SubmitBody,
    ResumeBody,
    ForkBody,
    UnpauseBody,
)
_ERRORS = {
    "400": "malformed request",
    "401": "no or wrong token",
    "403": "read-only token, or a cross-origin cookie request",
    "404": "unknown run or task",
    "409": "a run held by a live owner, a refused resume, or an existing id with other input",
    "413": "a body over 1 MiB",
    "422": "a body that does not fit",
    "501": "a verb this haltwise does not have",
}
_RUN_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "description": "The run id, percent-encoded (p%2F0 for p/0).",
    "schema": {"type": "string", "minLength": 1},
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": False, "content": {"application/json": {"schema": _ref(model)}}}


def _answers(*codes: str, ok: str = "200") -> dict[str, Any]:
    answers: dict[str, Any] = {ok: {"description": "done", "content": _json({"type": "object"})}}
    for code in ("401", *codes):
        answers[code] = {"description": _ERRORS[code], "content": _json(_ref_error())}
    return answers


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _ref_error() -> dict[str, str]:
    return {"$ref": "#/components/schemas/Error"}


def _events(summary: str, parameters: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "parameters": [
                *parameters,
                {"name": "since", "in": "query", "schema": {"type": "integer", "minimum": 0}},
            ],
            "responses": {
                "200": {"description": "text/event-stream", "content": {"text/event-stream": {}}},
                **{code: _answers(code)[code] for code in ("400", "401", "404")},
            },
        }
    }


def _post(summary: str, model: type[BaseModel], *codes: str, ok: str = "200") -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": [_RUN_ID],
            "requestBody": _body(model),
            "responses": _answers("400", "403", *codes, "413", "422", ok=ok),
        }
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document (built once)."""
    schemas: dict[str, Any] = {
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
        }
    }
    for model in _MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))  # nested models, where their $refs point
        schemas[model.__name__] = schema
    list_parameters = [
        {"name": "state", "in": "query", "schema": {"enum": [s.value for s in State]}},
        {"name": "task", "in": "query", "schema": {"type": "string"}},
        {
            "name": "limit",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
    ]
    paths: dict[str, Any] = {
        "/api/runs": {
            "get": {
                "summary": "runs, newest first: {runs, next}",
                "parameters": list_parameters,
                "responses": _answers("400"),
            },
            "post": {
                "summary": "submit a pending run (with FILE.py only)",
                "requestBody": {**_body(SubmitBody), "required": True},
                "responses": _answers("400", "403", "404", "409", "413", "422", ok="201"),
            },
        },
        "/api/runs/{id}": {
            "get": {
                "summary": "one run: the status --json object, owner, events, waiting",
                "parameters": [_RUN_ID],
                "responses": _answers("404"),
            }
        },
        "/api/runs/{id}/cancel": _post("cancel the run", CancelBody, "404", ok="202"),
        "/api/runs/{id}/pause": _post("pause the run", EmptyBody, "404", "409", "501", ok="202"),
        "/api/runs/{id}/unpause": _post(
            "unpause the run (optionally raising its budget)",
            UnpauseBody,
            "404",
            "409",
            "501",
            ok="202",
        ),
        "/api/runs/{id}/resume": _post(
            "resume the run in the server (with FILE.py only)", ResumeBody, "404", "409", ok="202"
        ),
        "/api/runs/{id}/reconcile": _post(
            "ask the reconcile hooks of the run's unknown steps, journal the answers "
            "(with FILE.py only): 200 with the run's outcome and steps",
            EmptyBody,
            "404",
            "409",
        ),
        "/api/runs/{id}/fork": _post(
            "fork the run from a step: the plan (dry_run), or the fork run in the server "
            "(with FILE.py only)",
            ForkBody,
            "404",
            "422",
            ok="202",
        ),
        "/api/runs/{id}/events": _events("the run's changes (SSE)", [_RUN_ID]),
        "/api/cancel": {
            "post": {
                "summary": "bulk cancel in one transaction",
                "requestBody": {**_body(BulkCancelBody), "required": True},
                "responses": _answers("400", "403", "413", "422"),
            }
        },
        "/api/events": _events("every run's changes (SSE)", []),
        "/api/audit": {"get": {"summary": "audit --json of FILE.py", "responses": _answers("404")}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "haltwise", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
