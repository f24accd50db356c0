"""haltwise and MCP both ways: a haltwise task calls the tasks of a ``haltwise mcp`` server.

The server is ``haltwise mcp examples/mcp_tasks.py``, a real stdio subprocess: each of its
``tools/call`` is a haltwise run there. Here, ``remote_tools(session)`` turns its tools into
haltwise tools, so that the remote ``report`` is one step of the local task ``brief``, sent
with the step's idempotency key in ``_meta``.

The local run is cancelled while ``report`` runs remotely: the step is interrupted, which sends
the MCP cancel, and the remote run is cancelled with reason ``"client"`` (its steps settled by
their policies). A retried call with the same key never undoes that stop (the server answers
with the cancelled run's error result), so the operator resumes the remote run where it runs
(``haltwise resume KEY mcp_tasks.py`` on the server's store): it goes on from its journal, and
the sources it had already read are not read again. The local resume then sends the call again
with the *same* key and gets that run's result.

    python examples/mcp_agent.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import haltwise
from haltwise.integrations.mcp import remote_tools

HERE = Path(__file__).resolve().parent
#: the remote tools, by name, once the session is open
REMOTE: dict[str, haltwise.Tool[..., Any]] = {}


@haltwise.task
async def brief(topic: str) -> Any:
    return await REMOTE["report"](topic=topic)


def show(where: str, outcome: haltwise.Outcome) -> None:
    steps = ", ".join(f"{s.tool}:{s.status.value}" for s in outcome.steps)
    print(f"{where}: {outcome.state.value} (reason {outcome.reason}): {steps}")


async def remote_run(store: str, run_id: str) -> haltwise.Outcome:
    async with haltwise.Runtime(store) as runtime:
        return await runtime.status(run_id)


async def first_step_key(handle: haltwise.TaskHandle) -> str:
    """The idempotency key of the local run's first step (the remote run's id), once it began."""
    with anyio.fail_after(30):
        while not (steps := (await handle.status()).steps):
            await anyio.sleep(0.02)
    return steps[0].idempotency_key


async def until(store: str, run_id: str, done: Any) -> haltwise.Outcome:
    """Poll the server's journal until its run ``run_id`` satisfies ``done``."""
    with anyio.fail_after(30):
        while True:
            try:
                run = await remote_run(store, run_id)
                if done(run):
                    return run
            except haltwise.UnknownRunError:
                pass  # the server has not started it yet
            await anyio.sleep(0.02)


async def main() -> None:
    scratch = Path(tempfile.mkdtemp())
    server_store = f"sqlite:///{scratch}/server.db"
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "haltwise", "mcp", str(HERE / "mcp_tasks.py"), "--store", server_store],
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        policy = {"cancel": "interruptible", "effect": "external", "idempotent": True}
        REMOTE.update({t.name: t for t in await remote_tools(session, policies={"report": policy})})
        async with haltwise.Runtime(f"sqlite:///{scratch}/client.db") as runtime:
            handle = await runtime.start(brief, "auroras", task_id="brief")
            key = await first_step_key(handle)
            await until(server_store, key, lambda run: len(run.partials) >= 1)
            await handle.cancel(reason="user")  # the remote run has read a source
            show("local", await handle.outcome())
            show("remote", await until(server_store, key, lambda run: run.state.is_final))
            tasks = str(HERE / "mcp_tasks.py")
            operator = [sys.executable, "-m", "haltwise", "resume", key, tasks]
            operator += ["--store", server_store]
            await anyio.run_process(operator, check=True)  # the operator's decision
            show("remote", await remote_run(server_store, key))
            resumed = await (await runtime.resume("brief")).outcome()
            show("local", resumed)
    show("remote", await remote_run(server_store, key))
    print(f"result: {resumed.result}")


if __name__ == "__main__":
    anyio.run(main)
