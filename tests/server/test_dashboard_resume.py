"""The dashboard's resume dialog and a run's code version, in a real browser (headless Chromium,
Selenium) against a real ``haltwise serve FILE.py`` (issue 32; issue 29, item 12's progress).

A run pays and posts at once; a forced cancel leaves both calls ``unknown``. The runs list shows
how far it got (steps committed / journaled). In the resume dialog the paid call, whose tool has
a reconcile hook, has "ask the hook" chosen; the post, whose tool has none, has nothing chosen,
and resuming without a choice is refused with nothing sent. The task's file is then edited: the
server answers the resume 409 ``code_changed``, the dialog says so and offers to resume with the
changed code; ticked, the run resumes, the hook says the charge happened (charged once), the post
runs again as the operator chose, and the run page shows the code version "changed".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from _browser import chromium
from _serve import PATIENCE, Served, start_server

AGENT = '''
import asyncio
from pathlib import Path

import anyio

import haltwise

HERE = Path(__file__).parent


async def until_released(name, limit=600.0):
    gate = HERE / f"release-{name}"
    with anyio.fail_after(limit):  # only ends a process a failed test left waiting
        while not gate.exists():
            await anyio.sleep(0.005)


def lines(name):
    path = HERE / name
    return path.read_text().splitlines() if path.exists() else []


def ask_provider(amount):
    """The reconcile hook: the provider's ledger holds the charge of this step's key, or not."""
    if haltwise.idempotency_key() in lines("charges"):
        return haltwise.Happened(f"receipt-{amount}")
    return haltwise.NotHappened()


@haltwise.tool(cancel="finish", effect="external", grace=0.1, reconcile=ask_provider)
async def charge(amount: int) -> str:
    with open(HERE / "charges", "a") as ledger:
        ledger.write(haltwise.idempotency_key() + "\\n")
    await until_released("charge")
    return f"receipt-{amount}"


@haltwise.tool(cancel="finish", effect="external", grace=0.1)
async def post(text: str) -> str:
    with open(HERE / "posts", "a") as posts:
        posts.write(text + "\\n")
    await until_released("post")
    return "posted"


@haltwise.task
async def pay_and_post(amount: int = 3):
    return list(await asyncio.gather(charge(amount), post("paid")))
'''


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    with start_server(tmp_path, sqlite_url, agent=AGENT) as server:
        try:
            yield server
        finally:
            server.release("charge")
            server.release("post")


def wait(driver: WebDriver, what: str, condition: object) -> object:
    """Poll ``condition`` (the page re-renders live: an element may go stale, so every read is
    made inside the condition)."""
    waiting = WebDriverWait(driver, PATIENCE, ignored_exceptions=[StaleElementReferenceException])
    return waiting.until(condition, message=what)  # type: ignore[arg-type]


def click(driver: WebDriver, what: str, by: str, value: str) -> None:
    def clicked(d: WebDriver) -> bool:
        d.find_element(by, value).click()
        return True

    wait(driver, what, clicked)


def lines(served: Served, name: str) -> list[str]:
    path = served.root / name
    return path.read_text().splitlines() if path.exists() else []


def test_the_resume_dialog_asks_what_happened_and_about_a_changed_file(
    served: Served, tmp_path: Path
) -> None:
    answer = served.post("/api/runs", {"task": "pay_and_post", "id": "p1"})
    assert answer.status == 201, answer.body
    served.wait_for("p1", "both calls in flight", lambda run: len(run["steps"]) == 2)
    assert served.post("/api/runs/p1/cancel", {"force": True}).status == 202
    run = served.wait_for("p1", "cancelled", lambda run: run["state"] == "cancelled")
    assert [(s["tool"], s["status"]) for s in run["steps"]] == [
        ("charge", "unknown"),
        ("post", "unknown"),
    ]
    assert run["code"]["changed"] is False
    served.release("charge")
    served.release("post")

    driver = chromium()
    try:
        driver.get(f"{served.base}/?token={served.token}")
        # the runs list: how far each run got, steps committed / steps journaled
        wait(
            driver,
            "the progress column",
            lambda d: (
                d.find_element(By.CSS_SELECTOR, '#runs tr[data-id="p1"] .progress').text == "0/2"
            ),
        )
        driver.get(f"{served.base}/#/run/p1")
        wait(
            driver,
            "the code version",
            lambda d: (
                "agent.py (sha256 " in d.find_element(By.ID, "run-code").text
                and "changed" not in d.find_element(By.ID, "run-code").text
            ),
        )
        click(driver, "the Resume button", By.ID, "resume")
        wait(driver, "the resume form", lambda d: d.find_element(By.ID, "resume-form"))
        hook = driver.find_element(By.CSS_SELECTOR, 'input[name="step-0"][value="hook"]')
        assert hook.is_selected(), "a tool with a reconcile hook: asking it is chosen"
        post_choices = driver.find_elements(By.CSS_SELECTOR, 'input[name="step-1"]')
        assert [c.get_attribute("value") for c in post_choices] == ["done", "rerun"]
        assert not any(c.is_selected() for c in post_choices), "nothing chosen for the operator"

        click(driver, "Resume without a choice", By.ID, "resume-submit")
        wait(
            driver,
            "the refusal",
            lambda d: (
                "say what happened to step 1 (post) first" in d.find_element(By.ID, "toast").text
            ),
        )
        assert served.get("/api/runs/p1").json()["state"] == "cancelled", "nothing was sent"

        # the task's file changes while the dialog is open
        agent = served.root / "agent.py"
        agent.write_text(agent.read_text() + "\n# edited after the run began\n")
        click(driver, "it did not happen", By.CSS_SELECTOR, 'input[name="step-1"][value="rerun"]')
        click(driver, "Resume", By.ID, "resume-submit")
        wait(
            driver,
            "the dialog says the file changed",
            lambda d: "agent.py" in d.find_element(By.ID, "code-changed-message").text,
        )
        assert not driver.find_element(By.ID, "allow-code-change").is_selected()
        assert served.get("/api/runs/p1").json()["state"] == "cancelled", "409: not resumed"
        click(driver, "Resume again, unticked", By.ID, "resume-submit")
        wait(
            driver,
            "the refusal to run changed code unasked",
            lambda d: "the task's file changed" in d.find_element(By.ID, "toast").text,
        )
        _screenshot(driver, tmp_path, "dashboard-resume-code-changed.png")
        click(driver, "allow the code change", By.ID, "allow-code-change")
        click(driver, "Resume with the changed code", By.ID, "resume-submit")
        done = served.wait_for("p1", "completed", lambda run: run["state"] == "completed")
        assert done["result"] == ["receipt-3", "posted"]
        assert [s["status"] for s in done["steps"]] == ["committed", "committed"]
        assert done["steps"][0]["reconciled"]["by"] == "hook"
        assert len(lines(served, "charges")) == 1, "the hook said it happened: charged once"
        assert lines(served, "posts") == ["paid", "paid"], "run again, as the operator chose"
        notes = [e.get("reason") or "" for e in done["events"]]
        assert any("code" in note for note in notes), done["events"]
        wait(
            driver,
            "the run page says the code changed",
            lambda d: "changed on disk" in d.find_element(By.ID, "run-code").text,
        )
        driver.get(f"{served.base}/#/")
        wait(
            driver,
            "the progress column of the completed run",
            lambda d: (
                d.find_element(By.CSS_SELECTOR, '#runs tr[data-id="p1"] .progress').text == "2/2"
            ),
        )
    finally:
        driver.quit()


def _screenshot(driver: WebDriver, tmp_path: Path, name: str) -> None:
    """Left in ``$HALTWISE_SCREENSHOTS`` (docs/ when taking the ones the docs show), else in
    the test's own folder."""
    folder = Path(os.environ.get("HALTWISE_SCREENSHOTS") or tmp_path)
    driver.save_screenshot(str(folder / name))
