"""``run.save_model``: export a model, write its files atomically next to the checkpoints, and
load a saved model back (what a serving replica and a test do).

The layout and the record are :mod:`trainhouse.core.modelfiles`'. ``torch.export`` captures the
model with a dynamic batch dimension (dimension 0 of every input); the program is saved with
``torch.export.save`` and the weights with safetensors. A model that ``torch.export`` cannot
capture raises a ModelError that names the reason, unless a ``loader`` (``"serve.py:load"``)
is given: then only the weights and the record are saved, and the loader rebuilds the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhouse.core.errors import ModelError
from trainhouse.core.modelfiles import (
    CHECKPOINT,
    KINDS,
    LOADER_KINDS,
    MAX_MODEL_RECORD,
    PROGRAM,
    RECORD,
    WEIGHTS,
    check_loader,
    check_name,
    verify_copy,
    version_dir,
)
from trainhouse.jobfs.storage import Storage
from trainhouse.sdk._program import check_program

if TYPE_CHECKING:
    import torch

__all__ = ["code_digest", "export_model", "load_model", "signature_of", "write_model"]

#: the largest batch the exported program accepts
MAX_BATCH = 1 << 16


def _tensors(value: Any, what: str) -> list[torch.Tensor]:
    import torch

    items = value if isinstance(value, tuple | list) else (value,)
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, torch.Tensor):
            raise ModelError(
                f"{what} {i} is a {type(item).__name__}: save_model takes models whose inputs "
                "and outputs are tensors (or tuples of tensors)"
            )
        if item.dim() < 1:
            raise ModelError(f"{what} {i} is a scalar: dimension 0 must be the batch")
        out.append(item)
    return out


def _input_names(model: Any, count: int) -> list[str]:
    try:
        params = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError, AttributeError):
        params = []
    return params[:count] if len(params) >= count else [f"input_{i}" for i in range(count)]


def signature_of(
    model: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
) -> dict[str, Any]:
    """Names, shapes (None for the batch dimension) and dtypes of the inputs and outputs."""

    def spec(name: str, t: torch.Tensor) -> dict[str, Any]:
        return {"name": name, "shape": [None, *t.shape[1:]], "dtype": str(t.dtype).split(".")[-1]}

    names = _input_names(model, len(inputs))
    return {
        "inputs": [spec(n, t) for n, t in zip(names, inputs, strict=True)],
        "outputs": [
            spec(f"output_{i}" if len(outputs) > 1 else "output", t) for i, t in enumerate(outputs)
        ],
    }


def export_model(model: Any, inputs: tuple[torch.Tensor, ...]) -> Any:
    """``torch.export`` with dimension 0 of every input dynamic; ModelError naming the reason
    when it cannot capture the model."""
    import torch

    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    shapes = tuple({0: batch} for _ in inputs)
    try:
        return torch.export.export(model, inputs, dynamic_shapes=shapes, strict=False)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:600] or type(exc).__name__
        raise ModelError(
            f"torch.export cannot capture model {type(model).__name__}: "
            f"{type(exc).__name__}: {reason}. Make forward() exportable, or save the weights "
            "with a loader that rebuilds the model: "
            "run.save_model(..., loader='serve.py:load')"
        ) from exc


def code_digest() -> str | None:
    """The sha256 of the script that runs (``__main__``'s file), when there is one."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if not main:
        return None
    with contextlib.suppress(OSError):
        return hashlib.sha256(Path(main).read_bytes()).hexdigest()
    return None


def _state_dict(model: Any) -> dict[str, torch.Tensor]:
    import torch

    state = {}
    seen: dict[tuple[int, Any], str] = {}
    for key, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            continue
        tensor = value.detach().to("cpu")
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if ident in seen:  # tied weights: safetensors stores each storage once
            tensor = tensor.clone()
        seen[ident] = key
        state[key] = tensor.contiguous()
    return state


def write_model(
    storage: Storage,
    name: str,
    model: Any,
    *,
    example_inputs: tuple[Any, ...] | list[Any] | Any,
    metrics: dict[str, float] | None,
    loader: str | None,
    step: int,
    attempt: int,
    job_id: int | None,
) -> dict[str, Any]:
    """Export and write a model's files as one directory, published whole; its record."""
    import torch
    from safetensors.torch import save as save_tensors

    check_name(name)
    if loader is not None:
        check_loader(loader)
    if step < 0:
        raise ModelError(f"a model's step must be >= 0, got {step}")
    inputs = tuple(_tensors(example_inputs, "example input"))
    clean = {}
    for key, value in (metrics or {}).items():
        number = float(value)
        clean[str(key)] = number if math.isfinite(number) else None
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.no_grad():
            outputs = _tensors(model(*inputs), "output")
        program = export_model(model, inputs) if loader is None else None
        weights = save_tensors(_state_dict(model))
    finally:
        if was_training:
            model.train()
    blobs: dict[str, bytes] = {WEIGHTS: weights}
    if program is not None:
        buf = io.BytesIO()
        torch.export.save(program, buf)
        blobs[PROGRAM] = buf.getvalue()
    files = [
        {"name": n, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        for n, b in sorted(blobs.items())
    ]
    record = {
        "name": name,
        "kind": "export" if program is not None else "loader",
        "loader": loader,
        "signature": signature_of(model, list(inputs), outputs),
        "torch": torch.__version__,
        "job_id": job_id,
        "attempt": attempt,
        "step": int(step),
        "code_digest": code_digest(),
        "metrics": clean,
        "files": files,
        "created_at": time.time(),
    }
    final = version_dir(name, step)
    tmp = storage.temp_name(final)
    try:
        for file_name, data in blobs.items():
            with storage.open_write(f"{tmp}/{file_name}") as fh:
                fh.write(data)
        with storage.open_write(f"{tmp}/{RECORD}") as fh:
            fh.write(json.dumps(record, indent=1).encode())
        storage.publish(tmp, final)
    except BaseException:
        with contextlib.suppress(Exception):
            storage.delete(tmp)
        raise
    record["path"] = final
    return record


def load_model(directory: Path, *, loader: Callable[..., Any] | None = None) -> Any:
    """The model saved in ``directory`` (a download or the version's directory), its files
    checked against the record first. An "export" model is the exported program's module
    with the saved weights; a "loader" one is what ``loader(weights)`` returns; a
    "checkpoint" one (registered from a checkpoint) is what ``loader(state)`` returns, the
    state read with the checkpoint reader (no pickle of arbitrary objects)."""
    import torch
    from safetensors.torch import load_file

    directory = Path(directory)
    raw = (directory / RECORD).read_bytes()
    if len(raw) > MAX_MODEL_RECORD:
        raise ModelError(f"{directory / RECORD} is larger than {MAX_MODEL_RECORD} bytes")
    record = json.loads(raw)
    kind = record.get("kind") if isinstance(record, dict) else None
    if kind not in KINDS:
        raise ModelError(f"{directory / RECORD} is of the unknown kind {str(kind)[:40]!r}")
    verify_copy(directory, list(record["files"]))
    if kind in LOADER_KINDS and loader is None:
        what = "weights" if kind == "loader" else "a checkpoint"
        raise ModelError(f"{directory} holds {what} only: it needs its loader {record['loader']}")
    if kind == "checkpoint":
        from trainhouse.sdk.checkpoint import load_checkpoint

        assert loader is not None
        return loader(load_checkpoint(directory / CHECKPOINT))
    weights = load_file(str(directory / WEIGHTS))
    if kind == "loader":
        assert loader is not None
        return loader(weights)
    check_program(directory / PROGRAM)  # data, never code: no pickle, no compiled library
    program = torch.export.load(str(directory / PROGRAM))
    module = program.module()
    try:
        result = module.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        reason = " ".join(str(exc).split())[:600]
        raise ModelError(f"{directory}'s weights do not fit its program: {reason}") from exc
    if result.missing_keys or result.unexpected_keys:  # never a model half loaded
        raise ModelError(
            f"{directory}'s weights do not fit its program: "
            + "; ".join(
                f"{what} {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                for what, keys in (
                    ("missing", result.missing_keys),
                    ("unexpected", result.unexpected_keys),
                )
                if keys
            )
        )
    return module
