"""run.checkpoint in one process: RNG states, full disks, the server's list, storage URLs,
sharded directories and background saves."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import pickle
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import httpx
import numpy as np
import pytest
import torch

import trainhouse
from trainhouse.core.wire import FILE_WORK_READ
from trainhouse.errors import CheckpointError, ClientError
from trainhouse.jobfs.storage import FsspecStorage, LocalStorage, new_hash
from trainhouse.sdk._server import ServerLink
from trainhouse.sdk._transport import JobAPI
from trainhouse.sdk.checkpoint import RESERVED, Checkpointer, SaveHandle, load_checkpoint
from trainhouse.sdk.checkpoint._registry import ServerRegistry
from trainhouse.sdk.checkpoint._safety import check_dcp_metadata
from trainhouse.sdk.checkpoint._support import is_disk_full

DISK_FULL = "the disk is full (No space left on device)"


@pytest.fixture
def standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in (
        "TRAINHOUSE_JOB_ID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "TRAINHOUSE_CHECKPOINT_URL",
        "TRAINHOUSE_CHECKPOINT_DIR",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def memory_url() -> Iterator[str]:
    url = f"memory://trainhouse-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


# -- fault injection -------------------------------------------------------------------------
class _Limited:
    """A file that takes ``room`` more bytes, then fails like a full disk."""

    def __init__(self, fh: Any, storage: FullDisk) -> None:
        self._fh = fh
        self._storage = storage

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        room = self._storage.room
        if len(view) > room:
            self._fh.write(view[:room])
            self._storage.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._storage.room -= len(view)
        return int(self._fh.write(view))

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> _Limited:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FullDisk(LocalStorage):
    """A local storage that has ``room`` bytes left."""

    def __init__(self, root: Path, room: int) -> None:
        super().__init__(root)
        self.room = room

    def open_write(self, rel: str) -> Any:
        return _Limited(super().open_write(rel), self)


class Gated(LocalStorage):
    """A local storage whose file writes wait for ``gate``; remembers what it published."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.published: list[str] = []

    def open_write(self, rel: str) -> Any:
        if ".tmp-" in rel and not rel.endswith(".json") and ".json.tmp" not in rel:
            assert self.gate.wait(30), "the gate was never opened"
        return super().open_write(rel)

    def publish(self, tmp: str, final: str) -> None:
        super().publish(tmp, final)
        self.published.append(final)


class FakeAPI:
    """The server's checkpoint endpoints, in memory."""

    def __init__(self, listed: list[dict[str, Any]] | None = None) -> None:
        self.listed = list(listed or [])
        self.registered: list[dict[str, Any]] = []
        self.corrupt: list[tuple[int, str]] = []
        self.corrupt_status = 200

    def checkpoints(self) -> list[dict[str, Any]]:
        return [dict(c) for c in self.listed]

    def register_checkpoint(
        self, record: dict[str, Any], *, retry_for: float = 60.0
    ) -> dict[str, Any]:
        self.registered.append(record)
        out = {**record, "id": 100 + len(self.registered)}
        self.listed.append(out)
        return out

    def report_corrupt(self, checkpoint_id: int, reason: str) -> dict[str, Any]:
        if self.corrupt_status == 404:
            raise ClientError("no such route", status=404, code="not_found")
        self.corrupt.append((checkpoint_id, reason))
        return {}

    def close(self) -> None:
        pass


def with_server(directory: Path, api: FakeAPI) -> Checkpointer:
    """A checkpointer of ``directory`` whose registry is the fake server (for a rank that sends
    no metrics)."""
    link = ServerLink(api, attempt=1, spool=None, report=False)  # type: ignore[arg-type]
    return Checkpointer(directory, registry=ServerRegistry(link))


# -- RNG states --------------------------------------------------------------------------
def test_rng_states_are_saved_and_restored(standalone: Path) -> None:
    with trainhouse.init() as run:
        random.seed(1)
        np.random.seed(2)
        torch.manual_seed(3)
        state = {"w": torch.ones(2), "meta": {"k": 1}}
        run.checkpoint.save(state, step=1)
        assert RESERVED not in state  # the user's dict is untouched
        expected = draws()
        draws()
        loaded = run.checkpoint.load()
        assert loaded is not None and RESERVED not in loaded and loaded["meta"] == {"k": 1}
        assert draws() == expected


def test_rng_file_loads_with_plain_weights_only(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(2)}, step=1)
    # no numpy allow-list needed: the integration test and users torch.load it directly
    raw = load_checkpoint(standalone / "checkpoints" / "step-000000001.pt")
    rng = raw[RESERVED]["rng"]
    assert len(rng) == 1 and set(rng[0]) >= {"python", "numpy", "torch"}


def test_rng_false_and_restore_rng_false(standalone: Path) -> None:
    with trainhouse.init() as run:
        torch.manual_seed(3)
        run.checkpoint.save({"w": torch.ones(2)}, step=1, rng=False)
        raw = load_checkpoint(standalone / "checkpoints" / "step-000000001.pt")
        assert RESERVED not in raw
        torch.manual_seed(5)
        run.checkpoint.save({"w": torch.ones(2)}, step=2)
        after_save = float(torch.rand(1))
        now = float(torch.rand(1))
        loaded = run.checkpoint.load(restore_rng=False)
        assert loaded is not None and RESERVED not in loaded
        assert float(torch.rand(1)) not in (after_save, now)  # RNG left alone
        run.checkpoint.load()
        assert float(torch.rand(1)) == after_save


def test_reserved_key_is_refused(standalone: Path) -> None:
    with trainhouse.init() as run, pytest.raises(CheckpointError, match="reserved"):
        run.checkpoint.save({RESERVED: 1}, step=1)


def test_rng_of_a_missing_rank_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    from trainhouse.sdk.checkpoint import _rng as rng

    torch.manual_seed(1)
    saved = [rng.capture(), rng.capture()]
    torch.manual_seed(2)
    expected = float(torch.rand(1))
    torch.manual_seed(2)
    with caplog.at_level(logging.WARNING, logger="trainhouse"):
        assert rng.restore_rank(saved, 0, 3) is True
    assert "RNG states of 2 ranks, this run has 3" in caplog.text
    torch.manual_seed(2)
    assert rng.restore_rank(saved, 2, 3) is False  # no state for rank 2: untouched
    assert float(torch.rand(1)) == expected


# -- full disk ---------------------------------------------------------------------------
def test_full_disk_keeps_the_previous_checkpoint(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(4)}, step=1)
        before = (ckpts / "step-000000001.pt").read_bytes()
        run.checkpoint.storage = FullDisk(ckpts, room=1000)
        with pytest.raises(CheckpointError) as err:
            run.checkpoint.save({"w": torch.zeros(100_000)}, step=2)
        message = str(err.value)
        assert DISK_FULL in message
        assert str(ckpts / "step-000000002.pt") in message
        assert "bytes free" in message
        assert f"previous checkpoint {ckpts / 'step-000000001.pt'} (step 1) is intact" in message
        assert sorted(p.name for p in ckpts.iterdir()) == [
            "step-000000001.pt",
            "step-000000001.pt.json",
        ]  # the temp file is gone, nothing of step 2 is left
        assert (ckpts / "step-000000001.pt").read_bytes() == before
        run.checkpoint.storage = LocalStorage(ckpts)
        loaded = run.checkpoint.load()
        assert loaded is not None and torch.equal(loaded["w"], torch.ones(4))


def test_full_disk_without_an_earlier_checkpoint(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.storage = FullDisk(standalone / "checkpoints", room=10)
        with pytest.raises(CheckpointError, match="there is no earlier checkpoint"):
            run.checkpoint.save({"w": torch.zeros(1000)}, step=1)


def test_torch_write_failure_counts_as_full_only_without_space(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_save(obj: Any, f: Any, *a: Any, **kw: Any) -> None:
        f.write(b"x" * 10)
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    # a set: only torch.save writes it (the trainhouse format does not hold sets)
    state = {"w": torch.zeros(1000), "tags": {1, 2}}
    with trainhouse.init() as run:
        monkeypatch.setattr(torch, "save", failing_save)
        monkeypatch.setattr(LocalStorage, "free_bytes", lambda self: 5)
        with pytest.raises(CheckpointError, match=r"No space left on device\); 5 bytes free"):
            run.checkpoint.save(state, step=1)
        monkeypatch.setattr(LocalStorage, "free_bytes", lambda self: 10**12)
        with pytest.raises(RuntimeError, match="file write failed"):
            run.checkpoint.save(state, step=1)
    assert list((standalone / "checkpoints").iterdir()) == []


def test_disk_full_is_found_anywhere_in_the_chain() -> None:
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    enospc = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise enospc
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598") from None
    except RuntimeError as exc:
        wrapped = exc
    assert wrapped.__context__ is enospc
    assert is_disk_full(wrapped, free=None, needed=0)
    dcp_failure = CheckpointException("save", {1: _wrap_exception(enospc)})
    assert is_disk_full(dcp_failure, free=None, needed=0)
    assert not is_disk_full(OSError(errno.EACCES, "denied"), free=0, needed=10)


# -- the server's list, corrupt checkpoints ------------------------------------------------
def test_corrupt_and_missing_checkpoints_are_reported(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHOUSE_KEEP_LAST", "5")  # three checkpoints stay
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        recs = [run.checkpoint.save({"s": torch.tensor(s)}, step=s) for s in (1, 2, 3)]
        api = FakeAPI([{**r, "id": i + 1} for i, r in enumerate(recs) if r])
        ckpt = with_server(ckpts, api)
        (ckpts / "step-000000003.pt").unlink()
        with (ckpts / "step-000000002.pt").open("r+b") as fh:
            fh.seek(-20, io.SEEK_END)
            fh.write(b"\0" * 20)
        loaded = ckpt.load()
        assert loaded is not None and int(loaded["s"]) == 1
        assert [i for i, _ in api.corrupt] == [3, 2]
        assert api.corrupt[0][1].startswith("missing")
        assert "blake3 mismatch" in api.corrupt[1][1]
        # an old server without the endpoint: logged, the load goes on
        api.corrupt_status = 404
        loaded = ckpt.load()
        assert loaded is not None and int(loaded["s"]) == 1


def test_report_corrupt_posts_to_the_checkpoint() -> None:
    seen: list[tuple[str, str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={"ok": True})

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(handler))
    api.report_corrupt(3, "sha256 mismatch")
    api.close()
    assert seen == [("POST", "/api/v1/jobs/7/checkpoints/3/corrupt", {"reason": "sha256 mismatch"})]


def test_a_model_registration_waits_for_the_server_to_hash_it() -> None:
    """The server answers a registration once it has hashed the model's files (minutes for a
    large one, in its bounded pool): the SDK waits that long for the answer, and no longer
    than its usual 10 s for anything else."""
    reads: dict[str, float] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        reads[request.url.path] = request.extensions["timeout"]["read"]
        return httpx.Response(201, json={"version": 1})

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(handler))
    assert api.register_model("digits", "models/digits/step-000000001") == {"version": 1}
    api.report_corrupt(3, "sha256 mismatch")
    api.close()
    assert reads == {
        "/api/v1/jobs/7/models": FILE_WORK_READ,
        "/api/v1/jobs/7/checkpoints/3/corrupt": 10.0,
    }


def test_unregistered_sidecar_checkpoints_are_candidates(standalone: Path) -> None:
    with trainhouse.init() as run:
        first = run.checkpoint.save({"s": torch.tensor(1)}, step=1)
        run.checkpoint.save({"s": torch.tensor(2)}, step=2)  # the server was unreachable
        assert first is not None
        api = FakeAPI([{**first, "id": 1}])
        ckpt = with_server(standalone / "checkpoints", api)
        loaded = ckpt.load()
        assert loaded is not None and int(loaded["s"]) == 2
        assert [r["step"] for r in api.registered] == [2]  # registered now
        assert api.registered[0]["kind"] == "file" and "_sidecar" not in api.registered[0]
        loaded = ckpt.load()  # now listed by the server: not registered twice
        assert loaded is not None and int(loaded["s"]) == 2 and len(api.registered) == 1


def test_a_corrupt_unregistered_checkpoint_is_skipped(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        first = run.checkpoint.save({"s": torch.tensor(1)}, step=1)
        run.checkpoint.save({"s": torch.tensor(2)}, step=2)
        (ckpts / "step-000000002.pt").write_bytes(b"garbage")
        assert first is not None
        api = FakeAPI([{**first, "id": 1}])
        loaded = with_server(ckpts, api).load()
        assert loaded is not None and int(loaded["s"]) == 1
        assert api.registered == [] and api.corrupt == []  # no id to report


def test_records_carry_their_kind(standalone: Path) -> None:
    with trainhouse.init() as run:
        rec = run.checkpoint.save({"w": torch.ones(2)}, step=1, metrics={"l": float("nan")})
        assert rec is not None and rec["kind"] == "file" and rec["metrics"] == {"l": None}
        side = json.loads((standalone / "checkpoints" / "step-000000001.pt.json").read_text())
        assert side == rec
        rec = run.checkpoint.save({"w": torch.ones(2)}, step=2, sharded=True)
        assert rec is not None and rec["kind"] == "sharded" and rec["path"] == "step-000000002"
        assert (standalone / "checkpoints" / "step-000000002.json").is_file()


# -- storage URLs --------------------------------------------------------------------------
def test_checkpoint_url_memory(
    standalone: Path, memory_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHOUSE_CHECKPOINT_URL", memory_url)
    with trainhouse.init() as run:
        assert isinstance(run.checkpoint.storage, FsspecStorage)
        assert run.checkpoint.directory is None
        rec = run.checkpoint.save({"w": torch.arange(3.0)}, step=4)
        assert rec is not None
        fs = fsspec.filesystem("memory")
        data = fs.cat(f"{memory_url}/step-000000004.pt")
        assert rec["algorithm"] == "blake3"
        hasher = new_hash("blake3")
        hasher.update(data)
        assert hasher.hexdigest() == rec["sha256"] and len(data) == rec["size"]
        assert json.loads(fs.cat(f"{memory_url}/step-000000004.pt.json")) == rec
        h = run.checkpoint.save({"w": torch.arange(3.0) + 1}, step=5, blocking=False)
        h.wait()
        template = {"w": torch.zeros(3)}
        run.checkpoint.save({"w": torch.arange(3.0) + 2}, step=6, sharded=True)
        loaded = run.checkpoint.load(template)
        assert loaded is template and torch.equal(template["w"], torch.arange(3.0) + 2)
        fs.rm(f"{memory_url}/step-000000006", recursive=True)
        loaded = run.checkpoint.load()
        assert loaded is not None and torch.equal(loaded["w"], torch.arange(3.0) + 1)
    assert not [n for n in fs.ls(memory_url, detail=False) if ".tmp-" in n]


def test_checkpoint_url_file(
    standalone: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHOUSE_CHECKPOINT_URL", f"file://{tmp_path}/shared/job-7")
    with trainhouse.init() as run:
        assert run.checkpoint.directory == tmp_path / "shared" / "job-7"
        run.checkpoint.save({"w": torch.ones(2)}, step=1)
        assert (tmp_path / "shared" / "job-7" / "step-000000001.pt").is_file()
        assert not (standalone / "checkpoints").exists()
        loaded = run.checkpoint.load()
        assert loaded is not None and torch.equal(loaded["w"], torch.ones(2))


def test_fsspec_file_storage_works_for_checkpoints(standalone: Path, tmp_path: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.storage = FsspecStorage(f"file://{tmp_path}/fs")
        run.checkpoint.save({"w": torch.ones(2)}, step=1)
        run.checkpoint.save({"w": torch.ones(2) * 3}, step=2, sharded=True)
        assert (tmp_path / "fs" / "step-000000002" / ".metadata").is_file()
        template = {"w": torch.zeros(2)}
        assert run.checkpoint.load(template) is template
        assert torch.equal(template["w"], torch.ones(2) * 3)


# -- sharded, one process ------------------------------------------------------------------
def test_sharded_round_trip_and_rng(standalone: Path) -> None:
    with trainhouse.init() as run:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        # (no torch.optim here: importing it writes torchinductor_root into TMPDIR)
        optim = {"state": {"0": {"buf": torch.randn(3, 4)}}, "lr": 0.1}
        state = {"model": model.state_dict(), "optim": optim, "epoch": 3}
        run.checkpoint.save(state, step=7, sharded=True)
        expected = draws()
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        template = {
            "model": model.state_dict(),
            "optim": {"state": {"0": {"buf": torch.zeros(3, 4)}}, "lr": 0.0},
            "epoch": 0,
        }
        loaded = run.checkpoint.load(template)
        assert loaded is template and template["epoch"] == 3
        for k, v in model.state_dict().items():  # loaded in place
            assert torch.equal(v, saved[k])
        assert torch.equal(template["optim"]["state"]["0"]["buf"], optim["state"]["0"]["buf"])
        assert template["optim"]["lr"] == 0.1
        assert draws() == expected
        ckpt = standalone / "checkpoints" / "step-000000007"
        assert (ckpt / ".metadata").is_file() and (ckpt / "trainhouse-rng.pt").is_file()
        assert not [p for p in ckpt.parent.iterdir() if ".tmp-" in p.name]


def test_sharded_needs_a_template(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(2)}, step=1, sharded=True)
        with pytest.raises(CheckpointError, match=r"is sharded.*pass the state to load into"):
            run.checkpoint.load()


def test_corrupt_shard_falls_back(standalone: Path) -> None:
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(2)}, step=1, sharded=True)
        run.checkpoint.save({"w": torch.ones(2) * 2}, step=2, sharded=True)
        shard = next((standalone / "checkpoints" / "step-000000002").glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:-1] + b"!")
        template = {"w": torch.zeros(2)}
        run.checkpoint.load(template)
        assert torch.equal(template["w"], torch.ones(2))


def test_dcp_metadata_is_never_unpickled_blindly(standalone: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (print, ("pwned",))

    with pytest.raises(CheckpointError, match=r"builtins\.print"):
        check_dcp_metadata(pickle.dumps(Evil()))
    with trainhouse.init() as run:
        run.checkpoint.save({"w": torch.ones(2)}, step=1, sharded=True)
        ckpt = standalone / "checkpoints" / "step-000000001"
        check_dcp_metadata((ckpt / ".metadata").read_bytes())  # a real one passes
        (ckpt / ".metadata").write_bytes(pickle.dumps(Evil()))
        (standalone / "checkpoints" / "step-000000001.json").unlink()  # loaded unverified
        with pytest.raises(CheckpointError, match="never needs"):
            run.checkpoint.load({"w": torch.zeros(2)})


# -- background saves ----------------------------------------------------------------------
def test_async_save_publishes_only_when_written(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        gated = Gated(ckpts)
        run.checkpoint.storage = gated
        w = torch.ones(3)
        handle = run.checkpoint.save({"w": w}, step=1, blocking=False)
        assert isinstance(handle, SaveHandle)
        w.add_(1)  # the loop goes on changing the tensors: the checkpoint has the copy
        assert not handle.done()
        assert not (ckpts / "step-000000001.pt").exists()
        assert not (ckpts / "step-000000001.pt.json").exists()
        gated.gate.set()
        record = handle.wait()
        assert handle.done() and record is not None and record["step"] == 1
        loaded = run.checkpoint.load()
        assert loaded is not None and torch.equal(loaded["w"], torch.ones(3))


class Niceness(LocalStorage):
    """A local storage that remembers the priority of the threads that write its files, and of
    a thread such a writer starts (as the hashing writer starts its helper)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writers: list[int] = []
        self.helpers: list[int] = []

    def open_write(self, rel: str) -> Any:
        self.writers.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        helper = threading.Thread(
            target=lambda: self.helpers.append(
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            )
        )
        helper.start()
        helper.join()
        return super().open_write(rel)


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
def test_a_background_save_writes_at_the_lowest_priority(standalone: Path) -> None:
    """A background save's writer (and the hash helper it starts) yields its core to the
    training loop (nice 19, bench/checkpoint.py part 4); a blocking save writes at the caller's
    priority, which the background one leaves as it was."""
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with trainhouse.init() as run:
        storage = Niceness(standalone / "checkpoints")
        run.checkpoint.storage = storage
        run.checkpoint.save({"w": torch.ones(3)}, step=1, blocking=False).wait()
        background = (set(storage.writers), set(storage.helpers))
        storage.writers.clear()
        storage.helpers.clear()
        run.checkpoint.save({"w": torch.ones(3)}, step=2)
        blocking = (set(storage.writers), set(storage.helpers))
    assert background == ({19}, {19})
    assert blocking == ({mine}, {mine})
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_a_save_waits_for_the_pending_one(standalone: Path) -> None:
    with trainhouse.init() as run:
        gated = Gated(standalone / "checkpoints")
        run.checkpoint.storage = gated
        first = run.checkpoint.save({"s": 1}, step=1, blocking=False)
        opener = threading.Timer(0.3, gated.gate.set)
        opener.start()
        try:
            run.checkpoint.save({"s": 2}, step=2)
        finally:
            opener.cancel()
            opener.join()
        assert first.done()
        assert [p for p in gated.published if not p.endswith(".json")] == [
            "step-000000001.pt",
            "step-000000002.pt",
        ]


def test_finish_waits_for_the_pending_save(standalone: Path) -> None:
    with trainhouse.init() as run:
        gated = Gated(standalone / "checkpoints")
        run.checkpoint.storage = gated
        run.checkpoint.save({"s": 1}, step=1, blocking=False)
        opener = threading.Timer(0.2, gated.gate.set)
        opener.start()
    opener.join()
    assert (standalone / "checkpoints" / "step-000000001.pt.json").is_file()


def test_background_errors_surface_on_wait_save_and_finish(standalone: Path) -> None:
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        run.checkpoint.storage = FullDisk(ckpts, room=100)
        run.checkpoint.save({"w": torch.zeros(10_000)}, step=1, blocking=False)
        with pytest.raises(CheckpointError, match=r"step 1 failed in the background.*disk is full"):
            run.checkpoint.wait()
        run.checkpoint.wait()  # reported once
        run.checkpoint.save({"w": torch.zeros(10_000)}, step=2, blocking=False)
        with pytest.raises(CheckpointError, match="step 2 failed in the background"):
            run.checkpoint.save({"w": torch.zeros(1)}, step=3)
    with pytest.raises(CheckpointError, match="step 4 failed in the background"):  # noqa: SIM117
        with trainhouse.init() as run:
            run.checkpoint.storage = FullDisk(ckpts, room=100)
            run.checkpoint.save({"w": torch.zeros(10_000)}, step=4, blocking=False)
    assert list(ckpts.iterdir()) == []


def test_async_sharded_single_process(standalone: Path) -> None:
    with trainhouse.init() as run:
        w = torch.arange(5.0)
        handle = run.checkpoint.save({"w": w}, step=1, sharded=True, blocking=False)
        w.zero_()
        assert handle.wait() is not None
        template = {"w": torch.zeros(5)}
        run.checkpoint.load(template)
        assert torch.equal(template["w"], torch.arange(5.0))


def test_background_saves_reuse_buffers_without_mixing_checkpoints(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINHOUSE_KEEP_LAST", "100")  # every checkpoint stays, to be read
    ckpts = standalone / "checkpoints"
    with trainhouse.init() as run:
        w = torch.ones(1000)
        for step in (1, 2, 3):
            w.fill_(step)
            run.checkpoint.save({"w": w, "n": [w * 2]}, step=step, blocking=False)
        run.checkpoint.wait()
    for step in (1, 2, 3):
        state = load_checkpoint(ckpts / f"step-{step:09d}.pt")
        assert torch.equal(state["w"], torch.full((1000,), float(step)))
        assert torch.equal(state["n"][0], torch.full((1000,), 2.0 * step))


def test_recorded_digest_matches_the_file_with_large_tensors(standalone: Path) -> None:
    """The digest hashed while writing (on a helper thread, from the written buffers) is the
    file's: blake3 for the trainhouse format, sha256 for a state only torch.save writes."""
    with trainhouse.init() as run:
        state = {"big": torch.randn(3_000_000), "small": torch.ones(3)}
        rec = run.checkpoint.save(state, step=1)
        other = run.checkpoint.save({**state, "tags": {1}}, step=2)
    for r in (rec, other):
        assert r is not None and r["algorithm"] == "blake3"
        data = (standalone / "checkpoints" / r["path"]).read_bytes()
        hasher = new_hash("blake3")
        hasher.update(data)
        assert r["size"] == len(data) and r["sha256"] == hasher.hexdigest()


def test_a_world_of_one_the_script_made_is_not_used_by_sharded_checkpoints(
    standalone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that initializes a process group of one itself (NCCL, for FSDP on one GPU) runs
    the SDK alone: DCP must not run its collectives on that group, from the thread of a
    background save while training uses it (NCCL groups are not thread-safe)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

    calls: list[tuple[str, Any, bool]] = []
    for module, name in ((state_dict_saver, "save"), (state_dict_loader, "load")):
        real = getattr(module, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append((_name, kwargs.get("process_group"), kwargs.get("no_dist")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(standalone / "inductor"))
    url = f"file://{standalone / 'store'}"
    dist.init_process_group("gloo", init_method=url, rank=0, world_size=1)
    try:
        with trainhouse.init() as run:
            w = torch.arange(4.0)
            run.checkpoint.save({"w": w}, step=1, sharded=True)
            run.checkpoint.save({"w": w + 1}, step=2, sharded=True, blocking=False).wait()
            template = {"w": torch.zeros(4)}
            run.checkpoint.load(template)
            assert torch.equal(template["w"], torch.arange(4.0) + 1)
    finally:
        dist.destroy_process_group()
    assert calls == [("save", None, True), ("save", None, True), ("load", None, True)]


# -- a script that never imports torch -----------------------------------------------------
TORCH_FREE = """
import json, random, sys

import numpy as np

import trainhouse

with trainhouse.init() as run:
    random.seed(7)
    np.random.seed(7)
    state = {"step": 1, "b": b"x", "t": (1, 2.5, None), "o": [1, 2]}
    run.checkpoint.save(state, step=1, blocking=False).wait()
    run.checkpoint.save({"step": 2, "w": np.arange(4.0)}, step=2)
    after_save = [random.random(), float(np.random.rand())]
    random.random(), np.random.rand()  # more draws, undone by the load
    loaded = run.checkpoint.load()  # step 2's, and the RNG states saved with it
    after_load = [random.random(), float(np.random.rand())]
    print(json.dumps({
        "loaded": {**loaded, "w": loaded["w"].tolist()},
        "after_save": after_save,
        "after_load": after_load,
        "torch_imported": "torch" in sys.modules,
    }))
"""


def test_a_script_without_torch_checkpoints_without_importing_it(standalone: Path) -> None:
    """init, a background and a blocking save, a load and the RNG states it restores (python's,
    numpy's) import no torch for a script that never did (a scikit-learn job: 1.2-1.7 s of CPU
    and ~300 MB a rank spared); it draws after the load what it drew after that save, and a
    process with torch reads the same files."""
    (standalone / "job.py").write_text(TORCH_FREE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOUSE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "job.py"], cwd=standalone, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch_imported"] is False
    assert result["loaded"] == {"step": 2, "w": [0.0, 1.0, 2.0, 3.0]}
    assert result["after_load"] == result["after_save"]
    first = load_checkpoint(standalone / "checkpoints" / "step-000000001.pt")
    (rng,) = first.pop(RESERVED)["rng"]  # one rank's: python ints, no tensor
    assert first == {"step": 1, "b": b"x", "t": (1, 2.5, None), "o": [1, 2]}
    assert set(rng) == {"python", "numpy"} and isinstance(rng["python"][1], list)
