"""Which file ``resume`` may load a journaled run's task from.

Loading a task runs its file. The journal says which file (the run's ``source``, or the file part
of its task name), and anyone who can write the journal (a shared PostgreSQL) could point it
anywhere: so the journal alone never decides. ``resume`` loads the file the journal names only
if it lies inside the current project (see :func:`project_root`); a file outside it must be
named on the command line (``haltwise resume ID FILE.py``), and a named file that is not the one
the journal names is refused unless ``--moved`` says the file moved. A run recorded under an
importable module name (``pkg.agents:research``) is imported as such: only installed or
project modules can be named that way.
"""

from __future__ import annotations

from pathlib import Path

from .._core.exceptions import InputError
from .._core.records import RunRecord
from .._runtime.explain import journaled_file

__all__ = ["PROJECT_MARKERS", "journaled_file", "project_root", "trusted_spec"]

#: A directory holding one of these is the root of a project.
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg", ".haltwise")


def project_root(cwd: Path | None = None) -> Path:
    """The current project: the nearest directory from ``cwd`` up that holds a
    :data:`PROJECT_MARKERS` entry, else ``cwd`` itself."""
    start = (cwd or Path.cwd()).resolve()
    for directory in (start, *start.parents):
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory
    return start


def trusted_spec(run: RunRecord, file: str | None, *, moved: bool) -> str:
    """The ``FILE.py:TASK`` (or ``module:TASK``) to load ``run``'s task from, or
    :class:`InputError` (exit 2) when the journal alone points outside the project, or at
    another file than the one the caller named."""
    attribute = run.task.rpartition(":")[2]
    if not attribute:
        raise InputError(f"run {run.id!r}: cannot tell its task from {run.task!r}")
    named = journaled_file(run)
    if file is not None:
        given = Path(file).resolve()
        if named is not None and given != named and not moved:
            raise InputError(
                f"run {run.id!r} was started from {named}, not {given}; if the file moved, "
                f"say so: haltwise resume {run.id} {file} --moved"
            )
        return f"{given}:{attribute}"
    if named is None:
        return run.task
    root = project_root()
    if not named.is_relative_to(root):
        raise InputError(
            f"run {run.id!r} names its task's file {named}, outside this project ({root}); "
            f"resume runs that file only if you name it: haltwise resume {run.id} {named}"
        )
    return f"{named}:{attribute}"
