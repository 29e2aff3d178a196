"""Promotion: when a job with ``promote: {alias, metric, mode}`` completes, the version it
registered (or, with ``input:``, the version it read under that key) takes the alias if its
value of the metric beats the value of the version that holds the alias now.

Decided once per job, in one transaction that locks the model (no alias move interleaves):
the decision row, the alias move, the job's event and the audit entry commit together. A
server that died between the job's end and the decision makes it at start-up
(:meth:`trainhouse.store.flows.FlowRepo.undecided`).

The values compared: the candidate's is the job's own last value of the metric for an input it
measured, else the version's recorded metrics (``run.save_model(metrics=...)``), else the job's
last value. The holder's is the value that promoted it to this alias, else its recorded
metrics, else its job's last value. A value missing on either side is a recorded refusal.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from sqlalchemy.engine import Connection

from trainhouse.core.errors import FlowError, NotFound
from trainhouse.core.flows import compare
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Job, ModelVersion, Promotion
from trainhouse.core.spec.model import Promote
from trainhouse.store import Store

__all__ = ["decide", "held_value"]

log = logging.getLogger(__name__)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _candidate(store: Store, job: Job, promote: Promote) -> ModelVersion:
    if promote.input is not None:
        for pin in store.flows.inputs(job.id):
            if pin.key == promote.input:
                return store.models.version(pin.model, pin.version)
        raise FlowError(f"job {job.id} read no model under input {promote.input!r}")
    made = store.models.for_job(job.id)
    if promote.model is not None:
        made = [v for v in made if v.model == promote.model]
    if not made:
        what = f"no version of {promote.model!r}" if promote.model else "no model version"
        raise FlowError(f"job {job.id} registered {what} (run.save_model)")
    names = sorted({v.model for v in made})
    if len(names) > 1:
        raise FlowError(
            f"job {job.id} registered versions of {', '.join(names)}: name the one to promote "
            "with promote.model"
        )
    newest = made[-1]
    return store.models.version(newest.model, newest.version)


def _job_value(store: Store, job_id: int | None, metric: str) -> float | None:
    if job_id is None:
        return None
    try:
        return _number(store.jobs.get(job_id).latest_metrics.get(metric))
    except NotFound:
        return None


def held_value(
    store: Store, conn: Connection, model: str, holder: int, alias: str, metric: str
) -> float | None:
    """The value of ``metric`` of ``model@holder``, the version ``alias`` names: the value that
    promoted it to ``alias``, else its recorded metrics, else its job's last value."""
    value = store.flows.last_promoted_value(conn, model, holder, alias, metric)
    if value is not None:
        return value
    try:
        held = store.models.version(model, holder)
    except NotFound:
        return None
    value = _number(held.metrics.get(metric))
    return value if value is not None else _job_value(store, held.job_id, metric)


def decide(store: Store, job_id: int) -> Promotion | None:
    """Decide ``job_id``'s promotion if it completed and it is still undecided; the decision
    (None: nothing to decide)."""
    job = store.jobs.get(job_id)
    promote = job.spec.promote
    if job.state is not JobState.COMPLETED or promote is None:
        return None
    actor = f"job:{job.id}"
    with store.transaction() as conn:
        if store.flows.claim(conn, job.id) is None:
            return None  # decided already
        try:
            candidate = _candidate(store, job, promote)
        except (FlowError, NotFound) as exc:
            text = f"not promoted: {exc}"
            store.flows.decide(conn, job.id, promoted=False, decision=text, model=promote.model)
            store.jobs.add_event(job.id, text)
            store.accounts.audit(actor, "model.promote", None, ok=False, detail={"why": text})
            return store.flows.promotion(job.id)
        model, alias, metric = candidate.model, promote.alias, promote.metric
        holders = store.models.locked_aliases(conn, model)
        recorded = _number(candidate.metrics.get(metric))
        own = _job_value(store, job.id, metric)
        value = (
            (own if own is not None else recorded)
            if promote.input
            else (recorded if recorded is not None else own)
        )
        holder = holders.get(alias)
        if holder is not None and holder != candidate.version:
            held = held_value(store, conn, model, holder, alias, metric)
        else:
            held = None
        said = compare(
            alias=alias,
            metric=metric,
            mode=promote.mode,
            candidate=candidate.version,
            value=value,
            holder=holder,
            held_value=held,
        )
        if said.promoted:
            store.models.set_alias(model, alias, candidate.version)
        store.flows.decide(
            conn,
            job.id,
            model=model,
            version=candidate.version,
            value=value,
            previous_version=holder,
            previous_value=held,
            promoted=said.promoted,
            decision=f"{model}: {said.text}",
        )
        store.jobs.add_event(job.id, f"{model}: {said.text}")
        store.accounts.audit(
            actor,
            "model.promote" if said.promoted else "model.promote.kept",
            f"{model}@{alias}",
            detail={
                "version": candidate.version,
                "metric": metric,
                "value": value,
                "previous_version": holder,
                "previous_value": held,
                "decision": said.text,
            },
        )
    log.info("job %s: %s: %s", job.id, model, said.text)
    return store.flows.promotion(job.id)
