"""The short job of ``bench/start.py``: the digits example's ``main()`` with timestamps.

``start.py`` copies this file next to ``examples/digits/train.py`` into the job's workdir and
runs it the same way on both sides (bare ``torchrun`` and under trainhouse). It changes nothing
in the training: it wraps ``trainhouse.init`` and the example's ``train_epoch`` to note when
they were called, and writes, once the first training step is done, a JSON file of wall-clock
times to ``$BENCH_START_STAMPS/rank-$RANK.json``:

- ``script``: this file's first line ran (the interpreter had started);
- ``imported``: torch, scikit-learn, trainhouse and ``train.py`` were imported;
- ``init_called`` / ``init_done``: around ``trainhouse.init()``;
- ``load_called`` / ``load_done``: around ``run.checkpoint.load()`` (the latest checkpoint: none);
- ``first_step``: the first optimizer step returned (before its ``run.log``);
- ``main_done``: ``main()`` returned (the run finished: its last checkpoint and metrics);
- ``chain``: this process and its ancestors, each ``[pid, start time, command line]``, start
  times from ``/proc/<pid>/stat`` on the wall clock (not psutil's, which rounds the boot time
  to a second).

The file is written at the first step and again at the end. Imports nothing more than the
example before the first step, so that it costs what the example costs.
"""

from __future__ import annotations

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import train  # noqa: E402  (imports torch, scikit-learn and trainhouse)

import trainhouse  # noqa: E402

STAMPS: dict[str, Any] = {"script": STARTED, "imported": time.time()}


def _started(pid: int, boot: float, tick: int) -> tuple[float, int, str]:
    """(start time on the wall clock, parent PID, command line) of ``pid``."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rpartition(b")")[2].split()
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    return boot + int(fields[19]) / tick, int(fields[1]), cmdline[:300]


def _chain() -> list[list[Any]]:
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    tick = os.sysconf("SC_CLK_TCK")
    chain: list[list[Any]] = []
    pid = os.getpid()
    while pid > 1 and len(chain) < 8:
        try:
            started, parent, cmdline = _started(pid, boot, tick)
        except OSError:
            break
        chain.append([pid, started, cmdline])
        pid = parent
    return chain


def _write() -> None:
    out = Path(os.environ["BENCH_START_STAMPS"]) / f"rank-{os.environ.get('RANK', '0')}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({**STAMPS, "chain": _chain()}))
    os.replace(tmp, out)


_real_init = trainhouse.init
_real_epoch = train.train_epoch


class _Init:
    def __call__(self, **kwargs: Any) -> Any:
        STAMPS["init_called"] = time.time()
        run = _real_init(**kwargs)
        STAMPS["init_done"] = time.time()
        load = run.checkpoint.load

        def timed_load(*args: Any, **kwargs: Any) -> Any:
            STAMPS["load_called"] = time.time()
            try:
                return load(*args, **kwargs)
            finally:
                STAMPS["load_done"] = time.time()

        run.checkpoint.load = timed_load
        return run


def _train_epoch(*args: Any, **kwargs: Any) -> Any:
    if "first_step" in STAMPS:
        return _real_epoch(*args, **kwargs)
    on_step = kwargs.pop("on_step", None) if "on_step" in kwargs else None
    if len(args) > 4:
        args, on_step = (*args[:4], *args[5:]), args[4]

    def first(step: int, loss: float, done: int) -> bool:
        if "first_step" not in STAMPS:
            STAMPS["first_step"] = time.time()
            _write()
        return bool(on_step(step, loss, done)) if on_step is not None else False

    return _real_epoch(*args[:4], first, *args[4:], **kwargs)


train.trainhouse = type(sys)("trainhouse")  # type: ignore[attr-defined]
train.trainhouse.init = _Init()  # type: ignore[attr-defined]
train.train_epoch = _train_epoch  # type: ignore[assignment]
if "BENCH_START_EPOCHS" in os.environ:  # the bare side: the spec's hparams do not apply
    train.DEFAULTS["epochs"] = int(os.environ["BENCH_START_EPOCHS"])

if __name__ == "__main__":
    train.main()
    STAMPS["main_done"] = time.time()
    _write()
