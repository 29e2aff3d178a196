"""bench/gpu_check.py's steps as tests, on a machine with a CUDA GPU (skipped on others).

The script holds the checks; each test runs one of its steps (``--only STEP``) in a child
process and passes when every item of that step does, so ``pytest tests/gpu`` and
``python bench/gpu_check.py`` cannot disagree. ``TRAINHOUSE_GPU_SMOKE=1`` runs them in the
script's CPU smoke mode instead of skipping them (about a minute; not part of ``make test``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"
SMOKE = os.environ.get("TRAINHOUSE_GPU_SMOKE") == "1"

pytestmark = pytest.mark.skipif(
    not (SMOKE or torch.cuda.is_available()),
    reason="needs a CUDA GPU (TRAINHOUSE_GPU_SMOKE=1 runs the steps' CPU smoke mode)",
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("step", ["inventory", "sdk", "fsdp", "executor", "throughput"])
def test_gpu_check_step(step: str) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", step, *(["--smoke"] if SMOKE else [])],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert ", 0 FAIL," in result.stdout, result.stdout[-6000:]  # the summary line
