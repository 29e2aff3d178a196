"""The use-case layer is the only way from a route to the store (docs/architecture.md): the import
contracts keep ``trainhouse.server`` from importing the store, the scheduler and the rest (``make
check`` runs them; ``make test`` runs this test); what they cannot see is a route reaching the
store through the runtime it is handed. This test reads the server's source: a route may use the
runtime's settings, its authenticator and its stream slots, and hands the runtime itself to a use
case; everything else goes through :mod:`trainhouse.usecases`."""

from __future__ import annotations

import ast
from pathlib import Path

import trainhouse

SERVER = Path(trainhouse.__file__).parent / "server"
#: what a route may read off the runtime (``rt.<name>``)
ALLOWED = {"settings", "auth", "streams", "start", "close"}  # start/close: the app's lifespan


def _reaches(source: str, name: str) -> list[str]:
    """Where ``source`` reaches past the use cases: any ``.store``, and ``rt.<x>`` for an
    ``x`` not in ALLOWED."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr == "store":
            found.append(f"{name}:{node.lineno}: .store")
        elif (
            isinstance(node.value, ast.Name) and node.value.id == "rt" and node.attr not in ALLOWED
        ):
            found.append(f"{name}:{node.lineno}: rt.{node.attr}")
    return found


def test_the_server_reaches_the_store_only_through_the_use_cases() -> None:
    modules = sorted(SERVER.rglob("*.py"))
    assert len(modules) > 10
    found = [
        hit
        for path in modules
        for hit in _reaches(path.read_text(), str(path.relative_to(SERVER.parent)))
    ]
    assert not found, "routes reach past the use cases:\n" + "\n".join(found)


def test_the_check_sees_a_route_that_reaches_past_them() -> None:
    source = (
        "def f(rt, uc):\n"
        "    rt.settings.home, rt.auth.enabled, jobs.view(rt, job)\n"
        "    return rt.store.jobs.get(1), rt.scheduler.wake(), uc.runtime.store\n"
    )
    assert _reaches(source, "probe.py") == [
        "probe.py:3: .store",
        "probe.py:3: rt.scheduler",
        "probe.py:3: .store",
    ]
