"""The API reference (``/docs``, Swagger UI) in real Chromium, offline: every request the page
makes goes to the server itself (any other is cut off and counted), and the page lists the
API's operations."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect

from tests.support.servers import Server

pytestmark = pytest.mark.browser


def offline(page: Page, server: Server) -> list[str]:
    """Cut the page off from everything but the server; the list fills with what it tried."""
    elsewhere: list[str] = []
    own = urlsplit(server.url).netloc

    def route(r: Route) -> None:
        if urlsplit(r.request.url).netloc == own:
            r.continue_()
        else:
            elsewhere.append(r.request.url)
            r.abort("internetdisconnected")

    page.context.route("**/*", route)
    return elsewhere


def test_swagger_ui_renders_offline(server: Server, page: Page) -> None:
    elsewhere = offline(page, server)
    page.goto(server.url + "/docs")
    submit = page.locator("#operations-jobs-submit_api_v1_jobs_post")
    expect(submit).to_be_visible()
    expect(submit).to_contain_text("/api/v1/jobs")
    assert page.locator(".opblock").count() > 20  # every operation
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("trainhouse")
    assert elsewhere == []
