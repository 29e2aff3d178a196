"""How the dashboard looks to a person, in real Chromium against a real server and two small
real jobs: in the browser's dark colour scheme every text the pages draw on a background of
their own (compare's differing hparams, a job's spec, its log tabs, its tags) stays readable
(WCAG's 4.5:1 contrast for body text)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import contrast, labels_beside_values
from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

SCRIPT = """
import trainhouse

with trainhouse.init(hparams={"lr": 0.1}) as run:
    run.log({"loss": float(run.hparams["lr"])}, step=0)
    run.log({"train_loss": 0.5, "val_loss": 0.25, "val_acc": 0.75, "epoch": 0}, step=1)
"""


def test_dark_scheme_keeps_text_readable(server: Server, page: Page, tmp_path: Path) -> None:
    ids = []
    for lr in ("0.1", "0.2"):
        spec = write_job(
            tmp_path / f"lr{lr}",
            SCRIPT,
            "name: look\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
        )
        ids.append(
            server.cli_json("submit", str(spec), "--detach", "--set", f"hparams.lr={lr}")["id"]
        )
    for job in ids:
        assert server.wait(job, {"COMPLETED", "FAILED"}, timeout=180)["state"] == "COMPLETED"
    assert server.cli("tag", str(ids[0]), "baseline").returncode == 0
    page.emulate_media(color_scheme="dark")

    # compare: the hparam that differs is highlighted, and still readable
    page.goto(f"{server.url}/#/compare?ids={ids[0]},{ids[1]}")
    differs = page.locator("[data-testid=hparam-row].differs")
    expect(differs).to_have_count(1)
    for cell in (differs.locator("th"), differs.locator("td").first):
        assert contrast(cell) >= 4.5, cell.inner_text()

    # a job's page: its spec, its log tabs (chosen or not) and its tags
    page.goto(f"{server.url}/#/jobs/{ids[0]}")
    expect(page.get_by_test_id("job-spec")).to_contain_text("entrypoint")
    assert contrast(page.get_by_test_id("job-spec")) >= 4.5
    expect(page.get_by_test_id("log-tab-launcher")).to_be_visible()
    for tab in page.get_by_test_id("log-tabs").locator("button").all():
        assert contrast(tab) >= 4.5, tab.inner_text()
    expect(page.get_by_test_id("tag")).to_contain_text("baseline")
    assert contrast(page.get_by_test_id("tag")) >= 4.5


# each text piece of an element drawn on one line: [text, lines]
LINES = """(el) => {
    const found = [];
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
        const range = document.createRange();
        range.selectNodeContents(node);
        found.push([node.textContent, range.getClientRects().length]);
    }
    return found;
}"""


def test_a_narrow_window_wraps_heads_after_dots_and_keeps_labels_by_values(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path / "heads",
        SCRIPT,
        "name: heads\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")["id"]
    assert server.wait(job, {"COMPLETED", "FAILED"}, timeout=180)["state"] == "COMPLETED"
    fields = ["hparams.lr", "metrics.loss.min", "metrics.loss.last", "metrics.loss.max"]
    page.set_viewport_size({"width": 1000, "height": 800})  # a narrow window: the heads wrap
    page.goto(f"{server.url}/#/jobs?columns={','.join(fields)}")
    expect(page.locator("td[data-field='metrics.loss.min']")).to_have_text("0.1")
    # the header's live indicator: its dot and its word on one line (the word fell below)
    expect(page.get_by_test_id("connection")).to_have_text("live")
    tall = "(el) => el.getBoundingClientRect().height / parseFloat(getComputedStyle(el).fontSize)"
    assert page.get_by_test_id("connection").evaluate(tall) < 2
    for field in fields:
        head = page.get_by_test_id(f"sort-{field}").or_(page.get_by_test_id(f"head-{field}"))
        assert head.inner_text().replace("\n", "").startswith(field)
        # "hparam" / "s.lr" was drawn: the name broken inside a word
        pieces = [(text, lines) for text, lines in head.evaluate(LINES) if text.strip()]
        assert all(lines == 1 for _text, lines in pieces), (field, pieces)

    # the list with its own columns fits a 1000 px window (Submitted ran off its right edge)
    page.goto(f"{server.url}/#/jobs")
    expect(page.get_by_test_id("job-row")).to_have_count(1)
    wrap = page.get_by_test_id("jobs-table").locator("xpath=..")
    assert wrap.evaluate("(el) => el.scrollWidth <= el.clientWidth"), wrap.evaluate(
        "(el) => [el.scrollWidth, el.clientWidth]"
    )
    # the job's page in the same narrow window: each label of its summary beside its value
    page.goto(f"{server.url}/#/jobs/{job}")
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    for width in (1000, 1400):
        page.set_viewport_size({"width": width, "height": 800})
        labels_beside_values(page.get_by_test_id("job-summary"))
