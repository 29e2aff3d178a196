"""A real ``trainhouse server`` subprocess on a free port in a temp home, and CLI helpers.

Every test that starts a server runs twice, on each database backend (ids ``[sqlite]`` and
``[postgresql]``): with the embedded SQLite in the server's home, and with a fresh database on
the real PostgreSQL (one per server home, so a restarted server finds its state), upgraded by
``trainhouse db upgrade`` as an operator would and dropped after the test, pass or fail.
``SINGLE_BACKEND`` lists the tests that run on one backend only, and why; a test that asks
for the ``backend`` fixture by name runs on both too.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterator

import pytest

from tests.support.servers import (
    Databases,
    use_databases,
)

# TRAINHOUSE_TEST_BACKENDS=sqlite runs the server tests on one backend only (a quick local run)
BACKENDS = tuple(os.environ.get("TRAINHOUSE_TEST_BACKENDS", "sqlite,postgresql").split(","))

# tests that start servers but run on one backend only (nodeid suffix: why)
SINGLE_BACKEND = {
    "test_ray.py": "Ray: a module-wide cluster and server; the executor, not the store, is "
    "under test, and each test costs tens of seconds",
    "test_integrations_ray.py": "Ray: a module-wide cluster and server; the frameworks' resume "
    "on two nodes, not the store, is under test (each test costs a minute and more)",
    "test_ray_elastic.py": "Ray: a module-wide cluster whose nodes join and leave under an "
    "elastic job; the executor and the policy, not the store, are under test (the store's side "
    "of resizes runs on both backends in test_elastic.py)",
    "test_recovery.py::test_demo_runs_end_to_end_and_keeps_its_server": "the demo is the "
    "embedded SQLite quick start",
    "test_chaos.py": "random SIGKILLs of ranks, launchers and the server: the processes are under "
    "test; the store's side of a killed server (re-adoption, lost attempts, spooled metrics) "
    "runs on both backends in test_recovery.py, and chaos is the suite's most expensive test",
    "test_training.py::test_postgres_backed_server": "picks its own PostgreSQL database",
    "test_postgres.py::test_a_server_refuses_an_unmigrated": "an unmigrated PostgreSQL database",
    "test_faults.py::test_a_killed_rank_resumes_bit_identically": "a rank SIGKILLed mid-run: "
    "the processes, the RNG and sampler states and the weights are under test; the store's side "
    "of a killed rank (its attempt's end, the restart from the checkpoint, every step stored "
    "once) runs on both backends in test_training.py and test_recovery.py",
    "test_faults.py::test_the_same_error_twice_is_not_restarted_again": "real ranks failing "
    "alike and otherwise: the failure analysis and the loop's decision are under test; the "
    "attempts' rows (log tails, results) are stored and read back on both backends in "
    "test_training.py",
    "test_integrations.py": "the Hugging Face Trainer and Lightning jobs: the integrations "
    "(their callbacks, checkpoint copies and resume) are under test, not the store, whose side "
    "of a killed rank and a resume runs on both backends in test_training.py",
    "test_bring_your_own.py": "the mlflow client, TensorBoard's event files and bare torchrun "
    "scripts are under test; the store's side of MLflow (migration 0010, tracked runs, params, "
    "tags, experiments) runs on both backends in tests/unit/test_tracking_store.py",
    "test_artifacts.py": "a real job's run.log_artifact, the mlflow client and the CLI are "
    "under test, one server for the module; the store's side (an experiment naming the "
    "project) runs in tests/unit/test_artifacts.py",
    "test_envs.py": "job environments: the processes and the cache on disk are under test, not "
    "the store",
    "test_search.py": "real trial processes, each search tens of seconds: the ASHA search "
    "killed twice runs on PostgreSQL (Optuna's own schema in the server's database; it picks its "
    "own database), the preempted trial on SQLite (Optuna's own file beside the server's); both "
    "stores' sides of a search run on both backends in tests/unit/test_search_*.py",
    "test_lineage.py": "real ranks resuming and cloning through the CLI; the store's side of "
    "a resume and a clone (the transition, the counters, the hold, the copy's registration) "
    "runs on both backends in tests/unit/test_lineage.py",
    "test_model_registry.py": "the SDK's save and the job's registration through real ranks "
    "are under test; the registry's store runs on both backends in "
    "tests/unit/test_model_registry_store.py",
    "test_runs.py": "a rank's SDK reporting its hparams and the CLI are under test; the store's "
    "side (series summaries, filters and sorts, hparams rows) runs on both backends in "
    "tests/unit/test_runs_store.py",
    "test_services.py": "a served model's replicas (real torch processes) and the server's "
    "forwarding are under test, one server for the module; the services table's store side "
    "runs on both backends in tests/unit/test_services_api.py",
    "test_datasets.py": "staging (the supervisor, the node's cache, S3 over moto) is under test, "
    "one server for the module; the datasets' store side (numbers, pins, removal while pinned) "
    "runs on both backends in tests/unit/test_datasets_store.py",
    "test_flows.py::test_train_evaluate_promote_as_one_flow": "the digits example trained and "
    "evaluated by real ranks (staging, loading, the CLI's follower) is under test; the store's "
    "side of dependencies, flows and promotions runs on both backends in the module's other "
    "tests and in tests/unit/test_flows_store.py",
    "test_flows.py::test_promotion_moves_the_alias_only_to_a_better_version": "four jobs that "
    "save a model through the SDK (torch.export each); the store's side of a promotion (decided "
    "once, the model locked against a concurrent alias move, decided at start-up) runs on both "
    "backends in tests/unit/test_flows_store.py",
    "test_autoscaler.py": "Ray's autoscaler (the fake multi-node provider) launching and "
    "ending nodes for a queued job is under test, one autoscaling cluster for the module; the "
    "store's side of a waiting reason is the scheduler's on both backends elsewhere",
    "test_faults.py::test_a_missing_module_fails_at_once_and_show_says_why": "the failure "
    "analysis of a real rank's import error and the CLI's account of it are under test; the "
    "attempts' rows (log tails, failed rank, reason) are stored and read back on both backends "
    "in test_training.py and by the NUL-bytes test of this module",
    "test_faults.py::test_the_digits_example_refuses_a_bad_hparam_in_one_attempt": "the "
    "example's own hparam check and no_restart_on are under test; the store's side of a failed "
    "attempt runs on both backends in test_training.py",
    "test_hostile_jobs.py": "FIFOs a job leaves are read by the server's file code (jobfiles), "
    "never by the store; the store's side of the checkpoints it registers runs on both backends "
    "in tests/unit/test_store.py",
    "test_training.py::test_cancel_leaves_no_process": "the process tree of a canceled job is "
    "under test; the store's side of a cancel runs on both backends in test_cli.py's and "
    "test_recovery.py's other tests",
    "test_recovery.py::test_cancel_kills_a_job_that_ignores_should_stop": "the cancel grace and "
    "the kill of a rank that ignores should_stop() are under test, processes only",
    "test_recovery.py::test_logs_follow_resumes_across_a_server_restart": "the CLI's log "
    "follower across a server restart is under test (the logs are files, not rows); the "
    "store's side of a killed and restarted server runs on both backends in this module",
    "test_cli.py::test_server_refuses_busy_port_and_bad_flags": "the server's command line "
    "(a busy port, a bad flag) is under test; no store is opened",
    "test_cli.py::test_ctrl_c_detaches_without_killing": "the CLI's Ctrl-C and its log follower "
    "are under test; the store's side of a cancel runs on both backends elsewhere in this module",
    "test_cli.py::test_server_restarts_on_the_same_port_at_once": "the listening socket "
    "(TIME-WAIT) is under test, not the store",
    "test_isolation.py": "the processes and files of a server are under test, not its store: "
    "the secret's test picks its own PostgreSQL database, and the SQLite file is among the "
    "files whose modes are checked",
}


# keys of SINGLE_BACKEND to run on both backends all the same, e.g. the chaos test over many
# seeds: TRAINHOUSE_TEST_BOTH_BACKENDS=test_chaos.py TRAINHOUSE_CHAOS_SEEDS=1,2,3 pytest ...
BOTH_ANYWAY = tuple(k for k in os.environ.get("TRAINHOUSE_TEST_BOTH_BACKENDS", "").split(",") if k)


def _single_backend(nodeid: str) -> bool:
    name = nodeid.split("/")[-1]
    if any(name.startswith(key) for key in BOTH_ANYWAY):
        return False
    return any(name.startswith(key) for key in SINGLE_BACKEND)


def _starts_a_server(metafunc: pytest.Metafunc) -> bool:
    if "backend" in inspect.signature(metafunc.function).parameters:
        return True  # asks for the backend itself
    if any(name.endswith("server") and name != "pg_server" for name in metafunc.fixturenames):
        return True
    try:
        source = inspect.getsource(metafunc.function)
    except (OSError, TypeError):
        return False
    return re.search(r"\b(start_server|Server)\(", source) is not None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that starts a server runs on SQLite and on PostgreSQL, but those in
    SINGLE_BACKEND."""
    if "backend" not in metafunc.fixturenames or "pg_url" in metafunc.fixturenames:
        return
    if _starts_a_server(metafunc) and not _single_backend(metafunc.definition.nodeid):
        metafunc.parametrize("backend", BACKENDS, indirect=True, ids=BACKENDS)


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The database backend of the test's servers (SQLite unless parametrized)."""
    name: str = getattr(request, "param", "sqlite")
    if name == "postgresql":
        request.getfixturevalue("pg_server")  # a clear failure when PostgreSQL is not there
    dbs = Databases(name)
    previous = use_databases(dbs)
    try:
        yield name
    finally:
        use_databases(previous)
        dbs.drop()
