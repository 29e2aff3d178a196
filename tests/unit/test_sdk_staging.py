"""Staging a state off the device for a background save (issue 20, item 10): pinned buffers at
their exact size, DTensors staged into reused buffers, a wait on every device copied from.
CUDA is replaced by fakes here; tests/gpu runs the same paths on a real GPU."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainhouse.sdk.checkpoint._support import Stager, pinned_empty, wait_for_copies


class FakeCudart:
    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.registered.append((ptr, size, flags))
        return self.result

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def cudart(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_a_pinned_buffer_is_registered_at_its_exact_size_and_unregistered_when_dropped(
    cudart: FakeCudart,
) -> None:
    # 3 * 1000 * 4 bytes: the caching host allocator would hand out (and keep) a 16 KiB block
    buf = pinned_empty((3, 1000), torch.float32)
    ptr = buf.data_ptr()
    assert buf.shape == (3, 1000) and buf.dtype == torch.float32
    assert cudart.registered == [(ptr, 12_000, 1)]  # portable: pinned for every device
    assert cudart.unregistered == []
    del buf
    gc.collect()
    assert cudart.unregistered == [ptr]


def test_a_buffer_that_cannot_be_pinned_is_used_unpinned(cudart: FakeCudart) -> None:
    cudart.result = 2  # cudaErrorMemoryAllocation, e.g. RLIMIT_MEMLOCK
    buf = pinned_empty((10,), torch.bfloat16)
    assert buf.numel() == 10
    del buf
    gc.collect()
    assert cudart.unregistered == []  # nothing registered, nothing to undo


def test_an_empty_buffer_is_not_registered(cudart: FakeCudart) -> None:
    assert pinned_empty((0, 4), torch.float32).numel() == 0
    assert cudart.registered == []


def test_staging_waits_for_every_device_copied_from(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[Any] = []

    class Stream:
        def __init__(self, device: Any) -> None:
            self.device = device

        def synchronize(self) -> None:
            waited.append(self.device)

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    devices = {torch.device("cuda", 0), torch.device("cuda", 3)}
    wait_for_copies(devices)
    assert set(waited) == devices


def test_cpu_tensors_are_staged_into_reused_unpinned_buffers(cudart: FakeCudart) -> None:
    stager = Stager()
    weights = torch.arange(6.0)
    first = stager({"w": weights})["w"]
    weights += 1
    second = stager({"w": weights})["w"]
    assert second.data_ptr() == first.data_ptr()
    assert torch.equal(second, torch.arange(6.0) + 1)
    assert cudart.registered == []  # only copies of CUDA tensors are pinned


@pytest.fixture
def one_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # DTensor's ops
    url = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=url, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_dtensor_is_staged_as_a_dtensor_around_a_reused_copy_of_its_shard(
    one_rank: None,
) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    source = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    stager = Stager()

    first = stager({"layer": {"weight": source}})["layer"]["weight"]
    assert isinstance(first, DTensor)
    assert first.placements == source.placements and first.device_mesh == source.device_mesh
    assert first.shape == source.shape and not first.requires_grad
    assert torch.equal(first.to_local(), torch.arange(8.0).reshape(4, 2))
    assert first.to_local().data_ptr() != source.to_local().data_ptr()  # a copy

    source.to_local().mul_(10)
    second = stager({"layer": {"weight": source}})["layer"]["weight"]
    assert second.to_local().data_ptr() == first.to_local().data_ptr()  # the buffer reused
    assert torch.equal(second.to_local(), torch.arange(8.0).reshape(4, 2) * 10)
