"""Services through the real app in process: the services table on both backends; starting,
showing and stopping a service (its job placed like any job, refused when it could never
run); a replica's calls with its job's credential (what it may claim as its address, what it
is told to serve); predictions forwarded to a real replica (the app of
``trainhouse.serving.replica`` on a real socket) with its key; the roles of the API."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient

from tests.support.api import (
    app_client,
    error_of,
    page_request,
    services,
    submit,
    wait_state,
    workdir,
)
from tests.support.records import new_job
from tests.support.team import make_team, refused
from trainhouse.core.modelfiles import REPLICA_KEY_HEADER
from trainhouse.core.tokens import hash_token
from trainhouse.errors import NotFound, StoreError
from trainhouse.jobfs.storage import open_storage
from trainhouse.lifecycle import JobState, StopReason
from trainhouse.sdk._model import write_model
from trainhouse.serving.replica import build_app, load
from trainhouse.spec import JobSpec
from trainhouse.store import Store
from trainhouse.usecases.replicahub import MAX_ANSWER

CROSS_SITE = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
JOB_TOKEN = "replica-credential"


def _spec(name: str = "serve-x") -> JobSpec:
    return JobSpec.model_validate({"name": name, "entrypoint": "python -m x"})


def _create(store: Store, name: str = "digits-rt", **kw: Any) -> Any:
    values: dict[str, Any] = {
        "owner": "alice",
        "model": "digits",
        "ref": "prod",
        "replicas": 2,
        "gpus_per_replica": 0,
        "max_batch": 32,
        "max_wait_ms": 5.0,
        "priority": "normal",
        "spec": _spec(),
        "archive_sha256": "0" * 64,
    }
    return store.services.create(name=name, **{**values, **kw})


def test_a_service_and_its_job_are_made_together_and_a_name_is_reused_once_it_ends(
    store: Store,
) -> None:
    first = _create(store)
    job = store.jobs.get(first.job_id)
    assert (job.state, job.name, job.owner) == (JobState.QUEUED, "serve-x", "alice")
    assert store.services.of_job(job.id) == first
    assert [s.name for s in store.services.list()] == ["digits-rt"]
    with pytest.raises(StoreError, match="is running"):
        _create(store, ref="latest")
    assert len(store.jobs.list()) == 1  # the refused one left no job behind
    store.services.set_stopped("digits-rt")
    with pytest.raises(StoreError, match="is stopping"):  # stopped, but its job has not ended
        _create(store)
    store.jobs.transition(job.id, JobState.CANCELED, reason="canceled")
    again = _create(store, ref="3", replicas=1)
    assert (again.id, again.ref, again.replicas, again.stopped) == (first.id, "3", 1, False)
    assert again.job_id != first.job_id and store.services.of_job(first.job_id) is None
    with pytest.raises(NotFound):
        store.services.get("nothing")
    assert store.services.of_job(new_job(store)) is None


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    """The app (jobs stay running) with ``tiny@1`` registered and aliased ``prod``; the saved
    model's directory."""
    with app_client(tmp_path, exit_code=None, cpus=4) as api:
        made = submit(api, "entrypoint: python train.py\n", workdir(tmp_path)).json()
        wait_state(api, made["id"], {"RUNNING"})
        store = services(api).store
        store.jobs.update(made["id"], token_hash=hash_token("maker"))
        ckpt = Path(api.get(f"/api/v1/jobs/{made['id']}/checkpoints").json()["directory"])
        torch.manual_seed(0)
        record = write_model(
            open_storage(ckpt),
            "tiny",
            Net(),
            example_inputs=(torch.randn(2, 4),),
            metrics=None,
            loader=None,
            step=1,
            attempt=1,
            job_id=made["id"],
        )
        resp = api.post(
            f"/api/v1/jobs/{made['id']}/models",
            json={"name": "tiny", "path": record["path"]},
            headers={"Authorization": "Bearer maker"},
        )
        assert resp.status_code == 201, resp.text
        assert api.put("/api/v1/models/tiny/aliases/prod", json={"version": 1}).is_success
        yield api, ckpt / record["path"]


def start(api: TestClient, **body: Any) -> Any:
    return api.post("/api/v1/services", json={"model": "tiny", "ref": "prod", **body})


def credential(api: TestClient, service: dict[str, Any]) -> dict[str, str]:
    wait_state(api, service["job_id"], {"RUNNING"})
    services(api).store.jobs.update(service["job_id"], token_hash=hash_token(JOB_TOKEN))
    return {"Authorization": f"Bearer {JOB_TOKEN}"}


def placed_with_credential(store: Store, job_id: int) -> dict[str, str]:
    """Once the scheduler has placed ``job_id`` (placing it gives it a fresh credential),
    make its credential JOB_TOKEN."""
    deadline = time.monotonic() + 30
    while store.jobs.get(job_id).state != JobState.RUNNING:
        assert time.monotonic() < deadline, f"job {job_id} was never placed"
        time.sleep(0.05)
    store.jobs.update(job_id, token_hash=hash_token(JOB_TOKEN))
    return {"Authorization": f"Bearer {JOB_TOKEN}"}


def call(api: TestClient, service: dict[str, Any], **body: Any) -> Any:
    payload = {"rank": 0, "url": "http://127.0.0.1:5999", "key": "k" * 24, "state": "ready"}
    return api.post(
        f"/api/v1/jobs/{service['job_id']}/replicas",
        json={**payload, **body},
        headers=credential(api, service),
    )


def second_version(api: TestClient, directory: Path) -> None:
    """Version 2 of ``tiny``, saved and registered by the job that made version 1."""
    maker = services(api).store.models.version("tiny", 1).job_id
    assert maker is not None
    record = write_model(
        open_storage(directory.parent.parent.parent),
        "tiny",
        Net(),
        example_inputs=(torch.randn(2, 4),),
        metrics=None,
        loader=None,
        step=2,
        attempt=1,
        job_id=maker,
    )
    two = api.post(
        f"/api/v1/jobs/{maker}/models",
        json={"name": "tiny", "path": record["path"]},
        headers={"Authorization": "Bearer maker"},
    )
    assert two.status_code == 201 and two.json()["version"] == 2, two.text


def test_a_service_is_a_job_of_replicas_placed_like_any_job(
    served: tuple[TestClient, Path],
) -> None:
    api, _ = served
    made = start(api, name="rt", replicas=2, max_batch=8)
    assert made.status_code == 201, made.text
    rt = made.json()
    assert (rt["name"], rt["target_version"], rt["replicas"]) == ("rt", 1, 2)
    assert rt["state"] in ("queued", "starting")
    job = api.get(f"/api/v1/jobs/{rt['job_id']}").json()
    assert job["spec"]["entrypoint"] == "python -m trainhouse.serving.follow"
    assert job["spec"]["resources"]["procs_per_node"] == 2
    assert (job["project"], job["tags"]) == ("services", ["service"])

    again = start(api, name="rt")
    assert again.status_code == 409 and "stop it first" in error_of(again)["message"]
    assert start(api, ref="nope").status_code == 404
    assert "no alias 'nope'" in error_of(start(api, ref="nope"))["message"]
    assert start(api, model="other").status_code == 404
    never = start(api, name="huge", replicas=64)
    assert never.status_code == 422 and "can never run" in error_of(never)["message"]
    assert start(api, name="gpu", gpus_per_replica=2).status_code == 422

    stopped = api.post("/api/v1/services/rt/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopping"
    fake = services(api).scheduler.executor
    deadline = time.monotonic() + 30
    while (rt["job_id"], "cancel") not in [(j, str(r)) for j, r in fake.stops]:
        assert time.monotonic() < deadline, fake.stops
        time.sleep(0.05)
    again = start(api, name="rt")
    assert again.status_code == 409 and "is stopping" in error_of(again)["message"]
    fake.end(rt["job_id"], -15)  # its replicas end on SIGTERM
    ended = wait_state(api, rt["job_id"], {"CANCELED"})
    assert ended["state"] == "CANCELED"
    assert api.get("/api/v1/services/rt").json()["state"] == "stopped"
    assert api.post("/api/v1/services/nothing/stop").status_code == 404


def test_a_replica_tells_the_outputs_of_a_version_that_has_none(
    served: tuple[TestClient, Path],
) -> None:
    """A checkpoint's signature has no outputs until a replica that serves it says what it
    answers; the first report stays, a replica that is not ready or of another service's
    model changes nothing, and what it says is checked like any spec."""
    from sqlalchemy import update

    from trainhouse.store import tables

    api, _ = served
    store = services(api).store
    with store.transaction() as conn:  # what a checkpoint's record has: declared inputs only
        conn.execute(
            update(tables.model_versions).values(
                signature={
                    "inputs": [{"name": "x", "shape": [None, 4], "dtype": "float32"}],
                    "outputs": [],
                }
            )
        )
    rt = start(api).json()
    out = [{"name": "output", "shape": [None, 3], "dtype": "float32"}]
    signature = lambda: api.get("/api/v1/models/tiny/versions/1").json()["signature"]  # noqa: E731
    assert call(api, rt, version=1, state="loading", outputs=out).status_code == 200
    assert signature()["outputs"] == []  # not ready: nothing learned yet
    bad = call(api, rt, version=1, outputs=[{"name": "o", "shape": [None], "dtype": "Float!"}])
    assert bad.status_code == 422
    many = call(api, rt, version=1, outputs=out * 17)
    assert many.status_code == 422
    assert call(api, rt, version=1, outputs=out).status_code == 200
    assert signature() == {
        "inputs": [{"name": "x", "shape": [None, 4], "dtype": "float32"}],
        "outputs": out,
    }
    other = [{"name": "y", "shape": [None, 9], "dtype": "int64"}]
    assert call(api, rt, version=1, outputs=other).status_code == 200
    assert signature()["outputs"] == out  # the first report stays
    assert call(api, rt, version=7, outputs=other).status_code == 200  # no such version
    assert signature()["outputs"] == out


def test_a_replica_tells_no_outputs_of_a_version_its_service_does_not_serve(
    served: tuple[TestClient, Path],
) -> None:
    """A replica runs its model owner's code: what it says a version outputs is recorded for
    the version its service's ref names now, never for another version of the model (whose
    signature would keep the first report for good)."""
    from sqlalchemy import update

    from trainhouse.store import tables

    api, directory = served
    store = services(api).store
    second_version(api, directory)
    inputs = [{"name": "x", "shape": [None, 4], "dtype": "float32"}]
    with store.transaction() as conn:  # both versions as checkpoints are: no outputs
        conn.execute(
            update(tables.model_versions).values(signature={"inputs": inputs, "outputs": []})
        )
    rt = start(api).json()  # serves prod: version 1
    forged = [{"name": "forged", "shape": [None, 1], "dtype": "int8"}]
    assert call(api, rt, version=2, outputs=forged).status_code == 200
    assert api.get("/api/v1/models/tiny/versions/2").json()["signature"]["outputs"] == []
    assert api.get("/api/v1/models/tiny/versions/1").json()["signature"]["outputs"] == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://10.0.0.7:8000", "loopback"),
        ("http://169.254.169.254:8080", "loopback"),
        ("http://127.0.0.1:80", "above 1023"),
        ("https://127.0.0.1:8000", "http://HOST:PORT"),
        ("http://127.0.0.1:8000/admin", "http://HOST:PORT"),
        ("http://user:pw@127.0.0.1:8000", "nothing but"),
        ("http://127.0.0.1:99999", "http://HOST:PORT"),
    ],
)
def test_a_replica_may_claim_only_a_loopback_or_node_address(
    served: tuple[TestClient, Path], url: str, says: str
) -> None:
    api, _ = served
    rt = start(api).json()
    resp = call(api, rt, url=url)
    assert resp.status_code == 422 and says in error_of(resp)["message"], resp.text
    assert api.get("/api/v1/services/tiny").json()["replica_list"] == []


def test_a_replica_off_the_servers_node_listens_on_its_nodes_address(
    served: tuple[TestClient, Path],
) -> None:
    """On Ray a replica may run on another node than the server's: a loopback address there
    is the server's own, so the replica listens on its node's address and the check says
    which (the server once took its loopback URL and sent predictions to itself)."""
    from trainhouse.core.cluster import Placement, placements_to_json

    api, _ = served
    rt = start(api, replicas=2).json()
    wait_state(api, rt["job_id"], {"RUNNING"})
    runtime = services(api)
    executor = runtime.scheduler.executor
    here = executor.server_node()
    # replica 0 on the server's node, replica 1 on another node Ray reaches at 10.0.0.9
    runtime.store.jobs.update(
        rt["job_id"],
        placement=placements_to_json([Placement(here, 1, procs=1), Placement("gpu-2", 1, procs=1)]),
    )
    executor.addresses = {"gpu-2": ("10.0.0.9",)}
    away = call(api, rt, rank=1, url="http://127.0.0.1:5999")
    assert away.status_code == 422, away.text
    said = error_of(away)["message"]
    assert "node gpu-2" in said and f"server runs on node {here}" in said, said
    assert "10.0.0.9" in said, said
    assert call(api, rt, rank=1, url="http://10.0.0.8:5999").status_code == 422
    assert call(api, rt, rank=1, url="http://10.0.0.9:5999").status_code == 200
    # the server's node: loopback, and not the other node's address
    assert call(api, rt, rank=0, url="http://127.0.0.1:5998").status_code == 200
    assert call(api, rt, rank=0, url="http://10.0.0.9:5998").status_code == 422
    listed = api.get(f"/api/v1/services/{rt['name']}").json()["replica_list"]
    assert [(r["rank"], r["url"]) for r in listed] == [
        (0, "http://127.0.0.1:5998"),
        (1, "http://10.0.0.9:5999"),
    ]


@pytest.mark.parametrize(
    ("tier", "equal", "higher"), [("normal", "normal", "high"), ("high", "high", "urgent")]
)
def test_a_service_is_preempted_only_by_a_higher_tier(
    served: tuple[TestClient, Path], tmp_path: Path, tier: str, equal: str, higher: str
) -> None:
    """A service runs at its own priority class like any job: a job of its tier (or lower)
    waits for room rather than displace it; one of a higher tier preempts it, as
    ``serve --priority`` says."""
    api, _ = served
    service = start(api, priority=tier).json()
    wait_state(api, service["job_id"], {"RUNNING"})
    whole = "name: big\nentrypoint: python train.py\nresources: {procs_per_node: 4}\npriority: %s\n"
    for lower in ("low", equal):
        plan = api.post("/api/v1/jobs/dry-run", data={"spec": whole % lower}).json()
        assert service["job_id"] not in plan["preempts"], (lower, plan)
    plan = api.post("/api/v1/jobs/dry-run", data={"spec": whole % higher}).json()
    assert service["job_id"] in plan["preempts"], plan
    executor = services(api).scheduler.executor
    waiting = submit(api, whole % equal, workdir(tmp_path)).json()
    deadline = time.monotonic() + 30
    while not api.get(f"/api/v1/jobs/{waiting['id']}").json()["reason"]:  # the scheduler saw it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert executor.stops == []
    submit(api, whole % higher, workdir(tmp_path))
    while (service["job_id"], StopReason.PREEMPT) not in executor.stops:
        assert time.monotonic() < deadline, executor.stops
        time.sleep(0.05)


def test_a_replica_learns_what_to_serve_and_a_version_it_serves_is_kept(
    served: tuple[TestClient, Path],
) -> None:
    api, _ = served
    rt = start(api).json()
    target = call(api, rt, state="loading").json()
    assert (target["model"], target["version"], target["kind"]) == ("tiny", 1, "export")
    assert {f["name"] for f in target["files"]} >= {"model.json", "weights.safetensors"}
    wrong = api.post(
        f"/api/v1/jobs/{rt['job_id']}/replicas",
        json={"rank": 0, "url": "http://127.0.0.1:5999", "key": "k" * 24, "state": "ready"},
        headers={"Authorization": "Bearer not-it"},
    )
    assert wrong.status_code == 401
    people = api.post(
        f"/api/v1/jobs/{rt['job_id']}/replicas",
        json={"rank": 0, "url": "http://127.0.0.1:5999", "key": "k" * 24, "state": "ready"},
    )
    assert people.status_code == 401  # a person's call (no credential) is no replica's
    # the files and the code of the version come with the credential
    files = api.get(
        f"/api/v1/jobs/{rt['job_id']}/replicas/versions/1/files/model.json",
        headers=credential(api, rt),
    )
    assert files.status_code == 200 and files.json()["name"] == "tiny"
    code = api.get(
        f"/api/v1/jobs/{rt['job_id']}/replicas/versions/1/code", headers=credential(api, rt)
    )
    assert code.status_code == 200 and code.content[:2] == b"\x1f\x8b"

    call(api, rt, version=1, state="ready")
    shown = api.get("/api/v1/services/tiny").json()
    assert (shown["state"], shown["version"], shown["ready_replicas"]) == ("ready", 1, 1)
    assert api.put("/api/v1/models/tiny/aliases/prod", json={"version": 1}).is_success
    api.delete("/api/v1/models/tiny/aliases/prod")
    kept = api.delete("/api/v1/models/tiny/versions/1")
    assert kept.status_code == 409 and "served by tiny" in error_of(kept)["message"]
    # the alias gone, a replica is told there is nothing to move to and keeps serving
    target = call(api, rt, version=1, state="ready").json()
    assert target["version"] is None and "no alias 'prod'" in target["problem"]
    # nothing listens at the claimed address: the prediction is refused, not hung
    lost = api.post("/api/v1/services/tiny/predict", json={"inputs": [[0, 0, 0, 0]]})
    assert lost.status_code == 503 and "no ready replica" in error_of(lost)["message"]


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` on a real loopback socket: its url."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture
def replica(served: tuple[TestClient, Path]) -> Iterator[tuple[str, str]]:
    """The real replica app on a real socket, wanting a key: (its url, the key)."""
    _, directory = served
    key = "a-replica-key-of-24-chars"
    app, _ = build_app(load(directory), max_batch=8, max_wait_ms=2, key=key)
    with serving(app) as url:
        yield url, key


def test_predictions_go_to_a_replica_with_its_key(
    served: tuple[TestClient, Path], replica: tuple[str, str]
) -> None:
    api, directory = served
    url, key = replica
    rt = start(api).json()
    assert call(api, rt, url=url, key=key, version=1).status_code == 200
    model = load(directory).module
    x = torch.randn(3, 4)
    resp = api.post("/api/v1/services/tiny/predict", json={"inputs": x.tolist()})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["model"], body["version"]) == ("tiny", 1)
    with torch.no_grad():
        assert torch.allclose(torch.tensor(body["outputs"]), model(x), atol=1e-6)
    bad = api.post("/api/v1/services/tiny/predict", json={"inputs": [[1, 2]]})
    assert bad.status_code == 422 and "shape" in error_of(bad)["message"]
    # the replica answers its server only: without the key it refuses
    direct = httpx.post(f"{url}/predict", json={"inputs": x.tolist()})
    assert direct.status_code == 403
    shown = api.get("/api/v1/services/tiny").json()
    assert shown["stats"]["requests_total"] == 2 and shown["stats"]["errors_total"] == 0
    assert shown["stats"]["mean_batch"] == 3
    metrics = api.get("/metrics").text
    assert 'trainhouse_service_requests_total{outcome="bad_input",service="tiny"} 1.0' in metrics
    assert 'trainhouse_service_batch_size_sum{service="tiny"} 3.0' in metrics


def test_a_hostile_replica_neither_redirects_the_server_nor_floods_it(
    served: tuple[TestClient, Path],
) -> None:
    """A replica runs its model owner's loader, so its answers are hostile: a redirect is not
    followed (it would send the prediction, and the replica's key, to any address), an answer
    past the cap is not read into memory, and a replica claims only its service's ranks."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
    from starlette.routing import Route

    api, _ = served
    mode = {"answer": "redirect"}
    reached: list[str] = []

    async def predict(request: Request) -> Response:
        if mode["answer"] == "redirect":
            return RedirectResponse(f"{request.base_url}elsewhere", status_code=307)
        if mode["answer"] == "huge":
            chunk = b" " * (1 << 20)
            return StreamingResponse(iter([chunk] * (MAX_ANSWER // len(chunk) + 8)))
        return JSONResponse({"model": "tiny", "version": 1, "outputs": [[0.0]]})

    async def elsewhere(request: Request) -> Response:
        reached.append(request.headers.get(REPLICA_KEY_HEADER, ""))
        return JSONResponse({"outputs": "from elsewhere"})

    hostile = Starlette(
        routes=[
            Route("/predict", predict, methods=["POST"]),
            Route("/elsewhere", elsewhere, methods=["POST"]),
        ]
    )
    rt = start(api).json()
    with serving(hostile) as url:
        assert call(api, rt, url=url, version=1).status_code == 200
        redirected = api.post("/api/v1/services/tiny/predict", json={"inputs": [[1, 2, 3, 4]]})
        assert redirected.status_code == 502
        assert "redirect, which is not followed" in error_of(redirected)["message"]
        assert reached == []
        mode["answer"] = "huge"
        flooded = api.post("/api/v1/services/tiny/predict", json={"inputs": [[1, 2, 3, 4]]})
        assert flooded.status_code == 502
        assert f"over {MAX_ANSWER} bytes" in error_of(flooded)["message"]
        mode["answer"] = "ok"
        fine = api.post("/api/v1/services/tiny/predict", json={"inputs": [[1, 2, 3, 4]]})
        assert fine.status_code == 200 and fine.json()["outputs"] == [[0.0]]
    beyond = call(api, rt, rank=1, url=url)  # the service has 1 replica: rank 0 only
    assert beyond.status_code == 422 and "there is no replica 1" in error_of(beyond)["message"]


def test_a_replica_downloads_only_the_version_it_is_told_to_serve(
    served: tuple[TestClient, Path],
) -> None:
    """Files and code go to a replica for the version its service's ref names now, never for
    another version of the model (an older one's code, say)."""
    api, directory = served
    second_version(api, directory)
    rt = start(api).json()
    url = f"/api/v1/jobs/{rt['job_id']}/replicas/versions"
    for path in ("2/files/model.json", "2/code"):
        other = api.get(f"{url}/{path}", headers=credential(api, rt))
        assert other.status_code == 403, other.text
        assert "downloads that version only, not 2" in error_of(other)["message"]
    assert api.get(f"{url}/1/files/model.json", headers=credential(api, rt)).status_code == 200
    assert api.put("/api/v1/models/tiny/aliases/prod", json={"version": 2}).is_success
    assert api.get(f"{url}/2/files/model.json", headers=credential(api, rt)).status_code == 200
    assert api.get(f"{url}/1/files/model.json", headers=credential(api, rt)).status_code == 403


def test_a_replica_gets_no_code_its_services_owner_may_not_read(tmp_path: Path) -> None:
    """An admin registers a model from bob's job and gives it to alice, who serves it: her
    replicas are not handed bob's code (his workdir may hold anything), as alice could not
    read it herself; the admin's own service could."""
    for team in make_team(tmp_path):
        store = team.rt.store
        bobs = new_job(store, owner="bob")
        store.models.add_version(
            "tiny",
            owner="alice",
            job_id=bobs,
            attempt=1,
            step=1,
            path="models/tiny/step-000000001",
            kind="loader",
            files=[{"name": "model.json", "size": 1, "sha256": "0" * 64}],
            record={"loader": "serve.py:load"},
        )
        for user in ("alice", "root"):
            resp = team.api.put(
                f"/api/v1/quotas/{user}", json={"max_cpus": 4}, headers=team.h("root")
            )
            assert resp.status_code == 200
        made = team.post("alice", "/services", json={"model": "tiny", "ref": "1"})
        assert made.status_code == 201, made.text
        job = placed_with_credential(store, made.json()["job_id"])
        code = team.api.get(
            f"/api/v1/jobs/{made.json()['job_id']}/replicas/versions/1/code", headers=job
        )
        assert code.status_code == 403
        assert f"code of job {bobs}, which the service's owner alice" in error_of(code)["message"]
        assert team.post("root", "/services/tiny/stop").status_code == 200
        deadline = time.monotonic() + 30
        while store.jobs.get(made.json()["job_id"]).state != JobState.CANCELED:
            assert time.monotonic() < deadline, "the stopped service's job never ended"
            time.sleep(0.05)
        mine = team.post("root", "/services", json={"model": "tiny", "ref": "1"})
        assert mine.status_code == 201, mine.text
        placed_with_credential(store, mine.json()["job_id"])
        allowed = team.api.get(
            f"/api/v1/jobs/{mine.json()['job_id']}/replicas/versions/1/code", headers=job
        )
        assert allowed.status_code == 404  # read on: the archive of this made-up job is gone
        assert "workdir archive is no longer" in error_of(allowed)["message"]


def test_services_follow_the_api_roles(tmp_path: Path) -> None:
    """A viewer lists services but starts and stops none; a member stops only their own."""
    for team in make_team(tmp_path):
        store = team.rt.store
        store.models.add_version(
            "tiny",
            owner="alice",
            job_id=new_job(store, owner="alice"),
            attempt=1,
            step=1,
            path="models/tiny/step-000000001",
            kind="export",
            files=[{"name": "model.json", "size": 1, "sha256": "0" * 64}],
            metrics={},
            signature={"inputs": [], "outputs": []},
            record={},
        )
        for user in ("alice", "bob"):
            resp = team.api.put(
                f"/api/v1/quotas/{user}", json={"max_cpus": 4}, headers=team.h("root")
            )
            assert resp.status_code == 200
        body = {"model": "tiny", "ref": "1", "owner": "someone-else"}
        assert "viewer" in refused(team.post("vera", "/services", json=body))
        made = team.post("alice", "/services", json=body)
        assert made.status_code == 201, made.text
        assert made.json()["owner"] == "alice"
        assert [s["name"] for s in team.get("vera", "/services").json()["services"]] == ["tiny"]
        assert "may not stop it" in refused(team.post("bob", "/services/tiny/stop"))
        assert "viewer" in refused(team.post("vera", "/services/tiny/stop"))
        gone = team.post("vera", "/services/tiny/predict", json={"inputs": [[1]]})
        assert gone.status_code == 503  # a viewer may predict; no replica is there yet
        # a cross-site page, with the admin's credentials, neither stops nor starts one
        for path in ("/services/tiny/stop", "/services"):
            sneaky = page_request(
                team.api,
                "POST",
                f"/api/v1{path}",
                json=body,
                headers={**team.h("root"), **CROSS_SITE},
            )
            assert sneaky.status_code == 403 and error_of(sneaky)["code"] == "cross_origin"
        assert team.post("root", "/services/tiny/stop").status_code == 200
        deadline = time.monotonic() + 30
        while not store.jobs.get(made.json()["job_id"]).state.terminal:
            assert time.monotonic() < deadline, "the stopped service's job never ended"
            time.sleep(0.05)
        # stopped, the name stays alice's: bob's service would answer her clients
        taken = refused(team.post("bob", "/services", json=body))
        assert "belongs to alice" in taken and "choose another --name" in taken
        assert team.post("bob", "/services", json={**body, "name": "bobs"}).status_code == 201
        again = team.post("alice", "/services", json=body)
        assert again.status_code == 201 and again.json()["owner"] == "alice"
