"""Loading FILE.py:TASK specs and finding the tools and tasks a file defines."""

from __future__ import annotations

import pickle
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from haltwise import HaltwiseError, Task, Tool
from haltwise._runtime.loader import (
    LoadError,
    find_tools,
    load_module,
    load_target,
    load_tasks,
    load_tools,
    module_name_for,
)
from haltwise._runtime.tool import TASKS

AGENT = """
    import haltwise

    @haltwise.tool(cancel="interruptible", effect="read")
    async def search(query: str) -> list[str]:
        return [query]

    def delete_note(text: str) -> None:
        pass

    @haltwise.tool(cancel="rollback", effect="write", compensate=delete_note)
    def insert_note(text: str) -> int:
        return 1

    @haltwise.task
    async def research(topic: str) -> str:
        for hit in await search(topic):
            await insert_note(hit)
        return "done"

    NOT_A_TASK = 42
"""


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def assert_one_line(error: pytest.ExceptionInfo[LoadError]) -> None:
    assert "\n" not in str(error.value)
    assert isinstance(error.value, HaltwiseError)


@pytest.fixture(autouse=True)
def own_registry() -> Iterator[None]:
    """Each test stands for a process of its own: the tasks its files declare are forgotten
    after it (two files named agent.py declaring ``research`` in one process are refused)."""
    saved = dict(TASKS)
    TASKS.clear()
    yield
    TASKS.clear()
    TASKS.update(saved)


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    return write(tmp_path, "agent.py", AGENT)


def test_load_target_returns_module_and_task(agent: Path) -> None:
    module, task = load_target(f"{agent}:research")
    assert isinstance(task, Task)
    assert task is module.research
    assert module.__name__ == module_name_for(agent)
    assert sys.modules[module.__name__] is module
    # named after its file, never the internal module name (issue 15, item 12)
    assert task.name == "agent.py:research"
    assert task.source == str(agent.resolve())


def test_spec_without_task_returns_module_only(agent: Path) -> None:
    module, task = load_target(str(agent))
    assert task is None
    assert isinstance(module.search, Tool)


def test_same_file_twice_is_executed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "runs.txt"
    path = write(tmp_path, "once.py", f"open({str(marker)!r}, 'a').write('x')\n")
    first = load_module(path)
    monkeypatch.chdir(tmp_path)
    again = load_module("./once.py")
    (tmp_path / "sub").mkdir()
    spelled_otherwise = load_module(str(tmp_path / "sub" / ".." / "once.py"))
    assert first is again is spelled_otherwise
    assert marker.read_text() == "x"


def test_two_files_with_the_same_stem_are_distinct_modules(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = load_module(write(tmp_path / "a", "agent.py", "WHO = 'a'\n"))
    two = load_module(write(tmp_path / "b", "agent.py", "WHO = 'b'\n"))
    assert (one.WHO, two.WHO) == ("a", "b")
    assert one.__name__ != two.__name__


def test_module_name_is_stable_and_an_identifier(tmp_path: Path) -> None:
    path = tmp_path / "my-agent.v2.py"
    assert module_name_for(path) == module_name_for(tmp_path / "." / "my-agent.v2.py")
    assert module_name_for(path).isidentifier()


def test_dataclasses_and_pickling_work_in_a_loaded_file(tmp_path: Path) -> None:
    source = """
        from __future__ import annotations
        from dataclasses import dataclass

        @dataclass
        class Hit:
            title: str
            score: int = 0
    """
    module = load_module(write(tmp_path, "records.py", source))
    hit = module.Hit("cats", 3)
    assert pickle.loads(pickle.dumps(hit)) == hit


def test_sibling_imports_work_and_sys_path_is_restored(tmp_path: Path) -> None:
    sibling = f"sibling_{uuid.uuid4().hex}"
    write(tmp_path, f"{sibling}.py", "VALUE = 7\n")
    path = write(tmp_path, "main.py", f"from {sibling} import VALUE\n")
    before = list(sys.path)
    try:
        assert load_module(path).VALUE == 7
    finally:
        sys.modules.pop(sibling, None)
    assert sys.path == before


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(LoadError, match="no such file") as error:
        load_target(f"{missing}:research")
    assert str(missing) in str(error.value)
    assert error.value.target == str(missing)
    assert_one_line(error)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="not a file"):
        load_module(tmp_path)


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.py", "x = 1\n\ndef f(:\n    pass\n")
    with pytest.raises(LoadError) as error:
        load_module(path)
    assert str(error.value).startswith(f"{path}:3: SyntaxError: ")
    assert_one_line(error)


def test_import_error_inside_the_file_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "needs.py", "import os\nimport no_such_module_haltwise_test\n")
    with pytest.raises(LoadError) as error:
        load_module(path)
    message = str(error.value)
    assert message.startswith(f"{path}:2: ModuleNotFoundError: ")
    assert "no_such_module_haltwise_test" in message
    assert module_name_for(path) not in sys.modules
    assert_one_line(error)


def test_a_failed_file_is_not_cached(tmp_path: Path) -> None:
    path = write(tmp_path, "fixme.py", "raise RuntimeError('first\\nsecond')\n")
    with pytest.raises(LoadError, match=r"RuntimeError: first second") as error:
        load_module(path)
    assert_one_line(error)
    path.write_text("FIXED = True\n")
    assert load_module(path).FIXED is True


def test_exception_in_a_function_called_at_import_names_the_file_line(tmp_path: Path) -> None:
    source = "def boom():\n    return 1 / 0\n\nboom()\n"
    path = write(tmp_path, "calls.py", source)
    with pytest.raises(LoadError) as error:
        load_module(path)
    assert str(error.value).startswith(f"{path}:2: ZeroDivisionError: ")


def test_sys_exit_at_import_is_a_load_error(tmp_path: Path) -> None:
    path = write(tmp_path, "exits.py", "import sys\nsys.exit(3)\n")
    with pytest.raises(LoadError, match=r"sys\.exit\(3\)"):
        load_module(path)


def test_bad_policy_in_the_file_is_a_load_error(tmp_path: Path) -> None:
    source = """
        import haltwise

        @haltwise.tool(cancel="sometimes")
        def flaky() -> None: ...
    """
    with pytest.raises(LoadError, match="PolicyError: tool 'flaky': unknown cancel="):
        load_module(write(tmp_path, "policy.py", source))


def test_no_such_task_lists_the_tasks(agent: Path) -> None:
    with pytest.raises(LoadError, match="no task 'resarch'; tasks there: research") as error:
        load_target(f"{agent}:resarch")
    assert_one_line(error)


@pytest.mark.parametrize(
    ("attribute", "kind"), [("NOT_A_TASK", "int"), ("search", "Tool"), ("delete_note", "function")]
)
def test_attribute_that_is_not_a_task(agent: Path, attribute: str, kind: str) -> None:
    with pytest.raises(LoadError, match=f"'{attribute}' is a {kind}, not a task"):
        load_target(f"{agent}:{attribute}")


def test_file_without_tasks_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.py", "X = 1\n")
    with pytest.raises(LoadError, match="it defines no tasks"):
        load_target(f"{path}:main")


def test_empty_task_name(agent: Path) -> None:
    with pytest.raises(LoadError, match="no task name after ':'"):
        load_target(f"{agent}:")


def test_windows_style_path_is_not_split_at_the_drive_colon() -> None:
    spec = "C:\\agents\\nowhere_haltwise.py"
    with pytest.raises(LoadError, match="no such file") as error:
        load_target(spec)
    assert error.value.target == spec


def test_find_tools_in_definition_order_without_duplicates(tmp_path: Path) -> None:
    source = """
        import haltwise

        @haltwise.tool(cancel="finish", effect="external", grace=5)
        async def send(to: str) -> None: ...

        also_send = send

        @haltwise.tool(effect="read")
        def lookup(key: str) -> str:
            return key
    """
    tools = load_tools(write(tmp_path, "tools.py", source))
    assert [tool.name for tool in tools] == ["send", "lookup"]


def test_imported_tools_count(tmp_path: Path) -> None:
    write(tmp_path, "base_agent.py", AGENT)
    source = """
        from base_agent import search

        import haltwise

        @haltwise.tool(cancel="interruptible", effect="none")
        def pure() -> int:
            return 1
    """
    try:
        tools = load_tools(write(tmp_path, "uses.py", source))
    finally:
        sys.modules.pop("base_agent", None)
    assert [tool.name for tool in tools] == ["search", "pure"]


def test_load_tasks(agent: Path) -> None:
    assert [task.fn.__name__ for task in load_tasks(agent)] == ["research"]


def test_find_tools_on_a_module_object(agent: Path) -> None:
    module = load_module(agent)
    assert load_module(module) is module
    assert [tool.name for tool in find_tools(module)] == ["search", "insert_note"]


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"hw_importable_{uuid.uuid4().hex}"
    write(tmp_path, f"{name}.py", AGENT)
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def test_module_name_spec_imports_from_the_current_directory(importable: str) -> None:
    before = list(sys.path)
    module, task = load_target(f"{importable}:research")
    assert isinstance(module, ModuleType)
    assert module.__name__ == importable
    assert task is module.research
    assert sys.path == before


def test_unknown_module_name() -> None:
    with pytest.raises(LoadError, match="no_such_haltwise_module: no such file or module"):
        load_target("no_such_haltwise_module:main")
