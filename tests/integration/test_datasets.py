"""Datasets end to end: a real server, real torchrun ranks, S3 over its real protocol (moto's
server mode, read by s3fs) and an uploaded directory. Jobs read exactly the bytes their pinned
version holds, each node fetches each object once however many jobs and ranks start at once,
and a file changed after registration fails the job with a reason naming it. And checkpoints
in the same S3 (``--checkpoint-url s3://...``) through a SIGKILLed rank."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jobs import RESUMABLE, rank_process, write_job
from tests.support.s3 import MotoS3, fsspec_io, running_moto_s3
from tests.support.servers import Server, assert_clean_stop, start_server

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("datasets")]  # one moto, one server
__all__ = ["fsspec_io"]  # a session fixture of tests.support.s3

# what each rank checks: every file of every pinned version, its bytes and its mode
SCRIPT = """
import hashlib, json, os, stat, sys
from pathlib import Path
import trainhouse.sdk as th

with th.init() as run:
    expected = run.hparams["expected"]
    seen = {}
    for key, root in sorted(run.datasets.items()):
        assert os.environ["TRAINHOUSE_DATASET_" + key.upper()] == str(root)
        for path in sorted(root.rglob("*")):
            mode = stat.S_IMODE(path.lstat().st_mode)
            if path.is_dir():
                assert mode == 0o555, (path, oct(mode))
                continue
            assert mode == 0o444, (path, oct(mode))
            rel = key + "/" + path.relative_to(root).as_posix()
            seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    assert seen == expected, (seen, expected)
    print("DATASETS OK", run.rank, len(seen), flush=True)
    run.log({"files": len(seen)}, step=1)
"""


@pytest.fixture(scope="module")
def s3(fsspec_io: None) -> Iterator[MotoS3]:
    with running_moto_s3() as store:  # the server below inherits its credentials
        yield store


@pytest.fixture(scope="module")
def server(s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("datasets") / "home"
    # the moto server is on loopback: a store on the server's own network
    srv = start_server(home, "--cpus", "4", "--dataset-allow-private")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def _job(tmp_path: Path, datasets: dict[str, str], expected: dict[str, str]) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = {
        "name": "reads-data",
        "entrypoint": "python train.py",
        "resources": {"procs_per_node": 2},
        "datasets": datasets,
        "hparams": {"expected": expected},
    }
    path = tmp_path / "trainhouse.yaml"
    path.write_text(json.dumps(spec))
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_jobs_read_their_pinned_versions_and_each_object_is_fetched_once(
    server: Server, s3: MotoS3, tmp_path: Path
) -> None:
    bucket = s3.make_bucket("data")
    objects = {
        "digits/train/a.bin": os.urandom(300_000),
        "digits/train/b.bin": os.urandom(70_000),
        "digits/labels.csv": b"label\n1\n2\n",
    }
    for key, data in objects.items():
        s3.put(bucket, key, data)
    added = server.cli_json(
        "datasets",
        "add",
        "digits",
        f"s3://{bucket}/digits",
        "--storage-option",
        f"endpoint_url={s3.endpoint_url}",
    )
    version = added["version"]
    assert (version["version"], version["files"], version["checksums"]) == (1, 3, "md5")
    assert version["size"] == sum(len(d) for d in objects.values())

    local = tmp_path / "val"
    (local / "deep").mkdir(parents=True)
    (local / "deep" / "v.txt").write_bytes(b"validation")
    uploaded = server.cli_json("datasets", "add", "val", str(local))["version"]
    assert uploaded["source"] is None and uploaded["checksums"] == "sha256"

    expected = {"train/" + key.removeprefix("digits/"): _sha(data) for key, data in objects.items()}
    expected["val/deep/v.txt"] = _sha(b"validation")
    spec = _job(tmp_path, {"train": "digits", "val": "val@1"}, expected)
    # two jobs of two ranks each, staged at once on the one node
    ids = [server.cli_json("submit", str(spec), "--detach")["id"] for _ in range(2)]
    with server.client as c:
        for job_id in ids:
            done = c.wait(job_id, timeout=240)
            assert done["state"] == "COMPLETED", (done["reason"], c.logs(job_id, rank="launcher"))
            assert [(p["key"], p["ref"]) for p in done["datasets"]] == [
                ("train", "digits@1"),
                ("val", "val@1"),
            ]
            assert done["staging"] is not None and "ready in" in done["staging"]
            assert done["latest_metrics"]["files"] == 4
    # the node fetched each object once, whatever the two jobs' four ranks did
    for key in objects:
        assert s3.gets(bucket, key) == 1, (key, s3.get_counts())
    shown = server.cli_json("datasets", "show", "digits@1")
    assert sorted(shown["jobs"]) == sorted(ids)
    assert {f["path"] for f in shown["manifest"]} == {"train/a.bin", "train/b.bin", "labels.csv"}
    cached = server.cli_json("datasets", "cache")
    by_ref = {ref: v for v in cached["versions"] for ref in v["refs"]}
    assert by_ref["digits@1"]["size"] == version["size"] and not by_ref["digits@1"]["in_use"]
    assert "val@1" in by_ref and cached["bytes"] >= version["size"] + len(b"validation")
    runs = server.cli_json(
        "ps", "--all", "--where", 'datasets.train = "digits@1"', "--columns", "datasets.train"
    )
    assert sorted(j["id"] for j in runs) == sorted(ids)
    assert {j["values"]["datasets.train"] for j in runs} == {"digits@1"}
    removed = server.cli("datasets", "rm", "digits@1")
    assert removed.returncode == 0, removed.stderr  # the jobs have ended


def test_a_file_changed_since_registration_fails_the_job_naming_it(
    server: Server, s3: MotoS3, tmp_path: Path
) -> None:
    bucket = s3.make_bucket("changing")
    s3.put(bucket, "set/one.bin", b"1" * 5000)
    s3.put(bucket, "set/two.bin", b"2" * 5000)
    server.cli_json(
        "datasets",
        "add",
        "changing",
        f"s3://{bucket}/set",
        "--storage-option",
        f"endpoint_url={s3.endpoint_url}",
    )
    s3.put(bucket, "set/two.bin", b"3" * 5001)  # changed under the registered version
    spec = _job(tmp_path, {"data": "changing@1"}, {})
    job_id = server.cli_json("submit", str(spec), "--detach")["id"]
    with server.client as c:
        done = c.wait(job_id, timeout=180)
    assert done["state"] == "FAILED", done
    assert "two.bin" in done["reason"] and "changed since it was registered" in done["reason"]
    assert done["restarts"] == 0 and done["infra_restarts"] == 0
    result = server.cli("show", str(job_id))
    assert "staging failed" in result.stdout, result.stdout


def test_a_restart_reads_the_same_version_from_the_nodes_cache(
    server: Server, tmp_path: Path
) -> None:
    data = tmp_path / "small"
    data.mkdir()
    (data / "x.txt").write_bytes(b"first")
    server.cli_json("datasets", "add", "small", str(data))
    (data / "x.txt").write_bytes(b"second")
    assert server.cli_json("datasets", "add", "small", str(data))["version"]["version"] == 2
    # a bare name is the newest version at submit; the first attempt fails, the restart reads
    # what the job pinned from the node's cache
    spec = _job(tmp_path, {"s": "small"}, {"s/x.txt": _sha(b"second")})
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\nif os.environ['TRAINHOUSE_ATTEMPT'] == '1':\n    sys.exit(3)\n"
        + script.read_text()
    )
    job_id = server.cli_json("submit", str(spec), "--set", "max_restarts=1", "--detach")["id"]
    with server.client as c:
        done = c.wait(job_id, timeout=180)
    assert done["state"] == "COMPLETED" and done["attempts"] == 2, done["reason"]
    assert [p["ref"] for p in done["datasets"]] == ["small@2"]
    launcher = server.cli("logs", str(job_id), "--rank", "launcher").stdout
    assert launcher.count("trainhouse: staging small@2: ready") == 2, launcher
    assert "0.0 MB fetched, 1 files cached" in launcher  # the restart fetched nothing


def test_checkpoints_in_s3_survive_a_killed_rank(
    s3: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint storage's claim ("any fsspec URL") over S3's real protocol: a job's
    checkpoints go to the bucket, a SIGKILLed rank's job restarts from the newest one there,
    and every step is stored once."""
    bucket = s3.make_bucket("checkpoints")
    # botocore reads the endpoint from the environment: the server and the ranks inherit it
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint_url)
    srv = start_server(tmp_path / "home", "--cpus", "4", "--checkpoint-url", f"s3://{bucket}/runs")
    try:
        spec = write_job(
            tmp_path,
            RESUMABLE,
            "name: s3-checkpoints\nentrypoint: python train.py\n"
            "resources: {procs_per_node: 2}\nhparams: {steps: 30}\n",
        )
        job_id = srv.cli_json("submit", str(spec), "--detach")["id"]
        srv.wait_step(job_id, 12, timeout=180)
        rank = rank_process(job_id, 1)
        assert rank is not None
        rank.kill()
        done = srv.wait(job_id, {"COMPLETED", "FAILED"})
        assert done["state"] == "COMPLETED", done["reason"]
        assert done["infra_restarts"] == 1 and done["restarts"] == 0
        log = srv.cli("logs", str(job_id), "--rank", "0").stdout
        resumed = [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if "starts at" in line]
        assert resumed[0] == 0 and resumed[1] >= 11, log  # from a checkpoint in the bucket
        listed = srv.cli_json("checkpoints", str(job_id))
        assert listed["directory"].startswith(f"s3://{bucket}/runs/")
        assert max(c["step"] for c in listed["checkpoints"]) == 25  # one every 5 steps
        keys = [
            o["Key"]
            for page in s3.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix="runs/"
            )
            for o in page.get("Contents", [])
        ]
        assert any("step" in k for k in keys), keys
        points = srv.cli_json("metrics", str(job_id))["series"][0]["points"]
        assert [p[0] for p in points] == list(range(30))  # every step exactly once
    finally:
        assert_clean_stop(srv)


def test_the_next_jobs_versions_are_staged_while_the_queue_waits(
    server: Server, tmp_path: Path
) -> None:
    data = tmp_path / "ahead"
    data.mkdir()
    (data / "big.bin").write_bytes(os.urandom(200_000))
    version = server.cli_json("datasets", "add", "ahead", str(data))["version"]
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "train.py").write_text("import time\ntime.sleep(120)\n")
    (blocker / "job.yaml").write_text(
        "name: blocker\nentrypoint: python train.py\nresources: {procs_per_node: 4}\n"
    )
    first = server.cli_json("submit", str(blocker / "job.yaml"), "--detach")["id"]
    spec = _job(tmp_path, {"d": "ahead"}, {"d/big.bin": _sha((data / "big.bin").read_bytes())})
    second = server.cli_json("submit", str(spec), "--detach")["id"]
    with server.client as c:
        # the second job waits for CPUs; its version reaches the node's cache meanwhile
        deadline = time.monotonic() + 60
        while True:
            cached = {r for v in c.dataset_cache()["versions"] for r in v["refs"]}
            if "ahead@1" in cached:
                break
            assert time.monotonic() < deadline, "the queued job's version was never staged"
            assert c.job(second)["state"] == "QUEUED"
            time.sleep(0.3)
        assert c.job(second)["state"] == "QUEUED"
        c.cancel(first)
        done = c.wait(second, timeout=180)
    assert done["state"] == "COMPLETED", done["reason"]
    launcher = server.cli("logs", str(second), "--rank", "launcher").stdout
    assert "0.0 MB fetched, 1 files cached" in launcher, launcher
    assert version["size"] == 200_000
