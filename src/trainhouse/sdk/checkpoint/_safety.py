"""Loading a checkpoint never unpickles arbitrary objects.

Files in the trainhouse format (:mod:`._format`): a JSON header checked against the file's
bounds, tensors as views of the bytes read; no pickle at all. Files written with torch.save:
``torch.load(weights_only=True)`` plus the numpy globals plain arrays and scalars need.
Sharded (torch.distributed.checkpoint) directories: DCP reads its ``.metadata`` with plain
``pickle``, so it is first unpickled here with an allow-list of DCP's own dataclasses and enums,
torch dtypes and sizes, and paths.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
from pathlib import Path
from typing import IO, Any

from trainhouse.core.errors import CheckpointError
from trainhouse.sdk.checkpoint import _format as file_format


def _numpy_safe_globals() -> list[Any]:
    """What unpickling plain numpy arrays and scalars needs (no object arrays, no code)."""
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    return [
        np.ndarray,
        np.dtype,
        core.multiarray._reconstruct,
        core.multiarray.scalar,
        *(type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGUS"),
    ]


def _global_name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _is_ours(source: Path | IO[bytes]) -> bool:
    """Whether the file is in the trainhouse format (an open file's position is kept)."""
    if isinstance(source, Path):
        with source.open("rb") as fh:
            return _is_ours(fh)
    start = source.tell()
    try:
        return file_format.is_ours(source.read(len(file_format.MAGIC)))
    finally:
        source.seek(start)


def _load_ours(source: Path | IO[bytes]) -> Any:
    if isinstance(source, Path):
        with source.open("rb", buffering=0) as fh:
            return _load_ours(fh)
    start = source.tell()
    size = source.seek(0, 2) - start
    source.seek(start)
    return file_format.parse(file_format.read_buffer(source, size))


def _source(path: str | os.PathLike[str] | IO[bytes]) -> Path | IO[bytes]:
    return Path(path) if isinstance(path, str | os.PathLike) else path


def load_checkpoint(path: str | os.PathLike[str] | IO[bytes]) -> Any:
    """Load a checkpoint file written by ``run.checkpoint.save``, outside a run too.

    The trainhouse format (:mod:`._format`: tensors raw, the rest JSON) is parsed without any
    pickle; a file written with ``torch.save`` (older checkpoints, or states the format does
    not hold) is loaded with ``torch.load(weights_only=True)`` that also accepts plain numpy
    arrays and scalars. Neither ever unpickles arbitrary objects. ``path`` may also be an open
    binary file (seekable).
    """
    import torch

    source = _source(path)
    if _is_ours(source):
        return _load_ours(source)
    with torch.serialization.safe_globals(_numpy_safe_globals()):
        return torch.load(source, map_location="cpu", weights_only=True)


safe_load = load_checkpoint


def refuse_unloadable(path: str | os.PathLike[str] | IO[bytes]) -> None:
    """Raise if ``load_checkpoint`` could not read ``path`` back (checked before it is kept)."""
    import torch

    source = _source(path)
    if _is_ours(source):
        load_checkpoint(source)  # no globals at all: only a malformed file fails
        return
    allowed = {_global_name(g) for g in _numpy_safe_globals()}
    found = torch.serialization.get_unsafe_globals_in_checkpoint(source)
    unsafe = [g for g in found if g not in allowed]
    if unsafe:
        raise CheckpointError(
            f"the state holds objects a checkpoint cannot load safely: {', '.join(unsafe)}; "
            "save tensors, numpy arrays, numbers, strings and containers of them "
            "(state_dict()s, not modules or custom classes)"
        )


_DCP = "torch.distributed.checkpoint"
_PLAIN = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("torch", "Size"),
    ("torch._utils", "_get_layout"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        obj = super().find_class(module, name)
        if (module, name) in _PLAIN:
            return obj
        if module == "torch" and isinstance(obj, torch.dtype | torch.layout | torch.memory_format):
            return obj
        if (
            (module == _DCP or module.startswith(_DCP + "."))
            and isinstance(obj, type)
            and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
        ):
            return obj
        raise CheckpointError(
            f"the sharded checkpoint's metadata refers to {module}.{name}, which a checkpoint "
            "never needs; refusing to load it"
        )


def check_dcp_metadata(data: bytes) -> Any:
    """Unpickle a DCP ``.metadata`` with the allow-list; raises CheckpointError on anything else."""
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"the sharded checkpoint's metadata is unreadable: {exc}") from None
