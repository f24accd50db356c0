"""Task states, step statuses and the transition table: the state machine of a run.

Pure vocabulary: no I/O. The stores enforce :data:`TRANSITIONS` with compare-and-set in one
transaction, so a cancel racing a completion ends in exactly one final state.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """The state of one run of a task.

    ``CANCELLED``, ``COMPLETED`` and ``FAILED`` are final for a run; only ``resume`` leaves
    ``CANCELLED`` or ``FAILED`` (back to ``RUNNING``, same task id, same journal). ``PAUSED`` is
    not final: the run keeps its owner and waits at a checkpoint until it is unpaused (back to
    ``RUNNING``) or cancelled: straight to ``CANCELLED`` when nothing is left to settle, else
    through ``CANCELLING`` (a child run paused with it, a saga to run: see
    ``RunRecord.settle_on_cancel``).
    """

    #: recorded, not begun (``submit``, or the instant before a runtime begins it)
    PENDING = "pending"
    #: a runtime or worker is running the task function
    RUNNING = "running"
    #: a cancel was requested; the in-flight step is settling by its policy
    CANCELLING = "cancelling"
    #: a pause was requested and every in-flight step has ended: the run waits at a checkpoint
    PAUSED = "paused"
    #: stopped early on purpose; never shares a state with a failure
    CANCELLED = "cancelled"
    #: the task function returned
    COMPLETED = "completed"
    #: the task function raised (not because of a cancel)
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """True for ``cancelled``, ``completed`` and ``failed``."""
        return self in FINAL_STATES


FINAL_STATES = frozenset({State.CANCELLED, State.COMPLETED, State.FAILED})

#: Every allowed transition, and no others (CONTRACT.md, "Task states").
TRANSITIONS: frozenset[tuple[State, State]] = frozenset(
    {
        (State.PENDING, State.RUNNING),
        (State.PENDING, State.CANCELLED),
        (State.RUNNING, State.COMPLETED),
        (State.RUNNING, State.FAILED),
        (State.RUNNING, State.CANCELLING),
        (State.RUNNING, State.PAUSED),
        (State.PAUSED, State.RUNNING),
        (State.PAUSED, State.CANCELLED),
        (State.PAUSED, State.CANCELLING),
        (State.CANCELLING, State.CANCELLED),
        (State.CANCELLING, State.COMPLETED),
        (State.CANCELLED, State.RUNNING),
        (State.FAILED, State.RUNNING),
    }
)


def is_allowed(source: State, target: State) -> bool:
    """Whether the contract allows a run to go from ``source`` to ``target``."""
    return (source, target) in TRANSITIONS


def sources_of(target: State) -> frozenset[State]:
    """The states from which ``target`` may be entered."""
    return frozenset(src for src, dst in TRANSITIONS if dst is target)


#: The states a pause request applies to: such a run gains ``pause`` and moves to ``paused`` at
#: its next checkpoint with nothing in flight (CONTRACT.md, "Stopping verbs beyond cancel").
PAUSABLE_STATES = frozenset({State.PENDING, State.RUNNING})

#: The final states that ``resume`` leaves (back to ``running``, same id, same journal).
RESUMABLE_STATES = frozenset(state for state in sources_of(State.RUNNING) if state.is_final)


class StepStatus(StrEnum):
    """The status of one step (one tool call) in the journal."""

    #: journaled as started; the tool body may be running (or its owner died)
    RUNNING = "running"
    #: finished; its result is journaled and replayed on resume, never re-run
    COMMITTED = "committed"
    #: stopped by a cancel before it finished; runs again on resume
    INTERRUPTED = "interrupted"
    #: stopped by a cancel and its compensation ran; runs again on resume
    COMPENSATED = "compensated"
    #: nobody knows whether its effect happened (grace ran out, forced cancel, crash mid-call)
    UNKNOWN = "unknown"
    #: the tool raised; runs again on resume
    FAILED = "failed"
    #: a request for approval is journaled and waits for a decision; the body has not run
    AWAITING = "awaiting"
    #: its approval was refused or expired: the body never ran; a resume replays the refusal
    REFUSED = "refused"
