"""Loading a checkpoint never unpickles arbitrary objects.

Files: ``torch.load(weights_only=True)`` plus the numpy globals plain arrays and scalars need.
Sharded (torch.distributed.checkpoint) directories: DCP reads its ``.metadata`` with plain
``pickle``, so it is first unpickled here with an allow-list of DCP's own dataclasses and enums,
torch dtypes and sizes, and paths.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from pathlib import Path
from typing import IO, Any

from trainhouse.errors import CheckpointError


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


def load_checkpoint(path: str | Path | IO[bytes]) -> Any:
    """Load a checkpoint file written by ``run.checkpoint.save``, outside a run too.

    ``torch.load(weights_only=True)`` that also accepts plain numpy arrays and scalars; it never
    unpickles arbitrary objects. ``path`` may also be an open binary file.
    """
    import torch

    source = path if hasattr(path, "read") else Path(path)
    with torch.serialization.safe_globals(_numpy_safe_globals()):
        return torch.load(source, map_location="cpu", weights_only=True)


safe_load = load_checkpoint


def refuse_unloadable(path: str | Path | IO[bytes]) -> None:
    """Raise if ``load_checkpoint`` could not read ``path`` back (checked before it is kept)."""
    import torch

    allowed = {_global_name(g) for g in _numpy_safe_globals()}
    source = path if hasattr(path, "read") else Path(path)
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
