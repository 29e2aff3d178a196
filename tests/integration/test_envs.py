"""Job environments end to end: a real server, real torchrun ranks, real uv building from a
local wheel directory and a local HTTP index (offline and deterministic)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.servers import Server, start_server
from tests.support.wheels import Index, serving, write_wheel

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("envs")]  # one module server

SECRET = "th-s3cret-pw"

# what a job reports about the Python it runs in (torch only where a test asks: importing it
# costs every rank seconds on a busy machine)
SCRIPT = """
import json, sys
import thenv_alpha
info = {"python": sys.executable, "prefix": sys.prefix, "alpha": thenv_alpha.VERSION}
if "--torch" in sys.argv:
    import torch
    info.update(torch=torch.__version__, torch_file=torch.__file__)
print("ENVINFO " + json.dumps(info), flush=True)
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    write_wheel(directory, "thenv-alpha", "1.0")
    write_wheel(directory, "thenv-alpha", "2.0")
    write_wheel(directory, "thenv-beta", "1.0", ["thenv-alpha<2"])
    # asks for torch: the server's is used, never installed again (the index has none)
    write_wheel(directory, "thenv-gamma", "1.0", ["torch>=2"])
    write_wheel(directory, "thenv-delta", "1.0", ["thenv-alpha"])
    return directory


@pytest.fixture(scope="module")
def index(wheels: Path) -> Iterator[Index]:
    with serving(wheels) as idx:
        yield idx


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, wheels: Path, index: Index
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("envs-server")
    (root / "empty-index").mkdir()
    srv = start_server(
        root / "home",
        "--cpus",
        "4",
        "--env-index-url",
        f"file://{root / 'empty-index'}",
        # credentials given to the server: they must never reach a job's logs
        "--env-extra-index-url",
        f"http://th-user:{SECRET}@127.0.0.1:{index.port}/simple/",
        "--env-find-links",
        str(wheels),
    )
    try:
        yield srv
    finally:
        srv.stop()


def submit(server: Server, tmp_path: Path, environment: dict[str, Any], **spec: Any) -> int:
    wd = tmp_path / f"job-{time.monotonic_ns()}"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(spec.pop("script", SCRIPT)))
    for name, text in spec.pop("files", {}).items():
        (wd / name).write_text(text)
    body = {
        "name": "env-job",
        "entrypoint": "python train.py",
        "resources": {"procs_per_node": 1},
        "environment": environment,
        **spec,
    }
    (wd / "job.yaml").write_text(json.dumps(body))
    with server.client as c:
        return int(c.submit(wd / "job.yaml")["id"])


def launcher_log(server: Server, job_id: int) -> str:
    with server.client as c:
        return c.logs(job_id, rank="launcher")[0]


def rank_log(server: Server, job_id: int) -> str:
    with server.client as c:
        return c.logs(job_id, rank=0)[0]


def env_info(server: Server, job_id: int) -> dict[str, Any]:
    line = next(x for x in rank_log(server, job_id).splitlines() if x.startswith("ENVINFO "))
    info: dict[str, Any] = json.loads(line.removeprefix("ENVINFO "))
    return info


def distributions() -> list[str]:
    """What the server's environment (this interpreter's) has installed."""
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())


@pytest.fixture(scope="module")
def first_job(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A job whose requirements (through a -r include) name a package the server lacks, and one
    that asks for torch; the server's environment before and after."""
    before = distributions()
    job_id = submit(
        server,
        tmp_path_factory.mktemp("first"),
        {"requirements": "requirements.txt", "packages": ["thenv-gamma"]},
        files={"requirements.txt": "-r base.txt\n", "base.txt": "thenv-alpha==1.0  # pinned\n"},
        entrypoint="python train.py --torch",
    )
    job = server.wait(job_id, {"COMPLETED", "FAILED"}, timeout=180)
    return {"job": job, "before": before, "after": distributions()}


def test_a_job_imports_a_package_the_server_lacks(
    server: Server, first_job: dict[str, Any]
) -> None:
    job = first_job["job"]
    log = launcher_log(server, job["id"])
    assert job["state"] == "COMPLETED", (job["reason"], log)
    info = env_info(server, job["id"])
    assert info["alpha"] == "1.0"
    assert info["python"] != sys.executable and info["prefix"] != sys.prefix
    assert "setting up environment" in log and "(built)" in log
    # the server's environment is as it was: the package is not in it
    assert first_job["after"] == first_job["before"]
    assert not any(d.startswith("thenv-") for d in first_job["after"])
    with server.client as c:
        assert c.job(job["id"])["environment"].startswith("environment built in ")
    human = server.cli("show", str(job["id"]))
    assert "environment built in" in human.stdout
    # trainhouse envs list: the environment, no longer in use
    listed = server.cli_json("envs", "list")
    assert [e["digest"][:12] for e in listed["envs"]] == [info["prefix"].rsplit("/", 1)[1][:12]]
    assert listed["envs"][0]["in_use"] is False and listed["envs"][0]["size"] > 0


def test_torch_in_the_environment_is_the_servers(server: Server, first_job: dict[str, Any]) -> None:
    info = env_info(server, first_job["job"]["id"])
    assert info["torch"] == torch.__version__
    assert Path(info["torch_file"]).resolve() == Path(torch.__file__).resolve()
    prefix = Path(info["prefix"])
    assert not list(prefix.glob("lib/python*/site-packages/torch"))  # never installed again
    assert list(prefix.glob("lib/python*/site-packages/thenv_gamma"))


def test_two_jobs_with_the_same_requirements_build_once(server: Server, tmp_path: Path) -> None:
    env = {"packages": ["thenv-beta"]}
    ids = [submit(server, tmp_path, env), submit(server, tmp_path, env)]
    jobs = [server.wait(i, {"COMPLETED", "FAILED"}, timeout=180) for i in ids]
    logs = [launcher_log(server, i) for i in ids]
    assert [j["state"] for j in jobs] == ["COMPLETED", "COMPLETED"], logs
    assert sum(log.count("(built)") for log in logs) == 1, logs
    assert sum(log.count("(reused)") for log in logs) == 1, logs
    assert env_info(server, ids[0])["prefix"] == env_info(server, ids[1])["prefix"]
    assert all(SECRET not in log for log in logs)


def test_a_failing_requirement_fails_the_job_once(server: Server, tmp_path: Path) -> None:
    env = {"packages": ["thenv-missing==1.0"]}
    first = submit(server, tmp_path, env, max_restarts=3)
    job = server.wait(first, {"COMPLETED", "FAILED"}, timeout=120)
    assert job["state"] == "FAILED" and job["attempts"] == 1, job
    # the resolver's own message, in the reason and the log
    assert "thenv-missing" in job["reason"] and "not found" in job["reason"], job["reason"]
    assert "could not be built" in launcher_log(server, first)
    with server.client as c:
        assert c.job(first)["environment"] == "environment failed"
    # the next job with the same requirements tries again (no failure is cached)
    second = submit(server, tmp_path, env)
    server.wait(second, {"FAILED"}, timeout=120)
    log = launcher_log(server, second)
    assert "thenv-missing" in log and "not found" in log
    assert SECRET not in log and SECRET not in job["reason"]


def test_a_build_killed_halfway_is_built_cleanly_on_restart(
    server: Server, index: Index, tmp_path: Path
) -> None:
    index.hold()  # uv's first request for the find-links page waits: the build is halfway
    job_id = submit(server, tmp_path, {"packages": ["thenv-delta"], "find_links": [index.links]})
    assert index.held.wait(120), "the build never asked the index"
    tmp = server.home / "envs" / ".tmp"
    assert [p.name for p in tmp.iterdir()], "no build under way"
    with server.client as c:
        pid = c.job(job_id)["attempt_history"][0]["pid"]
    os.killpg(pid, signal.SIGKILL)  # the node's processes die: supervisor and uv alike
    index.release()
    job = server.wait(job_id, {"COMPLETED", "FAILED"}, timeout=180)
    log = launcher_log(server, job_id)
    assert job["state"] == "COMPLETED" and job["attempts"] == 2, (job, log)
    assert log.count("(built)") == 1
    assert list(tmp.iterdir()) == []  # what the killed build left is gone
    prefix = Path(env_info(server, job_id)["prefix"])
    assert (prefix / ".trainhouse-ready").is_file()
    done = subprocess.run(
        [str(prefix / "bin" / "python"), "-c", "import thenv_delta, thenv_alpha"], check=False
    )
    assert done.returncode == 0
