"""A real ``haltwise serve`` process on a free loopback port, and a small HTTP client for it.

The server prints its address (with ``?token=`` when it made the token) alone on stdout; the
tests read it from there. Requests go through ``http.client`` (no client library between the
test and the wire), and the event stream is read line by line from the raw response.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: How long a test waits for the server or a run before it fails.
PATIENCE = 30.0

AGENT = """
from pathlib import Path

import anyio

import haltwise

HERE = Path(__file__).parent


async def until_released(name, limit=600.0):
    # The limit only ends a process a failed test left waiting: a passing test releases the
    # gate long before it, however loaded the machine.
    gate = HERE / f"release-{name}"
    with anyio.fail_after(limit):
        while not gate.exists():
            await anyio.sleep(0.005)


@haltwise.tool(cancel="interruptible", effect="read")
async def search(topic: str) -> list:
    return [topic + "-a", topic + "-b"]


@haltwise.tool(cancel="interruptible", effect="read")
async def think(topic: str) -> str:
    await until_released("think")
    return topic


@haltwise.tool(cancel="finish", effect="external", grace=0.2)
async def charge(amount: int) -> str:
    await until_released("charge")
    return f"charged {amount}"


@haltwise.task
async def research(topic: str = "cats"):
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
    return await think(topic)


@haltwise.task
async def pay(amount: int = 3):
    await search("pay")
    return await charge(amount)


@haltwise.task
async def quick(topic: str = "x"):
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
    return "ok"
"""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error_code(self) -> str:
        value = self.json()
        assert set(value) == {"error"} and set(value["error"]) == {"code", "message"}, value
        return str(value["error"]["code"])


@dataclass
class Served:
    """One ``haltwise serve`` process."""

    process: subprocess.Popen[str]
    base: str
    token: str
    root: Path
    store: str
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return urlsplit(self.base).netloc

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = "",
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Answer:
        """One request; ``token=""`` means the operator token, ``None`` no Authorization."""
        sent = dict(headers or {})
        bearer = self.token if token == "" else token
        if bearer is not None:
            sent["Authorization"] = f"Bearer {bearer}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        connection = http.client.HTTPConnection(self.host, timeout=PATIENCE)
        try:
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            return Answer(response.status, dict(response.getheaders()), response.read())
        finally:
            connection.close()

    def get(self, path: str, **kwargs: Any) -> Answer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Answer:
        return self.request("POST", path, body, **kwargs)

    def wait_for(self, run_id: str, what: str, predicate: Any) -> dict[str, Any]:
        from urllib.parse import quote

        deadline = time.monotonic() + PATIENCE
        seen: Any = None
        while time.monotonic() < deadline:
            answer = self.get(f"/api/runs/{quote(run_id, safe='')}")
            if answer.status == 200:
                seen = answer.json()
                if predicate(seen):
                    return dict(seen)
            time.sleep(0.02)
        raise AssertionError(f"run {run_id} never got {what}; last seen: {seen}")

    def hw(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``haltwise`` command on the same store, in its own process."""
        return subprocess.run(
            [sys.executable, "-m", "haltwise", *args, "--store", self.store],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=PATIENCE * 2,
        )

    def release(self, name: str) -> None:
        (self.root / f"release-{name}").touch()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    root: Path,
    store: str,
    *args: str,
    env: dict[str, str] | None = None,
    file: bool = True,
    agent: str = AGENT,
) -> Served:
    """Start ``haltwise serve [agent.py] --port 0`` in ``root`` and wait for its address."""
    (root / "agent.py").write_text(agent)
    environ = dict(os.environ)
    environ.pop("HALTWISE_TOKEN", None)
    environ.pop("HALTWISE_READ_TOKEN", None)
    environ.update(env or {})
    command = [sys.executable, "-m", "haltwise", "serve"]
    command += ["agent.py"] if file else []
    command += ["--port", "0", "--store", store, *args]
    process = subprocess.Popen(
        command, cwd=root, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("http://"):
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"serve did not start: {line!r} {err}")
    token = line.partition("?token=")[2] or environ.get("HALTWISE_TOKEN", "")
    return Served(process, line.partition("?")[0].rstrip("/"), token, root, store)


def events(
    served: Served, path: str, headers: dict[str, str], count: int
) -> Iterator[dict[str, Any]]:
    """Read ``count`` events (``{"id", "event", "data"}``) from the stream at ``path``."""
    connection = http.client.HTTPConnection(served.host, timeout=PATIENCE)
    sent = {"Authorization": f"Bearer {served.token}", "Accept": "text/event-stream", **headers}
    connection.request("GET", path, headers=sent)
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert response.getheader("content-type", "").startswith("text/event-stream")
    event: dict[str, Any] = {}
    seen = 0
    try:
        while seen < count:
            line = response.readline().decode()
            assert line, "the stream ended"
            line = line.rstrip("\r\n")
            if not line:
                if "id" in event:
                    seen += 1
                    yield event
                event = {}
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value
    finally:
        connection.close()
