"""The SDK's HTTP calls to the server, authenticated with the job's per-attempt credential."""

from __future__ import annotations

import time
from typing import Any

import httpx

from trainhouse.errors import ClientError, ServerUnreachable


class JobAPI:
    """The endpoints a running job reports to."""

    def __init__(self, url: str, job_id: int, token: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.job_id = job_id
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1/jobs/{job_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(self.url, type(exc).__name__) from None
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                raise ClientError(err["message"], status=resp.status_code, code=err["code"])
            except (ValueError, KeyError, TypeError):
                raise ClientError(resp.text[:500], status=resp.status_code) from None
        return resp.json()

    def call(self, method: str, path: str, *, retry_for: float = 0.0, **kwargs: Any) -> Any:
        """Call; retry transport errors and 5xx answers for up to ``retry_for`` seconds."""
        deadline = time.monotonic() + retry_for
        delay = 0.2
        while True:
            try:
                return self._call(method, path, **kwargs)
            except ClientError as exc:
                retryable = isinstance(exc, ServerUnreachable) or exc.status >= 500
                if not retryable or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def report(self, payload: dict[str, Any], *, retry_for: float = 0.0) -> dict[str, Any]:
        result: dict[str, Any] = self.call("POST", "/report", json=payload, retry_for=retry_for)
        return result

    def register_checkpoint(self, payload: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call("POST", "/checkpoints", json=payload, retry_for=60)
        return result

    def checkpoints(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/checkpoints", retry_for=60)["checkpoints"]
        return result
