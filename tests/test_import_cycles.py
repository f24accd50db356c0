"""No import cycle in ``haltwise`` (issue 30, item 3), counting every kind of import.

A module-level import, an import inside a function (the lazy ones that keep a command light)
and an import under ``if TYPE_CHECKING:`` each make an edge: a cycle through any of them is a
knot a reader has to untie, even when Python happens to load it. The graph is grimp's (the
engine of import-linter), read from the source; the cycles are its strongly connected
components (Tarjan). The two knots this removed were the journal's store factory (now
``_journal/__init__.open_store``) and the runtime's pause (``pause_state`` / ``pause``), tool
(``spec`` / ``tool``) and child step (``children.child_body``).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp


def import_graph() -> Mapping[str, Set[str]]:
    """Every module of ``haltwise`` and the ``haltwise`` modules it imports, any way at all."""
    graph = grimp.build_graph("haltwise", include_external_packages=False, cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def cycles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, through a chain of any length (the
    strongly connected components of more than one module, and a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(edges.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in edges.get(module, ()):
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == [], (
        "modules importing each other (module-level, in a function or under TYPE_CHECKING): "
        "move what both need below both, or hand it in through a protocol"
    )


def test_the_graph_holds_function_and_type_checking_imports() -> None:
    edges = import_graph()
    # in Task.__call__ (a function-level import)
    assert "haltwise._runtime.children" in edges["haltwise._runtime.tool"]
    # in open_store (a function-level import)
    assert "haltwise._journal.sqlite" in edges["haltwise._journal"]
    # under TYPE_CHECKING
    assert "haltwise._journal.store" in edges["haltwise._runtime.run_context"]


def test_the_check_sees_a_cycle_of_any_length() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert cycles(edges) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
