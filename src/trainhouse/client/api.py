"""The Python client for trainhouse's REST API (what the CLI uses too).

from trainhouse.client import Client
c = Client()                       # TRAINHOUSE_URL or http://127.0.0.1:8470; the token from
                                   # TRAINHOUSE_TOKEN or `trainhouse login`
job = c.submit("examples/digits/trainhouse.yaml", overrides=["hparams.epochs=2"])
c.wait(job["id"])

Only httpx is imported up front: the spec (pydantic, YAML), the workdir packer and the
checkpoint storage helpers load with the calls that need them (``submit``, ``dry_run``,
``download_checkpoint``), so that ``trainhouse ps`` and other quick commands start fast.

This module holds :class:`Client` and its calls about the server, jobs, the runs table, the
queue, metrics and resource series; the other nouns' calls are the classes it is made of
(:mod:`~trainhouse.client.logs`, :mod:`~trainhouse.client.checkpoints`,
:mod:`~trainhouse.client.searches`, :mod:`~trainhouse.client.admin`,
:mod:`~trainhouse.client.registry`, :mod:`~trainhouse.client.datasets`), each on
:class:`~trainhouse.client.base.ClientBase`. What the calls return is typed in
:mod:`trainhouse.client.records`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from trainhouse.client.admin import AdminCalls
from trainhouse.client.artifacts import ArtifactCalls
from trainhouse.client.base import DEFAULT_URL, default_url, load_and_pack
from trainhouse.client.checkpoints import CheckpointCalls
from trainhouse.client.credentials import current_user
from trainhouse.client.datasets import DatasetCalls
from trainhouse.client.flows import FlowCalls
from trainhouse.client.frames import JobList, Metrics
from trainhouse.client.logs import LogCalls
from trainhouse.client.logs import _sse as _sse  # tests read streams with it from here
from trainhouse.client.records import (
    Comparison,
    Deleted,
    DryRun,
    Health,
    Job,
    JobDetail,
    JobMetrics,
    JobPage,
    Nodes,
    Queue,
    RunColumns,
    Search,
    SeriesInfo,
    SeriesList,
    SystemMetrics,
    Tags,
)
from trainhouse.client.registry import ModelsAndServices
from trainhouse.client.searches import SearchCalls
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.wire import file_work_wait

__all__ = [
    "DEFAULT_URL",
    "Client",
    "current_user",
    "default_url",
]

if TYPE_CHECKING:
    from trainhouse.core.spec import JobSpec
    from trainhouse.jobfs.workdir import PackedWorkdir


class Client(
    LogCalls,
    CheckpointCalls,
    ArtifactCalls,
    SearchCalls,
    AdminCalls,
    ModelsAndServices,
    DatasetCalls,
    FlowCalls,
):
    """A trainhouse server's REST API (``Client(url, token=..., timeout=...)``; a context
    manager that closes its connection)."""

    # -- server ----------------------------------------------------------------------------
    def health(self) -> Health:
        result: Health = self._json("GET", "/health")
        return result

    def nodes(self) -> Nodes:
        result: Nodes = self._json("GET", "/nodes")
        return result

    # -- jobs ------------------------------------------------------------------------------
    def submit(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> Job:
        """Validate the spec, pack its workdir and submit; returns the new job."""
        spec, packed = load_and_pack(spec_file, overrides)
        return self.submit_packed(spec, packed, owner=owner)

    @overload
    def submit_packed(
        self,
        spec: JobSpec,
        packed: PackedWorkdir,
        *,
        owner: str | None = None,
        to: Literal["/jobs"] = "/jobs",
    ) -> Job: ...

    @overload
    def submit_packed(
        self, spec: JobSpec, packed: PackedWorkdir, *, owner: str | None = None, to: str
    ) -> Job | Search: ...

    def submit_packed(
        self, spec: JobSpec, packed: PackedWorkdir, *, owner: str | None = None, to: str = "/jobs"
    ) -> Job | Search:
        """Submit a spec and its packed workdir (``to``: ``/jobs``, or ``/searches`` for a
        spec with a ``search:`` block); returns what was made."""
        result: Job | Search = self._post_packed(spec, packed, owner, to)
        return result

    def jobs(
        self,
        *,
        all: bool = True,
        where: str | None = None,
        columns: str | list[str] | None = None,
        sort: str | None = None,
        order: str | None = None,
        project: str | None = None,
        tags: list[str] | None = None,
        archived: str = "exclude",
        owner: str | None = None,
        name: str | None = None,
        states: list[str] | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> JobList:
        """Every job the caller may see, newest first (``all=False``: only queued and running
        ones), with the runs table's filters: ``where`` (``"metrics.val_loss.min < 0.1 and
        hparams.lr >= 1e-3"``), ``columns`` (fields whose values each job carries in
        ``values``), ``sort``/``order``, ``project``, ``tags`` (every one), ``archived``
        ("exclude", "include", "only"), ``owner``, ``name`` (a substring), ``states``.
        ``limit``: at most this many (None: all, fetched ``page_size`` at a time).

        A :class:`~trainhouse.client.frames.JobList`: a list of job dicts with ``to_pandas()``."""
        params: dict[str, Any] = {"all": str(all).lower(), "archived": archived}
        if where:
            params["where"] = where
        if columns:
            params["columns"] = columns if isinstance(columns, str) else ",".join(columns)
        for key, value in (
            ("sort", sort),
            ("order", order),
            ("project", project),
            ("owner", owner),
            ("name", name),
        ):
            if value:
                params[key] = value
        if tags:
            params["tag"] = list(tags)
        if states:
            params["state"] = list(states)
        jobs: list[Job] = []
        total, shown = 0, list[str]()
        while limit is None or len(jobs) < limit:
            size = page_size if limit is None else min(page_size, limit - len(jobs))
            page: JobPage = self._json(
                "GET", "/jobs", params={**params, "limit": size, "offset": len(jobs)}
            )
            jobs += page["jobs"]
            total, shown = page["total"], page.get("columns") or []
            if len(page["jobs"]) < size or len(jobs) >= total:
                break
        return JobList(jobs, total=total, columns=shown)

    def job(self, job_id: int) -> JobDetail:
        result: JobDetail = self._json("GET", f"/jobs/{job_id}")
        return result

    def cancel(self, job_id: int) -> Job:
        result: Job = self._json("POST", f"/jobs/{job_id}/cancel")
        return result

    def resume(self, job_id: int) -> Job:
        """Send a canceled or failed job back to the queue, to continue from its latest
        checkpoint; returns the job (QUEUED, ``resumes`` counted). With auth off the server
        names this process's user as the one who resumed it."""
        result: Job = self._json("POST", f"/jobs/{job_id}/resume", json={"by": current_user()})
        return result

    def clone(
        self,
        job_id: int,
        *,
        overrides: list[str] | None = None,
        from_checkpoint: int | str | None = None,
    ) -> Job:
        """A new job with ``job_id``'s code and spec plus ``overrides`` (``--set`` items);
        ``from_checkpoint`` (a step or ``"latest"``) starts it from a copy of that
        checkpoint. Returns the new job."""
        body: dict[str, Any] = {"set": list(overrides or [])}
        if from_checkpoint is not None:
            body["from_checkpoint"] = str(from_checkpoint)
        # with a checkpoint, the server answers once it has copied it: minutes for a large one
        result: Job = self._json(
            "POST", f"/jobs/{job_id}/clone", json=body, extensions=file_work_wait(self._http)
        )
        return result

    def metrics(
        self,
        job_id: int,
        *,
        name: str | None = None,
        all_ranks: bool = False,
        max_points: int = 0,
        after_step: int | None = None,
    ) -> Metrics:
        """``{"job_id", "series": [{"name", "rank", "points": [[step, value, wall_time]],
        "total_points", "downsampled"}]}``, a :class:`~trainhouse.client.frames.Metrics` whose
        ``history()`` is a DataFrame of a row per step and a column per series and
        ``to_pandas()`` one of a row per point (pandas is an optional extra).

        ``max_points`` (>= 4; 0: all): a longer series comes downsampled by the server (its
        first and last points and each step bucket's smallest and largest value);
        ``after_step``: only points past it (to poll a live job incrementally).
        """
        params: dict[str, Any] = {"all_ranks": str(all_ranks).lower()}
        if name:
            params["name"] = name
        if max_points:
            params["max_points"] = max_points
        if after_step is not None:
            params["after_step"] = after_step
        data: JobMetrics = self._json("GET", f"/jobs/{job_id}/metrics", params=params)
        return Metrics(data)

    def metric_names(self, job_id: int, *, all_ranks: bool = True) -> list[SeriesInfo]:
        """The job's series without their points: ``[{"name", "rank", "points", "last_step"}]``."""
        params = {"all_ranks": str(all_ranks).lower()}
        page: SeriesList = self._json("GET", f"/jobs/{job_id}/metrics/names", params=params)
        return page["series"]

    def queue(self) -> Queue:
        result: Queue = self._json("GET", "/queue")
        return result

    def dry_run(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> DryRun:
        """Where the job would run now, or why it would wait; nothing is submitted."""
        from trainhouse.core.spec import load_spec

        spec = load_spec(Path(spec_file), overrides)
        result: DryRun = self._json(
            "POST",
            "/jobs/dry-run",
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
        )
        return result

    def set_tags(
        self, job_id: int, *, add: list[str] | None = None, remove: list[str] | None = None
    ) -> list[str]:
        """Add and remove a job's tags; its tags after."""
        body = {"add": add or [], "remove": remove or []}
        result: Tags = self._json("POST", f"/jobs/{job_id}/tags", json=body)
        return result["tags"]

    def set_note(self, job_id: int, note: str) -> Job:
        """Replace a job's note (markdown; "" clears it)."""
        result: Job = self._json("PUT", f"/jobs/{job_id}/note", json={"note": note})
        return result

    def set_project(self, job_id: int, project: str) -> Job:
        """Move a job to another project."""
        result: Job = self._json("PUT", f"/jobs/{job_id}/project", json={"project": project})
        return result

    def archive(self, job_id: int, *, archived: bool = True) -> Job:
        """Archive an ended job (out of the default list, kept), or bring it back."""
        result: Job = self._json("POST", f"/jobs/{job_id}/archive", json={"archived": archived})
        return result

    def delete(self, job_id: int, *, with_models: bool = False) -> Deleted:
        """Delete an ended job, its files and its rows, for good:
        ``{"job_id", "rows": {table: count}, "bytes_freed"}``. A job that registered model
        versions is refused unless ``with_models`` deletes them too."""
        params = {"with_models": "true"} if with_models else None
        result: Deleted = self._json("DELETE", f"/jobs/{job_id}", params=params)
        return result

    def run_columns(self) -> RunColumns:
        """What a runs table can show: ``{"hparams", "metrics", "projects", "tags"}``."""
        result: RunColumns = self._json("GET", "/runs/columns")
        return result

    def compare(self, job_ids: list[int], *, last: int = 10) -> Comparison:
        """The jobs' numbers per metric: ``{"job_ids", "last", "metrics": [{"name", "goal",
        "goal_from", "runs": [{"job_id", "final", "final_step", "best", "min", "max",
        "last_mean", "last_count"}]}]}`` (``best`` by the metric's goal; ``last_mean``: the
        mean of the last ``last`` points)."""
        params = {"ids": ",".join(map(str, job_ids)), "last": str(last)}
        result: Comparison = self._json("GET", "/runs/compare", params=params)
        return result

    def set_priority(self, job_id: int, priority: str) -> Job:
        result: Job = self._json("POST", f"/jobs/{job_id}/priority", json={"priority": priority})
        return result

    def wait(self, job_id: int, *, timeout: float | None = None, poll: float = 0.5) -> JobDetail:
        """Block until the job ends; returns its final record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout} s")
            time.sleep(poll)

    # -- resource monitoring ---------------------------------------------------------------
    def node_metrics(
        self,
        node: str,
        *,
        names: list[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        max_points: int | None = None,
    ) -> SystemMetrics:
        """A node's resource series; ``since``/``until`` negative = seconds before now."""
        params: dict[str, Any] = {"name": names or []}
        params.update(_window(since, until, max_points))
        result: SystemMetrics = self._json("GET", f"/nodes/{node}/metrics", params=params)
        return result

    def job_system(
        self,
        job_id: int,
        *,
        since: float | None = None,
        until: float | None = None,
        max_points: int | None = None,
    ) -> SystemMetrics:
        """A job's processes' resource series (CPU, RSS, GPU memory)."""
        result: SystemMetrics = self._json(
            "GET", f"/jobs/{job_id}/system", params=_window(since, until, max_points)
        )
        return result


def _window(since: float | None, until: float | None, max_points: int | None) -> dict[str, Any]:
    given = {"since": since, "until": until, "max_points": max_points}
    return {k: v for k, v in given.items() if v is not None}
