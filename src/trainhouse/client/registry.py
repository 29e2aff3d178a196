"""The Python client's model registry and services calls (a part of :class:`trainhouse.client.
Client`, kept apart by noun): models, versions, aliases, downloads (sha256 checked), ONNX
export in a child process, and services: start, list, show, stop, predict, wait.

Nothing heavy is imported up front; torch never is (the export runs in a child process).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainhouse.client.base import ClientBase
from trainhouse.client.credentials import current_user
from trainhouse.client.downloads import Part, fetch_verified
from trainhouse.client.records import (
    Model,
    ModelDetail,
    ModelList,
    ModelVersion,
    Service,
    ServiceList,
)
from trainhouse.core.errors import ClientError
from trainhouse.core.wire import error_from, file_work_wait

__all__ = ["ModelsAndServices"]


def _seg(value: str | int) -> str:
    """``value`` as one URL path segment."""
    from urllib.parse import quote

    return quote(str(value), safe="")


class ModelsAndServices(ClientBase):
    """The calls about models and services; :class:`~trainhouse.client.Client` has them."""

    # -- models ----------------------------------------------------------------------------
    def models(self) -> list[Model]:
        page: ModelList = self._json("GET", "/models")
        return page["models"]

    def model(self, name: str) -> ModelDetail:
        """A model and its versions (``{"model": ..., "versions": [...]}``)."""
        result: ModelDetail = self._json("GET", f"/models/{_seg(name)}")
        return result

    def model_version(self, name: str, ref: str | int = "latest") -> ModelVersion:
        """The version ``ref`` names: a number, an alias or ``latest``."""
        result: ModelVersion = self._json("GET", f"/models/{_seg(name)}/versions/{_seg(ref)}")
        return result

    def register_model(
        self,
        name: str,
        job_id: int,
        step: int | None = None,
        *,
        loader: str | None = None,
        inputs: list[str] | list[dict[str, Any]] | None = None,
    ) -> ModelVersion:
        """The model job ``job_id`` saved (``run.save_model``; its newest, or the one of
        ``step``) as a new version of ``name``. With ``loader`` (``"serve.py:load"``, a
        function of the job's code), the job's checkpoint (its newest, or the one of ``step``)
        instead: the server copies it into the registry (digests checked) and
        ``load_model(dir, loader=fn)`` returns ``fn(state)``. ``inputs`` (with a loader) declare
        the model's inputs, ``"x:float32[B,1,8,8]"`` or ``{"name", "dtype", "shape"}``, for
        serving and exports."""
        body: dict[str, Any] = {"job": job_id, "step": step}
        if loader is not None:
            body["loader"] = loader
        if inputs is not None:
            from trainhouse.core.modelfiles import check_inputs, parse_input

            body["inputs"] = check_inputs(
                [parse_input(i) if isinstance(i, str) else dict(i) for i in inputs]
            )
        # the server answers once it has hashed (or copied) the files: minutes for a large one
        result: ModelVersion = self._json(
            "POST",
            f"/models/{_seg(name)}/versions",
            json=body,
            extensions=file_work_wait(self._http),
        )
        return result

    def set_alias(self, name: str, alias: str, version: int) -> ModelVersion:
        result: ModelVersion = self._json(
            "PUT", f"/models/{_seg(name)}/aliases/{_seg(alias)}", json={"version": version}
        )
        return result

    def transfer_model(self, name: str, owner: str) -> Model:
        """Give the model ``name`` to the user ``owner`` (admins only)."""
        result: Model = self._json("PUT", f"/models/{_seg(name)}/owner", json={"owner": owner})
        return result

    def delete_model_version(self, name: str, version: int) -> ModelVersion:
        result: ModelVersion = self._json("DELETE", f"/models/{_seg(name)}/versions/{version}")
        return result

    def download_model(
        self,
        ref: str,
        dest: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Fetch the files of ``NAME@VERSION`` or ``NAME@ALIAS`` into ``dest/NAME-vVERSION``,
        each checked against its registered size and sha256; a partial or corrupt download
        never stays under the final name. ``progress(done, total)`` in bytes."""
        from trainhouse.core.errors import ModelError
        from trainhouse.core.modelfiles import parse_ref

        name, which = parse_ref(ref)
        version = self.model_version(name, which)
        number = version["version"]
        parts = [
            Part(
                name=str(entry["name"]),
                target=Path(entry["name"]).name,
                url=f"{self.url}/api/v1/models/{name}/versions/{number}/files/{entry['name']}",
                expected=entry["sha256"],
            )
            for entry in version["files"]
        ]

        def corrupt(part: Part, actual: str) -> Exception:
            return ModelError(
                f"the downloaded {part.name} of {name}@{number} has sha256 {actual[:16]}..., "
                f"not the registered {str(part.expected)[:16]}...: it is corrupt"
            )

        base = Path(dest)
        base.mkdir(parents=True, exist_ok=True)
        return fetch_verified(
            self._http,
            self.url,
            base / f"{name}-v{number}",
            parts,
            total=sum(int(f["size"]) for f in version["files"]),
            progress=progress,
            refused=lambda resp, _part: error_from(resp, self.url),
            corrupt=corrupt,
        )

    def export_model(
        self,
        ref: str,
        dest: str | os.PathLike[str],
        *,
        format: str = "onnx",
        workdir: str | os.PathLike[str] | None = None,
        trust_code: bool = False,
        force: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """Export ``NAME@VERSION`` or ``NAME@ALIAS`` to ONNX in ``dest``:
        ``dest/NAME-vVERSION.onnx`` (a dynamic batch dimension) and ``.json`` next to it
        (input and output names, the signature, the source, the file's sha256); returns that
        JSON with ``path`` and ``metadata``. The version is downloaded (sha256 checked) and
        exported by ``python -m trainhouse.serving.export`` in a child process (torch is
        never imported here). A model rebuilt by a loader needs ``workdir``, its job's code,
        and ``trust_code``: the loader is that job's code and runs in the exporting process.
        Existing outputs are replaced only with ``force``."""
        import subprocess
        import sys
        import tempfile

        from trainhouse.core.errors import ModelError
        from trainhouse.core.modelfiles import LOADER_KINDS, export_paths, missing_onnx, parse_ref

        if format != "onnx":
            raise ModelError(f"format must be 'onnx', got {str(format)[:40]!r}")
        missing = missing_onnx()
        if missing is not None:
            raise ModelError(missing)
        name, which = parse_ref(ref)
        version = self.model_version(name, which)
        number = int(version["version"])
        loader = version.get("record", {}).get("loader")
        if version["kind"] in LOADER_KINDS and (workdir is None or not trust_code):
            raise ModelError(
                f"{name}@{number} is rebuilt by the loader {loader}, a function of its job's "
                f"code (job {version['job_id']}), which would run in this process: give that "
                "code with --workdir DIR and --trust-code, if you trust whoever wrote it"
            )
        if workdir is not None and not Path(workdir).is_dir():
            raise ModelError(f"the workdir {workdir} is not a directory")
        if version["kind"] == "checkpoint" and not version["signature"].get("inputs"):
            raise ModelError(
                f"{name}@{number} was registered from a checkpoint without its inputs, which "
                "the exporter needs: register it again with --input NAME:DTYPE[B,d1,...]"
            )
        out = Path(dest)
        if out.exists() and not out.is_dir():
            raise ModelError(f"{out} is not a directory")
        if not force:
            for path in export_paths(out, name, number):
                if path.exists():
                    raise ModelError(f"{path} exists: give --force to replace it")
        out.mkdir(parents=True, exist_ok=True)
        # the download goes next to the output (the same disk), and away once it is exported
        with tempfile.TemporaryDirectory(dir=out, prefix=".export-") as tmp:
            src = self.download_model(f"{name}@{number}", tmp, progress=progress)
            result_file = Path(tmp) / "result.json"
            command = [
                sys.executable,
                "-m",
                "trainhouse.serving.export",
                str(src),
                str(out),
                "--format",
                format,
                "--name",
                name,
                "--version",
                str(number),
                "--result",
                str(result_file),
            ]
            if workdir is not None:
                command += ["--workdir", str(Path(workdir).resolve())]
            if force:
                command.append("--force")
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            try:
                result: dict[str, Any] = json.loads(result_file.read_text())
            except (OSError, ValueError):
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise ModelError(
                    f"the export of {name}@{number} failed (exit status {done.returncode}): "
                    + (" | ".join(tail) or "no output")
                ) from None
        if done.returncode != 0 or "error" in result:
            raise ModelError(str(result.get("error") or f"exit status {done.returncode}"))
        return result

    # -- services --------------------------------------------------------------------------
    def serve(
        self,
        ref: str,
        *,
        name: str | None = None,
        replicas: int = 1,
        gpus_per_replica: int = 0,
        max_batch: int = 32,
        max_wait_ms: float = 5.0,
        priority: str = "normal",
    ) -> Service:
        """Start serving ``NAME@ALIAS`` (or ``NAME@VERSION``, ``NAME@latest``): a service whose
        replicas a long-running job runs; it follows the alias when it moves."""
        from trainhouse.core.modelfiles import parse_ref

        model, which = parse_ref(ref)
        body = {
            "model": model,
            "ref": str(which),
            "name": name,
            "replicas": replicas,
            "gpus_per_replica": gpus_per_replica,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
            "priority": priority,
            "owner": current_user(),
        }
        result: Service = self._json("POST", "/services", json=body)
        return result

    def services(self) -> list[Service]:
        page: ServiceList = self._json("GET", "/services")
        return page["services"]

    def service(self, name: str) -> Service:
        result: Service = self._json("GET", f"/services/{_seg(name)}")
        return result

    def stop_service(self, name: str) -> Service:
        result: Service = self._json("POST", f"/services/{_seg(name)}/stop")
        return result

    def predict(self, service: str, inputs: Any) -> dict[str, Any]:
        """``{"outputs": [...], "model": NAME, "version": V}`` for ``inputs`` (a list with one
        entry per example, or ``{"input name": [...]}``)."""
        result: dict[str, Any] = self._json(
            "POST", f"/services/{_seg(service)}/predict", json={"inputs": inputs}
        )
        return result

    def wait_service(self, name: str, *, timeout: float = 300.0, poll: float = 0.5) -> Service:
        """The service once every replica is ready; raises :class:`ClientError` when it fails
        or stops first, or on ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.service(name)
            if found["state"] == "ready":
                return found
            if found["state"] in ("failed", "stopped", "lost"):
                raise ClientError(
                    f"service {name} is {found['state']} (job {found['job_id']}: "
                    f"{found['job_state']}); see trainhouse logs {found['job_id']}",
                    code="service_failed",
                )
            if time.monotonic() > deadline:
                raise ClientError(
                    f"service {name} is still {found['state']} after {timeout:g} s",
                    code="timeout",
                )
            time.sleep(poll)
