"""The compare page in real Chromium against a real server and two real training jobs that log
known values: the numbers table (final, best by the metric's goal, min and max where no goal is
known, the mean of the last N points, N adjustable), sorting it, the differing columns
highlighted and the best cell marked; the x axis by step, by time since each run's start, or by
another logged metric (paired by step); one legend for all the charts, which hides a job on
every chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import api, chart_data
from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.browser

STEPS = 20
# loss = scale / (step + 1) (lower is better, by its name), val_acc = step / (20 * scale)
# (higher), epoch = step // 5 (no goal: min and max), each at every step
SCRIPT = """
import trainhouse

with trainhouse.init(hparams={"scale": 1.0}) as run:
    scale = float(run.hparams["scale"])
    for step in range(20):
        run.log({"loss": scale / (step + 1), "val_acc": step / (20 * scale),
                 "epoch": step // 5}, step=step)
"""


def expected(scale: float, last: int) -> dict[str, dict[str, float]]:
    loss = [scale / (s + 1) for s in range(STEPS)]
    acc = [s / (20 * scale) for s in range(STEPS)]
    epoch = [float(s // 5) for s in range(STEPS)]
    mean = lambda v: sum(v[-last:]) / len(v[-last:])  # noqa: E731
    return {
        "loss": {"final": loss[-1], "best": min(loss), "last_mean": mean(loss)},
        "val_acc": {"final": acc[-1], "best": max(acc), "last_mean": mean(acc)},
        "epoch": {"final": 3.0, "min": 0.0, "max": 3.0, "last_mean": mean(epoch)},
    }


def submit(server: Server, tmp_path: Path, name: str, scale: float) -> dict[str, Any]:
    spec = write_job(
        tmp_path / name,
        SCRIPT,
        f"name: {name}\nentrypoint: python train.py\nresources: {{procs_per_node: 1}}\n",
    )
    job: dict[str, Any] = server.cli_json(
        "submit", str(spec), "--detach", "--set", f"hparams.scale={scale}"
    )
    return job


def cells(page: Page) -> dict[int, dict[tuple[str, str], str]]:
    """The numbers table: job id -> (metric, column) -> the cell's exact value."""
    found: dict[str, dict[str, str]] = page.get_by_test_id("numbers-row").evaluate_all(
        """(rows) => Object.fromEntries(rows.map((r) => [r.dataset.jobId, Object.fromEntries(
            [...r.querySelectorAll('td')].map((td) =>
                [td.dataset.metric + '/' + td.dataset.key, td.dataset.value]))]))"""
    )
    return {
        int(job): {tuple(k.split("/")): v for k, v in row.items()}  # type: ignore[misc]
        for job, row in found.items()
    }


def row_order(page: Page) -> list[int]:
    ids: list[str] = page.get_by_test_id("numbers-row").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.jobId)"
    )
    return [int(i) for i in ids]


def check_numbers(page: Page, jobs: dict[int, float], last: int) -> None:
    got = cells(page)
    assert set(got) == set(jobs)
    for job_id, scale in jobs.items():
        for metric, columns in expected(scale, last).items():
            for column, value in columns.items():
                assert float(got[job_id][(metric, column)]) == pytest.approx(value), (
                    job_id,
                    metric,
                    column,
                )


def test_numbers_x_axes_and_one_legend(server: Server, page: Page, tmp_path: Path) -> None:
    a = submit(server, tmp_path, "small", 1.0)["id"]
    b = submit(server, tmp_path, "large", 3.0)["id"]
    for job in (a, b):
        assert server.wait(job, {"COMPLETED", "FAILED"}, timeout=180)["state"] == "COMPLETED"

    page.goto(f"{server.url}/#/compare?ids={b},{a}")
    table = page.get_by_test_id("compare-numbers")
    expect(table.get_by_test_id("numbers-row")).to_have_count(2)
    # the goal of each metric in its head: loss and val_acc by their names, epoch none
    heads = table.get_by_test_id("numbers-metric")
    expect(heads).to_have_text(["epoch", "loss ↓", "val_acc ↑"])
    # as logged, not upper-cased as the other heads are
    assert heads.evaluate_all("(ths) => ths.map((th) => th.innerText)") == [
        "epoch",
        "loss ↓",
        "val_acc ↑",
    ]
    assert "from its name" in str(heads.nth(1).get_attribute("title"))
    assert "goal not known" in str(heads.nth(0).get_attribute("title"))
    check_numbers(page, {a: 1.0, b: 3.0}, last=10)
    assert row_order(page) == [b, a]  # as asked, until sorted

    # the columns whose values differ are highlighted, the best job's cell marked in them;
    # epoch is the same for both jobs
    differing = table.locator("th.differs").evaluate_all(
        "(ths) => ths.map((th) => th.dataset.metric + '/' + th.dataset.key)"
    )
    assert differing == [
        "loss/final",
        "loss/best",
        "loss/last_mean",
        "val_acc/final",
        "val_acc/best",
        "val_acc/last_mean",
    ]
    best = table.locator("td.best").evaluate_all(
        "(tds) => tds.map((td) => "
        "[td.closest('tr').dataset.jobId, td.dataset.metric, td.dataset.key])"
    )
    assert sorted(best) == sorted(
        [[str(a), m, k] for m in ("loss", "val_acc") for k in ("final", "best", "last_mean")]
    )
    assert table.locator("td.differs[data-metric=epoch]").count() == 0

    # sorting by a column, then the other way
    head = table.locator("th[data-metric=loss][data-key=final]")
    head.click()
    expect(table.locator("th[data-metric=loss][data-key=final]")).to_have_attribute(
        "aria-sort", "ascending"
    )
    assert row_order(page) == [a, b]
    table.locator("th[data-metric=loss][data-key=final]").click()
    expect(table.locator("th[data-metric=loss][data-key=final]")).to_have_attribute(
        "aria-sort", "descending"
    )
    assert row_order(page) == [b, a]

    # N of the last-N mean: kept in the address
    page.get_by_test_id("compare-last").fill("3")
    page.get_by_test_id("compare-last").dispatch_event("change")
    page.wait_for_url("**last=3**")
    expect(page.get_by_test_id("compare-numbers").get_by_test_id("numbers-row")).to_have_count(2)
    page.wait_for_function(
        """() => {
            const td = document.querySelector(
                '[data-testid=compare-numbers] td[data-metric=epoch][data-key=last_mean]');
            return !!td && td.dataset.value === '3';
        }"""
    )
    check_numbers(page, {a: 1.0, b: 3.0}, last=3)
    summary = api(server, "/runs/compare", ids=f"{b},{a}", last=3)
    loss = {r["job_id"]: r for m in summary["metrics"] if m["name"] == "loss" for r in m["runs"]}
    assert float(cells(page)[a][("loss", "last_mean")]) == loss[a]["last_mean"]

    # one legend for all the charts: none of their own; hiding a job hides it on every chart
    charts = ("compare-chart-loss", "compare-chart-val_acc", "compare-chart-epoch")
    page.wait_for_function(
        """(ids) => ids.every((id) => {
            const el = document.querySelector(`[data-testid="${id}"]`);
            return !!(el && el.data && el.data.length === 2);
        })""",
        arg=list(charts),
    )
    for chart in charts:
        assert (
            page.evaluate(f"document.querySelector('[data-testid={chart}]').layout.showlegend")
            is False
        )
    legend = page.get_by_test_id("compare-legend-item")
    expect(legend).to_have_count(2)
    page.locator(f"[data-testid=compare-legend-item][data-job-id='{b}']").get_by_test_id(
        "compare-legend-toggle"
    ).click()
    page.wait_for_function(
        """(ids) => ids.every((id) =>
            document.querySelector(`[data-testid="${id}"]`).data.length === 1)""",
        arg=list(charts),
    )
    for chart in charts:
        assert chart_data(page, chart)[0]["name"].startswith(f"#{a} ")
    expect(
        page.locator(f"[data-testid=compare-legend-item][data-job-id='{b}'] button")
    ).to_have_attribute("aria-pressed", "false")
    page.locator(f"[data-testid=compare-legend-item][data-job-id='{b}'] button").click()
    page.wait_for_function(
        """(ids) => ids.every((id) =>
            document.querySelector(`[data-testid="${id}"]`).data.length === 2)""",
        arg=list(charts),
    )

    # x: another logged metric, paired by step; its own chart is left out
    page.get_by_test_id("compare-x").select_option("metric:epoch")
    page.wait_for_url("**x=metric%3Aepoch**")
    page.wait_for_function(
        """() => {
            const el = document.querySelector('[data-testid=compare-chart-loss]');
            return !!(el && el.layout && el.layout.xaxis.title.text === 'epoch'
                      && el.data.length === 2);
        }"""
    )
    expect(page.get_by_test_id("compare-chart-epoch")).to_have_count(0)
    by_epoch = chart_data(page, "compare-chart-loss")
    for trace, scale in zip(by_epoch, (3.0, 1.0), strict=True):  # b first, as asked
        assert trace["x"] == [s // 5 for s in range(STEPS)]
        assert trace["y"] == pytest.approx([scale / (s + 1) for s in range(STEPS)])

    # x: time since each run's start, in seconds for such short runs
    page.get_by_test_id("compare-x").select_option("wall")
    page.wait_for_function(
        """() => {
            const el = document.querySelector('[data-testid=compare-chart-loss]');
            return !!(el && el.layout && el.layout.xaxis.title.text === 'time since start (s)'
                      && el.data.length === 2);
        }"""
    )
    since = chart_data(page, "compare-chart-loss")
    for trace, job_id in zip(since, (b, a), strict=True):
        started = api(server, f"/jobs/{job_id}")["started_at"]
        points = api(server, f"/jobs/{job_id}/metrics", name="loss")["series"][0]["points"]
        assert trace["x"] == pytest.approx([p[2] - started for p in points], abs=1e-6)
        assert all(x >= 0 for x in trace["x"])

    # a job that is not there says so in the legend; the numbers are the others'
    page.goto(f"{server.url}/#/compare?ids=999,{a}")
    expect(page.get_by_test_id("compare-numbers").get_by_test_id("numbers-row")).to_have_count(1)
    assert row_order(page) == [a]
    expect(page.locator("[data-testid=compare-legend-item][data-job-id='999']")).to_contain_text(
        "999"
    )
    expect(
        page.locator("[data-testid=compare-legend-item][data-job-id='999'] .error")
    ).to_be_visible()
