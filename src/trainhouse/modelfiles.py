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

Standard library only: the SDK, the server and the client all use it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from trainhouse.errors import ModelError

__all__ = [
    "BATCH_HEADER",
    "KINDS",
    "LOADER",
    "MAX_MODEL_RECORD",
    "NAME",
    "NAME_RULE",
    "PROGRAM",
    "RECORD",
    "REPLICA_KEY_HEADER",
    "ROOT",
    "WEIGHTS",
    "check_loader",
    "check_name",
    "parse_ref",
    "sha256_file",
    "verify_copy",
    "version_dir",
]

ROOT = "models"
PROGRAM = "program.pt2"
WEIGHTS = "weights.safetensors"
RECORD = "model.json"
#: "export": a torch.export program; "loader": weights and a function of the job's code
KINDS = ("export", "loader")
#: the bytes of a record the server reads at most (it holds a signature, metrics, digests)
MAX_MODEL_RECORD = 256 * 1024
#: a model's (and an alias's) name: what a URL path, a CLI argument and a directory all take
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
#: ``file.py:function``: where a loader lives in the job's workdir
LOADER = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_./-]{0,200}\.py):([A-Za-z_][A-Za-z0-9_]{0,100})$")
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
