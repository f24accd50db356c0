"""The command line under bad input and hostile data (issue 15), in real ``haltwise`` processes.

Passwords in any shape of store URL, unbounded values, terminal widths rich cannot use, terminal
escapes in ids and reasons, read-only commands on a mistyped path or behind another process's
write lock.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from _cli_kit import AGENT, PATIENCE, Env, error_line
from _pg import PostgresServer, create_database
from _wait import wait_until


def hw_with(env: Env, extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**env.environ(), **extra}
    return subprocess.run(
        [sys.executable, "-m", "haltwise", *args],
        cwd=env.root,
        env=environ,
        text=True,
        capture_output=True,
        timeout=PATIENCE * 3,
    )


# -- item 3: no password in any message ------------------------------------------------------

SECRET = "s3cretPW"
#: every shape of URL a password can hide in; each is refused or fails to connect
LEAKY_URLS = [
    f"postgresql://u:{SECRET}%ZZ@127.0.0.1:1/db",
    f"postgresql://127.0.0.1:1/db?password={SECRET}%ZZ",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"postgresql://u:{SECRET[:4]}%{ord(SECRET[4]):02X}{SECRET[5:]}@127.0.0.1:1/db",
    f"postgresql://127.0.0.1:1/db?password={SECRET}&sslmode=bogus",
    f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=abc",
    f"postgresql://u@127.0.0.1:1/db?sslpassword={SECRET}&application_name=x%ZZ",
    f"postgresql://u:{SECRET}@[::1/db",
    f"postgres://u:{SECRET}@127.0.0.1:99999/db",
    f"mysql://u:{SECRET}@127.0.0.1/db",
    f"host=127.0.0.1 port=1 password={SECRET}",
    f"sqlite:///x.db?password={SECRET}",
]


@pytest.mark.parametrize("url", LEAKY_URLS)
def test_no_message_shows_a_password_whatever_the_url(env: Env, url: str) -> None:
    env.release("think")
    # a read-only command, a writing one and one that loads a task first; the URL given both
    # ways (every line goes through the same scrubbing, so the commands are samples)
    for args, how in (
        (["list"], "--store"),
        (["cancel", "x"], "env"),
        (["check", "--json"], "env"),
        (["run", "agent.py:flow", "--input", '{"policy": "interruptible"}'], "--store"),
    ):
        extra = {"HALTWISE_STORE": url} if how == "env" else {}
        store = [] if how == "env" else ["--store", url]
        done = hw_with(env, extra, *args, *store)
        assert SECRET not in done.stdout + done.stderr, (args, how, done.stderr)
        error_line(done)


# -- item 6: unbounded values -----------------------------------------------------------------

HUGE_INT = "7" * 5000
DEEP = "[" * 20_000 + "]" * 20_000


@pytest.mark.parametrize("value", [HUGE_INT, DEEP], ids=["5000-digit int", "20000 deep"])
def test_unbounded_json_values_are_one_line_and_exit_2(env: Env, value: str) -> None:
    flow_input = '{"policy": "interruptible", "topic": ' + value + "}"
    assert "--input" in error_line(env.hw("run", "agent.py:flow", "--input", flow_input))
    assert "--input" in error_line(env.hw("submit", "agent.py:flow", "--input", flow_input))
    assert "--input" in error_line(env.hw("explore", "agent.py:flow", "--input", flow_input))
    assert "--assume-done" in error_line(env.hw("resume", "x", "--assume-done", f"0={value}"))


@pytest.mark.parametrize("timeout", ["nan", "inf", "-inf", "1e308", "-1", "abc", "NaN"])
def test_a_busy_timeout_that_is_no_usable_number_is_refused(env: Env, timeout: str) -> None:
    url = f"{env.store}?busy_timeout={timeout}"
    for args in (["list"], ["cancel", "x"]):
        assert "busy_timeout" in error_line(env.hw(*args, "--store", url))


@pytest.mark.parametrize("concurrency", ["0", "-1", "10001", "99999999999999999999", "x"])
def test_a_worker_concurrency_out_of_range_is_exit_2(env: Env, concurrency: str) -> None:
    """Found by the sweep: a 20-digit concurrency overflowed SQLite's integer (a traceback)."""
    assert "--concurrency" in error_line(env.hw("worker", "agent.py", "--concurrency", concurrency))


# -- item 8: COLUMNS that rich cannot use --------------------------------------------------------


@pytest.mark.parametrize("columns", ["0", "banana", "1000000000"])
def test_an_unusable_terminal_width_still_prints_everything(env: Env, columns: str) -> None:
    env.release("think")
    extra = {"COLUMNS": columns}
    ran = hw_with(env, extra, "run", "agent.py:flow", "--input", '{"policy": "interruptible"}')
    assert ran.returncode == 0 and "completed" in ran.stdout, ran.stdout
    run_id = ran.stdout.split()[1]
    for args, expected in (
        (["status", run_id], "completed"),
        (["list"], run_id),
        (["check"], "sound"),
        (["cancel", run_id], "already completed"),
        (["audit", "agent.py"], "send_email"),
    ):
        done = hw_with(env, extra, *args)
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout, (args, done.stdout)
        assert max(map(len, done.stdout.splitlines())) <= 1000


def test_at_80_columns_tool_names_are_not_cut_in_two(env: Env) -> None:
    """Issue 15, item 23: the steps table used to fold ``send_email`` into two lines."""
    env.release("send_email")
    extra = {"COLUMNS": "80"}
    ran = hw_with(env, extra, "run", "agent.py:flow", "--input", '{"policy": "finish"}')
    assert ran.returncode == 0, ran.stderr
    for tool in ("search", "record", "send_email"):
        assert tool in ran.stdout
    assert max(map(len, ran.stdout.splitlines())) <= 80


# -- item 9: terminal escapes from the journal -------------------------------------------------

ESCAPES = "\x1b[31mred\x1b]0;owned\x07\x9b2J\u202e"


def test_control_characters_from_the_journal_are_escaped(env: Env) -> None:
    env.release("think")
    run_id = f"id{ESCAPES}"
    ran = env.hw("run", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--id", run_id)
    assert ran.returncode == 0, ran.stderr
    pending = f"p{ESCAPES}"
    submitted = env.hw(
        "submit", "agent.py:flow", "--input", '{"policy": "finish"}', "--id", pending
    )
    assert submitted.returncode == 0, submitted.stderr
    cancelled = env.hw("cancel", pending, "--reason", f"why{ESCAPES}")
    assert cancelled.returncode == 0, cancelled.stderr
    outputs = [
        ran,
        cancelled,
        env.hw("status", run_id),
        env.hw("status", pending),
        env.hw("list"),
        env.hw("cancel", run_id),
        env.hw("status", f"missing{ESCAPES}"),
    ]
    for done in outputs:
        text = done.stdout + done.stderr
        for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert raw not in text, (done.args, text)
    assert "\\x1b[31mred" in env.hw("status", run_id).stdout
    assert "why\\x1b[31mred" in env.hw("status", pending).stdout
    # JSON carries the value as it is (escaped by JSON itself)
    status = json.loads(env.hw("status", pending, "--json").stdout)
    assert status["reason"] == f"why{ESCAPES}"


# -- item 10: read-only commands -----------------------------------------------------------------


def test_read_only_commands_never_create_a_store_and_say_where_they_looked(env: Env) -> None:
    typo = env.root / "typo" / "dir" / "store.db"
    url = f"sqlite:///{typo}"
    status = error_line(env.hw("status", "x", "--store", url))
    assert str(typo) in status and "no store" in status
    # a folder that does not exist is a typo: one line naming it, exit 2 (issue 29, item 6)
    assert str(typo.parent) in error_line(env.hw("list", "--store", url))
    assert "no store" in error_line(env.hw("list", "--json", "--store", url))
    checked = env.hw("check", "--json", "--store", url)
    assert json.loads(checked.stdout) == {"ok": True, "runs": 0, "findings": []}
    assert not (env.root / "typo").exists()
    # an unknown id in a store that exists: the message names the store
    env.release("think")
    assert env.hw("run", "agent.py:flow", "--input", '{"policy": "interruptible"}').returncode == 0
    assert env.store in error_line(env.hw("status", "nope"))


def test_read_only_commands_do_not_wait_behind_another_writer(env: Env) -> None:
    env.release("think")
    ran = env.hw("run", "agent.py:flow", "--input", '{"policy": "interruptible"}', "--id", "r1")
    assert ran.returncode == 0, ran.stderr
    locked, unlock = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(env.root / "store.db", isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        locked.set()
        unlock.wait(PATIENCE * 4)
        conn.execute("COMMIT")
        conn.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(PATIENCE)
        # with a busy timeout longer than the subprocess may take: waiting would time out
        waiting_url = f"{env.store}?busy_timeout={PATIENCE * 4:g}"
        answers: dict[str, Any] = {}
        for args in (["status", "r1", "--json"], ["list", "--json"], ["check", "--json"]):
            done = env.hw(*args, "--store", waiting_url, timeout=PATIENCE * 2)
            assert done.returncode == 0, done.stderr
            answers[args[0]] = json.loads(done.stdout)
    finally:
        unlock.set()
        holder.join()
    assert answers["status"]["state"] == "completed"
    assert [run["id"] for run in answers["list"]["runs"]] == ["r1"]
    assert answers["check"]["ok"] is True


# -- item 11: a PostgreSQL outage ------------------------------------------------------------


def test_a_postgres_outage_prints_one_line_and_no_driver_log_noise(tmp_path: Path) -> None:
    """The server of a run in flight goes down: the run stops with the one clear line (its last
    durable state standing), without the pool's twenty lines of reconnection logs before it.
    Whichever meets the outage first, the run's write or the command's read of the run just
    after its start (the order is the machine's here: test_foreground_outage.py makes each)."""
    server = PostgresServer()
    server.start()
    try:
        url = create_database(server.dsn)
        (tmp_path / "agent.py").write_text(AGENT)
        env = Env(tmp_path)
        environ = {**env.environ(), "HALTWISE_STORE": url}
        process = subprocess.Popen(
            [sys.executable, "-m", "haltwise", "run", "agent.py:flow", "--input",
             '{"policy": "interruptible"}', "--json"],
            cwd=tmp_path, env=environ, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        wait_until(lambda: "record:cats" in env.effects(), "the step", process=process)
        server._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(server.data))
        env.release("think")
        out, err = process.communicate(timeout=PATIENCE * 3)
    finally:
        server.stop()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert "could not be written" in error_line(done)
