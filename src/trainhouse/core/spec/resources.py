"""A job's size: ``resources:`` in the spec (nodes, ranks per node, GPUs, CPU cores per
rank), fixed or elastic (``MIN:MAX``, torchrun's form)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_RANGE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_ELASTIC = r"^\d+:\d+$"  # what the schema shows; parse_size checks the bounds
# a fixed size, or "MIN:MAX" (an elastic one, torchrun's form)
Nodes = Annotated[int, Field(ge=1, le=4096)] | Annotated[str, Field(pattern=_ELASTIC)]
Procs = Annotated[int, Field(ge=1, le=1024)] | Annotated[str, Field(pattern=_ELASTIC)]
Gpus = Annotated[int, Field(ge=0, le=1024)] | Annotated[str, Field(pattern=_ELASTIC)]


def parse_size(value: object, *, low: int, high: int) -> int | str:
    """``4`` or ``"4"`` stays ``4``; ``"2:8"`` is an elastic range (``"2:2"`` is ``2``)."""
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number or MIN:MAX such as 2:8, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    elif isinstance(value, str) and (match := _RANGE.match(value)):
        least, most = int(match.group(1)), int(match.group(2))
        if not low <= least <= most <= high:
            raise ValueError(
                f"must be MIN:MAX with {low} <= MIN <= MAX <= {high}, got {value.strip()!r}"
            )
        return least if least == most else f"{least}:{most}"
    else:
        raise ValueError(f"must be a whole number or MIN:MAX such as 2:8, got {value!r}")
    if number < low:
        raise ValueError(f"must be greater than or equal to {low}, got {number}")
    if number > high:
        raise ValueError(f"must be less than or equal to {high}, got {number}")
    return number


def size_range(value: int | str) -> tuple[int, int]:
    """(MIN, MAX) of a size ``parse_size`` made."""
    if isinstance(value, int):
        return value, value
    least, most = value.split(":")
    return int(least), int(most)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    nodes: Nodes = Field(
        1,
        description="Machines the job spans; >1 needs a multi-node executor. MIN:MAX (such as "
        "1:4) makes the job elastic: it starts at the largest size that fits and the scheduler "
        "resizes it at checkpoints",
    )
    procs_per_node: Procs | None = Field(
        None,
        description="torch.distributed ranks per node; default gpus_per_node or 1. MIN:MAX "
        "(such as 2:8) makes the job elastic (the local executor resizes this one)",
    )
    gpus_per_node: Gpus = Field(
        0,
        description="GPUs per node; 0 = CPU job. MIN:MAX makes a GPU job elastic, one GPU per "
        "rank (procs_per_node follows it)",
    )
    cpus_per_proc: int = Field(1, ge=1, le=4096, description="CPU cores reserved for each rank")

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: object) -> int | str:
        return parse_size(value, low=1, high=4096)

    @field_validator("procs_per_node", mode="before")
    @classmethod
    def _procs(cls, value: object) -> int | str | None:
        return None if value is None else parse_size(value, low=1, high=1024)

    @field_validator("gpus_per_node", mode="before")
    @classmethod
    def _gpus(cls, value: object) -> int | str:
        return parse_size(value, low=0, high=1024)

    @model_validator(mode="after")
    def _default_procs(self) -> Resources:
        gpus = self.gpus_per_node
        if isinstance(gpus, str):  # an elastic GPU job: one GPU per rank
            if gpus.startswith("0:"):
                raise ValueError(
                    f"gpus_per_node {gpus!r}: an elastic GPU job needs at least one GPU per node"
                )
            if self.procs_per_node is None:
                object.__setattr__(self, "procs_per_node", gpus)
            elif self.procs_per_node != gpus:
                raise ValueError(
                    f"gpus_per_node is {gpus!r} but procs_per_node is {self.procs_per_node!r}: "
                    "an elastic GPU job runs one rank per GPU; give the range once, in "
                    "gpus_per_node"
                )
            return self
        if self.procs_per_node is None:
            object.__setattr__(self, "procs_per_node", max(gpus, 1))
        elif isinstance(self.procs_per_node, str):
            if gpus:
                raise ValueError(
                    f"procs_per_node is {self.procs_per_node!r} with gpus_per_node {gpus}: an "
                    f"elastic GPU job gives its range in gpus_per_node (gpus_per_node: "
                    f"{self.procs_per_node!r}), one GPU per rank"
                )
        elif 0 < gpus < self.procs_per_node:
            # each rank of a GPU job takes a GPU of its own (run.device): two ranks on one GPU
            # fail under NCCL ("Duplicate GPU detected"); no sharing mode is offered
            raise ValueError(
                f"has procs_per_node ({self.procs_per_node}) more than gpus_per_node "
                f"({gpus}): each rank of a GPU job gets a GPU of its own; ask for "
                f"gpus_per_node: {self.procs_per_node} or procs_per_node: {gpus}"
            )
        return self

    @property
    def elastic(self) -> bool:
        """Whether the job's size is a range (it may be resized at checkpoints)."""
        return isinstance(self.nodes, str) or isinstance(self.procs_per_node, str)

    @property
    def nodes_range(self) -> tuple[int, int]:
        return size_range(self.nodes)

    @property
    def procs_range(self) -> tuple[int, int]:
        return size_range(self.procs_per_node or 1)

    @property
    def max_nodes(self) -> int:
        return self.nodes_range[1]

    @property
    def min_nodes(self) -> int:
        return self.nodes_range[0]

    @property
    def procs(self) -> int:
        """Ranks per node, with the default applied (an elastic job's most)."""
        return self.procs_range[1]

    @property
    def gpus_per_proc(self) -> int:
        """0 for a CPU job; an elastic GPU job's ranks have one GPU each."""
        gpus = self.gpus_per_node
        return 1 if isinstance(gpus, str) else 0

    def gpus_at(self, procs: int) -> int:
        """GPUs per node with ``procs`` ranks per node."""
        gpus = self.gpus_per_node
        return procs if isinstance(gpus, str) else gpus

    @property
    def gpus(self) -> int:
        """GPUs per node at the job's largest size."""
        return self.gpus_at(self.procs)

    @property
    def world_size(self) -> int:
        """Ranks in all (an elastic job's most)."""
        return self.max_nodes * self.procs

    @property
    def cpus_per_node(self) -> int:
        return self.procs * self.cpus_per_proc

    def size_text(self) -> str:
        """``2 node(s) x 4 rank(s)``, with ranges for an elastic job."""
        return f"{self.nodes} node(s) x {self.procs_per_node} rank(s)"
