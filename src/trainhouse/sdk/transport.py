"""The SDK's HTTP calls to the server, authenticated with the job's per-attempt credential."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import orjson

from trainhouse.errors import ClientError, ServerUnreachable


def send(http: httpx.Client, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to a trainhouse server; its error body (or silence) as a ClientError."""
    try:
        resp = http.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise ServerUnreachable(url, str(exc) or type(exc).__name__) from None
    if resp.status_code >= 400:
        raise error_from(resp, url)
    return resp


def error_from(resp: httpx.Response, url: str) -> ClientError:
    """The ClientError an error answer (read already) stands for."""
    try:
        err = resp.json()["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        code = "http_error"
        message = (
            f"{url} answered HTTP {resp.status_code} {resp.reason_phrase} without "
            "a trainhouse error; is it a trainhouse server (TRAINHOUSE_URL)?"
        )
    return ClientError(message, status=resp.status_code, code=code)


JSON_HEADERS = {"Content-Type": "application/json"}


def encode_json(payload: Any) -> bytes:
    """``payload`` as JSON, by orjson (a 50,000-point batch in milliseconds); NaN and infinity
    become null. An integer past 64 bits (a step the server refuses) goes through json."""
    try:
        return orjson.dumps(payload)
    except TypeError:
        return json.dumps(payload).encode()


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
        return send(self._http, self.url, method, path, **kwargs).json()

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
        """POST one metric batch (``{"batch_id", "attempt", "columns", ...}``) as JSON."""
        body = encode_json(payload)
        result: dict[str, Any] = self.call(
            "POST", "/report", content=body, headers=JSON_HEADERS, retry_for=retry_for
        )
        return result

    def register_checkpoint(
        self, payload: dict[str, Any], *, retry_for: float = 60.0
    ) -> dict[str, Any]:
        result: dict[str, Any] = self.call(
            "POST", "/checkpoints", json=payload, retry_for=retry_for
        )
        return result

    def checkpoints(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/checkpoints", retry_for=60)["checkpoints"]
        return result

    def report_corrupt(self, checkpoint_id: int, reason: str) -> dict[str, Any]:
        """Tell the server a checkpoint failed verification (missing, sha256 mismatch)."""
        result: dict[str, Any] = self.call(
            "POST",
            f"/checkpoints/{int(checkpoint_id)}/corrupt",
            json={"reason": reason},
            retry_for=10,
        )
        return result
