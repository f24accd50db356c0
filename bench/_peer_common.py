"""What every system's side of ``bench/peers.py`` shares.

A :class:`Trace` is the benchmark's own record of the run's code, kept in memory by the step
bodies and the task/workflow function themselves, so that every system is judged by the same
instrument rather than by what it reports about itself:

- ``started[i]``: how many times step ``i``'s body began;
- ``completed[i]``: how many times it ran to its end (the step's side effect: a step that
  completed twice repeated its side effect);
- ``active`` and ``last_exit``: how many pieces of the run's code are executing now, and when
  the last one stopped (``perf_counter`` seconds).

A cancel trial runs ``RUN_STEPS`` steps of ``STEP_SECONDS`` each, cancels at a moment drawn from
``cancel_moments`` (the same moments for every system), and reports a :class:`CancelTrial`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

#: one step's work in the cancel trials (an await, as a model call or an HTTP request would be)
STEP_SECONDS = 0.05
#: steps in one cancelled run
RUN_STEPS = 10
#: how long the run's code must stay quiet before the trial decides it has stopped
QUIET_SECONDS = 3 * STEP_SECONDS


@dataclass
class Trace:
    started: Counter[int] = field(default_factory=Counter)
    completed: Counter[int] = field(default_factory=Counter)
    active: int = 0
    last_exit: float = 0.0

    def reset(self) -> None:
        self.started.clear()
        self.completed.clear()
        self.active = 0
        self.last_exit = 0.0

    @contextmanager
    def code(self) -> Iterator[None]:
        """Marks a stretch of the run's own code (the task or workflow function)."""
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self.last_exit = time.perf_counter()

    async def step(self, index: int, seconds: float) -> int:
        """A step body: works ``seconds``, then does its side effect (counted)."""
        self.started[index] += 1
        with self.code():
            await asyncio.sleep(seconds)
            self.completed[index] += 1
        return index

    async def stopped_after(self, start: float, timeout: float = 10.0) -> float:
        """Seconds from ``start`` until the run's code last ran, once none of it has run for
        ``QUIET_SECONDS``; 0 if it had already stopped at ``start`` (a cancel that lands while
        the framework itself is busy, writing a checkpoint say, finds none of it running).

        Raises ``TimeoutError`` if the run's code is still running after ``timeout`` seconds.
        """
        limit = time.perf_counter() + timeout
        while time.perf_counter() < limit:
            if self.active == 0 and time.perf_counter() - self.last_exit >= QUIET_SECONDS:
                return max(0.0, self.last_exit - start)
            await asyncio.sleep(0.001)
        raise TimeoutError("the run's code did not stop")

    def repeated(self, committed: set[int], started_before: Counter[int]) -> tuple[int, int]:
        """(committed steps whose body began again, steps that completed more than once)."""
        rerun = sum(1 for i in committed if self.started[i] > started_before[i])
        twice = sum(1 for count in self.completed.values() if count > 1)
        return rerun, twice


@dataclass
class CancelTrial:
    """One cancel, then a resume. Times in seconds from just before the cancel call."""

    #: the cancel call returned to the caller
    told: float
    #: the caller could see the run in a final (cancelled) state
    final: float
    #: none of the run's code was running any more
    stopped: float
    #: steps the system recorded as done before the resume
    committed: int
    #: of those, how many began again on resume
    rerun_committed: int
    #: steps whose body ran to completion twice (a repeated side effect)
    completed_twice: int
    #: the resumed run completed every step
    resumed: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cancel_moments(trials: int, seed: int = 7) -> list[float]:
    """Seconds after the start at which each trial cancels: anywhere from inside the 2nd step
    to inside the 9th (the same list for every system)."""
    rng = random.Random(seed)
    span = RUN_STEPS * STEP_SECONDS
    return [rng.uniform(0.12 * span, 0.88 * span) for _ in range(trials)]
