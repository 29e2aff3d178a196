"""Job environments without building one: the spec's block, the digest, the cache's LRU
removal, what the logs say (tests/integration/test_envs.py builds real ones)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.api import app_client, services, submit, wait_state, workdir
from tests.support.team import make_team, refused
from tests.support.wheels import serving, write_wheel
from trainhouse.core import envspec
from trainhouse.core.errors import EnvBuildError
from trainhouse.errors import SpecError
from trainhouse.executors.base import Exit
from trainhouse.executors.node import envbuild
from trainhouse.executors.node.supervise import read_record
from trainhouse.jobfs import envcache
from trainhouse.jobfs.layout import JobLayout
from trainhouse.lifecycle import FailureKind
from trainhouse.scheduler.failures import analyse
from trainhouse.spec import NoRestart, parse_spec


def spec_error(environment: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(f"entrypoint: python t.py\nenvironment: {environment}\n")
    return str(info.value)


@pytest.mark.parametrize(
    ("environment", "says"),
    [
        ("{requirements: /etc/passwd}", "environment.requirements must be a path inside"),
        ("{requirements: ../r.txt}", "environment.requirements must be a path inside"),
        ("{packages: ['--index-url=http://x']}", "environment.packages a package must not be"),
        ('{packages: ["a\\nb"]}', "environment.packages a package must be one line"),
        ("{packages: [x], index_url: 'ftp://h/'}", "environment.index_url the index URL must"),
        ("{packages: [x], extra_index_urls: ['/d']}", "environment.extra_index_urls an index"),
        ("{requirements: r.txt, pyproject: pyproject.toml}", "not both"),
        ("{}", "environment needs requirements, pyproject or packages"),
        ("{pyproject: setup.cfg}", "must name a pyproject.toml"),
        ("{packages: [x], pip: 1}", "unknown key 'environment.pip'"),
    ],
)
def test_a_bad_environment_names_the_field(environment: str, says: str) -> None:
    assert says in spec_error(environment)


def test_an_environment_takes_the_servers_index_unless_it_names_its_own() -> None:
    spec = parse_spec("entrypoint: python t.py\nenvironment: {packages: [tabulate==0.9.0]}\n")
    defaults = envspec.Defaults("https://u:p@idx/simple", ("https://x/simple",), ("/w",), 123)
    request = envspec.request_for(spec.environment, defaults, "7.2")
    assert request is not None
    assert (request.index_url, request.extra_index_urls, request.find_links) == (
        "https://u:p@idx/simple",
        ["https://x/simple"],
        ["/w"],
    )
    assert request.cache_size == 123 and request.job == "7.2" and request.packages
    own = parse_spec(
        "entrypoint: python t.py\n"
        "environment: {packages: [a], index_url: 'https://mine/', find_links: []}\n"
    )
    mine = envspec.request_for(own.environment, defaults, "1.1")
    assert mine is not None and mine.index_url == "https://mine/" and mine.find_links == []
    assert envspec.Request.from_json(mine.to_json()) == mine
    assert envspec.request_for(None, defaults, "1.1") is None


def digest_of(workdir: Path, **fields: object) -> str:
    return envbuild.digest(envspec.Request(cache="", **fields), workdir)  # type: ignore[arg-type]


def test_a_changed_included_file_changes_the_digest(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("-r reqs/base.txt\n-c pins.txt\nthenv-a\n")
    (tmp_path / "reqs").mkdir()
    (tmp_path / "reqs" / "base.txt").write_text("thenv-b==1.0\n")
    (tmp_path / "pins.txt").write_text("thenv-c<2\n")
    first = digest_of(tmp_path, requirements="requirements.txt")
    assert digest_of(tmp_path, requirements="requirements.txt") == first
    # comments, blank lines, spacing and order: the same requirements
    (tmp_path / "requirements.txt").write_text(
        "# ours\nthenv-a   # latest\n\n-r reqs/base.txt\n-c pins.txt\n"
    )
    assert digest_of(tmp_path, requirements="requirements.txt") == first
    (tmp_path / "reqs" / "base.txt").write_text("thenv-b==1.1\n")  # the -r include
    second = digest_of(tmp_path, requirements="requirements.txt")
    assert second != first
    (tmp_path / "pins.txt").write_text("thenv-c<3\n")  # the -c include
    assert digest_of(tmp_path, requirements="requirements.txt") not in (first, second)
    # the index options count too (credentials included, never shown)
    assert digest_of(tmp_path, packages=["x"]) != digest_of(
        tmp_path, packages=["x"], index_url="https://i/"
    )


def test_an_include_outside_the_workdir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "outside.txt").write_text("x\n")
    (tmp_path / "wd" / "r.txt").write_text("-r ../outside.txt\n")
    with pytest.raises(EnvBuildError, match="outside the workdir"):
        digest_of(tmp_path / "wd", requirements="r.txt")
    (tmp_path / "wd" / "r.txt").write_text("-r missing.txt\n")
    with pytest.raises(EnvBuildError, match=r"missing\.txt is not in the workdir"):
        digest_of(tmp_path / "wd", requirements="r.txt")


def test_the_digest_covers_the_lock_and_a_local_wheel_directory(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "j"\ndependencies = ["x"]\n')
    plain = digest_of(tmp_path, pyproject="pyproject.toml")
    (tmp_path / "uv.lock").write_text("version = 1\n")
    locked = digest_of(tmp_path, pyproject="pyproject.toml")
    assert locked != plain
    (tmp_path / "wheels").mkdir()
    before = digest_of(tmp_path, packages=["x"], find_links=["wheels"])
    (tmp_path / "wheels" / "x-2.0-py3-none-any.whl").write_bytes(b"w")
    assert digest_of(tmp_path, packages=["x"], find_links=["wheels"]) != before


def test_a_requirement_for_another_torch_fails_before_any_build(tmp_path: Path) -> None:
    request = envspec.Request(cache=str(tmp_path / "cache"), packages=["torch==1.0.0"])
    with pytest.raises(EnvBuildError, match="another torch than the server's"):
        envbuild.ensure(request, tmp_path, print)
    assert not (tmp_path / "cache").exists()


def test_credentials_are_redacted() -> None:
    text = "GET https://user:pa55@idx.example/simple/x/ and http://tok@h/ and file:///x"
    assert envspec.redact(text) == (
        "GET https://***@idx.example/simple/x/ and http://***@h/ and file:///x"
    )


def fake_env(cache: Path, digest: str, size: int, used: float) -> None:
    path = cache / digest
    path.mkdir(parents=True)
    (path / envcache.READY).write_text("{}")
    (path / "blob").write_bytes(b"x" * size)
    (path / envcache.USED).touch()
    os.utime(path / envcache.USED, (used, used))


def test_prune_removes_the_least_recently_used_never_one_in_use(tmp_path: Path) -> None:
    for i, digest in enumerate(["aa", "bb", "cc", "dd"]):
        fake_env(tmp_path, digest, 64 * 1024, 1000.0 + i)
    (tmp_path / "ee").mkdir()  # no ready marker: not an environment
    listed = envcache.cached(tmp_path)
    assert [e.digest for e in listed] == ["aa", "bb", "cc", "dd"]
    each = listed[0].size
    locks = tmp_path / ".locks"
    with open(locks / "aa.use", "ab") as held:  # an attempt uses the oldest one
        fcntl.flock(held, fcntl.LOCK_SH)
        (tmp_path / ".users" / "aa").mkdir(parents=True)
        (tmp_path / ".users" / "aa" / "3.1").write_text("1")
        assert next((e.digest, e.in_use, e.jobs) for e in envcache.cached(tmp_path)) == (
            "aa",
            True,
            ["3.1"],
        )
        removed = envcache.prune(tmp_path, 2 * each)
        assert [e.digest for e in removed] == ["bb", "cc"]
        assert sorted(e.digest for e in envcache.cached(tmp_path)) == ["aa", "dd"]
        assert not envcache.remove(tmp_path, "aa")
    assert [e.digest for e in envcache.prune(tmp_path, 0)] == ["aa", "dd"]
    assert envcache.cached(tmp_path) == []


def test_the_launcher_log_tells_where_the_environment_stands() -> None:
    assert envspec.phase("torchrun says hi\n") is None
    starting = f"{envspec.SETTING_UP} (requirements.txt)\n"
    assert envspec.phase(starting) == "setting up environment"
    assert (
        envspec.phase(starting + "trainhouse: environment 0a1b ready in 3.25 s (built)\n")
        == "environment built in 3.2 s"
    )
    assert (
        envspec.phase(starting + f"{envspec.FAILED_LINE}:\nerror: nope\n") == "environment failed"
    )


def test_a_failed_build_is_the_jobs_failure_and_never_restarted(tmp_path: Path) -> None:
    files = JobLayout(tmp_path, 1)
    files.logs.mkdir(parents=True)
    files.log("launcher").write_text(
        "=== trainhouse: attempt 1 ===\n"
        f"{envspec.SETTING_UP} (x)\n{envspec.FAILED_LINE}:\n"
        "  cause: Because thenv-missing was not found in the package registry\n"
    )
    failure = analyse(Exit(1, 1, envspec.BUILD_FAILED_CODE), files, 2, NoRestart())
    assert failure.kind is FailureKind.USER and failure.permanent
    assert "thenv-missing was not found" in failure.log_tail
    assert failure.summary == "the job's environment could not be built"


def test_sizes() -> None:
    assert envspec.parse_size("20G") == 20 * 1024**3
    assert envspec.parse_size("512MiB") == 512 * 1024**2
    assert envspec.parse_size("1000") == 1000
    with pytest.raises(ValueError, match="must be a size"):
        envspec.parse_size("lots")


def test_envs_routes_are_for_admins(tmp_path: Path) -> None:
    for team in make_team(tmp_path, env_cache_size=100 * 1024):
        cache = team.rt.settings.env_cache
        for i, digest in enumerate(["aa11", "bb22", "cc33"]):
            fake_env(cache, digest, 64 * 1024, 1000.0 + i)
        assert "only admins" in refused(team.get("alice", "/envs"))
        assert "only admins" in refused(team.post("alice", "/envs/prune", json={}))
        listed = team.get("root", "/envs").json()
        assert [e["digest"] for e in listed["envs"]] == ["aa11", "bb22", "cc33"]
        assert listed["max_size"] == 100 * 1024 and listed["total_size"] > 0
        bad = team.post("root", "/envs/prune", json={"digest": "../x"})
        assert bad.status_code == 422
        # past the cache's size: the least recently used go first
        pruned = team.post("root", "/envs/prune", json={}).json()
        assert [e["digest"] for e in pruned["removed"]] == ["aa11", "bb22"]
        one = team.post("root", "/envs/prune", json={"digest": "cc"}).json()
        assert [e["digest"] for e in one["removed"]] == ["cc33"]
        assert team.get("root", "/envs").json()["envs"] == []


def test_a_launch_carries_the_environment_with_the_servers_index(tmp_path: Path) -> None:
    spec = (
        "name: e\nentrypoint: python train.py\n"
        "environment: {requirements: requirements.txt, extra_index_urls: []}\n"
    )
    with app_client(tmp_path, env_index_url="https://u:p@idx/simple") as api:
        job = submit(api, spec, workdir(tmp_path)).json()
        wait_state(api, job["id"], {"COMPLETED"})
        (launch,) = services(api).scheduler.executor.launches  # type: ignore[attr-defined]
        request = launch.environment
        assert request is not None and request.requirements == "requirements.txt"
        assert request.index_url == "https://u:p@idx/simple" and request.extra_index_urls == []
        assert request.job == f"{job['id']}.1"
        # what the job's page and `trainhouse show` say comes from the attempt's launcher log
        url = f"/api/v1/jobs/{job['id']}"
        assert api.get(url).json()["environment"] is None  # the fake wrote none
        log = services(api).files(job["id"]).log("launcher")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"=== trainhouse: attempt 1 ===\n{envspec.SETTING_UP} (requirements.txt)\n")
        assert api.get(url).json()["environment"] == "setting up environment"
        with log.open("a") as fh:
            fh.write("trainhouse: environment 0a1b ready in 0.12 s (reused)\n")
        assert api.get(url).json()["environment"] == "environment reused in 0.1 s"


def test_every_node_of_a_job_must_be_ready() -> None:
    two = f"[node 0] {envspec.SETTING_UP} (x)\n[node 1] {envspec.SETTING_UP} (x)\n"
    first = "[node 1] trainhouse: environment 0a ready in 2.50 s (built)\n"
    assert envspec.phase(two + first) == "setting up environment"
    second = "[node 0] trainhouse: environment 0a ready in 3.10 s (reused)\n"
    assert envspec.phase(two + first + second) == "environment built in 3.1 s"


def test_a_pyproject_with_its_lock_is_built_as_locked(tmp_path: Path) -> None:
    """uv.lock pins what the pyproject's dependencies resolve to: the build installs the
    locked version even where the wheel directory offers a newer one."""
    wheels, empty, project = tmp_path / "wheels", tmp_path / "empty", tmp_path / "wd"
    empty.mkdir()
    project.mkdir()
    write_wheel(wheels, "thenv-lib", "1.0")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "job"\nversion = "0.1"\nrequires-python = ">=3.11"\n'
        'dependencies = ["thenv-lib"]\n'
    )
    request = envspec.Request(
        cache=str(tmp_path / "cache"),
        pyproject="pyproject.toml",
        index_url=f"file://{empty}",
        find_links=[str(wheels)],
    )
    env = {**os.environ, "UV_INDEX_URL": f"file://{empty}", "UV_FIND_LINKS": str(wheels)}
    locked = subprocess.run(
        [envbuild._uv(), "lock", "--no-config", "--project", str(project)], env=env, check=False
    )
    assert locked.returncode == 0
    write_wheel(wheels, "thenv-lib", "2.0")  # newer, but not what the lock says
    lines: list[str] = []
    ready = envbuild.ensure(request, project, lines.append)
    ready.release()
    assert ready.built
    shown = subprocess.run(
        [str(ready.python), "-c", "import thenv_lib; print(thenv_lib.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "1.0", lines


def test_a_supervisor_stopped_while_building_ends_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM to the attempt's session (a cancel) while uv waits on the index: the
    supervisor records the signal, says so in its log, and the half-built environment goes."""
    wheels, empty, wd = tmp_path / "wheels", tmp_path / "empty", tmp_path / "wd"
    empty.mkdir()
    wd.mkdir()
    write_wheel(wheels, "thenv-slow", "1.0")
    exit_file = tmp_path / "exit-launcher"
    with serving(wheels) as index:
        index.hold()
        request = envspec.Request(
            cache=str(tmp_path / "cache"),
            packages=["thenv-slow"],
            index_url=f"file://{empty}",
            find_links=[index.links],
        )
        env = {**os.environ, envspec.ENV_VAR: request.to_json()}
        command = [sys.executable, "-m", "trainhouse.executors.node.supervise", str(exit_file)]
        proc = subprocess.Popen(
            [*command, sys.executable, "-c", "raise SystemExit('never started')"],
            cwd=wd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            assert index.held.wait(60), "uv never asked the index"
            os.killpg(proc.pid, signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "setting up environment" in out and "stopped by signal 15" in out, out
    assert "never started" not in out
    recorded = read_record(exit_file, within=tmp_path)
    assert recorded is not None and recorded[0] == -signal.SIGTERM
    assert list((tmp_path / "cache" / ".tmp").iterdir()) == []
    assert envcache.cached(tmp_path / "cache") == []


def test_the_digest_covers_what_local_paths_hold(tmp_path: Path) -> None:
    """Two jobs name ./mypkg-1.0-py3-none-any.whl (or -e ./lib, or a find-links wheel of the
    same name and size) with other contents: two environments, never one job running the
    other's code."""
    digests = []
    for who, code in (("ann", b"print('ann')"), ("bob", b"print('bob')")):
        wd = tmp_path / who
        (wd / "lib" / "pkg").mkdir(parents=True)
        (wd / "lib" / "pkg" / "__init__.py").write_bytes(code)
        (wd / "mypkg-1.0-py3-none-any.whl").write_bytes(code)
        (wd / "wheels").mkdir()
        (wd / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(code)
        (wd / "r.txt").write_text("./mypkg-1.0-py3-none-any.whl\n")
        (wd / "e.txt").write_text("-e ./lib\n")
        digests.append(
            (
                digest_of(wd, requirements="r.txt"),
                digest_of(wd, requirements="e.txt"),
                digest_of(wd, packages=["x"], find_links=["wheels"]),
                digest_of(wd, packages=[f"mypkg @ file://{wd / 'mypkg-1.0-py3-none-any.whl'}"]),
            )
        )
    ann, bob = digests
    for mine, theirs in zip(ann, bob, strict=True):
        assert mine != theirs
    # the same contents in another place: the same environment
    again = tmp_path / "ann2"
    shutil.copytree(tmp_path / "ann", again)
    assert digest_of(again, requirements="r.txt") == ann[0]
    assert digest_of(again, requirements="e.txt") == ann[1]
    # a FIFO where a wheel should be is named, never read (nothing waits on it)
    (again / "mypkg-1.0-py3-none-any.whl").unlink()
    os.mkfifo(again / "mypkg-1.0-py3-none-any.whl")
    assert digest_of(again, requirements="r.txt") != ann[0]


def test_a_package_built_for_another_torch_is_refused_by_name(tmp_path: Path) -> None:
    """torch is the server's, kept out of every environment (--excludes): a dependency built
    for another torch (a torchvision pinning torch==1.0.0, reached through another package)
    would install quietly and fail at import; the resolved set is checked and it is named. A
    pyproject asking for another torch fails before any build."""
    wheels, empty, wd = tmp_path / "wheels", tmp_path / "empty", tmp_path / "wd"
    empty.mkdir()
    wd.mkdir()
    write_wheel(wheels, "thenv-vision", "1.0", requires=["torch==1.0.0"])
    write_wheel(wheels, "thenv-app", "1.0", requires=["thenv-vision"])
    write_wheel(wheels, "thenv-fine", "1.0", requires=["torch>=1", "torch<1; extra == 'old'"])
    request = envspec.Request(
        cache=str(tmp_path / "cache"),
        packages=["thenv-app"],
        index_url=f"file://{empty}",
        find_links=[str(wheels)],
    )
    lines: list[str] = []
    with pytest.raises(EnvBuildError, match=r"thenv-vision 1\.0 requires 'torch==1\.0\.0'"):
        envbuild.ensure(request, wd, lines.append)
    assert not any((tmp_path / "cache").glob("[0-9a-f]*")), "nothing is left ready"
    fine = envbuild.ensure(
        envspec.Request(
            cache=str(tmp_path / "cache"),
            packages=["thenv-fine"],
            index_url=f"file://{empty}",
            find_links=[str(wheels)],
        ),
        wd,
        lines.append,
    )
    fine.release()
    assert fine.built
    (wd / "pyproject.toml").write_text(
        '[project]\nname = "job"\nversion = "0.1"\ndependencies = ["torch==1.0.0"]\n'
    )
    pyproject = envspec.Request(cache=str(tmp_path / "cache"), pyproject="pyproject.toml")
    with pytest.raises(EnvBuildError, match="another torch than the server's"):
        envbuild.ensure(pyproject, wd, lines.append)


def test_an_index_briefly_down_is_waited_for_and_a_missing_package_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package index answers 503 a few times (past uv's own retries): the build is tried
    again after a pause and the environment is made; a package the index does not have fails
    at once, never tried again."""
    monkeypatch.setattr(envbuild, "RETRY_DELAYS", (0.2, 0.2, 0.2))
    wheels, empty, wd = tmp_path / "wheels", tmp_path / "empty", tmp_path / "wd"
    empty.mkdir()
    wd.mkdir()
    write_wheel(wheels, "thenv-flaky", "1.0")
    with serving(wheels) as index:
        request = envspec.Request(
            cache=str(tmp_path / "cache"),
            packages=["thenv-flaky"],
            index_url=f"file://{empty}",
            find_links=[index.links],
        )
        index.outage(6)
        lines: list[str] = []
        ready = envbuild.ensure(request, wd, lines.append)
        ready.release()
        assert ready.built and index.failing == 0
        assert any("failed on the network; trying again" in line for line in lines), lines
        missing = envspec.Request(
            cache=str(tmp_path / "cache"),
            packages=["thenv-nowhere"],
            index_url=f"file://{empty}",
            find_links=[index.links],
        )
        lines.clear()
        with pytest.raises(EnvBuildError, match="thenv-nowhere"):
            envbuild.ensure(missing, wd, lines.append)
        assert not any("trying again" in line for line in lines), lines
