"""The job spec: a pydantic model plus YAML loading whose errors name the field and the line.

A spec is written by users as YAML (see ``examples/digits/trainhouse.yaml``); ``--set key=value``
overrides any field by dotted path before validation. The JSON Schema is published by
``trainhouse spec --schema``.

Specs arrive over HTTP, so every part is bounded: the text (``MAX_SPEC_BYTES``), its nesting
(``MAX_SPEC_DEPTH``; YAML aliases are refused outright, so no alias bomb can expand), the
hparams as JSON (``MAX_HPARAMS_BYTES``), the env (``MAX_ENV_VARS`` variables, names up to
``MAX_ENV_NAME`` and values up to ``MAX_ENV_VALUE`` characters), the entrypoint
(``MAX_ENTRYPOINT``) and every other string field.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainhouse.core.defaults import DEFAULT_KEEP_LAST
from trainhouse.core.errors import SpecError
from trainhouse.core.searchspec import SearchSpec, check_search, distributions

__all__ = [
    "DEFAULT_NO_RESTART_EXIT_CODES",
    "DEFAULT_NO_RESTART_PATTERNS",
    "MAX_ENTRYPOINT",
    "MAX_ENV_NAME",
    "MAX_ENV_VALUE",
    "MAX_ENV_VARS",
    "MAX_HPARAMS_BYTES",
    "MAX_METRIC_NAME",
    "MAX_RUNTIME",
    "MAX_SPEC_BYTES",
    "MAX_SPEC_DEPTH",
    "MAX_TAGS",
    "MAX_WORKDIR",
    "PRIORITY_TIERS",
    "RESERVED_ENV",
    "TAG",
    "CheckpointPolicy",
    "Environment",
    "JobSpec",
    "NoRestart",
    "Priority",
    "Resources",
    "apply_overrides",
    "check_tags",
    "json_schema",
    "load_spec",
    "parse_duration",
    "parse_override",
    "parse_spec",
    "tier_rank",
]

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


class Resources(_Strict):
    nodes: int = Field(
        1, ge=1, le=4096, description="Machines the job spans; >1 needs a multi-node executor"
    )
    procs_per_node: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="torch.distributed ranks per node; default gpus_per_node or 1",
    )
    gpus_per_node: int = Field(0, ge=0, le=1024, description="GPUs per node; 0 = CPU job")
    cpus_per_proc: int = Field(1, ge=1, le=4096, description="CPU cores reserved for each rank")

    @model_validator(mode="after")
    def _default_procs(self) -> Resources:
        if self.procs_per_node is None:
            object.__setattr__(self, "procs_per_node", max(self.gpus_per_node, 1))
        elif 0 < self.gpus_per_node < self.procs_per_node:
            # each rank of a GPU job takes a GPU of its own (run.device): two ranks on one GPU
            # fail under NCCL ("Duplicate GPU detected"); no sharing mode is offered
            raise ValueError(
                f"has procs_per_node ({self.procs_per_node}) more than gpus_per_node "
                f"({self.gpus_per_node}): each rank of a GPU job gets a GPU of its own; ask for "
                f"gpus_per_node: {self.procs_per_node} or procs_per_node: {self.gpus_per_node}"
            )
        return self

    @property
    def procs(self) -> int:
        """Ranks per node, with the default applied."""
        return self.procs_per_node or max(self.gpus_per_node, 1)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs

    @property
    def cpus_per_node(self) -> int:
        return self.procs * self.cpus_per_proc


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
        pattern=r"^[A-Za-z0-9][\w.\-]*$",
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

    @field_validator("max_runtime", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
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


# ---------------------------------------------------------------------------------------------
# YAML loading with line numbers


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


# libyaml's parser when PyYAML has it: a spec of the maximum size is scanned several times faster
_FastLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _prescan(text: str) -> None:
    """Refuse aliases and deep nesting from the event stream, before any node is built: an
    alias bomb never expands, and nesting cannot exhaust the recursive composer (or the C
    stack under libyaml's)."""
    depth = 0
    for event in yaml.parse(text, Loader=_FastLoader):
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", mark
            )
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_SPEC_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"mappings and lists nest deeper than {MAX_SPEC_DEPTH} levels here; a job "
                    f"spec may nest at most {MAX_SPEC_DEPTH}",
                    mark,
                )
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML without aliases: a job spec needs none, and nested aliases can expand a few
    hundred bytes into gigabytes. (``parse_spec`` also refuses them in ``_prescan``; this loader
    reads ``--set`` values.)"""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed in a job spec", event.start_mark
            )
        node: yaml.Node | None = super().compose_node(parent, index)
        return node


class _Lines:
    """Maps a path of keys in a YAML document to the line it was written on."""

    def __init__(self, node: yaml.Node | None) -> None:
        self.root = node

    def line(self, loc: tuple[str | int, ...]) -> int | None:
        node = self.root
        best: int | None = node.start_mark.line + 1 if node is not None else None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                for key, val in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                        best = key.start_mark.line + 1
                        node = val
                        break
                else:
                    return best
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if part >= len(node.value):
                    return best
                node = node.value[part]
                best = node.start_mark.line + 1
            else:
                return best
        return best


def _first_duplicate_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """A key written twice in one mapping (YAML keeps the last silently): (key, line, line)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    return key.value, seen[key.value], line
                seen[key.value] = line
            found = _first_duplicate_key(value)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found = _first_duplicate_key(item)
            if found:
                return found
    return None


def _format_errors(exc: ValidationError, source: str, lines: _Lines, overridden: set[str]) -> str:
    messages = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function"))
        field = ".".join(str(p) for p in loc) or "(spec)"
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {field!r}"
            allowed = _allowed_keys(loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
            if close:
                msg += f"; did you mean {close[0]!r}?"
            if allowed:
                msg += f" (allowed: {', '.join(allowed)})"
        else:
            text = str(err["msg"])
            text = text.removeprefix("Value error, ")
            if field == "(spec)" or text.startswith(f"{field}."):
                msg = text  # a rule across fields: its text names them
            elif err["type"] == "missing":
                msg = f"{field} is required"
            else:
                got = err.get("input")
                show = (
                    "" if isinstance(got, dict | list) or "got " in text else f", got {_show(got)}"
                )
                msg = f"{field} {_lower_first(text)}{show}"
        where = f"{source}:{lines.line(loc)}" if lines.root is not None else source
        if field in overridden or any(t.startswith(f"{field}.") for t in overridden):
            where = f"--set {field}"
        messages.append(f"{where}: {msg}")
    return "\n".join(messages)


def _lower_first(text: str) -> str:
    text = text.replace("Input should be", "must be").replace("String should", "must")
    return text[:1].lower() + text[1:]


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: type[BaseModel] = JobSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return sorted(model.model_fields)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` into (["a", "b"], parsed value); the value is read as YAML."""
    if "=" not in item:
        raise SpecError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".")]
    if not key.strip() or any(not p for p in path):
        raise SpecError(f"--set key must be a dotted path such as hparams.lr, got {key!r}")
    try:
        if raw.strip():
            _prescan(raw)  # no aliases, bounded nesting: as in a spec
            value = yaml.load(raw, Loader=_SpecLoader)
        else:
            value = ""
    except (yaml.YAMLError, ValueError, OverflowError):
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> set[str]:
    """Apply ``--set`` overrides in place; returns the dotted keys that were set."""
    touched = set()
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                where = ".".join(path[: i + 1])
                raise SpecError(f"--set {'.'.join(path)}: {where} is not a mapping")
            node = nxt
        node[path[-1]] = value
        touched.add(".".join(path))
    return touched


def parse_spec(text: str, *, source: str = "<spec>", overrides: list[str] | None = None) -> JobSpec:
    """Parse and validate YAML (or JSON) text into a JobSpec, or raise SpecError."""
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
        raise SpecError(
            f"{source}: a job spec may be at most {MAX_SPEC_BYTES // 1024} KiB "
            f"({MAX_SPEC_BYTES} bytes), got {size} bytes; keep data in the workdir"
        )
    try:
        _prescan(text)
        loader = _FastLoader(text)  # a safe loader: plain data only
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{where}: not valid YAML: {problem}") from None
    except (ValueError, OverflowError) as exc:  # an integer of 5000 digits, a 13th month
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    duplicate = _first_duplicate_key(node)
    if duplicate is not None:
        key, first, second = duplicate
        raise SpecError(f"{source}:{second}: key {key!r} is given twice (first on line {first})")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a job spec must be a mapping of keys, got {type(data).__name__}"
        )
    touched = apply_overrides(data, overrides or [])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, source, _Lines(node), touched)) from None


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Load a spec file; errors name the file, the line and the field."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(
                f"spec file {path} is {path.stat().st_size} bytes; a job spec may be at most "
                f"{MAX_SPEC_BYTES // 1024} KiB ({MAX_SPEC_BYTES} bytes)"
            )
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read spec file {path}: {exc}") from None
    return parse_spec(text, source=str(path), overrides=overrides)


def json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
