"""LangGraph's own state after a cancel, continued in a new process (issue 27, items 3, 5, 6, 7, 9).

The app (``langgraph_app.py``) runs in its own processes, its thread checkpointed by LangGraph's
``AsyncSqliteSaver`` on a file; the cancel comes from another process (``haltwise cancel``); a new
process continues the thread (``ainvoke(None)``, or the input sent again). The scripted model
acts on what the conversation shows, with a fresh call id for every call. Effects are lines of a
ledger file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from haltwise.integrations._conversation import unsettled_text

APP = Path(__file__).with_name("langgraph_app.py")
PATIENCE = 60.0


def app(phase: str, store: str, where: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(APP), phase, store, str(where), run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome_of(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=PATIENCE)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + PATIENCE
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def ledger(where: Path, effect: str) -> list[str]:
    path = where / "ledger.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line == effect or line.startswith(effect + " ")]


def haltwise_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args], capture_output=True, text=True, timeout=PATIENCE
    )


def thread_messages(where: Path) -> list[Any]:
    """The messages of thread ``t1`` as its last checkpoint holds them."""
    with SqliteSaver.from_conn_string(str(where / "graph.db")) as saver:
        saved = saver.get_tuple({"configurable": {"thread_id": "t1"}})
    assert saved is not None
    messages: list[Any] = saved.checkpoint["channel_values"]["messages"]
    return messages


def shape(messages: list[Any]) -> list[str]:
    """Each message as its kind and, for a ToolMessage, its content."""
    kinds = {HumanMessage: "human", AIMessage: "ai"}
    return [
        f"tool: {m.content}" if isinstance(m, ToolMessage) else kinds[type(m)] for m in messages
    ]


def cancel_during(tool: str, store: str, where: Path) -> dict[str, Any]:
    """Run ``book`` as run r1, cancel it from another process while ``tool`` is in flight."""
    first = app("book", store, where, "r1")
    wait_for(where / f"entered-{tool}")
    cancelled = haltwise_cli("cancel", "r1", "--store", store)
    assert cancelled.returncode == 0, cancelled.stderr
    (where / "release-charge").touch()  # a finish call goes on to its end
    return outcome_of(first)


@pytest.mark.parametrize("phase", ["go_on", "again"])
def test_a_cancel_during_a_finish_call_leaves_it_in_the_checkpoint_with_its_result(
    tmp_path: Path, phase: str
) -> None:
    store = f"sqlite:///{tmp_path}/haltwise.db"
    (tmp_path / "release-lookup").touch()
    first = cancel_during("charge", store, tmp_path)
    assert (first["state"], first["reason"]) == ("cancelled", "user")
    assert [(s["tool"], s["status"]) for s in first["steps"]] == [
        ("model", "committed"),
        ("lookup", "committed"),
        ("model", "committed"),
        ("charge", "committed"),
    ]
    # the checkpoint LangGraph wrote as the run stopped holds the charge with its result
    assert shape(thread_messages(tmp_path)) == [
        "human",
        "ai",
        "tool: room costs 5",
        "ai",
        "tool: charged 5",
    ]
    second = outcome_of(app(phase, store, tmp_path, "r2"))
    assert (second["state"], second["result"]) == ("completed", "booked")
    assert ledger(tmp_path, "charge") == ["charge"]  # never charged twice
    # the model saw every call closed, each result right after its call, before any new input
    expected = "model HumanMessage AIMessage ToolMessage AIMessage ToolMessage"
    if phase == "again":
        expected += " HumanMessage"
    assert ledger(tmp_path, "model")[-1] == expected
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_call_the_cancel_interrupted_is_closed_with_the_same_text_in_every_process(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path}/haltwise.db"
    first = cancel_during("lookup", store, tmp_path)
    assert (first["state"], first["reason"]) == ("cancelled", "user")
    assert [(s["tool"], s["status"]) for s in first["steps"]] == [
        ("model", "committed"),
        ("lookup", "interrupted"),
    ]
    assert shape(thread_messages(tmp_path)) == ["human", "ai", f"tool: {unsettled_text(None)}"]
    (tmp_path / "release-lookup").touch()
    second = outcome_of(app("go_on", store, tmp_path, "r2"))
    assert (second["state"], second["result"]) == ("completed", "booked")
    assert ledger(tmp_path, "lookup") == ["lookup"]  # the interrupted one had no effect
    assert ledger(tmp_path, "charge") == ["charge"]
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_approval_interrupt_is_no_step_and_the_approved_call_runs_once(tmp_path: Path) -> None:
    """``HumanInTheLoopMiddleware`` asking approval inside a tool call (``per_call``): the
    interrupt is not journaled as a failed step, and the approval runs the call as its one
    step."""
    store = f"sqlite:///{tmp_path}/haltwise.db"
    (tmp_path / "release-lookup").touch()
    run = outcome_of(app("approve", store, tmp_path, "r1"))
    assert (run["state"], run["result"]) == ("completed", "booked")
    assert [(s["tool"], s["status"]) for s in run["steps"]] == [
        ("model", "committed"),
        ("lookup", "committed"),
        ("model", "committed"),
        ("charge", "committed"),
        ("model", "committed"),
    ]
    assert ledger(tmp_path, "asked for approval") == ["asked for approval"]
    assert ledger(tmp_path, "charge") == ["charge"]
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("phase", "reason"), [("host", "host"), ("timeout", "timeout")], ids=["Task.cancel", "timeout"]
)
def test_a_host_cancel_of_the_graph_run_leaves_the_finish_call_in_the_checkpoint(
    tmp_path: Path, phase: str, reason: str
) -> None:
    """The host cuts LangGraph's loop while ``charge`` (finish) is in flight: ``Task.cancel()``
    of a task the body runs ``ainvoke`` in (the body goes on after it), or an
    ``asyncio.timeout`` around ``ainvoke`` in the body itself. The call still finishes, the run
    ends cancelled (reason ``host``, or ``timeout``), and the checkpoint a new process reads holds
    the call's journaled result, so continuing the thread there charges nothing again."""
    store = f"sqlite:///{tmp_path}/haltwise.db"
    (tmp_path / "release-lookup").touch()
    first = outcome_of(app(phase, store, tmp_path, "r1"))
    assert (first["state"], first["reason"]) == ("cancelled", reason)
    assert [(s["tool"], s["status"]) for s in first["steps"]][-1] == ("charge", "committed")
    second = outcome_of(app("go_on", store, tmp_path, "r2"))
    assert (second["state"], second["result"]) == ("completed", "booked")
    assert ledger(tmp_path, "charge") == ["charge"]  # never charged twice
    assert shape(thread_messages(tmp_path))[:5] == [
        "human",
        "ai",
        "tool: room costs 5",
        "ai",
        "tool: charged 5",
    ]
    expected = "model HumanMessage AIMessage ToolMessage AIMessage ToolMessage"
    assert ledger(tmp_path, "model")[-1] == expected
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_node_langgraph_cancels_because_a_sibling_failed_is_no_host_cancel(
    tmp_path: Path,
) -> None:
    """``explode`` fails while ``lookup`` runs beside it: LangGraph cancels ``lookup`` and raises
    the failure, and the run fails with it, as it would without haltwise."""
    store = f"sqlite:///{tmp_path}/haltwise.db"
    run = outcome_of(app("sibling", store, tmp_path, "r1"))
    assert (run["state"], run["reason"]) == ("failed", None)
    assert run["error"] == {"type": "ValueError", "message": "the sibling failed"}
    assert sorted((s["tool"], s["status"]) for s in run["steps"]) == [
        ("explode", "failed"),
        ("lookup", "interrupted"),
        ("model", "committed"),
    ]
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_failed_call_the_model_saw_replays_the_same_error_text_in_a_new_process(
    tmp_path: Path,
) -> None:
    """``pay`` fails with an error whose type cannot be rebuilt from its text; the agent's
    ``ToolRetryMiddleware`` hands it to the model, which goes on; the run is cancelled from
    another process, then resumed in a new one: the failed call replays its error, the model
    reads the same text as the first time, and the run completes with one successful payment."""
    store = f"sqlite:///{tmp_path}/haltwise.db"
    first = app("declined", store, tmp_path, "r1")
    wait_for(tmp_path / "entered-lookup")
    cancelled = haltwise_cli("cancel", "r1", "--store", store)
    assert cancelled.returncode == 0, cancelled.stderr
    assert (outcome_of(first)["state"]) == "cancelled"
    (tmp_path / "release-lookup").touch()
    resumed = outcome_of(app("resume", store, tmp_path, "r1"))
    assert (resumed["state"], resumed["result"]) == ("completed", "paid")
    assert ledger(tmp_path, "pay") == ["pay 5", "pay 5"]  # declined once, then paid once
    declined = "Tool 'pay' failed after 1 attempt with Declined: card declined for 5."
    assert all(line.startswith(f"model {declined}") for line in ledger(tmp_path, "model")[1:])
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr


def test_tools_without_the_journaled_model_replay_their_committed_calls_in_a_new_process(
    tmp_path: Path,
) -> None:
    """The tool adapters alone (the model not journaled, asked again on resume, gives every call
    a fresh id): cancelled from another process during ``charge``, resumed in a new process, the
    committed calls replay by tool and arguments; nothing runs twice."""
    store = f"sqlite:///{tmp_path}/haltwise.db"
    (tmp_path / "release-lookup").touch()
    first = app("plain", store, tmp_path, "r1")
    wait_for(tmp_path / "entered-charge")
    cancelled = haltwise_cli("cancel", "r1", "--store", store)
    assert cancelled.returncode == 0, cancelled.stderr
    (tmp_path / "release-charge").touch()
    stopped = outcome_of(first)
    assert stopped["state"] == "cancelled"
    assert [(s["tool"], s["status"]) for s in stopped["steps"]] == [
        ("lookup", "committed"),
        ("charge", "committed"),
    ]
    resumed = outcome_of(app("resume", store, tmp_path, "r1"))
    assert (resumed["state"], resumed["result"]) == ("completed", "booked")
    assert ledger(tmp_path, "lookup") == ["lookup"]
    assert ledger(tmp_path, "charge") == ["charge"]
    assert len(ledger(tmp_path, "model")) == 5  # 2 in the first attempt, 3 on resume
    check = haltwise_cli("check", "--store", store)
    assert check.returncode == 0, check.stdout + check.stderr
