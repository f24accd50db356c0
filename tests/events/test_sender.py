"""``haltwise events``: the journal's changes reach a real HTTP receiver on loopback as signed
CloudEvents, at least once and in order per run, through a receiver's failures and outage and a
SIGKILL of the sender, on both stores (CONTRACT.md, "Telling the world: traces and events").

The sender always runs as ``python -m haltwise events`` in a process of its own; the runs are
made in this process; the receiver (tests/events_receiver.py) logs every request it gets.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from standardwebhooks.webhooks import Webhook

import _wait
import haltwise
import toolkit

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fresh_toolkit")]

HERE = Path(__file__).resolve().parent.parent
SECRET = "whsec_" + base64.b64encode(b"a test secret of 32 bytes length").decode()
PATIENCE = 60.0
SERVE = (sys.executable, "-m", "haltwise", "serve", "--port", "0")


class Receiver:
    """The receiver process, which can be killed and started again on the same port."""

    def __init__(self, root: Path, *options: str) -> None:
        self.root = root
        self.options = options  # events_receiver.py's --keep-alive, --tls CERT KEY
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "events_receiver.py"),
                str(self.root),
                str(self.port),
                *self.options,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.port = int(self.process.stdout.readline())

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks?token=not-for-logs"

    def answer(self, code: int | None, phrase: str = "") -> None:
        """The status the receiver answers from now on (``None``: 200), with ``phrase`` as its
        reason phrase (empty: the standard one)."""
        answer = self.root / "answer"
        if code is None:
            answer.unlink(missing_ok=True)
        else:
            answer.write_text(f"{code}|{phrase}" if phrase else str(code))

    def received(self) -> list[dict[str, Any]]:
        log = self.root / "received.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


@contextmanager
def receiving(root: Path, *options: str) -> Iterator[Receiver]:
    root.mkdir()
    server = Receiver(root, *options)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with receiving(tmp_path / "receiver") as server:
        yield server


def start_sender(
    store: str, url: str, root: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    env = {**_without_proxies(os.environ), "HOOK_SECRET": SECRET, **(env or {})}
    log = (root / "sender.log").open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "haltwise", "events", "--to", url, "--store", store, *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
        text=True,
    )


def _without_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with no proxy named (the machine's own must not reroute loopback)."""
    return {k: v for k, v in environ.items() if not k.lower().endswith("_proxy")}


def wait_until(what: str, check: Callable[[], bool]) -> None:
    _wait.wait_until(check, what, timeout=PATIENCE, interval=0.02)


async def expected_types(store: str, run_ids: list[str]) -> dict[str, list[str]]:
    """Every run's transitions as event types, in order, read from the journal."""
    async with haltwise.Runtime(store) as rt:
        runs = {run_id: await rt.inspect(run_id) for run_id in run_ids}
    return {
        run_id: [f"dev.haltwise.run.{event.target.value}" for event in detail.events]
        for run_id, detail in runs.items()
    }


def acknowledged(received: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each run's events as first acknowledged (2xx), in the order they arrived."""
    seen: set[str] = set()
    runs: dict[str, list[dict[str, Any]]] = {}
    for request in received:
        event = json.loads(request["body"])
        if request["answered"] // 100 != 2 or event["id"] in seen:
            continue
        seen.add(event["id"])
        runs.setdefault(event["subject"], []).append(event)
    return runs


async def make_runs(store: str) -> list[str]:
    """Two completed runs, and one cancelled at its gate, then resumed to completion."""
    async with haltwise.Runtime(store) as rt:
        for run_id in ("q1", "q2"):
            await (await rt.start(toolkit.three_quick, 2, task_id=run_id)).outcome()
        handle = await rt.start(toolkit.one_step, "read_async", task_id="gated")
        await toolkit.between.wait()
        await handle.cancel(reason="budget review")
        assert (await handle.outcome()).state is haltwise.State.CANCELLED
        toolkit.go_on.set()
        toolkit.release.set()
        resumed = await (await rt.resume("gated")).outcome()
        assert resumed.state is haltwise.State.COMPLETED
    return ["q1", "q2", "gated"]


async def test_every_transition_arrives_signed_in_order_with_the_run_as_of_then(
    store_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    run_ids = await make_runs(store_url)
    expected = await expected_types(store_url, run_ids)
    sender = start_sender(
        store_url, receiver.url, tmp_path, "--secret-env", "HOOK_SECRET", "--from-start"
    )
    try:
        total = sum(map(len, expected.values()))
        wait_until(f"{total} events", lambda: len(receiver.received()) >= total)
    finally:
        sender.send_signal(signal.SIGTERM)
        assert sender.wait(timeout=30) == 0, (tmp_path / "sender.log").read_text()

    verifier = Webhook(SECRET)
    for request in receiver.received():
        assert request["headers"]["content-type"] == "application/cloudevents+json"
        verifier.verify(request["body"], request["headers"])  # raises if the signature is off
        event = from_http_event(HTTPMessage(request["headers"], request["body"].encode()))
        assert event.get_id() == request["headers"]["webhook-id"]
    runs = acknowledged(receiver.received())
    assert {run: [e["type"] for e in events] for run, events in runs.items()} == expected
    for events in runs.values():
        ids = [int(e["id"]) for e in events]
        assert ids == sorted(ids)
        for event in events:
            assert event["specversion"] == "1.0"
            assert event["source"].startswith(store_url.split(":")[0])
            assert event["data"]["state"] == event["type"].rsplit(".", 1)[1]
            assert event["data"]["id"] == event["subject"]
    gated = {e["type"].rsplit(".", 1)[1]: e["data"] for e in reversed(runs["gated"])}
    # as of the cancel, not as the run is now (resumed and completed since)
    assert gated["cancelled"]["reason"] == "budget review"
    assert gated["cancelled"]["result"] is None
    assert gated["cancelled"]["retry"] in ("restart", "resume")
    assert [s["status"] for s in gated["cancelled"]["steps"]] == ["committed"]
    assert gated["cancelled"]["partials"] == [{"step": 0}]
    assert gated["completed"]["result"] == ["a", "b", "c"]
    assert gated["completed"]["reason"] is None
    assert len(gated["completed"]["steps"]) == 3
    assert "not-for-logs" not in (tmp_path / "sender.log").read_text()


async def test_failures_an_outage_and_a_sigkill_lose_nothing(
    store_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.answer(500)
    sender = start_sender(store_url, receiver.url, tmp_path)
    log = tmp_path / "sender.log"
    wait_until("the sender started", lambda: "delivering to" in log.read_text())
    run_ids = await make_runs(store_url)
    expected = await expected_types(store_url, run_ids)
    wait_until("a failed try", lambda: any(r["answered"] == 500 for r in receiver.received()))
    wait_until("a failure logged", lambda: "500" in log.read_text())
    receiver.answer(None)
    receiver.kill()  # down: tries get no answer
    wait_until("a try with no answer", lambda: "no answer" in log.read_text())
    sender.kill()  # SIGKILL: the position of the last half second at most is lost
    sender.wait()
    receiver.start()
    sender = start_sender(store_url, receiver.url, tmp_path)
    try:
        total = sum(map(len, expected.values()))
        wait_until(
            f"{total} events acknowledged",
            lambda: sum(map(len, acknowledged(receiver.received()).values())) >= total,
        )
    finally:
        sender.send_signal(signal.SIGINT)
        assert sender.wait(timeout=30) == 0, log.read_text()
    runs = acknowledged(receiver.received())
    assert {run: [e["type"] for e in events] for run, events in runs.items()} == expected
    bodies: dict[str, set[str]] = {}
    for request in receiver.received():
        event = json.loads(request["body"])
        bodies.setdefault(event["id"], set()).add(event["type"] + event["subject"])
    assert all(len(kinds) == 1 for kinds in bodies.values())  # a duplicate is the same event
    for line in log.read_text().splitlines():
        assert line.startswith("haltwise: events: "), line
        assert "not-for-logs" not in line


async def test_a_restarted_sender_goes_on_from_its_kept_position(
    sqlite_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    sender = start_sender(sqlite_url, receiver.url, tmp_path)
    log = tmp_path / "sender.log"
    wait_until("the sender started", lambda: "delivering to" in log.read_text())
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(toolkit.three_quick, 1, task_id="first")).outcome()
    per_run = len((await expected_types(sqlite_url, ["first"]))["first"])
    wait_until("first's events", lambda: len(receiver.received()) == per_run)
    sender.send_signal(signal.SIGTERM)
    assert sender.wait(timeout=30) == 0
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(toolkit.three_quick, 1, task_id="second")).outcome()
    sender = start_sender(sqlite_url, receiver.url, tmp_path)
    try:
        wait_until("second's events", lambda: len(receiver.received()) == 2 * per_run)
    finally:
        sender.send_signal(signal.SIGTERM)
        assert sender.wait(timeout=30) == 0
    subjects = [json.loads(r["body"])["subject"] for r in receiver.received()]
    assert subjects == ["first"] * per_run + ["second"] * per_run


@pytest.mark.parametrize("phrase", ["", "Bye"], ids=["Gone", "own-phrase"])
async def test_410_gone_stops_the_sender_with_exit_1(
    sqlite_url: str, receiver: Receiver, tmp_path: Path, phrase: str
) -> None:
    receiver.answer(410, phrase)  # the code decides, whatever the reason phrase says
    async with haltwise.Runtime(sqlite_url) as rt:
        await (await rt.start(toolkit.three_quick, 1, task_id="r")).outcome()
    sender = start_sender(sqlite_url, receiver.url, tmp_path, "--from-start")
    assert sender.wait(timeout=60) == 1
    last = (tmp_path / "sender.log").read_text().splitlines()[-1]
    assert last.startswith("haltwise: error: ") and "410 Gone" in last, last
    receiver.answer(None)
    sender = start_sender(sqlite_url, receiver.url, tmp_path)  # the refused change comes again
    try:
        wait_until("the refused change", lambda: len(acknowledged(receiver.received())) == 1)
    finally:
        sender.send_signal(signal.SIGTERM)
        sender.wait(timeout=30)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "ftp://example.com/x"], "expected an http:// or https:// URL"),
        (["--to", "not a url"], "expected an http:// or https:// URL"),
        (["--to", "http://127.0.0.1:99999/"], "port"),
        (["--to", "http://127.0.0.1/", "--secret-env", "HW_NO_SUCH_VAR"], "is not set"),
        (["--to", "http://127.0.0.1/", "--secret-env", "HW_BAD_SECRET"], "not valid"),
        (["--to", "http://u:hunter2@127.0.0.1/", "--secret-env", "HW_NO_SUCH_VAR"], "is not set"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, sqlite_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "HW_BAD_SECRET": "whsec_!!!not base64!!!"}
    done = subprocess.run(
        [sys.executable, "-m", "haltwise", "events", "--store", sqlite_url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "hunter2" not in done.stderr
    assert "Traceback" not in done.stderr


@contextmanager
def serving(store: str, url: str, log: Path) -> Iterator[subprocess.Popen[str]]:
    """``haltwise serve --events-to URL`` up, its sender started; stopped by SIGTERM (exit 0)."""
    serve = subprocess.Popen(
        [*SERVE, "--store", store, "--events-to", url],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    try:
        assert serve.stdout is not None
        serve.stdout.readline()  # the address: the server is up
        wait_until("the sender started", lambda: "delivering to" in log.read_text())
        yield serve
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0, log.read_text()


async def test_serve_delivers_events_too(
    sqlite_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    with serving(sqlite_url, receiver.url, tmp_path / "serve.log"):
        async with haltwise.Runtime(sqlite_url) as rt:
            await (await rt.start(toolkit.three_quick, 1, task_id="served")).outcome()
        wanted = len((await expected_types(sqlite_url, ["served"]))["served"])
        wait_until("the run's events", lambda: len(receiver.received()) == wanted)


async def test_a_receiver_gone_under_serve_stops_the_sender_not_the_server(
    sqlite_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.answer(410)
    log = tmp_path / "serve.log"
    with serving(sqlite_url, receiver.url, log) as serve:
        async with haltwise.Runtime(sqlite_url) as rt:
            await (await rt.start(toolkit.three_quick, 1, task_id="gone")).outcome()
        wait_until("the 410 said", lambda: "410 Gone" in log.read_text())
        assert serve.poll() is None, log.read_text()  # still serving


async def one_run(store: str, run_id: str) -> int:
    """Runs ``run_id`` to completion; how many events it makes."""
    async with haltwise.Runtime(store) as rt:
        await (await rt.start(toolkit.three_quick, 1, task_id=run_id)).outcome()
    return len((await expected_types(store, [run_id]))[run_id])


async def test_https_is_verified_and_the_urls_credentials_become_basic_auth(
    sqlite_url: str, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    tls = ("--keep-alive", "--tls", str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    log = tmp_path / "sender.log"
    with receiving(tmp_path / "receiver", *tls) as receiver:
        url = f"https://hook%20user:p%40ss@127.0.0.1:{receiver.port}/hooks"
        wanted = await one_run(sqlite_url, "tls")
        # certifi's authorities do not know this one: refused, nothing delivered
        sender = start_sender(sqlite_url, url, tmp_path, "--from-start")
        wait_until("the certificate refused", lambda: "CertVerification" in log.read_text())
        sender.kill()
        sender.wait()
        assert receiver.received() == []
        sender = start_sender(
            sqlite_url,
            url,
            tmp_path,
            "--from-start",
            env={"SSL_CERT_FILE": str(tmp_path / "ca.pem")},
        )
        try:
            wait_until("the run's events", lambda: len(receiver.received()) == wanted)
        finally:
            sender.send_signal(signal.SIGTERM)
            assert sender.wait(timeout=30) == 0, log.read_text()
        basic = "Basic " + base64.b64encode(b"hook user:p@ss").decode()
        assert {r["headers"]["authorization"] for r in receiver.received()} == {basic}
        assert "p%40ss" not in log.read_text() and "p@ss" not in log.read_text()


async def test_a_kept_connection_the_receiver_dropped_costs_no_failed_try(
    sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "sender.log"
    with receiving(tmp_path / "receiver", "--keep-alive") as receiver:
        sender = start_sender(sqlite_url, receiver.url, tmp_path)
        try:
            wait_until("the sender started", lambda: "delivering to" in log.read_text())
            async with haltwise.Runtime(sqlite_url) as rt:
                handle = await rt.start(toolkit.one_step, "read_async", task_id="kept")
                await toolkit.between.wait()
                made = len((await rt.inspect("kept")).events)
                await _wait.until(lambda: len(receiver.received()) == made, "the events so far")
                # the run's lane keeps its connection; the receiver goes and comes back, so the
                # next event is written to a connection the other side closed
                receiver.kill()
                receiver.start()
                toolkit.go_on.set()
                toolkit.release.set()
                await handle.outcome()
            wanted = len((await expected_types(sqlite_url, ["kept"]))["kept"])
            wait_until("the run's events", lambda: len(receiver.received()) == wanted)
        finally:
            sender.send_signal(signal.SIGTERM)
            assert sender.wait(timeout=30) == 0, log.read_text()
    assert "no answer" not in log.read_text()  # sent again at once on a new connection


async def test_a_proxy_the_environment_names_carries_the_events(
    sqlite_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    wanted = await one_run(sqlite_url, "proxied")
    proxy = {"HTTP_PROXY": f"http://127.0.0.1:{receiver.port}"}
    sender = start_sender(
        sqlite_url, "http://events.invalid/hooks", tmp_path, "--from-start", env=proxy
    )
    try:
        wait_until("the run's events", lambda: len(receiver.received()) == wanted)
    finally:
        sender.send_signal(signal.SIGTERM)
        assert sender.wait(timeout=30) == 0, (tmp_path / "sender.log").read_text()
    # the receiver stands in for the proxy: it gets the whole URL as the request's target
    assert {r["path"] for r in receiver.received()} == {"http://events.invalid/hooks"}
