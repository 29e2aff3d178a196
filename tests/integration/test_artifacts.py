"""A job's artifacts end to end (issue 33, section 4): a real job keeps files through the SDK's
``run.log_artifact`` and the real mlflow client's ``log_artifact``; the server lists and serves
them; ``trainhouse artifacts JOB`` lists them and ``--download`` fetches a file, a directory
and everything; MLflow's "View run at" link lands on the job's page, and the experiment the
script set is the job's project. One server and one job for the module."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.support.artifacts import artifact_job, png
from tests.support.jobs import write_job
from tests.support.servers import Server, assert_clean_stop, start_server
from trainhouse.jobfs.layout import JobLayout

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("artifacts")]  # one module server


class Kept(NamedTuple):
    server: Server
    job: dict[str, Any]
    log: str


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kept]:
    root = tmp_path_factory.mktemp("artifacts")
    srv = start_server(root / "home", "--cpus", "4")
    try:
        spec = write_job(root, artifact_job(), "name: keeper\nentrypoint: python train.py\n")
        job = srv.cli_json("submit", str(spec))
        assert job["state"] == "COMPLETED", job
        with srv.client as c:
            log = c.logs(job["id"], rank=0)[0]
        yield Kept(srv, job, log)
    finally:
        assert_clean_stop(srv)


EXPECTED = [
    ("figs/plots/curve.png", len(png(8, 6)), "image"),
    ("figs/plots/table.csv", len("step,loss\n0,1.0\n1,0.5\n"), "table"),
    ("mlflow/notes.txt", len("hello from the job\n"), "text"),
    ("notes.txt", len("hello from the job\n"), "text"),
]


def test_the_sdk_and_mlflow_keep_artifacts_with_the_job(kept: Kept) -> None:
    job_id = kept.job["id"]
    assert "kept ['notes.txt']" in kept.log, kept.log
    assert "kept ['figs/plots/curve.png', 'figs/plots/table.csv']" in kept.log, kept.log
    with kept.server.client as c:
        listed = c.artifacts(job_id)
        assert [(a["path"], a["size"], a["kind"]) for a in listed["artifacts"]] == EXPECTED
        assert listed["skipped"] == 0 and not listed["truncated"]
        # the experiment the script set names the job's project (its spec names none)
        assert c.job(job_id)["project"] == "vision"
    content = f"{kept.server.url}/api/v1/jobs/{job_id}/artifacts/content"
    image = httpx.get(content, params={"path": "figs/plots/curve.png", "inline": "true"})
    assert image.headers["content-type"] == "image/png" and image.content == png(8, 6)


def test_the_view_run_link_lands_on_the_jobs_page(kept: Kept) -> None:
    """MLflow prints "View run <name> at: <tracking URI>/#/experiments/E/runs/R" when the run
    ends: inside a job that URI is the job's scope, /mlflow/jobs/<id>."""
    job_id = kept.job["id"]
    found = re.search(r"View run \S+ at: (\S+)", kept.log)
    assert found, kept.log
    link = found.group(1)
    assert link.startswith(f"{kept.server.url}/mlflow/jobs/{job_id}/#/experiments/"), link
    page = httpx.get(link.split("#")[0], follow_redirects=True)
    assert page.status_code == 200 and "<title>trainhouse</title>" in page.text
    assert str(page.url) == f"{kept.server.url}/#/jobs/{job_id}"
    first = httpx.get(link.split("#")[0])
    assert first.status_code == 303 and first.headers["location"] == f"/#/jobs/{job_id}"


def test_the_cli_lists_and_downloads_artifacts(kept: Kept, tmp_path: Path) -> None:
    srv, job_id = kept.server, str(kept.job["id"])
    listed = srv.cli_json("artifacts", job_id)
    assert [(a["path"], a["size"]) for a in listed["artifacts"]] == [(p, z) for p, z, _ in EXPECTED]
    table = srv.cli("artifacts", job_id)
    assert table.returncode == 0, table.stderr
    assert "figs/plots/curve.png" in table.stdout and "PATH" in table.stdout
    # a file: under its name
    got = srv.cli_json("artifacts", job_id, "--download", "notes.txt", str(tmp_path / "one"))
    assert got["paths"] == [str(tmp_path / "one" / "notes.txt")]
    assert (tmp_path / "one" / "notes.txt").read_text() == "hello from the job\n"
    # a directory: under the directory's name
    got = srv.cli_json("artifacts", job_id, "--download", "figs/plots", str(tmp_path / "dir"))
    assert (tmp_path / "dir" / "plots" / "curve.png").read_bytes() == png(8, 6)
    assert (tmp_path / "dir" / "plots" / "table.csv").read_text().startswith("step,loss")
    assert len(got["paths"]) == 2
    # everything, under the full paths
    done = srv.cli("artifacts", job_id, "--download", ".", str(tmp_path / "all"))
    assert done.returncode == 0, done.stderr
    on_disk = sorted(str(p.relative_to(tmp_path / "all")) for p in (tmp_path / "all").rglob("*"))
    assert [p for p in on_disk if "." in Path(p).name] == sorted(p for p, _, _ in EXPECTED)
    # what is not there, or could escape, is a clear error
    missing = srv.cli("artifacts", job_id, "--download", "nope.txt", str(tmp_path / "x"))
    assert missing.returncode != 0 and "has no artifact 'nope.txt'" in missing.stderr
    assert "Traceback" not in missing.stderr
    escape = srv.cli("artifacts", job_id, "--download", "../../etc", str(tmp_path / "x"))
    assert escape.returncode != 0 and "'..'" in escape.stderr and "Traceback" not in escape.stderr
    assert not (tmp_path / "x").exists()
    none = srv.cli("artifacts", "999")
    assert none.returncode != 0 and "999" in none.stderr
    assert json.loads(srv.cli("artifacts", job_id, "--json").stdout)["job_id"] == int(job_id)


def test_a_download_never_removes_a_directory_in_its_way(kept: Kept, tmp_path: Path) -> None:
    """The job chooses its artifacts' names: a file named like a directory already in DEST
    (``src``, ``.git``) is refused with a clear error, the directory and what it holds kept
    (the download once removed it, recursively, to put the file in its place)."""
    srv, job_id = kept.server, str(kept.job["id"])
    dest = tmp_path / "project"
    (dest / "notes.txt").mkdir(parents=True)
    (dest / "notes.txt" / "precious").write_text("the user's")
    for path in ("notes.txt", "."):
        got = srv.cli("artifacts", job_id, "--download", path, str(dest))
        assert got.returncode != 0, got.stdout
        assert "is a directory" in got.stderr and "Traceback" not in got.stderr, got.stderr
        assert (dest / "notes.txt" / "precious").read_text() == "the user's"
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]  # nothing else fetched


def test_names_a_job_chose_are_shown_as_text(kept: Kept, tmp_path: Path) -> None:
    """An artifact's name is the job's: rich markup in it (``[/]``, ``[link=...]``) is printed as
    it is, never read as markup (``[/]`` made the listing fail with a traceback), and a
    terminal's control sequences (ESC) are shown escaped, never sent to the terminal."""
    srv, job_id = kept.server, str(kept.job["id"])
    root = JobLayout(srv.home, int(job_id)).artifacts
    names = [
        "odd[/]name.txt",
        "[red]not red.txt",
        "t\x1b]0;owned\x07.txt",
    ]
    for name in names:  # the first is a file "]name.txt" in a directory "odd["
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text("x")
    try:
        listed = srv.cli("artifacts", job_id)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
        assert "odd[/]name.txt" in listed.stdout
        assert "[red]not red.txt" in listed.stdout
        assert "\x1b" not in listed.stdout and "\\x1b]0;owned\\x07.txt" in listed.stdout
        got = srv.cli("artifacts", job_id, "--download", "[red]not red.txt", str(tmp_path))
        assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
        assert "downloaded" in got.stdout and "[red]not red.txt" in got.stdout
        assert (tmp_path / "[red]not red.txt").read_text() == "x"
    finally:
        for name in names:
            (root / name).unlink()
        (root / "odd[").rmdir()
