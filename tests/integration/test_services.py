"""End to end, as a user ships a model: the digits example trains and saves its model, the user
registers it, aliases it ``prod`` and serves it (``trainhouse serve digits@prod``, two
replicas: the ranks of a long-running job); predictions through the server equal the model's
own outputs in process; 16 clients keep predicting while the alias moves to a second version
and none fails; bad inputs get a 4xx naming the problem while the service keeps answering; a
replica's process SIGKILLed under load comes back alone (the other replica and the job's
attempt untouched) and no request fails; a server SIGKILLed comes back finding its service
running.

One server and one service for the module (a replica is a torch process; the tests share it).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch

from tests.support.processes import marked_processes
from tests.support.servers import EXAMPLE, Server, assert_clean_stop, example_module, start_server
from trainhouse.sdk import load_model

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("services")]

HEADERS = {"X-Trainhouse-Request": "1"}


@dataclass
class Shipped:
    srv: Server
    job_id: int
    home: Path
    model: Any  # the saved model, loaded in this process
    x: torch.Tensor  # held-out digits

    def predict_url(self) -> str:
        return f"{self.srv.url}/api/v1/services/digits/predict"

    def show(self) -> dict[str, Any]:
        result: dict[str, Any] = self.srv.cli_json("serve", "show", "digits")
        return result

    def wait_ready(self, timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.show()
            if shown["state"] == "ready":
                return shown
            assert time.monotonic() < deadline, f"the service is still {shown['state']}: {shown}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    root = tmp_path_factory.mktemp("services")
    srv = start_server(root / "home", "--cpus", "4")
    shipped: Shipped | None = None
    try:
        job = srv.cli_json(
            "submit",
            str(EXAMPLE),
            "--set",
            "hparams.epochs=1",
            "--set",
            "hparams.save_model=digits",
        )
        assert job["state"] == "COMPLETED", job
        assert srv.cli_json("models", "alias", "digits", "1", "prod")["version"] == 1
        started = srv.cli_json("serve", "digits@prod", "--replicas", "2", "--max-wait-ms", "5")
        assert (started["name"], started["target_version"]) == ("digits", 1)
        assert started["state"] in ("queued", "starting"), started
        path = srv.cli_json("models", "download", "digits@1", str(root / "dl"))["path"]
        _, val = example_module().datasets(0)
        shipped = Shipped(srv, job["id"], root / "home", load_model(Path(path)), val.tensors[0])
        shipped.wait_ready()
        yield shipped
    finally:
        last = shipped.srv if shipped is not None else srv
        if last.proc is not None and last.proc.poll() is None:  # the last test stops it
            last.cli("serve", "stop", "digits")
            assert_clean_stop(last)


def post(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, json=body, headers=HEADERS, timeout=60, **kwargs)


def test_predictions_through_the_server_equal_the_model_in_process(shipped: Shipped) -> None:
    x = shipped.x
    with torch.no_grad():
        expected = shipped.model(x)
    got = []
    for start in range(0, len(x), 50):  # several requests, batched with one another
        resp = post(shipped.predict_url(), {"inputs": x[start : start + 50].tolist()})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert (body["model"], body["version"]) == ("digits", 1)
        got.extend(body["outputs"])
    assert torch.allclose(torch.tensor(got), expected, atol=1e-6, rtol=0)
    # one example at a time, through the Python client too
    with shipped.srv.client as c:
        one = c.predict("digits", x[:1].tolist())
    assert torch.allclose(torch.tensor(one["outputs"]), expected[:1], atol=1e-6, rtol=0)

    shown = shipped.show()
    assert (shown["version"], shown["ready_replicas"], shown["job_state"]) == (1, 2, "RUNNING")
    assert {r["rank"] for r in shown["replica_list"]} == {0, 1}
    assert shown["stats"]["requests_total"] >= 9
    listed = shipped.srv.cli_json("serve", "list")
    assert [(s["name"], s["state"]) for s in listed] == [("digits", "ready")]
    metrics = httpx.get(f"{shipped.srv.url}/metrics").text
    assert 'trainhouse_service_requests_total{outcome="ok",service="digits"}' in metrics
    assert 'trainhouse_service_batch_size_count{service="digits"}' in metrics
    assert 'trainhouse_service_latency_seconds_bucket{le="0.05",service="digits"}' in metrics


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"inputs": [[1.0, 2.0]]}, 422, "shape"),
        ({"inputs": [[[["a"] * 8] * 8]]}, 422, "numbers"),
        ({"inputs": [[[[True] * 8] * 8]]}, 422, "true/false"),
        ({"inputs": "seven"}, 422, "list"),
        ({"outputs": []}, 422, "inputs"),
    ],
)
def test_bad_inputs_get_a_4xx_that_names_the_problem(
    shipped: Shipped, body: Any, status: int, says: str
) -> None:
    resp = post(shipped.predict_url(), body)
    assert resp.status_code == status, resp.text
    assert says in resp.json()["error"]["message"], resp.text
    ok = post(shipped.predict_url(), {"inputs": shipped.x[:2].tolist()})
    assert ok.status_code == 200 and len(ok.json()["outputs"]) == 2


def test_a_body_too_large_or_not_json_is_refused(shipped: Shipped) -> None:
    huge = httpx.post(shipped.predict_url(), content=b"[" * (9 << 20), headers=HEADERS, timeout=60)
    assert huge.status_code == 413, huge.text
    broken = httpx.post(shipped.predict_url(), content=b"{not json", headers=HEADERS)
    assert broken.status_code == 400 and "not JSON" in broken.json()["error"]["message"]
    missing = post(f"{shipped.srv.url}/api/v1/services/nothing/predict", {"inputs": [1]})
    assert missing.status_code == 404 and "nothing" in missing.json()["error"]["message"]
    assert post(shipped.predict_url(), {"inputs": shipped.x[:1].tolist()}).status_code == 200


Answer = tuple[float, int, Any, Any]  # (time sent, status, version, outputs)


async def _clients(url: str, example: list[Any], stop: asyncio.Event) -> list[Answer]:
    """16 clients predicting until ``stop``: (time sent, status, version, outputs) of each
    answer."""
    answers: list[Answer] = []
    async with httpx.AsyncClient(headers=HEADERS, timeout=60) as http:

        async def one() -> None:
            while not stop.is_set():
                sent = time.monotonic()
                resp = await http.post(url, json={"inputs": [example]})
                if resp.status_code == 200:
                    body = resp.json()
                    answers.append((sent, 200, body["version"], body["outputs"]))
                else:
                    answers.append((sent, resp.status_code, resp.text, None))

        await asyncio.gather(*(one() for _ in range(16)))
    return answers


def test_moving_the_alias_switches_every_replica_without_a_failed_request(
    shipped: Shipped,
) -> None:
    srv = shipped.srv
    second = srv.cli_json(
        "submit",
        str(EXAMPLE),
        "--set",
        "hparams.epochs=1",
        "--set",
        "hparams.seed=1",
        "--set",
        "hparams.save_model=digits",
    )
    assert second["state"] == "COMPLETED", second
    v2 = srv.cli_json("models", "show", "digits")["versions"][-1]
    assert (v2["version"], v2["job_id"]) == (2, second["id"])
    path = srv.cli_json("models", "download", "digits@2", str(shipped.home.parent / "dl"))["path"]
    example = shipped.x[:1]
    with torch.no_grad():
        expected = {1: shipped.model(example)[0], 2: load_model(Path(path))(example)[0]}
    assert not torch.allclose(expected[1], expected[2], atol=1e-4)

    switched: list[float] = []

    async def scenario() -> list[Answer]:
        stop = asyncio.Event()
        task = asyncio.create_task(_clients(shipped.predict_url(), example[0].tolist(), stop))
        await asyncio.sleep(1.0)
        moved = await asyncio.to_thread(srv.cli_json, "models", "alias", "digits", "2", "prod")
        assert moved["version"] == 2
        deadline = time.monotonic() + 120
        while True:
            shown = await asyncio.to_thread(shipped.show)
            if shown["version"] == 2 and shown["ready_replicas"] == 2:
                switched.append(time.monotonic())
                break
            assert time.monotonic() < deadline, f"never switched: {shown}"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)
        stop.set()
        return await task

    answers = asyncio.run(scenario())
    failed = [a for a in answers if a[1] != 200]
    assert not failed, failed[:5]
    assert {a[2] for a in answers} == {1, 2}, "both versions answered"
    for _, _, version, outputs in answers:  # each answer is the version it names, not a mix
        assert torch.allclose(torch.tensor(outputs[0]), expected[version], atol=1e-5, rtol=0)
    after = [a for a in answers if a[0] > switched[0]]
    assert after and {a[2] for a in after} == {2}
    assert len(answers) > 50
    # a version a service serves cannot be deleted; the one it left can
    refused = srv.cli("models", "delete", "digits@2")
    assert refused.returncode != 0 and "served by digits" in refused.stderr, refused.stderr
    assert srv.cli("models", "delete", "digits@1").returncode == 0


def _processes(job_id: int, rank: int) -> tuple[psutil.Process, psutil.Process]:
    """Replica ``rank`` of job ``job_id``: the rank's process (the supervisor, under the rank
    wrapper) and the process serving (its child; the same process where there is no
    supervisor)."""
    found = []
    for proc in marked_processes():
        try:
            env, cmd = proc.environ(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if (
            env.get("TRAINHOUSE_JOB_ID") == str(job_id)
            and env.get("RANK") == str(rank)
            and "trainhouse.serving.follow" in cmd
            and "rank.py" not in cmd
        ):
            found.append(proc)
    pids = {p.pid for p in found}
    tops = [p for p in found if p.ppid() not in pids]
    serving = [p for p in found if not any(c.pid in pids for c in p.children())]
    assert len(tops) == 1 and len(serving) == 1, f"replica {rank} of job {job_id}: {found}"
    return tops[0], serving[0]


def test_a_replica_killed_under_load_comes_back_alone_then_a_killed_server_finds_it(
    shipped: Shipped,
) -> None:
    """16 clients predict while replica 1's serving process is SIGKILLed: the request it had in
    flight is answered by replica 0, nothing is sent to it until it is ready again, its rank's
    process starts it again alone (replica 0's process and the job's attempt are the same),
    and every answer is the served version's prediction. Then the server SIGKILLed finds its
    service running, and the service stops (one test: the restarted replica is the service's
    until it stops)."""
    srv = shipped.srv
    before = shipped.wait_ready()
    job_id, version = before["job_id"], before["version"]
    attempts = {r["attempt"] for r in before["replica_list"]}
    path = srv.cli_json("models", "download", f"digits@{version}", str(shipped.home.parent / "k"))
    example = shipped.x[:1]
    with torch.no_grad():
        expected = load_model(Path(path["path"]))(example)[0]
    rank0, serving0 = _processes(job_id, 0)
    rank1, serving1 = _processes(job_id, 1)
    started1 = next(r["started_at"] for r in before["replica_list"] if r["rank"] == 1)

    async def scenario() -> list[Answer]:
        stop = asyncio.Event()
        task = asyncio.create_task(_clients(shipped.predict_url(), example[0].tolist(), stop))
        await asyncio.sleep(1.0)
        serving1.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # replica 1 is ready again, a new process
            shown = await asyncio.to_thread(shipped.show)
            one = next((r for r in shown["replica_list"] if r["rank"] == 1), None)
            if one and one["state"] == "ready" and one["started_at"] != started1:
                break
            assert time.monotonic() < deadline, f"replica 1 never came back: {shown}"
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # both serve again
        stop.set()
        return await task

    answers = asyncio.run(scenario())
    failed = [a for a in answers if a[1] != 200]
    assert not failed, failed[:5]
    assert len(answers) > 50
    for _, _, got, outputs in answers:
        assert got == version
        assert torch.allclose(torch.tensor(outputs[0]), expected, atol=1e-5, rtol=0)
    after = shipped.show()
    assert after["job_id"] == job_id and after["ready_replicas"] == 2
    assert {r["attempt"] for r in after["replica_list"]} == attempts  # no restart of the job
    again0, now0 = _processes(job_id, 0)
    again1, now1 = _processes(job_id, 1)
    assert (again0.pid, now0.pid, again1.pid) == (rank0.pid, serving0.pid, rank1.pid)
    assert now1.pid != serving1.pid and not serving1.is_running()
    log = srv.cli("logs", str(job_id), "--rank", "1").stdout
    assert f"its process {serving1.pid} was killed by signal 9; restarting it" in log, log[-2000:]

    # the server SIGKILLed and started again finds its service running, the same job
    srv = shipped.srv
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    shipped.srv = start_server(shipped.home, "--cpus", "4", port=srv.port)
    again = shipped.wait_ready(timeout=120)
    assert (again["job_id"], again["version"]) == (job_id, version)
    ok = post(shipped.predict_url(), {"inputs": shipped.x[:3].tolist()})
    assert ok.status_code == 200 and ok.json()["version"] == version

    # stopped, its job ends canceled and predictions are refused with the reason
    stopping = shipped.srv.cli_json("serve", "stop", "digits")
    assert stopping["state"] in ("stopping", "stopped")
    final = shipped.srv.wait(job_id, {"CANCELED", "FAILED", "COMPLETED"}, timeout=60)
    assert final["state"] == "CANCELED"
    assert shipped.show()["state"] == "stopped"
    refused = post(shipped.predict_url(), {"inputs": shipped.x[:1].tolist()})
    assert refused.status_code == 503 and "stopped" in refused.json()["error"]["message"]
    assert_clean_stop(shipped.srv)
