"""``trainhouse search`` and ``ps`` as a user reads them (a fake client answers as the server
does): an empty list says how to see ended searches, a trial with nothing reported yet shows
``-`` (not ``nan``), ``search best`` names the command that downloads its checkpoint, and a
trial its pruner stopped is PRUNED in ``ps`` and ``show``."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from trainhouse.cli.app import app

SEARCH = {
    "id": 3,
    "name": "s",
    "owner": "ann",
    "state": "RUNNING",
    "reason": None,
    "warning": None,
    "method": "tpe",
    "early_stopping": "asha",
    "metric": "val_loss",
    "mode": "min",
    "max_trials": 4,
    "max_concurrent": 2,
    "created_at": 1.0,
    "trial_counts": {"RUNNING": 1, "COMPLETED": 1},
    "best": None,
}
TRIAL = {
    "number": 0,
    "job_id": 7,
    "state": "RUNNING",
    "params": {"lr": 0.01, "opt": "adam"},
    "value": None,
    "latest": None,
    "best": None,
    "last_step": None,
    "steps_reported": 0,
    "reason": None,
    "duration": None,
}
JOB = {
    "id": 7,
    "name": "trial",
    "owner": "ann",
    "state": "COMPLETED",
    "priority": "normal",
    "spec": {"resources": {"nodes": 1, "procs_per_node": 1}},
    "last_step": 3,
    "created_at": 1.0,
    "reason": "pruned at step 3 by asha",
}


class Fake:
    url = "http://x"

    def __init__(self, searches: list[Any], jobs: list[Any]) -> None:
        self.found = searches
        self.listed = jobs

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def searches(self, all: bool = False) -> list[Any]:
        return [s for s in self.found if all or s["state"] == "RUNNING"]

    def search(self, search_id: int) -> dict[str, Any]:
        return {**SEARCH, "spec": {}, "trials": [TRIAL, {**TRIAL, "number": 1, "job_id": 8,
                "state": "COMPLETED", "value": 0.5, "latest": 0.5, "best": 0.4,
                "last_step": 9}]}  # fmt: skip

    def search_best(self, search_id: int) -> dict[str, Any]:
        return {"search_id": search_id, "trial": 1, "job_id": 8, "metric": "val_loss",
                "value": 0.4, "params": {"lr": 0.01}, "hparams": {"lr": 0.01},
                "checkpoint": {"id": 5, "step": 12, "path": "/c/12.pt"}}  # fmt: skip

    def jobs(self, **kw: Any) -> list[Any]:
        return self.listed

    def job(self, job_id: int) -> dict[str, Any]:
        return self.listed[0]


def run(monkeypatch: pytest.MonkeyPatch, fake: Fake, *args: str) -> str:
    monkeypatch.setattr("trainhouse.cli.options.client", lambda url: fake)
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_an_empty_search_list_says_how_to_see_ended_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = {**SEARCH, "state": "COMPLETED"}
    out = run(monkeypatch, Fake([ended], []), "search", "list")
    assert out.strip() == "no searches running (--all shows ended ones)"
    assert "COMPLETED" in run(monkeypatch, Fake([ended], []), "search", "list", "--all")
    assert run(monkeypatch, Fake([], []), "search", "list", "--all").strip() == "no searches"


def test_a_trial_with_nothing_reported_shows_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, Fake([SEARCH], []), "search", "show", "3")
    assert "nan" not in out
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    running = next(r for r in rows if r[2] == "RUNNING")
    assert running[:8] == ["0", "7", "RUNNING", "0.01", "adam", "-", "-", "-"]
    done = next(r for r in rows if r[2] == "COMPLETED")
    assert done[:8] == ["1", "8", "COMPLETED", "0.01", "adam", "0.5", "0.4", "9"]


def test_search_best_names_the_download_command(monkeypatch: pytest.MonkeyPatch) -> None:
    out = run(monkeypatch, Fake([SEARCH], []), "search", "best", "3")
    assert "trainhouse checkpoints 8 --download 12 DIR" in out


def test_a_pruned_trial_is_pruned_in_ps_and_show(monkeypatch: pytest.MonkeyPatch) -> None:
    pruned = {**JOB, "prune_requested": True}
    listed = run(monkeypatch, Fake([], [pruned]), "ps", "--all")
    row = next(line for line in listed.splitlines() if line.split()[:1] == ["7"])
    assert row.split()[3] == "PRUNED", listed
    plain = run(monkeypatch, Fake([], [{**JOB, "prune_requested": False}]), "ps", "--all")
    assert "PRUNED" not in plain and "COMPLETED" in plain
