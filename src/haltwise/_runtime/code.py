"""Recording and checking the version of a run's code (CONTRACT.md, "Resume and determinism").

:func:`version_of` is what a run records when it starts (worked out once per task and cached: a
process runs the code it loaded); :func:`check_code` is the refusal ``resume`` and a worker's
takeover make when the task's file is no longer the recorded one; :func:`file_digest` reads a
file as it is now.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from pathlib import Path
from typing import Any

from .._core.code import CodeVersion
from .._core.exceptions import CodeChangedError
from .._core.records import RunRecord

__all__ = ["changed_now", "check_code", "file_digest", "version_of"]

#: the version each task records, by task (its file's digest as it was loaded)
_VERSIONS: dict[int, tuple[object, dict[str, Any] | None]] = {}


def file_digest(path: str | Path) -> str | None:
    """SHA-256 (hex) of the file's bytes now, None if it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def version_of(task: Any) -> dict[str, Any] | None:
    """The ``"code"`` a run of ``task`` records: ``{"file", "digest", "tools"}`` (see
    :class:`~haltwise._core.code.CodeVersion`), None when the task's file cannot be found
    (a task defined in an interactive session). Worked out once per task, at its first run."""
    cached = _VERSIONS.get(id(task))
    if cached is not None and cached[0] is task:
        return cached[1]
    version = _work_out(task)
    _VERSIONS[id(task)] = (task, version)
    return version


def _work_out(task: Any) -> dict[str, Any] | None:
    from .spec import spec_of  # here: reading a run's version needs no tool machinery

    fn = getattr(task, "fn", task)
    file = getattr(task, "source", None) or _source_file(fn)
    if file is None:
        return None
    digest = file_digest(file)
    if digest is None:
        return None
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    tools: dict[str, str] = {}
    for value in list(vars(module).values()) if module is not None else []:
        spec = spec_of(value)
        if spec is not None and spec.name not in tools:
            tools[spec.name] = _source_digest(spec.fn)
    return {"file": str(Path(file).resolve()), "digest": digest, "tools": tools}


def _source_file(fn: Any) -> str | None:
    try:
        return inspect.getsourcefile(fn)
    except TypeError:
        return None


def _source_digest(fn: Any) -> str:
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = repr(fn)
    return hashlib.sha256(text.encode()).hexdigest()


def changed_now(code: CodeVersion) -> bool:
    """Whether the recorded file differs now (or is gone)."""
    return file_digest(code.file) != code.digest


def check_code(
    run: RunRecord, *, allow_code_change: bool, file: str | Path | None = None
) -> str | None:
    """Refuse (:class:`~haltwise.CodeChangedError`) to resume ``run`` with code other than the
    recorded: the file ``file`` (default: the recorded one) as it is now must have the recorded
    digest. With ``allow_code_change`` a change is let through: returned is the sentence the
    run's events record (None when nothing changed). A run recorded without a version, or
    never begun (``pending``), is not checked."""
    code = CodeVersion.from_inputs(run.inputs)
    if code is None or run.state.value == "pending":
        return None
    looked_at = str(Path(file).resolve()) if file is not None else code.file
    now = file_digest(looked_at)
    if now == code.digest:
        return None
    if not allow_code_change:
        raise CodeChangedError(run.id, looked_at, code.digest, now)
    return (
        f"resumed with allow_code_change: {looked_at} is {now or 'gone'}, "
        f"the run recorded {code.digest}"
    )
