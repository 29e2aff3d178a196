"""bench/serve.py's server side: a real ``trainhouse server`` serving the digits CNN, the way a
user gets one (the script is imported by its plain name from the benchmarks' directory).

:func:`served_model` starts a server (``trainhouse.client.serverprocess.ServerProcess``: a
temporary home, a free port, ``--cpus 2 --gpus 0``, auth off as on any loopback server),
submits the digits example (``examples/digits``, one rank, ``hparams.epochs=0``: nothing is
trained, the job saves its freshly made CNN with ``run.save_model``, as a trained one would
be), serves that version (``trainhouse serve digits-cnn@latest``: one replica, max batch 32,
5 ms, a rank of a long-running job placed by the scheduler, exactly as ``trainhouse serve``
starts one) and waits until it is ready. Predictions then go to
``POST /api/v1/services/digits-cnn/predict``, the URL users and load balancers call: the
server's own checks, its choice of replica and its forwarding, then the replica.

On the way out the service is stopped, its job waited for, and the server stopped, so that no
process stays behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _machine import log

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits" / "trainhouse.yaml"
SERVICE = "digits-cnn"
#: the job that saves the model: one rank, no epoch (its model is made, exported and registered)
SAVE_MODEL = [
    "resources.procs_per_node=1",
    "hparams.epochs=0",
    f"hparams.save_model={SERVICE}",
]


@dataclass
class Served:
    """A service of a real server: where its predictions go, and the server's process."""

    url: str  # the server's
    path: str  # POST here
    host: str  # the Host header the server answers to
    process: psutil.Process  # the server's (its CPU time per prediction)
    client: Any  # a trainhouse.client.Client of the server

    def mean_batch(self) -> float:
        """The mean batch of the service's last minute of predictions (the server's window)."""
        stats = self.client.service(SERVICE)["stats"]
        return float(stats["mean_batch"] or 0.0)

    def replica_process(self) -> psutil.Process:
        """The service's replica: the server's descendant that answers the predictions,
        ``trainhouse.serving.follow --replica`` (the rank's process is its supervisor, which
        runs it; not the launcher or the rank wrapper either)."""
        for child in self.process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                if "trainhouse.serving.follow" in argv and "--replica" in argv:
                    return child
        raise SystemExit(f"no replica process of service {SERVICE} under the server")


@contextlib.contextmanager
def served_model(work: Path, *, timeout: float = 240.0) -> Iterator[Served]:
    """A server serving the digits CNN (see the module's docstring); ``timeout`` bounds each of
    the job and the service's start."""
    from trainhouse.client import Client
    from trainhouse.client.serverprocess import ServerProcess, free_port

    began = time.monotonic()
    server = ServerProcess(work / "home", free_port(), "--cpus", "2", "--gpus", "0")
    server.start(timeout=120)
    log(f"a server at {server.url} in {time.monotonic() - began:.1f} s (log: {server.log})")
    try:
        assert server.proc is not None
        with Client(server.url) as client:
            job = client.submit(EXAMPLE, overrides=SAVE_MODEL)
            done = client.wait(job["id"], timeout=timeout, poll=0.2)
            if done["state"] != "COMPLETED":
                raise SystemExit(
                    f"the job that saves the model ended {done['state']}: {done.get('reason')}"
                )
            log(f"job {job['id']} saved the model in {time.monotonic() - began:.1f} s")
            started = client.serve(f"{SERVICE}@latest", max_batch=32, max_wait_ms=5)
            try:
                client.wait_service(SERVICE, timeout=timeout, poll=0.2)
                log(f"service {SERVICE} ready in {time.monotonic() - began:.1f} s")
                host = f"127.0.0.1:{server.port}"
                path = f"/api/v1/services/{SERVICE}/predict"
                yield Served(server.url, path, host, psutil.Process(server.proc.pid), client)
            finally:
                with contextlib.suppress(Exception):  # the server's stop ends it anyway
                    client.stop_service(SERVICE)
                    client.wait(started["job_id"], timeout=60, poll=0.2)
    finally:
        server.stop()
