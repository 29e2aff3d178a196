"""Metric endpoints in process: the report route's fast path (422s, never a 500), the metrics
query with server-side downsampling and after_step, the series names, Client and CLI."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.support.api import BASE_URL, InProcessTransport
from tests.support.records import WAIT, new_job
from trainhouse.cli import options as cli_options
from trainhouse.cli.app import app as cli_app
from trainhouse.client import Client
from trainhouse.core.tokens import hash_token
from trainhouse.core.wire import CLIENT_HEADERS, encode_json
from trainhouse.lifecycle import JobState
from trainhouse.sdk._metrics import as_columns

AUTH = {"Authorization": "Bearer known"}


@pytest.fixture
def job(api: TestClient) -> int:
    """A job (ended, so the scheduler leaves it alone) whose credential is AUTH."""
    store = api.app.state.runtime.store  # type: ignore[attr-defined]
    job_id = new_job(store, spec=WAIT)  # queued until canceled: the scheduler never places it
    store.jobs.transition(job_id, JobState.CANCELED, reason="test")
    store.jobs.update(job_id, token_hash=hash_token("known"))
    return job_id


def report(api: TestClient, job: int, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return api.post(f"/api/v1/jobs/{job}/report", content=content, headers=AUTH)


def error_of(resp: httpx.Response) -> str:
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == "invalid_request", body
    return str(body["error"]["message"])


def test_malformed_reports_are_422_with_the_rule(api: TestClient, job: int) -> None:
    point = [0, "loss", 1.0, None, 1.0]
    cases: list[tuple[Any, str]] = [
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'"text"', "must be a JSON object"),
        ({"attempt": 1}, "batch_id: must be a string"),
        ({"batch_id": "b", "attempt": 0}, "attempt: must be an integer from 1"),
        ({"batch_id": "b", "attempt": 1, "points": {"a": 1}}, "points: must be a list"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "loss"]]}, "points[0]: must be"),
        ({"batch_id": "b", "attempt": 1, "points": [point, [2**63, "l", 1, None, 1]]}, "points[1]"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "x" * 257, 1, None, 1]]}, "257 char"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "l\u0000", 1, None, 1]]}, "NUL"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "l", {}, None, 1]]}, "value must be"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, "l", 1, -3, 1]]}, "rank must be"),
        ({"batch_id": "b", "attempt": 1, "points": [[0, {"n": 1}, 1, 0, 1]]}, "name must be"),
        ({"batch_id": "b", "attempt": 1, "columns": {"step": [0]}}, "columns.name"),
        ({"batch_id": "b", "attempt": 1, "points": [point] * 200_001}, "at most 200000"),
    ]
    for body, message in cases:
        resp = report(api, job, body)
        assert resp.status_code == 422, (body if len(str(body)) < 200 else message, resp.text)
        assert message in error_of(resp), (message, resp.text)
    # an integer too big for 64 bits: parsed as a float, refused as a step
    resp = report(api, job, b'{"batch_id": "b", "attempt": 1, "points": [[1e30, "l", 1, null, 1]]}')
    assert resp.status_code == 422 and "points[0]: step" in error_of(resp)
    # nothing of the refused batches was stored, nor their batch ids
    assert api.get(f"/api/v1/jobs/{job}/metrics").json()["series"] == []
    assert report(api, job, {"batch_id": "b", "attempt": 1, "points": [point]}).json() == {
        "accepted": 1,
        "stop": False,
        "stop_reason": None,
    }


def test_credentials_are_checked_before_the_body(api: TestClient, job: int) -> None:
    resp = api.post(f"/api/v1/jobs/{job}/report", content=b"{nope")
    assert resp.status_code == 401
    spec = api.get("/openapi.json").json()["paths"]["/api/v1/jobs/{job_id}/report"]["post"]
    schema = spec["requestBody"]["content"]["application/json"]["schema"]
    assert {"batch_id", "attempt", "points"} <= set(schema["properties"])


def test_the_sdks_payload_round_trips(api: TestClient, job: int) -> None:
    points = [(s, "loss", 1.0 / (s + 1), None, 100.0 + s) for s in range(5)]
    points += [(s, "loss", float("nan"), 1, 100.0 + s) for s in range(5)]
    payload = {"batch_id": "x", "attempt": 1, "columns": as_columns(points), "total_steps": 9}
    resp = api.post(f"/api/v1/jobs/{job}/report", content=encode_json(payload), headers=AUTH)
    assert resp.json()["accepted"] == 10
    data = api.get(f"/api/v1/jobs/{job}/metrics", params={"all_ranks": "true"}).json()
    assert [
        (s["name"], s["rank"], s["total_points"], s["downsampled"]) for s in data["series"]
    ] == [
        ("loss", None, 5, False),
        ("loss", 1, 5, False),
    ]
    assert data["series"][0]["points"][1] == [1, 0.5, 101.0]
    assert {p[1] for p in data["series"][1]["points"]} == {None}  # NaN is stored as null
    # a step past 64 bits cannot go through orjson: the SDK falls back, the server refuses it
    big = {"batch_id": "y", "attempt": 1, "points": [[2**70, "loss", 1.0, None, 1.0]]}
    resp = api.post(f"/api/v1/jobs/{job}/report", content=encode_json(big), headers=AUTH)
    assert resp.status_code == 422 and "step must be an integer" in error_of(resp)


def post_series(api: TestClient, job: int, steps: list[int], name: str = "loss") -> None:
    for start in range(0, len(steps), 50_000):
        chunk = steps[start : start + 50_000]
        points = [(s, name, float((s * 7919) % 1000) - 500, None, 1.0) for s in chunk]
        body = {"batch_id": f"{name}-{start}", "attempt": 1, "columns": as_columns(points)}
        assert report(api, job, body).status_code == 200


def test_metrics_downsampled_after_step_and_names(api: TestClient, job: int) -> None:
    steps = list(range(20_000))
    post_series(api, job, steps)
    post_series(api, job, list(range(0, 100, 10)), name="acc")
    url = f"/api/v1/jobs/{job}/metrics"
    full = api.get(url, params={"name": "loss"}).json()["series"][0]
    assert len(full["points"]) == 20_000 and not full["downsampled"]
    values = [p[1] for p in full["points"]]
    down = api.get(url, params={"max_points": 300}).json()["series"]
    assert [(s["name"], s["total_points"], s["downsampled"]) for s in down] == [
        ("acc", 10, False),
        ("loss", 20_000, True),
    ]
    pts = down[1]["points"]
    assert len(pts) <= 300 and pts[0][0] == 0 and pts[-1][0] == 19_999
    got = [p[1] for p in pts]
    assert min(got) == min(values) and max(got) == max(values)
    assert all(full["points"][p[0]] == p for p in pts)  # real points
    # live polling: only what came after the last step seen
    later = api.get(url, params={"after_step": 19_990, "name": "loss"}).json()["series"][0]
    assert [p[0] for p in later["points"]] == list(range(19_991, 20_000))
    assert later["total_points"] == 9
    names = api.get(f"/api/v1/jobs/{job}/metrics/names").json()
    assert names == {
        "job_id": job,
        "series": [
            {"name": "acc", "rank": None, "points": 10, "last_step": 90},
            {"name": "loss", "rank": None, "points": 20_000, "last_step": 19_999},
        ],
    }
    for params in (
        {"max_points": 3},
        {"max_points": -1},
        {"max_points": 100_001},
        {"after_step": -2},
    ):
        resp = api.get(url, params=params)
        assert resp.status_code == 422, params
        assert error_of(resp)
    assert "at least 4" in error_of(api.get(url, params={"max_points": 2}))
    assert api.get("/api/v1/jobs/999/metrics/names").status_code == 404


def test_client_and_cli_take_max_points(
    api: TestClient, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    post_series(api, job, list(range(5_000)))

    def in_process(url: str | None = None) -> Client:
        client = Client(BASE_URL)
        client._http.close()
        client._http = httpx.Client(
            base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
        )
        return client

    client = in_process()
    data = client.metrics(job, max_points=100, after_step=10)
    (series,) = data["series"]
    assert series["downsampled"] and len(series["points"]) <= 100
    assert series["points"][0][0] == 11 and series["total_points"] == 4_989
    assert client.metric_names(job) == [
        {"name": "loss", "rank": None, "points": 5_000, "last_step": 4_999}
    ]
    client.close()
    monkeypatch.setattr(cli_options, "client", in_process)
    runner = CliRunner()
    out = runner.invoke(cli_app, ["metrics", str(job), "--json", "--max-points", "50"])
    assert out.exit_code == 0, out.output
    (series,) = json.loads(out.output)["series"]
    assert len(series["points"]) <= 50 and series["total_points"] == 5_000
    table = runner.invoke(cli_app, ["metrics", str(job)])  # the summary: 1000 points read
    assert table.exit_code == 0 and "5000" in table.output and "0..4999" in table.output
