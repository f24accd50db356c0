"""``haltwise mcp FILE.py`` as a real stdio subprocess, driven by the MCP SDK's own client.

Every tool of the served file appends a line to ``effects.log`` when its effect happens, so a test
counts side effects; a gated tool waits for a ``release-NAME`` file, so a test holds a step in
flight exactly as long as it needs (polling the journal with a deadline, never sleeping blindly).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import haltwise
from _wait import until
from haltwise.integrations._mcp_server import TaskServer, served_tasks

pytestmark = pytest.mark.anyio

AGENT = '''
from pathlib import Path

import anyio

import haltwise

HERE = Path(__file__).parent


def effect(name):
    with open(HERE / "effects.log", "a") as log:
        log.write(name + "\\n")


async def until_released(name):
    with anyio.fail_after(60):
        while not (HERE / f"release-{name}").exists():
            await anyio.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> list:
    if query == "boom":
        raise ValueError("no such topic")
    effect("search")
    return [query + "-a", query + "-b"]


@haltwise.tool(cancel="finish", effect="external", idempotent=True)
async def charge(amount: int) -> str:
    await until_released("charge")
    effect("charge")
    return f"charged {amount}"


@haltwise.task
async def research(topic: str, amount: int = 5) -> dict:
    """Search a topic and pay for the report."""
    hits = await search(topic)
    for hit in hits:
        haltwise.emit({"hit": hit})
    receipt = await charge(amount)
    return {"hits": hits, "receipt": receipt}
'''

PATIENCE = 30.0


@pytest.fixture
def served(tmp_path: Path) -> Path:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    return agent


def effects(tmp_path: Path) -> list[str]:
    log = tmp_path / "effects.log"
    return log.read_text().split() if log.exists() else []


#: what each mcp_session's server said of itself in its answer to initialize
SERVER_INFO: list[Any] = []


@asynccontextmanager
async def mcp_session(agent: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "haltwise", "mcp", str(agent), "--store", store_of(agent)],
        cwd=str(agent.parent),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        SERVER_INFO.append((await session.initialize()).server_info)
        yield session


def store_of(agent: Path) -> str:
    return f"sqlite:///{agent.parent}/haltwise.db"


async def status(agent: Path, run_id: str) -> haltwise.Outcome:
    async with haltwise.Runtime(store_of(agent)) as runtime:
        return await runtime.status(run_id)


async def wait_for(agent: Path, run_id: str, state: haltwise.State) -> haltwise.Outcome:
    with anyio.fail_after(PATIENCE):
        while True:
            try:
                outcome = await status(agent, run_id)
            except haltwise.UnknownRunError:
                outcome = None
            if outcome is not None and outcome.state is state:
                return outcome
            await anyio.sleep(0.02)


async def wait_for_step(agent: Path, run_id: str, count: int) -> None:
    with anyio.fail_after(PATIENCE):
        while True:
            try:
                if len((await status(agent, run_id)).steps) >= count:
                    return
            except haltwise.UnknownRunError:
                pass
            await anyio.sleep(0.02)


def key(run_id: str) -> dict[str, Any]:
    return {"haltwise/idempotency-key": run_id}


async def test_lists_each_task_as_a_tool_with_its_schema_and_policy_hints(served: Path) -> None:
    async with mcp_session(served) as session:
        listed = (await session.list_tools()).tools
    info = SERVER_INFO[-1]  # the server names itself and its version (issue 29, item 8)
    assert (info.name, info.version) == ("haltwise", haltwise.__version__)
    assert [tool.name for tool in listed] == ["research"]
    research = listed[0]
    assert research.input_schema["required"] == ["topic"]
    assert set(research.input_schema["properties"]) == {"topic", "amount"}
    assert research.description is not None
    assert "Search a topic" in research.description
    assert "charge (finish, external, idempotent)" in research.description
    hints = research.annotations
    assert hints is not None
    assert hints.read_only_hint is False
    assert hints.open_world_hint is True
    assert hints.idempotent_hint is False  # search is not idempotent


async def test_a_call_is_one_run_with_progress_and_a_retry_is_answered_from_it(
    served: Path,
) -> None:
    (served.parent / "release-charge").touch()
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with mcp_session(served) as session:
        first = await session.call_tool(
            "research", {"topic": "cats"}, progress_callback=on_progress, meta=key("r1")
        )
        again = await session.call_tool("research", {"topic": "cats"}, meta=key("r1"))
    assert not first.is_error
    expected = {"hits": ["cats-a", "cats-b"], "receipt": "charged 5"}
    assert json.loads(first.content[0].text) == expected  # type: ignore[union-attr]
    assert first.structured_content == {"result": expected}
    assert again.structured_content == {"result": expected}
    assert [json.loads(m or "") for _, m in progress] == [{"hit": "cats-a"}, {"hit": "cats-b"}]
    assert [v for v, _ in progress] == [1, 2]
    assert effects(served.parent) == ["search", "charge"]  # the retry ran nothing
    outcome = await status(served, "r1")
    assert outcome.state is haltwise.State.COMPLETED
    assert outcome.task == "agent.py:research"
    assert [step.tool for step in outcome.steps] == ["search", "charge"]


async def test_the_clients_cancel_is_a_haltwise_cancel_and_finish_is_honoured(
    served: Path,
) -> None:
    async with mcp_session(served) as session:
        async with anyio.create_task_group() as group:

            async def call() -> None:
                await session.call_tool("research", {"topic": "dogs"}, meta=key("c1"))

            group.start_soon(call)
            await wait_for_step(served, "c1", 2)  # charge (finish) is in flight
            group.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        cancelling = await wait_for(served, "c1", haltwise.State.CANCELLING)
        assert cancelling.reason == "client"
        (served.parent / "release-charge").touch()  # the finish step may now end
        outcome = await wait_for(served, "c1", haltwise.State.CANCELLED)
        assert outcome.reason == "client"
        assert [step.status for step in outcome.steps] == [
            haltwise.StepStatus.COMMITTED,
            haltwise.StepStatus.COMMITTED,
        ]
        assert effects(served.parent) == ["search", "charge"]
        # the same key again: the cancelled run's error result; a retry never undoes the stop
        answer = await session.call_tool("research", {"topic": "dogs"}, meta=key("c1"))
        # the same key with other arguments: an error result naming the key, nothing run
        other = await session.call_tool("research", {"topic": "cats"}, meta=key("c1"))
    assert answer.is_error
    text = answer.content[0].text  # type: ignore[union-attr]
    assert text == "run 'c1' cancelled, reason 'client'; retry: resume"
    assert other.is_error
    assert "'c1'" in other.content[0].text  # type: ignore[union-attr]
    assert "other inputs" in other.content[0].text  # type: ignore[union-attr]
    assert effects(served.parent) == ["search", "charge"]
    assert (await status(served, "c1")).state is haltwise.State.CANCELLED


async def test_a_failed_run_answers_with_an_error_result_naming_state_and_retry(
    served: Path,
) -> None:
    async with mcp_session(served) as session:
        answer = await session.call_tool("research", {"topic": "boom"}, meta=key("f1"))
    assert answer.is_error
    text = answer.content[0].text  # type: ignore[union-attr]
    assert text == "run 'f1' failed: ValueError: no such topic; retry: restart"
    assert answer.meta is not None
    assert answer.meta["haltwise/outcome"]["state"] == "failed"


async def test_bad_arguments_are_an_error_result_not_a_run(served: Path) -> None:
    async with mcp_session(served) as session:
        answer = await session.call_tool("research", {"subject": "x"}, meta=key("bad"))
        unknown = await session.call_tool("nope", {})
    assert answer.is_error
    assert "research" in answer.content[0].text  # type: ignore[union-attr]
    assert unknown.is_error
    with pytest.raises(haltwise.UnknownRunError):
        await status(served, "bad")
    assert effects(served.parent) == []


def test_mcp_without_tasks_exits_2(tmp_path: Path) -> None:
    import subprocess

    empty = tmp_path / "empty.py"
    empty.write_text("import haltwise\n")
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "mcp", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith("no @haltwise.task in this file")
    assert "Traceback" not in done.stderr


WAITING_AGENT = """
import asyncio

import haltwise

GO = asyncio.Event()


@haltwise.task
async def report(topic: str) -> str:
    haltwise.emit({"found": topic})
    await GO.wait()
    await haltwise.aemit({"done": topic})
    return topic
"""


async def test_progress_is_pushed_by_the_run_and_nothing_polls_while_it_waits(
    tmp_path: Path,
) -> None:
    """The server reads the journal when the run journals a partial result, not on a timer:
    while the run waits (0.5 s, when a 20 ms poll would read it ~25 times) it is not read.
    In process, over the SDK's in-memory transport, with a counting wrapper around the reads."""
    agent = tmp_path / "waiting.py"
    agent.write_text(WAITING_AGENT)
    served, tools = served_tasks(agent)
    go = served[0].task.fn.__globals__["GO"]
    got_first = anyio.Event()
    progress: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(json.loads(message or ""))
        got_first.set()

    async with haltwise.Runtime(f"sqlite:///{tmp_path / 'haltwise.db'}") as runtime:
        reads = 0
        read_status = runtime.status

        async def counted(task_id: str) -> haltwise.Outcome:
            nonlocal reads
            reads += 1
            return await read_status(task_id)

        runtime.status = counted  # type: ignore[method-assign]
        answers: list[Any] = []
        server = TaskServer(runtime, served, tools).server()
        async with Client(server) as client, anyio.create_task_group() as group:

            async def call() -> None:
                answer = await client.call_tool(
                    "report", {"topic": "cats"}, progress_callback=on_progress
                )
                answers.append(answer)

            group.start_soon(call)
            with anyio.fail_after(PATIENCE):
                await got_first.wait()
            before = reads
            await anyio.sleep(0.5)  # the run waits: the time a poll would spend reading
            # at most the one read a pulse given during the first read adds (a 20 ms poll: ~25)
            assert reads - before <= 1
            go.set()
    assert progress == [{"found": "cats"}, {"done": "cats"}]
    (answer,) = answers
    assert answer.structured_content == {"result": "cats"}


async def test_a_call_for_a_run_another_runtime_works_follows_it_through_the_change_feed(
    tmp_path: Path,
) -> None:
    """A retried key whose run another live runtime works is answered from that run: its
    partial results reach this server through the journal's change feed, then its result."""
    agent = tmp_path / "waiting.py"
    agent.write_text(WAITING_AGENT)
    served, tools = served_tasks(agent)
    go = served[0].task.fn.__globals__["GO"]
    progress: dict[str, list[Any]] = {"a": [], "b": []}
    answers: dict[str, Any] = {}
    store = f"sqlite:///{tmp_path / 'haltwise.db'}"

    async def call(client: Client, name: str) -> None:
        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress[name].append(json.loads(message or ""))

        answers[name] = await client.call_tool(
            "report", {"topic": "cats"}, progress_callback=on_progress, meta=key("k1")
        )

    async with haltwise.Runtime(store) as one, haltwise.Runtime(store) as other:
        first, second = TaskServer(one, served, tools), TaskServer(other, served, tools)
        async with (
            Client(first.server()) as client_a,
            Client(second.server()) as client_b,
            anyio.create_task_group() as group,
        ):
            group.start_soon(call, client_a, "a")
            await until(lambda: progress["a"])
            group.start_soon(call, client_b, "b")
            await until(lambda: progress["b"])
            assert not other.is_active("k1")  # the other runtime follows, it does not work it
            go.set()
    assert progress["a"] == progress["b"] == [{"found": "cats"}, {"done": "cats"}]
    assert answers["a"].structured_content == answers["b"].structured_content == {"result": "cats"}
