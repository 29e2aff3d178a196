"""A team on the real app in process, auth on: root the admin, alice and bob members, vera a
viewer, each with a token. Jobs stay queued: every user's CPU quota is 0, so nothing starts and
each test reads the store as the requests left it (tests/unit/test_auth.py and the fuzz
regressions use it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.support.api import fake_executor, in_process, settings_for
from trainhouse.core.tokens import issue
from trainhouse.jobfs.workdir import pack
from trainhouse.server import create_app
from trainhouse.usecases.runtime import Runtime

SPEC = "name: {name}\nentrypoint: python train.py\nresources: {{procs_per_node: 1}}\n"


@dataclass
class Team:
    api: TestClient
    rt: Runtime
    tokens: dict[str, str]  # user -> secret

    def h(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def get(self, user: str, path: str, **kw: Any) -> Any:
        return self.api.get(f"/api/v1{path}", headers=self.h(user), **kw)

    def post(self, user: str, path: str, **kw: Any) -> Any:
        return self.api.post(f"/api/v1{path}", headers=self.h(user), **kw)

    def submit(self, user: str, name: str = "job", extra: str = "") -> Any:
        return self.post(
            user,
            "/jobs",
            data={"spec": SPEC.format(name=name) + extra, "owner": "someone-else"},
            files={"workdir": ("w.tar.gz", self.archive, "application/gzip")},
        )

    archive: bytes = b""


def make_team(tmp_path: Path, **settings: Any) -> Iterator[Team]:
    cfg = settings_for(tmp_path, auth=True, **settings)
    src = tmp_path / "wd"
    src.mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    with in_process(create_app(cfg, executor=fake_executor(cfg))) as api:
        rt: Runtime = api.app.state.runtime  # type: ignore[attr-defined]
        tokens = {}
        for name, role in (("root", "admin"), ("alice", "member"), ("bob", "member")):
            rt.store.accounts.add_user(name, role)
            tokens[name] = issue(rt.store.accounts, name)[1]
        rt.store.accounts.add_user("vera", "viewer")
        tokens["vera"] = issue(rt.store.accounts, "vera")[1]
        team = Team(api, rt, tokens, archive=pack(src).data)
        for user in ("alice", "bob", "root"):
            resp = api.put(f"/api/v1/quotas/{user}", json={"max_cpus": 0}, headers=team.h("root"))
            assert resp.status_code == 200, resp.text
        yield team


def refused(resp: Any, status: int = 403) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"}, body
    return str(body["error"]["message"])
