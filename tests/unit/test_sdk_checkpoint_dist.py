"""run.checkpoint across processes: 2 CPU ranks over gloo (FSDP shards, per-rank RNG states,
a full disk on the main rank, background saves) and a save killed in the middle of its write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import trainhouse
from tests.support.processes import bare_env
from trainhouse.sdk.checkpoint._sharded import RNG_FILE

# Every scenario runs in one torchrun of 2 ranks (starting one costs seconds); each rank writes
# what it saw to result-RANK.json.
DIST_SCRIPT = textwrap.dedent(
    r"""
    import errno, json, os, random, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import trainhouse
    from trainhouse.errors import CheckpointError
    from trainhouse.jobfs.storage import LocalStorage

    class Limited:
        def __init__(self, fh): self.fh = fh
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")
        def flush(self): self.fh.flush()
        def close(self): self.fh.close()
        def __enter__(self): return self
        def __exit__(self, *exc): self.close()

    class FullDisk(LocalStorage):
        def open_write(self, rel):
            return Limited(super().open_write(rel))

    # what each rank hashes, and the process groups the checkpoints make
    hashed = []
    real_hash = LocalStorage.hash_files
    def hash_files(self, rel, files, **kwargs):
        files = list(files)
        hashed.append([rel, [f for f, _ in files]])
        return real_hash(self, rel, files, **kwargs)
    LocalStorage.hash_files = hash_files
    groups = []
    real_new_group = dist.new_group
    def new_group(*args, **kw):
        timeout = kw.get("timeout")
        groups.append([kw.get("backend"), timeout.total_seconds() if timeout else None])
        return real_new_group(*args, **kw)
    dist.new_group = new_group

    out = {}
    with trainhouse.init() as run:
        r = run.rank
        ck = run.checkpoint

        # 1. per-rank RNG states in a plain checkpoint
        random.seed(10 + r); np.random.seed(20 + r); torch.manual_seed(30 + r)
        ck.save({"x": torch.tensor(r)}, step=1)
        expected = [random.random(), float(np.random.rand()), float(torch.rand(1))]
        torch.rand(5)
        state = ck.load()
        out["rng_plain"] = [random.random(), float(np.random.rand()), float(torch.rand(1))]
        out["rng_expected"] = expected
        out["plain_x"] = int(state["x"])  # the main rank's state, everywhere

        # 2. FSDP shards, written by every rank, loaded in place
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        saved = {k: v.to_local().clone() for k, v in msd.items()}
        torch.manual_seed(100 + r)
        rec = ck.save({"model": msd, "optim": osd, "step": 2}, step=2, sharded=True)
        out["sharded_record"] = rec
        expected = float(torch.rand(1))
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        msd, osd = get_state_dict(model, opt)
        template = {"model": msd, "optim": osd, "step": 0}
        ck.load(template)
        set_state_dict(model, opt, model_state_dict=template["model"],
                       optim_state_dict=template["optim"])
        msd, _ = get_state_dict(model, opt)
        out["sharded_equal"] = all(torch.equal(saved[k], msd[k].to_local()) for k in saved)
        out["sharded_step"] = template["step"]
        out["sharded_rng"] = [float(torch.rand(1)), expected]
        out["sharded_hashed"] = list(hashed)
        out["serial_digest"] = LocalStorage("checkpoints").digest("step-000000002")
        try:
            ck.load()
        except CheckpointError as exc:
            out["no_template"] = str(exc)

        # 3. sharded, in the background (its own gloo group); the loop changes the tensors
        msd, osd = get_state_dict(model, opt)
        at_save = {k: v.to_local().clone() for k, v in msd.items()}
        handle = ck.save({"model": msd, "optim": osd, "step": 3}, step=3, sharded=True,
                         blocking=False)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        ck.wait()
        msd, osd = get_state_dict(model, opt)
        template = {"model": msd, "optim": osd, "step": 0}
        ck.load(template)
        out["async_sharded_equal"] = all(
            torch.equal(at_save[k], template["model"][k].to_local()) for k in at_save
        )
        out["async_sharded_step"] = template["step"]

        # 4. the main rank's disk is full: every rank raises, the last checkpoint stays
        ck.storage = FullDisk(ck.storage.root)
        try:
            ck.save({"x": torch.zeros(1000)}, step=4)
        except CheckpointError as exc:
            out["full"] = str(exc)
        # ... and in the background: the next collective call raises on every rank
        ck.save({"x": torch.zeros(1000)}, step=5, blocking=False)
        try:
            ck.wait()
        except CheckpointError as exc:
            out["full_async"] = str(exc)
        ck.storage = LocalStorage(ck.storage.root)
        template = {"model": msd, "optim": osd, "step": 0}
        ck.load(template)
        out["after_full_step"] = template["step"]
    out["files"] = sorted(os.listdir("checkpoints"))
    out["groups"] = groups
    with open(f"result-{r}.json", "w") as fh:
        json.dump(out, fh)
    """
)


# one torchrun of two ranks serves the module: under pytest-xdist its tests stay on one worker
pytestmark = pytest.mark.xdist_group("two-ranks")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("two-ranks")
    (tmp / "scenarios.py").write_text(DIST_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "scenarios.py",
        ],
        cwd=tmp,
        env=bare_env(tmp),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((tmp / f"result-{r}.json").read_text()) for r in (0, 1)]


def test_each_rank_gets_its_own_rng_state_back(two_ranks: list[dict[str, Any]]) -> None:
    for out in two_ranks:
        assert out["rng_plain"] == out["rng_expected"]
        assert out["plain_x"] == 0
        assert out["sharded_rng"][0] == out["sharded_rng"][1]
    assert two_ranks[0]["rng_expected"] != two_ranks[1]["rng_expected"]


def test_fsdp_shards_round_trip(two_ranks: list[dict[str, Any]]) -> None:
    rec = two_ranks[0]["sharded_record"]
    assert rec["kind"] == "sharded" and rec["path"] == "step-000000002"
    assert len(rec["sha256"]) == 64 and rec["size"] > 0
    assert two_ranks[1]["sharded_record"] is None
    for out in two_ranks:
        assert out["sharded_equal"] is True and out["sharded_step"] == 2
        assert "pass the state to load into" in out["no_template"]


def test_background_sharded_save_keeps_the_values_at_the_call(
    two_ranks: list[dict[str, Any]],
) -> None:
    for out in two_ranks:
        assert out["async_sharded_equal"] is True and out["async_sharded_step"] == 3


def test_full_disk_raises_on_every_rank(two_ranks: list[dict[str, Any]]) -> None:
    for out in two_ranks:
        assert "the disk is full (No space left on device)" in out["full"]
        assert "step-000000004.pt" in out["full"] and "bytes free" in out["full"]
        assert "step-000000003 (step 3) is intact" in out["full"]
        assert "the disk is full (No space left on device)" in out["full_async"]
        assert out["after_full_step"] == 3
    files = two_ranks[0]["files"]
    assert not [
        f for f in files if ".tmp-" in f or f.startswith(("step-000000004", "step-000000005"))
    ]
    assert "step-000000003" in files and "step-000000003.json" in files


KILL_SCRIPT = textwrap.dedent(
    r"""
    import sys, time
    import torch
    import trainhouse
    from trainhouse.jobfs.storage import LocalStorage

    class Stalling:
        def __init__(self, fh): self.fh = fh; self.n = 0
        def write(self, data):
            n = self.fh.write(data)
            self.fh.flush()
            self.n += 1
            if self.n == 3:  # part of the checkpoint is on disk: the parent kills us now
                print("WRITING", flush=True)
                time.sleep(600)
            return n
        def flush(self): self.fh.flush()
        def close(self): self.fh.close()
        def __enter__(self): return self
        def __exit__(self, *exc): self.close()

    class Slow(LocalStorage):
        def open_write(self, rel):
            return Stalling(super().open_write(rel))

    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.zeros(3)}, step=1)
        run.checkpoint.storage = Slow(run.checkpoint.storage.root)
        run.checkpoint.save({"w": torch.ones(1_000_000)}, step=2, blocking=False)
        time.sleep(600)
    """
)


def test_a_killed_background_save_is_never_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, "kill.py"],
        cwd=tmp_path,
        env=bare_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "WRITING", line + proc.stdout.read()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    ckpts = tmp_path / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir())
    temps = [n for n in names if ".tmp-" in n]
    assert len(temps) == 1 and (ckpts / temps[0]).stat().st_size > 0  # killed mid-write
    assert [n for n in names if n not in temps] == ["step-000000001.pt", "step-000000001.pt.json"]

    for var in ("TRAINHOUSE_JOB_ID", "RANK", "WORLD_SIZE", "TRAINHOUSE_CHECKPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    with trainhouse.init() as run:
        state = run.checkpoint.load()
    assert state is not None and torch.equal(state["w"], torch.zeros(3))
    # the dead process's temp file is swept
    assert sorted(p.name for p in ckpts.iterdir()) == [
        "step-000000001.pt",
        "step-000000001.pt.json",
    ]


def test_checkpoints_coordinate_on_gloo_with_a_long_timeout(
    two_ranks: list[dict[str, Any]],
) -> None:
    """Issue 20, item 2: the ranks wait for a checkpoint's writer (or hasher) on gloo groups of
    the checkpoints' own, with hours of timeout, never on the job's NCCL group (10 minutes)."""
    from trainhouse.sdk.checkpoint._support import WAIT_TIMEOUT

    for out in two_ranks:
        # one for the checkpoints' collectives, one for background saves
        assert out["groups"] == [["gloo", WAIT_TIMEOUT.total_seconds()]] * 2


def test_sharded_checkpoints_are_hashed_by_every_rank_in_parallel(
    two_ranks: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 20, item 2: on save and again when verified for a load, each rank hashes its share
    of a sharded checkpoint's files (not the main rank alone), and the digest is the tree digest
    of them all."""
    save: list[set[str]] = []
    load: list[set[str]] = []
    for out in two_ranks:
        hashed = out["sharded_hashed"]
        save.append({f for rel, files in hashed if rel.startswith(".") for f in files})
        load.append({f for rel, files in hashed if rel == "step-000000002" for f in files})
    for shares in (save, load):
        assert all(shares) and not shares[0] & shares[1]  # both ranks, nothing twice
        assert shares[0] | shares[1] == {".metadata", RNG_FILE, "__0_0.distcp", "__1_0.distcp"}
    record = two_ranks[0]["sharded_record"]
    assert record["sha256"] == two_ranks[0]["serial_digest"]  # what one hasher alone computes
