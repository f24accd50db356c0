"""The sweep of docs/reliability.md stays true: every case, run again as a real process, exits
as the table says, and none prints a traceback or a password (issue 15, "Done means")."""

from __future__ import annotations

import importlib.util
import re
import sys

from _paths import ROOT

ROOT = ROOT


def load_sweep() -> object:
    spec = importlib.util.spec_from_file_location("haltwise_sweep", ROOT / "scripts" / "sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["haltwise_sweep"] = module
    spec.loader.exec_module(module)
    return module


def documented_exits() -> list[tuple[str, int]]:
    """(input, exit code) of every row of the sweep table in docs/reliability.md."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    table = text.split("<!-- sweep:begin -->", 1)[1].split("<!-- sweep:end -->", 1)[0]
    rows = []
    for line in table.splitlines():
        match = re.match(r"\| [^|]+ \| `(.*)` \| (\d+) \|", line)
        if match:
            rows.append((match.group(1), int(match.group(2))))
    return rows


def test_every_case_of_the_sweep_exits_as_documented_without_traceback_or_password() -> None:
    sweep = load_sweep()
    rows = sweep.sweep(sys.executable)  # type: ignore[attr-defined]
    assert [(row.shown, row.exit) for row in rows] == documented_exits()
    assert [row.shown for row in rows if row.traceback or row.leak] == []
    # a usage error is one line (the bare command prints its help, on purpose)
    long = [row.shown for row in rows if row.exit == 2 and row.stderr_lines > 1 and row.shown]
    assert long == []
