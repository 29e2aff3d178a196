"""Hyperparameter searches on a real server with real trial processes: an ASHA search whose
server is SIGKILLed twice prunes, finds the best within max_concurrent, and loses and
duplicates no trial; a preempted trial resumes as the same trial without doubling its pruner
history."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import create_engine, text

from tests.support.jobs import SEARCH_TRIAL, write_job
from tests.support.servers import Databases, Server, assert_clean_stop, start_server
from trainhouse.tune.study import optuna_storage

pytestmark = pytest.mark.integration

SEARCH = """
name: tiny-search
entrypoint: python train.py
hparams:
  lr: {{log_uniform: [1.0e-4, 1.0]}}
  steps: {steps}
  delay: 0.1{hold}
search:
  method: {method}
  metric: val_loss
  mode: min
  max_trials: {trials}
  max_concurrent: {concurrent}
  early_stopping: {{method: asha, min_steps: 2, reduction_factor: 3}}
  seed: 1
"""


def search_spec(tmp_path: Path, **fields: Any) -> Path:
    hold_at = fields.pop("hold_at", None)  # the trial's first attempt holds there (SEARCH_TRIAL)
    hold = "" if hold_at is None else f"\n  hold_at: {hold_at}"
    values = {"steps": 16, "method": "tpe", "trials": 9, "concurrent": 3, "hold": hold, **fields}
    return write_job(tmp_path, SEARCH_TRIAL, SEARCH.format(**values))


def max_overlap(jobs: list[dict[str, Any]]) -> int:
    """The most attempts of these jobs that ran at the same time (from their records)."""
    edges = []
    for job in jobs:
        for attempt in job["attempt_history"]:
            edges += [(attempt["started_at"], 1), (attempt["ended_at"], -1)]
    running = most = 0
    for _at, change in sorted(edges, key=lambda e: (e[0], e[1])):
        running += change
        most = max(most, running)
    return most


def kill(srv: Server) -> None:
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()


def wait_trials(srv: Server, search_id: int, ended: int | None, timeout: float = 240) -> None:
    """Until ``ended`` trials have ended (None: until the search has)."""
    deadline = time.monotonic() + timeout
    while True:
        with srv.client as c:
            view = c.search(search_id)
        counts = view["trial_counts"]
        done = sum(counts.get(k, 0) for k in ("COMPLETED", "PRUNED", "FAILED"))
        if (view["state"] != "RUNNING") if ended is None else done >= ended:
            return
        assert time.monotonic() < deadline, view
        time.sleep(0.3)


def test_an_asha_search_survives_two_server_kills(tmp_path: Path, pg_server: str) -> None:
    """On PostgreSQL (Optuna's study in its own schema of the server's database): an ASHA
    search of 9 trials, 3 at once, whose server is SIGKILLed twice while trials run. It
    completes, prunes some, never ran more than 3 at once (the job records say), reports the
    best; exactly max_trials trials exist, each finished once, and Optuna's history of each
    matches its job's."""
    home = tmp_path / "home"
    dbs = Databases("postgresql")
    url = dbs.url_for(home)
    assert url is not None
    try:
        srv = start_server(home, "--cpus", "3", "--db", url)
        spec = search_spec(tmp_path)
        search_id = srv.cli_json("submit", str(spec), "--detach")["search_id"]
        for ended in (2, 5):
            wait_trials(srv, search_id, ended)
            kill(srv)
            srv = start_server(home, "--cpus", "3", "--db", url, port=srv.port)
        wait_trials(srv, search_id, None)
        view = srv.cli_json("search", "show", str(search_id))
        best = srv.cli_json("search", "best", str(search_id))
        assert [s["id"] for s in srv.cli_json("search", "list", "--all")] == [search_id]
        with srv.client as c:
            jobs = {t["job_id"]: c.job(t["job_id"]) for t in view["trials"]}
            series = {j: c.metrics(j, name="val_loss") for j in jobs}
            all_jobs = c.jobs(all=True)
            pruned = [t for t in view["trials"] if t["state"] == "PRUNED"]
            logs = [c.logs(t["job_id"])[0] for t in pruned]
        assert_clean_stop(srv)
        # ASHA: it pruned some, completed the others, and reports the best
        assert view["state"] == "COMPLETED"
        states = [t["state"] for t in view["trials"]]
        assert set(states) <= {"COMPLETED", "PRUNED"} and "COMPLETED" in states, view["trials"]
        # a pruned trial hears why on its next report (run.stop_reason); one pruned just before
        # a kill may run to its end while the server is down, never hearing it
        assert any("stopped at step" in log and ": pruned" in log for log in logs), logs
        assert all(t["reason"].startswith("pruned at step") for t in pruned), pruned
        done = [t for t in view["trials"] if t["state"] == "COMPLETED"]
        assert view["best"]["value"] == min(t["value"] for t in done)
        assert best["job_id"] == view["best"]["job_id"] and best["checkpoint"]["step"] == 12
        assert set(best["hparams"]) == {"lr", "steps", "delay"}
        assert max_overlap(list(jobs.values())) <= 3
        # each trial once, as a job of its own that ended once
        assert [t["number"] for t in view["trials"]] == list(range(9))
        assert len(all_jobs) == 9 and {j["id"] for j in all_jobs} == set(jobs)
        assert all(j["state"] == "COMPLETED" for j in jobs.values())
        assert {j["search_id"] for j in jobs.values()} == {search_id}
        engine = create_engine(url)
        with engine.connect() as conn:
            study = conn.execute(text("SELECT study FROM searches WHERE id = :i"), {"i": search_id})
            name = study.scalar_one()
        engine.dispose()
        storage = optuna_storage(url, home)
        trials = optuna.load_study(study_name=name, storage=storage).get_trials()
        assert [t.number for t in trials] == list(range(9))
        told = {"COMPLETE": "COMPLETED", "PRUNED": "PRUNED", "FAIL": "FAILED"}
        for frozen, trial in zip(trials, view["trials"], strict=True):
            assert told[frozen.state.name] == trial["state"]
            assert frozen.params == trial["params"]
            points = series[trial["job_id"]]["series"][0]["points"]
            reported = {p[0]: pytest.approx(p[1]) for p in points}
            if trial["state"] == "COMPLETED":
                assert frozen.intermediate_values == reported
            else:  # fed to the pruner up to the step it was pruned at
                assert frozen.intermediate_values == {
                    step: value for step, value in reported.items() if step <= frozen.last_step
                }
    finally:
        dbs.drop()


def first_trial_job(srv: Server, search_id: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    with srv.client as c:
        while True:
            searches = c.searches(all=True)  # (the submit may not have created it yet)
            if searches and (trials := c.search(search_id)["trials"]):
                return int(trials[0]["job_id"])
            assert time.monotonic() < deadline, "the search started no trial"
            time.sleep(0.2)


def test_a_preempted_trial_resumes_without_doubling_its_history(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", "--cpus", "1")
    follow: subprocess.Popen[str] | None = None
    try:
        # the trial holds at step 8 (just checkpointed) until it is preempted, however slow the
        # urgent job's submission is on a busy machine
        spec = search_spec(tmp_path, trials=1, concurrent=1, steps=20, method="random", hold_at=8)
        # `trainhouse submit` follows the search until it ends
        follow = subprocess.Popen(
            [sys.executable, "-m", "trainhouse", "submit", str(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TRAINHOUSE_URL": srv.url, "COLUMNS": "200"},
        )
        search_id = 1
        srv.wait_step(first_trial_job(srv, search_id), 6)
        high = write_job(
            tmp_path / "high",
            "print('urgent work', flush=True)\n",
            "name: urgent\nentrypoint: python train.py\npriority: high\n",
        )
        urgent = srv.cli_json("submit", str(high), "--detach")
        assert srv.wait(urgent["id"], {"COMPLETED", "FAILED"})["state"] == "COMPLETED"
        out, err = follow.communicate(timeout=300)
        assert follow.returncode == 0, out + err
        assert "submitted search 1" in out and "best: trial 0" in out, out
        assert f"dashboard: {srv.url}/#/searches/1" in out  # the search's page
        with srv.client as c:
            view = c.search(search_id)
            (trial,) = view["trials"]
            job = c.job(trial["job_id"])
            points = c.metrics(trial["job_id"], name="val_loss")["series"][0]["points"]
            curve = c._json("GET", f"/searches/{search_id}/curves")["trials"][0]
        assert [a["result"] for a in job["attempt_history"]] == ["preempted", "completed"]
        assert trial["state"] == "COMPLETED" and view["state"] == "COMPLETED"
        assert curve["steps"] == list(range(20)) == [p[0] for p in points]
        assert curve["values"] == pytest.approx([p[1] for p in points])
        assert trial["steps_reported"] == 20
        log = textwrap.dedent(srv.cli("logs", str(trial["job_id"])).stdout)
        assert "attempt 2 starts at step" in log
    finally:
        if follow is not None and follow.poll() is None:  # the test failed while it followed
            follow.kill()
            follow.communicate()
        assert_clean_stop(srv)
