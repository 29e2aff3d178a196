"""Searches through the API in process, over the suite's fake executor: submit and its checks,
reproducible sampling, pruning from reported values (idempotent), cancel, the job list link,
and where Optuna's tables live."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from tests.support.api import app_client, error_of, page_request, services, submit, workdir
from tests.support.fakes import FakeExecutor
from tests.support.team import make_team, refused
from trainhouse.lifecycle import StopReason
from trainhouse.store import Store
from trainhouse.tune.study import OPTUNA_SCHEMA, optuna_storage

SPEC = """
name: s
entrypoint: python train.py
hparams:
  lr: {log_uniform: [1.0e-4, 1.0e-1]}
  width: {int: [1, 2]}
  opt: {choice: [a, b]}
  epochs: 3
search: {method: random, metric: val_loss, max_trials: 4, max_concurrent: 2, seed: 3}
"""


def post_search(api: TestClient, spec: str, archive: bytes) -> Any:
    return api.post(
        "/api/v1/searches",
        data={"spec": spec, "owner": "tester"},
        files={"workdir": ("w.tar.gz", archive, "application/gzip")},
    )


def wait_for(
    api: TestClient, search_id: int, done: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = api.get(f"/api/v1/searches/{search_id}").json()
        if done(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.05)


def ended(view: dict[str, Any]) -> bool:
    return bool(view["state"] != "RUNNING")


def params_of(api: TestClient, spec: str, archive: bytes) -> list[dict[str, Any]]:
    created = post_search(api, spec, archive)
    assert created.status_code == 201, created.text
    view = wait_for(api, created.json()["id"], ended)
    return [t["params"] for t in view["trials"]]


def test_random_and_grid_searches_are_reproducible_with_their_seed(
    api: TestClient, tmp_path: Path
) -> None:
    archive = workdir(tmp_path)
    first = params_of(api, SPEC, archive)
    assert len(first) == 4
    assert params_of(api, SPEC, archive) == first
    assert params_of(api, SPEC.replace("seed: 3", "seed: 4"), archive) != first
    grid = SPEC.replace("method: random", "method: grid").replace(
        "{log_uniform: [1.0e-4, 1.0e-1]}", "0.01"
    )
    grid = grid.replace("max_trials: 4", "max_trials: 10")
    points = params_of(api, grid, archive)
    assert sorted((p["width"], p["opt"]) for p in points) == [
        (1, "a"),
        (1, "b"),
        (2, "a"),
        (2, "b"),
    ]  # the whole grid once: max_trials is capped at its size
    # the trials logged nothing: each FAILED, and the search says why, once
    view = api.get("/api/v1/searches/1").json()
    assert {t["state"] for t in view["trials"]} == {"FAILED"}
    assert view["warning"].startswith("search.metric 'val_loss' was never logged by trial")
    # each trial is an ordinary job that links to its search, its hparams filled in
    job = api.get(f"/api/v1/jobs/{view['trials'][0]['job_id']}").json()
    assert job["search_id"] == 1 and job["owner"] == "tester"
    assert job["spec"]["hparams"] == {**view["trials"][0]["params"], "epochs": 3}
    assert "search" not in job["spec"]
    listed = api.get("/api/v1/searches", params={"all": "true"}).json()["searches"]
    assert [s["id"] for s in listed] == [4, 3, 2, 1]
    assert listed[-1]["trial_counts"] == {"FAILED": 4}


def test_submit_refuses_what_could_never_run(api: TestClient, tmp_path: Path) -> None:
    archive = workdir(tmp_path)
    too_many = post_search(api, SPEC.replace("max_concurrent: 2", "max_concurrent: 3"), archive)
    assert too_many.status_code == 422
    message = error_of(too_many)["message"]
    assert "search.max_concurrent is 3, but at most 2 trial(s)" in message  # --cpus 2
    bad = post_search(api, SPEC.replace("[1.0e-4, 1.0e-1]", "[-1, 1]"), archive)
    assert bad.status_code == 422
    assert "hparams.lr: {log_uniform: ...} needs low > 0" in error_of(bad)["message"]
    as_job = submit(api, SPEC, archive)
    assert as_job.status_code == 422
    assert "POST /api/v1/searches" in error_of(as_job)["message"]
    plain = post_search(api, "entrypoint: python train.py\n", archive)
    assert plain.status_code == 422 and "no search: block" in error_of(plain)["message"]
    assert api.get("/api/v1/searches/99").status_code == 404


def report(api: TestClient, job_id: int, token: str, steps: list[int], value: float) -> Any:
    """Trial ``job_id`` reports ``value`` at each of ``steps``, in one report."""
    return report_values(api, job_id, token, steps, [value] * len(steps))


def report_values(
    api: TestClient, job_id: int, token: str, steps: list[int], values: list[float]
) -> Any:
    """Trial ``job_id`` reports ``values[i]`` at ``steps[i]``, in one report."""
    body = {
        "batch_id": uuid.uuid4().hex,
        "attempt": 1,
        "columns": {
            "step": steps,
            "name": ["val_loss"] * len(steps),
            "value": values,
            "rank": [None] * len(steps),
            "wall_time": [time.time()] * len(steps),
        },
    }
    answer = api.post(
        f"/api/v1/jobs/{job_id}/report", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_reported_values_prune_a_trial_once_per_step(tmp_path: Path) -> None:
    spec = SPEC.replace("max_trials: 4", "max_trials: 3").replace(
        "seed: 3}", "seed: 3, early_stopping: {method: asha, min_steps: 1, reduction_factor: 2}}"
    )
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id = post_search(api, spec, workdir(tmp_path)).json()["id"]
        view = wait_for(api, search_id, lambda v: v["trial_counts"].get("RUNNING") == 2)
        first, second = (t["job_id"] for t in view["trials"])
        deadline = time.monotonic() + 30
        while {first, second} - {launch.job_id for launch in fake.launches}:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        tokens = {launch.job_id: launch.env.token for launch in fake.launches}
        assert report(api, first, tokens[first], [0, 1, 2, 3], 0.1)["stop"] is False
        fake.end(first, 0)
        wait_for(api, search_id, lambda v: v["trials"][0]["state"] == "COMPLETED")
        # the pruner is fed off the request path: the next report or heartbeat learns
        answer = report(api, second, tokens[second], [0, 1, 2, 3], 5.0)
        assert answer == {"accepted": 4, "stop": False, "stop_reason": None}
        assert services(api).tune.prunes.settle()
        assert report(api, second, tokens[second], [], 5.0)["stop_reason"] == "pruned"
        # the steps again (a restarted attempt, a re-sent batch): one value per step
        assert report(api, second, tokens[second], [2, 3], 5.0)["stop"] is True
        curves = api.get(f"/api/v1/searches/{search_id}/curves").json()["trials"]
        assert curves[1]["steps"] == [0, 1, 2, 3] and curves[1]["state"] == "PRUNED"
        # the scheduler stops it as it stops a canceled job, and it ends COMPLETED, pruned
        deadline = time.monotonic() + 30
        while (second, StopReason.PRUNE) not in fake.stops:
            assert time.monotonic() < deadline, fake.stops
            time.sleep(0.02)
        fake.end(second, 0)
        view = wait_for(
            api,
            search_id,
            lambda v: (
                v["trials"][1]["state"] == "PRUNED"
                and api.get(f"/api/v1/jobs/{second}").json()["state"] == "COMPLETED"
            ),
        )
        job = api.get(f"/api/v1/jobs/{second}").json()
        # ASHA's first rung is step 1 (min_steps): the trial was compared as it reached it
        assert job["prune_requested"] and job["reason"].startswith("pruned at step 1 by asha")
        assert job["attempt_history"][-1]["result"] == "pruned"
        assert view["best"]["job_id"] == first and view["best"]["value"] == 0.1
        # cancel: no new trials, the running one is canceled
        wait_for(api, search_id, lambda v: len(v["trials"]) == 3)
        assert api.post(f"/api/v1/searches/{search_id}/cancel").status_code == 200
        third = api.get(f"/api/v1/searches/{search_id}").json()["trials"][2]["job_id"]
        deadline = time.monotonic() + 30
        while (third, StopReason.CANCEL) not in fake.stops:
            assert time.monotonic() < deadline, fake.stops
            time.sleep(0.02)
        fake.end(third, -15)
        view = wait_for(api, search_id, lambda v: v["trials"][2]["state"] == "FAILED")
        assert view["state"] == "CANCELED" and len(view["trials"]) == 3
        assert api.post(f"/api/v1/searches/{search_id}/cancel").status_code == 409
        best = api.get(f"/api/v1/searches/{search_id}/best").json()
        assert best["job_id"] == first and best["checkpoint"] is None


def test_optuna_tables_stay_out_of_trainhouse_schema(store: Store, tmp_path: Path) -> None:
    """Optuna's tables (and its alembic_version) live in a schema of their own on PostgreSQL,
    a file of their own on SQLite: trainhouse's schema check sees none of them."""
    storage = optuna_storage(store.url, tmp_path)
    import optuna

    optuna.create_study(storage=storage, study_name="isolated")
    own = set(inspect(store.engine).get_table_names())
    assert "trials" not in own and "studies" not in own
    if store.dialect == "postgresql":
        theirs = set(inspect(store.engine).get_table_names(schema=OPTUNA_SCHEMA))
        assert {"studies", "trials", "alembic_version"} <= theirs
    else:
        assert (tmp_path / "trainhouse.optuna.db").exists()
    status = store.schema_status()
    assert status.revision == status.head


def test_searches_follow_the_api_roles(tmp_path: Path) -> None:
    """Another member's token neither reads nor cancels a search, a viewer submits none, and a
    cross-site page cannot submit one; its owner and an admin can."""
    for team in make_team(tmp_path):
        assert team.api.put(
            "/api/v1/quotas/alice", json={"max_cpus": 2}, headers=team.h("root")
        ).is_success
        form = {
            "data": {"spec": SPEC, "owner": "someone-else"},
            "files": {"workdir": ("w.tar.gz", team.archive, "application/gzip")},
        }
        made = team.post("alice", "/searches", **form)
        assert made.status_code == 201, made.text
        search = made.json()
        assert search["owner"] == "alice"  # the token's user, not the name sent
        assert "viewer" in refused(team.post("vera", "/searches", **form))
        assert "belongs to another user" in refused(team.get("bob", f"/searches/{search['id']}"))
        assert "may not change it" in refused(team.post("bob", f"/searches/{search['id']}/cancel"))
        assert team.get("bob", "/searches", params={"all": "true"}).json()["searches"] == []
        cross_site = page_request(
            team.api,
            "POST",
            "/api/v1/searches",
            headers={**team.h("alice"), "Origin": "http://evil.example"},
            **form,
        )
        assert cross_site.status_code == 403, cross_site.text
        assert len(team.get("root", "/searches", params={"all": "true"}).json()["searches"]) == 1
        assert team.post("root", f"/searches/{search['id']}/cancel").status_code == 200


def test_trials_that_log_through_mlflow_or_tensorboard_are_pruned_too(tmp_path: Path) -> None:
    """A trial's objective reaches the pruner whichever way it is logged: the SDK's reports,
    MLflow's API (an MLflow-only script) or TensorBoard event files (imported); a trial the
    pruner stops is stopped by the scheduler, as any pruned trial is."""
    from torch.utils.tensorboard import SummaryWriter

    spec = (
        SPEC.replace("max_trials: 4", "max_trials: 3")
        .replace("max_concurrent: 2", "max_concurrent: 3")
        .replace(
            "seed: 3}",
            "seed: 3, early_stopping: {method: asha, min_steps: 1, reduction_factor: 2}}",
        )
    )
    with app_client(tmp_path, exit_code=None, tensorboard_interval=0, cpus=4) as api:
        rt = services(api)
        fake = rt.scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id = post_search(api, spec, workdir(tmp_path)).json()["id"]
        view = wait_for(api, search_id, lambda v: v["trial_counts"].get("RUNNING") == 3)
        first, by_mlflow, by_tensorboard = (t["job_id"] for t in view["trials"])
        deadline = time.monotonic() + 30
        while {first, by_mlflow, by_tensorboard} - {launch.job_id for launch in fake.launches}:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        tokens = {launch.job_id: launch.env.token for launch in fake.launches}
        assert report(api, first, tokens[first], [0, 1, 2, 3], 0.1)["stop"] is False
        fake.end(first, 0)
        wait_for(api, search_id, lambda v: v["trials"][0]["state"] == "COMPLETED")

        scope = f"/mlflow/jobs/{by_mlflow}/api/2.0/mlflow"
        metrics = [
            {"key": "val_loss", "value": 5.0, "timestamp": 1, "step": step} for step in range(4)
        ]
        logged = TestClient(api.app, base_url="http://127.0.0.1").post(
            f"{scope}/runs/log-batch",
            json={"run_id": str(by_mlflow), "metrics": metrics},
            headers={"Authorization": f"Bearer {tokens[by_mlflow]}"},
        )
        assert logged.status_code == 200, logged.text

        directory = rt.files(by_tensorboard).tensorboard
        writer = SummaryWriter(str(directory))
        for step in range(4):
            writer.add_scalar("val_loss", 5.0, step)
        writer.close()
        assert rt.tensorboard is not None
        rt.tensorboard.tick()

        for job_id in (by_mlflow, by_tensorboard):
            deadline = time.monotonic() + 30
            while (job_id, StopReason.PRUNE) not in fake.stops:
                assert time.monotonic() < deadline, (job_id, fake.stops)
                time.sleep(0.02)
            shown = api.get(f"/api/v1/jobs/{job_id}").json()
            assert shown["prune_requested"] and shown["reason"].startswith("pruned at step")


def run_in_turn(
    api: TestClient, fake: FakeExecutor, search_id: int, curves: list[list[float]]
) -> list[bool]:
    """Trials one after another (max_concurrent 1): trial i reports ``curves[i]`` (its
    objective at steps 0, 1, ...) and ends; whether each was told to stop."""
    stopped = []
    for i, curve in enumerate(curves):
        view = wait_for(api, search_id, lambda v, i=i: len(v["trials"]) > i)
        job_id = view["trials"][i]["job_id"]
        deadline = time.monotonic() + 30
        while job_id not in {launch.job_id for launch in fake.launches}:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        token = next(launch.env.token for launch in fake.launches if launch.job_id == job_id)
        stop = False
        for step, value in enumerate(curve):
            stop = report(api, job_id, token, [step], value)["stop"]
            if stop:
                break
            assert services(api).tune.prunes.settle()  # the pruner has seen the step
        if not stop:  # a prune at the last step: the heartbeat after it learns
            stop = report(api, job_id, token, [], 0.0)["stop"]
        stopped.append(stop)
        fake.end(job_id, 0)
        wait_for(api, search_id, lambda v, i=i: v["trials"][i]["state"] != "RUNNING")
    return stopped


@pytest.mark.parametrize("method", ["cmaes", "qmc"])
def test_cmaes_and_qmc_searches_run_to_their_end(tmp_path: Path, method: str) -> None:
    """Each sampler a spec may name runs a real search through the server: its trials get
    values from the space, the search ends with its best trial."""
    spec = SPEC.replace("method: random", f"method: {method}").replace(
        "max_concurrent: 2", "max_concurrent: 1"
    )
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id = post_search(api, spec, workdir(tmp_path)).json()["id"]
        assert run_in_turn(api, fake, search_id, [[3.0], [1.0], [2.0], [0.5]]) == [False] * 4
        view = wait_for(api, search_id, ended)
        assert (
            view["state"] == "COMPLETED"
            and [t["state"] for t in view["trials"]] == ["COMPLETED"] * 4
        )
        for trial in view["trials"]:
            assert 1.0e-4 <= trial["params"]["lr"] <= 1.0e-1 and trial["params"]["width"] in (1, 2)
        assert view["best"]["value"] == 0.5


@pytest.mark.parametrize(
    "early_stopping",
    [
        # one bracket (max_steps = min_steps): which trials share a bracket is otherwise
        # drawn from the study's (random) name
        "{method: hyperband, min_steps: 1, max_steps: 1, reduction_factor: 2}",
        "{method: median, min_steps: 1}",
    ],
)
def test_hyperband_and_median_prune_a_trial_behind_the_others(
    tmp_path: Path, early_stopping: str
) -> None:
    """Each pruner a spec may name stops a trial whose curve lags the ones before it."""
    spec = (
        SPEC.replace("max_trials: 4", "max_trials: 3")
        .replace("max_concurrent: 2", "max_concurrent: 1")
        .replace("seed: 3}", f"seed: 3, early_stopping: {early_stopping}}}")
    )
    good = [1.0, 0.5, 0.25, 0.125]
    with app_client(tmp_path, exit_code=None) as api:
        fake = services(api).scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id = post_search(api, spec, workdir(tmp_path)).json()["id"]
        stopped = run_in_turn(api, fake, search_id, [good, good, [9.0, 9.0, 9.0, 9.0]])
        assert stopped[-1] is True, stopped
        view = wait_for(api, search_id, ended)
        assert [t["state"] for t in view["trials"]][-1] == "PRUNED", view["trials"]


ASHA = SPEC.replace("max_trials: 4", "max_trials: 2").replace(
    "seed: 3}", "seed: 3, early_stopping: {method: asha, min_steps: 1, reduction_factor: 2}}"
)


def report_curve(api: TestClient, job_id: int, token: str, values: list[float]) -> Any:
    """Trial ``job_id`` reports ``values[s]`` at each step ``s``, in one report."""
    return report_values(api, job_id, token, list(range(len(values))), values)


def two_trials(
    api: TestClient, fake: FakeExecutor, archive: bytes
) -> tuple[int, list[tuple[int, str]]]:
    """An ASHA search of two trials, both started: its id and each trial's job and token."""
    search_id = post_search(api, ASHA, archive).json()["id"]
    view = wait_for(api, search_id, lambda v: v["trial_counts"].get("RUNNING") == 2)
    jobs = [t["job_id"] for t in view["trials"]]
    deadline = time.monotonic() + 30
    while set(jobs) - {launch.job_id for launch in fake.launches}:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    tokens = {launch.job_id: launch.env.token for launch in fake.launches}
    return search_id, [(j, tokens[j]) for j in jobs]


def test_a_big_report_returns_while_optunas_storage_is_held(tmp_path: Path) -> None:
    """A report of 200,000 objective points never touches Optuna in the request: it is
    answered while a lock the test holds keeps every Optuna write waiting; once the lock goes,
    the pruner's feed prunes the trial, and the next heartbeat learns it."""
    import sqlite3

    from trainhouse.tune import study as studies

    with app_client(tmp_path, exit_code=None) as api:
        rt = services(api)
        fake = rt.scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id, [(first, first_token), (second, token)] = two_trials(
            api, fake, workdir(tmp_path)
        )
        assert report_curve(api, first, first_token, [0.1] * 4)["stop"] is False
        assert rt.tune.prunes.settle()
        fake.end(first, 0)
        wait_for(api, search_id, lambda v: v["trials"][0]["state"] == "COMPLETED")

        url, _ = studies.storage_location(rt.settings.database_url, rt.settings.home)
        held = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            held.execute("BEGIN IMMEDIATE")  # Optuna's writers wait (its busy timeout: 60 s)
            answer = report_curve(api, second, token, [5.0] * 200_000)
            assert answer == {"accepted": 200_000, "stop": False, "stop_reason": None}
            assert held.in_transaction  # answered while Optuna's storage was held
        finally:
            held.rollback()
            held.close()
        assert rt.tune.prunes.settle(timeout=120)
        assert report_curve(api, second, token, [])["stop_reason"] == "pruned"
        shown = api.get(f"/api/v1/jobs/{second}").json()
        assert shown["reason"].startswith("pruned at step 1 by asha")


def test_a_big_report_writes_optuna_only_the_rungs_and_still_prunes(tmp_path: Path) -> None:
    """Optuna is written only the value at each rung a trial reaches (counted on its real
    storage's engine), and ASHA compares the trial there: a trial as good as the first up to
    step 63 and behind it from step 64 is pruned at rung 64, not at its last step."""
    from sqlalchemy import event

    with app_client(tmp_path, exit_code=None) as api:
        rt = services(api)
        fake = rt.scheduler.executor
        assert isinstance(fake, FakeExecutor)
        search_id, [(first, first_token), (second, token)] = two_trials(
            api, fake, workdir(tmp_path)
        )
        engine = rt.tune.storage._backend.engine  # type: ignore[attr-defined]
        writes: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if "trial_intermediate_values" in statement and statement.lstrip().startswith(
                ("INSERT", "UPDATE")
            ):
                writes.append(statement)

        event.listen(engine, "after_cursor_execute", count)
        assert report_curve(api, first, first_token, [1.0] * 2048)["stop"] is False
        assert rt.tune.prunes.settle()
        assert len(writes) == 11  # rungs 1, 2, 4, ..., 1024 of 2,048 steps
        fake.end(first, 0)
        wait_for(api, search_id, lambda v: v["trials"][0]["state"] == "COMPLETED")

        writes.clear()
        curve = [1.0] * 64 + [9.0] * (2048 - 64)
        assert report_curve(api, second, token, curve)["stop"] is False
        assert rt.tune.prunes.settle()
        assert len(writes) == 7  # rungs 1 to 64, where it was pruned
        assert report_curve(api, second, token, [])["stop_reason"] == "pruned"
        shown = api.get(f"/api/v1/jobs/{second}").json()
        assert shown["reason"].startswith("pruned at step 64 by asha (val_loss 9)")
        # the views show what was reported, not only what the pruner read
        curves = api.get(f"/api/v1/searches/{search_id}/curves").json()["trials"]
        assert curves[1]["steps"] == list(range(2048)) and curves[1]["values"] == curve
        event.remove(engine, "after_cursor_execute", count)
