"""Names a job chooses are text in the dashboard, in real Chromium: plotly reads tags and
entities in chart titles, legends and hover labels (``<a href>`` makes a link, ``<br>`` a line
break), so a metric named like markup must show as written, and link nowhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

LINK = '<a href="https://evil.example">x</a>'
MARKUP = "loss&amp;<b>bold</b><br>"

SCRIPT = f"""
import trainhouse

with trainhouse.init() as run:
    for step in range(5):
        run.log({{{LINK!r}: 1.0 + step, {MARKUP!r}: 2.0 - step * 0.1}}, step=step)
"""

# what in the page links or points elsewhere: <a> in HTML or SVG, href or xlink:href
LINKS = """() => [...document.querySelectorAll("*")]
    .filter((e) => e.localName === "a" ||
                   /evil/.test(e.getAttribute("href") || e.getAttribute("xlink:href") || ""))
    .filter((e) => e.closest(".chart"))
    .map((e) => e.outerHTML)"""


def chart_titles(page: Page, prefix: str) -> dict[str, str]:
    """Each chart's metric (its data-metric) and the text of its title as drawn."""
    page.wait_for_function(
        """(prefix) => [...document.querySelectorAll(`[data-testid^="${prefix}"]`)]
            .filter((el) => el.querySelector(".gtitle")).length === 2""",
        arg=prefix,
    )
    titles: dict[str, str] = page.evaluate(
        """(prefix) => Object.fromEntries(
            [...document.querySelectorAll(`[data-testid^="${prefix}"]`)].map(
                (el) => [el.dataset.metric, el.querySelector(".gtitle").textContent]))""",
        prefix,
    )
    return titles


def test_a_metric_named_like_markup_is_shown_as_text(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(tmp_path / "names", SCRIPT, "name: names\nentrypoint: python train.py\n")
    job: dict[str, Any] = server.cli_json("submit", str(spec), "--detach")
    assert server.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)["state"] == "COMPLETED"

    page.goto(f"{server.url}/#/jobs/{job['id']}")
    assert chart_titles(page, "chart-") == {LINK: LINK, MARKUP: MARKUP}
    assert page.evaluate(LINKS) == []

    page.goto(f"{server.url}/#/compare?ids={job['id']}")
    assert chart_titles(page, "compare-chart-") == {LINK: LINK, MARKUP: MARKUP}
    assert page.evaluate(LINKS) == []
    expect(page.get_by_test_id("compare-metric")).to_contain_text(LINK)
