"""The public surface, snapshotted: an addition or a removal is a deliberate change.

``tests/fixtures/public_surface.json`` holds ``haltwise.__all__``, ``haltwise.testing.__all__``
and every public class's public members. A change to the surface fails here until the snapshot
is written again (``python tests/test_public_surface.py --update``) and the diff is reviewed with
the change. Also: ordinary public classes are ``@final`` (as in Trio), and public signatures name
only types the package exports (a user can import every type they are handed).
"""

from __future__ import annotations

import enum
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import haltwise
import haltwise.testing

SNAPSHOT = Path(__file__).parent / "fixtures" / "public_surface.json"

#: Public modules and the names they export.
MODULES = {"haltwise": haltwise, "haltwise.testing": haltwise.testing}


def public_members(cls: type) -> list[str]:
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith(("haltwise", "builtins")) is False:
            continue
        if klass is object:
            continue
        names.update(name for name in vars(klass) if not name.startswith("_"))
    return sorted(names)


def surface() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for module_name, module in MODULES.items():
        found[f"{module_name}.__all__"] = sorted(module.__all__)
        for name in sorted(module.__all__):
            obj = getattr(module, name)
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                if issubclass(obj, enum.Enum):
                    found[f"{module_name}.{name}"] = [member.value for member in obj]
                else:
                    found[f"{module_name}.{name}"] = public_members(obj)
    return found


def test_the_public_surface_is_the_snapshot() -> None:
    expected = json.loads(SNAPSHOT.read_text())
    assert surface() == expected, (
        "the public surface changed: review it, then run "
        "'python tests/test_public_surface.py --update' and commit the snapshot"
    )


#: Public classes that are meant to be subclassed or are records/enums/errors.
OPEN_CLASSES = {"Tool", "Task"}


def test_ordinary_public_classes_are_final() -> None:
    for module in MODULES.values():
        for name in module.__all__:
            obj = getattr(module, name)
            if not inspect.isclass(obj) or name in OPEN_CLASSES:
                continue
            if issubclass(obj, BaseException | enum.Enum) or getattr(obj, "_is_protocol", False):
                continue
            assert getattr(obj, "__final__", False), f"{module.__name__}.{name} is not @final"


def exported_types() -> set[type]:
    return {
        obj
        for module in MODULES.values()
        for obj in (getattr(module, name) for name in module.__all__)
        if inspect.isclass(obj)
    }


def named_types(hint: Any) -> list[type]:
    """Every class a type hint mentions (through unions, generics and callables)."""
    if isinstance(hint, type) and not isinstance(hint, types.GenericAlias):
        return [hint]
    found: list[type] = []
    for argument in typing.get_args(hint):
        found.extend(named_types(argument))
    origin = typing.get_origin(hint)
    if isinstance(origin, type):
        found.append(origin)
    return found


def public_callables() -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for module in MODULES.values():
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                found.append((f"{module.__name__}.{name}", obj))
            elif inspect.isclass(obj) and not issubclass(obj, BaseException | enum.Enum):
                for member in ["__init__", *public_members(obj)]:
                    attribute = inspect.getattr_static(obj, member)
                    function = getattr(attribute, "fget", attribute)
                    if inspect.isfunction(function):
                        found.append((f"{module.__name__}.{name}.{member}", function))
    return found


def test_public_signatures_name_only_exported_types() -> None:
    exported = exported_types()
    for where, function in public_callables():
        hints = typing.get_type_hints(function, vars(sys.modules[function.__module__]))
        for hint in hints.values():
            for named in named_types(hint):
                if named.__module__.startswith("haltwise"):
                    assert named in exported, f"{where} names {named.__qualname__}, not exported"


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit("usage: python tests/test_public_surface.py --update")
    SNAPSHOT.write_text(json.dumps(surface(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
