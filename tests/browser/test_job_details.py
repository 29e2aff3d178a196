"""A job's page says what happened as a person reads it (issue 33, section 6), in real Chromium
against a real server and real ranks:

- hyperparameter names as written (they are case-sensitive; on the compare page too), and no
  stray ``null`` under them;
- a checkpoint's digest with its algorithm (blake3 for file checkpoints, not "sha256");
- a failure's reason with its lines kept (the traceback is not one paragraph);
- a canceled job's attempt: canceled, its ranks exited cleanly (not "SIGTERM").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

FAILS = """
import trainhouse

with trainhouse.init(hparams={"Learning_Rate": 0.1, "batchSize": 8}) as run:
    run.log({"loss": 1.0}, step=0)
    run.checkpoint.save({"step": 0}, step=0)
    raise ValueError("a bad hparam, on purpose")
"""

STOPS = """
import time
import trainhouse

with trainhouse.init() as run:
    step = 0
    while not run.should_stop():
        run.log({"loss": 1.0}, step=step)
        step += 1
        time.sleep(0.1)
"""


def test_a_failed_jobs_page_reads_as_written(server: Server, page: Page, tmp_path: Path) -> None:
    spec = write_job(
        tmp_path / "fails",
        FAILS,
        "name: fails\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    failed = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert failed["state"] == "FAILED" and "\n" in failed["reason"], failed
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("FAILED")

    names = page.get_by_test_id("job-hparams").get_by_test_id("hparam-name")
    expect(names).to_have_text(["Learning_Rate", "batchSize"], use_inner_text=True)
    expect(page.get_by_test_id("experiment-section")).not_to_contain_text("null")

    digest = page.get_by_test_id("checkpoint-digest")
    expect(digest).to_have_count(1)
    expect(digest).to_contain_text("blake3:")
    expect(page.get_by_test_id("checkpoints-table")).not_to_contain_text("sha256")

    expect(page.get_by_test_id("job-exit")).to_have_text("1")
    reason = page.get_by_test_id("job-reason")
    expect(reason).to_contain_text("ValueError: a bad hparam, on purpose")
    shown = reason.inner_text()
    assert len([ln for ln in shown.splitlines() if ln.strip()]) >= 2, shown

    # the compare page names them as written too
    page.goto(f"{server.url}/#/compare?ids={job['id']}")
    rows = page.get_by_test_id("compare-hparams").get_by_test_id("hparam-row").locator("th")
    expect(rows).to_have_text(["batchSize", "Learning_Rate"], use_inner_text=True)


def test_a_canceled_attempt_says_it_was_canceled(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path / "stops",
        STOPS,
        "name: stops\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    server.wait_step(job["id"], 2)
    with server.client as c:
        c.cancel(job["id"])
    ended = server.wait(job["id"], {"CANCELED"})
    (attempt,) = ended["attempt_history"]
    assert attempt["result"] == "canceled" and set(attempt["rank_exit_codes"].values()) == {0}
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("CANCELED")
    expect(page.get_by_test_id("attempt-exit")).to_have_text("canceled; ranks exited cleanly")
    # the job's summary says it too, not the launcher's signal as a number
    expect(page.get_by_test_id("job-exit")).to_have_text("canceled; ranks exited cleanly")
    expect(page.get_by_test_id("attempts-table")).not_to_contain_text("SIGTERM")
