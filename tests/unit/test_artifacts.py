"""A job's artifacts (issue 33, section 4): the confined listing and path rules
(trainhouse.jobfs.artifacts), the routes that list, download and show them
(GET /api/v1/jobs/{id}/artifacts[/content]) with hostile files and paths, MLflow's "View run at"
link, and an MLflow experiment naming the job's project.

The SDK's run.log_artifact, the CLI and the job page against a real server:
tests/integration/test_artifacts.py and tests/browser/test_job_artifacts.py."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import app_client, services, submit, wait_launched, workdir
from tests.support.artifacts import png
from tests.support.fakes import FakeExecutor
from tests.support.team import Team, make_team
from trainhouse.core.errors import UnsafeFile
from trainhouse.jobfs import artifacts as files
from trainhouse.store.tracking import project_name

MLFLOW = "/mlflow/api/2.0/mlflow"
ARTIFACTS = "/mlflow/api/2.0/mlflow-artifacts/artifacts"


# -- the confined listing and the path rules --------------------------------------------------
def test_listing_keeps_plain_files_and_leaves_out_links_fifos_and_hard_links(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    root = home / "jobs" / "1" / "artifacts"
    (root / "plots" / "deep").mkdir(parents=True)
    (root / "notes.txt").write_text("hello")
    (root / "plots" / "a.png").write_bytes(png())
    (root / "plots" / "deep" / "b.csv").write_text("x,y\n1,2\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    (root / "link.txt").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)  # a directory link: not walked
    os.mkfifo(root / "fifo")
    os.link(outside, root / "hard.txt")  # a hard link to a file outside
    (root / ".up.bin.tmp-1-ab").write_bytes(b"half")  # an upload under way: not an artifact
    found = files.listing(home, root)
    assert [(f.path, f.size) for f in found.files] == [
        ("notes.txt", 5),
        ("plots/a.png", len(png())),
        ("plots/deep/b.csv", 8),
    ]
    assert found.skipped == 4 and not found.truncated
    assert found.total_bytes == 5 + len(png()) + 8


def test_listing_is_bounded_and_a_missing_directory_lists_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = home / "jobs" / "1" / "artifacts"
    assert files.listing(home, root).files == []
    (root / "a" / "b" / "c").mkdir(parents=True)
    for i in range(5):
        (root / f"f{i}").write_text("x")
    (root / "a" / "b" / "c" / "deep.txt").write_text("x")
    cut = files.listing(home, root, limit=3)
    assert cut.truncated and len(cut.files) <= 3
    shallow = files.listing(home, root, depth=1)
    assert shallow.truncated and "a/b/c/deep.txt" not in [f.path for f in shallow.files]


def test_an_artifacts_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "jobs" / "1").mkdir(parents=True)
    (home / "jobs" / "1" / "artifacts").symlink_to(tmp_path)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        files.listing(home, home / "jobs" / "1" / "artifacts")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../secret", "'..'"),
        ("a/../../b", "'..'"),
        ("./a", "'.'"),
        ("/etc/passwd", "not absolute"),
        ("a\x00b", "NUL"),
        ("a\\..\\b", "not '\\'"),
        (".x.tmp-1-ab", "upload under way"),
        ("a/" * 40 + "b", "deep"),
        ("x" * 2000, "at most 1024"),
    ],
)
def test_artifact_paths_that_could_escape_are_refused(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        files.parts_of(path)


def test_artifact_paths_and_what_the_bytes_say() -> None:
    assert files.parts_of("plots//a.png") == ["plots", "a.png"]
    assert files.parts_of("") == []
    assert files.sniff_image(png()) == "image/png"
    assert files.sniff_image(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert files.sniff_image(b"GIF89a...") == "image/gif"
    assert files.sniff_image(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    assert files.sniff_image(svg) is None  # an SVG is never an image here
    assert files.is_text(svg) and files.is_text("héllo\n".encode())
    assert not files.is_text(b"a\x00b") and not files.is_text(b"\xff\xfe")
    assert files.kind_of_name("a/B.PNG") == "image" and files.kind_of_name("t.csv") == "table"
    assert files.kind_of_name("x.svg") == "text" and files.kind_of_name("w.bin") == "file"


# -- the routes ------------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    with app_client(tmp_path, exit_code=None) as client:
        yield client


def tracked_run(api: TestClient) -> int:
    made = api.post(f"{MLFLOW}/runs/create", json={"experiment_id": "0"})
    assert made.status_code == 200, made.text
    return int(made.json()["run"]["info"]["run_id"])


def put(api: TestClient, run: int, path: str, data: bytes) -> None:
    resp = api.put(f"{ARTIFACTS}/runs/{run}/{path}", content=data)
    assert resp.status_code == 200, resp.text


def test_listing_download_and_inline_view(api: TestClient, tmp_path: Path) -> None:
    run = tracked_run(api)
    page = '<html><script>alert("job")</script></html>'
    put(api, run, "notes.txt", b"hello\nworld\n")
    put(api, run, "plots/curve.png", png())
    put(api, run, "page.html", page.encode())
    put(api, run, "weights.bin", b"\x00\x01\x02" * 100)
    listed = api.get(f"/api/v1/jobs/{run}/artifacts")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [(a["path"], a["size"], a["kind"]) for a in body["artifacts"]] == [
        ("notes.txt", 12, "text"),
        ("page.html", len(page), "text"),
        ("plots/curve.png", len(png()), "image"),
        ("weights.bin", 300, "file"),
    ]
    assert body["total_bytes"] == 12 + len(page) + len(png()) + 300 and body["skipped"] == 0
    content = f"/api/v1/jobs/{run}/artifacts/content"
    # a download: the bytes as they are, an attachment, never sniffed or run
    got = api.get(content, params={"path": "weights.bin"})
    assert got.status_code == 200 and got.content == b"\x00\x01\x02" * 100
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"].startswith('attachment; filename="weights.bin"')
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert got.headers["content-length"] == "300"
    # inline: text as text (HTML too: shown, never rendered), a PNG by its bytes
    text = api.get(content, params={"path": "notes.txt", "inline": "true"})
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    assert text.headers["content-disposition"].startswith("inline;")
    assert text.text == "hello\nworld\n"
    html = api.get(content, params={"path": "page.html", "inline": "true"})
    assert html.headers["content-type"] == "text/plain; charset=utf-8" and html.text == page
    image = api.get(content, params={"path": "plots/curve.png", "inline": "true"})
    assert image.headers["content-type"] == "image/png" and image.content == png()
    assert image.headers["content-security-policy"] == "default-src 'none'; sandbox"
    # a binary file is no inline view; a PNG name on other bytes is no image
    binary = api.get(content, params={"path": "weights.bin", "inline": "true"})
    assert binary.status_code == 400
    assert "neither text nor a PNG" in binary.json()["error"]["message"]
    put(api, run, "fake.png", b"\x00\x01not an image")
    fake = api.get(content, params={"path": "fake.png", "inline": "true"})
    assert fake.status_code == 400


def test_a_file_too_large_for_the_page_is_a_download(api: TestClient) -> None:
    from trainhouse.usecases.artifacts import MAX_INLINE

    run = tracked_run(api)
    put(api, run, "big.log", b"x" * (MAX_INLINE + 1))
    content = f"/api/v1/jobs/{run}/artifacts/content"
    big = api.get(content, params={"path": "big.log", "inline": "true"})
    assert big.status_code == 413
    assert "download it instead" in big.json()["error"]["message"]
    assert len(api.get(content, params={"path": "big.log"}).content) == MAX_INLINE + 1


def test_hostile_files_and_paths_are_refused(api: TestClient, tmp_path: Path) -> None:
    run = tracked_run(api)
    put(api, run, "ok.txt", b"fine")
    root = services(api).files(run).artifacts
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    (root / "link.txt").symlink_to(outside)
    (root / "dirlink").symlink_to(tmp_path)
    os.mkfifo(root / "fifo")
    os.link(outside, root / "hard.txt")
    body = api.get(f"/api/v1/jobs/{run}/artifacts").json()
    assert [a["path"] for a in body["artifacts"]] == ["ok.txt"] and body["skipped"] == 4
    content = f"/api/v1/jobs/{run}/artifacts/content"
    home = str(services(api).settings.home)
    for path, status, words in (
        ("link.txt", 400, "a symbolic link"),
        ("dirlink/outside.txt", 400, "a symbolic link"),
        ("fifo", 400, "not a regular file"),
        ("hard.txt", 400, "several hard links"),
        ("../../../outside.txt", 400, "no '..' component"),
        ("/etc/passwd", 400, "not absolute"),
        ("a\\..\\b", 400, "'\\\\'"),
        ("missing.txt", 404, "no artifact"),
        ("", 422, ""),
    ):
        resp = api.get(content, params={"path": path})
        assert resp.status_code == status, (path, resp.text)
        assert words in resp.text, (path, resp.text)
        assert home not in resp.text and str(tmp_path) not in resp.text
    assert api.get(content, params={"path": "a\x00b"}).status_code == 422
    assert api.get(content, params={"path": "dirlink"}).status_code == 400


@pytest.mark.parametrize("visibility", ["own", "all"])
def test_artifacts_are_read_as_the_jobs_other_files(tmp_path: Path, visibility: str) -> None:
    gen = make_team(tmp_path, job_visibility=visibility)
    team: Team = next(gen)
    try:
        api = team.api
        made = api.post(
            f"{MLFLOW}/runs/create", json={"experiment_id": "0"}, headers=team.h("alice")
        )
        run = int(made.json()["run"]["info"]["run_id"])
        resp = api.put(f"{ARTIFACTS}/runs/{run}/notes.txt", content=b"hi", headers=team.h("alice"))
        assert resp.status_code == 200, resp.text
        listing = f"/jobs/{run}/artifacts"
        content = f"{listing}/content?path=notes.txt"
        readers = ["alice", "root"] + (["bob", "vera"] if visibility == "all" else [])
        for user in ("alice", "root", "bob", "vera"):
            status = 200 if user in readers else 403
            assert team.get(user, listing).status_code == status, user
            got = team.get(user, content)
            assert got.status_code == status, user
            if status == 200:
                assert got.content == b"hi"
        assert api.get(f"/api/v1{listing}").status_code == 401
    finally:
        gen.close()


# -- MLflow: the "View run at" link, the experiment as the job's project ------------------------
def test_the_view_run_link_lands_on_the_jobs_page(api: TestClient) -> None:
    for path, where in (
        ("/mlflow/jobs/7/", "/#/jobs/7"),
        ("/mlflow/jobs/7", "/#/jobs/7"),
        ("/mlflow/", "/"),
    ):
        resp = api.get(path, follow_redirects=False)
        assert resp.status_code == 303, (path, resp.text)
        assert resp.headers["location"] == where
    assert api.get("/mlflow/jobs/x7/", follow_redirects=False).status_code == 404


def test_project_names_from_experiments() -> None:
    assert project_name("Default") == "default"
    assert project_name("my exp/1") == "my-exp-1"
    assert project_name("  résumé  ") == "résumé"
    assert project_name("_hidden") == "hidden"
    assert project_name("é-first") == "mlflow-é-first"
    assert project_name("///") == "default"
    assert len(project_name("x" * 500)) == 128


def test_the_experiment_names_the_project_unless_the_spec_does(
    api: TestClient, tmp_path: Path
) -> None:
    def job_in_experiment(spec: str, experiment: str) -> int:
        job_id = int(submit(api, spec, workdir(tmp_path)).json()["id"])
        wait_launched(api, job_id)
        fake = services(api).scheduler.executor
        assert isinstance(fake, FakeExecutor)
        token = next(lc.env.token for lc in fake.launches if lc.env.job_id == job_id)
        auth = {"Authorization": f"Bearer {token}"}
        scope = f"/mlflow/jobs/{job_id}/api/2.0/mlflow"
        found = api.get(
            f"{scope}/experiments/get-by-name",
            params={"experiment_name": experiment},
            headers=auth,
        )
        if found.status_code == 200:
            exp = found.json()["experiment"]["experiment_id"]
        else:
            made = api.post(f"{scope}/experiments/create", json={"name": experiment}, headers=auth)
            exp = made.json()["experiment_id"]
        run = api.post(f"{scope}/runs/create", json={"experiment_id": exp}, headers=auth)
        assert run.status_code == 200, run.text
        return job_id

    free = job_in_experiment("name: free\nentrypoint: python train.py\n", "vision runs")
    fixed = job_in_experiment(
        "name: fixed\nentrypoint: python train.py\nproject: mine\n", "vision runs"
    )
    assert api.get(f"/api/v1/jobs/{free}").json()["project"] == "vision-runs"
    assert api.get(f"/api/v1/jobs/{fixed}").json()["project"] == "mine"
    listed = api.get("/api/v1/jobs", params={"all": "true", "project": "vision-runs"}).json()
    assert [j["id"] for j in listed["jobs"]] == [free]
    # a tracked run (made outside a job) takes its experiment's name too
    exp = api.post(f"{MLFLOW}/experiments/create", json={"name": "nlp"}).json()["experiment_id"]
    made = api.post(f"{MLFLOW}/runs/create", json={"experiment_id": exp})
    run = made.json()["run"]["info"]["run_id"]
    assert api.get(f"/api/v1/jobs/{run}").json()["project"] == "nlp"


# -- the SDK standalone: ./artifacts/ ---------------------------------------------------------
def test_a_standalone_run_keeps_artifacts_in_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainhouse

    for name in [k for k in os.environ if k.startswith(("TRAINHOUSE_", "MLFLOW_"))]:
        monkeypatch.delenv(name)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "plots" / "deep").mkdir(parents=True)
    (tmp_path / "plots" / "deep" / "a.csv").write_text("x\n1\n")
    (tmp_path / "plots" / "link.txt").symlink_to(tmp_path / "notes.txt")  # not followed
    with trainhouse.init() as run:
        assert run.log_artifact("notes.txt") == ["notes.txt"]
        assert run.log_artifact("plots", artifact_path="figs") == ["figs/plots/deep/a.csv"]
        with pytest.raises(ValueError, match=re.escape("no '..' component")):
            run.log_artifact("notes.txt", artifact_path="../outside")
        with pytest.raises(FileNotFoundError):
            run.log_artifact("missing.txt")
    assert (tmp_path / "artifacts" / "notes.txt").read_text() == "hi"
    assert (tmp_path / "artifacts" / "figs" / "plots" / "deep" / "a.csv").read_text() == "x\n1\n"
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("size", ["12", -1, 1.5, True, None])
def test_a_listing_whose_size_is_no_size_is_refused_by_the_client(
    size: object, tmp_path: Path
) -> None:
    """The client checks a hostile server's listing: a size that is not a whole number of
    bytes is a clear error before anything is fetched (int() raised or took it)."""
    from trainhouse.client.artifacts import _chosen
    from trainhouse.core.errors import ClientError

    listing: Any = {"artifacts": [{"path": "notes.txt", "size": size}]}
    with pytest.raises(ClientError, match=re.escape("listed artifact 'notes.txt' with no size")):
        _chosen(listing, "")
    assert _chosen({"artifacts": [{"path": "notes.txt", "size": 12}]}, "") == [  # type: ignore[typeddict-item]
        ("notes.txt", 12, "notes.txt")
    ]
