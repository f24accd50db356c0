"""Headless Chromium from Debian's packages, driven by Selenium (``make test`` installs both
through scripts/ensure-chromium.sh; a missing browser is an error, never a skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ensure-chromium.sh"


def browser_paths() -> tuple[str, str]:
    """The chromium and chromedriver executables (installed by the script when absent)."""
    browser = os.environ.get("HALTWISE_CHROMIUM") or shutil.which("chromium")
    driver = os.environ.get("HALTWISE_CHROMEDRIVER") or shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    found = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, check=True)
    browser, driver = found.stdout.split()[:2]
    return browser, driver


def chromium(width: int = 1280, height: int = 900) -> webdriver.Chrome:
    browser, driver = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)
