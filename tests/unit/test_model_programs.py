"""A saved model's program is data, never code (trainhouse.sdk._program): a job can write any
``program.pt2`` it likes, with a record that checks out, and whoever loads the version
(``load_model``, ``models export``, a replica) must not run a pickle or a compiled library of
it. Each hostile archive here is refused by name, and its payload never runs."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainhouse.errors import ModelError
from trainhouse.jobfs.storage import open_storage
from trainhouse.sdk import load_model
from trainhouse.sdk._model import write_model


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Payload:
    """Pickled, it writes ``marker`` when unpickled: what a hostile job would hide."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture(autouse=True)
def inductor_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    record = write_model(
        open_storage(tmp_path / "ckpt"),
        "net",
        Net().eval(),
        example_inputs=(torch.randn(3, 8),),
        metrics={},
        loader=None,
        step=1,
        attempt=1,
        job_id=None,
    )
    return tmp_path / "ckpt" / record["path"]


def rewrite_program(where: Path, change: Callable[[dict[str, bytes], str], None]) -> None:
    """Rewrite program.pt2's members with ``change`` (members by name, the root folder), and
    the record's size and sha256 with it, as a job can."""
    program = where / "program.pt2"
    with zipfile.ZipFile(program) as z:
        members = {n: z.read(n) for n in z.namelist()}
    root = next(iter(members)).split("/", 1)[0]
    change(members, root)
    with zipfile.ZipFile(program, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    raw = program.read_bytes()
    record = json.loads((where / "model.json").read_text())
    for f in record["files"]:
        if f["name"] == "program.pt2":
            f.update(size=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    (where / "model.json").write_text(json.dumps(record))


def pickled(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    return buf.getvalue()


def sample_inputs(marker: Path) -> Callable[[dict[str, bytes], str], None]:
    def change(m: dict[str, bytes], root: str) -> None:
        m[f"{root}/data/sample_inputs/model.pt"] = pickled(marker)

    return change


def pickled_weight(marker: Path) -> Callable[[dict[str, bytes], str], None]:
    def change(m: dict[str, bytes], root: str) -> None:
        name = f"{root}/data/weights/model_weights_config.json"
        config = json.loads(m[name])
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        m[name] = json.dumps(config).encode()
        m[f"{root}/data/weights/{first['path_name']}"] = pickled(marker)

    return change


def custom_object(marker: Path) -> Callable[[dict[str, bytes], str], None]:
    def change(m: dict[str, bytes], root: str) -> None:
        name = f"{root}/data/constants/model_constants_config.json"
        m[name] = json.dumps(
            {"config": {"obj": {"path_name": "opaque_obj_0", "use_pickle": True}}}
        ).encode()
        m[f"{root}/data/constants/opaque_obj_0"] = pickled(marker)

    return change


def compiled_library(marker: Path) -> Callable[[dict[str, bytes], str], None]:
    def change(m: dict[str, bytes], root: str) -> None:
        m[f"{root}/data/aotinductor/model/model.so"] = b"\x7fELF" + bytes(60)

    return change


def legacy_state_dict(marker: Path) -> Callable[[dict[str, bytes], str], None]:
    def change(m: dict[str, bytes], root: str) -> None:
        m[f"{root}/data/weights/model.pt"] = pickled(marker)

    return change


HOSTILE = [
    (sample_inputs, "sample inputs need a pickle"),
    (pickled_weight, "is a pickled object, not a tensor"),
    (custom_object, "holds 'data/constants/opaque_obj_0'"),
    (compiled_library, "holds 'data/aotinductor/model/model.so'"),
    (legacy_state_dict, "holds 'data/weights/model.pt'"),
]


@pytest.mark.parametrize(("attack", "why"), HOSTILE, ids=[a.__name__ for a, _ in HOSTILE])
def test_a_program_that_would_run_code_is_refused_and_runs_nothing(
    saved: Path, tmp_path: Path, attack: Any, why: str
) -> None:
    marker = tmp_path / "ran"
    rewrite_program(saved, attack(marker))
    with pytest.raises(ModelError, match=why) as refused:
        load_model(saved)
    assert "could run code" in str(refused.value)
    assert not marker.exists()


def test_the_payload_would_run_under_torch_export_load(saved: Path, tmp_path: Path) -> None:
    """What the check stands between: torch's own loader runs the sample inputs' pickle."""
    marker = tmp_path / "ran"
    rewrite_program(saved, sample_inputs(marker))
    with pytest.raises(Exception):  # noqa: B017 - torch fails after the payload ran
        torch.export.load(str(saved / "program.pt2"))
    assert marker.read_text() == "ran"


def test_a_plain_program_loads(saved: Path) -> None:
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert load_model(saved)(x).shape == (5, 4)
