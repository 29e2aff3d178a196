"""Reading a flow file: steps, each a job spec file with overrides, the steps it waits for and
the models it reads; checked like a spec (bounded, no aliases, errors naming the file, the line
and the field), with every step named in ``after`` or ``inputs`` known and no cycle::

    name: digits-release
    jobs:
      train:    {spec: train.yaml, set: {hparams.epochs: 20}}
      evaluate: {spec: eval.yaml, after: [train], inputs: {candidate: train}}

An input that names a step is the model that step saved last (it waits for that step too);
any other is a registered version (``digits-cnn@champion``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainhouse.core.errors import FlowError
from trainhouse.core.flows import (
    MAX_STEPS,
    check_input_key,
    check_input_ref,
    check_step_name,
    order,
)
from trainhouse.core.spec.model import MAX_SPEC_BYTES
from trainhouse.core.spec.text import _Lines, read_yaml

__all__ = ["FlowFile", "Step", "is_flow", "load_flow", "parse_flow"]

_STEP_KEYS = ("spec", "set", "after", "inputs")
_TOP_KEYS = ("name", "jobs")


@dataclass(frozen=True)
class Step:
    name: str
    spec: str  # the job spec file, relative to the flow file
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE, as --set takes them
    after: tuple[str, ...] = ()  # the steps it waits for (inputs from steps included)
    inputs: dict[str, str] = field(default_factory=dict)  # key -> a step's name, or a model ref
    line: int | None = None

    def step_inputs(self) -> dict[str, str]:
        """The inputs that are other steps' models: key -> step."""
        return {k: v for k, v in self.inputs.items() if v in self.after}


@dataclass(frozen=True)
class FlowFile:
    name: str
    steps: dict[str, Step]  # upstreams first
    source: str = "<flow>"

    def path_of(self, step: Step) -> Path:
        return (Path(self.source).parent / step.spec).resolve()


def _load(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise FlowError(f"{source}: a flow file may be at most {MAX_SPEC_BYTES // 1024} KiB")
    return read_yaml(text, source, FlowError)


def is_flow(text: str) -> bool:
    """A flow file (a mapping with ``jobs:`` and no ``entrypoint:``), not a job spec."""
    try:
        data, _ = _load(text, "<file>")
    except FlowError:
        return False
    return isinstance(data, dict) and "jobs" in data and "entrypoint" not in data


def parse_flow(
    text: str, *, source: str = "<flow>", overrides: list[str] | None = None
) -> FlowFile:
    """Parse a flow file; ``overrides``: ``STEP.FIELD=VALUE`` (``--set``). FlowError names
    the file, the line and the field."""
    data, node = _load(text, source)
    lines = _Lines(node)

    def fail(loc: tuple[str | int, ...], message: str) -> FlowError:
        line = lines.line(loc)
        where = f"{source}:{line}" if line is not None else source
        path = ".".join(str(p) for p in loc)
        return FlowError(f"{where}: {path + ': ' if path else ''}{message}")

    if not isinstance(data, dict):
        raise fail((), "a flow file is a mapping with name: and jobs:")
    for key in data:
        if key not in _TOP_KEYS:
            raise fail((str(key),), f"unknown key; a flow has {', '.join(_TOP_KEYS)}")
    name = data.get("name", Path(source).stem if source != "<flow>" else "flow")
    if not isinstance(name, str) or not 0 < len(name) <= 128 or "\x00" in name:
        raise fail(("name",), "must be a name of 1-128 characters")
    jobs = data.get("jobs")
    if not isinstance(jobs, dict) or not jobs:
        raise fail(("jobs",), "must map step names to their jobs ({spec: FILE, ...})")
    if len(jobs) > MAX_STEPS:
        raise fail(("jobs",), f"at most {MAX_STEPS} steps, got {len(jobs)}")
    raw: dict[str, dict[str, Any]] = {}
    for step, body in jobs.items():
        try:
            check_step_name(str(step) if isinstance(step, str) else step)
        except FlowError as exc:
            raise fail(("jobs", str(step)), str(exc)) from None
        if not isinstance(body, dict):
            raise fail(("jobs", step), "must be a mapping such as {spec: train.yaml}")
        for key in body:
            if key not in _STEP_KEYS:
                raise fail(
                    ("jobs", step, str(key)), f"unknown key; a step has {', '.join(_STEP_KEYS)}"
                )
        raw[step] = body
    steps: dict[str, Step] = {}
    ups: dict[str, list[str]] = {}
    for step, body in raw.items():
        spec = body.get("spec")
        if not isinstance(spec, str) or not spec or "\x00" in spec:
            raise fail(("jobs", step, "spec"), "must name the step's job spec file")
        sets = body.get("set") or {}
        if not isinstance(sets, dict):
            raise fail(("jobs", step, "set"), "must map fields to values: {hparams.lr: 0.1}")
        try:
            flat = [f"{key}={json.dumps(value)}" for key, value in sets.items()]
        except (TypeError, ValueError):
            raise fail(("jobs", step, "set"), "values must be plain YAML values") from None
        after = body.get("after") or []
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise fail(("jobs", step, "after"), "must be a list of step names: [train]")
        for i, up in enumerate(after):
            if up not in raw:
                raise fail(
                    ("jobs", step, "after", i),
                    f"{up!r} is not a step of this flow ({', '.join(raw)})",
                )
        inputs = body.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise fail(("jobs", step, "inputs"), "must map keys to steps or models")
        wanted = list(dict.fromkeys(after))
        for key, ref in inputs.items():
            try:
                check_input_key(key)
                if not isinstance(ref, str):
                    raise FlowError(f"{key}: must be a step's name or MODEL@VERSION")
                if ref in raw:
                    if ref not in wanted:
                        wanted.append(ref)  # reading a step's model waits for the step
                else:
                    check_input_ref(ref)
            except FlowError as exc:
                raise fail(("jobs", step, "inputs", str(key)), str(exc)) from None
        ups[step] = wanted
        steps[step] = Step(
            step,
            spec,
            flat,
            tuple(wanted),
            {str(k): str(v) for k, v in inputs.items()},
            lines.line(("jobs", step)),
        )
    try:
        ordered = order(ups)
    except FlowError as exc:
        raise FlowError(f"{source}: {exc}") from None
    for item in overrides or []:
        key, eq, value = item.partition("=")
        step, dot, rest = key.partition(".")
        if not eq or not dot or not rest:
            raise FlowError(
                f"--set on a flow is STEP.FIELD=VALUE (train.hparams.lr=0.1), got {item!r}"
            )
        if step not in steps:
            raise FlowError(f"--set {item!r}: no step {step!r} ({', '.join(steps)})")
        steps[step].overrides.append(f"{rest}={value}")
    return FlowFile(name, {s: steps[s] for s in ordered}, source)


def load_flow(path: str | Path, overrides: list[str] | None = None) -> FlowFile:
    """Load a flow file; every step's spec file must exist (checked here: the steps' specs
    are read by whoever submits the flow)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FlowError(f"flow file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowError(f"cannot read flow file {path}: {exc}") from None
    flow = parse_flow(text, source=str(path), overrides=overrides)
    for step in flow.steps.values():
        spec = flow.path_of(step)
        if not spec.is_file():
            where = f"{path}:{step.line}" if step.line else str(path)
            raise FlowError(f"{where}: jobs.{step.name}.spec: {step.spec} does not exist ({spec})")
    return flow
