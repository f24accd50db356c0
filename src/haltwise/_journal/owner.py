"""Who owns a run, and whether that owner is still alive."""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Protocol

from .._core.records import Owner
from .._core.states import State

#: Seconds a lease lasts without a heartbeat (CONTRACT.md: default 15 s).
DEFAULT_LEASE = 15.0


def _process_start(pid: int) -> float | None:
    """The start time of process ``pid`` in clock ticks since boot, or None if it is gone.

    Comparing it with the recorded value tells a live owner from a new process that reused its pid.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return float(fields[19])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


HOST = socket.gethostname()


def new_owner() -> Owner:
    """A fresh owner identity for this process (a new token every call)."""
    pid = os.getpid()
    return Owner(token=uuid.uuid4().hex, host=HOST, pid=pid, started=_process_start(pid) or 0.0)


def owner_alive(owner: Owner, lease_until: float | None, *, now: float | None = None) -> bool:
    """Whether ``owner`` may still be working the run.

    On this host the answer is exact and immediate: the process exists and started when the owner
    did. On another host only the lease can tell: alive until ``lease_until`` has passed.
    """
    if owner.host == HOST:
        if not _pid_exists(owner.pid):
            return False
        started = _process_start(owner.pid)
        return started is None or not owner.started or started == owner.started
    return lease_until is not None and lease_until > (now if now is not None else time.time())


class Leased(Protocol):
    """What says whether someone works a run (a ``RunRecord`` and a ``CancelledRun`` have it)."""

    @property
    def state(self) -> State: ...

    @property
    def owner(self) -> Owner | None: ...

    @property
    def lease_until(self) -> float | None: ...


def held_by_live_owner(run: Leased) -> bool:
    """Whether someone is working ``run``: it is active (not final) and its owner is alive.

    A final run is never held (whatever its owner column says), and neither is an active run
    with no owner (submitted and not claimed, or released by a worker's SIGTERM).
    """
    return (
        not run.state.is_final and run.owner is not None and owner_alive(run.owner, run.lease_until)
    )
