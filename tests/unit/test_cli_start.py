"""What starting ``trainhouse`` imports, and the table its commands load from.

``trainhouse --help`` and ``trainhouse ps`` must start fast (bench/cli.py, goal < 0.3 s): --help
imports no command module and none of what typer's help renderer imports but never uses here;
``ps`` imports its own module, the client and nothing else. Each is run through the entry point
in a fresh interpreter, and what is in ``sys.modules`` at its end is pinned: adding an eager
import of anything heavy (torch, the server, pydantic, rich.markdown, ...) fails here. The table
(``trainhouse.cli.app.COMMANDS``) is checked against the command modules themselves.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.core import TyperGroup

import trainhouse
import trainhouse.cli
from trainhouse.cli.app import COMMANDS, app
from trainhouse.cli.lazy import LazyCommands, LazyGroup, Listed

SRC = Path(trainhouse.__file__).resolve().parents[1]

# never imported to start either command: the server side, torch, the spec's validation; what
# typer's help renderer imports only for markdown and pretty tracebacks (trainhouse.cli.lazy
# keeps it out); httpx's own command line, with the real click (trainhouse.cli.main keeps it out)
NEVER = (
    *("torch", "numpy", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psutil"),
    *("ray", "pydantic", "yaml", "trainhouse.server", "trainhouse.store", "trainhouse.sdk"),
    *("trainhouse.scheduler", "trainhouse.executors", "trainhouse.spec", "trainhouse.core.spec"),
    *("rich.markdown", "markdown_it", "rich.traceback", "rich.pretty", "rich.syntax"),
    *("pygments", "attr", "httpx._main", "click", "rich.progress"),
)
# the distributions each may import (besides the standard library and what the interpreter
# loads to start): a new one is a new cost on every start, to be weighed before it is added here
HELP_PACKAGES = {"trainhouse", "typer", "rich", "annotated_doc", "shellingham"}
PS_PACKAGES = {*HELP_PACKAGES, "httpx", "httpcore", "h11", "anyio", "sniffio", "certifi", "idna"}
PS_PACKAGES |= {"orjson"}  # trainhouse.core.wire: the client's JSON


def run_python(code: str, **env: str) -> str:
    """``python -c code`` with this checkout's source first on the path: its stdout."""
    path = [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    child = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOUSE_")}
    child.update(PYTHONPATH=os.pathsep.join(path), COLUMNS="100", **env)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def started(*argv: str, then: str = "") -> tuple[int, set[str]]:
    """``trainhouse ARGV`` through its entry point (``trainhouse.cli.main``) in a fresh
    interpreter: its exit code and the modules loaded when it ended (then ``then`` runs)."""
    out = run_python(
        "import json, sys\n"
        f"sys.argv = ['trainhouse', *{list(argv)!r}]\n"
        "from trainhouse.cli import main\n"
        "try:\n"
        "    main()\n"
        "    code = 0\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        f"{then}\n"
        "print(json.dumps([code, sorted(k for k, v in sys.modules.items() if v is not None)]))"
    )
    code, modules = json.loads(out.splitlines()[-1])
    return code, set(modules)


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def packages(modules: set[str]) -> set[str]:
    """The top-level packages of ``modules`` that are neither the standard library nor loaded
    by the bare interpreter (site's .pth hooks)."""
    bare = json.loads(run_python("import json, sys\nprint(json.dumps(sorted(sys.modules)))"))
    skip = set(sys.stdlib_module_names) | {m.split(".")[0] for m in bare} | {"__main__"}
    return {m.split(".")[0] for m in modules} - skip


def test_help_imports_no_command_module_and_nothing_it_does_not_render() -> None:
    code, modules = started("--help")
    assert code == 0
    assert loaded(modules, ("trainhouse",)) == [
        *("trainhouse", "trainhouse.cli", "trainhouse.cli.app", "trainhouse.cli.lazy")
    ]
    assert loaded(modules, (*NEVER, "httpx")) == []
    assert packages(modules) <= HELP_PACKAGES, packages(modules) - HELP_PACKAGES


def test_ps_imports_its_module_and_the_client_only() -> None:
    """``ps`` against a port nothing listens on: the whole client path up to the refused
    connection (exit 3)."""
    code, modules = started("ps", "--url", "http://127.0.0.1:9")
    assert code == 3
    cli = loaded(modules, ("trainhouse.cli",))
    assert cli == [
        *("trainhouse.cli", "trainhouse.cli.app", "trainhouse.cli.jobs", "trainhouse.cli.lazy"),
        *("trainhouse.cli.options", "trainhouse.cli.render"),
    ]
    others = set(loaded(modules, ("trainhouse",))) - {"trainhouse", *cli}
    assert loaded(others, ("trainhouse.client", "trainhouse.core")) == sorted(others)
    assert loaded(modules, NEVER) == []
    assert packages(modules) <= PS_PACKAGES, packages(modules) - PS_PACKAGES


def test_help_is_typers_own_rendering() -> None:
    """The stand-ins typer's renderer is imported with change nothing it prints (colours
    included); what they stand in for still works when called, and is the real module after."""
    cases = {}
    for label, first in (("as is", "import typer.rich_utils\n"), ("with stand-ins", "")):
        cases[label] = run_python(
            f"{first}import sys\nsys.argv = ['trainhouse', '--help']\n"
            "from trainhouse.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n",
            FORCE_COLOR="1",
        )
    assert "\x1b[" in cases["as is"] and "set-priority" in cases["as is"]
    assert cases["with stand-ins"] == cases["as is"]
    code, modules = started(
        "--help",
        then="import typer.rich_utils as r, rich.markdown, rich.traceback\n"
        "from typer.models import DeveloperExceptionConfig\n"
        "assert type(r.Markdown('# x')) is rich.markdown.Markdown\n"
        "tb = r.get_traceback(ValueError('x'), DeveloperExceptionConfig(), [])\n"
        "assert type(tb) is rich.traceback.Traceback\n"
        "assert rich.markdown.Heading and rich.traceback.install",
    )
    assert code == 0 and "rich.markdown" in modules


def eager_commands() -> Mapping[str, Any]:
    """The root's commands as ``add_typer`` makes them with every noun module imported (as the
    app was built before the table), in the table's order of modules."""
    eager = typer.Typer()
    added: set[str] = set()
    for name, entry in COMMANDS.items():
        module = importlib.import_module(f"trainhouse.cli.{entry.module}")
        if entry.group:
            eager.add_typer(module.app, name=name)
        elif entry.module not in added:
            eager.add_typer(module.app)
            added.add(entry.module)
    commands: Mapping[str, Any] = typer.main.get_group(eager).commands
    return commands


def listed_line(command: Any) -> str:
    """What the table should say of ``command``: the first paragraph of what --help lists."""
    text: str = command.short_help or command.help or ""
    return text.strip().split("\n\n")[0].strip()


def test_the_table_is_the_commands_of_the_modules() -> None:
    """Every noun module (a module of trainhouse.cli with a typer ``app``) is in the table, and
    the table lists each of its commands, in order, with its help's first paragraph."""
    nouns = set()
    for info in pkgutil.iter_modules(trainhouse.cli.__path__):
        module = importlib.import_module(f"trainhouse.cli.{info.name}")
        if info.name != "app" and isinstance(getattr(module, "app", None), typer.Typer):
            nouns.add(info.name)
    assert {entry.module for entry in COMMANDS.values()} == nouns
    eager = eager_commands()
    should = {}
    for name, command in eager.items():
        group = isinstance(command, TyperGroup)
        module = name if group else command.callback.__module__.rsplit(".", 1)[-1]
        should[name] = Listed(module, listed_line(command), group=group)
    assert list(COMMANDS) == list(should)
    for name, entry in COMMANDS.items():
        assert entry == should[name], f"COMMANDS[{name!r}] should be {should[name]!r}"


def test_a_command_loaded_from_the_table_is_the_one_add_typer_makes() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)
    eager = eager_commands()
    for name, made in eager.items():
        lazy = root.commands[name]  # type: ignore[attr-defined]
        assert type(lazy) is type(made) and lazy.name == made.name == name
        assert [p.name for p in lazy.params] == [p.name for p in made.params]
        if isinstance(made, TyperGroup):
            assert list(lazy.commands) == list(made.commands)  # type: ignore[attr-defined]
        else:
            assert lazy.callback.__wrapped__ is made.callback.__wrapped__  # type: ignore[union-attr]


def test_help_lists_what_the_commands_themselves_say(capsys: pytest.CaptureFixture[str]) -> None:
    """The root's help from the table (nothing made yet) is the help it prints with every
    command made."""
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)

    def shown() -> str:
        ctx = typer.Context(root, info_name="trainhouse")
        root.format_help(ctx, ctx.make_formatter())
        return capsys.readouterr().out

    listed = shown()
    assert all(root.lazy.made(name) is None for name in root.lazy)
    for name in list(root.lazy):
        root.lazy[name]
    assert all(root.lazy.made(name) is not None for name in root.lazy)
    assert shown() == listed
    assert "set-priority" in listed and "Run the trainhouse server in the foreground." in listed


def test_lazy_commands_import_a_module_on_first_look_up_only() -> None:
    loads: list[str] = []
    listed = {"a": Listed("one", "A."), "b": Listed("one", "B."), "c": Listed("two", "C.")}
    made = {"a": object(), "b": object(), "c": object()}

    def load(name: str) -> dict[str, Any]:
        loads.append(listed[name].module)
        return {n: made[n] for n, e in listed.items() if e.module == listed[name].module}

    commands = LazyCommands(listed, load)
    assert list(commands) == ["a", "b", "c"] and len(commands) == 3
    assert "b" in commands and "z" not in commands and commands.get("z") is None
    assert loads == [] and commands.made("a") is None
    assert commands["b"] is made["b"] and commands["a"] is made["a"] and loads == ["one"]
    commands["d"] = "added"  # type: ignore[assignment]
    commands["c"] = "replaced"  # type: ignore[assignment]
    del commands["a"]
    assert list(commands) == ["b", "c", "d"] and commands["c"] == "replaced"
    assert loads == ["one"] and "a" not in commands
    with pytest.raises(KeyError):
        del commands["a"]
