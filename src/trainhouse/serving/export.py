"""Exporting a registered model version to ONNX.

``python -m trainhouse.serving.export SRC_DIR OUT_DIR --format onnx [--workdir DIR]`` exports
the model in ``SRC_DIR`` (a ``models download``: its files are checked against the record
first) to ``OUT_DIR/<name>-v<version>.onnx`` with ``torch.onnx.export(..., dynamo=True)``,
dimension 0 of every input dynamic (the batch), and writes ``<name>-v<version>.json`` next to
it: the input and output names, the signature, the source model and version, and the ONNX
file's size and sha256. ``trainhouse models export`` (and ``Client.export_model``) download the
version and run this module in a child process: the CLI and the client never import torch.

A model saved with a loader, or registered from a checkpoint with one, is rebuilt by that
function of its job's code: ``--workdir`` points at that code (see
:func:`trainhouse.serving.replica.load`). The example inputs the exporter traces with are made
from the record's signature (a batch of 2). Both files are written under temp names and renamed
into place; an existing one is replaced only with ``--force``.

The outcome goes to ``--result FILE`` as JSON (what the export wrote, or ``{"error": ...}``):
torch's exporter prints its progress on stdout. Exit status: 0 done, 2 the model or the
arguments cannot be exported (a missing extra, a missing workdir, an output in the way), 1
torch's exporter failed (its reason in the error).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhouse.core.errors import ExportFailed, ModelError
from trainhouse.core.modelfiles import (
    LOADER_KINDS,
    MAX_MODEL_RECORD,
    RECORD,
    check_name,
    export_paths,
    missing_onnx,
)

if TYPE_CHECKING:
    import torch

__all__ = ["FORMATS", "ExportFailed", "check_targets", "example_inputs", "export_onnx", "main"]

FORMATS = ("onnx",)
#: the largest batch the exported model declares
MAX_BATCH = 1 << 16
#: the batch of the example inputs the exporter traces with (not 0 or 1, which it specializes)
EXAMPLE_BATCH = 2


def check_targets(out_dir: Path, name: str, version: int | None, *, force: bool) -> None:
    """Refuse an ``out_dir`` that is not a directory, or outputs that exist without ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelError(f"{out_dir} is not a directory")
    if force:
        return
    for path in export_paths(out_dir, name, version):
        if path.exists():
            raise ModelError(f"{path} exists: give --force to replace it")


def example_inputs(signature: dict[str, Any], batch: int = EXAMPLE_BATCH) -> list[torch.Tensor]:
    """Tensors of the signature's inputs (shape, dtype) with a batch of ``batch``."""
    import torch

    specs = list(signature.get("inputs") or [])
    if not specs:
        raise ModelError(
            "the model's record declares no inputs, which the exporter needs: register it with "
            "its inputs (trainhouse models register ... --loader F.py:FN --input "
            "NAME:DTYPE[B,d1,...])"
        )
    generator = torch.Generator().manual_seed(0)
    out = []
    for spec in specs:
        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ModelError(f"input {spec['name']} has the dtype {spec['dtype']!r}")
        dims = [d for d in spec["shape"][1:]]
        if any(not isinstance(d, int) for d in dims):
            raise ModelError(
                f"input {spec['name']} has the shape {spec['shape']}: only its first "
                "dimension (the batch) may vary"
            )
        shape = [batch, *dims]
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            out.append(torch.zeros(shape, dtype=dtype))
    return out


def _outputs(value: Any) -> list[torch.Tensor]:
    import torch

    items = list(value) if isinstance(value, tuple | list) else [value]
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise ModelError(
            "the model's outputs must be a tensor or a tuple of tensors to export, got "
            f"{type(value).__name__}"
        )
    return items


def _spec(name: str, t: torch.Tensor) -> dict[str, Any]:
    return {"name": name, "shape": [None, *t.shape[1:]], "dtype": str(t.dtype).split(".")[-1]}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(exc: BaseException) -> str:
    """What failed, for a person: the exception and its root cause (torch's exporter wraps the
    reason in advice and colours), on one line."""
    root = exc
    seen = {id(exc)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))

    def text(e: BaseException) -> str:
        return " ".join(_ANSI.sub("", str(e)).split())

    if root is exc:
        return f"{type(exc).__name__}: {text(exc)[:800]}"
    return f"{type(exc).__name__}, because {type(root).__name__}: {text(root)[:800]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def export_onnx(
    directory: Path,
    out_dir: Path,
    *,
    name: str | None = None,
    version: int | None = None,
    workdir: Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Export the model in ``directory`` to ``out_dir``; what was written (the JSON's fields,
    plus ``path`` and ``metadata``, where the two files are)."""
    missing = missing_onnx()
    if missing is not None:
        raise ModelError(missing)
    import onnx
    import torch

    from trainhouse.serving.replica import load

    directory = Path(directory)
    try:
        raw = (directory / RECORD).read_bytes()
    except OSError as exc:
        raise ModelError(f"{directory} holds no model record ({RECORD}): {exc}") from None
    if len(raw) > MAX_MODEL_RECORD:
        raise ModelError(f"{directory / RECORD} is larger than {MAX_MODEL_RECORD} bytes")
    record = json.loads(raw)
    name = check_name(name or str(record["name"]))
    check_targets(out_dir, name, version, force=force)
    kind = str(record.get("kind"))
    if kind in LOADER_KINDS and workdir is None:
        raise ModelError(
            f"{name}" + (f"@{version}" if version is not None else "") + f" is rebuilt by the "
            f"loader {record.get('loader')}, a function of its job's code: give that code with "
            "--workdir DIR (the job's workdir)"
        )
    loaded = load(directory, version=version or 0, workdir=workdir)
    module = loaded.module
    inputs = example_inputs(loaded.signature)
    with torch.no_grad():
        outputs = _outputs(module(*inputs))
    in_specs = [
        {**spec, "shape": list(spec["shape"])} for spec in loaded.signature.get("inputs") or []
    ]
    recorded = [str(s["name"]) for s in loaded.signature.get("outputs") or []]
    out_names = (
        recorded
        if len(recorded) == len(outputs)
        else ["output"]
        if len(outputs) == 1
        else [f"output_{i}" for i in range(len(outputs))]
    )
    in_names = [str(s["name"]) for s in in_specs]
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    try:
        with warnings.catch_warnings():  # the exporter's notes (a module left in training
            warnings.simplefilter("ignore")  # mode, deprecations) are not the user's to act on
            program = torch.onnx.export(
                module,
                tuple(inputs),
                dynamo=True,
                input_names=in_names,
                output_names=out_names,
                dynamic_shapes=tuple({0: batch} for _ in inputs),
                external_data=False,
                verbose=False,
            )
    except Exception as exc:
        raise ExportFailed(f"torch.onnx.export cannot export {name}: {_reason(exc)}") from exc
    if program is None:
        raise ExportFailed(f"torch.onnx.export returned no program for {name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, meta_path = export_paths(out_dir, name, version)
    tmp_onnx = out_dir / f".{onnx_path.name}.tmp-{os.getpid()}"
    tmp_meta = out_dir / f".{meta_path.name}.tmp-{os.getpid()}"
    try:
        try:
            program.save(str(tmp_onnx), external_data=False)
        except Exception as exc:
            reason = _reason(exc)
            raise ExportFailed(f"the ONNX program of {name} cannot be saved: {reason}") from exc
        proto = onnx.load(str(tmp_onnx), load_external_data=False)
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
        meta = {
            "format": "onnx",
            "file": onnx_path.name,
            "size": tmp_onnx.stat().st_size,
            "sha256": _sha256(tmp_onnx),
            "model": name,
            "version": version,
            "inputs": [i.name for i in proto.graph.input],
            "outputs": [o.name for o in proto.graph.output],
            "signature": {
                "inputs": in_specs,
                "outputs": [_spec(n, t) for n, t in zip(out_names, outputs, strict=True)],
            },
            "dynamic_batch": True,
            "opset": opset,
            "source": {
                "kind": kind,
                "saved_as": record.get("name"),
                "job_id": record.get("job_id"),
                "step": record.get("step"),
                "loader": record.get("loader"),
                "record_sha256": hashlib.sha256(raw).hexdigest(),
            },
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "created_at": time.time(),
        }
        tmp_meta.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp_onnx, onnx_path)
        os.replace(tmp_meta, meta_path)
    finally:
        for tmp in (tmp_onnx, tmp_meta):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return {**meta, "path": str(onnx_path), "metadata": str(meta_path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainhouse.serving.export")
    parser.add_argument("directory", type=Path, help="a downloaded model version's directory")
    parser.add_argument("out_dir", type=Path, help="where the exported files go")
    parser.add_argument("--format", choices=FORMATS, default="onnx")
    parser.add_argument("--name", help="the name it is exported as (default: its record's)")
    parser.add_argument("--version", type=int, help="the registered version it is")
    parser.add_argument("--workdir", type=Path, help="the job's code, for a model with a loader")
    parser.add_argument("--force", action="store_true", help="replace existing outputs")
    parser.add_argument("--result", type=Path, help="where the outcome goes, as JSON")
    args = parser.parse_args(argv)
    try:
        result: dict[str, Any] = export_onnx(
            args.directory,
            args.out_dir,
            name=args.name,
            version=args.version,
            workdir=args.workdir,
            force=args.force,
        )
        status = 0
    except ExportFailed as exc:
        result, status = {"error": str(exc), "code": "export_failed"}, 1
    except ModelError as exc:
        result, status = {"error": str(exc), "code": "model_error"}, 2
    except Exception as exc:  # the job's loader, or torch, failed outside the exporter
        import traceback

        traceback.print_exc()
        reason = " ".join(str(exc).split())[:800]
        result, status = {"error": f"{type(exc).__name__}: {reason}", "code": "error"}, 1
    if args.result is not None:
        args.result.write_text(json.dumps(result))
    if status:
        print(f"error: {result['error']}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
