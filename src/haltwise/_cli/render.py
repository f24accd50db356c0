"""What the command line shows a person: outcome summaries, run lists and the live view.

The only module that knows ``rich``. Everything printed here is for people; ``--json`` output
does not come through here. User data (tool names, partial results, error texts) is always
printed literally, never read as rich markup. When stdout is not a terminal, rich prints no
colour and :attr:`Screen.interactive` is false, so the command line shows no live view.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, final

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.segment import Segment
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from .._core.budget import BUDGET_REASON, Spent
from .._core.outcome import Outcome, StepRecord
from .._core.policy import CancelPolicy
from .._core.records import RunSnapshot
from .._core.states import State, StepStatus
from .._core.views import RunSummary, StepWait
from .._runtime.explain import budget_words, retry_words, spent_words, waiting_for
from .text import escape_controls

if TYPE_CHECKING:
    from .. import CheckReport
    from .._analysis.audit import AuditReport

__all__ = [
    "LiveView",
    "Screen",
    "cancelling_line",
    "explore_progress",
    "pause_line",
    "retry_words",
]

#: How a partial result longer than this is cut in human output (the JSON keeps it whole).
_PARTIAL_WIDTH = 200
#: The live view shows the latest steps and partial results only, so that it fits a terminal.
_LIVE_STEPS = 12
_LIVE_PARTIALS = 5

_STATE_STYLE = {
    State.COMPLETED: "bold green",
    State.FAILED: "bold red",
    State.CANCELLED: "bold yellow",
    State.CANCELLING: "yellow",
    State.PAUSED: "bold cyan",
}
_STATUS_STYLE = {
    StepStatus.COMMITTED: "green",
    StepStatus.FAILED: "red",
    StepStatus.UNKNOWN: "bold red",
    StepStatus.INTERRUPTED: "yellow",
    StepStatus.COMPENSATED: "yellow",
}


def cancelling_line(state: State, forced: bool, waits: Sequence[StepWait]) -> str | None:
    """What a ``cancelling`` run is waiting for, in words; ``None`` if the run is not cancelling.

    With a ``finish`` (or undeclared) step in flight: ``"cancelling: waiting for send_email
    (finish, grace 30s), 12s left"``. The grace is known only when the tool is loaded in this
    process, what is left of it only when the cancel's time is at hand.
    """
    if state is not State.CANCELLING:
        return None
    if forced:
        return "cancelling (forced): stopping now"
    if not waits:
        return "cancelling: stopping at the next checkpoint"
    return "cancelling: " + "; ".join(_wait_words(wait) for wait in waits)


def _wait_words(wait: StepWait) -> str:
    grace = "" if wait.grace is None else f", grace {wait.grace:g}s"
    left = "" if wait.grace_left is None else f", {wait.grace_left:.0f}s left"
    match wait.policy:
        case CancelPolicy.INTERRUPTIBLE.value:
            return f"interrupting {wait.tool}"
        case CancelPolicy.ROLLBACK.value:
            return f"undoing {wait.tool} (rollback{grace}){left}"
        case CancelPolicy.FINISH.value:
            return f"waiting for {wait.tool} (finish{grace}){left}"
        case _:
            return f"waiting for {wait.tool} (undeclared, so finish{grace}){left}"


def pause_line(snapshot: RunSnapshot) -> str | None:
    """What a pause does to the run now, in words; ``None`` if no pause is in effect or asked.

    ``"paused: waiting at a checkpoint; haltwise unpause ID continues it (resume does too)"``, or
    for a run still ``running`` with a pause requested, which steps it lets end first.
    """
    run = snapshot.run
    if run.state is State.PAUSED:
        waiting = [step.index for step in snapshot.steps if step.status is StepStatus.RUNNING]
        children = "".join(f"; child run {run.id}/{index} paused with it" for index in waiting)
        return (
            f"paused: waiting at a checkpoint; 'haltwise unpause {run.id}' continues it "
            f"(resume does the same){children}"
        )
    if not run.pause or run.state.is_final:
        return None
    in_flight = [step.tool for step in snapshot.steps if step.status is StepStatus.RUNNING]
    if not in_flight:
        return "pause requested: pausing at the next checkpoint"
    return f"pause requested: letting {', '.join(in_flight)} end first, then pausing"


def snapshot_waits(snapshot: RunSnapshot) -> tuple[StepWait, ...]:
    """The waits of a snapshot (no times at hand: no grace left)."""
    return waiting_for(
        snapshot.steps, {}, requested_at=None, forced=snapshot.run.force, now=time.time()
    )


#: A width outside this range (``COLUMNS=0``, ``COLUMNS=banana``) is ignored: rich would print
#: nothing at width 0, and build lines of that many spaces at a huge one.
_WIDTHS = range(20, 1001)
#: The width used when neither the terminal nor ``COLUMNS`` gives a usable one.
_DEFAULT_WIDTH = 80


class _SafeConsole(Console):
    """A rich console that writes no control character it did not make itself.

    Every text segment is escaped on its way out (rich's own cursor and style codes are control
    segments and styles, not text), so nothing printed can drive the terminal, whichever
    renderable carried it.
    """

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            Segment(escape_controls(segment.text), segment.style, segment.control)
            if segment.control is None
            else segment
            for segment in buffer
        )


#: The width for a pipe or a file (no terminal, no ``COLUMNS``): wide enough that a row of
#: ``list`` (a 32-character id, a task name, a reason) or of ``audit`` stays on one line, as a
#: log or a ``grep`` wants it; rich's 80 folded ids and task names mid-word.
_PIPE_WIDTH = 200


def console_width() -> int | None:
    """The width to render at: ``$COLUMNS`` or the terminal's, unless that is unusable; for a
    pipe, :data:`_PIPE_WIDTH`."""
    columns = os.environ.get("COLUMNS")
    if columns is None:
        try:
            piped = not os.isatty(sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            piped = True
        return _PIPE_WIDTH if piped else None  # a terminal: rich asks it
    try:
        width = int(columns)
    except ValueError:
        width = 0
    if width in _WIDTHS:
        return width
    try:
        width = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        width = 0
    return width if width in _WIDTHS else _DEFAULT_WIDTH


@final
class Screen:
    """Human output on stdout, through one rich console (colour only on a terminal).

    Nothing it prints can drive the terminal: control characters in the data are escaped.
    """

    def __init__(self) -> None:
        self.console = _SafeConsole(highlight=False, width=console_width())

    @property
    def interactive(self) -> bool:
        """True if stdout is a terminal: only then is a live view shown."""
        return self.console.is_terminal

    def note(self, text: str) -> None:
        """One plain line of text (not wrapped: a path in it stays whole)."""
        self.console.print(Text(text), soft_wrap=True)

    def outcome(self, outcome: Outcome, *, notes: Sequence[str | None] = ()) -> None:
        """The summary of a run: state, reason, result or error, steps, partials, retry advice.

        ``notes`` are lines shown under the state, ``None`` entries skipped (``status`` says
        there who holds an active run and what a cancelling run waits for).
        """
        for part in _summary(outcome, [note for note in notes if note]):
            # A line of text is not wrapped by rich (a path or an id in it stays whole, for
            # copying); the terminal wraps it. Tables fit the width.
            self.console.print(part, soft_wrap=isinstance(part, Text))

    def findings(self, report: CheckReport) -> None:
        """``check``: one line when the store is sound, else a table of the findings."""
        if report.ok:
            self.note(f"sound: {report.runs} runs, no findings")
            return
        table = Table(title=f"{len(report.findings)} findings in {report.runs} runs", box=None)
        for column in ("run", "code", "message"):
            table.add_column(column)
        for finding in report.findings:
            table.add_row(finding.run, finding.code, finding.message)
        self.console.print(table)

    def runs(self, runs: Sequence[RunSummary]) -> None:
        """A table of runs (``list``): id, task, state, reason, retry, what it spent."""
        if not runs:
            self.note("no runs")
            return
        table = Table(box=None, pad_edge=False)
        # ids and task names are never cut mid-word (they are copied into the next command):
        # they ask for their longest, up to a limit; the reason and the spend fold to what is left
        for column, limit in (
            ("id", 40),
            ("task", 32),
            ("state", 10),
            ("reason", 0),
            ("retry", 8),
            ("spent", 0),
        ):
            longest = max((len(_column_text(run, column)) for run in runs), default=0)
            table.add_column(
                column, overflow="fold", min_width=min(longest, limit) or None, ratio=None
            )
        for run in runs:
            table.add_row(
                Text(run.id),
                Text(run.task),
                _state_text(run.state),
                Text(run.reason or ""),
                Text(run.retry.value if run.state.is_final else ""),
                Text(spent_words(run.spent)),
            )
        self.console.print(table)

    def audit(self, report: AuditReport) -> None:
        """The audit report's policy table and findings."""
        report.render_rich(self.console)

    @contextmanager
    def live(self) -> Iterator[LiveView]:
        """A live view of one run while it works; shows nothing unless :attr:`interactive`."""
        view = LiveView()
        if not self.interactive:
            yield view
            return
        with Live(Text(""), console=self.console, refresh_per_second=10, transient=True) as live:
            view.attach(live)
            yield view


@contextmanager
def explore_progress() -> Iterator[Callable[[int, int, str], None]]:
    """What ``explore`` shows while it works, on stderr: rich's progress bar on a terminal,
    else a line per scenario (``explore: 3/25 cancel before step 1 (search)``), so a CI log
    shows it moving."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    if not sys.stderr.isatty():

        def line(done: int, total: int, what: str) -> None:
            print(f"explore: {done}/{total} {escape_controls(what)}", file=sys.stderr, flush=True)

        yield line
        return
    columns = (
        TextColumn("explore"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}", markup=False),
    )
    with Progress(*columns, console=_SafeConsole(stderr=True), transient=True) as bar:
        job = bar.add_task("the uninterrupted run", total=None)

        def tick(done: int, total: int, what: str) -> None:
            bar.update(job, completed=done, total=total, description=escape_controls(what))

        yield tick


def _column_text(run: RunSummary, column: str) -> str:
    """The text of ``run``'s cell in ``list``'s ``column``."""
    if column == "id":
        return run.id
    if column == "task":
        return run.task
    if column == "state":
        return run.state.value
    if column == "retry":
        return run.retry.value if run.state.is_final else ""
    if column == "spent":
        return spent_words(run.spent)
    return run.reason or ""


@final
class LiveView:
    """The live lines of a run: one per step (spinner while running), partials, cancel waits."""

    def __init__(self) -> None:
        self._live: Live | None = None
        self._spinners: dict[int, Spinner] = {}

    def attach(self, live: Live) -> None:
        self._live = live

    def show(self, snapshot: RunSnapshot) -> None:
        """Redraw from ``snapshot`` (does nothing when no live view is attached)."""
        if self._live is not None:
            self._live.update(self._render(snapshot))

    def _render(self, snapshot: RunSnapshot) -> RenderableType:
        run = snapshot.run
        parts: list[RenderableType] = [
            Text.assemble(("run ", "dim"), run.id, "  ", run.task, "  ", _state_text(run.state))
        ]
        steps, partials = snapshot.steps, snapshot.partials
        if len(steps) > _LIVE_STEPS:
            parts.append(Text(f"  ... {len(steps) - _LIVE_STEPS} earlier steps", style="dim"))
        parts.extend(self._step_line(step) for step in steps[-_LIVE_STEPS:])
        if len(partials) > _LIVE_PARTIALS:
            parts.append(Text(f"  ... {len(partials) - _LIVE_PARTIALS} earlier partials", "dim"))
        for value in partials[-_LIVE_PARTIALS:]:
            parts.append(Text.assemble(("  partial ", "dim"), _partial_text(value)))
        waits = snapshot_waits(snapshot)
        for waiting in (cancelling_line(run.state, run.force, waits), pause_line(snapshot)):
            if waiting is not None:
                parts.append(Text(waiting, style="yellow"))
        return Group(*parts)

    def _step_line(self, step: StepRecord) -> RenderableType:
        # A running step's line starts with a spinner; the others are indented to match it.
        line = Text.assemble(f"{step.index:>3} ", (step.tool, "bold"), f"  {_policy_words(step)}  ")
        if step.status is StepStatus.RUNNING:
            spinner = self._spinners.setdefault(step.index, Spinner("dots", style="cyan"))
            spinner.text = line
            return spinner
        line.append(step.status.value, style=_STATUS_STYLE.get(step.status, ""))
        return Text("  ") + line


def _summary(outcome: Outcome, notes: Sequence[str]) -> Iterator[RenderableType]:
    head = Text.assemble(("run ", "dim"), outcome.id, "  ", outcome.task)
    yield head
    state = Text.assemble("state: ", _state_text(outcome.state))
    if outcome.reason:
        state.append(f" (reason: {outcome.reason})")
    yield state
    for note in notes:
        yield Text(note)
    if outcome.state is State.COMPLETED:
        yield Text.assemble("result: ", _partial_text(outcome.result))
    if outcome.error is not None:
        yield Text(f"error: {outcome.error.type}: {outcome.error.message}", style="red")
    if outcome.cancel_error is not None:
        error = outcome.cancel_error
        yield Text(f"raised while cancelling: {error.type}: {error.message}")
    yield _steps_table(outcome.steps) if outcome.steps else Text("steps: none")
    for step in outcome.steps:
        if step.status is StepStatus.FAILED and step.error is not None:
            failed = f"step {step.index} ({step.tool}) failed: {step.error.type}: "
            yield Text(failed + step.error.message, style="red")
    if outcome.partials:
        yield Text(f"partials ({len(outcome.partials)}):")
        for value in outcome.partials:
            yield Text.assemble("  ", _partial_text(value))
    yield Text.assemble(("budget: ", "bold"), budget_words(outcome.budget, Spent.of(outcome.steps)))
    if outcome.state is State.PAUSED and outcome.reason == BUDGET_REASON:
        raise_it = f"haltwise unpause {outcome.id} --budget usd=N,tokens=N,tool_calls=N"
        yield Text(f"paused for its budget: raise it with '{raise_it}'")
    if outcome.state.is_final:
        yield Text.assemble(("retry: ", "bold"), retry_words(outcome))
    elif outcome.state is State.PAUSED:
        advice = f"resume: unpause it (haltwise unpause {outcome.id})"
        yield Text.assemble(("retry: ", "bold"), advice)
    else:
        yield Text("retry: the run is still active")


#: The most the tool column asks for so that a name is not cut in two.
_UNBROKEN = 22
#: The widest the other columns get: their values wrap at spaces ("external,/idempotent").
_STEP_WIDTHS = {"policy": 13, "effect": 10, "status": 11, "attempts": 8}


def _steps_table(steps: Sequence[StepRecord]) -> Table:
    """The steps of a run, compact enough that at 80 columns a tool name up to ~22 characters is
    never cut in two (it was: "send_ema/il")."""
    table = Table(title="steps", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    longest = max(len(step.tool) for step in steps)
    for column in ("#", "tool", "policy", "effect", "status", "attempts"):
        table.add_column(
            column,
            overflow="fold",
            justify="right" if column == "#" else "left",
            min_width=min(longest, _UNBROKEN) if column == "tool" else None,
            max_width=_STEP_WIDTHS.get(column),
        )
    for step in steps:
        table.add_row(
            str(step.index),
            Text(step.tool),
            _policy_words(step),
            step.effect.value + (", idempotent" if step.idempotent else ""),
            Text(step.status.value, style=_STATUS_STYLE.get(step.status, "")),
            str(step.attempts),
        )
    return table


def _policy_words(step: StepRecord) -> str:
    return step.cancel if step.cancel else "undeclared (finish)"


def _state_text(state: State) -> Text:
    return Text(state.value, style=_STATE_STYLE.get(state, ""))


def _partial_text(value: Any) -> Text:
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > _PARTIAL_WIDTH:
        text = text[: _PARTIAL_WIDTH - 1] + "…"
    return Text(text)
