"""The web dashboard: ``/`` is a single page (``server/web``) that reads the REST API; and the
API's reference, ``/docs`` (Swagger UI).

The dashboard's chart code is the plotly.js that the ``plotly`` wheel ships, served from the
installed package at ``/static/vendor/plotly.min.js``; the reference's code is the Swagger UI
bundle that the ``fastapi-offline`` wheel ships (a pinned dependency), served the same way
under ``/static/vendor/``. Nothing of either is copied into this repository, and no page loads
anything from elsewhere: they work offline. (FastAPI's ``/redoc`` is off: ReDoc's page loads
its logo from Redocly's CDN, whatever its code's origin.)
``/static/lifecycle.js`` is made from :mod:`trainhouse.core.lifecycle`: the job states and the
terminal set, spelled once, in Python.
Responses carry an ETag (a revisit costs a 304) and the bundles are gzipped once, on their
first request, for clients that accept it. Neither page may be framed by another site
(:data:`NO_FRAMING`).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from trainhouse.core.errors import NotFound
from trainhouse.core.lifecycle import TERMINAL, JobState

router = APIRouter(include_in_schema=False)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# what /static serves from the package's web directory: a fixed list, so no path can escape it
STATIC_FILES = (
    "app.js",
    "core.js",
    "charts.js",
    "logs.js",
    "jobs.js",
    "job.js",
    "sizes.js",
    "media.js",
    "compare.js",
    "comparetable.js",
    "runs.js",
    "runactions.js",
    "cluster.js",
    "search.js",
    "models.js",
    "modelactions.js",
    "services.js",
    "datasets.js",
    "flows.js",
    "artifacts.js",
    "style.css",
    "favicon.svg",
)
PLOTLY_PATH = "package_data/plotly.min.js"
# the API reference's code, from the fastapi-offline wheel: /static/vendor/NAME
DOCS_PACKAGE = "fastapi_offline"
DOCS_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")
# modules the server makes rather than reads from the package's web directory
GENERATED_FILES = ("lifecycle.js",)


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    etag: str
    media_type: str


def _asset(body: bytes, media_type: str, *, compress: bool) -> Asset:
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    packed = gzip.compress(body, compresslevel=6, mtime=0) if compress else None
    return Asset(body, packed, etag, media_type)


@cache
def _web_file(name: str) -> Asset:
    path = resources.files("trainhouse.server") / "web" / name
    if not path.is_file():
        raise NotFound(f"the dashboard file {name!r} is missing from this installation")
    suffix = name[name.rfind(".") :]
    return _asset(path.read_bytes(), _TYPES[suffix], compress=suffix != ".svg")


@cache
def _lifecycle() -> Asset:
    states = json.dumps([str(s) for s in JobState])
    terminal = json.dumps([str(s) for s in JobState if s in TERMINAL])
    body = (
        "// Made by the server from trainhouse.core.lifecycle: the job states and the terminal "
        "set.\n"
        f"export const STATES = {states};\n"
        f"export const TERMINAL = new Set({terminal});\n"
    ).encode()
    return _asset(body, _TYPES[".js"], compress=True)


@cache
def _vendor(package: str, member: str) -> Asset:
    """A file an installed wheel ships (``package``'s ``member``)."""
    path = resources.files(package) / member
    if not path.is_file():
        version = importlib.metadata.version(package)
        raise NotFound(f"{package} {version} does not ship {member}; reinstall {package}")
    return _asset(path.read_bytes(), _TYPES[member[member.rfind(".") :]], compress=True)


def _send(request: Request, asset: Asset, cache_control: str) -> Response:
    headers = {"ETag": asset.etag, "Cache-Control": cache_control, "Vary": "Accept-Encoding"}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    if asset.gzipped is not None and "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


# our own files change with an upgrade: revalidate each time (a 304 when unchanged)
_REVALIDATE = "no-cache"
# the vendored bundles change only with the installed wheels: a day without asking, then a 304
_DAY = "public, max-age=86400"
_VENDOR = "/static/vendor"


#: the dashboard's and the reference's pages are never shown in another site's frame, where a
#: decoy would have their visitor click "delete", "Yes" (clickjacking)
NO_FRAMING = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}


@router.api_route("/", methods=["GET", "HEAD"])
def index(request: Request) -> Response:
    response = _send(request, _web_file("index.html"), _REVALIDATE)
    response.headers.update(NO_FRAMING)
    return response


@router.api_route("/static/vendor/plotly.min.js", methods=["GET", "HEAD"])
def plotly_js(request: Request) -> Response:
    return _send(request, _vendor("plotly", PLOTLY_PATH), _DAY)


@router.api_route("/static/vendor/{name}", methods=["GET", "HEAD"])
def docs_vendor(name: str, request: Request) -> Response:
    if name not in DOCS_FILES:
        raise NotFound(f"no static file 'vendor/{name}'")
    return _send(request, _vendor(DOCS_PACKAGE, f"static/{name}"), _DAY)


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    """The API reference, Swagger UI: its code from this server, no validator badge (it would
    send the API's description to validator.swagger.io)."""
    root = request.scope.get("root_path", "")
    response = get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title="trainhouse API",
        swagger_js_url=f"{root}{_VENDOR}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{_VENDOR}/swagger-ui.css",
        swagger_favicon_url=f"{root}/static/favicon.svg",
        swagger_ui_parameters={"validatorUrl": None},
    )
    response.headers.update(NO_FRAMING)  # its "Try it out" sends writes
    return response


@router.api_route("/static/lifecycle.js", methods=["GET", "HEAD"])
def lifecycle_js(request: Request) -> Response:
    return _send(request, _lifecycle(), _REVALIDATE)


@router.api_route("/static/{name}", methods=["GET", "HEAD"])
def static(name: str, request: Request) -> Response:
    if name not in STATIC_FILES:
        raise NotFound(f"no static file {name!r}")
    return _send(request, _web_file(name), _REVALIDATE)
