"""The search pages in real Chromium against a real server whose trials are real processes:
the trials table sorts, the charts plot what the API reports (best so far, each trial's curve
with the pruned ones marked, parallel coordinates, importances) and the job list links a trial
to its search."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.dashboard import labels_beside_values, sign_in
from tests.support.jobs import write_job
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.client import Client

pytestmark = pytest.mark.browser

# a trial that reports val_loss straight to the REST API, one step at a time, and stops when the
# answer says so (what the SDK's reporter and should_stop do, without torch's start-up)
REPORTER = """
import json, os, time, uuid, urllib.request

env = os.environ
hp = json.loads(env["TRAINHOUSE_HPARAMS"])
for step in range(8):
    body = json.dumps({"batch_id": uuid.uuid4().hex, "attempt": int(env["TRAINHOUSE_ATTEMPT"]),
        "columns": {"step": [step], "name": ["val_loss"],
                    "value": [float(hp["lr"]) * 10 + 1.0 / (step + 1)], "rank": [None],
                    "wall_time": [time.time()]}}).encode()
    request = urllib.request.Request(
        f"{env['TRAINHOUSE_URL']}/api/v1/jobs/{env['TRAINHOUSE_JOB_ID']}/report", data=body,
        headers={"Authorization": f"Bearer {env['TRAINHOUSE_JOB_TOKEN']}",
                 "Content-Type": "application/json",
                 "X-Trainhouse-Request": "1"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        if json.loads(answer.read())["stop"]:
            print(f"pruned at step {step}", flush=True)
            break
    time.sleep(0.05)
"""

SPEC = """
name: page-search
entrypoint: python train.py
hparams:
  lr: {choice: [0.01, 0.5, 0.02, 0.4]}
  width: 8
search:
  method: grid
  metric: val_loss
  max_trials: 4
  max_concurrent: 1
  early_stopping: {method: asha, min_steps: 2, reduction_factor: 2}
  seed: 0
"""


@pytest.fixture
def searched(tmp_path: Path) -> Iterator[tuple[Server, dict[str, Any]]]:
    srv = start_server(tmp_path / "home", "--cpus", "2")
    try:
        spec = write_job(tmp_path, REPORTER, SPEC)
        search_id = srv.cli_json("submit", str(spec), "--detach")["search_id"]
        deadline = time.monotonic() + 240
        while (view := api(srv, f"/searches/{search_id}"))["state"] == "RUNNING":
            assert time.monotonic() < deadline, view
            time.sleep(0.3)
        yield srv, view
    finally:
        assert_clean_stop(srv)


def api(server: Server, path: str) -> Any:
    resp = httpx.get(f"{server.url}/api/v1{path}", timeout=30)
    resp.raise_for_status()
    return resp.json()


def traces(page: Page, testid: str) -> list[dict[str, Any]]:
    page.wait_for_function(
        '(id) => { const el = document.querySelector(`[data-testid="${id}"]`);'
        " return !!(el && el.data && el.data.length); }",
        arg=testid,
    )
    found: list[dict[str, Any]] = page.evaluate(
        """(id) => document.querySelector(`[data-testid="${id}"]`).data.map((t) => ({
            type: t.type, name: t.name, x: t.x, y: t.y,
            dims: t.dimensions ? t.dimensions.map((d) => d.label) : null}))""",
        testid,
    )
    return found


def test_the_search_page_shows_trials_curves_and_the_best(
    searched: tuple[Server, dict[str, Any]], page: Page
) -> None:
    srv, view = searched
    states = {t["number"]: t["state"] for t in view["trials"]}
    assert "PRUNED" in states.values() and "COMPLETED" in states.values(), view["trials"]
    page.goto(f"{srv.url}/#/searches/{view['id']}")
    expect(page.get_by_test_id("search-state")).to_have_text("COMPLETED")
    rows = page.get_by_test_id("trial-row")
    expect(rows).to_have_count(4)
    # its facts read as a job's summary does: each label beside its value
    labels_beside_values(page.get_by_test_id("search-facts"))
    # the sampled hparam's column is headed by its name as written (case matters in it)
    assert page.get_by_test_id("trial-sort-param:lr").inner_text() == "lr"
    for number, state in states.items():
        expect(page.locator(f'[data-testid="trial-row"][data-trial="{number}"]')).to_have_attribute(
            "data-state", state
        )
    # sorted by objective: the completed trials' values ascending, the others after them
    page.get_by_test_id("trial-sort-value").click()
    done = sorted((t["value"], t["number"]) for t in view["trials"] if t["value"] is not None)
    shown = [int(n) for n in rows.evaluate_all("rs => rs.map((r) => r.dataset.trial)")]
    assert shown[: len(done)] == [n for _v, n in done]
    page.get_by_test_id("trial-sort-value").click()  # and descending
    shown = [int(n) for n in rows.evaluate_all("rs => rs.map((r) => r.dataset.trial)")]
    assert shown[: len(done)] == [n for _v, n in reversed(done)]
    # best so far over trials: the running minimum of the completed trials' values
    completed = sorted(
        (t["number"], t["value"]) for t in view["trials"] if t["state"] == "COMPLETED"
    )
    best = traces(page, "chart-best")[0]
    running = [min(v for _n, v in completed[: i + 1]) for i in range(len(completed))]
    assert best["x"] == [n for n, _v in completed] and best["y"] == pytest.approx(running)
    # each trial's curve is the API's, the pruned ones marked in their names
    curves = api(srv, f"/searches/{view['id']}/curves")["trials"]
    plotted = {t["name"]: t for t in traces(page, "chart-curves")}
    for curve in curves:
        name = f"trial {curve['number']}" + (" (pruned)" if curve["state"] == "PRUNED" else "")
        assert plotted[name]["x"] == curve["steps"]
        assert plotted[name]["y"] == pytest.approx(curve["values"])
    # parallel coordinates: each sampled hparam, then the objective
    (parallel,) = traces(page, "chart-parallel")
    assert parallel["type"] == "parcoords" and parallel["dims"] == ["lr", "val_loss"]
    # importances: what the API says (bars once enough trials completed, else why not)
    importances = api(srv, f"/searches/{view['id']}/importances")
    if importances["importances"] is None:
        expect(page.get_by_test_id("chart-importances")).to_contain_text(
            f"once {importances['needed']} trials have completed"
        )
    else:
        assert traces(page, "chart-importances")[0]["y"] == list(importances["importances"])
    # the job list links each trial to its search
    page.goto(f"{srv.url}/#/jobs?state=")
    links = page.get_by_test_id("job-search")
    expect(links).to_have_count(4)
    links.first.click()
    expect(page).to_have_url(f"{srv.url}/#/searches/{view['id']}")
    pruned = next(t for t in view["trials"] if t["state"] == "PRUNED")
    page.goto(f"{srv.url}/#/jobs/{pruned['job_id']}")
    expect(page.get_by_test_id("job-search-link")).to_have_text(
        f"a trial of search {view['id']} (pruned)"
    )
    page.goto(f"{srv.url}/#/searches")
    expect(page.get_by_test_id("search-row")).to_have_count(1)
    # at 1000 px the list fits its card: no column runs off its right edge
    page.set_viewport_size({"width": 1000, "height": 800})
    wrap = page.get_by_test_id("searches-table").locator("xpath=..")
    assert wrap.evaluate("(el) => el.scrollWidth <= el.clientWidth"), wrap.evaluate(
        "(el) => [el.scrollWidth, el.clientWidth]"
    )
    page.set_viewport_size({"width": 1400, "height": 900})
    # a pruned trial's job (COMPLETED, stopped by the pruner) is PRUNED in the job list...
    page.goto(f"{srv.url}/#/jobs?state=")
    for trial in view["trials"]:
        row = page.locator(f'[data-testid="job-row"][data-job-id="{trial["job_id"]}"]')
        expect(row.get_by_test_id("state-badge")).to_have_text(trial["state"])
    # ... in ps ...
    listed = srv.cli("ps", "--all")
    assert listed.returncode == 0, listed.stderr
    shown = {line.split()[0]: line.split()[3] for line in listed.stdout.splitlines()[1:]}
    assert shown == {str(t["job_id"]): t["state"] for t in view["trials"]}, listed.stdout
    # ... and on the compare page, which "Compare these trials" opens with every trial's job
    page.goto(f"{srv.url}/#/searches/{view['id']}")
    expect(page.get_by_test_id("search-cancel")).to_be_hidden()  # it has ended
    link = page.get_by_test_id("search-compare")
    ids = ",".join(str(t["job_id"]) for t in view["trials"])
    expect(link).to_have_attribute("href", f"#/compare?ids={ids}")
    link.click()
    expect(page).to_have_url(f"{srv.url}/#/compare?ids={ids}")
    expect(page.locator(".page.compare .badge.state-pruned").first).to_have_text("PRUNED")
    # in the dark colour scheme its charts write in the page's light ink (dark grey on dark
    # was unreadable)
    page.goto("about:blank")  # away from compare's charts, then back in a fresh document
    page.emulate_media(color_scheme="dark")
    page.goto(f"{srv.url}/#/searches/{view['id']}")
    ink = page.evaluate("getComputedStyle(document.documentElement).getPropertyValue('--ink')")
    for chart in ("chart-best", "chart-curves", "chart-parallel"):
        traces(page, chart)
        color = page.get_by_test_id(chart).evaluate("(el) => el._fullLayout.font.color")
        assert color == ink.strip(), (chart, color, ink)
    # nothing running: `search list` says how to see it
    none = srv.cli("search", "list")
    assert none.stdout.strip() == "no searches running (--all shows ended ones)", none.stdout


# a trial that reports val_loss for 3 steps, then runs until it is canceled
HOLDER = REPORTER.replace("for step in range(8):", "for step in range(3):") + "\ntime.sleep(600)\n"
HELD_SPEC = """
name: held-search
entrypoint: python train.py
hparams:
  lr: {log_uniform: [1.0e-4, 1.0]}
  width: 8
search:
  method: random
  metric: val_loss
  max_trials: 4
  max_concurrent: 2
  seed: 3
"""


def wait_search(client: Client, search_id: int, done: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + 240
    while not done(view := client.search(search_id)):
        assert time.monotonic() < deadline, view
        time.sleep(0.3)
    return view


def tick(e: int) -> str:
    """A power of ten as the axis writes it: 0.001, 1, 100; 1e-5 beyond four places."""
    if abs(e) > 4:
        return f"1e{e}"
    return str(10**e) if e >= 0 else repr(10.0**e)


def test_the_search_page_cancels_and_plots_a_log_hparam_on_a_log_axis(
    tmp_path: Path, page: Page, browser: Browser
) -> None:
    """Auth on, every job visible to everyone: the admin's search shows its Cancel button to
    the admin only (a viewer and a member who does not own it see none)."""
    srv = start_server(
        tmp_path / "home",
        *("--cpus", "2", "--cancel-grace", "1", "--auth", "--job-visibility", "all"),
    )
    admin = srv.admin_token()
    client = Client(srv.url, token=admin)
    try:
        client.add_user("vera", "viewer")
        client.add_user("mo", "member")
        others = {
            "vera (viewer)": str(client.create_token(user="vera")["secret"]),
            "mo (member)": str(client.create_token(user="mo")["secret"]),
        }
        search_id = client.submit_search(write_job(tmp_path, HOLDER, HELD_SPEC))["id"]
        view = wait_search(
            client, search_id, lambda v: sum(t["steps_reported"] >= 3 for t in v["trials"]) >= 2
        )
        for who, token in others.items():
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            try:
                other = context.new_page()
                sign_in(other, srv, token, who)
                other.goto(f"{srv.url}/#/searches/{search_id}")
                expect(other.get_by_test_id("search-state")).to_have_text("RUNNING")
                expect(other.get_by_test_id("search-compare")).to_be_visible()
                expect(other.get_by_test_id("search-cancel")).to_be_hidden()
            finally:
                context.close()
        sign_in(page, srv, admin, "admin (admin)")
        page.goto(f"{srv.url}/#/searches/{search_id}")
        expect(page.get_by_test_id("search-state")).to_have_text("RUNNING")
        # the log_uniform hparam: log10 of each trial's value, ticks at the powers of ten
        page.wait_for_function(
            "() => { const el = document.querySelector('[data-testid=\"chart-parallel\"]');"
            " return !!(el && el.data && el.data.length); }"
        )
        dims = page.evaluate(
            """() => document.querySelector('[data-testid="chart-parallel"]').data[0].dimensions
              .map((d) => ({ label: d.label, values: d.values, tickvals: d.tickvals || null,
                             ticktext: d.ticktext || null }))"""
        )
        assert [d["label"] for d in dims] == ["lr (log)", "val_loss"], dims
        lrs = [t["params"]["lr"] for t in view["trials"] if t["latest"] is not None]
        assert dims[0]["values"] == pytest.approx([math.log10(v) for v in lrs])
        low, high = math.floor(min(dims[0]["values"])), math.ceil(max(dims[0]["values"]))
        assert dims[0]["tickvals"] == list(range(low, high + 1))
        assert dims[0]["ticktext"] == [tick(e) for e in dims[0]["tickvals"]]
        # Cancel, asked first: keeping it changes nothing, confirming cancels the search
        cancel = page.get_by_test_id("search-cancel")
        cancel.click()
        expect(page.get_by_test_id("search-cancel-dialog")).to_be_visible()
        page.get_by_test_id("search-cancel-abort").click()
        expect(page.get_by_test_id("search-cancel-dialog")).to_be_hidden()
        assert client.search(search_id)["state"] == "RUNNING"
        cancel.click()
        page.get_by_test_id("search-cancel-confirm").click()
        expect(page.get_by_test_id("search-state")).to_have_text("CANCELED", timeout=30000)
        expect(cancel).to_be_hidden()
        wait_search(client, search_id, lambda v: not v["trial_counts"].get("RUNNING"))
    finally:
        client.close()
        assert_clean_stop(srv)


# trials that report their objective once (one epoch): a curve of one point each
ONCE_SPEC = """
name: once-search
entrypoint: python train.py
hparams:
  lr: {choice: [0.01, 0.02]}
search:
  method: grid
  metric: val_loss
  max_trials: 2
  max_concurrent: 1
"""


def test_a_trial_that_reported_once_shows_as_a_dot(tmp_path: Path, page: Page) -> None:
    srv = start_server(tmp_path / "home", "--cpus", "2")
    try:
        spec = write_job(tmp_path, REPORTER.replace("range(8)", "range(1)"), ONCE_SPEC)
        search_id = srv.cli_json("submit", str(spec), "--detach")["search_id"]
        deadline = time.monotonic() + 240
        while api(srv, f"/searches/{search_id}")["state"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.3)
        page.goto(f"{srv.url}/#/searches/{search_id}")
        traces(page, "chart-curves")
        # each curve's one point has a marker to see (a line of one point draws nothing)
        drawn = page.get_by_test_id("chart-curves").evaluate(
            "(el) => el._fullData.map((t) => [t.x.length, [t.marker.size].flat()[0]])"
        )
        assert len(drawn) == 2 and all(n == 1 and size > 0 for n, size in drawn), drawn
    finally:
        assert_clean_stop(srv)
