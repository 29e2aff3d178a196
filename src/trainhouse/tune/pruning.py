"""What a search's pruner is fed, off the request path: a trial's reports hand their objective
values to :class:`PruneFeed` (:meth:`PruneFeed.offer`, no Optuna write, no wait), which keeps
only the points the pruner reads, and one background thread writes those to Optuna and asks
the pruner. A report of 200,000 points costs the request a pass over its columns, and Optuna
a few writes; no pooled connection is held while Optuna's storage is busy.

What each pruner a spec may name reads (Optuna's ``optuna.pruners``), and so what is kept:

* ``asha`` (SuccessiveHalvingPruner) and ``hyperband`` (a SuccessiveHalvingPruner per bracket,
  each with rungs ``min_steps * reduction_factor ** (bracket + k)``): asked at step ``s``, the
  value at the trial's last step is recorded for every rung whose step is ``<= s`` and not yet
  recorded, and compared with the other trials' values there. Kept: the first reported step at
  or past each rung ``min_steps * reduction_factor ** k`` (the value the trial had when it
  reached the rung); the pruner is asked once per such step, in order, as if the steps had
  come one by one. Steps between rungs never change an answer.
* ``median`` (PercentilePruner(50)): asked at the trial's last step, it compares the trial's
  best value over all its steps with the completed trials' values at that step. Kept: the
  best value of what was offered since the last round, and the value at the latest step; the
  pruner is asked once per round.
* ``none``: nothing is kept.

Optuna's full history of a trial is still the job's stored metrics: ``SearchRunner`` writes it
when the trial ends (``_sync_history``), and the search's views read a running trial's curve
from the stored metrics.

Per trial at most :data:`MAX_PENDING` points wait (latest value per step); the thread drains
them as soon as it is woken. A report after a prune learns it from the job's
``prune_requested`` (``stop_reason``), on its next report or heartbeat.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainhouse.core.background import BackgroundLoop
from trainhouse.core.errors import InvalidTransition, NotFound, StoreError
from trainhouse.core.reports import Columns
from trainhouse.core.searchspec import EarlyStopping, SearchSpec
from trainhouse.store import Job, Store, Trial
from trainhouse.store.searches import TRIAL_ACTIVE

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from trainhouse.tune.runner import SearchRunner

__all__ = ["MAX_PENDING", "PruneFeed", "next_rung"]

log = logging.getLogger(__name__)

#: the most points one trial has waiting for the thread (rungs are fewer: 41 at 10**12 steps)
MAX_PENDING = 64


def next_rung(stop: EarlyStopping, step: int) -> int:
    """The first step after ``step`` at which the pruner could stop a trial it let through at
    ``step``: ASHA and Hyperband decide only where a trial reaches a rung (min_steps times a
    power of reduction_factor; Hyperband's brackets use some of those), the median rule at
    every step."""
    if stop.method == "median":
        return step + 1
    rung = stop.min_steps
    while rung <= step:
        rung *= stop.reduction_factor
    return rung


@dataclass
class _Waiting:
    """One trial's points waiting for the thread, and how far its offers have reached."""

    trial: Trial
    job_id: int
    spec: SearchSpec
    points: dict[int, float] = field(default_factory=dict)  # step -> its latest value
    reached: int = -1  # the highest step offered so far (rungs crossed)


def _better(spec: SearchSpec, a: float, b: float) -> bool:
    """Whether ``a`` is a better objective than ``b`` (NaN is never better)."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a < b if spec.mode == "min" else a > b


class PruneFeed(BackgroundLoop):
    """The pruner's feed: :meth:`offer` from the report paths, :meth:`tick` in its thread."""

    name = "trainhouse-prune"

    def __init__(self, runner: SearchRunner, store: Store, wake_scheduler: Callable[[], None]):
        super().__init__(None)  # runs when woken by an offer
        self.runner = runner
        self.store = store
        self.wake_scheduler = wake_scheduler
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._waiting: dict[int, _Waiting] = {}  # Optuna trial id -> its waiting points
        self._reached: dict[int, int] = {}  # Optuna trial id -> the highest step offered
        self._specs: dict[int, SearchSpec] = {}  # search id -> its spec.search
        self._busy = False

    # -- the report paths ------------------------------------------------------------------
    def offer(self, job: Job, columns: Columns) -> bool:
        """Hand a trial's reported objective values to the thread (no Optuna access, no wait);
        whether the trial is known to be pruned now."""
        trial = self.runner.trial_of(job)
        if trial is None or trial.state != TRIAL_ACTIVE:
            return False
        if job.prune_requested:
            return True
        spec = self._spec(trial.search_id)
        if spec is None or spec.early_stopping.method == "none":
            return False
        metric = spec.metric
        values: dict[int, float] = {}
        for step, name, value, rank in zip(
            columns.steps, columns.names, columns.values, columns.ranks, strict=True
        ):
            if name == metric and rank is None and value is not None and step >= 0:
                values[int(step)] = float(value)
        if not values:
            return False
        with self._lock:
            waiting = self._waiting.get(trial.trial_id)
            if waiting is None:
                waiting = _Waiting(
                    trial, job.id, spec, reached=self._reached.get(trial.trial_id, -1)
                )
                self._waiting[trial.trial_id] = waiting
            self._keep(waiting, values)
            self._reached[trial.trial_id] = waiting.reached
        self.wake()
        return False

    def _spec(self, search_id: int) -> SearchSpec | None:
        with self._lock:
            found = self._specs.get(search_id)
        if found is not None:
            return found
        try:
            search = self.store.searches.get(search_id)
        except NotFound:
            return None
        spec = search.spec.search
        if spec is not None:
            with self._lock:
                self._specs[search_id] = spec
        return spec

    @staticmethod
    def _keep(waiting: _Waiting, values: dict[int, float]) -> None:
        """Merge ``values`` into what waits, keeping only what the pruner reads (the module's
        docstring); held under the lock."""
        spec, points = waiting.spec, waiting.points
        stop = spec.early_stopping
        if stop.method == "median":
            latest = max(values)
            best = latest
            for step, value in values.items():
                if _better(spec, value, values[best]):
                    best = step
            points[latest] = values[latest]
            points[best] = values[best]
            if len(points) > 2:  # two rounds piled up: their best and their latest
                top = max(points)
                pick = top
                for step, value in points.items():
                    if _better(spec, value, points[pick]):
                        pick = step
                for step in [s for s in points if s not in (top, pick)]:
                    del points[step]
            waiting.reached = max(waiting.reached, latest)
            return
        reached = waiting.reached
        due = next_rung(stop, reached)
        for step in sorted(values):
            # a rung's first step, or a kept step again (its latest value)
            if step >= due or step in points:
                points[step] = values[step]
            if step > reached:
                reached = step
                if reached >= due:
                    due = next_rung(stop, reached)
        waiting.reached = reached
        while len(points) > MAX_PENDING:  # never with rungs; bounded all the same
            del points[min(points)]

    def forget(self, trial_id: int) -> None:
        """The trial ended: nothing of it waits or is remembered."""
        with self._lock:
            self._waiting.pop(trial_id, None)
            self._reached.pop(trial_id, None)

    def settle(self, timeout: float = 30.0) -> bool:
        """Wait until nothing waits and the thread is between rounds; whether it did."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._waiting and not self._busy, timeout)

    # -- the thread ------------------------------------------------------------------------
    def tick(self) -> None:
        with self._lock:
            taken, self._waiting = self._waiting, {}
            self._busy = bool(taken)
        try:
            for waiting in taken.values():
                try:
                    self._feed(waiting)
                except Exception:
                    log.exception("job %s: its pruner could not be fed", waiting.job_id)
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def _feed(self, waiting: _Waiting) -> None:
        """Write the waiting points to Optuna in step order, asking the pruner where it could
        answer yes (ASHA/Hyperband: at each kept step, each a rung; median: once, at the end);
        a trial it prunes is asked to stop."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        trial = waiting.trial
        try:
            job = self.store.jobs.get(waiting.job_id)
            entry = self.runner.opened(self.store.searches.get(trial.search_id))
        except NotFound:
            return
        if job.prune_requested or job.state.terminal:
            if job.state.terminal:  # an offer raced the trial's end: nothing kept of it
                with self._lock:
                    self._reached.pop(trial.trial_id, None)
            return
        stop = entry.spec.early_stopping
        storage = self.runner.storage
        steps = sorted(waiting.points)
        asks = steps if stop.method != "median" else steps[-1:]
        try:
            for step in steps:
                storage.set_trial_intermediate_value(trial.trial_id, step, waiting.points[step])
                if step not in asks:
                    continue
                frozen = storage.get_trial(trial.trial_id)
                if frozen.state is not TrialState.RUNNING:
                    return
                if entry.study.pruner.prune(entry.study, frozen):
                    self._prune(entry.spec, trial, job, frozen.last_step or step, frozen)
                    return
        except UpdateFinishedTrialError:
            return

    def _prune(
        self, spec: SearchSpec, trial: Trial, job: Job, last: int, frozen: FrozenTrial
    ) -> None:
        value = frozen.intermediate_values.get(last, float("nan"))
        reason = (
            f"pruned at step {last} by {spec.early_stopping.method} ({spec.metric} {value:.6g})"
        )
        try:
            self.store.jobs.update(job.id, prune_requested=True, reason=reason)
            self.store.jobs.add_event(job.id, reason)
        except (NotFound, StoreError, InvalidTransition):
            return
        log.info("job %s (search %s trial %s): %s", job.id, trial.search_id, trial.number, reason)
        self.wake_scheduler()
