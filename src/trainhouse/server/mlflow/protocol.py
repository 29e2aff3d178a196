"""MLflow's REST protocol as trainhouse speaks it: the error shape, reading request fields as
the mlflow client writes them (protobuf JSON: an int64 may be a string, a double may be
``"NaN"`` or ``"Infinity"``), MLflow's limits, and the shapes of experiments and runs.

Everything a request carries is checked here with a 400 ``INVALID_PARAMETER_VALUE`` that names
the field; nothing a client sends reaches the store unchecked.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import orjson

from trainhouse.core.errors import (
    AlreadyExists,
    BodyTooLarge,
    Forbidden,
    MlflowError,
    NotFound,
    RateLimited,
    ServerBusy,
    TrainhouseError,
    Unauthorized,
)
from trainhouse.core.records import Job
from trainhouse.usecases.tracking import (
    ArtifactTooLarge,
    Experiment,
    MlflowRun,
    RunView,
)

# MLflow's own limits (mlflow/utils/validation.py, 3.x)
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_ENTITY_KEY_LENGTH = 250
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_RUN_NAME_LENGTH = 250
INT64 = 2**63 - 1


def invalid(message: str) -> MlflowError:
    return MlflowError(400, "INVALID_PARAMETER_VALUE", message)


def missing(message: str) -> MlflowError:
    return MlflowError(404, "RESOURCE_DOES_NOT_EXIST", message)


def from_trainhouse(exc: TrainhouseError) -> MlflowError:
    """A trainhouse error as MLflow's client reads one (its codes decide what it retries:
    only 429 and 5xx, so every refusal here is a 4xx)."""
    message = str(exc)
    if isinstance(exc, NotFound):
        return missing(message)
    if isinstance(exc, AlreadyExists):
        return MlflowError(400, "RESOURCE_ALREADY_EXISTS", message)
    if isinstance(exc, Unauthorized):
        return MlflowError(401, "UNAUTHENTICATED", message)
    if isinstance(exc, Forbidden):
        return MlflowError(403, "PERMISSION_DENIED", message)
    if isinstance(exc, RateLimited):
        return MlflowError(429, "REQUEST_LIMIT_EXCEEDED", message)
    if isinstance(exc, ServerBusy):
        return MlflowError(503, "TEMPORARILY_UNAVAILABLE", message)
    if isinstance(exc, BodyTooLarge | ArtifactTooLarge):
        return MlflowError(413, "INVALID_PARAMETER_VALUE", message)
    return MlflowError(400, "INVALID_PARAMETER_VALUE", message)  # MLflow's status for it


# -- reading a request -----------------------------------------------------------------------
def body_of(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MlflowError(400, "MALFORMED_REQUEST", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MlflowError(400, "MALFORMED_REQUEST", "the body must be a JSON object")
    return data


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def text(
    data: dict[str, Any], key: str, *, limit: int, required: bool = True, empty: bool = False
) -> str | None:
    """The string field ``key`` (up to ``limit`` characters, no NUL)."""
    value = data.get(key)
    if value is None:
        if required:
            raise invalid(f"Missing value for required parameter '{key}'")
        return None
    if not isinstance(value, str):
        raise invalid(f"Invalid value {_show(value)} for parameter '{key}': must be a string")
    if len(value) > limit:
        raise invalid(
            f"Invalid value for parameter '{key}': at most {limit} characters, got {len(value)}"
        )
    if "\x00" in value:
        raise invalid(f"Invalid value for parameter '{key}': must not contain a NUL character")
    if not value and not empty and required:
        raise invalid(f"Missing value for required parameter '{key}'")
    return value


def key_of(data: dict[str, Any], what: str = "key") -> str:
    """A metric, param or tag name: MLflow's key rules (no ``..``, no leading ``/``)."""
    key = text(data, what, limit=MAX_ENTITY_KEY_LENGTH)
    assert key is not None
    if key.startswith("/") or ".." in key.split("/"):
        raise invalid(f"Invalid value {_show(key)} for parameter '{what}': not a valid name")
    return key


def int64(data: dict[str, Any], key: str, *, default: int | None = None, low: int = 0) -> int:
    """An int64 field: a JSON integer, or a string of one (protobuf JSON writes int64 so)."""
    value = data.get(key)
    if value is None or value == "":
        if default is None:
            raise invalid(f"Missing value for required parameter '{key}'")
        return default
    if isinstance(value, str) and len(value) <= 21:
        with contextlib.suppress(ValueError):
            value = int(value)
    if type(value) is not int or not low <= value <= INT64:
        raise invalid(
            f"Invalid value {_show(value)} for parameter '{key}': must be an integer from "
            f"{low} to {INT64}"
        )
    return value


_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def double(data: dict[str, Any], key: str) -> float | None:
    """A double field: a JSON number or ``"NaN"``/``"Infinity"``/``"-Infinity"`` (protobuf
    JSON); None for one that is not finite (stored as such, answered as ``"NaN"``)."""
    value = data.get(key)
    if isinstance(value, str) and value in _SPECIAL:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(f"Invalid value {_show(value)} for parameter '{key}': must be a number")
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def run_id(data: dict[str, Any]) -> int:
    """The run a request names (``run_id``, or the older ``run_uuid``): a job's id."""
    value = data.get("run_id") or data.get("run_uuid")
    if value is None:
        raise invalid("Missing value for required parameter 'run_id'")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    raise missing(f"Run with id={_show(value)} not found")


def experiment_id(value: Any, key: str = "experiment_id") -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)
    if value is None:
        raise invalid(f"Missing value for required parameter '{key}'")
    raise missing(f"No Experiment with id={_show(value)} exists")


def entries(data: dict[str, Any], key: str, limit: int) -> list[dict[str, Any]]:
    """The list field ``key`` of objects (absent: empty), at most ``limit`` of them."""
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise invalid(f"Invalid value for parameter '{key}': must be a list of objects")
    if len(value) > limit:
        raise invalid(
            f"A batch logging request can contain at most {limit} {key}. Got {len(value)} {key}."
        )
    return value


def key_values(items: list[dict[str, Any]], limit: int, what: str) -> dict[str, str]:
    """``[{"key", "value"}]`` as a dict (the last of a key wins); a value over ``limit``
    characters is refused, naming the key."""
    out: dict[str, str] = {}
    for item in items:
        key = key_of(item)
        value = item.get("value", "")
        if not isinstance(value, str):
            value = orjson.dumps(value).decode() if value is not None else ""
        if len(value) > limit:
            raise invalid(
                f"{what} '{key}' had length {len(value)}, which exceeded length limit of {limit}"
            )
        if "\x00" in value:
            raise invalid(f"{what} '{key}' must not contain a NUL character")
        out[key] = value
    return out


# -- answers ---------------------------------------------------------------------------------
def experiment_json(exp: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": str(exp.id),
        "name": exp.name,
        "artifact_location": f"mlflow-artifacts:/experiments/{exp.id}",
        "lifecycle_stage": "active",
        "creation_time": int(exp.created_at * 1000),
        "last_update_time": int(exp.created_at * 1000),
        "tags": [],
    }


def run_info(job: Job, run: MlflowRun) -> dict[str, Any]:
    info: dict[str, Any] = {
        "run_id": str(job.id),
        "run_uuid": str(job.id),
        "run_name": run.run_name,
        "experiment_id": str(run.experiment_id),
        "user_id": run.user_id,
        "status": run.status,
        "start_time": run.start_time,
        "artifact_uri": f"mlflow-artifacts:/runs/{job.id}",
        "lifecycle_stage": "active",
    }
    if run.end_time is not None:
        info["end_time"] = run.end_time
    return info


def value_out(value: float | None) -> float | str:
    return "NaN" if value is None else value


def run_json(view: RunView) -> dict[str, Any]:
    """A run as ``runs/get`` answers it: its info, its latest metrics (each at its own
    latest step, stamped with the job's update time), params and tags."""
    job = view.job
    metrics = [
        {
            "key": name,
            "value": value_out(value),
            "timestamp": int(job.updated_at * 1000),
            "step": view.steps.get(name, job.last_step or 0),
        }
        for name, value in sorted(job.latest_metrics.items())
    ]
    return {
        "info": run_info(job, view.run),
        "data": {"metrics": metrics, "params": pairs(view.params), "tags": pairs(view.tags)},
        "inputs": {},
    }


def history_json(key: str, points: list[tuple[int, float | None, float]]) -> list[dict[str, Any]]:
    return [
        {"key": key, "value": value_out(v), "timestamp": int(w * 1000), "step": s}
        for s, v, w in points
    ]


def pairs(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": k, "value": v} for k, v in values.items()]
