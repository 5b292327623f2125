"""The browser suite's headless Chromium, driven by Selenium through Debian's chromedriver (nothing is downloaded:
Debian's ``chromium`` and ``chromium-driver`` are installed with apt-get when missing, as root), and the folder the
suite's screenshots go to (``FORGE_BROWSER_OUT``, default a pytest temporary folder)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")


def _install() -> None:
    """apt-get install the packages when a binary is missing (an update first if the install fails)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if os.geteuid() != 0:
        pytest.fail(f"{CHROMIUM} or {CHROMEDRIVER} is missing: apt-get install {' '.join(PACKAGES)} (or run as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"apt-get install {' '.join(PACKAGES)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    given = os.environ.get("FORGE_BROWSER_OUT")
    out = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """A headless Chromium (1400 x 1000) that keeps its console log for the tests to read."""
    _install()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--no-first-run", "--disable-extensions",
                     f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER),
                      log_output=str(tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path_factory.getbasetemp() / "chromium-profile0", ignore_errors=True)
