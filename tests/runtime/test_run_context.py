"""A run's in-memory state is changed through its own methods (issue 13): no module but its home
assigns a field of a ``RunContext`` (``_runtime/run_context.py``) or of the state objects a run
holds, its ``CancelState`` (``_runtime/cancel_state.py``) and its ``PauseGate``
(``_runtime/pause.py``). Checked on the source, with ``ast``, over every assignment to an
attribute of the names the package gives these objects (``ctx``, ``run``, ``ctx.cancel``,
``gate``, ...), so that a new loose write fails here.

One field is left to the runtime on purpose: ``RunContext.held_until``, which moves with the
run's lease (``Runtime._launch``, the lease renewal and ``RuntimeHost.confirm_held``).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import haltwise
from haltwise._runtime.cancel_state import CancelState
from haltwise._runtime.pause_state import PauseGate
from haltwise._runtime.run_context import RunContext

SRC = Path(haltwise.__file__).parent
RUNS = ("ctx", "run", "self.run", "parent", "child")


@dataclasses.dataclass(frozen=True)
class Owned:
    """The fields of ``kind``, written only in ``home``; ``receivers``: what the package calls
    an object of that kind (the expression before the field's name)."""

    kind: type
    home: str
    receivers: frozenset[str]
    left_out: frozenset[str] = frozenset()

    @property
    def fields(self) -> frozenset[str]:
        if dataclasses.is_dataclass(self.kind):
            names = {field.name for field in dataclasses.fields(self.kind)}
        else:
            names = set(self.kind.__slots__)
        return frozenset(names - self.left_out)


OWNED = [
    Owned(RunContext, "_runtime/run_context.py", frozenset(RUNS), frozenset({"held_until"})),
    Owned(CancelState, "_runtime/cancel_state.py", frozenset(f"{r}.cancel" for r in RUNS)),
    Owned(PauseGate, "_runtime/pause.py", frozenset({"gate", *(f"{r}.pause" for r in RUNS)})),
]


def loose_writes(owned: Owned, path: Path, code: str | None = None) -> list[str]:
    """Every assignment in ``path`` (or in ``code``, read as if it were that file) to a field
    of an ``owned.kind``, as ``file:line: receiver.field``."""
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
                    and part.attr in owned.fields
                    and ast.unparse(part.value) in owned.receivers
                ):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(part)}")
    return found


@pytest.mark.parametrize("owned", OWNED, ids=lambda owned: owned.kind.__name__)
def test_no_module_but_its_home_assigns_a_field_of_a_runs_state(owned: Owned) -> None:
    files = [path for path in sorted(SRC.rglob("*.py")) if path != SRC / owned.home]
    assert len(files) > 50, files  # the walk sees the package
    assert owned.fields, owned  # the check knows the fields
    found = [line for path in files for line in loose_writes(owned, path)]
    assert found == [], f"give the change a method in {owned.home}"


def test_the_check_sees_what_it_looks_for() -> None:
    code = (
        "ctx.probe = probe\n"
        "run.task_emits += 1\n"
        "self.run.poison: object = None\n"
        "a, run.next_yield = 1, 2\n"
        "run.held_until = 0\n"  # the lease's: the runtime's own
        "store.poison = None\n"  # not a run
        "run.cancel.reason = None\n"
        "gate.parent = None\n"
        "ctx.pause.requested = True\n"
    )
    run, cancel, pause = OWNED
    path = SRC / "x.py"
    assert loose_writes(run, path, code) == [
        "x.py:1: ctx.probe",
        "x.py:2: run.task_emits",
        "x.py:3: self.run.poison",
        "x.py:4: run.next_yield",
    ]
    assert loose_writes(cancel, path, code) == ["x.py:7: run.cancel.reason"]
    assert loose_writes(pause, path, code) == ["x.py:8: gate.parent", "x.py:9: ctx.pause.requested"]
