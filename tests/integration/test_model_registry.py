"""End to end: the digits example trained by real torchrun ranks saves its model
(``run.save_model``, collective over 2 ranks), the job registers it, and a user registers,
aliases and downloads it with the CLI; the downloaded program's outputs on the held-out
digits equal the trained model's (from its last checkpoint), and a corrupt copy is refused.
The same version exported to ONNX by the CLI gives those outputs under onnxruntime; the job's
last checkpoint registered with the example's loader (``serve.py:load``) downloads, loads
with it and exports with the job's code.

One server and one trained job serve the module's tests (an xdist group keeps them on one
worker); each test leaves the job's files as it found them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
import torch

from tests.support.servers import EXAMPLE, Server, assert_clean_stop, example_module, start_server
from trainhouse.sdk import load_model
from trainhouse.sdk.checkpoint import load_checkpoint
from trainhouse.serving.replica import loader_function

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("model-registry")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server, and the digits example trained on it for an epoch (saving its model as
    ``digits-cnn``): the server, the job, its checkpoints, the trained model and its
    held-out digits."""
    root = tmp_path_factory.mktemp("model-registry")
    with pytest.MonkeyPatch.context() as mp:
        # torch.export's loader makes an inductor cache: here, not in TMPDIR
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
        server = start_server(root / "home", "--cpus", "4")
        try:
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
            ckpts = server.cli_json("checkpoints", str(job["id"]))
            latest = ckpts["checkpoints"][-1]
            train = example_module()
            _, val = train.datasets(0)
            model = train.DigitsCNN()
            model.load_state_dict(
                load_checkpoint(Path(ckpts["directory"]) / latest["path"])["model"]
            )
            model.eval()
            yield {
                "server": server,
                "job": job,
                "directory": Path(ckpts["directory"]),
                "latest": latest,
                "model": model,
                "x": val.tensors[0],
                "root": root,
            }
        finally:
            assert_clean_stop(server)


def test_the_digits_example_saves_registers_and_downloads_its_model(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    server: Server = trained["server"]
    job = trained["job"]
    listed = server.cli_json("models", "list")
    assert ("digits-cnn", 1, 1) in [(m["name"], m["versions"], m["latest"]) for m in listed]
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
    model, x = trained["model"], trained["x"]
    assert trained["latest"]["step"] == v1["step"]
    with torch.no_grad():
        assert torch.allclose(served(x), model(x), atol=1e-6, rtol=0)
        assert torch.allclose(served(x[:1]), model(x[:1]), atol=1e-6, rtol=0)

    refused = server.cli("models", "delete", "digits-cnn@1")
    assert refused.returncode == 2 and "named by the alias" in refused.stderr

    # a byte flipped in the registered files: the download says so and keeps nothing
    weights = trained["directory"] / "models" / "digits-cnn"
    (saved,) = list(weights.iterdir())
    program = saved / "program.pt2"
    good = program.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    try:
        bad = server.cli("models", "download", "digits-cnn@1", str(tmp_path / "dl2"))
    finally:
        program.write_bytes(good)
    assert bad.returncode == 2 and "program.pt2 of digits-cnn@1 has sha256" in bad.stderr
    assert list((tmp_path / "dl2").iterdir()) == []


def onnx_outputs(path: str, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": x.numpy()})
    return torch.from_numpy(out)


def test_a_version_exports_to_onnx_with_the_cli(trained: dict[str, Any], tmp_path: Path) -> None:
    server: Server = trained["server"]
    out = tmp_path / "onnx"
    result = server.cli_json("models", "export", "digits-cnn@1", "--format", "onnx", str(out))
    assert Path(result["path"]) == out / "digits-cnn-v1.onnx"
    assert (result["model"], result["version"], result["inputs"]) == ("digits-cnn", 1, ["x"])
    assert json.loads((out / "digits-cnn-v1.json").read_text())["sha256"] == result["sha256"]
    model, x = trained["model"], trained["x"]
    with torch.no_grad():
        for rows in (x[:1], x[:7], x):
            assert torch.allclose(onnx_outputs(result["path"], rows), model(rows), atol=1e-5)

    refused = server.cli("models", "export", "digits-cnn@1", "--format", "onnx", str(out))
    assert refused.returncode == 2 and "digits-cnn-v1.onnx exists: give --force" in refused.stderr
    assert sorted(p.name for p in out.iterdir()) == ["digits-cnn-v1.json", "digits-cnn-v1.onnx"]


def test_the_jobs_checkpoint_registers_with_its_loader_loads_and_exports(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    server: Server = trained["server"]
    job, latest = trained["job"], trained["latest"]
    code = EXAMPLE.parent  # the job's workdir: serve.py's load rebuilds the CNN
    version = server.cli_json(
        "models",
        "register",
        "digits-ckpt",
        "--job",
        str(job["id"]),
        "--loader",
        "serve.py:load",
        "--input",
        "x:float32[B,1,8,8]",
    )
    assert (version["version"], version["kind"]) == (1, "checkpoint")
    assert version["step"] == latest["step"]
    assert version["record"]["checkpoint"]["digest"] == latest["sha256"]
    shown = server.cli("models", "show", "digits-ckpt")
    assert shown.returncode == 0 and "checkpoint (serve.py:load)" in shown.stdout

    out = server.cli_json("models", "download", "digits-ckpt@1", str(tmp_path / "dl"))
    loaded = load_model(Path(out["path"]), loader=loader_function(code, "serve.py:load"))
    model, x = trained["model"], trained["x"]
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))

    no_code = server.cli("models", "export", "digits-ckpt@1", str(tmp_path / "onnx"))
    assert no_code.returncode == 2 and "give that code with --workdir DIR" in no_code.stderr
    untrusted = server.cli(  # the loader is the job's code: run here only when asked to
        "models", "export", "digits-ckpt@1", str(tmp_path / "onnx"), "--workdir", str(code)
    )
    assert untrusted.returncode == 2 and "--trust-code" in untrusted.stderr
    result = server.cli_json(
        "models",
        "export",
        "digits-ckpt@1",
        str(tmp_path / "onnx"),
        "--workdir",
        str(code),
        "--trust-code",
    )
    assert result["source"]["kind"] == "checkpoint"
    with torch.no_grad():
        assert torch.allclose(onnx_outputs(result["path"], x), model(x), atol=1e-5)

    wrong = server.cli(
        "models", "register", "digits-ckpt", "--job", str(job["id"]), "--loader", "nope.py:load"
    )
    assert wrong.returncode == 2 and "nope.py is not in job" in wrong.stderr
