"""Datasets: what staging a version costs, cold and warm, against the plain ways, in one run.

A version of ``--files`` files of random bytes (``os.urandom``: nothing compresses), ``--size-mb``
MB in all (200 files, 1000 MB; ``--quick``: 20 files, 40 MB; ``--smoke``: 4 files, 4 MB), is put
into moto's S3 server on loopback (``tests/support/s3.py``: ``running_moto_s3()``, in this process,
with a counter of the GET requests it answers) under ``s3://bench-data/v1`` as single-part objects,
and its manifest made as the server makes it (``datasources.manifest_of``: the ETags are the
files' MD5, nothing is read). Then four goals, each a ratio against a baseline measured in the
same run:

1. **Cold staging** ``DataCache(root).stage(manifest, fetch)`` into an empty cache, ``fetch``
   being ``datasources.open_file(url, options, path, size)`` as a node's supervisor reads a URL
   source (one file after the other: each opened, read, MD5-hashed as written, fsynced,
   renamed, hard-linked into the view), against the plain way of copying the same files:
   ``s3fs.S3FileSystem(endpoint_url=...).get(the file list, local paths)``, s3fs's own get of the
   same file list (its own concurrency, as a user would call it). s3fs's get one file at a time
   (``batch_size=1``), the one-by-one story staging has, is shown too, not judged. Before every
   timed run ``os.sync()`` (the previous run's dirty pages are no one's cost); one untimed
   warm-up of each (one file) sets up both sides' S3 clients. ``--repeats`` runs per side in
   ABBA order; ratio = the median of the pairs' s3fs get / staging; goal >= 0.9. The staging
   time is split into opening the files (s3fs's HEAD), reading them (the GETs) and the cache's
   own work (hashing, writing, fsync, links).
2. **Warm start**: submit to the first training step with the version already in the node's
   cache, against bare torchrun's start to its first step: ``bench/start.py``'s job (the digits
   example, 2 ranks, gloo on the CPU, 1 epoch) and its machinery (``run_bare``,
   ``run_trainhouse``), bare vs a real server (``--dataset-allow-private``: the store is on
   loopback) with the job pinning the version (``datasets: {train: bench-data@1}``), and the
   same job without it, ``--start-repeats`` runs of each in ABBA order after one untimed job (the
   server's first pays for first-time work); goal: the median of the pairs' difference with
   the dataset - bare <= +1.0 s. What the version itself adds (with - without) is shown. The
   version is in the server's cache from goal 4 (its four stages use the server's
   ``HOME/datacache``), so the jobs fetch nothing (checked with the GET counter). Shown too: a
   warm stage alone, in a fresh process, what the supervisor adds for a cached version
   (importing ``staging``, parsing the manifest, ``DataCache.stage``; not the server's
   manifest request). With ``--no-start`` goal 2 is that warm stage against the same +1.0 s
   budget, and the output says so.
3. **Reading the staged copy** against reading the same files from a plain local directory
   (the last s3fs get's): every byte of every file, in manifest order, ``readinto`` a 1 MiB
   buffer, after an ``os.sync()`` (s3fs's copy is not fsynced: its pages would still be under
   write-back). The page cache cannot be dropped without root, so each is read once untimed
   and then timed warm (from the page cache): ``--read-repeats`` passes per side in ABBA
   order, a pass reading the version as many times as fill about 0.25 s (a small version's
   single reading lasts a few ms); ratio = the median of the pairs' plain / staged time; goal
   >= 0.98.
4. **Four stages at once**: 4 processes (this script's ``--stage-worker``) stage the version
   into one empty cache root at the same moment, as on a node where 4 jobs start together; the
   bytes fetched from the store (the sum of their ``Staged.fetched_bytes``) over the version's
   size, goal exactly 1.0; the GET requests moto answered meanwhile, against one cold stage's,
   are shown as a cross-check.

The machine: it waits up to ``--quiet-wait`` (30 s) for other processes to leave the CPUs,
and up to ``--op-wait`` (5 s) before each timed run, prints the load average and how much of the
CPUs other processes used during the in-process timed runs (``checkpoint.OthersLoad``), and
warns when they were busy. moto runs in this process (a werkzeug thread sharing the GIL with the
client), one request per connection: what it serves is slower than a real store, for both sides
alike. It is a benchmark, not a test: it exits 0 whatever the numbers.

    python bench/datasets.py [--files 200] [--size-mb 1000] [--repeats 3] [--json]
    python bench/datasets.py --quick      # 20 files, 40 MB
    python bench/datasets.py --smoke      # 4 files, 4 MB, 1 run each: does it run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

from _machine import BUSY_PERCENT, log, machine_busy, wait_quiet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.append(str(ROOT))  # tests.support.s3: moto's S3 server with a GET counter

from trainhouse.core.datasets import FileEntry, Manifest  # noqa: E402
from trainhouse.jobfs import datasources  # noqa: E402
from trainhouse.jobfs.datacache import DataCache, Staged  # noqa: E402

STAGE_GOAL = 0.9  # s3fs get time / cold staging time, at least
WARM_GOAL_S = 1.0  # seconds a cached version may add to submit-to-first-step
READ_GOAL = 0.98  # plain directory read time / staged copy read time, at least
SHARED_GOAL = 1.0  # bytes fetched by 4 stages at once / the version's size, exactly
WORKERS = 4
BUCKET, PREFIX, NAME = "bench-data", "v1", "bench-data"
MB = 1e6
READ_BUFFER = 1 << 20
READ_PASS_S = 0.25  # a timed reading pass lasts at least about this long

# a warm stage as the supervisor does it, in a fresh process: the supervisor's own imports are
# not counted (it has them anyway); staging's import, the manifest and the stage are
WARM_SCRIPT = """
import json, sys, time
from pathlib import Path
import trainhouse.executors.node.supervise
started = time.perf_counter()
from trainhouse.executors.node import staging
from trainhouse.core.datasets import Manifest
manifest = Manifest.from_json(json.loads(Path(sys.argv[2]).read_text()))
def refuse(entry):
    raise AssertionError(f"{entry.path} was fetched: the version was not cached")
staged = staging.DataCache(Path(sys.argv[1])).stage(manifest, refuse)
took = time.perf_counter() - started
assert staged.fetched_bytes == 0, staged
staged.release()
print(took)
"""


# -- helpers ------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "BELOW TARGET"


def remove_tree(path: Path) -> None:
    """Remove a tree holding a dataset cache (read-only directories: made writable first)."""
    for sub, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(sub, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def before_run(op_wait: float) -> float:
    """Wait up to ``op_wait`` s for a quiet machine; the CPU use seen last, %."""
    return wait_quiet(op_wait) if op_wait > 0 else 0.0


class _TimedStream:
    """A source's stream whose reads are timed (what the cache calls: ``read(n)``)."""

    def __init__(self, raw: BinaryIO, fetch: TimedFetch) -> None:
        self._raw, self._fetch = raw, fetch

    def read(self, n: int = -1) -> bytes:
        started = time.perf_counter()
        try:
            return self._raw.read(n)
        finally:
            self._fetch.read_s += time.perf_counter() - started


class TimedFetch:
    """What the supervisor's fetch of a URL source is (``staging._fetcher``:
    ``datasources.open_file(url, options, entry.path, entry.size)``), with its opening and
    reading timed."""

    def __init__(self, url: str, options: dict[str, str]) -> None:
        self.url, self.options = url, options
        self.open_s = self.read_s = 0.0

    @contextlib.contextmanager
    def __call__(self, entry: FileEntry) -> Iterator[BinaryIO]:
        started = time.perf_counter()
        with datasources.open_file(self.url, self.options, entry.path, entry.size) as stream:
            self.open_s += time.perf_counter() - started
            yield cast(BinaryIO, _TimedStream(stream, self))


def read_all(paths: list[Path]) -> tuple[float, int]:
    """Every byte of ``paths``, in order, into one buffer: (seconds, bytes)."""
    buffer = bytearray(READ_BUFFER)
    view = memoryview(buffer)
    total = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                total += n
    return time.perf_counter() - started, total


def abba(i: int, sides: list[str]) -> list[str]:
    return sides if i % 2 == 0 else sides[::-1]


def fmt_signed(values: list[float]) -> str:
    return " ".join(f"{x:+.2f}" for x in values)


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}" if len(values) > 1 else f"{values[0]:{fmt}}"


# -- the store ----------------------------------------------------------------------------------
def fill_store(s3: Any, files: int, size: int) -> float:
    """``files`` objects of random bytes, ``size`` bytes in all, under BUCKET/PREFIX/train/;
    the seconds the uploads took."""
    s3.make_bucket(BUCKET)
    each, extra = divmod(size, files)
    started = time.perf_counter()
    for i in range(files):
        s3.put(BUCKET, f"{PREFIX}/train/part-{i:05d}.bin", os.urandom(each + (i < extra)))
    return time.perf_counter() - started


def get_count(s3: Any) -> int:
    return sum(s3.get_counts().values())


# -- goal 1: cold staging vs s3fs get -----------------------------------------------------------
def part_cold(
    s3: Any, manifest: Manifest, url: str, options: dict[str, str], work: Path, args: Any, load: Any
) -> dict[str, Any]:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3.endpoint_url)
    remote = [f"{BUCKET}/{PREFIX}/{e.path}" for e in manifest.files]

    def get(dest: Path, batch_size: int | None, which: slice = slice(None)) -> None:
        extra = {"batch_size": batch_size} if batch_size else {}
        local = [str(dest / e.path) for e in manifest.files[which]]
        fs.get(remote[which], local, **extra)

    # warm-up, untimed: both sides' clients and connections set up with one file
    first = Manifest.of(manifest.files[:1])
    with DataCache(work / "warmup-cache").stage(first, TimedFetch(url, options)):
        pass
    get(work / "warmup-get", None, slice(0, 1))
    get(work / "warmup-get1", 1, slice(0, 1))
    for name in ("warmup-cache", "warmup-get", "warmup-get1"):
        remove_tree(work / name)

    times: dict[str, list[float]] = {"stage": [], "get": [], "get1": []}
    split: dict[str, list[float]] = {"open": [], "read": []}
    gets: list[int] = []
    kept: dict[str, Any] = {}
    for i in range(args.repeats):
        last = i == args.repeats - 1
        for side in abba(i, ["stage", "get", "get1"]):
            dest = work / f"{side}-{i}"
            before_run(args.op_wait)
            os.sync()
            before = get_count(s3)
            with load.measure():
                started = time.perf_counter()
                if side == "stage":
                    fetch = TimedFetch(url, options)
                    staged = DataCache(dest).stage(manifest, fetch)
                else:
                    get(dest, None if side == "get" else 1)
                took = time.perf_counter() - started
            times[side].append(took)
            if side == "stage":
                split["open"].append(fetch.open_s)
                split["read"].append(fetch.read_s)
                gets.append(get_count(s3) - before)
                if staged.fetched_bytes != manifest.size:
                    raise RuntimeError(f"a cold stage fetched {staged.fetched_bytes} bytes")
            log(f"  run {i + 1}/{args.repeats} {side}: {took:.2f} s")
            if last and side == "stage":
                kept["staged"] = staged  # held for goal 3 (its view is read)
            elif last and side == "get":
                kept["plain"] = dest
            else:
                if side == "stage":
                    staged.release()
                remove_tree(dest)
    pairs = [g / s for g, s in zip(times["get"], times["stage"], strict=True)]
    pairs1 = [g / s for g, s in zip(times["get1"], times["stage"], strict=True)]
    stage_s = statistics.median(times["stage"])
    open_s, read_s = statistics.median(split["open"]), statistics.median(split["read"])
    ratio = statistics.median(pairs)
    return {
        "stage_s": times["stage"],
        "get_s": times["get"],
        "get_one_at_a_time_s": times["get1"],
        "stage_median_s": stage_s,
        "get_median_s": statistics.median(times["get"]),
        "get_one_at_a_time_median_s": statistics.median(times["get1"]),
        "stage_open_s": open_s,
        "stage_read_s": read_s,
        "stage_own_s": max(0.0, stage_s - open_s - read_s),
        "stage_gets": gets[-1],
        "pair_ratios": pairs,
        "ratio": ratio,
        "ratio_one_at_a_time": statistics.median(pairs1),
        "target": STAGE_GOAL,
        "pass": ratio >= STAGE_GOAL,
        "_kept": kept,
    }


# -- goal 3: reading the staged copy vs a plain directory ---------------------------------------
def part_read(manifest: Manifest, view: Path, plain: Path, args: Any, load: Any) -> dict[str, Any]:
    paths = {
        "staged": [view / e.path for e in manifest.files],
        "plain": [plain / e.path for e in manifest.files],
    }
    os.sync()  # the plain copy was written without fsync: no reading races its write-back
    first = []
    for side in ("staged", "plain"):  # the first reading, untimed: both in the page cache
        took, n = read_all(paths[side])
        first.append(took)
        if n != manifest.size:
            raise RuntimeError(f"{side}: read {n} bytes of {manifest.size}")
    # a small version is read several times per pass: a pass of a few ms measures the timer
    loops = max(1, min(100, round(READ_PASS_S / max(min(first), 1e-4))))
    times: dict[str, list[float]] = {"staged": [], "plain": []}
    for i in range(args.read_repeats):
        for side in abba(i, ["staged", "plain"]):
            with load.measure():
                took = sum(read_all(paths[side])[0] for _ in range(loops))
            times[side].append(took / loops)
    pairs = [p / s for p, s in zip(times["plain"], times["staged"], strict=True)]
    ratio = statistics.median(pairs)
    return {
        "staged_s": times["staged"],
        "plain_s": times["plain"],
        "staged_median_s": statistics.median(times["staged"]),
        "plain_median_s": statistics.median(times["plain"]),
        "loops": loops,
        "pair_ratios": pairs,
        "ratio": ratio,
        "target": READ_GOAL,
        "pass": ratio >= READ_GOAL,
    }


# -- goal 4: four stages of one version at once -------------------------------------------------
def stage_worker(config: Path) -> int:
    """One of goal 4's processes: stage when told to (a line on stdin), print what it did."""
    import s3fs  # noqa: F401  (imported before the start, as a supervisor's would be by then)

    cfg = json.loads(config.read_text())
    manifest = Manifest.from_json(cfg["manifest"])
    url, options = cfg["url"], cfg["options"]
    cache = DataCache(Path(cfg["cache"]))
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    staged = cache.stage(manifest, lambda e: datasources.open_file(url, options, e.path, e.size))
    took = time.perf_counter() - started
    answer = {"fetched_bytes": staged.fetched_bytes, "reused": staged.reused, "seconds": took}
    staged.release()
    print(json.dumps(answer), flush=True)
    return 0


def part_shared(
    s3: Any, manifest: Manifest, url: str, options: dict[str, str], cache: Path, work: Path
) -> dict[str, Any]:
    config = work / "worker.json"
    config.write_text(
        json.dumps(
            {"manifest": manifest.to_json(), "url": url, "options": options, "cache": str(cache)}
        )
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage-worker", str(config)]
    procs = [
        subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    answers: list[dict[str, Any]] = []
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                _out, err = p.communicate(timeout=60)
                raise RuntimeError(f"a stage worker failed to start:\n{err[-3000:]}")
        busy = machine_busy(0.2)
        before = get_count(s3)
        started = time.perf_counter()
        for p in procs:  # the four told to go together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"a stage worker exited {p.returncode}:\n{err[-3000:]}")
            answers.append(json.loads(out.strip().splitlines()[-1]))
        took = time.perf_counter() - started
        after_busy = machine_busy(0.5)
        gets = get_count(s3) - before
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    fetched = sum(a["fetched_bytes"] for a in answers)
    ratio = fetched / manifest.size
    return {
        "workers": WORKERS,
        "fetched_bytes": fetched,
        "size": manifest.size,
        "fetched_by_each": [a["fetched_bytes"] for a in answers],
        "seconds_each": [a["seconds"] for a in answers],
        "seconds": took,
        "gets": gets,
        "ratio": ratio,
        "target": SHARED_GOAL,
        "pass": fetched == manifest.size,
        "busy": max(busy, after_busy),
    }


# -- goal 2: warm start -------------------------------------------------------------------------
def warm_stage(cache: Path, manifest: Manifest, work: Path, repeats: int) -> list[float]:
    """Seconds of a warm stage in a fresh process (import staging, the manifest, the stage)."""
    path = work / "manifest.json"
    path.write_text(json.dumps(manifest.to_json()))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    found = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", WARM_SCRIPT, str(cache), str(path)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        found.append(float(done.stdout.split()[-1]))
    return found


class DataServer:
    """A trainhouse server like ``start.Server``'s, taking sources on loopback (moto)."""

    def __init__(self, home: Path, cpus: int) -> None:
        from overhead import free_port, wait_healthy

        from trainhouse.client import Client

        port = free_port()
        self.home = home
        self.log_path = home / "server.log"
        cmd = [sys.executable, "-m", "trainhouse", "server", "--home", str(home)]
        cmd += ["--port", str(port), "--cpus", str(cpus), "--gpus", "0"]
        cmd += ["--log-level", "warning", "--dataset-allow-private"]
        # the AWS_* variables running_moto_s3 set are inherited: the server lists the bucket
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOUSE_")}
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
        )
        with self.log_path.open("ab") as fh:
            self.proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.client = Client(f"http://127.0.0.1:{port}")
        wait_healthy(self.client, self.proc, self.log_path)

    def close(self) -> None:
        from overhead import stop_tree

        self.client.close()
        stop_tree(self.proc, grace=60)


def part_start(server: DataServer, s3: Any, version: int, work: Path, args: Any) -> dict[str, Any]:
    """start.py's runs in ABBA order: bare torchrun, the job pinning the cached version through
    the server (judged against bare), and the same job without it (what the version adds)."""
    from start import START_PHASES, make_workdir, phases, run_bare, run_trainhouse

    from trainhouse.spec import load_spec

    epochs = 1
    jobs = {}
    for side in ("data", "plain"):
        (work / side).mkdir(parents=True)
        jobs[side] = make_workdir(work / side, epochs)
    spec_path = jobs["data"] / "trainhouse.yaml"
    spec_path.write_text(spec_path.read_text() + f"datasets:\n  train: {NAME}@{version}\n")
    spec = load_spec(spec_path, [f"hparams.epochs={epochs}"])
    runs: dict[str, list[Any]] = {"bare": [], "data": [], "plain": []}
    staging_lines: list[str] = []
    busy = 0
    before = get_count(s3)
    if args.start_warmup:  # untimed: the server's first job pays for first-time work
        run_trainhouse(cast(Any, server), jobs["plain"], spec, epochs, args.timeout)
    for i in range(args.start_repeats):
        for side in abba(i, ["bare", "data", "plain"]):
            seen = before_run(args.op_wait)
            if side == "bare":
                run = run_bare(jobs["data"], spec, epochs, args.timeout)
            else:
                # start.Server's interface: client, home
                run = run_trainhouse(cast(Any, server), jobs[side], spec, epochs, args.timeout)
            if side == "data":
                newest = server.client.jobs(limit=1)[0]
                line = str(server.client.job(newest["id"]).get("staging") or "")
                staging_lines.append(line.split(" at /", 1)[0])  # not the view's path
            run.busy = max(seen, machine_busy(0.5))
            busy += run.busy > BUSY_PERCENT
            log(f"  {side}: first step after {run.first_step_s:.2f} s")
            runs[side].append(run)
    gets = get_count(s3) - before

    def first(side: str) -> float:
        return float(statistics.median(r.first_step_s for r in runs[side]))

    def minus(a: str, b: str) -> list[float]:
        pairs = zip(runs[a], runs[b], strict=True)
        return [x.first_step_s - y.first_step_s for x, y in pairs]

    def by_phase(side: str) -> dict[str, float]:
        found: dict[str, list[float]] = {}
        for r in runs[side]:
            for name, seconds in phases(r, START_PHASES, "first_step"):
                found.setdefault(name, []).append(seconds)
        return {name: statistics.median(values) for name, values in found.items()}

    extras, added = minus("data", "bare"), minus("data", "plain")
    return {
        "pairs": args.start_repeats,
        "epochs": epochs,
        "bare_first_step_s": first("bare"),
        "trainhouse_first_step_s": first("data"),
        "without_dataset_first_step_s": first("plain"),
        "pair_extras_s": extras,
        "extra_s": statistics.median(extras),
        "dataset_adds_s": statistics.median(added),
        "pair_dataset_adds_s": added,
        "phases": {side: by_phase(side) for side in runs},
        "staging_line": staging_lines[-1] if staging_lines else "",
        "gets": gets,
        "busy_runs": busy,
        "runs": sum(map(len, runs.values())),
    }


# -- the report ---------------------------------------------------------------------------------
def print_report(s: dict[str, Any]) -> None:
    c, w, r, sh = s["cold"], s["warm"], s["read"], s["shared"]
    size = s["size"]
    load1, load5, load15 = s["loadavg"]
    print(
        f"dataset version: {s['files']} files of random bytes, {size / MB:.0f} MB, in moto's "
        f"S3 server on loopback (this process); {s['repeats']} run(s) per side, ABBA order"
    )
    print(
        f"machine: {s['cpus']} CPUs, load average {load1:.2f} {load5:.2f} {load15:.2f} at the "
        f"start; other processes used {s['busy_start']:.0f}% of the CPUs before the runs"
    )
    print(
        f"upload to moto {s['upload_s']:.1f} s ({size / MB / s['upload_s']:.0f} MB/s); "
        f"manifest (listing, ETags as MD5) {s['manifest_s']:.2f} s"
    )
    print()
    stage, get, get1 = c["stage_median_s"], c["get_median_s"], c["get_one_at_a_time_median_s"]
    print("1. cold staging vs s3fs get of the same files (medians; os.sync() before each run)")
    print(
        f"   DataCache.stage, datasources.open_file  {stage:7.2f} s  {size / MB / stage:6.0f} "
        f"MB/s   runs: {' '.join(f'{x:.2f}' for x in c['stage_s'])}"
    )
    print(
        f"     of which opening (HEAD) {c['stage_open_s']:.2f} s, reading (GET) "
        f"{c['stage_read_s']:.2f} s, the cache's own work (MD5, write, fsync, links) "
        f"{c['stage_own_s']:.2f} s; {c['stage_gets']} GETs"
    )
    print(
        f"   s3fs get of the file list               {get:7.2f} s  {size / MB / get:6.0f} "
        f"MB/s   runs: {' '.join(f'{x:.2f}' for x in c['get_s'])}"
    )
    print(
        f"   s3fs get, one file at a time            {get1:7.2f} s  {size / MB / get1:6.0f} "
        f"MB/s   runs: {' '.join(f'{x:.2f}' for x in c['get_one_at_a_time_s'])}"
    )
    print(
        f"   s3fs get one at a time / staging = {c['ratio_one_at_a_time']:.3f} (shown, not judged)"
    )
    print()
    print("2. warm start: the version already in the node's cache")
    print(
        f"   a warm stage alone (fresh process: import staging, the manifest, "
        f"DataCache.stage): {w['stage_s']:.3f} s (runs: {spread(w['stage_runs'])})"
    )
    st = w.get("start")
    if st is not None:
        print(
            f"   digits job, 2 ranks, {st['epochs']} epoch, {st['pairs']} run(s) per side, "
            f"ABBA; first step: bare {st['bare_first_step_s']:.2f} s, trainhouse with the "
            f"dataset {st['trainhouse_first_step_s']:.2f} s, without it "
            f"{st['without_dataset_first_step_s']:.2f} s"
        )
        print("   pairs, with the dataset - bare, s: " + fmt_signed(st["pair_extras_s"]))
        print(
            f"   the cached version adds {st['dataset_adds_s']:+.2f} s to trainhouse's own start "
            f"(median of the pairs with - without: {fmt_signed(st['pair_dataset_adds_s'])})"
        )
        ph = st["phases"]
        title = "to the first step by phase, s (medians)"
        print(f"   {title:<44}{'bare':>7}{'with':>7}{'without':>8}")
        for name in ph["data"]:  # the supervisor's phase holds the staging
            shown = [ph[side].get(name) for side in ("bare", "data", "plain")]
            widths = (7, 7, 8)
            cells = "".join(
                f"{'-' if v is None else f'{v:.2f}':>{w}}"
                for v, w in zip(shown, widths, strict=True)
            )
            print(f"     {name:<42}{cells}")
        print(f"   the job's staging: {st['staging_line']!r}; the store saw {st['gets']} GETs")
    print()
    print(
        "3. reading every byte, staged copy vs a plain directory (warm: the first reading "
        f"untimed; {s['read']['loops']} reading(s) per timed pass; medians)"
    )
    for name, key in (
        ("staged copy (the cache's view)", "staged"),
        ("plain directory (s3fs get's)", "plain"),
    ):
        took = r[f"{key}_median_s"]
        print(f"   {name:<32} {took * 1000:8.1f} ms  {size / MB / took:6.0f} MB/s")
    print()
    print(f"4. {sh['workers']} processes staging the version into one empty cache at once")
    print(
        f"   done in {sh['seconds']:.2f} s (one cold stage: {stage:.2f} s); fetched by each: "
        + ", ".join(f"{b / MB:.0f} MB" for b in sh["fetched_by_each"])
        + f"; GETs {sh['gets']} (one cold stage: {c['stage_gets']})"
    )
    print()
    print(
        f"other processes used {s['others_percent']:.0f}% of the CPUs during the in-process "
        f"timed runs (goals 1, 3), > {BUSY_PERCENT:.0f}% during {s['busy_spans']} of "
        f"{s['spans']}"
    )
    st = w.get("start")
    if st is not None:
        print(
            f"the CPUs were > {BUSY_PERCENT:.0f}% busy just before or after {st['busy_runs']} "
            f"of goal 2's {st['runs']} job runs"
        )
    if s["others_percent"] > BUSY_PERCENT or s["busy_spans"] or (st and st["busy_runs"]):
        print("warning: the machine was busy; the numbers are unreliable, rerun on a quieter one")
    print(
        f"goal 1, cold staging: s3fs get / staging = {c['ratio']:.3f} (pairs "
        f"{spread(c['pair_ratios'])}; target >= {c['target']:.2f}): {verdict(c['pass'])}"
    )
    how = (
        "submit-to-first-step - bare torchrun's start-to-first-step"
        if w["measured"] == "start"
        else "warm stage adds (--no-start: the staging phase only)"
    )
    print(
        f"goal 2, warm start: {how} = {w['extra_s']:+.2f} s (target <= "
        f"+{w['target']:.1f} s): {verdict(w['pass'])}"
    )
    print(
        f"goal 3, reading the staged copy: plain / staged = {r['ratio']:.3f} (pairs "
        f"{spread(r['pair_ratios'])}; target >= {r['target']:.2f}): {verdict(r['pass'])}"
    )
    print(
        f"goal 4, {sh['workers']} stages at once: fetched / size = {sh['ratio']:.3f} "
        f"({sh['fetched_bytes']} of {sh['size']} bytes; target exactly "
        f"{sh['target']:.1f}): {verdict(sh['pass'])}"
    )


# -- main ---------------------------------------------------------------------------------------
def drive(args: argparse.Namespace) -> dict[str, Any]:
    from checkpoint import OthersLoad
    from tests.support.s3 import running_moto_s3

    load = OthersLoad()
    busy_start = wait_quiet(args.quiet_wait) if args.quiet_wait > 0 else machine_busy(0.2)
    loadavg = os.getloadavg()
    size = int(args.size_mb * MB)
    work = Path(tempfile.mkdtemp(prefix="trainhouse-bench-datasets-"))
    server: DataServer | None = None
    kept: dict[str, Any] = {}
    try:
        with running_moto_s3() as s3:
            log(f"putting {args.files} files, {size / MB:.0f} MB, into moto ...")
            upload_s = fill_store(s3, args.files, size)
            url, options = f"s3://{BUCKET}/{PREFIX}", dict(s3.storage_options)
            started = time.perf_counter()
            manifest = datasources.manifest_of(url, options, allow_private=True)
            manifest_s = time.perf_counter() - started
            log("1. cold staging vs s3fs get ...")
            cold = part_cold(s3, manifest, url, options, work, args, load)
            kept = cold.pop("_kept")
            staged: Staged = kept["staged"]
            log("3. reading the staged copy vs the plain directory ...")
            read = part_read(manifest, staged.path, kept["plain"], args, load)
            staged.release()
            remove_tree(work / f"stage-{args.repeats - 1}")
            remove_tree(kept["plain"])
            version = 1
            if args.start:
                log("starting a trainhouse server ...")
                home = work / "home"
                home.mkdir()
                server = DataServer(home, max(2, os.cpu_count() or 1))
                added = server.client.add_dataset(NAME, url, storage_options=options)
                registered = added["version"]
                if registered["digest"] != manifest.digest:
                    raise RuntimeError("the server's manifest is not the benchmark's")
                version = registered["version"]
                cache = home / "datacache"  # the server's node cache: goal 2's jobs find it
            else:
                cache = work / "shared-cache"
            log(f"4. {WORKERS} stages at once ...")
            shared = part_shared(s3, manifest, url, options, cache, work)
            log("2. warm start ...")
            stage_runs = warm_stage(cache, manifest, work, args.warm_repeats)
            warm: dict[str, Any] = {
                "stage_runs": stage_runs,
                "stage_s": statistics.median(stage_runs),
                "target": WARM_GOAL_S,
            }
            if server is not None:
                start = part_start(server, s3, version, work / "start", args)
                warm |= {"start": start, "measured": "start", "extra_s": start["extra_s"]}
            else:
                warm |= {"measured": "warm stage", "extra_s": warm["stage_s"]}
            warm["pass"] = warm["extra_s"] <= WARM_GOAL_S
    finally:
        if server is not None:
            server.close()
        if "staged" in kept:
            kept["staged"].release()
        remove_tree(work)
    return {
        "files": args.files,
        "size": manifest.size,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "loadavg": list(loadavg),
        "loadavg_end": list(os.getloadavg()),
        "busy_start": busy_start,
        "upload_s": upload_s,
        "manifest_s": manifest_s,
        "cold": cold,
        "warm": warm,
        "read": read,
        "shared": shared,
        "others_percent": load.percent,
        "spans": load.spans,
        "busy_spans": load.busy_spans,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Dataset staging: cold vs s3fs get, warm start, reads, 4 stages at once."
    )
    parser.add_argument("--quick", action="store_true", help="20 files, 40 MB, 3 runs per side")
    parser.add_argument(
        "--smoke", action="store_true", help="4 files, 4 MB, 1 run per side, no waits"
    )
    parser.add_argument("--files", type=int, help="files in the version (200)")
    parser.add_argument("--size-mb", type=float, help="MB of the version, all files (1000)")
    parser.add_argument("--repeats", type=int, help="cold runs per side (3)")
    parser.add_argument("--read-repeats", type=int, help="timed reading passes per side (5)")
    parser.add_argument("--warm-repeats", type=int, help="warm stages in a fresh process (3)")
    parser.add_argument("--start-repeats", type=int, help="bare/trainhouse start pairs (3)")
    parser.add_argument(
        "--start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="goal 2 through a server and torchrun (--no-start: the warm stage only)",
    )
    parser.add_argument(
        "--quiet-wait", type=float, help="seconds to wait first for a quiet machine (30)"
    )
    parser.add_argument(
        "--op-wait", type=float, help="seconds to wait before each timed run for a quiet one (5)"
    )
    parser.add_argument(
        "--start-warmup",
        action=argparse.BooleanOptionalAction,
        help="one untimed job through the server before goal 2's runs (not with --smoke)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per job run (300)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--stage-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage_worker is not None:
        return stage_worker(args.stage_worker)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    defaults: dict[str, dict[str, Any]] = {
        "files": {"smoke": 4, "quick": 20, "full": 200},
        "size_mb": {"smoke": 4, "quick": 40, "full": 1000},
        "repeats": {"smoke": 1, "quick": 3, "full": 3},
        "read_repeats": {"smoke": 1, "quick": 5, "full": 5},
        "warm_repeats": {"smoke": 1, "quick": 3, "full": 3},
        "start_repeats": {"smoke": 1, "quick": 1, "full": 3},
        "start_warmup": {"smoke": False, "quick": True, "full": True},
        "quiet_wait": {"smoke": 0, "quick": 5, "full": 30},
        "op_wait": {"smoke": 0, "quick": 0.5, "full": 5},
    }
    for key, by_mode in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, by_mode[mode])
    counts = (args.files, args.repeats, args.read_repeats, args.warm_repeats, args.start_repeats)
    if min(counts) < 1 or args.size_mb * MB < args.files:
        parser.error("counts must be >= 1, and every file at least a byte")
    summary = drive(args)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
