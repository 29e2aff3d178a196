"""The client's typed records (:mod:`trainhouse.client.records`) mirror the server's response
models field for field: each record names its model in its docstring (````JobOut``: ...``), and
this test fails when either side gains, loses or renames a field without the other.

It also pins what makes the client cheap to import: ``import trainhouse.client`` loads neither
pydantic, nor torch, nor the server's or the store's code (``trainhouse ps`` starts fast)."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

import trainhouse.server
from trainhouse.client import records

MODEL_NAME = re.compile(r"^``(\w+)``")


def _response_models() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(trainhouse.server.__path__, "trainhouse.server."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                found.setdefault(value.__name__, value)
    return found


MODELS = _response_models()
RECORDS = [getattr(records, name) for name in records.__all__]


def _wire_keys(model: type[BaseModel]) -> set[str]:
    return {f.serialization_alias or f.alias or name for name, f in model.model_fields.items()}


def _model_of(record: Any) -> type[BaseModel]:
    match = MODEL_NAME.search(record.__doc__ or "")
    assert match, f"{record.__name__}'s docstring names no response model (``JobOut``: ...)"
    assert match.group(1) in MODELS, f"{record.__name__}: no response model {match.group(1)}"
    return MODELS[match.group(1)]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_each_record_has_its_models_fields(record: Any) -> None:
    model = _model_of(record)
    keys = set(record.__required_keys__) | set(record.__optional_keys__)
    wire = _wire_keys(model)
    assert keys == wire, (
        f"{record.__name__} and {model.__name__} differ: only in the record "
        f"{sorted(keys - wire)}, only in the model {sorted(wire - keys)}"
    )


def test_every_response_model_the_client_reads_has_a_record() -> None:
    named = {_model_of(r).__name__ for r in RECORDS}
    # the models a client call returns; the rest are request bodies or other clients' shapes
    # (the MLflow protocol's, the dashboard's)
    assert len(named) == len(RECORDS), "two records name one model"
    for name in ("JobOut", "JobDetailOut", "SearchOut", "ServiceOut", "ModelOut", "QueueOut"):
        assert name in named


def test_the_check_sees_a_drifted_record() -> None:
    from typing import TypedDict

    class Drifted(TypedDict):
        """``EventOut``: with one field renamed."""

        at: float
        from_state: str | None
        state: str
        reason: str | None

    with pytest.raises(AssertionError, match=r"only in the record \['state'\]"):
        test_each_record_has_its_models_fields(Drifted)


def test_importing_the_client_loads_no_server_code() -> None:
    probe = (
        "import sys, trainhouse.client, trainhouse.client.records\n"
        "heavy = ('pydantic', 'torch', 'fastapi', 'sqlalchemy', 'yaml', 'trainhouse.server', "
        "'trainhouse.store', 'trainhouse.scheduler', 'trainhouse.usecases')\n"
        "print(sorted({m for m in sys.modules if m.startswith(heavy)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
