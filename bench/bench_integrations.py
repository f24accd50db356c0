"""What the framework adapters add per tool call and per model request (issue 16).

For each framework, the same agent (the framework's own offline scripted model, trivial async
tools) runs bare and with the haltwise adapter inside a task, through its plain and its streamed
entry point (the Agents SDK's ``Runner.run`` / ``run_streamed``, Pydantic AI's ``run`` /
``run_stream``, LangChain's ``ainvoke`` / ``astream`` of the model's tokens), on a SQLite store
at ``synchronous=FULL`` and ``NORMAL``. One agent run is ``--calls`` turns of one tool call each,
then the answer: ``calls`` tool calls and ``calls + 1`` model requests, so ``2 * calls + 1``
steps. Bare and adapter runs alternate, so that both see the same moods of a shared machine.
Reported: the median wall time of a run (over ``--runs`` of each, after a warm-up), the ratio
adapter / bare, what haltwise adds per step ((adapter - bare) / steps), the same for the
process's CPU time (user + sys of all threads: less sensitive to a loaded machine), and beside
it the baseline: one raw SQLite ``INSERT`` + ``COMMIT`` (WAL, same ``synchronous``) measured
right after, on the same disk. All in one process, in one invocation.

usage: python bench/bench_integrations.py [--calls N] [--runs N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
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


class Wrap(Enum):
    """How much of the agent the adapter wraps."""

    #: nothing: the framework alone
    BARE = auto()
    #: the model only (model requests are steps; the tool is the framework's own, no step)
    MODEL = auto()
    #: the model and the tools (each tool call a step too): the adapter as users use it
    ALL = auto()


# -- one agent run per framework, wrapped as ``wrap`` says, through its plain or streamed entry --


def agents_runner(calls: int, wrap: Wrap, streamed: bool) -> Callable[[], Awaitable[Any]]:
    from agents import Agent, RunConfig, Runner
    from agents import function_tool as sdk_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from haltwise.integrations.openai_agents import JournaledModel, function_tool, run_streamed

    config = RunConfig(tracing_disabled=True)
    if wrap is Wrap.ALL:
        tools = [function_tool(lookup)]
    else:
        tools = [sdk_tool(bare_lookup, name_override="lookup")]
    adapter = wrap is not Wrap.BARE
    start_streamed = run_streamed if adapter else Runner.run_streamed

    async def run() -> Any:
        turns: list[Any] = [
            [function_call("lookup", {"item": f"i{i}"}, call_id=f"c{i}")] for i in range(calls)
        ]
        model: Any = ScriptedModel([*turns, [assistant_message("done")]])
        agent = Agent(name="a", model=JournaledModel(model) if adapter else model, tools=tools)
        if not streamed:
            result = await Runner.run(agent, "go", run_config=config, max_turns=calls + 2)
            return result.final_output
        stream = start_streamed(agent, "go", run_config=config, max_turns=calls + 2)
        async for _ in stream.stream_events():
            pass
        return stream.final_output

    return run


def pydantic_runner(calls: int, wrap: Wrap, streamed: bool) -> Callable[[], Awaitable[Any]]:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel

    from haltwise.integrations.pydantic_ai import JournaledModel, tool

    tools = [tool(lookup)] if wrap is Wrap.ALL else [Tool(bare_lookup, name="lookup")]
    adapter = wrap is not Wrap.BARE

    async def run() -> Any:
        answers = [
            ModelResponse(parts=[ToolCallPart("lookup", {"item": f"i{i}"}, tool_call_id=f"c{i}")])
            for i in range(calls)
        ] + [ModelResponse(parts=[TextPart("done")])]

        async def stream(messages: Any, info: Any) -> Any:
            (part,) = answers.pop(0).parts
            if isinstance(part, TextPart):
                yield part.content
            else:
                assert isinstance(part, ToolCallPart)
                args = part.args_as_json_str()
                yield {0: DeltaToolCall(part.tool_name, args, tool_call_id=part.tool_call_id)}

        model: Any = FunctionModel(lambda messages, info: answers.pop(0), stream_function=stream)
        agent = Agent(JournaledModel(model) if adapter else model, tools=tools)
        if not streamed:
            return (await agent.run("go")).output
        async with agent.run_stream("go") as result:
            return await result.get_output()

    return run


def langchain_runner(calls: int, wrap: Wrap, streamed: bool) -> Callable[[], Awaitable[Any]]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
    from langchain_core.messages.tool import tool_call_chunk
    from langchain_core.outputs import ChatGenerationChunk
    from langchain_core.tools import StructuredTool

    from haltwise.integrations.langchain import HaltwiseMiddleware, tool

    class Chat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        async def _astream(self, messages: Any, stop: Any = None, **kwargs: Any) -> Any:
            message = self._generate(messages).generations[0].message
            assert isinstance(message, AIMessage)
            chunks = [
                tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
                for i, c in enumerate(message.tool_calls)
            ]
            chunk = AIMessageChunk(content=message.content, tool_call_chunks=chunks)
            yield ChatGenerationChunk(message=chunk)

    class ModelOnly(HaltwiseMiddleware):
        """The middleware's model steps, with its tool calls passed through (no step)."""

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

    if wrap is Wrap.ALL:
        tools, middleware = [tool(lookup)], [HaltwiseMiddleware()]
    else:
        tools = [StructuredTool.from_function(coroutine=bare_lookup)]
        middleware = [ModelOnly()] if wrap is Wrap.MODEL else []

    async def run() -> Any:
        answers = [
            AIMessage(
                content="",
                tool_calls=[{"name": "lookup", "args": {"item": f"i{i}"}, "id": f"c{i}"}],
            )
            for i in range(calls)
        ] + [AIMessage(content="done")]
        agent = create_agent(Chat(messages=iter(answers)), tools=tools, middleware=middleware)
        request = {"messages": [HumanMessage("go")]}
        if not streamed:
            return (await agent.ainvoke(request))["messages"][-1].content
        state: Any = None
        async for mode, data in agent.astream(request, stream_mode=["messages", "values"]):
            if mode == "values":
                state = data
        return state["messages"][-1].content

    return run


FRAMEWORKS: dict[str, Callable[[int, Wrap, bool], Callable[[], Awaitable[Any]]]] = {
    "OpenAI Agents": agents_runner,
    "Pydantic AI": pydantic_runner,
    "LangChain": langchain_runner,
}
#: each framework's plain and streamed entry point, as the table names them
MODES = {
    "OpenAI Agents": ("run", "run_streamed"),
    "Pydantic AI": ("run", "run_stream"),
    "LangChain": ("ainvoke", "astream"),
}


class Current:
    """The agent run the benchmark task performs (set before each measurement)."""

    run: Callable[[], Awaitable[Any]]


@haltwise.task(name="bench:integration")
async def journaled_agent() -> Any:
    return await Current.run()


@dataclass(frozen=True, slots=True)
class Timing:
    """One agent run: its wall time and the process's CPU time (user + sys, all threads)."""

    wall: float
    cpu: float


async def timed(run: Callable[[], Awaitable[Any]]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    await run()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


async def alternated_times(
    bare: Callable[[], Awaitable[Any]],
    variants: Sequence[tuple[Callable[[], Awaitable[Any]], int]],
    runs: int,
    store: str,
) -> tuple[list[Timing], list[list[Timing]]]:
    """The bare run and each adapter variant (its agent run and how many steps it makes),
    alternated run by run after one warm-up of each, so that all see the same moods of a shared
    machine; the times of each."""
    bare_times: list[Timing] = []
    variant_times: list[list[Timing]] = [[] for _ in variants]
    outcomes: list[haltwise.Outcome] = []

    async def journaled() -> None:
        outcomes.append(await (await runtime.start(journaled_agent)).outcome())

    async with haltwise.Runtime(store) as runtime:
        for attempt in range(runs + 1):  # the first of each is the warm-up
            plain = await timed(bare)
            if attempt:
                bare_times.append(plain)
            for (adapted, steps), times in zip(variants, variant_times, strict=True):
                Current.run = adapted
                timing = await timed(journaled)
                outcome = outcomes.pop()
                assert outcome.state is haltwise.State.COMPLETED, outcome
                assert len(outcome.steps) == steps, outcome.steps
                if attempt:
                    times.append(timing)
    return bare_times, variant_times


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


SETTINGS = ("full", "normal")


@dataclass(frozen=True, slots=True)
class Pair:
    """The times of one cell: bare runs and adapter runs, alternated."""

    bare: list[Timing]
    adapted: list[Timing]

    def added(self, cpu: bool = False) -> float:
        """Median adapter run minus median bare run, in seconds of wall (or CPU) time."""
        pick: Callable[[Timing], float] = (lambda t: t.cpu) if cpu else (lambda t: t.wall)
        return median([pick(t) for t in self.adapted]) - median([pick(t) for t in self.bare])

    def ratio(self, cpu: bool = False) -> float:
        pick: Callable[[Timing], float] = (lambda t: t.cpu) if cpu else (lambda t: t.wall)
        return median([pick(t) for t in self.adapted]) / median([pick(t) for t in self.bare])


async def measure(
    calls: int, runs: int, directory: Path
) -> tuple[list[list[object]], list[list[object]]]:
    """The table of whole runs (each entry, each setting) and the split per tool call and per
    model request (plain entry, from the same bare runs), measured in one invocation."""
    rows: list[list[object]] = []
    split: list[list[object]] = []
    steps = 2 * calls + 1
    for name in FRAMEWORKS:
        for mode in MODES[name]:
            for setting in SETTINGS:
                pairs = await _pairs(name, mode, calls, runs, directory, setting)
                raw = raw_commit_seconds(directory / f"raw-{setting}.db", setting, runs * steps)
                rows.append(
                    [name, mode, setting.upper(), *_cells(pairs[Wrap.ALL], steps), _us(raw)]
                )
                if Wrap.MODEL in pairs:
                    split.append([name, setting.upper(), *_split(pairs, calls)])
    return rows, split


async def _pairs(
    name: str, mode: str, calls: int, runs: int, directory: Path, setting: str
) -> dict[Wrap, Pair]:
    """Framework ``name`` through entry ``mode`` at ``setting``: bare runs beside the whole
    adapter's, and (plain entry) beside the model alone wrapped."""
    streamed = mode != MODES[name][0]
    wraps = [Wrap.ALL] if streamed else [Wrap.ALL, Wrap.MODEL]
    make = FRAMEWORKS[name]
    variants = [
        (make(calls, wrap, streamed), 2 * calls + 1 if wrap is Wrap.ALL else calls + 1)
        for wrap in wraps
    ]
    store = f"sqlite:///{directory}/{name.split()[0].lower()}-{mode}-{setting}.db"
    store += f"?synchronous={setting}"
    bare, times = await alternated_times(make(calls, Wrap.BARE, streamed), variants, runs, store)
    return {wrap: Pair(bare, each) for wrap, each in zip(wraps, times, strict=True)}


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def _cells(pair: Pair, steps: int) -> list[str]:
    """Median wall times, their ratio, and what the adapter adds per step in wall and CPU time."""
    return [
        f"{median([t.wall for t in pair.bare]) * 1e3:.2f}",
        f"{median([t.wall for t in pair.adapted]) * 1e3:.2f}",
        f"{pair.ratio():.2f}x",
        _us(pair.added() / steps),
        f"{pair.ratio(cpu=True):.2f}x",
        _us(pair.added(cpu=True) / steps),
    ]


def _split(pairs: dict[Wrap, Pair], calls: int) -> list[str]:
    """Per model request: what wrapping the model alone adds, over its ``calls + 1`` requests;
    per tool call: what wrapping the tools too adds on top, over its ``calls`` calls."""
    whole, model = pairs[Wrap.ALL], pairs[Wrap.MODEL]
    requests = calls + 1
    return [
        _us(model.added() / requests),
        _us((whole.added() - model.added()) / calls),
        _us(model.added(cpu=True) / requests),
        _us((whole.added(cpu=True) - model.added(cpu=True)) / calls),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10, help="tool calls per agent run")
    parser.add_argument("--runs", type=int, default=30, help="measured runs per cell")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = parser.parse_args()
    directory = Path(args.dir or tempfile.mkdtemp(prefix="haltwise-bench-integrations-"))
    rows, split = anyio.run(measure, args.calls, args.runs, directory)
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
                "entry",
                "synchronous",
                "bare run (ms)",
                "with adapter (ms)",
                "ratio",
                "added per step (µs)",
                "CPU ratio",
                "CPU added per step (µs)",
                "raw commit (µs)",
            ],
            rows,
        )
    )
    print(
        "\nSplit (plain entry): the same bare runs beside runs with only the model wrapped (model "
        "requests are steps, the tool is the framework's own); per model request = that "
        "difference / requests, per tool call = the rest of the whole adapter's / calls.\n"
    )
    print(
        table(
            [
                "framework",
                "synchronous",
                "per model request (µs)",
                "per tool call (µs)",
                "CPU per model request (µs)",
                "CPU per tool call (µs)",
            ],
            split,
        )
    )


if __name__ == "__main__":
    main()
