"""The checkpoint file format: tensors written raw at disk speed, the rest as tagged JSON.

A file is ``MAGIC`` (8 bytes), the header's length (8 bytes, little-endian), the header (UTF-8
JSON), zero padding up to a multiple of :data:`ALIGN`, then the data: every tensor's and numpy
array's bytes, each starting at a multiple of :data:`ALIGN` from the data's start. The header
is ``{"format": 1, "blobs": [[dtype, shape, offset, nbytes, requires_grad], ...], "tree":
node}``; a node is a JSON scalar (None, bool, int, float, str) or ``[tag, payload]``:

    l list   u tuple   d dict   o OrderedDict (payload: [[key node, value node], ...])
    t tensor (payload: its blob's index; the same tensor object twice is stored once)
    a numpy array   s numpy scalar (a blob index)   b bytes (hex)   z torch.Size   y torch.dtype

Like safetensors (a JSON header of dtype, shape and offsets, then the raw bytes), but one file
holds a whole training state: its structure and non-tensor values (optimizer hyperparameters,
RNG states, counters, numpy arrays) go in the header beside the tensor table. The safetensors
package holds only a flat dict of tensors with string metadata, refuses tensors that share
memory, and is one more dependency; the few hundred lines here do what a checkpoint needs.

Writing serializes nothing but the header: the bytes go from each tensor's memory to the file
(a non-contiguous or CUDA tensor is copied to contiguous CPU memory first, one at a time, as it
is written; distinct views of one storage are stored as their own data). Reading parses the
header with ``json`` only (no pickle, no code), checks every blob's dtype (an allow-list),
shape and size against its bounds in the file, and returns tensors whose storage is the part
of the one buffer the file was read into (no copy). A state holding anything else (a tensor
subclass, a sparse tensor, a set, a custom class) is not encodable: :func:`plan` returns None
and the caller writes it with ``torch.save`` as before.
"""

from __future__ import annotations

import collections
import functools
import json
import struct
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

from trainhouse.core.errors import CheckpointError, NotEncodable

MAGIC = b"THCKPT\x00\x01"
ALIGN = 64
FORMAT = 1
#: the largest header a reader accepts (a state of a million tensors has a header of ~100 MB)
MAX_HEADER = 1 << 30
_LEN = struct.Struct("<Q")
_TORCH_DTYPES = [
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex128",
    "complex64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
    "uint16",
    "uint32",
    "uint64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
]


def _torch_dtypes() -> dict[str, Any]:
    import torch

    found = {name: getattr(torch, name, None) for name in _TORCH_DTYPES}
    return {name: dt for name, dt in found.items() if isinstance(dt, torch.dtype)}


def _pad(n: int) -> int:
    return -n % ALIGN


def _tensor_bytes(t: Any) -> memoryview:
    """The bytes of tensor ``t`` as a view of CPU memory: its own where it is a contiguous CPU
    tensor, else a contiguous CPU copy (made now, one tensor at a time)."""
    import torch

    data = t.detach().resolve_conj().resolve_neg()
    if data.device.type != "cpu":
        data = data.cpu()
    raw: Any = data.contiguous().reshape(-1).view(torch.uint8).numpy()
    return memoryview(raw).cast("B")  # keeps the numpy array, which keeps the tensor


def _array_bytes(a: Any) -> memoryview:
    import numpy as np

    data: Any = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return memoryview(data)


class Plan:
    """A state encoded for writing: its header, and the tensors and arrays whose bytes follow
    it (each turned into bytes only as it is written)."""

    def __init__(self, header: bytes, blobs: list[tuple[Any, int]]) -> None:
        self.header = header
        self.blobs = blobs  # (a tensor or a numpy array, its size in bytes)
        head = len(MAGIC) + _LEN.size + len(header)
        self.size = head + _pad(head) + sum(n + _pad(n) for _, n in blobs)

    def chunks(self) -> Iterator[memoryview | bytes]:
        """The file's bytes, in order; the tensors' as views of their memory."""
        head = MAGIC + _LEN.pack(len(self.header)) + self.header
        yield head + bytes(_pad(len(head)))
        for value, nbytes in self.blobs:
            numpy = type(value).__module__ == "numpy"  # an ndarray: the encoder let no other in
            data = _array_bytes(value) if numpy else _tensor_bytes(value)
            if len(data) != nbytes:  # changed since it was planned
                raise CheckpointError(f"a tensor changed size while it was written: {nbytes}")
            yield data
            del data  # a CUDA tensor's CPU copy goes before the next one is made
            if _pad(nbytes):
                yield bytes(_pad(nbytes))

    def write(self, write: Callable[[Any], Any]) -> None:
        for chunk in self.chunks():
            write(chunk)


class _Encoder:
    def __init__(self) -> None:
        # None where the process never imported torch: then nothing in a state is torch's
        self.torch: Any = sys.modules.get("torch")
        self.names = {dt: name for name, dt in _torch_dtypes().items()} if self.torch else {}
        self.entries: list[list[Any]] = []
        self.blobs: list[tuple[Any, int]] = []
        self.seen: dict[int, int] = {}  # id of a tensor -> its blob index
        self.offset = 0

    def _blob(self, dtype: str, shape: list[int], value: Any, nbytes: int, grad: bool) -> int:
        self.entries.append([dtype, shape, self.offset, nbytes, grad])
        self.blobs.append((value, nbytes))
        self.offset += nbytes + _pad(nbytes)
        return len(self.entries) - 1

    def tensor(self, t: Any) -> int:
        torch = self.torch
        index = self.seen.get(id(t))
        if index is not None:
            return index
        name = self.names.get(t.dtype)
        if (
            type(t) is not torch.Tensor
            or name is None
            or t.layout != torch.strided
            or t.is_quantized
            or t.device.type == "meta"
        ):
            raise NotEncodable(f"a tensor of type {type(t).__name__}, {t.dtype}, {t.layout}")
        nbytes = t.numel() * t.element_size()
        index = self._blob(name, list(t.shape), t, nbytes, bool(t.requires_grad))
        self.seen[id(t)] = index  # the plan keeps t: ids stay unique while it lives
        return index

    def array(self, a: Any) -> int:
        dt = a.dtype
        if dt.kind not in "biufc" or dt.hasobject or dt.fields is not None:
            raise NotEncodable(f"a numpy array of dtype {dt}")
        return self._blob("np:" + dt.str, list(a.shape), a, int(a.nbytes), False)

    def node(self, obj: Any) -> Any:
        torch = self.torch
        kind = type(obj)
        if obj is None or kind in (bool, int, str, float):
            return obj
        if kind is dict or kind is collections.OrderedDict:
            items = [[self.node(k), self.node(v)] for k, v in obj.items()]
            return ["d" if kind is dict else "o", items]
        if kind is list:
            return ["l", [self.node(v) for v in obj]]
        if kind is tuple:
            return ["u", [self.node(v) for v in obj]]
        if torch is not None:
            if kind is torch.Size:
                return ["z", [int(v) for v in obj]]
            if isinstance(obj, torch.Tensor):
                return ["t", self.tensor(obj)]
            if kind is torch.dtype and obj in self.names:
                return ["y", self.names[obj]]
        if kind is bytes:
            return ["b", obj.hex()]
        if kind.__module__ == "numpy":
            import numpy as np

            if isinstance(obj, np.ndarray) and kind is np.ndarray:
                return ["a", self.array(obj)]
            if isinstance(obj, np.generic):
                return ["s", self.array(np.asarray(obj))]
        raise NotEncodable(f"a {kind.__module__}.{kind.__qualname__}")


def plan(state: Any) -> Plan | None:
    """``state`` encoded for writing, or None when it holds something this format does not
    store (then torch.save writes it)."""
    enc = _Encoder()
    try:
        tree = enc.node(state)
    except (NotEncodable, RecursionError):
        return None
    header = {"format": FORMAT, "blobs": enc.entries, "tree": tree}
    data = json.dumps(header, separators=(",", ":"), allow_nan=True).encode()
    return Plan(data, enc.blobs)


# -- reading -----------------------------------------------------------------------------------
def is_ours(head: bytes) -> bool:
    """Whether a file starting with ``head`` (at least 8 bytes) is in this format."""
    return head[: len(MAGIC)] == MAGIC


READ_CHUNK = 16 << 20


def read_buffer(fh: IO[bytes], size: int, hasher: Any = None) -> Any:
    """``size`` bytes of ``fh`` from where it stands, into one aligned uint8 tensor (a
    ``bytearray`` in a process that has not imported torch), in chunks. With ``hasher``, each
    chunk is hashed on a helper thread while the next one is read (both release the GIL). A
    short file raises CheckpointError."""
    buf, view = _buffer(size)
    got = 0
    with ThreadPoolExecutor(1, thread_name_prefix="trainhouse-hash") as pool:
        hashed: Future[Any] | None = None
        while got < size:
            n = fh.readinto(view[got : min(size, got + READ_CHUNK)])  # type: ignore[attr-defined]
            if not n:
                raise CheckpointError(f"the checkpoint is truncated: {got} of {size} bytes")
            if hasher is not None:
                if hashed is not None:
                    hashed.result()
                hashed = pool.submit(hasher.update, view[got : got + n])
            got += n
        if hashed is not None:
            hashed.result()
    return buf


def _buffer(size: int) -> tuple[Any, memoryview]:
    """A buffer of ``size`` bytes and a writable byte view of it: a uint8 tensor where torch is
    imported (its tensors are views of it), else a bytearray (a torch-free state needs none; a
    file that holds tensors imports torch then, and they view the bytearray)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        raw = bytearray(size)
        return raw, memoryview(raw)
    buf = torch.empty(size, dtype=torch.uint8)
    return buf, _view(buf)


def _view(buf: Any) -> memoryview:
    """The bytes of a buffer :func:`read_buffer` returned (or a uint8 CPU tensor)."""
    if isinstance(buf, bytearray | bytes | memoryview):
        return memoryview(buf).cast("B")
    host: Any = buf.numpy()
    return memoryview(host).cast("B")


def _refuse(why: str) -> CheckpointError:
    return CheckpointError(f"not a valid checkpoint file: {why}")


def _int(v: Any, what: str) -> int:
    if type(v) is not int or v < 0:
        raise _refuse(f"{what} is {v!r}, not a non-negative integer")
    return v


class _Decoder:
    def __init__(self, buf: Any, header: dict[str, Any], data_start: int) -> None:
        self.view = _view(buf)  # the views made of it keep the buffer alive
        entries = header.get("blobs")
        if not isinstance(entries, list):
            raise _refuse("the header has no blob list")
        self.entries = entries
        self.cache: dict[int, Any] = {}
        self.start = data_start

    @functools.cached_property
    def torch(self) -> Any:
        """torch, imported by the first tensor, torch.Size or dtype the file holds."""
        import torch

        return torch

    @functools.cached_property
    def dtypes(self) -> dict[str, Any]:
        return _torch_dtypes()

    def blob(self, index: Any, numpy: bool) -> Any:
        i = _int(index, "a blob index")
        if i >= len(self.entries):
            raise _refuse(f"blob {i} does not exist ({len(self.entries)} blobs)")
        if i in self.cache:
            return self.cache[i]
        entry = self.entries[i]
        if not isinstance(entry, list) or len(entry) != 5:
            raise _refuse(f"blob {i} is malformed")
        dtype, shape, offset, nbytes, grad = entry
        if not isinstance(shape, list):
            raise _refuse(f"blob {i}'s shape is not a list")
        dims = [_int(d, f"blob {i}'s shape") for d in shape]
        offset, nbytes = _int(offset, f"blob {i}'s offset"), _int(nbytes, f"blob {i}'s size")
        numel = 1
        for d in dims:
            numel *= d
        end = self.start + offset + nbytes
        if end > len(self.view):
            raise _refuse(f"blob {i} ends at byte {end}, past the file's end")
        if not isinstance(dtype, str) or dtype.startswith("np:") != numpy:
            raise _refuse(
                f"blob {i} has dtype {dtype!r} where a {'numpy' if numpy else 'torch'} "
                "one is expected"
            )
        begin = self.start + offset
        if numpy:
            value = self._array(i, dtype[3:], dims, numel, nbytes, begin)
        else:
            value = self._tensor(i, dtype, dims, numel, nbytes, begin, grad)
        self.cache[i] = value
        return value

    def _tensor(
        self, i: int, dtype: str, dims: list[int], numel: int, nbytes: int, begin: int, grad: Any
    ) -> Any:
        torch = self.torch
        dt = self.dtypes.get(dtype)
        if dt is None:
            raise _refuse(f"blob {i} has the unknown dtype {dtype!r}")
        if numel * dt.itemsize != nbytes:
            raise _refuse(f"blob {i}: {dims} of {dtype} is not {nbytes} bytes")
        if numel == 0:
            t = torch.empty(dims, dtype=dt)
        else:
            # a storage of its own (offset 0, as torch.load gives) over the buffer's memory
            flat = torch.frombuffer(self.view, dtype=dt, count=numel, offset=begin)
            t = flat.view(dims)
        if grad is True:
            if not (dt.is_floating_point or dt.is_complex):
                raise _refuse(f"blob {i} of {dtype} cannot require grad")
            t.requires_grad_(True)
        elif grad is not False:
            raise _refuse(f"blob {i}'s requires_grad is {grad!r}")
        return t

    def _array(
        self, i: int, dtype: str, dims: list[int], numel: int, nbytes: int, begin: int
    ) -> Any:
        import numpy as np

        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError):
            raise _refuse(f"blob {i} has the unknown numpy dtype {dtype!r}") from None
        if dt.kind not in "biufc" or dt.hasobject or dt.fields is not None or dt.str != dtype:
            raise _refuse(f"blob {i} has the numpy dtype {dtype!r}, which is not allowed")
        if numel * dt.itemsize != nbytes:
            raise _refuse(f"blob {i}: {dims} of {dtype} is not {nbytes} bytes")
        return np.frombuffer(self.view, dtype=dt, count=numel, offset=begin).reshape(dims)

    def node(self, n: Any) -> Any:
        if n is None or type(n) in (bool, int, float, str):
            return n
        if not isinstance(n, list) or len(n) != 2 or not isinstance(n[0], str):
            raise _refuse(f"a malformed node {str(n)[:80]}")
        tag, payload = n
        if tag in ("d", "o"):
            if not isinstance(payload, list):
                raise _refuse("a dict's items are not a list")
            items = []
            for item in payload:
                if not isinstance(item, list) or len(item) != 2:
                    raise _refuse("a dict item is not a pair")
                items.append((self.node(item[0]), self.node(item[1])))
            try:
                return dict(items) if tag == "d" else collections.OrderedDict(items)
            except TypeError:
                raise _refuse("a dict key is not hashable") from None
        if tag in ("l", "u", "z"):
            if not isinstance(payload, list):
                raise _refuse(f"a {tag!r} node's payload is not a list")
            values = [self.node(v) for v in payload]
            if tag == "l":
                return values
            if tag == "u":
                return tuple(values)
            if not all(type(v) is int for v in values):
                raise _refuse("a torch.Size holds a non-integer")
            return self.torch.Size(values)
        if tag == "t":
            return self.blob(payload, numpy=False)
        if tag == "a":
            return self.blob(payload, numpy=True)
        if tag == "s":
            return self.blob(payload, numpy=True)[()]
        if tag == "y" and isinstance(payload, str) and payload in self.dtypes:
            return self.dtypes[payload]
        if tag == "b" and isinstance(payload, str):
            try:
                return bytes.fromhex(payload)
            except ValueError:
                raise _refuse("a bytes node is not hex") from None
        raise _refuse(f"an unknown node {tag!r}")


def parse(buf: Any) -> Any:
    """The state held in ``buf`` (a uint8 CPU tensor or a bytearray holding the whole file, as
    :func:`read_buffer` gives); its tensors are views of ``buf``. Raises CheckpointError for
    anything malformed or out of bounds."""
    view = _view(buf)
    size = len(view)
    prefix = len(MAGIC) + _LEN.size
    if size < prefix or bytes(view[: len(MAGIC)]) != MAGIC:
        raise _refuse("it does not start with the trainhouse checkpoint header")
    (length,) = _LEN.unpack(bytes(view[len(MAGIC) : prefix]))
    if length > min(MAX_HEADER, size - prefix):
        raise _refuse(f"its header claims {length} bytes; the file has {size}")
    try:
        header = json.loads(bytes(view[prefix : prefix + length]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise _refuse(f"its header is not JSON ({str(exc)[:100]})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _refuse("its header is not a format-1 trainhouse header")
    start = prefix + length + _pad(prefix + length)
    decoder = _Decoder(buf, header, start)
    try:
        return decoder.node(header.get("tree"))
    except RecursionError:
        raise _refuse("its structure is nested too deeply") from None
