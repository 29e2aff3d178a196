"""Images, histograms and tables a run logs beside its metrics (``run.log_image``,
``run.log_histogram``, ``run.log_table``, or :class:`Image`, :class:`Histogram` and
:class:`Table` values in ``run.log``).

What is logged is checked and converted here, in the training script, so that a mistake (an
image of the wrong shape, a table with ragged rows) raises at the call that made it: an image
becomes a PNG (encoded with zlib, no imaging library needed), a histogram's values little-endian
float32 (the server buckets them), a table lists of cells. The main rank sends each item from a
thread (the server checks it again: :mod:`trainhouse.core.media`); a refused item is reported
on the rank's log, never raised into training. A standalone run checks and prints a line.
"""

from __future__ import annotations

import base64
import logging
import math
import queue
import struct
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainhouse.core.errors import ClientError
from trainhouse.core.media import (
    MAX_CELL,
    MAX_HISTOGRAM_VALUES,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
    MAX_TABLE_COLUMNS,
    MAX_TABLE_ROWS,
    PNG_SIGNATURE,
)
from trainhouse.core.reports import MAX_NAME
from trainhouse.core.wire import JSON_HEADERS, encode_json

if TYPE_CHECKING:
    from trainhouse.sdk._transport import JobAPI

log = logging.getLogger("trainhouse")

__all__ = ["Histogram", "Image", "MediaLogger", "Table", "encode_png"]

_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type (8 bits each)


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "detach") and hasattr(value, "cpu")


def _as_array(value: Any) -> np.ndarray:
    """A numpy array of a tensor (detached, on the CPU), a PIL image or anything array-like."""
    if _is_tensor(value):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return np.asarray(value.numpy())
    if hasattr(value, "mode") and hasattr(value, "convert"):  # a PIL image
        mode = value.mode
        keep = mode if mode in ("L", "LA", "RGB", "RGBA") else ("RGBA" if "A" in mode else "RGB")
        return np.asarray(value.convert(keep))
    return np.asarray(value)


def image_pixels(value: Any) -> np.ndarray:
    """An image as an H x W x C uint8 array (C: 1, 2, 3 or 4). Accepted: H x W arrays and
    tensors; a tensor's C x H x W (torch's layout); an array's H x W x C (numpy's and PIL's)
    unless only C x H x W fits; floats are taken to be in [0, 1] (clipped), booleans as black
    and white."""
    array = _as_array(value)
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim == 3 and array.shape[0] in (1, 2, 3, 4):
        channels_last = array.shape[-1] in (1, 2, 3, 4)
        if _is_tensor(value) or not channels_last:
            array = np.transpose(array, (1, 2, 0))
    if array.ndim != 3 or array.shape[-1] not in (1, 2, 3, 4):
        raise ValueError(
            f"an image must be H x W, H x W x C or C x H x W with 1 to 4 channels, got shape "
            f"{tuple(array.shape)}"
        )
    height, width = int(array.shape[0]), int(array.shape[1])
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise ValueError(
            f"an image may be 1 to {MAX_IMAGE_SIDE} pixels a side, got {width}x{height}"
        )
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"an image may have at most {MAX_IMAGE_PIXELS} pixels, got {width}x{height}"
        )
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if array.dtype.kind == "f":
        scaled: np.ndarray = np.nan_to_num(np.clip(array, 0.0, 1.0)) * 255 + 0.5
        return scaled.astype(np.uint8)
    if array.dtype.kind in "iu":
        if array.size and (int(array.min()) < 0 or int(array.max()) > 255):
            raise ValueError("an integer image's values must be 0 to 255 (floats: 0 to 1)")
        return array.astype(np.uint8)
    raise ValueError(f"an image's values must be numbers, got {array.dtype}")


def encode_png(pixels: np.ndarray) -> bytes:
    """An H x W x C uint8 array as a PNG file (8 bits a channel, no filter, zlib level 6)."""
    height, width, channels = pixels.shape
    rows = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(height, width * channels)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), rows], axis=1).tobytes()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body))
            + kind
            + body
            + struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, _COLOR_TYPE[channels], 0, 0, 0)
    return (
        PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


class Image:
    """An image to log: a numpy array or tensor (H x W, H x W x C, C x H x W; uint8 0-255 or
    floats 0-1), a PIL image, a PNG file's bytes or its path. ``run.log({"samples":
    Image(x, caption="epoch 3")})`` is ``run.log_image("samples", x, caption="epoch 3")``."""

    def __init__(self, data: Any, caption: str | None = None) -> None:
        if isinstance(data, (bytes, bytearray)):
            png = bytes(data)
        elif isinstance(data, (str, Path)):
            png = Path(data).read_bytes()
        else:
            png = encode_png(image_pixels(data))
        if not png.startswith(PNG_SIGNATURE):
            raise ValueError("an image given as bytes or a path must be a PNG file")
        if len(png) > MAX_IMAGE_BYTES:
            raise ValueError(
                f"an image may be at most {MAX_IMAGE_BYTES} bytes of PNG, this one is more: "
                "log a smaller one"
            )
        self.png = png
        self.caption = caption

    def payload(self) -> dict[str, Any]:
        return {
            "kind": "image",
            "png": base64.b64encode(self.png).decode(),
            "caption": self.caption,
        }

    def describe(self) -> str:
        width, height = struct.unpack(">II", self.png[16:24])
        return f"image {width}x{height}"


class Histogram:
    """The distribution of a tensor's or array's values, bucketed by the server (64 buckets
    between the finite values' min and max; NaN and infinities counted apart). A tensor of more
    than 1,000,000 values is sampled: 1,000,000 of them, uniformly, always the same ones."""

    def __init__(self, values: Any) -> None:
        array = _as_array(values).astype(np.float32, copy=False).ravel()
        if array.size == 0:
            raise ValueError("a histogram needs at least one value")
        if array.size > MAX_HISTOGRAM_VALUES:
            picked = np.random.default_rng(0).choice(
                array.size, MAX_HISTOGRAM_VALUES, replace=False
            )
            array = array[np.sort(picked)]
        self.values = array.astype("<f4", copy=False)

    def payload(self) -> dict[str, Any]:
        return {"kind": "histogram", "values": base64.b64encode(self.values.tobytes()).decode()}

    def describe(self) -> str:
        return f"histogram of {self.values.size} values"


class Table:
    """A small table: ``Table(columns=["x", "y"], rows=[[1, 2], [3, 4]])``, or
    ``Table(data=df)`` for a pandas DataFrame (or a list of dicts, their keys the columns).
    Cells are strings, numbers, booleans or None (anything else becomes its ``str``); at most
    1000 rows, 50 columns and 1000 characters a cell. Shown as text, never as HTML."""

    def __init__(
        self,
        columns: list[str] | None = None,
        rows: list[list[Any]] | None = None,
        *,
        data: Any = None,
    ) -> None:
        if data is not None:
            if hasattr(data, "columns") and hasattr(data, "itertuples"):  # a DataFrame
                columns = [str(c) for c in data.columns]
                rows = [list(r) for r in data.itertuples(index=False, name=None)]
            else:
                records = list(data)
                columns = list(dict.fromkeys(str(k) for r in records for k in r))
                rows = [[r.get(c) for c in columns] for r in records]
        if columns is None or rows is None:
            raise ValueError("a table needs columns and rows (or data=)")
        columns = [str(c) for c in columns]
        if not 1 <= len(columns) <= MAX_TABLE_COLUMNS:
            raise ValueError(f"a table has 1 to {MAX_TABLE_COLUMNS} columns, got {len(columns)}")
        rows = [list(r) for r in rows]
        if len(rows) > MAX_TABLE_ROWS:
            raise ValueError(f"a table has at most {MAX_TABLE_ROWS} rows, got {len(rows)}")
        for i, row in enumerate(rows):
            if len(row) != len(columns):
                raise ValueError(f"row {i} has {len(row)} cells, the table {len(columns)} columns")
            row[:] = [_cell(c) for c in row]
        self.columns, self.rows = columns, rows

    def payload(self) -> dict[str, Any]:
        return {"kind": "table", "columns": self.columns, "rows": self.rows}

    def describe(self) -> str:
        return f"table {len(self.rows)}x{len(self.columns)}"


def _cell(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # a numpy scalar, a 0-d tensor
    if value is None or isinstance(value, (bool, int, str)):
        pass
    elif isinstance(value, float):
        if math.isnan(value):
            value = None  # missing, as pandas writes it
        elif math.isinf(value):
            value = str(value)
    else:
        value = str(value)
    if isinstance(value, str) and len(value) > MAX_CELL:
        raise ValueError(f"a table cell may be at most {MAX_CELL} characters, got {len(value)}")
    return value


Media = Image | Histogram | Table


class MediaLogger:
    """Sends a run's media from a thread (the main rank, under the server): at most
    :attr:`QUEUED` items wait, past them a call waits for room; a failed send is retried for a
    minute, a refused item reported on the rank's log. Standalone (no API) it prints a line."""

    QUEUED = 32
    RETRY_FOR = 60.0
    CLOSE_WAIT = 60.0  # seconds the run's end waits for items still queued

    def __init__(self, api: JobAPI | None, *, is_main: bool) -> None:
        self.api = api
        self.is_main = is_main
        self._queue: queue.Queue[tuple[str, int, Media] | None] = queue.Queue(self.QUEUED)
        self._thread: threading.Thread | None = None
        self.refused: list[str] = []  # what the server refused, for the rank's log and tests

    def log(self, key: str, item: Media, step: int) -> None:
        if not self.is_main:
            return
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_NAME or "\x00" in key:
            raise ValueError(
                f"a media key must be a string of 1 to {MAX_NAME} characters without NUL, "
                f"got {repr(key)[:80]}"
            )
        if self.api is None:
            print(f"[trainhouse] step {step}: {key}: {item.describe()}", flush=True)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainhouse-media", daemon=True)
            self._thread.start()
        self._queue.put((key, step, item))

    def _loop(self) -> None:
        assert self.api is not None
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            key, step, item = entry
            body = encode_json({**item.payload(), "key": key, "step": step})
            try:
                self.api.call(
                    "POST", "/media", content=body, headers=JSON_HEADERS, retry_for=self.RETRY_FOR
                )
            except ClientError as exc:
                why = f"{item.describe()} {key!r} at step {step} was not stored: {exc}"
                self.refused.append(why)
                print(f"trainhouse: {why}", file=sys.stderr, flush=True)
            except Exception as exc:  # never into training
                log.warning(
                    "trainhouse: %s %r at step %s was not sent: %s", item.describe(), key, step, exc
                )

    def close(self) -> None:
        """Send what is queued (waiting up to :attr:`CLOSE_WAIT` seconds); the thread ends."""
        if self._thread is None:
            return
        deadline = time.monotonic() + self.CLOSE_WAIT
        try:
            self._queue.put(None, timeout=self.CLOSE_WAIT)
        except queue.Full:
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
