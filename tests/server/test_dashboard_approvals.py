"""The approvals on the dashboard, in a real browser (headless Chromium, Selenium) against a real
server: the page of pending requests (run, step, tool, arguments, waiting since, time left), and
on a run's page Approve, Edit and Refuse with a note, nothing preselected; the read-only token
sees the requests without the buttons."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from _approvals_kit import AGENT, awaiting, finished
from _browser import chromium
from _serve import PATIENCE, Served, start_server


@pytest.fixture
def served(tmp_path: Path, sqlite_url: str) -> Iterator[Served]:
    env = {"HALTWISE_READ_TOKEN": "reader-token"}
    with start_server(tmp_path, sqlite_url, env=env, agent=AGENT) as server:
        yield server


def browse(served: Served, token: str) -> WebDriver:
    driver = chromium()
    driver.get(f"{served.base}/?token={token}")
    return driver


def wait(driver: WebDriver, what: str, condition: object) -> object:
    waiting = WebDriverWait(driver, PATIENCE, ignored_exceptions=[StaleElementReferenceException])
    return waiting.until(condition, message=what)  # type: ignore[arg-type]


def click(driver: WebDriver, what: str, css: str) -> None:
    def clicked(d: WebDriver) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait(driver, what, clicked)


def fill(driver: WebDriver, what: str, css: str, text: str) -> None:
    def filled(d: WebDriver) -> bool:
        field = d.find_element(By.CSS_SELECTOR, css)
        field.clear()
        field.send_keys(text)
        return True

    wait(driver, what, filled)


ARGS = "#approvals .approval-arguments"
EDIT = "#approvals .approval-edit"
APPROVE_EDITED = "#approvals .approval-approve-edited"


def shown(css: str, attribute: str | None = None) -> object:
    """A condition: the element shows something (its text, or ``attribute``)."""

    def condition(d: WebDriver) -> str:
        element = d.find_element(By.CSS_SELECTOR, css)
        return (element.get_attribute(attribute) if attribute else element.text) or ""

    return condition


def test_the_approvals_page_and_deciding_on_a_run_s_page(served: Served) -> None:
    for run_id in ("e1", "r1"):
        assert served.post("/api/runs", {"task": "buy", "id": run_id}).status == 201
    awaiting(served, "e1", "r1")
    reader = browse(served, "reader-token")
    try:
        reader.get(f"{served.base}/#/approvals")
        rows = "#approvals-list tbody tr"
        wait(
            reader,
            "both requests listed",
            lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 2,
        )
        text = reader.find_element(By.ID, "approvals-list").text
        assert "pay" in text and '"amount": 5' in text and "no timeout" in text
        reader.get(f"{served.base}/#/run/e1")
        wait(
            reader,
            "the request's arguments",
            lambda d: (
                '"to": "bob"'
                in d.find_element(By.CSS_SELECTOR, "#approvals .approval-arguments").text
            ),
        )
        assert reader.find_elements(By.CSS_SELECTOR, "#approvals button") == [], (
            "read-only: no buttons"
        )
    finally:
        reader.quit()
    operator = browse(served, served.token)
    try:
        operator.get(f"{served.base}/#/run/e1")
        wait(
            operator,
            "the arguments",
            lambda d: d.find_element(
                By.CSS_SELECTOR, "#approvals .approval-arguments"
            ).get_attribute("data-arguments"),
        )
        click(operator, "Edit", "#approvals .approval-edit-open")
        fill(
            operator,
            "the edited arguments",
            "#approvals .approval-edit",
            '{"amount": "lots", "to": "bob"}',
        )
        click(operator, "Approve with these arguments", "#approvals .approval-approve-edited")
        wait(
            operator,
            "a misfit edit refused",
            lambda d: "amount" in d.find_element(By.ID, "toast").text,
        )
        fill(
            operator,
            "the edited arguments",
            "#approvals .approval-edit",
            '{"amount": 3, "to": "bob"}',
        )
        fill(operator, "who", "#approvals .approval-by", "ops")
        click(operator, "Approve with these arguments", "#approvals .approval-approve-edited")
        assert finished(served, "e1")["result"] == "paid 3 to bob"
        operator.get(f"{served.base}/#/run/r1")
        fill(operator, "the note", "#approvals .approval-note", "too expensive")
        fill(operator, "who", "#approvals .approval-by", "ops")
        click(operator, "Refuse", "#approvals .approval-refuse")
        refused = finished(served, "r1")
        assert refused["result"] == "refused: [haltwise] refused by ops: too expensive"
        operator.get(f"{served.base}/#/approvals")
        wait(operator, "nothing pending", lambda d: d.find_elements(By.ID, "no-approvals"))
    finally:
        operator.quit()
    assert (served.root / "effects.log").read_text().split() == ["pay:3:bob"]
