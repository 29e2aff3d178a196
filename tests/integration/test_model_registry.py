"""End to end: the digits example trained by real torchrun ranks saves its model
(``run.save_model``, collective over 2 ranks), the job registers it, and a user registers,
aliases and downloads it with the CLI; the downloaded program's outputs on the held-out
digits equal the trained model's (from its last checkpoint), and a corrupt copy is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.support.servers import EXAMPLE, Server
from trainhouse.sdk import load_model
from trainhouse.sdk.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration


def example_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_train", EXAMPLE.parent / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_digits_example_saves_registers_and_downloads_its_model(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    result = server.cli(
        "submit",
        str(EXAMPLE),
        "--set",
        "hparams.epochs=1",
        "--set",
        "hparams.save_model=digits-cnn",
        "--json",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    job = json.loads(result.stdout)
    assert job["state"] == "COMPLETED", job

    listed = server.cli_json("models", "list")
    assert [(m["name"], m["versions"], m["latest"]) for m in listed] == [("digits-cnn", 1, 1)]
    shown = server.cli_json("models", "show", "digits-cnn")
    (v1,) = shown["versions"]
    assert (v1["job_id"], v1["kind"], v1["attempt"]) == (job["id"], "export", 1)
    assert set(v1["metrics"]) == {"val_loss", "val_acc"} and 0 < v1["metrics"]["val_acc"] <= 1
    assert v1["signature"]["inputs"] == [
        {"name": "x", "shape": [None, 1, 8, 8], "dtype": "float32"}
    ]

    # a user registers the same saved model under another name, and aliases it
    again = server.cli_json("models", "register", "digits-prod", "--job", str(job["id"]))
    assert (again["model"], again["version"], again["step"]) == ("digits-prod", 1, v1["step"])
    moved = server.cli_json("models", "alias", "digits-cnn", "1", "prod")
    assert moved["aliases"] == ["prod"]

    out = server.cli_json("models", "download", "digits-cnn@prod", str(tmp_path / "dl"))
    served = load_model(Path(out["path"]))
    train = example_module()
    _, val = train.datasets(0)
    model = train.DigitsCNN()
    ckpts = server.cli_json("checkpoints", str(job["id"]))
    latest = ckpts["checkpoints"][-1]
    assert latest["step"] == v1["step"]
    model.load_state_dict(load_checkpoint(Path(ckpts["directory"]) / latest["path"])["model"])
    model.eval()
    x = val.tensors[0]
    with torch.no_grad():
        assert torch.allclose(served(x), model(x), atol=1e-6, rtol=0)
        assert torch.allclose(served(x[:1]), model(x[:1]), atol=1e-6, rtol=0)

    refused = server.cli("models", "delete", "digits-cnn@1")
    assert refused.returncode == 2 and "named by the alias" in refused.stderr

    # a byte flipped in the registered files: the download says so and keeps nothing
    weights = Path(ckpts["directory"]) / "models" / "digits-cnn"
    (saved,) = list(weights.iterdir())
    program = saved / "program.pt2"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    bad = server.cli("models", "download", "digits-cnn@1", str(tmp_path / "dl2"))
    assert bad.returncode == 2 and "program.pt2 of digits-cnn@1 has sha256" in bad.stderr
    assert list((tmp_path / "dl2").iterdir()) == []
