"""A saved model's program (``program.pt2``) is data, never code: checked before
``torch.export.load`` opens it.

``torch.export.load`` unpickles whatever a PT2 archive asks it to: a weight or constant saved
"with pickle" (``use_pickle``), a custom or opaque object, a legacy ``.pt`` state dict, and
sample inputs it first tries with ``weights_only=True`` and then, on failure, without. It also
loads AOTInductor's compiled libraries. A registered model is what some job wrote, so whoever
loads it (``load_model``, ``models export``, a replica of another user's service) would run
that job's code. :func:`check_program` refuses every archive but the plain one ``run.save_model``
writes: one root folder holding exactly the files below, every weight and constant a raw tensor
payload, and sample inputs that ``torch.load(weights_only=True)`` reads; the error names what it
met. Standard library and torch only.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from trainhouse.core.errors import ModelError

__all__ = ["check_program"]

#: the files of a plain program (relative to the archive's one root folder)
FIXED = {
    "archive_format",
    "archive_version",
    "byteorder",
    ".data/version",
    ".data/serialization_id",
}
MODEL = "models/model.json"
WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
SAMPLE_INPUTS = "data/sample_inputs/model.pt"
WEIGHT = re.compile(r"^data/weights/weight_[0-9]{1,9}$")
CONSTANT = re.compile(r"^data/constants/tensor_[0-9]{1,9}$")
EXTRA = re.compile(r"^extra/[A-Za-z0-9_.-]{1,128}$")  # read as text
#: a config file's bytes at most
MAX_CONFIG = 64 << 20


def check_program(path: Path) -> None:
    """Refuse (ModelError) a program whose loading would unpickle or load compiled code."""
    where = f"{path.parent.name}/{path.name}"
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{where} is not a PT2 archive: {exc}") from None
    with archive:
        names = archive.namelist()
        roots = {name.split("/", 1)[0] for name in names}
        if len(roots) != 1 or any("/" not in name for name in names):
            raise ModelError(f"{where} is not a PT2 archive of one root folder")
        root = roots.pop()
        files = {name[len(root) + 1 :] for name in names}
        for name in sorted(files):
            if not (name in FIXED or name in _CONFIGS or _plain_data(name)):
                raise ModelError(
                    f"{where} holds {name[:120]!r}, which a program saved by run.save_model "
                    "never has (a pickled object, compiled code or another model): refused, "
                    "loading it could run code"
                )
        if MODEL not in files:
            raise ModelError(f"{where} holds no {MODEL}")
        for config, pattern in ((WEIGHTS_CONFIG, WEIGHT), (CONSTANTS_CONFIG, CONSTANT)):
            if config in files:
                _check_config(where, _read(archive, f"{root}/{config}"), config, pattern)
        if SAMPLE_INPUTS in files:
            _check_sample_inputs(where, _read(archive, f"{root}/{SAMPLE_INPUTS}"))


_CONFIGS = {MODEL, WEIGHTS_CONFIG, CONSTANTS_CONFIG, SAMPLE_INPUTS}


def _plain_data(name: str) -> bool:
    return bool(WEIGHT.match(name) or CONSTANT.match(name) or EXTRA.match(name))


def _read(archive: zipfile.ZipFile, name: str) -> bytes:
    if archive.getinfo(name).file_size > MAX_CONFIG:
        raise ModelError(f"{name} is over {MAX_CONFIG} bytes")
    return archive.read(name)


def _check_config(where: str, raw: bytes, name: str, pattern: re.Pattern[str]) -> None:
    """Every payload of a weights or constants config: a raw tensor, never a pickle."""
    try:
        config = json.loads(raw)["config"]
        entries: list[tuple[str, Any]] = list(config.items())
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ModelError(f"{where}'s {name} is not a payload config") from None
    prefix = name.rsplit("/", 1)[0] + "/"
    for key, meta in entries:
        if not isinstance(meta, dict):
            raise ModelError(f"{where}'s {name} is not a payload config")
        if meta.get("use_pickle") is not False or not pattern.match(
            prefix + str(meta.get("path_name"))
        ):
            raise ModelError(
                f"{where}: {str(key)[:80]!r} is a pickled object, not a tensor: refused, "
                "loading it could run code"
            )


def _check_sample_inputs(where: str, raw: bytes) -> None:
    """The sample inputs, read as torch reads them first (``weights_only``): torch would try
    again with any pickle allowed, so what fails here is refused."""
    if not raw:
        return
    import torch

    try:
        torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:200]
        raise ModelError(
            f"{where}'s sample inputs need a pickle of more than tensors ({reason}): refused, "
            "loading them could run code"
        ) from None
