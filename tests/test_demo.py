"""``make demo``'s script, run for real: it must show that nothing happened twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_the_demo_cancels_resumes_and_repeats_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO)],
        env={**os.environ, "DEMO_OUT": str(tmp_path), "DEMO_LATENCY": "0.1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exited 3" in done.stdout
    world = tmp_path / "world"
    ledger = [json.loads(line) for line in (world / "ledger.jsonl").read_text().splitlines()]
    outbox = (world / "outbox.jsonl").read_text().splitlines()
    assert len(ledger) == 1, "the paid API was charged once"
    assert len(outbox) == 1, "the message was posted once"
    assert "no charge or message happened twice" in done.stdout
    # the demo says why the step in flight ended as it did (issue 15, item 23)
    assert "because its policy is" in done.stdout


ROOT = DEMO.parent.parent


def test_the_newcomers_path_is_written_down() -> None:
    """Issue 15, items 21 and 23: where the command lives, what the resume example means, and
    no untracked files left by the quickstart."""
    readme = (ROOT / "README.md").read_text()
    assert ".venv/bin" in readme and "source .venv/bin/activate" in readme
    example = readme.index("--assume-done 12=")
    assert "unknown" in readme[example - 600 : example]
    for leftover in ("demo-world/notes.db", "demo-out/world/ledger.jsonl"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", leftover], cwd=ROOT, capture_output=True
        )
        assert ignored.returncode == 0, f"{leftover} is not ignored"
