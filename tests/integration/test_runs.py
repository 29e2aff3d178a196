"""The runs table's contract end to end: a real server, a real rank's SDK reporting the
hparams it uses, ``submit``'s warning about a spec key the script never declares, and the
table's filters and columns through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.jobs import write_job
from tests.support.servers import Server, run_cli

pytestmark = pytest.mark.integration

SCRIPT = """\
import trainhouse

with trainhouse.init(hparams={"epochs": 2, "lr": 0.1, "optim": {"name": "adam"}}) as run:
    run.set_hparams(width=64)
    for step in range(run.hparams["epochs"] + 2):
        run.log({"val_loss": 1.0 / (step + 1)}, step=step)
"""
SPEC = "name: hp\nentrypoint: python train.py\nhparams: {epocs: 5, lr: 0.01}\n"


def test_a_run_reports_its_hparams_and_submit_warns_of_unread_keys(
    server: Server, tmp_path: Path
) -> None:
    spec = write_job(tmp_path, SCRIPT, SPEC)
    submitted = run_cli("submit", str(spec), url=server.url)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    warning = (
        "warning: hparams.epocs was set but the script's hparams are: epochs, lr, optim "
        "(did you mean 'epochs'?)"
    )
    assert warning in submitted.stdout, submitted.stdout

    listed = run_cli(
        "ps",
        "--where",
        "hparams.optim.name = adam and hparams.width >= 64 and metrics.val_loss.last < 0.3",
        "--columns",
        "metrics.val_loss.min,metrics.val_loss.max,hparams.lr",
        "--json",
        url=server.url,
    )
    assert listed.returncode == 0, listed.stderr
    (job,) = json.loads(listed.stdout)
    assert job["values"] == {
        "metrics.val_loss.min": 0.25,
        "metrics.val_loss.max": 1.0,
        "hparams.lr": 0.01,
    }
    assert job["hparams"] == {
        "epochs": 2,
        "lr": 0.01,
        "optim": {"name": "adam"},
        "epocs": 5,
        "width": 64,
    }
    shown = run_cli("show", str(job["id"]), url=server.url)
    assert "width=64" in shown.stdout and "epochs=2" in shown.stdout, shown.stdout
    log = run_cli("logs", str(job["id"]), url=server.url)
    assert f"trainhouse: {warning}" in log.stdout
