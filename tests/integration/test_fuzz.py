"""Fuzz the REST API of a real server with schemathesis: no request gets a 5xx, and no response
body leaks a stack trace, SQL, a driver's name or where the server keeps its state.

The server runs with ``--auth`` (tokens checked on loopback too) and ``--quota-cpus 0``, so a
submitted job stays queued and never starts a process. One job is submitted beforehand (and a
log file written for it) so the per-job endpoints have something to read. Schemathesis (its
CLI, ``schemathesis run``) reads ``/openapi.json`` and runs its examples, coverage (boundary
and wrong-type values), fuzzing and stateful phases against every operation, in passes:

1. an admin's token, on every operation but the two that can lock the admin out (revoking its
   own token; disabling or demoting itself once it has made another admin), which run last;
2. a member's token, on every operation but ``DELETE /tokens/{token_id}`` (the member would
   revoke its own): the 403 paths;
3. no token at all: the 401 paths (and the 429 of too many failed token uses: schemathesis
   also sends made-up tokens);
4. the admin on the users (``POST /users`` then ``PATCH /users/{name}``: the stateful phase
   follows the link from the one to the other, so existing users get patched);
5. the admin on ``DELETE /tokens/{token_id}``.

The admin is made with ``trainhouse admin init``, the member with ``POST /users``. Each pass
gets a new token, made straight in the server's database (as ``admin init`` does), and its user
is made active again in its role first: an earlier pass may have disabled or demoted it, or
revoked its token.

Each pass is bounded by a fixed number of examples per operation and phase
(``--max-examples``) and by a wall-clock budget (``--max-time``: once every phase has run, the
fuzzing and stateful phases repeat with new inputs until it is spent; on a slow machine the
phases share what there is), in hypothesis' derandomized mode (``--generation-deterministic``:
the same inputs on every run, no example database). All passes: about 55 s of fuzzing per
backend, a bit over a minute with the server's and each pass's start-up.

``GET /jobs/{job_id}/logs/stream`` is left out: it follows a job until the job ends, and the
queued job here never ends (tests/unit/test_log_stream.py covers it).

Every request and response is read back from schemathesis' HAR report: the test fails on any
5xx (schemathesis' own ``not_a_server_error`` check, and the statuses recorded), on any body
with a leak, and on an error the server logged (an internal error, or a value the database
refused that validation should have: those answer 422, but are gaps all the same). It prints a
summary per pass and in all: requests, operations, statuses, and schemathesis' phases.

Like every server test here, it runs on SQLite and on PostgreSQL (tests/integration/conftest.py),
the stricter of the two: most of what it found (tests/unit/test_fuzz_regressions.py) showed
there only.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import EXAMPLE, Server, assert_clean_stop, start_server
from trainhouse.client import Client
from trainhouse.core.tokens import issue
from trainhouse.core.wire import CSRF_HEADER
from trainhouse.store import Store

pytestmark = pytest.mark.integration

SCHEMATHESIS = (sys.executable, "-m", "schemathesis.cli")  # its CLI, `schemathesis`
STREAM = "/api/v1/jobs/{job_id}/logs/stream"  # follows a job until it ends: see the docstring
REVOKE = "DELETE /api/v1/tokens/{token_id}"
PATCH_USER = "PATCH /api/v1/users/{name}"
USERS = ("GET /api/v1/users", "POST /api/v1/users", PATCH_USER)
LOCKOUT = (REVOKE, PATCH_USER)
# what the server logs when a request went wrong on its side (trainhouse.server.app)
SERVER_ERRORS = ("internal error", "the database refused a value")
LEAKS = ("Traceback", 'File "', "sqlalchemy", "psycopg", "SELECT ", "INSERT ")
# fields of successful answers that name a path on purpose (where a job's files and
# checkpoints are: the dashboard shows them to admins)
PATH_FIELDS = ("job_dir", "directory")


@dataclass
class Pass:
    name: str
    user: str | None  # whose token (made active in `role` first); None: no token
    role: str
    max_examples: int
    max_time: int
    only: tuple[str, ...] = ()  # operation names ("METHOD /path"); () = all but `skip`
    skip: tuple[str, ...] = ()


@dataclass
class Findings:
    requests: int = 0
    operations: set[str] = field(default_factory=set)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)  # 5xx, leaks, server errors: described


@pytest.fixture
def fuzz_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "home", "--cpus", "4", "--auth", "--quota-cpus", "0")
    try:
        yield srv
    finally:
        assert_clean_stop(srv)


def fresh_token(srv: Server, user: str, role: str) -> str:
    """A new token of ``user``, made active in ``role`` first (straight in the database)."""
    store = Store(srv.db_url, migrate="never")
    try:
        accounts = store.accounts
        accounts.update_user(user, role=role, disabled=False)
        return issue(accounts, user, "fuzz")[1]
    finally:
        store.close()


def without_path_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_path_fields(v) for k, v in value.items() if k not in PATH_FIELDS}
    if isinstance(value, list):
        return [without_path_fields(v) for v in value]
    return value


def strings(value: Any) -> Iterator[str]:
    """Every key and string in a JSON value (decoded: a quote is a quote, not \\")."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def leaks(body: str, status: int, home: Path) -> list[str]:
    """What in a response body must not be there."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body  # a log, a checkpoint's bytes, an HTML page: as it is
    else:
        if status < 400:  # a successful answer may name a job's directories, only there
            data = without_path_fields(data)
        text = "\n".join(strings(data))
    found = [word for word in LEAKS if word in text]
    found += [f"the server's home ({h})" for h in {str(home), str(home.resolve())} if h in text]
    return found


def operation_names(url: str) -> list[tuple[re.Pattern[str], str]]:
    """Each operation of the server's OpenAPI document: (a regex of its paths, its name)."""
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    found = []
    for template, methods in paths.items():
        regex = re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template))
        found += [(re.compile(f"{m.upper()} {regex}"), f"{m.upper()} {template}") for m in methods]
    return sorted(found, key=lambda item: item[1].count("{"))  # /jobs/dry-run before /jobs/{id}


def operation_of(method: str, path: str, names: list[tuple[re.Pattern[str], str]]) -> str:
    """The operation a request was for ("" for a method or path the API does not have)."""
    request = f"{method} {path}"
    return next((name for regex, name in names if regex.fullmatch(request)), "")


def run_pass(
    srv: Server,
    p: Pass,
    reports: Path,
    findings: Findings,
    names: list[tuple[re.Pattern[str], str]],
) -> None:
    har = reports / f"{p.name}.har.json"
    cmd = [
        *SCHEMATHESIS,
        "run",
        f"{srv.url}/openapi.json",
        "--checks=not_a_server_error",
        f"--max-examples={p.max_examples}",
        f"--max-time={p.max_time}",
        "--generation-deterministic",  # hypothesis' derandomize: the same inputs every run
        "--workers=1",
        "--request-timeout=30",
        "--report=har",
        f"--report-dir={reports}",
        f"--report-har-path={har}",
        "--no-color",
        f"--exclude-path={STREAM}",
        # as trainhouse's clients do: without it every write is refused before it is read
        f"--header={CSRF_HEADER}: 1",
    ]
    cmd += [f"--include-name={name}" for name in p.only]
    cmd += [f"--exclude-name={name}" for name in p.skip]
    if p.user is not None:
        cmd.append(f"--header=Authorization: Bearer {fresh_token(srv, p.user, p.role)}")
    started = time.monotonic()
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=p.max_time + 120, cwd=reports
    )
    took = time.monotonic() - started
    entries = json.loads(har.read_text())["log"]["entries"] if har.is_file() else []
    statuses: collections.Counter[int] = collections.Counter()
    operations = set()
    for entry in entries:
        request, response = entry["request"], entry["response"]
        status = int(response["status"])
        statuses[status] += 1
        url = httpx.URL(request["url"])
        operations.add(operation_of(request["method"], url.path, names))
        body = response.get("content", {}).get("text") or ""
        what = f"{p.name}: {request['method']} {str(url)[:200]} -> {status}"
        if status >= 500:
            findings.errors.append(f"{what}: {body[:300]}")
        for leak in leaks(body, status, srv.home):
            findings.errors.append(f"{what} leaks {leak}: {body[:300]}")
    findings.requests += len(entries)
    operations.discard("")
    findings.operations |= operations
    findings.statuses.update(statuses)
    out = result.stdout
    phases = out[out.find("Test Phases:") :].split("\n\n")[0].splitlines()[1:]
    cases = re.search(r"(\d+) generated", out)
    print(
        f"== pass {p.name}: {cases.group(1) if cases else '?'} test cases, {len(entries)} "
        f"requests to {len(operations)} operations in {took:.0f} s; statuses "
        f"{dict(sorted(statuses.items()))}; phases: {', '.join(x.strip() for x in phases)}"
    )
    if result.returncode != 0:  # a failed check, or schemathesis could not run: its story
        start, end = out.find("= FAILURES ="), out.find("= WARNINGS =")
        story = out[start:end] if 0 <= start < end else out[-4000:]
        findings.errors.append(
            f"{p.name}: schemathesis exited {result.returncode}:\n{story[:4000]}"
            f"{result.stderr[-2000:]}"
        )


def test_fuzzing_the_api_finds_no_server_error_and_no_leak(
    fuzz_server: Server, tmp_path: Path
) -> None:
    srv = fuzz_server
    with Client(srv.url, token=srv.admin_token("root")) as admin:
        admin.add_user("fuzz-member", "member")
        assert admin.create_token("fuzz", user="fuzz-member")["secret"].startswith("thu_")
        job = admin.submit(EXAMPLE)
    assert job["state"] == "QUEUED"
    logs = srv.home / "jobs" / str(job["id"]) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "rank-0.log").write_text(
        "".join(f"step {i} loss {1 / (i + 1):.4f}\n" for i in range(500))
    )
    reports = tmp_path / "reports"
    reports.mkdir()
    findings = Findings()
    passes = [
        Pass("admin", "root", "admin", max_examples=10, max_time=30, skip=LOCKOUT),
        Pass("member", "fuzz-member", "member", max_examples=5, max_time=10, skip=(REVOKE,)),
        Pass("anonymous", None, "", max_examples=5, max_time=6),
        Pass("admin-users", "root", "admin", max_examples=10, max_time=5, only=USERS),
        Pass("admin-revoke", "root", "admin", max_examples=10, max_time=4, only=(REVOKE,)),
    ]
    started = time.monotonic()
    names = operation_names(srv.url)
    for p in passes:
        run_pass(srv, p, reports, findings, names)
    print(
        f"\n== fuzzing: {findings.requests} requests in {time.monotonic() - started:.0f} s "
        f"to {len(findings.operations)} operations (and methods and paths it lacks); statuses "
        f"{dict(sorted(findings.statuses.items()))}"
    )
    log = srv.log_tail(10**9)
    findings.errors += [
        f"the server logged {line.strip()!r} (see {srv.log})"
        for line in log.splitlines()
        if any(f": {what}" in line for what in SERVER_ERRORS)
    ]
    assert not findings.errors, "\n".join(e[:3000] for e in findings.errors[:30])
