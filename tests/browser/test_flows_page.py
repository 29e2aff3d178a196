"""The Flows pages in real Chromium, on a server with auth on: the admin submits, through the
Python client, a flow of three steps (``ok`` completes, ``boom`` after it exits 1 the first
time, ``never`` after ``boom`` ends CANCELED), a second flow that completes (its name would be
markup if the page wrote it as HTML), and a third whose only step's job is then deleted. The
list shows every flow with its state and its steps'; a flow's page shows its steps in order,
each one's job, state, upstreams and why it ended; the job page of ``never`` links back to its
flow and names the job it waited for; a viewer and a member who does not own the flow see no
Cancel nor Resume; a resume the server refuses says why; the admin resumes the failed flow
(asked first) and its failed and canceled steps run again until the flow completes.

One server for the module; the last test resumes a flow, so the tests run in file order, on
one xdist worker.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.support.dashboard import sign_in
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("flows-page")]

OK_SCRIPT = """
print("fine", flush=True)
"""
# fails the first time (leaving a mark in $MARKS), succeeds once resumed
BOOM_SCRIPT = """
import os, sys
from pathlib import Path

mark = Path(os.environ["MARKS"]) / "boom-failed-once"
if not mark.exists():
    mark.write_text("failed once\\n")
    print("boom: failing the first time", flush=True)
    sys.exit(1)
print("boom: fine the second time", flush=True)
"""
SPEC = """
name: {name}
entrypoint: python {script}
resources: {{procs_per_node: 1}}
env: {{MARKS: "{marks}"}}
"""
FAILING_FLOW = """
name: release
jobs:
  ok: {spec: ok.yaml}
  boom: {spec: boom.yaml, after: [ok]}
  never: {spec: never.yaml, after: [boom]}
"""
ODD = "<img src=x onerror=alert(1)> & passes"
PASSING_FLOW = f"""
name: "{ODD}"
jobs:
  prepare: {{spec: ok.yaml}}
  finish: {{spec: ok.yaml, after: [prepare], set: {{name: finish}}}}
"""
LONE_FLOW = """
name: lone
jobs:
  solo: {spec: ok.yaml}
"""
ENDED = ("COMPLETED", "FAILED", "CANCELED")


@dataclass
class Setup:
    srv: Server
    admin: str  # tokens
    viewer: str
    member: str
    failing: dict[str, Any]  # the flows as submitted: id, jobs (step: job id)
    passing: dict[str, Any]
    lone: dict[str, Any]

    def client(self) -> Client:
        return Client(self.srv.url, token=self.admin)


def write_flow(root: Path, flow: str, marks: Path) -> Path:
    """A workdir with the steps' scripts and specs (shared by every step) and the flow file."""
    root.mkdir(parents=True)
    (root / "ok.py").write_text(textwrap.dedent(OK_SCRIPT))
    (root / "boom.py").write_text(textwrap.dedent(BOOM_SCRIPT))
    for name, script in (("ok", "ok.py"), ("boom", "boom.py"), ("never", "ok.py")):
        spec = SPEC.format(name=name, script=script, marks=marks)
        (root / f"{name}.yaml").write_text(textwrap.dedent(spec))
    (root / "flow.yaml").write_text(textwrap.dedent(flow))
    return root / "flow.yaml"


def wait_ended(c: Client, flow_id: int, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        flow = dict(c.flow(flow_id))
        if flow["state"] in ENDED:
            return flow
        assert time.monotonic() < deadline, f"flow {flow_id} never ended: {flow}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("flows-page")
    marks = root / "marks"
    marks.mkdir()
    srv = start_server(root / "home", "--cpus", "4", "--auth", "--job-visibility", "all")
    try:
        admin = srv.admin_token()
        with Client(srv.url, token=admin) as c:
            c.add_user("vera", "viewer")
            c.add_user("mo", "member")
            viewer = str(c.create_token(user="vera")["secret"])
            member = str(c.create_token(user="mo")["secret"])
            failing = dict(c.submit_flow(write_flow(root / "failing", FAILING_FLOW, marks)))
            passing = dict(c.submit_flow(write_flow(root / "passing", PASSING_FLOW, marks)))
            lone = dict(c.submit_flow(write_flow(root / "lone", LONE_FLOW, marks)))
            ended = wait_ended(c, failing["id"])
            states = {s["name"]: s["state"] for s in ended["steps"]}
            assert states == {"ok": "COMPLETED", "boom": "FAILED", "never": "CANCELED"}, (
                ended,
                c.logs(failing["jobs"]["boom"], rank="0"),
            )
            assert wait_ended(c, passing["id"])["state"] == "COMPLETED"
            assert wait_ended(c, lone["id"])["state"] == "COMPLETED"
            c.delete(lone["jobs"]["solo"])  # its flow can no longer be resumed
        yield Setup(srv, admin, viewer, member, failing, passing, lone)
    finally:
        assert_clean_stop(srv)


def flow_row(page: Page, flow_id: int) -> Locator:
    return page.locator(f"[data-testid=flow-row][data-flow-id='{flow_id}']")


def step_row(page: Page, step: str) -> Locator:
    return page.locator(f"[data-testid=step-row][data-step='{step}']")


def test_the_flows_list_shows_every_flow_with_its_steps(setup: Setup, page: Page) -> None:
    url = setup.srv.url
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.get_by_role("link", name="Flows", exact=True).click()
    expect(page).to_have_url(f"{url}/#/flows")
    expect(page.locator("header nav a.active")).to_have_text("Flows")
    rows = page.get_by_test_id("flow-row")
    expect(rows).to_have_count(3)
    expect(page.get_by_test_id("flow-count")).to_have_text("3 flows")
    # newest first
    ids = [setup.lone["id"], setup.passing["id"], setup.failing["id"]]
    expect(rows.nth(0)).to_have_attribute("data-flow-id", str(ids[0]))
    expect(rows.nth(2)).to_have_attribute("data-flow-id", str(ids[2]))

    failing = flow_row(page, setup.failing["id"])
    expect(failing.get_by_test_id("flow-link")).to_have_text("release")
    expect(failing.get_by_test_id("flow-state")).to_have_text("FAILED")
    expect(failing.get_by_test_id("flow-done")).to_have_text("1/3 done")
    steps = failing.get_by_test_id("flow-step")
    expect(steps).to_have_text(["ok COMPLETED", "boom FAILED", "never CANCELED"])
    expect(failing).to_contain_text("admin")

    passing = flow_row(page, setup.passing["id"])
    expect(passing.get_by_test_id("flow-link")).to_have_text(ODD)  # text, never markup
    expect(passing.get_by_test_id("flow-state")).to_have_text("COMPLETED")
    expect(passing.get_by_test_id("flow-done")).to_have_text("2/2 done")
    expect(passing.get_by_test_id("flow-step")).to_have_text(
        ["prepare COMPLETED", "finish COMPLETED"]
    )
    assert page.locator("[data-testid=flows-table] img").count() == 0

    lone = flow_row(page, setup.lone["id"])
    expect(lone.get_by_test_id("flow-state")).to_have_text("CANCELED")  # its step was deleted
    expect(lone.get_by_test_id("flow-step")).to_have_text(["solo deleted"])

    passing.get_by_test_id("flow-link").click()
    expect(page).to_have_url(f"{url}/#/flows/{setup.passing['id']}")
    expect(page.get_by_test_id("flow-name")).to_have_text(ODD)
    expect(page.get_by_test_id("flow-state")).to_have_text("COMPLETED")
    expect(page.get_by_test_id("step-row")).to_have_count(2)
    expect(page.get_by_test_id("flow-resume")).to_be_hidden()  # nothing to resume
    expect(page.get_by_test_id("flow-cancel")).to_be_hidden()  # nothing to cancel


def test_a_flow_page_shows_its_steps_in_order_and_why_the_last_never_ran(
    setup: Setup, page: Page
) -> None:
    url = setup.srv.url
    flow_id, jobs = setup.failing["id"], setup.failing["jobs"]
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{url}/#/flows")
    flow_row(page, flow_id).get_by_test_id("flow-link").click()
    expect(page).to_have_url(f"{url}/#/flows/{flow_id}")
    expect(page.locator("header nav a.active")).to_have_text("Flows")
    expect(page.get_by_test_id("flow-name")).to_have_text("release")
    expect(page.get_by_test_id("flow-state")).to_have_text("FAILED")
    expect(page.get_by_test_id("flow-owner")).to_have_text("admin")
    expect(page.get_by_test_id("flow-done")).to_have_text("1/3 done")

    rows = page.get_by_test_id("step-row")
    expect(rows.get_by_test_id("step-name")).to_have_text(["ok", "boom", "never"])  # in order
    expect(rows.get_by_test_id("step-state")).to_have_text(["COMPLETED", "FAILED", "CANCELED"])
    links = rows.get_by_test_id("step-job")
    expect(links).to_have_text([f"#{jobs['ok']}", f"#{jobs['boom']}", f"#{jobs['never']}"])
    for step in ("ok", "boom", "never"):
        expect(step_row(page, step).get_by_test_id("step-job")).to_have_attribute(
            "href", f"#/jobs/{jobs[step]}"
        )
    expect(rows.get_by_test_id("step-after")).to_have_text(["—", "ok", "boom"])
    expect(step_row(page, "ok").get_by_test_id("step-reason")).to_have_text("")
    expect(step_row(page, "never").get_by_test_id("step-reason")).to_have_text(
        f"upstream job {jobs['boom']} FAILED"
    )
    expect(step_row(page, "boom").get_by_test_id("step-reason")).not_to_be_empty()
    # the owner may resume a failed flow; it has ended: nothing to cancel
    expect(page.get_by_test_id("flow-resume")).to_be_visible()
    expect(page.get_by_test_id("flow-cancel")).to_be_hidden()

    # the job page of the step that never ran: its flow, and the job it waited for
    step_row(page, "never").get_by_test_id("step-job").click()
    expect(page).to_have_url(f"{url}/#/jobs/{jobs['never']}")
    expect(page.get_by_test_id("job-state")).to_have_text("CANCELED")
    expect(page.get_by_test_id("job-reason")).to_contain_text(f"upstream job {jobs['boom']} FAILED")
    expect(page.get_by_test_id("job-flow-link")).to_have_attribute("href", f"#/flows/{flow_id}")
    expect(page.get_by_test_id("job-flow-step")).to_have_text("never")
    waited = page.get_by_test_id("job-after-item")
    expect(waited).to_have_count(1)
    expect(waited).to_have_attribute("data-job-id", str(jobs["boom"]))
    expect(waited.get_by_test_id("job-after-link")).to_have_attribute(
        "href", f"#/jobs/{jobs['boom']}"
    )
    expect(waited.get_by_test_id("job-after-state")).to_have_text("FAILED")
    expect(page.get_by_test_id("job-promotion")).to_have_count(0)  # it promotes nothing
    page.get_by_test_id("job-flow-link").click()
    expect(page).to_have_url(f"{url}/#/flows/{flow_id}")
    expect(page.get_by_test_id("step-row")).to_have_count(3)


@pytest.mark.parametrize(("who", "token"), [("vera (viewer)", "viewer"), ("mo (member)", "member")])
def test_who_does_not_own_a_flow_sees_no_cancel_nor_resume(
    setup: Setup, page: Page, who: str, token: str
) -> None:
    sign_in(page, setup.srv, getattr(setup, token), who)
    page.goto(f"{setup.srv.url}/#/flows/{setup.failing['id']}")
    expect(page.get_by_test_id("step-row")).to_have_count(3)
    expect(page.get_by_test_id("flow-state")).to_have_text("FAILED")
    expect(page.get_by_test_id("flow-resume")).to_be_hidden()
    expect(page.get_by_test_id("flow-cancel")).to_be_hidden()


def test_a_refused_resume_says_why(setup: Setup, page: Page) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/flows/{setup.lone['id']}")
    expect(step_row(page, "solo").get_by_test_id("step-state")).to_have_text("deleted")
    expect(step_row(page, "solo").get_by_test_id("step-job")).to_have_count(0)
    page.get_by_test_id("flow-resume").click()
    page.get_by_test_id("flow-resume-confirm").click()
    message = page.get_by_test_id("flow-message")
    expect(message).to_contain_text("resume refused:")
    expect(message).to_contain_text("solo")
    expect(message).to_contain_text("deleted")
    expect(message).to_have_class("error")
    expect(page.get_by_test_id("flow-state")).to_have_text("CANCELED")


def test_the_owner_resumes_a_failed_flow_and_it_completes(setup: Setup, page: Page) -> None:
    flow_id, jobs = setup.failing["id"], setup.failing["jobs"]
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/flows/{flow_id}")
    resume = page.get_by_test_id("flow-resume")
    resume.click()
    dialog = page.get_by_test_id("flow-resume-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Resume flow {flow_id}?")
    page.get_by_test_id("flow-resume-abort").click()  # asked first: nothing happened
    expect(resume).to_be_visible()
    with setup.client() as c:
        assert c.flow(flow_id)["state"] == "FAILED"

    resume.click()
    page.get_by_test_id("flow-resume-confirm").click()
    expect(page.get_by_test_id("flow-message")).to_have_text("queued again")
    # the failed and the canceled step left those states; the completed one stays as it was
    for step in ("boom", "never"):
        expect(step_row(page, step)).not_to_have_attribute(
            "data-state", re.compile(r"^(FAILED|CANCELED)$")
        )
    expect(page.get_by_test_id("flow-state")).to_have_text("COMPLETED", timeout=120_000)
    rows = page.get_by_test_id("step-row")
    expect(rows.get_by_test_id("step-state")).to_have_text(["COMPLETED"] * 3)
    expect(page.get_by_test_id("flow-done")).to_have_text("3/3 done")
    expect(resume).to_be_hidden()
    with setup.client() as c:
        assert c.job(jobs["ok"])["attempts"] == 1  # not run again
        assert c.job(jobs["boom"])["attempts"] == 2
    page.get_by_role("link", name="Flows", exact=True).first.click()
    expect(flow_row(page, flow_id).get_by_test_id("flow-state")).to_have_text("COMPLETED")
