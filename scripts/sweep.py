"""The sweep behind docs/reliability.md: every command and argument with the worst inputs.

``python scripts/sweep.py [PYTHON]`` runs each case as a real ``haltwise`` process (with
``PYTHON -m haltwise``, default this interpreter) in a scratch directory and prints the
Markdown table of docs/reliability.md: the input, the exit code, and the first line the command
printed (paths shown as ``DIR``). ``tests/cli/test_sweep.py`` runs it and checks that every exit
code is still the documented one, and that no case prints a traceback or a password.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

AGENT = """
import haltwise

@haltwise.tool(cancel="interruptible", effect="read")
async def search(topic: str) -> list:
    return [topic]

@haltwise.task
async def quick(topic: str = "x", n: int = 1):
    await search(topic)
    return n
"""

BIG = "7" * 5000
DEEP = "[" * 20000 + "]" * 20000
ESC = "\x1b[31mred\x1b]0;t\x07"
SECRET = "s3cretPW"

STORE = "sqlite:///DIR/store.db"
#: (command, arguments, extra environment); DIR in them is the scratch directory
CASES: list[tuple[str, list[str], dict[str, str]]] = [
    ("run", ["run", "agent.py"], {}),
    ("run", ["run", "agent.py:"], {}),
    ("run", ["run", "agent.py:nosuch"], {}),
    ("run", ["run", "agent.py:search"], {}),
    ("run", ["run", "missing.py:quick"], {}),
    ("run", ["run", "dir.py:quick"], {}),
    ("run", ["run", "syntax.py:x"], {}),
    ("run", ["run", "raises.py:x"], {}),
    ("run", ["run", "exits.py:x"], {}),
    ("run", ["run", "notasks.py:x"], {}),
    ("run", ["run", "no.such.module:task"], {}),
    ("run", ["run", "agent.py:quick", "--input", "{not json"], {}),
    ("run", ["run", "agent.py:quick", "--input", "[1, 2]"], {}),
    ("run", ["run", "agent.py:quick", "--input", '{"colour": "red"}'], {}),
    ("run", ["run", "agent.py:quick", "--input", '{"n": NaN}'], {}),
    ("run", ["run", "agent.py:quick", "--input", '{"n": ' + BIG + "}"], {}),
    ("run", ["run", "agent.py:quick", "--input", '{"n": ' + DEEP + "}"], {}),
    ("run", ["run", "agent.py:quick", "--input", ""], {}),
    ("run", ["run", "agent.py:quick", "--id", ""], {}),
    ("run", ["run", "agent.py:quick", "--id", "done1"], {}),
    ("run", ["run", "agent.py:quick", "--id", ESC], {}),
    ("run", ["run", "agent.py:quick", "--id", "x" * 100_000], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "-1"], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "0"], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "nan"], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "inf"], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "1e308"], {}),
    ("run", ["run", "agent.py:quick", "--deadline", "abc"], {}),
    ("cancel", ["cancel", "nosuch"], {}),
    ("cancel", ["cancel", "done1"], {}),
    ("cancel", ["cancel", "done1", "--reason", ""], {}),
    ("cancel", ["cancel", "done1", "--reason", ESC], {}),
    ("cancel", ["cancel"], {}),
    ("cancel", ["cancel", "--all", "--state", "bogus"], {}),
    ("cancel", ["cancel", "--all", "--task", "nosuch:task", "--dry-run"], {}),
    ("cancel", ["cancel", "done1", "--all"], {}),
    ("cancel", ["cancel", "nosuch", "done1", "--json"], {}),
    ("prune", ["prune"], {}),
    ("prune", ["prune", "--older-than", "yesterday"], {}),
    ("prune", ["prune", "--older-than", "-5d"], {}),
    ("prune", ["prune", "--older-than", "99999999999999999999d"], {}),
    ("prune", ["prune", "--older-than", "0s", "--state", "running"], {}),
    ("prune", ["prune", "--older-than", "30d", "--dry-run", "--json"], {}),
    ("status", ["status", "nosuch"], {}),
    ("status", ["status", ""], {}),
    ("status", ["status", ESC], {}),
    ("status", ["status", "done1", "--store", "sqlite:///DIR/typo/x.db"], {}),
    ("resume", ["resume", "nosuch"], {}),
    ("resume", ["resume", "done1"], {}),
    ("resume", ["resume", "done1", "--assume-done", "x"], {}),
    ("resume", ["resume", "done1", "--assume-done", "-1"], {}),
    ("resume", ["resume", "done1", "--assume-done", "0={bad"], {}),
    ("resume", ["resume", "done1", "--assume-done", "0=" + BIG], {}),
    ("resume", ["resume", "done1", "--assume-done", "0=" + DEEP], {}),
    ("resume", ["resume", "done1", "--rerun", "-1"], {}),
    ("resume", ["resume", "done1", "--rerun", "99999999999999999999"], {}),
    ("resume", ["resume", "done1", "missing.py"], {}),
    ("list", ["list", "--state", "bogus"], {}),
    ("list", ["list", "--store", "sqlite:///DIR/typo/x.db"], {}),
    ("list", ["list", "--store", "sqlite:///DIR/junk.db"], {}),
    ("list", ["list", "--store", "sqlite:///DIR/agent.py/x.db"], {}),
    ("list", ["list", "--store", "sqlite:///"], {}),
    ("list", ["list", "--store", "sqlite://host/x.db"], {}),
    ("list", ["list", "--store", f"{STORE}?busy_timeout=nan"], {}),
    ("list", ["list", "--store", f"{STORE}?busy_timeout=1e308"], {}),
    ("list", ["list", "--store", f"{STORE}?synchronous=sometimes"], {}),
    ("list", ["list", "--store", f"{STORE}?bogus=1"], {}),
    ("list", ["list", "--store", f"postgresql://u:{SECRET}%ZZ@127.0.0.1:1/db"], {}),
    ("list", ["list", "--store", f"postgresql://127.0.0.1:1/db?password={SECRET}%ZZ"], {}),
    ("list", ["list", "--store", f"postgresql://u:{SECRET}@127.0.0.1:1/db"], {}),
    ("list", ["list", "--store", f"mysql://u:{SECRET}@h/db"], {}),
    ("list", ["list"], {"HALTWISE_STORE": f"host=h password={SECRET}"}),
    ("list", ["list", "--limit", "0"], {}),
    ("list", ["list", "--limit", "-1"], {}),
    ("list", ["list", "--limit", "99999999999999999999"], {}),
    ("list", ["list", "--task", ESC], {}),
    ("list", ["list"], {"COLUMNS": "0"}),
    ("list", ["list"], {"COLUMNS": "banana"}),
    ("audit", ["audit", "missing.py"], {}),
    ("audit", ["audit", "syntax.py"], {}),
    ("audit", ["audit", "agent.py", "--deadline", "0"], {}),
    ("audit", ["audit", "agent.py", "--deadline", "nan"], {}),
    ("audit", ["audit", "agent.py", "--json", "--markdown"], {}),
    ("audit", ["audit", "agent.py"], {"COLUMNS": "0"}),
    ("submit", ["submit", "agent.py:quick", "--input", '{"n": ' + BIG + "}"], {}),
    ("submit", ["submit", "agent.py:nosuch"], {}),
    ("submit", ["submit", "agent.py:quick", "--id", "done1"], {}),
    ("worker", ["worker", "notasks.py"], {}),
    ("worker", ["worker", "agent.py", "--concurrency", "0"], {}),
    ("worker", ["worker", "agent.py", "--concurrency", "99999999999999999999"], {}),
    ("check", ["check", "--store", "sqlite:///DIR/typo/x.db"], {}),
    ("check", ["check", "--store", "sqlite:///DIR/junk.db"], {}),
    ("explore", ["explore", "agent.py"], {}),
    ("explore", ["explore", "agent.py:quick", "--input", DEEP], {}),
    ("pause", ["pause", "nosuch"], {}),
    ("pause", ["pause", "done1"], {}),
    ("pause", ["pause", ESC], {}),
    ("unpause", ["unpause", "nosuch"], {}),
    ("unpause", ["unpause", "done1"], {}),
    ("fork", ["fork", "nosuch", "--from-step", "0"], {}),
    ("fork", ["fork", "done1", "--from-step", "-1"], {}),
    ("fork", ["fork", "done1", "--from-step", "99"], {}),
    ("fork", ["fork", "done1", "--from-step", "99999999999999999999"], {}),
    ("fork", ["fork", "done1", "--from-step", "0", "--id", "done1"], {}),
    ("mcp", ["mcp", "missing.py"], {}),
    ("mcp", ["mcp", "syntax.py"], {}),
    ("mcp", ["mcp", "notasks.py"], {}),
    ("serve", ["serve", "--port", "-1"], {}),
    ("serve", ["serve", "--port", "70000"], {}),
    ("serve", ["serve", "--host", "0.0.0.0"], {}),
    ("serve", ["serve", "missing.py"], {}),
    ("(none)", [], {}),
    ("(none)", ["bogus-command"], {}),
]


@dataclass(frozen=True)
class Row:
    """One case: what was typed, and what the command did."""

    command: str
    shown: str
    exit: int
    first_line: str
    traceback: bool
    leak: bool
    stderr_lines: int


def show(text: str, root: str, limit: int = 60) -> str:
    text = text.replace(root, "DIR")
    text = text.replace(BIG, "<5000 digits>").replace(DEEP, "<20000 deep>")
    if any(ord(c) < 32 for c in text):
        text = text.encode("unicode_escape").decode()
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def prepare(root: Path) -> None:
    (root / "agent.py").write_text(AGENT)
    (root / "syntax.py").write_text("def broken(:\n")
    (root / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (root / "exits.py").write_text("import sys\nsys.exit(4)\n")
    (root / "notasks.py").write_text("x = 1\n")
    (root / "dir.py").mkdir()
    (root / "junk.db").write_bytes(b"not a database" * 100)


#: How many cases run at once (each is a process; the sweep itself only waits for them).
WORKERS = 4


def sweep(python: str = sys.executable, workers: int = WORKERS) -> list[Row]:
    """Run every case in a fresh scratch directory; return what each did, in the order of CASES.

    The cases run ``workers`` processes at a time, in two waves: every ``run`` case, then, once
    they have all ended, every other case. Only a ``run`` case leaves something in the store that
    another case sees (the run it started: ``status`` and ``pause`` of the escape-sequence id find
    it), so no row depends on how the cases of a wave interleave. The second wave is checked to
    leave the store's runs and steps as it found them (``RuntimeError`` otherwise, naming it)."""
    hw = [python, "-m", "haltwise"]
    root = Path(tempfile.mkdtemp(prefix="sweep-"))
    try:
        prepare(root)
        env = {**os.environ, "HALTWISE_STORE": STORE.replace("DIR", str(root))}
        env.pop("COLUMNS", None)
        subprocess.run(
            [*hw, "run", "agent.py:quick", "--id", "done1"], cwd=root, env=env, capture_output=True
        )

        def case(number: int) -> Row:
            return _one(hw, root, env, *CASES[number])

        starts = [n for n, (command, _, _) in enumerate(CASES) if command == "run"]
        others = [n for n, (command, _, _) in enumerate(CASES) if command != "run"]
        rows: dict[int, Row] = {}
        with ThreadPoolExecutor(workers) as pool:
            rows.update(zip(starts, pool.map(case, starts), strict=True))
            before = _runs_and_steps(root / "store.db")
            rows.update(zip(others, pool.map(case, others), strict=True))
        if _runs_and_steps(root / "store.db") != before:
            raise RuntimeError("a case other than `run` changed the store's runs or steps")
        return [rows[n] for n in range(len(CASES))]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _runs_and_steps(db: Path) -> list[str]:
    """Every row of the store's ``runs`` and ``steps`` tables, as text, sorted."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = [*conn.execute("SELECT * FROM runs"), *conn.execute("SELECT * FROM steps")]
    return sorted(map(repr, rows))


def _one(
    hw: list[str],
    root: Path,
    env: dict[str, str],
    command: str,
    args: list[str],
    extra: dict[str, str],
) -> Row:
    args = [arg.replace("DIR", str(root)) for arg in args]
    extra = {key: value.replace("DIR", str(root)) for key, value in extra.items()}
    done = subprocess.run(
        [*hw, *args], cwd=root, env={**env, **extra}, capture_output=True, text=True, timeout=120
    )
    err = done.stderr.strip().splitlines()
    first = err[0] if err else (done.stdout.strip().splitlines() or [""])[0]
    typed = " ".join(args) + "".join(f" {key}={value}" for key, value in extra.items())
    return Row(
        command=command,
        shown=show(typed, str(root), 70),
        exit=done.returncode,
        first_line=show(first, str(root), 110),
        traceback="Traceback" in done.stderr,
        leak=SECRET in done.stdout + done.stderr,
        stderr_lines=len(err),
    )


def markdown(rows: list[Row]) -> str:
    lines = ["| command | input | exit | what happens |", "| --- | --- | --- | --- |"]
    for row in rows:
        flags = (" TRACEBACK" if row.traceback else "") + (" LEAK" if row.leak else "")
        more = f" ({row.stderr_lines} lines)" if row.stderr_lines > 1 else ""
        lines.append(
            f"| {row.command} | `{row.shown}` | {row.exit}{flags} | {row.first_line}{more} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(sweep(*sys.argv[1:2])))
