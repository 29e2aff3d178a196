"""Media a job logs (images, histograms, tables): the checks of hostile input (bomb PNGs, NaN
histograms, huge tables), the SDK's encoding, the store's per-job bounds (SQLite and
PostgreSQL), and the REST routes in process (credential, headers of a served image)."""

from __future__ import annotations

import base64
import io
import struct
import threading
import time
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image as PILImage

from tests.support.api import services
from tests.support.records import WAIT, new_job
from trainhouse.core import media
from trainhouse.core.errors import InvalidMedia
from trainhouse.core.tokens import hash_token
from trainhouse.lifecycle import JobState
from trainhouse.sdk import Histogram, Image, Table
from trainhouse.sdk._media import encode_png, image_pixels
from trainhouse.store import Store

AUTH = {"Authorization": "Bearer known"}


def chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(body, zlib.crc32(kind))
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png(width: int, height: int, idat: bytes, *, color: int = 0, depth: int = 8) -> bytes:
    """A PNG of the given header around ``idat`` (already deflated)."""
    header = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return media.PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# -- images -------------------------------------------------------------------------------


def test_the_sdks_png_passes_the_servers_check_and_pillow_reads_it_back() -> None:
    pixels = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    data = encode_png(pixels)
    info = media.check_png(data)
    assert (info.width, info.height, info.color_type) == (7, 5, 2)
    assert np.array_equal(np.asarray(PILImage.open(io.BytesIO(data))), pixels)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA", "P", "1", "I;16"])
def test_pillows_own_pngs_pass(mode: str) -> None:
    out = io.BytesIO()
    PILImage.new(mode, (9, 4)).save(out, format="PNG")
    assert (media.check_png(out.getvalue()).width, media.check_png(out.getvalue()).height) == (9, 4)


def test_an_interlaced_png_is_sized_pass_by_pass() -> None:
    # Adam7 over 13x11 RGB: passes of 2x2, 2x2, 4x1, 3x3, 7x3, 6x6, 13x5 pixels
    sizes = [(2, 2), (2, 2), (4, 1), (3, 3), (7, 3), (6, 6), (13, 5)]
    expected = sum(h * (1 + w * 3) for w, h in sizes)
    assert media.inflated_size(media.PngInfo(13, 11, 8, 2, interlaced=True)) == expected
    header = struct.pack(">IIBBBBB", 13, 11, 8, 2, 0, 0, 1)
    data = (
        media.PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00" * expected))
        + chunk(b"IEND", b"")
    )
    assert media.check_png(data).interlaced
    decoded = PILImage.open(io.BytesIO(data))
    decoded.load()  # Pillow agrees: the data is exactly what the passes need
    assert decoded.size == (13, 11)


@pytest.mark.parametrize(
    ("width", "height", "message"),
    [
        (100_000, 100_000, "at most 8192 pixels a side"),
        (8192, 8192, "at most 16777216 pixels"),
        (0, 10, "at most 8192 pixels a side"),
    ],
)
def test_a_small_file_declaring_huge_dimensions_is_refused_before_inflating(
    width: int, height: int, message: str
) -> None:
    bomb = png(width, height, zlib.compress(b"\x00" * 1000))
    assert len(bomb) < 200
    with pytest.raises(InvalidMedia, match=message):
        media.check_png(bomb)


def test_image_data_that_inflates_past_its_header_is_refused_with_little_memory() -> None:
    # 16x16 greyscale declares 16 * 17 bytes; the IDAT inflates to 200 MB (about 200 kB sent)
    deflater = zlib.compressobj(9)
    idat = b"".join(deflater.compress(b"\x00" * (1 << 20)) for _ in range(200)) + deflater.flush()
    bomb = png(16, 16, idat)
    assert len(bomb) < 400_000
    tracemalloc.start()
    try:
        with pytest.raises(InvalidMedia, match="inflates past the 272 bytes"):
            media.check_png(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024


def test_a_bomb_within_the_pixel_bound_is_refused_too() -> None:
    # 4096x4096 RGBA declares 64 MiB; the data inflates past it by one scanline's worth
    expected = 4096 * (1 + 4096 * 4)
    deflater = zlib.compressobj(9)
    idat = deflater.compress(b"\x00" * (expected + 20_000)) + deflater.flush()
    with pytest.raises(InvalidMedia, match="inflates past"):
        media.check_png(png(4096, 4096, idat, color=6))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GIF89a" + b"\x00" * 40, "must be a PNG"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "must be a PNG"),
        (png(4, 4, zlib.compress(b"\x00" * 10)), "inflates to 10 bytes, its header declares 20"),
        (png(4, 4, b"not deflate"), "not valid deflate data"),
        (
            png(4, 4, zlib.compress(b"\x00" * 20), color=2, depth=4),
            "colour type 2 with bit depth 4",
        ),
        (png(4, 4, zlib.compress(b"\x00" * 20)) + b"<html>", "bytes after its IEND"),
        (png(4, 4, zlib.compress(b"\x00" * 20))[:-6], "truncated"),
        (media.PNG_SIGNATURE + chunk(b"IEND", b""), "first chunk is not IHDR"),
        (b"x" * (media.MAX_IMAGE_BYTES + 1), "at most 4194304 bytes"),
    ],
)
def test_what_is_not_a_sound_png_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(InvalidMedia, match=message):
        media.check_png(data)


def test_a_chunk_with_a_bad_crc_is_refused() -> None:
    good = bytearray(png(4, 4, zlib.compress(b"\x00" * 20)))
    good[30] ^= 0xFF  # inside IHDR's CRC
    with pytest.raises(InvalidMedia, match="CRC"):
        media.check_png(bytes(good))


@pytest.mark.parametrize(
    ("value", "shape"),
    [
        (np.zeros((6, 4)), (6, 4, 1)),
        (torch.rand(3, 6, 4), (6, 4, 3)),  # C x H x W
        (np.ones((6, 4, 4), dtype=np.float32), (6, 4, 4)),
        (np.zeros((6, 4), dtype=bool), (6, 4, 1)),
        (PILImage.new("P", (4, 6)), (6, 4, 3)),
    ],
)
def test_the_sdk_takes_arrays_tensors_and_pil_images(value: Any, shape: tuple[int, ...]) -> None:
    pixels = image_pixels(value)
    assert pixels.shape == shape and pixels.dtype == np.uint8
    media.check_png(Image(value).png)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.zeros((2, 3, 4, 5)), "shape"),
        (np.zeros((9000, 2)), "1 to 8192 pixels a side"),
        (np.full((2, 2), 300), "0 to 255"),
        (b"GIF89a", "must be a PNG"),
        (np.random.default_rng(0).integers(0, 256, (2048, 2048, 3)), "at most 4194304 bytes"),
    ],
)
def test_the_sdk_refuses_what_is_no_image_at_the_call(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Image(value)


# -- histograms ---------------------------------------------------------------------------


def test_a_histogram_is_bucketed_on_the_server_and_non_finite_values_are_counted_apart() -> None:
    values = np.array([0.0, 1.0, 1.0, 2.0, np.nan, np.inf, -np.inf, np.nan], dtype="<f4")
    hist = media.histogram_from_bytes(values.tobytes())
    assert len(hist["buckets"]) == media.HISTOGRAM_BUCKETS
    assert (hist["min"], hist["max"], hist["count"]) == (0.0, 2.0, 4)
    assert (hist["nan"], hist["inf"], hist["neginf"]) == (2, 1, 1)
    assert sum(hist["buckets"]) == 4 and hist["buckets"][0] == 1 and hist["buckets"][-1] == 1


def test_a_histogram_of_one_value_puts_it_in_the_middle_bucket() -> None:
    hist = media.histogram([3.0, 3.0])
    assert hist["buckets"][media.HISTOGRAM_BUCKETS // 2] == 2 and hist["count"] == 2


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (np.array([np.nan, np.nan, np.inf], "<f4").tobytes(), "all 3 are NaN or infinite"),
        (b"", "at least one value"),
        (b"\x00" * 6, "multiple of 4 bytes"),
        (np.zeros(media.MAX_HISTOGRAM_VALUES + 1, "<f4").tobytes(), "at most 1000000 values"),
    ],
)
def test_a_histogram_without_finite_values_or_past_its_bound_is_refused(
    raw: bytes, message: str
) -> None:
    with pytest.raises(InvalidMedia, match=message):
        media.histogram_from_bytes(raw)


def test_the_sdk_samples_a_huge_tensor_to_the_bound() -> None:
    hist = Histogram(torch.arange(media.MAX_HISTOGRAM_VALUES + 10, dtype=torch.float32))
    assert hist.values.size == media.MAX_HISTOGRAM_VALUES


def test_a_bucketed_histogram_is_rebucketed() -> None:
    hist = media.rebucket(0.0, 4.0, [1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 2.0, 5.0])
    assert hist["count"] == 8 and sum(hist["buckets"]) == 8
    assert hist["buckets"][8] == 1 and hist["buckets"][-8] == 5  # middles 0.5 and 3.5
    with pytest.raises(InvalidMedia, match="finite"):
        media.rebucket(0.0, float("nan"), [1.0], [1.0])


# -- tables -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "rows", "message"),
    [
        (["a"], [[1]] * (media.MAX_TABLE_ROWS + 1), "at most 1000 rows"),
        ([str(i) for i in range(51)], [], "1 to 50 columns"),
        (["a"], [["x" * 1001]], "at most 1000 characters"),
        (["a", "b"], [[1]], "row 0 must be a list of 2 cells"),
        (["a"], [[{"html": "<b>"}]], "got dict"),
        (["a"], [[float("nan")]], "must be finite"),
        ("a", [], "1 to 50 columns"),
    ],
)
def test_a_huge_or_malformed_table_is_refused(columns: Any, rows: Any, message: str) -> None:
    with pytest.raises(InvalidMedia, match=message):
        media.check_table(columns, rows)


def test_the_sdk_builds_tables_from_rows_frames_and_dicts() -> None:
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"x": [1, 2], "y": ["a", None]})
    assert Table(data=frame).rows == [[1, "a"], [2, None]]
    assert Table(data=[{"a": 1}, {"b": np.float32(2.5)}]).rows == [[1, None], [None, 2.5]]
    assert Table(["n"], [[float("inf")], [torch.tensor(3)]]).rows == [["inf"], [3]]
    with pytest.raises(ValueError, match="row 0 has 1 cells"):
        Table(["a", "b"], [[1]])


# -- the store's bounds -------------------------------------------------------------------


def test_the_store_bounds_a_jobs_media_and_replaces_a_repeated_step(store: Store) -> None:
    job = new_job(store, spec=WAIT)
    data = media.histogram([1.0, 2.0])
    one = store.media.add(job, key="w", step=1, kind="histogram", data=b"x" * 10, max_items=2)
    again = store.media.add(job, key="w", step=1, kind="histogram", data=b"y" * 5, max_items=2)
    assert again.id == one.id and again.size == 5
    store.media.add(job, key="w", step=2, kind="histogram", data=b"z", max_items=2)
    with pytest.raises(InvalidMedia, match="at most 2 media items"):
        store.media.add(job, key="w", step=3, kind="histogram", data=b"z", max_items=2)
    with pytest.raises(InvalidMedia, match="at most 10 bytes of media"):
        store.media.add(job, key="v", step=1, kind="table", data=b"12345", max_bytes=10)
    with pytest.raises(InvalidMedia, match=rf"key 'w' of job {job} holds histograms, not images"):
        store.media.add(job, key="w", step=9, kind="image", data=b"png")
    assert [(i.key, i.step, i.size) for i in store.media.list(job)] == [("w", 1, 5), ("w", 2, 1)]
    item, raw = store.media.get(job, one.id)
    assert raw == b"y" * 5 and item.kind == "histogram" and data["count"] == 2
    store.jobs.transition(job, JobState.CANCELED, reason="test")
    assert store.runs.delete(job)["job_media"] == 2


def test_concurrent_items_cannot_overshoot_the_bound(store: Store) -> None:
    """The second of two items stored at once for a job one short of its bound waits for the
    first's transaction, then counts its item too: it is refused."""
    job = new_job(store, spec=WAIT)
    store.media.add(job, key="a", step=0, kind="table", data=b"{}", max_items=2)
    outcome: list[object] = []

    def second() -> None:
        try:
            outcome.append(
                store.media.add(job, key="late", step=0, kind="table", data=b"{}", max_items=2)
            )
        except InvalidMedia as exc:
            outcome.append(exc)

    with store.transaction():  # the first, held open
        store.media.add(job, key="early", step=0, kind="table", data=b"{}", max_items=2)
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive() and outcome == []  # it waits for the first to commit
    thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], InvalidMedia), outcome
    assert [i.key for i in store.media.list(job)] == ["a", "early"]


# -- the routes ---------------------------------------------------------------------------


def test_media_through_the_api(api: TestClient) -> None:
    rt = services(api)
    job = new_job(rt.store, spec=WAIT)
    rt.store.jobs.update(job, token_hash=hash_token("known"))
    image = {**Image(np.zeros((3, 5, 3), np.uint8)).payload(), "key": "img", "step": 2}
    url = f"/api/v1/jobs/{job}/media"
    assert api.post(url, json=image).status_code == 401
    resp = api.post(url, json=image, headers=AUTH)
    assert resp.status_code == 201, resp.text
    stored = resp.json()
    assert (stored["width"], stored["height"], stored["kind"]) == (5, 3, "image")
    hist = {**Histogram([1.0, float("nan")]).payload(), "key": "h", "step": 2}
    table = {**Table(["a"], [["<script>"]]).payload(), "key": "t", "step": 0}
    assert api.post(url, json=hist, headers=AUTH).status_code == 201
    assert api.post(url, json=table, headers=AUTH).status_code == 201

    listed = api.get(url).json()["items"]
    assert [(i["key"], i["step"], i["kind"]) for i in listed] == [
        ("h", 2, "histogram"),
        ("img", 2, "image"),
        ("t", 0, "table"),
    ]
    served = api.get(f"{url}/{stored['id']}/image")
    assert served.headers["content-type"] == "image/png"
    assert served.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in served.headers["content-security-policy"]
    assert served.content == base64.b64decode(image["png"])
    got = api.get(f"{url}/{listed[0]['id']}").json()
    assert got["data"]["nan"] == 1 and got["data"]["count"] == 1
    assert api.get(f"{url}/{listed[2]['id']}").json()["data"]["rows"] == [["<script>"]]
    assert api.get(f"{url}/{listed[0]['id']}/image").status_code == 404

    bomb = {
        "kind": "image",
        "key": "b",
        "step": 0,
        "png": base64.b64encode(png(100_000, 100_000, zlib.compress(b"\x00"))).decode(),
    }
    resp = api.post(url, json=bomb, headers=AUTH)
    assert resp.status_code == 422 and "8192 pixels a side" in resp.json()["error"]["message"]
    nan = {
        "kind": "histogram",
        "key": "n",
        "step": 0,
        "values": base64.b64encode(np.full(4, np.nan, "<f4").tobytes()).decode(),
    }
    resp = api.post(url, json=nan, headers=AUTH)
    assert resp.status_code == 422 and "NaN" in resp.json()["error"]["message"]
    huge = {"kind": "table", "key": "t2", "step": 0, "columns": ["a"], "rows": [[1]] * 1001}
    resp = api.post(url, json=huge, headers=AUTH)
    assert resp.status_code == 422 and "1000 rows" in resp.json()["error"]["message"]
    too_big = b'{"kind": "image", "png": "' + b"A" * (9 * 1024 * 1024) + b'"}'
    resp = api.post(url, content=too_big, headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 413


def test_a_standalone_run_checks_its_media_and_prints_a_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import trainhouse

    for var in ("TRAINHOUSE_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    with trainhouse.init() as run:
        run.log({"loss": 1.0, "w": trainhouse.Histogram(torch.ones(5))}, step=3)
        run.log_image("sample", np.zeros((4, 6, 3), np.uint8))
        run.log_table("preds", [[1, "cat"]], ["id", "label"], step=4)
        with pytest.raises(ValueError, match="row 0 has 1 cells"):
            run.log_table("bad", [[1]], ["a", "b"])
        with pytest.raises(ValueError, match="a media key must be a string of 1 to 256"):
            run.log_histogram("k" * 257, [1.0])
    out = capsys.readouterr().out
    assert "[trainhouse] step 3: w: histogram of 5 values" in out
    assert "[trainhouse] step 3: sample: image 6x4" in out
    assert "[trainhouse] step 4: preds: table 1x2" in out
    assert "[trainhouse] step 3: loss=1" in out


def test_another_jobs_credential_cannot_log_media_to_a_job(api: TestClient) -> None:
    """A job's credential writes its own job's media only: another job's token is refused, and
    nothing is stored."""
    rt = services(api)
    job = new_job(rt.store, spec=WAIT)
    other = new_job(rt.store, spec=WAIT)
    rt.store.jobs.update(job, token_hash=hash_token("known"))
    rt.store.jobs.update(other, token_hash=hash_token("other"))
    image = {**Image(np.zeros((3, 5, 3), np.uint8)).payload(), "key": "img", "step": 2}
    refused = api.post(
        f"/api/v1/jobs/{job}/media", json=image, headers={"Authorization": "Bearer other"}
    )
    assert refused.status_code in (401, 403), refused.text
    assert api.get(f"/api/v1/jobs/{job}/media").json()["items"] == []
