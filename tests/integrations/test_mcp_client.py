"""``remote_tools(session)``: a real MCP server subprocess (written with the SDK) as haltwise tools.

The server logs every effect to ``effects.log`` (with the idempotency key it was sent), and a
cancelled ``wait`` logs ``wait:cancelled``, so the tests see what reached the other process.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import haltwise
from _wait import until
from haltwise.integrations.mcp import McpToolError, remote_tools

pytestmark = pytest.mark.anyio

SERVER = """
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

HERE = Path(__file__).parent
OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def effect(text):
    with open(HERE / "effects.log", "a") as log:
        log.write(text + "\\n")


TOOLS = [
    types.Tool(name="lookup", description="Look a thing up.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="pay", description="Pay for it.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                                 idempotent_hint=True, open_world_hint=True)),
    types.Tool(name="wait", description="Wait for a gate.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="broken", description="Always fails.", input_schema=OBJECT),
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


def text(value):
    return types.CallToolResult(content=[types.TextContent(type="text", text=value)])


async def call_tool(ctx, params):
    q = params.arguments["q"]
    key = (ctx.meta or {}).get("haltwise/idempotency-key")
    if params.name == "lookup":
        effect(f"lookup:{q}")
        return types.CallToolResult(content=[], structured_content={"found": q})
    if params.name == "pay":
        effect(f"pay:{q}:{key}")
        return text(f"paid {q}")
    if params.name == "wait":
        effect("wait:start")
        try:
            while not (HERE / "release-wait").exists():
                await anyio.sleep(0.005)
        except anyio.get_cancelled_exc_class():
            effect("wait:cancelled")
            raise
        effect("wait:done")
        return text("waited")
    return types.CallToolResult(content=[types.TextContent(type="text", text="no")], is_error=True)


server = Server("remote", on_list_tools=list_tools, on_call_tool=call_tool)


async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


anyio.run(main)
"""

PATIENCE = 30.0
#: the remote tools of the session under test, by name (a task finds them here)
REMOTE: dict[str, haltwise.Tool[..., Any]] = {}


@asynccontextmanager
async def remote_session(tmp_path: Path) -> AsyncIterator[ClientSession]:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    params = StdioServerParameters(command=sys.executable, args=[str(script)], cwd=str(tmp_path))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def effects(tmp_path: Path) -> list[str]:
    log = tmp_path / "effects.log"
    return log.read_text().split() if log.exists() else []


@haltwise.task
async def buy(q: str) -> list[Any]:
    found = await REMOTE["lookup"](q=q)
    paid = await REMOTE["pay"](q=q)
    return [found, paid]


@haltwise.task
async def wait_then_pay(q: str) -> Any:
    await REMOTE["wait"](q=q)
    return await REMOTE["pay"](q=q)


@haltwise.task
async def call_broken(q: str) -> Any:
    return await REMOTE["broken"](q=q)


async def test_policies_come_from_the_annotations_unless_given(tmp_path: Path) -> None:
    async with remote_session(tmp_path) as session:
        tools = await remote_tools(session, policies={"wait": {"cancel": "finish", "grace": 1}})
    by_name = {t.name: t for t in tools}
    assert list(by_name) == ["lookup", "pay", "wait", "broken"]
    lookup, pay, wait = by_name["lookup"].policy, by_name["pay"].policy, by_name["wait"].policy
    assert (lookup.cancel, lookup.effect) == (haltwise.CancelPolicy.INTERRUPTIBLE, "read")
    assert (pay.cancel, pay.effect, pay.idempotent) == (None, "external", True)
    assert (wait.cancel, wait.grace) == (haltwise.CancelPolicy.FINISH, 1)
    schema = by_name["lookup"].schema("openai")["function"]["parameters"]
    assert schema["required"] == ["q"]
    assert schema["properties"]["q"]["type"] == "string"


async def test_each_remote_call_is_a_step_carrying_its_idempotency_key(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with remote_session(tmp_path) as session:
        REMOTE.update({t.name: t for t in await remote_tools(session)})
        async with haltwise.Runtime(sqlite_url) as runtime:
            outcome = await (await runtime.start(buy, "tea", task_id="b1")).outcome()
    assert outcome.state is haltwise.State.COMPLETED
    assert outcome.result == [{"found": "tea"}, "paid tea"]
    assert [(s.tool, s.status) for s in outcome.steps] == [
        ("lookup", haltwise.StepStatus.COMMITTED),
        ("pay", haltwise.StepStatus.COMMITTED),
    ]
    assert effects(tmp_path) == ["lookup:tea", f"pay:tea:{outcome.steps[1].idempotency_key}"]


async def test_a_cancel_of_an_interruptible_remote_call_sends_the_mcp_cancel(
    tmp_path: Path, sqlite_url: str
) -> None:
    async with remote_session(tmp_path) as session:
        REMOTE.update({t.name: t for t in await remote_tools(session)})
        async with haltwise.Runtime(sqlite_url) as runtime:
            handle = await runtime.start(wait_then_pay, "tea", task_id="w1")
            await until(lambda: "wait:start" in effects(tmp_path))
            await handle.cancel(reason="user")
            outcome = await handle.outcome()
            await until(lambda: "wait:cancelled" in effects(tmp_path))
    assert outcome.state is haltwise.State.CANCELLED
    assert [(s.tool, s.status) for s in outcome.steps] == [
        ("wait", haltwise.StepStatus.INTERRUPTED)
    ]
    assert effects(tmp_path) == ["wait:start", "wait:cancelled"]


async def test_an_error_result_fails_the_step(tmp_path: Path, sqlite_url: str) -> None:
    async with remote_session(tmp_path) as session:
        REMOTE.update({t.name: t for t in await remote_tools(session)})
        with pytest.raises(McpToolError, match="'broken': no"):
            await REMOTE["broken"](q="x")  # outside a task: a plain call
        async with haltwise.Runtime(sqlite_url) as runtime:
            outcome = await (await runtime.start(call_broken, "x", task_id="e1")).outcome()
    assert outcome.state is haltwise.State.FAILED
    assert outcome.error is not None
    assert outcome.error.type == "McpToolError"
    assert [s.status for s in outcome.steps] == [haltwise.StepStatus.FAILED]


async def test_a_timed_out_call_is_settled_by_its_policy(tmp_path: Path, sqlite_url: str) -> None:
    async with remote_session(tmp_path) as session:
        tools = await remote_tools(session, policies={"wait": {"cancel": "finish"}}, timeout=0.3)
        REMOTE.update({t.name: t for t in tools})
        async with haltwise.Runtime(sqlite_url) as runtime:
            outcome = await (await runtime.start(wait_then_pay, "tea", task_id="t1")).outcome()
            await until(lambda: "wait:cancelled" in effects(tmp_path))
    assert outcome.state is haltwise.State.CANCELLED
    assert outcome.reason == "mcp-timeout"
    assert [(s.tool, s.status) for s in outcome.steps] == [("wait", haltwise.StepStatus.UNKNOWN)]
    assert outcome.retry is haltwise.Retry.RECONCILE
