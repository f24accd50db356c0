"""The dashboard in a real browser (headless Chromium, Selenium) against a real server.

The runs list follows a cancel made from the command line in another process, live; the
Cancel button cancels with the reason typed (a paused run's too); ids, reasons and partial results
holding HTML are shown as text, never run as markup; the run states the page knows, and which of
them each button applies to, come from haltwise (``haltwise._core.states``), not from its script.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import haltwise.server
from _browser import chromium
from _serve import AGENT, PATIENCE, Served, start_server
from haltwise import State


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    with start_server(tmp_path, sqlite_url) as server:
        try:
            yield server
        finally:
            server.release("think")


@pytest.fixture
def browser(served: Served) -> Iterator[WebDriver]:
    driver = chromium()
    try:
        driver.get(f"{served.base}/?token={served.token}")  # sets the cookie, redirects to /
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, what: str, condition: object) -> object:
    """Poll ``condition`` until it holds. The pages re-render live (on every change of the
    journal), so an element found a moment ago may be gone: every read of the page is made
    inside a condition, which a stale element makes look again."""
    waiting = WebDriverWait(driver, PATIENCE, ignored_exceptions=[StaleElementReferenceException])
    return waiting.until(condition, message=what)  # type: ignore[arg-type]


def click(driver: WebDriver, what: str, by: str, value: str) -> None:
    """Click the element found by ``by``/``value`` (found afresh if a re-render replaced it)."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(by, value).click()
        return True

    wait(driver, what, clicked)


def text_of(driver: WebDriver, what: str, by: str, value: str, expected: str) -> None:
    """Wait until the element found by ``by``/``value`` shows ``expected``."""
    wait(driver, what, lambda d: d.find_element(by, value).text == expected)


def row_state(driver: WebDriver, run_id: str) -> str | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'#runs tr[data-id="{run_id}"] .badge')
    return rows[0].text if rows else None


def in_flight(served: Served, run_id: str) -> None:
    assert served.post("/api/runs", {"task": "research", "id": run_id}).status == 201
    served.wait_for(run_id, "think in flight", lambda run: len(run["steps"]) == 2)


def test_the_runs_list_follows_a_cancel_from_the_command_line(
    served: Served, browser: WebDriver
) -> None:
    in_flight(served, "live1")
    assert browser.current_url == f"{served.base}/"  # the token left the address bar
    wait(browser, "the run listed as running", lambda d: row_state(d, "live1") == "running")
    wait(
        browser,
        "the live feed connected",
        lambda d: "on" in d.find_element(By.ID, "live").get_attribute("class"),
    )
    cancelled = served.hw("cancel", "live1", "--reason", "from a shell")
    assert cancelled.returncode == 0, cancelled.stderr
    wait(browser, "the list showing it cancelled", lambda d: row_state(d, "live1") == "cancelled")
    row = '#runs tr[data-id="live1"] .reason'
    text_of(browser, "its reason", By.CSS_SELECTOR, row, "from a shell")


def test_the_cancel_button_cancels_with_the_typed_reason(
    served: Served, browser: WebDriver
) -> None:
    in_flight(served, "button1")
    browser.get(f"{served.base}/#/run/button1")
    wait(browser, "the run page", lambda d: d.find_elements(By.ID, "cancel-reason"))

    def typed(d: WebDriver) -> bool:
        d.find_element(By.ID, "cancel-reason").send_keys("typed in the browser")
        return True

    wait(browser, "the reason typed", typed)
    click(browser, "the Cancel button", By.ID, "cancel")
    run = served.wait_for("button1", "cancelled", lambda r: r["state"] == "cancelled")
    assert run["reason"] == "typed in the browser"
    text_of(browser, "the page showing it", By.CSS_SELECTOR, "h1 .badge", "cancelled")
    text_of(browser, "its reason", By.ID, "run-reason", "typed in the browser")
    wait(browser, "its steps", lambda d: step_statuses(d) == ["committed", "interrupted"])


def test_html_in_ids_reasons_and_partials_is_shown_as_text(
    served: Served, browser: WebDriver
) -> None:
    hostile = "<img src=x onerror=\"document.title='owned'\">"
    topic = "<script>document.title='owned'</script>"
    created = served.post(
        "/api/runs", {"task": "research", "id": hostile, "input": {"topic": topic}}
    )
    assert created.status == 201
    served.wait_for(hostile, "think in flight", lambda run: len(run["steps"]) == 2)
    assert (
        served.post(f"/api/runs/{quote(hostile, safe='')}/cancel", {"reason": "<b>bold</b>"}).status
        == 202
    )
    served.wait_for(hostile, "cancelled", lambda r: r["state"] == "cancelled")
    browser.get(f"{served.base}/")
    text_of(browser, "the hostile row, as text", By.CSS_SELECTOR, "#runs a.run-link", hostile)
    click(browser, "its link", By.CSS_SELECTOR, "#runs a.run-link")
    text_of(browser, "the run page's id, as text", By.ID, "run-id", hostile)
    text_of(browser, "its reason, as text", By.ID, "run-reason", "<b>bold</b>")
    shown = [f'{{\n "hit": "{topic}-a"\n}}', f'{{\n "hit": "{topic}-b"\n}}']
    wait(browser, "the partials, as text", lambda d: texts(d, "#partials pre") == shown)
    for tag in ("img", "b", "script"):
        assert not browser.find_elements(By.CSS_SELECTOR, f"#main {tag}"), tag
    assert browser.title == "haltwise"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def listed(driver: WebDriver) -> list[str]:
    """The ids in the runs list (call inside :func:`wait`: a re-render makes rows stale)."""
    return [
        row.get_attribute("data-id") or ""
        for row in driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    ]


def texts(driver: WebDriver, css: str) -> list[str]:
    """The texts of the elements ``css`` finds (call inside :func:`wait`)."""
    return [item.text for item in driver.find_elements(By.CSS_SELECTOR, css)]


def step_statuses(driver: WebDriver) -> list[str]:
    """The status column of the run page's steps (call inside :func:`wait`)."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#steps tbody tr")
    return [row.find_elements(By.TAG_NAME, "td")[4].text for row in rows]


def test_the_runs_list_pages_through_every_run(served: Served, browser: WebDriver) -> None:
    for i in range(5):
        assert served.post("/api/runs", {"task": "quick", "id": f"q{i}"}).status == 201
    for i in range(5):
        served.wait_for(f"q{i}", "completed", lambda run: run["state"] == "completed")
    browser.get(f"{served.base}/#/?limit=2")
    pages = (["q4", "q3"], ["q2", "q1"], ["q0"])  # every run once, newest first, then no more
    for number, page in enumerate(pages):
        wait(browser, f"the page {page}", lambda d, page=page: listed(d) == page)
        if number < len(pages) - 1:
            click(browser, "older runs", By.ID, "page-older")
    assert not browser.find_elements(By.ID, "page-older")
    click(browser, "the newest runs", By.ID, "page-newest")
    wait(browser, "back at the newest", lambda d: listed(d) == ["q4", "q3"])


# -- the states come from haltwise, not from the page's script ------------------------------------


def test_the_page_takes_the_states_from_haltwise(served: Served, browser: WebDriver) -> None:
    wait(browser, "the runs page", lambda d: d.find_elements(By.ID, "filter-state"))
    table = browser.execute_script(
        'return JSON.parse(document.getElementById("states").textContent)'
    )
    assert table == {
        "all": [state.value for state in State],
        "final": ["cancelled", "completed", "failed"],
        "active": ["pending", "running", "cancelling", "paused"],
        "pausable": ["pending", "running"],
        "resumable": ["cancelled", "failed"],
    }
    options = wait(browser, "the state filter", lambda d: texts(d, "#filter-state option"))
    assert options == ["any state", *(state.value for state in State)]


def test_the_script_keeps_no_list_of_states() -> None:
    """A list of two or more state words in app.js would be a second home for the states."""
    script = (Path(haltwise.server.__file__).parent / "static" / "app.js").read_text()
    word = "|".join(state.value for state in State)
    a_list = re.compile(rf'\[\s*"(?:{word})"\s*,\s*"(?:{word})"')
    assert a_list.findall('["paused", "failed"].includes(s)'), "the check sees a list"
    assert a_list.findall(script) == []


def buttons(driver: WebDriver) -> dict[str, bool]:
    """Whether each button of the run page is enabled (call inside :func:`wait`)."""
    names = ("cancel", "force", "pause", "unpause", "resume")
    return {name: driver.find_element(By.ID, name).is_enabled() for name in names}


def test_a_paused_run_is_cancelled_from_its_page(served: Served, browser: WebDriver) -> None:
    in_flight(served, "held1")
    assert served.post("/api/runs/held1/pause", {}).status == 202
    served.release("think")  # the step in flight ends, then the run is held at a checkpoint
    served.wait_for("held1", "paused", lambda run: run["state"] == "paused")
    browser.get(f"{served.base}/#/run/held1")
    offered = {"cancel": True, "force": True, "pause": False, "unpause": True, "resume": False}
    wait(browser, "cancel and unpause offered", lambda d: buttons(d) == offered)
    click(browser, "the Cancel button", By.ID, "cancel")
    run = served.wait_for("held1", "cancelled", lambda r: r["state"] == "cancelled")
    assert run["reason"] == "user"
    text_of(browser, "the page showing it", By.CSS_SELECTOR, "h1 .badge", "cancelled")
    offered = {"cancel": False, "force": False, "pause": False, "unpause": False, "resume": True}
    wait(browser, "only resume offered", lambda d: buttons(d) == offered)


#: The served agent plus a task whose step in flight is a rollback step (undone by its
#: compensation, which only the task's code can run).
UNDOABLE = (
    AGENT
    + """

def unwrite(name: str) -> None:
    (HERE / f"undone-{name}").touch()


@haltwise.tool(cancel="rollback", effect="write", compensate=unwrite)
async def write(name: str) -> str:
    await until_released("write")
    return name


@haltwise.task
async def undoable(name: str = "w"):
    return await write(name)
"""
)


def test_an_orphan_the_server_cannot_settle_says_why_it_stays_cancelling(
    tmp_path: Path, sqlite_url: str
) -> None:
    """Its owner killed mid rollback step, a run cancelled through a server that has not loaded
    its file stays ``cancelling``: settling it needs the compensation's code. The API and the
    run's page say so, and name the command that finishes the cancel."""
    server = start_server(tmp_path, sqlite_url, file=False, agent=UNDOABLE)
    command = ["run", "agent.py:undoable", "--id", "o1", "--store", server.store]
    worked = subprocess.Popen(
        [sys.executable, "-m", "haltwise", *command],
        cwd=server.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        server.wait_for("o1", "its rollback step in flight", lambda r: len(r["steps"]) == 1)
        worked.kill()  # kill -9: nobody works the run any more
        worked.wait(timeout=PATIENCE)
        answer = server.post("/api/runs/o1/cancel", {"reason": "orphan"})
        assert (answer.status, answer.json()["state"]) == (202, "cancelling")
        run = server.wait_for("o1", "not owned", lambda r: not (r["owner"] or {}).get("alive"))
        words = run["stays_cancelling"]
        assert words.startswith("run o1 stays cancelling: nobody works it"), words
        assert f"haltwise worker {tmp_path.resolve() / 'agent.py'}" in words
        assert not (tmp_path / "undone-w").exists()  # no compensation ran, none was skipped
        driver = chromium()
        try:
            driver.get(f"{server.base}/?token={server.token}")
            driver.get(f"{server.base}/#/run/o1")
            text_of(driver, "why it stays cancelling", By.ID, "stays-cancelling", words)
        finally:
            driver.quit()
        assert server.get("/api/runs/o1").json()["state"] == "cancelling"
    finally:
        worked.kill()
        server.release("write")
        server.stop()


# -- issue 29, items 9-12: what a new user meets on the dashboard --------------------------------


def screenshots(tmp_path: Path) -> Path:
    """Where the test leaves its screenshots: ``$HALTWISE_SCREENSHOTS`` (docs/ when taking the
    ones the docs show), else the test's own folder."""
    import os

    return Path(os.environ.get("HALTWISE_SCREENSHOTS") or tmp_path)


def test_a_read_only_page_offers_no_change_and_the_pages_say_what_they_mean(
    tmp_path: Path, sqlite_url: str
) -> None:
    server = start_server(tmp_path, sqlite_url, env={"HALTWISE_READ_TOKEN": "reader-token"})
    driver = chromium()
    try:
        in_flight(server, "ro1")
        assert server.post("/api/runs", {"task": "quick", "id": "done1"}).status == 201
        server.wait_for("done1", "completed", lambda r: r["state"] == "completed")
        # item 9: the read-only token sees the run, and no button it would be refused
        driver.get(f"{server.base}/?token=reader-token")
        driver.get(f"{server.base}/#/run/ro1")
        wait(driver, "the read-only note", lambda d: d.find_elements(By.ID, "read-only"))
        for button in ("cancel", "force", "pause", "resume"):
            assert not driver.find_elements(By.ID, button), button
        driver.get(f"{server.base}/#/")
        wait(driver, "the runs list", lambda d: row_state(d, "ro1") == "running")
        assert not driver.find_elements(By.ID, "cancel-selected")
        assert not driver.find_elements(By.CSS_SELECTOR, "input.pick")
        # the operator: the retry advice says its word once (item 10)
        driver.get(f"{server.base}/?token={server.token}")
        driver.get(f"{server.base}/#/run/done1")
        wait(driver, "the advice", lambda d: d.find_element(By.ID, "retry").text.strip())
        advice = driver.find_element(By.ID, "retry").text
        assert advice.split(" — ")[0] == "none" and "none: " not in advice, advice
        # item 11: the audit page says "not used" for an interruptible tool's grace, and what a
        # cancel mid-call leaves
        driver.get(f"{server.base}/#/audit")
        wait(
            driver,
            "the audit table",
            lambda d: d.find_elements(By.CSS_SELECTOR, "#audit td.leaves"),
        )
        graces = texts(driver, "#audit td.grace")
        assert graces[0] == "not used", graces  # search, interruptible
        assert all(cell for cell in texts(driver, "#audit td.leaves"))
        # item 12: a run found by its id; runs cancelled by ticking them; cancelling and
        # cancelled in colours apart
        driver.get(f"{server.base}/#/")
        wait(driver, "the runs list", lambda d: row_state(d, "ro1") == "running")
        # when each run began and how long it took
        done1 = '#runs tr[data-id="done1"]'
        wait(
            driver,
            "the run's start and duration",
            lambda d: (
                texts(d, f"{done1} td.started")[0]
                and texts(d, f"{done1} td.took")[0].endswith(("ms", " s"))
            ),
        )
        wait(driver, "run ro1 ticked", lambda d: tick(d, 'input.pick[data-pick="ro1"]'))
        click(driver, "Cancel selected", By.ID, "cancel-selected")
        server.wait_for("ro1", "cancelled", lambda r: r["state"] == "cancelled")
        wait(driver, "the list showing it", lambda d: row_state(d, "ro1") == "cancelled")
        colour = driver.find_element(
            By.CSS_SELECTOR, '#runs tr[data-id="ro1"] .badge'
        ).value_of_css_property("background-color")
        amber = "rgba(254, 243, 199, 1)"  # cancelling's
        assert colour != amber, colour
        driver.save_screenshot(str(screenshots(tmp_path) / "dashboard-runs-bulk.png"))
        driver.find_element(By.ID, "find-id").send_keys("done1\n")
        wait(driver, "the run's page", lambda d: d.find_elements(By.ID, "fork"))
        # a dead server: the page says it is stale
        assert server.stop() == 0
        wait(
            driver,
            "the stale banner",
            lambda d: d.find_element(By.ID, "live").text == "disconnected: this page is stale",
        )
        driver.save_screenshot(str(screenshots(tmp_path) / "dashboard-stale.png"))
    finally:
        driver.quit()
        server.release("think")
        server.stop()


#: The served agent plus a task whose budget lets one tool call begin, then pauses the run.
METERED = (
    AGENT
    + """

@haltwise.tool(cancel="interruptible", effect="read")
async def tick(i: int) -> int:
    return i


@haltwise.task(budget=haltwise.Budget(tool_calls=1, on_exhaust="pause"))
async def metered() -> int:
    for i in range(3):
        await tick(i)
    return 3
"""
)


def test_a_run_paused_for_its_budget_is_raised_from_its_page(
    tmp_path: Path, sqlite_url: str
) -> None:
    """Issue 33: the run's page shows what it spent against its limit, and a run paused for its
    budget is raised and unpaused from it; the list shows what each run spent."""
    with start_server(tmp_path, sqlite_url, agent=METERED) as served:
        assert served.post("/api/runs", {"task": "metered", "id": "m1"}).status == 201
        paused = served.wait_for("m1", "paused for its budget", lambda r: r["state"] == "paused")
        assert paused["reason"] == "budget"
        driver = chromium()
        try:
            driver.get(f"{served.base}/?token={served.token}")
            driver.get(f"{served.base}/#/run/m1")
            wait(
                driver,
                "spent against the limit",
                lambda d: "1 of 1 tool calls" in d.find_element(By.ID, "run-budget").text,
            )

            def typed(d: WebDriver) -> bool:
                d.find_element(By.ID, "raise-tool_calls").send_keys("5")
                return True

            wait(driver, "the raised limit typed", typed)
            click(driver, "the Raise button", By.ID, "raise")
            run = served.wait_for("m1", "completed", lambda r: r["state"] == "completed")
            assert run["budget"]["limit"]["tool_calls"] == 5
            assert run["budget"]["spent"]["tool_calls"] == 3
            driver.get(f"{served.base}/#/")
            wait(
                driver,
                "the list showing what it spent",
                lambda d: (
                    "3 tool calls"
                    in d.find_element(By.CSS_SELECTOR, '#runs tr[data-id="m1"] .spent').text
                ),
            )
        finally:
            driver.quit()


def tick(driver: WebDriver, selector: str) -> bool:
    """Tick the checkbox at ``selector`` once: the live list may draw its row anew between
    finding the box and clicking it (then the next poll finds the new one)."""
    try:
        box = driver.find_element(By.CSS_SELECTOR, selector)
        if not box.is_selected():
            box.click()
        return bool(box.is_selected())
    except StaleElementReferenceException:
        return False
