"""The step path's shielded cancel scope (``_journal/shield.py``): the very object
``anyio.CancelScope(shield=True)`` makes on the asyncio backend, made without anyio's lookup of
the running library, and a shield like it: a cancel of the scope around it waits until it ends.
Were anyio's private class moved, the fallback (anyio's own constructor) shields the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
import anyio._backends._asyncio as backend
import anyio.lowlevel
import pytest

from haltwise._journal import shield
from haltwise._journal.shield import shielded

pytestmark = pytest.mark.anyio


def fallback(monkeypatch: pytest.MonkeyPatch, moved: object) -> Callable[[], anyio.CancelScope]:
    """What ``shield._maker`` makes where anyio's backend class is ``moved`` (None: gone); the
    class is put back at once (anyio itself needs it)."""
    with monkeypatch.context() as patch:
        if moved is None:
            patch.delattr(backend, "CancelScope")
        else:
            patch.setattr(backend, "CancelScope", moved)
        return shield._maker()


@pytest.fixture(params=["fast", "fallback"])
def make(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[[], anyio.CancelScope]:
    return shielded if request.param == "fast" else fallback(monkeypatch, None)


@pytest.mark.parametrize("moved", [None, object], ids=["gone", "not a cancel scope"])
async def test_the_fallback_is_anyios_own_constructor(
    monkeypatch: pytest.MonkeyPatch, moved: object
) -> None:
    maker = fallback(monkeypatch, moved)
    assert maker.func is anyio.CancelScope  # type: ignore[attr-defined]
    made = maker()
    assert type(made) is backend.CancelScope and made.shield


async def test_shielded_is_the_scope_anyio_makes_and_not_the_fallback() -> None:
    made, anyios = shielded(), anyio.CancelScope(shield=True)
    assert type(made) is type(anyios)
    assert made.shield and not made.cancel_called
    # The fast path is in use: were anyio's private class gone, shielded() would still work
    # (anyio's own constructor), but every step would pay its lookup again; this says so.
    assert shield.shielded.func is not anyio.CancelScope  # type: ignore[attr-defined]


async def test_a_cancel_of_the_scope_around_it_lands_after_the_shield(
    make: Callable[[], anyio.CancelScope],
) -> None:
    entered, release = anyio.Event(), anyio.Event()
    reached: list[str] = []

    async def waiter() -> None:
        with make():
            entered.set()
            await release.wait()  # the cancel comes while this waits
            reached.append("end of the shielded wait")
        await anyio.lowlevel.checkpoint()  # the cancel lands here
        reached.append("after the shield")

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await entered.wait()
        group.cancel_scope.cancel()
        release.set()
    assert reached == ["end of the shielded wait"]


async def test_a_native_cancel_still_reaches_the_shielded_wait(
    make: Callable[[], anyio.CancelScope],
) -> None:
    """As in anyio's own shield: only cancel scopes are held off, not ``Task.cancel()``."""
    entered = anyio.Event()

    async def waiter() -> None:
        with make():
            entered.set()
            await anyio.Event().wait()  # nothing sets it: only the native cancel ends this

    task = asyncio.ensure_future(waiter())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
