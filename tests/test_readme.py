"""The README's Python Quickstart is literally runnable, twice in a row, and shows what it says:
a partial result and a settled step survive the cancel, then the resume completes (issue 29,
item 14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart() -> str:
    text = README.read_text()
    section = text[text.index("## Quickstart: Python") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_python_quickstart_runs_twice_and_shows_what_survived(tmp_path: Path) -> None:
    (tmp_path / "quickstart.py").write_text(quickstart())
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "quickstart.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "partials: ({'hit': 'cats 0'}, {'hit': 'cats 1'}, {'hit': 'cats 2'})"
        assert "('send_email', 'committed')" in lines[1]
        assert lines[2] == "retry: resume"
        assert lines[3].startswith("completed sent to me@example.com")
        assert lines[4].startswith("sent to me@example.com")
