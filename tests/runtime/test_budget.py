"""Budgets (CONTRACT.md, "Someone else decides: approvals and budgets"), on both stores: a limit
stops the run before its next step, the spend in ``status --json`` is the journal's sum, a run
paused for its budget is raised and goes on, spend across resumes counted once, a child's spend
stops its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

import haltwise
from haltwise import ChangeKind, State, StepStatus
from haltwise._core.budget import Spent, parse_budget

pytestmark = pytest.mark.anyio

#: how many times each tool body ran, by tool and argument (reset per test)
LEDGER: dict[str, int] = {}
GATE: dict[str, anyio.Event] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    LEDGER.clear()
    GATE.clear()


def _count(name: str) -> None:
    LEDGER[name] = LEDGER.get(name, 0) + 1


@haltwise.tool(cancel="interruptible", effect="read")
async def look(i: int) -> int:
    _count(f"look{i}")
    return i


@haltwise.tool(cancel="finish", effect="write")
async def paid(i: int, usd: float, tokens: int) -> int:
    """A step that pays: its spend is journaled with its settlement."""
    _count(f"paid{i}")
    haltwise.spend(usd=usd, tokens=tokens)
    return i


@haltwise.task(budget=haltwise.Budget(tool_calls=2), name="budget:three_looks")
async def three_looks() -> str:
    for i in range(3):
        await look(i)
    return "done"


@haltwise.task(name="budget:payments")
async def payments(n: int, usd: float, tokens: int = 0) -> str:
    for i in range(n):
        await paid(i, usd, tokens)
    return "paid"


@haltwise.task(name="budget:waits_then_pays")
async def waits_then_pays(n: int) -> str:
    for i in range(n):
        await paid(i, 0.0, 100)
        if i == 1:
            await GATE["after_two"].wait()  # the task's own code: cancelled here, outside steps
    return "paid"


@haltwise.task(name="budget:child_pays")
async def child_pays(n: int) -> str:
    for i in range(n):
        await paid(i, 1.0, 0)
    return "child"


@haltwise.task(name="budget:parent")
async def parent() -> str:
    await look(0)
    await child_pays(5)
    await look(1)
    return "parent"


def journal_sum(outcome: haltwise.Outcome) -> dict[str, Any]:
    return Spent.of(outcome.steps).to_json()


async def feed_until_final(rt: haltwise.Runtime, run_id: str) -> list[tuple[str, Any]]:
    """The run's changes, (kind, status), from the first until its final transition."""
    seen: list[tuple[str, Any]] = []
    with anyio.fail_after(60):
        async with aclosing(rt.changes(0, run_id=run_id)) as changes:  # type: ignore[type-var]
            async for change in changes:
                seen.append((change.kind.value, change.status))
                if change.kind is ChangeKind.TRANSITION and State(change.status).is_final:
                    return seen
    raise AssertionError("the feed ended")


async def test_tool_calls_lets_n_calls_begin_and_the_next_never_does(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(three_looks, task_id="t")).outcome()
        feed = await feed_until_final(rt, "t")
    # the feed says the budget is exhausted, then the run is cancelled (SSE: event "budget")
    exhausted = feed.index(("budget", "exhausted"))
    assert feed[exhausted + 1 :] == [("transition", "cancelling"), ("transition", "cancelled")]
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED] * 2
    assert LEDGER == {"look0": 1, "look1": 1}
    data = outcome.to_json()
    assert data["budget"]["limit"]["tool_calls"] == 2
    assert data["budget"]["spent"] == {"usd": 0.0, "tokens": 0, "tool_calls": 2}
    assert data["budget"]["spent"] == journal_sum(outcome)


async def test_a_run_without_a_budget_counts_its_spend(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(payments, 3, 0.25, 10, task_id="free")).outcome()
    assert outcome.state is State.COMPLETED
    data = outcome.to_json()["budget"]
    assert data == {"limit": None, "spent": {"usd": 0.75, "tokens": 30, "tool_calls": 3}}
    assert [(step.usd, step.tokens) for step in outcome.steps] == [(0.25, 10)] * 3


class _Dollars(float):
    """A float of a subclass (numpy's ``float64`` is one)."""


#: amounts haltwise.spend refuses: negative, not a number, a bool, a fraction of a token
_BAD_AMOUNTS: list[dict[str, Any]] = [
    {"usd": -1},
    {"usd": True},
    {"usd": "1"},
    {"usd": float("nan")},
    {"tokens": 1.5},
    {"tokens": -2},
    {"tokens": False},
]


@haltwise.tool(cancel="interruptible", effect="none")
async def odd_amounts() -> list[str]:
    refused = []
    for amount in _BAD_AMOUNTS:
        try:
            haltwise.spend(**amount)
        except haltwise.InputError as error:
            refused.append(str(error))
    haltwise.spend(usd=_Dollars(0.5), tokens=7)
    haltwise.spend(usd=1)  # an int is a number of dollars
    return refused


@haltwise.task(name="budget:odd_amounts")
async def spends_odd_amounts() -> list[str]:
    return await odd_amounts()


async def test_spend_refuses_bad_amounts_and_takes_a_numbers_subclass(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        outcome = await (await rt.start(spends_odd_amounts, task_id="odd")).outcome()
    assert outcome.state is State.COMPLETED
    refused = outcome.result
    assert len(refused) == len(_BAD_AMOUNTS)
    for message, amount in zip(refused, _BAD_AMOUNTS, strict=True):
        (name,) = amount
        assert message.startswith(f"haltwise.spend({name}=") and "\n" not in message
    assert outcome.to_json()["budget"]["spent"] == {"usd": 1.5, "tokens": 7, "tool_calls": 1}


async def test_usd_reached_cancels_before_the_next_step(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        budget = haltwise.Budget(usd=1.0)  # the run's own replaces the task's (none)
        outcome = await (await rt.start(payments, 5, 0.4, task_id="u", budget=budget)).outcome()
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    # 0.4, 0.8, 1.2: the third step's spend reached the limit; no fourth step began
    assert LEDGER == {"paid0": 1, "paid1": 1, "paid2": 1}
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED] * 3
    spent = outcome.to_json()["budget"]["spent"]
    assert spent == journal_sum(outcome)
    assert spent["usd"] == pytest.approx(1.2)


async def test_tokens_reached_pauses_then_raised_completes_nothing_repeated(
    store_url: str,
) -> None:
    budget = haltwise.Budget(tokens=250, on_exhaust="pause")
    async with haltwise.Runtime(store_url) as rt:
        handle = await rt.start(payments, 5, 0.0, 100, task_id="p", budget=budget)
        with anyio.fail_after(60):
            while (await rt.status("p")).state is not State.PAUSED:
                await rt.store.wait_for_change(0.05)
        status = await rt.status("p")
        assert status.reason == "budget"
        assert LEDGER == {"paid0": 1, "paid1": 1, "paid2": 1}
        assert status.to_json()["budget"]["spent"]["tokens"] == 300
        await rt.unpause("p", budget=haltwise.Budget(tokens=10_000))
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert outcome.reason is None
    assert {f"paid{i}": 1 for i in range(5)} == LEDGER
    data = outcome.to_json()["budget"]
    assert data["limit"]["tokens"] == 10_000
    assert data["limit"]["on_exhaust"] == "pause"
    assert data["spent"] == journal_sum(outcome) == {"usd": 0.0, "tokens": 500, "tool_calls": 5}


async def test_spend_across_cancel_and_resume_is_counted_once(store_url: str) -> None:
    budget = haltwise.Budget(tokens=450)
    async with haltwise.Runtime(store_url) as rt:
        GATE["after_two"] = anyio.Event()
        handle = await rt.start(waits_then_pays, 6, task_id="r", budget=budget)
        with anyio.fail_after(60):
            while LEDGER.get("paid1") != 1:
                await anyio.sleep(0.005)
        await handle.cancel()
        first = await handle.outcome()
        assert (first.state, first.reason) == (State.CANCELLED, "user")
        GATE["after_two"].set()
        # Resumed: steps 0 and 1 replay (their 200 tokens counted once), 2, 3 and 4 run, and
        # the limit (450) is reached by step 4's spend: no step 5.
        await rt.resume("r")
        outcome = await rt.outcome("r")
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert {f"paid{i}": 1 for i in range(5)} == LEDGER
    assert outcome.to_json()["budget"]["spent"] == journal_sum(outcome)
    assert journal_sum(outcome)["tokens"] == 500


async def test_a_childs_spend_stops_its_parent(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        budget = haltwise.Budget(usd=2.5)
        outcome = await (await rt.start(parent, task_id="fam", budget=budget)).outcome()
        child = await rt.status("fam/1")
    assert (outcome.state, outcome.reason) == (State.CANCELLED, "budget")
    assert (child.state, child.reason) == (State.CANCELLED, "parent")
    # 1.0, 2.0, 3.0: the child's third step reached the parent's limit
    assert LEDGER == {"look0": 1, "paid0": 1, "paid1": 1, "paid2": 1}
    assert child.to_json()["budget"]["spent"]["usd"] == pytest.approx(3.0)
    spent = outcome.to_json()["budget"]["spent"]
    # the parent's child step carries its child's spend: look0 and the child's three calls
    assert spent == {"usd": 3.0, "tokens": 0, "tool_calls": 4}


def test_budget_text_and_bad_values() -> None:
    assert parse_budget("usd=5,tokens=200000,tool_calls=50") == haltwise.Budget(
        usd=5.0, tokens=200_000, tool_calls=50
    )
    assert parse_budget("tokens=10,on_exhaust=pause").on_exhaust == "pause"
    for text in ("usd=-1", "tokens=1.5", "bogus=1", "usd", "", "on_exhaust=stop"):
        with pytest.raises(haltwise.InputError):
            parse_budget(text)
    with pytest.raises(haltwise.InputError):
        haltwise.Budget(usd=float("nan"))
    with pytest.raises(haltwise.InputError):
        haltwise.Budget(prices={"m": (1.0,)})  # type: ignore[dict-item]
    with pytest.raises(haltwise.PolicyError):
        haltwise.task(budget={"usd": 1})  # type: ignore[arg-type]


CRASHING = """
import asyncio, os, sys
from pathlib import Path

import haltwise

LEDGER = Path(os.environ["HW_LEDGER"])


@haltwise.tool(cancel="interruptible", effect="read")
async def pay(i: int) -> int:
    with LEDGER.open("a") as ledger:
        ledger.write(f"{i}\\n")
    haltwise.spend(tokens=100)
    if i == 2 and LEDGER.read_text().count("2") == 1:
        os.kill(os.getpid(), 9)  # killed in its third step: that step's spend is not journaled
    return i


@haltwise.task(name="crashing:pays", budget=haltwise.Budget(tokens=450))
async def pays() -> int:
    for i in range(6):
        await pay(i)
    return 6


async def main() -> None:
    async with haltwise.Runtime(sys.argv[1]) as rt:
        await (await rt.start(pays, task_id="k")).outcome()


if __name__ == "__main__":
    asyncio.run(main())
"""


def test_spend_across_kill_9_and_takeover_is_counted_once(store_url: str, tmp_path: Path) -> None:
    agent = tmp_path / "crashing.py"
    agent.write_text(CRASHING)
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "HW_LEDGER": str(ledger)}
    crashed = subprocess.run(
        [sys.executable, str(agent), store_url], env=env, capture_output=True, timeout=120
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    command = ["resume", "k", str(agent), "--json", "--store", store_url]
    resumed = subprocess.run(
        [sys.executable, "-m", "haltwise", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert resumed.returncode == 3, resumed.stderr  # cancelled
    outcome = json.loads(resumed.stdout)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "budget")
    # steps 0 and 1 replayed (not run again); step 2 ran again after the takeover (its first
    # attempt's spend died with the process); step 4's spend reached 450: no step 5
    assert ledger.read_text().split() == ["0", "1", "2", "2", "3", "4"]
    assert [step["attempts"] for step in outcome["steps"]] == [1, 1, 2, 1, 1]
    # 5 journaled settlements of 100 tokens; the killed attempt began, so it is a tool call
    assert outcome["budget"]["spent"] == {"usd": 0.0, "tokens": 500, "tool_calls": 6}
