"""LangGraph's side of ``bench/peers.py``, with its SQLite checkpointer.

A run is a ``StateGraph`` whose one node is the step, looping back to itself until ``n`` steps
ran (one superstep, so one checkpoint, per step), invoked with ``durability="sync"`` (each
checkpoint is written before the next step starts). The cancel cancels the asyncio task running
``ainvoke``; the resume invokes the same ``thread_id`` with ``None`` input. Durable settings:
the checkpointer's own (``setup`` turns WAL on and leaves SQLite's ``synchronous=FULL``;
``settings`` reads them back).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

from _peer_common import RUN_STEPS, STEP_SECONDS, CancelTrial, Trace, cancel_moments
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

TRACE = Trace()


class Progress(TypedDict):
    i: int
    n: int
    total: int


def _more(state: Progress) -> str:
    return "step" if state["i"] < state["n"] else END


def _graph(node: Callable[[Progress], Any]) -> StateGraph[Any]:
    graph = StateGraph(Progress)
    graph.add_node("step", node)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", _more, ["step", END])
    return graph


def _trivial_sync(state: Progress) -> dict[str, int]:
    return {"i": state["i"] + 1, "total": state["total"] + state["i"]}


async def _trivial_async(state: Progress) -> dict[str, int]:
    return {"i": state["i"] + 1, "total": state["total"] + state["i"]}


async def _step(state: Progress) -> dict[str, int]:
    index = await TRACE.step(state["i"], STEP_SECONDS)
    return {"i": index + 1, "total": state["total"] + index}


def _config(thread: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}


def settings(db: Path, variant: str) -> str:
    """The settings the checkpointer's ``setup`` leaves on ``db`` (it sets WAL only)."""
    conn = sqlite3.connect(db)
    SqliteSaver(conn).setup()
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    conn.close()
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={str(mode).upper()}, synchronous={names.get(level)}, durability=sync"


def overhead(db: Path, steps: int, variant: str) -> float:
    """Seconds per trivial step; ``variant`` is ``sync`` (SqliteSaver, ``invoke``) or
    ``async`` (AsyncSqliteSaver, ``ainvoke``)."""
    start_state = {"i": 0, "n": steps, "total": 0}
    config = _config("overhead", steps)
    if variant == "sync":
        conn = sqlite3.connect(db, check_same_thread=False)
        app = _graph(_trivial_sync).compile(checkpointer=SqliteSaver(conn))
        start = time.perf_counter()
        app.invoke(start_state, config, durability="sync")  # type: ignore[arg-type]
        elapsed = time.perf_counter() - start
        conn.close()
        return elapsed / steps

    async def run() -> float:
        async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
            app = _graph(_trivial_async).compile(checkpointer=saver)
            start = time.perf_counter()
            await app.ainvoke(start_state, config, durability="sync")  # type: ignore[arg-type]
            return (time.perf_counter() - start) / steps

    return asyncio.run(run())


async def _until_cancelled(call: Awaitable[Any]) -> None:
    try:
        await call
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the run finished before the cancel")


async def _trials(db: Path, trials: int) -> list[CancelTrial]:
    results = []
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        app = _graph(_step).compile(checkpointer=saver)
        for k, delay in enumerate(cancel_moments(trials)):
            TRACE.reset()
            config = _config(f"cancel-{k}", RUN_STEPS)
            start_state = {"i": 0, "n": RUN_STEPS, "total": 0}
            run = asyncio.create_task(app.ainvoke(start_state, config, durability="sync"))  # type: ignore[arg-type]
            await asyncio.sleep(delay)
            start = time.perf_counter()
            run.cancel()
            told = time.perf_counter() - start
            await _until_cancelled(run)
            final = time.perf_counter() - start
            stopped = await TRACE.stopped_after(start)
            snapshot = await app.aget_state(config)  # type: ignore[arg-type]
            committed = set(range(snapshot.values.get("i", 0)))
            before = TRACE.started.copy()
            await app.ainvoke(None, config, durability="sync")  # type: ignore[arg-type]
            rerun, twice = TRACE.repeated(committed, before)
            ok = all(TRACE.completed[i] >= 1 for i in range(RUN_STEPS))
            results.append(CancelTrial(told, final, stopped, len(committed), rerun, twice, ok))
    return results


def cancel_trials(db: Path, trials: int, variant: str) -> list[dict[str, Any]]:
    return [trial.to_json() for trial in asyncio.run(_trials(db, trials))]
