"""The command line tests' test directory (tests/_cli_kit.py): ``env``, on SQLite.

A module whose tests run elsewhere (PostgreSQL, both stores, another agent file) defines its own
``env``, which overrides this one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _cli_kit import AGENT, Env


@pytest.fixture
def env(tmp_path: Path) -> Env:
    """A test directory with ``AGENT`` as ``agent.py``, its store a SQLite file in it."""
    (tmp_path / "agent.py").write_text(AGENT)
    return Env(tmp_path)
