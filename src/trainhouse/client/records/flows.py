"""Records of flows: a flow with its steps, the list.

TypedDicts, no ``from __future__ import annotations``: see :mod:`trainhouse.client.records`."""

from typing import TypedDict

__all__ = ["Flow", "FlowList", "FlowStep"]


class FlowStep(TypedDict):
    """``FlowStepOut``: one step of a flow and where its job stands."""

    name: str
    job_id: int
    after: list[str]
    inputs: dict[str, str]
    state: str | None  # a JobState; None: the step's job was deleted
    reason: str | None
    job_name: str | None
    last_step: int | None
    total_steps: int | None


class Flow(TypedDict):
    """``FlowOut``: a flow (``state``: QUEUED, RUNNING, COMPLETED, FAILED or CANCELED)."""

    id: int
    name: str
    owner: str
    created_at: float
    state: str
    jobs: dict[str, int]
    steps: list[FlowStep]


class FlowList(TypedDict):
    """``FlowListOut``: a page of ``GET /flows``."""

    flows: list[Flow]
    total: int
