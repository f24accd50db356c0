"""``haltwise mcp FILE.py`` reports a call awaiting approval as progress (CONTRACT.md, "Someone
else decides"): a real stdio subprocess driven by the MCP SDK's own client, the decision made by
``haltwise approve`` in a third process, on both stores. The paid tool appends a line to
``effects.log`` when it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from _wait import until

pytestmark = pytest.mark.anyio

AGENT = """
from pathlib import Path

import haltwise

HERE = Path(__file__).parent


@haltwise.tool(cancel="finish", effect="external", idempotent=True, approval="required")
async def pay(amount: int) -> str:
    with open(HERE / "effects.log", "a") as log:
        log.write(f"pay:{amount}\\n")
    return f"paid {amount}"


@haltwise.task
async def buy(amount: int) -> str:
    haltwise.emit({"asking": amount})
    return await pay(amount)
"""


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("pg_url")
        return url
    return f"sqlite:///{tmp_path}/haltwise.db"


async def test_a_call_awaiting_approval_is_reported_as_progress(tmp_path: Path, store: str) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "haltwise", "mcp", str(agent), "--store", store],
        cwd=str(tmp_path),
    )
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    answers: list[Any] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        async with anyio.create_task_group() as group:

            async def call() -> None:
                answers.append(
                    await session.call_tool(
                        "buy",
                        {"amount": 7},
                        progress_callback=on_progress,
                        meta={"haltwise/idempotency-key": "m1"},
                    )
                )

            group.start_soon(call)
            await until(lambda: len(progress) == 2, "the request reported as progress")
            assert (tmp_path / "effects.log").exists() is False  # nothing ran before approval
            decided = await anyio.to_thread.run_sync(
                lambda: subprocess.run(
                    [sys.executable, "-m", "haltwise", "approve", "m1", "0", "--by", "ops"],
                    cwd=tmp_path,
                    env={**_environ(), "HALTWISE_STORE": store},
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            )
            assert decided.returncode == 0, decided.stderr
    [answer] = answers
    assert not answer.is_error, answer
    assert answer.structured_content == {"result": "paid 7"}
    assert progress == [
        (1, '{"asking": 7}'),
        (2, "[haltwise] step 0 (pay) awaits approval: haltwise approve m1 0"),
    ]
    assert (tmp_path / "effects.log").read_text().split() == ["pay:7"]


def _environ() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "HALTWISE_STORE"}
