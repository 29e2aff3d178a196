"""A search's part of the job spec: the ``search:`` block and the distributions ``hparams`` may
hold as leaves.

A leaf of ``hparams`` that is a mapping with exactly one of these keys is a distribution; any
other value stays fixed for every trial::

    lr: {log_uniform: [1.0e-4, 1.0e-1]}   # float, sampled on a log scale
    dropout: {uniform: [0.0, 0.5]}         # float
    width: {int: [16, 256]}                # integer, both ends included
    optimizer: {choice: [adam, sgd]}       # one of the listed plain values

Parameters are named by their dotted path in ``hparams`` (``model.width``). Errors name the
field (``hparams.lr``) and the rule. Standard library and pydantic only: the CLI reads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "DISTRIBUTIONS",
    "MAX_GRID",
    "MAX_TRIALS",
    "Distribution",
    "EarlyStopping",
    "SearchSpec",
    "check_search",
    "distributions",
    "fill",
]

DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")
MAX_TRIALS = 10_000  # trials of one search
MAX_CONCURRENT = 1_000
MAX_CHOICES = 1_000  # values of one choice
MAX_GRID = 100_000  # points of a grid search's grid

Method = Literal["random", "grid", "tpe", "cmaes", "qmc"]
Pruning = Literal["none", "asha", "hyperband", "median"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EarlyStopping(_Strict):
    """Which pruner stops unpromising trials early (Optuna's), and its settings."""

    method: Pruning = "none"
    min_steps: int = Field(
        1, ge=1, le=10**12, description="Steps a trial runs at least before it may be pruned"
    )
    reduction_factor: int = Field(
        3, ge=2, le=100, description="ASHA and Hyperband: 1/reduction_factor of trials go on"
    )
    max_steps: int | None = Field(
        None, ge=1, le=10**12, description="Hyperband: the steps of a full trial (default: auto)"
    )


class SearchSpec(_Strict):
    """A hyperparameter search: each trial is a job whose ``hparams`` are sampled."""

    method: Method = Field("tpe", description="Optuna's sampler: random, grid, tpe, cmaes, qmc")
    metric: str = Field(
        ..., min_length=1, max_length=256, description="The metric (run.log) to optimise"
    )
    mode: Literal["min", "max"] = "min"
    max_trials: int = Field(10, ge=1, le=MAX_TRIALS)
    max_concurrent: int = Field(1, ge=1, le=MAX_CONCURRENT)
    early_stopping: EarlyStopping = Field(default_factory=lambda: EarlyStopping())
    seed: int | None = Field(None, ge=0, le=2**32 - 1)

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _method_only(cls, value: Any) -> Any:
        return {"method": value} if isinstance(value, str) else value


class Distribution:
    """One distribution leaf: its kind and its arguments, checked."""

    def __init__(self, kind: str, args: list[Any]) -> None:
        self.kind = kind
        self.args = args

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.args}

    def grid(self) -> list[Any] | None:
        """Every value a grid search tries, or None when the distribution is continuous."""
        if self.kind == "choice":
            return list(self.args)
        if self.kind == "int":
            low, high = self.args
            return list(range(low, high + 1)) if high - low < MAX_GRID else None
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_distribution(path: str, value: Any) -> Distribution | None:
    """The distribution a leaf describes, None for a plain value; ValueError names ``path``."""
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ((kind, args),) = value.items()
    if kind not in DISTRIBUTIONS:
        return None
    where = f"{path}: {{{kind}: ...}}"
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise ValueError(f"{where} needs a non-empty list of values, got {args!r}")
        if len(args) > MAX_CHOICES:
            raise ValueError(f"{where} may list at most {MAX_CHOICES} values, got {len(args)}")
        for item in args:
            if not (item is None or isinstance(item, str | bool) or _number(item)):
                raise ValueError(
                    f"{where} values must be strings, numbers, booleans or null, got {item!r}"
                )
        return Distribution(kind, list(args))
    if not isinstance(args, list) or len(args) != 2 or not all(_number(a) for a in args):
        raise ValueError(f"{where} needs [low, high], two finite numbers, got {args!r}")
    low, high = args
    if kind == "int":
        if not all(isinstance(a, int) for a in args):
            raise ValueError(f"{where} needs two integers, got {args!r}")
        if low > high:
            raise ValueError(f"{where} needs low <= high, got {args!r}")
        return Distribution(kind, [low, high])
    if low >= high:
        raise ValueError(f"{where} needs low < high, got {args!r}")
    if kind == "log_uniform" and low <= 0:
        raise ValueError(f"{where} needs low > 0 (a log scale), got {args!r}")
    return Distribution(kind, [float(low), float(high)])


def _leaves(node: dict[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in node.items():
        path = f"{prefix}.{key}"
        if isinstance(value, dict) and parse_distribution(path, value) is None:
            yield from _leaves(value, path)
        else:
            yield path, value


def distributions(hparams: dict[str, Any]) -> dict[str, Distribution]:
    """The distribution leaves of ``hparams`` by dotted name (``model.width``); raises
    ValueError naming ``hparams.<name>`` for a malformed one."""
    found: dict[str, Distribution] = {}
    for path, value in _leaves(hparams, "hparams"):
        dist = parse_distribution(path, value)
        if dist is not None:
            found[path.removeprefix("hparams.")] = dist
    return found


def fill(hparams: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``hparams`` with each distribution leaf replaced by its value in ``values``."""

    def walk(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            name = f"{prefix}{key}"
            if name in values:
                out[key] = values[name]
            elif isinstance(value, dict):
                out[key] = walk(value, f"{name}.")
            else:
                out[key] = value
        return out

    return walk(hparams, "")


def check_search(search: SearchSpec | None, hparams: dict[str, Any]) -> None:
    """What the spec as a whole must satisfy; ValueError names the fields."""
    found = distributions(hparams)
    if search is None:
        if found:
            name = next(iter(found))
            raise ValueError(
                f"hparams.{name} is a distribution ({found[name].kind}); a spec with "
                "distributions needs a search: block (method, metric, max_trials)"
            )
        return
    if not found:
        raise ValueError(
            "search: needs at least one distribution among the hparams, such as "
            "lr: {log_uniform: [1.0e-4, 1.0e-1]}"
        )
    if search.method == "grid":
        size = 1
        for name, dist in found.items():
            points = dist.grid()
            if points is None:
                raise ValueError(
                    f"search.method grid needs finite distributions (choice, int), but "
                    f"hparams.{name} is {dist.kind}"
                )
            size *= len(points)
            if size > MAX_GRID:
                raise ValueError(f"search.method grid: the grid has more than {MAX_GRID} points")
    if search.method == "cmaes" and all(d.kind == "choice" for d in found.values()):
        raise ValueError("search.method cmaes needs a numeric distribution among the hparams")
