"""The search part of the spec: distributions as hparams leaves and the search: block; errors
name the field."""

from __future__ import annotations

import pytest

from trainhouse.core.searchspec import distributions, fill
from trainhouse.errors import SpecError
from trainhouse.spec import parse_spec

BASE = """
name: s
entrypoint: python train.py
hparams:
  lr: {log_uniform: [1.0e-4, 1.0e-1]}
  model: {width: {int: [16, 256]}, act: relu}
  optimizer: {choice: [adam, sgd]}
  epochs: 20
search:
  method: tpe
  metric: val_loss
  max_trials: 24
  max_concurrent: 4
  early_stopping: {method: asha, min_steps: 50, reduction_factor: 3}
  seed: 0
"""


def test_a_search_spec_parses_with_its_distributions() -> None:
    spec = parse_spec(BASE)
    assert spec.search is not None
    assert spec.search.early_stopping.method == "asha"
    found = distributions(spec.hparams)
    assert {k: d.kind for k, d in found.items()} == {
        "lr": "log_uniform",
        "model.width": "int",
        "optimizer": "choice",
    }
    filled = fill(spec.hparams, {"lr": 0.01, "model.width": 32, "optimizer": "sgd"})
    assert filled == {
        "lr": 0.01,
        "model": {"width": 32, "act": "relu"},
        "optimizer": "sgd",
        "epochs": 20,
    }
    # early_stopping may be just a method's name
    short = parse_spec(BASE.replace("{method: asha, min_steps: 50, reduction_factor: 3}", "none"))
    assert short.search is not None and short.search.early_stopping.method == "none"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("{log_uniform: [1.0e-4, 1.0e-1]}", "{log_uniform: [0, 1]}", "hparams.lr: {log_uniform"),
        ("{log_uniform: [1.0e-4, 1.0e-1]}", "{uniform: [2, 1]}", "needs low < high"),
        ("{int: [16, 256]}", "{int: [1.5, 3]}", "hparams.model.width: {int: ...} needs two int"),
        ("{choice: [adam, sgd]}", "{choice: []}", "hparams.optimizer: {choice: ...} needs a non"),
        ("{choice: [adam, sgd]}", "{choice: [[1]]}", "values must be strings"),
        ("method: tpe", "method: bayes", "search.method"),
        ("max_concurrent: 4", "max_concurrent: 0", "search.max_concurrent"),
        ("method: tpe", "method: grid", "search.method grid needs finite distributions"),
        ("  metric: val_loss\n", "", "search.metric is required"),
        ("early_stopping: {method: asha,", "early_stopping: {method: asha, rungs: 2,", "rungs"),
    ],
)
def test_errors_name_the_field(old: str, new: str, message: str) -> None:
    assert old in BASE
    with pytest.raises(SpecError) as err:
        parse_spec(BASE.replace(old, new, 1), source="search.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("search.yaml")


def test_distributions_need_a_search_and_a_search_needs_distributions() -> None:
    no_search = BASE.split("search:")[0]
    with pytest.raises(SpecError, match=r"hparams.lr is a distribution .* needs a search: block"):
        parse_spec(no_search)
    fixed = BASE.replace("{log_uniform: [1.0e-4, 1.0e-1]}", "0.1")
    fixed = fixed.replace("{int: [16, 256]}", "32").replace("{choice: [adam, sgd]}", "adam")
    with pytest.raises(SpecError, match="needs at least one distribution"):
        parse_spec(fixed)


def test_a_grid_search_takes_finite_distributions() -> None:
    grid = BASE.replace("method: tpe", "method: grid").replace(
        "{log_uniform: [1.0e-4, 1.0e-1]}", "{choice: [0.1, 0.01]}"
    )
    spec = parse_spec(grid)
    found = distributions(spec.hparams)
    assert found["model.width"].grid() == list(range(16, 257))
    assert found["lr"].grid() == [0.1, 0.01]
