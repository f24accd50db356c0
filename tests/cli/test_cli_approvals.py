"""Approvals across processes, on both stores (CONTRACT.md, "Someone else decides"): the run is
worked by one ``haltwise run`` process; the decisions, cancels and takeovers come from others,
so every decision crosses processes through the store (SQLite's data-version watcher,
PostgreSQL's LISTEN/NOTIFY). Side effects are counted in a ledger file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _cli_kit import PATIENCE, Env, error_line, finish

AGENT = """
from pathlib import Path

import haltwise

HERE = Path(__file__).parent


def effect(text):
    with open(HERE / "effects.log", "a") as log:
        log.write(text + "\\n")


@haltwise.tool(cancel="finish", effect="external", idempotent=True, approval="required")
async def pay(amount: int, to: str) -> str:
    effect(f"pay:{amount}:{to}:{haltwise.idempotency_key()}")
    return f"paid {amount} to {to}"


@haltwise.tool(cancel="finish", effect="external", approval="required", approval_timeout=0.5)
async def pay_soon(amount: int) -> str:
    effect(f"soon:{amount}")
    return "paid"


@haltwise.task
async def buy(amount: int = 5) -> str:
    try:
        return await pay(amount, "bob")
    except haltwise.ApprovalRefused as refused:
        return f"refused: {refused}"


@haltwise.task
async def buy_soon() -> str:
    try:
        return await pay_soon(7)
    except haltwise.ApprovalExpired as expired:
        return f"expired: {expired}"
"""

#: A decider whose decision waits, after its check that the request awaits, for a file
#: ``go-NAME`` before it writes: two deciders (or a decider and a cancel) race at the write.
DECIDER = """
import sys, time
from pathlib import Path

import anyio

from haltwise._runtime.seat import open_seat

url, run_id, name, verb = sys.argv[1:5]
here = Path(__file__).parent


async def main():
    async with open_seat(url) as seat:
        store = seat._store
        real = store.decide_approval

        async def gated(*args, **kwargs):
            print("ready", flush=True)
            while not (here / f"go-{name}").exists():
                await anyio.sleep(0.005)
            return await real(*args, **kwargs)

        store.decide_approval = gated
        try:
            record = await seat.decide(run_id, 0, approve=verb == "approve", by=name)
        except Exception as error:
            print(f"lost: {type(error).__name__}: {error}", flush=True)
            return 2
        print(f"won: {record.state.value}", flush=True)
        return 0


sys.exit(anyio.run(main))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "decider.py").write_text(DECIDER)
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    return Env(tmp_path, url)


#: a command with its imports timed (python -X importtime)
LIGHT = (sys.executable, "-X", "importtime", "-m", "haltwise")


def pending(env: Env) -> list[dict[str, Any]]:
    done = env.hw("list", "--awaiting", "--json")
    assert done.returncode == 0, done.stderr
    approvals: list[dict[str, Any]] = json.loads(done.stdout)["approvals"]
    return approvals


def wait_awaiting(env: Env, *run_ids: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + PATIENCE
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = pending(env)
        if set(run_ids) <= {item["run"] for item in seen}:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{run_ids} never awaited approval; pending: {seen}")


def start(env: Env, run_id: str, task: str = "buy", **inputs: Any) -> subprocess.Popen[str]:
    return env.popen(
        "run", f"agent.py:{task}", "--id", run_id, "--input", json.dumps(inputs), "--json"
    )


def decider(env: Env, run_id: str, name: str, verb: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(env.root / "decider.py"), env.store, run_id, name, verb],
        cwd=env.root,
        env=env.environ(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr
    return process


def test_approve_edit_refuse_and_expire_from_the_command_line(env: Env) -> None:
    edited, refused, expiring = start(env, "e1"), start(env, "r1"), start(env, "x1", "buy_soon")
    listed = wait_awaiting(env, "e1", "r1")
    item = next(item for item in listed if item["run"] == "e1")
    assert (item["step"], item["tool"], item["arguments"]) == (0, "pay", {"amount": 5, "to": "bob"})
    assert item["requested_at"] > 0 and item["timeout_at"] is None
    status = env.status("e1")
    assert status is not None and status["state"] == "running"
    assert status["steps"][0]["status"] == "awaiting"
    assert status["steps"][0]["approval"]["state"] == "awaiting"
    bad = env.hw("approve", "e1", "0", "--edit", "[1")
    assert "--edit is not JSON" in error_line(bad)
    # an edit is validated in a light process (no tool imported) against the schema recorded
    # with the request: a misfit is one line, exit 2, and decides nothing
    for edit, words in (
        ('{"amount": "lots"}', "the arguments do not fit tool 'pay': amount: 'lots' is not of"),
        ('{"colour": "red"}', "tool 'pay' has no parameter 'colour'"),
    ):
        misfit = subprocess.run(
            [*LIGHT, "approve", "e1", "0", "--edit", edit],
            cwd=env.root,
            env=env.environ(),
            text=True,
            capture_output=True,
            timeout=PATIENCE,
        )
        assert misfit.returncode == 2 and misfit.stdout == "", misfit.stderr
        said = [line for line in misfit.stderr.splitlines() if not line.startswith("import time")]
        assert len(said) == 1 and words in said[0], said
        imported = {line.rpartition("|")[2].strip() for line in misfit.stderr.splitlines()}
        assert not imported & {"haltwise._runtime.runtime", "pydantic", "agent"}
    done = env.hw("approve", "e1", "0", "--edit", '{"amount": 3}', "--by", "ops", "--note", "ok")
    assert done.returncode == 0, done.stderr
    done = subprocess.run(  # a light command: on the Seat, none of the runtime's machinery
        [*LIGHT, "refuse", "r1", "0", "--json", "--by", "ops", "--note", "too expensive"],
        cwd=env.root,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=PATIENCE,
    )
    assert done.returncode == 0, done.stderr
    imported = {line.rpartition("|")[2].strip() for line in done.stderr.splitlines()}
    assert "haltwise._runtime.seat" in imported
    assert not imported & {"haltwise._runtime.runtime", "haltwise._runtime.steps", "pydantic"}
    assert json.loads(done.stdout)["approval"]["state"] == "refused"
    code, outcome, err = finish(edited)
    assert (code, outcome["result"]) == (0, "paid 3 to bob"), err
    code, outcome, err = finish(refused)
    assert outcome["result"] == "refused: [haltwise] refused by ops: too expensive", err
    assert outcome["steps"][0]["status"] == "refused"
    code, outcome, err = finish(expiring)
    assert outcome["result"].startswith("expired: "), err
    again = env.hw("approve", "e1", "0", "--by", "someone")
    assert "the approval request is edited by ops; a decision is used once" in error_line(again)
    late = env.hw("approve", "x1", "0")
    assert "expired" in error_line(late)
    status = env.status("e1")
    assert status is not None
    approval = status["steps"][0]["approval"]
    assert (approval["state"], approval["by"], approval["note"]) == ("edited", "ops", "ok")
    assert [line.split(":")[:3] for line in env.effects()] == [["pay", "3", "bob"]]
    assert pending(env) == []
    assert env.hw("check").returncode == 0


def test_kill_9_while_awaiting_a_takeover_waits_on_the_same_request(env: Env) -> None:
    after, before = start(env, "k1"), start(env, "k2")
    first = {item["run"]: item for item in wait_awaiting(env, "k1", "k2")}
    for process in (after, before):
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    # k2: decided while nobody works it (a crash between the decision and the call)
    assert env.hw("approve", "k2", "0", "--by", "ops").returncode == 0
    resumed_after = env.popen("resume", "k1", "--json")
    resumed_before = env.popen("resume", "k2", "--json")
    code, outcome, err = finish(resumed_before)
    assert (code, outcome["result"]) == (0, "paid 5 to bob"), err
    # k1: the takeover waits on the very same request, never a second one
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        status = env.status("k1")  # (one process a look: each costs ~0.3 s of CI)
        if status is not None and (status["state"], status["steps"][0]["status"]) == (
            "running",
            "awaiting",
        ):
            break
        time.sleep(0.02)
    [again] = pending(env)
    assert again == first["k1"], "the same request, still awaiting"
    assert env.hw("approve", "k1", "0").returncode == 0
    code, outcome, err = finish(resumed_after)
    assert (code, outcome["result"]) == (0, "paid 5 to bob"), err
    pays = [line.split(":") for line in env.effects()]
    assert sorted(p[3] for p in pays) == ["k1", "k2"], "each call ran exactly once"
    assert env.hw("check").returncode == 0


#: Each side of a race is seen winning on SQLite; PostgreSQL runs one order of each race (the
#: other order there added ~14 s of CI for the same write path: the compare-and-set).
RACE_ORDERS = [("sqlite", "approve"), ("sqlite", "refuse"), ("postgres", "approve")]
CANCEL_ORDERS = [("sqlite", "cancel"), ("sqlite", "approve"), ("postgres", "cancel")]


@pytest.mark.parametrize(("env", "first"), RACE_ORDERS, indirect=["env"])
def test_two_decisions_racing_from_two_processes_exactly_one_wins(env: Env, first: str) -> None:
    run = start(env, "d1")
    wait_awaiting(env, "d1")
    yes, no = decider(env, "d1", "yes", "approve"), decider(env, "d1", "no", "refuse")
    # both deciders saw the request awaiting; now their writes race, in the order given
    winner, loser = (yes, no) if first == "approve" else (no, yes)
    (env.root / f"go-{'yes' if winner is yes else 'no'}").touch()
    won, _ = winner.communicate(timeout=PATIENCE)
    (env.root / f"go-{'no' if winner is yes else 'yes'}").touch()
    lost, _ = loser.communicate(timeout=PATIENCE)
    assert (winner.returncode, loser.returncode) == (0, 2), (won, lost)
    state = "approved" if first == "approve" else "refused"
    assert won.strip() == f"won: {state}"
    assert "ApprovalConflictError" in lost and f"is {state} by" in lost
    _, _, err = finish(run)
    status = env.status("d1")
    assert status is not None and status["steps"][0]["approval"]["state"] == state, err
    assert len(env.effects()) == (1 if first == "approve" else 0)


@pytest.mark.parametrize(("env", "first"), CANCEL_ORDERS, indirect=["env"])
def test_a_cancel_racing_an_approve_has_exactly_one_outcome(env: Env, first: str) -> None:
    run = start(env, "c1")
    wait_awaiting(env, "c1")
    approver = decider(env, "c1", "yes", "approve")
    if first == "cancel":
        assert env.hw("cancel", "c1", "--wait").returncode == 0
        (env.root / "go-yes").touch()
        said, _ = approver.communicate(timeout=PATIENCE)
        assert approver.returncode == 2 and "is cancelled" in said, said
    else:
        (env.root / "go-yes").touch()
        said, _ = approver.communicate(timeout=PATIENCE)
        assert approver.returncode == 0, said
        env.hw("cancel", "c1", "--wait")
    _, outcome, err = finish(run)
    status = env.status("c1")
    assert status is not None
    approval = status["steps"][0]["approval"]["state"]
    if first == "cancel":
        assert (outcome["state"], approval) == ("cancelled", "cancelled"), err
        assert status["steps"][0]["status"] == "interrupted"
        assert env.effects() == []
    else:
        assert approval == "approved"
        ran = status["steps"][0]["status"] == "committed"
        assert len(env.effects()) == (1 if ran else 0)
    assert env.hw("check").returncode == 0


def test_a_cancel_of_a_dead_owner_s_awaiting_run_ends_its_request(env: Env) -> None:
    run = start(env, "o1")
    wait_awaiting(env, "o1")
    os.kill(run.pid, signal.SIGKILL)
    run.communicate()
    cancelled = env.hw("cancel", "o1", "--wait")
    assert cancelled.returncode == 0, cancelled.stderr
    # the canceller settled the request with the run: no list nor status shows it awaiting
    assert pending(env) == []
    status = env.status("o1")
    assert status is not None and status["state"] == "cancelled"
    step = status["steps"][0]
    assert (step["status"], step["approval"]["state"]) == ("interrupted", "cancelled")
    late = env.hw("approve", "o1", "0", "--by", "ops")
    assert "the approval request is cancelled" in error_line(late)
    assert env.effects() == []
    assert env.hw("check").returncode == 0
