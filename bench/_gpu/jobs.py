"""Jobs submitted to the check's server (``--url``), for the executor and throughput steps."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainhouse.client import Client
from trainhouse.lifecycle import TERMINAL


def submit(client: Client, workdir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``spec`` as ``workdir/job.yaml`` and submit the workdir as a user would."""
    path = workdir / "job.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return client.submit(path)


def log_text(client: Client, job_id: int) -> str:
    """Rank 0's log so far."""
    text, _, _ = client.logs(job_id, rank=0)
    return text


def wait_for_line(client: Client, job_id: int, prefix: str, timeout: float) -> str | None:
    """The first line of rank 0's log that starts with ``prefix``, waiting up to ``timeout``
    seconds (None: not within it, or the job ended without one)."""
    deadline = time.monotonic() + timeout
    while True:
        text = log_text(client, job_id)
        for line in text.splitlines():
            if line.startswith(prefix):
                return line
        if client.job(job_id)["state"] in TERMINAL or time.monotonic() > deadline:
            return None
        time.sleep(0.25)


def visible_id(client: Client, job: dict[str, Any]) -> tuple[int, str]:
    """The GPU index the job got and the ``CUDA_VISIBLE_DEVICES`` entry that names it."""
    placed = job["placement"]["nodes"][0]
    index = int(placed["gpus"][0])
    for node in client.nodes()["nodes"]:
        if node["name"] == placed["node"]:
            for gpu in node["gpus"]:
                if gpu["index"] == index:
                    return index, gpu["uuid"] or str(index)
    return index, str(index)


def offered_gpu(client: Client) -> tuple[int, str]:
    """The first GPU the server offers, and how a job's ``CUDA_VISIBLE_DEVICES`` names it."""
    gpu = client.nodes()["nodes"][0]["gpus"][0]
    return int(gpu["index"]), gpu["uuid"] or str(gpu["index"])


def tail(client: Client, job_id: int, lines: int = 15) -> str:
    return "\n".join(log_text(client, job_id).splitlines()[-lines:])
