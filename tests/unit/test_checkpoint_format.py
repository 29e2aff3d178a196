"""The checkpoint file format (tensors raw, the rest tagged JSON): round trips, what falls back
to torch.save, hostile files refused, old sha256 torch.save checkpoints, blake3 records."""

from __future__ import annotations

import collections
import hashlib
import io
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import trainhouse
from trainhouse.errors import CheckpointError
from trainhouse.jobfs.storage import new_hash
from trainhouse.sdk.checkpoint import RESERVED, _safety, load_checkpoint, refuse_unloadable
from trainhouse.sdk.checkpoint import _format as fmt
from trainhouse.sdk.checkpoint import _support as support


@pytest.fixture
def standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("TRAINHOUSE_SERVER", "TRAINHOUSE_JOB_ID", "TRAINHOUSE_CHECKPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def encode(state: Any) -> bytes:
    plan = fmt.plan(state)
    assert plan is not None
    out = io.BytesIO()
    plan.write(out.write)
    data = out.getvalue()
    assert len(data) == plan.size
    return data


def roundtrip(state: Any) -> Any:
    return load_checkpoint(io.BytesIO(encode(state)))


def dtype_names() -> list[str]:
    return sorted(fmt._torch_dtypes())


@pytest.mark.parametrize("name", dtype_names())
def test_every_dtype_round_trips_bit_exact(name: str) -> None:
    dtype = getattr(torch, name)
    raw = torch.randint(0, 256, (3, 5, 16), dtype=torch.uint8)
    t = raw[..., 0] % 2 == 1 if dtype == torch.bool else raw.view(dtype)
    back = roundtrip({"t": t, "scalar": t.reshape(-1)[0].clone(), "empty": t[:0]})
    for key in ("t", "scalar", "empty"):
        want = {"t": t, "scalar": t.reshape(-1)[0], "empty": t[:0]}[key]
        got = back[key]
        assert got.dtype == dtype and got.shape == want.shape
        assert got.storage_offset() == 0 and got.is_contiguous()
        as_bytes = got.reshape(-1).view(torch.uint8)
        assert torch.equal(as_bytes, want.contiguous().reshape(-1).view(torch.uint8))


def test_views_non_contiguous_and_shared_tensors() -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    state = {
        "base": base,
        "t": base.t(),  # non-contiguous
        "strided": base[::2, 1::3],
        "row": base[3],  # a view with an offset into base's storage
        "conj": torch.tensor([1 + 2j, 3 - 4j]).conj(),  # a lazy conjugate
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
        "grad": torch.ones(2, requires_grad=True),
    }
    state["again"] = state["t"]  # one tensor object twice: stored once, loaded once
    back = roundtrip(state)
    for key, value in state.items():
        assert torch.equal(back[key], value.detach().resolve_conj().resolve_neg()), key
    assert back["again"] is back["t"]
    assert back["grad"].requires_grad and not back["base"].requires_grad
    assert back["row"].data_ptr() != back["base"].data_ptr()  # a view is stored as its data
    back["base"][0, 0] = 7  # loaded tensors are writable and independent of each other
    assert back["row"][0] == 30


def test_the_rest_round_trips_alongside_the_tensors() -> None:
    state = {
        "model": collections.OrderedDict(w=torch.ones(2, 2)),
        "optim": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0], "foreach": None}],
        },
        "values": [True, False, 0, -(2**70), 1.5, float("inf"), "text", b"\x00\xff", None],
        (1, "tuple key"): "ok",
        2.5: "float key",
        "size": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "numpy": {
            "f64": np.linspace(0, 1, 7),
            "i8": np.arange(-3, 3, dtype=np.int8).reshape(2, 3),
            "big": np.arange(4, dtype=">u4"),  # big-endian stays big-endian
            "scalar": np.float32(2.5),
            "int": np.int64(-4),
            "empty": np.zeros((0, 2)),
        },
    }
    back = roundtrip(state)
    assert type(back["model"]) is collections.OrderedDict
    assert back["optim"]["param_groups"] == state["optim"]["param_groups"]
    assert back["optim"]["state"][0]["step"] == 3.0
    assert back["values"] == state["values"]
    assert back[(1, "tuple key")] == "ok" and back[2.5] == "float key"
    assert type(back["size"]) is torch.Size and back["size"] == torch.Size([2, 3])
    assert back["dtype"] is torch.bfloat16
    for key, want in state["numpy"].items():
        got = back["numpy"][key]
        assert type(got) is type(want) and got.dtype == want.dtype, key
        assert np.array_equal(got, want)
    assert np.isnan(roundtrip({"x": float("nan")})["x"])


@pytest.mark.parametrize(
    "state",
    [
        {"tags": {1, 2}},
        {"obj": object()},
        {"param": torch.nn.Parameter(torch.ones(2))},
        {"sparse": torch.eye(3).to_sparse()},
        {"objects": np.array([object()], dtype=object)},
        {"record": np.zeros(2, dtype=[("a", "i4")])},
        {"complex": 1 + 2j},
    ],
    ids=["set", "object", "parameter", "sparse", "object-array", "structured", "complex"],
)
def test_what_the_format_does_not_hold_is_not_encoded(state: dict[str, Any]) -> None:
    assert fmt.plan(state) is None


def test_a_state_only_torch_save_writes_is_saved_with_it(standalone: Path) -> None:
    with trainhouse.init() as run:
        rec = run.checkpoint.save({"w": torch.ones(2), "tags": {1, 2}}, step=1)
        assert rec is not None and rec["algorithm"] == "blake3"
        path = standalone / "checkpoints" / "step-000000001.pt"
        assert path.read_bytes()[:2] == b"PK"  # a torch.save zip
        loaded = run.checkpoint.load()
        assert loaded is not None and loaded["tags"] == {1, 2}
        with pytest.raises(CheckpointError, match="cannot load safely"):
            run.checkpoint.save({"w": torch.ones(2), "f": Path("x")}, step=2)


def test_saves_write_the_format_and_load_it_from_one_read(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load reads the file once: hashed as it is read, then parsed from that memory."""
    with trainhouse.init() as run:
        torch.manual_seed(4)
        state = {"w": torch.randn(1000, 300), "step": 7}
        rec = run.checkpoint.save(state, step=1)
        after_save = float(torch.rand(1))
        assert rec is not None and rec["algorithm"] == "blake3" and rec["kind"] == "file"
        path = standalone / "checkpoints" / "step-000000001.pt"
        assert fmt.is_ours(path.read_bytes()[:8])
        assert (
            json.loads((standalone / "checkpoints" / "step-000000001.pt.json").read_text())[
                "algorithm"
            ]
            == "blake3"
        )

        def no_second_read(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the file was read twice")

        monkeypatch.setattr(_safety, "load_checkpoint", no_second_read)
        monkeypatch.setattr("trainhouse.sdk.checkpoint._checkpointer.safe_load", no_second_read)
        loaded = run.checkpoint.load()
        assert loaded is not None and torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7
        assert float(torch.rand(1)) == after_save  # the RNG states came back from the file too
        assert RESERVED not in loaded


def test_only_a_load_keeps_the_bytes_it_verified(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(1000)}, step=1)
        assert run.checkpoint.latest() is not None
        assert run.checkpoint._read is None  # latest() alone holds no copy of the file
        assert run.checkpoint.load() is not None and run.checkpoint._read is None


def test_a_corrupt_blake3_checkpoint_is_skipped(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        run.checkpoint.save({"s": torch.tensor(1)}, step=1)
        run.checkpoint.save({"s": torch.tensor(2)}, step=2)
        with (ckpts / "step-000000002.pt").open("r+b") as fh:
            fh.seek(-4, io.SEEK_END)
            fh.write(b"\1\2\3\4")
        loaded = run.checkpoint.load()
        assert loaded is not None and int(loaded["s"]) == 1


def test_an_old_sha256_torch_save_checkpoint_still_verifies_and_loads(standalone: Path) -> None:
    """A checkpoint written before blake3 and the new format: torch.save, a record without an
    algorithm (sha256)."""
    ckpts = standalone / "checkpoints"
    ckpts.mkdir()
    for step in (1, 2):
        path = ckpts / f"step-{step:09d}.pt"
        torch.save({"w": torch.full((3,), float(step)), "np": np.arange(3)}, path)
        data = path.read_bytes()
        record = {
            "attempt": 1,
            "step": step,
            "path": path.name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "metrics": {},
            "kind": "file",
        }
        (ckpts / f"{path.name}.json").write_text(json.dumps(record))
    with trainhouse.init() as run:
        loaded = run.checkpoint.load(restore_rng=False)
        assert loaded is not None and torch.equal(loaded["w"], torch.full((3,), 2.0))
        assert np.array_equal(loaded["np"], np.arange(3))
        (ckpts / "step-000000002.pt").write_bytes(b"PK" + bytes(100))  # no longer matches
        loaded = run.checkpoint.load(restore_rng=False)
        assert loaded is not None and torch.equal(loaded["w"], torch.full((3,), 1.0))


def test_an_unknown_digest_algorithm_is_not_trusted(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        run.checkpoint.save({"s": torch.tensor(1)}, step=1)
        run.checkpoint.save({"s": torch.tensor(2)}, step=2)
        sidecar = ckpts / "step-000000002.pt.json"
        record = json.loads(sidecar.read_text())
        sidecar.write_text(json.dumps({**record, "algorithm": "crc32"}))
        loaded = run.checkpoint.load()
        assert loaded is not None and int(loaded["s"]) == 1
    with pytest.raises(CheckpointError, match="unknown checkpoint digest algorithm"):
        new_hash("crc32")


# -- hostile files -------------------------------------------------------------------------
def craft(header: Any, data: bytes = b"", *, raw_header: bytes | None = None) -> bytes:
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    out = fmt.MAGIC + struct.pack("<Q", len(head)) + head
    return out + bytes(-len(out) % fmt.ALIGN) + data


def refused(data: bytes, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(io.BytesIO(data))


def blob_file(entry: list[Any], data: bytes = bytes(64), tree: Any = None) -> bytes:
    return craft({"format": 1, "blobs": [entry], "tree": tree or ["t", 0]}, data)


HOSTILE = [
    (fmt.MAGIC + b"\x01", "does not start with"),
    (fmt.MAGIC + struct.pack("<Q", 1 << 40) + b"{}", "header claims"),
    (craft(None, raw_header=b"{not json"), "not JSON"),
    (craft(None, raw_header=b"\xff\xfe"), "not JSON"),
    (craft({"format": 2, "blobs": [], "tree": 1}), "format-1"),
    (craft({"format": 1, "tree": 1}), "no blob list"),
    (blob_file(["float32", [2], 0, 8, False], bytes(4)), "past the file's end"),
    (blob_file(["float32", [2], 1 << 62, 8, False]), "past the file's end"),
    (blob_file(["float32", [3], 0, 8, False]), "is not 8 bytes"),
    (blob_file(["float32", [-2], 0, 8, False]), "not a non-negative integer"),
    (blob_file(["float32", [True], 0, 4, False]), "not a non-negative integer"),
    (blob_file(["float32", "2", 0, 8, False]), "shape is not a list"),
    (blob_file(["object", [1], 0, 8, False]), "unknown dtype"),
    (blob_file(["int64", [1], 0, 8, True]), "cannot require grad"),
    (blob_file(["int64", [1], 0, 8, "yes"]), "requires_grad"),
    (blob_file(["np:|O", [1], 0, 8, False], tree=["a", 0]), "not allowed"),
    (blob_file(["np:V8", [1], 0, 8, False], tree=["a", 0]), "not allowed"),
    (blob_file(["np:<f8", [1], 0, 8, False]), "a torch one is expected"),
    (blob_file(["float32", [2], 0, 8]), "malformed"),
    (blob_file(["float32", [2], 0, 8, False], tree=["t", 1]), "does not exist"),
    (blob_file(["float32", [2], 0, 8, False], tree=["x", 0]), "unknown node"),
    (blob_file(["float32", [2], 0, 8, False], tree={"a": 1}), "malformed node"),
    (blob_file(["float32", [2], 0, 8, False], tree=["d", [[["l", []], 1]]]), "hashable"),
    (blob_file(["float32", [2], 0, 8, False], tree=["z", [1.5]]), "non-integer"),
    (blob_file(["float32", [2], 0, 8, False], tree=["b", "zz"]), "not hex"),
    (blob_file(["float32", [2], 0, 8, False], tree=["y", ["float32"]]), "unknown node"),
]


@pytest.mark.parametrize(("data", "match"), HOSTILE)
def test_hostile_headers_are_refused(data: bytes, match: str) -> None:
    refused(data, match)


@pytest.mark.parametrize(("data", "match"), HOSTILE)
def test_hostile_headers_are_refused_from_a_bytearray(data: bytes, match: str) -> None:
    """What a process without torch reads a file into (read_buffer's bytearray) is checked the
    same way."""
    with pytest.raises(CheckpointError, match=match):
        fmt.parse(bytearray(data))


def test_a_torch_free_state_parses_from_a_bytearray() -> None:
    state = {"step": 3, "b": b"\x00\xff", "t": (1, 2.5, None), "o": collections.OrderedDict(a=[1])}
    assert fmt.parse(bytearray(encode(state))) == state


def test_deep_nesting_is_refused() -> None:
    head = json.dumps({"format": 1, "blobs": [], "tree": 1}).encode()
    head = head.replace(b'"tree": 1', b'"tree": ' + b'["l",[' * 100_000 + b"1" + b"]]" * 100_000)
    refused(craft(None, raw_header=head), "not JSON|nested too deeply")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    data = encode({"w": torch.randn(1000)})
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="past the file's end"):
        load_checkpoint(path)
    refuse_unloadable(io.BytesIO(data))  # a whole file in the format is loadable by design


def test_the_hashing_writer_starts_writeback_of_a_local_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every 8 MB written to a local file start the disk writing them (no wait); a file
    object without a descriptor (fsspec, BytesIO) just gets written."""
    calls: list[tuple[int, int, int, int]] = []

    def sync_file_range(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((fd, offset, nbytes, flags))
        return 0

    monkeypatch.setattr(support, "_SYNC_FILE_RANGE", sync_file_range)
    chunk = bytes(3 << 20)
    with (tmp_path / "f").open("wb") as fh, support.HashingWriter(fh, "blake3") as writer:
        for _ in range(6):
            writer.write(chunk)
    assert [c[1:] for c in calls] == [(0, 0, 2), (0, 0, 2)]  # after 9 MB and after 18 MB
    assert (tmp_path / "f").stat().st_size == 18 << 20
    hasher = new_hash("blake3")
    hasher.update(chunk * 6)
    assert writer.hexdigest() == hasher.hexdigest()
    calls.clear()
    with support.HashingWriter(io.BytesIO()) as writer:
        for _ in range(6):
            writer.write(chunk)
    assert calls == []
