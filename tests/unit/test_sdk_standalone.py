"""The SDK outside the server: console metrics, ./checkpoints, verified loads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import trainhouse
from trainhouse.errors import CheckpointError


@pytest.fixture
def standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TRAINHOUSE_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_public_surface_is_pinned() -> None:
    assert trainhouse.__all__ == ["Histogram", "Image", "Run", "Table", "__version__", "init"]


def test_standalone_run(standalone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with trainhouse.init(hparams={"lr": 0.1}) as run:
        assert run.standalone and run.is_main
        assert (run.rank, run.local_rank, run.world_size) == (0, 0, 1)
        assert run.job_id is None
        assert run.device == torch.device("cpu")
        assert run.hparams == {"lr": 0.1}
        assert run.checkpoint.load() is None
        run.log({"loss": 1.5}, step=0)
        assert run.should_stop() is False
        model = torch.nn.Linear(3, 2)
        rec = run.checkpoint.save(
            {"model": model.state_dict(), "step": 0}, step=0, metrics={"val_loss": 0.3}
        )
        assert rec is not None and rec["step"] == 0 and len(rec["sha256"]) == 64
        state = run.checkpoint.load()
        assert state is not None and state["step"] == 0
        assert torch.equal(state["model"]["weight"], model.state_dict()["weight"])
    assert "[trainhouse] step 0: loss=1.5" in capsys.readouterr().out
    assert (standalone / "checkpoints" / "step-000000000.pt").is_file()
    assert not [p for p in (standalone / "checkpoints").iterdir() if ".tmp" in p.name]


def test_load_picks_newest_and_skips_corrupt(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.save({"step": torch.tensor(1)}, step=1)
        run.checkpoint.save({"step": torch.tensor(2)}, step=2)
        assert int(run.checkpoint.load()["step"]) == 2  # type: ignore[index]
        newest = standalone / "checkpoints" / "step-000000002.pt"
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        newest.write_bytes(bytes(data))
        state = run.checkpoint.load()
        assert state is not None and int(state["step"]) == 1


def test_load_never_unpickles_arbitrary_objects(standalone: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("echo pwned > pwned.txt",))

    with trainhouse.init() as run:
        # refused when saved, not when a restart needs it
        with pytest.raises(CheckpointError, match="cannot load safely"):
            run.checkpoint.save({"evil": Evil()}, step=3)
        assert run.checkpoint.load() is None
        assert not list((standalone / "checkpoints").glob("*"))
    # a file written by someone else is still never unpickled
    torch.save({"evil": Evil()}, standalone / "checkpoints" / "step-000000004.pt")
    with trainhouse.init() as run, pytest.raises(CheckpointError, match="only tensors"):
        run.checkpoint.load()
    assert not (standalone / "pwned.txt").exists()


def test_load_checkpoint_helper_reads_a_saved_file(standalone: Path) -> None:
    import numpy as np

    from trainhouse.sdk import load_checkpoint

    with trainhouse.init() as run:
        run.checkpoint.save({"rng": np.random.get_state(), "w": torch.ones(2)}, step=5)
    state = load_checkpoint(standalone / "checkpoints" / "step-000000005.pt")
    assert torch.equal(state["w"], torch.ones(2))


def test_log_values(standalone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    with trainhouse.init() as run:
        w = torch.ones(1, requires_grad=True)
        run.log({"t": (w * 2).sum(), "np": np.float32(0.5), "i": 3}, step=0)
        with pytest.raises(TypeError, match="metric 'name' must be a number, got str 'abc'"):
            run.log({"name": "abc"}, step=1)
        for step in range(2, 50):
            run.log({"loss": 1.0 / step}, step=step)
    out = capsys.readouterr().out
    assert "step 0: t=2 np=0.5 i=3" in out
    assert "step 49: loss=0.02041" in out  # the final values are always shown


def test_negative_step_refused(standalone: Path) -> None:
    with trainhouse.init() as run, pytest.raises(CheckpointError, match=">= 0"):
        run.checkpoint.save({}, step=-1)


def test_auto_step_and_non_finite(standalone: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with trainhouse.init() as run:
        run.log({"loss": float("nan")})  # step 0 (printed at once)
        assert "[trainhouse] step 0: loss=nan\n" in capsys.readouterr().out
        run.log({"loss": 1.0})  # step 1 (the final values: printed by the end)
    assert "[trainhouse] step 1: loss=1\n" in capsys.readouterr().out


def test_numpy_state_loads_but_object_arrays_do_not(standalone: Path) -> None:
    import random

    import numpy as np

    with trainhouse.init() as run:
        run.checkpoint.save(
            {
                "np_rng": np.random.get_state(),
                "py_rng": random.getstate(),
                "arr": np.arange(4, dtype=np.float32),
                "scalar": np.float64(0.5),
            },
            step=1,
        )
        state = run.checkpoint.load()
        assert state is not None
        assert np.array_equal(state["np_rng"][1], np.random.get_state()[1])
        assert state["py_rng"] == random.getstate()
        assert state["scalar"] == 0.5
        with pytest.raises(CheckpointError, match="cannot load safely"):
            run.checkpoint.save({"objs": np.array([object()], dtype=object)}, step=2)


def test_checkpoint_copied_without_its_record_still_loads(standalone: Path) -> None:
    (standalone / "checkpoints").mkdir()
    torch.save({"step": 41}, standalone / "checkpoints" / "step-000000041.pt")
    with trainhouse.init() as run:
        state = run.checkpoint.load()
    assert state == {"step": 41}


def test_a_broken_checkpoint_record_is_a_clear_error(standalone: Path) -> None:
    """Regression: a KeyError on the main rank left the other ranks waiting in a broadcast."""
    (standalone / "checkpoints").mkdir()
    torch.save({"step": 1}, standalone / "checkpoints" / "step-000000001.pt")
    (standalone / "checkpoints" / "step-000000001.pt.json").write_text('{"step": 1}')
    with trainhouse.init() as run, pytest.raises(CheckpointError, match="latest checkpoint"):
        run.checkpoint.load()


def test_a_resume_says_so_and_how_to_start_fresh(
    standalone: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with trainhouse.init() as run:
        assert run.checkpoint.load() is None
        run.checkpoint.save({"step": 3}, step=3)
    assert "resuming" not in capsys.readouterr().err
    with trainhouse.init() as run:  # `python train.py` again, in the same directory
        state = run.checkpoint.load()
        assert state is not None and state["step"] == 3
    err = capsys.readouterr().err
    where = standalone / "checkpoints"
    assert f"resuming from the checkpoint of step 3 that an earlier run left in {where}" in err
    assert "to start fresh, move or delete that directory" in err


def test_a_standalone_run_keeps_the_specs_default_number_of_checkpoints(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trainhouse.init() as run:
        for step in range(5):
            run.checkpoint.save({"step": step}, step=step)
    names = sorted(p.name for p in (standalone / "checkpoints").iterdir())
    assert names == [  # keep_last: 2 by default
        "step-000000003.pt",
        "step-000000003.pt.json",
        "step-000000004.pt",
        "step-000000004.pt.json",
    ]
    monkeypatch.setenv("TRAINHOUSE_KEEP_LAST", "3")
    with trainhouse.init() as run:
        run.checkpoint.save({"step": 5}, step=5)
    assert len(list((standalone / "checkpoints").glob("*.pt"))) == 3
    monkeypatch.setenv("TRAINHOUSE_KEEP_LAST", "none")
    with pytest.raises(ValueError, match="TRAINHOUSE_KEEP_LAST must be a whole number >= 1"):
        trainhouse.init()
