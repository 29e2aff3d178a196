"""Turning a prediction request's JSON into tensors the model takes, or a 4xx that names the
problem: what a client sends a replica is hostile input."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainhouse.core.errors import BadInput

if TYPE_CHECKING:
    import torch

__all__ = ["BadInput", "parse_inputs"]

INTEGER_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "bool"}


def _shape_text(shape: list[Any]) -> str:
    return "[" + ", ".join("batch" if d is None else str(d) for d in shape) + "]"


def _has_bool(value: list[Any]) -> bool:
    """Whether nested lists hold a JSON true or false (torch would take them as 1 and 0)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, bool):
            return True
    return False


def _tensor(name: str, value: Any, spec: dict[str, Any]) -> torch.Tensor:
    import torch

    if not isinstance(value, list) or not value:
        raise BadInput(f"{name} must be a non-empty list with one entry per example")
    if str(spec["dtype"]) != "bool" and _has_bool(value):
        raise BadInput(f"{name} holds true/false values; the model takes {spec['dtype']} numbers")
    try:
        raw = torch.tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise BadInput(
            f"{name} must be nested lists of numbers of one shape per example: {str(exc)[:200]}"
        ) from None
    want = None if spec["shape"] is None else list(spec["shape"])
    if want is None:
        if raw.dim() < 1:
            raise BadInput(f"{name} must hold one entry per example")
    elif raw.dim() != len(want) or any(
        d is not None and d != got for d, got in zip(want[1:], raw.shape[1:], strict=False)
    ):
        got = [None, *raw.shape[1:]] if raw.dim() else []
        raise BadInput(
            f"{name} has shape {_shape_text(got)}; the model takes {_shape_text(want)} "
            f"({spec['dtype']})"
        )
    dtype = str(spec["dtype"])
    if not bool(torch.isfinite(raw).all()) and dtype in INTEGER_DTYPES:
        raise BadInput(f"{name} must be finite {dtype} values")
    if dtype in INTEGER_DTYPES and not bool((raw == raw.round()).all()):
        raise BadInput(f"{name} must be {dtype} values (whole numbers), got fractions")
    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype):
        raise BadInput(f"the model's input {spec['name']} has a dtype this replica cannot make")
    return raw.to(target)


def parse_inputs(body: Any, signature: dict[str, Any], max_examples: int) -> list[torch.Tensor]:
    """The model's input tensors from ``{"inputs": [...]}`` (one input: a list, one entry per
    example) or ``{"inputs": {"NAME": [...], ...}}`` (several named inputs)."""
    if not isinstance(body, dict) or "inputs" not in body:
        raise BadInput('the body must be a JSON object {"inputs": [...]}')
    specs = list(signature.get("inputs") or [])
    inputs = body["inputs"]
    if isinstance(inputs, dict):
        names = [s["name"] for s in specs]
        if sorted(inputs) != sorted(names):
            raise BadInput(
                f"inputs must name exactly the model's inputs {names}, got {sorted(inputs)[:10]}"
            )
        tensors = [_tensor(f"inputs.{s['name']}", inputs[s["name"]], s) for s in specs]
    elif len(specs) == 1:
        tensors = [_tensor("inputs", inputs, specs[0])]
    elif not specs:  # registered without its inputs (--input): float32 of any shape
        tensors = [_tensor("inputs", inputs, {"name": "inputs", "shape": None, "dtype": "float32"})]
    else:
        names = [s["name"] for s in specs]
        raise BadInput(
            f"the model takes several inputs: send {{'inputs': {{name: [...]}}}} for {names}"
        )
    rows = {int(t.shape[0]) for t in tensors}
    if len(rows) != 1:
        raise BadInput(f"every input must hold the same number of examples, got {sorted(rows)}")
    (count,) = rows
    if count > max_examples:
        raise BadInput(f"a request holds at most {max_examples} examples, got {count}", 413)
    if any(math.prod(t.shape) > 50_000_000 for t in tensors):
        raise BadInput("the inputs are too large", 413)
    return tensors
