"""The Models pages in real Chromium: a job that saves a model with ``run.save_model`` shows
up with its versions, aliases, the job that made each one, its metrics and its signature."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

# saved with a loader (no torch.export in the job: the page, not the export, is under test)
SAVE_SCRIPT = textwrap.dedent(
    """
    import torch
    import trainhouse

    def load(weights):
        model = torch.nn.Linear(3, 2)
        model.load_state_dict(weights)
        return model

    if __name__ == "__main__":
        with trainhouse.init() as run:
            run.log({"loss": 0.5}, step=4)
            run.save_model(
                "tiny",
                torch.nn.Linear(3, 2),
                example_inputs=torch.zeros(2, 3),
                metrics={"acc": 0.875},
                loader="train.py:load",
            )
    """
)


def test_the_models_pages_show_versions_aliases_lineage_and_signature(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path / "job",
        SAVE_SCRIPT,
        """
        name: saver
        entrypoint: python train.py
        resources: {procs_per_node: 1}
        """,
    )
    job = server.cli_json("submit", str(spec))
    assert job["state"] == "COMPLETED", job
    server.cli_json("models", "alias", "tiny", "1", "prod")

    page.goto(f"{server.url}/#/models")
    row = page.get_by_test_id("model-row")
    expect(row).to_have_count(1)
    expect(row.get_by_test_id("model-aliases")).to_have_text("prod → 1")
    row.get_by_role("link", name="tiny").click()

    version = page.get_by_test_id("version-row")
    expect(version).to_have_count(1)
    expect(version.get_by_test_id("version-aliases")).to_have_text("prod")
    expect(version.get_by_test_id("version-metrics")).to_have_text("acc=0.875")
    expect(version.get_by_test_id("version-signature")).to_have_text(
        "input: float32[batch, 3] → output: float32[batch, 2]"
    )
    # at 1400 px every column, the actions last, is in view: long values wrap, never scroll
    wrap = page.get_by_test_id("versions-table").locator("xpath=..")
    assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth"), "the versions table overflows"
    version.get_by_test_id("version-job").click()
    expect(page).to_have_url(f"{server.url}/#/jobs/{job['id']}")
