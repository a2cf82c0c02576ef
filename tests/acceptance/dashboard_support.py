"""Helpers for the dashboard's acceptance tests (this module holds no tests):
``reorg dashboard`` run as a subprocess, a real headless Chromium driven by
Selenium through Debian's ``chromium`` and ``chromium-driver`` with a window
1,280 px wide, and screenshots kept under ``tests/artifacts/`` (git-ignored)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait
from support.processes import REORG, clean_env

from framework.localpg.cluster import free_port

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# The width the page must fit without a horizontal scroll bar (issue 26).
WIDTH = 1280


@dataclass
class Dashboard:
    base: str  # http://127.0.0.1:PORT
    port: int
    proc: subprocess.Popen[str]

    def output(self) -> str:
        self.stop()
        out, err = self.proc.communicate(timeout=10)
        return out + err

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextmanager
def running_dashboard(url: str, *args: str, **env: str) -> Iterator[Dashboard]:
    """``reorg --db URL dashboard --port P ARGS`` until the block ends; yields
    once the page answers."""
    assert REORG, "the `reorg` command is not installed; run `pip install -e .`"
    port = free_port()
    proc = subprocess.Popen([REORG, "--db", url, "dashboard", "--port", str(port), *args],
                            env=clean_env(**env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dashboard = Dashboard(f"http://127.0.0.1:{port}", port, proc)
    try:
        deadline = time.monotonic() + 30
        while not _answers(dashboard.base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dashboard did not start:\n{dashboard.output()}")
            time.sleep(0.1)
        yield dashboard
    finally:
        dashboard.stop()


def _answers(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def get_json(url: str, method: str = "GET") -> tuple[int, str, Any]:
    """A request as a script would send it: (status, content type, JSON body)."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], json.load(response)
    except urllib.error.HTTPError as error:
        body = error.read().decode()
        try:
            return error.code, error.headers["Content-Type"], json.loads(body)
        except ValueError:
            return error.code, error.headers["Content-Type"], body


def post(url: str, form: str) -> tuple[int, str]:
    """POST an urlencoded ``form`` as a script would: (status, body)."""
    request = urllib.request.Request(url, data=form.encode(), method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", "HX-Request": "true"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    """A headless Chromium, always quit at the end."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={WIDTH},1000"):
        options.add_argument(flag)
    # An explicit driver: Selenium Manager would otherwise try to download one.
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def text_of(browser: webdriver.Chrome, css: str) -> str:
    """What a person reads in the first element ``css`` selects (empty when
    there is none). Read in one script: the live parts of the page are swapped
    every second, so an element found in one call may be gone by the next."""
    return str(browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : ''",
        css))


def texts_of(browser: webdriver.Chrome, css: str) -> list[str]:
    """What a person reads in every element ``css`` selects, in page order."""
    return list(browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText.trim())",
        css))


def click(browser: webdriver.Chrome, by: str, value: str, timeout: float = 30) -> None:
    """A person's click on the element ``by``/``value`` selects. Found again
    when the live page swapped it between finding and clicking (a stale
    element), as a person would simply click the new one."""
    def clicked(_: object) -> bool:
        try:
            browser.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        return True

    WebDriverWait(browser, timeout, poll_frequency=0.1).until(clicked, f"a click on {value}")


def wait_for(browser: webdriver.Chrome, condition: Callable[[], object], timeout: float,
             what: str) -> None:
    WebDriverWait(browser, timeout, poll_frequency=0.2).until(lambda _: condition(), what)


def assert_no_horizontal_overflow(browser: webdriver.Chrome) -> None:
    """The page is no wider than the window (1,280 px): nothing to scroll
    sideways to, and the widest element named when it fails."""
    width, scroll, inner = browser.execute_script(
        "return [window.innerWidth, document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert width == WIDTH, f"the window is {width} px wide, not {WIDTH}"
    if scroll > width or inner > width:
        widest = browser.execute_script("""
            let widest = null;
            for (const e of document.querySelectorAll('body *')) {
                const right = e.getBoundingClientRect().right;
                if (!widest || right > widest[0]) widest = [right, e.tagName, e.id, e.className];
            }
            return widest;""")
        raise AssertionError(f"the page is {scroll} px wide at {width} px; widest: {widest}")


def screenshot(browser: webdriver.Chrome, name: str, *, whole_page: bool = False) -> Path:
    """Save the page (``whole_page``: all of it, not only what the window
    shows) as ``tests/artifacts/NAME`` and print where."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    size = browser.get_window_size()
    if whole_page:
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(size["width"], max(size["height"], int(height) + 120))
    try:
        browser.save_screenshot(str(path))
    finally:
        browser.set_window_size(size["width"], size["height"])
    print(f"dashboard screenshot: {path}")
    return path
