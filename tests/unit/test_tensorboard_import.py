"""TensorBoard event files imported as a running job's metrics (trainhouse.ingest.tensorboard),
in process: the tensorboard package's own reader and writer, the files as hostile as a job can
make them. The end-to-end job: tests/integration/test_bring_your_own.py."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from torch.utils.tensorboard import SummaryWriter

from tests.support.api import app_client, services, submit, wait_launched, workdir
from tests.support.fakes import FakeExecutor
from trainhouse.ingest.tensorboard import TensorBoardImport


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    # the service ticked by hand (interval 0: its thread does not run)
    with app_client(tmp_path, exit_code=None, tensorboard_interval=0) as client:
        yield client


def running_job(api: TestClient, tmp_path: Path) -> tuple[int, Path, TensorBoardImport]:
    spec = "name: tb\nentrypoint: python train.py\n"
    job_id = submit(api, spec, workdir(tmp_path)).json()["id"]
    wait_launched(api, job_id)
    rt = services(api)
    directory = rt.files(job_id).tensorboard
    directory.mkdir(parents=True)
    return job_id, directory, TensorBoardImport(rt.store, rt.reports, rt.settings.home)


def wait_ended(api: TestClient, job_id: int) -> None:
    deadline = time.monotonic() + 10
    while api.get(f"/api/v1/jobs/{job_id}").json()["state"] == "RUNNING":
        assert time.monotonic() < deadline, "the job still runs"
        time.sleep(0.1)


def series(api: TestClient, job_id: int) -> dict[str, list[tuple[int, float | None]]]:
    found = api.get(f"/api/v1/jobs/{job_id}/metrics").json()["series"]
    return {s["name"]: [(p[0], p[1]) for p in s["points"]] for s in found}


def test_scalars_are_imported_by_tag_while_the_job_runs(api: TestClient, tmp_path: Path) -> None:
    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    for step in range(5):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.add_scalar("odd", float("nan"), 0)
    writer.add_text("notes", "not a scalar", 0)
    writer.flush()
    assert importer.tick() == 6
    assert series(api, job_id)["train/loss"] == [
        (s, pytest.approx(1.0 / (s + 1))) for s in range(5)
    ]
    assert series(api, job_id)["odd"] == [(0, None)]
    for step in range(5, 8):  # more while it runs; a step written again replaces its value
        writer.add_scalar("train/loss", 10.0, step)
    writer.add_scalar("train/loss", 0.0, 0)
    sub = SummaryWriter(str(directory / "eval"))  # a run in a subdirectory: its name prefixed
    sub.add_scalar("acc", 0.5, 3)
    writer.flush()
    sub.flush()
    assert importer.tick() == 5
    got = series(api, job_id)
    assert [s for s, _ in got["train/loss"]] == list(range(8)) and got["train/loss"][0] == (0, 0.0)
    assert got["eval/acc"] == [(3, 0.5)]
    assert importer.tick() == 0  # nothing new
    # the job ends: its last events are read once more, then its files let go
    writer.add_scalar("train/loss", 1.0, 8)
    writer.close()
    sub.close()
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    fake.end(job_id, 0)
    wait_ended(api, job_id)
    importer.tick()
    assert [s for s, _ in series(api, job_id)["train/loss"]] == list(range(9))
    assert importer._jobs == {}


def test_hostile_event_files_are_passed_over(api: TestClient, tmp_path: Path) -> None:
    job_id, directory, importer = running_job(api, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    outside = SummaryWriter(str(elsewhere))
    outside.add_scalar("stolen", 1.0, 0)
    outside.close()
    (stolen,) = elsewhere.iterdir()
    (directory / "events.out.tfevents.link").symlink_to(stolen)  # a link out
    os.link(stolen, directory / "events.out.tfevents.hardlink")  # a hard link to it
    os.mkfifo(directory / "events.out.tfevents.fifo")  # whose open would wait forever
    (directory / "sub").symlink_to(elsewhere)  # a directory link
    (directory / "events.out.tfevents.garbage").write_bytes(os.urandom(4096))
    # a record whose length asks for 2**62 bytes: refused, not allocated
    (directory / "events.out.tfevents.huge").write_bytes(struct.pack("<Q", 1 << 62) + b"\x00" * 12)
    good = SummaryWriter(str(directory))
    good.add_scalar("loss", 0.5, 1)
    good.flush()
    assert importer.tick() == 1
    assert series(api, job_id) == {"loss": [(1, 0.5)]}
    # a truncated record (the writer mid-write) is read once it is complete
    path = next(p for p in directory.iterdir() if p.name.startswith("events.out.tfevents.1"))
    good.add_scalar("loss", 0.25, 2)
    good.flush()
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    assert importer.tick() == 0
    path.write_bytes(data)
    assert importer.tick() == 1
    good.close()


def test_a_job_that_runs_and_ends_between_two_ticks_is_imported(
    api: TestClient, tmp_path: Path
) -> None:
    """A short attempt (or a busy server) can start and end between two ticks: its events are
    read all the same, once, after it ended."""
    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    for step in range(4):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.close()
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    fake.end(job_id, 0)  # no tick saw it running
    wait_ended(api, job_id)
    assert importer.tick() == 4
    assert [s for s, _ in series(api, job_id)["train/loss"]] == [0, 1, 2, 3]
    assert importer._jobs == {}
    assert importer.tick() == 0  # read once


def test_a_scalar_tensor_of_a_huge_shape_allocates_nothing(api: TestClient, tmp_path: Path) -> None:
    """A ~100-byte record names a tensor of shape [25 * 10**6] with one value: TensorBoard's
    reader would repeat it to fill that shape (200 MB here; terabytes for a larger one) before
    anyone saw it is no scalar. The shape is looked at first: nothing is allocated (the reader's
    own read buffer, 16 MiB, aside), the value skipped."""
    import tracemalloc

    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    writer.add_scalar("ok", 0.5, 1)
    writer.flush()
    assert importer.tick() == 1  # the reader's modules imported: not counted below

    dim = tensor_shape_pb2.TensorShapeProto.Dim(size=25 * 10**6)
    tensor = tensor_pb2.TensorProto(
        dtype=2,  # DT_DOUBLE
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[dim]),
        double_val=[1.0],
    )
    value = summary_pb2.Summary.Value(tag="huge", tensor=tensor)
    value.metadata.plugin_data.plugin_name = "scalars"
    hostile = EventFileWriter(str(directory / "sub"))
    hostile.add_event(
        event_pb2.Event(step=2, wall_time=1.0, summary=summary_pb2.Summary(value=[value]))
    )
    hostile.close()
    tracemalloc.start()
    try:
        assert importer.tick() == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        writer.close()
    assert peak < 64 << 20, f"the import allocated {peak / 2**20:.0f} MiB"
    assert series(api, job_id) == {"ok": [(1, 0.5)]}


def test_points_a_busy_writer_refused_are_stored_at_the_next_tick(
    api: TestClient, tmp_path: Path
) -> None:
    """The report writer refuses a batch (its queue full under load, a storing error): the
    points stay with the importer and go at the next tick, also the last ones of a job that
    has ended meanwhile, never dropped."""
    from trainhouse.core.errors import ServerBusy

    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    for step in range(3):
        writer.add_scalar("loss", float(step), step)
    writer.flush()
    real = importer.reports.submit
    busy = {"left": 1}

    def submit(*args: Any, **kwargs: Any) -> Any:
        if busy["left"]:
            busy["left"] -= 1
            raise ServerBusy("the server has too many metric points queued; retry", retry_after=1)
        return real(*args, **kwargs)

    importer.reports.submit = submit  # type: ignore[method-assign]
    assert importer.tick() == 0
    assert importer.tick() == 3  # not lost: stored now
    for step in range(3, 6):
        writer.add_scalar("loss", float(step), step)
    writer.close()
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    fake.end(job_id, 0)
    wait_ended(api, job_id)
    busy["left"] = 1
    original_add = importer.store.metrics.add
    failing = {"left": 1}

    def add(*args: Any, **kwargs: Any) -> Any:  # the ended job's last points fail once too
        if failing["left"]:
            failing["left"] -= 1
            raise OSError("disk I/O error")
        return original_add(*args, **kwargs)

    importer.store.metrics.add = add  # type: ignore[method-assign]
    importer.tick()
    importer.tick()
    assert [s for s, _ in series(api, job_id)["loss"]] == list(range(6))
    assert importer._jobs == {}


def test_a_jobs_last_scalars_are_stored_before_it_is_seen_ended(tmp_path: Path) -> None:
    """The scheduler reads an attempt's last events as it ends, before it records the end: a
    client that sees the job COMPLETED reads every step, not the steps of a tick ago."""
    # the import's own thread ticks once at start, then not for an hour
    with app_client(tmp_path, exit_code=None, tensorboard_interval=3600) as api:
        job_id = submit(api, "name: tb\nentrypoint: python train.py\n", workdir(tmp_path)).json()[
            "id"
        ]
        wait_launched(api, job_id)
        directory = services(api).files(job_id).tensorboard
        writer = SummaryWriter(str(directory))
        for step in range(7):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.close()
        fake = services(api).scheduler.executor
        assert isinstance(fake, FakeExecutor)
        fake.end(job_id, 0)
        wait_ended(api, job_id)
        assert [s for s, _ in series(api, job_id)["loss"]] == list(range(7))


def test_a_restarted_server_reads_each_event_file_on_from_where_it_stopped(
    tmp_path: Path,
) -> None:
    """Each file's read position is kept in the store: a new server on the same database and
    home reads only the records appended since (the old one's are neither read again nor
    stored twice), and every point is there once."""
    spec = "name: tb\nentrypoint: python train.py\n"
    with app_client(tmp_path, exit_code=None, tensorboard_interval=0) as api:
        job_id = submit(api, spec, workdir(tmp_path)).json()["id"]
        wait_launched(api, job_id)
        rt = services(api)
        directory = rt.files(job_id).tensorboard
        writer = SummaryWriter(str(directory))
        for step in range(5):
            writer.add_scalar("loss", float(step), step)
        writer.flush()
        assert rt.tensorboard is not None
        assert rt.tensorboard.import_job(rt.store.jobs.get(job_id)) == 5
        (path,) = directory.iterdir()
        read_to = path.stat().st_size
        assert list(rt.store.event_files.get(job_id).values()) == [read_to]
    for step in range(5, 8):  # written while no server runs
        writer.add_scalar("loss", float(step), step)
    writer.close()
    with app_client(tmp_path, exit_code=None, tensorboard_interval=0) as api:
        rt = services(api)
        assert rt.tensorboard is not None
        assert rt.tensorboard.import_job(rt.store.jobs.get(job_id)) == 3  # the new ones only
        (read,) = rt.tensorboard._jobs[job_id].files.values()
        assert read.loader.records == 3  # from byte read_to on
        assert [p[0] for p in series(api, job_id)["loss"]] == list(range(8))
        raw = rt.store.metrics.points(job_id, name="loss", rank=-1)
        assert sorted(p.step for p in raw) == list(range(8))  # each point once
        assert list(rt.store.event_files.get(job_id).values()) == [path.stat().st_size]
