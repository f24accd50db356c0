"""What the framework adapters add per tool call and per model request (issue 16).

For each framework, the same agent (the framework's own offline scripted model, trivial async
tools) runs bare and with the haltwise adapter inside a task, on a SQLite store at
``synchronous=FULL`` and ``NORMAL``. One agent run is ``--calls`` turns of one tool call each,
then the answer: ``calls`` tool calls and ``calls + 1`` model requests, so ``2 * calls + 1``
steps. Bare and adapter runs alternate, so that both see the same moods of a shared machine.
Reported: the median wall time of a run (over ``--runs`` of each, after a warm-up), the ratio
adapter / bare, what haltwise adds per step ((adapter - bare) / steps), and beside it the
baseline: one raw SQLite ``INSERT`` + ``COMMIT`` (WAL, same ``synchronous``) measured right after,
on the same disk. All in one process, in one invocation.

usage: python bench/bench_integrations.py [--calls N] [--runs N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _report import header, median, table

import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup(item: str) -> str:
    """Look an item up."""
    return f"{item} costs 5"


async def bare_lookup(item: str) -> str:
    """Look an item up."""
    return f"{item} costs 5"


# -- one agent run per framework, bare (adapter=False) or with the adapter -----------------------


def agents_runner(calls: int, adapter: bool) -> Callable[[], Awaitable[Any]]:
    from agents import Agent, RunConfig, Runner
    from agents import function_tool as sdk_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from haltwise.integrations.openai_agents import JournaledModel, function_tool

    config = RunConfig(tracing_disabled=True)
    tools = [function_tool(lookup)] if adapter else [sdk_tool(bare_lookup, name_override="lookup")]

    async def run() -> Any:
        turns: list[Any] = [
            [function_call("lookup", {"item": f"i{i}"}, call_id=f"c{i}")] for i in range(calls)
        ]
        model: Any = ScriptedModel([*turns, [assistant_message("done")]])
        agent = Agent(name="a", model=JournaledModel(model) if adapter else model, tools=tools)
        result = await Runner.run(agent, "go", run_config=config, max_turns=calls + 2)
        return result.final_output

    return run


def pydantic_runner(calls: int, adapter: bool) -> Callable[[], Awaitable[Any]]:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from haltwise.integrations.pydantic_ai import JournaledModel, tool

    tools = [tool(lookup)] if adapter else [Tool(bare_lookup, name="lookup")]

    async def run() -> Any:
        answers = [
            ModelResponse(parts=[ToolCallPart("lookup", {"item": f"i{i}"}, tool_call_id=f"c{i}")])
            for i in range(calls)
        ] + [ModelResponse(parts=[TextPart("done")])]
        model: Any = FunctionModel(lambda messages, info: answers.pop(0))
        agent = Agent(JournaledModel(model) if adapter else model, tools=tools)
        return (await agent.run("go")).output

    return run


def langchain_runner(calls: int, adapter: bool) -> Callable[[], Awaitable[Any]]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import StructuredTool

    from haltwise.integrations.langchain import HaltwiseMiddleware, tool

    class Chat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    tools = [tool(lookup)] if adapter else [StructuredTool.from_function(coroutine=bare_lookup)]
    middleware = [HaltwiseMiddleware()] if adapter else []

    async def run() -> Any:
        answers = [
            AIMessage(
                content="",
                tool_calls=[{"name": "lookup", "args": {"item": f"i{i}"}, "id": f"c{i}"}],
            )
            for i in range(calls)
        ] + [AIMessage(content="done")]
        agent = create_agent(Chat(messages=iter(answers)), tools=tools, middleware=middleware)
        state = await agent.ainvoke({"messages": [HumanMessage("go")]})
        return state["messages"][-1].content

    return run


FRAMEWORKS: dict[str, Callable[[int, bool], Callable[[], Awaitable[Any]]]] = {
    "OpenAI Agents": agents_runner,
    "Pydantic AI": pydantic_runner,
    "LangChain": langchain_runner,
}


class Current:
    """The agent run the benchmark task performs (set before each measurement)."""

    run: Callable[[], Awaitable[Any]]


@haltwise.task(name="bench:integration")
async def journaled_agent() -> Any:
    return await Current.run()


async def paired_times(
    bare: Callable[[], Awaitable[Any]],
    adapted: Callable[[], Awaitable[Any]],
    runs: int,
    store: str,
    steps: int,
) -> tuple[list[float], list[float]]:
    """Bare and adapter runs alternated (after one warm-up of each), so that both see the same
    moods of a shared machine; the wall time of each."""
    Current.run = adapted
    bare_times: list[float] = []
    adapter_times: list[float] = []
    async with haltwise.Runtime(store) as runtime:
        for attempt in range(runs + 1):  # the first of each is the warm-up
            start = time.perf_counter()
            await bare()
            middle = time.perf_counter()
            outcome = await (await runtime.start(journaled_agent)).outcome()
            end = time.perf_counter()
            assert outcome.state is haltwise.State.COMPLETED, outcome
            assert len(outcome.steps) == steps, outcome.steps
            if attempt:
                bare_times.append(middle - start)
                adapter_times.append(end - middle)
    return bare_times, adapter_times


def raw_commit_seconds(path: Path, setting: str, commits: int) -> float:
    """The baseline: one ``INSERT`` + ``COMMIT`` on a WAL SQLite file at ``setting``, per commit."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={setting}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER, v TEXT)")
    start = time.perf_counter()
    for i in range(commits):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 64))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / commits


async def measure(calls: int, runs: int, directory: Path) -> list[list[object]]:
    steps = 2 * calls + 1
    rows: list[list[object]] = []
    for name, make in FRAMEWORKS.items():
        for setting in ("full", "normal"):
            store = f"sqlite:///{directory}/{name.split()[0].lower()}-{setting}.db"
            store += f"?synchronous={setting}"
            pair = await paired_times(make(calls, False), make(calls, True), runs, store, steps)
            bare, adapted = median(pair[0]), median(pair[1])
            raw = raw_commit_seconds(directory / f"raw-{setting}.db", setting, runs * steps)
            rows.append(
                [
                    name,
                    setting.upper(),
                    f"{bare * 1e3:.2f}",
                    f"{adapted * 1e3:.2f}",
                    f"{adapted / bare:.2f}x",
                    f"{(adapted - bare) / steps * 1e6:.0f}",
                    f"{raw * 1e6:.0f}",
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10, help="tool calls per agent run")
    parser.add_argument("--runs", type=int, default=30, help="measured runs per cell")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    directory = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-bench-integrations-"))
    rows = anyio.run(measure, args.calls, args.runs, directory)
    print(header("The framework adapters: what haltwise adds per tool call and model request"))
    print(
        f"One agent run: {args.calls} tool calls and {args.calls + 1} model requests "
        f"({2 * args.calls + 1} steps); median of {args.runs} runs of each, bare and adapter "
        "alternated, after a warm-up.\n"
    )
    print(
        table(
            [
                "framework",
                "synchronous",
                "bare run (ms)",
                "with adapter (ms)",
                "ratio",
                "added per step (µs)",
                "raw commit (µs)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
