"""The runs table in real Chromium against a real server: the filter box (kept in the URL, its
errors pointing at the bad token), chosen hparam columns and sorting by them, the project and
tag filters, a job's tags and markdown note, and compare's hparams table with the differing
ones highlighted. Jobs stay queued (no CPU for anyone): their hparams are the spec's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import api, row_ids
from tests.support.servers import Server
from trainhouse.jobfs.workdir import pack
from trainhouse.spec import parse_spec

pytestmark = pytest.mark.browser


def submit_sweep(server: Server, tmp_path: Path) -> list[dict[str, Any]]:
    workdir = tmp_path / "parked"
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text("print('never runs')\n")
    packed = pack(workdir)
    jobs = []
    with server.client as client:
        for i, lr in enumerate((0.1, 0.01, 0.001)):
            spec = parse_spec(
                f"name: sweep-{i}\nentrypoint: python train.py\n"
                f"project: {'vision' if i < 2 else 'nlp'}\ntags: [s{i}]\n"
                f"hparams: {{lr: {lr}, batch: 32, optim: {{name: {'sgd' if i else 'adam'}}}}}\n"
            )
            jobs.append(client.submit_packed(spec, packed, owner="ann"))
    return jobs


def test_filter_columns_tags_note_and_compare(
    parked_server: Server, page: Page, tmp_path: Path
) -> None:
    srv = parked_server
    a, b, c = (j["id"] for j in submit_sweep(srv, tmp_path))
    page.goto(srv.url + "/#/jobs")
    rows = page.get_by_test_id("job-row")
    expect(rows).to_have_count(3)

    # the filter: applied with Enter, kept in the URL; a bad one points at its token
    page.get_by_test_id("filter-where").fill("hparams.lr >= 0.01 and project = vision")
    page.get_by_test_id("filter-where").press("Enter")
    expect(rows).to_have_count(2)
    assert row_ids(page) == [b, a]
    assert "where=hparams.lr" in page.url
    page.reload()
    expect(page.get_by_test_id("filter-where")).to_have_value(
        "hparams.lr >= 0.01 and project = vision"
    )
    expect(rows).to_have_count(2)
    page.get_by_test_id("filter-where").fill("hparams.lr >= and")
    page.get_by_test_id("filter-where").press("Enter")
    error = page.get_by_test_id("filter-where-error")
    expect(error).to_contain_text("expected a value to compare hparams.lr with")
    expect(error).to_contain_text("column 15")
    page.get_by_test_id("filter-where").fill("")
    page.get_by_test_id("filter-where").press("Enter")
    expect(rows).to_have_count(3)
    expect(error).to_be_hidden()

    # chosen columns, sorted by a click on their header
    page.get_by_test_id("columns-input").fill("hparams.lr, hparams.optim.name")
    page.get_by_test_id("columns-input").press("Enter")
    expect(page.locator("td[data-field='hparams.lr']")).to_have_count(3)
    page.get_by_test_id("sort-hparams.lr").click()
    expect(rows.first).to_have_attribute("data-job-id", str(a))  # the largest lr first
    assert page.locator("td[data-field='hparams.lr']").all_inner_texts() == ["0.1", "0.01", "0.001"]
    page.get_by_test_id("sort-hparams.lr").click()
    expect(rows.first).to_have_attribute("data-job-id", str(c))
    assert page.locator("td[data-field='hparams.optim.name']").all_inner_texts() == [
        "sgd",
        "sgd",
        "adam",
    ]

    # project and tag filters
    page.get_by_test_id("filter-project").select_option("nlp")
    expect(rows).to_have_count(1)
    page.get_by_test_id("filter-project").select_option("")
    page.get_by_test_id("filter-tag").select_option("s1")
    expect(rows.first).to_have_attribute("data-job-id", str(b))
    expect(rows).to_have_count(1)

    # the job page: tags and a markdown note, saved and shown after a reload
    page.goto(f"{srv.url}/#/jobs/{b}")
    expect(page.get_by_test_id("job-project")).to_have_text("vision")
    expect(page.get_by_test_id("job-hparams")).to_contain_text("optim.name")
    page.get_by_test_id("tag-input").fill("best")
    page.get_by_test_id("tag-input").press("Enter")
    expect(page.get_by_test_id("tag")).to_have_count(2)
    page.get_by_test_id("tag-remove-s1").click()
    expect(page.get_by_test_id("tag")).to_have_text(["best\N{MULTIPLICATION SIGN}"])
    page.get_by_test_id("note-edit").click()
    page.get_by_test_id("note-input").fill("## Why\n\nlr **0.01** beat <b>the rest</b>\n- keep it")
    page.get_by_test_id("note-save").click()
    expect(page.get_by_test_id("note-view").locator("h4")).to_have_text("Why")
    expect(page.get_by_test_id("note-view").locator("strong")).to_have_text("0.01")
    expect(page.get_by_test_id("note-view")).to_contain_text("<b>the rest</b>")  # text, not HTML
    assert api(srv, f"/jobs/{b}")["tags"] == ["best"]
    page.reload()
    expect(page.get_by_test_id("note-view").locator("li")).to_have_text("keep it")

    # compare: the hparams side by side, the differing ones first and highlighted
    page.goto(f"{srv.url}/#/compare?ids={a},{b}")
    table = page.get_by_test_id("compare-hparams")
    expect(table.get_by_test_id("hparam-row")).to_have_count(3)
    keys = table.get_by_test_id("hparam-row").evaluate_all(
        "(rows) => rows.map((r) => [r.dataset.key, r.classList.contains('differs')])"
    )
    assert keys == [["lr", True], ["optim.name", True], ["batch", False]]
