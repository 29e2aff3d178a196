"""Flows end to end, a real server with real jobs, as a user drives them with the CLI:

- the digits example's flow: train (2 DDP ranks, saving its model), then an evaluation that
  loads the model its upstream saved (staged on the node, verified) and gets the same outputs
  as the downloaded version, then promotes it to ``champion``;
- promotion across three flows: the alias moves only to a better version, each decision
  recorded with both values (and a manual move in between is the user's, in the audit log);
- ``--after`` on single jobs, and a failing upstream ending its dependents with the reason;
- a flow survives a server SIGKILL mid-flow: no step lost, none run twice.
"""

from __future__ import annotations

import json
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.servers import (
    EXAMPLE,
    Server,
    assert_clean_stop,
    example_module,
    start_server,
)
from trainhouse.sdk import load_model

pytestmark = pytest.mark.integration

# waits until the file named by hparams.release exists (the test lets it go), then exits with
# hparams.code
GATED = """
import os, sys, time
import trainhouse

with trainhouse.init(hparams={"release": "", "code": 0}) as run:
    gate = run.hparams["release"]
    while gate and not os.path.exists(gate):
        time.sleep(0.1)
    print("step", os.environ["TRAINHOUSE_JOB_NAME"], "ran attempt", run.attempt, flush=True)
    run.log({"done": 1.0}, step=0)
code = int(os.environ.get("CODE", "0"))
sys.exit(code)
"""

# saves a tiny model with the accuracy it is told, and promotes it by that accuracy
TINY = """
import torch
import trainhouse

with trainhouse.init(hparams={"acc": 0.0}) as run:
    torch.manual_seed(0)
    acc = float(run.hparams["acc"])
    run.log({"acc": acc}, step=0)
    run.save_model(
        "tiny", torch.nn.Linear(2, 1), example_inputs=(torch.zeros(2, 2),),
        metrics={"acc": acc}, step=0,
    )
"""


def _files(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def _cli_json(server: Server, *args: str) -> Any:
    result = server.cli(*args)
    assert result.returncode in (0, 1, 4), result.stderr + result.stdout
    return json.loads(result.stdout)


def test_train_evaluate_promote_as_one_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's Ship it loop: one submit trains, evaluates the trained model and moves
    digits-cnn@champion to it."""
    # torch.export's loader makes an inductor cache (the evaluation's, and this test's own)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    server = start_server(tmp_path / "home", "--cpus", "4")
    try:
        flow_file = EXAMPLE.parent / "flow.yaml"
        result = server.cli(
            "submit", str(flow_file), "--set", "train.hparams.epochs=1", "--json", timeout=600
        )
        assert result.returncode == 0, result.stderr + result.stdout
        done = json.loads(result.stdout)
        assert done["state"] == "COMPLETED", done
        jobs = done["jobs"]
        assert list(jobs) == ["train", "evaluate"]
        # one progress line per step on the way (stderr under --json)
        assert "evaluate" in result.stderr and "COMPLETED" in result.stderr

        evaluate = server.cli_json("show", str(jobs["evaluate"]))
        assert evaluate["after"] == [
            {"job_id": jobs["train"], "when": "completed", "state": "COMPLETED"}
        ]
        (read,) = evaluate["inputs"]
        assert (read["key"], read["ref"], read["model"]) == (
            "candidate",
            f"job:{jobs['train']}",
            "digits-cnn",
        )
        version = server.cli_json("models", "show", "digits-cnn")["versions"][-1]
        assert version["version"] == read["version"] and version["job_id"] == jobs["train"]

        # the evaluation ran the very model the train step saved: its outputs, summed, are the
        # downloaded version's on the same held-out digits
        out = server.cli_json(
            "models", "download", f"digits-cnn@{read['version']}", str(tmp_path / "dl")
        )
        model = load_model(Path(out["path"]))
        _, val = example_module().datasets(0)
        x, y = val.tensors
        with torch.no_grad():
            logits = model(x)
        metrics = evaluate["latest_metrics"]
        assert metrics["output_sum"] == pytest.approx(logits.sum().item(), rel=1e-5, abs=1e-3)
        assert metrics["val_acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())

        # promoted: no version held champion before
        promotion = evaluate["promotion"]
        assert promotion["promoted"] is True and promotion["version"] == read["version"]
        assert (
            "promoted v" in promotion["decision"]
            and "(no version held it)" in (promotion["decision"])
        )
        shown = server.cli_json("models", "show", "digits-cnn")
        assert shown["model"]["aliases"] == {"champion": read["version"]}
        assert shown["readers"] == {str(read["version"]): [jobs["evaluate"]]}
        text = server.cli("show", str(jobs["evaluate"])).stdout
        assert "promotion" in text and f"candidate=digits-cnn@{read['version']}" in text
        flow = server.cli_json("flows", "show", str(done["flow"]))
        assert [(s["name"], s["state"]) for s in flow["steps"]] == [
            ("train", "COMPLETED"),
            ("evaluate", "COMPLETED"),
        ]
        assert server.cli_json("flows")["flows"][0]["id"] == done["flow"]
    finally:
        assert_clean_stop(server)


def test_promotion_moves_the_alias_only_to_a_better_version(server: Server, tmp_path: Path) -> None:
    root = _files(
        tmp_path / "tiny",
        {
            "train.py": TINY,
            "job.yaml": """
                name: tiny
                entrypoint: python train.py
                resources: {procs_per_node: 1}
                env: {OMP_NUM_THREADS: "1"}
                promote: {alias: champion, metric: acc, mode: max}
            """,
            "flow.yaml": "name: tiny-release\njobs:\n  train: {spec: job.yaml}\n",
        },
    )
    decisions = []
    for acc in ("0.5", "0.9", "0.7"):
        done = _cli_json(
            server, "submit", str(root / "flow.yaml"), "--set", f"train.hparams.acc={acc}", "--json"
        )
        assert done["state"] == "COMPLETED", done
        job = server.cli_json("show", str(done["jobs"]["train"]))
        decisions.append(job["promotion"])
        aliases = server.cli_json("models", "show", "tiny")["model"]["aliases"]
        if acc == "0.9":
            # a person moves the alias back by hand between the flows: theirs, in the audit log
            assert aliases == {"champion": 2}
            server.cli_json("models", "alias", "tiny", "1", "champion")
    assert [d["promoted"] for d in decisions] == [True, True, True]
    assert decisions[0]["decision"] == "tiny: promoted v1 to champion: acc 0.5 (no version held it)"
    assert decisions[1]["decision"] == "tiny: promoted v2 to champion: acc 0.9 > 0.5 (v1)"
    # v1 holds it again (moved by hand): 0.7 beats the 0.5 that promoted v1
    assert decisions[2]["decision"] == "tiny: promoted v3 to champion: acc 0.7 > 0.5 (v1)"
    # a fourth, worse one: the alias stays, and the refusal is recorded with both values
    done = _cli_json(
        server, "submit", str(root / "flow.yaml"), "--set", "train.hparams.acc=0.6", "--json"
    )
    kept = server.cli_json("show", str(done["jobs"]["train"]))["promotion"]
    assert kept["promoted"] is False
    assert kept["decision"] == "tiny: kept v3 as champion: acc 0.6 (v4) <= 0.7"
    shown = server.cli_json("models", "show", "tiny")
    assert shown["model"]["aliases"] == {"champion": 3}
    assert [p["version"] for p in shown["promotions"]] == [4, 3, 2, 1]
    audit = server.cli_json("admin", "audit", "--limit", "50")
    actions = [(e["action"], e["actor"]) for e in audit["entries"]]
    assert actions.count(("model.promote", f"job:{done['jobs']['train'] - 1}")) == 1
    assert ("model.promote.kept", f"job:{done['jobs']['train']}") in actions
    assert any(a == "model.alias" and not actor.startswith("job:") for a, actor in actions)


def test_after_holds_a_job_and_a_failed_upstream_ends_its_dependents(
    server: Server, tmp_path: Path
) -> None:
    root = _files(
        tmp_path / "gated",
        {
            "train.py": GATED,
            "job.yaml": "name: gated\nentrypoint: python train.py\n"
            "resources: {procs_per_node: 1}\n",
        },
    )
    gate = tmp_path / "go"
    first = server.cli_json(
        "submit", str(root / "job.yaml"), "--set", f"hparams.release={gate}", "--detach"
    )
    second = server.cli_json(
        "submit", str(root / "job.yaml"), "--after", str(first["id"]), "--detach"
    )
    assert second["spec"]["after"] == [{"job": first["id"], "when": "completed"}]
    server.wait(first["id"], {"RUNNING"})
    deadline = time.monotonic() + 60
    while "waiting for job" not in (server.cli_json("show", str(second["id"]))["reason"] or ""):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    shown = server.cli("show", str(second["id"])).stdout
    assert f"waiting for job {first['id']} to complete (it is RUNNING)" in " ".join(shown.split())
    gate.touch()
    assert server.wait(second["id"], {"COMPLETED", "CANCELED", "FAILED"})["state"] == "COMPLETED"

    # a failing upstream: its dependent, and that one's dependent, end with the reason
    failing = server.cli_json(
        "submit", str(root / "job.yaml"), "--set", f"hparams.release={gate}2", "--set",
        "env.CODE=3", "--detach",
    )  # fmt: skip
    child = server.cli_json("submit", str(root / "job.yaml"), "--after", str(failing["id"]), "-d")
    grandchild = server.cli_json(
        "submit", str(root / "job.yaml"), "--after", str(child["id"]), "--detach"
    )
    Path(f"{gate}2").touch()
    assert server.wait(failing["id"], {"FAILED"})["exit_code"] == 3
    ended = server.wait(child["id"], {"CANCELED"})
    assert ended["reason"] == f"upstream job {failing['id']} FAILED" and ended["attempts"] == 0
    ended = server.wait(grandchild["id"], {"CANCELED"})
    assert ended["reason"] == f"upstream job {child['id']} CANCELED"
    refused = server.cli("submit", str(root / "job.yaml"), "--after", str(failing["id"]))
    assert refused.returncode != 0
    assert f"job {failing['id']} is FAILED: it can no longer complete" in refused.stderr


def test_a_flow_survives_a_server_killed_mid_flow(tmp_path: Path) -> None:
    """SIGKILL while the first step runs and the second waits: the new server re-adopts the
    first, holds the second until it completes, and runs each exactly once."""
    home = tmp_path / "home"
    gate = tmp_path / "go"
    root = _files(
        tmp_path / "flow",
        {
            "train.py": GATED,
            "a.yaml": f"name: a\nentrypoint: python train.py\nhparams: {{release: '{gate}'}}\n"
            "resources: {procs_per_node: 1}\n",
            "b.yaml": "name: b\nentrypoint: python train.py\nresources: {procs_per_node: 1}\n",
            "flow.yaml": "name: survive\njobs:\n  a: {spec: a.yaml}\n"
            "  b: {spec: b.yaml, after: [a]}\n",
        },
    )
    server = start_server(home, "--cpus", "2")
    try:
        made = server.cli_json("submit", str(root / "flow.yaml"), "--detach")
        jobs = made["jobs"]
        server.wait(jobs["a"], {"RUNNING"})
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        server = start_server(home, "--cpus", "2", port=server.port)
        assert server.cli_json("show", str(jobs["b"]))["state"] == "QUEUED"
        gate.touch()
        final = server.wait(jobs["b"], {"COMPLETED", "FAILED", "CANCELED"})
        assert final["state"] == "COMPLETED" and final["attempts"] == 1
        first = server.cli_json("show", str(jobs["a"]))
        assert first["state"] == "COMPLETED" and first["attempts"] == 1
        assert server.cli_json("flows", "show", str(made["flow"]))["state"] == "COMPLETED"
        assert [j["id"] for j in server.cli_json("ps", "--all")] == sorted(
            jobs.values(), reverse=True
        )
    finally:
        assert_clean_stop(server)
