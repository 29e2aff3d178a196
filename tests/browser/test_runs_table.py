"""The job list's runs table at 1400 px in real Chromium against a real server (with auth): the
columns a user chose stay in view beside the fixed ones, any column can be hidden (kept in the
URL), the user's note is the ``note`` column, a columns error is shown under the columns box
with no count of rows the page does not show, and a row's actions (tag, move to a project,
archive, delete after a confirmation) for who may change the job only. Jobs stay queued (no
CPU for anyone) or are canceled."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect

from tests.support.dashboard import sign_in
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client
from trainhouse.jobfs.workdir import pack
from trainhouse.spec import parse_spec

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("runs-table")]  # one module server

CHOSEN = [
    "hparams.lr",
    "hparams.weight_decay_schedule_name",
    "hparams.warmup_steps_fraction",
    "hparams.optim.name",
    "note",
]


@dataclass
class Setup:
    srv: Server
    admin: str  # tokens
    member: str
    viewer: str
    sweep: list[int]  # the admin's queued jobs with long hparam names
    ended: list[int]  # the admin's canceled jobs
    mine: int  # the member's queued job

    def client(self) -> Client:
        return Client(self.srv.url, token=self.admin)

    def job(self, job_id: int) -> httpx.Response:
        return httpx.get(
            f"{self.srv.url}/api/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=30,
        )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("runs-table")
    workdir = root / "parked"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('never runs')\n")
    packed = pack(workdir)
    srv = start_server(
        root / "home", "--cpus", "2", "--quota-cpus", "0", "--auth", "--job-visibility", "all"
    )
    try:
        admin = srv.admin_token()
        with Client(srv.url, token=admin) as c:
            c.add_user("mo", "member")
            c.add_user("vera", "viewer")
            member = str(c.create_token(user="mo")["secret"])
            viewer = str(c.create_token(user="vera")["secret"])
            sweep = []
            for i, lr in enumerate((0.0005369, 0.01)):
                spec = parse_spec(
                    f"name: sweep-{i}\nentrypoint: python train.py\nhparams: {{lr: {lr}, "
                    "weight_decay_schedule_name: cosine-with-warmup-and-restarts, "
                    f"warmup_steps_fraction: 0.125, optim: {{name: adamw}}}}\n"
                )
                sweep.append(c.submit_packed(spec, packed)["id"])
            c.set_note(sweep[0], "lr from the range test\nsecond line")
            ended = []
            for name in ("ended-a", "ended-b"):
                spec = parse_spec(f"name: {name}\nentrypoint: python train.py\n")
                job = c.submit_packed(spec, packed)
                c.cancel(job["id"])
                ended.append(job["id"])
            for job_id in ended:
                assert c.wait(job_id, timeout=60)["state"] == "CANCELED"
        with Client(srv.url, token=member) as c:
            spec = parse_spec("name: mo-run\nentrypoint: python train.py\n")
            mine = c.submit_packed(spec, packed)["id"]
        yield Setup(srv, admin, member, viewer, sweep, ended, mine)
    finally:
        assert_clean_stop(srv)


def row(page: Page, job_id: int) -> Locator:
    return page.locator(f"[data-testid=job-row][data-job-id='{job_id}']")


def right_edge(locator: Locator) -> float:
    box = locator.bounding_box()
    assert box is not None
    return box["x"] + box["width"]


def test_chosen_columns_stay_in_view_and_any_column_hides(setup: Setup, page: Page) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/jobs?state=&columns={','.join(CHOSEN)}")
    expect(row(page, setup.sweep[0])).to_be_visible()
    width = page.viewport_size["width"] if page.viewport_size else 0
    assert width == 1400
    for field in CHOSEN:  # every column asked for, on screen without scrolling
        head = page.locator(f"th[data-field='{field}']")
        expect(head).to_be_visible()
        assert right_edge(head) <= width, (field, right_edge(head))
    first = row(page, setup.sweep[0])
    expect(first.locator("td[data-field='hparams.lr']")).to_have_text("5.37e-04")
    expect(first.locator("td[data-field='note']")).to_have_text("lr from the range test")
    expect(row(page, setup.sweep[1]).locator("td[data-field='note']")).to_have_text("—")

    # hide fixed columns and a chosen one from the Columns menu; kept in the URL
    page.get_by_test_id("columns-menu-open").click()
    for key in ("owner", "priority", "metrics", "hparams.optim.name"):
        page.get_by_test_id(f"column-toggle-{key}").uncheck()
    expect(page.locator("th.col-owner")).to_have_count(0)
    expect(first.locator(".col-owner, .col-priority, .col-metrics")).to_have_count(0)
    expect(page.locator("th[data-field='hparams.optim.name']")).to_have_count(0)
    expect(first.locator("td[data-field='hparams.optim.name']")).to_have_count(0)
    expect(page.get_by_test_id("columns-input")).to_have_value(",".join(CHOSEN))
    assert "hide=" in page.url and "owner" in page.url
    page.reload()
    expect(row(page, setup.sweep[0])).to_be_visible()
    expect(page.locator("th.col-owner")).to_have_count(0)
    expect(page.locator("th.col-state")).to_have_count(1)
    page.get_by_test_id("columns-menu-open").click()
    expect(page.get_by_test_id("column-toggle-owner")).not_to_be_checked()
    page.get_by_test_id("column-toggle-owner").check()
    expect(row(page, setup.sweep[0]).locator(".col-owner")).to_have_text("admin")


def test_a_columns_error_stays_in_the_columns_box_and_no_count_lies(
    setup: Setup, page: Page
) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/jobs?state=")
    expect(row(page, setup.sweep[0])).to_be_visible()
    expect(page.get_by_test_id("page-info")).to_contain_text(" of ")
    columns = page.get_by_test_id("columns-input")
    columns.fill("hparams.lr, notes")
    columns.press("Enter")
    error = page.get_by_test_id("columns-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("unknown field 'notes' (did you mean 'note'?)")
    expect(page.get_by_test_id("filter-where-error")).to_be_hidden()
    expect(page.get_by_test_id("job-row")).to_have_count(0)
    expect(page.get_by_test_id("page-info")).not_to_contain_text(" of ")
    expect(page.get_by_test_id("job-count")).to_have_text("")
    # the user's note is a column the table knows
    columns.fill("hparams.lr, note")
    columns.press("Enter")
    expect(error).to_be_hidden()
    expect(row(page, setup.sweep[0]).locator("td[data-field='note']")).to_have_text(
        "lr from the range test"
    )
    expect(page.get_by_test_id("page-info")).to_contain_text(" of ")
    # a filter's error stays under the filter box
    page.get_by_test_id("filter-where").fill("reason ~ GPU")
    page.get_by_test_id("filter-where").press("Enter")
    expect(page.get_by_test_id("filter-where-error")).to_contain_text("is a column, not a filter")
    expect(error).to_be_hidden()


def test_row_actions_tag_move_archive_and_delete_after_asking(setup: Setup, page: Page) -> None:
    sign_in(page, setup.srv, setup.admin, "admin (admin)")
    page.goto(f"{setup.srv.url}/#/jobs?state=")
    a, b = setup.ended
    panel = page.get_by_test_id("row-panel")
    message = page.get_by_test_id("row-panel-message")

    # a queued job: tags and project, not archive or delete
    row(page, setup.sweep[1]).get_by_test_id("row-actions").click()
    expect(panel).to_be_visible()
    expect(page.get_by_test_id("row-not-ended")).to_be_visible()
    expect(page.get_by_test_id("row-archive")).to_have_count(0)
    expect(page.get_by_test_id("row-delete")).to_have_count(0)
    page.get_by_test_id("row-panel-close").click()
    expect(panel).to_be_hidden()
    # Escape closes it too
    row(page, setup.sweep[1]).get_by_test_id("row-actions").click()
    page.get_by_test_id("row-tag-input").press("Escape")
    expect(panel).to_be_hidden()

    row(page, a).get_by_test_id("row-actions").click()
    expect(page.get_by_test_id("row-panel-title")).to_contain_text(f"Job {a}")
    page.get_by_test_id("row-tag-input").fill("best")
    page.get_by_test_id("row-tag-add").click()
    expect(message).to_have_text("tag best: done")
    expect(page.get_by_test_id("row-tag")).to_have_text(["best"])
    page.get_by_test_id("row-tag-input").fill("no spaces")
    page.get_by_test_id("row-tag-input").press("Enter")
    expect(message).to_contain_text("tag no spaces refused:")
    page.get_by_test_id("row-project-input").fill("vision")
    page.get_by_test_id("row-project-move").click()
    expect(message).to_have_text("move to vision: done")
    job = setup.job(a).json()
    assert job["tags"] == ["best"] and job["project"] == "vision"
    page.get_by_test_id("row-archive").click()
    expect(message).to_have_text("archive: done")
    expect(row(page, a)).to_have_count(0)  # archived jobs are left out of the list
    assert setup.job(a).json()["archived"] is True

    # delete: asked first; "No" keeps it
    row(page, b).get_by_test_id("row-actions").click()
    page.get_by_test_id("row-delete").click()
    dialog = page.get_by_test_id("row-delete-dialog")
    expect(dialog).to_contain_text(f"Delete job {b} for good")
    page.get_by_test_id("row-delete-abort").click()
    expect(dialog).to_be_hidden()
    assert setup.job(b).status_code == 200
    page.get_by_test_id("row-delete").click()
    page.get_by_test_id("row-delete-confirm").click()
    expect(message).to_have_text("delete: done")
    expect(row(page, b)).to_have_count(0)
    assert setup.job(b).status_code == 404


@pytest.mark.parametrize(("who", "token"), [("vera (viewer)", "viewer"), ("mo (member)", "member")])
def test_who_may_not_change_a_job_gets_no_actions(
    setup: Setup, page: Page, who: str, token: str
) -> None:
    sign_in(page, setup.srv, getattr(setup, token), who)
    page.goto(f"{setup.srv.url}/#/jobs?state=")
    expect(row(page, setup.sweep[0])).to_be_visible()
    expect(row(page, setup.mine)).to_be_visible()
    name = who.split(" ")[0]
    expect(page.locator(f"[data-testid=jobs-table][data-who='{name}']")).to_have_count(1)
    expect(row(page, setup.sweep[0]).get_by_test_id("row-actions")).to_have_count(0)
    # a member changes their own jobs only; a viewer none
    expect(row(page, setup.mine).get_by_test_id("row-actions")).to_have_count(
        1 if token == "member" else 0
    )
    expect(page.get_by_test_id("row-actions")).to_have_count(1 if token == "member" else 0)
