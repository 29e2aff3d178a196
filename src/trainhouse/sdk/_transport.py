"""The SDK's HTTP calls to the server, authenticated with the job's per-attempt credential."""

from __future__ import annotations

import time
from typing import Any

import httpx

from trainhouse.core.errors import ClientError, ServerUnreachable
from trainhouse.core.wire import CLIENT_HEADERS, JSON_HEADERS, encode_json, file_work_wait, send


class JobAPI:
    """The endpoints a running job reports to."""

    def __init__(
        self,
        url: str,
        job_id: int,
        token: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``transport`` replaces httpx's own (a test's ``httpx.MockTransport``, say)."""
        self.url = url.rstrip("/")
        self.job_id = job_id
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1/jobs/{job_id}",
            headers={**CLIENT_HEADERS, "Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
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

    def register_model(self, name: str, path: str, *, retry_for: float = 60.0) -> dict[str, Any]:
        """Register the model the job saved in ``path`` (its checkpoint storage) as a new
        version of ``name``; the version as registered. The server answers once it has hashed
        every file: the answer is awaited up to ``FILE_WORK_READ`` seconds (a retry joins the
        registration under way, it does not start another)."""
        result: dict[str, Any] = self.call(
            "POST",
            "/models",
            json={"name": name, "path": path},
            retry_for=retry_for,
            extensions=file_work_wait(self._http),
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

    def report_hparams(
        self, hparams: dict[str, Any], script_keys: list[str] | None, *, retry_for: float = 10.0
    ) -> dict[str, Any]:
        """The hparams the run uses now, and the keys the script declared (its defaults)."""
        body = encode_json({"hparams": hparams, "script_keys": script_keys})
        result: dict[str, Any] = self.call(
            "POST", "/hparams", content=body, headers=JSON_HEADERS, retry_for=retry_for
        )
        return result
