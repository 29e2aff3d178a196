"""bench/overhead.py's bare worker trains the digits example as it is today."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "overhead.py"
EXAMPLE = REPO / "examples" / "digits" / "train.py"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOUSE_")}
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE="1", RANK="0", TMPDIR=str(cwd))
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def test_the_bare_worker_runs_the_example_with_the_sdks_helpers(tmp_path: Path) -> None:
    # the example imports trainhouse.sdk.data: a stub in place of the trainhouse package broke
    # it (ModuleNotFoundError), and train_epoch returns four values now, not three
    hparams = json.dumps({"epochs": 1})
    args = [str(BENCH), "--bare-worker", "--train-py", str(EXAMPLE), "--hparams", hparams]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("OVERHEAD_BARE_RESULT "))
    rates = json.loads(line.split(" ", 1)[1])["rates"]
    assert len(rates) == 1 and rates[0] > 0


def test_the_bare_worker_cannot_start_a_run(tmp_path: Path) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH.parent)!r}); import overhead\n"
        f"example = overhead._load_example(__import__('pathlib').Path({str(EXAMPLE)!r}))\n"
        "try:\n    example.trainhouse.init(hparams={})\n"
        "except RuntimeError as exc:\n    print('refused:', exc)\n"
    )
    result = _run(["-c", code], tmp_path)
    assert "refused: the bare benchmark must not start a trainhouse run" in result.stdout, (
        result.stdout + result.stderr[-3000:]
    )


def test_the_sdk_worker_runs_the_example_through_the_sdk_standalone(tmp_path: Path) -> None:
    # the benchmark's third side: the example's own main() with the benchmark's hparams, its
    # checkpoints written by the SDK where a standalone run keeps them, its rates from run.log
    hparams = json.dumps({"epochs": 2, "checkpoint_epochs": 1})
    args = [str(BENCH), "--sdk-worker", "--train-py", str(EXAMPLE), "--hparams", hparams]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("OVERHEAD_BARE_RESULT "))
    rates = json.loads(line.split(" ", 1)[1])["rates"]
    assert len(rates) == 2 and min(rates) > 0
    assert "[trainhouse] step 0: " in result.stdout  # the standalone run's console sink
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir())  # the SDK's own files
