"""Checkpoints another framework wrote, made the job's own (``sdk/checkpoint/_adopt.py``), and
what the integrations share (``integrations/_common.py``): without a server, with a registry
that keeps what it is told, as the server would."""

from __future__ import annotations

import enum
import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch

from trainhouse.errors import CheckpointError
from trainhouse.integrations._common import flat_hparams, numbers
from trainhouse.jobfs.storage import is_temp
from trainhouse.sdk.checkpoint import Checkpointer
from trainhouse.sdk.checkpoint._adopt import (
    adopt,
    commit_record,
    fetch,
    resume_choice,
    resume_point,
)
from trainhouse.sdk.checkpoint._registry import LocalRegistry


class Registry(LocalRegistry):
    """A server's registry in memory: what is registered is listed."""

    def __init__(self) -> None:
        super().__init__(attempt=1)
        self.records: list[dict[str, Any]] = []
        self.resumed: list[dict[str, Any] | None] = []

    def listed(self) -> list[dict[str, Any]] | None:
        return [dict(r) for r in self.records]

    def register(self, record: dict[str, Any], *, retry_for: float = 60.0) -> dict[str, Any]:
        registered = {**record, "id": len(self.records) + 1}
        self.records.append(registered)
        return registered

    def resume_from(self, record: dict[str, Any] | None) -> None:
        self.resumed.append(record)


def trainer_dir(root: Path, step: int) -> Path:
    """A directory as the Trainer writes one (a subdirectory too)."""
    d = root / f"checkpoint-{step}"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(os.urandom(3000) + bytes([step]))
    (d / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    (d / "sub" / "rng_state.pth").write_bytes(b"rng")
    return d


def test_a_directory_is_copied_hashed_published_and_registered(tmp_path: Path) -> None:
    registry = Registry()
    ckpt = Checkpointer(tmp_path / "job", registry=registry)
    source = trainer_dir(tmp_path / "out", 10)
    record = adopt(ckpt, source, step=10, metrics={"loss": 0.5, "nan": None})
    assert record["path"] == "step-000000010" and record["kind"] == "sharded"
    assert record["id"] == 1 and registry.records[0]["sha256"] == record["sha256"]
    assert record["metrics"] == {"loss": 0.5, "nan": None}
    storage = ckpt.storage
    assert storage.digest("step-000000010") == record["sha256"]
    assert storage.size("step-000000010") == record["size"]
    assert (tmp_path / "job" / "step-000000010" / "sub" / "rng_state.pth").read_bytes() == b"rng"
    assert storage.exists("step-000000010.json")
    assert not [n for n in storage.list() if is_temp(n)]


def test_a_file_is_published_as_a_file_checkpoint(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "job", registry=Registry())
    source = tmp_path / "epoch=0-step=5.ckpt"
    source.write_bytes(b"lightning" * 1000)
    record = adopt(ckpt, source, step=5, metrics={})
    assert record["path"] == "step-000000005.pt" and record["kind"] == "file"
    assert (tmp_path / "job" / "step-000000005.pt").read_bytes() == source.read_bytes()
    assert ckpt.storage.digest(record["path"]) == record["sha256"]


def test_links_and_missing_sources_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "job", registry=Registry())
    source = trainer_dir(tmp_path / "out", 3)
    (source / "stolen").symlink_to("/etc/hostname")
    with pytest.raises(CheckpointError, match="not a regular file"):
        adopt(ckpt, source, step=3, metrics={})
    with pytest.raises(CheckpointError, match="does not exist"):
        adopt(ckpt, tmp_path / "nothing", step=4, metrics={})
    assert ckpt.storage.list() == []


def test_resume_point_is_the_newest_verified_and_skips_a_corrupt_one(tmp_path: Path) -> None:
    registry = Registry()
    ckpt = Checkpointer(tmp_path / "job", registry=registry)
    assert resume_point(ckpt, tmp_path / "scratch") is None
    for step in (5, 10):
        adopt(ckpt, trainer_dir(tmp_path / "out", step), step=step, metrics={})
    assert resume_point(ckpt, tmp_path / "scratch") == tmp_path / "job" / "step-000000010"
    assert registry.resumed[-1] is not None and registry.resumed[-1]["step"] == 10
    (tmp_path / "job" / "step-000000010" / "trainer_state.json").write_text("tampered")
    assert resume_point(ckpt, tmp_path / "scratch") == tmp_path / "job" / "step-000000005"


def test_each_node_fetches_a_remote_checkpoint_of_its_own_and_checks_it(tmp_path: Path) -> None:
    """The main rank picks the checkpoint; each node downloads it into its own scratch
    directory (a path under another node's is not on this node's disk) and checks the copy
    against the record's sha256."""
    url = f"memory://trainhouse-test-{uuid.uuid4().hex}"
    try:
        ckpt = Checkpointer(url, registry=Registry())
        adopt(ckpt, trainer_dir(tmp_path / "out", 5), step=5, metrics={})
        chosen = resume_choice(ckpt)
        assert chosen is not None and chosen["step"] == 5
        copies = [fetch(ckpt, chosen, tmp_path / node) for node in ("node0", "node1")]
        assert copies == [tmp_path / n / "step-000000005" for n in ("node0", "node1")]
        for copy in copies:
            assert (copy / "sub" / "rng_state.pth").read_bytes() == b"rng"
        with pytest.raises(CheckpointError, match="expected 0000"):
            fetch(ckpt, {**chosen, "sha256": "0" * 64}, tmp_path / "node2")
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)


def test_an_uncommitted_copy_is_not_resumed_from_until_committed(tmp_path: Path) -> None:
    registry = Registry()
    ckpt = Checkpointer(tmp_path / "job", registry=registry)
    adopt(ckpt, trainer_dir(tmp_path / "out", 5), step=5, metrics={})
    pending = adopt(ckpt, trainer_dir(tmp_path / "out", 10), step=10, metrics={}, commit=False)
    assert "id" not in pending and not ckpt.storage.exists("step-000000010.json")
    assert resume_point(ckpt, tmp_path / "s") == tmp_path / "job" / "step-000000005"
    commit_record(ckpt, pending)
    assert resume_point(ckpt, tmp_path / "s") == tmp_path / "job" / "step-000000010"


class Mode(enum.Enum):
    FAST = "fast"


def test_hparams_are_flattened_to_scalars() -> None:
    flat = flat_hparams(
        {
            "lr": 0.1,
            "mode": Mode.FAST,
            "out": Path("/x"),
            "betas": (0.9, 0.99),
            "nested": {"a": {"b": True}},
            "none": None,
            "fn": print,
            "text": "y" * 1000,
        }
    )
    assert flat == {
        "lr": 0.1,
        "mode": "fast",
        "out": "/x",
        "betas.0": 0.9,
        "betas.1": 0.99,
        "nested.a.b": True,
        "text": "y" * 500,
    }


def test_only_numbers_are_logged() -> None:
    values = numbers(
        {
            "loss": torch.tensor(0.25),
            "acc": np.float32(0.5),
            "n": 3,
            "vec": torch.ones(2),
            "arr": np.zeros(3),
            "name": "x",
            "flag": True,
        }
    )
    assert values == {"loss": 0.25, "acc": 0.5, "n": 3.0}
