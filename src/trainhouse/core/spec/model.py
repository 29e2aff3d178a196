"""The job spec's model: a pydantic ``JobSpec`` with its parts (``Resources``,
``CheckpointPolicy``, ``NoRestart``, ``Environment``) and the bounds on every field (a spec
arrives over HTTP). Reading one from YAML text is :mod:`.text`."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainhouse.core.datasets import MAX_PINS, check_key, parse_ref
from trainhouse.core.defaults import DEFAULT_KEEP_LAST
from trainhouse.core.errors import DatasetError, FlowError, ModelError
from trainhouse.core.flows import MAX_AFTER, MAX_INPUTS, check_input_key, check_input_ref
from trainhouse.core.searchspec import SearchSpec, check_search, distributions
from trainhouse.core.spec.resources import Resources as Resources

PRIORITY_TIERS: tuple[str, ...] = ("low", "normal", "high", "urgent")
Priority = Literal["low", "normal", "high", "urgent"]
_TIER_RANK = {tier: rank for rank, tier in enumerate(PRIORITY_TIERS)}


def tier_rank(priority: str) -> int:
    """0 for ``low`` up to 3 for ``urgent``."""
    return _TIER_RANK[priority]


# bounds on what a spec may hold (docs/security.md lists them)
MAX_SPEC_BYTES = 256 * 1024  # the YAML or JSON text, UTF-8
MAX_SPEC_DEPTH = 32  # nested mappings and lists
MAX_TAGS = 32
PROJECT_PATTERN = r"^[A-Za-z0-9][\w.\-]*$"  # a project's name (at most 128 characters)
TAG = re.compile(r"^[A-Za-z0-9][\w.\-]{0,63}$", re.ASCII)
MAX_HPARAMS_BYTES = 64 * 1024  # hparams serialized as JSON (passed to ranks in the environment)
MAX_ENV_VARS = 256
MAX_ENV_NAME = 128  # characters in a variable's name
MAX_ENV_VALUE = 16 * 1024  # characters in a variable's value
MAX_ENTRYPOINT = 4096  # characters in the command line
MAX_WORKDIR = 1024  # characters in the workdir path
MAX_METRIC_NAME = 256  # checkpoints.metric: as long as a metric name may be
MAX_RUNTIME = 366 * 86400  # seconds

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables trainhouse or torchrun set for every rank; a spec may not override them.
RESERVED_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    }
)


def parse_duration(value: str | int | float) -> int:
    """Parse ``90``, ``"90s"``, ``"30m"``, ``"6h"`` or ``"1d"`` into whole seconds."""
    if isinstance(value, bool):
        raise ValueError(f"must be a duration such as 90s, 30m or 6h, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError(f"must be a finite duration, got {value!r}")
    else:
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"must be a duration such as 90s, 30m or 6h, got {value!r}")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"must be a positive duration, got {value!r}")
    return round(seconds)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CheckpointPolicy(_Strict):
    keep_last: int = Field(DEFAULT_KEEP_LAST, ge=1, description="Newest checkpoints kept")
    keep_best: int = Field(0, ge=0, description="Best checkpoints kept by `metric`")
    metric: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_METRIC_NAME,
        description="Metric that ranks checkpoints for keep_best",
    )
    mode: Literal["min", "max"] = "min"

    @model_validator(mode="after")
    def _metric_needed(self) -> CheckpointPolicy:
        if self.keep_best > 0 and not self.metric:
            raise ValueError("keep_best > 0 needs checkpoints.metric (e.g. val_loss)")
        return self


# failures that restarting cannot fix: the job fails at once instead of using up its restarts
DEFAULT_NO_RESTART_PATTERNS = (
    r"SyntaxError",
    r"IndentationError",
    r"ModuleNotFoundError",
    r"ImportError",
    r"CUDA out of memory",
    r"OutOfMemoryError",
    r"No space left on device",
)
DEFAULT_NO_RESTART_EXIT_CODES = (2, 126, 127)  # usage errors, not executable, command not found


class NoRestart(_Strict):
    """When a failed attempt is not restarted, whatever ``max_restarts`` allows."""

    log_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_NO_RESTART_PATTERNS),
        max_length=100,
        description="Regular expressions searched in the last lines of the failing rank's log "
        "(replaces the defaults; list them again to extend)",
    )
    exit_codes: list[int] = Field(
        default_factory=lambda: list(DEFAULT_NO_RESTART_EXIT_CODES),
        max_length=100,
        description="Exit codes of the failing rank that are never retried",
    )

    @field_validator("log_patterns")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or len(pattern) > 500:
                raise ValueError("a log pattern must have 1 to 500 characters")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"log pattern {pattern!r} is not a regular expression: {exc}"
                ) from None
        return value


MAX_ENV_PACKAGES = 200  # inline requirements in environment.packages
MAX_REQUIREMENT = 512  # characters in one requirement, index URL or find-links entry
MAX_INDEX_URLS = 16  # extra_index_urls and find_links, each


def _relative_file(value: str) -> str:
    """A path inside the workdir: relative, no ``..``, no NUL."""
    if not value or len(value) > MAX_WORKDIR:
        raise ValueError(f"must be a path of 1 to {MAX_WORKDIR} characters")
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    path = Path(value)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"must be a path inside the workdir, got {value!r}")
    return value


def _option_value(value: str, what: str) -> str:
    """One requirement, URL or path handed to uv: bounded, one line, never an option."""
    if not value or len(value) > MAX_REQUIREMENT:
        raise ValueError(f"{what} must have 1 to {MAX_REQUIREMENT} characters, got {value!r}")
    if any(c in value for c in "\x00\r\n"):
        raise ValueError(f"{what} must be one line, got {value!r}")
    if value.lstrip().startswith("-"):
        raise ValueError(f"{what} must not be an option, got {value!r}")
    return value


def _url(value: str, what: str, *, paths: bool) -> str:
    _option_value(value, what)
    if "://" in value:
        if not value.startswith(("http://", "https://", "file://")):
            raise ValueError(f"{what} must be an http(s):// or file:// URL, got {value!r}")
    elif not paths:
        raise ValueError(f"{what} must be an http(s):// or file:// URL, got {value!r}")
    return value


class Environment(_Strict):
    """The job's own Python dependencies: a virtual environment built with uv on top of the
    server's Python (torch and trainhouse are the server's), once per node, cached by digest."""

    requirements: str | None = Field(
        None, description="A requirements file in the workdir (its -r and -c files included)"
    )
    pyproject: str | None = Field(
        None,
        description="A pyproject.toml in the workdir: its dependencies (as pinned by the uv.lock "
        "beside it, if there is one)",
    )
    packages: list[str] = Field(
        default_factory=list,
        max_length=MAX_ENV_PACKAGES,
        description="Requirements inline, such as tabulate==0.9.0",
    )
    index_url: str | None = Field(
        None, description="The package index (default: the server's --env-index-url, else PyPI)"
    )
    extra_index_urls: list[str] | None = Field(
        None, max_length=MAX_INDEX_URLS, description="More indexes (default: the server's)"
    )
    find_links: list[str] | None = Field(
        None,
        max_length=MAX_INDEX_URLS,
        description="Directories (absolute or in the workdir) or URLs of wheels "
        "(default: the server's)",
    )

    @field_validator("requirements", "pyproject")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        return None if value is None else _relative_file(value)

    @field_validator("packages")
    @classmethod
    def _packages(cls, value: list[str]) -> list[str]:
        return [_option_value(v, "a package") for v in value]

    @field_validator("index_url")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        return None if value is None else _url(value, "the index URL", paths=False)

    @field_validator("extra_index_urls")
    @classmethod
    def _extra(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_url(v, "an index URL", paths=False) for v in value]

    @field_validator("find_links")
    @classmethod
    def _links(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_url(v, "a find-links entry", paths=True) for v in value]

    @model_validator(mode="after")
    def _one_source(self) -> Environment:
        given = [n for n in ("requirements", "pyproject") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError("give requirements or pyproject, not both")
        if not given and not self.packages:
            raise ValueError("needs requirements, pyproject or packages")
        if self.pyproject is not None and Path(self.pyproject).name != "pyproject.toml":
            raise ValueError(f"pyproject must name a pyproject.toml, got {self.pyproject!r}")
        return self


class After(_Strict):
    """A job this one waits for: until it COMPLETED (``when: completed``, the default), or
    until it ended in any way (``when: ended``)."""

    job: int = Field(..., ge=1, lt=2**63, description="The job's id")
    when: Literal["completed", "ended"] = Field(
        "completed", description="completed: it must complete; ended: any end will do"
    )


class Promote(_Strict):
    """When the job completes, move ``alias`` to the model version it registered (or, with
    ``input``, the version it read under that key) if ``metric`` beats the version the alias
    names now; the decision is recorded either way."""

    alias: str = Field(..., min_length=1, max_length=64, description="The alias: champion")
    metric: str = Field(
        ..., min_length=1, max_length=MAX_METRIC_NAME, description="The metric compared: val_acc"
    )
    mode: Literal["min", "max"] = Field("max", description="max: higher is better")
    model: str | None = Field(
        None, description="The model whose version is promoted, when the job saves several"
    )
    input: str | None = Field(
        None,
        description="Promote the version the job read under this inputs key (an evaluation "
        "step promoting the candidate it measured), with the job's own value of the metric",
    )

    @model_validator(mode="after")
    def _names(self) -> Promote:
        try:
            from trainhouse.core.modelfiles import check_name

            check_name(self.alias, "an alias")
            if self.alias.isdigit() or self.alias == "latest":
                raise ValueError(f"alias {self.alias!r}: a number or 'latest' names a version")
            if self.model is not None:
                check_name(self.model)
        except ModelError as exc:
            raise ValueError(str(exc)) from None
        if self.model is not None and self.input is not None:
            raise ValueError("give model or input, not both")
        return self


class JobSpec(_Strict):
    """A training job: what to run, where its code is, and what it needs."""

    name: str = Field("job", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][\w.\-]*$")
    entrypoint: str = Field(..., min_length=1, description="Command run inside the workdir")
    workdir: str = Field(
        ".",
        min_length=1,
        max_length=MAX_WORKDIR,
        description="Directory packed and uploaded, relative to the spec",
    )
    project: str = Field(
        "default",
        min_length=1,
        max_length=128,
        pattern=PROJECT_PATTERN,
        description="The project the job belongs to (the runs table filters by it)",
    )
    tags: list[str] = Field(
        default_factory=list,
        max_length=MAX_TAGS,
        description=f"Labels for the runs table (at most {MAX_TAGS}; letters, digits, . _ -)",
    )
    resources: Resources = Field(default_factory=lambda: Resources())
    priority: Priority = "normal"
    max_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="Restarts from the latest checkpoint after the job's code fails "
        "(infrastructure failures, such as a killed rank, are counted apart)",
    )
    no_restart_on: NoRestart = Field(default_factory=lambda: NoRestart())
    max_runtime: int | None = Field(
        None, description="Seconds (or a duration such as 6h) after which the job is stopped"
    )
    preemption_grace: int = Field(120, ge=0, le=86400)
    resize_interval: int = Field(
        300,
        description="Seconds (or a duration such as 5m) an elastic job runs at one size before "
        "the scheduler may resize it again (a shrink for a job of higher priority is not held "
        "by it)",
    )
    hparams: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Plain JSON values, at most {MAX_HPARAMS_BYTES // 1024} KiB as JSON",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description=f"Environment variables for every rank (at most {MAX_ENV_VARS})",
    )
    checkpoints: CheckpointPolicy = Field(default_factory=lambda: CheckpointPolicy())
    environment: Environment | None = Field(
        None, description="The job's own Python dependencies (built once per node with uv)"
    )
    datasets: dict[str, str] = Field(
        default_factory=dict,
        description="Dataset versions the job reads, by key: {train: digits@2, val: digits-val} "
        "(a bare name is the newest version at submit, pinned then). Every rank gets "
        "TRAINHOUSE_DATASET_<KEY>, the path of a verified read-only copy on its node "
        "(run.datasets[key])",
    )
    after: list[After] = Field(
        default_factory=list,
        max_length=MAX_AFTER,
        description="Jobs this one waits for: [12, 15] (each must COMPLETE) or "
        "[{job: 12, when: ended}] (any end will do). A job it waits for that can no longer "
        "satisfy it (failed, canceled, deleted) ends this one CANCELED",
    )
    inputs: dict[str, str] = Field(
        default_factory=dict,
        description="Models the job reads, by key: {candidate: job:31} (the version job 31 "
        "saved last) or {baseline: digits-cnn@champion} (a registered version), resolved when "
        "the job starts. Every rank gets TRAINHOUSE_INPUT_<KEY>, the path of a verified "
        "read-only copy on its node (run.inputs[key]), loadable with trainhouse.sdk.load_model",
    )
    promote: Promote | None = Field(
        None,
        description="{alias: champion, metric: val_acc, mode: max}: when the job completes, "
        "the version it registered gets the alias if its metric beats the version that "
        "holds it now",
    )
    search: SearchSpec | None = Field(
        None,
        description="A hyperparameter search: hparams leaves may be distributions "
        "({log_uniform: [a, b]}, {uniform: [a, b]}, {int: [a, b]}, {choice: [...]}) and each "
        "trial is a job with values sampled from them",
    )

    @model_validator(mode="after")
    def _search(self) -> JobSpec:
        check_search(self.search, self.hparams)
        return self

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        out = [
            {"job": item} if isinstance(item, int) and not isinstance(item, bool) else item
            for item in value
        ]
        seen: set[Any] = set()
        for item in out:
            job = item.get("job") if isinstance(item, dict) else None
            if job is not None and job in seen:
                raise ValueError(f"job {job} is named twice")
            seen.add(job)
        return out

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: dict[str, str]) -> dict[str, str]:
        return _refs(value, MAX_INPUTS, "inputs", check_input_key, check_input_ref, FlowError)

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, value: dict[str, str]) -> dict[str, str]:
        return _refs(value, MAX_PINS, "datasets", check_key, parse_ref, DatasetError)

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        seconds = parse_duration(value)
        if seconds > MAX_RUNTIME:
            raise ValueError(f"must be at most 366 days ({MAX_RUNTIME} s), got {value!r}")
        return seconds

    @field_validator("resize_interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> Any:
        if value == 0:
            return 0  # resizes as soon as they help (tests, simulations)
        seconds = parse_duration(value)
        if seconds > MAX_RUNTIME:
            raise ValueError(f"must be at most 366 days ({MAX_RUNTIME} s), got {value!r}")
        return seconds

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str) -> str:
        if len(value) > MAX_ENTRYPOINT:
            raise ValueError(f"must be at most {MAX_ENTRYPOINT} characters, got {len(value)}")
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into arguments ({exc}): {value!r}") from None
        if not argv:
            raise ValueError("must name a command, got an empty string")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if len(value) > MAX_ENV_VARS:
            raise ValueError(f"must have at most {MAX_ENV_VARS} variables, got {len(value)}")
        out: dict[str, str] = {}
        for key, val in value.items():
            key = str(key)
            if len(key) > MAX_ENV_NAME:
                raise ValueError(
                    f"variable name {_show(key)} must be at most {MAX_ENV_NAME} characters, "
                    f"got {len(key)}"
                )
            if not _ENV_NAME.match(key):
                raise ValueError(f"variable name {key!r} is not a valid environment name")
            if key in RESERVED_ENV or key.startswith("TRAINHOUSE_"):
                raise ValueError(f"variable {key} is set by trainhouse and cannot be overridden")
            if isinstance(val, dict | list) or val is None:
                raise ValueError(f"value of {key} must be a string or number, got {val!r}")
            text = str(val).lower() if isinstance(val, bool) else str(val)
            if len(text) > MAX_ENV_VALUE:
                raise ValueError(
                    f"value of {key} must be at most {MAX_ENV_VALUE} characters, got {len(text)}"
                )
            if "\x00" in text:
                raise ValueError(f"value of {key} must not contain a NUL character")
            out[key] = text
        return out

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[str]) -> list[str]:
        return check_tags(value)

    @field_validator("hparams")
    @classmethod
    def _hparams_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            encoded = json.dumps(value, allow_nan=False)  # ASCII: one byte per character
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"must be plain JSON values ({exc})") from None
        if len(encoded) > MAX_HPARAMS_BYTES:
            raise ValueError(
                f"must be at most {MAX_HPARAMS_BYTES // 1024} KiB as JSON, got {len(encoded)} "
                "bytes; put large values in files in the workdir"
            )
        distributions(value)  # a malformed distribution leaf is refused, by its name
        return value

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.entrypoint)

    def script_path(self) -> str | None:
        """The file the entrypoint runs, when it names one (``python train.py`` -> train.py)."""
        argv = self.argv
        if Path(argv[0]).name.startswith("python"):
            rest = argv[1:]
            while rest and rest[0].startswith("-"):
                if rest[0] in ("-m", "-c"):
                    return None
                rest = rest[1:]
            return rest[0] if rest else None
        if argv[0].startswith("./") or argv[0].endswith((".py", ".sh")):
            return argv[0]
        return None


def check_reported_hparams(hparams: Any) -> None:
    """The hparams a run reports using (``run.set_hparams``, MLflow params merged in): plain
    JSON values, at most :data:`MAX_HPARAMS_BYTES` as JSON, one cap whichever way they came;
    ValueError naming the rule and the size."""
    try:
        size = len(json.dumps(hparams, allow_nan=False, default=str))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"hparams must be plain JSON values ({e})") from None
    if size > MAX_HPARAMS_BYTES:
        raise ValueError(
            f"hparams must be at most {MAX_HPARAMS_BYTES // 1024} KiB as JSON, got {size} bytes"
        )


def _refs(
    value: dict[str, str],
    most: int,
    what: str,
    key_rule: Callable[[str], object],
    ref_rule: Callable[[str], object],
    error: type[Exception],
) -> dict[str, str]:
    """A mapping of keys to references (``datasets:``, ``inputs:``): at most ``most``, each key
    and reference checked by its rule (whose ``error`` is turned into pydantic's ValueError)."""
    if len(value) > most:
        raise ValueError(f"at most {most} {what}, got {len(value)}")
    try:
        for key, ref in value.items():
            key_rule(key)
            ref_rule(ref)
    except error as exc:
        raise ValueError(str(exc)) from None
    return value


def check_tags(tags: list[str]) -> list[str]:
    """``tags`` checked (each matches ``TAG``), without repeats, in order."""
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not TAG.match(tag):
            raise ValueError(
                f"tag {_show(tag)} must be 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ValueError(f"a job has at most {MAX_TAGS} tags, got {len(out)}")
    return out


def _show(value: Any) -> str:
    """A value for a message: its repr, cut short when long."""
    shown = repr(value)
    if len(shown) <= 80:
        return shown
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{shown[:60]}...{size}"
