"""The Models pages' actions in real Chromium, on a server with auth on: the admin registers a
job's saved model as a new model and its checkpoint (with a loader and declared inputs) as a
version, points an alias and moves it, is refused deleting a version an alias names, deletes
another, starts a service that follows the alias (the checkpoint's outputs are then known: its
replica learned them; a viewer's token predicts with it without the client's header, a
cross-site page's request is refused) and stops it, each asked first (cancelling changes
nothing). A viewer
sees none of these actions; a member who does not own the model may start a service but
neither change the model nor stop the admin's service.

One server for the module; the viewer and the member look before the admin acts, so the tests
run in file order, on one xdist worker.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.support.dashboard import sign_in
from tests.support.jobs import write_job
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("model-actions")]

# a saved model (with a loader: no torch.export in the job) and a checkpoint of the same weights
SAVE_SCRIPT = textwrap.dedent(
    """
    import torch
    import trainhouse

    def load(state):  # a checkpoint's state (its "model" entry) or a saved model's weights
        model = torch.nn.Linear(3, 2)
        model.load_state_dict(state.get("model", state))
        return model

    if __name__ == "__main__":
        with trainhouse.init() as run:
            model = torch.nn.Linear(3, 2)
            run.checkpoint.save({"model": model.state_dict()}, step=4)
            run.save_model("tiny", model, example_inputs=torch.zeros(2, 3), loader="train.py:load")
    """
)


@dataclass
class Setup:
    srv: Server
    admin: str  # tokens
    viewer: str
    member: str
    job: int  # the job that saved tiny@1 and a checkpoint

    def client(self) -> Client:
        return Client(self.srv.url, token=self.admin)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("model-actions")
    srv = start_server(root / "home", "--cpus", "4", "--auth", "--cancel-grace", "1")
    try:
        admin = srv.admin_token()
        spec = write_job(
            root / "saver",
            SAVE_SCRIPT,
            "name: saver\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
        )
        with Client(srv.url, token=admin) as c:
            c.add_user("vera", "viewer")
            c.add_user("mo", "member")
            viewer = str(c.create_token(user="vera")["secret"])
            member = str(c.create_token(user="mo")["secret"])
            job = c.wait(c.submit(spec)["id"], timeout=240)
            assert job["state"] == "COMPLETED", job
        yield Setup(srv, admin, viewer, member, job["id"])
        with Client(srv.url, token=admin) as c:  # stopped by the last test, or here
            for s in c.services():
                if s["state"] not in ("stopped", "failed"):
                    c.wait(c.stop_service(s["name"])["job_id"], timeout=120)
    finally:
        assert_clean_stop(srv)


def dialog_says(page: Page, text: str | re.Pattern[str]) -> None:
    expect(page.get_by_test_id("model-dialog")).to_be_visible()
    expect(page.get_by_test_id("model-dialog-question")).to_have_text(text)


def version(page: Page, number: int) -> Locator:
    return page.locator(f"[data-testid=version-row][data-version='{number}']")


@pytest.mark.parametrize(("who", "token"), [("vera (viewer)", "viewer"), ("mo (member)", "member")])
def test_who_may_not_change_a_model_sees_no_such_action(
    setup: Setup, page: Page, who: str, token: str
) -> None:
    sign_in(page, setup.srv, getattr(setup, token), who)
    page.goto(f"{setup.srv.url}/#/models")
    expect(page.get_by_test_id("model-row")).to_have_count(1)
    # a member may register a model of their own; a viewer may not
    expect(page.get_by_test_id("model-register")).to_be_visible(visible=token == "member")
    page.goto(f"{setup.srv.url}/#/models/tiny")
    row = version(page, 1)
    expect(row.get_by_test_id("version-metrics")).to_be_visible()
    expect(page.get_by_test_id("model-register")).to_be_hidden()
    for action in ("version-alias", "version-delete"):
        expect(row.get_by_test_id(action)).to_have_count(0)
    # members start services; viewers do not
    expect(row.get_by_test_id("version-serve")).to_have_count(1 if token == "member" else 0)


def test_the_admin_registers_aliases_deletes_serves_and_stops(
    setup: Setup, page: Page, browser: Browser
) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.get_by_role("link", name="Models").first.click()
    expect(page.get_by_test_id("model-row")).to_have_count(1)
    # a job's saved model as a new model; asked first, and "Cancel" registers nothing
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-name").fill("copy")
    page.get_by_test_id("register-job").fill(str(setup.job))
    dialog_says(
        page, f"Register job #{setup.job}'s saved model (its newest) as a new version of copy?"
    )
    page.get_by_test_id("model-dialog-cancel").click()
    expect(page.get_by_test_id("model-dialog")).to_be_hidden()
    with setup.client() as c:
        assert [m["name"] for m in c.models()] == ["tiny"]
    # and Escape closes it as Cancel does
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-name").fill("copy")
    page.get_by_test_id("register-name").press("Escape")
    expect(page.get_by_test_id("model-dialog")).to_be_hidden()
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-name").fill("copy")
    page.get_by_test_id("register-job").fill(str(setup.job))
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text("registered copy version 1")
    expect(page.locator("[data-testid=model-row][data-model=copy]")).to_have_count(1)

    # the job's checkpoint as version 2 of tiny: its declared inputs are its signature's
    page.locator("[data-testid=model-row][data-model=tiny]").get_by_role("link").click()
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-job").fill(str(setup.job))
    page.get_by_test_id("register-loader").fill("train.py:load")
    page.get_by_test_id("register-inputs").fill("input:float32[B,3]")
    dialog_says(
        page,
        f"Register job #{setup.job}'s checkpoint (its newest), rebuilt by train.py:load, as a "
        "new version of tiny?",
    )
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text("registered tiny version 2")
    expect(version(page, 2).get_by_test_id("version-signature")).to_have_text(
        "input: float32[batch, 3] → (outputs known once served)"
    )
    # a bad declaration: the server's reason, nothing registered
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-job").fill(str(setup.job))
    page.get_by_test_id("register-inputs").fill("input:float32[B,3]")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_contain_text("refused: inputs are declared")
    page.get_by_test_id("model-dialog-cancel").click()

    # a version's buttons stand apart (they touched). Measured in one step in the page: the
    # refused registration redraws the rows when its poll lands, and a button found before that
    # redraw has no box after it (bounding_box() gave None: CI, stop 44)
    gap = version(page, 2).evaluate(
        """row => {
            const box = (id) => row.querySelector(`[data-testid=${id}]`).getBoundingClientRect();
            const [left, right] = [box("version-alias"), box("version-serve")];
            return left.width && right.width ? right.left - left.right : null;
        }"""
    )
    assert gap is not None and gap >= 4, gap

    # an alias: made on version 2, then moved to version 1 (the question says from where)
    version(page, 2).get_by_test_id("version-alias").click()
    page.get_by_test_id("alias-name").fill("prod")
    dialog_says(page, "Point prod of tiny at version 2?")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(version(page, 2).get_by_test_id("version-aliases")).to_have_text("prod")
    version(page, 1).get_by_test_id("version-alias").click()
    page.get_by_test_id("alias-name").fill("prod")
    dialog_says(page, "Point prod of tiny at version 1 (moving it from version 2)?")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(version(page, 1).get_by_test_id("version-aliases")).to_have_text("prod")
    expect(version(page, 2).get_by_test_id("version-aliases")).to_have_text("—")

    # delete: refused while an alias names the version (the server says why); asked first
    version(page, 1).get_by_test_id("version-delete").click()
    dialog_says(page, "Delete version 1 of tiny and its files? This cannot be undone.")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_contain_text("named by the alias(es) prod")
    page.get_by_test_id("model-dialog-cancel").click()
    version(page, 2).get_by_test_id("version-delete").click()
    page.get_by_test_id("model-dialog-cancel").click()  # "Keep it"
    expect(page.get_by_test_id("version-row")).to_have_count(2)
    version(page, 2).get_by_test_id("version-delete").click()
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text("deleted version 2")
    expect(page.get_by_test_id("version-row")).to_have_count(1)
    with setup.client() as c:
        assert [v["version"] for v in c.model("tiny")["versions"]] == [1]

    # the checkpoint again (version 3), prod moved to it, and a service that follows prod
    page.get_by_test_id("model-register").click()
    page.get_by_test_id("register-job").fill(str(setup.job))
    page.get_by_test_id("register-loader").fill("train.py:load")
    page.get_by_test_id("register-inputs").fill("input:float32[B,3]")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text("registered tiny version 3")
    version(page, 3).get_by_test_id("version-alias").click()
    page.get_by_test_id("alias-name").fill("prod")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(version(page, 3).get_by_test_id("version-aliases")).to_have_text("prod")
    version(page, 3).get_by_test_id("version-serve").click()
    page.get_by_test_id("serve-name").fill("tiny-svc")
    page.get_by_test_id("serve-ref").select_option("prod")
    dialog_says(page, "Start service tiny-svc serving tiny@prod with 1 replica(s)?")
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text(re.compile(r"^service tiny-svc "))
    expect(version(page, 3).get_by_test_id("version-service")).to_have_text(
        re.compile(r"^tiny-svc")
    )
    with setup.client() as c:
        started = c.service("tiny-svc")
    assert (started["model"], started["ref"], started["owner"]) == ("tiny", "prod", "admin")
    # once served, the checkpoint's outputs are known: its replica ran it as it loaded it
    expect(version(page, 3).get_by_test_id("version-signature")).to_have_text(
        "input: float32[batch, 3] → output: float32[batch, 2]", timeout=180_000
    )
    expect(version(page, 3).get_by_test_id("version-service")).to_have_text("tiny-svc")
    # an inference client predicts with its token alone (no X-Trainhouse-Request); a browser
    # page of another site may not, token or not
    url = f"{setup.srv.url}/api/v1/services/tiny-svc/predict"
    token = {"Authorization": f"Bearer {setup.viewer}"}
    body = {"inputs": [[0.5, -1.0, 2.0]]}
    answer = httpx.post(url, json=body, headers=token, timeout=60)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["version"], len(answer.json()["outputs"][0])) == (3, 2)
    cross = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    refused = httpx.post(url, json=body, headers={**token, **cross}, timeout=60)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin"
    assert httpx.post(url, json=body, timeout=60).status_code == 403  # neither token nor header

    # while it runs: a viewer sees it with no Stop, nor does a member who does not own it
    for who, token in (("vera (viewer)", setup.viewer), ("mo (member)", setup.member)):
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        other = context.new_page()
        try:
            sign_in(other, setup.srv, token, who)
            other.goto(f"{setup.srv.url}/#/models/tiny")
            expect(version(other, 3).get_by_test_id("version-service")).to_have_text("tiny-svc")
            expect(version(other, 3).get_by_test_id("version-service-stop")).to_have_count(0)
        finally:
            context.close()

    # Stop, asked first: "Keep serving" changes nothing
    stop = version(page, 3).get_by_test_id("version-service-stop")
    stop.click()
    dialog_says(page, "Stop service tiny-svc? Its replicas end; predictions get 503.")
    page.get_by_test_id("model-dialog-cancel").click()
    with setup.client() as c:
        assert c.service("tiny-svc")["state"] not in ("stopping", "stopped")
    stop.click()
    page.get_by_test_id("model-dialog-confirm").click()
    expect(page.get_by_test_id("model-message")).to_have_text(
        re.compile(r"^service tiny-svc stopp(ing|ed)$")
    )
    with setup.client() as c:
        job = c.wait(c.service("tiny-svc")["job_id"], timeout=120)
        assert job["state"] == "CANCELED", job
    expect(version(page, 3).get_by_test_id("version-service")).to_have_count(0)
