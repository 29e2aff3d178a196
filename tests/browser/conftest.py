"""Real Chromium (Debian's ``chromium``, driven by playwright) against a real server.

Each test gets its own browser, closed before the leak check runs. When a test fails, the page
it was on is saved as a screenshot (and its HTML) in the test's tmp directory and under
``test-artifacts/browser/`` (kept after the run), and the paths are printed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, expect, sync_playwright

from tests.support.servers import Server, assert_clean_stop, start_server

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("TRAINHOUSE_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = REPO / "test-artifacts" / "browser"
TIMEOUT_MS = 30_000  # a loaded two-core machine starts torchrun slowly

expect.set_options(timeout=TIMEOUT_MS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    item.stash.setdefault(_REPORTS, {})[report.when] = report


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def _failed(item: pytest.Item) -> bool:
    reports = item.stash.get(_REPORTS, {})
    return any(r.failed for r in reports.values())


@pytest.fixture
def browser_args() -> list[str]:
    """Chromium's command-line flags besides --no-sandbox (a test module may override it)."""
    return []


@pytest.fixture
def browser(browser_args: list[str]) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: apt-get install chromium "
            "(or point TRAINHOUSE_CHROMIUM at a Chromium binary); never `playwright install`",
            pytrace=False,
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", *browser_args]
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Page]:
    """A 1400x900 page; JavaScript errors in it fail the test, a failure saves a screenshot."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error" and "Failed to load resource" not in msg.text:
            errors.append(f"console.error: {msg.text}")

    pg.on("console", on_console)
    try:
        yield pg
        assert not errors, "the dashboard raised JavaScript errors:\n" + "\n".join(errors)
    finally:
        if _failed(request.node):
            save_failure(pg, request.node, tmp_path)
        context.close()


def save_failure(pg: Page, item: pytest.Item, tmp_path: Path) -> None:
    name = re.sub(r"[^\w.-]+", "_", item.name)
    shot = tmp_path / f"{name}.png"
    try:
        pg.screenshot(path=str(shot), full_page=True)
        shot.with_suffix(".html").write_text(pg.content())
    except Error as exc:
        print(f"could not save a screenshot of the failing page: {exc}")
        return
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / shot.name
    shutil.copyfile(shot, kept)
    shutil.copyfile(shot.with_suffix(".html"), kept.with_suffix(".html"))
    print(f"screenshot of the failing page ({pg.url}): {shot}\n  kept as {kept}")


@pytest.fixture
def parked_server(tmp_path: Path) -> Iterator[Server]:
    """A server whose users may use no CPU at all: every job waits, nothing ever runs."""
    srv = start_server(tmp_path / "home", "--cpus", "2", "--quota-cpus", "0")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)
