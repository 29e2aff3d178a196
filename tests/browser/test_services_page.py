"""The Services pages in real Chromium, on a server with auth on: a job saves a tiny model, the
admin aliases it ``prod`` and serves ``tiny@prod`` through the client; the list shows the
service ready with its version, replicas and requests; its page shows the replica and its
traffic growing without a reload; a viewer sees it (and which version it serves on the Models
page) without a Stop button; the admin stops it from the page.

One server and one service for the module (a replica is a torch process); the last test stops
the service, so the tests run in file order, on one xdist worker.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import sign_in
from tests.support.jobs import write_job
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client, ClientError

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("services-page")]

# saved with a loader (no torch.export in the job): the replica fetches the job's code
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
            run.save_model("tiny", torch.nn.Linear(3, 2), example_inputs=torch.zeros(2, 3),
                           loader="train.py:load")
    """
)
INPUTS = [[0.5, -1.0, 2.0], [1.0, 0.0, 0.25]]


@dataclass
class Served:
    srv: Server
    admin: str  # tokens
    viewer: str

    def client(self) -> Client:
        return Client(self.srv.url, token=self.admin)

    def predict(self, times: int) -> int:
        """Predicts ``times`` times; the service's requests_total after them."""
        with self.client() as c:
            for _ in range(times):
                out = c.predict("tiny", INPUTS)
                assert (out["model"], out["version"], len(out["outputs"])) == ("tiny", 1, 2), out
            return int(c.service("tiny")["stats"]["requests_total"])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("services-page")
    srv = start_server(root / "home", "--cpus", "4", "--auth")
    try:
        admin = srv.admin_token()
        spec = write_job(
            root / "saver",
            SAVE_SCRIPT,
            "name: saver\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
        )
        with Client(srv.url, token=admin) as c:
            c.add_user("vera", "viewer")
            viewer = str(c.create_token(user="vera")["secret"])
            job = c.wait(c.submit(spec)["id"], timeout=240)
            assert job["state"] == "COMPLETED", job
            assert c.set_alias("tiny", "prod", 1)["version"] == 1
            started = c.serve("tiny@prod", max_wait_ms=2)
            assert (started["name"], started["target_version"]) == ("tiny", 1), started
            c.wait_service("tiny", timeout=240)
        yield Served(srv, admin, viewer)
        with Client(srv.url, token=admin) as c:  # stopped by the last test, or here
            stopped = c.stop_service("tiny")
            c.wait(stopped["job_id"], timeout=120)
    finally:
        assert_clean_stop(srv)


def test_the_services_pages_show_a_service_and_its_traffic_live(served: Served, page: Page) -> None:
    total = served.predict(3)
    sign_in(page, served.srv, served.admin, "admin (admin)")
    page.get_by_role("link", name="Services").click()
    expect(page).to_have_url(f"{served.srv.url}/#/services")
    row = page.get_by_test_id("service-row")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-service", "tiny")
    expect(row.get_by_test_id("service-state")).to_have_text("ready")
    expect(row.get_by_test_id("service-version")).to_have_text("1")
    expect(row.get_by_test_id("service-replicas")).to_have_text("1/1")
    expect(row.get_by_test_id("service-requests")).to_have_text(str(total))
    expect(row.get_by_test_id("service-p99")).to_have_text(re.compile(r"^\d"))
    expect(row.get_by_test_id("service-batch")).to_have_text(re.compile(r"^\d"))
    expect(row).to_contain_text("tiny@prod")

    row.get_by_test_id("service-link").click()
    expect(page).to_have_url(f"{served.srv.url}/#/services/tiny")
    expect(page.get_by_test_id("service-state")).to_have_text("ready")
    replica = page.get_by_test_id("replica-row")
    expect(replica).to_have_count(1)
    expect(replica).to_have_attribute("data-rank", "0")
    expect(replica.get_by_test_id("replica-version")).to_have_text("1")
    expect(replica.get_by_test_id("replica-state")).to_have_text("ready")
    expect(page.get_by_test_id("service-version")).to_have_text("1")
    expect(page.get_by_test_id("service-target")).to_have_text("version 1")
    expect(page.get_by_test_id("service-problem")).to_be_hidden()
    expect(page.get_by_test_id("service-requests")).to_have_text(f"{total} (0)")
    expect(page.get_by_test_id("service-stop")).to_be_visible()  # the admin may stop it

    # the page keeps up without a reload: more predictions, a bigger total, a longer chart
    more = served.predict(4)
    assert more == total + 4
    expect(page.get_by_test_id("service-requests")).to_have_text(f"{more} (0)")
    expect(replica.get_by_test_id("replica-requests")).to_have_text(re.compile(r"^[1-9]"))
    page.wait_for_function(
        "() => ['rps', 'p99'].every((k) => "
        "(document.querySelector(`[data-testid=service-chart-${k}]`).data || [{x: []}])[0]"
        ".x.length >= 2)"
    )
    p99 = page.get_by_test_id("service-chart-p99").evaluate("(el) => el.data[0].y")
    assert any(isinstance(v, int | float) and v > 0 for v in p99), p99

    # its job, and the version it serves on the Models page
    expect(page.get_by_test_id("service-job")).to_have_attribute(
        "href", re.compile(r"^#/jobs/\d+$")
    )
    page.get_by_test_id("service-target").click()
    expect(page).to_have_url(f"{served.srv.url}/#/models/tiny?version=1")
    version = page.locator("[data-testid=version-row][data-version='1']")
    expect(version).to_have_class(re.compile(r"\bselected\b"))
    expect(version.get_by_test_id("version-service")).to_have_text("tiny")


def test_a_viewer_sees_a_service_but_no_stop_button(served: Served, page: Page) -> None:
    sign_in(page, served.srv, served.viewer, "vera (viewer)")
    page.goto(f"{served.srv.url}/#/models/tiny")
    link = page.locator("[data-testid=version-row][data-version='1']").get_by_test_id(
        "version-service"
    )
    expect(link).to_have_text("tiny")
    link.click()
    expect(page).to_have_url(f"{served.srv.url}/#/services/tiny")
    expect(page.get_by_test_id("service-state")).to_have_text("ready")
    expect(page.get_by_test_id("replica-row")).to_have_count(1)
    expect(page.get_by_test_id("service-owner")).to_have_text("admin")
    expect(page.get_by_test_id("service-stop")).to_be_hidden()
    expect(page.get_by_test_id("service-stop-dialog")).to_be_hidden()
    # the version column while replicas differ (an alias moved), as the page's module says it
    texts = page.evaluate(
        """async () => {
          const { versionText } = await import("/static/services.js");
          return [[[1, 2], 2], [[1], 2], [[3], 3], [[], 1]].map(
            ([versions, target]) => versionText({ versions, target_version: target }));
        }"""
    )
    assert texts == ["switching 1→2", "1 (ref names 2)", "3", "—"]


def test_the_admin_stops_the_service_from_its_page(served: Served, page: Page) -> None:
    sign_in(page, served.srv, served.admin, "admin (admin)")
    page.goto(f"{served.srv.url}/#/services/tiny")
    expect(page.get_by_test_id("service-state")).to_have_text("ready")
    page.get_by_test_id("service-stop").click()
    expect(page.get_by_test_id("service-stop-dialog")).to_be_visible()
    page.get_by_test_id("service-stop-abort").click()  # asked first: nothing happened
    expect(page.get_by_test_id("service-stop")).to_be_visible()
    with served.client() as c:
        assert c.service("tiny")["state"] == "ready"

    page.get_by_test_id("service-stop").click()
    page.get_by_test_id("service-stop-confirm").click()
    expect(page.get_by_test_id("service-state")).to_have_text(re.compile(r"^stopp(ing|ed)$"))
    expect(page.get_by_test_id("service-stop")).to_be_hidden()
    expect(page.get_by_test_id("service-state")).to_have_text("stopped")
    expect(page.get_by_test_id("replica-row")).to_have_count(0)
    with served.client() as c:
        with pytest.raises(ClientError, match="stopped"):
            c.predict("tiny", INPUTS)
        assert c.service("tiny")["job_state"] == "CANCELED"
    page.get_by_role("link", name="Services", exact=True).first.click()
    row = page.get_by_test_id("service-row")
    expect(row.get_by_test_id("service-state")).to_have_text("stopped")
    expect(row.get_by_test_id("service-version")).to_have_text("—")
