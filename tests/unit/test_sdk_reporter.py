"""The SDK's metric buffer against a fake server (httpx.MockTransport): batching, retries."""

from __future__ import annotations

import functools
import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.records import new_job
from trainhouse.core.reports import COLUMN_KEYS
from trainhouse.errors import ClientError, ServerUnreachable
from trainhouse.ingest.spool import ingest_spool
from trainhouse.jobfs.layout import AttemptLayout
from trainhouse.sdk import _run as sdk_run
from trainhouse.sdk._metrics import MAX_SERVER_ERRORS, Reporter
from trainhouse.sdk._transport import JobAPI
from trainhouse.store import MetricPoint, Store


def report_body(content: bytes) -> dict[str, Any]:
    """A request's JSON; a report's points (sent as columns) also as ``points`` rows."""
    body: dict[str, Any] = json.loads(content)
    columns = body.get("columns")
    if columns is not None:
        rows = zip(*(columns[k] for k in COLUMN_KEYS), strict=True)
        body["points"] = [list(row) for row in rows]
    return body


class FakeServer:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.refused: list[str] = []  # batch ids tried while down
        self.down = False
        self.stop = False
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = report_body(request.content)
        if self.down:  # a report, or a registration carrying one
            self.refused.append(body.get("batch_id") or body["report"]["batch_id"])
            raise httpx.ConnectError("connection refused", request=request)
        with self.lock:
            self.requests.append(body)
        assert request.headers["Authorization"] == "Bearer tok"
        return httpx.Response(
            200,
            json={
                "accepted": len(body["points"]),
                "stop": self.stop,
                "stop_reason": "preempted" if self.stop else None,
            },
        )


def reporter(server: FakeServer, **kw: Any) -> Reporter:
    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(server))
    return Reporter(api, attempt=1, **kw)


def test_one_request_per_flush_never_one_per_point() -> None:
    server = FakeServer()
    rep = reporter(server, interval=3600)
    rep.add([(s, "loss", 1.0 / (s + 1), None, 0.0) for s in range(5000)])
    rep.flush()
    assert len(server.requests) == 1 and len(server.requests[0]["points"]) == 5000
    rep.close()
    assert len(server.requests) == 1  # nothing left to send, no heartbeat due
    rep.api.close()


def test_a_backlog_goes_in_order_in_batches_of_max_batch() -> None:
    server = FakeServer()
    rep = reporter(server, interval=3600, max_batch=1000)
    rep.add([(s, "loss", float(s), None, 1.0) for s in range(2500)])
    rep.flush()
    sizes = [len(r["points"]) for r in server.requests]
    assert sizes == [1000, 1000, 500]
    assert [p[0] for r in server.requests for p in r["points"]] == list(range(2500))
    assert set(server.requests[0]["columns"]) == {"step", "name", "value", "rank", "wall_time"}
    rep.close()
    rep.api.close()


def test_a_flush_sends_what_was_logged_before_it_not_what_is_logged_meanwhile() -> None:
    """Regression (issue 19, P1): a flush went on sending while the training loop logged
    during its requests, one report after another for as long as a step took less than a
    report's round trip: under the server the flush before every checkpoint kept the server and
    the rank busy with reports for most of the next epoch."""
    server = FakeServer()
    rep = reporter(server, interval=3600)
    logged = iter(range(1, 50))

    def training_meanwhile(request: httpx.Request) -> httpx.Response:
        answer = server(request)
        step = next(logged, None)
        if step is not None:  # the loop logs a step while this report is in flight
            rep.add([(step, "loss", 1.0, None, 0.0)])
        return answer

    rep.api.close()
    rep.api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(training_meanwhile))
    rep.add([(0, "loss", 1.0, None, 0.0)])
    rep.flush()
    assert [[p[0] for p in r["points"]] for r in server.requests] == [[0]]
    rep.flush()  # the next flush sends what was logged meanwhile
    assert [[p[0] for p in r["points"]] for r in server.requests] == [[0], [1]]
    rep.close()
    rep.api.close()


def test_failed_batches_are_retried_with_the_same_id(caplog: pytest.LogCaptureFixture) -> None:
    server = FakeServer()
    rep = reporter(server, interval=0.05)
    server.down = True
    rep.add([(0, "loss", 1.0, None, 0.0)])
    with caplog.at_level(logging.WARNING, logger="trainhouse"):
        threading.Event().wait(0.5)  # several failed flushes
        rep.add([(1, "loss", 0.5, None, 0.0)])
        server.down = False
        rep.close()
    warnings = [r.message for r in caplog.records if "not sent yet" in r.message]
    assert len(warnings) == 1  # once per outage
    ids = [r["batch_id"] for r in server.requests]
    steps = sorted(p[0] for r in server.requests for p in r["points"])
    assert steps == [0, 1]  # nothing lost, nothing twice
    assert len(set(server.refused)) == 1  # every retry of the batch kept its id ...
    assert ids[0] == server.refused[0]  # ... so the server can drop a duplicate
    rep.api.close()


def test_stop_request_reaches_the_run() -> None:
    server = FakeServer()
    server.stop = True
    rep = reporter(server, interval=3600, heartbeat=0)
    rep.flush()
    assert rep.stop_requested.is_set() and rep.stop_reason == "preempted"
    rep.close()
    rep.api.close()


def test_a_batch_the_server_always_fails_on_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: one poisoned batch blocked every later metric and every stop request."""
    calls: list[int] = []

    def broken(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        body = report_body(request.content)
        if any(p[1] == "poison" for p in body["points"]):
            return httpx.Response(500, json={"error": {"code": "internal", "message": "boom"}})
        return httpx.Response(200, json={"accepted": len(body["points"]), "stop": True})

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(broken))
    rep = Reporter(api, attempt=1, interval=0.01)
    rep.add([(0, "poison", 1.0, None, 0.0)])
    with caplog.at_level(logging.ERROR, logger="trainhouse"):
        assert rep.stop_requested.wait(10), "the stop request never got through"
    rep.close()
    api.close()
    assert any("refused 1 metric points" in r.message for r in caplog.records)


def test_a_busy_server_never_makes_a_batch_dropped() -> None:
    """A 503 (the server's report queue is full) is backpressure, not a failure of the batch:
    however many in a row, the batch is sent again, under its id, until it is stored."""
    answers: list[int] = []

    def busy(request: httpx.Request) -> httpx.Response:
        body = report_body(request.content)
        answers.append(len(answers))
        if len(answers) <= 3 * MAX_SERVER_ERRORS:
            return httpx.Response(
                503,
                json={"error": {"code": "busy", "message": "queue full"}},
                headers={"Retry-After": "1"},
            )
        return httpx.Response(200, json={"accepted": len(body["points"]), "stop": True})

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(busy))
    rep = Reporter(api, attempt=1, interval=0.01)
    rep.add([(0, "loss", 1.0, None, 0.0)])
    assert rep.stop_requested.wait(30), "the batch never got through"
    rep.close()
    api.close()
    assert rep.sent_points == 1 and len(answers) > 3 * MAX_SERVER_ERRORS


def test_checkpoint_is_registered_only_after_the_metrics_before_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: steps logged just before a checkpoint were lost when the process died
    before the next flush, and a resume from that checkpoint never logged them again."""
    import torch

    import trainhouse

    order: list[str] = []

    requests: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        body = report_body(request.content) if request.content else {}
        requests.append(f"{request.method} {request.url.path}")
        if request.url.path.endswith("/report"):
            if body["points"]:
                order.append(f"report {max(p[0] for p in body['points'])}")
            return httpx.Response(200, json={"accepted": len(body["points"]), "stop": False})
        if request.method == "POST":  # a registration: the points it carries are stored first
            report = body.pop("report", None)
            answer: dict[str, Any] = {**body, "id": 1}
            if report is not None:
                points = report_body(json.dumps(report).encode())["points"]
                order.append(f"report {max(p[0] for p in points)}")
                answer["report"] = {"accepted": len(points), "stop": False}
            order.append(f"checkpoint {body['step']}")
            return httpx.Response(201, json=answer)
        return httpx.Response(200, json={"checkpoints": []})

    for key, value in {
        "TRAINHOUSE_JOB_ID": "7",
        "TRAINHOUSE_JOB_TOKEN": "tok",
        "TRAINHOUSE_URL": "http://server",
        "TRAINHOUSE_ATTEMPT": "1",
        "TRAINHOUSE_CHECKPOINT_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(key, value)
    # the run's connection to the server goes to the fake one
    mock = httpx.MockTransport(server)
    monkeypatch.setattr(sdk_run, "JobAPI", functools.partial(JobAPI, transport=mock))
    with trainhouse.init() as run:
        assert not run.standalone
        for step in range(5):
            run.log({"loss": 1.0}, step=step)
        run.checkpoint.save({"w": torch.ones(1)}, step=4)
        saved = requests.index("POST /api/v1/jobs/7/checkpoints")
    assert order[:2] == ["report 4", "checkpoint 4"]
    # in one request: the points travel with the registration, no report of their own
    assert "POST /api/v1/jobs/7/report" not in requests[:saved]


def test_a_server_that_ignores_the_points_a_registration_carries_gets_them_reported() -> None:
    """A server of before the points travelled with a registration ignores them (its answer
    has no report): they stay in line and are reported at once, never lost."""
    server = FakeServer()
    registered: list[dict[str, Any]] = []

    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/checkpoints"):
            body = json.loads(request.content)
            registered.append(body)
            return httpx.Response(201, json={"id": 1, "step": body["step"]})  # no "report"
        return server(request)

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(route))
    rep = Reporter(api, attempt=1, interval=3600)
    rep.add([(s, "loss", float(s), None, 0.0) for s in range(3)])
    answer = rep.register_with_points({"step": 2, "path": "step-2.pt"})
    assert answer == {"id": 1, "step": 2}
    assert "report" in registered[0]
    assert [p[0] for r in server.requests for p in r["points"]] == [0, 1, 2]
    rep.close()
    api.close()


def test_a_registration_carries_points_only_when_nothing_waits_before_them() -> None:
    """Batches in line (the server was away) go first, on their own, then the registration;
    with nothing logged, a registration carries no report."""
    server = FakeServer()
    rep = reporter(server, interval=3600)
    server.down = True
    rep.add([(0, "loss", 0.0, None, 0.0)])
    with pytest.raises(ClientError):
        rep.flush()
    server.down = False
    rep.add([(1, "loss", 1.0, None, 0.0)])
    seen: list[dict[str, Any]] = []

    def register(record: dict[str, Any], *, retry_for: float = 0.0) -> dict[str, Any]:
        seen.append(record)
        report = record.get("report")
        return {"id": len(seen), **({"report": {"stop": False}} if report else {})}

    rep.api.register_checkpoint = register  # type: ignore[method-assign]
    rep.register_with_points({"step": 1})
    assert [p[0] for r in server.requests for p in r["points"]] == [0, 1]  # reported first
    assert seen == [{"step": 1}]
    rep.register_with_points({"step": 2})  # nothing logged since
    assert seen[-1] == {"step": 2}
    rep.add([(3, "loss", 3.0, None, 0.0)])
    rep.register_with_points({"step": 3})
    assert seen[-1]["report"]["columns"]["step"] == [3]
    rep.close()
    rep.api.close()


def test_points_unsent_at_the_end_are_spooled_and_stored_once(tmp_path: Path) -> None:
    """The server is down as the run ends: nothing is lost, nothing is stored twice."""
    server = FakeServer()
    spool = tmp_path / "attempts" / "1" / "metrics-spool"
    rep = reporter(server, interval=3600, spool=spool)
    rep.add([(s, "loss", float(s), None, 0.0) for s in range(5)])
    rep.flush()  # steps 0-4 reach the server
    server.down = True
    rep.add([(s, "loss", float(s), None, 0.0) for s in range(5, 12)])
    with pytest.raises(ClientError):
        rep.flush()  # steps 5-11 are pending in one batch
    rep.add([(12, "loss", 12.0, None, 0.0)])
    rep.close(timeout=0.5)
    files = sorted(spool.glob("*.json"))
    assert len(files) == 2
    assert json.loads(files[0].read_text())["batch_id"] == server.refused[-1]

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        job = store.jobs.get(new_job(store))
        sent = server.requests[0]
        store.metrics.add(
            job.id,
            [MetricPoint(s, n, v, r, 1, w) for s, n, v, r, w in sent["points"]],
            batch_id=sent["batch_id"],
        )
        # the first spooled batch had reached the server too, just before it went down
        first = report_body(files[0].read_bytes())
        store.metrics.add(
            job.id,
            [MetricPoint(s, n, v, r, 1, w) for s, n, v, r, w in first["points"]],
            batch_id=first["batch_id"],
        )
        # only step 12 is new
        layout = AttemptLayout(spool.parent)
        assert ingest_spool(store.metrics, job.id, layout, within=spool.parent) == 1
        assert not list(spool.glob("*.json"))
        steps = [p.step for p in store.metrics.points(job.id, name="loss")]
        assert steps == list(range(13))
    finally:
        store.close()


def test_a_checkpoint_saved_while_the_server_is_down_is_registered_after_its_metrics() -> None:
    calls: list[tuple[str, Any]] = []
    state = {"down": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if state["down"]:
            raise httpx.ConnectError("connection refused", request=request)
        body = report_body(request.content)
        if request.url.path.endswith("/checkpoints"):
            calls.append(("checkpoint", body["step"]))
            return httpx.Response(201, json={**body, "id": 1})
        calls.append(("points", [p[0] for p in body["points"]]))
        return httpx.Response(200, json={"accepted": len(body["points"]), "stop": False})

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(handler))
    rep = Reporter(api, attempt=1, interval=3600)
    rep.add([(s, "loss", 1.0, None, 0.0) for s in range(4)])
    rep.defer_checkpoint({"step": 3, "path": "step-000000003.pt"})
    rep.add([(4, "loss", 1.0, None, 0.0)])
    with pytest.raises(ClientError):
        rep.flush()
    assert rep.deferred_checkpoints and not calls
    state["down"] = False
    rep.flush()
    assert calls == [("points", [0, 1, 2, 3, 4]), ("checkpoint", 3)]
    assert not rep.deferred_checkpoints
    rep.close()


def test_persist_spools_every_point_logged_and_sends_it_first_under_its_id(tmp_path: Path) -> None:
    server = FakeServer()
    spool = tmp_path / "metrics-spool"
    rep = reporter(server, interval=3600, spool=spool, max_batch=3)
    server.down = True
    rep.add([(s, "loss", float(s), None, 0.0) for s in range(4)])
    with pytest.raises(ClientError):
        rep.flush()  # steps 0-2 are in line under one id; step 3 is buffered
    assert rep.persist()
    files = sorted(spool.glob("*.json"))
    spooled = [report_body(f.read_bytes()) for f in files]
    assert [[p[0] for p in b["points"]] for b in spooled] == [[0, 1, 2], [3]]
    assert spooled[0]["batch_id"] == server.refused[-1]  # the id the server may have seen
    assert rep.persist()  # nothing new: the same files
    assert sorted(spool.glob("*.json")) == files
    rep.add([(4, "loss", 4.0, None, 0.0)])
    server.down = False
    rep.flush()
    sent = [(r["batch_id"], [p[0] for p in r["points"]]) for r in server.requests]
    assert sent == [(b["batch_id"], [p[0] for p in b["points"]]) for b in spooled] + [
        (sent[2][0], [4])
    ]
    assert not list(spool.glob("*.json"))  # stored: the spool is empty again
    rep.close()
    rep.api.close()


def test_persist_without_a_spool_says_so() -> None:
    server = FakeServer()
    rep = reporter(server, interval=3600)
    server.down = True
    rep.add([(0, "loss", 1.0, None, 0.0)])
    assert not rep.persist()
    server.down = False
    rep.close()
    assert [p[0] for r in server.requests for p in r["points"]] == [0]
    rep.api.close()


def _run_under_a_dead_server(tmp_path: Path, spool: Path | None) -> tuple[Any, Path, Reporter]:
    """A checkpointer whose server refuses connections, its checkpoint directory, its reporter."""
    from trainhouse.sdk._server import ServerLink
    from trainhouse.sdk.checkpoint import Checkpointer
    from trainhouse.sdk.checkpoint._registry import ServerRegistry

    server = FakeServer()
    server.down = True
    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(server))
    link = ServerLink(api, attempt=1, spool=spool, report=True)
    directory = tmp_path / "checkpoints"
    ckpt = Checkpointer(directory, registry=ServerRegistry(link))
    assert link.reporter is not None
    return ckpt, directory, link.reporter


def test_a_checkpoint_is_recorded_only_once_the_metrics_before_it_are_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13's race: saved while the server is down, the checkpoint's record (which a restart
    finds) appears only after every point logged before it is spooled and fsynced, so a rank
    killed before its next flush loses no step a resume from that checkpoint skips."""
    from trainhouse.sdk.checkpoint import _checkpointer

    monkeypatch.setattr(_checkpointer, "REGISTER_WAIT", 0.1)
    spool = tmp_path / "attempt" / "metrics-spool"
    ckpt, directory, rep = _run_under_a_dead_server(tmp_path, spool)
    rep.add([(s, "loss", float(s), None, 0.0) for s in range(11)])
    seen: list[list[int]] = []
    real = ckpt.storage.write_text

    def write_text(rel: str, text: str) -> None:
        if rel.endswith(".json"):  # the sidecar: what is durable at this moment?
            points = [report_body(f.read_bytes())["points"] for f in sorted(spool.glob("*.json"))]
            seen.append([p[0] for batch in points for p in batch])
        real(rel, text)

    monkeypatch.setattr(ckpt.storage, "write_text", write_text)
    ckpt.save({"w": 1}, step=10, rng=False)
    assert seen == [list(range(11))]
    assert (directory / "step-000000010.pt.json").is_file()
    assert rep.deferred_checkpoints  # registered once the server answers, after the points
    rep.close(timeout=0.1)
    rep.api.close()


def test_no_record_when_the_metrics_before_it_cannot_be_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainhouse.sdk.checkpoint import _checkpointer

    monkeypatch.setattr(_checkpointer, "REGISTER_WAIT", 0.1)
    ckpt, directory, rep = _run_under_a_dead_server(tmp_path, spool=None)
    rep.add([(0, "loss", 1.0, None, 0.0)])
    ckpt.save({"w": 1}, step=0, rng=False)
    assert (directory / "step-000000000.pt").is_file()
    assert not (directory / "step-000000000.pt.json").exists()  # invisible to a resume
    assert rep.deferred_checkpoints  # registered after its metrics, if the server returns
    rep.close(timeout=0.1)
    rep.api.close()


def test_a_checkpoint_during_an_outage_does_not_wait_for_the_server() -> None:
    """Once a registration waits for the server (or the last flush failed), the next
    checkpoint's registration is refused at once and waits in line too: it waited 5 s per
    checkpoint for a server the one before had found gone, and training waited with it."""
    tried: list[str] = []

    def down(request: httpx.Request) -> httpx.Response:
        tried.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    api = JobAPI("http://server", 7, "tok", transport=httpx.MockTransport(down))
    rep = Reporter(api, attempt=1, interval=3600)
    rep.defer_checkpoint({"step": 1, "path": "step-1.pt"})  # the server was found gone
    rep.add([(2, "loss", 2.0, None, 0.0)])
    with pytest.raises(ServerUnreachable):
        rep.register_with_points({"step": 2, "path": "step-2.pt"}, retry_for=600)
    assert not any(path.endswith("/checkpoints") for path in tried)  # nothing was sent
    assert [r["step"] for r in rep.deferred_checkpoints] == [1]  # the caller defers step 2
    rep.close(timeout=0.1)
    api.close()
