"""Each integration is importable only with its framework, and says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import haltwise
from haltwise.integrations._common import MissingExtraError, require

#: integration module -> (the framework module it needs, the extra that installs it)
INTEGRATIONS = {
    "langchain": ("langchain.agents", "langchain"),
    "mcp": ("mcp", "mcp"),
    "openai_agents": ("agents", "openai-agents"),
    "pydantic_ai": ("pydantic_ai", "pydantic-ai"),
}


def test_require_names_the_extra() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("demo", "no_such_framework_for_haltwise", "demo-extra")
    error = caught.value
    assert isinstance(error, ImportError)
    assert isinstance(error, haltwise.HaltwiseError)
    assert str(error) == (
        "haltwise.integrations.demo needs the 'no_such_framework_for_haltwise' package: "
        "pip install 'haltwise[demo-extra]' (from a checkout of haltwise: "
        "pip install -e '.[demo-extra]')"
    )


def test_an_error_inside_an_installed_framework_is_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_framework_for_haltwise.py").write_text("import its_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        require("demo", "broken_framework_for_haltwise", "demo")
    assert not isinstance(caught.value, MissingExtraError)
    assert caught.value.name == "its_missing_dependency"


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_importing_without_the_framework_raises_missing_extra(name: str) -> None:
    framework, extra = INTEGRATIONS[name]
    script = (
        "import sys\n"
        f"sys.modules[{framework!r}] = None  # as if it were not installed\n"
        "try:\n"
        f"    import haltwise.integrations.{name}\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == (
        f"MissingExtraError haltwise.integrations.{name} needs the {framework!r} package: "
        f"pip install 'haltwise[{extra}]' (from a checkout of haltwise: "
        f"pip install -e '.[{extra}]')"
    )


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_importable_with_the_framework(name: str) -> None:
    module = __import__(f"haltwise.integrations.{name}", fromlist=["__all__"])
    assert module.__all__
