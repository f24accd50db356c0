"""The explorer tests' world (tests/_explore_kit.py), moved into each test's own directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from _explore_kit import WORLD, World


@pytest.fixture
def world(tmp_path: Path) -> World:
    """``WORLD``, empty, in ``tmp_path / "world"`` (a module asks for it with
    ``pytest.mark.usefixtures("world")``)."""
    WORLD.enter(tmp_path / "world")
    return WORLD
