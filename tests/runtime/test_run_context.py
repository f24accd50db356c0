"""A run's in-memory state is changed through its own methods (issue 13): no module but
``_runtime/run_context.py`` assigns a field of a ``RunContext``. Checked on the source, with
``ast``, over every assignment to an attribute of ``ctx``, ``run`` or ``self.run`` (the names the
package gives a run), so that a new loose write fails here.

One field is left to the runtime on purpose: ``held_until``, which moves with the run's lease
(``Runtime._launch``, the lease renewal and ``RuntimeHost.confirm_held``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import haltwise
from haltwise._runtime.run_context import RunContext

SRC = Path(haltwise.__file__).parent
HOME = SRC / "_runtime" / "run_context.py"
FIELDS = {field.name for field in dataclasses.fields(RunContext)}
#: what a run is called where the package holds one
RECEIVERS = {"ctx", "run", "self.run"}
LEFT_TO_THE_RUNTIME = {"held_until"}


def loose_writes(path: Path, code: str | None = None) -> list[str]:
    """Every assignment in ``path`` (or in ``code``, read as if it were that file) to a field
    of a run, as ``file:line: receiver.field``."""
    tree = ast.parse(path.read_text() if code is None else code, str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.ctx, ast.Store)
                    and part.attr in FIELDS - LEFT_TO_THE_RUNTIME
                    and ast.unparse(part.value) in RECEIVERS
                ):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(part)}")
    return found


def test_no_module_but_run_context_assigns_a_field_of_a_run() -> None:
    files = [path for path in sorted(SRC.rglob("*.py")) if path != HOME]
    assert len(files) > 50, files  # the walk sees the package
    found = [line for path in files for line in loose_writes(path)]
    assert found == [], "give the field's change a method on RunContext"


def test_the_check_sees_what_it_looks_for() -> None:
    code = (
        "ctx.probe = probe\n"
        "run.task_emits += 1\n"
        "self.run.poison: object = None\n"
        "a, run.next_yield = 1, 2\n"
        "run.held_until = 0\n"  # the lease's: the runtime's own
        "store.poison = None\n"  # not a run
        "run.cancel.reason = None\n"  # a field of the cancel state: not a field of the run
    )
    assert loose_writes(SRC / "x.py", code) == [
        "x.py:1: ctx.probe",
        "x.py:2: run.task_emits",
        "x.py:3: self.run.poison",
        "x.py:4: run.next_yield",
    ]
