"""What the Ray executor knows of one attempt: its nodes (one per bundle), the logs they sent,
how they ended; and the conversions between Ray's view and trainhouse's. Imports no Ray.

The job's directory on the server is opened through :mod:`trainhouse.jobfs.jobfiles` from the
server's home (with ``--shared-home`` the ranks reach it): the executor's own records are read
only as regular files of at most :data:`MAX_STATE` bytes, logs are appended to only as regular
files, and no link is followed."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhouse.core.cluster import Gpu, Node, Placement
from trainhouse.core.errors import RayUnavailable
from trainhouse.executors.base import Exit
from trainhouse.executors.node.stopping import StopTimer
from trainhouse.jobfs import jobfiles
from trainhouse.jobfs.layout import LAUNCHER_LOG, AttemptLayout, JobLayout, log_name, rank_of_log

STANDARD = {"CPU", "GPU", "memory", "object_store_memory"}
RECORD = "ray.json"  # in the attempt's directory: what a restarted server re-attaches to
OFFSETS = "ray-logs.json"  # bytes of each node's logs already appended to the job's logs
MAX_STATE = 64 << 20  # bytes of RECORD or OFFSETS read at most


@dataclass
class Member:
    """One node (bundle) of an attempt; ``index`` is its node rank."""

    index: int
    actor: Any = None
    node_id: str = ""
    boot_id: str = ""
    pending: Any = None  # the outstanding status call
    asked_at: float = 0.0  # when it was made (monotonic)
    offsets: dict[str, int] = field(default_factory=dict)
    ended: tuple[int, float] | None = None  # torchrun's (code, time) once it has ended
    final: dict[str, Any] | None = None  # its last status: ended, every log read
    lost: str | None = None  # why its node or actor is gone
    pids: list[int] = field(default_factory=list)
    pids_at: float = 0.0

    @property
    def done(self) -> bool:
        return self.final is not None or self.lost is not None


@dataclass
class Attempt:
    job_id: int
    number: int
    job: JobLayout
    procs: int  # ranks per node
    members: list[Member]
    bundles: list[dict[str, float]] = field(default_factory=list)
    pg: Any = None
    phase: str = "starting"  # starting | running | unplaced | broken | aborted
    problem: str | None = None  # why it is unplaced or could not start
    stopping: StopTimer = field(default_factory=StopTimer)
    signals: list[Any] = field(default_factory=list)  # fire-and-forget calls to consume
    starter: threading.Thread | None = None
    abort: threading.Event = field(default_factory=threading.Event)

    @property
    def layout(self) -> AttemptLayout:
        return self.job.attempt(self.number)

    @property
    def logs(self) -> Path:
        return self.job.logs

    def ranks(self, m: Member) -> list[int]:
        """The global ranks of a node."""
        return [m.index * self.procs + r for r in range(self.procs)]

    # -- what the nodes report ---------------------------------------------------------------
    def absorb(self, m: Member, status: dict[str, Any]) -> str | None:
        """Take in a node's status: append what its logs grew by to the job's logs, keep its
        processes, and once it has ended, its result and spooled metrics. Returns why the
        other nodes must stop (this node's torchrun failed), or None."""
        prefix = f"[node {m.index}] ".encode() if len(self.members) > 1 else b""
        moved = False
        for name, (offset, data) in status["logs"].items():
            if name != LAUNCHER_LOG and rank_of_log(name) is None:
                continue  # not a log's name: nothing else is written
            have = m.offsets.get(name, 0)
            end = offset + len(data)
            if end <= have:
                continue  # already appended (a status answered twice)
            data = data[have - offset :] if offset < have else data
            if name == LAUNCHER_LOG and prefix:
                data = b"".join(prefix + line for line in data.splitlines(keepends=True))
            with jobfiles.open_append(self.job.home, self.logs / name) as fh:
                fh.write(data)
            m.offsets[name] = end
            moved = True
        if moved:
            self.save_offsets()
        if "pids" in status:
            m.pids = list(status["pids"])
        failed = None
        if status["ended"] and m.ended is None:
            code, at = status["launcher"]
            m.ended = (int(code), float(at or time.time()))
            if m.ended[0] != 0:
                failed = f"node {m.index}'s torchrun {describe(m.ended[0])}"
        if status["complete"]:
            spool = self.layout.spool
            for name, data in status.get("spool", {}).items():
                if "/" in name or name.startswith(".") or not name.endswith(".json"):
                    continue  # not a spooled batch's name
                spool.mkdir(parents=True, exist_ok=True)
                jobfiles.write_file(self.job.home, spool / name, data)
            m.final = status
            m.pids = []
        return failed

    def result(self) -> Exit:
        """The attempt's exit, once every node has ended or is lost. A lost node's ranks are
        recorded as killed (SIGKILL) just before the first rank that did end: the others ended
        because of it, and it is the failure that counts (the infrastructure's)."""
        codes: dict[str, int] = {}
        times: dict[str, float] = {}
        for m in self.members:
            for rank, (code, at) in (m.final or {}).get("ranks", {}).items():
                codes[rank] = int(code)
                if at is not None:
                    times[rank] = float(at)
        for m in self.members:
            if m.final is not None and m.ended is not None and m.ended[0] < 0:
                # torchrun was killed: its ranks, killed with it, could not record anything
                for rank in self.ranks(m):
                    if str(rank) not in codes:
                        codes[str(rank)], times[str(rank)] = m.ended
        ended = [m.ended for m in self.members if m.ended is not None]
        lost = [m for m in self.members if m.lost is not None]
        if lost:
            first = min([*times.values(), *(at for _, at in ended)], default=time.time()) - 1e-3
            for m in lost:
                ranks = self.ranks(m)
                for rank in ranks:
                    codes[str(rank)] = -int(signal.SIGKILL)
                    times[str(rank)] = first
                note = f"trainhouse: node {m.index} of attempt {self.number} was lost: {m.lost}\n"
                for name in [LAUNCHER_LOG, *(log_name(r) for r in ranks)]:
                    with (
                        contextlib.suppress(OSError),
                        jobfiles.open_append(self.job.home, self.logs / name) as fh,
                    ):
                        fh.write(note.encode())
            exit_code = -int(signal.SIGKILL)
        else:
            failed = sorted((at, code) for code, at in ended if code != 0)
            exit_code = failed[0][1] if failed else 0
        return Exit(self.job_id, self.number, exit_code, codes, self.stopping.reason, times)

    # -- what a restarted server needs -------------------------------------------------------
    def save_record(self) -> None:
        record = {
            "procs": self.procs,
            "bundles": self.bundles,
            "nodes": [{"node_id": m.node_id, "boot_id": m.boot_id} for m in self.members],
        }
        write_json(self.layout.dir / RECORD, record, within=self.job.home)

    def save_offsets(self) -> None:
        offsets = {str(m.index): m.offsets for m in self.members}
        write_json(self.layout.dir / OFFSETS, offsets, within=self.job.home)

    @classmethod
    def load(cls, job_id: int, number: int, job: JobLayout) -> Attempt:
        """The attempt as :meth:`save_record` left it (OSError, KeyError or ValueError if it
        did not)."""
        adir = job.attempt(number).dir
        record = json.loads(jobfiles.read_file(job.home, adir / RECORD, max_size=MAX_STATE))
        offsets = read_json(adir / OFFSETS, within=job.home)
        att = cls(job_id, number, job, int(record["procs"]), [], list(record["bundles"]))
        for i, node in enumerate(record["nodes"]):
            m = Member(i, node_id=str(node["node_id"]), boot_id=str(node["boot_id"]))
            m.offsets = {k: int(v) for k, v in offsets.get(str(i), {}).items()}
            att.members.append(m)
        return att


# -- Ray's view and trainhouse's ---------------------------------------------------------------
def node_name(raw: dict[str, Any]) -> str:
    """A node of ``ray.nodes()`` as the scheduler names it: host and the node id's start; and
    its end where the start is one digit eight times over (never so in Ray's random ids, but
    Ray's fake multi-node provider numbers its nodes ``fff...f00001``, ``fff...f00002``)."""
    host = raw.get("NodeManagerHostname") or raw.get("NodeManagerAddress") or "ray"
    node_id = str(raw["NodeID"])
    start = node_id[:8]
    return f"{host}-{start}" if len(set(start)) > 1 else f"{host}-{start}-{node_id[-5:]}"


def to_node(raw: dict[str, Any], avail: dict[str, float] | None) -> Node:
    """A node of ``ray.nodes()`` as a scheduler node: with ``avail`` (CPU and GPU it may
    offer), what is free, else everything; custom resources become its labels."""
    res: dict[str, float] = raw.get("Resources") or {}
    cpus, gpus = res.get("CPU", 0.0), res.get("GPU", 0.0)
    if avail is not None:
        cpus, gpus = min(cpus, avail.get("CPU", 0.0)), min(gpus, avail.get("GPU", 0.0))
    model = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), "")
    labels = sorted(
        f"{k}={v:g}"
        for k, v in res.items()
        if k not in STANDARD and ":" not in k and "_group_" not in k
    )
    return Node(
        name=node_name(raw),
        cpus=int(cpus + 1e-9),
        memory_bytes=int(res.get("memory", 0)),
        gpus=tuple(Gpu(i, model=model or "ray") for i in range(int(gpus + 1e-9))),
        labels=tuple(labels),
    )


def probe(address: str) -> None:
    """Fail at once when nothing listens at ``address`` (ray.init waits minutes for it)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise RayUnavailable(f"--ray-address must be HOST:PORT, got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise RayUnavailable(
            f"no Ray cluster answers at {address} ({exc}); start one with `ray start --head` "
            "and pass the address it prints"
        ) from None


def ranks_per_node(placements: Sequence[Placement]) -> int:
    """The ranks each node of an attempt runs: its placements' (an elastic job's size is the
    one it was placed at, not its spec's largest). torchrun's static rendezvous gives every
    node as many ranks, so the placements must agree (ValueError otherwise)."""
    counts = sorted({p.procs for p in placements})
    if len(counts) != 1:
        raise ValueError(
            "the Ray executor runs as many ranks on every node of a job, got "
            + (", ".join(f"{p.node}: {p.procs}" for p in placements) or "no placement")
        )
    return counts[0]


def bundle(placement: Placement) -> dict[str, float]:
    out = {"CPU": float(placement.cpus)}
    if placement.gpus:
        out["GPU"] = float(len(placement.gpus))
    return out


def describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def pack(root: Path) -> bytes:
    """An attempt's workdir as a .tar.gz (it was unpacked from a validated upload)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tar.add(str(path), arcname=path.relative_to(root).as_posix(), recursive=False)
    return buf.getvalue()


def write_json(path: Path, data: Any, *, within: Path) -> None:
    """Replace ``path`` (under ``within``) with ``data`` as JSON, never through a link."""
    jobfiles.write_file(within, path, json.dumps(data).encode())


def read_json(path: Path, *, within: Path) -> dict[str, Any]:
    """The JSON object at ``path`` (a regular file under ``within`` reached without a link, of
    at most :data:`MAX_STATE` bytes), or {} when there is none."""
    try:
        data = json.loads(jobfiles.read_file(within, path, max_size=MAX_STATE))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
