"""Log lines with the time each was written: the time index, the interleaved all-ranks view,
timestamps and grep, through joblogs and the real app in process."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.support.api import error_of, services, submit, wait_state, workdir
from trainhouse.jobfs import joblogs
from trainhouse.jobfs.joblogs import TIME_RECORD

SPEC = "name: two\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n"


def write_log(path: Path, pieces: list[tuple[bytes, float]]) -> None:
    """A log as the rank wrapper writes it: the bytes, and a time record per piece."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data, index = b"", b""
    for piece, at in pieces:
        index += TIME_RECORD.pack(len(data), at)
        data += piece
    path.write_bytes(data)
    path.with_name(path.name + ".times").write_bytes(index)


def test_lines_carry_the_time_their_piece_was_written(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    write_log(log, [(b"one\ntwo", 10.0), (b"\nthree\n", 12.5), (b"part", 13.0)])
    times = log.with_name("rank-0.log.times")
    lines, nxt = joblogs.read_lines(log, times, within=tmp_path)
    assert [(ln.text, ln.time) for ln in lines] == [
        (b"one\n", 10.0),
        (b"two\n", 10.0),  # its first byte came with the first piece
        (b"three\n", 12.5),
        (b"part", 13.0),
    ]
    assert nxt == len(b"one\ntwo\nthree\npart")
    whole, upto = joblogs.read_lines(log, times, within=tmp_path, offset=4, complete=True)
    assert [ln.text for ln in whole] == [b"two\n", b"three\n"] and upto == 14
    mid, _ = joblogs.read_lines(log, times, within=tmp_path, offset=5)
    assert mid[0].cont and mid[0].text == b"wo\n" and not mid[1].cont
    assert joblogs.stamp(1.5) == "1970-01-01T00:00:01.500Z"
    assert joblogs.stamp(None) == "-" * 24
    bare = tmp_path / "old.log"
    bare.write_bytes(b"no index\n")
    assert joblogs.read_lines(bare, tmp_path / "none", within=tmp_path)[0][0].time is None


def test_the_logs_route_interleaves_stamps_and_greps(api: TestClient, tmp_path: Path) -> None:
    job = submit(api, SPEC, workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    files = services(api).files(job["id"])
    write_log(files.log(0), [(b"a0 loss\n", 100.0), (b"b0\n", 102.0)])
    write_log(files.log(1), [(b"a1 loss\n", 101.0), (b"b1\n", 103.0)])
    url = f"/api/v1/jobs/{job['id']}/logs"

    every = api.get(url, params={"rank": "all"}).text
    assert every == "[rank 0] a0 loss\n[rank 1] a1 loss\n[rank 0] b0\n[rank 1] b1\n"
    stamped = api.get(url, params={"rank": "0", "timestamps": "true"}).text
    assert stamped.splitlines() == [
        "1970-01-01T00:01:40.000Z a0 loss",
        "1970-01-01T00:01:42.000Z b0",
    ]
    both = api.get(url, params={"rank": "all", "grep": "loss$", "timestamps": "true"}).text
    assert both.splitlines() == [
        "1970-01-01T00:01:40.000Z [rank 0] a0 loss",
        "1970-01-01T00:01:41.000Z [rank 1] a1 loss",
    ]
    last = api.get(url, params={"rank": "all", "tail": "1"}).text
    assert last == "[rank 0] b0\n[rank 1] b1\n"  # each rank's last line
    one = api.get(url, params={"rank": "1", "grep": "b"})
    assert one.text == "b1\n" and one.headers["X-Log-Offset"] == str(len(b"a1 loss\nb1\n"))

    nested = api.get(url, params={"grep": "(a+)+$"})
    assert nested.status_code == 422 and "exponential" in error_of(nested)["message"]
    broken = api.get(url, params={"grep": "(unclosed"})
    assert broken.status_code == 422 and "not a regular expression" in error_of(broken)["message"]
    assert api.get(url, params={"rank": "every"}).status_code == 422


def test_all_ranks_are_the_jobs_own_and_share_one_reads_bytes(
    api: TestClient, tmp_path: Path
) -> None:
    """A job of 2 ranks leaves 300 rank logs of 1 MiB each: ``rank=all`` reads ranks 0 and 1
    only, and at most one read's bytes (4 MiB) among them, not every file whole."""
    job = submit(api, SPEC, workdir(tmp_path)).json()
    wait_state(api, job["id"], {"COMPLETED"})
    files = services(api).files(job["id"])
    big = b"x" * 1023 + b"\n"
    for rank in range(300):
        write_log(files.log(rank), [(f"rank {rank} says hi\n".encode() + big * 1024, 100.0 + rank)])
    every = api.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": "all"}).text
    shown = {line.split("]")[0] for line in every.splitlines()}
    assert shown == {"[rank 0", "[rank 1"}
    assert len(every) <= joblogs.MAX_READ + 2 * 4096  # the rank prefixes on top
    assert "rank 0 says hi" in every and "rank 1 says hi" in every
