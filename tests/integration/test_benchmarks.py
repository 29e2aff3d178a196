"""Every benchmark in bench/ runs its quickest mode (``--smoke``) to the end, so none rots.

A benchmark is a script that prints ratios and exits 0 whatever they are; nothing here asserts
a number (these machines are noisy), only that each one still runs on today's code: it starts
its servers, its jobs and its stores, prints its report and leaves no process or temp file
behind (the suite's leak check). A new ``bench/*.py`` is picked up by itself, and must take
``--smoke``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))
# benchmarks that start a Ray cluster run on the worker of test_ray.py's, never beside it
ON_RAY = {"executors.py"}


def test_the_benchmarks_are_found() -> None:
    assert {"checkpoint.py", "load.py", "overhead.py", "scheduler.py"} <= set(BENCHMARKS)
    assert set(BENCHMARKS) >= ON_RAY


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, marks=[pytest.mark.xdist_group("ray-cluster")] if name in ON_RAY else [])
        for name in BENCHMARKS
    ],
)
def test_benchmark_smoke_mode_runs(script: str, pg_server: str) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--smoke"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    story = f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 0, f"bench/{script} --smoke exited {result.returncode}\n{story}"
    assert result.stdout.strip(), f"bench/{script} --smoke printed no report\n{story}"
    assert "Traceback (most recent call last)" not in result.stderr, story
