"""A stop pressed before the run exists (CONTRACT.md, "Command line": ``cancel --before-start``):
remembered for an id no run has, then the run started or submitted with that id is recorded
``cancelled`` at once with nothing run; forgotten after the TTL; an existing id is cancelled as
usual. On both stores; the command line's and the API's forms are in tests/cli and
tests/server."""

from __future__ import annotations

import time

import anyio
import pytest

import haltwise
from haltwise import State

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@haltwise.tool(cancel="interruptible", effect="write", idempotent=True)
async def write_row(text: str) -> str:
    RAN.append(text)
    return text


@haltwise.task(name="before_start:job")
async def job(text: str = "row") -> str:
    return await write_row(text)


async def test_a_start_after_a_remembered_cancel_runs_nothing(store_url: str) -> None:
    RAN.clear()
    async with haltwise.Runtime(store_url) as rt:
        remembered = await rt.cancel("j1", reason="stop pressed", before_start=True)
        assert remembered is None, "no run had that id: the cancel is remembered"
        handle = await rt.start(job, task_id="j1")
        outcome = await handle.outcome()
        assert outcome.state is State.CANCELLED
        assert outcome.reason == "stop pressed"
        assert outcome.steps == ()
        events = (await rt.inspect("j1")).events
        assert [(e.source, e.target) for e in events] == [
            (None, State.PENDING),
            (State.PENDING, State.CANCELLED),
        ]
        # the cancel was used: the same id started again is that run, still cancelled
        again = await (await rt.start(job, task_id="j1")).outcome()
        assert again.state is State.CANCELLED
        # a submitted run is recorded cancelled the same way, and no worker ever runs it
        assert await rt.cancel("j2", before_start=True) is None
        run_id, created = await rt.submit(job, task_id="j2")
        assert created and (await rt.status(run_id)).state is State.CANCELLED
    assert RAN == []


async def test_a_remembered_cancel_expires_after_its_ttl(store_url: str) -> None:
    RAN.clear()
    async with haltwise.Runtime(store_url) as rt:
        ttl = 0.2
        assert await rt.cancel("j1", before_start=True, ttl=ttl) is None
        until = time.time() + ttl
        while time.time() <= until:  # the wall clock the store compares with
            await anyio.sleep(0.02)
        outcome = await (await rt.start(job, task_id="j1")).outcome()
    assert outcome.state is State.COMPLETED
    assert RAN == ["row"]


async def test_an_existing_id_is_cancelled_as_usual(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        run_id, _ = await rt.submit(job, task_id="j1")
        record = await rt.cancel(run_id, before_start=True)
        assert record is not None and record.state is State.CANCELLED
        with pytest.raises(haltwise.InputError):
            await rt.cancel("j2", before_start=True, ttl=0)
