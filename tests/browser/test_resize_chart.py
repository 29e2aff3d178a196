"""An elastic job's page shows its resizes, in real Chromium against a real server (4 CPU
cores) and one real elastic job: it starts at 4 ranks, shrinks to 2 at a checkpoint for a
high-priority job, and grows back to 4 when that one has ended (issue 30's dashboard part).

- the world-size chart holds a step line at 4, 2, 4 ranks, a marker at each resize's time with
  its reason on hover, and a "4→2" / "2→4" mark there;
- the attempts table gives each attempt's ranks and reads "resized"; the summary says
  "4 ranks (2:4)";
- a job of one fixed size has no such card;
- in the dark colour scheme the card's texts (the chart's too) stay readable, and at 1000 px it
  fits its card, the summary's labels beside their values.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.dashboard import api, chart_data, contrast, labels_beside_values
from tests.support.jobs import shrink_and_grow_back
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("resize-chart")]  # one job, resized

CHART = "world-size-chart"
# the card scrolls nothing sideways and its chart ends within it (plotly redraws on a resize)
FITS = """(card) => {
    const svg = card.querySelector(".main-svg").getBoundingClientRect();
    const box = card.getBoundingClientRect();
    const wide = svg.width > box.width / 2;
    return card.scrollWidth <= card.clientWidth && svg.right <= box.right && wide;
}"""


@dataclass
class Resized:
    srv: Server
    job: dict[str, Any]  # the elastic job, ended
    high: dict[str, Any]  # the high-priority job it shrank for, ended


@pytest.fixture(scope="module")
def resized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Resized]:
    """One elastic job run on a real server: 4 ranks, 2 beside a high-priority job, 4 again."""
    root = tmp_path_factory.mktemp("resize-chart")
    srv = start_server(root / "home", "--cpus", "4")
    try:
        run = shrink_and_grow_back(srv, root)
        job, final, high_final = run.job, run.job, run.high
        assert high_final["state"] == "COMPLETED", high_final
        assert final["state"] == "COMPLETED", final
        results = [a["result"] for a in final["attempt_history"]]
        assert results == ["resized", "resized", "completed"], final["attempt_history"]
        yield Resized(srv, api(srv, f"/jobs/{job['id']}"), high_final)
    finally:
        assert_clean_stop(srv)


def open_job(page: Page, srv: Server, job_id: int) -> None:
    page.goto(f"{srv.url}/#/jobs/{job_id}")
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")


def wait_chart(page: Page) -> None:
    page.wait_for_function(
        "(id) => { const el = document.querySelector(`[data-testid='${id}']`);"
        " return el && el.data && el.data.length === 2; }",
        arg=CHART,
    )


def sizes(ys: list[int | None]) -> list[int]:
    """The sizes a step line runs at, in order (gaps and repeats left out)."""
    out: list[int] = []
    for y in ys:
        if y is not None and (not out or out[-1] != y):
            out.append(y)
    return out


def test_the_chart_and_the_attempts_show_each_resize_and_why(resized: Resized, page: Page) -> None:
    job, high = resized.job, resized.high
    attempts = job["attempt_history"]
    open_job(page, resized.srv, job["id"])
    expect(page.get_by_test_id("world-size-section")).to_be_visible()
    wait_chart(page)
    ranks, marks = chart_data(page, CHART)
    assert ranks["name"] == "ranks" and sizes(ranks["y"]) == [4, 2, 4], ranks
    # each attempt from its start to its end, a gap between them
    starts = [x for i, x in enumerate(ranks["x"]) if x is not None and i % 3 == 0]
    assert starts == [a["started_at"] * 1000 for a in attempts]
    # a marker at each resize's time, its reason on hover
    assert marks["name"] == "resizes"
    assert marks["x"] == [a["ended_at"] * 1000 for a in attempts[:2]]
    reasons = [html.unescape(t) for t in marks["text"]]
    assert reasons == [
        f"resized 4→2: shrunk 4->2: job {high['id']} (high) needed 2 CPU cores",
        "resized 2→4: grew 2->4: 2 CPU cores freed",
    ]
    labels = page.get_by_test_id(CHART).evaluate(
        "(el) => el.layout.annotations.map((a) => [a.x, a.text])"
    )
    assert labels == [
        [attempts[0]["ended_at"] * 1000, "4→2"],
        [attempts[1]["ended_at"] * 1000, "2→4"],
    ]
    expect(page.get_by_test_id("world-size-note")).to_have_text(
        "Elastic: 2 to 4 ranks. Resized 2 times: hover a ◆ for the reason."
    )

    # the pointer on a marker shows its reason
    chart = page.get_by_test_id(CHART)
    chart.scroll_into_view_if_needed()
    at = chart.locator(".scatterlayer .trace").nth(1).locator(".point").first.bounding_box()
    assert at is not None
    page.mouse.move(at["x"] + at["width"] / 2, at["y"] + at["height"] / 2)
    expect(chart.locator(".hoverlayer")).to_contain_text(f"job {high['id']} (high) needed")

    # the attempts table: each attempt's ranks, "resized" in words
    expect(page.get_by_test_id("attempt-ranks")).to_have_text(["4", "2", "4"])
    expect(page.get_by_test_id("attempt-result")).to_have_text(["resized", "resized", "completed"])
    expect(page.get_by_test_id("attempt-exit").first).to_have_text("resized; ranks exited cleanly")
    # the summary: the ranks it ran at last, and its range
    expect(page.get_by_test_id("job-resources")).to_have_text(
        "4 ranks (2:4) on 1 node, CPU only, 1 CPU/rank"
    )

    # a job of one fixed size, run once: no world-size card at all
    open_job(page, resized.srv, high["id"])
    expect(page.get_by_test_id("job-resources")).to_have_text(
        "1 node \N{MULTIPLICATION SIGN} 2 ranks, CPU only, 1 CPU/rank"
    )
    expect(page.get_by_test_id("world-size-section")).to_be_hidden()
    expect(page.get_by_test_id("attempt-ranks")).to_have_text(["2"])


def test_the_size_card_reads_in_the_dark_and_fits_a_narrow_window(
    resized: Resized, page: Page
) -> None:
    page.emulate_media(color_scheme="dark")
    open_job(page, resized.srv, resized.job["id"])
    wait_chart(page)
    card = page.get_by_test_id("world-size-section")
    texts = [card.locator("h2"), page.get_by_test_id("world-size-note")]
    chart = page.get_by_test_id(CHART)
    # the chart's own texts: its title, the axes' ticks and title, the resize marks' labels
    texts += [chart.locator("text.gtitle"), chart.locator(".ytitle")]
    texts += [chart.locator(".ytick text").first, chart.locator(".xtick text").first]
    texts += chart.locator(".annotation-text").all()
    assert len(texts) == 8
    for text in texts:
        assert contrast(text) >= 4.5, (text.text_content(), contrast(text))

    # at 1000 px the chart takes the card's width, and no more
    page.set_viewport_size({"width": 1000, "height": 800})
    page.wait_for_function(FITS, arg=card.element_handle())
    labels_beside_values(page.get_by_test_id("job-summary"))
