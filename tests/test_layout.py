"""The tests' own layout: no file in ``tests/`` imports a test module.

A helper two test modules share lives in a kit in ``tests/`` (``_cli_kit``, ``_crash_kit``,
``_explore_kit``, ``toolkit``, ...) and a shared fixture in a ``conftest.py``, so that each test
module can be run, moved or deleted alone, and ``pythonpath`` names only ``tests/``. Checked on the
source, with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _paths import TESTS


def every_test_file() -> list[Path]:
    """The test modules, kits, agents and conftests under ``tests/``."""
    found = sorted(TESTS.rglob("*.py"))
    assert len(found) > 60, found  # the walk sees the test modules
    return found


def imports_of_test_modules(path: Path, code: str | None = None) -> list[str]:
    """Every ``import test_x`` and ``from test_x import ...`` in ``path`` (or in ``code``)."""
    tree = ast.parse(path.read_text() if code is None else code, str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [
            f"{path.name}:{node.lineno}: imports {name}"
            for name in names
            if name.split(".")[0].startswith("test_")
        ]
    return found


def test_no_test_module_imports_another() -> None:
    found = [line for path in every_test_file() for line in imports_of_test_modules(path)]
    assert found == [], "move the shared helper into a kit in tests/ (or a fixture into conftest)"


def test_the_check_sees_what_it_looks_for() -> None:
    code = "import test_cli\nfrom test_crash import spawn\nfrom _cli_kit import Env\nimport os\n"
    assert imports_of_test_modules(TESTS / "test_x.py", code) == [
        "test_x.py:1: imports test_cli",
        "test_x.py:2: imports test_crash",
    ]
