"""The faces (command line, HTTP server, framework integrations) reach the journal only through
the runtime's read API and verbs (issue 13, item 5): none imports ``haltwise._journal`` or reads
``.store`` off a runtime or a run. Checked on the source, with ``ast``, so that a new command
or endpoint that reaches into the store fails here. Also: ``import haltwise`` imports nothing of
the package beyond itself (its public names load on first use), and its lazy table names the
same as the imports mypy reads. And no module outside ``haltwise._runtime`` (the faces, the
analysis, ``testing``, the tests, the examples and the benchmarks) touches a runtime underscore:
they use a runtime through its public API and ``_runtime/lowlevel`` (issue 30, item 1).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import haltwise

SRC = Path(haltwise.__file__).parent
ROOT = SRC.parent.parent
FACES = ("_cli", "server", "integrations", "_events")
JOURNAL = "haltwise._journal"


def face_files() -> list[Path]:
    files = sorted(path for face in FACES for path in (SRC / face).rglob("*.py"))
    assert len(files) > 10, files  # the walk sees the faces
    return files


def absolute(module: str | None, level: int, path: Path) -> str:
    """The absolute name of a ``from ... import`` in ``path`` (``level`` leading dots)."""
    if level == 0:
        return module or ""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def reaches_into_the_store(path: Path, code: str | None = None) -> list[str]:
    """Every import of the journal and every ``.store`` attribute read in ``path`` (or in
    ``code``, read as if it were that file)."""
    found = []
    text = path.read_text() if code is None else code
    for node in ast.walk(ast.parse(text, str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node.module, node.level, path)
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute) and node.attr == "store":
            found.append(f"{path.name}:{node.lineno}: .store")
        found += [
            f"{path.name}:{node.lineno}: imports {name}"
            for name in names
            if name == JOURNAL or name.startswith(JOURNAL + ".")
        ]
    return found


@pytest.mark.parametrize("path", face_files(), ids=lambda path: str(path.relative_to(SRC)))
def test_no_face_imports_the_journal_or_reads_a_store(path: Path) -> None:
    assert reaches_into_the_store(path) == []


def test_the_check_sees_what_it_looks_for() -> None:
    face = SRC / "_cli" / "example.py"  # where a face's module would be (never written)
    code = (
        "from .._journal.store import open_store\n"
        "import haltwise._journal.sqlite\n"
        "from .. import _journal\n"
        "async def f(runtime):\n"
        "    return await runtime.store.load('x')\n"
    )
    found = sorted(reaches_into_the_store(face, code), key=lambda line: int(line.split(":")[1]))
    assert [line.split(": ", 1)[1] for line in found] == [
        "imports haltwise._journal.store",
        "imports haltwise._journal.store.open_store",
        "imports haltwise._journal.sqlite",
        "imports haltwise._journal",
        ".store",
    ]


def test_import_haltwise_loads_only_the_package_itself() -> None:
    code = "import sys, haltwise; print(sorted(m for m in sys.modules if 'haltwise' in m))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "['haltwise']"


def test_the_lazy_table_names_what_mypy_reads() -> None:
    tree = ast.parse((SRC / "__init__.py").read_text())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                for alias in statement.names:
                    typed[alias.asname or alias.name] = "." * statement.level + (
                        statement.module or ""
                    )
    lazy = vars(haltwise)["_WHERE"]
    assert typed == lazy
    assert set(lazy) == set(haltwise.__all__)
    assert set(haltwise.__all__) <= set(dir(haltwise))
    for name in haltwise.__all__:
        assert getattr(haltwise, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = haltwise.nothing_here  # type: ignore[attr-defined]


def private_names(files: list[Path]) -> set[str]:
    """The underscore names ``files`` define: functions and methods, attributes set on
    ``self``, fields, variables (dunders are not private)."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    name = node.attr
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name = node.target.id
            elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
            if name and name.startswith("_") and not name.endswith("__"):
                names.add(name)
    return names


def runtime_underscores() -> set[str]:
    """The runtime's private names that no other module of the package defines as well (a
    journal store's ``_watch`` is the store's own, not the runtime's of the same name)."""
    runtime = sorted((SRC / "_runtime").rglob("*.py"))
    others = [path for path in SRC.rglob("*.py") if "_runtime" not in path.parts]
    return private_names(runtime) - private_names(others)


def outside_the_runtime() -> list[Path]:
    """Every Python file of the project outside ``haltwise._runtime``."""
    roots = [SRC, ROOT / "tests", ROOT / "examples", ROOT / "bench"]
    found = [
        path
        for root in roots
        if root.is_dir()
        for path in sorted(root.rglob("*.py"))
        if (SRC / "_runtime") not in path.parents
    ]
    assert len(found) > 100, found  # the walk sees src, tests, examples and bench
    return found


def touches_runtime_underscores(
    path: Path, private: set[str], code: str | None = None
) -> list[str]:
    """Every ``x._name`` read or written in ``path`` (or ``code``) whose name is a runtime
    underscore (``self._name`` and ``cls._name`` are the file's own), and every import of an
    underscore name from ``haltwise._runtime``."""
    found = []
    text = path.read_text() if code is None else code
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            module = absolute(node.module, node.level, path) if path.is_relative_to(SRC) else ""
            module = module or node.module or ""
            if module.startswith("haltwise._runtime"):
                found += [
                    f"{path.name}:{node.lineno}: imports {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    return found


def test_no_module_outside_the_runtime_touches_a_runtime_underscore() -> None:
    private = runtime_underscores()
    # the seams issue 30 named are among the names checked
    assert {"_start_named", "_active", "_worked_here", "_adopt", "_leased_at"} <= private
    found = [
        line
        for path in outside_the_runtime()
        for line in touches_runtime_underscores(path, private)
    ]
    assert found == [], "use the runtime's public API or haltwise._runtime.lowlevel"


def test_the_underscore_check_sees_what_it_looks_for() -> None:
    path = SRC / "_cli" / "example.py"  # where a face's module would be (never written)
    code = (
        "from .._runtime.steps import _replay\n"
        "from haltwise._runtime.runtime import _check_deadline\n"
        "async def f(runtime):\n"
        "    self._active = 1\n"
        "    return await runtime._start_named(None, (), {})\n"
    )
    found = touches_runtime_underscores(path, runtime_underscores(), code)
    assert [line.split(": ", 1)[1] for line in found] == [
        "imports _replay",
        "imports _check_deadline",
        "._start_named",
    ]
