"""What saving needs besides the format: collectives, a CPU copy of the state, hashing writes,
and telling a full disk from other write errors."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import sys
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import IO, Any

from trainhouse.core.errors import CheckpointError
from trainhouse.jobfs.storage import new_hash
from trainhouse.sdk._distributed import DistributedContext

DISK_FULL = "the disk is full (No space left on device)"
#: how long a rank waits for the others in a checkpoint's collectives (the main rank may be
#: writing or hashing a very large checkpoint meanwhile)
WAIT_TIMEOUT = timedelta(hours=6)


def gloo_group() -> Any:
    """A new gloo group of every rank with :data:`WAIT_TIMEOUT` (collective: every rank calls
    it at the same point)."""
    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)


class Comm:
    """A checkpoint operation's object collectives: over one process group (None: the default
    one) of ``distributed``, no-ops alone. Whether the ranks are connected is decided once, when
    the operation starts."""

    def __init__(self, distributed: DistributedContext, group: Any = None) -> None:
        self.distributed = distributed
        self.active = distributed.active
        self.group = group
        self.rank = distributed.rank
        self.world_size = distributed.world_size

    def broadcast(self, obj: Any) -> Any:
        """The main rank's ``obj`` on every rank."""
        if not self.active:
            return obj
        return self.distributed.broadcast(obj, group=self.group)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        return self.distributed.all_gather(obj, group=self.group)

    def agree(self, error: str | None) -> str | None:
        """The first rank's error among all ranks' (None when every rank succeeded)."""
        if not self.active:
            return error
        for rank, err in enumerate(self.all_gather(error)):
            if err is not None:
                return err if rank == self.rank or self.world_size == 1 else f"rank {rank}: {err}"
        return None


class Stager:
    """Copies a state off the device for a background save: tensors become CPU copies
    (DTensors stay DTensors around a CPU copy of their local shard), containers are rebuilt,
    numpy arrays copied.

    The CPU buffers are kept and reused by the next background save of the same structure
    (same place, shape and dtype): no page faults on fresh memory. A buffer for a CUDA tensor
    is page-locked at its exact size (:func:`pinned_empty`, not the caching host allocator,
    which rounds every block up to a power of two and keeps it) so the copies run
    asynchronously; the call returns once the copies on every device it read from are over.
    The caller makes sure the previous background write is over before reusing the buffers.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], Any] = {}
        self._devices: set[Any] = set()

    def clear(self) -> None:
        self._buffers.clear()

    def __call__(self, obj: Any) -> Any:
        self._devices = set()
        try:
            return self._stage(obj, ())
        finally:
            wait_for_copies(self._devices)

    def _tensor(self, t: Any, path: tuple[Any, ...]) -> Any:
        import torch

        t = t.detach()
        dtensor = _dtensor_type()
        if dtensor is not None and isinstance(t, dtensor):
            local = self._tensor(t._local_tensor, (*path, "<local>"))
            return dtensor(local, t._spec, requires_grad=False)
        if type(t) is not torch.Tensor or t.is_sparse or t.layout != torch.strided:
            return t.to("cpu", copy=True)  # other subclasses: their own copy
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            self._buffers.pop(path, None)  # its pages are unregistered once it is dropped
            if t.is_cuda:
                buf = pinned_empty(t.shape, t.dtype)
            else:
                buf = torch.empty(t.shape, dtype=t.dtype)
            self._buffers[path] = buf
        if t.is_cuda:
            self._devices.add(t.device)
        buf.copy_(t, non_blocking=t.is_cuda)
        return buf

    def _stage(self, obj: Any, path: tuple[Any, ...]) -> Any:
        torch: Any = sys.modules.get("torch")  # None: nothing in the state is a tensor
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, dict):
            items = [(k, self._stage(v, (*path, k))) for k, v in obj.items()]
            try:
                return type(obj)(items)
            except TypeError:
                return dict(items)
        if isinstance(obj, list):
            return [self._stage(v, (*path, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            values = [self._stage(v, (*path, i)) for i, v in enumerate(obj)]
            return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
        copy = getattr(obj, "copy", None)
        if type(obj).__module__ == "numpy" and callable(copy):
            return copy()
        return obj


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return None
    return DTensor


_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context


def pinned_empty(shape: Any, dtype: Any) -> Any:
    """An uninitialised CPU tensor of exactly ``shape`` whose pages are registered with CUDA
    (page-locked) until the tensor is garbage, so device-to-host copies into it are
    asynchronous. Where registering fails (no CUDA, a locked-memory limit) the tensor is
    returned unpinned: copies into it are synchronous, and still correct."""
    import torch

    buf = torch.empty(shape, dtype=dtype)
    size = buf.numel() * buf.element_size()
    if size == 0 or not torch.cuda.is_available():
        return buf
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    ptr = buf.data_ptr()
    if int(cudart.cudaHostRegister(ptr, size, _HOST_REGISTER_PORTABLE)) != 0:
        return buf
    weakref.finalize(buf, cudart.cudaHostUnregister, ptr)
    return buf


def wait_for_copies(devices: Iterable[Any]) -> None:
    """Wait until the work queued so far on each device's current stream (the asynchronous
    copies among it) is over: every device read from, not only the current one."""
    devices = list(devices)
    if not devices:  # nothing copied from a GPU (torch perhaps never imported)
        return
    import torch

    for device in devices:
        torch.cuda.current_stream(device).synchronize()


def stage(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are CPU copies (see :class:`Stager`), without reuse."""
    return Stager()(obj)


def _leaves(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def estimate_bytes(obj: Any) -> int:
    """About how many bytes ``obj`` takes on disk (tensor and array data plus some overhead)."""
    torch: Any = sys.modules.get("torch")  # None: nothing in it is a tensor
    total = 64 * 1024
    for leaf in _leaves(obj):
        if torch is not None and isinstance(leaf, torch.Tensor):
            try:
                local = leaf.to_local() if hasattr(leaf, "to_local") else leaf
                total += local.numel() * local.element_size()
            except Exception:
                continue
        else:
            total += int(getattr(leaf, "nbytes", 0) or 0)
    return total


class HashingWriter:
    """A write-only file wrapper that hashes (``algorithm``: sha256 or blake3) and counts what
    goes through and remembers the first OSError (torch turns it into a RuntimeError whose
    message lost the errno).

    A large chunk is hashed on a helper thread while it is being written (both release the
    GIL), and finished before ``write`` returns: the chunk's memory is only borrowed. The bytes
    hashed are the ones written, from the same buffer: the file is never read back to hash it.

    Where ``fh`` is a local file (Linux), every :data:`WRITEBACK` bytes written start the disk
    writing them out (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait): the
    disk works while the rest is still being written, and the final fsync has little left.
    """

    PARALLEL_MIN = 1 << 20
    WRITEBACK = 8 << 20

    def __init__(self, fh: IO[bytes], algorithm: str = "sha256") -> None:
        self._fh = fh
        self.algorithm = algorithm
        self._hash = new_hash(algorithm)
        self.size = 0
        self.error: OSError | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._fd = _file_descriptor(fh) if _SYNC_FILE_RANGE is not None else None
        self._unstarted = 0  # bytes written since writeback was last started

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes >= self.PARALLEL_MIN and view.c_contiguous:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="trainhouse-hash")
            hashed = self._pool.submit(self._hash.update, view)
            try:
                written = self._write(view)
            finally:
                hashed.result()
        else:
            written = self._write(view)
            self._hash.update(view)
        self.size += view.nbytes
        self._unstarted += view.nbytes
        if self._fd is not None and self._unstarted >= self.WRITEBACK:
            self._start_writeback(self._fd)
        return written if written is not None else view.nbytes

    def _start_writeback(self, fd: int) -> None:
        self._unstarted = 0
        try:
            self._fh.flush()  # what the file object buffers reaches the kernel first
        except OSError as exc:
            self.error = self.error or exc
            raise
        assert _SYNC_FILE_RANGE is not None
        if _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            self._fd = None  # not on this file system: the final fsync writes it all

    def _write(self, view: memoryview) -> int | None:
        try:
            return self._fh.write(view)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        try:
            self._fh.flush()
        except OSError as exc:
            self.error = self.error or exc
            raise

    def writable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        return str(self._hash.hexdigest())


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait


def _sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()


def _file_descriptor(fh: IO[bytes]) -> int | None:
    """The OS file descriptor of a plain local file, else None."""
    try:
        fd = fh.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
    return fd if isinstance(fd, int) and stat.S_ISREG(os.fstat(fd).st_mode) else None


_WRITE_FAILED = re.compile(r"writ|unexpected pos|iostream|I/O|space", re.IGNORECASE)


def _chain(exc: BaseException | None, seen: set[int] | None = None) -> Iterator[BaseException]:
    seen = set() if seen is None else seen
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        for failure in (getattr(exc, "failures", None) or {}).values():  # DCP's CheckpointException
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, BaseException):
                yield from _chain(inner, seen)
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException, *, free: int | None, needed: int) -> bool:
    """ENOSPC anywhere in the chain, or torch's bare "write failed" RuntimeError while the free
    space is below what the checkpoint needed."""
    for err in _chain(exc):
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
    return (
        free is not None
        and free < needed
        and any(isinstance(e, RuntimeError) and _WRITE_FAILED.search(str(e)) for e in _chain(exc))
    )


def disk_full_error(target: str, free: int | None, needed: int, previous: str) -> CheckpointError:
    free_text = f"{free} bytes free" if free is not None else "the bytes free are unknown"
    return CheckpointError(
        f"cannot write checkpoint {target}: {DISK_FULL}; {free_text} there, about {needed} "
        f"bytes needed; {previous}; free some space (or keep fewer checkpoints) and restart"
    )
