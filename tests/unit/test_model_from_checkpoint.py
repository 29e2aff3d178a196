"""Models registered from a job's checkpoint with a loader of the job's code (``models register
NAME --job J [--step S] --loader FILE.py:FUNCTION``), through the real app in process: the
server copies the checkpoint into the job's model layout (its digest checked as it copies),
writes a record of kind "checkpoint" and registers it; retention never deletes the copy; the
download loads with the loader (``load_model``, a replica's ``load``); hostile and wrong
requests get a 4xx naming the problem."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from tests.support.api import BASE_URL, InProcessTransport, error_of, services, submit, wait_state
from trainhouse.client import Client
from trainhouse.core.modelfiles import check_inputs, parse_input
from trainhouse.core.tokens import hash_token
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.errors import ClientError, ModelError
from trainhouse.jobfs.storage import new_hash, open_storage
from trainhouse.jobfs.workdir import pack
from trainhouse.sdk import load_model
from trainhouse.sdk._model import write_model
from trainhouse.sdk.checkpoint import _format
from trainhouse.serving.replica import load

AUTH = {"Authorization": "Bearer known"}
SERVE = """\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())

    def forward(self, pixels):
        return self.body(pixels)


def load(state):
    net = Net()
    net.load_state_dict(state["model"])
    return net
"""


class Net(torch.nn.Module):
    """What the job trains (``serve.py``'s Net, in the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(pixels)
        return out


def rebuild(state: dict[str, Any]) -> Net:
    net = Net()
    net.load_state_dict(state["model"])
    return net


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """torch.export (a saved model in the way) makes an inductor cache: in the test's
    directory, not TMPDIR."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def code(tmp_path: Path) -> Path:
    src = tmp_path / "wd"
    (src / "models").mkdir(parents=True)
    (src / "train.py").write_text("print('training')\n")
    (src / "models" / "serve.py").write_text(SERVE)
    return src


@pytest.fixture
def job(api: TestClient, code: Path) -> dict[str, Any]:
    spec = "entrypoint: python train.py\ncheckpoints: {keep_last: 1}\n"
    created = submit(api, spec, pack(code).data).json()
    wait_state(api, created["id"], {"COMPLETED"})
    services(api).store.jobs.update(created["id"], token_hash=hash_token("known"))
    url = f"/api/v1/jobs/{created['id']}"
    directory = Path(api.get(f"{url}/checkpoints").json()["directory"])
    return {"id": created["id"], "url": url, "dir": directory}


def checkpoint(
    api: TestClient, job: dict[str, Any], step: int, *, algorithm: str = "sha256"
) -> Net:
    """A checkpoint of a freshly made Net at ``step``, written in the SDK's format and
    registered as the job registers its checkpoints; the Net."""
    torch.manual_seed(step)
    net = Net()
    plan = _format.plan({"model": net.state_dict(), "step": step, "note": "x"})
    assert plan is not None
    buf = io.BytesIO()
    plan.write(buf.write)
    data = buf.getvalue()
    path = f"ckpt-{step:06d}.th"
    (job["dir"] / path).write_bytes(data)
    digest = new_hash(algorithm)
    digest.update(data)
    body = {
        "attempt": 1,
        "step": step,
        "path": path,
        "size": len(data),
        "sha256": digest.hexdigest(),
        "metrics": {"val_loss": 1.0 / (step + 1)},
        "algorithm": algorithm,
    }
    resp = api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.json()
    return net


def client_for(api: TestClient) -> Client:
    """The Python client, over the app in process."""
    client = Client(BASE_URL)
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    return client


def register(api: TestClient, job: dict[str, Any], name: str = "net", **body: Any) -> Any:
    payload = {"job": job["id"], "loader": "models/serve.py:load", **body}
    return api.post(f"/api/v1/models/{name}/versions", json=payload)


def test_a_checkpoint_registered_with_a_loader_downloads_and_loads_with_it(
    api: TestClient, job: dict[str, Any], code: Path, tmp_path: Path
) -> None:
    first = checkpoint(api, job, 3, algorithm="blake3")
    client = client_for(api)
    v1 = client.register_model(
        "net", job["id"], loader="models/serve.py:load", inputs=["pixels:float32[B,8]"]
    )
    assert (v1["version"], v1["kind"], v1["step"], v1["attempt"]) == (1, "checkpoint", 3, 1)
    assert [f["name"] for f in v1["files"]] == ["checkpoint.ckpt", "model.json"]
    assert v1["signature"] == {
        "inputs": [{"name": "pixels", "shape": [None, 8], "dtype": "float32"}],
        "outputs": [],
    }
    assert v1["record"]["loader"] == "models/serve.py:load" and v1["record"]["torch"] is None
    assert v1["record"]["checkpoint"]["algorithm"] == "blake3"
    assert v1["record"]["checkpoint"]["path"] == "ckpt-000003.th"
    assert v1["metrics"] == {"val_loss": 0.25}
    copy = job["dir"] / "models/net/step-000000003"
    assert (copy / "checkpoint.ckpt").read_bytes() == (job["dir"] / "ckpt-000003.th").read_bytes()
    assert json.loads((copy / "model.json").read_text())["kind"] == "checkpoint"

    # a newer checkpoint retires the registered one (keep_last: 1): the model's copy stays
    second = checkpoint(api, job, 5)
    services(api).checkpoints.drain()
    assert not (job["dir"] / "ckpt-000003.th").exists()
    path = client.download_model("net@1", tmp_path / "dl")
    x = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(load_model(path, loader=rebuild)(x), first(x))
        served = load(path, version=1, workdir=code)  # the loader of the job's own code
        assert (served.name, served.version) == ("net", 1)
        assert torch.equal(served.module(x), first(x))
    with pytest.raises(ModelError, match=r"holds a checkpoint only: it needs its loader"):
        load_model(path)
    with pytest.raises(ModelError, match="give the workdir that holds it"):
        load(path)

    # the newest by default, a named step, the same registration again
    v2 = client.register_model("net", job["id"], loader="models/serve.py:load")
    assert (v2["version"], v2["step"], v2["signature"]["inputs"]) == (2, 5, [])
    assert client.register_model("net", job["id"], 5, loader="models/serve.py:load")["version"] == 2
    with torch.no_grad():
        dl = client.download_model("net@2", tmp_path / "dl")
        assert torch.equal(load_model(dl, loader=rebuild)(x), second(x))
    shown = client.model("net")
    assert [(v["version"], v["kind"]) for v in shown["versions"]] == [
        (1, "checkpoint"),
        (2, "checkpoint"),
    ]
    # the copies are not what the job saved (run.save_model): it saved nothing
    with pytest.raises(ClientError, match="saved no model") as none:
        client.register_model("saved", job["id"])
    assert none.value.status == 404
    client.delete_model_version("net", 2)
    assert not (job["dir"] / "models/net/step-000000005").exists()


def test_wrong_and_hostile_registrations_get_a_4xx_naming_the_problem(
    api: TestClient, job: dict[str, Any]
) -> None:
    checkpoint(api, job, 2)
    cases = [
        ({"loader": "../evil.py:load"}, 422, "loader must be 'file.py:function'"),
        ({"loader": "serve.py"}, 422, "loader must be 'file.py:function'"),
        ({"loader": "serve.py:load"}, 422, "serve.py is not in job"),
        ({"step": 9}, 404, "has no checkpoint of step 9 (its checkpoints' steps: 2)"),
        ({"inputs": [{"name": "x", "shape": [1, 8], "dtype": "float32"}]}, 422, "shape must be"),
        ({"inputs": [{"name": "x", "shape": [None, 8], "dtype": "object"}]}, 422, "dtype must"),
        ({"inputs": [{"name": "x", "shape": [None], "dtype": "int64"}] * 2}, 422, "twice"),
        (
            {"loader": None, "inputs": [{"name": "x", "shape": [None], "dtype": "int64"}]},
            422,
            "inputs are declared with a loader only",
        ),
    ]
    for body, status, message in cases:
        resp = register(api, job, **body)
        assert resp.status_code == status, (body, resp.json())
        assert message in error_of(resp)["message"], (body, error_of(resp))
    assert api.get("/api/v1/models").json()["models"] == []

    # the checkpoint changed since it was registered: the copy is refused, nothing is left
    ckpt = job["dir"] / "ckpt-000002.th"
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 0xFF
    ckpt.write_bytes(bytes(data))
    resp = register(api, job)
    assert resp.status_code == 422
    assert "is corrupt: its sha256 is" in error_of(resp)["message"]
    assert not (job["dir"] / "models" / "net").exists() or not any(
        p for p in (job["dir"] / "models" / "net").iterdir()
    )
    data[-1] ^= 0xFF
    ckpt.write_bytes(bytes(data))
    assert register(api, job).status_code == 201

    # another loader for the same name and step, or a model the job saved there: a conflict
    resp = register(api, job, loader="models/serve.py:other")
    assert resp.status_code == 409
    assert (
        "already holds models/net/step-000000002, a copy of its checkpoint of step 2 with the "
        "loader models/serve.py:load and 0 declared inputs"
    ) in error_of(resp)["message"]
    example = (torch.randn(2, 8),)
    write_model(
        open_storage(str(job["dir"])),
        "saved",
        Net(),
        example_inputs=example,
        metrics=None,
        loader=None,
        step=2,
        attempt=1,
        job_id=job["id"],
    )
    resp = register(api, job, name="saved")
    assert resp.status_code == 409
    assert "models/saved/step-000000002 (run.save_model saved it)" in error_of(resp)["message"]


def test_a_terabyte_sparse_checkpoint_is_refused_before_a_byte_is_copied(
    api: TestClient, job: dict[str, Any]
) -> None:
    """A checkpoint a job registered truthfully as 1 TiB (sparse: nothing on its disk) is
    refused by the server's default cap on its registered size; nothing is copied."""
    path = "ckpt-000000009.th"
    with (job["dir"] / path).open("wb") as fh:
        fh.truncate(1 << 40)
    body = {"attempt": 1, "step": 9, "path": path, "size": 1 << 40, "sha256": "0" * 64}
    assert api.post(f"{job['url']}/checkpoints", json=body, headers=AUTH).status_code == 201
    resp = register(api, job, "vast")
    assert resp.status_code == 422, resp.json()
    assert resp.json()["error"]["message"] == (
        f"job {job['id']}'s checkpoint of step 9 holds {1 << 40} bytes, more than the "
        f"{256 << 30} a model version may hold (the server's --model-max-bytes); refused "
        "before reading it"
    )
    assert not (job["dir"] / "models").exists()


def test_a_job_cannot_pass_off_a_record_of_kind_checkpoint_without_its_parts(
    api: TestClient, job: dict[str, Any]
) -> None:
    """``POST /jobs/{id}/models`` validates a "checkpoint" record like any other: the loader,
    the checkpoint it came from and exactly its file."""
    checkpoint(api, job, 4)
    assert register(api, job).status_code == 201
    good = job["dir"] / "models/net/step-000000004"
    record = json.loads((good / "model.json").read_text())
    weights = {"name": "weights.safetensors", "size": 1, "sha256": "0" * 64}
    for step, (change, message) in enumerate(
        [
            (lambda r: r.update(loader=None), "names its loader"),
            (lambda r: r.update(checkpoint=None), "names the checkpoint it came from"),
            (lambda r: r["files"].append(weights), "a 'checkpoint' model has ['checkpoint.ckpt']"),
            (lambda r: r.update(kind="export", checkpoint=None, loader=None), "'export' model"),
        ],
        start=10,
    ):
        bad = good.parent / f"step-{step:09d}"
        bad.mkdir()
        (bad / "checkpoint.ckpt").write_bytes((good / "checkpoint.ckpt").read_bytes())
        data = json.loads(json.dumps(record))
        change(data)
        (bad / "model.json").write_text(json.dumps(data))
        body = {"name": "net", "path": f"models/net/{bad.name}"}
        resp = api.post(f"{job['url']}/models", json=body, headers=AUTH)
        assert resp.status_code == 422, (message, resp.json())
        assert message in error_of(resp)["message"]


def test_the_loader_file_is_looked_up_in_the_archive_without_extracting_it(
    api: TestClient, job: dict[str, Any], tmp_path: Path
) -> None:
    """The server lists the uploaded archive's members: a name only a link or a directory
    has is no file of the workdir."""
    checkpoint(api, job, 1)
    archive = services(api).blobs.path(services(api).store.jobs.get(job["id"]).archive_sha256)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(n.endswith("models/serve.py") for n in names)
    resp = register(api, job, loader="models.py:load")
    assert (
        resp.status_code == 422
        and "its Python files: models/serve.py, train.py" in (error_of(resp)["message"])
    )
    client = client_for(api)
    with pytest.raises(ClientError, match=r"serve\.py is not in job"):
        client.register_model("net", job["id"], loader="serve.py:load")
    with pytest.raises(ModelError, match=r"an input must be NAME:DTYPE\[B,d1,...\]"):
        client.register_model("net", job["id"], loader="models/serve.py:load", inputs=["x"])


def test_declared_inputs_parse_and_check() -> None:
    assert parse_input("x:float32[B,1,8,8]") == {
        "name": "x",
        "shape": [None, 1, 8, 8],
        "dtype": "float32",
    }
    assert parse_input(" ids:int64[B] ") == {"name": "ids", "shape": [None], "dtype": "int64"}
    for text, message in [
        ("x:float32[1,8]", "dimension 0 must be B"),
        ("x:float32[B,B]", "dimension 1 must be a number"),
        ("x:float32[B,0]", "shape must be"),
        ("x:str[B]", "dtype must be one of"),
        ("x[B]", "an input must be NAME:DTYPE"),
        ("1x:float32[B]", "an input must be NAME:DTYPE"),
    ]:
        with pytest.raises(ModelError, match=message.replace("[", r"\[")):
            parse_input(text)
    with pytest.raises(ModelError, match="1 to 64 inputs"):
        check_inputs([])
