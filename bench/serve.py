"""How much does dynamic batching buy a serving replica? 32 clients against one CPU replica.

The model is the digits example's CNN (``examples/digits/train.py``'s ``DigitsCNN``, random
weights: nothing is downloaded), saved with the SDK's ``write_model`` (torch.export with a
dynamic batch dimension) into a temporary directory. In the same run:

- the in-process ceiling: the loaded model itself (``trainhouse.sdk.load_model``) on batches
  of 32 digits, examples per second, one thread, no HTTP;
- one replica (``python -m trainhouse.serving.replica``, one torch thread) with dynamic
  batching (``--max-batch 32 --max-wait-ms 5``) and one with ``--max-batch 1``, each driven
  for ``--seconds`` by 32 concurrent clients (one asyncio loop in this process), each client
  sending one digit per request on a keep-alive connection and the next as soon as the answer
  is back.

The clients speak HTTP/1.1 over asyncio streams with the request bytes made once (as ``wrk``
does): httpx's client costs about 7 ms of CPU per request here, which on two cores capped both
replicas at ~130 requests/s and measured the client, not the replica. The replica runs uvicorn
with uvloop and httptools (dependencies of trainhouse); with uvicorn's pure-Python h11 parser
the HTTP layer, not the model, was its bottleneck and batching bought nothing (0.9x).

- predictions through the server, as users and load balancers make them: a real ``trainhouse
  server`` (a subprocess, temporary home, auth off as on any loopback server) serving the same
  model as a service of one replica with the same batching (``bench/_serve_server.py``: the
  digits example, run for 0 epochs, saves its CNN with ``run.save_model``; ``trainhouse serve
  digits-cnn@latest`` starts the replica as a rank of a long-running job), driven by the same
  clients at ``POST /api/v1/services/digits-cnn/predict`` (the ``X-Trainhouse-Request`` header
  trainhouse's clients send, the server's own Host), alternating with the batched replica
  above (straight, through, through, straight; each side's runs pooled).

It prints throughput (requests/s), p50 and p99 latency for each replica, the batched/unbatched
throughput ratio (goal: >= 3x) and the batched p99 (goal: < 50 ms), and both replicas'
throughput as a fraction of the ceiling; then requests/s, p50 and p99 straight and through the
server, the CPU each process spent per prediction (the replica's both ways, the server's) and
the ratio through/straight (goal: >= 0.8, PASS or BELOW TARGET). Every replica and the server
run at the same time, idle but for what is being measured. ``--smoke`` runs the bench's own
replicas in threads of this process, briefly (the server and its service are real, and take
about a minute to start): a check that the benchmark runs, whose numbers mean nothing. Run it
under ``flock /tmp/bench.lock`` on a shared machine.

    python bench/serve.py [--seconds 10] [--clients 32] [--smoke] [--json]

It is a benchmark, not a test: it exits 0 whatever the numbers (1 if a replica, the server or
its service does not start).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from _serve_server import Served, served_model  # noqa: E402

#: predictions through the server, as a fraction of those straight to the replica, at least
THROUGH_TARGET = 0.8


def digits_cnn() -> Any:
    spec = importlib.util.spec_from_file_location("digits", REPO / "examples/digits/train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DigitsCNN()


@contextlib.contextmanager
def replica_thread(directory: Path, max_batch: int) -> Iterator[str]:
    """``--smoke``: the replica's app in a thread of this process (no second torch import)."""
    import socket
    import threading

    import uvicorn

    from trainhouse.serving.replica import build_app, load

    app, _ = build_app(load(directory), max_batch=max_batch, max_wait_ms=5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextlib.contextmanager
def replica(
    directory: Path, work: Path, max_batch: int, smoke: bool = False
) -> Iterator[tuple[str, int | None]]:
    """A replica of the model in ``directory``: its url and process (None: a thread here)."""
    if smoke:
        with replica_thread(directory, max_batch) as url:
            yield url, None
        return
    ready = work / f"port-{max_batch}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
    cmd = [sys.executable, "-m", "trainhouse.serving.replica", str(directory)]
    cmd += ["--max-batch", str(max_batch), "--max-wait-ms", "5", "--ready-file", str(ready)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the replica (max batch {max_batch}) did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{ready.read_text()}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes
) -> tuple[int, bytes]:
    """One request on a keep-alive connection: the status and the body."""
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(b":", 1)[1]) for line in lines if line.lower().startswith(b"content-length")
    )
    return status, await reader.readexactly(length)


def _raw(
    path: str, body: bytes, host: str = "bench", headers: dict[str, str] | None = None
) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def drive(
    url: str,
    clients: int,
    seconds: float,
    example: list[Any],
    *,
    path: str = "/predict",
    host: str = "bench",
    headers: dict[str, str] | None = None,
) -> Run:
    """``clients`` clients posting one digit each to ``url`` + ``path`` for ``seconds``."""
    address, port = url.removeprefix("http://").split(":")
    raw = _raw(path, json.dumps({"inputs": [example]}).encode(), host, headers)
    latencies: list[float] = []
    failed = 0
    conns = [await asyncio.open_connection(address, int(port)) for _ in range(clients)]
    for reader, writer in conns[:3]:  # warm: connections, the first batches
        status, body = await _request(reader, writer, raw)
        assert status == 200, body[:500]
    end = time.perf_counter() + seconds

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal failed
        while time.perf_counter() < end:
            start = time.perf_counter()
            status, _ = await _request(reader, writer, raw)
            latencies.append(time.perf_counter() - start)
            failed += status != 200

    began = time.perf_counter()
    await asyncio.gather(*(client(r, w) for r, w in conns))
    elapsed = time.perf_counter() - began
    for _, writer in conns:
        writer.close()
    return Run(latencies, elapsed, failed)


@dataclass
class Run:
    """One phase's answers: each one's latency (seconds), the phase's length, those not 200."""

    latencies: list[float]
    elapsed: float
    failed: int


def summary(*runs: Run) -> dict[str, Any]:
    """Requests/s, p50 and p99 (ms) and failures of ``runs`` pooled."""
    latencies = sorted(x for r in runs for x in r.latencies)
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {
        "requests_per_s": len(latencies) / sum(r.elapsed for r in runs),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "failed": sum(r.failed for r in runs),
    }


def mean_batch(url: str) -> float:
    """The mean batch a replica ran so far (its ``/health``)."""
    import httpx

    health = httpx.get(f"{url}/health").json()
    return float(health["examples"] / max(health["batches"], 1))


def cpu_seconds(process: psutil.Process | None) -> float:
    """A process's CPU time so far (its own threads; 0 for none)."""
    if process is None:
        return 0.0
    t = process.cpu_times()
    return float(t.user + t.system)


def straight_and_through(
    replica_url: str,
    replica_pid: int | None,
    served: Served,
    clients: int,
    seconds: float,
    example: list[Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same clients straight to the replica and through the server's predict route (the
    header trainhouse's clients send, the Host the server answers to), in the order straight,
    through, through, straight (a machine busy in one part of the run weighs on both): each
    side's runs pooled, and the CPU each process spent per prediction (the replica's straight,
    the service's replica's and the server's through it; --smoke's replica is a thread here,
    not counted)."""
    from trainhouse.core.wire import CLIENT_HEADERS

    mine = psutil.Process(replica_pid) if replica_pid is not None else None
    theirs = served.replica_process()
    straight: list[Run] = []
    through: list[Run] = []
    cpu = {"replica": 0.0, "service replica": 0.0, "server": 0.0}
    for side in (straight, through, through, straight):
        before = {
            "replica": cpu_seconds(mine),
            "service replica": cpu_seconds(theirs),
            "server": cpu_seconds(served.process),
        }
        if side is straight:
            side.append(asyncio.run(drive(replica_url, clients, seconds, example)))
            cpu["replica"] += cpu_seconds(mine) - before["replica"]
            continue
        side.append(
            asyncio.run(
                drive(
                    served.url,
                    clients,
                    seconds,
                    example,
                    path=served.path,
                    host=served.host,
                    headers=CLIENT_HEADERS,
                )
            )
        )
        cpu["service replica"] += cpu_seconds(theirs) - before["service replica"]
        cpu["server"] += cpu_seconds(served.process) - before["server"]
    answered = sum(len(r.latencies) for r in through)
    if answered and cpu["service replica"] <= 0:  # its CPU per prediction would read 0
        raise SystemExit(
            f"the service's replica process found (pid {theirs.pid}) used no CPU for "
            f"{answered} predictions: it is not the process that answers them"
        )
    direct, forwarded = summary(*straight), summary(*through)
    direct["mean_batch"] = mean_batch(replica_url)
    forwarded["mean_batch"] = served.mean_batch()
    per = lambda seconds, runs: seconds / max(sum(len(r.latencies) for r in runs), 1) * 1000  # noqa: E731
    direct["replica_cpu_ms_per_prediction"] = per(cpu["replica"], straight) if mine else None
    forwarded["replica_cpu_ms_per_prediction"] = per(cpu["service replica"], through)
    forwarded["server_cpu_ms_per_prediction"] = per(cpu["server"], through)
    return direct, forwarded


def ceiling(directory: Path, seconds: float) -> float:
    import torch

    from trainhouse.sdk import load_model

    model = load_model(directory)
    x = torch.rand(32, 1, 8, 8)
    done, end = 0, time.perf_counter() + seconds
    began = time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() < end:
            model(x)
            done += 32
    return done / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 s per phase, 8 clients, the replicas in threads of this process (a quick check "
        "that it runs; the numbers mean nothing)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.clients = 1.0, 8
    import torch

    from trainhouse.jobfs.storage import open_storage
    from trainhouse.sdk._model import write_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="trainhouse-bench-serve-") as tmp:
        work = Path(tmp)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor")
        torch.manual_seed(0)
        record = write_model(
            open_storage(work / "store"),
            "digits-cnn",
            digits_cnn(),
            example_inputs=(torch.rand(4, 1, 8, 8),),
            metrics=None,
            loader=None,
            step=0,
            attempt=1,
            job_id=None,
        )
        directory = work / "store" / record["path"]
        example = torch.rand(1, 8, 8).tolist()
        top = ceiling(directory, args.seconds)
        with (
            served_model(work) as served,
            replica(directory, work, 32, args.smoke) as (batched_url, batched_pid),
            replica(directory, work, 1, args.smoke) as (one_url, _),
        ):
            batched, through = straight_and_through(
                batched_url, batched_pid, served, args.clients, args.seconds, example
            )
            single = summary(asyncio.run(drive(one_url, args.clients, args.seconds, example)))
            single["mean_batch"] = mean_batch(one_url)
    ratio = batched["requests_per_s"] / max(single["requests_per_s"], 1e-9)
    forwarded = through["requests_per_s"] / max(batched["requests_per_s"], 1e-9)
    report = {
        "clients": args.clients,
        "seconds": args.seconds,
        "ceiling_examples_per_s": top,
        "batched": batched,
        "max_batch_1": single,
        "batched_over_unbatched": ratio,
        "through_server": through,
        "through_over_straight": forwarded,
        "goals": {
            "ratio>=3": ratio >= 3,
            "p99<50ms": batched["p99_ms"] < 50,
            f"through/straight>={THROUGH_TARGET}": forwarded >= THROUGH_TARGET,
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.clients} clients, {args.seconds:g} s per phase, one CPU replica of DigitsCNN")
    print(f"  in-process ceiling      {top:10.0f} examples/s (batches of 32, no HTTP)")
    for name, r in (("batched (32, 5 ms)", batched), ("--max-batch 1", single)):
        print(
            f"  {name:<22} {r['requests_per_s']:10.0f} requests/s  p50 {r['p50_ms']:6.1f} ms  "
            f"p99 {r['p99_ms']:6.1f} ms  mean batch {r['mean_batch']:5.1f}  "
            f"failed {r['failed']}  ({r['requests_per_s'] / top:.1%} of the ceiling)"
        )
    print(
        f"  batched / unbatched     {ratio:10.2f}x (goal >= 3x: "
        f"{'met' if ratio >= 3 else 'not met'}); batched p99 "
        f"{'under' if batched['p99_ms'] < 50 else 'over'} 50 ms"
    )
    print("  straight to the replica and through the server, the same clients, in turn:")
    for name, r in (("straight (batched)", batched), ("through the server", through)):
        print(
            f"  {name:<22} {r['requests_per_s']:10.0f} requests/s  p50 {r['p50_ms']:6.1f} ms  "
            f"p99 {r['p99_ms']:6.1f} ms  mean batch {r['mean_batch']:5.1f}  failed {r['failed']}"
        )
    spent = batched["replica_cpu_ms_per_prediction"]
    print(
        "  CPU per prediction      replica "
        + (f"{spent:.2f} ms straight, " if spent is not None else "")
        + f"{through['replica_cpu_ms_per_prediction']:.2f} ms through; the server "
        f"{through['server_cpu_ms_per_prediction']:.2f} ms"
    )
    verdict = "PASS" if forwarded >= THROUGH_TARGET else "BELOW TARGET"
    print(f"  through / straight      {forwarded:10.2f} (target >= {THROUGH_TARGET}): {verdict}")


if __name__ == "__main__":
    main()
