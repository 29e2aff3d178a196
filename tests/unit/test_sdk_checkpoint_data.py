"""trainhouse.sdk.data.ResumableSampler, and the digits example resuming at the exact batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainhouse.sdk.data import ResumableSampler

REPO = Path(__file__).resolve().parents[2]
DATA = list(range(103))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_order_as_distributed_sampler(drop_last: bool, shuffle: bool) -> None:
    for rank in (0, 1, 2):
        ours = ResumableSampler(DATA, 3, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        theirs = DistributedSampler(DATA, 3, rank, shuffle=shuffle, seed=7, drop_last=drop_last)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_defaults_to_one_process() -> None:
    sampler = ResumableSampler(DATA, seed=1)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert sorted(sampler) == DATA


def test_resume_mid_epoch_at_the_next_sample() -> None:
    full = {}
    for rank in (0, 1):
        s = ResumableSampler(DATA, 2, rank, seed=3)
        s.set_epoch(4)
        full[rank] = list(s)
    # each rank consumed 5 batches of 4; the loader had prefetched more: that does not count
    s = ResumableSampler(DATA, 2, 0, seed=3)
    s.set_epoch(4)
    it = iter(s)
    for _ in range(35):  # prefetching
        next(it)
    state = s.state_dict(batches_done=5, batch_size=4)
    assert state["epoch"] == 4 and state["consumed"] == 40
    for rank in (0, 1):
        resumed = ResumableSampler(DATA, 2, rank, seed=0)
        resumed.load_state_dict(state)
        resumed.set_epoch(4)  # the loop sets the same epoch again: the position stays
        assert len(resumed) == len(full[rank]) - 20
        assert list(resumed) == full[rank][20:]
        assert len(resumed) == len(full[rank])  # a second pass is a whole epoch again
        assert list(resumed) == full[rank]


def test_advance_counts_consumed_samples() -> None:
    s = ResumableSampler(DATA, 1, 0, seed=3)
    order = list(s)
    for _ in range(3):
        s.advance(10)
    state = s.state_dict()
    assert state["consumed"] == 30
    resumed = ResumableSampler(DATA, 1, 0, seed=3)
    resumed.load_state_dict(state)
    assert list(resumed) == order[30:]
    # a resumed pass counts from where it started
    resumed.advance(5)
    assert resumed.state_dict()["consumed"] == 35


def test_state_dict_of_a_resumed_pass_counts_from_its_start() -> None:
    s = ResumableSampler(DATA, 2, 1, seed=3)
    s.load_state_dict({"epoch": 0, "consumed": 40})
    iter(s)
    assert s.state_dict(batches_done=2, batch_size=5)["consumed"] == 60


def test_end_of_epoch_resumes_at_the_next_one() -> None:
    s = ResumableSampler(DATA, 2, 0, seed=3, batch_size=8)
    s.set_epoch(2)
    iter(s)
    state = s.state_dict(batches_done=100)  # more than there were: clamped
    assert (state["epoch"], state["consumed"]) == (3, 0)
    resumed = ResumableSampler(DATA, 2, 0, seed=3)
    resumed.load_state_dict(state)
    assert resumed.epoch == 3
    fresh = ResumableSampler(DATA, 2, 0, seed=3)
    fresh.set_epoch(3)
    assert list(resumed) == list(fresh)


def test_a_new_epoch_drops_a_loaded_position() -> None:
    s = ResumableSampler(DATA, 1, 0, seed=3)
    s.load_state_dict({"epoch": 1, "consumed": 50})
    s.set_epoch(2)
    assert len(s) == len(DATA) and s.state_dict()["consumed"] == 0


def test_resume_with_another_world_size_covers_the_rest() -> None:
    s = ResumableSampler(DATA, 2, 0, seed=5, drop_last=True)
    order = ResumableSampler(DATA, 1, 0, seed=5)
    iter(s)
    state = s.state_dict(samples_done=10)  # 10 per rank: the first 20 of the global order
    seen: list[int] = []
    for rank in range(3):
        r = ResumableSampler(DATA, 3, rank, seed=5, drop_last=True)
        r.load_state_dict(state)
        seen += list(r)
    rest = list(order)[20:]
    assert sorted(seen) == sorted(rest[: len(rest) // 3 * 3])


def test_a_dataloader_resumes_exactly() -> None:
    ds = TensorDataset(torch.arange(50))
    sampler = ResumableSampler(ds, seed=1)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    everything = [b[0].tolist() for b in loader]
    sampler = ResumableSampler(ds, seed=1)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    for i, _ in enumerate(loader):
        if i + 1 == 6:
            state = sampler.state_dict(batches_done=i + 1, batch_size=4)
            break
    sampler2 = ResumableSampler(ds, seed=1)
    sampler2.load_state_dict(state)
    loader2 = DataLoader(ds, batch_size=4, sampler=sampler2)
    assert [b[0].tolist() for b in loader2] == everything[6:]


def test_a_different_dataset_is_refused() -> None:
    s = ResumableSampler(DATA)
    with pytest.raises(ValueError, match="103"):
        ResumableSampler(list(range(10))).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="batch_size"):
        s.state_dict(batches_done=1)


EXAMPLE_DRIVER = textwrap.dedent(
    r"""
    import importlib.util, json, os, sys
    import torch
    from trainhouse.sdk.checkpoint import load_checkpoint
    from trainhouse.sdk import Run

    spec = importlib.util.spec_from_file_location("digits_train", sys.argv[1])
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    train.DEFAULTS.update(epochs=2)

    def run_in(directory, stop_at=None):
        os.makedirs(directory, exist_ok=True)
        os.chdir(directory)
        original_log, original_stop = Run.log, Run.should_stop
        logged = [-1]  # the last step logged

        def log(self, metrics, step=None, **kwargs):
            logged[0] = max(logged[0], step)  # the example always gives the step
            original_log(self, metrics, step, **kwargs)

        if stop_at is not None:
            Run.log = log
            Run.should_stop = lambda self: logged[0] >= stop_at
        try:
            train.main()
        finally:
            Run.log, Run.should_stop = original_log, original_stop
        os.chdir("..")

    run_in("straight")
    run_in("resumed", stop_at=30)
    mid = load_checkpoint("resumed/checkpoints/step-000000030.pt")
    run_in("resumed")
    names = sorted(os.listdir("straight/checkpoints"))
    last = [n for n in names if n.endswith(".pt")][-1]
    a = load_checkpoint(f"straight/checkpoints/{last}")
    b = load_checkpoint(f"resumed/checkpoints/{last}")
    same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    result = {"last": last, "same": same, "mid_data": mid["data"], "mid_step": mid["step"]}
    print(json.dumps(result))
    """
)


def run_example_driver(tmp_path: Path, driver: str) -> subprocess.CompletedProcess[str]:
    """``driver`` run standalone (no TRAINHOUSE_* or torchrun variables) in ``tmp_path`` with
    the example's train.py as its argument; it must exit 0."""
    (tmp_path / "driver.py").write_text(driver)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINHOUSE_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env.update(TMPDIR=str(tmp_path), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(
        [sys.executable, "driver.py", str(REPO / "examples" / "digits" / "train.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_example_resumes_at_the_exact_batch(tmp_path: Path) -> None:
    proc = run_example_driver(tmp_path, EXAMPLE_DRIVER)
    assert "stopping in epoch 0 as asked" in proc.stdout
    assert "going on at epoch 0, step 31" in proc.stdout
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mid_step"] == 30
    assert result["mid_data"]["epoch"] == 0 and result["mid_data"]["consumed"] == 31 * 32
    assert result["same"] is True, result  # bit for bit the model of an uninterrupted run


CADENCE_DRIVER = textwrap.dedent(
    r"""
    import importlib.util, json, os, sys

    spec = importlib.util.spec_from_file_location("digits_train", sys.argv[1])
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    saved = {}
    for every in (1, 2, 0):
        os.makedirs(f"every-{every}")
        os.chdir(f"every-{every}")
        train.DEFAULTS.update(epochs=4, checkpoint_epochs=every)
        train.main()
        saved[every] = sorted(n for n in os.listdir("checkpoints") if n.endswith(".pt"))
        os.chdir("..")
    print(json.dumps(saved))
    """
)


def test_the_example_checkpoints_every_nth_epoch_and_the_last(tmp_path: Path) -> None:
    """``hparams.checkpoint_epochs`` (bench/overhead.py's cadence): every Nth epoch's end and the
    last epoch's; 0: the last only (one process: 45 steps an epoch; a standalone run keeps the
    last 2)."""
    proc = run_example_driver(tmp_path, CADENCE_DRIVER)
    saved = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = {
        every: [int(n.split("-")[1].split(".")[0]) for n in names] for every, names in saved.items()
    }
    assert steps == {"1": [134, 179], "2": [89, 179], "0": [179]}, saved
