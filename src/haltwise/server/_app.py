"""The ASGI application: the JSON API under ``/api`` and the dashboard at ``/``.

Every endpoint goes through the runtime's read API and verbs (``list_runs``, ``inspect``,
``changes``, ``cancel_many``, ``submit``, ``resume``): no SQL, no store. A run id in a path is
percent-encoded (``p%2F0``); the path is split on its raw form, so an id may hold ``/``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, final
from urllib.parse import unquote_to_bytes

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from .._core.budget import Budget
from .._core.exceptions import HaltwiseError, InputError
from .._core.states import FINAL_STATES, PAUSABLE_STATES, RESUMABLE_STATES, State
from .._runtime.runtime import Runtime
from .._runtime.tool import Task
from ._auth import SESSION_COOKIE, Tokens, authorise
from ._bodies import (
    BulkCancelBody,
    CancelBody,
    DecisionBody,
    EmptyBody,
    ForkBody,
    ResumeBody,
    SubmitBody,
    UnpauseBody,
    read_body,
    whole_number,
)
from ._errors import ApiError, error_response, from_haltwise, on_api_error, on_haltwise_error
from ._openapi import openapi_document
from ._sse import EventStream, since_of

__all__ = ["Served", "create_app"]

_log = logging.getLogger("haltwise.server")

#: The files of the dashboard, served from the package (no build step).
_STATIC = {"app.js": "text/javascript", "app.css": "text/css"}
_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
}


@final
@dataclass
class Served:
    """What one ``haltwise serve`` process serves.

    ``tasks`` maps the names runs record to the tasks of ``FILE.py`` (``None`` without a file:
    then submit, resume and audit answer 404); ``audit`` is the file's ``audit --json`` object.
    """

    runtime: Runtime
    tokens: Tokens
    tasks: dict[str, Task[..., Any]] | None = None
    source: Path | None = None
    audit: dict[str, Any] | None = None
    stopping: anyio.Event = field(default_factory=anyio.Event)


Handler = Callable[[Request, Served], Awaitable[Response]]


def create_app(served: Served) -> Starlette:
    """The Starlette application for ``served``."""

    def bind(handler: Handler, *, change: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            authorise(request, served.tokens, change=change and request.method == "POST")
            response = await handler(request, served)
            response.headers.update(_HEADERS)
            return response

        return endpoint

    routes = [
        Route("/", _index(served), methods=["GET"]),
        Route("/static/{name}", bind(_static), methods=["GET"]),
        Route("/api/openapi.json", bind(_openapi), methods=["GET"]),
        Route("/api/runs", bind(_runs, change=True), methods=["GET", "POST"]),
        Route("/api/runs/{rest:path}", bind(_run, change=True), methods=["GET", "POST"]),
        Route("/api/cancel", bind(_bulk_cancel, change=True), methods=["POST"]),
        Route("/api/events", bind(_all_events), methods=["GET"]),
        Route("/api/audit", bind(_audit), methods=["GET"]),
        Route("/api/approvals", bind(_approvals), methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={
            ApiError: on_api_error,
            HaltwiseError: on_haltwise_error,
            HTTPException: _on_http_error,
            Exception: _on_crash,
        },
    )


# -- the dashboard --------------------------------------------------------------------------------


def _index(served: Served) -> Callable[[Request], Awaitable[Response]]:
    async def index(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:
            return _log_in(served.tokens, token)
        try:
            role = authorise(request, served.tokens, change=False)
        except ApiError:
            return _page(401, "Open the address that 'haltwise serve' printed (with ?token=).")
        page = _asset("index.html").replace(_STATES_MARK, _states_json())
        # what the session may do, so a read-only page shows no button it would be refused
        page = page.replace(_SESSION_MARK, json.dumps({"role": role.value}))
        response = HTMLResponse(page)
        response.headers.update(_HEADERS)
        return response

    return index


#: Seconds the dashboard's session cookie lasts (a working day): then the address with
#: ``?token=`` logs in again.
SESSION_MAX_AGE = 12 * 3600

#: Where index.html takes the run states, inside ``<script id="states" type="application/json">``
#: (a data block: the page's script reads it, and the content security policy allows it).
_STATES_MARK = "{{states}}"
#: Where index.html takes the session's role (``{"role": "operator" | "read"}``).
_SESSION_MARK = "{{session}}"


def _states_json() -> str:
    """The run states as the dashboard's script reads them, from ``haltwise._core.states``.

    ``all``: every state, in the order of :class:`State`; ``final``: the final ones; ``active``:
    the others (a cancel applies to them); ``pausable`` and ``resumable``: the states a pause
    applies to and the ones ``resume`` leaves. Each list is in the order of ``all``. No ``<``
    in the text, so it cannot end the script element it stands in.
    """
    sets = {
        "final": FINAL_STATES,
        "active": frozenset(State) - FINAL_STATES,
        "pausable": PAUSABLE_STATES,
        "resumable": RESUMABLE_STATES,
    }
    table = {"all": [state.value for state in State]} | {
        name: [state.value for state in State if state in members] for name, members in sets.items()
    }
    return json.dumps(table).replace("<", "\\u003c")


def _log_in(tokens: Tokens, token: str) -> Response:
    """``GET /?token=``: set the session cookie and redirect, so the token leaves the address."""
    role = tokens.role_of_token(token)
    if role is None:
        return _page(401, "That token is not valid for this server.")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        tokens.session_for(role),
        max_age=SESSION_MAX_AGE,
        httponly=True,
        samesite="strict",
        path="/",
    )
    response.headers.update(_HEADERS)
    return response


def _page(status: int, text: str) -> HTMLResponse:
    body = f"<!doctype html><title>haltwise</title><p>{text}</p>"  # constant texts only
    return HTMLResponse(body, status_code=status, headers=_HEADERS)


async def _static(request: Request, served: Served) -> Response:
    name = request.path_params["name"]
    if name not in _STATIC:
        raise ApiError(404, "not_found", "no such file")
    return Response(_asset(name), media_type=_STATIC[name])


def _asset(name: str) -> str:
    return resources.files("haltwise.server").joinpath("static", name).read_text("utf-8")


# -- runs ------------------------------------------------------------------------------------------


async def _openapi(request: Request, served: Served) -> Response:
    return JSONResponse(openapi_document())


async def _runs(request: Request, served: Served) -> Response:
    if request.method == "POST":
        return await _submit(request, served)
    params = request.query_params
    limit = whole_number(params.get("limit", "100"), "limit", low=1, high=1000)
    if any("\x00" in value for value in params.values()):
        raise ApiError(400, "malformed", "a query parameter holds a NUL character")
    try:
        page = await served.runtime.list_runs(
            state=params.get("state") or None,
            task=params.get("task") or None,
            limit=limit,
            cursor=params.get("cursor") or None,
            progress=params.get("progress") == "1",
        )
    except InputError as error:
        raise from_haltwise(error, input_status=400) from None
    listing = page.to_json()
    if params.get("times") == "1":  # the dashboard's list: when each run began and last moved
        for row, run in zip(listing["runs"], page.runs, strict=True):
            row["created_at"], row["updated_at"] = run.created_at, run.updated_at
    for row, run in zip(listing["runs"], page.runs, strict=True):
        if run.progress is not None:  # the dashboard's list: how far each run got
            row["progress"] = {"done": run.progress[0], "known": run.progress[1]}
    return JSONResponse(listing)


async def _run(request: Request, served: Served) -> Response:
    run_id, action = _member(request)
    method = request.method
    if method == "GET" and action is None:
        return JSONResponse((await served.runtime.inspect(run_id)).to_json())
    if method == "GET" and action == "events":
        await served.runtime.inspect(run_id)  # 404 for an unknown run
        since = since_of(request)
        return EventStream(served.runtime.changes(since, run_id=run_id), served.stopping)
    if method == "POST" and action in _ACTIONS:
        return await _ACTIONS[action](request, served, run_id)
    if method == "POST" and action is not None and action.startswith("approvals/"):
        return await _decide(request, served, run_id, action.removeprefix("approvals/"))
    if action is not None and action.startswith("approvals/"):
        raise ApiError(405, "method_not_allowed", "use POST here", headers={"Allow": "POST"})
    if action in _ACTIONS or action in (None, "events"):
        allowed = "POST" if action in _ACTIONS else "GET"
        raise ApiError(405, "method_not_allowed", f"use {allowed} here", headers={"Allow": allowed})
    raise ApiError(404, "not_found", "no such endpoint")


def _member(request: Request) -> tuple[str, str | None]:
    """The run id (percent-decoded) and the action after it, from the raw path.

    Every endpoint under ``/api/runs/{id}`` takes its id from here, so the one rule on ids
    from a path is here too: an id with a NUL character names no run (no store can hold one;
    PostgreSQL would refuse the query), whatever the endpoint: 404, as for any unknown id. An
    id whose bytes are not UTF-8 (``%FF``, a surrogate's ``%ED%A0%80``) is malformed: 400.
    """
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    tail = raw.split(b"?", 1)[0][len(b"/api/runs/") :]
    parts = tail.split(b"/")
    if len(parts) == 3 and parts[1] == b"approvals" and parts[2]:  # .../approvals/{step}
        parts = [parts[0], b"approvals/" + parts[2]]
    if not parts[0] or len(parts) > 2 or (len(parts) == 2 and not parts[1]):
        raise ApiError(404, "not_found", "no such endpoint")
    try:
        run_id = unquote_to_bytes(parts[0]).decode("utf-8")
        action = parts[1].decode("latin-1") if len(parts) == 2 else None
    except UnicodeDecodeError:
        raise ApiError(400, "malformed", "a run id in a path is percent-encoded UTF-8") from None
    if "\x00" in run_id:
        raise ApiError(404, "unknown_run", f"no run with id {run_id!r}: an id holds no NUL")
    return run_id, action


async def _cancel(request: Request, served: Served, run_id: str) -> Response:
    body = await read_body(request, CancelBody)
    batch = await served.runtime.cancel_many([run_id], reason=body.reason, force=body.force)
    if batch.unknown:
        if body.before_start:
            return await _cancel_before_start(served, run_id, body)
        raise ApiError(404, "unknown_run", f"no run with id {run_id!r} in the store")
    state = batch.states[run_id]
    status = 200 if batch.already_final else 202
    answer: dict[str, Any] = {"id": run_id, "state": state.value}
    if body.before_start:
        answer["remembered"] = []
    return JSONResponse(answer, status_code=status)


async def _cancel_before_start(served: Served, run_id: str, body: CancelBody) -> Response:
    """``{"before_start": true}`` for an id no run has yet: its cancel is remembered for
    ``ttl`` seconds (202, ``"state": null``, ``"remembered": [id]``); a run that began
    meanwhile is cancelled as usual."""
    record = await served.runtime.cancel(
        run_id, reason=body.reason, force=body.force, before_start=True, ttl=body.ttl
    )
    remembered = [run_id] if record is None else []
    state = None if record is None else record.state.value
    return JSONResponse({"id": run_id, "state": state, "remembered": remembered}, status_code=202)


async def _pause(request: Request, served: Served, run_id: str) -> Response:
    return await _verb(request, served, run_id, "pause")


async def _unpause(request: Request, served: Served, run_id: str) -> Response:
    body = await read_body(request, UnpauseBody)
    if body.budget is None:
        await served.runtime.unpause(run_id)
    else:
        limits = body.budget
        raised = Budget(usd=limits.usd, tokens=limits.tokens, tool_calls=limits.tool_calls)
        await served.runtime.unpause(run_id, budget=raised)
    detail = await served.runtime.inspect(run_id)
    return JSONResponse({"id": run_id, "state": detail.outcome.state.value}, status_code=202)


async def _verb(request: Request, served: Served, run_id: str, name: str) -> Response:
    await read_body(request, EmptyBody)
    verb = getattr(served.runtime, name, None)
    if verb is None:
        raise ApiError(501, "not_implemented", f"{name} is not available in this haltwise")
    await verb(run_id)
    detail = await served.runtime.inspect(run_id)
    return JSONResponse({"id": run_id, "state": detail.outcome.state.value}, status_code=202)


async def _served_task(served: Served, run_id: str) -> Task[..., Any]:
    """The served task of run ``run_id`` (404 without FILE.py, or for a task it lacks)."""
    tasks = _tasks(served)
    detail = await served.runtime.inspect(run_id)
    task = tasks.get(detail.outcome.task)
    if task is None:
        raise ApiError(
            404, "unknown_task", f"run {run_id!r} is of task {detail.outcome.task!r}, not served"
        )
    return task


async def _resume(request: Request, served: Served, run_id: str) -> Response:
    body = await read_body(request, ResumeBody)
    task = await _served_task(served, run_id)
    assume_done = _step_results(body.assume_done)
    handle = await served.runtime.resume(
        run_id,
        assume_done=assume_done,
        rerun=set(body.rerun),
        deadline=body.deadline,
        task=task,
        allow_code_change=body.allow_code_change,
    )
    state = (await served.runtime.inspect(handle.id)).outcome.state
    status = 200 if state is State.COMPLETED else 202
    return JSONResponse({"id": run_id, "state": state.value}, status_code=status)


async def _reconcile(request: Request, served: Served, run_id: str) -> Response:
    """As ``haltwise reconcile`` (with FILE.py only): the hooks of the run's ``unknown`` steps
    asked and their answers journaled; 200 with the run's outcome (its steps among it)."""
    await read_body(request, EmptyBody)
    task = await _served_task(served, run_id)
    outcome = await served.runtime.reconcile(run_id, task=task)
    return JSONResponse(outcome.to_json())


def _step_results(assume_done: dict[str, Any]) -> dict[int, Any]:
    """``assume_done``'s keys as step numbers (the body's model let only ASCII digits in)."""
    return {int(key): value for key, value in assume_done.items()}


async def _fork(request: Request, served: Served, run_id: str) -> Response:
    """As ``haltwise fork``: the plan (which committed write/external steps run again) with
    ``dry_run``, 200; otherwise the fork runs in the server (with FILE.py only), 202."""
    body = await read_body(request, ForkBody)
    plan = await served.runtime.fork_plan(run_id, from_step=body.from_step, new_id=body.id)
    if body.dry_run:
        return JSONResponse({**plan.to_json(), "id": body.id})
    task = await _served_task(served, run_id)
    handle = await served.runtime.fork(
        run_id, from_step=body.from_step, new_id=body.id, task=task, deadline=body.deadline
    )
    state = (await served.runtime.inspect(handle.id)).outcome.state
    return JSONResponse(
        {"id": handle.id, "state": state.value, "fork": {**plan.to_json(), "id": handle.id}},
        status_code=202,
    )


async def _approvals(request: Request, served: Served) -> Response:
    """``GET /api/approvals``: every pending approval request, oldest first (the body as the
    store builds it: one query, the stored arguments passed through)."""
    body = await served.runtime.approvals_json()
    return Response(body, media_type="application/json")


async def _decide(request: Request, served: Served, run_id: str, step_text: str) -> Response:
    """``POST /api/runs/{id}/approvals/{step}``: 200 with the step; 409 if the request is not
    awaiting (decided already, expired, cancelled, or none)."""
    if not step_text.isdigit():
        raise ApiError(404, "not_found", "no such endpoint: the step is a number")
    step = int(step_text)
    body = await read_body(request, DecisionBody)
    approve = body.decision == "approve"
    if body.edit is not None and not approve:
        raise ApiError(422, "unfit", "an edit goes with an approval, not a refusal")
    await served.runtime.decide(
        run_id, step, approve=approve, edit=body.edit, by=body.by, note=body.note
    )
    detail = (await served.runtime.inspect(run_id)).to_json()
    found = [item for item in detail["steps"] if item["index"] == step]
    return JSONResponse(found[0] if found else {"index": step})


_ACTIONS = {
    "cancel": _cancel,
    "pause": _pause,
    "unpause": _unpause,
    "resume": _resume,
    "reconcile": _reconcile,
    "fork": _fork,
}


async def _bulk_cancel(request: Request, served: Served) -> Response:
    body = await read_body(request, BulkCancelBody)
    named = body.ids is not None
    filtered = body.task is not None or body.state is not None or body.all
    if named == filtered:
        raise ApiError(422, "unfit", 'name "ids", or "task" and/or "state" (or "all": true)')
    batch = await served.runtime.cancel_many(
        body.ids,
        task=body.task,
        state=body.state,
        reason=body.reason,
        force=body.force,
        dry_run=body.dry_run,
    )
    return JSONResponse(batch.to_json())


async def _submit(request: Request, served: Served) -> Response:
    body = await read_body(request, SubmitBody)
    tasks = _tasks(served)
    name = _task_name(tasks, body.task)
    task = tasks[name]
    task.bind_inputs((), body.input)
    run_id, created = await served.runtime.submit(
        task,
        (),
        body.input,
        task_id=body.id,
        name=name,
        source=str(served.source) if served.source else None,
    )
    return JSONResponse({"id": run_id}, status_code=201 if created else 200)


def _tasks(served: Served) -> dict[str, Task[..., Any]]:
    if served.tasks is None:
        raise ApiError(404, "no_file", "this server was started without FILE.py: it runs no task")
    return served.tasks


def _task_name(tasks: dict[str, Task[..., Any]], name: str) -> str:
    """The recorded name ``name`` stands for among the served tasks (bare names allowed)."""
    if name in tasks:
        return name
    matches = [known for known in tasks if known.rpartition(":")[2] == name]
    if len(matches) == 1:
        return matches[0]
    raise ApiError(404, "unknown_task", f"no task {name!r} in the served file")


async def _all_events(request: Request, served: Served) -> Response:
    return EventStream(served.runtime.changes(since_of(request)), served.stopping)


async def _audit(request: Request, served: Served) -> Response:
    if served.audit is None:
        raise ApiError(404, "no_file", "this server was started without FILE.py: no audit")
    return JSONResponse(served.audit)


# -- errors ----------------------------------------------------------------------------------------


async def _on_http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    headers = dict(error.headers or {})  # a 405 keeps starlette's Allow
    return error_response(ApiError(error.status_code, code, str(error.detail), headers=headers))


async def _on_crash(request: Request, error: Exception) -> Response:
    _log.exception("internal error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, "internal", "internal error (see the server's log)"))
