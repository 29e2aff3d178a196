"""trainhouse.server.origin: writes from another origin's page are refused (a default server
runs no job a web page sent it), and so are requests for a host the server does not answer to
(DNS rebinding); trainhouse's own clients, the server's own pages and reads go through.

Browser-made requests are written out with the headers Chromium sends (``Origin``,
``Sec-Fetch-Site``, no ``X-Trainhouse-Request``: a page of another origin cannot add it);
tests/browser/test_origin.py does the same from a real page of another origin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from tests.support.api import (
    CROSS_SITE,
    app_client,
    cross_origin,
    error_of,
    fake_executor,
    in_process,
    page_request,
    workdir,
)
from tests.support.team import Team, make_team
from trainhouse.server import Settings, create_app
from trainhouse.server.origin import Hosts, OriginGuard, host_of, origin_of

SPEC = "name: from-a-page\nentrypoint: python -c \"open('/tmp/pwned', 'w')\"\n"
# a page on another port of the same machine: the same site, another origin
SAME_SITE = {"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"}
SAME_ORIGIN = {"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    """The embedded default: auth off on 127.0.0.1; the request's Host is 127.0.0.1."""
    with app_client(tmp_path) as client:
        yield client


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path)


def submit_from_page(api: TestClient, tmp_path: Path, headers: dict[str, str]) -> Any:
    """The multipart job submission a page can send without a preflight."""
    return page_request(
        api,
        "POST",
        "/api/v1/jobs",
        data={"spec": SPEC},
        files={"workdir": ("w.tar.gz", workdir(tmp_path), "application/gzip")},
        headers=headers,
    )


def jobs(api: TestClient) -> int:
    total: int = api.get("/api/v1/jobs", params={"all": "true"}).json()["total"]
    return total


# -- another origin's page ------------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        CROSS_SITE,
        SAME_SITE,
        {"Sec-Fetch-Site": "cross-site"},  # no Origin at all
        {"Origin": "http://evil.example"},  # a browser without Sec-Fetch-Site
        {"Origin": "null"},  # a sandboxed frame, a data: URL
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},  # they disagree
        {"Origin": "https://127.0.0.1", "Sec-Fetch-Site": "same-origin"},  # another scheme
        {"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-origin"},  # another port
        {},  # nothing shows where it came from
        {**CROSS_SITE, "X-Trainhouse-Request": "0"},
    ],
    ids=[
        "cross-site",
        "same-site",
        "no-origin",
        "origin-only",
        "null-origin",
        "disagree",
        "scheme",
        "port",
        "nothing",
        "header-0",
    ],
)
def test_a_page_of_another_origin_submits_no_job(
    api: TestClient, tmp_path: Path, headers: dict[str, str]
) -> None:
    message = cross_origin(submit_from_page(api, tmp_path, headers))
    assert message.startswith("POST /api/v1/jobs refused:")
    assert jobs(api) == 0


def test_every_write_is_guarded_not_only_submit(api: TestClient, tmp_path: Path) -> None:
    job = api.post(
        "/api/v1/jobs",
        data={"spec": "name: parked\nentrypoint: python train.py\n"},
        files={"workdir": ("w.tar.gz", workdir(tmp_path), "application/gzip")},
    ).json()["id"]
    for method, path, body in (
        ("POST", f"/api/v1/jobs/{job}/cancel", None),
        ("POST", f"/api/v1/jobs/{job}/priority", {"priority": "high"}),
        ("PUT", "/api/v1/quotas/someone", {"max_cpus": 1}),
        ("DELETE", "/api/v1/session", None),
        ("PATCH", "/api/v1/users/someone", {"role": "admin"}),
        ("POST", f"/api/v1/jobs/{job}/report", {"batch_id": "b", "attempt": 1, "points": []}),
    ):
        cross_origin(page_request(api, method, path, json=body, headers=CROSS_SITE))
    assert api.get(f"/api/v1/jobs/{job}").json()["cancel_requested"] is False


def test_a_cors_preflight_is_never_granted(api: TestClient) -> None:
    """The custom header proves a request is no cross-origin one because the browser must
    ask first, and the answer never allows it."""
    resp = page_request(
        api,
        "OPTIONS",
        "/api/v1/jobs",
        headers={
            **CROSS_SITE,
            "Sec-Fetch-Mode": "cors",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-trainhouse-request",
        },
    )
    assert not [h for h in resp.headers if h.lower().startswith("access-control-")]


def test_a_token_does_not_replace_the_header(team: Team) -> None:
    """Auth on: a browser may attach credentials by itself (a proxy's basic auth, the
    dashboard's cookie); neither lets another origin's page write."""
    resp = page_request(
        team.api,
        "POST",
        "/api/v1/jobs",
        data={"spec": "name: x\nentrypoint: python train.py\n"},
        files={"workdir": ("w.tar.gz", team.archive, "application/gzip")},
        headers={**CROSS_SITE, **team.h("root")},
    )
    cross_origin(resp)
    assert team.api.post("/api/v1/session", json={"token": team.tokens["root"]}).is_success
    cookie_write = page_request(
        team.api, "PUT", "/api/v1/quotas/bob", json={"max_cpus": 9}, headers=SAME_SITE
    )
    cross_origin(cookie_write)
    assert team.rt.store.quotas.limits()["bob"].max_cpus == 0
    assert team.rt.store.jobs.count() == 0


def test_an_inference_client_predicts_with_its_token_but_no_browser_may(team: Team) -> None:
    """Predictions: a bearer token without a browser's sign is an inference client (curl,
    requests) and passes the guard (here to the 404 of a service there is not); the same
    request with a page's headers is refused, token or not, and a token opens no other write."""
    path = "/api/v1/services/nothing/predict"
    body = {"inputs": [[1.0]]}
    passed = page_request(team.api, "POST", path, json=body, headers=team.h("vera"))
    assert passed.status_code == 404, passed.text
    assert "nothing" in error_of(passed)["message"]
    unknown = page_request(
        team.api, "POST", path, json=body, headers={"Authorization": "Bearer nonsense"}
    )
    assert unknown.status_code == 401, unknown.text  # the guard passes it, the token does not
    for headers in (CROSS_SITE, SAME_SITE, {"Sec-Fetch-Site": "cross-site"}):
        cross_origin(
            page_request(team.api, "POST", path, json=body, headers={**headers, **team.h("vera")})
        )
    cross_origin(page_request(team.api, "POST", path, json=body))  # no token, no header
    cross_origin(
        page_request(
            team.api, "POST", "/api/v1/services", json={"model": "m"}, headers=team.h("root")
        )
    )
    cross_origin(page_request(team.api, "POST", "/api/v1/services/x/stop", headers=team.h("root")))


# -- what goes through -----------------------------------------------------------------------
def test_trainhouse_clients_and_the_servers_own_pages_write(
    api: TestClient, tmp_path: Path
) -> None:
    # the CLI, the client and the SDK: the header, whatever else the request says
    assert api.post(
        "/api/v1/jobs/dry-run",
        data={"spec": "name: a\nentrypoint: python train.py\n"},
        files={"workdir": ("w.tar.gz", workdir(tmp_path), "application/gzip")},
    ).is_success
    # a page of this server (Swagger UI's "try it out", a form of its own)
    for headers in (
        SAME_ORIGIN,
        {"Sec-Fetch-Site": "none"},  # the user's own navigation
        {"Origin": "http://127.0.0.1"},  # a browser without Sec-Fetch-Site
        {"Origin": "HTTP://127.0.0.1:80", "Sec-Fetch-Site": "same-origin"},  # the default port
    ):
        resp = submit_from_page(api, tmp_path, headers)
        assert resp.status_code == 201, (headers, resp.text)


def test_reads_from_anywhere_are_answered(api: TestClient) -> None:
    """A page of another origin cannot read the answer of a plain GET (the browser keeps it
    from the page), and reads change nothing: the dashboard's links and images stay."""
    assert page_request(api, "GET", "/api/v1/jobs", headers=CROSS_SITE).status_code == 200
    assert page_request(api, "HEAD", "/", headers=CROSS_SITE).status_code == 200


# -- Host ----------------------------------------------------------------------------------
def unknown_host(resp: Any, host: str) -> None:
    assert resp.status_code == 400, resp.text
    err = error_of(resp)
    assert err["code"] == "unknown_host"
    assert f"does not answer to the host {host!r}" in err["message"]
    assert f"--allowed-host {host}" in err["message"]


def test_a_rebound_name_is_refused(api: TestClient, tmp_path: Path) -> None:
    """DNS rebinding: attacker.example now resolves to 127.0.0.1; the page is same-origin to
    itself, so it sends what a page of this server sends, and its Host names it."""
    rebound = {"Host": "attacker.example:8470", "Origin": "http://attacker.example:8470"}
    unknown_host(api.get("/api/v1/jobs", headers=rebound), "attacker.example")
    unknown_host(
        api.get("/api/v1/health", headers={"Host": "ATTACKER.example"}), "attacker.example"
    )
    resp = submit_from_page(api, tmp_path, {**rebound, "Sec-Fetch-Site": "same-origin"})
    unknown_host(resp, "attacker.example")
    resp = api.post("/api/v1/jobs/1/cancel", headers={"Host": "attacker.example"})  # header on
    unknown_host(resp, "attacker.example")
    assert jobs(api) == 0


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:8470", "localhost", "LOCALHOST:1", "[::1]:8470", "[::1]"]
)
def test_the_loopback_names_are_answered(api: TestClient, host: str) -> None:
    assert api.get("/api/v1/health", headers={"Host": host}).status_code == 200


def call(hosts: Hosts, headers: list[tuple[bytes, bytes]], method: str = "GET") -> int:
    """The status of one request through the guard, in front of an app that answers 200."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/", "scheme": "http", "headers": headers}
    asyncio.run(OriginGuard(app, hosts)(scope, receive, send))
    status: int = sent[0]["status"]
    return status


def test_a_request_without_one_host_is_refused() -> None:
    loopback = Hosts(frozenset({"127.0.0.1"}))
    assert call(loopback, [(b"host", b"127.0.0.1")]) == 200
    assert call(loopback, []) == 400
    assert call(loopback, [(b"host", b"127.0.0.1"), (b"host", b"attacker.example")]) == 400


def hosts(**settings: Any) -> Hosts:
    return Hosts.of(Settings(home=Path("/x"), **settings))


def test_the_hosts_a_server_answers_to() -> None:
    default = hosts()
    assert default.names == {"127.0.0.1", "localhost", "::1"}
    assert not default.allows("attacker.example") and not default.allows("10.0.0.5")
    # a LAN address: that address and localhost; the loopback addresses do not reach it
    lan = hosts(host="10.0.0.5")
    assert lan.allows("10.0.0.5") and lan.allows("localhost") and not lan.allows("127.0.0.1")
    # every address: any address names this machine; names must be given
    everywhere = hosts(host="0.0.0.0", allowed_hosts=("gpu-box", "GPU-Box.lab"))
    for host in ("127.0.0.1", "10.0.0.5", "::1", "fe80::1", "gpu-box", "gpu-box.lab"):
        assert everywhere.allows(host), host
    assert not everywhere.allows("attacker.example") and not everywhere.allows("gpu-box.evil")
    # behind a proxy: the public name, from --advertise-url or --allowed-host
    proxied = hosts(advertise_url="https://trainhouse.example.com")
    assert proxied.allows("trainhouse.example.com")
    assert proxied.advertised_origin == "https://trainhouse.example.com"
    assert hosts(allowed_hosts=("trainhouse.example.com",)).allows("trainhouse.example.com")


def test_a_proxied_server_answers_to_its_public_name(tmp_path: Path) -> None:
    """nginx forwards ``Host: trainhouse.example.com`` and ``X-Forwarded-Proto: https``; the
    dashboard there is the server's own origin."""
    cfg = Settings(home=tmp_path / "home", port=1, advertise_url="https://trainhouse.example.com")
    app = create_app(cfg, executor=fake_executor(cfg))
    with in_process(app, base_url="http://trainhouse.example.com") as api:
        assert api.get("/api/v1/health").status_code == 200
        resp = page_request(
            api,
            "DELETE",
            "/api/v1/session",
            headers={"Origin": "https://trainhouse.example.com", "Sec-Fetch-Site": "same-origin"},
        )
        assert resp.status_code == 204, resp.text


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("allowed_hosts", ("http://trainhouse.example.com",)),
        ("allowed_hosts", ("trainhouse.example.com:443",)),
        ("allowed_hosts", ("*",)),
        ("allowed_hosts", ("",)),
        ("allowed_hosts", ("a/b",)),
        ("advertise_url", "head-node:8470"),
        ("advertise_url", "ftp://head-node"),
        ("advertise_url", "http://:8470"),
        ("advertise_url", "http://head-node:port"),
    ],
)
def test_settings_refuse_a_host_that_is_not_one(option: str, value: Any) -> None:
    flag = "--allowed-host" if option == "allowed_hosts" else "--advertise-url"
    with pytest.raises(ValueError, match=flag):
        Settings(home=Path("/x"), **{option: value}).validate()


def test_host_and_origin_spelling() -> None:
    assert host_of("Example.COM:8470") == "example.com"
    assert host_of("[::1]:8470") == host_of("[::1]") == "::1"
    assert origin_of("HTTPS", "Example.com:443") == "https://example.com"
    assert origin_of("http", "127.0.0.1:8470") == "http://127.0.0.1:8470"
    assert origin_of("http", "[::1]:80") == "http://[::1]"
