"""The client's calls about a job's artifacts: the listing, and downloads checked against it
(each file's size as listed, the file taking its name only once complete). A part of
:class:`trainhouse.client.Client`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx

from trainhouse.client.base import ClientBase
from trainhouse.client.downloads import Entries, Part, fetch_verified
from trainhouse.client.records import ArtifactList
from trainhouse.core.errors import ClientError

__all__ = ["ArtifactCalls"]


def _chosen(listing: ArtifactList, path: str) -> list[tuple[str, int, str]]:
    """(artifact path, size, where it lands below the destination) of the file ``path`` names
    (landing under its own name), or of every file below the directory it names (landing under
    the directory's name; ``""``: every artifact, under its full path)."""
    from trainhouse.jobfs.artifacts import parts_of

    try:
        wanted = parts_of(path.strip())
    except ValueError as exc:
        raise ClientError(f"invalid artifact path {path!r}: {exc}", status=422) from None
    prefix = "/".join(wanted)
    out: list[tuple[str, int, str]] = []
    for a in listing["artifacts"]:
        try:
            parts = parts_of(a["path"])  # the server's word is checked as any
        except ValueError:
            raise ClientError(f"the server listed an invalid artifact path {a['path']!r}") from None
        if not parts:
            continue
        name = "/".join(parts)
        size = a.get("size")
        if type(size) is not int or size < 0:
            raise ClientError(f"the server listed artifact {name!r} with no size: {size!r}")
        if name == prefix:
            out.append((name, size, parts[-1]))
        elif not prefix or name.startswith(prefix + "/"):
            below = len(wanted) - 1 if wanted else 0
            out.append((name, size, "/".join(parts[max(below, 0) :])))
    return out


class ArtifactCalls(ClientBase):
    """The calls about artifacts; :class:`~trainhouse.client.Client` has them."""

    def artifacts(self, job_id: int) -> ArtifactList:
        """The job's artifacts (``run.log_artifact``'s, MLflow's), sorted by path, with sizes."""
        result: ArtifactList = self._json("GET", f"/jobs/{job_id}/artifacts")
        return result

    def download_artifacts(
        self,
        job_id: int,
        path: str,
        dest: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Path]:
        """Fetch the artifact file ``path`` (into ``dest`` under its name), or every file below
        the artifact directory ``path`` (into ``dest`` under the directory's name; ``""``: all
        of them); the local files, in order. Each is checked to hold the bytes listed and
        takes its name only then; a file in ``dest`` of the same name is replaced, a directory
        never (ClientError before anything is fetched). ``progress(done, total)`` in bytes,
        per file."""
        chosen = _chosen(self.artifacts(job_id), path)
        if not chosen:
            raise ClientError(
                f"job {job_id} has no artifact {path!r} (trainhouse artifacts {job_id} lists them)",
                status=404,
                code="not_found",
            )
        base = Path(dest)
        for _, _, local in chosen:  # the job chose the names: a file never replaces a directory
            if (base / local).is_dir():
                raise ClientError(
                    f"{base / local} is a directory: artifact {local!r} is a file and would "
                    "replace it; download into another directory"
                )
        url = f"{self.url}/api/v1/jobs/{job_id}/artifacts/content"
        got: list[Path] = []
        for name, size, local in chosen:
            final = base / local
            final.parent.mkdir(parents=True, exist_ok=True)

            def refused(resp: httpx.Response, part: Part) -> Exception:
                return ClientError(
                    f"downloading artifact {part.name} failed: {resp.text[:300]}",
                    status=resp.status_code,
                )

            def check(entries: Entries, name: str = name, size: int = size) -> None:
                if entries[0][2] != size:
                    raise ClientError(
                        f"artifact {name} arrived with {entries[0][2]} bytes, not the {size} "
                        "listed: it changed meanwhile or the transfer broke; fetch it again"
                    )

            part = Part(name=name, target="", url=url, params={"path": name})
            got.append(
                fetch_verified(
                    self._http,
                    self.url,
                    final,
                    [part],
                    total=size,
                    progress=progress,
                    refused=refused,
                    check=check,
                )
            )
        return got
