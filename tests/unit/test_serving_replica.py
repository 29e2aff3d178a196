"""A serving replica in process (the real Starlette app and batcher over a saved, exported
model): batched answers equal the in-process model's, requests from many clients share
batches, a swapped model answers from the next batch on, and bad inputs get a 4xx naming the
problem while the replica keeps serving."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from trainhouse.errors import ModelError
from trainhouse.jobfs.storage import open_storage
from trainhouse.sdk._model import write_model
from trainhouse.serving.replica import build_app, learn_outputs, load, loader_function

pytestmark = pytest.mark.xdist_group("serving-replica")  # its module fixtures made once


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    root = tmp_path_factory.mktemp("replica")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    record = write_model(
        open_storage(root),
        "digits",
        model,
        example_inputs=(torch.randn(4, 64),),
        metrics=None,
        loader=None,
        step=1,
        attempt=1,
        job_id=None,
    )
    return root / record["path"], model.eval()


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def test_batched_answers_equal_the_model_and_a_swap_takes_the_next_batch(
    saved: tuple[Path, torch.nn.Module],
) -> None:
    directory, model = saved
    app, batcher = build_app(load(directory), max_batch=32, max_wait_ms=50)
    x = torch.randn(16, 64)
    answers: dict[int, Any] = {}
    with TestClient(app) as client:
        start = threading.Barrier(16)

        def ask(i: int) -> None:
            start.wait()
            answers[i] = client.post("/predict", json={"inputs": x[i : i + 1].tolist()}).json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with torch.no_grad():
            expected = model(x)
        for i in range(16):
            assert (answers[i]["model"], answers[i]["version"]) == ("digits", 1)
            assert torch.allclose(
                torch.tensor(answers[i]["outputs"]), expected[i : i + 1], atol=1e-6
            )
        health = client.get("/health").json()
        assert health["examples"] == 16 and health["largest_batch"] > 1  # shared batches
        exposition = client.get("/metrics").text
        assert 'trainhouse_replica_requests_total{model="digits",outcome="ok"} 16.0' in exposition
        assert 'trainhouse_replica_batch_size_sum{model="digits"} 16.0' in exposition
        assert 'trainhouse_replica_latency_seconds_count{model="digits"} 16.0' in exposition

        newer = load(directory, version=2)
        newer.module = torch.nn.Sequential(newer.module, torch.nn.Flatten())  # another object
        batcher.swap(newer)
        after = client.post("/predict", json={"inputs": x[:3].tolist()}).json()
        assert after["version"] == 2
        assert torch.allclose(torch.tensor(after["outputs"]), expected[:3], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"inputs": [[1.0] * 63]},
            422,
            "inputs has shape [batch, 63]; the model takes [batch, 64]",
        ),
        ({"inputs": [[[1.0] * 64]]}, 422, "has shape [batch, 1, 64]"),
        ({"inputs": [["a"] * 64]}, 422, "must be nested lists of numbers"),
        ({"inputs": [[None] * 64]}, 422, "must be nested lists of numbers"),
        ({"inputs": [[1.0] * 64, [1.0] * 3]}, 422, "must be nested lists of numbers"),
        ({"inputs": []}, 422, "non-empty list"),
        ({"inputs": {"x": [[1.0] * 64]}}, 422, "must name exactly the model's inputs ['input']"),
        ({"values": [[1.0] * 64]}, 422, 'a JSON object {"inputs"'),
        ({"inputs": [[1.0] * 64] * 2000}, 413, "at most 1024 examples"),
    ],
)
def test_bad_inputs_get_a_4xx_that_names_the_problem(
    saved: tuple[Path, torch.nn.Module], body: Any, status: int, message: str
) -> None:
    app, _ = build_app(load(saved[0]), max_batch=8, max_wait_ms=1)
    with TestClient(app) as client:
        resp = client.post("/predict", json=body)
        assert resp.status_code == status, resp.json()
        assert message in resp.json()["error"]["message"]
        good = client.post("/predict", json={"inputs": [[0.5] * 64]})
        assert good.status_code == 200 and len(good.json()["outputs"]) == 1


def test_a_body_that_is_not_json_or_too_large_is_refused(
    saved: tuple[Path, torch.nn.Module],
) -> None:
    app, _ = build_app(load(saved[0]), max_body=1000)
    with TestClient(app) as client:
        resp = client.post("/predict", content=b"{not json")
        assert resp.status_code == 400 and "not JSON" in resp.json()["error"]["message"]
        resp = client.post("/predict", content=b"[" + b"1," * 2000 + b"1]")
        assert resp.status_code == 413 and "1000-byte limit" in resp.json()["error"]["message"]
        assert client.get("/health").json()["errors"] == 2
        exposition = client.get("/metrics").text
        assert 'trainhouse_replica_requests_total{model="digits",outcome="bad_input"} 2.0' in (
            exposition
        )


LOADER = """
import torch


def build(weights):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model.load_state_dict({k.removeprefix("body."): v for k, v in weights.items()})
    return model
"""


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) if x.sum() > -1e9 else -self.body(x)  # torch.export cannot


def test_a_model_saved_with_a_loader_is_served_from_the_jobs_code(tmp_path: Path) -> None:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "serve.py").write_text(LOADER)
    model = Branchy().eval()
    record = write_model(
        open_storage(tmp_path / "store"),
        "branchy",
        model,
        example_inputs=(torch.randn(2, 64),),
        metrics=None,
        loader="serve.py:build",
        step=0,
        attempt=1,
        job_id=None,
    )
    directory = tmp_path / "store" / record["path"]
    with pytest.raises(ModelError, match="give the workdir that holds it"):
        load(directory)
    app, _ = build_app(load(directory, workdir=workdir), max_batch=4, max_wait_ms=1)
    x = torch.randn(3, 64)
    with TestClient(app) as client:
        answer = client.post("/predict", json={"inputs": x.tolist()}).json()
    with torch.no_grad():
        assert torch.allclose(torch.tensor(answer["outputs"]), model(x), atol=1e-6)
    (tmp_path / "outside.py").write_text(LOADER)
    (workdir / "evil.py").symlink_to(tmp_path / "outside.py")
    with pytest.raises(ModelError, match="not a file inside"):
        loader_function(workdir, "evil.py:build")
    with pytest.raises(ModelError, match="a relative path inside its workdir"):
        loader_function(workdir, "../outside.py:build")


def test_a_model_registered_without_its_inputs_takes_float_lists_of_any_shape() -> None:
    """A checkpoint registered with a loader and no --input has no declared inputs: a request
    is taken as float32 of any shape (the model says what it cannot take), never refused as
    'several inputs'."""
    from trainhouse.serving.inputs import BadInput, parse_inputs

    (x,) = parse_inputs({"inputs": [[1, 2, 3], [4, 5, 6]]}, {"inputs": []}, 10)
    assert (tuple(x.shape), str(x.dtype)) == ((2, 3), "torch.float32")
    with pytest.raises(BadInput, match="true/false"):
        parse_inputs({"inputs": [[True]]}, {"inputs": []}, 10)
    with pytest.raises(BadInput, match="non-empty list"):
        parse_inputs({"inputs": 3}, {"inputs": []}, 10)


class Picky(torch.nn.Module):
    """Three features per example; an example holding 13 it refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x == 13).any()):
            raise ValueError("13 is unlucky")
        return self.linear(x)


def test_one_odd_request_does_not_fail_its_batch() -> None:
    """Requests that arrive together share a batch; one the others cannot be stacked with (a
    model registered without its inputs takes any shape), or one the model fails on, gets its
    own answer, and its neighbours theirs, never its error."""
    import asyncio

    from trainhouse.serving.replica import Batcher, Loaded

    torch.manual_seed(0)
    module = Picky().eval()
    good = [torch.randn(2, 3), torch.randn(1, 3), torch.randn(3, 3)]
    odd = torch.randn(1, 4)  # another shape: cannot be put with the others
    unlucky = torch.tensor([[13.0, 1.0, 2.0]])  # the model's own refusal

    async def together() -> list[Any]:
        batcher = Batcher(Loaded(module, {"inputs": []}, "picky", 1), max_wait=0.2)
        batcher.start()
        try:
            return await asyncio.gather(
                batcher.predict([good[0]]),
                batcher.predict([odd]),
                batcher.predict([good[1]]),
                batcher.predict([unlucky]),
                batcher.predict([good[2]]),
                return_exceptions=True,
            )
        finally:
            await batcher.stop()

    answers = asyncio.run(together())
    assert isinstance(answers[1], RuntimeError)  # the model's own error, for that one only
    assert isinstance(answers[3], ValueError) and "unlucky" in str(answers[3])
    with torch.no_grad():
        for answer, x in zip((answers[0], answers[2], answers[4]), good, strict=True):
            assert not isinstance(answer, BaseException), answer
            assert torch.allclose(torch.tensor(answer[0]), module(x), atol=1e-6)


def test_a_replica_learns_the_outputs_of_a_model_whose_record_has_none() -> None:
    """A checkpoint's record declares its inputs only: the replica runs the model on a batch
    of them as it loads it and knows what it answers; a model that fails on them, answers no
    tensor, or has no declared inputs leaves its outputs unknown (and still loads)."""
    two = {"inputs": [{"name": "x", "shape": [None, 3], "dtype": "float32"}], "outputs": []}

    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.sum(dim=1), x.long()

    assert learn_outputs(torch.nn.Linear(3, 2), two, "cpu") == [
        {"name": "output", "shape": [None, 2], "dtype": "float32"}
    ]
    assert learn_outputs(Pair(), two, "cpu") == [
        {"name": "output_0", "shape": [None], "dtype": "float32"},
        {"name": "output_1", "shape": [None, 3], "dtype": "int64"},
    ]
    assert learn_outputs(torch.nn.Linear(5, 2), two, "cpu") is None  # fails on the inputs
    assert learn_outputs(lambda x: {"y": x}, two, "cpu") is None  # answers no tensor
    assert learn_outputs(torch.nn.Linear(3, 2), {"inputs": [], "outputs": []}, "cpu") is None
