"""A job's media on its page in real Chromium against a real server and a real job: the image,
the histogram and the table it logged through the SDK, the step slider choosing which step is
shown, a table's cells shown as text (never HTML)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.jobs import write_job
from tests.support.servers import Server
from trainhouse.core.media import HISTOGRAM_BUCKETS

pytestmark = pytest.mark.browser

JOB = """
import numpy as np
import trainhouse

with trainhouse.init() as run:
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        image = np.zeros((8, 12 + step, 3), np.uint8)
        image[:, :4] = (0, 200, 0)
        run.log_image("samples", image, step=step, caption=f"epoch {step}")
        values = np.concatenate([np.linspace(0, step + 1, 100), [np.nan] * (step + 1)])
        run.log_histogram("weights", values, step=step)
        run.log_table("preds", [[step, f"<b>label {step}</b>"]], ["id", "label"], step=step)
"""


def test_the_job_page_shows_media_at_the_step_the_slider_picks(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(tmp_path, JOB, "name: media\nentrypoint: python train.py\n")
    job = server.cli_json("submit", str(spec), "--detach")
    done = server.wait(job["id"], {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED", done
    items = httpx.get(f"{server.url}/api/v1/jobs/{job['id']}/media").json()["items"]
    images = {i["step"]: i["id"] for i in items if i["kind"] == "image"}

    page.goto(f"{server.url}/#/jobs/{job['id']}")
    section = page.get_by_test_id("media-section")
    expect(section).to_be_visible()
    label = page.get_by_test_id("media-step-label")
    expect(label).to_have_text("2")  # the last step first
    image = section.get_by_test_id("media-image")
    expect(image).to_have_attribute("data-item", str(images[2]))
    expect(image).to_have_attribute("alt", "epoch 2")
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=media-image]');"
        " return i && i.complete && i.naturalWidth === 14; }"
    )
    histogram = section.get_by_test_id("media-histogram")
    expect(histogram.locator("rect.media-bar")).to_have_count(HISTOGRAM_BUCKETS)
    expect(section.get_by_test_id("media-histogram-note")).to_have_text(
        "100 values; not bucketed: 3 NaN"
    )
    table = section.get_by_test_id("media-table")
    expect(table.locator("tbody td").nth(1)).to_have_text("<b>label 2</b>")  # text, not HTML
    expect(table.locator("b")).to_have_count(0)

    page.get_by_test_id("media-step").fill("0")
    expect(label).to_have_text("0")
    expect(image).to_have_attribute("data-item", str(images[0]))
    page.wait_for_function(
        "() => { const i = document.querySelector('[data-testid=media-image]');"
        " return i && i.complete && i.naturalWidth === 12; }"
    )
    expect(section.get_by_test_id("media-histogram-note")).to_have_text(
        "100 values; not bucketed: 1 NaN"
    )
    expect(section.get_by_test_id("media-table").locator("tbody td").nth(1)).to_have_text(
        "<b>label 0</b>"
    )
    page.get_by_test_id("media-step").fill("1")
    expect(label).to_have_text("1")
    expect(section.get_by_test_id("media-image")).to_have_attribute("alt", "epoch 1")
