"""What the dashboard's browser tests share: reading the API beside the page, the job list's
rows."""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import Page, expect

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
