"""The suite's own shape: tests share through tests/support and conftest.py fixtures, never by
importing another test module (or a conftest.py) as a library."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_no_test_module_imports_another_or_a_conftest() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for module in _imported_modules(path):
            if not module.startswith("tests."):
                continue
            last = module.rsplit(".", 1)[-1]
            if last.startswith("test_") or last == "conftest":
                offenders.append(f"{path.relative_to(TESTS)} imports {module}")
    assert offenders == [], "share through tests/support instead:\n" + "\n".join(offenders)


def test_support_is_a_library_not_tests() -> None:
    support = TESTS / "support"
    assert not [p.name for p in support.glob("test_*.py")]
    for path in support.glob("*.py"):
        assert not any(
            m.startswith("tests.") and "support" not in m for m in _imported_modules(path)
        )


def test_every_test_the_threat_model_cites_exists() -> None:
    """docs/security.md's table names the test behind each threat: a renamed or deleted test
    must not leave the table claiming a proof that is gone."""
    import re

    repo = TESTS.parent
    missing = []
    for line in (repo / "docs" / "security.md").read_text().splitlines():
        if not line.startswith("| "):
            continue
        module = None
        for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(test_\w+)", line):
            module = path or module
            assert module is not None, line
            if f"def {name}(" not in (repo / module).read_text():
                missing.append(f"{module}::{name}")
    assert not missing, missing
