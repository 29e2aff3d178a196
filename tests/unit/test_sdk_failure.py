"""A rank that fails (issue 20, item 1): its traceback reaches its log before any teardown that
could wait on its peers, and an NCCL group is aborted rather than destroyed (since torch 2.6
destroying one flushes its work and blocks while peers sit in a collective)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import trainhouse
from trainhouse.sdk import _run
from trainhouse.sdk._distributed import ProcessGroup


def group(monkeypatch: pytest.MonkeyPatch, backend: str) -> tuple[ProcessGroup, list[str]]:
    """A rank's context over a fake initialized group of ``backend``; the calls it makes."""
    calls: list[str] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a, **k: calls.append("destroy"))
    monkeypatch.setattr(
        distributed_c10d, "_abort_process_group", lambda *a, **k: calls.append("abort")
    )
    ctx = ProcessGroup(
        rank=1, local_rank=1, world_size=2, device=torch.device("cpu"), owns_group=True
    )
    return ctx, calls


@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_a_failed_rank_aborts_its_nccl_group(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    ctx, calls = group(monkeypatch, backend)
    ctx.close(failed=True)
    assert calls == ["abort"]  # no barrier, no destroy: nothing waits on the peers
    ctx.close(failed=True)
    assert calls == ["abort"]  # once


def test_gloo_and_a_normal_end_keep_their_clean_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, calls = group(monkeypatch, "gloo")
    ctx.close(failed=True)
    assert calls == ["destroy"]  # a gloo rank that fails still exits with its own code
    ctx, calls = group(monkeypatch, "nccl")
    ctx.close(failed=False)
    assert calls == ["barrier", "destroy"]  # a finished rank waits for the others, then leaves


def test_the_traceback_is_printed_before_the_run_ends_and_only_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    seen: list[str] = []
    real_finish = _run.Run.finish

    def finish(self: _run.Run, *, failed: bool = False) -> None:
        seen.append(capsys.readouterr().err)  # what the log holds when teardown begins
        real_finish(self, failed=failed)

    monkeypatch.setattr(_run.Run, "finish", finish)
    with pytest.raises(ValueError, match="out of batches") as raised, trainhouse.init():
        raise ValueError("out of batches")
    assert len(seen) == 1 and "ValueError: out of batches" in seen[0] and "Traceback" in seen[0]
    # the interpreter's own report of the same exception prints nothing more
    sys.excepthook(ValueError, raised.value, raised.value.__traceback__)
    assert capsys.readouterr().err == ""
    other = KeyError("another")
    printed: list[Any] = []
    monkeypatch.setattr(sys, "__excepthook__", lambda *a: printed.append(a))
    sys.excepthook(KeyError, other, None)
    assert capsys.readouterr().err or printed  # any other exception is still reported


def test_sys_exit_prints_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    with pytest.raises(SystemExit), trainhouse.init():
        sys.exit(3)
    assert "Traceback" not in capsys.readouterr().err
