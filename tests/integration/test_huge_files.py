"""A real job leaves huge sparse files (a terabyte costs it nothing on disk) as its saved models
and its checkpoints, and many registrations and clones of them come at once: those over the
server's caps (``--model-max-bytes``, ``--clone-max-bytes``) are refused before a byte is read;
the others are hashed or copied in the server's bounded background work (two at once, sixteen
waiting, a 503 with Retry-After for the rest), and the other routes keep answering meanwhile.

"Meanwhile" is an order, not a time: every GET below is answered before any of the
registrations (or clones) the server took has answered, each of those hashing 16 GiB or copying
4 GiB, which takes this machine tens of seconds. The server then stops at once with that work
in flight (it gives up between chunks)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.jobs import write_job
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = pytest.mark.integration

GiB = 1 << 30
CAP = 32 * GiB
HUGE = 64 * GiB  # over the caps
LARGE = 16 * GiB  # a model under the cap, slow to hash
COPIED = 4 * GiB  # a checkpoint under the cap, slow to copy (and written for real: kept small)
AT_ONCE = 48  # registrations (or clones) sent together, as in the issue
TAKEN = 2 + 16  # what the server's pool takes: two at work, sixteen waiting
HEADERS = {"X-Trainhouse-Request": "1"}  # what the CLI sends with a write

# a job that leaves sparse saved models (its record's sizes true, its digests not: nothing
# here is meant to register) and registers two sparse checkpoints with its own credential
HOSTILE = """
import json, os
from pathlib import Path
import httpx

env = os.environ
directory = Path(env["TRAINHOUSE_CHECKPOINT_DIR"])
def sparse(path, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)

def model(name, size):
    step = directory / "models" / name / "step-000000001"
    sparse(step / "weights.safetensors", size)
    record = {
        "name": name, "kind": "loader", "loader": "train.py:load",
        "signature": {"inputs": [], "outputs": []}, "torch": "2.5",
        "job_id": int(env["TRAINHOUSE_JOB_ID"]), "attempt": 1, "step": 1, "metrics": {},
        "files": [{"name": "weights.safetensors", "size": size, "sha256": "0" * 64}],
    }
    (step / "model.json").write_text(json.dumps(record))

model("huge", HUGE)
for i in range(AT_ONCE):
    model(f"large-{i}", LARGE)
url = f"{env['TRAINHOUSE_URL']}/api/v1/jobs/{env['TRAINHOUSE_JOB_ID']}/checkpoints"
for step, size in ((1, COPIED), (2, HUGE)):
    sparse(directory / f"step-{step:09d}.pt", size)
    body = {"attempt": int(env["TRAINHOUSE_ATTEMPT"]), "step": step, "size": size,
            "path": f"step-{step:09d}.pt", "sha256": "0" * 64}
    answer = httpx.post(url, json=body, timeout=60,
                        headers={"Authorization": "Bearer " + env["TRAINHOUSE_JOB_TOKEN"],
                                    "X-Trainhouse-Request": "1"})
    assert answer.status_code == 201, answer.text
print("left its huge files", flush=True)
"""


class Flight:
    """Requests sent at once, each on a thread of its own; their answers (or errors) in the
    order they came."""

    def __init__(self, calls: list[Callable[[], httpx.Response]]) -> None:
        self.answers: list[httpx.Response | Exception] = []
        self._changed = threading.Condition()
        for call in calls:
            threading.Thread(target=self._send, args=(call,), daemon=True).start()

    def _send(self, call: Callable[[], httpx.Response]) -> None:
        try:
            answer: httpx.Response | Exception = call()
        except Exception as exc:  # a timeout: kept, for the assertion that shows it
            answer = exc
        with self._changed:
            self.answers.append(answer)
            self._changed.notify_all()

    def first(self, count: int, *, guard: float) -> list[httpx.Response | Exception]:
        """The first ``count`` answers (``guard``: seconds after which the test fails rather
        than hangs; no time is measured)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.answers) >= count, timeout=guard)
            assert len(self.answers) >= count, (
                f"{len(self.answers)} of the requests answered in {guard} s: {self.answers}"
            )
            return list(self.answers[:count])

    def answered(self) -> int:
        with self._changed:
            return len(self.answers)


def hostile_job(server: Server, tmp_path: Path) -> int:
    script = HOSTILE.replace("HUGE", str(HUGE)).replace("LARGE", str(LARGE))
    script = script.replace("COPIED", str(COPIED)).replace("AT_ONCE", str(AT_ONCE))
    spec = write_job(
        tmp_path / "hostile",
        script,
        "name: huge-files\nentrypoint: python train.py\ncheckpoints:\n  keep_last: 5\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"COMPLETED", "FAILED"}, timeout=120)
    assert final["state"] == "COMPLETED", final["reason"]
    return int(job["id"])


def message(answer: httpx.Response | Exception) -> str:
    assert isinstance(answer, httpx.Response), f"no answer: {answer!r}"
    return str(answer.json()["error"]["message"])


def others_answer_while_in_flight(server: Server, flight: Flight) -> None:
    """Every other route asked answers while the ``TAKEN`` requests the server took are all
    still unanswered."""
    api = f"{server.url}/api/v1"
    for _ in range(3):
        for path in ("/jobs", "/models", "/queue"):
            assert httpx.get(f"{api}{path}", timeout=60).status_code == 200, path
    assert flight.answered() == AT_ONCE - TAKEN, "a request the server took answered first"


def refused_busy(answers: list[httpx.Response | Exception]) -> None:
    for answer in answers:
        assert isinstance(answer, httpx.Response), f"no answer: {answer!r}"
        assert answer.status_code == 503, answer.text[:300]
        assert answer.headers["Retry-After"] == "5"
        assert "2 running, 16 waiting" in message(answer)


def test_registrations_of_huge_sparse_models_block_no_other_route(tmp_path: Path) -> None:
    server = start_server(tmp_path / "home", "--model-max-bytes", "32G")
    try:
        job = hostile_job(server, tmp_path)
        versions = f"{server.url}/api/v1/models/{{}}/versions"

        def register(name: str) -> httpx.Response:
            return httpx.post(
                versions.format(name), json={"job": job}, headers=HEADERS, timeout=300
            )

        # under the cap, 48 at once: the pool takes 18, the others are refused at once
        under = Flight([partial(register, f"large-{i}") for i in range(AT_ONCE)])
        refused_busy(under.first(AT_ONCE - TAKEN, guard=120))
        others_answer_while_in_flight(server, under)

        # over it, 48 at once: each refused before its 64 GiB are read (the pool is full)
        over = Flight([partial(register, "huge") for _ in range(AT_ONCE)])
        for answer in over.first(AT_ONCE, guard=120):
            assert message(answer) == (
                f"the model in models/huge/step-000000001 holds {HUGE} bytes, more than the "
                f"{CAP} a model version may hold (the server's --model-max-bytes); refused "
                "before reading it"
            )
            assert isinstance(answer, httpx.Response) and answer.status_code == 422
        assert under.answered() == AT_ONCE - TAKEN
    finally:
        assert_clean_stop(server)  # at once, with two 16 GiB hashes under way


def test_clones_of_a_huge_sparse_checkpoint_block_no_other_route(tmp_path: Path) -> None:
    server = start_server(tmp_path / "home", "--clone-max-bytes", "32G")
    try:
        job = hostile_job(server, tmp_path)
        url = f"{server.url}/api/v1/jobs/{job}/clone"

        def clone(step: int) -> httpx.Response:
            return httpx.post(
                url, json={"from_checkpoint": str(step)}, headers=HEADERS, timeout=300
            )

        # its 4 GiB checkpoint, 48 clones at once: the pool takes 18, the others are refused
        under = Flight([partial(clone, 1) for _ in range(AT_ONCE)])
        refused_busy(under.first(AT_ONCE - TAKEN, guard=120))
        others_answer_while_in_flight(server, under)

        # its 64 GiB one: refused before a byte is read, and no clone made
        over = Flight([partial(clone, 2) for _ in range(AT_ONCE)])
        for answer in over.first(AT_ONCE, guard=120):
            assert message(answer) == (
                f"checkpoint of step 2 is {HUGE} bytes, more than the {CAP} a copy may take "
                "(the server's --clone-max-bytes); not copied"
            )
        with server.client as client:
            clones: list[dict[str, Any]] = [j for j in client.jobs() if j.get("cloned_from") == job]
        assert {c["cloned_step"] for c in clones} == {1}  # none of step 2
        assert len(clones) <= TAKEN  # none of the refused ones left behind
        assert under.answered() == AT_ONCE - TAKEN
    finally:
        assert_clean_stop(server)  # at once, with two 4 GiB copies under way
