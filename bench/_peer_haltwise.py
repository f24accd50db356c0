"""haltwise's side of ``bench/peers.py``: per-step overhead and cancel trials (SQLite store).

Durable settings: the default store, WAL with ``synchronous=FULL``. The trivial steps of the
overhead measurement are ``effect="none"`` (their committed settlement rides with the next
write: one commit per step) or ``effect="write"`` (settled durably: two commits per step). The
steps of the cancel trials are ``effect="write"``, ``cancel="interruptible"`` (or ``"finish"``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _peer_common import RUN_STEPS, STEP_SECONDS, CancelTrial, Trace, cancel_moments

import haltwise

TRACE = Trace()


@haltwise.tool(cancel="interruptible", effect="none")
async def trivial_none(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="write")
async def trivial_write(i: int) -> int:
    return i


@haltwise.tool(cancel="interruptible", effect="write")
async def step_interruptible(i: int) -> int:
    return await TRACE.step(i, STEP_SECONDS)


@haltwise.tool(cancel="finish", effect="write")
async def step_finish(i: int) -> int:
    return await TRACE.step(i, STEP_SECONDS)


@haltwise.task(name="peers:trivial")
async def trivial_run(n: int, effect: str) -> int:
    tool = trivial_none if effect == "none" else trivial_write
    total = 0
    for i in range(n):
        total += await tool(i)
    return total


@haltwise.task(name="peers:steps")
async def steps_run(n: int, policy: str) -> int:
    tool = step_finish if policy == "finish" else step_interruptible
    with TRACE.code():
        total = 0
        for i in range(n):
            total += await tool(i)
        return total


def settings(db: Path, variant: str) -> str:
    """The store's settings for an overhead ``variant`` (it sets them on every connection)."""
    return f"WAL, synchronous={'NORMAL' if variant.endswith('normal') else 'FULL'}"


async def _overhead(url: str, steps: int, effect: str) -> float:
    async with haltwise.Runtime(url) as runtime:
        start = time.perf_counter()
        handle = await runtime.start(trivial_run, steps, effect, task_id="overhead")
        outcome = await handle.outcome()
        elapsed = time.perf_counter() - start
    assert outcome.state is haltwise.State.COMPLETED, outcome
    return elapsed / steps


def overhead(db: Path, steps: int, variant: str) -> float:
    """Seconds per trivial step; ``variant`` is ``EFFECT`` or ``EFFECT-normal``."""
    effect, _, normal = variant.partition("-")
    url = f"sqlite:///{db}" + ("?synchronous=normal" if normal else "")
    return anyio.run(_overhead, url, steps, effect)


async def _cancel(runtime: haltwise.Runtime, task_id: str, url: str, via: str) -> None:
    if via == "cli":
        await anyio.run_process(
            [sys.executable, "-m", "haltwise", "cancel", task_id, "--store", url], check=True
        )
    else:
        await runtime.cancel(task_id)


async def _trials(url: str, trials: int, policy: str, via: str) -> list[CancelTrial]:
    # The command line starts a new Python process (about 0.2 s, more on a busy machine): a run
    # three times as long makes sure its cancel still lands while the run is in flight.
    run_steps = RUN_STEPS * 3 if via == "cli" else RUN_STEPS
    results = []
    async with haltwise.Runtime(url) as runtime:
        for k, delay in enumerate(cancel_moments(trials)):
            TRACE.reset()
            task_id = f"cancel-{k}"
            handle = await runtime.start(steps_run, run_steps, policy, task_id=task_id)
            await anyio.sleep(delay)
            start = time.perf_counter()
            await _cancel(runtime, task_id, url, via)
            told = time.perf_counter() - start
            outcome = await handle.outcome()
            final = time.perf_counter() - start
            assert outcome.state is haltwise.State.CANCELLED, outcome
            stopped = await TRACE.stopped_after(start)
            committed = {
                s.index for s in outcome.steps if s.status is haltwise.StepStatus.COMMITTED
            }
            before = TRACE.started.copy()
            resumed = await (await runtime.resume(task_id)).outcome()
            rerun, twice = TRACE.repeated(committed, before)
            ok = resumed.state is haltwise.State.COMPLETED and all(
                TRACE.completed[i] >= 1 for i in range(run_steps)
            )
            results.append(CancelTrial(told, final, stopped, len(committed), rerun, twice, ok))
    return results


def cancel_trials(db: Path, trials: int, variant: str) -> list[dict[str, Any]]:
    """``variant``: ``interruptible``, ``finish`` or ``cli`` (interruptible steps, cancelled by
    ``haltwise cancel ID`` in a new process, in runs of ``3 * RUN_STEPS`` steps)."""
    policy = "finish" if variant == "finish" else "interruptible"
    via = "cli" if variant == "cli" else "api"
    found = anyio.run(_trials, f"sqlite:///{db}", trials, policy, via)
    return [trial.to_json() for trial in found]
