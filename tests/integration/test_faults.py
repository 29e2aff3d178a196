"""Faults injected into real jobs: failures that must not be retried, and killed ranks that
must resume as if nothing had happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Server
from tests.integration.test_training import write_job

pytestmark = pytest.mark.integration


def test_a_missing_module_fails_at_once_and_show_says_why(server: Server, tmp_path: Path) -> None:
    spec = write_job(
        tmp_path,
        "import trainhouse\nimport tranformers  # a typo: retrying cannot help\n",
        "name: typo\nentrypoint: python train.py\nmax_restarts: 3\n"
        "resources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert final["state"] == "FAILED" and final["restarts"] == 0
    assert len(final["attempt_history"]) == 1
    attempt = final["attempt_history"][0]
    assert attempt["failure"] == "user" and attempt["failed_rank"] in (0, 1)
    assert "No module named 'tranformers'" in attempt["log_tail"]
    assert "not restarted: the log matches 'ModuleNotFoundError'" in final["reason"]
    shown = server.cli("show", str(job["id"])).stdout
    assert "FAILED RANK" in shown and "(code)" in shown
    assert "last lines of rank" in shown and "ModuleNotFoundError" in shown
