"""The Hugging Face Trainer and Lightning resumed on a job of two Ray nodes whose checkpoints are
in S3 (moto's server mode, read by s3fs), the setup the README recommends for several machines.

Each node runs its rank in a directory of its own (the unpacked workdir, the attempt's
``TMPDIR``): on one machine, as here, another node's directory is on the same disk, so a rank
that read another node's copy would still train. What proves each node resumed from a copy of
its own is where each rank says it loaded the checkpoint from: under its own ``TMPDIR``. The
first attempt fails on rank 0 right after the checkpoint of step 4 is registered; the second
resumes on both ranks at step 4, with the same optimizer state (Adam's moments, non-zero).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import write_job
from tests.support.processes import marked_processes
from tests.support.raycluster import (
    RayCluster,
    agents,
    node_caches,
    ray_server,
    running_ray_cluster,
    wait_gone,
)
from tests.support.s3 import CREDENTIALS, MotoS3, fsspec_io, running_moto_s3
from tests.support.servers import Server, assert_clean_stop

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray-cluster")]
__all__ = ["fsspec_io", "node_caches"]  # fixtures of tests.support

BUCKET = "resumes"
SPEC = """
name: {name}
entrypoint: python train.py
resources: {{nodes: 2, procs_per_node: 1, cpus_per_proc: 1}}
max_restarts: 1
env: {{OMP_NUM_THREADS: "1"}}
"""

# what each rank prints once training (re)starts: where it resumed from, its own TMPDIR (in its
# node's attempt directory), the step and the sum of Adam's moments it starts with
PROBE = """
def probe(run, step, optimizer, resumed, name):
    state = optimizer.state_dict()["state"]
    moments = sum(float(s["exp_avg"].abs().sum()) for s in state.values() if "exp_avg" in s)
    rng = resumed is not None and os.path.isfile(os.path.join(str(resumed), name))
    print(
        f"PROBE rank {run.rank} attempt {run.attempt} step {step} moments {moments:.8f} "
        f"rng {rng} from {resumed} tmp {os.environ['TMPDIR']}",
        flush=True,
    )
"""

TRAINER_SCRIPT = (
    """
import os

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments,
)

import trainhouse
from trainhouse.integrations.transformers import TrainhouseCallback
"""
    + PROBE
    + """

class Tokens(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 32, (n, 8), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Probe(TrainerCallback):
    def __init__(self, run, link):
        self.run, self.link = run, link

    def on_train_begin(self, args, state, control, optimizer=None, **kw):
        name = f"rng_state_{self.run.rank}.pth"
        probe(self.run, state.global_step, optimizer, self.link.resumed, name)

    def on_save(self, args, state, control, **kw):
        # after the TrainhouseCallback (before this one) registered the checkpoint
        if self.run.attempt == 1 and self.run.rank == 0 and state.global_step == 4:
            raise RuntimeError("rank 0 gives up after step 4's checkpoint")


run = trainhouse.init()
torch.manual_seed(0)
config = BertConfig(
    vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=32, max_position_embeddings=8, num_labels=2,
)
args = TrainingArguments(
    output_dir="hf-output", max_steps=6, per_device_train_batch_size=4, learning_rate=0.01,
    logging_steps=1, save_strategy="steps", save_steps=4, seed=0, disable_tqdm=True,
    dataloader_num_workers=0, report_to="none", use_cpu=True,  # DDP over gloo
    ddp_find_unused_parameters=False,
)
callback = TrainhouseCallback(run)
trainer = Trainer(
    model=BertForSequenceClassification(config),
    args=args,
    train_dataset=Tokens(256),
    callbacks=[callback, Probe(run, callback.link)],
)
trainer.train()
"""
)

LIGHTNING_SCRIPT = (
    """
import os

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainhouse
from trainhouse.integrations.lightning import TrainhouseCallback, TrainhouseLogger
"""
    + PROBE
    + """

class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Probe(Callback):
    def __init__(self, run):
        self.run = run

    def on_train_start(self, trainer, pl_module):
        probe(self.run, trainer.global_step, trainer.optimizers[0], trainer.ckpt_path, "-")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # after the TrainhouseCallback (before this one) registered step 4's checkpoint
        if self.run.attempt == 1 and self.run.rank == 0 and trainer.global_step == 4:
            raise RuntimeError("rank 0 gives up after step 4's checkpoint")


run = trainhouse.init()
L.seed_everything(0, verbose=False)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1)
trainer = L.Trainer(
    max_steps=6,
    accelerator="cpu",
    devices=1,
    num_nodes=2,
    strategy="ddp",
    logger=TrainhouseLogger(run),
    callbacks=[
        ModelCheckpoint(dirpath="lightning-output", every_n_train_steps=4),
        TrainhouseCallback(run),
        Probe(run),
    ],
    log_every_n_steps=1,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Regressor(), DataLoader(TensorDataset(x, y), batch_size=8))
"""
)


@pytest.fixture(scope="module")
def s3(fsspec_io: None) -> Iterator[MotoS3]:
    with running_moto_s3() as store:  # its credentials in the environment the nodes inherit
        store.make_bucket(BUCKET)
        yield store


@pytest.fixture(scope="module")
def ray_cluster(s3: MotoS3) -> Iterator[RayCluster]:
    """A head and a worker of one CPU each: a job of two nodes takes both. botocore reads
    the endpoint from the environment: the raylets, and so the ranks, inherit moto's."""
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3.endpoint_url}
    with running_ray_cluster(head_cpus=1, workers={"worker_a": 1}, env=env) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("ray-resume") / "home"
    srv = ray_server(home, ray_cluster, "--checkpoint-url", f"s3://{BUCKET}/runs")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def _fail_once_and_resume(server: Server, tmp_path: Path, script: str, name: str) -> dict[str, Any]:
    """Run ``script`` on two nodes (rank 0 fails after step 4's checkpoint, the job restarts
    once); check that each rank resumed at step 4 from a copy under its own TMPDIR, both with
    the same optimizer state; what the callers check further."""
    spec = write_job(tmp_path, script, SPEC.format(name=name))
    job_id = server.cli_json("submit", str(spec), "--detach")["id"]
    final = server.wait(job_id, {"COMPLETED", "FAILED", "CANCELED"}, timeout=300)
    logs = [server.cli("logs", str(job_id), "--rank", r).stdout for r in ("0", "1")]
    assert final["state"] == "COMPLETED", (final["reason"], logs[0][-3000:], logs[1][-3000:])
    results = [h["result"] for h in final["attempt_history"]]
    assert results == ["failed", "completed"], final["attempt_history"]
    listed = server.client.checkpoints(job_id)
    assert listed["directory"].startswith(f"s3://{BUCKET}/runs/"), listed
    assert 4 in {c["step"] for c in listed["checkpoints"]}, listed

    probes: dict[int, dict[str, Any]] = {}
    for rank, log in enumerate(logs):
        first = re.search(rf"PROBE rank {rank} attempt 1 step 0 moments 0\.0+ rng False", log)
        assert first is not None, log[-3000:]
        found = re.search(
            rf"PROBE rank {rank} attempt 2 step 4 moments (\S+) rng (\S+) from (\S+) tmp (\S+)",
            log,
        )
        assert found is not None, log[-3000:]
        moments, rng, resumed, tmp = found.groups()
        # a copy of this node's own: under the TMPDIR of this rank's node and attempt
        assert Path(resumed).is_relative_to(tmp), (rank, resumed, tmp)
        assert Path(resumed).name == "step-000000004" or resumed.endswith("step-000000004.pt"), (
            resumed
        )
        probes[rank] = {"moments": float(moments), "rng": rng == "True", "tmp": tmp}
    assert probes[0]["tmp"] != probes[1]["tmp"], probes  # each node has a directory of its own
    # both ranks loaded the same optimizer state, the one trained in the first attempt
    assert probes[0]["moments"] == probes[1]["moments"] > 0, probes
    wait_gone("processes of the job", marked_processes)
    wait_gone("node agents", agents)
    return {"id": job_id, "probes": probes, "listed": listed}


def test_a_trainer_job_of_two_nodes_resumes_each_rank_from_its_nodes_copy(
    server: Server, s3: MotoS3, tmp_path: Path
) -> None:
    done = _fail_once_and_resume(server, tmp_path, TRAINER_SCRIPT, "hf-two-nodes")
    # rank 1 wrote its RNG state on its own node: it is in the job's checkpoint all the same,
    # and each rank found its own file in the copy it resumed from
    assert done["probes"][0]["rng"] and done["probes"][1]["rng"], done["probes"]
    (step4,) = [c for c in done["listed"]["checkpoints"] if c["step"] == 4]
    prefix = done["listed"]["directory"].removeprefix(f"s3://{BUCKET}/") + "/" + step4["path"]
    keys = {
        o["Key"].rsplit("/", 1)[1]
        for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    }
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "trainer_state.json"} <= keys


def test_a_lightning_job_of_two_nodes_resumes_each_rank_from_its_nodes_copy(
    server: Server, tmp_path: Path
) -> None:
    _fail_once_and_resume(server, tmp_path, LIGHTNING_SCRIPT, "lightning-two-nodes")
