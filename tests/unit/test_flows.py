"""Jobs that wait for jobs, flows and promotion: the pure rules (what a waiting job's upstreams
mean, the order of a flow's steps, a promotion's comparison), the flow file's checks with the
line of each error, and the scheduler holding, releasing and ending dependents in the app in
process (a fake executor whose attempts run until the test ends them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import (
    app_client,
    error_of,
    services,
    submit,
    wait_launched,
    wait_state,
    workdir,
)
from tests.support.fakes import FakeExecutor
from trainhouse.core.errors import FlowError, SpecError
from trainhouse.core.flows import Upstream, compare, order, parse_input_ref, verdict
from trainhouse.core.lifecycle import StopReason
from trainhouse.core.spec import parse_spec
from trainhouse.core.spec.flowfile import is_flow, load_flow, parse_flow

SPEC = "name: {name}\nentrypoint: python train.py\nresources: {{procs_per_node: 1}}\n"


# -- the pure rules ---------------------------------------------------------------------------
def test_a_waiting_job_is_ready_waiting_or_doomed_by_its_upstreams() -> None:
    assert verdict([Upstream(3, "completed", "COMPLETED")]).ready
    waiting = verdict([Upstream(3, "completed", "RUNNING"), Upstream(4, "completed", "QUEUED")])
    assert not waiting.ready and not waiting.doomed
    assert waiting.reason == "waiting for job 3 to complete (it is RUNNING) (and 1 more)"
    failed = verdict([Upstream(3, "completed", "COMPLETED"), Upstream(4, "completed", "FAILED")])
    assert failed.doomed and failed.reason == "upstream job 4 FAILED"
    assert verdict([Upstream(4, "completed", "CANCELED")]).reason == "upstream job 4 CANCELED"
    # any end satisfies "ended"; a deleted upstream dooms either way
    assert verdict([Upstream(4, "ended", "FAILED")]).ready
    assert verdict([Upstream(4, "ended", "RUNNING")]).reason.startswith("waiting for job 4 to end")
    gone = verdict([Upstream(4, "ended", None)])
    assert gone.doomed and gone.reason == "upstream job 4 was deleted"


def test_steps_are_ordered_upstreams_first_and_a_cycle_is_named() -> None:
    assert order({"eval": ["train"], "train": [], "promote": ["eval", "train"]}) == [
        "train",
        "eval",
        "promote",
    ]
    with pytest.raises(FlowError, match="cycle: a -> b -> c -> a"):
        order({"a": ["b"], "b": ["c"], "c": ["a"]})
    with pytest.raises(FlowError, match="waits for itself"):
        order({"a": ["a"]})
    with pytest.raises(FlowError, match="'x', which is not a step"):
        order({"a": ["x"]})


def test_a_promotion_compares_by_mode_and_says_both_values() -> None:
    args: dict[str, Any] = {"alias": "champion", "metric": "val_acc", "candidate": 3}
    first = compare(**args, mode="max", value=0.9, holder=None, held_value=None)
    assert (
        first.promoted and first.text == "promoted v3 to champion: val_acc 0.9 (no version held it)"
    )
    better = compare(**args, mode="max", value=0.95, holder=1, held_value=0.91)
    assert better.promoted and better.text == "promoted v3 to champion: val_acc 0.95 > 0.91 (v1)"
    worse = compare(**args, mode="max", value=0.5, holder=1, held_value=0.91)
    assert not worse.promoted and worse.text == "kept v1 as champion: val_acc 0.5 (v3) <= 0.91"
    lower = compare(**args, mode="min", value=0.2, holder=1, held_value=0.3)
    assert lower.promoted and "0.2 < 0.3" in lower.text
    tie = compare(**args, mode="min", value=0.3, holder=1, held_value=0.3)
    assert not tie.promoted and "0.3 (v3) >= 0.3" in tie.text
    # a value missing on either side is a refusal, said as such
    assert not compare(**args, mode="max", value=None, holder=1, held_value=0.9).promoted
    assert not compare(
        **args, mode="max", value=float("nan"), holder=None, held_value=None
    ).promoted
    unknown = compare(**args, mode="max", value=0.9, holder=1, held_value=None)
    assert not unknown.promoted and "v1 has no value of val_acc" in unknown.text


def test_input_references() -> None:
    assert parse_input_ref("job:31") == (31, None, None)
    assert parse_input_ref("digits-cnn@champion") == (None, "digits-cnn", "champion")
    assert parse_input_ref("digits-cnn") == (None, "digits-cnn", "latest")
    for bad in ("job:", "job:-1", "../x", "a@b@c", "", "job:99999999999999999999"):
        with pytest.raises(FlowError):
            parse_input_ref(bad)


# -- the spec and the flow file ------------------------------------------------------------
def test_the_spec_takes_after_inputs_and_promote() -> None:
    spec = parse_spec(
        "entrypoint: python t.py\nafter: [3, {job: 4, when: ended}]\n"
        "inputs: {candidate: job:3, base: digits@champion}\n"
        "promote: {alias: champion, metric: val_acc, input: candidate}\n"
    )
    assert [(a.job, a.when) for a in spec.after] == [(3, "completed"), (4, "ended")]
    assert spec.inputs == {"candidate": "job:3", "base": "digits@champion"}
    assert spec.promote is not None and spec.promote.mode == "max"
    for text, said in (
        ("after: [3, 3]", "job 3 is named twice"),
        ("after: [{job: 3, when: soon}]", "when"),
        ("inputs: {Bad: job:3}", "input key 'Bad'"),
        ("inputs: {x: ../etc}", "must be job:ID"),
        ("promote: {alias: latest, metric: x}", "names a version"),
        ("promote: {alias: a, metric: x, model: m, input: k}", "not both"),
    ):
        with pytest.raises(SpecError, match=said):
            parse_spec(f"entrypoint: python t.py\n{text}\n")


def _flow_dir(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.yaml").write_text(SPEC.format(name="train"))
    (tmp_path / "eval.yaml").write_text(SPEC.format(name="eval"))
    (tmp_path / "flow.yaml").write_text(text)
    return tmp_path / "flow.yaml"


def test_a_flow_file_is_read_with_its_overrides(tmp_path: Path) -> None:
    path = _flow_dir(
        tmp_path,
        "name: release\njobs:\n"
        "  evaluate: {spec: eval.yaml, inputs: {candidate: train, base: m@champion}}\n"
        "  train: {spec: train.yaml, set: {hparams.epochs: 20, name: t}}\n",
    )
    assert is_flow(path.read_text()) and not is_flow(SPEC.format(name="x"))
    flow = load_flow(path, ["train.hparams.lr=0.1"])
    assert flow.name == "release" and list(flow.steps) == ["train", "evaluate"]
    assert flow.steps["train"].overrides == ["hparams.epochs=20", 'name="t"', "hparams.lr=0.1"]
    evaluate = flow.steps["evaluate"]
    assert evaluate.after == ("train",)  # reading a step's model waits for it
    assert evaluate.step_inputs() == {"candidate": "train"}
    assert flow.path_of(evaluate) == (tmp_path / "eval.yaml").resolve()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "jobs:\n  a: {spec: train.yaml, after: [b]}\n",
            "flow.yaml:2: jobs.a.after.0: 'b' is not a step",
        ),
        (
            "jobs:\n  a: {spec: train.yaml, after: [b]}\n  b: {spec: eval.yaml, after: [a]}\n",
            "cycle: a -> b -> a",
        ),
        (
            "jobs:\n  a:\n    spec: train.yaml\n    bogus: 1\n",
            "flow.yaml:4: jobs.a.bogus: unknown key",
        ),
        (
            "jobs:\n  a: {spec: nothere.yaml}\n",
            "flow.yaml:2: jobs.a.spec: nothere.yaml does not exist",
        ),
        ("jobs:\n  a: {spec: train.yaml, inputs: {k: ../x}}\n", "jobs.a.inputs.k"),
        ("jobs:\n  a: {spec: train.yaml}\n  a: {spec: eval.yaml}\n", "key 'a' is given twice"),
        ("name: x\n", "jobs: must map step names"),
        ("jobs: [1, 2]\n", "jobs: must map step names"),
        ("jobs:\n  '1a': {spec: train.yaml}\n", "step name '1a'"),
    ],
)
def test_a_bad_flow_file_is_refused_with_the_line_and_field(
    tmp_path: Path, text: str, said: str
) -> None:
    with pytest.raises(FlowError) as err:
        load_flow(_flow_dir(tmp_path, text))
    assert said in str(err.value)


def test_a_flow_override_names_a_step(tmp_path: Path) -> None:
    path = _flow_dir(tmp_path, "jobs:\n  train: {spec: train.yaml}\n")
    with pytest.raises(FlowError, match="no step 'eval'"):
        load_flow(path, ["eval.hparams.lr=1"])
    with pytest.raises(FlowError, match=r"STEP\.FIELD=VALUE"):
        parse_flow(path.read_text(), overrides=["lr=1"])


# -- the scheduler holding, releasing and ending dependents --------------------------------
def _fake(api: TestClient) -> FakeExecutor:
    fake = services(api).scheduler.executor
    assert isinstance(fake, FakeExecutor)
    return fake


def _job(api: TestClient, job_id: int) -> Any:
    return api.get(f"/api/v1/jobs/{job_id}").json()


def _until(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_job_waits_for_its_upstreams_and_ends_with_a_failed_one(tmp_path: Path) -> None:
    with app_client(tmp_path, exit_code=None, cpus=8) as api:
        code = workdir(tmp_path)
        a = submit(api, SPEC.format(name="a"), code).json()
        b = submit(api, SPEC.format(name="b") + f"after: [{a['id']}]\n", code).json()
        c = submit(api, SPEC.format(name="c") + f"after: [{b['id']}]\n", code).json()
        d = submit(api, SPEC.format(name="d") + f"after: [{{job: {a['id']}, when: ended}}]\n", code)
        d = d.json()
        wait_launched(api, a["id"])
        # held with the reason, live and stored, while the upstream runs
        held = _until(
            lambda: "waiting for job" in (_job(api, b["id"])["reason"] or "") and _job(api, b["id"])
        )
        assert held["state"] == "QUEUED"
        assert held["reason"] == f"waiting for job {a['id']} to complete (it is RUNNING)"
        assert _job(api, c["id"])["reason"].startswith(f"waiting for job {b['id']} to complete")
        shown = _job(api, b["id"])
        assert shown["after"] == [{"job_id": a["id"], "when": "completed", "state": "RUNNING"}]
        # the queue lists it, last, with the same reason
        queue = [(j["id"], j["reason"]) for j in api.get("/api/v1/queue").json()["jobs"]]
        assert (b["id"], f"waiting for job {a['id']} to complete (it is RUNNING)") in queue
        assert a["id"] in _fake(api).live and b["id"] not in _fake(api).live
        # the upstream fails: its dependents end CANCELED, the next generation too, in one tick;
        # a dependent that waits for any end runs
        _fake(api).end(a["id"], 1)
        ended_b = wait_state(api, b["id"], {"CANCELED"})
        assert ended_b["reason"] == f"upstream job {a['id']} FAILED"
        ended_c = wait_state(api, c["id"], {"CANCELED"})
        assert ended_c["reason"] == f"upstream job {b['id']} CANCELED"
        # resuming a dependent alone cannot help: it says which job to resume first
        again = api.post(f"/api/v1/jobs/{c['id']}/resume")
        assert again.status_code == 409
        said = error_of(again)["message"]
        assert f"upstream job {b['id']} CANCELED): resume that one first" in said
        wait_launched(api, d["id"])
        _fake(api).end(d["id"], 0)
        assert wait_state(api, d["id"], {"COMPLETED"})["attempts"] == 1
        # no attempt ever started for the ended dependents
        assert _job(api, b["id"])["attempts"] == 0 and _job(api, c["id"])["attempts"] == 0


def test_after_is_refused_for_a_job_that_cannot_complete_or_does_not_exist(
    tmp_path: Path,
) -> None:
    with app_client(tmp_path, exit_code=1) as api:  # every attempt fails
        code = workdir(tmp_path)
        a = submit(api, SPEC.format(name="a"), code).json()
        wait_state(api, a["id"], {"FAILED"})
        refused = submit(api, SPEC.format(name="b") + f"after: [{a['id']}]\n", code)
        assert refused.status_code == 422
        assert (
            f"after: job {a['id']} is FAILED: it can no longer complete"
            in error_of(refused)["message"]
        )
        # waiting for any end is fine: it has ended
        ok = submit(
            api, SPEC.format(name="c") + f"after: [{{job: {a['id']}, when: ended}}]\n", code
        )
        assert ok.status_code == 201, ok.text
        missing = submit(api, SPEC.format(name="d") + "after: [999]\n", code)
        assert (
            missing.status_code == 404 and "job 999 does not exist" in error_of(missing)["message"]
        )
        no_input = submit(api, SPEC.format(name="e") + "inputs: {x: job:999}\n", code)
        assert no_input.status_code == 404
        promote = submit(
            api, SPEC.format(name="f") + "promote: {alias: champion, metric: acc, input: x}\n", code
        )
        assert promote.status_code == 422
        assert "promote.input 'x' is not one of the job's inputs" in error_of(promote)["message"]


def _submit_flow(api: TestClient, tmp_path: Path, flow: dict[str, Any], specs: list[str]) -> Any:
    return api.post(
        "/api/v1/flows",
        data={"flow": json.dumps(flow), "spec": specs, "owner": "tester"},
        files=[("workdir", ("w.tar.gz", workdir(tmp_path), "application/gzip"))],
    )


def test_a_flow_is_submitted_whole_runs_in_order_and_resumes_what_did_not_complete(
    tmp_path: Path,
) -> None:
    with app_client(tmp_path, exit_code=None, cpus=8) as api:
        steps = [
            {"name": "prep"},
            {"name": "train", "after": ["prep"]},
            {"name": "evaluate", "after": ["train"]},
        ]
        specs = [SPEC.format(name=s["name"]) for s in steps]
        made = _submit_flow(api, tmp_path, {"name": "release", "steps": steps}, specs)
        assert made.status_code == 201, made.text
        flow = made.json()
        jobs = flow["jobs"]
        assert list(jobs) == ["prep", "train", "evaluate"] and flow["state"] in (
            "QUEUED",
            "RUNNING",
        )
        assert _job(api, jobs["train"])["flow_id"] == flow["id"]
        assert _job(api, jobs["train"])["flow_step"] == "train"
        wait_launched(api, jobs["prep"])
        _fake(api).end(jobs["prep"], 0)
        wait_launched(api, jobs["train"])
        _fake(api).end(jobs["train"], 1)
        wait_state(api, jobs["evaluate"], {"CANCELED"})
        shown = api.get(f"/api/v1/flows/{flow['id']}").json()
        assert shown["state"] == "FAILED"
        assert [(s["name"], s["state"]) for s in shown["steps"]] == [
            ("prep", "COMPLETED"),
            ("train", "FAILED"),
            ("evaluate", "CANCELED"),
        ]
        assert shown["steps"][2]["reason"] == f"upstream job {jobs['train']} FAILED"
        listed = api.get("/api/v1/flows").json()
        assert listed["total"] == 1 and listed["flows"][0]["id"] == flow["id"]

        # resume: the failed and the canceled steps run again, the completed one does not;
        # with auth off each says the local user the client named resumed it
        resumed = api.post(f"/api/v1/flows/{flow['id']}/resume", json={"by": "carol"})
        assert resumed.status_code == 200, resumed.text
        for step in ("train", "evaluate"):
            events = _job(api, jobs[step])["events"]
            (back,) = [e for e in events if e["from_state"] in ("FAILED", "CANCELED")]
            assert back["to_state"] == "QUEUED" and back["reason"].startswith("resumed by carol ")
        wait_launched(api, jobs["train"])
        _fake(api).end(jobs["train"], 0)
        wait_launched(api, jobs["evaluate"])
        _fake(api).end(jobs["evaluate"], 0)
        wait_state(api, jobs["evaluate"], {"COMPLETED"})
        done = api.get(f"/api/v1/flows/{flow['id']}").json()
        assert done["state"] == "COMPLETED"
        assert _job(api, jobs["prep"])["attempts"] == 1  # never run twice
        again = api.post(f"/api/v1/flows/{flow['id']}/resume")
        assert again.status_code == 409 and "nothing to resume" in error_of(again)["message"]


def test_a_flow_is_canceled_whole(tmp_path: Path) -> None:
    with app_client(tmp_path, exit_code=None, cpus=8) as api:
        steps = [{"name": "a"}, {"name": "b", "after": ["a"]}]
        flow = _submit_flow(
            api,
            tmp_path,
            {"name": "f", "steps": steps},
            [SPEC.format(name="a"), SPEC.format(name="b")],
        ).json()
        wait_launched(api, flow["jobs"]["a"])
        canceled = api.post(f"/api/v1/flows/{flow['id']}/cancel")
        assert canceled.status_code == 200, canceled.text
        wait_state(api, flow["jobs"]["b"], {"CANCELED"})  # queued: ended at once
        assert ("a", "RUNNING") in [(s["name"], s["state"]) for s in canceled.json()["steps"]]
        _until(lambda: (flow["jobs"]["a"], StopReason.CANCEL) in _fake(api).stops)
        _fake(api).end(flow["jobs"]["a"], -15)  # it stops as told
        wait_state(api, flow["jobs"]["a"], {"CANCELED"})
        assert api.get(f"/api/v1/flows/{flow['id']}").json()["state"] == "CANCELED"


@pytest.mark.parametrize(
    ("flow", "specs", "status", "said"),
    [
        (
            {"name": "f", "steps": [{"name": "a", "after": ["b"]}]},
            1,
            422,
            "'b', which is not a step",
        ),
        (
            {"name": "f", "steps": [{"name": "a", "after": ["b"]}, {"name": "b", "after": ["a"]}]},
            2,
            422,
            "cycle",
        ),
        ({"name": "f", "steps": [{"name": "a"}]}, 2, 422, "1 steps but 2 specs"),
        (
            {"name": "f", "steps": [{"name": "a", "archive": 3}]},
            1,
            422,
            "archive 3 was not uploaded",
        ),
        ({"name": "f", "steps": [{"name": "a"}, {"name": "a"}]}, 2, 422, "given twice"),
        ({"name": "f", "steps": [{"name": "a", "inputs": {"k": "zz"}}]}, 1, 422, "not a step"),
        ({"name": "f", "steps": [{"name": "a", "sneaky": 1}]}, 1, 422, "flow: steps.0.sneaky"),
        ({"name": "f", "steps": []}, 1, 422, "flow: steps"),
    ],
)
def test_a_bad_flow_makes_no_job(
    tmp_path: Path, flow: dict[str, Any], specs: int, status: int, said: str
) -> None:
    with app_client(tmp_path) as api:
        resp = _submit_flow(api, tmp_path, flow, [SPEC.format(name="x")] * specs)
        assert resp.status_code == status, resp.text
        assert said in error_of(resp)["message"]
        assert api.get("/api/v1/jobs?all=true").json()["total"] == 0
        assert api.get("/api/v1/flows").json()["total"] == 0


def test_a_step_that_fails_its_checks_makes_no_job_of_the_others(tmp_path: Path) -> None:
    with app_client(tmp_path) as api:
        steps = [{"name": "a"}, {"name": "b", "after": ["a"]}]
        resp = _submit_flow(
            api,
            tmp_path,
            {"name": "f", "steps": steps},
            [SPEC.format(name="a"), "entrypoint: 1: 2"],
        )
        assert resp.status_code == 422 and "step b" in error_of(resp)["message"]
        assert api.get("/api/v1/jobs?all=true").json()["total"] == 0


def test_a_promotion_by_a_metric_the_alias_holder_lacks_is_refused_at_submit(
    tmp_path: Path,
) -> None:
    with app_client(tmp_path) as api:
        rt = services(api)
        code = workdir(tmp_path)
        job = submit(api, SPEC.format(name="train"), code).json()["id"]
        rt.store.models.add_version(
            "m",
            owner="tester",
            job_id=job,
            attempt=1,
            step=0,
            path="models/m/step-000000000",
            kind="export",
            files=[{"name": "model.json", "size": 5, "sha256": "a" * 64}],
            metrics={"val_loss": 0.3},
        )
        rt.store.models.set_alias("m", "champion", 1)
        refused = submit(
            api,
            SPEC.format(name="next") + "promote: {alias: champion, metric: f1, model: m}\n",
            code,
        )
        assert refused.status_code == 422
        said = error_of(refused)["message"]
        assert "m@champion is v1, which has no value of f1 to compare with" in said
        assert "(its metrics: val_loss)" in said
        # by a metric it has, or an alias nothing holds yet: accepted
        for promote in (
            "{alias: champion, metric: val_loss, mode: min, model: m}",
            "{alias: prod, metric: f1, model: m}",
        ):
            ok = submit(api, SPEC.format(name="ok") + f"promote: {promote}\n", code)
            assert ok.status_code == 201, ok.text
        # through an input that names the version: the same check
        via_input = submit(
            api,
            SPEC.format(name="eval")
            + "inputs: {candidate: m@1}\n"
            + "promote: {alias: champion, metric: f1, input: candidate}\n",
            code,
        )
        assert via_input.status_code == 422
