"""The runs table's writes and helpers: tags, notes, archiving, deleting a job, the columns a
table can show, the hparams a run reports it used (with the spec's keys it never reads), and
the compare page's numbers (:func:`compare`: each run's final, best and last-N mean per metric).

The list itself is :func:`trainhouse.usecases.jobs.page` (``where``, ``columns``, ``sort``,
``project``, ``tags``, ``archived``). Archiving and deleting are audited, each in the
transaction of its change; tags, notes, projects and reported hparams are not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhouse.core.errors import InvalidQuery, NotFound, StoreError
from trainhouse.core.metricnames import goal_from_name
from trainhouse.core.records import Job
from trainhouse.core.runquery import suggest
from trainhouse.core.spec import check_tags
from trainhouse.core.spec.model import PROJECT_PATTERN, check_reported_hparams
from trainhouse.jobfs import jobfiles
from trainhouse.usecases import audit, callers, models
from trainhouse.usecases.access import Principal
from trainhouse.usecases.runtime import Runtime

log = logging.getLogger(__name__)

__all__ = [
    "Deleted",
    "Hparams",
    "archive",
    "change_tags",
    "columns",
    "compare",
    "delete",
    "report_hparams",
    "set_note",
    "set_project",
]


def columns(rt: Runtime, p: Principal) -> dict[str, list[str]]:
    """What the runs table can show: hparam keys and metric series jobs have (the most common
    first; with ``--job-visibility list``, from the caller's own jobs unless an admin), the
    projects and the tags."""
    visibility = rt.settings.job_visibility
    private = None if p.is_admin or visibility == "all" else p.name
    return rt.store.runs.names(private=private)


def change_tags(rt: Runtime, job: Job, *, add: list[str], remove: list[str]) -> list[str]:
    """Add and remove tags of ``job`` (one the caller may write); its tags after."""
    try:
        added = check_tags(add)
        removed = check_tags(remove)
    except ValueError as e:
        raise InvalidQuery(str(e)) from None
    return rt.store.runs.change_tags(job.id, add=added, remove=removed)


def set_project(rt: Runtime, job: Job, project: str) -> Job:
    """Move ``job`` (one the caller may write) to ``project`` (a name as a spec's
    ``project:`` takes); the job after. Its spec keeps the project it was submitted with."""
    if len(project) > 128 or not re.fullmatch(PROJECT_PATTERN, project):
        raise InvalidQuery(
            f"a project is 1 to 128 letters, digits, '.', '_' or '-' (a letter or digit first), "
            f"got {project[:140]!r}"
        )
    rt.store.runs.set_project(job.id, project)
    return rt.store.jobs.get(job.id)


def set_note(rt: Runtime, job: Job, note: str) -> Job:
    """Replace the note of ``job`` (one the caller may write; markdown, an empty one clears
    it); the job after."""
    rt.store.runs.set_note(job.id, note)
    return rt.store.jobs.get(job.id)


def archive(rt: Runtime, p: Principal, job: Job, archived: bool) -> Job:
    """Archive an ended ``job`` (kept, left out of the default list), or bring it back."""
    if archived and not job.state.terminal:
        raise StoreError(f"job {job.id} is {job.state}: only an ended job can be archived")
    with rt.store.transaction():
        rt.store.runs.set_archived(job.id, archived)
        action = "job.archive" if archived else "job.unarchive"
        audit.record(rt, p, action, f"job:{job.id}", owner=job.owner, name=job.name)
    return rt.store.jobs.get(job.id)


def _tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (no link followed)."""
    total = 0
    for top, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


@dataclass(frozen=True)
class Deleted:
    """A job deleted: the rows it took with it, by table, and the bytes of its files."""

    job_id: int
    rows: dict[str, int]
    bytes_freed: int


def delete(rt: Runtime, p: Principal, job: Job, *, with_models: bool = False) -> Deleted:
    """Delete an ended ``job`` (one the caller may write) for good: its checkpoints kept
    apart (``--checkpoint-url``) first, then every row of it with the audit entry in one
    transaction, then its directory (logs, checkpoints). A job not ended is refused: cancel it
    first. The files of the model versions it registered lie in its storage: a job with
    versions is refused (409, naming them) unless ``with_models`` deletes them first, each as
    ``models delete`` would (refused, and nothing deleted, while an alias names one, a service
    uses one or one is another user's model)."""
    if not job.state.terminal:
        raise StoreError(
            f"job {job.id} is {job.state}: only an ended job can be deleted (cancel it first)"
        )
    versions = rt.store.models.for_job(job.id)
    if versions:
        named = ", ".join(f"{v.model}@{v.version}" for v in versions)
        if not with_models:
            raise StoreError(
                f"job {job.id} registered the model version(s) {named}, whose files are in its "
                f"storage: `trainhouse delete {job.id} --with-models` deletes them with it"
            )
        for v in versions:  # every one checked before any is deleted
            models.check_deletable(rt, p, v.model, v.version)
        for v in versions:
            models.delete_version(rt, p, v.model, v.version)
    files = rt.files(job.id)
    freed = _tree_size(files.root) if files.root.is_dir() else 0
    if rt.checkpoints.base is not None:  # checkpoints kept apart from the job's directory
        storage = rt.checkpoints.storage(job.id)
        with contextlib.suppress(OSError, FileNotFoundError):
            freed += storage.size("")
        for name in storage.list(""):
            try:
                storage.delete(name)
            except OSError as exc:
                log.warning("job %s: checkpoint file %s not deleted: %s", job.id, name, exc)
    with rt.store.transaction():
        rows = rt.store.runs.delete(job.id)
        audit.record(rt, p, "job.delete", f"job:{job.id}", owner=job.owner, name=job.name)
    jobfiles.remove(rt.settings.home, files.root)
    return Deleted(job_id=job.id, rows=rows, bytes_freed=freed)


@dataclass(frozen=True)
class Hparams:
    """The spec's hparams keys the script does not declare, and the warning said of each."""

    unread: list[str]
    warnings: list[str]


def report_hparams(
    rt: Runtime, job: Job, hparams: dict[str, Any], script_keys: list[str] | None
) -> Hparams:
    """What the SDK reports at ``init()`` and on ``run.set_hparams`` (with the job's
    credential): the hparams the run uses now. A key the spec (or ``--set``) gave that the
    script does not declare among its defaults (``script_keys``) is noted once as an event,
    with the closest declared key."""
    try:
        check_reported_hparams(hparams)
    except ValueError as e:
        raise InvalidQuery(str(e)) from None
    rt.store.runs.set_hparams(job.id, hparams)
    unread: list[str] = []
    warnings: list[str] = []
    if script_keys:
        declared = sorted(set(script_keys))
        unread = [k for k in job.spec.hparams if k not in declared]
        for key in unread:
            warnings.append(
                f"warning: hparams.{key} was set but the script's hparams are: "
                f"{', '.join(declared[:20])}{', ...' if len(declared) > 20 else ''}"
                f"{suggest(key, declared)}"
            )
        seen = {e.reason for e in rt.store.jobs.events(job.id)}
        for text in warnings:
            if text not in seen:  # once, not at every attempt
                rt.store.jobs.add_event(job.id, text)
    return Hparams(unread=unread, warnings=warnings)


# -- compare ---------------------------------------------------------------------------------
MAX_COMPARED = 50  # jobs in one comparison
DEFAULT_LAST = 10  # points the last-N mean is of
MAX_LAST = 100_000


def _goals(rt: Runtime, jobs: list[Job]) -> dict[str, tuple[str, str]]:
    """The metrics whose goal the jobs state, ``name -> (mode, source)``: the metric a search
    optimises (its trials'), then the one ``checkpoints:`` ranks by (``keep_best``); of two
    jobs that disagree, the first compared."""
    found: dict[str, tuple[str, str]] = {}
    searched: dict[int, tuple[str, str] | None] = {}
    for job in jobs:
        if job.search_id is None:
            continue
        if job.search_id not in searched:
            try:
                spec = rt.store.searches.get(job.search_id).spec.search
            except (NotFound, ValueError):  # gone, or a spec this version no longer reads
                spec = None
            searched[job.search_id] = None if spec is None else (spec.metric, spec.mode)
        target = searched[job.search_id]
        if target is not None:
            found.setdefault(target[0], (target[1], f"search {job.search_id}'s metric"))
    for job in jobs:
        try:
            policy = job.spec.checkpoints
        except ValueError:
            continue
        if policy.metric:
            found.setdefault(policy.metric, (policy.mode, f"job {job.id}'s checkpoints.metric"))
    return found


def compare(
    rt: Runtime, p: Principal, job_ids: list[int], *, last: int = DEFAULT_LAST
) -> dict[str, Any]:
    """Each job's own series in numbers, per metric: the final value (at the last step), the
    best, the smallest and the largest, and the mean of the last ``last`` points.

    "best" follows the metric's goal: the one a search of these jobs optimises, the one their
    ``checkpoints.metric`` ranks by, or else the one its name suggests
    (:func:`~trainhouse.core.metricnames.goal_from_name`: loss, error -> min; accuracy, F1 ->
    max); each metric says which (``goal``, ``goal_from``), and has no best when none is known
    (``goal`` null: min and max are there). Every job must be one ``p`` may read."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        raise InvalidQuery("name the jobs to compare: ids=1,2")
    if len(ids) > MAX_COMPARED:
        raise InvalidQuery(f"at most {MAX_COMPARED} jobs can be compared at once, not {len(ids)}")
    if not 1 <= last <= MAX_LAST:
        raise InvalidQuery(f"last must be between 1 and {MAX_LAST}, not {last}")
    jobs = [callers.readable_job(rt, p, i) for i in ids]
    goals = _goals(rt, jobs)
    metrics: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        for s in rt.store.metrics.summaries(job.id, last=last):
            metrics.setdefault(s.name, []).append(
                {
                    "job_id": job.id,
                    "final": s.last_value,
                    "final_step": s.last_step,
                    "min": s.min_value,
                    "max": s.max_value,
                    "last_mean": s.tail_mean,
                    "last_count": s.tail_count,
                }
            )
    out = []
    for name in sorted(metrics):
        goal, source = goals.get(name, (None, None))
        if goal is None:
            goal = goal_from_name(name)
            source = None if goal is None else "its name"
        for run in metrics[name]:
            run["best"] = None if goal is None else run[goal]
        out.append({"name": name, "goal": goal, "goal_from": source, "runs": metrics[name]})
    return {"job_ids": ids, "last": last, "metrics": out}
