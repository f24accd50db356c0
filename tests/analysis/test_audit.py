"""``audit``: policy rows, plain-words "leaves", findings, and the JSON/Markdown/rich renderings."""

from __future__ import annotations

import functools
import io
import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import haltwise
from haltwise import Tool
from haltwise._analysis.audit import AuditReport, FindingCode, audit_tools
from haltwise._core.policy import ToolPolicy
from haltwise._runtime.loader import load_tools
from haltwise._runtime.spec import ToolSpec
from haltwise._runtime.tool import tool_function


def delete_note(text: str) -> None:
    pass


def ask_nobody(text: str) -> None:
    """A reconcile hook that cannot tell (a tool built for another finding has one)."""


def make(**policy: Any) -> Tool[..., Any]:
    """A plain tool named ``policy.pop('name')`` declared with the remaining arguments."""
    name = policy.pop("name", "t")

    def fn(text: str) -> None:
        pass

    return haltwise.tool(name=name, **policy)(fn)


def rollback_without_compensate() -> Tool[..., Any]:
    # Declared as a user would: the decorator accepts it, the audit reports it (issue 15, 14).
    return haltwise.tool(cancel="rollback", effect="write", name="undo_nothing")(delete_note)


def retrying_external() -> Tool[..., Any]:
    policy = ToolPolicy.declare(
        name="charge",
        cancel="finish",
        effect="external",
        idempotent=False,
        compensate=None,
        grace=5,
        retries=2,
        reconcile=ask_nobody,
    )
    return tool_function(ToolSpec(delete_note, policy, "charge"))


def codes(tools: list[Tool[..., Any]], deadline: float | None = None) -> list[str]:
    return [finding.code.value for finding in audit_tools(tools, deadline=deadline).findings]


# -- findings ----------------------------------------------------------------------------------

TRIGGERS: list[tuple[str, Callable[[], Tool[..., Any]], float | None]] = [
    ("undeclared-cancel", lambda: make(effect="read"), None),
    ("undeclared-effect", lambda: make(cancel="finish", grace=5, reconcile=ask_nobody), None),
    ("rollback-without-compensate", rollback_without_compensate, None),
    ("interruptible-side-effect", lambda: make(cancel="interruptible", effect="write"), None),
    (
        "finish-unbounded-external",
        lambda: make(cancel="finish", effect="external", reconcile=ask_nobody),
        None,
    ),
    (
        "grace-exceeds-deadline",
        lambda: make(cancel="finish", effect="write", grace=60, reconcile=ask_nobody),
        10.0,
    ),
    ("retries-repeat-effect", retrying_external, None),
    ("no-reconcile", lambda: make(cancel="finish", effect="write", grace=5), None),
]


@pytest.mark.parametrize(("code", "build", "deadline"), TRIGGERS, ids=[t[0] for t in TRIGGERS])
def test_each_code_fires_alone_on_a_tool_built_for_it(
    code: str, build: Callable[[], Tool[..., Any]], deadline: float | None
) -> None:
    tool = build()
    report = audit_tools([tool], deadline=deadline)
    assert [finding.code.value for finding in report.findings] == [code]
    (finding,) = report.findings
    assert finding.tool == tool.name
    assert tool.name in finding.message
    assert finding.fix
    assert not report.ok


def test_codes_are_exactly_the_contract_ones() -> None:
    # the codes of a tool's findings; a task's (no-budget) is tested with a file below
    tasks = {"no-budget"}
    assert {code.value for code in FindingCode} == {t[0] for t in TRIGGERS} | tasks


CLEAN = [
    lambda: make(cancel="interruptible", effect="read"),
    lambda: make(cancel="interruptible", effect="none"),
    lambda: make(cancel="interruptible", effect="write", idempotent=True),
    lambda: make(cancel="finish", effect="external", idempotent=True),
    lambda: make(cancel="finish", effect="external", grace=5, reconcile=ask_nobody),
    lambda: make(cancel="finish", effect="write", reconcile=ask_nobody),
    lambda: make(cancel="rollback", effect="write", compensate=delete_note, grace=10),
    # interruptible tools do not wait after a cancel, so their grace cannot overrun a deadline
    lambda: make(cancel="interruptible", effect="read", grace=600),
]


@pytest.mark.parametrize("build", CLEAN)
def test_clean_tools_have_no_findings(build: Callable[[], Tool[..., Any]]) -> None:
    report = audit_tools([build()], deadline=60)
    assert report.findings == ()
    assert report.ok


def test_grace_equal_to_the_deadline_is_fine() -> None:
    tool = make(cancel="finish", effect="write", grace=10, reconcile=ask_nobody)
    assert codes([tool], deadline=10) == []


def test_grace_exceeds_deadline_only_when_a_deadline_is_given() -> None:
    tool = make(cancel="rollback", effect="write", compensate=delete_note, grace=60)
    assert codes([tool]) == []
    assert codes([tool], deadline=59.5) == ["grace-exceeds-deadline"]


def test_undeclared_everything_reports_both_gaps_and_the_default_grace_against_a_deadline() -> None:
    assert codes([make()], deadline=10) == [
        "undeclared-cancel",
        "undeclared-effect",
        "grace-exceeds-deadline",
    ]


def test_finish_on_an_assumed_external_effect_counts_as_external() -> None:
    assert codes([make(cancel="finish")]) == [
        "undeclared-effect",
        "finish-unbounded-external",
        "no-reconcile",
    ]


def test_findings_follow_tool_order() -> None:
    first = make(name="first", effect="read")
    second = make(name="second", cancel="interruptible", effect="external")
    report = audit_tools([first, second])
    assert [(f.tool, f.code.value) for f in report.findings] == [
        ("first", "undeclared-cancel"),
        ("second", "interruptible-side-effect"),
    ]


@pytest.mark.parametrize("deadline", [0, -1, math.inf, math.nan])
def test_deadline_must_be_positive_and_finite(deadline: float) -> None:
    with pytest.raises(ValueError, match="deadline"):
        audit_tools([], deadline=deadline)


def test_the_same_tool_twice_is_audited_once() -> None:
    tool = make(effect="read")
    report = audit_tools([tool, tool])
    assert len(report.tools) == 1
    assert len(report.findings) == 1


# -- rows and what a cancel leaves ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "leaves"),
    [
        ({"cancel": "interruptible", "effect": "read"}, "nothing: the read is dropped"),
        (
            {"cancel": "finish", "effect": "external", "idempotent": True},
            "the call completes (up to 30 s), then the task stops; a resume will not repeat it",
        ),
        (
            {"cancel": "finish", "effect": "external"},
            "the call completes, then the task stops; if it runs past 30 s it is unknown and "
            "someone must check",
        ),
        (
            {"cancel": "rollback", "effect": "write", "compensate": delete_note, "grace": 5},
            "the write is undone by delete_note (within 5 s); if that fails it is unknown",
        ),
        (
            {"cancel": "interruptible", "effect": "write"},
            "perhaps part of the write; a resume runs it again and may repeat it",
        ),
        (
            {"effect": "write"},
            "not declared, so the call completes, then the task stops; if it runs past 30 s it "
            "is unknown and someone must check",
        ),
    ],
)
def test_leaves_in_plain_words(policy: dict[str, Any], leaves: str) -> None:
    (row,) = audit_tools([make(**policy)]).tools
    assert row.leaves == leaves


def test_a_partial_compensation_is_named_by_its_function() -> None:
    tool = make(cancel="rollback", effect="write", compensate=functools.partial(delete_note))
    (row,) = audit_tools([tool]).tools
    assert row.compensate == "delete_note"


def test_rollback_without_compensate_leaves_an_unknown() -> None:
    (row,) = audit_tools([rollback_without_compensate()]).tools
    assert row.leaves == "nothing undoes it: unknown, someone must check"
    assert row.compensate is None


# -- renderings ---------------------------------------------------------------------------------

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

    @haltwise.tool
    async def send_email(to: str, body: str) -> str:
        return "ok"
"""


@pytest.fixture
def report(tmp_path: Path) -> AuditReport:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(AGENT))
    return audit_tools(load_tools(path))


def test_json_is_exactly_the_contract_shape(report: AuditReport) -> None:
    document = json.loads(report.to_json())
    assert set(document) == {"tools", "findings"}
    contract = {"name", "cancel", "effect", "idempotent", "grace", "compensate", "declared"}
    picked = [{key: row[key] for key in contract} for row in document["tools"]]
    assert picked == [
        {
            "name": "search",
            "cancel": "interruptible",
            "effect": "read",
            "idempotent": False,
            "grace": 30.0,
            "compensate": None,
            "declared": True,
        },
        {
            "name": "insert_note",
            "cancel": "rollback",
            "effect": "write",
            "idempotent": False,
            "grace": 30.0,
            "compensate": "delete_note",
            "declared": True,
        },
        {
            "name": "send_email",
            "cancel": None,
            "effect": "external",
            "idempotent": False,
            "grace": 30.0,
            "compensate": None,
            "declared": False,
        },
    ]
    findings = [{key: f[key] for key in ("tool", "code")} for f in document["findings"]]
    assert findings == [
        {"tool": "send_email", "code": "undeclared-cancel"},
        {"tool": "send_email", "code": "undeclared-effect"},
    ]
    assert all(isinstance(f["message"], str) and f["message"] for f in document["findings"])


def test_json_of_an_empty_audit() -> None:
    assert json.loads(audit_tools([]).to_json()) == {"tools": [], "findings": []}


def test_markdown_has_every_tool_and_finding(report: AuditReport) -> None:
    markdown = report.to_markdown()
    for name in ("search", "insert_note", "send_email"):
        assert f"| `{name}` |" in markdown
    assert "`undeclared-cancel`" in markdown
    assert "`undeclared-effect`" in markdown
    table_rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    assert len(table_rows) == 3 + 2


def test_markdown_escapes_pipes_and_says_when_there_are_no_findings() -> None:
    tool = make(name="a|b", cancel="interruptible", effect="read")
    markdown = audit_tools([tool]).to_markdown()
    assert "`a\\|b`" in markdown
    assert "No findings." in markdown


def render(report: AuditReport) -> str:
    buffer = io.StringIO()
    report.render_rich(Console(file=buffer, width=250, color_system=None))
    return buffer.getvalue()


def test_render_rich_prints_every_tool_and_finding(report: AuditReport) -> None:
    text = render(report)
    for name in ("search", "insert_note", "send_email", "undeclared-cancel", "delete_note"):
        assert name in text


def test_render_rich_prints_names_literally() -> None:
    text = render(audit_tools([make(name="[bold]x[/bold]", effect="read")]))
    assert "[bold]x[/bold]" in text


ROLLBACK_FILE = """
import haltwise


@haltwise.tool(cancel="rollback", effect="write", grace=5)
async def insert_row(text: str) -> int:
    return 1
"""


def test_audit_of_a_file_reports_rollback_without_compensate(tmp_path: Path) -> None:
    """Issue 15, item 14: the file imports (no PolicyError at decoration) and the audit shows
    the contract's finding; --strict exits 1 on it."""
    (tmp_path / "agent.py").write_text(ROLLBACK_FILE)

    def audit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haltwise", "audit", "agent.py", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = audit("--json")
    assert done.returncode == 0, done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert [(f["tool"], f["code"]) for f in findings] == [
        ("insert_row", "rollback-without-compensate")
    ]
    assert audit("--strict").returncode == 1


BUDGET_FILE = """
import haltwise
from haltwise.integrations.pydantic_ai import JournaledModel
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> str:
    return query


def make_agent() -> Agent:
    return Agent(JournaledModel(TestModel()))


@haltwise.task
async def unmetered(prompt: str) -> str:
    return (await make_agent().run(prompt)).output


@haltwise.task(budget=haltwise.Budget(usd=1.0))
async def metered(prompt: str) -> str:
    return (await make_agent().run(prompt)).output


@haltwise.task
async def no_model(query: str) -> str:
    return await search(query)
"""


def test_audit_reports_a_task_calling_a_model_without_a_budget(tmp_path: Path) -> None:
    """Issue 33: ``no-budget`` for a task whose code (through a function of its file) calls a
    model through an adapter with no budget; informational: --strict exits 0 on it, and 1 with
    --strict-budget."""
    (tmp_path / "agent.py").write_text(BUDGET_FILE)

    def audit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "haltwise", "audit", "agent.py", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = audit("--json", "--strict")
    assert done.returncode == 0, "no-budget alone does not fail --strict: " + done.stderr
    findings = json.loads(done.stdout)["findings"]
    assert [(f["tool"], f["code"]) for f in findings] == [("agent.py:unmetered", "no-budget")]
    assert audit("--strict", "--strict-budget").returncode == 1
