"""A research-and-notify agent: the demo of ``make demo``, and the explorer's test subject.

A scripted planner stands where a model would be. It is called as a tool (interruptible,
read: a model call changes nothing in the world) like a real model call, so that a resume
replays its decisions instead of asking again. The agent uses every cancel policy:

========================  ===============  ==========  ===========  ==========================
tool                      cancel           effect      idempotent   world it touches
========================  ===============  ==========  ===========  ==========================
plan_next (the "model")   interruptible    read        no           none (scripted)
search                    interruptible    read        no           a small local corpus
fetch_page                interruptible    read        no           the same corpus
save_note                 rollback         write       no           notes.db (SQLite)
charge_summary_api        finish           external    yes          ledger.jsonl (paid API)
post_message              finish           external    no           outbox.jsonl

The paid API and the channel can each be asked what happened to a call by its idempotency key:
their tools declare ``reconcile=`` hooks, so a step left ``unknown`` by a forced cancel or a
crash is settled by asking them, not by a person.
========================  ===============  ==========  ===========  ==========================

The world lives in the directory ``$DEMO_WORLD`` (default ``./demo-world``). Each tool reports
its real effects with ``record_effect`` (a no-op outside ``haltwise explore``), so that the
explorer can check that no effect happens twice, whatever the cancel point.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio

import haltwise
from haltwise.testing import record_effect

WORLD = Path(os.environ.get("DEMO_WORLD", "demo-world"))
#: Seconds each simulated network call takes; the demo cancels while one is in flight.
LATENCY = float(os.environ.get("DEMO_LATENCY", "0.25"))
#: If set, a file the paid API waits for before it answers (at most a minute): ``make demo``
#: sets it, so that its cancel lands while the call is in flight however slow the machine is.
API_GATE = os.environ.get("DEMO_API_GATE")

CORPUS = {
    "solar storms": [
        "https://example.org/carrington-1859",
        "https://example.org/may-2024-aurora",
        "https://example.org/grid-protection",
    ],
}
PAGES = {
    "https://example.org/carrington-1859": "The 1859 Carrington event set telegraph lines alight.",
    "https://example.org/may-2024-aurora": "In May 2024 auroras were seen as far south as Mexico.",
    "https://example.org/grid-protection": "Operators can shed load when a CME is forecast.",
}


def _world() -> Path:
    WORLD.mkdir(parents=True, exist_ok=True)
    return WORLD


def _notes() -> sqlite3.Connection:
    conn = sqlite3.connect(_world() / "notes.db")
    conn.execute("CREATE TABLE IF NOT EXISTS notes (text TEXT NOT NULL)")
    return conn


def _append(name: str, record: dict[str, Any]) -> None:
    with open(_world() / name, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@haltwise.tool(cancel="interruptible", effect="read")
async def plan_next(topic: str, done: list[str]) -> dict[str, Any]:
    """Decide the next action (a scripted stand-in for a model call)."""
    await anyio.sleep(LATENCY / 5)
    if "search" not in done:
        return {"action": "search", "query": topic}
    fetched = [d.removeprefix("fetch ") for d in done if d.startswith("fetch ")]
    for url in CORPUS.get(topic, []):
        if url not in fetched:
            return {"action": "fetch", "url": url}
    if "charge" not in done:
        return {"action": "summarise"}
    if "post" not in done:
        return {"action": "post"}
    return {"action": "finish"}


@haltwise.tool(cancel="interruptible", effect="read")
async def search(query: str) -> list[str]:
    """Search the corpus for pages about ``query``."""
    await anyio.sleep(LATENCY)
    return CORPUS.get(query, [])


@haltwise.tool(cancel="interruptible", effect="read")
async def fetch_page(url: str) -> str:
    """Fetch one page's text."""
    await anyio.sleep(LATENCY)
    return PAGES[url]


def delete_note(text: str) -> None:
    """Compensation of save_note: delete the note it inserted."""
    with _notes() as conn:
        removed = conn.execute("DELETE FROM notes WHERE text = ?", (text,)).rowcount
    if removed:
        record_effect("note", undo=True)


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_note, grace=5.0)
def save_note(text: str) -> int:
    """Save a note in the local notes database; returns how many notes there are."""
    with _notes() as conn:
        conn.execute("INSERT INTO notes (text) VALUES (?)", (text,))
    record_effect("note")
    time.sleep(LATENCY / 2)  # the rest of a slow write: a cancel may land here
    with _notes() as conn:
        return int(conn.execute("SELECT count(*) FROM notes").fetchone()[0])


async def _api_answers() -> None:
    """Wait until the paid API answers: at once, unless ``$DEMO_API_GATE`` names a file that
    does not exist yet (then until it does, for at most a minute)."""
    deadline = time.monotonic() + 60
    while API_GATE and not os.path.exists(API_GATE) and time.monotonic() < deadline:
        await anyio.sleep(0.01)


def _charged(key: str) -> bool:
    ledger = _world() / "ledger.jsonl"
    seen = ledger.read_text().splitlines() if ledger.exists() else []
    return any(json.loads(line)["key"] == key for line in seen)


def find_charge(text: str) -> haltwise.Happened | haltwise.NotHappened:
    """The paid API's reconcile hook: ask the provider for the charge of this step's key."""
    if _charged(haltwise.idempotency_key()):
        return haltwise.Happened(SUMMARY)
    return haltwise.NotHappened()


SUMMARY = "Solar storms: 1859 and 2024 show the risk; grids can shed load. (summary)"


@haltwise.tool(
    cancel="finish", effect="external", idempotent=True, grace=10.0, reconcile=find_charge
)
async def charge_summary_api(text: str) -> str:
    """Have a paid API summarise the notes. The API deduplicates by idempotency key."""
    key = haltwise.idempotency_key()
    await anyio.sleep(LATENCY * 4)  # a slow paid call: the demo cancels while it runs
    await _api_answers()
    if not _charged(key):
        _append("ledger.jsonl", {"key": key, "cents": 40})
        record_effect("charge", key=key)
    return SUMMARY


def find_post(text: str) -> haltwise.Happened | haltwise.NotHappened:
    """The channel's reconcile hook: look for the post of this step's key in the outbox."""
    outbox = _world() / "outbox.jsonl"
    lines = outbox.read_text().splitlines() if outbox.exists() else []
    key = haltwise.idempotency_key()
    if any(json.loads(line).get("key") == key for line in lines):
        return haltwise.Happened("posted")
    return haltwise.NotHappened()


@haltwise.tool(cancel="finish", effect="external", grace=10.0, reconcile=find_post)
async def post_message(text: str) -> str:
    """Post the summary to the team channel (an outbox file). Not idempotent, but the channel
    keeps the key each post was made with, so the reconcile hook can ask it."""
    await anyio.sleep(LATENCY)
    _append("outbox.jsonl", {"text": text, "key": haltwise.idempotency_key()})
    record_effect("post")
    return "posted"


@haltwise.task
async def research(topic: str = "solar storms") -> str:
    """Research ``topic``, save notes, buy a summary, post it."""
    done: list[str] = []
    summary = ""
    while True:
        plan = await plan_next(topic, done)
        action = plan["action"]
        if action == "search":
            hits = await search(plan["query"])
            haltwise.emit({"found": len(hits)})
            done.append("search")
        elif action == "fetch":
            page = await fetch_page(plan["url"])
            await save_note(page)
            haltwise.emit({"note": page})
            done.append(f"fetch {plan['url']}")
        elif action == "summarise":
            summary = await charge_summary_api(topic)
            haltwise.emit({"summary": summary})
            done.append("charge")
        elif action == "post":
            await post_message(summary)
            done.append("post")
        else:
            return summary
