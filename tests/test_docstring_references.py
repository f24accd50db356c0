"""Every dotted name a docstring or comment of ``haltwise`` points at in reST (``:mod:``,
``:class:``, ``:func:``..., absolute ``haltwise.x.y`` or relative ``.x.y``) exists: a module that
moved leaves no docstring naming its old place (issue 30, item 4: four did).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import haltwise

SRC = Path(haltwise.__file__).parent
ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):`~?([.A-Za-z_][A-Za-z_0-9.]*)`")


def module_of(path: Path) -> str:
    return ".".join(["haltwise", *path.relative_to(SRC).with_suffix("").parts]).removesuffix(
        ".__init__"
    )


def resolves(name: str) -> bool:
    """Whether ``haltwise.a.b.C.d`` is a module, or an attribute (or an annotated attribute of
    a class, such as a protocol's) reached from the longest module prefix."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return attribute in getattr(found, "__annotations__", {})
            found = getattr(found, attribute)
        return True
    return False


def unresolved(path: Path, text: str | None = None) -> list[str]:
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    lines = (path.read_text() if text is None else text).splitlines()
    for number, line in enumerate(lines, 1):
        for match in ROLE.finditer(line):
            name = match.group(1)
            if name.startswith("."):
                candidates = [package + name, module + name]
            elif name.startswith("haltwise."):
                candidates = [name]
            else:
                continue  # a name of the module itself or of another package
            if not any(resolves(candidate) for candidate in candidates):
                found.append(f"{path.relative_to(SRC)}:{number}: {name}")
    return found


def test_every_reference_in_a_docstring_exists() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 60
    found = [line for path in files for line in unresolved(path)]
    assert found == [], "a docstring names a module or object that is not there (moved?)"


def test_the_check_sees_what_it_looks_for() -> None:
    path = SRC / "_journal" / "sqlite.py"
    text = (
        "see :class:`~haltwise._store.Store` and :mod:`.sqlite_writer`,\n"
        ":mod:`haltwise._sqlite_writer`, :func:`.sql.plan_cancel_write`, :meth:`Store.open`\n"
    )
    assert [line.split(": ", 1)[1] for line in unresolved(path, text)] == [
        "haltwise._store.Store",
        "haltwise._sqlite_writer",
    ]
