"""A throwaway PostgreSQL server for the tests: ``initdb`` into a temporary directory, started on
a free loopback port with trust authentication, stopped (``-m immediate``) and removed at the end.

PostgreSQL refuses to run as root, and CI runs as root: then ``initdb`` and ``pg_ctl`` run as the
``postgres`` user (``runuser``), in a directory under ``/tmp`` owned by that user.

The server binaries are looked up in ``$HALTWISE_PG_BIN``, then ``/usr/lib/postgresql/*/bin``
(newest first), then ``pg_config --bindir`` and ``$PATH``. ``$HALTWISE_TEST_PG_DSN`` points the
tests at an existing server instead (its databases ``hw_*`` are created and left behind).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("initdb", "pg_ctl", "postgres")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries were found."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    candidates: list[str] = []
    if os.environ.get("HALTWISE_PG_BIN"):
        candidates.append(os.environ["HALTWISE_PG_BIN"])
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(versions, key=_version_key, reverse=True)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=10
        )
        candidates.append(out.stdout.strip())
    if shutil.which("pg_ctl"):
        candidates.append(str(Path(shutil.which("pg_ctl") or "").parent))
    for candidate in candidates:
        if all(os.access(Path(candidate, name), os.X_OK) for name in BINARIES):
            return Path(candidate)
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; "
        "run scripts/ensure-postgres.sh or set HALTWISE_PG_BIN"
    )


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster, started by :meth:`start` and removed by :meth:`stop`.

    The tests' server does not sync to disk (``fsync=off``, ``full_page_writes=off``: a crash of
    the machine is not what they test); ``durable=True`` (the benchmarks) keeps PostgreSQL's
    durable defaults. These are given on the server's command line, which no ``ALTER SYSTEM``
    overrides.
    """

    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable
        self.options = ""  # the server's settings, once started
        self.bin_dir = find_bin_dir()
        self.as_postgres = os.geteuid() == 0
        # mkdtemp under /tmp: mode 0700 but owned by whoever runs the server, and /tmp itself
        # is traversable by everyone.
        self.base = Path(tempfile.mkdtemp(prefix="haltwise-pg-", dir="/tmp"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self.port = 0
        self.user = "postgres"
        self._numbers = itertools.count(1)
        if self.as_postgres:
            shutil.chown(self.base, user="postgres", group=None)

    def _command(self, name: str, *args: str) -> list[str]:
        command = [str(self.bin_dir / name), *args]
        if self.as_postgres:
            return ["runuser", "-u", "postgres", "--", *command]
        return command

    def _run(self, name: str, *args: str) -> None:
        done = subprocess.run(
            self._command(name, *args), capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(
                f"{name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{log}"
            )

    def start(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "--username",
            self.user,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        sync = "on" if self.durable else "off"
        # A free port can be taken between choosing and binding it: try a few.
        for attempt in range(5):
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.base} -c max_connections=300 "
                f"-c fsync={sync} -c full_page_writes={sync} -c synchronous_commit=on"
            )
            try:
                self._run(
                    "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l",
                    str(self.log), "-o", options,
                )  # fmt: skip
                self.options = options
                return
            except RuntimeError:
                if attempt == 4:
                    raise

    def halt(self, mode: str) -> None:
        """Stop the server (``pg_ctl stop -m MODE``), keeping its cluster for :meth:`restart`."""
        self._run("pg_ctl", "stop", "-m", mode, "-w", "-D", str(self.data))

    def restart(self) -> None:
        """Start the server :meth:`halt` stopped, on the same port and settings."""
        self._run(
            "pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log),
            "-o", self.options,
        )  # fmt: skip

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(self.data))
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"


def database_url(server_dsn: str, name: str) -> str:
    """``server_dsn`` with its database replaced by ``name``."""
    head, _, _ = server_dsn.rpartition("/")
    return f"{head}/{name}"


def create_database(server_dsn: str, prefix: str = "hw") -> str:
    """Create a fresh, uniquely named database on the server; return its URL."""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{next(_database_numbers)}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(server_dsn, name)


_database_numbers = itertools.count(1)


def backends_in_transaction(url: str, application: str, deadline: float = 60.0) -> list[int]:
    """The server pids of the connections of ``application`` (their ``application_name``) to
    ``url``'s database that are inside a transaction, once none of them runs a statement.

    For a client that is stopped (SIGSTOP) or frozen: a statement it sent before it stopped ends
    first, and it can send no other; a transaction found open then holds its locks until the
    client comes back. So does a connection stopped in the middle of an extended-protocol
    exchange (its statement executed, its ``Sync`` not sent): it stays ``active``, waiting to
    read from the client; one sending a result the client does not read waits likewise. Both
    are counted as in a transaction. So is a statement waiting for a lock that another of the
    client's own connections holds (its transaction left open by the stop): it cannot end
    before the client comes back, as a killed client's cannot before the kernel closes its
    sockets, which ends both. (A ``BEGIN`` still unread by the server when this looks opens one
    later, which takes no lock.)"""
    import psycopg

    where = "WHERE application_name = %s AND datname = current_database()"
    own = f"ARRAY(SELECT pid FROM pg_stat_activity {where})"
    running = (
        f"{where} AND state = 'active' AND wait_event_type IS DISTINCT FROM 'Client' "
        f"AND NOT (pg_blocking_pids(pid) && {own})"
    )
    end = time.monotonic() + deadline
    with psycopg.connect(url, autocommit=True) as admin:
        while busy := admin.execute(
            f"SELECT wait_event, query FROM pg_stat_activity {running}", (application, application)
        ).fetchall():
            assert time.monotonic() < end, f"statements of {application} did not end: {busy}"
        rows = admin.execute(
            f"SELECT pid FROM pg_stat_activity {where} AND state <> 'idle'", (application,)
        ).fetchall()
    return [pid for (pid,) in rows]
