"""Saved models through the real app in process: ``write_model`` (what ``run.save_model`` runs)
exports a real torch model into a job's checkpoint storage; the job registers it with its
credential; people register, alias, download (sha256 checked) and delete versions; hostile
records and files are refused with a 4xx that names the problem."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from tests.support.api import BASE_URL, submit, wait_state, workdir
from trainhouse.client import Client
from trainhouse.core.tokens import hash_token
from trainhouse.errors import ClientError, ModelError
from trainhouse.jobfs.storage import open_storage
from trainhouse.sdk import load_model
from trainhouse.sdk._model import write_model

AUTH = {"Authorization": "Bearer known"}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.body(pixels)


class Branchy(Net):
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if pixels.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            return self.body(pixels)
        return -self.body(pixels)


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch.export's loader makes an inductor cache: in the test's directory, not TMPDIR."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def job(api: TestClient, tmp_path: Path) -> Iterator[dict[str, Any]]:
    created = submit(api, "entrypoint: python train.py\n", workdir(tmp_path)).json()
    wait_state(api, created["id"], {"COMPLETED"})
    services = api.app.state.runtime  # type: ignore[attr-defined]
    services.store.jobs.update(created["id"], token_hash=hash_token("known"))
    url = f"/api/v1/jobs/{created['id']}"
    directory = Path(api.get(f"{url}/checkpoints").json()["directory"])
    yield {"id": created["id"], "url": url, "dir": directory}


def save(job: dict[str, Any], model: Any, step: int, **kw: Any) -> dict[str, Any]:
    torch.manual_seed(step)
    return write_model(
        open_storage(job["dir"]),
        kw.pop("name", "digits"),
        model,
        example_inputs=(torch.randn(4, 64),),
        metrics={"val_acc": 0.5 + step / 100},
        loader=kw.pop("loader", None),
        step=step,
        attempt=1,
        job_id=job["id"],
    )


def register(api: TestClient, job: dict[str, Any], record: dict[str, Any]) -> Any:
    body = {"name": record["name"], "path": record["path"]}
    return api.post(f"{job['url']}/models", json=body, headers=AUTH)


def client_for(api: TestClient) -> Client:
    client = Client(BASE_URL)
    client._http = api
    api.base_url = f"{BASE_URL}/api/v1"  # type: ignore[assignment]
    return client


def test_save_register_alias_download_and_delete(
    api: TestClient, job: dict[str, Any], tmp_path: Path
) -> None:
    model = Net().eval()
    record = save(job, model, 5)
    assert record["kind"] == "export" and record["step"] == 5
    assert record["signature"] == {
        "inputs": [{"name": "pixels", "shape": [None, 64], "dtype": "float32"}],
        "outputs": [{"name": "output", "shape": [None, 10], "dtype": "float32"}],
    }
    resp = register(api, job, record)
    assert resp.status_code == 201, resp.json()
    v1 = resp.json()
    assert (v1["model"], v1["version"], v1["job_id"], v1["step"]) == ("digits", 1, job["id"], 5)
    assert sorted(f["name"] for f in v1["files"]) == [
        "model.json",
        "program.pt2",
        "weights.safetensors",
    ]
    assert v1["record"]["workdir_sha256"] and v1["record"]["torch"] == torch.__version__
    assert register(api, job, record).json()["version"] == 1  # a retried registration

    client = client_for(api)
    save(job, model, 9)
    v2 = client.register_model("digits", job["id"])  # the job's newest saved model
    assert (v2["version"], v2["step"]) == (2, 9)
    client.set_alias("digits", "prod", 1)
    assert client.model_version("digits", "prod")["version"] == 1

    # the downloaded program, batch of any size, gives the in-process model's outputs
    path = client.download_model("digits@prod", tmp_path / "dl")
    assert path.name == "digits-v1"
    served = load_model(path)
    for batch in (1, 7, 33):
        x = torch.randn(batch, 64)
        with torch.no_grad():
            assert torch.allclose(served(x), model(x), atol=1e-6, rtol=0)

    with pytest.raises(ClientError, match="named by the alias") as refused:
        client.delete_model_version("digits", 1)
    assert refused.value.status == 409
    client.set_alias("digits", "prod", 2)
    client.delete_model_version("digits", 1)
    assert not (job["dir"] / "models/digits/step-000000005").exists()
    assert (job["dir"] / "models/digits/step-000000009").is_dir()
    listed = client.models()
    assert [(m["name"], m["versions"], m["aliases"]) for m in listed] == [
        ("digits", 1, {"prod": 2})
    ]


def test_a_download_that_does_not_match_its_sha256_is_refused(
    api: TestClient, job: dict[str, Any], tmp_path: Path
) -> None:
    assert register(api, job, save(job, Net(), 3)).status_code == 201
    weights = job["dir"] / "models/digits/step-000000003/weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"weights.safetensors of digits@1 has sha256 .* corrupt"):
        client_for(api).download_model("digits@1", tmp_path / "dl")
    assert list((tmp_path / "dl").iterdir()) == []  # nothing left behind


def test_a_model_torch_export_cannot_capture_names_the_reason_and_a_loader_saves_it(
    api: TestClient, job: dict[str, Any]
) -> None:
    with pytest.raises(ModelError, match=r"torch.export cannot capture model Branchy: .*loader="):
        save(job, Branchy(), 1)
    assert not (job["dir"] / "models/digits").exists() or not any(
        (job["dir"] / "models/digits").iterdir()
    )
    record = save(job, Branchy(), 1, loader="serve.py:load")
    assert record["kind"] == "loader" and [f["name"] for f in record["files"]] == [
        "weights.safetensors"
    ]
    resp = register(api, job, record)
    assert resp.status_code == 201, resp.json()
    assert resp.json()["kind"] == "loader"
    with pytest.raises(ModelError, match=r"loader must be 'file\.py:function'"):
        save(job, Branchy(), 2, loader="../evil.py:load")


def rewrite(job: dict[str, Any], record: dict[str, Any], change: Any) -> None:
    path = job["dir"] / record["path"] / "model.json"
    data = json.loads(path.read_text())
    change(data, job["dir"] / record["path"])
    path.write_text(json.dumps(data))


def extra_file(data: dict[str, Any], where: Path) -> None:
    (where / "run.sh").write_text("rm -rf /")
    data["files"].append({"name": "run.sh", "size": 8, "sha256": "0" * 64})


def linked_weights(data: dict[str, Any], where: Path) -> None:
    target = where / "weights.safetensors"
    os.replace(target, where.parent / "elsewhere")
    target.symlink_to(where.parent / "elsewhere")


HOSTILE = [
    (lambda d, w: d["files"][0].update(sha256="0" * 64), "does not match its record"),
    (lambda d, w: d["files"][0].update(size=1), "its record says 1"),
    (extra_file, "a 'export' model has"),
    (lambda d, w: d.update(signature={"inputs": "x"}), "signature.inputs"),
    (lambda d, w: d.update(metrics={"m" * 300: 1.0}), "metrics"),
    (lambda d, w: d.update(padding="x" * 300_000), "byte limit"),
    (linked_weights, "weights.safetensors cannot be read"),
]


def test_hostile_records_files_and_paths_are_refused(api: TestClient, job: dict[str, Any]) -> None:
    record = save(job, Net(), 2)
    good = job["dir"] / record["path"]
    for step, (change, message) in enumerate(HOSTILE, start=10):
        copy = good.parent / f"step-{step:09d}"
        shutil.copytree(good, copy)
        bad = {**record, "path": f"models/digits/{copy.name}"}
        rewrite(job, bad, change)
        resp = register(api, job, bad)
        assert resp.status_code == 422, (message, resp.json())
        assert message in resp.json()["error"]["message"]
    assert api.get("/api/v1/models").json()["models"] == []

    for body, status, message in [
        ({"name": "digits", "path": "../../etc"}, 422, "climb out"),
        ({"name": "digits", "path": "step-000000001.pt"}, 422, "not a saved model's directory"),
        ({"name": "digits", "path": "models/digits/step-000000007"}, 404, "saved no model"),
        ({"name": "../x", "path": "models/x/step-000000001"}, 422, "name"),
    ]:
        resp = api.post(f"{job['url']}/models", json=body, headers=AUTH)
        assert resp.status_code == status, resp.json()
        assert message in resp.json()["error"]["message"]

    body = {"name": "digits", "path": record["path"]}
    resp = api.post(f"{job['url']}/models", json=body, headers={"Authorization": "Bearer no"})
    assert resp.status_code == 401
    assert register(api, job, record).status_code == 201


def test_a_terabyte_of_sparse_weights_is_refused_before_a_byte_is_read(
    api: TestClient, job: dict[str, Any]
) -> None:
    """A job's record may tell the truth about a 1 TiB sparse file (it costs the job nothing on
    disk): its registration is refused on the size alone, the server's default cap named."""
    record = save(job, Branchy().eval(), 3, name="vast", loader="train.py:load")
    weights = job["dir"] / record["path"] / "weights.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(1 << 40)
    rewrite(job, record, lambda d, _w: d["files"][0].update(size=1 << 40))
    resp = register(api, job, record)
    assert resp.status_code == 422, resp.json()
    assert resp.json()["error"]["message"] == (
        f"the model in {record['path']} holds {1 << 40} bytes, more than the {256 << 30} a "
        "model version may hold (the server's --model-max-bytes); refused before reading it"
    )
    assert api.get("/api/v1/models").json()["models"] == []


def test_a_standalone_run_saves_a_model_next_to_its_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainhouse

    monkeypatch.chdir(tmp_path)
    model = Net()
    with trainhouse.init() as run:
        run.log({"loss": 1.0}, step=3)
        record = run.save_model(
            "digits", model, example_inputs=torch.randn(2, 64), metrics={"val_acc": 0.75}
        )
    assert record is not None and "version" not in record  # no server: nothing registered
    assert (record["step"], record["metrics"], record["job_id"]) == (3, {"val_acc": 0.75}, None)
    saved = tmp_path / "checkpoints" / "models" / "digits" / "step-000000003"
    assert sorted(p.name for p in saved.iterdir()) == [
        "model.json",
        "program.pt2",
        "weights.safetensors",
    ]
    x = torch.randn(5, 64)
    with torch.no_grad():
        assert torch.equal(load_model(saved)(x), model(x))


def test_a_job_adds_no_version_to_another_users_model(api: TestClient, job: dict[str, Any]) -> None:
    """run.save_model of a job of 'tester' onto alice's model: refused, nothing registered."""
    store = api.app.state.runtime.store  # type: ignore[attr-defined]
    store.models.add_version(
        "digits",
        owner="alice",
        job_id=None,
        attempt=1,
        step=1,
        path="models/digits/step-000000001",
        kind="export",
        files=[{"name": "model.json", "size": 1, "sha256": "0" * 64}],
    )
    resp = register(api, job, save(job, Net(), 3))
    assert resp.status_code == 403, resp.json()
    assert "belongs to alice" in resp.json()["error"]["message"]
    assert [v.version for v in store.models.versions("digits")] == [1]
    assert register(api, job, save(job, Net(), 4, name="mine")).status_code == 201


def test_a_job_with_registered_versions_is_deleted_only_with_them(
    api: TestClient, job: dict[str, Any]
) -> None:
    """Its versions' files are in its storage: deleting it alone would leave versions that
    neither download nor load, so it is refused, naming them, unless --with-models."""
    for step in (3, 4):
        resp = register(api, job, save(job, Net(), step))
        assert resp.status_code == 201, resp.json()
    client = client_for(api)  # the api's paths are relative to /api/v1 from here on
    with pytest.raises(ClientError, match=r"digits@1, digits@2.*--with-models") as refused:
        client.delete(job["id"])
    assert refused.value.status == 409
    client.set_alias("digits", "prod", 2)
    with pytest.raises(ClientError, match="named by the alias") as refused:
        client.delete(job["id"], with_models=True)
    assert refused.value.status == 409
    # nothing went: not the job, not a version, not a file
    assert client.job(job["id"])["id"] == job["id"]
    assert [v["version"] for v in client.model("digits")["versions"]] == [1, 2]
    assert (job["dir"] / "models/digits/step-000000003").is_dir()

    assert api.delete("/models/digits/aliases/prod").status_code == 204
    deleted = client.delete(job["id"], with_models=True)
    assert deleted["job_id"] == job["id"]
    assert client.model("digits")["versions"] == []
    assert client.models()[0]["latest"] is None


def test_weights_that_do_not_fit_the_program_are_refused_by_name(
    api: TestClient, job: dict[str, Any]
) -> None:
    """A record and files that check out, but weights missing a tensor (a hostile or broken
    save): loading says which keys differ instead of a model half loaded."""
    from safetensors.torch import load_file, save_file

    record = save(job, Net(), 3)
    where = job["dir"] / record["path"]
    weights = load_file(str(where / "weights.safetensors"))
    weights["extra.weight"] = weights.pop("body.2.bias")
    save_file(weights, str(where / "weights.safetensors"))

    def fix(data: dict[str, Any], _where: Path) -> None:
        raw = (where / "weights.safetensors").read_bytes()
        for f in data["files"]:
            if f["name"] == "weights.safetensors":
                f.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())

    rewrite(job, record, fix)
    with pytest.raises(ModelError, match=r"missing body\.2\.bias; unexpected extra\.weight"):
        load_model(where)


def test_the_clients_registrations_and_clones_wait_for_the_servers_file_work() -> None:
    """A registration and a clone from a checkpoint are answered once the server has hashed or
    copied the files in its bounded pool (minutes for a large model): the client (and so the
    CLI) waits that long for those answers, its usual 60 s for anything else. Before, a large
    registration failed on the client after 60 s while the server went on with it."""
    import httpx

    from trainhouse.core.wire import CLIENT_HEADERS, FILE_WORK_READ

    reads: dict[tuple[str, str], float] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        reads[(request.method, request.url.path)] = request.extensions["timeout"]["read"]
        if request.url.path.endswith("/clone"):
            return httpx.Response(201, json={"id": 2})
        if request.method == "POST":
            return httpx.Response(201, json={"model": "digits", "version": 1})
        return httpx.Response(200, json={"models": []})

    with Client(BASE_URL, token="t") as client:
        client._http.close()
        client._http = httpx.Client(
            base_url=f"{BASE_URL}/api/v1",
            headers=CLIENT_HEADERS,
            timeout=60.0,
            transport=httpx.MockTransport(handler),
        )
        assert client.register_model("digits", 1, loader="serve.py:load")["version"] == 1
        assert client.clone(1, from_checkpoint="latest")["id"] == 2
        assert client.models() == []
    assert reads == {
        ("POST", "/api/v1/models/digits/versions"): FILE_WORK_READ,
        ("POST", "/api/v1/jobs/1/clone"): FILE_WORK_READ,
        ("GET", "/api/v1/models"): 60.0,
    }
