"""trainhouse.executors.node.launch runs a module as python -m does, then freezes the heap."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

MODULE = """
import atexit, gc, sys

atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
print("argv:", sys.argv[1:], "main:", __name__, flush=True)
if "--fail" in sys.argv:
    raise RuntimeError("the module failed")
sys.exit(int(sys.argv[1]))
"""


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "some_module.py").write_text(textwrap.dedent(MODULE))
    return subprocess.run(
        [sys.executable, "-m", "trainhouse.executors.node.launch", "some_module", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_module_gets_its_arguments_and_its_exit_code_is_the_launchers(tmp_path: Path) -> None:
    done = launch(tmp_path, "3", "--x=1")
    assert done.returncode == 3, done.stderr
    assert "argv: ['3', '--x=1'] main: __main__" in done.stdout
    assert "frozen at exit: True" in done.stdout


def test_an_exception_ends_it_as_it_would_end_python_m(tmp_path: Path) -> None:
    done = launch(tmp_path, "0", "--fail")
    assert done.returncode == 1
    assert "RuntimeError: the module failed" in done.stderr
    assert "frozen at exit: True" in done.stdout


def test_no_module_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainhouse.executors.node.launch"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "usage:" in done.stderr
