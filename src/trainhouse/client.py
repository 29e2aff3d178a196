"""The Python client for trainhouse's REST API (what the CLI uses too).

from trainhouse.client import Client
c = Client()                       # TRAINHOUSE_URL or http://127.0.0.1:8470
job = c.submit("examples/digits/trainhouse.yaml", overrides=["hparams.epochs=2"])
c.wait(job["id"])
"""

from __future__ import annotations

import getpass
import os
import time
from pathlib import Path
from typing import Any

import httpx

from trainhouse.errors import ClientError
from trainhouse.sdk.transport import send
from trainhouse.spec import JobSpec, load_spec
from trainhouse.workdir import PackedWorkdir, pack

DEFAULT_URL = "http://127.0.0.1:8470"


def default_url() -> str:
    return os.environ.get("TRAINHOUSE_URL") or DEFAULT_URL


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "anonymous"


class Client:
    def __init__(self, url: str | None = None, *, timeout: float = 60.0) -> None:
        self.url = (url or default_url()).rstrip("/")
        self._http = httpx.Client(base_url=f"{self.url}/api/v1", timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return send(self._http, self.url, method, path, **kwargs)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError:
            raise ClientError(
                f"{self.url} did not answer with JSON; is it a trainhouse server (TRAINHOUSE_URL)?",
                status=resp.status_code or 502,
                code="not_trainhouse",
            ) from None

    # -- server ----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/health")
        return result

    def nodes(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/nodes")
        return result

    # -- jobs ------------------------------------------------------------------------------
    def submit(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Validate the spec, pack its workdir and submit; returns the new job."""
        spec_path = Path(spec_file)
        spec = load_spec(spec_path, overrides)
        workdir = (spec_path.parent / spec.workdir).resolve()
        return self.submit_packed(spec, pack(workdir), owner=owner)

    def submit_packed(
        self, spec: JobSpec, packed: PackedWorkdir, *, owner: str | None = None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._json(
            "POST",
            "/jobs",
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
            files={"workdir": ("workdir.tar.gz", packed.data, "application/gzip")},
        )
        return result

    def jobs(self, *, all: bool = False) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._json("GET", "/jobs", params={"all": str(all).lower()})[
            "jobs"
        ]
        return result

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}")
        return result

    def cancel(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/cancel")
        return result

    def metrics(
        self, job_id: int, *, name: str | None = None, all_ranks: bool = False
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"all_ranks": str(all_ranks).lower()}
        if name:
            params["name"] = name
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/metrics", params=params)
        return result

    def checkpoints(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/checkpoints")
        return result

    def log_ranks(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/logs/ranks")
        return result

    def logs(
        self, job_id: int, *, rank: int | str = 0, offset: int = 0, tail: int | None = None
    ) -> tuple[str, int, str]:
        """(text, offset to continue from, job state)."""
        params: dict[str, Any] = {"rank": str(rank), "offset": offset}
        if tail is not None:
            params["tail"] = tail
        resp = self._request("GET", f"/jobs/{job_id}/logs", params=params)
        return (
            resp.text,
            int(resp.headers.get("X-Log-Offset", offset)),
            resp.headers.get("X-Job-State", ""),
        )

    def queue(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/queue")
        return result

    def dry_run(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Where the job would run now, or why it would wait; nothing is submitted."""
        spec = load_spec(Path(spec_file), overrides)
        result: dict[str, Any] = self._json(
            "POST",
            "/jobs/dry-run",
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
        )
        return result

    def set_priority(self, job_id: int, priority: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json(
            "POST", f"/jobs/{job_id}/priority", json={"priority": priority}
        )
        return result

    def quotas(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/quotas")
        return result

    def set_quota(self, owner: str, limits: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._json("PUT", f"/quotas/{owner}", json=limits)
        return result

    def clear_quota(self, owner: str) -> None:
        self._request("DELETE", f"/quotas/{owner}")

    def wait(
        self, job_id: int, *, timeout: float | None = None, poll: float = 0.5
    ) -> dict[str, Any]:
        """Block until the job ends; returns its final record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in ("COMPLETED", "FAILED", "CANCELED"):
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout} s")
            time.sleep(poll)
