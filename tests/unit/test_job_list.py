"""The paginated job list the dashboard reads: Store.list_jobs/count_jobs and GET /api/v1/jobs,
on 10,000 jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from tests.support.api import app_client
from trainhouse.errors import StoreError
from trainhouse.lifecycle import JobState
from trainhouse.store import Store
from trainhouse.store import tables as t

N = 10_000
TIERS = ("low", "normal", "high", "urgent")
# mostly ended jobs, so that the scheduler of the in-process server has little to plan
STATES = [JobState.COMPLETED, JobState.FAILED, JobState.CANCELED, JobState.COMPLETED]


def row(i: int) -> dict[str, Any]:
    """Job i (1-based): owners in turn, names that sort apart from the ids, states cycling."""
    now = 1_700_000_000.0 + i
    return {
        "name": f"{'Sweep' if i % 10 == 0 else 'train'}-{(N - i):05d}",
        "owner": ("alice", "bob", "carol")[i % 3],
        "state": str(JobState.QUEUED if i % 100 == 0 else STATES[i % 4]),
        "priority": TIERS[i % 4],
        "spec": {"entrypoint": "python train.py", "resources": {"procs_per_node": 1}},
        "archive_sha256": "0" * 64,
        "created_at": now,
        "updated_at": now,
        "attempts": 0,
        "restarts": 0,
        "cancel_requested": False,
        "preempt_requested": False,
    }


def fill(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(insert(t.jobs), [row(i) for i in range(1, N + 1)])


def test_pages_filters_and_sorts_in_sql(store: Store) -> None:
    fill(store)
    everything = store.jobs.count()
    assert everything == N

    page = store.jobs.list(limit=50, offset=100)
    assert [j.id for j in page] == list(range(N - 100, N - 150, -1))  # newest first

    ascending = store.jobs.list(limit=3, sort="id", order="asc")
    assert [j.id for j in ascending] == [1, 2, 3]

    by_name = store.jobs.list(limit=2, sort="name", order="asc")
    assert [j.name for j in by_name] == ["Sweep-00000", "Sweep-00010"]

    # priority sorts by tier (urgent above high above normal above low), ties newest first
    top = store.jobs.list(limit=3, sort="priority", order="desc")
    assert [j.priority for j in top] == ["urgent"] * 3
    assert [j.id for j in top] == [N - 1, N - 5, N - 9]
    bottom = store.jobs.list(limit=1, sort="priority", order="asc")
    assert bottom[0].priority == "low" and bottom[0].id == 4

    # pages taken one after another never repeat or skip a job, whatever the sort
    for sort in ("state", "owner", "created_at"):
        seen = []
        for offset in range(0, N, 2500):
            seen += [j.id for j in store.jobs.list(limit=2500, offset=offset, sort=sort)]
        assert sorted(seen) == list(range(1, N + 1)), sort

    # filters: owner exact, name a case-insensitive substring, states; count agrees
    bobs = store.jobs.list(owner="bob", limit=N)
    assert {j.owner for j in bobs} == {"bob"} and store.jobs.count(owner="bob") == len(bobs)
    sweeps = store.jobs.count(name="sWEEP")
    assert sweeps == N // 10
    queued = store.jobs.list(states=[JobState.QUEUED], owner="alice", name="sweep", limit=N)
    assert queued and all(j.state is JobState.QUEUED and j.owner == "alice" for j in queued)
    assert store.jobs.count(states=[JobState.QUEUED], owner="alice", name="sweep") == len(queued)
    assert store.jobs.count(name="%") == 0 and store.jobs.count(name="_") == 0  # not wildcards
    assert store.jobs.count(owner="nobody") == 0

    with pytest.raises(StoreError, match="sort by one of"):
        store.jobs.list(sort="spec")  # type: ignore[arg-type]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    # no user may use a CPU: the queued jobs of this test wait, nothing is started
    with app_client(tmp_path, tick=0.5, quota_cpus=0) as client:
        fill(client.app.state.runtime.store)  # type: ignore[attr-defined]
        yield client


def get(api: TestClient, **params: Any) -> Any:
    resp = api.get("/api/v1/jobs", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_api_pages_ten_thousand_jobs(api: TestClient) -> None:
    page = get(api, all="true", limit=50, offset=200)
    assert len(page["jobs"]) == 50 and page["total"] == N
    assert [j["id"] for j in page["jobs"]] == list(range(N - 200, N - 250, -1))
    last = get(api, all="true", limit=50, offset=N - 20)
    assert len(last["jobs"]) == 20 and last["total"] == N
    beyond = get(api, all="true", limit=50, offset=N + 50)
    assert beyond["jobs"] == [] and beyond["total"] == N

    # without all/state: the jobs that have not ended, as `trainhouse ps` shows them
    active = get(api, limit=1000)
    assert active["total"] == N // 100 == len(active["jobs"])
    assert {j["state"] for j in active["jobs"]} == {"QUEUED"}
    assert get(api, state=["FAILED", "CANCELED"], limit=1)["total"] == N // 2

    named = get(api, all="true", name="sweep", owner="bob", sort="name", order="desc", limit=5)
    assert named["total"] == len([i for i in range(1, N + 1) if i % 10 == 0 and i % 3 == 1])
    names = [j["name"] for j in named["jobs"]]
    assert names == sorted(names, reverse=True) and all(j["owner"] == "bob" for j in named["jobs"])
    urgent = get(api, all="true", sort="priority", order="desc", limit=1)["jobs"][0]
    assert urgent["priority"] == "urgent"


def test_api_refuses_bad_list_parameters(api: TestClient) -> None:
    for params in (
        {"sort": "spec"},
        {"order": "sideways"},
        {"offset": "-1"},
        {"limit": "0"},
        {"owner": "x" * 200},
    ):
        resp = api.get("/api/v1/jobs", params=params)
        assert resp.status_code == 422, (params, resp.text)
        assert resp.json()["error"]["code"] == "invalid_request"
