"""The compare page's numbers (``GET /runs/compare``) in process: each run's final, best, min,
max and last-N mean per metric, the metric's goal (a search's metric, a job's
``checkpoints.metric``, or its name) and where it came from, the refusals, who may compare
what, and the client and the ``compare`` command."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.support.api import BASE_URL, InProcessTransport, services
from tests.support.records import WAIT, new_job
from tests.support.team import Team, make_team, refused
from trainhouse.cli import options as cli_options
from trainhouse.cli import render
from trainhouse.cli.app import app as cli_app
from trainhouse.client import Client
from trainhouse.core.metricnames import goal_from_name
from trainhouse.core.records import MetricPoint
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.spec import parse_spec
from trainhouse.store import Store

SEARCH = """
name: sweep
entrypoint: python train.py
hparams: {lr: {log_uniform: [1.0e-4, 1.0e-1]}}
search: {method: random, metric: quality, mode: max, max_trials: 2}
"""


def job(store: Store, name: str = "j", **spec: object) -> int:
    """A job left queued (it waits for GPUs the test server has not)."""
    return new_job(store, name=name, spec={**WAIT, **spec})


def log(store: Store, job: int, name: str, values: list[float]) -> None:
    store.metrics.add(job, [MetricPoint(step, name, v) for step, v in enumerate(values)])


def numbers(api: TestClient, ids: list[int], **params: Any) -> dict[str, Any]:
    resp = api.get("/api/v1/runs/compare", params={"ids": ",".join(map(str, ids)), **params})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def by_name(body: dict[str, Any]) -> dict[str, Any]:
    return {m["name"]: m for m in body["metrics"]}


@pytest.mark.parametrize(
    ("name", "goal"),
    [
        ("loss", "min"),
        ("val/loss", "min"),
        ("train_error", "min"),
        ("eval-ppl", "min"),
        ("accuracy_loss", "min"),
        ("val_acc", "max"),
        ("top1_acc", "max"),
        ("acc1", "max"),
        ("eval/F1", "max"),
        ("mAP", "max"),
        ("episode_reward", "max"),
        ("lr", None),
        ("epoch", None),
        ("samples", None),
        ("lossy_codec_bits", None),  # words, not substrings
    ],
)
def test_a_metrics_goal_from_its_name(name: str, goal: str | None) -> None:
    assert goal_from_name(name) == goal


def test_the_stores_summaries_on_both_backends(store: Store) -> None:
    j = job(store)
    points = [MetricPoint(s, "loss", 10.0 - s) for s in range(8)]
    points += [MetricPoint(s, "loss", 100.0, rank=1) for s in range(12)]  # a rank's: not the job's
    points += [MetricPoint(3, "acc", math.inf), MetricPoint(5, "acc", 0.5)]
    store.metrics.add(j, points)
    got = {s.name: s for s in store.metrics.summaries(j, last=3)}
    assert list(got) == ["acc", "loss"]
    loss = got["loss"]
    assert (loss.last_step, loss.last_value, loss.min_value, loss.max_value) == (7, 3.0, 3.0, 10.0)
    assert loss.tail_mean == pytest.approx(4.0) and loss.tail_count == 3
    acc = got["acc"]  # infinity is stored as null: no value, out of the extremes and the mean
    assert (acc.last_value, acc.min_value, acc.max_value) == (0.5, 0.5, 0.5)
    assert (acc.tail_mean, acc.tail_count) == (0.5, 1)
    # a resume from step 4 drops the later points of the earlier attempt: the numbers follow
    store.metrics.add(j, [MetricPoint(5, "loss", 0.25, attempt=2)], resume=(2, 4))
    loss = {s.name: s for s in store.metrics.summaries(j, last=10)}["loss"]
    assert (loss.last_step, loss.last_value, loss.min_value, loss.max_value) == (
        5,
        0.25,
        0.25,
        10.0,
    )
    assert loss.tail_mean == pytest.approx((10 + 9 + 8 + 7 + 6 + 0.25) / 6)
    assert loss.tail_count == 6
    assert store.metrics.summaries(job(store), last=10) == []


def test_final_best_min_max_and_the_last_n_mean(api: TestClient) -> None:
    store = services(api).store
    a, b = job(store, "a"), job(store, "b")
    log(store, a, "loss", [10.0 - s for s in range(10)])  # 10 .. 1
    log(store, a, "val_acc", [0.5, 0.9, 0.7])
    log(store, a, "lr", [0.1, 0.2])
    log(store, b, "loss", [3.0, 0.5, 2.0, math.nan])  # not finite at the end: null
    store.metrics.add(b, [MetricPoint(2, "loss", 4.0)])  # logged again: replaced

    body = numbers(api, [b, a], last=3)
    assert body["job_ids"] == [b, a] and body["last"] == 3
    got = by_name(body)
    assert list(got) == ["loss", "lr", "val_acc"]
    loss = got["loss"]
    assert (loss["goal"], loss["goal_from"]) == ("min", "its name")
    assert [r["job_id"] for r in loss["runs"]] == [b, a]  # in the order asked
    rb, ra = loss["runs"]
    assert ra == {
        "job_id": a,
        "final": 1.0,
        "final_step": 9,
        "best": 1.0,
        "min": 1.0,
        "max": 10.0,
        "last_mean": pytest.approx((3.0 + 2.0 + 1.0) / 3),
        "last_count": 3,
    }
    # b's last point is NaN: no final value; the mean is of the finite ones among the last 3
    assert rb["final"] is None and rb["final_step"] == 3
    assert (rb["best"], rb["min"], rb["max"]) == (0.5, 0.5, 4.0)
    assert rb["last_mean"] == pytest.approx((0.5 + 4.0) / 2) and rb["last_count"] == 2

    acc = got["val_acc"]
    assert (acc["goal"], acc["goal_from"]) == ("max", "its name")
    assert [(r["job_id"], r["best"], r["final"]) for r in acc["runs"]] == [(a, 0.9, 0.7)]
    lr = got["lr"]  # no goal known: no best, min and max both there
    assert (lr["goal"], lr["goal_from"]) == (None, None)
    assert [(r["best"], r["min"], r["max"]) for r in lr["runs"]] == [(None, 0.1, 0.2)]

    # the default N is 10; a series shorter than N is averaged whole
    again = by_name(numbers(api, [a]))
    assert again["loss"]["runs"][0]["last_mean"] == pytest.approx(5.5)
    assert again["loss"]["runs"][0]["last_count"] == 10
    assert again["val_acc"]["runs"][0]["last_count"] == 3
    # a job without metrics is compared too: it has no rows
    empty = job(store, "empty")
    assert numbers(api, [empty])["metrics"] == []


def test_the_goal_a_search_or_the_checkpoints_state_wins_over_the_name(api: TestClient) -> None:
    store = services(api).store
    ranked = job(store, checkpoints={"keep_best": 1, "metric": "val_acc", "mode": "min"})
    log(store, ranked, "val_acc", [0.2, 0.1, 0.3])
    spec = parse_spec(SEARCH)
    search = store.searches.create(owner="ann", spec=spec, archive_sha256="0" * 64)
    trial_spec = spec.model_copy(update={"search": None, "hparams": {"lr": 0.01}})
    trial = store.searches.add_trial(search, number=0, trial_id=0, params={}, spec=trial_spec)
    assert trial is not None
    log(store, trial.job_id, "quality", [5.0, 7.0, 6.0])
    log(store, ranked, "quality", [1.0, 2.0])

    got = by_name(numbers(api, [ranked, trial.job_id]))
    assert got["val_acc"]["goal"] == "min"  # checkpoints.metric, though the name says max
    assert got["val_acc"]["goal_from"] == f"job {ranked}'s checkpoints.metric"
    assert got["val_acc"]["runs"][0]["best"] == 0.1
    quality = got["quality"]  # the name says nothing; the search maximises it
    assert (quality["goal"], quality["goal_from"]) == ("max", f"search {search.id}'s metric")
    assert [r["best"] for r in quality["runs"]] == [2.0, 7.0]


def test_refusals(api: TestClient) -> None:
    store = services(api).store
    one = job(store)
    get = lambda **params: api.get("/api/v1/runs/compare", params=params)  # noqa: E731
    for params, words in (
        ({"ids": "1,x"}, "ids must be job ids separated by commas"),
        ({"ids": ""}, "name the jobs to compare"),
        ({"ids": "0"}, "positive integers"),
        ({"ids": str(2**63)}, "positive integers"),
        ({"ids": ",".join(map(str, range(1, 52)))}, "at most 50 jobs"),
    ):
        resp = get(**params)
        assert resp.status_code == 422, (params, resp.text)
        assert words in resp.json()["error"]["message"], (params, resp.text)
    for last in (0, 100_001, "many"):
        assert get(ids=str(one), last=last).status_code == 422
    assert get(ids="1" * 1001).status_code == 422  # the query's length is bounded
    resp = get(ids=f"{one},999")
    assert resp.status_code == 404 and "999" in resp.json()["error"]["message"]
    assert numbers(api, [one, one])["job_ids"] == [one]  # a job named twice is compared once


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    yield from make_team(tmp_path, job_visibility="list")


def test_only_jobs_the_caller_may_read(team: Team) -> None:
    ids = {}
    for user in ("alice", "bob"):
        resp = team.submit(user, name=f"{user}-run")
        assert resp.status_code == 201, resp.text
        ids[user] = resp.json()["id"]
        log(team.rt.store, ids[user], "loss", [1.0, 0.5])
    both = f"{ids['alice']},{ids['bob']}"
    message = refused(team.get("alice", "/runs/compare", params={"ids": both}))
    assert f"job {ids['bob']}" in message
    assert team.get("alice", "/runs/compare", params={"ids": ids["alice"]}).status_code == 200
    assert team.get("root", "/runs/compare", params={"ids": both}).status_code == 200
    assert team.api.get("/api/v1/runs/compare", params={"ids": both}).status_code == 401


def test_the_client_and_the_compare_command(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = services(api).store
    a, b = job(store, "a"), job(store, "b")
    log(store, a, "loss", [4.0, 2.0, 3.0])
    log(store, b, "loss", [5.0, 1.0])
    log(store, b, "epoch", [0.0, 1.0])

    def in_process(url: str | None = None) -> Client:
        client = Client(BASE_URL)
        client._http.close()
        client._http = httpx.Client(
            base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
        )
        return client

    with in_process() as client:
        data = client.compare([a, b], last=2)
    assert data == numbers(api, [a, b], last=2)
    monkeypatch.setattr(cli_options, "client", in_process)
    runner = CliRunner()
    out = runner.invoke(cli_app, ["compare", str(a), str(b), "--last", "2", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == data
    out = runner.invoke(cli_app, ["compare", str(a), str(b), "-m", "loss", "--json"])
    assert [m["name"] for m in json.loads(out.output)["metrics"]] == ["loss"]
    table = runner.invoke(cli_app, ["compare", str(a), str(b), "-n", "2"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "MEAN(LAST 2)" in table.output and "loss (min, by its name)" in table.output
    rows = [ln.split()[-7:] for ln in table.output.splitlines()[1:]]
    # JOB FINAL STEP BEST MIN MAX MEAN; epoch has no goal, so no best
    assert rows == [
        [str(b), "1", "1", "-", "0", "1", "0.5"],
        [str(a), "3", "2", "2", "2", "4", "2.5"],
        [str(b), "1", "1", "1", "1", "5", "3"],
    ]
    refused_bad = runner.invoke(cli_app, ["compare", str(a), "--last", "0"])
    assert refused_bad.exit_code != 0


def test_the_compare_command_prints_metric_names_as_text(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metric's name is the job's choice: rich markup in it is printed as it is ("[/]" made
    the table fail with a traceback), a terminal's control sequence (ESC) escaped."""
    store = services(api).store
    a = job(store, "a")
    log(store, a, "val[/]loss", [1.0, 0.5])
    log(store, a, "[red]acc", [0.5, 0.75])
    log(store, a, "t\x1b]0;owned", [1.0])

    def in_process(url: str | None = None) -> Client:
        client = Client(BASE_URL)
        client._http.close()
        client._http = httpx.Client(
            base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
        )
        return client

    monkeypatch.setattr(cli_options, "client", in_process)
    monkeypatch.setattr(render.console, "width", 200)  # made once, at its import
    table = CliRunner().invoke(cli_app, ["compare", str(a)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "val[/]loss (min, by its name)" in table.output
    assert "[red]acc (max, by its name)" in table.output
    assert "\x1b" not in table.output and "t\\x1b]0;owned" in table.output
