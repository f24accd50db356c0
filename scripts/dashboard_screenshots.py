"""Take the dashboard screenshots in docs/: the runs page and a cancelling run's page.

A real ``haltwise serve`` on a scratch store, a few runs in every state (one of them cancelling,
its send_email step in its grace), and headless Chromium (scripts/ensure-chromium.sh).

usage: .venv/bin/python scripts/dashboard_screenshots.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from _browser import chromium  # noqa: E402
from _serve import Served, start_server  # noqa: E402

AGENT = """
import anyio
import haltwise


@haltwise.tool(cancel="interruptible", effect="read")
async def search(topic: str) -> list:
    return [f"{topic}: result {i}" for i in (1, 2)]


@haltwise.tool(cancel="interruptible", effect="read")
async def call_model(prompt: str) -> str:
    await anyio.sleep(3600)
    return "an answer"


@haltwise.tool(cancel="finish", effect="external", grace=45)
async def send_email(to: str, body: str) -> str:
    await anyio.sleep(3600)
    return "sent"


def delete_note(text: str) -> None:
    pass


@haltwise.tool(cancel="rollback", effect="write", compensate=delete_note)
async def insert_note(text: str) -> int:
    return 1


@haltwise.task
async def research(topic: str = "cats"):
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
        await insert_note(hit)
    return await send_email("me@example.com", f"notes on {topic}")


@haltwise.task
async def think(topic: str = "dogs"):
    await search(topic)
    return await call_model(topic)


@haltwise.task
async def quick(topic: str = "birds"):
    for hit in await search(topic):
        haltwise.emit({"hit": hit})
    return "done"


@haltwise.task
async def broken(topic: str = "fish"):
    await search(topic)
    raise ValueError("the index is down")
"""


def wait_steps(served: Served, run_id: str, count: int) -> None:
    served.wait_for(run_id, f"{count} steps", lambda run: len(run["steps"]) >= count)


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        served = start_server(
            root, f"sqlite:///{root}/haltwise.db", "--concurrency", "8", agent=AGENT
        )
        try:
            take(served)
        finally:
            served.stop()


def take(served: Served) -> None:
    post = served.post
    post("/api/runs", {"task": "quick", "id": "quick-birds"})
    post("/api/runs", {"task": "broken", "id": "broken-fish"})
    post("/api/runs", {"task": "think", "id": "think-dogs", "input": {"topic": "dogs"}})
    post("/api/runs", {"task": "think", "id": "think-owls", "input": {"topic": "owls"}})
    post("/api/runs", {"task": "research", "id": "research-cats"})
    wait_steps(served, "think-dogs", 2)
    wait_steps(served, "think-owls", 2)
    wait_steps(served, "research-cats", 4)
    post("/api/runs/think-owls/cancel", {"reason": "budget"})
    post("/api/runs/research-cats/cancel", {"reason": "the user changed the topic"})
    time.sleep(3)
    browser = chromium(1200, 760)
    try:
        browser.get(f"{served.base}/?token={served.token}")
        time.sleep(1.5)
        browser.save_screenshot(str(ROOT / "docs" / "dashboard-runs.png"))
        browser.set_window_size(1200, 1250)
        browser.get(f"{served.base}/#/run/research-cats")
        time.sleep(1.5)
        browser.save_screenshot(str(ROOT / "docs" / "dashboard-cancelling.png"))
    finally:
        browser.quit()
    print("wrote docs/dashboard-runs.png and docs/dashboard-cancelling.png")


if __name__ == "__main__":
    main()
