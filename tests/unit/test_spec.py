from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainhouse.errors import SpecError
from trainhouse.spec import JobSpec, json_schema, load_spec, parse_duration, parse_spec

EXAMPLE = Path(__file__).parents[2] / "examples" / "digits" / "trainhouse.yaml"


def test_example_spec_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert spec.name == "digits-cnn"
    assert spec.resources.procs == 2
    assert spec.resources.world_size == 2
    assert spec.checkpoints.metric == "val_loss"
    assert spec.script_path() == "train.py"


def test_defaults() -> None:
    spec = parse_spec("entrypoint: python train.py")
    assert spec.resources.nodes == 1
    assert spec.resources.procs_per_node == 1
    assert spec.priority == "normal"
    assert spec.max_runtime is None
    gpu = parse_spec("entrypoint: python t.py\nresources: {gpus_per_node: 4}")
    assert gpu.resources.procs_per_node == 4


def test_unknown_key_names_key_and_line() -> None:
    text = "name: x\nentrypoint: python t.py\nresources:\n  nodes: 1\n  gpu: 2\n"
    with pytest.raises(SpecError) as err:
        parse_spec(text, source="job.yaml")
    msg = str(err.value)
    assert "job.yaml:5" in msg
    assert "unknown key 'resources.gpu'" in msg
    assert "gpus_per_node" in msg  # the allowed keys are listed


def test_top_level_unknown_key() -> None:
    with pytest.raises(SpecError, match=r"s.yaml:2: unknown key 'entry'"):
        parse_spec("name: x\nentry: python t.py\n", source="s.yaml")


@pytest.mark.parametrize(
    ("field", "value"),
    [("procs_per_node", 0), ("nodes", -1), ("gpus_per_node", -2), ("cpus_per_proc", 0)],
)
def test_non_positive_resources_rejected(field: str, value: int) -> None:
    text = f"entrypoint: python t.py\nresources:\n  {field}: {value}\n"
    with pytest.raises(SpecError) as err:
        parse_spec(text, source="s.yaml")
    assert f"s.yaml:3: resources.{field}" in str(err.value)
    assert f"got {value}" in str(err.value)


def test_missing_entrypoint() -> None:
    with pytest.raises(SpecError, match="entrypoint is required"):
        parse_spec("name: x\n")


def test_invalid_yaml_reports_line() -> None:
    with pytest.raises(SpecError, match=r"s.yaml:2: not valid YAML"):
        parse_spec("name: x\nentrypoint: a: b\npriority: low\n", source="s.yaml")


def test_not_a_mapping() -> None:
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_spec("- a\n- b\n")


def test_overrides_dotted_paths_and_types() -> None:
    spec = parse_spec(
        "entrypoint: python t.py\nhparams: {lr: 0.01}\n",
        overrides=[
            "hparams.lr=0.1",
            "hparams.layers=3",
            "resources.procs_per_node=2",
            "priority=high",
            "hparams.name=abc",
        ],
    )
    assert spec.hparams == {"lr": 0.1, "layers": 3, "name": "abc"}
    assert spec.resources.procs_per_node == 2
    assert spec.priority == "high"


def test_override_errors_name_the_flag() -> None:
    with pytest.raises(SpecError, match=r"--set priority: priority must be"):
        parse_spec("entrypoint: a", overrides=["priority=top"])
    with pytest.raises(SpecError, match="key=value"):
        parse_spec("entrypoint: a", overrides=["priority"])
    with pytest.raises(SpecError, match="is not a mapping"):
        parse_spec("entrypoint: a\nname: job", overrides=["name.x=1"])
    with pytest.raises(SpecError, match=r"^--set name: name must be"):
        parse_spec("entrypoint: a", overrides=["name.x=1"])


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90), ("90s", 90), ("30m", 1800), ("6h", 21600), ("1d", 86400), ("1.5h", 5400)],
)
def test_durations(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5m", "0", "5 hours"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_max_runtime_in_spec() -> None:
    assert parse_spec("entrypoint: a\nmax_runtime: 6h").max_runtime == 21600
    with pytest.raises(SpecError, match="max_runtime"):
        parse_spec("entrypoint: a\nmax_runtime: forever")


def test_env_rules() -> None:
    spec = parse_spec("entrypoint: a\nenv: {OMP_NUM_THREADS: 1, DEBUG: true}")
    assert spec.env == {"OMP_NUM_THREADS": "1", "DEBUG": "true"}
    with pytest.raises(SpecError, match="set by trainhouse"):
        parse_spec("entrypoint: a\nenv: {RANK: '3'}")
    with pytest.raises(SpecError, match="set by trainhouse"):
        parse_spec("entrypoint: a\nenv: {TRAINHOUSE_URL: x}")
    with pytest.raises(SpecError, match="not a valid environment name"):
        parse_spec("entrypoint: a\nenv: {'1BAD': x}")


def test_keep_best_needs_metric() -> None:
    with pytest.raises(SpecError, match=r"keep_best > 0 needs checkpoints\.metric"):
        parse_spec("entrypoint: a\ncheckpoints: {keep_best: 1}")


def test_entrypoint_must_split() -> None:
    with pytest.raises(SpecError, match="cannot be split"):
        parse_spec("entrypoint: python 'unclosed")


@pytest.mark.parametrize(
    ("entrypoint", "script"),
    [
        ("python train.py --epochs 5", "train.py"),
        ("python3 -u sub/t.py", "sub/t.py"),
        ("python -m pkg.mod", None),
        ("./run.sh", "./run.sh"),
        ("bash -c 'x'", None),
    ],
)
def test_script_path(entrypoint: str, script: str | None) -> None:
    assert JobSpec(entrypoint=entrypoint).script_path() == script


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_schema_is_json_and_complete() -> None:
    schema = json_schema()
    json.dumps(schema)
    assert set(schema["properties"]) >= {
        "name",
        "entrypoint",
        "workdir",
        "resources",
        "priority",
        "max_restarts",
        "max_runtime",
        "preemption_grace",
        "hparams",
        "env",
        "checkpoints",
    }
    assert schema["additionalProperties"] is False


def test_duplicate_keys_are_refused() -> None:
    text = "name: a\nentrypoint: python t.py\nresources:\n  nodes: 1\n  nodes: 2\n"
    with pytest.raises(
        SpecError, match=r"s.yaml:5: key 'nodes' is given twice \(first on line 4\)"
    ):
        parse_spec(text, source="s.yaml")


def test_value_is_named_once() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("entrypoint: a\nmax_runtime: 6 hours")
    assert str(err.value).count("got '6 hours'") == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("entrypoint: a\nmax_runtime: .inf", "finite duration"),
        ("entrypoint: a\nhparams: &a {x: *a}", "aliases"),
        ("a: &x [1]\nb: *x\nentrypoint: a", "aliases"),
    ],
)
def test_hostile_yaml_is_refused_cleanly(text: str, message: str) -> None:
    """Regression: these raised OverflowError / RecursionError (a 500 from the server)."""
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_no_restart_on_defaults_and_errors() -> None:
    spec = parse_spec("entrypoint: python t.py")
    assert "ModuleNotFoundError" in spec.no_restart_on.log_patterns
    assert 127 in spec.no_restart_on.exit_codes
    custom = parse_spec("entrypoint: python t.py\nno_restart_on: {log_patterns: ['NaN loss']}")
    assert custom.no_restart_on.log_patterns == ["NaN loss"]
    assert custom.no_restart_on.exit_codes == [2, 126, 127]  # the other list keeps its defaults
    with pytest.raises(SpecError) as err:
        parse_spec("entrypoint: python t.py\nno_restart_on:\n  log_patterns: ['(unclosed']\n")
    assert "'(unclosed' is not a regular expression" in str(err.value)
    assert ":3" in str(err.value)
