"""A fleet of worker processes sharing one store, and what goes wrong around it.

- Three workers (two on SQLite) work a few hundred submitted runs while this process cancels some
  of them at random moments and one worker is killed with SIGKILL mid-way. Every run ends final
  (a run the kill left with a non-idempotent step ``unknown`` ends ``failed`` with advice
  ``reconcile``, and completes once resumed with ``assume_done``), no step runs twice unless the
  contract says it runs again, no run is worked by two processes, and every cancel lands.
- SIGTERM: a worker lets its ``finish`` step finish, hands the run over and exits 0; another
  worker completes it without running that step again. A second signal exits at once.
- A pending run claimed by a worker that died before starting it is taken over.
- A kill after a step's start is journaled and before its body begins leaves the run to a cancel;
  a cancel that lands while a worker (or resume) takes a run over is acted on: cancelled.
- A worker whose database connections are cut for a few seconds keeps going; a store error while
  a step is being committed never makes that step run again.

The tools (fleet_agent.py) record every execution in a world directory, with the pid that ran
it; the checks hold the journal against that record.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import fleet_agent
import haltwise
from _paths import TESTS
from _pg import PostgresServer, create_database
from _wait import until
from haltwise import Outcome, Retry, Runtime, State, StepStatus
from haltwise._core.records import Owner, RunSnapshot
from haltwise._journal.store import NewRun, Store

WORKER = TESTS / "fleet_worker.py"
ACTIVE = (State.PENDING, State.RUNNING, State.CANCELLING)
CANCEL_REASON = "fleet-test"
#: the lease of the fleet's workers (seconds): short, so that nothing waits the default 15 s
LEASE = 2.0


# -- the fleet's processes and their record of the world ----------------------------------------


class WorkerProcess:
    """A fleet_worker.py process, started and serving once the constructor returns."""

    def __init__(
        self,
        url: str,
        world: Path,
        *,
        concurrency: int = 4,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log = world.parent / f"worker-{time.monotonic_ns()}.log"
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), url, str(world), str(concurrency), str(LEASE)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, **(env or {})},
            )
        self.pid = self.proc.pid
        line = self.read_line()
        assert line == f"ready {self.pid}", (line, self.stderr())

    def read_line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL, and reap it: a zombie still counts as a live owner."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM and expect a clean hand-over: exit code 0."""
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        assert code == 0, (code, self.stderr())


@dataclass(frozen=True, slots=True)
class Execution:
    """One line of the world's ``executions``: a tool body began (``start``) or returned."""

    kind: str
    run: str
    index: int
    pid: int


def read_executions(world: Path) -> list[Execution]:
    path = world / "executions"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        kind, run, index, pid = line.split()
        found.append(Execution(kind, run, int(index), int(pid)))
    return found


class ExecutionTail:
    """Reads the executions a world gained since the last call (for watching a fleet live)."""

    def __init__(self, world: Path) -> None:
        self.path = world / "executions"
        self.offset = 0
        #: bodies begun and not yet returned, by pid: {pid: {(run, index)}}
        self.open: defaultdict[int, set[tuple[str, int]]] = defaultdict(set)

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            kind, run, index, pid = line.split()
            if kind == "start":
                self.open[int(pid)].add((run, int(index)))
            else:
                self.open[int(pid)].discard((run, int(index)))


async def poll_world(
    world: Path, found: Callable[[list[Execution]], bool], timeout: float, what: str
) -> None:
    """Wait until ``found(executions)`` holds, reading the world every few milliseconds."""
    await until(lambda: found(read_executions(world)), what, timeout=timeout, interval=0.01)


# -- the journal ------------------------------------------------------------------------------


async def submit(runtime: Runtime, ids: Iterable[str], task: str, *, steps: int | None) -> None:
    for run_id in ids:
        args: list[object] = [run_id] if steps is None else [run_id, steps]
        await runtime.store.create_run(
            NewRun(id=run_id, task=task, inputs={"args": args, "kwargs": {}})
        )


async def wait_settled(runtime: Runtime, ids: Iterable[str], timeout: float) -> None:
    """Wait until none of ``ids`` is pending, running or cancelling."""
    wanted = set(ids)
    with anyio.move_on_after(timeout):
        while True:
            runs = [run for run in await runtime.store.list_runs() if run.id in wanted]
            if not any(run.state in ACTIVE for run in runs):
                return
            await runtime.store.wait_for_change(0.2)
    stuck = [
        (run.id, run.state.value, run.owner.describe() if run.owner else None)
        for run in await runtime.store.list_runs()
        if run.id in wanted and run.state in ACTIVE
    ]
    raise AssertionError(f"{len(stuck)} runs still active after {timeout} s: {stuck[:10]}")


async def load_all(url: str, ids: Iterable[str]) -> dict[str, RunSnapshot]:
    async with Runtime(url) as runtime:
        return {run_id: await runtime.store.load(run_id) for run_id in ids}


def check_not_worked_twice(executions: list[Execution], *, handed_from: set[int]) -> None:
    """No run was worked by two processes at once, nor went back to a process it left.

    The processes that worked a run appear in ``executions`` as contiguous stretches; every one
    but the last must be in ``handed_from`` (a killed or handed-over worker).
    """
    by_run: defaultdict[str, list[int]] = defaultdict(list)
    for execution in executions:
        by_run[execution.run].append(execution.pid)
    for run, pids in by_run.items():
        stretches = [pid for i, pid in enumerate(pids) if i == 0 or pids[i - 1] != pid]
        assert len(stretches) == len(set(stretches)), f"{run} went back and forth: {stretches}"
        assert set(stretches[:-1]) <= handed_from, f"{run} was worked by {stretches}"


# -- the fleet test ---------------------------------------------------------------------------


#: how long each tool body of the worker to be killed takes (seconds)
VICTIM_STEP_DELAY = 0.05


@dataclass(frozen=True, slots=True)
class Scale:
    workers: int
    runs: int
    cancels: int
    steps: int = 5
    #: how long each step's tool body takes (seconds)
    step_delay: float = 0.004

    @property
    def run_seconds(self) -> float:
        """About how long the tool bodies of one run take: cancels land within that of its start."""
        return self.steps * self.step_delay


@dataclass
class FleetRecord:
    """What happened around the fleet: the state each cancel request returned, the owner each
    found, and the kill."""

    returned: dict[str, State]
    #: the pid of the run's owner read just before each cancel request (None: no owner)
    found_owner: dict[str, int | None]
    victim: int
    #: bodies the victim had begun and not finished when it was killed: {run: index}
    in_flight: dict[str, int]


def hold_one(targets: list[str]) -> str:
    """Hold the oldest target that is not cancelled while pending in its first step (its
    ``look`` waits while its hold file exists), so that one cancel surely lands while a run
    runs, however loaded the machine (the random ones may all come after their run ended). The
    kill waits for that cancel: it finds the run's owner alive."""
    by_age = sorted(targets)
    held = by_age[0]
    assert held not in by_age[len(by_age) - len(by_age) // 5 :], "no target to hold"
    fleet_agent.hold_file(held).touch()  # in $FLEET_WORLD, the workers' world
    return held


async def cancel_at_random_moments(
    runtime: Runtime,
    targets: list[str],
    scale: Scale,
    rng: random.Random,
    hold: tuple[str, anyio.Event],
) -> tuple[dict[str, State], dict[str, int | None]]:
    """Cancel every run in ``targets``, each at a random moment; return what cancel said and
    the pid of the owner the journal showed just before each request.

    A fifth, the last submitted (workers take runs in submission order), are cancelled within
    the first 50 ms, while they are still pending; the held one (see :func:`hold_one`) as soon
    as it is seen started, then let go (and its event set); the others at a random moment
    within about one run's time
    of the moment they were seen started (so most land while they run, some after they
    completed).
    """
    returned: dict[str, State] = {}
    found_owner: dict[str, int | None] = {}
    held, held_cancelled = hold

    async def cancel_after(run_id: str, delay: float) -> None:
        await anyio.sleep(delay)  # the random moment itself
        # A run seen started has an owner, which changes only if it dies (only the victim
        # does) and a worker takes the run over: the request finds this owner or a live one.
        owner = (await runtime.store.load(run_id)).run.owner
        found_owner[run_id] = None if owner is None else owner.pid
        record = await runtime.cancel(run_id, reason=CANCEL_REASON)
        returned[run_id] = record.state
        if run_id == held:
            fleet_agent.hold_file(run_id).unlink()
            held_cancelled.set()

    by_age = sorted(targets)
    early = by_age[len(by_age) - len(by_age) // 5 :]
    waiting = set(by_age) - set(early)
    async with anyio.create_task_group() as group:
        for run_id in early:
            group.start_soon(cancel_after, run_id, rng.uniform(0, 0.05))
        with anyio.move_on_after(60):
            while waiting:
                runs = {run.id: run for run in await runtime.store.list_runs()}
                for run_id in sorted(waiting):
                    if runs[run_id].state is not State.PENDING:
                        waiting.discard(run_id)
                        delay = rng.uniform(0, scale.run_seconds)
                        group.start_soon(cancel_after, run_id, 0.0 if run_id == held else delay)
                await anyio.sleep(0.005)  # the polling interval
        if waiting:
            stuck = [(run_id, runs[run_id].owner) for run_id in sorted(waiting)]
            raise AssertionError(f"runs never started within 60 s: {stuck}")
    return returned, found_owner


async def kill_mid_way(
    runtime: Runtime, world: Path, victim: WorkerProcess, total: int
) -> dict[str, int]:
    """Once a third of the runs are final, SIGKILL ``victim``, preferably while it is in the
    middle of a non-idempotent ``record`` step; return the bodies it left unfinished."""
    tail = ExecutionTail(world)
    with anyio.fail_after(60):
        while sum(run.state.is_final for run in await runtime.store.list_runs()) < total // 3:
            await runtime.store.wait_for_change(0.1)
    with anyio.move_on_after(3):
        while not any(index % 3 == 2 for _, index in tail.open[victim.pid]):
            await anyio.sleep(0.001)
            tail.poll()
    with anyio.move_on_after(10):  # no record step came: any step in flight will do
        while not tail.open[victim.pid]:
            await anyio.sleep(0.001)
            tail.poll()
    victim.kill()
    tail.poll()
    return dict(tail.open[victim.pid])


async def drive_fleet(
    url: str,
    world: Path,
    scale: Scale,
    victim: WorkerProcess,
    rng: random.Random,
    targets: list[str],
    held: str,
) -> FleetRecord:
    ids = [f"run{i:03d}" for i in range(scale.runs)]
    async with Runtime(url) as runtime:
        in_flight: dict[str, int] = {}

        held_cancelled = anyio.Event()

        async def killer() -> None:
            with anyio.fail_after(60):  # the held run's cancel finds its owner alive
                await held_cancelled.wait()
            in_flight.update(await kill_mid_way(runtime, world, victim, scale.runs))

        async with anyio.create_task_group() as group:
            group.start_soon(killer)
            returned, found_owner = await cancel_at_random_moments(
                runtime, targets, scale, rng, (held, held_cancelled)
            )
        await wait_settled(runtime, ids, timeout=60)
    return FleetRecord(
        returned=returned, found_owner=found_owner, victim=victim.pid, in_flight=in_flight
    )


async def reconcile(url: str, snapshots: Mapping[str, RunSnapshot]) -> list[str]:
    """Resume every run the kill left ``failed`` for reconciling, as an operator would: its
    ``record`` step did happen (assume_done). Return their ids."""
    resumed = []
    async with Runtime(url) as runtime:
        for run_id, snapshot in snapshots.items():
            if snapshot.run.state is not State.FAILED:
                continue
            unknown = [s.index for s in snapshot.steps if s.status is StepStatus.UNKNOWN]
            handle = await runtime.resume(
                run_id, assume_done={i: f"row-{i}" for i in unknown}, task=fleet_agent.job
            )
            outcome = await handle.outcome()
            assert outcome.state is State.COMPLETED, outcome
            resumed.append(run_id)
    return resumed


def check_fleet(
    before: Mapping[str, RunSnapshot],
    after: Mapping[str, RunSnapshot],
    executions: list[Execution],
    record: FleetRecord,
    scale: Scale,
) -> Counter[str]:
    """Every promise of the fleet test, run by run; returns how the runs ended, for the report."""
    starts = Counter((e.run, e.index) for e in executions if e.kind == "start")
    dones = Counter((e.run, e.index) for e in executions if e.kind == "done")
    check_not_worked_twice(executions, handed_from={record.victim})
    # The last step the victim began in each run it worked: the kill may have come before that
    # step's settlement was durable (mid-call, or just after the body returned).
    last_by_victim = {e.run: e.index for e in executions if e.pid == record.victim}
    tally: Counter[str] = Counter()
    for run_id, snapshot in after.items():
        run, first = snapshot.run, before[run_id].run
        cancelled_as = record.returned.get(run_id)
        left = last_by_victim.get(run_id)
        left_tool = None if left is None else fleet_agent.JOB_TOOLS[left % 3]
        tally[f"{first.state.value}, cancel said {cancelled_as}"] += 1
        # The kill left a non-idempotent step mid-call (journaled as started, its body begun or
        # not): unknown, so the run needs reconciling.
        if first.state is State.FAILED:
            assert run_id in last_by_victim, (run_id, first)
            unknown = [s for s in before[run_id].steps if s.status is StepStatus.UNKNOWN]
            assert [s.tool for s in unknown] == ["record"], (run_id, unknown)
            assert first.error is not None and first.error.type == "UnknownStepError", first
            assert f"step {unknown[0].index} (record)" in first.error.message, first.error
            assert before[run_id].outcome().retry is Retry.RECONCILE
        # Every cancel landed: recorded with its reason, and final as the request found the run.
        if cancelled_as is None:
            assert run.state is State.COMPLETED, (run_id, run)
        elif cancelled_as is State.CANCELLED:
            # it was still pending (nothing ran), or the kill left it to nobody and the cancel
            # settled it there, as a takeover would (CONTRACT.md, cancel)
            assert run.state is State.CANCELLED, (run_id, snapshot)
            if snapshot.steps:
                check_left_by_the_victim(run_id, snapshot, executions, record)
            assert snapshot.outcome().retry is advice_when_cancelled(snapshot), (
                run_id,
                step_states(snapshot),
                snapshot,
            )
        elif cancelled_as is State.CANCELLING:  # it ran: cancelled, or returned before a checkpoint
            assert run.state in (State.CANCELLED, State.COMPLETED), (run_id, run)
        else:  # it was final already (completed, or failed by the kill and reconciled since)
            assert cancelled_as in (State.COMPLETED, State.FAILED), (run_id, cancelled_as)
            assert run.state is State.COMPLETED, (run_id, run)
        if cancelled_as in (State.CANCELLED, State.CANCELLING):
            assert run.reason == CANCEL_REASON, (run_id, run)
        if run.state is State.COMPLETED:
            assert run.result == fleet_agent.job_result(scale.steps), (run_id, run.result)
            assert list(snapshot.partials) == [{"index": i} for i in range(scale.steps)]
            assert all(s.status is StepStatus.COMMITTED for s in snapshot.steps), snapshot.steps
        # No step ran more often than its journal says, and none ran twice unless the contract
        # runs it again: only the step the kill cut short, if it is interruptible or idempotent.
        for step in snapshot.steps:
            key = (run_id, step.index)
            assert starts[key] <= step.attempts, (key, starts[key], step)
            again = 2 if step.index == left and left_tool in ("look", "charge") else 1
            assert starts[key] <= again and dones[key] <= again, (key, starts[key], step)
        journaled = {s.index for s in snapshot.steps}
        assert {i for (r, i) in starts if r == run_id} <= journaled, "a body ran unjournaled"
    assert len(record.returned) == scale.cancels, "a cancel request was lost"
    return tally


def step_states(snapshot: RunSnapshot) -> list[tuple[int, str, str, int]]:
    """Each step's (index, tool, status, attempts): what an assertion about advice prints."""
    return [(s.index, s.tool, s.status.value, s.attempts) for s in snapshot.steps]


def check_left_by_the_victim(
    run_id: str, snapshot: RunSnapshot, executions: list[Execution], record: FleetRecord
) -> None:
    """A run with steps that a cancel found nobody working (and settled): the victim was its
    last owner, and no other process ran any of its bodies.

    Its bodies' executions show it, unless the kill came after the victim journaled the first
    step's start and before that body began (its first line writes the record): then only the
    owner the journal showed just before the cancel does, and no body of the run ran at all.
    """
    pids = {e.pid for e in executions if e.run == run_id}
    assert pids <= {record.victim}, (run_id, "worked by", pids, snapshot)
    found = record.found_owner[run_id]
    assert pids or found == record.victim, (run_id, "owner before the cancel", found, snapshot)


def advice_when_cancelled(snapshot: RunSnapshot) -> Retry:
    """The retry advice of a cancelled ``fleet:job`` run (CONTRACT.md, "Outcome and retry
    advice"): ``reconcile`` if the kill left a ``record`` step (not idempotent) ``unknown``;
    ``resume`` once it reached step 1 (``charge``, external: committed, or ``unknown`` and
    idempotent); ``restart`` if it never got past its first ``look`` (or never began)."""
    if any(s.status is StepStatus.UNKNOWN and s.tool == "record" for s in snapshot.steps):
        return Retry.RECONCILE
    return Retry.RESUME if len(snapshot.steps) > 1 else Retry.RESTART


def check_charges(world: Path) -> None:
    """Every execution of an idempotent step used the same key, across workers and kills."""
    keys: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    path = world / "charges"
    for line in path.read_text().splitlines() if path.exists() else []:
        run, index, key = line.split()
        keys[(run, index)].add(key)
    changed = {step: found for step, found in keys.items() if len(found) > 1}
    assert not changed, f"an idempotent step changed its key: {changed}"


def run_fleet(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: Scale, seed: int
) -> Counter[str]:
    world = tmp_path / "world"
    world.mkdir()
    monkeypatch.setenv("FLEET_WORLD", str(world))  # for the tools the reconciling resume runs
    rng = random.Random(seed)
    ids = [f"run{i:03d}" for i in range(scale.runs)]
    targets = rng.sample(ids, scale.cancels)
    held = hold_one(targets)

    async def submit_all() -> None:
        async with Runtime(url) as runtime:
            await submit(runtime, ids, "fleet:job", steps=scale.steps)

    anyio.run(submit_all)
    workers: list[WorkerProcess] = []
    try:
        env = {"FLEET_STEP_DELAY": str(scale.step_delay)}
        # The victim's bodies last longer: one seen begun must still be running when the kill
        # lands. A 4 ms body could end between the look and the kill (a kill between steps).
        slow = {"FLEET_STEP_DELAY": str(max(scale.step_delay, VICTIM_STEP_DELAY))}
        workers = [WorkerProcess(url, world, env=slow)]
        workers += [WorkerProcess(url, world, env=env) for _ in range(scale.workers - 1)]
        record = anyio.run(drive_fleet, url, world, scale, workers[0], rng, targets, held)
        assert record.in_flight, "the victim was killed between runs, not mid-way"
        before = anyio.run(load_all, url, ids)
        anyio.run(reconcile, url, before)
        for worker in workers[1:]:
            worker.stop()
    finally:
        for worker in workers:
            worker.kill()
    after = anyio.run(load_all, url, ids)
    tally = check_fleet(before, after, read_executions(world), record, scale)
    check_charges(world)
    returned = Counter(record.returned.values())
    assert returned[State.CANCELLED] and returned[State.CANCELLING], returned
    assert record.returned[held] is State.CANCELLING, "the held run was not running"
    report = haltwise.verify_store(url)
    assert report.ok, report.findings
    return tally


def test_fleet_of_three_on_postgres_survives_a_kill_and_random_cancels(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scale = Scale(workers=3, runs=300, cancels=50)
    print(dict(run_fleet(pg_url, tmp_path, monkeypatch, scale, seed=5)))


def test_fleet_of_two_on_one_sqlite_file_survives_a_kill_and_random_cancels(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scale = Scale(workers=2, runs=60, cancels=10, step_delay=0.01)
    print(dict(run_fleet(sqlite_url, tmp_path, monkeypatch, scale, seed=7)))


def work_until_killed(url: str, world: Path, run_id: str, task: str) -> int:
    """Submit run ``run_id`` of ``task`` (one whose step SIGKILLs its own process) and let a
    worker take it until it is killed; return the dead worker's pid."""
    anyio.run(submit_runs, url, [run_id], task)
    worker = WorkerProcess(url, world)
    try:
        code = worker.wait(timeout=30)
    finally:
        worker.kill()
    assert code == -signal.SIGKILL, (code, worker.stderr())
    return worker.pid


def test_a_kill_after_a_step_start_is_journaled_leaves_the_run_to_a_cancel(
    store_url: str, tmp_path: Path
) -> None:
    # The fleet test's kill can land between the victim journaling a step's start and that
    # body's first line: the run shows a journaled step, no execution, and a cancel settles it.
    # Step into that window: the step's tool SIGKILLs its own process first thing.
    world = tmp_path / "world"
    world.mkdir()
    dead = work_until_killed(store_url, world, "dies", "fleet:dies")

    async def cancel() -> tuple[RunSnapshot, State, RunSnapshot]:
        async with Runtime(store_url) as runtime:
            before = await runtime.store.load("dies")
            record = await runtime.cancel("dies", reason=CANCEL_REASON)
            return before, record.state, await runtime.store.load("dies")

    before, returned, after = anyio.run(cancel)
    assert before.run.owner is not None and before.run.owner.pid == dead, before.run
    assert [(s.index, s.tool, s.status) for s in before.steps] == [(0, "die", StepStatus.RUNNING)]
    assert returned is State.CANCELLED, "nobody works the run: the cancel settles it"
    assert after.run.state is State.CANCELLED and after.run.reason == CANCEL_REASON, after.run
    assert [(s.index, s.status) for s in after.steps] == [(0, StepStatus.INTERRUPTED)]
    assert after.outcome().retry is Retry.RESTART
    executions = read_executions(world)
    assert executions == [], executions
    # The fleet test's check accepts such a run by the owner the cancel found ...
    record = FleetRecord(
        returned={"dies": returned}, found_owner={"dies": dead}, victim=dead, in_flight={}
    )
    check_left_by_the_victim("dies", after, executions, record)
    # ... and only by it.
    stranger = FleetRecord(
        returned={"dies": returned}, found_owner={"dies": None}, victim=dead, in_flight={}
    )
    with pytest.raises(AssertionError, match="owner before the cancel"):
        check_left_by_the_victim("dies", after, executions, stranger)
    report = haltwise.verify_store(store_url)
    assert report.ok, report.findings


# -- a cancel that lands while a run is being taken over -------------------------------------


def leave_a_rollback_step_to_compensate(url: str, world: Path, run_id: str) -> int:
    """A worker begins ``fleet:reserve``'s rollback step and dies (SIGKILL) in its body; the
    run's hold file is made, so that whoever takes the run over waits in the compensation.
    Returns the dead worker's pid."""
    dead = work_until_killed(url, world, run_id, "fleet:reserve")
    fleet_agent.hold_file(run_id).touch()
    return dead


def undo_began(found: list[Execution]) -> bool:
    return any(e.kind == "undo" for e in found)


def check_cancelled_during_takeover(
    outcome: Outcome, world: Path, dead: int, taker: int, url: str
) -> None:
    """The cancel that landed mid-takeover was acted on: cancelled with its reason, the
    rollback step compensated once by the taker, and nothing run again."""
    assert outcome.state is State.CANCELLED and outcome.reason == CANCEL_REASON, outcome
    assert all(s.status is not StepStatus.RUNNING for s in outcome.steps), outcome.steps
    assert [(e.kind, e.index, e.pid) for e in read_executions(world)] == [
        ("start", 0, dead), ("undo", 0, taker),
    ]  # fmt: skip
    report = haltwise.verify_store(url)
    assert report.ok, report.findings


def test_a_cancel_landing_while_a_worker_takes_a_run_over_cancels_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker read the run running, then was cancelled in the compensation it ran to settle
    # the dead owner's step: it used to try cancelling -> running and crash, leaving the run
    # cancelling and owned by a process that works nothing.
    world = tmp_path / "world"
    world.mkdir()
    monkeypatch.setenv("FLEET_WORLD", str(world))  # the hold file's directory
    dead = leave_a_rollback_step_to_compensate(store_url, world, "taken")
    taker = WorkerProcess(store_url, world)

    async def cancel_mid_takeover() -> tuple[State, Outcome]:
        async with Runtime(store_url) as runtime:
            await poll_world(world, undo_began, 30, "the taker's compensation to begin")
            record = await runtime.cancel("taken", reason=CANCEL_REASON)
            fleet_agent.hold_file("taken").unlink()
            with anyio.fail_after(20):
                return record.state, await runtime.outcome("taken")

    try:
        returned, outcome = anyio.run(cancel_mid_takeover)
        assert taker.proc.poll() is None, f"the worker died: {taker.stderr()}"
        taker.stop()
    finally:
        taker.kill()
    assert returned is State.CANCELLING, "a live worker holds the run: it settles the cancel"
    check_cancelled_during_takeover(outcome, world, dead, taker.pid, store_url)


def test_a_cancel_landing_while_resume_takes_a_run_over_cancels_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, through resume: it raised InvalidTransitionError (cancelling -> running).
    world = tmp_path / "world"
    world.mkdir()
    monkeypatch.setenv("FLEET_WORLD", str(world))  # for the compensation, run in this process
    dead = leave_a_rollback_step_to_compensate(store_url, world, "resumed")

    async def resume_and_cancel_mid_takeover() -> tuple[State, Outcome]:
        async with Runtime(store_url) as resumer, Runtime(store_url) as canceller:
            handles: list[haltwise.TaskHandle] = []

            async def resume() -> None:
                handles.append(await resumer.resume("resumed", task=fleet_agent.reserves))

            async with anyio.create_task_group() as group:
                group.start_soon(resume)
                await poll_world(world, undo_began, 30, "the resume's compensation to begin")
                record = await canceller.cancel("resumed", reason=CANCEL_REASON)
                fleet_agent.hold_file("resumed").unlink()
            with anyio.fail_after(20):
                return record.state, await handles[0].outcome()

    returned, outcome = anyio.run(resume_and_cancel_mid_takeover)
    assert returned is State.CANCELLING, "the resuming runtime holds the run: it settles it"
    check_cancelled_during_takeover(outcome, world, dead, os.getpid(), store_url)


# -- stopping a worker: hand-over on SIGTERM, exit at once on a second signal -----------------


async def submit_runs(url: str, ids: Iterable[str], task: str, steps: int | None = None) -> None:
    async with Runtime(url) as runtime:
        await submit(runtime, ids, task, steps=steps)


async def wait_outcome(url: str, run_id: str, timeout: float) -> Outcome:
    async with Runtime(url) as runtime:
        with anyio.fail_after(timeout):
            return await runtime.outcome(run_id)


def take_over(url: str, world: Path, run_id: str) -> tuple[Outcome, WorkerProcess]:
    """A second worker process takes ``run_id`` over: its outcome, and the (stopped) worker."""
    worker = WorkerProcess(url, world)
    try:
        outcome = anyio.run(wait_outcome, url, run_id, 10)
        worker.stop()
    finally:
        worker.kill()
    return outcome, worker


async def status(url: str, run_id: str) -> Outcome:
    async with Runtime(url) as runtime:
        return await runtime.status(run_id)


def began(index: int) -> Callable[[list[Execution]], bool]:
    """A poll_world condition: the body of step ``index`` has begun."""
    return lambda found: any(e.kind == "start" and e.index == index for e in found)


def test_sigterm_lets_the_finish_step_finish_and_hands_the_run_over(
    store_url: str, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    anyio.run(submit_runs, store_url, ["slow"], "fleet:slow")
    first = WorkerProcess(store_url, world, env={"FLEET_SLOW_SECONDS": "1.0"})
    try:
        anyio.run(poll_world, world, began(1), 30, "the deliver step to begin")
        sent = time.monotonic()
        first.signal(signal.SIGTERM)
        code = first.wait(timeout=20)
        took = time.monotonic() - sent
    finally:
        first.kill()
    assert code == 0, first.stderr()
    # It waited for the finish step, within its grace, and began nothing after it.
    assert took < 1.0 + 5, took
    assert [(e.kind, e.index) for e in read_executions(world)] == [
        ("start", 0), ("done", 0), ("start", 1), ("done", 1),
    ]  # fmt: skip
    handed = anyio.run(status, store_url, "slow")
    assert handed.state is State.RUNNING and handed.reason is None, handed
    assert [(s.status, s.attempts) for s in handed.steps] == [(StepStatus.COMMITTED, 1)] * 2
    owner = anyio.run(load_all, store_url, ["slow"])["slow"].run.owner
    assert owner is None, owner

    outcome, second = take_over(store_url, world, "slow")
    assert outcome.state is State.COMPLETED, outcome
    assert outcome.result == [0, "delivered", 2]
    executions = read_executions(world)
    assert Counter((e.kind, e.index) for e in executions)[("start", 1)] == 1, "deliver ran twice"
    assert [e.pid for e in executions if e.index == 2] == [second.pid] * 2
    check_not_worked_twice(executions, handed_from={first.pid})
    report = haltwise.verify_store(store_url)
    assert report.ok, report.findings


def test_a_second_signal_makes_a_worker_exit_at_once(store_url: str, tmp_path: Path) -> None:
    world = tmp_path / "world"
    world.mkdir()
    anyio.run(submit_runs, store_url, ["slow"], "fleet:slow")
    first = WorkerProcess(store_url, world, env={"FLEET_SLOW_SECONDS": "60"})
    try:
        anyio.run(poll_world, world, began(1), 30, "the deliver step to begin")
        first.signal(signal.SIGTERM)
        assert first.read_line() == "stopping"
        sent = time.monotonic()
        first.signal(signal.SIGINT)
        code = first.wait(timeout=40)
        took = time.monotonic() - sent
    finally:
        first.kill()
    assert code == 128 + signal.SIGINT, (code, first.stderr())
    assert took < 40, took  # not the 60 s the deliver step would take (generous: a loaded machine)
    # As after a crash: the step is left running by an owner that is gone ...
    assert [f.code for f in haltwise.verify_store(store_url).findings] == ["orphaned-step"]
    # ... and the worker that takes the run over may not run it again: reconcile.
    outcome, _ = take_over(store_url, world, "slow")
    assert outcome.state is State.FAILED, outcome
    assert outcome.error is not None and outcome.error.type == "UnknownStepError"
    assert [s.status for s in outcome.steps] == [StepStatus.COMMITTED, StepStatus.UNKNOWN]
    assert outcome.retry is Retry.RECONCILE
    assert [(e.kind, e.index) for e in read_executions(world)] == [
        ("start", 0), ("done", 0), ("start", 1),
    ]  # fmt: skip
    report = haltwise.verify_store(store_url)
    assert report.ok, report.findings


def dead_owner() -> Owner:
    """The owner identity of a process that has exited (and been reaped)."""
    code = "from haltwise._journal.owner import new_owner; print(new_owner().to_json())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    return Owner.from_json(done.stdout)


def test_a_run_claimed_by_a_worker_that_died_before_starting_it_is_taken_over(
    store_url: str, tmp_path: Path
) -> None:
    # A worker claims pending runs, then starts them: a kill in between leaves a pending run
    # with a dead owner. The window is narrow; step into it by claiming for a dead process.
    world = tmp_path / "world"
    world.mkdir()

    async def claim_for_the_dead() -> None:
        async with Runtime(store_url) as runtime:
            await submit(runtime, ["claimed"], "fleet:job", steps=3)
            claimed = await runtime.store.claim_pending(
                dead_owner(), ["fleet:job"], lease_until=time.time() + LEASE, limit=1
            )
            assert [run.id for run in claimed] == ["claimed"]

    anyio.run(claim_for_the_dead)
    worker = WorkerProcess(store_url, world)
    try:
        outcome = anyio.run(wait_outcome, store_url, "claimed", 10)
        worker.stop()
    finally:
        worker.kill()
    assert outcome.state is State.COMPLETED, outcome
    assert outcome.result == fleet_agent.job_result(3)


# -- a worker that loses its database connection ----------------------------------------------


def cut_connections(server_dsn: str, application: str, seconds: float) -> int:
    """Terminate every backend of ``application`` as it appears, for ``seconds``; return how
    many were terminated."""
    terminated = 0
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (application,),
            ).fetchall()
            terminated += sum(1 for (done,) in rows if done)
            time.sleep(0.02)  # the outage is the point: keep cutting as it reconnects
    return terminated


def test_a_worker_that_loses_its_database_connection_goes_on(
    pg_dsn: str, pg_url: str, tmp_path: Path
) -> None:
    world = tmp_path / "world"
    world.mkdir()
    first_batch = [f"a{i:02d}" for i in range(16)]
    second_batch = [f"b{i:02d}" for i in range(8)]
    anyio.run(submit_runs, pg_url, first_batch, "fleet:job", 5)
    slow_steps = {"FLEET_STEP_DELAY": "0.05"}
    victim = WorkerProcess(pg_url, world, env={**slow_steps, "PGAPPNAME": "fleet-victim"})
    healthy = WorkerProcess(pg_url, world, concurrency=2, env=slow_steps)
    try:
        anyio.run(poll_world, world, lambda found: any(e.pid == victim.pid for e in found), 30,
                  "the victim to begin a step")  # fmt: skip
        terminated = cut_connections(pg_dsn, "fleet-victim", 3.0)
        assert terminated > 0
        assert victim.proc.poll() is None, f"the worker died: {victim.stderr()}"

        async def settle_batches() -> None:
            async with Runtime(pg_url) as runtime:
                await wait_settled(runtime, first_batch, timeout=20)
                # The healthy worker leaves; the victim must take the second batch alone.
                await anyio.to_thread.run_sync(healthy.stop)
                await submit(runtime, second_batch, "fleet:job", steps=5)
                await wait_settled(runtime, second_batch, timeout=20)

        anyio.run(settle_batches)
        victim.stop()
    finally:
        healthy.kill()
        victim.kill()
    executions = read_executions(world)
    # A run the outage cut short may move to the other worker, but never back and forth.
    check_not_worked_twice(executions, handed_from={victim.pid, healthy.pid})
    starts = Counter((e.run, e.index) for e in executions if e.kind == "start")
    snapshots = anyio.run(load_all, pg_url, first_batch + second_batch)
    print(
        f"{terminated} backends terminated;", Counter(s.run.state.value for s in snapshots.values())
    )
    for run_id, snapshot in snapshots.items():
        run = snapshot.run
        # A step cut short by the outage is settled as after a crash: a non-idempotent one
        # leaves the run for reconciling; nothing is recorded as the task's own failure.
        if run.state is State.FAILED:
            assert run.error is not None and run.error.type == "UnknownStepError", run
            continue
        assert run.state is State.COMPLETED, run
        for step in snapshot.steps:
            assert starts[(run_id, step.index)] <= step.attempts, step
            if step.tool == "record":
                assert starts[(run_id, step.index)] == 1, ("record ran twice", run_id, step)
    assert {e.pid for e in executions if e.run in second_batch} == {victim.pid}
    report = haltwise.verify_store(pg_url)
    assert report.ok, report.findings


class CommitFailsOnce:
    """A store whose first ``committed`` settlement fails, as when the connection drops just then
    (a write the database may or may not have made: the step's fate is unknown)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def settle_step(
        self, run_id: str, index: int, status: StepStatus, **options: Any
    ) -> None:
        if status is StepStatus.COMMITTED and not self.failed:
            self.failed = True
            raise haltwise.StoreError("connection lost (injected)")
        await self.inner.settle_step(run_id, index, status, **options)


ROWS_WRITTEN: list[str] = []


@haltwise.tool(cancel="finish", effect="write", name="test_fleet.write_row")
async def write_row(text: str) -> str:
    ROWS_WRITTEN.append(text)
    return text


@haltwise.task(name="test_fleet:one_write")
async def one_write() -> str:
    return await write_row("row")


@pytest.mark.anyio
async def test_a_store_error_while_committing_a_step_never_runs_it_again(store_url: str) -> None:
    ROWS_WRITTEN.clear()
    runtime = Runtime(store_url)
    runtime.store = CommitFailsOnce(runtime.store)  # type: ignore[assignment]
    async with runtime:
        await runtime.start(one_write, task_id="w")
        with contextlib.suppress(haltwise.StoreError):  # the journal could not be written
            await runtime.outcome("w")
    assert ROWS_WRITTEN == ["row"]
    async with Runtime(store_url) as runtime:
        status_now = await runtime.status("w")
        assert status_now.state is not State.FAILED, "the store's error is not the task's"
        # The write may or may not be journaled: unknown, and not idempotent, so resume refuses.
        with pytest.raises(haltwise.ResumeRefusedError, match=r"step 0"):
            await runtime.resume("w")
    assert ROWS_WRITTEN == ["row"], "the write ran again"


# -- child runs under kill -9: one owner of a run in a process ----------------------------------


def children_begun(children: set[str], pid: int) -> Callable[[list[Execution]], bool]:
    """Whether every child of ``children`` began its first step (the held read) in ``pid``."""

    def found(executions: list[Execution]) -> bool:
        begun = {e.run for e in executions if e.kind == "start" and e.index == 0 and e.pid == pid}
        return children <= begun

    return found


def check_children_once(world: Path, outcomes: Mapping[str, Outcome], kills: int) -> None:
    """Every parent and child completed with every step committed; the children's charge and
    row ran once each (one call, one idempotency key), their held read once per worker."""
    for run_id, outcome in outcomes.items():
        assert outcome.state is State.COMPLETED, (run_id, outcome)
        assert all(s.status is StepStatus.COMMITTED for s in outcome.steps), (run_id, outcome)
    calls = Counter((e.run, e.index) for e in read_executions(world) if e.kind == "start")
    keys: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    lines: Counter[tuple[str, str]] = Counter()
    for line in (world / "charges").read_text().splitlines():
        run, index, key = line.split()
        keys[(run, index)].add(key)
        lines[(run, index)] += 1
    children = [run_id for run_id in outcomes if "/" in run_id]
    for child in children:
        assert calls[(child, 0)] == kills + 1, (child, calls)
        assert calls[(child, 1)] == 1, f"{child}'s charge ran {calls[(child, 1)]} times"
        assert calls[(child, 2)] == 1, f"{child}'s row was written {calls[(child, 2)]} times"
        assert lines[(child, "1")] == 1 and len(keys[(child, "1")]) == 1, (child, keys)
        assert outcomes[child].steps[1].attempts == 1, outcomes[child].steps


def test_children_taken_over_after_repeated_kill_9_run_each_effect_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28: the next worker took a child run PARENT/0 over twice, once as an orphan in its
    # scan and once through the parent's resume of its child step: the child's charge ran
    # twice under two keys, its row twice. Workers are killed (SIGKILL) while every child waits
    # in its first step, twice; a third worker finishes them.
    world = tmp_path / "world"
    world.mkdir()
    monkeypatch.setenv("FLEET_WORLD", str(world))  # the hold files' directory
    parents = [f"kp{i}" for i in range(6)]
    children = {f"{p}/0" for p in parents}
    for child in children:
        fleet_agent.hold_file(child).touch()
    anyio.run(submit_runs, store_url, parents, "fleet:parent")
    kills = 2
    for _ in range(kills):
        worker = WorkerProcess(store_url, world, concurrency=len(parents) * 2)
        try:
            anyio.run(poll_world, world, children_begun(children, worker.pid), 60, "the children")
        finally:
            worker.kill()
    for child in children:
        fleet_agent.hold_file(child).unlink()
    taker = WorkerProcess(store_url, world, concurrency=len(parents) * 2)
    try:

        async def outcomes() -> dict[str, Outcome]:
            async with Runtime(store_url) as runtime:
                with anyio.fail_after(60):
                    found = {p: await runtime.outcome(p) for p in parents}
                return found | {c: await runtime.status(c) for c in sorted(children)}

        found = anyio.run(outcomes)
        taker.stop()
    finally:
        taker.kill()
    check_children_once(world, found, kills)
    report = haltwise.verify_store(store_url)
    assert report.ok, report.findings


# -- PostgreSQL stopped while settlements are on their way -------------------------------------


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_postgres_stopped_under_a_worker_loses_no_settlement_and_repeats_no_charge(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28 item 2, from another process: a worker's runs settle a read (a settlement that
    # need not be durable: it rides with the run's next write) while the server is down, so
    # the writer loses it with its connection; the server comes back before the runs' final
    # transitions. Each run must not end while its settlement is not durable: the store kept
    # one error for all (raised to whichever run wrote first), and the others committed
    # `completed` with their read `running`, for good. The worker must go on (takeover) and
    # every run complete, each charge made once, check sound.
    world = tmp_path / "world"
    world.mkdir()
    monkeypatch.setenv("FLEET_WORLD", str(world))  # the hold and go files' directory
    server = PostgresServer()  # its own server: this test stops and starts it
    server.start()
    try:
        url = create_database(server.dsn)
        runs = [f"pg{i}" for i in range(8)]
        for run in runs:
            fleet_agent.hold_file(run).touch()
        anyio.run(submit_runs, url, runs, "fleet:read_then_wait")
        worker = WorkerProcess(url, world, concurrency=len(runs))
        try:
            reads_in = [(run, 1) for run in runs]
            anyio.run(poll_world, world, began_all("start", reads_in), 60, "the reads")
            server.halt(mode)
            for run in runs:  # the reads return and settle, their writes refused
                fleet_agent.hold_file(run).unlink()
            anyio.run(poll_world, world, began_all("done", reads_in), 60, "the reads' ends")
            server.restart()
            for run in runs:
                fleet_agent.go_file(run).touch()
            found = anyio.run(outcomes_of, url, runs, 60.0)
            worker.stop()
        finally:
            worker.kill()
        report = haltwise.verify_store(url)
    finally:
        server.stop()
    assert report.ok, report.findings
    for run in runs:
        assert found[run].state is State.COMPLETED, (run, found[run])
        assert [s.status for s in found[run].steps] == [StepStatus.COMMITTED] * 2
    executions = read_executions(world)
    charged = Counter(e.run for e in executions if e.kind == "start" and e.index == 0)
    assert charged == dict.fromkeys(runs, 1), charged  # never charged twice
    keys = [line.split() for line in (world / "charges").read_text().splitlines()]
    assert sorted(run for run, _, _ in keys) == sorted(runs)


def began_all(kind: str, wanted: list[tuple[str, int]]) -> Callable[[list[Execution]], bool]:
    """Whether every (run, index) of ``wanted`` has an execution line of ``kind``."""
    return lambda found: set(wanted) <= {(e.run, e.index) for e in found if e.kind == kind}


async def outcomes_of(url: str, runs: list[str], timeout: float) -> dict[str, Outcome]:
    async with Runtime(url) as runtime:
        with anyio.fail_after(timeout):
            return {run: await runtime.outcome(run) for run in runs}
