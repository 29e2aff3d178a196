"""Media a job logs beside its metrics: images (PNG), histograms, small tables.

Everything here checks hostile input before anything is stored, and raises
:class:`~trainhouse.core.errors.InvalidMedia` naming the rule broken:

- an image is a PNG of at most :data:`MAX_IMAGE_BYTES` bytes, :data:`MAX_IMAGE_SIDE` pixels a
  side and :data:`MAX_IMAGE_PIXELS` pixels. Its chunks are walked (CRCs checked, IHDR first,
  IEND last); the width and height IHDR declares are checked *before* a byte is decompressed,
  and the image data is then inflated through a bounded ``zlib.decompressobj`` (a chunk of
  output at a time, nothing kept) that stops as soon as it passes the size the header implies:
  a bomb (a small file declaring huge dimensions, or deflate data that expands far past them)
  is refused having cost a few kilobytes of memory. Pillow is never asked to decode it.
- a histogram is made here from the raw values the SDK sends (at most
  :data:`MAX_HISTOGRAM_VALUES`, float32): :data:`HISTOGRAM_BUCKETS` equal buckets between the
  finite values' min and max; NaN, +inf and -inf are counted apart (shown as such); values none
  of which is finite are refused. TensorBoard's already bucketed histograms are re-bucketed the
  same way (:func:`rebucket`).
- a table has at most :data:`MAX_TABLE_ROWS` rows and :data:`MAX_TABLE_COLUMNS` columns, cells
  of strings, numbers, booleans or null, a string at most :data:`MAX_CELL` characters; the
  dashboard shows it as text.

A job holds at most :data:`MAX_MEDIA_ITEMS` items and :data:`MAX_MEDIA_BYTES` bytes of them
(counted by :mod:`trainhouse.store.media` in the transaction that stores one), as it holds at most
:data:`~trainhouse.core.reports.MAX_SERIES` metric series.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from trainhouse.core.errors import InvalidMedia
from trainhouse.core.reports import INT64, MAX_NAME

KINDS = ("image", "histogram", "table")

MiB = 1024 * 1024
#: one image's PNG file
MAX_IMAGE_BYTES = 4 * MiB
#: an image's width or height
MAX_IMAGE_SIDE = 8192
#: an image's width times height
MAX_IMAGE_PIXELS = 4096 * 4096
#: the chunks one PNG may have (ancillary ones included)
MAX_PNG_CHUNKS = 4096
#: the raw values one histogram is made from
MAX_HISTOGRAM_VALUES = 1_000_000
#: the buckets of every stored histogram
HISTOGRAM_BUCKETS = 64
MAX_TABLE_ROWS = 1000
MAX_TABLE_COLUMNS = 50
#: characters of one cell, or of a column's name
MAX_CELL = 1000
MAX_CAPTION = 1000
#: an MLflow table's JSON file read at most
MAX_TABLE_FILE = 4 * MiB
#: media items per job (an image, a histogram or a table at one step each)
MAX_MEDIA_ITEMS = 10_000
#: bytes of media per job (PNG files, histograms and tables as stored)
MAX_MEDIA_BYTES = 512 * MiB

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# colour type: (channels, bit depths allowed) -- the PNG specification's table
_COLOR_TYPES: dict[int, tuple[int, tuple[int, ...]]] = {
    0: (1, (1, 2, 4, 8, 16)),  # greyscale
    2: (3, (8, 16)),  # truecolour
    3: (1, (1, 2, 4, 8)),  # indexed
    4: (2, (8, 16)),  # greyscale with alpha
    6: (4, (8, 16)),  # truecolour with alpha
}
# Adam7: (x start, y start, x step, y step) of each pass
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
_INFLATE_CHUNK = 64 * 1024


def check_key(key: object) -> str:
    """A media key: a string of 1 to 256 characters without NUL (as a metric's name)."""
    if type(key) is not str or not 1 <= len(key) <= MAX_NAME or "\x00" in key:
        raise InvalidMedia(f"key must be a string of 1 to {MAX_NAME} characters without NUL")
    return key


def check_step(step: object) -> int:
    if type(step) is not int or not 0 <= step <= INT64:
        raise InvalidMedia(f"step must be a whole number from 0 to {INT64}, got {step!r}")
    return step


def check_caption(caption: object) -> str | None:
    if caption is None:
        return None
    if type(caption) is not str or len(caption) > MAX_CAPTION or "\x00" in caption:
        raise InvalidMedia(f"caption must be a string of at most {MAX_CAPTION} characters")
    return caption


# -- images -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PngInfo:
    width: int
    height: int
    bit_depth: int
    color_type: int
    interlaced: bool


def _scanlines(width: int, height: int, bits_per_pixel: int) -> int:
    """Bytes of the filtered scanlines of a ``width`` x ``height`` image (a filter byte each)."""
    if width == 0 or height == 0:
        return 0
    return height * (1 + (width * bits_per_pixel + 7) // 8)


def inflated_size(info: PngInfo) -> int:
    """The bytes the image data must inflate to, from the header alone."""
    channels, _ = _COLOR_TYPES[info.color_type]
    bpp = channels * info.bit_depth
    if not info.interlaced:
        return _scanlines(info.width, info.height, bpp)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        w = (info.width - x0 + dx - 1) // dx if info.width > x0 else 0
        rows = (info.height - y0 + dy - 1) // dy if info.height > y0 else 0
        total += _scanlines(w, rows, bpp)
    return total


def check_png(data: bytes) -> PngInfo:
    """``data`` as a PNG within the bounds, or :class:`InvalidMedia` naming what is wrong."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidMedia(
            f"an image may be at most {MAX_IMAGE_BYTES} bytes of PNG, this one is {len(data)}"
        )
    if not data.startswith(PNG_SIGNATURE):
        raise InvalidMedia("an image must be a PNG file (its signature is missing)")
    pos = len(PNG_SIGNATURE)
    info: PngInfo | None = None
    idat: list[memoryview] = []
    view = memoryview(data)
    chunks = 0
    ended = False
    while pos < len(data):
        if pos + 12 > len(data):
            raise InvalidMedia("the PNG is truncated (a chunk header runs past its end)")
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        end = pos + 12 + length
        if end > len(data):
            raise InvalidMedia(f"the PNG is truncated (chunk {kind!r} runs past its end)")
        body = view[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if zlib.crc32(body, zlib.crc32(kind)) != crc:
            raise InvalidMedia(f"the PNG's chunk {kind!r} fails its CRC check")
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise InvalidMedia(f"the PNG has more than {MAX_PNG_CHUNKS} chunks")
        if info is None:
            if kind != b"IHDR":
                raise InvalidMedia("the PNG's first chunk is not IHDR")
            info = _header(bytes(body))
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            ended = True
            pos = end
            break
        pos = end
    if info is None or not ended:
        raise InvalidMedia("the PNG has no IHDR or no IEND chunk")
    if pos != len(data):
        raise InvalidMedia("the PNG has bytes after its IEND chunk")
    if not idat:
        raise InvalidMedia("the PNG has no image data (IDAT)")
    _inflate_bounded(idat, inflated_size(info))
    return info


def _header(body: bytes) -> PngInfo:
    if len(body) != 13:
        raise InvalidMedia("the PNG's IHDR chunk is not 13 bytes long")
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", body)
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise InvalidMedia(
            f"an image may be at most {MAX_IMAGE_SIDE} pixels a side, this one declares "
            f"{width}x{height}"
        )
    if width * height > MAX_IMAGE_PIXELS:
        raise InvalidMedia(
            f"an image may have at most {MAX_IMAGE_PIXELS} pixels, this one declares "
            f"{width}x{height} = {width * height}"
        )
    if color not in _COLOR_TYPES or depth not in _COLOR_TYPES[color][1]:
        raise InvalidMedia(f"the PNG's colour type {color} with bit depth {depth} is not valid")
    if compression != 0 or filtering != 0 or interlace not in (0, 1):
        raise InvalidMedia("the PNG's compression, filter or interlace method is not valid")
    return PngInfo(width, height, depth, color, interlace == 1)


def _inflate_bounded(parts: list[memoryview], expected: int) -> None:
    """Inflate the image data a chunk of output at a time, keeping none of it, and refuse it
    the moment it passes ``expected`` bytes (or ends short of them)."""
    inflater = zlib.decompressobj()
    produced = 0
    try:
        for part in parts:
            pending = bytes(part)
            while pending:
                out = inflater.decompress(pending, _INFLATE_CHUNK)
                produced += len(out)
                if produced > expected:
                    raise InvalidMedia(
                        f"the PNG's image data inflates past the {expected} bytes its "
                        "header declares (a decompression bomb?)"
                    )
                pending = inflater.unconsumed_tail
                if inflater.eof:
                    break
            if inflater.eof:
                break
        while not inflater.eof:
            out = inflater.decompress(b"", _INFLATE_CHUNK)
            if not out:
                break
            produced += len(out)
            if produced > expected:
                raise InvalidMedia(
                    f"the PNG's image data inflates past the {expected} bytes its header declares"
                )
    except zlib.error as exc:
        raise InvalidMedia(f"the PNG's image data is not valid deflate data ({exc})") from None
    if not inflater.eof or produced != expected:
        raise InvalidMedia(
            f"the PNG's image data inflates to {produced} bytes, its header declares {expected}"
        )


# -- histograms ---------------------------------------------------------------------------


def histogram(values: Any) -> dict[str, Any]:
    """The stored histogram of ``values`` (a 1-D float array, or anything numpy reads as
    one): ``{"min", "max", "count", "buckets": [64 counts], "nan", "inf", "neginf"}``, the
    buckets equal between the finite values' min and max (one value: all in the middle one)."""
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size > MAX_HISTOGRAM_VALUES:
        raise InvalidMedia(
            f"a histogram is made of at most {MAX_HISTOGRAM_VALUES} values, got {array.size}"
        )
    if array.size == 0:
        raise InvalidMedia("a histogram needs at least one value")
    finite = np.isfinite(array)
    nan = int(np.isnan(array).sum())
    inf = int(np.isposinf(array).sum())
    neginf = int(np.isneginf(array).sum())
    kept = array[finite]
    if kept.size == 0:
        raise InvalidMedia(
            f"a histogram needs finite values: all {array.size} are NaN or infinite "
            f"({nan} NaN, {inf} +inf, {neginf} -inf)"
        )
    low, high = float(kept.min()), float(kept.max())
    if low == high:
        counts = [0] * HISTOGRAM_BUCKETS
        counts[HISTOGRAM_BUCKETS // 2] = int(kept.size)
    else:
        counts = np.histogram(kept, bins=HISTOGRAM_BUCKETS, range=(low, high))[0].tolist()
    return {
        "min": low,
        "max": high,
        "count": int(kept.size),
        "buckets": [int(c) for c in counts],
        "nan": nan,
        "inf": inf,
        "neginf": neginf,
    }


def histogram_from_bytes(raw: bytes) -> dict[str, Any]:
    """The histogram of raw little-endian float32 values (what the SDK sends)."""
    if len(raw) % 4:
        raise InvalidMedia("histogram values must be little-endian float32: a multiple of 4 bytes")
    if len(raw) // 4 > MAX_HISTOGRAM_VALUES:
        raise InvalidMedia(
            f"a histogram is made of at most {MAX_HISTOGRAM_VALUES} values, got {len(raw) // 4}"
        )
    return histogram(np.frombuffer(raw, dtype="<f4"))


def rebucket(low: float, high: float, limits: list[float], counts: list[float]) -> dict[str, Any]:
    """A histogram already bucketed elsewhere (TensorBoard's: each count is of the values up
    to its limit) in the stored form: each bucket's count goes to the stored bucket holding its
    middle (the first's lower edge is ``low``)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise InvalidMedia(f"a histogram's range must be finite, got {low} to {high}")
    if len(limits) != len(counts) or len(counts) > 100_000:
        raise InvalidMedia("a histogram's limits and counts differ in number")
    buckets = [0] * HISTOGRAM_BUCKETS
    span = high - low
    total = 0
    previous = low
    for limit, count in zip(limits, counts, strict=True):
        if not math.isfinite(count) or not 0 <= count <= INT64:
            raise InvalidMedia(f"a histogram's count must be from 0 to {INT64}, got {count}")
        upper = min(max(limit, low), high) if math.isfinite(limit) else high
        middle = (previous + upper) / 2
        previous = upper
        n = round(count)
        if n == 0:
            continue
        index = (
            HISTOGRAM_BUCKETS // 2 if span == 0 else int((middle - low) / span * HISTOGRAM_BUCKETS)
        )
        buckets[min(max(index, 0), HISTOGRAM_BUCKETS - 1)] += n
        total += n
    if total == 0:
        raise InvalidMedia("a histogram needs at least one value")
    if total > INT64:  # stored as JSON integers of 64 bits
        raise InvalidMedia(f"a histogram's counts must add up to at most {INT64}, got {total}")
    return {
        "min": low,
        "max": high,
        "count": total,
        "buckets": buckets,
        "nan": 0,
        "inf": 0,
        "neginf": 0,
    }


# -- tables -------------------------------------------------------------------------------


def check_table(columns: object, rows: object) -> dict[str, Any]:
    """``{"columns": [...], "rows": [[...], ...]}`` within the bounds; every row as long as
    ``columns``; a cell a string, a finite number, a boolean or null."""
    if not isinstance(columns, list) or not 1 <= len(columns) <= MAX_TABLE_COLUMNS:
        raise InvalidMedia(f"a table has 1 to {MAX_TABLE_COLUMNS} columns")
    for name in columns:
        if type(name) is not str or len(name) > MAX_CELL or "\x00" in name:
            raise InvalidMedia(f"a column's name must be a string of at most {MAX_CELL} characters")
    if not isinstance(rows, list) or len(rows) > MAX_TABLE_ROWS:
        raise InvalidMedia(
            f"a table has at most {MAX_TABLE_ROWS} rows, got "
            f"{len(rows) if isinstance(rows, list) else type(rows).__name__}"
        )
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise InvalidMedia(f"row {i} must be a list of {len(columns)} cells")
        for cell in row:
            _check_cell(cell, i)
    return {"columns": list(columns), "rows": [list(r) for r in rows]}


def _check_cell(cell: object, row: int) -> None:
    if cell is None or type(cell) is bool:
        return
    if type(cell) is int:
        if abs(cell) > INT64:
            raise InvalidMedia(f"row {row}: an integer cell must fit in 64 bits")
        return
    if type(cell) is float:
        if not math.isfinite(cell):
            raise InvalidMedia(f"row {row}: a number cell must be finite, got {cell}")
        return
    if type(cell) is str:
        if len(cell) > MAX_CELL or "\x00" in cell:
            raise InvalidMedia(
                f"row {row}: a cell may be at most {MAX_CELL} characters without NUL, got "
                f"{len(cell)}"
            )
        return
    raise InvalidMedia(
        f"row {row}: a cell must be a string, a number, a boolean or null, got "
        f"{type(cell).__name__}"
    )


# -- what the SDK sends -------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """An item checked and in its stored form: a PNG's bytes, or JSON."""

    key: str
    step: int
    kind: str
    data: bytes
    width: int | None = None
    height: int | None = None
    caption: str | None = None


def prepare_image(key: object, step: object, png: bytes, caption: object = None) -> Prepared:
    info = check_png(png)
    return Prepared(
        check_key(key),
        check_step(step),
        "image",
        png,
        info.width,
        info.height,
        check_caption(caption),
    )


def prepare_json(
    key: object, step: object, kind: str, value: dict[str, Any], caption: object = None
) -> Prepared:
    data = orjson.dumps(value)
    return Prepared(check_key(key), check_step(step), kind, data, caption=check_caption(caption))


def parse_item(body: bytes) -> Prepared:
    """One item as the SDK sends it (``POST /jobs/{id}/media``), checked::

    {"kind": "image", "key": "samples", "step": 3, "png": "<base64>", "caption": "..."}
    {"kind": "histogram", "key": "weights", "step": 3, "values": "<base64 float32 LE>"}
    {"kind": "table", "key": "preds", "step": 3, "columns": [...], "rows": [[...], ...]}
    """
    try:
        item = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidMedia("the body is not JSON") from None
    if not isinstance(item, dict):
        raise InvalidMedia("the body must be a JSON object")
    kind = item.get("kind")
    if kind not in KINDS:
        raise InvalidMedia(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    key, step, caption = item.get("key"), item.get("step"), item.get("caption")
    if kind == "image":
        return prepare_image(key, step, _base64(item.get("png"), "png"), caption)
    if kind == "histogram":
        value = histogram_from_bytes(_base64(item.get("values"), "values"))
        return prepare_json(key, step, kind, value, caption)
    return prepare_json(
        key, step, kind, check_table(item.get("columns"), item.get("rows")), caption
    )


def _base64(value: object, field: str) -> bytes:
    if type(value) is not str or len(value) > (MAX_IMAGE_BYTES * 4 // 3 + 8) * 2:
        raise InvalidMedia(f"{field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMedia(f"{field} is not valid base64") from None


# -- what MLflow's client uploads ------------------------------------------------------------

# mlflow.log_image(image, key=, step=): images/<key>+step+<n>+timestamp+<ms>+<uuid>.png (older
# clients: % for +); a / in the key is ~ (older: #); the +compressed.webp copy is left alone
_MLFLOW_IMAGE = re.compile(
    r"(?P<key>.+?)[+%]step[+%](?P<step>\d{1,18})[+%]timestamp[+%]\d{1,18}[+%][0-9a-fA-F-]{1,64}\.png"
)


def mlflow_image(parts: list[str]) -> tuple[str, int] | None:
    """The key and step of an artifact path MLflow's ``log_image(key=, step=)`` writes (its
    components below the run's root), or None for any other path."""
    if len(parts) != 2 or parts[0] != "images":
        return None
    match = _MLFLOW_IMAGE.fullmatch(parts[1])
    if match is None:
        return None
    return match["key"].replace("~", "/").replace("#", "/"), int(match["step"])


def mlflow_tables(tag_value: str) -> list[str]:
    """The table artifacts a run's ``mlflow.loggedArtifacts`` tag lists (``log_table`` sets it:
    ``[{"path": "preds.json", "type": "table"}, ...]``); nothing for any other value."""
    try:
        listed = orjson.loads(tag_value)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(listed, list):
        return []
    return [
        e["path"]
        for e in listed[:100]
        if isinstance(e, dict)
        and e.get("type") == "table"
        and isinstance(e.get("path"), str)
        and e["path"].endswith(".json")
    ]


def mlflow_table(data: bytes) -> dict[str, Any]:
    """A table ``log_table`` wrote (pandas' ``orient="split"`` JSON: columns and data) checked."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise InvalidMedia("an MLflow table must be JSON") from None
    if not isinstance(value, dict):
        raise InvalidMedia("an MLflow table must be a JSON object of columns and data")
    columns, rows = value.get("columns"), value.get("data")
    if isinstance(columns, list):
        columns = [_text(c) for c in columns]
    if isinstance(rows, list) and len(rows) <= MAX_TABLE_ROWS:
        # a cell that is no scalar (an image column's {"type": "image", ...}) as its JSON
        rows = [[_text(c) for c in r] if isinstance(r, list) else r for r in rows]
    return check_table(columns, rows)


def _text(cell: object) -> object:
    return orjson.dumps(cell).decode() if isinstance(cell, (dict, list)) else cell
