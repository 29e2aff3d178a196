"""Fixtures shared by every tier; they fail a test that leaks a child process, thread or temp file.

Every test runs with ``TMPDIR`` pointed at a directory of the session's own, so that a temp file
left behind by the code under test (or by a process it started) is seen and reported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.support.hostile import Fifos
from tests.support.postgres import PG_ADMIN, create_database, drop_database, pg_url_of
from tests.support.processes import add_session_root, marked_processes
from tests.support.servers import Server, assert_clean_stop, start_server
from tests.support.templates import drop_templates, keep_templates_in, pg_template

_LEAK_TMP = Path(tempfile.mkdtemp(prefix="trainhouse-tests-"))
os.environ["TMPDIR"] = str(_LEAK_TMP)
# clients in tests never pick up the developer's own stored tokens or TRAINHOUSE_TOKEN
os.environ["TRAINHOUSE_CONFIG_DIR"] = str(_LEAK_TMP / "client-config")
os.environ.pop("TRAINHOUSE_TOKEN", None)
tempfile.tempdir = str(_LEAK_TMP)
# A suite started in the background (`make test &` in a script) inherits SIGINT ignored, and so
# would every CLI a test starts: a test that presses Ctrl-C needs a terminal's default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# pytest's own tmp_path directories live here too; they are not leaks
_PYTEST_TMP_PREFIX = "pytest-of-"


def _live_children() -> list[psutil.Process]:
    out = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
    return out


def _describe(procs: list[psutil.Process]) -> str:
    parts = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            parts.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
    return "\n".join(parts)


@pytest.fixture(scope="session", autouse=True)
def session_roots(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The leak check and the fault tests find this session's job processes by where their
    directories lie: TMPDIR, and pytest's temp root, which pytest-xdist puts elsewhere. The
    migrated databases that tests copy (tests.support.templates) are kept in that root too."""
    add_session_root(tmp_path_factory.getbasetemp())
    keep_templates_in(tmp_path_factory.mktemp("templates"))


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    children_before = {p.pid for p in _live_children()}
    marked_before = {p.pid for p in marked_processes()}
    threads_before = set(threading.enumerate())
    tmp_before = set(os.listdir(_LEAK_TMP))
    yield
    deadline = time.monotonic() + 15
    while True:
        children = [p for p in _live_children() if p.pid not in children_before]
        marked = [p for p in marked_processes() if p.pid not in marked_before]
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not (children or marked or threads) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    problems = []
    if children or marked:
        problems.append("leaked processes:\n" + _describe(children + marked))
        for p in children + marked:
            with contextlib.suppress(psutil.Error):
                p.kill()
    if threads:
        problems.append("leaked threads: " + ", ".join(t.name for t in threads))
    new_tmp = [
        n for n in set(os.listdir(_LEAK_TMP)) - tmp_before if not n.startswith(_PYTEST_TMP_PREFIX)
    ]
    if new_tmp:
        problems.append(f"leaked temp files in {_LEAK_TMP}: {sorted(new_tmp)}")
        for n in new_tmp:
            path = _LEAK_TMP / n
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(True)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    drop_templates()
    shutil.rmtree(_LEAK_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> str:
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN} is needed for the store tests: {exc}")
    return PG_ADMIN


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = create_database()
    try:
        yield pg_url_of(name)
    finally:
        drop_database(name)


@pytest.fixture
def pg_migrated_url(pg_server: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one test, migrated already (a copy of one migrated
    database: tests.support.templates), dropped afterwards."""
    name = create_database(template=pg_template())
    try:
        yield pg_url_of(name)
    finally:
        drop_database(name)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A real ``trainhouse server`` (4 CPU cores offered) in the test's temp home, stopped
    cleanly afterwards; on the running test's database backend."""
    srv = start_server(tmp_path / "home", "--cpus", "4")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


@pytest.fixture
def fifos() -> Iterator[Fifos]:
    """FIFOs a test leaves where a job would; whatever still waits on one is let go at the end
    (ask for it after the app's fixture, so that it is let go before the app stops)."""
    made = Fifos()
    try:
        yield made
    finally:
        made.release()
