"""What the dashboard's browser tests share: reading the API beside the page, the job list's
rows."""

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
    """The traces plotly keeps on the chart element: [{x: [...], y: [...], name}, ...]."""
    data: list[dict[str, Any]] = page.evaluate(
        """(id) => {
            const el = document.querySelector(`[data-testid="${id}"]`);
            return el && el.data ? el.data.map((t) => ({x: t.x, y: t.y, name: t.name})) : [];
        }""",
        testid,
    )
    return data
