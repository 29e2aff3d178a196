"""Following a job live: a progress bar with step, latest loss, steps/s and state."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from trainhouse.cli.render import console, fmt_value, state
from trainhouse.client import Client
from trainhouse.core.lifecycle import TERMINAL

if TYPE_CHECKING:
    from trainhouse.client.records import Job, JobDetail


def _headline_metric(latest: dict[str, float | None]) -> str:
    if not latest:
        return ""
    for key in ("loss", "train_loss", "val_loss"):
        if key in latest:
            return f"{key} {fmt_value(latest[key])}"
    key = sorted(latest)[0]
    return f"{key} {fmt_value(latest[key])}"


def _waiting(job: Job) -> str:
    """Why a queued job waits, shortened for the progress line."""
    why = job.get("reason")
    if job["state"] != "QUEUED" or not why:
        return ""
    reason = why.splitlines()[0]
    return f" ({reason[:90]}...)" if len(reason) > 90 else f" ({reason})"


def _starting(job: JobDetail) -> str:
    """What a running job does before its first step: staging its datasets (with its
    percentage), setting up its environment."""
    if job["state"] != "RUNNING" or job.get("last_step") is not None:
        return ""
    staging = job.get("staging") or ""
    if staging and ": ready in" not in staging:
        return f" ({staging})"
    environment = job.get("environment") or ""
    return f" ({environment})" if environment.startswith("setting up") else ""


class Follower:
    """Polls a job and keeps a progress bar and a line per state change up to date."""

    def __init__(
        self, client: Client, job_id: int, *, poll: float = 0.5, out: Console = console
    ) -> None:
        self.client = client
        self.out = out
        self.job_id = job_id
        self.poll = poll
        self._rate = 0.0
        self._last: tuple[float, int] | None = None
        self._seen_events = 0

    def _steps_per_second(self, step: int | None) -> float:
        now = time.monotonic()
        if step is None:
            return self._rate
        if self._last is not None and step > self._last[1] and now > self._last[0]:
            inst = (step - self._last[1]) / (now - self._last[0])
            self._rate = inst if self._rate == 0 else 0.7 * self._rate + 0.3 * inst
            self._last = (now, step)
        elif self._last is None or step < self._last[1]:
            self._last = (now, step)
        return self._rate

    def _print_events(self, progress: Progress, job: JobDetail) -> None:
        events = job.get("events", [])
        for ev in events[self._seen_events :]:
            reason = (ev.get("reason") or "").splitlines()
            first = reason[0] if reason else ""
            if first.startswith("warning:"):  # noted, no state change (an unread hparam)
                progress.console.print(
                    f"job {self.job_id}: {first}", style="yellow", highlight=False, markup=False
                )
                continue
            if ev["to_state"] == "FAILED":  # its last lines come once, in the final summary
                first = first.removesuffix("; last lines:")
            progress.console.print(
                f"job {self.job_id}: {state(ev['to_state'])} {first}", highlight=False
            )
            if ev["to_state"] == "RESTARTING" and len(reason) > 1:
                for line in reason[1:]:
                    progress.console.print(f"    {line}", highlight=False, markup=False)
        self._seen_events = len(events)

    def run(self) -> JobDetail:
        columns = [
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[metric]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
        ]
        with Progress(*columns, console=self.out, transient=False) as progress:
            task = progress.add_task(f"job {self.job_id}", total=None, metric="", rate="", state="")
            while True:
                job = self.client.job(self.job_id)
                self._print_events(progress, job)
                step = job.get("last_step")
                total = job.get("total_steps")
                rate = self._steps_per_second(step)
                done = (step + 1) if step is not None else 0
                if job["state"] == "COMPLETED" and total:
                    done = total
                progress.update(
                    task,
                    description=f"job {self.job_id} {job['name']}",
                    total=total,
                    completed=done,
                    metric=_headline_metric(job.get("latest_metrics") or {}),
                    rate=f"{rate:.1f} steps/s" if rate else "",
                    state=state(job["state"]) + _waiting(job) + _starting(job),
                )
                if job["state"] in TERMINAL:
                    return job
                time.sleep(self.poll)
