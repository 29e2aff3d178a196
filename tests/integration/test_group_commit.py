"""Group commit of metric reports against a real server: what it acknowledged is stored, even
when the server is killed with reports in flight (both backends)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import sqlalchemy

from tests.support.jobs import write_job
from tests.support.servers import assert_clean_stop, start_server

pytestmark = pytest.mark.integration

# eight threads post reports (2 series x 10 steps, a block of steps each, blocks 0, 1, 2, ...)
# until the server stops answering; each acknowledged block is appended to hparams.acked
REPORTER = """
import json
import os
import threading

import httpx

from trainhouse.core.wire import CLIENT_HEADERS, JSON_HEADERS

env = os.environ
acked = json.loads(env["TRAINHOUSE_HPARAMS"])["acked"]
url = f"{env['TRAINHOUSE_URL']}/api/v1/jobs/{env['TRAINHOUSE_JOB_ID']}/report"
headers = {"Authorization": f"Bearer {env['TRAINHOUSE_JOB_TOKEN']}", **JSON_HEADERS,
           **CLIENT_HEADERS}
attempt = int(env["TRAINHOUSE_ATTEMPT"])
THREADS = 8
lock = threading.Lock()


def post(first):
    block = first
    with httpx.Client(headers=headers, timeout=60) as http:
        while True:
            steps = range(block * 10, block * 10 + 10)
            points = [[s, n, float(s), None, 1.0] for s in steps for n in ("a", "b")]
            body = {"batch_id": f"b{block}", "attempt": attempt, "points": points}
            try:
                answer = http.post(url, content=json.dumps(body))
            except httpx.HTTPError:
                return  # the server is gone
            if answer.status_code != 200:
                print(answer.status_code, answer.text, flush=True)
                return
            with lock, open(acked, "a") as out:
                out.write(f"{block}\\n")
            block += THREADS


threads = [threading.Thread(target=post, args=(t,)) for t in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("the server stopped answering", flush=True)
"""


def acked_blocks(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().splitlines() if line]


def test_acknowledged_reports_survive_a_killed_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    srv = start_server(home, "--cpus", "2")
    acked = tmp_path / "acked.txt"
    acked.touch(mode=0o666)
    spec = write_job(tmp_path, REPORTER, "name: reporter\nentrypoint: python train.py\n")
    job = srv.cli_json("submit", str(spec), "--detach", "--set", f"hparams.acked={acked}")
    deadline = time.monotonic() + 120
    while len(acked_blocks(acked)) < 200:
        assert time.monotonic() < deadline, f"{len(acked_blocks(acked))} reports acknowledged"
        time.sleep(0.05)
    assert srv.proc is not None
    srv.proc.kill()  # SIGKILL: reports in flight, some committed and not yet answered
    srv.proc.wait()
    count = -1
    while count != len(acked_blocks(acked)):  # the reporter's threads see the server gone
        count = len(acked_blocks(acked))
        time.sleep(1.0)
    blocks = acked_blocks(acked)
    assert len(blocks) == len(set(blocks)) >= 200
    srv = start_server(home, "--cpus", "2", port=srv.port)
    try:
        engine = sqlalchemy.create_engine(srv.db_url)
        try:
            with engine.connect() as conn:
                stored = dict(
                    conn.execute(
                        sqlalchemy.text(
                            "SELECT step / 10, count(*) FROM metrics WHERE job_id = :job "
                            "GROUP BY step / 10"
                        ),
                        {"job": job["id"]},
                    ).all()
                )
        finally:
            engine.dispose()
        missing = {b: stored.get(b, 0) for b in blocks if stored.get(b, 0) != 20}
        assert not missing, f"acknowledged blocks not stored whole: {json.dumps(missing)[:500]}"
        # the server's own read path agrees (steps past the acknowledged ones may be stored:
        # committed, but their answer never left the killed server)
        names = srv.client.metric_names(job["id"])
        assert {n["name"] for n in names} == {"a", "b"}
        assert all(n["points"] >= len(blocks) * 10 for n in names)
    finally:
        assert_clean_stop(srv)
