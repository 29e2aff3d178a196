"""The real app in process (starlette's TestClient runs its lifespan: scheduler, services).

:func:`app_client` runs it over the suite's :class:`~tests.support.fakes.FakeExecutor` (a
launched job "runs" and ends at the next scheduler tick, with exit code 0 unless told
otherwise), or with ``real=True`` over the local executor (torchrun and real ranks). The
helpers submit a workdir, wait for a state and read an error body as every API test does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import ASGIApp

from tests.support.fakes import FakeExecutor
from tests.support.templates import migrated_home
from trainhouse.core.wire import CLIENT_HEADERS, CSRF_HEADER
from trainhouse.executors.inventory import local_node
from trainhouse.jobfs.workdir import pack
from trainhouse.server import Settings, create_app
from trainhouse.usecases.runtime import Runtime

DEFAULTS: dict[str, Any] = {"port": 1, "cpus": 2, "gpus": "0", "tick": 0.1}
#: where the in-process client sends its requests: a Host the default server answers to
BASE_URL = "http://127.0.0.1"


def in_process(app: FastAPI | ASGIApp, *, base_url: str = BASE_URL, **kwargs: Any) -> TestClient:
    """A TestClient of ``app`` that asks as trainhouse's own clients do: to 127.0.0.1 (or
    ``base_url``), with the ``X-Trainhouse-Request`` header that writes need
    (:mod:`trainhouse.server.origin`)."""
    return TestClient(app, base_url=base_url, headers=CLIENT_HEADERS, **kwargs)


class InProcessTransport(httpx.BaseTransport):
    """An ``httpx`` transport that sends through a TestClient, so that trainhouse's own
    ``httpx.Client`` (the client, the CLI) can talk to an app in process. The TestClient's
    own transport cannot be handed over: starlette builds it on ``httpx2`` wherever that is
    installed (huggingface_hub brings it), whose responses ``httpx`` refuses."""

    def __init__(self, api: TestClient) -> None:
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.api.request(
            request.method,
            str(request.url),
            headers=list(request.headers.multi_items()),
            content=request.read(),
        )
        return httpx.Response(
            answer.status_code,
            headers=list(answer.headers.multi_items()),
            content=answer.content,
            request=request,
        )


def page_request(api: TestClient, method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A request of ``api`` without the ``X-Trainhouse-Request`` header: what a browser page
    sends (``headers`` say which: ``Origin``, ``Sec-Fetch-Site``)."""
    request = api.build_request(method, url, **kwargs)
    del request.headers[CSRF_HEADER]
    return api.send(request)


def settings_for(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings of a server in ``tmp_path / "home"``; its embedded database (unless another is
    named) a copy of one migrated already (:mod:`tests.support.templates`)."""
    settings = Settings(home=tmp_path / "home", **{**DEFAULTS, **overrides})
    if settings.db_url is None and settings.db_file is None:
        migrated_home(settings.home)
    return settings


def fake_executor(settings: Settings, *, exit_code: int | None = 0) -> FakeExecutor:
    """A fake with the inventory ``settings`` declares (``--cpus``, ``--gpus``)."""
    return FakeExecutor(local_node(settings.cpus, settings.gpus), exit_code=exit_code)


@contextmanager
def app_client(
    tmp_path: Path, *, real: bool = False, exit_code: int | None = 0, **settings: Any
) -> Iterator[TestClient]:
    """The app over ``Settings(home=tmp_path / "home", ...)``; a fake executor unless
    ``real``."""
    cfg = settings_for(tmp_path, **settings)
    executor = None if real else fake_executor(cfg, exit_code=exit_code)
    with in_process(create_app(cfg, executor=executor)) as client:
        yield client


def services(api: TestClient) -> Runtime:
    rt: Runtime = api.app.state.runtime  # type: ignore[attr-defined]
    return rt


def workdir(tmp_path: Path, script: str = "print('hello from rank')\n") -> bytes:
    src = tmp_path / "wd"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(script)
    return pack(src).data


def submit(api: TestClient, spec: str, archive: bytes) -> Any:
    return api.post(
        "/api/v1/jobs",
        data={"spec": spec, "owner": "tester"},
        files={"workdir": ("w.tar.gz", archive, "application/gzip")},
    )


def error_of(resp: Any) -> dict[str, str]:
    body = resp.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


# what Chromium sends with a cross-origin fetch(..., {mode: "no-cors"}) or a form post
CROSS_SITE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}


def cross_origin(resp: Any) -> str:
    assert resp.status_code == 403, resp.text
    err = error_of(resp)
    assert err["code"] == "cross_origin", err
    assert "must carry the header X-Trainhouse-Request: 1" in err["message"]
    return err["message"]


def wait_state(api: TestClient, job_id: int, states: set[str], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stuck in {job['state']}")


def wait_launched(api: TestClient, job_id: int, timeout: float = 60) -> Any:
    """The job once RUNNING and launched by the fake executor: the store says RUNNING before
    the scheduler unpacks the code, makes the checkpoint directory and launches the attempt."""
    job = wait_state(api, job_id, {"RUNNING"}, timeout)
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    deadline = time.monotonic() + timeout
    while job_id not in fake.live:
        assert time.monotonic() < deadline, f"job {job_id} RUNNING but never launched"
        time.sleep(0.01)
    return job
