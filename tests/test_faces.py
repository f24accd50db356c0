"""The faces (command line, HTTP server, framework integrations) reach the journal only through
the runtime's read API and verbs (issue 13, item 5): none imports ``haltwise._journal`` or reads
``.store`` off a runtime or a run. Checked on the source, with ``ast``, so that a new command
or endpoint that reaches into the store fails here. Also: ``import haltwise`` imports nothing of
the package beyond itself (its public names load on first use), and its lazy table names the
same as the imports mypy reads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import haltwise

SRC = Path(haltwise.__file__).parent
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
