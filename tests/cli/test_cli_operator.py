"""The operator's verbs on the command line, as real processes, on SQLite and on PostgreSQL:
``cancel ID...`` in one transaction, ``cancel --all``, the cancel of a run nobody works (owner
killed, or released by a worker), ``prune`` and ``list --task --limit``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_kit import AGENT, PATIENCE, Env, error_line, finish, statuses, step_is


@pytest.fixture(params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    (tmp_path / "agent.py").write_text(AGENT)
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    return Env(tmp_path, url)


def as_json(done: object) -> dict[str, object]:
    assert hasattr(done, "stdout")
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def test_cancel_several_ids_in_one_command(env: Env) -> None:
    first = env.start_flow("r1", "interruptible", "--json")
    second = env.start_flow("r2", "interruptible", "--json")
    env.release("send_email")
    assert (
        env.hw("run", "agent.py:flow", "--id", "done", "--input", '{"policy": "finish"}').returncode
        == 0
    )
    done = env.hw("cancel", "r1", "r2", "done", "nope", "--reason", "budget", "--json")
    assert done.returncode == 2  # an unknown id is bad input; the others are cancelled
    assert json.loads(done.stdout) == {
        "cancelled": ["r1", "r2"],
        "already_final": ["done"],
        "unknown": ["nope"],
    }
    assert "nope" in done.stderr and "Traceback" not in done.stderr
    for process in (first, second):
        code, outcome, _ = finish(process)
        assert code == 3
        assert isinstance(outcome, dict)
        assert (outcome["state"], outcome["reason"]) == ("cancelled", "budget")
    assert env.hw("check").returncode == 0


def test_cancel_all_by_task_and_state_with_a_dry_run(env: Env) -> None:
    running = env.start_flow("r1", "interruptible", "--json")
    assert (
        env.hw(
            "submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", "p1"
        ).returncode
        == 0
    )
    assert env.hw("run", "agent.py:boom", "--id", "b1").returncode == 1
    dry = env.hw("cancel", "--all", "--task", "flow", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert sorted(as_json(dry)["would_cancel"]) == ["p1", "r1"]  # type: ignore[arg-type]
    assert env.status("p1")["state"] == "pending"  # type: ignore[index]
    pending_only = env.hw("cancel", "--all", "--state", "pending", "--json")
    assert as_json(pending_only) == {"cancelled": ["p1"], "already_final": [], "unknown": []}
    assert env.status("p1")["state"] == "cancelled"  # type: ignore[index]
    rest = env.hw("cancel", "--all", "--task", "agent.py:flow", "--reason", "sweep")
    assert rest.returncode == 0 and "cancel requested for run r1" in rest.stdout
    code, outcome, _ = finish(running)
    assert code == 3 and isinstance(outcome, dict) and outcome["reason"] == "sweep"
    assert env.status("b1")["state"] == "failed"  # type: ignore[index]
    nothing = env.hw("cancel", "--all", "--json")
    assert as_json(nothing) == {"cancelled": [], "already_final": [], "unknown": []}


def test_cancel_of_a_killed_runs_rollback_step_compensates_it_there(env: Env) -> None:
    process = env.start_flow("r1", "rollback", "--json")
    process.kill()
    process.communicate()
    done = env.hw("cancel", "r1", "--wait", timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    assert "settled here" in done.stdout
    settled = env.status("r1")
    assert settled is not None
    assert (settled["state"], settled["reason"]) == ("cancelled", "user")
    assert statuses(settled) == ["committed", "committed", "compensated"]
    assert env.effects().count("undo_note") == 1  # the compensation ran, in the cancel command
    assert env.hw("check").returncode == 0


def test_cancel_wait_of_a_killed_finish_step_does_not_hang(env: Env) -> None:
    process = env.start_flow("r1", "finish", "--json")
    process.send_signal(signal.SIGKILL)
    process.communicate()
    done = env.hw("cancel", "r1", "--wait", "--json", timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    assert as_json(done)["cancelled"] == ["r1"]
    settled = env.status("r1")
    assert settled is not None and settled["state"] == "cancelled"
    assert step_is(settled, 2, "unknown")  # a finish step cut off by a crash
    assert settled["retry"] == "reconcile"
    assert "send_email" not in env.effects()


def test_cancel_of_a_run_a_worker_released(env: Env) -> None:
    assert (
        env.hw(
            "submit", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--id", "w1"
        ).returncode
        == 0
    )
    worker = env.popen("worker", "agent.py")
    env.wait_for("w1", "its step in flight", lambda s: step_is(s, 2, "running"))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=PATIENCE) == 0
    released = env.status("w1")
    assert released is not None and released["state"] == "running"
    done = env.hw("cancel", "w1", "--wait", timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    settled = env.status("w1")
    assert settled is not None and settled["state"] == "cancelled"
    assert statuses(settled) == ["committed", "committed", "interrupted"]
    assert "think" not in env.effects() and env.effects().count("record:done") == 0


def test_cancel_all_loads_an_orphans_task_so_its_rollback_step_is_compensated(
    env: Env,
) -> None:
    process = env.start_flow("r1", "rollback", "--json")
    process.kill()
    process.communicate()
    done = env.hw("cancel", "--all", "--task", "flow", "--wait", "--json", timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    assert as_json(done)["cancelled"] == ["r1"]
    settled = env.status("r1")
    assert settled is not None and settled["state"] == "cancelled"
    assert statuses(settled) == ["committed", "committed", "compensated"]
    assert env.effects().count("undo_note") == 1


def test_an_orphan_whose_file_is_not_trusted_is_left_for_a_worker_of_its_file(
    env: Env, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Run from another project, the cancel command may not load the run's file: settling the
    rollback step there would leave it unknown (no compensation), so it does not settle it; it
    says so in one line and names the command that does, which then compensates it."""
    process = env.start_flow("r1", "rollback", "--json")
    process.kill()
    process.communicate()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    done = run_in(env, elsewhere, "cancel", "r1")
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert "r1 stays cancelling" in line and f"haltwise worker {env.agent}" in line
    assert "Traceback" not in done.stderr
    waited = run_in(env, elsewhere, "cancel", "r1", "--wait")
    assert waited.returncode == 2  # waiting would never end: it says why instead of hanging
    assert waited.stderr.startswith("haltwise: error: run r1 stays cancelling")
    left = env.status("r1")
    assert left is not None and left["state"] == "cancelling"
    assert step_is(left, 2, "running") and "undo_note" not in env.effects()
    worker = env.popen("worker", "agent.py")
    try:
        settled = env.wait_for("r1", "cancelled", lambda s: s["state"] == "cancelled")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=PATIENCE) == 0
    assert statuses(settled) == ["committed", "committed", "compensated"]
    assert env.effects().count("undo_note") == 1


def run_in(env: Env, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``haltwise ARGS`` run from another directory (another project) on the env's store."""
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args, "--store", env.store],
        cwd=cwd,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=PATIENCE,
    )


#: What a command that only reads or requests must not import (CONTRACT.md's speed target for
#: ``haltwise cancel ID``): the machinery that works runs, rich, the server, the explorer.
HEAVY_MODULES = (
    "haltwise._runtime.runtime",
    "haltwise._runtime.steps",
    "haltwise._runtime.takeover",
    "haltwise._runtime.loader",
    "haltwise._analysis",
    "haltwise.server",
    "haltwise.integrations",
    "rich",
    "starlette",
    "uvicorn",
    "pydantic",
)


#: What ``haltwise cancel ID`` must not import beyond :data:`HEAVY_MODULES` (issue 35, item 3:
#: the command typed under pressure writes its request without an event loop): asyncio and
#: anyio (psycopg imports asyncio itself, so PostgreSQL allows that one), a store's machinery
#: (writer thread, pool), the seat that opens one.
CANCEL_HEAVY = (
    *HEAVY_MODULES,
    "asyncio",
    "anyio",
    "haltwise._runtime.seat",
    "haltwise._journal.sqlite",
    "haltwise._journal.sqlite_writer",
    "haltwise._journal.postgres",
    "psycopg_pool",
)


def heavy_imports(
    done: subprocess.CompletedProcess[str],
    allowed: tuple[str, ...] = (),
    *,
    heavy: tuple[str, ...] = HEAVY_MODULES,
    sees: str = "haltwise._runtime.seat",
) -> list[str]:
    """The ``heavy`` modules (and their submodules) a ``python -X importtime`` process
    imported, read from its stderr, but the ``allowed`` ones; ``sees``, a module the command
    imports, shows that the measurement sees our modules."""
    modules = {
        line.rpartition("|")[2].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert sees in modules
    return sorted(
        module
        for module in modules
        for name in heavy
        if name not in allowed and (module == name or module.startswith(name + "."))
    )


def importtime(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "haltwise", *args],
        cwd=env.root,
        env=env.environ(),
        text=True,
        capture_output=True,
        timeout=PATIENCE,
    )


def test_cancel_of_a_worked_run_imports_no_runtime_machinery(env: Env) -> None:
    process = env.start_flow("r1", "interruptible", "--json")
    done = importtime(env, "cancel", "r1")
    assert done.returncode == 0, done.stderr
    assert "cancel requested for run r1" in done.stdout
    allowed = ("asyncio",) if env.store.startswith("postgres") else ()
    assert heavy_imports(done, allowed, heavy=CANCEL_HEAVY, sees="haltwise._runtime.seat_now") == []
    code, outcome, _ = finish(process)
    assert code == 3 and isinstance(outcome, dict) and outcome["state"] == "cancelled"


@pytest.mark.parametrize(
    ("args", "allowed"),
    [
        (("status", "r1", "--json"), ()),
        (("status", "r1"), ("rich",)),  # a person's summary is drawn by rich
        (("list", "--json"), ()),
        (("list", "--awaiting", "--json"), ()),
        (("pause", "r1"), ()),
        (("unpause", "r1"), ()),
        (("prune", "--older-than", "1d"), ()),
    ],
)
def test_the_commands_that_read_or_request_import_no_runtime_machinery(
    env: Env, args: tuple[str, ...], allowed: tuple[str, ...]
) -> None:
    env.release("send_email")
    ran = env.hw("run", "agent.py:flow", "--id", "r1", "--input", '{"policy": "finish"}')
    assert ran.returncode == 0, ran.stderr
    done = importtime(env, *args)
    assert done.returncode == 0, done.stderr
    assert heavy_imports(done, allowed) == []


def test_prune_deletes_only_final_runs_older_than_asked(env: Env) -> None:
    running = env.start_flow("r1", "interruptible", "--json")
    assert env.hw("run", "agent.py:boom", "--id", "b1").returncode == 1
    assert env.hw("run", "agent.py:boom", "--id", "b2").returncode == 1
    recent = env.hw("prune", "--older-than", "30d", "--json")
    assert as_json(recent) == {"pruned": []}
    dry = env.hw("prune", "--older-than", "0s", "--dry-run", "--json")
    assert sorted(as_json(dry)["would_prune"]) == ["b1", "b2"]  # type: ignore[arg-type]
    assert env.status("b1") is not None
    pruned = env.hw("prune", "--older-than", "0m", "--state", "failed", "--json")
    assert sorted(as_json(pruned)["pruned"]) == ["b1", "b2"]  # type: ignore[arg-type]
    assert env.status("b1") is None
    listed = as_json(env.hw("list", "--json"))["runs"]
    assert [run["id"] for run in listed] == ["r1"]  # type: ignore[index, union-attr]
    assert env.hw("check").returncode == 0
    assert "--older-than" in error_line(env.hw("prune", "--older-than", "soon"))
    assert "--state" in error_line(env.hw("prune", "--older-than", "1d", "--state", "running"))
    env.hw("cancel", "r1")
    assert finish(running)[0] == 3


def test_list_newest_first_by_task_with_a_limit(env: Env) -> None:
    (env.root / "other.py").write_text(AGENT)
    for run_id in ("a", "b", "c"):
        assert env.hw("run", "agent.py:boom", "--id", run_id).returncode == 1
    assert env.hw("run", "other.py:boom", "--id", "o").returncode == 1
    listed = as_json(env.hw("list", "--task", "agent.py:boom", "--limit", "2", "--json"))
    assert [run["id"] for run in listed["runs"]] == ["c", "b"]  # type: ignore[index, union-attr]
    everything = as_json(env.hw("list", "--json"))["runs"]
    assert [run["id"] for run in everything] == ["o", "c", "b", "a"]  # type: ignore[index, union-attr]
    ambiguous = error_line(env.hw("list", "--task", "boom"))
    assert "ambiguous" in ambiguous and "other.py:boom" in ambiguous
    assert as_json(env.hw("list", "--task", "nosuch", "--json")) == {"runs": []}
    (env.root / "other.py").unlink()
    assert "--limit" in error_line(env.hw("list", "--limit", "0"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("cancel",), "--all"),
        (("cancel", "r1", "--all"), "not both"),
        (("cancel", "r1", "--dry-run"), "go with --all"),
        (("cancel", "--all", "--state", "completed"), "--state"),
    ],
)
def test_cancel_usage_errors(env: Env, args: tuple[str, ...], says: str) -> None:
    assert says in error_line(env.hw(*args))
