"""A job's artifacts on its page in real Chromium against a real server and a real job (issue
33, section 4): MLflow's "View run at" link lands on the page; the artifacts are listed with
their sizes; a text file is shown as text (a job-written HTML page too: shown, never run), a
CSV as a table, a PNG as an image; the download link fetches the bytes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.artifacts import artifact_job, png
from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

HOSTILE = (
    '<h1 id="planted">planted</h1><img src=x onerror="window.pwned=1">'
    "<script>window.pwned=2</script>"
)


def test_the_jobs_artifacts_are_listed_shown_and_downloaded(
    server: Server, page: Page, tmp_path: Path
) -> None:
    script = artifact_job().replace(
        "run.finish()",
        f"open('page.html', 'w').write({HOSTILE!r})\nrun.log_artifact('page.html')\n"
        "open('weights.bin', 'wb').write(bytes(range(256)))\nrun.log_artifact('weights.bin')\n"
        "run.finish()",
    )
    spec = write_job(tmp_path, script, "name: keeper\nentrypoint: python train.py\n")
    job = server.cli_json("submit", str(spec))
    assert job["state"] == "COMPLETED", job
    job_id = job["id"]
    with server.client as c:
        log = c.logs(job_id, rank=0)[0]
    link = re.search(r"View run \S+ at: (\S+)", log)
    assert link, log

    # MLflow's link: the job's page, not a 404
    page.goto(link.group(1))
    expect(page.get_by_test_id("job-name")).to_have_text("keeper")
    assert page.url.endswith(f"/#/jobs/{job_id}")

    rows = page.get_by_test_id("artifact-row")
    expect(rows).to_have_count(6)
    expect(page.get_by_test_id("artifacts-summary")).to_contain_text("6 files")
    sizes = {
        rows.nth(i).get_attribute("data-path"): rows.nth(i)
        .get_by_test_id("artifact-size")
        .inner_text()
        for i in range(6)
    }
    assert sizes == {
        "figs/plots/curve.png": f"{len(png(8, 6))} B",
        "figs/plots/table.csv": "22 B",
        "mlflow/notes.txt": "19 B",
        "notes.txt": "19 B",
        "page.html": f"{len(HOSTILE)} B",
        "weights.bin": "256 B",
    }

    def open_artifact(path: str) -> None:
        page.locator(f'[data-testid="artifact-row"][data-path="{path}"]').get_by_test_id(
            "artifact-open"
        ).click()

    # text, inline, as text
    open_artifact("notes.txt")
    expect(page.get_by_test_id("artifact-text")).to_have_text("hello from the job\n")
    # a job-written HTML page: its source as text; nothing of it runs or renders
    open_artifact("page.html")
    expect(page.get_by_test_id("artifact-text")).to_have_text(HOSTILE)
    expect(page.locator("#planted")).to_have_count(0)
    assert page.evaluate("window.pwned") is None
    # a binary file: no view, a download
    open_artifact("weights.bin")
    expect(page.get_by_test_id("artifact-error")).to_contain_text("neither text nor a PNG")
    # a CSV as a table
    open_artifact("figs/plots/table.csv")
    table = page.get_by_test_id("artifact-table")
    expect(table.locator("th")).to_have_text(["step", "loss"])
    assert table.locator("th").first.inner_text() == "step"  # as written, not upper-cased
    expect(table.locator("tbody tr")).to_have_count(2)
    # a PNG as an image the browser decoded
    open_artifact("figs/plots/curve.png")
    image = page.get_by_test_id("artifact-image")
    expect(image).to_be_visible()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=artifact-image]').naturalWidth === 8"
    )
    # the download link: the file's bytes, under its name
    with page.expect_download() as caught:
        page.locator(
            '[data-testid="artifact-row"][data-path="figs/plots/curve.png"]'
        ).get_by_test_id("artifact-download").click()
    download = caught.value
    assert download.suggested_filename == "curve.png"
    assert Path(download.path()).read_bytes() == png(8, 6)
