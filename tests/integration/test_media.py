"""Media end to end, against a real server: a real job logs an image, a histogram and a table
through the SDK (one the server refuses is said on the rank's log, and training goes on); a
job that writes only TensorBoard event files (images, histograms); a laptop's script that uses
only MLflow (log_image, log_table), and an image bomb it uploads refused in MLflow's shape."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.jobs import write_job
from tests.support.servers import Server
from trainhouse.core.media import HISTOGRAM_BUCKETS, PNG_SIGNATURE

pytestmark = pytest.mark.integration

SDK_JOB = """
import numpy as np
import torch
import trainhouse

with trainhouse.init() as run:
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        image = np.zeros((8, 12, 3), np.uint8)
        image[:, : 4 * (step + 1)] = (255, 0, 0)
        run.log_image("samples", image, caption=f"epoch {step}")
        weights = torch.linspace(0, step + 1, 1000)
        weights[0] = float("nan")
        run.log({"weights": trainhouse.Histogram(weights)}, step=step)
        run.log_table("preds", [[i, f"class {i + step}"] for i in range(3)], ["id", "label"])
    run.log_histogram("broken", [float("nan")] * 4, step=3)
    run.log({"loss": 0.1}, step=4)
print("done training", flush=True)
"""

TB_JOB = """
import os
import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter(os.environ["TRAINHOUSE_TENSORBOARD_DIR"])
for step in range(2):
    writer.add_image("digits", np.full((1, 5, 7), 0.5 * step, np.float32), step)
    writer.add_histogram("layer/weights", torch.arange(50, dtype=torch.float32) * (step + 1), step)
    writer.add_scalar("loss", 1.0 / (step + 1), step)
writer.close()
"""

MLFLOW = """
import numpy as np
import mlflow

mlflow.set_experiment("media")
with mlflow.start_run() as run:
    for step in range(2):
        mlflow.log_image(np.full((6, 9, 3), 40 * step, np.uint8), key="val/samples", step=step)
    mlflow.log_table(data={"text": ["a", "b"], "score": [0.5, 0.75]}, artifact_file="preds.json")
    print("run", run.info.run_id)
"""


def media(server: Server, job_id: int) -> list[dict[str, Any]]:
    resp = httpx.get(f"{server.url}/api/v1/jobs/{job_id}/media", timeout=30)
    resp.raise_for_status()
    items: list[dict[str, Any]] = resp.json()["items"]
    return items


def item_data(server: Server, job_id: int, item_id: int) -> Any:
    resp = httpx.get(f"{server.url}/api/v1/jobs/{job_id}/media/{item_id}", timeout=30)
    resp.raise_for_status()
    return resp.json()["data"]


def test_a_job_logs_an_image_a_histogram_and_a_table(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, SDK_JOB, "name: media\nentrypoint: python train.py\n")
    job = server.cli_json("submit", str(spec), "--detach")
    done = server.wait(job["id"], {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED", done
    items = media(server, job["id"])
    assert [(i["key"], i["step"], i["kind"]) for i in items] == [
        *[("preds", s, "table") for s in range(3)],
        *[("samples", s, "image") for s in range(3)],
        *[("weights", s, "histogram") for s in range(3)],
    ]
    image = items[5]
    assert (image["width"], image["height"], image["caption"]) == (12, 8, "epoch 2")
    png = httpx.get(f"{server.url}/api/v1/jobs/{job['id']}/media/{image['id']}/image")
    assert png.headers["content-type"] == "image/png" and png.content.startswith(PNG_SIGNATURE)
    assert png.headers["x-content-type-options"] == "nosniff"
    hist = item_data(server, job["id"], items[8]["id"])
    assert (hist["count"], hist["nan"], hist["max"]) == (999, 1, 3.0)
    assert len(hist["buckets"]) == HISTOGRAM_BUCKETS and sum(hist["buckets"]) == 999
    table = item_data(server, job["id"], items[1]["id"])
    assert table == {
        "columns": ["id", "label"],
        "rows": [[0, "class 1"], [1, "class 2"], [2, "class 3"]],
    }
    log = httpx.get(f"{server.url}/api/v1/jobs/{job['id']}/logs", params={"rank": 0}).text
    assert "trainhouse: histogram of 4 values 'broken' at step 3 was not stored" in log
    assert "a histogram needs finite values: all 4 are NaN or infinite" in log
    assert "done training" in log


def test_a_jobs_tensorboard_images_and_histograms(server: Server, tmp_path: Path) -> None:
    spec = write_job(tmp_path, TB_JOB, "name: tb-media\nentrypoint: python train.py\n")
    job = server.cli_json("submit", str(spec), "--detach")
    done = server.wait(job["id"], {"COMPLETED", "FAILED"})
    assert done["state"] == "COMPLETED", done
    items = media(server, job["id"])
    assert [(i["key"], i["step"], i["kind"]) for i in items] == [
        ("digits", 0, "image"),
        ("digits", 1, "image"),
        ("layer/weights", 0, "histogram"),
        ("layer/weights", 1, "histogram"),
    ]
    assert (items[1]["width"], items[1]["height"]) == (7, 5)
    hist = item_data(server, job["id"], items[3]["id"])
    assert hist["count"] == 50 and hist["max"] == pytest.approx(98.0)


def test_mlflow_log_image_and_log_table(server: Server, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINHOUSE_"))}
    env |= {"MLFLOW_TRACKING_URI": f"{server.url}/mlflow", "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", MLFLOW], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (run_id,) = [ln.split()[1] for ln in result.stdout.splitlines() if ln.startswith("run ")]
    items = media(server, int(run_id))
    assert [(i["key"], i["step"], i["kind"]) for i in items] == [
        ("preds.json", 0, "table"),
        ("val/samples", 0, "image"),
        ("val/samples", 1, "image"),
    ]
    assert (items[2]["width"], items[2]["height"]) == (9, 6)
    table = item_data(server, int(run_id), items[0]["id"])
    assert table == {"columns": ["text", "score"], "rows": [["a", 0.5], ["b", 0.75]]}

    # a bomb uploaded where log_image puts images: refused in MLflow's shape, nothing stored
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(body, zlib.crc32(kind))
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0)
    deflater = zlib.compressobj(9)
    idat = deflater.compress(b"\0" * (50 << 20)) + deflater.flush()
    bomb = PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    name = "bomb+step+5+timestamp+1700000000000+0b1f2c3d-aaaa-bbbb-cccc-123456789abc.png"
    url = f"{server.url}/mlflow/api/2.0/mlflow-artifacts/artifacts/runs/{run_id}/images/{name}"
    resp = httpx.put(url, content=bomb, timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "inflates past the 4160 bytes its header declares" in resp.json()["message"]
    assert len(media(server, int(run_id))) == 3
