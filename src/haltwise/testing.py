"""Check that a task survives being stopped anywhere: the cancel explorer and its recorder.

Use it in your own test suite::

    from haltwise.testing import explore, record_effect

    def test_research_survives_any_cancel(tmp_path):
        report = explore(research, "cats", reset=lambda: clear_fake_world(tmp_path))
        assert report.ok, report.explain()

:func:`explore` runs the task once uninterrupted (the *baseline*) and notes its cancel points:
before, during and after every step. Then, for every point, twice (a plain cancel and a forced
one), it starts the task afresh in a scratch store, cancels it exactly there, and resumes it as
its retry advice allows until it completes. Tools run for real, so give ``reset`` to put your
fake world back before every run. The invariants checked at every point:

* the cancel ends the run ``cancelled`` (never ``failed``, unless the baseline failed), starts
  no step after the point, and keeps partial results that are a prefix of the baseline's;
* a ``compensated`` step left no effect behind (its compensation really undid it);
* a ``restart`` advice is safe: no effect that happened is still there to be repeated;
* after resuming: the same final state and result, and the same partial results, as the
  baseline; a committed step's body never ran again; every step kept one idempotency key;
  every step made its effects as many times as in the baseline, and an ``idempotent=True``
  step never made one twice for one key; a task that asks for another tool on resume is
  reported as not deterministic.

Effects are invisible from outside, so the toolkit reports them with :func:`record_effect`
(a no-op outside the explorer); tool executions are counted automatically (every tool's function
is wrapped while :func:`explore` runs, and put back afterwards). Cancel points are the probe
points of steps; ``await haltwise.checkpoint()`` in the task's own code is not a point.
"""

from __future__ import annotations

import functools
import inspect
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, final

import anyio

from ._analysis.explore_checks import (
    Baseline,
    PauseTrial,
    Point,
    Trial,
    after_cancel,
    after_pause,
    after_resume,
    effect_counts,
)
from ._analysis.recorder import EffectRecord as EffectRecord
from ._analysis.recorder import Execution as Execution
from ._analysis.recorder import Recorder as Recorder
from ._analysis.recorder import record_effect as record_effect
from ._analysis.recorder import tagged
from ._core.exceptions import HaltwiseError, InputError
from ._core.outcome import Outcome, Retry
from ._core.records import RunSnapshot
from ._core.states import State, StepStatus
from ._runtime import lowlevel
from ._runtime.run_context import SHIELDED, current_run
from ._runtime.runtime import Runtime
from ._runtime.tool import Task

__all__ = [
    "EffectRecord",
    "Execution",
    "ExploreReport",
    "PointReport",
    "Recorder",
    "explore",
    "explore_async",
    "record_effect",
]

#: Seconds one attempt (a start or a resume) may take before the explorer forces a cancel.
ATTEMPT_TIMEOUT = 60.0
#: How many times a cancelled run is resumed before the explorer gives up on it completing.
MAX_RESUMES = 3
#: Seconds to wait for abandoned plain-function tool bodies to end before judging a run.
SETTLE_TIMEOUT = 5.0

Reset = Callable[[], object] | Callable[[], Awaitable[object]]


@final
@dataclass(frozen=True, slots=True)
class PointReport:
    """The cancel at one point: the state and advice it left, and what broke.

    ``at`` names the point (``"during step 2 (charge)"``); ``force`` says whether the cancel was
    forced; ``state`` and ``retry`` are the run's right after the cancel; ``final_state`` is the
    run's after the explorer resumed it (``None`` if it could not). Each violation is a
    sentence naming the point, the step and the tool.
    """

    at: str
    force: bool
    state: State
    retry: Retry
    violations: tuple[str, ...]
    final_state: State | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "force": self.force,
            "state": self.state.value,
            "retry": self.retry.value,
            "violations": list(self.violations),
        }


@final
@dataclass(frozen=True, slots=True)
class ExploreReport:
    """What :func:`explore` found: the baseline outcome and one report per cancel point.

    ``ok`` is true when no invariant broke at any point. A baseline that did not complete is
    not itself a violation (the explorer checks cancellation, not the task); :meth:`explain`
    says so.
    """

    task: str
    baseline: Outcome
    points: tuple[PointReport, ...]
    #: with ``pauses=True``: one report per point for a pause there, then unpause (``state`` is
    #: the run's while it waited, ``paused`` unless the pause never took effect)
    pauses: tuple[PointReport, ...] | None = None

    @property
    def ok(self) -> bool:
        return all(point.ok for point in (*self.points, *(self.pauses or ())))

    @property
    def violations(self) -> tuple[str, ...]:
        """Every violation at every point (cancels, then pauses), in the order of the points."""
        return tuple(v for point in (*self.points, *(self.pauses or ())) for v in point.violations)

    def to_json(self) -> dict[str, Any]:
        """The ``haltwise explore --json`` object: ``{"ok", "points": [...]}``, and
        ``"pauses": [...]`` (the same shape) when pauses were explored."""
        data: dict[str, Any] = {"ok": self.ok, "points": [p.to_json() for p in self.points]}
        if self.pauses is not None:
            data["pauses"] = [point.to_json() for point in self.pauses]
        return data

    def explain(self) -> str:
        """A plain-text table of every cancel point, then every violation in full."""
        rows = (
            [("AT", "FORCE", "STATE", "RETRY", "CHECK")]
            + [
                (
                    p.at,
                    "yes" if p.force else "no",
                    p.state.value,
                    p.retry.value,
                    "ok" if p.ok else f"{len(p.violations)} violation(s)",
                )
                for p in self.points
            ]
            + [
                (f"pause {p.at}", "-", p.state.value, p.retry.value, _check_words(p))
                for p in self.pauses or ()
            ]
        )
        widths = [max(len(row[column]) for row in rows) for column in range(5)]
        lines = [self.headline(), ""]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
        lines.append("")
        if self.ok:
            lines.append("All invariants hold.")
        else:
            lines.append(f"{len(self.violations)} violation(s):")
            lines += [f"  - {violation}" for violation in self.violations]
        return "\n".join(line.rstrip() for line in lines)

    def headline(self) -> str:
        """One line: the task, how many cancels were tried, and how the baseline ended."""
        baseline = self.baseline.state.value
        if self.baseline.error is not None:
            baseline += f" ({self.baseline.error.type}: {self.baseline.error.message})"
        return (
            f"explored {self.task}: {len(self.points)} cancels at "
            f"{len({p.at for p in self.points})} points; the uninterrupted run {baseline}"
        )


def _check_words(point: PointReport) -> str:
    return "ok" if point.ok else f"{len(point.violations)} violation(s)"


def explore(
    task: Task[..., Any],
    /,
    *args: Any,
    store_dir: str | Path | None = None,
    reset: Reset | None = None,
    recorder: Recorder | None = None,
    pauses: bool = False,
    **kwargs: Any,
) -> ExploreReport:
    """Explore every cancel point of ``task(*args, **kwargs)``; blocking (runs its own loop).

    See the module docstring for what is checked. ``store_dir`` is where the scratch stores go
    (a new subdirectory of it, kept afterwards); by default a temporary directory that is
    removed. ``reset`` is called (and awaited, if it returns an awaitable) before every run, to
    put the tools' world back as it was. ``recorder`` lets you inspect what was counted
    afterwards. ``pauses=True`` also pauses the task at every point, unpauses it, and checks
    that nothing was in flight while it was paused and that nothing was lost or repeated
    (:attr:`ExploreReport.pauses`). A task argument named like one of these options must go through
    :func:`explore_async`. Cannot be called from a running event loop: await
    :func:`explore_async` there. Raises :class:`~haltwise.InputError` if the arguments do not
    fit the task, :class:`~haltwise.HaltwiseError` if the uninterrupted run does not end.
    """
    run = functools.partial(
        explore_async,
        task,
        args,
        kwargs,
        store_dir=store_dir,
        reset=reset,
        recorder=recorder,
        pauses=pauses,
    )
    return anyio.run(run)


async def explore_async(
    task: Task[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    store_dir: str | Path | None = None,
    reset: Reset | None = None,
    recorder: Recorder | None = None,
    name: str | None = None,
    pauses: bool = False,
    progress: Progress | None = None,
) -> ExploreReport:
    """:func:`explore` for async code, with the task's arguments as ``args`` and ``kwargs``.

    Runs the scenarios one after another in the calling event loop (asyncio). While it runs,
    every tool's function is wrapped by ``recorder`` (another recorder watching at the same
    time raises :class:`~haltwise.HaltwiseError`). ``name`` is how the report names the task
    (the command line passes ``FILE.py:TASK``); by default the task's own name.
    ``progress(done, total, what)`` is called after the uninterrupted run (``done`` 1) and after
    each scenario, ``what`` naming it (``haltwise explore`` shows a progress bar with it).
    """
    if not isinstance(task, Task):
        raise InputError(f"{task!r} is not a @haltwise.task")
    call_args, call_kwargs = tuple(args), dict(kwargs or {})
    task.bind_inputs(call_args, call_kwargs)
    watcher = recorder if recorder is not None else Recorder()
    with _scratch(store_dir) as root, watcher.watching():
        explorer = _Explorer(task, call_args, call_kwargs, root, reset, watcher)
        explorer.progress = progress
        return await explorer.explore(name or task.name, pauses=pauses)


@contextmanager
def _scratch(store_dir: str | Path | None) -> Iterator[Path]:
    if store_dir is None:
        with tempfile.TemporaryDirectory(prefix="haltwise-explore-") as temporary:
            yield Path(temporary)
        return
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    yield Path(tempfile.mkdtemp(prefix="explore-", dir=store_dir))


@dataclass(eq=False)
class _Probe:
    """The runtime's probe: notes every cancel point, and cancels at ``target`` if one is set."""

    runtime: Runtime
    run_id: str
    target: tuple[str, int] | None = None
    force: bool = False
    fired: bool = False
    #: what to do at ``target``: ``"cancel"`` or ``"pause"``
    verb: str = "cancel"

    def __post_init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.shielded: set[int] = set()

    async def __call__(self, kind: str, index: int) -> None:
        self.seen.append((kind, index))
        if current_run() is not None and SHIELDED.get():
            self.shielded.add(index)
        if self.fired or (kind, index) != self.target:
            return
        self.fired = True
        if self.verb == "pause":
            await self.runtime.pause(self.run_id)
        else:
            await self.runtime.cancel(self.run_id, reason="explore", force=self.force)


#: ``progress(done, total, what)`` of :func:`explore_async`
Progress = Callable[[int, int, str], None]


class _Explorer:
    """Drives the baseline and one trial per cancel point, each in its own scratch store."""

    def __init__(
        self,
        task: Task[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        root: Path,
        reset: Reset | None,
        recorder: Recorder,
    ) -> None:
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.root = root
        self.reset = reset
        self.recorder = recorder

    progress: Progress | None = None

    def _tick(self, done: list[int], total: int, what: str) -> None:
        done[0] += 1
        if self.progress is not None:
            self.progress(done[0], total, what)

    async def explore(self, name: str, *, pauses: bool = False) -> ExploreReport:
        baseline = await self._baseline()
        count = len(baseline.points)
        total = 1 + 2 * count + (count if pauses else 0)
        done = [0]
        self._tick(done, total, "the uninterrupted run")
        points = []
        for number, point in enumerate(baseline.points):
            for force in (False, True):
                points.append(await self._trial(number, point, force, baseline))
                self._tick(done, total, f"cancel {point.label}{' (force)' if force else ''}")
        paused = None
        if pauses:
            pause_reports = []
            for number, point in enumerate(baseline.points):
                pause_reports.append(await self._pause_trial(number, point, baseline))
                self._tick(done, total, f"pause {point.label}")
            paused = tuple(pause_reports)
        return ExploreReport(
            task=name, baseline=baseline.outcome, points=tuple(points), pauses=paused
        )

    async def _pause_trial(self, number: int, point: Point, baseline: Baseline) -> PointReport:
        run_id = f"explore-{number:03d}-pause"
        await self._reset()
        async with self._runtime(run_id) as rt:
            probe = _Probe(rt, run_id, (point.kind, point.index), verb="pause")
            with tagged(run_id, 0):
                await lowlevel.launch(
                    rt, self.task, self.args, self.kwargs, task_id=run_id, probe=probe
                )
            paused = await _paused(rt, run_id)
            await rt.unpause(run_id)
            final, timed_out = await self._settled(rt, run_id)
        trial = PauseTrial(point, run_id, paused, final)
        found = after_pause(trial, baseline, self.recorder)
        if timed_out:
            found.append(f"the run did not end within {ATTEMPT_TIMEOUT:g} s of the unpause")
        state = paused.run.state if paused is not None else final.state
        return PointReport(
            at=point.label,
            force=False,
            state=state,
            retry=paused.outcome().retry if paused is not None else final.retry,
            violations=tuple(f"{trial.where}: {sentence}" for sentence in found),
            final_state=final.state,
        )

    async def _baseline(self) -> Baseline:
        run_id = "explore-baseline"
        await self._reset()
        async with self._runtime(run_id) as rt:
            probe = _Probe(rt, run_id)
            with tagged(run_id, 0):
                await lowlevel.launch(
                    rt, self.task, self.args, self.kwargs, task_id=run_id, probe=probe
                )
            outcome, timed_out = await self._settled(rt, run_id)
        if timed_out:
            raise HaltwiseError(
                f"the uninterrupted run of {self.task.name} did not end within "
                f"{ATTEMPT_TIMEOUT:g} s"
            )
        tools = {step.index: step.tool for step in outcome.steps}
        points = tuple(Point(kind, index, tools.get(index, "?")) for kind, index in probe.seen)
        live = self.recorder.live_effects(run_id)
        return Baseline(outcome=outcome, points=points, effects=effect_counts(live))

    async def _trial(
        self, number: int, point: Point, force: bool, baseline: Baseline
    ) -> PointReport:
        trial = Trial(point, force, f"explore-{number:03d}-{'forced' if force else 'plain'}")
        problems: list[str] = []
        await self._reset()
        async with self._runtime(trial.run_id) as rt:
            probe = _Probe(rt, trial.run_id, (point.kind, point.index), force)
            with tagged(trial.run_id, 0):
                await lowlevel.launch(
                    rt, self.task, self.args, self.kwargs, task_id=trial.run_id, probe=probe
                )
            trial.cancelled, timed_out = await self._settled(rt, trial.run_id)
            trial.reached = probe.fired
            trial.shielded = frozenset(probe.shielded)
            if timed_out:
                problems.append(f"the run did not end within {ATTEMPT_TIMEOUT:g} s")
            elif trial.reached:
                await self._resume_all(rt, trial, baseline.outcome, problems)
        found = [
            *after_cancel(trial, baseline, self.recorder),
            *problems,
            *after_resume(trial, baseline, self.recorder),
        ]
        return PointReport(
            at=point.label,
            force=force,
            state=trial.cancelled.state,
            retry=trial.cancelled.retry,
            violations=tuple(f"{trial.where}: {sentence}" for sentence in found),
            final_state=trial.final.state if trial.final is not None else None,
        )

    async def _resume_all(
        self, rt: Runtime, trial: Trial, baseline: Outcome, problems: list[str]
    ) -> None:
        """Resume as the advice allows until the run completes (or ends as the baseline did)."""
        outcome = trial.cancelled
        assert outcome is not None
        for attempt in range(1, MAX_RESUMES + 1):
            if not _needs_resume(outcome, baseline):
                break
            done, again = self._reconcile(trial.run_id, outcome)
            trial.committed_before[attempt] = _committed(outcome) | frozenset(done)
            try:
                with tagged(trial.run_id, attempt):
                    await rt.resume(trial.run_id, assume_done=done, rerun=again, task=self.task)
            except HaltwiseError as error:
                problems.append(f"resume {attempt} was refused: {error}")
                return
            outcome, timed_out = await self._settled(rt, trial.run_id)
            if timed_out:
                problems.append(f"resume {attempt} did not end within {ATTEMPT_TIMEOUT:g} s")
                return
        else:
            if _needs_resume(outcome, baseline):
                problems.append(
                    f"the run did not complete after {MAX_RESUMES} resumes "
                    f"(it is {outcome.state.value})"
                )
        trial.final = outcome

    def _reconcile(self, run_id: str, outcome: Outcome) -> tuple[dict[int, Any], set[int]]:
        """For each ``unknown`` step that blocks a resume: did its body return? Then assume it
        done with that result; otherwise run it again."""
        done: dict[int, Any] = {}
        again: set[int] = set()
        for step in outcome.steps:
            if step.status is not StepStatus.UNKNOWN or step.idempotent:
                continue
            runs = self.recorder.executions_of(run_id, step.index)
            if runs and runs[-1].returned:
                done[step.index] = runs[-1].result
            else:
                again.add(step.index)
        return done, again

    async def _settled(self, rt: Runtime, run_id: str) -> tuple[Outcome, bool]:
        """The run's final outcome, and whether the explorer had to force it to end."""
        with anyio.move_on_after(ATTEMPT_TIMEOUT):
            outcome = await rt.outcome(run_id)
            await self.recorder.quiesce(run_id, timeout=SETTLE_TIMEOUT)
            return outcome, False
        await rt.cancel(run_id, reason="explore timeout", force=True)
        with anyio.move_on_after(ATTEMPT_TIMEOUT):
            return await rt.outcome(run_id), True
        return await rt.status(run_id), True

    async def _reset(self) -> None:
        if self.reset is None:
            return
        result = self.reset()
        if inspect.isawaitable(result):
            await result

    def _runtime(self, run_id: str) -> Runtime:
        return Runtime(f"sqlite:///{self.root / run_id}.db")


async def _paused(rt: Runtime, run_id: str) -> RunSnapshot | None:
    """The journal once the run waits paused; None if it ended (or timed out) first."""
    with anyio.move_on_after(ATTEMPT_TIMEOUT):
        while rt.is_active(run_id):
            if rt.is_paused(run_id):
                return await rt.store.load(run_id)
            await anyio.sleep(0.001)
    return None


def _needs_resume(outcome: Outcome, baseline: Outcome) -> bool:
    if outcome.state is State.COMPLETED:
        return False
    error = outcome.error
    if error is not None and error.type == "NonDeterminismError":
        return False  # it would fail again the same way
    # A run that fails as the baseline did has reached its end too.
    return not (
        error is not None and baseline.error is not None and error.type == baseline.error.type
    )


def _committed(outcome: Outcome) -> frozenset[int]:
    return frozenset(s.index for s in outcome.steps if s.status is StepStatus.COMMITTED)
