"""Media from the other ways a job logs, in process: TensorBoard's images and histograms
(trainhouse.ingest.tbmedia, through the import's own tick; hostile tensors refused before
numpy reads them), and what MLflow's log_image and log_table write (paths and files). The
end-to-end jobs: tests/integration/test_media.py."""

from __future__ import annotations

import io
import logging
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image as PILImage
from torch.utils.tensorboard import SummaryWriter

from tests.support.api import app_client, services, submit, wait_launched, wait_state, workdir
from trainhouse.core import media
from trainhouse.core.errors import InvalidMedia
from trainhouse.ingest.tensorboard import TensorBoardImport


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    # the import ticked by hand (interval 0: its thread does not run)
    with app_client(tmp_path, exit_code=None, tensorboard_interval=0) as client:
        yield client


def running_job(api: TestClient, tmp_path: Path) -> tuple[int, Path, TensorBoardImport]:
    job_id = submit(api, "name: tb\nentrypoint: python train.py\n", workdir(tmp_path)).json()["id"]
    wait_launched(api, job_id)
    rt = services(api)
    directory = rt.files(job_id).tensorboard
    directory.mkdir(parents=True)
    return job_id, directory, TensorBoardImport(rt.store, rt.reports, rt.settings.home)


def hostile_value(tag: str, plugin: str, tensor: Any) -> Any:
    from tensorboard.compat.proto import summary_pb2

    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    value.metadata.plugin_data.plugin_name = plugin
    return value


def write_events(directory: Path, values: list[Any], step: int) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    hostile = EventFileWriter(str(directory))
    hostile.add_event(
        event_pb2.Event(step=step, wall_time=1.0, summary=summary_pb2.Summary(value=values))
    )
    hostile.close()


def test_tensorboard_images_and_histograms_become_the_jobs_media(
    api: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2

    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    for step in range(3):
        writer.add_image("samples", np.full((3, 4, 6), step / 2, np.float32), step)
        writer.add_histogram("weights", torch.arange(100, dtype=torch.float32) + step, step)
    for step in range(20):  # more than one batch of media a tick
        writer.add_histogram("many", torch.randn(10), step)
    writer.add_scalar("loss", 0.5, 2)
    writer.flush()

    def shape(*sizes: int) -> Any:
        dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in sizes]
        return tensor_shape_pb2.TensorShapeProto(dim=dims)

    # a ~100-byte record naming 2**28 buckets of one repeated value; a bomb PNG
    huge = tensor_pb2.TensorProto(dtype=2, tensor_shape=shape(2**28, 3), double_val=[1.0])
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(body, zlib.crc32(kind))
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    bomb_png = (
        media.PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )
    bomb = tensor_pb2.TensorProto(dtype=7, tensor_shape=shape(3), string_val=[b"1", b"1", bomb_png])
    write_events(
        directory / "bad",
        [hostile_value("huge", "histograms", huge), hostile_value("bomb", "images", bomb)],
        1,
    )
    with caplog.at_level(logging.WARNING, logger="trainhouse.ingest.tensorboard"):
        assert importer.tick() == 1  # the one scalar
    items = api.get(f"/api/v1/jobs/{job_id}/media").json()["items"]
    by_key: dict[str, list[Any]] = {}
    for item in items:
        by_key.setdefault(item["key"], []).append(item)
    assert sorted(by_key) == ["many", "samples", "weights"]
    assert [i["step"] for i in by_key["samples"]] == [0, 1, 2]
    assert len(by_key["many"]) == 20
    image = by_key["samples"][2]
    assert (image["width"], image["height"]) == (6, 4)
    png = api.get(f"/api/v1/jobs/{job_id}/media/{image['id']}/image").content
    assert np.asarray(PILImage.open(io.BytesIO(png))).max() == 255  # the float 1.0 image
    hist = api.get(f"/api/v1/jobs/{job_id}/media/{by_key['weights'][1]['id']}").json()["data"]
    assert hist["count"] == 100 and hist["min"] == pytest.approx(1.0)
    assert hist["max"] == pytest.approx(100.0)
    assert sum(hist["buckets"]) == 100 and len(hist["buckets"]) == media.HISTOGRAM_BUCKETS
    said = caplog.text
    assert "bad/huge at step 1: TensorBoard histogram 'bad/huge' has shape [268435456, 3]" in said
    assert "bad/bomb at step 1: an image may be at most 8192 pixels a side" in said
    writer.close()


def test_what_mlflow_writes_is_recognised() -> None:
    key = "val/samples"
    name = "val~samples+step+12+timestamp+1700000000000+0b1f2c3d-aaaa-bbbb-cccc-123456789abc.png"
    assert media.mlflow_image(["images", name]) == (key, 12)
    old = "val#samples%step%3%timestamp%1700000000000%0b1f2c3d-aaaa-bbbb-cccc-123456789abc.png"
    assert media.mlflow_image(["images", old]) == (key, 3)
    assert media.mlflow_image(["images", name.replace(".png", "+compressed.webp")]) is None
    assert media.mlflow_image(["model", name]) is None
    tag = '[{"path": "preds.json", "type": "table"}, {"path": "x.bin", "type": "table"}]'
    assert media.mlflow_tables(tag) == ["preds.json"]
    assert media.mlflow_tables("not json") == []
    split = b'{"columns": ["a", "img"], "data": [[1, {"type": "image", "filepath": "p.png"}]]}'
    assert media.mlflow_table(split)["rows"] == [[1, '{"type":"image","filepath":"p.png"}']]
    with pytest.raises(InvalidMedia, match="at most 1000 rows"):
        media.mlflow_table(b'{"columns": ["a"], "data": [' + b",".join([b"[1]"] * 1001) + b"]}")


def test_a_histogram_of_huge_counts_is_refused_and_the_file_read_on(
    api: TestClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A TensorBoard histogram whose counts pass 64 bits (1e300 values in a bucket) is refused
    like any hostile one; the rest of its file (a scalar logged after it) is still imported."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    job_id, directory, importer = running_job(api, tmp_path)
    dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in (1, 3)]
    huge = tensor_pb2.TensorProto(
        dtype=2,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=dims),
        double_val=[0.0, 1.0, 1e300],
    )
    events = EventFileWriter(str(directory))
    events.add_event(
        event_pb2.Event(
            step=1,
            wall_time=1.0,
            summary=summary_pb2.Summary(value=[hostile_value("counts", "histograms", huge)]),
        )
    )
    loss = summary_pb2.Summary.Value(tag="loss", simple_value=0.5)
    events.add_event(
        event_pb2.Event(step=2, wall_time=2.0, summary=summary_pb2.Summary(value=[loss]))
    )
    events.close()
    with caplog.at_level(logging.WARNING, logger="trainhouse.ingest.tensorboard"):
        assert importer.tick() == 1  # the scalar after it
    assert "counts at step 1: a histogram's count must be from 0 to" in caplog.text
    assert api.get(f"/api/v1/jobs/{job_id}/media").json()["items"] == []
    series = api.get(f"/api/v1/jobs/{job_id}/metrics").json()
    assert "loss" in str(series)


def test_a_tick_reads_a_bounded_number_of_media_and_the_next_one_goes_on(
    api: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each image is checked (inflated) before it is stored: a job whose event files hold
    thousands of them would hold the import, every other job's metrics waiting, for as long
    as they take. A tick reads at most MAX_MEDIA_PER_JOB_TICK items of a job; the next tick
    goes on where it stopped, and a job that ended has the rest read at the following ticks."""
    from trainhouse.ingest import tensorboard

    monkeypatch.setattr(tensorboard, "MAX_MEDIA_PER_JOB_TICK", 32)
    job_id, directory, importer = running_job(api, tmp_path)
    writer = SummaryWriter(str(directory))
    for step in range(70):
        writer.add_histogram("many", torch.randn(10), step)
    writer.add_scalar("loss", 0.5, 70)
    writer.close()

    def stored() -> int:
        return len(api.get(f"/api/v1/jobs/{job_id}/media").json()["items"])

    importer.tick()
    assert stored() == 32
    importer.tick()
    assert stored() == 64
    services(api).scheduler.executor.end(job_id, 0)  # type: ignore[attr-defined]
    wait_state(api, job_id, {"COMPLETED"})
    importer.tick()  # its files read on after its end
    assert stored() == 70
