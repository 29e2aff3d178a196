"""Live logs as Server-Sent Events, in process: every byte once, resumable from offsets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.support.api import error_of, submit, wait_state, workdir
from trainhouse.client.api import _sse

SCRIPT = r"""
import sys
for i in range(20000):  # several 256 KiB chunks, split inside characters
    print(f"\x1b[32mline {i}\x1b[0m ünïcödé ✓")
sys.stdout.write("no newline at the end")
"""


def events(api: TestClient, job_id: int, **params: Any) -> list[tuple[str, Any]]:
    with api.stream("GET", f"/api/v1/jobs/{job_id}/logs/stream", params=params) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        return list(_sse(resp.iter_lines()))


def test_the_stream_sends_every_byte_once_then_ends(real_api: TestClient, tmp_path: Path) -> None:
    api = real_api  # the stream of a real rank's log
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path, SCRIPT)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    log = Path(api.get(f"/api/v1/jobs/{job['id']}").json()["job_dir"]) / "logs" / "rank-0.log"
    got = events(api, job["id"])
    assert got[-1] == ("end", {"state": "COMPLETED"})
    text = "".join(d["text"] for k, d in got if k == "log")
    assert text == log.read_bytes().decode()  # colours and UTF-8 intact, nothing twice
    assert "\x1b[32mline 19999\x1b[0m ünïcödé ✓" in text
    assert text.endswith("no newline at the end")
    assert got[-2][1]["offset"] == log.stat().st_size

    # resume from the middle of a character: the stream never splits it
    cut = log.read_bytes().index("✓".encode()) + 1
    resumed = events(api, job["id"], **{"from": f"0:{cut}"})
    rest = "".join(d["text"] for k, d in resumed if k == "log")
    assert rest.encode(errors="surrogateescape").endswith(b"no newline at the end")
    whole = log.read_bytes()
    assert rest == whole[cut:].decode(errors="replace")

    tail = events(api, job["id"], tail=2)
    assert "".join(d["text"] for k, d in tail if k == "log").splitlines() == [
        "\x1b[32mline 19999\x1b[0m ünïcödé ✓",
        "no newline at the end",
    ]


def test_the_stream_refuses_bad_input(real_api: TestClient, tmp_path: Path) -> None:
    api = real_api  # the stream of a real rank's log
    job = submit(api, "entrypoint: python train.py", workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    url = f"/api/v1/jobs/{job['id']}/logs/stream"
    resp = api.get(url, params={"from": "0:12,x"})
    assert resp.status_code == 422 and "0:1234,1:88" in error_of(resp)["message"]
    resp = api.get(url, params={"rank": "3"})
    assert resp.status_code == 404 and "there is no rank 3" in error_of(resp)["message"]
    assert api.get("/api/v1/jobs/999/logs/stream").status_code == 404
    assert json.loads(api.get(url, params={"tail": -1}).text)["error"]["code"]
