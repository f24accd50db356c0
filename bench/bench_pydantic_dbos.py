"""Pydantic AI's own DBOS durable execution beside the haltwise adapter (issue 27, "Speed").

The same Pydantic AI agent (a scripted ``FunctionModel``: look up, then charge, then answer, so
3 model requests and 2 tool calls per agent run) runs

- under ``pydantic_ai.durable_exec.dbos`` (the ``DBOSDurability`` capability, the agent run
  inside a ``@DBOS.workflow``: every model request and tool call a DBOS step) on DBOS's SQLite
  system database, at DBOS's own durable default (SQLite's rollback journal, ``synchronous=FULL``:
  a commit per step reaches the disk);
- under the haltwise adapter (``haltwise.integrations.pydantic_ai``: ``JournaledModel`` and
  ``tool``, the agent run inside a ``@haltwise.task``: every model request and tool call a step) on
  a SQLite store at ``synchronous=FULL`` (WAL; a commit per step reaches the disk);
- bare (no durability), as the baseline of the same run;
- as a breakdown (not the same durability), the haltwise adapter at ``synchronous=NORMAL``: what
  is left of a run without the commit's ``fsync``.

Measured: the median wall time per agent run (``--runs`` after a warm-up); then a cancel inside
the finish tool (``charge``) followed by a resume, ``--trials`` times each: how often the
charge's effect happens twice. DBOS: ``DBOS.cancel_workflow_async`` while ``charge`` runs, then
``DBOS.resume_workflow_async``; haltwise: ``handle.cancel()`` while ``charge`` runs (a ``finish``
tool: it finishes), then ``Runtime.resume``. DBOS is a process-wide singleton, so each peer runs
in a process of its own (this script with ``--child``).

usage: python bench/bench_pydantic_dbos.py [--runs N] [--trials N] [--rounds N]

The peers run in ``--rounds`` rounds (each peer once per round, in turn: bare, DBOS, haltwise,
haltwise at NORMAL), each ``--runs`` agent runs in a fresh process; the table gives the median
over rounds of each peer's median time per run, and the median (and range) over rounds of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _report import header, median, table

EFFECTS: list[str] = []
GATE: dict[str, asyncio.Event] = {}


def scripted(messages: list[Any], info: Any) -> Any:
    """Look up, then charge, then answer: derived from the conversation, as a model would."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart

    returns = [
        part.tool_name
        for message in messages
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    ]
    if "charge" in returns:
        return ModelResponse(parts=[TextPart("booked")])
    name, args = ("charge", {"amount": 5}) if "lookup" in returns else ("lookup", {"item": "room"})
    return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c-{uuid.uuid4().hex[:8]}")])


async def lookup_body(item: str) -> str:
    return f"{item} costs 5"


async def charge_body(amount: int) -> str:
    if "entered" in GATE:
        GATE["entered"].set()
        await GATE["release"].wait()
    EFFECTS.append("charge")
    return f"charged {amount}"


# -- the peers -------------------------------------------------------------------------------


def bare_agent() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    agent = Agent(FunctionModel(scripted), name="shop")

    @agent.tool_plain
    async def lookup(item: str) -> str:
        """Look an item up."""
        return await lookup_body(item)

    @agent.tool_plain
    async def charge(amount: int) -> str:
        """Charge the card."""
        return await charge_body(amount)

    return agent


def dbos_setup(where: Path) -> tuple[Any, Any]:
    from dbos import DBOS
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.dbos import DBOSDurability
    from pydantic_ai.models.function import FunctionModel

    DBOS(config={"name": "bench-pydantic", "system_database_url": f"sqlite:///{where}/dbos.db"})
    agent = Agent(FunctionModel(scripted), name="shop", capabilities=[DBOSDurability()])

    @agent.tool_plain
    async def lookup(item: str) -> str:
        """Look an item up."""
        return await lookup_body(item)

    @agent.tool_plain
    async def charge(amount: int) -> str:
        """Charge the card."""
        return await charge_body(amount)

    @DBOS.workflow()
    async def shop(prompt: str) -> str:
        return (await agent.run(prompt)).output

    DBOS.launch()
    return DBOS, shop


def haltwise_setup() -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    import haltwise
    from haltwise.integrations.pydantic_ai import JournaledModel, tool

    @haltwise.tool(cancel="interruptible", effect="read")
    async def lookup(item: str) -> str:
        """Look an item up."""
        return await lookup_body(item)

    @haltwise.tool(cancel="finish", effect="external", idempotent=True)
    async def charge(amount: int) -> str:
        """Charge the card."""
        return await charge_body(amount)

    agent = Agent(JournaledModel(FunctionModel(scripted)), tools=[tool(lookup), tool(charge)])

    @haltwise.task
    async def shop(prompt: str) -> str:
        return (await agent.run(prompt)).output

    return shop


# -- the measurements, each in a child process -----------------------------------------------


async def child(peer: str, what: str, where: Path, runs: int, trials: int) -> dict[str, Any]:
    if peer == "bare":
        agent = bare_agent()
        return {"per_run": await timed(lambda: agent.run("book a room"), runs)}
    if peer == "dbos":
        dbos, shop = dbos_setup(where)
        try:
            if what == "time":
                return {"per_run": await timed(lambda: shop("book a room"), runs)}
            return {"twice": await dbos_cancels(dbos, shop, trials)}
        finally:
            dbos.destroy()
    import haltwise

    shop = haltwise_setup()
    synchronous = "NORMAL" if peer == "haltwise-normal" else "FULL"
    url = f"sqlite:///{where}/haltwise.db?synchronous={synchronous}"
    async with haltwise.Runtime(url) as runtime:
        if what == "time":

            async def one() -> Any:
                return await (await runtime.start(shop, "book a room")).outcome()

            return {"per_run": await timed(one, runs)}
        return {"twice": await haltwise_cancels(runtime, shop, trials)}


async def timed(run: Any, runs: int) -> float:
    for _ in range(max(3, runs // 10)):
        await run()  # warm-up
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await run()
        times.append(time.perf_counter() - began)
    return median(times)


async def dbos_cancels(dbos: Any, shop: Any, trials: int) -> int:
    from dbos import SetWorkflowID

    twice = 0
    for trial in range(trials):
        EFFECTS.clear()
        GATE.update(entered=asyncio.Event(), release=asyncio.Event())
        with SetWorkflowID(f"w{trial}"):
            handle = await dbos.start_workflow_async(shop, "book a room")
        await GATE["entered"].wait()
        await dbos.cancel_workflow_async(f"w{trial}")
        GATE["release"].set()  # the charge goes on to its end, as a finish tool would
        try:
            await handle.get_result()
        except Exception:  # the cancelled workflow's error: expected
            pass
        GATE.clear()
        resumed = await dbos.resume_workflow_async(f"w{trial}")
        await resumed.get_result()
        twice += EFFECTS.count("charge") > 1
    return twice


async def haltwise_cancels(runtime: Any, shop: Any, trials: int) -> int:
    twice = 0
    for trial in range(trials):
        EFFECTS.clear()
        GATE.update(entered=asyncio.Event(), release=asyncio.Event())
        handle = await runtime.start(shop, "book a room", task_id=f"h{trial}")
        await GATE["entered"].wait()
        await handle.cancel()
        GATE["release"].set()
        outcome = await handle.outcome()
        assert outcome.state.value == "cancelled", outcome
        GATE.clear()
        resumed = await (await runtime.resume(f"h{trial}", task=shop)).outcome()
        assert resumed.state.value == "completed", resumed
        twice += EFFECTS.count("charge") > 1
    return twice


def measure(peer: str, what: str, runs: int, trials: int) -> dict[str, Any]:
    where = Path(tempfile.mkdtemp(prefix=f"bench-pd-{peer}-"))
    done = subprocess.run(
        [sys.executable, __file__, "--child", peer, what, str(where), str(runs), str(trials)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{peer} {what} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


PEERS = ("bare", "dbos", "haltwise", "haltwise-normal")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=5)
    args = parser.parse_args()
    if args.child:
        peer, what, where, runs, trials = args.child
        result = asyncio.run(child(peer, what, Path(where), int(runs), int(trials)))
        print(json.dumps(result))
        return
    print(header("Pydantic AI under its own DBOS durable execution and under haltwise"))
    load = Path("/proc/loadavg").read_text().split()[:3]
    # Rounds of every peer in turn (bare, DBOS, haltwise, ...; then again), not each peer's
    # runs in one block: a change of the machine's load meanwhile weighs on every peer alike.
    per_run: dict[str, list[float]] = {peer: [] for peer in PEERS}
    for _ in range(args.rounds):
        for peer in PEERS:
            per_run[peer].append(measure(peer, "time", args.runs, 0)["per_run"])
    dbos_twice = measure("dbos", "cancel", 0, args.trials)["twice"]
    ours_twice = measure("haltwise", "cancel", 0, args.trials)["twice"]
    after = Path("/proc/loadavg").read_text().split()[:3]
    ratios = {
        peer: sorted(d / o for d, o in zip(per_run["dbos"], per_run[peer], strict=True))
        for peer in ("haltwise", "haltwise-normal")
    }
    cost = sorted(o / b for o, b in zip(per_run["haltwise"], per_run["bare"], strict=True))

    def ms(peer: str) -> str:
        return f"{median(per_run[peer]) * 1000:.2f}"

    def spread(values: list[float]) -> str:
        return f"{median(values):.2f}x (rounds {values[0]:.2f}-{values[-1]:.2f})"

    rows = [
        ["bare Pydantic AI (no durability)", ms("bare"), "-", "-"],
        [
            "pydantic_ai.durable_exec.dbos (SQLite, FULL)",
            ms("dbos"),
            f"{spread(ratios['haltwise'])} haltwise",
            f"{dbos_twice}/{args.trials}",
        ],
        [
            "haltwise adapter (SQLite WAL, FULL)",
            ms("haltwise"),
            "1.00x",
            f"{ours_twice}/{args.trials}",
        ],
        [
            "breakdown: haltwise adapter at synchronous=NORMAL (not the same durability)",
            ms("haltwise-normal"),
            spread(ratios["haltwise-normal"]),
            "-",
        ],
    ]
    print(
        table(
            ["agent run (3 model requests, 2 tool calls)", "median ms/run", "DBOS / this",
             "cancel in charge + resume: charged twice"],
            rows,
        )
    )  # fmt: skip
    print(
        f"the adapter's cost beside the bare framework (reported, not a target): haltwise / bare "
        f"{spread(cost)}; {args.rounds} rounds of {args.runs} runs per peer, medians of rounds"
    )
    print(f"load before: {' '.join(load)}; after: {' '.join(after)}")


if __name__ == "__main__":
    main()
