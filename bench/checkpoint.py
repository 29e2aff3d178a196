"""How fast does ``run.checkpoint.save`` write, and how long does it stall the training loop?

Everything runs in this one process, through the SDK in standalone mode: ``trainhouse.init()``
with the working directory set to a fresh temporary directory (``--dir``, default the system's
temp directory) and no ``TRAINHOUSE_*``, ``RANK`` or ``WORLD_SIZE`` in the environment, so
checkpoints go to ``./checkpoints`` there. The state is a dict of float32 tensors of about
``--size-mb`` MB (200; 20 MB in ``--quick``), like a model's and an optimizer's state_dicts.

First the speed of each digest algorithm a record may name (sha256, blake3) over the state's
tensor bytes in memory, one thread: no target, it shows what hashing costs.

Part 1: write throughput, SDK vs a raw durable write
    sdk  ``run.checkpoint.save(state, step=i)`` (blocking): the trainhouse format (tensors
         raw from their memory) through the SDK's hashing writer (blake3, on a helper thread,
         while each tensor is written) into a temp file, fsync, rename, fsync of the
         directory, the sidecar record. Timed around the call; the bytes are the size of the
         checkpoint file it wrote.
    raw  The same number of bytes written sequentially to the same directory with the same
         durability: the tensors' own memory (then zeros up to the SDK file's size) written to a
         temp file, fsync, rename, fsync of the directory. No serialization, no hashing.

    Both get the same treatment of the page cache: before every timed write the previous
    write's files are deleted and ``os.sync()`` flushes whatever is dirty on the machine, so no
    write pays for an earlier one's write-back; both end with an fsync, so neither is measured
    at memory speed. One untimed warm-up write of each comes first. The two alternate in ABBA
    order (``--repeats`` each); MB/s (10^6 bytes) is per write, and the medians are compared:
    sdk / raw, target >= 0.8.

Part 2: load throughput, SDK vs a raw read
    sdk  ``run.checkpoint.load()`` of the checkpoint part 1 wrote last: finding it, verifying
         its digest against its record and loading it into a state dict, timed together.
    raw  The same file read into one buffer of its size (``readinto``), nothing else.

    Before every timed read ``os.sync()`` runs and the file's pages are dropped from the page
    cache (``posix_fadvise(DONTNEED)``), so both read from the disk. ABBA order after one
    warm-up each; the medians' ratio sdk / raw, target >= 0.8.

Part 3: how long save() blocks the caller, synchronous vs ``blocking=False``
    sync   ``save(state, step=i)``: the caller waits for the whole write.
    async  ``save(state, step=i, blocking=False)``: the caller waits while the state is copied
           to CPU memory; the write goes on in a background thread. The time until the
           returned handle's ``wait()`` returns (the checkpoint is durable) is shown too.

    Same cache treatment and ABBA order as part 1. The stall ratio is the median async block time
    over the median sync block time; target <= 0.1.

Part 4: does the training loop keep running while the background write proceeds?
    A loop of a few matmuls per step (``--matmul`` square float32 matrices, 4 per step) counts
    its steps/s while an asynchronous save is being written (from ``save()`` returning until
    the handle is done) and, alternately, for as long as the last write took with nothing being
    written. The ratio is during / without; the loop and the writer share the CPUs, so some
    slowdown is expected, but the loop must not stall (ratio >= 0.5 counts as not starved).
    It is done once per ``--threads`` value (torch intra-op threads of the loop; default 1 and
    all cores): with 1 the writer thread has a core of its own on a 2-core machine, with all
    cores the loop's threads and the writer compete for them.

The numbers are only as good as the machine is quiet. The benchmark waits up to
``--quiet-wait`` (30 s) for other processes to leave the CPUs before it starts and up to
``--op-wait`` (10 s) before every timed run, measures the CPU time all other processes used
during the timed runs (``psutil``), prints it with the number of runs during which they used
more than 15% of the CPUs, and warns when they did on average. It is a benchmark, not a test:
it exits 0 whatever the numbers (non-zero only if something crashes). Each goal's line prints
its ratio and PASS or BELOW TARGET.

    python bench/checkpoint.py [--quick | --smoke] [--size-mb 200] [--repeats 7] [--matmul 256]
                               [--threads 1 2] [--dir DIR] [--quiet-wait 30] [--op-wait 10]
                               [--json]

``--quick``: 20 MB, 3 runs per side, shorter waits (well under a minute on 2 cores).
``--smoke``: 2 MB, 1 run per side, no waits, one loop variant: only shows that it runs (seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from _machine import BUSY_PERCENT, log, wait_quiet

WRITE_TARGET = 0.8  # sdk MB/s / raw MB/s, at least
LOAD_TARGET = 0.8  # sdk load MB/s / raw read MB/s, at least
STALL_TARGET = 0.1  # async block time / sync block time, at most
LOOP_FLOOR = 0.5  # loop steps/s during a background write / without, at least
TENSOR_MB = 8  # size of most tensors in the state
MB = 1e6


# -- the state ---------------------------------------------------------------------------------
def make_state(size_mb: float) -> dict[str, Any]:
    """A model + optimizer-like state of float32 tensors, about ``size_mb`` MB of data."""
    import torch

    gen = torch.Generator().manual_seed(0)
    total = int(size_mb * MB) // 4  # float32 elements
    per = TENSOR_MB * int(MB) // 4
    model: dict[str, torch.Tensor] = {}
    optim: dict[str, torch.Tensor] = {}
    i = 0
    left = total
    while left > 0:
        n = min(per, left)
        # every third tensor under "optim", like optimizer moments
        target = model if i % 3 != 2 else optim
        target[f"layer{i}.weight"] = torch.randn(n, generator=gen)
        target[f"layer{i}.bias"] = torch.randn(256, generator=gen)
        left -= n
        i += 1
    return {"model": model, "optim": optim, "step": 0}


def tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)


def tensor_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(state))


# -- the two writers ---------------------------------------------------------------------------
def raw_write(directory: Path, state: dict[str, Any], nbytes: int) -> None:
    """``nbytes`` written sequentially from the tensors' memory: temp file, fsync, rename,
    fsync of the directory (what the SDK does for durability, without serializing or hashing)."""
    tmp = directory / f".raw-{os.getpid()}.tmp"
    final = directory / "raw.bin"
    left = nbytes
    with tmp.open("wb") as fh:
        for t in tensors(state):
            view = memoryview(t.numpy()).cast("B")
            chunk = view[: min(len(view), left)]
            fh.write(chunk)
            left -= len(chunk)
            if left <= 0:
                break
        zeros = bytes(min(left, 1 << 20)) if left > 0 else b""
        while left > 0:
            n = min(left, len(zeros))
            fh.write(zeros[:n])
            left -= n
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: os.sync() before timed runs (off with --smoke, where the numbers mean nothing and a sync on
#: a busy machine can take seconds)
SYNC = [True]


def clean(directory: Path) -> None:
    """Delete every file a write left in ``directory``, then flush the machine's dirty pages."""
    for path in directory.iterdir():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if SYNC[0]:
        os.sync()


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (after ``os.sync()``, they are all clean), so
    the next read of it comes from the disk."""
    if SYNC[0]:
        os.sync()
    else:
        fsync_path(path)  # dirty pages are not dropped
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path) -> int:
    """The whole file read into one buffer, as a loader that knows its size would."""
    size = path.stat().st_size
    buf = bytearray(size)
    with path.open("rb", buffering=0) as fh:
        view = memoryview(buf)
        got = 0
        while got < size:
            n = fh.readinto(view[got:])
            if not n:
                break
            got += n
    return got


# -- load from other processes -----------------------------------------------------------------
def wait_idle(limit: float, sample: float = 0.25) -> float:
    """Wait (at least one ``sample``, at most about ``limit`` seconds) until other processes use
    at most BUSY_PERCENT of the CPUs; their last use, %. This process sleeps meanwhile."""
    if limit <= 0:
        return 0.0
    deadline = time.monotonic() + limit
    while True:
        busy = float(psutil.cpu_percent(interval=sample))
        if busy <= BUSY_PERCENT or time.monotonic() >= deadline:
            return busy


class OthersLoad:
    """CPU use of every process but this one, in % of all CPUs, over timed spans of wall time."""

    def __init__(self) -> None:
        self.busy = 0.0  # CPU-seconds of everything, from /proc/stat (iowait counts as idle)
        self.mine = 0.0
        self.wall = 0.0
        self.spans = 0
        self.busy_spans = 0  # timed runs during which others used > BUSY_PERCENT
        self.disk_others = 0.0  # bytes written to the disks by others during the timed runs

    @staticmethod
    def _sample() -> tuple[float, float, float, float]:
        cpu = psutil.cpu_times()
        busy = cpu.user + cpu.system + getattr(cpu, "irq", 0.0) + getattr(cpu, "softirq", 0.0)
        busy += getattr(cpu, "nice", 0.0) + getattr(cpu, "steal", 0.0)
        me = psutil.Process()
        mine = me.cpu_times()
        disk = psutil.disk_io_counters()
        written = float(disk.write_bytes) if disk is not None else 0.0
        with contextlib.suppress(psutil.Error, AttributeError):
            written -= float(me.io_counters().write_bytes)
        return busy, mine.user + mine.system, time.monotonic(), written

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        before = self._sample()
        try:
            yield
        finally:
            after = self._sample()
            busy, mine, wall, disk = (a - b for a, b in zip(after, before, strict=True))
            self.disk_others += max(0.0, disk)
            self.busy += busy
            self.mine += mine
            self.wall += wall
            self.spans += 1
            if others_percent(busy, mine, wall) > BUSY_PERCENT:
                self.busy_spans += 1

    @property
    def percent(self) -> float:
        return others_percent(self.busy, self.mine, self.wall)


def others_percent(busy: float, mine: float, wall: float) -> float:
    if wall <= 0:
        return 0.0
    cpus = psutil.cpu_count() or 1
    return max(0.0, 100.0 * (busy - mine) / (wall * cpus))


# -- the parts ---------------------------------------------------------------------------------
def abba(repeats: int, first: str, second: str) -> list[str]:
    order: list[str] = []
    for i in range(repeats):
        order += [first, second] if i % 2 == 0 else [second, first]
    return order


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


class Bench:
    def __init__(
        self, run: Any, state: dict[str, Any], root: Path, load: OthersLoad, op_wait: float
    ) -> None:
        self.run = run
        self.op_wait = op_wait
        self.state = state
        self.ckpt_dir = Path(run.checkpoint.directory)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.raw_dir = root / "raw"
        self.raw_dir.mkdir()
        self.load = load
        self.step = 0

    def next_step(self) -> int:
        self.step += 1
        return self.step

    def settle(self) -> None:
        """Before every timed run: delete earlier files, sync, wait for a quiet machine."""
        clean(self.ckpt_dir)
        clean(self.raw_dir)
        wait_idle(self.op_wait)

    def sdk_save(self) -> tuple[float, int]:
        self.settle()
        with self.load.measure():
            seconds, record = timed(
                lambda: self.run.checkpoint.save(self.state, step=self.next_step())
            )
        return seconds, int(record["size"])

    def raw_save(self, nbytes: int) -> float:
        self.settle()
        with self.load.measure():
            seconds, _ = timed(lambda: raw_write(self.raw_dir, self.state, nbytes))
        return seconds

    def saved_file(self) -> Path:
        """The one checkpoint file in the checkpoint directory (after a save)."""
        (path,) = [p for p in self.ckpt_dir.iterdir() if p.suffix == ".pt"]
        return path

    def sdk_load(self) -> tuple[float, int]:
        """``run.checkpoint.load()`` of the last save, its file's pages evicted first: the
        verification (hash) and the load, timed together."""
        path = self.saved_file()
        evict(path)
        wait_idle(self.op_wait)
        with self.load.measure():
            seconds, state = timed(lambda: self.run.checkpoint.load())
        if state is None:
            raise RuntimeError("run.checkpoint.load() found no checkpoint")
        return seconds, path.stat().st_size

    def raw_load(self) -> tuple[float, int]:
        path = self.saved_file()
        evict(path)
        wait_idle(self.op_wait)
        with self.load.measure():
            seconds, nbytes = timed(lambda: raw_read(path))
        return seconds, nbytes

    def async_save(self) -> tuple[float, float]:
        """(seconds save() blocked, seconds until the handle's wait() returned)."""
        self.settle()
        with self.load.measure():
            t0 = time.perf_counter()
            handle = self.run.checkpoint.save(self.state, step=self.next_step(), blocking=False)
            t1 = time.perf_counter()
            handle.wait()
            t2 = time.perf_counter()
        return t1 - t0, t2 - t0


def part_digest(state: dict[str, Any], repeats: int) -> dict[str, Any]:
    """MB/s of each digest algorithm over the state's tensor bytes, in memory, one thread."""
    from trainhouse.jobfs.storage import DIGESTS, new_hash

    views = [memoryview(t.numpy()).cast("B") for t in tensors(state)]
    nbytes = sum(len(v) for v in views)
    rates: dict[str, float] = {}
    for algorithm in DIGESTS:
        best = float("inf")
        for _ in range(max(1, min(repeats, 3))):
            hasher = new_hash(algorithm)
            t0 = time.perf_counter()
            for view in views:
                hasher.update(view)
            hasher.hexdigest()
            best = min(best, time.perf_counter() - t0)
        rates[algorithm] = nbytes / MB / best
        log(f"    digest {algorithm}: {rates[algorithm]:.0f} MB/s")
    return {"bytes": nbytes, "mb_s": rates}


def against_raw(rates: dict[str, list[float]], nbytes: int, target: float) -> dict[str, Any]:
    """The SDK's median MB/s over the raw side's, and whether it reaches ``target``."""
    sdk, raw = statistics.median(rates["sdk"]), statistics.median(rates["raw"])
    return {
        "bytes": nbytes,
        "sdk_mb_s": rates["sdk"],
        "raw_mb_s": rates["raw"],
        "sdk_median": sdk,
        "raw_median": raw,
        "ratio": sdk / raw,
        "target": target,
        "pass": sdk / raw >= target,
    }


def part_write(b: Bench, repeats: int) -> dict[str, Any]:
    _, nbytes = b.sdk_save()  # warm-up, and the size the raw write must match
    b.raw_save(nbytes)
    rates: dict[str, list[float]] = {"sdk": [], "raw": []}
    for side in abba(repeats, "sdk", "raw"):
        if side == "sdk":
            seconds, size = b.sdk_save()
            rates["sdk"].append(size / MB / seconds)
        else:
            seconds = b.raw_save(nbytes)
            rates["raw"].append(nbytes / MB / seconds)
        log(f"    write {side}: {rates[side][-1]:.0f} MB/s")
    return against_raw(rates, nbytes, WRITE_TARGET)


def part_load(b: Bench, repeats: int) -> dict[str, Any]:
    b.sdk_save()  # the checkpoint both read
    b.sdk_load()  # warm-up
    b.raw_load()
    rates: dict[str, list[float]] = {"sdk": [], "raw": []}
    nbytes = 0
    for side in abba(repeats, "sdk", "raw"):
        seconds, nbytes = b.sdk_load() if side == "sdk" else b.raw_load()
        rates[side].append(nbytes / MB / seconds)
        log(f"    load {side}: {rates[side][-1]:.0f} MB/s")
    return against_raw(rates, nbytes, LOAD_TARGET)


def part_stall(b: Bench, repeats: int) -> dict[str, Any]:
    b.async_save()  # warm-up
    sync: list[float] = []
    blocked: list[float] = []
    durable: list[float] = []
    for side in abba(repeats, "sync", "async"):
        if side == "sync":
            seconds, _ = b.sdk_save()
            sync.append(seconds)
            log(f"    stall sync: {seconds * 1000:.0f} ms")
        else:
            stall, total = b.async_save()
            blocked.append(stall)
            durable.append(total)
            log(f"    stall async: {stall * 1000:.0f} ms (durable after {total * 1000:.0f} ms)")
    s, a = statistics.median(sync), statistics.median(blocked)
    return {
        "sync_s": sync,
        "async_s": blocked,
        "async_durable_s": durable,
        "sync_median": s,
        "async_median": a,
        "async_durable_median": statistics.median(durable),
        "ratio": a / s,
        "target": STALL_TARGET,
        "pass": a / s <= STALL_TARGET,
    }


class Loop:
    """A stand-in training loop: 4 matmuls of ``n`` x ``n`` float32 matrices per step."""

    def __init__(self, n: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(1)
        self.a = torch.randn(n, n, generator=gen)
        self.b = torch.randn(n, n, generator=gen) / n**0.5

    def step(self) -> None:
        x = self.a
        for _ in range(4):
            x = x @ self.b
        self.a.add_(x, alpha=1e-6)

    def for_seconds(self, seconds: float) -> tuple[int, float]:
        t0 = time.perf_counter()
        steps = 0
        while time.perf_counter() - t0 < seconds:
            self.step()
            steps += 1
        return steps, time.perf_counter() - t0

    def until(self, done: Callable[[], bool]) -> tuple[int, float]:
        t0 = time.perf_counter()
        steps = 0
        while not done():
            self.step()
            steps += 1
        return steps, time.perf_counter() - t0


def part_loop(b: Bench, repeats: int, n: int, threads: int) -> dict[str, Any]:
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        loop = Loop(n)
        loop.for_seconds(0.5)  # warm-up
        during: list[float] = []
        without: list[float] = []
        spans: list[float] = []
        last_span = 1.0
        for side in abba(repeats, "during", "without"):
            b.settle()
            with b.load.measure():
                if side == "during":
                    handle = b.run.checkpoint.save(b.state, step=b.next_step(), blocking=False)
                    steps, seconds = loop.until(handle.done)
                    handle.wait()
                    last_span = seconds
                    spans.append(seconds)
                    during.append(steps / seconds)
                else:
                    steps, seconds = loop.for_seconds(max(last_span, 0.5))
                    without.append(steps / seconds)
            log(
                f"    loop ({threads} thread(s)) {side}: {steps} steps in {seconds:.2f} s "
                f"= {steps / seconds:.1f} steps/s"
            )
    finally:
        torch.set_num_threads(saved)
    d, w = statistics.median(during), statistics.median(without)
    return {
        "threads": threads,
        "matmul": n,
        "during_steps_s": during,
        "without_steps_s": without,
        "write_span_s": spans,
        "during_median": d,
        "without_median": w,
        "ratio": d / w,
        "floor": LOOP_FLOOR,
        "pass": d / w >= LOOP_FLOOR,
    }


# -- the driver --------------------------------------------------------------------------------
@contextlib.contextmanager
def standalone_run(root: Path) -> Iterator[Any]:
    """``trainhouse.init()`` in standalone mode with ``root`` as the working directory."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    for key in list(os.environ):
        if key.startswith("TRAINHOUSE_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del os.environ[key]
    os.chdir(root)
    try:
        import trainhouse

        run = trainhouse.init()
        try:
            if not run.standalone:
                raise RuntimeError("trainhouse.init() did not start a standalone run")
            yield run
        finally:
            run.finish()
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "BELOW TARGET"


def print_report(s: dict[str, Any]) -> None:
    w, ld, st, lps, dg = s["write"], s["load"], s["stall"], s["loop"], s["digest"]
    print(
        f"state: {s['tensors']} float32 tensors, {s['tensor_bytes'] / MB:.0f} MB of data "
        f"(checkpoint file {w['bytes'] / MB:.0f} MB); {s['repeats']} timed runs per side, "
        f"ABBA order; directory {s['directory']} ({s['filesystem']})"
    )
    rates = ", ".join(f"{name} {rate:.0f} MB/s" for name, rate in dg["mb_s"].items())
    print(f"digest speed (in memory, one thread, best of up to 3): {rates}")
    print()
    print("1. write throughput (MB/s = 10^6 bytes/s, median; both fsync + rename)")
    print(f"   sdk run.checkpoint.save  {w['sdk_median']:8.0f} MB/s   runs: {fmt(w['sdk_mb_s'])}")
    print(f"   raw write+fsync+rename   {w['raw_median']:8.0f} MB/s   runs: {fmt(w['raw_mb_s'])}")
    print(
        f"   save ratio sdk/raw = {w['ratio']:.3f} (target >= {w['target']:.2f}): "
        f"{verdict(w['pass'])}"
    )
    print()
    print("2. load throughput (median; the file's pages evicted before each run)")
    print(f"   sdk run.checkpoint.load  {ld['sdk_median']:8.0f} MB/s   runs: {fmt(ld['sdk_mb_s'])}")
    print(f"   raw read into a buffer   {ld['raw_median']:8.0f} MB/s   runs: {fmt(ld['raw_mb_s'])}")
    print(
        f"   load ratio sdk/raw = {ld['ratio']:.3f} (target >= {ld['target']:.2f}): "
        f"{verdict(ld['pass'])}"
    )
    print()
    print("3. time save() blocks the caller (median)")
    print(
        f"   sync  save(...)                  {st['sync_median'] * 1000:8.1f} ms   "
        f"runs: {fmt(st['sync_s'], 1000)}"
    )
    print(
        f"   async save(..., blocking=False)  {st['async_median'] * 1000:8.1f} ms   "
        f"runs: {fmt(st['async_s'], 1000)}"
    )
    durable = st["async_durable_median"] * 1000
    print(f"   async: durable (handle.wait() returned) after {durable:.0f} ms")
    print(
        f"   stall ratio async/sync = {st['ratio']:.3f} (target <= {st['target']:.2f}): "
        f"{verdict(st['pass'])}"
    )
    print()
    n = lps[0]["matmul"]
    print(f"4. training loop (4 matmuls of {n}x{n} per step), median steps/s")
    for lp in lps:
        print(f"   torch threads: {lp['threads']}")
        print(
            f"     while an async save is written {lp['during_median']:8.1f}   "
            f"runs: {fmt(lp['during_steps_s'])} (writes took {fmt(lp['write_span_s'])} s)"
        )
        print(
            f"     with nothing being written     {lp['without_median']:8.1f}   "
            f"runs: {fmt(lp['without_steps_s'])}"
        )
        print(
            f"     ratio during/without = {lp['ratio']:.3f} (not starved: >= {lp['floor']:.2f}): "
            f"{'PASS' if lp['pass'] else 'STARVED'}"
        )
    print()
    print(
        f"other processes used {s['others_percent']:.0f}% of the CPUs during the timed runs, "
        f"> {BUSY_PERCENT:.0f}% during {s['busy_runs']} of {s['timed_runs']}"
    )
    print(
        f"the disks got {s['others_disk_mb']:.0f} MB of writes from elsewhere during them "
        "(device counters minus this process; filesystem journal included)"
    )
    if s["others_percent"] > BUSY_PERCENT:
        print("warning: the machine was busy; the numbers are unreliable, rerun when it is quiet")


def fmt(values: list[float], scale: float = 1.0) -> str:
    digits = 2 if max(values, default=0) * scale < 10 else 0
    return " ".join(f"{v * scale:.{digits}f}" for v in values)


def filesystem(path: Path) -> str:
    best = None
    for part in psutil.disk_partitions(all=True):
        if str(path).startswith(part.mountpoint) and (
            best is None or len(part.mountpoint) > len(best.mountpoint)
        ):
            best = part
    return f"{best.fstype} on {best.device}" if best else "unknown filesystem"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Checkpoint write throughput vs a raw durable write, and async-save stalls."
    )
    parser.add_argument("--quick", action="store_true", help="20 MB, 3 runs per side")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 MB, 1 run per side, no waits, 1 loop thread: does it run (a few seconds)",
    )
    parser.add_argument("--size-mb", type=float, help="MB of tensor data in the state (200)")
    parser.add_argument("--repeats", type=int, help="timed runs per side and part (7)")
    parser.add_argument("--matmul", type=int, default=256, help="loop matrix size (256)")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        help="torch threads of the loop in part 3, one variant each (1 and all cores)",
    )
    parser.add_argument("--dir", type=Path, help="where to write (the system's temp directory)")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        help="seconds to wait first for other processes to leave the CPUs (30; 5 with --quick)",
    )
    parser.add_argument(
        "--op-wait",
        type=float,
        help="seconds to wait before each timed run for a quiet machine (10; 0.5 with --quick)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    size = args.size_mb or (2.0 if args.smoke else 20.0 if args.quick else 200.0)
    repeats = args.repeats or (1 if args.smoke else 3 if args.quick else 7)
    quiet = (
        args.quiet_wait
        if args.quiet_wait is not None
        else (0.0 if args.smoke else 5.0 if args.quick else 30.0)
    )
    op_wait = (
        args.op_wait
        if args.op_wait is not None
        else (0.0 if args.smoke else 0.5 if args.quick else 10.0)
    )
    cores = psutil.cpu_count() or 1
    threads = args.threads or ([1] if args.smoke else sorted({1, cores}))
    if repeats < 1 or size <= 0 or min(threads) < 1:
        parser.error("--repeats and --threads must be >= 1 and --size-mb > 0")

    SYNC[0] = not args.smoke
    busy = wait_quiet(quiet) if quiet > 0 else 0.0
    log(f"CPU in use before: {busy:.0f}%; building a {size:.0f} MB state ...")
    state = make_state(size)
    base = args.dir.resolve() if args.dir else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="trainhouse-bench-ckpt-", dir=base))
    load = OthersLoad()
    try:
        with standalone_run(root) as run:
            b = Bench(run, state, root, load, op_wait)
            log("digest speed ...")
            digest = part_digest(state, repeats)
            log("part 1: write throughput, sdk vs raw ...")
            write = part_write(b, repeats)
            log("part 2: load throughput, sdk vs raw ...")
            loaded = part_load(b, repeats)
            log("part 3: save() block time, sync vs async ...")
            stall = part_stall(b, repeats)
            log("part 4: training loop during a background write ...")
            loop = [part_loop(b, repeats, args.matmul, t) for t in threads]
            b.settle()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {
        "size_mb": size,
        "tensors": sum(1 for _ in tensors(state)),
        "tensor_bytes": tensor_bytes(state),
        "repeats": repeats,
        "directory": str(base),
        "filesystem": filesystem(base),
        "digest": digest,
        "write": write,
        "load": loaded,
        "stall": stall,
        "loop": loop,
        "others_percent": load.percent,
        "busy_runs": load.busy_spans,
        "others_disk_mb": load.disk_others / MB,
        "timed_runs": load.spans,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
