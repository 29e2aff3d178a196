"""The dashboard's files: served at / and /static, plotly.js from the installed wheel, nothing
fetched from elsewhere."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.support.api import app_client
from trainhouse.lifecycle import TERMINAL, JobState
from trainhouse.server.routes.ui import (
    DOCS_FILES,
    DOCS_PACKAGE,
    GENERATED_FILES,
    PLOTLY_PATH,
    STATIC_FILES,
)

WEB = resources.files("trainhouse.server") / "web"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with app_client(tmp_path, tick=0.5) as client:
        yield client


def test_index_and_static_files(api: TestClient) -> None:
    index = api.get("/")
    assert index.status_code == 200
    assert index.headers["content-type"].startswith("text/html")
    assert '<script src="/static/vendor/plotly.min.js"' in index.text
    assert '<script type="module" src="/static/app.js"' in index.text
    for name in STATIC_FILES:
        resp = api.get(f"/static/{name}")
        assert resp.status_code == 200, name
        assert resp.content == (WEB / name).read_bytes()
    assert api.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert api.head("/").status_code == 200


def test_plotly_comes_from_the_installed_wheel_gzipped_and_cached(api: TestClient) -> None:
    original = (resources.files("plotly") / PLOTLY_PATH).read_bytes()
    resp = api.get("/static/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert resp.status_code == 200
    assert resp.headers["content-encoding"] == "gzip"
    assert resp.content == original  # httpx undid the gzip
    assert "max-age" in resp.headers["cache-control"]
    etag = resp.headers["etag"]
    again = api.get("/static/vendor/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    plain = api.get("/static/vendor/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == original
    assert len(gzip.compress(original)) < len(original) / 2


def test_the_api_reference_loads_nothing_from_elsewhere(api: TestClient) -> None:
    """/docs runs the Swagger UI the pinned fastapi-offline wheel ships, from this server: no
    CDN (a blank page offline, code nobody pinned), no validator badge, no favicon from
    elsewhere. ReDoc, whose page loads Redocly's logo from their CDN, is off."""
    page = api.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert sorted(sources) == [
        "/openapi.json",
        "/static/favicon.svg",
        "/static/vendor/swagger-ui-bundle.js",
        "/static/vendor/swagger-ui.css",
    ]
    assert "http" not in page.text.replace("http-equiv", "")
    assert '"validatorUrl": null' in page.text
    for name in DOCS_FILES:
        resp = api.get(f"/static/vendor/{name}", headers={"Accept-Encoding": "gzip"})
        assert resp.status_code == 200 and resp.headers["content-encoding"] == "gzip", name
        assert resp.content == (resources.files(DOCS_PACKAGE) / "static" / name).read_bytes()
    assert api.get("/redoc").status_code == 404


def test_only_the_dashboards_own_files_are_served(api: TestClient) -> None:
    for path in (
        "/static/index.html.bak",
        "/static/..%2F..%2Fstore%2Fstore.py",
        "/static/../routes/ui.py",
        "/static/vendor/other.js",
        "/static/vendor/redoc.standalone.js",
        "/static/vendor/../web/app.js",
        "/static/vendor/favicon.png",
    ):
        resp = api.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["code"] == "not_found"


def test_the_api_and_its_docs_stay_where_they_were(api: TestClient) -> None:
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert "/api/v1/jobs" in paths
    assert not [p for p in paths if p == "/" or p.startswith("/static")]  # not in the API
    metrics = api.get("/metrics")  # the Prometheus exposition's, not the dashboard's
    assert "text/html" not in metrics.headers.get("content-type", "")


def test_no_code_or_fonts_from_elsewhere() -> None:
    """The page works offline: no CDN, every script and style is served by trainhouse."""
    for name in ("index.html", *STATIC_FILES):
        text = (WEB / name).read_text()
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", text), name
        assert "@import" not in text and "url(http" not in text, name
    assert not (WEB / "vendor").is_dir()  # plotly.js is never copied into the repository


def test_every_module_the_page_imports_is_served() -> None:
    on_disk = {p.name for p in WEB.iterdir() if p.name != "index.html"}
    assert on_disk == set(STATIC_FILES)  # a new file needs its place in the list
    for name in STATIC_FILES:
        if name.endswith(".js"):
            for target in re.findall(r"""\bfrom\s+["']([^"']+)["']""", (WEB / name).read_text()):
                served = (*STATIC_FILES, *GENERATED_FILES)
                assert target.startswith("./") and target[2:] in served, (name, target)


def test_the_dashboard_reads_the_job_states_from_the_lifecycle(api: TestClient) -> None:
    """The terminal set is spelled once, in trainhouse.lifecycle: the page's module is made
    from it, so a new state reaches the dashboard without editing JavaScript."""
    resp = api.get("/static/lifecycle.js")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/javascript")
    states = re.search(r"export const STATES = (\[.*\]);", resp.text)
    terminal = re.search(r"export const TERMINAL = new Set\((\[.*\])\);", resp.text)
    assert states and terminal
    assert json.loads(states.group(1)) == [str(s) for s in JobState]
    assert set(json.loads(terminal.group(1))) == {str(s) for s in TERMINAL}
    core = (WEB / "core.js").read_text()
    assert '"COMPLETED"' not in core and "./lifecycle.js" in core
