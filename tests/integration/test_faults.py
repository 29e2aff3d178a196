"""Faults injected into real jobs: failures that must not be retried, and killed ranks that
must resume as if nothing had happened."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.jobs import RANDOM_SCRIPT, rank_process, write_job
from tests.support.servers import EXAMPLE, Server, assert_clean_stop, start_server
from trainhouse.sdk.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration


def test_a_missing_module_fails_at_once_and_show_says_why(server: Server, tmp_path: Path) -> None:
    spec = write_job(
        tmp_path,
        "import trainhouse\nimport tranformers  # a typo: retrying cannot help\n",
        "name: typo\nentrypoint: python train.py\nmax_restarts: 3\n"
        "resources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert final["state"] == "FAILED" and final["restarts"] == 0
    assert len(final["attempt_history"]) == 1
    attempt = final["attempt_history"][0]
    assert attempt["failure"] == "user" and attempt["failed_rank"] in (0, 1)
    assert "No module named 'tranformers'" in attempt["log_tail"]
    assert "not restarted: the log matches 'ModuleNotFoundError'" in final["reason"]
    shown = server.cli("show", str(job["id"])).stdout
    assert "FAILED RANK" in shown and "(code)" in shown
    assert "last lines of rank" in shown and "ModuleNotFoundError" in shown


BAD_HPARAM = """
import os

lr = {lr!r}
print("attempt", os.environ["TRAINHOUSE_ATTEMPT"], "starts", flush=True)
float(lr)  # a bad hparam: ValueError, the same on every attempt
"""

CHANGING = """
import os

attempt = os.environ["TRAINHOUSE_ATTEMPT"]
raise ValueError(f"attempt {attempt} went wrong its own way")
"""


def test_the_same_error_twice_is_not_restarted_again(server: Server, tmp_path: Path) -> None:
    """A deterministic error (a bad hparam) restarts once, and when the next attempt's log
    ends in the same exception the job fails, its restarts left unused; the reason says so and
    quotes the last lines. An error that changes is restarted while max_restarts lasts."""
    spec = write_job(
        tmp_path / "same",
        BAD_HPARAM.format(lr="fast"),
        "name: same\nentrypoint: python train.py\nmax_restarts: 3\n"
        "resources: {procs_per_node: 2}\n",
    )
    job = server.cli_json("submit", str(spec), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    said = "ValueError: could not convert string to float: 'fast'"
    assert final["state"] == "FAILED" and final["restarts"] == 1, final["reason"]
    assert len(final["attempt_history"]) == 2
    assert (
        f"; not restarted: the same error as attempt 1 ({said}); last lines:\n" in (final["reason"])
    )
    assert final["reason"].rstrip().endswith(said)  # the real last lines, not an empty list
    second = final["attempt_history"][1]
    assert second["failure"] == "user" and said in second["log_tail"]

    changing = write_job(
        tmp_path / "changing",
        CHANGING,
        "name: changing\nentrypoint: python train.py\nmax_restarts: 2\n"
        "resources: {procs_per_node: 1}\n",
    )
    job = server.cli_json("submit", str(changing), "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert final["state"] == "FAILED" and final["restarts"] == 2, final["reason"]
    assert "max_restarts (2) used up; last lines:\n" in final["reason"]
    assert final["reason"].endswith("ValueError: attempt 3 went wrong its own way")


def test_the_digits_example_refuses_a_bad_hparam_in_one_attempt(server: Server) -> None:
    """The example (max_restarts: 1) checks its hparams first: a bad one exits with code 2,
    which is never restarted, so it fails once, naming the hparam (it ran twice)."""
    job = server.cli_json("submit", str(EXAMPLE), "--set", "hparams.lr=-0.1", "--detach")
    final = server.wait(job["id"], {"FAILED", "COMPLETED"})
    assert final["state"] == "FAILED" and final["restarts"] == 0, final["reason"]
    assert len(final["attempt_history"]) == 1
    assert "exit code 2 is in no_restart_on.exit_codes" in final["reason"]
    assert "hparams.lr must be a learning rate above 0 and below 10, got -0.1" in final["reason"]


NUL_SCRIPT = """
import sys
sys.stdout.buffer.write(b"dumping state \\x00\\x00\\xff done\\n")
sys.stdout.flush()
sys.exit(3)
"""


def test_a_rank_whose_log_holds_nul_bytes_fails_as_its_exit_code_says(tmp_path: Path) -> None:
    """PostgreSQL's text holds no NUL: the attempt could not be recorded, was taken for lost
    and restarted until the infrastructure budget ran out, its exit code and no_restart_on
    ignored. Its log tail is stored with U+FFFD where the NULs were."""
    server = start_server(tmp_path / "home", "--cpus", "2", "--max-infra-restarts", "1")
    try:
        spec = write_job(
            tmp_path,
            NUL_SCRIPT,
            "name: nul\nentrypoint: python train.py\nmax_restarts: 3\n"
            "no_restart_on: {exit_codes: [3]}\nresources: {procs_per_node: 1}\n",
        )
        job = server.cli_json("submit", str(spec), "--detach")
        final = server.wait(job["id"], {"FAILED", "COMPLETED"})
        assert final["state"] == "FAILED", final["reason"]
        assert (final["exit_code"], final["restarts"], final["infra_restarts"]) == (3, 0, 0)
        assert "exit code 3 is in no_restart_on.exit_codes" in final["reason"]
        [attempt] = final["attempt_history"]
        assert (attempt["result"], attempt["failure"]) == ("failed", "user")
        assert attempt["exit_code"] == 3
        assert "dumping state \ufffd\ufffd\ufffd done" in attempt["log_tail"]
        assert "dumping state \ufffd\ufffd\ufffd done" in final["reason"]
    finally:
        assert_clean_stop(server)


@pytest.mark.parametrize("job", ["digits-example", "random-generators"])
def test_a_killed_rank_resumes_bit_identically(server: Server, tmp_path: Path, job: str) -> None:
    """SIGKILL one rank of a 2-rank DDP run mid-run: after the automatic restart (an
    infrastructure failure, so max_restarts: 0 is enough) the final weights and every logged
    loss equal those of an uninterrupted run with the same seed."""
    if job == "digits-example":  # the sampler's position must survive: resumed mid-epoch
        spec = EXAMPLE
        args = ["--set", "hparams.epochs=3", "--set", "hparams.checkpoint_every=8"]
        kill_at = 20
    else:  # the RNG states of every rank must survive
        spec = write_job(
            tmp_path,
            RANDOM_SCRIPT,
            "name: random\nentrypoint: python train.py\nresources: {procs_per_node: 2}\n",
        )
        args, kill_at = [], 17
    args += ["--detach", "--set", "max_restarts=0"]
    clean = server.cli_json("submit", str(spec), *args)
    killed = server.cli_json("submit", str(spec), *args)
    server.wait_step(killed["id"], kill_at)
    victim = rank_process(killed["id"], 1)
    assert victim is not None
    victim.kill()
    a = server.wait(clean["id"], {"COMPLETED", "FAILED"}, timeout=400)
    b = server.wait(killed["id"], {"COMPLETED", "FAILED"}, timeout=400)
    assert a["state"] == "COMPLETED", (a["reason"], a["attempt_history"])
    assert b["state"] == "COMPLETED", (b["reason"], b["attempt_history"])
    first = b["attempt_history"][0]
    assert first["failure"] == "infra" and first["failed_rank"] == 1, first
    assert (b["restarts"], b["infra_restarts"]) == (0, 1)
    assert "=== trainhouse: attempt 2" in server.cli("logs", str(killed["id"])).stdout

    def series(job_id: int) -> list[tuple[int, float]]:
        found = server.cli_json("metrics", str(job_id))["series"]
        loss = next(s for s in found if s["name"] == "loss")
        return [(p[0], p[1]) for p in loss["points"]]

    sa, sb = series(clean["id"]), series(killed["id"])
    assert [s for s, _ in sb] == list(range(len(sb)))  # every step exactly once
    assert sb == sa  # and the same value at every step

    def final_state(job_id: int) -> dict[str, torch.Tensor]:
        listing = server.cli_json("checkpoints", str(job_id))
        last = listing["checkpoints"][-1]
        state = load_checkpoint(Path(listing["directory"]) / last["path"])
        return state["model"]  # type: ignore[no-any-return]

    wa, wb = final_state(clean["id"]), final_state(killed["id"])
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
