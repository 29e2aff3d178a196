from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainhouse.errors import SpecError
from trainhouse.spec import (
    MAX_ENTRYPOINT,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_HPARAMS_BYTES,
    MAX_SPEC_BYTES,
    JobSpec,
    json_schema,
    load_spec,
    parse_duration,
    parse_spec,
)

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


# -- payload limits: a spec arrives over HTTP --------------------------------------------------
def _padded_spec(size: int, body: str = "entrypoint: python t.py\n") -> str:
    """``body`` plus a comment that brings the text to exactly ``size`` bytes."""
    return body + "#" + "x" * (size - len(body) - 2) + "\n"


def test_spec_text_limit_is_256_kib() -> None:
    assert parse_spec(_padded_spec(MAX_SPEC_BYTES)).entrypoint == "python t.py"
    with pytest.raises(SpecError) as err:
        parse_spec(_padded_spec(MAX_SPEC_BYTES + 1), source="s.yaml")
    assert str(err.value) == (
        "s.yaml: a job spec may be at most 256 KiB (262144 bytes), got 262145 bytes; "
        "keep data in the workdir"
    )
    # counted in UTF-8 bytes, not characters
    wide = "entrypoint: a\n#" + "é" * (MAX_SPEC_BYTES // 2) + "\n"
    assert len(wide) < MAX_SPEC_BYTES
    with pytest.raises(SpecError, match="at most 256 KiB"):
        parse_spec(wide)


def test_huge_spec_is_refused_without_parsing() -> None:
    text = "entrypoint: a\nhparams: {" + ", ".join(f"k{i}: {i}" for i in range(400_000)) + "}"
    started = time.perf_counter()
    with pytest.raises(SpecError, match=r"got \d+ bytes"):
        parse_spec(text)
    assert time.perf_counter() - started < 2.0  # parsing this takes tens of seconds


def test_spec_file_over_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(_padded_spec(MAX_SPEC_BYTES + 10))
    with pytest.raises(SpecError, match=r"big.yaml is 262154 bytes; a job spec may be at most"):
        load_spec(path)


def test_hparams_limit_is_64_kib_of_json() -> None:
    # {"blob": "..."}: 12 bytes of JSON around the string
    fits = "x" * (MAX_HPARAMS_BYTES - 12)
    assert len(json.dumps({"blob": fits})) == MAX_HPARAMS_BYTES
    assert parse_spec(f"entrypoint: a\nhparams: {{blob: {fits}}}").hparams["blob"] == fits
    with pytest.raises(SpecError) as err:
        parse_spec(f"entrypoint: a\nhparams: {{blob: {fits}x}}", source="s.yaml")
    assert "s.yaml:2: hparams must be at most 64 KiB as JSON, got 65537 bytes" in str(err.value)


def test_env_limits() -> None:
    many = ", ".join(f"V{i}: '1'" for i in range(MAX_ENV_VARS))
    assert len(parse_spec(f"entrypoint: a\nenv: {{{many}}}").env) == MAX_ENV_VARS
    with pytest.raises(SpecError, match=r"env must have at most 256 variables, got 257"):
        parse_spec(f"entrypoint: a\nenv: {{{many}, EXTRA: '1'}}")
    long_name = "A" * (MAX_ENV_NAME + 1)
    with pytest.raises(SpecError, match=r"must be at most 128 characters, got 129") as err:
        parse_spec(f"entrypoint: a\nenv: {{{long_name}: x}}")
    assert long_name not in str(err.value)  # shown cut short
    value = "v" * MAX_ENV_VALUE
    assert parse_spec(f"entrypoint: a\nenv: {{BIG: {value}}}").env["BIG"] == value
    with pytest.raises(SpecError, match=r"value of BIG must be at most 16384 characters, got"):
        parse_spec(f"entrypoint: a\nenv: {{BIG: {value}v}}")
    with pytest.raises(SpecError, match="value of X must not contain a NUL character"):
        parse_spec('entrypoint: a\nenv: {X: "a\\0b"}')


def test_entrypoint_limits() -> None:
    ok = "python t.py " + "a" * (MAX_ENTRYPOINT - 12)
    assert parse_spec(f"entrypoint: {ok}").entrypoint == ok
    with pytest.raises(SpecError) as err:
        parse_spec(f"entrypoint: {ok}b")
    assert str(err.value) == "<spec>:1: entrypoint must be at most 4096 characters, got 4097"
    with pytest.raises(SpecError, match="entrypoint must not contain a NUL character"):
        parse_spec('entrypoint: "python t.py\\0rm"')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: " + "n" * 129,
            r"name must have at most 128 characters, got 'nnn.*\(129 characters\)",
        ),
        ("workdir: " + "w" * 1025, r"workdir must have at most 1024 characters, got 'ww"),
        (
            "checkpoints: {keep_best: 1, metric: " + "m" * 257 + "}",
            r"checkpoints.metric must have at most 256 characters",
        ),
        (
            "resources: {nodes: 5000}",
            r"resources.nodes must be less than or equal to 4096, got 5000",
        ),
        ("resources: {gpus_per_node: 2000}", r"resources.gpus_per_node must be less than or equal"),
        ("max_runtime: 400d", r"max_runtime must be at most 366 days \(31622400 s\), got '400d'"),
    ],
)
def test_string_and_number_fields_are_bounded(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        parse_spec("entrypoint: python t.py\n" + text)
    assert len(str(err.value)) < 200  # the long value is shown cut short


@pytest.mark.parametrize(
    "text",
    [
        # block mappings 40 deep
        "entrypoint: a\nhparams:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(40)),
        # flow lists 40 deep, and 100,000 deep (a RecursionError in the composer before)
        "entrypoint: a\nhparams: {x: " + "[" * 40 + "]" * 40 + "}",
        "entrypoint: a\nhparams: {x: " + "[" * 100_000 + "]" * 100_000 + "}",
        '{"entrypoint": "a", "hparams": {"x": ' + "[" * 50_000 + "]" * 50_000 + "}}",
    ],
    ids=["block-40", "flow-40", "flow-100000", "json-50000"],
)
def test_deep_nesting_is_refused_quickly(text: str) -> None:
    started = time.perf_counter()
    with pytest.raises(SpecError, match="nest"):
        parse_spec(text)
    assert time.perf_counter() - started < 2.0


def test_nesting_up_to_the_limit_is_accepted() -> None:
    # the top-level mapping, hparams and 30 lists: 32 levels
    text = "entrypoint: a\nhparams: {x: " + "[" * 30 + "1" + "]" * 30 + "}"
    value = parse_spec(text).hparams["x"]
    for _ in range(29):
        value = value[0]
    assert value == [1]


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    text = "entrypoint: a\nhparams:\n" + "\n".join("  " + line for line in lines)
    started = time.perf_counter()
    with pytest.raises(SpecError, match=r"<spec>:4: not valid YAML: aliases \(\*name\)"):
        parse_spec(text)
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("entrypoint: a\nhparams: {x: " + "9" * 5000 + "}", "4300 digits"),
        ("entrypoint: a\nhparams: {when: 2024-13-45}", "month must be in 1..12"),
    ],
)
def test_values_python_cannot_build_are_spec_errors(text: str, message: str) -> None:
    """Regression: these raised ValueError (a 500 from the server)."""
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_override_values_get_the_same_guards() -> None:
    spec = parse_spec("entrypoint: a", overrides=["hparams.x=&a [*a]"])
    assert spec.hparams["x"] == "&a [*a]"  # not YAML a spec accepts: kept as the string
    deep = "[" * 5000 + "]" * 5000
    assert parse_spec("entrypoint: a", overrides=[f"hparams.x={deep}"]).hparams["x"] == deep


def test_two_ranks_never_share_a_gpu() -> None:
    """Issue 20, item 3: more ranks than GPUs on a GPU node put two ranks on one GPU, which
    NCCL refuses ("Duplicate GPU detected"): refused at submit, with what to ask for."""
    with pytest.raises(SpecError) as err:
        parse_spec("entrypoint: python t.py\nresources: {procs_per_node: 4, gpus_per_node: 2}")
    msg = str(err.value)
    assert "procs_per_node (4) more than gpus_per_node (2)" in msg
    assert "gpus_per_node: 4 or procs_per_node: 2" in msg and msg.startswith("<spec>:2:")
    # fewer ranks than GPUs (a rank driving several) and CPU jobs stay as they were
    assert parse_spec("entrypoint: t\nresources: {procs_per_node: 1, gpus_per_node: 2}")
    assert parse_spec("entrypoint: t\nresources: {procs_per_node: 8}").resources.procs == 8
