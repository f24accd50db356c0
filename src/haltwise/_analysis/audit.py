"""``haltwise audit``: every tool's cancel policy, what a mid-call cancel leaves, and the gaps.

:func:`audit_tools` is pure: it reads the tools' declared policies and runs nothing. The report
renders as the contract's JSON (:meth:`AuditReport.to_json`), as a Markdown table for design
reviews (:meth:`AuditReport.to_markdown`) and as a rich table (:meth:`AuditReport.render_rich`).
"""

from __future__ import annotations

import inspect
import json
import math
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, final

from .._core.exceptions import InputError
from .._core.policy import CancelPolicy, Effect
from .._runtime.describe import callable_name, cancel_leaves
from .._runtime.spec import ToolSpec, as_spec

if TYPE_CHECKING:
    from rich.console import Console

    from .._runtime.tool import Task

__all__ = ["AuditReport", "Finding", "FindingCode", "ToolRow", "audit_tools"]


class FindingCode(StrEnum):
    """The kinds of gap ``audit`` reports; the values are the contract's ``code`` strings."""

    #: no ``cancel=``: the tool behaves as ``finish`` with the default grace
    UNDECLARED_CANCEL = "undeclared-cancel"
    #: no ``effect=``: the tool is assumed ``external``, the cautious default
    UNDECLARED_EFFECT = "undeclared-effect"
    #: ``cancel="rollback"`` with nothing to undo the call (the decorator normally refuses it)
    ROLLBACK_WITHOUT_COMPENSATE = "rollback-without-compensate"
    #: ``interruptible`` on a non-idempotent ``write``/``external`` tool
    INTERRUPTIBLE_SIDE_EFFECT = "interruptible-side-effect"
    #: ``finish`` on a non-idempotent ``external`` tool that relies on the default grace
    FINISH_UNBOUNDED_EXTERNAL = "finish-unbounded-external"
    #: the tool may run on after a cancel for longer than the whole deadline
    GRACE_EXCEEDS_DEADLINE = "grace-exceeds-deadline"
    #: ``retries=`` on a non-idempotent ``external`` tool: each retry may repeat the effect
    RETRIES_REPEAT_EFFECT = "retries-repeat-effect"
    #: ``finish`` on a non-idempotent ``write``/``external`` tool with no ``reconcile`` hook
    NO_RECONCILE = "no-reconcile"
    #: a task that calls a model through an adapter has no budget (informational: ``--strict``
    #: fails on it only with ``--strict-budget``); its ``tool`` is the task's name
    NO_BUDGET = "no-budget"


#: The findings ``audit --strict`` does not fail on (``--strict-budget`` fails on them too).
INFORMATIONAL = frozenset({FindingCode.NO_BUDGET})


@final
@dataclass(frozen=True, slots=True)
class ToolRow:
    """One tool's policy as ``audit`` shows it.

    ``cancel`` is ``None`` when the tool declared none (it then behaves as ``finish``);
    ``effect`` and ``grace`` are the values in force, defaults included (``effect_declared`` and
    ``grace_declared`` say whether they were written down). ``compensate`` is the compensating
    function's name. ``leaves`` says in plain words what a cancel in the middle of a call leaves.
    """

    name: str
    cancel: str | None
    effect: str
    idempotent: bool
    grace: float
    compensate: str | None
    declared: bool
    effect_declared: bool
    grace_declared: bool
    leaves: str

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON object for one tool, plus the extra keys of this row."""
        return {
            "name": self.name,
            "cancel": self.cancel,
            "effect": self.effect,
            "idempotent": self.idempotent,
            "grace": self.grace,
            "compensate": self.compensate,
            "declared": self.declared,
            "effect_declared": self.effect_declared,
            "grace_declared": self.grace_declared,
            "leaves": self.leaves,
        }


@final
@dataclass(frozen=True, slots=True)
class Finding:
    """One gap in one tool's policy: what is wrong (``message``) and how to close it (``fix``)."""

    tool: str
    code: FindingCode
    message: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        """The contract's JSON object for one finding, plus ``fix``."""
        return {
            "tool": self.tool,
            "code": self.code.value,
            "message": self.message,
            "fix": self.fix,
        }


@final
@dataclass(frozen=True, slots=True)
class AuditReport:
    """The result of :func:`audit_tools`: one row per tool, and the findings, in tool order.

    ``ok`` is true when there are no findings (what ``audit --strict`` exits 0 on).
    """

    tools: tuple[ToolRow, ...]
    findings: tuple[Finding, ...]
    deadline: float | None = None

    @property
    def ok(self) -> bool:
        """True if no tool has a finding."""
        return not self.findings

    def fails(self, *, strict_budget: bool = False) -> bool:
        """Whether ``audit --strict`` exits 1: a finding that is not informational (a
        ``no-budget`` one counts only with ``strict_budget``)."""
        return any(strict_budget or finding.code not in INFORMATIONAL for finding in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """``{"tools": [...], "findings": [...]}`` as in the contract (extra keys allowed)."""
        return {
            "tools": [row.to_dict() for row in self.tools],
            "findings": [finding.to_dict() for finding in self.findings],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """:meth:`to_dict` as a JSON document (one line unless ``indent`` is given)."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self) -> str:
        """A Markdown section for a design review: the policy table, then the findings."""
        return _markdown(self)

    def render_rich(self, console: Console) -> None:
        """Print the policy table and the findings to a rich ``console``.

        Undeclared policies and findings are highlighted; names are printed literally (never
        read as rich markup).
        """
        _render_rich(self, console)


def audit_tools(
    tools: Iterable[object],
    *,
    deadline: float | None = None,
    tasks: Iterable[Task[..., Any]] = (),
    namespace: Mapping[str, Any] | None = None,
) -> AuditReport:
    """Audit the declared cancel policies of ``tools``; run nothing.

    Findings per tool, in this order (codes in :class:`FindingCode`):

    * ``undeclared-cancel``: no ``cancel=``.
    * ``undeclared-effect``: no ``effect=`` (the tool is treated as ``external``).
    * ``rollback-without-compensate``: ``rollback`` with no ``compensate``.
    * ``interruptible-side-effect``: ``interruptible`` with effect ``write`` or ``external`` and
      not idempotent: a call stopped half way may have done part of its effect, and resume runs
      it again. An idempotent tool is exempt (resume repeats it with the same key).
    * ``finish-unbounded-external``: declared ``finish`` on an ``external`` (declared or assumed),
      non-idempotent tool without a declared ``grace``.
    * ``grace-exceeds-deadline``: only when ``deadline`` (seconds) is given: a tool that waits
      after a cancel (``finish``, ``rollback`` or undeclared, not ``interruptible``) has a grace
      longer than the deadline, so a run can end up to that grace after its deadline.
    * ``retries-repeat-effect``: ``retries=`` on a non-idempotent ``external`` tool (declared or
      assumed): an attempt that failed after its effect happened (a timeout, a lost answer) is
      run again, and the effect happens again.
    * ``no-reconcile``: a non-idempotent ``write`` or ``external`` (declared or assumed) tool
      declared ``finish`` with no ``reconcile=`` hook (an undeclared one is
      ``undeclared-cancel`` already): a forced cancel (or a
      crash) mid-call leaves its step ``unknown``, and only a person can say what happened.

    And per task of ``tasks`` (``namespace``: the globals of its file, where the names it uses
    are looked up):

    * ``no-budget``: the task calls a model through an adapter (its code, or a function of its
      file it calls, names ``JournaledModel``, ``HaltwiseMiddleware`` or ``run_streamed`` of
      ``haltwise.integrations``) and declares no ``budget=``. Informational (see
      :meth:`AuditReport.fails`).

    A tool listed twice (the same object) is audited once. Raises
    :class:`~haltwise.InputError` (a ``ValueError``) if ``deadline`` is not a finite positive
    number.
    """
    if deadline is not None and not (0 < deadline < math.inf):
        raise InputError(f"deadline must be a finite number of seconds > 0, not {deadline!r}")
    specs = map(as_spec, tools)
    unique = list({id(item): item for item in specs}.values())
    rows = tuple(_row(item) for item in unique)
    findings = tuple(found for item in unique for found in _findings(item, deadline))
    budgets = tuple(_no_budget(task, namespace or {}) for task in tasks)
    findings += tuple(finding for finding in budgets if finding is not None)
    return AuditReport(tools=rows, findings=findings, deadline=deadline)


#: What of ``haltwise.integrations`` sends a task's model requests through an adapter.
_ADAPTER_MODELS = frozenset({"JournaledModel", "HaltwiseMiddleware", "run_streamed"})
_INTEGRATIONS = "haltwise.integrations"


def _no_budget(task: Task[..., Any], namespace: Mapping[str, Any]) -> Finding | None:
    if task.budget is not None or not _calls_a_model(task.fn, namespace, set()):
        return None
    return Finding(
        task.name,
        FindingCode.NO_BUDGET,
        f"task {task.name!r} calls a model through an adapter and has no budget: nothing stops "
        "a run that spends more than it should",
        "declare @haltwise.task(budget=haltwise.Budget(usd=..., tokens=..., tool_calls=...)), "
        "or give each run one (Runtime.start(..., budget=...), --budget)",
    )


def _calls_a_model(fn: Any, namespace: Mapping[str, Any], seen: set[int]) -> bool:
    """Whether ``fn``'s code (nested functions included) names an adapter's model, directly
    or through a function of the same file it names (looked up in ``namespace``)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None or id(code) in seen:
        return False
    seen.add(id(code))
    for name in _names(code):
        value = namespace.get(name)
        if value is None:
            continue
        module = getattr(value, "__name__", "") if inspect.ismodule(value) else ""
        if module.startswith(_INTEGRATIONS):
            return True  # an adapter module used by attribute (hp.JournaledModel)
        owner = getattr(value, "__module__", "") or ""
        if owner.startswith(_INTEGRATIONS) and getattr(value, "__name__", "") in _ADAPTER_MODELS:
            return True
        same_file = inspect.isfunction(value) and owner == getattr(fn, "__module__", None)
        if same_file and _calls_a_model(value, namespace, seen):
            return True
        inner = getattr(value, "fn", None)  # a task of the same file
        if callable(inner) and _calls_a_model(inner, namespace, seen):
            return True
    return False


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _row(tool: ToolSpec) -> ToolRow:
    policy = tool.policy
    return ToolRow(
        name=tool.name,
        cancel=policy.cancel.value if policy.cancel is not None else None,
        effect=policy.effect.value,
        idempotent=policy.idempotent,
        grace=policy.grace,
        compensate=callable_name(policy.compensate),
        declared=policy.cancel is not None,
        effect_declared=policy.effect_declared,
        grace_declared=policy.grace_declared,
        leaves=cancel_leaves(policy),
    )


def _seconds(value: float) -> str:
    return f"{value:g} s"


# -- findings ----------------------------------------------------------------------------------

_Check = Callable[[ToolSpec, float | None], Finding | None]


def _findings(tool: ToolSpec, deadline: float | None) -> list[Finding]:
    found = (check(tool, deadline) for check in _CHECKS)
    return [finding for finding in found if finding is not None]


def _undeclared_cancel(tool: ToolSpec, deadline: float | None) -> Finding | None:
    if tool.policy.cancel is not None:
        return None
    return Finding(
        tool.name,
        FindingCode.UNDECLARED_CANCEL,
        f"tool {tool.name!r} declares no cancel=: a cancel mid-call lets it run on for up to "
        f"{_seconds(tool.policy.grace)}, and past that its outcome is unknown",
        'declare cancel="interruptible", "finish" or "rollback" in @haltwise.tool',
    )


def _undeclared_effect(tool: ToolSpec, deadline: float | None) -> Finding | None:
    if tool.policy.effect_declared:
        return None
    return Finding(
        tool.name,
        FindingCode.UNDECLARED_EFFECT,
        f"tool {tool.name!r} declares no effect=: it is assumed to be 'external', so retry "
        "advice after a cancel is as cautious as it can be",
        'declare effect="none", "read", "write" or "external" in @haltwise.tool',
    )


def _rollback_without_compensate(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if policy.cancel is not CancelPolicy.ROLLBACK or policy.compensate is not None:
        return None
    return Finding(
        tool.name,
        FindingCode.ROLLBACK_WITHOUT_COMPENSATE,
        f"tool {tool.name!r} is cancel='rollback' but has no compensate=: nothing can undo an "
        "interrupted call",
        "pass compensate=, a function taking the tool's arguments that undoes the call",
    )


def _interruptible_side_effect(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if policy.cancel is not CancelPolicy.INTERRUPTIBLE:
        return None
    if not policy.effect.repeats_harm or policy.idempotent:
        return None
    return Finding(
        tool.name,
        FindingCode.INTERRUPTIBLE_SIDE_EFFECT,
        f"tool {tool.name!r} is interruptible but has effect {policy.effect.value!r}: a call "
        "stopped half way may have done part of it, and a resume runs it again",
        'use cancel="finish" or cancel="rollback" with compensate=, or make it idempotent '
        "with haltwise.idempotency_key() and declare idempotent=True",
    )


def _finish_unbounded_external(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if policy.cancel is not CancelPolicy.FINISH or policy.effect is not Effect.EXTERNAL:
        return None
    if policy.idempotent or policy.grace_declared:
        return None
    return Finding(
        tool.name,
        FindingCode.FINISH_UNBOUNDED_EXTERNAL,
        f"tool {tool.name!r} finishes a non-idempotent external call on cancel with no declared "
        f"grace: a call slower than the default {_seconds(policy.grace)} is left unknown and "
        "resume refuses until someone checks",
        "declare grace= as the call's real upper bound (with a client timeout within it), "
        "or make it idempotent",
    )


def _grace_exceeds_deadline(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if deadline is None or policy.cancel is CancelPolicy.INTERRUPTIBLE:
        return None
    if policy.grace <= deadline:
        return None
    return Finding(
        tool.name,
        FindingCode.GRACE_EXCEEDS_DEADLINE,
        f"tool {tool.name!r} may run on for {_seconds(policy.grace)} after a cancel, longer "
        f"than the {_seconds(deadline)} deadline: a run can end that much past its deadline",
        f"declare a grace= of at most {_seconds(deadline)}, or allow a longer deadline",
    )


def _retries_repeat_effect(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if not policy.retries or policy.effect is not Effect.EXTERNAL or policy.idempotent:
        return None
    return Finding(
        tool.name,
        FindingCode.RETRIES_REPEAT_EFFECT,
        f"tool {tool.name!r} retries failed calls (retries={policy.retries}) but is external and "
        "not idempotent: an attempt that failed after its effect happened (a timeout, a lost "
        "answer) runs again, and the effect happens again",
        "hand haltwise.idempotency_key() (the same in every attempt) to the API and declare "
        "idempotent=True, or drop retries=",
    )


def _no_reconcile(tool: ToolSpec, deadline: float | None) -> Finding | None:
    policy = tool.policy
    if policy.cancel is not CancelPolicy.FINISH or policy.reconcile is not None:
        return None
    if not policy.effect.repeats_harm or policy.idempotent:
        return None
    return Finding(
        tool.name,
        FindingCode.NO_RECONCILE,
        f"tool {tool.name!r} finishes a non-idempotent {policy.effect.value!r} call on cancel "
        "and has no reconcile= hook: a forced cancel or a crash mid-call leaves it unknown, "
        "and a person must say what happened before the run can resume",
        "pass reconcile=, a function taking the tool's arguments that asks the world (by "
        "haltwise.idempotency_key()) and returns haltwise.Happened(result), "
        "haltwise.NotHappened() or None",
    )


_CHECKS: tuple[_Check, ...] = (
    _undeclared_cancel,
    _undeclared_effect,
    _rollback_without_compensate,
    _interruptible_side_effect,
    _finish_unbounded_external,
    _grace_exceeds_deadline,
    _retries_repeat_effect,
    _no_reconcile,
)


# -- markdown ----------------------------------------------------------------------------------

_MD_COLUMNS = (
    "tool",
    "cancel",
    "effect",
    "idempotent",
    "grace",
    "compensate",
    "a cancel mid-call leaves",
)


def _markdown(report: AuditReport) -> str:
    lines = ["## Tool cancel policies", "", *_md_table(_MD_COLUMNS, map(_md_tool, report.tools))]
    lines += ["", "## Findings", ""]
    if report.findings:
        columns = ("tool", "code", "problem", "fix")
        lines += _md_table(columns, map(_md_finding, report.findings))
    else:
        lines.append("No findings.")
    return "\n".join(lines) + "\n"


def _md_table(columns: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    header = _md_line(columns)
    rule = _md_line(tuple("---" for _ in columns))
    return [header, rule, *(_md_line(row) for row in rows)]


def _md_line(cells: tuple[str, ...]) -> str:
    escaped = (cell.replace("|", "\\|").replace("\n", " ") for cell in cells)
    return "| " + " | ".join(escaped) + " |"


def _md_tool(row: ToolRow) -> tuple[str, ...]:
    return (
        f"`{row.name}`",
        row.cancel or "**undeclared**",
        row.effect if row.effect_declared else f"{row.effect} (assumed)",
        "yes" if row.idempotent else "no",
        _grace_cell(row),
        f"`{row.compensate}`" if row.compensate else "",
        row.leaves,
    )


def _grace_cell(row: ToolRow) -> str:
    if row.cancel == CancelPolicy.INTERRUPTIBLE.value:
        return "not used"  # an interrupted call is not waited for
    return _seconds(row.grace) if row.grace_declared else f"{_seconds(row.grace)} (default)"


def _md_finding(finding: Finding) -> tuple[str, ...]:
    return (f"`{finding.tool}`", f"`{finding.code.value}`", finding.message, finding.fix)


# -- rich --------------------------------------------------------------------------------------


#: Below this many columns the policy table would crop its last column to a letter a line
#: (issue 29, item 5): each tool is then a block of lines instead.
_TABLE_WIDTH = 120


def _rich_cells(row: ToolRow) -> list[Any]:
    from rich.text import Text

    cells = [Text(cell) for cell in _md_tool(row)]
    cells[0] = Text(row.name, style="bold")
    cells[5] = Text(row.compensate or "")
    if not row.declared:
        cells[1] = Text("undeclared", style="bold yellow")
    return cells


def _render_narrow(report: AuditReport, console: Console) -> None:
    """The policy table for a narrow terminal: per tool, a line with its policy, then what a
    cancel mid-call leaves, indented (every column of the table, none cropped)."""
    from rich.text import Text

    console.print(Text("Tool cancel policies", style="italic"))
    for row in report.tools:
        cells = _rich_cells(row)
        line = Text.assemble(
            cells[0],
            "  ",
            cells[1],
            ", ",
            cells[2],
            ", idempotent" if row.idempotent else ", not idempotent",
            f", grace {_md_tool(row)[4]}",
            *((", compensate ", cells[5]) if row.compensate else ()),
        )
        console.print(line)
        console.print(Text(f"  a cancel mid-call leaves: {_md_tool(row)[6]}"))


def _render_rich(report: AuditReport, console: Console) -> None:
    # Imported here so that importing haltwise (and auditing as data) does not load rich.
    from rich.table import Table
    from rich.text import Text

    if console.width < _TABLE_WIDTH:
        _render_narrow(report, console)
    else:
        tools = Table(title="Tool cancel policies", title_justify="left")
        # The tool column asks for its longest name (up to 24), so that a name is not cut in
        # two; the other columns fold as they must.
        longest = max((len(row.name) for row in report.tools), default=0)
        for column in _MD_COLUMNS:
            width = min(longest, 24) if column == "tool" else None
            tools.add_column(column, overflow="fold", min_width=width or None)
        for row in report.tools:
            tools.add_row(*_rich_cells(row))
        console.print(tools)
    if not report.findings:
        console.print(Text("No findings.", style="green"))
        return
    findings = Table(title="Findings", title_justify="left")
    for column in ("tool", "code", "problem", "fix"):
        findings.add_column(column, overflow="fold", no_wrap=column in ("tool", "code"))
    for finding in report.findings:
        findings.add_row(
            Text(finding.tool, style="bold"),
            Text(finding.code.value, style="yellow"),
            Text(finding.message),
            Text(finding.fix),
        )
    console.print(findings)
