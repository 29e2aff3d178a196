"""Bring your own script, end to end: the real mlflow client (mlflow-skinny, pinned in the
``mlflow`` extra) against a real server, and the README's examples run as real jobs: a script
that uses only MLflow, one that writes only TensorBoard event files, and a plain torchrun script
that imports nothing of trainhouse, restarted from its own checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from tests.support.servers import REPO, Server, assert_clean_stop, start_server

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples"


def mlflow_env(server: Server, tmp: Path) -> dict[str, str]:
    """What a laptop's shell has: MLflow pointed at the server, quick retries (and the test's
    own temp directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINHOUSE_"))}
    return {
        **env,
        "MLFLOW_TRACKING_URI": f"{server.url}/mlflow",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "8",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp),
    }


# the artifact round trip runs in a process of its own, as on a laptop: the client keeps a thread
# pool per artifact repository (and tqdm a monitor thread) for the life of its process
ARTIFACTS = """
import json, sys
from mlflow.tracking import MlflowClient

url, run_id, payload, down = sys.argv[1:]
client = MlflowClient(tracking_uri=url)
client.log_artifact(run_id, payload, artifact_path="model")
listed = [[f.path, f.file_size] for f in client.list_artifacts(run_id, "model")]
back = client.download_artifacts(run_id, "model/weights.bin", down)
print(json.dumps({"listed": listed, "back": back}))
"""


def test_the_mlflow_client_logs_a_tracked_run(server: Server, tmp_path: Path) -> None:
    """The fluent API (the MLflow example run on a laptop), MlflowClient.log_batch with
    non-finite values, and a 10 MB artifact round trip."""
    env = mlflow_env(server, tmp_path)
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "mlflow" / "train.py")],
        env={**env, "EPOCHS": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with server.client as c:
        (job,) = [j for j in c.jobs(all=True) if j["kind"] == "tracked"]
        assert job["state"] == "COMPLETED" and job["name"] == "digits-mlp"
        detail = c.job(job["id"])
        assert detail["params"] == {"epochs": "2", "lr": "0.05", "hidden": "64"}
        series = {s["name"]: s for s in c.metrics(job["id"])["series"]}
        assert [p[0] for p in series["train/loss"]["points"]] == list(range(28))
        assert len(series["val/acc"]["points"]) == 2

    client = MlflowClient(tracking_uri=f"{server.url}/mlflow")
    exp = client.create_experiment("batches")
    run = client.create_run(exp, run_name="batch run")
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric("loss", 1.0 / (s + 1), now, s) for s in range(500)]
    metrics += [Metric("odd", float("nan"), now, 0), Metric("odd", float("inf"), now, 1)]
    client.log_batch(
        run_id,
        metrics=metrics,
        params=[Param(f"p{i}", str(i)) for i in range(100)],
        tags=[RunTag("stage", "test")],
    )
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / (s + 1)) for s in range(500)]
    odd = client.get_metric_history(run_id, "odd")
    assert [m.step for m in odd] == [0, 1] and all(m.value != m.value for m in odd)  # NaN
    payload = tmp_path / "weights.bin"
    payload.write_bytes(os.urandom(10 * 1024 * 1024))
    down = str(tmp_path / "down")
    os.mkdir(down)
    done = subprocess.run(
        [sys.executable, "-c", ARTIFACTS, f"{server.url}/mlflow", run_id, str(payload), down],
        env={**os.environ, "MLFLOW_TRACKING_URI": f"{server.url}/mlflow"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got_back = json.loads(done.stdout.strip().splitlines()[-1])
    assert got_back["listed"] == [["model/weights.bin", 10 * 1024 * 1024]]
    assert Path(got_back["back"]).read_bytes() == payload.read_bytes()
    client.set_terminated(run_id)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.data.params["p7"] == "7"
    assert got.data.tags["stage"] == "test"


LOGGER = """
import sys, time
import mlflow

mlflow.set_experiment("restart")
with mlflow.start_run() as run:
    print(run.info.run_id, flush=True)
    for step in range(int(sys.argv[1])):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        time.sleep(0.05)
"""


def test_a_server_restart_mid_run_loses_no_point(server: Server, tmp_path: Path) -> None:
    """The client retries while the server is down; every answered point was committed, so
    none is lost and none is doubled."""
    steps = 120
    script = tmp_path / "logger.py"
    script.write_text(LOGGER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(steps)],
        env=mlflow_env(server, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run_id = int(proc.stdout.readline())
        server.wait_step(run_id, 20)
        server.stop()
        time.sleep(1.0)
        server.start(timeout=60)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with server.client as c:
        points = c.metrics(run_id, name="loss")["series"][0]["points"]
        assert [p[0] for p in points] == list(range(steps))
        assert c.job(run_id)["state"] == "COMPLETED"


@pytest.fixture
def sampled_server(tmp_path: Path) -> Iterator[Server]:
    """A server sampling its jobs' resources every second."""
    srv = start_server(tmp_path / "home", "--cpus", "4", "--monitor-interval", "1")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def test_the_examples_run_as_jobs_without_the_sdk(sampled_server: Server) -> None:
    """The README's examples as real jobs: MLflow only (params become the job's hparams,
    metrics its series, the artifact its file), TensorBoard only (scalars imported by tag), and
    a bare torchrun script crashed once and resumed from its own checkpoint, monitored."""
    server = sampled_server
    with server.client as c:
        ml = c.submit(EXAMPLES / "mlflow" / "trainhouse.yaml", overrides=["env.EPOCHS=2"])
        tb = c.submit(EXAMPLES / "tensorboard" / "trainhouse.yaml", overrides=["env.EPOCHS=2"])
        bare = c.submit(EXAMPLES / "torchrun" / "trainhouse.yaml", overrides=["env.CRASH_AT=25"])
    for submitted in (ml, tb, bare):
        job = server.wait(submitted["id"], {"COMPLETED", "FAILED"}, timeout=400)
        assert job["state"] == "COMPLETED", job
    with server.client as c:
        detail = c.job(ml["id"])
        assert detail["params"] == {"epochs": "2", "lr": "0.05", "hidden": "64"}
        assert detail["kind"] == "launched"
        loss = c.metrics(ml["id"], name="train/loss")["series"][0]["points"]
        assert [p[0] for p in loss] == list(range(28))
        artifact = server.home / "jobs" / str(ml["id"]) / "artifacts" / "model" / "model.txt"
        assert "Linear" in artifact.read_text()

        tb_series = {s["name"]: s["points"] for s in c.metrics(tb["id"])["series"]}
        assert [p[0] for p in tb_series["train/loss"]] == list(range(28))
        assert [p[0] for p in tb_series["val/acc"]] == [14, 28]

        job = c.job(bare["id"])
        assert job["restarts"] == 1 and len(job["attempt_history"]) == 2
        assert job["log_ranks"] == [0, 1]
        steps = [p[0] for p in c.metrics(bare["id"], name="train/loss")["series"][0]["points"]]
        assert steps == list(range(40))  # each step once, across the two attempts
    sampled = httpx.get(f"{server.url}/api/v1/jobs/{bare['id']}/system").json()["series"]
    assert {"cpu_percent", "rss_bytes"} <= {s["name"] for s in sampled}
    logs = server.cli("logs", str(bare["id"]), "--rank", "0")
    assert "crashing at step 25" in logs.stdout and "resumes at step 20" in logs.stdout
