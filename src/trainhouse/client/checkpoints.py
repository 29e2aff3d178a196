"""The client's calls about a job's checkpoints: the list, and a verified download (the digest
the SDK registered, sha256 or blake3, checked before the file or directory takes its name).
A part of :class:`trainhouse.client.Client`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import httpx

from trainhouse.client.base import ClientBase
from trainhouse.client.downloads import Entries, Part, fetch_verified
from trainhouse.client.records import CheckpointFiles, CheckpointList
from trainhouse.core.errors import CheckpointError, ClientError

__all__ = ["CheckpointCalls"]


class CheckpointCalls(ClientBase):
    """The calls about checkpoints; :class:`~trainhouse.client.Client` has them."""

    def checkpoints(self, job_id: int, *, all: bool = False) -> CheckpointList:
        params = {"all": "true"} if all else None
        result: CheckpointList = self._json("GET", f"/jobs/{job_id}/checkpoints", params=params)
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
        from trainhouse.jobfs.storage import confine, tree_digest

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
        listing: CheckpointFiles = self._json(
            "GET", f"/jobs/{job_id}/checkpoints/{chosen['id']}/files"
        )
        url = f"{self.url}/api/v1/jobs/{job_id}/checkpoints/{chosen['id']}/content"
        parts = [
            Part(
                name=f["name"],
                target=confine(f["name"]) if f["name"] else "",
                url=url,
                # a file's digest is the registered algorithm's; a directory's is sha256 all along
                algorithm=chosen.get("algorithm", "sha256") if not f["name"] else "sha256",
                params={"file": f["name"]},
            )
            for f in listing["files"]
        ]

        def refused(resp: httpx.Response, part: Part) -> Exception:
            shown = part.name or chosen["path"]
            return ClientError(
                f"downloading {shown} failed: {resp.text[:300]}", status=resp.status_code
            )

        def check(entries: Entries) -> None:
            actual = entries[0][1] if chosen["kind"] == "file" else tree_digest(entries)
            if actual != chosen["sha256"]:
                raise CheckpointError(
                    f"the downloaded checkpoint of step {chosen['step']} has digest "
                    f"{actual[:16]}, not the registered {chosen['sha256'][:16]}: it is corrupt"
                )

        base = Path(dest)
        base.mkdir(parents=True, exist_ok=True)
        return fetch_verified(
            self._http,
            self.url,
            base / Path(chosen["path"]).name,
            parts,
            total=sum(int(f["size"]) for f in listing["files"]),
            progress=progress,
            refused=refused,
            check=check,
        )
