"""Every framework example runs for real (a subprocess each) and says what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: example -> lines its output must contain
PROMISES = {
    "approval_agent.py": [
        "awaiting: order-tea step 1 charge_card {'amount_eur': 12, 'item': 'tea'}",
        "order-tea: charged 10 EUR for tea",
        "order-car: not bought: [haltwise] refused by ops: too expensive",
        "order-lamp: cancelled, request cancelled",
        "a late decision is refused: run 'order-lamp' step 1: the approval request is cancelled",
        "charges: [10]",
    ],
    "openai_agents_agent.py": [
        "cancelled (reason user, retry resume): model:committed, price:committed, "
        "model:committed, charge:committed",
        "model asked again 1 time(s)",
        "charged once",
        "cancelled (reason host, retry resume): model:committed, price:committed, "
        "model:committed, charge:committed",
        "  call-charge: charged 5 EUR",
    ],
    "pydantic_ai_agent.py": [
        "reserve:compensated",
        "rooms held after the cancel: []",
        "model asked again 1 time(s)",
        "one reservation standing",
    ],
    "langchain_agent.py": [
        "cancelled (reason user, retry restart): model:committed, search:interrupted",
        "e-mail sent once",
    ],
    "mcp_agent.py": [
        "local: cancelled (reason user): report:interrupted",
        "remote: cancelled (reason client)",
        "remote: completed (reason None)",
        "local: completed (reason None): report:committed",
        "result: {'result': 'published 81 characters'}",
    ],
}


@pytest.mark.parametrize("name", sorted(PROMISES))
def test_the_example_cancels_resumes_and_keeps_its_promise(name: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for line in PROMISES[name]:
        assert line in done.stdout, done.stdout


def test_the_project_s_own_example_passes_a_strict_audit(tmp_path: Path) -> None:
    """``haltwise audit examples/research_agent.py --strict`` passes (issue 14: its model call is
    declared ``effect="read"``, as the contract recommends)."""
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "audit", str(EXAMPLES / "research_agent.py"),
         "--strict", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == [], report["findings"]
    assert {tool["name"] for tool in report["tools"]} >= {"plan_next", "charge_summary_api"}


def test_the_readme_s_python_quickstart_is_the_example_file_and_runs_twice(
    tmp_path: Path,
) -> None:
    """Issue 29, item 14: the README's Quickstart is ``examples/quickstart.py`` word for word, and
    run twice in one folder it shows a partial result kept and a settled step each time."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    code = (EXAMPLES / "quickstart.py").read_text()
    assert f"```python\n{code}```" in readme
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "quickstart.py")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "cancelled user restart", done.stdout
        assert lines[1] == "kept: ({'hit': 'cats 0'},)", done.stdout
        assert "save_note:compensated" in lines[2] and "search:committed" in lines[2]
        assert lines[3].startswith("completed sent to me@example.com 3 partial results")
    outbox = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert len(outbox) == 4  # two e-mails per script run: the resumed one, the blocking one
