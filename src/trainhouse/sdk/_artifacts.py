"""``run.log_artifact``: a file (or a directory's files) kept with the job.

Under the server the bytes go to the job's artifacts through MLflow's artifact API
(``PUT <url>/mlflow/jobs/<id>/api/2.0/mlflow-artifacts/artifacts/runs/<id>/<path>``, with the
job's credential): the server writes them (links refused, sizes capped) where MLflow's
``log_artifact`` puts its own, and the job's page lists them. A standalone run copies them into
``./artifacts/``. Any rank may call it; each call uploads what it names.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from urllib.parse import quote

import httpx

from trainhouse.core.errors import ClientError, ServerUnreachable
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.jobfs.artifacts import MAX_DEPTH, parts_of
from trainhouse.jobfs.layout import JobEnv, mlflow_uri

__all__ = ["LOCAL_DIR", "log_artifact"]

#: where a standalone run keeps its artifacts (next to ./checkpoints)
LOCAL_DIR = "artifacts"
#: files one call uploads at most (a directory's)
MAX_FILES = 10_000
#: how long an upload is tried again while the server does not answer, or answers 5xx
RETRY_FOR = 60.0


def _files(local: Path) -> list[tuple[Path, str]]:
    """(file, its path below ``local``'s name) for a file, or every regular file below a
    directory (links are not followed, anything else is skipped)."""
    st = local.lstat()
    if stat.S_ISREG(st.st_mode):
        return [(local, local.name)]
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{local} is not a regular file or a directory")
    out: list[tuple[Path, str]] = []
    for top, dirs, names in os.walk(local, followlinks=False):
        rel = Path(top).relative_to(local)
        if len(rel.parts) >= MAX_DEPTH:
            dirs.clear()
        for name in sorted(names):
            path = Path(top) / name
            if path.is_symlink() or not path.is_file():
                continue
            out.append((path, (Path(local.resolve().name) / rel / name).as_posix()))
            if len(out) > MAX_FILES:
                raise ValueError(f"{local} holds more than {MAX_FILES} files")
    return sorted(out, key=lambda item: item[1])


def _target(artifact_path: str | None, rel: str) -> str:
    """The artifact's path: ``artifact_path/rel``, each component checked."""
    parts = parts_of(artifact_path or "") + parts_of(rel)
    if not parts:
        raise ValueError("an artifact needs a file name")
    return "/".join(parts)


def _error(resp: httpx.Response) -> ClientError:
    try:
        body = resp.json()
        message = str(body.get("message") or body["error"]["message"])
    except (ValueError, KeyError, TypeError, AttributeError):
        message = f"HTTP {resp.status_code} {resp.reason_phrase}"
    return ClientError(f"artifact upload refused: {message}", status=resp.status_code)


def _upload(job: JobEnv, http: httpx.Client, path: Path, target: str) -> None:
    quoted = "/".join(quote(p, safe="") for p in target.split("/"))
    url = (
        f"{mlflow_uri(job.url, job.job_id)}/api/2.0/mlflow-artifacts/artifacts/runs/"
        f"{job.job_id}/{quoted}"
    )
    deadline = time.monotonic() + RETRY_FOR
    delay = 0.2
    while True:
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                resp = http.put(url, content=fh, headers={"Content-Length": str(size)})
        except httpx.TransportError as exc:
            if time.monotonic() + delay > deadline:
                raise ServerUnreachable(job.url, str(exc) or type(exc).__name__) from None
        else:
            if resp.status_code < 400:
                return
            if resp.status_code < 500 or time.monotonic() + delay > deadline:
                raise _error(resp)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def log_artifact(
    job: JobEnv | None, local_path: str | os.PathLike[str], artifact_path: str | None = None
) -> list[str]:
    """Keep ``local_path`` (a file, or every file below a directory, under its name) with the
    run, below ``artifact_path`` among its artifacts; the artifact paths it got, in order."""
    local = Path(local_path)
    found = _files(local)
    targets = [(path, _target(artifact_path, rel)) for path, rel in found]
    if job is None:  # standalone: ./artifacts/
        root = Path(LOCAL_DIR).resolve()
        for path, target in targets:
            dest = root / target
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        return [t for _, t in targets]
    headers = {**CLIENT_HEADERS, "Authorization": f"Bearer {job.token}"}
    with httpx.Client(headers=headers, timeout=httpx.Timeout(60.0, connect=10.0)) as http:
        for path, target in targets:
            _upload(job, http, path, target)
    return [t for _, t in targets]
