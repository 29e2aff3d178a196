"""The Datasets pages in real Chromium, on a server with auth on: the admin uploads two versions
of a dataset; a job pins version 1 and completes, another pins it and keeps running. The list
shows the dataset; its page shows both versions, the jobs that pinned each, and a version's
files from its manifest; the job's page shows its pin and how staging went; a viewer and a
member who does not own it see no Remove button; the admin removes version 2 (asked first) and
is refused version 1 with the server's reason, naming the running job.

One server for the module; the last test removes a version, so the tests run in file order,
on one xdist worker.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.support.dashboard import sign_in
from tests.support.jobs import rank_process, write_job
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("datasets-page")]

READ_SCRIPT = """
import os, sys
from pathlib import Path

root = Path(os.environ["TRAINHOUSE_DATASET_TRAIN"])
print("files:", sorted(p.name for p in root.rglob("*") if p.is_file()), flush=True)
sys.exit(0)
"""
HOLD_SCRIPT = """
import os, time

assert os.path.isdir(os.environ["TRAINHOUSE_DATASET_TRAIN"])
time.sleep(600)  # canceled when the tests end
"""
SPEC = """
name: {name}
entrypoint: python train.py
resources: {{procs_per_node: 1}}
datasets: {{train: digits@1}}
"""
# a file name and a description that would be markup if the page wrote them as HTML
ODD = "<img src=x onerror=alert(1)> & name.txt"
DESCRIPTION = "<i>first</i> cut"


@dataclass
class Setup:
    srv: Server
    admin: str  # tokens
    viewer: str
    member: str
    done: int  # the job that read digits@1 and completed
    holding: int  # the job that pins digits@1 and runs until the module ends
    digests: dict[int, str]  # version: its digest

    def client(self) -> Client:
        return Client(self.srv.url, token=self.admin)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("datasets-page")
    data = root / "digits"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("one\n")
    (data / "sub" / ODD).write_bytes(b"\0" * 3000)
    srv = start_server(root / "home", "--cpus", "4", "--auth", "--cancel-grace", "1")
    try:
        admin = srv.admin_token()
        with Client(srv.url, token=admin) as c:
            c.add_user("vera", "viewer")
            c.add_user("mo", "member")
            viewer = str(c.create_token(user="vera")["secret"])
            member = str(c.create_token(user="mo")["secret"])
            first = c.add_dataset("digits", data, description=DESCRIPTION)["version"]
            (data / "c.txt").write_text("three\n")
            second = c.add_dataset("digits", data)["version"]
            assert (first["version"], second["version"]) == (1, 2), (first, second)
            done = c.submit(write_job(root / "reader", READ_SCRIPT, SPEC.format(name="reader")))
            job = c.wait(done["id"], timeout=240)
            assert job["state"] == "COMPLETED", (job["reason"], c.logs(done["id"], rank="0"))
            holding = c.submit(write_job(root / "holder", HOLD_SCRIPT, SPEC.format(name="holder")))
            # running before the tests start: its processes are no test's leak
            deadline = time.monotonic() + 240
            while rank_process(holding["id"], 0) is None:
                state = c.job(holding["id"])["state"]
                assert state in ("QUEUED", "RUNNING"), c.job(holding["id"])
                assert time.monotonic() < deadline, f"job {holding['id']} never started"
                time.sleep(0.2)
        digests = {1: first["digest"], 2: second["digest"]}
        yield Setup(srv, admin, viewer, member, done["id"], holding["id"], digests)
        with Client(srv.url, token=admin) as c:
            c.cancel(holding["id"])
            assert c.wait(holding["id"], timeout=120)["state"] == "CANCELED"
    finally:
        assert_clean_stop(srv)


def version_row(page: Page, version: int) -> Locator:
    return page.locator(f"[data-testid=version-row][data-version='{version}']")


def test_the_datasets_pages_show_versions_files_and_the_jobs_that_read_them(
    setup: Setup, page: Page
) -> None:
    url = setup.srv.url
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.get_by_role("link", name="Datasets", exact=True).click()
    expect(page).to_have_url(f"{url}/#/datasets")
    expect(page.locator("header nav a.active")).to_have_text("Datasets")
    row = page.get_by_test_id("dataset-row")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-dataset", "digits")
    expect(row.get_by_test_id("dataset-versions")).to_have_text("2")
    expect(row.get_by_test_id("dataset-latest")).to_have_text("2")
    expect(row.get_by_test_id("dataset-size")).to_have_text("2.9 KiB")  # 4 + 3000 + 6 bytes
    expect(row).to_contain_text("admin")

    row.get_by_test_id("dataset-link").click()
    expect(page).to_have_url(f"{url}/#/datasets/digits")
    expect(page.get_by_test_id("version-row")).to_have_count(2)
    expect(page.get_by_test_id("version-row").first).to_have_attribute("data-version", "2")
    one, two = version_row(page, 1), version_row(page, 2)
    expect(one.get_by_test_id("version-files")).to_have_text("2")
    expect(two.get_by_test_id("version-files")).to_have_text("3")
    expect(one.get_by_test_id("version-digest")).to_have_text(setup.digests[1][:12])
    expect(one.get_by_test_id("version-source")).to_have_text("(server)")
    expect(one.get_by_test_id("version-checksums")).to_have_text("sha256")
    expect(one.get_by_test_id("version-description")).to_have_text(DESCRIPTION)
    expect(one.get_by_test_id("version-created-by")).to_have_text("admin")
    jobs = one.get_by_test_id("version-job")
    expect(jobs).to_have_count(2)  # newest first: the one still running, then the reader
    expect(jobs.nth(0)).to_have_attribute("href", f"#/jobs/{setup.holding}")
    expect(jobs.nth(1)).to_have_attribute("href", f"#/jobs/{setup.done}")
    expect(two.get_by_test_id("version-jobs")).to_have_text("—")
    expect(page.get_by_test_id("dataset-job")).to_have_count(2)
    expect(page.get_by_test_id("version-remove")).to_have_count(2)  # the owner may

    # a version's files, from its manifest: paths as text, never markup
    expect(page.get_by_test_id("manifest-row")).to_have_count(0)
    one.get_by_test_id("version-select").click()
    expect(page).to_have_url(f"{url}/#/datasets/digits?version=1")
    expect(version_row(page, 1)).to_have_class(re.compile(r"\bselected\b"))
    files = page.get_by_test_id("manifest-path")
    expect(files).to_have_text(["a.txt", f"sub/{ODD}"])
    expect(page.get_by_test_id("manifest-row").nth(1)).to_contain_text("2.9 KiB")
    expect(page.get_by_test_id("manifest-row").nth(1)).to_contain_text(
        re.compile(r"sha256:[0-9a-f]{12}$")
    )
    expect(page.get_by_test_id("manifest-count")).to_contain_text("2 files")
    assert page.locator("[data-testid=manifest] img, [data-testid=version-rows] i").count() == 0

    # the job that read it: its pin, linking back, and how staging went
    version_row(page, 1).get_by_test_id("version-job").nth(1).click()
    expect(page).to_have_url(f"{url}/#/jobs/{setup.done}")
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    pin = page.get_by_test_id("job-dataset")
    expect(pin).to_have_count(1)
    expect(pin.get_by_test_id("job-dataset-key")).to_have_text("train")
    expect(pin.get_by_test_id("job-dataset-ref")).to_have_text("digits@1")
    expect(pin).to_contain_text(setup.digests[1][:12])
    expect(page.get_by_test_id("job-staging")).to_contain_text("digits@1")
    pin.get_by_test_id("job-dataset-ref").click()
    expect(page).to_have_url(f"{url}/#/datasets/digits?version=1")
    expect(page.get_by_test_id("manifest-row")).to_have_count(2)


@pytest.mark.parametrize(("who", "token"), [("vera (viewer)", "viewer"), ("mo (member)", "member")])
def test_who_may_not_remove_a_version_sees_no_remove_button(
    setup: Setup, page: Page, who: str, token: str
) -> None:
    sign_in(page, setup.srv, getattr(setup, token), who)
    page.goto(f"{setup.srv.url}/#/datasets/digits")
    expect(page.get_by_test_id("version-row")).to_have_count(2)
    expect(version_row(page, 1).get_by_test_id("version-job")).to_have_count(2)
    expect(page.get_by_test_id("version-remove")).to_have_count(0)
    expect(page.get_by_test_id("version-remove-dialog")).to_have_count(0)


def test_the_owner_removes_a_version_and_is_told_why_a_pinned_one_stays(
    setup: Setup, page: Page
) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/datasets/digits")
    two = version_row(page, 2)
    two.get_by_test_id("version-remove").click()
    expect(two.get_by_test_id("version-remove-dialog")).to_be_visible()
    expect(two.get_by_test_id("version-remove-dialog")).to_contain_text("Remove digits@2?")
    two.get_by_test_id("version-remove-abort").click()  # asked first: nothing happened
    expect(two.get_by_test_id("version-remove")).to_be_visible()
    with setup.client() as c:
        assert [v["version"] for v in c.dataset("digits")["versions"]] == [1, 2]

    two.get_by_test_id("version-remove").click()
    two.get_by_test_id("version-remove-confirm").click()
    expect(page.get_by_test_id("dataset-message")).to_have_text("remove digits@2: done")
    expect(page.get_by_test_id("version-row")).to_have_count(1)
    with setup.client() as c:
        assert [v["version"] for v in c.dataset("digits")["versions"]] == [1]

    # version 1 is pinned by a job still running: the server refuses, and the page says why
    one = version_row(page, 1)
    one.get_by_test_id("version-remove").click()
    one.get_by_test_id("version-remove-confirm").click()
    message = page.get_by_test_id("dataset-message")
    expect(message).to_contain_text("remove digits@1 refused:")
    expect(message).to_contain_text(f"pinned by job {setup.holding}")
    expect(message).to_have_class("error")
    expect(page.get_by_test_id("version-row")).to_have_count(1)
    expect(version_row(page, 1).get_by_test_id("version-remove")).to_be_visible()
    page.get_by_role("link", name="Datasets", exact=True).first.click()
    expect(page.get_by_test_id("dataset-row").get_by_test_id("dataset-versions")).to_have_text("1")
