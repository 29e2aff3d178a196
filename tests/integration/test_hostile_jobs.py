"""A real job that leaves FIFOs where the server reads: the scheduler keeps starting and ending
other jobs, and a download of the FIFO is refused at once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.hostile import Fifos
from tests.support.jobs import write_job
from tests.support.servers import Server

pytestmark = pytest.mark.integration

# saves and registers a checkpoint, then swaps it for a FIFO and leaves a FIFO named like the
# record of a checkpoint it never registered (read when the server records the attempt's end)
HOSTILE = """
import os
from pathlib import Path
import trainhouse

with trainhouse.init() as run:
    run.checkpoint.save({"step": 1}, step=1)
directory = Path(os.environ["TRAINHOUSE_CHECKPOINT_DIR"])
(directory / "step-000000001.pt").unlink()
os.mkfifo(directory / "step-000000001.pt")
os.mkfifo(directory / "stray.pt.json")
print("left two FIFOs behind", flush=True)
"""


def test_a_job_that_leaves_fifos_holds_up_no_other_job(server: Server, tmp_path: Path) -> None:
    hostile = write_job(
        tmp_path / "hostile", HOSTILE, "name: hostile\nentrypoint: python train.py\n"
    )
    job = server.cli_json("submit", str(hostile), "--detach")
    directory = server.home / "jobs" / str(job["id"]) / "checkpoints"
    fifos = Fifos()
    fifos.paths = [directory / "step-000000001.pt", directory / "stray.pt.json"]
    try:
        final = server.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=120)
        assert final["state"] == "COMPLETED", final["reason"]
        with server.client as client:
            ckpt = client.checkpoints(job["id"])["checkpoints"][0]
        url = f"{server.url}/api/v1/jobs/{job['id']}/checkpoints/{ckpt['id']}/content"
        resp = httpx.get(url, timeout=10)  # the FIFO is refused, not waited on
        assert resp.status_code == 422, resp.text[:300]
        assert "FIFO" in resp.json()["error"]["message"]
        others = []
        for i in range(2):  # the scheduler still starts jobs, and records their ends
            spec = write_job(
                tmp_path / f"other-{i}", "print('hello')\n", "entrypoint: python train.py\n"
            )
            others.append(server.cli_json("submit", str(spec), "--detach")["id"])
        for other in others:
            assert server.wait(other, {"COMPLETED", "FAILED"}, timeout=120)["state"] == "COMPLETED"
        assert sorted(p.name for p in directory.iterdir()) == [
            "step-000000001.pt",
            "step-000000001.pt.json",
            "stray.pt.json",
        ]
    finally:
        fifos.release()
