"""What the dashboard's browser tests share: reading the API beside the page, the job list's
rows, the traces a chart holds, and how readable a text is (its contrast)."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import Locator, Page, expect

from tests.support.servers import Server


def api(server: Server, path: str, **params: Any) -> Any:
    resp = httpx.get(f"{server.url}/api/v1{path}", params=params, timeout=30)
    resp.raise_for_status()
    return resp.json()


def row_ids(page: Page) -> list[int]:
    ids: list[str] = page.get_by_test_id("job-row").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.jobId)"
    )
    return [int(i) for i in ids]


def sign_in(page: Page, srv: Server, token: str, who: str) -> None:
    """Sign in on the dashboard's own form with ``token``; ``who`` is what the page then shows
    of its user ("admin (admin)")."""
    page.goto(srv.url + "/")
    page.get_by_test_id("signin-token").fill(token)
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("user")).to_contain_text(who)


# each label of a <dl> and whether its value sits on its row, to its right
PAIRED = """(dl) => [...dl.querySelectorAll(':scope > dt')].map((dt) => {
    const dd = dt.nextElementSibling, a = dt.getBoundingClientRect();
    const b = dd.getBoundingClientRect();
    return [dt.innerText, a.top < b.bottom && b.top < a.bottom && b.left >= a.right];
})"""


def labels_beside_values(dl: Locator) -> None:
    """Every label of ``dl`` has its own value beside it (not the next label's)."""
    pairs: list[tuple[str, bool]] = dl.evaluate(PAIRED)
    assert pairs and all(ok for _label, ok in pairs), pairs


def chart_data(page: Page, testid: str) -> list[dict[str, Any]]:
    """The traces plotly keeps on the chart element: [{x: [...], y: [...], name, text}, ...]
    (``text``: the hover texts, as plotly holds them, escaped; None for a trace without)."""
    data: list[dict[str, Any]] = page.evaluate(
        """(id) => {
            const el = document.querySelector(`[data-testid="${id}"]`);
            return el && el.data
                ? el.data.map((t) => ({x: t.x, y: t.y, name: t.name, text: t.text ?? null}))
                : [];
        }""",
        testid,
    )
    return data


# the WCAG contrast ratio of an element's text (an SVG text's fill: a chart's) against the first
# opaque background below it
CONTRAST = """(el) => {
    const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
    const lum = ([r, g, b]) => {
        const c = [r, g, b].map((v) => {
            v /= 255;
            return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
        });
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    };
    let bg = null;
    for (let e = el; e && !bg; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c.length === 3 || (c.length === 4 && c[3] > 0.9)) bg = c;
    }
    const style = getComputedStyle(el);
    const fg = lum(rgb(el instanceof SVGElement ? style.fill : style.color));
    const back = lum(bg || [255, 255, 255]);
    return (Math.max(fg, back) + 0.05) / (Math.min(fg, back) + 0.05);
}"""


def contrast(locator: Locator) -> float:
    """WCAG's contrast ratio of the element's text on its background (4.5 is body text's
    least)."""
    ratio: float = locator.evaluate(CONTRAST)
    return ratio
