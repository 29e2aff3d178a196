"""A saved model's files: where ``run.save_model`` puts them, what its record says, and checking
a copy of them.

A saved model is a directory in the job's checkpoint storage (next to its checkpoints)::

    models/<name>/step-<step:09d>/
        program.pt2           torch.export's program, with a dynamic batch dimension ("export")
        weights.safetensors   the weights (the state_dict)
        model.json            the record: signature, torch version, job/attempt/step, code
                              digest, metrics, loader, and the size and sha256 of each file above

A model that ``torch.export`` cannot capture is saved with a ``loader`` (``"serve.py:load"``, a
function of the job's own code that rebuilds the model from its weights) and no program
("loader"). The directory is written under a temp name and published whole. The record's own
sha256 is taken by the server when it registers the version.

A model registered from one of a job's checkpoints (``models register NAME --job J --loader
serve.py:load``, "checkpoint") is the same directory with the checkpoint's file copied in
(``checkpoint.ckpt``, verified against the checkpoint's registered digest as it is copied) and
a record the server writes: the loader, the checkpoint it came from, no program. Its loader
gets the whole checkpoint's state (what ``run.checkpoint.load()`` returns). The copy lies
outside the checkpoints retention deletes.

Standard library only: the SDK, the server and the client all use it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from trainhouse.core.errors import ModelError

__all__ = [
    "BATCH_HEADER",
    "CHECKPOINT",
    "INPUT_DTYPES",
    "KINDS",
    "LOADER",
    "LOADER_KINDS",
    "MAX_MODEL_RECORD",
    "NAME",
    "NAME_RULE",
    "ONNX_EXTRA",
    "PROGRAM",
    "RECORD",
    "REPLICA_KEY_HEADER",
    "ROOT",
    "WEIGHTS",
    "check_inputs",
    "check_loader",
    "check_name",
    "export_paths",
    "missing_onnx",
    "parse_input",
    "parse_ref",
    "sha256_file",
    "verify_copy",
    "version_dir",
]

ROOT = "models"
PROGRAM = "program.pt2"
WEIGHTS = "weights.safetensors"
RECORD = "model.json"
CHECKPOINT = "checkpoint.ckpt"
#: "export": a torch.export program; "loader": weights and a function of the job's code;
#: "checkpoint": a copy of one of the job's checkpoints and a function of the job's code
KINDS = ("export", "loader", "checkpoint")
#: the kinds whose model is rebuilt by a loader of the job's code
LOADER_KINDS = ("loader", "checkpoint")
#: the bytes of a record the server reads at most (it holds a signature, metrics, digests)
MAX_MODEL_RECORD = 256 * 1024
#: a model's (and an alias's) name: what a URL path, a CLI argument and a directory all take
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
#: ``file.py:function``: where a loader lives in the job's workdir
LOADER = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_./-]{0,200}\.py):([A-Za-z_][A-Za-z0-9_]{0,100})$")
#: the dtypes a declared input may have (what a replica can build from JSON numbers)
INPUT_DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)
_INPUT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]{0,63}):([a-z0-9]{1,16})\[([^\]]{0,200})\]$")
MAX_INPUTS = 64
MAX_DIMS = 16
_STEP_DIR = re.compile(r"^step-([0-9]{9,})$")
CHUNK = 1 << 20
#: what a service's replica wants on every prediction (the key it gave its server), and the
#: header of its answer that says how many examples the batch it ran in had
REPLICA_KEY_HEADER = "x-trainhouse-replica-key"
BATCH_HEADER = "x-trainhouse-batch"


def check_name(name: str, what: str = "a model name") -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ModelError(f"{what} must be {NAME_RULE}, got {str(name)[:80]!r}")
    return name


def check_loader(loader: str) -> str:
    """``file.py:function`` with the file relative, inside the workdir."""
    match = LOADER.match(loader) if isinstance(loader, str) else None
    if match is None or ".." in match.group(1).split("/") or match.group(1).startswith("/"):
        raise ModelError(
            "loader must be 'file.py:function', a function of the job's own code (a relative "
            f"path inside its workdir), got {str(loader)[:120]!r}"
        )
    return loader


def parse_input(text: str) -> dict[str, Any]:
    """``NAME:DTYPE[B,d1,...]`` (``x:float32[B,1,8,8]``, B the batch) as a signature's input
    spec ``{"name", "dtype", "shape": [None, d1, ...]}``."""
    match = _INPUT.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ModelError(
            "an input must be NAME:DTYPE[B,d1,...] (e.g. x:float32[B,1,8,8], B the batch "
            f"dimension), got {str(text)[:120]!r}"
        )
    name, dtype, dims = match.groups()
    shape: list[int | None] = []
    for i, dim in enumerate(d.strip() for d in dims.split(",")):
        if i == 0:
            if dim != "B":
                raise ModelError(
                    f"input {name}: dimension 0 must be B (the batch), got {dim[:20]!r} in "
                    f"{text[:120]!r}"
                )
            shape.append(None)
        elif dim.isdigit() and len(dim) <= 9:
            shape.append(int(dim))
        else:
            raise ModelError(
                f"input {name}: dimension {i} must be a number, got {dim[:20]!r} in {text[:120]!r}"
            )
    return check_inputs([{"name": name, "dtype": dtype, "shape": shape}])[0]


def check_inputs(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A declared signature's inputs: unique names, dimension 0 the batch (None), the others
    positive sizes, a dtype of :data:`INPUT_DTYPES`."""
    if not 1 <= len(inputs) <= MAX_INPUTS:
        raise ModelError(f"a model takes 1 to {MAX_INPUTS} inputs, got {len(inputs)}")
    names = set()
    for spec in inputs:
        name, dtype, shape = spec.get("name"), spec.get("dtype"), spec.get("shape")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            raise ModelError(f"an input's name must be an identifier, got {str(name)[:80]!r}")
        if name in names:
            raise ModelError(f"the input {name} is declared twice")
        names.add(name)
        if dtype not in INPUT_DTYPES:
            raise ModelError(
                f"input {name}: dtype must be one of {', '.join(INPUT_DTYPES)}, "
                f"got {str(dtype)[:40]!r}"
            )
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= MAX_DIMS
            or shape[0] is not None
            or any(type(d) is not int or not 1 <= d < 2**31 for d in shape[1:])
        ):
            raise ModelError(
                f"input {name}: shape must be [B, d1, ...] (1 to {MAX_DIMS} dimensions, the "
                f"first the batch, null in JSON; the others positive), got {str(shape)[:120]}"
            )
    return [{"name": s["name"], "shape": list(s["shape"]), "dtype": s["dtype"]} for s in inputs]


ONNX_EXTRA = "pip install 'trainhouse[onnx]'"


def missing_onnx() -> str | None:
    """What ``models export --format onnx`` lacks here (onnx, onnxscript), as a sentence
    naming the extra; None when nothing is missing. Nothing is imported."""
    import importlib.util

    def absent(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except (ImportError, ValueError):
            return True

    missing = [m for m in ("onnx", "onnxscript") if absent(m)]
    if not missing:
        return None
    return f"exporting to ONNX needs {' and '.join(missing)} (the onnx extra): {ONNX_EXTRA}"


def export_paths(out_dir: Path, name: str, version: int | None) -> tuple[Path, Path]:
    """Where ``models export`` writes ``name`` at ``version``: the ONNX file and its JSON."""
    stem = f"{check_name(name)}-v{version}" if version is not None else check_name(name)
    return out_dir / f"{stem}.onnx", out_dir / f"{stem}.json"


def version_dir(name: str, step: int) -> str:
    """The directory (relative to the job's checkpoint storage) of a model saved at ``step``."""
    return f"{ROOT}/{check_name(name)}/step-{int(step):09d}"


def step_of(directory: str) -> int | None:
    match = _STEP_DIR.match(directory.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def parse_ref(ref: str) -> tuple[str, str]:
    """``NAME@VERSION`` or ``NAME@ALIAS`` (``NAME`` alone: ``latest``) as (name, ref)."""
    name, _, which = str(ref).partition("@")
    check_name(name)
    which = which or "latest"
    if not NAME.match(which):
        raise ModelError(f"a version or alias must be {NAME_RULE}, got {which[:80]!r}")
    return name, which


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_copy(directory: Path, files: list[dict[str, Any]]) -> None:
    """Check that ``directory`` holds each of ``files`` (``{"name", "size", "sha256"}``) with
    its size and sha256; a ModelError naming the first file that does not."""
    for entry in files:
        path = directory / str(entry["name"])
        if not path.is_file():
            raise ModelError(f"{path} is missing")
        size = path.stat().st_size
        if size != int(entry["size"]):
            raise ModelError(f"{path} is {size} bytes, the registered size is {entry['size']}")
        actual = sha256_file(path)
        if actual != entry["sha256"]:
            raise ModelError(
                f"{path}: sha256 {actual[:16]}... does not match the registered "
                f"{str(entry['sha256'])[:16]}..."
            )
