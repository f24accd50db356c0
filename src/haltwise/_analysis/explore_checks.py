"""The explorer's invariants: what must hold after a cancel at one point, and after resuming.

Each check reads what the journal says (outcomes) next to what the :class:`Recorder` saw (tool
executions and reported effects) and returns readable sentences, one per broken invariant. The
driver (:mod:`haltwise.testing`) prefixes each with the cancel point. No I/O here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.outcome import Outcome, Retry, StepRecord
from .._core.records import RunSnapshot
from .._core.states import State, StepStatus
from .recorder import EffectRecord, Recorder

__all__ = [
    "Baseline",
    "PauseTrial",
    "Point",
    "Trial",
    "after_cancel",
    "after_pause",
    "after_resume",
    "effect_counts",
]


@dataclass(frozen=True, slots=True)
class Point:
    """A cancel point: ``"before"``, ``"during"`` or ``"after"`` step ``index`` (``tool``)."""

    kind: str
    index: int
    tool: str

    @property
    def label(self) -> str:
        return f"{self.kind} step {self.index} ({self.tool})"


@dataclass(frozen=True, slots=True)
class Baseline:
    """The uninterrupted run: its outcome, its cancel points and its effects per step."""

    outcome: Outcome
    points: tuple[Point, ...]
    #: live effects per (step index, effect name)
    effects: Counter[tuple[int, str]]


@dataclass(slots=True)
class Trial:
    """What happened when the run was cancelled at ``point``; filled in by the driver."""

    point: Point
    force: bool
    run_id: str
    reached: bool = False
    cancelled: Outcome | None = None
    final: Outcome | None = None
    #: attempt number -> the steps that were committed when that resume began
    committed_before: dict[int, frozenset[int]] = field(default_factory=dict)
    #: steps called inside ``haltwise.shield``: they may start after the cancel
    shielded: frozenset[int] = frozenset()

    @property
    def where(self) -> str:
        """The point as the violations name it: ``"forced cancel during step 2 (charge)"``."""
        return f"{'forced cancel' if self.force else 'cancel'} {self.point.label}"


def effect_counts(live: Iterable[EffectRecord]) -> Counter[tuple[int, str]]:
    """Live effects per (step index, name); effects reported outside a step are left out."""
    return Counter((e.index, e.name) for e in live if e.index is not None)


# -- right after the cancel ------------------------------------------------------------------------


def after_cancel(trial: Trial, baseline: Baseline, recorder: Recorder) -> list[str]:
    """The invariants of the run as the cancel left it (before any resume)."""
    outcome = trial.cancelled
    if outcome is None:
        return []
    if not trial.reached:
        return [
            "the run never reached this point: it took another path than the uninterrupted "
            "run (is the task deterministic?)"
        ]
    live = recorder.live_effects(trial.run_id, until_attempt=0)
    return [
        *_cancel_state(outcome, baseline.outcome),
        *_no_step_after(trial, outcome),
        *_partials_prefix(outcome, baseline.outcome),
        *_compensations_undo(outcome, live),
        *_restart_safe(outcome, live),
    ]


def _cancel_state(outcome: Outcome, baseline: Outcome) -> Iterator[str]:
    if outcome.state in (State.CANCELLED, State.COMPLETED) or baseline.state is State.FAILED:
        return
    error = f" ({outcome.error.type}: {outcome.error.message})" if outcome.error else ""
    yield (
        f"the run ended {outcome.state.value}{error} instead of cancelled; "
        "a cancel must never turn into a failure"
    )


def _no_step_after(trial: Trial, outcome: Outcome) -> Iterator[str]:
    point = trial.point
    last = point.index - 1 if point.kind == "before" else point.index
    for step in outcome.steps:
        if step.index > last and step.index not in trial.shielded:
            yield (
                f"step {step.index} ({step.tool}) started after the cancel; no step may start "
                "once a cancel has landed, except inside haltwise.shield()"
            )


def _partials_prefix(outcome: Outcome, baseline: Outcome) -> Iterator[str]:
    got, want = list(outcome.partials), list(baseline.partials)
    if got != want[: len(got)]:
        yield (
            f"the partial results after the cancel, {got!r}, are not a prefix of the "
            f"uninterrupted run's {want!r}"
        )


def _compensations_undo(outcome: Outcome, live: Sequence[EffectRecord]) -> Iterator[str]:
    for step in outcome.steps:
        if step.status is not StepStatus.COMPENSATED:
            continue
        for name in _names_at(live, step.index):
            yield (
                f"step {step.index} ({step.tool}) is compensated but its effect {name!r} is "
                "still there: the compensation did not undo it (a compensation that does "
                f"should report record_effect({name!r}, undo=True))"
            )


def _restart_safe(outcome: Outcome, live: Sequence[EffectRecord]) -> Iterator[str]:
    if outcome.retry is not Retry.RESTART:
        return
    for step in outcome.steps:
        if step.status is StepStatus.COMPENSATED:
            continue  # reported by _compensations_undo
        for name in _names_at(live, step.index):
            yield (
                f"the retry advice is 'restart', but step {step.index} ({step.tool}, "
                f"effect={step.effect.value!r}, {step.status.value}) already made its effect "
                f"{name!r} and it was not undone: starting over would repeat it"
            )


def _names_at(live: Iterable[EffectRecord], index: int) -> list[str]:
    return list(dict.fromkeys(e.name for e in live if e.index == index))


# -- after resuming to the end ---------------------------------------------------------------------


def after_resume(trial: Trial, baseline: Baseline, recorder: Recorder) -> list[str]:
    """The invariants of the run once it was resumed as far as the advice allowed."""
    final = trial.final
    if final is None or not trial.reached:
        return []
    if final.error is not None and final.error.type == "NonDeterminismError":
        return [f"the task is not deterministic on resume: {final.error.message}"]
    steps = _steps_by_index(final, trial.cancelled, baseline.outcome)
    diverged = list(_same_path(final, baseline.outcome))
    return [
        *diverged,
        *_final_matches(final, baseline.outcome),
        *_committed_not_rerun(trial, recorder, steps),
        *_one_key(trial, recorder, steps),
        # Effects of another path cannot be compared step by step: the divergence says it all.
        *([] if diverged else _effects_once(trial, baseline, recorder, steps)),
    ]


def _same_path(final: Outcome, baseline: Outcome) -> Iterator[str]:
    expected = {step.index: step.tool for step in baseline.steps}
    for step in final.steps:
        if expected.get(step.index, step.tool) != step.tool:
            yield (
                f"after resuming, step {step.index} is {step.tool!r} where the uninterrupted run "
                f"had {expected[step.index]!r}: the task took another path on resume (it is not "
                "deterministic on resume)"
            )
            return


def _final_matches(final: Outcome, baseline: Outcome) -> Iterator[str]:
    if final.state is not baseline.state:
        error = f" ({final.error.type}: {final.error.message})" if final.error else ""
        yield (
            f"after resuming, the run ended {final.state.value}{error}; the uninterrupted run "
            f"ended {baseline.state.value}"
        )
    elif final.state is State.COMPLETED and final.result != baseline.result:
        yield (
            f"after resuming, the run returned {final.result!r}; the uninterrupted run "
            f"returned {baseline.result!r}"
        )
    elif final.error and baseline.error and final.error.type != baseline.error.type:
        yield (
            f"after resuming, the run failed with {final.error.type}; the uninterrupted run "
            f"failed with {baseline.error.type}"
        )
    if final.state is baseline.state and list(final.partials) != list(baseline.partials):
        yield (
            f"after resuming, the partial results are {list(final.partials)!r}, not the "
            f"uninterrupted run's {list(baseline.partials)!r}"
        )


def _committed_not_rerun(
    trial: Trial, recorder: Recorder, steps: dict[int, StepRecord]
) -> Iterator[str]:
    reported: set[int] = set()
    for execution in recorder.executions_of(trial.run_id):
        committed = trial.committed_before.get(execution.attempt, frozenset())
        if execution.index in committed and execution.index not in reported:
            reported.add(execution.index)
            yield (
                f"step {execution.index} ({_tool(steps, execution.index)}) was committed, yet "
                f"its body ran again on resume {execution.attempt}"
            )


def _one_key(trial: Trial, recorder: Recorder, steps: dict[int, StepRecord]) -> Iterator[str]:
    journaled = [o for o in (trial.cancelled, trial.final) if o is not None]
    for index, step in sorted(steps.items()):
        keys = recorder.keys(trial.run_id, index) | {
            s.idempotency_key for o in journaled for s in o.steps if s.index == index
        }
        keys.discard("")
        if len(keys) > 1:
            claim = " claims idempotent=True but" if step.idempotent else ""
            yield (
                f"step {index} ({step.tool}){claim} saw {len(keys)} different idempotency keys "
                "across attempts; a step must keep one key in every attempt"
            )


def _effects_once(
    trial: Trial, baseline: Baseline, recorder: Recorder, steps: dict[int, StepRecord]
) -> Iterator[str]:
    live = recorder.live_effects(trial.run_id)
    doubled = _doubled_keys(live, steps)
    yield from doubled.values()
    counts = effect_counts(live)
    for index, name in sorted(set(counts) | set(baseline.effects)):
        got, want = counts[index, name], baseline.effects[index, name]
        # A step called inside haltwise.shield() may be cleanup the cancel asked for.
        if got == want or (index, name) in doubled or index in trial.shielded:
            continue
        how = "the cancel made it happen again" if got > want else "an effect was lost"
        yield (
            f"step {index} ({_tool(steps, index)}) made its effect {name!r} {got} time(s), the "
            f"uninterrupted run {want}: {how}"
        )


def _doubled_keys(
    live: Sequence[EffectRecord], steps: dict[int, StepRecord]
) -> dict[tuple[int, str], str]:
    per_key = Counter(
        (e.index, e.name, e.key)
        for e in live
        if e.index is not None and e.index in steps and steps[e.index].idempotent
    )
    found: dict[tuple[int, str], str] = {}
    for (index, name, key), times in per_key.items():
        if times > 1 and index is not None and (index, name) not in found:
            found[index, name] = (
                f"step {index} ({steps[index].tool}) claims idempotent=True but its effect "
                f"{name!r} happened {times} times for one key ({key})"
            )
    return found


def _steps_by_index(*outcomes: Outcome | None) -> dict[int, StepRecord]:
    found: dict[int, StepRecord] = {}
    for outcome in outcomes:
        for step in outcome.steps if outcome is not None else ():
            found.setdefault(step.index, step)
    return found


def _tool(steps: dict[int, Any], index: int) -> str:
    step = steps.get(index)
    return step.tool if step is not None else "?"


# -- a pause at one point, then unpause ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PauseTrial:
    """What happened when the run was paused at ``point`` and then unpaused.

    ``paused`` is the journal as it was while the run waited paused (``None`` if it never
    paused); ``final`` the outcome once unpaused.
    """

    point: Point
    run_id: str
    paused: RunSnapshot | None
    final: Outcome

    @property
    def where(self) -> str:
        return f"pause {self.point.label}"


def after_pause(trial: PauseTrial, baseline: Baseline, recorder: Recorder) -> list[str]:
    """The invariants of a pause and unpause: nothing in flight while paused, nothing started
    after the point, and then the same end as the uninterrupted run with nothing lost and
    nothing repeated."""
    if trial.paused is None:
        return [f"the pause requested {trial.point.label} never took effect"]
    final = trial.final
    return [
        *_settled_while_paused(trial.paused),
        *_no_step_after_pause(trial),
        *_final_matches(final, baseline.outcome),
        *_each_step_once(trial, recorder),
        *_same_effects(trial, baseline, recorder),
    ]


def _settled_while_paused(paused: RunSnapshot) -> Iterator[str]:
    for step in paused.steps:
        if step.status is not StepStatus.COMMITTED:
            yield (
                f"step {step.index} ({step.tool}) was {step.status.value} while the run was "
                "paused; a pause lets every step in flight run to its end"
            )


def _no_step_after_pause(trial: PauseTrial) -> Iterator[str]:
    assert trial.paused is not None
    point = trial.point
    last = point.index - 1 if point.kind == "before" else point.index
    for step in trial.paused.steps:
        if step.index > last:
            yield f"step {step.index} ({step.tool}) started after the pause was requested"


def _each_step_once(trial: PauseTrial, recorder: Recorder) -> Iterator[str]:
    for step in trial.final.steps:
        ran = len(recorder.executions_of(trial.run_id, step.index))
        if ran > 1 or step.attempts > 1:
            yield (
                f"step {step.index} ({step.tool}) ran {max(ran, step.attempts)} times; a pause "
                "must repeat nothing"
            )


def _same_effects(trial: PauseTrial, baseline: Baseline, recorder: Recorder) -> Iterator[str]:
    counts = effect_counts(recorder.live_effects(trial.run_id))
    for index, name in sorted(set(counts) | set(baseline.effects)):
        got, want = counts[index, name], baseline.effects[index, name]
        if got != want:
            yield (
                f"step {index} made its effect {name!r} {got} time(s), the uninterrupted run "
                f"{want}: a pause must lose and repeat nothing"
            )
