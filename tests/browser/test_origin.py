"""Another site's page against a real default server (auth off on 127.0.0.1), in real Chromium:
what a page can send without asking (a multipart ``no-cors`` POST, a JSON body as
``text/plain``, a form) is refused, what needs asking (a JSON ``cors`` POST with the client's
header) is never sent, and a name pointed at the server (DNS rebinding) gets no answer.

The pages of "another site" are served by a small HTTP server on another port of 127.0.0.1 (the
same site, another origin: Chromium says ``Sec-Fetch-Site: same-site``) or on 127.0.0.2 (another
site: ``cross-site``). A second such server, the recorder, keeps what reaches it: the page
sends it the same submission first, so a test that finds no job knows the browser did send
the request (and the refusal is the server's, not the browser's).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page

from tests.support.servers import Server
from trainhouse.jobfs.workdir import pack

pytestmark = pytest.mark.browser

ATTACK = """<!doctype html>
<title>a page of another site</title>
<script>
const TARGET = %(target)s;
const RECORDER = %(recorder)s;
const ARCHIVE = Uint8Array.from(atob(%(archive)s), (c) => c.charCodeAt(0));
const SPEC = %(spec)s;

function form() {
  const fd = new FormData();
  fd.append("spec", SPEC);
  fd.append("workdir", new Blob([ARCHIVE], { type: "application/gzip" }), "w.tar.gz");
  return fd;
}

async function attack() {
  const outcome = {};
  const tryIt = async (name, url, init) => {
    try {
      const resp = await fetch(url, init);
      outcome[name] = resp.type;  // "opaque": sent, the answer hidden from the page
    } catch (err) {
      outcome[name] = "blocked: " + err.message;
    }
  };
  // the control: the same submission to the recorder, another origin too
  const post = () => ({ method: "POST", mode: "no-cors", body: form() });
  await tryIt("recorder", RECORDER + "/api/v1/jobs", post());
  // a multipart job submission: a "simple" request, sent without asking the server
  await tryIt("multipart", TARGET + "/api/v1/jobs", post());
  // JSON as text/plain: simple too
  await tryIt("json-text", TARGET + "/api/v1/users", {
    method: "POST", mode: "no-cors", headers: { "Content-Type": "text/plain" },
    body: JSON.stringify({ name: "mallory", role: "admin" }),
  });
  // JSON with the clients' header: the browser asks first (a preflight), and is told nothing
  await tryIt("json-cors", TARGET + "/api/v1/users", {
    method: "POST", mode: "cors",
    headers: { "Content-Type": "application/json", "X-Trainhouse-Request": "1" },
    body: JSON.stringify({ name: "mallory", role: "admin" }),
  });
  // no-cors drops the header: the request goes, without it
  await tryIt("header-dropped", TARGET + "/api/v1/jobs", {
    method: "POST", mode: "no-cors", headers: { "X-Trainhouse-Request": "1" }, body: form(),
  });
  return outcome;
}
</script>
<form id="classic" method="POST" action="%(form_action)s" target="sink" enctype="text/plain">
  <input name='{"name": "mallory-form", "role": "admin", "x": "' value='"}'>
</form>
<iframe name="sink"></iframe>
"""

SPEC = "name: from-another-site\nentrypoint: python -c \"open('{marker}', 'w').write('ran')\"\n"


class Site:
    """An HTTP server on ``host``: GET / serves ``page``; every POST is kept in ``posts``."""

    def __init__(self, host: str) -> None:
        self.page = b""
        self.posts: list[tuple[str, bytes]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(200, site.page, "text/html")

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                site.posts.append((self.path, self.rfile.read(size)))
                self._answer(200, b"{}", "application/json")

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(params=["127.0.0.1", "127.0.0.2"], ids=["same-site", "cross-site"])
def sites(request: pytest.FixtureRequest) -> Iterator[tuple[Site, Site]]:
    """The attacker's site and the recorder, on ``127.0.0.1`` (another port) or 127.0.0.2."""
    attacker, recorder = Site(request.param), Site(request.param)
    try:
        yield attacker, recorder
    finally:
        attacker.close()
        recorder.close()


def test_a_page_of_another_site_submits_no_job(
    server: Server, browser: Browser, page: Page, sites: tuple[Site, Site], tmp_path: Path
) -> None:
    import base64

    attacker, recorder = sites
    marker = tmp_path / "pwned"
    src = tmp_path / "wd"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    attacker.page = (
        ATTACK
        % {
            "target": json.dumps(server.url),
            "recorder": json.dumps(recorder.url),
            "archive": json.dumps(base64.b64encode(pack(src).data).decode()),
            "spec": json.dumps(SPEC.format(marker=marker)),
            "form_action": f"{server.url}/api/v1/users",
        }
    ).encode()

    # the attacker's page has a context of its own: the refusals it meets log errors there
    context = browser.new_context()
    try:
        evil = context.new_page()
        evil.goto(attacker.url + "/")
        outcome = evil.evaluate("attack()")
        with evil.expect_event("framenavigated"):
            evil.evaluate("document.getElementById('classic').submit()")
    finally:
        context.close()

    # the browser sent the submission (the recorder has it) and the server refused it
    assert [path for path, _ in recorder.posts] == ["/api/v1/jobs"]
    assert b"from-another-site" in recorder.posts[0][1]
    assert outcome["multipart"] == outcome["json-text"] == outcome["header-dropped"] == "opaque"
    assert outcome["json-cors"].startswith("blocked")  # the preflight was not granted
    with server.client as c:
        assert c.jobs(all=True) == []
        assert not [u for u in c.users() if u["name"].startswith("mallory")]
    assert not marker.exists()

    # a page of the server itself writes without the header (Sec-Fetch-Site: same-origin)
    page.goto(server.url + "/")
    status = page.evaluate(
        """() => fetch("/api/v1/users", {method: "POST", body: JSON.stringify({name: "dave"}),
                                          headers: {"Content-Type": "application/json"}})
                 .then((r) => r.status)"""
    )
    assert status == 201
    # so does trainhouse's client (the header); a bare HTTP client shows neither
    with server.client as c:
        assert c.add_user("carol")["name"] == "carol"
    bare = httpx.post(f"{server.url}/api/v1/users", json={"name": "erin"}, timeout=30)
    assert bare.status_code == 403 and bare.json()["error"]["code"] == "cross_origin"


@pytest.fixture
def browser_args() -> list[str]:
    """This module's Chromium resolves ``attacker.example`` to 127.0.0.1: where a DNS
    rebinding attack stands once the page has loaded."""
    return ["--host-resolver-rules=MAP attacker.example 127.0.0.1"]


def test_a_name_pointed_at_the_server_gets_no_answer(server: Server, page: Page) -> None:
    port = server.port
    for path in ("/", "/api/v1/jobs", "/docs"):
        resp = page.goto(f"http://attacker.example:{port}{path}")
        assert resp is not None and resp.status == 400, path
        assert "does not answer to the host 'attacker.example'" in page.content()
    resp = page.goto(f"http://localhost:{port}/api/v1/health")
    assert resp is not None and resp.status == 200
    # and outside a browser, to the server's own address
    resp = httpx.get(f"{server.url}/api/v1/jobs", headers={"Host": "attacker.example"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "unknown_host"


def test_a_page_of_another_site_cannot_frame_the_dashboard(
    server: Server, browser: Browser, page: Page, sites: tuple[Site, Site]
) -> None:
    """Clickjacking: another site's page that frames the dashboard (under a decoy, to have its
    visitor click a runs table row's "delete" and then "Yes") gets an empty frame; the server's
    own pages are unaffected."""
    attacker, _ = sites
    attacker.page = (
        f'<!doctype html><title>decoy</title><iframe id="dash" src="{server.url}/#/jobs" '
        'width="1200" height="800"></iframe>'
    ).encode()
    context = browser.new_context()
    try:
        evil = context.new_page()
        evil.goto(attacker.url + "/", wait_until="load")  # its frame has loaded too
        assert len(evil.frames) == 2
        assert evil.frame_locator("#dash").locator("header.top").count() == 0  # not drawn
    finally:
        context.close()
    page.goto(server.url + "/#/jobs")  # the dashboard itself
    assert page.locator("header.top").count() == 1
