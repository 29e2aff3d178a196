"""The pure side of datasets: references, paths, manifests and their digests, what the launcher
log says of staging, and the line a followed job shows while it stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainhouse.cli.follow import _starting
from trainhouse.core.datasets import (
    MAX_FILES,
    STAGING_FAILED_CODE,
    STAGING_FAILED_LINE,
    STAGING_RETRY_CODE,
    FileEntry,
    Manifest,
    Pin,
    StagedSource,
    StageRequest,
    check_path,
    env_var,
    parse_ref,
    staging_phase,
)
from trainhouse.core.errors import DatasetError
from trainhouse.core.lifecycle import FailureKind
from trainhouse.core.spec import NoRestart
from trainhouse.executors.base import Exit
from trainhouse.jobfs.layout import JobLayout
from trainhouse.scheduler.failures import analyse

SHA = "a" * 64


def test_references_and_keys() -> None:
    assert parse_ref("digits") == ("digits", None)
    assert parse_ref("digits@12") == ("digits", 12)
    for bad in ("digits@", "digits@0", "digits@x", "@1", "a/b", "x" * 65, "d\nx"):
        with pytest.raises(DatasetError):
            parse_ref(bad)
    assert env_var("train") == "TRAINHOUSE_DATASET_TRAIN"
    for bad in ("Train", "1x", "a-b", "", "x" * 33):
        with pytest.raises(DatasetError, match="datasets key"):
            env_var(bad)


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../b", "/abs", "a//b", "./a", "a/.", "a\\b", "a\x00b", "a\nb", "", "x" * 1025],
)
def test_a_path_that_could_leave_its_version_is_refused(path: str) -> None:
    with pytest.raises(DatasetError):
        check_path(path)


def test_manifests_are_ordered_checked_and_digested() -> None:
    a, b = FileEntry("b/x", 1, "sha256", SHA), FileEntry("a", 2, "md5", "b" * 32)
    one, two = Manifest.of([a, b]), Manifest.of([b, a])
    assert [f.path for f in one.files] == ["a", "b/x"] and one.digest == two.digest
    assert one.size == 3 and Manifest.from_json(one.to_json()) == one
    assert Manifest.of([a, FileEntry("a", 3, "sha256", SHA)]).digest != one.digest
    with pytest.raises(DatasetError, match="listed twice"):
        Manifest.of([a, a])
    with pytest.raises(DatasetError, match="both a file and a directory"):
        Manifest.of([a, FileEntry("b", 1, "sha256", SHA)])
    with pytest.raises(DatasetError, match="digest"):
        FileEntry("a", 1, "md5", SHA)  # an md5 is 32 hex digits
    with pytest.raises(DatasetError, match="over the limit"):
        Manifest.from_json([{}] * (MAX_FILES + 1))
    request = StageRequest((StagedSource(Pin("train", "d", 2, SHA), "s3://b/p", {"k": "v"}),))
    assert StageRequest.from_json(request.with_cache("/c", 5).to_json()).cache_bytes == 5


def test_the_staging_phase_and_the_followed_line() -> None:
    log = (
        "trainhouse: staging digits@2: 3 files, 290 MB\n"
        "trainhouse: staging digits@2: 41% (120 MB of 290 MB)\n"
    )
    assert staging_phase(log) == "staging digits@2: 41% (120 MB of 290 MB)"
    assert staging_phase("nothing\n") is None
    failed = log + "trainhouse: a dataset could not be staged: dataset file 'x' is missing\n"
    assert staging_phase(failed) == "staging failed: dataset file 'x' is missing"
    job: dict[str, Any] = {"state": "RUNNING", "last_step": None, "staging": staging_phase(log)}
    assert _starting(job) == " (staging digits@2: 41% (120 MB of 290 MB))"  # type: ignore[arg-type]
    job["staging"] = "staging digits@2: ready in 1.00 s"
    assert _starting(job) == ""  # type: ignore[arg-type]


@pytest.mark.parametrize("transient", [False, True])
def test_a_staging_failure_is_the_jobs_or_the_infrastructures(
    tmp_path: Path, transient: bool
) -> None:
    """A version that cannot be read as registered fails the job at once; a timeout or a 5xx
    (past the node's own retries) is tried again as an infrastructure failure."""
    files = JobLayout(tmp_path, 1)
    files.logs.mkdir(parents=True)
    why = "dataset file 'x.bin' " + ("could not be fetched (tried 3 times)" if transient else
                                     "changed since it was registered")  # fmt: skip
    files.log("launcher").write_text(
        "=== trainhouse: attempt 1 ===\n[node 1] trainhouse: staging d@1: 1 files, 0.1 MB\n"
        f"[node 1] {STAGING_FAILED_LINE}: {why}\n"
    )
    code = STAGING_RETRY_CODE if transient else STAGING_FAILED_CODE
    failure = analyse(Exit(1, 1, code, {"0": -15}), files, 1, NoRestart())
    assert failure.summary == f"a dataset could not be staged: {why}"
    if transient:
        assert failure.kind is FailureKind.INFRA and failure.permanent is None
    else:
        assert failure.kind is FailureKind.USER and failure.permanent
