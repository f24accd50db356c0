"""Fork: a new run replays its source's steps before N, runs the rest anew, and says so first."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import haltwise
from _cli_kit import Env, env_on, error_line
from haltwise import State, StepStatus

pytestmark = pytest.mark.anyio

calls: Counter[str] = Counter()
keys: dict[str, list[str]] = {}


def _count(name: str) -> None:
    calls[name] += 1
    keys.setdefault(name, []).append(haltwise.idempotency_key())


@haltwise.tool(cancel="interruptible", effect="read")
async def look(topic: str) -> str:
    _count("look")
    return f"seen {topic}"


@haltwise.tool(cancel="finish", effect="write")
async def note(text: str) -> str:
    _count("note")
    return text.upper()


@haltwise.tool(cancel="finish", effect="external")
async def mail(text: str) -> str:
    _count("mail")
    return f"mailed {text}"


@haltwise.task(name="test_fork:chain")
async def chain(topic: str) -> list[Any]:
    seen = await look(topic)
    haltwise.emit(seen)
    noted = await note(seen)
    mailed = await mail(noted)
    haltwise.emit(mailed)
    return [seen, noted, mailed, await note("done")]


@pytest.fixture(autouse=True)
def _fresh() -> None:
    calls.clear()
    keys.clear()


async def test_a_fork_replays_the_steps_before_n_and_runs_the_rest(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        source = await (await rt.start(chain, "cats", task_id="src")).outcome()
        before = await rt.store.load("src")
        plan = await rt.fork_plan("src", from_step=2)
        assert [(s.index, s.tool) for s in plan.repeated] == [(2, "mail"), (3, "note")]
        assert [s.index for s in plan.replayed] == [0, 1]
        handle = await rt.fork("src", from_step=2, new_id="f1")
        forked = await handle.outcome()
        events = await rt.store.events("f1")
        after = await rt.store.load("src")
    assert forked.state is State.COMPLETED
    assert forked.result == source.result
    assert forked.partials == source.partials
    assert calls == Counter({"look": 1, "note": 3, "mail": 2}), "steps 0-1 replayed, 2-3 ran"
    assert [s.status for s in forked.steps] == [StepStatus.COMMITTED] * 4
    assert [s.idempotency_key for s in forked.steps[:2]] == [
        s.idempotency_key for s in source.steps[:2]
    ]
    assert forked.steps[2].idempotency_key != source.steps[2].idempotency_key
    assert after == before, "the source run is not changed"
    assert (events[0].source, events[0].target) == (None, State.PENDING)
    assert events[0].reason == "fork of src from step 2"
    assert (await rt_check(store_url)).ok


async def rt_check(store_url: str) -> Any:
    from haltwise._journal.check import verify

    async with haltwise.Runtime(store_url) as rt:
        return await verify(rt.store)


async def test_a_fork_from_step_0_runs_everything_and_from_the_end_nothing(
    store_url: str,
) -> None:
    async with haltwise.Runtime(store_url) as rt:
        await (await rt.start(chain, "cats", task_id="src")).outcome()
        calls.clear()
        await (await rt.fork("src", from_step=0, new_id="all")).outcome()
        assert calls == Counter({"look": 1, "note": 2, "mail": 1})
        calls.clear()
        assert (await rt.fork_plan("src", from_step=4)).repeated == ()
        done = await (await rt.fork("src", from_step=4, new_id="none")).outcome()
    assert done.state is State.COMPLETED
    assert calls == Counter()


async def test_a_fork_refuses_what_it_cannot_replay(store_url: str) -> None:
    @haltwise.tool(cancel="interruptible", effect="read")
    async def broken() -> None:
        raise ValueError("down")

    @haltwise.task(name="test_fork:fails")
    async def fails() -> None:
        await look("x")
        await broken()

    async with haltwise.Runtime(store_url) as rt:
        await (await rt.start(chain, "cats", task_id="src")).outcome()
        with pytest.raises(haltwise.InputError, match="has 4 steps"):
            await rt.fork("src", from_step=5)
        with pytest.raises(haltwise.InputError, match="exists already"):
            await rt.fork("src", from_step=1, new_id="src")
        with pytest.raises(haltwise.UnknownRunError):
            await rt.fork("missing", from_step=0)
        failed = await (await rt.start(fails, task_id="bad")).outcome()
        assert failed.state is State.FAILED
        with pytest.raises(haltwise.InputError, match=r"step 1 \(broken\) is failed"):
            await rt.fork("bad", from_step=2)
        again = await (await rt.fork("bad", from_step=1, new_id="bad2")).outcome()
        ids = [run.id for run in await rt.store.list_runs()]
    assert again.state is State.FAILED
    assert sorted(ids) == ["bad", "bad2", "src"], "a refused fork records nothing"


# -- the command line ----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    return env_on(request, tmp_path)


def test_fork_dry_run_lists_what_runs_again_and_the_fork_runs_it(env: Env) -> None:
    env.release("send_email")
    done = env.hw("run", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "s1")
    assert done.returncode == 0, done.stderr
    dry = env.hw("fork", "s1", "--from-step", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "fork of run s1 from step 2: steps 0-1 replayed" in dry.stdout
    assert "step 2 send_email (external)" in dry.stdout
    assert "step 3 record (write)" in dry.stdout
    assert [r["id"] for r in json.loads(env.hw("list", "--json").stdout)["runs"]] == ["s1"]
    dry_json = env.hw("fork", "s1", "--from-step", "3", "--dry-run", "--json")
    assert json.loads(dry_json.stdout) == {
        "source": "s1",
        "from_step": 3,
        "will_repeat": [{"index": 3, "tool": "record", "effect": "write"}],
        "id": None,
    }
    shown = env.hw("fork", "s1", "--from-step", "2", "--id", "f1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.index("step 2 send_email") < shown.stdout.index("state: completed")
    forked = env.hw("fork", "s1", "--from-step", "2", "--id", "f2", "--json")
    assert forked.returncode == 0, forked.stderr
    outcome = json.loads(forked.stdout)
    assert (outcome["id"], outcome["state"], outcome["result"]) == ("f2", "completed", "sent cats")
    assert outcome["fork"]["will_repeat"][0] == {
        "index": 2,
        "tool": "send_email",
        "effect": "external",
    }
    effects = Counter(env.effects())
    assert effects["search"] == 1 and effects["record:cats"] == 1, "replayed, not run"
    assert effects["send_email"] == 3 and effects["record:done"] == 3
    source = env.status("s1")
    assert source is not None and [s["attempts"] for s in source["steps"]] == [1, 1, 1, 1]
    assert env.hw("check").returncode == 0


def test_fork_exit_code_follows_the_fork_and_bad_input_is_exit_2(env: Env) -> None:
    assert env.hw("run", "agent.py:boom", "--id", "b").returncode == 1
    assert env.hw("fork", "b", "--from-step", "1").returncode == 1
    assert "has 1 steps" in error_line(env.hw("fork", "b", "--from-step", "7"))
    assert "no run with id 'nope'" in error_line(env.hw("fork", "nope", "--from-step", "0"))
    assert "exists already" in error_line(env.hw("fork", "b", "--from-step", "0", "--id", "b"))
    error_line(env.hw("fork", "b"))  # --from-step is required


@haltwise.tool(cancel="finish", effect="write")
async def noisy(text: str) -> str:
    haltwise.emit({"inside": text})
    _count("noisy")
    return text


@haltwise.task(name="test_fork:chatty")
async def chatty() -> list[str]:
    haltwise.emit("begin")
    first = await noisy("a")
    haltwise.emit("between")
    second = await noisy("b")
    return [first, second]


async def test_a_fork_keeps_the_partials_of_the_steps_it_replays(store_url: str) -> None:
    async with haltwise.Runtime(store_url) as rt:
        source = await (await rt.start(chatty, task_id="src")).outcome()
        forked = await (await rt.fork("src", from_step=1, new_id="f")).outcome()
    assert source.partials == ("begin", {"inside": "a"}, "between", {"inside": "b"})
    assert forked.state is State.COMPLETED
    assert calls["noisy"] == 3, "step 0 replayed, step 1 ran again"
    # the replayed step's partial is kept; the task's own are emitted again as it replays
    assert sorted(map(str, forked.partials)) == sorted(map(str, source.partials))
    assert forked.partials[0] == {"inside": "a"}
