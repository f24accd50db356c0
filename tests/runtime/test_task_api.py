"""What an integration calls (issue 30, item 2): ``haltwise.register_host_cancel`` declares a
framework's "I cancelled the agent" error, ``haltwise.register_replayable_error`` a framework's
error type a failed step replays as, and ``haltwise.cancel_current_run`` cancels the run the
calling code belongs to, all without reaching into the runtime.

Real runs on real stores (SQLite and PostgreSQL); the registration is process-wide, so each
test registers an error type of its own.
"""

from __future__ import annotations

import anyio
import pytest

import haltwise
from _wait import until
from haltwise import State, StepStatus
from haltwise._runtime import lowlevel

pytestmark = pytest.mark.anyio


class FrameworkStopped(Exception):
    """What a framework raises into the agent's code when it cancelled the agent itself."""


class FrameworkStoppedLater(FrameworkStopped):
    """A subclass: registering the base covers it."""


class NotACancel(Exception):
    """A framework error nobody registered: the run fails."""


haltwise.register_host_cancel(FrameworkStopped)


@haltwise.tool(cancel="interruptible", effect="read")
async def look(text: str) -> str:
    return text


@haltwise.task(name="task_api:stopped_by_framework")
async def stopped_by_framework(error: str) -> str:
    await look("a")
    raise {"stopped": FrameworkStopped, "later": FrameworkStoppedLater, "other": NotACancel}[error](
        "the framework stopped it"
    )


#: what cancel_current_run returned in the task below, each time it was called
RETURNED: list[bool] = []


@haltwise.task(name="task_api:cancels_itself")
async def cancels_itself() -> str:
    await look("a")
    RETURNED.append(await haltwise.cancel_current_run("framework stop"))
    await anyio.sleep(60)  # the cancel lands here
    return "not reached"


@pytest.mark.parametrize(
    ("error", "state"), [("stopped", "cancelled"), ("later", "cancelled"), ("other", "failed")]
)
async def test_a_registered_error_leaving_the_task_is_a_host_cancel(
    store_url: str, error: str, state: str
) -> None:
    async with haltwise.Runtime(store_url) as runtime:
        handle = await runtime.start(stopped_by_framework, error, task_id=f"r-{error}")
        outcome = await handle.outcome()
    assert outcome.state is State(state)
    assert outcome.reason == ("host" if state == "cancelled" else None)
    assert [step.status for step in outcome.steps] == [StepStatus.COMMITTED]


def test_only_exception_classes_are_registered() -> None:
    with pytest.raises(TypeError, match="not an exception class"):
        haltwise.register_host_cancel(FrameworkStopped, "RunCancelled")  # type: ignore[arg-type]
    haltwise.register_host_cancel(FrameworkStopped)  # twice: nothing changes


async def test_cancel_current_run_cancels_the_run_of_the_calling_code(store_url: str) -> None:
    RETURNED.clear()
    async with haltwise.Runtime(store_url) as runtime:
        handle = await runtime.start(cancels_itself, task_id="self")
        outcome = await handle.outcome()
    assert outcome.state is State.CANCELLED
    assert outcome.reason == "framework stop"
    assert RETURNED == [True]


async def test_cancel_current_run_outside_a_task_does_nothing() -> None:
    assert await haltwise.cancel_current_run() is False


def _framework_error() -> type[Exception]:
    """An error type a framework raises from tools, found by no name lookup (it is not a module
    attribute anywhere): only its registration lets a replay rebuild it."""

    class FrameworkRetry(Exception):
        """Ask the model again."""

    return FrameworkRetry


FRAMEWORK_RETRY = _framework_error()
haltwise.register_replayable_error(FRAMEWORK_RETRY)
#: the type of the error the task caught, in each attempt
CAUGHT: list[type[BaseException]] = []
GO_ON = anyio.Event()


@haltwise.tool(cancel="interruptible", effect="read")
async def ask_again() -> str:
    raise FRAMEWORK_RETRY("try another query")


@haltwise.tool(cancel="interruptible", effect="read")
async def wait_to_go_on() -> str:
    await GO_ON.wait()
    return "went on"


@haltwise.task(name="task_api:replays_a_framework_error")
async def replays_a_framework_error() -> str:
    try:
        await ask_again()
    except Exception as error:
        CAUGHT.append(type(error))
    return await wait_to_go_on()


async def test_a_registered_error_type_is_rebuilt_on_replay(store_url: str) -> None:
    global GO_ON
    CAUGHT.clear()
    GO_ON = anyio.Event()
    async with haltwise.Runtime(store_url) as first:
        await first.start(replays_a_framework_error, task_id="replay")
        await until(lambda: len(CAUGHT) == 1, "the first attempt caught the error")
        await lowlevel.hand_over(first)  # the run stays running, released: resumed below
    GO_ON.set()
    async with haltwise.Runtime(store_url) as second:
        handle = await second.resume("replay")
        outcome = await handle.outcome()
    assert outcome.state is State.COMPLETED
    assert CAUGHT == [FRAMEWORK_RETRY, FRAMEWORK_RETRY], "replayed as its own type"
    assert outcome.steps[0].status is StepStatus.FAILED


def test_only_exception_classes_are_replayable() -> None:
    with pytest.raises(TypeError, match="not an exception class"):
        haltwise.register_replayable_error(42)  # type: ignore[arg-type]
