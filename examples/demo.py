"""``make demo``: a real agent run, cancelled from another process mid-way, then resumed.

Everything goes through the ``haltwise`` command line, exactly as a user would type it, on
the embedded SQLite store in ``demo-out/``. At the end the demo reads the agent's world (the
paid API's ledger, the outbox, the notes database) to show that nothing happened twice.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("DEMO_OUT", ROOT / "demo-out")).resolve()
AGENT = "examples/research_agent.py:research"
RUN_ID = "demo"


#: The paid API answers once this file exists: the demo creates it after its cancel is
#: recorded, so the cancel lands while the call is in flight on a machine of any speed.
API_GATE = OUT / "paid-api-may-answer"


def env() -> dict[str, str]:
    return {
        **os.environ,
        "HALTWISE_STORE": f"sqlite:///{OUT / 'haltwise.db'}",
        "DEMO_WORLD": str(OUT / "world"),
        "DEMO_API_GATE": str(API_GATE),
        "NO_COLOR": os.environ.get("NO_COLOR", ""),
    }


def haltwise(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "haltwise", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode not in (0, 3):
        sys.exit(f"haltwise {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def status() -> dict[str, Any]:
    return dict(json.loads(haltwise("status", RUN_ID, "--json").stdout))


def peek() -> dict[str, Any] | None:
    """The run as journaled now, read in this process (fast enough to poll), or None."""
    import anyio

    import haltwise as hw

    async def read() -> dict[str, Any] | None:
        async with hw.Runtime(env()["HALTWISE_STORE"]) as runtime:
            try:
                return (await runtime.status(RUN_ID)).to_json()
            except hw.UnknownRunError:
                return None

    return anyio.run(read)


def wait_recorded(timeout: float = 30.0) -> None:
    """Poll (with a deadline) until the run is in the store."""
    deadline = time.monotonic() + timeout
    while peek() is None:
        if time.monotonic() > deadline:
            sys.exit("the agent did not start in time")
        time.sleep(0.01)


def say(title: str, command: str = "") -> None:
    print(f"\n== {title}")
    if command:
        print(f"   $ {command}")


def wait_until_mid_way(run: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    """Poll (with a deadline) until the paid API call is in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.poll() is not None:
            sys.exit("the agent ended before the demo could cancel it")
        current = peek() or {"steps": []}
        if any(
            s["tool"] == "charge_summary_api" and s["status"] == "running" for s in current["steps"]
        ):
            return current
        time.sleep(0.01)
    sys.exit("the agent did not get mid-way in time")


def world_counts() -> tuple[list[Any], list[Any], int]:
    world = OUT / "world"
    ledger = [json.loads(line) for line in (world / "ledger.jsonl").read_text().splitlines()]
    outbox = [json.loads(line) for line in (world / "outbox.jsonl").read_text().splitlines()]
    with sqlite3.connect(world / "notes.db") as conn:
        notes = conn.execute("SELECT count(*) FROM notes").fetchone()[0]
    return ledger, outbox, int(notes)


#: What each policy does to the call a cancel finds in flight (CONTRACT.md, "Tool policies").
WHY = {
    "interruptible": "the call was interrupted at once, and runs again on resume",
    "finish": "the call was let finish within its grace, and its result kept",
    "rollback": "the call was interrupted, then its compensation undid it",
    None: "an undeclared tool behaves as finish",
}


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    say(
        "1. Start the research agent (a scripted planner stands in for the model)",
        f"haltwise run {AGENT} --id {RUN_ID}",
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "haltwise", "run", AGENT, "--id", RUN_ID],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_recorded()
    mid = wait_until_mid_way(run)
    flying = next(s for s in mid["steps"] if s["status"] == "running")
    done = sum(1 for s in mid["steps"] if s["status"] == "committed")
    print(
        f"   ... {done} steps committed, step {flying['index']} ({flying['tool']}, "
        f"{flying['cancel']}) in flight"
    )

    say("2. Someone else stops it, from another process", f"haltwise cancel {RUN_ID}")
    print("   " + haltwise("cancel", RUN_ID).stdout.strip().replace("\n", "\n   "))
    API_GATE.touch()  # the paid API answers now, after the cancel (the call was in flight)
    run.communicate(timeout=60)
    print(f"   the agent's process exited {run.returncode} (3 = cancelled, never 1 = failed)")

    say("3. What survived, and what to do next", f"haltwise status {RUN_ID}")
    print(haltwise("status", RUN_ID).stdout.rstrip())
    stopped = status()
    assert stopped["state"] == "cancelled", stopped
    settled = next(s for s in stopped["steps"] if s["index"] == flying["index"])
    print(
        f"   step {settled['index']} ({settled['tool']}) ended {settled['status']} because its "
        f"policy is {settled['cancel'] or 'undeclared'}: {WHY[settled['cancel']]}"
    )

    say(
        "4. Resume: committed steps replay from the journal, nothing is asked twice",
        f"haltwise resume {RUN_ID}",
    )
    resumed = haltwise("resume", RUN_ID)
    print(resumed.stdout.rstrip())
    final = status()
    assert final["state"] == "completed", final

    say("5. Check the world", "cat demo-out/world/ledger.jsonl demo-out/world/outbox.jsonl")
    ledger, outbox, notes = world_counts()
    charges = len(ledger)
    keys = {entry["key"] for entry in ledger}
    print(f"   paid API charges: {charges} (distinct idempotency keys: {len(keys)})")
    print(f"   messages posted:  {len(outbox)}")
    print(f"   notes saved:      {notes}")
    reran = [f"{s['tool']}#{s['index']}" for s in final["steps"] if s["attempts"] > 1]
    print(f"   steps that ran again after the cancel: {', '.join(reran) or 'none'}")
    check = haltwise("check", check=False)
    verdict = "the journal is sound" if check.returncode == 0 else check.stdout.strip()
    print(f"   haltwise check: {verdict}")
    ok = charges == 1 and len(outbox) == 1 and notes == 3 and check.returncode == 0
    print(
        "\nOK: cancelled mid-way, resumed, and no charge or message happened twice."
        if ok
        else "\nFAILED: something happened twice (see above)."
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
