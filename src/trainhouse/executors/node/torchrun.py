"""The process tree of one node of an attempt, built once for every executor.

::

    python -m trainhouse.executors.node.supervise [--cgroup DIR] EXIT_FILE   torchrun's exit code
      python -m trainhouse.executors.node.launch torch.distributed.run ...   torchrun for this node
        python -I -S .../executors/node/rank.py ARGV...         one per rank: log file, exit code
          ARGV (the job's entrypoint)

:func:`command` builds that command line (a standalone rendezvous for one node, a static one at
node 0's address for several); :func:`spec_environment` the variables the spec gives every rank,
and :func:`rank_environment` the whole environment of a node's processes: the agent's own, the
spec's, trainhouse's (:class:`~trainhouse.jobfs.layout.JobEnv`, with the node's directories) and the
node's marker and GPUs. The local executor and the Ray
node agent both start attempts through this module.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainhouse.core.datasets import STAGE_VAR, StageRequest
from trainhouse.core.envspec import ENV_VAR, Request
from trainhouse.core.spec import JobSpec
from trainhouse.executors.node import rank
from trainhouse.jobfs.layout import (
    MARKER_ENV,
    NODE_ADDRESS_ENV,
    AttemptLayout,
    JobEnv,
    is_job_variable,
)

__all__ = ["command", "rank_environment", "spec_environment"]

#: how the supervisor starts torchrun: ``python -m torch.distributed.run`` that skips the last
#: garbage collections of torch's objects at exit (:mod:`trainhouse.executors.node.launch`)
LAUNCH = (sys.executable, "-m", "trainhouse.executors.node.launch")
#: the rank wrapper as torchrun starts it (``--no-python``): a file of the standard library only,
#: without ``site`` (:mod:`trainhouse.executors.node.rank`)
RANK_WRAPPER = (sys.executable, "-I", "-S", str(Path(rank.__file__).resolve()))
MONITOR_INTERVAL = "0.1"  # seconds between torchrun's checks of its ranks (its default)


def command(
    exit_file: Path,
    argv: Sequence[str],
    *,
    procs: int,
    nodes: int = 1,
    node_rank: int = 0,
    master: tuple[str, int] | None = None,
    cgroup: Path | None = None,
) -> list[str]:
    """The supervised torchrun command of one node running ``argv`` in each of ``procs`` ranks.

    One node rendezvouses standalone; several need ``master`` (node 0's address and a free
    port there) for a static rendezvous. torchrun never restarts ranks itself
    (``--max-restarts=0``): trainhouse restarts the whole gang from a checkpoint. ``cgroup``:
    the attempt's cgroup, which the supervisor makes and runs torchrun in.
    """
    if nodes > 1 or master is not None:
        if master is None:
            raise ValueError(f"a job of {nodes} nodes needs node 0's address for its rendezvous")
        addr, port = master
        rendezvous = [
            f"--nnodes={nodes}",
            f"--node-rank={node_rank}",
            f"--nproc-per-node={procs}",
            f"--master-addr={addr}",
            f"--master-port={port}",
        ]
    else:
        rendezvous = ["--standalone", "--nnodes=1", f"--nproc-per-node={procs}"]
    return [
        sys.executable,
        "-m",
        "trainhouse.executors.node.supervise",
        *(["--cgroup", str(cgroup)] if cgroup is not None else []),
        str(exit_file),
        *LAUNCH,
        "torch.distributed.run",
        *rendezvous,
        "--max-restarts=0",
        f"--monitor-interval={MONITOR_INTERVAL}",
        "--no-python",
        *RANK_WRAPPER,
        *argv,
    ]


#: the compilers' cache variables and their directories under a job's cache
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def spec_environment(spec: JobSpec) -> dict[str, str]:
    """What the spec gives every rank on every node: thread and output settings, then its own
    ``env``."""
    return {
        "OMP_NUM_THREADS": str(spec.resources.cpus_per_proc),
        "PYTHONUNBUFFERED": "1",
        **spec.env,
    }


def rank_environment(
    base: Mapping[str, str],
    spec_env: Mapping[str, str],
    job: JobEnv,
    *,
    marker: str,
    gpus: Sequence[str],
    log_dir: Path,
    attempt: AttemptLayout,
    cache: Path,
    drop_prefixes: tuple[str, ...] = (),
    pci_order: bool = True,
    environment: Request | None = None,
    datasets: StageRequest | None = None,
    node_address: str | None = None,
) -> dict[str, str]:
    """The environment of a node's processes: ``base`` (the environment of whoever starts
    them) without variables trainhouse or torchrun set for ranks (nor those starting with
    ``drop_prefixes``), then the spec's (:func:`spec_environment`), then trainhouse's with this
    node's log and attempt directories (which a spec can never override), then the node's
    own: the attempt's marker, its GPUs, and a TMPDIR of the attempt's, removed when it
    ends.

    ``gpus`` name the node's GPUs as ``CUDA_VISIBLE_DEVICES`` takes them (UUIDs where NVML gave
    them); with ``pci_order`` CUDA numbers them in PCI bus order as NVML does
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, not CUDA's fastest first), so an index means the same
    GPU to the job, to NVML and to trainhouse. The compilers' caches (Inductor's, Triton's) go
    to ``cache``, which outlives the attempt: a restarted ``torch.compile`` job does not
    compile again from scratch (unless the spec or the node chose caches of its own).

    ``environment`` (the node's cache filled in): the job's environment, which the supervisor
    sets up before torchrun starts (and does not pass on); ``datasets`` likewise (the node's
    cache filled in): the versions it stages, then gives each rank as
    ``TRAINHOUSE_DATASET_<KEY>``. ``node_address``: where other machines reach this node (a
    service's replica listens there), as ``TRAINHOUSE_NODE_ADDRESS``."""
    env = {
        k: v
        for k, v in base.items()
        if not is_job_variable(k) and not (drop_prefixes and k.startswith(drop_prefixes))
    }
    env.update(spec_env)
    env.update(job.on_node(log_dir, attempt.dir).to_env())
    # a spec that points MLflow elsewhere (its own tracking server) keeps its choice
    env.update({k: v for k, v in spec_env.items() if k.startswith("MLFLOW_")})
    env.update(
        {
            MARKER_ENV: marker,
            "CUDA_VISIBLE_DEVICES": ",".join(gpus),
            "TMPDIR": str(attempt.tmp),
        }
    )
    if pci_order:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    for variable, sub in COMPILE_CACHES.items():
        env.setdefault(variable, str(cache / sub))
    if environment is not None:
        env[ENV_VAR] = environment.to_json()
    if datasets is not None:
        env[STAGE_VAR] = datasets.to_json()
    if node_address:
        env[NODE_ADDRESS_ENV] = node_address
    return env
