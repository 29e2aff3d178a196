"""Hyperparameter searches on a real server with real trial processes: ASHA prunes and finds
the best within max_concurrent; a server SIGKILLed twice mid-search loses and duplicates no
trial; a preempted trial resumes as the same trial without doubling its pruner history."""

from __future__ import annotations

import signal
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
  delay: 0.1
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
    values = {"steps": 16, "method": "tpe", "trials": 9, "concurrent": 3, **fields}
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


def test_an_asha_search_prunes_and_reports_the_best(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", "--cpus", "3")
    try:
        spec = search_spec(tmp_path)
        followed = srv.cli("submit", str(spec), timeout=400)
        assert followed.returncode == 0, followed.stderr + followed.stdout
        assert "best: trial" in followed.stdout and "COMPLETED" in followed.stdout
        searches = srv.cli_json("search", "list", "--all")
        assert [s["name"] for s in searches] == ["tiny-search"]
        view = srv.cli_json("search", "show", str(searches[0]["id"]))
        states = [t["state"] for t in view["trials"]]
        assert len(states) == 9 and set(states) <= {"COMPLETED", "PRUNED"}, view["trials"]
        assert states.count("PRUNED") >= 1 and states.count("COMPLETED") >= 1
        with srv.client as c:
            jobs = [c.job(t["job_id"]) for t in view["trials"]]
            pruned = next(t for t in view["trials"] if t["state"] == "PRUNED")
            log = c.logs(pruned["job_id"])[0]
        assert max_overlap(jobs) <= 3
        assert {j["search_id"] for j in jobs} == {view["id"]}
        assert "stopped at step" in log and ": pruned" in log  # run.stop_reason
        assert pruned["reason"].startswith("pruned at step")
        done = [t for t in view["trials"] if t["state"] == "COMPLETED"]
        assert view["best"]["value"] == min(t["value"] for t in done)
        best = srv.cli_json("search", "best", str(view["id"]))
        assert best["job_id"] == view["best"]["job_id"] and best["checkpoint"]["step"] == 12
        assert set(best["hparams"]) == {"lr", "steps", "delay"}
    finally:
        assert_clean_stop(srv)


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


def test_a_search_survives_two_server_kills(tmp_path: Path, pg_server: str) -> None:
    """On PostgreSQL (Optuna's study in its own schema of the server's database): the server
    is SIGKILLed twice while trials run; afterwards exactly max_trials trials exist, each
    finished once, and Optuna's history of each matches its job's."""
    home = tmp_path / "home"
    dbs = Databases("postgresql")
    url = dbs.url_for(home)
    assert url is not None
    try:
        srv = start_server(home, "--cpus", "2", "--db", url)
        spec = search_spec(tmp_path, trials=5, concurrent=2)
        search_id = srv.cli_json("submit", str(spec), "--detach")["search_id"]
        for ended in (1, 3):
            wait_trials(srv, search_id, ended)
            kill(srv)
            srv = start_server(home, "--cpus", "2", "--db", url, port=srv.port)
        wait_trials(srv, search_id, None)
        with srv.client as c:
            view = c.search(search_id)
            jobs = {t["job_id"]: c.job(t["job_id"]) for t in view["trials"]}
            series = {j: c.metrics(j, name="val_loss") for j in jobs}
            all_jobs = c.jobs(all=True)
        assert_clean_stop(srv)
        assert view["state"] == "COMPLETED"
        assert [t["number"] for t in view["trials"]] == list(range(5))
        assert len(all_jobs) == 5 and {j["id"] for j in all_jobs} == set(jobs)
        assert all(j["state"] == "COMPLETED" for j in jobs.values())
        engine = create_engine(url)
        with engine.connect() as conn:
            study = conn.execute(text("SELECT study FROM searches WHERE id = :i"), {"i": search_id})
            name = study.scalar_one()
        engine.dispose()
        storage = optuna_storage(url, home)
        trials = optuna.load_study(study_name=name, storage=storage).get_trials()
        assert [t.number for t in trials] == list(range(5))
        told = {"COMPLETE": "COMPLETED", "PRUNED": "PRUNED", "FAIL": "FAILED"}
        for frozen, trial in zip(trials, view["trials"], strict=True):
            assert told[frozen.state.name] == trial["state"]
            assert frozen.params == trial["params"]
            points = series[trial["job_id"]]["series"][0]["points"]
            assert frozen.intermediate_values == {p[0]: pytest.approx(p[1]) for p in points}
    finally:
        dbs.drop()


def first_trial_job(srv: Server, search_id: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    with srv.client as c:
        while not (trials := c.search(search_id)["trials"]):
            assert time.monotonic() < deadline, "the search started no trial"
            time.sleep(0.2)
    return int(trials[0]["job_id"])


def test_a_preempted_trial_resumes_without_doubling_its_history(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "home", "--cpus", "1")
    try:
        spec = search_spec(tmp_path, trials=1, concurrent=1, steps=20, method="random")
        search_id = srv.cli_json("submit", str(spec), "--detach")["search_id"]
        srv.wait_step(first_trial_job(srv, search_id), 6)
        high = write_job(
            tmp_path / "high",
            "print('urgent work', flush=True)\n",
            "name: urgent\nentrypoint: python train.py\npriority: high\n",
        )
        urgent = srv.cli_json("submit", str(high), "--detach")
        assert srv.wait(urgent["id"], {"COMPLETED", "FAILED"})["state"] == "COMPLETED"
        wait_trials(srv, search_id, None)
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
        assert_clean_stop(srv)
