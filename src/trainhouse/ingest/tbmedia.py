"""TensorBoard's images and histograms, read by :mod:`trainhouse.ingest.tensorboard` from a
job's event files, as the job's media (:mod:`trainhouse.core.media`).

The reader migrates every summary to a tensor: an image is ``[width, height, png, ...]``
strings (plugin ``images``; the first image is taken, ``add_image``'s only one), a histogram
``[k, 3]`` doubles, each row a bucket's left edge, right edge and count (plugin
``histograms``), re-bucketed into the stored 64. The file is the job's, so hostile: the
tensor's declared shape and its content's length are checked before numpy reads it
(``make_ndarray`` repeats one value to fill any shape it names), and the PNG goes through the
same checks as one the SDK sends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainhouse.core.errors import InvalidMedia
from trainhouse.core.media import MAX_IMAGE_BYTES, Prepared, prepare_image, prepare_json, rebucket

__all__ = ["MAX_BUCKETS", "media_item"]

#: the buckets of a histogram read at most (TensorBoard's default is 30; torch's writer 600+)
MAX_BUCKETS = 10_000


def media_item(value: Any, key: str, step: int) -> Prepared | None:
    """The image or histogram a summary value holds (None: neither). Raises
    :class:`InvalidMedia` for one that breaks a rule."""
    plugin = value.metadata.plugin_data.plugin_name
    if not value.HasField("tensor") or plugin not in ("images", "histograms"):
        return None
    tensor = value.tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    if plugin == "images":
        strings = tensor.string_val
        if len(dims) != 1 or len(strings) < 3:
            raise InvalidMedia(f"TensorBoard image {key!r} holds no image")
        png = strings[2]
        if len(png) > MAX_IMAGE_BYTES:
            raise InvalidMedia(
                f"an image may be at most {MAX_IMAGE_BYTES} bytes of PNG, {key!r} is {len(png)}"
            )
        return prepare_image(key, step, bytes(png))
    if len(dims) != 2 or dims[1] != 3 or not 0 < dims[0] <= MAX_BUCKETS:
        raise InvalidMedia(
            f"TensorBoard histogram {key!r} has shape {dims}, not [k <= {MAX_BUCKETS}, 3]"
        )
    rows = _doubles(tensor, dims[0] * 3).reshape(dims[0], 3)
    finite = np.isfinite(rows).all(axis=1)
    if not finite.any():
        raise InvalidMedia(f"TensorBoard histogram {key!r} has no finite bucket")
    kept = rows[finite]
    low, high = float(kept[:, 0].min()), float(kept[:, 1].max())
    hist = rebucket(low, high, kept[:, 1].tolist(), kept[:, 2].tolist())
    return prepare_json(key, step, "histogram", hist)


def _doubles(tensor: Any, count: int) -> np.ndarray:
    """The tensor's ``count`` numbers, from its packed content or its value list, whichever it
    has, of exactly that length."""
    dtype = {1: np.float32, 2: np.float64}.get(int(tensor.dtype))  # DT_FLOAT, DT_DOUBLE
    if dtype is None:
        raise InvalidMedia("a TensorBoard histogram must hold floats or doubles")
    content = tensor.tensor_content
    if content:
        if len(content) != count * np.dtype(dtype).itemsize:
            raise InvalidMedia("a TensorBoard histogram's content does not fill its shape")
        return np.frombuffer(content, dtype=np.dtype(dtype).newbyteorder("<")).astype(np.float64)
    values = tensor.double_val if dtype is np.float64 else tensor.float_val
    if len(values) != count:
        raise InvalidMedia("a TensorBoard histogram's values do not fill its shape")
    return np.asarray(values, dtype=np.float64)
