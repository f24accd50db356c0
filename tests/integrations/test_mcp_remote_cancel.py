"""A cancel reaches remote work (CONTRACT.md, "Steps: identity, concurrency, and cancels that come
from the host"): a run calls a tool of a plain MCP server (the SDK's low-level server, in its own
process) through ``remote_tools``; ``haltwise cancel`` from another process interrupts the step.

The remote server logs every ``notifications/cancelled`` as it arrives on its stdin, and ``eof``
when the pipe closes; the run's process exits right after the run is final (``os._exit``: nothing
is flushed on the way out), so the notification is in the log only if it was sent before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import haltwise
from _wait import until

pytestmark = pytest.mark.anyio

PATIENCE = 30.0

SERVER = """
import sys
from pathlib import Path

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

HERE = Path(__file__).parent
OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def log(text):
    with open(HERE / "remote.log", "a") as out:
        out.write(text + "\\n")
        out.flush()


TOOLS = [
    types.Tool(name="wait", description="Wait until cancelled.", input_schema=OBJECT,
               annotations=types.ToolAnnotations(read_only_hint=True)),
]


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params):
    log("start")
    await anyio.sleep_forever()


server = Server("remote", on_list_tools=list_tools, on_call_tool=call_tool)


async def logged(read, forward):
    # every inbound message on to the server; each notifications/cancelled logged on arrival
    async with read, forward:
        async for message in read:
            inner = getattr(message, "message", None)
            if getattr(inner, "method", None) == "notifications/cancelled":
                log("notifications/cancelled")
            await forward.send(message)
    log("eof")


async def main():
    async with stdio_server() as (read, write), anyio.create_task_group() as group:
        forward, inbound = anyio.create_memory_object_stream(100)
        group.start_soon(logged, read, forward)
        await server.run(inbound, write, server.create_initialization_options())


anyio.run(main)
"""

AGENT = """
import os
import sys
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import haltwise
from haltwise.integrations.mcp import remote_tools

HERE = Path(__file__).parent


@haltwise.task
async def remote_wait(q: str) -> str:
    params = StdioServerParameters(
        command=sys.executable, args=[str(HERE / "server.py")], cwd=str(HERE)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name: t for t in await remote_tools(session)}
        return await tools["wait"](q=q)


async def main(store):
    async with haltwise.Runtime(store) as runtime:
        outcome = await (await runtime.start(remote_wait, "tea", task_id="r1")).outcome()
    with open(HERE / "client.log", "w") as out:
        out.write(outcome.state.value + "\\n")
    os._exit(0)  # the process may exit as soon as the run is final


anyio.run(main, sys.argv[1])
"""


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def test_a_cancel_from_another_process_reaches_the_remote_server_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "agent.py").write_text(AGENT)
    store = f"sqlite:///{tmp_path}/haltwise.db"
    client = subprocess.Popen(
        [sys.executable, str(tmp_path / "agent.py"), store], cwd=tmp_path, env=os.environ.copy()
    )
    try:
        await until(lambda: "start" in lines(tmp_path / "remote.log"), "the remote call")
        cancel = subprocess.run(
            [sys.executable, "-m", "haltwise", "cancel", "r1", "--store", store],
            capture_output=True,
            text=True,
            timeout=PATIENCE,
        )
        assert cancel.returncode == 0, cancel.stderr
        assert client.wait(timeout=PATIENCE) == 0
    finally:
        if client.poll() is None:
            client.kill()
    assert lines(tmp_path / "client.log") == ["cancelled"]
    await until(lambda: "eof" in lines(tmp_path / "remote.log"), "the server's end")
    assert lines(tmp_path / "remote.log") == ["start", "notifications/cancelled", "eof"]
    async with haltwise.Runtime(store) as runtime:
        outcome = await runtime.status("r1")
    assert [(s.tool, s.status) for s in outcome.steps] == [
        ("wait", haltwise.StepStatus.INTERRUPTED)
    ]
    check = subprocess.run(
        [sys.executable, "-m", "haltwise", "check", "--store", store],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert check.returncode == 0, check.stdout + check.stderr
