"""The web dashboard in real Chromium against a real server and real training jobs: what the
pages show is what the API reports."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import api, chart_data, row_ids
from tests.support.jobs import write_job
from tests.support.servers import Server
from trainhouse.jobfs.storage import new_hash
from trainhouse.jobfs.workdir import pack
from trainhouse.spec import parse_spec

pytestmark = pytest.mark.browser

# a known series, loss = scale / (step + 1), and coloured output (green rank, bold red "loss")
SERIES_SCRIPT = """
import time
import trainhouse

with trainhouse.init(hparams={"scale": 1.0, "steps": 50}) as run:
    scale = float(run.hparams["scale"])
    steps = int(run.hparams["steps"])
    run.set_total_steps(steps)
    for step in range(steps):
        run.log({"loss": scale / (step + 1)}, step=step)
        print(f"\\x1b[32mrank {run.rank}\\x1b[0m step {step} \\x1b[1;31mloss\\x1b[0m "
              f"{scale / (step + 1):.4f}", flush=True)
        time.sleep(0.02)
    run.checkpoint.save({"step": step, "scale": scale}, step=step)
"""

# runs until canceled; each line has a cyan word and markup that must stay text
STREAM_SCRIPT = """
import time
import trainhouse

with trainhouse.init() as run:
    step = 0
    while not run.should_stop():
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        print(f"\\x1b[36mtick\\x1b[0m step {step} <b>not bold</b>", flush=True)
        step += 1
        time.sleep(0.1)
    print("stopping as asked", flush=True)
"""

PARKED = """
name: parked
entrypoint: python train.py
"""


def wait_chart(page: Page, testid: str, points: int) -> list[dict[str, Any]]:
    page.wait_for_function(
        """([id, n]) => {
            const el = document.querySelector(`[data-testid="${id}"]`);
            return !!(el && el.data && el.data[0] && el.data[0].x.length === n);
        }""",
        arg=[testid, points],
    )
    return chart_data(page, testid)


def submit(server: Server, tmp_path: Path, script: str, name: str, *sets: str) -> dict[str, Any]:
    spec = write_job(
        tmp_path / name,
        script,
        f"""
        name: {name}
        entrypoint: python train.py
        resources: {{procs_per_node: 1}}
        """,
    )
    args = [arg for s in sets for arg in ("--set", s)]
    job: dict[str, Any] = server.cli_json("submit", str(spec), "--detach", *args)
    return job


def test_list_shows_the_job_and_its_page_charts_the_apis_points(
    server: Server, page: Page, tmp_path: Path
) -> None:
    first = submit(server, tmp_path, SERIES_SCRIPT, "series-a")
    second = submit(server, tmp_path, SERIES_SCRIPT, "other-b", "hparams.scale=3")

    page.goto(server.url + "/")
    rows = page.get_by_test_id("job-row")
    row = page.locator(f'[data-testid=job-row][data-job-id="{first["id"]}"]')
    expect(row).to_contain_text("series-a")
    expect(rows).to_have_count(2)
    page.get_by_test_id("filter-name").fill("SERIES")  # a case-insensitive substring
    expect(rows).to_have_count(1)
    expect(row).to_be_visible()
    assert "name=SERIES" in page.url  # the filters live in the address: a link shows them

    for job in (first, second):
        server.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=180)
    expect(row.get_by_test_id("state-badge")).to_have_text("COMPLETED")
    expect(row.locator(".col-progress")).to_contain_text("50/50")

    row.get_by_test_id("job-name").click()
    assert page.url.endswith(f"#/jobs/{first['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    traces = wait_chart(page, "chart-loss", 50)
    points = api(server, f"/jobs/{first['id']}/metrics", name="loss")["series"][0]["points"]
    assert traces[0]["x"] == [p[0] for p in points] == list(range(50))
    assert traces[0]["y"] == [p[1] for p in points]
    assert traces[0]["y"][9] == pytest.approx(1 / 10)

    # smoothing draws an average over the raw series, which stays as it was
    page.get_by_test_id("smoothing").fill("0.9")
    page.wait_for_function("document.querySelector('[data-testid=chart-loss]').data.length === 2")
    smoothed = chart_data(page, "chart-loss")
    assert smoothed[0]["y"] == traces[0]["y"]
    assert smoothed[1]["y"][0] == pytest.approx(1.0) and smoothed[1]["y"][-1] > 1 / 50
    page.get_by_test_id("log-scale").check()
    page.wait_for_function(
        "document.querySelector('[data-testid=chart-loss]').layout.yaxis.type === 'log'"
    )

    # the log, its ANSI colours turned into styled spans
    log = page.get_by_test_id("log-rank-0")
    expect(log).to_contain_text("rank 0 step 49 loss 0.0200")
    green = log.locator("span.ansi-green").first
    expect(green).to_have_text("rank 0")
    assert "rgb(" in green.evaluate("(el) => getComputedStyle(el).color")
    expect(log.locator("span.ansi-red.ansi-bold").first).to_have_text("loss")
    assert "\x1b" not in log.inner_text()

    # the checkpoint, downloadable from its row
    ckpt_row = page.get_by_test_id("checkpoint-row")
    expect(ckpt_row).to_have_count(1)
    ckpts = api(server, f"/jobs/{first['id']}/checkpoints")["checkpoints"]
    assert [c["step"] for c in ckpts] == [49]
    expect(ckpt_row).to_have_attribute("data-step", "49")
    expect(ckpt_row).to_contain_text(ckpts[0]["sha256"][:12])
    href = ckpt_row.get_by_test_id("checkpoint-download").get_attribute("href")
    content = httpx.get(server.url + str(href), timeout=30).content
    digest = new_hash(ckpts[0]["algorithm"])  # the record names its digest's algorithm
    digest.update(content)
    assert ckpts[0]["algorithm"] == "blake3" and digest.hexdigest() == ckpts[0]["sha256"]

    # the attempt, and both jobs overlaid on the compare page
    expect(page.get_by_test_id("attempt-row")).to_contain_text("completed")
    page.goto(f"{server.url}/#/compare?ids={first['id']},{second['id']}")
    page.wait_for_function(
        """() => {
            const el = document.querySelector('[data-testid=compare-chart-loss]');
            return !!(el && el.data && el.data.length === 2 &&
                      el.data.every((t) => t.x.length === 50));
        }"""
    )
    overlaid = chart_data(page, "compare-chart-loss")
    for trace, job in zip(overlaid, (first, second), strict=True):
        series = api(server, f"/jobs/{job['id']}/metrics", name="loss")["series"][0]["points"]
        assert trace["y"] == [p[1] for p in series]
        assert trace["name"].startswith(f"#{job['id']} ")
    assert overlaid[1]["y"][0] == 3.0

    # the hparams the runs used side by side (scale differs), and the time since each run's
    # start on the x axis (in seconds, for runs this short)
    differs = page.get_by_test_id("compare-hparams").locator("tr.differs")
    expect(differs).to_have_attribute("data-key", "scale")
    page.get_by_test_id("compare-x").select_option("wall")
    page.wait_for_function(
        """() => {
            const el = document.querySelector('[data-testid=compare-chart-loss]');
            return !!(el && el.layout && el.layout.xaxis.title.text === "time since start (s)"
                      && el.data.length === 2);
        }"""
    )
    since = chart_data(page, "compare-chart-loss")[0]["x"]
    series = api(server, f"/jobs/{first['id']}/metrics", name="loss")["series"][0]["points"]
    started = api(server, f"/jobs/{first['id']}")["started_at"]
    assert since == pytest.approx([p[2] - started for p in series], abs=1e-6)


def test_logs_stream_in_and_the_cancel_button_cancels(
    server: Server, page: Page, tmp_path: Path
) -> None:
    job = submit(server, tmp_path, STREAM_SCRIPT, "streamer")
    opened_at = server.wait_step(job["id"], 2)["last_step"]
    page.goto(f"{server.url}/#/jobs/{job['id']}")
    expect(page.get_by_test_id("job-state")).to_have_text("RUNNING")
    log = page.get_by_test_id("log-rank-0")
    expect(log).to_contain_text(f"step {opened_at} ")

    # lines printed after the page was opened arrive without a reload
    later = opened_at + 15
    server.wait_step(job["id"], later)
    expect(log).to_contain_text(f"tick step {later} <b>not bold</b>")
    expect(log.locator("span.ansi-cyan").first).to_have_text("tick")
    assert log.locator("b").count() == 0  # printed markup stays text

    # the chart follows the job while it runs: each time the page's series grows, what
    # plotly drew grows with it (its computed points and its x axis), not only the arrays it
    # was handed; three growths in a row (the page re-reads a series in full only every 30 s)
    for _ in range(3):
        grown = chart_data(page, "chart-loss")[0]["x"][-1]
        page.wait_for_function(
            """(n) => {
                const el = document.querySelector('[data-testid=chart-loss]');
                return !!(el && el.data && el.data[0].x[el.data[0].x.length - 1] > n);
            }""",
            arg=grown,
        )
        drawn = page.evaluate(
            """() => {
                const el = document.querySelector('[data-testid=chart-loss]');
                const x = el.data[0].x;
                return {points: x.length, last: x[x.length - 1], calc: el.calcdata[0].length,
                        right: el._fullLayout.xaxis.range[1]};
            }"""
        )
        assert drawn["calc"] == drawn["points"], drawn
        assert drawn["right"] >= drawn["last"], drawn

    # cancel, with a confirmation step that can still be backed out of
    page.get_by_test_id("cancel-button").click()
    expect(page.get_by_test_id("cancel-dialog")).to_be_visible()
    page.get_by_test_id("cancel-abort").click()
    expect(page.get_by_test_id("cancel-dialog")).to_be_hidden()
    assert api(server, f"/jobs/{job['id']}")["cancel_requested"] is False
    page.get_by_test_id("cancel-button").click()
    page.get_by_test_id("cancel-confirm").click()

    final = server.wait(job["id"], {"CANCELED", "COMPLETED", "FAILED"}, timeout=60)
    assert final["state"] == "CANCELED"
    assert final["attempt_history"][0]["result"] == "canceled"
    expect(page.get_by_test_id("job-state")).to_have_text("CANCELED")
    expect(page.get_by_test_id("cancel-button")).to_be_hidden()
    expect(log).to_contain_text("stopping as asked")

    # once the job has ended the chart holds exactly the API's points
    points = api(server, f"/jobs/{job['id']}/metrics", name="loss")["series"][0]["points"]
    traces = wait_chart(page, "chart-loss", len(points))
    assert traces[0]["x"] == [p[0] for p in points]
    assert traces[0]["y"] == [p[1] for p in points]


def submit_many(server: Server, tmp_path: Path, count: int) -> list[dict[str, Any]]:
    """``count`` jobs named sweep-000.., owners alice and bob in turn, priorities in a cycle."""
    workdir = tmp_path / "parked"
    workdir.mkdir(parents=True)
    (workdir / "train.py").write_text("print('never runs')\n")
    packed = pack(workdir)
    tiers = ("low", "normal", "high")
    jobs = []
    with server.client as client:
        for i in range(count):
            text = textwrap.dedent(PARKED).replace("parked", f"sweep-{i:03d}")
            spec = parse_spec(text + f"priority: {tiers[i % 3]}\n")
            owner = ("alice", "bob")[i % 2]
            jobs.append(client.submit_packed(spec, packed, owner=owner))
    return jobs


def test_pages_sorts_and_filters_many_jobs_and_shows_the_queue(
    parked_server: Server, page: Page, tmp_path: Path
) -> None:
    srv = parked_server
    jobs = submit_many(srv, tmp_path, 120)
    ids = [j["id"] for j in jobs]

    page.goto(srv.url + "/#/jobs")
    rows = page.get_by_test_id("job-row")
    expect(rows).to_have_count(50)
    expect(page.get_by_test_id("job-count")).to_have_text("120 jobs")
    expect(page.get_by_test_id("page-info")).to_contain_text("1\N{EN DASH}50 of 120")
    assert row_ids(page) == sorted(ids, reverse=True)[:50]  # newest first

    page.get_by_test_id("page-next").click()
    expect(page.get_by_test_id("page-info")).to_contain_text("51\N{EN DASH}100 of 120")
    assert row_ids(page) == sorted(ids, reverse=True)[50:100]
    page.get_by_test_id("page-last").click()
    expect(rows).to_have_count(20)
    assert row_ids(page) == sorted(ids, reverse=True)[100:]
    expect(page.get_by_test_id("page-next")).to_be_disabled()

    # sorting goes back to the first page
    page.get_by_test_id("sort-name").click()
    expect(page.get_by_test_id("page-info")).to_contain_text("1\N{EN DASH}50 of 120")
    expect(rows.first).to_contain_text("sweep-000")
    page.get_by_test_id("sort-name").click()
    expect(rows.first).to_contain_text("sweep-119")
    expect(page.get_by_test_id("sort-name")).to_have_attribute("aria-sort", "descending")
    page.get_by_test_id("sort-priority").click()  # by tier, highest first
    expect(rows.first.locator(".col-priority")).to_have_text("high")
    expected = api(srv, "/jobs", all="true", sort="priority", order="desc", limit=50)["jobs"]
    expect(rows.first).to_have_attribute("data-job-id", str(expected[0]["id"]))

    # filters: owner, state, and both at once; the count follows
    page.get_by_test_id("filter-owner").fill("bob")
    expect(page.get_by_test_id("job-count")).to_have_text("60 jobs")
    page.get_by_test_id("page-size").select_option("100")
    expect(rows).to_have_count(60)
    owners = page.locator("[data-testid=job-row] .col-owner").all_inner_texts()
    assert set(owners) == {"bob"}
    page.get_by_test_id("filter-state").select_option("CANCELED")
    expect(page.get_by_test_id("job-count")).to_have_text("0 jobs")
    expect(page.locator("tr.empty")).to_contain_text("No job matches")
    page.get_by_test_id("filter-state").select_option("QUEUED")
    expect(page.get_by_test_id("job-count")).to_have_text("60 jobs")

    # the list is live: a job submitted now shows up without a reload
    page.get_by_test_id("filter-owner").fill("")
    page.get_by_test_id("sort-id").click()
    expect(rows.first).to_have_attribute("data-job-id", str(max(ids)))
    newest = submit_many(srv, tmp_path / "more", 1)[0]
    expect(rows.first).to_have_attribute("data-job-id", str(newest["id"]))

    # the queue: every waiting job, in the scheduler's order, with its reason
    queue = api(srv, "/queue")["jobs"]
    page.get_by_role("link", name="Queue").click()
    queue_rows = page.get_by_test_id("queue-row")
    expect(queue_rows).to_have_count(len(queue))
    first = queue_rows.first
    expect(first).to_have_attribute("data-job-id", str(queue[0]["id"]))
    expect(first.get_by_test_id("queue-position")).to_have_text("1")
    expect(first.get_by_test_id("queue-reason")).to_have_text(queue[0]["reason"])
    assert re.search(r"quota", queue[0]["reason"])

    # the nodes: what the server offers and what is free
    node = api(srv, "/nodes")["nodes"][0]
    page.get_by_role("link", name="Nodes").click()
    card = page.get_by_test_id("node-card")
    expect(card).to_have_count(1)
    expect(card.locator("h2")).to_have_text(node["name"])
    expect(card.get_by_test_id("node-cpus")).to_contain_text(
        f"{node['cpus'] - node['free_cpus']} / {node['cpus']} ({node['free_cpus']} free)"
    )

    # its charts share the card's whole width (no empty column beside them)
    page.wait_for_function(
        "document.querySelectorAll('[data-testid=node-charts] .chart').length >= 2"
    )
    widths = page.evaluate(
        """() => {
            const grid = document.querySelector('[data-testid=node-charts]');
            const charts = [...grid.querySelectorAll('.chart')].slice(0, 2);
            return {grid: grid.clientWidth, charts: charts.map((c) => c.offsetWidth)};
        }"""
    )
    assert sum(widths["charts"]) >= 0.95 * widths["grid"] - 24, widths

    # a page that does not exist is no tab's: none stays highlighted
    page.goto(f"{srv.url}/#/no-such-page")
    expect(page.get_by_test_id("not-found-page")).to_be_visible()
    assert page.locator("header nav a.active").count() == 0

    # the browser's dark preference darkens the page
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light == "rgb(245, 246, 248)" and dark == "rgb(18, 22, 31)", (light, dark)

    # the queue page changes a job's priority and cancels it, by the CLI's rules
    page.goto(f"{srv.url}/#/queue")
    row = page.locator(f'[data-testid=queue-row][data-job-id="{ids[0]}"]')
    row.get_by_test_id("queue-priority").select_option("low")
    expect(page.get_by_test_id("queue-message")).to_contain_text("done")
    assert api(srv, f"/jobs/{ids[0]}")["priority"] == "low"
    row = page.locator(f'[data-testid=queue-row][data-job-id="{ids[0]}"]')
    row.get_by_test_id("queue-cancel").click()
    row.get_by_test_id("queue-cancel-confirm").click()
    expect(page.get_by_test_id("queue-message")).to_contain_text(f"cancel job {ids[0]}: done")
    assert api(srv, f"/jobs/{ids[0]}")["state"] == "CANCELED"
    expect(page.locator(f'[data-testid=queue-row][data-job-id="{ids[0]}"]')).to_have_count(0)
