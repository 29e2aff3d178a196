"""Jobs that wait for jobs, models handed from one job to the next, and promotion, pure: the
rules of a job's ``after:``, ``inputs:`` and ``promote:``, what a waiting job's upstreams mean
for it (:func:`verdict`), the order of a flow's steps (:func:`order`), and whether a version
beats the one an alias names (:func:`compare`).

Standard library only: the spec, the scheduler and the CLI read it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainhouse.core.errors import FlowError

__all__ = [
    "INPUT_PREFIX",
    "MAX_AFTER",
    "MAX_INPUTS",
    "MAX_STEPS",
    "Comparison",
    "Upstream",
    "Verdict",
    "check_input_key",
    "check_input_ref",
    "check_step_name",
    "compare",
    "input_var",
    "order",
    "parse_input_ref",
    "verdict",
]

#: the most jobs one job may wait for, inputs one job may read, steps one flow may have
MAX_AFTER = 64
MAX_INPUTS = 16
MAX_STEPS = 64
#: the rank's variable of the model read under ``key``: ``TRAINHOUSE_INPUT_<KEY>``
INPUT_PREFIX = "TRAINHOUSE_INPUT_"

_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_STEP = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
_JOB_REF = re.compile(r"^job:([0-9]{1,18})$")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

#: an upstream state that satisfies each ``when``
SATISFIES = {
    "completed": frozenset({"COMPLETED"}),
    "ended": frozenset({"COMPLETED", "FAILED", "CANCELED"}),
}
#: states that can no longer become COMPLETED without a person acting (``resume``)
DOOMED = frozenset({"FAILED", "CANCELED"})


def check_input_key(key: str) -> str:
    """An input's key: 1-32 lower-case letters, digits or ``_``, starting with a letter (it
    names the variable ``TRAINHOUSE_INPUT_<KEY>``)."""
    if not isinstance(key, str) or not _KEY.match(key):
        raise FlowError(
            f"input key {str(key)[:40]!r} must be 1-32 lower-case letters, digits or '_', "
            "starting with a letter"
        )
    return key


def input_var(key: str) -> str:
    return INPUT_PREFIX + check_input_key(key).upper()


def parse_input_ref(ref: str) -> tuple[int, None, None] | tuple[None, str, str]:
    """``job:31`` as (31, None, None); ``NAME``, ``NAME@3`` or ``NAME@champion`` as (None,
    name, version-or-alias; ``latest`` for a bare name)."""
    if not isinstance(ref, str):
        raise FlowError(f"an input is job:ID or MODEL@VERSION, not {ref!r}")
    match = _JOB_REF.match(ref)
    if match:
        job = int(match.group(1))
        if not 0 < job < 2**63:
            raise FlowError(f"input {ref!r}: no job has that id")
        return job, None, None
    name, _, which = ref.partition("@")
    which = which or "latest"
    if not _MODEL_NAME.match(name) or not _MODEL_NAME.match(which):
        raise FlowError(
            f"input {ref[:80]!r} must be job:ID (the model that job saved last) or "
            "MODEL[@VERSION|@ALIAS] (a registered version)"
        )
    return None, name, which


def check_input_ref(ref: str) -> str:
    parse_input_ref(ref)
    return ref


def check_step_name(name: str) -> str:
    if not isinstance(name, str) or not _STEP.match(name):
        raise FlowError(
            f"step name {str(name)[:40]!r} must be 1-32 letters, digits, '_' or '-', "
            "starting with a letter"
        )
    return name


@dataclass(frozen=True)
class Upstream:
    """A job another waits for, as the waiting job sees it now: its state (None: it was
    deleted) and what the waiting job asked of it."""

    job: int
    when: str  # "completed" | "ended"
    state: str | None


@dataclass(frozen=True)
class Verdict:
    """What a queued job's upstreams mean now: ``ready`` to be scheduled, or waiting with
    ``reason``, or ``doomed`` (it can never run: it ends CANCELED with ``reason``)."""

    ready: bool
    doomed: bool
    reason: str


def verdict(upstreams: Iterable[Upstream]) -> Verdict:
    """Ready when every upstream satisfies its ``when``; doomed as soon as one can no longer
    (deleted, or FAILED/CANCELED where it had to complete); else waiting for the first one
    that does not satisfy it yet."""
    waiting: list[Upstream] = []
    for up in sorted(upstreams, key=lambda u: u.job):
        if up.state is None:
            return Verdict(False, True, f"upstream job {up.job} was deleted")
        if up.state in SATISFIES.get(up.when, SATISFIES["completed"]):
            continue
        if up.when == "completed" and up.state in DOOMED:
            return Verdict(False, True, f"upstream job {up.job} {up.state}")
        waiting.append(up)
    if not waiting:
        return Verdict(True, False, "")
    first = waiting[0]
    more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
    goal = "complete" if first.when == "completed" else "end"
    return Verdict(
        False, False, f"waiting for job {first.job} to {goal} (it is {first.state}){more}"
    )


def order(steps: Mapping[str, Sequence[str]]) -> list[str]:
    """The steps in an order where each comes after every step it names (``steps``: each
    step's upstream steps), ties in the order given; FlowError naming an unknown step or the
    steps of a cycle."""
    for step, ups in steps.items():
        for up in ups:
            if up not in steps:
                known = ", ".join(steps)
                raise FlowError(f"step {step!r} names {up!r}, which is not a step ({known})")
            if up == step:
                raise FlowError(f"step {step!r} waits for itself")
    done: list[str] = []
    placed: set[str] = set()
    visiting: list[str] = []

    def visit(step: str) -> None:
        if step in placed:
            return
        if step in visiting:
            cycle = [*visiting[visiting.index(step) :], step]
            raise FlowError("the steps wait for each other in a cycle: " + " -> ".join(cycle))
        visiting.append(step)
        for up in steps[step]:
            visit(up)
        visiting.pop()
        placed.add(step)
        done.append(step)

    for step in steps:
        visit(step)
    return done


@dataclass(frozen=True)
class Comparison:
    promoted: bool
    text: str


def _num(value: float) -> str:
    return f"{value:.6g}"


def compare(
    *,
    alias: str,
    metric: str,
    mode: str,
    candidate: int,
    value: float | None,
    holder: int | None,
    held_value: float | None,
) -> Comparison:
    """Whether version ``candidate`` (its ``value`` of ``metric``) takes ``alias`` from
    ``holder`` (None: no version holds it), and the sentence that records it: ``promoted v3
    to champion: val_acc 0.95 > 0.91 (v1)`` or ``kept v1 as champion: val_acc 0.5 <= 0.91``.
    A value that is missing or not a number is a refusal, said as such."""
    if value is None or value != value:
        return Comparison(False, f"not promoted: v{candidate} has no value of {metric} to compare")
    if holder is None:
        return Comparison(
            True, f"promoted v{candidate} to {alias}: {metric} {_num(value)} (no version held it)"
        )
    if holder == candidate:
        return Comparison(False, f"kept v{candidate} as {alias}: it holds the alias already")
    if held_value is None or held_value != held_value:
        return Comparison(
            False,
            f"kept v{holder} as {alias}: v{holder} has no value of {metric} to compare "
            f"(move the alias by hand: trainhouse models alias)",
        )
    better = value > held_value if mode == "max" else value < held_value
    sign = (">" if better else "<=") if mode == "max" else ("<" if better else ">=")
    if better:
        return Comparison(
            True,
            f"promoted v{candidate} to {alias}: {metric} {_num(value)} {sign} "
            f"{_num(held_value)} (v{holder})",
        )
    return Comparison(
        False,
        f"kept v{holder} as {alias}: {metric} {_num(value)} (v{candidate}) {sign} "
        f"{_num(held_value)}",
    )
