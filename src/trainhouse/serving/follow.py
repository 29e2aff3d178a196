"""A service's replica: ``python -m trainhouse.serving.follow``, what each rank of a service's
job runs (``trainhouse serve``).

The replica binds a port, then calls its server about once a second with its job's credential
(``POST /api/v1/jobs/{id}/replicas``): where it listens, a key of its own that every prediction
must carry (so only the server reaches it), the version it serves and its state. The answer is
the version its service should serve now. When that changes (an alias moved) the replica
downloads the new version's files (each checked against its sha256), loads it beside the one it
serves, and swaps it in between two batches: a request is answered by one version, and none
fails for the switch. A version that fails to load is reported (``failed`` with the reason) and
the old one keeps serving. A model saved with a loader also gets the code of the job that made
it, unpacked as a job's workdir is.

The server being away (restarting) changes nothing here: the replica keeps serving and calls
again; the server's new process learns of it at the next call.

The rank's process is not the replica itself but its supervisor (:mod:`.supervisor`), which runs
``python -m trainhouse.serving.follow --replica`` and starts it again when it fails: one
replica's crash restarts that replica alone, never its job's other ranks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.jobfs.layout import JOB_ID_ENV, JOB_TOKEN_ENV, NODE_ADDRESS_ENV, URL_ENV
from trainhouse.serving.replica import Batcher, Loaded, build_app, load

__all__ = ["Follower", "main", "serve"]

KEEP_VERSIONS = 2  # downloaded versions kept on disk (the one served and the one before)


def log(message: str) -> None:
    print(f"[replica {os.environ.get('RANK', '0')}] {message}", flush=True)


class Follower:
    """One replica of a service: its calls to the server, its downloads, its model swaps."""

    def __init__(self, url: str, job_id: int, token: str, rank: int, root: Path) -> None:
        self.job_id = job_id
        self.rank = rank
        self.root = root
        self.key = secrets.token_urlsafe(24)
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}", **CLIENT_HEADERS},
            timeout=httpx.Timeout(60.0, connect=5.0),
        )
        self.address = ""
        self.state = "loading"
        self.error: str | None = None
        self.current: Loaded | None = None
        self.failed_version: int | None = None
        self.batcher: Batcher | None = None
        self.told_outputs: int | None = None  # the version whose learned outputs it told
        self.interval = 1.0
        self.device = device_of(int(os.environ.get("LOCAL_RANK", rank)))

    # -- the server --------------------------------------------------------------------------
    def call(self) -> dict[str, Any]:
        """Tell the server about this replica; what the service should serve now."""
        stats = {}
        if self.batcher is not None:
            s = self.batcher.stats
            stats = {"requests": s.requests, "batches": s.batches, "examples": s.examples}
        body = {
            "rank": self.rank,
            "url": self.address,
            "key": self.key,
            "version": None if self.current is None else self.current.version,
            "state": self.state,
            "error": self.error,
            "stats": stats,
        }
        learned = self._untold_outputs()
        if learned is not None:
            body["outputs"] = learned
        resp = self.http.post(f"/jobs/{self.job_id}/replicas", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"the server answered {resp.status_code}: {resp.text[:300]}")
        if learned is not None and self.current is not None:
            self.told_outputs = self.current.version
        target: dict[str, Any] = resp.json()
        self.interval = min(max(float(target.get("interval", 1.0)), 0.2), 10.0)
        return target

    def _untold_outputs(self) -> list[dict[str, Any]] | None:
        """The outputs this replica learned of the version it serves, until the server has
        heard them once (it records them as that version's, when it has none)."""
        current = self.current
        if current is None or self.state != "ready" or current.version == self.told_outputs:
            return None
        return current.learned_outputs

    # -- a version's files -------------------------------------------------------------------
    def fetch(self, target: dict[str, Any]) -> tuple[Path, Path | None]:
        """The version's files (downloaded once, each checked) and, for a model that needs
        its job's code, that code unpacked."""
        version = int(target["version"])
        final = self.root / f"v{version}"
        if not final.is_dir():
            tmp = self.root / f".v{version}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "model").mkdir(parents=True)
            for entry in target["files"]:
                name = Path(str(entry["name"])).name
                self._download(
                    f"/jobs/{self.job_id}/replicas/versions/{version}/files/{name}",
                    tmp / "model" / name,
                    str(entry["sha256"]),
                )
            if target.get("kind") != "export":
                from trainhouse.jobfs.workdir import extract

                archive = tmp / "code.tar.gz"
                self._download(f"/jobs/{self.job_id}/replicas/versions/{version}/code", archive)
                extract(archive, tmp / "code")
                archive.unlink()
            os.replace(tmp, final)
            self._prune(keep=version)
        code = final / "code"
        return final / "model", code if code.is_dir() else None

    def _download(self, path: str, dest: Path, sha256: str | None = None) -> None:
        digest = hashlib.sha256()
        with self.http.stream("GET", path) as resp, dest.open("wb") as out:
            if resp.status_code != 200:
                resp.read()
                raise RuntimeError(f"{path}: the server answered {resp.status_code}: {resp.text}")
            for chunk in resp.iter_bytes(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise RuntimeError(f"{dest.name} does not match its registered sha256: corrupt")

    def _prune(self, keep: int) -> None:
        served = None if self.current is None else self.current.version
        found = sorted(
            (int(p.name[1:]) for p in self.root.glob("v*") if p.name[1:].isdigit()), reverse=True
        )
        for old in found[KEEP_VERSIONS:]:
            if old not in (keep, served):
                shutil.rmtree(self.root / f"v{old}", ignore_errors=True)

    def load(self, target: dict[str, Any]) -> Loaded | None:
        """Load the target version; None (the reason reported) when it cannot be."""
        version = int(target["version"])
        try:
            directory, code = self.fetch(target)
            loaded = load(directory, version=version, workdir=code, device=self.device)
        except Exception as exc:
            self.failed_version = version
            self.error = f"{target['model']}@{version} cannot be loaded: {exc}"[:2000]
            log(self.error)
            return None
        self.error = None
        self.failed_version = None
        return loaded

    # -- the loop ----------------------------------------------------------------------------
    def first(self) -> tuple[Loaded, dict[str, Any]]:
        """Call until the service names a version this replica can load; that model."""
        said = ""
        while True:
            target: dict[str, Any] | None = None
            try:
                target = self.call()
                problem = str(target.get("problem") or "")
            except (httpx.HTTPError, RuntimeError) as exc:
                problem = f"cannot reach the server: {exc}"
            if target is not None and target.get("version") is not None:
                if target["version"] != self.failed_version:
                    log(f"loading {target['model']}@{target['version']} on {self.device}")
                    loaded = self.load(target)
                    if loaded is not None:
                        return loaded, target
                    self.state = "failed"
            elif problem and problem != said:
                log(problem)
                said = problem
            time.sleep(self.interval)

    def follow(self, stop: threading.Event, started: threading.Event) -> None:
        """Call every interval; swap in the version the service names when it changes."""
        while not stop.wait(self.interval):
            if started.is_set() and self.state == "loading":
                self.state = "ready"
            try:
                target = self.call()
            except (httpx.HTTPError, RuntimeError):
                continue  # the server is away: keep serving
            want = target.get("version")
            if want is None or self.current is None or want == self.current.version:
                continue
            if want == self.failed_version:
                continue
            log(f"switching to {target['model']}@{want}")
            loaded = self.load(target)
            if loaded is None or self.batcher is None:
                continue
            self.batcher.swap(loaded)
            self.current = loaded
            log(f"serving {loaded.name}@{loaded.version}")
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                self.call()  # say so at once: the switch is visible as soon as it happened


def device_of(local_rank: int) -> str:
    """The GPU this rank was given (its job's ``CUDA_VISIBLE_DEVICES``), else the CPU."""
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return "cpu"
    import torch

    return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"


def listen() -> tuple[socket.socket, str]:
    """A socket on a free port where the server reaches this replica, and its URL: the node's
    address its executor gave (``TRAINHOUSE_NODE_ADDRESS``: Ray's, on a node that may not be
    the server's), else loopback (the local executor's node is the server's)."""
    host = os.environ.get(NODE_ADDRESS_ENV) or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    return sock, f"http://[{host}]:{port}" if family == socket.AF_INET6 else f"http://{host}:{port}"


REPLICA_FLAG = "--replica"  # the supervisor's child: the replica itself


def main(argv: list[str]) -> int:
    """The rank's process: the supervisor of its replica (:mod:`.supervisor`); with
    ``--replica``, the replica."""
    if argv[:1] == [REPLICA_FLAG]:
        serve()
        return 0
    if argv:
        print(f"usage: python -m trainhouse.serving.follow [{REPLICA_FLAG}]", file=sys.stderr)
        return 2
    from trainhouse.serving.supervisor import supervise

    return supervise([sys.executable, "-m", "trainhouse.serving.follow", REPLICA_FLAG])


def serve() -> None:
    """One replica: bind, load what the service serves, serve it, follow its alias."""
    import torch
    import uvicorn

    missing = [n for n in (URL_ENV, JOB_ID_ENV, JOB_TOKEN_ENV) if not os.environ.get(n)]
    if missing:
        sys.exit(f"a service's replica runs as a trainhouse job: {', '.join(missing)} not set")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    rank = int(os.environ.get("RANK", "0"))
    root = Path.cwd() / ".serve" / f"rank-{rank}"
    root.mkdir(parents=True, exist_ok=True)
    for partial in root.glob(".v*"):  # a download an earlier process of this rank left half done
        shutil.rmtree(partial, ignore_errors=True)
    follower = Follower(
        os.environ[URL_ENV], int(os.environ[JOB_ID_ENV]), os.environ[JOB_TOKEN_ENV], rank, root
    )
    sock, follower.address = listen()
    loaded, target = follower.first()
    follower.current = loaded
    app, batcher = build_app(
        loaded,
        max_batch=int(target["max_batch"]),
        max_wait_ms=float(target["max_wait_ms"]),
        key=follower.key,
    )
    follower.batcher = batcher
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=10)
    )
    stop, started = threading.Event(), threading.Event()

    def watch_start() -> None:
        while not server.started and not stop.is_set():
            time.sleep(0.02)
        started.set()

    threading.Thread(target=watch_start, daemon=True).start()
    calls = threading.Thread(target=follower.follow, args=(stop, started), daemon=True)
    calls.start()
    log(f"serving {loaded.name}@{loaded.version} on {follower.address} (pid {os.getpid()})")
    try:
        server.run(sockets=[sock])
    finally:
        stop.set()
        calls.join(5)
        follower.http.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
