"""ONNX exports of registered models (``models export NAME@V --format onnx DIR``): the digits
CNN exported with ``torch.onnx.export(dynamo=True)`` gives onnxruntime outputs equal to torch's
on any batch size; the JSON next to it describes it; a model rebuilt by a loader needs its
job's code; torch's reason when it cannot export; outputs in the way; the missing extra. The
client's path (download, then the export in a child process) runs against the app in
process."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import onnxruntime as ort
import pytest
import torch
from fastapi.testclient import TestClient

from tests.support.api import BASE_URL, InProcessTransport, submit, wait_state, workdir
from tests.support.servers import EXAMPLE
from trainhouse.client import Client
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.errors import ModelError
from trainhouse.jobfs.storage import open_storage
from trainhouse.sdk._model import write_model
from trainhouse.serving.export import ExportFailed, export_onnx

pytestmark = pytest.mark.xdist_group("model-export")  # its module fixtures made once

DIGITS = EXAMPLE.parent
BRANCHY = """\
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 10)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: no graph captures it
            return self.lin(x)
        return -self.lin(x)


def load(weights):
    model = Branchy()
    model.load_state_dict(weights)
    return model
"""


def digits_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_train", DIGITS / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """torch.export's loader makes an inductor cache: in the module's directory, not TMPDIR.
    torch.onnx's exporter shows tqdm progress bars, whose monitor thread (a daemon of tqdm's,
    started with the first bar) outlives the test that started it: off here (``models
    export`` runs the export in a child process, where it ends with the process)."""
    import tqdm

    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
        mp.setattr(tqdm.tqdm, "monitor_interval", 0)
        yield root


@pytest.fixture(scope="module")
def cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    model: torch.nn.Module = digits_module().DigitsCNN()
    return model.eval()


def save(root: Path, model: Any, inputs: torch.Tensor, **kw: Any) -> Path:
    record = write_model(
        open_storage(str(root)),
        kw.pop("name", "digits"),
        model,
        example_inputs=(inputs,),
        metrics={"val_acc": 0.9},
        loader=kw.pop("loader", None),
        step=kw.pop("step", 7),
        attempt=1,
        job_id=None,
    )
    return root / record["path"]


@pytest.fixture(scope="module")
def exported(cache: Path, cnn: torch.nn.Module) -> dict[str, Any]:
    saved = save(cache / "ckpts", cnn, torch.randn(4, 1, 8, 8))
    return export_onnx(saved, cache / "out", name="digits", version=3)


def run_onnx(path: str, x: torch.Tensor, name: str = "x") -> torch.Tensor:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {name: x.numpy()})
    return torch.from_numpy(out)


def test_the_digits_cnn_exported_to_onnx_matches_torch_on_any_batch(
    exported: dict[str, Any], cnn: torch.nn.Module
) -> None:
    path = Path(exported["path"])
    assert path.name == "digits-v3.onnx" and path.is_file()
    for batch in (1, 2, 5, 64, 300):
        x = torch.randn(batch, 1, 8, 8)
        with torch.no_grad():
            want = cnn(x)
        got = run_onnx(str(path), x)
        assert got.shape == (batch, 10)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), (batch, (got - want).abs().max())


def test_the_json_next_to_it_describes_the_export(exported: dict[str, Any]) -> None:
    path = Path(exported["path"])
    meta = json.loads(Path(exported["metadata"]).read_text())
    assert Path(exported["metadata"]) == path.with_suffix(".json")
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert meta["size"] == path.stat().st_size and meta["file"] == path.name
    assert (meta["model"], meta["version"], meta["format"]) == ("digits", 3, "onnx")
    assert (meta["inputs"], meta["outputs"], meta["dynamic_batch"]) == (["x"], ["output"], True)
    assert meta["signature"] == {
        "inputs": [{"name": "x", "shape": [None, 1, 8, 8], "dtype": "float32"}],
        "outputs": [{"name": "output", "shape": [None, 10], "dtype": "float32"}],
    }
    assert meta["source"]["kind"] == "export" and meta["source"]["step"] == 7
    assert meta["torch"] == torch.__version__ and isinstance(meta["opset"], int)
    assert {k: v for k, v in exported.items() if k not in ("path", "metadata")} == meta


def test_outputs_in_the_way_are_replaced_only_with_force(
    exported: dict[str, Any], cache: Path, cnn: torch.nn.Module
) -> None:
    saved = save(cache / "ckpts", cnn, torch.randn(4, 1, 8, 8))
    with pytest.raises(ModelError, match=r"digits-v3\.onnx exists: give --force"):
        export_onnx(saved, cache / "out", name="digits", version=3)
    (cache / "file").write_text("x")
    with pytest.raises(ModelError, match="is not a directory"):
        export_onnx(saved, cache / "file", name="digits", version=3, force=True)
    again = export_onnx(saved, cache / "out", name="digits", version=3, force=True)
    assert again["sha256"] == hashlib.sha256(Path(again["path"]).read_bytes()).hexdigest()
    assert sorted(p.name for p in (cache / "out").iterdir()) == ["digits-v3.json", "digits-v3.onnx"]


def test_a_loader_model_needs_its_jobs_code_and_is_exported_with_it(
    cache: Path, cnn: torch.nn.Module
) -> None:
    saved = save(cache / "loader", cnn, torch.randn(4, 1, 8, 8), loader="serve.py:load")
    with pytest.raises(ModelError, match=r"loader serve\.py:load, a function of its job's code"):
        export_onnx(saved, cache / "out-loader", version=1)
    assert not (cache / "out-loader").exists()
    result = export_onnx(saved, cache / "out-loader", version=1, workdir=DIGITS)
    assert result["source"]["kind"] == "loader" and result["source"]["loader"] == "serve.py:load"
    x = torch.randn(9, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(run_onnx(result["path"], x), cnn(x), atol=1e-5, rtol=0)


def test_torchs_reason_is_named_when_it_cannot_export(cache: Path) -> None:
    code = cache / "branchy"
    code.mkdir()
    (code / "branchy.py").write_text(BRANCHY)
    branchy: dict[str, Any] = {}
    exec(compile(BRANCHY, "branchy.py", "exec"), branchy)
    model = branchy["Branchy"]()
    saved = save(cache / "branchy-ckpts", model, torch.randn(4, 64), loader="branchy.py:load")
    with pytest.raises(ExportFailed) as failed:
        export_onnx(saved, cache / "out-branchy", version=1, workdir=code)
    # torch's exception and its root cause, the data-dependent branch, without the colours
    message = str(failed.value)
    assert re.match(r"torch\.onnx\.export cannot export digits: \w+, because \w+: ", message)
    assert "data-dependent" in message and "\x1b" not in message
    assert not (cache / "out-branchy").exists() or not any((cache / "out-branchy").iterdir())


def test_the_missing_extra_is_named(
    cache: Path, cnn: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = save(cache / "extra", cnn, torch.randn(4, 1, 8, 8))
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # what an install without it sees
    with pytest.raises(ModelError, match=r"needs onnxscript \(the onnx extra\): pip install "):
        export_onnx(saved, cache / "out-extra", version=1)
    with pytest.raises(ModelError, match=r"pip install 'trainhouse\[onnx\]'"):
        Client("http://127.0.0.1:9").export_model("digits@1", cache / "out-extra")
    # the command says so before it asks any server, brackets and all
    script = (
        "import sys; sys.modules['onnx'] = None\n"
        "from trainhouse.cli.app import app\n"
        f"app(['models', 'export', 'digits@1', {str(cache / 'out-extra')!r}, '--url', "
        "'http://127.0.0.1:9'], prog_name='trainhouse')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "needs onnx (the onnx extra): pip install 'trainhouse[onnx]'" in done.stderr


# -- the client's path: download (sha256 checked), export in a child process -------------------
@pytest.fixture
def job(api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    created = submit(api, "entrypoint: python train.py\n", workdir(tmp_path)).json()
    wait_state(api, created["id"], {"COMPLETED"})
    directory = Path(api.get(f"/api/v1/jobs/{created['id']}/checkpoints").json()["directory"])
    return {"id": created["id"], "dir": directory}


def client_for(api: TestClient) -> Client:
    """The Python client, over the app in process."""
    client = Client(BASE_URL)
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    return client


def test_the_client_downloads_and_exports_in_a_child_process(
    api: TestClient, job: dict[str, Any], cnn: torch.nn.Module, tmp_path: Path
) -> None:
    save(job["dir"], cnn, torch.randn(4, 1, 8, 8), step=4)
    save(job["dir"], cnn, torch.randn(4, 1, 8, 8), name="needs-code", loader="serve.py:load")
    client = client_for(api)
    client.register_model("digits", job["id"], 4)
    client.register_model("needs-code", job["id"], 7)
    client.set_alias("digits", "prod", 1)

    result = client.export_model("digits@prod", tmp_path / "out")
    assert Path(result["path"]) == tmp_path / "out" / "digits-v1.onnx"
    assert (result["model"], result["version"], result["source"]["step"]) == ("digits", 1, 4)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "digits-v1.json",
        "digits-v1.onnx",
    ]  # the download it exported from is gone
    x = torch.randn(6, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(run_onnx(result["path"], x), cnn(x), atol=1e-5, rtol=0)

    with pytest.raises(ModelError, match=r"digits-v1\.onnx exists: give --force"):
        client.export_model("digits@1", tmp_path / "out")
    with pytest.raises(ModelError, match=r"needs-code@1 is rebuilt by the loader serve\.py:load"):
        client.export_model("needs-code@1", tmp_path / "out")
    # its code given, the loader still runs in this process only when trusted
    with pytest.raises(ModelError, match=r"would run in this process.*--trust-code"):
        client.export_model("needs-code@1", tmp_path / "out", workdir=DIGITS)
    assert not (tmp_path / "out" / "needs-code-v1.onnx").exists()
    with pytest.raises(ModelError, match="format must be 'onnx'"):
        client.export_model("digits@1", tmp_path / "out", format="tflite")
