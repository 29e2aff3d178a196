"""How fast is a job's environment? A cold build with uv and a warm reuse, against
``python -m venv`` + ``pip install`` of the same packages, measured in the same run.

The packages are a handful of small pure-Python wheels written into a temporary directory
(``--packages``, 8; each but the first requires the one before it, so the resolver has work),
served as ``find_links`` with an empty local index: nothing leaves the machine. The cases:

- **cold**: :func:`trainhouse.executors.node.envbuild.ensure` into an empty cache (uv's own cache
empty too): what
  the first job with these requirements on a node waits for;
- **warm**: what reuse adds to a job's start (goal: under 1 s): in a fresh process, what an
  attempt's supervisor does for a ready environment (read the requirements, compute the digest,
  take the use lock, find the ready marker), plus how much longer the environment's
  interpreter takes to start than the server's (``-c pass``; its ``.pth`` adds the server's
  site directories);
- **pip**: ``python -m venv --without-pip`` and ``pip --python VENV install --no-index
  --find-links`` of the same packages (pip's configuration files ignored): the baseline, the
  fastest way with pip (cold's speed-up against it: goal >= 3x); and, unless
  ``--no-with-ensurepip``, the usual way too (``python -m venv``, which bootstraps pip into
  the venv, then ``VENV/bin/pip install``).

The cases take turns for ``--repeats`` rounds (3; ``--smoke``: 1 round, 4 packages, no
quiet-wait, only the first pip baseline) and the medians are compared. It is a benchmark, not
a test: it exits 0 whatever the numbers.

    python bench/envs.py [--repeats 3] [--packages 8] [--json] [--smoke]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from _machine import BUSY_PERCENT, log, machine_busy, wait_quiet

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from trainhouse.core import envspec  # noqa: E402
from trainhouse.executors.node import envbuild  # noqa: E402

WARM_GOAL_S = 1.0
COLD_GOAL_RATIO = 3.0

# what an attempt's supervisor (which imports trainhouse.executors.node.envbuild anyway) does for a
# ready one
WARM_SCRIPT = """
import sys, time
import trainhouse.executors.node.supervise
from pathlib import Path
from trainhouse.core import envspec
from trainhouse.executors.node import envbuild
started = time.perf_counter()
request = envspec.Request.from_json(sys.argv[1])
ready = envbuild.ensure(request, Path(sys.argv[2]), lambda line: None)
assert not ready.built, "the environment was not ready"
print(time.perf_counter() - started)
ready.release()
"""


def write_wheel(directory: Path, name: str, requires: list[str]) -> None:
    module = name.replace("-", "_")
    dist = f"{module}-1.0.dist-info"
    files = {
        f"{module}/__init__.py": "VALUE = " + repr("x" * 2000) + "\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(directory / f"{module}-1.0-py3-none-any.whl", "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{member},sha256={digest.rstrip(b'=').decode()},{len(text)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def pip_install(
    venv: Path, wheels: Path, names: list[str], env: dict[str, str], *, bare: bool = False
) -> float:
    """Seconds for ``python -m venv`` and ``pip install`` of ``names``: without pip in the venv
    (``bare``: this interpreter's pip installs into it with ``--python``), or the usual way."""
    started = time.perf_counter()
    make = [sys.executable, "-m", "venv", *(["--without-pip"] if bare else []), str(venv)]
    subprocess.run(make, check=True, stdout=subprocess.DEVNULL, env=env)
    pip = (
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
        if bare
        else [str(venv / "bin" / "pip")]
    )
    install = ["install", "--disable-pip-version-check", "-q", "--no-index", "--find-links"]
    subprocess.run([*pip, *install, str(wheels), *names], check=True, env=env)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--packages", type=int, default=8)
    parser.add_argument("--quiet-wait", type=float, default=60.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--with-ensurepip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the usual way: python -m venv (pip bootstrapped) + VENV/bin/pip install",
    )
    parser.add_argument("--smoke", action="store_true", help="1 round, 4 packages, no wait")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.packages, args.quiet_wait, args.with_ensurepip = 1, 4, 0.0, False
    root = Path(tempfile.mkdtemp(prefix="th-bench-envs-"))
    try:
        wheels, empty, workdir = root / "wheels", root / "empty-index", root / "workdir"
        for d in (wheels, empty, workdir):
            d.mkdir()
        names = [f"thbench-pkg{i}" for i in range(args.packages)]
        for i, name in enumerate(names):
            write_wheel(wheels, name, names[i - 1 : i] if i else [])
        (workdir / "requirements.txt").write_text("\n".join(names) + "\n")
        pip_env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        busy = wait_quiet(args.quiet_wait)
        cold: list[float] = []
        warm: list[float] = []
        pip: list[float] = []
        full: list[float] = []
        for round_ in range(args.repeats):
            cache = root / f"cache-{round_}"
            request = envspec.Request(
                cache=str(cache),
                requirements="requirements.txt",
                index_url=f"file://{empty}",
                find_links=[str(wheels)],
            )
            started = time.perf_counter()
            ready = envbuild.ensure(request, workdir, lambda line: None)
            cold.append(time.perf_counter() - started)
            ready.release()
            assert ready.built
            reuse = subprocess.run(
                [sys.executable, "-c", WARM_SCRIPT, request.to_json(), str(workdir)],
                check=True,
                capture_output=True,
                text=True,
            )
            starts = [
                min(timed([python, "-c", "pass"]) for _ in range(3))
                for python in (str(ready.python), sys.executable)
            ]
            warm.append(float(reuse.stdout) + max(0.0, starts[0] - starts[1]))
            pip.append(pip_install(root / f"pip-{round_}", wheels, names, pip_env, bare=True))
            if args.with_ensurepip:
                full.append(pip_install(root / f"pipfull-{round_}", wheels, names, pip_env))
            times = f"cold {cold[-1]:.2f} s, warm {warm[-1]:.3f} s, pip {pip[-1]:.2f} s"
            log(f"round {round_ + 1}: {times}")
        during = machine_busy(0.5)
        result = {
            "packages": args.packages,
            "repeats": args.repeats,
            "cold_s": statistics.median(cold),
            "warm_added_s": statistics.median(warm),
            "pip_s": statistics.median(pip),
            "busy_before_percent": busy,
            "busy_after_percent": during,
        }
        result["cold_speedup"] = result["pip_s"] / result["cold_s"]
        if full:
            result["pip_ensurepip_s"] = statistics.median(full)
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print(f"{args.packages} packages, median of {args.repeats} round(s):")
            print(f"  pip (venv + pip install)  {result['pip_s']:7.2f} s")
            if full:
                print(
                    f"  ... the usual way         {result['pip_ensurepip_s']:7.2f} s   (venv with "
                    f"pip bootstrapped: {result['pip_ensurepip_s'] / result['cold_s']:.1f}x uv's)"
                )
            speedup = result["cold_speedup"]
            cold_ok = "PASS" if speedup >= COLD_GOAL_RATIO else "BELOW TARGET"
            warm_ok = "PASS" if result["warm_added_s"] < WARM_GOAL_S else "BELOW TARGET"
            print(
                f"  uv cold build             {result['cold_s']:7.2f} s   {speedup:.1f}x faster "
                f"than pip (goal >= {COLD_GOAL_RATIO:g}x: {cold_ok})"
            )
            print(
                f"  warm reuse adds           {result['warm_added_s']:7.3f} s to a job's start "
                f"(goal < {WARM_GOAL_S:g} s: {warm_ok})"
            )
            if max(busy, during) > BUSY_PERCENT:
                print(f"  (the machine was busy: {busy:.0f}% / {during:.0f}% of the CPUs)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
