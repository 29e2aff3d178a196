"""A failed job's page in real Chromium against a real server and real ranks: the failed
rank's log opens, every rank's lines interleave, timestamps and a filter; resume and clone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

# two ranks, a checkpoint at step 3; rank 1 fails at step 4 on the first attempt only
FLAKY = """
import time
import trainhouse

with trainhouse.init(hparams={"steps": 6}) as run:
    state = run.checkpoint.load()
    start = state["step"] + 1 if state else 0
    for step in range(start, int(run.hparams["steps"])):
        print(f"rank {run.rank} attempt {run.attempt} step {step}", flush=True)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        if step == 3:
            run.checkpoint.save({"step": step}, step=step)
        if step == 4 and run.rank == 1 and run.attempt == 1:
            raise ValueError("rank 1 broke on purpose")
        time.sleep(0.05)
"""

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")

# true once the all-ranks pane shows two lines, each ending with the text it is given
FILTERED = """(end) => {
  const pane = document.querySelector('[data-testid="log-rank-all"]');
  const lines = pane ? pane.innerText.trim().split("\\n") : [];
  return lines.length === 2 && lines.every((line) => line.endsWith(end));
}"""


def api(server: Server, path: str) -> Any:
    resp = httpx.get(f"{server.url}/api/v1{path}", timeout=30)
    resp.raise_for_status()
    return resp.json()


def test_a_failed_jobs_page_shows_its_logs_and_resumes_and_clones(
    server: Server, page: Page, tmp_path: Path
) -> None:
    spec = write_job(
        tmp_path,
        FLAKY,
        "name: flaky\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    failed = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert failed["state"] == "FAILED", failed

    page.goto(f"{server.url}/#/jobs/{job['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("FAILED")
    # the failed rank's log is the one shown
    expect(page.get_by_test_id("log-tab-1")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_test_id("log-rank-1")).to_contain_text("ValueError: rank 1 broke on purpose")

    # every rank's lines, interleaved in the order they were written
    page.get_by_test_id("log-tab-all").click()
    every = page.get_by_test_id("log-rank-all")
    expect(every).to_contain_text("[rank 0] rank 0 attempt 1 step 0")
    expect(every).to_contain_text("[rank 1] rank 1 attempt 1 step 4")
    # with the time each line was written, and only the lines a filter keeps
    page.get_by_test_id("log-timestamps").check()
    expect(every).to_contain_text(
        re.compile(STAMP.pattern[1:] + r"\[rank 0\] rank 0 attempt 1 step 0")
    )
    page.get_by_test_id("log-filter").fill("step 2$")
    # the filter is sent once the box has been still for 300 ms, and the pane is emptied and
    # read again: wait for the filtered lines themselves (the unfiltered pane also contains
    # "step 2", the emptied one contains no "step 1")
    page.wait_for_function(FILTERED, arg="step 2")
    lines = page.get_by_test_id("log-rank-all").inner_text().strip().splitlines()
    assert len(lines) == 2 and all(STAMP.match(ln) for ln in lines), lines
    assert {ln.split("] ", 1)[0].split(" ", 1)[1] for ln in lines} == {"[rank 0", "[rank 1"}

    # resume: the same job goes on from its checkpoint and completes
    page.get_by_test_id("resume-button").click()
    expect(page.get_by_test_id("lineage-message")).to_contain_text("from its checkpoint of step 3")
    done = server.wait(job["id"], {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED" and done["resumes"] == 1
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    expect(page.get_by_test_id("job-attempts")).to_contain_text("resumed 1")
    expect(page.get_by_test_id("resume-button")).to_be_hidden()

    # clone with an override, from the latest checkpoint: its page links back, and back again
    page.get_by_test_id("clone-button").click()
    page.get_by_test_id("clone-set").fill("hparams.steps=7 name=flaky-more")
    page.get_by_test_id("clone-from").select_option("latest")
    page.get_by_test_id("clone-confirm").click()
    expect(page.get_by_test_id("cloned-from-link")).to_have_text(f"#{job['id']}")
    clone_id = int(page.url.rsplit("/", 1)[1])
    assert clone_id != job["id"]
    clone = api(server, f"/jobs/{clone_id}")
    assert clone["spec"]["hparams"] == {"steps": 7} and clone["name"] == "flaky-more"
    page.get_by_test_id("cloned-from-link").click()
    expect(page.get_by_test_id("clone-link")).to_have_text(f"#{clone_id}")
    # its run is not under test here (tests/integration/test_lineage.py runs a clone)
    httpx.post(
        f"{server.url}/api/v1/jobs/{clone_id}/cancel",
        headers={"X-Trainhouse-Request": "1"},
        timeout=30,
    ).raise_for_status()
    server.wait(clone_id, {"CANCELED", "COMPLETED", "FAILED"})
