"""The server's view of a service's replicas (``ReplicaHub.describe``), on the app in process:
a replica's calls fill it; once the service's job has ended, none is shown, not even one whose
last call came after the stop had forgotten the replicas."""

from __future__ import annotations

from pathlib import Path

from tests.support.api import app_client, services, wait_launched, wait_state
from trainhouse.lifecycle import TERMINAL
from trainhouse.server.routes.services import empty_archive
from trainhouse.spec import parse_spec
from trainhouse.usecases.replicahub import Reach


def test_a_stopped_service_shows_no_replica_after_its_last_call(tmp_path: Path) -> None:
    with app_client(tmp_path, exit_code=None) as api:  # attempts run until the test ends them
        rt = services(api)
        spec = parse_spec("name: serve-rt\nentrypoint: python -m trainhouse.serving.follow\n")
        service = rt.store.services.create(
            name="rt",
            owner="tester",
            model="tiny",
            ref="prod",
            replicas=1,
            gpus_per_replica=0,
            max_batch=8,
            max_wait_ms=1.0,
            priority="normal",
            spec=spec,
            archive_sha256=empty_archive(rt),
        )
        assert service.job_id is not None
        wait_launched(api, service.job_id)

        def call() -> None:  # what the replica's follower posts about once a second
            job = rt.store.jobs.get(service.job_id or 0)
            rt.replicas.heartbeat(
                job,
                rank=0,
                url="http://127.0.0.1:40123",
                key="k" * 24,
                version=1,
                state="ready",
                error=None,
                stats={"requests": 3, "batches": 2, "examples": 5},
                reach=Reach("here", "here"),
            )

        call()
        shown = api.get("/api/v1/services/rt").json()
        assert (shown["state"], shown["ready_replicas"], shown["versions"]) == ("ready", 1, [1])
        assert [(r["rank"], r["requests"]) for r in shown["replica_list"]] == [(0, 3)]
        assert shown["problem"] == "no model named 'tiny'", shown["problem"]

        stopped = api.post("/api/v1/services/rt/stop")
        assert stopped.status_code == 200, stopped.text
        call()  # a call on its way while the stop forgot the replicas
        assert api.get("/api/v1/services/rt").json()["state"] == "stopping"
        rt.scheduler.executor.end(service.job_id, -15)  # type: ignore[attr-defined]
        wait_state(api, service.job_id, {str(s) for s in TERMINAL})

        shown = api.get("/api/v1/services/rt").json()
        assert shown["state"] == "stopped"
        assert (shown["replica_list"], shown["ready_replicas"]) == ([], 0)
        assert (shown["versions"], shown["version"]) == ([], None)
        listed = api.get("/api/v1/services").json()["services"]
        assert [(s["name"], s["state"], s["replica_list"]) for s in listed] == [
            ("rt", "stopped", [])
        ]
