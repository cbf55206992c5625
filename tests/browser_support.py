"""A real headless Chromium for the console's tests and benchmark: Debian's ``chromium`` driven through
Debian's ``chromium-driver`` by Selenium, with an explicit driver path so nothing is ever downloaded."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver",)
INSTALL = "apt-get install chromium chromium-driver (and pip install selenium)"


def missing() -> str | None:
    """Why no browser test can run here, or None when Chromium, its driver and Selenium are present."""
    try:
        import selenium  # noqa: F401
    except ModuleNotFoundError:
        return f"selenium is not installed: {INSTALL}"
    if not any(Path(p).exists() for p in CHROMIUM):
        return f"no Chromium at {' or '.join(CHROMIUM)}: {INSTALL}"
    if not any(Path(p).exists() for p in CHROMEDRIVER):
        return f"no chromedriver at {CHROMEDRIVER[0]}: {INSTALL}"
    return None


def chromium(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium (the caller quits it). Flags: no sandbox (root in CI), no background networking
    (the machine's closed network would refuse it), a fresh profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = next(p for p in CHROMIUM if Path(p).exists())
    profile = tempfile.mkdtemp(prefix="zkc-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(flag)
    service = Service(executable_path=next(p for p in CHROMEDRIVER if Path(p).exists()))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.zkc_profile = profile  # removed by quit()
    return driver


def quit_browser(driver: Any) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(getattr(driver, "zkc_profile", ""), ignore_errors=True)
