"""The Python client's flow calls (a part of :class:`trainhouse.client.Client`): submitting a
flow file (each step's spec read with its overrides, each workdir packed once however many
steps share it), listing, showing, canceling and resuming flows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainhouse.client.base import ClientBase
from trainhouse.client.credentials import current_user
from trainhouse.client.records import Flow, FlowList

__all__ = ["FlowCalls"]


class FlowCalls(ClientBase):
    def submit_flow(
        self,
        flow_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> Flow:
        """Submit every step of a flow file (``overrides``: ``STEP.FIELD=VALUE``) in one
        request: the server makes all of its jobs or none. Returns the flow with its jobs."""
        from trainhouse.core.spec import JobSpec, load_spec
        from trainhouse.core.spec.flowfile import load_flow
        from trainhouse.jobfs.workdir import pack

        flow = load_flow(flow_file, overrides)
        archives: list[bytes] = []
        by_dir: dict[Path, int] = {}
        specs: list[str] = []
        steps: list[dict[str, Any]] = []
        for step in flow.steps.values():
            path = flow.path_of(step)
            spec = load_spec(path, step.overrides)
            from_steps = step.step_inputs()
            models = {k: v for k, v in step.inputs.items() if k not in from_steps}
            if models:  # registered versions are the spec's own inputs
                spec = JobSpec.model_validate(
                    {**spec.model_dump(mode="json"), "inputs": {**spec.inputs, **models}}
                )
            workdir = (path.parent / spec.workdir).resolve()
            if workdir not in by_dir:
                by_dir[workdir] = len(archives)
                archives.append(pack(workdir).data)
            specs.append(spec.model_dump_json(exclude={"workdir"}))
            steps.append(
                {
                    "name": step.name,
                    "after": list(step.after),
                    "inputs": from_steps,
                    "archive": by_dir[workdir],
                }
            )
        result: Flow = self._json(
            "POST",
            "/flows",
            data={
                "flow": json.dumps({"name": flow.name, "steps": steps}),
                "spec": specs,
                "owner": owner or current_user(),
            },
            files=[
                ("workdir", (f"workdir-{i}.tar.gz", data, "application/gzip"))
                for i, data in enumerate(archives)
            ],
        )
        return result

    def flows(self, *, mine: bool = False, limit: int = 100, offset: int = 0) -> FlowList:
        """The flows the caller may see, newest first."""
        params = {"mine": str(mine).lower(), "limit": limit, "offset": offset}
        result: FlowList = self._json("GET", "/flows", params=params)
        return result

    def flow(self, flow_id: int) -> Flow:
        result: Flow = self._json("GET", f"/flows/{int(flow_id)}")
        return result

    def cancel_flow(self, flow_id: int) -> Flow:
        """Cancel every step of the flow that has not ended."""
        result: Flow = self._json("POST", f"/flows/{int(flow_id)}/cancel")
        return result

    def resume_flow(self, flow_id: int) -> Flow:
        """Run again the steps that failed or were canceled (completed steps stay). With auth
        off the server names this process's user as the one who resumed them."""
        result: Flow = self._json(
            "POST", f"/flows/{int(flow_id)}/resume", json={"by": current_user()}
        )
        return result
