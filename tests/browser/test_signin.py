"""The dashboard on a server with auth on, in real Chromium: it asks for a token, keeps the
session in an HttpOnly cookie, shows a member their own jobs only, and signs out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.core.wire import CLIENT_HEADERS

pytestmark = pytest.mark.browser

SPEC = "name: {name}\nentrypoint: python train.py\n"


@pytest.fixture
def team_server(tmp_path: Path) -> Iterator[Server]:
    """Auth on, and no CPU for anyone: jobs wait in the queue, nothing runs."""
    srv = start_server(tmp_path / "home", "--cpus", "2", "--quota-cpus", "0", "--auth")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def submit_as(srv: Server, token: str, name: str, tmp_path: Path) -> int:
    from trainhouse.jobfs.workdir import pack

    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    resp = httpx.post(
        f"{srv.url}/api/v1/jobs",
        data={"spec": SPEC.format(name=name)},
        files={"workdir": ("w.tar.gz", pack(src).data, "application/gzip")},
        headers={"Authorization": f"Bearer {token}", **CLIENT_HEADERS},
        timeout=60,
    )
    assert resp.status_code == 201, resp.text
    return int(resp.json()["id"])


def test_the_dashboard_signs_in_and_shows_only_my_jobs(
    team_server: Server, page: Page, tmp_path: Path
) -> None:
    srv = team_server
    root = srv.admin_token()
    tokens = {}
    with httpx.Client(
        base_url=f"{srv.url}/api/v1", headers={"Authorization": f"Bearer {root}", **CLIENT_HEADERS}
    ) as c:
        for name in ("alice", "bob"):
            assert c.post("/users", json={"name": name}).status_code == 201
            tokens[name] = c.post("/tokens", json={"user": name}).json()["secret"]
    alices = submit_as(srv, tokens["alice"], "alices-run", tmp_path)
    bobs = submit_as(srv, tokens["bob"], "bobs-run", tmp_path)

    page.goto(srv.url + "/")
    expect(page.get_by_test_id("signin")).to_be_visible()
    page.get_by_test_id("signin-token").fill("thu_wrong")
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("signin-error")).to_contain_text("refused")

    page.get_by_test_id("signin-token").fill(tokens["alice"])
    page.get_by_test_id("signin-submit").click()
    expect(page.get_by_test_id("user")).to_contain_text("alice (member)")
    view = page.get_by_test_id("view")
    expect(view).to_contain_text("alices-run")
    expect(view).not_to_contain_text("bobs-run")
    # the token is in an HttpOnly cookie: page scripts cannot read it
    assert tokens["alice"] not in page.evaluate("document.cookie")
    cookies = page.context.cookies()
    assert any(c["httpOnly"] and c["value"] == tokens["alice"] for c in cookies)

    page.goto(f"{srv.url}/#/jobs/{bobs}")
    expect(page.get_by_test_id("not-found")).to_contain_text("belongs to another user")
    expect(view).not_to_contain_text("bobs-run")

    page.goto(f"{srv.url}/#/jobs/{alices}")
    page.get_by_test_id("cancel-button").click()
    page.get_by_test_id("cancel-confirm").click()  # a cookie write: needs the CSRF header
    expect(page.get_by_test_id("job-state")).to_contain_text("CANCELED")

    page.get_by_test_id("signout").click()
    expect(page.get_by_test_id("signin")).to_be_visible()
    assert httpx.get(f"{srv.url}/api/v1/jobs", timeout=30).status_code == 401
