"""``remote_tools(session)``: the tools of an MCP server as haltwise tools.

Each remote tool becomes a :class:`~haltwise.Tool` whose body is one ``tools/call`` on the
session, so that calling it inside a task is a step with a cancel policy:

- the policy is ``policies[name]`` (the keywords of ``@haltwise.tool``) when given, else it is
  read from the server's annotations: ``readOnlyHint`` -> ``cancel="interruptible"``,
  ``effect="read"``; otherwise the cancel is left undeclared (it behaves as ``"finish"``, and
  ``audit`` reports it) with ``effect="external"`` if ``openWorldHint`` is not false, else
  ``"write"``; ``idempotentHint`` -> ``idempotent=True``;
- inside a step the call carries the step's :func:`haltwise.idempotency_key` in
  ``_meta["haltwise/idempotency-key"]`` (a ``haltwise mcp`` server answers a call with a known
  key from the same run);
- an interrupted step cancels the remote call: the SDK sends ``notifications/cancelled``, and
  the step is recorded ``interrupted`` (and the run's process may exit) only once a ping on the
  same connection has come back, so the server has received the cancel
  (:func:`haltwise._runtime.task_api.remote_call`: the send is shielded, bounded by the step's
  grace, by 1 s under a forced cancel; the run's level-triggered cancel does not cut the
  client's own transport meanwhile);
- a call that exceeds ``timeout`` seconds is abandoned (the SDK sends the MCP cancel) and the run
  is cancelled with reason ``"mcp-timeout"``, so that the step is settled by its policy (a
  ``finish`` step becomes ``unknown``: nobody knows whether the server did it) instead of being
  recorded as a plain failure that a resume would silently run again;
- an error result (``isError``) or a protocol error raises :class:`McpToolError`; the step is
  ``failed``.

The tool's parameters are the remote input schema's properties (keyword-only), so
``tool.schema()`` describes them. The session is held by the tool: a process that resumes a run
(after a crash, in another process) builds its own session and calls :func:`remote_tools` again
before resuming, which registers the tools under the same names, so the journal's steps (and
their compensations) find them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, cast

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

import haltwise

from .._core.exceptions import McpToolError
from .._runtime.spans import inject_trace
from .._runtime.task_api import remote_call
from ._mcp_server import IDEMPOTENCY_KEY

__all__ = ["McpToolError", "remote_tools"]

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


async def remote_tools(
    session: ClientSession,
    *,
    policies: Mapping[str, Mapping[str, Any]] | None = None,
    timeout: float | None = None,
) -> list[haltwise.Tool[..., Any]]:
    """Every tool the session's server lists, as haltwise tools (see the module docstring).

    ``policies`` maps a remote tool name to ``@haltwise.tool`` keywords (``cancel``, ``effect``,
    ``idempotent``, ``compensate``, ``grace``); a name the server does not list is ignored.
    ``timeout`` bounds each call (seconds; default: the session's own read timeout). A call's
    value is the result's ``structuredContent`` when there is one, else its text.
    """
    declared = dict(policies or {})
    listed: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return [
        _remote_tool(session, item, declared.get(item.name) or policy_from(item), timeout)
        for item in listed
    ]


def policy_from(item: types.Tool) -> dict[str, Any]:
    """The ``@haltwise.tool`` keywords that a remote tool's annotations imply."""
    hints = item.annotations or types.ToolAnnotations()
    idempotent = bool(hints.idempotent_hint)
    if hints.read_only_hint:
        return {"cancel": "interruptible", "effect": "read", "idempotent": idempotent}
    effect = "write" if hints.open_world_hint is False else "external"
    return {"effect": effect, "idempotent": idempotent}


def _remote_tool(
    session: ClientSession, item: types.Tool, policy: Mapping[str, Any], timeout: float | None
) -> haltwise.Tool[..., Any]:
    name = item.name

    async def call_remote(**arguments: Any) -> Any:
        try:
            key: dict[str, Any] = {IDEMPOTENCY_KEY: haltwise.idempotency_key()}
            inject_trace(key)  # the remote run continues this step's trace
            meta: types.RequestParamsMeta | None = cast("types.RequestParamsMeta", key)
        except haltwise.NotInTaskError:
            meta = None  # called outside a task: a plain call
        try:
            result = await remote_call(
                lambda: session.call_tool(name, arguments, read_timeout_seconds=timeout, meta=meta),
                session.send_ping,
                grace=made.policy.grace,
            )
        except MCPError as error:
            if error.code == types.REQUEST_TIMEOUT:
                raise haltwise.Cancelled("mcp-timeout") from None
            raise McpToolError(name, error.message) from None
        return _value(name, result)

    call_remote.__name__ = call_remote.__qualname__ = name
    call_remote.__doc__ = item.description
    call_remote.__signature__ = _signature(item.input_schema)  # type: ignore[attr-defined]
    made = haltwise.tool(name=name, **policy)(call_remote)
    return made


def _value(name: str, result: types.CallToolResult) -> Any:
    text = "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))
    if result.is_error:
        raise McpToolError(name, text or "the server answered with an error")
    if result.structured_content is not None:
        return result.structured_content
    return text


def _signature(schema: Mapping[str, Any]) -> inspect.Signature:
    """Keyword-only parameters for the schema's properties; required ones have no default."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parameters = [
        inspect.Parameter(
            key,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if key in required else None,
            annotation=_annotation(spec, optional=key not in required),
        )
        for key, spec in properties.items()
        if key.isidentifier()
    ]
    return inspect.Signature(parameters)


def _annotation(spec: Any, *, optional: bool) -> Any:
    kind = _JSON_TYPES.get(str(spec.get("type"))) if isinstance(spec, Mapping) else None
    if kind is None:
        return Any
    return kind | None if optional else kind
