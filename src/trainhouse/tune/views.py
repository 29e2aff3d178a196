"""What the API shows of a search: its trials merged from both stores, the best trial, the
objective curves and the hparam importances."""

from __future__ import annotations

import math
from typing import Any

from trainhouse.core.lifecycle import JobState
from trainhouse.store import Job, Search, Store, Trial
from trainhouse.store.searches import TRIAL_ACTIVE
from trainhouse.tune.runner import SearchRunner

__all__ = ["best", "curves", "importances", "search_summary", "search_view", "trial_state"]

TRIAL_STATES = ("QUEUED", "RUNNING", "COMPLETED", "PRUNED", "FAILED")
MIN_IMPORTANCE_TRIALS = 4  # completed trials before importances are computed


def trial_state(trial: Trial, job: Job | None) -> str:
    """QUEUED | RUNNING | COMPLETED | PRUNED | FAILED: ended trials by their row, the others
    by their job (a trial being pruned is PRUNED at once)."""
    if trial.state != TRIAL_ACTIVE:
        return trial.state
    if job is None:
        return "FAILED"
    if job.prune_requested:
        return "PRUNED"
    return "RUNNING" if job.state is JobState.RUNNING else "QUEUED"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def search_summary(search: Search, counts: dict[str, int] | None = None) -> dict[str, Any]:
    spec = search.spec
    assert spec.search is not None
    return {
        "id": search.id,
        "name": search.name,
        "owner": search.owner,
        "state": search.state,
        "reason": search.reason,
        "warning": search.warning,
        "method": spec.search.method,
        "metric": spec.search.metric,
        "mode": spec.search.mode,
        "early_stopping": spec.search.early_stopping.method,
        "max_trials": spec.search.max_trials,
        "max_concurrent": spec.search.max_concurrent,
        "created_at": search.created_at,
        "ended_at": search.ended_at,
        "trial_counts": counts or {},
    }


def _intermediate(
    store: Store, tune: SearchRunner, search: Search, trials: list[Trial]
) -> dict[int, dict[int, float]]:
    """Each trial's reported objective values by step: an ended trial's from Optuna's study
    (its history was made the job's when it ended), a running one's from the job's stored
    metrics (Optuna holds only what its pruner reads until then: trainhouse.tune.pruning)."""
    from optuna.trial import TrialState

    assert search.spec.search is not None
    metric = search.spec.search.metric
    jobs = {t.number: t.job_id for t in trials}
    entry = tune.opened(search)
    found: dict[int, dict[int, float]] = {}
    for frozen in entry.study.get_trials(deepcopy=False):
        job_id = jobs.get(frozen.number)
        if frozen.state is not TrialState.RUNNING or job_id is None:
            found[frozen.number] = dict(frozen.intermediate_values)
            continue
        points = store.metrics.points(job_id, name=metric, rank=-1)
        found[frozen.number] = {p.step: p.value for p in points if p.value is not None}
    return found


def search_view(store: Store, tune: SearchRunner, search: Search) -> dict[str, Any]:
    """The search with each trial (job, state, hparams, latest/best objective) and the best."""
    spec = search.spec
    assert spec.search is not None
    trials = store.searches.trials(search.id)
    jobs = store.jobs.get_many(t.job_id for t in trials)
    curves = _intermediate(store, tune, search, trials)
    pick = min if spec.search.mode == "min" else max
    rows = []
    counts = dict.fromkeys(TRIAL_STATES, 0)
    for trial in trials:
        job = jobs.get(trial.job_id)
        state = trial_state(trial, job)
        counts[state] += 1
        curve = curves.get(trial.number, {})
        values = [v for v in curve.values() if _finite(v) is not None]
        latest = curve[max(curve)] if curve else None
        started = job.started_at if job is not None else None
        ended = job.ended_at if job is not None else None
        rows.append(
            {
                "number": trial.number,
                "job_id": trial.job_id,
                "state": state,
                "params": trial.params,
                "value": _finite(trial.value),
                "latest": _finite(latest),
                "best": pick(values) if values else None,
                "last_step": max(curve) if curve else None,
                "steps_reported": len(curve),
                "reason": job.reason if job is not None and state != "QUEUED" else None,
                "started_at": started,
                "ended_at": ended,
                "duration": (ended - started) if started and ended else None,
            }
        )
    view = search_summary(search, counts)
    view["spec"] = search.spec_data
    view["trials"] = rows
    view["best"] = best_trial(rows, spec.search.mode)
    return view


def best_trial(rows: list[dict[str, Any]], mode: str) -> dict[str, Any] | None:
    done = [r for r in rows if r["state"] == "COMPLETED" and r["value"] is not None]
    if not done:
        return None
    pick = min if mode == "min" else max
    return pick(done, key=lambda r: r["value"])


def best(store: Store, tune: SearchRunner, search: Search) -> dict[str, Any] | None:
    """The best completed trial: its hparams (the job's, sampled ones filled in) and its best
    checkpoint (by the search's metric when checkpoints carry it, else the newest)."""
    view = search_view(store, tune, search)
    top = view["best"]
    if top is None:
        return None
    spec = search.spec
    assert spec.search is not None
    job = store.jobs.get(top["job_id"])
    checkpoints = [c for c in store.checkpoints.list(job.id) if not c.deleted and not c.corrupt]
    metric = spec.search.metric
    scored = [c for c in checkpoints if _finite(c.metrics.get(metric)) is not None]
    chosen = None
    if scored:
        pick = min if spec.search.mode == "min" else max
        chosen = pick(scored, key=lambda c: c.metrics[metric] or 0.0)
    elif checkpoints:
        chosen = max(checkpoints, key=lambda c: c.step)
    return {
        "search_id": search.id,
        "trial": top["number"],
        "job_id": job.id,
        "metric": metric,
        "value": top["value"],
        "params": top["params"],
        "hparams": job.spec.hparams,
        "checkpoint": (
            {
                "id": chosen.id,
                "step": chosen.step,
                "path": chosen.path,
                "metrics": chosen.metrics,
                "digest": chosen.sha256,
                "algorithm": chosen.algorithm,
            }
            if chosen is not None
            else None
        ),
    }


def curves(store: Store, tune: SearchRunner, search: Search) -> list[dict[str, Any]]:
    """Each trial's objective by step (what the pruner saw), with its state."""
    trials = store.searches.trials(search.id)
    jobs = store.jobs.get_many(t.job_id for t in trials)
    values = _intermediate(store, tune, search, trials)
    return [
        {
            "number": t.number,
            "job_id": t.job_id,
            "state": trial_state(t, jobs.get(t.job_id)),
            "steps": sorted(values.get(t.number, {})),
            "values": [_finite(values[t.number][s]) for s in sorted(values.get(t.number, {}))],
        }
        for t in trials
    ]


def importances(tune: SearchRunner, search: Search) -> dict[str, Any]:
    """Optuna's hparam importances once enough trials completed (``None`` before)."""
    import optuna

    entry = tune.opened(search)
    done = entry.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < MIN_IMPORTANCE_TRIALS or len(entry.space) < 1:
        return {"importances": None, "completed": len(done), "needed": MIN_IMPORTANCE_TRIALS}
    result = optuna.importance.get_param_importances(entry.study)
    return {
        "importances": {k: float(v) for k, v in result.items()},
        "completed": len(done),
        "needed": MIN_IMPORTANCE_TRIALS,
    }
