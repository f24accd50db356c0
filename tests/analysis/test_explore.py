"""The cancel explorer: it passes a well-behaved agent and catches each kind of broken toolkit.

The well-behaved agent is tests/_explore_kit.py's; the broken toolkits below change the same
world (real files and dicts under ``tmp_path``), which ``World.reset`` puts back before every run
the explorer makes. Tools report their effects with ``record_effect``, as a user's toolkit would.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

import haltwise
import haltwise.testing
from _explore_kit import (
    WORLD,
    charge_card,
    research,
    run_explore,
    save_note,
    search_index,
    send_receipt,
)
from haltwise import Effect, Outcome, Retry, State, StepRecord, StepStatus
from haltwise._analysis.explore_checks import Baseline, Point, Trial, after_resume
from haltwise._analysis.explore_render import render_rich
from haltwise._runtime.spec import as_spec
from haltwise.testing import (
    Execution,
    Recorder,
    explore,
    explore_async,
    record_effect,
)

pytestmark = pytest.mark.usefixtures("world")


@haltwise.task(on_cancel="compensate")
async def filing(topic: str) -> list[str]:
    """A saga: a cancel undoes the notes already saved."""
    hits = await search_index(topic)
    return [await save_note(hits[0]), await save_note(hits[1])]


# -- broken toolkits -------------------------------------------------------------------------------


@haltwise.tool(cancel="finish", effect="external", idempotent=True, grace=5.0)
async def charge_blindly(cents: int) -> str:
    """Claims idempotent=True, but charges again on every call, whatever the key."""
    WORLD.ledger[f"charge-{len(WORLD.ledger)}"] = cents
    record_effect("charge")
    await anyio.sleep(0)
    return "paid"


@haltwise.task
async def checkout(topic: str) -> Any:
    hits = await search_index(topic)
    await save_note(hits[0])
    return await charge_blindly(5)


def pretend_to_delete(text: str) -> None:
    """A compensation that does nothing."""


@haltwise.tool(cancel="rollback", effect="write", compensate=pretend_to_delete, grace=5.0)
def save_note_for_good(text: str) -> str:
    note = WORLD.note(text)
    note.write_text(text)
    record_effect("note", key=text)
    return note.name


@haltwise.task
async def archive(topic: str) -> Any:
    hits = await search_index(topic)
    return await save_note_for_good(hits[0])


@haltwise.task
async def forgetful(topic: str) -> Any:
    """Decides on how many times it has started, which is not journaled: not deterministic."""
    WORLD.starts += 1
    hits = await search_index(topic)
    if WORLD.starts == 1:
        return await save_note(hits[0])
    return await send_receipt("me@example.com", hits[0])


# -- the explorer passes a well-behaved agent ------------------------------------------------------


def test_a_well_behaved_agent_passes_at_every_cancel_point() -> None:
    report = run_explore(research)
    assert report.ok, report.explain()
    assert report.baseline.state is State.COMPLETED
    kinds = ("before", "during", "after")
    assert [p.at for p in report.points[:6:2]] == [f"{k} step 0 (search_index)" for k in kinds]
    assert len(report.points) == 7 * 3 * 2, "7 steps, 3 points each, plain and forced"
    assert all(p.state is State.CANCELLED for p in report.points)
    assert all(p.final_state is State.COMPLETED for p in report.points)
    by_point = {(p.at, p.force): p for p in report.points}
    assert by_point["before step 0 (search_index)", False].retry is Retry.RESTART
    assert by_point["during step 2 (save_note)", False].retry is Retry.RESUME
    assert by_point["during step 2 (save_note)", True].retry is Retry.RECONCILE
    assert by_point["during step 6 (send_receipt)", True].retry is Retry.RECONCILE


def test_a_saga_passes_too() -> None:
    report = run_explore(filing)
    assert report.ok, report.explain()


def test_the_tools_are_put_back_and_the_recorder_saw_every_run() -> None:
    specs = [as_spec(tool) for tool in (search_index, save_note, charge_card)]
    originals = {spec: spec.fn for spec in specs}
    recorder = Recorder()
    report = run_explore(research, recorder=recorder)
    assert {spec: spec.fn for spec in originals} == originals
    assert report.ok, report.explain()
    baseline = recorder.executions_of("explore-baseline")
    assert [e.tool for e in baseline] == [
        "search_index",
        "summarize_hit",
        "save_note",
        "summarize_hit",
        "save_note",
        "charge_card",
        "send_receipt",
    ]
    assert all(e.returned and e.ended for e in baseline)
    assert recorder.count("explore-baseline", 5) == 1
    assert [e.name for e in recorder.live_effects("explore-baseline")] == [
        "note",
        "note",
        "charge",
        "mail",
    ]


def test_record_effect_outside_the_explorer_does_nothing() -> None:
    record_effect("charge")  # no recorder watching: a no-op, as in production
    outcome = haltwise.run(research, "cats", store=f"sqlite:///{WORLD.root}/prod.db")
    assert outcome.state is State.COMPLETED


@haltwise.task
async def tidy(topic: str) -> Any:
    """Sends a note in a shield when it is cancelled: steps after a cancel are allowed there."""
    hits = await search_index(topic)
    try:
        return await save_note(hits[0])
    except haltwise.Cancelled:
        async with haltwise.shield(5.0):
            await send_receipt("me@example.com", "stopped early")
        raise


def test_steps_in_a_shield_after_a_cancel_are_not_reported_as_late() -> None:
    recorder = Recorder()
    report = run_explore(tidy, recorder=recorder)
    late = [v for v in report.violations if "after the cancel" in v or "made its effect" in v]
    assert late == [], report.explain()
    cleanup = [e for e in recorder.effects if e.name == "mail"]
    assert cleanup, "some cancels sent the note from the shield"
    assert all(e.attempt == 0 and e.tool == "send_receipt" for e in cleanup)


# -- it catches broken toolkits, with a clear message ----------------------------------------------


def test_an_idempotent_tool_that_charges_twice_is_caught() -> None:
    report = run_explore(checkout)
    assert not report.ok
    expected = (
        "forced cancel during step 2 (charge_blindly): step 2 (charge_blindly) claims "
        "idempotent=True but its effect 'charge' happened 2 times for one key"
    )
    assert any(v.startswith(expected) for v in report.violations), report.explain()
    broken = [p for p in report.points if not p.ok]
    assert [(p.at, p.force) for p in broken] == [("during step 2 (charge_blindly)", True)]


def test_a_compensation_that_does_nothing_is_caught() -> None:
    report = run_explore(archive)
    assert not report.ok
    expected = (
        "cancel during step 1 (save_note_for_good): step 1 (save_note_for_good) is compensated "
        "but its effect 'note' is still there: the compensation did not undo it"
    )
    assert any(v.startswith(expected) for v in report.violations), report.explain()
    assert any(
        "step 1 (save_note_for_good) made its effect 'note' 2 time(s), the uninterrupted run 1" in v
        for v in report.violations
    ), report.explain()


def test_a_task_that_is_not_deterministic_on_resume_is_caught() -> None:
    report = run_explore(forgetful)
    assert not report.ok
    plain = {p.at: p for p in report.points if not p.force}
    # The journal holds step 1 when resume asks for another tool: the runtime refuses.
    assert plain["during step 1 (save_note)"].violations == (
        "cancel during step 1 (save_note): the task is not deterministic on resume: run "
        "'explore-004-plain': step 1 is 'save_note' in the journal but the task now calls "
        "'send_receipt'; the task is not deterministic on resume",
    )
    # Cancelled before step 1 was journaled: the resumed run quietly takes another path.
    assert plain["before step 1 (save_note)"].violations[:2] == (
        "cancel before step 1 (save_note): after resuming, step 1 is 'send_receipt' where the "
        "uninterrupted run had 'save_note': the task took another path on resume (it is not "
        "deterministic on resume)",
        "cancel before step 1 (save_note): after resuming, the run returned 1; the "
        "uninterrupted run returned 'cats_purr.txt'",
    )


@haltwise.tool(cancel="interruptible", effect="read")
async def lookup_and_log(query: str) -> str:
    """Declares effect='read' but writes a log line first, then awaits the index."""
    with WORLD.outbox.open("a") as log:
        log.write(f"looked up {query}\n")
    record_effect("log")
    await anyio.sleep(0)
    return query


@haltwise.task
async def chatty(topic: str) -> Any:
    return await lookup_and_log(topic)


def test_a_restart_advice_that_would_repeat_an_effect_is_caught() -> None:
    report = run_explore(chatty)
    during = [p for p in report.points if p.at == "during step 0 (lookup_and_log)"]
    assert all(p.retry is Retry.RESTART for p in during)
    for point in during:
        assert point.violations[0].endswith(
            "the retry advice is 'restart', but step 0 (lookup_and_log, effect='read', "
            "interrupted) already made its effect 'log' and it was not undone: starting over "
            "would repeat it"
        ), report.explain()
        assert "made its effect 'log' 2 time(s), the uninterrupted run 1" in point.violations[1]


def test_a_committed_step_run_again_and_a_changed_key_are_reported() -> None:
    """The two invariants only a runtime bug can break, checked on a made-up history."""
    steps = (
        StepRecord(0, "save_note", "rollback", Effect.WRITE, False, StepStatus.COMMITTED, 2),
        StepRecord(1, "charge_card", "finish", Effect.EXTERNAL, True, StepStatus.COMMITTED, 2),
    )
    done = Outcome(id="r", task="t", state=State.COMPLETED, result=1, steps=steps)
    point = Point("during", 1, "charge_card")
    trial = Trial(point, False, "r", reached=True, cancelled=done, final=done)
    trial.committed_before[1] = frozenset({0})
    recorder = Recorder()
    for attempt, key in ((0, "k1"), (1, "k2")):
        recorder.add_execution(Execution("r", 0, "save_note", "k0", attempt))
        recorder.add_execution(Execution("r", 1, "charge_card", key, attempt))
    baseline = Baseline(outcome=done, points=(point,), effects=Counter())
    assert after_resume(trial, baseline, recorder) == [
        "step 0 (save_note) was committed, yet its body ran again on resume 1",
        "step 1 (charge_card) claims idempotent=True but saw 2 different idempotency keys "
        "across attempts; a step must keep one key in every attempt",
    ]


# -- reports ---------------------------------------------------------------------------------------


def test_the_json_has_the_contract_shape() -> None:
    report = run_explore(archive)
    data = json.loads(json.dumps(report.to_json()))
    assert set(data) == {"ok", "points"}
    assert data["ok"] is False
    assert len(data["points"]) == 2 * 3 * 2
    for point in data["points"]:
        assert set(point) == {"at", "force", "state", "retry", "violations"}
        assert isinstance(point["at"], str)
        assert isinstance(point["force"], bool)
        assert point["state"] in {s.value for s in State}
        assert point["retry"] in {r.value for r in Retry}
        assert all(isinstance(v, str) for v in point["violations"])
    assert data["points"][0] == {
        "at": "before step 0 (search_index)",
        "force": False,
        "state": "cancelled",
        "retry": "restart",
        "violations": [],
    }


def test_explain_and_the_rich_table_name_every_point_and_violation() -> None:
    report = run_explore(archive)
    text = report.explain()
    assert text.startswith("explored ")
    assert "the uninterrupted run completed" in text
    assert "during step 1 (save_note_for_good)" in text
    assert "compensation did not undo it" in text
    out = io.StringIO()
    render_rich(report, Console(file=out, width=200, color_system=None))
    shown = out.getvalue()
    assert "during step 1 (save_note_for_good)" in shown
    assert "compensation did not undo it" in shown
    assert "violation" in shown


@pytest.mark.anyio
async def test_explore_async_runs_in_a_running_loop(tmp_path: Path) -> None:
    report = await explore_async(filing, ["cats"], store_dir=tmp_path / "stores", reset=WORLD.reset)
    assert report.ok, report.explain()
    assert list((tmp_path / "stores").iterdir()), "the scratch stores are kept in store_dir"


@haltwise.tool(cancel="finish", effect="none")
async def stall() -> None:
    await anyio.sleep(30)


@haltwise.task
async def stuck(topic: str) -> None:
    await stall()


def test_an_uninterrupted_run_that_does_not_end_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(haltwise.testing, "ATTEMPT_TIMEOUT", 0.2)
    original = as_spec(stall).fn
    with pytest.raises(haltwise.HaltwiseError, match=r"did not end within 0\.2 s"):
        run_explore(stuck)
    assert as_spec(stall).fn is original, "the tools are put back after an error too"


@haltwise.tool(cancel="interruptible", effect="read")
async def broken_index(query: str) -> list[str]:
    await anyio.sleep(0)
    raise ValueError("the index is down")


@haltwise.task
async def doomed(topic: str) -> Any:
    await save_note(topic)
    return await broken_index(topic)


def test_a_task_that_fails_uninterrupted_is_still_explored() -> None:
    report = run_explore(doomed)
    assert report.baseline.state is State.FAILED
    assert report.ok, report.explain()
    assert all(p.state is State.CANCELLED for p in report.points)
    assert all(p.final_state is State.FAILED for p in report.points)
    assert "the uninterrupted run failed (ValueError: the index is down)" in report.explain()


def test_arguments_that_do_not_fit_the_task_are_refused() -> None:
    with pytest.raises(haltwise.InputError):
        explore(research, "cats", pages=3)


def test_the_public_surface_of_haltwise_testing() -> None:
    assert sorted(haltwise.testing.__all__) == [
        "EffectRecord",
        "Execution",
        "ExploreReport",
        "PointReport",
        "Recorder",
        "explore",
        "explore_async",
        "record_effect",
    ]
    for name in haltwise.testing.__all__:
        assert getattr(haltwise.testing, name).__module__.startswith("haltwise.")
