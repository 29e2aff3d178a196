"""What route handlers depend on: the running services and the per-job credential check."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Depends, Header, Request

from trainhouse.errors import Unauthorized
from trainhouse.layout import JobLayout
from trainhouse.scheduler.loop import SchedulerLoop
from trainhouse.server.checkpoints import Checkpoints
from trainhouse.server.monitor import Sampler
from trainhouse.server.schemas import RowId
from trainhouse.server.settings import Settings
from trainhouse.server.telemetry import Telemetry
from trainhouse.store import BlobStore, Job, Store
from trainhouse.store.accounts import Accounts
from trainhouse.store.system import SystemMetrics
from trainhouse.tokens import hash_token

if TYPE_CHECKING:
    from trainhouse.server.auth import Authenticator


@dataclass
class Services:
    settings: Settings
    store: Store
    blobs: BlobStore
    scheduler: SchedulerLoop
    checkpoints: Checkpoints
    system: SystemMetrics  # resource samples
    monitor: Sampler
    telemetry: Telemetry  # /metrics
    accounts: Accounts  # users, tokens, audit log
    auth: Authenticator  # tokens -> principals (trainhouse.server.auth)

    def files(self, job_id: int) -> JobLayout:
        return JobLayout(self.settings.home, job_id)


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


def job_credential(job: Job, authorization: str | None) -> None:
    """Raise unless ``authorization`` carries the job's current per-attempt token."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Unauthorized("this endpoint needs the job's credential (Authorization: Bearer ...)")
    given = hash_token(authorization.removeprefix("Bearer ").strip())
    if job.token_hash is None or not hmac.compare_digest(given, job.token_hash):
        raise Unauthorized(f"the credential is not valid for job {job.id}'s current attempt")


AuthHeader = Header(None, alias="Authorization", include_in_schema=False)


def reporting_job(
    job_id: RowId, authorization: str | None = AuthHeader, svc: Services = Depends(services)
) -> Job:
    """The job a request reports for, once its per-attempt credential checks out."""
    job = svc.store.get_job(job_id)
    job_credential(job, authorization)
    return job
