"""Load a user's tasks and tools from ``FILE.py`` or an importable module.

The command line names its targets as ``FILE.py:TASK`` (or ``package.module:TASK``); this module
turns such a spec into the module object and the :class:`~.tool.Task` in it, and finds
every tool a file defines (for ``audit``). Every failure is a
:class:`LoadError` with a one-line message, so the command line can print it and exit 2.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from .._core.exceptions import LoadError
from .spec import ToolSpec, spec_of
from .tool import Task

__all__ = [
    "LoadError",
    "find_tasks",
    "find_tools",
    "load_module",
    "load_target",
    "load_tasks",
    "load_tools",
    "module_name_for",
]

#: A file, given as a path, or an importable module name (``"pkg.agents"``).
PathOrModule = str | os.PathLike[str] | ModuleType

_T = TypeVar("_T")

# Files loaded so far, by resolved absolute path. The lock makes "the same file is executed once"
# hold when several threads (a worker's) load the same file at the same time.
_LOADED: dict[Path, ModuleType] = {}
_LOCK = threading.RLock()


def load_target(spec: str) -> tuple[ModuleType, Task[..., Any] | None]:
    """Load ``FILE.py:TASK`` (or ``module.name:TASK``) and return the module and the task.

    Without a ``:TASK`` part the whole spec names the file or module and the task is ``None``.
    ``TASK`` is the module attribute the task is bound to (dots walk into attributes, e.g.
    ``agents.research``); it is split off at the last colon only when it looks like such a name,
    so a Windows path such as ``C:\\agents\\a.py`` is taken whole. The module is loaded with
    :func:`load_module`, so loading the same file again returns the same module and task.

    Raises :class:`LoadError` if the module cannot be loaded, has no attribute ``TASK``, or that
    attribute is not a task.
    """
    target, task_name = _split_spec(spec)
    module = load_module(target)
    if task_name is None:
        return module, None
    return module, _lookup_task(module, task_name, target)


def load_module(path_or_module: PathOrModule) -> ModuleType:
    """Return the module for a Python file or an importable module name, importing it once.

    A ``ModuleType`` is returned as it is. A string ending in ``.py`` or containing a path
    separator, or any ``os.PathLike``, is a file: it is executed as a fresh module named
    :func:`module_name_for` its resolved path, registered in ``sys.modules`` under that name
    (so dataclasses, pickling and ``typing.get_type_hints`` work), with the file's directory
    first on ``sys.path`` while it runs (so it can import its sibling modules; the entry is
    removed afterwards). The same file, however it is spelled, is executed only once per
    process: later calls return the cached module, even if the file has changed since. A file
    whose import failed is not cached, so a corrected file can be loaded again.

    Any other string is a module name, imported with :func:`importlib.import_module` with the
    current directory on ``sys.path`` (as ``python -m`` does).

    Raises :class:`LoadError` for a missing file, a directory, a syntax error, an exception
    raised by the module's own code while importing, or a module name that is not found.
    """
    if isinstance(path_or_module, ModuleType):
        return path_or_module
    if isinstance(path_or_module, os.PathLike) or _looks_like_path(path_or_module):
        return _load_file(Path(os.fspath(path_or_module)))
    return _import_name(path_or_module)


def load_tools(path_or_module: PathOrModule) -> list[ToolSpec]:
    """Load a file or module (see :func:`load_module`) and return its tools (:func:`find_tools`)."""
    return find_tools(load_module(path_or_module))


def load_tasks(path_or_module: PathOrModule) -> list[Task[..., Any]]:
    """Load a file or module (see :func:`load_module`) and return its tasks (:func:`find_tasks`)."""
    return find_tasks(load_module(path_or_module))


def find_tools(module: ModuleType) -> list[ToolSpec]:
    """The spec of every tool bound to a top-level name of ``module``, in definition order.

    "Definition order" is the order in which the names were first bound, which for decorated
    functions is their order in the file. Tools imported from another module count too (they
    are part of what the file's tasks can call). A tool bound to several names is listed once,
    at its first name.
    """
    found: dict[int, ToolSpec] = {}
    for value in list(vars(module).values()):
        spec = spec_of(value)
        if spec is not None:
            found.setdefault(id(spec), spec)
    return list(found.values())


def find_tasks(module: ModuleType) -> list[Task[..., Any]]:
    """Every :class:`Task` bound to a top-level name of ``module``, like :func:`find_tools`."""
    return _instances(module, Task)


def module_name_for(path: str | os.PathLike[str]) -> str:
    """The ``sys.modules`` name a file is loaded under: ``haltwise_user_<stem>_<hash>``.

    The hash is of the resolved absolute path, so the name is the same in every process that
    loads the same file (workers record and find tasks by ``module:qualname``), and differs for
    two files that share a stem.
    """
    resolved = Path(path).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", resolved.stem, flags=re.ASCII)
    return f"haltwise_user_{stem}_{digest}"


def _split_spec(spec: str) -> tuple[str, str | None]:
    target, colon, task_name = spec.rpartition(":")
    if not colon:
        return spec, None
    if task_name == "" and target:
        raise LoadError(f"{spec!r}: no task name after ':'", target=target)
    if target and all(part.isidentifier() for part in task_name.split(".")):
        return target, task_name
    return spec, None


def _looks_like_path(target: str) -> bool:
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return target.endswith(".py") or any(sep in target for sep in separators)


def _load_file(path: Path) -> ModuleType:
    resolved = path.expanduser().resolve()
    with _LOCK:
        cached = _LOADED.get(resolved)
        if cached is not None:
            return cached
        _check_file(resolved, shown=str(path))
        module = _execute(resolved)
        _LOADED[resolved] = module
        return module


def _check_file(resolved: Path, *, shown: str) -> None:
    if not resolved.exists():
        raise LoadError(f"{shown}: no such file", target=shown)
    if not resolved.is_file():
        raise LoadError(f"{shown}: not a file (expected a Python file)", target=shown)
    if not os.access(resolved, os.R_OK):
        raise LoadError(f"{shown}: file is not readable", target=shown)


def _execute(path: Path) -> ModuleType:
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path}: cannot be loaded as a Python module", target=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with _on_sys_path(str(path.parent)):
            spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        del sys.modules[name]
        raise _import_failure(error, path) from error
    return module


def _import_name(name: str) -> ModuleType:
    try:
        with _on_sys_path(os.getcwd()):
            return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and _is_prefix(error.name, name):
            raise LoadError(f"{name}: no such file or module", target=name) from None
        raise _import_failure(error, None) from error
    except (Exception, SystemExit) as error:
        raise _import_failure(error, None) from error


def _is_prefix(missing: str, name: str) -> bool:
    """True if the missing module is ``name`` itself or one of its parent packages."""
    return name == missing or name.startswith(missing + ".")


def _import_failure(error: BaseException, path: Path | None) -> LoadError:
    if isinstance(error, SyntaxError):
        filename = error.filename or str(path)
        return LoadError(
            f"{filename}:{error.lineno}: {type(error).__name__}: {error.msg}", target=filename
        )
    where = _where(error, path)
    detail = str(error)
    if isinstance(error, SystemExit):
        detail = f"the module called sys.exit({error.code!r}) while being imported"
    described = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
    return LoadError(f"{where}: {described}", target=str(path) if path else where)


def _where(error: BaseException, path: Path | None) -> str:
    """``file:line`` of the frame in the loaded file where ``error`` arose (else the deepest)."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen ")
    ]
    own = [frame for frame in frames if path is not None and frame.filename == str(path)]
    chosen = own or frames
    if not chosen:
        return str(path) if path else "<import>"
    return f"{chosen[-1].filename}:{chosen[-1].lineno}"


@contextmanager
def _on_sys_path(directory: str) -> Iterator[None]:
    if directory in sys.path:
        yield
        return
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:  # the module removed it itself
            pass


def _lookup_task(module: ModuleType, task_name: str, target: str) -> Task[..., Any]:
    found: object = module
    for part in task_name.split("."):
        if not hasattr(found, part):
            raise LoadError(f"{target}: no task {task_name!r}{_known_tasks(module)}", target=target)
        found = getattr(found, part)
    if not isinstance(found, Task):
        kind = "Tool" if spec_of(found) is not None else type(found).__name__
        raise LoadError(
            f"{target}: {task_name!r} is a {kind}, not a task (decorate an async function "
            f"with @haltwise.task){_known_tasks(module)}",
            target=target,
        )
    return found


def _known_tasks(module: ModuleType) -> str:
    names = [name for name, value in vars(module).items() if isinstance(value, Task)]
    return f"; tasks there: {', '.join(names)}" if names else "; it defines no tasks"


def _instances(module: ModuleType, kind: type[_T]) -> list[_T]:
    found: list[_T] = []
    seen: set[int] = set()
    for value in list(vars(module).values()):
        if isinstance(value, kind) and id(value) not in seen:
            seen.add(id(value))
            found.append(value)
    return found
