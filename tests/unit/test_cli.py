"""The CLI's shape: what starting it imports, the commands it has, and ``trainhouse server``
taking its defaults from ``Settings`` (what ``--help`` shows included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

import trainhouse
from trainhouse.cli import server as server_cli
from trainhouse.cli.app import app
from trainhouse.core.envspec import parse_size
from trainhouse.executors.registry import EXECUTORS
from trainhouse.spec import parse_duration
from trainhouse.usecases.settings import Settings

SRC = Path(trainhouse.__file__).resolve().parents[1]

# what neither the CLI nor the client may import to start: the server side and torch (of the
# executors, only their table is read, for `server --help`: it imports none of them)
SERVER_SIDE = (
    "torch",
    "fastapi",
    "sqlalchemy",
    "uvicorn",
    "trainhouse.server",
    "trainhouse.store",
    "trainhouse.scheduler",
    "trainhouse.executors.base",
    "trainhouse.executors.local",
    "trainhouse.executors.ray.executor",
    "trainhouse.executors.node.torchrun",
    "trainhouse.executors.inventory",
    "trainhouse.monitoring",
    "trainhouse.sdk",
    "ray",
    "psutil",
)
# nor, for --help, the client's HTTP stack or the spec's validation
CLIENT_SIDE = ("httpx", "pydantic", "yaml", "trainhouse.spec", "trainhouse.jobfs.workdir")


def modules_after(code: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter (this checkout's source first) after ``code``."""
    path = [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_the_cli_imports_neither_the_server_nor_the_client_to_start() -> None:
    modules = modules_after("import trainhouse.cli.app")
    assert loaded(modules, SERVER_SIDE + CLIENT_SIDE) == []


def test_the_client_imports_no_server_module_and_no_spec() -> None:
    modules = modules_after("import trainhouse.client")
    assert loaded(modules, (*SERVER_SIDE, "pydantic", "yaml", "trainhouse.spec")) == []


@pytest.mark.parametrize("command", [["ps"], ["models", "list"]])
def test_a_client_command_imports_no_server_module(command: list[str]) -> None:
    """``trainhouse ps`` (``models list``) against a port nothing listens on: it runs, fails to
    connect (exit 3) and loads nothing of the server side on the way."""
    modules = modules_after(
        "from trainhouse.cli.app import app\n"
        "try:\n"
        f"    app([*{command!r}, '--url', 'http://127.0.0.1:9'], prog_name='trainhouse')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 3, exc.code"
    )
    assert "trainhouse.client" in modules
    # nor pydantic (typer 0.29 validates every option through it: ~100 ms more on each command)
    heavy = (*SERVER_SIDE, "pydantic", "trainhouse.spec", "trainhouse.jobfs.workdir")
    assert loaded(modules, heavy) == []


def test_the_commands_and_their_order() -> None:
    root = typer.main.get_command(app)
    assert list(root.commands) == [  # type: ignore[attr-defined]
        *("server", "demo", "queue", "set-priority", "login", "logout", "whoami", "spec"),
        *("submit", "ps", "show", "cancel", "logs", "metrics", "checkpoints", "artifacts"),
        *("tag", "note", "project", "archive", "delete", "compare"),
        *("resume", "clone", "top"),
        *("models", "datasets", "flows", "admin", "db", "envs", "search", "serve"),
    ]
    models = root.commands["models"]  # type: ignore[attr-defined]
    assert list(models.commands) == [
        *("list", "show", "register", "alias", "transfer", "download", "export", "delete")
    ]
    admin = root.commands["admin"]  # type: ignore[attr-defined]
    assert list(admin.commands) == ["init", "audit", "quota", "user", "token"]
    assert list(root.commands["db"].commands) == ["upgrade", "current"]  # type: ignore[attr-defined]
    assert list(root.commands["envs"].commands) == ["list", "prune"]  # type: ignore[attr-defined]
    serve = root.commands["serve"]  # type: ignore[attr-defined]
    assert list(serve.commands) == ["start", "list", "show", "stop"]


def test_serve_with_a_model_reference_starts_a_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve NAME@ALIAS`` is ``serve start NAME@ALIAS``; the other words are subcommands
    (options before the reference work too)."""
    from typer.testing import CliRunner

    calls: list[tuple[str, dict[str, Any]]] = []

    class Fake:
        url = "http://x"

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def serve(self, ref: str, **kw: Any) -> dict[str, Any]:
            calls.append((ref, kw))
            return {"name": kw["name"] or "m", "model": "m", "ref": "prod", "target_version": 3,
                    "job_id": 7, "state": "queued", "replicas": kw["replicas"]}  # fmt: skip

        def services(self) -> list[Any]:
            calls.append(("list", {}))
            return []

    monkeypatch.setattr("trainhouse.cli.options.client", lambda url: Fake())
    runner = CliRunner()
    first = runner.invoke(app, ["serve", "m@prod", "--replicas", "2"])
    assert first.exit_code == 0, first.output
    assert "service m: m@prod (version 3), job 7, queued" in first.output
    assert "dashboard: http://x/#/services/m" in first.output  # the service's page
    second = runner.invoke(app, ["serve", "--name", "rt", "m@prod"])
    assert second.exit_code == 0, second.output
    assert runner.invoke(app, ["serve", "list", "--json"]).exit_code == 0
    assert [c[0] for c in calls] == ["m@prod", "m@prod", "list"]
    assert (calls[0][1]["replicas"], calls[1][1]["name"]) == (2, "rt")


def server_options() -> dict[str, Any]:
    """``trainhouse server``'s click options by name."""
    root = typer.main.get_command(app)
    command = root.commands["server"]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_server_help_shows_the_defaults_of_settings(tmp_path: Path) -> None:
    """The defaults ``--help`` shows are Settings' (the CLI has none of its own to drift)."""
    defaults = Settings(home=tmp_path)
    durations = {"fairshare_half_life", "monitor_retention"}
    shown = {
        name: param.default
        for name, param in server_options().items()
        if type(param.default).__name__ == "_SettingsDefault"
    }
    assert set(shown) == {
        *("host", "port", "executor", "ray_placement_timeout", "shared_home", "cancel_grace"),
        *("fairshare_half_life", "max_infra_restarts", "monitor_interval", "monitor_retention"),
        "job_visibility",
        *("env_cache_size", "dataset_cache_bytes", "dataset_upload_bytes"),
        *("model_max_bytes", "clone_max_bytes"),
    }
    for name, default in shown.items():
        expected = getattr(defaults, name)
        value = parse_duration(default.shown) if name in durations else default.shown
        if name in (
            *("env_cache_size", "dataset_cache_bytes", "dataset_upload_bytes"),
            *("model_max_bytes", "clone_max_bytes"),
        ):
            value = parse_size(default.shown)
        assert value == expected, (
            f"--{name.replace('_', '-')} shows {default}, Settings has {expected!r}"
        )
        assert default() is None  # the value when the option is not given
    executors = " or ".join(f"{name} ({entry.summary})" for name, entry in EXECUTORS.items())
    assert server_options()["executor"].help == f"Executor: {executors}"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """The Settings ``trainhouse server`` would serve with (nothing is started)."""
    served: list[Settings] = []
    monkeypatch.setattr(server_cli, "serve", lambda settings, **_: served.append(settings))
    monkeypatch.setattr(server_cli, "port_free", lambda host, port: True)
    for var in ("TRAINHOUSE_DB", "TRAINHOUSE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return served


def test_server_passes_settings_only_what_was_given(
    tmp_path: Path, started: list[Settings]
) -> None:
    result = CliRunner().invoke(app, ["server", "--home", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started == [Settings(home=tmp_path.resolve())]

    started.clear()
    args = {
        "--host": "127.0.0.2",
        "--port": "9999",
        "--db": "sqlite:///x.db",
        "--cpus": "3",
        "--gpus": "0",
        "--ray-placement-timeout": "5",
        "--advertise-url": "http://h:1",
        "--quota-gpus": "2",
        "--quota-cpus": "4",
        "--cancel-grace": "3",
        "--fairshare-half-life": "12h",
        "--max-infra-restarts": "0",
        "--checkpoint-url": "/shared",
        "--log-retention": "30d",
        "--monitor-interval": "0",
        "--monitor-retention": "1d",
        "--job-visibility": "all",
        "--env-index-url": "https://u:p@pypi.example/simple",
        "--env-cache-size": "1.5G",
    }
    argv = ["server", "--home", str(tmp_path), "--shared-home", "--auth"]
    argv += ["--allowed-host", "a.example", "--allowed-host", "10.0.0.5"]
    argv += ["--env-find-links", "/wheels", "--env-find-links", "https://w.example/"]
    argv += ["--env-extra-index-url", "https://x.example/simple"]
    argv += [item for pair in args.items() for item in pair]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings == Settings(
        home=tmp_path.resolve(),
        host="127.0.0.2",
        port=9999,
        db_url="sqlite:///x.db",
        cpus=3,
        gpus="0",
        ray_placement_timeout=5.0,
        shared_home=True,
        advertise_url="http://h:1",
        allowed_hosts=("a.example", "10.0.0.5"),
        quota_gpus=2,
        quota_cpus=4,
        cancel_grace=3.0,
        fairshare_half_life=12 * 3600.0,
        max_infra_restarts=0,
        checkpoint_url="/shared",
        log_retention=30 * 86400.0,
        monitor_interval=0.0,
        monitor_retention=86400.0,
        auth=True,
        job_visibility="all",
        env_index_url="https://u:p@pypi.example/simple",
        env_extra_index_urls=("https://x.example/simple",),
        env_find_links=("/wheels", "https://w.example/"),
        env_cache_size=int(1.5 * 1024**3),
    )


def test_server_refuses_what_settings_refuses(tmp_path: Path, started: list[Settings]) -> None:
    for argv, message in (
        (["--job-visibility", "some"], "--job-visibility must be own, list or all"),
        (["--executor", "nope"], "--executor must be 'local' or 'ray'"),
        (["--cancel-grace", "-1"], "--cancel-grace must be >= 0"),
        (["--fairshare-half-life", "soon"], "--fairshare-half-life must be a duration"),
        (["--allowed-host", "https://a.example"], "--allowed-host takes a host name"),
        (["--advertise-url", "head-node:8470"], "--advertise-url must be an http:// or"),
    ):
        result = CliRunner().invoke(app, ["server", "--home", str(tmp_path), *argv])
        assert result.exit_code == 2, result.output
        assert message in result.output
    assert started == []


def test_show_speaks_words_not_json_or_raw_signals() -> None:
    from trainhouse.cli.render import exit_words, placement_words

    placement = {
        "nodes": [
            {"node": "a", "cpus": 4, "gpus": [0, 1], "procs": 2},
            {"node": "b", "cpus": 1, "gpus": [], "procs": 1},
        ]
    }
    assert placement_words(placement) == "a: 2 ranks, 4 CPUs, GPUs 0,1; b: 1 rank, 1 CPU"
    assert placement_words(None) == "-"
    assert exit_words(-15) == "SIGTERM" and exit_words(-9) == "SIGKILL"
    assert exit_words(143) == "143 (SIGTERM)" and exit_words(3) == "3" and exit_words(None) == "-"
    assert exit_words(-99) == "signal 99"


@pytest.mark.parametrize("interrupted", ["saying", "loading"])
def test_ctrl_c_right_after_submit_detaches(
    interrupted: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job placed at once can be running before the follower has loaded: a Ctrl-C then
    (while the CLI says what it submitted, or imports the follower) detaches as it does while
    following (it ended the command with 130, "interrupted", the job's id unsaid)."""
    from trainhouse.cli import jobs, render

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    if interrupted == "saying":
        said = render.console.print
        monkeypatch.setattr(
            render.console,
            "print",
            lambda text, **kw: ctrl_c() if "submitted" in str(text) else said(text, **kw),
        )
    else:
        monkeypatch.setattr("builtins.__import__", _interrupting_import(ctrl_c))
    job: Any = {"id": 7, "name": "long", "state": "RUNNING"}
    with pytest.raises(typer.Exit) as ended:
        try:
            jobs.follow_job(
                SimpleNamespace(url="http://x"), job, "submitted job 7", as_json=False, detach=False
            )  # type: ignore[arg-type]
        except KeyboardInterrupt:
            pytest.fail("the Ctrl-C ended the command instead of detaching")
    assert ended.value.exit_code == 0
    assert "detached; job 7 keeps running" in capsys.readouterr().out


def _interrupting_import(ctrl_c: Any) -> Any:
    """``__import__``, with a Ctrl-C while ``trainhouse.cli.follow`` loads."""
    real = __import__

    def fake(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "trainhouse.cli.follow":
            ctrl_c()
        return real(name, *args, **kwargs)

    return fake


@pytest.mark.parametrize("command", ["checkpoints", "artifacts", "models"])
def test_downloads_report_progress_to_the_client_and_say_where(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``checkpoints --download``, ``artifacts --download`` and ``models download`` share one
    progress bar: the client gets a callback that takes (done, total), and the command says
    where the files went (or prints JSON)."""
    from typer.testing import CliRunner

    seen: list[tuple[int, int | None]] = []

    class Fake:
        url = "http://x"

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def _fetch(self, dest: Path, progress: Any) -> Path:
            for done in (0, 512, 1024):
                progress(done, 1024)
                seen.append((done, 1024))
            return dest / "got"

        def download_checkpoint(self, job_id: int, step: Any, dest: Path, **kw: Any) -> Path:
            return self._fetch(dest, kw["progress"])

        def download_artifacts(self, job_id: int, path: str, dest: Path, **kw: Any) -> list[Path]:
            return [self._fetch(dest, kw["progress"])]

        def download_model(self, ref: str, dest: Path, **kw: Any) -> Path:
            return self._fetch(dest, kw["progress"])

    monkeypatch.setattr("trainhouse.cli.options.client", lambda url: Fake())
    args = {
        "checkpoints": ["checkpoints", "7", "--download", "latest", str(tmp_path)],
        "artifacts": ["artifacts", "7", "--download", "notes.txt", str(tmp_path)],
        "models": ["models", "download", "m@prod", str(tmp_path)],
    }[command]
    runner = CliRunner()
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert str(tmp_path / "got") in shown.output.replace("\n", "")
    assert seen == [(0, 1024), (512, 1024), (1024, 1024)]
    as_json = runner.invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert str(tmp_path / "got") in repr(json.loads(as_json.stdout))
