"""The tasks ``haltwise mcp FILE.py`` serves, found without the MCP SDK: the command loads the
file (and fails on one it cannot serve) before it imports the SDK (~0.7 s of imports)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._core.exceptions import InputError
from .._runtime.loader import find_tools, load_module
from .._runtime.spec import ToolSpec
from .._runtime.tool import Task

__all__ = ["ServedTask", "served_tasks"]


@dataclass(frozen=True, slots=True)
class ServedTask:
    """One task of the served file, as an MCP tool."""

    #: the MCP tool name: the module attribute the task is bound to
    name: str
    task: Task[..., Any]
    #: the name its runs record, as ``haltwise run FILE.py:TASK`` would (``agent.py:research``)
    run_name: str
    #: the file's absolute path, kept with the run so that ``haltwise resume`` finds the task
    source: str


def served_tasks(file: str | os.PathLike[str]) -> tuple[list[ServedTask], list[ToolSpec]]:
    """Load ``file`` and return its tasks (in definition order) and its tools.

    Raises :class:`~haltwise.LoadError` if the file cannot be loaded and
    :class:`~haltwise.InputError` if it defines no task.
    """
    module = load_module(os.fspath(file))
    source = str(Path(module.__file__ or file).resolve())
    served = [
        ServedTask(name, value, f"{Path(source).name}:{name}", source)
        for name, value in vars(module).items()
        if isinstance(value, Task) and not name.startswith("_")
    ]
    if not served:
        raise InputError(f"{file}: no @haltwise.task in this file")
    return served, find_tools(module)
