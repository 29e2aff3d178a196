"""The searches' background service: it asks Optuna for trials, turns them into jobs, and tells
Optuna how each trial ended; the pruner is fed by its :class:`~trainhouse.tune.pruning.PruneFeed`
(``prunes``), off the request path.

Two stores, no transaction across them: Optuna's trials (its own tables) and trainhouse's
(``search_trials`` rows, each written in one transaction with its job). Every tick derives what
to do from both, so that a server killed at any point loses and duplicates nothing:

==========================================  ==================================================
killed after ...                            the next server's tick
==========================================  ==================================================
Optuna created a trial (``ask``), before    adopts it: the trial's values (the missing ones
its row and job were written               sampled now) become its row and job; no new ask
the row and job were written                nothing to mend: the job runs like any other
Optuna was told how a trial ended, before   the job has ended and the row is ACTIVE: tells
the row said so                             again (skipped, Optuna has it) and ends the row
a trial's steps were reported               the same steps again overwrite the same values
                                            (Optuna keeps one value per step)
a power loss took back Optuna's last        the row ended and Optuna's trial RUNNING: told
writes (its file is synced NORMAL)          again from the row (:meth:`SearchRunner._mend`)
==========================================  ==================================================

A preempted (or restarted) trial is the same job, so it stays the same Optuna trial; the
steps its resumed attempt reports again replace the values of those steps, and the pruner's
history holds each step once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.errors import NotFound
from trainhouse.core.lifecycle import JobState
from trainhouse.core.reports import Columns
from trainhouse.core.searchspec import (
    Distribution,
    SearchSpec,
    distributions,
    fill,
)
from trainhouse.store import Job, Search, Store, Trial
from trainhouse.store.searches import TRIAL_ACTIVE
from trainhouse.tune import study as studies
from trainhouse.tune.pruning import PruneFeed, next_rung

if TYPE_CHECKING:
    import optuna

__all__ = ["SearchRunner", "next_rung", "trial_spec"]

log = logging.getLogger(__name__)


def trial_spec(search: Search, number: int, params: dict[str, Any]) -> Any:
    """The job spec of trial ``number``: the search's, with sampled hparams and no search."""
    spec = search.spec
    data = spec.model_dump(mode="json")
    data.pop("search", None)
    data["hparams"] = fill(spec.hparams, params)
    data["name"] = f"{spec.name[:110]}-t{number}"
    return type(spec).model_validate(data)


@dataclass
class _Open:
    """A search the service has opened: its study and what its reports need."""

    search: Search
    spec: SearchSpec
    space: dict[str, Distribution]
    study: optuna.Study
    lock: threading.Lock


class SearchRunner(BackgroundLoop):
    """Runs every search: a tick adds trials, reconciles both stores and ends searches."""

    name = "trainhouse-tune"

    def __init__(
        self,
        store: Store,
        *,
        db_url: str,
        home: Path,
        wake_scheduler: Callable[[], None],
        interval: float = 0.5,
    ) -> None:
        super().__init__(interval)
        self.store = store
        self.db_url = db_url
        self.home = home
        self.wake_scheduler = wake_scheduler
        self._storage: optuna.storages.BaseStorage | None = None
        self._open: dict[int, _Open] = {}
        self._lock = threading.Lock()
        self._trials: dict[int, Trial | None] = {}  # job id -> its trial (None: a plain job)
        # the pruner's feed: reports hand it their values, its thread writes to Optuna
        self.prunes = PruneFeed(self, store, wake_scheduler)

    def on_stop(self) -> None:
        """Close Optuna's connections (its engine is the storage's own)."""
        with self._lock:
            storage, self._storage = self._storage, None
            self._open.clear()
        backend = getattr(storage, "_backend", storage)
        engine = getattr(backend, "engine", None)
        if engine is not None:
            engine.dispose()

    # -- Optuna ----------------------------------------------------------------------------
    @property
    def storage(self) -> optuna.storages.BaseStorage:
        with self._lock:
            if self._storage is None:
                self._storage = studies.optuna_storage(self.db_url, self.home)
            return self._storage

    def opened(self, search: Search) -> _Open:
        """The search's study (created on first use), kept open."""
        with self._lock:
            found = self._open.get(search.id)
        if found is not None:
            if found.search.state != search.state:
                found.search = search
            return found
        import optuna

        spec = search.spec
        assert spec.search is not None
        opened_study = optuna.create_study(
            storage=self.storage,
            study_name=search.study,
            direction="minimize" if spec.search.mode == "min" else "maximize",
            pruner=studies.pruner(spec.search),
            load_if_exists=True,
        )
        entry = _Open(
            search, spec.search, distributions(spec.hparams), opened_study, threading.Lock()
        )
        with self._lock:
            return self._open.setdefault(search.id, entry)

    def limit(self, entry: _Open) -> int:
        """How many trials the search runs: max_trials, or the grid's size when smaller."""
        if entry.spec.method != "grid":
            return entry.spec.max_trials
        size = 1
        for dist in entry.space.values():
            size *= len(dist.grid() or [])
        return min(size, entry.spec.max_trials)

    # -- the tick --------------------------------------------------------------------------
    def tick(self) -> None:
        searches = self.store.searches.list(states=["RUNNING"])
        running = {s.id for s in searches}
        with self._lock:
            stale = [i for i in self._open if i not in running]
        ending = self.store.searches.ending()
        for search_id in set(stale) - {s.id for s in ending}:  # ended: its study is closed
            with self._lock:
                self._open.pop(search_id, None)
        for search in searches + ending:
            try:
                self.advance(search)
            except Exception:
                log.exception("search %s: a tick failed", search.id)

    def advance(self, search: Search) -> None:
        """One round for ``search``: end trials whose jobs ended, adopt or ask trials, end the
        search when every trial has ended."""
        entry = self.opened(search)
        with entry.lock:
            trials = self.store.searches.trials(search.id)
            active = [t for t in trials if t.state == TRIAL_ACTIVE]
            jobs = self.store.jobs.get_many(t.job_id for t in active)
            for trial in active:
                job = jobs.get(trial.job_id)
                if job is not None and job.state.terminal:
                    self._finish(entry, trial, job)
            still = [
                t for t in active if (j := jobs.get(t.job_id)) is not None and not j.state.terminal
            ]
            if search.state == "CANCELED":
                for trial in still:
                    job = jobs[trial.job_id]
                    if not job.cancel_requested:
                        self.store.jobs.cancel(job.id)  # a queued trial ends now
                        self.wake_scheduler()
                if not still:
                    with self._lock:
                        self._open.pop(search.id, None)
                return
            if search.state != "RUNNING":
                with self._lock:
                    self._open.pop(search.id, None)
                return
            added = self._fill(entry, {t.number: t for t in trials}, len(still))
            if added:
                self.wake_scheduler()
            if not still and not added and len(trials) >= self.limit(entry):
                self.store.searches.end(search.id, "COMPLETED", self._summary(entry))

    def _fill(self, entry: _Open, known: dict[int, Trial], running: int) -> int:
        """Adopt Optuna's trials that have no job, tell Optuna again how the ended ones ended
        where it lost that (:meth:`_mend`), then ask for new trials while the search has room;
        how many jobs were added."""
        import optuna

        study = entry.study
        added = 0
        existing = study.get_trials(deepcopy=False)
        for frozen in existing:
            if frozen.number in known:
                row = known[frozen.number]
                if frozen.state is optuna.trial.TrialState.RUNNING and row.state != TRIAL_ACTIVE:
                    self._mend(entry, row)
                continue
            if frozen.state is optuna.trial.TrialState.RUNNING:  # asked, then the server died
                trial = optuna.trial.Trial(study, frozen._trial_id)
                if self._add(entry, trial, adopted=True):
                    added += 1
                    running += 1
            else:  # ended without a job: never happens through trainhouse; say so
                log.warning(
                    "search %s: Optuna trial %s is %s without a job; left as it is",
                    entry.search.id,
                    frozen.number,
                    frozen.state.name,
                )
        total = len(existing)
        while running < entry.spec.max_concurrent and total < self.limit(entry):
            study.sampler = studies.sampler(entry.spec, entry.space, total)
            trial = study.ask()
            total += 1
            if self._add(entry, trial, adopted=False):
                added += 1
                running += 1
        return added

    def _add(self, entry: _Open, trial: optuna.trial.Trial, *, adopted: bool) -> bool:
        study = entry.study
        if adopted:  # the values it had, and the ones the old server had no time to sample
            study.sampler = studies.sampler(entry.spec, entry.space, trial.number)
        params = {name: studies.suggest(trial, name, d) for name, d in entry.space.items()}
        spec = trial_spec(entry.search, trial.number, params)
        row = self.store.searches.add_trial(
            entry.search, number=trial.number, trial_id=trial._trial_id, params=params, spec=spec
        )
        if row is not None:
            log.info(
                "search %s: trial %s is job %s%s",
                entry.search.id,
                trial.number,
                row.job_id,
                " (adopted after a restart)" if adopted else "",
            )
        return row is not None

    def _mend(self, entry: _Open, row: Trial) -> None:
        """Optuna's file is synced NORMAL (a write survives the server's crash, not a power
        loss) and trainhouse's FULL: a power loss can take back Optuna's record of how a trial
        ended while its row kept it. Told again from the row (its pruner history from the
        job's stored metrics), the trial never stays RUNNING in the study."""
        from optuna.trial import TrialState

        told = {"COMPLETED": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED}.get(
            row.state, TrialState.FAIL
        )
        with contextlib.suppress(NotFound):  # its job deleted: the history is Optuna's
            self._sync_history(
                entry, row, self.store.jobs.get(row.job_id), pruned=told is TrialState.PRUNED
            )
        entry.study.sampler = studies.neutral_sampler()
        entry.study.tell(
            row.number,
            row.value if told is TrialState.COMPLETE else None,
            state=told,
            skip_if_finished=True,
        )
        log.warning(
            "search %s: Optuna had lost how trial %s ended (%s); told again from its row",
            entry.search.id,
            row.number,
            row.state,
        )

    def _finish(self, entry: _Open, trial: Trial, job: Job) -> None:
        """Tell Optuna how ``trial`` ended (unless it knows) and end its row."""
        from optuna.trial import TrialState

        metric = entry.spec.metric
        value = job.latest_metrics.get(metric)
        if job.prune_requested:
            state, told = "PRUNED", TrialState.PRUNED
        elif job.state is JobState.COMPLETED and value is not None:
            state, told = "COMPLETED", TrialState.COMPLETE
        else:
            state, told = "FAILED", TrialState.FAIL
        if job.state is JobState.COMPLETED and metric not in job.latest_metrics:
            logged = ", ".join(sorted(job.latest_metrics)) or "no metrics"
            self.store.searches.warn_once(
                entry.search.id,
                f"search.metric {metric!r} was never logged by trial {trial.number} "
                f"(job {job.id}, which logged {logged}); its trials are counted as FAILED",
            )
        self._sync_history(entry, trial, job, pruned=job.prune_requested)
        entry.study.sampler = studies.neutral_sampler()
        entry.study.tell(
            trial.number,
            value if told is TrialState.COMPLETE else None,
            state=told,
            skip_if_finished=True,
        )
        frozen = self.storage.get_trial(trial.trial_id)
        final = frozen.value if frozen.state is TrialState.COMPLETE else None
        if frozen.state is TrialState.PRUNED:
            final = frozen.value
        self.store.searches.finish_trial(trial.search_id, trial.number, state, final)
        with self._lock:
            self._trials.pop(job.id, None)
        self.prunes.forget(trial.trial_id)

    def _sync_history(self, entry: _Open, trial: Trial, job: Job, *, pruned: bool) -> None:
        """Before Optuna is told, its history of the trial is made the job's: steps stored
        without passing the report route (spooled while the server was down, ingested when the
        attempt ended) are added, re-reported ones are as stored. A pruned trial's history
        stops at the step it was pruned at."""
        from optuna.trial import TrialState

        frozen = self.storage.get_trial(trial.trial_id)
        if frozen.state is not TrialState.RUNNING:
            return
        until = frozen.last_step if pruned and frozen.last_step is not None else None
        stored = self.store.metrics.points(job.id, name=entry.spec.metric, rank=-1)
        for point in stored:
            if point.value is None or (until is not None and point.step > until):
                continue
            if frozen.intermediate_values.get(point.step) != point.value:
                self.storage.set_trial_intermediate_value(trial.trial_id, point.step, point.value)

    def _summary(self, entry: _Open) -> str:
        trials = self.store.searches.trials(entry.search.id)
        done = [t for t in trials if t.state == "COMPLETED" and t.value is not None]
        if not done:
            return f"{len(trials)} trials ended; none completed with {entry.spec.metric}"
        pick = min if entry.spec.mode == "min" else max
        best = pick(done, key=lambda t: t.value or 0.0)
        return (
            f"{len(trials)} trials ended; best: trial {best.number} (job {best.job_id}) "
            f"{entry.spec.metric}={best.value:.6g}"
        )

    # -- reports ---------------------------------------------------------------------------
    def trial_of(self, job: Job) -> Trial | None:
        if job.search_id is None:
            return None
        with self._lock:
            if job.id in self._trials:
                return self._trials[job.id]
        trial = self.store.searches.trial_of_job(job.id)
        with self._lock:
            self._trials[job.id] = trial
        return trial

    def on_report(self, job: Job, columns: Columns) -> bool:
        """Hand a trial's reported objective values to its search's pruner, off the request
        path (:class:`trainhouse.tune.pruning.PruneFeed`: no Optuna write here, no wait);
        whether the trial is known to be pruned now. A prune decided from these values is
        the job's ``prune_requested``, which its next report or heartbeat answers with."""
        return self.prunes.offer(job, columns)
