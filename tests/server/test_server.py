"""``haltwise serve`` over HTTP: a real uvicorn process on a loopback port, real requests.

Tokens and the session cookie, every error status of the contract, the body limit, the event
streams and their replay with ``Last-Event-ID``, and cancels through the API of runs worked by
other processes, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

import haltwise
from _cli_kit import PATIENT
from _serve import AGENT, PATIENCE, Served, events, start_server


@pytest.fixture
def served(tmp_path: Path, store_url: str) -> Iterator[Served]:
    with start_server(tmp_path, store_url, env={"HALTWISE_READ_TOKEN": "reader-token"}) as server:
        yield server


def finished(served: Served, run_id: str) -> dict[str, object]:
    final = ("completed", "cancelled", "failed")
    return served.wait_for(run_id, "a final state", lambda run: run["state"] in final)


def test_tokens_and_the_session_cookie(served: Served) -> None:
    assert served.get("/api/runs", token=None).error_code == "unauthorized"
    assert served.get("/api/runs", token=None).status == 401
    assert served.get("/api/runs", token="wrong").status == 401
    assert served.get("/", token=None).status == 401  # the dashboard needs a token too
    assert served.get("/api/runs", token="reader-token").status == 200
    refused = served.post("/api/cancel", {"ids": ["x"]}, token="reader-token")
    assert (refused.status, refused.error_code) == (403, "forbidden")
    assert served.post("/api/cancel", {"ids": ["x"]}).status == 200

    login = served.get(f"/?token={served.token}", token=None)
    assert login.status == 303 and login.headers["location"] == "/"
    cookie = login.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert served.token not in cookie  # the cookie holds a digest, never the token
    session = {"Cookie": cookie.split(";")[0]}
    assert served.get("/", token=None, headers=session).status == 200
    assert served.get("/api/runs", token=None, headers=session).status == 200
    origin = f"http://{served.host}"
    same = served.post(
        "/api/cancel", {"ids": ["x"]}, token=None, headers={**session, "Origin": origin}
    )
    assert same.status == 200
    for other in ({"Origin": "http://evil.example"}, {}):
        cross = served.post("/api/cancel", {"ids": ["x"]}, token=None, headers={**session, **other})
        assert (cross.status, cross.error_code) == (403, "cross_origin")
    assert served.get("/?token=nope", token=None).status == 401
    served.stop()
    assert served.process.stderr is not None
    logged = served.process.stderr.read()
    assert served.token not in logged and "reader-token" not in logged


def test_a_configured_token_is_never_printed_and_a_public_bind_needs_one(
    tmp_path: Path, sqlite_url: str
) -> None:
    with start_server(tmp_path, sqlite_url, env={"HALTWISE_TOKEN": "op-secret-123"}) as server:
        assert server.get("/api/runs").status == 200
    assert server.process.stdout is not None and server.process.stderr is not None
    printed = server.process.stdout.read() + server.process.stderr.read()
    assert "op-secret-123" not in printed
    refused = subprocess.run(
        [sys.executable, "-m", "haltwise", "serve", "--host", "0.0.0.0", "--store", sqlite_url],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        env={k: v for k, v in __import__("os").environ.items() if k != "HALTWISE_TOKEN"},
    )
    assert refused.returncode == 2
    assert "HALTWISE_TOKEN" in refused.stderr and "Traceback" not in refused.stderr


def test_error_codes_and_the_body_limit(served: Served) -> None:
    assert served.get("/api/runs?limit=abc").status == 400
    assert served.get("/api/runs?limit=0").status == 400
    assert served.get("/api/runs?state=sleeping").status == 400
    assert served.get("/api/runs?cursor=%%%").status == 400
    assert served.get("/api/runs/nope").error_code == "unknown_run"
    assert served.get("/api/runs/nope").status == 404
    assert served.post("/api/runs/nope/cancel", {}).status == 404
    assert served.get("/api/nowhere").status == 404
    assert served.post("/api/cancel", raw=b"{not json").status == 400
    unfit = served.post("/api/cancel", {"ids": ["a"], "force": "yes"})
    assert (unfit.status, unfit.error_code) == (422, "unfit")
    assert served.post("/api/cancel", {}).status == 422  # neither ids nor a filter
    assert served.post("/api/cancel", {"ids": ["a"], "task": "pay"}).status == 422
    assert served.post("/api/runs", {"task": "nosuch"}).status == 404
    assert served.post("/api/runs", {"task": "pay", "input": {"colour": 1}}).status == 422
    huge = served.post("/api/cancel", raw=b'{"ids": ["' + b"x" * (1024 * 1024) + b'"]}')
    assert (huge.status, huge.error_code) == (413, "too_large")
    assert served.get("/api/runs").status == 200  # the server is unharmed
    assert served.hw("check").returncode == 0


def test_submit_work_and_read_a_run_whose_id_has_a_slash(served: Served) -> None:
    created = served.post("/api/runs", {"task": "quick", "input": {"topic": "cats"}, "id": "p/0"})
    assert (created.status, created.json()) == (201, {"id": "p/0"})
    again = served.post(
        "/api/runs", {"task": "agent.py:quick", "input": {"topic": "cats"}, "id": "p/0"}
    )
    assert (again.status, again.json()) == (200, {"id": "p/0"})
    other = served.post("/api/runs", {"task": "quick", "input": {"topic": "dogs"}, "id": "p/0"})
    assert (other.status, other.error_code) == (409, "idempotency_conflict")
    assert "'p/0'" in other.json()["error"]["message"]
    run = finished(served, "p/0")
    assert run["state"] == "completed" and run["partials"] == [{"hit": "cats-a"}, {"hit": "cats-b"}]
    assert run["owner"] is None
    assert [event["to"] for event in run["events"]] == ["pending", "running", "completed"]  # type: ignore[index, union-attr]
    page = served.get("/api/runs?task=quick&limit=10").json()
    assert page["runs"] == [
        {
            "id": "p/0",
            "task": "agent.py:quick",
            "state": "completed",
            "reason": None,
            "retry": "none",
            "spent": {"usd": 0.0, "tokens": 0, "tool_calls": 1},
        }
    ]
    assert page["next"] is None
    audit = served.get("/api/audit").json()
    assert {tool["name"] for tool in audit["tools"]} == {"search", "think", "charge"}


def test_cancel_through_the_api_of_a_run_worked_by_another_process(served: Served) -> None:
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "haltwise",
            "run",
            "agent.py:research",
            "--id",
            "r1",
            "--json",
            "--store",
            served.store,
        ],
        cwd=served.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    served.wait_for(
        "r1", "its step in flight", lambda r: any(s["status"] == "running" for s in r["steps"])
    )
    answer = served.post("/api/runs/r1/cancel", {"reason": "from the api"})
    assert answer.status == 202 and answer.json()["id"] == "r1"
    out, _ = run.communicate(timeout=PATIENCE)
    assert run.returncode == 3
    outcome = json.loads(out)
    assert (outcome["state"], outcome["reason"]) == ("cancelled", "from the api")
    again = served.post("/api/runs/r1/cancel", {})
    assert (again.status, again.json()) == (200, {"id": "r1", "state": "cancelled"})


def test_bulk_cancel_and_a_refused_resume_then_a_resume_in_the_server(served: Served) -> None:
    for run_id in ("b1", "b2"):
        assert served.post("/api/runs", {"task": "pay", "id": run_id}).status == 201
    for run_id in ("b1", "b2"):
        served.wait_for(run_id, "charge in flight", lambda r: len(r["steps"]) == 2)
    dry = served.post("/api/cancel", {"task": "pay", "dry_run": True}).json()
    assert sorted(dry["would_cancel"]) == ["b1", "b2"]
    done = served.post("/api/cancel", {"ids": ["b1", "b2", "zz"], "reason": "bulk"}).json()
    assert (sorted(done["cancelled"]), done["unknown"]) == (["b1", "b2"], ["zz"])
    for run_id in ("b1", "b2"):
        run = finished(served, run_id)
        assert (
            run["state"] == "cancelled" and run["retry"] == "reconcile"
        )  # charge ran out of grace
    refused = served.post("/api/runs/b1/resume", {})
    assert (refused.status, refused.error_code) == (409, "resume_refused")
    assert "charge" in refused.json()["error"]["message"]
    assert "Resume button" in refused.json()["error"]["message"], "the page's and body's words"
    assert served.post("/api/runs/b1/resume", {"assume_done": {"7": 1}}).status == 422
    resumed = served.post("/api/runs/b1/resume", {"assume_done": {"1": "charged elsewhere"}})
    assert resumed.status in (200, 202), resumed.body
    run = finished(served, "b1")
    assert (run["state"], run["result"]) == ("completed", "charged elsewhere")


def test_events_replay_from_last_event_id_misses_nothing(served: Served) -> None:
    assert served.post("/api/runs", {"task": "quick", "id": "e1"}).status == 201
    finished(served, "e1")
    everything = list(events(served, "/api/events?since=0", {}, 7))
    ids = [int(event["id"]) for event in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    kinds = [event["event"] for event in everything]
    assert kinds.count("partial") == 2 and "step" in kinds and "transition" in kinds
    first = everything[:4]
    rest = list(events(served, "/api/events", {"Last-Event-ID": first[-1]["id"]}, 3))
    assert [e["id"] for e in first + rest] == [e["id"] for e in everything]
    per_run = list(events(served, "/api/runs/e1/events", {"Last-Event-ID": "0"}, 3))
    assert all(event["data"]["run"] == "e1" for event in per_run)
    assert served.get("/api/events", headers={"Last-Event-ID": "soon"}).status == 400


def test_a_live_stream_sees_a_cancel_from_the_command_line(served: Served) -> None:
    assert served.post("/api/runs", {"task": "research", "id": "l1"}).status == 201
    served.wait_for("l1", "think in flight", lambda r: len(r["steps"]) == 2)
    connection = http.client.HTTPConnection(served.host, timeout=PATIENCE)
    connection.request(
        "GET", "/api/runs/l1/events", headers={"Authorization": f"Bearer {served.token}"}
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"retry:")  # connected: later changes will come
    assert served.hw("cancel", "l1", "--reason", "cli").returncode == 0
    seen = b""
    while b'"status":"cancelled"' not in seen:
        line = response.readline()
        assert line, "the stream ended"
        seen += line
    connection.close()
    assert b'"status":"cancelling"' in seen and b'"status":"interrupted"' in seen


@haltwise.task(name="server_test:noop")
async def noop() -> str:
    return "ok"


def test_the_public_api_used_by_the_server_on_a_store(store_url: str) -> None:
    """The read API is the library's too: list_runs pages, inspect, cancel_many by task."""

    async def main() -> None:
        async with haltwise.Runtime(store_url) as runtime:
            for index in range(5):
                await (await runtime.start(noop, task_id=f"n{index}")).outcome()
            first = await runtime.list_runs(limit=2)
            second = await runtime.list_runs(limit=2, cursor=first.next)
            third = await runtime.list_runs(limit=2, cursor=second.next)
            ids = [run.id for page in (first, second, third) for run in page.runs]
            assert ids == ["n4", "n3", "n2", "n1", "n0"] and third.next is None
            detail = await runtime.inspect("n0")
            assert detail.outcome.state is haltwise.State.COMPLETED and detail.owner is None
            none = await runtime.cancel_many(task="noop")
            assert none.cancelled == ()

    anyio.run(main)


def test_pause_and_unpause_through_the_api(served: Served) -> None:
    assert served.post("/api/runs", {"task": "research", "id": "z1"}).status == 201
    served.wait_for("z1", "think in flight", lambda r: len(r["steps"]) == 2)
    paused = served.post("/api/runs/z1/pause", {})
    assert paused.status == 202 and paused.json()["id"] == "z1"
    assert served.post("/api/runs/z1/pause", {}, token="reader-token").status == 403
    served.release("think")  # a pause lets the step in flight end, then holds the run
    served.wait_for("z1", "paused", lambda r: r["state"] == "paused")
    assert served.post("/api/runs/z1/unpause", {}).status == 202
    run = finished(served, "z1")
    assert run["state"] == "completed"
    assert served.post("/api/runs/nope/pause", {}).status == 404


@pytest.fixture
def served_verbs(tmp_path: Path, store_url: str) -> Iterator[Served]:
    """The server with the verbs' tasks too (a retried step, a timed-out one)."""
    with start_server(tmp_path, store_url, agent=AGENT + PATIENT) as server:
        yield server


def test_a_retried_and_a_timed_out_step_through_the_api(served_verbs: Served) -> None:
    served = served_verbs
    assert served.post("/api/runs", {"task": "patient", "id": "r1"}).status == 201
    run = finished(served, "r1")
    assert (run["state"], run["result"]) == ("completed", "x (slow timed out)")
    retried, timed_out = run["steps"]
    assert (retried["status"], retried["attempts"]) == ("committed", 2)
    assert [e["type"] for e in retried["earlier_errors"]] == ["ConnectionError"]
    assert (timed_out["status"], timed_out["error"]["type"]) == ("failed", "StepTimeoutError")


def test_fork_through_the_api(served: Served) -> None:
    served.release("charge")
    assert served.post("/api/runs", {"task": "pay", "id": "s1"}).status == 201
    assert finished(served, "s1")["state"] == "completed"
    dry = served.post("/api/runs/s1/fork", {"from_step": 1, "dry_run": True})
    assert dry.status == 200
    assert dry.json() == {
        "source": "s1",
        "from_step": 1,
        "will_repeat": [{"index": 1, "tool": "charge", "effect": "external"}],
        "id": None,
    }
    assert [r["id"] for r in served.get("/api/runs").json()["runs"]] == ["s1"], "nothing ran"
    forked = served.post("/api/runs/s1/fork", {"from_step": 1, "id": "f1"})
    assert forked.status == 202, forked.json()
    assert forked.json()["id"] == "f1" and forked.json()["fork"]["source"] == "s1"
    run = finished(served, "f1")
    assert (run["state"], run["result"]) == ("completed", "charged 3")
    assert [s["attempts"] for s in run["steps"]] == [1, 1]
    assert "fork of s1 from step 1" in [e.get("reason") for e in run["events"]]
    source = served.get("/api/runs/s1").json()
    assert [s["attempts"] for s in source["steps"]] == [1, 1], "the source is not changed"
    assert served.post("/api/runs/s1/fork", {"from_step": 9}).status == 422
    assert served.post("/api/runs/s1/fork", {"from_step": -1}).status == 422
    assert served.post("/api/runs/s1/fork", {"from_step": 0, "id": "f1"}).status == 422
    assert served.post("/api/runs/nope/fork", {"from_step": 0}).status == 404
    refused = served.post("/api/runs/s1/fork", {"from_step": 0}, token="reader-token")
    assert refused.status == 403
