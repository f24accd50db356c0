"""The runtime under random interleavings of start, concurrent steps, cancel, force, crash, resume,
pause and unpause, with a step that times out and is retried while the gate is closed.

A hypothesis state machine drives runs whose task makes three tool calls at once (interruptible,
finish, rollback), twice. The tools' bodies wait at their process's gate, which the machine opens
and closes. Each "process" is a runtime in an event loop of its own thread. A "crash" is kill -9
as far as the journal can tell: the process's event loop is frozen for good (nothing it holds runs
again, nothing of it is exited or cleaned up) and its runs are handed to an owner on a host that
is gone, lease expired, as the dead process's would be once its lease ran out. A new process then
resumes what it likes. A crashed process may also come back (it had only stalled) and shut down:
it must cancel none of the runs taken from it.

After every rule: no step is ``running`` in a final run, the store is sound (a step left running
by the crashed owner is the one allowed finding until a resume takes it over), and no committed
step's body ever began again (but in a crashed process that came back: see ``Process.thaw``).
Every wait on a process is bounded (``DEADLINE``): a hang fails.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

import anyio
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import haltwise
from haltwise import State, StepStatus
from haltwise._core.records import Owner
from haltwise._journal.check import CheckReport, verify
from haltwise._journal.store import JournalRows

_T = TypeVar("_T")

#: seconds any one operation on a process may take before the test fails (a hang is a bug)
DEADLINE = 60.0
#: crashes per example
MAX_CRASHES = 3

#: body starts per idempotency key (one key per step, the same in every attempt)
STARTS: Counter[str] = Counter()
#: body starts by a crashed process after it came back (see :meth:`Process.thaw`)
LATE_STARTS: Counter[str] = Counter()
_LOCK = threading.Lock()


class Process:
    """One runtime in an event loop of its own thread, as one process would hold it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.gate = asyncio.Event()  # bound to the process's loop at its first wait
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._thaw = threading.Event()
        self.came_back = False
        self.thread = threading.Thread(target=self._main, name="machine process", daemon=True)
        self.thread.start()
        if not self._ready.wait(DEADLINE):
            raise AssertionError("a runtime did not start")
        if self._failure is not None:
            raise self._failure

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported by stop() (or __init__)
            self._failure = error
            self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        PROCESSES[self.loop] = self
        async with haltwise.Runtime(self.url) as runtime:
            self.runtime = runtime
            self._ready.set()
            await self._stop.wait()
            self.gate.set()  # shutting down: the bodies end, the runs settle by policy

    def call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Await ``fn()`` on the process's loop and return what it returned (or raise)."""

        async def run() -> _T:
            return await fn()

        future: Future[_T] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(timeout=DEADLINE)

    def open_gate(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)

    def close_gate(self) -> None:
        def close() -> None:
            if self.gate.is_set():  # bodies already waiting keep waiting on the closed one
                self.gate = asyncio.Event()

        self.call(_sync(close))

    def freeze(self) -> None:
        """kill -9 as the journal sees it: the loop stops between two callbacks, its thread
        blocked, and nothing of it runs or is exited until :meth:`thaw` (if ever)."""
        frozen = threading.Event()
        self._thaw = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (frozen.set(), self._thaw.wait()))
        if not frozen.wait(DEADLINE):
            raise AssertionError("a process's loop did not come to its freeze")

    def thaw(self) -> None:
        """The process comes back after its lease ran out (a stall, not a death).

        A step whose start it had journaled but whose body it had not begun when it stalled
        begins then: its runs were taken over meanwhile (its writes are refused from now on),
        but no lease can stop a body that was about to begin. Such late starts are counted
        apart: the new owner may have run that step too (a limit of leases, not checked here).
        """
        self.came_back = True
        self._thaw.set()

    def stop(self) -> None:
        """Leave the runtime's ``async with`` block (a clean shutdown) and end the thread."""
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "a runtime did not shut down"
        if self._failure is not None:
            raise self._failure


def _sync(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        fn()

    return call


#: the process of each event loop (a body waits at its own process's gate)
PROCESSES: dict[asyncio.AbstractEventLoop, Process] = {}


async def _at_gate() -> None:
    process = PROCESSES[asyncio.get_running_loop()]
    with _LOCK:
        (LATE_STARTS if process.came_back else STARTS)[haltwise.idempotency_key()] += 1
    await process.gate.wait()


@haltwise.tool(cancel="interruptible", effect="read")
async def peek(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="finish", effect="external", grace=0.5)
async def pay(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="rollback", effect="write", compensate=lambda i: None, grace=0.5)
async def store_row(i: int) -> int:
    await _at_gate()
    return i


@haltwise.tool(cancel="interruptible", effect="read", timeout=0.2, retries=1, backoff=(0, 1, 0))
async def glance(i: int) -> int:
    """Times out (and is retried once) while the gate is closed."""
    await _at_gate()
    return i


@haltwise.task(name="machine:three_at_once")
async def three_at_once() -> list[int]:
    first = await asyncio.gather(peek(0), pay(1), store_row(2))
    second = await asyncio.gather(pay(3), peek(4), glance(5))
    return [*first, *second]


async def _look(url: str) -> tuple[JournalRows, CheckReport]:
    """The whole journal (one snapshot) and what ``check`` says of it."""
    store = haltwise.Runtime(url).store
    await store.open()
    try:
        return await store.read_journal(), await verify(store)
    finally:
        await store.close()


async def _hand_to_the_dead(url: str, token: str) -> None:
    """Give every run ``token`` holds to an owner on a host that is gone, lease expired."""
    store = haltwise.Runtime(url).store
    await store.open()
    try:
        ghost = Owner(token=uuid.uuid4().hex, host="gone.invalid", pid=1, started=0.0)
        for run in await store.list_runs():
            if run.owner is not None and run.owner.token == token:
                await store.claim(run.id, ghost, lease_until=time.time() - 1, expected_owner=token)
    finally:
        await store.close()


class RuntimeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="haltwise-machine-")
        self.url = f"sqlite:///{self.directory}/journal.db"
        STARTS.clear()
        LATE_STARTS.clear()
        self.process = Process(self.url)
        #: the crashed processes, frozen
        self.frozen: list[Process] = []
        self.runs: list[str] = []
        #: body starts of each committed step's key, when it was first seen committed
        self.committed: dict[str, int] = {}

    def _call(self, fn: Callable[[haltwise.Runtime], Awaitable[_T]]) -> _T:
        runtime = self.process.runtime
        return self.process.call(lambda: fn(runtime))

    def _run(self, which: int) -> str:
        return self.runs[which % len(self.runs)]

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: len(self.runs) < 3)
    @rule()
    def start(self) -> None:
        run_id = f"r{len(self.runs)}"
        self._call(lambda rt: rt.start(three_at_once, task_id=run_id))
        self.runs.append(run_id)

    @rule()
    def open_gate(self) -> None:
        self.process.open_gate()

    @rule()
    def close_gate(self) -> None:
        self.process.close_gate()

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2), force=st.booleans())
    def cancel(self, which: int, force: bool) -> None:
        run_id = self._run(which)
        self._call(lambda rt: rt.cancel(run_id, force=force))

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def pause(self, which: int) -> None:
        run_id = self._run(which)
        self._call(lambda rt: rt.pause(run_id))

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def unpause(self, which: int) -> None:
        run_id = self._run(which)
        try:  # a paused run whose owner crashed is taken over and continued here
            self._call(lambda rt: rt.unpause(run_id))
        except haltwise.RunOwnedError:
            pass

    @precondition(lambda self: bool(self.runs) and len(self.frozen) < MAX_CRASHES)
    @rule()
    def crash(self) -> None:
        old = self.process
        old.freeze()
        self.frozen.append(old)
        anyio.run(_hand_to_the_dead, self.url, old.runtime.owner.token)
        self.process = Process(self.url)

    @precondition(lambda self: bool(self.frozen))
    @rule(which=st.integers(0, MAX_CRASHES - 1))
    def come_back(self, which: int) -> None:
        """A crashed process had only stalled: it comes back, past its lease, and shuts down."""
        stale = self.frozen.pop(which % len(self.frozen))
        stale.thaw()
        stale.stop()

    @precondition(lambda self: bool(self.runs))
    @rule(which=st.integers(0, 2))
    def resume(self, which: int) -> None:
        run_id = self._run(which)
        self._call(lambda rt: _resume(rt, run_id))

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def the_journal_keeps_its_promises(self) -> None:
        journal, report = anyio.run(_look, self.url)
        problems = [f for f in report.findings if f.code != "orphaned-step"]
        assert not problems, problems  # a step the crashed left running awaits a takeover
        for run in journal.runs:
            steps = journal.steps.get(run.id, ())
            if run.state.is_final:
                assert all(s.status is not StepStatus.RUNNING for s in steps), (run, steps)
            # only the crashed processes shut down before the teardown, and their runs were
            # taken from them: no run is cancelled for a shutdown
            assert run.reason != "shutdown", run
            for step in steps:
                if step.status is StepStatus.COMMITTED:
                    with _LOCK:
                        seen = STARTS[step.idempotency_key]
                    first = self.committed.setdefault(step.idempotency_key, seen)
                    assert seen == first, f"step {step.index} of {run.id} ran again"

    def teardown(self) -> None:
        try:
            while self.frozen:
                self.come_back(0)
            self.process.stop()
            journal, report = anyio.run(_look, self.url)
            assert all(f.code == "orphaned-step" for f in report.findings), report
            late = sum(LATE_STARTS.values())
            event(f"bodies begun late by a crashed process that came back: {late}")
            for run in journal.runs:  # seen with --hypothesis-show-statistics
                event(f"a run ends {run.state} with {run.reason or 'no reason'}")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


async def _resume(runtime: haltwise.Runtime, run_id: str) -> None:
    """Resume ``run_id`` here unless it is worked here or completed, rerunning unknown steps."""
    outcome = await runtime.status(run_id)
    if runtime.is_active(run_id) or outcome.state is State.COMPLETED:
        return
    unknown = {s.index for s in outcome.steps if s.status is StepStatus.UNKNOWN}
    try:
        await runtime.resume(run_id, rerun=unknown)
    except (haltwise.RunOwnedError, haltwise.ResumeRefusedError):
        pass  # taken by the run's own settling meanwhile, or a step became unknown since


RuntimeMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_runtime_machine = RuntimeMachine.TestCase
