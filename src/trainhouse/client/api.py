"""The Python client for trainhouse's REST API (what the CLI uses too).

from trainhouse.client import Client
c = Client()                       # TRAINHOUSE_URL or http://127.0.0.1:8470; the token from
                                   # TRAINHOUSE_TOKEN or `trainhouse login`
job = c.submit("examples/digits/trainhouse.yaml", overrides=["hparams.epochs=2"])
c.wait(job["id"])

Only httpx is imported up front: the spec (pydantic, YAML), the workdir packer and the
checkpoint storage helpers load with the calls that need them (``submit``, ``dry_run``,
``download_checkpoint``), so that ``trainhouse ps`` and other quick commands start fast.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from trainhouse.client.credentials import current_user, find_token
from trainhouse.client.frames import JobList, Metrics
from trainhouse.client.registry import ModelsAndServices, _discard
from trainhouse.core.errors import CheckpointError, ClientError, ServerUnreachable
from trainhouse.core.lifecycle import TERMINAL
from trainhouse.core.wire import CLIENT_HEADERS, error_from, send

__all__ = [
    "DEFAULT_URL",
    "Client",
    "current_user",
    "default_url",
]

if TYPE_CHECKING:
    from trainhouse.core.spec import JobSpec
    from trainhouse.jobfs.workdir import PackedWorkdir

DEFAULT_URL = "http://127.0.0.1:8470"


def default_url() -> str:
    return os.environ.get("TRAINHOUSE_URL") or DEFAULT_URL


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event, parsed JSON data) from a Server-Sent Events stream; comments are skipped."""
    kind, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def _plain_http_transport(url: str) -> httpx.HTTPTransport | None:
    """For an ``http://`` server, a transport whose TLS context trusts no certificate at all:
    it never speaks TLS (every request goes to ``url``), and building it skips loading the CA
    bundle, about 30 ms of every command's start. An ``https://`` server gets httpx's default
    (None); proxies from the environment keep theirs either way."""
    if not url.startswith("http://"):
        return None
    return httpx.HTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))


class Client(ModelsAndServices):
    def __init__(
        self, url: str | None = None, *, token: str | None = None, timeout: float = 60.0
    ) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.token = token or find_token(self.url)
        headers = dict(CLIENT_HEADERS)  # writes need it (trainhouse.server.origin)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1",
            timeout=timeout,
            headers=headers,
            transport=_plain_http_transport(self.url),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return send(self._http, self.url, method, path, **kwargs)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._request(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError:
            raise ClientError(
                f"{self.url} did not answer with JSON; is it a trainhouse server (TRAINHOUSE_URL)?",
                status=resp.status_code or 502,
                code="not_trainhouse",
            ) from None

    # -- server ----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/health")
        return result

    def nodes(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/nodes")
        return result

    # -- jobs ------------------------------------------------------------------------------
    def submit(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Validate the spec, pack its workdir and submit; returns the new job."""
        spec, packed = _load_and_pack(spec_file, overrides)
        return self.submit_packed(spec, packed, owner=owner)

    def submit_packed(
        self, spec: JobSpec, packed: PackedWorkdir, *, owner: str | None = None, to: str = "/jobs"
    ) -> dict[str, Any]:
        """Submit a spec and its packed workdir (``to``: ``/jobs``, or ``/searches`` for a
        spec with a ``search:`` block); returns what was made."""
        result: dict[str, Any] = self._json(
            "POST",
            to,
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
            files={"workdir": ("workdir.tar.gz", packed.data, "application/gzip")},
        )
        return result

    # -- searches --------------------------------------------------------------------------
    def submit_search(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Submit a spec with a ``search:`` block; returns the new search."""
        spec, packed = _load_and_pack(spec_file, overrides)
        return self.submit_packed(spec, packed, owner=owner, to="/searches")

    def searches(self, *, all: bool = False) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._json(
            "GET", "/searches", params={"all": str(all).lower()}
        )["searches"]
        return result

    def search(self, search_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/searches/{search_id}")
        return result

    def search_best(self, search_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/searches/{search_id}/best")
        return result

    def cancel_search(self, search_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/searches/{search_id}/cancel")
        return result

    def jobs(
        self,
        *,
        all: bool = True,
        where: str | None = None,
        columns: str | list[str] | None = None,
        sort: str | None = None,
        order: str | None = None,
        project: str | None = None,
        tags: list[str] | None = None,
        archived: str = "exclude",
        owner: str | None = None,
        name: str | None = None,
        states: list[str] | None = None,
        limit: int | None = None,
        page_size: int = 1000,
    ) -> JobList:
        """Every job the caller may see, newest first (``all=False``: only queued and running
        ones), with the runs table's filters: ``where`` (``"metrics.val_loss.min < 0.1 and
        hparams.lr >= 1e-3"``), ``columns`` (fields whose values each job carries in
        ``values``), ``sort``/``order``, ``project``, ``tags`` (every one), ``archived``
        ("exclude", "include", "only"), ``owner``, ``name`` (a substring), ``states``.
        ``limit``: at most this many (None: all, fetched ``page_size`` at a time).

        A :class:`~trainhouse.client.frames.JobList`: a list of job dicts with ``to_pandas()``."""
        params: dict[str, Any] = {"all": str(all).lower(), "archived": archived}
        if where:
            params["where"] = where
        if columns:
            params["columns"] = columns if isinstance(columns, str) else ",".join(columns)
        for key, value in (
            ("sort", sort),
            ("order", order),
            ("project", project),
            ("owner", owner),
            ("name", name),
        ):
            if value:
                params[key] = value
        if tags:
            params["tag"] = list(tags)
        if states:
            params["state"] = list(states)
        jobs: list[dict[str, Any]] = []
        total, shown = 0, list[str]()
        while limit is None or len(jobs) < limit:
            size = page_size if limit is None else min(page_size, limit - len(jobs))
            page = self._json("GET", "/jobs", params={**params, "limit": size, "offset": len(jobs)})
            jobs += page["jobs"]
            total, shown = page["total"], page.get("columns") or []
            if len(page["jobs"]) < size or len(jobs) >= total:
                break
        return JobList(jobs, total=total, columns=shown)

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}")
        return result

    def cancel(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/cancel")
        return result

    def resume(self, job_id: int) -> dict[str, Any]:
        """Send a canceled or failed job back to the queue, to continue from its latest
        checkpoint; returns the job (QUEUED, ``resumes`` counted)."""
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/resume")
        return result

    def clone(
        self,
        job_id: int,
        *,
        overrides: list[str] | None = None,
        from_checkpoint: int | str | None = None,
    ) -> dict[str, Any]:
        """A new job with ``job_id``'s code and spec plus ``overrides`` (``--set`` items);
        ``from_checkpoint`` (a step or ``"latest"``) starts it from a copy of that
        checkpoint. Returns the new job."""
        body: dict[str, Any] = {"set": list(overrides or [])}
        if from_checkpoint is not None:
            body["from_checkpoint"] = str(from_checkpoint)
        result: dict[str, Any] = self._json("POST", f"/jobs/{job_id}/clone", json=body)
        return result

    def metrics(
        self,
        job_id: int,
        *,
        name: str | None = None,
        all_ranks: bool = False,
        max_points: int = 0,
        after_step: int | None = None,
    ) -> Metrics:
        """``{"job_id", "series": [{"name", "rank", "points": [[step, value, wall_time]],
        "total_points", "downsampled"}]}``, a :class:`~trainhouse.client.frames.Metrics` whose
        ``history()`` is a DataFrame of a row per step and a column per series and
        ``to_pandas()`` one of a row per point (pandas is an optional extra).

        ``max_points`` (>= 4; 0: all): a longer series comes downsampled by the server (its
        first and last points and each step bucket's smallest and largest value);
        ``after_step``: only points past it (to poll a live job incrementally).
        """
        params: dict[str, Any] = {"all_ranks": str(all_ranks).lower()}
        if name:
            params["name"] = name
        if max_points:
            params["max_points"] = max_points
        if after_step is not None:
            params["after_step"] = after_step
        return Metrics(self._json("GET", f"/jobs/{job_id}/metrics", params=params))

    def metric_names(self, job_id: int, *, all_ranks: bool = True) -> list[dict[str, Any]]:
        """The job's series without their points: ``[{"name", "rank", "points", "last_step"}]``."""
        params = {"all_ranks": str(all_ranks).lower()}
        result: list[dict[str, Any]] = self._json(
            "GET", f"/jobs/{job_id}/metrics/names", params=params
        )["series"]
        return result

    def checkpoints(self, job_id: int, *, all: bool = False) -> dict[str, Any]:
        params = {"all": "true"} if all else None
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/checkpoints", params=params)
        return result

    def download_checkpoint(
        self,
        job_id: int,
        step: int | None,
        dest: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Fetch the checkpoint of ``step`` (None: the newest) into the directory ``dest``.

        Checks the digest the SDK registered (sha256 or blake3); returns the local file or
        directory. A partial download never stays under the final name. ``progress(done,
        total)`` in bytes.
        """
        from trainhouse.jobfs.storage import confine, new_hash, tree_digest

        found = self.checkpoints(job_id)["checkpoints"]
        if not found:
            raise ClientError(f"job {job_id} has no checkpoints", status=404, code="not_found")
        chosen = found[-1] if step is None else next((c for c in found if c["step"] == step), None)
        if chosen is None:
            steps = ", ".join(str(c["step"]) for c in found)
            raise ClientError(
                f"job {job_id} has no checkpoint of step {step} (it has {steps})",
                status=404,
                code="not_found",
            )
        listing = self._json("GET", f"/jobs/{job_id}/checkpoints/{chosen['id']}/files")
        files = [(f["name"], int(f["size"])) for f in listing["files"]]
        total = sum(size for _, size in files)
        base = Path(dest)
        base.mkdir(parents=True, exist_ok=True)
        final = base / Path(chosen["path"]).name
        tmp = base / f".{final.name}.download-{os.getpid()}"
        entries: list[tuple[str, str, int]] = []
        done = 0
        try:
            for name, _size in files:
                target = tmp / confine(name) if name else tmp
                target.parent.mkdir(parents=True, exist_ok=True)
                # a file's digest is the registered algorithm's; a directory's is sha256 all along
                algorithm = chosen.get("algorithm", "sha256") if not name else "sha256"
                digest = new_hash(algorithm)
                url = f"{self.url}/api/v1/jobs/{job_id}/checkpoints/{chosen['id']}/content"

                def refused(resp: httpx.Response, shown: str = name or chosen["path"]) -> Exception:
                    return ClientError(
                        f"downloading {shown} failed: {resp.text[:300]}", status=resp.status_code
                    )

                done = self._stream_to(
                    url, target, digest, done, total, progress, refused, params={"file": name}
                )
                entries.append((name, digest.hexdigest(), target.stat().st_size))
            actual = entries[0][1] if chosen["kind"] == "file" else tree_digest(entries)
            if actual != chosen["sha256"]:
                raise CheckpointError(
                    f"the downloaded checkpoint of step {chosen['step']} has digest "
                    f"{actual[:16]}, not the registered {chosen['sha256'][:16]}: it is corrupt"
                )
            if final.is_dir():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except httpx.HTTPError as exc:
            _discard(tmp)
            raise ServerUnreachable(self.url, str(exc)) from None
        except BaseException:
            _discard(tmp)
            raise
        return final

    def _stream_to(
        self,
        url: str,
        target: Path,
        digest: Any,
        done: int,
        total: int,
        progress: Callable[[int, int], None] | None,
        refused: Callable[[httpx.Response], Exception],
        *,
        params: dict[str, str] | None = None,
    ) -> int:
        """Stream ``url`` into ``target``, feeding ``digest`` and ``progress(done, total)`` as
        it goes; the bytes done after it. A non-200 answer raises ``refused(response)``."""
        with self._http.stream("GET", url, params=params) as resp, target.open("wb") as out:
            if resp.status_code != 200:
                resp.read()
                raise refused(resp)
            for chunk in resp.iter_bytes(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
        return done

    def log_ranks(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", f"/jobs/{job_id}/logs/ranks")
        return result

    def logs(
        self,
        job_id: int,
        *,
        rank: int | str = 0,
        offset: int = 0,
        tail: int | None = None,
        timestamps: bool = False,
        grep: str | None = None,
    ) -> tuple[str, int, str]:
        """(text, offset to continue from, job state). ``rank="all"``: every rank's lines
        interleaved in the order they were written, each prefixed ``[rank N]``;
        ``timestamps``: each line starts with when it was written (UTC); ``grep``: only the
        lines this regular expression matches."""
        params: dict[str, Any] = {"rank": str(rank), "offset": offset}
        if tail is not None:
            params["tail"] = tail
        if timestamps:
            params["timestamps"] = "true"
        if grep:
            params["grep"] = grep
        resp = self._request("GET", f"/jobs/{job_id}/logs", params=params)
        return (
            resp.text,
            int(resp.headers.get("X-Log-Offset", offset)),
            resp.headers.get("X-Job-State", ""),
        )

    def stream_logs(
        self,
        job_id: int,
        *,
        ranks: list[str] | None = None,
        tail: int | None = None,
        reconnect: bool = True,
        on_reconnect: Callable[[Exception], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Follow a job's logs live (Server-Sent Events): yields ``{"rank", "text", "offset"}``
        until the job has ended and every log is read, then ``{"end": state}``.

        A lost connection (the server restarting) is resumed from the last offsets; nothing is
        repeated or skipped. ``on_reconnect(error)`` is called once per outage.
        """
        offsets: dict[str, int] = {}
        params: dict[str, Any] = {}
        if ranks:
            params["rank"] = ranks
        if tail is not None:
            params["tail"] = tail
        delay, failing = 0.5, False
        while True:
            if offsets:
                params["from"] = ",".join(f"{r}:{o}" for r, o in offsets.items())
                params.pop("tail", None)
            try:
                with self._http.stream(
                    "GET", f"/jobs/{job_id}/logs/stream", params=params, timeout=None
                ) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        raise error_from(resp, self.url)
                    failing, delay = False, 0.5
                    for kind, data in _sse(resp.iter_lines()):
                        if kind == "log":
                            offsets[data["rank"]] = int(data["offset"])
                            yield data
                        elif kind == "end":
                            yield {"end": data["state"]}
                            return
            except httpx.HTTPError as exc:
                if not reconnect:
                    raise ServerUnreachable(self.url, str(exc)) from None
                if not failing and on_reconnect is not None:
                    on_reconnect(exc)
                failing = True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def queue(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/queue")
        return result

    def dry_run(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """Where the job would run now, or why it would wait; nothing is submitted."""
        from trainhouse.core.spec import load_spec

        spec = load_spec(Path(spec_file), overrides)
        result: dict[str, Any] = self._json(
            "POST",
            "/jobs/dry-run",
            data={
                "spec": spec.model_dump_json(exclude={"workdir"}),
                "owner": owner or current_user(),
            },
        )
        return result

    def set_tags(
        self, job_id: int, *, add: list[str] | None = None, remove: list[str] | None = None
    ) -> list[str]:
        """Add and remove a job's tags; its tags after."""
        body = {"add": add or [], "remove": remove or []}
        result: list[str] = self._json("POST", f"/jobs/{job_id}/tags", json=body)["tags"]
        return result

    def set_note(self, job_id: int, note: str) -> dict[str, Any]:
        """Replace a job's note (markdown; "" clears it)."""
        result: dict[str, Any] = self._json("PUT", f"/jobs/{job_id}/note", json={"note": note})
        return result

    def archive(self, job_id: int, *, archived: bool = True) -> dict[str, Any]:
        """Archive an ended job (out of the default list, kept), or bring it back."""
        result: dict[str, Any] = self._json(
            "POST", f"/jobs/{job_id}/archive", json={"archived": archived}
        )
        return result

    def delete(self, job_id: int) -> dict[str, Any]:
        """Delete an ended job, its files and its rows, for good:
        ``{"job_id", "rows": {table: count}, "bytes_freed"}``."""
        result: dict[str, Any] = self._json("DELETE", f"/jobs/{job_id}")
        return result

    def run_columns(self) -> dict[str, list[str]]:
        """What a runs table can show: ``{"hparams", "metrics", "projects", "tags"}``."""
        result: dict[str, list[str]] = self._json("GET", "/runs/columns")
        return result

    def set_priority(self, job_id: int, priority: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json(
            "POST", f"/jobs/{job_id}/priority", json={"priority": priority}
        )
        return result

    def quotas(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/quotas")
        return result

    def set_quota(self, owner: str, limits: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._json("PUT", f"/quotas/{owner}", json=limits)
        return result

    def clear_quota(self, owner: str) -> None:
        self._request("DELETE", f"/quotas/{owner}")

    # -- accounts --------------------------------------------------------------------------
    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/whoami")
        return result

    def users(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._json("GET", "/users")["users"]
        return result

    def add_user(self, name: str, role: str = "member") -> dict[str, Any]:
        result: dict[str, Any] = self._json("POST", "/users", json={"name": name, "role": role})
        return result

    def update_user(
        self, name: str, *, role: str | None = None, disabled: bool | None = None
    ) -> dict[str, Any]:
        body = {k: v for k, v in {"role": role, "disabled": disabled}.items() if v is not None}
        result: dict[str, Any] = self._json("PATCH", f"/users/{name}", json=body)
        return result

    def tokens(self, *, user: str | None = None, all: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"all": str(all).lower()}
        if user:
            params["user"] = user
        result: list[dict[str, Any]] = self._json("GET", "/tokens", params=params)["tokens"]
        return result

    def create_token(
        self, name: str = "default", *, user: str | None = None, expires_in: float | None = None
    ) -> dict[str, Any]:
        """A new token: ``{"token": {...}, "secret": "thu_..."}``; the secret is shown once."""
        body: dict[str, Any] = {"name": name, "user": user, "expires_in": expires_in}
        result: dict[str, Any] = self._json("POST", "/tokens", json=body)
        return result

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._json("DELETE", f"/tokens/{token_id}")
        return result

    # -- environments (admins) --------------------------------------------------------------
    def envs(self) -> dict[str, Any]:
        """The server machine's cache of job environments: ``envs``, ``total_size``, ..."""
        result: dict[str, Any] = self._json("GET", "/envs")
        return result

    def prune_envs(self, *, all: bool = False, digest: str | None = None) -> dict[str, Any]:
        """Remove environments no attempt uses (past the cache's size, ``all``, or one)."""
        body: dict[str, Any] = {"all": all}
        if digest is not None:
            body["digest"] = digest
        result: dict[str, Any] = self._json("POST", "/envs/prune", json=body)
        return result

    def audit(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        actions: list[str] | None = None,
        actor: str | None = None,
        since: float | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset, "action": actions or []}
        if actor:
            params["actor"] = actor
        if since is not None:
            params["since"] = since
        result: dict[str, Any] = self._json("GET", "/audit", params=params)
        return result

    def wait(
        self, job_id: int, *, timeout: float | None = None, poll: float = 0.5
    ) -> dict[str, Any]:
        """Block until the job ends; returns its final record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout} s")
            time.sleep(poll)

    # -- resource monitoring ---------------------------------------------------------------
    def node_metrics(
        self,
        node: str,
        *,
        names: list[str] | None = None,
        since: float | None = None,
        until: float | None = None,
        max_points: int | None = None,
    ) -> dict[str, Any]:
        """A node's resource series; ``since``/``until`` negative = seconds before now."""
        params: dict[str, Any] = {"name": names or []}
        params.update(_window(since, until, max_points))
        result: dict[str, Any] = self._json("GET", f"/nodes/{node}/metrics", params=params)
        return result

    def job_system(
        self,
        job_id: int,
        *,
        since: float | None = None,
        until: float | None = None,
        max_points: int | None = None,
    ) -> dict[str, Any]:
        """A job's processes' resource series (CPU, RSS, GPU memory)."""
        result: dict[str, Any] = self._json(
            "GET", f"/jobs/{job_id}/system", params=_window(since, until, max_points)
        )
        return result


def _window(since: float | None, until: float | None, max_points: int | None) -> dict[str, Any]:
    given = {"since": since, "until": until, "max_points": max_points}
    return {k: v for k, v in given.items() if v is not None}


def _load_and_pack(
    spec_file: str | Path, overrides: list[str] | None
) -> tuple[JobSpec, PackedWorkdir]:
    """The spec file (with its overrides) validated, and its workdir packed."""
    from trainhouse.core.spec import load_spec
    from trainhouse.jobfs.workdir import pack

    spec_path = Path(spec_file)
    spec = load_spec(spec_path, overrides)
    return spec, pack((spec_path.parent / spec.workdir).resolve())
